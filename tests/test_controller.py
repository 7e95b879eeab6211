"""Draft-length controller: cost model, acceptance tracking, and the k it picks."""

from __future__ import annotations

import random

import pytest
from echoline.engine.drafting import Draft
from echoline.engine.drafting.controller import (
    AcceptanceModel,
    DraftController,
    VerifyCost,
    expected_tokens,
    match_bucket,
)


def linear_cost(extra_per_row: float, t1: float = 0.01, rows: int = 17) -> VerifyCost:
    """T(r) = t1 × (1 + extra_per_row × (r - 1))."""
    return VerifyCost.from_ratios([1.0 + extra_per_row * (r - 1) for r in range(1, rows + 1)], t1)


def draft(n: int = 16, match_len: int = 20, source: str = "prompt") -> Draft:
    return Draft(list(range(100, 100 + n)), source, match_len, 5)


def test_expected_tokens_formula() -> None:
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])
    assert expected_tokens([1.0, 0.0, 1.0]) == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_steep_cost_never_drafts() -> None:
    """T(2)/T(1) = 2 (rows cost like separate steps): no acceptance can pay for it."""
    c = DraftController(linear_cost(1.0))
    for _ in range(50):
        c.observe("prompt", 32, 16, 16)  # perfect history
    for n, L in [(16, 32), (4, 1), (1, 8)]:
        for _ in range(300):  # also no probes: the prior cannot win either
            assert c.choose(draft(n, L), 100, 500) == 0
    assert c.expected_speedup(1, "prompt", 32, 100) <= 1.0
    assert c.probes == 0


def test_flat_cost_high_acceptance_drafts_long() -> None:
    c = DraftController(linear_cost(0.01), max_draft=16)
    for _ in range(20):
        c.observe("prompt", 20, 16, 16)
    assert c.choose(draft(16, 20), 100, 500) == 16
    assert c.expected_speedup(16, "prompt", 20, 100) > 5


def test_cpu_like_cost_picks_moderate_k() -> None:
    c = DraftController(linear_cost(0.15))
    k = c.choose(draft(16, 20), 100, 500)
    assert 1 <= k < 16
    speeds = [c.expected_speedup(j, "prompt", 20, 100) for j in range(17)]
    assert speeds[k] == pytest.approx(max(speeds))


def test_respects_remaining_draft_length_and_max_draft() -> None:
    c = DraftController(linear_cost(0.0), max_draft=8)
    for _ in range(20):
        c.observe("prompt", 20, 8, 8)
    assert c.choose(draft(16), 100, 500) == 8
    assert c.choose(draft(3), 100, 500) == 3
    assert c.choose(draft(16), 100, 5) == 4  # a round yields k+1 tokens
    assert c.choose(draft(16), 100, 1) == 0
    assert c.choose(Draft(), 100, 500) == 0
    assert c.choose(draft(16), 100) == 8  # no budget given


def test_failures_push_k_to_zero_and_successes_back_up() -> None:
    c = DraftController(linear_cost(0.15), explore_budget=0.0)
    d = draft(16, 6, "file:/x.py")
    k0 = c.choose(d, 100, 500)
    assert k0 > 0  # a fresh source with a fair match is tried
    rounds = 0
    while c.choose(d, 100, 500) > 0:
        c.observe(d.source, d.match_len, 16, 0)
        rounds += 1
        assert rounds < 4
    assert c.choose(d, 100, 500) == 0
    c.observe(d.source, d.match_len, 1, 1)  # e.g. a probe that worked
    ks = []
    for _ in range(6):
        ks.append(c.choose(d, 100, 500))
        c.observe(d.source, d.match_len, 16, 16)
    assert ks[-1] > k0 and ks == sorted(ks)


def test_match_length_raises_acceptance_prior() -> None:
    m = AcceptanceModel()
    ps = [m.p("file:/new", L) for L in (1, 2, 4, 8, 16, 32)]
    assert ps == sorted(ps) and ps[0] < 0.3 and ps[-1] > 0.8
    assert match_bucket(1) == 0 and match_bucket(500) == match_bucket(128) > match_bucket(32)
    # positions further into a draft are judged at a longer effective match
    assert m.position_probs("prompt", 1, 4) == sorted(m.position_probs("prompt", 1, 4))


