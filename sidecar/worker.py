"""One engine thread behind a queue.

The engine is not re-entrant and a generation takes seconds, so every engine
call (model load, draft-source updates, generation) happens on this single
thread. The LSP loop only enqueues and awaits futures, so it stays responsive
(a didChange during a generation is processed at once). Each job carries its
own cancel Event, which the engine checks every forward step; a job submitted
with a *key* (e.g. ``("inline", uri)``) supersedes the older job with that key.

Draft sources are not jobs: updates are coalesced (last text wins) and applied
between jobs, never during a generation.

Engines by job: the worker may hold an engine per job ("rewrite"; "inline" for inline
completion and edit prediction), each a ``Slot``. Jobs that name the same model (the same
key) share one slot, so one engine serves both and nothing loads twice. A job runs on the
engine of its kind's job (``ENGINE_OF_KIND``: an idle prefill on the rewrite engine, an
inline warm-up on the inline one); every loaded engine gets the same draft sources (the
workspace index), each tokenized with its own tokenizer.
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
from echoline.sidecar.source_tokens import encoder_of, tokens_of

if TYPE_CHECKING:
    from echoline.engine.api import LoadProgress

log = logging.getLogger(__name__)

_DELETE = object()
# Jobs any request cancels (work done ahead of need): the rewrite prefix's idle prefill
# ("prefill") and the inline warm-up at the cursor ("warm").
BACKGROUND = frozenset({"prefill", "warm"})
# Jobs that leave background jobs running. A warm-up is not among them: it cancels an idle
# prefill (which resumes after it), since the cursor is where the user types next.
NO_PREEMPT = frozenset({"prefill", "status", "sync", "settings", "bind"})
#: The jobs that may each have an engine: rewrites, and inline completion with edit prediction.
JOBS = ("rewrite", "inline")
#: The job whose engine a kind runs on; kinds not listed (status, settings) use ``PRIMARY``.
ENGINE_OF_KIND = {"rewrite": "rewrite", "prefill": "rewrite", "inline": "inline", "warm": "inline",
                  "next_edit": "inline", "nextEdit": "inline"}
#: The job whose engine is loaded at start, and whose state ``EngineWorker.state`` is.
PRIMARY = "rewrite"


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
    engine_job: str = PRIMARY  # the job whose engine this one runs on (ENGINE_OF_KIND)
    model: str | None = None  # the model of the engine it ran on

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
                "stepS": self.step_s, "model": self.model,
                **({"detail": self.detail} if self.detail else {})}


@dataclass(eq=False)
class Slot:
    """One engine (loading, loaded or failed) and the jobs' view of it: the source updates
    it has not seen. Its per-chunk token ids of the sources are the engine's own
    (``source_tokens.tokens_of``), shared with the rewrite prompts and gone with the engine."""

    key: Hashable
    model: str
    engine: EngineLike | None = None
    state: str = "loading"  # "loading", "ready", "error"
    error: str | None = None
    label: str | None = None
    dirty: dict[str, object] = field(default_factory=dict)


class EngineWorker:
    """Owns the engines. States: "idle" (nothing loaded yet), "loading", "ready", "error";
    ``state``, ``engine``, ``error`` and ``model_label`` are the ``PRIMARY`` job's
    (``state_of``/``engine_for`` name a job)."""

    def __init__(self, loader: Callable[..., Any]) -> None:
        self._loader = loader
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._by_key: dict[Hashable, Job] = {}
        self._sources: dict[str, str] = {}
        self._slots: dict[Hashable, Slot] = {}  # every engine held, by key
        self._bound: dict[str, Slot] = {}  # job -> the slot its jobs run on
        # job -> the slot a queued load or bind will give it (None: it will have none); what
        # ``state_of`` reports meanwhile, while jobs queued before that still run on ``_bound``.
        self._pending: dict[str, Slot | None] = {}
        self._ids = itertools.count(1)
        self._stop = False
        self.finished: deque[Job] = deque(maxlen=8)  # recent generation jobs, for status
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="echoline-engine", daemon=True)
        self._thread.start()

    # ---- model -------------------------------------------------------------
    def load(self, model: str, progress: LoadProgress | None = None, *, jobs: tuple[str, ...] = JOBS,
             key: Hashable | None = None, **kwargs: Any) -> Job:
        """Queue a (re)load of ``model`` for ``jobs``. Requests submitted after it wait for
        it (FIFO). ``key`` says which loads are the same engine (default: the model and
        the arguments): an engine with that key already held (or loading) is shared, not
        loaded again. The engines the jobs leave are dropped before the new one loads.

        ``progress``: told each phase of the load (download, compile, calibration), on this
        thread; the loader gets it as ``progress=`` and the warm-up reports to it too."""
        if key is None:
            key = (model, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        with self._cond:
            held = self._slots.get(key)
            if held is not None and held.state == "error":
                held = None  # a failed load is tried again
            if held is not None:
                for j in jobs:
                    self._pending[j] = held
                share = held

                def bind(_engine: Any, _cancel: threading.Event) -> Any:
                    self._bind(jobs, share)
                    if share.state == "error":
                        raise RuntimeError(share.error or "the shared engine failed to load")
                    return share.engine

                return self.submit(bind, kind="bind")
            slot = Slot(key, model)
            self._slots[key] = slot
            for j in jobs:
                self._pending[j] = slot
            if PRIMARY in jobs:
                self._ready.clear()

        def run(_engine: Any, _cancel: threading.Event) -> Any:
            self._bind(jobs, slot)  # frees the engines these jobs leave before loading
            try:
                engine = self._loader(model, progress=progress, **kwargs)
            except BaseException as exc:
                slot.error = f"could not load model {model!r}: {exc}"
                slot.state = "error"
                self._settled(jobs)
                raise
            _warm_up(engine, progress)
            _record_speeds(engine)
            slot.engine = engine
            slot.label = engine.model_name if isinstance(engine, EngineLike) else model
            with self._cond:
                slot.dirty = dict(self._sources)
                slot.state = "ready"
            self._settled(jobs)
            return engine

        return self.submit(run, kind="load")

    def release(self, jobs: tuple[str, ...]) -> Job:
        """Queue dropping ``jobs``' engines (a setting changed their model): they load
        again on first use; an engine another job still uses stays."""
        with self._cond:
            for j in jobs:
                self._pending[j] = None
        return self.submit(lambda _e, _c: self._bind(jobs, None), kind="bind")

    def _bind(self, jobs: tuple[str, ...], slot: Slot | None) -> None:
        """(engine thread) Point ``jobs`` at ``slot`` and drop the slots no job uses."""
        with self._cond:
            for j in jobs:
                if slot is None:
                    self._bound.pop(j, None)
                else:
                    self._bound[j] = slot
                if self._pending.get(j, slot) is slot:
                    self._pending.pop(j, None)
            used = set(self._bound.values()) | {s for s in self._pending.values() if s is not None}
            for k, s in list(self._slots.items()):
                if s not in used:
                    del self._slots[k]

    def _settled(self, jobs: tuple[str, ...]) -> None:
        if PRIMARY in jobs:
            self._ready.set()

    def _jobs_of(self, slot: Slot) -> set[str]:  # holds self._cond
        return {j for j in JOBS if self._pending.get(j, self._bound.get(j)) is slot}

    def _slot_of(self, job: str) -> Slot | None:
        """The slot ``job`` has or will have once its queued load/bind ran."""
        with self._cond:
            if job in self._pending:
                return self._pending[job]
            return self._bound.get(job)

    def state_of(self, job: str) -> str:
        """``job``'s engine state: "idle" (none yet: loaded on first use), "loading",
        "ready" or "error"."""
        slot = self._slot_of(job)
        return "idle" if slot is None else slot.state

    def error_of(self, job: str) -> str | None:
        slot = self._slot_of(job)
        return None if slot is None else slot.error

    def model_of(self, job: str) -> str | None:
        """The loaded engine's model name (``EngineLike.model_name``), else the model asked for."""
        slot = self._slot_of(job)
        return None if slot is None else (slot.label or slot.model)

    def key_of(self, job: str) -> Hashable | None:
        """The key of ``job``'s engine (None: it has none)."""
        slot = self._slot_of(job)
        return None if slot is None else slot.key

    def engine_for(self, job: str) -> EngineLike | None:
        """The engine ``job``'s work runs on now (None: not loaded)."""
        slot = self._bound.get(job)
        return None if slot is None else slot.engine

    def engines(self) -> list[dict[str, Any]]:
        """Each engine held: its model, state and the jobs it serves (for status)."""
        with self._cond:
            slots = list(self._slots.values())
            return [{"model": s.label or s.model, "state": s.state, "jobs": sorted(self._jobs_of(s))}
                    for s in slots]

    def loaded_engines(self) -> list[EngineLike]:
        """The engines loaded now (engine thread: a settings job applies to each)."""
        with self._cond:
            return [s.engine for s in self._slots.values() if s.engine is not None]

    @property
    def engine(self) -> EngineLike | None:
        return self.engine_for(PRIMARY)

    @property
    def state(self) -> str:
        return self.state_of(PRIMARY)

    @property
    def error(self) -> str | None:
        return self.error_of(PRIMARY)

    @property
    def model_label(self) -> str | None:
        slot = self._slot_of(PRIMARY)
        return None if slot is None else slot.label

    def wait_settled(self, timeout: float) -> bool:
        """Block until the current load finished (either way). False on timeout."""
        return self._ready.wait(timeout)

    # ---- sources (SourceSink) -----------------------------------------------
    def set_source(self, source_id: str, text: str) -> None:
        with self._cond:
            self._sources[source_id] = text
            for slot in self._slots.values():
                slot.dirty[source_id] = text
            self._cond.notify()

    def remove_source(self, source_id: str) -> None:
        with self._cond:
            self._sources.pop(source_id, None)
            for slot in self._slots.values():
                slot.dirty[source_id] = _DELETE
            self._cond.notify()

    def has_source(self, source_id: str) -> bool:
        with self._cond:
            return source_id in self._sources

    def pending_sources(self) -> int:
        """Source updates not yet in an engine (the most any held engine has waiting)."""
        with self._cond:
            return max((len(s.dirty) for s in self._slots.values()), default=0)

    def token_cache_bytes(self) -> int:
        """Memory of the per-chunk token ids kept for incremental updates (any thread)."""
        with self._cond:
            engines = [s.engine for s in self._slots.values() if s.engine is not None]
        caches = {id(c): c for c in (tokens_of(e) for e in engines)}  # engines of one vocabulary share one
        return sum(c.memory_bytes() for c in caches.values())

    def sync_sources(self) -> Job:
        """A no-op job: when it completes, every earlier source update is in the engine."""
        return self.submit(lambda _e, _c: None, kind="sync")

    def _apply_sources(self) -> None:
        with self._cond:
            batches = []
            for slot in self._slots.values():
                if slot.engine is not None and slot.dirty:
                    batches.append((slot, slot.dirty))
                    slot.dirty = {}
        for slot, batch in batches:
            engine = slot.engine
            for sid, text in batch.items():
                try:
                    if text is _DELETE:
                        tokens_of(engine).forget(sid)
                        engine.remove_source(sid)
                    else:
                        self._set_source(engine, sid, text)  # type: ignore[arg-type]
                except Exception:
                    log.exception("engine rejected source %s", sid)

    def _set_source(self, engine: EngineLike, sid: str, text: str) -> None:
        """Hand the engine the source's ids, re-tokenizing only the chunks an edit touched.

        Same ids as ``engine.set_source(sid, text)`` (no BOS, special-token text left
        plain), kept in the engine's chunk cache (``tokens_of``), where a rewrite prompt
        on the same text finds them; engines that do not draft from ids
        (``takes_source_ids``: a remote server) get the text, untokenized.
        """
        tok = getattr(engine, "tokenizer", None)
        if (tok is None or not getattr(engine, "takes_source_ids", False)
                or not hasattr(tok, "encode_batch")):
            engine.set_source(sid, text)
            return
        ids = tokens_of(engine).ids(sid, text, encoder_of(tok))
        engine.set_source_ids(sid, ids)

    # ---- jobs ---------------------------------------------------------------
    def submit(
        self, fn: Callable[[Any, threading.Event], Any], *, kind: str, key: Hashable | None = None,
        engine_job: str | None = None,
    ) -> Job:
        """Queue ``fn``. A job of any kind but the background ones first cancels the
        background jobs (an idle prefill) queued or running, so it waits for at most one
        of their chunks; a job with ``key`` supersedes the older job with that key.
        ``fn`` gets the engine of ``engine_job`` (default: its kind's, ``ENGINE_OF_KIND``)."""
        job = Job(fn=fn, kind=kind, key=key, id=next(self._ids),
                  engine_job=engine_job or ENGINE_OF_KIND.get(kind, PRIMARY))
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
                while not self._stop and not self._queue and not any(
                    s.dirty and s.engine is not None for s in self._slots.values()
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
        slot = self._bound.get(job.engine_job)
        engine = None if slot is None else slot.engine
        job.model = None if slot is None else slot.label
        try:
            result = job.fn(engine, job.cancel)
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


def _warm_up(engine: EngineLike, progress: LoadProgress | None) -> None:
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


def _record_speeds(engine: EngineLike) -> None:
    """Keep a local engine's calibrated speeds for the next start's model choice
    (``engine.model_choice``): a remote engine or a stand-in has none."""
    if not isinstance(engine, EngineLike) or not getattr(engine, "takes_source_ids", False):
        return
    try:
        from echoline.engine.model_choice import engine_speeds, record_speeds

        speeds = engine_speeds(engine)
        if speeds is not None:
            record_speeds(engine.model_name, engine.backend_name, speeds)
    except Exception:
        log.exception("could not record the engine's speeds")


def _mean_step(result: Any) -> float | None:
    """Seconds per decode round from a result carrying ``stats`` (GenerationStats.as_dict())."""
    stats = getattr(result, "stats", None)
    if not isinstance(stats, dict) or not stats.get("rounds"):
        return None
    decode = float(stats.get("total_s", 0.0)) - float(stats.get("ttft_s", 0.0))
    return round(max(decode, 0.0) / stats["rounds"], 4)
