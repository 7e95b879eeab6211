"""The cpu backend's activation modes (f32 or int8) and which one runs.

Its own module so that ``cpu_backend`` can read it without importing the package
``__init__`` that, in turn, imports ``cpu_backend`` to build it.
"""

from __future__ import annotations

import os

from echoline.engine.errors import EcholineError

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
