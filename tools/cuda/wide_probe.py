"""Device probe (issue 21): the output heads alone, on every product kernel family.

Random GGUF-block heads of the real shapes (no model file): Qwen2.5-Coder-0.5B (Q8_0
151936 x 896), SmolLM2-135M (Q8_0 49152 x 576, tied embedding) and Qwen2.5-Coder-1.5B
(Q6_K 151936 x 1536). For each, ``b.matmul(x, head)`` at 1 / 8 / 16 rows inside a CUDA
graph of back-to-back launches, for each policy: the CUDA cores, mt_body on the tensor
cores (the round-6 kernel), and the staged wide kernel (mtw_body) with 1 or 2 stages, a
persistent grid or one block per tile. Checks on the way: every wide variant gives the
same bits, row 0 of 16 equals its one-row call, and the first and last 1024 columns are
within the f16 bound of a float64 reference (x rounded as the kernels round it).

    python3 -m tools.cuda.wide_probe
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np
from echoline.kernels.cuda.reference import tc_round

from tools.cuda.bench_device import graph_op_time, random_blocks

Q = gguf.GGMLQuantizationType

HEADS = {
    "qwen0.5b-head": (151936, 896, Q.Q8_0),
    "smollm2-head": (49152, 576, Q.Q8_0),
    "qwen1.5b-head": (151936, 1536, Q.Q6_K),
}
OFF = {"tensor_products": False}
MT = {
    "tensor_products": True,
    "tensor_max_in": 10**9,
    "tensor_max_cols": 10**9,
    "tensor_wide": False,
}
WIDE = {"tensor_products": True, "tensor_wide": True, "tensor_wide_min_cols": 1}
POLICIES = {
    "cuda-core": OFF,
    "mt (round 6)": MT,
    "wide s2 persistent": {**WIDE, "tensor_wide_stages": 2, "tensor_wide_persistent": True},
    "wide s1 persistent": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": True},
    "wide s2 per-tile": {**WIDE, "tensor_wide_stages": 2, "tensor_wide_persistent": False},
    "wide s1 per-tile": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": False},
}


def worst_over_bound(w: np.ndarray, x: np.ndarray, got: np.ndarray) -> float:
    """max |got - W·round(x)| over its float32 accumulation bound (≤ 1 passes)."""
    w64 = w.astype(np.float64)
    want = tc_round(x) @ w64.T
    bound = 4 * w.shape[1] * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(w64).T) + 1e-30
    return float(np.max(np.abs(got.astype(np.float64) - want) / bound))


def main() -> int:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default=",".join(HEADS))
    ap.add_argument("--ns", default="1,8,16")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    ns = [int(v) for v in args.ns.split(",")]
    rng = np.random.default_rng(0)
    b = CupyBackend()
    keep = {a: getattr(b, a) for cfg in POLICIES.values() for a in cfg}
    table = []
    for name in args.heads.split(","):
        rows, cols, q = HEADS[name]
        t = QuantTensor(name, q, (rows, cols), random_blocks(rng, rows, cols, q))
        head = b.prepare_matrix([t])
        mb = t.data.nbytes / 1e6
        x = rng.standard_normal((max(ns), cols)).astype(np.float32)
        xd = cupy.asarray(x)
        pick = np.r_[0:1024, rows - 1024 : rows]
        wref = t.dequantize_rows(pick)
        bits = None
        for pol, cfg in POLICIES.items():
            for a, v in cfg.items():
                setattr(b, a, v)
            wide = b._tensor_wide(head)
            full = b.to_host(b.matmul(xd[:16], head))
            one = b.to_host(b.matmul(xd[:1], head))
            assert np.isfinite(full).all(), f"{name} {pol}: not finite"
            same_row = np.array_equal(one[0], full[0])
            err = worst_over_bound(wref, x[:16], full[:, pick]) if pol != "cuda-core" else 0.0
            if wide:
                if bits is None:
                    bits = full
                assert np.array_equal(bits, full), f"{name} {pol}: wide variants differ"
            us = []
            for n in ns:
                xn = xd[:n]
                us.append(graph_op_time(b, lambda xn=xn, h=head: b.matmul(xn, h), args.reps) * 1e6)
            line = (
                f"{name:14s} {pol:20s} wide={int(wide)} "
                + " ".join(f"n={n}:{u:7.1f}us" for n, u in zip(ns, us, strict=True))
                + f"  {mb / us[0]:5.2f} TB/s@1  row0==1row {same_row}  err/bound {err:.2e}"
            )
            print(line, flush=True)
            table.append(line)
        for a, v in keep.items():
            setattr(b, a, v)
        del head, t
        b._uploads.clear()
        cupy.get_default_memory_pool().free_all_blocks()
    print("\n== wide probe ==\n" + "\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
