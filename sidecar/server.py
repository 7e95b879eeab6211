"""The echoline language server: capabilities, handlers, and the guards around pygls' transport.

Protocol (see docs/sidecar.md): ``textDocument/inlineCompletion``,
``workspace/executeCommand echoline.rewrite`` (+ a code action carrying it),
``echoline.status``, notifications ``echoline/status`` and
``echoline/rewriteProgress``, work-done ``$/progress`` for model loading and
rewrites. All engine work runs on the single worker thread (sidecar.worker);
handlers here are coroutines that await it, so the loop keeps serving.

Transport (framing, the strict converter, the protocol class): ``sidecar.lsp_transport``.

Order: ``serve`` lets each new handler run up to its first wait before it reads the
next frame, so a request sees the document as it was when the request came, whatever
didChange/didClose follows it in the same read; handlers take the text, version and
positions they need before their first ``await``. pygls' table of running handlers
(``_request_futures``) drops each entry once done, and ``shutdown`` walks a copy of it.

Positions: converted with ``sidecar.lsp_utils`` (LSP line ends only, the negotiated
``positionEncoding``), never with pygls' ``TextDocument.lines`` (``str.splitlines``).
"""

from __future__ import annotations

import asyncio
import collections.abc
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from echoline.sidecar import config as cfg
from echoline.sidecar import inline_request, rewrite_request, status, tcp_guard
from echoline.sidecar import next_edit_request as nes
from echoline.sidecar.edit_history import EditHistory
from echoline.sidecar.engine_choice import JobModel, job_models, load_engine, remote_status
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.idle_prefill import IdlePrefill
from echoline.sidecar.inline import HeadStarts
from echoline.sidecar.inline_store import InlineStore
from echoline.sidecar.inline_warm import CURSOR, NOTIFY_INLINE_WARM, InlineAhead, InlineWarm
from echoline.sidecar.lsp_transport import (  # noqa: F401 - FrameError/FrameParser re-exported
    MAX_FRAME_BYTES,
    READ_CHUNK_BYTES,
    EcholineProtocol,
    FrameError,
    FrameParser,
    strict_converter,
)
from echoline.sidecar.lsp_utils import (
    UTF16,
    find_document,
    normalize_encoding,
    offset_at,
    parse_position,
    plain_params,
    position_at,
)
from echoline.sidecar.lsp_utils import invalid as invalid  # re-exported: error helpers
from echoline.sidecar.lsp_utils import short as short
from echoline.sidecar.next_edit_warm import NextEditWarm
from echoline.sidecar.progress import PROGRESS_INTERVAL_S, WorkDone, load_message
from echoline.sidecar.rewrite_request import RewriteArgs
from echoline.sidecar.worker import PRIMARY, EngineWorker, Job
from echoline.sidecar.workspace_index import WorkspaceIndex
from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls import uris
from pygls.exceptions import JsonRpcException
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from echoline.version import package_version

log = logging.getLogger(__name__)

VERSION = package_version()  # pyproject.toml's version, through the package metadata
CMD_REWRITE = rewrite_request.COMMAND
CMD_STATUS = status.COMMAND
NOTIFY_STATUS = "echoline/status"
NOTIFY_PREFILL = "echoline/prefill"
REQUEST_FAILED = -32803  # LSP RequestFailed
JOB_TIMEOUT_S = 600.0  # far above any generation's max_tokens at CPU speed
APPLY_EDIT_TIMEOUT_S = 30.0


_converter = get_converter()
rewrite_request.register(_converter)


def request_failed(message: str) -> JsonRpcException:
    return JsonRpcException(message, code=REQUEST_FAILED)


def _default_loader(model: str, **kwargs: Any) -> Any:
    # The engines are imported lazily there: the server answers initialize at once.
    return load_engine(model, **kwargs)


