"""``echoline bench inline``: inline completions while the user types: time, prefill, quality.

Why it exists: an inline completion is asked for at every pause in typing, and each
request runs again every prompt token after the first one that changed. In
prefix-suffix-middle order that is the text typed since the last request *and the whole
suffix*, so the suffix's length is paid per keystroke; a head window that slides with the
cursor loses the whole cached prompt whenever its start passes a line break. This measures
both prompt layouts on the same requests, through the sidecar's own inline job
(``sidecar.inline.inline_job``: prompt, exact speculation, block end), interleaved, each
layout on an engine of its own (an engine lends cached prefixes between its sessions):

* ``before``: the head window sliding with the cursor, the suffix cut at 2,000 characters
  (the layout until 2026-12-05);
* ``grid``: the head's start on a 2,048-character grid, the suffix in whole lines within
  ``--suffix-tokens`` (default: the server's "auto", what the engine prefills within 1.25 s)
  (the layout of 2026-12-05);
* ``now``: the same, and the buffer's previous head start kept where it still fits
  (``sidecar.prompts.inline_head_start``'s ``keep``), as the server runs it;
* ``warm``: ``now``, and before each navigation request the inline warm-up the server
  runs once the cursor rests there (``sidecar.inline.warm_job``, as ``echoline/cursor``
  triggers it): the request then finds its prompt cached. The warm-up's own time (work
  done in the background while the user reads) is reported apart, as ``warm_up``.

``--layouts`` picks which (default ``before,now``).

Typing: in each source a line near three quarters of the way down is removed and typed
back from its first non-blank character, ``--step`` characters per request (the first
request on a cold session is left out of the timing: both layouts pay the whole prompt).
Quality: single-line infilling at ``--positions`` lines per source (the cursor after the
line's indentation, the line's content removed, the suffix from its end): a hit when the
completion's first line is the removed content, and the mean similarity of the two
(``difflib`` ratio, 0-1: a near miss counts for something). Sources default to ``bench spec``'s six
modules, whole files. Navigation (``--jumps N``): in each source the cursor jumps N times
by 5 to 60 lines up or down (seeded, the same jumps for every layout) to the end of a line
of code and asks there, the text unchanged: what reading and then typing elsewhere costs
(the first of them is left out: with ``--step 0`` it is the source's first request, which
runs the whole prompt in every layout; after typing it is a jump from the typed line). A
jump stopped at the top or bottom of a file may land where the last one did: cheap in every
layout, it counts all the same. With ``--first-key`` each jump's request is the first
keystroke there instead: Enter and the line's indentation typed at the cursor (the text
goes back before the next jump), the ``warm`` layout's warm-up run at the cursor before
the keystroke, as the server runs it while the user reads.

``--typing``: instead, a plain LSP client types into a real-size file through the real
server, a request per keystroke (``sidecar/bench/inline_typing.py``); the object then holds
``model``, ``backend``, ``suffix_tokens``, ``sources``, ``speculation`` and ``typing_lsp``.

A table on stderr; with ``--json`` one object on stdout's last line: ``{"model", "backend",
"suffix_tokens", "sources", "step", "speculation", "jumps", "first_key", "layouts": {"before"|"grid"|"now":
{"typing": {"requests", "median_s", "mean_s", "p90_s", "median_prefilled", "mean_prefilled"},
"quality": {"positions", "exact", "rate", "similarity"}, "navigation": {the keys of
"typing"}, "warm_up": {the same keys, ``warm`` only: the background warm-ups}}}, "speedup",
"navigation_speedup"}``: ``speedup`` is before's median typing time
over now's (None unless both ran), ``navigation_speedup`` each other layout's mean
navigation time over now's (``{}`` without ``--jumps`` or ``now``).
"""

from __future__ import annotations

import argparse
import difflib
import random
import statistics
import sys
import threading
import time
from typing import Any

from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.inline import HeadStarts, InlineOutcome, inline_job, warm_job
from echoline.sidecar.prompts import INLINE_ANCHOR_CHARS, auto_suffix_tokens

#: layout name -> (anchor grid, use the token budget, keep the previous head start)
LAYOUTS = {"before": (0, False, False), "grid": (INLINE_ANCHOR_CHARS, True, False),
           "now": (INLINE_ANCHOR_CHARS, True, True), "warm": (INLINE_ANCHOR_CHARS, True, True)}  # fmt: skip
WARMED = frozenset({"warm"})  # layouts whose navigation requests follow a warm-up at the cursor
DEFAULT_LAYOUTS = ("before", "now")
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


