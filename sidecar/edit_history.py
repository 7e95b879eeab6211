"""The user's recent edits, as a next-edit prompt shows them: pure data, no model.

Why its own module: an edit prediction is conditioned on what the user just did (renamed
one variable, so rename the next). ``didChange`` arrives keystroke by keystroke; a prompt
wants a handful of whole changes. Here each document's text before a change is kept, and
changes are coalesced into *events*: edits to one file within ``merge_lines`` lines of the
event so far and within ``pause_s`` of its last edit are one event; anything else closes
it and starts the next (Zed's rule: 8 lines, 1 s). The last ``max_events`` events are kept
as unified diffs with their path, bounded in bytes; an event too large for a prompt (a
paste, a reformat) is dropped. An edit the user accepted from a prediction arrives as a
didChange like any other, so it is an event too.

Secrets never enter: ``is_secret(uri)`` (the workspace index's rule for buffers) is asked
when a document is opened or changed; a secret document's text is not even kept.
"""

from __future__ import annotations

import difflib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_EVENTS = 6
MAX_EVENT_BYTES = 2_000  # one event's diff; a larger one (a paste) is dropped
MAX_BYTES = 6_000  # all kept events together; the oldest go first
PAUSE_S = 1.0
MERGE_LINES = 8
CONTEXT_LINES = 2

_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix of ``a`` and ``b`` (slice compares: C speed on big files)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]; the answer is in [lo, hi]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix_len(a: str, b: str, limit: int) -> int:
    """Length of the common suffix of ``a`` and ``b``, at most ``limit``."""
    lo, hi = 0, min(len(a), len(b), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def changed_span(old: str, new: str) -> tuple[int, int, int, int] | None:
    """The changed characters of ``old`` -> ``new`` as (start, old_end, new_end, common
    suffix length); None when equal."""
    if old == new:
        return None
    p = common_prefix_len(old, new)
    s = common_suffix_len(old, new, min(len(old), len(new)) - p)
    return p, len(old) - s, len(new) - s, s


@dataclass(frozen=True)
class EditEvent:
    """One coalesced change to one file."""

    uri: str
    path: str  # as the prompt names the file
    diff: str  # unified diff of the event (headers ``--- a/path``, ``+++ b/path``)
    before: str  # the changed lines with ``CONTEXT_LINES`` around them, before the event
    after: str  # the same lines after it
    removed: str  # the minimal changed characters: what the event took out...
    added: str  # ...and what it put in

    @property
    def size(self) -> int:
        return len(self.diff.encode("utf-8"))


@dataclass
class _Pending:
    uri: str
    base: str  # the document before the event's first edit
    text: str  # the document now
    first_line: int  # the event's changed lines in ``text`` (inclusive)
    last_line: int
    at: float  # the time of its last edit


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset)


