"""The real server (``python -m echoline serve``) spoken to in raw bytes over stdio.

What an editor's client library never sends, but a buggy plugin, a proxy or a bad
pipe can: invalid JSON, batches, missing ``jsonrpc``, params of the wrong types or
none at all, absurd positions, absurd ``Content-Length`` headers. Each request
with an id must get an error response within a few seconds, each unreadable
frame an error with ``id: null``, and afterwards a normal request must still be
answered. The model is a tiny synthetic one (tests/synth.py), loaded in seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from echoline.sidecar.lsp_utils import check_position, unit_len
from echoline.sidecar.prompts import rewrite_prompt, rewrite_prompt_ids
from echoline.sidecar.server import FrameError, FrameParser
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.workspace import TextDocument

from tests.synth import write_fim_qwen2_model

ROOT = Path(__file__).resolve().parent.parent
SERVER_CMD = [sys.executable, "-m", "echoline", "serve"]
ANSWER_S = 5.0  # every request that needs no model gets its answer within this
MODEL_S = 60.0  # a request that runs the (tiny) model; a hang guard on a busy machine
READY_S = 120.0
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
NOT_INITIALIZED = -32002
GRIN = "\U0001f600"


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawServer:
    """A server subprocess and a byte-level client: frames out, parsed messages in.

    A reader thread parses the server's (well-formed) output; requests the server
    sends us are answered with null so none of its handlers waits on us.
    """

    def __init__(self, stderr_path: Path) -> None:
        env = {**os.environ, "ECHOLINE_LOG": "WARNING", "PYTHONUNBUFFERED": "1"}
        self._stderr = open(stderr_path, "wb")  # closed in close()
        self.stderr_path = stderr_path
        self.proc = subprocess.Popen(
            SERVER_CMD,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=ROOT,
            env=env,
        )
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []  # everything read so far, in order
        self.closed = False
        self.init: dict[str, Any] = {}  # the initialize result
        threading.Thread(target=self._read, daemon=True).start()

    # -- wire --------------------------------------------------------------------------------
    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            headers: dict[bytes, bytes] = {}
            while True:
                line = out.readline()
                if not line:
                    self._inbox.put(None)
                    return
                if not line.strip():
                    break
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            msg = json.loads(out.read(int(headers[b"content-length"])))
            if "method" in msg and "id" in msg:
                reply = self.answer(msg)
                if reply is not None:
                    self.send(reply)
            self._inbox.put(msg)

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The reply to a request the server sent us (None: no reply). Here null."""
        return {"jsonrpc": "2.0", "id": request["id"], "result": None}

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def send(self, obj: Any) -> None:
        self.write(frame(json.dumps(obj).encode()))

    def next_id(self) -> int:
        return next(self._ids)

    # -- waiting -----------------------------------------------------------------------------
    def _messages(self, timeout: float) -> Iterator[dict[str, Any]]:
        """Messages seen so far, then new ones as they come, until ``timeout``."""
        yield from list(self.seen)
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                msg = self._inbox.get(timeout=left)
            except queue.Empty:
                return
            if msg is None:
                self.closed = True
                return
            self.seen.append(msg)
            yield msg

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict:
        for msg in self._messages(timeout):
            if pred(msg):
                self.seen.remove(msg)  # taken: a later wait does not see it again
                return msg
        tail = self.stderr_path.read_text(errors="replace")[-3000:]
        raise AssertionError(f"no {what} within {timeout}s (closed={self.closed})\n{tail}")

    def response(self, msg_id: Any, timeout: float = ANSWER_S) -> dict[str, Any]:
        return self.wait_for(
            lambda m: (
                m.get("id") == msg_id and ("result" in m or "error" in m) and "method" not in m
            ),
            timeout,
            f"response to id {msg_id!r}",
        )

    def null_error(self, timeout: float = ANSWER_S) -> dict[str, Any]:
        msg = self.wait_for(
            lambda m: "id" in m and m["id"] is None and "error" in m, timeout, "error with id null"
        )
        return msg["error"]

    # -- requests ----------------------------------------------------------------------------
    def request_raw(self, payload: dict[str, Any], timeout: float = ANSWER_S) -> dict[str, Any]:
        msg_id = payload.setdefault("id", self.next_id())
        self.send(payload)
        return self.response(msg_id, timeout)

    def request(self, method: str, params: Any = None, timeout: float = ANSWER_S) -> dict:
        payload: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            payload["params"] = params
        return self.request_raw(payload, timeout)

    def result(self, method: str, params: Any = None, timeout: float = ANSWER_S) -> Any:
        msg = self.request(method, params, timeout)
        assert "error" not in msg, msg
        return msg["result"]

    def error(self, method: str, params: Any = None, timeout: float = ANSWER_S) -> dict:
        msg = self.request(method, params, timeout)
        assert "error" in msg, msg
        return msg["error"]

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def command(self, command: str, arguments: Any = None, timeout: float = ANSWER_S) -> dict:
        params: dict[str, Any] = {"command": command}
        if arguments is not None:
            params["arguments"] = arguments
        return self.request("workspace/executeCommand", params, timeout)

    def status_ok(self) -> dict[str, Any]:
        """The normal request that must still be answered after each bad one."""
        msg = self.command("echoline.status", [])
        assert "result" in msg and msg["result"]["state"] in ("ready", "loading"), msg
        return msg["result"]

    # -- session -----------------------------------------------------------------------------
    def initialize(self, root: Path, model: Path, capabilities: dict[str, Any]) -> dict:
        options = {
            "echoline": {
                "model": str(model),
                "maxTokens": 4,
                "inlineMaxTokens": 4,
                "prefillOnIdle": False,
            }
        }
        init = self.result(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": root.as_uri(),
                "capabilities": capabilities,
                "initializationOptions": options,
            },
            timeout=30,
        )
        self.notify("initialized", {})
        self.init = init
        return init

    def wait_ready(self) -> None:
        msg = self.wait_for(
            lambda m: (
                m.get("method") == "echoline/status" and m["params"]["state"] in ("ready", "error")
            ),
            READY_S,
            "echoline/status ready",
        )
        assert msg["params"]["state"] == "ready", msg

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": uri,
                    "languageId": "python",
                    "version": version,
                    "text": text,
                }
            },
        )

    def close(self) -> None:
        """shutdown + exit, then the process must end; killed if it does not."""
        try:
            if self.proc.poll() is None and not self.closed:
                self.request("shutdown", timeout=10)
                self.notify("exit", None)
        except (AssertionError, OSError):
            pass
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._stderr.close()


