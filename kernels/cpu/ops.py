"""Batch-invariant row ops: every row's result depends only on that row.

Each loop over a row has the same trip count and order whatever the number
of rows, no fast-math (so LLVM neither reassociates nor fuses), and
transcendental functions are scalar libm calls (numba has no SVML here), so a
row computed alone or among others, at any position in a batch, gives the
same bits. Parallelism (prange) is only ever across rows or (row, head) pairs.
"""

from __future__ import annotations

import numpy as np

from kernels.cpu._env import njit, prange

_F = np.float32


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


_LANES = 16


@njit(cache=True, nogil=True, boundscheck=False)
def _attend(q, k, v, positions, window, sc, out, pair):
    """One (row, head) pair: q·k in 16 fixed lanes (lane l takes elements l, l+16, …)
    summed lane 0..15; float32 softmax with a max pass; probabilities applied to V
    in key order. Nothing here depends on other rows."""
    nh, hd = q.shape[1], q.shape[2]
    group = nh // k.shape[1]
    full = hd // _LANES * _LANES
    i = pair // nh
    h = pair - i * nh
    kv = h // group
    p = positions[i]
    lo = 0
    if window > 0 and p - window + 1 > 0:
        lo = p - window + 1
    nkeys = p + 1 - lo
    scores = np.empty(nkeys, dtype=np.float32)
    acc = np.empty(_LANES, dtype=np.float32)
    for j in range(nkeys):
        kj = lo + j
        for lane in range(_LANES):
            acc[lane] = 0.0
        for d0 in range(0, full, _LANES):
            for lane in range(_LANES):
                acc[lane] += q[i, h, d0 + lane] * k[kj, kv, d0 + lane]
        for d in range(full, hd):
            acc[d - full] += q[i, h, d] * k[kj, kv, d]
        dot = np.float32(0.0)
        for lane in range(_LANES):
            dot += acc[lane]
        scores[j] = dot * sc
    mx = scores[0]
    for j in range(1, nkeys):
        if scores[j] > mx:
            mx = scores[j]
    total = np.float32(0.0)
    for j in range(nkeys):
        e = np.exp(scores[j] - mx)
        scores[j] = e
        total += e
    o = out[i, h * hd : (h + 1) * hd]
    for d in range(hd):
        o[d] = 0.0
    for j in range(nkeys):
        pj = scores[j] / total
        kj = lo + j
        for d in range(hd):
            o[d] += pj * v[kj, kv, d]


@njit(cache=True, nogil=True, parallel=True, boundscheck=False)
def _attention_parallel(q, k, v, positions, window, sc, out):
    for pair in prange(q.shape[0] * q.shape[1]):
        _attend(q, k, v, positions, window, sc, out, pair)


@njit(cache=True, nogil=True, boundscheck=False)
def _attention_serial(q, k, v, positions, window, sc, out):
    for pair in range(q.shape[0] * q.shape[1]):
        _attend(q, k, v, positions, window, sc, out, pair)


#: Below this many (pair x key) steps a parallel launch costs more than it saves.
PARALLEL_ATTENTION_WORK = 4096


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float,
) -> np.ndarray:
    """Causal GQA attention of q (n, H, hd) over caches (ctx, KVH, hd); returns (n, H*hd).

    Serial and parallel paths run the same per-pair code, so the choice never
    changes a bit.
    """
    n, nh, hd = q.shape
    out = np.empty((n, nh * hd), dtype=np.float32)
    if n == 0:
        return out
    if positions.shape[0] != n or int(positions.min()) < 0 or int(positions.max()) >= k.shape[0]:
        raise ValueError("attention: positions must be one per row and inside the cache")
    sc = np.float32(scale)
    work = n * nh * (int(positions.max()) + 1)
    if work >= PARALLEL_ATTENTION_WORK:
        _attention_parallel(q, k, v, positions, window, sc, out)
    else:
        _attention_serial(q, k, v, positions, window, sc, out)
    return out


@njit(cache=True, nogil=True, boundscheck=False)
def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up for (m, d) float32; exp overflow gives the correct -0."""
    m, d = gate.shape
    out = np.empty((m, d), dtype=np.float32)
    one = np.float32(1.0)
    for r in range(m):
        for i in range(d):
            g = gate[r, i]
            out[r, i] = g / (one + np.exp(-g)) * up[r, i]
    return out


@njit(cache=True, nogil=True, boundscheck=False)
def gelu_tanh_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu_tanh(gate) * up for (m, d) float32."""
    m, d = gate.shape
    out = np.empty((m, d), dtype=np.float32)
    c = np.float32(np.sqrt(2.0 / np.pi))
    k = np.float32(0.044715)
    half = np.float32(0.5)
    one = np.float32(1.0)
    for r in range(m):
        for i in range(d):
            x = gate[r, i]
            inner = c * (x + k * x * x * x)
            out[r, i] = half * x * (one + np.tanh(inner)) * up[r, i]
    return out
