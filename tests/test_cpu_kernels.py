"""Property tests for the numba CPU kernels: exactness of the relayout,
accuracy against float64, and bit-identical rows whatever the batch."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from echoline.engine.backends.cpu_backend import CpuBackend
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.gguf_file import QuantTensor
from echoline.kernels.cpu import attention, rowops
from echoline.kernels.cpu.matmul import matmul, prepare
from echoline.kernels.cpu.relayout import dequantize_relayout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Q = gguf.GGMLQuantizationType
QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16]
FLOATS = [Q.F16, Q.F32]
KQUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
IQUANTS = [Q.IQ4_NL, Q.IQ4_XS]  # non-linear 4-bit levels; gguf reads them but cannot write them
# Small register tiles keep compile time low in tests; the generator is the same.
TILES_A = ((2, 32), (1, 32))
TILES_B = ((3, 16), (1, 64))
SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def make_tensor(qtype: Q, rows: int, cols: int, seed: int) -> QuantTensor:
    """A random valid tensor of ``qtype`` (K-quants and IQ4 built byte-wise with sane d/dmin)."""
    rng = np.random.default_rng(seed)
    if qtype == Q.F32:
        data = rng.standard_normal((rows, cols)).astype(np.float32)
    elif qtype == Q.F16:
        data = rng.standard_normal((rows, cols)).astype(np.float16)
    elif qtype in QUANTIZABLE:
        data = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    else:
        belems, bsize = gguf.GGML_QUANT_SIZES[qtype]
        nblk = cols // belems
        raw = rng.integers(0, 256, size=(rows, nblk, bsize), dtype=np.uint8)
        d = rng.uniform(1e-4, 3e-2, size=(rows, nblk)).astype(np.float16)
        if qtype in IQUANTS:  # d first; indices and IQ4_XS's sub-block scales are any bytes
            raw[..., 0:2] = d.view(np.uint8).reshape(rows, nblk, 2)
        elif qtype == Q.Q6_K:
            raw[..., 208:210] = d.view(np.uint8).reshape(rows, nblk, 2)
        else:
            dmin = rng.uniform(1e-4, 3e-2, size=(rows, nblk)).astype(np.float16)
            raw[..., 0:2] = d.view(np.uint8).reshape(rows, nblk, 2)
            raw[..., 2:4] = dmin.view(np.uint8).reshape(rows, nblk, 2)
        data = raw.reshape(rows, nblk * bsize)
    return QuantTensor("w", qtype, (rows, cols), data)


def block_of(qtype: Q) -> int:
    return 256 if qtype in KQUANTS or qtype == Q.IQ4_XS else 32


@st.composite
def matrices(draw, qtypes=QUANTIZABLE + FLOATS + KQUANTS + IQUANTS):
    qtype = draw(st.sampled_from(qtypes))
    rows = draw(st.integers(1, 150))
    cols = block_of(qtype) * draw(st.integers(1, 3))
    return make_tensor(qtype, rows, cols, draw(st.integers(0, 2**31)))


def reference(x: np.ndarray, t: QuantTensor) -> np.ndarray:
    return x.astype(np.float64) @ t.dequantize().reshape(t.rows, t.cols).astype(np.float64).T


def bound(x: np.ndarray, t: QuantTensor) -> np.ndarray:
    w = np.abs(t.dequantize().reshape(t.rows, t.cols).astype(np.float64))
    return 1e-5 * (np.abs(x.astype(np.float64)) @ w.T) * max(1.0, t.cols / 64) + 1e-6


# ---- relayout exactness ----------------------------------------------------------------------
@pytest.mark.parametrize("qtype", QUANTIZABLE + FLOATS + KQUANTS + IQUANTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relayout_is_bit_exact(qtype: Q, seed: int) -> None:
    t = make_tensor(qtype, 37, block_of(qtype) * 2, seed)
    ref = t.dequantize().reshape(t.rows, t.cols)
    mine = dequantize_relayout(qtype, np.asarray(t.data), t.cols)
    assert mine.dtype == np.float32 and np.isfinite(mine).all()
    assert np.array_equal(ref.view(np.uint32), mine.view(np.uint32))


def test_relayout_rejects_unknown_type() -> None:
    with pytest.raises(ValueError):
        dequantize_relayout(Q.Q2_K, np.zeros((1, 84), np.uint8), 256)


# ---- matmul ------------------------------------------------------------------------------------
@SETTINGS
@given(t=matrices(), n=st.integers(1, 20), seed=st.integers(0, 1000))
def test_matmul_close_to_float64_and_rows_invariant(t: QuantTensor, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, t.cols)).astype(np.float32)
    pm = prepare([t], TILES_A)
    poisoned = np.full((n, pm.padded_out), np.nan, dtype=np.float32)
    y = matmul(x, pm, out=poisoned)
    assert y.shape == (n, t.rows) and np.isfinite(y).all()
    assert (np.abs(y - reference(x, t)) <= bound(x, t)).all()
    for i in range(n):  # each row alone
        assert np.array_equal(matmul(x[i : i + 1], pm)[0], y[i])
    k = int(rng.integers(1, n + 1))  # odd chunkings and a sub-batch at another offset
    assert np.array_equal(matmul(x, pm, row_chunk=k), y)
    lo = int(rng.integers(0, n))
    assert np.array_equal(matmul(x[lo:], pm), y[lo:])


@SETTINGS
@given(t=matrices(qtypes=[Q.Q8_0, Q.Q4_1]), n=st.integers(1, 12), seed=st.integers(0, 1000))
def test_matmul_tile_shape_does_not_change_bits(t: QuantTensor, n: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((n, t.cols)).astype(np.float32)
    pa, pb = prepare([t], TILES_A), prepare([t], TILES_B)
    ya = matmul(x, pa, out=np.full((n, pa.padded_out), np.nan, np.float32))
    yb = matmul(x, pb, out=np.full((n, pb.padded_out), np.nan, np.float32))
    assert np.isfinite(ya).all() and np.array_equal(ya, yb)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K])
def test_absorbing_tile_plan_changes_no_bit(qtype) -> None:
    """The default set's 5-row tile runs only as often as it absorbs leftover rows (n = 4q + r:
    r passes of 5 when q >= r). Every n from 1 to 23 gives each row the bits of a one-row
    tile set, and the plan is what codegen says it is."""
    from echoline.kernels.cpu.codegen import KernelSpec, matmul_source
    from echoline.kernels.cpu.matmul import DEFAULT_TILES, NARROW_TILES

    t = make_tensor(qtype, 130, 512, 7)
    p1 = prepare([t], ((1, 64),))
    x = (np.random.default_rng(3).standard_normal((23, 512)) * 2).astype(np.float32)
    one = matmul(x, p1)
    # the target's set, and the narrow set (AVX2's) wherever the target's is the wide one
    for tiles in dict.fromkeys((DEFAULT_TILES, NARROW_TILES)):
        assert tiles[0][0] == tiles[1][0] + 1  # the absorbing form is in use
        pd = prepare([t], tiles)
        for n in range(1, 24):
            got = matmul(x[:n], pd, out=np.full((n, pd.padded_out), np.nan, np.float32))
            assert np.array_equal(got, one[:n]), (tiles, n)
        spec = KernelSpec(64, 32, 2, True, True, "int8", tiles)
        assert "r0 < nabs * U5" in matmul_source(spec)  # the 5-row loop is bounded by the plan


def test_fused_mixed_types_equal_separate() -> None:
    parts = [
        make_tensor(Q.Q5_0, 70, 512, 1),
        make_tensor(Q.Q8_0, 64, 512, 2),
        make_tensor(Q.Q4_K, 40, 512, 3),
        make_tensor(Q.F16, 3, 512, 4),
        make_tensor(Q.Q6_K, 64, 512, 5),
    ]
    x = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    fused = matmul(x, prepare(parts, TILES_A))
    alone = np.concatenate([matmul(x, prepare([p], TILES_A)) for p in parts], axis=1)
    assert fused.shape == (5, sum(p.rows for p in parts))
    assert np.array_equal(fused, alone)
    with pytest.raises(ValueError):
        prepare([make_tensor(Q.Q8_0, 4, 64, 0), make_tensor(Q.Q8_0, 4, 96, 0)], TILES_A)


def test_weight_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached (read back) matrix gives the same bits as a fresh one; a changed
    origin misses; a damaged entry is ignored and rewritten."""
    from echoline.kernels.cpu import weight_cache
    from echoline.kernels.cpu.matmul import prepare_cached

    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ECHOLINE_WEIGHT_CACHE", "1")
    parts = [make_tensor(Q.Q5_0, 70, 512, 1), make_tensor(Q.Q4_K, 40, 512, 3)]
    parts = [dataclasses.replace(p, origin=f"file-1@{i}") for i, p in enumerate(parts)]
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    fresh = matmul(x, prepare(parts, TILES_A))
    first = prepare_cached(parts, TILES_A)  # miss: computes and writes
    entries = sorted(p.name for p in (tmp_path / "relayout").iterdir())
    assert len(entries) == 2 and entries[0].endswith(".bin") and entries[1].endswith(".json")
    second = prepare_cached(parts, TILES_A)  # hit: read from disk, not computed
    assert second.parts[0].q.base is not None and second.parts[0].q.base.dtype == np.uint8
    assert np.array_equal(matmul(x, first), fresh) and np.array_equal(matmul(x, second), fresh)
    assert second.valid_cols is not None and np.array_equal(second.valid_cols, first.valid_cols)
    moved = [dataclasses.replace(p, origin=f"file-2@{i}") for i, p in enumerate(parts)]
    assert weight_cache.matrix_key(moved, 64, TILES_A) != weight_cache.matrix_key(parts, 64, TILES_A)
    (tmp_path / "relayout" / entries[0]).write_bytes(b"short")  # damaged: size mismatch
    third = prepare_cached(parts, TILES_A)
    assert third.parts[0].q.base is None or third.parts[0].q.base.dtype != np.uint8
    assert np.array_equal(matmul(x, third), fresh)
    no_origin = [dataclasses.replace(p, origin=None) for p in parts]
    assert weight_cache.matrix_key(no_origin, 64, TILES_A) is None


