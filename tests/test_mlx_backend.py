"""MLX backend against the numpy reference, its exact affine rewrite, and its measured invariance.

Runs on MLX's Linux CPU build (``pip install "mlx[cpu]"``) and skips cleanly
without MLX. What only runs on Metal (the Q6_K kernel, GPU dispatch) is not
exercised here; its block layout is checked by a numpy transliteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import gguf  # noqa: E402
from echoline.engine.backends.mlx_backend import MlxBackend  # noqa: E402
from echoline.engine.backends.numpy_backend import NumpyBackend  # noqa: E402
from echoline.engine.gguf_file import QuantTensor  # noqa: E402
from echoline.kernels.mlx import affine  # noqa: E402

from tests.synth import encode_matrix  # noqa: E402

Q = gguf.GGMLQuantizationType
QTYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS]
AFFINE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K]


@pytest.fixture(scope="module")
def mb() -> MlxBackend:
    return MlxBackend(weights="affine")


@pytest.fixture(scope="module")
def ref() -> NumpyBackend:
    return NumpyBackend()


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, request.node.name)))


def make_tensor(rng: np.random.Generator, rows: int, cols: int, qtype: Q, name: str = "w") -> QuantTensor:
    data, _ = encode_matrix(rng, rows, cols, qtype)
    data = np.ascontiguousarray(data)
    if qtype == Q.BF16:
        data = data.view(np.uint8).reshape(rows, -1)
    elif qtype not in (Q.F32, Q.F16):
        data = data.reshape(rows, -1).view(np.uint8)
    return QuantTensor(name, qtype, (rows, cols), data)


def sum_tol(w: np.ndarray, x: np.ndarray, got: np.ndarray) -> None:
    """Elementwise float32 dot-product bound: k·eps·Σ|w||x| around the float64 product."""
    want = x.astype(np.float64) @ w.astype(np.float64).T
    bound = w.shape[1] * 1.2e-7 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert np.isfinite(got).all()
    assert (np.abs(got.astype(np.float64) - want) <= bound).all()


# ---- the affine rewrite -----------------------------------------------------------------
@pytest.mark.parametrize("qtype", AFFINE, ids=lambda q: q.name)
def test_affine_rewrite_is_exact(rng, qtype):
    """MLX's scale·q + bias equals gguf's dequantized value for every weight.

    Bitwise too, except the sign of zero: gguf's d·(q-8) gives -0 for a negative
    d, MLX's d·8 + (-8d) gives +0 (equal values, so no product or sum differs).
    """
    rows, cols = 40, 512
    t = make_tensor(rng, rows, cols, qtype)
    want = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(rows, cols).astype(np.float32)
    a = affine.unpack(qtype, t.data, rows, cols)
    assert a.codes.max() < 2**a.bits
    for got in (
        affine.dequantize(a),
        np.array(mx.dequantize(mx.array(affine.pack_codes(a.codes, a.bits)), mx.array(a.scales),
                               mx.array(a.biases), group_size=32, bits=a.bits)),
    ):
        np.testing.assert_array_equal(got, want)
        nonzero = want != 0
        assert np.array_equal(got[nonzero].view(np.uint32), want[nonzero].view(np.uint32))


def test_affine_rejects_q6k(rng):
    t = make_tensor(rng, 4, 256, Q.Q6_K)
    with pytest.raises(ValueError, match="no exact affine"):
        affine.unpack(Q.Q6_K, t.data, 4, 256)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_codes_matches_mlx_layout(rng, bits):
    codes = rng.integers(0, 2**bits, size=(3, 128)).astype(np.uint8)
    ones, zeros = mx.ones((3, 4)), mx.zeros((3, 4))
    got = np.array(mx.dequantize(mx.array(affine.pack_codes(codes, bits)), ones, zeros, group_size=32, bits=bits))
    np.testing.assert_array_equal(got, codes.astype(np.float32))


def test_q6k_metal_layout_transliterated(rng):
    """The Metal kernel's per-lane index math, run in numpy, reproduces gguf's Q6_K values."""
    t = make_tensor(rng, 3, 512, Q.Q6_K)
    want = t.dequantize().reshape(3, 512)
    blocks = np.asarray(t.data).reshape(3, 2, 210)
    got = np.zeros((3, 512), dtype=np.float32)
    for r in range(3):
        for b in range(2):
            blk = blocks[r, b]
            d = np.float32(blk[208:210].view(np.float16)[0])
            sc = blk[192:208].view(np.int8)
            for h in range(2):
                ql, qh, s = blk[64 * h :], blk[128 + 32 * h :], sc[8 * h :]
                for lane in range(32):
                    is_ = lane // 16
                    lo0, lo1, hi = int(ql[lane]), int(ql[lane + 32]), int(qh[lane])
                    qs = [(lo0 & 15) | ((hi & 3) << 4), (lo1 & 15) | (((hi >> 2) & 3) << 4),
                          (lo0 >> 4) | (((hi >> 4) & 3) << 4), (lo1 >> 4) | (((hi >> 6) & 3) << 4)]
                    for j, q in enumerate(qs):
                        scale = np.float32(d * np.float32(s[is_ + 2 * j]))
                        got[r, 256 * b + 128 * h + lane + 32 * j] = scale * np.float32(q - 32)
    np.testing.assert_array_equal(got, want)


# ---- prepared products ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["affine", "float"])
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_matmul_matches_reference(mb, ref, rng, qtype, mode):
    be = mb if mode == "affine" else MlxBackend(weights="float", check=False)
    assert be.weights == mode
    t = make_tensor(rng, 72, 512, qtype)
    w_ref = ref.prepare_matrix([t])
    w = be.prepare_matrix([t])
    expect = affine.AFFINE_BITS.get(qtype) if mode == "affine" else None
    assert getattr(w.segments[0], "bits", None) == expect
    for n in (1, 3, 16):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        got = be.to_host(be.matmul(x, w))
        sum_tol(w_ref, x, got)


def test_fused_segments_merge_by_form(mb, ref, rng):
    parts = [
        make_tensor(rng, 64, 512, Q.Q4_K, "q"),
        make_tensor(rng, 32, 512, Q.Q4_0, "k"),
        make_tensor(rng, 32, 512, Q.Q6_K, "v"),
        make_tensor(rng, 16, 512, Q.F32, "x"),
        make_tensor(rng, 16, 512, Q.Q8_0, "y"),
    ]
    w = mb.prepare_matrix(parts)
    kinds = [type(s).__name__ + str(getattr(s, "bits", "")) for s in w.segments]
    assert kinds == ["AffineSegment4", "DenseSegment", "AffineSegment8"]
    assert w.out_features == 160
    x = rng.standard_normal((5, 512)).astype(np.float32)
    sum_tol(ref.prepare_matrix(parts), x, mb.to_host(mb.matmul(x, w)))


# ---- ops vs the reference ---------------------------------------------------------------
def close(got, want, rtol=2e-6, atol=1e-6) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q6_K, Q.F16], ids=lambda q: q.name)
def test_embed_exact(mb, rng, qtype):
    t = make_tensor(rng, 37, 256, qtype)
    ids = rng.integers(0, 37, size=9)
    np.testing.assert_array_equal(mb.to_host(mb.embed(mb.prepare_embedding(t), ids)), t.dequantize_rows(ids))


def test_elementwise_ops(mb, ref, rng):
    a = rng.standard_normal((6, 200)).astype(np.float32) * 4
    b = rng.standard_normal((6, 200)).astype(np.float32)
    close(mb.to_host(mb.silu_mul(a, b)), ref.silu_mul(a, b))
    close(mb.to_host(mb.gelu_tanh_mul(a, b)), ref.gelu_tanh_mul(a, b))
    np.testing.assert_array_equal(mb.to_host(mb.add(a, b)), ref.add(a, b))
    np.testing.assert_array_equal(mb.to_host(mb.add(a, b[0])), ref.add(a, b[0]))
    np.testing.assert_array_equal(mb.to_host(mb.scale(a, 24.0)), ref.scale(a, 24.0))
    parts = mb.split(mb._mx(a), [50, 150])
    np.testing.assert_array_equal(mb.to_host(parts[1]), a[:, 50:])


@pytest.mark.parametrize("shape", [(5, 576), (3, 4, 256)])
def test_rms_norm(mb, ref, rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    close(mb.to_host(mb.rms_norm(x, mb.prepare_vector(w), 1e-6)), ref.rms_norm(x, w, 1e-6), rtol=1e-5)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("positions", [np.arange(0, 7), np.arange(4090, 4097), np.array([3, 9, 1, 40])],
                         ids=["start", "far", "scattered"])
def test_rope(mb, ref, rng, neox, positions):
    x = rng.standard_normal((len(positions), 3, 64)).astype(np.float32)
    want = ref.rope(x, positions, 10000.0, neox)
    # mx.fast.rope computes angles in float32: error grows with position (~pos·eps radians).
    atol = 2e-6 + 4e-7 * float(positions.max())
    close(mb.to_host(mb.rope(x, positions, 10000.0, neox)), want, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("window", [0, 5])
def test_attention(mb, ref, rng, window):
    cap, kvh, heads, hd, start, n = 40, 2, 6, 64, 17, 4
    kc, vc = mb.empty_cache(cap, kvh, hd), mb.empty_cache(cap, kvh, hd)
    k = rng.standard_normal((start + n, kvh, hd)).astype(np.float32)
    v = rng.standard_normal((start + n, kvh, hd)).astype(np.float32)
    mb.write_cache(kc, 0, k[:start])
    mb.write_cache(vc, 0, v[:start])
    kc, vc = mb.grow_cache(kc, 64), mb.grow_cache(vc, 64)
    mb.write_cache(kc, start, k[start:])
    mb.write_cache(vc, start, v[start:])
    assert kc.shape == (64, kvh, hd)
    np.testing.assert_array_equal(mb.to_host(kc)[: start + n], k)
    assert not mb.to_host(kc)[start + n :].any()
    q = rng.standard_normal((n, heads, hd)).astype(np.float32)
    pos = np.arange(start, start + n)
    got = mb.to_host(mb.attention(q, kc, vc, pos, window, 0.125))
    want = ref.attention(q, k, v, pos, window, 0.125)
    close(got, want, rtol=1e-5, atol=2e-6)


# ---- batch invariance: measured, asserted only where claimed ----------------------------
def test_auto_weight_mode():
    be = MlxBackend(check=False)
    assert be.weights == ("affine" if be.on_metal else "float")
    with pytest.raises(ValueError, match="weight mode"):
        MlxBackend(weights="int3", check=False)


def test_invariance_claim_matches_measurement(mb):
    report = mb.check_batch_invariance()
    assert set(report) >= {"matmul_affine4", "matmul_float", "attention_w0", "rope", "rms_norm"}
    assert mb.batch_invariant == (all(report.values()) and not mb.on_metal)
    if mb.on_metal:
        assert mb.batch_invariant is False  # never claimed without a measurement on the device


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_matmul_rows_identical_where_claimed(mb, rng, qtype):
    if not mb.batch_invariant:
        pytest.skip("backend does not claim batch invariance on this device")
    w = mb.prepare_matrix([make_tensor(rng, 96, 1024, qtype)])
    x = mx.array(rng.standard_normal((24, 1024)).astype(np.float32))
    full = mb.to_host(mb.matmul(x, w))
    for n in (1, 2, 5, 8, 16, 17):
        assert np.array_equal(mb.to_host(mb.matmul(x[:n], w)), full[:n]), f"{n} rows differ"
    assert np.array_equal(mb.to_host(mb.matmul(x[13:14], w))[0], full[13])


def test_attention_rows_identical_where_claimed(mb, rng):
    """A row's attention is the same alone (keys up to it) or among later rows (keys masked)."""
    if not mb.batch_invariant:
        pytest.skip("backend does not claim batch invariance on this device")
    kc = mx.array(rng.standard_normal((300, 1, 256)).astype(np.float32))
    vc = mx.array(rng.standard_normal((300, 1, 256)).astype(np.float32))
    q = mx.array(rng.standard_normal((16, 4, 256)).astype(np.float32))
    for window in (0, 100):
        full = mb.to_host(mb.attention(q, kc, vc, np.arange(200, 216), window, 0.0625))
        for i in (0, 7, 15):
            one = mb.to_host(mb.attention(q[i : i + 1], kc, vc, np.array([200 + i]), window, 0.0625))
            assert np.array_equal(one[0], full[i])


