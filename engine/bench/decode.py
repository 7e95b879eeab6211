"""``echoline bench decode``: plain decode tok/s and the whole-forward cost of k rows.

The row-cost curve is what decides whether speculation can pay on this
machine (a verify of k drafts is one forward of k+1 rows).
"""

from __future__ import annotations

import statistics

from echoline.engine.bench.common import load, print_table, row_costs, verify_widths

PROMPT = "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n"


def plain_tok_s(engine, n_tokens: int, rounds: int) -> float:
    prompt = engine.encode(PROMPT)
    rates = []
    for _ in range(rounds):
        res = engine.generate(prompt, max_tokens=n_tokens, spec=False, stop=())
        rates.append(res.stats.tokens_per_s)
    return statistics.median(rates)


def chained_vs_stepwise(engine, n_tokens: int, rounds: int) -> tuple[float, float]:
    """Plain tok/s with decode steps chained on the device (engine/step_chain.py) and with
    each step waiting for its id, in interleaved rounds (medians of each)."""
    backend = engine.model.backend
    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        for r in range(rounds):
            for chain in ((True, False) if r % 2 == 0 else (False, True)):
                backend.graph_chain = chain
                rates[chain].append(plain_tok_s(engine, n_tokens, 1))
    finally:
        del backend.graph_chain  # back to the class's own setting
    return statistics.median(rates[True]), statistics.median(rates[False])


def run(args) -> dict:
    engine = load(args)
    engine.generate(engine.encode(PROMPT), max_tokens=4, spec=False)  # JIT / warm-up
    n_tokens, rounds = min(args.max_tokens, 64), max(1, args.rounds)
    stepwise = None
    if getattr(engine.model.backend, "graph_chain", False):
        tok_s, stepwise = chained_vs_stepwise(engine, n_tokens, max(3, rounds))
    else:
        tok_s = plain_tok_s(engine, n_tokens, rounds)
    row_counts = verify_widths(engine)
    times = row_costs(engine, context=128, ks=row_counts, reps=max(3, args.rounds))
    cost = {str(k): round(times[k] / times[1], 3) for k in row_counts}
    print_table(
        f"bench decode: {engine.model_name} on {engine.backend_variant}: plain {tok_s:.1f} tok/s",
        ["rows", "forward ms", "cost vs 1 row"],
        [[k, f"{times[k] * 1e3:.2f}", cost[str(k)]] for k in row_counts],
    )
    if stepwise is not None:
        print_table("plain decode, steps chained on the device vs each waiting for its id",
                    ["mode", "tok/s (median)"], [["chained", f"{tok_s:.1f}"], ["stepwise", f"{stepwise:.1f}"]])
    extra = {} if stepwise is None else {"plain_tok_s_stepwise": round(stepwise, 2)}
    return {
        **extra,
        "model": engine.model_name,
        "backend": engine.backend_name,
        "variant": engine.backend_variant,
        "plain_tok_s": round(tok_s, 2),
        "row_cost": cost,
        "row_ms": {str(k): round(times[k] * 1e3, 3) for k in row_counts},
    }
