"""Attention kernels alone at SmolLM2 / Qwen2.5-1.5B shapes, context 2048 (for ncu).

    ncu --clock-control none --kernel-name regex:attn_ python3 -m tools.cuda.attn_probe
"""

from __future__ import annotations

import cupy
import numpy as np
from echoline.engine.backends.cupy_backend import CupyBackend


def main() -> None:
    b = CupyBackend()
    rng = np.random.default_rng(0)
    for heads, kvh, hd in ((9, 3, 64), (12, 2, 128)):
        cap, ctx = 2112, 2048
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
