"""tools/versus_llamacpp: the side-by-side with llama-server, on SmolLM2, at a small scale.

The figures themselves live in docs/benchmarks.md (a benchmark, not a test); this checks
the tool: both engines get the same prompt ids, every arm runs (the cold n-gram arm on a
fresh server, the warm echoline arm with the reply kept), the JSON carries every key
scripts read, and echoline's speculative replies, cold and warm, equal its plain reply.
Builds llama-server as tests/test_remote_llamacpp.py does (cached, skips without a tool chain).
"""

from __future__ import annotations

import argparse

import pytest

from tests.conftest import cpu_backend_name
from tests.test_remote_llamacpp import _toolchain_missing

pytestmark = pytest.mark.slow

KEYS = (
    "llama_plain_tok_s", "llama_ngram_tok_s", "llama_ngram_cold_tok_s", "echo_plain_tok_s",
    "echo_spec_tok_s", "echo_spec_warm_tok_s", "plain_vs_llama", "spec_vs_llama_ngram",
    "spec_vs_llama_ngram_cold", "spec_warm_vs_llama_ngram", "echo_spec_ratio",
    "llama_ngram_ratio", "echo_spec_equals_plain", "echo_spec_warm_equals_plain",
    "llama_ngram_equals_plain", "llama_ngram_cold_equals_plain", "prompt_tokens",
)  # fmt: skip


def test_side_by_side_runs_every_arm(smollm2_path, capsys):
    reason = _toolchain_missing()
    if reason:
        pytest.skip(reason)
    from tools.llamacpp_peer import build
    from tools.versus_llamacpp import run

    args = argparse.Namespace(
        model=str(smollm2_path), backend=cpu_backend_name(), traffic="copy,rewrite", max_tokens=24,
        rounds=1, json=True, llama_server=str(build()), llama_args="--poll 0",
    )  # fmt: skip
    out = run(args)
    assert set(out["traffic"]) == {"copy", "rewrite"}
    for row in out["traffic"].values():
        assert set(KEYS) <= set(row)
        assert row["echo_spec_equals_plain"] is True and row["echo_spec_warm_equals_plain"] is True
        assert row["prompt_tokens"] > 100
        for key in KEYS[:6]:
            assert row[key] > 0, key
    row = out["traffic"]["copy"]
    cold = row["echo_spec_tok_s"] / row["llama_ngram_cold_tok_s"]
    assert row["spec_vs_llama_ngram_cold"] == pytest.approx(cold, rel=1e-2)
    assert out["resident"]["llama_server_mb"] > 0 and out["echoline_cached_start_s"] > 0
    assert set(out["isa"]) == {"llama", "echoline"}
    assert "ngram cold" in capsys.readouterr().out  # the printed table has the like-for-like arms


def test_rewrite_prompt_is_the_sidecars(smollm2_path):
    """The rewrite arm sends what ``bench spec --traffic rewrite`` sends for the held-out
    source (the sidecar's prompt, a function selected), unlike the chat-form copy/edit."""
    from echoline.engine.api import Engine
    from echoline.sidecar.bench.rewrite_traffic import rewrite_requests

    from tools.versus_llamacpp import HELD_OUT, prompts

    engine = Engine.load(smollm2_path, backend="numpy")  # prompts only: nothing is decoded
    ids = prompts(engine, ["copy", "rewrite"], 64)
    assert ids["rewrite"] == rewrite_requests(engine, [HELD_OUT], 64)[0][0]
    assert ids["rewrite"] != ids["copy"]
    assert "```" in engine.tokenizer.decode(ids["rewrite"])[-40:]  # the reply primed with a fence
    with pytest.raises(SystemExit, match="unknown traffic chat"):
        prompts(engine, ["chat"])
