"""The echoline language server: capabilities and handlers, nothing else.

Protocol (see docs/sidecar.md): ``textDocument/inlineCompletion``,
``workspace/executeCommand echoline.rewrite`` (+ a code action carrying it),
``echoline.status``, notifications ``echoline/status`` and
``echoline/rewriteProgress``, work-done ``$/progress`` for model loading and
rewrites. All engine work runs on the single worker thread (sidecar.worker);
handlers here are coroutines that await it, so the loop keeps serving.
"""

import asyncio
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls import uris
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.workspace import TextDocument

from sidecar import config as cfg
from sidecar.idle_prefill import IdlePrefill, rewrite_session
from sidecar.prompts import (
    block_end,
    finish_completion,
    heal_prefix,
    indentation,
    inline_prompt,
    unheal,
)
from sidecar.rewrite import Progress, run_rewrite
from sidecar.worker import EngineWorker, Job, JobCancelled
from sidecar.workspace_index import WorkspaceIndex, normalize_uri

log = logging.getLogger(__name__)

VERSION = "0.1.0"
CMD_REWRITE = "echoline.rewrite"
CMD_STATUS = "echoline.status"
NOTIFY_STATUS = "echoline/status"
NOTIFY_REWRITE_PROGRESS = "echoline/rewriteProgress"
NOTIFY_PREFILL = "echoline/prefill"
REQUEST_FAILED = -32803  # LSP RequestFailed
CONTENT_MODIFIED = -32801  # LSP ContentModified
PROGRESS_INTERVAL_S = 0.1

_converter = get_converter()


def request_failed(message: str) -> JsonRpcException:
    return JsonRpcException(message, code=REQUEST_FAILED)


def invalid(message: str) -> JsonRpcException:
    return JsonRpcInvalidParams(message)


def _default_loader(model: str, **kwargs: Any) -> Any:
    from engine.api import Engine  # imported lazily: the server answers initialize at once

    return Engine.load(model, **kwargs)


class EcholineProtocol(LanguageServerProtocol):
    """Forwards ``$/cancelRequest`` to the server so running jobs stop, not just queued ones."""

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        hook = getattr(self._server, "cancel_request", None)
        if hook is not None:
            hook(msg_id)
        super()._handle_cancel_notification(msg_id)


