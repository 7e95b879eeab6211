"""Numba settings the kernels depend on, applied before numba is imported.

Why: numba ships with SLP vectorization off, and the matmul kernels are written
as many independent scalar accumulators that only SLP turns into SIMD code.
The flag is not part of numba's cache key, so generated kernels live in a cache
directory whose name hashes every setting that changes the machine code. The kernels
written in this package's own files are cached there too, by content rather than by path
(``install_source_locator``).
"""

from __future__ import annotations

import functools
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
_AVX2_ONLY = frozenset({"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "movbe"})
_NAMED_FEATURES = {
    **{name: _AVX2_ONLY for name in ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3")},
    # Intel client cores from 2021 on: AVX-VNNI (256-bit vpdpbusd) without AVX-512
    **{name: _AVX2_ONLY | {"avxvnni"} for name in ("alderlake", "raptorlake", "meteorlake")},
}

#: The x86 features whose instructions generated kernels may contain: the vector widths, the
#: integer dot products and the scalar extensions LLVM picks on its own. Code built for a
#: target with one of these runs on a host only if the host has it too (else SIGILL).
CODE_FEATURES = frozenset(
    {"avx", "avx2", "fma", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "movbe", "avxvnni", "avx512f", "avx512bw",
     "avx512dq", "avx512vl", "avx512cd", "avx512vnni", "avx512vbmi", "avx512vbmi2", "avx512bf16", "avx512fp16",
     "amx-tile", "amx-int8", "amx-bf16"}
)  # fmt: skip


def host_features() -> frozenset[str]:
    """The features this CPU has, as LLVM names them (``avxvnni``, ``avx512vnni``, ...),
    whatever ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` say."""
    import llvmlite.binding as llvm

    return frozenset(name for name, on in llvm.get_host_cpu_features().items() if on)


def target_features() -> frozenset[str] | None:
    """The features numba's generated code may use: the host's, or those of the CPU that
    ``NUMBA_CPU_NAME`` names (our table of them, since llvmlite does not expose LLVM's),
    changed by ``NUMBA_CPU_FEATURES``' ``+f`` / ``-f`` entries. None: a named CPU this table
    does not know, given without features (what its code uses cannot be told here)."""
    import llvmlite.binding as llvm

    name, feats = target_cpu()
    entries = [f for f in feats.split(",") if f[:1] in "+-" and len(f) > 1] if feats else []
    if name == llvm.get_host_cpu_name() and not feats:
        return host_features()
    base = _NAMED_FEATURES.get(name)
    if base is None and not entries:
        return None
    have = set(base or ())
    for entry in entries:
        (have.add if entry[0] == "+" else have.discard)(entry[1:])
    return frozenset(have)


def target_has(feature: str) -> bool:
    """Whether the code numba generates may use ``feature`` (e.g. "avx512vnni")."""
    try:
        return feature in (target_features() or ())  # an unknown named CPU: every feature absent
    except Exception:  # noqa: BLE001 - unknown target: treat as unavailable
        return False


def missing_on_host(host: frozenset[str] | None = None) -> list[str]:
    """The features the generated code may use that the host (or the feature set ``host``)
    lacks: non-empty only when ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` name a bigger CPU
    than this one, whose kernels would die here with an illegal instruction."""
    want = target_features() or frozenset()
    have = host_features() if host is None else host
    return sorted((want & CODE_FEATURES) - have)


def check_runnable() -> None:
    """Raise a clear error, instead of a SIGILL later, when the kernels would be built for a
    CPU with features this host lacks (``NUMBA_CPU_NAME=alderlake`` on a CPU without
    AVX-VNNI, say)."""
    missing = missing_on_host()
    if missing:
        name = target_cpu()[0]
        raise RuntimeError(
            f"the CPU kernels are set to be built for {name!r} (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES), whose code "
            f"uses {', '.join(missing)}, which this CPU lacks; unset those variables or name a smaller CPU"
        )


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


#: This package's folder: the files whose njit(cache=True) functions the locator below serves.
HERE = Path(__file__).resolve().parent


@functools.cache
def _package_digest() -> str:
    """sha256 of every ``.py`` file of this package, in name order (the static kernels' key)."""
    h = hashlib.sha256()
    for f in sorted(HERE.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.cache
def static_folder() -> Path:
    """Where this package's own kernels are cached: ``cache_root()/static/<package digest>``.
    Once a process: every njit function asks at import (20 of them), and the functions
    already located could not follow a later change of the cache root anyway."""
    return cache_root() / "static" / _package_digest()


#: Folders of static kernels kept per cache root: the current code's and the most recently
#: written others (another install of an older version, a checkout on another branch).
STATIC_KEEP = 3


@functools.cache
def prune_static(folder: Path, current: str, keep: int = STATIC_KEEP) -> list[str]:
    """Remove the static-kernel folders of code no longer installed, once a process: all
    but the current one and the ``keep`` - 1 most recently written. Why: every changed
    version of the package (an upgrade, a developer's edit) compiles into a folder of its
    own, about 5 MB, which nothing would ever read again. A process still running an older
    version whose folder goes recreates it when it next saves a kernel (numba makes the
    folder before each save). Returns the names removed."""
    import shutil

    others = [d for d in folder.iterdir() if d.is_dir() and d.name != current]
    others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    removed = []
    for d in others[max(0, keep - 1):]:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed


def install_source_locator() -> bool:
    """Cache this package's own njit(cache=True) functions under ``cache_root()``, in a folder
    named by the content of the package's files, instead of beside each file.

    Why: numba's default keys a cache by the source file's path (its ``__pycache__``), so a
    new install (a fresh venv, ``pipx reinstall``, a wheel of the same code) compiled every
    static kernel again: 20 functions, about 80 s of a first rewrite on a 2-core AVX2 machine,
    although the code was the same. Keyed by content, every install of the same kernels
    shares one compile. The key covers the whole package, not one file, because a kernel
    inlines functions from its neighbours (``attention`` calls ``attention_tiled``), which numba's
    own per-file stamp does not see. Returns whether the locator is in place (numba's
    internals moved: caching then falls back to numba's default, nothing else changes).
    """
    try:
        from numba.core import caching

        base = caching._CacheLocator
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in numba 0.62
        classes = impl._locator_classes
    except (ImportError, AttributeError):
        return False
    if not isinstance(classes, list):
        return False
    if any(getattr(c, "_echoline_static", False) for c in classes):
        return True

    class PackageSourceLocator(base):  # type: ignore[misc, valid-type]
        """Numba cache locator for the functions defined in this package's files."""

        _echoline_static = True

        def __init__(self, py_func, py_file: str) -> None:
            self._lineno = py_func.__code__.co_firstlineno
            self._path = static_folder()
            self._stamp = self._path.name

        def get_cache_path(self) -> str:
            return str(self._path)

        def get_source_stamp(self) -> str:
            return self._stamp

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file: str):
            try:
                if Path(py_file).resolve().parent != HERE:
                    return None  # generated kernels (under cache_root) and everyone else's
                self = cls(py_func, py_file)
                self.ensure_cache_path()
                prune_static(self._path.parent, self._stamp)
            except OSError:  # an unwritable cache: numba's default locators take it
                return None
            return self

    classes.insert(0, PackageSourceLocator)
    return True


install_source_locator()
