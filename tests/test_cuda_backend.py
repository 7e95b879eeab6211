"""CUDA backend against the numpy reference, and its batch invariance.

Skips cleanly without CuPy or a GPU (CI). Every check draws fresh random inputs,
poisons the memory pool with NaN first (an unwritten output shows as NaN), and
compares by relative error within float32 bounds; batch-invariance checks compare
bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception:  # noqa: BLE001 - a CuPy without a driver raises various errors
    pytest.skip("no CUDA device", allow_module_level=True)

import gguf  # noqa: E402
from echoline.engine.backends.cupy_backend import CupyBackend  # noqa: E402
from echoline.engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from echoline.engine.gguf_file import QuantTensor  # noqa: E402
from echoline.kernels.cuda.reference import int8_error_bound, tc_round  # noqa: E402
from echoline.kernels.quant_types import QUANT_TYPES  # noqa: E402

from tests import cancelling  # noqa: E402
from tests.synth import encode_matrix  # noqa: E402

pytestmark = pytest.mark.gpu
Q = gguf.GGMLQuantizationType
QTYPES = [t.qtype for t in QUANT_TYPES]  # every type of the registry, in its order
REL_TOL = 2e-6


def assert_rows_invariant(cb, ops) -> None:
    """Each op over 64 rows, then over prefixes, single rows and chunks of 7: same bits."""
    for name, op in ops.items():
        poison()
        full = cb.to_host(op(0, 64))
        assert np.isfinite(full).all()
        for m in (1, 2, 3, 8, 9, 16, 17, 33):
            poison()
            assert np.array_equal(cb.to_host(op(0, m)), full[:m]), f"{name}: {m} rows differ"
        for i in (5, 63):
            assert np.array_equal(cb.to_host(op(i, i + 1))[0], full[i]), f"{name}: row {i} alone"
        pieces = [cb.to_host(op(s, s + 7)) for s in range(0, 64, 7)]
        assert np.array_equal(np.concatenate(pieces), full), f"{name}: chunks of 7"


@pytest.fixture(scope="module")
def cb() -> CupyBackend:
    """The CUDA-core (fp32) kernels: the tensor-core products (f16 inputs, own bounds) are
    tested by the tests that use ``tensor_on`` below."""
    b = CupyBackend()
    b.tensor_products = False
    return b


@pytest.fixture(scope="module")
def ref() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng(abs(hash(request.node.name)) % (2**32))


def poison() -> None:
    """Fill the pool's free blocks with NaN so an output element nobody writes is NaN."""
    cupy.cuda.Device().synchronize()
    pool = cupy.get_default_memory_pool()
    held = []
    for size in (1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22):
        for _ in range(4):
            held.append(cupy.full(size // 4, np.nan, dtype=cupy.float32))
    del held
    assert pool.free_bytes() > 0


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "NaN/inf in output: an element was never written"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def make_tensor(
    rng: np.random.Generator, rows: int, cols: int, qtype: Q, name: str = "w"
) -> QuantTensor:
    data, _ = encode_matrix(rng, rows, cols, qtype)
    data = np.ascontiguousarray(data)
    if qtype == Q.BF16:
        data = data.view(np.uint8).reshape(rows, -1)
    elif qtype not in (Q.F32, Q.F16):
        data = data.reshape(rows, -1).view(np.uint8)
    return QuantTensor(name, qtype, (rows, cols), data)


def sum_tol(w: np.ndarray, x: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
    """Elementwise bound for float32 dot products: k * eps * sum |w||x| (k = length)."""
    bound = w.shape[1] * 1.2e-7 * (np.abs(x) @ np.abs(w).T) + 1e-30
    assert np.isfinite(got).all()
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_embed_matches_dequantize(cb, rng, qtype):
    t = make_tensor(rng, 37, 512, qtype)
    table = cb.prepare_embedding(t)
    ids = rng.integers(0, 37, size=23)
    poison()
    got = cb.to_host(cb.embed(table, ids))
    want = t.dequantize_rows(ids)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)  # dequantization is exact in float32


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_matmul_matches_reference(cb, ref, rng, qtype):
    t = make_tensor(rng, 100, 768, qtype)
    w_ref = ref.prepare_matrix([t])
    w = cb.prepare_matrix([t])
    for n in (1, 3, 16, 40):
        x = rng.standard_normal((n, 768)).astype(np.float32)
        poison()
        got = cb.to_host(cb.matmul(cupy.asarray(x), w))
        want = x.astype(np.float64) @ w_ref.astype(np.float64).T
        sum_tol(w_ref, x, got, want)
        assert rel_err(got, ref.matmul(x, w_ref)) < REL_TOL


def test_fused_mixed_quant_matmul(cb, ref, rng):
    parts = [
        make_tensor(rng, 64, 512, Q.Q4_K, "q"),
        make_tensor(rng, 32, 512, Q.Q4_K, "k"),
        make_tensor(rng, 32, 512, Q.Q6_K, "v"),
        make_tensor(rng, 16, 512, Q.Q8_0, "x"),
    ]
    w = cb.prepare_matrix(parts)
    assert len(w.segments) == 3 and w.out_features == 144
    w_ref = ref.prepare_matrix(parts)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    poison()
    got = cb.to_host(cb.matmul(cupy.asarray(x), w))
    assert rel_err(got, ref.matmul(x, w_ref)) < REL_TOL


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_factored_and_plain_products_match_reference(cb, ref, rng, qtype):
    """Both product forms (scale per chunk after the code sums, or per weight) against
    numpy, plain and with the norm fused, each batch-invariant (1 row == rows of 17)."""
    t = make_tensor(rng, 136, 1024, qtype)
    w, w_ref = cb.prepare_matrix([t]), ref.prepare_matrix([t])
    g = (1.0 + 0.1 * rng.standard_normal(1024)).astype(np.float32)
    gd = cb.prepare_vector(g)
    keep = cb.factored_products
    try:
        for factored in (True, False):
            cb.factored_products = factored
            x = (2 * rng.standard_normal((17, 1024))).astype(np.float32)
            xd = cupy.asarray(x)
            poison()
            got = cb.to_host(cb.matmul(xd, w))
            sum_tol(w_ref, x, got, x.astype(np.float64) @ w_ref.astype(np.float64).T)
            assert rel_err(got, ref.matmul(x, w_ref)) < REL_TOL
            poison()
            normed = cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w))
            assert rel_err(normed, ref.matmul(ref.rms_norm(x, g, 1e-6), w_ref)) < 1e-5
            for m in (1, 2, 5):
                assert np.array_equal(cb.to_host(cb.matmul(xd[:m], w)), got[:m])
                assert np.array_equal(cb.to_host(cb.norm_matmul(xd[:m], gd, 1e-6, w)), normed[:m])
    finally:
        cb.factored_products = keep


def test_two_type_weight_one_launch(cb, ref, rng):
    """A q|k (Q4_K) + v (Q6_K) weight as one launch equals its two per-segment launches
    bit for bit (norm and bias fused, both product forms), matches numpy, and is
    batch-invariant."""
    d = 768
    parts = [make_tensor(rng, 96, d, Q.Q4_K, "qk"), make_tensor(rng, 40, d, Q.Q6_K, "v")]
    w, w_ref = cb.prepare_matrix(parts), ref.prepare_matrix(parts)
    assert len(w.segments) == 2
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    bias = rng.standard_normal(136).astype(np.float32)
    gd, bd = cb.prepare_vector(g), cb.prepare_vector(bias)
    x = (2 * rng.standard_normal((40, d))).astype(np.float32)
    xd = cupy.asarray(x)
    res = cupy.asarray(rng.standard_normal((40, 136)).astype(np.float32))
    keep = cb.fuse_segment_pairs, cb.factored_products
    try:
        for factored in (True, False):
            cb.factored_products = factored
            out = {}
            for fused in (False, True):
                cb.fuse_segment_pairs = fused
                poison()
                out[fused] = (
                    cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w, bd)),
                    cb.to_host(cb.matmul_add(xd, w, res)),
                )
            assert np.array_equal(out[True][0], out[False][0])
            assert np.array_equal(out[True][1], out[False][1])
            want = ref.add(ref.matmul(ref.rms_norm(x, g, 1e-6), w_ref), bias)
            assert rel_err(out[True][0], want) < 1e-5
            assert rel_err(out[True][1], ref.add(cb.to_host(res), ref.matmul(x, w_ref))) < 1e-5
            for m in (1, 2, 3, 8, 16, 17):
                assert np.array_equal(
                    cb.to_host(cb.norm_matmul(xd[:m], gd, 1e-6, w, bd)), out[True][0][:m]
                )
    finally:
        cb.fuse_segment_pairs, cb.factored_products = keep


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.F16], ids=lambda q: q.name)
def test_matmul_batch_invariant(cb, rng, qtype):
    t = make_tensor(rng, 72, 1024, qtype)
    w = cb.prepare_matrix([t])
    x = cupy.asarray(rng.standard_normal((64, 1024)).astype(np.float32))
    full = cb.to_host(cb.matmul(x, w))
    for n in list(range(1, 18)) + [31, 32, 33, 47, 63, 64]:
        part = cb.to_host(cb.matmul(x[:n], w))
        assert np.array_equal(part, full[:n]), f"{n} rows differ from 64 rows"
    # one row at a time, from any offset, and odd chunkings
    for i in (0, 13, 63):
        assert np.array_equal(cb.to_host(cb.matmul(x[i : i + 1], w))[0], full[i])
    for chunk in (5, 7, 24):
        pieces = [cb.to_host(cb.matmul(x[s : s + chunk], w)) for s in range(0, 64, chunk)]
        assert np.array_equal(np.concatenate(pieces), full)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q8_0], ids=lambda q: q.name)
def test_fused_products_match_reference_and_compositions(cb, ref, rng, qtype):
    """norm_matmul (+bias), norm_matmul_glu and matmul_add against numpy, and each fused
    form bit-identical to the CUDA composition it replaces (the unfused fallback)."""
    d, n_ff = 512, 96
    gate_up = [make_tensor(rng, n_ff, d, qtype, "gate"), make_tensor(rng, n_ff, d, qtype, "up")]
    w = cb.prepare_matrix(gate_up)
    w_ref = ref.prepare_matrix(gate_up)
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    bias = rng.standard_normal(2 * n_ff).astype(np.float32)
    gd, bd = cb.prepare_vector(g), cb.prepare_vector(bias)
    for n in (1, 2, 5, 17):
        x = (3 * rng.standard_normal((n, d))).astype(np.float32)
        xd = cupy.asarray(x)
        h = ref.rms_norm(x, g, 1e-6)
        poison()
        got = cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w))
        assert rel_err(got, ref.matmul(h, w_ref)) < 1e-5
        with_bias = cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w, bd))
        assert np.array_equal(with_bias, cb.to_host(cb.add(cupy.asarray(got), bd)))
        for gelu in (False, True):
            poison()
            fused = cb.to_host(cb.norm_matmul_glu(xd, gd, 1e-6, w, n_ff, gelu))
            gate, up = cb.split(cb.norm_matmul(xd, gd, 1e-6, w), [n_ff, n_ff])
            unfused = cb.to_host(cb.gelu_tanh_mul(gate, up) if gelu else cb.silu_mul(gate, up))
            assert np.array_equal(fused, unfused), f"gated epilogue differs at {n} rows"
            rg, ru = np.split(ref.matmul(h, w_ref), 2, axis=1)
            want = ref.gelu_tanh_mul(rg, ru) if gelu else ref.silu_mul(rg, ru)
            assert rel_err(fused, want) < 1e-5
        res = rng.standard_normal((n, 2 * n_ff)).astype(np.float32)
        poison()
        got = cb.to_host(cb.matmul_add(xd, w, cupy.asarray(res)))
        want = cb.to_host(cb.add(cupy.asarray(res), cb.matmul(xd, w)))
        assert np.array_equal(got, want)


