"""Token ids of a prompt's pieces, per engine: the chat frame around one user message,
small texts kept by content, and whether ids may be joined at line cuts at all.

Why pieces: a rewrite prompt is the chat template's head, the file (its ids come from
the engine's chunk cache, ``sidecar.source_tokens``, where the draft index put them),
the volatile request and the template's tail. Tokenizing each piece on its own, rather
than the whole prompt text, is what lets the file's ids be reused; the prompt is then
*defined* as the concatenation (``sidecar.prompts.rewrite_prompt_ids``), which every path
uses, so speculative and plain generation always see the same ids. Two checks, once per
engine, tell whether that concatenation is what whole-text tokenization gives for
ordinary code (``joinable``, ``chat_frame``); where not (a SentencePiece vocabulary that
puts a space before every text it encodes, a template that rewrites the message), the
caller tokenizes the whole text instead (``whole_ids``).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

#: Texts whose ids are kept, per engine, last used first (pieces of the last few
#: requests: a retried request or the next halving of a window finds them).
KEPT = 32

#: Probe messages for ``chat_frame``: they start like every rewrite message ("Here is")
#: and end like one (a closing fence; an instruction's last word).
_PROBES = (
    "Here is a.py:\n```python\nx = 1\n```\n\nRewrite this code:\n```python\nx = 1\n```",
    "Here is the file:\n```\ny\n```\n\nMake it faster.",
)
#: Two lines cut where ``split_chunks`` cuts: joined ids must equal the whole text's.
_JOIN_PROBE = ("x = compute(1)\n", "y = 2\n")
#: Texts that end in white space other than one newline, and what follows them (``end_cut``).
_END_PROBES = ("x = f(1)\n\n", "x = 1  \n", "y\n\n\n", "z()\n \n", "return x\n\t\n")
_AFTER_END = "```\n\nRewrite"

_UNSET: Any = object()


@dataclass
class _State:
    tokenizer: Any  # the tokenizer these ids are of (a swapped one invalidates them)
    kept: OrderedDict[tuple[str, int], tuple[str, tuple[int, ...]]] = field(default_factory=OrderedDict)
    frames: dict[str | None, Any] = field(default_factory=dict)  # by system message: frame or None
    joinable: bool | None = None
    end_cut: Any = _UNSET  # int | None once known


_states: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _state(engine: Any) -> _State | None:
    """``engine``'s state; None for an engine that cannot be weakly referenced (then
    nothing is kept and every check runs again)."""
    tok = engine.tokenizer
    with _lock:
        try:
            st = _states.get(engine)
            if st is None or st.tokenizer is not tok:
                st = _State(tok)
                _states[engine] = st
        except TypeError:
            return None
        return st


def _kept(engine: Any, kind: str, text: str, make: Any) -> list[int]:
    """``make(text)``'s ids, each text once while among the engine's last ``KEPT``;
    checked against the whole text, so a hit is exactly what encoding gives."""
    st = _state(engine)
    key = (kind, hash(text))
    if st is not None:
        with _lock:
            hit = st.kept.get(key)
            if hit is not None and hit[0] == text:
                st.kept.move_to_end(key)
                return list(hit[1])
    ids = [int(t) for t in make(text)]
    if st is not None:
        with _lock:
            st.kept[key] = (text, tuple(ids))
            st.kept.move_to_end(key)
            while len(st.kept) > KEPT:
                st.kept.popitem(last=False)
    return ids


def text_ids(engine: Any, text: str) -> list[int]:
    """``text`` as plain text: no BOS, special-token text left as characters."""
    if not text:
        return []
    return _kept(engine, "text", text, lambda t: engine.tokenizer.encode(t, add_bos=False, parse_special=False))


def bos_ids(engine: Any) -> list[int]:
    """What a raw prompt starts with: BOS when the model's metadata asks for it (as
    ``tokenizer.encode(text, parse_special=False)`` puts it), else nothing."""
    return _kept(engine, "bos", "", lambda t: engine.tokenizer.encode(t, parse_special=False))


def chat_messages(content: str, system: str | None = None) -> list[dict[str, str]]:
    """The messages of a one-turn prompt: ``system`` (when given), then the user's ``content``."""
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": content}]


