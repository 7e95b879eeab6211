"""Earlier replies as draft sources (``Engine.remember_reply``): bounded, forgettable, exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from echoline.engine.api import HISTORY_CONTEXT
from echoline.engine.drafting.controller import DraftController, VerifyCost

from tests.synth import write_model
from tests.test_sessions import VOCAB, buffer, make_engine


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("h") / "llama.gguf", "llama", vocab=VOCAB, context=1024, seed=9)


def eager(engine) -> None:
    """A controller that finds verifying nearly free, so every match is drafted."""
    engine._controller = DraftController(VerifyCost.from_ratios([1.0 + 0.001 * r for r in range(18)]), max_draft=16)


def test_a_retried_request_drafts_the_earlier_reply_and_stays_exact(model_path) -> None:
    eng = make_engine(model_path)
    eager(eng)
    prompts = [buffer(70, seed) for seed in (1, 2, 3)]
    plain = [eng.generate(p, max_tokens=40, spec=False).token_ids for p in prompts]
    assert len(eng.history_sources()) == 3
    for p, want in zip(prompts, plain, strict=True):
        res = eng.generate(p, max_tokens=40, spec=True)
        assert res.token_ids == want  # token ids, not text
        from_history = {s: c for s, c in res.stats.per_source.items() if s.startswith("history:")}
        # The same request again: the kept reply (behind the same prompt tail) is drafted
        # from the first round on, and the model confirms it.
        assert sum(c["accepted"] for c in from_history.values()) >= len(want) // 2, res.stats.per_source


def test_history_is_bounded_and_forgettable(model_path) -> None:
    eng = make_engine(model_path, reply_history=2)
    for seed in range(4):
        eng.generate(buffer(30, seed), max_tokens=6, spec=False)
    kept = eng.history_sources()
    assert len(kept) == 2 and kept == [s for s in eng.index.sources() if s.startswith("history:")][::-1]
    p = buffer(30, 3)
    reply = eng.generate(p, max_tokens=6, spec=False).token_ids
    newest = eng.history_sources()[-1]
    assert eng.index.source_tokens(newest) == p[-HISTORY_CONTEXT:] + reply
    eng.forget_replies()
    assert eng.history_sources() == [] and not any(s.startswith("history:") for s in eng.index.sources())
    off = make_engine(model_path, reply_history=0)
    off.generate(p, max_tokens=6, spec=False)
    assert off.history_sources() == []


def test_lowering_the_history_drops_the_oldest(model_path) -> None:
    eng = make_engine(model_path, reply_history=3)
    for seed in range(3):
        eng.generate(buffer(30, seed), max_tokens=5, spec=False)
    newest = eng.history_sources()[-1]
    eng.set_reply_history(1)
    assert eng.history_sources() == [newest] and eng.reply_history == 1
    eng.set_reply_history(0)
    assert eng.history_sources() == []