def test_weight_cache_prunes_least_recently_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ECHOLINE_WEIGHT_CACHE_MB the oldest entries go (a load counts as a use); the entry
    just written stays even when it alone is over the limit."""
    import os

    from echoline.kernels.cpu import weight_cache

    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    arrays = [np.zeros(100_000, np.uint8)]  # ~0.1 MB an entry
    for i, key in enumerate(("a", "b", "c")):
        monkeypatch.setenv("ECHOLINE_WEIGHT_CACHE_MB", "1")
        weight_cache.store(key, {"n": i}, arrays)
        os.utime(tmp_path / "relayout" / f"{key}.bin", (1000 + i, 1000 + i))  # a, then b, then c
    assert weight_cache.load("a") is not None  # a is now the most recently used
    monkeypatch.setenv("ECHOLINE_WEIGHT_CACHE_MB", "0.25")  # room for two entries
    weight_cache.store("d", {"n": 3}, arrays)
    left = sorted(p.stem for p in (tmp_path / "relayout").glob("*.bin"))
    assert left == ["a", "d"] and sorted(p.stem for p in (tmp_path / "relayout").glob("*.json")) == left
    monkeypatch.setenv("ECHOLINE_WEIGHT_CACHE_MB", "0")
    weight_cache.store("e", {"n": 4}, arrays)
    assert sorted(p.stem for p in (tmp_path / "relayout").glob("*.bin")) == ["e"]


# ---- row ops -----------------------------------------------------------------------------------
@SETTINGS
@given(
    n=st.integers(1, 9),
    heads=st.sampled_from([(4, 1), (9, 3), (2, 2)]),
    hd=st.sampled_from([16, 64, 40]),
    window=st.sampled_from([0, 3, 17]),
    seed=st.integers(0, 99),
)
def test_attention_rows_invariant_and_close(n, heads, hd, window, seed) -> None:
    rng = np.random.default_rng(seed)
    nh, nkv = heads
    ctx = 40
    k = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, nh, hd)).astype(np.float32)
    pos = rng.integers(0, ctx, size=n)
    out = attention.attention(q, k, v, pos, window, 0.3)
    ref = NumpyBackend().attention(q, k, v, pos, window, 0.3)
    assert np.isfinite(out).all() and np.allclose(out, ref, rtol=1e-4, atol=1e-5)
    for i in range(n):
        assert np.array_equal(
            attention.attention(q[i : i + 1], k, v, pos[i : i + 1], window, 0.3)[0], out[i]
        )


@SETTINGS
@given(
    n=st.integers(1, 17),
    heads=st.sampled_from([(9, 3), (4, 1), (2, 2)]),
    hd=st.sampled_from([64, 256, 40]),
    window=st.sampled_from([0, 50, 512]),
    ctx=st.integers(65, 700),
    seed=st.integers(0, 99),
)
def test_attention_long_context_blocks_rows_invariant(n, heads, hd, window, ctx, seed) -> None:
    """Many key blocks, partial last block, windows crossing blocks: every row of an n-row
    call equals that row alone and among a different sub-batch, and is close to numpy."""
    rng = np.random.default_rng(seed)
    nh, nkv = heads
    k = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    q = (rng.standard_normal((n, nh, hd)) * 2).astype(np.float32)
    pos = np.sort(rng.integers(0, ctx, size=n))
    pos[-1] = ctx - 1
    scale = float(hd) ** -0.5
    out = attention.attention(q, k, v, pos, window, scale)
    ref = NumpyBackend().attention(q, k, v, pos, window, scale)
    assert np.isfinite(out).all() and np.allclose(out, ref, rtol=1e-4, atol=2e-5)
    for i in range(n):
        alone = attention.attention(q[i : i + 1], k, v, pos[i : i + 1], window, scale)[0]
        assert np.array_equal(alone, out[i])
    sub = np.arange(n)[::2]
    assert np.array_equal(attention.attention(q[sub], k, v, pos[sub], window, scale), out[sub])


def test_attention_serial_and_parallel_paths_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    k = rng.standard_normal((300, 3, 64)).astype(np.float32)
    v = rng.standard_normal((300, 3, 64)).astype(np.float32)
    q = rng.standard_normal((5, 9, 64)).astype(np.float32)
    pos = np.array([3, 100, 250, 298, 299])
    monkeypatch.setattr(attention, "PARALLEL_ATTENTION_WORK", 1)
    par = attention.attention(q, k, v, pos, 0, 0.125)
    monkeypatch.setattr(attention, "PARALLEL_ATTENTION_WORK", 1 << 60)
    assert np.array_equal(attention.attention(q, k, v, pos, 0, 0.125), par)


@SETTINGS
@given(
    n=st.integers(1, 41),
    heads=st.sampled_from([(9, 3), (4, 1), (2, 2), (6, 2)]),
    hd=st.sampled_from([64, 256, 40, 96]),
    window=st.sampled_from([0, 50, 512]),
    ctx=st.integers(40, 900),
    contiguous=st.booleans(),
    row_tile=st.sampled_from([1, 3, 4, 5]),
    seed=st.integers(0, 99),
)
def test_tiled_attention_rows_equal_decode_rows(n, heads, hd, window, ctx, contiguous, row_tile, seed) -> None:
    """The row-tiled path (prefill chunks, long verifies) gives every row the bits of the
    one-row decode path: odd row counts, rows crossing tile boundaries, any tile height,
    sliding windows, GQA, head dims with a partial value slice, chunked prefills."""
    rng = np.random.default_rng(seed)
    nh, nkv = heads
    n = min(n, ctx)
    k = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    v = rng.standard_normal((ctx, nkv, hd)).astype(np.float32)
    q = (rng.standard_normal((n, nh, hd)) * 2).astype(np.float32)
    if contiguous:  # a prefill chunk or a verify: consecutive positions ending at the cache end
        pos = np.arange(ctx - n, ctx)
    else:
        pos = np.sort(rng.integers(0, ctx, size=n))
    scale = float(hd) ** -0.5
    with pytest.MonkeyPatch.context() as mp:
        _check_tiled_rows(mp, q, k, v, pos, window, scale, row_tile, int(rng.integers(0, n + 1)))


def _check_tiled_rows(mp, q, k, v, pos, window, scale, row_tile, cut) -> None:
    n = q.shape[0]
    mp.setattr(attention, "ROW_TILE", row_tile)
    mp.setattr(attention, "TILED_MIN_ROWS", 1)  # every call below is tiled ...
    tiled = attention.attention(q, k, v, pos, window, scale)
    ref = NumpyBackend().attention(q, k, v, pos, window, scale)
    assert np.isfinite(tiled).all() and np.allclose(tiled, ref, rtol=1e-4, atol=2e-5)
    # ... including a chunked prefill split anywhere
    parts = [attention.attention(q[a:b], k, v, pos[a:b], window, scale) for a, b in ((0, cut), (cut, n)) if b > a]
    assert np.array_equal(np.concatenate(parts), tiled)
    # ... and from a key store (the CPU backend's K cache), read in place through a view
    # that starts anywhere in it (a ring's slice), for all rows and for each row alone
    off = int(pos[0]) % 7
    store = attention.empty_keys(off + k.shape[0] + 5, k.shape[1], k.shape[2])
    store[off : off + k.shape[0]] = k
    kview = store[off : off + k.shape[0]]
    assert attention.key_store(kview) is not None and attention.key_store(k) is None
    assert np.array_equal(attention.attention(q, kview, v, pos, window, scale), tiled)
    mp.setattr(attention, "TILED_MIN_ROWS", 1 << 30)  # ... and the decode path, row by row
    for i in range(n):
        assert np.array_equal(attention.attention(q[i : i + 1], k, v, pos[i : i + 1], window, scale)[0], tiled[i])
        assert np.array_equal(attention.attention(q[i : i + 1], kview, v, pos[i : i + 1], window, scale)[0], tiled[i])


def test_key_store_grows_and_copies_like_a_plain_cache() -> None:
    """The CPU backend's K cache is an ordinary (capacity, KVH, hd) array to its users:
    writes, slices, growth and copies between caches see the same values as row-major storage."""
    from echoline.engine.backends.cpu_backend import CpuBackend

    b = CpuBackend()
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((40, 2, 16)).astype(np.float32)
    kc, plain = b.empty_key_cache(48, 2, 16), np.zeros((48, 2, 16), np.float32)
    assert attention.key_store(kc) is not None and kc.shape == plain.shape
    b.write_cache(kc, 3, rows)
    b.write_cache(plain, 3, rows)
    grown = b.grow_cache(kc, 96)
    assert attention.key_store(grown) is not None and grown.shape == (96, 2, 16)
    assert np.array_equal(grown[:48], plain) and not grown[48:].any()
    other = b.empty_key_cache(64, 2, 16)
    b.write_cache(other, 0, grown[10:30])
    assert np.array_equal(other[:20], plain[10:30])


def test_tiled_attention_serial_parallel_and_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serial and parallel tiled runs, and both sides of TILED_MIN_ROWS, give the same bits."""
    rng = np.random.default_rng(11)
    k = rng.standard_normal((400, 3, 64)).astype(np.float32)
    v = rng.standard_normal((400, 3, 64)).astype(np.float32)
    q = rng.standard_normal((23, 9, 64)).astype(np.float32)
    pos = np.arange(377, 400)
    monkeypatch.setattr(attention, "TILED_MIN_ROWS", 1)
    monkeypatch.setattr(attention, "PARALLEL_ATTENTION_WORK", 1)
    par = attention.attention(q, k, v, pos, 0, 0.125)
    monkeypatch.setattr(attention, "PARALLEL_ATTENTION_WORK", 1 << 60)
    assert np.array_equal(attention.attention(q, k, v, pos, 0, 0.125), par)
    monkeypatch.setattr(attention, "TILED_MIN_ROWS", 1 << 30)
    assert np.array_equal(attention.attention(q, k, v, pos, 0, 0.125), par)