def jumps(text: str, n: int) -> list[int]:
    """Cursor offsets of ``n + 1`` requests while reading ``text``: the end of a line of code
    near the middle, then ``n`` jumps of 5 to 60 such lines up or down (seeded by the text,
    so every layout gets the same)."""
    lines = content_lines(text)
    if not lines or n <= 0:
        return []
    rng = random.Random(len(text))
    i, out = len(lines) // 2, []
    for _ in range(n + 1):
        out.append(lines[i][2])
        i = min(len(lines) - 1, max(0, i + rng.choice((-1, 1)) * rng.randint(5, 60)))
    return out


def _uri(layout: str, name: str) -> str:
    """The document (and engine session) of ``layout``'s requests on source ``name``."""
    return f"file:///{layout}/{name}"


def _complete(engine: EngineLike, layout: str, name: str, prefix: str, suffix: str, budget: int | None,
              spec: bool, keeps: HeadStarts) -> tuple[InlineOutcome, float]:
    """One request of ``layout`` on its own session; ``keeps``: the kept head starts (the
    server's ``inline_head_starts``), for the layouts that keep them."""
    anchor, use_budget, keep = LAYOUTS[layout]
    cursor_line = prefix.rsplit("\n", 1)[-1]
    uri = _uri(layout, name)
    # the layouts compare the long head's rules; the short head a new place is first asked
    # with (sidecar.inline.choose_head) is measured through the server (--typing)
    job = inline_job(prefix, suffix, cursor_line, uri, MAX_TOKENS, spec, budget if use_budget else None,
                     auto_suffix=False, anchor=anchor, starts=keeps if keep else None, short_head=False)
    t0 = time.perf_counter()
    out = job(engine, threading.Event())
    return out, time.perf_counter() - t0


def _warm_up(engine: EngineLike, layout: str, name: str, prefix: str, suffix: str, budget: int | None,
             keeps: HeadStarts) -> float:
    """The server's warm-up at a resting cursor for ``layout``'s document; its seconds."""
    anchor, use_budget, keep = LAYOUTS[layout]
    job = warm_job(prefix, suffix, _uri(layout, name), MAX_TOKENS, budget if use_budget else None,
                   auto_suffix=False, anchor=anchor, starts=keeps if keep else None, short_head=False)
    t0 = time.perf_counter()
    job(engine, threading.Event(), None)
    return time.perf_counter() - t0


