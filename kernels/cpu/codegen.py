"""Generate, cache and import the matmul kernels as Python source.

Why generated source: numba only vectorizes the inner product well when every
accumulator is its own scalar (SLP then packs them into SIMD lanes), and the
register tile (rows x outputs) differs per kernel. Why one module file per
kernel: numba's on-disk cache is keyed by file and line, so two kernels built
from one template in one file would overwrite each other's cache entries.

Reduction order (the batch-invariance contract): for output o of row r,
    t = 0
    for each block b along the input (BS elements):
        a_p = sum over i = p, p+P, p+2P, ... of x[r, b*BS+i] * q[o, b*BS+i]   (fma, in i order)
        a = a_0 + a_1 + ... (left to right)
        t = t + a * scale[b, o]          (scaled kinds)
        t = t + xsum[r, b] * offset[b, o]  (offset kinds; xsum is the block's sum of x)
Every tile shape emits exactly these operations for every row, so a row's
result never depends on which tile (or which call) it landed in.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from echoline.kernels.cpu.numba_setup import cache_root

_LOCK = threading.Lock()
_LOADED: dict[str, Callable] = {}


@dataclass(frozen=True)
class KernelSpec:
    """Everything that shapes one matmul kernel's machine code."""

    group: int  # outputs per weight group (layout)
    block: int  # inputs per scale block (layout)
    partials: int  # interleaved partial sums per block (part of the reduction order)
    scaled: bool  # per-block scale (False for float weights)
    offset: bool  # per-block offset (Q4_1, Q5_1, K-quants)
    wdtype: str  # "int8" or "float32"
    tiles: tuple[tuple[int, int], ...]  # (rows, outputs) register tiles, rows descending to 1

    def key(self) -> str:
        raw = repr(self)
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


class _Consts:
    """uint64 constants used by the generated source (index math stays unsigned).

    Why unsigned: numba wraps negative signed indices, and that check is emitted
    per lane, which blocks vectorization; unsigned indices have no such check.
    """

    def __init__(self) -> None:
        self.values: set[int] = set()

    def __call__(self, k: int) -> str:
        self.values.add(k)
        return f"U{k}"


def _tile_body(spec: KernelSpec, rows: int, width: int, ind: str, u: _Consts) -> list[str]:
    """Source lines computing rows [r0, r0+rows) x outputs [o0, o0+width) of group g."""
    G, BS, P = spec.group, spec.block, spec.partials
    lines: list[str] = []
    add = lines.append
    R, W = range(rows), range(width)
    for r in R:
        add(ind + " = ".join(f"t{r}_{o}" for o in W) + " = f0")
    add(ind + "for b in range(nblocks):")
    i1 = ind + "    "
    add(i1 + "bu = b")
    for p in range(P):
        for r in R:
            add(i1 + " = ".join(f"a{p}_{r}_{o}" for o in W) + " = f0")
    add(i1 + f"qb = (gu * nblocks + bu) * {u(BS * G)} + o0")
    add(i1 + f"xb = bu * {u(BS)}")
    add(i1 + f"for ii in range({u(BS // P)}):")
    i2 = i1 + "    "
    add(i2 + f"iu = ii * {u(P)}")
    for p in range(P):
        add(i2 + f"qi = qb + (iu + {u(p)}) * {u(G)}")
        add(i2 + f"xi = r0 * rs + (xb + iu + {u(p)}) * cs")
        for r in R:
            add(i2 + f"xv{r} = x[xi + {u(r)} * rs]")
        for o in W:
            add(i2 + f"w{o} = f32(q[qi + {u(o)}])")
        for r in R:
            for o in W:
                add(i2 + f"a{p}_{r}_{o} += xv{r} * w{o}")
    add(i1 + f"sb = (gu * nblocks + bu) * {u(G)} + o0")
    if spec.offset:
        for r in R:
            add(i1 + f"xs{r} = xs[(r0 + {u(r)}) * nblocks + bu]")
    for o in W:
        if spec.scaled:
            add(i1 + f"s{o} = s[sb + {u(o)}]")
        if spec.offset:
            add(i1 + f"m{o} = m[sb + {u(o)}]")
    for r in R:
        for o in W:
            acc = " + ".join(f"a{p}_{r}_{o}" for p in range(P))
            if P > 1:
                add(i1 + f"a_ = {acc}")
                acc = "a_"
            if spec.scaled:
                add(i1 + f"t{r}_{o} = t{r}_{o} + {acc} * s{o}")
            else:
                add(i1 + f"t{r}_{o} = t{r}_{o} + {acc}")
            if spec.offset:
                add(i1 + f"t{r}_{o} = t{r}_{o} + xs{r} * m{o}")
    add(ind + f"oc = col0 + gu * {u(G)} + o0")
    for r in R:
        add(ind + f"orow = (r0 + {u(r)}) * ldo + oc")
        for o in W:
            add(ind + f"out[orow + {u(o)}] = t{r}_{o}")
    return lines


