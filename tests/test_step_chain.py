"""Chained plain decoding (engine/step_chain.py) == the step-by-step loop, token ids and cache.

The GPU's chain replays one captured graph that feeds itself on the device. Here a numpy
backend stands in for the device: ``run_graph`` keeps each key's static inputs and the
function first given for it (a capture), replays it on those statics, and with
``fed=True`` copies nothing, so a step reads only what the previous step's
``argmax_feed`` wrote. If the chain read a stale id or position, skipped the trailing
step, or lost a row on a cancel, the ids or the cache rows below would differ.
The same loop on the real device: tests/test_cuda_backend.py (skipped without a GPU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.generate import StopRules, generate_tokens
from echoline.engine.models.loader import load_model
from echoline.engine.step_chain import GraphChain, HostChain, make_chain
from echoline.engine.types import GenerationStats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cancelling import cancel_after
from tests.synth import write_model


class _Copy:
    def __init__(self, x: np.ndarray) -> None:
        self._x = np.array(x, dtype=np.int64)

    def value(self) -> np.ndarray:
        return self._x


class ChainedNumpy(NumpyBackend):
    """The numpy reference with the CUDA backend's graph and chain interface, emulated."""

    graph_max_rows = 1  # one-row forwards go through run_graph, as on the GPU
    graph_chain = True
    linear_cache_only = True

    def __init__(self) -> None:
        super().__init__()
        self.graphs: dict[tuple[int, object], dict[object, tuple]] = {}
        self.replays_held = 0
        self.captures = 0

    def write_cache(self, cache, start, rows) -> None:
        at = int(np.asarray(start).reshape(-1)[0])  # a device positions array, as on CUDA
        cache[at : at + rows.shape[0]] = rows

    def _store(self, owner, generation) -> dict:
        return self.graphs.setdefault((id(owner), generation), {})

    def has_graph(self, key, owner=None, generation=None) -> bool:
        return key in self._store(owner, generation)

    def run_graph(self, key, fn, inputs, owner=None, generation=None, fed=False):
        store = self._store(owner, generation)
        got = store.get(key)
        if got is not None and fed:
            self.replays_held += 1
            return got[0](*got[1])
        inputs = inputs() if callable(inputs) else inputs
        packed = np.concatenate([np.asarray(h, dtype=np.int32).reshape(-1) for h in inputs])
        if got is None:
            self.captures += 1
            statics, at = [], 0
            for h in inputs:
                statics.append(packed[at : at + np.size(h)])
                at += np.size(h)
            store[key] = (fn, statics, packed)
            return fn(*statics)
        got[2][:] = packed
        return got[0](*got[1])

    def argmax_device(self, logits):
        return np.argmax(np.asarray(logits), axis=-1).astype(np.int32)

    def argmax_feed(self, logits, ids_dev, pos_dev):
        nxt = self.argmax_device(logits)
        ids_dev[...] = nxt[-1:]
        pos_dev += 1
        return nxt

    def copy_to_host_async(self, x):
        return _Copy(x)


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def models(request, tmp_path_factory):
    path = write_model(Path(tmp_path_factory.mktemp("m")) / f"{request.param}.gguf", request.param,
                       vocab=50, seed=5)
    _, plain = load_model(path, NumpyBackend())
    _, chained = load_model(path, ChainedNumpy())
    return plain, chained


def run(model, prompt, rules, capacity=64, cancel=None, on_token=None, cache=None):
    cache = cache if cache is not None else model.new_cache(capacity)
    res = generate_tokens(model, cache, prompt, decode=decode, rules=rules, cancel=cancel,
                          on_token=on_token, prefill_chunk=4, stats=GenerationStats())
    return res, cache


def same_cache(a, b, n) -> None:
    assert a.length == b.length == n
    for la, lb in zip(a.k, b.k, strict=True):
        assert np.array_equal(np.asarray(la[:n]), np.asarray(lb[:n]))
    for la, lb in zip(a.v, b.v, strict=True):
        assert np.array_equal(np.asarray(la[:n]), np.asarray(lb[:n]))