class EcholineServer(LanguageServer):
    def __init__(self, loader: Any = None) -> None:
        super().__init__(
            "echoline",
            VERSION,
            protocol_cls=EcholineProtocol,
            converter_factory=strict_converter,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = cfg.Settings()
        self.worker = EngineWorker(loader or _default_loader)
        self.index: WorkspaceIndex | None = None
        self.jobs_by_msg: dict[Any, Job] = {}
        #: Each open document's inline prompt head start (``inline_head_start``'s ``keep``):
        #: the next request keeps it where it fits, so its cached head is reused.
        self.inline_head_starts = HeadStarts()
        #: Ids of requests the client cancelled (the latest few): a rewrite whose generation
        #: had already finished when its cancel arrived must still not send its edit.
        self.cancelled_ids: collections.deque[Any] = collections.deque(maxlen=256)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_tok_s = 0.0
        self.last_acceptance = 0.0
        #: Bounds on waits that depend on something else going right: a job (a bug or a
        #: stuck model must not hold a request forever) and the editor's answer to
        #: workspace/applyEdit (an editor that never answers must not hold the rewrite).
        self.job_timeout_s = JOB_TIMEOUT_S
        self.apply_edit_timeout_s = APPLY_EDIT_TIMEOUT_S
        self._loaded_key: tuple | None = None
        #: Each job's model and why (``engine_choice.job_models``), as of the last load.
        self.job_models: dict[str, JobModel] | None = None
        #: The load's latest phase ("downloading 12.0 / 469.0 MiB", "compiling kernels
        #: (first run only)", ...), and the progress bars of requests waiting for it.
        self.load_message = ""
        self._load_percentage: int | None = None
        self._load_watchers: set[WorkDone] = set()
        self.idle_prefill = IdlePrefill(
            self.worker, lambda: self.settings, self._doc_text,
            lambda info: self.protocol.notify(NOTIFY_PREFILL, info),
        )
        #: whether this client has asked for an inline completion: only then is an edit
        #: worth a warm-up (a client that only rewrites would pay for it in idle-prefill stops)
        self.inline_asked = False
        self.inline_warm = InlineWarm(
            self.worker, lambda: self.settings, self._doc_state, lambda: self.position_encoding,
            self.inline_head_starts, lambda info: self.protocol.notify(NOTIFY_INLINE_WARM, info),
        )
        #: Shown inline suggestions and recent results per document (answers with no run),
        #: and the completion after the shown one's acceptance, computed ahead.
        self.inline_store = InlineStore()
        self.inline_ahead = InlineAhead(self.worker, lambda: self.settings, self.inline_head_starts,
                                        self.inline_store)
        #: The user's recent edit events, for edit predictions (secret files never enter).
        self.edit_history = EditHistory(nes.secret_rule(lambda: self.index),
                                        lambda uri: nes.prompt_path(uri, self.workspace.root_path))
        #: the prediction prompt's file block at a resting cursor (when predictions ask the model)
        self.next_edit_warm = NextEditWarm(
            self.worker, lambda: self.settings, lambda info: log.debug("next-edit warm-up: %s", info),
            self._doc_state, lambda: self.position_encoding,
            lambda uri: nes.prompt_path(uri, self.workspace.root_path), self.edit_history.is_secret,
        )

    def _doc_text(self, uri: str) -> str | None:
        doc = find_document(self.workspace, uri)
        return None if doc is None else doc.source

    def _doc_state(self, uri: str) -> tuple[str, int | None] | None:
        doc = find_document(self.workspace, uri)
        return None if doc is None else (doc.source, doc.version)

    @property
    def position_encoding(self) -> str:
        """The ``positionEncoding`` agreed at initialize (pygls picks the client's first
        offered one it knows: utf-8, utf-16 or utf-32); UTF-16 before that."""
        try:
            return normalize_encoding(self.workspace.position_encoding)
        except RuntimeError:
            return UTF16

    # ---- transport ---------------------------------------------------------------------
    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve over stdio through ``FrameParser`` (pygls' reader would allocate whatever
        a ``Content-Length`` claims). Reads run on the thread pool, as pygls' do."""
        self._stop_event = threading.Event()
        stream = stdin or sys.stdin.buffer
        read = getattr(stream, "read1", stream.read)  # read1: what is there, not N bytes
        pool = self.thread_pool
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))

        def read_chunk() -> Awaitable[bytes]:
            return asyncio.get_running_loop().run_in_executor(pool, read, READ_CHUNK_BYTES)

        try:
            asyncio.run(self.serve(read_chunk))
        except BrokenPipeError:
            log.error("the client's pipe is closed; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def start_tcp(self, host: str, port: int, token: str | None = None) -> None:
        """Serve ONE client over TCP, through the same frame reader (``sidecar.tcp_guard``).

        A connection must open with the token line; one that does not, one that looks like
        HTTP, and any connection while a client is served are closed without touching the
        protocol, so they can neither drive the server nor end it. The served client's
        disconnect ends the server, as stdio's EOF does.
        """
        self._stop_event = threading.Event()
        busy = False

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal busy
            peer = writer.get_extra_info("peername")
            if busy:
                log.warning("TCP: refused %s: a client is already served", peer)
                writer.close()
                return
            if token is not None:
                try:
                    first = await asyncio.wait_for(reader.readline(), timeout=10)
                except (TimeoutError, ValueError, ConnectionError):
                    first = b""
                why = tcp_guard.check_first_line(first, token)
                if why is not None:
                    log.warning("TCP: refused %s: %s", peer, why)
                    writer.close()
                    return
            busy = True
            self.protocol.set_writer(writer)  # type: ignore[arg-type]
            await self.serve(lambda: reader.read(READ_CHUNK_BYTES))
            self.shutdown()

        async def main() -> None:
            self._server = await asyncio.start_server(connection, host, port)
            async with self._server:
                await self._server.serve_forever()

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            log.debug("TCP server stopped")

    async def serve(self, read_chunk: Callable[[], Awaitable[bytes]]) -> None:
        """Read frames until EOF (or ``exit``); a bad frame is answered and skipped."""
        parser = FrameParser()
        stop = self._stop_event
        while stop is None or not stop.is_set():
            data = await read_chunk()
            if not data:
                break
            parser.feed(data)
            for item in parser.frames():
                if isinstance(item, FrameError):
                    log.warning("bad frame: %s", item.message)
                    self.protocol.reply_error(None, item.code, item.message)
                    continue
                try:
                    self.protocol.handle_body(item)
                except BrokenPipeError:
                    raise
                except Exception:  # never let one message end the server
                    log.exception("could not handle a message")
                # A coroutine handler only starts when the loop runs it: without this,
                # every later frame of the same read (a didChange, a didClose) would be
                # applied first and the request served against text it was not sent
                # with. One loop step runs each new handler up to its first real wait;
                # handlers read the document (text, version, positions) before that.
                await asyncio.sleep(0)

    # ---- plumbing ----------------------------------------------------------------------
    def cancel_request(self, msg_id: Any) -> None:
        self.cancelled_ids.append(msg_id)
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
                "model": self.worker.model_of(PRIMARY) or self.settings.model,
                "message": message or (self.worker.error or ""),
                "tokS": round(self.last_tok_s, 2),
                "acceptance": round(self.last_acceptance, 4),
                **remote_status(self.worker.engine, brief=True),
                **self.models_status(),
            },
        )

    def models_status(self) -> dict[str, Any]:
        """Which model does which job and why: ``models`` {job: {model, reason, state}} and
        ``modelSummary``, one line for a status line."""
        from echoline.engine.model_choice import summary

        models = self.models_by_job()
        out = {job: {**m.as_dict(), "state": self.worker.state_of(job)} for job, m in models.items()}
        return {"models": out, "modelSummary": summary(out)}

    def models_by_job(self) -> dict[str, JobModel]:
        """The jobs' models: as loaded, or as the settings say now (before the first load)."""
        if self.job_models is None:
            self.job_models = job_models(self.settings)
        return self.job_models

    # ---- model -------------------------------------------------------------------------
    async def load_model(self) -> None:
        """(Re)load for the settings: the rewrite engine now (with the inline job when both
        name the same model: one engine), the inline engine on its first use."""
        s = self.settings
        self._loaded_key = s.engine_key()
        self.job_models = job_models(s)
        rewrite, inline = self.job_models["rewrite"], self.job_models["inline"]
        if rewrite.key == inline.key:
            jobs: tuple[str, ...] = ("rewrite", "inline")
        else:
            jobs = ("rewrite",)
            if self.worker.key_of("inline") not in (None, inline.key):
                self.worker.release(("inline",))  # another model now: loaded on first use
        await self._watch_load(self._start_load(jobs, rewrite), rewrite, shared=len(jobs) > 1)

    def ensure_engine(self, job: str) -> None:
        """Queue the load of ``job``'s engine if it has none yet (lazily, on first use)."""
        if self.worker.state_of(job) != "idle":
            return
        jm = self.models_by_job()[job]
        asyncio.ensure_future(self._watch_load(self._start_load((job,), jm), jm))

    def _start_load(self, jobs: tuple[str, ...], jm: JobModel) -> Job:
        """Queue the load of ``jm``'s model for ``jobs``: from here on, their requests see
        "loading" and wait for it (an engine with the same key already held is shared)."""
        s = self.settings
        self.load_message, self._load_percentage = "starting", None
        return self.worker.load(jm.model, progress=self._load_reporter(jobs[0]), jobs=jobs, key=jm.key,
                                backend=s.backend, kv_budget_bytes=s.kv_budget_bytes,
                                cpu_activations=s.cpu_activations, reply_history=s.reply_history,
                                **s.engine_kwargs())

    async def _watch_load(self, job: Job, jm: JobModel, shared: bool = False) -> None:
        """The load's progress bar and status notifications, and its error shown; ``shared``:
        the engine serves every job (the bar then names no job)."""
        bar = WorkDone(self, "echoline")
        self._load_watchers.add(bar)
        self.send_status(self.load_message)
        await bar.begin(f"Loading model {jm.model}" + ("" if shared else f" (for {jm.job})"))
        t0 = time.monotonic()
        try:
            engine = await asyncio.wrap_future(job.future)
        except Exception as exc:
            msg = self.worker.error_of(jm.job) or f"could not load model {jm.model!r}: {exc}"
            self._load_watchers.discard(bar)
            bar.end("failed")
            self.show_error(f"echoline: {msg}")
            self.send_status(msg)
            return
        finally:
            self.load_message = ""
        self._load_watchers.discard(bar)
        backend = engine.backend_variant if isinstance(engine, EngineLike) else "?"
        done = f"{self.worker.model_of(jm.job)} on {backend} in {time.monotonic() - t0:.1f}s"
        bar.end(done)
        self.send_status(done)

    def _load_reporter(self, job: str = PRIMARY) -> Callable[[str, int, int], None]:
        """The engine's ``LoadProgress`` for the load of ``job``'s engine: on the worker
        thread, at most every ``PROGRESS_INTERVAL_S`` within a phase (every new phase at
        once), handed to the loop."""
        last = {"phase": "", "at": 0.0}

        def progress(phase: str, done: int, total: int) -> None:  # worker thread
            now = time.monotonic()
            if phase == last["phase"] and now - last["at"] < PROGRESS_INTERVAL_S and done < total:
                return
            last.update(phase=phase, at=now)
            self.from_thread(self._load_phase, *load_message(phase, done, total), job)

        return progress

    def _load_phase(self, message: str, percentage: int | None, job: str = PRIMARY) -> None:  # event loop
        if self.worker.state_of(job) not in ("idle", "loading"):
            return  # a late report of a load that is over
        self.load_message, self._load_percentage = message, percentage
        for bar in list(self._load_watchers):
            bar.report(message, percentage)
        self.send_status(message)

    async def wait_for_model(self, bar: WorkDone | None = None, job: str = PRIMARY) -> str:
        """Wait, at most ``readyTimeoutS``, while ``job``'s model loads; its state after
        (``ready``, ``error``, or ``loading`` on timeout). ``bar``: a begun progress of the
        waiting request, which shows the load's phases meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout_s
        if bar is not None and self.worker.state_of(job) in ("idle", "loading"):
            self._load_watchers.add(bar)
            if self.load_message:
                bar.report(self.load_message, self._load_percentage)
        try:
            while self.worker.state_of(job) in ("idle", "loading") and loop.time() <= deadline:
                await asyncio.sleep(0.05)
        finally:
            if bar is not None:
                self._load_watchers.discard(bar)
        return self.worker.state_of(job)

    async def engine_ready(self, bar: WorkDone | None = None, job: str = PRIMARY) -> None:
        """Wait (bounded) for ``job``'s model; a clear error when it is not there."""
        if self.job_models is not None:
            self.ensure_engine(job)
        state = await self.wait_for_model(bar, job)
        if state in ("idle", "loading"):
            model = self.worker.model_of(job) or self.settings.model
            raise request_failed(
                f"echoline: model {model!r} is still loading after "
                f"{self.settings.ready_timeout_s:.0f}s ({self.load_message or 'loading'}); "
                "try again shortly"
            )
        if state == "error":
            raise request_failed(
                f"echoline: no model available ({self.worker.error_of(job)}). "
                f"Fix the 'model' setting (echoline.model, or echoline.{job}Model) and the server reloads it."
            )

    async def run_job(self, fn: Any, kind: str, key: Any = None) -> Any:
        job = self.worker.submit(fn, kind=kind, key=key)
        msg_id = self.protocol.msg_id
        if msg_id is not None:
            self.jobs_by_msg[msg_id] = job
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)),
                                          self.job_timeout_s)
        except TimeoutError:
            job.request_cancel()
            raise request_failed(f"{kind} took longer than {self.job_timeout_s:g} s; cancelled") from None
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
        if old.inline_warm and not new.inline_warm:
            self.inline_warm.stop_all()
        if not self.next_edit_warm.enabled(new):
            self.next_edit_warm.stop_all()
        if self.index is not None and (
            new.max_file_bytes != old.max_file_bytes or new.max_index_mb != old.max_index_mb
        ):
            self.index.max_file_bytes = new.max_file_bytes
            self.index.max_total_bytes = new.max_index_bytes
            threading.Thread(target=self.index.scan, daemon=True).start()
        if new.reply_history != old.reply_history and self._loaded_key == new.engine_key():
            # No reload: the loaded engine keeps fewer (or more) replies from now on.
            n = new.reply_history

            def history(_e: Any, _c: threading.Event) -> None:
                for engine in self.worker.loaded_engines():  # every job's engine
                    engine.set_reply_history(n)

            self.worker.submit(history, kind="settings")
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
        doc = find_document(self.workspace, uri)
        if doc is not None:
            self.index.open_buffer(uri, doc.source)


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
    ls.idle_prefill.stop_all(final=True)
    ls.inline_warm.stop_all(final=True)
    ls.next_edit_warm.stop_all(final=True)
    for job in list(ls.jobs_by_msg.values()):
        job.request_cancel()
    if ls.index is not None:
        ls.index.stop()
    ls.worker.stop()


