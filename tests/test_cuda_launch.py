"""Programmatic dependent launch: the host half (kernels/cuda/launch.py) and the kernels'
half (every kernel waits before it touches memory). No GPU needed: the launch itself runs
in the GPU suite (tests/test_cuda_backend.py::test_programmatic_launch_changes_no_bits)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
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
    """What param_codes reads of a CuPy array: ``.data.ptr``."""

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
    assert ctypes.string_at(first[0], 4) == np.int32(1).tobytes()
    again = block.fill(param_codes([np.int32(2), None])[1])
    assert ctypes.string_at(again[0], 4) == np.int32(2).tobytes()
    assert ctypes.string_at(again[1], 8) == bytes(8)


def test_other_numpy_scalars_take_their_dtype() -> None:
    """Scalars the backend does not pass today still get their own C width."""
    slots = _slots([np.bool_(True), np.uint8(200), np.int16(-3), np.longlong(-9)])
    assert slots[0][:1] == b"\x01"
    assert slots[1][:1] == bytes([200])
    assert slots[2][:2] == np.int16(-3).tobytes()
    assert slots[3] == np.int64(-9).tobytes()


@pytest.mark.parametrize("arg", [3, 2.5, "x", np.zeros(3), np.complex64(1)])
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


def test_integer_form_is_a_module_build() -> None:
    """"@i1" builds the tensor-core products in their integer form (MT_INT8); the common
    module always has both x conversions (xprep, xprep8)."""
    from echoline.kernels.cuda import kernel_source

    assert kernel_source("q4_k@i1@b5").startswith("#define MT_INT8 1\n#define MT_MINB 5\n")
    assert "#define MT_INT8 1" not in kernel_source("q4_k@b5")
    common = kernel_source(None)
    assert "void xprep(" in common and "void xprep8(" in common


class _FakeDriver:
    """Stands in for libcuda: records what each cuLaunchKernelEx call was given."""

    def __init__(self, err: int = 0) -> None:
        self.err = err
        self.calls: list[dict] = []

    def cuLaunchKernelEx(self, cfg_ref, fn, params, extra) -> int:  # noqa: N802 - the C name
        cfg = cfg_ref._obj
        attr = cfg.attrs.contents
        self.calls.append(
            {
                "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                "shared": cfg.sharedMemBytes,
                "stream": cfg.hStream,
                "attrs": (cfg.numAttrs, attr.id, attr.value[0]),
                "fn": fn,
                "slots": [ctypes.string_at(params[i], 8) for i in range(len(params))],
            }
        )
        return self.err

    def cuGetErrorName(self, err, name_ref) -> int:  # noqa: N802 - the C name
        name_ref._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0


@pytest.fixture
def fake_launch(monkeypatch):
    """ProgrammaticKernel over a fake kernel, a fake driver and a fake CuPy stream."""
    import sys
    from types import SimpleNamespace

    from echoline.kernels.cuda import launch

    stream = SimpleNamespace(ptr=0x5150)
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    driver = _FakeDriver()
    monkeypatch.setattr(launch, "_driver", lambda: driver)
    raw = SimpleNamespace(kernel=SimpleNamespace(ptr=0xF00D), name="k_test", num_regs=40)
    return launch.ProgrammaticKernel(raw), driver, stream


def test_programmatic_kernel_launch_fields(fake_launch) -> None:
    """What one launch hands the driver: dimensions, shared memory, the current stream,
    the programmatic attribute, the CUfunction and the packed arguments."""
    kernel, driver, stream = fake_launch
    kernel((5, 2), (128,), (np.int32(7), _FakeDeviceArray()), shared_mem=4096)
    stream.ptr = 0x6160  # a capture stream made current
    kernel((9,), (32, 4), (np.int32(-1), None))
    first, second = driver.calls
    assert first["grid"] == (5, 2, 1) and first["block"] == (128, 1, 1)
    assert first["shared"] == 4096 and first["stream"] == 0x5150
    assert first["attrs"] == (1, 6, 1) and first["fn"] == 0xF00D
    assert first["slots"][0][:4] == np.int32(7).tobytes()
    assert first["slots"][1] == (0x7F0000001000).to_bytes(8, "little")
    assert second["grid"] == (9, 1, 1) and second["block"] == (32, 4, 1)
    assert second["shared"] == 0 and second["stream"] == 0x6160
    assert second["slots"][0][:4] == np.int32(-1).tobytes() and second["slots"][1] == bytes(8)
    assert kernel.num_regs == 40  # the wrapped kernel's attributes read through


def test_programmatic_kernel_errors_are_clear(fake_launch) -> None:
    kernel, driver, _ = fake_launch
    driver.err = 1
    with pytest.raises(
        RuntimeError, match="k_test: CUDA_ERROR_INVALID_VALUE .*ECHOLINE_CUDA_PDL=0"
    ):
        kernel((1,), (32,), (np.int32(0),))
    with pytest.raises(ValueError, match="k_test"):
        kernel((0,), (32,), (np.int32(0),))
    with pytest.raises(ValueError, match="k_test"):
        kernel((1,), (32,), (np.int32(0),), shared_mem=-1)


def test_available_needs_a_driver_that_captures_it(monkeypatch) -> None:
    from echoline.kernels.cuda import launch

    monkeypatch.setattr(launch, "_driver", lambda: _FakeDriver())
    assert launch.available(12030) and launch.available(13000)
    assert not launch.available(12020)

    def missing():
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(launch, "_driver", missing)
    assert not launch.available(13000)


def _entries(ptx: str) -> dict[str, str]:
    """Each kernel entry of a PTX file: name -> body."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)", ptx):
        end = ptx.find("\n}\n", m.end())
        out[m.group(1)] = ptx[m.end() : end]
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc to build the kernels' PTX")
@pytest.mark.parametrize(
    "module", [None, "q5_0@p1", "q6_k@i1"], ids=["common", "q5_0-early", "q6_k-int8"]
)
def test_every_kernel_entry_waits_before_touching_memory(tmp_path, module) -> None:
    """In the PTX built for sm_90 (what runs on Hopper), every kernel executes
    griddepcontrol.wait before its first global load, store or atomic, and the early
    build releases its dependents only after that wait."""
    from echoline.kernels.cuda import OPTIONS, kernel_source

    src = tmp_path / "k.cu"
    src.write_text(kernel_source(module))
    ptx = tmp_path / "k.ptx"
    subprocess.run(
        ["nvcc", *OPTIONS, "-arch=sm_90", "-ptx", "-o", str(ptx), str(src)],
        check=True,
        capture_output=True,
    )
    entries = _entries(ptx.read_text())
    assert len(entries) >= 20
    # global or generic loads, stores and atomics (parameters, shared and local are fine)
    touch = re.compile(r"\b(ld|st|atom|red)\.(?!param|shared|local|const)|\bcp\.async")
    for name, body in entries.items():
        wait = body.find("griddepcontrol.wait")
        first = touch.search(body)
        assert wait >= 0, f"{name} never waits"
        assert first is None or wait < first.start(), f"{name} touches memory before its wait"
        release = body.find("griddepcontrol.launch_dependents")
        if module and module.endswith("@p1"):
            assert release > wait, f"{name}: early build without a release after the wait"
        else:
            assert release < 0, f"{name}: releases its dependents early"
