"""Hostile GGUF files: every one must end in a clear ``EcholineError``, never a crash.

The unit tests each break one thing in a small valid synthetic model (``tests.synth``),
by patching header bytes located with ``header_fields`` or by rewriting the file with
gguf's own writer, and check that the message names the problem.

The fuzz tests mutate headers and load the result with ``load_model`` (numpy backend),
then run one token through any model that did load. Each case applies 1 to 4 mutations
(one, most often): an integer written over a header field (a wild value, or the old one
nudged a little, which keeps the file parseable and so reaches the checks on meaning),
a uint32/uint64 written at a random offset in the header, a bit flip, or a cut.

How many cases: ``test_fuzz_synthetic_headers`` tries 150 spread over three synthetic
models (llama; qwen2 with a tokenizer; gemma3), ``test_fuzz_real_header`` 150 more on the
first 256 KiB of SmolLM2-135M-Instruct.Q4_1.gguf (its header, cut off inside the
vocabulary) when that file is in ~/.cache/echoline/models, and is skipped otherwise:
300 cases per run, about 0.5 s of the file's ~2 s on two cores (most cases are refused
within a millisecond). ``ECHOLINE_FUZZ_EXAMPLES=5000`` runs 10,000 (about 16 s). Against
the parser before these checks, the synthetic fuzz fails within a run (shape mismatches
reaching numpy, divisions by zero, a 128 GiB KV-cache allocation).

A case fails on any exception that is not an ``EcholineError`` and on any load that
takes longer than ``LOAD_SECONDS``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.errors import EcholineError, ModelFileError
from echoline.engine.gguf_file import GGUFFile
from echoline.engine.models.loader import load_model, open_model_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.synth import Q, write_fim_qwen2_model, write_model

VT = gguf.GGUFValueType
REAL_MODEL = Path.home() / ".cache" / "echoline" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_HEADER_BYTES = 256 * 1024
LOAD_SECONDS = 5.0
_SCALAR_SIZES = {
    VT.UINT8: 1,
    VT.INT8: 1,
    VT.BOOL: 1,
    VT.UINT16: 2,
    VT.INT16: 2,
    VT.UINT32: 4,
    VT.INT32: 4,
    VT.FLOAT32: 4,
    VT.UINT64: 8,
    VT.INT64: 8,
    VT.FLOAT64: 8,
}


# ---- locating header fields ------------------------------------------------------------------


class _End(Exception):
    """The header walk ran off the end of the bytes (a truncated header is expected)."""


def header_fields(data: bytes) -> dict[str, tuple[int, int]]:
    """Label → (offset, width) of every integer field of a GGUF header, as far as ``data``
    goes. Labels: ``n_tensors``, ``kv:<key>:key_len|type|value|strlen|item_type|count``,
    ``tensor:<name>:name_len|n_dims|ne0..|type|offset``. Written independently of
    ``engine.gguf_file`` so the tests do not trust the code they test."""
    fields: dict[str, tuple[int, int]] = {"version": (4, 4), "n_tensors": (8, 8), "n_kv": (16, 8)}
    pos = 24

    def take(fmt: str) -> int:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise _End
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += size
        return value

    def string(label: str) -> str:
        nonlocal pos
        fields[label] = (pos, 8)
        n = take("<Q")
        if pos + n > len(data):
            raise _End
        pos += n
        return data[pos - n : pos].decode("utf-8", "replace")

    def value(label: str, vtype: int) -> None:
        nonlocal pos
        if vtype == VT.STRING:
            string(f"{label}:strlen")
        elif vtype == VT.ARRAY:
            fields[f"{label}:item_type"] = (pos, 4)
            item = take("<I")
            fields[f"{label}:count"] = (pos, 8)
            n = take("<Q")
            if item in _SCALAR_SIZES:
                pos += n * _SCALAR_SIZES[item]
            else:
                for i in range(n):
                    value(f"{label}[{i}]" if i < 4 else f"{label}[n]", item)
        else:
            fields[f"{label}:value"] = (pos, _SCALAR_SIZES[vtype])
            pos += _SCALAR_SIZES[vtype]

    try:
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        for _ in range(n_kv):
            key_at = pos
            key = string("tmp")
            del fields["tmp"]
            fields[f"kv:{key}:key_len"] = (key_at, 8)
            fields[f"kv:{key}:type"] = (pos, 4)
            value(f"kv:{key}", take("<I"))
        for _ in range(n_tensors):
            name_at = pos
            name = string("tmp")
            del fields["tmp"]
            p = f"tensor:{name}:"
            fields[p + "name_len"] = (name_at, 8)
            fields[p + "n_dims"] = (pos, 4)
            for i in range(take("<I")):
                fields[f"{p}ne{i}"] = (pos, 8)
                take("<Q")
            fields[p + "type"] = (pos, 4)
            take("<I")
            fields[p + "offset"] = (pos, 8)
            take("<Q")
    except (_End, struct.error, KeyError):
        pass
    return fields


def patched(data: bytes, at: tuple[int, int], value: int) -> bytes:
    """``data`` with the little-endian integer field ``at`` = (offset, width) set to ``value``."""
    offset, width = at
    out = bytearray(data)
    out[offset : offset + width] = value.to_bytes(width, "little")
    return bytes(out)


def read_field(data: bytes, at: tuple[int, int]) -> int:
    offset, width = at
    return int.from_bytes(data[offset : offset + width], "little")


# ---- writing variants of a synthetic model ---------------------------------------------------


def rewrite(
    src: Path,
    dst: Path,
    meta: dict[str, tuple[Any, VT]] | None = None,
    tensors: dict[str, tuple[np.ndarray, Q | None]] | None = None,
    alignment: int | None = None,
) -> Path:
    """Copy a synthetic GGUF through gguf's writer with some keys or tensors replaced
    (or added): the file stays well-formed, only what it says is wrong."""
    meta, tensors = meta or {}, tensors or {}
    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        if name in meta:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == VT.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, (value, vtype) in meta.items():
        w.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if t.name in tensors:
            continue
        data = np.asarray(t.data)
        if t.tensor_type in (Q.F32, Q.F16):
            w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    for name, (data, raw) in tensors.items():
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del reader
    return dst


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid 2-layer llama (d_model 64, Q8_0, tied output)."""
    return write_model(tmp_path_factory.mktemp("llama") / "llama.gguf", "llama")