def on_did_open(ls: EcholineServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.inline_head_starts.opened(params.text_document.uri)
    ls.inline_store.closed(params.text_document.uri)  # a fresh open: nothing shown yet
    ls.edit_history.opened(params.text_document.uri, params.text_document.text)
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)


def on_did_change(ls: EcholineServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.inline_head_starts.edited(params.text_document.uri, list(params.content_changes))
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)
    ls.inline_warm.edited(params.text_document.uri)
    _edit_is_a_cursor(ls, params)
    doc = find_document(ls.workspace, params.text_document.uri)
    if doc is not None:
        ls.edit_history.changed(params.text_document.uri, doc.source)


def _edit_is_a_cursor(ls: EcholineServer, params: types.DidChangeTextDocumentParams) -> None:
    """An edit is a cursor report: after one ranged change the cursor is at the end of its
    text, so the inline warm-up starts there as ``echoline/cursor`` starts it, for clients
    that send no cursor (a whole-document or multi-range change names no cursor). Only for a
    client that has asked for an inline completion: one that only rewrites gets no warm-ups
    (each would stop the rewrite's idle prefill). The request a keystroke is followed by
    drops it (``InlineWarm.asked``: the same place)."""
    changes = list(params.content_changes)
    rng = getattr(changes[-1], "range", None) if len(changes) == 1 else None
    uri = params.text_document.uri
    doc = find_document(ls.workspace, uri)
    if rng is None or doc is None or not ls.settings.inline_warm or not ls.inline_asked:
        return
    text, encoding = doc.source, ls.position_encoding
    end = offset_at(text, rng.start, encoding) + len(changes[-1].text)
    ls.inline_warm.cursor(uri, params.text_document.version, position_at(text, min(end, len(text)), encoding))


