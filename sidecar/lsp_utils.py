"""LSP positions and lines, counted the way the protocol counts them.

Why this module exists: pygls' ``TextDocument.lines`` is ``str.splitlines``, which
also breaks lines on ``\\f``, ``\\v``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and
U+2029. The LSP breaks lines only on ``\\n``, ``\\r\\n`` and ``\\r``, so a document
holding any of the others (a form feed between Python sections, a Unicode line
separator in a string) would have every later position mapped to the wrong offset.
And a position's ``character`` counts code units of the *negotiated* position
encoding (UTF-16 unless client and server agreed on UTF-8 or UTF-32), not code points.

Every conversion between an LSP ``Position`` and an offset into the document text
(Python ``str`` indices, i.e. code points) goes through here, and so do the helpers that
read a request's positions and documents (``parse_position``, ``checked_offset``,
``find_document``, ``get_doc``: InvalidParams with the reason when they name nothing).

Two kinds of conversion:

* ``check_position`` is strict, for request parameters: a position past the end of
  its line, below the last line, or inside a multi-unit character is refused with a
  ``PositionError`` naming the problem (the server answers -32602 InvalidParams).
* ``offset_at`` is lenient, for applying ``didChange`` edits: a character past the
  end of its line means the line's end and a line past the end means the document's
  end, as the LSP specifies, so an edit never fails half way.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, Protocol
from urllib.parse import unquote

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.workspace import TextDocument

UTF8 = "utf-8"
UTF16 = "utf-16"
UTF32 = "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)

# The LSP's line ends; the alternation order makes "\r\n" one break, not two.
_BREAK = re.compile(r"\r\n|\r|\n")


class PositionLike(Protocol):
    """Anything with ``line`` and ``character`` (an ``lsprotocol`` ``Position``)."""

    line: int
    character: int


class PositionError(ValueError):
    """A position that does not name a place in the document (answered with -32602)."""


def normalize_encoding(encoding: Any) -> str:
    """``"utf-8"``, ``"utf-16"`` or ``"utf-32"`` for a ``PositionEncodingKind`` (or its
    string); anything else, ``None`` included, is UTF-16, the LSP's mandatory default."""
    value = getattr(encoding, "value", encoding)
    return value if value in ENCODINGS else UTF16


def encoding_label(encoding: Any) -> str:
    """``"UTF-16"`` for ``"utf-16"``: for messages a person reads."""
    return normalize_encoding(encoding).upper()


def _char_units(ch: str, encoding: str) -> int:
    """Code units of one code point. A lone surrogate (JSON can carry one, e.g.
    ``"\\ud83d"``) counts as one UTF-16 unit and three UTF-8 bytes, as WTF-8 has it."""
    if encoding == UTF32:
        return 1
    cp = ord(ch)
    if encoding == UTF16:
        return 2 if cp > 0xFFFF else 1
    return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4


def unit_len(s: str, encoding: Any = UTF16) -> int:
    """Length of ``s`` in code units of ``encoding`` (the unit of ``Position.character``)."""
    enc = normalize_encoding(encoding)
    if enc == UTF32 or s.isascii():
        return len(s)
    if enc == UTF16:
        return len(s.encode("utf-16-le", "surrogatepass")) // 2
    return len(s.encode("utf-8", "surrogatepass"))


def _column_to_index(body: str, column: int, encoding: str) -> tuple[int, bool]:
    """(code-point index, exact) of ``column`` code units into a line body.

    A column past the end gives ``len(body)``; one that falls inside a character
    (the low half of a UTF-16 surrogate pair, a UTF-8 continuation byte) gives that
    character's start with ``exact`` False.
    """
    if encoding == UTF32 or body.isascii():
        return min(column, len(body)), True
    used = 0
    for i, ch in enumerate(body):
        if used == column:
            return i, True
        n = _char_units(ch, encoding)
        if used + n > column:
            return i, False
        used += n
    return len(body), True


def lsp_lines(text: str) -> list[str]:
    """The document's lines with their line ends kept, split on ``\\n``, ``\\r\\n`` and
    ``\\r`` only: ``str.splitlines(keepends=True)`` with the LSP's idea of a line end.

    Like ``splitlines``, an empty text has no lines and a final line end opens no
    extra empty line here; ``line_count`` counts that last (empty) line, since a
    position may point at it.
    """
    out: list[str] = []
    start = 0
    for m in _BREAK.finditer(text):
        out.append(text[start : m.end()])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def line_count(text: str) -> int:
    """Number of lines a position can name: line breaks + 1 (so ``""`` has one line and
    ``"a\\n"`` two, the second empty)."""
    return sum(1 for _ in _BREAK.finditer(text)) + 1


def line_bounds(text: str, line: int) -> tuple[int, int, int] | None:
    """(start, end of body, start of next line) of line ``line`` as offsets, or None
    when the document has no such line. The body excludes the line end."""
    if line < 0:
        return None
    start = 0
    n = 0
    for m in _BREAK.finditer(text):
        if n == line:
            return start, m.start(), m.end()
        start = m.end()
        n += 1
    if n == line:
        return start, len(text), len(text)
    return None


def check_position(
    text: str, pos: PositionLike, encoding: Any = UTF16, what: str = "position"
) -> int:
    """Offset (code points) of a client position, or a ``PositionError`` saying why not.

    Strict on purpose: a request naming a place that does not exist is a client bug
    (often an encoding mismatch), and guessing would rewrite the wrong text.
    """
    enc = normalize_encoding(encoding)
    line, character = pos.line, pos.character
    if line < 0 or character < 0:
        raise PositionError(f"{what} {line}:{character} is negative")
    bounds = line_bounds(text, line)
    if bounds is None:
        raise PositionError(
            f"{what} line {line} is out of bounds: the document has {line_count(text)} line(s)"
        )
    start, body_end, _ = bounds
    body = text[start:body_end]
    index, exact = _column_to_index(body, character, enc)
    if index == len(body):
        width = unit_len(body, enc)
        if character > width:
            raise PositionError(
                f"{what} {line}:{character} is past the end of line {line} "
                f"({width} {encoding_label(enc)} code units)"
            )
    if not exact:
        raise PositionError(
            f"{what} {line}:{character} falls inside a character "
            f"(positions count {encoding_label(enc)} code units)"
        )
    return start + index


