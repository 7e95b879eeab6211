"""``echoline.rewrite`` without the server: its arguments, its progress, and what to answer.

The handler in ``sidecar.server`` structures the arguments (``RewriteArgs``, through the
lsprotocol converter) and hands them to ``serve``, which sequences the rest: check the
range against the document (``check_document``), wait for the model behind the progress
bar, queue the job and report its progress (``RewriteProgress``), then ask ``decide`` what
a finished reply means — answer with it, apply it (``apply_edit``), or neither and why.
``decide`` is pure, so every outcome is tested without a server
(tests/test_rewrite_request.py). The steps take the server as ``ls`` (never imported: the
server imports this module) and read only what any request handler may read of it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import attrs
import cattrs
from echoline.sidecar.config import Settings
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.idle_prefill import rewrite_session
from echoline.sidecar.lsp_utils import (
    checked_offset,
    find_document,
    get_doc,
    invalid,
    parse_position,
    short,
)
from echoline.sidecar.progress import PROGRESS_INTERVAL_S, WorkDone
from echoline.sidecar.rewrite import Progress, RewriteOutcome, run_rewrite
from echoline.sidecar.worker import JobCancelled
from lsprotocol import types
from pygls.exceptions import JsonRpcException

COMMAND = "echoline.rewrite"
NOTIFY_REWRITE_PROGRESS = "echoline/rewriteProgress"
REQUEST_FAILED = -32803  # LSP RequestFailed: the job itself failed
CONTENT_MODIFIED = -32801  # LSP ContentModified: the request's version is not the document's


@attrs.define(frozen=True)
class RewriteArgs:
    """The one argument of ``echoline.rewrite`` (docs/sidecar.md)."""

    uri: str
    version: int  # the document version the range was read from
    range: types.Range
    instruction: str = ""
    mode: Literal["apply", "preview"] = "apply"


def _structure(raw: Any, _cls: type) -> RewriteArgs:
    """Each field checked with a message that names it (a cattrs error names a path only)."""
    if not isinstance(raw, dict):
        raise invalid(f"{COMMAND}'s argument must be {{uri, version, range, instruction, mode}}, "
                      f"got {short(raw)}")
    uri = raw.get("uri")
    if not isinstance(uri, str) or not uri:
        raise invalid("'uri' must be a non-empty string")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise invalid(f"'version' must be an integer (the document version you read), got {short(version)}")
    rng = raw.get("range")
    if not isinstance(rng, dict):
        raise invalid(f"'range' must be {{start, end}}, got {short(rng)}")
    try:
        start = parse_position(rng.get("start"), "range.start")
        end = parse_position(rng.get("end"), "range.end")
    except ValueError as exc:
        raise invalid(str(exc)) from None
    if (end.line, end.character) < (start.line, start.character):
        raise invalid("range.end is before range.start")
    instruction = raw.get("instruction") or ""
    if not isinstance(instruction, str):
        raise invalid(f"'instruction' must be a string, got {type(instruction).__name__}")
    mode = raw.get("mode") or "apply"
    if mode not in ("apply", "preview"):
        raise invalid(f"'mode' must be \"apply\" or \"preview\", got {short(mode)}")
    return RewriteArgs(uri, version, types.Range(start=start, end=end), instruction, mode)


def register(converter: cattrs.Converter) -> None:
    """Teach ``converter`` (the server's lsprotocol converter) to build ``RewriteArgs``."""
    converter.register_structure_hook(RewriteArgs, _structure)


def rewrite_args(converter: cattrs.Converter, args: tuple[Any, ...]) -> RewriteArgs:
    """The command's arguments (exactly one object) as ``RewriteArgs``; InvalidParams if not."""
    if len(args) != 1 or not isinstance(args[0], dict):
        raise invalid(f"{COMMAND} takes ONE argument {{uri, version, range, instruction, mode}}; "
                      f"got {len(args)} argument(s)")
    return converter.structure(args[0], RewriteArgs)


# ---- what a finished reply means ----------------------------------------------------------


@attrs.define(frozen=True)
class Verdict:
    """``apply``: send the edit to the client; otherwise answer ``applied: false`` with
    ``reason``. ``progress``: the end message of the work-done progress."""

    apply: bool
    reason: str
    progress: str
    edit_in_answer: bool = False  # a preview carries the edit for the client to show


def decide(*, finish_reason: str, mode: str, max_tokens: int, request_cancelled: bool,
           version: int, current_version: int | None, refusal: str | None = None) -> Verdict:
    """What to do with a finished rewrite, from facts alone (the order is the precedence).

    ``current_version``: the document's version now (None: closed meanwhile); the edit is
    tied to ``version``, the one the range was read from. ``refusal``: why the reply is no
    confident edit that must not be applied (``RewriteOutcome.withheld``: it would not
    parse, it ran away): not applied, with that reason. A preview is still shown (the user
    judges it; the server's answer carries the reason beside it, ``noConfidentEdit``).
    """
    if finish_reason == "cancelled":
        return Verdict(False, "cancelled", "cancelled")
    if mode == "preview":
        return Verdict(False, "preview", "preview ready", edit_in_answer=True)
    if refusal:
        return Verdict(False, refusal, "no confident edit; not applied")
    if finish_reason == "length":
        return Verdict(False, f"the reply reached maxTokens ({max_tokens}) before its end; "
                       "edit not applied (raise echoline.maxTokens or select less)",
                       "reply truncated; not applied")
    if request_cancelled:
        return Verdict(False, "cancelled", "cancelled")
    if current_version != version:
        return Verdict(False, f"document changed while generating (version {version} -> "
                       f"{current_version}); edit not applied", "document changed; not applied")
    return Verdict(True, "apply", "applying")


# ---- progress -----------------------------------------------------------------------------


class RewriteProgress:
    """A rewrite's progress: ``echoline/rewriteProgress`` (the text so far, for a live
    preview) and the work-done bar, at most every ``PROGRESS_INTERVAL_S``.

    ``report`` runs on the worker thread; ``post`` hands a call to the event loop.
    """

    def __init__(self, uri: str, bar: WorkDone, notify: Callable[[str, Any], None],
                 post: Callable[..., None]) -> None:
        self.uri = uri
        self.bar = bar
        self._notify = notify
        self._post = post
        self._last = 0.0

    def report(self, p: Progress) -> None:  # worker thread
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._post(self._send, p)

    def _send(self, p: Progress) -> None:  # event loop
        self._notify(NOTIFY_REWRITE_PROGRESS, {
            "uri": self.uri, "text": p.text, "tokens": p.tokens,
            "tokS": round(p.tok_s, 2), "acceptance": round(p.acceptance, 4),
        })
        self.bar.report(f"{p.tokens} tokens, {p.tok_s:.1f} tok/s, acceptance {p.acceptance:.0%}\n{p.text}")


# ---- the request, step by step ------------------------------------------------------------


@attrs.define(frozen=True)
class Target:
    """A request checked against its document: the text of the version the range was read
    from, and the range's offsets in it. The job runs on this text whatever edits arrive
    while it waits (the decision after compares versions, never texts)."""

    args: RewriteArgs
    text: str
    start: int
    end: int


def check_document(ls: Any, req: RewriteArgs) -> Target:
    """The request against the open document, before any await (the server reads no later
    frame until then, so this is the version the request was sent with): unknown document,
    a range past the text (InvalidParams), another version (ContentModified: nothing is
    changed for a range read from other text)."""
    doc = get_doc(ls.workspace, req.uri)
    if doc.version != req.version:
        raise JsonRpcException(
            f"stale version: the request is for version {req.version} but {req.uri} is at "
            f"version {doc.version}; nothing was changed",
            code=CONTENT_MODIFIED,
        )
    text, encoding = doc.source, ls.position_encoding
    start = checked_offset(text, req.range.start, encoding, "range.start")
    end = checked_offset(text, req.range.end, encoding, "range.end")
    return Target(req, text, start, end)


async def serve(ls: Any, req: RewriteArgs, converter: cattrs.Converter) -> dict[str, Any]:
    """The whole command for checked arguments: its answer ``{applied, reason, text, stats,
    ...}`` (docs/sidecar.md). The request's id (for its cancel) and the client's work-done
    token (for its bar) are read before anything else, as every step after needs them."""
    request_id, client_token = ls.protocol.msg_id, ls.protocol.work_done_token
    target = check_document(ls, req)
    bar = await _model_ready(ls, req, client_token)
    settings = ls.settings  # as of the job's start: the decision after reads the same
    outcome = await _generate(ls, target, settings, bar, request_id, client_token)
    if outcome is None:
        return {"applied": False, "reason": "cancelled", "text": "", "stats": {}}
    return await _answer(ls, req, outcome, settings, bar, request_id, converter)


async def _model_ready(ls: Any, req: RewriteArgs, client_token: Any) -> WorkDone:
    """The request's progress bar, and the (bounded) wait for the rewrite model. A client's
    own token begins the bar now, so it shows the model load too; a server-made bar begins
    only once the job is queued (``_generate``). The bar ends if the wait fails."""
    bar = WorkDone(ls, "echoline rewrite", cancellable=True)
    if client_token is not None:
        await bar.begin(req.instruction or "reproduce selection", client_token)
    try:
        await ls.engine_ready(bar if client_token is not None else None)
    except (JsonRpcException, asyncio.CancelledError) as exc:
        bar.end("failed" if isinstance(exc, JsonRpcException) else "cancelled")
        raise
    return bar


RewriteJob = Callable[[EngineLike, threading.Event], RewriteOutcome]


def rewrite_job(target: Target, settings: Settings, on_progress: Callable[[Progress], None]) -> RewriteJob:
    """The worker's job: ``run_rewrite`` on the checked text, in the document's rewrite
    session (the one idle prefill warms, ``idle_prefill.rewrite_session``)."""
    req = target.args

    def job(engine: EngineLike, cancel: threading.Event) -> RewriteOutcome:
        return run_rewrite(
            engine, target.text, target.start, target.end, req.instruction, name=req.uri,
            max_tokens=settings.max_tokens, spec=settings.speculation,
            session=rewrite_session(req.uri), on_progress=on_progress, cancel=cancel,
        )

    return job


async def _generate(ls: Any, target: Target, settings: Settings, bar: WorkDone, request_id: Any,
                    client_token: Any) -> RewriteOutcome | None:
    """Run the job with progress: its outcome, None when it was cancelled (the bar ends
    then, and when it fails: RequestFailed). The job is queued BEFORE a server-made bar is
    created: creating one is a round trip to the client, which must not delay the first
    token (progress reports wait meanwhile)."""
    uri = target.args.uri
    reporter = RewriteProgress(uri, bar, ls.protocol.notify, ls.from_thread)
    ls.idle_prefill.forget(uri)  # this request prefills the document's prefix itself
    running = asyncio.ensure_future(ls.run_job(rewrite_job(target, settings, reporter.report), kind="rewrite"))
    try:
        if client_token is None:
            await bar.begin(target.args.instruction or "reproduce selection")
    except asyncio.CancelledError:
        running.cancel()
        bar.end("cancelled")
        raise
    bar.on_cancel(lambda: ls.cancel_request(request_id))  # the bar's cancel button
    try:
        return await running
    except JobCancelled:
        bar.end("cancelled")
        return None
    except asyncio.CancelledError:
        running.cancel()
        bar.end("cancelled")
        raise
    except Exception as exc:
        bar.end("failed")
        raise JsonRpcException(f"echoline: rewrite failed: {exc}", code=REQUEST_FAILED) from exc


async def _answer(ls: Any, req: RewriteArgs, outcome: RewriteOutcome, settings: Settings, bar: WorkDone,
                  request_id: Any, converter: cattrs.Converter) -> dict[str, Any]:
    """What ``decide`` says of the finished reply: answered (a preview carries the edit),
    or sent with workspace/applyEdit, tied to the version the range was read from."""
    ls.note_stats(outcome.stats)
    ls.send_status()
    current = find_document(ls.workspace, req.uri)
    verdict = decide(
        finish_reason=outcome.finish_reason, mode=req.mode, max_tokens=settings.max_tokens,
        request_cancelled=request_id is not None and request_id in ls.cancelled_ids,
        version=req.version, current_version=None if current is None else current.version,
        refusal=outcome.withheld,
    )
    base = {"text": outcome.text, "stats": outcome.stats, "finishReason": outcome.finish_reason,
            "stoppedBy": outcome.stopped_by, "noConfidentEdit": outcome.refusal}
    edit = types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
        text_document=types.OptionalVersionedTextDocumentIdentifier(uri=req.uri, version=req.version),
        edits=[types.TextEdit(range=req.range, new_text=outcome.text)],
    )])
    if not verdict.apply:
        bar.end(verdict.progress)
        extra = {"edit": converter.unstructure(edit)} if verdict.edit_in_answer else {}
        return {"applied": False, "reason": verdict.reason, **extra, **base}
    applied, reason, shown = await apply_edit(ls, edit, req.version)
    bar.end(shown)
    return {"applied": applied, "reason": reason, **base}


