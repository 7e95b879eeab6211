"""Tokenizer built from a GGUF file's ``tokenizer.ggml.*`` metadata.

Ids must equal llama.cpp's for the same text, because the engine's output is
compared token for token with plain greedy decoding. The heavy lifting is done
by the Rust ``tokenizers`` library; this module only translates llama.cpp's
vocabulary description into that library's pieces:

* ``gpt2`` (byte-level BPE): merges come from the file, the pre-tokenizer is
  chosen by ``tokenizer.ggml.pre`` (llama.cpp compiles the regexes in, so they
  are repeated here).
* ``llama`` (SentencePiece-style, e.g. Gemma 3): the file has scores but no
  merges. llama.cpp merges the adjacent pair whose joined text is the
  highest-scoring token; that is BPE with merges ranked by the merged token's
  score, so the merges are derived once and cached on disk.

Token types: control (3) and unknown (2) tokens become *special* added tokens
(parsed in text only when ``parse_special``), user-defined (4) tokens become
non-special added tokens (llama.cpp always matches them).

Decoding does not use the library: every id maps to its exact bytes, and text
is produced by a UTF-8 decoder, so streaming and full decoding agree and a
character split across tokens is never emitted half-done.
"""

from __future__ import annotations

import codecs
import functools
import gc
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from echoline.engine.errors import TokenizerError
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from echoline import paths

if TYPE_CHECKING:
    from echoline.engine.gguf_file import GGUFFile

#: Bumped whenever the way a tokenizer is built changes, so stale caches are ignored.
_CACHE_VERSION = "1"

# llama.cpp token types (llama_token_type in gguf / llama-vocab).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

# Pre-tokenizer regexes as llama.cpp's llama-vocab.cpp applies them (each one
# splits the pieces left by the previous one, keeping matches and gaps alike).
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT_RES = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]")

#: tokenizer.ggml.pre → (regexes applied in order, ignore_merges)
_BPE_PRE: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": (_DEFAULT_RES, False),
    "gpt2": ((_GPT2_RE,), False),
    "smollm": ((r"\p{N}", _GPT2_RE), False),
    "starcoder": ((r"\p{N}", _GPT2_RE), False),
    "refact": ((r"\p{N}", _GPT2_RE), False),
    "codeshell": ((r"\p{N}", _GPT2_RE), False),
    "qwen2": ((_QWEN2_RE,), False),
    "stablelm2": ((_QWEN2_RE,), False),
    "llama-bpe": ((_LLAMA3_RE,), True),
    "llama3": ((_LLAMA3_RE,), True),
}

#: Texts llama.cpp treats as end of generation when they are in the vocabulary.
_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
)
_FIM_TEXTS: dict[str, tuple[str, ...]] = {
    "prefix": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<PRE>",
        "▁<PRE>",
        "<|fim▁begin|>",
    ),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<|fim▁hole|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>", "<|fim▁end|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo_name": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "file_sep": ("<|file_sep|>", "<file_sep>"),
}
_FIM_KEYS = {
    "prefix": "tokenizer.ggml.fim_pre_token_id",
    "suffix": "tokenizer.ggml.fim_suf_token_id",
    "middle": "tokenizer.ggml.fim_mid_token_id",
    "pad": "tokenizer.ggml.fim_pad_token_id",
    "repo_name": "tokenizer.ggml.fim_rep_token_id",
    "file_sep": "tokenizer.ggml.fim_sep_token_id",
}


