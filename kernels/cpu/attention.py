"""Causal attention over the KV cache, batch-invariant: a row's result depends only on that row.

Each loop over a row has the same trip count and order whatever the number of rows, no
fast-math (so LLVM neither reassociates nor fuses), and the softmax's exp is the
vectorizable ``exp_nonpositive`` below, whose vector and scalar lanes give the same bits,
so a row computed alone or among others, at any position in a batch, gives the same bits.
Parallelism (prange) is only ever across rows or (row, head) pairs. The multi-row path's
register tiles are generated code (``attention_tiled.py``, from ``gen_attention.py``).
"""

from __future__ import annotations

import numpy as np
from echoline.kernels.cpu.attention_tiled import (
    SCORE_TILE,
    VALUE_TILE,
    scores_one,
    scores_tile,
    values_one,
    values_tile,
)
from echoline.kernels.cpu.numba_setup import njit, prange

# ---- attention ---------------------------------------------------------------------------------
# Three stages, each parallel over work items whose results never mix rows:
#   1. scores: one task per (KV head, block of KEY_BLOCK keys). The block of K is transposed
#      once into a (hd, KEY_BLOCK) tile and shared by every query head of the group and every
#      row that sees any of its keys. Each score is ONE sequential chain over d
#      (s = 0; s += q[d] * k[d] for d = 0..hd-1; then s * scale): vectorized across keys,
#      never across d, so its bits are the same in any tile, at any row count.
#   2. softmax: per (row, head), max pass, a vectorizable exp (below), then the float32 sum
#      in key order.
#   3. P·V: one task per (KV head, slice of VALUE_LANES output dims); for each key in order,
#      V[j] is loaded once and added, weighted, into every query of the group that sees it.
#      Each output element is one chain over its row's keys in key order, divided by the sum.
# Blocks and slices are fixed by absolute key index and head dimension, never by n.

KEY_BLOCK = 64
VALUE_LANES = 64
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # 9 significant bits: k * _LN2_HI is exact for |k| < 2^15
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_MIN = np.float32(-87.0)  # below this exp(x) < 1.7e-38: returned as 0
_U = np.uint64


@njit(cache=True, nogil=True, boundscheck=False)
def exp_nonpositive(x: np.ndarray, bits: np.ndarray, lo: int, hi: int) -> None:
    """x[lo:hi] = exp(x[lo:hi]) in place for x <= 0, in plain float32 arithmetic.

    Why: libm's expf is a scalar call LLVM cannot vectorize; this is Cody-Waite range
    reduction, a degree-6 polynomial (cephes expf) and an exponent built in ``bits`` (an
    int32 view of a scratch array, shared with nothing else), all IEEE operations without
    contraction, so vector and scalar lanes give the same bits. Relative error ≲ 2e-7;
    x < -87 (and -inf) gives 0. Indices are unsigned so the loops vectorize.
    """
    one = np.float32(1.0)
    half = np.float32(0.5)
    for j in range(_U(lo), _U(hi)):
        v0 = x[j]
        v = max(v0, _EXP_MIN)
        ki = np.int32(v * _LOG2E - half)  # truncation of a value <= 0.5: round to nearest
        kf = np.float32(ki)
        r = v - kf * _LN2_HI
        r = r - kf * _LN2_LO
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + half
        x[j] = p * (r * r) + r + one
        bits[j] = ((ki + np.int32(127)) << np.int32(23)) * np.int32(v0 >= _EXP_MIN)
    scale = bits.view(np.float32)
    for j in range(_U(lo), _U(hi)):
        x[j] = x[j] * scale[j]


@njit(cache=True, nogil=True, boundscheck=False)
def _row_range(p: int, window: int) -> int:
    """First key a query at position p sees (sliding window or 0)."""
    if window > 0 and p - window + 1 > 0:
        return p - window + 1
    return 0