def inline_params(uri: str, line: Any, character: Any) -> dict[str, Any]:
    return {
        "textDocument": {"uri": uri},
        "position": {"line": line, "character": character},
        "context": {"triggerKind": 1},
    }


def rng(l1: int, c1: int, l2: int, c2: int) -> dict[str, Any]:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


# ---- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fim_qwen2_model(tmp_path_factory.mktemp("model") / "fim-qwen2.gguf", seed=5)


@pytest.fixture(scope="module")
def engine(model: Path) -> Any:
    """The same model in-process, for its tokenizer: the prompt a selection makes."""
    from echoline.engine.api import Engine

    return Engine.load(str(model))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def servers(model: Path, root: Path, tmp_path_factory: pytest.TempPathFactory):
    """A UTF-16 session (no positionEncodings offered) and a UTF-8 one, started
    together so their model loads overlap."""
    logs = tmp_path_factory.mktemp("logs")
    utf16, utf8 = RawServer(logs / "utf16.err"), RawServer(logs / "utf8.err")
    try:
        utf16.initialize(root, model, {})
        utf8.initialize(root, model, {"general": {"positionEncodings": ["utf-8", "utf-16"]}})
        utf16.wait_ready()
        utf8.wait_ready()
        yield utf16, utf8
    finally:
        utf16.close()
        utf8.close()


@pytest.fixture(scope="module")
def server(servers: tuple[RawServer, RawServer]) -> RawServer:
    return servers[0]


@pytest.fixture(scope="module")
def utf8_server(servers: tuple[RawServer, RawServer]) -> RawServer:
    return servers[1]


_names = itertools.count(1)


def new_uri(root: Path, text: str, suffix: str = ".py") -> str:
    path = root / f"doc{next(_names)}{suffix}"
    path.write_text(text, encoding="utf-8", newline="")
    return path.as_uri()


# ---- bodies that are not JSON-RPC messages ---------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method"', PARSE_ERROR),  # cut short
        (b"\xff\xfe\x00garbage", PARSE_ERROR),  # not UTF-8 text
        (b"NaN", PARSE_ERROR),  # Python's json would take it; JSON does not
        (b"", PARSE_ERROR),  # Content-Length: 0
        (b'[{"jsonrpc": "2.0", "id": 2, "method": "shutdown"}]', INVALID_REQUEST),  # a batch
        (b"[]", INVALID_REQUEST),
        (b'"hello"', INVALID_REQUEST),
        (b"42", INVALID_REQUEST),
        (b"null", INVALID_REQUEST),
    ],
)
def test_bodies_that_are_not_messages_get_an_error_with_null_id(
    server: RawServer, body: bytes, code: int
) -> None:
    server.write(frame(body))
    err = server.null_error()
    assert err["code"] == code, err
    assert err["message"]
    server.status_ok()  # still serving (and the batch's "shutdown" was not run)


