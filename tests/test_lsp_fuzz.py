"""A params fuzz of the real server (``python -m echoline serve``) over stdio.

One server process, the tiny synthetic FIM ``qwen2`` model (tests/synth.py, loaded in well
under a second), spoken to in raw frames (``RawServer`` of tests/test_lsp_framing.py). Each
hypothesis example is 1-6 messages written to the server's stdin in ONE write: requests
(``textDocument/inlineCompletion``, ``textDocument/codeAction``, ``workspace/executeCommand``
for ``echoline.rewrite`` and ``echoline.status``) and notifications
(``textDocument/didOpen``/``didChange``/``didClose``, ``$/cancelRequest`` of a request of the
same example or of nothing). Each message starts from a plausible template (an open buffer's
URI, a position or range in it or past it, its version or another) and gets up to three
mutations at random places: a value replaced by any JSON (wrong types, null, integers up to
10**30 and down to -2**63, floats, odd strings: NUL, lone surrogates, "%zz"), a field
deleted, a field added, a huge string (70 K or 600 K characters) or a deep nesting (40, 900
or 5000 arrays; the last is past what the server's JSON parser takes). Rewrites run in
"apply" mode too; the client answers the server's ``workspace/applyEdit`` in turn with null,
applied, refused, a malformed result or an error.

What is checked, for every example:

- every request gets exactly one answer with its id, a result or a JSON-RPC error
  ``{code: int, message: str}``, within ``ANSWER_S`` (a hang guard, not a speed check); the
  error is one a client can be given for bad params (-32602 InvalidParams, -32801 stale
  version, -32800 for a request the example cancelled), never -32603 (an internal error);
- a message too deep to parse gets one ``-32700`` with ``id: null`` (and nothing else);
- a request that is valid (no mutation, an open buffer the fuzz never edits, a position or
  range inside it, its version) gets a result;
- the server process is alive, and shows no error message (``window/showMessage``).

Afterwards (``test_server_still_serves_after_the_fuzz``): an inline completion, a rewrite
and ``echoline.status`` are answered normally, the future table is back to the status
command's own entries, and the server's stderr holds no traceback but those of the errors it
answered (InvalidParams, the PositionError behind it, ContentModified).

Cases tried: ``MAX_EXAMPLES`` = 1000 examples, 3496 messages (1925 requests: 749 inline
completions, 600 rewrites, 310 status commands, 298 code actions, and 1571 notifications),
1300 of them mutated (the same ones every run: ``derandomize``), in 29.5 s on the quiet
2-core machine (31.5 s with the server's start; 38 s and 48 s with both cores busy with
another test run); the server's resident memory peaked at 275 MB (the 600 K-character
strings), and the answers to an example's messages never took more than 0.22 s (1.2 s busy).
The JSON line it printed on stderr:
{"applyEditAnswers": 12, "error -32602": 1128, "error -32800": 12, "error -32801": 52,
"examples": 1000, "messages": 3496, "mutated": 1300, "parseErrors": 52, "requests": 1925,
"result code_action": 172, "result inline": 237, "result rewrite": 104, "result status": 220,
"rewrite: applied": 2, "rewrite: fuzz": 2, "rewrite: preview": 50, "rewrite: the reply
reached maxTokens (32)": 42, "rewrite: workspace/applyEdit failed: malf": 6, "rewrite:
workspace/applyEdit failed: the ": 2, "sent cancel": 334, "sent code_action": 298, "sent
did_change": 676, "sent did_close": 293, "sent did_open": 236, "sent inline": 749, "sent
rewrite": 600, "sent status": 310, "unmutated": 2196, "maxExampleS": 0.22, "peakRssMB": 274.7,
"endRssMB": 249.2, "fuzzS": 29.5, "serverTracebacks": {"pygls.exceptions.JsonRpcInvalidParams":
580, "echoline.sidecar.lsp_utils.PositionError": 160, "pygls.exceptions.JsonRpcException": 52}}
(``ECHOLINE_FUZZ_EXAMPLES=N`` runs another number; 1500 passed as well.)

What it found, fixed in sidecar/server.py:

- a lone surrogate in a JSON string (``"\\ud800"``: JSON allows it, a JavaScript string may
  hold one and ``JSON.stringify`` writes it so) reached Python text, and every later UTF-8
  encode failed on it: a didOpen/didChange of such text showed "Error in server:
  UnicodeEncodeError" and left the index without the buffer, an inline completion on it
  answered -32603 with a traceback, a rewrite -32803. Lone surrogates now become U+FFFD as a
  message is read (one UTF-16 unit and one code point, as before: positions keep their
  meaning);
- error messages echoed the client's value whole (a 600 K-character URI came back in the
  "unknown document" error): they now quote at most 300 characters and 3 levels.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import queue
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.synth import write_fim_qwen2_model
from tests.test_lsp_framing import RawServer, frame, inline_params, rng
from tests.test_soak import line_spans, logged_exceptions, rss_mb, to_position, u16

MAX_EXAMPLES = int(os.environ.get("ECHOLINE_FUZZ_EXAMPLES", "1000"))
ANSWER_S = 60.0  # every request is answered within this (a hang guard on a busy machine)
PARSE_ERROR, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32602, -32603
REQUEST_CANCELLED, CONTENT_MODIFIED = -32800, -32801
ANSWERED_EXCEPTIONS = frozenset(
    {
        "echoline.sidecar.lsp_utils.PositionError",
        "pygls.exceptions.JsonRpcInvalidParams",
        "pygls.exceptions.JsonRpcException",  # -32801 stale version
    }
)

# Buffers the fuzz opens once and never changes: requests on them can be checked exactly.
ANCHORS = (
    "def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))\n",
    "# café 中文 \U0001f600\r\nx = 'Ωμέγα'\r\ny = 2\r\n",
    "a = 1\x0cb = 2\u2028c = 3\n\tdef g():\n\t\treturn 0\n",
)
N_SCRATCH = 3  # buffers the fuzz opens, edits and closes at will
WEIRD_URIS = (
    "",
    "file:///",
    "file://host/share/x.py",
    "untitled:Untitled-1",
    "file:///tmp/%00.py",
    "file:///tmp/%zz.py",
    "http://example.com/a.py",
    "file:///" + "a/" * 300 + "x.py",
    "not a uri",
    "file:///C:/x.py?q#frag",
)
TEXTS = (
    "",
    "x = 1\n",
    "def f(x):\r\n    return x\r\n",
    "a\x00b\n",
    "a\ud800b\n",  # a lone surrogate: JSON carries it as "\\ud800"
    "\U0001f600" * 3 + "\n\n\r",
    "line\u2028more\x0cend",
    "y = 2\n" * 20_000,  # 120 KB
)
EXTREME_INTS = (-1, -(2**31), 2**31 - 1, 2**31, 2**32 + 7, 2**53 + 1, 2**63, -(2**63) - 1, 10**30)
WEIRD_STRINGS = (
    "",
    " ",
    "\x00",
    "\ud800",
    "\udfff\ud800",
    "\U0001f600",
    "\r\n",
    "\u2028",
    "%zz",
    "../../etc/passwd",
    "-1",
    "null",
    "{}",
    "echoline.rewrite",
    "echoline.status",
    "apply",
    "preview",
)
KEYS = (
    "uri",
    "version",
    "range",
    "start",
    "end",
    "line",
    "character",
    "textDocument",
    "position",
    "context",
    "triggerKind",
    "command",
    "arguments",
    "mode",
    "instruction",
    "text",
    "contentChanges",
    "id",
    "only",
    "diagnostics",
)


class Huge:
    """A long string, made when the message is written (short in hypothesis' reports)."""

    def __init__(self, n: int, unit: str = "x") -> None:
        self.n, self.unit = n, unit

    def __repr__(self) -> str:
        return f"Huge({self.n}, {self.unit!r})"


class Deep:
    """``n`` nested arrays, spliced into the JSON text (json.dumps would recurse)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Deep({self.n})"


UNPARSEABLE_DEPTH = 5_000  # past the recursion limit of the server's json.loads
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(WEIRD_STRINGS),
    st.sampled_from(
        (Huge(70_000), Huge(600_000, "中"), Deep(40), Deep(900), Deep(UNPARSEABLE_DEPTH))
    ),
)
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=3),
    max_leaves=5,
)
OPS = ("replace", "replace", "delete", "null", "extra")
mutation = st.tuples(st.integers(0, 10**6), st.sampled_from(OPS), json_values)
KINDS = (
    "inline",
    "inline",
    "code_action",
    "rewrite",
    "rewrite",
    "status",
    "did_open",
    "did_change",
    "did_change",
    "did_close",
    "cancel",
)
message = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 2**32),  # seeds the template's choices
    st.lists(mutation, max_size=3) | st.just([]),
)
examples = st.lists(message, min_size=1, max_size=6)

STATS: Counter[str] = Counter()
PROBLEMS: list[str] = []
RSS: list[float] = []
LATENCY: list[float] = []
T0: list[float] = []


# ---- the client ------------------------------------------------------------------------------


class FuzzServer(RawServer):
    """RawServer whose answers to ``workspace/applyEdit`` vary, and that collects answers
    straight from the reader (nothing piles up in ``seen``)."""

    APPLY_ANSWERS = (
        {"result": None},
        {"result": {"applied": True}},
        {"result": {"applied": False, "failureReason": "fuzz"}},
        {"result": {"applied": "yes"}},
        {"result": [1, 2]},
        {"error": {"code": -32603, "message": "the editor failed"}},
    )

    def __init__(self, stderr_path: Path) -> None:
        self._apply = itertools.cycle(self.APPLY_ANSWERS)
        self.notes: list[dict[str, Any]] = []
        super().__init__(stderr_path)

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        if request.get("method") == "workspace/applyEdit":
            STATS["applyEditAnswers"] += 1
            return {"jsonrpc": "2.0", "id": request["id"], **next(self._apply)}
        return super().answer(request)

    def collect(
        self, ids: set[int], nulls_expected: int, timeout: float
    ) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
        """Answers to ``ids`` (every one that came) and errors with id null, until all
        are in (or ``timeout``); then a short wait for duplicates."""
        got: dict[int, list[dict[str, Any]]] = {}
        nulls: list[dict[str, Any]] = []
        end = time.monotonic() + timeout
        settled_at: float | None = None
        while True:
            done = ids <= got.keys() and len(nulls) >= nulls_expected
            if done and settled_at is None:
                settled_at = time.monotonic()
            now = time.monotonic()
            if settled_at is not None and now - settled_at > 0.02:
                break
            left = (settled_at + 0.02 - now) if settled_at is not None else end - now
            if left <= 0:
                break
            try:
                msg = self._inbox.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                self.closed = True
                break
            if "method" in msg:
                self.notes.append(msg)
            elif msg.get("id") is None:
                nulls.append(msg)
            else:
                got.setdefault(msg["id"], []).append(msg)
        return got, nulls


# ---- messages ---------------------------------------------------------------------------------


class Ctx:
    """What the templates draw from: the buffers, and the example's request ids."""

    def __init__(self, root: Path) -> None:
        self.anchor_uris = [(root / f"anchor_{i}.py").as_uri() for i in range(len(ANCHORS))]
        self.scratch_uris = [(root / f"scratch_{i}.py").as_uri() for i in range(N_SCRATCH)]
        self.ids = itertools.count(1_000_000)  # far from anything a mutation writes


def _doc(ctx: Ctx, rnd: random.Random) -> tuple[str, str | None]:
    """(uri, text when it is an anchor)."""
    r = rnd.random()
    if r < 0.6:
        i = rnd.randrange(len(ANCHORS))
        return ctx.anchor_uris[i], ANCHORS[i]
    if r < 0.9:
        return rnd.choice(ctx.scratch_uris), None
    return rnd.choice(WEIRD_URIS), None


def _position(text: str | None, rnd: random.Random) -> tuple[dict[str, int], int | None, bool]:
    """(position, its offset, whether it names a place in ``text``)."""
    if text is not None and rnd.random() < 0.7:
        off = rnd.randint(0, len(text))
        if 0 < off < len(text) and text[off - 1] == "\r" and text[off] == "\n":
            off -= 1  # no position names the middle of a CRLF
        p = to_position(text, off)
        return {"line": p.line, "character": p.character}, off, True
    if text is not None and rnd.random() < 0.5:  # just past a line's end, or below the last
        spans = line_spans(text)
        line = rnd.randrange(len(spans) + 2)
        width = u16(text[spans[line][0] : spans[line][1]]) if line < len(spans) else 0
        return {"line": line, "character": width + rnd.randint(1, 3)}, None, False
    pick = rnd.choice((0, 1, 3, 7, 2**31 - 1, 2**31, -1))
    return {"line": pick, "character": rnd.choice((0, 2, 5, 2**31 - 1, -2))}, None, False


def _range(text: str | None, rnd: random.Random) -> tuple[dict[str, Any], bool]:
    p, a, ok1 = _position(text, rnd)
    q, b, ok2 = _position(text, rnd)
    if ok1 and ok2 and a is not None and b is not None and b < a:
        p, q = q, p
    return {"start": p, "end": q}, ok1 and ok2


def template(kind: str, seed: int, ctx: Ctx, request_ids: list[int]) -> dict[str, Any]:
    """A message (``method``, ``params``, ``id`` for a request) and whether it is valid."""
    rnd = random.Random(seed)
    if kind == "inline":
        uri, text = _doc(ctx, rnd)
        pos, _, ok = _position(text, rnd)
        params: Any = {
            "textDocument": {"uri": uri},
            "position": pos,
            "context": {"triggerKind": rnd.choice((1, 2))},
        }
        return {"method": "textDocument/inlineCompletion", "params": params, "valid": ok}
    if kind == "code_action":
        uri, text = _doc(ctx, rnd)
        r, ok = _range(text, rnd)
        context: dict[str, Any] = {"diagnostics": []}
        if rnd.random() < 0.4:
            context["only"] = rnd.choice((["refactor"], ["quickfix"], [], ["refactor.rewrite"]))
        params = {"textDocument": {"uri": uri}, "range": r, "context": context}
        return {"method": "textDocument/codeAction", "params": params, "valid": ok}
    if kind == "rewrite":
        uri, text = _doc(ctx, rnd)
        r, ok = _range(text, rnd)
        version = 1 if rnd.random() < 0.8 else rnd.choice((0, 2, -1, 2**31 - 1))
        arg: dict[str, Any] = {"uri": uri, "version": version, "range": r}
        mode = rnd.choice(("apply", "preview", "preview", None))
        if mode is not None:
            arg["mode"] = mode
        if rnd.random() < 0.5:
            arg["instruction"] = rnd.choice(("", "Add type hints.", "速く \U0001f600"))
        params = {"command": "echoline.rewrite", "arguments": [arg]}
        valid = ok and text is not None and version == 1
        return {"method": "workspace/executeCommand", "params": params, "valid": valid}
    if kind == "status":
        uri, _ = _doc(ctx, rnd)
        arguments = rnd.choice(([], [{"uri": uri}], [5, "x"], None))
        params = {"command": "echoline.status"}
        if arguments is not None:
            params["arguments"] = arguments
        return {"method": "workspace/executeCommand", "params": params, "valid": True}
    if kind == "did_open":
        uri = rnd.choice(ctx.scratch_uris)
        item = {
            "uri": uri,
            "languageId": "python",
            "version": rnd.choice((1, 2, 0, -5, 2**31 - 1)),
            "text": rnd.choice(TEXTS),
        }
        return {"method": "textDocument/didOpen", "params": {"textDocument": item}}
    if kind == "did_change":
        uri = rnd.choice(ctx.scratch_uris)
        changes: list[dict[str, Any]] = []
        for _ in range(rnd.randint(0, 3)):
            if rnd.random() < 0.2:
                changes.append({"text": rnd.choice(TEXTS)})
            else:
                r, _ = _range(None, rnd)
                changes.append({"range": r, "text": rnd.choice(("", "z", "\r\n", "\U0001f600"))})
        version = rnd.choice((2, 3, 1, 0, -1, 2**31 - 1))
        params = {"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}
        return {"method": "textDocument/didChange", "params": params}
    if kind == "did_close":
        uri = rnd.choice(ctx.scratch_uris)
        return {"method": "textDocument/didClose", "params": {"textDocument": {"uri": uri}}}
    if kind == "cancel":
        target = rnd.choice(request_ids) if request_ids and rnd.random() < 0.8 else 999
        return {"method": "$/cancelRequest", "params": {"id": target}}
    raise AssertionError(kind)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def mutate(params: Any, mutations: list[tuple[int, str, Any]]) -> tuple[Any, bool]:
    """``params`` with the mutations applied; (..., False) when params is left out."""
    present = True
    for where, op, value in mutations:
        if not present:
            params, present = None, True
        paths = _paths(params)
        path = paths[where % len(paths)]
        if not path:  # the params themselves
            if op == "delete":
                params, present = None, False
            else:
                params = None if op == "null" else value
            continue
        parent = params
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if op == "delete":
            del parent[key]
        elif op == "null":
            parent[key] = None
        elif op == "extra" and isinstance(parent, dict):
            parent[f"x{where % 97}"] = value
        elif op == "extra":
            parent.append(value)
        else:
            parent[key] = value
    return params, present


def _markers(value: Any, found: list[Any]) -> None:
    if isinstance(value, Huge | Deep):
        found.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _markers(v, found)
    elif isinstance(value, list):
        for v in value:
            _markers(v, found)


def encode(body: dict[str, Any]) -> bytes:
    """The JSON text of ``body``, huge strings and deep nestings made here."""
    deep: dict[str, int] = {}

    def default(obj: Any) -> Any:
        if isinstance(obj, Huge):
            return obj.unit * obj.n
        if isinstance(obj, Deep):
            tag = f"@@deep{len(deep)}@@"
            deep[tag] = obj.n
            return tag
        raise TypeError(type(obj).__name__)

    text = json.dumps(body, default=default)
    for tag, n in deep.items():
        text = text.replace(f'"{tag}"', "[" * n + "]" * n, 1)
    return text.encode()


def too_deep(value: Any) -> bool:
    found: list[Any] = []
    _markers(value, found)
    return any(isinstance(m, Deep) and m.n >= UNPARSEABLE_DEPTH for m in found)


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("fuzz")
    model = write_fim_qwen2_model(base / "fim-qwen2.gguf", seed=39)
    root = base / "ws"
    root.mkdir()
    srv = FuzzServer(base / "server.err")
    try:
        caps = {
            "window": {"workDoneProgress": True},
            "workspace": {"applyEdit": True, "workspaceEdit": {"documentChanges": True}},
        }
        srv.initialize(root, model, caps)
        srv.wait_ready()
        ctx = Ctx(root)
        # Replies long enough to end (this model's mostly do within 32 tokens), so that
        # "apply" rewrites send workspace/applyEdit.
        srv.notify("workspace/didChangeConfiguration", {"settings": {"echoline": {"maxTokens": 32}}})
        for uri, text in zip(ctx.anchor_uris, ANCHORS, strict=True):
            srv.open(uri, text)
        T0.append(time.monotonic())
        yield srv, ctx
    finally:
        srv.close()


# ---- the fuzz -----------------------------------------------------------------------------------


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: the server's state moves on
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=examples)
def test_every_request_is_answered_whatever_its_params(
    fuzz_server: tuple[FuzzServer, Ctx], batch: list[tuple[str, int, list[Any]]]
) -> None:
    srv, ctx = fuzz_server
    STATS["examples"] += 1
    requests: dict[int, dict[str, Any]] = {}
    cancelled: set[Any] = set()
    unparseable = 0
    wire = b""
    request_ids: list[int] = []
    for kind, seed, mutations in batch:
        msg = template(kind, seed, ctx, request_ids)
        params, present = mutate(copy.deepcopy(msg["params"]), mutations)
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": msg["method"]}
        if present:
            body["params"] = params
        is_request = "valid" in msg
        if is_request:
            body["id"] = msg_id = next(ctx.ids)
            request_ids.append(msg_id)
        if too_deep(params if present else None):
            unparseable += 1
        elif is_request:
            requests[body["id"]] = {
                "kind": kind,
                "valid": msg["valid"] and not mutations,
                "body": body,
            }
        elif msg["method"] == "$/cancelRequest" and present and isinstance(params, dict):
            if params.get("id") in request_ids:  # (a mutation may have kept the id)
                cancelled.add(params["id"])
        STATS[f"sent {kind}"] += 1
        STATS["messages"] += 1
        STATS["mutated" if mutations else "unmutated"] += 1
        wire += frame(encode(body))
    t0 = time.monotonic()
    srv.write(wire)
    got, nulls = srv.collect(set(requests), unparseable, ANSWER_S)
    LATENCY.append(time.monotonic() - t0)
    assert srv.proc.poll() is None, "the server died"

    def show(msg_id: int) -> str:
        return json.dumps(requests[msg_id]["body"], default=repr)[:600]

    missing = [i for i in requests if i not in got]
    assert not missing, f"no answer within {ANSWER_S}s to: {[show(i) for i in missing]}"
    assert len(nulls) == unparseable, nulls
    for err in nulls:
        assert err["error"]["code"] == PARSE_ERROR, err
    STATS["parseErrors"] += len(nulls)
    for msg_id, answers in got.items():
        assert msg_id in requests or msg_id in request_ids, answers  # ours, nothing else
        assert len(answers) == 1, answers
        [answer] = answers
        if msg_id not in requests:  # a deep one the server read after all
            continue
        req = requests[msg_id]
        assert ("result" in answer) != ("error" in answer), answer
        if "result" in answer:
            STATS[f"result {req['kind']}"] += 1
            if req["kind"] == "rewrite":  # the outcomes, "applied" and its failures
                STATS["rewrite: " + str(answer["result"].get("reason"))[:32]] += 1
            continue
        err = answer["error"]
        assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str), err
        STATS[f"error {err['code']}"] += 1
        allowed = {INVALID_PARAMS, CONTENT_MODIFIED}
        if msg_id in cancelled:
            allowed.add(REQUEST_CANCELLED)
        if req["valid"] and msg_id not in cancelled:
            allowed = set()
        assert err["code"] in allowed, f"{err} for {show(msg_id)}"
    shown = [
        n for n in srv.notes if n.get("method") == "window/showMessage" and n["params"]["type"] == 1
    ]
    assert not shown, shown
    srv.notes.clear()
    STATS["requests"] += len(requests)
    RSS.append(rss_mb(srv.proc.pid))


