"""The readable reference backend: dequantized float32 weights and plain numpy.

Slow on purpose-free grounds of clarity, not speed. It stays batch-invariant
by computing each row's matrix product as its own matrix-vector call (a BLAS
GEMM over several rows may block the reduction differently than a GEMV over
one, ~5e-7 relative: enough to flip a near-tie argmax), and by looping rows in
attention. Tests compare the fast backends with this one.
"""

from __future__ import annotations

import numpy as np
from echoline.engine.backends.base import Array, Backend
from echoline.engine.backends.host_cache import HostCacheMixin
from echoline.engine.gguf_file import QuantTensor


def silu(x: np.ndarray) -> np.ndarray:
    """x·sigmoid(x); exp overflows to inf for very negative x, which correctly gives -0."""
    one = x.dtype.type(1.0)
    with np.errstate(over="ignore"):
        return x / (one + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    inner = t(np.sqrt(2.0 / np.pi)) * (x + t(0.044715) * x * x * x)
    return t(0.5) * x * (t(1.0) + np.tanh(inner))


def rope_tables(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (n, head_dim/2) computed in float64 then rounded, like ggml's."""
    half = head_dim // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class NumpyBackend(HostCacheMixin, Backend):
    """float32 numpy, one GEMV per row; ``dtype=np.float64`` gives the high-precision reference."""

    name = "numpy"
    batch_invariant = True

    def __init__(self, dtype: type = np.float32) -> None:
        self.dtype = np.dtype(dtype)
        self.cache_dtype = self.dtype

    def prepare_matrix(self, tensors: list[QuantTensor]) -> np.ndarray:
        mats = [t.dequantize().reshape(t.rows, t.cols).astype(self.dtype) for t in tensors]
        return np.ascontiguousarray(np.concatenate(mats, axis=0) if len(mats) > 1 else mats[0])

    def prepare_vector(self, values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=self.dtype).reshape(-1)

    def prepare_embedding(self, table: QuantTensor) -> QuantTensor:
        return table

    def embed(self, table: QuantTensor, ids: np.ndarray) -> np.ndarray:
        return table.dequantize_rows(np.asarray(ids, dtype=np.int64)).astype(self.dtype)

    def matmul(self, x: Array, w: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=self.dtype)
        out = np.empty((x.shape[0], w.shape[0]), dtype=self.dtype)
        for i in range(x.shape[0]):
            out[i] = w @ x[i]
        return out

    def rms_norm(self, x: Array, weight: np.ndarray, eps: float) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        flat = x.reshape(-1, x.shape[-1])
        out = np.empty_like(flat)
        for i in range(flat.shape[0]):
            row = flat[i]
            ms = self.dtype.type(np.dot(row, row) / self.dtype.type(row.shape[0]))
            out[i] = row * self.dtype.type(1.0 / np.sqrt(ms + self.dtype.type(eps)))
        return (out * weight).reshape(x.shape)

    def rope(self, x: Array, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
        x = np.asarray(x, dtype=self.dtype)
        hd = x.shape[-1]
        cos, sin = rope_tables(positions, hd, base)
        cos, sin = cos.astype(self.dtype), sin.astype(self.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(x)
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
            out[..., : hd // 2] = a * cos - b * sin
            out[..., hd // 2 :] = a * sin + b * cos
        else:
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
        return out

    def attention(self, q, k_cache, v_cache, positions, window, scale) -> np.ndarray:
        n, n_heads, hd = q.shape
        n_kv = k_cache.shape[1]
        group = n_heads // n_kv
        out = np.empty((n, n_heads, hd), dtype=self.dtype)
        for i in range(n):
            p = int(positions[i])
            lo = max(0, p - window + 1) if window > 0 else 0
            for h in range(n_heads):
                kv = h // group
                keys = k_cache[lo : p + 1, kv, :]
                scores = (keys @ q[i, h]) * self.dtype.type(scale)
                scores = np.exp(scores - scores.max())
                probs = scores / scores.sum()
                out[i, h] = probs @ v_cache[lo : p + 1, kv, :]
        return out.reshape(n, n_heads * hd)

    def silu_mul(self, gate, up) -> np.ndarray:
        return silu(gate) * up

    def gelu_tanh_mul(self, gate, up) -> np.ndarray:
        return gelu_tanh(gate) * up

    def add(self, a, b) -> np.ndarray:
        return np.add(a, b, dtype=self.dtype)

    def scale(self, x, factor: float) -> np.ndarray:
        return np.asarray(x, dtype=self.dtype) * self.dtype.type(factor)
