"""``textDocument/inlineCompletion``'s plumbing: the document read, the wait for the model,
an answer from the store or from a run, and the LSP list.

Why apart from ``server.py`` and from ``inline.py``: ``inline.py`` is the job (prompt,
generation, block end) and knows nothing of requests; this module is what one request
does around it, so the handler stays a line. The steps take the server as ``ls`` (never
imported: the server imports this module).

Why each step is where it is:

- the text, version, offset and the head start's edit count are read before the first
  await (``read_request``): the server reads no later frame until then, so a didChange
  while the model loads cannot move the cursor's offset under the request;
- while the model loads (or after it failed) the answer is empty, never an error: an
  editor would show one per keystroke (``model_ready``);
- a completion the user is typing through, or one just shown at the same text, is
  answered from the store with no run (``sidecar/inline_store.py``), and each answer
  queues the completion after its acceptance (``InlineAhead``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from echoline.sidecar.inline import completion_end, inline_job
from echoline.sidecar.lsp_utils import checked_offset, get_doc, line_start, rest_of_line
from echoline.sidecar.progress import WorkDone
from echoline.sidecar.worker import JobCancelled
from lsprotocol import types

#: The figures of the last run kept for ``echoline.status`` (``inlineStore.lastRun``).
LAST_RUN_STATS = ("prompt_tokens", "prefilled_tokens", "generated_tokens", "ttft_s", "total_s")


@dataclass(frozen=True)
class InlineRequest:
    """One request as its document was when it came: ``text`` of ``version``, the cursor
    (``pos`` in ``encoding``, ``offset`` in the text), the text before and after it, the
    cursor's line after it (``rest``: what an item may replace), and ``edits``, the
    document's edit count the kept head start was recorded at (``HeadStarts.edits``)."""

    uri: str
    version: int | None
    pos: types.Position
    encoding: str
    text: str
    offset: int
    edits: int | None
    prefix: str
    suffix: str
    rest: str


async def complete(ls: Any, uri: str, pos: types.Position, work_done_token: Any) -> types.InlineCompletionList:
    """The whole request: the completion at ``pos`` as an LSP list of one item, or none
    (model not ready, superseded, cancelled, or nothing to complete)."""
    req = read_request(ls, uri, pos)
    if not await model_ready(ls, work_done_token):
        return types.InlineCompletionList(items=[])
    ls.inline_warm.asked(uri, req.version, pos)  # a warm-up here now would only repeat this request
    tag = inline_tag(ls)
    hit = ls.inline_store.lookup(uri, req.prefix, req.suffix, tag)  # typing through a suggestion, undo
    if hit is not None:
        ls.worker.cancel_key(("inline", uri))  # an older request still running is superseded
        ls.inline_ahead.after(uri, req.prefix, req.suffix, req.rest, hit.text, tag)
        return inline_list(pos, req.rest, hit.text, req.encoding)
    completion = await run(ls, req)
    if completion is None:  # superseded (or cancelled): an empty answer
        return types.InlineCompletionList(items=[])
    ls.inline_store.shown(uri, req.prefix, req.suffix, completion, tag)
    ls.inline_ahead.after(uri, req.prefix, req.suffix, req.rest, completion, tag)
    return inline_list(pos, req.rest, completion, req.encoding)


def read_request(ls: Any, uri: str, pos: types.Position) -> InlineRequest:
    """The request against its document, before any await (see the module's docstring):
    unknown document or a position past the text raise InvalidParams. Marks the client as
    one that asks for inline completions (only such a client gets warm-ups)."""
    doc = get_doc(ls.workspace, uri)
    ls.inline_asked = True
    encoding = ls.position_encoding
    text, version, edits = doc.source, doc.version, ls.inline_head_starts.edits(uri)
    offset = checked_offset(text, pos, encoding, "position")
    return InlineRequest(uri, version, pos, encoding, text, offset, edits,
                         text[:offset], text[offset:], rest_of_line(text, offset))


async def model_ready(ls: Any, work_done_token: Any) -> bool:
    """Wait (bounded) for the inline job's engine, loading it on its first use; whether it
    is ready. The state is in ``echoline/status`` and, when the request carried a
    ``workDoneToken``, in a progress bar of its own while the model loads."""
    bar = None
    if ls.job_models is not None:
        ls.ensure_engine("inline")  # the inline engine loads on its first use
    if ls.worker.state_of("inline") in ("idle", "loading") and work_done_token is not None:
        bar = WorkDone(ls, "echoline")
        await bar.begin(ls.load_message or "loading the model", work_done_token)
    state = "cancelled"
    try:
        state = await ls.wait_for_model(bar, "inline")
    finally:
        if bar is not None:
            bar.end("model ready" if state == "ready" else ls.load_message or state)
    return state == "ready"


async def run(ls: Any, req: InlineRequest) -> str | None:
    """Run the inline job (superseding the document's older request, ``key``); the
    completion, None when superseded or cancelled. Its figures go to the status line and
    to ``inline_store.last_run`` (``echoline.status``'s ``inlineStore.lastRun``)."""
    s = ls.settings
    cursor_line = req.text[line_start(req.text, req.offset) : req.offset]
    job = inline_job(req.prefix, req.suffix, cursor_line, req.uri, s.inline_max_tokens, s.speculation,
                     s.inline_suffix_tokens, starts=ls.inline_head_starts, edits=req.edits,
                     short_head=s.inline_warm)  # a short head only while something warms the long one
    try:
        out = await ls.run_job(job, kind="inline", key=("inline", req.uri))
    except JobCancelled:
        out = None
    if out is None or out.text is None:
        return None
    ls.note_stats(out.stats)
    ls.inline_store.last_run = {k: out.stats.get(k) for k in LAST_RUN_STATS}
    return out.text


def inline_tag(ls: Any) -> tuple[Any, ...]:
    """What an inline result depends on beside the text: the engine and the settings that
    shape the prompt and the reply (``sidecar/inline_store.py``)."""
    s = ls.settings
    return (id(ls.worker.engine_for("inline")), s.inline_max_tokens, s.inline_suffix_tokens)


def inline_list(pos: types.Position, rest: str, completion: str, encoding: str) -> types.InlineCompletionList:
    """The answer: one item at the cursor (``completion_end`` says how far it replaces), or none."""
    if not completion:
        return types.InlineCompletionList(items=[])
    end = completion_end(pos, rest, completion, encoding)
    item = types.InlineCompletionItem(insert_text=completion, range=types.Range(start=pos, end=end))
    return types.InlineCompletionList(items=[item])
