"""Batch-invariant quantized matrix products on the CPU.

Weights are re-laid out once (``prepare``) as int8 values (or float32 for
float types) in groups of ``GROUP`` outputs, so the kernel's inner loop reads
GROUP contiguous bytes per input element, plus float32 scale/offset per block
of 32 (16 for Q6_K) inputs. No float32 copy of a quantized matrix is kept.
See ``kernels.cpu.codegen`` for the fixed per-row reduction order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from echoline.kernels.cpu import weight_cache
from echoline.kernels.cpu.codegen import KernelSpec, load_kernel
from echoline.kernels.cpu.numba_setup import njit, target_has  # sets numba flags before numba loads
from echoline.kernels.cpu.relayout import KINDS, Kind, unpack

#: Outputs per weight group (layout) and the default register tiles (rows, outputs).
#: Measured (``python -m tools.engine.op_profile --model M --context 1300``, tile sets
#: interleaved across runs): 4x64 / 3x64 replaced 8x32 / 4x32. SmolLM2's products at 3, 4,
#: 8, 16 rows: 6.4 -> 5.2, 7.0 -> 5.4, 9.2 -> 8.5, 14.3 -> 13.6 ms; Gemma 3's 10.1 -> 8.3,
#: 11.0 -> 8.5, 14.6 -> 13.5, 24.7 -> 23.5 ms; one row unchanged. Then a 5x64 tile that
#: only absorbs a 4-row plan's leftover rows (codegen: 9 = 5 + 4, 17 = 5 + 4 + 4 + 4, 16 stays
#: 4 x 4): SmolLM2 at 5 / 9 / 13 rows 7.1 / 9.5 / 11.8 -> 5.7 / 8.8 / 11.3 ms. Same bits (the
#: tile never changes a row's chain; tested).
GROUP = 64
WIDE_TILES: tuple[tuple[int, int], ...] = ((5, 64), (4, 64), (3, 64), (2, 64), (1, 64))
#: The same plan for code without AVX-512: the multi-row tiles 16 wide, the one-row tile 64.
#: Why: a 5 x 64 tile is 320 float accumulators, 20 AVX-512 registers but 40 of AVX2's 16.
#: LLVM spent about 8 minutes compiling one such kernel on a 2-core Zen 1 (AVX2, 2026-12-04;
#: the test suite compiles a dozen), 103 s with every tile 32 wide, 58 s with this set
#: (``/tmp`` cache, one Q4_K kernel). It also runs faster there (2026-12-04, same Zen 1, the
#: first 4 layers' products and the head of Qwen2.5-Coder-0.5B, interleaved, medians of 9:
#: ``python -m tools.cpu.bench_tiles MODEL --sets w32,w16,m32,m64``): against all-32 tiles,
#: 0.94x the time at 1 row, 0.80 / 0.78 / 0.75x at 4 / 8 / 16 rows; all-16 tiles were as fast
#: from 4 rows but 1.16x at one row. Which tile computes a row never changes its bits
#: (``test_matmul_tile_shape_does_not_change_bits``). AVX2 machines run the int8 path by
#: default (``q8act``, its own tiles), so this set serves ``--cpu-activations f32`` there.
NARROW_TILES: tuple[tuple[int, int], ...] = ((5, 16), (4, 16), (3, 16), (2, 16), (1, 64))


def tiles_for_target() -> tuple[tuple[int, int], ...]:
    """The wide (AVX-512) tiles only where the generated code may use AVX-512."""
    return WIDE_TILES if target_has("avx512f") else NARROW_TILES


DEFAULT_TILES: tuple[tuple[int, int], ...] = tiles_for_target()
#: Rows per kernel call: keeps the slice of x a call reads small and in cache.
ROW_CHUNK = 64
#: Row counts (inclusive range) that hand the kernels x transposed rather than as rows.
#: Why a choice at all: a tile broadcasts one x value per row and input, which needs no
#: adjacency, and the transposed copy cost 3 µs a call at 16 rows; but the one-tile case of
#: 8 rows was never faster as rows (SmolLM2's products, interleaved in one process,
#: ``python -m tools.cpu.bench_matmul MODEL --layout-ab``: rows/transposed 0.96-0.99 at 2-7
#: rows, 1.005-1.055 at 8 over three runs, 0.92-0.98 at 9-17). Same bits either way (the
#: arithmetic is the same chain; tested). With the 4x64 tiles, 8 rows measured the
#: same either way (8.47-8.69 vs 8.55-8.60 ms, SmolLM2 at context 1300), so it stayed.
TRANSPOSE_ROWS = (8, 8)
_U = np.uint64
_CHUNK_ROWS = 4096  # rows unpacked at a time while preparing (bounds temporary memory)


@njit(cache=True, nogil=True, boundscheck=False)
def block_sums(x: np.ndarray, block: int) -> np.ndarray:
    """Per-row sums of each block of ``block`` inputs, in input order (float32)."""
    n, cols = x.shape
    nb = cols // block
    out = np.empty((n, nb), dtype=np.float32)
    for r in range(n):
        for b in range(nb):
            acc = np.float32(0.0)
            for i in range(block):
                acc += x[r, b * block + i]
            out[r, b] = acc
    return out


@dataclass
class Part:
    """A run of fused tensors sharing one representation: one kernel call."""

    kind: Kind
    q: np.ndarray  # flat (ngroups, nblocks, block, GROUP)
    s: np.ndarray  # flat (ngroups, nblocks, GROUP) or a 1-element dummy
    m: np.ndarray
    col0: int  # first output column (padded space)
    ngroups: int
    nblocks: int
    kernel: Callable | None = None


@dataclass
class PreparedMatrix:
    """Fused weight: ``matmul`` returns the parts' outputs concatenated."""

    in_features: int
    out_features: int
    padded_out: int
    parts: list[Part]
    valid_cols: np.ndarray | None  # gather index when some tensor needed padding
    tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES
    sizes: list[int] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(p.q.nbytes + p.s.nbytes + p.m.nbytes for p in self.parts)


