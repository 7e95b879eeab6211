"""Open a GGUF file: metadata as a dict, tensors as memory-mapped quantized views.

Why not ``gguf.GGUFReader`` directly: it builds a numpy view per array element,
which takes ~8 s on Gemma 3's 262k-entry vocabulary. The format itself is a
short header, so this module walks it with ``struct`` and ``numpy.frombuffer``
(0.1 s), while taking every constant (value types, quant types, block sizes)
from the ``gguf`` package so the layouts stay the upstream ones.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from engine.errors import ModelFileError

GGUF_MAGIC = 0x46554747  # b"GGUF" little-endian
_U64 = struct.Struct("<Q")
_VT = gguf.GGUFValueType
_SCALAR_FORMATS: dict[int, str] = {
    _VT.UINT8: "<B",
    _VT.INT8: "<b",
    _VT.UINT16: "<H",
    _VT.INT16: "<h",
    _VT.UINT32: "<I",
    _VT.INT32: "<i",
    _VT.FLOAT32: "<f",
    _VT.BOOL: "<?",
    _VT.UINT64: "<Q",
    _VT.INT64: "<q",
    _VT.FLOAT64: "<d",
}
_NUMPY_DTYPES: dict[int, str] = {
    _VT.UINT8: "<u1",
    _VT.INT8: "<i1",
    _VT.UINT16: "<u2",
    _VT.INT16: "<i2",
    _VT.UINT32: "<u4",
    _VT.INT32: "<i4",
    _VT.FLOAT32: "<f4",
    _VT.BOOL: "?",
    _VT.UINT64: "<u8",
    _VT.INT64: "<i8",
    _VT.FLOAT64: "<f8",
}

#: Quant types the engine can compute with (the CPU kernels and the numpy reference).
SUPPORTED_QTYPES = frozenset(
    {
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
        gguf.GGMLQuantizationType.Q4_0,
        gguf.GGMLQuantizationType.Q4_1,
        gguf.GGMLQuantizationType.Q5_0,
        gguf.GGMLQuantizationType.Q5_1,
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q4_K,
        gguf.GGMLQuantizationType.Q5_K,
        gguf.GGMLQuantizationType.Q6_K,
    }
)


@dataclass(frozen=True)
class QuantTensor:
    """One tensor of the file, still in its on-disk encoding.

    ``shape`` is ggml's ``ne`` reversed, i.e. numpy order: a weight matrix is
    ``(out_features, in_features)`` and ``y = x @ W.T``. ``data`` is a read-only
    view into the memory map shaped ``(rows, bytes_per_row)`` (or the native
    float dtype for F32/F16), so opening a model copies nothing.
    """

    name: str
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray
    #: "<file identity>@<byte offset>" for tensors read from a file (None for built ones):
    #: lets a backend cache what it derives from the bytes (see ``GGUFFile.identity``).
    origin: str | None = None

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def dequantize(self) -> np.ndarray:
        """Float32 copy in numpy order (the readable reference path)."""
        if self.qtype == gguf.GGMLQuantizationType.F32:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        if self.qtype == gguf.GGMLQuantizationType.F16:
            return np.asarray(self.data, dtype=np.float32).reshape(self.shape)
        out = gguf.quants.dequantize(np.asarray(self.data), self.qtype)
        return np.asarray(out, dtype=np.float32).reshape(self.shape)

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        """Float32 rows of a 2-D tensor (embedding lookup without dequantizing all)."""
        picked = np.asarray(self.data)[np.asarray(rows)]
        if self.qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            return picked.astype(np.float32)
        out = gguf.quants.dequantize(picked, self.qtype)
        return np.asarray(out, dtype=np.float32).reshape(len(rows), self.shape[-1])


class _Cursor:
    """Sequential little-endian reader over the mapped header."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise ModelFileError(
                f"{self.path}: truncated GGUF header (wanted {n} bytes at offset {self.pos}, "
                f"file has {len(self.buf)})"
            )

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """``count`` length-prefixed strings in one tight loop.

        Why not ``string()`` per item: Gemma 3's vocabulary is 262k strings, and the
        per-call bounds check and ``struct`` format lookup made this 0.2 s of every start.
        """
        buf = self.buf
        size = len(buf)
        unpack = _U64.unpack_from
        pos = self.pos
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n)
            append(str(buf[pos : pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype == _VT.STRING:
            return self.string()
        if vtype == _VT.ARRAY:
            item_type = self.scalar("<I")
            count = self.scalar("<Q")
            if item_type == _VT.STRING:
                return self.strings(count)
            if item_type in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[item_type])
                nbytes = dtype.itemsize * count
                self.need(nbytes)
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += nbytes
                return arr
            if item_type == _VT.ARRAY:
                return [self.value(_VT.ARRAY) for _ in range(count)]
            raise ModelFileError(f"{self.path}: unknown GGUF array item type {item_type}")
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        raise ModelFileError(f"{self.path}: unknown GGUF value type {vtype}")


class GGUFFile:
    """A parsed GGUF file: ``metadata`` (dict) and ``tensors`` (name → QuantTensor)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"model file not found: {self.path}")
        with open(self.path, "rb") as fh:
            try:
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # empty file
                raise ModelFileError(f"{self.path}: empty file, not a GGUF model") from exc
        buf = memoryview(self._mmap)
        cur = _Cursor(buf, self.path)
        magic = cur.scalar("<I")
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{self.path}: not a GGUF file (magic {magic:#010x}, expected {GGUF_MAGIC:#010x})"
            )
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise ModelFileError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar("<I")
            self.metadata[key] = cur.value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            ne = [cur.scalar("<Q") for _ in range(n_dims)]
            ttype = cur.scalar("<I")
            offset = cur.scalar("<Q")
            infos.append((name, ne, ttype, offset))
        alignment = int(self.metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT))
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.identity = self._identity(buf[: cur.pos])
        self.tensors: dict[str, QuantTensor] = {}
        raw = np.frombuffer(self._mmap, dtype=np.uint8)
        for name, ne, ttype, offset in infos:
            try:
                qtype = gguf.GGMLQuantizationType(ttype)
            except ValueError as exc:
                raise ModelFileError(f"{self.path}: tensor {name} has unknown type id {ttype}") from exc
            block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            shape = tuple(int(x) for x in reversed(ne))
            cols = shape[-1]
            rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            if cols % block_elems:
                raise ModelFileError(
                    f"{self.path}: tensor {name} row of {cols} is not a multiple of "
                    f"{qtype.name}'s block of {block_elems}"
                )
            row_bytes = cols // block_elems * block_bytes
            start = data_start + offset
            end = start + rows * row_bytes
            if end > len(raw):
                raise ModelFileError(
                    f"{self.path}: truncated file: tensor {name} ends at byte {end}, "
                    f"file has {len(raw)} bytes"
                )
            view = raw[start:end].reshape(rows, row_bytes)
            if qtype == gguf.GGMLQuantizationType.F32:
                view = view.view(np.float32)
            elif qtype == gguf.GGMLQuantizationType.F16:
                view = view.view(np.float16)
            self.tensors[name] = QuantTensor(name, qtype, shape, view, f"{self.identity}@{start}")

    def _identity(self, header: memoryview) -> str:
        """Size, modification time and a hash of the header: changes whenever the file does.

        Why not hash the tensor bytes: that reads the whole file at every start; a
        rewritten file changes its mtime, and the header hash covers names and offsets.
        """
        st = self.path.stat()
        digest = hashlib.sha1(header).hexdigest()[:16]
        return f"{st.st_size}-{st.st_mtime_ns}-{digest}"

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(f"{self.path}: no general.architecture in metadata")
        return arch

    def tensor(self, name: str) -> QuantTensor:
        """The named tensor, or a clear error naming it and the file."""
        try:
            t = self.tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.path}: missing tensor {name!r}") from None
        if t.qtype not in SUPPORTED_QTYPES:
            raise ModelFileError(
                f"{self.path}: tensor {name} uses quant type {t.qtype.name}, which echoline "
                f"does not support (supported: {', '.join(sorted(q.name for q in SUPPORTED_QTYPES))})"
            )
        return t

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)
