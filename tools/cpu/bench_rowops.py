"""The row work around the products, timed alone: activation quantization, the gated
activation, and attention at 1-4 rows for each head split.

Run: ``python -m tools.cpu.bench_rowops``. Medians of ``--reps`` calls, one thread count
(numba's). The attention part times ``cpu_attention._attention_tiles_parallel`` at every head split
over a dozen layers' worth of caches (so keys and values are not cache-hot, as in a model)
and checks that every split gives the same bits; the split ``cpu_attention.attention`` picks is
starred. Not a test: a developer's view behind the figures in the docstrings of
``q8act._quantize_block``, ``rowops._sigmoid_times`` and ``cpu_attention.attention``.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np
from echoline.kernels.cpu import attention as cpu_attention
from echoline.kernels.cpu import rowops
from echoline.kernels.cpu.q8act import activation_terms

#: (label, query heads, KV heads, head dim) of the real models' attention.
HEADS = [("Qwen 1.5B", 12, 2, 128), ("Qwen 0.5B", 14, 2, 64), ("SmolLM2", 9, 3, 64)]


def median_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def row_work(reps: int, rng: np.random.Generator) -> None:
    for cols in (1536, 8960):
        for n in (1, 16):
            x = rng.standard_normal((n, cols)).astype(np.float32)
            gu = rng.standard_normal((n, 2 * cols)).astype(np.float32)
            q = median_us(lambda x=x: activation_terms(x, True), reps)
            g = median_us(lambda gu=gu, c=cols: rowops.silu_mul(gu[:, :c], gu[:, c:]), reps)
            print(f"{n:>3} rows x {cols:>5}: quantize {q:8.1f} us   silu_mul {g:8.1f} us")


def _tiles(q, layers, pos, hsplit: int) -> np.ndarray:
    """Attention of ``q`` over every layer's caches at one head split; the last output."""
    n, nh, hd = q.shape
    out = np.empty((n, nh * hd), np.float32)
    for k, v in layers:
        kt, off = cpu_attention.key_store(k)
        cpu_attention._attention_tiles_parallel(q, kt, -off, v, pos, 0, np.float32(0.088), cpu_attention.ROW_TILE, hsplit, out)
    return out


def attention(reps: int, rng: np.random.Generator, context: int) -> None:
    for label, nh, nkv, hd in HEADS:
        layers = []
        for _ in range(12):
            k = cpu_attention.empty_keys(context + 64, nkv, hd)
            k[: context + 16] = rng.standard_normal((context + 16, nkv, hd)).astype(np.float32)
            layers.append((k, rng.standard_normal((context + 64, nkv, hd)).astype(np.float32)))
        group = nh // nkv
        for n in (1, 2, 3, 4):
            q = rng.standard_normal((n, nh, hd)).astype(np.float32)
            pos = np.arange(context, context + n, dtype=np.int64)
            first = _tiles(q, layers, pos, 1)
            cells = []
            for hs in sorted({1, (group + 1) // 2, group}):
                us = median_us(functools.partial(_tiles, q, layers, pos, hs), reps) / len(layers)
                same = np.array_equal(_tiles(q, layers, pos, hs), first)
                cells.append(f"split {hs}: {us:7.1f} us{'' if same else ' DIFFERENT BITS'}")
            print(f"{label:>9} {n} rows, {context} keys, per layer: " + "   ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    row_work(args.reps, rng)
    attention(max(10, args.reps // 10), rng, args.context)


if __name__ == "__main__":
    main()
