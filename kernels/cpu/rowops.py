"""Batch-invariant row ops: every row's result depends only on that row.

Each loop over a row has the same trip count and order whatever the number
of rows, no fast-math (so LLVM neither reassociates nor fuses), and
transcendental functions are scalar libm calls (numba has no SVML here), so a
row computed alone or among others, at any position in a batch, gives the
same bits. Parallelism (prange) is only ever across rows or (row, head) pairs.

Attention, batch-invariant the same way, is ``attention.py``; its vectorizable exp
(``exp_nonpositive``) serves the gated activations here too.
"""

from __future__ import annotations

import numpy as np
from echoline.kernels.cpu.attention import exp_nonpositive
from echoline.kernels.cpu.numba_setup import njit, prange
from numba import types
from numba.core.extending import intrinsic

_U = np.uint64



@njit(cache=True, nogil=True, boundscheck=False)
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x (m, d) float32 → x / rms(x) * w; the sum of squares is accumulated in float64."""
    m, d = x.shape
    out = np.empty((m, d), dtype=np.float32)
    e = np.float32(eps)
    for r in range(m):  # serial: a parallel launch costs more than a few rows
        ss = 0.0
        for i in range(d):
            v = np.float64(x[r, i])
            ss += v * v
        ms = np.float32(ss / d)
        inv = np.float32(1.0) / np.sqrt(ms + e)
        for i in range(d):
            out[r, i] = (x[r, i] * inv) * w[i]
    return out


def rope_tables(positions: np.ndarray, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (n, head_dim/2) per position: float64 angles rounded to float32 (ggml's way)."""
    half = head_dim // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@njit(cache=True, nogil=True, boundscheck=False)
