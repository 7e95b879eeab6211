"""Per-buffer sessions: warm replies equal cold ones, memory stays within budget."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.api import Engine
from echoline.engine.errors import EcholineError
from echoline.engine.kvcache import KVCache

from tests.cancelling import cancel_after
from tests.synth import write_model

VOCAB = 64


class StandInTokenizer:
    """Synthetic models carry no vocabulary: ids map to letters, nothing stops early."""

    chat_template = None
    fim = None
    stop_ids: frozenset[int] = frozenset()

    def decode(self, ids) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def encode(self, text: str, add_bos=None, parse_special=True) -> list[int]:
        return [ord(c) % VOCAB for c in text]


def make_engine(path: Path, **kw) -> Engine:
    return Engine(path, backend="numpy", tokenizer=StandInTokenizer(), **kw)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("s") / "llama.gguf", "llama", vocab=VOCAB, context=1024, seed=5)


def buffer(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    base = list(rng.integers(3, VOCAB, size=24))
    return [int(base[i % 24] if i % 5 else rng.integers(3, VOCAB)) for i in range(n)]


def edit(prompt: list[int], at: int) -> list[int]:
    out = list(prompt)
    out[at] = (out[at] + 1) % VOCAB
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("spec", [False, True])
def test_warm_equals_cold_for_every_edit_position(llama_path, chunk, spec):
    warm_engine = make_engine(llama_path, prefill_chunk=chunk)
    cold_engine = make_engine(llama_path, prefill_chunk=chunk)
    prompt = buffer(120, 1)
    first = warm_engine.generate(prompt, max_tokens=12, session="buf", spec=spec)
    assert first.stats.reused_tokens == 0
    for at, name in ((115, "end"), (60, "middle"), (0, "top")):
        edited = edit(prompt, at)
        warm = warm_engine.generate(edited, max_tokens=12, session="buf", spec=spec)
        cold = cold_engine.generate(edited, max_tokens=12, session=None, spec=False)
        assert warm.token_ids == cold.token_ids, name
        assert warm.stats.reused_tokens == min(at, len(edited) - 1), name
        assert warm.stats.prefilled_tokens == len(edited) - warm.stats.reused_tokens
        prompt = edited
    # A repeat reuses everything but the last prompt token.
    again = warm_engine.generate(prompt, max_tokens=12, session="buf", spec=spec)
    assert again.stats.reused_tokens == len(prompt) - 1


def test_follow_up_turn_reuses_prompt_and_reply(llama_path):
    """The trailing-token rule: after max_tokens and after a cancel, turn two equals a cold run."""
    eng = make_engine(llama_path)
    cold = make_engine(llama_path)
    prompt = buffer(40, 2)
    first = eng.generate(prompt, max_tokens=9, session="chat")
    sess = eng.sessions.sessions["chat"]
    assert sess.cache.length == len(prompt) + len(first.token_ids) == len(sess.history)
    turn2 = prompt + first.token_ids + buffer(6, 3)
    warm = eng.generate(turn2, max_tokens=9, session="chat")
    assert warm.stats.reused_tokens == len(prompt) + len(first.token_ids)
    assert warm.token_ids == cold.generate(turn2, max_tokens=9).token_ids

    cancel, stop_soon = cancel_after(3)
    turn3 = turn2 + warm.token_ids + buffer(4, 4)
    partial = eng.generate(turn3, max_tokens=30, session="chat", on_token=stop_soon, cancel=cancel)
    assert partial.finish_reason == "cancelled"
    assert sess.cache.length == len(turn3) + len(partial.token_ids) == len(sess.history)
    turn4 = turn3 + partial.token_ids + [5, 6]
    warm4 = eng.generate(turn4, max_tokens=8, session="chat")
    assert warm4.stats.reused_tokens == len(turn3) + len(partial.token_ids)
    assert warm4.token_ids == cold.generate(turn4, max_tokens=8).token_ids


def test_shared_prefix_across_sessions(llama_path):
    eng = make_engine(llama_path)
    cold = make_engine(llama_path)
    shared = buffer(100, 7)
    eng.generate(shared + [9, 9, 9], max_tokens=4, session="a")
    res = eng.generate(shared + [4, 4], max_tokens=6, session="b")
    assert res.stats.reused_tokens == 100
    assert res.token_ids == cold.generate(shared + [4, 4], max_tokens=6).token_ids


def test_budget_never_exceeded_and_lru_evicts(llama_path):
    probe = make_engine(llama_path)
    one = KVCache.bytes_for(probe.config, 256, 0)
    eng = make_engine(llama_path, kv_budget_bytes=3 * one)
    cold = make_engine(llama_path)
    prompts = {f"doc{i}": buffer(30, 10 + i) for i in range(7)}
    for round_ in range(2):
        for key, prompt in prompts.items():
            res = eng.generate(prompt, max_tokens=5, session=key)
            assert eng.sessions.bytes_in_use <= eng.sessions.budget_bytes
            assert len(eng.sessions.sessions) <= 3
            if round_ == 1:
                assert res.token_ids == cold.generate(prompt, max_tokens=5).token_ids
    assert eng.sessions.evictions >= 4
    tiny = make_engine(llama_path, kv_budget_bytes=one // 2)
    with pytest.raises(EcholineError, match="budget"):
        tiny.generate(buffer(30, 1), max_tokens=4, session="x")


@pytest.fixture(scope="module")
def gemma_long_path(tmp_path_factory) -> Path:
    return write_model(
        tmp_path_factory.mktemp("g") / "gemma.gguf", "gemma3", vocab=VOCAB, context=4096,
        sliding_window=8, n_layers=6, seed=9,
    )


def test_sliding_window_ring_is_exact_and_small(gemma_long_path):
    """Local layers keep a ring; results equal a full linear cache; reuse stays exact."""
    ring_engine = make_engine(gemma_long_path, prefill_chunk=32)
    assert ring_engine.sessions.ring > 0
    prompt = buffer(1400, 11)  # longer than the ring: slots are reused
    first = ring_engine.generate(prompt, max_tokens=10, session="g", spec=True)
    cache = ring_engine.sessions.sessions["g"].cache
    assert cache.ring and cache.bytes_reserved < KVCache.bytes_for(cache.config, cache.capacity, 0)
    # The same model with a linear cache computes the same reply.
    model = ring_engine.model
    linear = model.new_cache(2048)
    assert linear.ring == 0
    from echoline.engine.generate import StopRules, generate_tokens

    ref = generate_tokens(model, linear, prompt, decode=StandInTokenizer().decode,
                          rules=StopRules(max_tokens=10), prefill_chunk=32)
    assert ref.token_ids == first.token_ids
    # An edit near the end reuses the ring; an edit far back falls back to a cold prefill.
    near = edit(prompt, 1390)
    warm = ring_engine.generate(near, max_tokens=10, session="g")
    assert warm.stats.reused_tokens == 1390
    ref_near = generate_tokens(model, model.new_cache(2048), near, decode=StandInTokenizer().decode,
                               rules=StopRules(max_tokens=10), prefill_chunk=32)
    assert warm.token_ids == ref_near.token_ids
    far = edit(near, 100)
    warm_far = ring_engine.generate(far, max_tokens=10, session="g")
    assert warm_far.stats.reused_tokens == 0
    ref_far = generate_tokens(model, model.new_cache(2048), far, decode=StandInTokenizer().decode,
                              rules=StopRules(max_tokens=10), prefill_chunk=32)
    assert warm_far.token_ids == ref_far.token_ids


def test_sampling_falls_back_to_plain_decoding(llama_path):
    """temperature > 0: seeded, reproducible, no drafts; near-zero temperature is greedy."""
    eng = make_engine(llama_path)
    prompt = buffer(30, 21)
    a = eng.generate(prompt, max_tokens=12, temperature=1.5, seed=4, spec=True)
    b = eng.generate(prompt, max_tokens=12, temperature=1.5, seed=4, spec=False)
    assert a.token_ids == b.token_ids and a.stats.drafted == 0
    c = eng.generate(prompt, max_tokens=12, temperature=1.5, seed=5)
    greedy = eng.generate(prompt, max_tokens=12)
    cold = eng.generate(prompt, max_tokens=12, temperature=1e-6, seed=1)
    assert cold.token_ids == greedy.token_ids
    assert c.token_ids != greedy.token_ids or a.token_ids != greedy.token_ids


def test_throwaway_requests_share_one_emptied_cache_and_stay_cold(llama_path):
    """key None: one cache object across requests (per-cache backend state survives), no reuse."""
    eng = make_engine(llama_path)
    fresh = make_engine(llama_path)
    prompts = [buffer(90, 11), buffer(90, 11)[:80] + buffer(10, 12), buffer(70, 13)]
    caches = []
    for prompt in prompts:
        res = eng.generate(prompt, max_tokens=10, spec=True)
        caches.append(eng.sessions._scratch.cache)
        assert res.stats.reused_tokens == 0  # the second prompt shares 80 tokens: still cold
        assert res.token_ids == fresh.generate(prompt, max_tokens=10, spec=False).token_ids
        fresh.sessions._scratch = None  # the reference always starts from a new cache
    assert caches[0] is caches[1] is caches[2]
    assert eng.sessions.bytes_in_use == caches[0].bytes_reserved


def test_throwaway_cache_gives_way_to_a_buffer_session(llama_path):
    per = KVCache.bytes_for(make_engine(llama_path).config, 256, 0)
    eng = make_engine(llama_path, kv_budget_bytes=per + per // 2)
    eng.generate(buffer(60, 3), max_tokens=4)
    assert eng.sessions._scratch is not None
    eng.generate(buffer(60, 4), max_tokens=4, session="buf")  # needs the scratch's bytes
    assert eng.sessions._scratch is None and "buf" in eng.sessions.sessions
    assert eng.sessions.bytes_in_use <= eng.sessions.budget_bytes


@pytest.mark.parametrize("cancel_after", [None, 2])
def test_prefill_ahead_then_generate_equals_cold(llama_path, cancel_after):
    """Engine.prefill fills a session ahead of a request (whole chunks if cancelled)."""
    eng = make_engine(llama_path)
    cold = make_engine(llama_path)
    stable = buffer(150, 21)
    prompt = stable + buffer(20, 22)
    cancel = threading.Event()
    calls = {"n": 0}
    if cancel_after is not None:
        import echoline.engine.generate as gen

        real = gen.run_rows

        def counting(*a, **kw):
            calls["n"] += 1
            if calls["n"] == cancel_after:
                cancel.set()
            return real(*a, **kw)

        gen.run_rows = counting
    try:
        held = eng.prefill(stable, session="buf", cancel=cancel, chunk=16)
    finally:
        if cancel_after is not None:
            gen.run_rows = real
    assert held == (len(stable) - 1 if cancel_after is None else 16 * cancel_after)
    res = eng.generate(prompt, max_tokens=12, session="buf", spec=True)
    assert res.stats.reused_tokens == held
    assert res.token_ids == cold.generate(prompt, max_tokens=12, spec=False).token_ids


def test_prefill_reserves_room_for_the_request_that_follows(llama_path):
    """The request after a prefill must not grow (reallocate) the cache on its critical path."""
    eng = make_engine(llama_path)
    stable = buffer(150, 31)
    eng.prefill(stable, session="buf")
    cache = eng.sessions.sessions["buf"].cache
    capacity = cache.capacity
    eng.generate(stable + buffer(60, 32), max_tokens=200, session="buf")
    assert eng.sessions.sessions["buf"].cache is cache and cache.capacity == capacity
    eng.prefill(stable, session="small", reserve_tokens=len(stable))
    assert eng.sessions.sessions["small"].cache.capacity < capacity


def test_prefill_cost_is_fixed_for_the_engines_life(llama_path):
    """The sidecar sizes inline suffixes by ``prefill_seconds``: it must come from the
    start-up calibration and stay put while online timings move the controller's curve
    (a moving budget would change the prompts, and their cached prefixes, between
    keystrokes)."""
    engine = make_engine(llama_path)
    before = [engine.prefill_seconds(n) for n in (32, 64, 128, 256)]
    assert 0 < before[0] < before[1] < before[2] < before[3]
    cost = engine.controller.cost
    seen = cost.observations
    for seed in range(3):
        engine.generate(buffer(40, seed), max_tokens=24, spec=True, session="rate")
    assert cost.observations > seen, "the online timings did reach the curve"
    assert [engine.prefill_seconds(n) for n in (32, 64, 128, 256)] == before
