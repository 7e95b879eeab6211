"""Attention op alone: the three-stage (decode) path vs the row-tiled path.

Run: ``flock /tmp/echoline-cpu.lock python -m kernels.cpu.bench_attention``. Random
q/k/v, positions ctx0 … ctx0+n-1, both paths interleaved, median of ``--reps``; prints
whether the two paths gave identical bits (they must).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kernels.cpu import ops

#: (query heads, kv heads, head dim, window, context before the rows, rows)
SHAPES = [
    (9, 3, 64, 0, 1950, 300),
    (9, 3, 64, 0, 0, 300),
    (9, 3, 64, 0, 1024, 16),
    (9, 3, 64, 0, 1024, 8),
    (4, 1, 256, 512, 1950, 300),
    (4, 1, 256, 0, 1950, 300),
    (4, 1, 256, 512, 1024, 16),
]


def _run(q, k, v, pos, window, min_rows: int) -> tuple[float, np.ndarray]:
    saved = ops.TILED_MIN_ROWS
    ops.TILED_MIN_ROWS = min_rows
    try:
        t0 = time.perf_counter()
        out = ops.attention(q, k, v, pos, window, 0.125)
        return time.perf_counter() - t0, out
    finally:
        ops.TILED_MIN_ROWS = saved


def bench(nh: int, nkv: int, hd: int, window: int, ctx0: int, n: int, reps: int) -> str:
    rng = np.random.default_rng(0)
    ctx = ctx0 + n
    k = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = np.arange(ctx0, ctx)
    old_path, tiled = 1 << 60, 1
    _, a = _run(q, k, v, pos, window, old_path)
    _, b = _run(q, k, v, pos, window, tiled)
    old, new = [], []
    for _ in range(reps):
        old.append(_run(q, k, v, pos, window, old_path)[0])
        new.append(_run(q, k, v, pos, window, tiled)[0])
    mo, mn = float(np.median(old)), float(np.median(new))
    keys = min(window, ctx) if window else ctx0 + n / 2
    gmacs = 2 * n * nh * hd * keys / mn / 1e9
    return (
        f"H{nh}/KV{nkv} hd{hd} window {window} context {ctx0} rows {n}: three-stage {mo * 1e3:.2f} ms, "
        f"tiled {mn * 1e3:.2f} ms ({mo / mn:.2f}x, {gmacs:.0f} G MAC/s), same bits: {np.array_equal(a, b)}"
    )


def forward_bench(model: str, old_path: bool, reps: int = 3) -> None:
    """Whole forward of ``rows`` new tokens after ``context`` cached ones (the lead's
    prefill profile): best of ``reps``, the cache refilled in 512-row chunks each time."""
    from engine.api import Engine

    if old_path:
        ops.TILED_MIN_ROWS = 1 << 30
    m = Engine.load(model).model
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 2300)]
    for ctx, n in [(0, 300), (1950, 300), (1950, 16), (1950, 8)]:
        best = 1e9
        for _ in range(reps):
            c = m.new_cache(capacity=2600, max_rows=512)
            for s in range(0, ctx, 512):
                m.forward(ids[s : min(ctx, s + 512)], c, all_logits=False)
            t0 = time.perf_counter()
            m.backend.to_host(m.forward(ids[ctx : ctx + n], c, all_logits=False))
            best = min(best, time.perf_counter() - t0)
        path = "three-stage" if old_path else "default"
        print(f"{model} {path} attention: {n} rows at context {ctx}: {best:.4f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--forward", metavar="MODEL", help="time whole forwards of MODEL instead")
    ap.add_argument("--old-path", action="store_true", help="with --forward: force the three-stage path")
    args = ap.parse_args()
    if args.forward:
        forward_bench(args.forward, args.old_path)
        return
    for shape in SHAPES:
        print(bench(*shape, reps=args.reps), flush=True)


if __name__ == "__main__":
    main()
