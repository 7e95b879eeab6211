"""sidecar.lsp_utils: LSP line ends and position encodings, without a server.

The LSP breaks lines on ``\\n``, ``\\r\\n`` and ``\\r`` only, and counts a position's
character in the negotiated encoding's code units; ``str.splitlines`` (what pygls'
TextDocument uses) also breaks on form feeds, ``\\v``, ``\\x1c``-``\\x1e``, ``\\x85``,
U+2028 and U+2029, and Python indexes code points.
"""

from __future__ import annotations

import pytest
from echoline.sidecar.inline import completion_end
from echoline.sidecar.lsp_utils import (
    UTF8,
    UTF16,
    UTF32,
    PositionError,
    apply_change,
    check_position,
    line_bounds,
    line_count,
    line_start,
    lsp_lines,
    normalize_encoding,
    offset_at,
    position_at,
    rest_of_line,
    unit_len,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types

ENCODINGS = (UTF8, UTF16, UTF32)
NOT_LSP_BREAKS = "\f\v\x1c\x1d\x1e\x85\u2028\u2029"
GRIN = "\U0001f600"  # 😀: 4 UTF-8 bytes, 2 UTF-16 units, 1 code point
FRAKTUR_U = "\U0001d518"  # 𝔘
COMBINING = "e\u0301"  # e + COMBINING ACUTE ACCENT: two code points, one glyph


def P(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


# ---- lines -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sep", list(NOT_LSP_BREAKS))
def test_only_lsp_line_ends_split_lines(sep: str) -> None:
    text = f"a{sep}b\nc"
    assert len(text.splitlines()) == 3  # what pygls would see
    assert lsp_lines(text) == [f"a{sep}b\n", "c"]
    assert line_count(text) == 2
    assert check_position(text, P(0, 3), UTF16) == 3  # the end of "a?b", not past it
    assert check_position(text, P(1, 1), UTF16) == len(text)


def test_crlf_and_lone_cr_are_one_line_end_each() -> None:
    text = "a\r\nb\rc\n\rd"
    assert lsp_lines(text) == ["a\r\n", "b\r", "c\n", "\r", "d"]
    assert line_count(text) == 5
    assert [check_position(text, P(i, 0)) for i in range(5)] == [0, 3, 5, 7, 8]
    assert check_position(text, P(0, 1)) == 1  # before the "\r\n"
    with pytest.raises(PositionError, match="past the end"):
        check_position(text, P(0, 2))  # the "\r\n" is not part of the line
    assert "".join(lsp_lines(text)) == text


def test_line_counts_and_bounds_at_the_edges() -> None:
    assert lsp_lines("") == [] and line_count("") == 1
    assert check_position("", P(0, 0)) == 0
    assert lsp_lines("a\n") == ["a\n"] and line_count("a\n") == 2
    assert check_position("a\n", P(1, 0)) == 2  # the empty last line
    assert line_bounds("a\r\nb", 0) == (0, 1, 3)
    assert line_bounds("a\r\nb", 1) == (3, 4, 4)
    assert line_bounds("a\r\nb", 2) is None and line_bounds("a", -1) is None


# ---- encodings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("s", "units"),
    [
        ("abc", (3, 3, 3)),
        ("é", (2, 1, 1)),
        ("€", (3, 1, 1)),
        (GRIN, (4, 2, 1)),
        (FRAKTUR_U, (4, 2, 1)),
        (COMBINING, (3, 2, 2)),
        ("\ud83d", (3, 1, 1)),  # a lone surrogate (JSON "\ud83d") still has a width
    ],
)
def test_unit_len(s: str, units: tuple[int, int, int]) -> None:
    assert tuple(unit_len(s, e) for e in ENCODINGS) == units


def test_normalize_encoding() -> None:
    assert normalize_encoding(types.PositionEncodingKind.Utf8) == UTF8
    assert normalize_encoding("utf-32") == UTF32
    assert normalize_encoding(None) == UTF16 and normalize_encoding("latin-1") == UTF16


@pytest.mark.parametrize(
    ("encoding", "end"), [(UTF8, 5 + 4 + 2 + 1 + 2 + 1), (UTF16, 11), (UTF32, 10)]
)
def test_end_of_non_ascii_line_in_each_encoding(encoding: str, end: int) -> None:
    line = f"x = '{GRIN}é{COMBINING}'"  # 10 code points
    text = line + "\nnext"
    assert unit_len(line, encoding) == end
    assert check_position(text, P(0, end), encoding) == len(line)
    with pytest.raises(PositionError, match="past the end of line 0"):
        check_position(text, P(0, end + 1), encoding)
    assert position_at(text, len(line), encoding) == P(0, end)


def test_positions_inside_a_character_are_refused_strictly_and_rounded_down_leniently() -> None:
    text = f"a{GRIN}b"
    with pytest.raises(PositionError, match="inside a character.*UTF-16"):
        check_position(text, P(0, 2), UTF16)  # between the surrogates
    for inside in (2, 3, 4):
        with pytest.raises(PositionError, match="inside a character"):
            check_position(text, P(0, inside), UTF8)
    assert check_position(text, P(0, 3), UTF16) == 2
    assert check_position(text, P(0, 5), UTF8) == 2
    assert check_position(text, P(0, 2), UTF32) == 2
    assert offset_at(text, P(0, 2), UTF16) == 1  # the character's start
    assert offset_at(text, P(0, 4), UTF8) == 1


def test_strict_errors_name_the_problem() -> None:
    text = "x = 1\n"
    with pytest.raises(PositionError, match="out of bounds: the document has 2 line"):
        check_position(text, P(9, 0), UTF16, "range.end")
    with pytest.raises(PositionError, match="range.start 0:80 is past the end of line 0"):
        check_position(text, P(0, 80), UTF16, "range.start")
    with pytest.raises(PositionError, match="is negative"):
        check_position(text, _Neg())


class _Neg:
    """A position lsprotocol would not build (its validators refuse negatives)."""

    line = -1
    character = 0


def test_lenient_offsets_clamp_as_the_lsp_says() -> None:
    text = "ab\r\ncd"
    assert offset_at(text, P(0, 99)) == 2  # the line's end, not into the next line
    assert offset_at(text, P(7, 3)) == len(text)
    with pytest.raises(PositionError):
        offset_at(text, _Neg())


def test_position_at_inside_crlf_is_the_line_end() -> None:
    text = "ab\r\ncd"
    assert position_at(text, 3) == P(0, 2)
    assert position_at(text, 4) == P(1, 0)
    assert position_at(text, -5) == P(0, 0) and position_at(text, 99) == P(1, 2)


# ---- helpers the server uses -----------------------------------------------------------------


def test_rest_of_line_and_line_start() -> None:
    text = "ab\fcd)\rnext\r\nlast"
    off = text.index("cd")
    assert rest_of_line(text, off) == "cd)"
    assert line_start(text, off) == 0  # the form feed is inside line 0
    nxt = text.index("next")
    assert line_start(text, nxt + 2) == nxt and rest_of_line(text, nxt + 2) == "xt"
    assert line_start(text, text.index("\n")) == nxt  # inside the CRLF: still line 1
    assert rest_of_line(text, len(text)) == ""


def test_apply_change_over_lsp_lines() -> None:
    text = "a\fb\nc\u2028d\n"
    rng = types.Range(start=P(0, 2), end=P(0, 3))  # the "b" after the form feed
    assert apply_change(text, rng, "XYZ", UTF16) == "a\fXYZ\nc\u2028d\n"
    whole_line = types.Range(start=P(1, 0), end=P(2, 0))
    assert apply_change(text, whole_line, "", UTF16) == "a\fb\n"
    emoji = f"{GRIN}!"
    for enc, col in ((UTF8, 4), (UTF16, 2), (UTF32, 1)):
        assert apply_change(emoji, types.Range(start=P(0, col), end=P(0, col + 1)), "?", enc) == (
            f"{GRIN}?"
        )
    backwards = types.Range(start=P(0, 3), end=P(0, 2))
    assert apply_change(text, backwards, "", UTF16) == "a\f\nc\u2028d\n"
    past = types.Range(start=P(9, 0), end=P(9, 0))
    assert apply_change("x", past, "\ny", UTF16) == "x\ny"


def test_completion_end_counts_the_session_encoding() -> None:
    pos = P(3, 10)
    assert completion_end(pos, "é)", "1é)") == P(3, 12)  # UTF-16 by default
    assert completion_end(pos, "é)", "1é)", UTF8) == P(3, 13)
    assert completion_end(pos, f"{GRIN})", f"x{GRIN})", UTF16) == P(3, 13)
    assert completion_end(pos, f"{GRIN})", f"x{GRIN})", UTF32) == P(3, 12)
    assert completion_end(pos, " + y", "x", UTF8) == pos


# ---- properties ------------------------------------------------------------------------------

ALPHABET = ["a", " ", "\n", "\r", "\r\n", GRIN, FRAKTUR_U, "é", "\u0301", "€", *NOT_LSP_BREAKS]
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)


