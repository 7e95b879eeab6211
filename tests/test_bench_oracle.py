"""The oracle bound of the speculation benchmark: exact on cases worked out by hand."""

from __future__ import annotations

import itertools
import random

from echoline.engine.bench.oracle import (
    confirmed_draft_lengths,
    interpolated_ratios,
    oracle_cost,
    oracle_ratio,
)


def test_confirmed_lengths_follow_the_prompt_copy_and_stop_at_divergence() -> None:
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    reply = [11, 12, 13, 99, 14]  # copies 11 12 13, then departs
    got = confirmed_draft_lengths(prompt, reply, max_draft=4)
    # after [11]: draft 12 13 14 15 -> reply continues 12 13 then 99: 2 confirmed
    assert got[0] == 2
    assert got[1] == 1  # after 11 12: draft 13 14 ... -> 13 ok, 14 vs 99 fails
    assert got[2] == 0  # after 13: draft 14 vs 99
    assert got[-1] == 0  # nothing after the last token


def test_oracle_cost_matches_brute_force_over_all_draft_choices() -> None:
    rng = random.Random(3)
    ratios = [0.0, 1.0, 1.1, 1.3, 1.6, 2.0]  # up to 5 rows: k <= 4
    for _ in range(50):
        n = rng.randint(2, 6)
        confirmed = [rng.randint(0, 4) for _ in range(n)]
        best = float("inf")
        for ks in itertools.product(range(5), repeat=n):  # a k per round, rounds walk positions
            i, cost = 0, 0.0
            for k in ks:
                if i >= n - 1:
                    break
                k = min(k, confirmed[i])
                cost += ratios[k + 1]
                i += k + 1
            if i >= n - 1:
                best = min(best, cost)
        assert abs(oracle_cost(confirmed, ratios) - best) < 1e-9


def test_fully_predictable_reply_reaches_the_all_accepted_limit() -> None:
    prompt = list(range(100, 400))
    reply = prompt[:201]  # the reply copies the prompt
    ratios = interpolated_ratios({1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 3.0}, 17)
    assert ratios[1] == 1.0 and abs(ratios[3] - 1.35) < 1e-9 and abs(ratios[17] - 3.125) < 1e-9
    got = oracle_ratio([(prompt, reply)], ratios, max_draft=16)
    limit = max(r / ratios[r] for r in range(1, 18))
    assert got <= limit + 1e-9 and got > 0.9 * limit
    unpredictable = oracle_ratio([([1, 2, 3], [7, 8, 9, 10, 11])], ratios, max_draft=16)
    assert unpredictable == 1.0


def test_bench_spec_reports_the_oracle_bound(smollm2_path) -> None:
    """The benchmark on the real default model: replies identical, oracle ≥ measured limits."""
    from argparse import Namespace

    from echoline.engine.bench import spec

    from tests.conftest import cpu_backend_name

    args = Namespace(model=str(smollm2_path), backend=cpu_backend_name(), traffic="copy",
                     source=["engine/kvcache.py"], rounds=1, max_tokens=24)
    result = spec.run(args)
    assert result["identical"] is True and result["replies"] == 1
    assert 1.0 <= result["oracle_ratio"] <= result["limit_ratio"] + 0.5


def test_draft_study_baseline_rule_is_the_index_rule() -> None:
    """The study's "recent" tie-break reproduces the index's own drafts position by position
    (so the rules it compares differ from the product only in the tie-break), and the
    hindsight rule is never worse than any causal rule at any position."""
    import random

    from tools.engine.draft_study import RULES, confirmed_by_rule

    rng = random.Random(7)
    for _ in range(40):
        prompt = [rng.randrange(4) for _ in range(rng.randrange(5, 60))]
        reply = [rng.randrange(4) for _ in range(rng.randrange(2, 40))]
        if rng.random() < 0.5:  # a reply that copies a stretch of the prompt
            a = rng.randrange(len(prompt))
            reply = prompt[a : a + 25] + reply
        assert confirmed_by_rule(prompt, reply, "recent") == confirmed_draft_lengths(prompt, reply, 16)
        best = confirmed_by_rule(prompt, reply, "hindsight")
        for rule in RULES:
            got = confirmed_by_rule(prompt, reply, rule)
            assert all(b >= g for b, g in zip(best, got, strict=True)), rule


