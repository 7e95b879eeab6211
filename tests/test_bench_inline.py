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
    from echoline.sidecar.bench.inline import run

    src = tmp_path / "module.py"
    src.write_text("".join(f"def f{i}(a, b):\n    total_value = a * {i} + b * 2\n    return total_value\n\n"
                          for i in range(14)))
    args = argparse.Namespace(model=str(fim_model), backend="auto", source=[str(src)], step=6, positions=3,
                              suffix_tokens=32, no_spec=False)
    out = run(args)
    assert out["suffix_tokens"] == 32 and out["sources"] == ["module.py"]
    assert set(out["layouts"]) == {"before", "now"}
    for lay in out["layouts"].values():
        assert set(lay["typing"]) == {"requests", "median_s", "mean_s", "p90_s", "median_prefilled", "mean_prefilled"}
        assert set(lay["quality"]) == {"positions", "exact", "rate", "similarity"}
        assert lay["typing"]["requests"] > 0 and lay["quality"]["positions"] == 3
        assert 0.0 <= lay["quality"]["similarity"] <= 1.0
    before, now = out["layouts"]["before"]["typing"], out["layouts"]["now"]["typing"]
    # the old layout runs the ~600-token tail again per keystroke; the new one at most 32 of it
    assert now["mean_prefilled"] <= 32 + 8 < before["mean_prefilled"]
    assert out["speedup"] is not None


def test_bench_inline_navigation_keeps_the_head(tmp_path: Path) -> None:
    """``--jumps``: the cursor jumps about a file longer than the head window; keeping the
    previous head start (``now``) runs fewer prompt tokens again than the grid alone; a
    warm-up at each resting cursor (``warm``) leaves its request one token to run; and the
    JSON carries the navigation keys."""
    from echoline.sidecar.bench.inline import jumps, run

    model = write_fim_qwen2_model(tmp_path / "fim-long.gguf", seed=3, context=16384)
    src = tmp_path / "long_module.py"
    src.write_text("".join(f"def g{i}(a, b):\n    return a * {i} + b\n\n" for i in range(500)))  # ~17k chars
    offsets = jumps(src.read_text(), 12)
    assert len(offsets) == 13 and offsets == jumps(src.read_text(), 12)  # seeded: the same for every layout
    assert all(src.read_text()[o] == "\n" for o in offsets)  # each at the end of a line
    args = argparse.Namespace(model=str(model), backend="auto", source=[str(src)], step=0, positions=0,
                              suffix_tokens=16, no_spec=False, layouts=["grid", "now", "warm"], jumps=12)
    out = run(args)
    assert set(out["layouts"]) == {"grid", "now", "warm"} and out["jumps"] == 12
    grid, now = out["layouts"]["grid"]["navigation"], out["layouts"]["now"]["navigation"]
    assert grid["requests"] == now["requests"] == 12 and set(grid) == set(out["layouts"]["grid"]["typing"])
    assert now["mean_prefilled"] < grid["mean_prefilled"], (now, grid)
    warm = out["layouts"]["warm"]
    assert warm["navigation"]["requests"] == warm["warm_up"]["requests"] == 12 and "warm_up" not in out["layouts"]["now"]
    assert warm["navigation"]["median_prefilled"] <= 1 < now["median_prefilled"], (warm, now)
    assert set(out["navigation_speedup"]) == {"grid", "warm"} and out["speedup"] is None  # no "before" ran
    with pytest.raises(SystemExit, match="unknown layout"):
        run(argparse.Namespace(**{**vars(args), "layouts": ["sideways"]}))


def test_bench_inline_first_key_after_a_warm_up(tmp_path: Path) -> None:
    """``--first-key``: each jump's request is the first keystroke there (Enter and the
    indentation). After the warm-up at the cursor it runs only the keystroke and the tail
    (at most the 16-token budget and a few ids), and less than without the warm-up."""
    from echoline.sidecar.bench.inline import run

    model = write_fim_qwen2_model(tmp_path / "fim-long.gguf", seed=3, context=16384)
    src = tmp_path / "long_module.py"
    src.write_text("".join(f"def g{i}(a, b):\n    return a * {i} + b\n\n" for i in range(500)))
    args = argparse.Namespace(model=str(model), backend="auto", source=[str(src)], step=0, positions=0,
                              suffix_tokens=16, no_spec=False, layouts=["now", "warm"], jumps=6, first_key=True)
    out = run(args)
    assert out["first_key"] is True
    now, warm = out["layouts"]["now"]["navigation"], out["layouts"]["warm"]["navigation"]
    assert now["requests"] == warm["requests"] == 6
    assert 1 < warm["median_prefilled"] <= 16 + 8, warm
    assert warm["mean_prefilled"] < now["mean_prefilled"], (warm, now)


@pytest.mark.slow
def test_bench_inline_typing_through_the_server(fim_model: Path, tmp_path: Path) -> None:
    """``--typing``: a plain LSP client types into a file through the real server, a request
    per keystroke; every keystroke is counted once (typed through, recent or a model run),
    each place's first keystroke apart, and the server's own counters agree."""
    from echoline.sidecar.bench.inline import run
    from echoline.sidecar.bench.inline_typing import places

    src = tmp_path / "module.py"
    src.write_text("".join(f"def f{i}(a, b):\n    total_value = a * {i} + b * 2\n    return total_value\n\n"
                          for i in range(30)))
    assert len(places(src.read_text(), 3)) == 3
    args = argparse.Namespace(model=str(fim_model), backend="auto", source=[str(src)], step=4, positions=1,
                              suffix_tokens=32, no_spec=False, typing=True, places=2, keystrokes=4, edit_pause=0.2)
    out = run(args)
    assert out["sources"] == ["module.py"] and out["suffix_tokens"] == 32
    t = out["typing_lsp"]
    assert t["places"] == 2 and t["keystrokes"]["n"] == 8
    assert t["typed_through"]["n"] + t["recent"]["n"] + t["model"]["n"] == 8
    assert t["first_after_edit"]["n"] == 2 and len(t["first_after_edit"]["values"]) == 2
    assert t["server"]["typed"] == t["typed_through"]["n"] and t["server"]["recent"] == t["recent"]["n"]
    assert t["breakdown"]["prefill"]["n"] == t["model"]["n"]
    assert t["quality"]["positions"] == 1 and t["line_exact"]["keystrokes"] == 8
    for key in ("p50_s", "p90_s", "max_s"):
        assert t["keystrokes"][key] is not None and t["keystrokes"][key] >= 0
