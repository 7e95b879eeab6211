"""Offline studies of the drafter and the controller on recorded replies.

Run: ``python -m tools.engine.draft_study --model NAME --traffic copy|edit|rewrite|repeat
[--curve 1:1,2:1.05,4:1.08,8:1.13,17:1.47] [--context 1300] [--excess-scale 1,0.8,0.7]
[--widths free,round,choose] [--overhead 0,0.2] [--max-drafts 16,64]``.
It records the plain replies of the `bench spec` requests, then replays them (no model
involved):

* **tie-break rules**: when several earlier places match the context's tail equally long,
  which one's continuation to draft. For each rule, the oracle ratio (best draft lengths
  in hindsight, `engine.bench.oracle`) — "recent" is the index's own rule, "hindsight"
  picks the candidate the reply confirms longest (an upper bound no causal rule reaches);
* **controller replay**: the draft-length controller fed the positions' drafts and the
  reply's confirmations, against the oracle, for several maximum draft lengths.

Why it exists: `docs/history/benchmarks-sessions.md` quotes these studies; this is the command that
reproduces them. The cost curve is the engine's measured one at ``--context`` (1024 unless
given; copy replies run at ~1,000-1,300) unless ``--curve`` gives another (e.g. the H200's,
to study the controller at GPU costs); ``--excess-scale`` replays at curves whose cost above
one row is scaled (what a cheaper verify would buy).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence

import numpy as np
from echoline.engine.bench.oracle import interpolated_ratios, oracle_cost
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.drafting.ngram_index import Draft, NgramIndex
from echoline.engine.generate import DRAFT_CONTEXT, GRAPH_WIDTHS, width_drafts

MAX_N = 32  # the index's match-length cap
RULES = ("recent", "oldest", "cursor", "vote", "cursor+vote", "hindsight")


def candidates(
    prompt: Sequence[int], stream: Sequence[int], end: int, max_n: int = MAX_N
) -> tuple[int, list[int]]:
    """Longest match of ``stream[:end]``'s tail and every place it ends, as the index sees them.

    ``stream`` is prompt + reply. An end e means stream[e-L:e] equals the tail and stream[e]
    would be drafted; ends at the prompt's last token are excluded (the prompt is its own
    source, whose continuation stops there) and so is the tail itself.
    """
    arr = np.asarray(stream[: end - 1])
    last = stream[end - 1]
    best, out = 0, []
    for e in (np.flatnonzero(arr == last) + 1).tolist():
        if e == len(prompt):
            continue
        n = 0
        lo = len(prompt) if e > len(prompt) else 0  # a match never crosses into another source
        while n < max_n and e - 1 - n >= lo and stream[e - 1 - n] == stream[end - 1 - n]:
            n += 1
        if n > best:
            best, out = n, [e]
        elif n == best and n > 0:
            out.append(e)
    return best, out


def _confirmed(
    prompt, stream, e: int, i: int, reply: Sequence[int], end: int, max_draft: int
) -> int:
    """How many tokens of the continuation at e the reply confirms after its position i.

    The continuation runs through the text written so far (a prompt's runs on into the
    reply) and past its end repeats its last ``end - e`` tokens, as the index drafts."""
    period = end - e
    a = 0
    while a < max_draft and i + 1 + a < len(reply):
        tok = stream[e + a] if a < period else stream[e + a % period]
        if tok != reply[i + 1 + a]:
            break
        a += 1
    return a


def confirmed_by_rule(
    prompt: Sequence[int], reply: Sequence[int], rule: str, max_draft: int = 16
) -> list[int]:
    """Per reply position: draft tokens the reply confirms when ties are broken by ``rule``."""
    stream = list(prompt) + list(reply)
    out: list[int] = []
    cursor: tuple[int, int] | None = None  # (chosen end, reply position) of the last draft
    for i in range(len(reply)):
        end = len(prompt) + i + 1
        _, ends = candidates(prompt, stream, end)
        if not ends:
            out.append(0)
            continue

        if rule == "recent":
            e = max(ends)
        elif rule == "oldest":
            e = min(ends)
        elif rule == "vote":
            e = _most_voted(stream, ends, end)
        elif rule == "hindsight":
            e = max(
                ends,
                key=lambda x, i=i, end=end: _confirmed(prompt, stream, x, i, reply, end, max_draft),
            )
        elif rule in ("cursor", "cursor+vote"):
            want = cursor[0] + (i - cursor[1]) if cursor is not None else None
            if want in ends:
                e = want
            else:
                e = max(ends) if rule == "cursor" else _most_voted(stream, ends, end)
            cursor = (e, i)
        else:
            raise ValueError(f"unknown rule {rule!r}")
        out.append(_confirmed(prompt, stream, e, i, reply, end, max_draft))
    return out


def _most_voted(stream: Sequence[int], ends: list[int], end: int, k: int = 4) -> int:
    """The end whose next k tokens most candidates share (the latest among equals)."""
    conts = {e: tuple(stream[e : min(e + k, end)]) for e in ends}
    votes = Counter(conts.values())
    return max(ends, key=lambda e: (votes[conts[e]], e))


#: Raw prompts whose text repeats a block, so the model goes on repeating it: the short
#: script of tools.cuda.exact_7b, and cases of a table and methods of a class written alike.
REPEAT_PROMPTS = (
    "import os\nimport sys\n\nfor name in os.listdir(sys.argv[1]):\n    print(name)\n" * 3,
    "CASES = [\n" + "".join(f"    ({i}, {i * i}, \"square of {i}\"),\n" for i in range(1, 6)),
    "class Point:\n" + "".join(
        f"    def get_{a}(self):\n        return self.{a}\n\n    def set_{a}(self, value):\n"
        f"        self.{a} = value\n\n" for a in ("x", "y")),
)

#: The index's match cap and the context handed to it, as the generation loop uses them;
#: ``--max-n`` / ``--draft-context`` study other values (replays only).
INDEX_MAX_N = 32
LOOKUP_CONTEXT = DRAFT_CONTEXT


def draft_records(
    prompt: Sequence[int], reply: Sequence[int], max_draft: int
) -> list[tuple[Draft, int]]:
    """Per reply position: the index's draft and how many of its tokens the reply confirms."""
    idx = NgramIndex(max_n=INDEX_MAX_N)
    idx.set_source("prompt", list(prompt))
    idx.set_source("reply", [])
    context = list(prompt)
    out = []
    for i, tok in enumerate(reply):
        idx.extend_source("reply", [tok])
        context.append(tok)
        d = idx.draft(context[-LOOKUP_CONTEXT:], max_draft)
        a = 0
        while a < len(d.tokens) and i + 1 + a < len(reply) and d.tokens[a] == reply[i + 1 + a]:
            a += 1
        out.append((d, a))
    return out


