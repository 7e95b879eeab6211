"""int8-activation VNNI products (kernels/cpu/q8act.py, issue #3 exploration).

Rows must be bit-identical whatever the batch, and the result must stay within a
derived bound of float64. Two references, u = 2^-24 (float32 unit roundoff):

* against x̂·Ŵ (x̂ = the dequantized int8 rows, Ŵ = the GGUF weights, float64): the
  integer part is exact, so only the float combine rounds. Per block the kernel
  rounds s·d (relative u), then one FMA per block term (absolute u·|t|), so
  |y − x̂·Ŵ| ≤ 4·nb·u·A with A = Σ_i |x̂_i|·(|s_b·q_i| + |m_b|) and nb blocks (the
  terms s·q and m are combined separately, hence A and not Σ|x̂||Ŵ|; factor 4 covers
  the two FMAs of offset blocks, the s·d and x̄d roundings and second-order terms).
* against x·Ŵ: add the activation quantization error, |x̂_i − x_i| ≤ d_b/2·(1 + 2u)
  (rint of x/d, itself rounded once), i.e. 0.5·(1 + 2^-20)·Σ_b d_b·Σ_{i∈b}|Ŵ_i|.
"""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from echoline.kernels.cpu.matmul import prepare
from echoline.kernels.cpu.q8act import (
    HIGH_LAYOUTS,
    QBLOCK,
    ROW_TILES,
    factor_scales,
    high_for,
    kernel_asm,
    matmul_q8,
    prepare_q8,
    q8_available,
    quantize_rows,
    scale_codec,
    storage_for,
    vnni_available,
)
from echoline.kernels.cpu.relayout import unpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_cpu_kernels import make_tensor

pytestmark = pytest.mark.skipif(not q8_available(), reason="needs AVX2 or AVX-512 VNNI")

Q = gguf.GGMLQuantizationType
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]
KQUANTS = {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS}  # 256-weight superblocks
U = 2.0**-24
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def dequantized_rows(x: np.ndarray) -> np.ndarray:
    xq, d = quantize_rows(x)
    return xq.astype(np.float64) * np.repeat(d.astype(np.float64), QBLOCK, axis=1)