def test_bad_envelopes_are_invalid_requests(server: RawServer) -> None:
    status = {"command": "echoline.status", "arguments": []}
    cases = [
        ({"id": 71, "method": "workspace/executeCommand", "params": status}, 71, "'jsonrpc'"),
        (
            {"jsonrpc": "1.0", "id": 72, "method": "workspace/executeCommand", "params": status},
            72,
            "'jsonrpc'",
        ),
        ({"jsonrpc": "2.0", "id": 73, "method": 5, "params": status}, 73, "'method'"),
        ({"jsonrpc": "2.0", "id": 74}, 74, "'method'"),
    ]
    for payload, msg_id, words in cases:
        server.send(payload)
        msg = server.response(msg_id)
        assert msg["error"]["code"] == INVALID_REQUEST and words in msg["error"]["message"], msg
        server.status_ok()
    for bad_id in ([1], True, 1.5, None, {"a": 1}):
        server.send({"jsonrpc": "2.0", "id": bad_id, "method": "shutdown"})
        err = server.null_error()
        assert err["code"] == INVALID_REQUEST and "'id'" in err["message"], err
        server.status_ok()  # and shutdown was not run


def test_unknown_methods_and_non_structured_params(server: RawServer) -> None:
    assert server.error("echoline/nope", {"a": 1})["code"] == METHOD_NOT_FOUND
    assert server.error("echoline/nope")["code"] == METHOD_NOT_FOUND  # no params at all
    assert server.error("textDocument/hover", {"bogus": True})["code"] == METHOD_NOT_FOUND
    msg = server.request_raw(
        {"jsonrpc": "2.0", "method": "workspace/executeCommand", "params": "echoline.status"}
    )
    assert (
        msg["error"]["code"] == INVALID_PARAMS and "object or an array" in msg["error"]["message"]
    )
    server.status_ok()


# ---- params of the wrong shape ---------------------------------------------------------------


def test_inline_completion_with_bad_params_gets_invalid_params(
    server: RawServer, root: Path
) -> None:
    text = "def f(x):\n    return x\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    huge = 2**31 - 1
    cases: list[tuple[Any, str]] = [
        (None, "params"),
        ({}, "required field missing"),
        ({"textDocument": {"uri": uri}, "context": {"triggerKind": 1}}, "position"),
        ({**inline_params(uri, 0, 0), "context": None}, "context"),
        ({**inline_params(uri, 0, 0), "textDocument": {"uri": 7}}, "expected a string"),
        ({**inline_params(uri, 0, 0), "textDocument": "file:///x"}, "text_document"),
        (inline_params(uri, "0", 0), "expected an integer, got a string"),
        (inline_params(uri, 0, 1.5), "expected an integer, got a number"),
        (inline_params(uri, True, 0), "expected an integer, got a boolean"),
        (inline_params(uri, None, 0), "line"),
        (inline_params(uri, -1, 0), "should be in range"),
        (inline_params(uri, 0, -3), "should be in range"),
        (inline_params(uri, 2**31, 0), "should be in range"),
        (inline_params(uri, 0, 10**30), "should be in range"),
        (inline_params(uri, huge, 0), "out of bounds"),
        (inline_params(uri, 0, huge), "past the end"),
        (inline_params(uri, 9, 0), "out of bounds"),
        (inline_params("file:///nowhere/x.py", 0, 0), "unknown document"),
    ]
    for params, words in cases:
        msg = server.request_raw(
            {"jsonrpc": "2.0", "method": "textDocument/inlineCompletion"}
            | ({} if params is None else {"params": params})
        )
        assert "error" in msg, (params, msg)
        err = msg["error"]
        assert err["code"] == INVALID_PARAMS and words in err["message"], (params, err)
    null = server.error("textDocument/inlineCompletion", None)  # "params": absent
    assert null["code"] == INVALID_PARAMS
    explicit_null = server.request_raw(
        {"jsonrpc": "2.0", "method": "textDocument/inlineCompletion", "params": None}
    )
    assert explicit_null["error"]["code"] == INVALID_PARAMS
    server.status_ok()


