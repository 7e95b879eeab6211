"""tools.engine.op_profile: per-op attribution inside whole forwards, on a synthetic model."""

from __future__ import annotations

from echoline.engine.api import Engine

from tests.synth import write_model
from tests.test_sessions import StandInTokenizer
from tools.engine.op_profile import profile


def test_parts_add_up_to_at_most_the_whole_and_the_backend_is_restored(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama", context=512)
    engine = Engine(path, backend="cpu", tokenizer=StandInTokenizer())
    got = profile(engine, context=40, rows=[1, 5], reps=3)
    for rows in (1, 5):
        parts = {k: v for k, v in got[rows].items() if k != "total"}
        assert parts["matmul"] > 0 and parts["attention"] > 0
        assert sum(parts.values()) <= got[rows]["total"]
    assert "matmul" not in vars(engine.model.backend)  # the timing wrappers are gone


def test_fidelity_counts_every_position_and_f32_follows_float64(tmp_path):
    """tools.engine.fidelity: the f32 mode tracks the float64 model; q8 (where the host has
    VNNI) is scored on the same positions."""
    import random

    from tools.engine.fidelity import agreement, modes_available

    path = write_model(tmp_path / "m.gguf", "llama", context=512)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 96) for _ in range(n)] for n in (60, 90)]
    got = agreement(path, prompts, tokenizer=StandInTokenizer())
    assert got["positions"] == 150
    assert got["f32"] >= 0.97
    for mode in modes_available():
        assert 0.0 <= got[mode] <= 1.0
