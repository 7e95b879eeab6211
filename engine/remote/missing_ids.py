"""Token ids a llama-server stream left out, recovered from the text it did send.

llama-server sends no chunk for a token that ends inside a UTF-8 character (its text is
not yet printable); the next chunk carries the text of both but only the last id, and the
final chunk of a stream carries no ids at all. Each chunk does say how many tokens were
generated so far (``__verbose.tokens_predicted``), so the engine knows how many ids are
missing and which bytes they stand for (the chunk's text less the bytes of the ids it
got). Most often one id is missing and exactly one vocabulary entry has those bytes.
When several splits into vocabulary entries exist (two missing ids over a CJK character:
" \xe6" + "\x97" or " " + "\xe6\x97"), the bytes cannot tell which the model wrote: the
text stays right, the ids are a guess, and the engine marks the reply not exact.
"""

from __future__ import annotations

import weakref
from typing import Any

_MAX_SPLITS = 2  # two different splits are enough to call the bytes ambiguous


#: Each tokenizer's ids by their bytes, built on the first gap and gone with the tokenizer.
_TABLES: weakref.WeakKeyDictionary[Any, dict[bytes, list[int]]] = weakref.WeakKeyDictionary()


def _by_bytes(tok: Any) -> dict[bytes, list[int]]:
    table = _TABLES.get(tok)
    if table is None:
        table = {}
        for i in range(tok.vocab_size):
            if tok.is_control(i):
                continue
            table.setdefault(tok.token_bytes(i), []).append(i)
        _TABLES[tok] = table
    return table


def recover(tok: Any, missing: bytes, count: int) -> tuple[list[int], bool] | None:
    """(``count`` ids whose bytes concatenate to ``missing``, whether no other split exists);
    None when no split exists."""
    if count <= 0 or not missing:
        return None if count or missing else ([], True)
    table = _by_bytes(tok)
    found: list[list[int]] = []

    def walk(at: int, left: int, acc: list[int]) -> None:
        if len(found) >= _MAX_SPLITS:
            return
        if left == 0:
            if at == len(missing):
                found.append(list(acc))
            return
        for end in range(at + 1, len(missing) - left + 2):
            ids = table.get(missing[at:end])
            if not ids:
                continue
            for i in ids:
                acc.append(i)
                walk(end, left - 1, acc)
                acc.pop()

    walk(0, count, [])
    return (found[0], len(found) == 1) if found else None