def test_fused_products_batch_invariant(cb, rng):
    """Norm, gate and residual epilogues keep every row's bits for any row count."""
    d, n_ff = 768, 200
    w = cb.prepare_matrix(
        [make_tensor(rng, n_ff, d, Q.Q4_K, "g"), make_tensor(rng, n_ff, d, Q.Q4_K, "u")]
    )
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    x = cupy.asarray(rng.standard_normal((40, d)).astype(np.float32))
    res = cupy.asarray(rng.standard_normal((40, 2 * n_ff)).astype(np.float32))
    ops = {
        "norm": lambda m: cb.norm_matmul(x[:m], gd, 1e-5, w),
        "glu": lambda m: cb.norm_matmul_glu(x[:m], gd, 1e-5, w, n_ff, False),
        "add": lambda m: cb.matmul_add(x[:m], w, res[:m]),
    }
    for name, op in ops.items():
        full = cb.to_host(op(40))
        for m in (1, 2, 3, 4, 8, 9, 16, 17, 33):
            assert np.array_equal(cb.to_host(op(m)), full[:m]), f"{name}: {m} rows differ"


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q4_K, Q.Q8_0], ids=lambda q: q.name)
def test_long_rows_split_k_matches_reference_and_is_batch_invariant(cb, ref, rng, qtype):
    """Rows of >= ksplit_min_k inputs take the block-shared (fixed split-K) kernels."""
    d = cb.ksplit_min_k + 512
    t = make_tensor(rng, 40, d, qtype)
    w, w_ref = cb.prepare_matrix([t]), ref.prepare_matrix([t])
    gate_up = cb.prepare_matrix([t, make_tensor(rng, 40, d, qtype, "up")])
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    x = rng.standard_normal((33, d)).astype(np.float32)
    xd = cupy.asarray(x)
    poison()
    full = cb.to_host(cb.matmul(xd, w))
    assert rel_err(full, ref.matmul(x, w_ref)) < REL_TOL
    glu = cb.to_host(cb.norm_matmul_glu(xd, gd, 1e-6, gate_up, 40, False))
    assert np.isfinite(glu).all()
    for m in (1, 2, 3, 5, 8, 16, 17):
        assert np.array_equal(cb.to_host(cb.matmul(xd[:m], w)), full[:m]), f"{m} rows differ"
        assert np.array_equal(
            cb.to_host(cb.norm_matmul_glu(xd[:m], gd, 1e-6, gate_up, 40, False)), glu[:m]
        )


def test_rope_store_equals_rope_and_write_cache(cb, rng):
    n, heads, kvh, hd = 5, 6, 2, 64
    qkv = cupy.asarray(rng.standard_normal((n, (heads + 2 * kvh) * hd)).astype(np.float32))
    q, k, v = cb.split(qkv, [heads * hd, kvh * hd, kvh * hd])
    q, k, v = (cb.reshape(a, (n, -1, hd)) for a in (q, k, v))
    pos = np.arange(20, 20 + n)
    for neox in (False, True):
        kc, vc = cb.empty_cache(64, kvh, hd), cb.empty_cache(64, kvh, hd)
        kr, vr = cb.empty_cache(64, kvh, hd), cb.empty_cache(64, kvh, hd)
        poison()
        got = cb.to_host(cb.rope_store(q, k, v, pos, 20, 1e4, neox, kc, vc))
        want = cb.to_host(cb.rope(q, pos, 1e4, neox))
        cb.write_cache(kr, 20, cb.rope(k, pos, 1e4, neox))
        cb.write_cache(vr, 20, v)
        assert np.array_equal(got, want)
        assert np.array_equal(cb.to_host(kc), cb.to_host(kr))
        assert np.array_equal(cb.to_host(vc), cb.to_host(vr))


def _fill_cache(cb, ref, rng, cap, kvh, hd, length):
    k = rng.standard_normal((length, kvh, hd)).astype(np.float32)
    v = rng.standard_normal((length, kvh, hd)).astype(np.float32)
    kc, vc = cb.empty_cache(cap, kvh, hd), cb.empty_cache(cap, kvh, hd)
    cb.write_cache(kc, 0, cupy.asarray(k))
    cb.write_cache(vc, 0, cupy.asarray(v))
    kr, vr = ref.empty_cache(cap, kvh, hd), ref.empty_cache(cap, kvh, hd)
    ref.write_cache(kr, 0, k)
    ref.write_cache(vr, 0, v)
    return kc, vc, kr, vr


@pytest.fixture(params=["tensor", "tensor-w8", "tensor-w4", "cuda-core", "cuda-core-g2", "cuda-core-g4"])
def attn(cb, request):
    """The backend with one attention kernel family: tensor-core (3xTF32 mma tiles; off by
    default) or CUDA-core (a warp per item, the default; "-gN": from 2 rows a warp takes N
    items at once, while one-row calls keep one, so decode == verify checks the grouped
    kernel against the plain one). "tensor" runs one-tile calls (decode) on 8-warp blocks,
    two-tile calls on 4-warp ones and the rest on blocks of two tiles, so decode == verify
    checks one form against another; "tensor-w8" runs every call on 8 warps a tile,
    "tensor-w4" on 4 warps and one tile a block. Each must match numpy and be batch-invariant;
    the two families need not give each other's bits."""
    keep = (
        cb.tensor_attention, cb.attn_split, cb.attn_items_per_warp,
        cb.tensor_attention_w8_max_tiles, cb.tensor_attention_min_group,
        cb.tensor_attention_pairs_min_tiles,
    )  # fmt: skip
    cb.tensor_attention = request.param.startswith("tensor")
    cb.tensor_attention_min_group = 0  # the family asked for, whatever the shape's group
    cb.tensor_attention_w8_max_tiles = {"tensor-w8": 1 << 20, "tensor-w4": 0}.get(request.param, 1)
    cb.tensor_attention_pairs_min_tiles = 0 if request.param == "tensor-w4" else 3
    cb.attn_items_per_warp = int(request.param[-1]) if "-g" in request.param else 1
    yield cb
    (
        cb.tensor_attention, cb.attn_split, cb.attn_items_per_warp,
        cb.tensor_attention_w8_max_tiles, cb.tensor_attention_min_group,
        cb.tensor_attention_pairs_min_tiles,
    ) = keep  # fmt: skip


@pytest.mark.parametrize(
    "heads,kvh,hd,window",
    [(9, 3, 64, 0), (12, 2, 128, 0), (4, 1, 256, 37), (8, 8, 64, 100), (6, 1, 96, 0)],
)
def test_attention_matches_reference(attn, ref, rng, heads, kvh, hd, window):
    cap, length = 600, 517
    kc, vc, kr, vr = _fill_cache(attn, ref, rng, cap, kvh, hd, length)
    positions = np.array(sorted(rng.choice(length, size=9, replace=False)))
    positions[-1] = length - 1
    q = rng.standard_normal((9, heads, hd)).astype(np.float32)
    scale = 1.0 / math.sqrt(hd)
    poison()
    got = attn.to_host(attn.attention(cupy.asarray(q), kc, vc, positions, window, scale))
    want = ref.attention(q, kr, vr, positions, window, scale)
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("split", [32, 64])
@pytest.mark.parametrize("hd,window", [(64, 0), (128, 0), (256, 300)])
def test_attention_batch_invariant(attn, ref, rng, hd, window, split):
    if attn.tensor_attention and split != 32:
        pytest.skip("the tensor-core kernel takes splits of 32 keys only")
    attn.attn_split = split
    cap, length, heads, kvh = 2048, 2000, 8, 2
    kc, vc, kr, vr = _fill_cache(attn, ref, rng, cap, kvh, hd, length)
    k = 17
    positions = np.arange(length - k, length)
    qh = rng.standard_normal((k, heads, hd)).astype(np.float32)
    q = cupy.asarray(qh)
    scale = 1.0 / math.sqrt(hd)
    full = attn.to_host(attn.attention(q, kc, vc, positions, window, scale))
    assert rel_err(full, ref.attention(qh, kr, vr, positions, window, scale)) < 1e-5
    for i in range(k):  # decode one row at a time == verify k rows
        one = attn.to_host(
            attn.attention(q[i : i + 1], kc, vc, positions[i : i + 1], window, scale)
        )
        assert np.array_equal(one[0], full[i])
    for a, b in ((0, 5), (5, 13), (13, 17)):  # any chunking of the rows, too
        part = attn.to_host(attn.attention(q[a:b], kc, vc, positions[a:b], window, scale))
        assert np.array_equal(part, full[a:b])
    bigger = attn.grow_cache(kc, 4096), attn.grow_cache(vc, 4096)  # capacity changes nothing
    again = attn.to_host(attn.attention(q, bigger[0], bigger[1], positions, window, scale))
    assert np.array_equal(again, full)


def test_attention_propagates_nan(attn, ref, rng):
    """A NaN in a row's query reaches that row's output and no other row's."""
    cap, length, heads, kvh, hd = 256, 200, 9, 3, 64
    kc, vc, _, _ = _fill_cache(attn, ref, rng, cap, kvh, hd, length)
    positions = np.arange(length - 4, length)
    q = rng.standard_normal((4, heads, hd)).astype(np.float32)
    q[2, 4, 7] = np.nan
    got = attn.to_host(attn.attention(cupy.asarray(q), kc, vc, positions, 0, 0.125))
    got = got.reshape(4, heads, hd)
    assert np.isnan(got[2, 4]).all()
    assert np.isfinite(np.delete(got.reshape(4 * heads, hd), 2 * heads + 4, axis=0)).all()