def test_execute_command_with_bad_arguments_gets_invalid_params(
    server: RawServer, root: Path
) -> None:
    text = "x = 1\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    ok = {"uri": uri, "version": 1, "range": rng(0, 0, 0, 1), "mode": "preview"}

    def with_range(r: Any) -> list[Any]:
        return [{**ok, "range": r}]

    cases: list[tuple[dict[str, Any] | None, str]] = [
        (None, ""),  # params absent
        ({}, "command"),
        ({"command": 7}, "expected a string"),
        ({"command": "echoline.rewrite", "arguments": 5}, "arguments"),
        ({"command": "echoline.rewrite", "arguments": "all"}, "arguments"),
        ({"command": "echoline.rewrite", "arguments": {"uri": uri}}, "arguments"),
        ({"command": "echoline.rewrite"}, "ONE argument"),
        ({"command": "echoline.rewrite", "arguments": []}, "ONE argument"),
        ({"command": "echoline.rewrite", "arguments": [None]}, "ONE argument"),
        ({"command": "echoline.rewrite", "arguments": [ok, ok]}, "ONE argument"),
        ({"command": "echoline.rewrite", "arguments": [{**ok, "version": "1"}]}, "'version'"),
        ({"command": "echoline.rewrite", "arguments": [{**ok, "uri": None}]}, "'uri'"),
        ({"command": "echoline.rewrite", "arguments": with_range(None)}, "'range'"),
        ({"command": "echoline.rewrite", "arguments": with_range(rng(-5, 0, 0, 1))}, "negative"),
        (
            {"command": "echoline.rewrite", "arguments": with_range(rng(0, 0, 10**30, 0))},
            "out of range",
        ),
        (
            {"command": "echoline.rewrite", "arguments": with_range(rng(0, 0, 2**31 - 1, 0))},
            "out of bounds",
        ),
        (
            {"command": "echoline.rewrite", "arguments": with_range(rng(0, 0, 0, 2**31 - 1))},
            "past the end",
        ),
        (
            {"command": "echoline.rewrite", "arguments": with_range({"start": {"line": 0}})},
            "range.start",
        ),
        ({"command": "echoline.nope", "arguments": []}, "not defined"),
    ]
    for params, words in cases:
        msg = server.request("workspace/executeCommand", params)
        assert "error" in msg, (params, msg)
        err = msg["error"]
        assert err["code"] == INVALID_PARAMS and words in err["message"], (params, err)
    # echoline.status ignores what it does not understand
    assert server.command("echoline.status", [5, "x"])["result"]["state"] == "ready"
    server.status_ok()


def test_other_handlers_with_bad_params(server: RawServer, root: Path) -> None:
    text = "a = 1\nb = 2\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    good = {"textDocument": {"uri": uri}, "range": rng(0, 0, 1, 0), "context": {"diagnostics": []}}
    assert server.result("textDocument/codeAction", good)[0]["command"]["command"] == (
        "echoline.rewrite"
    )
    for params in (None, {**good, "range": None}, {**good, "range": rng(0, 0, -1, 0)}):
        msg = server.request("textDocument/codeAction", params)
        assert msg["error"]["code"] == INVALID_PARAMS, msg
    # Notifications cannot be answered: dropped, and the server keeps serving.
    server.notify("textDocument/didOpen", {"textDocument": {"uri": 5, "text": None}})
    server.notify("textDocument/didChange", None)
    server.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": "file:///not/open.py", "version": 2}, "contentChanges": []},
    )
    server.send({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": [1]}})
    server.status_ok()


# ---- framing ---------------------------------------------------------------------------------


def _status_frame(msg_id: int) -> bytes:
    body = {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "workspace/executeCommand",
        "params": {"command": "echoline.status", "arguments": []},
    }
    return frame(json.dumps(body).encode())


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (b"Content-Length: 1000000000000\r\n", "exceeds the limit"),
        (b"Content-Length: 99999999999999999999999999999999999\r\n", "exceeds the limit"),
        (b"Content-Length: 67108865\r\n", "exceeds the limit"),  # the cap + 1
        (b"Content-Length: -5\r\n", "invalid Content-Length"),
        (b"Content-Length: abc\r\n", "invalid Content-Length"),
        (b"Content-Length: 1e3\r\n", "invalid Content-Length"),
        (
            b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n",
            "without a Content-Length",
        ),
        (b"X" * 10_000 + b"\r\n", "longer than"),
        (b"this is not a header\r\n", "malformed header"),
    ],
)
def test_bad_frames_are_answered_and_skipped(server: RawServer, header: bytes, words: str) -> None:
    """The bad frame's body is skipped (its request never runs), the next frame is read."""
    lost, after = server.next_id(), server.next_id()
    server.write(header + b"\r\n" + json.dumps({"jsonrpc": "2.0", "id": lost}).encode())
    server.write(_status_frame(after))
    err = server.null_error()
    assert err["code"] in (PARSE_ERROR, INVALID_REQUEST) and words in err["message"], err
    assert server.response(after)["result"]["state"] == "ready"
    assert server.proc.poll() is None
    assert not any(m.get("id") == lost for m in server.seen)