def whole_ids(engine: Any, text: str, chat: bool, system: str | None = None) -> list[int]:
    """``text`` tokenized whole as a prompt (``chat``: as the user message of the engine's
    chat template, after ``system`` when given; else as raw text after BOS), kept like
    ``text_ids``. The way for engines whose pieces may not be joined (``joinable``,
    ``chat_frame``)."""
    if chat:
        return _kept(engine, f"chat:{system or ''}", text,
                     lambda t: engine.encode_chat(chat_messages(t, system)))
    return _kept(engine, "plain", text, lambda t: engine.tokenizer.encode(t, parse_special=False))


def joinable(engine: Any) -> bool:
    """Whether ids of texts cut at a line start may be joined: the ids of two code lines
    apart equal the ids of both together. False for a vocabulary that adds a space before
    each text (SentencePiece's ``add_space_prefix``): joined, every piece would start
    with a space the file does not have."""
    st = _state(engine)
    if st is not None and st.joinable is not None:
        return st.joinable
    a, b = _JOIN_PROBE
    ok = text_ids(engine, a) + text_ids(engine, b) == text_ids(engine, a + b)
    if st is not None:
        st.joinable = ok
    return ok


def chat_frame(engine: Any, system: str | None = None) -> tuple[list[int], list[int]] | None:
    """The chat template's ids before and after one user message's content (after the
    ``system`` message, when given), found once per engine and system message:
    ``head + text_ids(content) + tail == engine.encode_chat(chat_messages(content, system))`` for
    contents that start and end like a rewrite message (both probes are checked). None
    when the template does not frame a message so (it rewrites the content, or its text
    next to the content merges with it): the caller then encodes the whole message.

    Why from ``encode_chat`` and not by rendering the template: the template's parts are
    encoded there (special tokens parsed in template text only, BOS as the model asks),
    and finding the content's ids inside its output keeps exactly that encoding."""
    st = _state(engine)
    if st is not None and system in st.frames:
        return st.frames[system]
    frame = _find_frame(engine, system)
    if st is not None:
        st.frames[system] = frame
    return frame


def _find_frame(engine: Any, system: str | None) -> tuple[list[int], list[int]] | None:
    def chat(content: str) -> list[int]:
        return [int(t) for t in engine.encode_chat(chat_messages(content, system))]

    first = chat(_PROBES[0])
    inner = text_ids(engine, _PROBES[0])
    n = len(inner)
    at = [i for i in range(len(first) - n + 1) if first[i : i + n] == inner]
    if len(at) != 1:
        return None
    head, tail = first[: at[0]], first[at[0] + n :]
    for probe in _PROBES[1:]:
        if head + text_ids(engine, probe) + tail != chat(probe):
            return None
    return head, tail


def end_cut(engine: Any) -> int | None:
    """Where a text that ends in white space other than one newline after a non-space
    character (a file's blank last lines, trailing spaces) may be cut from what follows it:
    the number of its last characters that must be encoded with the following text, 0 or 1;
    None when neither keeps the ids of the whole (then the caller moves more).

    Why it depends on the vocabulary: Qwen's and Llama 3's pre-tokenizers put a run of
    newlines in one piece wherever the text ends (0), GPT-2's (SmolLM2) leaves the run's
    last character for what follows it, but takes the whole run at the text's end (1)."""
    st = _state(engine)
    if st is not None and st.end_cut is not _UNSET:
        return st.end_cut
    found = None
    for k in (0, 1):
        if all(text_ids(engine, p[: len(p) - k]) + text_ids(engine, p[len(p) - k :] + _AFTER_END)
               == text_ids(engine, p + _AFTER_END) for p in _END_PROBES):
            found = k
            break
    if st is not None:
        st.end_cut = found
    return found
