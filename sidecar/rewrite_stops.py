"""Stop rules that end a runaway rewrite reply, checked line by line as it streams.

A small model asked to rewrite a selection sometimes does not stop at the closing
fence: it goes on into the code that follows the selection (which would then be in the
file twice), repeats the function it just wrote, or keeps writing far past the size of
the selection until ``maxTokens``. Each is a rule on the reply text alone, so the reply
they end is a PREFIX of what plain decoding writes (exactness holds; the engine applies
the predicate token by token, identically with speculation on or off):

- ``after``: the reply reproduces the first lines that follow the selection. The reply
  is cut at the start of the first reproduced line, so it never duplicates them.
- ``repeat``: the reply's last block of lines is the same as the block just before it,
  while the selection does not hold that block twice. Cut at the start of the second copy.
- ``too-long``: the reply has more lines than ``factor`` times the selection's plus a
  margin. Cut after the last line allowed; a reply stopped this way is no confident edit.

Lines are compared stripped, blank lines skipped, so indentation drift and blank-line
spacing do not hide a copy. A block must carry at least ``MIN_BLOCK_CHARS`` characters
of code, so a run of ``}`` or ``else:`` never counts as a copy. ``RewriteStops`` is the
predicate (``engine.generate.StopRules.stop_when``): each call looks only at the complete
lines added since the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_BLOCK_CHARS = 24  # characters of code (stripped lines) a copied or repeated block must hold
AFTER_LINES_MAX = 4  # at most this many lines after the selection make the "after" anchor
GROWTH_FACTOR = 4  # a reply may hold this many times the selection's lines ...
GROWTH_MARGIN = 24  # ... plus this many

AFTER = "after"
REPEAT = "repeat"
TOO_LONG = "too-long"


def _code_lines(text: str) -> list[str]:
    """The non-blank lines of ``text``, stripped."""
    return [s for s in (line.strip() for line in text.split("\n")) if s]


def _anchor(after: str) -> tuple[str, ...]:
    """The first lines after the selection that are worth matching (empty: none are).

    The fewest first non-blank lines holding ``MIN_BLOCK_CHARS`` characters of code,
    at most ``AFTER_LINES_MAX`` and at least two when there are two.
    """
    lines = _code_lines(after)[:AFTER_LINES_MAX]
    taken: list[str] = []
    for line in lines:
        taken.append(line)
        if sum(map(len, taken)) >= MIN_BLOCK_CHARS and len(taken) >= min(2, len(lines)):
            return tuple(taken)
    return ()


def _contains(seq: list[str], block: tuple[str, ...] | list[str]) -> bool:
    n = len(block)
    return any(tuple(seq[i : i + n]) == tuple(block) for i in range(len(seq) - n + 1))


@dataclass
class RewriteStops:
    """The stop predicate of one rewrite: ``stops(text)`` -> where to cut, or None.

    ``selection``: the text being rewritten; ``after``: the file's text after it.
    After a stop, ``rule`` names the rule that fired (AFTER, REPEAT or TOO_LONG).
    """

    selection: str
    after: str = ""
    factor: int = GROWTH_FACTOR
    margin: int = GROWTH_MARGIN
    rule: str | None = None
    _pos: int = 0  # where the first line not yet seen starts in the reply text
    _lines: int = 0  # lines seen (blank ones too)
    _code: list[str] = field(default_factory=list)  # stripped non-blank lines seen
    _starts: list[int] = field(default_factory=list)  # where each of them starts in the text
    _seen_at: dict[str, list[int]] = field(default_factory=dict)  # line -> its indices in _code
    _anchor: tuple[str, ...] = ()
    _sel_code: list[str] = field(default_factory=list)
    _limit: int = 0

    def __post_init__(self) -> None:
        self._sel_code = _code_lines(self.selection)
        anchor = _anchor(self.after)
        # a block the selection itself holds may be rewritten legitimately: no anchor then
        self._anchor = () if anchor and _contains(self._sel_code, anchor) else anchor
        sel_lines = self.selection.count("\n") + (0 if self.selection.endswith("\n") else 1)
        self._limit = self.factor * max(1, sel_lines) + self.margin

    def __call__(self, text: str) -> int | None:
        """Where to cut ``text`` (the reply so far) to end it, or None to go on."""
        while True:
            nl = text.find("\n", self._pos)
            if nl < 0:
                return None
            start, self._pos = self._pos, nl + 1
            cut = self._line(text[start:nl], start)
            if cut is not None:
                return cut

    def _line(self, raw: str, start: int) -> int | None:
        """Take one complete line that starts at ``start``; a cut when a rule fires."""
        self._lines += 1
        if self._lines > self._limit:
            self.rule = TOO_LONG
            return start
        line = raw.strip()
        if not line or line.startswith("```"):
            return None
        code = self._code
        code.append(line)
        self._starts.append(start)
        n = len(code)
        k = len(self._anchor)
        if k and n >= k and tuple(code[-k:]) == self._anchor:
            self.rule = AFTER
            return self._starts[n - k]
        cut = self._repeat(line, n)
        self._seen_at.setdefault(line, []).append(n - 1)
        return cut

    def _repeat(self, line: str, n: int) -> int | None:
        """A cut when code[-L:] == code[-2L:-L] for some L >= 2 (only where this line was seen)."""
        code = self._code
        for p in reversed(self._seen_at.get(line, ())):
            span = n - 1 - p  # the block's length if the line at p ends its first copy
            if span < 2 or 2 * span > n:
                continue
            block = code[n - span :]
            if code[n - 2 * span : n - span] != block or sum(map(len, block)) < MIN_BLOCK_CHARS:
                continue
            if _contains(self._sel_code, code[n - 2 * span :]):
                continue  # the selection repeats it too
            self.rule = REPEAT
            return self._starts[n - span]
        return None


def stop_rules(file_text: str, start: int, end: int) -> RewriteStops:
    """The stop predicate for rewriting ``file_text[start:end]``."""
    return RewriteStops(selection=file_text[start:end], after=file_text[end:])


def duplicates_after(text: str, after: str) -> bool:
    """Whether ``text`` (a finished replacement) reproduces the lines that follow it.

    The benchmark's count of replies that would put code in the file twice: the AFTER
    rule run over a finished text (with no selection to excuse it).
    """
    probe = RewriteStops(selection="", after=after, factor=10**6)
    probe(text if text.endswith("\n") else text + "\n")
    return probe.rule == AFTER
