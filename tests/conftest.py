"""Shared fixtures: the real models (pulled from PyPI on a fresh machine) and the default backend."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "llamacpp-greedy.json"
_LOCAL_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp-greedy.json"


def reference_data() -> dict:
    """llama.cpp's prompt ids and greedy tokens (a copy is kept in tests/data for CI)."""
    path = _LOCAL_REFERENCE if _LOCAL_REFERENCE.is_file() else REFERENCE
    return json.loads(path.read_text())


def cpu_backend_name() -> str:
    """The fast CPU backend when it is importable, else the numpy reference."""
    return "cpu" if importlib.util.find_spec("engine.backends.cpu_backend") else "numpy"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from engine.models_registry import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from engine.models_registry import resolve_model

    return resolve_model("gemma3-270m")
