"""``echoline bench inline``: inline completions while the user types: time, prefill, quality.

Why it exists: an inline completion is asked for at every pause in typing, and each
request runs again every prompt token after the first one that changed. In
prefix-suffix-middle order that is the text typed since the last request *and the whole
suffix*, so the suffix's length is paid per keystroke; a head window that slides with the
cursor loses the whole cached prompt whenever its start passes a line break. This measures
both prompt layouts on the same requests, through the sidecar's own inline job
(``sidecar.inline.inline_job``: prompt, exact speculation, block end), interleaved, each
layout on a session of its own:

* ``before``: the head window sliding with the cursor, the suffix cut at 2,000 characters
  (the layout until 2026-12-05);
* ``now``: the head's start on a 2,048-character grid, the suffix in whole lines within
  ``--suffix-tokens`` (default: the server's "auto", what the engine prefills within 1.25 s).

Typing: in each source a line near three quarters of the way down is removed and typed
back from its first non-blank character, ``--step`` characters per request (the first
request on a cold session is left out of the timing: both layouts pay the whole prompt).
Quality: single-line infilling at ``--positions`` lines per source (the cursor after the
line's indentation, the line's content removed, the suffix from its end): a hit when the
completion's first line is the removed content, and the mean similarity of the two
(``difflib`` ratio, 0-1: a near miss counts for something). Sources default to ``bench spec``'s six
modules, whole files.

A table on stderr; with ``--json`` one object on stdout's last line: ``{"model", "backend",
"suffix_tokens", "sources", "layouts": {"before"|"now": {"typing": {"requests",
"median_s", "p90_s", "median_prefilled", "mean_prefilled"}, "quality": {"positions",
"exact", "rate", "similarity"}}}, "speedup"}``, ``speedup`` being before's median time over now's.
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import sys
import threading
import time
from typing import Any

from echoline.sidecar.inline import InlineOutcome, inline_job
from echoline.sidecar.prompts import INLINE_ANCHOR_CHARS, auto_suffix_tokens

#: layout name -> (anchor grid, use the token budget)
LAYOUTS = {"before": (0, False), "now": (INLINE_ANCHOR_CHARS, True)}
MAX_TOKENS = 64  # the server's inlineMaxTokens default


def content_lines(text: str, min_chars: int = 12) -> list[tuple[int, int, int]]:
    """(line start, content start, line end) of the lines whose content (indentation
    stripped) has at least ``min_chars`` characters; offsets into ``text``."""
    out, start = [], 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        content = body.lstrip(" \t")
        if len(content.strip()) >= min_chars:
            out.append((start, start + len(body) - len(content), start + len(body)))
        start += len(line)
    return out


def spread(items: list[Any], n: int, lo: float = 0.3, hi: float = 0.95) -> list[Any]:
    """``n`` items evenly spread over the [lo, hi) share of ``items`` (in order)."""
    a, b = int(len(items) * lo), max(int(len(items) * lo) + 1, int(len(items) * hi))
    pool = items[a:b]
    if n >= len(pool):
        return pool
    return [pool[int(i * len(pool) / n)] for i in range(n)]


def first_line(completion: str | None) -> str:
    """The completion's first line, stripped: what a single-line infill is judged on."""
    return (completion or "").split("\n", 1)[0].strip()


def _complete(engine: Any, layout: str, name: str, prefix: str, suffix: str, budget: int | None,
              spec: bool) -> tuple[InlineOutcome, float]:
    anchor, use_budget = LAYOUTS[layout]
    cursor_line = prefix.rsplit("\n", 1)[-1]
    job = inline_job(prefix, suffix, cursor_line, f"file:///{layout}/{name}", MAX_TOKENS, spec,
                     budget if use_budget else None, auto_suffix=False, anchor=anchor)
    t0 = time.perf_counter()
    out = job(engine, threading.Event())
    return out, time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from echoline.engine.api import Engine
    from echoline.engine.bench.traffic import source_paths

    engine = Engine.load(args.model, backend=args.backend)
    engine.warm_up()
    budget = args.suffix_tokens if args.suffix_tokens is not None else auto_suffix_tokens(engine)
    paths = source_paths(args.source)
    spec = not args.no_spec
    times: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    prefilled: dict[str, list[int]] = {k: [] for k in LAYOUTS}
    hits: dict[str, int] = dict.fromkeys(LAYOUTS, 0)
    similar: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    positions = 0
    order = list(LAYOUTS)
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = content_lines(text, 20)  # the typed line: one of at least 20 characters
        _, c0, end = spread(lines, 1, 0.75, 0.76)[0] if lines else (0, 0, 0)
        before, content, after = text[:c0], text[c0:end], text[end:]
        for k, n in enumerate(range(0, len(content) + 1, args.step) if args.step > 0 and lines else ()):
            order.reverse()  # who goes first alternates: earlier replies are draft sources
            for layout in order:
                out, dt = _complete(engine, layout, path.name, before + content[:n], after, budget, spec)
                if k:  # the first request of a session prefills everything in both layouts
                    times[layout].append(dt)
                    prefilled[layout].append(int(out.stats.get("prefilled_tokens", 0)))
        for _, c0, end in spread(content_lines(text), args.positions):
            positions += 1
            order.reverse()
            for layout in order:
                out, _ = _complete(engine, layout, path.name, text[:c0], text[end:], budget, spec)
                got, want = first_line(out.text), text[c0:end].strip()
                hits[layout] += int(got == want)
                similar[layout].append(difflib.SequenceMatcher(None, got, want).ratio())
        print(f"  {path.name}: typed {len(content)} characters, {positions} positions so far",
              file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "model": engine.model_name, "backend": engine.backend_name, "suffix_tokens": budget,
        "sources": [p.name for p in paths], "step": args.step, "speculation": spec, "layouts": {},
    }
    for layout in LAYOUTS:
        ts, ps = times[layout], prefilled[layout]
        result["layouts"][layout] = {
            "typing": {
                "requests": len(ts),
                "median_s": round(statistics.median(ts), 3) if ts else None,
                "p90_s": round(sorted(ts)[int(0.9 * (len(ts) - 1))], 3) if ts else None,
                "median_prefilled": statistics.median(ps) if ps else None,
                "mean_prefilled": round(statistics.fmean(ps), 1) if ps else None,
            },
            "quality": {"positions": positions, "exact": hits[layout],
                        "rate": round(hits[layout] / positions, 3) if positions else None,
                        "similarity": round(statistics.fmean(similar[layout]), 3) if positions else None},
        }
    med = {k: result["layouts"][k]["typing"]["median_s"] for k in LAYOUTS}
    result["speedup"] = round(med["before"] / med["now"], 2) if med["before"] and med["now"] else None
    _table(result)
    return result


def _table(r: dict[str, Any]) -> None:
    print(f"\n{r['model']} ({r['backend']}), suffix budget {r['suffix_tokens']} tokens, "
          f"a request every {r['step']} characters typed", file=sys.stderr)
    print(f"{'layout':<8} {'requests':>8} {'median s':>9} {'p90 s':>7} {'prefilled':>10} {'exact':>14} "
          f"{'similarity':>10}", file=sys.stderr)
    for name, lay in r["layouts"].items():
        t, q = lay["typing"], lay["quality"]
        print(f"{name:<8} {t['requests']:>8} {t['median_s']!s:>9} {t['p90_s']!s:>7} "
              f"{t['median_prefilled']!s:>10} {q['exact']:>5}/{q['positions']:<3} ({q['rate']}) "
              f"{q['similarity']!s:>10}", file=sys.stderr)
    print(f"speedup (median time, before / now): {r['speedup']}", file=sys.stderr)
