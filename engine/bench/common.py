"""Shared pieces of the benchmarks: loading, timing forwards, printing tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from echoline.engine.api import Engine
from echoline.engine.calibration import row_times


def load(args) -> Engine:
    history = getattr(args, "reply_history", None)
    if history is None:
        return Engine.load(args.model, backend=args.backend)
    return Engine.load(args.model, backend=args.backend, reply_history=history)


def row_costs(engine: Engine, context: int, ks: Sequence[int], reps: int = 5) -> dict[int, float]:
    """Median whole-forward time per row count at a context length (see engine.calibration)."""
    return row_times(engine.model, context, ks, reps)


#: Row counts the benchmarks time (powers of two: the widths a GPU's verify rounds use).
ROW_WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def verify_widths(engine: Engine) -> tuple[int, ...]:
    """ROW_WIDTHS up to the engine's widest verify (max_draft + the pending token): 1-16 rows
    on the CPU, 1-64 where the backend verifies 64 (CUDA)."""
    return tuple(k for k in ROW_WIDTHS if k <= engine.max_draft + 1)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain text table on stderr, so stdout's last line stays the JSON."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    out = sys.stderr
    out.write(f"\n{title}\n")
    out.write("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)) + "\n")
    for row in rows:
        out.write("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)) + "\n")
    out.flush()
