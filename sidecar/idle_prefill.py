"""Prefill a document's rewrite prompt prefix while the user pauses.

Why: a rewrite prompt starts with the whole file (sidecar.prompts), so after an
edit the next request must re-prefill hundreds of tokens before its first reply
token. Here, ``prefillIdleMs`` after a document's last change, a background job
on the engine thread runs that file-only prefix into the session a rewrite of
the document uses; the request that follows then prefills only its tail.

The job is low priority: any request submitted to the worker cancels it (it then
stops within one ``CHUNK``-token chunk, keeping the chunks done), and a newer
change cancels and reschedules it. It never changes a reply: the engine reuses
a session's cache only as far as it matches the request's prompt token for token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from echoline.sidecar.config import Settings
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.prompts import rewrite_prefix_ids
from echoline.sidecar.worker import EngineWorker, Job

CHUNK = 64  # tokens per forward: what a request arriving mid-prefill waits for at most


def rewrite_session(uri: str) -> str:
    """The engine session a rewrite of ``uri`` uses (server.cmd_rewrite passes the same)."""
    return uri


class IdlePrefill:
    """Per-document debounce timers (event loop) and their prefill jobs (engine thread)."""

    def __init__(
        self,
        worker: EngineWorker,
        settings: Callable[[], Settings],
        text_of: Callable[[str], str | None],
        notify: Callable[[dict[str, Any]], None],
    ) -> None:
        self._worker = worker
        self._settings = settings
        self._text_of = text_of
        self._notify = notify  # called on the event loop
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.last: dict[str, Any] | None = None  # the latest finished prefill, for status

    # ---- event loop ------------------------------------------------------------------------
    def changed(self, uri: str) -> None:
        """A document was opened or edited: cancel its prefill, schedule a fresh one."""
        self.forget(uri)
        self._rearm(uri)

    def _rearm(self, uri: str) -> None:
        s = self._settings()
        if not s.prefill_on_idle:
            return
        loop = asyncio.get_running_loop()
        self._timers[uri] = loop.call_later(s.prefill_idle_ms / 1000.0, self._fire, uri)

    def forget(self, uri: str) -> None:
        """Drop ``uri``'s pending timer and cancel its queued or running prefill."""
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        self._worker.cancel_key(("prefill", uri))

    def stop_all(self) -> None:
        for uri in list(self._timers):
            self.forget(uri)

    def _fire(self, uri: str) -> None:
        self._timers.pop(uri, None)
        if not self._settings().prefill_on_idle or self._worker.state == "error":
            return
        text = self._text_of(uri)
        if text is None:
            return
        loop = asyncio.get_running_loop()

        def started(n: int) -> None:  # engine thread
            loop.call_soon_threadsafe(self._notify, {"uri": uri, "state": "started", "tokens": n})

        def job(engine: Any, cancel: threading.Event) -> dict[str, Any] | None:
            return run_prefill(engine, uri, text, cancel, started)

        submitted = self._worker.submit(job, kind="prefill", key=("prefill", uri))
        submitted.future.add_done_callback(
            lambda _f: loop.call_soon_threadsafe(self._finished, uri, submitted)
        )

    def _finished(self, uri: str, job: Job) -> None:
        info: dict[str, Any] = {"uri": uri, **job.summary()}
        if job.cancel.is_set() and not job.superseded and uri not in self._timers:
            # Stopped by a request (not by a change): resume once the engine is free
            # again; the chunks done stay in the session, so only the rest runs.
            self._rearm(uri)
        if job.future.cancelled() or job.future.exception() is not None:
            info["state"] = "cancelled" if job.cancel.is_set() else "failed"
        else:
            detail = job.future.result()
            if detail is None:
                return
            info["state"] = "cancelled" if detail.get("cancelled") else detail.get("state", "done")
        self.last = info
        self._notify(info)


def run_prefill(
    engine: EngineLike | None,
    uri: str,
    text: str,
    cancel: threading.Event,
    started: Callable[[int], None] | None = None,
) -> dict[str, Any] | None:
    """On the engine thread: prefill ``text``'s rewrite prefix into its rewrite session."""
    if not isinstance(engine, EngineLike):  # not loaded, or a test's stand-in
        return None
    ids = rewrite_prefix_ids(engine, text, name=uri)
    if not ids:
        return {"state": "skipped", "reason": "file longer than the prompt window", "tokens": 0}
    if cancel.is_set():
        return {"state": "cancelled", "cancelled": True, "tokens": len(ids), "cached": None}
    if started is not None:
        started(len(ids))
    # A backend whose results depend on the rows per forward gets the engine's own chunk.
    chunk = CHUNK if engine.backend.batch_invariant else None
    cached = engine.prefill(ids, session=rewrite_session(uri), cancel=cancel, chunk=chunk)
    return {"state": "done", "cancelled": cancel.is_set() and cached < len(ids) - 1,
            "tokens": len(ids), "cached": cached}
