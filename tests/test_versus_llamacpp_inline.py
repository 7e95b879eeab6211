"""tools/versus_llamacpp_inline: inline completions while typing, echoline against
llama-server on the same prompt ids, at a small scale on SmolLM2.

The figures live in docs/benchmarks.md; this checks the tool: the typing requests are
``bench inline``'s, both engines get every request, each keeps its cache between keystrokes
(a request runs again only the typed text and what follows it, in both), and the JSON
carries every key scripts read. Builds llama-server as tests/test_remote_llamacpp.py does
(cached, skips without a tool chain).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import cpu_backend_name
from tests.test_remote_llamacpp import _toolchain_missing

SOURCE = Path(__file__).resolve().parent.parent / "engine" / "api.py"


def test_typing_requests_type_one_line_back():
    from tools.versus_llamacpp_inline import typing_requests

    text = SOURCE.read_text()
    reqs = typing_requests(text, 7)
    assert len(reqs) >= 3
    suffixes = {s for _, s in reqs}
    assert len(suffixes) == 1  # the text after the typed line never changes
    prefixes = [p for p, _ in reqs]
    assert all(b.startswith(a) for a, b in zip(prefixes, prefixes[1:], strict=False))
    assert all(len(b) - len(a) == 7 for a, b in zip(prefixes[:-1], prefixes[1:-1], strict=False))
    suffix = reqs[0][1]
    assert text.startswith(prefixes[-1]) and text.endswith(suffix)
    assert 0 <= len(text) - len(prefixes[-1]) - len(suffix) < 7  # the line typed back, within a step
    assert typing_requests(text, 0) == [] and typing_requests("x = 1\n", 4) == []


@pytest.mark.slow
def test_side_by_side_inline_reuses_both_caches(smollm2_path, capsys):
    reason = _toolchain_missing()
    if reason:
        pytest.skip(reason)
    from echoline.engine.api import Engine

    from tools.llamacpp_peer import build
    from tools.versus_llamacpp_inline import run, typing_requests

    # three or four requests whatever the typed line's length (the source changes with the code)
    step = max(1, (len(typing_requests(SOURCE.read_text(), 1)) - 1) // 3)
    args = argparse.Namespace(
        model=str(smollm2_path), backend=cpu_backend_name(), source=[str(SOURCE)], step=step, max_tokens=8,
        suffix_tokens=None, ctx=4096, llama_server=str(build()), llama_args="--poll 0", verbose=False,
        json=True,
    )  # fmt: skip
    out = run(args)
    assert out["requests"] >= 2 and out["sources"] == ["api.py"]
    assert out["suffix_tokens"] is not None  # the auto budget of a CPU engine
    prompt_len = len(Engine.load(smollm2_path, backend="numpy").encode(SOURCE.read_text()[:2000]))
    for name in ("echoline", "llama"):
        row = out["engines"][name]
        assert row["requests"] == out["requests"]
        assert row["median_s"] > 0 and row["p90_s"] >= row["median_s"]
        assert 0 < row["mean_generated"] <= 8
        # a keystroke runs again the typed text (one step of characters) and no more: the cache held
        assert 0 < row["median_prompt_run"] < min(40, prompt_len // 4), (name, row)
    assert 0 <= out["same_replies"] <= out["requests"]
    assert out["speedup"] == pytest.approx(out["engines"]["llama"]["median_s"] / out["engines"]["echoline"]["median_s"],
                                           rel=2e-2)
    assert "llama / echoline" in capsys.readouterr().err