def on_did_close(ls: EcholineServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.idle_prefill.forget(params.text_document.uri)
    ls.inline_warm.closed(params.text_document.uri)
    ls.next_edit_warm.closed(params.text_document.uri)
    ls.inline_ahead.closed(params.text_document.uri)
    ls.inline_store.closed(params.text_document.uri)
    ls.inline_head_starts.closed(params.text_document.uri)
    ls.edit_history.closed(params.text_document.uri)
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


def on_cursor(ls: EcholineServer, params: Any) -> None:
    """``echoline/cursor`` {textDocument: {uri, version?}, position}: where the editor's
    cursor rests (a notification: nothing is answered; a malformed one is logged and
    dropped). Warms that document's inline session there (``sidecar/inline_warm.py``)."""
    try:
        uri, version, pos = _cursor_params(params)
    except ValueError as exc:
        log.warning("%s dropped: %s", CURSOR, exc)
        return
    if find_document(ls.workspace, uri) is None:
        return
    if ls.settings.inline_warm:
        ls.inline_warm.cursor(uri, version, pos)
    ls.next_edit_warm.cursor(uri, version, pos)  # only where predictions ask the model


def _cursor_params(params: Any) -> tuple[str, int | None, types.Position]:
    """(uri, version or None, position) of an ``echoline/cursor``; ValueError naming what
    is wrong (``PositionError`` for the position)."""
    raw = plain_params(params)
    if not isinstance(raw, dict):
        raise ValueError("params must be an object {textDocument, position}")
    doc = raw.get("textDocument")
    uri = doc.get("uri") if isinstance(doc, dict) else None
    if not isinstance(uri, str) or not uri:
        raise ValueError("textDocument.uri must be a non-empty string")
    version = doc.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ValueError("textDocument.version must be an integer")
    return uri, version, parse_position(raw.get("position"), "position")


async def on_inline_completion(
    ls: EcholineServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    """``textDocument/inlineCompletion``: the completion at the cursor, or an empty list
    (sidecar/inline_request.py: the document read, the model's wait, store or run)."""
    return await inline_request.complete(ls, params.text_document.uri, params.position, params.work_done_token)


async def on_next_edit(ls: EcholineServer, params: Any) -> dict[str, Any]:
    """``echoline/nextEdit``: the predicted next edit near the cursor (sidecar/next_edit_request.py)."""
    uri, version, pos = nes.parse(params)
    return nes.next_edit_result(await nes.predict(ls, uri, version, pos, ls.position_encoding), _converter)


async def on_copilot_inline_edit(ls: EcholineServer, params: Any) -> dict[str, Any]:
    """``textDocument/copilotInlineEdit``: the same prediction in Copilot's NES shape (UTF-16)."""
    uri, version, pos = nes.parse(params)
    return nes.copilot_result(await nes.predict(ls, uri, version, pos, UTF16), _converter)


def on_inline_edit_note(ls: EcholineServer, params: Any) -> None:
    """``textDocument/didShowInlineEdit`` / ``didFocus`` from NES clients: accepted, logged."""
    log.debug("NES client notification: %s", short(plain_params(params)))


def on_code_action(ls: EcholineServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    """A rewrite action for a non-empty selection, when the client asks for refactors (or
    any kind); its command carries the selection's version (``rewrite_request.code_action``)."""
    rng = params.range
    if (rng.start.line, rng.start.character) == (rng.end.line, rng.end.character):
        return []
    if params.context.only and not any(str(k).startswith("refactor") for k in params.context.only):
        return []
    doc = find_document(ls.workspace, params.text_document.uri)
    if doc is None:
        return []
    return [rewrite_request.code_action(params.text_document.uri, doc.version, rng, _converter)]


async def cmd_rewrite(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    """``echoline.rewrite``: rewrite a range; the job, its progress and whether its reply is
    answered, previewed or applied: ``rewrite_request.serve``."""
    req: RewriteArgs = rewrite_request.rewrite_args(_converter, args)
    return await rewrite_request.serve(ls, req, _converter)


async def cmd_status(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    """``echoline.status``: model state, settings and index figures; with {uri}, whether
    that file is indexed (sidecar/status.py)."""
    return await status.report(ls, args)


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
    ls.feature(CURSOR)(on_cursor)
    ls.feature(nes.NEXT_EDIT)(on_next_edit)
    ls.feature(nes.COPILOT_INLINE_EDIT)(on_copilot_inline_edit)
    ls.feature(nes.DID_SHOW_INLINE_EDIT)(on_inline_edit_note)
    ls.feature(nes.DID_FOCUS)(on_inline_edit_note)
    ls.command(CMD_REWRITE)(cmd_rewrite)
    ls.command(CMD_STATUS)(cmd_status)
    return ls


def run_stdio() -> None:
    """Serve one client over stdin/stdout (what editors spawn)."""
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "WARNING"))
    create_server().start_io()


def run_tcp(host: str = "127.0.0.1", port: int = 2087, *, allow_remote: bool = False) -> None:
    """Serve over TCP (debugging): loopback unless ``allow_remote``, one client, a token.

    The token comes from ``ECHOLINE_TCP_TOKEN``, else a random one is printed on stderr.
    """
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "INFO"))
    tcp_guard.check_bind(host, allow_remote)
    if allow_remote and not tcp_guard.is_loopback(host):
        log.warning("TCP: listening on %s: reachable from other machines (--allow-remote)", host)
    token, generated = tcp_guard.server_token()
    if generated:
        sys.stderr.write(f"echoline: TCP token (send 'Echoline-Token: <token>' first): {token}\n")
        sys.stderr.flush()
    create_server().start_tcp(host, port, token)
