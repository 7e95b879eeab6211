"""Attention op alone: the three-stage path, the row-tiled path over a row-major K, and
the row-tiled path over a key store (the CPU backend's K cache, read in place).

Run: ``flock /tmp/echoline-cpu.lock python -m tools.cpu.bench_attention``. Random
q/k/v, positions ctx0 … ctx0+n-1, the three interleaved, median of ``--reps``; prints
whether they gave identical bits (they must).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from echoline.kernels.cpu import attention

#: (query heads, kv heads, head dim, window, context before the rows, rows)
SHAPES = [
    (9, 3, 64, 0, 1000, 1),
    (4, 1, 256, 512, 1000, 1),
    (4, 1, 256, 0, 1000, 1),
    (9, 3, 64, 0, 1950, 300),
    (9, 3, 64, 0, 0, 300),
    (9, 3, 64, 0, 1024, 16),
    (9, 3, 64, 0, 1024, 8),
    (4, 1, 256, 512, 1950, 300),
    (4, 1, 256, 0, 1950, 300),
    (4, 1, 256, 512, 1024, 16),
]


def _key_store(k: np.ndarray, v: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """k and v copied into caches of ``capacity`` rows, K as the CPU backend stores it."""
    ks = attention.empty_keys(capacity, k.shape[1], k.shape[2])
    ks[: k.shape[0]] = k
    vs = np.zeros((capacity,) + v.shape[1:], dtype=np.float32)
    vs[: v.shape[0]] = v
    return ks, vs


def _run(q, k, v, pos, window, min_rows: int) -> tuple[float, np.ndarray]:
    saved = attention.TILED_MIN_ROWS
    attention.TILED_MIN_ROWS = min_rows
    try:
        t0 = time.perf_counter()
        out = attention.attention(q, k, v, pos, window, 0.125)
        return time.perf_counter() - t0, out
    finally:
        attention.TILED_MIN_ROWS = saved


def bench(nh: int, nkv: int, hd: int, window: int, ctx0: int, n: int, reps: int) -> str:
    rng = np.random.default_rng(0)
    ctx = ctx0 + n
    k = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = np.arange(ctx0, ctx)
    ks, vs = _key_store(k, v, ctx + 1024)  # a cache with room to spare, as in a session
    old_path, tiled = 1 << 60, 1
    _, a = _run(q, k, v, pos, window, old_path)
    _, b = _run(q, k, v, pos, window, tiled)
    _, c = _run(q, ks, vs, pos, window, tiled)
    old, new, store = [], [], []
    for _ in range(reps):
        old.append(_run(q, k, v, pos, window, old_path)[0])
        new.append(_run(q, k, v, pos, window, tiled)[0])
        store.append(_run(q, ks, vs, pos, window, tiled)[0])
    mo, mn, ms = float(np.median(old)), float(np.median(new)), float(np.median(store))
    keys = min(window, ctx) if window else ctx0 + n / 2
    gmacs = 2 * n * nh * hd * keys / ms / 1e9
    same = np.array_equal(a, b) and np.array_equal(a, c)
    return (
        f"H{nh}/KV{nkv} hd{hd} window {window} context {ctx0} rows {n}: three-stage {mo * 1e3:.3f} ms, "
        f"tiled {mn * 1e3:.3f} ms, tiled over the key store {ms * 1e3:.3f} ms ({mo / ms:.2f}x, "
        f"{gmacs:.0f} G MAC/s), same bits: {same}"
    )


def forward_bench(model: str, old_path: bool, reps: int = 3) -> None:
    """Whole forward of ``rows`` new tokens after ``context`` cached ones (the lead's
    prefill profile): best of ``reps``, the cache refilled in 512-row chunks each time."""
    from echoline.engine.api import Engine

    if old_path:
        attention.TILED_MIN_ROWS = 1 << 30
    m = Engine.load(model).model
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 2300)]
    for ctx, n in [(0, 300), (1950, 300), (1950, 16), (1950, 8)]:
        best = 1e9
        for _ in range(reps):
            c = m.new_cache(capacity=2600, max_rows=512)
            for s in range(0, ctx, 512):
                m.forward(ids[s : min(ctx, s + 512)], c, all_logits=False)
            t0 = time.perf_counter()
            m.backend.to_host(m.forward(ids[ctx : ctx + n], c, all_logits=False))
            best = min(best, time.perf_counter() - t0)
        path = "three-stage" if old_path else "default"
        print(f"{model} {path} attention: {n} rows at context {ctx}: {best:.4f} s", flush=True)


def key_store_ab(model: str, reps: int = 40) -> None:
    """Whole forwards of 1 and 16 rows over a row-major K cache (transposed per call, one
    row on the three-stage path) and over the key store, interleaved in one process
    (order alternating), medians; logits must be equal."""
    from echoline.engine.api import Engine
    from echoline.engine.kvcache import KVCache

    m = Engine.load(model).model
    b = m.backend
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 1000, 2100)]

    def cache(store: bool) -> KVCache:
        if not store:  # the row-major storage the backend used before the key store
            b.empty_key_cache = b.empty_cache
        try:
            return KVCache(b, m.config, capacity=2048, max_rows=80)
        finally:
            b.__dict__.pop("empty_key_cache", None)

    for ctx in (128, 1000, 2000):
        caches = {"row-major": cache(False), "key store": cache(True)}
        for c in caches.values():
            m.forward(ids[:ctx], c, all_logits=False)
        times: dict[tuple[str, int], list[float]] = {(k, r): [] for k in caches for r in (1, 16)}
        logits: dict[tuple[str, int], np.ndarray] = {}
        for rep in range(reps):
            for r in (1, 16):
                for name in list(caches)[:: 1 if rep % 2 else -1]:
                    c = caches[name]
                    c.truncate(ctx)
                    t0 = time.perf_counter()
                    logits[(name, r)] = b.to_host(m.forward(ids[ctx : ctx + r], c, all_logits=True))
                    times[(name, r)].append(time.perf_counter() - t0)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        same = all(np.array_equal(logits[("row-major", r)], logits[("key store", r)]) for r in (1, 16))
        print(
            f"{model} context {ctx}: 1 row {med[('row-major', 1)]:.2f} -> {med[('key store', 1)]:.2f} ms "
            f"(x{med[('key store', 1)] / med[('row-major', 1)]:.3f}), 16 rows {med[('row-major', 16)]:.2f} -> "
            f"{med[('key store', 16)]:.2f} ms (x{med[('key store', 16)] / med[('row-major', 16)]:.3f}), "
            f"same logits: {same}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--forward", metavar="MODEL", help="time whole forwards of MODEL instead")
    ap.add_argument("--key-store", metavar="MODEL", help="A/B whole forwards of MODEL: row-major K vs key store")
    ap.add_argument("--old-path", action="store_true", help="with --forward: force the three-stage path (only for row-major K: "
                    "since the backend's K cache became a key store, model forwards always tile)")
    args = ap.parse_args()
    if args.forward:
        forward_bench(args.forward, args.old_path)
        return
    if args.key_store:
        key_store_ab(args.key_store)
        return
    for shape in SHAPES:
        print(bench(*shape, reps=args.reps), flush=True)


if __name__ == "__main__":
    main()