def render_event(uri: str, path: str, old: str, new: str, context: int = CONTEXT_LINES) -> EditEvent | None:
    """The event ``old`` -> ``new`` of one document (None when they are equal)."""
    span = changed_span(old, new)
    if span is None:
        return None
    start, old_end, new_end, _ = span
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    first = _line_of(old, start)
    last_old = _line_of(old, max(start, old_end - 1)) if old_end > start else first
    last_new = _line_of(new, max(start, new_end - 1)) if new_end > start else first
    lo = max(0, first - context)
    a = old_lines[lo : last_old + 1 + context]
    b = new_lines[lo : last_new + 1 + context]
    out = [f"--- a/{path}", f"+++ b/{path}"]
    for line in difflib.unified_diff(a, b, n=context, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        m = _HUNK.match(line)
        if m:  # difflib counts from the window's start: count from the file's
            line = (f"@@ -{int(m.group(1)) + lo}{m.group(2) or ''} "
                    f"+{int(m.group(3)) + lo}{m.group(4) or ''} @@")
        out.append(line.rstrip("\r\n"))
    return EditEvent(uri=uri, path=path, diff="\n".join(out) + "\n", before="".join(a), after="".join(b),
                     removed=old[start:old_end], added=new[start:new_end])


class EditHistory:
    """One workspace's recent edit events. Thread-safe; the clock is injectable for tests."""

    def __init__(
        self,
        is_secret: Callable[[str], bool] = lambda _uri: False,
        path_of: Callable[[str], str] = lambda uri: uri.rsplit("/", 1)[-1],
        *,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
        max_event_bytes: int = MAX_EVENT_BYTES,
        pause_s: float = PAUSE_S,
        merge_lines: int = MERGE_LINES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.is_secret = is_secret
        self._path_of = path_of
        self.max_events, self.max_bytes, self.max_event_bytes = max_events, max_bytes, max_event_bytes
        self.pause_s, self.merge_lines = pause_s, merge_lines
        self._clock = clock
        self._lock = threading.Lock()
        self._texts: dict[str, str] = {}
        self._changed_at: dict[str, float] = {}
        self._pending: _Pending | None = None
        self._events: list[EditEvent] = []  # closed events, oldest first

    # ---- document life cycle ---------------------------------------------------------
    def opened(self, uri: str, text: str) -> None:
        with self._lock:
            if self.is_secret(uri):
                self._texts.pop(uri, None)
                return
            self._texts[uri] = text

    def closed(self, uri: str) -> None:
        with self._lock:
            self._texts.pop(uri, None)
            self._changed_at.pop(uri, None)
            if self._pending is not None and self._pending.uri == uri:
                self._close_pending()

    def changed(self, uri: str, text: str) -> None:
        """The document's whole text after a didChange (the text before is kept here)."""
        now = self._clock()
        with self._lock:
            if self.is_secret(uri):
                self._texts.pop(uri, None)
                if self._pending is not None and self._pending.uri == uri:
                    self._pending = None
                return
            old = self._texts.get(uri)
            self._texts[uri] = text
            self._changed_at[uri] = now
            if old is None:
                return  # not seen opened: no "before" to diff against
            span = changed_span(old, text)
            if span is None:
                return
            start, old_end, new_end, _ = span
            first = _line_of(old, start)  # in old == the pending event's current text
            last_old = _line_of(old, max(start, old_end - 1)) if old_end > start else first
            delta = text.count("\n", start, new_end) - old.count("\n", start, old_end)
            p = self._pending
            if (p is not None and p.uri == uri and now - p.at <= self.pause_s
                    and first <= p.last_line + self.merge_lines and last_old >= p.first_line - self.merge_lines):
                new_first = min(p.first_line, first)
                old_last = max(p.last_line, last_old)
                p.first_line, p.last_line = new_first, max(new_first, old_last + delta)
                p.text, p.at = text, now
                return
            self._close_pending()
            last_new = _line_of(text, max(start, new_end - 1)) if new_end > start else first
            self._pending = _Pending(uri, old, text, first, last_new, now)

    # ---- reading -----------------------------------------------------------------------
    def _close_pending(self) -> None:
        p, self._pending = self._pending, None
        if p is None:
            return
        ev = render_event(p.uri, self._path_of(p.uri), p.base, p.text)
        if ev is None or ev.size > self.max_event_bytes:
            return
        self._events.append(ev)
        self._trim(self._events)

    def _trim(self, events: list[EditEvent]) -> None:
        while len(events) > self.max_events or (events and sum(e.size for e in events) > self.max_bytes):
            events.pop(0)

    def events(self) -> list[EditEvent]:
        """The kept events, oldest first, the one under way last (rendered as it is now)."""
        with self._lock:
            if self._pending is not None and self._clock() - self._pending.at > self.pause_s:
                self._close_pending()
            out = list(self._events)
            p = self._pending
            if p is not None:
                ev = render_event(p.uri, self._path_of(p.uri), p.base, p.text)
                if ev is not None and ev.size <= self.max_event_bytes:
                    out.append(ev)
            self._trim(out)
            return out

    def since_change(self, uri: str) -> float:
        """Seconds since ``uri``'s last change (infinity: none seen): a request's debounce."""
        with self._lock:
            at = self._changed_at.get(uri)
        return float("inf") if at is None else self._clock() - at

    def text_of(self, uri: str) -> str | None:
        """The latest text seen of ``uri`` (None: not tracked, e.g. a secret)."""
        with self._lock:
            return self._texts.get(uri)