@pytest.mark.parametrize("bad", [np.inf, np.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("window", [0, 24])
def test_attention_nonfinite_v_after_a_row_is_not_seen(attn, ref, rng, bad, window):
    """A non-finite V at a later row's position never reaches an earlier row of the same
    verify (its weight there is 0, and 0 * inf must not become NaN): every row of a 20-row
    verify equals that row decoded alone, bit for bit, NaN where and only where it sees the
    bad value. Rows 16-19 straddle a 32-key split, as drafts do."""
    cap, heads, kvh, hd, k = 256, 9, 3, 64, 20
    length = 210  # positions 190..209: the split boundary at 192 falls inside the batch
    kc, vc, kr, vr = _fill_cache(attn, ref, rng, cap, kvh, hd, length)
    at = length - 6  # row 14's position
    vc[at, 1, 5] = bad
    vr[at, 1, 5] = bad
    positions = np.arange(length - k, length)
    qh = rng.standard_normal((k, heads, hd)).astype(np.float32)
    q = cupy.asarray(qh)
    poison()
    batch = attn.to_host(attn.attention(q, kc, vc, positions, window, 0.125))
    for i in range(k):
        poison()
        one = attn.to_host(
            attn.attention(q[i : i + 1], kc, vc, positions[i : i + 1], window, 0.125)
        )
        assert np.array_equal(one[0], batch[i], equal_nan=True), f"row {i}: decode != verify"
    rows = batch.reshape(k, heads, hd)
    lo = positions - window + 1 if window else np.zeros(k, dtype=int)
    sees = (positions >= at) & (lo <= at)
    assert np.isfinite(rows[~sees]).all(), "a row that cannot see the bad V is not finite"
    assert not np.isfinite(rows[sees][:, 3:6]).all(axis=None), "kv head 1's rows miss it"
    want = ref.attention(qh[~sees], kr, vr, positions[~sees], window, 0.125)
    assert rel_err(batch[~sees], want) < 1e-5


@pytest.mark.parametrize("heads,kvh,hd,window", [(9, 3, 64, 0), (12, 2, 128, 300)])
def test_attention_items_per_block_change_no_bits(cb, ref, rng, heads, kvh, hd, window):
    """Items per block of the CUDA-core attention kernel (warps looping over several
    (row, head) items) is a speed choice: any value gives the same bits, and matches numpy."""
    cap, length, k = 1024, 1000, 16
    kc, vc, kr, vr = _fill_cache(cb, ref, rng, cap, kvh, hd, length)
    positions = np.arange(length - k, length)
    qh = rng.standard_normal((k, heads, hd)).astype(np.float32)
    q = cupy.asarray(qh)
    scale = 1.0 / math.sqrt(hd)
    keep = cb.attn_items, cb.tensor_attention, cb.attn_items_per_warp, cb.tensor_attention_min_group
    cb.tensor_attention, cb.tensor_attention_min_group = False, 0
    try:
        out = {}
        for ipw in (1, 2, 4):  # items a warp takes at once (the grouped kernels)
            cb.attn_items_per_warp = ipw
            for items in (8, 1, 5, 16, 24, 48, 64):
                cb.attn_items = items
                poison()
                out[ipw, items] = cb.to_host(cb.attention(q, kc, vc, positions, window, scale))
                assert np.array_equal(out[ipw, items], out[1, 8]), f"{ipw}x{items} items differ"
                one = cb.to_host(cb.attention(q[3:4], kc, vc, positions[3:4], window, scale))
                assert np.array_equal(one[0], out[1, 8][3])
        assert rel_err(out[1, 8], ref.attention(qh, kr, vr, positions, window, scale)) < 1e-5
    finally:
        cb.attn_items, cb.tensor_attention, cb.attn_items_per_warp, cb.tensor_attention_min_group = keep


def test_rms_norm_rope_and_elementwise(cb, ref, rng):
    x = rng.standard_normal((7, 6, 64)).astype(np.float32) * 3
    wv = rng.standard_normal(64).astype(np.float32)
    wd = rng.standard_normal(384).astype(np.float32)
    pos = rng.integers(0, 5000, size=7)
    xd = cupy.asarray(x)
    poison()
    assert (
        rel_err(cb.to_host(cb.rms_norm(xd, cb.prepare_vector(wv), 1e-6)), ref.rms_norm(x, wv, 1e-6))
        < 1e-6
    )
    flat = x.reshape(7, 384)
    got = cb.rms_norm(cupy.asarray(flat), cb.prepare_vector(wd), 1e-5)
    assert rel_err(cb.to_host(got), ref.rms_norm(flat, wd, 1e-5)) < 1e-6
    for neox in (False, True):
        for base in (10000.0, 1e6):
            got = cb.to_host(cb.rope(xd, pos, base, neox))
            assert rel_err(got, ref.rope(x, pos, base, neox)) < 1e-6
    a = rng.standard_normal((5, 96)).astype(np.float32) * 4
    b = rng.standard_normal((5, 96)).astype(np.float32)
    ad, bd = cupy.asarray(a), cupy.asarray(b)
    assert rel_err(cb.to_host(cb.silu_mul(ad, bd)), ref.silu_mul(a, b)) < 1e-6
    assert rel_err(cb.to_host(cb.gelu_tanh_mul(ad, bd)), ref.gelu_tanh_mul(a, b)) < 1e-6
    bias = b[0]
    assert rel_err(cb.to_host(cb.add(ad, cb.prepare_vector(bias))), ref.add(a, bias)) < 1e-7
    assert rel_err(cb.to_host(cb.scale(ad, 0.37)), ref.scale(a, 0.37)) < 1e-7


def test_split_views_feed_kernels(cb, ref, rng):
    """q|k|v views of one product (strided rows) give what contiguous inputs give."""
    qkv = rng.standard_normal((4, 3 * 128)).astype(np.float32)
    q, k, v = cb.split(cupy.asarray(qkv), [128, 128, 128])
    pos = np.arange(10, 14)
    got = cb.to_host(cb.rope(cb.reshape(k, (4, 2, 64)), pos, 1e4, True))
    want = ref.rope(qkv[:, 128:256].reshape(4, 2, 64), pos, 1e4, True)
    assert rel_err(got, want) < 1e-6
    cache = cb.empty_cache(32, 2, 64)
    cb.write_cache(cache, pos, cb.reshape(v, (4, 2, 64)))  # positions as destinations
    host = cb.to_host(cache)
    np.testing.assert_array_equal(host[10:14].reshape(4, 128), qkv[:, 256:])
    assert not host[:10].any() and not host[14:].any()


def test_argmax_ties_to_lowest(cb, rng):
    logits = rng.standard_normal((6, 50000)).astype(np.float32)
    logits[2, [7, 4000, 49999]] = 100.0
    logits[4, [31000, 30999]] = 55.0
    got = cb.argmax(cupy.asarray(logits))
    np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
    assert got[2] == 7 and got[4] == 30999


def test_argmax_parts_equal_one_block(cb, rng, monkeypatch):
    """The two-launch argmax of long rows (parts of ARGMAX_CHUNK ids) == the one-block kernel
    == numpy: ties inside a part and across parts (lowest id), NaN skipped, -inf rows; and
    its feed writes the last row's id and moves the position on."""
    from echoline.engine.backends import cupy_backend

    v = 151936
    logits = rng.standard_normal((7, v)).astype(np.float32)
    chunk = cupy_backend.ARGMAX_CHUNK
    logits[1, [chunk - 1, chunk, 5 * chunk + 3]] = 80.0  # a tie across a part boundary
    logits[2, [v - 1, v - 2]] = 60.0  # in the last, partial part
    logits[3, ::7] = np.nan
    logits[3, 9999] = 70.0
    logits[4, :] = -np.inf
    logits[5, 123] = np.inf
    want = np.array([0 if np.all(np.isnan(r) | (r == -np.inf)) else int(np.nanargmax(r)) for r in logits])
    got = cb.argmax(cupy.asarray(logits))
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(cupy_backend, "ARGMAX_ONE_BLOCK_MAX", 1 << 30)
    np.testing.assert_array_equal(cb.argmax(cupy.asarray(logits)), want)
    monkeypatch.undo()
    ids, pos = cupy.array([5], dtype=cupy.int32), cupy.array([41], dtype=cupy.int32)
    out = cb.argmax_feed(cupy.asarray(logits), ids, pos)
    np.testing.assert_array_equal(out.get(), want)
    assert int(ids.get()[0]) == want[-1] and int(pos.get()[0]) == 42


# ---- whole model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory, cb):
    from echoline.engine.models.loader import load_model

    from tests.synth import write_model

    out = {}
    for arch, qtype, kw in (
        ("llama", Q.Q4_1, dict(d_model=128, n_ff=256, n_heads=4, n_kv_heads=2)),
        ("qwen2", Q.Q4_K, dict(d_model=256, n_ff=512, n_heads=4, n_kv_heads=2)),
        ("gemma3", Q.Q5_0, dict(d_model=128, n_ff=256, n_heads=2, n_kv_heads=1, head_dim=256)),
    ):
        path = write_model(
            tmp_path_factory.mktemp(arch) / "m.gguf", arch, qtype=qtype, vocab=300, **kw
        )
        out[arch] = (load_model(path, cb)[1], load_model(path, "numpy")[1])
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_model_forward_matches_numpy(models, arch, rng):
    gpu, cpu = models[arch]
    ids = rng.integers(0, 300, size=21)
    got = gpu.backend.to_host(gpu.forward(ids, gpu.new_cache(64)))
    want = cpu.forward(ids, cpu.new_cache(64))
    assert rel_err(got, want) < 1e-4


@pytest.mark.parametrize("arch,qtype", [("llama", Q.IQ4_NL), ("qwen2", Q.IQ4_XS)], ids=["iq4_nl", "iq4_xs"])
def test_iq4_model_matches_numpy_and_decode_equals_verify(tmp_path, cb, arch, qtype, rng):
    """A whole model in IQ4_NL / IQ4_XS (the tensor-core products of their non-linear levels):
    close to the numpy reference (gguf's own dequantization), and rows one at a time == all
    at once, bit for bit."""
    from echoline.engine.models.loader import load_model

    from tests.synth import write_model

    path = write_model(tmp_path / "iq4.gguf", arch, qtype=qtype, vocab=300, d_model=256, n_ff=512,
                       n_heads=4, n_kv_heads=2)
    from echoline.engine.gguf_file import GGUFFile

    assert GGUFFile(path).tensor("blk.0.ffn_up.weight").qtype == qtype
    gpu, cpu = load_model(path, cb)[1], load_model(path, "numpy")[1]
    ids = rng.integers(0, 300, size=21)
    whole = gpu.backend.to_host(gpu.forward(ids, gpu.new_cache(64)))
    assert rel_err(whole, cpu.forward(ids, cpu.new_cache(64))) < 1e-4
    cache = gpu.new_cache(16)
    parts = [gpu.backend.to_host(gpu.forward(ids[s:e], cache)) for s, e in ((0, 1), (1, 2), (2, 11), (11, 21))]
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_model_decode_equals_verify_and_warm_equals_cold(models, arch, rng):
    """Rows computed one at a time, k at a time, or in odd prefill chunks are bit-identical."""
    gpu, _ = models[arch]
    b = gpu.backend
    ids = rng.integers(0, 300, size=40)
    cache = gpu.new_cache(16)  # grows while running: growth must change nothing
    whole = b.to_host(gpu.forward(ids, cache))
    cache = gpu.new_cache(16)
    parts = []
    for s, e in ((0, 1), (1, 8), (8, 9), (9, 25), (25, 40)):
        parts.append(b.to_host(gpu.forward(ids[s:e], cache)))
    assert np.array_equal(np.concatenate(parts), whole)
    # warm: truncate and re-run the tail over the kept prefix
    cache.truncate(30)
    again = b.to_host(gpu.forward(ids[30:], cache))
    assert np.array_equal(again, whole[30:])


def without_graphs(b, run):
    """``run()`` with the backend's forwards eager (no graph replays), the setting restored."""
    graph_rows = b.graph_max_rows
    b.graph_max_rows = 0
    try:
        return run()
    finally:
        b.graph_max_rows = graph_rows


def test_graph_replay_equals_eager(models, rng):
    gpu, _ = models["qwen2"]
    b = gpu.backend
    cache = gpu.new_cache(128)
    prompt = rng.integers(0, 300, size=20)
    eager = b.to_host(gpu.forward(prompt, cache))

    def step(ids_dev, pos_dev):
        x = b.embed(gpu.embedding, ids_dev)
        for li, lw in enumerate(gpu.layers):
            x = gpu._block(x, li, lw, cache, pos_dev, pos_dev)
        return b.norm_matmul(x, gpu.output_norm, gpu.config.rms_eps, gpu.output)

    cache.truncate(10)
    from echoline.engine.backends import cupy_backend

    for i in range(10, 20):  # the first GRAPH_AFTER - 1 calls run eagerly, then capture, replays
        out = b.to_host(b.run_graph(("decode", 1), step, [prompt[i : i + 1], np.array([i])]))
        assert np.array_equal(out[0], eager[i]), f"graph step at {i} differs from eager"
        captured = ("decode", 1) in b._graphs
        assert captured == (i - 10 + 1 >= cupy_backend.GRAPH_AFTER), (i, captured)
    b.drop_graphs()


def test_later_captures_of_a_key_skip_the_eager_run(models, rng, monkeypatch):
    """A key's first capture runs its step eagerly, then captures; the same key on another
    owner's buffers (a new cache) captures at once and replays: one call of the step, not
    two, and the same bits as the eager forward."""
    gpu, _ = models["qwen2"]
    b = gpu.backend
    from echoline.engine.backends import cupy_backend

    monkeypatch.setattr(cupy_backend, "GRAPH_AFTER", 1)
    prompt = rng.integers(0, 300, size=12)
    want = without_graphs(b, lambda: b.to_host(gpu.forward(prompt, gpu.new_cache(32))))

    def run(cache, eager_every: bool) -> tuple[int, np.ndarray]:
        calls = []
        forward = gpu.graph_step(cache, 1, True)  # what the model's own graphs capture

        def step(ids_dev, pos_dev):
            calls.append(1)
            return forward(ids_dev, pos_dev)

        monkeypatch.setattr(cupy_backend, "GRAPH_EAGER_EVERY", eager_every)
        for i in range(11):  # the prefix, through this cache's one-row graph
            gpu.forward(prompt[i : i + 1], cache)
        out = b.run_graph(("cold-capture", 1), step, [prompt[11:], np.array([11])], owner=cache.buffers,
                          generation=cache.capacity)
        return len(calls), b.to_host(out)[0]

    b._eager_keys.discard(("cold-capture", 1))
    b.cold_capture_fallback = None
    first = run(gpu.new_cache(32), eager_every=False)
    later = run(gpu.new_cache(32), eager_every=False)
    every = run(gpu.new_cache(32), eager_every=True)
    assert (first[0], later[0], every[0]) == (2, 1, 2), b.cold_capture_fallback
    assert b.cold_capture_fallback is None
    for calls, row in (first, later, every):
        assert np.array_equal(row, want[11]), calls


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_forward_graph_path_equals_eager_path(models, arch, rng):
    """Transformer.forward's graph path (≤ graph_max_rows rows) == eager path, bit for bit,
    across replays, cache growth (new graphs) and a truncated warm rerun."""
    gpu, _ = models[arch]
    b = gpu.backend
    ids = rng.integers(0, 300, size=60)
    eager = without_graphs(b, lambda: b.to_host(gpu.forward(ids, gpu.new_cache(64))))
    cache = gpu.new_cache(16)  # grows twice below: graphs of the old buffers must be dropped
    parts = []
    for s, e in ((0, 5), (5, 6), (6, 7), (7, 24), (24, 25), (25, 42), (42, 43), (43, 60)):
        parts.append(b.to_host(gpu.forward(ids[s:e], cache)))
    assert np.array_equal(np.concatenate(parts), eager)
    for start in (50, 45, 40):  # warm reruns replay the same graphs
        cache.truncate(start)
        rows = b.to_host(gpu.forward(ids[start : start + 3], cache))
        assert np.array_equal(rows, eager[start : start + 3])
    last = b.to_host(gpu.forward(ids[43:48], cache, all_logits=False))
    assert np.array_equal(last[0], eager[47])


def test_graph_forwards_queued_without_reads_stay_ordered(models, rng):
    """The doctor's pattern: fresh caches, a prefix decoded without reading any logits
    (nothing synchronizes), then k rows. Graph replays must stay ordered with the
    next graph's first run (they once ran on separate streams and raced)."""
    gpu, _ = models["llama"]
    b = gpu.backend
    ids = rng.integers(0, 300, size=48)

    def rows(k: int) -> np.ndarray:
        cache = gpu.new_cache(len(ids) + 8)
        for t in ids[:32]:
            gpu.forward([t], cache, all_logits=False)
        return b.to_host(gpu.forward(ids[32 : 32 + k], cache))[0]

    want = without_graphs(b, lambda: rows(1))
    for k in (1, 2, 8, 16, 1):
        assert np.array_equal(rows(k), want), f"{k} rows after a queued prefix"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_chained_decode_equals_stepwise(models, arch, rng):
    """Plain decoding with steps chained on the device (engine/step_chain.py: the graph feeds
    its own argmax to its next replay) == each step waiting for its id: ids, finish reason
    and every cache row, with stop ids, the budget, cache growth mid-reply and a cancel."""

    from echoline.engine.generate import StopRules, generate_tokens
    from echoline.engine.types import GenerationStats

    gpu, _ = models[arch]
    b = gpu.backend

    def gen(prompt, rules, capacity, chain, cancel_after=None):
        b.graph_chain = chain
        cache = gpu.new_cache(capacity)
        cancel, on_token = cancelling.cancel_after(cancel_after)
        try:
            res = generate_tokens(gpu, cache, prompt, decode=lambda ids: "", rules=rules, cancel=cancel,
                                  on_token=on_token, stats=GenerationStats())
        finally:
            del b.graph_chain
        n = cache.length
        rows = [b.to_host(k[:n]) for k in cache.k] + [b.to_host(v[:n]) for v in cache.v]
        return res, n, rows

    for trial in range(6):
        prompt = [int(t) for t in rng.integers(0, 300, size=int(rng.integers(1, 30)))]
        free, _, _ = gen(prompt, StopRules(max_tokens=40), 256, False)
        stop = frozenset({free.token_ids[int(rng.integers(0, 40))]}) if trial % 2 else frozenset()
        rules = StopRules(max_tokens=int(rng.integers(1, 41)), stop_ids=stop)
        capacity = 8 if trial % 3 == 0 else 256  # 8: the cache grows mid-reply
        want = gen(prompt, rules, capacity, False)
        got = gen(prompt, rules, capacity, True)
        assert got[0].token_ids == want[0].token_ids and got[0].finish_reason == want[0].finish_reason
        assert got[1] == want[1] == len(prompt) + len(want[0].token_ids)
        assert all(np.array_equal(x, y) for x, y in zip(got[2], want[2], strict=True))
    cut = gen(prompt, StopRules(max_tokens=40), 256, True, cancel_after=7)
    assert cut[0].finish_reason == "cancelled" and cut[0].token_ids == free.token_ids[:7]
    assert cut[1] == len(prompt) + 7


@pytest.mark.parametrize("early", [False, True], ids=["release-at-exit", "release-at-start"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_programmatic_launch_changes_no_bits(models, arch, early, rng):
    """Kernels launched to overlap the one before them (kernels/cuda/launch.py) give the
    plain launches' bits: an eager prefill, graph decode steps and verify rows, and a
    chained plain reply with every cache row."""
    from echoline.engine.generate import StopRules, generate_tokens
    from echoline.engine.types import GenerationStats
    from echoline.kernels.cuda.launch import ProgrammaticKernel

    gpu, _ = models[arch]
    b = gpu.backend
    if not b._pdl_ok:
        pytest.skip("programmatic dependent launch needs sm_90 or later and driver 12.3+")
    ids = rng.integers(0, 300, size=60)
    prompt = [int(t) for t in ids[:19]]

    def run(pdl: bool):
        keep = b.programmatic_launch, b.programmatic_early
        b.programmatic_launch, b.programmatic_early = pdl, early
        b.drop_graphs()  # graphs captured with the other launches must not be replayed
        try:
            assert isinstance(b._k("rms_norm"), ProgrammaticKernel) == pdl
            cache = gpu.new_cache(128)
            rows = [b.to_host(without_graphs(b, lambda: gpu.forward(ids[:24], cache)))]  # eager
            for s in range(24, 30):  # one row at a time: graph replays
                rows.append(b.to_host(gpu.forward(ids[s : s + 1], cache)))
            rows.append(b.to_host(gpu.forward(ids[30:46], cache)))  # a 16-row verify
            rows.append(b.to_host(gpu.forward(ids[46:60], cache)))
            reply_cache = gpu.new_cache(128)
            reply = generate_tokens(gpu, reply_cache, prompt, decode=lambda t: "",
                                    rules=StopRules(max_tokens=30), stats=GenerationStats())
            n = reply_cache.length
            kv = [b.to_host(k[:n]) for k in reply_cache.k] + [b.to_host(v[:n]) for v in reply_cache.v]
            return np.concatenate(rows), reply.token_ids, kv
        finally:
            b.programmatic_launch, b.programmatic_early = keep
            b.drop_graphs()

    plain, on = run(False), run(True)
    assert np.array_equal(on[0], plain[0])
    assert on[1] == plain[1] and len(on[1]) == 30
    assert all(np.array_equal(x, y) for x, y in zip(on[2], plain[2], strict=True))


# ---- tensor-core products (round 6: CupyBackend.tensor_products, kernels.cu mt_body) ----
TC_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]


#: the form the running tensor-core test computes in (``tensor_on`` sets it; tc_check reads it)
TC_FORM = {"int8": False}


@pytest.fixture(params=["f16", "int8"])
def tensor_on(cb, request):
    """The tensor-core products, in the f16 form and in the integer form (tensor_int8): every
    test that takes this fixture runs in both."""
    keep = cb.tensor_products, cb.tensor_int8, cb.tensor_int8_min_dim, cb.tensor_int8_batch_min_rows
    cb.tensor_products = True
    cb.tensor_int8 = TC_FORM["int8"] = request.param == "int8"
    cb.tensor_int8_min_dim = 0  # f16: no weight takes the integer form by its size
    # the families under test at every row count (the staged many-row kernels that replace
    # them past 16 rows by default have their own tests, test_row_kernels_*)
    cb.tensor_int8_batch_min_rows = 0
    cb.drop_graphs()
    yield cb
    cb.tensor_products, cb.tensor_int8, cb.tensor_int8_min_dim, cb.tensor_int8_batch_min_rows = keep
    TC_FORM["int8"] = False
    cb.drop_graphs()


def xprep_rows_field() -> str:
    """The setting that decides whether mt_body's kernels read x prepared once per product, in
    the running form."""
    return "tensor_int8_xprep_min_rows" if TC_FORM["int8"] else "tensor_xprep_min_rows"


def tc_check(
    w: np.ndarray, x: np.ndarray, got: np.ndarray, scale: np.ndarray | None = None
) -> None:
    """got against W·x with x rounded as the kernel does (elementwise, float32 accumulation
    bound: 4·K·2^-24 Σ|w||x| for the per-group scale, min and warp sums), and against the
    exact product within f16-input bounds (‖err‖/‖ref‖ < 1e-3; f16 inputs land near 3e-4).
    The integer form: within its quantization bound of the exact product (elementwise, plus
    the same accumulation bound), ‖err‖/‖ref‖ < 5e-2 (a numpy emulation of its int8 x over 60
    draws of these tests' data reached 1.3e-2 for Q4_K and 2.0e-2 for Q5_K at one row)."""
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), "NaN/inf in output: an element was never written"
    w64 = w.astype(np.float64)
    s = np.ones((x.shape[0], 1)) if scale is None else scale[:, None]
    mag = s * (np.abs(x).astype(np.float64) @ np.abs(w64).T)
    bound = 4 * w.shape[1] * 2.0**-24 * mag + 1e-30
    exact = s * (x.astype(np.float64) @ w64.T)
    if TC_FORM["int8"]:
        want, bound = exact, bound + s * int8_error_bound(x, w64)
    else:
        want = s * (tc_round(x) @ w64.T)
    worst = float(np.max(np.abs(got - want) / bound))
    assert worst <= 1.0, f"off the rounded-x reference by {worst:.2f}x its bound"
    assert rel_err(got, exact) < (5e-2 if TC_FORM["int8"] else 1e-3)


def wide_range_x(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Normal rows with some 64-units scaled far beyond f16's range and some tiny ones."""
    x = rng.standard_normal((n, d)).astype(np.float32)
    grp = x.reshape(n, -1, 64)
    grp *= rng.choice([1.0, 1.0, 1.0, 3e5, 1e-6], size=(n, grp.shape[1], 1)).astype(np.float32)
    return x


#: (tensor_wide_min_blocks, tensor_min_warps_per_sm) -> the (MT, KW) they give small test weights
TC_POLICIES = {"m2w4": (0, 8), "m1w4": (10**6, 0), "m1w8-16": (10**6, 8), "m1w16": (10**6, 10**6)}


@pytest.fixture
def tc_policy(cb):
    keep = cb.tensor_wide_min_blocks, cb.tensor_min_warps_per_sm
    yield lambda name: setattr_pair(cb, TC_POLICIES[name])
    cb.tensor_wide_min_blocks, cb.tensor_min_warps_per_sm = keep


def setattr_pair(cb, policy: tuple[int, int]) -> None:
    cb.tensor_wide_min_blocks, cb.tensor_min_warps_per_sm = policy


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
def test_tensor_products_match_reference(tensor_on, tc_policy, ref, rng, qtype):
    """Every (MT, KW) launch shape within the f16 bounds; MT (columns per warp) changes
    no bits."""
    cb = tensor_on
    d = 1024
    t = make_tensor(rng, 100, d, qtype)  # 100 columns: a partial 16-column tile
    w, w_ref = cb.prepare_matrix([t]), ref.prepare_matrix([t])
    assert cb._tensor(w)
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    gd = cb.prepare_vector(g)
    for n in (1, 3, 16, 40):
        x = wide_range_x(rng, n, d)
        xd = cupy.asarray(x)
        inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1) + 1e-6)
        got = {}
        for policy in TC_POLICIES:
            tc_policy(policy)
            poison()
            got[policy] = cb.to_host(cb.matmul(xd, w))
            tc_check(w_ref, x, got[policy])
            # fused norm: x * g is what gets rounded; inv_rms(row) scales the total
            poison()
            normed = cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w))
            tc_check(w_ref, (x * g).astype(np.float32), normed, scale=inv)
        assert np.array_equal(got["m2w4"], got["m1w4"])


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("policy", ["m2w4", "m1w8-16"])
def test_tensor_products_batch_invariant(tensor_on, tc_policy, rng, qtype, policy):
    """The same mma kernels for every row count: rows 1, 2, 8, 16, 64 (and odd counts,
    offsets, chunkings) bit-identical, plain and with norm, gate and residual epilogues."""
    cb = tensor_on
    tc_policy(policy)
    d, n_ff = 512, 72
    gate_up = cb.prepare_matrix(
        [make_tensor(rng, n_ff, d, qtype, "g"), make_tensor(rng, n_ff, d, qtype, "u")]
    )
    assert cb._tensor(gate_up)
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    x = cupy.asarray(wide_range_x(rng, 64, d))
    res = cupy.asarray(rng.standard_normal((64, 2 * n_ff)).astype(np.float32))
    ops = {  # rows [s, e) of x (and of the residual)
        "plain": lambda s, e: cb.matmul(x[s:e], gate_up),
        "norm": lambda s, e: cb.norm_matmul(x[s:e], gd, 1e-5, gate_up),
        "glu": lambda s, e: cb.norm_matmul_glu(x[s:e], gd, 1e-5, gate_up, n_ff, True),
        "add": lambda s, e: cb.matmul_add(x[s:e], gate_up, res[s:e]),
    }
    assert_rows_invariant(cb, ops)
    # gated epilogue == product then activation (same act_glu), bit for bit
    gate, up = cb.split(cb.norm_matmul(x, gd, 1e-5, gate_up), [n_ff, n_ff])
    assert np.array_equal(cb.to_host(cb.gelu_tanh_mul(gate, up)), cb.to_host(ops["glu"](0, 64)))
    assert np.array_equal(
        cb.to_host(ops["add"](0, 64)), cb.to_host(cb.add(res, ops["plain"](0, 64)))
    )


