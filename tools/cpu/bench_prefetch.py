"""A/B of the q8 kernels' software prefetch distance, interleaved in one process.

Run: ``python -m tools.cpu.bench_prefetch --model qwen2.5-coder-1.5b --rows 1 --prefetch 0,1024``.
Times every layer's products (q|k|v, o, gate|up, down) of a real model at a row count, one
pass per distance in rotating order, and prints the medians. Why one process: weight
streaming speed in a VM drifts by ±20 % between processes, far more than the effect.
Each distance compiles its own kernels (``echoline_q8_…_pf<N>`` modules) on first use.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from echoline.engine.api import Engine
from echoline.kernels.cpu import q8act

NAMES = ("wqkv", "wo", "w_gate_up", "w_down")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prefetch", default="0,1024", help="distances in bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    model = Engine.load(args.model).model
    if not isinstance(model.layers[0].wqkv, q8act.Q8Matrix):
        raise SystemExit("the model's products are not in the q8 form (needs --cpu-activations q8 / VNNI)")
    dists = [int(v) for v in args.prefetch.split(",")]
    rng = np.random.default_rng(0)
    xs = {n: rng.standard_normal((args.rows, getattr(model.layers[0], n).in_features)).astype(np.float32)
          for n in NAMES}

    def one_pass() -> float:
        t0 = time.perf_counter()
        for layer in model.layers:
            for n in NAMES:
                q8act.matmul_q8(xs[n], getattr(layer, n))
        return time.perf_counter() - t0

    def use(dist: int) -> None:
        q8act.PREFETCH = dist
        q8act.KERNELS.clear()  # kernel_for then loads this distance's modules

    times: dict[int, list[float]] = {d: [] for d in dists}
    for d in dists:  # compile and warm each variant
        use(d)
        one_pass()
    for rep in range(args.reps):
        for d in dists if rep % 2 == 0 else dists[::-1]:
            use(d)
            times[d].append(one_pass())
    base = statistics.median(times[dists[0]])
    print(f"{args.model}, {args.rows} row(s), all layers' products, median of {args.reps}")
    for d in dists:
        med = statistics.median(times[d])
        print(f"prefetch {d:5d} B: {med * 1e3:7.2f} ms  (min {min(times[d]) * 1e3:7.2f})  {med / base:.3f}x")


if __name__ == "__main__":
    main()
