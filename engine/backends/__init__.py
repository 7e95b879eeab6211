"""Backends: where the arithmetic runs. ``get_backend`` picks one by name.

Imports are lazy so that, say, the CPU path never imports CuPy.
"""

from __future__ import annotations

import importlib.util
import platform

from echoline.engine.backends.base import Backend
from echoline.engine.backends.cpu_activations import CPU_ACTIVATIONS, cpu_activations_mode
from echoline.engine.errors import EcholineError

BACKEND_NAMES = ("auto", "cpu", "numpy", "cuda", "mlx")

__all__ = ["BACKEND_NAMES", "CPU_ACTIVATIONS", "cpu_activations_mode", "get_backend", "resolve_backend_name"]
def _cuda_available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any CUDA runtime failure means "no GPU"
        return False


def _apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def resolve_backend_name(name: str) -> str:
    """'auto' → cuda when a GPU and CuPy are present, mlx on Apple silicon, else cpu."""
    if name not in BACKEND_NAMES:
        raise EcholineError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if name != "auto":
        return name
    if _cuda_available():
        return "cuda"
    if _apple_silicon() and importlib.util.find_spec("mlx") is not None:
        return "mlx"
    return "cpu"


def get_backend(name: str = "auto", cpu_activations: str | None = None) -> Backend:
    """Instantiate a backend by name, with a clear error when its library is missing.

    ``cpu_activations`` (``CPU_ACTIVATIONS``) is the cpu backend's mode; None leaves it to
    ``ECHOLINE_CPU_ACTIVATIONS`` (default auto). Other backends ignore it.
    """
    resolved = resolve_backend_name(name)
    if cpu_activations is not None:
        cpu_activations_mode(cpu_activations)  # a bad value is an error whichever backend runs
    try:
        if resolved == "numpy":
            from echoline.engine.backends.numpy_backend import NumpyBackend

            return NumpyBackend()
        if resolved == "cpu":
            from echoline.engine.backends.cpu_backend import CpuBackend

            return CpuBackend(activations=cpu_activations)
        if resolved == "cuda":
            from echoline.engine.backends.cupy_backend import CupyBackend

            return CupyBackend()
        from echoline.engine.backends.mlx_backend import MlxBackend

        return MlxBackend()
    except ImportError as exc:
        extra = {"cuda": "echoline[cuda]", "mlx": "echoline[mlx]"}.get(resolved, "echoline")
        raise EcholineError(
            f"backend {resolved!r} is not available ({exc}); install {extra}"
        ) from exc