def test_tensor_two_type_weight_one_launch(tensor_on, ref, rng):
    """q|k (Q4_K) + v (Q6_K) in one mt2 launch == its two per-segment launches, bit for
    bit, with norm and bias; within the f16 bounds; batch-invariant."""
    cb = tensor_on
    d = 768
    parts = [make_tensor(rng, 96, d, Q.Q4_K, "qk"), make_tensor(rng, 40, d, Q.Q6_K, "v")]
    w, w_ref = cb.prepare_matrix(parts), ref.prepare_matrix(parts)
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    bias = rng.standard_normal(136).astype(np.float32)
    gd, bd = cb.prepare_vector(g), cb.prepare_vector(bias)
    x = wide_range_x(rng, 40, d)
    xd = cupy.asarray(x)
    keep = cb.fuse_segment_pairs
    try:
        out = {}
        for fused in (False, True):
            cb.fuse_segment_pairs = fused
            poison()
            out[fused] = cb.to_host(cb.norm_matmul(xd, gd, 1e-6, w, bd))
        assert np.array_equal(out[True], out[False])
        inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1) + 1e-6)
        tc_check(w_ref, (x * g).astype(np.float32), out[True] - bias, scale=inv)
        for m in (1, 2, 8, 16, 17):
            assert np.array_equal(
                cb.to_host(cb.norm_matmul(xd[:m], gd, 1e-6, w, bd)), out[True][:m]
            )
    finally:
        cb.fuse_segment_pairs = keep


