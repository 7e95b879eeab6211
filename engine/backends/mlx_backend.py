"""MLX backend (Apple silicon; also runs on MLX's Linux CPU build, which is how CI tests it).

Why this shape: on an Apple GPU a decode step is bound by weight reads, so
GGUF blocks are rewritten once into MLX's affine groups wherever that is
EXACT (kernels/mlx/affine.py says which types and why) and multiplied with
``mx.quantized_matmul`` at 4-8 bits a weight. Q6_K has no exact rewrite: on
Metal it runs a custom kernel over the stored blocks (kernels/mlx/q6k_metal.py,
used only after it agrees with the float path on the device), elsewhere a
float32 copy (exact; float16 is not: d·sc·q needs 25 bits).

MLX is lazy: ops only build a graph. Nothing here evaluates except
``to_host``/``argmax``, so one forward is one evaluation.

``batch_invariant`` is measured, never assumed: on the CPU device the backend
checks its own ops at start (``check_batch_invariance``); on Metal it is
False (not measured by us; ``echoline doctor`` measures it on the real model)
and the engine then decodes through the fixed-row path, which is exact either way.

MLX is imported here and nowhere else in the engine (optional extra ``echoline[mlx]``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from echoline.engine.backends.base import Array, Backend
from echoline.engine.gguf_file import QuantTensor
from echoline.kernels.mlx import affine

Q = gguf.GGMLQuantizationType
WEIGHT_MODES = ("auto", "affine", "float")


@dataclass
class AffineSegment:
    """Rows held as MLX affine groups (exact rewrite of the GGUF blocks)."""

    wq: Any
    scales: Any
    biases: Any
    bits: int
    rows: int

    def apply(self, x: Any) -> Any:
        return mx.quantized_matmul(
            x, self.wq, self.scales, self.biases, transpose=True, group_size=affine.GROUP, bits=self.bits
        )


@dataclass
class DenseSegment:
    """Rows held as a float32 (in, out) matrix: exact for every type, 32 bits a weight."""

    wt: Any
    rows: int

    def apply(self, x: Any) -> Any:
        return mx.matmul(x, self.wt)


@dataclass
class Q6KSegment:
    """Q6_K rows kept as stored blocks, multiplied by the Metal kernel."""

    blocks: Any
    rows: int
    cols: int

    def apply(self, x: Any) -> Any:
        from echoline.kernels.mlx.q6k_metal import q6k_matmul

        return q6k_matmul(x, self.blocks, self.rows, self.cols)


@dataclass
class MlxWeight:
    """A fused (out, in) matrix: consecutive segments, outputs concatenated."""

    segments: list[Any]
    out_features: int
    in_features: int


def _raw(t: QuantTensor) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(t.data)).view(np.uint8).reshape(t.rows, -1)


class MlxBackend(Backend):
    """MLX arrays on the default device (GPU on Apple silicon, CPU elsewhere)."""

    name = "mlx"
    batch_invariant = False
    #: Rows every forward is padded to when not batch-invariant (engine/generate.py run_rows).
    fixed_rows = 16

    def __init__(self, weights: str | None = None, check: bool = True) -> None:
        mode = weights or os.environ.get("ECHOLINE_MLX_WEIGHTS", "auto")
        if mode not in WEIGHT_MODES:
            raise ValueError(f"MLX weight mode {mode!r}: choose one of {', '.join(WEIGHT_MODES)}")
        self.on_metal = bool(mx.metal.is_available())
        # auto: affine groups on Metal (decode reads weights: 4-8 bits beat 32); float32 on
        # MLX's CPU build, where quantized_matmul measured half the speed (docs/backends.md).
        self.weights = mode if mode != "auto" else ("affine" if self.on_metal else "float")
        self.device = str(mx.default_device())
        self.q6k_kernel = False
        if self.on_metal:
            self.q6k_kernel = self._q6k_self_check()
        self.invariance: dict[str, bool] = {}
        if check and not self.on_metal:
            self.invariance = self.check_batch_invariance()
            self.batch_invariant = all(self.invariance.values())

    # ---- weights -------------------------------------------------------------------------
    def _segment(self, t: QuantTensor) -> Any:
        if self.weights == "affine" and t.qtype in affine.AFFINE_BITS:
            a = affine.unpack(t.qtype, t.data, t.rows, t.cols)
            return AffineSegment(
                mx.array(affine.pack_codes(a.codes, a.bits)), mx.array(a.scales), mx.array(a.biases),
                a.bits, t.rows,
            )
        if t.qtype == Q.Q6_K and self.q6k_kernel and self.weights == "affine":
            return Q6KSegment(mx.array(_raw(t)), t.rows, t.cols)
        w = t.dequantize().reshape(t.rows, t.cols).astype(np.float32)
        return DenseSegment(mx.array(np.ascontiguousarray(w.T)), t.rows)

    @staticmethod
    def _merge(a: Any, b: Any) -> Any | None:
        """One segment for two consecutive ones of the same form (one call instead of two)."""
        if isinstance(a, AffineSegment) and isinstance(b, AffineSegment) and a.bits == b.bits:
            return AffineSegment(
                mx.concatenate([a.wq, b.wq]), mx.concatenate([a.scales, b.scales]),
                mx.concatenate([a.biases, b.biases]), a.bits, a.rows + b.rows,
            )
        if isinstance(a, DenseSegment) and isinstance(b, DenseSegment):
            return DenseSegment(mx.concatenate([a.wt, b.wt], axis=1), a.rows + b.rows)
        return None

    def prepare_matrix(self, tensors: list[QuantTensor]) -> MlxWeight:
        cols = tensors[0].cols
        if any(t.cols != cols for t in tensors):
            raise ValueError("fused matrices must share their input size")
        segments: list[Any] = []
        for t in tensors:
            seg = self._segment(t)
            merged = self._merge(segments[-1], seg) if segments else None
            if merged is not None:
                segments[-1] = merged
            else:
                segments.append(seg)
        for s in segments:
            mx.eval(*[v for v in vars(s).values() if isinstance(v, mx.array)])
        return MlxWeight(segments, sum(t.rows for t in tensors), cols)

    def prepare_vector(self, values: np.ndarray) -> Any:
        return mx.array(np.ascontiguousarray(values, dtype=np.float32).reshape(-1))

    def prepare_embedding(self, table: QuantTensor) -> QuantTensor:
        # A lookup touches a few rows: dequantize those on the host (exact) and upload.
        return table

    # ---- ops -----------------------------------------------------------------------------
    @staticmethod
    def _mx(x: Array) -> Any:
        return x if isinstance(x, mx.array) else mx.array(np.asarray(x, dtype=np.float32))

    def embed(self, table: QuantTensor, ids: np.ndarray) -> Any:
        return mx.array(table.dequantize_rows(np.asarray(ids, dtype=np.int64)).astype(np.float32))

    def matmul(self, x: Array, w: MlxWeight) -> Any:
        x = self._mx(x)
        outs = [s.apply(x) for s in w.segments]
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)

    def rms_norm(self, x: Array, weight: Any, eps: float) -> Any:
        return mx.fast.rms_norm(self._mx(x), weight, eps)

    def rope(self, x: Array, positions: np.ndarray, base: float, neox: bool) -> Any:
        x = self._mx(x)
        pos = np.asarray(positions, dtype=np.int64)
        hd = x.shape[-1]
        if pos.size and np.array_equal(pos, np.arange(pos[0], pos[0] + pos.size)):
            # (n, H, hd) → (H, n, hd): mx.fast.rope rotates along the second-to-last axis.
            out = mx.fast.rope(
                x.transpose(1, 0, 2), hd, traditional=not neox, base=base, scale=1.0, offset=int(pos[0])
            )
            return out.transpose(1, 0, 2)
        return self._rope_tables(x, pos, base, neox)

    @staticmethod
    def _rope_tables(x: Any, pos: np.ndarray, base: float, neox: bool) -> Any:
        """Rotation from float64 tables, for positions that are not one consecutive run."""
        from echoline.engine.backends.numpy_backend import rope_tables

        hd = x.shape[-1]
        cos, sin = rope_tables(pos, hd, base)
        cos, sin = mx.array(cos)[:, None, :], mx.array(sin)[:, None, :]
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
            return mx.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        return mx.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)

    def attention(self, q, k_cache, v_cache, positions, window, scale) -> Any:
        q = self._mx(q)
        n, n_heads, hd = q.shape
        pos = np.asarray(positions, dtype=np.int64)
        length = int(pos.max()) + 1
        keys = np.arange(length)
        mask = keys[None, :] <= pos[:, None]
        if window > 0:
            mask &= (pos[:, None] - keys[None, :]) < window
        k = self._mx(k_cache)[:length].transpose(1, 0, 2)[None]
        v = self._mx(v_cache)[:length].transpose(1, 0, 2)[None]
        out = mx.fast.scaled_dot_product_attention(
            q.transpose(1, 0, 2)[None], k, v, scale=float(scale), mask=mx.array(mask)
        )
        return out[0].transpose(1, 0, 2).reshape(n, n_heads * hd)

    def silu_mul(self, gate, up) -> Any:
        gate = self._mx(gate)
        return gate / (1.0 + mx.exp(-gate)) * self._mx(up)

    def gelu_tanh_mul(self, gate, up) -> Any:
        g = self._mx(gate)
        inner = np.float32(np.sqrt(2.0 / np.pi)) * (g + np.float32(0.044715) * g * g * g)
        return 0.5 * g * (1.0 + mx.tanh(inner)) * self._mx(up)

    def add(self, a, b) -> Any:
        return self._mx(a) + self._mx(b)

    def scale(self, x, factor: float) -> Any:
        return self._mx(x) * mx.array(np.float32(factor))

    # ---- cache storage -------------------------------------------------------------------
    def empty_cache(self, capacity: int, n_kv_heads: int, head_dim: int) -> Any:
        return mx.zeros((capacity, n_kv_heads, head_dim), dtype=mx.float32)

    def write_cache(self, cache: Any, start: int, rows) -> None:
        rows = self._mx(rows)
        cache[start : start + rows.shape[0]] = rows  # MLX updates the array object in place

    def grow_cache(self, cache: Any, capacity: int) -> Any:
        new = mx.zeros((capacity,) + tuple(cache.shape[1:]), dtype=cache.dtype)
        new[: cache.shape[0]] = cache
        mx.eval(new)
        return new

    # ---- results -------------------------------------------------------------------------
    def to_host(self, x) -> np.ndarray:
        return np.array(x, dtype=np.float32) if isinstance(x, mx.array) else np.asarray(x)

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Any:
        return self._mx(x).reshape(shape)

    def synchronize(self) -> None:
        mx.synchronize()

    # ---- self checks ---------------------------------------------------------------------
    def _q6k_self_check(self) -> bool:
        """Use the Q6_K Metal kernel only if it agrees with the exact float32 path here."""
        try:
            from echoline.kernels.mlx.q6k_metal import q6k_matmul

            rng = np.random.default_rng(0)
            t = _random_q6k(rng, 64, 512)
            w = t.dequantize().reshape(64, 512)
            x = rng.standard_normal((3, 512)).astype(np.float32)
            got = np.array(q6k_matmul(mx.array(x), mx.array(_raw(t)), 64, 512))
            want = x.astype(np.float64) @ w.astype(np.float64).T
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            return bool(np.isfinite(got).all() and err < 1e-5)
        except Exception:  # noqa: BLE001 - any compile/launch failure means "use the float path"
            return False

    def check_batch_invariance(self, rows: tuple[int, ...] = (1, 2, 3, 8, 16)) -> dict[str, bool]:
        """Measure, per op, whether row 0's result is bit-identical at each row count.

        Small synthetic shapes with the model's structure (64-column groups,
        GQA attention at a late position, sliding window): cheap enough to run
        at start. ``echoline doctor`` repeats the check on the real model.
        """
        rng = np.random.default_rng(1234)
        cols, n_max = 256, max(rows)
        x = mx.array(rng.standard_normal((n_max, cols)).astype(np.float32))
        result: dict[str, bool] = {}

        def same(fn) -> bool:
            full = np.array(fn(n_max))
            return all(np.array_equal(np.array(fn(k))[: k], full[: k]) for k in rows)

        forms = {"matmul_affine4": Q.Q4_1, "matmul_affine5": Q.Q5_0, "matmul_affine8": Q.Q8_0,
                 "matmul_float": Q.F32}
        for label, qtype in forms.items():
            data = rng.standard_normal((96, cols)).astype(np.float32) * 0.05
            raw = data if qtype == Q.F32 else gguf.quants.quantize(data, qtype)
            t = QuantTensor("check", qtype, (96, cols), np.ascontiguousarray(raw))
            w = self.prepare_matrix([t])
            result[label] = same(lambda k, w=w: self.matmul(x[:k], w))
        norm_w = mx.array(rng.standard_normal(cols).astype(np.float32))
        result["rms_norm"] = same(lambda k: self.rms_norm(x[:k], norm_w, 1e-6))
        heads, kvh, hd, ctx, start = 4, 2, 64, 96, 70
        qh = mx.array(rng.standard_normal((n_max, heads, hd)).astype(np.float32))
        result["rope"] = same(lambda k: self.rope(qh[:k], np.arange(start, start + k), 10000.0, True))
        kc = mx.array(rng.standard_normal((ctx, kvh, hd)).astype(np.float32))
        vc = mx.array(rng.standard_normal((ctx, kvh, hd)).astype(np.float32))
        for window in (0, 20):
            result[f"attention_w{window}"] = same(
                lambda k, window=window: self.attention(qh[:k], kc, vc, np.arange(start, start + k), window, 0.125)
            )
        return result


def _random_q6k(rng: np.random.Generator, rows: int, cols: int) -> QuantTensor:
    """Valid Q6_K blocks (random codes, small half-float d) for the kernel self-check."""
    n_blocks = cols // 256
    raw = rng.integers(0, 256, size=(rows, n_blocks, 210), dtype=np.uint8)
    raw[..., 208:210] = rng.uniform(0.002, 0.01, size=(rows, n_blocks, 1)).astype(np.float16).view(np.uint8)
    raw[..., 192:208] = rng.integers(-32, 32, size=(rows, n_blocks, 16), dtype=np.int8).view(np.uint8)
    return QuantTensor("q6k_check", Q.Q6_K, (rows, cols), raw.reshape(rows, n_blocks * 210))
