"""The no-model edit predictor (``sidecar/next_edit_repeat.py``): the user's last change at its
next place, through the same edit history the server keeps."""

from __future__ import annotations

from echoline.sidecar.config import Settings, apply
from echoline.sidecar.edit_history import EditHistory
from echoline.sidecar.next_edit_repeat import apply_edit, repeat_last_edit

SRC = "def a(x):\n    print(x)\n    return x\n\ndef b(y):\n    print(y)\n    return y\n\ndef c(z):\n    print(z)\n"
URI = "file:///w/m.py"


def _event(before: str, after: str):
    h = EditHistory()
    h.opened(URI, before)
    h.changed(URI, after)
    return h.events()[-1]


def test_a_replacement_repeats_at_the_next_place_after_the_cursor():
    after = SRC.replace("print(x)", "log.info(x)")
    cursor = after.index("log.info(x)") + len("log.info")
    edit = repeat_last_edit(after, cursor, _event(SRC, after))
    assert apply_edit(after, edit) == after.replace("print(y)", "log.info(y)")


def test_an_insertion_repeats_after_its_anchor():
    src = "r1 = fetch(a)\nr2 = fetch(b)\nr3 = fetch(c)\n"
    after = src.replace("r1 = fetch", "r1 = await fetch")
    edit = repeat_last_edit(after, after.index("fetch(a)"), _event(src, after))
    assert apply_edit(after, edit) == after.replace("r2 = fetch", "r2 = await fetch")


def test_before_the_cursor_when_nothing_follows_and_none_when_all_done():
    after = SRC.replace("print(z)", "log.info(z)")
    edit = repeat_last_edit(after, len(after), _event(SRC, after))
    assert apply_edit(after, edit) == after.replace("print(y)", "log.info(y)")  # the nearest before
    done = SRC.replace("print(", "log.info(")
    partly = SRC.replace("print(x)", "log.info(x)").replace("print(y)", "log.info(y)")
    assert repeat_last_edit(done, len(done), _event(partly, done)) is None


def test_outside_the_region_nothing():
    src = "x = old\n" + "pass\n" * 30 + "y = old\n"
    after = src.replace("x = old", "x = new", 1)
    assert repeat_last_edit(after, 0, _event(src, after), region_lines=10) is None
    assert repeat_last_edit(after, 0, _event(src, after), region_lines=40) is not None


def test_no_event_or_a_blank_anchor_gives_nothing():
    assert repeat_last_edit(SRC, 0, None) is None
    src = "a\n\nb\n"
    after = "a\n\n    \nb\n"  # an insertion after nothing but a line start: no anchor
    assert repeat_last_edit(after, 4, _event(src, after)) is None


def test_the_predictor_setting():
    s = Settings()
    assert s.next_edit_predictor == "repeat"
    both, errors = apply(s, {"nextEditPredictor": "both"})
    assert both.next_edit_predictor == "both" and not errors
    kept, errors = apply(s, {"nextEditPredictor": "oracle"})
    assert kept.next_edit_predictor == "repeat" and "repeat, model, both" in errors[0]
