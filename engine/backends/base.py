"""The interface model code computes through.

Models (``engine/models/``) never touch numpy, numba, CuPy or MLX directly:
they call these ops, so a backend can keep weights in its own layout (int8
tiles for numba, GGUF blocks in GPU memory for CUDA, affine groups for MLX)
and its own array type. Arrays passed between ops are backend-native ("Array");
only ``to_host`` and ``argmax`` return numpy.

The exactness contract every backend must keep (checked by ``echoline doctor``):
a row's result never depends on how many rows share a call, nor on how a
prompt was chunked. A backend that cannot promise it sets
``batch_invariant = False`` and the engine then routes decode through the
multi-row path so speculative and plain decoding still compute alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from echoline.engine.gguf_file import QuantTensor

Array = Any  # backend-native array (numpy.ndarray, cupy.ndarray, mlx.core.array)
Weight = Any  # backend-native prepared weight matrix


class Backend(ABC):
    """Ops a transformer forward pass needs, in a backend's own arrays."""

    name: str = "abstract"
    #: True when every op's per-row result is independent of the row count.
    batch_invariant: bool = True
    #: Rows every forward is padded to when the backend is not batch-invariant (0: none);
    #: read it through ``padded_rows``.
    fixed_rows: int = 0
    #: Caches must be plain linear buffers, no sliding-window rings (a backend that replays
    #: captured graphs bakes slice offsets into them).
    linear_cache_only: bool = False
    #: ``Transformer.forward`` replays a captured graph (``run_graph``) for up to this many
    #: rows; 0: never.
    graph_max_rows: int = 0
    #: The widest verify (pending token + drafts) worth offering the draft controller: the
    #: engine's default ``max_draft`` is one less, and calibration measures up to it. Why
    #: per backend: on a CPU a row costs nearly its share of the weights' bandwidth, so the
    #: controller never picks long drafts there, while on a GPU 64 rows cost a few one-row
    #: forwards and a draft copied from a file or an earlier reply often runs that long.
    verify_max_rows: int = 17
    #: Plain decode steps can be queued back to back, each fed by the previous one's argmax
    #: on the device (``run_graph(fed=True)``, ``argmax_feed``, ``copy_to_host_async``):
    #: engine/step_chain.py. False: every step waits for its id on the host.
    graph_chain: bool = False

    @property
    def padded_rows(self) -> int:
        """Rows every forward is padded to, 0 for none: the one place the rule lives (only
        a backend that is not batch-invariant pads, so that decode, verify and prefill all
        run the same multi-row kernels)."""
        return 0 if self.batch_invariant else int(self.fixed_rows)

    @property
    def variant(self) -> str:
        """The backend plus any setting that changes its numbers or its speed curve.

        Why separate from ``name``: a setting such as the CPU's int8 activations makes
        different logits and a different verify-cost curve, so caches of measured
        costs and benchmark records must tell the two apart, while code that picks
        behaviour by backend (``name``) must not.
        """
        return self.name

    def kernels_cached(self) -> bool:
        """Whether this backend's compiled kernels are already on disk, so the first forward
        only loads them. A loader says "compiling kernels (first run only)" when not; a
        backend with nothing to compile keeps this default."""
        return True

    # ---- weights -------------------------------------------------------------------------
    @abstractmethod
    def prepare_matrix(self, tensors: list[QuantTensor]) -> Weight:
        """Upload one or more (out_i, in) matrices sharing ``in`` as one fused weight.

        ``matmul(x, w)`` then returns the outputs concatenated along the last axis
        (q|k|v, gate|up): one call instead of several, which matters when a call
        costs microseconds and a token makes hundreds.
        """

    @abstractmethod
    def prepare_vector(self, values: np.ndarray) -> Array:
        """Upload a float32 vector (norm weights, biases)."""

    @abstractmethod
    def prepare_embedding(self, table: QuantTensor) -> Any:
        """Keep the token-embedding table in whatever form ``embed`` reads fastest."""

    # ---- ops -----------------------------------------------------------------------------
    @abstractmethod
    def embed(self, table: Any, ids: np.ndarray) -> Array:
        """Rows of the embedding table, float32, shape (n, d)."""

    @abstractmethod
    def matmul(self, x: Array, w: Weight) -> Array:
        """x (n, in) float32 → x @ W.T, shape (n, out)."""

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """Normalize each row of x (…, d) by its RMS, times weight (d,)."""

    @abstractmethod
    def rope(self, x: Array, positions: np.ndarray, base: float, neox: bool) -> Array:
        """Rotate x (n, heads, head_dim) by position; ``neox`` pairs (i, i+d/2), else (2i, 2i+1)."""

    @abstractmethod
    def attention(
        self,
        q: Array,
        k_cache: Array,
        v_cache: Array,
        positions: np.ndarray,
        window: int,
        scale: float,
    ) -> Array:
        """Causal attention of q (n, H, hd) over cache rows [0, positions[i]] per row.

        ``k_cache``/``v_cache`` are (ctx, KVH, hd) with the new rows already written;
        row i sees keys j with j <= positions[i] and, when ``window`` > 0,
        positions[i] - j < window. Returns (n, H * hd).
        """

    @abstractmethod
    def silu_mul(self, gate: Array, up: Array) -> Array:
        """silu(gate) * up."""

    @abstractmethod
    def gelu_tanh_mul(self, gate: Array, up: Array) -> Array:
        """gelu_tanh(gate) * up."""

    @abstractmethod
    def add(self, a: Array, b: Array) -> Array:
        """a + b (residual connections, biases broadcast over rows)."""

    @abstractmethod
    def scale(self, x: Array, factor: float) -> Array:
        """x * factor, rounded to float32 as the reference does."""

    # ---- fusable compositions -------------------------------------------------------------
    # Model code calls these; the defaults compose the ops above in the model's own order
    # (so CPU results are unchanged), a backend bound by launches (CUDA) does each in one.
    def norm_matmul(self, x: Array, weight: Array, eps: float, w: Weight, bias: Array = None) -> Array:
        """matmul(rms_norm(x, weight, eps), w), plus ``bias`` (broadcast over rows) if given."""
        y = self.matmul(self.rms_norm(x, weight, eps), w)
        return y if bias is None else self.add(y, bias)

    def norm_matmul_glu(self, x: Array, weight: Array, eps: float, w: Weight, n_ff: int, gelu: bool) -> Array:
        """act(gate) * up where gate|up = matmul(rms_norm(x, weight, eps), w)."""
        gate, up = self.split(self.matmul(self.rms_norm(x, weight, eps), w), [n_ff, n_ff])
        return self.gelu_tanh_mul(gate, up) if gelu else self.silu_mul(gate, up)

    def matmul_add(self, x: Array, w: Weight, residual: Array) -> Array:
        """residual + matmul(x, w) (the residual connection after a product)."""
        return self.add(residual, self.matmul(x, w))

    def rope_store(
        self,
        q: Array,
        k: Array,
        v: Array,
        positions: Any,
        start: Any,
        base: float,
        neox: bool,
        k_cache: Array,
        v_cache: Array,
    ) -> Array:
        """Rotated q; rotated k and v written to linear caches at ``start`` (= positions[0]).

        ``start`` is what ``write_cache`` takes (an int, or a positions array on backends
        that accept one); positions[i] == start + i.
        """
        q = self.rope(q, positions, base, neox)
        k = self.rope(k, positions, base, neox)
        self.write_cache(k_cache, start, k)
        self.write_cache(v_cache, start, v)
        return q

    # ---- cache storage -------------------------------------------------------------------
    @abstractmethod
    def empty_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> Array:
        """Zeroed float32 storage (capacity, KVH, hd) for one layer's K or V."""

    def empty_key_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> Array:
        """Storage for one layer's K: like ``empty_cache``, but a backend whose attention
        reads keys in another memory order may lay them out so (same shape and indexing)."""
        return self.empty_cache(capacity, n_kv_heads, head_dim)

    @abstractmethod
    def write_cache(self, cache: Array, start: int, rows: Array) -> None:
        """cache[start:start+n] = rows (rows (n, KVH, hd))."""

    @abstractmethod
    def grow_cache(self, cache: Array, capacity: int) -> Array:
        """A larger storage holding the same leading rows."""

    def swap_buffers(self, a: Array, b: Array, rows: int | None = None) -> None:
        """Exchange the contents of two cache buffers of one shape, in place (their
        identities stay: graphs captured on them remain valid), their first ``rows`` rows
        only when given (the rest hold nothing a cache reads). Numpy and CuPy arrays."""
        if rows is not None:
            a, b = a[:rows], b[:rows]
        held = a.copy()
        a[...] = b
        b[...] = held

    # ---- results -------------------------------------------------------------------------
    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray:
        """A numpy copy."""

    def argmax(self, logits: Array) -> np.ndarray:
        """Greedy choice per row, ties to the lowest id (numpy's rule)."""
        return np.argmax(self.to_host(logits), axis=-1)

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        return x.reshape(shape)

    def split(self, x: Array, sizes: list[int]) -> list[Array]:
        """Split the last axis into consecutive parts of the given sizes."""
        out, start = [], 0
        for size in sizes:
            out.append(x[..., start : start + size])
            start += size
        return out

    def synchronize(self) -> None:
        """Wait for queued device work (timing); a no-op on the CPU."""
        return None
