"""A bounded soak of the real server (``python -m echoline serve``) over stdio.

One server process, the tiny synthetic FIM ``qwen2`` model (tests/synth.py: it loads in
well under a second, so the soak exercises the server, not the model), 20 open Python
buffers, and a seeded random schedule of ``MAX_ACTIONS`` actions (cut at ``SOAK_S``):
incremental didChange edits (CRLF, non-ASCII, astral characters, form feeds and U+2028
inside lines), rewrites in "apply" and "preview" mode with and without instructions,
inline completions, ``$/cancelRequest`` of requests in flight, superseding requests on the
same buffer, edits typed while a rewrite of that buffer generates, didClose/didOpen,
settings changes that need no reload, version probes (``textDocument/codeAction`` carries
the server's version of a buffer) and bad requests (unknown or closed documents,
positions out of range or inside a character, stale versions).

What is checked:

- every request is answered (a result or a JSON-RPC error) within ``REQUEST_S``; the only
  errors allowed are RequestCancelled for a request we cancelled, the documented -32602 /
  -32801 answers to the bad requests (those of server bug B below are counted, and must
  be none now);
- the client's ``workspace/applyEdit`` handler applies an edit only when its
  ``textDocument.version`` is the client's current version of that buffer (then it bumps
  the version and sends the matching didChange, as an editor does) and answers
  ``applied: false`` otherwise. Every edit must name a version the client really had and
  asked an "apply" rewrite for (none for a version never seen, none applied over newer
  text), and each rewrite's answer must agree with what became of its edit;
- the server's view of every buffer equals the client's at the end: the version (code
  action), the line structure (positions just past the end are refused), and the total
  UTF-8 size of all buffers (``echoline.status`` ``index.bytes``);
- resident memory (``/proc/<pid>/status`` VmRSS) at the end is within ``RSS_SLACK_MB`` of
  its value after the warm-up (the first quarter of the actions);
- afterwards the server answers an inline completion and ``echoline.status``, showed no
  error message, and its stderr holds no traceback but those of the errors it answered.

The action *kinds* come from their own seeded generator, so every run performs the same
sequence of kinds; their arguments depend on the buffers' texts, which depend on which
edits raced with typing, so those vary a little with timing (and are checked the same way).

Server bugs this soak ran into (counted in the summary, tolerated so the soak stays green):

- A (fixed: the server now remembers cancelled request ids and a rewrite checks its own
  before sending its edit; still counted, for the one-loop-step race left): ``$/cancelRequest``
  of an "apply" rewrite whose generation had already finished was answered RequestCancelled
  at once, yet the handler carried on and sent ``workspace/applyEdit`` afterwards
  (``editAfterCancelledAnswer``: 1-12 a run before the fix, 0 in two runs after it).
- B (fixed: the server now runs each new handler up to its first wait before it reads the
  next frame; ``servedAfterLaterChange`` is asserted 0): a request followed at once by a
  didChange/didClose (both in one read of the pipe) was served against the text AFTER that
  change: coroutine handlers started as tasks after every frame of the read was handled, so
  a valid rewrite got -32801 "stale version", a valid inline position -32602 "past the end"
  (or a completion computed on newer text) (``servedAfterLaterChange``: ~11 a run before
  the fix, some of them the client's own reordering, below; tested deterministically in
  tests/test_lsp_framing.py).
- C (fixed: finished futures leave the table; ``echoline.status`` ``pendingFutures`` is
  asserted small at the end): ``protocol._request_futures`` kept one finished future per
  didOpen/didChange/didClose and per ``workspace/executeCommand`` (~2 KB each, never
  removed): a slow RSS creep in ``rssEvery60ActionsMB``, ~2 MB per 1000 keystrokes in an
  editor. It also made ``shutdown`` with a rewrite in flight fail (-32603 "dictionary
  changed size during iteration"; tested in tests/test_lsp_framing.py). The soak still
  settles before shutting down, so that every answer is checked.

The soak's own client used to reorder too: pytest-lsp's ``send_request_async`` writes a
request only once a task runs it, so a didChange sent right after a request could go out
first. Requests are now written when sent. With that, the server before the fix of B still
served 6 requests (in 276 actions) against later text and held 282 futures at the end; after
it, 0 and 2 (the status command's own).

A run after these fixes on the quiet 2-core machine, the JSON line printed on stderr (with
both cores busy with another test run the schedule slows down ~6x: 500 actions in 58 s, 72 s
in all, RSS 185.7 -> 210.2 MB):
{"actions": 500, "requests": 448, "answered": 448, "errors": 108, "expectedErrors": 108,
"cancels": 44, "cancelledAnswers": 42, "hangs": 0, "editsSent": 102, "editsApplied": 101,
"editsRefused": 1, "editsUnseenVersion": 0, "rewritesApplied": 100, "changedWhileGenerating":
16, "inlineItems": 112, "servedAfterLaterChange": 0, "pendingFutures": 2,
"cancelledButEditApplied": 1, "readyRssMB": 185.1, "warmRssMB": 207.5, "endRssMB": 210.2,
"peakRssMB": 211.4, "rssEvery60ActionsMB": [185.3, 203.4, 207.1, 209.7, 209.7, 209.9, 210.7,
211.0, 211.4], "soakS": 9.3, "durationS": 10.6, "rewriteOutcomes": {"document changed while
generating": 16, "preview": 47, "applied": 100, "the reply reached maxTokens": 8, "stale: the
buffer moved on": 1}, "serverTracebacks": {"pygls.exceptions.JsonRpcInvalidParams": 60,
"echoline.sidecar.lsp_utils.PositionError": 56, "pygls.exceptions.JsonRpcException": 6}}
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

from echoline import paths
from tests.synth import write_fim_qwen2_model

SEED = 20_240_611
# Most random models never write the closing fence, so every rewrite reply runs to
# maxTokens and nothing is ever applied. With seed 39 most rewrite replies end (at an
# end-of-text token) within a few tokens, so "apply" mode really sends workspace/applyEdit.
MODEL_SEED = 39
N_DOCS = 20
MAX_ACTIONS = 500
SOAK_S = 70.0  # the schedule stops here even if actions are left
REQUEST_S = 60.0  # every request answers within this (a hang guard, not a speed check)
READY_S = 120.0
MAX_IN_FLIGHT = 6
WARMUP_FRACTION = 0.25
RSS_SLACK_MB = 60.0
REQUEST_CANCELLED = -32800
INVALID_PARAMS = -32602
CONTENT_MODIFIED = -32801

ACTIONS = {  # kind -> weight
    "insert": 20,
    "delete": 9,
    "rewrite_apply": 13,
    "rewrite_preview": 7,
    "inline": 16,
    "cancel": 8,
    "supersede": 6,
    "change_during_rewrite": 6,
    "close_reopen": 4,
    "bad_request": 5,
    "probe": 3,
    "status": 3,
    "settings": 3,
}

INSERTS = (
    "x",
    " ",
    "\t",
    "\n",
    "\r\n",
    ")",
    "(",
    "é",
    "中文",
    "\U0001f600",
    "Ωμέγα ∑",
    "\u2028",
    "\x0c",
    "  # note: café\n",
    "# 注释 \U0001f680\r\n",
    "value = 1\n",
    "pass\r\n",
    '"""doc \U0001f600"""\n',
    "def added_{n}(a):\r\n    return a  # ✓\r\n",
    "\ndef more_{n}(x, y):\n    return x * y + {n}\n",
)
INSTRUCTIONS = (
    "",
    "",
    "Rename the parameter n to count.",
    "Add type hints.",
    "Make it faster — 速く \U0001f600",
)
WORDS = ("alpha", "beta", "gamma", "delta", "total", "value", "item", "count", "name", "data")
NON_ASCII_LINES = (
    "# café, naïve — résumé\n",
    "# 中文注释\n",
    "# emoji \U0001f600 here\n",
    "s = 'Ωμέγα ∑ ∫'\n",
)


# ---- the client's model of a document (its own code, not the server's lsp_utils) ----------


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end of body) of each LSP line: line ends are \\n, \\r\\n and \\r only."""
    spans = []
    start = i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\n" or ch == "\r":
            spans.append((start, i))
            i += 2 if ch == "\r" and i + 1 < n and text[i + 1] == "\n" else 1
            start = i
        else:
            i += 1
    spans.append((start, n))
    return spans


