"""Open a GGUF file: metadata as a dict, tensors as memory-mapped quantized views.

Why not ``gguf.GGUFReader`` directly: it builds a numpy view per array element,
which takes ~8 s on Gemma 3's 262k-entry vocabulary. The format itself is a
short header, so this module walks it with ``struct`` and ``numpy.frombuffer``
(0.1 s), while taking every constant (value types, quant types, block sizes)
from the ``gguf`` package so the layouts stay the upstream ones.

Why so many checks: a model file is input from the internet, and the compute
kernels index weights without bounds checks. So every length, count, dimension
and offset in the header is checked, in Python's arbitrary-precision integers,
against the bytes actually left in the file *before* anything is allocated or
mapped. A hostile or damaged file therefore ends in a ``ModelFileError`` that
names the problem, never in an over-read, a huge allocation, a hang or a stray
``ValueError``.

This module knows the file format only, not the architectures: that every tensor
the forward pass reads has exactly the shape its metadata implies is checked by
``engine.models.loader.open_model_file``, which the model loader goes through.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from echoline.engine.errors import ModelFileError
from echoline.kernels import quant_types

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

#: Quant types the engine can compute with (every backend's kernels and the numpy
#: reference): the entries of ``kernels.quant_types``.
SUPPORTED_QTYPES = quant_types.SUPPORTED_QTYPES

# ---- limits on what a header may claim ------------------------------------------------------
# Each is far above any real model (largest seen: 262k-token vocabularies, ~500k merges,
# a few thousand tensors, a few dozen keys) and low enough that what a hostile header can
# make us allocate stays a small multiple of the file's own size.

#: Magic, version, tensor count, key-value count.
_PREAMBLE_BYTES = 24
#: The smallest key-value pair: empty key (8-byte length), value type (4), a 1-byte value.
_MIN_KV_BYTES = 8 + 4 + 1
#: The smallest tensor info: empty name (8), n_dims (4), one dimension (8), type (4), offset (8).
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
MAX_KV_COUNT = 1 << 16
MAX_TENSOR_COUNT = 1 << 16
MAX_KEY_BYTES = 65535  # the GGUF spec's limit on key length
MAX_TENSOR_NAME_BYTES = 64  # ggml's GGML_MAX_NAME
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_LEN = 1 << 22
#: An array may hold arrays, those may not hold arrays again (nothing real nests at all).
MAX_ARRAY_DEPTH = 2
#: ggml counts elements in int64.
MAX_TENSOR_ELEMENTS = (1 << 63) - 1

_STR, _INT, _FLAG, _STR_LIST, _INT_ARRAY, _NUM_ARRAY = (
    "a string",
    "an integer",
    "a bool or integer",
    "an array of strings",
    "an array of integers",
    "an array of numbers",
)
#: Value kinds of the keys the engine and the tokenizer read outside ``{arch}.*``: a key
#: present with another kind would surface as a TypeError deep inside them.
KEY_KINDS: dict[str, str] = {
    "general.architecture": _STR,
    "general.alignment": _INT,
    "tokenizer.ggml.model": _STR,
    "tokenizer.ggml.pre": _STR,
    "tokenizer.ggml.tokens": _STR_LIST,
    "tokenizer.ggml.merges": _STR_LIST,
    "tokenizer.ggml.token_type": _INT_ARRAY,
    "tokenizer.ggml.scores": _NUM_ARRAY,
    "tokenizer.ggml.add_bos_token": _FLAG,
    "tokenizer.ggml.add_space_prefix": _FLAG,
    "tokenizer.chat_template": _STR,
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind_ok(value: Any, kind: str) -> bool:
    """Whether a parsed metadata value is of ``kind`` (arrays are homogeneous: one item tells)."""
    if kind == _STR:
        return isinstance(value, str)
    if kind == _INT:
        return is_int(value)
    if kind == _FLAG:
        return isinstance(value, int)
    if kind == _STR_LIST:
        return isinstance(value, list) and (not value or isinstance(value[0], str))
    if isinstance(value, np.ndarray):
        return value.dtype.kind in ("iu" if kind == _INT_ARRAY else "iuf")
    return False


def describe_value(value: Any) -> str:
    """A value's kind for messages (never the value itself: it may be a 262k-item list)."""
    if isinstance(value, np.ndarray):
        return f"an array of {len(value)} {value.dtype.name} values"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, bool):
        return f"the bool {value}"
    if isinstance(value, int | float):
        return f"the {type(value).__name__} {value!r}"
    return f"a {type(value).__name__}"


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
        # math.prod: Python ints, which cannot wrap around the way np.prod's int64 can.
        return math.prod(self.shape[:-1])

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