@pytest.fixture(scope="module")
def fim_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid qwen2 with a byte-level BPE tokenizer in its metadata."""
    return write_fim_qwen2_model(tmp_path_factory.mktemp("qwen2") / "qwen2.gguf")


def _bad(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _expect(path: Path, pattern: str) -> ModelFileError:
    with pytest.raises(ModelFileError, match=pattern) as info:
        open_model_file(path)
    return info.value


# ---- not a GGUF file at all ------------------------------------------------------------------


def test_zero_length_file(tmp_path: Path) -> None:
    _expect(_bad(tmp_path, b""), "empty file")


def test_wrong_magic(tmp_path: Path) -> None:
    _expect(_bad(tmp_path, b"\x7fELF" + bytes(60)), "not a GGUF file")
    _expect(_bad(tmp_path, b"GG"), "not a GGUF file")


def test_directory_path(tmp_path: Path) -> None:
    _expect(tmp_path, "is a directory")


def test_fifo_path_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    _expect(fifo, "not a regular file")


@pytest.mark.parametrize("version", [0, 1, 4, 2**32 - 1])
def test_unknown_version(tmp_path: Path, llama: Path, version: int) -> None:
    data = patched(llama.read_bytes(), (4, 4), version)
    _expect(_bad(tmp_path, data), f"unsupported GGUF version {version}")


def test_big_endian_version(tmp_path: Path, llama: Path) -> None:
    data = patched(llama.read_bytes(), (4, 4), 3 << 24)
    _expect(_bad(tmp_path, data), "big-endian")


@pytest.mark.parametrize("keep", [4, 8, 20, 24, 30, 100, 1000])
def test_truncated_header(tmp_path: Path, llama: Path, keep: int) -> None:
    _expect(_bad(tmp_path, llama.read_bytes()[:keep]), "truncated")


def test_truncated_tensor_data(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    _expect(_bad(tmp_path, data[:-1]), r"truncated or corrupt file: tensor .* ends at byte")


# ---- counts and lengths bounded by the bytes left --------------------------------------------


@pytest.mark.parametrize(
    ("label", "value", "pattern"),
    [
        ("n_kv", 2**63, "metadata keys"),
        ("n_tensors", 2**40, "tensors"),
        ("n_kv", 10000, "need at least"),
        ("n_tensors", 3000, "need at least"),
    ],
)
def test_absurd_counts(tmp_path: Path, llama: Path, label: str, value: int, pattern: str) -> None:
    data = llama.read_bytes()
    _expect(_bad(tmp_path, patched(data, header_fields(data)[label], value)), pattern)


@pytest.mark.parametrize("length", [2**64 - 1, 2**62, 10**7])
def test_absurd_string_length(tmp_path: Path, llama: Path, length: int) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["kv:general.architecture:strlen"]
    _expect(_bad(tmp_path, patched(data, at, length)), "truncated or corrupt GGUF header")


def test_absurd_key_length(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["kv:general.architecture:key_len"]
    _expect(_bad(tmp_path, patched(data, at, 70000)), "metadata key .* claims 70000 bytes")


def test_absurd_tensor_name_length(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:token_embd.weight:name_len"]
    _expect(_bad(tmp_path, patched(data, at, 1000)), "tensor name .* claims 1000 bytes")


@pytest.mark.parametrize(
    ("key", "count"), [("tokenizer.ggml.tokens", 2**40), ("tokenizer.ggml.token_type", 2**61)]
)
def test_absurd_array_length(tmp_path: Path, fim_qwen2: Path, key: str, count: int) -> None:
    data = fim_qwen2.read_bytes()
    at = header_fields(data)[f"kv:{key}:count"]
    _expect(_bad(tmp_path, patched(data, at, count)), f"claims {count} items")


def test_array_longer_than_the_file(tmp_path: Path, fim_qwen2: Path) -> None:
    """Within the item cap but more string headers than bytes left: refused before the loop."""
    data = fim_qwen2.read_bytes()
    at = header_fields(data)["kv:tokenizer.ggml.tokens:count"]
    _expect(_bad(tmp_path, patched(data, at, len(data) // 8 + 1)), "only .* bytes are left")


def test_unknown_value_types(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["kv:general.architecture:type"]
    _expect(_bad(tmp_path, patched(data, at, 99)), "unknown GGUF value type 99")


def test_nested_arrays_too_deep(tmp_path: Path) -> None:
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("deep", [[[[1, 2]]]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _expect(path, "nested more than 2 deep")


def test_duplicate_key_and_tensor(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    # Renamed in place to another name of the same length: the layout stays intact.
    dup_key = data.replace(b"llama.context_length", b"general.architecture", 1)
    _expect(_bad(tmp_path, dup_key), "metadata key 'general.architecture' appears twice")
    dup_tensor = data.replace(b"blk.0.attn_v.weight", b"blk.0.attn_k.weight", 1)
    _expect(_bad(tmp_path, dup_tensor), "tensor 'blk.0.attn_k.weight' appears twice")


# ---- tensor infos ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_dimension_count(tmp_path: Path, llama: Path, n_dims: int) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:token_embd.weight:n_dims"]
    _expect(_bad(tmp_path, patched(data, at, n_dims)), f"has {n_dims} dimensions")


def test_zero_dimension(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.0.attn_q.weight:ne1"]
    _expect(_bad(tmp_path, patched(data, at, 0)), "zero-length dimension")


def test_unknown_tensor_type(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.0.attn_q.weight:type"]
    _expect(_bad(tmp_path, patched(data, at, 1000)), "unknown type id 1000")


def test_row_not_a_whole_number_of_blocks(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.0.attn_q.weight:ne0"]
    _expect(_bad(tmp_path, patched(data, at, 48)), "row of 48 is not a multiple of Q8_0's block")


def test_element_count_that_wraps_int64(tmp_path: Path, llama: Path) -> None:
    """ne = [32, 2**32, 2**32]: np.prod of the rows wraps to 0 in int64, a 0-byte tensor that
    slipped past the end-of-file check; Python ints see 2**69 elements."""
    extra = rewrite(
        llama,
        tmp_path / "extra.gguf",
        tensors={"extra.weight": (np.zeros((2, 2, 32), np.float32), None)},
    )
    data = extra.read_bytes()
    fields = header_fields(data)
    data = patched(data, fields["tensor:extra.weight:ne1"], 2**32)
    data = patched(data, fields["tensor:extra.weight:ne2"], 2**32)
    _expect(_bad(tmp_path, data), "overflow ggml's 64-bit element count")


def test_huge_dims_that_do_not_wrap(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.0.attn_q.weight:ne1"]
    _expect(_bad(tmp_path, patched(data, at, 2**50)), "blk.0.attn_q.weight .* ends at byte")


def test_offset_past_the_end(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.1.ffn_down.weight:offset"]
    _expect(_bad(tmp_path, patched(data, at, 2**64 - 32)), "blk.1.ffn_down.weight .* ends at byte")


def test_misaligned_offset(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    at = header_fields(data)["tensor:blk.0.attn_q.weight:offset"]
    bad = patched(data, at, read_field(data, at) + 4)
    _expect(_bad(tmp_path, bad), "offset .* is not a multiple of the file's alignment 32")


def test_overlapping_tensors(tmp_path: Path, llama: Path) -> None:
    data = llama.read_bytes()
    fields = header_fields(data)
    src = read_field(data, fields["tensor:blk.0.attn_k.weight:offset"])
    bad = patched(data, fields["tensor:blk.0.attn_v.weight:offset"], src)
    _expect(_bad(tmp_path, bad), "blk.0.attn_k.weight and blk.0.attn_v.weight overlap")


@pytest.mark.parametrize("alignment", [0, 48, 2**32 - 1])
def test_bad_alignment(tmp_path: Path, llama: Path, alignment: int) -> None:
    aligned = rewrite(llama, tmp_path / "aligned.gguf", alignment=64)
    assert GGUFFile(aligned).tensors  # valid as written
    data = aligned.read_bytes()
    at = header_fields(data)["kv:general.alignment:value"]
    _expect(
        _bad(tmp_path, patched(data, at, alignment)), "general.alignment must be a power of two"
    )


# ---- metadata kinds and hyper-parameters -----------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "vtype", "pattern"),
    [
        ("llama.block_count", 10**6, VT.UINT32, r"block_count = 1000000 is out of range"),
        ("llama.block_count", 0, VT.UINT32, r"block_count = 0 is out of range"),
        ("llama.block_count", "2", VT.STRING, "block_count must be an integer, got a str"),
        ("llama.block_count", 2.0, VT.FLOAT32, "block_count must be an integer"),
        ("llama.embedding_length", 2**20, VT.UINT32, "embedding_length = 1048576 is out of range"),
        ("llama.attention.head_count", 0, VT.UINT32, "head_count = 0 is out of range"),
        ("llama.attention.head_count", 6, VT.UINT32, "64 is not divisible by .*head_count = 6"),
        ("llama.attention.head_count_kv", 3, VT.UINT32, "head_count_kv = 3 does not divide"),
        ("llama.attention.head_count_kv", 2**40, VT.UINT64, "head_count_kv .* out of range"),
        ("llama.context_length", 2**40, VT.UINT64, "context_length = 1099511627776 is out of"),
        ("llama.context_length", -1, VT.INT32, "context_length = -1 is out of range"),
        ("llama.vocab_size", 2**31, VT.UINT32, "vocab_size = 2147483648 is out of range"),
        ("llama.feed_forward_length", 2**31, VT.UINT32, "feed_forward_length .* out of range"),
        ("llama.attention.value_length", 8, VT.UINT32, "value_length = 8 differs"),
        ("llama.rope.freq_base", float("nan"), VT.FLOAT32, "freq_base = nan is out of range"),
        ("llama.rope.freq_base", -1.0, VT.FLOAT32, "freq_base = -1.0 is out of range"),
        ("llama.attention.layer_norm_rms_epsilon", float("inf"), VT.FLOAT64, "epsilon = inf"),
        ("general.architecture", 7, VT.UINT32, "general.architecture must be a string"),
        ("tokenizer.ggml.bos_token_id", 1.5, VT.FLOAT32, "bos_token_id must be an integer"),
        ("tokenizer.ggml.add_bos_token", "yes", VT.STRING, "add_bos_token must be a bool"),
    ],
)
def test_bad_metadata_value(
    tmp_path: Path, llama: Path, key: str, value: Any, vtype: VT, pattern: str
) -> None:
    bad = rewrite(llama, tmp_path / "bad.gguf", meta={key: (value, vtype)})
    _expect(bad, pattern)


def test_tokenizer_arrays_must_agree(tmp_path: Path, fim_qwen2: Path) -> None:
    bad = rewrite(
        fim_qwen2, tmp_path / "bad.gguf", meta={"tokenizer.ggml.token_type": ([1, 1], VT.ARRAY)}
    )
    _expect(bad, "token_type has 2 entries for 271 tokens")
    ints = rewrite(
        fim_qwen2, tmp_path / "ints.gguf", meta={"tokenizer.ggml.tokens": ([1, 2], VT.ARRAY)}
    )
    _expect(ints, "tokenizer.ggml.tokens must be an array of strings")


def test_more_tokens_than_embedding_rows(tmp_path: Path, llama: Path) -> None:
    tokens = [f"t{i}" for i in range(97)]  # the synthetic llama has 96 rows
    bad = rewrite(llama, tmp_path / "bad.gguf", meta={"tokenizer.ggml.tokens": (tokens, VT.ARRAY)})
    _expect(bad, "the tokenizer has 97 tokens but the model only 96 embedding rows")


# ---- tensor shapes against the config --------------------------------------------------------


def test_shape_disagrees_with_feed_forward_length(tmp_path: Path, llama: Path) -> None:
    bad = rewrite(llama, tmp_path / "bad.gguf", meta={"llama.feed_forward_length": (64, VT.UINT32)})
    err = _expect(bad, r"tensor blk\.0\.ffn_gate\.weight has shape \(128, 64\)")
    assert "implies (64, 64)" in str(err)


def test_shape_disagrees_with_kv_heads(tmp_path: Path, llama: Path) -> None:
    bad = rewrite(
        llama, tmp_path / "bad.gguf", meta={"llama.attention.head_count_kv": (4, VT.UINT32)}
    )
    _expect(
        bad, r"blk\.0\.attn_k\.weight has shape \(32, 64\), but the metadata implies \(64, 64\)"
    )


def test_shape_disagrees_with_vocab_size(tmp_path: Path, llama: Path) -> None:
    bad = rewrite(llama, tmp_path / "bad.gguf", meta={"llama.vocab_size": (100, VT.UINT32)})
    _expect(bad, r"token_embd\.weight has shape \(96, 64\), but the metadata implies \(100, 64\)")


def test_shape_disagrees_for_a_bias(tmp_path: Path, fim_qwen2: Path) -> None:
    short = np.zeros(8, np.float32)
    bad = rewrite(fim_qwen2, tmp_path / "bad.gguf", tensors={"blk.1.attn_q.bias": (short, None)})
    _expect(bad, r"blk\.1\.attn_q\.bias has shape \(8,\), but the metadata implies \(64,\)")


def test_block_count_beyond_the_layers(tmp_path: Path, llama: Path) -> None:
    bad = rewrite(llama, tmp_path / "bad.gguf", meta={"llama.block_count": (3, VT.UINT32)})
    _expect(bad, r"missing tensor 'blk\.2\.attn_norm\.weight' \(the metadata gives 3 layers\)")


def test_unsupported_quant_type_of_an_expected_tensor(tmp_path: Path) -> None:
    base = write_model(tmp_path / "k.gguf", "llama", qtype=Q.Q4_K, d_model=256, n_ff=512)
    q2k = np.zeros((512, 256 // 256 * 84), dtype=np.uint8)
    bad = rewrite(base, tmp_path / "bad.gguf", tensors={"blk.0.ffn_up.weight": (q2k, Q.Q2_K)})
    _expect(bad, "tensor blk.0.ffn_up.weight uses quant type Q2_K")


def test_valid_variants_still_open(tmp_path: Path, llama: Path, fim_qwen2: Path) -> None:
    """What the checks must not reject: a rewritten copy, an explicit alignment, a
    vocabulary-only file (no hyper-parameters: left to the loader to report)."""
    for path in (llama, fim_qwen2, rewrite(llama, tmp_path / "a.gguf", alignment=128)):
        _, model = load_model(path, NumpyBackend())
        assert model.forward([1, 2], model.new_cache()).shape[0] == 2
    vocab_only = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(vocab_only), "llama")
    w.add_token_list(["a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFFile(vocab_only).metadata["tokenizer.ggml.tokens"] == ["a", "b"]
    with pytest.raises(ModelFileError, match="missing metadata key 'llama.block_count'"):
        load_model(vocab_only, NumpyBackend())


# ---- fuzzing ---------------------------------------------------------------------------------


class LoadTimeout(Exception):
    """A load ran past LOAD_SECONDS: a hang, as far as the fuzz is concerned."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """SIGALRM turns a runaway Python loop into an exception (pytest runs on the main thread)."""

    def fire(signum: int, frame: Any) -> None:
        raise LoadTimeout(f"load took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_names = count()


def _load_or_refuse(directory: Path, data: bytes) -> None:
    """Load ``data`` as a model: it must load (and then run a token) or raise EcholineError.

    A fresh name per case: an earlier case's map may still be alive, and rewriting a
    mapped file in place would change (or, shorter, SIGBUS) what it maps.
    """
    path = directory / f"case{next(_names)}.gguf"
    path.write_bytes(data)
    try:
        with _deadline(LOAD_SECONDS):
            try:
                # Any bytes are valid quantized data, so NaN scales (warnings) are fair.
                with np.errstate(all="ignore"):
                    _, model = load_model(path, NumpyBackend())
                    logits = model.forward([0], model.new_cache(capacity=4))
                assert logits.shape == (1, model.config.vocab_size)
            except EcholineError:  # ModelFileError, UnsupportedArchitectureError, TokenizerError
                pass
    finally:
        path.unlink()


_INTERESTING = [0, 1, 2, 3, 4, 7, 8, 31, 32, 64, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1]
_INTERESTING += [2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 1]


@dataclass(frozen=True)
class FuzzBase:
    """A file to mutate: its bytes, how many of them are header, its integer fields."""

    name: str
    data: bytes
    header_len: int
    #: Every integer field of the header, and the subset that holds values (metadata
    #: scalars, tensor dimensions, types and offsets) rather than lengths and counts:
    #: changing those keeps the file parseable and so reaches the checks on meaning.
    fields: tuple[tuple[int, int], ...]
    kv_values: tuple[tuple[int, int], ...]
    tensor_values: tuple[tuple[int, int], ...]

    def __repr__(self) -> str:  # hypothesis prints arguments: not 100 kB of bytes
        return f"FuzzBase({self.name})"


def fuzz_base(name: str, path: Path, limit: int | None = None) -> FuzzBase:
    """The first ``limit`` bytes of ``path`` (all of it by default); the header is what
    precedes the first tensor's data when the file opens, else its first 64 KiB."""
    with open(path, "rb") as fh:
        data = fh.read() if limit is None else fh.read(limit)
    header_len = min(len(data), 64 * 1024)
    if limit is None:
        gf = GGUFFile(path)
        header_len = min(int(t.origin.split("@")[1]) for t in gf.tensors.values())
        del gf
    labelled = {k: f for k, f in header_fields(data).items() if f[0] + f[1] <= header_len}
    kv_values = tuple(f for k, f in labelled.items() if k.endswith(":value"))
    tensor_values = tuple(
        f
        for k, f in labelled.items()
        if k.startswith("tensor:") and k.rsplit(":", 1)[1] in ("type", "offset", "ne0", "ne1")
    )
    return FuzzBase(name, data, header_len, tuple(labelled.values()), kv_values, tensor_values)


