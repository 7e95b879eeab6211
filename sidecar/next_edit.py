"""The next-edit job: predict the user's next edit near the cursor, exactly and early.

Why its own module: the handlers (``textDocument/copilotInlineEdit``, ``echoline/nextEdit``)
only read the request and shape the answer; the prompt, the generation, the stop rule and
turning a rewritten region into minimal edits are engine-side work tested apart.

How it works:

* **Region.** Whole lines around the cursor (``region_lines`` above and below): the model
  writes them as they should read next. Lines above and below the region go in as
  read-only context; the user's recent edit events (``sidecar.edit_history``) as diffs.
* **Draft source.** The region is in the prompt, and the engine drafts from the prompt's
  n-grams, so exact speculation copies the unchanged lines in long runs.
* **Stop rule.** A prediction shows ONE edit: the first changed hunk. Once the reply has
  left the original region and re-joined it for ``REJOIN`` lines (one not blank), the hunk
  is known and generation stops. ``first_hunk`` decides this from the reply's complete
  lines only, and its answer never changes once given, so the edit from a reply stopped
  there equals the edit from the whole plain reply (tests compare token ids too).
* **Minimal edit.** The hunk's old and new lines are trimmed of their common characters;
  the edit is ``(range, text)`` in the document the prompt was built from.

Prompt formats (``FORMATS``; chosen by ``echoline bench next-edit --format``):
``sweep`` (``<|file_sep|>`` blocks: recent edits as original/updated pairs, then the
region as it was before the last edit, as it is, and an open ``updated`` block),
``zeta`` (marked editable region inside the excerpt, the reply rewrites it) and ``chat``
(an instruction through the chat template).
"""

from __future__ import annotations

import bisect
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from echoline.sidecar.background_prefill import run_ids
from echoline.sidecar.edit_history import EditEvent, changed_span
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.lsp_utils import UTF16, position_at
from lsprotocol import types

REGION_LINES = 10  # whole lines above and below the cursor's line that the model may change
CONTEXT_LINES = 30  # read-only lines above the region (and half that below)
REJOIN = 2  # lines equal to the original after a change: the change is over
MAX_HUNK_LINES = 8  # a change longer than this (old or new) is no prediction
REPLY_SLACK = 48  # tokens beyond the region's own a reply may take
PROMPT_EVENTS = 4  # the newest edit events a prompt shows
CURSOR_MARK = "<|user_cursor_is_here|>"
#: Control-token texts that end any reply (a model that writes the next file block, FIM
#: parts or the end of its turn has finished the region).
CONTROL_ENDS = ("<|file_sep|>", "<|fim_", "<|endoftext|>", "<|im_end|>", "<|repo_name|>")
REGION_START, REGION_END = "<|editable_region_start|>", "<|editable_region_end|>"
DEFAULT_FORMAT = "filesep"  # chosen on bench next-edit (docs/benchmarks.md): fewest wrong shown


@dataclass(frozen=True)
class Region:
    """The editable region of a document at one version: offsets and lines."""

    text: str  # the whole document the prompt is built from
    start: int  # offset of the region's first line
    end: int  # offset just past its last line (its line break included)
    cursor: int  # the cursor's offset in ``text``
    first_line: int

    @property
    def body(self) -> str:
        return self.text[self.start : self.end]

    @property
    def lines(self) -> list[str]:
        return self.body.splitlines(keepends=True)

    @property
    def newline(self) -> str:
        return "\r\n" if "\r\n" in self.body else "\n"


def make_region(text: str, cursor: int, above: int = REGION_LINES, below: int = REGION_LINES) -> Region:
    """Whole lines ``above``/``below`` the cursor's line (clipped to the document)."""
    starts = [0]
    at = text.find("\n")
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    line = max(0, bisect.bisect_right(starts, cursor) - 1)
    first = max(0, line - above)
    last = min(len(starts) - 1, line + below)
    end = starts[last + 1] if last + 1 < len(starts) else len(text)
    return Region(text, starts[first], end, cursor, first)


