"""Record plain greedy replies of the bench traffic (prompt and reply ids) for drafter studies.

Why: how good a drafter is depends only on the replies, not on the hardware, so its
variants can be compared offline on saved replies with ``tools.drafting.replay`` in
seconds instead of a device run per variant.

    python -m tools.drafting.record --model qwen2.5-coder-0.5b --traffic edit --out /tmp/edit.json
"""

from __future__ import annotations

import argparse
import json

from echoline.engine.api import Engine
from echoline.engine.bench import traffic
from echoline.engine.bench.spec import _prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--traffic", choices=("copy", "edit"), default="edit")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--source", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = Engine.load(args.model, backend=args.backend)
    prompts = _prompts(engine, args.traffic, traffic.source_paths(args.source))
    out = []
    for p in prompts:
        engine.forget_replies()
        res = engine.generate(p, max_tokens=args.max_tokens, spec=False)
        out.append({"prompt": list(p), "reply": list(res.token_ids)})
        print(f"{len(p)} prompt, {len(res.token_ids)} reply tokens", flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "traffic": args.traffic, "requests": out}, f)


if __name__ == "__main__":
    main()