# ---- whole models -----------------------------------------------------------------------
@dataclass
class _Draft:
    tokens: list[int]
    source: str = "script"
    match_len: int = 3


class _Oracle:
    """Drafts the true continuation, corrupted from a given offset (drives accept and reject)."""

    def __init__(self, truth: list[int], wrong_from: int) -> None:
        self.truth, self.wrong_from, self.reply = truth, wrong_from, []

    def extend_source(self, source_id: str, tokens: list[int]) -> None:
        self.reply.extend(tokens)

    def draft(self, context: list[int], max_len: int) -> _Draft:
        pos = len(self.reply)
        toks = list(self.truth[pos : pos + max_len])
        return _Draft([t if pos + i < self.wrong_from else (t + 1) % 50 for i, t in enumerate(toks)])


class _Fixed:
    def __init__(self, k: int) -> None:
        self.max_draft, self.cost = k, self

    def choose(self, draft, context_len: int, remaining: int, pow2: bool = False) -> int:
        return min(len(draft.tokens), self.max_draft)

    def observe(self, *args) -> None:
        pass


@pytest.fixture(scope="module", params=[("llama", "affine"), ("gemma3", "affine"), ("llama", "auto"),
                                        ("gemma3", "float")], ids=lambda p: "-".join(p))
def tiny_mlx_model(request, tmp_path_factory):
    from echoline.engine.models.loader import load_model

    from tests.synth import write_model

    arch, mode = request.param
    path = write_model(Path(tmp_path_factory.mktemp("mlx")) / f"{arch}.gguf", arch,
                       qtype=Q.Q4_1, vocab=50, sliding_window=6, seed=5)
    model = load_model(path, MlxBackend(weights=mode))[1]
    model.source_path = path
    return model


