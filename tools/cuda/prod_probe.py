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
VOCAB = 151936
#: shape -> (hidden, feed-forward, k and v width each, types of (q|k, o, gate|up), v, down, head);
#: the 0.5B's Q5_0 / Q8_0 / Q4_K mix (half its down projections are Q6_K), the 1.5B's and the
#: Coder-7B's Q4_K_M
SHAPES = {
    "1.5b": (1536, 8960, 256, (Q.Q4_K, Q.Q6_K, Q.Q6_K, Q.Q6_K)),
    "0.5b": (896, 4864, 128, (Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q8_0)),
    "7b": (3584, 18944, 512, (Q.Q4_K, Q.Q6_K, Q.Q6_K, Q.Q6_K)),
}


def main() -> None:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="1.5b")
    ap.add_argument("--ops", default="gate_up,down,qkv,o,head")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    b = CupyBackend()

    def w(*parts: tuple[int, int, Q]):
        ts = [QuantTensor(f"t{i}", q, (r, c), random_blocks(rng, r, c, q)) for i, (r, c, q) in enumerate(parts)]
        return b.prepare_matrix(ts)

    d, ff, kv, (q_main, q_v, q_down, q_head) = SHAPES[args.shape]
    gate_up = w((ff, d, q_main), (ff, d, q_main))
    down = w((d, ff, q_down))
    qkv = w((d + kv, d, q_main), (kv, d, q_v))
    wo = w((d, d, q_main))
    head = w((VOCAB, d, q_head))
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
