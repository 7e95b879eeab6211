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
    ParamBlock,
    launch_config,
    param_codes,
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


def _slots(args) -> list[bytes]:
    """The 8-byte parameter slots ParamBlock fills for ``args``, read back through the
    pointer array the driver is given."""
    fmt, values = param_codes(args)
    block = ParamBlock(fmt)
    pointers = block.fill(values)
    return [ctypes.string_at(pointers[i], 8) for i in range(len(args))]


def test_kernel_params_take_the_c_types_cupy_would() -> None:
    """Each argument as the C value of its parameter, at the address the driver reads."""
    slots = _slots(
        [
            np.int32(-5),
            np.int64(1 << 40),
            np.float32(0.1),
            np.float64(10000.5),
            _FakeDeviceArray(),
            None,
            np.uint32(7),
        ]
    )
    assert slots[0][:4] == np.int32(-5).tobytes()
    assert slots[1] == np.int64(1 << 40).tobytes()
    assert slots[2][:4] == np.float32(0.1).tobytes()
    assert slots[3] == np.float64(10000.5).tobytes()
    assert slots[4] == (0x7F0000001000).to_bytes(8, "little")
    assert slots[5] == bytes(8)  # a null pointer
    assert slots[6][:4] == np.uint32(7).tobytes()


def test_param_block_is_reused_and_rewritten() -> None:
    """A launch's values overwrite the previous launch's in the same slots."""
    fmt, values = param_codes([np.int32(1), _FakeDeviceArray()])
    block = ParamBlock(fmt)
    first = block.fill(values)
    again = block.fill(param_codes([np.int32(2), None])[1])
    assert ctypes.addressof(first) == ctypes.addressof(again)
    assert ctypes.string_at(again[0], 4) == np.int32(2).tobytes()
    assert ctypes.string_at(again[1], 8) == bytes(8)


@pytest.mark.parametrize("arg", [3, 2.5, "x", np.zeros(3)])
def test_kernel_params_refuse_what_has_no_fixed_c_type(arg) -> None:
    with pytest.raises(TypeError, match="kernel argument"):
        param_codes([np.int32(0), arg])


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
    """The "@p1" build defines PDL_EARLY in every kernel: the trigger follows the wait."""
    from echoline.kernels.cuda import kernel_source

    src = kernel_source("q4_k@b5@p1")
    assert src.startswith("#define MT_MINB 5\n#define PDL_EARLY 1\n")
    assert "#define PDL_EARLY 1" not in kernel_source("q4_k@b5")