@njit(cache=True, nogil=True, boundscheck=False)
def _score_block(q, k, positions, window, sc, scores, first_block, task):
    """Scores of every (row, head of the group) against keys [j0, j0 + KEY_BLOCK) of one KV head.

    Why scalars: 32 named accumulators (one per key) stay in SIMD registers (SLP) while
    d advances; each is its own chain over d, so no order depends on the tile.
    """
    n, nh, hd = q.shape
    nkv = k.shape[1]
    group = nh // nkv
    kv = task % nkv
    j0 = (first_block + task // nkv) * KEY_BLOCK
    jend = min(j0 + KEY_BLOCK, k.shape[0])
    needed = False
    for i in range(n):
        if positions[i] >= j0 and _row_range(positions[i], window) < j0 + KEY_BLOCK:
            needed = True
    if not needed:
        return
    kt = np.empty((hd, KEY_BLOCK), dtype=np.float32)
    for d in range(_U(hd)):
        for jj in range(_U(jend - j0)):
            kt[d, jj] = k[_U(j0) + jj, kv, d]
        for jj in range(_U(jend - j0), _U(KEY_BLOCK)):
            kt[d, jj] = 0.0
    for i in range(n):
        p = positions[i]
        if p < j0 or _row_range(p, window) >= j0 + KEY_BLOCK:
            continue
        for h in range(kv * group, (kv + 1) * group):
            row = scores[i, h]
            for c0 in range(0, KEY_BLOCK, 32):
                a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = a12 = a13 = a14 = a15 = a16 = a17 = a18 = a19 = a20 = a21 = a22 = a23 = a24 = a25 = a26 = a27 = a28 = a29 = a30 = a31 = np.float32(0.0)
                for d in range(hd):
                    qd = q[i, h, d]
                    a0 += qd * kt[d, c0 + 0]
                    a1 += qd * kt[d, c0 + 1]
                    a2 += qd * kt[d, c0 + 2]
                    a3 += qd * kt[d, c0 + 3]
                    a4 += qd * kt[d, c0 + 4]
                    a5 += qd * kt[d, c0 + 5]
                    a6 += qd * kt[d, c0 + 6]
                    a7 += qd * kt[d, c0 + 7]
                    a8 += qd * kt[d, c0 + 8]
                    a9 += qd * kt[d, c0 + 9]
                    a10 += qd * kt[d, c0 + 10]
                    a11 += qd * kt[d, c0 + 11]
                    a12 += qd * kt[d, c0 + 12]
                    a13 += qd * kt[d, c0 + 13]
                    a14 += qd * kt[d, c0 + 14]
                    a15 += qd * kt[d, c0 + 15]
                    a16 += qd * kt[d, c0 + 16]
                    a17 += qd * kt[d, c0 + 17]
                    a18 += qd * kt[d, c0 + 18]
                    a19 += qd * kt[d, c0 + 19]
                    a20 += qd * kt[d, c0 + 20]
                    a21 += qd * kt[d, c0 + 21]
                    a22 += qd * kt[d, c0 + 22]
                    a23 += qd * kt[d, c0 + 23]
                    a24 += qd * kt[d, c0 + 24]
                    a25 += qd * kt[d, c0 + 25]
                    a26 += qd * kt[d, c0 + 26]
                    a27 += qd * kt[d, c0 + 27]
                    a28 += qd * kt[d, c0 + 28]
                    a29 += qd * kt[d, c0 + 29]
                    a30 += qd * kt[d, c0 + 30]
                    a31 += qd * kt[d, c0 + 31]
                row[j0 + c0 + 0] = a0 * sc
                row[j0 + c0 + 1] = a1 * sc
                row[j0 + c0 + 2] = a2 * sc
                row[j0 + c0 + 3] = a3 * sc
                row[j0 + c0 + 4] = a4 * sc
                row[j0 + c0 + 5] = a5 * sc
                row[j0 + c0 + 6] = a6 * sc
                row[j0 + c0 + 7] = a7 * sc
                row[j0 + c0 + 8] = a8 * sc
                row[j0 + c0 + 9] = a9 * sc
                row[j0 + c0 + 10] = a10 * sc
                row[j0 + c0 + 11] = a11 * sc
                row[j0 + c0 + 12] = a12 * sc
                row[j0 + c0 + 13] = a13 * sc
                row[j0 + c0 + 14] = a14 * sc
                row[j0 + c0 + 15] = a15 * sc
                row[j0 + c0 + 16] = a16 * sc
                row[j0 + c0 + 17] = a17 * sc
                row[j0 + c0 + 18] = a18 * sc
                row[j0 + c0 + 19] = a19 * sc
                row[j0 + c0 + 20] = a20 * sc
                row[j0 + c0 + 21] = a21 * sc
                row[j0 + c0 + 22] = a22 * sc
                row[j0 + c0 + 23] = a23 * sc
                row[j0 + c0 + 24] = a24 * sc
                row[j0 + c0 + 25] = a25 * sc
                row[j0 + c0 + 26] = a26 * sc
                row[j0 + c0 + 27] = a27 * sc
                row[j0 + c0 + 28] = a28 * sc
                row[j0 + c0 + 29] = a29 * sc
                row[j0 + c0 + 30] = a30 * sc
                row[j0 + c0 + 31] = a31 * sc


@njit(cache=True, nogil=True, boundscheck=False)
def _softmax_row(positions, window, scores, bits, totals, pair):
    """exp(s - max) in place over the row's keys; totals[pair] = their sum.

    The sum runs in 16 lanes (lane e takes keys lo+e, lo+e+16, …, in order), then the lanes
    0..15 in order, then the tail keys in order: fixed by the row's own key range only.
    """
    nh = scores.shape[1]
    i = pair // nh
    h = pair - i * nh
    p = positions[i]
    lo = _row_range(p, window)
    totals[pair] = _softmax_span(scores[i, h], bits[i, h], lo, p + 1)


@njit(cache=True, nogil=True, boundscheck=False)
def _weigh_values(v, positions, window, scores, totals, out, task):
    """out[i, h, d0:d0+VALUE_LANES] = (Σ_j p_j V[j, d0:…] in key order) / sum, one (row, head, slice).

    Why scalars: 64 named accumulators (four independent chains) stay in SIMD registers (SLP), where an
    array would be stored and reloaded on every key. The narrow-slice path does the same
    per-element operations, so both give the same bits.
    """
    nh, hd = scores.shape[1], v.shape[2]
    group = nh // v.shape[1]
    nslice = (hd + VALUE_LANES - 1) // VALUE_LANES
    pair = task // nslice
    d0 = (task - pair * nslice) * VALUE_LANES
    i = pair // nh
    h = pair - i * nh
    kv = h // group
    p = positions[i]
    lo = _row_range(p, window)
    row = scores[i, h]
    t = totals[pair]
    o = out[i, h * hd + d0 : h * hd + min(hd, d0 + VALUE_LANES)]
    if o.shape[0] == VALUE_LANES:
        o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = o8 = o9 = o10 = o11 = o12 = o13 = o14 = o15 = o16 = o17 = o18 = o19 = o20 = o21 = o22 = o23 = o24 = o25 = o26 = o27 = o28 = o29 = o30 = o31 = o32 = o33 = o34 = o35 = o36 = o37 = o38 = o39 = o40 = o41 = o42 = o43 = o44 = o45 = o46 = o47 = o48 = o49 = o50 = o51 = o52 = o53 = o54 = o55 = o56 = o57 = o58 = o59 = o60 = o61 = o62 = o63 = np.float32(0.0)
        for j in range(_U(lo), _U(p + 1)):
            w = row[j]
            vr = v[j, kv, d0 : d0 + VALUE_LANES]
            o0 += w * vr[0]
            o1 += w * vr[1]
            o2 += w * vr[2]
            o3 += w * vr[3]
            o4 += w * vr[4]
            o5 += w * vr[5]
            o6 += w * vr[6]
            o7 += w * vr[7]
            o8 += w * vr[8]
            o9 += w * vr[9]
            o10 += w * vr[10]
            o11 += w * vr[11]
            o12 += w * vr[12]
            o13 += w * vr[13]
            o14 += w * vr[14]
            o15 += w * vr[15]
            o16 += w * vr[16]
            o17 += w * vr[17]
            o18 += w * vr[18]
            o19 += w * vr[19]
            o20 += w * vr[20]
            o21 += w * vr[21]
            o22 += w * vr[22]
            o23 += w * vr[23]
            o24 += w * vr[24]
            o25 += w * vr[25]
            o26 += w * vr[26]
            o27 += w * vr[27]
            o28 += w * vr[28]
            o29 += w * vr[29]
            o30 += w * vr[30]
            o31 += w * vr[31]
            o32 += w * vr[32]
            o33 += w * vr[33]
            o34 += w * vr[34]
            o35 += w * vr[35]
            o36 += w * vr[36]
            o37 += w * vr[37]
            o38 += w * vr[38]
            o39 += w * vr[39]
            o40 += w * vr[40]
            o41 += w * vr[41]
            o42 += w * vr[42]
            o43 += w * vr[43]
            o44 += w * vr[44]
            o45 += w * vr[45]
            o46 += w * vr[46]
            o47 += w * vr[47]
            o48 += w * vr[48]
            o49 += w * vr[49]
            o50 += w * vr[50]
            o51 += w * vr[51]
            o52 += w * vr[52]
            o53 += w * vr[53]
            o54 += w * vr[54]
            o55 += w * vr[55]
            o56 += w * vr[56]
            o57 += w * vr[57]
            o58 += w * vr[58]
            o59 += w * vr[59]
            o60 += w * vr[60]
            o61 += w * vr[61]
            o62 += w * vr[62]
            o63 += w * vr[63]
        o[0] = o0
        o[1] = o1
        o[2] = o2
        o[3] = o3
        o[4] = o4
        o[5] = o5
        o[6] = o6
        o[7] = o7
        o[8] = o8
        o[9] = o9
        o[10] = o10
        o[11] = o11
        o[12] = o12
        o[13] = o13
        o[14] = o14
        o[15] = o15
        o[16] = o16
        o[17] = o17
        o[18] = o18
        o[19] = o19
        o[20] = o20
        o[21] = o21
        o[22] = o22
        o[23] = o23
        o[24] = o24
        o[25] = o25
        o[26] = o26
        o[27] = o27
        o[28] = o28
        o[29] = o29
        o[30] = o30
        o[31] = o31
        o[32] = o32
        o[33] = o33
        o[34] = o34
        o[35] = o35
        o[36] = o36
        o[37] = o37
        o[38] = o38
        o[39] = o39
        o[40] = o40
        o[41] = o41
        o[42] = o42
        o[43] = o43
        o[44] = o44
        o[45] = o45
        o[46] = o46
        o[47] = o47
        o[48] = o48
        o[49] = o49
        o[50] = o50
        o[51] = o51
        o[52] = o52
        o[53] = o53
        o[54] = o54
        o[55] = o55
        o[56] = o56
        o[57] = o57
        o[58] = o58
        o[59] = o59
        o[60] = o60
        o[61] = o61
        o[62] = o62
        o[63] = o63
    else:
        for e in range(o.shape[0]):
            o[e] = 0.0
        for j in range(lo, p + 1):
            w = row[j]
            for e in range(o.shape[0]):
                o[e] += w * v[j, kv, d0 + e]
    for e in range(o.shape[0]):
        o[e] = o[e] / t


@njit(cache=True, nogil=True, parallel=True, boundscheck=False)
def _attention_parallel(q, k, v, positions, window, sc, first_block, scores, bits, totals, out):
    n, nh, hd = q.shape
    nkv = k.shape[1]
    nblocks = scores.shape[2] // KEY_BLOCK
    for task in prange(nkv * (nblocks - first_block)):
        _score_block(q, k, positions, window, sc, scores, first_block, task)
    for pair in prange(n * nh):
        _softmax_row(positions, window, scores, bits, totals, pair)
    for task in prange(n * nh * ((hd + VALUE_LANES - 1) // VALUE_LANES)):
        _weigh_values(v, positions, window, scores, totals, out, task)


@njit(cache=True, nogil=True, boundscheck=False)
def _attention_serial(q, k, v, positions, window, sc, first_block, scores, bits, totals, out):
    n, nh, hd = q.shape
    nkv = k.shape[1]
    nblocks = scores.shape[2] // KEY_BLOCK
    for task in range(nkv * (nblocks - first_block)):
        _score_block(q, k, positions, window, sc, scores, first_block, task)
    for pair in range(n * nh):
        _softmax_row(positions, window, scores, bits, totals, pair)
    for task in range(n * nh * ((hd + VALUE_LANES - 1) // VALUE_LANES)):
        _weigh_values(v, positions, window, scores, totals, out, task)


# ---- multi-row attention: row tiles ---------------------------------------------------------
# For many rows (prefill chunks, long verifies) the stages above re-read K and V once per
# query vector. Here one task takes ROW_TILE rows x the query heads of one KV head, scores
# SCORE_TILE query vectors x keys per register tile (each K^T element loaded once per
# SCORE_TILE vectors), keeps its scores in a small local buffer (no (n, H, ctx) array
# round trip through memory) and weighs V for VALUE_TILE vectors at a time. Per row and
# head the arithmetic is exactly the stages' own:
#   * a score is the same chain over d then * scale (the tile only changes which scores
#     are computed side by side; scores outside a row's keys are computed and ignored);
#   * softmax runs on the row's own key range with the same lane split from its first key;
#   * P·V runs a tile over the union of its vectors' key ranges, with the weights outside a
#     vector's range set to +0: o + (+0 * x) == o exactly for finite x (o is never -0: it
#     starts at +0 and a round-to-nearest sum is -0 only when both terms are), so each
#     output is the same chain over the row's own keys in key order. (Cache values are
#     finite: a non-finite value would poison the rows that see it anyway.)


@njit(cache=True, nogil=True, boundscheck=False)
def _span_max(row, lo, hi):
    """max(row[lo:hi]) over 16 lanes, then the tail.

    Why lanes: one running max is a chain of dependent compares (0.44 ns a key, as much
    as the rest of the softmax); 16 named lanes become one SIMD max (0.02 ns). A maximum
    is the same number in any order, so no bit of the softmax changes (a max of +0 or -0
    subtracts to the same values and exp(+-0) is 1 either way; a NaN score still makes
    its row NaN through its own exp).
    """
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = m8 = m9 = m10 = m11 = m12 = m13 = m14 = m15 = row[lo]
    full = lo + (hi - lo) // 16 * 16
    for j in range(_U(lo), _U(full), _U(16)):
        m0 = max(m0, row[j])
        m1 = max(m1, row[j + _U(1)])
        m2 = max(m2, row[j + _U(2)])
        m3 = max(m3, row[j + _U(3)])
        m4 = max(m4, row[j + _U(4)])
        m5 = max(m5, row[j + _U(5)])
        m6 = max(m6, row[j + _U(6)])
        m7 = max(m7, row[j + _U(7)])
        m8 = max(m8, row[j + _U(8)])
        m9 = max(m9, row[j + _U(9)])
        m10 = max(m10, row[j + _U(10)])
        m11 = max(m11, row[j + _U(11)])
        m12 = max(m12, row[j + _U(12)])
        m13 = max(m13, row[j + _U(13)])
        m14 = max(m14, row[j + _U(14)])
        m15 = max(m15, row[j + _U(15)])
    a = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    b = max(max(max(m8, m9), max(m10, m11)), max(max(m12, m13), max(m14, m15)))
    mx = max(a, b)
    for j in range(_U(full), _U(hi)):
        mx = max(mx, row[j])
    return mx


@njit(cache=True, nogil=True, boundscheck=False)
def _softmax_span(row, bits, lo, hi):
    """exp(s - max) in place over row[lo:hi]; returns their sum (16 lanes, then the tail).

    The one softmax of both attention paths (decode rows and row tiles), so their rows
    agree bit for bit by construction."""
    mx = _span_max(row, lo, hi)
    for j in range(_U(lo), _U(hi)):
        row[j] = row[j] - mx
    exp_nonpositive(row, bits, lo, hi)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = s8 = s9 = s10 = s11 = s12 = s13 = s14 = s15 = np.float32(0.0)
    full = lo + (hi - lo) // 16 * 16
    for j in range(_U(lo), _U(full), _U(16)):  # unsigned: no wraparound checks, so SIMD
        s0 += row[j]
        s1 += row[j + _U(1)]
        s2 += row[j + _U(2)]
        s3 += row[j + _U(3)]
        s4 += row[j + _U(4)]
        s5 += row[j + _U(5)]
        s6 += row[j + _U(6)]
        s7 += row[j + _U(7)]
        s8 += row[j + _U(8)]
        s9 += row[j + _U(9)]
        s10 += row[j + _U(10)]
        s11 += row[j + _U(11)]
        s12 += row[j + _U(12)]
        s13 += row[j + _U(13)]
        s14 += row[j + _U(14)]
        s15 += row[j + _U(15)]
    total = s0
    total += s1
    total += s2
    total += s3
    total += s4
    total += s5
    total += s6
    total += s7
    total += s8
    total += s9
    total += s10
    total += s11
    total += s12
    total += s13
    total += s14
    total += s15
    for j in range(_U(full), _U(hi)):
        total += row[j]
    return total


@njit(cache=True, nogil=True, boundscheck=False)
def _tile_task(q, kt, gb, v, positions, window, sc, row_tile, hsplit, out, task):
    """One tile of rows x one share (of ``hsplit``) of the query heads of one KV head.

    ``kt[kv, d, j - gb]`` is key j (so ``gb`` may be negative when ``kt`` holds keys before
    the view). Splitting a group's heads over tasks changes only which vectors share a
    register tile, never a vector's arithmetic (see the comment above), so it is free to
    pick for parallelism: a one-row decode would otherwise have one task per KV head.
    """
    n, nh, hd = q.shape
    nkv = v.shape[1]
    group = nh // nkv
    ntiles = (n + row_tile - 1) // row_tile
    # A KV head's tasks (its row tiles x head shares) are neighbours in task order, so
    # prange's contiguous chunks keep its keys and values on one core, in that core's L2,
    # instead of streaming them through both cores.
    per_kv = hsplit * ntiles
    kv = task // per_kv
    share = task % per_kv % hsplit
    t = task % per_kv // hsplit
    per = (group + hsplit - 1) // hsplit
    g0 = min(group, share * per)
    g1 = min(group, g0 + per)
    ng = g1 - g0
    if ng == 0:
        return
    # Alternate tiles from both ends: prange splits tasks into contiguous chunks, and
    # later rows (higher positions) see more keys.
    tile = t // 2 if t % 2 == 0 else ntiles - 1 - t // 2
    r0 = tile * row_tile
    r1 = min(n, r0 + row_tile)
    nv = (r1 - r0) * ng
    ulo = positions[r0]
    uhi = 0
    for i in range(r0, r1):
        ulo = min(ulo, _row_range(positions[i], window))
        uhi = max(uhi, positions[i] + 1)
    qn, kn = SCORE_TILE
    vn, dn = VALUE_TILE
    wl = (uhi - ulo + kn - 1) // kn * kn
    # A last partial tile of >= PAD_PARTIAL_TILE vectors runs as a whole tile whose spare
    # slots hold zero queries copying the last vector's key range (so the tile's key span
    # does not grow); their results are never read. A vector's arithmetic is the same in a
    # tile as alone, so this is a speed choice: 3 rows x 1 head took 3 one-vector passes.
    rem = nv % qn
    nvp = nv + (qn - rem if rem >= PAD_PARTIAL_TILE else 0)
    qv = np.zeros((nvp, hd), dtype=np.float32)
    los = np.empty(nvp, dtype=np.int64)
    his = np.empty(nvp, dtype=np.int64)
    for i in range(r0, r1):
        for g in range(g0, g1):
            a = (i - r0) * ng + g - g0
            for d in range(hd):
                qv[a, d] = q[i, kv * group + g, d]
            los[a] = _row_range(positions[i], window) - ulo
            his[a] = positions[i] + 1 - ulo
    for a in range(nv, nvp):
        los[a] = los[nv - 1]
        his[a] = his[nv - 1]
    s = np.empty((nvp, wl), dtype=np.float32)
    bits = np.empty((nv, wl), dtype=np.int32)
    ktk = kt[kv]
    koff = _U(ulo - gb)
    for c0 in range(0, wl, kn):
        a = 0
        while a + qn <= nvp:
            scores_tile(qv, ktk, koff, sc, s, _U(a), _U(c0))
            a += qn
        while a < nvp:
            scores_one(qv, ktk, koff, sc, s, _U(a), _U(c0))
            a += 1
    totals = np.empty(nv, dtype=np.float32)
    span = uhi - ulo
    for a in range(nv):
        totals[a] = _softmax_span(s[a], bits[a], los[a], his[a])
        for j in range(los[a]):
            s[a, j] = 0.0
        for j in range(his[a], span):
            s[a, j] = 0.0
    for a in range(nv, nvp):  # spare slots: zero weights
        for j in range(span):
            s[a, j] = 0.0
    o = np.empty((nvp, hd), dtype=np.float32)
    full = hd // dn * dn
    for d0 in range(0, full, dn):
        a = 0
        while a + vn <= nvp:  # spare slots (zero weights) may fill a value tile too
            lo = los[a]
            hi = his[a]
            for b in range(a + 1, a + vn):
                lo = min(lo, los[b])
                hi = max(hi, his[b])
            values_tile(s, v, ulo, _U(kv), _U(d0), lo, hi, o, _U(a))
            a += vn
        while a < nv:
            values_one(s, v, ulo, _U(kv), _U(d0), los[a], his[a], o, _U(a))
            a += 1
    for a in range(nv):  # head dims past the last full slice: one chain per element
        for e in range(full, hd):
            acc = np.float32(0.0)
            for j in range(los[a], his[a]):
                acc += s[a, j] * v[ulo + j, kv, e]
            o[a, e] = acc
    for i in range(r0, r1):
        for g in range(g0, g1):
            a = (i - r0) * ng + g - g0
            h = kv * group + g
            t_ = totals[a]
            for e in range(hd):
                out[i, h * hd + e] = o[a, e] / t_


@njit(cache=True, nogil=True, parallel=True, boundscheck=False)
def _attention_tiles_parallel(q, kt, gb, v, positions, window, sc, row_tile, hsplit, out):
    ntasks = v.shape[1] * hsplit * ((q.shape[0] + row_tile - 1) // row_tile)
    for task in prange(ntasks):
        _tile_task(q, kt, gb, v, positions, window, sc, row_tile, hsplit, out, task)


@njit(cache=True, nogil=True, boundscheck=False)
def _attention_tiles_serial(q, kt, gb, v, positions, window, sc, row_tile, hsplit, out):
    ntasks = v.shape[1] * hsplit * ((q.shape[0] + row_tile - 1) // row_tile)
    for task in range(ntasks):
        _tile_task(q, kt, gb, v, positions, window, sc, row_tile, hsplit, out, task)


#: Rows per tile task, and the row count from which attention takes the tiled path.
ROW_TILE = 4
#: A task's last partial score tile with at least this many query vectors is padded to a
#: whole tile (``_tile_task``); a lone vector keeps the one-vector pass (decode).
PAD_PARTIAL_TILE = 2
TILED_MIN_ROWS = 2


@njit(cache=True, nogil=True, parallel=True, boundscheck=False)
def _transpose_keys(k, gb, ge, kt):
    """kt[kv, d, j] = k[gb + j, kv, d] for j < ge - gb, zeros after: blocks of 64 keys in parallel.

    Why not numpy: its strided transpose copy took 0.2 ms at 2k keys (SmolLM2), a third of
    a 16-row verify's attention call.
    """
    nkv, hd = k.shape[1], k.shape[2]
    nk = ge - gb
    width = kt.shape[2]
    nblk = (width + 63) // 64
    for t in prange(nkv * nblk):
        kv = t % nkv
        j0 = (t // nkv) * 64
        j1 = min(nk, j0 + 64)
        for j in range(j0, j1):
            for d in range(hd):
                kt[kv, d, j] = k[gb + j, kv, d]
        for d in range(hd):
            for j in range(max(j0, nk), min(width, j0 + 64)):
                kt[kv, d, j] = 0.0


#: Zero key columns after a key store's capacity: a score tile may read up to one tile of
#: keys past the last one it needs (those scores are computed and ignored).
KEY_STORE_PAD = SCORE_TILE[1]


def empty_keys(capacity: int, n_kv_heads: int, head_dim: int) -> np.ndarray:
    """A K cache the attention kernels read without transposing: a (capacity, KVH, hd) view.

    Why: the score tiles want, per KV head and dimension d, the keys of consecutive
    positions side by side (one SIMD load covers 16 keys). A row-major cache had to be
    transposed on every call (a third of a 16-row verify's attention at 2k keys, and more
    than the arithmetic of a one-row decode). Here the memory is (KVH, hd, capacity + pad)
    with positions innermost and the caller sees an ordinary (capacity, KVH, hd) array:
    slicing, row writes and copies work as before, only strided. ``attention`` recognises
    such a view (``key_store``) and reads the store directly.
    """
    store = np.zeros((n_kv_heads, head_dim, capacity + KEY_STORE_PAD), dtype=np.float32)
    return store[:, :, :capacity].transpose(2, 0, 1)


def key_store(k: np.ndarray) -> tuple[np.ndarray, int] | None:
    """(store, first position) when ``k`` is a view of an ``empty_keys`` store, else None."""
    base = k.base
    if not isinstance(base, np.ndarray) or base.ndim != 3 or base.dtype != np.float32:
        return None
    if k.ndim != 3 or base.shape[:2] != k.shape[1:] or not base.flags.c_contiguous:
        return None
    if k.strides != (4, base.strides[0], base.strides[1]):
        return None
    offset = (k.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4
    if offset < 0 or offset + k.shape[0] + KEY_STORE_PAD > base.shape[2]:
        return None
    return base, int(offset)


def _keys_transposed(k: np.ndarray, gb: int, ge: int, pad: int) -> np.ndarray:
    """K[gb:ge] as (KVH, hd, ge - gb + pad), zero padded: one contiguous key run per d."""
    nkv, hd = k.shape[1], k.shape[2]
    kt = np.empty((nkv, hd, ge - gb + pad), dtype=np.float32)
    _transpose_keys(k, gb, ge, kt)
    return kt


def _threads() -> int:
    """numba's thread count (imported here: ``numba_setup`` must configure numba before it loads)."""
    from numba import get_num_threads

    return max(1, get_num_threads())


#: Below this many (row x head x key) steps a parallel launch costs more than it saves.
PARALLEL_ATTENTION_WORK = 8192


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
) -> np.ndarray:
    """Causal GQA attention of q (n, H, hd) over caches (ctx, KVH, hd); returns (n, H*hd).

    Serial and parallel paths run the same per-task code, so the choice never
    changes a bit.
    """
    n, nh, hd = q.shape
    out = np.empty((n, nh * hd), dtype=np.float32)
    if n == 0:
        return out
    if positions.shape[0] != n or int(positions.min()) < 0 or int(positions.max()) >= k.shape[0]:
        raise ValueError("attention: positions must be one per row and inside the cache")
    if nh % k.shape[1] != 0 or k.shape[2] != hd or v.shape != k.shape:
        raise ValueError("attention: head counts or head dims do not match")
    nkeys = int(positions.max()) + 1
    sc = np.float32(scale)
    stored = key_store(k)
    if stored is not None or n >= TILED_MIN_ROWS:
        if stored is not None:  # keys already laid out for the tiles: no copy at all
            kt, gb = stored[0], -stored[1]
        else:
            gb = max(0, int(positions.min()) - window + 1) if window > 0 else 0
            kt = _keys_transposed(k, gb, nkeys, SCORE_TILE[1])
        # One tile of rows gives one task per KV head: split the heads so both cores work.
        # Two rows take two heads a share, so each task fills one whole score tile (2 x 2
        # vectors) instead of padding 2 vectors to 4 (SmolLM2: 6 tile passes, not 9).
        # One row keeps a KV head's query heads together (whole score tiles, keys read
        # once) when the KV heads already spread evenly over the threads, or there is only
        # one: 28 one-row layers at 800 keys, AMD Zen 5 VM, 2026-12-02, Qwen 1.5B (2 KV
        # heads x 6) 2.2-2.6 ms against 3.7-4.0 split per head, Qwen 0.5B (2 x 7) 1.2
        # against 1.5, Gemma 3 (1 x 4) 3.5-4.6 against 5.5; SmolLM2 (3 x 3) stays split
        # (2.4 against 2.6-2.9). Which task computes a head never changes its bits.
        # Up to ROW_TILE rows, the same holds when the KV heads spread evenly over the threads
        # (one task per KV head and row tile, all its query heads): AMD Zen 5 VM, 2026-12-02,
        # µs a layer at 1,024 keys, split 1 against the per-head split at 2 / 3 / 4 rows:
        # Qwen 1.5B 103 / 147 / 151 against 211 / 204 / 205; Qwen 0.5B 43 / 60 / 73 against
        # 74 / 71 / 73; SmolLM2 (3 KV heads on 2 threads) keeps the split (`python -m
        # tools.cpu.bench_rowops`; whole forwards: docs/history/cpu-kernels.md).
        group = nh // k.shape[1]
        hsplit = 1 if n > ROW_TILE else (group + 1) // 2 if n == 2 else group
        if k.shape[1] % _threads() == 0 or (n == 1 and k.shape[1] == 1):
            hsplit = 1
        targs = (q, kt, gb, v, positions, window, sc, ROW_TILE, hsplit, out)
        if n * nh * min(nkeys, window if window > 0 else nkeys) >= PARALLEL_ATTENTION_WORK:
            _attention_tiles_parallel(*targs)
        else:
            _attention_tiles_serial(*targs)
        return out
    width = (nkeys + KEY_BLOCK - 1) // KEY_BLOCK * KEY_BLOCK
    scores = np.empty((n, nh, width), dtype=np.float32)
    bits = np.empty((n, nh, width), dtype=np.int32)
    totals = np.empty(n * nh, dtype=np.float32)
    first = 0  # blocks before every row's window are never read
    if window > 0:
        first = max(0, int(positions.min()) - window + 1) // KEY_BLOCK
    args = (q, k, v, positions, window, sc, first, scores, bits, totals, out)
    if n * nh * min(nkeys, window if window > 0 else nkeys) >= PARALLEL_ATTENTION_WORK:
        _attention_parallel(*args)
    else:
        _attention_serial(*args)
    return out
