"""Load a GGUF file into a ready-to-run model on a backend."""

from __future__ import annotations

from pathlib import Path

from echoline.engine.backends import get_backend
from echoline.engine.backends.base import Backend
from echoline.engine.config import config_from_gguf
from echoline.engine.gguf_file import GGUFFile
from echoline.engine.models import MODEL_CLASSES, Transformer


def load_model(path: str | Path, backend: Backend | str = "auto") -> tuple[GGUFFile, Transformer]:
    """Open ``path`` and build its architecture's model with weights on ``backend``."""
    gf = GGUFFile(path)
    config = config_from_gguf(gf)
    be = get_backend(backend) if isinstance(backend, str) else backend
    model = MODEL_CLASSES[config.arch](gf, config, be)
    return gf, model