def bounds(x: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    """(bound against x̂·Ŵ, bound against x·Ŵ), per element, as the module docstring derives."""
    vals, sc, off = unpack(t.qtype, np.asarray(t.data).reshape(t.rows, -1), t.cols)
    bs = t.cols // sc.shape[1]
    rep = np.repeat
    sq = np.abs(vals.astype(np.float64) * rep(sc.astype(np.float64), bs, axis=1))
    if off is not None:
        sq += rep(np.abs(off.astype(np.float64)), bs, axis=1)
    xh = dequantized_rows(x)
    nb = t.cols // bs
    b_hat = 4 * nb * U * (np.abs(xh) @ sq.T) + 1e-30
    w = np.abs(t.dequantize().reshape(t.rows, t.cols).astype(np.float64))
    _, d = quantize_rows(x)
    half_d = 0.5 * (1 + 2.0**-20) * rep(d.astype(np.float64), QBLOCK, axis=1)
    return b_hat, b_hat + half_d @ w.T


@st.composite
def cases(draw):
    qtype = draw(st.sampled_from(TYPES))
    rows = draw(st.integers(1, 200))
    cols = (256 if qtype in KQUANTS else 32) * draw(st.integers(1, 4))
    n = draw(st.sampled_from([1, 2, 8, 16, 64]))
    return make_tensor(qtype, rows, cols, draw(st.integers(0, 2**31))), n, draw(st.integers(0, 2**31))


@SETTINGS
@given(cases())
def test_rows_bit_identical_and_within_derived_bound(case) -> None:
    t, n, seed = case
    rng = np.random.default_rng(seed)
    scale = rng.choice([1e-3, 1.0, 30.0])
    x = (rng.standard_normal((n, t.cols)) * scale).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = 0.0  # zero blocks and sparse rows happen in real activations
    w = prepare_q8(prepare([t]))
    out = np.full((n, w.padded_out), np.nan, np.float32)
    y = matmul_q8(x, w, out=out)[:, : t.rows]
    assert np.isfinite(y).all(), "every output must be written"
    for r in range(n):  # alone, and in a different neighbourhood
        assert np.array_equal(matmul_q8(x[r : r + 1], w)[:, : t.rows], y[r : r + 1])
    if n > 1:
        assert np.array_equal(matmul_q8(x, w, row_chunk=3)[:, : t.rows], y)
        assert np.array_equal(matmul_q8(x[::-1].copy(), w)[:, : t.rows], y[::-1])
    # the packed weights (4/5/6 bits) and one byte per weight give the same bits
    assert np.array_equal(matmul_q8(x, prepare_q8(prepare([t]), packed=False))[:, : t.rows], y)
    W = t.dequantize().reshape(t.rows, t.cols).astype(np.float64)
    b_hat, b_x = bounds(x, t)
    assert (np.abs(y - dequantized_rows(x) @ W.T) <= b_hat).all()
    assert (np.abs(y - x.astype(np.float64) @ W.T) <= b_x).all()


#: The storage each type's values fit: (bits, bias), stored value = q + bias, and its scales'.
STORAGE = {Q.Q4_0: (4, 8, "f16"), Q.Q4_1: (4, 0, "f16"), Q.Q4_K: (4, 0, "fac"), Q.Q5_0: (5, 16, "f16"),
           Q.Q5_1: (5, 0, "f16"), Q.Q5_K: (5, 0, "fac"), Q.Q6_K: (6, 32, "fac"), Q.Q8_0: (8, 128, "f16"),
           # the IQ4 levels span −127…113: one byte each; IQ4_XS's scales are d times a 6-bit int
           Q.IQ4_NL: (8, 128, "f16"), Q.IQ4_XS: (8, 128, "fac")}


@pytest.mark.parametrize("qtype", TYPES)
def test_packed_storage_per_type_and_extremes(qtype) -> None:
    """Each type gets its narrowest storage, with bytes to match; a matrix whose values reach
    both ends of the range (every nibble and every plane bit set and clear) keeps its bits."""
    cols = 512 if qtype in KQUANTS else 128
    t = make_tensor(qtype, 130, cols, 11)
    pm = prepare([t])
    bits, bias = storage_for(pm.parts[0].q)
    assert (bits, bias, scale_codec(pm.parts[0])[0]) == STORAGE[qtype]
    q = pm.parts[0].q
    if bits < 8:  # the random tensor spans the range, so both ends of every field are exercised
        assert int(q.min()) + bias == 0 and int(q.max()) + bias == (1 << bits) - 1
    packed, plain = prepare_q8(pm, packed=True), prepare_q8(pm, packed=False)
    assert packed.parts[0].qv.nbytes * 8 == plain.parts[0].qv.nbytes * bits
    x = np.random.default_rng(3).standard_normal((17, cols)).astype(np.float32)
    y = matmul_q8(x, packed)
    assert np.array_equal(y, matmul_q8(x, plain))
    for n in (1, 2, 3, 4, 5, 9):
        assert np.array_equal(matmul_q8(x[:n], packed), y[:n])
    for high in HIGH_LAYOUTS:  # both ways of storing bits 4 and 5: same bytes, same bits
        other = prepare_q8(pm, packed=True, high=high)
        assert other.parts[0].qv.nbytes == packed.parts[0].qv.nbytes
        assert other.parts[0].high == high_for(pm.parts[0].kind.block, bits, high)
        for n in (1, 2, 5, 17):
            assert np.array_equal(matmul_q8(x[:n], other), y[:n])


def test_scales_that_do_not_factor_stay_float32() -> None:
    """Scales that are neither float16 values nor small integers times a factor keep float32
    storage (no lossy guess), with the same bits as the byte layout."""
    t = make_tensor(Q.Q4_K, 70, 512, 12)
    pm = prepare([t])
    part = pm.parts[0]
    rng = np.random.default_rng(0)
    part.s[:] = rng.uniform(0.001, 0.1, part.s.shape).astype(np.float32)
    assert scale_codec(part)[0] == "f32" and factor_scales(part.s, part.ngroups, part.nblocks, 32) is None
    x = rng.standard_normal((6, 512)).astype(np.float32)
    packed = prepare_q8(pm, packed=True)
    assert packed.parts[0].codec == "f32" and packed.parts[0].bits == 4
    assert np.array_equal(matmul_q8(x, packed), matmul_q8(x, prepare_q8(pm, packed=False)))


def test_factored_scales_rebuild_every_bit() -> None:
    """factor · int == scale bit for bit, signed zeros and negative factors included."""
    ints = np.random.default_rng(1).integers(-128, 128, (2, 16, 64)).astype(np.float32)
    ints[:, ::5] = 0  # zero scales: +0 or -0 with the sign of d, as in a file
    d = np.float16(np.random.default_rng(2).uniform(-1e-3, 1e-3, (2, 1, 1, 64))).astype(np.float32)
    s = (ints.reshape(2, 1, 16, 64) * d).reshape(-1).astype(np.float32)  # one superblock of 16-blocks
    assert np.signbit(s[s == 0]).any() and not np.signbit(s[s == 0]).all()
    fac, k = factor_scales(s, 2, 16, 16)
    rebuilt = (fac.reshape(2, 1, 1, 64) * k.reshape(2, 1, 16, 64).astype(np.float32)).reshape(-1)
    assert np.array_equal(rebuilt.view(np.uint32), s.view(np.uint32))


def test_quantize_rows_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 96)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[1, 32:64] = 0.0
    x[2, 0] = -np.abs(x[2, :32]).max() * 2  # block maximum negative
    xq, d = quantize_rows(x)
    xb = x.reshape(5, 3, 32)
    d_ref = np.abs(xb).max(axis=2) / np.float32(127)
    safe = np.where(d_ref == 0, np.float32(1), d_ref)
    q_ref = np.where(d_ref[..., None] == 0, 0, np.rint(xb / safe[..., None]))
    assert d.dtype == np.float32 and np.array_equal(d, d_ref)
    assert np.array_equal(xq.reshape(5, 3, 32), q_ref.astype(np.int8))
    assert np.abs(xq).max() == 127 and (xq[1, 32:64] == 0).all()
    # magnitudes over ±30 decades, subnormals and exact halves: still rint(x / d) exactly
    wide = (rng.standard_normal((4, 256)) * 10.0 ** rng.uniform(-30, 30, (4, 1))).astype(np.float32)
    wide[0, :32] = np.float32(2.0**-149) * np.arange(-16, 16)
    wide[3, :32] = np.arange(-16, 16, dtype=np.float32) + np.float32(0.5)
    wide[3, 31] = 127.0  # d = 1: every other value a half, rounded to even
    xq, d = quantize_rows(wide)
    wb = wide.reshape(4, 8, 32)
    d_ref = np.abs(wb).max(axis=2) / np.float32(127)
    q_ref = np.where(d_ref[..., None] == 0, 0, np.rint(wb / np.where(d_ref == 0, 1, d_ref)[..., None]))
    assert np.array_equal(d.view(np.int32), d_ref.view(np.int32))
    assert np.array_equal(xq.reshape(4, 8, 32), q_ref.astype(np.int8))


