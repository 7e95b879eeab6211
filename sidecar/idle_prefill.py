"""Prefill a document's rewrite prompt prefix while the user pauses.

Why: a rewrite prompt starts with the whole file (sidecar.prompts), so after an
edit the next request must re-prefill hundreds of tokens before its first reply
token. Here, ``prefillIdleMs`` after a document's last change, a background job
on the engine thread runs that file-only prefix into the session a rewrite of
the document uses; the request that follows then prefills only its tail.

The life cycle (debounce, cancelled by any request within one chunk, resumed
after it, a newer change cancels and reschedules) is ``BackgroundPrefill``'s
(``sidecar/background_prefill.py``). It never changes a reply: the engine reuses
a session's cache only as far as it matches the request's prompt token for token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from echoline.sidecar.background_prefill import CHUNK, BackgroundPrefill, PrefillJob, run_ids
from echoline.sidecar.config import Settings
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.prompts import rewrite_prefix_ids
from echoline.sidecar.worker import EngineWorker

__all__ = ["CHUNK", "IdlePrefill", "rewrite_session", "run_prefill"]


def rewrite_session(uri: str) -> str:
    """The engine session a rewrite of ``uri`` uses (server.cmd_rewrite passes the same)."""
    return uri


class IdlePrefill(BackgroundPrefill):
    """The rewrite prefix of each edited document, ``prefillIdleMs`` after its last change."""

    key_name = "prefill"
    on_setting, delay_setting = "prefill_on_idle", "prefill_idle_ms"

    def __init__(
        self,
        worker: EngineWorker,
        settings: Callable[[], Settings],
        text_of: Callable[[str], str | None],
        notify: Callable[[dict[str, Any]], None],
    ) -> None:
        super().__init__(worker, settings, notify)
        self._text_of = text_of

    def make_job(self, uri: str) -> PrefillJob | None:
        text = self._text_of(uri)
        if text is None:
            return None

        def job(engine: EngineLike, cancel: threading.Event, started: Callable[[int], None]) -> dict[str, Any] | None:
            return run_prefill(engine, uri, text, cancel, started)

        return job


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
    return run_ids(engine, ids, rewrite_session(uri), cancel, started)
