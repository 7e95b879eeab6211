"""tools/versus_llamacpp's ``next-edit`` traffic: the very prompts ``echoline bench next-edit``
generates from, one per case of the tune split.

Why a test of the prompts alone: the side-by-side only means something if llama-server gets
the edit-prediction path's own prompt ids. The bench is run for real (its case loading, edit
replay and prompt building) on a tiny synthetic qwen2 model with Qwen2.5-Coder's control
tokens, with the generation step replaced by a recorder, so nothing is decoded and no real
model or llama-server is needed (the arms themselves run in tests/test_versus_llamacpp.py).
"""

from __future__ import annotations

import argparse

import pytest

from tests.synth import write_fim_qwen2_model

CASES = 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from echoline.engine.api import Engine

    path = write_fim_qwen2_model(tmp_path_factory.mktemp("ne") / "fim-qwen2.gguf", seed=3, context=16384)
    return Engine.load(path, backend="numpy")


def _bench_prompts(engine, monkeypatch) -> list[list[int]]:
    """The prompt ids ``bench next-edit --split tune --limit CASES --no-plain`` hands to the
    next-edit job, in order (each case runs cold, warm, then after the cursor's warm-up:
    three per case)."""
    from echoline.engine.api import Engine
    from echoline.sidecar.bench import next_edit as bench
    from echoline.sidecar.next_edit import FORMATS, NextEditOutcome

    seen: list[list[int]] = []

    def record(eng, parts, *, fmt, spec, session):
        ids = FORMATS[fmt](eng, parts).ids
        seen.append(ids)
        return NextEditOutcome([], "unchanged", "", [], 0, {}, len(ids))

    monkeypatch.setattr(bench, "run_next_edit", record)
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: engine))
    monkeypatch.setattr(engine, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr(engine, "prefill", lambda *a, **k: None)
    args = argparse.Namespace(model="synthetic", backend="numpy", split="tune", case=[], limit=CASES,
                              format=None, region_lines=None, no_plain=True)  # fmt: skip
    bench.run(args)
    assert len(seen) == 3 * CASES
    assert seen[0::3] == seen[1::3] == seen[2::3]  # cold, warm and rested: one prompt
    return seen[0::3]


def test_next_edit_traffic_sends_the_benchs_prompts(engine, monkeypatch):
    from tools.versus_llamacpp import TRAFFIC, prompt_sets

    assert "next-edit" in TRAFFIC
    sets = prompt_sets(engine, ["next-edit"], 64, next_edit_cases=CASES)  # (copy/edit need a chat template)
    assert list(sets) == ["next-edit"]
    assert sets["next-edit"] == _bench_prompts(engine, monkeypatch)
    assert len({tuple(p) for p in sets["next-edit"]}) == CASES  # one prompt per case, all different
    sep = engine.tokenizer.encode("<|file_sep|>", add_bos=False, parse_special=True)
    assert len(sep) == 1  # the control token, not its text
    for ids in sets["next-edit"]:
        text = engine.tokenizer.decode(ids)
        assert text.startswith("<|file_sep|>") and "\n<|file_sep|>updated/" in text  # filesep format
        assert ids.count(sep[0]) >= 4  # file, edit diff, current region, open updated block


def test_next_edit_cases_zero_takes_the_whole_tune_split(engine):
    from echoline.sidecar.bench.next_edit import load_cases

    from tools.versus_llamacpp import next_edit_prompts, prompts

    assert len(next_edit_prompts(engine)) == len(load_cases("tune"))
    assert prompts(engine, ["next-edit"]) == {}  # the single-prompt kinds' function has none
    with pytest.raises(SystemExit, match="unknown traffic chat"):
        prompts(engine, ["chat"])