def test_quantize_rows_refuses_what_it_cannot_read_as_vectors() -> None:
    """A block is read as 32 consecutive float32: a strided or float64 x is a typing error
    (matmul_q8 always hands over a contiguous float32 copy), never a wrong result."""
    from numba.core.errors import TypingError

    x = np.ones((2, 128), dtype=np.float32)
    for bad in (x[:, ::2], x.astype(np.float64)):
        with pytest.raises(TypingError):
            quantize_rows(bad)


def test_fused_mixed_types_equal_separate() -> None:
    """Gemma's q|k (Q5_0) + v (Q8_0) fusion: two parts, same bits as separate matrices."""
    ts = [make_tensor(Q.Q5_0, 100, 128, 1), make_tensor(Q.Q5_0, 64, 128, 2), make_tensor(Q.Q8_0, 70, 128, 3)]
    x = np.random.default_rng(4).standard_normal((9, 128)).astype(np.float32)
    fused = matmul_q8(x, prepare_q8(prepare(ts)))
    sep = np.concatenate([matmul_q8(x, prepare_q8(prepare([t])))[:, : t.rows] for t in ts], axis=1)
    assert fused.shape == (9, 234) and np.array_equal(fused, sep)


def test_rejects_float_weights() -> None:
    with pytest.raises(ValueError):
        prepare_q8(prepare([make_tensor(Q.F32, 64, 64, 0)]))


@pytest.mark.skipif(not vnni_available(), reason="the AVX2 form has no vpdpbusd")
def test_kernels_use_vpdpbusd() -> None:
    """The integer dot products are VNNI instructions (what this module exists to measure)."""
    t = make_tensor(Q.Q4_1, 64, 64, 0)
    # one byte per weight: the (32, True) kernel of 8 bits that kernel_asm shows below
    matmul_q8(np.ones((3, 64), np.float32), prepare_q8(prepare([t]), packed=False))
    asm = kernel_asm(32, True)
    # each tile: 8 steps (32-input block / 4) × rows × vectors, straight-line in its block loop
    expected = sum(8 * rows * vecs for rows, vecs in ROW_TILES)
    assert len(re.findall(r"\bvpdpbusd\b", asm)) >= expected
    # and the block loops keep their sums in registers: no zmm stack traffic among the dots
    lines = asm.splitlines()
    dots = [i for i, line in enumerate(lines) if "vpdpbusd" in line]
    spans, first = [], dots[0]
    for prev, i in zip(dots, dots[1:] + [None], strict=True):
        if i is None or i - prev > 60:
            spans.append((first, prev))
            first = i
    assert len(spans) == len(ROW_TILES)
    for a, b in spans:
        assert not [line for line in lines[a : b + 1] if "(%rsp)" in line and "zmm" in line]