_OPS = ("field",) * 4 + ("value",) * 4 + ("nudge",) * 6 + ("int",) * 2 + ("flip",) * 2
_OPS += ("truncate",) * 2


@st.composite
def mutated(draw: st.DrawFn, base: FuzzBase) -> bytes:
    """``base`` with 1-4 mutations inside its header: an integer written over a header
    field (a wild value, or the old one nudged by a little), an integer written at a
    random offset, a byte flip, or a cut (in the header or anywhere).

    Offsets and values come from a hypothesis-seeded ``Random``: hypothesis' own integers
    lean towards 0, which would spend most cases re-breaking the magic.
    """
    rnd = draw(st.randoms(use_true_random=False))
    data = bytearray(base.data)
    for _ in range(rnd.choice((1, 1, 2, 3, 4))):
        header_len = min(base.header_len, len(data))
        if header_len == 0:
            break
        op = rnd.choice(_OPS)
        if op == "flip":
            data[rnd.randrange(header_len)] ^= 1 << rnd.randrange(8)
            continue
        if op == "truncate":
            del data[rnd.randrange(header_len if rnd.random() < 0.5 else len(data)) :]
            continue
        if op == "int":
            at, width = rnd.randrange(header_len), rnd.choice((4, 8))
        elif op == "field":
            at, width = rnd.choice(base.fields)
        else:
            pool = rnd.choice((base.kv_values, base.tensor_values))
            at, width = rnd.choice(pool or base.fields)
        old = int.from_bytes(data[at : at + width], "little")
        if op == "nudge":
            value = old + rnd.choice((-1, 1)) * rnd.choice((1, 2, 4, 16, 64, old or 1))
        else:
            value = rnd.choice((rnd.choice(_INTERESTING), rnd.getrandbits(64), rnd.randrange(4096)))
        chunk = (value % (1 << (8 * width))).to_bytes(width, "little")
        chunk = chunk[: max(0, len(data) - at)]
        data[at : at + len(chunk)] = chunk
    return bytes(data)


