"""``echoline bench cache``: time to first token, cold vs a warm per-buffer session.

A ~2,000-token buffer in the rewrite-prompt layout (file first, selection and
instruction last); a one-line edit near the end, in the middle, at the top;
and a repeat with no change. ratio = warm TTFT / cold TTFT for the same
prompt; ``identical`` says whether every warm reply equalled the cold one.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from echoline.engine.bench import traffic
from echoline.engine.bench.common import load, print_table
from echoline.engine.sessions import common_prefix

TARGET_TOKENS = 2000
REPLY_TOKENS = 16


def _buffer(engine, target: int) -> list[str]:
    """Lines of this repo's sources until the buffer is ~target tokens."""
    lines: list[str] = []
    for path in traffic.source_paths([]):
        for line in Path(path).read_text().splitlines(keepends=True):
            lines.append(line)
            if len(lines) % 20 == 0 and len(engine.tokenizer.encode("".join(lines), add_bos=False)) >= target:
                return lines
    return lines


def rewrite_prompt(engine, lines: list[str], sel: tuple[int, int]) -> list[int]:
    """The rewrite layout: whole file (stable) first, then the selection and instruction."""
    file_text = "".join(lines)
    selection = "".join(lines[sel[0] : sel[1]])
    content = (
        f"Here is a file:\n\n```python\n{file_text}```\n\nSelected lines {sel[0] + 1}-{sel[1]}:\n\n"
        f"```python\n{selection}```\n\n{traffic.COPY_INSTRUCTION}"
    )
    if engine.has_chat_template:
        return engine.encode_chat([{"role": "user", "content": content}])
    return engine.encode(content + "\n\n```python\n")


def _edit(lines: list[str], at: int) -> list[str]:
    out = list(lines)
    out[at] = out[at].rstrip("\n") + "  # edited\n"
    return out


def run(args) -> dict:
    engine = load(args)
    lines = _buffer(engine, TARGET_TOKENS)
    n = len(lines)
    sel = (n - 12, n - 4)
    original = rewrite_prompt(engine, lines, sel)
    end_lines = _edit(lines, int(n * 0.95))
    cases = {
        "edit_end": rewrite_prompt(engine, end_lines, sel),
        "edit_middle": rewrite_prompt(engine, _edit(lines, n // 2), sel),
        "edit_top": rewrite_prompt(engine, _edit(lines, 1), sel),
        "repeat": original,
        # As edit_end, but the edited file's stable prompt part was prefilled while the user
        # paused (Engine.prefill, what the sidecar does on idle): only the volatile tail is left.
        "edit_end_idle_prefill": rewrite_prompt(engine, end_lines, sel),
    }
    # The stable part's ids: the longest common prefix with a request for another selection.
    other_sel = rewrite_prompt(engine, end_lines, (n // 3, n // 3 + 8))
    stable = cases["edit_end"][: common_prefix(cases["edit_end"], other_sel)]
    engine.generate(engine.encode("x = 1\n"), max_tokens=2, spec=False)  # warm-up / JIT
    reps = max(1, args.rounds)
    cold_ttft, warm_ttft, identical = {}, {}, True
    prefilled: dict[str, int] = {}
    cold_original = []
    for name, prompt in cases.items():
        colds, warms = [], []
        for rep in range(reps):
            key = f"bench-cache-{name}-{rep}"
            # Cold means no cache at all: no session may hold a prefix it could borrow.
            for other in list(engine.sessions.sessions):
                engine.sessions.drop(other)
            cold_first = rep % 2 == 1  # rotate the order so drift hits warm and cold alike
            if cold_first:
                cold = engine.generate(prompt, max_tokens=REPLY_TOKENS, session=None)
            base = engine.generate(original, max_tokens=REPLY_TOKENS, session=key)
            cold_original.append(base.stats.ttft_s)
            if name == "edit_end_idle_prefill":
                engine.prefill(stable, session=key)  # untimed: it ran before the request
            warm = engine.generate(prompt, max_tokens=REPLY_TOKENS, session=key)
            if not cold_first:
                engine.sessions.drop(key)
                cold = engine.generate(prompt, max_tokens=REPLY_TOKENS, session=None)
            assert cold.stats.reused_tokens == 0
            identical &= warm.token_ids == cold.token_ids
            prefilled[name] = warm.stats.prefilled_tokens
            warms.append(warm.stats.ttft_s)
            colds.append(cold.stats.ttft_s)
        cold_ttft[name] = statistics.median(colds)
        warm_ttft[name] = statistics.median(warms)
    result_cases = {
        name: {"ttft_s": round(warm_ttft[name], 4), "ratio": round(warm_ttft[name] / cold_ttft[name], 4),
               "cold_ttft_s": round(cold_ttft[name], 4),
               # The floor under the ratio: the share of the prompt a warm request must prefill.
               "prefilled_tokens": prefilled[name],
               "prefilled_share": round(prefilled[name] / len(cases[name]), 4)}
        for name in cases
    }
    result = {
        "model": engine.model_name,
        "backend": engine.backend_name,
        "variant": engine.backend_variant,
        "prompt_tokens": len(original),
        "cold_ttft_s": round(statistics.median(cold_original), 4),
        "identical": identical,
        "cases": result_cases,
    }
    print_table(
        f"bench cache: {engine.model_name} on {engine.backend_variant}, {len(original)}-token prompt",
        ["case", "warm TTFT s", "cold TTFT s", "warm/cold", "prefilled share"],
        [[k, v["ttft_s"], v["cold_ttft_s"], v["ratio"], v["prefilled_share"]] for k, v in result_cases.items()],
    )
    return result
