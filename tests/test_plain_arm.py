"""The plain arm: rounds that skip the draft lookup while drafting does not pay.

Two kinds of check: the arm's economics on simulated clocks (non-copying traffic goes plain,
copying traffic keeps drafting, a switch back happens once drafts pay again), and, through
the real decode loop on tiny models with the real index and controller, that whatever the
arm does the reply stays token-identical to plain decoding.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.drafting import Draft, NgramIndex
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.drafting.plain_arm import PlainArm
from echoline.engine.generate import StopRules, generate_tokens
from echoline.engine.models.loader import load_model
from echoline.engine.types import GenerationStats

from tests.synth import write_model


def linear_cost(extra_per_row: float, t1: float = 0.001, rows: int = 17) -> VerifyCost:
    """T(r) = t1 × (1 + extra_per_row × (r - 1))."""
    return VerifyCost.from_ratios([1.0 + extra_per_row * (r - 1) for r in range(1, rows + 1)], t1)


# ----- economics on a simulated clock ---------------------------------------------------------


def simulate(c: DraftController, accept: float, tokens: int, seed: int, lookup_s: float,
             host_s: float = 20e-6, match_lens: tuple[int, int] = (1, 9), requests: int = 1) -> float:
    """Time per token relative to plain decoding, charging each lookup its cost.

    A plain step costs T(1) + host_s; a lookup round adds ``lookup_s`` to its host time
    whatever k the controller picks, and a verify of k drafts costs T(k+1). Each draft
    position is accepted with probability ``accept``.
    """
    rng = random.Random(seed)
    ctx, t_spec, t_plain = 500, 0.0, 0.0
    per_request = tokens // requests
    for _ in range(requests):
        if c.arm is not None:
            c.arm.start()
        produced = 0
        while produced < per_request:
            looked = c.arm is None or c.arm.look()
            k, host = 0, host_s
            if looked:
                host += lookup_s
                d = Draft(list(range(16)), rng.choice(["reply", "prompt"]), rng.randrange(*match_lens), 0)
                k = c.choose(d, ctx, 10_000)
            fwd = c.cost.time(k + 1, ctx)
            a = 0
            while a < k and rng.random() < accept:
                a += 1
            if k:
                c.observe(d.source, d.match_len, k, a)
            if c.arm is not None:
                if looked:
                    t1 = c.cost.t1(ctx)
                    c.arm.observe_lookup(a, fwd - t1 if k else 0.0, host, t1)
                else:
                    c.arm.observe_plain(host)
            t_spec += fwd + host
            for _ in range(a + 1):
                t_plain += c.cost.time(1, ctx) + host_s
                ctx += 1
            produced += a + 1
    return t_spec / t_plain


@pytest.mark.parametrize("extra", [0.02, 0.15, 1.0])
@pytest.mark.parametrize("max_skip", [4, 64])
def test_non_copying_traffic_runs_plain(extra: float, max_skip: int) -> None:
    """Drafts never accepted and a lookup costing 10% of a step: the arm pays one lookup per
    max_skip + 1 rounds, where looking up every round (the arm off) pays the whole cost."""
    with_arm = DraftController(linear_cost(extra), arm=PlainArm(max_skip=max_skip))
    rel = simulate(with_arm, accept=0.0, tokens=4000, seed=1, lookup_s=100e-6)
    assert rel <= 1.0 + 0.1 / (max_skip + 1) + 0.005, rel
    assert with_arm.arm.lookups < 1.2 * with_arm.arm.plain_rounds / max_skip
    assert not with_arm.arm.drafting
    without = DraftController(linear_cost(extra))
    without.arm = None
    assert simulate(without, accept=0.0, tokens=4000, seed=1, lookup_s=100e-6) > 1.05


def test_short_non_copying_requests_stay_close_to_plain() -> None:
    """Chat-like: 96-token replies, each request probing from its first round again."""
    c = DraftController(linear_cost(0.15), arm=PlainArm())
    rel = simulate(c, accept=0.0, tokens=96 * 40, seed=4, lookup_s=100e-6, requests=40)
    assert rel <= 1.035, rel


def test_lookup_that_is_a_small_share_of_a_step_is_never_skipped() -> None:
    """CPU-like: a lookup costs 1% of a step. Skipping it would save nothing worth a missed
    draft, so the arm keeps looking up; the controller's k = 0 is what declines drafts."""
    c = DraftController(linear_cost(0.15, t1=0.01), arm=PlainArm())
    rel = simulate(c, accept=0.0, tokens=2000, seed=7, lookup_s=100e-6)
    assert c.arm.drafting and c.arm.plain_rounds == 0
    assert rel <= 1.03, rel  # the lookups' 1 % and the controller's 1 % exploration budget