@dataclass(frozen=True)
class FimTokens:
    """Fill-in-the-middle token ids; the optional ones are None when absent."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo_name: int | None = None
    file_sep: int | None = None


def default_cache_dir() -> Path:
    """Where derived tokenizers are kept (``echoline.paths``: ``ECHOLINE_CACHE_DIR``)."""
    return paths.cache_dir("tokenizers")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (char → byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _vocab_hash(meta: dict[str, Any]) -> str:
    """Stable key of everything that shapes the tokenizer (vocab, types, scores, merges)."""
    h = hashlib.sha256()
    h.update(_CACHE_VERSION.encode())
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_space_prefix"):
        h.update(f"\x00{key}={meta.get(key)!r}".encode())
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        items = meta.get(key)
        if items is not None:
            h.update(f"\x00{key}:{len(items)}\x00".encode())
            h.update("\x00".join(items).encode("utf-8", "surrogatepass"))
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        arr = meta.get(key)
        if arr is not None:
            h.update(f"\x00{key}\x00".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:32]


def derive_spm_merges(
    tokens: Sequence[str], types: np.ndarray, scores: np.ndarray
) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's score-driven SentencePiece merging.

    Every split ``a + b`` of a normal token whose halves are normal tokens is a
    merge, ranked by the merged token's score (higher first). Why it is
    equivalent: llama.cpp repeatedly joins the adjacent pair whose joined text
    is the best-scoring token, which is exactly what BPE does with this order.
    """
    normal = {t for t, ty in zip(tokens, types.tolist(), strict=True) if ty == TOKEN_NORMAL}
    found: list[tuple[float, int, str, str]] = []
    for idx, (tok, ty) in enumerate(zip(tokens, types.tolist(), strict=True)):
        if ty != TOKEN_NORMAL or len(tok) < 2:
            continue
        for i in range(1, len(tok)):
            left = tok[:i]
            if left in normal:
                right = tok[i:]
                if right in normal:
                    found.append((-float(scores[idx]), idx, left, right))
    found.sort(key=lambda m: (m[0], m[1], len(m[2])))
    return [(a, b) for _, _, a, b in found]


def _added_tokens(
    tokens: Sequence[str], types: np.ndarray
) -> tuple[list[AddedToken], list[AddedToken]]:
    """(special, plain) added tokens: control/unknown are special, user-defined are plain."""
    special: list[AddedToken] = []
    plain: list[AddedToken] = []
    for tok, ty in zip(tokens, types.tolist(), strict=True):
        if not tok:
            continue
        if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            special.append(AddedToken(tok, special=True, normalized=False))
        elif ty == TOKEN_USER_DEFINED:
            plain.append(AddedToken(tok, special=False, normalized=False))
    return special, plain


def _vocab_dict(tokens: Sequence[str]) -> dict[str, int]:
    """text → id; like llama.cpp, a repeated text maps to its last id."""
    return {tok: i for i, tok in enumerate(tokens)}


def _bpe_model(vocab: dict[str, int], merges: list[tuple[str, str]], **kw: Any) -> models.BPE:
    """``models.BPE``, with its bare ``Exception`` (a merge naming a token that is not in
    the vocabulary: a corrupt or hostile file) turned into a clear TokenizerError."""
    try:
        return models.BPE(vocab, merges, **kw)
    except Exception as exc:  # tokenizers raises plain Exception here
        raise TokenizerError(f"the file's BPE vocabulary and merges do not fit together: {exc}") from None


def _build_bpe(meta: dict[str, Any], vocab: dict[str, int]) -> HFTokenizer:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _BPE_PRE:
        raise TokenizerError(
            f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); echoline knows "
            f"{', '.join(sorted(_BPE_PRE))}"
        )
    regexes, ignore_merges = _BPE_PRE[pre]
    raw_merges = meta.get("tokenizer.ggml.merges")
    if raw_merges is None:
        raise TokenizerError("gpt2 tokenizer without tokenizer.ggml.merges")
    merges = []
    for m in raw_merges:
        pos = m.find(" ", 1)
        if pos < 0:
            raise TokenizerError(f"malformed BPE merge {m!r}")
        merges.append((m[:pos], m[pos + 1 :]))
    model = _bpe_model(vocab, merges, ignore_merges=ignore_merges)
    tok = HFTokenizer(model)
    if regexes == (_GPT2_RE,):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif regexes == (r"\p{N}", _GPT2_RE):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    else:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tok.decoder = decoders.ByteLevel()
    return tok


