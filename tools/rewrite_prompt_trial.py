"""Trial of rewrite prompt variants on ``echoline bench edits`` (tune split first).

Each variant replaces ``prompts.rewrite_prompt`` in this process only, so the benchmark runs
the same path as ``echoline rewrite`` with another prompt; nothing in the product changes
until a variant wins on the tune split and holds on the held-out one. Outcomes are kept in
docs/history/rewrite-prompt.md.

    .venv/bin/python tools/rewrite_prompt_trial.py --variant works --split tune \
        --model qwen2.5-coder-1.5b --edit-set all
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from echoline.sidecar import prompts

#: Variants of the system message (``prompts.REWRITE_SYSTEM`` is "kept"; None: the chat
#: template's own default, as before the system message was kept).
SYSTEMS: dict[str, str | None] = {
    "kept": prompts.REWRITE_SYSTEM,
    "template": None,
    "works": prompts.REWRITE_SYSTEM + (
        " Make sure the rewritten code works: every name it uses is defined or imported, every "
        "value has the type its use needs, and callers get the same results as before."
    ),
}
#: A line added after the instruction (the "keep" variant).
KEEP = "Change only what this asks for and keep everything else, including behaviour, as it is."


def variant(name: str) -> Any:
    plain_prompt = prompts.rewrite_prompt
    system = SYSTEMS.get(name, prompts.REWRITE_SYSTEM)

    def patched(file_text: str, start: int, end: int, instruction: str, **kw: Any) -> prompts.RewritePrompt:
        instr = f"{instruction.strip()}\n{KEEP}" if instruction.strip() and name == "keep" else instruction
        p = plain_prompt(file_text, start, end, instr, **kw)
        user = p.messages[-1]
        msgs = [{"role": "system", "content": system}, user] if system else [user]
        return prompts.RewritePrompt(messages=msgs, prime=p.prime, plain=p.plain, fence=p.fence)

    return patched


def main() -> None:
    from echoline.sidecar.bench.edits import run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="kept", choices=(*SYSTEMS, "keep"))
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--split", default="tune", choices=("tune", "heldout", "all"))
    ap.add_argument("--edit-set", default="multiline", choices=("all", "function", "multiline"))
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--case", action="append", default=[])
    a = ap.parse_args()
    if a.variant != "kept":
        prompts.rewrite_prompt = variant(a.variant)
    args = argparse.Namespace(model=a.model, backend="auto", split=a.split, case=a.case,
                              edit_set=a.edit_set, max_tokens=a.max_tokens)
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