def test_new_source_inherits_pool_of_its_kind() -> None:
    m = AcceptanceModel()
    before = m.p("file:/b.py", 8)
    for _ in range(10):
        m.observe("file:/a.py", 8, 4, 0)
    assert m.p("file:/b.py", 8) < before  # files have been failing
    assert m.p("prompt", 8) == pytest.approx(before)  # other kinds untouched
    assert m.p("file:/a.py", 8) < m.p("file:/b.py", 8)


def test_online_cost_updates_change_choice() -> None:
    cost = linear_cost(0.02, t1=0.01)
    c = DraftController(cost)
    d = draft(16, 12)
    assert c.choose(d, 100, 500) >= 8
    for _ in range(10):  # the machine turns out to pay a full step per row
        for r in range(1, 18):
            c.observe_cost(r, 100, 0.01 * r)
    assert cost.ratio(2, 100) == pytest.approx(2.0)
    assert c.choose(d, 100, 500) == 0


def test_contention_burst_does_not_stop_drafting_for_good() -> None:
    """A burst of slow multi-row forwards talks the controller out of drafting; once the
    burst is over and only one-row steps are observed (it no longer drafts, so nothing
    else is), the inflated cells go back to their start-up values and drafting resumes."""
    cost = linear_cost(0.05, t1=0.01)
    c = DraftController(cost)
    d = draft(16, 24)
    k0 = c.choose(d, 100, 500)
    assert k0 >= 8
    for _ in range(10):  # contention: every multi-row forward takes a full step per row
        for r in range(2, 18):
            c.observe_cost(r, 100, 0.01 * r)
    assert c.choose(d, 100, 500) == 0
    stuck = 0
    for step in range(VerifyCost.STALE_AFTER + 64):  # quiet again: plain steps only
        c.observe_cost(1, 100, 0.01)
        if step < VerifyCost.STALE_AFTER - 64:
            stuck += c.choose(d, 100, 500) == 0
    assert stuck == VerifyCost.STALE_AFTER - 64  # the burst did stick while it was recent
    assert cost.ratio(17, 100) == pytest.approx(1.0 + 0.05 * 16)
    assert c.choose(d, 100, 500) == k0


def test_online_curve_stays_physical_when_cells_move_apart() -> None:
    """Slow one-row steps (contention) must not make a verify look cheaper than a plain
    step, and slow wide verifies must not cost more than one step per row."""
    cost = linear_cost(0.1, t1=0.01)
    for _ in range(10):
        cost.observe(1, 100, 0.05)  # five times slower, one-row cell only
    assert all(cost.ratio(r, 100) >= 1.0 for r in range(1, 18))
    assert all(cost.ratios(17, 100)[r] >= cost.ratios(17, 100)[r - 1] for r in range(2, 18))
    cost = linear_cost(0.1, t1=0.01)
    for _ in range(10):
        cost.observe(17, 100, 1.0)  # a 17-row forward at 100 steps' cost
    assert cost.ratio(17, 100) <= 17.0 + 1e-9


def test_verify_cost_measure_interpolates_and_is_robust() -> None:
    calls = []

    def fn(rows: int, ctx: int) -> float:
        calls.append((rows, ctx))
        return 0.001 * (10 + rows) * (1 + ctx / 1000)

    cost = VerifyCost.measure(fn, rows=[1, 2, 4, 8], ctxs=[0, 1000, 2000], repeats=3)
    assert len(calls) == 4 * 3 * 3
    # between rows and ctxs (context lengths are read at 32-position granularity)
    assert cost.time(3, 512) == pytest.approx(0.001 * 13 * 1.512)
    assert cost.time(3, 500) == pytest.approx(0.001 * 13 * 1.5, rel=0.02)
    assert cost.time(16, 3008) == pytest.approx(0.001 * 26 * 4.008)  # extrapolated both ways
    assert cost.ratio(1, 700) == pytest.approx(1.0)
    assert cost.ratio(8, 0) == pytest.approx(18 / 11)
    before = cost.time(2, 1000)
    cost.observe(2, 1000, 50 * before)  # one stray slow step barely moves the median
    assert cost.time(2, 1000) < 1.5 * before
    for _ in range(9):
        cost.observe(2, 1000, 1.5 * before)  # a sustained change takes over
    assert cost.time(2, 1000) == pytest.approx(1.5 * before)
    for _ in range(9):  # ... but never past one step per row (two rows <= two plain steps)
        cost.observe(2, 1000, 3 * before)
    assert cost.time(2, 1000) == pytest.approx(2 * cost.time(1, 1000))