def test_chain_kind_follows_backend(models):
    plain, chained = models
    assert isinstance(make_chain(plain, plain.new_cache(8), lambda t: None), HostChain)
    assert isinstance(make_chain(chained, chained.new_cache(8), lambda t: None), GraphChain)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 49), min_size=1, max_size=10),
    max_tokens=st.integers(1, 16),
    stop_id=st.one_of(st.none(), st.integers(0, 49)),
    capacity=st.sampled_from([4, 64]),  # 4: the cache grows mid-reply, so the graph is recaptured
)
def test_chained_equals_stepwise(models, prompt, max_tokens, stop_id, capacity):
    plain, chained = models
    rules = StopRules(max_tokens=max_tokens, stop_ids=frozenset() if stop_id is None else frozenset({stop_id}))
    want, wc = run(plain, prompt, rules)
    got, gc = run(chained, prompt, rules, capacity=capacity)
    assert got.token_ids == want.token_ids
    assert got.finish_reason == want.finish_reason
    same_cache(wc, gc, len(prompt) + len(want.token_ids))  # the trailing-token rule holds


def test_chain_replays_without_host_inputs(models):
    _, chained = models
    before = chained.backend.replays_held
    res, _ = run(chained, [1, 2, 3], StopRules(max_tokens=12), capacity=64)
    assert len(res.token_ids) == 12
    # every step after the first two (the first capture, then one fed replay per token) is fed
    assert chained.backend.replays_held - before >= 10


def test_stop_string_and_cancel(models):
    plain, chained = models
    prompt = [7, 3, 9, 1]
    free, _ = run(plain, prompt, StopRules(max_tokens=14))
    rules = StopRules(max_tokens=14, stop_strings=(decode(free.token_ids)[5:7],))
    want, wc = run(plain, prompt, rules)
    got, gc = run(chained, prompt, rules)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason == "stop"
    same_cache(wc, gc, len(prompt) + len(want.token_ids))

    cancel, on_token = cancel_after(5)
    got, gc = run(chained, prompt, StopRules(max_tokens=14), cancel=cancel, on_token=on_token)
    assert got.finish_reason == "cancelled"
    assert got.token_ids == free.token_ids[: len(got.token_ids)] and len(got.token_ids) == 5
    _, wc = run(plain, prompt, StopRules(max_tokens=5))
    same_cache(wc, gc, len(prompt) + 5)  # the queued step's row was cut


def test_later_turn_on_the_reused_cache(models):
    plain, chained = models
    prompt = [4, 8, 15, 16]
    rules = StopRules(max_tokens=9)
    first_w, wc = run(plain, prompt, rules)
    first_g, gc = run(chained, prompt, rules)
    assert first_g.token_ids == first_w.token_ids
    turn2 = prompt + first_w.token_ids + [23, 42]
    second_w, wc = run(plain, turn2, rules, cache=wc)
    second_g, gc = run(chained, turn2, rules, cache=gc)
    assert second_g.token_ids == second_w.token_ids
    same_cache(wc, gc, len(turn2) + len(second_w.token_ids))


def test_speculation_with_lookups_made_ahead(models):
    """On a backend whose forwards run ahead of the host, the next round's lookup is made
    while the verify runs (for the outcome the drafts predict) and used when it came true:
    replies stay the plain ones, and some rounds did use a lookup made ahead."""
    from echoline.engine.drafting.controller import DraftController, VerifyCost
    from echoline.engine.drafting.ngram_index import NgramIndex

    plain, chained = models
    rng = np.random.default_rng(4)
    ahead = 0
    for _ in range(8):
        unit = [int(t) for t in rng.integers(0, 50, size=int(rng.integers(3, 8)))]
        prompt = (unit * 6)[: int(rng.integers(8, 40))]
        rules = StopRules(max_tokens=int(rng.integers(5, 30)))
        want, wc = run(plain, prompt, rules)
        index = NgramIndex()
        index.set_source("prompt", prompt)
        index.set_source("reply", [])
        ctl = DraftController(VerifyCost.from_ratios([1.0] * 17, 1e-3), max_draft=8)
        ctl.arm = None
        cache = chained.new_cache(64)
        got = generate_tokens(chained, cache, prompt, decode=decode, rules=rules, index=index,
                              controller=ctl, prefill_chunk=4, stats=GenerationStats())
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        same_cache(wc, cache, len(prompt) + len(want.token_ids))
        ahead += got.stats.lookups_ahead
    assert ahead > 0
