"""What the single-product device probes share (``wide_probe``, ``split_probe``): their
arguments, the timing of one product at several row counts, the f16 bound check and the
result line, so each probe is only its shapes and its policies."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np
from echoline.kernels.cuda.reference import tc_round

from tools.cuda.bench_device import graph_op_time


def probe_args(option: str, names: Sequence[str]) -> argparse.Namespace:
    """``--<option>`` (comma list, default every name), ``--ns`` row counts, ``--reps``."""
    ap = argparse.ArgumentParser()
    ap.add_argument(f"--{option}", default=",".join(names))
    ap.add_argument("--ns", default="1,8,16")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    args.ns = [int(v) for v in args.ns.split(",")]
    return args


def worst_over_bound(w: np.ndarray, x: np.ndarray, got: np.ndarray) -> float:
    """max |got - W·round(x)| over its float32 accumulation bound (≤ 1 passes)."""
    w64 = w.astype(np.float64)
    want = tc_round(x) @ w64.T
    bound = 4 * w.shape[1] * 2.0**-24 * (np.abs(x).astype(np.float64) @ np.abs(w64).T) + 1e-30
    return float(np.max(np.abs(got.astype(np.float64) - want) / bound))


def row_times(b, op: Callable[[int], object], ns: Sequence[int], reps: int) -> list[float]:
    """µs per call of ``op(n)`` for each row count, inside graphs of back-to-back calls."""
    return [graph_op_time(b, lambda n=n: op(n), reps) * 1e6 for n in ns]


def result_line(label: str, ns: Sequence[int], us: Sequence[float], mb: float, same_row: bool, err: float) -> str:
    return (
        f"{label} "
        + " ".join(f"n={n}:{u:6.1f}us" for n, u in zip(ns, us, strict=True))
        + f"  {mb / us[0]:5.2f} TB/s@1  row0==1row {same_row}  err/bound {err:.2e}"
    )


def release(b) -> None:
    """Drop the backend's uploads and the pool's free blocks before the next shape."""
    import cupy

    b._uploads.clear()
    cupy.get_default_memory_pool().free_all_blocks()


def log_loop_forwards(backend) -> list[tuple[int, int, float]]:
    """Time every decode round's forward as the generation loop does (run_rows, then the
    argmax that waits for it): patches ``generate.run_rows`` and ``backend.argmax`` and
    returns the list they append (rows, context, seconds) to. Prefill chunks are skipped."""
    import time

    from echoline.engine import generate

    log: list[tuple[int, int, float]] = []
    pending: list[tuple[int, int, float]] = []
    run_rows, argmax = generate.run_rows, backend.argmax

    def timed_rows(model, cache, rows, all_logits=True):
        pending[:] = [(len(rows), cache.length, time.perf_counter())] if all_logits else []
        return run_rows(model, cache, rows, all_logits=all_logits)

    def timed_argmax(logits):
        out = argmax(logits)
        if pending:
            rows, ctx, t0 = pending.pop()
            log.append((rows, ctx, time.perf_counter() - t0))
        return out

    generate.run_rows = timed_rows
    backend.argmax = timed_argmax
    return log
