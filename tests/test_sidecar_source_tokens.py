"""Incremental tokenization of draft sources: chunks, reuse after an edit, the worker's use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from echoline.sidecar.source_tokens import SourceTokens, split_chunks
from echoline.sidecar.worker import EngineWorker


def module_text(n: int = 400) -> str:
    """Code with many column-0 lines right after non-blank ones (stable cut points)."""
    out = []
    for i in range(n):
        out.append(f"value_{i} = compute({i}, 'text {i}')\n")
        if i % 7 == 0:
            out.append(f"def helper_{i}(x):\n    return x * {i}\n")
    return "".join(out)


class CharEncoder:
    """One id per character; remembers how many characters it was asked to encode."""

    def __init__(self) -> None:
        self.chars = 0
        self.calls = 0

    def __call__(self, texts: list[str]) -> list[list[int]]:
        self.calls += 1
        self.chars += sum(len(t) for t in texts)
        return [[ord(c) for c in t] for t in texts]


@pytest.mark.parametrize(
    "text",
    ["", "x", "no newline at all", "a\n", "\n\n\n", "a\r\nb\r\n", module_text(), "  \n" * 5000 + "tail"],
)
def test_chunks_concatenate_to_the_text(text: str) -> None:
    pieces = split_chunks(text)
    assert "".join(pieces) == text
    assert all(pieces)


def test_chunk_cuts_are_content_defined() -> None:
    text = module_text()
    pieces = split_chunks(text)
    assert len(pieces) > 10
    # an insertion moves no cut outside the edited chunk
    at = len(text) // 2
    edited = text[:at] + "extra = 1\n" + text[at:]
    after = split_chunks(edited)
    assert len(set(pieces) - set(after)) <= 2 and len(set(after) - set(pieces)) <= 2


def test_an_edit_reencodes_only_the_touched_chunk() -> None:
    text = module_text()
    enc = CharEncoder()
    st = SourceTokens()
    assert list(st.ids("file:a", text, enc)) == [ord(c) for c in text]
    assert enc.chars == len(text)
    at = len(text) // 2
    edited = text[:at] + "Z" + text[at:]
    assert list(st.ids("file:a", edited, enc)) == [ord(c) for c in edited]
    assert enc.chars - len(text) < len(text) // 5  # far less than the whole file again
    chars = enc.chars
    assert list(st.ids("file:a", edited, enc)) == [ord(c) for c in edited]
    assert enc.chars == chars  # nothing changed: nothing encoded
    st.forget("file:a")
    st.ids("file:a", edited, enc)
    assert enc.chars == chars + len(edited)


def test_chunked_ids_equal_whole_text_ids_on_the_real_tokenizer(smollm2_path: Path) -> None:
    from echoline.engine.gguf_file import GGUFFile
    from echoline.engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(smollm2_path))
    st = SourceTokens()
    text = module_text() + "\n\n\nclass Tail:\n    pass\n"

    def enc(texts: list[str]) -> list[list[int]]:
        return tok.encode_batch(texts, parse_special=False)

    assert list(st.ids("s", text, enc)) == tok.encode(text, add_bos=False, parse_special=False)
    edited = text.replace("value_200 =", "value_200: int =")
    assert list(st.ids("s", edited, enc)) == tok.encode(edited, add_bos=False, parse_special=False)


class IndexEngine:
    """An engine with a tokenizer and an n-gram index, as the worker sees it."""

    takes_source_ids = True

    def __init__(self) -> None:
        self.enc = CharEncoder()
        self.tokenizer = SimpleNamespace(encode_batch=lambda texts, parse_special: self.enc(texts))
        self.sources: dict[str, list[int]] = {}
        self.removed: list[str] = []

    def set_source_ids(self, sid: str, ids: Any) -> None:
        self.sources[sid] = list(ids)

    def remove_source(self, sid: str) -> None:
        self.removed.append(sid)
        self.sources.pop(sid, None)


@contextlib.contextmanager
def worker_with(engine_cls: type) -> Iterator[EngineWorker]:
    """A worker with a stand-in engine loaded, stopped afterwards."""
    w = EngineWorker(lambda model, **kw: engine_cls())
    try:
        w.load("fake").future.result(5)
        yield w
    finally:
        w.stop()


def put(w: EngineWorker, text: str) -> None:
    """Hand the worker file:a's text and wait until the engine has it."""
    w.set_source("file:a", text)
    w.sync_sources().future.result(5)


def test_worker_hands_the_index_incremental_ids() -> None:
    with worker_with(IndexEngine) as w:
        text = module_text()
        put(w, text)
        eng: IndexEngine = w.engine
        assert eng.sources["file:a"] == [ord(c) for c in text]
        first = eng.enc.chars
        edited = text.replace("value_300 =", "value_300: int =")
        put(w, edited)
        assert eng.sources["file:a"] == [ord(c) for c in edited]
        assert eng.enc.chars - first < len(text) // 5
        w.remove_source("file:a")
        w.sync_sources().future.result(5)
        assert eng.removed == ["file:a"] and "file:a" not in eng.sources


class TextEngine(IndexEngine):
    """An engine that drafts elsewhere (a remote server): it takes the text."""

    takes_source_ids = False

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}

    def set_source(self, sid: str, text: str) -> None:
        self.texts[sid] = text


def test_worker_does_not_tokenize_for_an_engine_that_takes_text() -> None:
    with worker_with(TextEngine) as w:
        text = module_text()
        put(w, text)
        eng: TextEngine = w.engine
        assert eng.texts == {"file:a": text} and eng.sources == {}
        assert eng.enc.chars == 0  # not one character tokenized
        assert w.token_cache_bytes() == 0