#: How a replay fits k to a graph backend's verify widths (``--widths``): "free" (any k, as on
#: the CPU), "round" (a free choice rounded down to width − 1, as the loop did on CUDA before
#: 2026-12-07), "choose" (the controller weighs the widths alone, as the loop does now).
WIDTH_MODES = ("free", "round", "choose")


def controller_replay(
    pairs, ratios: Sequence[float], max_draft: int, mode: str = "free", overhead: float = 0.0
) -> tuple[float, float]:
    """(controller ratio, oracle ratio) on recorded replies at a context-free cost curve.

    ``mode``: WIDTH_MODES (with "round" the oracle may only verify those widths too).
    ``overhead``: host time every round pays, in one-row forwards (the controller is told
    it, as the loop measures it online); both ratios then count it."""
    ctl = DraftController(VerifyCost.from_ratios(list(ratios[1:])), max_draft=max_draft)
    ctl.overhead_s = overhead  # T(1) is 1.0 in from_ratios' units
    rounds = [r + overhead for r in ratios]
    widths = mode in ("round", "choose")
    if widths:
        rounds = [r if i == 0 or i in GRAPH_WIDTHS else float("inf") for i, r in enumerate(rounds)]
    steps = cost = best = 0.0
    for prompt, reply in pairs:
        recs = draft_records(prompt, reply, max_draft)
        n = len(reply) - 1
        if n <= 0:
            continue
        i = 0
        while i < n:
            d, a = recs[i]
            # the context grows with the reply, as the loop's cache does (the copy streak
            # follows a source only while nothing else was written)
            k = ctl.choose(d, 1024 + i, n - i + 1, pow2=mode == "choose") if d.tokens else 0
            if widths:
                k = width_drafts(k)
            got = min(k, a)
            cost += ratios[k + 1] + overhead
            if k:
                ctl.observe(d.source, d.match_len, k, got)
            i += got + 1
        steps += n * (1.0 + overhead)
        best += oracle_cost([a for _, a in recs], rounds)
    return steps / cost, steps / best


def scale_excess(curve: dict[int, float], scale: float) -> dict[int, float]:
    """The curve with every verify's cost above one row scaled: T'(r)/T'(1) = 1 + s (T(r)/T(1) - 1).

    Why: "how much cheaper would a wide verify have to be for a target ratio?" is a question
    about the controller and the replies as much as about kernels; replaying at scaled curves
    answers it without writing the kernels first (``--excess-scale``)."""
    t1 = curve[1]
    return {r: 1.0 + scale * (t / t1 - 1.0) for r, t in curve.items()}


