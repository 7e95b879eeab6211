"""Shared pieces of the benchmarks: loading, timing forwards, printing tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from echoline.engine.api import Engine
from echoline.engine.calibration import row_times
from echoline.engine.generate import GRAPH_WIDTHS


def load(args) -> Engine:
    history = getattr(args, "reply_history", None)
    if history is None:
        return Engine.load(args.model, backend=args.backend)
    return Engine.load(args.model, backend=args.backend, reply_history=history)


def row_costs(engine: Engine, context: int, ks: Sequence[int], reps: int = 5) -> dict[int, float]:
    """Median whole-forward time per row count at a context length (see engine.calibration)."""
    return row_times(engine.model, context, ks, reps)


def verify_widths(engine: Engine) -> tuple[int, ...]:
    """The row counts the benchmarks time: the graph widths (powers of two, what a GPU's
    verify rounds use) up to the engine's widest verify (max_draft + the pending token):
    1-16 rows on the CPU, 1-64 where the backend verifies 64 (CUDA)."""
    return tuple(k for k in GRAPH_WIDTHS if k <= engine.max_draft + 1)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain text table on stderr, so stdout's last line stays the JSON."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    out = sys.stderr
    out.write(f"\n{title}\n")
    out.write("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)) + "\n")
    for row in rows:
        out.write("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)) + "\n")
    out.flush()