def _generate(model, prompt, n, index=None, k=0, cache=None):
    from echoline.engine.generate import StopRules, generate_tokens

    cache = cache or model.new_cache(64)
    res = generate_tokens(model, cache, prompt, decode=lambda ids: "", rules=StopRules(max_tokens=n),
                          index=index, controller=_Fixed(k) if index else None, prefill_chunk=5)
    return res.token_ids, cache


@pytest.mark.parametrize("k,wrong_from", [(1, 99), (4, 99), (6, 5), (3, 0)])
def test_speculative_equals_plain_tiny(tiny_mlx_model, k, wrong_from):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain, pc = _generate(tiny_mlx_model, prompt, 14)
    spec, sc = _generate(tiny_mlx_model, prompt, 14, _Oracle(plain, wrong_from), k)
    assert spec == plain
    n = len(prompt) + len(plain)
    for a, b in zip(pc.k, sc.k, strict=True):
        assert np.array_equal(np.array(a)[:n], np.array(b)[:n])


def test_warm_equals_cold_tiny(tiny_mlx_model):
    """A second turn on a reused cache gives what a fresh cache gives."""
    first = [7, 8, 9, 10]
    reply, cache = _generate(tiny_mlx_model, first, 6)
    second = first + reply + [11, 12]
    cache.truncate(min(cache.length, len(second) - 1))
    warm, _ = _generate(tiny_mlx_model, second, 6, cache=cache)
    cold, _ = _generate(tiny_mlx_model, second, 6)
    assert warm == cold