def parse_curve(text: str) -> dict[int, float]:
    """ "1:1,2:1.05,17:1.47" → {1: 1.0, 2: 1.05, 17: 1.47} (rows: T(rows)/T(1))."""
    out = {}
    for part in text.split(","):
        rows, value = part.split(":")
        out[int(rows)] = float(value)
    if 1 not in out:
        raise ValueError("the curve must give 1 row")
    return out


def _set_lookup(max_n: int, context: int) -> None:
    """The index's match cap and lookup context for the replays (``--max-n``, ``--draft-context``)."""
    global INDEX_MAX_N, LOOKUP_CONTEXT
    INDEX_MAX_N, LOOKUP_CONTEXT = max_n, context


def main() -> None:
    from echoline.engine.api import Engine
    from echoline.engine.bench import traffic
    from echoline.engine.bench.common import row_costs
    from echoline.engine.bench.spec import _prompts

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--traffic", choices=("copy", "edit", "rewrite", "repeat"), default="copy",
                    help="rewrite: the editor's rewrite command (the sidecar's prompts, its stop string); "
                    "repeat: raw prompts that repeat a block (REPEAT_PROMPTS)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--curve", help="rows:T(rows)/T(1),… instead of this machine's curve")
    ap.add_argument("--context", type=int, default=1024, help="context of the measured curve")
    ap.add_argument(
        "--excess-scale",
        default="1",
        help="comma-separated factors for the curve's cost above one row (1 = as measured)",
    )
    ap.add_argument("--max-n", type=int, default=INDEX_MAX_N, help="the index's match cap (replay)")
    ap.add_argument(
        "--draft-context",
        type=int,
        default=DRAFT_CONTEXT,
        help="tokens handed to the lookup (replay)",
    )
    ap.add_argument(
        "--widths", default="free", help=f"comma-separated, from {','.join(WIDTH_MODES)}"
    )
    ap.add_argument(
        "--overhead", default="0", help="comma-separated round overheads, in one-row forwards"
    )
    ap.add_argument(
        "--max-drafts",
        default="16,32,64",
        type=lambda t: [int(x) for x in t.split(",")],
        help="comma-separated",
    )
    args = ap.parse_args()
    _set_lookup(args.max_n, args.draft_context)
    engine = Engine.load(args.model)
    if args.traffic == "rewrite":
        from echoline.sidecar.bench.rewrite_traffic import rewrite_requests

        requests = rewrite_requests(engine, traffic.source_paths([]), args.max_tokens)
    elif args.traffic == "repeat":
        requests = [(engine.encode(p), ()) for p in REPEAT_PROMPTS]
    else:
        requests = [(p, ()) for p in _prompts(engine, args.traffic, traffic.source_paths([]))]
    pairs = [
        (p, engine.generate(p, max_tokens=args.max_tokens, stop=tuple(stop), spec=False).token_ids)
        for p, stop in requests
    ]
    rows = (1, 2, 4, 6, 8, 12, 17, 33, 65)  # up to the longest draft the replay tries
    curve = (
        parse_curve(args.curve)
        if args.curve
        else row_costs(engine, context=args.context, ks=rows, reps=3)
    )
    scales = [float(x) for x in args.excess_scale.split(",")]
    by_scale = {s: interpolated_ratios(scale_excess(curve, s), 65) for s in scales}
    steps = sum(len(r) - 1 for _, r in pairs)
    print(
        f"{engine.model_name}, {args.traffic} traffic, {len(pairs)} replies, "
        f"curve T(rows)/T(1) { ({r: round(t / curve[1], 3) for r, t in sorted(curve.items())}) } "
        f"(one row {curve[1] * 1e3:.2f} ms), "
        f"index max_n {INDEX_MAX_N}, lookup context {LOOKUP_CONTEXT}"
    )
    print(
        f"tie-break rule -> oracle ratio (max draft 16, verify cost above one row x{scales[0]:g})"
    )
    for rule in RULES:
        cost = sum(
            oracle_cost(confirmed_by_rule(p, r, rule), by_scale[scales[0]]) for p, r in pairs
        )
        print(f"  {rule:<12s} {steps / cost:.2f}x", flush=True)
    for scale, ratios in by_scale.items():
        for overhead in [float(x) for x in args.overhead.split(",")]:
            print(
                f"max draft, widths -> controller replay / oracle (verify cost above one row "
                f"x{scale:g}, round overhead {overhead:g} of a one-row forward)"
            )
            for kmax in args.max_drafts:
                for mode in args.widths.split(","):
                    got, best = controller_replay(pairs, ratios, kmax, mode, overhead)
                    print(
                        f"  {kmax:<3d} {mode:<6s} {got:.2f}x / {best:.2f}x ({got / best:.0%})",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
