"""The streamed tensor-core products (kernels.cu mtq_body, ``CupyBackend.tensor_stream``).

A block streams its tile's rows through shared memory in chunks of KW units and runs
mt_body's own unit math and warp-order totals, so for the same KW it must give mt_body's
bits, for every row count and ring depth. Off by default (slower at one row); switched on,
only a 7B's widths take it, and small weights here by lowering ``tensor_stream_min_dim``.
Skips without CuPy or a GPU.
"""

from __future__ import annotations

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

from tests.test_cuda_backend import (  # noqa: E402
    TC_TYPES,
    assert_rows_invariant,
    make_tensor,
    poison,
    tc_check,
    wide_range_x,
)

pytestmark = pytest.mark.gpu
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def sb() -> CupyBackend:
    """A backend whose streamed kernels take every tensor-core weight of >= 64 inputs."""
    b = CupyBackend()
    b.tensor_stream, b.tensor_stream_min_dim = True, 64
    return b


@pytest.fixture
def rng(request) -> np.random.Generator:
    return np.random.default_rng(abs(hash(request.node.name)) % (2**32))


def _ops(b, rng, qtype, d: int, n_ff: int = 72) -> dict:
    """Plain, norm, gated, residual and two-type-pair products over rows [s, e)."""
    gate_up = b.prepare_matrix(
        [make_tensor(rng, n_ff, d, qtype, "g"), make_tensor(rng, n_ff, d, qtype, "u")]
    )
    pair = b.prepare_matrix(
        [make_tensor(rng, 96, d, qtype, "qk"), make_tensor(rng, 40, d, Q.Q6_K, "v")]
    )
    gd = b.prepare_vector((1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    bias = b.prepare_vector(rng.standard_normal(136).astype(np.float32))
    x = cupy.asarray(wide_range_x(rng, 64, d))
    res = cupy.asarray(rng.standard_normal((64, 2 * n_ff)).astype(np.float32))
    return {
        "plain": lambda s, e: b.matmul(x[s:e], gate_up),
        "norm": lambda s, e: b.norm_matmul(x[s:e], gd, 1e-5, gate_up),
        "glu": lambda s, e: b.norm_matmul_glu(x[s:e], gd, 1e-5, gate_up, n_ff, False),
        "add": lambda s, e: b.matmul_add(x[s:e], gate_up, res[s:e]),
        "pair": lambda s, e: b.norm_matmul(x[s:e], gd, 1e-6, pair, bias),
    }


@pytest.mark.parametrize("qtype", TC_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("kw", [4, 8, 16], ids=lambda k: f"w{k}")
def test_stream_equals_mt_body(sb, monkeypatch, rng, qtype, kw):
    """KW 4 / 8 / 16 (K of 1,024: 16 units; Q6_K's 210-byte blocks start chunks anywhere in a
    16-byte line), 4 or 8 stages: every op equals mt_body with the same KW, bit for bit, at
    1, 3, 16 and 40 rows; the streamed kernels really ran."""
    monkeypatch.setattr(sb, "_tensor_shape", lambda w, act: (1, kw))
    ops = _ops(sb, rng, qtype, 1024)
    for n in (1, 3, 16, 40):
        got = {}
        for stream, stages in ((False, 4), (True, 4), (True, 8)):
            sb.tensor_stream, sb.tensor_stream_stages = stream, stages
            got[(stream, stages)] = {}
            for name, op in ops.items():
                poison()
                got[(stream, stages)][name] = sb.to_host(op(0, n))
        sb.tensor_stream, sb.tensor_stream_stages = True, 4
        for name in ops:
            want = got[(False, 4)][name]
            assert np.isfinite(want).all()
            for key in ((True, 4), (True, 8)):
                assert np.array_equal(got[key][name], want), f"{name}, {n} rows, stages {key[1]}"


def test_stream_takes_its_shapes_only(rng):
    """Switched on: a 7B's 3,584-wide weights (and its 18,944-long down projection) stream,
    the 0.5B's and 1.5B's shapes (896 / 1,536 wide, their 4,864 / 8,960-long down
    projections) do not; KW divides the row's units. Off by default: nothing streams."""
    b = CupyBackend()
    w7 = b.prepare_matrix([make_tensor(rng, 3584, 3584, Q.Q4_K)])
    assert b._stream_warps(w7, 0) == 0
    b.tensor_stream = True
    for rows, cols, want in (
        (3584, 3584, True), (512, 3584, False), (896, 4864, False), (1536, 8960, False),
        (1536, 1536, False), (3584, 18944, True),
    ):  # fmt: skip
        w = b.prepare_matrix([make_tensor(rng, rows, cols, Q.Q4_K)])
        kw = b._stream_warps(w, 0)
        assert bool(kw) == want, (rows, cols, kw)
        assert not kw or (cols // 64) % kw == 0
    gate_up = b.prepare_matrix(
        [make_tensor(rng, 3584, 3584, Q.Q4_K, "g"), make_tensor(rng, 3584, 3584, Q.Q4_K, "u")]
    )
    assert b._stream_warps(gate_up, 1) == b._tensor_shape(gate_up, 1)[1]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name)
def test_stream_batch_invariant_and_within_bounds(sb, rng, qtype):
    """Every row count (1…64, offsets, chunks of 7) bit-identical on the streamed kernels, K of
    1,280 (20 units: KW 4); the plain product within the f16 bounds of the reference."""
    ops = _ops(sb, rng, qtype, 1280)
    assert_rows_invariant(sb, ops)
    t = make_tensor(rng, 100, 1280, qtype)  # a partial tile
    w, w_ref = sb.prepare_matrix([t]), NumpyBackend().prepare_matrix([t])
    assert sb._stream_warps(w, 0) == 4
    x = wide_range_x(rng, 17, 1280)
    poison()
    tc_check(w_ref, x, sb.to_host(sb.matmul(cupy.asarray(x), w)))
