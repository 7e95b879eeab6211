"""Device probe (issue 21): the long-row products alone, on every kernel family.

Random GGUF-block down projections of the real shapes (no model file): Qwen2.5-Coder-0.5B
(896 x 4864, Q4_K in half its layers and Q6_K in the other half) and Qwen2.5-Coder-1.5B
(1536 x 8960, likewise). For each, ``b.matmul_add(h, down, x)`` at 1 / 8 / 16 rows inside a
CUDA graph of back-to-back launches, for each policy: the CUDA cores, mt_body on the tensor
cores (KW by shape), and the split-K kernels with 2 or 4 warps per block, 4 or 8 blocks per
tile, one or two units in flight (mts) or the tile's blocks as one cluster (mtc), then the
backend's default. Checks on the way: row 0 of 16 equals its
one-row call, the first 256 columns are within the f16 bound of a float64 reference, and
the arrival counters are zero after every policy.

    python3 -m tools.cuda.split_probe
"""

from __future__ import annotations

import gguf
import numpy as np

from tools.cuda.bench_device import random_blocks
from tools.cuda.probe_common import probe_args, release, result_line, row_times, worst_over_bound

Q = gguf.GGMLQuantizationType

SHAPES = {
    "qwen0.5b-down-q4k": (896, 4864, Q.Q4_K),
    "qwen0.5b-down-q6k": (896, 4864, Q.Q6_K),
    "qwen1.5b-down-q4k": (1536, 8960, Q.Q4_K),
    "qwen1.5b-down-q6k": (1536, 8960, Q.Q6_K),
}
#: name -> (backend attributes, forced blocks per tile or None for the default rule)
POLICIES: dict[str, tuple[dict, int | None]] = {
    "cuda-core": ({"tensor_products": False}, None),
    "mt": ({"tensor_products": True, "tensor_split": False, "tensor_max_in": 10**9}, None),
    **{
        f"split w{w} x{s}{tag}": (
            {
                "tensor_products": True,
                "tensor_split": True,
                "tensor_split_warps": w,
                "tensor_split_units": u,
                "tensor_split_cluster": c,
            },
            s,
        )
        for w, s, u, c, tag in (
            (2, 8, 1, False, ""),
            (4, 4, 1, False, ""),
            (4, 8, 1, False, ""),
            (4, 4, 2, False, " u2"),
            (4, 8, 2, False, " u2"),
            (4, 4, 1, True, " cl"),
            (4, 8, 1, True, " cl"),
        )
    },
    "default": ({}, None),
}


def main() -> int:
    import cupy
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.gguf_file import QuantTensor

    args = probe_args("shapes", list(SHAPES))
    ns = args.ns
    rng = np.random.default_rng(0)
    b = CupyBackend()
    defaults = {a: getattr(b, a) for cfg, _ in POLICIES.values() for a in cfg}
    rule = b._tensor_splits
    table = []
    for name in args.shapes.split(","):
        rows, cols, q = SHAPES[name]
        t = QuantTensor(name, q, (rows, cols), random_blocks(rng, rows, cols, q))
        down = b.prepare_matrix([t])
        mb = t.data.nbytes / 1e6
        h = rng.standard_normal((max(ns), cols)).astype(np.float32)
        hd = cupy.asarray(h)
        res = cupy.asarray(rng.standard_normal((max(ns), rows)).astype(np.float32))
        wref = t.dequantize_rows(np.arange(256))
        for pol, (cfg, splits) in POLICIES.items():
            for a, v in {**defaults, **cfg}.items():
                setattr(b, a, v)
            b._tensor_splits = (
                rule if splits is None else (lambda w, s=splits: s if b.tensor_split else 0)
            )
            used = b._tensor_splits(down)
            full = b.to_host(b.matmul_add(hd[:16], down, res[:16]))
            one = b.to_host(b.matmul_add(hd[:1], down, res[:1]))
            assert np.isfinite(full).all(), f"{name} {pol}: not finite"
            assert not bool(cupy.any(b._split_counters)), f"{name} {pol}: a counter left set"
            same_row = np.array_equal(one[0], full[0])
            got = full[:, :256] - b.to_host(res[:16, :256])
            err = worst_over_bound(wref, h[:16], got) if b.tensor_products else 0.0
            us = row_times(b, lambda n, w=down, x=hd, r=res: b.matmul_add(x[:n], w, r[:n]), ns, args.reps)
            line = result_line(f"{name:18s} {pol:15s} splits={used:<2d}", ns, us, mb, same_row, err)
            print(line, flush=True)
            table.append(line)
        b._tensor_splits = rule
        for a, v in defaults.items():
            setattr(b, a, v)
        del down, t
        release(b)
    print("\n== split probe ==\n" + "\n".join(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
