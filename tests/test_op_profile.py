"""engine.bench.op_profile: per-op attribution inside whole forwards, on a synthetic model."""

from __future__ import annotations

from engine.api import Engine
from engine.bench.op_profile import profile
from tests.synth import write_model
from tests.test_sessions import StandInTokenizer


def test_parts_add_up_to_at_most_the_whole_and_the_backend_is_restored(tmp_path):
    path = write_model(tmp_path / "m.gguf", "llama", context=512)
    engine = Engine(path, backend="cpu", tokenizer=StandInTokenizer())
    got = profile(engine, context=40, rows=[1, 5], reps=3)
    for rows in (1, 5):
        parts = {k: v for k, v in got[rows].items() if k != "total"}
        assert parts["matmul"] > 0 and parts["attention"] > 0
        assert sum(parts.values()) <= got[rows]["total"]
    assert "matmul" not in vars(engine.model.backend)  # the timing wrappers are gone
