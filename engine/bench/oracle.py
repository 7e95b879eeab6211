"""The best any draft-length controller could do on a given reply: the oracle bound.

Why: a speculation ratio below target can be the controller's fault (it drafted too
little or too much) or the traffic's (the model wrote text that no lookup predicts). The
oracle separates the two. It replays the reply through a fresh n-gram index exactly as
the generation loop sees it, finds at each position how many of the offered draft tokens
the reply confirms, and picks the draft lengths that minimise total verify cost with that
knowledge (dynamic programming over positions). Its ratio is an upper bound for this
drafter at this cost curve; the gap to the measured ratio is what the controller leaves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from echoline.engine.drafting.ngram_index import NgramIndex
from echoline.engine.generate import DRAFT_CONTEXT


def confirmed_draft_lengths(
    prompt: Sequence[int], reply: Sequence[int], max_draft: int, extra: Sequence[Sequence[int]] = ()
) -> list[int]:
    """For each reply position i: how many draft tokens after reply[:i+1] equal reply[i+1:].

    ``extra``: further sources the request could draft from (e.g. a kept earlier reply)."""
    idx = NgramIndex()
    for i, toks in enumerate(extra):
        idx.set_source(f"extra:{i}", list(toks))
    idx.set_source("prompt", list(prompt))
    idx.set_source("reply", [])
    context = list(prompt)
    out = []
    n = len(reply)
    for i, tok in enumerate(reply):
        idx.extend_source("reply", [tok])
        context.append(tok)
        draft = idx.draft(context[-DRAFT_CONTEXT:], max_draft)
        a = 0
        while a < len(draft.tokens) and i + 1 + a < n and draft.tokens[a] == reply[i + 1 + a]:
            a += 1
        out.append(a)
    return out


def oracle_cost(confirmed: Sequence[int], ratios: Sequence[float]) -> float:
    """Least total cost (in one-row forwards) to produce the reply after its first token.

    ``ratios[r]`` is T(r rows)/T(1) for r = 1 … max_draft + 1. A round at position i
    verifies k ≤ confirmed[i] drafts for ratios[k+1] and advances k + 1 tokens (the
    reply's first token comes from the prefill, as in the generation loop).
    """
    n = len(confirmed) - 1  # tokens still to produce after the first
    if n <= 0:
        return 0.0
    kmax = len(ratios) - 2
    best = [float("inf")] * (n + 1)
    best[0] = 0.0
    for i in range(n):
        here = best[i]
        if here == float("inf"):
            continue
        for k in range(min(confirmed[i], kmax) + 1):
            j = min(n, i + k + 1)
            c = here + ratios[k + 1]
            if c < best[j]:
                best[j] = c
    return best[n]


def interpolated_ratios(measured: dict[int, float], max_rows: int) -> list[float]:
    """[0, 1, T(2)/T(1), …, T(max_rows)/T(1)]: linear between measured row counts, and
    extended past the last one along its final segment. ``measured`` must hold 1 row."""
    ks = sorted(measured)
    ys = [measured[k] / measured[1] for k in ks]
    out = [0.0]
    for r in range(1, max_rows + 1):
        if r >= ks[-1]:
            slope = (ys[-1] - ys[-2]) / (ks[-1] - ks[-2]) if len(ks) > 1 else 0.0
            out.append(ys[-1] + slope * (r - ks[-1]))
        else:
            out.append(float(np.interp(r, ks, ys)))
    return out


def oracle_ratio(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    ratios: Sequence[float],
    max_draft: int,
    extras: Sequence[Sequence[Sequence[int]]] | None = None,
) -> float:
    """Plain steps / oracle cost over (prompt, reply) pairs: the best speculative speedup.

    ``extras[i]``: the extra draft sources pair i's request had (none by default)."""
    steps = cost = 0.0
    for i, (prompt, reply) in enumerate(pairs):
        if len(reply) < 2:
            continue
        steps += len(reply) - 1
        extra = extras[i] if extras is not None else ()
        cost += oracle_cost(confirmed_draft_lengths(prompt, reply, max_draft, extra), ratios)
    return steps / cost if cost > 0 else 1.0
