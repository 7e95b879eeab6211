"""Warm a document's inline session at the cursor while the user reads.

Why: the first inline request at a place in a file runs every prompt token its session
does not hold: on a freshly opened file the whole ~2,200-token prompt (~11 s on a 2-core
CPU), after a long jump down the text between the two cursors. The editor plugins send
``echoline/cursor`` (the document, its version, the cursor) when the cursor moves; here,
``inlineWarmMs`` after the last one, a background job builds the inline prompt a request
at that cursor would build (``sidecar.inline.warm_job``: the same head start, kept or
not) and prefills it into the document's inline session. When the user then types there,
the request runs only the typed text and the tail after it.

The position is read against the text of the version the editor named: a cursor sent
before the didChange it follows waits for that change (the timer is re-armed by it), and
one older than the text is dropped (the editor sends a newer one). The life cycle (debounce,
cancelled by any request within one chunk and resumed after it) is ``BackgroundPrefill``'s.
Replies never change: the engine reuses a session's cache only as far as it matches the
request's prompt token for token.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from echoline.sidecar.background_prefill import BackgroundPrefill, PrefillJob
from echoline.sidecar.config import Settings
from echoline.sidecar.inline import HeadStarts, accepted, ahead_job, warm_job
from echoline.sidecar.inline_store import InlineStore
from echoline.sidecar.lsp_utils import PositionError, check_position
from echoline.sidecar.worker import EngineWorker, Job
from lsprotocol import types

NOTIFY_INLINE_WARM = "echoline/inlineWarm"  # the job's start and end (server -> client)
CURSOR = "echoline/cursor"  # the editor's cursor (client -> server)


class InlineWarm(BackgroundPrefill):
    """The inline prompt at each document's latest cursor, ``inlineWarmMs`` after it rests."""

    key_name = "inline-warm"
    job_kind = "warm"
    on_setting, delay_setting = "inline_warm", "inline_warm_ms"

    def __init__(
        self,
        worker: EngineWorker,
        settings: Callable[[], Settings],
        doc_of: Callable[[str], tuple[str, int | None] | None],
        encoding: Callable[[], str],
        starts: HeadStarts,
        notify: Callable[[dict[str, Any]], None],
    ) -> None:
        super().__init__(worker, settings, notify)
        self._doc_of = doc_of  # uri -> (text, version) of the open document, or None
        self._encoding = encoding
        self._starts = starts
        self._cursor: dict[str, tuple[int | None, types.Position]] = {}
        self._asked: dict[str, tuple[int | None, types.Position]] = {}  # the last inline request
        self.long_head = LongHeadWarm(worker, settings, notify, self._asked, self._job_at)

    # ---- event loop ------------------------------------------------------------------------
    def cursor(self, uri: str, version: int | None, position: types.Position) -> None:
        """The editor's cursor in ``uri`` (at ``version``; None: the text as it is; a
        didChange reports one too, at the end of its edit). The latest cursor is the only
        one warmed: a pending or running warm-up in another document is dropped. The
        cursor an inline request was just made at (typing: the editor reports the cursor
        after each keystroke's request) is left alone: that request runs the same prompt."""
        if version is not None and self._asked.get(uri) == (version, position):
            self._drop_cursor(uri)
            return
        for other in [u for u in self._cursor if u != uri]:
            # The user's cursor is in one place: a warm-up elsewhere is superseded (two
            # documents' warm-ups would otherwise cancel each other and both re-arm).
            self._drop_cursor(other)
        self._cursor[uri] = (version, position)
        self.changed(uri)

    def asked(self, uri: str, version: int | None, position: types.Position) -> None:
        """An inline request at ``position`` of ``version``: a warm-up there would repeat it."""
        self._asked[uri] = (version, position)
        if self._cursor.get(uri) == (version, position):
            self._drop_cursor(uri)
        self.long_head.changed(uri)

    def _drop_cursor(self, uri: str) -> None:
        self._cursor.pop(uri, None)
        self.forget(uri)

    def edited(self, uri: str) -> None:
        """A didChange: a warm-up under way is for older text; a cursor sent ahead of this
        change (its version) gets its chance once the change is in."""
        if uri in self._cursor:
            self.changed(uri)
        else:
            self.forget(uri)

    def closed(self, uri: str) -> None:
        self._drop_cursor(uri)
        self._asked.pop(uri, None)
        self.long_head.forget(uri)

    def stop_all(self, final: bool = False) -> None:
        super().stop_all(final)
        self.long_head.stop_all(final)

    def make_job(self, uri: str) -> PrefillJob | None:
        cur = self._cursor.get(uri)
        return None if cur is None else self._job_at(uri, *cur)

    def _job_at(self, uri: str, version: int | None, position: types.Position,
                long_only: bool = False) -> PrefillJob | None:  # fmt: skip
        """The warm-up job at ``position`` of ``version`` of ``uri`` (None: nothing to warm)."""
        doc = self._doc_of(uri)
        if doc is None:
            return None
        text, doc_version = doc
        if version is not None and version != doc_version:
            return None  # sent against other text: a newer change or cursor re-arms
        try:
            offset = check_position(text, position, self._encoding(), "position")
        except PositionError:
            return None  # a cursor past the text: nothing to warm, nothing to answer
        s = self._settings()
        return warm_job(text[:offset], text[offset:], uri, s.inline_max_tokens, s.inline_suffix_tokens,
                        starts=self._starts, long_only=long_only)


