"""Backends: where the arithmetic runs. ``get_backend`` picks one by name.

Imports are lazy so that, say, the CPU path never imports CuPy.
"""

from __future__ import annotations

import importlib.util
import os
import platform

from echoline.engine.backends.base import Backend
from echoline.engine.errors import EcholineError

BACKEND_NAMES = ("auto", "cpu", "numpy", "cuda", "mlx")
#: The cpu backend's activation modes. ``q8``: activations quantized to int8 per 32 inputs
#: and multiplied in integers (``kernels.cpu.q8act``: AVX-512 VNNI, AVX-VNNI, or the same bits
#: from AVX2), as llama.cpp's CPU path does with its Q8 activations; ~5e-3 relative error per
#: product, 1.7x faster one-row decode than f32 on the Qwen 0.5B here. ``f32``: products in
#: float32 (closest to the model's own function). ``auto`` (the default): q8 wherever the
#: int8 kernels run (AVX2 or better), else f32. On an AVX2 machine stood in for by Haswell
#: code (no AVX-512 instruction anywhere) q8 ran the Qwen 1.5B's one-row decode 1.7x and its
#: 16-row verify 1.75x faster than f32, and the 0.5B's 16-row verify 2.2x (one row at
#: parity): docs/benchmarks.md. Either way a row's bits do not depend on the row count, so
#: speculation is exact within the mode (docs/kernels-cpu.md, "int8 activations").
CPU_ACTIVATIONS = ("auto", "f32", "q8")


def _int8_kernels() -> bool:
    from echoline.kernels.cpu.q8act import q8_available

    return q8_available()


def cpu_activations_mode(value: str | None = None) -> str:
    """The mode that runs: ``value``, else ``ECHOLINE_CPU_ACTIVATIONS``, else auto; auto
    resolves to q8 where the int8 kernels run (AVX2 or better) and to f32 elsewhere (checked)."""
    mode = value or os.environ.get("ECHOLINE_CPU_ACTIVATIONS") or "auto"
    if mode not in CPU_ACTIVATIONS:
        raise EcholineError(f"unknown CPU activations {mode!r}; choose one of {', '.join(CPU_ACTIVATIONS)}")
    if mode == "auto":
        return "q8" if _int8_kernels() else "f32"
    return mode


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