def _tensor_launch_ops(cb, rng, qtype, d: int, rows: int = 17) -> dict:
    """Product launches of every kind (plain, norm, gated, residual, two-type pair with bias
    or residual) over ``m`` rows (at most ``rows``) of one fixed input: what the speed
    settings must not change."""
    n_ff = 72
    gate_up = cb.prepare_matrix(
        [make_tensor(rng, n_ff, d, qtype, "g"), make_tensor(rng, n_ff, d, qtype, "u")]
    )
    pair = cb.prepare_matrix(
        [make_tensor(rng, 96, d, Q.Q4_K, "qk"), make_tensor(rng, 40, d, Q.Q6_K, "v")]
    )
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    x = cupy.asarray(wide_range_x(rng, rows, d))
    res = cupy.asarray(rng.standard_normal((rows, 2 * n_ff)).astype(np.float32))
    res2 = cupy.asarray(rng.standard_normal((rows, 136)).astype(np.float32))
    bias = cb.prepare_vector(rng.standard_normal(136).astype(np.float32))
    return {  # gate|up is one segment (one type); "pair*" take the two-segment launch
        "plain": lambda m: cb.matmul(x[:m], gate_up),
        "norm": lambda m: cb.norm_matmul(x[:m], gd, 1e-5, gate_up),
        "glu": lambda m: cb.norm_matmul_glu(x[:m], gd, 1e-5, gate_up, n_ff, False),
        "add": lambda m: cb.matmul_add(x[:m], gate_up, res[:m]),
        "pair+bias": lambda m: cb.norm_matmul(x[:m], gd, 1e-6, pair, bias),
        "pair+res": lambda m: cb.matmul_add(x[:m], pair, res2[:m]),
    }


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_tensor_row_split_changes_no_bits(tensor_on, rng, qtype):
    """9-17-row launches split into parallel 8-row blocks (grid y) or run their passes in
    one block: the same bits, for plain, norm, residual, gated and two-type (pair) launches,
    and each row equals its one-row call."""
    cb = tensor_on
    ops = _tensor_launch_ops(cb, rng, qtype, 512)
    keep = cb.tensor_row_split_warps_per_sm, cb.tensor_row_split_one_wave
    cb.tensor_row_split_one_wave = False
    try:
        for name, op in ops.items():
            cb.tensor_row_split_warps_per_sm = 1000
            assert cb._row_passes(17, 10) == (1, 3)
            split = {m: cb.to_host(op(m)) for m in (9, 12, 16, 17)}
            cb.tensor_row_split_warps_per_sm = 0
            assert cb._row_passes(17, 10) == (4, 1)
            for m, got in split.items():
                poison()
                assert np.array_equal(cb.to_host(op(m)), got), f"{name}: {m} rows differ"
            one = cb.to_host(op(1))
            assert np.array_equal(one[0], split[17][0]), f"{name}: row 0 alone"
    finally:
        cb.tensor_row_split_warps_per_sm, cb.tensor_row_split_one_wave = keep


def spy_kernels(cb, monkeypatch) -> list[str]:
    """The names of the kernels ``cb`` looks up from now on (``_k``), in order, until the
    test ends."""
    launched: list[str] = []
    k = cb._k

    def spy(name, *args, **kwargs):
        launched.append(name)
        return k(name, *args, **kwargs)

    monkeypatch.setattr(cb, "_k", spy)
    return launched


#: (tensor_max_row_tiles, tensor_min_blocks_rows): speed choices past 16 rows, the default first
ROW_PASS_BUILDS = ((4, 0), (4, 3), (8, 2), (8, 0))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("policy", ["m2w4", "m1w8-16", "m1w16"])
def test_tensor_row_pass_builds_change_no_bits(tensor_on, tc_policy, rng, monkeypatch, qtype, policy):
    """Launches past 32 rows with eight 8-row tiles per pass (NT 8: kernels ``_n8_``, modules
    "@t8") where the kernel is built for it (KW 4 and 8; KW 16 keeps NT 4), or four, and the
    kernels past 16 rows under another register bound (``tensor_min_blocks_rows``, modules
    "@rN"): the same bits for plain, norm, gated, residual and two-type launches, and each
    row equals its one-row call."""
    cb = tensor_on
    tc_policy(policy)
    # KW by shape (_tensor_shape): 4 warps with two tiles, 8 where K has fewer than 8 units, else 16
    d, kw_want = {"m2w4": (512, 4), "m1w8-16": (256, 8), "m1w16": (512, 16)}[policy]
    n_ff, n = 72, 64
    gate_up = cb.prepare_matrix([make_tensor(rng, n_ff, d, qtype, "g"), make_tensor(rng, n_ff, d, qtype, "u")])
    pair = cb.prepare_matrix([make_tensor(rng, 96, d, Q.Q4_K, "qk"), make_tensor(rng, 40, d, Q.Q6_K, "v")])
    assert cb._tensor(gate_up) and cb._tensor(pair)
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    x = cupy.asarray(wide_range_x(rng, n, d))
    res = cupy.asarray(rng.standard_normal((n, 2 * n_ff)).astype(np.float32))
    res2 = cupy.asarray(rng.standard_normal((n, 136)).astype(np.float32))
    ops = {
        "plain": lambda m: cb.matmul(x[:m], gate_up),
        "norm": lambda m: cb.norm_matmul(x[:m], gd, 1e-5, gate_up),
        "glu": lambda m: cb.norm_matmul_glu(x[:m], gd, 1e-5, gate_up, n_ff, False),
        "add": lambda m: cb.matmul_add(x[:m], gate_up, res[:m]),
        "pair+res": lambda m: cb.matmul_add(x[:m], pair, res2[:m]),
    }
    launched = spy_kernels(cb, monkeypatch)
    keep = cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows
    rows = (24, 33, 40, n)
    try:
        for name, op in ops.items():
            got = {}
            for tiles, minb in ROW_PASS_BUILDS:
                cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows = tiles, minb
                launched.clear()
                poison()
                got[tiles, minb] = {m: cb.to_host(op(m)) for m in rows}
                mt_names = [f for f in launched if f.startswith(("mt_", "mt2_"))]
                assert len(mt_names) == len(rows), (name, launched)  # one product launch a row count
                assert all(f.endswith(f"_w{kw_want}") for f in mt_names), (name, kw_want, mt_names)
                want = "_n8_" if tiles == 8 and kw_want <= 8 else "_n4_"
                assert "_n4_" in mt_names[0] and all(want in f for f in mt_names[1:]), (name, tiles, mt_names)
                for m in rows:
                    assert np.array_equal(got[tiles, minb][m], got[ROW_PASS_BUILDS[0]][m]), (
                        f"{name}: {m} rows, NT {tiles} / bound {minb} against the default")
                    assert np.array_equal(got[tiles, minb][n][:m], got[tiles, minb][m]), f"{name}: {m} rows against {n}"
            one = cb.to_host(op(1))
            assert np.array_equal(one[0], got[ROW_PASS_BUILDS[0]][n][0]), f"{name}: row 0 alone"
    finally:
        cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows = keep


def test_tensor_row_split_only_in_one_wave(tensor_on, rng, monkeypatch):
    """A row split whose grid would not fit in one wave of resident blocks runs its passes
    in one block instead (``tensor_row_split_one_wave``), with the same bits as the split."""
    cb = tensor_on
    ops = _tensor_launch_ops(cb, rng, Q.Q4_K, 512)
    w = cb.prepare_matrix([make_tensor(rng, 256, 512, Q.Q4_K, "w")])
    mt, kw = cb._tensor_shape(w, 0)
    xblocks = (256 + 16 * mt - 1) // (16 * mt)
    keep = cb.tensor_row_split_warps_per_sm, cb.tensor_row_split_one_wave
    try:
        cb.tensor_row_split_warps_per_sm = 1000
        cb.tensor_row_split_one_wave = True
        assert cb._row_plan(w, 16, mt, kw, xblocks, False) == (1, 2)  # fits: split
        split = {name: cb.to_host(op(16)) for name, op in ops.items()}
        monkeypatch.setattr(cb, "_resident_blocks", lambda fn, smem, warps=1: xblocks)
        assert cb._row_plan(w, 16, mt, kw, xblocks, False) == (2, 1)  # a second wave: passes
        assert cb._row_plan(w, 17, mt, kw, xblocks, False) == (4, 1)
        assert cb._row_plan(w, 8, mt, kw, xblocks, False) == (1, 1)
        for name, op in ops.items():
            poison()
            assert np.array_equal(cb.to_host(op(16)), split[name]), name
    finally:
        cb.tensor_row_split_warps_per_sm, cb.tensor_row_split_one_wave = keep


@pytest.mark.parametrize("d", [768, 1280], ids=lambda d: f"K{d}")
def test_tensor_units_change_no_bits(tensor_on, rng, d):
    """Two 64-weight units in flight per warp (MT_UNITS 2) or one: the same bits at every
    row count, including a K whose units do not divide evenly among the warps."""
    assert_setting_keeps_bits(tensor_on, _tensor_launch_ops(tensor_on, rng, Q.Q4_K, d), "tensor_units", 1, 2)


def assert_setting_keeps_bits(cb, ops: dict, attr: str, base, other, rows=(1, 2, 8, 9, 16, 17)) -> None:
    """Every op at every row count gives the same bits with backend setting ``attr`` at
    ``other`` as at ``base`` (a speed choice); the setting is restored afterwards."""
    keep = getattr(cb, attr)
    try:
        for name, op in ops.items():
            setattr(cb, attr, base)
            want = {m: cb.to_host(op(m)) for m in rows}
            setattr(cb, attr, other)
            for m, got in want.items():
                poison()
                out = cb.to_host(op(m))
                assert np.isfinite(out).all(), f"{name}: {m} rows not finite"
                assert np.array_equal(out, got), f"{name}: {m} rows differ with {attr} = {other}"
    finally:
        setattr(cb, attr, keep)


def test_tensor_products_propagate_nan(tensor_on, rng):
    """A NaN in x must reach its row's outputs (never hidden by the power-of-two scaling, nor
    by the integer form's group maximum)."""
    cb = tensor_on
    w = cb.prepare_matrix([make_tensor(rng, 32, 256, Q.Q4_K)])
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, 77] = np.nan
    got = cb.to_host(cb.matmul(cupy.asarray(x), w))
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


def assert_forward_chunks_agree(gpu, cpu, rng, int8: bool = False) -> None:
    """A 40-token forward close to the numpy model, and bit-identical when it runs one row at
    a time, k at a time and in odd chunks on one cache. Close: within 2e-2 relative; the
    integer form (int8 x, 7 bits): at least 36 of the 40 positions within 5e-2 each. A random
    synthetic model has positions whose residual stream nearly cancels, where x's rounding
    moves the logits far: a numpy emulation of int8 x had 7 such positions in 1,600 (at most
    1 a forward) on the qwen2 model, none on the llama one."""
    b = gpu.backend
    ids = rng.integers(0, 300, size=40)
    whole = b.to_host(gpu.forward(ids, gpu.new_cache(64)))
    want = cpu.forward(ids, cpu.new_cache(64))
    if int8:
        w64, g64 = np.asarray(want, dtype=np.float64), np.asarray(whole, dtype=np.float64)
        per = np.linalg.norm(g64 - w64, axis=1) / np.linalg.norm(w64, axis=1)
        assert np.isfinite(g64).all() and int((per < 5e-2).sum()) >= 36, per
    else:
        assert rel_err(whole, want) < 2e-2
    cache = gpu.new_cache(64)
    parts = [
        b.to_host(gpu.forward(ids[s:e], cache))
        for s, e in ((0, 1), (1, 2), (2, 18), (18, 19), (19, 40))
    ]
    assert np.array_equal(np.concatenate(parts), whole)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("wide", [False, True], ids=["mt", "wide"])
@pytest.mark.parametrize("int8", [False, True], ids=["f16", "int8"])
def test_tensor_model_decode_equals_verify(models, arch, wide, int8, rng):
    """Whole forwards with tensor-core products: one row at a time == k at a time == odd
    chunks (graph and eager paths), and close to the numpy model. ``wide``: every plain
    product (the head included) on the staged wide-weight kernel; ``int8``: the integer form,
    with x quantized once per product (xprep8) and by every tile."""
    gpu, cpu = models[arch]
    b = gpu.backend
    names = ("tensor_products", "tensor_wide_min_cols", "tensor_int8", "tensor_int8_min_dim",
             "tensor_int8_xprep_min_rows")
    keep = {a: getattr(b, a) for a in names}
    b.tensor_products, b.tensor_int8, b.tensor_int8_min_dim = True, int8, 0
    if wide:
        b.tensor_wide_min_cols = 1
    try:
        for xprep_rows in (0, 1) if int8 else (b.tensor_int8_xprep_min_rows,):
            b.tensor_int8_xprep_min_rows = xprep_rows
            b.drop_graphs()
            assert_forward_chunks_agree(gpu, cpu, rng, int8)
    finally:
        for a, v in keep.items():
            setattr(b, a, v)
        b.drop_graphs()