def offset_at(text: str, pos: PositionLike, encoding: Any = UTF16) -> int:
    """Offset (code points) of a position, clamped as the LSP says: a character past
    the end of its line is the line's end (never the next line), a line past the last
    one is the end of the document, and a column inside a character is that
    character's start. Only a negative position raises ``PositionError``."""
    if pos.line < 0 or pos.character < 0:
        raise PositionError(f"position {pos.line}:{pos.character} is negative")
    bounds = line_bounds(text, pos.line)
    if bounds is None:
        return len(text)
    start, body_end, _ = bounds
    enc = normalize_encoding(encoding)
    index, _exact = _column_to_index(text[start:body_end], pos.character, enc)
    return start + index


def position_at(text: str, offset: int, encoding: Any = UTF16) -> types.Position:
    """The position of an offset (clamped to the text). An offset between the ``\\r``
    and ``\\n`` of a CRLF is not a place a position can name: it maps to the end of
    that line."""
    enc = normalize_encoding(encoding)
    offset = max(0, min(offset, len(text)))
    line = 0
    start = 0
    for m in _BREAK.finditer(text):
        if m.start() >= offset:
            break
        if m.end() > offset:  # inside "\r\n"
            return types.Position(line=line, character=unit_len(text[start : m.start()], enc))
        line += 1
        start = m.end()
    return types.Position(line=line, character=unit_len(text[start:offset], enc))


def line_start(text: str, offset: int) -> int:
    """Offset where the line holding ``offset`` starts (LSP line ends only)."""
    offset = max(0, min(offset, len(text)))
    i = max(text.rfind("\n", 0, offset), text.rfind("\r", 0, offset))
    if i >= 0 and text[i] == "\r" and i + 1 == offset and text.startswith("\n", offset):
        # ``offset`` sits inside a CRLF: it belongs to the line that CRLF ends.
        i = max(text.rfind("\n", 0, i), text.rfind("\r", 0, i))
    return i + 1


def rest_of_line(text: str, offset: int) -> str:
    """The text from ``offset`` to the end of its line, the line end excluded."""
    m = _BREAK.search(text, offset)
    return text[offset : m.start() if m else len(text)]


def apply_change(text: str, rng: Any, new_text: str, encoding: Any = UTF16) -> str:
    """``text`` with an incremental ``didChange`` edit applied (positions clamped, see
    ``offset_at``; a reversed range is taken as the same range in order)."""
    a = offset_at(text, rng.start, encoding)
    b = offset_at(text, rng.end, encoding)
    if b < a:
        a, b = b, a
    return text[:a] + new_text + text[b:]


# ---- request parameters and documents -----------------------------------------------------

#: The LSP's uinteger: the largest line or character a position holds.
UINTEGER_MAX = 2**31 - 1

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 300
_SHORT.maxlevel = 3


def short(value: Any) -> str:
    """A client's value in an error message: bounded in length and depth (a huge string
    or a deeply nested array is not echoed back whole)."""
    return _SHORT.repr(value)


def invalid(message: str) -> JsonRpcException:
    """-32602 InvalidParams with ``message``: what the client sent wrong."""
    return JsonRpcInvalidParams(message)


def plain_params(obj: Any) -> Any:
    """A custom method's params as JSON values: pygls hands the params of methods it has no
    type for over as (nested) named tuples."""
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return {k: plain_params(v) for k, v in obj.items()}
    return obj


def parse_position(raw: Any, what: str) -> types.Position:
    """A position from a command's JSON argument (``what`` names it in errors: PositionError)."""
    if not isinstance(raw, dict) or not all(
        isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool)
        for k in ("line", "character")
    ):
        raise PositionError(f"{what} must be {{line: int, character: int}}, got {short(raw)}")
    line, character = raw["line"], raw["character"]
    if line < 0 or character < 0:
        raise PositionError(f"{what} {line}:{character} is negative")
    if line > UINTEGER_MAX or character > UINTEGER_MAX:
        raise PositionError(
            f"{what} {line}:{character} is out of range: "
            f"a line or character is at most {UINTEGER_MAX}"
        )
    return types.Position(line=line, character=character)


def checked_offset(text: str, pos: types.Position, encoding: str, what: str) -> int:
    """Offset (code points) of a client position in ``text``; InvalidParams (-32602) with
    the reason when it names no place in the document (see ``check_position``)."""
    try:
        return check_position(text, pos, encoding, what)
    except PositionError as exc:
        raise invalid(str(exc)) from exc


def find_document(workspace: Any, uri: str) -> TextDocument | None:
    """An open document. pygls files documents under the percent-decoded URI, while
    clients send it encoded ("my%20file.py"): look both up."""
    docs = workspace.text_documents
    return docs.get(unquote(uri)) or docs.get(uri)


def get_doc(workspace: Any, uri: Any) -> TextDocument:
    """The open document ``uri`` names; InvalidParams when there is none."""
    if not isinstance(uri, str) or not uri:
        raise invalid("'uri' must be a non-empty string")
    doc = find_document(workspace, uri)
    if doc is None:
        raise invalid(f"unknown document {short(uri)}: open it first (textDocument/didOpen)")
    return doc
