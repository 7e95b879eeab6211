"""One sequence's keys and values per layer, in backend storage.

The cache's ``length`` is the number of positions whose K/V are valid;
truncation is just lowering it (rows past it are overwritten later), which is
what makes rejecting a speculative draft free.

Sliding-window layers (Gemma 3's local layers) keep only a ring of recent
positions once the context is long enough for that to save memory, so memory
grows with the global layers alone. The ring is stored twice over (slot j and
j + R) so that any run of up to R consecutive positions is one contiguous
slice: attention kernels then read a plain (rows, KVH, hd) view, and the
start of that view is aligned to ``RING_ALIGN`` absolute positions so a
kernel that reduces the cache in fixed-size splits sees the same split
boundaries whichever row count or ring offset a row is computed with.
"""

from __future__ import annotations

from typing import Any

from echoline.engine.backends.base import Backend
from echoline.engine.config import ModelConfig
from echoline.engine.errors import EcholineError

RING_ALIGN = 256


def ring_size(config: ModelConfig, max_rows: int) -> int:
    """Ring length R for local layers, or 0 when a ring would not save memory."""
    if not config.sliding_window or not config.local_layers:
        return 0
    r = config.sliding_window + max_rows + RING_ALIGN
    r = (r + RING_ALIGN - 1) // RING_ALIGN * RING_ALIGN
    return r if 2 * r < config.context_length else 0


class KVBuffers:
    """The per-layer K and V arrays of one cache, as one object.

    Why an object of its own: a CUDA graph is captured against these very buffers, so the
    backend keeps its graphs under this object (``run_graph(owner=...)``), not under the
    cache. Two caches of one shape can then trade buffers (``KVCache.exchange_buffers``),
    and the graphs go with the buffers: a session that takes over the buffers another
    session's requests captured graphs on replays them instead of capturing its own.
    """

    __slots__ = ("k", "v", "__weakref__")

    def __init__(self, k: list[Any], v: list[Any]) -> None:
        self.k = k
        self.v = v


