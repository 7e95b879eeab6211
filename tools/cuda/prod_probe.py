"""Device probe: the Qwen2.5-Coder-shaped products alone (for ncu / quick timing).

Builds random GGUF-block weights of the real shapes (no model file), then runs each
product ``--iters`` times at ``--rows`` rows: for the 1.5B gate|up+glu (Q4_K 2x8960x1536,
norm fused), down+add (Q6_K 1536x8960), q|k|v (Q4_K + Q6_K), o+add (Q4_K), and the head
(Q6_K 151936x1536); ``--shape 0.5b`` the 0.5B's (Q5_0 mostly, a Q8_0 head).

    ncu --clock-control none -k regex:mm_ python3 -m tools.cuda.prod_probe --iters 1
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np

from tools.cuda.bench_device import random_blocks

Q = gguf.GGMLQuantizationType


def main() -> None:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--shape", choices=("1.5b", "0.5b"), default="1.5b")
    ap.add_argument("--ops", default="gate_up,down,qkv,o,head")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    b = CupyBackend()

    def w(*parts: tuple[int, int, Q]):
        ts = [QuantTensor(f"t{i}", q, (r, c), random_blocks(rng, r, c, q)) for i, (r, c, q) in enumerate(parts)]
        return b.prepare_matrix(ts)

    if args.shape == "1.5b":
        d, ff, vocab = 1536, 8960, 151936
        gate_up = w((ff, d, Q.Q4_K), (ff, d, Q.Q4_K))
        down = w((d, ff, Q.Q6_K))
        qkv = w((d + 256, d, Q.Q4_K), (256, d, Q.Q6_K))
        wo = w((d, d, Q.Q4_K))
        head = w((vocab, d, Q.Q6_K))
    else:  # Qwen2.5-Coder-0.5B: Q5_0 almost everywhere, Q8_0 v and head
        d, ff, vocab = 896, 4864, 151936
        gate_up = w((ff, d, Q.Q5_0), (ff, d, Q.Q5_0))
        down = w((d, ff, Q.Q4_K))
        qkv = w((d + 128, d, Q.Q5_0), (128, d, Q.Q8_0))
        wo = w((d, d, Q.Q5_0))
        head = w((vocab, d, Q.Q8_0))
    n = args.rows
    x = cupy.asarray(rng.standard_normal((n, d)).astype(np.float32))
    h = cupy.asarray(rng.standard_normal((n, ff)).astype(np.float32))
    g = cupy.asarray((1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(qkv.out_features).astype(np.float32))
    ops = {
        "gate_up": lambda: b.norm_matmul_glu(x, g, 1e-6, gate_up, ff, False),
        "down": lambda: b.matmul_add(h, down, x),
        "qkv": lambda: b.norm_matmul(x, g, 1e-6, qkv, bias),
        "o": lambda: b.matmul_add(x, wo, x),
        "head": lambda: b.matmul(x, head),
    }
    for name, fn in ops.items():
        if name not in args.ops.split(","):
            continue
        fn()
        b.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        b.synchronize()
        print(f"{name}: {(time.perf_counter() - t0) / args.iters * 1e6:.1f} us/call (eager)")


if __name__ == "__main__":
    main()
