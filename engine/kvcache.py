"""One sequence's keys and values per layer, in backend storage.

The cache's ``length`` is the number of positions whose K/V are valid;
truncation is just lowering it (rows past it are overwritten later), which is
what makes rejecting a speculative draft free.
"""

from __future__ import annotations

from typing import Any

from engine.backends.base import Backend
from engine.config import ModelConfig


class KVCache:
    """Per-layer (capacity, n_kv_heads, head_dim) K and V buffers that grow by doubling."""

    def __init__(self, backend: Backend, config: ModelConfig, capacity: int = 256) -> None:
        self.backend = backend
        self.config = config
        self.capacity = max(16, capacity)
        self.k: list[Any] = []
        self.v: list[Any] = []
        for _ in range(config.n_layers):
            self.k.append(backend.empty_cache(self.capacity, config.n_kv_heads, config.head_dim))
            self.v.append(backend.empty_cache(self.capacity, config.n_kv_heads, config.head_dim))
        self.length = 0

    def ensure(self, total: int) -> None:
        """Make room for ``total`` positions (amortized doubling)."""
        if total <= self.capacity:
            return
        if total > self.config.context_length:
            from engine.errors import EcholineError

            raise EcholineError(
                f"sequence of {total} tokens exceeds the model's context of "
                f"{self.config.context_length}"
            )
        new_cap = self.capacity
        while new_cap < total:
            new_cap *= 2
        new_cap = min(new_cap, self.config.context_length)
        self.k = [self.backend.grow_cache(c, new_cap) for c in self.k]
        self.v = [self.backend.grow_cache(c, new_cap) for c in self.v]
        self.capacity = new_cap

    def truncate(self, n: int) -> None:
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {n}")
        self.length = n

    @property
    def bytes_reserved(self) -> int:
        """Bytes held by the buffers (what counts against a memory budget)."""
        return self.capacity * self.config.kv_bytes_per_token

    @property
    def bytes_used(self) -> int:
        return self.length * self.config.kv_bytes_per_token