def test_copying_traffic_keeps_drafting_and_gains() -> None:
    c = DraftController(linear_cost(0.05), arm=PlainArm())
    rel = simulate(c, accept=0.95, tokens=3000, seed=2, lookup_s=100e-6, match_lens=(8, 33))
    assert rel < 0.4, rel
    assert c.arm.drafting and c.arm.switches == 0


def test_drafting_resumes_once_drafts_pay_again() -> None:
    c = DraftController(linear_cost(0.05), arm=PlainArm())
    assert simulate(c, accept=0.0, tokens=2000, seed=5, lookup_s=100e-6) <= 1.03
    assert not c.arm.drafting and c.arm.skip == c.arm.max_skip
    rel = simulate(c, accept=0.97, tokens=3000, seed=6, lookup_s=100e-6, match_lens=(8, 33))
    assert c.arm.drafting
    assert rel < 0.45, rel


def test_arm_state_machine() -> None:
    arm = PlainArm(weight=0.5, min_skip=2, max_skip=8)
    assert arm.look()
    arm.observe_lookup(0, 0.0, host_s=50e-6, t1_s=1e-3)  # a lookup that found nothing
    assert not arm.drafting and arm.switches == 1
    pattern = [arm.look() for _ in range(3)]
    assert pattern == [False, False, True]  # two plain rounds, then a probe
    arm.observe_lookup(0, 0.0, host_s=50e-6, t1_s=1e-3)  # the probe found nothing either
    assert arm.skip == 4
    assert [arm.look() for _ in range(5)] == [False] * 4 + [True]
    arm.observe_lookup(0, 0.0, host_s=-1.0, t1_s=1e-3, lookup_s=50e-6)  # "positive" noise, no drafts
    assert not arm.drafting and arm.skip == 8
    for _ in range(8):
        assert not arm.look()
    assert arm.look()
    arm.observe_lookup(3, 0.2e-3, host_s=80e-6, t1_s=1e-3)  # three drafts accepted: it pays
    assert arm.drafting and arm.skip == 2 and arm.value_s > 0
    arm.start()
    assert arm.look()
    # Back to plain, then the step grows 100-fold (a lookup is now 0.05 % of it): a probe
    # ends the plain arm even without drafts, and no k = 0 round starts it again.
    for _ in range(20):
        arm.observe_lookup(0, 0.0, host_s=50e-6, t1_s=1e-3)
    assert not arm.drafting
    while not arm.look():
        pass
    for _ in range(30):
        arm.observe_lookup(0, 0.0, host_s=50e-6, t1_s=0.1)
    assert arm.drafting
    with pytest.raises(ValueError):
        PlainArm(weight=0.0)
    with pytest.raises(ValueError):
        PlainArm(min_skip=4, max_skip=2)


def test_round_value_charges_forward_and_host() -> None:
    arm = PlainArm()
    arm.observe_plain(20e-6)
    assert arm.h_plain_s == pytest.approx(20e-6)
    # 2 drafts accepted (2 plain steps of 1.02 ms saved), 0.3 ms extra forward, 60 µs extra host
    assert arm.round_value(2, 0.3e-3, 80e-6, 1e-3) == pytest.approx(2 * 1.02e-3 - 0.3e-3 - 60e-6)
    assert arm.round_value(0, 0.0, 70e-6, 1e-3) == pytest.approx(-50e-6)


