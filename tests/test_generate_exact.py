"""Speculative == plain, token ids, on tiny synthetic models, whatever the drafts are.

The drafter here is scripted (right, wrong, partly right, empty, longer than
the budget) so every branch of the verify loop is driven on purpose; the
n-gram index's own tests cover how drafts are found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.generate import StopRules, generate_tokens
from echoline.engine.models.loader import load_model
from echoline.engine.types import GenerationStats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cancelling import cancel_after
from tests.synth import write_model


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


@dataclass
class Draft:
    tokens: list[int]
    source: str = "script"
    match_len: int = 3


@dataclass
class ScriptedIndex:
    """Proposes drafts from a script: the true continuation, corrupted as told."""

    truth: list[int]
    prompt_len: int
    mode: str
    rng: np.random.Generator
    reply: list[int] = field(default_factory=list)

    def extend_source(self, source_id: str, tokens: list[int]) -> None:
        assert source_id == "reply"
        self.reply.extend(tokens)

    def draft(self, context: list[int], max_len: int) -> Draft:
        pos = len(self.reply)
        right = list(self.truth[pos : pos + max_len])
        if self.mode == "empty":
            return Draft([])
        if self.mode == "right":
            return Draft(right + [1, 2, 3])  # runs past the end of the true reply too
        if self.mode == "wrong":
            return Draft([(t + 1) % 50 for t in right] or [7, 7])
        cut = int(self.rng.integers(0, len(right) + 1))
        noise = list(self.rng.integers(0, 50, size=max_len - cut))
        return Draft(right[:cut] + [int(x) for x in noise])


class FixedController:
    """Always verifies up to k drafts (the real controller's choice is tested elsewhere)."""

    def __init__(self, k: int) -> None:
        self.max_draft = k
        self.cost = self

    def choose(self, draft, context_len: int, remaining: int, pow2: bool = False) -> int:
        return min(len(draft.tokens), self.max_draft)

    def observe(self, *args) -> None:
        pass


def _backend(kind: str):
    """The numpy reference, or the cpu backend with int8 activations (its own numbers,
    so its own exactness: every test below must hold within that mode too)."""
    if kind == "numpy":
        return NumpyBackend()
    from echoline.kernels.cpu.q8act import q8_available

    if not q8_available():
        pytest.skip("int8 activations need AVX2 or AVX-512 VNNI")
    from echoline.engine.backends.cpu_backend import CpuBackend

    return CpuBackend(activations="q8")


@pytest.fixture(scope="module", params=[f"{a}-{b}" for b in ("numpy", "q8") for a in ("llama", "qwen2", "gemma3")])
def tiny_model(request, tmp_path_factory):
    arch, kind = request.param.split("-")
    path = write_model(
        Path(tmp_path_factory.mktemp("m")) / f"{arch}.gguf",
        arch,
        vocab=50,
        sliding_window=6,
        seed=3,
    )
    _, model = load_model(path, _backend(kind))
    return model


def run(model, prompt, rules, index=None, k=0, cancel=None, on_token=None):
    cache = model.new_cache(64)
    res = generate_tokens(
        model,
        cache,
        prompt,
        decode=decode,
        rules=rules,
        index=index,
        controller=FixedController(k) if index is not None else None,
        cancel=cancel,
        on_token=on_token,
        prefill_chunk=4,
        stats=GenerationStats(),
    )
    return res, cache


def cache_rows(model, cache, n):
    return [np.array(cache.k[layer][:n]) for layer in range(len(cache.k))]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.lists(st.integers(0, 49), min_size=1, max_size=12),
    max_tokens=st.integers(1, 14),
    k=st.integers(1, 6),
    mode=st.sampled_from(["right", "wrong", "empty", "mixed"]),
    seed=st.integers(0, 1000),
    stop_id=st.one_of(st.none(), st.integers(0, 49)),
)
def test_speculative_equals_plain(tiny_model, prompt, max_tokens, k, mode, seed, stop_id):
    rules = StopRules(max_tokens=max_tokens, stop_ids=frozenset() if stop_id is None else frozenset({stop_id}))
    plain, plain_cache = run(tiny_model, prompt, rules)
    index = ScriptedIndex(plain.token_ids, len(prompt), mode, np.random.default_rng(seed))
    spec, spec_cache = run(tiny_model, prompt, rules, index=index, k=k)
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    # Trailing-token rule: both caches hold exactly prompt + reply, with the same values.
    n = len(prompt) + len(plain.token_ids)
    assert plain_cache.length == n and spec_cache.length == n
    for a, b in zip(cache_rows(tiny_model, plain_cache, n), cache_rows(tiny_model, spec_cache, n), strict=True):
        assert np.array_equal(a, b)