@dataclass(frozen=True)
class Hunk:
    """The first change of a reply: original region lines [old_start, old_end) become ``new``."""

    old_start: int
    old_end: int
    new: tuple[str, ...]  # lines without their breaks


@dataclass(frozen=True)
class NoEdit:
    reason: str


Decision = Hunk | NoEdit


def _strip(line: str) -> str:
    return line.rstrip("\r\n")


def first_hunk(old: Sequence[str], reply: str, final: bool, region_len: int | None = None) -> Decision | None:
    """The reply's first change against the original lines ``old`` (None: not known yet).

    ``old``: the region's lines, then the read-only lines after it (a model often writes
    on past the region's end: it re-joins there); ``region_len``: how many are the
    region's (default all). A change must start inside the region: a reply that copied
    the whole region unchanged means "no edit" at once.

    Only complete lines of ``reply`` count unless ``final`` (the reply has ended). Known
    when the reply, after its first changed line, has ``REJOIN`` lines equal to the
    original's (one not blank): the smallest such place in the reply is taken, then the
    smallest in the original. More reply never changes a non-final answer once given.
    """
    n_region = len(old) if region_len is None else region_len
    o = [_strip(x) for x in old]
    parts = reply.split("\n")
    if not final:
        parts = parts[:-1]  # the last part is not a complete line yet
    elif parts and parts[-1] == "":
        parts = parts[:-1]
    r = [_strip(x) for x in parts]
    p = 0
    while p < len(r) and p < len(o) and r[p] == o[p]:
        p += 1
    if p >= n_region:
        return NoEdit("unchanged")
    if p == len(r):
        if final:  # a reply that stopped inside the region deletes nothing
            return NoEdit("unchanged") if p == len(o) else NoEdit("stopped early")
        return None
    for i in range(p, min(len(r) - REJOIN, p + MAX_HUNK_LINES) + 1):
        window = r[i : i + REJOIN]
        if len(window) < REJOIN or not any(x.strip() for x in window):
            continue
        for j in range(p, min(len(o) - REJOIN, p + MAX_HUNK_LINES) + 1):
            if o[j : j + REJOIN] == window:
                return Hunk(p, j, tuple(r[p:i]))
    if final:
        # the reply ended: the tails that are equal close the hunk
        for i in range(p, min(len(r), p + MAX_HUNK_LINES) + 1):
            tail = len(r) - i
            j = len(o) - tail
            if j >= p and j - p <= MAX_HUNK_LINES and r[i:] == o[j:]:
                if i == p and j == len(o):
                    return NoEdit("stopped early")  # only a cut-off tail: nothing written
                return Hunk(p, j, tuple(r[p:i]))
        return NoEdit("no re-join")
    if len(r) - p > MAX_HUNK_LINES + REJOIN:
        return NoEdit("diverged")
    return None


@dataclass(frozen=True)
class Edit:
    """One minimal edit in the document the prompt was built from (offsets)."""

    start: int
    end: int
    text: str

    def lsp(self, doc: str, encoding: str = UTF16) -> tuple[types.Range, str]:
        return types.Range(start=position_at(doc, self.start, encoding),
                           end=position_at(doc, self.end, encoding)), self.text


def hunk_edit(region: Region, hunk: Hunk, after: str = "") -> Edit | None:
    """The hunk as the smallest edit of the document (None when it changes nothing);
    ``after``: the read-only lines after the region that ``first_hunk`` matched too."""
    lines = region.lines + after.splitlines(keepends=True)
    nl = region.newline
    offs = [region.start]
    for line in lines:
        offs.append(offs[-1] + len(line))
    a, b = offs[hunk.old_start], offs[min(hunk.old_end, len(lines))]
    old = region.text[a:b]
    new = "".join(x + nl for x in hunk.new)
    if hunk.old_end >= len(lines) and lines and not lines[-1].endswith("\n") and new.endswith(nl):
        new = new[: -len(nl)]  # the region's last line had no break: nor does its rewrite
    span = changed_span(old, new)
    if span is None:
        return None
    s, old_end, new_end, _ = span
    return Edit(a + s, a + old_end, new[s:new_end])


