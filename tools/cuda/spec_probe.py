"""Where a speculative round's time goes on the GPU: the forward vs everything around it.

Run on the device: ``python3 -m tools.cuda.spec_probe --model PATH [--backend cuda]``.
Copy traffic (the `bench spec` requests), one warm-up pass, then plain and speculative
passes. Prints, per mode, the decode time split into forward passes (run_rows + argmax,
as the generation loop times them) and the rest of the loop, and the forward time per row
count relative to a one-row step *inside the loop* next to the calibrated curve. Why:
on the H200 the controller reaches 90 % of the oracle in an offline replay but 67 % live;
this says whether the missing time is in the forwards or around them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict

from echoline.engine.api import Engine
from echoline.engine.bench import traffic
from echoline.engine.bench.spec import _prompts

from tools.cuda.probe_common import log_loop_forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile the second speculative pass; print this many functions by own time")
    args = ap.parse_args()
    eng = Engine.load(args.model, backend=args.backend)
    prompts = _prompts(eng, "copy", traffic.source_paths([]))
    log = log_loop_forwards(eng.model.backend)
    for p in prompts:  # warm-up: graphs for every row count, calibration cells
        eng.generate(p, max_tokens=args.max_tokens, spec=True)
        eng.generate(p, max_tokens=args.max_tokens, spec=False)
    t1_loop = None
    for pass_no, mode in enumerate(("plain", "spec", "plain", "spec")):
        log.clear()
        decode = tokens = rounds = 0
        prof = cProfile.Profile() if args.profile and pass_no == 3 else None
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        for p in prompts:
            r = eng.generate(p, max_tokens=args.max_tokens, spec=mode == "spec")
            decode += r.stats.decode_s
            tokens += r.stats.generated_tokens - 1
            rounds += r.stats.rounds
        if prof is not None:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
        wall = time.perf_counter() - t0
        fwd = sum(s for _, _, s in log)
        by = defaultdict(list)
        for rows, _, s in log:
            by[rows].append(s)
        if mode == "plain" and by[1]:
            t1_loop = statistics.median(by[1])
        print(
            f"{mode}: {tokens} tokens in {rounds} rounds, decode {decode * 1e3:.1f} ms "
            f"({tokens / decode:.1f} tok/s), forwards {fwd * 1e3:.1f} ms, outside the forwards "
            f"{(decode - fwd) * 1e3:.1f} ms = {(decode - fwd) / max(rounds, 1) * 1e6:.1f} us/round; "
            f"wall incl. prefill {wall:.2f} s",
            flush=True,
        )
        if mode == "spec" and t1_loop:
            ctx = int(statistics.median(c for _, c, _ in log)) if log else 1024
            cal = eng.controller.cost.ratios(17, ctx)
            rel = {r: (len(v), round(statistics.median(v) / t1_loop, 3), round(cal[r], 3)) for r, v in sorted(by.items())}
            print(f"  rows: (rounds, in-loop T(rows)/T(1), curve at ctx {ctx}) {rel}", flush=True)
    print(f"controller overhead estimate: {eng.controller.overhead_s * 1e6:.1f} us/round", flush=True)


if __name__ == "__main__":
    main()
