"""Incremental tokenization of draft sources (workspace files and open buffers).

Why: every didChange of an open buffer replaces that buffer's draft source, and
re-tokenizing the whole text each time costs ~0.45 ms per KB on this CPU
(226 ms for a 512 KB file) on the engine thread, in front of the next
completion. Instead the text is cut into chunks at content-defined line
boundaries and each chunk's ids are kept: an edit re-tokenizes only the chunk(s)
it touches, the rest are reused.

Boundaries are chosen where tokenizers do not merge across them, so the
concatenated ids equal whole-text tokenization for ordinary code: at the start
of a line that begins with a non-space character, right after a line that ends
with a non-space character (no run of blank lines or indentation spans the
cut). Which of those positions cut is decided by a hash of the line there, not
by distances, so an insertion moves no boundary other than in the edited region.
Very long runs without such a position are also cut at other line starts, where
a token or two near the cut may differ from whole-text tokenization: harmless,
the n-gram index's drafts are always verified, and a rewrite prompt, whose file
part is these same chunk ids (``sidecar.prompts``), is *defined* by them, so
every path (request, idle prefill, benchmarks) sees the same ids.

One cache per engine (``tokens_of``), shared by the worker's draft sources and the
rewrite prompts: a file version's text is tokenized once for both.
"""

from __future__ import annotations

import threading
import weakref
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

STABLE_EVERY = 4  # about one in 4 stable line starts cuts
ANY_EVERY = 64  # fallback: about one in 64 line starts cuts, when no stable cut came for a while
FALLBACK_AFTER = 16384  # characters since the last cut before the fallback may cut

Encoder = Callable[[Sequence[str]], list[list[int]]]
Key = tuple[int, int]  # a chunk's (length, hash of its text)


def _line_hash(text: str, start: int) -> int:
    end = text.find("\n", start)
    return zlib.crc32(text[start : end if end >= 0 else len(text)].encode("utf-8", "surrogatepass"))


def split_chunks(text: str) -> list[str]:
    """``text`` cut at content-defined line starts; the pieces concatenate to ``text``."""
    pieces: list[str] = []
    start = 0
    pos = text.find("\n")
    n = len(text)
    while 0 <= pos < n - 1:
        p = pos + 1  # a line start
        stable = pos >= 1 and not text[pos - 1].isspace() and not text[p].isspace()
        h = None
        if stable:
            h = _line_hash(text, p)
            cut = h % STABLE_EVERY == 0
        else:
            cut = False
        if not cut and p - start >= FALLBACK_AFTER:
            h = _line_hash(text, p) if h is None else h
            cut = (h >> 8) % ANY_EVERY == 0
        if cut and p > start:
            pieces.append(text[start:p])
            start = p
        pos = text.find("\n", p)
    if start < n:
        pieces.append(text[start:])
    return pieces


class SourceTokens:
    """Ids of each draft source, kept per chunk so an update re-encodes only what changed.

    Chunks are kept once by content, (length, hash) of their text (no second copy of the
    text is kept), and counted by the sources that hold them: a chunk two sources share
    (the open buffer's draft source and the rewrite prompt of the same file,
    ``sidecar.prompts``) is encoded once and dropped when the last one lets go.

    Thread-safe: the engine thread updates it, the server thread reads its size
    (``memory_bytes``), and encoding runs outside the lock so a status request never waits
    for a 512 KB file to tokenize.
    """

    #: How many sources taken with ``transient=True`` (a prompt's file, no draft source of
    #: its own: the CLI's file, a file outside the workspace) are held, last used first.
    TRANSIENT_KEPT = 8

    def __init__(self) -> None:
        self._ids: dict[Key, array] = {}
        self._refs: dict[Key, int] = {}
        self._sources: dict[str, tuple[Key, ...]] = {}
        self._transient: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def chunks(self, source_id: str, text: str, encode: Encoder, *, transient: bool = False) -> list[tuple[int, array]]:
        """``text`` as (length, ids) of each of its chunks (``split_chunks``), re-encoding only
        chunks no source holds; ``source_id`` holds them from now on, instead of the chunks of
        its previous text. ``transient``: one of the last ``TRANSIENT_KEPT`` such sources."""
        pieces = split_chunks(text)
        keys = tuple((len(p), hash(p)) for p in pieces)
        while True:
            with self._lock:
                missing = {k: i for i, k in enumerate(keys) if k not in self._ids}
                if not missing:
                    self._hold(source_id, keys, transient)
                    return [(k[0], self._ids[k]) for k in keys]
            # outside the lock; another thread may drop a chunk meanwhile: then around again
            fresh = encode([pieces[i] for i in missing.values()])
            with self._lock:
                for k, got in zip(missing, fresh, strict=True):
                    self._ids.setdefault(k, array("i", got))
                if all(k in self._ids for k in keys):
                    self._hold(source_id, keys, transient)
                    return [(k[0], self._ids[k]) for k in keys]

    def ids(self, source_id: str, text: str, encode: Encoder) -> array:
        """The token ids of ``text`` (no BOS), re-encoding only chunks not held."""
        out = array("i")
        for _, chunk in self.chunks(source_id, text, encode):
            out.extend(chunk)
        return out

    def _hold(self, source_id: str, keys: tuple[Key, ...], transient: bool) -> None:  # holds the lock
        for k in keys:
            self._refs[k] = self._refs.get(k, 0) + 1
        self._release(self._sources.get(source_id, ()))
        self._sources[source_id] = keys
        if transient:
            self._transient[source_id] = None
            self._transient.move_to_end(source_id)
            while len(self._transient) > self.TRANSIENT_KEPT:
                old, _ = self._transient.popitem(last=False)
                self._release(self._sources.pop(old, ()))
        else:
            self._transient.pop(source_id, None)

    def _release(self, keys: tuple[Key, ...]) -> None:  # holds the lock
        for k in keys:
            n = self._refs[k] - 1
            if n:
                self._refs[k] = n
            else:
                del self._refs[k]
                self._ids.pop(k, None)

    def forget(self, source_id: str) -> None:
        with self._lock:
            self._transient.pop(source_id, None)
            self._release(self._sources.pop(source_id, ()))

    def memory_bytes(self) -> int:
        with self._lock:
            return sum(a.itemsize * len(a) for a in self._ids.values())


