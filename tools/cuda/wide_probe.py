"""Device probe (issue 21): the output heads alone, on every product kernel family.

Random GGUF-block heads of the real shapes (no model file): Qwen2.5-Coder-0.5B (Q8_0
151936 x 896), SmolLM2-135M (Q8_0 49152 x 576, tied embedding) and Qwen2.5-Coder-1.5B
(Q6_K 151936 x 1536). For each, ``b.matmul(x, head)`` at 1 / 8 / 16 rows inside a CUDA
graph of back-to-back launches, for each policy: the CUDA cores, mt_body on the tensor
cores (the round-6 kernel), and the staged wide kernel (mtw_body) with 1 or 2 stages, a
persistent grid or one block per tile. Checks on the way: every wide variant gives the
same bits (per warp count: the warps set the order of the sums), row 0 of 16 equals its one-row call, and the first and last 1024 columns are
within the f16 bound of a float64 reference (x rounded as the kernels round it).

    python3 -m tools.cuda.wide_probe
"""

from __future__ import annotations

import gguf
import numpy as np

from tools.cuda.bench_device import random_blocks
from tools.cuda.probe_common import probe_args, release, result_line, row_times, worst_over_bound

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
    # session 20: warps splitting a staged tile's units (the sums' order: bits per warp
    # count) and 16-row launches in two row groups (the same bits)
    "wide s1 w2": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": False, "tensor_wide_warps": 2},
    "wide s1 w4": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": False, "tensor_wide_warps": 4},
    "wide s1 w1 rows2": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": False,
                         "tensor_wide_warps": 1, "tensor_wide_row_groups": 2},
    "wide s1 w2 rows2": {**WIDE, "tensor_wide_stages": 1, "tensor_wide_persistent": False,
                         "tensor_wide_warps": 2, "tensor_wide_row_groups": 2},
}
#: attributes a policy leaves as the backend had them (set back before each policy)
RESET = {"tensor_wide_warps": 1, "tensor_wide_row_groups": 1}


def main() -> int:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    args = probe_args("heads", list(HEADS))
    ns = args.ns
    rng = np.random.default_rng(0)
    b = CupyBackend()
    keep = {a: getattr(b, a) for cfg in [*POLICIES.values(), RESET] for a in cfg}
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
        bits: dict[int, np.ndarray] = {}
        for pol, cfg in POLICIES.items():
            for a, v in {**RESET, **cfg}.items():
                setattr(b, a, v)
            wide = b._tensor_wide(head)
            full = b.to_host(b.matmul(xd[:16], head))
            one = b.to_host(b.matmul(xd[:1], head))
            assert np.isfinite(full).all(), f"{name} {pol}: not finite"
            same_row = np.array_equal(one[0], full[0])
            err = worst_over_bound(wref, x[:16], full[:, pick]) if pol != "cuda-core" else 0.0
            if wide:
                want = bits.setdefault(b._wide_warps(), full)
                assert np.array_equal(want, full), f"{name} {pol}: wide variants differ"
            us = row_times(b, lambda n, h=head, x=xd: b.matmul(x[:n], h), ns, args.reps)
            line = result_line(f"{name:14s} {pol:20s} wide={int(wide)}", ns, us, mb, same_row, err)
            print(line, flush=True)
            table.append(line)
        for a, v in keep.items():
            setattr(b, a, v)
        del head, t
        release(b)
    print("\n== wide probe ==\n" + "\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
