"""Why a speculative chat reply can run below plain on the GPU: per-round costs in the loop.

Run on the device: ``python3 -m tools.cuda.chat_probe --model PATH [--passes 4]``. The
`bench spec --traffic chat` conversations (sessions reused across passes, as the bench
does), one warm-up pass per mode, then passes alternating plain and speculative. Per pass:
tok/s, rounds, graph captures made, the plain arm's counters; per speculative pass, the
forward time per row count inside the loop against its one-row rounds, and the slowest rounds.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from echoline.engine.api import Engine
from echoline.engine.bench import traffic

from tools.cuda.probe_common import log_loop_forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    eng = Engine.load(args.model, backend=args.backend)
    backend = eng.model.backend
    log = log_loop_forwards(backend)
    captures = [0]

    capture = getattr(type(backend), "_capture", None)
    if capture is not None:
        def counted(stream, fn, statics):
            captures[0] += 1
            return capture(stream, fn, statics)
        type(backend)._capture = staticmethod(counted)

    def chat_pass(mode: str) -> tuple[int, float, int]:
        tokens = rounds = 0
        decode = 0.0
        for ci, turns in enumerate(traffic.CHAT_TURNS):
            messages: list[dict[str, str]] = []
            eng.forget_replies()
            for q in turns:
                messages.append({"role": "user", "content": q})
                prompt = eng.encode_chat(messages)
                r = eng.generate(prompt, max_tokens=args.max_tokens, spec=mode == "spec",
                                 session=f"probe-{mode}-{ci}")
                messages.append({"role": "assistant", "content": r.text})
                tokens += max(0, r.stats.generated_tokens - 1)
                decode += r.stats.decode_s
                rounds += r.stats.rounds
        return tokens, decode, rounds

    t1 = None
    for p in range(-1, args.passes):
        for mode in (("plain", "spec") if p % 2 == 0 else ("spec", "plain")):
            log.clear()
            c0 = captures[0]
            arm = eng.controller.arm
            a0 = (arm.lookups, arm.plain_rounds, arm.switches) if arm is not None else (0, 0, 0)
            tokens, decode, rounds = chat_pass(mode)
            a1 = (arm.lookups, arm.plain_rounds, arm.switches) if arm is not None else (0, 0, 0)
            by = defaultdict(list)
            for rows, _, s in log:
                by[rows].append(s)
            if by[1]:  # plain passes chain their steps (none timed here): spec's k = 0 rounds
                t1 = statistics.median(by[1])
            tag = "warm-up" if p < 0 else f"pass {p}"
            print(f"{tag} {mode}: {tokens} tokens {tokens / decode:.1f} tok/s, {rounds} rounds, "
                  f"forwards timed {len(log)} ({sum(s for *_, s in log) * 1e3:.1f} ms), captures "
                  f"{captures[0] - c0}, arm lookups/plain rounds/switches "
                  f"{[b - a for a, b in zip(a0, a1, strict=True)]}", flush=True)
            if mode == "spec" and t1:
                rel = {r: (len(v), round(statistics.median(v) / t1, 2), round(max(v) / t1, 1))
                       for r, v in sorted(by.items())}
                print(f"  rows: (rounds, median / one-row median, max / one-row median) {rel}", flush=True)
                slow = sorted(log, key=lambda x: -x[2])[:6]
                print(f"  slowest (rows, ctx, ms): {[(r, c, round(s * 1e3, 2)) for r, c, s in slow]}", flush=True)
    fallback = getattr(backend, "cold_capture_fallback", None)
    print(f"captures without an eager run that fell back to one: {fallback or 'none'}", flush=True)


if __name__ == "__main__":
    main()
