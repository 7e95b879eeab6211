"""Trial of rewrite prompt variants on ``echoline bench edits`` (tune split first).

Each variant replaces ``prompts.rewrite_prompt`` in this process only, so the benchmark runs
the same path as ``echoline rewrite`` with another prompt; nothing in the product changes
until a variant wins on the tune split and holds on the held-out one. Outcomes are kept in
docs/history/rewrite-prompt.md.

    .venv/bin/python tools/rewrite_prompt_trial.py --variant keep --split tune \
        --model qwen2.5-coder-1.5b --edit-set all
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from echoline.sidecar import prompts

#: What each variant adds to the kept layout.
SYSTEM = (
    "You are a careful code editor. Apply the user's instruction to the given code and change "
    "nothing else: keep its behaviour, names and style, and add no error handling, features or "
    "comments that were not asked for. Answer with the complete rewritten code only."
)
KEEP = "Change only what this asks for and keep everything else, including behaviour, as it is."
WHOLE = "Rewrite all of the selected code, every function in it, and nothing after it."


def variant(name: str) -> Any:
    plain_prompt = prompts.rewrite_prompt

    def patched(file_text: str, start: int, end: int, instruction: str, **kw: Any) -> prompts.RewritePrompt:
        instr = instruction
        if instruction.strip() and name in ("keep", "keep-sys", "keep-whole"):
            instr = f"{instruction.strip()}\n{KEEP}"
        if instruction.strip() and name == "keep-whole":
            instr = f"{instr}\n{WHOLE}"
        p = plain_prompt(file_text, start, end, instr, **kw)
        msgs = p.messages
        if name in ("sys", "keep-sys"):
            msgs = [{"role": "system", "content": SYSTEM}, *msgs]
        return prompts.RewritePrompt(messages=msgs, prime=p.prime, plain=p.plain, fence=p.fence)

    return patched


def main() -> None:
    from echoline.sidecar.bench.edits import run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="kept",
                    choices=("kept", "sys", "keep", "keep-sys", "keep-whole"))
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