def test_round_value_against_chained_plain_steps() -> None:
    """Where plain steps are chained their host time is hidden: a plain token costs one row's
    forward until chained runs were measured, then their seconds per step."""
    arm = PlainArm()
    arm.plain_chained = True
    arm.observe_plain(20e-6)  # a stepwise round's host time no longer credits a lookup round
    assert arm.round_value(2, 0.3e-3, 80e-6, 1e-3) == pytest.approx(2 * 1e-3 - 0.3e-3 - 80e-6)
    arm.observe_chained(0.9e-3)  # chained steps measured faster than a lone forward
    assert arm.round_value(2, 0.3e-3, 80e-6, 1e-3) == pytest.approx(3 * 0.9e-3 - 1.3e-3 - 80e-6)
    # a round that drafted nothing loses its host time and what a lone forward costs over a
    # chained step
    assert arm.round_value(0, 0.0, 70e-6, 1e-3) == pytest.approx(0.9e-3 - 1e-3 - 70e-6)


# ----- exactness through the real loop -------------------------------------------------------


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen2-chained"])
def tiny(request, tmp_path_factory):
    """``-chained``: the numpy reference behind the emulated device chain of
    tests/test_step_chain.py, so the plain arm's rounds run as chained segments."""
    from tests.test_step_chain import ChainedNumpy

    arch, _, chained = request.param.partition("-")
    path = write_model(Path(tmp_path_factory.mktemp("m")) / f"{arch}.gguf", arch, vocab=40, seed=7)
    _, model = load_model(path, ChainedNumpy() if chained else NumpyBackend())
    return model


class ScriptedArm(PlainArm):
    """An arm whose look-ups follow a script (the real one decides by the wall clock)."""

    def __init__(self, pattern: list[bool]) -> None:
        super().__init__()
        self.pattern = pattern
        self.i = 0
        self.chained_runs: list[int] = []

    def look(self) -> bool:
        out = self.pattern[self.i % len(self.pattern)]
        self.i += 1
        return out

    def plain_run(self) -> int:
        """This plain round and the script's plain rounds right after it (run chained)."""
        n = 1
        while not self.pattern[self.i % len(self.pattern)] and n < 64:
            self.i += 1
            n += 1
        self.chained_runs.append(n)
        return n


def run(model, prompt, rules, controller=None):
    cache = model.new_cache(256)
    index = None
    if controller is not None:
        index = NgramIndex()
        index.set_source("prompt", prompt)
        index.set_source("reply", [])
    res = generate_tokens(model, cache, prompt, decode=decode, rules=rules, index=index,
                          controller=controller, prefill_chunk=8, stats=GenerationStats())
    assert cache.length == len(prompt) + len(res.token_ids)
    return res, index


