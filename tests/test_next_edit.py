"""Edit predictions: the stop rule, minimal edits, the undo guard, the bench's cases and
baseline (no model), and exactness with the real Qwen2.5-Coder-0.5B: the shown edit and the
reply tokens it used are the same with speculation, with plain decoding, and with plain
decoding run to the reply's end (no early stop)."""

from __future__ import annotations

import pytest
from echoline.sidecar.bench.next_edit import baseline_predict, case_events, load_cases
from echoline.sidecar.edit_history import EditHistory
from echoline.sidecar.next_edit import (
    FORMATS,
    Edit,
    Hunk,
    NoEdit,
    first_hunk,
    hunk_edit,
    make_region,
    prompt_parts,
    run_next_edit,
    undoes,
)
from echoline.sidecar.next_edit_repeat import apply_edit as apply
from echoline.sidecar.next_edit_request import Answer, copilot_result, secret_rule
from lsprotocol import types
from lsprotocol.converters import get_converter

OLD = ["a = 1\n", "b = 2\n", "c = 3\n", "d = 4\n", "e = 5\n", "f = 6\n"]


def test_first_hunk_waits_for_the_rejoin_and_never_changes_after() -> None:
    assert first_hunk(OLD, "a = 1\nb = 2\n", False) is None  # still copying
    assert first_hunk(OLD, "a = 1\nB = 2\nc = 3\n", False) is None  # one line re-joined: not yet
    reply = "a = 1\nB = 2\nc = 3\nd = 4\n"
    got = first_hunk(OLD, reply, False)
    assert got == Hunk(1, 2, ("B = 2",))
    for more in ("e", "e = 5\n", "e = 5\nXX\n", "zzz\nqqq\n"):  # more reply: the same answer
        assert first_hunk(OLD, reply + more, False) == got
    assert first_hunk(OLD, "a = 1\nb = 2\n", True) == NoEdit("stopped early")
    assert first_hunk(OLD, "".join(OLD), False) == NoEdit("unchanged")
    # a deletion, an insertion
    assert first_hunk(OLD, "a = 1\nc = 3\nd = 4\n", False) == Hunk(1, 2, ())
    assert first_hunk(OLD, "a = 1\nnew\nb = 2\nc = 3\n", False) == Hunk(1, 1, ("new",))
    # blank lines alone do not re-join
    blank = ["x\n", "\n", "\n", "y\n", "z\n"]
    assert first_hunk(blank, "X\n\n\n", False) is None
    # a reply that wanders off gives up
    assert first_hunk(OLD, "a = 1\n" + "junk\n" * 12, False) == NoEdit("diverged")
    # a change on the region's last line re-joins in the lines after it (region_len)
    ext = OLD + ["g = 7\n", "h = 8\n"]
    assert first_hunk(ext, "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nF = 6\ng = 7\nh = 8\n", False, 6) == Hunk(5, 6, ("F = 6",))
    assert first_hunk(ext, "".join(OLD) + "g = 7\n", False, 6) == NoEdit("unchanged")


def test_hunk_edit_is_minimal_and_keeps_line_breaks() -> None:
    text = "x = 0\r\n" + "".join(line.replace("\n", "\r\n") for line in OLD)
    region = make_region(text, text.index("b = 2"), 2, 2)
    assert region.first_line == 0 and region.newline == "\r\n"
    edit = hunk_edit(region, Hunk(2, 3, ("b = 20",)))
    assert edit is not None and text[edit.start : edit.end] == "" and edit.text == "0"
    assert apply(text, edit) == text.replace("b = 2\r\n", "b = 20\r\n")
    assert hunk_edit(region, Hunk(2, 3, ("b = 2",))) is None
    rng, new = edit.lsp(text)
    assert (rng.start.line, rng.start.character, rng.end.character, new) == (2, 5, 5, "0")


def test_undo_guard() -> None:
    h = EditHistory()
    h.opened("u", "print(x)\nprint(y)\n")
    h.changed("u", "log(x)\nprint(y)\n")
    ev = h.events()[-1]
    text = "log(x)\nprint(y)\n"
    assert undoes(text, Edit(0, 3, "print"), ev)
    assert not undoes(text, Edit(7, 12, "log"), ev)


