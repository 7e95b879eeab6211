"""The decode loop's host time alone, on recorded replies, with a GPU-like forward.

Run: ``python -m tools.engine.host_profile --model NAME --traffic copy|edit [--step-ms 1.0]
[--curve 1:1,2:1.03,4:1.05,8:1.13,16:1.4] [--profile 25]``.

Why: on the H200 a Qwen 0.5B step takes about a millisecond and a speculative round's
Python work (lookup, choice, acceptance, stop rules, text, bookkeeping) is 0.1-0.2 ms of
it, so it decides chat traffic's ratio and a tenth of copy's. Measuring it there costs
device time and moves with the machine; here the engine runs unchanged except its model:
each plain reply is recorded once with the real model, then the loop is replayed with a
stand-in whose forward answers each row with the recorded next token and busy-waits the
time the curve gives (``--step-ms`` × T(rows)/T(1)), so the controller sees GPU-like costs
and the host time is everything else. The replayed replies must equal the recorded ones
(the tool checks), and ``--profile N`` prints cProfile's top N functions of the replay.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Sequence

import numpy as np

from tools.engine.draft_study import parse_curve


class ReplayBackend:
    """What the loop asks of a backend: argmax is the identity (the forward returns ids)."""

    name = "replay"
    padded_rows = 0
    graph_max_rows = 17  # verify 2, 4, 8 or 16 rows, as on the GPU
    graph_chain = False

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x


class ReplayModel:
    """Answers row j of a forward at cache position p with ``stream[p + 1]`` (the recorded
    reply: correct for every row whose inputs follow it, which is all that acceptance
    reads), after busy-waiting ``step_s`` × the curve's cost of that many rows."""

    def __init__(self, real, step_s: float, curve: dict[int, float], stop_id: int) -> None:
        self.backend = ReplayBackend()
        self.config = real.config
        self.step_s = step_s
        self.rows = sorted(curve)
        self.cost = [curve[r] / curve[self.rows[0]] for r in self.rows]
        self.stop_id = stop_id
        self.stream: list[int] = []
        self.timed = False  # prefill runs untimed

    def _wait(self, n: int) -> None:
        factor = float(np.interp(n, self.rows, self.cost))
        end = time.perf_counter() + self.step_s * factor
        while time.perf_counter() < end:
            pass

    def forward(self, rows: Sequence[int], cache, all_logits: bool = False) -> np.ndarray:
        base = cache.length
        n = len(rows)
        cache.advance(base, n)
        if self.timed:
            self._wait(n)
        s = self.stream
        out = np.array([s[p + 1] if p + 1 < len(s) else self.stop_id for p in range(base, base + n)])
        return out if all_logits else out[-1:]


def replay_host_times(engine, prompts: Sequence[Sequence[int]], *, max_tokens: int = 128,
                      step_ms: float = 1.0, curve: dict[int, float] | None = None,
                      rounds: int = 3, profile: int = 0) -> dict[str, dict[str, float]]:
    """Record each prompt's plain reply with ``engine``'s own model, then replay plain and
    speculative decoding ``rounds`` times, interleaved, through ``ReplayModel``; medians per
    mode of host µs per round and per token, lookup µs per round, tokens per round, tok/s
    and the forward's share of the wall time. The engine's model and controller are put
    back afterwards. Raises when a replayed reply differs from its recording."""
    from echoline.engine.drafting.controller import DraftController, VerifyCost

    curve = curve or parse_curve("1:1,2:1.03,4:1.05,8:1.13,16:1.40")
    pairs = [(list(p), engine.generate(p, max_tokens=max_tokens, spec=False).token_ids) for p in prompts]
    stop = min(engine.tokenizer.stop_ids) if engine.tokenizer.stop_ids else 0
    real, real_controller = engine.model, engine._controller
    replay = ReplayModel(real, step_ms / 1e3, curve, stop)
    rows = sorted(curve)
    ratios = np.interp(np.arange(1, 18), rows, [curve[r] / curve[rows[0]] for r in rows])

    def run_all(spec: bool) -> dict[str, float]:
        host = rounds_n = tokens = lookup = wall = forward = 0.0
        for prompt, reply in pairs:
            replay.stream = prompt + list(reply)
            res = engine.generate(prompt, max_tokens=max_tokens, spec=spec)
            if res.token_ids != list(reply):
                raise RuntimeError("a replayed reply differs from the recorded one")
            st = res.stats
            host += st.host_s
            rounds_n += st.rounds
            tokens += len(res.token_ids)
            lookup += st.lookup_s
            forward += st.forward_s
            wall += st.decode_s
        return {"host_us_round": host / rounds_n * 1e6, "host_us_token": host / tokens * 1e6,
                "lookup_us_round": lookup / rounds_n * 1e6, "tokens_round": tokens / rounds_n,
                "tok_s": tokens / wall, "forward_share": forward / wall}

    engine.model = replay
    # the controller starts from the replayed curve (it then observes the waits, as on a GPU)
    engine._controller = DraftController(VerifyCost.from_ratios(list(ratios), step_ms / 1e3),
                                         max_draft=engine.max_draft)
    replay.timed = True
    try:
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "spec": []}
        for _ in range(rounds):
            for mode in runs:
                runs[mode].append(run_all(mode == "spec"))
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            run_all(True)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(profile)
    finally:
        engine.model, engine._controller = real, real_controller
    return {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}


def main() -> None:
    from echoline.engine.api import Engine
    from echoline.engine.bench import traffic
    from echoline.engine.bench.spec import _prompts

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--traffic", choices=("copy", "edit"), default="edit")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=1.0, help="one row's forward, ms")
    ap.add_argument("--curve", default="1:1,2:1.03,4:1.05,8:1.13,16:1.40", help="rows:T(rows)/T(1),…")
    ap.add_argument("--rounds", type=int, default=3, help="replays of every reply (median)")
    ap.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions")
    args = ap.parse_args()
    engine = Engine.load(args.model)
    prompts = _prompts(engine, args.traffic, traffic.source_paths([]))
    got = replay_host_times(engine, prompts, max_tokens=args.max_tokens, step_ms=args.step_ms,
                            curve=parse_curve(args.curve), rounds=args.rounds, profile=args.profile)
    print(f"{engine.model_name}, {len(prompts)} {args.traffic} replies; step {args.step_ms} ms, "
          f"curve {args.curve}; medians of {args.rounds} interleaved rounds")
    print("mode   host us/round  host us/token  lookup us/round  tokens/round  tok/s   forward share")
    for mode, m in got.items():
        print(f"{mode:<6s} {m['host_us_round']:13.1f}  {m['host_us_token']:13.1f}  {m['lookup_us_round']:15.1f}  "
              f"{m['tokens_round']:12.2f}  {m['tok_s']:6.0f}  {m['forward_share']:.3f}")


if __name__ == "__main__":
    main()