def _timing(ts: list[float], ps: list[int]) -> dict[str, Any]:
    return {
        "requests": len(ts),
        "median_s": round(statistics.median(ts), 3) if ts else None,
        "mean_s": round(statistics.fmean(ts), 3) if ts else None,
        "p90_s": round(sorted(ts)[int(0.9 * (len(ts) - 1))], 3) if ts else None,
        "median_prefilled": statistics.median(ps) if ps else None,
        "mean_prefilled": round(statistics.fmean(ps), 1) if ps else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "typing", False):  # a plain LSP client typing (sidecar/bench/inline_typing.py)
        from echoline.sidecar.bench.inline_typing import run_typing

        typing = run_typing(args)
        return {"model": args.model, "backend": args.backend, "suffix_tokens": args.suffix_tokens,
                "sources": [typing["source"]], "speculation": not args.no_spec, "typing_lsp": typing}
    from echoline.engine.api import Engine
    from echoline.engine.bench.traffic import source_paths

    layouts = list(getattr(args, "layouts", None) or DEFAULT_LAYOUTS)
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        raise SystemExit(f"unknown layout {', '.join(unknown)}: choose from {', '.join(LAYOUTS)}")
    n_jumps = getattr(args, "jumps", 0) or 0
    first_key = bool(getattr(args, "first_key", False))
    # An engine per layout: an engine lends a session's cached prefix to another session
    # whose prompt starts the same (engine.sessions, "donor"), so layouts that build the
    # same prompts (now, warm) would otherwise be measured on each other's work.
    engines = {layout: Engine.load(args.model, backend=args.backend) for layout in layouts}
    for e in engines.values():
        e.warm_up()
    engine = engines[layouts[0]]
    budget = args.suffix_tokens if args.suffix_tokens is not None else auto_suffix_tokens(engine)
    paths = source_paths(args.source)
    spec = not args.no_spec
    scenes = ("typing", "navigation")
    times = {s: {k: [] for k in layouts} for s in scenes}
    warm_s: dict[str, list[float]] = {k: [] for k in layouts if k in WARMED}
    prefilled = {s: {k: [] for k in layouts} for s in scenes}
    hits: dict[str, int] = dict.fromkeys(layouts, 0)
    similar: dict[str, list[float]] = {k: [] for k in layouts}
    keeps = HeadStarts()
    for layout in layouts:  # a document per (layout, source), open for the whole run
        for path in paths:
            keeps.opened(_uri(layout, path.name))
    positions = 0
    order = list(layouts)

    def ask(scene: str, k: int, prefix: str, suffix: str, name: str, typed: str = "") -> None:
        """Requests of every layout at ``prefix + typed``; in the navigation scene the warm
        layouts' warm-up runs first at ``prefix`` (before the keystroke ``typed``)."""
        order.reverse()  # who goes first alternates: earlier replies are draft sources
        for layout in order:
            if scene == "navigation" and layout in WARMED:
                ws = _warm_up(engines[layout], layout, name, prefix, suffix, budget, keeps)
                if k:
                    warm_s[layout].append(ws)
            out, dt = _complete(engines[layout], layout, name, prefix + typed, suffix, budget, spec, keeps)
            if k:  # the first request of a session prefills everything in every layout
                times[scene][layout].append(dt)
                prefilled[scene][layout].append(int(out.stats.get("prefilled_tokens", 0)))

    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = content_lines(text, 20)  # the typed line: one of at least 20 characters
        _, c0, end = spread(lines, 1, 0.75, 0.76)[0] if lines else (0, 0, 0)
        before, content, after = text[:c0], text[c0:end], text[end:]
        for k, n in enumerate(range(0, len(content) + 1, args.step) if args.step > 0 and lines else ()):
            ask("typing", k, before + content[:n], after, path.name)
        for k, cursor in enumerate(jumps(text, n_jumps)):
            line = text[text.rfind("\n", 0, cursor) + 1 : cursor]
            typed = "\n" + line[: len(line) - len(line.lstrip(" \t"))] if first_key else ""
            ask("navigation", k, text[:cursor], text[cursor:], path.name, typed)
        for _, c0, end in spread(content_lines(text), args.positions):
            positions += 1
            order.reverse()
            for layout in order:
                out, _ = _complete(engines[layout], layout, path.name, text[:c0], text[end:], budget, spec, keeps)
                got, want = first_line(out.text), text[c0:end].strip()
                hits[layout] += int(got == want)
                similar[layout].append(difflib.SequenceMatcher(None, got, want).ratio())
        print(f"  {path.name}: typed {len(content)} characters, {positions} positions so far",
              file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "model": engine.model_name, "backend": engine.backend_name, "suffix_tokens": budget,
        "sources": [p.name for p in paths], "step": args.step, "speculation": spec, "jumps": n_jumps,
        "first_key": first_key,
        "layouts": {},
    }
    for layout in layouts:
        result["layouts"][layout] = {
            "typing": _timing(times["typing"][layout], prefilled["typing"][layout]),
            "quality": {"positions": positions, "exact": hits[layout],
                        "rate": round(hits[layout] / positions, 3) if positions else None,
                        "similarity": round(statistics.fmean(similar[layout]), 3) if positions else None},
        }
        if n_jumps > 0:
            result["layouts"][layout]["navigation"] = _timing(times["navigation"][layout],
                                                              prefilled["navigation"][layout])
            if layout in WARMED:
                result["layouts"][layout]["warm_up"] = _timing(warm_s[layout], [])
    lay = result["layouts"]
    med = {k: v["typing"]["median_s"] for k, v in lay.items()}
    result["speedup"] = round(med["before"] / med["now"], 2) if med.get("before") and med.get("now") else None
    # jumps cost little or a whole prompt: the mean, not the median, is what they cost
    nav = {k: v["navigation"]["mean_s"] for k, v in lay.items() if "navigation" in v}
    result["navigation_speedup"] = (
        {k: round(t / nav["now"], 2) for k, t in nav.items() if k != "now" and t} if nav.get("now") else {}
    )
    _table(result)
    return result


def _table(r: dict[str, Any]) -> None:
    print(f"\n{r['model']} ({r['backend']}), suffix budget {r['suffix_tokens']} tokens, "
          f"a request every {r['step']} characters typed, {r['jumps']} jumps a source"
          f"{' (each request the first keystroke there)' if r.get('first_key') else ''}", file=sys.stderr)
    print(f"{'layout':<8} {'scene':<10} {'requests':>8} {'median s':>9} {'mean s':>7} {'p90 s':>7} "
          f"{'prefilled':>10} {'exact':>14} {'similarity':>10}", file=sys.stderr)
    for name, lay in r["layouts"].items():
        q = lay["quality"]
        for scene in ("typing", "navigation", "warm_up"):
            t = lay.get(scene)
            if t is None or (scene == "typing" and not t["requests"] and not q["positions"]):
                continue
            quality = (f"{q['exact']:>5}/{q['positions']:<3} ({q['rate']}) {q['similarity']!s:>10}"
                       if scene == "typing" else "")
            print(f"{name:<8} {scene:<10} {t['requests']:>8} {t['median_s']!s:>9} {t['mean_s']!s:>7} "
                  f"{t['p90_s']!s:>7} {t['median_prefilled']!s:>10} {quality}", file=sys.stderr)
    print(f"speedup (median typing time, before / now): {r['speedup']}; navigation (mean time), against now: "
          f"{r['navigation_speedup']}", file=sys.stderr)
