"""Kernel launches with programmatic dependent launch (PDL), through the CUDA driver.

Why not CuPy's own launch: CuPy has no way to pass launch attributes, and the one that
matters here, ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, lets a kernel's
blocks start while the previous kernel in the stream still runs. A decode step is a chain
of ~200 small dependent kernels (about 5 µs each on the H200), so the launch and block
scheduling gap between two kernels is a real share of the step. Every kernel in
``kernels.cu`` begins with ``grid_dependency()`` (``griddepcontrol.wait``), so nothing it
reads or writes is touched before the kernels it follows have completed: the results are
the same bits with or without the attribute. Captured into a CUDA graph, the attribute
becomes a programmatic edge (driver 12.3 and later).

Only ``ctypes`` and the driver library are used (``libcuda.so.1``, present wherever CuPy
runs a kernel); CuPy supplies the compiled function, the stream and the device pointers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

#: cuda.h: CUlaunchAttributeID value of programmatic stream serialization
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """cuda.h ``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class LaunchConfig(ctypes.Structure):
    """cuda.h ``CUlaunchConfig`` (56 bytes; the stream at offset 32)."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def programmatic_attribute() -> LaunchAttribute:
    """The attribute that allows the launch to overlap the previous kernel in its stream."""
    attr = LaunchAttribute()
    attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1  # programmaticStreamSerializationAllowed: an int, little-endian
    return attr


def kernel_param(arg: Any) -> ctypes._SimpleCData:
    """One kernel argument as the C value the kernel's parameter holds.

    The same mapping CuPy applies to the arguments the backend passes: a device array is
    its pointer, a NumPy scalar its C type, None a null pointer. Anything else is refused:
    a Python int or float has no fixed C width, and guessing one would misalign the rest.
    """
    if arg is None:
        return ctypes.c_void_p(0)
    if isinstance(arg, np.generic):
        return np.ctypeslib.as_ctypes_type(arg.dtype)(arg.item())
    data = getattr(arg, "data", None)
    ptr = getattr(data, "ptr", None)
    if isinstance(ptr, int):
        return ctypes.c_void_p(ptr)
    raise TypeError(
        f"kernel argument of type {type(arg).__name__}: pass a device array or a NumPy scalar"
    )


def launch_config(
    grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: int, attr: LaunchAttribute
) -> LaunchConfig:
    """A ``CUlaunchConfig`` for one launch carrying ``attr``."""
    g = (*grid, 1, 1)[:3]
    b = (*block, 1, 1)[:3]
    cfg = LaunchConfig(*g, *b, int(shared_mem), ctypes.c_void_p(stream))
    cfg.attrs = ctypes.pointer(attr)
    cfg.numAttrs = 1
    return cfg


@cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [
        ctypes.POINTER(LaunchConfig),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


class ProgrammaticKernel:
    """A compiled CuPy kernel launched with programmatic stream serialization.

    Called like the CuPy kernel it wraps (``kernel(grid, block, args, shared_mem=...)``),
    with its attributes readable (and ``max_dynamic_shared_size_bytes`` writable) through
    the wrapper, so the backend handles either the same way.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._fn = getattr(kernel, "kernel", kernel).ptr  # RawKernel -> its CUfunction
        self._attr = programmatic_attribute()

    def __getattr__(self, name: str) -> Any:
        """The wrapped kernel's attributes (``num_regs``, ``shared_size_bytes``, ...)."""
        return getattr(self.kernel, name)

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.kernel.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.kernel.max_dynamic_shared_size_bytes = value

    def __call__(
        self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], shared_mem: int = 0
    ) -> None:
        import cupy

        values = [kernel_param(a) for a in args]
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        stream = cupy.cuda.get_current_stream().ptr
        cfg = launch_config(grid, block, shared_mem, stream, self._attr)
        lib = _driver()
        err = lib.cuLaunchKernelEx(ctypes.byref(cfg), self._fn, params, None)
        if err:
            name = ctypes.c_char_p()
            lib.cuGetErrorName(err, ctypes.byref(name))
            label = (name.value or b"?").decode()
            raise RuntimeError(f"cuLaunchKernelEx failed: {label} ({err})")
