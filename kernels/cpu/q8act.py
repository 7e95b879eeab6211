"""Exploration (issue #3): int8 activations with integer dot products (AVX-512 VNNI).

Not wired into the engine. ``matmul_q8(x, w)`` computes y = x · Wᵀ like
``kernels.cpu.matmul.matmul`` but first quantizes every row of x per block of 32
inputs to int8 with one float32 scale (symmetric, like ggml's Q8_0), then takes
each weight block's dot product as an exact int32 sum with ``vpdpbusd``.

Why an LLVM intrinsic and not plain numba loops: numba promotes int32 products to
int64, and whether LLVM narrows them back to ``vpdpwssd``/``vpdpbusd`` depends on the
tile shape (measured: a 1×16 tile narrowed, a 2×16 tile of the same source compiled
to int64 ``vpmuldq``). ``_make_dot`` emits ``llvm.x86.avx512.vpdpbusd.512`` directly,
so the instruction is guaranteed, not hoped for.

``vpdpbusd`` multiplies unsigned bytes by signed bytes. Weights are stored as
``q + 128`` (uint8, any int8 value fits) and activations stay signed, so
Σ (q+128)·xq = Σ q·xq + 128·Σ xq; the correction uses the activation block's
integer sum, which the offset formats need anyway. All integer, all exact.

Reduction order (the batch-invariance contract), row r, output o, weight block b
of BS inputs (32, or 16 for Q6_K), d = the activation scale of the 32-block holding b:

    t = 0
    for each block b in order:
        i = Σ_{i in b} q[o, i] · xq[r, i]                  # exact int32, |i| < 2^24
        t = t + f32(i) * (scale[b, o] * d)                  # two roundings, no FMA
        t = t + (f32(Σ_{i in b} xq[r, i]) * d) * offset[b, o]   # offset kinds

No fast-math anywhere, so LLVM may not contract or reorder these operations; the
integer part is exact whatever order the hardware sums it in. Rows never share any
arithmetic, so a row's bits do not depend on n or on the tile it lands in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernels.cpu._env import njit, prange  # sets numba's flags before numba is imported
from kernels.cpu.matmul import GROUP, PreparedMatrix
from kernels.cpu.relayout import Kind

#: Activation quantization block (inputs per float32 scale), as ggml's Q8_0.
QBLOCK = 32
#: Row tiles, greedily: R rows × 64 outputs = 4·R zmm accumulators + 4 weight registers.
ROW_TILES = (6, 4, 2, 1)
ROW_CHUNK = 64
#: Groups of 64 outputs per parallel task (each task allocates its scratch once).
GROUPS_PER_TASK = 16


def vnni_available() -> bool:
    """True when the host CPU has AVX-512 VNNI (and BW), which the kernels require."""
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
        return bool(feats.get("avx512vnni")) and bool(feats.get("avx512bw"))
    except Exception:  # noqa: BLE001 - unknown host: treat as unavailable
        return False


# --------------------------------------------------------------------------- activations


@njit(cache=True, nogil=True, boundscheck=False)
def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, cols) float32 → (xq int8 (n, cols), d float32 (n, cols/32)).

    Per block of 32: d = max|x| / 127, xq = rint(x / d) (0 for an all-zero block).
    Unlike ggml's Q8_0, d stays float32 (not rounded to f16) and the division is a
    true division, not a multiply by 1/d: it costs nothing measurable here and is
    one rounding fewer. Each row is computed on its own, in a fixed order.
    """
    n, cols = x.shape
    nb = cols // QBLOCK
    xq = np.empty((n, cols), dtype=np.int8)
    d = np.empty((n, nb), dtype=np.float32)
    for r in range(n):
        for b in range(nb):
            amax = np.float32(0.0)
            for i in range(QBLOCK):
                v = abs(x[r, b * QBLOCK + i])
                if v > amax:
                    amax = v
            db = amax / np.float32(127.0)
            d[r, b] = db
            for i in range(QBLOCK):
                if db == 0:
                    xq[r, b * QBLOCK + i] = 0
                else:
                    xq[r, b * QBLOCK + i] = np.int8(np.rint(x[r, b * QBLOCK + i] / db))
    return xq, d


