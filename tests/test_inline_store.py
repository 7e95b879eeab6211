"""The inline store (``sidecar/inline_store.py``): typing through a shown suggestion, its
departure, and recent results for undo/backspace; and where an accepted suggestion leaves
the cursor (``sidecar.inline.accepted``)."""

from __future__ import annotations

from echoline.sidecar.inline import accepted
from echoline.sidecar.inline_store import InlineStore, typed_through

URI = "file:///a.py"
TAG = ("engine", 64, None)
P, S = "def area(r):\n    return ", "\n\nprint(area(2))\n"
C = "math.pi * r ** 2"


def test_typing_through_a_shown_suggestion_answers_its_rest() -> None:
    store = InlineStore()
    store.shown(URI, P, S, C, TAG)
    for n in range(len(C)):
        hit = store.lookup(URI, P + C[:n], S, TAG)
        assert hit is not None and hit.text == C[n:] and hit.typed == n
        assert (hit.source, P + C[:n] + hit.text) == ("typed" if n else "typed", P + C)
    # backspace inside the typed part: still the same suggestion's rest
    assert store.lookup(URI, P + C[:3], S, TAG).text == C[3:]
    # departed, then undone back to a typed-through state: its answer was kept
    assert store.lookup(URI, P + C[:3] + "#", S, TAG) is None
    hit = store.lookup(URI, P + C[:3], S, TAG)
    assert hit is not None and (hit.text, hit.source) == (C[3:], "recent")


def test_departing_drops_the_suggestion() -> None:
    store = InlineStore()
    store.shown(URI, P, S, C, TAG)
    assert store.lookup(URI, P + "math.x", S, TAG) is None  # a character it does not continue with
    assert store.on_screen(URI) is None
    # dropped for good: typing its next character again no longer answers from it
    assert store.lookup(URI, P + "m", S, TAG) is None


def test_other_departures() -> None:
    shown = InlineStore()
    shown.shown(URI, P, S, C, TAG)
    got = shown.on_screen(URI)
    assert got is not None
    assert typed_through(got, P + "m", S + "x") is None  # text after the cursor changed
    assert typed_through(got, P[:-1] + "m", S) is None  # text before the shown place changed
    assert typed_through(got, P + C, S) is None  # all of it typed: a new request
    assert typed_through(got, P[:-2], S) is None  # backspace past the place it was shown at
    assert typed_through(got, P + "ma", S) == 2
    store = InlineStore()
    store.shown(URI, P, S, C, TAG)
    assert store.lookup(URI, P + "m", S, ("other engine", 64, None)) is None  # another model or limits
    store.shown(URI, P, S, C, TAG)
    assert store.lookup("file:///b.py", P + "m", S, TAG) is None  # another document


def test_recent_results_answer_undo_and_backspace() -> None:
    store = InlineStore(per_doc=3)
    store.shown(URI, P, S, C, TAG)
    store.shown(URI, P + "x", S, "yz", TAG)  # typed x: departed; the model answered "yz"
    hit = store.lookup(URI, P, S, TAG)  # backspace: back where C was shown
    assert hit is not None and (hit.text, hit.source) == (C, "recent")
    store.remember(URI, P + "q", S, "", TAG)  # "nothing to suggest" is kept too
    assert store.lookup(URI, P + "q", S, TAG).text == ""
    for i in range(3):
        store.remember(URI, P + str(i), S, f"r{i}", TAG)
    assert store.lookup(URI, P, S, TAG) is None, "the oldest fell out of the per-document LRU"
    assert store.lookup(URI, P + "2", S, TAG).text == "r2"
    assert not store.has(URI, P + "2", S + " ", TAG)
    store.closed(URI)
    assert store.lookup(URI, P + "2", S, TAG) is None


def test_accepting_moves_the_cursor_past_the_suggestion() -> None:
    # pure insertion: the text after the cursor stays
    assert accepted("x = f(", ")\ny", ")", "a, b") == ("x = f(a, b", ")\ny")
    # the item replaces a rest of the line that the completion repeats
    assert accepted("x = f(", ")\ny", ")", "a, b)") == ("x = f(a, b)", "\ny")
    # and a blank rest of the line
    assert accepted("x = ", "   \ny", "   ", "1") == ("x = 1", "\ny")


def test_typing_within_a_line_stops_at_its_end() -> None:
    from echoline.sidecar.inline import line_end, typing_in_line

    assert typing_in_line("    x = f(") and not typing_in_line("    ") and not typing_in_line("")
    assert line_end("a, b)\n    return x") == len("a, b)")
    assert line_end("a, b)") is None  # the line goes on
    assert line_end("\n    return x\n") is None  # a reply that starts a new line: a block
    assert line_end("  \n    return x") is None
