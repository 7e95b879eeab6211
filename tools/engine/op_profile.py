"""Where a forward's time goes, per row count, at a chosen context.

Run: ``python -m tools.engine.op_profile --model smollm2 --context 1300``. It times each
backend op around its call inside real whole forwards (the row counts interleaved, the
order reversed every other rep, medians) and prints the whole-forward time beside the
parts. Why both: the parts attribute, the whole decides (field report: never sum parts to
judge a change; compare whole forwards). A developer tool behind ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from echoline.engine.api import Engine

#: Backend methods timed (those a backend lacks are skipped).
OPS = ("matmul", "attention", "rms_norm", "rope", "silu_mul", "gelu_tanh_mul", "add", "embed")


def _timed(method: Callable[..., Any], name: str, acc: dict[str, float]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = method(*args, **kwargs)
        acc[name] += time.perf_counter() - t0
        return out

    return call


def profile(engine: Engine, context: int, rows: Sequence[int], reps: int) -> dict[int, dict[str, float]]:
    """Median seconds per op and ``"total"`` for one forward of each row count after ``context``."""
    model = engine.model
    backend = model.backend
    acc: dict[str, float] = defaultdict(float)
    saved = {}
    own = set(vars(backend))  # attributes the instance itself held before the wrappers
    for name in OPS:
        if hasattr(backend, name):
            saved[name] = getattr(backend, name)
            setattr(backend, name, _timed(saved[name], name, acc))
    try:
        vocab = model.config.vocab_size
        ids = [(i * 7919) % (vocab - 10) + 5 for i in range(context + max(rows))]
        cache = model.new_cache(context + max(rows) + 8)
        for start in range(0, context, 256):
            model.forward(ids[start : min(context, start + 256)], cache, all_logits=False)
        samples: dict[int, dict[str, list[float]]] = {r: defaultdict(list) for r in rows}
        for rep in range(reps + 1):  # the first pass warms up each row count
            for r in rows if rep % 2 == 0 else list(reversed(rows)):
                acc.clear()
                backend.synchronize()
                t0 = time.perf_counter()
                backend.argmax(model.forward(ids[context : context + r], cache, all_logits=True))
                backend.synchronize()
                total = time.perf_counter() - t0
                cache.truncate(context)
                if rep:
                    samples[r]["total"].append(total)
                    for name in saved:
                        samples[r][name].append(acc.get(name, 0.0))
    finally:
        for name, method in saved.items():
            if name in own:
                setattr(backend, name, method)
            else:
                delattr(backend, name)  # back to the class's method
    return {r: {k: statistics.median(v) for k, v in samples[r].items()} for r in rows}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--context", type=int, default=1300)
    ap.add_argument("--rows", default="1,4,8,12,17")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    engine = Engine.load(args.model, backend=args.backend)
    rows = [int(r) for r in args.rows.split(",")]
    got = profile(engine, args.context, rows, args.reps)
    names = ["total"] + [n for n in OPS if n in got[rows[0]]]
    print(f"{engine.model_name} on {engine.backend_variant}, context {args.context}: ms per forward (median)")
    print("rows " + " ".join(f"{n:>13}" for n in names) + "  vs 1 row")
    base = got[rows[0]]["total"]
    for r in rows:
        cells = " ".join(f"{got[r][n] * 1e3:13.2f}" for n in names)
        print(f"{r:4d} {cells}  {got[r]['total'] / base:7.2f}")


if __name__ == "__main__":
    main()
