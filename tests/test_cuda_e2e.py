"""The real SmolLM2 file on the CUDA backend: exactness end to end.

Speculative decoding must equal plain greedy decoding token for token, and a
warm session (reused cache) must equal a cold one, on the GPU with graphs in
the loop. Skips cleanly without CuPy, a CUDA device, or the model file
(``ECHOLINE_CUDA_MODEL`` overrides the default path).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception:  # noqa: BLE001 - CuPy raises its own runtime error types
    pytest.skip("no CUDA device", allow_module_level=True)

MODEL = Path(
    os.environ.get(
        "ECHOLINE_CUDA_MODEL", str(Path.home() / ".cache/echoline/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    )
)
if not MODEL.is_file():
    pytest.skip(f"model file {MODEL} not present", allow_module_level=True)

from echoline.engine.api import Engine  # noqa: E402

from tests.test_real_models import check_spec_equals_plain  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine.load(str(MODEL), backend="cuda")


def test_graph_forward_equals_eager_forward(eng):
    """Rows through captured graphs are bit-identical to the eager path, for every row count."""
    model, b = eng.model, eng.backend
    ids = eng.encode("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n" * 6)
    cache = model.new_cache(len(ids) + 64)
    model.forward(ids[:40], cache, all_logits=False)
    graph_rows = b.graph_max_rows
    try:
        for k in (1, 2, 5, 16, 17, 32, 40, 64):
            for _ in range(2):  # the first call captures, the second replays
                cache.truncate(40)
                got = b.to_host(model.forward(ids[40 : 40 + k], cache))
            b.graph_max_rows = 0
            cache.truncate(40)
            want = b.to_host(model.forward(ids[40 : 40 + k], cache))
            b.graph_max_rows = graph_rows
            assert np.array_equal(got, want), f"graph forward of {k} rows differs from eager"
    finally:
        b.graph_max_rows = graph_rows


def test_gpu_logits_match_numpy_reference(eng):
    numpy_eng = Engine.load(str(MODEL), backend="numpy")
    ids = eng.encode("import os\n\ndef walk(root):\n    for dirpath, _, files in os.walk(root):\n")
    got = eng.backend.to_host(eng.model.forward(ids, eng.model.new_cache(len(ids) + 8)))
    want = numpy_eng.model.forward(ids, numpy_eng.model.new_cache(len(ids) + 8))
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-3, err
    assert (np.argmax(got, -1) == np.argmax(want, -1)).mean() >= 0.95


def test_speculative_equals_plain_on_gpu(eng):
    accepted = check_spec_equals_plain(eng)
    assert accepted > 0  # speculation actually ran


def test_warm_equals_cold_on_gpu(eng):
    """Turns on a reused session (warm cache, graphs replayed) == one-off caches (cold)."""
    turns = ["Write a Python function that adds two numbers.", "Now make it add three.", "Thanks!"]
    replies = {}
    for mode in ("plain", "spec", "cold"):
        messages: list[dict[str, str]] = []
        out = []
        for q in turns:
            messages.append({"role": "user", "content": q})
            ids = eng.encode_chat(messages)
            res = eng.generate(
                ids, max_tokens=24, spec=mode == "spec", session=None if mode == "cold" else f"gpu-{mode}"
            )
            if mode != "cold" and out:
                assert res.stats.reused_tokens > 0
            out.append(res.token_ids)
            messages.append({"role": "assistant", "content": res.text})
        replies[mode] = out
    assert replies["plain"] == replies["spec"] == replies["cold"]
