"""Load a GGUF file into a ready-to-run model on a backend."""

from __future__ import annotations

from pathlib import Path

from engine.backends import get_backend
from engine.backends.base import Backend
from engine.config import config_from_gguf
from engine.gguf_file import GGUFFile
from engine.models import MODEL_CLASSES, Transformer


def load_model(path: str | Path, backend: Backend | str = "auto") -> tuple[GGUFFile, Transformer]:
    """Open ``path`` and build its architecture's model with weights on ``backend``."""
    gf = GGUFFile(path)
    config = config_from_gguf(gf)
    be = get_backend(backend) if isinstance(backend, str) else backend
    model = MODEL_CLASSES[config.arch](gf, config, be)
    return gf, model
