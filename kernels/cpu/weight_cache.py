"""On-disk cache of re-laid-out weights, read back at the next start.

Why: re-laying out Gemma 3's matrices (mostly its 262144 x 640 tied head) took
0.4-1 s of every start. The result depends only on the GGUF bytes and on this
module's layout, so it is written once next to the numba cache and read back
afterwards with one ``readinto`` per matrix into ordinary writable arrays (numba
sees the same array type, so no new kernel signature).

Why read rather than memory-map: a file mapping is backed by 4 KiB page-cache pages,
while the anonymous buffer gets transparent huge pages; the products stream the whole
weight set every token, and with the mapping Gemma 3's head took 7-8 % longer
(4.02 vs 3.74 ms at 1 row, measured in one process, interleaved). Reading 292 MiB from
the page cache costs tens of milliseconds once.

Key: every tensor's ``origin`` (file size, mtime, header hash, byte offset),
name, type and shape, plus ``LAYOUT_VERSION`` and the group width. Files are
written to a temporary name and renamed, so a concurrent reader never sees a
partial entry; a damaged entry is ignored and rewritten.

Size: entries of layouts no longer used (an older version of echoline, a different
activation mode, a model deleted) would pile up: each model costs its weights' size again.
So every load marks its entry as used (mtime), and every store prunes the least recently
used entries until the folder is under ``ECHOLINE_WEIGHT_CACHE_MB`` (default 4096 MiB,
about three times the 1.5B model's entries); the entry just written is never removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from echoline.kernels.cpu.relayout import Kind

from echoline import paths

#: Bump when ``prepare``'s arrays change meaning (layout, padding, scale formulas).
LAYOUT_VERSION = 1
_ALIGN = 64
DEFAULT_LIMIT_MB = 4096


def cache_dir() -> Path:
    """The relaid-out weights folder of the echoline cache (``echoline.paths``)."""
    return paths.cache_dir("weights")


def enabled() -> bool:
    """``ECHOLINE_WEIGHT_CACHE=0`` turns the cache off (first-run measurements, tests)."""
    return os.environ.get("ECHOLINE_WEIGHT_CACHE", "1") != "0"


def matrix_key(tensors: Sequence, group: int, tiles: tuple) -> str | None:
    """Cache key of a fused matrix, or None when a tensor has no file origin."""
    parts = [f"v{LAYOUT_VERSION}", f"g{group}", repr(tuple(tiles))]
    for t in tensors:
        origin = getattr(t, "origin", None)
        if origin is None:
            return None
        parts.append(f"{origin}|{t.name}|{int(t.qtype)}|{tuple(t.shape)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _paths(key: str) -> tuple[Path, Path]:
    d = cache_dir()
    return d / f"{key}.json", d / f"{key}.bin"


def load(key: str) -> dict | None:
    """The stored description with its arrays mapped in, or None (missing or damaged)."""
    meta_path, bin_path = _paths(key)
    try:
        meta = json.loads(meta_path.read_text())
        size = bin_path.stat().st_size
        if size != meta["nbytes"]:
            return None
        buf = np.empty(size, dtype=np.uint8)
        with open(bin_path, "rb") as fh:
            if fh.readinto(memoryview(buf)) != size:
                return None
    except (OSError, ValueError, KeyError):
        return None
    try:
        os.utime(bin_path)  # used now: pruning removes the least recently used entries first
    except OSError:
        pass
    arrays = []
    for dtype, count, offset in meta["arrays"]:
        dt = np.dtype(dtype)
        arrays.append(np.ndarray((count,), dtype=dt, buffer=buf, offset=offset))
    meta["arrays"] = arrays
    return meta


def store(key: str, meta: dict, arrays: list[np.ndarray]) -> None:
    """Write ``arrays`` (flat) and ``meta`` (JSON-able) atomically; failures are ignored."""
    meta_path, bin_path = _paths(key)
    layout = []
    offset = 0
    for a in arrays:
        offset = -(-offset // _ALIGN) * _ALIGN
        layout.append([a.dtype.str, int(a.size), offset])
        offset += a.nbytes
    meta = dict(meta, arrays=layout, nbytes=offset)
    try:
        bin_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = bin_path.with_name(f"{bin_path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            for a, (_dt, _n, off) in zip(arrays, layout, strict=True):
                fh.seek(off)
                fh.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
            fh.truncate(offset)
        os.replace(tmp, bin_path)
        tmp_meta = meta_path.with_name(f"{meta_path.name}.tmp{os.getpid()}")
        tmp_meta.write_text(json.dumps(meta))
        os.replace(tmp_meta, meta_path)  # written last: its presence marks a complete entry
    except OSError:
        return
    prune(keep=key)


def limit_bytes() -> int:
    try:
        return int(float(os.environ.get("ECHOLINE_WEIGHT_CACHE_MB", DEFAULT_LIMIT_MB)) * 2**20)
    except ValueError:
        return DEFAULT_LIMIT_MB * 2**20


def prune(keep: str | None = None, limit: int | None = None) -> int:
    """Delete least recently used entries (by their .bin's mtime) until the folder holds at
    most ``limit`` bytes; ``keep`` is never deleted. Returns the bytes freed. Failures
    (a file another process removed first, a read-only folder) are ignored."""
    limit = limit_bytes() if limit is None else limit
    entries = []
    try:
        for b in cache_dir().glob("*.bin"):
            st = b.stat()
            entries.append((st.st_mtime, st.st_size, b))
    except OSError:
        return 0
    total = sum(size for _, size, _ in entries)
    freed = 0
    for _, size, b in sorted(entries):
        if total <= limit:
            break
        if b.stem == keep:
            continue
        try:
            b.with_suffix(".json").unlink(missing_ok=True)  # the marker first: never a half entry
            b.unlink(missing_ok=True)
        except OSError:
            continue
        total -= size
        freed += size
    return freed


def kind_to_json(kind: Kind) -> dict:
    return {"block": kind.block, "scaled": kind.scaled, "offset": kind.offset, "wdtype": kind.wdtype}


def kind_from_json(d: dict) -> Kind:
    return Kind(int(d["block"]), bool(d["scaled"]), bool(d["offset"]), str(d["wdtype"]))
