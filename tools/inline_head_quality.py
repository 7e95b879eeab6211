"""Single-line infill quality by the inline prompt's head length, the tail the same.

Why: at a new place in a big file the server first asks with a short head
(``sidecar.inline.choose_head``), ~4x cheaper to run than the long one. How short it can
be without losing quality is measured here: lines deep in stdlib modules (past the first
9,000 characters, so the heads differ) are held out one at a time, the cursor after their
indentation, and each head length completes them with the same prompt tail
(``auto_suffix_tokens``); the completion's first line is compared with the held-out line
(exact, and ``difflib`` similarity). Plain greedy replies, throwaway caches.

    python -m tools.inline_head_quality [--model qwen2.5-coder-0.5b] [--per-module 8] [--json]
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import random
import statistics
import sys
from typing import Any

MODULES = ("difflib", "argparse", "textwrap", "configparser", "shlex", "tarfile")
#: head name -> (least characters, grid): the long head's, and two shorter ones
HEADS = {"long": (6000, 2048), "1536": (1536, 512), "768": (768, 512)}


def held_out_lines(text: str, n: int, rng: random.Random) -> list[tuple[int, str]]:
    """``n`` (cursor offset after the indentation, the line's content) of code lines past
    the first 9,000 characters (not comments or string lines, at least 12 characters)."""
    found, off = [], 0
    for line in text.split("\n"):
        s = line.strip()
        if off > 9000 and len(s) >= 12 and not s.startswith(("#", '"', "'")):
            found.append((off + len(line) - len(line.lstrip()), s))
        off += len(line) + 1
    return rng.sample(found, min(n, len(found)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--per-module", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from echoline.engine.api import Engine
    from echoline.sidecar.prompts import auto_suffix_tokens, heal_prefix, inline_prompt

    engine = Engine.load(args.model)
    budget = auto_suffix_tokens(engine)
    rng = random.Random(args.seed)
    sims: dict[str, list[float]] = {k: [] for k in HEADS}
    exact = dict.fromkeys(HEADS, 0)
    for name in MODULES:
        text = open(importlib.import_module(name).__file__ or "", encoding="utf-8").read()
        for cursor, content in held_out_lines(text, args.per_module, rng):
            healed, _ = heal_prefix(text[:cursor])
            suffix = text[cursor + len(content) :]
            for head, (chars, grid) in HEADS.items():
                prompt = inline_prompt(engine, healed, suffix, suffix_tokens=budget, anchor=grid, head_chars=chars)
                guess = engine.generate(prompt.ids, max_tokens=40, stop=["\n"]).text.split("\n", 1)[0].strip()
                sims[head].append(difflib.SequenceMatcher(None, guess, content).ratio())
                exact[head] += guess == content
            print(f"  {name}@{cursor}: " + " ".join(f"{h} {sims[h][-1]:.2f}" for h in HEADS), file=sys.stderr)
    out: dict[str, Any] = {"model": args.model, "suffix_tokens": budget, "positions": len(sims["long"]),
                           "heads": {h: {"chars": HEADS[h][0], "exact": exact[h],
                                         "similarity": round(statistics.fmean(sims[h]), 3)} for h in HEADS}}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for h, r in out["heads"].items():
            print(f"{h:>5}: {r['exact']}/{out['positions']} exact, similarity {r['similarity']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