def test_short_content_length_and_split_frames(server: RawServer) -> None:
    # A Content-Length shorter than the body: the cut body is not JSON, the rest of
    # it runs into the next frame's header; both frames after it are still read.
    first, second = server.next_id(), server.next_id()
    body = json.dumps({"jsonrpc": "2.0", "id": 999_999, "method": "shutdown"}).encode()
    server.write(b"Content-Length: 10\r\n\r\n" + body + _status_frame(first))
    # two errors: the cut body is not JSON, its rest is not a header line
    assert server.null_error()["code"] == PARSE_ERROR
    assert "malformed header" in server.null_error()["message"]
    server.write(_status_frame(second))
    assert server.response(first)["result"]["state"] == "ready"
    assert server.response(second)["result"]["state"] == "ready"
    # One frame in pieces, then two frames in one write, "\n"-only header lines.
    a, b, c = server.next_id(), server.next_id(), server.next_id()
    data = _status_frame(a)
    for i in range(0, len(data), 7):
        server.write(data[i : i + 7])
        time.sleep(0.002)
    server.write(b"\r\n\r\n" + _status_frame(b) + _status_frame(c).replace(b"\r\n", b"\n", 2))
    for msg_id in (a, b, c):
        assert server.response(msg_id)["result"]["state"] == "ready"


# ---- the frame parser in process ------------------------------------------------------------

bodies = st.lists(st.binary(max_size=40), min_size=1, max_size=6)
junk = st.sampled_from(
    [
        b"Content-Length: 99999999999\r\n\r\n{",
        b"Content-Length: -1\r\n\r\n",
        b"garbage line\r\n",
        b"Content-Type: x\r\n\r\n{}",
        b"\r\n",
        b"",
    ]
)


