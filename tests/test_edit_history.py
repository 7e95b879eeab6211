"""sidecar.edit_history: coalescing, bounds, diffs and secrets (pure data, no model)."""

from __future__ import annotations

from echoline.sidecar.edit_history import EditHistory, changed_span, common_prefix_len, render_event

SRC = "".join(f"line{i} = value{i}\n" for i in range(40))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _sub(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


def test_prefix_and_span() -> None:
    assert common_prefix_len("abcdef", "abcxef") == 3
    assert common_prefix_len("abc", "abc") == 3
    assert changed_span("a b c", "a bb c") == (3, 3, 4, 2)
    assert changed_span("same", "same") is None


def test_keystrokes_coalesce_into_one_event() -> None:
    clock = Clock()
    h = EditHistory(clock=clock)
    h.opened("file:///w/a.py", SRC)
    text = SRC
    for ch in "abc":  # three keystrokes on line 5, 0.2 s apart
        clock.t += 0.2
        text = _sub(text, "value5\n", f"value5{ch}\n") if ch == "a" else _sub(text, "value5a", f"value5a{ch}") \
            if ch == "b" else _sub(text, "value5ab", "value5abc")
        h.changed("file:///w/a.py", text)
    evs = h.events()
    assert len(evs) == 1
    ev = evs[0]
    assert ev.path == "a.py" and ev.removed == "" and ev.added == "abc"
    assert "-line5 = value5\n+line5 = value5abc\n" in ev.diff
    assert ev.diff.startswith("--- a/a.py\n+++ b/a.py\n@@ -4,5 +4,5 @@")


def test_pause_and_distance_start_new_events() -> None:
    clock = Clock()
    h = EditHistory(clock=clock)
    uri = "file:///w/a.py"
    h.opened(uri, SRC)
    t1 = _sub(SRC, "value3\n", "VALUE3\n")
    h.changed(uri, t1)
    clock.t += 0.3
    t2 = _sub(t1, "value30\n", "VALUE30\n")  # 27 lines away: a new event
    h.changed(uri, t2)
    clock.t += 2.0  # a pause: the next edit nearby is a new event too
    t3 = _sub(t2, "value31\n", "VALUE31\n")
    h.changed(uri, t3)
    evs = h.events()
    assert [(e.removed, e.added) for e in evs] == [("value", "VALUE"), ("value", "VALUE"), ("value", "VALUE")]
    assert "-line3 = value3" in evs[0].diff and "-line30 = value30" in evs[1].diff
    assert "-line31 = value31" in evs[2].diff and "line30" not in evs[2].diff.replace("line30 = VALUE30", "")


def test_bounds_and_undone_edits() -> None:
    clock = Clock()
    h = EditHistory(clock=clock, max_events=3)
    uri = "file:///w/a.py"
    h.opened(uri, SRC)
    text = SRC
    for i in range(0, 40, 10):  # four events far apart
        clock.t += 2
        text = _sub(text, f"value{i}\n", f"v{i}\n")
        h.changed(uri, text)
    assert [e.added for e in h.events()] == ["", "", ""] and len(h.events()) == 3
    assert "-line10 = value10" in h.events()[0].diff
    clock.t += 2
    back = _sub(text, "v30\n", "value30\n")  # undoes the newest... as a new event after a pause
    h.changed(uri, back)
    assert len(h.events()) == 3
    # an edit typed and undone within one event leaves nothing
    h2 = EditHistory(clock=clock)
    h2.opened(uri, SRC)
    h2.changed(uri, _sub(SRC, "value7", "valueX7"))
    h2.changed(uri, SRC)
    assert h2.events() == []
    # a paste larger than an event may be is dropped
    h3 = EditHistory(clock=clock, max_event_bytes=200)
    h3.opened(uri, SRC)
    h3.changed(uri, SRC.replace("line2 = value2\n", "line2 = value2\n" + "x = 1\n" * 100))
    assert h3.events() == []
    big = EditHistory(clock=clock, max_bytes=300)
    big.opened(uri, SRC)
    text = SRC
    for i in range(0, 40, 10):
        clock.t += 2
        text = _sub(text, f"value{i}\n", f"w{i}\n")
        big.changed(uri, text)
    assert sum(e.size for e in big.events()) <= 300 and big.events()


def test_secret_files_never_enter() -> None:
    secret = "file:///w/.env"
    h = EditHistory(is_secret=lambda uri: uri.endswith("/.env"))
    h.opened(secret, "TOKEN=abc\n")
    h.changed(secret, "TOKEN=hunter2\n")
    h.opened("file:///w/a.py", SRC)
    h.changed("file:///w/a.py", _sub(SRC, "value1\n", "v1\n"))
    evs = h.events()
    assert len(evs) == 1 and all("hunter2" not in e.diff and "TOKEN" not in e.diff for e in evs)
    assert h.text_of(secret) is None


def test_unopened_and_closed_documents() -> None:
    h = EditHistory()
    h.changed("file:///w/b.py", "x = 1\n")  # never opened: no before, no event
    assert h.events() == []
    h.opened("file:///w/b.py", "x = 1\n")
    h.changed("file:///w/b.py", "x = 2\n")
    h.closed("file:///w/b.py")
    assert [e.added for e in h.events()] == ["2"]


def test_render_event_crlf_and_headers() -> None:
    ev = render_event("u", "pkg/m.py", "a\r\nb\r\nc\r\n", "a\r\nB\r\nc\r\n")
    assert ev is not None and ev.diff == "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    assert ev.before == "a\r\nb\r\nc\r\n" and ev.after == "a\r\nB\r\nc\r\n"
