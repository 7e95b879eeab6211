"""Instruction edits with checks that run the edited code: the rewrite benchmark's cases.

Each case is a small, realistic file, a selected span (usually one function) and the
sentence a developer would type. A rewrite is scored by *running* ``check`` against the
edited file, not by comparing text, because many different replacements are correct:
the check accepts any of them as long as the instruction was carried out and the
behaviour is preserved (or fixed, for bug fixes). ``solution`` is one correct answer,
kept so the tests can prove each check passes on a good edit and fails on the
unedited file.

``split`` keeps a held-out third: tune prompts and decoding on "tune", report on
"heldout", so a gain is not just the benchmark being learned.

The cases are data, read by ``load_cases`` at import from ``data/`` beside this module:
``edit_cases.toml`` (one function each), ``edit_cases_multiline.toml`` (several functions
or a whole class in a 20-60-line file) and ``check_preludes.toml`` (the helpers put before
every check of a language). Selections are named by their first line and found here
(``_span``), so a case cannot silently select the wrong lines.

Only the standard library is imported so this module can be read, copied or loaded
anywhere without the engine.
"""

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")
FUNCTION_FILE = DATA / "edit_cases.toml"
MULTILINE_FILE = DATA / "edit_cases_multiline.toml"
PRELUDES_FILE = DATA / "check_preludes.toml"


@dataclass(frozen=True)
class EditCase:
    id: str  # short unique slug, e.g. "py-rename-param"
    split: str  # "tune" or "heldout"
    language: str  # "python" | "javascript" | "bash"
    filename: str  # the file the edited source is written to
    source: str  # the whole file before the edit
    lines: tuple[int, int]  # the selected lines, 1-based inclusive (what the model rewrites)
    instruction: str  # what a developer would type
    check: str  # a program in `language`, run next to the edited file; exit 0 = pass
    solution: str  # a correct replacement for exactly the selected lines
    kind: str = "function"  # "function" (one function) or "multiline" (a multi-line refactor)


def _read_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


# Each language's check helpers (``fail``, ``expect``, the ``ast`` queries), prepended to
# every check of that language.
_PRELUDES: dict[str, str] = _read_toml(PRELUDES_FILE)


def _span(source: str, select: str, language: str) -> tuple[int, int]:
    """1-based line range of the block whose first line starts with ``select``.

    Computed rather than typed by hand so a case cannot silently select the wrong lines:
    a Python block runs while lines are indented deeper than its ``def``; a JavaScript or
    bash block ends at the ``}`` with the header's indent.
    """
    lines = source.split("\n")
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(select)]
    if len(starts) != 1:
        raise ValueError(f"{select!r} starts {len(starts)} lines, need exactly one")
    start = starts[0]
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start
    for j in range(start + 1, len(lines)):
        line = lines[j]
        if language == "python":
            if not line.strip():
                continue
            if len(line) - len(line.lstrip()) <= indent:
                break
            end = j
        elif line.rstrip() == " " * indent + "}":
            end = j
            break
    else:
        if language != "python":
            raise ValueError(f"no closing brace for {select!r}")
    return start + 1, end + 1


_CASE_KEYS = {"id", "split", "language", "filename", "source", "select", "through", "instruction",
              "check", "solution"}


def load_cases(path: Path, kind: str = "multiline") -> tuple[EditCase, ...]:
    """The ``[[case]]`` tables of a TOML file as EditCases (the file's header says the keys).

    The selection runs from the block that starts with ``select`` to the end of the block
    that starts with ``through`` (default: ``select``'s own), found as ``_span`` finds one.
    ``kind`` marks every case of the file: "function" or "multiline".
    """
    tables = _read_toml(path).get("case", [])
    cases = []
    for raw in tables:
        unknown = set(raw) - _CASE_KEYS
        if unknown:
            raise ValueError(f"{path.name}: case {raw.get('id')!r} has unknown keys {sorted(unknown)}")
        language = raw["language"]
        source = raw["source"]
        first, _ = _span(source, raw["select"], language)
        _, last = _span(source, raw.get("through", raw["select"]), language)
        cases.append(EditCase(
            id=raw["id"], split=raw["split"], language=language, filename=raw["filename"],
            source=source, lines=(first, last), instruction=raw["instruction"],
            check=_PRELUDES[language] + raw["check"].lstrip("\n"), solution=raw["solution"], kind=kind,
        ))
    return tuple(cases)


FUNCTION_CASES: tuple[EditCase, ...] = load_cases(FUNCTION_FILE, kind="function")
MULTILINE_CASES: tuple[EditCase, ...] = load_cases(MULTILINE_FILE)
CASES: tuple[EditCase, ...] = FUNCTION_CASES + MULTILINE_CASES