def _tile_tensor(qtype, data: np.ndarray, rows: int, cols: int, kind: Kind):
    """Unpack one tensor into grouped layout arrays (padded to whole groups)."""
    G, BS = GROUP, kind.block
    ngroups = -(-rows // G)
    nb = cols // BS
    wdt = np.int8 if kind.wdtype == "int8" else np.float32
    q = np.zeros((ngroups, nb, BS, G), dtype=wdt)
    s = np.zeros((ngroups, nb, G), dtype=np.float32) if kind.scaled else None
    m = np.zeros((ngroups, nb, G), dtype=np.float32) if kind.offset else None
    data2 = np.asarray(data).reshape(rows, -1)
    step = max(G, _CHUNK_ROWS // G * G)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        vals, sc, off = unpack(qtype, data2[r0:r1], cols)
        g0, g1 = r0 // G, -(-r1 // G)
        pad = (g1 - g0) * G - (r1 - r0)
        if pad:
            vals = np.concatenate([vals, np.zeros((pad, cols), dtype=vals.dtype)])
            sc = None if sc is None else np.concatenate([sc, np.zeros((pad, nb), np.float32)])
            off = None if off is None else np.concatenate([off, np.zeros((pad, nb), np.float32)])
        # q[g, b, i, o] = vals[g*G + o, b*BS + i]
        q[g0:g1] = vals.reshape(g1 - g0, G, nb, BS).transpose(0, 2, 3, 1)
        if s is not None:
            s[g0:g1] = sc.reshape(g1 - g0, G, nb).transpose(0, 2, 1)
        if m is not None:
            m[g0:g1] = off.reshape(g1 - g0, G, nb).transpose(0, 2, 1)
    return q, s, m, ngroups, nb


def prepare(tensors: Sequence, tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES) -> PreparedMatrix:
    """Re-lay out QuantTensors (out_i, in) sharing ``in`` into one fused matrix."""
    if not tensors:
        raise ValueError("prepare needs at least one tensor")
    cols = tensors[0].cols
    for t in tensors:
        if t.cols != cols:
            raise ValueError(f"fused tensors must share the input size ({t.name}: {t.cols} != {cols})")
        if t.qtype not in KINDS:
            raise ValueError(f"{t.name}: unsupported quant type {t.qtype.name}")
    pieces = []  # (kind, q, s, m, ngroups, nb, rows)
    for t in tensors:
        kind = KINDS[t.qtype]
        q, s, m, ng, nb = _tile_tensor(t.qtype, t.data, t.rows, cols, kind)
        pieces.append((kind, q, s, m, ng, nb, t.rows))
    parts: list[Part] = []
    valid: list[np.ndarray] = []
    col = 0
    i = 0
    while i < len(pieces):
        j = i
        while j + 1 < len(pieces) and pieces[j + 1][0] == pieces[i][0]:
            j += 1
        run = pieces[i : j + 1]
        kind = run[0][0]
        q = np.concatenate([p[1] for p in run]) if len(run) > 1 else run[0][1]
        s = np.concatenate([p[2] for p in run]) if kind.scaled else np.zeros(1, np.float32)
        m = np.concatenate([p[3] for p in run]) if kind.offset else np.zeros(1, np.float32)
        ngroups = sum(p[4] for p in run)
        part = Part(kind, q.reshape(-1), s.reshape(-1), m.reshape(-1), col, ngroups, run[0][5])
        for p in run:
            valid.append(np.arange(col, col + p[6]))
            col += p[4] * GROUP
        parts.append(part)
        i = j + 1
    valid_cols = np.concatenate(valid)
    out = int(valid_cols.size)
    pm = PreparedMatrix(
        in_features=cols,
        out_features=out,
        padded_out=col,
        parts=parts,
        valid_cols=None if out == col else valid_cols,
        tiles=tuple(tiles),
        sizes=[t.rows for t in tensors],
    )
    for part in parts:
        part.kernel = kernel_for(part.kind, pm.tiles)
    return pm


def prepare_cached(tensors: Sequence, tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES) -> PreparedMatrix:
    """``prepare``, reusing the on-disk result of an earlier start (``weight_cache``).

    The arrays are the same bytes ``prepare`` computes (the cache stores its output), so
    nothing downstream can tell the two apart. Tensors without a file origin, or
    ``ECHOLINE_WEIGHT_CACHE=0``, go straight to ``prepare``.
    """
    key = weight_cache.matrix_key(tensors, GROUP, tiles) if weight_cache.enabled() else None
    if key is None:
        return prepare(tensors, tiles)
    meta = weight_cache.load(key)
    if meta is not None:
        try:
            return _from_cache(meta, tiles)
        except (KeyError, ValueError, TypeError):
            pass  # damaged entry: prepare again and overwrite it
    pm = prepare(tensors, tiles)
    arrays: list[np.ndarray] = []
    parts = []
    for p in pm.parts:
        parts.append(
            {
                "kind": weight_cache.kind_to_json(p.kind),
                "col0": p.col0,
                "ngroups": p.ngroups,
                "nblocks": p.nblocks,
                "shapes": [list(p.q.shape), list(p.s.shape), list(p.m.shape)],
            }
        )
        arrays += [p.q, p.s, p.m]
    if pm.valid_cols is not None:
        arrays.append(pm.valid_cols.astype(np.int64))
    meta = {
        "in_features": pm.in_features,
        "out_features": pm.out_features,
        "padded_out": pm.padded_out,
        "parts": parts,
        "has_valid": pm.valid_cols is not None,
        "sizes": pm.sizes,
    }
    weight_cache.store(key, meta, arrays)
    return pm


def _from_cache(meta: dict, tiles: tuple[tuple[int, int], ...]) -> PreparedMatrix:
    arrays = meta["arrays"]
    parts = []
    for i, d in enumerate(meta["parts"]):
        kind = weight_cache.kind_from_json(d["kind"])
        q, s, m = arrays[3 * i : 3 * i + 3]
        for a, shape in zip((q, s, m), d["shapes"], strict=True):
            if list(a.shape) != shape:
                raise ValueError("cached part has the wrong size")
        if q.dtype != (np.int8 if kind.wdtype == "int8" else np.float32):
            raise ValueError("cached part has the wrong dtype")
        part = Part(kind, q, s, m, int(d["col0"]), int(d["ngroups"]), int(d["nblocks"]))
        part.kernel = kernel_for(kind, tuple(tiles))
        parts.append(part)
    valid = arrays[3 * len(parts)] if meta["has_valid"] else None
    return PreparedMatrix(
        in_features=int(meta["in_features"]),
        out_features=int(meta["out_features"]),
        padded_out=int(meta["padded_out"]),
        parts=parts,
        valid_cols=valid,
        tiles=tuple(tiles),
        sizes=[int(x) for x in meta["sizes"]],
    )


def kernel_for(kind: Kind, tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES) -> Callable:
    """The generated (disk-cached) kernel for a representation and tile set."""
    spec = KernelSpec(
        group=GROUP,
        block=kind.block,
        partials=1,
        scaled=kind.scaled,
        offset=kind.offset,
        wdtype=kind.wdtype,
        tiles=tiles,
    )
    return load_kernel(spec)


def matmul(
    x: np.ndarray, w: PreparedMatrix, row_chunk: int = ROW_CHUNK, out: np.ndarray | None = None
) -> np.ndarray:
    """x (n, in) float32 → (n, out) float32; each row's result is independent of n.

    ``out`` (n, padded_out) may be supplied (tests pass a NaN-poisoned buffer to
    prove every element is written).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.in_features:
        raise ValueError(f"matmul: x has shape {x.shape}, weight expects (n, {w.in_features})")
    n = x.shape[0]
    if out is None:
        out = np.empty((n, w.padded_out), dtype=np.float32)
    elif out.shape != (n, w.padded_out) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("matmul: out must be a C-contiguous float32 (n, padded_out) array")
    need_xs = any(p.kind.offset for p in w.parts)
    dummy = np.zeros(1, np.float32)
    for r0 in range(0, n, row_chunk):
        r1 = min(n, r0 + row_chunk)
        xc = x[r0:r1]
        xs = block_sums(xc, 32).reshape(-1) if need_xs else dummy
        if TRANSPOSE_ROWS[0] <= r1 - r0 <= TRANSPOSE_ROWS[1]:
            xk, rs, cs = np.ascontiguousarray(xc.T).reshape(-1), _U(1), _U(r1 - r0)
        else:
            xk, rs, cs = xc.reshape(-1), _U(w.in_features), _U(1)
        oc = out[r0:r1].reshape(-1)
        rows, ldo = _U(r1 - r0), _U(w.padded_out)
        for p in w.parts:
            p.kernel(xk, xs, p.q, p.s, p.m, oc, rows, ldo, _U(p.col0), _U(p.nblocks), _U(p.ngroups), rs, cs)
    if w.valid_cols is not None:
        return np.ascontiguousarray(out[:, w.valid_cols])
    return out