@settings(max_examples=200, deadline=None)
@given(bodies=bodies, junk=junk, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_frame_parser_reads_frames_in_any_chunks_and_recovers(
    bodies: list[bytes], junk: bytes, cuts: list[int]
) -> None:
    """Bodies come out whole whatever the read boundaries; junk before them costs at
    most errors, never a frame after it (the bodies hold no "Content-Length")."""
    bodies = [re.sub(rb"(?i)content", b"", b) for b in bodies]
    stream = junk + b"".join(frame(b) for b in bodies)
    parser = FrameParser(max_frame_bytes=1000)
    out: list[bytes | FrameError] = []
    start = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        parser.feed(stream[start:cut])
        start = max(start, cut)
        out.extend(parser.frames())
    frames = [x for x in out if isinstance(x, bytes)]
    errors = [x for x in out if isinstance(x, FrameError)]
    assert frames[-len(bodies) :] == bodies
    assert len(frames) <= len(bodies) + 1  # (b"Content-Type..." junk has a valid frame)
    if junk in (b"", b"\r\n"):
        assert frames == bodies and not errors
    for err in errors:
        assert "skipping to the next Content-Length header" in err.message


def test_frame_parser_memory_stays_bounded_while_skipping() -> None:
    parser = FrameParser(max_frame_bytes=1024)
    parser.feed(b"Content-Length: 1000000000000\r\n\r\n")
    [err] = list(parser.frames())
    assert isinstance(err, FrameError) and "exceeds the limit of 1024" in err.message
    for _ in range(100):  # 6.4 MB of a lying body: dropped as it comes
        parser.feed(b"x" * 65536)
        assert list(parser.frames()) == []
        assert len(parser._buf) <= 64
    parser.feed(frame(b"{}"))
    assert list(parser.frames()) == [b"{}"]


# ---- documents with line ends str.splitlines() sees and the LSP does not ----------------------


def _prompt_tokens(engine: Any, text: str, start: int, end: int, uri: str) -> int:
    return len(rewrite_prompt_ids(engine, rewrite_prompt(text, start, end, "", name=uri)))


def test_form_feed_document_rewrite_range_covers_lsp_lines(
    server: RawServer, root: Path, engine: Any
) -> None:
    text = "import os\n\f\ndef f(x):\f return x\n\u2028y = 1\x1cz\nlast = 2\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    # LSP lines: 0 "import os", 1 "\f", 2 "def f(x):\f return x", 3 "\u2028y = 1\x1cz", 4 ...
    start, end = text.index("def"), text.index("last")
    assert text[start:end] == "def f(x):\f return x\n\u2028y = 1\x1cz\n"
    # What pygls' splitlines() positions would have selected instead:
    wrong = TextDocument(uri, text)
    p = {"line": 2, "character": 0}
    q = {"line": 4, "character": 0}
    wrong_start = wrong.offset_at_position(types.Position(**p))
    wrong_end = wrong.offset_at_position(types.Position(**q))
    assert (wrong_start, wrong_end) != (start, end)
    expected = _prompt_tokens(engine, text, start, end, uri)
    assert expected != _prompt_tokens(engine, text, wrong_start, wrong_end, uri)

    args = {"uri": uri, "version": 1, "range": {"start": p, "end": q}, "mode": "preview"}
    res = server.command("echoline.rewrite", [args], timeout=MODEL_S)
    assert "result" in res, res
    assert res["result"]["stats"]["prompt_tokens"] == expected
    assert res["result"]["edit"]["documentChanges"][0]["edits"][0]["range"] == args["range"]

    # An incremental edit after the form feed lands on the LSP line it names.
    server.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [{"range": rng(2, 9, 2, 10), "text": "  "}],  # the "\f" in line 2
        },
    )
    new_text = text.replace("):\f return", "):   return")
    start2, end2 = new_text.index("def"), new_text.index("\u2028")
    args2 = {"uri": uri, "version": 2, "range": rng(2, 0, 3, 0), "mode": "preview"}
    res2 = server.command("echoline.rewrite", [args2], timeout=MODEL_S)
    assert "result" in res2, res2
    assert res2["result"]["stats"]["prompt_tokens"] == _prompt_tokens(
        engine, new_text, start2, end2, uri
    )
    # Inline completion at the end of a line that holds a form feed is accepted.
    line2 = "def f(x):   return x"
    msg = server.request(
        "textDocument/inlineCompletion", inline_params(uri, 2, len(line2)), timeout=MODEL_S
    )
    assert "result" in msg, msg
    server.status_ok()


# ---- a UTF-8 session -------------------------------------------------------------------------


def test_utf8_session_counts_bytes(utf8_server: RawServer, root: Path, engine: Any) -> None:
    srv = utf8_server
    assert srv.init["capabilities"]["positionEncoding"] == "utf-8"
    line = f"s = 'héllo wörld {GRIN}'"
    text = line + "\nprint(s)\n"
    uri = new_uri(root, text)
    srv.open(uri, text)
    width = unit_len(line, "utf-8")
    assert width > unit_len(line, "utf-16") > len(line) - 1
    # The end of the non-ASCII line, in bytes: a valid position (UTF-16 counting refused it).
    msg = srv.request("textDocument/inlineCompletion", inline_params(uri, 0, width), MODEL_S)
    assert "result" in msg, msg
    for item in msg["result"]["items"]:
        assert item["range"]["start"] == {"line": 0, "character": width}
    err = srv.error("textDocument/inlineCompletion", inline_params(uri, 0, width + 1))
    assert err["code"] == INVALID_PARAMS and "past the end" in err["message"]
    assert "UTF-8" in err["message"]
    inside = unit_len("s = 'h", "utf-8") + 1  # the second byte of "é"
    err = srv.error("textDocument/inlineCompletion", inline_params(uri, 0, inside))
    assert err["code"] == INVALID_PARAMS and "inside a character" in err["message"]
    # A rewrite of exactly that line, range given in bytes.
    args = {"uri": uri, "version": 1, "range": rng(0, 0, 0, width), "mode": "preview"}
    res = srv.command("echoline.rewrite", [args], timeout=MODEL_S)
    assert "result" in res, res
    assert check_position(text, types.Position(line=0, character=width), "utf-8") == len(line)
    assert res["result"]["stats"]["prompt_tokens"] == _prompt_tokens(
        engine, text, 0, len(line), uri
    )
    # didChange ranges are bytes too: replace "wörld" (6 bytes) with "there".
    at = unit_len("s = 'héllo ", "utf-8")
    srv.notify(
        "textDocument/didChange",
        {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [{"range": rng(0, at, 0, at + 6), "text": "there"}],
        },
    )
    new_line = line.replace("wörld", "there")
    args2 = {
        "uri": uri,
        "version": 2,
        "range": rng(0, 0, 0, unit_len(new_line, "utf-8")),
        "mode": "preview",
    }
    res2 = srv.command("echoline.rewrite", [args2], timeout=MODEL_S)
    assert "result" in res2, res2
    new_text = new_line + "\nprint(s)\n"
    assert res2["result"]["stats"]["prompt_tokens"] == _prompt_tokens(
        engine, new_text, 0, len(new_line), uri
    )
    srv.status_ok()


