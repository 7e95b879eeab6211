"""tools.engine.host_profile: the decode loop replayed on recorded replies, host time alone."""

from __future__ import annotations

import random

from echoline.engine.api import Engine

from tests.synth import write_model
from tests.test_sessions import StandInTokenizer
from tools.engine.host_profile import replay_host_times


def test_replay_reproduces_the_replies_and_restores_the_engine(tmp_path):
    """The replay's replies must equal the recorded ones in both modes (the tool raises
    otherwise); its forwards cost the curve's time, so the forward dominates; the engine's
    model and controller come back."""
    path = write_model(tmp_path / "m.gguf", "llama", context=512)
    engine = Engine(path, backend="cpu", tokenizer=StandInTokenizer())
    rng = random.Random(5)
    base = [rng.randrange(1, 96) for _ in range(30)]
    prompts = [base + base[:12], base[5:] + base[:20]]  # repeats give the drafter matches
    model = engine.model
    got = replay_host_times(engine, prompts, max_tokens=24, step_ms=2.0, rounds=1)
    assert engine.model is model
    for mode in ("plain", "spec"):
        m = got[mode]
        assert m["tokens_round"] >= 1.0
        assert 0.0 < m["forward_share"] <= 1.0
        assert m["host_us_round"] >= 0.0
    assert got["plain"]["lookup_us_round"] == 0.0
    # a 2 ms step bounds plain decoding at 500 tok/s; the repeats let speculation beat it
    assert got["plain"]["tok_s"] < 520
    assert got["spec"]["tokens_round"] > 1.5 and got["spec"]["tok_s"] > got["plain"]["tok_s"]
