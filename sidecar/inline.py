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

from echoline.sidecar.lsp_utils import UTF16, unit_len
from echoline.sidecar.prompts import (
    INLINE_ANCHOR_CHARS,
    auto_suffix_tokens,
    block_end,
    finish_completion,
    heal_prefix,
    indentation,
    inline_prompt,
    unheal,
)
from lsprotocol import types


@dataclass
class InlineOutcome:
    text: str | None  # None: stopped by a cancel or a newer request
    stats: dict[str, Any]
    mode: str
    head_start: int | None = None  # the prompt's head start: the buffer's next ``keep_start``


def completion_end(
    pos: types.Position, rest_of_line: str, completion: str, encoding: str = UTF16
) -> types.Position:
    """Where an inline item's range ends: the end of the cursor's line when the rest of
    that line is blank or repeated at the end of the completion's first line (an
    auto-closed ")" the model wrote too), so accepting it does not duplicate text;
    otherwise the cursor itself (a pure insertion). ``encoding``: the session's
    position encoding, the unit the end's character is counted in."""
    first = completion.split("\n", 1)[0]
    tail = rest_of_line.strip()
    if rest_of_line and (not tail or first.rstrip().endswith(tail)):
        width = unit_len(rest_of_line, encoding)
        return types.Position(line=pos.line, character=pos.character + width)
    return pos


def inline_job(
    prefix: str, suffix: str, cursor_line: str, uri: str, max_tokens: int, spec: bool,
    suffix_tokens: int | None = None, *, auto_suffix: bool = True,
    anchor: int = INLINE_ANCHOR_CHARS, keep_start: int | None = None,
) -> Callable[[Any, threading.Event], InlineOutcome]:  # fmt: skip
    """The worker job completing at the cursor: text before it (``prefix``), after it
    (``suffix``), the cursor line up to the cursor, the buffer's session name part.

    ``suffix_tokens``: the most tokens after the cursor the prompt carries (the
    ``inlineSuffixTokens`` setting); None with ``auto_suffix``: the engine's budget
    (``auto_suffix_tokens``), without: characters only. ``anchor``: the head window's
    grid (0: the sliding window; ``bench inline`` compares the layouts); ``keep_start``:
    the head start of the buffer's previous request (``InlineOutcome.head_start``), kept
    where it still fits (``inline_head_start``)."""
    healed, removed = heal_prefix(prefix)
    indent = indentation(cursor_line)

    def removed_ws(generated: str) -> str:
        return unheal(generated, removed)

    def job(engine: Any, cancel: threading.Event) -> InlineOutcome:
        budget = suffix_tokens if suffix_tokens is not None or not auto_suffix else auto_suffix_tokens(engine)
        prompt = inline_prompt(engine, healed, suffix, suffix_tokens=budget, anchor=anchor, keep_start=keep_start)
        if not prompt.ids:  # nothing before the cursor (and no BOS): nothing to continue
            return InlineOutcome(None, {}, prompt.mode, prompt.head_start)
        ended = threading.Event()
        tok = engine.tokenizer
        is_control = getattr(tok, "is_control", lambda _t: False)

        def on_token(ev: Any) -> None:
            # A control token (a FIM model's <|fim_suffix|>, <|file_sep|>, ...) ends the
            # middle: its text must never reach the user's buffer.
            if any(is_control(t) for t in ev.new_ids) or block_end(removed_ws(ev.text), indent) is not None:
                ended.set()
                cancel.set()

        result = engine.generate(
            prompt.ids,
            max_tokens=max_tokens,
            spec=spec,
            session="inline:" + uri,
            on_token=on_token,
            cancel=cancel,
        )
        stats = result.stats.as_dict()
        if result.finish_reason == "cancelled" and not ended.is_set():
            return InlineOutcome(None, stats, prompt.mode, prompt.head_start)
        ids = list(result.token_ids)
        cut = next((i for i, t in enumerate(ids) if is_control(t)), None)
        generated = result.text if cut is None else tok.decode(ids[:cut])
        return InlineOutcome(finish_completion(removed_ws(generated), indent), stats, prompt.mode, prompt.head_start)

    return job