def u16(s: str) -> int:
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def to_position(text: str, offset: int) -> types.Position:
    """The position of an offset that is a valid place (not between a CRLF's halves)."""
    for line, (start, end) in enumerate(line_spans(text)):
        if start <= offset <= end:
            return types.Position(line=line, character=u16(text[start:offset]))
    raise AssertionError(f"offset {offset} names no position (inside a CRLF?)")


def to_offset(text: str, pos: types.Position) -> int:
    """Strict: the position must name a place in ``text`` (it is the server's edit)."""
    spans = line_spans(text)
    assert 0 <= pos.line < len(spans), f"line {pos.line} out of range ({len(spans)} lines)"
    start, end = spans[pos.line]
    units = 0
    for i in range(start, end + 1):
        if units == pos.character:
            return i
        if i == end:
            break
        units += u16(text[i])
    raise AssertionError(f"{pos} is past the end of its line or inside a character")


def valid_offset(text: str, offset: int) -> int:
    """``offset`` moved off the middle of a CRLF (a place no position can name)."""
    if 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n":
        return offset - 1
    return offset


def end_position(text: str) -> types.Position:
    return to_position(text, len(text))


def make_doc(i: int, rng: random.Random) -> str:
    lines = [f'"""Module {i}: generated for the soak."""\n', "import math\n", "\n"]
    for j in range(rng.randint(2, 4)):
        a, b = rng.sample(WORDS, 2)
        lines.append(f"def {a}_{i}_{j}({b}, n={j}):\n")
        lines.append(f"    {a} = {b} * n + {rng.randint(0, 99)}\n")
        if rng.random() < 0.5:
            lines.append(f"    if {a} > {rng.randint(1, 9)}:\n        return math.sqrt({a})\n")
        lines.append(f"    return {a}\n\n")
    if i % 3 == 0:
        lines.insert(3, NON_ASCII_LINES[(i // 3) % len(NON_ASCII_LINES)])
    if i % 5 == 1:
        lines.append("x = 1\x0cy = 2\u2028z = 3  # a form feed and U+2028 inside one line\n")
    text = "".join(lines)
    return text.replace("\n", "\r\n") if i % 4 == 2 else text


@dataclass
class Doc:
    uri: str
    text: str
    version: int = 1
    open: bool = True
    texts: dict[int, str] = field(default_factory=dict)  # every version the client had


@dataclass
class Flight:
    """One request in flight (or answered)."""

    id: str
    kind: str
    method: str
    params: Any
    uri: str | None = None
    version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False
    result: Any = None
    error: tuple[int | None, str] | None = None
    task: asyncio.Task | None = None
    sent_at: float = 0.0
    cancel_at: float | None = None
    answered_at: float | None = None
    edit: str | None = None  # "applied" / "refused": what the client did with its edit
    edit_at: float | None = None


# Exceptions the server logs with a traceback while answering a request with an error.
ANSWERED_EXCEPTIONS = frozenset(
    {
        "echoline.sidecar.lsp_utils.PositionError",  # the cause of the InvalidParams below
        "pygls.exceptions.JsonRpcInvalidParams",
        "pygls.exceptions.JsonRpcException",  # -32801 stale version
    }
)


# InvalidParams a request may get when we changed or closed its buffer right after sending
# it (the server bug described in the module docstring), besides ContentModified.
RACE_POSITION_ERRORS = ("past the end", "out of bounds", "inside a character", "unknown document")


def logged_exceptions(stderr: str) -> Counter[str]:
    """The exception type ending each traceback in the server's stderr."""
    found: Counter[str] = Counter()
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for later in lines[i + 1 :]:
                if later and not later[0].isspace():
                    found[later.split(":", 1)[0]] += 1
                    break
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError(f"no VmRSS for pid {pid}")


def _plain(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj._asdict())


# ---- the soak ----------------------------------------------------------------------------


class Soak:
    def __init__(self, client: LanguageClient, root: Path, pid: int) -> None:
        self.client = client
        self.root = root
        self.pid = pid
        self.kinds = random.Random(SEED)  # the sequence of action kinds
        self.rng = random.Random(SEED + 1)  # their arguments
        self.docs: list[Doc] = []
        self.by_uri: dict[str, Doc] = {}
        self.ids = itertools.count(1)
        self.inserts = itertools.count(1)
        self.flights: list[Flight] = []
        self.active: dict[str, Flight] = {}
        self.apply_asked: set[tuple[str, int]] = set()  # (uri, version) of "apply" rewrites
        self.count: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.problems: list[str] = []
        self.hangs: list[str] = []
        self.status: list[dict[str, Any]] = []
        self.progress: list[dict[str, Any]] = []
        self.rss_peak = 0.0
        self.rss_timeline: list[float] = []  # every 60 actions
        self.install_handlers()

    # -- the client's side of the protocol ----------------------------------------------------
    def install_handlers(self) -> None:
        client = self.client

        @client.feature("echoline/status")
        def _status(params: Any) -> None:
            self.status.append(_plain(params))

        @client.feature("echoline/rewriteProgress")
        def _progress(params: Any) -> None:
            self.progress.append(_plain(params))

        @client.feature("echoline/prefill")
        def _prefill(params: Any) -> None:
            self.count["prefillNotifications"] += 1

        @client.feature(types.WORKSPACE_APPLY_EDIT)
        def _apply(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
            return self.apply_edit(params)

    def problem(self, what: str) -> None:
        self.problems.append(what)

    def apply_edit(self, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        """An editor that checks versions: apply only over the version the edit names."""
        self.count["editsSent"] += 1
        edit = params.edit
        changes = list(edit.document_changes or [])
        if edit.changes or not changes:
            self.problem(f"an edit without versioned documentChanges: {edit}")
            return types.ApplyWorkspaceEditResult(applied=False, failure_reason="unversioned")
        ok = True
        for dc in changes:
            if not isinstance(dc, types.TextDocumentEdit):
                self.problem(f"a resource operation in an edit: {dc}")
                return types.ApplyWorkspaceEditResult(applied=False, failure_reason="resource op")
            uri, version = dc.text_document.uri, dc.text_document.version
            doc = self.by_uri.get(uri)
            if doc is None or version is None or version not in doc.texts:
                self.count["editsUnseenVersion"] += 1
                self.problem(f"an edit for a version the client never had: {uri} v{version}")
                ok = False
                continue
            if (uri, version) not in self.apply_asked:
                self.count["editsUnrequested"] += 1
                self.problem(f"an edit nobody asked to apply: {uri} v{version}")
                ok = False
            if not doc.open or version != doc.version:
                ok = False
        self.link_edit(changes, "applied" if ok else "refused")
        if not ok:
            self.count["editsRefused"] += 1
            return types.ApplyWorkspaceEditResult(
                applied=False, failure_reason="stale: the buffer moved on"
            )
        for dc in changes:
            doc = self.by_uri[dc.text_document.uri]
            ordered = sorted(
                dc.edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True
            )
            text = doc.text
            try:
                for e in ordered:  # reverse order: each edit leaves earlier positions valid
                    a, b = to_offset(text, e.range.start), to_offset(text, e.range.end)
                    assert a <= b, e.range
                    text = text[:a] + e.new_text + text[b:]
            except AssertionError as exc:
                self.problem(f"an edit whose range is not in the version it names: {exc}")
                return types.ApplyWorkspaceEditResult(applied=False, failure_reason="bad range")
            self.set_text(doc, text, [(e.range, e.new_text) for e in ordered])
        self.count["editsApplied"] += 1
        return types.ApplyWorkspaceEditResult(applied=True)

    def link_edit(self, changes: list[Any], outcome: str) -> None:
        """Tie an edit to the "apply" rewrite it came from (same buffer, version, range)."""
        dc = changes[0]
        if not isinstance(dc, types.TextDocumentEdit) or len(dc.edits) != 1:
            self.problem(f"an edit that is not one TextEdit: {dc}")
            return
        r = dc.edits[0].range
        want = {"start": _pos_dict(r.start), "end": _pos_dict(r.end)}
        # Several requests may name the same buffer, version and range (a superseding one):
        # the edit is the earliest one's still waiting for its answer, else (bug A in the
        # module docstring) one answered RequestCancelled; one answered with a result
        # already said what became of its edit.
        candidates = [
            f
            for f in self.flights
            if f.kind == "rewrite"
            and f.meta.get("mode") == "apply"
            and f.edit is None
            and (f.uri, f.version) == (dc.text_document.uri, dc.text_document.version)
            and f.meta["range"] == want
            and (f.answered_at is None or f.error is not None)
        ]
        candidates.sort(key=lambda f: f.answered_at is not None)  # stable: sent order kept
        if not candidates:
            self.problem(f"an edit no rewrite request of ours matches: {dc}")
            return
        f = candidates[0]
        f.edit, f.edit_at = outcome, time.monotonic()
        f.meta["edit_text"] = dc.edits[0].new_text

    def mark_changed(self, uri: str) -> None:
        """Requests on ``uri`` still unanswered: we changed (or closed) it after sending."""
        for f in self.active.values():
            if f.uri == uri:
                f.meta["changed_after"] = True

    def set_text(self, doc: Doc, text: str, changes: list[tuple[types.Range, str]]) -> None:
        self.mark_changed(doc.uri)
        doc.version += 1
        doc.text = text
        doc.texts[doc.version] = text
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=doc.uri, version=doc.version
                ),
                content_changes=[
                    types.TextDocumentContentChangePartial(range=r, text=t) for r, t in changes
                ],
            )
        )

    def did_open(self, doc: Doc) -> None:
        self.mark_changed(doc.uri)
        doc.open = True
        doc.texts[doc.version] = doc.text
        self.client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=doc.uri, language_id="python", version=doc.version, text=doc.text
                )
            )
        )

    # -- requests -----------------------------------------------------------------------------
    def send(
        self, kind: str, method: str, params: Any, doc: Doc | None = None, **meta: Any
    ) -> Flight:
        flight = Flight(
            id=f"soak-{next(self.ids)}",
            kind=kind,
            method=method,
            params=params,
            uri=doc.uri if doc else None,
            version=doc.version if doc else None,
            meta=meta,
        )
        flight.sent_at = time.monotonic()
        self.flights.append(flight)
        self.active[flight.id] = flight
        self.count["requests"] += 1
        # Written now, before whatever the caller sends next (a didChange): pytest-lsp's
        # send_request_async is a coroutine, which writes only once a task runs it.
        answer = asyncio.wrap_future(
            self.client.protocol.send_request(method, params, msg_id=flight.id)
        )
        flight.task = asyncio.ensure_future(self.run(flight, answer))
        return flight

    async def run(self, flight: Flight, answer: asyncio.Future[Any]) -> None:
        try:
            flight.result = await asyncio.wait_for(answer, REQUEST_S)
        except TimeoutError:
            self.hangs.append(f"{flight.kind} {flight.id} {flight.meta} got no answer")
            return
        except JsonRpcException as exc:
            flight.error = (getattr(exc, "code", None), str(exc))
        except Exception as exc:  # the client or the connection broke: a failure too
            flight.error = (None, f"{type(exc).__name__}: {exc}")
        finally:
            self.active.pop(flight.id, None)
            flight.answered_at = time.monotonic()
        self.count["answered"] += 1
        try:
            self.check(flight)
        except AssertionError as exc:
            self.problem(f"{flight.kind} {flight.id}: {exc}")

    def check(self, f: Flight) -> None:
        """Whether the answer is one this request may get."""
        if f.error is not None:
            code, message = f.error
            self.count["errors"] += 1
            expected = f.meta.get("expect")
            if f.cancelled and code == REQUEST_CANCELLED:
                self.count["cancelledAnswers"] += 1
                self.count["expectedErrors"] += 1
                return
            if expected is not None and code == expected[0] and expected[1] in message:
                self.count["expectedErrors"] += 1
                return
            raced = (code == CONTENT_MODIFIED and "stale version" in message) or (
                code == INVALID_PARAMS and any(m in message for m in RACE_POSITION_ERRORS)
            )
            if raced and f.meta.get("changed_after"):
                # Server bug B (see the module docstring, fixed): the request was served
                # against the text of a didChange/didClose we sent after it. Counted here
                # so the summary says how often; the test asserts it never happens.
                self.count["expectedErrors"] += 1
                self.count["servedAfterLaterChange"] += 1
                return
            raise AssertionError(f"unexpected error {code}: {message[:300]} (expected: {expected})")
        if "expect" in f.meta:
            assert f.meta.get("changed_after"), f"expected {f.meta['expect']}, got {f.result}"
            self.count["servedAfterLaterChange"] += 1
            return
        res = f.result
        if f.kind == "inline":
            assert isinstance(res, types.InlineCompletionList), res
            assert len(res.items) <= 1, res
            for item in res.items:
                assert isinstance(item.insert_text, str) and item.insert_text, item
                assert item.range is not None and item.range.start == f.params.position, item
                assert item.range.end.line == f.params.position.line, item
                self.count["inlineItems"] += 1
        elif f.kind == "rewrite":
            self.check_rewrite(f, res)
        elif f.kind == "status":
            assert res["state"] == "ready", res
        elif f.kind == "probe":
            assert res and len(res) == 1, res
            arg = res[0].command.arguments[0]
            assert arg["version"] == f.version, (arg, f.version)
        else:
            raise AssertionError(f"unknown kind {f.kind}")

    def check_rewrite(self, f: Flight, res: Any) -> None:
        assert isinstance(res, dict) and "applied" in res and "reason" in res, res
        reason = res["reason"]
        self.reasons[reason.split(" (")[0].split(";")[0][:40]] += 1
        if reason == "cancelled":
            assert res["applied"] is False, res
            return
        mode = f.meta["mode"]
        if mode == "preview":
            assert reason == "preview" and res["applied"] is False, res
            dc = res["edit"]["documentChanges"][0]
            assert dc["textDocument"] == {"uri": f.uri, "version": f.version}, dc
            assert dc["edits"][0]["range"] == f.meta["range"], dc
            assert dc["edits"][0]["newText"] == res["text"], dc
            return
        if res["applied"]:
            assert reason == "applied", res
            self.count["rewritesApplied"] += 1
            return
        if reason.startswith("document changed while generating"):
            self.count["changedWhileGenerating"] += 1
        elif reason.startswith("the reply reached maxTokens"):
            assert res["finishReason"] == "length", res
        elif reason.startswith("stale:"):  # our applyEdit handler refused it (a race)
            self.count["rewritesRefusedByClient"] += 1
        elif reason.startswith("no confident edit"):  # e.g. a random cut mid-statement no longer parses
            assert res.get("noConfidentEdit") and "nothing applied" in reason, res
            self.count["noConfidentEdit"] += 1
        else:
            raise AssertionError(f"unexpected rewrite outcome {res}")

    def rewrite(self, doc: Doc, mode: str, instruction: str | None = None) -> Flight:
        text = doc.text
        a = valid_offset(text, self.rng.randint(0, len(text)))
        if self.rng.random() < 0.6:  # mostly whole lines, as editors select
            a = max(text.rfind("\n", 0, a) + 1, 0)
        b = valid_offset(text, min(len(text), a + self.rng.choice((0, 10, 40, 80, 120))))
        rng_dict = {
            "start": _pos_dict(to_position(text, a)),
            "end": _pos_dict(to_position(text, b)),
        }
        if instruction is None:
            instruction = self.rng.choice(INSTRUCTIONS)
        arg: dict[str, Any] = {"uri": doc.uri, "version": doc.version, "range": rng_dict}
        if instruction or self.rng.random() < 0.5:
            arg["instruction"] = instruction
        if mode == "apply":
            self.apply_asked.add((doc.uri, doc.version))
            if self.rng.random() < 0.5:
                arg["mode"] = "apply"  # also the default: sometimes left out
        else:
            arg["mode"] = mode
        params = types.ExecuteCommandParams(command="echoline.rewrite", arguments=[arg])
        self.count[f"rewrite_{mode}"] += 1
        return self.send(
            "rewrite", types.WORKSPACE_EXECUTE_COMMAND, params, doc, mode=mode, range=rng_dict
        )

    def inline(self, doc: Doc) -> Flight:
        text = doc.text
        off = valid_offset(text, self.rng.randint(0, len(text)))
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=doc.uri),
            position=to_position(text, off),
            context=types.InlineCompletionContext(
                trigger_kind=self.rng.choice(
                    (
                        types.InlineCompletionTriggerKind.Automatic,
                        types.InlineCompletionTriggerKind.Invoked,
                    )
                )
            ),
        )
        self.count["inline_requests"] += 1
        return self.send("inline", types.TEXT_DOCUMENT_INLINE_COMPLETION, params, doc)

    def status_request(self) -> Flight:
        params = types.ExecuteCommandParams(command="echoline.status", arguments=[])
        return self.send("status", types.WORKSPACE_EXECUTE_COMMAND, params)

    def probe(self, doc: Doc) -> Flight:
        """A code action carries the server's version of the buffer: it must be ours."""
        end = end_position(doc.text)
        params = types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=doc.uri),
            range=types.Range(start=types.Position(line=0, character=0), end=end),
            context=types.CodeActionContext(diagnostics=[]),
        )
        return self.send("probe", types.TEXT_DOCUMENT_CODE_ACTION, params, doc)

    def cancel(self, flight: Flight) -> None:
        flight.cancelled = True
        flight.cancel_at = time.monotonic()
        self.count["cancels"] += 1
        self.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=flight.id))

    # -- edits ------------------------------------------------------------------------------
    def insert(self, doc: Doc) -> None:
        text = doc.text
        off = valid_offset(text, self.rng.randint(0, len(text)))
        # Applied rewrites mostly delete their selection (this model's replies are short):
        # a buffer that got small gets a function back.
        snippet = self.rng.choice(INSERTS[-2:] if len(text) < 250 else INSERTS)
        new = snippet.replace("{n}", str(next(self.inserts)))
        pos = to_position(text, off)
        self.set_text(doc, text[:off] + new + text[off:], [(types.Range(start=pos, end=pos), new)])
        self.count["inserts"] += 1

    def delete(self, doc: Doc) -> None:
        text = doc.text
        if len(text) < 250:  # keep some text to work on (applied rewrites delete too)
            self.insert(doc)
            return
        a = valid_offset(text, self.rng.randint(0, len(text)))
        b = valid_offset(text, min(len(text), a + self.rng.randint(1, 40)))
        rng = types.Range(start=to_position(text, a), end=to_position(text, b))
        self.set_text(doc, text[:a] + text[b:], [(rng, "")])
        self.count["deletes"] += 1

    # -- the schedule ---------------------------------------------------------------------------
    def open_docs(self) -> list[Doc]:
        return [d for d in self.docs if d.open]

    async def settle(self) -> None:
        """Every request answered (each bounded by REQUEST_S), and the engine idle."""
        while self.active:
            tasks = [f.task for f in self.active.values() if f.task is not None]
            await asyncio.wait(tasks, timeout=REQUEST_S + 10)
            if any(not t.done() for t in tasks):
                raise AssertionError(f"requests never finished: {list(self.active)}")
        st = self.status_request()
        assert st.task is not None
        await st.task

    def sample_rss(self) -> float:
        value = rss_mb(self.pid)
        self.rss_peak = max(self.rss_peak, value)
        return value

    async def action(self, kind: str) -> None:
        rng = self.rng
        docs = self.open_docs()
        doc = rng.choice(docs)
        if kind == "insert":
            self.insert(doc)
        elif kind == "delete":
            self.delete(doc)
        elif kind == "rewrite_apply":
            self.rewrite(doc, "apply")
        elif kind == "rewrite_preview":
            self.rewrite(doc, "preview")
        elif kind == "inline":
            self.inline(doc)
        elif kind == "cancel":
            live = [f for f in self.active.values() if not f.cancelled and f.kind != "status"]
            if live:
                self.cancel(rng.choice(live))
            else:  # nothing in flight: send one and cancel it at once
                f = self.inline(doc) if rng.random() < 0.5 else self.rewrite(doc, "apply")
                await asyncio.sleep(0)
                self.cancel(f)
        elif kind == "supersede":
            # A second request on the buffer while the first runs: a newer inline request
            # supersedes the older one (which answers an empty list); rewrites queue.
            _ = self.inline(doc) if rng.random() < 0.6 else self.rewrite(doc, "apply")
            await asyncio.sleep(rng.uniform(0, 0.03))
            if rng.random() < 0.6:
                self.inline(doc)
            else:
                self.rewrite(doc, rng.choice(("apply", "preview")))
            self.count["supersedes"] += 1
        elif kind == "change_during_rewrite":
            n0 = len(self.progress)
            f = self.rewrite(doc, "apply", instruction=rng.choice(INSTRUCTIONS))
            wait = rng.choice(("at once", "first progress", "a moment"))
            if wait == "first progress":  # type as soon as the reply streams
                end = time.monotonic() + 0.3
                while time.monotonic() < end and f.id in self.active:
                    if any(p.get("uri") == doc.uri for p in self.progress[n0:]):
                        break
                    await asyncio.sleep(0.005)
            elif wait == "a moment":
                await asyncio.sleep(rng.uniform(0, 0.05))
            if rng.random() < 0.7:
                self.insert(doc)
            else:
                self.delete(doc)
            self.count["changesDuringRewrite"] += 1
        elif kind == "close_reopen":
            closed = [d for d in self.docs if not d.open]
            if closed and (rng.random() < 0.5 or len(docs) <= N_DOCS - 4):
                back = rng.choice(closed)
                back.version += 1  # a client that never reuses a version number
                self.did_open(back)
                self.count["reopens"] += 1
            else:
                doc.open = False
                self.mark_changed(doc.uri)
                self.client.text_document_did_close(
                    types.DidCloseTextDocumentParams(
                        text_document=types.TextDocumentIdentifier(uri=doc.uri)
                    )
                )
                self.count["closes"] += 1
        elif kind == "bad_request":
            self.bad_request(doc)
        elif kind == "probe":
            self.probe(doc)
        elif kind == "status":
            self.status_request()
        elif kind == "settings":  # keys the loaded engine takes without a reload
            settings = {
                "maxTokens": rng.choice((24, 32, 96)),
                "inlineMaxTokens": rng.choice((8, 16, 32)),
                "speculation": rng.random() < 0.8,
                "prefillIdleMs": rng.choice((0, 200, 400)),
                "replyHistory": rng.choice((0, 4)),
            }
            self.client.workspace_did_change_configuration(
                types.DidChangeConfigurationParams(settings={"echoline": settings})
            )
        else:
            raise AssertionError(kind)

    def bad_request(self, doc: Doc) -> None:
        rng = self.rng
        text = doc.text
        spans = line_spans(text)
        choice = rng.randrange(6)
        self.count["badRequests"] += 1
        if choice == 0:
            uri = (self.root / f"never_opened_{rng.randrange(99)}.py").as_uri()
            params = inline_params(uri, types.Position(line=0, character=0))
            self.send(
                "inline",
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                params,
                expect=(INVALID_PARAMS, "unknown document"),
            )
        elif choice == 1:
            closed = [d for d in self.docs if not d.open]
            target = rng.choice(closed) if closed else None
            uri = target.uri if target else "file:///nowhere/nothing.py"
            arg = {"uri": uri, "version": 1, "range": _range_dict(0, 0, 0, 0)}
            self.send(
                "rewrite",
                types.WORKSPACE_EXECUTE_COMMAND,
                types.ExecuteCommandParams(command="echoline.rewrite", arguments=[arg]),
                target,
                expect=(INVALID_PARAMS, "unknown document"),
            )
        elif choice == 2:  # a line below the last one
            arg = {
                "uri": doc.uri,
                "version": doc.version,
                "range": _range_dict(0, 0, len(spans) + rng.randrange(5), 0),
                "mode": "preview",
            }
            self.send(
                "rewrite",
                types.WORKSPACE_EXECUTE_COMMAND,
                types.ExecuteCommandParams(command="echoline.rewrite", arguments=[arg]),
                doc,
                expect=(INVALID_PARAMS, "out of bounds"),
            )
        elif choice == 3:  # past the end of a line
            line = rng.randrange(len(spans))
            start, end = spans[line]
            pos = types.Position(line=line, character=u16(text[start:end]) + rng.randint(1, 9))
            params = inline_params(doc.uri, pos)
            self.send(
                "inline",
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                params,
                doc,
                expect=(INVALID_PARAMS, "past the end"),
            )
        elif choice == 4 and doc.version > 1:  # a version the server no longer has
            arg = {
                "uri": doc.uri,
                "version": doc.version - rng.randint(1, doc.version - 1),
                "range": _range_dict(0, 0, 0, 0),
            }
            self.send(
                "rewrite",
                types.WORKSPACE_EXECUTE_COMMAND,
                types.ExecuteCommandParams(command="echoline.rewrite", arguments=[arg]),
                doc,
                expect=(CONTENT_MODIFIED, "stale version"),
            )
        else:  # between the halves of a surrogate pair, or a negative-free absurd line
            astral = [i for i, ch in enumerate(text) if ord(ch) > 0xFFFF]
            if astral:
                pos = to_position(text, rng.choice(astral))
                pos = types.Position(line=pos.line, character=pos.character + 1)
                want = (INVALID_PARAMS, "inside a character")
            else:
                pos = types.Position(line=2**31 - 1, character=0)
                want = (INVALID_PARAMS, "out of bounds")
            params = inline_params(doc.uri, pos)
            self.send("inline", types.TEXT_DOCUMENT_INLINE_COMPLETION, params, doc, expect=want)

    async def run_schedule(self) -> dict[str, Any]:
        weights = list(ACTIONS.values())
        names = list(ACTIONS)
        warm_at = int(MAX_ACTIONS * WARMUP_FRACTION)  # or a quarter of SOAK_S, if sooner
        warm_rss = None
        t0 = time.monotonic()
        done = 0
        for i in range(MAX_ACTIONS):
            if time.monotonic() - t0 > SOAK_S:
                break
            if warm_rss is None and (i == warm_at or time.monotonic() - t0 > SOAK_S / 4):
                await self.settle()
                warm_rss = self.sample_rss()
            while len(self.active) >= MAX_IN_FLIGHT:
                tasks = [f.task for f in self.active.values() if f.task is not None]
                await asyncio.wait(
                    tasks, timeout=REQUEST_S + 10, return_when=asyncio.FIRST_COMPLETED
                )
            kind = self.kinds.choices(names, weights)[0]
            await self.action(kind)
            self.count[f"action_{kind}"] += 1
            done += 1
            if i % 10 == 0:
                value = self.sample_rss()
                if i % 60 == 0:
                    self.rss_timeline.append(round(value, 1))
            await asyncio.sleep(self.rng.uniform(0, 0.03))
        soak_s = time.monotonic() - t0
        await self.settle()
        return {"actions": done, "warmRss": warm_rss, "soakS": soak_s}