def test_draft_study_controller_replay_is_bounded_by_its_oracle() -> None:
    from tools.engine.draft_study import controller_replay, parse_curve

    curve = parse_curve("1:1,2:1.1,4:1.3,8:1.8,17:3.0")
    ratios = interpolated_ratios(curve, 33)
    prompt = list(range(100, 160)) * 2
    pairs = [(prompt, list(range(100, 150)) + [7, 8] + list(range(120, 150)))]
    got, best = controller_replay(pairs, ratios, 16)
    assert 1.0 <= got <= best + 1e-9 and best > 2.0
    slow, slow_best = controller_replay(pairs, ratios, 16, "free", overhead=0.5)
    # a round's host time, paid by plain rounds too, dilutes the verify's extra cost
    assert 1.0 <= slow <= slow_best + 1e-9 and slow_best > best
    pow2, pow2_best = controller_replay(pairs, ratios, 16, "round")  # widths 2, 4, 8, 16 only
    assert 1.0 <= pow2 <= pow2_best + 1e-9 <= best + 2e-9
    chosen, chosen_best = controller_replay(pairs, ratios, 16, "choose")  # weighed among those widths
    assert 1.0 <= chosen <= chosen_best + 1e-9 and chosen_best == pow2_best


def test_long_copy_replay_streak_and_widths() -> None:
    """``tools.engine.long_copy_replay``: on the 7B's H100 curve, a long copy whose drafts
    are all accepted runs rounds of at most 15 drafts without the copy streak, and rounds of
    63 with it once learned; the controller's choices are graph widths in both."""
    from tools.engine.long_copy_replay import H100_7B, replay

    curve = {int(a): float(b) for a, b in (p.split(":") for p in H100_7B.split(","))}
    old = replay(curve, 16, 128, 4, 4.0, 0.8, streak=False, mode="round")
    new = replay(curve, 16, 128, 4, 4.0, 0.8, streak=True, mode="choose")
    assert all((k + 1) & k == 0 for ks, _ in old + new for k in ks)
    assert max(old[-1][0]) <= 15 and max(new[-1][0]) == 63
    assert new[-1][1] > 1.2 * old[-1][1]


def test_oracle_counts_extra_sources() -> None:
    """A reply no prompt holds is undraftable, unless an extra source (a kept reply) holds it."""
    prompt = [1, 2, 3, 4]
    reply = list(range(50, 90))
    ratios = interpolated_ratios({1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 3.0}, 17)
    assert oracle_ratio([(prompt, reply)], ratios, max_draft=16) == 1.0
    kept = [[3, 4] + reply]
    assert oracle_ratio([(prompt, reply)], ratios, max_draft=16, extras=[kept]) > 3.0


def test_bench_spec_followup_drafts_the_kept_reply(smollm2_path) -> None:
    """Type-through on the real model: the second request drafts the first reply, exactly."""
    from argparse import Namespace

    from echoline.engine.bench import spec

    from tests.conftest import cpu_backend_name

    args = Namespace(model=str(smollm2_path), backend=cpu_backend_name(), traffic="followup",
                     source=["engine/kvcache.py"], rounds=1, max_tokens=24, reply_history=None)
    result = spec.run(args)
    assert result["identical"] is True and result["replies"] == 1 and result["reply_history"] == 4
    assert result["tokens_per_round"] > 4.0, result
    # --reply-history 0: the same second request with nothing kept (measured 2.3 a round).
    args.reply_history = 0
    without = spec.run(args)
    assert without["identical"] is True and without["reply_history"] == 0
    assert without["tokens_per_round"] < result["tokens_per_round"] - 1.0, (without, result)
    assert without["oracle_ratio"] < result["oracle_ratio"]


def test_scaled_excess_curve_keeps_one_row_and_scales_the_rest() -> None:
    """--excess-scale: 1 leaves the curve as measured, 0 makes every verify cost one row, and a
    cheaper verify raises the oracle on the same replies."""
    from tools.engine.draft_study import scale_excess

    curve = {1: 0.008, 2: 0.009, 17: 0.024}
    assert scale_excess(curve, 1.0) == {1: 1.0, 2: 0.009 / 0.008, 17: 3.0}
    assert scale_excess(curve, 0.0) == {1: 1.0, 2: 1.0, 17: 1.0}
    half = scale_excess(curve, 0.5)
    assert abs(half[17] - 2.0) < 1e-12
    prompt = list(range(100, 160)) * 2
    pairs = [(prompt, list(range(100, 150)) + [7, 8] + list(range(120, 150)))]
    full = oracle_ratio(pairs, interpolated_ratios(scale_excess(curve, 1.0), 17), max_draft=16)
    cheap = oracle_ratio(pairs, interpolated_ratios(scale_excess(curve, 0.5), 17), max_draft=16)
    assert cheap > full > 1.0