async def apply_edit(ls: Any, edit: types.WorkspaceEdit, version: int) -> tuple[bool, str, str]:
    """Send ``edit`` with workspace/applyEdit: (applied, reason, progress end message).
    Bounded by ``ls.apply_edit_timeout_s``: an editor that never answers must not hold the
    rewrite (its edit is versioned, so a late apply to changed text is refused anyway)."""
    try:
        resp = await asyncio.wait_for(
            ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label="echoline rewrite")),
            ls.apply_edit_timeout_s,
        )
    except TimeoutError:
        return False, (f"the editor did not answer workspace/applyEdit within {ls.apply_edit_timeout_s:g} s "
                       f"(the edit is tied to version {version}: the editor refuses it if the text "
                       "changed)"), "no answer from the editor"
    except Exception as exc:
        return False, f"workspace/applyEdit failed: {exc}", "client refused the edit"
    if resp.applied:
        return True, "applied", "applied"
    return False, resp.failure_reason or "the client did not apply the edit", "not applied"


def code_action(uri: str, version: int, rng: types.Range, converter: cattrs.Converter) -> types.CodeAction:
    """The "Rewrite with echoline…" action for a selection: it carries the command with its
    argument ready (no instruction, apply mode), tied to the version the range is in."""
    arg = {"uri": uri, "version": version, "range": converter.unstructure(rng), "instruction": "", "mode": "apply"}
    title = "Rewrite with echoline…"
    return types.CodeAction(title=title, kind=types.CodeActionKind.RefactorRewrite,
                            command=types.Command(title=title, command=COMMAND, arguments=[arg]))
