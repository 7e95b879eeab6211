"""Requests for the speculation benchmark: copy, edit and chat traffic.

Sources default to this repository's own Python files (varied modules), cut
to ~3,500 characters at line boundaries, as an editor would send a buffer.
"""

from __future__ import annotations

import re
from pathlib import Path

COPY_INSTRUCTION = "Rewrite the code above EXACTLY, character for character, with no changes and no commentary."
EDIT_INSTRUCTIONS = (
    "Rename the variable `{name}` to `{name}_value` everywhere, and change nothing else.",
    "Add a parameter `verbose=False` to the first function, and change nothing else.",
    "Add a one-line docstring to the first function that has none, and change nothing else.",
    "Change the first numeric constant you see to twice its value, and change nothing else.",
)
CHAT_TURNS = (
    ("What is the difference between a process and a thread?", "Give one example of each."),
    ("Explain what a hash table is in two sentences.", "What happens on a collision?"),
    ("Why is the sky blue?", "And why are sunsets red?"),
)
EXCERPT_CHARS = 3500

_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCES = (
    "engine/generate.py",
    "engine/sessions.py",
    "engine/gguf_file.py",
    "engine/models/base.py",
    "engine/backends/numpy_backend.py",
    "engine/model_catalog.py",
)


def excerpt(path: Path, chars: int = EXCERPT_CHARS) -> str:
    """The first ``chars`` characters of a file, cut back to a line boundary."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1 if cut > 0 else chars]


def source_paths(given: list[str]) -> list[Path]:
    paths = [Path(p) for p in given] if given else [_ROOT / p for p in DEFAULT_SOURCES]
    return [p for p in paths if p.is_file()]


def _first_identifier(code: str) -> str:
    for m in re.finditer(r"\b([a-z_][a-z0-9_]{3,})\s*=", code):
        return m.group(1)
    return "value"


def file_message(code: str, instruction: str, lang: str = "python") -> str:
    return f"Here is part of a file:\n\n```{lang}\n{code}```\n\n{instruction}"


def copy_messages(paths: list[Path]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": file_message(excerpt(p), COPY_INSTRUCTION)}] for p in paths]


def edit_instruction(i: int, code: str) -> str:
    """The ``i``-th request's instruction (they rotate), naming a variable of ``code``."""
    return EDIT_INSTRUCTIONS[i % len(EDIT_INSTRUCTIONS)].format(name=_first_identifier(code))


def edit_messages(paths: list[Path]) -> list[list[dict[str, str]]]:
    out = []
    for i, p in enumerate(paths):
        code = excerpt(p)
        out.append([{"role": "user", "content": file_message(code, edit_instruction(i, code))}])
    return out


def raw_prompt(messages: list[dict[str, str]]) -> str:
    """For a model without a chat template (Gemma 3 base): the request as plain text."""
    body = "\n\n".join(m["content"] for m in messages)
    return body + "\n\n```python\n"


def function_span(code: str, min_lines: int = 8, max_chars: int = 900) -> tuple[int, int]:
    """Character offsets [start, end) of the first ``def`` whose block runs at least
    ``min_lines`` lines (else the longest; else the same for ``class``), cut at ``max_chars`` on a line
    boundary: the selection a developer would make for an edit. Without any, the middle
    lines of ``code`` (same cap).

    Why a function and a cap: the rewrite traffic replies with the selection rewritten,
    and a reply that fits ``bench spec``'s default 256 tokens ends at its closing fence,
    as an editor's rewrite does.
    """
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def capped(a: int, b: int) -> tuple[int, int]:
        end = a
        while end < b and offsets[end + 1] - offsets[a] <= max_chars:
            end += 1
        return offsets[a], offsets[max(end, a + 1)]

    for kind in ("def", "class"):  # a function first; a class where the excerpt has none
        longest = (0, 0)
        for i, line in enumerate(lines):
            m = re.match(rf"(\s*)(async\s+)?{kind}\s", line)
            if not m:
                continue
            indent = len(m.group(1))
            j = i + 1
            while j < len(lines) and (
                not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent
            ):
                j += 1
            while j > i + 1 and not lines[j - 1].strip():  # trailing blank lines stay outside
                j -= 1
            if j - i >= min_lines:
                return capped(i, j)
            longest = max(longest, (j - i, i), key=lambda t: t[0])
        if longest[0]:
            return capped(longest[1], longest[1] + longest[0])
    mid = len(lines) // 2
    return capped(max(0, mid - 10), min(len(lines), mid + 10))


#: Characters of code before the cursor in a follow-up (completion) request.
FOLLOWUP_PREFIX_CHARS = 3000


def followup_prefixes(paths: list[Path]) -> list[str]:
    """Code before a cursor at the start of the line nearest each file's middle.

    The ``followup`` traffic completes there, then asks again after the user accepted the
    suggestion's first token — the editor's type-through: the second reply repeats the rest
    of the first, which the engine keeps as a draft source.
    """
    out = []
    for p in paths:
        text = p.read_text()
        cut = text.rfind("\n", 0, len(text) // 2) + 1
        out.append(text[max(0, cut - FOLLOWUP_PREFIX_CHARS) : cut])
    return out
