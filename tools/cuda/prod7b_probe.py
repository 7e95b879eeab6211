"""Device probe: Qwen2.5-Coder-7B's products alone, per kernel policy (issue 49, part 5).

Random Q4_K_M blocks of the 7B's shapes (q|k Q4_K + v Q6_K, o Q4_K, gate|up Q4_K, down Q6_K
and Q4_K, the Q6_K head of 152,064 columns); each product timed eagerly (median of ``--iters``
calls, each synchronized) at 1 and 16 rows, under each ``--policies`` setting of the backend,
with the bandwidth its weight bytes imply.

    python3 -m tools.cuda.prod7b_probe [--iters 30] [--mix q4_k_m|q8_0] [--policies batch0,batch17]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np

from tools.cuda.synth_gguf import random_blocks

Q = gguf.GGMLQuantizationType
D, FF, KV, VOCAB = 3584, 18944, 512, 152064

#: name -> backend attributes set for that run
POLICIES = {
    "default": {},
    "cuda_cores": {"tensor_products": False},
    "no_split": {"tensor_split": False},
    "no_wide": {"tensor_wide": False},
    "split_cluster0": {"tensor_split_cluster": False},
    "mv0": {"tensor_int8_mv_rows": 0},  # the integer form's few-row products off (mtv)
    "wide_groups2": {"tensor_wide_row_groups": 2},  # the head's rows in 2 / 4 groups (same bits)
    "wide_groups4": {"tensor_wide_row_groups": 4},
    # past 16 rows: the register bound of NT 4 / 8 kernels (no spills at 3 / 2: kernels.cu
    # MT_MINB_ROWS), and eight 8-row tiles per pass past 32 rows (MT_ROW_TILES8)
    "rows_minb3": {"tensor_min_blocks_rows": 3},
    "nt8": {"tensor_max_row_tiles": 8},
    "nt8_minb2": {"tensor_max_row_tiles": 8, "tensor_min_blocks_rows": 2},
    # the staged many-row kernels of the integer form (kernels.cu mtb): off, and from 17 rows
    # (the default since 2026-12-07)
    "batch0": {"tensor_int8_batch_min_rows": 0},
    # batch17 / batch17w: offset codes (signed codes are the default since 2026-12-08)
    "batch17": {"tensor_int8_batch_min_rows": 17, "tensor_int8_signed_codes": False},
    "batch17w": {"tensor_int8_batch_min_rows": 17, "tensor_int8_batch_weight_rows": 64,
                 "tensor_int8_signed_codes": False},  # mtbw
    # the signed-byte types' codes as s8 (kernels.cu MT_SIGNED; Q8_0, IQ4_NL, IQ4_XS only)
    "batch17s": {"tensor_int8_batch_min_rows": 17, "tensor_int8_signed_codes": True},
    "batch17ws": {"tensor_int8_batch_min_rows": 17, "tensor_int8_batch_weight_rows": 64,
                  "tensor_int8_signed_codes": True},
}


def time_ops(b, w: dict, n: int, rng: np.random.Generator, iters: int, nbytes: dict) -> str:
    """Each product at ``n`` rows: median µs of ``iters`` synchronized calls, and GB/s."""
    import cupy

    x = cupy.asarray(rng.standard_normal((n, D)).astype(np.float32))
    h = cupy.asarray(rng.standard_normal((n, FF)).astype(np.float32))
    g = cupy.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
    bias = cupy.asarray(rng.standard_normal(w["qkv"].out_features).astype(np.float32))
    ops = {
        "gate_up": lambda: b.norm_matmul_glu(x, g, 1e-6, w["gate_up"], FF, False),
        "down_q6k": lambda: b.matmul_add(h, w["down_q6k"], x),
        "down_q4k": lambda: b.matmul_add(h, w["down_q4k"], x),
        "qkv": lambda: b.norm_matmul(x, g, 1e-6, w["qkv"], bias),
        "o": lambda: b.matmul_add(x, w["o"], x),
        "head": lambda: b.matmul(x, w["head"]),
    }
    line = []
    for name, fn in ops.items():
        fn()
        b.synchronize()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            b.synchronize()
            ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        line.append(f"{name} {t * 1e6:7.1f}us {nbytes[name] / t / 1e9:6.0f}GB/s")
    return " | ".join(line)


def main() -> None:
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--mix", default="q4_k_m", choices=("q4_k_m", "q8_0"),
                    help="the file's types: a Q4_K_M file's (default) or every weight Q8_0")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q4, q6 = (Q.Q4_K, Q.Q6_K) if args.mix == "q4_k_m" else (Q.Q8_0, Q.Q8_0)
    parts = {  # in a Q8_0 file both downs are Q8_0 (two names kept for one table)
        "gate_up": [(FF, D, q4), (FF, D, q4)],
        "down_q6k": [(D, FF, q6)],
        "down_q4k": [(D, FF, q4)],
        "qkv": [(D + KV, D, q4), (KV, D, q6)],
        "o": [(D, D, q4)],
        "head": [(VOCAB, D, q6)],
    }
    blocks = {k: [(r, c, q, random_blocks(rng, r, c, q)) for r, c, q in v] for k, v in parts.items()}
    nbytes = {k: sum(b.nbytes for *_, b in v) for k, v in blocks.items()}
    for pol in args.policies.split(","):
        b = CupyBackend()
        for attr, val in POLICIES[pol].items():
            setattr(b, attr, val)
        w = {k: b.prepare_matrix([QuantTensor(f"{k}{i}", q, (r, c), data) for i, (r, c, q, data) in enumerate(v)])
             for k, v in blocks.items()}
        for n in (int(r) for r in args.rows.split(",")):
            print(f"{pol:>14} rows {n:>2}: " + time_ops(b, w, n, rng, args.iters, nbytes), flush=True)


if __name__ == "__main__":
    main()