def _simulate(
    c: DraftController,
    cost: VerifyCost,
    accept: float,
    rounds: int,
    seed: int,
    match_lens: tuple[int, int] = (1, 4),
) -> float:
    """Time per token relative to plain decode for traffic with per-token acceptance."""
    rng = random.Random(seed)
    t_spec = 0.0
    produced = 0
    ctx = 500
    while produced < rounds:
        d = Draft(list(range(16)), rng.choice(["reply", "prompt"]), rng.randrange(*match_lens), 0)
        k = c.choose(d, ctx, 10_000)
        t_spec += cost.time(k + 1, ctx)
        a = 0
        while a < k and rng.random() < accept:
            a += 1
        if k:
            c.observe(d.source, d.match_len, k, a)
        produced += a + 1
        ctx += a + 1
    t_plain = sum(cost.time(1, 500 + i) for i in range(produced))
    return t_spec / t_plain


@pytest.mark.parametrize("extra", [0.02, 0.15, 0.5])
def test_chat_traffic_costs_at_most_two_percent(extra: float) -> None:
    cost = linear_cost(extra)
    c = DraftController(cost)
    rel = _simulate(c, cost, accept=0.0, rounds=3000, seed=1)
    assert rel <= 1.02, rel
    assert c.probes > 0 or extra > 0.4  # it keeps retrying where that is affordable


def test_copy_traffic_gains_and_probes_recover_after_chat() -> None:
    cost = linear_cost(0.1)
    c = DraftController(cost)
    assert _simulate(c, cost, accept=0.0, rounds=2000, seed=2, match_lens=(1, 33)) <= 1.02
    # the same sources start to match: a probe notices and drafting resumes
    rel = _simulate(c, cost, accept=0.97, rounds=2000, seed=3, match_lens=(8, 33))
    assert rel < 0.5, rel


def test_short_chat_with_fresh_controller() -> None:
    """Even before anything is learned, the first failures cost little."""
    cost = linear_cost(0.15)
    rel = [_simulate(DraftController(cost), cost, 0.0, 100, seed) for seed in range(10)]
    assert max(rel) <= 1.02, rel


def test_round_overhead_dilutes_the_verify_cost() -> None:
    """Per-round work outside the forward makes a verify relatively cheaper: k grows."""
    cost = linear_cost(0.6)  # T(k+1)/T(1) = 1 + 0.6k: a one-token draft needs p > 0.6
    plain, loaded = DraftController(cost, explore_budget=0.0), DraftController(cost, explore_budget=0.0)
    for c in (plain, loaded):
        for i in range(40):
            c.observe("prompt", 3, 1, i % 2)  # half the one-token drafts accepted here
    loaded.observe_overhead(0.01)  # as long as a whole forward (t1 = 0.01)
    assert loaded.overhead_s == pytest.approx(0.01)
    d = draft(16, match_len=3)
    assert plain.choose(d, 100) == 0
    assert loaded.choose(d, 100) > 0
    for _ in range(200):  # the EMA follows a smaller overhead back down
        loaded.observe_overhead(0.0)
    assert loaded.overhead_s < 1e-5
    assert loaded.choose(d, 100) == 0