def test_cpu_backend_activation_modes(monkeypatch) -> None:
    """The backend's switch: q8 gives VNNI matrices (float parts stay float32), errors are clear."""
    from echoline.engine.backends.cpu_backend import CpuBackend
    from echoline.engine.errors import EcholineError
    from echoline.kernels.cpu import q8act
    from echoline.kernels.cpu.matmul import PreparedMatrix, matmul
    from echoline.kernels.cpu.q8act import Q8Matrix

    t = make_tensor(Q.Q4_1, 96, 128, 5)
    x = np.random.default_rng(5).standard_normal((5, 128)).astype(np.float32)
    q8 = CpuBackend(activations="q8")
    assert q8.variant == "cpu/q8" and q8.name == "cpu"
    w = q8.prepare_matrix([t])
    assert isinstance(w, Q8Matrix)
    assert np.array_equal(q8.matmul(x, w), matmul_q8(x, prepare_q8(prepare([t]))))
    f = make_tensor(Q.F32, 64, 128, 6)
    wf = q8.prepare_matrix([f])
    assert isinstance(wf, PreparedMatrix)  # float weights have no int8 form: float32 products
    assert np.array_equal(q8.matmul(x, wf), matmul(x, prepare([f])))
    monkeypatch.setenv("ECHOLINE_CPU_ACTIVATIONS", "q8")
    assert CpuBackend().variant == "cpu/q8"
    monkeypatch.setenv("ECHOLINE_CPU_ACTIVATIONS", "f32")
    assert CpuBackend().variant == "cpu"
    monkeypatch.delenv("ECHOLINE_CPU_ACTIVATIONS")
    assert CpuBackend().variant == "cpu/q8"  # the default, auto, on a CPU with AVX-512 VNNI
    assert CpuBackend(activations="auto").variant == "cpu/q8"
    with pytest.raises(EcholineError, match="unknown CPU activations"):
        CpuBackend(activations="int4")
    from echoline.engine.backends import get_backend

    assert get_backend("cpu", cpu_activations="q8").variant == "cpu/q8"
    assert get_backend("numpy", cpu_activations="q8").variant == "numpy"  # other backends ignore it
    with pytest.raises(EcholineError, match="unknown CPU activations"):
        get_backend("numpy", cpu_activations="int4")
    monkeypatch.setattr(q8act, "q8_available", lambda: False)
    with pytest.raises(EcholineError, match="AVX2 or AVX-512 VNNI"):
        CpuBackend(activations="q8")
    assert CpuBackend().variant == "cpu"  # auto without the int8 kernels: float32, no error
    monkeypatch.setattr(q8act, "q8_available", lambda: True)
    monkeypatch.setattr(q8act, "vnni_available", lambda: False)
    assert CpuBackend().variant == "cpu/q8"  # auto on AVX2 without VNNI: int8 activations


def test_q8_weight_cache_round_trip(tmp_path, monkeypatch) -> None:
    """The q8 layout read back from the weight cache gives the fresh layout's bits; its key
    differs from the float32 layout's; a damaged entry is ignored and rewritten."""
    import dataclasses

    from echoline.kernels.cpu import weight_cache
    from echoline.kernels.cpu.matmul import GROUP
    from echoline.kernels.cpu.q8act import INTERLEAVE, prepare_q8_cached

    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ECHOLINE_WEIGHT_CACHE", "1")
    parts = [make_tensor(Q.Q5_0, 70, 512, 1), make_tensor(Q.Q6_K, 40, 512, 3)]
    parts = [dataclasses.replace(p, origin=f"file-1@{i}") for i, p in enumerate(parts)]
    x = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    fresh = matmul_q8(x, prepare_q8(prepare(parts)))
    first = prepare_q8_cached(parts)  # miss: computes and writes (only the q8 entry)
    entries = sorted(p.name for p in (tmp_path / "relayout").iterdir())
    assert len(entries) == 2
    second = prepare_q8_cached(parts)  # hit: read from disk

    def read_back(m) -> bool:  # a cached matrix's arrays are views of one file-sized buffer
        base = m.parts[0].qv.base
        return base is not None and base.size > m.parts[0].qv.size

    assert read_back(second) and not read_back(first)
    assert np.array_equal(matmul_q8(x, first), fresh) and np.array_equal(matmul_q8(x, second), fresh)
    assert second.valid_cols is not None and np.array_equal(second.valid_cols, first.valid_cols)
    assert weight_cache.matrix_key(parts, GROUP, ("q8", INTERLEAVE)) != weight_cache.matrix_key(
        parts, GROUP, ((5, 64),)
    )
    bin_name = next(e for e in entries if e.endswith(".bin"))
    (tmp_path / "relayout" / bin_name).write_bytes(b"short")  # damaged: size mismatch
    third = prepare_q8_cached(parts)
    assert not read_back(third)
    assert np.array_equal(matmul_q8(x, third), fresh)
