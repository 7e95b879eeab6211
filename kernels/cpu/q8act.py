"""int8 activations with integer dot products (AVX-512 VNNI): the cpu backend's ``q8`` mode.

``matmul_q8(x, w)`` computes y = x · Wᵀ like ``kernels.cpu.matmul.matmul`` but first
quantizes every row of x per block of 32 inputs to int8 with one float32 scale
(symmetric, like ggml's Q8_0), then takes each weight block's dot product as an exact
int32 sum with ``vpdpbusd``. Opt-in (``CpuBackend(activations="q8")``): it changes the
model's numbers slightly (docs/kernels-cpu.md, "int8 activations").

Why an LLVM intrinsic and not plain numba loops: numba promotes int32 products to
int64, and whether LLVM narrows them back to ``vpdpwssd``/``vpdpbusd`` depends on the
tile shape (measured: a 1×16 tile narrowed, a 2×16 tile of the same source compiled
to int64 ``vpmuldq``). ``_make_tile`` emits ``llvm.x86.avx512.vpdpbusd.512`` directly,
so the instruction is guaranteed, not hoped for.

``vpdpbusd`` multiplies unsigned bytes by signed bytes. Weights are stored as
``q + 128`` (uint8, any int8 value fits) and activations stay signed, so
Σ (q+128)·xq = Σ q·xq + 128·Σ xq; the correction uses the activation block's
integer sum, which the offset formats need anyway. All integer, all exact.

Reduction order (the batch-invariance contract), row r, output o, weight block b
of BS inputs (32, or 16 for Q6_K), d = the activation scale of the 32-block holding b:

    t = 0
    for each block b in order:
        i = Σ_{i in b} q[o, i] · xq[r, i]                   # exact int32, |i| < 2^24
        t = fma(f32(i), scale[b, o] * d, t)                  # s·d rounded, then one FMA
        t = fma(f32(Σ_{i in b} xq[r, i]) * d, offset[b, o], t)   # offset kinds

The FMAs are explicit ``llvm.fma`` calls and nothing has fast-math flags, so LLVM may not
contract or reorder anything else; the integer part is exact whatever order the
hardware sums it in. Rows never share any arithmetic, so a row's bits do not depend on
n or on the tile it lands in.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from echoline.kernels.cpu import weight_cache
from echoline.kernels.cpu.matmul import GROUP, PreparedMatrix, prepare
from echoline.kernels.cpu.numba_setup import njit, target_has  # numba flags set before numba loads
from echoline.kernels.cpu.relayout import Kind
from numba import types
from numba.core.extending import intrinsic

#: Activation quantization block (inputs per float32 scale), as ggml's Q8_0.
QBLOCK = 32
_U = np.uint64  # unsigned loop indices: no wraparound checks, so the loops vectorize
#: Row tiles (rows, 16-output vectors): 2·rows·vectors accumulators (float running sums and
#: integer dots) + vectors weight registers stay live. Measured (SmolLM2, one
#: process per set, ``ECHOLINE_Q8_TILES``): 4 vectors per pass at 3 rows made the 49152 x 576
#: head slower at 3 rows (0.60-0.65 ms) than at 4 (0.46-0.55); 3 x 2 took 0.49-0.52, and
#: whole 3-row forwards 0.3 ms less. Two vectors for 1 and 2 rows measured the same.
#: Reproduce: ``ECHOLINE_Q8_TILES=… python -m tools.cpu.bench_q8act --curve head MODEL.gguf``.
ROW_TILES = ((5, 2), (4, 2), (3, 2), (2, 4), (1, 4))
#: Rows of the tile that takes up the leftover rows of the main (next smaller) tile; 0: none.
ABSORB_ROWS = 5
if os.environ.get("ECHOLINE_Q8_TILES"):  # developer A/B only, e.g. "5x2a,4x2,3x4,2x4,1x4" ("a": absorbing)
    _tiles = os.environ["ECHOLINE_Q8_TILES"].split(",")
    ROW_TILES = tuple(tuple(int(v) for v in t.rstrip("a").split("x")) for t in _tiles)
    ABSORB_ROWS = next((int(t.split("x")[0]) for t in _tiles if t.endswith("a")), 0)
ROW_CHUNK = 64
#: 16-output vectors interleaved per weight stream (``vnni_layout`` says why).
INTERLEAVE = int(os.environ.get("ECHOLINE_Q8_INTERLEAVE", 2))  # env: developer A/B only
#: Inputs per K-quant superblock: the span of one "fac" scale factor (``factor_scales``).
SUPERBLOCK = 256
#: How block scales are stored (``scale_codec``): float32, float16, or factored.
CODECS = ("f32", "f16", "fac")
#: Weights in the fewest bits that hold them (``pack_layout``); 0 keeps a byte per weight.
PACKED = os.environ.get("ECHOLINE_Q8_PACKED", "1") != "0"  # env: developer A/B only
#: Software prefetch distance in bytes along each weight stream (0: none). Why: one-row
#: products stream weights from memory and the hardware prefetchers alone left them at
#: ~28 GB/s of the VM's ~45. A prefetch of every 64-byte line 1 KiB ahead, interleaved
#: A/B in one process (AMD EPYC Zen 5 VM, 2026-12-02, all layers' products, medians of 15):
#: Qwen 0.5B 0.86x the time at 1 row, 0.96x at 8; Qwen 1.5B 0.95x at 1 row, 0.94x at 4,
#: 0.98x at 16; 512 and 2048 bytes were in between. Prefetches change no arithmetic.
#: Reproduce: ``python -m tools.cpu.bench_prefetch --model M --rows 1 --prefetch 0,512,1024,2048``.
PREFETCH = int(os.environ.get("ECHOLINE_Q8_PREFETCH", "1024"))  # env: developer A/B only


#: How the bits above 4 of 5- and 6-bit weights are stored (``pack_layout``): "planes" (one
#: bit per weight and step in a 64-bit word, rebuilt with a mask register on AVX-512) or
#: "sliced" (one byte per weight position holding that bit of 8 steps, or those 2 bits of 4:
#: a shift and an and per step, for CPUs without mask registers). ``HIGH_BITS`` is the
#: host's choice (``high_bits``).
HIGH_LAYOUTS = ("planes", "sliced")


def high_bits() -> str:
    """"planes" where the kernels have AVX-512 VNNI, else "sliced" (why: ``pack_layout``);
    ``ECHOLINE_Q8_HIGH=planes|sliced`` forces one (developer A/B; same bits either way)."""
    forced = os.environ.get("ECHOLINE_Q8_HIGH", "")
    if forced in HIGH_LAYOUTS:
        return forced
    return "planes" if vnni_available() else "sliced"


def high_for(block: int, bits: int, high: str) -> str:
    """The high-bit layout a part of ``bits``-bit weights in blocks of ``block`` inputs gets:
    "sliced" only where a block's steps fill whole bytes (5 bits in blocks of 32, 6 bits in
    blocks of 16 or 32), so it takes the planes' bytes; else "planes" (e.g. a Q6_K matrix
    whose values fit 5 bits: 4 steps would fill half a byte)."""
    if high == "sliced" and bits in (5, 6) and 8 // (bits - 4) <= block // 4:
        return "sliced"
    return "planes"


def vnni_available() -> bool:
    """True when the code numba generates may use AVX-512 VNNI (and BW): the host CPU's
    features, or those of ``NUMBA_CPU_NAME`` when it names another."""
    return target_has("avx512vnni") and target_has("avx512bw")


def q8_available() -> bool:
    """True when the int8 kernels can run: with VNNI (``vpdpbusd``), or with AVX2 (the same
    integer dot from ``vpmaddubsw`` and ``vpmaddwd``, ``_dot256``: the same bits)."""
    return vnni_available() or target_has("avx2")


def dot_form() -> str | None:
    """Which form of the integer dot the int8 kernels are generated with, from the target's
    features alone: "avx512vnni" (512-bit ``vpdpbusd``), "avxvnni" (the VEX-encoded 256-bit
    one, Intel client cores), "avx2" (``vpmaddubsw`` + ``vpmaddwd``), or None (no int8
    kernels). All give the same bits; a form is never picked without its features."""
    if vnni_available():
        return "avx512vnni"
    if target_has("avxvnni") and target_has("avx2"):
        return "avxvnni"
    return "avx2" if target_has("avx2") else None


# --------------------------------------------------------------------------- activations


@intrinsic
def _quantize_block(typingctx, xr, qr, o, db):
    """qr[o:o+32] = int8(rint(xr[o:o+32] / db)), one <32 x float> expression.

    Why an intrinsic: the same loop in numba stayed scalar (one ``vdivss`` per element,
    and ``np.rint`` of a float32 went through float64), because numba cannot tell LLVM
    that the int8 output does not alias the float32 input; 16 rows of Qwen 1.5B's
    8960-wide down projection took 130 µs to quantize, 16 µs this way (now: ``python -m
    tools.cpu.bench_rowops``; the old-vs-new forwards: docs/history/cpu-kernels.md). rint is
    (v + 1.5·2^23) − 1.5·2^23 in float32, which rounds half to even exactly as rint does
    for |v| < 2^22 (here |v| ≤ 127·(1 + 2^-23), up to ~190 for blocks of deep subnormals);
    the division is IEEE either way, so for finite x every bit is what the scalar loop gave
    (``tests/test_cpu_q8act.py``). A NaN in a block now makes its scale NaN (the integer
    maximum ranks it highest) where the float loop skipped it: the NaN reaches the output.
    """
    # Consecutive elements are read as one vector: only contiguous float32 in, int8 out
    # (anything else is a typing error, never a wrong read).
    if not (isinstance(xr, types.Array) and xr.dtype == types.float32 and xr.ndim == 1 and xr.layout == "C"
            and isinstance(qr, types.Array) and qr.dtype == types.int8 and qr.ndim == 1 and qr.layout == "C"):
        return None
    sig = types.void(xr, qr, o, db)

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        xr_, qr_, o_, db_ = args
        xp = context.make_array(signature.args[0])(context, builder, xr_).data
        qp = context.make_array(signature.args[1])(context, builder, qr_).data
        i32 = ir.IntType(32)
        vf = ir.VectorType(ir.FloatType(), QBLOCK)
        v = builder.load(builder.bitcast(builder.gep(xp, [o_]), vf.as_pointer()), align=4)
        undef = ir.Constant(vf, None)
        dv = builder.shuffle_vector(builder.insert_element(undef, db_, ir.Constant(i32, 0)), undef,
                                    ir.Constant(ir.VectorType(i32, QBLOCK), [0] * QBLOCK))  # fmt: skip
        magic = ir.Constant(vf, [12582912.0] * QBLOCK)  # 1.5 * 2^23
        r = builder.fsub(builder.fadd(builder.fdiv(v, dv), magic), magic)
        q = builder.trunc(builder.fptosi(r, ir.VectorType(i32, QBLOCK)), ir.VectorType(ir.IntType(8), QBLOCK))
        builder.store(q, builder.bitcast(builder.gep(qp, [o_]), q.type.as_pointer()), align=1)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False)
def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (n, cols) float32 → (xq int8 (n, cols), d float32 (n, cols/32)).

    Per block of 32: d = max|x| / 127, xq = rint(x / d) (0 for an all-zero block).
    Unlike ggml's Q8_0, d stays float32 (not rounded to f16) and the division is a
    true division, not a multiply by 1/d: it costs nothing measurable here and is
    one rounding fewer. Each row is computed on its own, in a fixed order. max|x| is
    an integer maximum of the sign-cleared bits (the same number for finite x, and a
    loop LLVM vectorizes; a float maximum would need fast-math to).
    """
    n, cols = x.shape
    nb = cols // QBLOCK
    xq = np.empty((n, cols), dtype=np.int8)
    d = np.empty((n, nb), dtype=np.float32)
    top = np.empty(nb, dtype=np.int32)
    amax = top.view(np.float32)
    for r in range(n):
        xr = x[r]
        qr = xq[r]
        bits = xr.view(np.int32)
        for b in range(_U(0), _U(nb)):
            m = np.int32(0)
            for i in range(_U(0), _U(QBLOCK)):
                m = max(m, bits[b * _U(QBLOCK) + i] & np.int32(0x7FFFFFFF))
            top[b] = m
        for b in range(nb):
            db = amax[b] / np.float32(127.0)
            d[r, b] = db
            o = _U(b * QBLOCK)
            if db == 0:
                for i in range(_U(0), _U(QBLOCK)):
                    qr[o + i] = 0
            else:
                _quantize_block(xr, qr, o, db)
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