class EcholineServer(LanguageServer):
    def __init__(self, loader: Any = None) -> None:
        super().__init__(
            "echoline",
            VERSION,
            protocol_cls=EcholineProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = cfg.Settings()
        self.worker = EngineWorker(loader or _default_loader)
        self.index: WorkspaceIndex | None = None
        self.jobs_by_msg: dict[Any, Job] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_tok_s = 0.0
        self.last_acceptance = 0.0
        self._tokens = itertools.count(1)
        self._loaded_key: tuple | None = None
        self.idle_prefill = IdlePrefill(
            self.worker, lambda: self.settings, self._doc_text,
            lambda info: self.protocol.notify(NOTIFY_PREFILL, info),
        )

    def _doc_text(self, uri: str) -> str | None:
        doc = self.workspace.text_documents.get(uri)
        return None if doc is None else doc.source

    # ---- plumbing ----------------------------------------------------------------------
    def cancel_request(self, msg_id: Any) -> None:
        job = self.jobs_by_msg.get(msg_id)
        if job is not None:
            job.request_cancel()

    def from_thread(self, fn: Any, *args: Any) -> None:
        """Run ``fn`` on the event loop (worker-thread callbacks must not write directly)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def supports_progress(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    def show_error(self, message: str) -> None:
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=message)
        )

    def send_status(self, message: str = "") -> None:
        st = self.worker.state
        state = {"idle": "loading", "loading": "loading"}.get(st, st)
        self.protocol.notify(
            NOTIFY_STATUS,
            {
                "state": state,
                "model": self.worker.model_label or self.settings.model,
                "message": message or (self.worker.error or ""),
                "tokS": round(self.last_tok_s, 2),
                "acceptance": round(self.last_acceptance, 4),
            },
        )

    async def progress_begin(self, title: str, message: str = "", cancellable: bool = False) -> str | None:
        if not self.supports_progress():
            return None
        token = f"echoline-{os.getpid()}-{next(self._tokens)}"
        try:
            await asyncio.wait_for(self.work_done_progress.create_async(token), 5)
        except Exception:
            return None
        self.work_done_progress.begin(
            token,
            types.WorkDoneProgressBegin(title=title, message=message, cancellable=cancellable),
        )
        return token

    def progress_end(self, token: str | None, message: str = "") -> None:
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))

    # ---- model -------------------------------------------------------------------------
    async def load_model(self) -> None:
        s = self.settings
        self._loaded_key = s.engine_key()
        # Queue the load first: from here on, requests see "loading" and wait for it.
        job = self.worker.load(s.model, backend=s.backend, kv_budget_bytes=s.kv_budget_bytes,
                               cpu_activations=s.cpu_activations, reply_history=s.reply_history)
        token = await self.progress_begin("echoline", f"Loading model {s.model}")
        self.send_status(f"loading {s.model}")
        t0 = time.monotonic()
        try:
            engine = await asyncio.wrap_future(job.future)
        except Exception as exc:
            msg = self.worker.error or f"could not load model {s.model!r}: {exc}"
            self.progress_end(token, "failed")
            self.show_error(f"echoline: {msg}")
            self.send_status(msg)
            return
        backend = getattr(engine, "backend_variant", None) or getattr(engine, "backend_name", "?")
        done = f"{self.worker.model_label} on {backend} in {time.monotonic() - t0:.1f}s"
        self.progress_end(token, done)
        self.send_status(done)

    async def engine_ready(self) -> None:
        """Wait (bounded) for the model; a clear error when it is not there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout_s
        while self.worker.state in ("idle", "loading"):
            if loop.time() > deadline:
                raise request_failed(
                    f"echoline: model {self.settings.model!r} is still loading after "
                    f"{self.settings.ready_timeout_s:.0f}s; try again shortly"
                )
            await asyncio.sleep(0.05)
        if self.worker.state == "error":
            raise request_failed(
                f"echoline: no model available ({self.worker.error}). "
                "Fix the 'model' setting (echoline.model) and the server reloads it."
            )

    async def run_job(self, fn: Any, kind: str, key: Any = None) -> Any:
        job = self.worker.submit(fn, kind=kind, key=key)
        msg_id = self.protocol.msg_id
        if msg_id is not None:
            self.jobs_by_msg[msg_id] = job
        try:
            return await asyncio.shield(asyncio.wrap_future(job.future))
        except asyncio.CancelledError:
            job.request_cancel()
            raise
        finally:
            if msg_id is not None:
                self.jobs_by_msg.pop(msg_id, None)

    def note_stats(self, stats: dict[str, Any]) -> None:
        self.last_tok_s = float(stats.get("tokens_per_s", 0.0))
        self.last_acceptance = float(stats.get("acceptance", 0.0))

    # ---- settings ----------------------------------------------------------------------
    def apply_settings(self, raw: Any) -> None:
        new, errors = cfg.apply(self.settings, cfg.unwrap(raw))
        for err in errors:
            self.show_error(err)
        old = self.settings
        self.settings = new
        if old.prefill_on_idle and not new.prefill_on_idle:
            self.idle_prefill.stop_all()
        if self.index is not None and (
            new.max_file_bytes != old.max_file_bytes or new.max_index_mb != old.max_index_mb
        ):
            self.index.max_file_bytes = new.max_file_bytes
            self.index.max_total_bytes = new.max_index_bytes
            threading.Thread(target=self.index.scan, daemon=True).start()
        if new.reply_history != old.reply_history and self._loaded_key == new.engine_key():
            # No reload: the loaded engine keeps fewer (or more) replies from now on.
            n = new.reply_history
            self.worker.submit(lambda e, _c: e.set_reply_history(n) if e is not None else None, kind="settings")
        if self._loaded_key is not None and new.engine_key() != self._loaded_key:
            self._loaded_key = new.engine_key()
            asyncio.ensure_future(self.load_model())

    # ---- workspace index ---------------------------------------------------------------
    def start_index(self) -> None:
        roots = []
        for folder in self.workspace.folders.values():
            path = uris.to_fs_path(folder.uri)
            if path:
                roots.append(path)
        if not roots and self.workspace.root_path:
            roots.append(self.workspace.root_path)
        roots = [r for r in roots if os.path.isdir(r)]
        if self.index is not None:
            self.index.stop()
        self.index = WorkspaceIndex(
            roots,
            self.worker,
            max_file_bytes=self.settings.max_file_bytes,
            max_total_bytes=self.settings.max_index_bytes,
            debounce_ms=int(os.environ.get("ECHOLINE_WATCH_DEBOUNCE_MS", "300")),
        )
        self.index.start()

    def buffer_changed(self, uri: str) -> None:
        if self.index is None:
            return
        doc = self.workspace.text_documents.get(uri)
        if doc is not None:
            self.index.open_buffer(uri, doc.source)


@dataclass
class InlineOutcome:
    text: str | None  # None: stopped by a cancel or a newer request
    stats: dict[str, Any]
    mode: str


# ---- helpers on documents -----------------------------------------------------------------


def utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


def line_body(line: str) -> str:
    return line.rstrip("\r\n")


def completion_end(pos: types.Position, rest_of_line: str, completion: str) -> types.Position:
    """Where an inline item's range ends: the end of the cursor's line when the rest of
    that line is blank or repeated at the end of the completion's first line (an
    auto-closed ")" the model wrote too), so accepting it does not duplicate text;
    otherwise the cursor itself (a pure insertion)."""
    first = completion.split("\n", 1)[0]
    tail = rest_of_line.strip()
    if rest_of_line and (not tail or first.rstrip().endswith(tail)):
        return types.Position(line=pos.line, character=pos.character + utf16_len(rest_of_line))
    return pos


def check_position(doc: TextDocument, pos: types.Position, what: str) -> int:
    """Offset (code points) of a client position; a clear error when it is out of bounds."""
    lines = doc.lines
    n = len(lines)
    if pos.line < 0 or pos.character < 0:
        raise invalid(f"{what} {pos.line}:{pos.character} is negative")
    if pos.line >= n:
        if pos.character == 0 and (pos.line == n and (n == 0 or lines[-1].endswith("\n"))):
            return len(doc.source)
        raise invalid(
            f"{what} line {pos.line} is out of bounds: the document has {n} line(s)"
        )
    width = utf16_len(line_body(lines[pos.line]))
    if pos.character > width:
        raise invalid(
            f"{what} {pos.line}:{pos.character} is past the end of line {pos.line} ({width} characters)"
        )
    return doc.offset_at_position(pos)


def get_doc(ls: EcholineServer, uri: Any) -> TextDocument:
    if not isinstance(uri, str) or not uri:
        raise invalid("'uri' must be a non-empty string")
    doc = ls.workspace.text_documents.get(uri)
    if doc is None:
        raise invalid(f"unknown document {uri!r}: open it first (textDocument/didOpen)")
    return doc


def parse_position(raw: Any, what: str) -> types.Position:
    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) for k in ("line", "character")
    ):
        raise invalid(f"{what} must be {{line: int, character: int}}, got {raw!r}")
    return types.Position(line=raw["line"], character=raw["character"])