def _inside_crlf(text: str, offset: int) -> bool:
    return 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n"


@settings(max_examples=300, deadline=None)
@given(text=texts, data=st.data())
def test_offset_position_round_trip(text: str, data: st.DataObject) -> None:
    encoding = data.draw(st.sampled_from(ENCODINGS))
    offset = data.draw(st.integers(0, len(text)))
    pos = position_at(text, offset, encoding)
    back = check_position(text, pos, encoding)  # a position we made is always valid
    if _inside_crlf(text, offset):
        assert back == offset - 1
    else:
        assert back == offset
        assert offset_at(text, pos, encoding) == offset
    # Lines agree with a direct reading of the text up to the offset.
    head = text[:back]
    assert pos.line == head.count("\n") + head.count("\r") - head.count("\r\n")
    assert pos.character == unit_len(head[line_start(text, back) :], encoding)


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_lines_join_back_and_count_lsp_breaks_only(text: str) -> None:
    lines = lsp_lines(text)
    assert "".join(lines) == text
    breaks = text.count("\n") + text.count("\r") - text.count("\r\n")
    assert line_count(text) == breaks + 1
    for line in lines[:-1]:
        assert line.endswith(("\n", "\r"))
        body = line.rstrip("\r\n")
        assert "\n" not in body and "\r" not in body
    for i in range(line_count(text)):
        start, body_end, _next = line_bounds(text, i)
        body = text[start:body_end]
        for enc in ENCODINGS:
            assert check_position(text, P(i, unit_len(body, enc)), enc) == body_end
            assert offset_at(text, P(i, unit_len(body, enc) + 5), enc) == body_end