@dataclass(frozen=True)
class _TensorInfo:
    """One tensor-info record of the header, checked but not yet mapped."""

    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: gguf.GGMLQuantizationType
    offset: int  # from the start of the data section


class _Cursor:
    """Sequential little-endian reader over the mapped header.

    Every read is bounds-checked before it happens, and every length read from
    the file is compared with the bytes left before anything of that length is
    allocated, so a lying header costs at most what the file itself holds.
    """

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def need(self, n: int, what: str = "data") -> None:
        if self.pos + n > len(self.buf):
            raise ModelFileError(
                f"{self.path}: truncated or corrupt GGUF header: {what} at offset {self.pos} "
                f"needs {n} bytes, but the file has {len(self.buf)} (only {self.remaining} left)"
            )

    def scalar(self, fmt: str, what: str = "a value") -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self, what: str = "a string", limit: int | None = None) -> str:
        at = self.pos
        n = self.scalar("<Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise ModelFileError(
                f"{self.path}: corrupt GGUF header: {what} at offset {at} claims {n} bytes "
                f"(at most {limit} allowed)"
            )
        self.need(n, what)
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
                self.need(8, "the length of an array string")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, "an array string")
            append(str(buf[pos : pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out

    def _min_item_bytes(self, item_type: int) -> int:
        """Fewest bytes one array item of ``item_type`` can take (to bound counts up front)."""
        if item_type == _VT.STRING:
            return 8
        if item_type == _VT.ARRAY:
            return 4 + 8
        if item_type in _NUMPY_DTYPES:
            return np.dtype(_NUMPY_DTYPES[item_type]).itemsize
        raise ModelFileError(f"{self.path}: unknown GGUF array item type {item_type}")

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == _VT.STRING:
            return self.string()
        if vtype == _VT.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise ModelFileError(
                    f"{self.path}: corrupt GGUF header: metadata arrays nested more than "
                    f"{MAX_ARRAY_DEPTH} deep at offset {self.pos}"
                )
            item_type = self.scalar("<I", "an array item type")
            at = self.pos
            count = self.scalar("<Q", "an array length")
            item_bytes = self._min_item_bytes(item_type)
            if count > MAX_ARRAY_LEN or count * item_bytes > self.remaining:
                raise ModelFileError(
                    f"{self.path}: truncated or corrupt GGUF header: array at offset {at} "
                    f"claims {count} items of at least {item_bytes} bytes, but only "
                    f"{self.remaining} bytes are left (and at most {MAX_ARRAY_LEN} items allowed)"
                )
            if item_type == _VT.STRING:
                return self.strings(count)
            if item_type == _VT.ARRAY:
                return [self.value(_VT.ARRAY, depth + 1) for _ in range(count)]
            dtype = np.dtype(_NUMPY_DTYPES[item_type])
            nbytes = dtype.itemsize * count
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += nbytes
            return arr
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        raise ModelFileError(f"{self.path}: unknown GGUF value type {vtype}")


def _open_map(path: Path) -> mmap.mmap:
    """Map a regular, non-empty file read-only, or say plainly why not."""
    try:
        if path.is_dir():
            raise ModelFileError(f"{path}: is a directory, not a GGUF model file")
        if not path.exists():
            raise ModelFileError(f"model file not found: {path}")
        if not path.is_file():  # a FIFO or device: opening one may block, mapping fails
            raise ModelFileError(f"{path}: not a regular file, so not a GGUF model file")
        with open(path, "rb") as fh:
            try:
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # mmap refuses empty files
                raise ModelFileError(f"{path}: empty file, not a GGUF model") from exc
    except (OSError, ValueError) as exc:  # permissions, I/O errors, NUL bytes in the path
        raise ModelFileError(f"{path}: cannot read the model file ({exc})") from exc


class GGUFFile:
    """A parsed GGUF file: ``metadata`` (dict) and ``tensors`` (name → QuantTensor)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._mmap = _open_map(self.path)
        buf = memoryview(self._mmap)
        cur = _Cursor(buf, self.path)
        n_tensors, n_kv = self._read_preamble(cur)
        self.metadata: dict[str, Any] = self._read_metadata(cur, n_kv)
        infos = self._read_tensor_infos(cur, n_tensors)
        self._check_key_kinds()
        alignment = self._alignment()
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.identity = self._identity(buf[: cur.pos])
        self.tensors: dict[str, QuantTensor] = self._map_tensors(infos, data_start, alignment)

    # ---- the header ---------------------------------------------------------------------

    def _read_preamble(self, cur: _Cursor) -> tuple[int, int]:
        """Magic and version, then the two counts, bounded by what the file can hold."""
        if len(cur.buf) < 4:
            raise ModelFileError(
                f"{self.path}: not a GGUF file ({len(cur.buf)} bytes, too short for the magic)"
            )
        magic = cur.scalar("<I", "the magic")
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{self.path}: not a GGUF file (starts with {bytes(cur.buf[:4])!r}, "
                f"expected b'GGUF')"
            )
        self.version = cur.scalar("<I", "the version")
        if self.version not in (2, 3):
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            if swapped in (2, 3):
                raise ModelFileError(
                    f"{self.path}: big-endian GGUF (version {swapped}); echoline reads "
                    "little-endian files only"
                )
            raise ModelFileError(
                f"{self.path}: unsupported GGUF version {self.version} (echoline reads 2 and 3)"
            )
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        if n_kv > MAX_KV_COUNT or n_tensors > MAX_TENSOR_COUNT:
            raise ModelFileError(
                f"{self.path}: corrupt GGUF header: {n_tensors} tensors and {n_kv} metadata "
                f"keys (at most {MAX_TENSOR_COUNT} and {MAX_KV_COUNT} allowed)"
            )
        least = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if least > cur.remaining:
            raise ModelFileError(
                f"{self.path}: truncated or corrupt GGUF header: {n_tensors} tensors and "
                f"{n_kv} metadata keys need at least {least} bytes, only {cur.remaining} left"
            )
        return n_tensors, n_kv

    def _read_metadata(self, cur: _Cursor, n_kv: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            at = cur.pos
            key = cur.string("a metadata key", MAX_KEY_BYTES)
            if key in metadata:
                raise ModelFileError(
                    f"{self.path}: corrupt GGUF header: metadata key {key!r} appears twice "
                    f"(again at offset {at})"
                )
            vtype = cur.scalar("<I", f"the type of {key!r}")
            metadata[key] = cur.value(vtype)
        return metadata

    def _read_tensor_infos(self, cur: _Cursor, n_tensors: int) -> list[_TensorInfo]:
        infos: list[_TensorInfo] = []
        names: set[str] = set()
        for _ in range(n_tensors):
            at = cur.pos
            name = cur.string("a tensor name", MAX_TENSOR_NAME_BYTES)
            if name in names:
                raise ModelFileError(
                    f"{self.path}: corrupt GGUF header: tensor {name!r} appears twice "
                    f"(again at offset {at})"
                )
            names.add(name)
            n_dims = cur.scalar("<I", f"the dimension count of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} has {n_dims} dimensions "
                    f"(GGUF tensors have 1 to {MAX_DIMS})"
                )
            ne = tuple(cur.scalar("<Q", f"a dimension of tensor {name!r}") for _ in range(n_dims))
            if 0 in ne:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} has a zero-length dimension (ne={list(ne)})"
                )
            if math.prod(ne) > MAX_TENSOR_ELEMENTS:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} dimensions {list(ne)} overflow ggml's "
                    "64-bit element count"
                )
            ttype = cur.scalar("<I", f"the type of tensor {name!r}")
            try:
                qtype = gguf.GGMLQuantizationType(ttype)
            except ValueError:
                raise ModelFileError(
                    f"{self.path}: tensor {name} has unknown type id {ttype}"
                ) from None
            offset = cur.scalar("<Q", f"the data offset of tensor {name!r}")
            infos.append(_TensorInfo(name, ne, qtype, offset))
        return infos

    def _check_key_kinds(self) -> None:
        """Keys read outside ``{arch}.*`` have the kinds their readers expect, and the
        tokenizer's parallel arrays agree in length (an index past one's end would crash)."""
        for key, kind in KEY_KINDS.items():
            value = self.metadata.get(key)
            if value is not None and not _kind_ok(value, kind):
                raise ModelFileError(
                    f"{self.path}: metadata {key} must be {kind}, got {describe_value(value)}"
                )
        for key, value in self.metadata.items():
            if (
                key.startswith("tokenizer.ggml.")
                and key.endswith("_token_id")
                and not is_int(value)
            ):
                raise ModelFileError(
                    f"{self.path}: metadata {key} must be an integer, got {describe_value(value)}"
                )
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens is not None:
            for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
                arr = self.metadata.get(key)
                if arr is not None and len(arr) != len(tokens):
                    raise ModelFileError(
                        f"{self.path}: metadata {key} has {len(arr)} entries for {len(tokens)} tokens"
                    )

    def _alignment(self) -> int:
        """``general.alignment``: like llama.cpp, a power of two (zero would divide by zero)."""
        alignment = self.metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not is_int(alignment) or alignment < 1 or alignment & (alignment - 1):
            raise ModelFileError(
                f"{self.path}: general.alignment must be a power of two, got {describe_value(alignment)}"
            )
        return alignment

    def _map_tensors(
        self, infos: list[_TensorInfo], data_start: int, alignment: int
    ) -> dict[str, QuantTensor]:
        """Views of every tensor, each checked to lie aligned, whole and alone in the file."""
        size = len(self._mmap)
        raw = np.frombuffer(self._mmap, dtype=np.uint8)
        spans: list[tuple[int, int, str]] = []
        tensors: dict[str, QuantTensor] = {}
        for info in infos:
            name, qtype = info.name, info.qtype
            block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            cols = info.ne[0]
            if cols % block_elems:
                raise ModelFileError(
                    f"{self.path}: tensor {name} row of {cols} is not a multiple of "
                    f"{qtype.name}'s block of {block_elems}"
                )
            if info.offset % alignment:
                raise ModelFileError(
                    f"{self.path}: tensor {name} data offset {info.offset} is not a multiple "
                    f"of the file's alignment {alignment}"
                )
            # Python ints throughout: no product or sum here can wrap around.
            rows = math.prod(info.ne[1:])
            row_bytes = cols // block_elems * block_bytes
            start = data_start + info.offset
            end = start + rows * row_bytes
            if end > size:
                raise ModelFileError(
                    f"{self.path}: truncated or corrupt file: tensor {name} "
                    f"({qtype.name}, ne={list(info.ne)}) ends at byte {end}, file has {size} bytes"
                )
            spans.append((start, end, name))
            view = raw[start:end].reshape(rows, row_bytes)
            if qtype == gguf.GGMLQuantizationType.F32:
                view = view.view(np.float32)
            elif qtype == gguf.GGMLQuantizationType.F16:
                view = view.view(np.float16)
            shape = tuple(reversed(info.ne))
            tensors[name] = QuantTensor(name, qtype, shape, view, f"{self.identity}@{start}")
        spans.sort()
        for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:], strict=False):
            if start_b < end_a:
                raise ModelFileError(f"{self.path}: corrupt file: tensors {a} and {b} overlap")
        return tensors

    # ---- access -------------------------------------------------------------------------

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
            raise ModelFileError(unsupported_qtype_message(self.path, name, t.qtype))
        return t

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def release_pages(self) -> bool:
        """Drop the file's pages from this process's resident memory (they stay in the page
        cache, and a later read of a tensor faults its pages back in). False where the
        platform has no ``MADV_DONTNEED``.

        Why: a backend reads every tensor once while it lays the weights out (or copies
        them to a GPU), and each page read stays counted as the process's own until the
        mapping is dropped or trimmed; on a model's first start the 1.5B's server held
        2.9 GB resident where a cached start holds 1.8 GB. After loading, the laid-out
        copies are what run; the file's pages are only touched again for the few
        embedding rows a backend reads from it."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None:
            return False
        self._mmap.madvise(advice)
        return True


def unsupported_qtype_message(path: Path, name: str, qtype: gguf.GGMLQuantizationType) -> str:
    """The error for a tensor in a quant type no kernel computes, listing those that do."""
    supported = ", ".join(sorted(q.name for q in SUPPORTED_QTYPES))
    return (
        f"{path}: tensor {name} uses quant type {qtype.name}, which echoline "
        f"does not support (supported: {supported})"
    )