@njit(cache=True, nogil=True, boundscheck=False)
def activation_terms(x: np.ndarray, with16: bool):
    """Everything the kernels read of x, in one call (a matrix product is ~10-100 µs, so
    per-call overhead counts): xq and d flat, and the block terms for 32- and (when a
    Q6_K part needs them) 16-input weight blocks."""
    xq, d = quantize_rows(x)
    i32, x32 = block_terms(xq, d, 32)
    if with16:
        i16, x16 = block_terms(xq, d, 16)
    else:
        i16, x16 = i32[:0], x32[:0]
    return xq.reshape(-1), d.reshape(-1), i32, x32, i16, x16


# --------------------------------------------------------------------------- VNNI block dot


def _dot256(builder, bits: int, avxvnni: bool):
    """``vpdpbusd``'s exact result on one 256-bit half (8 outputs): acc + Σ over each lane's 4
    bytes of u8 weight × s8 activation. With AVX-VNNI it is ``vpdpbusd`` itself (the VEX form);
    with AVX2 it is ``vpmaddubsw`` (byte pairs to i16) then ``vpmaddwd`` by ones (i16 pairs to
    i32).

    Why the AVX2 form is exact: ``vpmaddubsw`` saturates at ±32767, so the operands must keep
    every pair sum below that. Activations are in [-127, 127]. Weights of 4-6 bits are ≤ 63
    (pairs ≤ 16,002). Weights of 8 bits are q + 128 (up to 255): for those the kernel takes |q|
    times x with q's sign (``vpsignb``: pairs ≤ 2·128·127 = 32,512) and adds 128·Σx, which is
    Σ (q + 128)·x. Integer sums, so every output has the same bits as on an AVX-512 VNNI CPU.
    """
    from llvmlite import ir
    from numba.core import cgutils

    b32, d8 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(32), 8)
    mod = builder.module
    if avxvnni:
        # the <8 x i32> operand form, auto-upgraded by newer LLVMs as the 512-bit one is
        vpdpbusd = cgutils.get_or_insert_function(mod, ir.FunctionType(d8, [d8, d8, d8]), "llvm.x86.avx512.vpdpbusd.256")

        def dot_vnni(acc, w, x):
            return builder.call(vpdpbusd, [acc, builder.bitcast(w, d8), builder.bitcast(x, d8)])

        return dot_vnni
    pairs, widen = _pair_sums(builder)
    psign = cgutils.get_or_insert_function(mod, ir.FunctionType(b32, [b32, b32]), "llvm.x86.avx2.psign.b")
    babs = cgutils.get_or_insert_function(mod, ir.FunctionType(b32, [b32, ir.IntType(1)]), "llvm.abs.v32i8")
    ones8 = ir.Constant(b32, [1] * 32)
    flip = ir.Constant(b32, [-128] * 32)  # u XOR 0x80 = q (as a signed byte)

    def quads(a, b):  # Σ of each 4 bytes' u8·s8 products, 8 lanes
        return widen(pairs(a, b))

    def dot(acc, w, x):
        if bits < 8:
            return builder.add(acc, quads(w, x))
        q = builder.xor(w, flip)
        qx = quads(builder.call(babs, [q, ir.Constant(ir.IntType(1), 0)]), builder.call(psign, [x, q]))
        sx = quads(ones8, x)
        return builder.add(acc, builder.add(qx, builder.shl(sx, ir.Constant(d8, [7] * 8))))

    return dot


