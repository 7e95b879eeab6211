"""Chat prompts: render ``tokenizer.chat_template`` like Hugging Face, encode safely.

Rendering follows ``transformers``' ``apply_chat_template``: a sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, ``raise_exception``, a ``tojson`` that keeps non-ASCII text, and the
``bos_token``/``eos_token`` strings as variables.

Encoding (``encode_chat``) must parse the template's own markup
(``<|im_start|>``) as special tokens but must never do so for text the user
typed. How: the template is rendered once with every message's content
replaced by a unique placeholder. The rendered text is then cut into markup
and content pieces; special tokens are recognised only in the markup pieces.
The text between two special tokens (markup and content joined) is encoded as
one run with ``parse_special=False``, so byte-pair merges across the
markup/content seam are exactly those of encoding the whole string — the only
difference from a plain ``encode(rendered)`` is that special-token text inside
content stays ordinary text. If the template alters the content (e.g. trims
it) so the placeholder rendering does not reproduce the real one, content spans
are found by searching the real rendering for each content in order instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from echoline.engine.errors import EcholineError
from echoline.engine.tokenizer import Tokenizer
from jinja2.sandbox import ImmutableSandboxedEnvironment

Message = Mapping[str, Any]


class ChatTemplateError(EcholineError):
    """The chat template failed to render (or raised via ``raise_exception``)."""


class NoChatTemplateError(ChatTemplateError):
    """The model has no chat template: it is a base model, use raw prompts."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template error: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc


def _template_and_vars(source: Tokenizer | str) -> tuple[str, dict[str, str]]:
    if isinstance(source, Tokenizer):
        if source.chat_template is None:
            raise NoChatTemplateError(
                "this model has no chat template (tokenizer.chat_template); it is a base model, "
                "so use raw prompts (plain text or FIM) instead of chat messages"
            )
        variables = {}
        for name, tid in (("bos_token", source.bos_id), ("eos_token", source.eos_id)):
            variables[name] = source.token_text(tid) if tid is not None else ""
        return source.chat_template, variables
    if not source or not source.strip():
        raise NoChatTemplateError("empty chat template: use raw prompts instead of chat messages")
    return source, {"bos_token": "", "eos_token": ""}


def render_chat(
    tokenizer_or_template: Tokenizer | str,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """The prompt text the model's template makes of ``messages``."""
    template, variables = _template_and_vars(tokenizer_or_template)
    compiled = _compile(template)
    context = {
        **variables,
        **extra,
        "messages": [dict(m) for m in messages],
        "add_generation_prompt": add_generation_prompt,
    }
    try:
        return compiled.render(**context)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template failed to render: {exc}") from exc


def _placeholder(i: int) -> str:
    # Private-use characters: no vocabulary's special token contains them.
    return f"\ue000echoline-content-{i}\ue001"


_PLACEHOLDER_RE = re.compile("\ue000echoline-content-(\\d+)\ue001")


def _segments(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    add_generation_prompt: bool,
    extra: dict[str, Any],
) -> list[tuple[str, bool]]:
    """The rendered prompt as (text, is_content) pieces, in order."""
    rendered = render_chat(tokenizer, messages, add_generation_prompt, **extra)
    contents: list[str] = []
    masked: list[dict[str, Any]] = []
    for m in messages:
        m2 = dict(m)
        if isinstance(m2.get("content"), str) and m2["content"]:
            m2["content"] = _placeholder(len(contents))
            contents.append(m["content"])
        masked.append(m2)
    if not contents:
        return [(rendered, False)]
    shaped = render_chat(tokenizer, masked, add_generation_prompt, **extra)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for match in _PLACEHOLDER_RE.finditer(shaped):
        idx = int(match.group(1))
        pieces.append((shaped[pos : match.start()], False))
        pieces.append((contents[idx] if idx < len(contents) else match.group(0), True))
        pos = match.end()
    pieces.append((shaped[pos:], False))
    if "".join(p for p, _ in pieces) == rendered:
        return pieces
    return _segments_by_search(rendered, contents)


def _segments_by_search(rendered: str, contents: list[str]) -> list[tuple[str, bool]]:
    """Fallback: find each content (or its stripped form) in order in the real rendering."""
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for content in contents:
        for candidate in (content, content.strip()):
            at = rendered.find(candidate, pos) if candidate else -1
            if at >= 0:
                pieces.append((rendered[pos:at], False))
                pieces.append((candidate, True))
                pos = at + len(candidate)
                break
    pieces.append((rendered[pos:], False))
    return pieces


def _special_regex(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    cached = getattr(tokenizer, "_chat_special_re", None)
    if cached is not None:
        return cached
    texts = sorted(tokenizer.special_texts, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in texts)) if texts else None
    tokenizer._chat_special_re = pattern  # type: ignore[attr-defined]
    return pattern


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    **extra: Any,
) -> list[int]:
    """Token ids of the chat prompt; special tokens are parsed only in template markup."""
    pattern = _special_regex(tokenizer)
    specials = tokenizer.special_texts
    runs: list[str | int] = [""]  # text runs and special-token ids, alternating as found
    for text, is_content in _segments(tokenizer, messages, add_generation_prompt, dict(extra)):
        if is_content or pattern is None:
            runs[-1] = str(runs[-1]) + text
            continue
        pos = 0
        for match in pattern.finditer(text):
            runs[-1] = str(runs[-1]) + text[pos : match.start()]
            runs.append(specials[match.group(0)])
            runs.append("")
            pos = match.end()
        runs[-1] = str(runs[-1]) + text[pos:]
    ids: list[int] = []
    for run in runs:
        if isinstance(run, int):
            ids.append(run)
        elif run:
            ids.extend(tokenizer.encode(run, add_bos=False, parse_special=False))
    if (
        tokenizer.add_bos
        and tokenizer.bos_id is not None
        and (not ids or ids[0] != tokenizer.bos_id)
    ):
        ids.insert(0, tokenizer.bos_id)
    return ids


class PromptEncoding:
    """``encode``/``encode_chat`` over ``self.tokenizer``: one definition for every engine
    (the in-process ``Engine`` and ``RemoteEngine`` render prompts identically, which is
    what keeps a remote server's prefix cache byte-stable)."""

    tokenizer: Tokenizer

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.chat_template is not None

    def encode(self, text: str) -> list[int]:
        """A raw prompt: special-token text parsed, BOS as the model's metadata says."""
        return self.tokenizer.encode(text, parse_special=True)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Messages through the chat template; user content is never parsed as special tokens."""
        return encode_chat(self.tokenizer, messages, add_generation_prompt=True)

