"""Attention kernels alone at SmolLM2 / Qwen2.5-1.5B / 0.5B / Coder-7B shapes (for ncu).

    ncu --clock-control none --kernel-name regex:attn_ python3 -m tools.cuda.attn_probe \
        [--shapes smollm2,qwen1.5b,qwen0.5b] [--context 2048]

``--time``: each pass inside CUDA graphs instead (µs a call at ``--rows``, default 1 / 8 / 16): the whole
attention, pass 1 alone, the combine alone, the tensor-core pass 1 (as chosen; on 4 warps, on 8, two tiles a block), the whole attention with
the other kernel family than the shape's default, for a cache of ``context + 64`` rows and for one
of the next power of two (the session store's graph capacities), and items per block.
"""

from __future__ import annotations

import argparse

import cupy
import numpy as np
from echoline.engine.backends.cupy_backend import CupyBackend

from tools.cuda.bench_device import graph_op_time

#: name -> (query heads, KV heads, head dim)
SHAPES = {
    "smollm2": (9, 3, 64), "qwen1.5b": (12, 2, 128), "qwen0.5b": (14, 2, 64), "qwen7b": (28, 4, 128),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2,qwen1.5b")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--time", action="store_true", help="time each pass inside graphs")
    ap.add_argument("--rows", default="1,8,16", help="row counts for --time")
    args = ap.parse_args()
    b = CupyBackend()
    if args.time:
        for name in args.shapes.split(","):
            for line in time_passes(b, name, args.context, [int(r) for r in args.rows.split(",")]):
                print(line, flush=True)
        return
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


def time_passes(b: CupyBackend, name: str, ctx: int, rows: list[int]) -> list[str]:
    """µs a call inside graphs of the attention's passes (see the module docstring)."""
    heads, kvh, hd = SHAPES[name]
    rng = np.random.default_rng(0)
    lines = []
    for cap in (ctx + 64, 1 << (ctx + 63).bit_length()):
        kc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
        vc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
        for n in rows:
            q = cupy.asarray(rng.standard_normal((n, heads, hd)).astype(np.float32))
            pos = b.device_ints(np.arange(ctx - n, ctx))
            call, out = b._attention_call(q, kc, vc, pos, 0, 0.125)
            parts = {
                "attention": lambda q=q, kc=kc, vc=vc, pos=pos: b.attention(q, kc, vc, pos, 0, 0.125),
                "pass1": lambda call=call: b._attention_cc(call),
                "combine": lambda call=call, out=out: b._attention_combine(call, out),
                "pass1-tc": lambda call=call: b._attention_tc(call),
            }
            timed = [f"{k} {graph_op_time(b, fn) * 1e6:5.1f}" for k, fn in parts.items()]
            keep = b.tensor_attention_w8_max_tiles, b.tensor_attention_pairs_min_tiles
            for form, w8, pairs in (("w4", 0, 0), ("w8", 1 << 20, 0), ("t2", 0, 1)):
                b.tensor_attention_w8_max_tiles, b.tensor_attention_pairs_min_tiles = w8, pairs
                timed.append(f"pass1-tc-{form} {graph_op_time(b, parts['pass1-tc']) * 1e6:5.1f}")
            b.tensor_attention_w8_max_tiles, b.tensor_attention_pairs_min_tiles = keep
            keep = b.tensor_attention, b.tensor_attention_min_group
            tc = b._tensor_attention(call)
            b.tensor_attention, b.tensor_attention_min_group = not tc, 0
            timed.append(f"attention-tc={not tc} {graph_op_time(b, parts['attention']) * 1e6:5.1f}")
            b.tensor_attention, b.tensor_attention_min_group = keep
            keep = b.attn_items
            for items in (4, 16):
                b.attn_items = items
                timed.append(f"attention@{items}items {graph_op_time(b, parts['attention']) * 1e6:5.1f}")
            b.attn_items = keep
            lines.append(f"{name} ctx {ctx} cap {cap} n={n:<2d} (us): " + ", ".join(timed))
    return lines


if __name__ == "__main__":
    main()
