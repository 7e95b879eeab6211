"""Where echoline keeps what it derives or downloads: one cache folder, one variable.

Everything lives under one root, in a folder per kind (``KINDS``): the models, the numba
kernels, the relaid-out weights, the draft-length calibration and derived tokenizers.
The root is ``$ECHOLINE_CACHE_DIR`` when set, else the platform's user cache folder
(``platformdirs``: ``$XDG_CACHE_HOME/echoline`` or ``~/.cache/echoline`` on Linux,
``~/Library/Caches/echoline`` on macOS).

Why one place: the folders were built in five modules from four variables, so moving
the cache (a small home, a CI cache) moved only part of it. The older variables
``ECHOLINE_HOME`` and ``ECHOLINE_CACHE`` still work, as deprecated aliases of
``ECHOLINE_CACHE_DIR`` (a warning says so once), so scripts that set them keep their
models. A macOS machine that already has ``~/.cache/echoline`` (where echoline kept
everything before) keeps using it, rather than downloading the models again.

This module sits at the top of the package so that both ``engine`` and ``kernels`` can
read it without either importing the other.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import platformdirs

ENV = "ECHOLINE_CACHE_DIR"
#: Older names of ``ECHOLINE_CACHE_DIR``, still read (in this order) with a warning.
DEPRECATED_ENV = ("ECHOLINE_HOME", "ECHOLINE_CACHE")
#: The folder of each kind of cached data, under the root.
KINDS = {
    "models": "models",
    "numba": "numba",
    "weights": "relayout",
    "calibration": "calibration",
    "tokenizers": "tokenizers",
}
_warned: set[str] = set()


def _legacy_root() -> Path:
    return Path.home() / ".cache" / "echoline"


def cache_root() -> Path:
    """The root of every echoline cache (not created here)."""
    value = os.environ.get(ENV, "").strip()
    if value:
        return Path(value).expanduser()
    for old in DEPRECATED_ENV:
        value = os.environ.get(old, "").strip()
        if value:
            if old not in _warned:
                _warned.add(old)
                warnings.warn(f"{old} is deprecated: set {ENV} instead (it moves every echoline cache)",
                              DeprecationWarning, stacklevel=2)
            return Path(value).expanduser()
    root = platformdirs.user_cache_path("echoline", appauthor=False)
    if sys.platform == "darwin" and not root.exists() and _legacy_root().is_dir():
        return _legacy_root()
    return root


def cache_dir(kind: str) -> Path:
    """The folder of one kind of cached data (``KINDS``); not created here."""
    try:
        return cache_root() / KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown cache kind {kind!r}; known: {', '.join(KINDS)}") from None


def cache_dirs() -> dict[str, Path]:
    """Every cache folder by kind (``echoline doctor`` lists them with their sizes)."""
    return {kind: cache_dir(kind) for kind in KINDS}