def test_stop_string_inside_accepted_run(tiny_model):
    prompt = [3, 1, 4, 1, 5]
    free, _ = run(tiny_model, prompt, StopRules(max_tokens=12))
    text = decode(free.token_ids)
    stop = text[4:6]  # lands in the middle of a round when drafts are long
    rules = StopRules(max_tokens=12, stop_strings=(stop,))
    plain, pc = run(tiny_model, prompt, rules)
    index = ScriptedIndex(free.token_ids, len(prompt), "right", np.random.default_rng(0))
    spec, sc = run(tiny_model, prompt, rules, index=index, k=8)
    assert plain.finish_reason == "stop" and spec.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids
    assert stop not in plain.text and spec.text == plain.text
    assert pc.length == sc.length == len(prompt) + len(plain.token_ids)


def test_eos_inside_accepted_run(tiny_model):
    prompt = [9, 8, 7]
    free, _ = run(tiny_model, prompt, StopRules(max_tokens=10))
    eos = free.token_ids[5]
    first = free.token_ids.index(eos)
    rules = StopRules(max_tokens=10, stop_ids=frozenset({eos}))
    plain, pc = run(tiny_model, prompt, rules)
    index = ScriptedIndex(free.token_ids, len(prompt), "right", np.random.default_rng(0))
    spec, sc = run(tiny_model, prompt, rules, index=index, k=8)
    assert plain.token_ids == free.token_ids[: first + 1] == spec.token_ids
    assert plain.finish_reason == spec.finish_reason == "eos"
    assert pc.length == sc.length


def test_cancel_mid_generation_leaves_prefix_and_full_cache(tiny_model):
    prompt = [2, 4, 6, 8]
    rules = StopRules(max_tokens=20)
    plain, _ = run(tiny_model, prompt, rules)
    cancel, on_token = cancel_after(5)
    index = ScriptedIndex(plain.token_ids, len(prompt), "mixed", np.random.default_rng(1))
    spec, cache = run(tiny_model, prompt, rules, index=index, k=3, cancel=cancel, on_token=on_token)
    assert spec.finish_reason == "cancelled"
    assert 5 <= len(spec.token_ids) < len(plain.token_ids)
    assert spec.token_ids == plain.token_ids[: len(spec.token_ids)]
    assert cache.length == len(prompt) + len(spec.token_ids)


def test_later_turns_on_the_same_cache(tiny_model):
    """Second and third turns reuse the cache; plain and speculative agree on every turn."""
    turns = [[5, 6, 7], [11, 12], [13]]

    def conversation(spec: bool):
        cache = tiny_model.new_cache(128)
        history: list[int] = []
        replies = []
        for extra in turns:
            history = history + extra
            cache.truncate(min(cache.length, len(history) - 1))
            rules = StopRules(max_tokens=6)
            index = None
            if spec:
                index = ScriptedIndex([], len(history), "wrong", np.random.default_rng(2))
            res = generate_tokens(tiny_model, cache, history, decode=decode, rules=rules, index=index,
                                  controller=FixedController(4) if spec else None, prefill_chunk=3)
            history = history + res.token_ids
            assert cache.length == len(history)
            replies.append(res.token_ids)
        return replies

    cold = []
    history: list[int] = []
    for extra, _ in zip(turns, range(3), strict=True):
        history = history + extra
        res, _ = run(tiny_model, history, StopRules(max_tokens=6))
        cold.append(res.token_ids)
        history = history + res.token_ids
    assert conversation(False) == cold
    assert conversation(True) == cold


def test_round_time_splits_into_forward_and_host(tiny_model):
    """Every decode round's wall time is counted once: in the forward pass or outside it."""
    prompt = [3, 1, 4, 1, 5]
    free, _ = run(tiny_model, prompt, StopRules(max_tokens=12))
    index = ScriptedIndex(free.token_ids, len(prompt), "mixed", np.random.default_rng(1))
    spec, _ = run(tiny_model, prompt, StopRules(max_tokens=12), index=index, k=3)
    st = spec.stats
    assert st.rounds > 1 and st.forward_s > 0.0 and st.host_s >= 0.0
    assert st.forward_s + st.host_s <= st.decode_s + 1e-3
    d = st.as_dict()
    assert d["forward_s"] == round(st.forward_s, 6) and d["host_s"] == round(st.host_s, 6)