def encoder_of(tok: Any) -> Encoder:
    """How chunks are encoded with ``tok``: no BOS, special-token text left plain (what
    ``engine.set_source`` does). One definition for the worker and the rewrite prompts,
    since both read the same chunks (``tokens_of``)."""
    batch = getattr(tok, "encode_batch", None)
    if batch is not None:
        return lambda texts: batch(list(texts), parse_special=False)
    return lambda texts: [list(tok.encode(t, add_bos=False, parse_special=False)) for t in texts]


_by_engine: weakref.WeakKeyDictionary[Any, tuple[Callable[[], Any], SourceTokens]] = weakref.WeakKeyDictionary()
#: Caches by vocabulary (``Tokenizer.vocab_key``), alive while an engine holds one.
_by_vocab: weakref.WeakValueDictionary[str, SourceTokens] = weakref.WeakValueDictionary()
_by_engine_lock = threading.Lock()


def _vocab_key(tok: Any) -> str | None:
    """The tokenizer's vocabulary digest, or None for one that has none (a remote engine's)."""
    key = getattr(tok, "vocab_key", None)
    return key() if callable(key) else None


def tokens_of(engine: Any) -> SourceTokens:
    """The chunk ids of ``engine``'s tokenizer: one cache per vocabulary, which the worker
    fills with the draft sources and the rewrite prompts read (``sidecar.prompts``), so a
    file's text is encoded once per version for both, and once for two engines of one
    vocabulary (the Qwen 0.5B inline and 1.5B rewrite models of the default).

    Why keyed weakly by the engine object (and checked against its tokenizer): a model
    (re)load makes a new engine, whose vocabulary may differ; it finds the cache of its own
    vocabulary (``Tokenizer.vocab_key``) while another engine holds it, else starts empty,
    and a cache goes with the last engine that held it. An engine that cannot be weakly
    referenced gets a fresh, unshared cache on each call (correct, only slower)."""
    tok = getattr(engine, "tokenizer", None)
    try:
        with _by_engine_lock:
            held = _by_engine.get(engine)
        if held is not None and held[0]() is tok:
            return held[1]
        key = _vocab_key(tok)  # hashes the vocabulary once (~0.1-0.5 s): not under the lock
        with _by_engine_lock:
            held = _by_engine.get(engine)
            if held is None or held[0]() is not tok:
                shared = _by_vocab.get(key) if key is not None else None
                if shared is None:
                    shared = SourceTokens()
                    if key is not None:
                        _by_vocab[key] = shared
                held = (_ref(tok), shared)
                _by_engine[engine] = held
            return held[1]
    except TypeError:  # an engine that cannot be weakly referenced
        return SourceTokens()


def _ref(tok: Any) -> Callable[[], Any]:
    """A weak reference to the tokenizer where it takes one (so an entry's value never keeps
    its engine key alive through a tokenizer that refers back to it), else a strong one."""
    try:
        return weakref.ref(tok)
    except TypeError:
        return lambda: tok