def parse_rewrite_args(args: tuple[Any, ...]) -> dict[str, Any]:
    if len(args) != 1 or not isinstance(args[0], dict):
        raise invalid(
            f"{CMD_REWRITE} takes ONE argument {{uri, version, range, instruction, mode}}; got {len(args)} argument(s)"
        )
    a = args[0]
    version = a.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise invalid(f"'version' must be an integer (the document version you read), got {version!r}")
    rng = a.get("range")
    if not isinstance(rng, dict):
        raise invalid(f"'range' must be {{start, end}}, got {rng!r}")
    start = parse_position(rng.get("start"), "range.start")
    end = parse_position(rng.get("end"), "range.end")
    if (end.line, end.character) < (start.line, start.character):
        raise invalid("range.end is before range.start")
    instruction = a.get("instruction", "")
    if instruction is None:
        instruction = ""
    if not isinstance(instruction, str):
        raise invalid(f"'instruction' must be a string, got {type(instruction).__name__}")
    mode = a.get("mode", "apply") or "apply"
    if mode not in ("apply", "preview"):
        raise invalid(f"'mode' must be \"apply\" or \"preview\", got {mode!r}")
    return {
        "uri": a.get("uri"),
        "version": version,
        "range": types.Range(start=start, end=end),
        "instruction": instruction,
        "mode": mode,
    }


# ---- handlers -----------------------------------------------------------------------------