def test_exp_nonpositive_accurate_and_lane_independent() -> None:
    rng = np.random.default_rng(3)
    x = -np.abs(rng.standard_normal(1000) * 30).astype(np.float32)
    x[:6] = [0.0, -0.0, -1e-30, -86.9, -87.5, -np.inf]
    y = x.copy()
    bits = np.empty(1000, np.int32)
    attention.exp_nonpositive(y, bits, 0, 1000)
    ref = np.exp(x.astype(np.float64))
    big = ref > 1e-30
    assert np.max(np.abs(y[big] - ref[big]) / ref[big]) < 5e-7
    assert y[0] == 1.0 and y[4] == 0.0 and y[5] == 0.0
    for lo in (0, 1, 7, 13):  # a value's result never depends on where its loop starts
        z = x.copy()
        attention.exp_nonpositive(z, bits, lo, 1000)
        assert np.array_equal(z[lo:], y[lo:])


@SETTINGS
@given(n=st.integers(1, 300), lo=st.integers(0, 20), seed=st.integers(0, 999))
def test_softmax_lane_max_is_the_maximum(n: int, lo: int, seed: int) -> None:
    """The 16-lane maximum equals the plain maximum for any span, so softmax bits cannot move."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(lo + n) * 10).astype(np.float32)
    special = rng.integers(0, lo + n, size=3)
    row[special] = rng.choice(np.array([0.0, -0.0, -np.inf, 88.0], dtype=np.float32), size=3)
    assert attention._span_max(row, lo, lo + n) == np.max(row[lo : lo + n])
    # the softmax sum over the span is the reference sum of exp(s - max) to float32 rounding
    if np.isfinite(np.max(row[lo : lo + n])):
        ref = np.exp(row[lo : lo + n].astype(np.float64) - float(np.max(row[lo : lo + n]))).sum()
        total = attention._softmax_span(row.copy(), np.empty(lo + n, np.int32), lo, lo + n)
        assert abs(total - ref) <= 1e-5 * ref
    poisoned = row.copy()
    poisoned[lo + int(rng.integers(0, n))] = np.nan
    assert np.isnan(attention._softmax_span(poisoned, np.empty(lo + n, np.int32), lo, lo + n))


@SETTINGS
@given(n=st.integers(1, 12), d=st.integers(1, 300), seed=st.integers(0, 99))
def test_elementwise_ops_rows_invariant(n: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 5).astype(np.float32)
    u = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    nb = NumpyBackend()
    results = {
        "rms": (
            rowops.rms_norm(x, w, 1e-6),
            lambda a, i: rowops.rms_norm(a, w, 1e-6),
            nb.rms_norm(x, w, 1e-6),
        ),
        "silu": (rowops.silu_mul(x, u), lambda a, i: rowops.silu_mul(a, u[i : i + len(a)]), nb.silu_mul(x, u)),
        "gelu": (
            rowops.gelu_tanh_mul(x, u),
            lambda a, i: rowops.gelu_tanh_mul(a, u[i : i + len(a)]),
            nb.gelu_tanh_mul(x, u),
        ),
    }
    for name, (full, _fn, ref) in results.items():
        assert np.isfinite(full).all(), name
        assert np.allclose(full, ref, rtol=1e-5, atol=1e-6), name
    # a row's result does not depend on its neighbours (from PARALLEL_ACTIVATION_ROWS rows
    # on, the activations run one row per thread)
    for i in range(n):
        for name, (full, fn, _) in results.items():
            assert np.array_equal(fn(x[i : i + 1], i)[0], full[i]), name


def test_activations_accurate_and_lane_independent() -> None:
    """SiLU / tanh-GELU through exp_nonpositive: within a few float32 ulps of float64 over a
    wide range, exact signed zeros far out, NaN kept, and every element's bits the same
    whether it sits in a SIMD lane or the scalar tail (a 1-wide row is all tail)."""
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [
            (rng.standard_normal(3000) * 4).astype(np.float32),
            np.linspace(-120, 120, 997, dtype=np.float32),
            np.array([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 200.0, -200.0, np.nan], dtype=np.float32),
        ]
    )[None, :]
    u = np.ones_like(x)
    x64 = x.astype(np.float64)

    def sigmoid(z: np.ndarray) -> np.ndarray:  # float64, no cancellation on either side
        e = np.exp(-np.abs(z))
        return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    # 0.5 * (1 + tanh(y)) == sigmoid(2y); the tanh form cancels to 0 below x ~ -7 even in float64
    zs = {"silu": x64, "gelu": 2.0 * 0.7978845608028654 * (x64 + 0.044715 * x64**3)}
    for name, fn in (("silu", rowops.silu_mul), ("gelu", rowops.gelu_tanh_mul)):
        got = fn(x, u)
        ref = x64 * sigmoid(zs[name])
        ok = np.isfinite(ref) & (np.abs(ref) > 1e-30)
        err = np.abs(got[ok] - ref[ok]) / np.abs(ref[ok])
        # float32 rounding of z itself moves exp(z) by ~|z| ulps in the far negative tail
        assert np.all(err <= 4e-7 * (4.0 + np.abs(zs[name][ok]))), name
        assert np.isnan(got[0, -1]), name
        assert got[0, -2] == 0.0 and np.signbit(got[0, -2]), name  # x = -200: exactly -0
        for i in rng.integers(0, x.shape[1], size=200):
            one = fn(x[:, i : i + 1], u[:, i : i + 1])
            assert one.tobytes() == got[:, i : i + 1].tobytes(), (name, i)


@SETTINGS
@given(
    n=st.integers(1, 8),
    hd=st.sampled_from([8, 64, 256]),
    neox=st.booleans(),
    seed=st.integers(0, 99),
)
def test_rope_rows_invariant(n: int, hd: int, neox: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, hd)).astype(np.float32)
    pos = rng.integers(0, 5000, size=n)
    cb = CpuBackend()
    out = cb.rope(x, pos, 10000.0, neox)
    assert np.allclose(out, NumpyBackend().rope(x, pos, 10000.0, neox), rtol=1e-5, atol=1e-5)
    for i in range(n):
        assert np.array_equal(cb.rope(x[i : i + 1], pos[i : i + 1], 10000.0, neox)[0], out[i])


# ---- backend -----------------------------------------------------------------------------------
def test_backend_matches_numpy_backend() -> None:
    cb, nb = CpuBackend(), NumpyBackend()
    t = make_tensor(Q.Q8_0, 100, 64, 7)
    ids = np.array([3, 0, 99, 3])
    assert np.array_equal(cb.embed(cb.prepare_embedding(t), ids), nb.embed(t, ids))
    with pytest.raises(IndexError):
        cb.embed(t, np.array([100]))
    cache = cb.empty_cache(4, 2, 8)
    cb.write_cache(cache, 1, np.ones((2, 2, 8), np.float32))
    grown = cb.grow_cache(cache, 10)
    assert grown.shape == (10, 2, 8) and grown[1:3].sum() == 32 and grown[3:].sum() == 0
    assert np.array_equal(cb.scale(np.ones(3), 0.5), np.full(3, 0.5, np.float32))
    assert cb.batch_invariant and cb.name == "cpu"
    # empty batches are legal and cost nothing
    w = cb.prepare_matrix([t])
    assert cb.matmul(np.zeros((0, 64), np.float32), w).shape == (0, 100)
    q = np.zeros((0, 2, 8), np.float32)
    assert cb.attention(q, cache, cache, np.zeros(0, np.int64), 0, 1.0).shape == (0, 16)
    with pytest.raises(ValueError):
        cb.attention(np.zeros((1, 2, 8), np.float32), cache, cache, np.array([4]), 0, 1.0)


REAL = Path(os.path.expanduser("~/.cache/echoline/models/SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.mark.slow
@pytest.mark.skipif(not REAL.exists(), reason="real model not on disk")
def test_production_tiles_on_real_weights() -> None:
    """Default tiles on SmolLM2's fused q|k|v: rows bit-identical for n = 1..16."""
    from echoline.engine.gguf_file import GGUFFile

    f = GGUFFile(REAL)
    ts = [f.tensor(f"blk.0.attn_{p}.weight") for p in "qkv"]
    cb = CpuBackend(activations="f32")
    w = cb.prepare_matrix(ts)
    x = np.random.default_rng(0).standard_normal((16, 576)).astype(np.float32)
    full = cb.matmul(x, w)
    ref = NumpyBackend().matmul(x, NumpyBackend().prepare_matrix(ts))
    assert np.allclose(full, ref, rtol=1e-4, atol=1e-4)
    for n in range(1, 17):
        assert np.array_equal(cb.matmul(x[:n], w), full[:n]), n
        assert np.array_equal(cb.matmul(x[16 - n :], w), full[16 - n :]), n


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.F16])
def test_input_layout_changes_no_bit(qtype, monkeypatch) -> None:
    """The kernels read x as rows or transposed (``TRANSPOSE_ROWS``, chosen by speed per
    row count); the arithmetic is the same chain either way, so the bits are too."""
    from echoline.kernels.cpu import matmul as mm

    w = prepare([make_tensor(qtype, 96, 256, 2)])
    x = (np.random.default_rng(4).standard_normal((19, 256)) * 3).astype(np.float32)
    got = {}
    for name, rows in (("transposed", (1, 64)), ("rows", (0, -1))):
        monkeypatch.setattr(mm, "TRANSPOSE_ROWS", rows)
        got[name] = [matmul(x[:n], w).tobytes() for n in (1, 2, 8, 19)]
    assert got["transposed"] == got["rows"]


