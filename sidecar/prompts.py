"""Prompts for rewrites and inline completions, and the rules that end a completion.

Rewrite layout: the whole file comes FIRST (stable across requests on the same
file), then the selection and the instruction (volatile), so the engine's
session for that URI reuses the cached prefix. The assistant turn is primed
with an opening code fence: even the 135M default model then answers with
code, and the reply ends at the closing fence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from echoline.sidecar import prompt_pieces
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.source_tokens import encoder_of, tokens_of

REPRODUCE_INSTRUCTION = (
    "Rewrite the selected code EXACTLY, character for character, with no changes and no commentary."
)
FENCE = "```"
#: The system message of every rewrite prompt (chat models). Why: on the edit benchmark's
#: tune split (`python tools/rewrite_prompt_trial.py`, docs/history/rewrite-prompt.md) the
#: Qwen 1.5B passed 28 of 32 with it against 25 with the template's default (it stopped
#: catching and swallowing errors it was only asked to clean up after, and quoted every
#: expansion it was asked to); held out, 15 of 21 either way; the 0.5B 33 of 53 against 32.
REWRITE_SYSTEM = (
    "You are a careful code editor. Apply the user's instruction to the given code and change "
    "nothing else: keep its behaviour, names and style, and add no error handling, features or "
    "comments that were not asked for. Answer with the complete rewritten code only."
)


def fence_for(file_text: str) -> str:
    """A code fence longer than any run of backticks in the file (at least ```).

    Why: the reply is primed with the opening fence and generation stops at the closing
    one. A selection that itself holds ``` (a Markdown file, a docstring with an example)
    would stop the reply at its first inner fence and the cut reply would be applied.
    Markdown's rule fixes it: a fence of more backticks than any run inside. It depends
    on the file alone, so the cached prefix of a buffer's prompts stays the same.
    """
    longest = max((len(m) for m in re.findall(r"`{3,}", file_text)), default=0)
    return "`" * max(3, longest + 1)
MAX_FILE_CHARS = 16000  # about 4-5k tokens: keeps room in a small model's context
INLINE_PREFIX_CHARS = 6000
#: The short head (1,536-2,048 characters, ~400-520 tokens), asked at a new place until the
#: long head is cached, on its own grid so that it holds while the user types there
#: (``sidecar.inline.choose_head``). Why this long: on 48 held-out stdlib lines
#: (``python -m tools.inline_head_quality``, Qwen 0.5B) the long head completed 4 exactly
#: (similarity 0.545), this one 6 (0.539), a 768-character one 3 (0.490).
INLINE_SHORT_PREFIX_CHARS, INLINE_SHORT_ANCHOR_CHARS = 1536, 512
INLINE_SUFFIX_CHARS = 2000
#: The inline prompt's head starts at a line found from a grid of this many characters, so
#: its start holds while the user types (see ``inline_head``).
INLINE_ANCHOR_CHARS = 2048
#: Inline suffix budget ("auto"): the tail a request prefills again should take at most this
#: long at the engine's prefill speed (see ``auto_suffix_tokens``). Why 1.25 s: on a 2-core
#: AMD EPYC (Zen 2; prefill ~120 tok/s after 2,000 tokens) it is 128 tokens (1.05 s measured;
#: a calibration reading 1.26 s gives 64), whose single-line infill similarity was 0.40
#: against 0.47 for the whole 2,000 characters (~500 tokens, ~4 s a keystroke) and 0.36-0.37
#: for 32-64 tokens; a machine twice as fast gets 256 (``echoline bench inline``,
#: docs/benchmarks.md "Inline completions while typing").
INLINE_SUFFIX_BUDGET_S = 1.25
INLINE_SUFFIX_TOKENS_MIN, INLINE_SUFFIX_TOKENS_MAX = 32, 1024

_LANGS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript",
    ".ts": "typescript", ".tsx": "tsx", ".jsx": "jsx", ".rs": "rust", ".go": "go",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".java": "java",
    ".kt": "kotlin", ".rb": "ruby", ".lua": "lua", ".sh": "bash", ".md": "markdown",
    ".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".html": "html",
    ".css": "css", ".sql": "sql", ".swift": "swift", ".php": "php", ".cs": "csharp",
}


def language_for(name: str) -> str:
    """Fence language tag from a file name or URI ('' when unknown)."""
    return _LANGS.get(PurePosixPath(name.split("?")[0]).suffix.lower(), "")


def file_window(text: str, start: int, end: int, limit: int = MAX_FILE_CHARS) -> str:
    """The file, or a window of whole lines around [start, end) when it is too long."""
    if len(text) <= limit:
        return text
    room = max(0, limit - (end - start))
    lo = max(0, start - room // 2)
    hi = min(len(text), end + (room - (start - lo)))
    lo = text.rfind("\n", 0, lo) + 1 if lo > 0 else 0
    nl = text.find("\n", hi)
    hi = len(text) if nl < 0 else nl + 1
    return text[lo:hi]


@dataclass(frozen=True)
class RewriteParts:
    """How ``rewrite_prompt`` laid out the user message, for composing its ids from pieces
    (``rewrite_prompt_ids``): ``before + window (+ "\\n") + after``."""

    name: str  # the file's name or URI (which transient chunk source the window is held as)
    before: str  # the stable part up to the file: "Here is NAME:" and the opening fence line
    window: str  # the file's lines in the prompt (``file_window``), as in the file
    after: str  # the closing fence and the volatile part: the rest of the user message
    tail: str  # what a raw prompt (no chat template) has after ``after``, primed fence included


@dataclass(frozen=True)
class RewritePrompt:
    messages: list[dict[str, str]]
    prime: str  # text appended after the chat template's generation prompt
    plain: str  # the whole prompt as raw text, for models without a chat template
    fence: str = FENCE  # opens the primed reply and ends it (see fence_for)
    parts: RewriteParts | None = field(default=None, repr=False, compare=False)


def _stable_pieces(context: str, name: str, fence: str = FENCE) -> tuple[str, str, str]:
    """The part of a rewrite prompt that depends on the file alone (it comes first), as
    (text before the file, the file with a final newline, the closing fence)."""
    lang = language_for(name)
    if context and not context.endswith("\n"):
        context += "\n"
    label = PurePosixPath(name).name if name else "the file"
    return f"Here is {label}:\n{fence}{lang}\n", context, f"{fence}\n\n"


# Every volatile part starts with this word (both layouts below): for an engine whose
# prompts are tokenized whole, the stable part's last tokens are tokenized as they will be
# when a request follows (see rewrite_prefix_ids).
_VOLATILE_HEAD = "Rewrite"


def rewrite_prompt(
    file_text: str, start: int, end: int, instruction: str, *, name: str = "",
    window: int = MAX_FILE_CHARS,
) -> RewritePrompt:
    """Messages for rewriting ``file_text[start:end]`` as ``instruction`` says.

    ``window``: at most this many characters of the file (whole lines around the
    selection); ``fitted_rewrite_ids`` shrinks it until the prompt fits in tokens.
    """
    lang = language_for(name)
    selection = file_text[start:end]
    body = selection[:-1] if selection.endswith("\n") else selection
    instr = instruction.strip() or REPRODUCE_INSTRUCTION
    context = file_window(file_text, start, end, window)
    fence = fence_for(file_text)
    before, framed, closing = _stable_pieces(context, name, fence)
    # Measured on SmolLM2-135M (the default when this was written), with the answer primed by an opening fence:
    # - reproducing: the instruction BEFORE the fenced selection copied it exactly in 3 of
    #   5 files tried (other layouts tried: 3/5 on the other files, or 0-1/5); the misses
    #   drop a docstring or respell a word — a limit of a 135M model;
    # - changing: "Rewrite this code:" + fenced selection + instruction is the form it
    #   followed (with the instruction first it edited the wrong function).
    # Both keep the file first, so the cached prefix is the same.
    if instruction.strip():
        volatile = f"Rewrite this code:\n{fence}{lang}\n{body}\n{fence}\n{instr}"
    else:
        volatile = f"{instr}\n{fence}{lang}\n{body}\n{fence}"
    stable = before + framed + closing
    messages = prompt_pieces.chat_messages(stable + volatile, REWRITE_SYSTEM)
    prime = f"{fence}{lang}\n"
    tail = f"\n\nRewritten code:\n{prime}"
    parts = RewriteParts(name=name, before=before, window=context, after=closing + volatile, tail=tail)
    return RewritePrompt(messages=messages, prime=prime, plain=f"{stable}{volatile}{tail}", fence=fence,
                         parts=parts)


#: The transient chunk source a rewrite prompt holds its file window as (``SourceTokens``):
#: a file no draft source holds (the CLI's, a benchmark's) is then still encoded once.
_PROMPT_SOURCE = "rewrite:"


def _composable(engine: EngineLike) -> bool:
    """Whether this engine's rewrite prompts are composed from pieces (``prompt_pieces``)."""
    if not prompt_pieces.joinable(engine):
        return False
    return not engine.has_chat_template or prompt_pieces.chat_frame(engine, REWRITE_SYSTEM) is not None


def _file_ids(engine: EngineLike, parts: RewriteParts) -> tuple[list[int], str]:
    """Ids of ``parts.before`` and the file window: the window's chunks from the engine's
    chunk cache (where the draft index put the file's: ``tokens_of``), so a file version
    is encoded once and an edit re-encodes only the chunks it touched. With them the text
    at the window's end that must be encoded with what follows it (often "").

    The window is cut like a draft source (``split_chunks`` cuts where the content says),
    so a whole file shares every chunk with its draft source, and a window of a long file
    all but its edge chunks. Edge chunks go with their neighbours where a tokenizer would
    merge across the cut, so that the ids stay those of the whole text: a window that
    starts with white space (a blank or indented line merges with the newline before it)
    goes with ``before``; a last chunk without a final newline goes with the newline the
    prompt adds (after punctuation, Qwen's pre-tokenizer joins them); a window that ends
    in other white space than one newline after a non-space character (blank lines,
    trailing spaces) is cut where the vocabulary allows (``prompt_pieces.end_cut``), the
    rest returned, to be encoded with the closing fence. Such a re-cut last chunk is
    encoded on its own (once per version while kept); every other chunk is the cache's."""
    window = parts.window
    if not window:
        return prompt_pieces.text_ids(engine, parts.before), ""
    chunks = tokens_of(engine).chunks(_PROMPT_SOURCE + parts.name, window, encoder_of(engine.tokenizer),
                                      transient=True)
    added = "" if window.endswith("\n") else "\n"  # the prompt ends the file with a newline
    ended = window + added
    keep = 0 if len(ended) >= 2 and not ended[-2].isspace() else prompt_pieces.end_cut(engine)
    first, last = (1 if window[0].isspace() else 0), len(chunks)
    lead = parts.before + (window[: chunks[0][0]] if first else "")
    trail, rest = "", ""
    if keep != 0 or added:  # the last chunk is cut anew
        if last > first:
            last_text, last = window[len(window) - chunks[-1][0] :] + added, last - 1
        else:  # the one chunk went with ``before``
            last_text, lead = lead + added, ""
        if keep is None:  # no cut keeps the whole text's ids: all of it goes with what follows
            rest = last_text
        else:
            trail, rest = last_text[: len(last_text) - keep], last_text[len(last_text) - keep :]
    ids = prompt_pieces.text_ids(engine, lead)
    for _, chunk in chunks[first:last]:
        ids.extend(chunk)
    return ids + prompt_pieces.text_ids(engine, trail), rest


def _prompt_head(engine: EngineLike) -> tuple[list[int], list[int]]:
    """The ids around the user message (chat template), or BOS and nothing (raw prompt)."""
    if engine.has_chat_template:
        frame = prompt_pieces.chat_frame(engine, REWRITE_SYSTEM)
        assert frame is not None  # _composable checked it
        return frame
    return prompt_pieces.bos_ids(engine), []


def rewrite_prompt_ids(engine: EngineLike, prompt: RewritePrompt) -> list[int]:
    """Token ids: chat template (when the model has one) then the primed fence.

    Composed from pieces: template head, ``before`` + the file window (``_file_ids``),
    ``after`` (closing fence and volatile part), template tail, primed fence; without a
    chat template BOS, ``before`` + window, ``after`` + the raw prompt's end. The prompt
    is this concatenation, on every path (requests, idle prefill, benchmarks), so
    ``rewrite_prefix_ids`` is a prefix of it by construction; for ordinary code it equals
    whole-text tokenization (tests/test_rewrite_prompt_ids.py: Qwen, SmolLM2). An
    engine whose pieces may not be joined (``prompt_pieces``), or a prompt not made by
    ``rewrite_prompt``, is tokenized whole.
    """
    parts = prompt.parts
    chat = engine.has_chat_template
    if parts is None or not _composable(engine):
        return _whole_prompt_ids(engine, prompt)
    head, tail = _prompt_head(engine)
    file_ids, rest = _file_ids(engine, parts)
    ids = head + file_ids
    if chat:
        return ids + prompt_pieces.text_ids(engine, rest + parts.after) + tail + prompt_pieces.text_ids(engine, prompt.prime)
    return ids + prompt_pieces.text_ids(engine, rest + parts.after + parts.tail)


def _whole_prompt_ids(engine: EngineLike, prompt: RewritePrompt) -> list[int]:
    """The prompt's text tokenized whole (engines whose pieces may not be joined)."""
    if engine.has_chat_template:
        msgs = prompt.messages
        if msgs == prompt_pieces.chat_messages(msgs[-1]["content"], REWRITE_SYSTEM):  # rewrite_prompt's layout
            ids = prompt_pieces.whole_ids(engine, msgs[-1]["content"], chat=True, system=REWRITE_SYSTEM)
        else:
            ids = [int(t) for t in engine.encode_chat(msgs)]
        return ids + prompt_pieces.text_ids(engine, prompt.prime)
    return prompt_pieces.whole_ids(engine, prompt.plain, chat=False)


def _context_tokens(engine: EngineLike) -> int | None:
    config = getattr(engine, "config", None)
    return getattr(config, "context_length", None)


def fitted_rewrite_ids(
    engine: EngineLike, file_text: str, start: int, end: int, instruction: str, *, name: str = "",
    reply_room: int = 512,
) -> tuple[RewritePrompt, list[int]]:
    """The rewrite prompt and its ids, the file window shrunk until they fit the context.

    Why tokens, not characters: the window is cut in characters, and dense text (CJK,
    emoji, minified code) can be one token a character or more, so a 16,000-character
    window could overflow a model's context and the request would fail instead of
    seeing less of the file. ``reply_room`` tokens are kept free for the reply.
    Raises ``ValueError`` when even the selection alone does not fit.

    Each halving re-encodes little: the smaller window's chunks are those of the larger
    one but at its two new edges (``_file_ids``), and the volatile part's ids are kept
    (``prompt_pieces.text_ids``).
    """
    limit = _context_tokens(engine)
    window = MAX_FILE_CHARS
    while True:
        prompt = rewrite_prompt(file_text, start, end, instruction, name=name, window=window)
        ids = rewrite_prompt_ids(engine, prompt)
        if limit is None or len(ids) + reply_room <= limit:
            return prompt, ids
        if window <= end - start:
            raise ValueError(
                f"the selection needs {len(ids)} prompt tokens, more than the model's context "
                f"({limit}) leaves beside {reply_room} for the reply: select less"
            )
        window = max(end - start, window // 2)


def rewrite_prefix_ids(engine: EngineLike, file_text: str, *, name: str = "") -> list[int] | None:
    """Token ids every rewrite prompt on this unchanged file starts with (None: none known).

    Why: the sidecar prefills them while the user pauses, so the next request prefills
    only its tail. They are the template head, ``before`` and the file: a true prefix of
    what ``rewrite_prompt_ids`` gives for any selection and instruction by construction,
    the same pieces from the same caches (the closing fence goes with the volatile part).
    A file longer than the window has no selection-free prefix (its window moves with
    the selection): None.

    An engine whose pieces may not be joined tokenizes prompts whole; its prefix is the
    common token prefix of the stable part alone and followed by "Rewrite", the first word
    of every volatile part, so no boundary token the tokenizer would merge differently
    later is kept.
    """
    if len(file_text) > MAX_FILE_CHARS:
        return None
    fence = fence_for(file_text)
    if _composable(engine):
        before, _, _ = _stable_pieces(file_text, name, fence)
        parts = RewriteParts(name=name, before=before, window=file_text, after="", tail="")
        return _prompt_head(engine)[0] + _file_ids(engine, parts)[0]
    stable = "".join(_stable_pieces(file_text, name, fence))
    chat = engine.has_chat_template
    alone = prompt_pieces.whole_ids(engine, stable, chat, system=REWRITE_SYSTEM)
    ahead = prompt_pieces.whole_ids(engine, stable + _VOLATILE_HEAD, chat, system=REWRITE_SYSTEM)
    n = 0
    for a, b in zip(alone, ahead, strict=False):
        if a != b:
            break
        n += 1
    return [int(t) for t in ahead[:n]]


def strip_fence(reply: str, fence: str = FENCE) -> str:
    """The code inside the model's fence (the opening one was primed, so it may be absent)."""
    text = reply
    first = text.lstrip("\n")
    if first.startswith(fence):  # the model repeated the opening fence
        nl = first.find("\n")
        text = first[nl + 1 :] if nl >= 0 else ""
    close = text.find(fence)
    if close >= 0:
        text = text[:close]
    return text


class FenceStripper:
    """``strip_fence`` for a reply that grows, reading only what is new on each call.

    Why: a rewrite reports its replacement so far after every token; ``strip_fence`` over
    the whole reply each time is O(n) a token, O(n^2) a reply. Here the place where the
    code starts (after a repeated opening fence, or 0) is settled once, and the search for
    the closing fence resumes where the last one ended. ``stripper(reply)`` equals
    ``strip_fence(reply, fence)`` for each reply of a sequence in which every reply extends
    the one before, as the engine's reply text does; a reply shorter than the last (a stop
    rule's cut, which ends a reply) is stripped whole and starts the sequence anew.
    """

    def __init__(self, fence: str = FENCE) -> None:
        self.fence = fence
        self._reset()

    def _reset(self) -> None:
        self._seen = 0  # the length of the last reply
        self._lead = 0  # the reply's leading newlines counted so far
        self._line_scan = 0  # where the search for the end of a repeated fence's line resumes
        self._start: int | None = None  # where the code starts, once settled
        self._scan = 0  # where the search for the closing fence resumes (after _start)
        self._close: int | None = None  # where the closing fence starts, once found

    def __call__(self, reply: str) -> str:
        if len(reply) < self._seen:
            self._reset()
            self._seen = len(reply)
            return strip_fence(reply, self.fence)
        self._seen = len(reply)
        if self._start is None:
            self._start = self._opening(reply)
            if self._start is None:  # the reply's opening is still undecided
                return "" if self._line_scan else reply
            self._scan = self._start
        if self._close is None:
            close = reply.find(self.fence, max(self._start, self._scan - len(self.fence) + 1))
            if close < 0:
                self._scan = len(reply)
                return reply[self._start :]
            self._close = close
        return reply[self._start : self._close]

    def _opening(self, reply: str) -> int | None:
        """Where the code starts: after the repeated opening fence's line, or 0 (none was
        repeated); None while it cannot be told. ``strip_fence`` answers, meanwhile, the
        whole reply (only newlines, or newlines and the start of a fence: no fence inside)
        or, once a fence is repeated and its line is not ended, "" (``_line_scan`` set)."""
        n, fence = len(reply), self.fence
        i = self._lead
        while i < n and reply[i] == "\n":
            i += 1
        self._lead = i
        first = reply[i : i + len(fence)]
        if len(first) < len(fence) and fence.startswith(first):
            return None  # only newlines so far, or they and the beginning of a fence
        if first != fence:
            return 0
        nl = reply.find("\n", max(self._line_scan, i + len(fence)))
        if nl < 0:
            self._line_scan = n
            return None
        return nl + 1


def fit_selection(new_text: str, selection: str) -> str:
    """Give the rewritten text the selection's trailing-newline shape."""
    body = new_text.rstrip("\n")
    if selection.endswith("\n"):
        return body + "\n"
    return body


# ---- inline completion ---------------------------------------------------------------------


@dataclass(frozen=True)
class InlinePrompt:
    ids: list[int]
    mode: str  # "fim" or "prefix"
    head_start: int | None = 0  # where the head starts in the prefix (None: cut to the context)
    #: "long": the ``INLINE_PREFIX_CHARS`` head; "short": the ``INLINE_SHORT_PREFIX_CHARS``
    #: one, asked while the long head is not cached yet (``sidecar.inline.choose_head``).
    head: str = "long"
    long_ids: list[int] | None = None  # with a short head: the long prompt, to warm next
    head_len: int = 0  # how many of ``ids`` come before the text after the cursor


def inline_head(prefix: str, limit: int = INLINE_PREFIX_CHARS, step: int = INLINE_ANCHOR_CHARS) -> str:
    """The last ``limit`` to ``limit + step`` characters of ``prefix``, from a line start
    (``prefix[inline_head_start(prefix, limit, step):]``)."""
    return prefix[inline_head_start(prefix, limit, step) :]


def inline_head_start(
    prefix: str, limit: int = INLINE_PREFIX_CHARS, step: int = INLINE_ANCHOR_CHARS, keep: int | None = None
) -> int:  # fmt: skip
    """Where the inline prompt's head starts in ``prefix``: a line start ``limit`` to
    ``limit + step`` characters before its end, or 0 when ``prefix`` is shorter.

    Why a grid: a keystroke grows the prefix by a character. Had the window's start been
    ``len(prefix) - limit``, it would slide with every keystroke and, each time it passed
    a line break, change the prompt's first tokens, so the buffer's cached prompt would be
    worth nothing and the whole window (~2,000 tokens) would run again. Snapped down to a
    multiple of ``step``, the start moves once per ``step`` characters typed. ``step`` 0:
    the sliding window (its first, partial line dropped), as before the grid.

    ``keep``: the start the buffer's previous request used. Kept while it is still a line
    start and leaves a head of ``limit - step`` to ``limit + 2 * step`` characters, so a
    cursor that jumps a few screens up or down (reading, then typing elsewhere) still
    shares the cached head up to the nearer of the two cursors; the grid alone would start
    the head elsewhere, and run the whole prompt again, whenever the jump crossed a grid
    line (a jump of a quarter of ``step``: one time in four).
    """
    if keep is not None and step > 0 and 0 <= keep <= len(prefix) and (keep == 0 or prefix[keep - 1] == "\n"):
        head = len(prefix) - keep
        if (keep == 0 and head <= limit + 2 * step) or limit - step <= head < limit + 2 * step:
            return keep
    if len(prefix) <= limit:
        return 0
    cut = len(prefix) - limit
    if step <= 0:
        nl = prefix.find("\n", cut)
        return nl + 1 if nl >= 0 else cut
    cut = cut // step * step
    if cut == 0 or prefix[cut - 1] == "\n":
        return cut
    nl = prefix.find("\n", cut)
    return nl + 1 if nl >= 0 else cut


def inline_tail_ids(tok: Any, suffix: str, chars: int = INLINE_SUFFIX_CHARS, tokens: int | None = None) -> list[int]:
    """Token ids of the text after the cursor that the prompt carries: at most ``chars``
    characters and, with ``tokens``, the most whole lines that fit in ``tokens`` ids.

    Why a token budget: in prefix-suffix-middle order every token after the cursor comes
    after the text being typed, so each keystroke's request runs all of them again (the
    cache holds the prompt only up to the cursor). On a laptop CPU 2,000 characters are
    ~550 tokens, about 3 s a keystroke on two cores. Whole lines keep the cut where the
    model expects text to end. If the cursor's own line alone is too long, its first
    ``tokens`` ids.
    """
    tail = suffix[:chars]
    ids = list(tok.encode(tail, add_bos=False, parse_special=False))
    if tokens is None or len(ids) <= tokens:
        return ids
    ends = [i + 1 for i, c in enumerate(tail) if c == "\n"]

    def fit(k: int) -> list[int] | None:  # the first k whole lines, if they fit
        got = list(tok.encode(tail[: ends[k - 1]], add_bos=False, parse_special=False))
        return got if len(got) <= tokens else None

    lo, hi, best = 1, len(ends), None  # the most lines that fit: ids grow with the lines
    while lo <= hi:
        mid = (lo + hi) // 2
        got = fit(mid)
        if got is None:
            hi = mid - 1
        else:
            best, lo = got, mid + 1
    return best if best is not None else ids[: max(0, tokens)]


def auto_suffix_tokens(engine: EngineLike, budget_s: float = INLINE_SUFFIX_BUDGET_S) -> int | None:
    """The inline suffix's token budget for ``engine``: the most tokens, a power of two
    within [32, 1024] (so that small differences in the measured speed do not change the
    prompt), whose prefill takes at most ``budget_s`` (``Engine.prefill_seconds``); 32 if
    none does. None (characters only) for an engine that does not know its prefill time
    (a remote one, whose server's GPU prefills 2,000 characters in milliseconds)."""
    cost_of = getattr(engine, "prefill_seconds", None)
    if not callable(cost_of) or cost_of(INLINE_SUFFIX_TOKENS_MIN) is None:
        return None
    n = INLINE_SUFFIX_TOKENS_MIN
    while n < INLINE_SUFFIX_TOKENS_MAX and cost_of(2 * n) <= budget_s:
        n *= 2
    return n


def inline_prompt(
    engine: EngineLike, prefix: str, suffix: str, *, suffix_tokens: int | None = None,
    anchor: int = INLINE_ANCHOR_CHARS, keep_start: int | None = None, head_chars: int = INLINE_PREFIX_CHARS,
) -> InlinePrompt:  # fmt: skip
    """FIM (prefix-suffix-middle) when the model has FIM tokens, else a raw continuation.

    ``suffix_tokens``: the most tokens after the cursor (whole lines; None: characters
    only); ``head_chars``, ``anchor``: the head window's least length and its grid,
    ``keep_start``: the buffer's previous head start (``inline_head_start``). ``head_start`` of the result is None when the head had
    to be cut to the context (a small model): its first token is then mid-line and moves
    with the cursor, so there is nothing worth keeping. A kept start that would need that
    cut is dropped first (it may make a longer head than the grid's)."""
    tok = engine.tokenizer
    # Characters bound the work; tokens bound the context (dense text is ~1 token a char).
    limit = _context_tokens(engine)
    room = None if limit is None else max(64, limit // 2)  # the rest: reply and drafts
    fim = getattr(tok, "fim", None)
    tail_ids = inline_tail_ids(tok, suffix, INLINE_SUFFIX_CHARS, suffix_tokens) if fim is not None else []
    extra = len(tail_ids) + 3 if fim is not None else 0  # the tail and the three FIM ids

    def head_of(keep: int | None) -> tuple[int, list[int]]:
        start = inline_head_start(prefix, head_chars, anchor, keep)
        if fim is not None:
            return start, list(tok.encode(prefix[start:], add_bos=False, parse_special=False))
        return start, list(tok.encode(prefix[start:], parse_special=False))

    start, head_ids = head_of(keep_start)
    if keep_start is not None and room is not None and len(head_ids) + extra > room:
        start, head_ids = head_of(None)
    cut = room is not None and len(head_ids) + extra > room
    if fim is not None:
        if cut and room is not None:
            keep_tail = min(len(tail_ids), room // 4)
            tail_ids = tail_ids[:keep_tail]
            head_ids = head_ids[-max(1, room - 3 - keep_tail):]  # the text nearest the cursor
        ids = [fim.prefix, *head_ids, fim.suffix, *tail_ids, fim.middle]
        return InlinePrompt(ids=ids, mode="fim", head_start=None if cut else start, head_len=1 + len(head_ids))
    ids = head_ids
    if cut and room is not None:
        bos = ids[:1] if getattr(tok, "add_bos", False) else []
        ids = bos + ids[-(room - len(bos)):]
    return InlinePrompt(ids=ids, mode="prefix", head_start=None if cut else start, head_len=len(ids))


def heal_prefix(prefix: str) -> tuple[str, str]:
    """Split one trailing space off the prompt prefix: (prompt prefix, removed text).

    Tokenizers glue a space to the following word (" return"), so a prompt that ends
    in a space pushes the model to emit yet another space. Prompting without the last
    space lets the model write " return" itself; ``unheal`` then drops that space.
    (Removing all the indentation was tried: SmolLM2 then answers with a code fence.)
    """
    if prefix.endswith(" "):
        return prefix[:-1], " "
    return prefix, ""


def unheal(completion: str, removed: str) -> str:
    """The completion as it continues the original (unhealed) prefix."""
    if not removed:
        return completion
    if completion.startswith(removed):
        return completion[len(removed) :]
    head = completion[: len(completion) - len(completion.lstrip(" \t"))]
    if head and removed.startswith(head):  # the model wrote less whitespace than was typed
        return completion[len(head) :]
    return completion


def indentation(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def block_end(completion: str, indent: int) -> int | None:
    """Where a multi-line completion stops: before a blank line or a line dedented below
    ``indent`` (the cursor line's indentation). None while the block is still open.

    The first line (the rest of the cursor's line) is always kept.
    """
    pos = completion.find("\n")
    while pos >= 0:
        start = pos + 1
        nxt = completion.find("\n", start)
        line = completion[start:] if nxt < 0 else completion[start:nxt]
        complete = nxt >= 0
        if complete and not line.strip():
            return pos
        if line.strip() and indentation(line) < indent:
            return pos
        if not complete:
            return None
        pos = nxt
    return None


def finish_completion(completion: str, indent: int) -> str:
    """Cut at the block end and drop trailing whitespace."""
    cut = block_end(completion, indent)
    text = completion if cut is None else completion[:cut]
    return text.rstrip()
