"""Attention kernels alone at SmolLM2 / Qwen2.5-1.5B / Qwen2.5-0.5B shapes (for ncu).

    ncu --clock-control none --kernel-name regex:attn_ python3 -m tools.cuda.attn_probe \
        [--shapes smollm2,qwen1.5b,qwen0.5b] [--context 2048]
"""

from __future__ import annotations

import argparse

import cupy
import numpy as np
from echoline.engine.backends.cupy_backend import CupyBackend

#: name -> (query heads, KV heads, head dim)
SHAPES = {"smollm2": (9, 3, 64), "qwen1.5b": (12, 2, 128), "qwen0.5b": (14, 2, 64)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2,qwen1.5b")
    ap.add_argument("--context", type=int, default=2048)
    args = ap.parse_args()
    b = CupyBackend()
    rng = np.random.default_rng(0)
    for name in args.shapes.split(","):
        heads, kvh, hd = SHAPES[name]
        ctx = args.context
        cap = ctx + 64
        kc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
        vc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
        for n in (1, 16):
            q = cupy.asarray(rng.standard_normal((n, heads, hd)).astype(np.float32))
            pos = np.arange(ctx - n, ctx)
            for _ in range(2):
                b.attention(q, kc, vc, pos, 0, 0.125)
    b.synchronize()


if __name__ == "__main__":
    main()
