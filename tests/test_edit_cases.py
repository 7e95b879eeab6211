"""The edit benchmark's checks are honest: each passes on a correct edit and fails on the
unedited file and on an edit that keeps the signature but breaks the body.

No model is involved; every check is run for real (python, node, bash subprocesses).
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import pytest
from echoline.sidecar.bench import edit_checks
from echoline.sidecar.bench.edit_cases import (
    CASES,
    MULTILINE_CASES,
    MULTILINE_FILE,
    EditCase,
    load_cases,
)
from echoline.sidecar.bench.edit_checks import (
    RuntimeUnavailable,
    apply_edit,
    run_check,
    runtime_available,
    split_lines,
)

_IDS = [case.id for case in CASES]
_CHECK_IMPORTS = {"ast", "inspect", "sys", "typing", "check"}


def _need_runtime(case: EditCase) -> None:
    if not runtime_available(case.language):
        pytest.skip(f"no runtime for {case.language}")


def _damaged(case: EditCase) -> str:
    """The solution cut after its function header, with a body that cannot work.

    The header (and anything above it, e.g. an extracted constant) stays, so a check that
    only looked at names, signatures or defaults would still pass: it must fail on this.
    """
    lines = case.solution.splitlines(keepends=True)
    if case.language == "python":
        header = re.compile(r"\s*(async\s+)?def \w+\(.*\).*:\s*$")
    elif case.language == "javascript":
        header = re.compile(r"\s*(async\s+)?function \w+\(.*\)\s*\{\s*$")
    else:
        header = re.compile(r"\s*[\w-]+\s*\(\)\s*\{\s*$")
    at = next(i for i, line in enumerate(lines) if header.match(line))
    indent = re.match(r"\s*", lines[at]).group()
    kept = "".join(lines[: at + 1])
    if case.language == "python":
        return kept + indent + "    raise NotImplementedError\n"
    if case.language == "javascript":
        return kept + indent + "  throw new Error('damaged edit');\n" + indent + "}\n"
    return kept + indent + "  return 97\n" + indent + "}\n"


def test_case_set_shape() -> None:
    assert len(CASES) >= 30
    assert len(set(_IDS)) == len(_IDS), "case ids must be unique"
    splits = Counter(case.split for case in CASES)
    assert set(splits) == {"tune", "heldout"}
    assert splits["heldout"] >= 10
    languages = Counter(case.language for case in CASES)
    assert set(languages) == {"python", "javascript", "bash"}
    filenames = [case.filename for case in CASES]
    assert len(set(filenames)) == len(filenames), "module file names must be unique"
    assert {case.kind for case in CASES} == {"function", "multiline"}


def test_multiline_set_shape() -> None:
    """The multi-line refactors (issue 49): both splits, Python plus some JS and shell."""
    multi = [case for case in CASES if case.kind == "multiline"]
    assert multi == list(MULTILINE_CASES)
    splits = Counter(case.split for case in multi)
    assert splits["tune"] >= 8 and splits["heldout"] >= 8
    assert {case.language for case in multi} == {"python", "javascript", "bash"}
    for split in ("tune", "heldout"):
        assert Counter(c.language for c in multi if c.split == split)["python"] >= 5


def test_a_case_file_with_an_unknown_key_is_refused(tmp_path) -> None:
    path = tmp_path / "cases.toml"
    path.write_text(MULTILINE_FILE.read_text(encoding="utf-8").replace("\nthrough = ", "\nthrow = ", 1),
                    encoding="utf-8")
    with pytest.raises(ValueError, match="unknown keys"):
        load_cases(path)


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_case_is_well_formed(case: EditCase) -> None:
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", case.id)
    assert case.split in {"tune", "heldout"}
    ext = {"python": ".py", "javascript": ".js", "bash": ".sh"}[case.language]
    assert case.filename.endswith(ext) and "/" not in case.filename
    source_lines = split_lines(case.source)
    start, end = case.lines
    assert 1 <= start <= end <= len(source_lines)
    if case.kind == "multiline":  # several functions or a class in a 20-60-line file
        assert 20 <= len(source_lines) <= 60
        assert 5 <= end - start + 1 <= 40
    else:
        assert 10 <= len(source_lines) <= 40
        assert end - start + 1 <= 15
    assert case.solution.endswith("\n")
    selected = "".join(source_lines[start - 1 : end])
    assert selected != case.solution
    assert case.instruction.strip() and "\n" not in case.instruction
    if case.language == "python":
        module = case.filename.removesuffix(".py")
        assert module not in sys.stdlib_module_names and module not in _CHECK_IMPORTS
    if case.language == "javascript":
        assert case.source.rstrip().split("\n")[-1].startswith("module.exports = {")
        assert end < len(source_lines), "module.exports must stay outside the selection"


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_check_passes_on_solution(case: EditCase) -> None:
    _need_runtime(case)
    passed, output = run_check(case, apply_edit(case, case.solution))
    assert passed, output


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_check_fails_on_unedited_source(case: EditCase) -> None:
    _need_runtime(case)
    passed, output = run_check(case, case.source)
    assert not passed, f"the check passes without the edit:\n{output}"


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_check_fails_on_damaged_edit(case: EditCase) -> None:
    _need_runtime(case)
    passed, output = run_check(case, apply_edit(case, _damaged(case)))
    assert not passed, f"the check passes on a broken body:\n{output}"


def test_apply_edit_replaces_only_the_selection() -> None:
    case = CASES[0]
    start, end = case.lines
    edited = apply_edit(case, "X\nY")  # a missing final newline is added
    before = split_lines(case.source)
    after = split_lines(edited)
    assert after[: start - 1] == before[: start - 1]
    assert after[start - 1 : start + 1] == ["X\n", "Y\n"]
    assert after[start + 1 :] == before[end:]
    assert apply_edit(case, "".join(before[start - 1 : end])) == case.source


def test_split_lines_only_splits_on_newline() -> None:
    assert split_lines("a\fb\rc\u2028d\ne") == ["a\fb\rc\u2028d\n", "e"]
    assert split_lines("a\n\n") == ["a\n", "\n"]
    assert split_lines("") == []


def test_timeout_is_a_failure() -> None:
    case = next(c for c in CASES if c.language == "python")
    passed, output = run_check(case, "while True:\n    pass\n", timeout_s=1.0)
    assert not passed
    assert "timed out" in output


def test_missing_runtime_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in CASES if c.language == "javascript")
    monkeypatch.setattr(edit_checks.shutil, "which", lambda name: None)
    assert not runtime_available("javascript")
    assert runtime_available("python")
    with pytest.raises(RuntimeUnavailable):
        run_check(case, case.source)


# Different but correct edits (other idioms, an added docstring or comment, other quotes,
# odd spacing): the checks must accept them, not one exact text.
_ALTERNATIVES = {
    "py-rename-param": (
        "def lerp(a, b, weight):\n"
        "    '''Blend a towards b.'''\n"
        "    return a + (b - a) * clamp(weight, 0.0, 1.0)\n"
    ),
    "py-hints-mean": (
        "def mean(values: list[float] | tuple[float, ...]) -> float:\n"
        "    return sum(values) / len(values) if values else 0.0\n"
    ),
    "py-fstring-percent": (
        "def stock_line(item):\n"
        "    name, count = item['name'], item['count']\n"
        "    if not count:\n"
        "        return f'{name}: out of stock'\n"
        '    price = item["price"]\n'
        "    return f'{name}: {count:d} in stock ({price:.2f} each)'\n"
    ),
    "py-guard-empty": (
        "def average(samples):\n"
        "    if len(samples) == 0:\n"
        "        raise ValueError('no samples')\n"
        "    return sum(samples) / len(samples)\n"
    ),
    "py-listcomp": (
        "def even_squares(numbers):\n"
        "    # keep the even ones, squared\n"
        "    result = [\n"
        "        n ** 2\n"
        "        for n in numbers\n"
        "        if not n % 2\n"
        "    ]\n"
        "    return result\n"
    ),
    "py-extract-constant": (
        "TAX_RATE = 0.2  # UK standard VAT\n"
        "\n"
        "def invoice_total(lines):\n"
        "    net = sum(qty * price for qty, price in lines)\n"
        "    return round(net * (1 + TAX_RATE), 2)\n"
    ),
    "py-max": "def longest_word(words):\n    return max(words, key=lambda w: len(w))\n",
    "py-enumerate": (
        "def numbered(lines, start=1):\n"
        "    return [f'{n}: {line}' for n, line in enumerate(lines, start=start)]\n"
    ),
    "py-zip": "def pair_scores(names, scores):\n    return dict(zip(names, scores))\n",
    "py-with-open": (
        "def read_settings(path):\n"
        "    with open(path, encoding='utf-8') as f:\n"
        "        lines = [line.strip() for line in f]\n"
        "    pairs = (line.partition('=') for line in lines if line and line[0] != '#')\n"
        "    return {key.strip(): value.strip() for key, _, value in pairs}\n"
    ),
    "py-add-param": (
        "def join_names(names, *, sep=', '):\n"
        "    return sep.join(n.strip() for n in names if n.strip())\n"
    ),
    "js-map": (
        "function displayNames(users) {\n"
        "  return users.map(({ first, last }) => `${first} ${last}`);\n"
        "}\n"
    ),
    "js-let-const": (
        "function wordFrequencies(text) {\n"
        "  const counts = {};\n"
        "  for (const w of text.toLowerCase().split(/\\W+/)) {\n"
        "    if (w) counts[w] = (counts[w] ?? 0) + 1;\n"
        "  }\n"
        "  return counts;\n"
        "}\n"
    ),
    "sh-local-vars": (
        "sum_args() {\n"
        "  local total=0\n"
        "  local n\n"
        '  for n in "$@"; do ((total += n)); done\n'
        '  echo "$total"\n'
        "}\n"
    ),
}


@pytest.mark.parametrize("case_id", sorted(_ALTERNATIVES))
def test_check_accepts_other_correct_edits(case_id: str) -> None:
    case = next(c for c in CASES if c.id == case_id)
    _need_runtime(case)
    passed, output = run_check(case, apply_edit(case, _ALTERNATIVES[case_id]))
    assert passed, output


def test_bench_picks_the_multiline_set_and_counts_runaways() -> None:
    from echoline.sidecar.bench.edits import _runaway, pick_cases

    multi = pick_cases("heldout", [], "multiline")
    assert multi and all(c.kind == "multiline" and c.split == "heldout" for c in multi)
    assert len(pick_cases("all", [], "all")) == len(CASES)
    assert all(c.kind == "function" for c in pick_cases("tune", [], "function"))
    rows = [
        {"finish_reason": "length", "duplicates_after": False, "stopped_by": None, "refusal": None},
        {"finish_reason": "stop", "duplicates_after": True, "stopped_by": None, "refusal": None},
        {"finish_reason": "stop", "duplicates_after": False, "stopped_by": "repeat", "refusal": None},
        {"finish_reason": "stop", "duplicates_after": False, "stopped_by": "too-long", "refusal": "no confident edit"},
    ]
    assert _runaway(rows) == {"count": 2, "length": 1, "duplicates_after": 1,
                              "stopped": {"repeat": 1, "too-long": 1}, "refused": 1}
