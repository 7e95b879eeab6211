"""One engine thread behind a queue.

The engine is not re-entrant and a generation takes seconds, so every engine
call (model load, draft-source updates, generation) happens on this single
thread. The LSP loop only enqueues and awaits futures, so it stays responsive
(a didChange during a generation is processed at once). Each job carries its
own cancel Event, which the engine checks every forward step; a job submitted
with a *key* (e.g. ``("inline", uri)``) supersedes the older job with that key.

Draft sources are not jobs: updates are coalesced (last text wins) and applied
between jobs, never during a generation.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.source_tokens import SourceTokens

if TYPE_CHECKING:
    from echoline.engine.api import LoadProgress

log = logging.getLogger(__name__)

_DELETE = object()
# Jobs any request cancels (work done ahead of need): the rewrite prefix's idle prefill
# ("prefill") and the inline warm-up at the cursor ("warm").
BACKGROUND = frozenset({"prefill", "warm"})
# Jobs that leave background jobs running. A warm-up is not among them: it cancels an idle
# prefill (which resumes after it), since the cursor is where the user types next.
NO_PREEMPT = frozenset({"prefill", "status", "sync", "settings"})


class JobCancelled(Exception):
    """The job was cancelled (by the client) or superseded (by a newer request)."""

    def __init__(self, superseded: bool) -> None:
        super().__init__("superseded by a newer request" if superseded else "cancelled")
        self.superseded = superseded


@dataclass
class Job:
    fn: Callable[[Any, threading.Event], Any]
    kind: str
    key: Hashable | None = None
    id: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)
    future: Future = field(default_factory=Future)
    superseded: bool = False
    started_at: float | None = None
    finished_at: float | None = None
    cancel_at: float | None = None
    step_s: float | None = None  # mean seconds per decode round, when the result says
    detail: dict[str, Any] | None = None  # a background job's own figures (its result)

    def request_cancel(self, superseded: bool = False) -> None:
        self.superseded = self.superseded or superseded
        if self.cancel_at is None:
            self.cancel_at = time.monotonic()
        self.cancel.set()

    def summary(self) -> dict[str, Any]:
        """Timing of a finished job; ``stopLatencyS``: cancel request -> job returned."""
        stop = None
        if self.cancel_at is not None and self.finished_at is not None and self.started_at is not None:
            stop = round(max(0.0, self.finished_at - max(self.cancel_at, self.started_at)), 4)
        run = None
        if self.started_at is not None and self.finished_at is not None:
            run = round(self.finished_at - self.started_at, 4)
        return {"kind": self.kind, "cancelled": self.cancel_at is not None,
                "superseded": self.superseded, "runS": run, "stopLatencyS": stop,
                "stepS": self.step_s, **({"detail": self.detail} if self.detail else {})}


class EngineWorker:
    """Owns the engine. States: "idle" (nothing loaded yet), "loading", "ready", "error"."""

    def __init__(self, loader: Callable[..., Any]) -> None:
        self._loader = loader
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._by_key: dict[Hashable, Job] = {}
        self._sources: dict[str, str] = {}
        self._dirty: dict[str, object] = {}
        self._tokens = SourceTokens()  # per-chunk ids of the sources (engine thread only)
        self._ids = itertools.count(1)
        self._stop = False
        self.engine: EngineLike | None = None
        self.state = "idle"
        self.error: str | None = None
        self.model_label: str | None = None
        self.finished: deque[Job] = deque(maxlen=8)  # recent generation jobs, for status
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="echoline-engine", daemon=True)
        self._thread.start()

    # ---- model -------------------------------------------------------------
    def load(self, model: str, progress: LoadProgress | None = None, **kwargs: Any) -> Job:
        """Queue a (re)load. Requests submitted after it wait for it (FIFO).

        ``progress``: told each phase of the load (download, compile, calibration), on this
        thread; the loader gets it as ``progress=`` and the warm-up reports to it too."""

        def run(_engine: Any, _cancel: threading.Event) -> Any:
            self.engine = None
            try:
                engine = self._loader(model, progress=progress, **kwargs)
            except BaseException as exc:
                self.error = f"could not load model {model!r}: {exc}"
                self.state = "error"
                self._ready.set()
                raise
            _warm_up(engine, progress)
            self.engine = engine
            self._tokens.clear()
            self.model_label = engine.model_name if isinstance(engine, EngineLike) else model
            self.error = None
            self.state = "ready"
            with self._cond:
                for sid, text in self._sources.items():
                    self._dirty[sid] = text
            self._ready.set()
            return engine

        with self._cond:
            self.state = "loading"
            self.error = None
            self._ready.clear()
        return self.submit(run, kind="load")

    def wait_settled(self, timeout: float) -> bool:
        """Block until the current load finished (either way). False on timeout."""
        return self._ready.wait(timeout)

    # ---- sources (SourceSink) -----------------------------------------------
    def set_source(self, source_id: str, text: str) -> None:
        with self._cond:
            self._sources[source_id] = text
            self._dirty[source_id] = text
            self._cond.notify()

    def remove_source(self, source_id: str) -> None:
        with self._cond:
            self._sources.pop(source_id, None)
            self._dirty[source_id] = _DELETE
            self._cond.notify()

    def has_source(self, source_id: str) -> bool:
        with self._cond:
            return source_id in self._sources

    def pending_sources(self) -> int:
        with self._cond:
            return len(self._dirty)

    def token_cache_bytes(self) -> int:
        """Memory of the per-chunk token ids kept for incremental updates (engine thread)."""
        return self._tokens.memory_bytes()

    def sync_sources(self) -> Job:
        """A no-op job: when it completes, every earlier source update is in the engine."""
        return self.submit(lambda _e, _c: None, kind="sync")

    def _apply_sources(self) -> None:
        engine = self.engine
        if engine is None:
            return
        with self._cond:
            batch, self._dirty = self._dirty, {}
        for sid, text in batch.items():
            try:
                if text is _DELETE:
                    self._tokens.forget(sid)
                    engine.remove_source(sid)
                else:
                    self._set_source(engine, sid, text)  # type: ignore[arg-type]
            except Exception:
                log.exception("engine rejected source %s", sid)

    def _set_source(self, engine: Any, sid: str, text: str) -> None:
        """Hand the engine the source's ids, re-tokenizing only the chunks an edit touched.

        Same ids as ``engine.set_source(sid, text)`` (no BOS, special-token text left
        plain); engines that do not draft from ids (``takes_source_ids``: a remote
        server) get the text, untokenized.
        """
        tok = getattr(engine, "tokenizer", None)
        if (tok is None or not getattr(engine, "takes_source_ids", False)
                or not hasattr(tok, "encode_batch")):
            engine.set_source(sid, text)
            return
        ids = self._tokens.ids(sid, text, lambda texts: tok.encode_batch(texts, parse_special=False))
        engine.set_source_ids(sid, ids)

    # ---- jobs ---------------------------------------------------------------
    def submit(
        self, fn: Callable[[Any, threading.Event], Any], *, kind: str, key: Hashable | None = None
    ) -> Job:
        """Queue ``fn``. A job of any kind but the background ones first cancels the
        background jobs (an idle prefill) queued or running, so it waits for at most one
        of their chunks; a job with ``key`` supersedes the older job with that key."""
        job = Job(fn=fn, kind=kind, key=key, id=next(self._ids))
        with self._cond:
            if kind not in NO_PREEMPT:
                self._cancel_background()
            if key is not None:
                old = self._by_key.get(key)
                if old is not None and not old.future.done():
                    old.request_cancel(superseded=True)
                self._by_key[key] = job
            self._queue.append(job)
            self._cond.notify()
        return job

    def running(self) -> Job | None:
        return self._running

    def cancel_key(self, key: Hashable) -> None:
        """Cancel the queued or running job submitted with ``key`` (if any)."""
        with self._cond:
            job = self._by_key.get(key)
            if job is not None and not job.future.done():
                job.request_cancel(superseded=True)

    def _cancel_background(self) -> None:  # holds self._cond
        for job in [*self._queue, self._running]:
            if job is not None and job.kind in BACKGROUND and not job.future.done():
                job.request_cancel()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            for job in self._queue:
                job.request_cancel()
            if self._running is not None:
                self._running.request_cancel()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._queue and not (
                    self._dirty and self.engine is not None
                ):
                    self._cond.wait()
                if self._stop:
                    pending, self._queue = list(self._queue), deque()
                else:
                    pending = []
                job = self._queue.popleft() if self._queue and not self._stop else None
            for p in pending:
                if not p.future.done():
                    p.future.set_exception(JobCancelled(False))
            if self._stop:
                return
            self._apply_sources()
            if job is not None:
                self._run(job)

    def _run(self, job: Job) -> None:
        if not job.future.set_running_or_notify_cancel():
            self._forget(job)
            return
        if job.cancel.is_set():
            job.future.set_exception(JobCancelled(job.superseded))
            self._forget(job)
            return
        self._running = job
        job.started_at = time.monotonic()
        try:
            result = job.fn(self.engine, job.cancel)
        except BaseException as exc:  # report everything to the awaiting handler
            job.finished_at = time.monotonic()
            job.future.set_exception(exc)
        else:
            job.finished_at = time.monotonic()  # before the future's callbacks read it
            job.step_s = _mean_step(result)
            if job.kind in BACKGROUND and isinstance(result, dict):
                job.detail = result
            job.future.set_result(result)
        finally:
            self._running = None
            if job.kind in ("inline", "rewrite"):
                self.finished.append(job)
            self._forget(job)

    def _forget(self, job: Job) -> None:
        with self._cond:
            if job.key is not None and self._by_key.get(job.key) is job:
                del self._by_key[job.key]


def _warm_up(engine: Any, progress: LoadProgress | None) -> None:
    """Pay the one-off costs while loading, not on the user's first request: the first
    forward (kernel compile or cache load) and the draft controller's calibration
    (``EngineLike.warm_up``). A failure here is only logged: the request will pay it, or
    report it, as before. A test's stand-in that is no EngineLike is left as it is."""
    if not isinstance(engine, EngineLike):
        return
    try:
        engine.warm_up(progress)
    except Exception:
        log.exception("warm-up after loading failed")


def _mean_step(result: Any) -> float | None:
    """Seconds per decode round from a result carrying ``stats`` (GenerationStats.as_dict())."""
    stats = getattr(result, "stats", None)
    if not isinstance(stats, dict) or not stats.get("rounds"):
        return None
    decode = float(stats.get("total_s", 0.0)) - float(stats.get("ttft_s", 0.0))
    return round(max(decode, 0.0) / stats["rounds"], 4)