def inline_params(uri: str, pos: types.Position) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=pos,
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic
        ),
    )


def audit_edits(soak: Soak) -> Counter[str]:
    """Each "apply" rewrite's answer against what happened to its edit on the client."""
    out: Counter[str] = Counter()
    for f in soak.flights:
        if f.kind != "rewrite" or f.meta.get("mode") != "apply" or "expect" in f.meta:
            continue
        res = f.result if isinstance(f.result, dict) else None
        if res is not None and res.get("applied"):
            if f.edit != "applied":
                soak.problem(f"{f.id} answered applied, but the client applied no edit for it")
            elif f.meta["edit_text"] != res["text"]:
                soak.problem(f"{f.id} applied {f.meta['edit_text']!r}, answered {res['text']!r}")
        elif res is not None and res["reason"].startswith("stale:"):
            if f.edit != "refused":
                soak.problem(f"{f.id} answered with our refusal, but we refused no edit of it")
        elif res is not None:
            if f.edit is not None:
                soak.problem(f"{f.id} answered {res['reason']!r}, yet its edit was sent")
        elif f.edit is not None:  # answered RequestCancelled, and its edit came anyway
            out[f"cancelledButEdit{f.edit.title()}"] += 1
            assert f.edit_at is not None and f.answered_at is not None
            if f.edit_at > f.answered_at:
                out["editAfterCancelledAnswer"] += 1
    return out


