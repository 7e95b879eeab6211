"""Where an inline completion ends, as a stop predicate the engine checks token by token.

An inline completion ends at the end of the cursor's block (``prompts.block_end``: a
blank line, or a line dedented below the cursor line) and, while the user types within a
line, at that line's end (``inline.line_end``). ``InlineStops`` is both rules as the
engine's ``stop_when`` (``engine.generate.StopRules``): it is called after every token
with the whole reply so far, and looks only at what arrived since its last call, keeping
its place in the line it is reading. Why: re-running ``block_end`` over the whole reply on
every token costs O(n) a token, O(n^2) a reply, for a rule decided line by line. As a
stop rule, the reply it ends is a prefix of the plain greedy reply, with speculation on or
off (the engine applies it to the same text token by token either way).

It reads the raw reply, before ``prompts.unheal`` drops the space the prompt's healing
removed. That is exact: ``unheal`` drops only spaces or tabs at the very start, before the
first line break, so the first line break, every line after it, and whether the first line
holds text are the same in both; a cut at a line break is then the same place in both
texts, offset by the dropped characters (tests/test_inline_stops.py checks it against
``block_end`` and ``line_end`` on every prefix).
"""

from __future__ import annotations


class InlineStops:
    """``stops(text)`` -> where to cut the reply (before a line break), or None to go on.

    ``indent``: the cursor line's indentation (``prompts.indentation``); ``one_line``: end
    at the first line's end once that line holds text (``inline.line_end``). ``text`` must
    grow by appending between calls, as the engine's reply text does; after a cut, every
    later call answers the same cut.
    """

    def __init__(self, indent: int, one_line: bool = False) -> None:
        self.indent = indent
        self.one_line = one_line
        self.cut: int | None = None
        self._scan = 0  # the next character not yet read
        self._first_nl: int | None = None  # where the first line ends (None: not yet)
        self._first_text = False  # whether the first line holds non-blank text
        self._start = 0  # where the line being read starts (a line after the first)
        self._lead = 0  # its leading spaces/tabs read so far, while its indentation is unknown
        self._line_indent: int | None = None  # its indentation, once a non-space/tab is read
        self._line_text = False  # whether it holds non-blank text so far

    def __call__(self, text: str) -> int | None:
        if self.cut is None:
            self.cut = self._read(text)
        return self.cut

    def _read(self, text: str) -> int | None:
        """Read ``text[self._scan:]``, line piece by line piece; a cut when a rule fires."""
        while self._scan < len(text):
            nl = text.find("\n", self._scan)
            end = len(text) if nl < 0 else nl
            piece = text[self._scan : end]
            self._scan = end
            if self._first_nl is None:  # the first line (the rest of the cursor's line)
                self._first_text = self._first_text or bool(piece.strip())
                if nl < 0:
                    return None
                if self.one_line and self._first_text:
                    return nl
                self._first_nl = nl
                self._next_line(nl + 1)
                continue
            if self._line_indent is None:
                rest = piece.lstrip(" \t")
                if rest:
                    self._line_indent = self._lead + len(piece) - len(rest)
                else:
                    self._lead += len(piece)
            self._line_text = self._line_text or bool(piece.strip())
            if self._line_text and self._line_indent is not None and self._line_indent < self.indent:
                return self._start - 1  # a line dedented below the block: cut before it
            if nl < 0:
                return None
            if not self._line_text:
                return self._start - 1  # a complete blank line ends the block
            self._next_line(nl + 1)
        return None

    def _next_line(self, start: int) -> None:
        self._start = start
        self._scan = start
        self._lead = 0
        self._line_indent = None
        self._line_text = False