# ---- prompts ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptParts:
    """What any format builds its prompt from."""

    path: str
    region: Region
    before_region: str  # read-only lines above the region
    after_region: str  # read-only lines below it
    events: tuple[EditEvent, ...]  # oldest first
    original: str  # the region as it read before the newest event (== body when unknown)


@dataclass
class Prompt:
    ids: list[int]
    end_marks: tuple[str, ...]  # text that ends the region in the reply
    strip: tuple[str, ...] = ()  # text removed from the reply before diffing (a cursor mark)
    reply_prefix: str = ""  # the reply's start the prompt already holds (primed)


def _tok(engine: EngineLike, pieces: Sequence[tuple[str, bool]]) -> list[int]:
    """Token ids of (text, special) pieces: user text never parses as control tokens."""
    tok = engine.tokenizer
    ids: list[int] = []
    for text, special in pieces:
        if text:
            ids.extend(tok.encode(text, add_bos=False, parse_special=special))
    return ids


def _lf(s: str) -> str:
    return s if not s or s.endswith("\n") else s + "\n"


def sweep_prompt(engine: EngineLike, p: PromptParts) -> Prompt:
    """``<|file_sep|>`` blocks (Sweep's layout, which Qwen2.5-Coder's repo format knows)."""
    sep = "<|file_sep|>"
    pieces: list[tuple[str, bool]] = [(sep, True), (f"{p.path}\n{_lf(p.before_region)}{_lf(p.region.body)}"
                                                     f"{_lf(p.after_region)}", False)]
    for ev in p.events:
        pieces += [(sep, True), (f"{ev.path}.diff\noriginal:\n{_lf(ev.before)}updated:\n{_lf(ev.after)}", False)]
    pieces += [(sep, True), (f"original/{p.path}\n{_lf(p.original)}", False),
               (sep, True), (f"current/{p.path}\n{_lf(p.region.body)}", False),
               (sep, True), (f"updated/{p.path}\n", False)]
    return Prompt(_tok(engine, pieces), end_marks=(sep,))


def filesep_prompt(engine: EngineLike, p: PromptParts) -> Prompt:
    """``sweep`` without the region as it read before the last edit: the file, the edits,
    the current region and an open ``updated`` block (an untuned model tends to copy the
    older block back, undoing the user's edit)."""
    sep = "<|file_sep|>"
    pieces: list[tuple[str, bool]] = [(sep, True), (f"{p.path}\n{_lf(p.before_region)}{_lf(p.region.body)}"
                                                     f"{_lf(p.after_region)}", False)]
    for ev in p.events:
        pieces += [(sep, True), (f"{ev.path}.diff\n{ev.diff}", False)]
    pieces += [(sep, True), (f"current/{p.path}\n{_lf(p.region.body)}", False),
               (sep, True), (f"updated/{p.path}\n", False)]
    return Prompt(_tok(engine, pieces), end_marks=(sep,))


ZETA_INSTRUCTION = ("You are a code completion assistant and your task is to analyze user edits and then "
                    "rewrite an excerpt that the user provides, suggesting the appropriate edits within the "
                    "excerpt, taking into account the cursor location.")


def _marked_region(p: PromptParts) -> str:
    r = p.region
    body = r.text[r.start : r.cursor] + CURSOR_MARK + r.text[r.cursor : r.end]
    return f"{REGION_START}\n{_lf(body)}{REGION_END}\n"


def _events_text(p: PromptParts) -> str:
    return "".join(ev.diff for ev in p.events) or "(none)\n"