# ---- tensor-core products of very wide weights (issue 21: kernels.cu mtw_body, the heads) ----
#: name -> (tensor_wide_stages, tensor_wide_persistent, tensor_wide_row_groups): speed choices
#: that change no bits (two stages are built for one warp per block only)
WIDE_VARIANTS = {
    "s2-persistent": (2, True, 1),
    "s1-persistent": (1, True, 1),
    "s2-per-tile": (2, False, 1),
    "s1-per-tile": (1, False, 1),
    "s1-rows2": (1, False, 2),
    "s1-rows4-persistent": (1, True, 4),
}
#: tensor_wide_warps: warps splitting a tile's units, a choice per weight that sets the order
#: of a row's sums (each is checked against the reference and for batch invariance)
WIDE_WARPS = (1, 2, 4)


def wide_variants(warps: int) -> list[str]:
    """The variants that keep ``warps`` warps per block (the same bits among them)."""
    return [v for v, (stages, _, _) in WIDE_VARIANTS.items() if stages == 1 or warps == 1]


@pytest.fixture
def wide_on(tensor_on):
    """Every single-type, non-gated tensor-core product on the staged wide kernel."""
    cb = tensor_on
    names = ("tensor_wide", "tensor_wide_min_cols", "tensor_wide_stages", "tensor_wide_persistent",
             "tensor_wide_warps", "tensor_wide_row_groups")
    keep = {a: getattr(cb, a) for a in names}
    cb.tensor_wide, cb.tensor_wide_min_cols = True, 1
    yield cb
    for a, v in keep.items():
        setattr(cb, a, v)
    cb.drop_graphs()


def wide_case(cb, rng, qtype, d: int, cols: int, n: int) -> tuple:
    """A weight on the wide kernel (``cols`` x ``d``), a norm weight, a bias, and ``n`` rows of
    x and of a residual."""
    w = cb.prepare_matrix([make_tensor(rng, cols, d, qtype)])
    assert cb._tensor_wide(w)
    gd = cb.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    bd = cb.prepare_vector(rng.standard_normal(cols).astype(np.float32))
    x = cupy.asarray(wide_range_x(rng, n, d))
    res = cupy.asarray(rng.standard_normal((n, cols)).astype(np.float32))
    return w, gd, bd, x, res


def set_wide(cb, variant: str) -> None:
    cb.tensor_wide_stages, cb.tensor_wide_persistent, cb.tensor_wide_row_groups = WIDE_VARIANTS[variant]


@pytest.mark.parametrize("warps", WIDE_WARPS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
def test_tensor_wide_products_match_reference(wide_on, ref, rng, qtype, warps):
    """mtw_body within the f16 bounds, plain, with the fused norm and a bias, and with a
    residual, for 1, 2 and 4 warps per tile; every stage count, grid and row split gives
    the same bits."""
    cb = wide_on
    cb.tensor_wide_warps = warps
    d = 512
    t = make_tensor(rng, 200, d, qtype)  # 12 whole 16-column tiles and a partial one
    w, w_ref = cb.prepare_matrix([t]), ref.prepare_matrix([t])
    assert cb._tensor_wide(w)
    g = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    gd, bd = cb.prepare_vector(g), cb.prepare_vector(bias)
    variants = wide_variants(warps)
    for n in (1, 3, 16, 40):
        x = wide_range_x(rng, n, d)
        xd = cupy.asarray(x)
        res = rng.standard_normal((n, 200)).astype(np.float32)
        resd = cupy.asarray(res)
        inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1) + 1e-6)
        got = {}
        for variant in variants:
            set_wide(cb, variant)
            assert cb._tensor_wide(w) and cb._wide_warps() == warps
            outs = []
            for op in (
                lambda xd=xd: cb.matmul(xd, w),
                lambda xd=xd: cb.norm_matmul(xd, gd, 1e-6, w, bd),
                lambda xd=xd, resd=resd: cb.matmul_add(xd, w, resd),
            ):
                poison()
                outs.append(cb.to_host(op()))
            got[variant] = outs
        plain, normed, added = got[variants[0]]
        tc_check(w_ref, x, plain)
        tc_check(w_ref, (x * g).astype(np.float32), normed - bias, scale=inv)
        assert np.array_equal(added, (res + plain).astype(np.float32))
        for variant, outs in got.items():
            for a, b_ in zip(outs, got[variants[0]], strict=True):
                assert np.array_equal(a, b_), f"{variant}: bits differ at {n} rows"


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize(
    "variant, warps",
    [("s2-persistent", 1), ("s1-per-tile", 1), ("s1-rows2", 2), ("s1-rows4-persistent", 4)],
    ids=lambda v: str(v),
)
def test_tensor_wide_batch_invariant(wide_on, rng, qtype, variant, warps):
    """The wide kernel for every row count: rows 1, 2, 8, 16, 64 (and odd counts, offsets,
    chunkings) bit-identical, plain, with norm + bias and with a residual."""
    cb = wide_on
    set_wide(cb, variant)
    cb.tensor_wide_warps = warps
    w, gd, bd, x, res = wide_case(cb, rng, qtype, 256, 72, 64)  # four whole tiles and half of one
    ops = {  # rows [s, e) of x (and of the residual)
        "plain": lambda s, e: cb.matmul(x[s:e], w),
        "norm": lambda s, e: cb.norm_matmul(x[s:e], gd, 1e-5, w, bd),
        "add": lambda s, e: cb.matmul_add(x[s:e], w, res[s:e]),
    }
    assert_rows_invariant(cb, ops)


def test_tensor_wide_default_takes_the_heads(tensor_on, ref, rng):
    """By default only weights wider than ``tensor_max_cols`` (the output heads) take the
    wide kernel; gated products never do; a head's rows equal its one-row calls and stay
    within the f16 bound; a NaN in x reaches its row only."""
    cb = tensor_on
    t = make_tensor(rng, 65600, 64, Q.Q8_0)
    head = cb.prepare_matrix([t])
    assert cb._tensor_wide(head) and not cb._tensor(head)
    narrow = cb.prepare_matrix([make_tensor(rng, 65536, 64, Q.Q8_0)])
    assert not cb._tensor_wide(narrow) and cb._tensor(narrow)
    x = wide_range_x(rng, 17, 64)
    xd = cupy.asarray(x)
    poison()
    full = cb.to_host(cb.matmul(xd, head))
    tc_check(ref.prepare_matrix([t]), x, full)
    for m in (1, 8, 16):
        assert np.array_equal(cb.to_host(cb.matmul(xd[:m], head)), full[:m]), f"{m} rows"
    x[1, 7] = np.nan
    got = cb.to_host(cb.matmul(cupy.asarray(x[:3]), head))
    assert np.isnan(got[1]).all() and np.array_equal(got[[0, 2]], full[[0, 2]])
    # a gated product of a weight that would qualify keeps mt_body (gate, up in one tile)
    gu = cb.prepare_matrix(
        [make_tensor(rng, 48, 64, Q.Q8_0, "g"), make_tensor(rng, 48, 64, Q.Q8_0, "u")]
    )
    gd = cb.prepare_vector(np.ones(64, dtype=np.float32))
    glu = cb.to_host(cb.norm_matmul_glu(xd[:2], gd, 1e-6, gu, 48, False))
    keep = cb.tensor_wide_min_cols
    try:
        cb.tensor_wide_min_cols = 1
        assert cb._tensor_wide(gu)
        assert np.array_equal(cb.to_host(cb.norm_matmul_glu(xd[:2], gd, 1e-6, gu, 48, False)), glu)
    finally:
        cb.tensor_wide_min_cols = keep


# ---- split-K tensor products (issue 21: kernels.cu mts / mtc kernels, the long down projections) ----
#: name -> (warps per block, blocks per tile, units in flight, cluster): speed choices whose
#: bits are mt_body's with KW = warps x blocks (a cluster of 8 x 4 has no mt_body twin and is
#: checked against the scratch-plane kernel of the same shape)
SPLIT_VARIANTS = {
    "w2x2": (2, 2, 1, False),
    "w4x2": (4, 2, 1, False),
    "w4x2u2": (4, 2, 2, False),
    "w2x8": (2, 8, 1, False),
    "w4x4": (4, 4, 1, False),
    "w4x4u2": (4, 4, 2, False),
    "w4x4c": (4, 4, 1, True),
    "w4x8": (4, 8, 1, False),
    "w4x8c": (4, 8, 1, True),
}


@pytest.fixture
def split_on(tensor_on):
    """Split-K products on for every plain product (``tensor_split_min_in`` 64); the test
    sets the variant (``set_split``), the blocks per tile through ``_tensor_splits``."""
    cb = tensor_on
    names = (
        "tensor_split", "tensor_split_min_in", "tensor_split_warps", "tensor_split_units",
        "tensor_split_cluster",
    )  # fmt: skip
    keep = {a: getattr(cb, a) for a in names}
    cb.tensor_split, cb.tensor_split_min_in = True, 64
    yield cb
    for a, v in keep.items():
        setattr(cb, a, v)
    cb.drop_graphs()


def set_split(cb, monkeypatch, variant: str) -> None:
    warps, splits, units, cluster = SPLIT_VARIANTS[variant]
    if cluster and cb._cc_major < 9:
        pytest.skip("thread-block clusters need sm_90")
    cb.tensor_split_warps, cb.tensor_split_units, cb.tensor_split_cluster = warps, units, cluster
    monkeypatch.setattr(cb, "_tensor_splits", lambda w: splits if cb.tensor_split else 0)
    assert cb._split_cluster(splits) == cluster


def split_case(cb, monkeypatch, rng, qtype, variant: str, n: int) -> tuple:
    """The split ``variant`` set, and a 72-column weight of 1,280 inputs (20 units) with ``n``
    rows of x and of a residual."""
    set_split(cb, monkeypatch, variant)
    d, cols = 1280, 72
    w = cb.prepare_matrix([make_tensor(rng, cols, d, qtype)])
    x = cupy.asarray(wide_range_x(rng, n, d))
    res = cupy.asarray(rng.standard_normal((n, cols)).astype(np.float32))
    return w, x, res


def counters_zero(cb) -> bool:
    return not bool(cupy.any(cb._split_counters))


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("d", [1024, 1280, 256], ids=lambda d: f"K{d}")
def test_tensor_split_equals_mt_body_and_reference(split_on, monkeypatch, ref, rng, qtype, d):
    """Every split variant gives mt_body's bits for KW = warps x blocks (plain, bias row,
    residual), within the f16 bounds; K of 16, 20 (uneven over the warps) and 4 units (warps
    with no unit); the arrival counters are zero after every launch."""
    cb = split_on
    t = make_tensor(rng, 100, d, qtype)  # a partial 16-column tile
    w, w_ref = cb.prepare_matrix([t]), ref.prepare_matrix([t])
    bias = cb.prepare_vector(rng.standard_normal(100).astype(np.float32))
    for n in (1, 3, 16, 40):
        x = wide_range_x(rng, n, d)
        xd = cupy.asarray(x)
        res = cupy.asarray(rng.standard_normal((n, 100)).astype(np.float32))
        ops = (
            lambda xd=xd: cb.matmul(xd, w),
            lambda xd=xd: cb.matmul_add(xd, w, bias),
            lambda xd=xd, res=res: cb.matmul_add(xd, w, res),
        )

        def run_all(ops=ops) -> list[np.ndarray]:
            outs = []
            for op in ops:
                poison()
                outs.append(cb.to_host(op()))
            return outs

        got = {}
        for variant, (warps, splits, _units, cluster) in SPLIT_VARIANTS.items():
            if cluster and cb._cc_major < 9:
                continue
            set_split(cb, monkeypatch, variant)
            got[variant] = run_all()
            assert counters_zero(cb), f"{variant}: a tile's counter was left set"
            monkeypatch.undo()
            kw = warps * splits
            if kw in (4, 8, 16):  # mt_body's twin
                cb.tensor_split = False
                monkeypatch.setattr(cb, "_tensor_shape", lambda w_, act, kw=kw: (1, kw))
                assert cb._tensor(w)
                want = run_all()
                monkeypatch.undo()
                cb.tensor_split = True
            else:
                want = got[variant.rstrip("c")]
            for i in range(3):
                assert np.array_equal(got[variant][i], want[i]), f"{variant}: op {i}, {n} rows"
        tc_check(w_ref, x, got["w4x4"][0])


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0], ids=lambda q: q.name)
@pytest.mark.parametrize("variant", ["w4x4", "w2x8", "w4x4u2", "w4x8c"])
def test_tensor_split_batch_invariant(split_on, monkeypatch, rng, qtype, variant):
    """Split-K products for every row count: 1, 2, 8, 16, 64 rows (odd counts, offsets, chunks
    of 7, the 9-17-row block split) bit-identical, plain and with a residual."""
    cb = split_on
    w, x, res = split_case(cb, monkeypatch, rng, qtype, variant, 64)
    ops = {
        "plain": lambda s, e: cb.matmul(x[s:e], w),
        "add": lambda s, e: cb.matmul_add(x[s:e], w, res[s:e]),
    }
    assert_rows_invariant(cb, ops)
    assert counters_zero(cb)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("variant", ["w2x8", "w4x4u2", "w4x8c"])