def prompts(n: int, seed: int) -> list[list[int]]:
    """Prompts with repeats inside (so the index finds matches), of varied lengths."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        unit = [int(t) for t in rng.integers(0, 40, size=int(rng.integers(2, 9)))]
        out.append((unit * int(rng.integers(1, 5)))[: int(rng.integers(2, 30))])
    return out


@pytest.mark.parametrize("pattern", [[True], [False, False, True], [True, False], [False] * 5 + [True]])
def test_replies_identical_whatever_the_arm_does(tiny, pattern) -> None:
    """Many prompts, max_tokens ending mid-round, EOS and stop strings inside accepted runs."""
    accepted = 0
    runs: list[int] = []
    for i, prompt in enumerate(prompts(12, seed=len(pattern))):
        free, _ = run(tiny, prompt, StopRules(max_tokens=24))
        for rules in (
            StopRules(max_tokens=3 + i),
            StopRules(max_tokens=24, stop_ids=frozenset({free.token_ids[min(7, len(free.token_ids) - 1)]})),
            StopRules(max_tokens=24, stop_strings=(decode(free.token_ids)[5:7],)),
        ):
            plain, _ = run(tiny, prompt, rules)
            ctl = DraftController(linear_cost(0.0), max_draft=6, arm=ScriptedArm(pattern))
            spec, _ = run(tiny, prompt, rules, ctl)
            assert spec.token_ids == plain.token_ids, (prompt, rules)
            assert spec.finish_reason == plain.finish_reason
            assert spec.text == plain.text
            accepted += spec.stats.accepted
            runs += ctl.arm.chained_runs
    assert accepted > 0  # drafts were verified and taken, not only plain steps
    if pattern.count(False) > 1:  # consecutive plain rounds ran as chained segments
        assert max(runs) > 1


def test_skipped_rounds_still_reach_the_index(tiny) -> None:
    """Reply tokens of plain-arm rounds are indexed before the next lookup and at the end."""
    prompt = prompts(1, seed=9)[0]
    ctl = DraftController(linear_cost(0.0), max_draft=6, arm=ScriptedArm([False, False, False, True]))
    res, index = run(tiny, prompt, StopRules(max_tokens=30), ctl)
    assert index.source_tokens("reply") == res.token_ids
    assert res.stats.lookups < res.stats.rounds


class HeldCost(VerifyCost):
    """A cost model that keeps its curve (the tiny model's real verify is nearly free)."""

    def observe(self, rows: int, ctx: int, seconds: float) -> None:
        pass


def test_real_arm_goes_plain_where_verify_costs_more(tiny) -> None:
    """A cost model where a verify costs more than separate steps: the controller never
    drafts, the arm stops looking up, and the replies stay identical."""
    total_rounds = total_lookups = 0
    # Rows cost like separate steps (1 ms each). The lookup-share gate is off here: how big a
    # share the tiny model's lookups are depends on the machine (the gate: simulated above).
    cost = HeldCost(list(range(1, 18)), [0], [[1e-3 * r] for r in range(1, 18)])
    ctl = DraftController(cost, max_draft=6, arm=PlainArm(min_share=0.0))
    # The host-time dilution of the ratio stays out too: on a busy machine one slow round can
    # make a draft look affordable, and this test is about a verify that never is.
    ctl.observe_overhead = lambda seconds, weight=0.05: None
    for prompt in prompts(6, seed=3):
        plain, _ = run(tiny, prompt, StopRules(max_tokens=40))
        spec, _ = run(tiny, prompt, StopRules(max_tokens=40), ctl)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.drafted == 0
        total_rounds += spec.stats.rounds
        total_lookups += spec.stats.lookups
    assert not ctl.arm.drafting
    assert total_lookups < 0.3 * total_rounds, (total_lookups, total_rounds)


def test_graph_backends_verify_power_of_two_rows(tiny, monkeypatch) -> None:
    """Where each row count on each cache is a graph capture, a round verifies 2, 4, 8 or 16
    rows (forced here with ECHOLINE_DRAFT_WIDTHS=pow2); the replies stay identical."""
    import echoline.engine.generate as gen

    widths: list[int] = []
    real = gen.run_rows

    def spy(model, cache, rows, all_logits=True):
        if all_logits:
            widths.append(len(rows))
        return real(model, cache, rows, all_logits=all_logits)

    monkeypatch.setattr(gen, "run_rows", spy)
    monkeypatch.setenv("ECHOLINE_DRAFT_WIDTHS", "pow2")
    drafted = 0
    for prompt in prompts(8, seed=11):
        plain, _ = run(tiny, prompt, StopRules(max_tokens=30))
        widths.clear()
        ctl = DraftController(linear_cost(0.0), max_draft=16, arm=ScriptedArm([True]))
        spec, _ = run(tiny, prompt, StopRules(max_tokens=30), ctl)
        assert spec.token_ids == plain.token_ids
        assert set(widths) <= {1, 2, 4, 8, 16}, widths
        drafted += spec.stats.drafted
    assert drafted > 0
