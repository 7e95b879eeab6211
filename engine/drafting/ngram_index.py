"""N-gram draft index: propose the next tokens by finding where the context's tail occurred before.

Why this layout: a match is judged by reading *backwards* from an end position ``e``
(``tokens[e-1], tokens[e-2], …``). That backward key never changes when a stream grows,
so each source keeps its end positions in a few immutable sorted runs (a suffix array on
reversed keys, capped at ``max_n`` tokens) plus a small unsorted tail of recent ends.
Appending only touches the tail; full tails become sorted runs, and runs of similar size
are merged (binary-counter style), so appends cost amortized O(log n) numpy work and no
Python per-token state beyond a dict entry in the tail. Memory is about 8 bytes per token
(4 for the token, 4 for its end position in a run), instead of the ~100 bytes per token per
n-gram length that a Python dict of hashed n-grams would take.

A lookup binary-searches each run for the reversed context: the longest match in a sorted
run is at one of the two neighbours of the insertion point, and all entries sharing that
match length form one contiguous range, whose largest position is the most recent
occurrence. Match lengths are always computed by comparing tokens, never inferred from a
hash, so ``match_len`` is exact (capped at ``max_n``).
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

REPLY = "reply"
PROMPT = "prompt"
_PINNED = (REPLY, PROMPT)
_BIG = 2**31 - 1  # sorts after every token id: closes a prefix range in a binary search
_CHUNK = 128  # tail ends kept unsorted before they become a sorted run
_SMALL_RANGE = 48  # below this, take the range maximum in Python instead of numpy
_SOURCE_OVERHEAD = 512  # rough bytes of Python objects per source
_TAIL_ENTRY_BYTES = 40  # list slot + int object per tail end
_FIRST_ENTRY_BYTES = 160  # dict entry + key int + (lo, hi) tuple per distinct token in a run
# Presence filter of the extra (workspace) sources: hashes of every 1-, 2-, 3- and 4-gram in
# one bitmap of 2**_GRAM_BITS bits (16 KiB) per source.
_GRAM_BITS = 17
_GRAM_MAX = 4
_MASK64 = (1 << 64) - 1
_GRAM_MUL = 1000003
_GRAM_MIX = 0x9E3779B97F4A7C15


def _gram_hash(gram: Sequence[int]) -> int:
    """Bucket of one n-gram (tokens in text order); the scalar twin of ``_gram_hashes``."""
    h = len(gram)
    for t in gram:
        h = (h * _GRAM_MUL + int(t) + 1) & _MASK64
    return ((h * _GRAM_MIX) & _MASK64) >> (64 - _GRAM_BITS)


def _gram_hashes(toks: np.ndarray, n: int) -> np.ndarray:
    """Buckets of every n-gram of ``toks`` (int64), vectorized; uint64 wraps like _MASK64."""
    m = len(toks) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.full(m, n, dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(_GRAM_MUL) + (toks[j : j + m].astype(np.uint64) + np.uint64(1))
    return (h * np.uint64(_GRAM_MIX)) >> np.uint64(64 - _GRAM_BITS)


class _GramFilter:
    """Which short n-grams (up to 4 tokens) a source holds, as a bitmap with no false negatives.

    Why: a lookup asks every source for a match longer than the best so far, and with
    hundreds of workspace files that loop cost 0.24 ms per draft (300 files, measured) —
    a quarter of a GPU decode step. A source holding a match of length L >= n holds the
    context's last n tokens as an n-gram, so a clear bit proves it cannot help and is
    skipped in ~0.1 µs. Hash collisions only let a useless source through.
    """

    __slots__ = ("bits", "view")

    def __init__(self) -> None:
        self.bits = bytearray(1 << (_GRAM_BITS - 3))
        self.view = np.frombuffer(self.bits, dtype=np.uint8)

    def add(self, toks: array, start: int) -> None:
        """Record the n-grams that end at positions >= start (earlier ones are recorded)."""
        lo = max(0, start - (_GRAM_MAX - 1))
        window = np.frombuffer(toks, dtype=np.int32)[lo:].astype(np.int64)
        first = start - lo  # index in window of the first new token
        for n in range(1, _GRAM_MAX + 1):
            h = _gram_hashes(window, n)[max(0, first - n + 1) :]
            if len(h):
                np.bitwise_or.at(self.view, (h >> np.uint64(3)).astype(np.intp),
                                 (np.uint64(1) << (h & np.uint64(7))).astype(np.uint8))


@dataclass
class Draft:
    """A proposed continuation. ``tokens`` is empty when nothing matched.

    ``match_len``: how many trailing context tokens matched (capped at the index's max_n);
    ``position``: where in ``source`` the continuation starts (-1 when empty).
    """

    tokens: list[int] = field(default_factory=list)
    source: str = ""
    match_len: int = 0
    position: int = -1

    def __len__(self) -> int:
        return len(self.tokens)


def _key_width(max_n: int) -> int:
    """Sort keys are a power of two long (prefix doubling); at least max_n."""
    w = 1
    while w < max_n:
        w *= 2
    return w


def _sorted_ends(tokens: array, a: int, b: int, width: int) -> array:
    """End positions ``e`` in [a, b) sorted by their backward key of ``width`` tokens.

    The key of ``e`` is ``tokens[e-1], tokens[e-2], …`` stopping at the stream start; a
    shorter key (near the start) sorts before any longer key it prefixes, as in Python's
    sequence comparison. Ranks are built by prefix doubling over the window that the keys
    can reach, so the cost depends on ``b - a``, not on the stream length.
    """
    if b <= a:
        return array("i")
    lo = max(0, a - width)
    w = np.frombuffer(tokens[lo : b - 1], dtype=np.int32).astype(np.int64)
    rank = w
    k = 1
    m = len(rank)
    while k < width:
        prev = np.full(m, -1, dtype=np.int64)
        if k < m:
            prev[k:] = rank[:-k]
        pair = ((rank + 1) << 32) | (prev + 1)
        uniq, rank = np.unique(pair, return_inverse=True)
        rank = rank.reshape(-1).astype(np.int64)
        k *= 2
        if len(uniq) == m:  # all keys already distinct: longer keys keep the order
            break
    sel = rank[a - 1 - lo :]
    order = np.argsort(sel, kind="stable").astype(np.int32) + np.int32(a)
    out = array("i")
    out.frombytes(order.tobytes())
    return out


class _Run:
    """Immutable sorted end positions for the ends range [start, stop).

    ``first`` maps the last token of a key to its slice of ``pos``: a lookup whose last
    context token is absent skips the run at once, others binary-search a narrower range.
    """

    __slots__ = ("start", "stop", "pos", "np", "first")

    def __init__(self, start: int, stop: int, pos: array, toks: array) -> None:
        self.start = start
        self.stop = stop
        self.pos = pos
        self.np = np.frombuffer(pos, dtype=np.int32) if len(pos) else np.zeros(0, np.int32)
        self.first: dict[int, tuple[int, int]] = {}
        if len(pos):
            t = np.frombuffer(toks[start - 1 : stop - 1], dtype=np.int32)[self.np - start]
            cut = np.flatnonzero(t[1:] != t[:-1]) + 1
            lo = np.concatenate(([0], cut))
            hi = np.concatenate((cut, [len(t)]))
            self.first = dict(
                zip(t[lo].tolist(), zip(lo.tolist(), hi.tolist(), strict=True), strict=True)
            )

    @property
    def nbytes(self) -> int:
        return 4 * len(self.pos) + _FIRST_ENTRY_BYTES * len(self.first)


class _Source:
    """One token stream and its index. Valid ends are 1 … len(toks)-1 (a continuation exists)."""

    __slots__ = ("sid", "toks", "runs", "tail_start", "tail", "tail_len", "updated", "nbytes", "grams")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.toks = array("i")
        self.runs: list[_Run] = []
        self.tail_start = 1
        self.tail: dict[int, list[int]] = {}
        self.tail_len = 0
        self.updated = 0
        self.nbytes = 0
        # The pinned prompt and reply are searched first anyway; only extra sources filter.
        self.grams: _GramFilter | None = None if sid in _PINNED else _GramFilter()

    def recount(self) -> None:
        self.nbytes = (
            _SOURCE_OVERHEAD
            + 4 * len(self.toks)
            + sum(r.nbytes for r in self.runs)
            + _TAIL_ENTRY_BYTES * self.tail_len
            + (len(self.grams.bits) if self.grams is not None else 0)
        )

    def append(self, tokens: Sequence[int], width: int) -> None:
        """Append tokens; new ends go to the tail, a full tail becomes a sorted run."""
        toks = self.toks
        n0 = len(toks)
        toks.extend(tokens)
        n1 = len(toks)
        if self.grams is not None:
            self.grams.add(toks, n0)
        if n1 - self.tail_start >= _CHUNK:
            run = _Run(self.tail_start, n1, _sorted_ends(toks, self.tail_start, n1, width), toks)
            self.runs.append(run)
            self.tail = {}
            self.tail_len = 0
            self.tail_start = n1
            self._merge(width)
        else:
            tail = self.tail
            for e in range(max(n0, self.tail_start), n1):
                t = toks[e - 1]
                lst = tail.get(t)
                if lst is None:
                    tail[t] = [e]
                else:
                    lst.append(e)
            self.tail_len = n1 - self.tail_start
        self.recount()

    def _merge(self, width: int) -> None:
        runs = self.runs
        while len(runs) >= 2 and len(runs[-2].pos) <= 2 * len(runs[-1].pos):
            b = runs.pop()
            a = runs.pop()
            runs.append(
                _Run(a.start, b.stop, _sorted_ends(self.toks, a.start, b.stop, width), self.toks)
            )

    def best(self, q: array, min_len: int) -> tuple[int, int]:
        """Longest match (>= min_len) of the reversed context ``q``, latest end first.

        Returns (match_len, end) or (0, -1).
        """
        toks = self.toks
        qlen = len(q)
        best_len, best_end = 0, -1
        # Tail: newest ends, walked newest first; only strictly longer matches replace.
        cands = self.tail.get(q[0])
        if cands:
            for e in reversed(cands):
                n = _lcp(q, _key(toks, e, qlen))
                if n > best_len:
                    best_len, best_end = n, e
                    if n == qlen:
                        return best_len, best_end
        need = max(min_len, best_len + 1)
        if need > qlen:
            return (best_len, best_end) if best_len >= min_len else (0, -1)

        def key(e: int) -> array:
            return _key(toks, e, qlen)

        q0 = q[0]
        for run in reversed(self.runs):  # newer runs hold larger positions
            rng = run.first.get(q0)
            if rng is None:
                continue
            pos = run.pos
            r_lo, r_hi = rng
            i = bisect.bisect_left(pos, q, r_lo, r_hi, key=key)
            left = _lcp(q, key(pos[i - 1])) if i > r_lo else 0
            right = _lcp(q, key(pos[i])) if i < r_hi else 0
            length = max(left, right)
            if length < need:
                continue
            lo, hi = i, i
            pref = q[:length]
            if left == length:
                lo = r_lo if length == 1 else bisect.bisect_left(pos, pref, r_lo, i, key=key)
            if right == length:
                hi = (
                    r_hi
                    if length == 1
                    else bisect.bisect_left(pos, pref + array("i", [_BIG]), i, r_hi, key=key)
                )
            if hi - lo <= _SMALL_RANGE:
                end = max(pos[lo:hi])
            else:
                end = int(run.np[lo:hi].max())
            best_len, best_end = length, end
            if length == qlen:
                break
            need = length + 1
        return (best_len, best_end) if best_len >= min_len else (0, -1)


def _key(toks: array, e: int, n: int) -> array:
    """Backward key of end ``e``: up to n tokens, tokens[e-1] first."""
    stop = e - 1 - n
    return toks[e - 1 : stop : -1] if stop >= 0 else toks[e - 1 :: -1]


def _lcp(a: array, b: array) -> int:
    """Length of the common prefix of two token arrays."""
    m = min(len(a), len(b))
    if a[:m] == b[:m]:
        return m
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class NgramIndex:
    """Longest-suffix lookup over named token streams ("prompt", "reply", "file:/path", …).

    Preference: the longest match wins; among equal lengths, "reply" beats "prompt", which
    beats other sources by most recent update; within a source, the latest occurrence wins.
    Only occurrences followed by at least one token count, which also excludes the context
    matching itself at the end of the stream it is the tail of. "prompt" then "reply" are
    one text (the reply is written right after the prompt): a continuation that reaches the
    prompt's end goes on with the reply, and one that reaches the end of the text being
    written repeats its loop (``_repeat_if_current``).

    Memory is capped by ``max_bytes``: past it, the least recently updated sources other
    than "prompt" and "reply" are evicted. Thread-safe: a lock guards the source table, and
    ``set_source`` builds its index before taking the lock.
    """

    def __init__(self, max_n: int = 32, max_bytes: int = 64 << 20) -> None:
        if max_n < 1:
            raise ValueError("max_n must be >= 1")
        self.max_n = max_n
        self.max_bytes = max_bytes
        self._width = _key_width(max_n)
        self._sources: dict[str, _Source] = {}
        self._clock = 0
        self._order: list[_Source] | None = None
        self._lock = threading.Lock()
        self._total = 0  # running sum of the sources' nbytes
        self.evicted: list[str] = []  # ids evicted by the memory cap, oldest first
        self.on_evict: Callable[[str], None] | None = None

    # ----- sources -----
    def set_source(self, source_id: str, tokens: Sequence[int]) -> None:
        """Add or replace a source with the given tokens."""
        src = _Source(source_id)
        toks = array("i", tokens)
        src.toks = toks
        if src.grams is not None:
            src.grams.add(toks, 0)
        n = len(toks)
        if n >= 2:
            src.runs = [_Run(1, n, _sorted_ends(toks, 1, n, self._width), toks)]
        src.tail_start = max(1, n)
        src.recount()
        with self._lock:
            self._install(src)

    def extend_source(self, source_id: str, tokens: Sequence[int]) -> None:
        """Append tokens to a source (created when missing); amortized cheap per token."""
        if not len(tokens):
            return
        with self._lock:
            src = self._sources.get(source_id)
            if src is None:
                src = _Source(source_id)
                self._sources[source_id] = src
            before = src.nbytes
            src.append(
                tokens if isinstance(tokens, array) else [int(t) for t in tokens], self._width
            )
            self._total += src.nbytes - before
            self._touch(src)
            self._enforce_cap(src)

    def remove_source(self, source_id: str) -> bool:
        """Drop a source; returns whether it existed."""
        with self._lock:
            src = self._sources.pop(source_id, None)
            if src is None:
                return False
            self._total -= src.nbytes
            self._order = None
            return True

    def has_source(self, source_id: str) -> bool:
        return source_id in self._sources

    def sources(self) -> list[str]:
        """Source ids in preference order (reply, prompt, then most recently updated)."""
        with self._lock:
            return [s.sid for s in self._ordered()]

    def source_len(self, source_id: str) -> int:
        src = self._sources.get(source_id)
        return len(src.toks) if src is not None else 0

    def source_tokens(self, source_id: str) -> list[int]:
        """A copy of a source's tokens (empty when it is not indexed)."""
        src = self._sources.get(source_id)
        return src.toks.tolist() if src is not None else []

    def memory_bytes(self) -> int:
        """Estimated bytes held by all sources (tokens, sorted runs, tails, overhead)."""
        return self._total

    def clear(self) -> None:
        with self._lock:
            self._sources.clear()
            self._total = 0
            self._order = None

    # ----- lookup -----
    def draft(self, context: Sequence[int], max_len: int) -> Draft:
        """Continuation of the longest earlier occurrence of the context's tail."""
        if max_len <= 0 or not len(context):
            return Draft()
        tail = context[-self.max_n :]
        q = array("i", [int(t) for t in reversed(tail)])
        qlen = len(q)
        best_len, best_end, best_src = 0, -1, None
        probe = None  # filter bucket for a match longer than best_len (lazily)
        with self._lock:
            for src in self._ordered():
                grams = src.grams
                if grams is not None:
                    if probe is None:
                        probe = self._gram_probe(q, best_len + 1)
                    if not grams.bits[probe[0]] >> probe[1] & 1:
                        continue  # no match longer than best_len can be in this source
                n, e = src.best(q, best_len + 1)
                if n > best_len:
                    best_len, best_end, best_src = n, e, src
                    if n == qlen:
                        break
                    probe = None
            if best_src is None:
                return Draft()
            src_toks = best_src.toks
            toks = src_toks[best_end : best_end + max_len].tolist()
            if len(toks) < max_len and best_end + len(toks) == len(src_toks):
                if best_src.sid == PROMPT and REPLY in self._sources:
                    reply = self._sources[REPLY].toks
                    toks += reply[: max_len - len(toks)].tolist()
                    if len(toks) < max_len:
                        toks = _repeat_if_current(toks, _stream_end(src_toks, reply, qlen), q, max_len)
                elif best_src.sid == REPLY:
                    toks = _repeat_if_current(toks, src_toks[-qlen:], q, max_len)
            return Draft(toks, best_src.sid, best_len, best_end)

    # ----- internals -----
    @staticmethod
    def _gram_probe(q: array, need: int) -> tuple[int, int]:
        """(byte, bit) of the filter bucket a source must have set to hold a match of
        ``need`` tokens: the context's last min(need, 4) tokens as an n-gram."""
        n = min(need, _GRAM_MAX, len(q))
        h = _gram_hash(q[n - 1 :: -1])
        return h >> 3, h & 7

    def _install(self, src: _Source) -> None:
        old = self._sources.get(src.sid)
        if old is not None:
            self._total -= old.nbytes
        self._sources[src.sid] = src
        self._total += src.nbytes
        # The cached order holds source objects: a replaced one (even a pinned "prompt" or
        # "reply") must not be searched any more, so the order is rebuilt.
        self._order = None
        self._touch(src)
        self._enforce_cap(src)

    def _touch(self, src: _Source) -> None:
        self._clock += 1
        src.updated = self._clock
        if src.sid not in _PINNED:
            self._order = None

    def _ordered(self) -> list[_Source]:
        if self._order is None or len(self._order) != len(self._sources):
            pinned = [self._sources[s] for s in _PINNED if s in self._sources]
            extra = sorted(
                (s for s in self._sources.values() if s.sid not in _PINNED),
                key=lambda s: -s.updated,
            )
            self._order = pinned + extra
        return self._order

    def _enforce_cap(self, current: _Source) -> None:
        if self._total <= self.max_bytes:
            return
        victims = sorted(
            (s for s in self._sources.values() if s.sid not in _PINNED),
            key=lambda s: (s is current, s.updated),
        )
        for v in victims:
            if self._total <= self.max_bytes:
                break
            del self._sources[v.sid]
            self._total -= v.nbytes
            self.evicted.append(v.sid)
            self._order = None
            if self.on_evict is not None:
                self.on_evict(v.sid)


def _stream_end(prompt: Sequence[int], reply: Sequence[int], n: int) -> list[int]:
    """The last ``n`` tokens of the prompt followed by the reply (the text being written)."""
    return (list(prompt[-n:]) + list(reply[-n:]))[-n:]


def _repeat_if_current(toks: list[int], end_toks: Sequence[int], q: Sequence[int], max_len: int) -> list[int]:
    """A continuation that ran into the end of the text being written, repeated up to ``max_len``.

    Why: when the continuation's source ends where the writing is (``end_toks``, the source's
    last tokens, equal the context's tail, ``q`` reversed), a match P tokens back means the
    text is repeating with period P, and the best guess past its end is more of the same.
    Without this, a model caught in a loop (small models often are) drafted at most P tokens
    a round. The source is the reply, or the prompt followed by the reply: a prompt that
    repeats a block (a file of similar functions, a list of cases) matches near its own end,
    and its continuation is the reply written so far, then the loop again.
    """
    n = min(len(q), len(end_toks))
    if any(end_toks[-1 - i] != q[i] for i in range(n)):
        return toks
    period = len(toks)
    return [toks[j % period] for j in range(max_len)]


def brute_force_draft(
    sources: Sequence[tuple[str, Sequence[int]]], context: Sequence[int], max_n: int, max_len: int
) -> list[int]:
    """Reference for tests: the tokens ``NgramIndex.draft`` proposes, found by brute force."""
    n, sid, end = brute_force_match(sources, context, max_n)
    if n == 0:
        return []
    named = dict(sources)
    toks = list(named[sid])
    out = toks[end : end + max_len]
    if len(out) == max_len or end + len(out) < len(toks) or sid not in (PROMPT, REPLY):
        return out
    if sid == PROMPT:
        if REPLY not in named:
            return out
        toks = toks + list(named[REPLY])  # the reply is written right after the prompt
        out = toks[end : end + max_len]
        if len(out) == max_len:
            return out
    tail = list(context)[-max_n:]
    m = min(len(tail), len(toks))
    if toks[len(toks) - m :] == tail[len(tail) - m :]:
        out = [out[j % len(out)] for j in range(max_len)]
    return out


def brute_force_match(
    sources: Sequence[tuple[str, Sequence[int]]], context: Sequence[int], max_n: int
) -> tuple[int, str, int]:
    """Reference search for tests: (match_len, source, end) with the index's preferences.

    ``sources`` must be given in preference order.
    """
    ctx = list(context)[-max_n:]
    best = (0, "", -1)
    for sid, toks in sources:
        toks = list(toks)
        for e in range(len(toks) - 1, 0, -1):
            n = 0
            while n < len(ctx) and n < e and toks[e - 1 - n] == ctx[-1 - n]:
                n += 1
            if n > best[0]:
                best = (n, sid, e)
    return best