def rope_apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate x (n, H, hd) with per-row tables (n, hd/2)."""
    n, nh, hd = x.shape
    half = hd // 2
    out = np.empty_like(x)
    for r in range(n):
        for h in range(nh):
            for i in range(half):
                c = cos[r, i]
                s = sin[r, i]
                if neox:
                    a = x[r, h, i]
                    b = x[r, h, i + half]
                    out[r, h, i] = a * c - b * s
                    out[r, h, i + half] = a * s + b * c
                else:
                    a = x[r, h, 2 * i]
                    b = x[r, h, 2 * i + 1]
                    out[r, h, 2 * i] = a * c - b * s
                    out[r, h, 2 * i + 1] = a * s + b * c
    return out


# ---- gated activations -------------------------------------------------------------------------
# Both activations are x * sigmoid(z) (SiLU: z = x; tanh-GELU: 0.5 * (1 + tanh(y)) is
# sigmoid(2y)), and sigmoid runs on ``exp_nonpositive`` of -|z|, whose vector and scalar
# lanes give the same bits. Why not libm: numba here has no SVML, so expf/tanhf are one
# scalar call per element — 4.3 ms of a 17-row Gemma 3 forward (11 %), 6.8 ns an element;
# this runs at ~0.3 ns. The serial and row-parallel loops call the same row function, so a
# row's bits cannot depend on which loop ran or on its neighbours.

#: From this many rows the activations run one row per thread (a parallel launch costs
#: about what 2-3 rows of SmolLM2's 1536-wide activation do).
PARALLEL_ACTIVATION_ROWS = 4
_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_GELU_CUBIC = np.float32(0.044715)


#: Lanes of ``_sigmoid_times``: one AVX-512 register of float32.
SIGMOID_LANES = 16


@intrinsic
def _sigmoid_times(typingctx, x, z, u, e, out, i):
    """out[i:i+16] = x · (num / (1 + e)) · u with num = 1 where z ≥ 0, else e: one vector.

    Why an intrinsic: LLVM kept this loop scalar (one ``vdivss`` an element: numba cannot
    say that ``out`` aliases none of the inputs, and the cost model then declines), so the
    tail of SiLU cost more than its exp. The same IEEE operations in the same order as
    the scalar loop of ``_times_sigmoid_row`` (no fast-math): every lane's bits equal it.
    16 rows of Qwen 1.5B's 8960-wide activation, one thread: 189 → 81 µs (now: ``python -m
    tools.cpu.bench_rowops``; the old-vs-new forwards: docs/history/cpu-kernels.md).
    """
    # 16 consecutive float32 read from each row: ``_gated`` hands over float32 rows of
    # unit stride (layout 'A' included); any other type is a typing error.
    if not all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 for a in (x, z, u, e, out)):
        return None
    sig = types.void(x, z, u, e, out, i)

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        ptrs = [context.make_array(signature.args[k])(context, builder, args[k]).data for k in range(5)]
        at = args[5]
        vf = ir.VectorType(ir.FloatType(), SIGMOID_LANES)

        def load(p):
            return builder.load(builder.bitcast(builder.gep(p, [at]), vf.as_pointer()), align=4)

        xv, zv, uv, ev = (load(p) for p in ptrs[:4])
        one = ir.Constant(vf, [1.0] * SIGMOID_LANES)
        num = builder.select(builder.fcmp_ordered(">=", zv, ir.Constant(vf, [0.0] * SIGMOID_LANES)), one, ev)
        r = builder.fmul(builder.fmul(xv, builder.fdiv(num, builder.fadd(one, ev))), uv)
        builder.store(r, builder.bitcast(builder.gep(ptrs[4], [at]), vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False)
def _times_sigmoid_row(x, z, u, out, t, bits):
    """out = x * sigmoid(z) * u over one row; ``z`` is overwritten (scratch ``t``, ``bits``).

    sigmoid(z) = 1 / (1 + e) for z >= 0 and e / (1 + e) below, with e = exp(-|z|) <= 1:
    no overflow either side, and a very negative z gives the exact -0 (e == 0). Whole
    vectors of 16 go through ``_sigmoid_times``, the rest through the same scalar steps.
    """
    one = np.float32(1.0)
    n = x.shape[0]
    for i in range(_U(0), _U(n)):
        t[i] = -abs(z[i])
    exp_nonpositive(t, bits, 0, n)
    full = n // SIGMOID_LANES * SIGMOID_LANES
    for i in range(_U(0), _U(full), _U(SIGMOID_LANES)):
        _sigmoid_times(x, z, u, t, out, i)
    for i in range(_U(full), _U(n)):
        e = t[i]
        num = one if z[i] >= np.float32(0.0) else e
        out[i] = x[i] * (num / (one + e)) * u[i]


@njit(cache=True, nogil=True, boundscheck=False)
def _gated_row(gelu, gate, up, out, t, bits):
    """One row of silu(gate) * up, or of gelu_tanh(gate) * up when ``gelu``."""
    if not gelu:
        _times_sigmoid_row(gate, gate, up, out, t, bits)
        return
    z = np.empty_like(gate)
    two_c = np.float32(2.0) * _SQRT_2_OVER_PI
    for i in range(_U(0), _U(gate.shape[0])):
        x = gate[i]
        z[i] = two_c * (x + _GELU_CUBIC * x * x * x)
    _times_sigmoid_row(gate, z, up, out, t, bits)


@njit(cache=True, nogil=True, boundscheck=False)
def _gated_serial(gelu, gate, up, out):
    t = np.empty(gate.shape[1], dtype=np.float32)
    bits = np.empty(gate.shape[1], dtype=np.int32)
    for r in range(gate.shape[0]):
        _gated_row(gelu, gate[r], up[r], out[r], t, bits)


@njit(cache=True, nogil=True, parallel=True, boundscheck=False)
def _gated_parallel(gelu, gate, up, out):
    for r in prange(gate.shape[0]):
        t = np.empty(gate.shape[1], dtype=np.float32)
        bits = np.empty(gate.shape[1], dtype=np.int32)
        _gated_row(gelu, gate[r], up[r], out[r], t, bits)


def _gated(gelu: bool, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    # The vector steps read each row as consecutive float32: anything else is copied so.
    if gate.dtype != np.float32 or gate.strides[-1] != 4:
        gate = np.ascontiguousarray(gate, dtype=np.float32)
    if up.dtype != np.float32 or up.strides[-1] != 4:
        up = np.ascontiguousarray(up, dtype=np.float32)
    out = np.empty(gate.shape, dtype=np.float32)
    (_gated_parallel if gate.shape[0] >= PARALLEL_ACTIVATION_ROWS else _gated_serial)(gelu, gate, up, out)
    return out


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up for (m, d) float32; exp overflow gives the correct -0."""
    return _gated(False, gate, up)


def gelu_tanh_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up for (m, d) float32."""
    return _gated(True, gate, up)