def matmul_source(spec: KernelSpec) -> str:
    """Python source of ``kernel(x, xs, q, s, m, out, n, ldo, col0, nblocks, ngroups, rs, cs)``.

    All arrays are flat: x holds input (row r, column c) at ``r * rs + c * cs`` (rows as
    they are, or transposed: ``matmul.TRANSPOSE_ROWS`` says when and why; the strides are
    run-time values because a build specialised to row-major x ran 2-row products 20 %
    slower), xs (n*nblocks) block sums of x, q the weights
    laid out (group, block, i, output-in-group), s and m (group, block,
    output-in-group), out (n*ldo) written at columns [col0, col0 + ngroups*G).
    The integer arguments must be numpy uint64.
    """
    G = spec.group
    for _rows, width in spec.tiles:
        if G % width:
            raise ValueError(f"tile width {width} does not divide group {G}")
    if spec.tiles[-1][0] != 1:
        raise ValueError("the last tile must have one row")
    u = _Consts()
    u(0)
    # An "absorbing" first tile, one row taller than the next (5 over 4): used only as
    # often as it turns a 4-row plan's leftover rows into the same number of passes
    # (n = 4q + r: r tiles of 5 when q >= r, e.g. 9 = 5 + 4, 13 = 5 + 4 + 4, 17 = 5 + 4 + 4 + 4;
    # 16 stays 4 + 4 + 4 + 4 and 6 stays 4 + 2). Which tile runs a row never changes its bits.
    tiles = spec.tiles
    absorb = len(tiles) > 1 and tiles[0][0] == tiles[1][0] + 1
    body = [
        "@njit(parallel=True, fastmath={'contract'}, cache=True, nogil=True, boundscheck=False)",
        "def kernel(x, xs, q, s, m, out, n, ldo, col0, nblocks, ngroups, rs, cs):",
    ]
    if absorb:
        step = tiles[1][0]
        body += [
            f"    nq = n // {u(step)}",
            f"    nr = n - nq * {u(step)}",
            "    nabs = nr if nq >= nr else U0",
        ]
    body += [
        "    for g in prange(ngroups):",
        "        gu = U0 + g",
        "        r0 = U0",
    ]
    for i, (rows, width) in enumerate(tiles):
        if absorb and i == 0:
            body.append(f"        while r0 + {u(rows)} <= n and r0 < nabs * {u(rows)}:")
        else:
            body.append(f"        while r0 + {u(rows)} <= n:")
        body.append(f"            for o0i in range({u(G // width)}):")
        body.append(f"                o0 = o0i * {u(width)}")
        body.extend(_tile_body(spec, rows, width, " " * 16, u))
        body.append(f"            r0 += {u(rows)}")
    head = [
        "# generated by kernels/cpu/codegen.py; do not edit",
        "import numpy as np",
        "from numba import njit, prange",
        "",
        "f32 = np.float32",
        "f0 = np.float32(0.0)",
    ]
    head += [f"U{k} = np.uint64({k})" for k in sorted(u.values)]
    return "\n".join(head + ["", ""] + body) + "\n"


def load_kernel(spec: KernelSpec) -> Callable:
    """Import (writing first if needed) the generated module for ``spec``; cached per process."""
    return load_generated(f"echoline_mm_{spec.key()}", lambda: matmul_source(spec))


def load_generated(name: str, source: Callable[[], str]) -> Callable:
    """``kernel`` of the module ``name`` written from ``source()`` under the cache root.

    Also for other generated kernels (``q8act``): numba caches a compiled function by its
    file, but not a closure over objects made at run time (it recompiled those in every
    process), so a kernel that must call such objects gets a module of its own.
    """
    with _LOCK:
        fn = _LOADED.get(name)
        if fn is not None:
            return fn
        path = cache_root() / f"{name}.py"
        text = source()
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        mod_spec = importlib.util.spec_from_file_location(name, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        fn = module.kernel
        _LOADED[name] = fn
        return fn