def test_function_span_selects_a_whole_function_within_the_cap() -> None:
    from echoline.engine.bench.traffic import function_span

    code = "import os\n\n\ndef short():\n    return 1\n\n\ndef long(a, b):\n" + "".join(
        f"    x{i} = a + {i}\n" for i in range(9)
    ) + "    return x0\n\n\nTAIL = 2\n"
    a, b = function_span(code)
    assert code[a:b].startswith("def long(a, b):\n") and code[a:b].endswith("    return x0\n")
    a, b = function_span(code, max_chars=60)  # cut on a line boundary, never mid-line
    assert code[a:b].startswith("def long") and len(code[a:b]) <= 60 and code[a:b].endswith("\n")
    a, b = function_span("x = 1\n" * 40)  # no function: the middle lines
    assert 0 < a < b < 240 and (b - a) % 6 == 0


def test_bench_spec_rewrite_traffic_is_the_sidecars_rewrite(smollm2_path, capsys) -> None:
    """``echoline bench spec --traffic rewrite``: the sidecar's rewrite prompt (the reply primed
    with a fence and stopped by the closing one) on a selected function, every reply identical;
    the engine's benchmark refuses the traffic without the sidecar's requests."""
    import json
    from argparse import Namespace

    import pytest
    from echoline.engine.bench import spec
    from echoline.sidecar import cli
    from echoline.sidecar.bench.rewrite_traffic import rewrite_requests
    from echoline.sidecar.prompts import FENCE

    from tests.conftest import cpu_backend_name

    args = Namespace(model=str(smollm2_path), backend=cpu_backend_name(), traffic="rewrite",
                     source=["engine/kvcache.py"], rounds=1, max_tokens=40)
    with pytest.raises(SystemExit, match="sidecar"):
        spec.run(args)
    seen = []

    def build(engine, paths):
        reqs = rewrite_requests(engine, paths, args.max_tokens)
        seen.extend((engine.tokenizer.decode(ids), stop) for ids, stop in reqs)
        return reqs

    result = spec.run(args, build)
    assert result["identical"] is True and result["replies"] == 1 and result["traffic"] == "rewrite"
    ((prompt, stop),) = seen
    assert stop == (FENCE,) and prompt.endswith(f"{FENCE}python\n") and "class " in prompt
    rc = cli.main(["bench", "spec", "--model", str(smollm2_path), "--backend", cpu_backend_name(),
                   "--traffic", "rewrite", "--source", "engine/kvcache.py", "--rounds", "1",
                   "--max-tokens", "24", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["traffic"] == "rewrite" and out["identical"] is True


def test_bench_spec_prompts_without_a_chat_template_are_plain_text() -> None:
    """A model with no chat template (Gemma 3 base) gets copy and edit requests as plain text
    that opens the answer's code fence."""
    from pathlib import Path
    from types import SimpleNamespace

    from echoline.engine.bench import spec

    engine = SimpleNamespace(has_chat_template=False, encode=lambda text: list(text.encode()))
    for kind in ("copy", "edit"):
        (ids,) = spec._prompts(engine, kind, [Path("engine/kvcache.py")])
        text = bytes(ids).decode()
        assert text.startswith("Here is part of a file:") and text.endswith("\n\n```python\n"), kind


def test_verify_cost_sample_count_follows_the_backend_unless_given() -> None:
    """15 timed forwards per row count where a forward is a millisecond (CUDA), 3 on the CPU,
    ``--verify-reps N`` over both."""
    from types import SimpleNamespace

    from echoline.engine.bench.spec import GPU_VERIFY_REPS, _verify_reps

    cuda, cpu = SimpleNamespace(backend_name="cuda"), SimpleNamespace(backend_name="cpu")
    none = SimpleNamespace(verify_reps=None)
    assert (_verify_reps(cuda, none), _verify_reps(cpu, none)) == (GPU_VERIFY_REPS, 3) == (15, 3)
    assert _verify_reps(cpu, SimpleNamespace(verify_reps=9)) == 9
    assert _verify_reps(cuda, SimpleNamespace()) == 15  # callers built before the flag
