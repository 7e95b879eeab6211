"""GGUF loading: synthetic files of every architecture and quant type, and bad input."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.errors import (
    EcholineError,
    ModelFileError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
)
from echoline.engine.gguf_file import GGUFFile
from echoline.engine.model_catalog import resolve_model
from echoline.engine.models.loader import config_from_gguf, load_model

from tests.synth import GGUF_QUANTIZABLE, IQ_QUANTS, K_QUANTS, Q, write_model

ARCHS = ("llama", "qwen2", "gemma3")
QTYPES = GGUF_QUANTIZABLE + K_QUANTS + IQ_QUANTS


def _dims(qtype) -> dict:
    # K-quants need rows that are multiples of 256.
    if qtype in K_QUANTS or qtype == Q.IQ4_XS:
        return dict(d_model=256, n_ff=512, n_heads=4, n_kv_heads=2)
    return {}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_synthetic_forward_matches_float64(tmp_path, arch, qtype):
    """float32 forward vs the same math in float64, on a tiny random model."""
    path = write_model(tmp_path / "m.gguf", arch, qtype=qtype, **_dims(qtype))
    gf = GGUFFile(path)
    assert config_from_gguf(gf).arch == arch
    _, m32 = load_model(path, NumpyBackend())
    _, m64 = load_model(path, NumpyBackend(np.float64))
    ids = [1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12]  # longer than the synthetic sliding window
    l32 = m32.forward(ids, m32.new_cache())
    l64 = m64.forward(ids, m64.new_cache())
    assert l32.dtype == np.float32 and l64.dtype == np.float64
    assert np.isfinite(l32).all()
    np.testing.assert_allclose(l32, l64, rtol=2e-4, atol=2e-4 * np.abs(l64).max())


@pytest.mark.parametrize("qtype", IQ_QUANTS, ids=lambda q: q.name)
def test_iq4_model_on_the_cpu_backend(tmp_path, qtype):
    """IQ4_NL / IQ4_XS files run on the CPU kernels (their levels as int8 values, the block
    scales exact): with float32 activations close to the numpy reference (gguf's own
    dequantization), and in every activation mode rows one at a time == all at once."""
    from echoline.engine.backends.cpu_backend import CpuBackend
    from echoline.kernels.cpu.q8act import q8_available

    path = write_model(tmp_path / "m.gguf", "qwen2", qtype=qtype, **_dims(Q.IQ4_XS))
    assert GGUFFile(path).tensor("blk.0.ffn_down.weight").qtype == qtype
    _, ref = load_model(path, NumpyBackend())
    ids = [1, 5, 9, 2, 7, 3, 11, 4, 6, 8, 10, 12]
    want = ref.forward(ids, ref.new_cache())
    for mode in ("f32", "q8") if q8_available() else ("f32",):
        _, cpu = load_model(path, CpuBackend(activations=mode))
        whole = cpu.backend.to_host(cpu.forward(ids, cpu.new_cache()))
        if mode == "f32":
            np.testing.assert_allclose(whole, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
        cache = cpu.new_cache()
        parts = [cpu.backend.to_host(cpu.forward(ids[s:e], cache)) for s, e in ((0, 1), (1, 5), (5, 6), (6, 12))]
        assert np.array_equal(np.concatenate(parts), whole), mode


def test_tensor_views_are_memory_mapped(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama", qtype=Q.Q4_0)
    gf = GGUFFile(path)
    t = gf.tensor("blk.0.attn_q.weight")
    assert t.data.dtype == np.uint8 and not t.data.flags.owndata
    ref = gguf.quants.dequantize(np.asarray(t.data), Q.Q4_0)
    assert np.array_equal(t.dequantize(), ref.reshape(t.shape))


def test_gemma_sliding_window_matters(tmp_path):
    """Past the window, local layers must not see old keys: outputs differ from a window-free run."""
    path = write_model(tmp_path / "g.gguf", "gemma3", n_layers=2, sliding_window=4)
    _, model = load_model(path, NumpyBackend())
    ids = list(range(1, 13))
    windowed = model.forward(ids, model.new_cache())
    object.__setattr__(model.config, "sliding_window", 0)
    try:
        unwindowed = model.forward(ids, model.new_cache())
    finally:
        object.__setattr__(model.config, "sliding_window", 4)
    assert np.array_equal(windowed[:4], unwindowed[:4])  # inside the window: identical
    assert not np.allclose(windowed[-1], unwindowed[-1])


def test_truncated_file(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:40])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(header_only)


def test_wrong_magic_and_empty(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFile(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        GGUFFile(empty)


def test_unknown_architecture(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama")
    data = bytearray(path.read_bytes())
    i = data.find(b"llama")
    data[i : i + 5] = b"mamba"  # general.architecture value, same length
    other = tmp_path / "mamba.gguf"
    other.write_bytes(bytes(data))
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        load_model(other, NumpyBackend())


def test_unsupported_quant_type(tmp_path):
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x.weight", np.zeros((4, 84), dtype=np.uint8), raw_dtype=Q.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="Q2_K"):
        GGUFFile(path).tensor("x.weight")


def test_missing_tensor_is_named(tmp_path):
    path = write_model(tmp_path / "m.gguf", "qwen2")
    gf = GGUFFile(path)
    with pytest.raises(ModelFileError, match="blk.9.attn_q.weight"):
        gf.tensor("blk.9.attn_q.weight")


def test_missing_model_name():
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        resolve_model("no-such-model")
    assert issubclass(ModelNotFoundError, EcholineError)


def test_missing_file():
    with pytest.raises(ModelFileError, match="not found"):
        GGUFFile(Path("/nonexistent/model.gguf"))