def _pos_dict(p: types.Position) -> dict[str, int]:
    return {"line": p.line, "character": p.character}


def _range_dict(l1: int, c1: int, l2: int, c2: int) -> dict[str, Any]:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


async def wait_ready(soak: Soak) -> None:
    end = time.monotonic() + READY_S
    while time.monotonic() < end:
        if any(s.get("state") in ("ready", "error") for s in soak.status):
            break
        await asyncio.sleep(0.05)
    assert any(s.get("state") == "ready" for s in soak.status), soak.status


async def final_checks(soak: Soak) -> dict[str, Any]:
    """The server's view of every buffer equals the client's; it still serves."""
    for doc in soak.docs:
        if not doc.open:
            doc.version += 1
            soak.did_open(doc)
    for doc in soak.docs:
        soak.probe(doc)
        spans = line_spans(doc.text)
        last = len(spans) - 1
        width = u16(doc.text[spans[last][0] : spans[last][1]])
        for pos, want in (
            (types.Position(line=last, character=width + 1), "past the end"),
            (types.Position(line=last + 1, character=0), "out of bounds"),
        ):
            soak.send(
                "inline",
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                inline_params(doc.uri, pos),
                doc,
                expect=(INVALID_PARAMS, want),
            )
    await soak.settle()
    # A normal inline completion, at the end of a fresh line.
    doc = soak.docs[0]
    fresh = "\ndef last_one(x):\n    return "
    end = end_position(doc.text)
    soak.set_text(doc, doc.text + fresh, [(types.Range(start=end, end=end), fresh)])
    res = await asyncio.wait_for(
        soak.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=doc.uri),
                position=end_position(doc.text),
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Invoked
                ),
            )
        ),
        REQUEST_S,
    )
    assert isinstance(res, types.InlineCompletionList) and len(res.items) <= 1, res
    await soak.settle()
    status = await asyncio.wait_for(
        soak.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="echoline.status", arguments=[])
        ),
        REQUEST_S,
    )
    return status