def _build_spm(
    meta: dict[str, Any], vocab: dict[str, int], merges: list[tuple[str, str]]
) -> HFTokenizer:
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    tokens = meta["tokenizer.ggml.tokens"]
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    model = _bpe_model(vocab, merges, unk_token=unk, byte_fallback=True)
    tok = HFTokenizer(model)
    steps = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", False):
        steps.insert(0, normalizers.Prepend("▁"))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tok


def _build_hf(meta: dict[str, Any], cache_dir: Path | None) -> tuple[HFTokenizer, dict[str, int]]:
    """The library tokenizer and the text → id map; SentencePiece merges come from the cache."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise TokenizerError(
            f"unsupported tokenizer model {kind!r} (tokenizer.ggml.model); echoline supports "
            "'gpt2' (BPE) and 'llama' (SentencePiece-style)"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerError("no tokenizer.ggml.tokens in the model file")
    types = _token_types(meta, len(tokens))
    vocab = _vocab_dict(tokens)
    if kind == "gpt2":
        tok = _build_bpe(meta, vocab)
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError("SentencePiece-style tokenizer without tokenizer.ggml.scores")
        merges = _spm_merges(meta, tokens, types, vocab, np.asarray(scores), cache_dir)
        tok = _build_spm(meta, vocab, merges)
    special, plain = _added_tokens(tokens, types)
    tok.add_special_tokens(special)
    tok.add_tokens(plain)
    return tok, vocab


def _spm_merges(
    meta: dict[str, Any],
    tokens: list[str],
    types: np.ndarray,
    vocab: dict[str, int],
    scores: np.ndarray,
    cache_dir: Path | None,
) -> list[tuple[str, str]]:
    """Derived merges, cached as (left id, right id) pairs keyed by a hash of the vocabulary.

    Ids rather than the library's JSON: reading 513k int pairs and indexing the
    token list is several times faster than parsing the serialized tokenizer.
    """
    path = cache_dir / f"spm-merges-{_vocab_hash(meta)}.npy" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            pairs = np.load(path, allow_pickle=False)
            if (
                pairs.ndim == 2
                and pairs.shape[1] == 2
                and (pairs.size == 0 or int(pairs.max()) < len(tokens))
            ):
                texts = np.array(tokens, dtype=object)  # fancy indexing beats a comprehension
                return list(
                    zip(texts[pairs[:, 0]].tolist(), texts[pairs[:, 1]].tolist(), strict=True)
                )
        except (OSError, ValueError):
            pass  # damaged cache: derive again and overwrite it
    merges = derive_spm_merges(tokens, types, scores)
    if path is not None:
        pairs = np.array([(vocab[a], vocab[b]) for a, b in merges], dtype=np.int32).reshape(-1, 2)
        _save_atomic(path, pairs)
    return merges


def _save_atomic(path: Path, pairs: np.ndarray) -> None:
    """Write via a temporary file so a concurrent reader never sees half a cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npy")
        np.save(tmp, pairs, allow_pickle=False)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs speed


def _token_types(meta: dict[str, Any], n: int) -> np.ndarray:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return np.full(n, TOKEN_NORMAL, dtype=np.int32)
    types = np.asarray(types, dtype=np.int32)
    if len(types) != n:
        raise TokenizerError(f"{len(types)} token types for {n} tokens")
    return types


