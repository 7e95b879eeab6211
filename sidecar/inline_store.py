"""Shown inline suggestions and recent inline results, per document: answers without a model run.

Why: while the user types, an inline request comes after every keystroke, and a request
that reaches the engine runs at least the typed text and the tail after the cursor again
(~1 s a keystroke on a 2-core CPU). Two kinds of request need no run at all:

* **Typing through a suggestion.** A suggestion ``C`` was shown at a state (text before
  the cursor ``P``, text after it ``S``). The user now types ``t``, the start of ``C``: the
  text is ``P + t`` before the cursor and still ``S`` after it. The answer is the rest of
  the suggestion, ``C[len(t):]``, at once. This is what Copilot-class editors do, and it is
  what the user already sees: accepting the remainder gives exactly the text that
  accepting ``C`` at ``P`` would have given. The remainder is *not* necessarily what the
  model would answer for the prompt at ``P + t`` (a greedy completion of a longer prefix
  may differ from the tail of the shorter one's); the contract is that every suggestion
  shown is the plain greedy completion of the prompt it was computed for (here ``P``'s),
  cut only to a suffix of itself by what the user typed. As soon as the typing departs
  from it (a character that is not the suggestion's next, an edit after the cursor, the
  whole suggestion typed) the kept suggestion is dropped and the request goes to the model.
* **Returning to an earlier state** (undo, backspace, a jump back): a small LRU of recent
  results keyed by the exact texts the prompt is built from (before and after the cursor)
  and the settings that shape it. The prompt is a function of those texts (its head start
  aside: ``sidecar.inline.HeadStarts`` only chooses how much of the text before the cursor a
  prompt carries), so the kept result is the greedy completion of a prompt built for this
  very text. Keys are digests, so the LRU holds no copies of the document.

``tag``: what else the result depends on (model, limits); a different tag never matches.
Pure data, no model, no LSP: the server's inline handler consults it before the engine.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

RECENT_PER_DOC = 32  # results kept per document for undo/backspace
RECENT_TOTAL = 256  # and in all


@dataclass(frozen=True)
class Shown:
    """A suggestion shown at a state: the texts before/after the cursor and the completion."""

    prefix: str
    suffix: str
    text: str
    tag: Hashable


@dataclass(frozen=True)
class Hit:
    """An answer without a model run: ``text`` (the completion at the current cursor) and
    where it came from: ``"typed"`` (the rest of a shown suggestion) or ``"recent"``."""

    text: str
    source: str
    typed: int = 0  # characters of the shown suggestion already typed


def _digest(prefix: str, suffix: str) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    h.update(len(prefix).to_bytes(8, "little"))
    h.update(prefix.encode("utf-8", "surrogatepass"))
    h.update(suffix.encode("utf-8", "surrogatepass"))
    return h.digest()


def typed_through(shown: Shown, prefix: str, suffix: str) -> int | None:
    """How many characters of ``shown.text`` the user typed to reach ``prefix|suffix``
    from the state it was shown at; None when the state does not extend it (the typing
    departed: different text after the cursor, different text before the shown place, a
    character the suggestion does not continue with, or all of it typed)."""
    if suffix != shown.suffix or len(prefix) < len(shown.prefix) or not prefix.startswith(shown.prefix):
        return None
    typed = prefix[len(shown.prefix):]
    if len(typed) >= len(shown.text) or not shown.text.startswith(typed):
        return None
    return len(typed)


class InlineStore:
    """Per document: the suggestion on screen and the recent results (thread-safe: the
    event loop answers from it, background jobs on the engine thread add to it)."""

    def __init__(self, per_doc: int = RECENT_PER_DOC, total: int = RECENT_TOTAL) -> None:
        self._lock = threading.Lock()
        self._shown: dict[str, Shown] = {}
        self._recent: OrderedDict[tuple[str, bytes, Hashable], str] = OrderedDict()
        self._per_doc, self._total = per_doc, total
        #: answers without a run, by source, and lookups that found none (for status)
        self.hits = {"typed": 0, "recent": 0, "misses": 0}
        #: the figures of the last inline request that ran the model (set by the server)
        self.last_run: dict[str, Any] | None = None

    def lookup(self, uri: str, prefix: str, suffix: str, tag: Hashable) -> Hit | None:
        """The answer for the cursor between ``prefix`` and ``suffix`` without a model run,
        or None. A shown suggestion the state no longer extends is dropped here."""
        with self._lock:
            shown = self._shown.get(uri)
            if shown is not None:
                n = typed_through(shown, prefix, suffix) if shown.tag == tag else None
                key = (uri, _digest(prefix, suffix), tag)
                if n is not None:
                    self.hits["typed"] += 1
                    self._keep(key, shown.text[n:])  # an undo back to here answers it too
                    return Hit(shown.text[n:], "typed", n)
                del self._shown[uri]  # the typing departed from it
            key = (uri, _digest(prefix, suffix), tag)
            text = self._recent.get(key)
            if text is None:
                self.hits["misses"] += 1
                return None
            self._recent.move_to_end(key)
            self.hits["recent"] += 1
            return Hit(text, "recent")

    def has(self, uri: str, prefix: str, suffix: str, tag: Hashable) -> bool:
        """Whether a recent result is kept for this state (nothing counted or moved)."""
        with self._lock:
            return (uri, _digest(prefix, suffix), tag) in self._recent

    def shown(self, uri: str, prefix: str, suffix: str, text: str, tag: Hashable) -> None:
        """A suggestion answered at this state (it is now on screen): keep it for typing
        through, and as a recent result. An empty one clears what was on screen."""
        with self._lock:
            if text:
                self._shown[uri] = Shown(prefix, suffix, text, tag)
            else:
                self._shown.pop(uri, None)
        self.remember(uri, prefix, suffix, text, tag)

    def remember(self, uri: str, prefix: str, suffix: str, text: str, tag: Hashable) -> None:
        """Keep a result (empty included: "nothing to suggest here" costs a run too)."""
        with self._lock:
            self._keep((uri, _digest(prefix, suffix), tag), text)

    def _keep(self, key: tuple[str, bytes, Hashable], text: str) -> None:  # holds the lock
        self._recent[key] = text
        self._recent.move_to_end(key)
        mine = [k for k in self._recent if k[0] == key[0]]
        for k in mine[: max(0, len(mine) - self._per_doc)]:
            del self._recent[k]
        while len(self._recent) > self._total:
            self._recent.popitem(last=False)

    def on_screen(self, uri: str) -> Shown | None:
        with self._lock:
            return self._shown.get(uri)

    def closed(self, uri: str) -> None:
        with self._lock:
            self._shown.pop(uri, None)
            for k in [k for k in self._recent if k[0] == uri]:
                del self._recent[k]

    def clear(self) -> None:
        """Everything (the model or the settings that shape results changed)."""
        with self._lock:
            self._shown.clear()
            self._recent.clear()
