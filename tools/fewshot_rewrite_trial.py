"""Trial of issue 49's few-shot prefix: worked multi-line edits before every rewrite prompt.

Runs ``echoline bench edits`` (the multi-line refactors) with the rewrite prompt's messages
preceded by ``EXAMPLES``, chat turns of worked edits in the rewrite layout itself. The turns
come first and are the same for every request, so a server's sessions share their cache
rows (engine/sessions.py copies a shared prefix between sessions): the cost is one prefill
per process. The outcome is in docs/history/rewrite-few-shot.md; the prompt itself was not
changed (the trial did not pay on the tune split).

    .venv/bin/python tools/fewshot_rewrite_trial.py --split tune --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from echoline.sidecar import prompts

_EXAMPLE_FILES = [
    (
        "timing.py",
        '''"""Wall-clock timing of the import jobs."""
import time


def start_timer():
    return time.perf_counter()


def elapsed_ms(started):
    return (time.perf_counter() - started) * 1000


def report(name, started):
    print(name, "took", round(elapsed_ms(started)), "ms")
''',
        "def start_timer():\n    return time.perf_counter()\n\n\n"
        "def elapsed_ms(started):\n    return (time.perf_counter() - started) * 1000\n",
        "Add type hints and a one-line docstring to these two functions.",
        'def start_timer() -> float:\n    """The current time of the performance counter, in seconds."""\n'
        "    return time.perf_counter()\n\n\n"
        'def elapsed_ms(started: float) -> float:\n    """Milliseconds since ``started`` (a start_timer() value)."""\n'
        "    return (time.perf_counter() - started) * 1000\n",
    ),
    (
        "sync.py",
        '''"""Copy new files from the inbox to the archive."""
import os
import shutil


def copy_new(inbox, archive):
    copied = 0
    for name in os.listdir(inbox):
        target = os.path.join(archive, name)
        if not os.path.exists(target):
            print("copying", name)
            shutil.copy(os.path.join(inbox, name), target)
            copied += 1
    print("copied", copied, "files")
    return copied


def main():
    copy_new("inbox", "archive")
''',
        "def copy_new(inbox, archive):\n    copied = 0\n    for name in os.listdir(inbox):\n"
        "        target = os.path.join(archive, name)\n        if not os.path.exists(target):\n"
        '            print("copying", name)\n            shutil.copy(os.path.join(inbox, name), target)\n'
        '            copied += 1\n    print("copied", copied, "files")\n    return copied\n',
        "Log with the logging module instead of print, and use pathlib instead of os.",
        "import logging\nfrom pathlib import Path\n\nlog = logging.getLogger(__name__)\n\n\n"
        "def copy_new(inbox, archive):\n    copied = 0\n    for source in Path(inbox).iterdir():\n"
        "        target = Path(archive) / source.name\n        if not target.exists():\n"
        '            log.info("copying %s", source.name)\n            shutil.copy(source, target)\n'
        '            copied += 1\n    log.info("copied %d files", copied)\n    return copied\n',
    ),
]


def example_turns() -> list[dict[str, str]]:
    """The worked edits as user/assistant turns, in the layout of ``prompts.rewrite_prompt``."""
    turns: list[dict[str, str]] = []
    for name, text, selection, instruction, answer in _EXAMPLE_FILES:
        start = text.index(selection)
        p = prompts.rewrite_prompt(text, start, start + len(selection), instruction, name=name)
        turns.append({"role": "user", "content": p.messages[0]["content"]})
        turns.append({"role": "assistant", "content": f"{p.prime}{answer}{p.fence}"})
    return turns


def install() -> None:
    """Put the example turns before every rewrite prompt's message (this process only)."""
    plain_prompt = prompts.rewrite_prompt
    turns = example_turns()

    def with_examples(*args: Any, **kw: Any) -> prompts.RewritePrompt:
        p = plain_prompt(*args, **kw)
        return prompts.RewritePrompt(messages=turns + p.messages, prime=p.prime, plain=p.plain, fence=p.fence)

    prompts.rewrite_prompt = with_examples


def main() -> None:
    from echoline.sidecar.bench.edits import run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--split", default="tune", choices=("tune", "heldout", "all"))
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--plain", action="store_true", help="without the examples (the baseline)")
    a = ap.parse_args()
    if not a.plain:
        install()
    args = argparse.Namespace(model=a.model, backend="auto", split=a.split, case=a.case,
                              edit_set="multiline", max_tokens=a.max_tokens)
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