def test_tiny_model_logits_match_numpy(tiny_mlx_model):
    """The same synthetic file on numpy and MLX: logits agree to float32 rounding, chunked or not."""
    from echoline.engine.models.loader import load_model

    _, np_model = load_model(tiny_mlx_model.source_path, NumpyBackend())
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    got = tiny_mlx_model.backend.to_host(tiny_mlx_model.forward(ids, tiny_mlx_model.new_cache(32)))
    want = np_model.forward(ids, np_model.new_cache(32))
    assert got.shape == want.shape == (len(ids), 50)
    close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("model_name,case,mode", [("SmolLM2-135M-Instruct.Q4_1.gguf", "py_class", "affine"),
                                                  ("SmolLM2-135M-Instruct.Q4_1.gguf", "py_class", "float"),
                                                  ("gemma-3-270m-q4_k_m.gguf", "py_fib", "auto")])
def test_real_model_greedy_matches_llamacpp(request, model_name, case, mode):
    """Greedy ids on MLX equal llama.cpp's for prompts where float32 engines agree with it."""
    from echoline.engine.models.loader import load_model

    from tests.conftest import reference_data

    path = request.getfixturevalue("smollm2_path" if model_name.startswith("SmolLM2") else "gemma_path")
    ref = reference_data()["models"][model_name][case]
    _, model = load_model(path, MlxBackend(weights=mode))
    got, _ = _generate(model, ref["prompt_ids"], 10)
    assert got == ref["greedy_ids"][:10]


@pytest.mark.slow
def test_real_model_speculative_equals_plain(smollm2_path):
    from echoline.engine.drafting.ngram_index import NgramIndex
    from echoline.engine.models.loader import load_model

    _, model = load_model(smollm2_path, MlxBackend())
    prompt = [1604, 3987, 46477, 24, 94, 727, 472, 1620, 1604, 3987, 46477]
    plain, _ = _generate(model, prompt, 10)
    index = NgramIndex()
    index.set_source("prompt", prompt)
    index.set_source("reply", [])
    assert _generate(model, prompt, 10, index, 4)[0] == plain
    assert _generate(model, prompt, 10, _Oracle(plain, 6), 4)[0] == plain
