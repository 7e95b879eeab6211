"""Inline completions while typing: echoline against llama.cpp's ``llama-server``, side by
side, in one run, on the same files and the same prompt ids.

    python -m tools.versus_llamacpp_inline --model qwen2.5-coder-0.5b [--step 4] \
        [--max-tokens 32] [--suffix-tokens N] [--json]

What a keystroke costs in each engine. The typing is ``echoline bench inline``'s: in each
source (``bench spec``'s six modules) a line near three quarters of the way down is removed
and typed back, ``--step`` characters per request. Every request's prompt is the sidecar's
fill-in-the-middle prompt (``sidecar.prompts.inline_prompt``: the head on its grid, the
suffix within ``--suffix-tokens`` tokens, default the server's "auto" for this engine; the
server also keeps a document's head start across cursor jumps, which typing one line never
needs), and the SAME ids go to both engines:

- ``echoline``: ``Engine.generate`` on the buffer's session (its cache reused up to the
  first id that changed), exact speculation as the sidecar runs it;
- ``llama``: ``/completion`` with ``cache_prompt`` on one slot (``-np 1``), which likewise
  keeps the slot's cache up to the first id that changed; greedy, no speculation (its
  default).

Both decode at most ``--max-tokens`` tokens and stop at their end-of-generation ids (the
sidecar's stop at the block's end is left out: it depends on the text, and both would stop
alike). The two engines take turns request by request (who goes first alternates), one
process computing at a time. A source's first request fills both caches from nothing and is
left out of the timing. Reported per engine: requests, median and p90 wall seconds a request
(the client's clock, HTTP included for llama), median prompt tokens run again (echoline's
``prefilled_tokens``, llama's ``timings.prompt_n``), mean tokens generated; and how many
replies are token for token the same in both engines (kernels differ, so greedy picks can
part at near ties).

JSON (``--json``, stdout's last line): ``{"model", "cpu", "cores", "suffix_tokens",
"max_tokens", "step", "sources", "engines": {"echoline"|"llama": {"requests", "median_s",
"p90_s", "median_prompt_run", "mean_generated"}}, "same_replies", "requests", "speedup",
"date"}``, ``speedup`` being llama's median time over echoline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from echoline.engine.api import Engine
from echoline.engine.bench.traffic import source_paths
from echoline.engine.model_catalog import resolve_model
from echoline.engine.setup_check import cpu_model
from echoline.sidecar.bench.inline import content_lines, spread
from echoline.sidecar.prompts import auto_suffix_tokens, heal_prefix, inline_prompt

from tools.llamacpp_peer import LlamaServer, add_peer_arguments, build

ENGINES = ("echoline", "llama")


def typing_requests(text: str, step: int) -> list[tuple[str, str]]:
    """(prefix, suffix) of each request while a line near 3/4 down ``text`` is typed back,
    ``step`` characters a request (``bench inline``'s typing)."""
    lines = content_lines(text, 20)
    if not lines or step <= 0:
        return []
    _, c0, end = spread(lines, 1, 0.75, 0.76)[0]
    before, content, after = text[:c0], text[c0:end], text[end:]
    return [(before + content[:n], after) for n in range(0, len(content) + 1, step)]


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve_model(args.model)
    exe = Path(args.llama_server) if args.llama_server else build()
    engine = Engine.load(args.model, backend=args.backend)
    engine.warm_up()
    budget = args.suffix_tokens if args.suffix_tokens is not None else auto_suffix_tokens(engine)
    sources = source_paths(args.source)
    times: dict[str, list[float]] = {e: [] for e in ENGINES}
    run_again: dict[str, list[int]] = {e: [] for e in ENGINES}
    generated: dict[str, list[int]] = {e: [] for e in ENGINES}
    same = total = 0
    order = list(ENGINES)
    with LlamaServer(path, exe=exe, parallel=1, ctx=args.ctx, extra=args.llama_args.split()) as srv:
        for src in sources:
            text = src.read_text(encoding="utf-8", errors="replace")
            session = f"inline:file:///{src.name}"
            for k, (prefix, suffix) in enumerate(typing_requests(text, args.step)):
                healed, _ = heal_prefix(prefix)
                ids = inline_prompt(engine, healed, suffix, suffix_tokens=budget).ids
                if len(ids) + args.max_tokens > args.ctx:
                    raise SystemExit(f"a prompt of {len(ids)} ids and {args.max_tokens} more exceed "
                                     f"llama-server's context {args.ctx}: raise --ctx")
                replies: dict[str, list[int]] = {}
                order.reverse()
                for name in order:
                    t0 = time.perf_counter()
                    if name == "echoline":
                        res = engine.generate(ids, max_tokens=args.max_tokens, spec=True, session=session)
                        dt = time.perf_counter() - t0
                        replies[name], ran = list(res.token_ids), res.stats.prefilled_tokens
                    else:
                        out = srv.greedy(ids, args.max_tokens, cache_prompt=True, id_slot=0)
                        dt = time.perf_counter() - t0
                        replies[name], ran = out["ids"], int(out["timings"]["prompt_n"])
                    if k:  # a source's first request fills both caches from nothing
                        times[name].append(dt)
                        run_again[name].append(ran)
                        generated[name].append(len(replies[name]))
                if k:
                    total += 1
                    same += int(replies["echoline"] == replies["llama"])
                if args.verbose:
                    print(f"  {src.name} #{k}: prompt {len(ids)} ids; " + ", ".join(
                        f"{e} {times[e][-1] if k else float('nan'):.2f} s ran {run_again[e][-1] if k else '-'}"
                        for e in ENGINES), file=sys.stderr, flush=True)
            print(f"  {src.name}: {total} requests timed so far", file=sys.stderr, flush=True)
    engines = {
        e: {
            "requests": len(times[e]),
            "median_s": round(statistics.median(times[e]), 3) if times[e] else None,
            "p90_s": round(_p90(times[e]), 3) if times[e] else None,
            "median_prompt_run": statistics.median(run_again[e]) if run_again[e] else None,
            "mean_generated": round(statistics.fmean(generated[e]), 1) if generated[e] else None,
        }
        for e in ENGINES
    }
    med = {e: engines[e]["median_s"] for e in ENGINES}
    out = {
        "model": args.model, "cpu": cpu_model(), "cores": os.cpu_count(), "backend": engine.backend_variant,
        "suffix_tokens": budget, "max_tokens": args.max_tokens, "step": args.step,
        "sources": [p.name for p in sources], "engines": engines, "same_replies": same, "requests": total,
        "speedup": round(med["llama"] / med["echoline"], 2) if med["llama"] and med["echoline"] else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    _table(out)
    return out


def _table(r: dict[str, Any]) -> None:
    print(f"\n{r['model']} on {r['cpu']} ({r['cores']} cores): inline completions while typing, "
          f"a request every {r['step']} characters, suffix budget {r['suffix_tokens']} tokens, "
          f"at most {r['max_tokens']} tokens a reply", file=sys.stderr)
    print(f"{'engine':<9} {'requests':>8} {'median s':>9} {'p90 s':>7} {'prompt run':>11} {'generated':>10}",
          file=sys.stderr)
    for name, e in r["engines"].items():
        print(f"{name:<9} {e['requests']:>8} {e['median_s']!s:>9} {e['p90_s']!s:>7} "
              f"{e['median_prompt_run']!s:>11} {e['mean_generated']!s:>10}", file=sys.stderr)
    print(f"llama / echoline median time: {r['speedup']}; same reply in {r['same_replies']} of "
          f"{r['requests']} requests", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--source", action="append", default=[], help="a source to type in (repeatable)")
    ap.add_argument("--step", type=int, default=4, help="characters typed between requests")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--suffix-tokens", type=int, default=None,
                    help="tokens after the cursor (whole lines); default: the server's auto budget")
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server's context (-c)")
    ap.add_argument("--json", action="store_true")
    add_peer_arguments(ap)
    ap.add_argument("--verbose", action="store_true", help="a line per request")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
