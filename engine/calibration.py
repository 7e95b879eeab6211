"""Measure the whole-forward cost curve T(rows, context) on this machine.

The controller divides expected tokens by these times, so they must be
whole-graph wall times of real forwards (never sums of per-op timings: the
field report's ruler mistake). Results are cached per model file, backend and
host, and refined online by every real step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from echoline.engine.drafting.controller import VerifyCost
from echoline.engine.kvcache import KVCache
from echoline.engine.models.base import Transformer

from echoline import paths

CAL_ROWS = (1, 2, 3, 4, 6, 8, 12, 17)
#: Wider verifies measured where the backend offers them (``Backend.verify_max_rows``): the
#: graph widths past 17 that a GPU's verify rounds use.
WIDE_ROWS = (32, 64)
CAL_CONTEXTS = (64, 512)
GRID_CONTEXTS = (0, 512, 2048, 8192)


def cal_rows(model: Transformer) -> tuple[int, ...]:
    """The row counts measured for ``model``'s backend: CAL_ROWS, and each WIDE_ROWS entry
    up to the backend's widest verify, so the longest draft it may get is a measured point
    (never an extrapolation from 17 rows)."""
    top = int(getattr(model.backend, "verify_max_rows", max(CAL_ROWS)))
    return CAL_ROWS + tuple(r for r in WIDE_ROWS if r <= top)


def time_forward(model: Transformer, cache: KVCache, rows: Sequence[int]) -> float:
    """Wall time of one forward of ``rows`` new rows (argmax included), then undone."""
    base = cache.length
    backend = model.backend
    backend.synchronize()
    t0 = time.perf_counter()
    backend.argmax(model.forward(list(rows), cache, all_logits=True))
    backend.synchronize()
    dt = time.perf_counter() - t0
    cache.truncate(base)
    return dt


def row_times(
    model: Transformer,
    context: int,
    ks: Sequence[int],
    reps: int = 3,
    stat: Callable[[list[float]], float] = statistics.median,
) -> dict[int, float]:
    """Forward time per row count at a context length (``stat`` of the reps, interleaved)."""
    vocab = model.config.vocab_size
    ids = [(i * 7919) % (vocab - 10) + 5 for i in range(context + max(ks) + 1)]
    cache = model.new_cache(context + max(ks) + 8)
    for start in range(0, context, 256):
        model.forward(ids[start : min(context, start + 256)], cache, all_logits=False)
    samples: dict[int, list[float]] = {k: [] for k in ks}
    for k in ks:  # warm-up: first use of a row count may compile or capture a graph
        time_forward(model, cache, ids[context : context + k])
    for rep in range(reps):
        for k in ks if rep % 2 == 0 else list(reversed(ks)):
            samples[k].append(time_forward(model, cache, ids[context : context + k]))
    return {k: stat(v) for k, v in samples.items()}


def _sane(times: dict[int, float]) -> dict[int, float]:
    """Clamp a measured curve to what physics allows.

    A forward of k rows never costs more than k one-row forwards (plain decoding
    of k tokens does exactly that) and never less than a forward of fewer rows.
    A stray slow sample (another process on the core, a page fault) otherwise
    sticks in the cached curve and talks the controller out of drafting for good.
    """
    out: dict[int, float] = {}
    t1 = times[min(times)]
    prev = 0.0
    for k in sorted(times):
        t = min(times[k], k * t1)
        out[k] = max(t, prev)
        prev = out[k]
    return out


def _code_stamp() -> str:
    """Size and mtime of the engine's and kernels' source files: new kernels, new curve.

    Why: a cached curve measured before a kernel change would keep steering the
    controller with costs that no longer hold (seen: a faster multi-row attention made
    16 rows 3.0× instead of 3.4×, and the stale curve kept drafts short).
    """
    root = Path(__file__).resolve().parents[1]
    parts = []
    for folder in (root / "engine" / "backends", root / "engine" / "models", root / "kernels"):
        if folder.is_dir():
            for f in sorted(folder.rglob("*")):
                if f.suffix in (".py", ".cu", ".cuh", ".metal") and f.is_file():
                    st = f.stat()
                    parts.append(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _cache_file(model_path: Path, backend: str) -> Path:
    st = model_path.stat()
    key = (
        f"{model_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{backend}|{platform.node()}|{os.cpu_count()}"
        f"|{_code_stamp()}"
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return paths.cache_dir("calibration") / f"{digest}.json"


#: A cached curve is re-measured when a quick check at load finds the widest verify this
#: much cheaper, relative to one row, than the cache says.
RECHECK_SLACK = 0.15


def cached_curve_is_pessimistic(model: Transformer, table: dict[int, dict[int, float]], context: int) -> bool:
    """Whether T(17)/T(1) measured now (3 reps, ~0.1 s) is clearly below the cached ratio.

    Why: the first calibration may run while the editor indexes or a build holds a core;
    contention slows parallel multi-row forwards most, so the cached curve overprices
    drafts and the controller drafts too little — for good, since the cache outlives the
    process and the online cells fall back to it (``VerifyCost.STALE_AFTER``). Contention
    only ever adds time, so a *cheaper* verify now is evidence against the cache, while a
    dearer one (contention now) changes nothing. The same holds for the one-row forward
    itself: a curve measured under load has every time inflated, and its ratios are then
    noise (seen: 2 rows at 1.83x one row on the Qwen 0.5B, 1.16x measured quietly), so a
    one-row forward now clearly faster than the cached one condemns the whole curve.
    """
    wide = max(cal_rows(model))
    fresh = row_times(model, context, (1, wide), reps=3, stat=min)
    cached = table[context][wide] / table[context][1]
    slower_then = fresh[1] < table[context][1] * (1.0 - 2 * RECHECK_SLACK)
    return slower_then or fresh[wide] / fresh[1] < cached * (1.0 - RECHECK_SLACK)


@contextlib.contextmanager
def _exclusive(path: Path | None) -> Iterator[None]:
    """Hold a machine-wide lock on ``path``'s calibration while it is read, checked or measured.

    Why: two sidecars starting together (two editor windows, or a test's pair of servers)
    would otherwise time their forwards against each other. Each then reads the other's
    load as its own cost, and on a 2-core machine with OpenMP threads spinning in both,
    the pair took over two minutes to calibrate instead of two seconds. With the lock the
    second process waits, then finds the first one's fresh curve on disk.
    """
    if path is None:
        yield
        return
    from filelock import FileLock

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path.with_suffix(".lock")))
        lock.acquire()
    except OSError:  # a read-only or full cache: measure without the lock
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _read_table(path: Path | None) -> dict[int, dict[int, float]] | None:
    if path is None or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return {int(c): _sane({int(r): t for r, t in v.items()}) for c, v in raw.items()}
    except (ValueError, OSError, AttributeError):
        return None


def _write_table(path: Path, table: dict[int, dict[int, float]]) -> None:
    """Cache the curve, written whole then renamed (a reader never sees half a file).

    A cache that cannot be written (disk full, read-only home) costs the next process a
    new measurement, never this request: the curve in hand is used either way.
    """
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(table))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


def measure_verify_cost(model: Transformer, model_path: Path | None = None, recheck: bool = True,
                        on_measure: Callable[[], None] | None = None) -> VerifyCost:
    """Measure (or load from cache) T(rows) at two contexts; extrapolate the larger grid points.

    ``recheck``: verify a cached curve with a quick measurement (see
    ``cached_curve_is_pessimistic``) and measure afresh when it looks contended.
    ``on_measure``: called when the curve is measured afresh (seconds), not when it is read.
    """
    path = _cache_file(model_path, model.backend.variant) if model_path is not None else None
    rows = cal_rows(model)
    limit = model.config.context_length - max(rows) - 16
    contexts = tuple(min(c, max(0, limit)) for c in CAL_CONTEXTS)
    with _exclusive(path):
        table = _read_table(path)
        if table is not None and any(sorted(col) != list(rows) for col in table.values()):
            table = None  # measured for other row counts (another widest verify)
        if table is not None and sorted(table) == sorted(set(contexts)) and recheck:
            if cached_curve_is_pessimistic(model, table, min(contexts)):
                table = None
        if table is None or sorted(table) != sorted(set(contexts)):
            if on_measure is not None:
                on_measure()
            # The fastest of the reps: noise only ever adds time.
            table = {c: _sane(row_times(model, c, rows, reps=5, stat=min)) for c in sorted(set(contexts))}
            if path is not None:
                _write_table(path, table)
    c0, c1 = contexts
    columns = []
    for c in GRID_CONTEXTS:
        col = {}
        for r in rows:
            t0, t1 = table[c0][r], table[c1][r]
            slope = max(0.0, (t1 - t0) / (c1 - c0)) if c1 > c0 else 0.0
            col[r] = max(1e-6, t0 + slope * (c - c0))
        # Each row count is extrapolated on its own slope, and a noisy one-row slope can make
        # T(2) < T(1) far out (seen: 0.96 at 1k), which makes a 1-token draft look free.
        columns.append(_sane(col))
    times = [[col[r] for col in columns] for r in rows]
    return VerifyCost(rows, GRID_CONTEXTS, times)
