"""Micro-benchmark: f32-activation matmul time of real GGUF matrices under several register
tile sets, interleaved in one process (not a test).

    python -m tools.cpu.bench_tiles MODEL.gguf [--sets w32,w16,m64] [--layers 4] [--reps 9]

Takes the first ``--layers`` layers' fused products (q|k|v, o, gate|up, down) and the
output head, prepares them once per tile set, checks that every set gives the same bits,
then times all the products once per row count, the sets interleaved within each
repetition, and prints medians with each set's ratio to the first. Kernels compile on
first use (cached afterwards), so the first run of a new set takes minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from echoline.engine.gguf_file import GGUFFile
from echoline.kernels.cpu.matmul import NARROW_TILES, WIDE_TILES, matmul, prepare

from tools.cpu.bench_matmul import model_matrices

#: Named tile sets (rows, outputs), largest row count first; "m64" is NARROW_TILES today.
SETS: dict[str, tuple[tuple[int, int], ...]] = {
    "w64": WIDE_TILES,
    "w32": ((5, 32), (4, 32), (3, 32), (2, 32), (1, 32)),
    "w16": ((5, 16), (4, 16), (3, 16), (2, 16), (1, 16)),
    "m32": ((5, 16), (4, 16), (3, 16), (2, 16), (1, 32)),
    "m64": ((5, 16), (4, 16), (3, 16), (2, 16), (1, 64)),
    "narrow": NARROW_TILES,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--sets", default="w32,w16,m64", help=f"comma-separated names of {sorted(SETS)}")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    names = args.sets.split(",")
    rows = [int(r) for r in args.rows.split(",")]
    mats = model_matrices(GGUFFile(args.model))
    chosen = [m for m in mats if m[0] != "head"][: 4 * args.layers] + [m for m in mats if m[0] == "head"]
    prepared = {n: [prepare(ts, SETS[n]) for _, ts in chosen] for n in names}
    rng = np.random.default_rng(0)
    xs = {p.in_features: rng.standard_normal((max(rows), p.in_features)).astype(np.float32)
          for p in prepared[names[0]]}
    for n in names:  # compiles, and checks the bits against the first set
        for a, b in zip(prepared[names[0]], prepared[n], strict=True):
            for r in rows:
                if not np.array_equal(matmul(xs[a.in_features][:r], a), matmul(xs[b.in_features][:r], b)):
                    raise SystemExit(f"set {n} changed the bits at {r} rows")
    times: dict[tuple[str, int], list[float]] = {(n, r): [] for n in names for r in rows}
    for _ in range(args.reps):
        for r in rows:
            for n in names:
                t = time.perf_counter()
                for p in prepared[n]:
                    matmul(xs[p.in_features][:r], p)
                times[(n, r)].append(time.perf_counter() - t)
    print(f"{args.model.name}: {len(chosen)} products, medians of {args.reps}, ms (ratio to {names[0]})")
    for r in rows:
        base = statistics.median(times[(names[0], r)])
        cells = [f"{n} {statistics.median(times[(n, r)]) * 1e3:8.2f} ({statistics.median(times[(n, r)]) / base:.3f})"
                 for n in names]
        print(f"rows {r:2d}: " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
