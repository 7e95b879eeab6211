"""Exactness of a 7B-shaped file on the CUDA backend (issue 49, part 5), on the GPU machine.

Two checks, token ids compared, nothing approximate:

- batch invariance, which speculation rests on: the argmax of each of 16 rows, and of the
  widest verify the engine drafts for (64 rows on CUDA), verified in one forward equals the
  argmax of those rows decoded one at a time on the same cache (and the logits are equal bit
  for bit);
- replies: for several prompts, speculative decoding (no earlier replies, then with the plain
  reply remembered, so whole drafts are accepted) writes the plain reply's ids.

    python -m tools.cuda.exact_7b FILE.gguf [--tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from echoline.engine.api import HISTORY_CONTEXT, Engine
from echoline.engine.bench.traffic import COPY_INSTRUCTION, EDIT_INSTRUCTIONS, excerpt, file_message

PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\nimport sys\n\nfor name in os.listdir(sys.argv[1]):\n    print(name)\n" * 3,
)


def batch_invariance(engine: Engine, ids: list[int], rows: int = 16) -> dict:
    """One forward of ``rows`` rows against the same rows one at a time, on one cache."""
    model, be = engine.model, engine.backend
    cache = model.new_cache(len(ids) + rows + 8)
    model.forward(ids[:-rows], cache, all_logits=False)
    start = cache.length
    batch = be.to_host(model.forward(ids[-rows:], cache, all_logits=True))
    cache.truncate(start)
    single = []
    for t in ids[-rows:]:
        out = model.forward([t], cache, all_logits=True)
        single.append(be.to_host(out).reshape(-1))
    single = np.stack(single)
    batch = batch.reshape(rows, -1)
    return {"rows": rows, "argmax_equal": bool(np.array_equal(batch.argmax(1), single.argmax(1))),
            "logits_equal": bool(np.array_equal(batch, single)),
            "finite": bool(np.isfinite(batch).all())}


def run(path: Path, tokens: int) -> dict:
    t0 = time.perf_counter()
    engine = Engine.load(str(path), backend="cuda")
    load_s = time.perf_counter() - t0
    code = excerpt(Path(__file__).resolve().parents[2] / "engine" / "generate.py", 1500)
    prompts = [engine.encode(p) for p in PROMPTS] + [
        engine.encode_chat([{"role": "user", "content": file_message(code, COPY_INSTRUCTION)}]),
        engine.encode_chat([{"role": "user", "content": file_message(
            code, EDIT_INSTRUCTIONS[0].format(name="width"))}]),
    ]
    sixteen = batch_invariance(engine, prompts[2])
    widest = engine.max_draft + 1
    out = {"model": str(path), "load_s": round(load_s, 1), "backend": engine.backend_variant,
           "max_draft": engine.max_draft, "batch_invariance": sixteen,
           "batch_invariance_widest": sixteen if widest == 16 else batch_invariance(engine, prompts[2], widest),
           "replies": []}
    for ids in prompts:
        engine.forget_replies()
        plain = engine.generate(ids, max_tokens=tokens, spec=False, stop=())
        engine.forget_replies()
        cold = engine.generate(ids, max_tokens=tokens, spec=True, stop=())
        engine.forget_replies()
        engine.remember_reply(list(plain.token_ids), before=ids[-HISTORY_CONTEXT:])
        warm = engine.generate(ids, max_tokens=tokens, spec=True, stop=())
        p = list(plain.token_ids)
        out["replies"].append({
            "prompt_tokens": len(ids), "tokens": len(p),
            "cold_equal": list(cold.token_ids) == p, "warm_equal": list(warm.token_ids) == p,
            "plain_tok_s": round(plain.stats.tokens_per_s, 1),
            "cold": {"tok_s": round(cold.stats.tokens_per_s, 1), "rounds": cold.stats.rounds,
                     "drafted": cold.stats.drafted, "accepted": cold.stats.accepted},
            "warm": {"tok_s": round(warm.stats.tokens_per_s, 1), "rounds": warm.stats.rounds,
                     "drafted": warm.stats.drafted, "accepted": warm.stats.accepted},
        })
    out["all_exact"] = all(out[k]["argmax_equal"] for k in ("batch_invariance", "batch_invariance_widest")) and all(
        r["cold_equal"] and r["warm_equal"] for r in out["replies"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.model, a.tokens)
    print(f"{a.model.name}: load {res['load_s']} s; max_draft {res['max_draft']}", file=sys.stderr)
    checks = [res["batch_invariance"]]
    if res["max_draft"] + 1 != 16:
        checks.append(res["batch_invariance_widest"])
    for bi in checks:
        print(f"  {bi['rows']} rows == 1 at a time: argmax {bi['argmax_equal']}, "
              f"logits {bi['logits_equal']}, finite {bi['finite']}", file=sys.stderr)
    for r in res["replies"]:
        print(f"  prompt {r['prompt_tokens']:>4} tok: spec == plain cold {r['cold_equal']} warm {r['warm_equal']}; "
              f"plain {r['plain_tok_s']} tok/s, cold {r['cold']}, warm {r['warm']}", file=sys.stderr)
    print(f"  all exact: {res['all_exact']}", file=sys.stderr)
    if a.json:
        print(json.dumps(res))
    return 0 if res["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