class KVCache:
    """Per-layer K and V: linear buffers that grow by doubling, or fixed rings for local layers."""

    def __init__(
        self,
        backend: Backend,
        config: ModelConfig,
        capacity: int = 256,
        max_rows: int | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        self.capacity = max(16, capacity)
        # Graph-capturing backends bake slice offsets into their graphs: they keep linear caches.
        linear_only = backend.linear_cache_only
        self.ring = ring_size(config, max_rows) if max_rows and not linear_only else 0
        k: list[Any] = []
        v: list[Any] = []
        for layer in range(config.n_layers):
            rows = 2 * self.ring if self._is_ring(layer) else self.capacity
            k.append(backend.empty_key_cache(rows, config.n_kv_heads, config.head_dim))
            v.append(backend.empty_cache(rows, config.n_kv_heads, config.head_dim))
        self.buffers = KVBuffers(k, v)
        self.length = 0
        self.high = 0  # one past the highest position ever written (ring bookkeeping)

    @property
    def k(self) -> list[Any]:
        """Keys per layer (the current buffers' list)."""
        return self.buffers.k

    @property
    def v(self) -> list[Any]:
        """Values per layer (the current buffers' list)."""
        return self.buffers.v

    def can_exchange(self, other: KVCache) -> bool:
        """Whether ``exchange_buffers`` applies: linear caches of one shape on one backend."""
        return (
            other is not self and other.backend is self.backend and other.config is self.config
            and other.capacity == self.capacity and not self.ring and not other.ring
        )  # fmt: skip

    def exchange_buffers(self, other: KVCache) -> None:
        """Trade buffers with ``other``, each cache keeping its own contents.

        The contents are swapped first (``backend.swap_buffers``: the rows either cache
        holds, since rows past a cache's length are never read; on a GPU one launch per
        buffer), then the buffer objects, so afterwards ``self`` holds its rows in what were
        ``other``'s buffers and the other way round. Lengths and every other field stay
        with their cache. Why: see ``KVBuffers``.
        """
        if not self.can_exchange(other):
            raise ValueError("only linear caches of one capacity, model and backend trade buffers")
        rows = max(self.length, other.length)
        if rows:
            for mine, theirs in ((self.k, other.k), (self.v, other.v)):
                for layer in range(self.config.n_layers):
                    self.backend.swap_buffers(mine[layer], theirs[layer], rows)
        self.buffers, other.buffers = other.buffers, self.buffers

    def _is_ring(self, layer: int) -> bool:
        return self.ring > 0 and layer in self.config.local_layers

    # ---- sizes -----------------------------------------------------------------------------
    @staticmethod
    def layer_row_bytes(config: ModelConfig) -> int:
        return 2 * config.n_kv_heads * config.head_dim * 4

    @classmethod
    def bytes_for(cls, config: ModelConfig, capacity: int, ring: int) -> int:
        """Bytes reserved by a cache of this capacity and ring length."""
        n_ring = len(config.local_layers) if ring else 0
        linear_layers = config.n_layers - n_ring
        return cls.layer_row_bytes(config) * (capacity * linear_layers + 2 * ring * n_ring)

    @property
    def bytes_reserved(self) -> int:
        return self.bytes_for(self.config, self.capacity, self.ring)

    @property
    def bytes_used(self) -> int:
        return self.length * self.config.kv_bytes_per_token

    # ---- growth and truncation -------------------------------------------------------------
    def ensure(self, total: int) -> None:
        """Make room for ``total`` positions (amortized doubling of the linear layers)."""
        if total <= self.capacity:
            return
        if total > self.config.context_length:
            raise EcholineError(
                f"sequence of {total} tokens exceeds the model's context of {self.config.context_length}"
            )
        new_cap = self.capacity
        while new_cap < total:
            new_cap *= 2
        new_cap = min(new_cap, self.config.context_length)
        for layer in range(self.config.n_layers):
            if not self._is_ring(layer):
                self.k[layer] = self.backend.grow_cache(self.k[layer], new_cap)
                self.v[layer] = self.backend.grow_cache(self.v[layer], new_cap)
        self.capacity = new_cap

    def _view_start(self, start: int) -> int:
        """First position a forward starting at ``start`` reads in a local layer, aligned."""
        lo = max(0, start - self.config.sliding_window + 1)
        return lo // RING_ALIGN * RING_ALIGN

    def can_truncate_to(self, n: int) -> bool:
        """Whether positions before n are all still held (rings forget old positions)."""
        if n > self.length:
            return False
        if not self.ring or n == 0:
            return True
        return self._view_start(n) >= max(0, self.high - self.ring)

    def truncate(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {n}")
        if not self.can_truncate_to(n):
            raise ValueError(f"positions before {n} have left the sliding-window ring")
        self.length = n
        if n == 0:
            self.high = 0

    # ---- rows ------------------------------------------------------------------------------
    def write(self, layer: int, start: int, k_rows: Any, v_rows: Any) -> None:
        """Store K/V of positions start… (the ring layers twice, at j % R and j % R + R)."""
        write = self.backend.write_cache
        if not self._is_ring(layer):
            write(self.k[layer], start, k_rows)
            write(self.v[layer], start, v_rows)
            return
        r, n, done = self.ring, k_rows.shape[0], 0
        while done < n:
            slot = (start + done) % r
            take = min(n - done, r - slot)
            for copy in (slot, slot + r):
                write(self.k[layer], copy, k_rows[done : done + take])
                write(self.v[layer], copy, v_rows[done : done + take])
            done += take

    def view(self, layer: int, start: int, n: int) -> tuple[Any, Any, int]:
        """(K, V, offset): contiguous rows covering what positions start…start+n-1 attend to.

        Row 0 of the view is absolute position ``offset``.
        """
        if not self._is_ring(layer):
            return self.k[layer], self.v[layer], 0
        first = self._view_start(start)
        slot = first % self.ring
        rows = start + n - first
        return self.k[layer][slot : slot + rows], self.v[layer][slot : slot + rows], first

    def advance(self, start: int, n: int) -> None:
        """Mark positions start…start+n-1 valid after a forward wrote them."""
        self.length = start + n
        self.high = max(self.high, start + n) if self.ring else self.length
