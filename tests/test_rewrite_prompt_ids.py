"""Rewrite prompt ids are composed from pieces (``prompts.rewrite_prompt_ids``): the file's
part comes from the engine's chunk cache (``source_tokens.tokens_of``) that the draft index
fills, so a file version is tokenized once across the draft source, the idle prefill and
the requests, and an edit re-tokenizes only the chunk it touched. The composition equals
whole-text tokenization on ordinary code (the real Qwen and SmolLM2 tokenizers), the
prefix ids are a prefix of every request's ids, and a reloaded model starts empty."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from echoline.sidecar import prompt_pieces
from echoline.sidecar.prompts import (
    _whole_prompt_ids,
    fitted_rewrite_ids,
    rewrite_prefix_ids,
    rewrite_prompt,
    rewrite_prompt_ids,
)
from echoline.sidecar.source_tokens import tokens_of
from echoline.sidecar.worker import EngineWorker

REPO = Path(__file__).resolve().parent.parent


class _Tok:
    def __init__(self, shift: int = 0) -> None:
        self.calls = 0
        self.shift = shift  # another "vocabulary"

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        self.calls += 1
        return ([1] if add_bos else []) + [(ord(c) + self.shift) % 500 for c in text]


class _Engine:
    def __init__(self, chat: bool, shift: int = 0) -> None:
        self.tokenizer = _Tok(shift)
        self.has_chat_template = chat

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        ids = [2]
        for m in messages:  # each message framed by its role's marker
            ids += [4 if m["role"] == "system" else 5] + self.tokenizer.encode(m["content"], add_bos=False)
        return ids + [3]


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
    assert engine.tokenizer.calls == calls  # a retried request tokenizes nothing
    assert ids == rewrite_prompt_ids(fresh, prompt) and first == rewrite_prefix_ids(fresh, text, name="a.py")
    assert ids == _whole_prompt_ids(fresh, prompt)  # one id a character: no join can differ
    edited = text.replace("x", "z")
    assert rewrite_prefix_ids(engine, edited, name="a.py") == rewrite_prefix_ids(_Engine(chat), edited, name="a.py")
    assert ids[: len(first)] == first


def test_a_new_engine_or_tokenizer_does_not_reuse_old_ids() -> None:
    """A model reload is a new engine object: its chunk cache starts empty; a tokenizer
    swapped on the same object drops the old cache too."""
    text = "def f(x):\n    return x\n\n\ndef g(y):\n    return y\n" * 20
    old = _Engine(True)
    rewrite_prefix_ids(old, text, name="a.py")
    assert tokens_of(old).memory_bytes() > 0
    new = _Engine(True, shift=7)  # another vocabulary
    assert tokens_of(new).memory_bytes() == 0
    prompt = rewrite_prompt(text, 0, 10, "", name="a.py")
    assert rewrite_prompt_ids(new, prompt) == _whole_prompt_ids(_Engine(True, shift=7), prompt)
    cache = tokens_of(old)
    old.tokenizer = _Tok(shift=7)
    assert tokens_of(old) is not cache and tokens_of(old).memory_bytes() == 0
    assert rewrite_prompt_ids(old, prompt) == rewrite_prompt_ids(new, prompt)


class _SpaceTok(_Tok):
    """A vocabulary that puts a space before every text (SentencePiece's add_space_prefix)."""

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        return super().encode(" " + text if text else text, add_bos, parse_special)


def test_an_engine_whose_pieces_may_not_be_joined_tokenizes_whole() -> None:
    engine = _Engine(True)
    engine.tokenizer = _SpaceTok()
    assert not prompt_pieces.joinable(engine)
    text = "def f(x):\n    return x\n"
    prompt = rewrite_prompt(text, 0, 9, "rename", name="a.py")
    ids = rewrite_prompt_ids(engine, prompt)
    assert ids == engine.encode_chat(prompt.messages) + engine.tokenizer.encode(prompt.prime, add_bos=False)
    prefix = rewrite_prefix_ids(engine, text, name="a.py")
    assert prefix and ids[: len(prefix)] == prefix


# ---- the real tokenizers -----------------------------------------------------------------


def _counting(tok: Any) -> list[str]:
    """Make ``tok`` (a real tokenizer, still one for ``isinstance``) record every text it
    encodes; returns the record."""
    texts: list[str] = []
    encode, encode_batch = tok.encode, tok.encode_batch

    def counted(text: str, **kw: Any) -> list[int]:
        texts.append(text)
        return encode(text, **kw)

    def counted_batch(batch: list[str], **kw: Any) -> list[list[int]]:
        texts.extend(batch)
        return encode_batch(batch, **kw)

    tok.encode, tok.encode_batch = counted, counted_batch
    return texts


def _engine_class() -> type:
    from echoline.engine.chat_template import PromptEncoding

    class RealTokEngine(PromptEncoding):
        """An engine's tokenizing side (no weights): chat template, draft-source ids."""

        takes_source_ids = True

        def __init__(self, tok: Any) -> None:
            self.tokenizer = tok
            self.config = SimpleNamespace(context_length=32768)
            self.sources: dict[str, list[int]] = {}

        def set_source_ids(self, sid: str, ids: Any) -> None:
            self.sources[sid] = list(ids)

        def remove_source(self, sid: str) -> None:
            self.sources.pop(sid, None)

    return RealTokEngine


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2"])
def real_tok(request: pytest.FixtureRequest) -> Any:
    from echoline.engine.gguf_file import GGUFFile
    from echoline.engine.model_catalog import resolve_model
    from echoline.engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(resolve_model(request.param)))


