"""No confident edit (sidecar/rewrite_checks.py): a reply that breaks a Python file that
parsed, that changed nothing an instruction asked to change, or that ran away is refused,
through ``run_rewrite`` as through the function; a good edit is not."""

from __future__ import annotations

from typing import Any

from echoline.engine.types import GenerationResult, GenerationStats
from echoline.sidecar.prompts import REPRODUCE_INSTRUCTION
from echoline.sidecar.rewrite import run_rewrite
from echoline.sidecar.rewrite_checks import asks_for_change, no_confident_edit, withholds
from echoline.sidecar.rewrite_stops import AFTER, REPEAT, TOO_LONG

FILE = "import os\n\n\ndef home():\n    return os.path.expanduser('~')\n\n\nprint(home())\n"
START = FILE.index("def home")
END = FILE.index("\n\n\nprint") + 1
SELECTION = FILE[START:END]
GOOD = "def home() -> str:\n    return os.path.expanduser('~')\n"
BROKEN = "def home() -> str:\n    return os.path.expanduser('~'\n"


def test_a_good_edit_is_confident() -> None:
    assert no_confident_edit(FILE, START, END, GOOD, "Add a return type.", name="a.py") is None
    assert no_confident_edit(FILE, START, END, GOOD, "Add a return type.", name="a.py", stopped_by=REPEAT) is None


def test_an_edit_that_breaks_the_parse_is_refused_with_the_line() -> None:
    why = no_confident_edit(FILE, START, END, BROKEN, "Add a return type.", name="file:///w/a.py")
    assert why is not None and why.startswith("no confident edit") and "line" in why and withholds(why)


def test_the_parse_rule_needs_python_and_a_file_that_parsed() -> None:
    assert no_confident_edit(FILE, START, END, BROKEN, "Add a return type.", name="a.js") is None
    broken_file = FILE + "def oops(:\n"
    assert no_confident_edit(broken_file, START, END, BROKEN, "Add a return type.", name="a.py") is None


def test_unchanged_under_an_instruction_is_refused_but_reproducing_is_not() -> None:
    why = no_confident_edit(FILE, START, END, SELECTION, "Add a return type.", name="a.py")
    assert "unchanged" in why and not withholds(why)  # a no-op: nothing to withhold
    assert no_confident_edit(FILE, START, END, SELECTION, "", name="a.py") is None
    assert not asks_for_change(REPRODUCE_INSTRUCTION) and not asks_for_change("  ")


def test_a_reply_a_stop_rule_emptied_is_withheld() -> None:
    """A reply that began with the code after the selection is cut to nothing: applying
    that would delete the selection."""
    why = no_confident_edit(FILE, START, END, "\n", "Rename home.", name="a.py", stopped_by=AFTER)
    assert why and "only repeated" in why and withholds(why)
    assert no_confident_edit(FILE, START, END, "\n", "Delete it.", name="a.py") is None


def test_a_reply_stopped_for_running_on_is_refused() -> None:
    why = no_confident_edit(FILE, START, END, GOOD, "x", name="a.py", stopped_by=TOO_LONG)
    assert "ran on" in why and withholds(why)


class _Tok:
    stop_ids = frozenset()

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) % 1000 for c in text]


class _ScriptedEngine:
    """Answers every generate with ``reply``, fed through the stop predicate as it grows."""

    has_chat_template = False
    tokenizer = _Tok()

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def generate(self, ids: list[int], **kw: Any) -> GenerationResult:
        stop_when = kw["stop_when"]
        for n in range(1, len(self.reply) + 1):
            text = self.reply[:n]
            for s in kw["stop"]:
                if s in text:
                    return GenerationResult(list(range(n)), text[: text.index(s)], "stop", GenerationStats())
            cut = stop_when(text)
            if cut is not None:
                return GenerationResult(list(range(n)), text[:cut], "stop", GenerationStats())
        return GenerationResult(list(range(len(self.reply))), self.reply, "length", GenerationStats())


def test_run_rewrite_reports_refusals_and_stops() -> None:
    out = run_rewrite(_ScriptedEngine(BROKEN + "```"), FILE, START, END, "Add a return type.", name="a.py")
    assert out.refusal and "parse" in out.refusal and out.stopped_by is None and out.withheld == out.refusal
    out = run_rewrite(_ScriptedEngine(SELECTION + "```"), FILE, START, END, "Add a return type.", name="a.py")
    assert out.refusal and out.withheld is None  # unchanged: the server applies the no-op
    out = run_rewrite(_ScriptedEngine(GOOD + "```"), FILE, START, END, "Add a return type.", name="a.py")
    assert out.refusal is None and out.text == GOOD
    out = run_rewrite(_ScriptedEngine(GOOD + "\n" + GOOD + "\n" + GOOD), FILE, START, END, "Add a return type.",
                      name="a.py")
    assert out.stopped_by == REPEAT and out.text == GOOD and out.refusal is None
    # a reply cut by maxTokens is decide's business ("length"), not a refusal
    out = run_rewrite(_ScriptedEngine(BROKEN), FILE, START, END, "Add a return type.", name="a.py")
    assert out.finish_reason == "length" and out.refusal is None


def test_echoline_rewrite_says_no_confident_edit_and_exits_3(tmp_path, monkeypatch, capsys) -> None:
    from echoline.engine.api import Engine
    from echoline.sidecar import rewrite_cli

    engine = _ScriptedEngine(BROKEN + "```")
    engine.warm_up = lambda progress=None: None
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: engine))
    path = tmp_path / "a.py"
    path.write_text(FILE, encoding="utf-8")
    assert rewrite_cli.main([str(path), "--range", "4:5", "--instruction", "Add a return type."]) == 3
    out = capsys.readouterr()
    assert out.out == "" and "no confident edit" in out.err
    engine.reply = GOOD + "```"
    assert rewrite_cli.main([str(path), "--range", "4:5", "--instruction", "Add a return type."]) == 0
    assert capsys.readouterr().out == GOOD
