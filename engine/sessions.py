"""Per-buffer sessions: token history plus KV cache, reused across requests.

A new prompt reuses the longest common token prefix with the session's
history: the cache is truncated there and only the rest is prefilled. When
another session shares a longer prefix (the same file asked about from two
buffers, a common system prompt), its rows are copied instead of recomputed.
That is a radix tree's reuse found by a linear scan: at editor scale (tens
of sessions) the scan costs microseconds, and copying rows between whole
caches keeps each session's cache contiguous for the attention kernels.

Memory: every cache is reserved up front for prompt + max reply, and the
store evicts least-recently-used sessions so the reserved total never
exceeds the budget.

Graph-capturing backends (CUDA) capture one graph per row count on each cache's buffers:
about an eager forward and a capture each, tens of milliseconds for the (up to seven) widths a
speculative reply uses, which a new buffer's first request (and every new chat) paid again.
So the store keeps one set of buffers per capacity "hot": the session about to run trades
buffers with whichever cache holds them (``KVCache.exchange_buffers``: both keep their
contents, a device copy of a few tens of microseconds), and replays the graphs already
captured on them.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

from echoline.engine.errors import EcholineError
from echoline.engine.kvcache import KVCache, ring_size
from echoline.engine.models.base import Transformer

_CAPACITY_STEP = 256


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Session:
    """One buffer's cache; ``history`` always equals the tokens the cache holds."""

    key: str
    cache: KVCache
    history: list[int] = field(default_factory=list)
    last_used: float = 0.0

    def sync(self) -> None:
        """Trim history to the cache after a request (cancellation may stop early)."""
        del self.history[self.cache.length :]


