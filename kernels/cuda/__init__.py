"""CUDA C sources for the CuPy backend, compiled once per process with NVRTC.

Only ``load_module`` imports CuPy, so importing this package costs nothing on a
machine without a GPU. CuPy caches the compiled binary on disk, keyed by source
and options, so later processes skip compilation.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: NVRTC options. --fmad=false: the kernels write every fused multiply-add out,
#: so no instantiation can contract differently and break batch invariance.
OPTIONS = ("--std=c++17", "--fmad=false")


def kernel_source() -> str:
    """kernels.cu with quant.cuh inlined (NVRTC then needs no include path)."""
    src = (HERE / "kernels.cu").read_text()
    header = (HERE / "quant.cuh").read_text()
    return src.replace('#include "quant.cuh"', header)


@lru_cache(maxsize=1)
def load_module() -> Any:
    """The compiled ``cupy.RawModule`` (compiled on first use, then cached)."""
    import cupy

    module = cupy.RawModule(code=kernel_source(), options=OPTIONS)
    module.compile()
    return module
