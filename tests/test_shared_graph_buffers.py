"""Sessions trade KV buffers so graphs captured on one cache serve the next (engine/sessions.py).

On CUDA a graph is captured per row count on one cache's buffers; a new buffer's first
request used to capture its own (an eager forward and a capture per width). Now the store
keeps one set of buffers per capacity hot and the session about to run trades buffers with
their holder, each cache keeping its own rows. Checked here without a GPU: the trade keeps
every row of both caches; and with a numpy backend that emulates graphs (a "capture" keeps
the step function, which is pinned to the buffers it was made on, and replays it), replies
through alternating sessions, plain and speculative, equal cold runs token for token while
the second session captures nothing. The device itself: tests/test_cuda_backend.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from echoline.engine.api import Engine
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.kvcache import KVCache
from echoline.engine.models.loader import load_model

from tests.synth import write_model
from tests.test_sessions import VOCAB, StandInTokenizer, buffer
from tests.test_step_chain import ChainedNumpy


class GraphNumpy(ChainedNumpy):
    """The emulated graphs for verify widths too (as on the GPU: up to 17 rows)."""

    graph_max_rows = 17


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("g") / "qwen2.gguf", "qwen2", vocab=VOCAB, context=1024, seed=9)


def filled(model, prompt: list[int], capacity: int) -> KVCache:
    cache = model.new_cache(capacity)
    model.forward(prompt, cache, all_logits=False)
    return cache


def rows(cache: KVCache) -> list[np.ndarray]:
    n = cache.length
    return [np.array(a[:n]) for a in cache.k + cache.v]


def test_exchange_keeps_each_caches_rows(path):
    _, model = load_model(path, NumpyBackend())
    a, b = filled(model, buffer(40, 1), 64), filled(model, buffer(23, 2), 64)
    want_a, want_b = rows(a), rows(b)
    bufs_a, bufs_b = a.buffers, b.buffers
    a.exchange_buffers(b)
    assert a.buffers is bufs_b and b.buffers is bufs_a
    assert (a.length, b.length) == (40, 23)
    for got, want in ((rows(a), want_a), (rows(b), want_b)):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    other = filled(model, buffer(10, 3), 128)
    assert not a.can_exchange(other) and not a.can_exchange(a)
    with pytest.raises(ValueError, match="one capacity"):
        a.exchange_buffers(other)


def test_only_graph_backends_share(path):
    assert not Engine(path, backend="numpy", tokenizer=StandInTokenizer()).sessions.share_buffers
    assert Engine(path, backend=GraphNumpy(), tokenizer=StandInTokenizer()).sessions.share_buffers


@pytest.mark.parametrize("spec", [False, True])
def test_alternating_sessions_replay_one_capture_and_equal_cold_runs(path, spec):
    backend = GraphNumpy()
    engine = Engine(path, backend=backend, tokenizer=StandInTokenizer())
    pa, pb = buffer(150, 4), buffer(140, 5)
    turns = [("a", pa), ("b", pb), (None, buffer(120, 6)), ("a", pa[:130] + [7, 8, 9]), ("b", pb + [1, 2])]
    for key, prompt in turns:
        got = engine.generate(prompt, max_tokens=24, spec=spec, session=key)
        cold = Engine(path, backend="numpy", tokenizer=StandInTokenizer())
        want = cold.generate(prompt, max_tokens=24, spec=False)
        assert got.token_ids == want.token_ids, f"session {key}"
    # every request fits one capacity, so of the three caches' buffers one holds every graph
    # (a row count captured once, whichever session first used it); without the trade, each
    # had its own. (The controller's cost calibration runs on a cache of its own.)
    store = engine.sessions
    caches = [s.cache for s in store.sessions.values()] + [store._scratch.cache]
    assert len({c.capacity for c in caches}) == 1
    mine = {id(c.buffers) for c in caches}
    owners = [graphs for (owner, _), graphs in backend.graphs.items() if owner in mine and graphs]
    assert len(owners) == 1, [sorted(map(str, graphs)) for graphs in owners]
    assert store.exchanges >= 3
    # each session's cache still holds its own history's rows: its next turn reuses them
    for key in ("a", "b"):
        sess = engine.sessions.sessions[key]
        cold = load_model(path, NumpyBackend())[1]
        ref = filled(cold, sess.history[: sess.cache.length], sess.cache.capacity)
        for got, want in zip(rows(sess.cache), rows(ref), strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_graph_backends_reserve_power_of_two_capacities(path):
    """Where sessions share graph buffers, caches come in 256 × 2^n rows (growth doubles, so
    they stay in that series) and more of them share one set; elsewhere multiples of 256.
    Both stop at the model's context."""
    big = write_model(path.parent / "big.gguf", "qwen2", vocab=VOCAB, context=8192, seed=9)
    shared = Engine(big, backend=GraphNumpy(), tokenizer=StandInTokenizer()).sessions
    plain = Engine(big, backend="numpy", tokenizer=StandInTokenizer()).sessions
    tokens = (1, 300, 600, 1024, 1100, 2100, 5000, 9000)
    assert [shared._capacity_for(t) for t in tokens] == [256, 512, 1024, 1024, 2048, 4096, 8192, 8192]
    assert [plain._capacity_for(t) for t in tokens] == [256, 512, 768, 1024, 1280, 2304, 5120, 8192]


@pytest.mark.parametrize("spec", [False, True])
def test_short_prefills_replay_verify_widths(path, spec, monkeypatch):
    """A prefill tail of up to 32 rows runs as pieces padded to the verify widths (1, 2, 4,
    8, 16 rows: engine/generate.py ``_graph_width``), so follow-up requests whose changed
    tails have new lengths capture no graph of their own, and every reply and every cached
    row equals a run without the padding."""
    from echoline.engine.generate import GRAPH_WIDTHS

    turns = [("a", buffer(150, 4))]
    for extra in (1, 3, 7, 12, 17, 30, 32, 33, 64):  # each turn: the last reply plus new tokens
        turns.append(("a", None, extra))
    runs = {}
    for padded in (True, False):
        monkeypatch.setenv("ECHOLINE_PREFILL_GRAPH_WIDTHS", "1" if padded else "0")
        backend = GraphNumpy()
        engine = Engine(path, backend=backend, tokenizer=StandInTokenizer())
        replies, prompt = [], None
        for turn in turns:
            if len(turn) == 2:
                prompt = turn[1]
            else:
                prompt = prompt + replies[-1] + buffer(turn[2], turn[2])
            replies.append(engine.generate(prompt, max_tokens=12, spec=spec, session="a").token_ids)
        sess = engine.sessions.sessions["a"]
        # the session's buffers' graphs (the cost calibration measures on a cache of its own)
        keys = {k for (owner, _), graphs in backend.graphs.items() if owner == id(sess.cache.buffers)
                for k in graphs}
        runs[padded] = (replies, rows(sess.cache), keys)
    (got, got_rows, keys), (want, want_rows, plain_keys) = runs[True], runs[False]
    assert got == want
    for g, w in zip(got_rows, want_rows, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    prefill_keys = {k for k in keys if k[0] == "forward" and not k[2]}
    assert not prefill_keys, prefill_keys  # no prefill-only shape was captured
    assert {k[1] for k in keys if k[0] == "forward"} <= set(GRAPH_WIDTHS) | {17}
    assert any(k[0] == "forward" and not k[2] for k in plain_keys)  # without: one per tail length