class SessionStore:
    """Sessions by key, under a byte budget, least recently used evicted first."""

    def __init__(self, model: Transformer, budget_bytes: int | None = None, max_rows: int = 512) -> None:
        self.model = model
        self.max_rows = max_rows  # the most rows one forward carries (prefill chunk, verify)
        self.ring = 0 if model.backend.linear_cache_only else ring_size(model.config, max_rows)
        default = min(2 << 30, KVCache.bytes_for(model.config, 65536, self.ring))
        self.budget_bytes = int(budget_bytes if budget_bytes is not None else default)
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.evictions = 0
        # Throwaway requests (key None) share one cache object, emptied per request: they
        # stay cold, but a backend that keys per-cache state on it (CUDA graphs: one
        # capture per row count) keeps that state instead of rebuilding it per request.
        self._scratch: Session | None = None
        # Per capacity, the cache that holds the buffers graphs were captured on (see the
        # module docstring); only where the backend captures graphs.
        self.share_buffers = bool(getattr(model.backend, "graph_max_rows", 0))
        self._hot: dict[int, weakref.ref[KVCache]] = {}
        self.exchanges = 0

    @property
    def bytes_in_use(self) -> int:
        scratch = self._scratch.cache.bytes_reserved if self._scratch is not None else 0
        return scratch + sum(s.cache.bytes_reserved for s in self.sessions.values())

    def _capacity_for(self, tokens: int) -> int:
        """Rows to reserve for ``tokens``: a multiple of 256, and where sessions share graph
        buffers a power of two times 256, so that caches fall into few capacities (growth
        doubles, so a cache stays in that series) and more sessions share one set."""
        cap = (tokens + _CAPACITY_STEP - 1) // _CAPACITY_STEP * _CAPACITY_STEP
        if self.share_buffers:
            cap = _CAPACITY_STEP << max(0, (cap // _CAPACITY_STEP - 1).bit_length())
        return min(max(cap, _CAPACITY_STEP), self.model.config.context_length)

    def _make_room(self, needed: int, keep: str | None) -> None:
        if self._scratch is not None and keep is not None and self.bytes_in_use + needed > self.budget_bytes:
            self._scratch = None  # the throwaway cache goes before any buffer's session
        for key in list(self.sessions):
            if self.bytes_in_use + needed <= self.budget_bytes:
                return
            if key != keep:
                del self.sessions[key]
                self.evictions += 1
        if self.bytes_in_use + needed > self.budget_bytes:
            raise EcholineError(
                f"KV memory budget of {self.budget_bytes / 2**20:.1f} MiB is too small for a "
                f"request needing {needed / 2**20:.1f} MiB more; raise the budget"
            )

    def prepare(self, key: str | None, prompt: list[int], reserve_tokens: int) -> Session:
        """The session for ``key`` with its cache truncated to what ``prompt`` can reuse.

        ``reserve_tokens`` is prompt + the most the reply and a verify round may add.
        A ``key`` of None gives a throwaway session (not stored, still budgeted).
        """
        if len(prompt) + 1 > self.model.config.context_length:
            raise EcholineError(
                f"prompt of {len(prompt)} tokens does not fit the model's context of "
                f"{self.model.config.context_length}"
            )
        config = self.model.config
        capacity = self._capacity_for(reserve_tokens)
        session = self.sessions.get(key) if key is not None else self._reuse_scratch(capacity)
        if session is None:
            if key is None:
                self._scratch = None
            self._make_room(KVCache.bytes_for(config, capacity, self.ring), keep="" if key is not None else None)
            session = Session(key or "", self.model.new_cache(capacity, self.max_rows))
            if key is not None:
                self.sessions[key] = session
            else:
                self._scratch = session
        elif key is not None:  # a reused scratch already fits (see _reuse_scratch)
            self.sessions.move_to_end(key)
            if session.cache.capacity < capacity:
                grow_to = session.cache.capacity
                while grow_to < capacity:
                    grow_to *= 2
                grow_to = min(grow_to, config.context_length)
                extra = KVCache.bytes_for(config, grow_to, self.ring) - session.cache.bytes_reserved
                self._make_room(extra, keep=key)
                session.cache.ensure(capacity)
        session.last_used = time.monotonic()
        # Keep at least one prompt token to run: its logits give the first reply token.
        limit = len(prompt) - 1
        own = min(common_prefix(session.history, prompt), limit)
        if not session.cache.can_truncate_to(min(own, session.cache.length)):
            own = 0  # the window ring no longer holds what that prefix needs
        donor, shared = None, own
        for other in self.sessions.values():
            if other is session or self.ring:  # ring caches hold only recent rows: no copying
                continue
            n = min(common_prefix(other.history, prompt), limit)
            if n > shared:
                donor, shared = other, n
        if donor is not None:
            self._copy_rows(donor.cache, session.cache, own, shared)
            session.history = prompt[:shared]
        else:
            session.cache.truncate(min(own, session.cache.length))
            del session.history[own:]
        session.cache.length = shared if donor is not None else own
        self._take_hot_buffers(session.cache)
        return session

    def reusable(self, key: str | None, prompt: list[int]) -> int:
        """How many of ``prompt``'s tokens a request in ``key``'s session would not run
        again: ``prepare``'s rule (its own cache's common prefix, or a longer one lent by
        another session) without touching any cache. What a caller choosing between
        prompts by their cost reads (the sidecar's inline head)."""
        limit = max(0, len(prompt) - 1)
        session = self.sessions.get(key) if key is not None else None
        best = 0
        if session is not None:
            own = min(common_prefix(session.history, prompt), limit)
            best = own if session.cache.can_truncate_to(min(own, session.cache.length)) else 0
        if not self.ring:
            for other in self.sessions.values():
                if other is not session:
                    best = max(best, min(common_prefix(other.history, prompt), limit))
        return best

    def _take_hot_buffers(self, cache: KVCache) -> None:
        """Give ``cache`` the hot buffers of its capacity (it becomes their holder)."""
        if not self.share_buffers or cache.ring:
            return
        ref = self._hot.get(cache.capacity)
        holder = ref() if ref is not None else None
        if holder is not None and holder is not cache and cache.can_exchange(holder):
            cache.exchange_buffers(holder)
            self.exchanges += 1
        self._hot[cache.capacity] = weakref.ref(cache)

    def _reuse_scratch(self, capacity: int) -> Session | None:
        """The throwaway session emptied, when its cache fits ``capacity`` (not over 2× it)."""
        scratch = self._scratch
        if scratch is None or not capacity <= scratch.cache.capacity <= 2 * capacity:
            return None
        if not scratch.cache.can_truncate_to(0):
            return None
        scratch.cache.truncate(0)
        scratch.history.clear()
        return scratch

    def _copy_rows(self, src: KVCache, dst: KVCache, start: int, end: int) -> None:
        """dst[start:end] = src[start:end] for every layer (rows before start already match)."""
        dst.truncate(min(start, dst.length))
        dst.ensure(end)
        backend = self.model.backend
        for layer in range(len(src.k)):
            backend.write_cache(dst.k[layer], start, src.k[layer][start:end])
            backend.write_cache(dst.v[layer], start, src.v[layer][start:end])

    def finish(self, session: Session, prompt: list[int], reply: list[int]) -> None:
        """Record what the cache now holds after a request."""
        session.history = (list(prompt) + list(reply))[: session.cache.length]
        session.sync()

    def drop(self, key: str) -> None:
        self.sessions.pop(key, None)
