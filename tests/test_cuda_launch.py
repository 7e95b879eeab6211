"""Programmatic dependent launch: the host half (kernels/cuda/launch.py) and the kernels'
half (every kernel waits before it touches memory). No GPU needed: the launch itself runs
in the GPU suite (tests/test_cuda_backend.py::test_programmatic_launch_changes_no_bits)."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.backends.cuda_tuning import CudaTuning
from echoline.kernels.cuda.launch import (
    PROGRAMMATIC_STREAM_SERIALIZATION,
    LaunchAttribute,
    LaunchConfig,
    kernel_param,
    launch_config,
    programmatic_attribute,
)

KERNELS = Path(__file__).resolve().parents[1] / "kernels" / "cuda" / "kernels.cu"


def test_structs_match_cuda_h_layout() -> None:
    """Sizes and offsets of CUlaunchConfig / CUlaunchAttribute as cuda.h (CUDA 13) lays
    them out on x86-64 (read with offsetof from a C program against that header)."""
    assert ctypes.sizeof(LaunchConfig) == 56
    assert LaunchConfig.hStream.offset == 32
    assert LaunchConfig.attrs.offset == 40
    assert LaunchConfig.numAttrs.offset == 48
    assert ctypes.sizeof(LaunchAttribute) == 72
    assert LaunchAttribute.value.offset == 8
    assert PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_attribute_allows_overlap() -> None:
    attr = programmatic_attribute()
    assert attr.id == 6
    assert int.from_bytes(bytes(attr.value[:4]), "little") == 1
    assert not any(attr.value[4:])


def test_launch_config_pads_dimensions() -> None:
    attr = programmatic_attribute()
    cfg = launch_config((7, 3), (128,), 4096, 0xABC0, attr)
    got = (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ)
    assert got == (7, 3, 1, 128, 1, 1)
    assert cfg.sharedMemBytes == 4096 and cfg.hStream == 0xABC0
    assert cfg.numAttrs == 1 and cfg.attrs.contents.id == 6


class _FakeDeviceArray:
    """What kernel_param reads of a CuPy array: ``.data.ptr``."""

    class _Mem:
        ptr = 0x7F0000001000

    data = _Mem()


def test_kernel_params_take_the_c_types_cupy_would() -> None:
    i32 = kernel_param(np.int32(-5))
    assert isinstance(i32, ctypes.c_int32) and i32.value == -5
    i64 = kernel_param(np.int64(1 << 40))
    assert ctypes.sizeof(i64) == 8 and i64.value == 1 << 40
    f32 = kernel_param(np.float32(0.1))
    assert isinstance(f32, ctypes.c_float) and np.float32(f32.value) == np.float32(0.1)
    f64 = kernel_param(np.float64(10000.5))
    assert isinstance(f64, ctypes.c_double) and f64.value == 10000.5
    assert kernel_param(_FakeDeviceArray()).value == 0x7F0000001000
    assert kernel_param(None).value is None  # a null pointer


@pytest.mark.parametrize("arg", [3, 2.5, "x", np.zeros(3)])
def test_kernel_params_refuse_what_has_no_fixed_c_type(arg) -> None:
    with pytest.raises(TypeError, match="kernel argument"):
        kernel_param(arg)


def _kernel_bodies(src: str) -> list[tuple[str, str]]:
    """(name, text after the opening brace) of every __global__ definition in src."""
    out = []
    for m in re.finditer(r"__global__", src):
        line_start = src.rfind("\n", 0, m.start()) + 1
        if src[line_start : m.start()].lstrip().startswith("//"):
            continue
        brace = src.index("{", m.end())
        name = re.findall(r"(\w+)\s*\(", src[m.end() : brace])
        out.append((name[-1] if name else "?", src[brace + 1 : brace + 200]))
    return out


def test_every_kernel_waits_before_anything_else() -> None:
    """A kernel launched with the attribute that touched memory before griddepcontrol.wait
    could read a result the previous kernel has not written: the launch would race. So
    grid_dependency() must be the first statement of every kernel."""
    bodies = _kernel_bodies(KERNELS.read_text())
    assert len(bodies) >= 20
    for name, body in bodies:
        first = body.replace("\\", " ").split(";")[0].strip()
        assert first == "grid_dependency()", f"kernel {name} starts with {first!r}"


def test_environment_switches_programmatic_launch() -> None:
    assert CudaTuning.from_env({"ECHOLINE_CUDA_PDL": "1"}).programmatic_launch is True
    assert CudaTuning.from_env({"ECHOLINE_CUDA_PDL": "0"}).programmatic_launch is False
    assert CudaTuning.from_env({"ECHOLINE_CUDA_PDL": "yes"}) == CudaTuning()
    assert CudaTuning.from_env({"ECHOLINE_CUDA_PDL_EARLY": "1"}).programmatic_early is True
    assert CudaTuning.from_env({"ECHOLINE_CUDA_PDL_EARLY": "2"}) == CudaTuning()


def test_early_release_is_a_module_build() -> None:
    """"@p1" builds every kernel with PDL_EARLY: the trigger follows the wait."""
    from echoline.kernels.cuda import kernel_source

    src = kernel_source("q4_k@b5@p1")
    assert src.startswith("#define MT_MINB 5\n#define PDL_EARLY 1\n")
    assert "#define PDL_EARLY 1" not in kernel_source("q4_k@b5")
