"""``echoline bench spec``: speculative vs plain decoding on copy, edit, chat, followup or rewrite traffic.

``rewrite`` is the editor's rewrite command: a function of each source selected, the same
instructions as ``edit``, sent through the sidecar's own rewrite prompt (the reply primed
with a code fence and ended by the closing one), so the reply is the rewritten selection
and no prose. The sidecar builds those requests (``run``'s ``requests``): the engine knows
nothing of its prompts. ``edit`` asks in chat form for the whole excerpt, and the model's
reply mixes code with prose it writes fresh.

``followup`` is an editor's type-through: a raw completion in the middle of a source file,
then the same request once the user accepted its first token; the second is timed, with the
first reply kept by the engine as a draft source (``Engine.remember_reply``). The other
traffics measure fresh requests: the engine forgets earlier replies before each one, or the
plain run of a prompt would hand its reply to the speculative run of the same prompt.

Both modes run the same requests in interleaved rounds (the order rotates
each round) and the medians are compared, in one process, so machine noise
hits both alike. Every speculative reply is checked token for token against
the plain one.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echoline.engine.bench import traffic
from echoline.engine.bench.common import load, print_table, row_costs, verify_widths
from echoline.engine.bench.oracle import interpolated_ratios, oracle_ratio

#: Timed forwards per row count for ``verify_cost`` where a forward takes about a millisecond
#: (GPU): three samples left the 16-row ratio moving by ±0.04 between traffic kinds of one run
#: (the same model and context); fifteen cost 0.2 s. On the CPU a 16-row forward takes
#: seconds, so it keeps three.
GPU_VERIFY_REPS = 15


def _verify_reps(engine: Any, args: Any) -> int:
    """``--verify-reps`` when given, else by backend (see GPU_VERIFY_REPS)."""
    reps = getattr(args, "verify_reps", None)
    if reps:
        return max(1, int(reps))
    return GPU_VERIFY_REPS if engine.backend_name == "cuda" else 3


FOLLOWUP_TOKENS = 64  # an inline completion's length, not a rewrite's


def _split_ms(stats, per: str) -> dict[str, float]:
    """Forward (device work and its sync) and host milliseconds per round or per token,
    summed over requests; ``lookup`` is the part of host spent drafting and choosing k."""
    n = sum((s.rounds if per == "round" else max(0, s.generated_tokens - 1)) for s in stats)
    if n <= 0:
        return {"forward": 0.0, "host": 0.0, "lookup": 0.0}
    return {
        "forward": round(sum(s.forward_s for s in stats) / n * 1e3, 4),
        "host": round(sum(s.host_s for s in stats) / n * 1e3, 4),
        "lookup": round(sum(s.lookup_s for s in stats) / n * 1e3, 4),
    }


def _prompts(engine, kind: str, paths) -> list[list[int]]:
    sets = traffic.copy_messages(paths) if kind == "copy" else traffic.edit_messages(paths)
    if engine.has_chat_template:
        return [engine.encode_chat(m) for m in sets]
    return [engine.encode(traffic.raw_prompt(m)) for m in sets]


def _interleave(units, rounds: int):
    """Run every unit in both modes, rotating which mode goes first each round.

    A unit is a callable ``unit(mode) -> [(prompt ids, GenerationResult), ...]`` (one
    request, or the turns of one conversation). Returns per-mode (tokens, decode seconds) per
    round, the first round's replies per mode, every speculative run's stats, the first-round
    plain replies' prompts, and every plain run's stats.
    """
    per_round = {"plain": [], "spec": []}
    replies = {"plain": [], "spec": []}
    stats = []
    plain_stats = []  # the plain runs' stats, for the per-round split of both modes
    prompts: list[list[int]] = []  # the prompt of each first-round plain reply (for the oracle)
    for r in range(rounds):
        order = ("plain", "spec") if r % 2 == 0 else ("spec", "plain")
        totals = {m: [0, 0.0] for m in order}
        for unit in units:
            for mode in order:
                for prompt, res in unit(mode):
                    totals[mode][0] += max(0, res.stats.generated_tokens - 1)
                    totals[mode][1] += res.stats.decode_s
                    if r == 0:
                        replies[mode].append(res.token_ids)
                        if mode == "plain":
                            prompts.append(prompt)
                    if mode == "spec":
                        stats.append(res.stats)
                    else:
                        plain_stats.append(res.stats)
        for mode in order:
            per_round[mode].append(totals[mode])
    return per_round, replies, stats, prompts, plain_stats


#: A request built outside the engine: prompt ids and the stop strings that end its reply.
Request = tuple[list[int], tuple[str, ...]]


def _single_turn(engine, requests: list[Request], max_tokens: int, rounds: int):
    def unit(prompt, stop):
        def run_one(mode: str):
            engine.forget_replies()  # a fresh request: no earlier reply of this prompt to draft from
            return [(prompt, engine.generate(prompt, max_tokens=max_tokens, stop=stop, spec=mode == "spec"))]

        return run_one

    return _interleave([unit(p, stop) for p, stop in requests], rounds)


def _followup(engine, prefixes: list[list[int]], max_tokens: int, rounds: int):
    """Type-through: a completion, then the same request after its first token was accepted.

    Only the second request is timed and compared. The first runs plainly in both modes
    (same state either way), and the engine keeps its reply as a draft source — the one
    extra source the second request has; ``kept`` returns it per request for the oracle.
    """
    kept: dict[int, list[list[int]]] = {}

    def unit(pi: int, prefix: list[int]):
        def run_pair(mode: str):
            engine.forget_replies()
            first = engine.generate(prefix, max_tokens=max_tokens, spec=False)
            kept[pi] = [engine.index.source_tokens(s) for s in engine.history_sources()]
            follow = prefix + first.token_ids[:1]
            return [(follow, engine.generate(follow, max_tokens=max(1, max_tokens - 1), spec=mode == "spec"))]

        return run_pair

    out = _interleave([unit(i, p) for i, p in enumerate(prefixes)], rounds)
    return out, [kept[i] for i in range(len(prefixes))]


def _chat(engine, max_tokens: int, rounds: int):
    def conversation(ci: int, turns):
        def run_turns(mode: str):
            messages: list[dict[str, str]] = []
            history: list[int] = []
            results = []
            engine.forget_replies()  # the other mode's run of these turns is no draft source
            for question in turns:
                messages.append({"role": "user", "content": question})
                if engine.has_chat_template:
                    prompt = engine.encode_chat(messages)
                else:
                    prompt = history + engine.encode(("\n\n" if history else "") + "Q: " + question + "\nA:")
                res = engine.generate(prompt, max_tokens=max_tokens, spec=mode == "spec",
                                      session=f"bench-chat-{mode}-{ci}")
                messages.append({"role": "assistant", "content": res.text})
                history = prompt + res.token_ids
                results.append((prompt, res))
            return results

        return run_turns

    return _interleave([conversation(ci, t) for ci, t in enumerate(traffic.CHAT_TURNS)], rounds)


def run(args, requests: Callable[[Any, list[Path]], list[Request]] | None = None) -> dict:
    """The benchmark. ``requests(engine, paths)``: the requests of a traffic the engine cannot
    build itself (``rewrite``: the sidecar's prompts), given the loaded engine and the sources."""
    kind = args.traffic
    if kind == "rewrite" and requests is None:
        raise SystemExit("bench spec --traffic rewrite: its requests come from the sidecar (run `echoline bench spec`)")
    engine = load(args)
    rounds = max(1, args.rounds)
    engine.generate(engine.encode("def f(x):\n"), max_tokens=4, spec=False)  # warm-up / JIT
    extras = None
    if kind == "chat":
        per_round, replies, stats, prompts, plain_stats = _chat(engine, min(args.max_tokens, 96), rounds)
    elif kind == "followup":
        paths = traffic.source_paths(args.source)
        if not paths:
            raise SystemExit("no source files found for the benchmark")
        prefixes = [engine.tokenizer.encode(t, parse_special=False) for t in traffic.followup_prefixes(paths)]
        (per_round, replies, stats, prompts, plain_stats), extras = _followup(
            engine, prefixes, min(args.max_tokens, FOLLOWUP_TOKENS), rounds
        )
    else:
        paths = traffic.source_paths(args.source)
        if not paths:
            raise SystemExit("no source files found for the benchmark")
        built = requests(engine, paths) if requests is not None else [(p, ()) for p in _prompts(engine, kind, paths)]
        per_round, replies, stats, prompts, plain_stats = _single_turn(engine, built, args.max_tokens, rounds)
    rate = {m: [n / s if s > 0 else 0.0 for n, s in per_round[m]] for m in per_round}
    ratios = [s / p for p, s in zip(rate["plain"], rate["spec"], strict=True) if p > 0]
    plain_tok_s = statistics.median(rate["plain"])
    spec_tok_s = statistics.median(rate["spec"])
    identical = replies["plain"] == replies["spec"]
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    rounds_total = sum(s.rounds for s in stats)
    generated = sum(s.generated_tokens for s in stats)
    ctx = 1024 if kind != "chat" else 128
    verify_rows = verify_widths(engine)
    costs = row_costs(engine, context=ctx, ks=verify_rows, reps=_verify_reps(engine, args))
    verify_cost = {str(k): round(costs[k] / costs[1], 3) for k in verify_rows}
    limit = max((k) / (costs[k] / costs[1]) for k in verify_rows)
    # The best any controller could do on these very replies with this drafter and cost.
    oracle = oracle_ratio(
        list(zip(prompts, replies["plain"], strict=True)),
        interpolated_ratios(costs, engine.max_draft + 1),
        engine.max_draft,
        extras,
    )
    result = {
        "model": engine.model_name,
        "backend": engine.backend_name,
        "variant": engine.backend_variant,
        "traffic": kind,
        "reply_history": engine.reply_history,
        "plain_tok_s": round(plain_tok_s, 2),
        "spec_tok_s": round(spec_tok_s, 2),
        "ratio": round(statistics.median(ratios), 3) if ratios else 0.0,
        "replies": len(replies["plain"]),
        "identical": identical,
        "acceptance": round(accepted / drafted, 4) if drafted else 0.0,
        "tokens_per_round": round(generated / rounds_total, 3) if rounds_total else 0.0,
        "verify_cost": verify_cost,
        "limit_ratio": round(limit, 2),
        "oracle_ratio": round(oracle, 2),
        "per_reply_tokens_per_round": [
            round(st.generated_tokens / st.rounds, 2) for st in stats[: len(replies["spec"])] if st.rounds
        ],
        "rounds": rounds,
        # Per speculative round, the median over requests: forward (device) vs host time.
        "round_ms": {
            "forward": round(statistics.median(s.forward_s / s.rounds for s in stats if s.rounds) * 1e3, 3)
            if rounds_total else 0.0,
            "host": round(statistics.median(s.host_s / s.rounds for s in stats if s.rounds) * 1e3, 3)
            if rounds_total else 0.0,
        },
        # New keys (sums over every request of the run, both modes): the split per round
        # and per generated token, and the share of speculative rounds that looked drafts up
        # (the rest ran as plain steps: the controller's plain arm).
        "round_split_ms": {"plain": _split_ms(plain_stats, "round"), "spec": _split_ms(stats, "round")},
        "token_split_ms": {"plain": _split_ms(plain_stats, "token"), "spec": _split_ms(stats, "token")},
        "lookup_share": round(sum(s.lookups for s in stats) / rounds_total, 4) if rounds_total else 0.0,
        # Of those lookups, the share made while the previous verify ran (CUDA) and used.
        "lookups_ahead_share": round(sum(s.lookups_ahead for s in stats) / max(1, sum(s.lookups for s in stats)), 4),
    }
    print_table(
        f"bench spec: {engine.model_name} on {engine.backend_variant}, {kind} traffic, {rounds} interleaved rounds",
        ["mode", "tok/s (median)", "ratio", "identical", "acceptance", "tokens/round"],
        [
            ["plain", f"{plain_tok_s:.1f}", "1.00", "", "", "1.00"],
            ["ngram", f"{spec_tok_s:.1f}", f"{result['ratio']:.2f}", identical, result["acceptance"],
             result["tokens_per_round"]],
        ],
    )
    sys.stderr.write(f"verify cost (k rows / 1 row at context {ctx}): {verify_cost}; "
                     f"limit with every draft accepted: {limit:.2f}x; oracle draft lengths on these "
                     f"replies: {oracle:.2f}x; per round: forward {result['round_ms']['forward']} ms, "
                     f"host {result['round_ms']['host']} ms; per token (forward/host ms) plain "
                     f"{result['token_split_ms']['plain']}, spec {result['token_split_ms']['spec']}; "
                     f"rounds that looked drafts up: {result['lookup_share']}\n")
    if not identical:
        sys.stderr.write("WARNING: speculative replies differ from plain ones\n")
    return result