@pytest.fixture(scope="module")
def fuzz_bases(
    tmp_path_factory: pytest.TempPathFactory, llama: Path, fim_qwen2: Path
) -> list[FuzzBase]:
    gemma = write_model(tmp_path_factory.mktemp("gemma3") / "g.gguf", "gemma3", qtype=Q.Q4_0)
    return [
        fuzz_base("llama", llama),
        fuzz_base("qwen2+tokenizer", fim_qwen2),
        fuzz_base("gemma3", gemma),
    ]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


#: Cases per fuzz test; ECHOLINE_FUZZ_EXAMPLES=5000 for a longer hunt.
FUZZ_EXAMPLES = int(os.environ.get("ECHOLINE_FUZZ_EXAMPLES", "150"))
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ_SETTINGS
@given(st.data())
def test_fuzz_synthetic_headers(
    fuzz_bases: list[FuzzBase], fuzz_dir: Path, data: st.DataObject
) -> None:
    base = data.draw(st.sampled_from(fuzz_bases), label="base")
    _load_or_refuse(fuzz_dir, data.draw(mutated(base), label="file"))


@pytest.fixture(scope="module")
def real_base() -> FuzzBase:
    if not REAL_MODEL.is_file():
        pytest.skip(f"{REAL_MODEL} is not downloaded")
    return fuzz_base(REAL_MODEL.name, REAL_MODEL, REAL_HEADER_BYTES)


@FUZZ_SETTINGS
@given(st.data())
def test_fuzz_real_header(real_base: FuzzBase, fuzz_dir: Path, data: st.DataObject) -> None:
    _load_or_refuse(fuzz_dir, data.draw(mutated(real_base), label="file"))