def test_server_still_serves_after_the_fuzz(fuzz_server: tuple[FuzzServer, Ctx]) -> None:
    srv, ctx = fuzz_server
    fuzz_s = time.monotonic() - T0[0]
    uri, text = ctx.anchor_uris[0], ANCHORS[0]
    end = to_position(text, text.index("+ b") + 3)
    msg = srv.request(
        "textDocument/inlineCompletion", inline_params(uri, end.line, end.character), ANSWER_S
    )
    assert "result" in msg and isinstance(msg["result"]["items"], list), msg
    args = {"uri": uri, "version": 1, "range": rng(0, 0, 2, 0), "mode": "preview"}
    res = srv.command("echoline.rewrite", [args], timeout=ANSWER_S)
    assert "result" in res and res["result"]["reason"] == "preview", res
    status = srv.status_ok()
    assert status["state"] == "ready" and status["pendingFutures"] <= 4, status
    errors = logged_exceptions(srv.stderr_path.read_text(errors="replace"))
    summary = {
        **dict(sorted(STATS.items())),
        "maxExampleS": round(max(LATENCY, default=0.0), 2),
        "peakRssMB": round(max(RSS, default=0.0), 1),
        "endRssMB": round(RSS[-1], 1) if RSS else None,
        "fuzzS": round(fuzz_s, 1),
        "serverTracebacks": dict(errors),
    }
    print(json.dumps(summary), file=sys.stderr)
    unexpected = {k: v for k, v in errors.items() if k not in ANSWERED_EXCEPTIONS}
    tail = srv.stderr_path.read_text(errors="replace")[-4000:]
    assert not unexpected, (unexpected, tail)
    assert srv.proc.poll() is None
