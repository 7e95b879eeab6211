"""Numba settings the kernels depend on, applied before numba is imported.

Why: numba ships with SLP vectorization off, and the matmul kernels are written
as many independent scalar accumulators that only SLP turns into SIMD code.
The flag is not part of numba's cache key, so generated kernels live in a cache
directory whose name hashes every setting that changes the machine code.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from echoline import paths

os.environ.setdefault("NUMBA_SLP_VECTORIZE", "1")
if "numba" in sys.modules:  # imported earlier by someone else: set the live config too
    import numba.core.config as _cfg

    _cfg.SLP_VECTORIZE = 1

import numba  # noqa: E402
import numba.core.config as _config  # noqa: E402
from numba import njit, prange  # noqa: E402,F401  (re-exported: import numba through here)

_config.SLP_VECTORIZE = 1

#: Bump when the generated source changes meaning, so stale caches are never reused.
CODEGEN_VERSION = 6


def target_cpu() -> tuple[str, str]:
    """(CPU name, feature string) numba generates code for, as numba itself decides: the
    host's name unless ``NUMBA_CPU_NAME`` names another, and the host's features unless
    ``NUMBA_CPU_FEATURES`` is set. A stand-in for a smaller machine needs both:
    ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` (empty: that CPU's own features) builds
    AVX2 code; the name alone keeps the host's feature flags, AVX-512 included."""
    import llvmlite.binding as llvm

    name = _config.CPU_NAME or llvm.get_host_cpu_name()
    if _config.CPU_FEATURES is not None:
        return name, _config.CPU_FEATURES
    return name, llvm.get_host_cpu_features().flatten()


#: Features of x86 CPUs with AVX2 and without AVX-512, for a ``NUMBA_CPU_NAME`` given with an
#: empty ``NUMBA_CPU_FEATURES`` (LLVM knows a named CPU's features; llvmlite does not expose them)
_AVX2_ONLY = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2"})
_NAMED_FEATURES = {
    **{name: _AVX2_ONLY for name in ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3")},
    # Intel client cores from 2021 on: AVX-VNNI (256-bit vpdpbusd) without AVX-512
    **{name: _AVX2_ONLY | {"avxvnni"} for name in ("alderlake", "raptorlake", "meteorlake")},
}


def target_has(feature: str) -> bool:
    """Whether the code numba generates may use ``feature`` (e.g. "avx512vnni")."""
    try:
        import llvmlite.binding as llvm

        name, feats = target_cpu()
        if feats:
            return f"+{feature}" in feats.split(",")
        if name == llvm.get_host_cpu_name():  # an empty list on the host's own name
            return bool(llvm.get_host_cpu_features().get(feature))
        return feature in _NAMED_FEATURES.get(name, ())  # the name's own features; unknown: absent
    except Exception:  # noqa: BLE001 - unknown target: treat as unavailable
        return False


def _cpu_name() -> str:
    try:
        name, feats = target_cpu()
        return f"{name}-{feats}"
    except Exception:  # noqa: BLE001 - any failure just means a less specific key
        return "unknown-cpu"


def cache_root() -> Path:
    """<echoline cache>/numba/<hash of numba, python, cpu, flags>/ (created on demand)."""
    key = "|".join(
        [
            numba.__version__,
            sys.version,
            _cpu_name(),
            f"slp={_config.SLP_VECTORIZE}",
            f"opt={_config.OPT}",
            f"v={CODEGEN_VERSION}",
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = paths.cache_dir("numba") / digest
    path.mkdir(parents=True, exist_ok=True)
    return path


def has_compiled_kernels() -> bool:
    """Whether numba has written compiled kernels (index files) into ``cache_root``: false
    on a machine's first run, when the first forward compiles them (a minute or two)."""
    return any((cache_root() / "__pycache__").glob("*.nbi"))