def test_sources_share_chunks_by_content() -> None:
    """The draft source and a rewrite prompt's transient source of the same text: encoded
    once, kept while either holds it; transient sources are bounded."""
    text = module_text()
    enc = CharEncoder()
    st = SourceTokens()
    st.ids("file:a", text, enc)
    chunks = st.chunks("rewrite:a", text, enc, transient=True)
    assert enc.chars == len(text) and sum(n for n, _ in chunks) == len(text)
    size = st.memory_bytes()
    st.forget("file:a")
    assert st.memory_bytes() == size  # the prompt's source still holds them
    st.ids("file:a", text, enc)
    assert enc.chars == len(text)
    for i in range(SourceTokens.TRANSIENT_KEPT):  # newer transient sources push it out
        st.chunks(f"rewrite:{i}", f"other_{i} = {i}\n", enc, transient=True)
    st.forget("file:a")
    assert st.memory_bytes() < size // 10


def test_tokens_of_is_one_cache_per_engine_and_tokenizer() -> None:
    from echoline.sidecar.source_tokens import tokens_of

    a, b = IndexEngine(), IndexEngine()
    assert tokens_of(a) is tokens_of(a) and tokens_of(a) is not tokens_of(b)
    cache = tokens_of(a)
    a.tokenizer = SimpleNamespace(encode_batch=a.tokenizer.encode_batch)  # another vocabulary
    assert tokens_of(a) is not cache


def test_worker_fills_the_engines_shared_cache() -> None:
    from echoline.sidecar.source_tokens import tokens_of

    with worker_with(IndexEngine) as w:
        text = module_text()
        put(w, text)
        eng: IndexEngine = w.engine
        assert w.token_cache_bytes() == tokens_of(eng).memory_bytes() > 0
        chars = eng.enc.chars
        tokens_of(eng).chunks("rewrite:a", text, lambda t: eng.tokenizer.encode_batch(t, parse_special=False),
                              transient=True)
        assert eng.enc.chars == chars  # a prompt on the same text finds every chunk


class KeyedTokenizer:
    """A tokenizer that names its vocabulary (``Tokenizer.vocab_key``)."""

    def __init__(self, enc: CharEncoder, key: str) -> None:
        self.enc, self.key = enc, key

    def encode_batch(self, texts: list[str], parse_special: bool) -> list[list[int]]:
        return self.enc(texts)

    def vocab_key(self) -> str:
        return self.key


class KeyedEngine(IndexEngine):
    def __init__(self, key: str) -> None:
        super().__init__()
        self.tokenizer = KeyedTokenizer(self.enc, key)  # type: ignore[assignment]


def test_engines_of_one_vocabulary_share_one_cache() -> None:
    """The inline and the rewrite model of one family (one vocabulary): a file is encoded
    once for both; another vocabulary, or a tokenizer that names none, gets its own."""
    from echoline.sidecar.source_tokens import tokens_of

    small, large, other, unnamed = KeyedEngine("qwen"), KeyedEngine("qwen"), KeyedEngine("smol"), IndexEngine()
    assert tokens_of(small) is tokens_of(large)
    assert tokens_of(other) is not tokens_of(small) and tokens_of(unnamed) is not tokens_of(small)
    text = module_text()
    tokens_of(small).ids("file:a", text, small.enc)
    tokens_of(large).ids("file:a", text, large.enc)
    assert small.enc.chars == len(text) and large.enc.chars == 0  # the second engine encoded nothing
    import gc
    import weakref

    shared = weakref.ref(tokens_of(small))
    del small, large
    gc.collect()
    assert shared() is None  # the cache went with its last engine
    assert tokens_of(KeyedEngine("qwen")).memory_bytes() == 0


def test_worker_with_two_engines_of_one_vocabulary_encodes_a_file_once() -> None:
    """Two slots (the default's rewrite and inline models): the source reaches both
    engines' indexes, its text encoded once, its memory counted once."""
    engines: list[KeyedEngine] = []

    def load(model: str, **kw: Any) -> KeyedEngine:
        engines.append(KeyedEngine("qwen"))
        return engines[-1]

    w = EngineWorker(load)
    try:
        w.load("large", jobs=("rewrite",), key="large").future.result(5)
        w.load("small", jobs=("inline",), key="small").future.result(5)
        text = module_text()
        put(w, text)
        assert len(engines) == 2 and all(e.sources["file:a"] == [ord(c) for c in text] for e in engines)
        assert sum(e.enc.chars for e in engines) == len(text)
        from echoline.sidecar.source_tokens import tokens_of

        assert w.token_cache_bytes() == tokens_of(engines[0]).memory_bytes() > 0
    finally:
        w.stop()


def test_vocab_key_of_the_real_tokenizers(smollm2_path: Path) -> None:
    """Equal for two loads of one vocabulary, different for another (the key is what lets
    two engines share ids, so a false equality would hand one model the other's ids)."""
    from echoline.engine.gguf_file import GGUFFile
    from echoline.engine.model_catalog import resolve_model
    from echoline.engine.tokenizer import Tokenizer

    qwen = resolve_model("qwen2.5-coder-0.5b")
    a, b = Tokenizer.from_gguf(GGUFFile(qwen)), Tokenizer.from_gguf(GGUFFile(qwen))
    smol = Tokenizer.from_gguf(GGUFFile(smollm2_path))
    assert a.vocab_key() == b.vocab_key() != smol.vocab_key()
    text = module_text(50)
    assert a.encode_batch([text], parse_special=False) == b.encode_batch([text], parse_special=False)