FILES = ["sidecar/prompts.py", "sidecar/worker.py", "sidecar/source_tokens.py", "engine/chat_template.py",
         "sidecar/idle_prefill.py", "engine/tokenizer.py", "tests/test_sidecar_prefill.py"]


@pytest.mark.parametrize("chat", [True, False])
def test_composed_ids_equal_whole_text_tokenization(real_tok: Any, chat: bool) -> None:
    """Ordinary code, short files (the whole file) and long ones (a window of lines, as
    ``fitted_rewrite_ids`` halves it), with and without the chat template."""
    engine = _engine_class()(real_tok)
    if not chat:
        engine.tokenizer = SimpleNamespace(**{k: getattr(real_tok, k) for k in ("encode", "encode_batch")},
                                           chat_template=None)
    assert engine.has_chat_template == chat
    for rel in FILES:
        text = (REPO / rel).read_text()
        for start, end, instr in ((0, min(300, len(text)), ""), (len(text) // 2, len(text) // 2 + 120, "add types")):
            for window in (16000, 8000, 500):
                prompt = rewrite_prompt(text, start, end, instr, name=rel, window=window)
                assert rewrite_prompt_ids(engine, prompt) == _whole_prompt_ids(engine, prompt), (rel, window)
        for tail in ("", "\n\n", "  \n", "x = (1,)"):  # odd file ends
            small = text[:3000] + tail
            prompt = rewrite_prompt(small, 100, 200, "", name=rel)
            assert rewrite_prompt_ids(engine, prompt) == _whole_prompt_ids(engine, prompt), (rel, tail)


def module_text(n: int = 120) -> str:
    """Ordinary code whose every line is distinct (so each line's encodings can be counted)."""
    out = []
    for i in range(n):
        out.append(f"def scale_{i}(values, factor={i + 2}):\n")
        out.append(f"    return [v * factor for v in values if v >= {i}]\n")
    return "".join(out)


def _line_counts(texts: list[str], lines: list[str]) -> Counter[str]:
    return Counter({line: sum(t.count(line) for t in texts) for line in lines})


def test_a_file_version_is_encoded_once_and_an_edit_only_its_chunk() -> None:
    """Draft source (the worker), idle prefill and two requests on one file version: each
    line of the file is tokenized once (the selection's lines again in the request's
    volatile part). After an edit, only the edited chunk is tokenized again."""
    from echoline.engine.gguf_file import GGUFFile
    from echoline.engine.model_catalog import resolve_model
    from echoline.engine.tokenizer import Tokenizer

    path = resolve_model("qwen2.5-coder-0.5b")
    tok = Tokenizer.from_gguf(GGUFFile(path))
    texts = _counting(tok)
    made: list[Any] = []
    worker = EngineWorker(lambda model, **kw: made.append(_engine_class()(tok)) or made[-1])
    uri = "file:///w/mod.py"
    try:
        worker.load("fake").future.result(30)
        engine = made[0]
        prompt_pieces.chat_frame(engine), prompt_pieces.joinable(engine)  # once per engine, not per file
        text = module_text()
        lines = [ln for ln in text.splitlines(keepends=True)]
        sel = text.index("def scale_60"), text.index("def scale_61")
        texts.clear()
        worker.set_source("file:" + uri, text)

        def requests(src: str) -> tuple[list[int] | None, list[list[int]]]:
            # the prefill first: a request cancels a background job still queued
            prefix = worker.submit(lambda e, _c: rewrite_prefix_ids(e, src, name=uri), kind="prefill")
            got = prefix.future.result(30)
            outs = [worker.submit(lambda e, _c, i=i: fitted_rewrite_ids(e, src, *sel, i, name=uri)[1],
                                  kind="rewrite") for i in ("", "rename factor to k")]
            return got, [o.future.result(30) for o in outs]

        prefix, ids = requests(text)
        reference = _engine_class()(Tokenizer.from_gguf(GGUFFile(path)))
        assert engine.sources["file:" + uri] == reference.tokenizer.encode(text, add_bos=False, parse_special=False)
        counts = _line_counts(texts, lines)
        body = set(text[sel[0] : sel[1]].splitlines(keepends=True))
        assert all(counts[ln] == 1 for ln in lines if ln not in body), counts
        assert prefix and all(r[: len(prefix)] == prefix for r in ids)

        at = text.index("def scale_90")
        edited = text[:at] + "SCALE = 3\n" + text[at:]
        texts.clear()
        worker.set_source("file:" + uri, edited)
        prefix, ids = requests(edited)
        encoded = sum(len(t) for t in texts)
        assert 0 < encoded < len(edited) // 10, encoded
        assert sum(t.count("SCALE = 3\n") for t in texts) == 1  # the edited chunk, once
        assert prefix and all(r[: len(prefix)] == prefix for r in ids)
        whole = rewrite_prompt(edited, *sel, "", name=uri)
        assert ids[0] == _whole_prompt_ids(reference, whole)
    finally:
        worker.stop()