class Tokenizer:
    """Text ↔ llama.cpp-identical token ids for one model."""

    def __init__(
        self, hf: HFTokenizer, meta: dict[str, Any], vocab: dict[str, int] | None = None
    ) -> None:
        self._hf = hf
        self._lock = threading.Lock()
        self.model_kind: str = meta["tokenizer.ggml.model"]
        self._tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        self._types = _token_types(meta, len(self._tokens))
        self._ids: dict[str, int] = vocab if vocab is not None else _vocab_dict(self._tokens)
        self.vocab_size: int = len(self._tokens)
        self.bos_id: int | None = _opt_id(meta, "tokenizer.ggml.bos_token_id", self.vocab_size)
        self.eos_id: int | None = _opt_id(meta, "tokenizer.ggml.eos_token_id", self.vocab_size)
        self.add_bos: bool = (
            bool(meta.get("tokenizer.ggml.add_bos_token", False)) and self.bos_id is not None
        )
        self.add_space_prefix: bool = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
        tmpl = meta.get("tokenizer.chat_template")
        self.chat_template: str | None = tmpl if isinstance(tmpl, str) and tmpl.strip() else None
        self.fim: FimTokens | None
        self.fim_pad_id, self.repo_name_id, self.file_sep_id = self._find_fim(meta)
        self.stop_ids: frozenset[int] = self._find_stops(meta)
        self._bytes: dict[int, bytes] = {}
        self._byte_decoder = _gpt2_byte_decoder() if self.model_kind == "gpt2" else None
        self._vocab_key: str | None = None

    @classmethod
    def from_gguf(cls, gf: GGUFFile, cache_dir: Path | None = None) -> Tokenizer:
        """Build from an open GGUF file; derived data is cached under ``cache_dir``."""
        return cls.from_metadata(gf.metadata, cache_dir=cache_dir)

    @classmethod
    def from_metadata(
        cls, meta: dict[str, Any], cache_dir: Path | None = None, use_cache: bool = True
    ) -> Tokenizer:
        """Build from a metadata dict (what ``GGUFFile.metadata`` holds)."""
        directory = (cache_dir or default_cache_dir()) if use_cache else None
        # Hundreds of thousands of small tuples would trigger the cyclic GC over
        # and over; nothing built here forms cycles, so it is paused meanwhile.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            hf, vocab = _build_hf(meta, directory)
            return cls(hf, meta, vocab)
        finally:
            if was_enabled:
                gc.enable()

    # ---- special tokens -------------------------------------------------

    def _find_fim(self, meta: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
        found: dict[str, int | None] = {}
        for role, key in _FIM_KEYS.items():
            tid = _opt_id(meta, key, self.vocab_size)
            if tid is None:
                tid = next((self._ids[t] for t in _FIM_TEXTS[role] if t in self._ids), None)
            found[role] = tid
        pre, suf, mid = found["prefix"], found["suffix"], found["middle"]
        if pre is not None and suf is not None and mid is not None:
            self.fim = FimTokens(pre, suf, mid, found["pad"], found["repo_name"], found["file_sep"])
        else:
            self.fim = None
        return found["pad"], found["repo_name"], found["file_sep"]

    def _find_stops(self, meta: dict[str, Any]) -> frozenset[int]:
        stops: set[int] = set()
        for key in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ):
            tid = _opt_id(meta, key, self.vocab_size)
            if tid is not None:
                stops.add(tid)
        for text in _EOG_TEXTS:
            tid = self._ids.get(text)
            if tid is not None and int(self._types[tid]) in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
                stops.add(tid)
        # llama.cpp also ends generation on FIM padding / repo / file separators.
        for tid in (self.fim_pad_id, self.repo_name_id, self.file_sep_id):
            if tid is not None:
                stops.add(tid)
        return frozenset(stops)

    # ---- encoding -------------------------------------------------------

    def encode(
        self, text: str, *, add_bos: bool | None = None, parse_special: bool = True
    ) -> list[int]:
        """Token ids as llama.cpp's ``llama_tokenize(text, add_special, parse_special)``.

        ``add_bos=None`` follows the model (``tokenizer.ggml.add_bos_token``).
        ``parse_special=False`` treats control-token text (``<|im_start|>``) as
        plain characters; user-defined tokens are still matched, as in llama.cpp.
        """
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            ids = self._hf.encode(text, add_special_tokens=False).ids if text else []
        want_bos = self.add_bos if add_bos is None else add_bos
        if want_bos and self.bos_id is not None:
            return [self.bos_id, *ids]
        return list(ids)

    def vocab_key(self) -> str:
        """A digest of everything that decides which ids a text becomes (the tokenizer's
        vocabulary, merges, pre-tokenizer and normalizer, and this wrapper's settings),
        computed once. Why: two models of one family share their vocabulary (the Qwen
        0.5B that completes inline and the 1.5B that rewrites), so what was tokenized for
        one serves the other; equal keys mean equal ids for every text."""
        with self._lock:
            if self._vocab_key is None:
                h = hashlib.sha256(self._hf.to_str().encode("utf-8", "surrogatepass"))
                h.update(f"\x00{self.model_kind}|{self.add_space_prefix}|{self.add_bos}|{self.bos_id}".encode())
                self._vocab_key = h.hexdigest()[:32]
            return self._vocab_key

    def encode_batch(self, texts: Sequence[str], *, parse_special: bool = True) -> list[list[int]]:
        """Many texts without BOS (e.g. workspace files for the n-gram index)."""
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            encs = self._hf.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encs]

    # ---- vocabulary -----------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The vocabulary string of an id (byte-level/▁-escaped, as stored in the file)."""
        return self._tokens[token_id]

    def id_of(self, text: str) -> int | None:
        """The id whose vocabulary string is exactly ``text``, or None."""
        return self._ids.get(text)

    def token_type(self, token_id: int) -> int:
        return int(self._types[token_id])

    def is_control(self, token_id: int) -> bool:
        return int(self._types[token_id]) in (TOKEN_CONTROL, TOKEN_UNKNOWN)

    @functools.cached_property
    def special_texts(self) -> dict[str, int]:
        """Control/unknown token text → id (what ``parse_special`` may match).

        Built once: a scan of the whole vocabulary cost ~5 ms on every chat prompt.
        """
        return {
            t: i
            for i, t in enumerate(self._tokens)
            if t and int(self._types[i]) in (TOKEN_CONTROL, TOKEN_UNKNOWN)
        }

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (what decoding concatenates)."""
        cached = self._bytes.get(token_id)
        if cached is not None:
            return cached
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} outside the vocabulary of {self.vocab_size}")
        text = self._tokens[token_id]
        ty = int(self._types[token_id])
        if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED, TOKEN_UNUSED):
            out = text.encode("utf-8")
        elif self._byte_decoder is not None:
            dec = self._byte_decoder
            out = (
                bytes(dec[c] for c in text) if all(c in dec for c in text) else text.encode("utf-8")
            )
        elif ty == TOKEN_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out = bytes([int(text[3:5], 16)])
        else:
            out = text.replace("▁", " ").encode("utf-8")
        self._bytes[token_id] = out
        return out

    # ---- decoding -------------------------------------------------------

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        return b"".join(
            self.token_bytes(int(i)) for i in ids if not (skip_special and self.is_control(int(i)))
        )

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of the ids; invalid UTF-8 (a cut-off character) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        """A decoder for ids that arrive one at a time."""
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Turns ids arriving one by one into text deltas, never splitting a character.

    Bytes of an incomplete UTF-8 sequence are held back until the next token
    completes them; ``flush()`` at the end releases anything left (as U+FFFD).
    Concatenating all deltas and the flush equals ``Tokenizer.decode`` of all ids.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text that became complete with this token (often "", never half a character)."""
        if self._skip and self._tok.is_control(token_id):
            return ""
        return self._dec.decode(self._tok.token_bytes(token_id))

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join(self.push(int(i)) for i in ids)

    @property
    def pending(self) -> bytes:
        """Bytes held back because they do not yet form a whole character."""
        return self._dec.getstate()[0]

    def flush(self) -> str:
        """Whatever is held back, then reset."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


def _opt_id(meta: dict[str, Any], key: str, vocab_size: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    try:
        tid = int(value)
    except (TypeError, ValueError):
        return None
    return tid if 0 <= tid < vocab_size else None


def describe(tok: Tokenizer) -> str:
    """One-line summary for logs and ``--verbose``."""
    return json.dumps(
        {
            "model": tok.model_kind,
            "vocab": tok.vocab_size,
            "bos": tok.bos_id,
            "eos": tok.eos_id,
            "add_bos": tok.add_bos,
            "stops": sorted(tok.stop_ids),
            "fim": tok.fim is not None,
            "chat_template": tok.chat_template is not None,
        }
    )