def test_tensor_split_row_pass_builds_change_no_bits(split_on, monkeypatch, rng, qtype, variant):
    """Split-K products past 32 rows with eight 8-row tiles per pass (mts / mtc ``_n8_``) and
    under another register bound (``ROW_PASS_BUILDS``): the same bits as the default build,
    plain and with a residual, at 24, 33, 40 and 64 rows."""
    cb = split_on
    w, x, res = split_case(cb, monkeypatch, rng, qtype, variant, 64)
    launched = spy_kernels(cb, monkeypatch)
    keep = cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows
    try:
        for op in (lambda m: cb.matmul(x[:m], w), lambda m: cb.matmul_add(x[:m], w, res[:m])):
            got = {}
            for tiles, minb in ROW_PASS_BUILDS:
                cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows = tiles, minb
                launched.clear()
                poison()
                got[tiles, minb] = [cb.to_host(op(m)) for m in (24, 33, 40, 64)]
                split = [f for f in launched if f.startswith(("mts_", "mtc_"))]
                assert len(split) == 4 and all(f"_n{tiles}_" in f for f in split[1:]), (tiles, split)
                assert counters_zero(cb)
                for a, b in zip(got[tiles, minb], got[ROW_PASS_BUILDS[0]], strict=True):
                    assert np.array_equal(a, b), (variant, tiles, minb, a.shape)
    finally:
        cb.tensor_max_row_tiles, cb.tensor_min_blocks_rows = keep


def test_tensor_split_default_takes_the_long_rows(tensor_on, ref, rng):
    """By default the split kernels take the plain products of rows at least
    ``tensor_split_min_in`` long (a Qwen2.5-0.5B down projection, Q4_K | Q6_K halves here);
    the blocks per tile depend on the shape only; norms and shorter rows keep their kernels;
    rows equal their one-row calls and stay within the f16 bound."""
    cb = tensor_on
    d = cb.tensor_split_min_in + 768  # 4864, Qwen2.5-0.5B's down projection
    parts = [make_tensor(rng, 448, d, Q.Q4_K, "a"), make_tensor(rng, 448, d, Q.Q6_K, "b")]
    down = cb.prepare_matrix(parts)
    splits = cb._tensor_splits(down)  # its 56 tiles fill the chip at one row
    assert splits in (2, 4, 8, 16) and 56 * splits >= cb._sm_count and not cb._tensor(down)
    short = cb.prepare_matrix([make_tensor(rng, 64, 1024, Q.Q4_K)])
    assert cb._tensor_splits(short) == 0 and cb._tensor(short)
    x = wide_range_x(rng, 17, d)
    xd = cupy.asarray(x)
    res = cupy.asarray(rng.standard_normal((17, 896)).astype(np.float32))
    poison()
    full = cb.to_host(cb.matmul_add(xd, down, res))
    tc_check(ref.prepare_matrix(parts), x, full - cb.to_host(res))
    for m in (1, 8, 16):
        assert np.array_equal(cb.to_host(cb.matmul_add(xd[:m], down, res[:m])), full[:m])
    assert counters_zero(cb)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("variant", ["default", "w4x4c"])
def test_tensor_split_model_decode_equals_verify(models, monkeypatch, arch, variant, rng):
    """Whole forwards with every plain product (attention output, down projection, head) on
    the split-K kernels: one row at a time == k at a time == odd chunks, graph and eager."""
    gpu, cpu = models[arch]
    b = gpu.backend
    names = ("tensor_products", "tensor_split", "tensor_split_min_in", "tensor_split_warps",
             "tensor_split_units", "tensor_split_cluster")  # fmt: skip
    keep = {a: getattr(b, a) for a in names}
    b.tensor_products, b.tensor_split, b.tensor_split_min_in = True, True, 64
    if variant != "default":
        set_split(b, monkeypatch, variant)
    b.drop_graphs()
    try:
        assert_forward_chunks_agree(gpu, cpu, rng)
        assert counters_zero(b)
    finally:
        for a, v in keep.items():
            setattr(b, a, v)
        monkeypatch.undo()
        b.drop_graphs()


# ---- x converted once per product (issue 21: kernels.cu xprep) ----
@pytest.fixture
def xprep_keep(tensor_on):
    """Restores the xprep thresholds a test changes."""
    cb = tensor_on
    keep = cb.tensor_xprep_min_rows, cb.tensor_xprep_wide_min_rows, cb.tensor_int8_xprep_min_rows
    yield cb
    cb.tensor_xprep_min_rows, cb.tensor_xprep_wide_min_rows, cb.tensor_int8_xprep_min_rows = keep


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("policy", ["m2w4", "m1w8-16", "m1w16"])
@pytest.mark.parametrize("d", [512, 1280], ids=lambda d: f"K{d}")
def test_xprep_changes_no_bits(xprep_keep, tc_policy, rng, qtype, policy, d):
    """x converted once (xprep) or by every tile: the same bits for plain, norm (the sum of
    squares in the consumer's warp order, KW 4, 8 or 16), gated, residual and two-type
    launches, at every row count, with units that do not divide evenly among the warps."""
    cb = xprep_keep
    tc_policy(policy)
    ops = _tensor_launch_ops(cb, rng, qtype, d)
    assert_setting_keeps_bits(cb, ops, xprep_rows_field(), 0, 1, rows=(1, 3, 8, 9, 16, 17))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("variant", ["w4x4", "w2x8", "w4x4u2", "w4x8c"])
def test_xprep_split_changes_no_bits(split_on, xprep_keep, monkeypatch, rng, qtype, variant):
    """The split-K kernels read the converted x with the same bits (plain and residual)."""
    cb = split_on
    w, x, res = split_case(cb, monkeypatch, rng, qtype, variant, 40)
    for m in (1, 3, 16, 40):
        for op in (lambda m=m: cb.matmul(x[:m], w), lambda m=m: cb.matmul_add(x[:m], w, res[:m])):
            setattr(cb, xprep_rows_field(), 0)
            want = cb.to_host(op())
            setattr(cb, xprep_rows_field(), 1)
            poison()
            assert np.array_equal(cb.to_host(op()), want), f"{variant}: {m} rows differ"
            assert counters_zero(cb)


@pytest.mark.parametrize("warps", WIDE_WARPS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
def test_xprep_wide_changes_no_bits(wide_on, xprep_keep, rng, qtype, warps):
    """The wide (head) kernel reads the converted x with the same bits: plain, fused norm
    with a bias (its sum of squares in the order of ``warps`` warps), residual; every stage
    count, grid and row split."""
    cb = wide_on
    cb.tensor_wide_warps = warps
    w, gd, bd, x, res = wide_case(cb, rng, qtype, 512, 200, 40)
    for variant in wide_variants(warps):
        set_wide(cb, variant)
        for m in (1, 3, 16, 40):
            for op in (
                lambda m=m: cb.matmul(x[:m], w),
                lambda m=m: cb.norm_matmul(x[:m], gd, 1e-6, w, bd),
                lambda m=m: cb.matmul_add(x[:m], w, res[:m]),
            ):
                cb.tensor_xprep_wide_min_rows = 0
                want = cb.to_host(op())
                cb.tensor_xprep_wide_min_rows = 1
                poison()
                assert np.array_equal(cb.to_host(op()), want), f"{variant}: {m} rows differ"


def test_xprep_propagates_nan(xprep_keep, rng):
    """A NaN in x still reaches its row's outputs, and only its row, through xprep."""
    cb = xprep_keep
    setattr(cb, xprep_rows_field(), 1)
    w = cb.prepare_matrix([make_tensor(rng, 32, 256, Q.Q4_K)])
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, 77] = np.nan
    got = cb.to_host(cb.matmul(cupy.asarray(x), w))
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


def int8_kernels_spied(cb, prefix: str, setting: str):
    """For a fixture: the integer form only (skip otherwise); yields (cb, the names of the
    launched kernels starting with ``prefix``, so a test can tell they ran); restores
    ``setting``."""
    if not TC_FORM["int8"]:
        pytest.skip(f"the {prefix} kernels are the integer form's")
    keep, k = getattr(cb, setting), cb._k
    seen: list[str] = []

    def spy(name, *args, **kwargs):
        if name.startswith(prefix):
            seen.append(name)
        return k(name, *args, **kwargs)

    cb._k = spy
    yield cb, seen
    del cb._k
    setattr(cb, setting, keep)


# ---- the integer form's kernels chosen by row count: few rows on the CUDA cores (kernels.cu
# mtv), many rows staged in shared memory (mtb); both give the bits of the weight's family ----
#: kind -> (the setting that turns it on, its value then, the row counts tested: mtb's past one
#: staged pass of 32 or 64 rows, partial passes, several passes; settings held meanwhile:
#: mtbw, the staged kernels of 64 weight rows a block)
ROW_KERNELS = {
    "mtv": ("tensor_int8_mv_rows", 4, (1, 2, 3, 4), {}),
    "mtb": ("tensor_int8_batch_min_rows", 17, (17, 24, 32, 33, 40, 64, 65, 100), {}),
    "mtbw": ("tensor_int8_batch_min_rows", 17, (17, 24, 32, 33, 40, 64, 65, 100),
             {"tensor_int8_batch_weight_rows": 64}),
}


@dataclass
class RowKernels:
    """One kind of row-count kernels under test, and the names of those launched."""

    kind: str
    cb: CupyBackend
    seen: list[str]
    setting: str
    on: int
    rows: tuple[int, ...]


@pytest.fixture(params=list(ROW_KERNELS))
def row_kernels(tensor_on, request):
    setting, on, rows, held = ROW_KERNELS[request.param]
    keep = {k: getattr(tensor_on, k) for k in held}
    for cb, seen in int8_kernels_spied(tensor_on, f"{request.param}_", setting):
        for k, v in held.items():
            setattr(cb, k, v)
        yield RowKernels(request.param, cb, seen, setting, on, rows)
    for k, v in keep.items():
        setattr(tensor_on, k, v)


def assert_row_kernels_keep_bits(rk: RowKernels, ops: dict, slots: int = 4) -> None:
    """Each op at every tested row count on the kernels == on its tensor-core family, bit for
    bit, and every build ran: mtv's 1, 2 and 4-row ones; mtb's of ``slots`` K slots a block
    in both pass sizes."""
    rk.seen.clear()
    assert_setting_keeps_bits(rk.cb, ops, rk.setting, 0, rk.on, rows=rk.rows)
    if rk.kind == "mtv":
        assert {n[-2:] for n in rk.seen} == {"r1", "r2", "r4"}, rk.seen
    else:
        assert {n.split("_")[-2] for n in rk.seen} == {f"s{slots}"}, rk.seen
        assert {n[-2:] for n in rk.seen} == {"n2", "n4"}, rk.seen


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("policy", ["m2w4", "m1w8-16", "m1w16"])
@pytest.mark.parametrize("d", [512, 1280], ids=lambda d: f"K{d}")
def test_row_kernels_equal_mt_body(row_kernels, tc_policy, rng, qtype, policy, d):
    """mt_body's family (KW 4, 8, 16; mtb: one block a tile, or two and four adding their
    slots through scratch planes): plain, norm, gated, residual and two-type pair (bias,
    residual) launches; units that do not divide evenly among the warps (20), mtb blocks with
    none (8 units, KW 16)."""
    rk = row_kernels
    tc_policy(policy)
    assert_row_kernels_keep_bits(rk, _tensor_launch_ops(rk.cb, rng, qtype, d, rows=rk.rows[-1]))
    assert counters_zero(rk.cb)


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("variant", ["w2x2", "w4x4", "w2x8", "w4x4u2", "w4x8c"])
def test_row_kernels_equal_split_k(split_on, row_kernels, monkeypatch, rng, qtype, variant):
    """The split-K family (mts / mtc: K slots = warps x blocks, 4 to 32): plain and residual."""
    rk = row_kernels
    w, x, res = split_case(rk.cb, monkeypatch, rng, qtype, variant, rk.rows[-1])
    ops = {
        "plain": lambda m: rk.cb.matmul(x[:m], w),
        "add": lambda m: rk.cb.matmul_add(x[:m], w, res[:m]),
    }
    assert_row_kernels_keep_bits(rk, ops)
    assert counters_zero(rk.cb)


