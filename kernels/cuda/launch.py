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
import struct
import threading
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


#: struct codes of NumPy scalar kernel arguments by (dtype kind, size), each padded to an
#: 8-byte slot (pointers: "Q")
_DTYPE_CODES = {
    ("b", 1): "?7x",
    ("i", 1): "b7x",
    ("u", 1): "B7x",
    ("i", 2): "h6x",
    ("u", 2): "H6x",
    ("f", 2): "e6x",
    ("i", 4): "i4x",
    ("u", 4): "I4x",
    ("f", 4): "f4x",
    ("i", 8): "q",
    ("u", 8): "Q",
    ("f", 8): "d",
}
#: ... the types the backend passes, looked up by exact type first (the common path)
_SCALAR_CODES = {
    t: _DTYPE_CODES[(np.dtype(t).kind, np.dtype(t).itemsize)]
    for t in (np.int32, np.uint32, np.float32, np.int64, np.uint64, np.float64)
}


def param_codes(args: Sequence[Any]) -> tuple[str, list[Any]]:
    """The struct format of ``args`` as kernel parameters, one 8-byte slot each, and the
    values to pack into it.

    The same mapping CuPy applies to the arguments the backend passes: a device array is
    its pointer, a NumPy scalar its C type, None a null pointer. Anything else is refused:
    a Python int or float has no fixed C width, and guessing one would misalign the rest.
    Each parameter is read by the driver from its own address, so a slot only has to hold
    the value at its start (little-endian, as every CUDA host is).
    """
    codes = ["<"]
    values: list[Any] = []
    for arg in args:
        code = _SCALAR_CODES.get(type(arg))
        if code is not None:
            codes.append(code)
            values.append(arg)
            continue
        if arg is None:
            codes.append("Q")
            values.append(0)
            continue
        if isinstance(arg, np.generic):
            code = _DTYPE_CODES.get((arg.dtype.kind, arg.dtype.itemsize))
            if code is None:
                raise TypeError(f"kernel argument of NumPy type {arg.dtype}: no C parameter type")
            codes.append(code)
            values.append(arg)
            continue
        ptr = getattr(getattr(arg, "data", None), "ptr", None)
        if not isinstance(ptr, int):
            kind = type(arg).__name__
            raise TypeError(
                f"kernel argument of type {kind}: pass a device array or a NumPy scalar"
            )
        codes.append("Q")
        values.append(ptr)
    return "".join(codes), values


class ParamBlock:
    """A reusable parameter area for one argument signature: ``len(codes)`` 8-byte slots
    and the array of their addresses that ``cuLaunchKernelEx`` takes. The driver copies the
    values at the launch (or into the graph node), so the next launch may overwrite them."""

    def __init__(self, fmt: str) -> None:
        self.struct = struct.Struct(fmt)
        n = self.struct.size // 8
        self.buffer = ctypes.create_string_buffer(max(8, self.struct.size))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(1, n))(*(base + 8 * i for i in range(n)))

    def fill(self, values: Sequence[Any]) -> Any:
        """Pack ``values`` into the slots; the pointer array to pass as kernelParams."""
        self.struct.pack_into(self.buffer, 0, *values)
        return self.pointers


def dims3(grid: Sequence[int], block: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Grid and block as three dimensions each (missing ones are 1), as CuPy takes them."""
    return (*grid, 1, 1)[:3], (*block, 1, 1)[:3]


def launch_config(
    grid: Sequence[int], block: Sequence[int], shared_mem: int, stream: int, attr: LaunchAttribute
) -> LaunchConfig:
    """A ``CUlaunchConfig`` for one launch carrying ``attr``."""
    g, b = dims3(grid, block)
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


#: the driver API version (``cuDriverGetVersion``) from which a programmatic launch can be
#: captured into a graph as a programmatic edge: CUDA 12.3
MIN_DRIVER_VERSION = 12030


def available(driver_version: int) -> bool:
    """Whether programmatic launches can be used with a driver of ``driver_version``
    (``cupy.cuda.runtime.driverGetVersion()``): new enough, and ``cuLaunchKernelEx``
    loadable. The backend falls back to CuPy's plain launches otherwise."""
    if driver_version < MIN_DRIVER_VERSION:
        return False
    try:
        _driver()
    except (OSError, AttributeError):
        return False
    return True


class ProgrammaticKernel:
    """A compiled CuPy kernel launched with programmatic stream serialization.

    Called like the CuPy kernel it wraps (``kernel(grid, block, args, shared_mem=...)``),
    with its attributes readable (and ``max_dynamic_shared_size_bytes`` writable) through
    the wrapper, so the backend handles either the same way.
    """

    def __init__(self, kernel: Any) -> None:
        import cupy

        self.kernel = kernel
        self._fn = getattr(kernel, "kernel", kernel).ptr  # RawKernel -> its CUfunction
        self._stream = cupy.cuda.get_current_stream  # the capture stream while capturing
        self._attr = programmatic_attribute()
        self._cfg = launch_config((1,), (1,), 0, 0, self._attr)
        self._blocks: dict[str, ParamBlock] = {}  # one per argument signature
        self._lock = threading.Lock()  # the config and parameter areas are reused

    def __getattr__(self, name: str) -> Any:
        """The wrapped kernel's attributes (``num_regs``, ``shared_size_bytes``, ...)."""
        if name == "kernel":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
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
        g, b = dims3(grid, block)
        if min(*g, *b) < 1 or max(*g, *b) >= 1 << 31 or not 0 <= shared_mem < 1 << 31:
            raise ValueError(
                f"launch of {self._name()}: grid {grid}, block {block}, shared {shared_mem}"
            )
        fmt, values = param_codes(args)
        stream = self._stream().ptr
        lib = _driver()
        with self._lock:
            params = self._blocks.get(fmt)
            if params is None:
                params = self._blocks[fmt] = ParamBlock(fmt)
            cfg = self._cfg
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
            cfg.sharedMemBytes = shared_mem
            cfg.hStream = stream
            err = lib.cuLaunchKernelEx(ctypes.byref(cfg), self._fn, params.fill(values), None)
        if err:
            name = ctypes.c_char_p()
            lib.cuGetErrorName(err, ctypes.byref(name))
            label = (name.value or b"?").decode()
            raise RuntimeError(
                f"cuLaunchKernelEx failed for {self._name()}: {label} ({err}); "
                "ECHOLINE_CUDA_PDL=0 launches every kernel without programmatic dependent launch"
            )

    def _name(self) -> str:
        return str(getattr(self.kernel, "name", "kernel"))
