"""The draft-length controller on a long copy whose every draft is accepted (no model).

Run: ``python -m tools.engine.long_copy_replay [--curve 1:1,2:1.24,...] [--match 16]
[--tokens 128] [--requests 6] [--one-row-ms 4.0] [--overhead-ms 0.8]``.

What it answers: how many rounds, and how many tokens a second, the controller gives a reply
that re-copies a remembered passage (the warm edit of ``tools.versus_llamacpp``: the index
finds the earlier reply, and every draft is accepted) at a backend's cost curve, with the
copy streak on and off (``ECHOLINE_DRAFT_STREAK``) and with k cut to a graph width after a
free choice ("round", the loop before 2026-12-07) or chosen among the widths ("choose").
The default curve is the 7B-shaped Q4_K_M file's on an H100 (``bash tools/cuda/int8_run.sh
mtv`` with the head on the tensor cores: 16 rows 1.71×, 32 rows 2.72×, 64 rows 5.29× one
row). ``--match``: the match length the index reports each round (real lookups in the warm
edit report less than its cap of 32). A round costs T(k + 1) + the overhead; each request
starts a new reply on the same controller, so later requests show what it has learned.
"""

from __future__ import annotations

import argparse

import numpy as np
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.drafting.ngram_index import Draft
from echoline.engine.generate import width_drafts

#: rows: T(rows) / T(1), the 7B-shaped Q4_K_M file on an H100, 2026-12-07
H100_7B = "1:1,2:1.24,4:1.29,8:1.34,16:1.71,32:2.72,64:5.29"


def replay(curve: dict[int, float], match: int, tokens: int, requests: int, one_row_ms: float,
           overhead_ms: float, streak: bool, mode: str) -> list[tuple[list[int], float]]:  # fmt: skip
    """Each request's draft counts and its tokens a second."""
    rows = sorted(curve)
    ratio = [float(np.interp(r, rows, [curve[x] for x in rows])) for r in range(1, 65)]
    ctl = DraftController(VerifyCost(list(range(1, 65)), [0], [[one_row_ms / 1000 * r] for r in ratio]), max_draft=63)
    ctl.streak = streak  # what ECHOLINE_DRAFT_STREAK sets
    ctl.overhead_s = overhead_ms / 1000
    out = []
    for _ in range(requests):
        done, ctx, pos, ks, ms = 0, 500, 0, [], 0.0
        while done < tokens:
            d = Draft(list(range(63)), "history", match, pos)
            k = width_drafts(ctl.choose(d, ctx, tokens - done, pow2=mode == "choose"))
            if k:
                ctl.observe(d.source, d.match_len, k, k)
            ks.append(k)
            ms += one_row_ms * ratio[k] + overhead_ms
            done, ctx, pos = done + k + 1, ctx + k + 1, pos + k + 1
        out.append((ks, tokens / ms * 1000))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curve", default=H100_7B, help="rows:T(rows)/T(1), comma-separated")
    ap.add_argument("--match", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--one-row-ms", type=float, default=4.0)
    ap.add_argument("--overhead-ms", type=float, default=0.8)
    args = ap.parse_args()
    curve = {int(a): float(b) for a, b in (p.split(":") for p in args.curve.split(","))}
    print(f"curve {curve}, match {args.match}, {args.tokens} tokens a request, every draft accepted")
    print(f"{'streak':<7} {'widths':<7} {'first request':<40} {'tok/s':>6} | {'last request':<28} {'tok/s':>6}")
    for streak in (False, True):
        for mode in ("round", "choose"):
            runs = replay(curve, args.match, args.tokens, args.requests, args.one_row_ms, args.overhead_ms,
                          streak, mode)  # fmt: skip
            (k0, s0), (k1, s1) = runs[0], runs[-1]
            print(f"{'on' if streak else 'off':<7} {mode:<7} {str(k0):<40} {s0:6.0f} | {str(k1):<28} {s1:6.0f}")


if __name__ == "__main__":
    main()