def test_gated_activations_on_views_and_tails() -> None:
    """The activations read rows as the backend hands them over (gate|up split views, a
    strided last axis copied first) and every width, whole 16-lane vectors or not: the
    same bits as contiguous copies, and each element the scalar formula's value."""
    rng = np.random.default_rng(11)
    for cols in (1, 15, 16, 17, 33, 40):
        g = (rng.standard_normal((5, 2 * cols)) * 12).astype(np.float32)
        g[0, 0] = -200.0  # exp underflows: silu gives the exact -0
        gate, up = g[:, :cols], g[:, cols:]
        for fn in (rowops.silu_mul, rowops.gelu_tanh_mul):
            want = fn(np.ascontiguousarray(gate), np.ascontiguousarray(up))
            assert np.array_equal(fn(gate, up).view(np.int32), want.view(np.int32))
            strided = fn(g[:, : 2 * cols : 2], g[:, 1 : 2 * cols : 2])
            copied = fn(np.ascontiguousarray(g[:, : 2 * cols : 2]), np.ascontiguousarray(g[:, 1 : 2 * cols : 2]))
            assert np.array_equal(strided.view(np.int32), copied.view(np.int32))
        x = gate.astype(np.float64)
        silu = x / (1.0 + np.exp(-x)) * up
        got = rowops.silu_mul(gate, up)
        np.testing.assert_allclose(got, silu, rtol=2e-6, atol=1e-30)
        assert got[0, 0] == 0 and np.signbit(got[0, 0]) != np.signbit(up[0, 0])  # -0 · up: the sign kept
        # other dtypes are converted, not read as float32 bits
        np.testing.assert_allclose(rowops.silu_mul(gate.astype(np.float64), up.astype(np.float64)), got)
