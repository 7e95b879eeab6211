"""Rewrite prompts are tokenized once per text: a rerun of the idle prefill on the same
file, or a retried request, reuses the ids (``prompts._prompt_ids``), and they are exactly
what encoding gives."""

from __future__ import annotations

import pytest
from echoline.sidecar.prompts import rewrite_prefix_ids, rewrite_prompt, rewrite_prompt_ids


class _Tok:
    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        self.calls += 1
        return ([1] if add_bos else []) + [ord(c) % 500 for c in text]


class _Engine:
    def __init__(self, chat: bool) -> None:
        self.tokenizer = _Tok()
        self.has_chat_template = chat

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return [2] + self.tokenizer.encode(messages[0]["content"], add_bos=False) + [3]


@pytest.mark.parametrize("chat", [False, True])
def test_each_text_is_tokenized_once(chat: bool) -> None:
    engine, fresh = _Engine(chat), _Engine(chat)
    text = "def f(x):\n    return x\n\n\ndef g(y):\n    return y\n"
    first = rewrite_prefix_ids(engine, text, name="a.py")
    calls = engine.tokenizer.calls
    assert rewrite_prefix_ids(engine, text, name="a.py") == first and engine.tokenizer.calls == calls
    prompt = rewrite_prompt(text, 0, 24, "Add types.", name="a.py")
    ids = rewrite_prompt_ids(engine, prompt)
    calls = engine.tokenizer.calls
    assert rewrite_prompt_ids(engine, prompt) == ids
    assert engine.tokenizer.calls == calls + (1 if chat else 0)  # only the primed fence again
    assert ids == rewrite_prompt_ids(fresh, prompt) and first == rewrite_prefix_ids(fresh, text, name="a.py")
    edited = text.replace("x", "z")
    assert rewrite_prefix_ids(engine, edited, name="a.py") == rewrite_prefix_ids(_Engine(chat), edited, name="a.py")
    assert ids[: len(first)] == first