class LongHeadWarm(BackgroundPrefill):
    """After an inline request asked with the short head (``sidecar.inline.choose_head``: the
    long one was not cached at that new place), the long head at that request's cursor,
    ``inlineWarmMs`` after the last request, so that a later keystroke there asks with it.

    Why apart from the cursor warm-up: while the user types, the cursor warm-up stands down
    (each request runs the prompt it would warm), but the long head still has to be run by
    someone, in the pauses between keystrokes. A job of the idle-prefill kind: it leaves the
    completion computed ahead (``InlineAhead``) running, and any request stops it within a
    chunk; the chunks done stay in their session, and it resumes after the request."""

    key_name = "inline-long"
    job_kind = "prefill"
    engine_job = "inline"
    on_setting, delay_setting = "inline_warm", "inline_warm_ms"

    def __init__(
        self, worker: EngineWorker, settings: Callable[[], Settings], notify: Callable[[dict[str, Any]], None],
        asked: dict[str, tuple[int | None, types.Position]],
        job_at: Callable[..., PrefillJob | None],
    ) -> None:  # fmt: skip
        def told(info: dict[str, Any]) -> None:  # nothing to say when the long head was there
            if info.get("state") != "skipped":
                notify(info)

        super().__init__(worker, settings, told)
        self._asked = asked  # the warm-up's record of each document's last request
        self._job_at = job_at

    def make_job(self, uri: str) -> PrefillJob | None:
        at = self._asked.get(uri)
        return None if at is None else self._job_at(uri, *at, long_only=True)


class InlineAhead:
    """While a suggestion is on screen, the completion that follows its acceptance,
    computed in the background (``sidecar.inline.ahead_job``) into the inline store, so the
    next Tab (or a request at the accepted text, e.g. after typing it all) is answered
    without a run.

    A job of the worker's idle-prefill kind (``"prefill"``): any request, and a cursor
    warm-up, cancels it within one background chunk or decode step; a cancelled one is not
    resumed (the request that stopped it shows a suggestion of its own, and schedules the
    completion after that one). One per document: a newer suggestion supersedes it."""

    key_name = "inline-ahead"

    def __init__(self, worker: EngineWorker, settings: Callable[[], Settings], starts: HeadStarts,
                 store: InlineStore) -> None:  # fmt: skip
        self._worker = worker
        self._settings = settings
        self._starts = starts
        self._store = store
        self._target: dict[str, tuple[str, str, Hashable, Job]] = {}
        self.runs = 0  # jobs submitted (tests and the bench read it)
        self.kept = 0  # completions computed ahead and kept

    @property
    def pending(self) -> bool:
        """Whether a completion ahead is queued or running."""
        return any(not t[3].future.done() for t in list(self._target.values()))

    def after(self, uri: str, prefix: str, suffix: str, rest: str, completion: str, tag: Hashable) -> None:
        """``completion`` is now shown between ``prefix`` and ``suffix`` (``rest``: the rest
        of the cursor's line): compute the completion after accepting it, unless it is kept
        already or being computed."""
        if not completion or not self._settings().inline_warm or self._worker.state_of("inline") != "ready":
            return
        new_prefix, new_suffix = accepted(prefix, suffix, rest, completion)
        old = self._target.get(uri)
        if old is not None and old[:3] == (new_prefix, new_suffix, tag) and not old[3].future.done():
            return  # being computed
        if self._store.has(uri, new_prefix, new_suffix, tag):
            return  # kept already (a cancelled job kept nothing: it runs again)
        s = self._settings()

        def keep(text: str) -> None:
            self._store.remember(uri, new_prefix, new_suffix, text, tag)
            self.kept += 1

        job = self._worker.submit(
            ahead_job(new_prefix, new_suffix, uri, s.inline_max_tokens, s.speculation, s.inline_suffix_tokens,
                      self._starts, keep),
            kind="prefill", key=(self.key_name, uri), engine_job="inline")
        self._target[uri] = (new_prefix, new_suffix, tag, job)
        self.runs += 1

    def closed(self, uri: str) -> None:
        self._target.pop(uri, None)
        self._worker.cancel_key((self.key_name, uri))
