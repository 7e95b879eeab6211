"""The package version, defined once: ``version`` in pyproject.toml.

An installed package reads it from its distribution metadata. A source tree that was
never installed (the GPU machine runs one with only ``PYTHONPATH``) reads pyproject.toml
beside the package instead, so both report the same number without a second copy.
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: What is reported when neither metadata nor pyproject.toml can be read.
UNKNOWN = "0+unknown"


@cache
def package_version() -> str:
    """The installed distribution's version, else the source tree's pyproject.toml's."""
    try:
        return version("echoline")
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        with open(pyproject, "rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN
