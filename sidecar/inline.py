"""The inline-completion job: what runs on the engine worker for ``textDocument/inlineCompletion``.

Why its own module (mirroring ``sidecar/rewrite.py``): the LSP handler in ``server.py`` only
reads the request (document, position, settings) and shapes the answer; building the FIM or
plain prompt, generating, stopping at a control token or at the end of the cursor's block,
and healing the prefix's whitespace are engine-side work that can be read and tested apart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from echoline.sidecar.background_prefill import run_ids
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.inline_stops import InlineStops
from echoline.sidecar.lsp_utils import UTF16, line_bounds, line_count, unit_len
from echoline.sidecar.prompts import (
    INLINE_ANCHOR_CHARS,
    INLINE_SHORT_ANCHOR_CHARS,
    INLINE_SHORT_PREFIX_CHARS,
    InlinePrompt,
    auto_suffix_tokens,
    finish_completion,
    heal_prefix,
    indentation,
    inline_prompt,
    unheal,
)
from lsprotocol import types


class HeadStarts:
    """Each open document's inline head start, kept between its requests (the ``keep`` of
    ``sidecar.prompts.inline_head_start``), as a LINE number.

    Lines are counted as the editor counts them (``lsp_utils``: ``\n``, ``\r\n`` or ``\r``).
    Why a line, and why here: the job reads the start when it runs and records it as soon
    as its prompt is built, on the engine thread (a request the editor cancels, or one
    queued behind another, still leaves the start its prefill used), while edits arrive on
    the event loop. An edit within a line above the start (a typo fixed at the top of the
    file) leaves the line number right where an offset would no longer be a line start;
    lines added or removed above shift it (``edited``); an edit across the start line, or a
    whole-document change, drops it. A start recorded from text older than an edit is not
    kept. A stale start only costs cached tokens: the prompt is always rebuilt from the
    current text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._line: dict[str, int] = {}
        self._edits: dict[str, int] = {}  # edits seen per document: a recording's freshness
        self._open: set[str] = set()

    def opened(self, uri: str) -> None:
        with self._lock:
            self._open.add(uri)
            self._line.pop(uri, None)
            self._edits[uri] = self._edits.get(uri, 0) + 1

    def closed(self, uri: str) -> None:
        with self._lock:
            self._open.discard(uri)
            self._line.pop(uri, None)
            self._edits.pop(uri, None)

    def edited(self, uri: str, changes: list[Any]) -> None:
        """Apply a didChange's content changes, in order, to the kept line."""
        with self._lock:
            self._edits[uri] = self._edits.get(uri, 0) + 1
            line = self._line.get(uri)
            for ch in changes:
                if line is None:
                    break
                rng = getattr(ch, "range", None)
                if rng is None:  # the whole document replaced
                    line = None
                elif rng.end.line < line or (rng.end.line == line and rng.end.character == 0):
                    line += line_count(ch.text) - 1 - (rng.end.line - rng.start.line)
                elif rng.start.line < line:  # the edit spans the start line's beginning
                    line = None
            if line is None:
                self._line.pop(uri, None)
            else:
                self._line[uri] = line

    def edits(self, uri: str) -> int:
        """The document's edit count: taken with a snapshot of its text on the event loop,
        it tells ``record`` whether the snapshot is still the current text."""
        with self._lock:
            return self._edits.get(uri, 0)

    def read(self, uri: str, prefix: str) -> tuple[int | None, int]:
        """(the kept start as an offset into ``prefix``, or None; the edit count now)."""
        with self._lock:
            line, edits = self._line.get(uri), self._edits.get(uri, 0)
        bounds = None if line is None else line_bounds(prefix, line)  # None: the cursor is above it
        return (None if bounds is None else bounds[0]), edits

    def record(self, uri: str, prefix: str, start: int | None, edits: int) -> None:
        """Keep ``start`` (an offset into ``prefix``) if the document is open and unedited
        since ``read``; None drops the kept start."""
        with self._lock:
            if uri not in self._open or self._edits.get(uri, 0) != edits:
                return
            if start is None:
                self._line.pop(uri, None)
            else:
                self._line[uri] = line_count(prefix[:start]) - 1


@dataclass
class InlineOutcome:
    text: str | None  # None: stopped by a cancel or a newer request
    stats: dict[str, Any]
    mode: str


def completion_end(
    pos: types.Position, rest_of_line: str, completion: str, encoding: str = UTF16
) -> types.Position:
    """Where an inline item's range ends: the end of the cursor's line when the rest of
    that line is blank or repeated at the end of the completion's first line (an
    auto-closed ")" the model wrote too), so accepting it does not duplicate text;
    otherwise the cursor itself (a pure insertion). ``encoding``: the session's
    position encoding, the unit the end's character is counted in."""
    if replaces_rest(rest_of_line, completion):
        width = unit_len(rest_of_line, encoding)
        return types.Position(line=pos.line, character=pos.character + width)
    return pos


def replaces_rest(rest_of_line: str, completion: str) -> bool:
    """Whether an inline item for ``completion`` replaces the rest of the cursor's line
    (``completion_end``): it is blank, or the completion's first line ends with it."""
    first = completion.split("\n", 1)[0]
    tail = rest_of_line.strip()
    return bool(rest_of_line) and (not tail or first.rstrip().endswith(tail))


def accepted(prefix: str, suffix: str, rest_of_line: str, completion: str) -> tuple[str, str]:
    """The texts before and after the cursor once ``completion``, offered between
    ``prefix`` and ``suffix`` (whose line's rest is ``rest_of_line``), is accepted: the
    item's range replaced by it (``completion_end``) and the cursor at its end."""
    after = suffix[len(rest_of_line):] if replaces_rest(rest_of_line, completion) else suffix
    return prefix + completion, after


def line_end(completion: str) -> int | None:
    """Where a completion that continues the cursor's line ends: at that line's end, once
    its first line has some text (None while it has none: a reply that goes to the next
    line first is a new block, judged by ``block_end``). Why: while the user types within a
    line, the suggestion that matters is the rest of that line (the single-line layout, as
    Copilot-class tools answer mid-line); the lines after it cost a decode step each, on
    every keystroke. The cut is a stop rule: the text is a prefix of the plain reply."""
    cut = completion.find("\n")
    return cut if cut > 0 and completion[:cut].strip() else None


def typing_in_line(cursor_line: str) -> bool:
    """Whether a request stops at the line's end (``line_end``): text before the cursor on
    its line (the user is typing within it), not only indentation."""
    return bool(cursor_line.strip())


def inline_session(uri: str) -> str:
    """The engine session of ``uri``'s inline prompts (the requests and the warm-up share it)."""
    return "inline:" + uri


def ahead_session(uri: str) -> str:
    """The engine session of ``uri``'s completions computed ahead (``ahead_job``): its own,
    so the requests' session keeps the prompt the user is typing at; the engine lends
    cached prefixes between sessions, so neither runs the shared head twice."""
    return "inline-ahead:" + uri


def inline_long_session(uri: str) -> str:
    """The engine session the long head is warmed in while requests use the short one
    (``choose_head``): its own, so the short prompt the user types with stays cached; a
    request that switches to the long head borrows its rows."""
    return "inline-long:" + uri


#: The long head is asked once its uncached part is at most this many tokens more than the
#: short head's: about one background chunk, ~0.3 s on a 2-core CPU.
HEAD_SWITCH_TOKENS = 64


def choose_head(engine: EngineLike, long: InlinePrompt, short_of: Callable[[], InlinePrompt],
                session: str) -> InlinePrompt:  # fmt: skip
    """The prompt a request at the cursor asks with: ``long`` (the usual ~1,500-token head)
    unless its head is not cached yet while the short one's (``short_of()``, ~400-520
    tokens, built only when the long head misses more than ``HEAD_SWITCH_TOKENS``: while
    typing at a warmed place it is never tokenized) mostly is, or costs much less to run.

    Why: at a new place in a big file (a jump, an edit) the long head must be run whole
    before the first suggestion: ~1,500 tokens, ~6 s on a 2-core CPU, for a user who types
    a second after the edit. The short head costs ~1 s and is ready first; the long one is
    warmed in the background (``inline_long_session``) and taken as soon as it is cached.
    Which prompt was asked depends on what is cached, never the reply: each suggestion is
    the plain greedy completion of the prompt it was computed for. An engine that cannot
    say what it holds (a remote one, whose GPU runs a long head in milliseconds) always
    gets the long head."""
    cached = getattr(engine, "cached_prefix", None)
    if not callable(cached):
        return long
    miss_long = max(0, long.head_len - cached(long.ids, session=session))
    if miss_long <= HEAD_SWITCH_TOKENS:
        return long
    short = short_of()
    if short.ids == long.ids or short.head_len <= 0:
        return long
    miss_short = max(0, short.head_len - cached(short.ids, session=session))
    if miss_long <= miss_short + HEAD_SWITCH_TOKENS:
        return long
    return InlinePrompt(ids=short.ids, mode=short.mode, head_start=short.head_start, head="short",
                        long_ids=long.ids, head_len=short.head_len)


def suffix_budget(engine: EngineLike, suffix_tokens: int | None, auto_suffix: bool) -> int | None:
    """The most suffix tokens an inline prompt carries: the setting (``suffix_tokens``), else
    with ``auto_suffix`` the engine's budget (``auto_suffix_tokens``: measured once per
    process, so it can differ between two processes on one machine), else None
    (characters only). Reported with each prompt, so a caller can rebuild the same one."""
    return suffix_tokens if suffix_tokens is not None or not auto_suffix else auto_suffix_tokens(engine)


def _prompt(
    engine: EngineLike, healed: str, suffix: str, uri: str, suffix_tokens: int | None, auto_suffix: bool,
    anchor: int, starts: HeadStarts | None, record: bool, edits: int | None,
    session: str | None = None, short_head: bool = True,
) -> InlinePrompt:  # fmt: skip
    """The inline prompt at the cursor, on the engine thread, with the head start kept in
    ``starts``. Only a request records the start it used (``record``): a warm-up reads the
    same start and so builds the ids a request at its cursor would, but leaves what the
    next request reads as it was, so every prompt is the one it would be without warm-ups.
    ``edits``: the document's edit count taken with the text (None: now); a start computed
    from text that an edit has since replaced is not kept. ``short_head``: ask with the
    short head while the long one is not cached (``choose_head``, for ``session``); the
    long head's start is what is kept either way."""
    budget = suffix_budget(engine, suffix_tokens, auto_suffix)
    keep, now = starts.read(uri, healed) if starts is not None else (None, 0)
    prompt = inline_prompt(engine, healed, suffix, suffix_tokens=budget, anchor=anchor, keep_start=keep)
    if starts is not None and record:
        starts.record(uri, healed, prompt.head_start, now if edits is None else edits)
    if not short_head or len(healed) <= INLINE_SHORT_PREFIX_CHARS:
        return prompt
    return choose_head(engine, prompt, lambda: inline_prompt(
        engine, healed, suffix, suffix_tokens=budget, anchor=INLINE_SHORT_ANCHOR_CHARS,
        head_chars=INLINE_SHORT_PREFIX_CHARS), session or inline_session(uri))