def on_initialize(ls: EcholineServer, params: types.InitializeParams) -> None:
    ls.loop = asyncio.get_running_loop()
    ls.apply_settings(params.initialization_options)


async def on_initialized(ls: EcholineServer, params: types.InitializedParams) -> None:
    ls.loop = asyncio.get_running_loop()
    ls.start_index()
    asyncio.ensure_future(ls.load_model())


def on_shutdown(ls: EcholineServer, *args: Any) -> None:
    """Stop generating and watching; the process exits on ``exit``."""
    ls.idle_prefill.stop_all()
    for job in list(ls.jobs_by_msg.values()):
        job.request_cancel()
    if ls.index is not None:
        ls.index.stop()
    ls.worker.stop()


def on_did_open(ls: EcholineServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)


def on_did_change(ls: EcholineServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)


def on_did_close(ls: EcholineServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.idle_prefill.forget(params.text_document.uri)
    if ls.index is not None:
        ls.index.close_buffer(params.text_document.uri)


async def on_did_change_configuration(
    ls: EcholineServer, params: types.DidChangeConfigurationParams
) -> None:
    raw = cfg.unwrap(params.settings)
    if raw is None:  # pull model: ask the client for the "echoline" section
        try:
            got = await ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="echoline")])
            )
            raw = got[0] if got else None
        except Exception:
            raw = None
    ls.apply_settings(raw)