def test_bench_cases_and_baseline() -> None:
    cases = load_cases()
    assert {c.split for c in cases} == {"tune", "heldout"}
    assert all(c.licence and c.repo and len(c.commit) == 40 for c in cases)
    assert all(c.before != c.edited != c.expected for c in cases)
    case = cases[0]
    events = case_events(case)
    assert len(events) == 1 and events[0].path == case.path
    hits = 0
    for c in cases:
        ev = case_events(c)
        edit = baseline_predict(c.edited, c.cursor, ev[-1] if ev else None)
        hits += edit is not None and apply(c.edited, edit) == c.expected
    assert 0 < hits < len(cases)


def test_secret_rule_without_an_index() -> None:
    rule = secret_rule(lambda: None)
    assert rule("file:///w/.env") and rule("file:///home/u/.ssh/config") and not rule("file:///w/app.py")
    h = EditHistory(rule)
    h.opened("file:///w/.env", "KEY=1\n")
    h.changed("file:///w/.env", "KEY=2\n")
    assert h.events() == []


def test_copilot_result_shape() -> None:
    conv = get_converter()
    rng = types.Range(start=types.Position(line=1, character=2), end=types.Position(line=1, character=5))
    out = copilot_result(Answer("file:///w/a.py", 3, [(rng, "new")]), conv)
    assert out == {"edits": [{"range": {"start": {"line": 1, "character": 2}, "end": {"line": 1, "character": 5}},
                              "text": "new", "textDocument": {"uri": "file:///w/a.py", "version": 3}}]}
    assert copilot_result(Answer("file:///w/a.py", 3, superseded=True), conv) == {"edits": []}


# ---- the real model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen():
    from echoline.engine.api import Engine

    return Engine.load("qwen2.5-coder-0.5b")


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "case_id"), [
    ("filesep", "click-051725fa7e"),  # the reply shows a hunk
    ("filesep", "click-b24209a225-2"),  # the reply copies the region: no edit
    ("zeta", "click-b24209a225-2"),  # another format; the reply shows a hunk
])
def test_shown_edit_is_plain_decodings(qwen, fmt: str, case_id: str) -> None:
    """Speculative (early stop) == plain (early stop) == plain to the end, over the tokens
    the decision used, and the same edit, on bench prompts (token ids compared)."""
    assert FORMATS[fmt]
    for n, case in enumerate(load_cases(ids=[case_id])):
        parts = prompt_parts(case.path, case.edited, case.cursor, case_events(case), case.uri)
        spec = run_next_edit(qwen, parts, fmt=fmt, spec=True, session=f"t-spec-{fmt}-{n}")
        plain = run_next_edit(qwen, parts, fmt=fmt, spec=False, session=f"t-plain-{fmt}-{n}")
        full = run_next_edit(qwen, parts, fmt=fmt, spec=False, early_stop=False, session=f"t-full-{fmt}-{n}")
        used = spec.used_tokens
        assert used == plain.used_tokens == full.used_tokens, (spec.reason, plain.reason, full.reason)
        assert spec.token_ids[:used] == plain.token_ids[:used] == full.token_ids[:used]
        assert spec.edits == plain.edits == full.edits and spec.reason == plain.reason == full.reason
        assert len(full.token_ids) >= len(plain.token_ids)  # the stop cut the reply, or it ended itself
        for s in (f"t-spec-{fmt}-{n}", f"t-plain-{fmt}-{n}", f"t-full-{fmt}-{n}"):
            qwen.sessions.drop(s)


def test_gate_keeps_only_repeats_of_the_last_change() -> None:
    from echoline.sidecar.bench.next_edit import repeats_last

    h = EditHistory()
    h.opened("u", "print(x)\nprint(y)\n")
    h.changed("u", "log(x)\nprint(y)\n")
    ev = h.events()[-1]
    text = "log(x)\nprint(y)\n"
    assert repeats_last(text, Edit(7, 12, "log"), ev)
    assert not repeats_last(text, Edit(13, 14, "z"), ev)
    assert not repeats_last(text, Edit(7, 12, "print"), None)