def zeta_prompt(engine: EngineLike, p: PromptParts) -> Prompt:
    """Zeta's layout: edits, the excerpt with a marked editable region, the reply rewrites it."""
    head = (f"### Instruction:\n{ZETA_INSTRUCTION}\n\n### User Edits:\n\n{_events_text(p)}\n"
            f"### User Excerpt:\n\n```{p.path}\n{_lf(p.before_region)}{_marked_region(p)}{_lf(p.after_region)}```\n\n"
            f"### Response:\n\n```{p.path}\n{_lf(p.before_region)}{REGION_START}\n")
    return Prompt(_tok(engine, [(head, False)]), end_marks=(REGION_END, "```"), strip=(CURSOR_MARK,))


CHAT_SYSTEM = ("You predict a programmer's next edit. Given their recent edits and the code around the cursor, "
               "rewrite the editable region as it should read after the next edit: usually the same kind of "
               "change repeated at the next place. If nothing needs to change, repeat the region unchanged. "
               "Reply with the region only, in a code block.")


def chat_prompt(engine: EngineLike, p: PromptParts) -> Prompt:
    """An instruction through the model's chat template, the reply primed with the fence."""
    user = (f"Recent edits:\n{_events_text(p)}\nFile {p.path}, around the cursor:\n```\n{_lf(p.before_region)}"
            f"{_marked_region(p)}{_lf(p.after_region)}```\n\nRewrite the lines between {REGION_START} and "
            f"{REGION_END} (without the markers and without {CURSOR_MARK}).")
    msgs = [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": user}]
    ids = list(engine.encode_chat(msgs)) + _tok(engine, [("```\n", False)])
    return Prompt(ids, end_marks=("```", REGION_END), strip=(CURSOR_MARK, REGION_START + "\n"))


FORMATS: dict[str, Callable[[Any, PromptParts], Prompt]] = {
    "sweep": sweep_prompt, "filesep": filesep_prompt, "zeta": zeta_prompt, "chat": chat_prompt,
}


def prompt_parts(path: str, text: str, cursor: int, events: Sequence[EditEvent], uri: str | None = None,
                 region_lines: int = REGION_LINES) -> PromptParts:  # fmt: skip
    """The prompt's parts at ``cursor`` of ``text``; ``events`` oldest first (the last
    ``PROMPT_EVENTS`` are shown). The region before the newest event of this document is
    the current region with that event's ``after`` put back to its ``before`` (where found)."""
    region = make_region(text, cursor, region_lines, region_lines)
    lines_before = text[: region.start].splitlines(keepends=True)[-CONTEXT_LINES:]
    lines_after = text[region.end :].splitlines(keepends=True)[: CONTEXT_LINES // 2]
    shown = tuple(events[-PROMPT_EVENTS:])
    original = region.body
    mine = [e for e in shown if uri is None or e.uri == uri]
    if mine and mine[-1].after and mine[-1].after in original:
        original = original.replace(mine[-1].after, mine[-1].before, 1)
    return PromptParts(path, region, "".join(lines_before), "".join(lines_after), shown, original)


# ---- the job ------------------------------------------------------------------------------
@dataclass
class NextEditOutcome:
    edits: list[Edit]  # empty: no prediction
    reason: str  # "hunk", or why there is none ("unchanged", "diverged", "cancelled", ...)
    reply: str  # the reply text the decision was made from
    token_ids: list[int]  # the reply's token ids as generated (the stop may cut mid-round)
    used_tokens: int  # how many of them the decision needed (the rest is never shown)
    stats: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0
    finish_reason: str = ""


def _cut(reply: str, prompt: Prompt) -> tuple[str, bool]:
    """The reply up to its first end mark (and whether one was found), marks stripped."""
    ended = False
    for mark in (*prompt.end_marks, *CONTROL_ENDS):
        at = reply.find(mark)
        if at >= 0:
            reply, ended = reply[:at], True
    for s in prompt.strip:
        reply = reply.replace(s, "")
    return reply, ended


def decide(old: Sequence[str], reply: str, prompt: Prompt, final: bool, region_len: int | None = None
           ) -> Decision | None:  # fmt: skip
    """``first_hunk`` on the reply text as the format writes it."""
    text, ended = _cut(reply, prompt)
    return first_hunk(old, text, final or ended, region_len)


@functools.lru_cache(maxsize=8)
def _takes_stop_when(cls: type) -> bool:
    try:
        return "stop_when" in inspect.signature(cls.generate).parameters
    except (TypeError, ValueError):
        return False


def run_next_edit(
    engine: EngineLike, parts: PromptParts, *, fmt: str = DEFAULT_FORMAT, spec: bool = True,
    session: str | None = None, cancel: threading.Event | None = None, early_stop: bool = True,
    max_tokens: int | None = None,
) -> NextEditOutcome:  # fmt: skip
    """Generate the region's rewrite and return its first change as a minimal edit.

    ``early_stop`` False runs to the reply's end (the reference the tests compare with).
    A ``cancel`` from outside (a newer request) gives ``reason == "cancelled"`` and no edit.
    """
    prompt = FORMATS[fmt](engine, parts)
    old = parts.region.lines + parts.after_region.splitlines(keepends=True)
    n_region = len(parts.region.lines)
    tok = engine.tokenizer
    is_control = getattr(tok, "is_control", lambda _t: False)
    cancel = cancel if cancel is not None else threading.Event()
    stopped = threading.Event()  # our own stop (not the caller's cancel)
    budget = max_tokens if max_tokens is not None else len(tok.encode(parts.region.body, add_bos=False,
                                                                      parse_special=False)) + REPLY_SLACK
    seen = {"lines": -1}

    def known(text: str) -> bool:
        n = text.count("\n")
        if n == seen["lines"] and not any(m in text for m in (*prompt.end_marks, *CONTROL_ENDS)):
            return False  # no new complete line: the decision cannot have changed
        seen["lines"] = n
        return decide(old, prompt.reply_prefix + text, prompt, False, n_region) is not None

    kwargs: dict[str, Any] = {}
    if early_stop and _takes_stop_when(type(engine)):
        kwargs["stop_when"] = lambda text: len(text) if known(text) else None
        on_token = None
    else:
        def on_token(ev: Any) -> None:
            if any(is_control(t) for t in ev.new_ids) or (early_stop and known(ev.text)):
                stopped.set()
                cancel.set()
    result = engine.generate(prompt.ids, max_tokens=budget, spec=spec, session=session, on_token=on_token,
                             cancel=cancel, **kwargs)
    stats = result.stats.as_dict()
    ids = list(result.token_ids)
    if result.finish_reason == "cancelled" and not stopped.is_set():
        return NextEditOutcome([], "cancelled", "", ids, 0, stats, len(prompt.ids), result.finish_reason)
    cut = next((i for i, t in enumerate(ids) if is_control(t) or t in tok.stop_ids), None)
    body_ids = ids if cut is None else ids[:cut]
    reply = prompt.reply_prefix + tok.decode(body_ids)
    ended = cut is not None or result.finish_reason == "eos"
    verdict = decide(old, reply, prompt, False, n_region) or decide(old, reply, prompt, ended, n_region)
    used = _used_tokens(tok, body_ids, old, n_region, prompt, ended)
    if verdict is None:
        return NextEditOutcome([], "length", reply, ids, used, stats, len(prompt.ids), result.finish_reason)
    if isinstance(verdict, NoEdit):
        return NextEditOutcome([], verdict.reason, reply, ids, used, stats, len(prompt.ids), result.finish_reason)
    edit = hunk_edit(parts.region, verdict, parts.after_region)
    reason = "hunk" if edit is not None else "unchanged"
    if edit is not None and any(undoes(parts.region.text, edit, ev) for ev in parts.events[-1:]):
        edit, reason = None, "undoes the last edit"
    edits = [] if edit is None else [edit]
    return NextEditOutcome(edits, reason, reply, ids, used, stats, len(prompt.ids), result.finish_reason)


def undoes(text: str, edit: Edit, event: EditEvent) -> bool:
    """Whether ``edit`` of ``text`` takes back ``event`` (what it added goes, what it removed
    returns): a prediction the user would have to reject, never shown."""
    if not event.added and not event.removed:
        return False
    span = changed_span(text[edit.start : edit.end], edit.text)
    if span is None:
        return False
    s, old_end, new_end, _ = span
    return (text[edit.start + s : edit.start + old_end], edit.text[s:new_end]) == (event.added, event.removed)


def _used_tokens(tok: Any, ids: list[int], old: Sequence[str], n_region: int, prompt: Prompt, ended: bool) -> int:
    """The fewest reply tokens whose text already decides (what plain decoding with the
    stop rule generates): the part of the reply a shown edit depends on."""
    lo, hi = 0, len(ids)
    while lo < hi:  # the non-final decision is monotone in the reply's length
        mid = (lo + hi) // 2
        if decide(old, prompt.reply_prefix + tok.decode(ids[:mid]), prompt, False, n_region) is not None:
            hi = mid
        else:
            lo = mid + 1
    if lo < len(ids) or decide(old, prompt.reply_prefix + tok.decode(ids), prompt, False, n_region) is not None:
        return lo
    return len(ids) + (1 if ended else 0)  # the end token decided


def next_edit_session(uri: str) -> str:
    """The engine session of ``uri``'s next-edit prompts."""
    return "next-edit:" + uri


#: Formats whose prompt opens with the file block, so the file up to the editable region can
#: run before the user's edit: the edits and the region come after it.
FILE_FIRST = ("filesep", "sweep")


def warm_ids(engine: EngineLike, parts: PromptParts, fmt: str = DEFAULT_FORMAT) -> list[int]:
    """The start of the prediction prompt that the cursor's place fixes before the user
    edits: the file block up to the editable region (``FILE_FIRST`` formats; [] for the
    others, whose edits come first). Tokenized apart from the rest, its last id may differ
    from the whole prompt's; the session reuses what matches, token for token."""
    if fmt not in FILE_FIRST:
        return []
    return _tok(engine, [("<|file_sep|>", True), (f"{parts.path}\n{_lf(parts.before_region)}", False)])


def next_edit_warm_job(
    path: str, uri: str, text: str, cursor: int, *, fmt: str = DEFAULT_FORMAT, region_lines: int = REGION_LINES,
) -> Callable[[Any, threading.Event, Callable[[int], None] | None], dict[str, Any] | None]:  # fmt: skip
    """The background job that runs ``warm_ids`` at a resting cursor into the document's
    prediction session, so that after the user's edit there the prediction runs only the
    edits, the region and what changed (``sidecar/next_edit_warm.py`` schedules it)."""
    parts = prompt_parts(path, text, cursor, (), uri, region_lines)

    def job(engine: EngineLike, cancel: threading.Event,
            started: Callable[[int], None] | None = None) -> dict[str, Any] | None:  # fmt: skip
        if not isinstance(engine, EngineLike):  # not loaded, or a test's stand-in
            return None
        ids = warm_ids(engine, parts, fmt)
        if len(ids) < 2:
            return {"state": "skipped", "reason": "nothing before the region", "tokens": len(ids)}
        return run_ids(engine, ids, next_edit_session(uri), cancel, started)

    return job


def next_edit_job(
    path: str, uri: str, text: str, cursor: int, events: Sequence[EditEvent], *, fmt: str = DEFAULT_FORMAT,
    spec: bool = True, region_lines: int = REGION_LINES,
) -> Callable[[Any, threading.Event], NextEditOutcome]:  # fmt: skip
    """The worker job predicting the next edit at ``cursor`` of ``text`` (one version)."""
    parts = prompt_parts(path, text, cursor, events, uri, region_lines)

    def job(engine: EngineLike, cancel: threading.Event) -> NextEditOutcome:
        return run_next_edit(engine, parts, fmt=fmt, spec=spec, session=next_edit_session(uri), cancel=cancel)

    return job