# ---- lone surrogates (found by tests/test_lsp_fuzz.py) -----------------------------------------


def test_lone_surrogates_are_read_as_replacement_characters(server: RawServer, root: Path) -> None:
    """JSON may carry a lone surrogate ("\\ud800"); Python text would keep it and every
    UTF-8 encode after (index, tokenizer) failed. It is read as U+FFFD: still one UTF-16
    unit, so positions after it keep their meaning."""
    uri = new_uri(root, "")
    server.open(uri, "s = 'a\ud800b'\nt = '\udfff'\n")  # json.dumps writes "\\ud800"
    line0 = "s = 'a\ufffdb'"
    msg = server.request("textDocument/inlineCompletion", inline_params(uri, 0, len(line0)), MODEL_S)
    assert "result" in msg, msg
    err = server.error("textDocument/inlineCompletion", inline_params(uri, 0, len(line0) + 1))
    assert "past the end" in err["message"], err
    args = {"uri": uri, "version": 1, "range": rng(0, 0, 1, 0), "mode": "preview"}
    res = server.command("echoline.rewrite", [{**args, "instruction": "\udc00 fix"}], MODEL_S)
    assert "result" in res, res
    status = server.command("echoline.status", [{"uri": uri}])["result"]
    assert status["indexed"] is True, status
    assert not [m for m in server.seen if m.get("method") == "window/showMessage"], server.seen
    # An error quotes a client's value in at most ~300 characters.
    err = server.error("textDocument/inlineCompletion", inline_params("file:///" + "x" * 100_000, 0, 0))
    assert "unknown document" in err["message"] and len(err["message"]) < 500, len(err["message"])


# ---- frames of one read are served in the order they came (soak bug B) ----------------------


def _message(msg_id: int | None, method: str, params: Any) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if msg_id is not None:
        body["id"] = msg_id
    return frame(json.dumps(body).encode())


def test_a_request_is_served_against_the_text_it_was_sent_with(
    server: RawServer, root: Path, engine: Any
) -> None:
    """A request and, in the same write, a didChange/didClose of its document: the request
    sees the text it was sent with (it used to see the text after the change: a valid
    rewrite was refused as stale, a valid position as past the end)."""
    line1 = "    return x + 1"
    text = f"def f(x):\n{line1}\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    rewrite_id, inline_id = server.next_id(), server.next_id()
    rewrite = {
        "command": "echoline.rewrite",
        "arguments": [{"uri": uri, "version": 1, "range": rng(1, 0, 1, len(line1)), "mode": "preview"}],
    }
    change = {  # line 1 becomes "    ": its old end is past the end of the new line
        "textDocument": {"uri": uri, "version": 2},
        "contentChanges": [{"range": rng(1, 4, 1, len(line1)), "text": ""}],
    }
    server.write(
        _message(rewrite_id, "workspace/executeCommand", rewrite)
        + _message(inline_id, "textDocument/inlineCompletion", inline_params(uri, 1, len(line1)))
        + _message(None, "textDocument/didChange", change)
    )
    res = server.response(rewrite_id, MODEL_S)
    assert "result" in res and res["result"]["reason"] == "preview", res
    start = text.index(line1)
    assert res["result"]["stats"]["prompt_tokens"] == _prompt_tokens(
        engine, text, start, start + len(line1), uri
    )
    assert "result" in server.response(inline_id, MODEL_S)
    # The change was applied after them: now the old position is past the end, version 1 stale.
    err = server.error("textDocument/inlineCompletion", inline_params(uri, 1, len(line1)))
    assert err["code"] == INVALID_PARAMS and "past the end" in err["message"], err
    err = server.error("workspace/executeCommand", rewrite)
    assert err["code"] == -32801 and "stale version" in err["message"], err
    # A request followed by the didClose of its document.
    inline2, rewrite2 = server.next_id(), server.next_id()
    rewrite["arguments"][0] |= {"version": 2, "range": rng(1, 0, 1, 4)}
    server.write(
        _message(inline2, "textDocument/inlineCompletion", inline_params(uri, 1, 4))
        + _message(rewrite2, "workspace/executeCommand", rewrite)
        + _message(None, "textDocument/didClose", {"textDocument": {"uri": uri}})
    )
    assert "result" in server.response(inline2, MODEL_S)
    assert "result" in server.response(rewrite2, MODEL_S)
    err = server.error("textDocument/inlineCompletion", inline_params(uri, 1, 4))
    assert err["code"] == INVALID_PARAMS and "unknown document" in err["message"], err
    server.status_ok()


