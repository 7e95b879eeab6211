"""Device probe: Qwen2.5-Coder-7B's products alone, per kernel policy.

Random Q4_K_M blocks of the 7B's shapes (q|k Q4_K + v Q6_K, o Q4_K, gate|up Q4_K, down Q6_K
and Q4_K, the Q6_K head of 152,064 columns; ``--types q5_k`` / ``q8_0`` swap Q4_K for that
type, as the Q5_K_M and Q8_0 files do). Each product is timed inside a CUDA graph of
back-to-back calls (``bench_device.graph_op_time``, as a decode step runs it) at each
``--rows`` count under each ``--policies`` setting of the backend, with the bandwidth its
weight bytes imply at one row. Then exactness, on fresh random x: under every policy each
row of a 16-row call equals the same row called alone, bit for bit (``rows==1row``), and each
policy's 16-row result against the first policy's (``same``: bit-identical; else the largest
difference relative to that row's largest value).

    python3 -m tools.cuda.prod7b_probe [--policies stream_off,stream] [--rows 1,16]
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np

from tools.cuda.bench_device import graph_op_time
from tools.cuda.synth_gguf import random_blocks

Q = gguf.GGMLQuantizationType
D, FF, KV, VOCAB = 3584, 18944, 512, 152064

#: name -> backend attributes set for that run
POLICIES = {
    "default": {},
    "stream_off": {"tensor_stream": False},
    "stream": {"tensor_stream": True},
    "stream_d8": {"tensor_stream": True, "tensor_stream_stages": 8},
    "cuda_cores": {"tensor_products": False},
    "no_split": {"tensor_stream": False, "tensor_split": False},
    "no_wide": {"tensor_stream": False, "tensor_wide": False},
}


def product_ops(b, w: dict, x, h, g, bias) -> dict:
    """name -> f(rows) running that product on the first ``rows`` rows of x (or h)."""
    return {
        "gate_up": lambda n: b.norm_matmul_glu(x[:n], g, 1e-6, w["gate_up"], FF, False),
        "down_q6k": lambda n: b.matmul_add(h[:n], w["down_q6k"], x[:n]),
        "down_q": lambda n: b.matmul_add(h[:n], w["down_q"], x[:n]),
        "qkv": lambda n: b.norm_matmul(x[:n], g, 1e-6, w["qkv"], bias),
        "o": lambda n: b.matmul_add(x[:n], w["o"], x[:n]),
        "head": lambda n: b.matmul(x[:n], w["head"]),
    }


def main() -> None:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--policies", default="stream_off,stream")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--types", default="q4_k", help="the main type: q4_k, q5_k or q8_0")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    qt = {"q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q8_0": Q.Q8_0}[args.types]
    six = Q.Q8_0 if qt == Q.Q8_0 else Q.Q6_K
    rng = np.random.default_rng(0)
    parts = {
        "gate_up": [(FF, D, qt), (FF, D, qt)],
        "down_q6k": [(D, FF, six)],
        "down_q": [(D, FF, qt)],
        "qkv": [(D + KV, D, qt), (KV, D, six)],
        "o": [(D, D, qt)],
        "head": [(VOCAB, D, six)],
    }
    blocks = {k: [(r, c, q, random_blocks(rng, r, c, q)) for r, c, q in v] for k, v in parts.items()}
    nbytes = {k: sum(b.nbytes for *_, b in v) for k, v in blocks.items()}
    x = cupy.asarray(rng.standard_normal((16, D)).astype(np.float32))
    h = cupy.asarray(rng.standard_normal((16, FF)).astype(np.float32))
    g = cupy.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(D + 2 * KV).astype(np.float32))
    ns = [int(r) for r in args.rows.split(",")]
    first: dict | None = None
    table = []
    for pol in args.policies.split(","):
        b = CupyBackend()
        for attr, val in POLICIES[pol].items():
            setattr(b, attr, val)
        w = {k: b.prepare_matrix([QuantTensor(f"{k}{i}", q, (r, c), data) for i, (r, c, q, data) in enumerate(v)])
             for k, v in blocks.items()}
        ops = product_ops(b, w, x, h, g, bias)
        for n in ns:
            line = []
            for name, fn in ops.items():
                t = graph_op_time(b, lambda fn=fn, n=n: fn(n), args.reps)
                line.append(f"{name} {t * 1e6:6.1f}us {nbytes[name] / t / 1e9:5.0f}GB/s")
            table.append(f"{pol:>11} rows {n:>2}: " + " | ".join(line))
            print(table[-1], flush=True)
        res = {}
        for name, fn in ops.items():
            full = cupy.asnumpy(fn(16))
            alone = np.concatenate([cupy.asnumpy(_one(b, name, w, x, h, g, bias, i)) for i in range(16)])
            res[name] = (full, bool(np.array_equal(full, alone)), bool(np.isfinite(full).all()))
        first = first or res
        line = []
        for name, (full, rows_ok, finite) in res.items():
            ref = first[name][0]
            same = np.array_equal(full, ref)
            rel = float(np.max(np.abs(full - ref).max(1) / np.abs(ref).max(1)))
            line.append(f"{name} rows==1row {rows_ok} finite {finite} " + ("same" if same else f"rel {rel:.1e}"))
        table.append(f"{pol:>11} exact: " + " | ".join(line))
        print(table[-1], flush=True)
        del w, b
        cupy.get_default_memory_pool().free_all_blocks()
    print("== prod7b table ==")
    print("\n".join(table))


def _one(b, name: str, w: dict, x, h, g, bias, i: int):
    """Product ``name`` of row ``i`` alone (a one-row view at that row)."""
    ops = product_ops(b, w, x[i:], h[i:], g, bias)
    return ops[name](1)


if __name__ == "__main__":
    main()