#: AVX2 (``_pair_sums``): steps of 4 inputs whose ``vpmaddubsw`` pair sums may add up in
#: 16-bit lanes before widening, per weight width. A pair is at most 2·(2^bits − 1)·127
#: (u = q + bias < 2^bits, |xq| ≤ 127): 3,810 for 4 bits (8 steps: 30,480), 7,874 for 5
#: (4 steps: 31,496), 16,002 for 6 (2 steps: 32,004), each below 32,767, so every 16-bit sum
#: is exact. 8-bit weights take the sign trick (``_dot256``) step by step.
PAIR_RUN = {4: 8, 5: 4, 6: 2}


def _pair_sums(builder):
    """(pairs, widen) for AVX2: ``pairs(w, x)`` is ``vpmaddubsw`` (u8·s8 byte pairs summed to 16
    lanes of i16), ``widen(s)`` is ``vpmaddwd`` by ones (i16 pairs to 8 lanes of i32). Summing
    several steps' pairs with ``vpaddw`` before one widening costs 2 instructions a step
    instead of 3, on the multiply ports that bound AVX2's int8 products."""
    from llvmlite import ir
    from numba.core import cgutils

    b32, w16, d8 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(16), 16), ir.VectorType(ir.IntType(32), 8)
    mod = builder.module
    maddubs = cgutils.get_or_insert_function(mod, ir.FunctionType(w16, [b32, b32]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = cgutils.get_or_insert_function(mod, ir.FunctionType(d8, [w16, w16]), "llvm.x86.avx2.pmadd.wd")
    ones16 = ir.Constant(w16, [1] * 16)

    def pairs(w, x):
        return builder.call(maddubs, [w, x])

    def widen(s):
        return builder.call(maddwd, [s, ones16])

    return pairs, widen


def _halves(builder, dot256):
    """A 16-output dot (<16 x i32> accumulator, 64 weight and activation bytes) from a 256-bit
    one, applied to each half."""
    from llvmlite import ir

    i32 = ir.IntType(32)
    v16 = ir.VectorType(i32, 16)
    b64 = ir.VectorType(ir.IntType(8), 64)

    def half(vec, lanes: int, h: int):
        return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(i32, lanes), list(range(lanes * h, lanes * h + lanes))))

    def dot(acc, w, x):
        wb, xb = builder.bitcast(w, b64), builder.bitcast(x, b64)
        parts = [dot256(half(acc, 8, h), half(wb, 32, h), half(xb, 32, h)) for h in (0, 1)]
        return builder.shuffle_vector(parts[0], parts[1], ir.Constant(v16, list(range(16))))

    return dot


