"""Verifies of up to 64 rows on a backend that offers them (CUDA: ``verify_max_rows``).

On a GPU a 64-row forward costs a few one-row forwards, so a draft copied from a file or
an earlier reply is verified 63 tokens at a time instead of 15. Checked here without a GPU,
on the numpy reference with the CUDA backend's graph interface emulated: the engine drafts
that far by default, verify rounds keep to the graph widths (1, 2, 4 … 64 rows, so a cache
captures at most seven shapes), and every reply equals plain decoding token for token,
including budgets that end inside a long accepted run and a later turn on the reused cache.
The device runs the same rounds in ``tests/test_cuda_e2e.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from echoline.engine.api import HISTORY_CONTEXT, Engine
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.generate import graph_widths, width_drafts

from tests.synth import write_model
from tests.test_sessions import VOCAB, StandInTokenizer, buffer
from tests.test_shared_graph_buffers import GraphNumpy


class WideGraphNumpy(GraphNumpy):
    """Graphs and verifies up to 64 rows, as ``CupyBackend``."""

    graph_max_rows = 64
    verify_max_rows = 64


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    return write_model(
        tmp_path_factory.mktemp("w") / "qwen2.gguf", "qwen2", vocab=VOCAB, context=1024, seed=3
    )


def wide_engine(path: Path, monkeypatch) -> tuple[Engine, WideGraphNumpy]:
    monkeypatch.delenv("ECHOLINE_MAX_DRAFT", raising=False)
    backend = WideGraphNumpy()
    engine = Engine(path, backend=backend, tokenizer=StandInTokenizer())
    # verifying is nearly free here, so every match is drafted as far as it goes
    ratios = [1.0 + 0.001 * r for r in range(engine.max_draft + 2)]
    engine._controller = DraftController(VerifyCost.from_ratios(ratios), max_draft=engine.max_draft)
    return engine, backend


def verify_widths(backend: WideGraphNumpy) -> set[int]:
    return {
        k[1] for graphs in backend.graphs.values() for k in graphs if k[0] == "forward" and k[2]
    }


def test_the_default_draft_follows_the_backend(path, monkeypatch):
    engine, backend = wide_engine(path, monkeypatch)
    assert engine.max_draft == 63
    assert graph_widths(backend) == (1, 2, 4, 8, 16, 32, 64)
    ks = (0, 1, 2, 3, 14, 15, 16, 40, 62, 63)
    assert [width_drafts(k) for k in ks] == [0, 1, 1, 3, 7, 15, 15, 31, 31, 63]
    monkeypatch.setenv("ECHOLINE_MAX_DRAFT", "15")
    assert Engine(path, backend=WideGraphNumpy(), tokenizer=StandInTokenizer()).max_draft == 15


@pytest.mark.parametrize("max_tokens", [40, 90, 150])
def test_long_drafts_equal_plain_decoding(path, monkeypatch, max_tokens):
    """Each request twice: plain, then speculative with the plain reply kept as a source, so
    whole 63-token drafts are accepted; the budget ends inside such a run for 40 and 90."""
    engine, backend = wide_engine(path, monkeypatch)
    for seed in (1, 2):
        prompt = buffer(120, seed)
        engine.forget_replies()
        want = engine.generate(prompt, max_tokens=max_tokens, spec=False, session="a").token_ids
        assert len(want) == max_tokens
        got = engine.generate(prompt, max_tokens=max_tokens, spec=True, session="a")
        assert got.token_ids == want  # token ids, not text
        assert got.stats.accepted >= max_tokens // 2
    used = verify_widths(backend)
    assert used <= set(graph_widths(backend)), used
    assert max(used) <= max_tokens, used  # never a verify past the budget
    if max_tokens == 150:  # long enough for the acceptance model to trust whole drafts
        assert 64 in used, used  # a 63-token draft verified in one round


def test_a_later_turn_on_the_reused_cache_equals_a_cold_one(path, monkeypatch):
    """Turn two extends turn one's prompt and reply; on the warm cache, with 63-token drafts
    from the kept reply, it writes the ids a cold engine's plain decoding writes."""
    engine, _ = wide_engine(path, monkeypatch)
    first = buffer(100, 5)
    reply = engine.generate(first, max_tokens=80, spec=True, session="a").token_ids
    second = first + reply + buffer(9, 6)
    warm = engine.generate(second, max_tokens=80, spec=True, session="a")
    assert warm.stats.reused_tokens >= len(first)
    cold, _ = wide_engine(path, monkeypatch)
    assert warm.token_ids == cold.generate(second, max_tokens=80, spec=False).token_ids


def test_a_stop_inside_a_long_accepted_draft(path, monkeypatch):
    """The kept reply runs on past an end-of-generation id and a stop string, so a 63-token
    draft carries them mid-run: speculation stops exactly where plain decoding does."""
    engine, _ = wide_engine(path, monkeypatch)
    prompt = buffer(120, 7)
    full = engine.generate(prompt, max_tokens=150, spec=False).token_ids  # kept as a source
    # an id, and a text, that first occur well inside the first 63-token draft
    eos = next(full[i] for i in range(12, 60) if full[i] not in full[:i])
    text = engine.tokenizer.decode(full)
    stop = next(text[c : c + 3] for c in range(20, 60) if text[c : c + 3] not in text[: c + 2])
    for kw in ({"stop_id_when": lambda t: t == eos}, {"stop": (stop,)}):
        want = engine.generate(prompt, max_tokens=150, spec=False, **kw)
        engine.forget_replies()
        engine.remember_reply(list(full), before=prompt[-HISTORY_CONTEXT:])
        got = engine.generate(prompt, max_tokens=150, spec=True, **kw)
        assert got.token_ids == want.token_ids and got.text == want.text
        n = len(want.token_ids)
        assert 12 <= n < 64 and got.stats.accepted >= 0.8 * n, (n, got.stats.accepted)
