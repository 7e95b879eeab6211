"""KV-cache storage in host memory, shared by the backends whose arrays are numpy."""

from __future__ import annotations

import numpy as np


class HostCacheMixin:
    """Cache buffers as numpy arrays of ``cache_dtype`` (float32 unless a backend says otherwise)."""

    cache_dtype: np.dtype = np.dtype(np.float32)

    def empty_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
        return np.zeros((capacity, n_kv_heads, head_dim), dtype=self.cache_dtype)

    def write_cache(self, cache: np.ndarray, start: int, rows) -> None:
        cache[start : start + rows.shape[0]] = rows

    def grow_cache(self, cache: np.ndarray, capacity: int) -> np.ndarray:
        new = np.zeros((capacity,) + cache.shape[1:], dtype=cache.dtype)
        new[: cache.shape[0]] = cache
        return new

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)
