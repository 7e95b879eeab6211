"""Prefill work done ahead of a request, while the user pauses: the shared machinery.

Why: a request's first reply token waits for every prompt token its session does not hold
yet. Two things can be run ahead of need: a document's rewrite prompt prefix after an edit
(``sidecar/idle_prefill.py``) and the inline prompt at a cursor that came to rest
(``sidecar/inline_warm.py``). Both need the same life cycle, kept here once:

* a per-document debounce timer on the event loop (a newer change or cursor re-arms it);
* a job of the worker's background kind (``worker.BACKGROUND``): any request cancels it,
  queued or running, and then waits for at most one ``CHUNK``-token chunk; the chunks done
  stay in the session, so a later run continues where it stopped;
* a job stopped by a request before it ran everything (not superseded by a newer change)
  is re-armed, so the rest runs once the engine is free again;
* a notification when the job starts and when it ends, and the last end kept for status.

Replies never change: the engine reuses a session's cache only as far as it matches the
request's prompt token for token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from echoline.sidecar.config import Settings
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.worker import EngineWorker, Job

CHUNK = 64  # tokens per forward: what a request arriving mid-prefill waits for at most

#: The engine-thread part of a background prefill: (engine, cancel, started) -> its figures
#: (None: nothing to report); ``started(n)`` is called with the prompt's length before it runs.
PrefillJob = Callable[[Any, threading.Event, Callable[[int], None]], "dict[str, Any] | None"]


def prefill_chunk(engine: EngineLike) -> int | None:
    """The chunk a background prefill runs in: ``CHUNK``, or the engine's own prefill chunk
    on a backend whose results depend on the rows per forward (chunks there would change
    the bits a later request computes)."""
    return CHUNK if engine.backend.batch_invariant else None


def run_ids(
    engine: EngineLike, ids: list[int], session: str, cancel: threading.Event,
    started: Callable[[int], None] | None, reserve_tokens: int | None = None, **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """On the engine thread: run a background prefill's ``ids`` into ``session``, in
    ``prefill_chunk`` chunks, and report it as ``{"state", "cancelled", "tokens", "cached",
    **extra}``: "cancelled" when a cancel stopped it before its last chunk (the chunks done
    stay in the session)."""
    if cancel.is_set():
        return {"state": "cancelled", "cancelled": True, "tokens": len(ids), "cached": None, **extra}
    if started is not None:
        started(len(ids))
    cached = engine.prefill(ids, session=session, cancel=cancel, chunk=prefill_chunk(engine),
                            reserve_tokens=reserve_tokens)
    return {"state": "done", "cancelled": cancel.is_set() and cached < len(ids) - 1,
            "tokens": len(ids), "cached": cached, **extra}


class BackgroundPrefill:
    """Per-document debounce timers (event loop) and their prefill jobs (engine thread).

    Subclasses say when they are on and after how long (``on_setting``, ``delay_setting``,
    or ``enabled`` and ``delay_ms``), and what to run (``make_job``, called on the event loop when the timer fires)."""

    #: The worker key's first part: one job per (key_name, document) at a time.
    key_name = "prefill"
    #: The worker job kind (``worker.BACKGROUND``): "prefill" leaves other background jobs
    #: running, "warm" cancels them (they resume later): what the user is about to need first.
    job_kind = "prefill"
    #: The job whose engine the prefill runs on (None: the kind's, ``worker.ENGINE_OF_KIND``).
    engine_job: str | None = None

    def __init__(
        self,
        worker: EngineWorker,
        settings: Callable[[], Settings],
        notify: Callable[[dict[str, Any]], None],
    ) -> None:
        self._worker = worker
        self._settings = settings
        self._notify = notify  # called on the event loop
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._jobs: dict[str, Job] = {}  # each document's job queued or running
        self._closed = False  # after the server's shutdown: nothing is scheduled again
        self.last: dict[str, Any] | None = None  # the latest finished prefill, for status

    # ---- what a subclass decides ------------------------------------------------------------
    #: The settings (``Settings`` attribute names) that turn the job on and set its delay.
    on_setting = ""
    delay_setting = ""

    def enabled(self, s: Settings) -> bool:
        return bool(getattr(s, self.on_setting))

    def delay_ms(self, s: Settings) -> int:
        return int(getattr(s, self.delay_setting))

    def make_job(self, uri: str) -> PrefillJob | None:
        """The job to run for ``uri`` now (event loop); None: nothing to run."""
        raise NotImplementedError

    # ---- event loop ------------------------------------------------------------------------
    def changed(self, uri: str) -> None:
        """Something the job depends on changed: cancel its prefill, schedule a fresh one."""
        self.forget(uri)
        self._rearm(uri)

    def _rearm(self, uri: str) -> None:
        s = self._settings()
        if self._closed or not self.enabled(s):
            return
        loop = asyncio.get_running_loop()
        self._timers[uri] = loop.call_later(self.delay_ms(s) / 1000.0, self._fire, uri)

    def forget(self, uri: str) -> None:
        """Drop ``uri``'s pending timer and cancel its queued or running prefill."""
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self._worker.cancel_key((self.key_name, uri))

    def stop_all(self, final: bool = False) -> None:
        """Cancel every timer and every queued or running job (the setting turned off);
        ``final``: for good (the server shuts down), so no stopped job is re-armed."""
        self._closed = self._closed or final
        for uri in set(self._timers) | set(self._jobs):
            self.forget(uri)

    def _fire(self, uri: str) -> None:
        self._timers.pop(uri, None)
        if not self.enabled(self._settings()) or self._worker.state == "error":
            return
        run = self.make_job(uri)
        if run is None:
            return
        loop = asyncio.get_running_loop()

        def started(n: int) -> None:  # engine thread
            loop.call_soon_threadsafe(self._notify, {"uri": uri, "state": "started", "tokens": n})

        def job(engine: EngineLike, cancel: threading.Event) -> dict[str, Any] | None:
            return run(engine, cancel, started)

        submitted = self._worker.submit(job, kind=self.job_kind, key=(self.key_name, uri), engine_job=self.engine_job)
        self._jobs[uri] = submitted
        submitted.future.add_done_callback(
            lambda _f: loop.call_soon_threadsafe(self._finished, uri, submitted)
        )

    def _finished(self, uri: str, job: Job) -> None:
        if self._jobs.get(uri) is job:
            del self._jobs[uri]
        info: dict[str, Any] = {"uri": uri, **job.summary()}
        detail = None
        if job.future.cancelled() or job.future.exception() is not None:
            info["state"] = "cancelled" if job.cancel.is_set() else "failed"
            early = job.cancel.is_set()
        else:
            detail = job.future.result()
            early = bool(detail and detail.get("cancelled"))
            if detail is not None:
                info["state"] = "cancelled" if detail.get("cancelled") else detail.get("state", "done")
        if early and not job.superseded and uri not in self._timers:
            # Stopped by a request (not by a change) before it ran everything: resume once
            # the engine is free again; the chunks done stay in the session, so only the
            # rest runs.
            self._rearm(uri)
        if detail is None and "state" not in info:
            return
        self.last = info
        self._notify(info)