def inline_job(
    prefix: str, suffix: str, cursor_line: str, uri: str, max_tokens: int, spec: bool,
    suffix_tokens: int | None = None, *, auto_suffix: bool = True,
    anchor: int = INLINE_ANCHOR_CHARS, starts: HeadStarts | None = None, edits: int | None = None,
    session: str | None = None, record: bool = True, chunked: bool = False, line_stop: bool | None = None,
    short_head: bool = True,
) -> Callable[[Any, threading.Event], InlineOutcome]:  # fmt: skip
    """The worker job completing at the cursor: text before it (``prefix``), after it
    (``suffix``), the cursor line up to the cursor, the buffer's session name part.

    ``suffix_tokens``: the most tokens after the cursor the prompt carries (the
    ``inlineSuffixTokens`` setting); None with ``auto_suffix``: the engine's budget
    (``auto_suffix_tokens``), without: characters only. ``anchor``: the head window's
    grid (0: the sliding window; ``bench inline`` compares the layouts); ``starts``: the
    documents' kept head starts, read when the job runs and updated once its prompt is
    built (None: none kept); ``edits``: ``starts.edits(uri)`` taken with the text (None:
    when the job runs). ``session`` (default ``inline_session(uri)``), ``record`` (False:
    read the kept head start but leave it, as a warm-up does) and ``chunked`` (prefill the
    prompt in background chunks first, so a cancel waits for at most one) serve the
    background completion ``ahead_job``; the reply is the same either way. ``line_stop``:
    end the completion at its first line's end (``line_end``); None: when the user types
    within the cursor's line (``typing_in_line``). ``short_head``: ask with the short head
    while the long one is not cached (``choose_head``; the stats' "head" says which)."""
    healed, removed = heal_prefix(prefix)
    indent = indentation(cursor_line)
    one_line = typing_in_line(cursor_line) if line_stop is None else line_stop

    def job(engine: EngineLike, cancel: threading.Event) -> InlineOutcome:
        prompt = _prompt(engine, healed, suffix, uri, suffix_tokens, auto_suffix, anchor, starts, record, edits,
                         session or inline_session(uri), short_head)
        if not prompt.ids:  # nothing before the cursor (and no BOS): nothing to continue
            return InlineOutcome(None, {}, prompt.mode)
        name = session or inline_session(uri)
        if chunked and len(prompt.ids) > 1:
            run_ids(engine, prompt.ids, name, cancel, None, reserve_tokens=len(prompt.ids) + max_tokens)
            if cancel.is_set():
                return InlineOutcome(None, {}, prompt.mode)
        # Stop rules, not cancels: the block's (or line's) end, checked on the new text only
        # (``InlineStops``), and a control token (a FIM model's <|fim_suffix|>, <|file_sep|>,
        # ...), which ends the middle before its text reaches the reply. The reply kept is a
        # prefix of the plain greedy one, and a "cancelled" finish means a real cancel.
        result = engine.generate(
            prompt.ids,
            max_tokens=max_tokens,
            spec=spec,
            session=name,
            cancel=cancel,
            stop_when=InlineStops(indent, one_line),
            stop_id_when=getattr(engine.tokenizer, "is_control", None),
        )
        stats = {**result.stats.as_dict(), "head": prompt.head}
        if result.finish_reason == "cancelled":
            return InlineOutcome(None, stats, prompt.mode)
        # the text already ends where the rules cut it; this drops the healed space and the
        # trailing whitespace (and re-checks the block's end once, for any engine)
        return InlineOutcome(finish_completion(unheal(result.text, removed), indent), stats, prompt.mode)

    return job


def ahead_job(
    prefix: str, suffix: str, uri: str, max_tokens: int, spec: bool, suffix_tokens: int | None,
    starts: HeadStarts | None, keep: Callable[[str], None],
) -> Callable[[Any, threading.Event], dict[str, Any] | None]:  # fmt: skip
    """The background job computing, while a suggestion is on screen, the completion a
    request would get once it is accepted (the cursor between ``prefix`` and ``suffix``,
    from ``accepted``), so the next Tab finds its answer ready: ``inline_job`` on the
    prompt a request there would build (the kept head start read, never recorded), in its
    own session (``ahead_session``), prefilled in background chunks. ``keep(text)`` gets
    the completion (the plain greedy one of that prompt, cut at the block's end); a cancel
    (any request) drops it."""
    cursor_line = prefix[prefix.rfind("\n") + 1 :]
    run = inline_job(prefix, suffix, cursor_line, uri, max_tokens, spec, suffix_tokens, starts=starts,
                     session=ahead_session(uri), record=False, chunked=True)  # only run while warm-ups are on

    def job(engine: EngineLike, cancel: threading.Event) -> dict[str, Any] | None:
        if not isinstance(engine, EngineLike):
            return None
        out = run(engine, cancel)
        if out.text is None:
            return {"state": "cancelled", "cancelled": True, "kind": "ahead"}
        keep(out.text)
        return {"state": "done", "cancelled": False, "kind": "ahead", "chars": len(out.text),
                "prefilled": out.stats.get("prefilled_tokens")}

    return job


