"""The two ways of storing 5/6-bit weights' high bits, interleaved in one process.

Run: ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= python -m tools.cpu.bench_high_bits --model
qwen2.5-coder-0.5b --rows 1,16 --reps 11``. Every matrix of one decode step (layer shapes as
the backend fuses them, and the head) is prepared twice, with ``high="planes"`` and
``high="sliced"`` (``kernels.cpu.q8act.pack_layout``); whole passes over all of them
alternate between the two, medians. Both give the same bits (checked here on every pass's
first run); only the time differs. Not a test: a developer A/B behind docs/kernels-cpu.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from echoline.engine.gguf_file import GGUFFile
from echoline.engine.model_catalog import resolve_model
from echoline.kernels.cpu import q8act
from echoline.kernels.cpu.matmul import prepare

from tools.cpu.bench_matmul import model_matrices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    f = GGUFFile(resolve_model(args.model))
    pms = [prepare(ts) for _, ts in model_matrices(f)]
    arms = {h: [q8act.prepare_q8(pm, high=h) for pm in pms] for h in q8act.HIGH_LAYOUTS}
    sliced = sum(p.high == "sliced" for m in arms["sliced"] for p in m.parts)
    print(f"{args.model}: {sliced} of {sum(len(m.parts) for m in arms['sliced'])} parts sliced")
    rng = np.random.default_rng(0)
    for n in (int(r) for r in args.rows.split(",")):
        xs = {m.in_features: rng.standard_normal((n, m.in_features)).astype(np.float32) for m in pms}
        first = {h: [q8act.matmul_q8(xs[m.in_features], m) for m in ms] for h, ms in arms.items()}
        assert all(np.array_equal(a, b) for a, b in zip(*first.values(), strict=True)), "layouts differ"
        outs = [np.empty((n, m.padded_out), np.float32) for m in pms]
        times: dict[str, list[float]] = {h: [] for h in arms}
        for k in range(args.reps):
            for h in arms if k % 2 == 0 else reversed(list(arms)):
                t0 = time.perf_counter()
                for m, o in zip(arms[h], outs, strict=True):
                    q8act.matmul_q8(xs[m.in_features], m, out=o)
                times[h].append(time.perf_counter() - t0)
        a, b = (float(np.median(times[h])) * 1e3 for h in ("planes", "sliced"))
        print(f"rows {n:2d}: planes {a:.2f} ms  sliced {b:.2f} ms  sliced/planes {b / a:.3f}", flush=True)


if __name__ == "__main__":
    main()
