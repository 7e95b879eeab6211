"""echoline against llama.cpp's ``llama-server``, side by side, in one run, same file and prompt.

    python -m tools.versus_llamacpp --model qwen2.5-coder-0.5b [--traffic copy,edit,rewrite,next-edit] \
        [--max-tokens 128] [--rounds 3] [--next-edit-cases N] [--json]

Both engines get the SAME prompt token ids (echoline renders the chat template; the ids go
to ``/completion``), greedy, ``cache_prompt: false``. Traffic: ``copy`` and ``edit`` ask in
chat form for the held-out excerpt, copied or edited; ``rewrite`` is the editor's rewrite
command on the same source (``bench spec --traffic rewrite``'s first request: the sidecar's
prompt, a function selected, the reply primed with a code fence); ``next-edit`` is the
edit-prediction model path: one prompt per case of the tune split, each the prompt
``echoline bench next-edit`` sends for it (``sidecar.next_edit``, default format, default
region), the first ``--next-edit-cases`` of them (0: all). No arm stops early (no stop
string, no next-edit stop rule): both engines decode ``--max-tokens`` tokens, or up to the
end-of-generation token both engines stop at (``<|file_sep|>`` ends a next-edit reply).
Six arms per traffic, interleaved round by round (the order rotates, per prompt too),
medians reported; with several prompts, each arm's median over rounds per prompt, then
the median of those over the prompts:

- ``llama_plain``: llama-server without speculation;
- ``llama_ngram``: llama-server ``--spec-type ngram-mod`` (its best n-gram mode), one server
  for all rounds: its n-gram pool lives across requests, so from the second round on it
  holds this very request's earlier reply;
- ``llama_ngram_cold``: the same with a fresh server per request (an empty pool);
- ``echo_plain`` / ``echo_spec``: echoline plain and exact speculative decoding, with no
  earlier replies (``forget_replies``);
- ``echo_spec_warm``: echoline speculative with this request's earlier reply kept (as the
  engine keeps replies for later requests): the like-for-like match of ``llama_ngram``.

``spec_vs_llama_ngram`` (echoline cold against llama.cpp warm) is the conservative ratio;
``spec_vs_llama_ngram_cold`` and ``spec_warm_vs_llama_ngram`` compare like with like.

Decode speed is tokens after the first over the time after the first (both engines report
it that way: llama.cpp's ``predicted_per_second``, echoline's ``tokens_per_s``). Also
reported: whether each engine's speculative reply equals its own plain reply, the
resident memory of each (next to the GGUF size), and echoline's cached start (a fresh
process: load, prefill, first token). Each traffic row also says how many prompts it ran
(``prompts``), how many of them gave echoline identical speculative and plain replies
(``echo_spec_equal_prompts``) and the median reply length of each engine's plain arm
(``reply_tokens``). One benchmark at a time: on 2 cores a second
process makes every figure meaningless.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from echoline.engine.api import HISTORY_CONTEXT, Engine
from echoline.engine.bench.traffic import COPY_INSTRUCTION, EDIT_INSTRUCTIONS, excerpt, file_message
from echoline.engine.model_catalog import resolve_model
from echoline.engine.setup_check import cpu_model
from echoline.sidecar.bench.next_edit import case_events, load_cases
from echoline.sidecar.bench.rewrite_traffic import rewrite_requests
from echoline.sidecar.next_edit import DEFAULT_FORMAT, FORMATS, REGION_LINES, prompt_parts

from tools.llamacpp_peer import LlamaServer, add_peer_arguments, build

#: Held-out source: a standard-library module, not this repository's code.
HELD_OUT = Path(inspect.getfile(textwrap))


#: the arms, in their first round's order (later rounds rotate it)
ARMS = ("llama_plain", "llama_ngram", "echo_plain", "echo_spec", "llama_ngram_cold", "echo_spec_warm")


#: the traffic kinds this tool knows
TRAFFIC = ("copy", "edit", "rewrite", "next-edit")


def _check_traffic(traffic: list[str]) -> None:
    unknown = sorted(set(traffic) - set(TRAFFIC))
    if unknown:
        raise SystemExit(f"unknown traffic {', '.join(unknown)}: choose from {', '.join(TRAFFIC)}")


def next_edit_prompts(engine: Engine, cases: int = 0, split: str = "tune") -> list[list[int]]:
    """The prompt ids ``echoline bench next-edit`` generates from for the first ``cases``
    cases of ``split`` (0: all): the user's edit replayed through the edit history, the
    region around the cursor, the default format. Built with the bench's own steps, so the
    two measure the very same prompts."""
    chosen = load_cases(split)
    if cases:
        chosen = chosen[:cases]
    out = []
    for case in chosen:
        parts = prompt_parts(case.path, case.edited, case.cursor, case_events(case), case.uri, REGION_LINES)
        out.append(FORMATS[DEFAULT_FORMAT](engine, parts).ids)
    return out


def prompts(engine: Engine, traffic: list[str], max_tokens: int = 128) -> dict[str, list[int]]:
    """The prompt ids of each single-prompt traffic kind, the same for both engines
    (``next-edit``, which has one prompt per case, is ``prompt_sets``' alone)."""
    _check_traffic(traffic)
    code = excerpt(HELD_OUT, 3000)
    instruction = {"copy": COPY_INSTRUCTION,
                   "edit": EDIT_INSTRUCTIONS[0].format(name="width")}
    out = {t: engine.encode_chat([{"role": "user", "content": file_message(code, instruction[t])}])
           for t in traffic if t in instruction}
    if "rewrite" in traffic:  # the sidecar's prompt; its stop (the closing fence) is not used
        out["rewrite"] = rewrite_requests(engine, [HELD_OUT], max_tokens)[0][0]
    return out


def prompt_sets(engine: Engine, traffic: list[str], max_tokens: int = 128, next_edit_cases: int = 0
                ) -> dict[str, list[list[int]]]:  # fmt: skip
    """Every traffic kind's prompts, in ``traffic``'s order: one for ``copy``, ``edit`` and
    ``rewrite``; one per case for ``next-edit``."""
    _check_traffic(traffic)
    single = prompts(engine, [t for t in traffic if t != "next-edit"], max_tokens)
    return {t: next_edit_prompts(engine, next_edit_cases) if t == "next-edit" else [single[t]] for t in traffic}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cached_start_s(model: str) -> float:
    """A fresh process: load the (cached) model, prefill a short prompt, one token."""
    script = ("import time; t=time.perf_counter(); from echoline.engine.api import Engine; "
              f"e=Engine.load({model!r}); e.generate(e.encode('def add(a, b):'), max_tokens=1, spec=False); "
              "print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def isa() -> dict[str, str]:
    """What each engine was built for: llama.cpp's ISA cap (``ECHOLINE_PEER_ISA``, else the
    CPU's own) and the CPU numba generates echoline's kernels for (``NUMBA_CPU_NAME``)."""
    try:
        from echoline.kernels.cpu.numba_setup import target_cpu

        numba_cpu = target_cpu()[0]
    except ImportError:  # no numba: the numpy backend
        numba_cpu = "none"
    return {"llama": os.environ.get("ECHOLINE_PEER_ISA") or "native", "echoline": numba_cpu}


def run(args: argparse.Namespace) -> dict:
    traffic = args.traffic.split(",")
    path = resolve_model(args.model)
    exe = Path(args.llama_server) if args.llama_server else build()
    engine = Engine.load(args.model, backend=args.backend)
    ids = prompt_sets(engine, traffic, args.max_tokens, getattr(args, "next_edit_cases", 0))
    threads = str(os.cpu_count() or 2)
    results: dict[str, dict] = {}
    more = args.llama_args.split()
    with LlamaServer(path, exe=exe, extra=more) as plain_srv, LlamaServer(
        path, exe=exe, extra=[*more, "--spec-type", "ngram-mod"]
    ) as ngram_srv:
        for t in traffic:
            n_prompts = len(ids[t])
            # per arm, per prompt: each round's decode speed and whole request (prefill too)
            speeds: dict[str, list[list[float]]] = {a: [[] for _ in range(n_prompts)] for a in ARMS}
            request_ms: dict[str, list[list[float]]] = {a: [[] for _ in range(n_prompts)] for a in ARMS}
            replies: dict[str, list[list[int] | None]] = {a: [None] * n_prompts for a in ARMS}

            def arm(name: str, i: int, t: str = t, speeds: dict = speeds, request_ms: dict = request_ms,
                    replies: dict = replies) -> None:  # fmt: skip
                prompt = ids[t][i]
                if name == "llama_ngram_cold":  # a fresh server: an empty n-gram pool
                    with LlamaServer(path, exe=exe, extra=[*more, "--spec-type", "ngram-mod"]) as srv:
                        out = srv.greedy(prompt, args.max_tokens)
                elif name.startswith("llama"):
                    srv = plain_srv if name == "llama_plain" else ngram_srv
                    out = srv.greedy(prompt, args.max_tokens)
                if name.startswith("llama"):
                    timings = out["timings"]
                    speeds[name][i].append(float(timings.get("predicted_per_second", 0.0)))
                    whole = float(timings.get("prompt_ms", 0.0)) + float(timings.get("predicted_ms", 0.0))
                    request_ms[name][i].append(whole)
                    if replies[name][i] is None:
                        replies[name][i] = out["ids"]
                    return
                engine.forget_replies()
                if name == "echo_spec_warm":  # this request's reply seen before, as llama's pool has
                    engine.remember_reply(replies["echo_plain"][i], before=prompt[-HISTORY_CONTEXT:])
                res = engine.generate(prompt, max_tokens=args.max_tokens, spec=name != "echo_plain")
                speeds[name][i].append(res.stats.tokens_per_s)
                request_ms[name][i].append(res.stats.total_s * 1000)
                if replies[name][i] is None:
                    replies[name][i] = list(res.token_ids)

            names = list(speeds)
            for i in range(n_prompts):  # warm-up: kernels and caches ready before anything is
                arm("echo_plain", i)  # timed; each prompt's plain reply known for the warm arm
            for a in (speeds, request_ms):
                a["echo_plain"] = [[] for _ in range(n_prompts)]
            for r in range(args.rounds):
                for i in range(n_prompts):
                    k = (r + i) % len(names)
                    for name in names[k:] + names[:k]:
                        arm(name, i)

            def median_of(per_prompt: list[list[float]]) -> float:
                return statistics.median(statistics.median(v) for v in per_prompt)

            def same(a: str, b: str, reps: dict = replies) -> int:
                return sum(x == y for x, y in zip(reps[a], reps[b], strict=True))

            med = {k: median_of(v) for k, v in speeds.items()}
            results[t] = {
                **{f"{k}_tok_s": round(v, 2) for k, v in med.items()},
                "plain_vs_llama": round(med["echo_plain"] / med["llama_plain"], 3),
                "spec_vs_llama_ngram": round(med["echo_spec"] / med["llama_ngram"], 3),
                "echo_spec_ratio": round(med["echo_spec"] / med["echo_plain"], 3),
                "llama_ngram_ratio": round(med["llama_ngram"] / med["llama_plain"], 3),
                "echo_spec_equals_plain": same("echo_spec", "echo_plain") == n_prompts,
                "llama_ngram_equals_plain": same("llama_ngram", "llama_plain") == n_prompts,
                # like for like: both engines' n-gram memories empty, or both holding this
                # request's earlier reply (llama-server's ngram-mod pool lives across requests)
                "spec_vs_llama_ngram_cold": round(med["echo_spec"] / med["llama_ngram_cold"], 3),
                "spec_warm_vs_llama_ngram": round(med["echo_spec_warm"] / med["llama_ngram"], 3),
                "echo_spec_warm_equals_plain": same("echo_spec_warm", "echo_plain") == n_prompts,
                "llama_ngram_cold_equals_plain": same("llama_ngram_cold", "llama_plain") == n_prompts,
                "prompt_tokens": round(statistics.median(len(p) for p in ids[t])),
                "prompts": n_prompts,
                "echo_spec_equal_prompts": min(same("echo_spec", "echo_plain"), same("echo_spec_warm", "echo_plain")),
                "reply_tokens": {a: statistics.median(len(x or []) for x in replies[a])
                                 for a in ("llama_plain", "echo_plain")},
                "request_ms": {k: round(median_of(v), 2) for k, v in request_ms.items()},
            }
        rss = {"llama_server_mb": round(_rss_mb(plain_srv.proc.pid), 1)}  # type: ignore[union-attr]
    rss["echoline_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out = {
        "model": args.model, "gguf_mb": round(path.stat().st_size / 2**20, 1), "cpu": cpu_model(),
        "cores": os.cpu_count(), "llama_threads": threads, "isa": isa(), "backend": engine.backend_variant,
        "max_tokens": args.max_tokens, "rounds": args.rounds, "traffic": results, "resident": rss,
        "echoline_cached_start_s": round(cached_start_s(args.model), 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"{out['model']} on {out['cpu']} ({out['cores']} cores), {args.max_tokens} tokens, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'traffic':<8} {'llama plain':>12} {'llama ngram':>12} {'echo plain':>11} {'echo spec':>10} "
          f"{'plain ×':>8} {'spec ×':>7} {'same?':>6} | {'ngram cold':>10} {'spec ×':>7} "
          f"{'echo warm':>10} {'spec ×':>7}")
    for t, r in results.items():
        same = r["echo_spec_equals_plain"] and r["echo_spec_warm_equals_plain"]
        print(f"{t:<8} {r['llama_plain_tok_s']:>12.1f} {r['llama_ngram_tok_s']:>12.1f} "
              f"{r['echo_plain_tok_s']:>11.1f} {r['echo_spec_tok_s']:>10.1f} {r['plain_vs_llama']:>8.2f} "
              f"{r['spec_vs_llama_ngram']:>7.2f} {str(same):>6} | {r['llama_ngram_cold_tok_s']:>10.1f} "
              f"{r['spec_vs_llama_ngram_cold']:>7.2f} {r['echo_spec_warm_tok_s']:>10.1f} "
              f"{r['spec_warm_vs_llama_ngram']:>7.2f}")
    for t, r in results.items():
        if r["prompts"] > 1:
            ms = ", ".join(f"{k} {v:.1f}" for k, v in r["request_ms"].items())
            print(f"{t}: {r['prompts']} prompts (median {r['prompt_tokens']} tokens), identical "
                  f"{r['echo_spec_equal_prompts']}/{r['prompts']}, replies {r['reply_tokens']} tokens; "
                  f"ms a request (prefill too): {ms}")
    print(f"resident: echoline {rss['echoline_mb']} MB, llama-server {rss['llama_server_mb']} MB "
          f"(GGUF {out['gguf_mb']} MB); echoline cached start {out['echoline_cached_start_s']} s")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--traffic", default="copy,edit",
                    help=f"comma-separated, from {','.join(TRAFFIC)}")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--next-edit-cases", type=int, default=0,
                    help="next-edit traffic: the first N cases of the tune split (0: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    add_peer_arguments(ap)
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