def on_did_change_folders(ls: EcholineServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    ls.start_index()


async def on_inline_completion(
    ls: EcholineServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    uri = params.text_document.uri
    doc = get_doc(ls, uri)
    pos = params.position
    offset = check_position(doc, pos, "position")
    await ls.engine_ready()
    text = doc.source
    prefix, suffix = text[:offset], text[offset:]
    line_start = prefix.rfind("\n") + 1
    cursor_line = prefix[line_start:]
    indent = indentation(cursor_line)
    rest_of_line = line_body(suffix.split("\n", 1)[0])
    max_tokens = ls.settings.inline_max_tokens
    spec = ls.settings.speculation

    healed, removed = heal_prefix(prefix)

    def removed_ws(generated: str) -> str:
        return unheal(generated, removed)

    def job(engine: Any, cancel: threading.Event) -> InlineOutcome:
        prompt = inline_prompt(engine, healed, suffix)
        if not prompt.ids:  # nothing before the cursor (and no BOS): nothing to continue
            return InlineOutcome(None, {}, prompt.mode)
        ended = threading.Event()
        tok = engine.tokenizer
        is_control = getattr(tok, "is_control", lambda _t: False)

        def on_token(ev: Any) -> None:
            # A control token (a FIM model's <|fim_suffix|>, <|file_sep|>, ...) ends the
            # middle: its text must never reach the user's buffer.
            if any(is_control(t) for t in ev.new_ids) or block_end(removed_ws(ev.text), indent) is not None:
                ended.set()
                cancel.set()

        result = engine.generate(
            prompt.ids,
            max_tokens=max_tokens,
            spec=spec,
            session="inline:" + uri,
            on_token=on_token,
            cancel=cancel,
        )
        stats = result.stats.as_dict()
        if result.finish_reason == "cancelled" and not ended.is_set():
            return InlineOutcome(None, stats, prompt.mode)
        ids = list(result.token_ids)
        cut = next((i for i, t in enumerate(ids) if is_control(t)), None)
        generated = result.text if cut is None else tok.decode(ids[:cut])
        return InlineOutcome(finish_completion(removed_ws(generated), indent), stats, prompt.mode)

    try:
        out = await ls.run_job(job, kind="inline", key=("inline", uri))
    except JobCancelled:
        out = None
    if out is None or out.text is None:  # superseded (or cancelled): an empty answer
        return types.InlineCompletionList(items=[])
    completion = out.text
    ls.note_stats(out.stats)
    if not completion:
        return types.InlineCompletionList(items=[])
    end = completion_end(pos, rest_of_line, completion)
    item = types.InlineCompletionItem(insert_text=completion, range=types.Range(start=pos, end=end))
    return types.InlineCompletionList(items=[item])


def on_code_action(ls: EcholineServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    rng = params.range
    if (rng.start.line, rng.start.character) == (rng.end.line, rng.end.character):
        return []
    if params.context.only and not any(
        str(k).startswith("refactor") for k in params.context.only
    ):
        return []
    doc = ls.workspace.text_documents.get(params.text_document.uri)
    if doc is None:
        return []
    arg = {
        "uri": params.text_document.uri,
        "version": doc.version,
        "range": _converter.unstructure(rng),
        "instruction": "",
        "mode": "apply",
    }
    title = "Rewrite with echoline…"
    return [
        types.CodeAction(
            title=title,
            kind=types.CodeActionKind.RefactorRewrite,
            command=types.Command(title=title, command=CMD_REWRITE, arguments=[arg]),
        )
    ]


async def cmd_rewrite(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    req = parse_rewrite_args(args)
    uri = req["uri"]
    doc = get_doc(ls, uri)
    if doc.version != req["version"]:
        raise JsonRpcException(
            f"stale version: the request is for version {req['version']} but {uri} is at "
            f"version {doc.version}; nothing was changed",
            code=CONTENT_MODIFIED,
        )
    rng: types.Range = req["range"]
    start = check_position(doc, rng.start, "range.start")
    end = check_position(doc, rng.end, "range.end")
    await ls.engine_ready()
    text = doc.source
    version = req["version"]
    instruction = req["instruction"]
    last = [0.0]
    # The job is queued BEFORE the work-done progress is created: creating it is a
    # round trip to the client, which must not delay the first token. Reports that
    # come before the token exists wait in ``pending`` (the latest one wins).
    prog: dict[str, Any] = {"token": None, "pending": None}

    def report(p: Progress) -> None:  # worker thread
        now = time.monotonic()
        if now - last[0] < PROGRESS_INTERVAL_S:
            return
        last[0] = now
        ls.from_thread(send_progress, p)

    def send_report(token: str, p: Progress) -> None:
        ls.work_done_progress.report(
            token,
            types.WorkDoneProgressReport(
                message=f"{p.tokens} tokens, {p.tok_s:.1f} tok/s, acceptance {p.acceptance:.0%}\n{p.text}",
            ),
        )

    def send_progress(p: Progress) -> None:  # event loop
        payload = {
            "uri": uri,
            "text": p.text,
            "tokens": p.tokens,
            "tokS": round(p.tok_s, 2),
            "acceptance": round(p.acceptance, 4),
        }
        ls.protocol.notify(NOTIFY_REWRITE_PROGRESS, payload)
        if prog["token"] is not None:
            send_report(prog["token"], p)
        else:
            prog["pending"] = p

    settings = ls.settings

    def job(engine: Any, cancel: threading.Event) -> Any:
        return run_rewrite(
            engine, text, start, end, instruction, name=uri,
            max_tokens=settings.max_tokens, spec=settings.speculation,
            session=rewrite_session(uri), on_progress=report, cancel=cancel,
        )

    msg_id = ls.protocol.msg_id
    # This request prefills the document's prefix itself: no idle prefill for it after.
    ls.idle_prefill.forget(uri)
    running = asyncio.ensure_future(ls.run_job(job, kind="rewrite"))
    try:
        token = await ls.progress_begin(
            "echoline rewrite", instruction or "reproduce selection", cancellable=True
        )
    except asyncio.CancelledError:
        running.cancel()
        raise
    if token is not None:
        prog["token"] = token
        if prog["pending"] is not None:
            send_report(token, prog["pending"])
        fut = ls.work_done_progress.tokens.get(token)
        if fut is not None:  # the client's cancel button on the progress bar
            fut.add_done_callback(lambda f: ls.cancel_request(msg_id) if f.cancelled() else None)

    try:
        outcome = await running
    except JobCancelled:
        ls.progress_end(token, "cancelled")
        return {"applied": False, "reason": "cancelled", "text": "", "stats": {}}
    except asyncio.CancelledError:
        running.cancel()
        ls.progress_end(token, "cancelled")
        raise
    except Exception as exc:
        ls.progress_end(token, "failed")
        raise request_failed(f"echoline: rewrite failed: {exc}") from exc
    ls.note_stats(outcome.stats)
    ls.send_status()
    if outcome.finish_reason == "cancelled":
        ls.progress_end(token, "cancelled")
        return {"applied": False, "reason": "cancelled", "text": outcome.text, "stats": outcome.stats}
    edit = types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
                edits=[types.TextEdit(range=rng, new_text=outcome.text)],
            )
        ]
    )
    base = {"text": outcome.text, "stats": outcome.stats, "finishReason": outcome.finish_reason}
    if req["mode"] == "preview":
        ls.progress_end(token, "preview ready")
        return {"applied": False, "reason": "preview", "edit": _converter.unstructure(edit), **base}
    if outcome.finish_reason == "length":
        ls.progress_end(token, "reply truncated; not applied")
        return {
            "applied": False,
            "reason": f"the reply reached maxTokens ({settings.max_tokens}) before its end; "
            "edit not applied (raise echoline.maxTokens or select less)",
            **base,
        }
    current = ls.workspace.text_documents.get(uri)
    if current is None or current.version != version:
        now = None if current is None else current.version
        ls.progress_end(token, "document changed; not applied")
        return {
            "applied": False,
            "reason": f"document changed while generating (version {version} -> {now}); edit not applied",
            **base,
        }
    try:
        resp = await ls.workspace_apply_edit_async(
            types.ApplyWorkspaceEditParams(edit=edit, label="echoline rewrite")
        )
    except Exception as exc:
        ls.progress_end(token, "client refused the edit")
        return {"applied": False, "reason": f"workspace/applyEdit failed: {exc}", **base}
    ls.progress_end(token, "applied" if resp.applied else "not applied")
    reason = "applied" if resp.applied else (resp.failure_reason or "the client did not apply the edit")
    return {"applied": bool(resp.applied), "reason": reason, **base}


async def cmd_status(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    """Model state, settings and index figures; with {uri}, whether that file is indexed."""
    out: dict[str, Any] = {
        "state": ls.worker.state,
        "model": ls.worker.model_label or ls.settings.model,
        "error": ls.worker.error,
        "settings": cfg.as_lsp_dict(ls.settings),
        "tokS": ls.last_tok_s,
        "acceptance": ls.last_acceptance,
        "lastPrefill": ls.idle_prefill.last,
    }
    engine = ls.worker.engine
    if engine is not None:
        out["backend"] = getattr(engine, "backend_name", None)
        out["variant"] = getattr(engine, "backend_variant", out["backend"])
    if ls.index is not None:
        out["index"] = ls.index.stats().as_dict()
        out["index"]["pendingSources"] = ls.worker.pending_sources()
        if args and isinstance(args[0], dict) and isinstance(args[0].get("uri"), str):
            uri = normalize_uri(args[0]["uri"])
            out["indexed"] = uri in ls.index.indexed_uris()
    if engine is not None:
        # Measured on the worker thread, after pending source updates are applied.
        worker = ls.worker
        try:
            src, cache = await asyncio.wait_for(
                asyncio.wrap_future(
                    worker.submit(
                        lambda e, _c: (e.source_memory_bytes(), worker.token_cache_bytes()), kind="status"
                    ).future
                ),
                ls.settings.ready_timeout_s,
            )
            out["sourceMemoryBytes"], out["tokenCacheBytes"] = src, cache
        except Exception:
            out["sourceMemoryBytes"] = out["tokenCacheBytes"] = None
    out["recentJobs"] = [job.summary() for job in list(ls.worker.finished)]
    return out


def create_server(loader: Any = None) -> EcholineServer:
    """A fresh server with every feature registered (one per connection)."""
    ls = EcholineServer(loader)
    ls.feature(types.INITIALIZE)(on_initialize)
    ls.feature(types.INITIALIZED)(on_initialized)
    ls.feature(types.SHUTDOWN)(on_shutdown)
    ls.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_did_open)
    ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_did_change)
    ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_did_close)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_did_change_configuration)
    ls.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(on_did_change_folders)
    ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        on_inline_completion
    )
    ls.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]),
    )(on_code_action)
    ls.command(CMD_REWRITE)(cmd_rewrite)
    ls.command(CMD_STATUS)(cmd_status)
    return ls


def run_stdio() -> None:
    """Serve one client over stdin/stdout (what editors spawn)."""
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "WARNING"))
    create_server().start_io()


def run_tcp(host: str = "127.0.0.1", port: int = 2087) -> None:
    """Serve over TCP (debugging; binds 127.0.0.1 unless told otherwise)."""
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "INFO"))
    create_server().start_tcp(host, port)