@njit(cache=True, nogil=True, boundscheck=False)
def block_terms(xq: np.ndarray, d: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row and weight block: (exact int32 Σ xq, float32 f32(Σ xq) · d), flat (n·nb).

    The second is the offset term's activation sum: the exact integer sum of the
    quantized block times its scale (one rounding), i.e. the sum of x̂ itself.
    """
    n, cols = xq.shape
    nb = cols // block
    ratio = QBLOCK // block
    isum = np.empty(n * nb, dtype=np.int32)
    xd = np.empty(n * nb, dtype=np.float32)
    for r in range(n):
        for b in range(nb):
            acc = np.int32(0)
            for i in range(block):
                acc = np.int32(acc + np.int32(xq[r, b * block + i]))
            isum[r * nb + b] = acc
            xd[r * nb + b] = np.float32(acc) * d[r, b // ratio]
    return isum, xd


# --------------------------------------------------------------------------- VNNI block dot


def _make_block(rows: int, block: int, offset: bool):
    """An intrinsic doing one weight block for ``rows`` rows × 64 outputs, dot and combine.

    Arguments: qv, qbase (the block's first byte: (block/4, 64 outputs, 4 inputs) of
    q+128), xq, xbase (row r0's first input of the block), xstride (inputs per row),
    xsum, xd, abase (index of row r0, block b in those (n, nblocks) arrays), astride,
    d, dbase (row r0's activation-scale index), dstride, s, m, sbase (weight block's
    scales), t (rows*64 float32 running sums, updated in place).

    Straight-line IR: block/4 steps × rows × 4 ``vpdpbusd`` into 4·rows register
    accumulators, then per row the float combine of the module docstring as plain
    ``fsub``/``fmul``/``fadd`` vector instructions without fast-math flags, so LLVM
    can neither fuse nor reorder them.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.core.extending import intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    v16 = ir.VectorType(i32, 16)
    vf = ir.VectorType(f32, 16)
    v64b = ir.VectorType(ir.IntType(8), 64)
    splat = ir.Constant(v16, [0] * 16)

    def c64(k: int):
        return ir.Constant(i64, k)

    @intrinsic
    def blk(typingctx, qv, qbase, xq, xbase, xstride, xsum, xd, abase, astride, d, dbase, dstride, s, m, sbase, t):
        sig = types.void(qv, qbase, xq, xbase, xstride, xsum, xd, abase, astride, d, dbase, dstride, s, m, sbase, t)

        def codegen(context, builder, signature, args):
            (qv_, qbase_, xq_, xbase_, xstride_, xsum_, xd_, abase_, astride_, d_, dbase_, dstride_, s_, m_,
             sbase_, t_) = args  # fmt: skip
            tys = signature.args

            def data(k: int, val):
                return context.make_array(tys[k])(context, builder, val).data

            qp, xp, sump, xdp, dp, sp, mp, tp = (
                data(0, qv_), data(2, xq_), data(5, xsum_), data(6, xd_), data(9, d_), data(12, s_),
                data(13, m_), data(15, t_),
            )  # fmt: skip

            def splat_of(vec_t, scalar):
                z = ir.Constant(vec_t, None)
                return builder.shuffle_vector(builder.insert_element(z, scalar, ir.Constant(i32, 0)), z, splat)

            def vload(ptr, idx, vec_t, align):
                return builder.load(builder.bitcast(builder.gep(ptr, [idx]), vec_t.as_pointer()), align=align)

            # The <16 x i32> operand form: LLVM 22 auto-upgrades it, older LLVMs only know it.
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.x86.avx512.vpdpbusd.512"
            )
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")
            qb = builder.gep(qp, [qbase_])
            xrow = [builder.add(xbase_, builder.mul(xstride_, c64(r))) for r in range(rows)]
            arow = [builder.add(abase_, builder.mul(astride_, c64(r))) for r in range(rows)]
            accs = []
            for r in range(rows):
                # start from -128·Σxq: the sum of (q+128)·xq then lands on Σ q·xq exactly
                isum = builder.load(builder.gep(sump, [arow[r]]))
                accs.append([splat_of(v16, builder.mul(isum, ir.Constant(i32, -128)))] * 4)
            for j in range(block // 4):
                w = [builder.bitcast(vload(qb, c64(j * 256 + 64 * v), v64b, 1), v16) for v in range(4)]
                for r in range(rows):
                    p = builder.gep(xp, [builder.add(xrow[r], c64(4 * j))])
                    xv = splat_of(v16, builder.load(builder.bitcast(p, i32.as_pointer()), align=1))
                    for v in range(4):
                        accs[r][v] = builder.call(fn, [accs[r][v], w[v], xv])
            sv = [vload(sp, builder.add(sbase_, c64(16 * v)), vf, 4) for v in range(4)]
            mv = [vload(mp, builder.add(sbase_, c64(16 * v)), vf, 4) for v in range(4)] if offset else []
            for r in range(rows):
                dr = splat_of(vf, builder.load(builder.gep(dp, [builder.add(dbase_, builder.mul(dstride_, c64(r)))])))
                xdr = splat_of(vf, builder.load(builder.gep(xdp, [arow[r]]))) if offset else None
                for v in range(4):
                    ti = c64(r * 64 + 16 * v)
                    tv = vload(tp, ti, vf, 4)
                    exact = builder.sitofp(accs[r][v], vf)  # |value| < 2^24: exact
                    tv = builder.call(fma, [exact, builder.fmul(sv[v], dr), tv])
                    if offset:
                        tv = builder.call(fma, [xdr, mv[v], tv])
                    builder.store(tv, builder.bitcast(builder.gep(tp, [ti]), vf.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return blk


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _store(t, out, rows, r0, ldo, oc):
    """Copy the finished sums to ``out`` and zero them for the next tile."""
    for r in range(rows):
        base = (r0 + r) * ldo + oc
        for o in range(GROUP):
            out[base + o] = t[r * GROUP + o]
            t[r * GROUP + o] = np.float32(0.0)


def _make_kernel(block: int, offset: bool) -> Callable:
    b6, b4, b2, b1 = (_make_block(r, block, offset) for r in ROW_TILES)
    ratio = QBLOCK // block

    @njit(parallel=True, cache=True, nogil=True, boundscheck=False)
    def kernel(xq, xsum, xd, d, qv, s, m, out, n, cols, ldo, col0, nblocks, ngroups):
        """out[r, col0 + g*64 + o] for every row and group; see the module docstring."""
        ntask = (ngroups + GROUPS_PER_TASK - 1) // GROUPS_PER_TASK
        nbq = cols // QBLOCK
        gstride = nblocks * block * GROUP
        for task in prange(ntask):
            t = np.zeros(6 * GROUP, dtype=np.float32)
            g1 = min(ngroups, (task + 1) * GROUPS_PER_TASK)
            for g in range(task * GROUPS_PER_TASK, g1):
                oc = col0 + g * GROUP
                r0 = 0
                while r0 + 6 <= n:
                    for b in range(nblocks):
                        b6(qv, g * gstride + b * block * GROUP, xq, r0 * cols + b * block, cols, xsum, xd,
                           r0 * nblocks + b, nblocks, d, r0 * nbq + b // ratio, nbq, s, m, (g * nblocks + b) * GROUP, t)
                    _store(t, out, 6, r0, ldo, oc)
                    r0 += 6
                while r0 + 4 <= n:
                    for b in range(nblocks):
                        b4(qv, g * gstride + b * block * GROUP, xq, r0 * cols + b * block, cols, xsum, xd,
                           r0 * nblocks + b, nblocks, d, r0 * nbq + b // ratio, nbq, s, m, (g * nblocks + b) * GROUP, t)
                    _store(t, out, 4, r0, ldo, oc)
                    r0 += 4
                while r0 + 2 <= n:
                    for b in range(nblocks):
                        b2(qv, g * gstride + b * block * GROUP, xq, r0 * cols + b * block, cols, xsum, xd,
                           r0 * nblocks + b, nblocks, d, r0 * nbq + b // ratio, nbq, s, m, (g * nblocks + b) * GROUP, t)
                    _store(t, out, 2, r0, ldo, oc)
                    r0 += 2
                while r0 < n:
                    for b in range(nblocks):
                        b1(qv, g * gstride + b * block * GROUP, xq, r0 * cols + b * block, cols, xsum, xd,
                           r0 * nblocks + b, nblocks, d, r0 * nbq + b // ratio, nbq, s, m, (g * nblocks + b) * GROUP, t)
                    _store(t, out, 1, r0, ldo, oc)
                    r0 += 1

    return kernel


#: (weight block, offset) → kernel. Compiled on first use of the module (cached on disk).
KERNELS: dict[tuple[int, bool], Callable] = {(bs, off): _make_kernel(bs, off) for bs in (32, 16) for off in (False, True)}


# --------------------------------------------------------------------------- weights


@dataclass
class Q8Part:
    """One part of a ``PreparedMatrix`` in the VNNI layout."""

    kind: Kind
    qv: np.ndarray  # uint8 flat (ngroups, nblocks, block/4, GROUP, 4), value q + 128
    s: np.ndarray  # float32 flat (ngroups, nblocks, GROUP), shared with the source Part
    m: np.ndarray  # same, or a 1-element dummy
    col0: int
    ngroups: int
    nblocks: int


@dataclass
class Q8Matrix:
    in_features: int
    out_features: int
    padded_out: int
    parts: list[Q8Part]
    valid_cols: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return sum(p.qv.nbytes + p.s.nbytes + p.m.nbytes for p in self.parts)


def vnni_layout(q: np.ndarray, ngroups: int, nblocks: int, block: int) -> np.ndarray:
    """Part.q (g, b, i, o) int8 → (g, b, i/4, o, i%4) uint8 holding q + 128 (flip of the sign bit)."""
    q5 = q.reshape(ngroups, nblocks, block // 4, 4, GROUP)
    out = np.empty((ngroups, nblocks, block // 4, GROUP, 4), dtype=np.uint8)
    out[...] = q5.view(np.uint8).transpose(0, 1, 2, 4, 3)
    out ^= np.uint8(0x80)
    return out.reshape(-1)


def prepare_q8(pm: PreparedMatrix) -> Q8Matrix:
    """Re-lay out an already prepared (int8) matrix for the VNNI kernels; scales are shared."""
    parts = []
    for p in pm.parts:
        if p.kind.wdtype != "int8":
            raise ValueError("prepare_q8: float weights have no int8 form")
        if (p.kind.block, p.kind.offset) not in KERNELS:
            raise ValueError(f"prepare_q8: block {p.kind.block} unsupported")
        qv = vnni_layout(p.q, p.ngroups, p.nblocks, p.kind.block)
        parts.append(Q8Part(p.kind, qv, p.s, p.m, p.col0, p.ngroups, p.nblocks))
    return Q8Matrix(pm.in_features, pm.out_features, pm.padded_out, parts, pm.valid_cols)


def matmul_q8(x: np.ndarray, w: Q8Matrix, row_chunk: int = ROW_CHUNK, out: np.ndarray | None = None) -> np.ndarray:
    """x (n, in) float32 → (n, out) float32 through int8 activations; rows independent of n."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.in_features:
        raise ValueError(f"matmul_q8: x has shape {x.shape}, weight expects (n, {w.in_features})")
    if w.in_features % QBLOCK:
        raise ValueError("matmul_q8: the input size must be a multiple of 32")
    n, cols = x.shape
    if out is None:
        out = np.empty((n, w.padded_out), dtype=np.float32)
    elif out.shape != (n, w.padded_out) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("matmul_q8: out must be a C-contiguous float32 (n, padded_out) array")
    dummy = np.zeros(1, np.float32)
    for r0 in range(0, n, row_chunk):
        r1 = min(n, r0 + row_chunk)
        xq, d = quantize_rows(x[r0:r1])
        per_block: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        d_f = d.reshape(-1)
        oc = out[r0:r1].reshape(-1)
        for p in w.parts:
            bs = p.kind.block
            if bs not in per_block:
                per_block[bs] = block_terms(xq, d, bs)
            isum_f, xd_f = per_block[bs]
            KERNELS[(bs, p.kind.offset)](
                xq.reshape(-1), isum_f, xd_f if p.kind.offset else dummy, d_f,
                p.qv, p.s, p.m if p.kind.offset else dummy, oc,
                r1 - r0, cols, w.padded_out, p.col0, p.nblocks, p.ngroups,
            )  # fmt: skip
    if w.valid_cols is not None:
        return np.ascontiguousarray(out[:, w.valid_cols])
    return out