def warm_job(
    prefix: str, suffix: str, uri: str, max_tokens: int, suffix_tokens: int | None = None, *,
    auto_suffix: bool = True, anchor: int = INLINE_ANCHOR_CHARS, starts: HeadStarts | None = None,
    short_head: bool = True, long_only: bool = False,
) -> Callable[[Any, threading.Event, Callable[[int], None] | None], dict[str, Any] | None]:  # fmt: skip
    """The background job that runs the inline prompt at a resting cursor into the
    document's inline session (``sidecar/inline_warm.py`` schedules it): the prompt a
    request at that cursor would build (the same arguments as ``inline_job``), prefilled
    without a reply, so the request that follows (the first keystroke there) runs only
    what changed. When that prompt has the short head (``choose_head``: the long one is not
    cached), the long prompt runs next into its own session (``inline_long_session``), so
    that a later request there switches to it; the report's figures are then the long
    prompt's, the short one's under "short". A cancel stops it between ``CHUNK``-token
    chunks, keeping those done. It reads the kept head start but never records one
    (``_prompt``). A cursor with nothing before it is skipped: the prompt there is only
    the tail, which the first keystroke runs again anyway. A prompt already cached (the
    request just made there) is not run again; ``long_only``: only the long head, if the
    prompt there has the short one (after a request, ``inline_warm.LongHeadWarm``)."""
    healed, _ = heal_prefix(prefix)

    def job(engine: EngineLike, cancel: threading.Event,
            started: Callable[[int], None] | None = None) -> dict[str, Any] | None:  # fmt: skip
        if not isinstance(engine, EngineLike):  # not loaded, or a test's stand-in
            return None
        if not healed.strip():
            return {"state": "skipped", "reason": "nothing before the cursor", "tokens": 0}
        session = inline_session(uri)
        budget = suffix_budget(engine, suffix_tokens, auto_suffix)  # reported with the prompt
        prompt = _prompt(engine, healed, suffix, uri, budget, False, anchor, starts, False, None, session, short_head)
        ids = prompt.ids
        if len(ids) < 2:
            return {"state": "skipped", "reason": "nothing to run", "tokens": len(ids)}
        cached = getattr(engine, "cached_prefix", None)
        held = cached(ids, session=session) if callable(cached) else 0
        if long_only and prompt.long_ids is None:
            return {"state": "skipped", "reason": "the long head is cached", "tokens": 0, "head": prompt.head}
        if held < len(ids) - 1 and not long_only:
            # the cache sized for the request that follows (its reply included), as generate sizes it
            report = run_ids(engine, ids, session, cancel, started, reserve_tokens=len(ids) + max_tokens)
        else:
            report = {"state": "done", "cancelled": False, "tokens": len(ids), "cached": held}
        if prompt.long_ids is not None and not report["cancelled"]:
            # the whole long prompt, its tail too: a request right here then runs one token
            long = run_ids(engine, prompt.long_ids, inline_long_session(uri), cancel, None,
                           reserve_tokens=len(prompt.long_ids) + max_tokens)
            report = {**long, "short": {"tokens": report["tokens"], "cached": report["cached"]}}
        return {**report, "mode": prompt.mode, "head": prompt.head,
                "suffix_tokens": budget}

    return job
