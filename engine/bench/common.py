"""Shared pieces of the benchmarks: loading, timing forwards, printing tables."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

from engine.api import Engine
from engine.kvcache import KVCache


def load(args) -> Engine:
    return Engine.load(args.model, backend=args.backend)


def time_forward(engine: Engine, cache: KVCache, rows: Sequence[int]) -> float:
    """Whole-forward wall time of ``rows`` new rows on top of the cache, then undone."""
    base = cache.length
    engine.backend.synchronize()
    t0 = time.perf_counter()
    logits = engine.model.forward(list(rows), cache, all_logits=True)
    engine.backend.argmax(logits)
    engine.backend.synchronize()
    dt = time.perf_counter() - t0
    cache.truncate(base)
    return dt


def row_costs(engine: Engine, context: int, ks: Sequence[int], reps: int = 5) -> dict[int, float]:
    """Median whole-forward time per row count at a context length, interleaved by rep."""
    ids = [(i * 7919) % (engine.config.vocab_size - 10) + 5 for i in range(context + max(ks) + 1)]
    cache = engine.model.new_cache(context + max(ks) + 8)
    for start in range(0, context, 256):
        engine.model.forward(ids[start : min(context, start + 256)], cache, all_logits=False)
    samples: dict[int, list[float]] = {k: [] for k in ks}
    time_forward(engine, cache, ids[context : context + 1])  # warm-up
    for rep in range(reps):
        order = list(ks) if rep % 2 == 0 else list(reversed(ks))
        for k in order:
            samples[k].append(time_forward(engine, cache, ids[context : context + k]))
    return {k: statistics.median(v) for k, v in samples.items()}


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain text table on stderr, so stdout's last line stays the JSON."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    out = sys.stderr
    out.write(f"\n{title}\n")
    out.write("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)) + "\n")
    for row in rows:
        out.write("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)) + "\n")
    out.flush()