# ---- the future table (soak bug C) -----------------------------------------------------------


def test_notifications_and_commands_leave_no_futures_behind(server: RawServer, root: Path) -> None:
    """pygls kept one finished future per notification and per executeCommand, forever."""
    text = "x = 1\n"
    uri = new_uri(root, text)
    server.open(uri, text)
    before = server.status_ok()["pendingFutures"]
    burst = b"".join(
        _message(
            None,
            "textDocument/didChange",
            {
                "textDocument": {"uri": uri, "version": v},
                "contentChanges": [{"range": rng(0, 5, 0, 5), "text": "0"}],
            },
        )
        for v in range(2, 302)
    )
    server.write(burst)
    good = {"textDocument": {"uri": uri}, "range": rng(0, 0, 0, 1), "context": {"diagnostics": []}}
    for _ in range(20):
        server.status_ok()
        assert server.result("textDocument/codeAction", good)[0]["command"]["arguments"][0]["version"] == 301
    server.open(uri, "y = 2\n", version=400)  # an open of an open document
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    after = server.status_ok()["pendingFutures"]
    assert after == before and after <= 4, (before, after)


def test_shutdown_with_a_rewrite_in_flight(tmp_path: Path, model: Path, root: Path) -> None:
    """shutdown answered -32603 "dictionary changed size during iteration" whenever a
    request was in flight: cancelling its future removed it from the table pygls iterated."""
    srv = RawServer(tmp_path / "shutdown.err")
    try:
        srv.initialize(root, model, {})
        srv.wait_ready()
        text = "def f(x):\n    return x\n"
        uri = new_uri(root, text)
        srv.open(uri, text)
        rewrite_id, inline_id, shutdown_id = srv.next_id(), srv.next_id(), srv.next_id()
        args = {"uri": uri, "version": 1, "range": rng(0, 0, 2, 0), "mode": "apply"}
        srv.write(
            _message(rewrite_id, "workspace/executeCommand", {"command": "echoline.rewrite", "arguments": [args]})
            + _message(inline_id, "textDocument/inlineCompletion", inline_params(uri, 1, 12))
            + _message(shutdown_id, "shutdown", None)
        )
        assert srv.response(shutdown_id) == {"jsonrpc": "2.0", "id": shutdown_id, "result": None}
        for msg_id in (rewrite_id, inline_id):  # cancelled, or done just before
            msg = srv.response(msg_id)
            assert "result" in msg or msg["error"]["code"] == -32800, msg
        srv.notify("exit", None)
        assert srv.proc.stdin is not None
        srv.proc.stdin.close()
        assert srv.proc.wait(15) == 0
    finally:
        srv.close()
    log = (tmp_path / "shutdown.err").read_text(errors="replace")
    assert "Traceback" not in log and "dictionary changed size" not in log, log[-3000:]


# ---- lifecycle -------------------------------------------------------------------------------


def test_requests_before_initialize_and_after_shutdown(
    tmp_path: Path, model: Path, root: Path
) -> None:
    srv = RawServer(tmp_path / "lifecycle.err")
    try:
        err = srv.error("textDocument/inlineCompletion", inline_params("file:///x.py", 0, 0))
        assert err["code"] == NOT_INITIALIZED
        err = srv.error("workspace/executeCommand", {"command": "echoline.status"})
        assert err["code"] == NOT_INITIALIZED
        bad = srv.error("initialize", {"capabilities": "none"})
        assert bad["code"] == INVALID_PARAMS
        srv.initialize(root, model, {})
        assert srv.result("shutdown") is None
        err = srv.error("workspace/executeCommand", {"command": "echoline.status"})
        assert err["code"] == INVALID_REQUEST and "shutting down" in err["message"]
        srv.notify("exit", None)
        assert srv.proc.stdin is not None
        srv.proc.stdin.close()
        assert srv.proc.wait(15) == 0
    finally:
        srv.close()
