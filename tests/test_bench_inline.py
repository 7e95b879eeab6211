"""``echoline bench inline`` on a tiny FIM model: its JSON shape (an interface) and what it
measures — the budgeted layout prefills fewer tokens a keystroke than the old one."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.synth import write_fim_qwen2_model


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fim_qwen2_model(tmp_path_factory.mktemp("fim") / "fim-qwen2.gguf", seed=3)


def test_bench_inline_json_and_prefill(fim_model: Path, tmp_path: Path) -> None:
    from echoline.sidecar.bench_inline import run

    src = tmp_path / "module.py"
    src.write_text("".join(f"def f{i}(a, b):\n    total_value = a * {i} + b * 2\n    return total_value\n\n"
                          for i in range(14)))
    args = argparse.Namespace(model=str(fim_model), backend="auto", source=[str(src)], step=6, positions=3,
                              suffix_tokens=32, no_spec=False)
    out = run(args)
    assert out["suffix_tokens"] == 32 and out["sources"] == ["module.py"]
    assert set(out["layouts"]) == {"before", "now"}
    for lay in out["layouts"].values():
        assert set(lay["typing"]) == {"requests", "median_s", "p90_s", "median_prefilled", "mean_prefilled"}
        assert set(lay["quality"]) == {"positions", "exact", "rate", "similarity"}
        assert lay["typing"]["requests"] > 0 and lay["quality"]["positions"] == 3
        assert 0.0 <= lay["quality"]["similarity"] <= 1.0
    before, now = out["layouts"]["before"]["typing"], out["layouts"]["now"]["typing"]
    # the old layout runs the ~600-token tail again per keystroke; the new one at most 32 of it
    assert now["mean_prefilled"] <= 32 + 8 < before["mean_prefilled"]
    assert out["speedup"] is not None
