"""Work-done progress (``$/progress``) for the server's long jobs: a model load, a rewrite.

LSP gives a server two ways to show progress: on the token a client put in its request
(``workDoneToken``: the client already shows a bar for it, and the token is good until the
request is answered), or on a token the server asks the client to create
(``window/workDoneProgress/create``, a round trip). ``WorkDone`` takes the client's when
there is one and creates its own otherwise (only where the client declared
``window.workDoneProgress``); reports made before the progress has begun are kept, the
latest wins, and sent once it has.

``load_message`` turns the engine's load phases (``echoline.engine.api.LoadProgress``) into
the one line a status bar shows. The engine knows nothing of LSP; this module is where its
progress becomes protocol.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

from lsprotocol import types

log = logging.getLogger(__name__)

CREATE_TIMEOUT_S = 5.0
#: The least time between two progress reports of one phase (load phases, a rewrite's text).
PROGRESS_INTERVAL_S = 0.1
_ids = itertools.count(1)


def load_message(phase: str, done: int, total: int) -> tuple[str, int | None]:
    """``(message, percentage)`` for one load report; bytes in MiB when there is a count."""
    if total > 0:
        done = min(done, total)
        return f"{phase} {done / 2**20:,.1f} / {total / 2**20:,.1f} MiB", int(100 * done / total)
    return phase, None


class WorkDone:
    """One work-done progress, begun at most once and ended at most once."""

    def __init__(self, server: Any, title: str, *, cancellable: bool = False) -> None:
        self._server = server
        self.title = title
        self.cancellable = cancellable
        self.token: types.ProgressToken | None = None
        self.client_token = False  # True: the token came with the client's request
        self._pending: tuple[str, int | None] | None = None
        self._ended = False

    async def begin(self, message: str = "", client_token: types.ProgressToken | None = None) -> bool:
        """Start showing progress; False when the client can show none (nothing is sent)."""
        progress = self._server.work_done_progress
        if client_token is not None:
            self.token, self.client_token = client_token, True
        elif self._server.supports_progress():
            token = f"echoline-{os.getpid()}-{next(_ids)}"
            try:
                await asyncio.wait_for(progress.create_async(token), CREATE_TIMEOUT_S)
            except Exception as exc:  # the client refused or never answered: no bar
                log.debug("window/workDoneProgress/create failed: %s", exc)
                return False
            self.token = token
        else:
            return False
        if self._ended:  # ended while the token was being created
            progress.tokens.pop(self.token, None)
            return False
        progress.begin(self.token, types.WorkDoneProgressBegin(
            title=self.title, message=message or None, cancellable=self.cancellable))
        if self._pending is not None:
            self.report(*self._pending)
        return True

    def report(self, message: str, percentage: int | None = None) -> None:
        if self._ended:
            return
        if self.token is None:
            self._pending = (message, percentage)
            return
        self._server.work_done_progress.report(
            self.token, types.WorkDoneProgressReport(message=message, percentage=percentage))

    def end(self, message: str = "") -> None:
        if self._ended:
            return
        self._ended = True
        if self.token is not None:
            progress = self._server.work_done_progress
            progress.end(self.token, types.WorkDoneProgressEnd(message=message or None))
            progress.tokens.pop(self.token, None)  # pygls keeps every token otherwise

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the client presses the bar's cancel button."""
        fut = self._server.work_done_progress.tokens.get(self.token) if self.token is not None else None
        if fut is not None:
            fut.add_done_callback(lambda f: callback() if f.cancelled() else None)