@pytest.mark.parametrize("warps", WIDE_WARPS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
def test_row_kernels_equal_wide(wide_on, row_kernels, rng, qtype, warps):
    """The wide (head) family, 1, 2 or 4 warps a tile (mtb: as many K slots a block): plain,
    fused norm with a bias, residual."""
    rk = row_kernels
    rk.cb.tensor_wide_warps = warps
    w, gd, bd, x, res = wide_case(rk.cb, rng, qtype, 512, 200, rk.rows[-1])
    ops = {
        "plain": lambda m: rk.cb.matmul(x[:m], w),
        "norm+bias": lambda m: rk.cb.norm_matmul(x[:m], gd, 1e-6, w, bd),
        "add": lambda m: rk.cb.matmul_add(x[:m], w, res[:m]),
    }
    assert_row_kernels_keep_bits(rk, ops, slots=warps)


def test_row_kernels_rows_equal_one_row(row_kernels, rng):
    """Decode == verify through them: rows of the largest tested launch each equal their own
    one-row call, plain and gated with a norm."""
    rk = row_kernels
    setattr(rk.cb, rk.setting, rk.on)
    ops = _tensor_launch_ops(rk.cb, rng, Q.Q8_0, 1280, rows=rk.rows[-1])
    n = rk.rows[-1]
    for name in ("plain", "glu"):
        full = rk.cb.to_host(ops[name](n))
        for i in (0, n // 2 - 1, n - 1):
            assert np.array_equal(rk.cb.to_host(ops[name](i + 1))[i], full[i]), f"{name}: row {i}"
    assert rk.seen


def test_row_kernels_propagate_nan(row_kernels, rng):
    """A NaN in x reaches its row's outputs, and only its row."""
    rk = row_kernels
    setattr(rk.cb, rk.setting, rk.on)
    w = rk.cb.prepare_matrix([make_tensor(rng, 32, 256, Q.Q4_K)])
    x = rng.standard_normal((rk.rows[-1], 256)).astype(np.float32)
    x[1, 77] = np.nan
    got = rk.cb.to_host(rk.cb.matmul(cupy.asarray(x), w))
    assert rk.seen and np.isnan(got[1]).all() and np.isfinite(np.delete(got, 1, axis=0)).all()


# ---- the signed-byte types' codes multiplied as s8 (kernels.cu MT_SIGNED, modules "@s1"):
# the same exact integer sums, so the same bits, in every kernel of the integer form ----
#: Q8_0, IQ4_NL, IQ4_XS: codes of offset 128; Q4_K: another type, whose build it leaves alone
SIGNED_TYPES = [Q.Q8_0, Q.IQ4_NL, Q.IQ4_XS, Q.Q4_K]
#: one row (mtv), the family's tiles (2-16), the staged many-row kernels (17 on, mtb)
SIGNED_ROWS = (1, 2, 9, 16, 17, 33, 64)


@pytest.fixture
def signed_check(tensor_on):
    """The integer form with every row-count kernel on (mtv at one row, mtb from 17)."""
    if not TC_FORM["int8"]:
        pytest.skip("the integer form's codes")
    tensor_on.tensor_int8_batch_min_rows = 17  # tensor_on restores it
    return tensor_on


@pytest.mark.parametrize("qtype", SIGNED_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("policy", ["m2w4", "m1w16"])
def test_signed_codes_change_no_bits(signed_check, tc_policy, rng, qtype, policy):
    """mt_body's family, mtv and mtb: plain, norm, gated, residual and two-type launches."""
    tc_policy(policy)
    ops = _tensor_launch_ops(signed_check, rng, qtype, 1280, rows=SIGNED_ROWS[-1])
    assert_setting_keeps_bits(signed_check, ops, "tensor_int8_signed_codes", False, True, rows=SIGNED_ROWS)


@pytest.mark.parametrize("qtype", SIGNED_TYPES[:3], ids=lambda q: q.name)
def test_signed_codes_change_no_bits_split_k(split_on, signed_check, monkeypatch, rng, qtype):
    """The split-K family (K slots over blocks), mtv and mtb after it."""
    w, x, res = split_case(signed_check, monkeypatch, rng, qtype, "w4x4", SIGNED_ROWS[-1])
    ops = {"plain": lambda m: signed_check.matmul(x[:m], w), "add": lambda m: signed_check.matmul_add(x[:m], w, res[:m])}
    assert_setting_keeps_bits(signed_check, ops, "tensor_int8_signed_codes", False, True, rows=SIGNED_ROWS)
    assert counters_zero(signed_check)


@pytest.mark.parametrize("qtype", SIGNED_TYPES[:3], ids=lambda q: q.name)
def test_signed_codes_change_no_bits_wide(wide_on, signed_check, rng, qtype):
    """The wide (head) family, mtv and mtb after it: plain and fused norm with a bias."""
    w, gd, bd, x, _ = wide_case(signed_check, rng, qtype, 512, 200, SIGNED_ROWS[-1])
    ops = {
        "plain": lambda m: signed_check.matmul(x[:m], w),
        "norm+bias": lambda m: signed_check.norm_matmul(x[:m], gd, 1e-6, w, bd),
    }
    assert_setting_keeps_bits(signed_check, ops, "tensor_int8_signed_codes", False, True, rows=SIGNED_ROWS)


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q4_K], ids=lambda q: q.name)
def test_tensor_min_blocks_change_no_bits(tensor_on, rng, qtype):
    """Fewer registers for more resident blocks (tensor_min_blocks, kernels.cu MT_MINB): the
    same bits at every row count, for every launch kind."""
    ops = _tensor_launch_ops(tensor_on, rng, qtype, 768)
    assert_setting_keeps_bits(tensor_on, ops, "tensor_min_blocks", 1, 6, rows=(1, 8, 9, 16, 17))


@pytest.mark.parametrize("heads,kvh,hd,window", [(14, 2, 64, 0), (12, 2, 128, 300)])
def test_attention_min_blocks_change_no_bits(cb, rng, heads, kvh, hd, window):
    """Fewer registers for more resident attention blocks (attn_min_blocks, kernels.cu
    ATTN_MINB): the same bits, at 16 rows and at one."""
    cap, length, k = 1024, 1000, 16
    kc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
    vc = cupy.asarray(rng.standard_normal((cap, kvh, hd)).astype(np.float32))
    positions = np.arange(length - k, length)
    q = cupy.asarray(rng.standard_normal((k, heads, hd)).astype(np.float32))
    scale = 1.0 / math.sqrt(hd)
    keep = (
        cb.attn_min_blocks, cb.tensor_attention, cb.attn_min_blocks_min_rows,
        cb.attn_items_per_warp, cb.attn_group_min_blocks, cb.tensor_attention_min_group,
    )  # fmt: skip
    cb.tensor_attention, cb.attn_min_blocks_min_rows, cb.tensor_attention_min_group = False, 2, 0
    try:
        out = {}
        for ipw, field in ((1, "attn_min_blocks"), (2, "attn_group_min_blocks"), (4, "attn_group_min_blocks")):
            cb.attn_items_per_warp = ipw
            for blocks in (1, 3, 4, 7, 8):
                setattr(cb, field, blocks)
                poison()
                out[ipw, blocks] = cb.to_host(cb.attention(q, kc, vc, positions, window, scale))
                one = cb.to_host(cb.attention(q[3:4], kc, vc, positions[3:4], window, scale))
                assert np.array_equal(one[0], out[ipw, blocks][3])
                assert np.array_equal(out[ipw, blocks], out[1, 1]), f"{ipw} items, {blocks} blocks"
        assert np.isfinite(out[1, 1]).all()
    finally:
        (
            cb.attn_min_blocks, cb.tensor_attention, cb.attn_min_blocks_min_rows,
            cb.attn_items_per_warp, cb.attn_group_min_blocks, cb.tensor_attention_min_group,
        ) = keep  # fmt: skip


def test_swap_buffers_swaps_the_rows_asked_for(cb, rng):
    """kernels.cu swap_values: the first ``rows`` rows trade places, the rest stay; without
    ``rows`` the whole buffers; a strided view takes the copy-based swap, same result."""
    a0 = rng.standard_normal((40, 2, 64)).astype(np.float32)
    b0 = rng.standard_normal((40, 2, 64)).astype(np.float32)
    a, b = cupy.asarray(a0), cupy.asarray(b0)
    cb.swap_buffers(a, b, 17)
    assert np.array_equal(cb.to_host(a)[:17], b0[:17]) and np.array_equal(cb.to_host(b)[:17], a0[:17])
    assert np.array_equal(cb.to_host(a)[17:], a0[17:]) and np.array_equal(cb.to_host(b)[17:], b0[17:])
    cb.swap_buffers(a, b)
    assert np.array_equal(cb.to_host(a)[17:], b0[17:]) and np.array_equal(cb.to_host(b)[:17], b0[:17])
    a, b = cupy.asarray(a0), cupy.asarray(b0)
    cb.swap_buffers(a[:, 1], b[:, 1], 5)
    assert np.array_equal(cb.to_host(a)[:5, 1], b0[:5, 1]) and np.array_equal(cb.to_host(a)[:5, 0], a0[:5, 0])


@pytest.mark.parametrize("spec", [False, True])
def test_sessions_trading_buffers_replay_one_set_of_graphs(cb, tmp_path, spec):
    """engine/sessions.py: the session about to run trades KV buffers with the holder of the
    buffers graphs were captured on. On the device: alternating sessions (and a throwaway
    request) give the ids, and leave the cache rows, of an engine whose sessions keep their
    own buffers, bit for bit; and of the three caches' buffers only one holds graphs."""
    from echoline.engine.api import Engine

    from tests.synth import write_model
    from tests.test_sessions import StandInTokenizer, buffer

    path = write_model(tmp_path / "q.gguf", "qwen2", qtype=Q.Q8_0, vocab=64, context=1024, seed=9,
                       d_model=128, n_ff=256, n_heads=4, n_kv_heads=2)
    shared = Engine(path, backend=cb, tokenizer=StandInTokenizer())
    own = Engine(path, backend=cb, tokenizer=StandInTokenizer())
    own.sessions.share_buffers = False
    assert shared.sessions.share_buffers
    pa, pb = buffer(150, 4), buffer(140, 5)
    turns = [("a", pa), ("b", pb), (None, buffer(120, 6)), ("a", pa[:130] + [7, 8, 9]), ("b", pb + [1, 2])]
    try:
        for key, prompt in turns:
            got = shared.generate(prompt, max_tokens=40, spec=spec, session=key)
            want = own.generate(prompt, max_tokens=40, spec=spec, session=key)
            assert got.token_ids == want.token_ids, f"session {key}"
        for key in ("a", "b"):
            x, y = shared.sessions.sessions[key].cache, own.sessions.sessions[key].cache
            assert x.length == y.length
            for u, w in zip(x.k + x.v, y.k + y.v, strict=True):
                assert np.array_equal(cb.to_host(u[: x.length]), cb.to_host(w[: y.length])), key
        caches = [s.cache for s in shared.sessions.sessions.values()] + [shared.sessions._scratch.cache]
        holders = [c for c in caches if cb._owned.get(c.buffers) and cb._owned[c.buffers][1]]
        assert len(holders) == 1 and shared.sessions.exchanges >= 3
    finally:
        cb.drop_graphs()


class _CancelAfter:
    """A cancel flag that reads set from its ``n``-th check on: a request arriving while a
    background prefill runs (it stops between chunks)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


@pytest.mark.parametrize("spec", [False, True])
def test_background_prefill_chunks_then_request_equal_cold(cb, tmp_path, spec):
    """What the sidecar's idle prefill and inline warm-up do on the device
    (``sidecar/background_prefill.py``): the prompt run into a session in 64-row chunks,
    stopped by a request after two chunks and then resumed, then the request: its ids equal
    a cold request's on another engine, bit for bit, and it runs one prompt token."""
    from echoline.engine.api import Engine

    from tests.synth import write_model
    from tests.test_sessions import StandInTokenizer, buffer

    path = write_model(tmp_path / "q.gguf", "qwen2", qtype=Q.Q8_0, vocab=64, context=1024, seed=11,
                       d_model=128, n_ff=256, n_heads=4, n_kv_heads=2)
    warm = Engine(path, backend=cb, tokenizer=StandInTokenizer())
    cold = Engine(path, backend=cb, tokenizer=StandInTokenizer())
    prompt = buffer(301, 7)
    try:
        assert warm.prefill(prompt, session="w", chunk=64, cancel=_CancelAfter(2)) == 128  # two whole chunks kept
        assert warm.prefill(prompt, session="w", chunk=64) == len(prompt) - 1
        got = warm.generate(prompt, max_tokens=40, spec=spec, session="w")
        want = cold.generate(prompt, max_tokens=40, spec=spec, session=None)
        assert got.token_ids == want.token_ids
        assert got.stats.prefilled_tokens == 1
    finally:
        cb.drop_graphs()