def test_copy_streak_lengthens_the_match_judged() -> None:
    """A draft that continues the last round's source where its accepted tokens ended, with
    nothing written between, is judged at the streak's length (past the index's 32); a
    rejection, another position, another source or a skipped step ends the streak."""
    c = DraftController(linear_cost(0.05), max_draft=63)

    def at(pos: int, source: str = "reply", match: int = 32) -> Draft:
        return Draft(list(range(63)), source, match, pos)

    ctx, pos = 400, 10
    k = c.choose(at(pos), ctx, 1000)
    assert k > 0 and c.effective_match(at(pos), ctx) == 32
    c.observe("reply", 32, k, k)  # all accepted: k drafts and the round's own token
    ctx, pos = ctx + k + 1, pos + k + 1
    assert c.effective_match(at(pos), ctx) == 32 + k + 1
    assert c.effective_match(at(pos + 1), ctx) == 32  # another occurrence
    assert c.effective_match(at(pos), ctx + 3) == 32  # plain steps ran between
    assert c.effective_match(at(pos, "prompt"), ctx) == 32  # another source
    assert c.effective_match(at(pos, match=5), ctx) == 32 + k + 1  # the streak proves the rest
    k2 = c.choose(at(pos), ctx, 1000)
    assert k2 > 0
    c.observe("reply", 32, k2, k2 - 2)  # a rejection
    assert c.effective_match(at(pos + k2 - 1), ctx + k2 - 1) == 32
    # a plain step (k = 0) that continues the copy keeps the streak going
    c2 = DraftController(linear_cost(1.0))  # drafting never pays: every choice is 0
    c2._run = ("reply", 7, 40, 100)
    assert c2.choose(at(7), 100, 1000) == 0
    assert c2.effective_match(at(8), 101) == 41


def test_copy_streak_drafts_longer_on_a_long_copy() -> None:
    """A reply that re-copies a remembered passage round after round: with the streak, the
    controller goes to longer rounds than the 32-token match alone supports, on a cost curve
    like a GPU's (64 rows 5.3 one-row steps, 16 rows 1.7)."""
    rows = [1, 2, 4, 8, 16, 32, 64]
    ratios = [1.0, 1.24, 1.29, 1.34, 1.71, 2.72, 5.29]
    cost = VerifyCost(rows, [0], [[0.004 * r] for r in ratios])

    def rounds(streak: bool) -> list[int]:
        c = DraftController(cost, max_draft=63)
        ks = []
        for _ in range(6):  # requests, each 128 tokens of one long copy, all accepted
            done, ctx, pos = 0, 500, 0
            while done < 128:
                d = Draft(list(range(63)), "reply", 16, pos)  # the index's match: 16 tokens
                if not streak:
                    c._run = None
                k = c.choose(d, ctx, 128 - done, pow2=True)
                if k:
                    c.observe("reply", 16, k, k)
                ks.append(k)
                done, ctx, pos = done + k + 1, ctx + k + 1, pos + k + 1
        return ks[-8:]

    with_streak, without = rounds(True), rounds(False)
    assert all((k + 1) & k == 0 for k in with_streak + without)  # graph widths only
    assert max(with_streak) > max(without), (with_streak, without)
    assert len([k for k in with_streak if k]) <= len([k for k in without if k])


def test_graph_widths_choose_among_powers_of_two() -> None:
    """With ``pow2`` the controller weighs only k + 1 = 2, 4, 8 … rows (the widths a graph
    backend verifies) instead of judging k = 40 and verifying 31."""
    c = DraftController(linear_cost(0.02, rows=64), max_draft=63)
    for _ in range(20):
        c.observe("prompt", 32, 40, 40)
    k = c.choose(Draft(list(range(63)), "prompt", 32, 3), 100, 1000, pow2=True)
    widths = [1, 3, 7, 15, 31, 63]
    speeds = {j: c.expected_speedup(j, "prompt", 32, 100) for j in widths}
    assert k in widths and speeds[k] == max(speeds.values())
    free = c.choose(Draft(list(range(63)), "prompt", 32, 3), 100, 1000)
    assert c.expected_speedup(free, "prompt", 32, 100) >= speeds[k]  # any k: at least as good
