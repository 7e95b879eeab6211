"""Micro-benchmark: per-token matmul time of a real GGUF's weights (not a test).

    python -m tools.cpu.bench_matmul [model.gguf ...] [--rows 1,2,4,8,16] [--reps 3]
    python -m tools.cpu.bench_matmul [model.gguf ...] --layout-ab [--rows 1,2,...,17] [--reps 15]

Fuses q|k|v and gate|up as the models do, includes the (tied) output head,
and prints one table per model: prepare time, int8 layout size vs GGUF bytes,
and ms per token (all layers' matmuls once) for each row count: wall time and
process CPU time (with NUMBA_NUM_THREADS=1 the CPU time is a figure that a
busy shared machine distorts less than wall time).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from echoline.engine.gguf_file import GGUFFile
from echoline.kernels.cpu import matmul as matmul_module
from echoline.kernels.cpu.matmul import matmul, prepare

DEFAULT_MODELS = [
    Path.home() / ".cache/echoline/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    Path.home() / ".cache/echoline/models/gemma-3-270m-q4_k_m.gguf",
]


def model_matrices(f: GGUFFile) -> list[tuple[str, list]]:
    """(label, tensors) per fused matmul of one decode step, in call order."""
    out = []
    n_layers = 1 + max(int(k.split(".")[1]) for k in f.tensors if k.startswith("blk."))
    for i in range(n_layers):
        b = f"blk.{i}."
        out.append(("qkv", [f.tensor(b + f"attn_{p}.weight") for p in "qkv"]))
        out.append(("o", [f.tensor(b + "attn_output.weight")]))
        out.append(("gate|up", [f.tensor(b + "ffn_gate.weight"), f.tensor(b + "ffn_up.weight")]))
        out.append(("down", [f.tensor(b + "ffn_down.weight")]))
    head = f.tensors.get("output.weight") or f.tensor("token_embd.weight")
    out.append(("head", [head]))
    return out


def bench_model(path: Path, rows: list[int], reps: int) -> None:
    f = GGUFFile(path)
    mats = model_matrices(f)
    t0 = time.perf_counter()
    prepared = [(label, prepare(ts)) for label, ts in mats]
    prep_s = time.perf_counter() - t0
    gguf_bytes = sum(t.data.nbytes for _, ts in mats for t in ts)
    ours = sum(w.nbytes for _, w in prepared)
    print(f"\n{path.name}: {len(prepared)} matmuls/token, prepare {prep_s:.1f} s (incl. kernel load), "
          f"layout {ours / 2**20:.0f} MiB vs GGUF {gguf_bytes / 2**20:.0f} MiB ({ours / gguf_bytes:.2f}x)")
    rng = np.random.default_rng(0)
    base = None
    print(f"{'rows':>5} {'ms/token':>9} {'x 1 row':>8} {'head ms':>8} {'cpu ms':>8}")
    for n in rows:
        xs = {w.in_features: rng.standard_normal((n, w.in_features)).astype(np.float32) for _, w in prepared}
        for _, w in prepared:
            matmul(xs[w.in_features], w)  # warm
        best, head_best, cpu_best = float("inf"), float("inf"), float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            c = time.process_time()
            for label, w in prepared:
                th = time.perf_counter()
                matmul(xs[w.in_features], w)
                if label == "head":
                    head_best = min(head_best, time.perf_counter() - th)
            best = min(best, time.perf_counter() - t)
            cpu_best = min(cpu_best, time.process_time() - c)
        base = base or best
        print(f"{n:>5} {best * 1e3:>9.2f} {best / base:>8.2f} {head_best * 1e3:>8.2f} {cpu_best * 1e3:>8.2f}")


def layout_ab(path: Path, rows: list[int], reps: int) -> None:
    """All of a model's products per row count, x as rows vs x transposed, interleaved.

    The evidence behind ``matmul.TRANSPOSE_ROWS``: both layouts give the same bits, so the
    choice per row count is speed alone.
    """
    prepared = [prepare(ts) for _, ts in model_matrices(GGUFFile(path))]
    rng = np.random.default_rng(0)
    saved = matmul_module.TRANSPOSE_ROWS
    layouts = {"transposed": (1, 1 << 30), "rows": (0, -1)}

    def run(n: int, layout: str) -> float:
        matmul_module.TRANSPOSE_ROWS = layouts[layout]
        xs = {w.in_features: rng.standard_normal((n, w.in_features)).astype(np.float32) for w in prepared}
        t = time.perf_counter()
        for w in prepared:
            matmul(xs[w.in_features], w)
        return time.perf_counter() - t

    cases = [(n, layout) for n in rows for layout in layouts]
    try:
        for case in cases:
            run(*case)  # warm-up
        times: dict[tuple[int, str], list[float]] = {c: [] for c in cases}
        for rep in range(reps):
            for case in cases if rep % 2 == 0 else cases[::-1]:
                times[case].append(run(*case))
    finally:
        matmul_module.TRANSPOSE_ROWS = saved
    print(f"\n{path.name}: all products per forward, median of {reps} interleaved reps")
    print(f"{'rows':>5} {'transposed ms':>14} {'rows ms':>9} {'rows/transposed':>16}")
    for n in rows:
        t, r = (float(np.median(times[(n, layout)])) for layout in layouts)
        print(f"{n:>5} {t * 1e3:>14.2f} {r * 1e3:>9.2f} {r / t:>16.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layout-ab", action="store_true", help="x as rows vs transposed, per row count")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    for path in args.models or [p for p in DEFAULT_MODELS if p.exists()]:
        if args.layout_ab:
            layout_ab(path, rows, args.reps)
        else:
            bench_model(path, rows, args.reps)


if __name__ == "__main__":
    main()