@pytest.mark.slow
async def test_soak_over_stdio(tmp_path: Path) -> None:
    t_start = time.monotonic()
    model = write_fim_qwen2_model(tmp_path / "fim-qwen2.gguf", seed=MODEL_SEED, context=4096)
    root = tmp_path / "ws"
    root.mkdir()
    # The calibration curve of this one-off model file goes to a cache of its own; the
    # compiled kernels are the user's (compiling them again would take minutes).
    cache = tmp_path / "cache"
    (cache / "echoline").mkdir(parents=True)
    (cache / "echoline" / "numba").symlink_to(paths.cache_dir("numba"), target_is_directory=True)
    log_path = tmp_path / "server.stderr"
    # exec: the shell becomes the server, so its pid is the server's pid
    command = ["/bin/sh", "-c", 'exec "$0" -m echoline serve 2>"$1"', sys.executable, str(log_path)]
    env = {
        **os.environ,
        "ECHOLINE_LOG": "WARNING",
        "XDG_CACHE_HOME": str(cache),
        "PYTHONUNBUFFERED": "1",
    }
    config = ClientServerConfig(server_command=command, server_env=env)
    client = await config.start()
    pid = client._server.pid  # type: ignore[union-attr]  # pygls keeps the process here
    # The shell may still be inside its exec when the client returns: /proc then shows an
    # empty command line for a moment (seen once in CI), so wait for the server's.
    cmdline = ""
    for _ in range(100):
        cmdline = Path(f"/proc/{pid}/cmdline").read_text()
        if "echoline" in cmdline:
            break
        await asyncio.sleep(0.05)
    assert "echoline" in cmdline, f"pid is not the server's: {cmdline!r}"
    soak = Soak(client, root, pid)
    try:
        await client.initialize_session(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(
                    window=types.WindowClientCapabilities(work_done_progress=True),
                    workspace=types.WorkspaceClientCapabilities(
                        apply_edit=True,
                        workspace_edit=types.WorkspaceEditClientCapabilities(document_changes=True),
                    ),
                ),
                root_uri=root.as_uri(),
                workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="ws")],
                initialization_options={
                    "echoline": {
                        "model": str(model),
                        "maxTokens": 32,
                        "inlineMaxTokens": 16,
                        "prefillIdleMs": 200,
                    }
                },
            )
        )
        await wait_ready(soak)
        docs_rng = random.Random(SEED + 2)
        for i in range(N_DOCS):
            path = root / f"mod_{i:02d}.py"
            text = make_doc(i, docs_rng)
            path.write_bytes(text.encode("utf-8"))  # as is: CRLF files stay CRLF on disk
            doc = Doc(uri=path.as_uri(), text=text)
            soak.docs.append(doc)
            soak.by_uri[doc.uri] = doc
            soak.did_open(doc)
        ready_rss = soak.sample_rss()
        run = await soak.run_schedule()
        end_rss = soak.sample_rss()
        status = await final_checks(soak)
        # Only now, with nothing in flight, so every request's answer is the one checked.
        await asyncio.wait_for(client.shutdown_session(), REQUEST_S)
        returncode = client._server.returncode  # type: ignore[union-attr]
    finally:
        if client._server is not None and client._server.returncode is None:  # type: ignore
            client._server.kill()  # type: ignore[union-attr]  # a failure above: no shutdown
        await client.stop()
    duration = time.monotonic() - t_start
    errors_logged = logged_exceptions(log_path.read_text(errors="replace"))
    audit = audit_edits(soak)
    c = soak.count
    summary = {
        "actions": run["actions"],
        "requests": c["requests"],
        "answered": c["answered"],
        "errors": c["errors"],
        "expectedErrors": c["expectedErrors"],
        "cancels": c["cancels"],
        "cancelledAnswers": c["cancelledAnswers"],
        "hangs": len(soak.hangs),
        "editsSent": c["editsSent"],
        "editsApplied": c["editsApplied"],
        "editsRefused": c["editsRefused"],
        "editsUnseenVersion": c["editsUnseenVersion"],
        "rewritesApplied": c["rewritesApplied"],
        "changedWhileGenerating": c["changedWhileGenerating"],
        "inlineItems": c["inlineItems"],
        "servedAfterLaterChange": c["servedAfterLaterChange"],
        "pendingFutures": status.get("pendingFutures"),
        **audit,
        "readyRssMB": round(ready_rss, 1),
        "warmRssMB": round(run["warmRss"] or 0.0, 1),
        "endRssMB": round(end_rss, 1),
        "peakRssMB": round(soak.rss_peak, 1),
        "rssEvery60ActionsMB": soak.rss_timeline,
        "soakS": round(run["soakS"], 1),
        "durationS": round(duration, 1),
        "rewriteOutcomes": dict(soak.reasons),
        "serverTracebacks": dict(errors_logged),
    }
    print(json.dumps(summary), file=sys.stderr)

    assert not soak.hangs, soak.hangs
    assert not soak.problems, soak.problems[:20]
    assert c["answered"] == c["requests"]
    assert c["errors"] == c["expectedErrors"]
    assert c["servedAfterLaterChange"] == 0, summary  # bug B
    assert c["editsUnseenVersion"] == 0 and c["editsUnrequested"] == 0
    assert c["editsApplied"] + c["editsRefused"] == c["editsSent"]
    # every "applied" answer is an edit this client applied (a cancelled rewrite may have
    # had its edit applied before the cancel arrived: then no "applied" answer)
    assert c["rewritesApplied"] + audit["cancelledButEditApplied"] == c["editsApplied"]
    assert c["editsApplied"] > 0 and c["cancels"] > 0 and c["supersedes"] > 0
    assert run["actions"] >= 100, "the schedule ran out of time early"
    assert not [m for m in client.messages if m.type == types.MessageType.Error], client.messages
    # the server's figures: all buffers open, their total UTF-8 size as the client has it
    assert status["state"] == "ready", status
    expected_bytes = sum(len(d.text.encode("utf-8")) for d in soak.docs)
    assert status["index"]["bytes"] == expected_bytes, (status["index"], expected_bytes)
    assert status["index"]["buffers"] == N_DOCS, status["index"]
    # bug C: nothing left in pygls' future table but this status command's own two
    assert status["pendingFutures"] <= 4, status["pendingFutures"]
    # resident memory: flat after the warm-up
    assert run["warmRss"] is not None
    assert end_rss <= run["warmRss"] + RSS_SLACK_MB, summary
    # The server logs the errors it answers (pygls logs every exception a handler raised,
    # the expected InvalidParams and ContentModified ones included); nothing else.
    unexpected = {k: v for k, v in errors_logged.items() if k not in ANSWERED_EXCEPTIONS}
    assert not unexpected, (unexpected, log_path.read_text(errors="replace")[-4000:])
    assert returncode == 0, returncode