def _make_tile(rows: int, vecs: int, block: int, offset: bool, bits: int = 8, bias: int = 128, codec: str = "f32",
               high: str = "planes"):  # fmt: skip
    """An intrinsic computing ``rows`` rows × 16·``vecs`` outputs of one weight group, all blocks.

    ``bits``/``bias``: how the weights are stored (``pack_layout``): 8 is one byte per
    weight holding q + 128; 4, 5 and 6 hold u = q + ``bias`` in 0…2^bits − 1, two steps'
    low nibbles per byte plus one bit plane per bit above 4. Either way the integer dot is
    Σ u·xq − bias·Σ xq = Σ q·xq exactly, so every layout gives the same bits.
    ``codec``: how the block scales (and offsets) are stored (``scale_codec``); each rebuilds
    the float32 scale exactly, so again the same bits. ``high``: how the bits above 4 are
    stored (``HIGH_LAYOUTS``), the same values either way.

    Arguments: qv, qbase (the first byte of the tile's first 16-output vector: per block
    (block/4, 16 outputs, 4 inputs) of q+128; the next vector nblocks·block·16 bytes on), xq, xbase (row r0's first input), xstride (inputs per row),
    xsum, xd, abase (index of row r0, block 0 in those (n, nblocks) arrays), astride,
    d, dbase (row r0's first activation-scale index), dstride, s, m, sbase (the group's
    first scale), nblocks, out, obase (row r0's first output), ldo, sd, md, sdbase (the
    "fac" codec's per-superblock factors and the group's first one).

    Why one intrinsic for the whole block loop: the first version did one block per
    call and kept the running sums in memory, so the float combine (load, convert,
    two FMAs, store) cost as much as the integer work and 17-row products were slower
    than the float32 kernel in whole forwards. Here the loop is IR with the running
    sums as phi nodes, so they stay in registers: per block and output vector, one
    integer accumulator per row (``vpdpbusd`` over block/4 weight vectors, each loaded
    once for all rows), then the combine of the module docstring. Live registers:
    4·rows running sums + rows integer accumulators + one weight vector (+ splats).
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.core.extending import intrinsic

    form = dot_form()  # the AVX-512 VNNI, AVX-VNNI or AVX2 form of the same integer dot
    vnni, avxvnni = form == "avx512vnni", form == "avxvnni"
    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    # Lanes per IR vector: 16 (one 512-bit register with AVX-512, two 256-bit ones else), or
    # 8 (one 256-bit register) for AVX2's tiles of several rows, which then take one register
    # half at a time (the block loop below says why). Measured in one process, all layers'
    # products, AMD EPYC as Haswell / Alder Lake (2026-12-03, ``docs/kernels-cpu.md``): AVX2 at
    # 16 rows 0.80-0.88x the time (Qwen 0.5B and 1.5B), at one row 8-lane IR ran 7-13 %
    # slower with the same instruction counts; AVX-VNNI (one instruction a dot, fewer live
    # temporaries) ran 4 % slower at 16 rows with 8 lanes, so it keeps 16.
    lanes = 16 if vnni or avxvnni or rows == 1 else 8
    halves = 16 // lanes  # register vectors per 16-output vector
    v16 = ir.VectorType(i32, 16)
    vi, vf = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
    vb = ir.VectorType(ir.IntType(8), 4 * lanes)
    shift = {32: 0, 16: 1}[block]  # activation-scale index = block >> shift
    if bits not in (4, 5, 6, 8) or (bits == 8) != (bias == 128):
        raise ValueError(f"unsupported weight storage: {bits} bits, bias {bias}")
    planes = bits - 4 if bits < 8 else 0
    if high not in HIGH_LAYOUTS:
        raise ValueError(f"unknown high-bit layout {high!r}")
    if high != high_for(block, bits, high):
        raise ValueError(f"no sliced layout for {bits}-bit weights in blocks of {block}")
    run_h = 8 // planes if planes else 1  # "sliced": steps per high-bit byte
    sb_bytes = block * 16 * INTERLEAVE * bits // 8  # one stream's bytes per weight block
    nib_bytes = block * 16 * INTERLEAVE // 2  # of which nibbles (packed layouts)
    if codec not in CODECS:
        raise ValueError(f"unknown scale codec {codec!r}")
    sup_shift = (SUPERBLOCK // block).bit_length() - 1  # block -> superblock index ("fac")

    def c64(k: int):
        return ir.Constant(i64, k)

    @intrinsic
    def tile(typingctx, qv, qbase, xq, xbase, xstride, xsum, xd, abase, astride, d, dbase, dstride, s, m, sbase,
             nblocks, out, obase, ldo, sd, md, sdbase):  # fmt: skip
        sig = types.void(qv, qbase, xq, xbase, xstride, xsum, xd, abase, astride, d, dbase, dstride, s, m, sbase,
                         nblocks, out, obase, ldo, sd, md, sdbase)  # fmt: skip

        def codegen(context, builder, signature, args):
            (qv_, qbase_, xq_, xbase_, xstride_, xsum_, xd_, abase_, astride_, d_, dbase_, dstride_, s_, m_,
             sbase_, nblocks_, out_, obase_, ldo_, sd_, md_, sdbase_) = args  # fmt: skip
            tys = signature.args

            def data(k: int, val):
                return context.make_array(tys[k])(context, builder, val).data

            qp, xp, sump, xdp, dp, sp, mp, op = (
                data(0, qv_), data(2, xq_), data(5, xsum_), data(6, xd_), data(9, d_), data(12, s_),
                data(13, m_), data(16, out_),
            )  # fmt: skip
            sdp, mdp = data(19, sd_), data(20, md_)

            def splat_of(vec_t, scalar):
                z = ir.Constant(vec_t, None)
                mask = ir.Constant(ir.VectorType(i32, vec_t.count), [0] * vec_t.count)
                return builder.shuffle_vector(builder.insert_element(z, scalar, ir.Constant(i32, 0)), z, mask)

            def vload(ptr, idx, vec_t, align):
                return builder.load(builder.bitcast(builder.gep(ptr, [idx]), vec_t.as_pointer()), align=align)

            if vnni:
                # The <16 x i32> operand form: LLVM 22 auto-upgrades it, older LLVMs only know it.
                vpdpbusd = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(v16, [v16, v16, v16]), "llvm.x86.avx512.vpdpbusd.512"
                )

                def dot(acc_, w_, x_):
                    return builder.call(vpdpbusd, [acc_, builder.bitcast(w_, v16), builder.bitcast(x_, v16)])
            elif lanes == 8:
                dot = _dot256(builder, bits, avxvnni)
                pairs, widen = _pair_sums(builder)
            else:
                dot = _halves(builder, _dot256(builder, bits, avxvnni))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), f"llvm.fma.v{lanes}f32")
            xrow = [builder.add(xbase_, builder.mul(xstride_, c64(r))) for r in range(rows)]
            arow = [builder.add(abase_, builder.mul(astride_, c64(r))) for r in range(rows)]
            drow = [builder.add(dbase_, builder.mul(dstride_, c64(r))) for r in range(rows)]
            low4 = ir.Constant(vb, [0x0F] * 4 * lanes)
            four = ir.Constant(vb, [4] * 4 * lanes)
            nothing = ir.Constant(vb, [0] * 4 * lanes)
            word_t = ir.IntType(4 * lanes)  # one plane bit per weight byte of a register vector
            mask_t = ir.VectorType(ir.IntType(1), 4 * lanes)

            def weights(qb, pstride, j: int, unit: tuple[int, int], nib: dict):
                """Step j's weight bytes (4 inputs × ``lanes`` outputs) of ``unit`` = (16-output
                vector v, register half h), as 4·lanes bytes."""
                v, h = unit
                at = builder.mul(pstride, c64(v // iv))
                if bits == 8:
                    return vload(qb, builder.add(at, c64(64 * (iv * j + v % iv) + 4 * lanes * h)), vb, 1)
                if j % 2 == 0:  # one load holds steps j (low nibbles) and j + 1 (high nibbles)
                    nib[unit] = vload(qb, builder.add(at, c64(64 * (iv * (j // 2) + v % iv) + 4 * lanes * h)), vb, 1)
                    u = builder.and_(nib[unit], low4)
                else:
                    u = builder.lshr(nib[unit], four)
                if planes and high == "sliced":
                    # byte k of the group's high vector holds bits 4.. of byte k of run_h steps,
                    # step t's at bit t·planes: shift them to bit 4 and keep them (a 16-bit
                    # shift on AVX2; the mask drops what crossed from the neighbouring byte)
                    t = j % run_h
                    if t == 0:
                        off = c64(nib_bytes + 64 * ((j // run_h) * iv + v % iv) + 4 * lanes * h)
                        nib[(unit, "high")] = vload(qb, builder.add(at, off), vb, 1)
                    hv, sh = nib[(unit, "high")], t * planes
                    if sh < 4:
                        hv = builder.shl(hv, ir.Constant(vb, [4 - sh] * 4 * lanes))
                    elif sh > 4:
                        hv = builder.lshr(hv, ir.Constant(vb, [sh - 4] * 4 * lanes))
                    keep = ((1 << planes) - 1) << 4
                    return builder.or_(u, builder.and_(hv, ir.Constant(vb, [keep] * 4 * lanes)))
                for pl in range(planes):  # bit 4 + pl of each byte, one bit per byte in a 64-bit word
                    off = c64(nib_bytes + 8 * ((pl * (block // 4) + j) * iv + v % iv) + lanes // 2 * h)
                    word = builder.load(builder.bitcast(builder.gep(qb, [builder.add(at, off)]), word_t.as_pointer()),
                                        align=1)  # fmt: skip
                    mask = builder.bitcast(word, mask_t)
                    u = builder.or_(u, builder.select(mask, ir.Constant(vb, [1 << (4 + pl)] * 4 * lanes), nothing))
                return u

            def block_scale(vals, factors, sb, sup, unit: tuple[int, int]):
                """The float32 scales (or offsets) of ``unit``'s outputs for this block, rebuilt exactly."""
                lane0 = c64(16 * unit[0] + lanes * unit[1])
                at = builder.add(sb, lane0)
                if codec == "f32":
                    return vload(vals, at, vf, 4)
                if codec == "f16":  # float16 values widen exactly
                    h = builder.load(builder.bitcast(builder.gep(vals, [at]), ir.VectorType(ir.HalfType(), lanes).as_pointer()),
                                     align=2)  # fmt: skip
                    return builder.fpext(h, vf)
                # "fac": a small integer per block times a float32 factor per superblock; the
                # product is exact (scale_codec checks every one), so it is the stored scale
                k = builder.load(builder.bitcast(builder.gep(vals, [at]), ir.VectorType(ir.IntType(8), lanes).as_pointer()),
                                 align=1)  # fmt: skip
                f = vload(factors, builder.add(sup, lane0), vf, 4)
                return builder.fmul(f, builder.sitofp(k, vf))

            units = [(v, h) for v in range(vecs) for h in range(halves)]
            zero = ir.Constant(vf, [0.0] * lanes)
            pre = builder.basic_block
            loop = builder.append_basic_block("q8_blocks")
            done = builder.append_basic_block("q8_done")
            builder.branch(loop)
            builder.position_at_end(loop)
            b = builder.phi(i64)
            b.add_incoming(c64(0), pre)
            acc = [{u: builder.phi(vf) for u in units} for _ in range(rows)]
            for row in acc:
                for ph in row.values():
                    ph.add_incoming(zero, pre)
            iv = INTERLEAVE
            pstride = builder.mul(nblocks_, c64(sb_bytes))  # bytes of one stream's blocks
            qb = builder.gep(qp, [builder.add(qbase_, builder.mul(b, c64(sb_bytes)))])
            if PREFETCH:
                pf = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), [qb.type, i32, i32, i32]), "llvm.prefetch.p0"
                )
                for st in range(max(1, vecs // INTERLEAVE)):
                    at = builder.mul(pstride, c64(st))
                    for k in range(0, sb_bytes, 64):
                        builder.call(pf, [builder.gep(qb, [builder.add(at, c64(PREFETCH + k))]),
                                          ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            xb = builder.mul(b, c64(block))
            sb = builder.add(sbase_, builder.mul(b, c64(GROUP)))
            db = builder.lshr(b, c64(shift)) if shift else b
            start, dr, xdr = [], [], []
            for r in range(rows):
                ai = builder.add(arow[r], b)
                # start from -bias·Σxq: the sum of (q+bias)·xq then lands on Σ q·xq exactly
                isum = builder.load(builder.gep(sump, [ai]))
                start.append(splat_of(vi, builder.mul(isum, ir.Constant(i32, -bias))) if bias else ir.Constant(vi, [0] * lanes))
                dr.append(splat_of(vf, builder.load(builder.gep(dp, [builder.add(drow[r], db)]))))
                xdr.append(splat_of(vf, builder.load(builder.gep(xdp, [ai]))) if offset else None)

            def x_at(r: int, j: int):
                """Row r's 4 activations of step j, repeated in every lane."""
                p = builder.gep(xp, [builder.add(xrow[r], builder.add(xb, c64(4 * j)))])
                return builder.bitcast(splat_of(vi, builder.load(builder.bitcast(p, i32.as_pointer()), align=1)), vb)

            sup = builder.add(sdbase_, builder.mul(builder.lshr(b, c64(sup_shift)), c64(GROUP)))
            new = [{} for _ in range(rows)]

            def combine(unit, iacc_r: list):
                sv = block_scale(sp, sdp, sb, sup, unit)
                mv = block_scale(mp, mdp, sb, sup, unit) if offset else None
                for r in range(rows):
                    exact = builder.sitofp(iacc_r[r], vf)  # |value| < 2^24: exact
                    t = builder.call(fma, [exact, builder.fmul(sv, dr[r]), acc[r][unit]])
                    if offset:
                        t = builder.call(fma, [xdr[r], mv, t])
                    new[r][unit] = t

            nib: dict = {}
            if lanes == 16:
                # Steps outer: each step's weight vectors are loaded once for every row, and the
                # 32 registers hold all rows' accumulators.
                iacc = [{u: start[r] for u in units} for r in range(rows)]
                for j in range(block // 4):
                    w = {u: weights(qb, pstride, j, u, nib) for u in units}
                    for r in range(rows):
                        xv = x_at(r, j)
                        for u in units:
                            iacc[r][u] = dot(iacc[r][u], w[u], xv)
                for u in units:
                    combine(u, [iacc[r][u] for r in range(rows)])
            else:
                # Register halves outer, steps inner: with 16 registers, keeping every half's
                # accumulators live through the steps (the order above) spilled most of them to
                # the stack in every block (Qwen 1.5B's Q4_K 5-row tile: 365 stack accesses per
                # 160 dots); one half at a time needs rows accumulators and a weight vector.
                # Weights of 4-6 bits keep ``vpmaddubsw``'s pair sums in 16-bit lanes over
                # ``run`` steps and widen them once (``_pair_sums``), exact below 32,767.
                run = PAIR_RUN.get(bits, 1)
                for u in units:
                    ia = list(start)
                    for j0 in range(0, block // 4, run):
                        part = [None] * rows
                        for j in range(j0, min(j0 + run, block // 4)):
                            w = weights(qb, pstride, j, u, nib)
                            for r in range(rows):
                                if run == 1:
                                    ia[r] = dot(ia[r], w, x_at(r, j))
                                else:
                                    pr = pairs(w, x_at(r, j))
                                    part[r] = pr if part[r] is None else builder.add(part[r], pr)
                        if run > 1:
                            ia = [builder.add(ia[r], widen(part[r])) for r in range(rows)]
                    combine(u, ia)
            bn = builder.add(b, c64(1))
            end = builder.basic_block
            b.add_incoming(bn, end)
            for r in range(rows):
                for u in units:
                    acc[r][u].add_incoming(new[r][u], end)
            builder.cbranch(builder.icmp_unsigned("<", bn, nblocks_), loop, done)
            builder.position_at_end(done)
            for r in range(rows):
                orow = builder.add(obase_, builder.mul(ldo_, c64(r)))
                for v, h in units:
                    dst = builder.gep(op, [builder.add(orow, c64(16 * v + lanes * h))])
                    builder.store(new[r][(v, h)], builder.bitcast(dst, vf.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_ARGS = "qv, qb, sb, oc, r0, xq, xsum, xd, d, s, m, out, cols, ldo, nblocks, nbq, sd, md, sdb"


def kernel_source(block: int, offset: bool, bits: int = 8, bias: int = 128, codec: str = "f32", high: str = "planes") -> str:
    """Python source of one (weight block, offset) kernel's module (``codegen.load_generated``).

    Why a module and not a closure: numba recompiled the closure over this process's
    intrinsics in every process (1.2 s a kernel, ~3.5 s of Gemma's first reply in q8 mode).
    The text names this file's hash, so editing the IR builder rewrites the module and so
    invalidates numba's cache. Row plan as ``kernels.cpu.codegen``'s: tiles of the main
    size (4), with a tile one row larger (5) taking up the leftover rows when there are
    enough main passes to absorb them (9 = 5 + 4, 17 = 5 + 4 + 4 + 4; 16 stays 4 × 4), then
    the smaller tiles largest first. Which tile computes a row never changes its bits: rows
    share no arithmetic.
    """
    if any(v % INTERLEAVE or GROUP % (16 * v) for _, v in ROW_TILES):
        raise ValueError("each tile's vectors must be whole weight streams dividing the group")
    sizes = [r for r, _ in ROW_TILES]
    if sizes != sorted(set(sizes), reverse=True) or sizes[-1] != 1:
        raise ValueError("row tiles must have distinct row counts, largest first, down to 1")
    # The absorbing tile, when there is one, is the largest and one row more than the next.
    absorb = ABSORB_ROWS > 0
    if absorb and not (len(sizes) > 1 and sizes[0] == ABSORB_ROWS == sizes[1] + 1):
        raise ValueError("the absorbing tile must be the largest, one row more than the next")
    main = sizes[1] if absorb else sizes[0]
    rest = sizes[2:] if absorb else sizes[1:]
    stamp = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    L = [
        "# generated by kernels/cpu/q8act.py; do not edit",
        f"# q8act.py {stamp}, tiles {ROW_TILES}, absorbing {ABSORB_ROWS}, interleave {INTERLEAVE}, {bits} bits, bias {bias}, scales {codec}, high bits {high}"
        + (f", prefetch {PREFETCH}" if PREFETCH else ""),
        "from echoline.kernels.cpu.numba_setup import njit, prange",
        "from echoline.kernels.cpu.q8act import GROUP, QBLOCK, _make_tile",
        "",
    ]
    for rows, vecs in ROW_TILES:
        L += [
            f"t{rows} = _make_tile({rows}, {vecs}, {block}, {offset}, {bits}, {bias}, {codec!r}, {high!r})",
            "",
            "",
            '@njit(inline="always", nogil=True, boundscheck=False)',
            f"def p{rows}({_ARGS}):",
            f"    for c in range(0, GROUP, {16 * vecs}):",
            f"        t{rows}(qv, qb + c * nblocks * {block * bits // 8}, xq, r0 * cols, cols, xsum, xd, r0 * nblocks, nblocks, d,",
            "             r0 * nbq, nbq, s, m, sb + c, nblocks, out, r0 * ldo + oc + c, ldo, sd, md, sdb + c)",
            "",
        ]
    L += [
        "",
        "@njit(parallel=True, cache=True, nogil=True, boundscheck=False)",
        "def kernel(xq, xsum, xd, d, qv, s, m, out, n, cols, ldo, col0, nblocks, ngroups, sd, md):",
        "    nbq = cols // QBLOCK",
        f"    gstride = nblocks * {block * bits // 8} * GROUP",
        f"    nq = n // {main}",
        f"    nr = n - {main} * nq",
        "    nabs = nr if nq >= nr else 0",
        "    for g in prange(ngroups):",
        "        qb = g * gstride",
        "        sb = g * nblocks * GROUP",
        f"        sdb = g * (nblocks >> {(SUPERBLOCK // block).bit_length() - 1}) * GROUP",
        "        oc = col0 + g * GROUP",
        "        r0 = 0",
    ]
    if absorb:
        big = sizes[0]
        L += [f"        while r0 + {big} <= n and r0 < nabs * {big}:", f"            p{big}({_ARGS})",
              f"            r0 += {big}"]  # fmt: skip
    for rows in [main, *rest]:
        L += [f"        while r0 + {rows} <= n:", f"            p{rows}({_ARGS})", f"            r0 += {rows}"]
    return "\n".join(L) + "\n"


#: The weight-block kinds with a kernel: (inputs per weight block, offset term).
KINDS_Q8 = frozenset((bs, off) for bs in (32, 16) for off in (False, True))
#: (weight block, offset, bits, bias, codec, high) → kernel, loaded on first use (``kernel_for``).
KERNELS: dict[tuple[int, bool, int, int, str, str], Callable] = {}
_DUMMY = np.zeros(1, np.float32)  # the offset arguments of kinds without an offset


def kernel_asm(block: int, offset: bool, bits: int = 8, bias: int = 128, codec: str = "f32", high: str = "planes") -> str:
    """Assembly of the kernel for every signature it has run with, compiled afresh.

    Why afresh: a kernel loaded from numba's disk cache has no assembly to show, so a check
    of the generated code (tests, ``bench_q8act``) compiles an uncached copy.
    """
    kern = kernel_for(block, offset, bits, bias, codec, high)
    fresh = njit(parallel=True, nogil=True, boundscheck=False)(kern.py_func)
    for sig in kern.signatures:
        fresh.compile(sig)
    return "".join(fresh.inspect_asm(sig) for sig in kern.signatures)


def kernel_for(block: int, offset: bool, bits: int = 8, bias: int = 128, codec: str = "f32", high: str = "planes") -> Callable:
    """The compiled kernel for a weight-block kind and storage (written, imported and cached
    on first use)."""
    high = high_for(block, bits, high)  # one kernel where the layouts coincide
    key = (block, bool(offset), bits, bias, codec, high)
    fn = KERNELS.get(key)
    if fn is None:
        from echoline.kernels.cpu.codegen import load_generated

        name = f"echoline_q8_{block}_{int(offset)}_b{bits}_{bias}_{codec}" + (f"_pf{PREFETCH}" if PREFETCH else "")
        name += "_sliced" if high == "sliced" else ""
        fn = load_generated(name, lambda: kernel_source(block, bool(offset), bits, bias, codec, high))
        KERNELS[key] = fn
    return fn


# --------------------------------------------------------------------------- weights


@dataclass
class Q8Part:
    """One part of a ``PreparedMatrix`` in the VNNI layout."""

    kind: Kind
    qv: np.ndarray  # uint8 flat (ngroups, 4/INTERLEAVE, nblocks, bytes per stream block): pack_layout
    s: np.ndarray  # float32 flat (ngroups, nblocks, GROUP), shared with the source Part
    m: np.ndarray  # same, or a 1-element dummy
    col0: int
    ngroups: int
    nblocks: int
    bits: int = 8  # bits per stored weight (pack_layout)
    bias: int = 128  # stored value = q + bias
    codec: str = "f32"  # how s and m are stored (scale_codec): float32, float16 bits (uint16), int8 factors
    sd: np.ndarray = field(default_factory=lambda: _DUMMY)  # "fac": float32 (ngroups, nblocks·block/SUPERBLOCK, GROUP) scale factors
    md: np.ndarray = field(default_factory=lambda: _DUMMY)  # the offsets' factors, likewise
    high: str = "planes"  # how bits above 4 are stored (pack_layout, HIGH_LAYOUTS)


@dataclass
class Q8Matrix:
    in_features: int
    out_features: int
    padded_out: int
    parts: list[Q8Part]
    valid_cols: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return sum(p.qv.nbytes + p.s.nbytes + p.m.nbytes + p.sd.nbytes + p.md.nbytes for p in self.parts)


def vnni_layout(q: np.ndarray, ngroups: int, nblocks: int, block: int) -> np.ndarray:
    """Part.q (g, b, i, o) int8 → (g, p, b, i/4, o', i%4) uint8 holding q + 128 (a flip of
    the sign bit), where the group's 4 vectors of 16 outputs form 4/INTERLEAVE streams p
    of INTERLEAVE vectors each, o = 16·INTERLEAVE·p + o'.

    Why streams: a tile streams its own vectors from memory on a group's first pass.
    With all 4 vectors interleaved per block, a 2-vector tile read half of every 256-byte
    run, and SmolLM2's 5-row products cost 3.3 ms more than one row's while the next four
    rows cost 1.0 ms (``op_profile``, context 1,300). Pairs fixed that; four vectors per
    stream measured the same at one row and slower at 4-17 rows (``ECHOLINE_Q8_INTERLEAVE``).
    """
    iv = INTERLEAVE
    q7 = q.reshape(ngroups, nblocks, block // 4, 4, 4 // iv, 16 * iv)  # (g, b, j, i%4, p, o')
    out = np.empty((ngroups, 4 // iv, nblocks, block // 4, 16 * iv, 4), dtype=np.uint8)
    out[...] = q7.view(np.uint8).transpose(0, 4, 1, 2, 5, 3)
    out ^= np.uint8(0x80)
    return out.reshape(-1)


def storage_for(q: np.ndarray) -> tuple[int, int]:
    """(bits, bias): the narrowest storage holding every q as u = q + bias in 0…2^bits − 1.

    Q4_0/Q4_1/Q4_K values fit 4 bits, Q5_* 5, Q6_K 6, Q8_0 needs 8. Chosen from the values,
    not the type name, so any matrix gets the smallest form that is exact for it.
    """
    lo, hi = (int(q.min()), int(q.max())) if q.size else (0, 0)
    for bits in (4, 5, 6):
        for bias in (0, 1 << (bits - 1)):
            if lo + bias >= 0 and hi + bias < (1 << bits):
                return bits, bias
    return 8, 128


def pack_layout(qv: np.ndarray, ngroups: int, nblocks: int, block: int, bits: int, bias: int,
                high: str = "planes") -> np.ndarray:  # fmt: skip
    """The 8-bit VNNI layout (``vnni_layout``) → ``bits`` per weight, same streams and blocks.

    Why: one-row decode streams every weight once, so its speed is bytes over memory
    bandwidth; 8 bits per 4-bit weight made the 1.5B model's Q4_K layers twice llama.cpp's
    bytes. Per stream block: first the nibbles, a byte holding step 2k's value (4 inputs ×
    16 outputs per 64 bytes) in its low half and step 2k + 1's in its high half; then for
    each bit above 4 a plane, per step and vector one little-endian 64-bit word whose bit k
    is byte k's bit. The kernel rebuilds each 64-byte step vector with an and/shift (and a
    masked or per plane) and takes the same integer dot: the bits of every output are the
    8-bit layout's.

    ``high="sliced"`` stores the bits above 4 instead per group of 8 (5 bits) or 4 (6 bits)
    steps and vector as 64 bytes, byte k holding bits 4.. of byte k of each step, step t's at
    bit t·(bits − 4): the same bytes. Why: rebuilding a plane's 32 bytes without AVX-512's mask
    registers took 5 instructions (broadcast, shuffle, and, compare, and); a sliced step takes
    a shift and an and (``_make_tile``).
    """
    if bits == 8:
        return qv
    iv = INTERLEAVE
    steps = block // 4
    u = (qv.reshape(ngroups, 4 // iv, nblocks, steps, iv, 64).astype(np.int16) - 128 + bias).astype(np.uint8)
    nib = (u[:, :, :, 0::2] & 0x0F) | ((u[:, :, :, 1::2] & 0x0F) << 4)
    pieces = [nib.reshape(ngroups, 4 // iv, nblocks, -1)]
    if high == "sliced":
        planes = bits - 4
        run = 8 // planes
        if run > steps:
            raise ValueError(f"no sliced layout for {bits}-bit weights in blocks of {block}")
        hi = (u >> 4).reshape(ngroups, 4 // iv, nblocks, steps // run, run, iv, 64)
        packed = np.zeros(hi.shape[:4] + hi.shape[5:], np.uint8)
        for t in range(run):
            packed |= hi[:, :, :, :, t] << np.uint8(t * planes)
        pieces.append(packed.reshape(ngroups, 4 // iv, nblocks, -1))
        return np.ascontiguousarray(np.concatenate(pieces, axis=-1)).reshape(-1)
    for pl in range(bits - 4):
        plane = np.packbits((u >> (4 + pl)) & 1, axis=-1, bitorder="little")  # (…, steps, iv, 8)
        pieces.append(plane.reshape(ngroups, 4 // iv, nblocks, -1))
    return np.ascontiguousarray(np.concatenate(pieces, axis=-1)).reshape(-1)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) == b.view(np.uint32)


def factor_scales(s: np.ndarray, ngroups: int, nblocks: int, block: int) -> tuple[np.ndarray, np.ndarray] | None:
    """float32 block scales (ngroups, nblocks, GROUP) → (factors float32 (ngroups, nblocks·block/256,
    GROUP), ints int8 (ngroups, nblocks, GROUP)) with factor · int == s bit for bit, or None.

    Why: a K-quant's block scale is f32(d)·sc with d one float16 per 256 inputs and sc a
    6-bit (Q4_K/Q5_K) or 8-bit (Q6_K) integer, and such a product is exact in float32, so
    storing sc as one byte and d once per superblock rebuilds the scale exactly, in 1/4 of
    the bytes (Q4_K: 6 bits a weight become 4.53). The factors are found from the values
    alone: per superblock and output, the largest |scale| over an integer K (63, 127, 128
    first, the usual maxima, then any other), either sign; every candidate is checked by
    its product's bits, so a wrong guess can only fail, never change a number.
    """
    ratio = SUPERBLOCK // block
    if nblocks % ratio:
        return None
    S = s.reshape(ngroups, nblocks // ratio, ratio, GROUP).transpose(0, 1, 3, 2).reshape(-1, ratio)
    ref = np.abs(S).max(axis=1)
    fac = np.zeros(len(S), np.float32)
    ints = np.zeros(S.shape, np.int8)
    todo = np.arange(len(S))
    for k in (63, 127, 128, *range(126, 0, -1)):
        if not len(todo):
            break
        for sign in (np.float32(1), np.float32(-1)):
            f = (ref[todo] / np.float32(k)) * sign
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.rint(np.where(f[:, None] != 0, S[todo] / f[:, None], 0)).astype(np.float32)
            fits = (q >= -128) & (q <= 127)
            k8 = np.clip(q, -128, 127).astype(np.int8)  # what the kernel reads: a zero has no sign
            good = (fits & _same_bits(f[:, None] * k8.astype(np.float32), S[todo])).all(axis=1)
            fac[todo[good]] = f[good]
            ints[todo[good]] = k8[good]
            todo = todo[~good]
            if not len(todo):
                break
    if len(todo):
        return None
    fac = fac.reshape(ngroups, nblocks // ratio, GROUP)
    ints = ints.reshape(ngroups, nblocks // ratio, GROUP, ratio).transpose(0, 1, 3, 2).reshape(ngroups, nblocks, GROUP)
    return np.ascontiguousarray(fac).reshape(-1), np.ascontiguousarray(ints).reshape(-1)


def scale_codec(p) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(codec, s, m, sd, md) storing a part's float32 block scales and offsets in fewer bytes,
    exactly: float16 when every value is one (Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 scales are float16 in
    the file), else factored (``factor_scales``: K-quants), else float32 as they are."""
    arrays = [p.s] + ([p.m] if p.kind.offset else [])
    if all(np.array_equal(a.astype(np.float16).astype(np.float32).view(np.uint32), a.view(np.uint32)) for a in arrays):
        halves = [a.astype(np.float16).view(np.uint16) for a in arrays]
        return "f16", halves[0], halves[1] if p.kind.offset else _DUMMY, _DUMMY, _DUMMY
    factored = [factor_scales(a, p.ngroups, p.nblocks, p.kind.block) for a in arrays]
    if all(f is not None for f in factored):
        (sd, si), (md, mi) = factored[0], factored[1] if p.kind.offset else (_DUMMY, _DUMMY)
        return "fac", si, mi, sd, md
    return "f32", p.s, p.m, _DUMMY, _DUMMY


def prepare_q8(pm: PreparedMatrix, packed: bool | None = None, high: str | None = None) -> Q8Matrix:
    """Re-lay out an already prepared (int8) matrix for the VNNI kernels; scales are shared.
    ``packed``: store each part in the fewest bits that hold its values (``pack_layout``);
    False keeps one byte per weight (the same results, more bytes); None: ``PACKED``.
    ``high``: how bits above 4 are stored (``HIGH_LAYOUTS``); None: ``high_bits()``."""
    packed = PACKED if packed is None else packed
    high = high_bits() if high is None else high
    parts = []
    for p in pm.parts:
        if p.kind.wdtype != "int8":
            raise ValueError("prepare_q8: float weights have no int8 form")
        if (p.kind.block, p.kind.offset) not in KINDS_Q8:
            raise ValueError(f"prepare_q8: block {p.kind.block} unsupported")
        qv = vnni_layout(p.q, p.ngroups, p.nblocks, p.kind.block)
        bits, bias = storage_for(p.q) if packed else (8, 128)
        hb = high_for(p.kind.block, bits, high)
        qv = pack_layout(qv, p.ngroups, p.nblocks, p.kind.block, bits, bias, hb)
        codec, sv, mv, sd, md = scale_codec(p) if packed else ("f32", p.s, p.m, _DUMMY, _DUMMY)
        parts.append(Q8Part(p.kind, qv, sv, mv, p.col0, p.ngroups, p.nblocks, bits, bias, codec, sd, md, hb))
    return Q8Matrix(pm.in_features, pm.out_features, pm.padded_out, parts, pm.valid_cols)


def prepare_q8_cached(tensors: list) -> Q8Matrix:
    """``prepare_q8(prepare(tensors))``, stored in and read back from the weight cache.

    Why its own entry: re-laying the int8 weights out at every start cost 0.47 s of Gemma 3's
    start. Keyed like the float32 layout's entries plus ("q8", INTERLEAVE, the packing and,
    when sliced, the high-bit layout); on a miss the float32 layout is computed but not
    stored (a q8 process never reads it).
    """
    high = high_bits()
    packing = ("packed2" + ("-sliced" if high == "sliced" else "")) if PACKED else "bytes"
    key = weight_cache.matrix_key(tensors, GROUP, ("q8", INTERLEAVE, packing)) if weight_cache.enabled() else None
    meta = weight_cache.load(key) if key is not None else None
    if meta is not None:
        try:
            return _q8_from_cache(meta)
        except (KeyError, ValueError, TypeError):
            pass  # damaged entry: prepare again and overwrite it
    qm = prepare_q8(prepare(tensors), high=high)
    if key is not None:
        arrays = [a for p in qm.parts for a in (p.qv, p.s, p.m, p.sd, p.md)]
        if qm.valid_cols is not None:
            arrays.append(qm.valid_cols.astype(np.int64))
        parts = [{"kind": weight_cache.kind_to_json(p.kind), "col0": p.col0, "ngroups": p.ngroups,
                  "nblocks": p.nblocks, "bits": p.bits, "bias": p.bias, "codec": p.codec, "high": p.high,
                  "dtypes": [str(p.s.dtype), str(p.m.dtype)],
                  "sizes": [int(p.qv.size), int(p.s.size), int(p.m.size), int(p.sd.size), int(p.md.size)]}
                 for p in qm.parts]  # fmt: skip
        meta = {"in_features": qm.in_features, "out_features": qm.out_features, "padded_out": qm.padded_out,
                "parts": parts, "has_valid": qm.valid_cols is not None}  # fmt: skip
        weight_cache.store(key, meta, arrays)
    return qm


def _q8_from_cache(meta: dict) -> Q8Matrix:
    arrays = meta["arrays"]
    parts = []
    for i, d in enumerate(meta["parts"]):
        kind = weight_cache.kind_from_json(d["kind"])
        qv, s, m, sd, md = arrays[5 * i : 5 * i + 5]
        if [int(a.size) for a in (qv, s, m, sd, md)] != d["sizes"] or qv.dtype != np.uint8:
            raise ValueError("cached q8 part has the wrong size or type")
        if [str(s.dtype), str(m.dtype)] != d["dtypes"] or d["codec"] not in CODECS:
            raise ValueError("cached q8 part has the wrong scale storage")
        high = str(d.get("high", "planes"))
        if high not in HIGH_LAYOUTS:
            raise ValueError("cached q8 part has an unknown high-bit layout")
        parts.append(Q8Part(kind, qv, s, m, int(d["col0"]), int(d["ngroups"]), int(d["nblocks"]),
                            int(d["bits"]), int(d["bias"]), str(d["codec"]), sd, md, high))  # fmt: skip
    valid = arrays[5 * len(parts)] if meta["has_valid"] else None
    return Q8Matrix(int(meta["in_features"]), int(meta["out_features"]), int(meta["padded_out"]), parts, valid)


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
    with16 = any(p.kind.block == 16 for p in w.parts)
    for r0 in range(0, n, row_chunk):
        r1 = min(n, r0 + row_chunk)
        xq, d, i32, x32, i16, x16 = activation_terms(x[r0:r1], with16)
        oc = out[r0:r1].reshape(-1)
        for p in w.parts:
            isum, xd = (i16, x16) if p.kind.block == 16 else (i32, x32)
            kernel_for(p.kind.block, p.kind.offset, p.bits, p.bias, p.codec, p.high)(
                xq, isum, xd if p.kind.offset else _DUMMY, d, p.qv, p.s, p.m if p.kind.offset else _DUMMY, oc,
                r1 - r0, cols, w.padded_out, p.col0, p.nblocks, p.ngroups, p.sd, p.md,
            )  # fmt: skip
    if w.valid_cols is not None:
        return np.ascontiguousarray(out[:, w.valid_cols])
    return out
