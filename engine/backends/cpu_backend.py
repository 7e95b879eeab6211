"""The fast CPU backend: numba kernels over int8 re-laid-out weights.

Every op keeps a row's result independent of how many rows share the call
(``batch_invariant = True``), so speculative verification over many rows and
plain one-row decoding produce the same bits. Arrays are numpy float32.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from echoline.engine.backends.base import Array, Backend
from echoline.engine.backends.cpu_activations import cpu_activations_mode
from echoline.engine.backends.host_cache import HostCacheMixin
from echoline.engine.errors import EcholineError
from echoline.engine.gguf_file import QuantTensor
from echoline.kernels.cpu import attention, numba_setup, rowops
from echoline.kernels.cpu.embed import embed_rows
from echoline.kernels.cpu.matmul import PreparedMatrix, matmul, prepare_cached
from echoline.kernels.cpu.relayout import KINDS

if TYPE_CHECKING:  # q8act loads only when the q8 mode is used
    from echoline.kernels.cpu.q8act import Q8Matrix


@lru_cache(maxsize=16)
def _rope_tables_for(positions: bytes, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """RoPE tables keyed by the positions' bytes (read-only: callers only read them)."""
    return rowops.rope_tables(np.frombuffer(positions, dtype=np.int64), head_dim, base)


def _f32(x: Array) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


class CpuBackend(HostCacheMixin, Backend):
    """numba kernels; weights as int8 + per-block float32 scale/offset."""

    name = "cpu"
    batch_invariant = True

    def kernels_cached(self) -> bool:
        """numba has compiled kernels in this machine's cache folder (``kernels/cpu/numba_setup``)."""
        return numba_setup.has_compiled_kernels()

    def __init__(self, activations: str | None = None) -> None:
        """``activations``: one of ``engine.backends.CPU_ACTIVATIONS`` (what each does is
        there); None reads ``ECHOLINE_CPU_ACTIVATIONS`` (default auto: q8 with AVX2 or better,
        else f32). An explicit q8 on a CPU with neither AVX2 nor AVX-512 VNNI is an error, not a quiet fallback: the two modes give different replies."""
        try:
            numba_setup.check_runnable()
        except RuntimeError as exc:
            raise EcholineError(str(exc)) from None
        mode = cpu_activations_mode(activations)
        if mode == "q8":
            from echoline.kernels.cpu.q8act import q8_available

            if not q8_available():
                raise EcholineError("CPU activations 'q8' need AVX2 or AVX-512 VNNI, which this CPU lacks; use 'f32'")
        self.activations = mode

    @property
    def variant(self) -> str:
        return self.name if self.activations == "f32" else f"{self.name}/{self.activations}"

    def prepare_matrix(self, tensors: list[QuantTensor]) -> PreparedMatrix | Q8Matrix:
        # Re-laid-out weights are cached on disk keyed by the file's identity (weight_cache).
        tensors = list(tensors)
        if self.activations == "q8" and all(t.qtype in KINDS and KINDS[t.qtype].wdtype == "int8" for t in tensors):
            from echoline.kernels.cpu.q8act import prepare_q8_cached

            return prepare_q8_cached(tensors)
        # f32 mode, or a matrix with float parts: float32 products whatever the row count
        # (rows stay independent of n either way).
        return prepare_cached(tensors)

    def prepare_vector(self, values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)

    def prepare_embedding(self, table: QuantTensor) -> QuantTensor:
        return table  # rows are dequantized on demand from the memory map

    def empty_key_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
        # Positions innermost, as the attention tiles read them (attention.empty_keys says why).
        return attention.empty_keys(capacity, n_kv_heads, head_dim)

    def grow_cache(self, cache: np.ndarray, capacity: int) -> np.ndarray:
        if attention.key_store(cache) is None:
            return super().grow_cache(cache, capacity)
        new = attention.empty_keys(capacity, cache.shape[1], cache.shape[2])
        new[: cache.shape[0]] = cache
        return new

    def embed(self, table: QuantTensor, ids: np.ndarray) -> np.ndarray:
        return embed_rows(table.qtype, table.data, table.cols, ids)

    def matmul(self, x: Array, w: PreparedMatrix | Q8Matrix) -> np.ndarray:
        if isinstance(w, PreparedMatrix):
            return matmul(_f32(x), w)
        from echoline.kernels.cpu.q8act import matmul_q8

        return matmul_q8(_f32(x), w)

    def rms_norm(self, x: Array, weight: np.ndarray, eps: float) -> np.ndarray:
        x = _f32(x)
        flat = x.reshape(-1, x.shape[-1])
        return rowops.rms_norm(flat, _f32(weight), float(eps)).reshape(x.shape)

    def rope(self, x: Array, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
        x = _f32(x)
        cos, sin = self._rope_tables(positions, x.shape[-1], base)
        return rowops.rope_apply(x, cos, sin, bool(neox))

    @staticmethod
    def _rope_tables(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
        """Every layer of a forward rotates q and k at the same positions, and building the
        tables (float64 cos/sin) cost ~7 µs per call — 0.4 ms of a 10 ms SmolLM2 step."""
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        return _rope_tables_for(pos.tobytes(), head_dim, float(base))

    def attention(self, q, k_cache, v_cache, positions, window, scale) -> np.ndarray:
        pos = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        return attention.attention(_f32(q), k_cache, v_cache, pos, int(window), float(scale))

    def silu_mul(self, gate, up) -> np.ndarray:
        gate, up = _f32(gate), _f32(up)
        return rowops.silu_mul(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])).reshape(
            gate.shape
        )

    def gelu_tanh_mul(self, gate, up) -> np.ndarray:
        gate, up = _f32(gate), _f32(up)
        out = rowops.gelu_tanh_mul(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]))
        return out.reshape(gate.shape)

    def add(self, a, b) -> np.ndarray:
        return np.add(a, b, dtype=np.float32)

    def scale(self, x, factor: float) -> np.ndarray:
        return np.asarray(x, dtype=np.float32) * np.float32(factor)

