"""One weight matrix (default: Gemma 3's tied 262144 x 640 head) at 1/8/16 rows per tile set.

Run: ``flock /tmp/echoline-cpu.lock python -m tools.cpu.bench_head --tiles 6x64,4x32,2x64,1x64``.
Every tile set must give the same bits (asserted); a new tile set compiles a new kernel
(~30-60 s) the first time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from echoline.engine.gguf_file import GGUFFile
from echoline.kernels.cpu.matmul import DEFAULT_TILES, matmul, prepare_cached

GEMMA = "/root/.cache/echoline/models/gemma-3-270m-q4_k_m.gguf"


def _tiles(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(r), int(o)) for r, o in (p.split("x") for p in text.split(",")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=GEMMA)
    ap.add_argument("--tensor", default="token_embd.weight")
    ap.add_argument("--tiles", action="append", default=[], help="e.g. 6x64,4x32,2x64,1x64")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    t = GGUFFile(args.model).tensor(args.tensor)
    print(f"{args.tensor}: {t.qtype.name} {t.shape}")
    sets = {"default": DEFAULT_TILES} | {s: _tiles(s) for s in args.tiles}
    x = np.random.default_rng(0).standard_normal((16, t.cols)).astype(np.float32)
    ref: dict[int, np.ndarray] = {}
    for name, tiles in sets.items():
        pm = prepare_cached([t], tiles)
        for n in (1, 8, 16):
            y = matmul(x[:n], pm)
            assert np.array_equal(ref.setdefault(n, y), y), f"{name}: bits differ at {n} rows"
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                matmul(x[:n], pm)
                times.append(time.perf_counter() - t0)
            best = min(times)
            print(f"{name:>28} rows {n:2d}: {best * 1e3:7.2f} ms  {n * t.rows * t.cols / best / 1e9:6.1f} G MAC/s")


if __name__ == "__main__":
    main()
