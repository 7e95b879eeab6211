"""The echoline language server: capabilities, handlers, and the guards around pygls' transport.

Protocol (see docs/sidecar.md): ``textDocument/inlineCompletion``,
``workspace/executeCommand echoline.rewrite`` (+ a code action carrying it),
``echoline.status``, notifications ``echoline/status`` and
``echoline/rewriteProgress``, work-done ``$/progress`` for model loading and
rewrites. All engine work runs on the single worker thread (sidecar.worker);
handlers here are coroutines that await it, so the loop keeps serving.

Transport: pygls 2 reads a frame with ``read(Content-Length)`` (a header claiming
10**12 bytes is a MemoryError that ends the server), and hands every JSON object to
its converter inside ``json.loads`` (a request whose params do not structure, a
body that is not JSON or not an object, a missing ``jsonrpc``: logged, never
answered, so the client waits forever). ``FrameParser`` and
``EcholineProtocol.handle_body`` replace that path: frames are capped at
``MAX_FRAME_BYTES``, every bad frame gets an error with ``id: null`` and the reader
resynchronises on the next ``Content-Length`` header, and every request with an id
gets an answer (-32700 parse error, -32600 invalid request, -32602 invalid params,
-32601 unknown method, -32002 not initialized).

Text: a lone surrogate in a JSON string (``"\\ud800"``, which JSON allows and Unicode
text cannot hold) is read as U+FFFD, one UTF-16 unit as before; error messages quote a
client's value in at most 300 characters (``short``).

Order: ``serve`` lets each new handler run up to its first wait before it reads the
next frame, so a request sees the document as it was when the request came, whatever
didChange/didClose follows it in the same read; handlers take the text, version and
positions they need before their first ``await``. pygls' table of running handlers
(``_request_futures``) drops each entry once done, and ``shutdown`` walks a copy of it.

Positions: converted with ``sidecar.lsp_utils`` (LSP line ends only, the negotiated
``positionEncoding``), never with pygls' ``TextDocument.lines`` (``str.splitlines``).
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, get_origin

import attrs
import cattrs
import cattrs.gen
from cattrs.cols import homogenous_tuple_structure_factory
from echoline.sidecar import config as cfg
from echoline.sidecar import rewrite_request, tcp_guard
from echoline.sidecar.engine_choice import load_engine, remote_status
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.idle_prefill import IdlePrefill, rewrite_session
from echoline.sidecar.inline import HeadStarts, completion_end, inline_job
from echoline.sidecar.inline_warm import CURSOR, NOTIFY_INLINE_WARM, InlineWarm
from echoline.sidecar.lsp_utils import (
    UTF16,
    apply_change,
    checked_offset,
    find_document,
    get_doc,
    line_start,
    normalize_encoding,
    parse_position,
    plain_params,
    rest_of_line,
)
from echoline.sidecar.lsp_utils import invalid as invalid  # re-exported: error helpers
from echoline.sidecar.lsp_utils import short as short
from echoline.sidecar.progress import WorkDone, load_message
from echoline.sidecar.rewrite import run_rewrite
from echoline.sidecar.rewrite_request import RewriteArgs, RewriteProgress
from echoline.sidecar.worker import EngineWorker, Job, JobCancelled
from echoline.sidecar.workspace_index import WorkspaceIndex, normalize_uri
from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls import uris
from pygls.exceptions import JsonRpcException, JsonRpcMethodNotFound
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    JsonRPCResponseMessage,
    LanguageServerProtocol,
    default_converter,
    lsp_method,
)

log = logging.getLogger(__name__)

VERSION = "0.1.0"
CMD_REWRITE = rewrite_request.COMMAND
CMD_STATUS = "echoline.status"
NOTIFY_STATUS = "echoline/status"
NOTIFY_PREFILL = "echoline/prefill"
REQUEST_FAILED = -32803  # LSP RequestFailed
JOB_TIMEOUT_S = 600.0  # far above any generation's max_tokens at CPU speed
APPLY_EDIT_TIMEOUT_S = 30.0
CONTENT_MODIFIED = -32801  # LSP ContentModified
PARSE_ERROR = types.ErrorCodes.ParseError.value  # -32700
INVALID_REQUEST = types.ErrorCodes.InvalidRequest.value  # -32600
INVALID_PARAMS = types.ErrorCodes.InvalidParams.value  # -32602
INTERNAL_ERROR = types.ErrorCodes.InternalError.value  # -32603
SERVER_NOT_INITIALIZED = types.ErrorCodes.ServerNotInitialized.value  # -32002
PROGRESS_INTERVAL_S = 0.1  # the least time between two load-progress reports of one phase

# The largest frame body the server reads. Far above any real message (a 10 MB file
# opened with didOpen is ~10 MB of JSON), far below what would hurt the machine; a
# larger frame is refused with an error and skipped, never allocated.
MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_HEADER_LINE_BYTES = 8 * 1024  # one header line ("Content-Length: 123")
MAX_HEADERS = 32  # header lines in one frame's header block
READ_CHUNK_BYTES = 64 * 1024

_converter = get_converter()
rewrite_request.register(_converter)


def request_failed(message: str) -> JsonRpcException:
    return JsonRpcException(message, code=REQUEST_FAILED)


def _default_loader(model: str, **kwargs: Any) -> Any:
    # The engines are imported lazily there: the server answers initialize at once.
    return load_engine(model, **kwargs)


# ---- framing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameError:
    """A frame the parser could not read; the server answers it with ``id: null``."""

    code: int
    message: str


_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token
_RESYNC_TAIL = 64  # bytes kept while resynchronising: a header split across two reads


class FrameParser:
    """The LSP base protocol's framing (``Content-Length: N\\r\\n\\r\\n`` + N bytes),
    sans I/O and with bounded memory.

    Why not pygls' reader: it trusts the header (``read(10**12)`` allocates, or dies)
    and, when a header is bad, treats the body as more header lines, losing the
    frames after it. Here a bad frame (no, negative, non-numeric or too large
    ``Content-Length``, a header line that is not ``Name: value`` or too long)
    yields one ``FrameError``; the parser then drops bytes up to the next
    ``Content-Length`` header (a lying header's body included) and carries on.
    Memory: the buffer holds at most one frame (<= ``max_frame_bytes``) plus a read.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._body_len: int | None = None
        self._resync = False

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[bytes | FrameError]:
        """Every complete frame body (or error) in what was fed so far, in order."""
        while True:
            if self._resync and not self._skip_to_header():
                return
            if self._body_len is not None:
                n = self._body_len
                if len(self._buf) < n:
                    return
                body = bytes(self._buf[:n])
                del self._buf[:n]
                self._body_len = None
                yield body
                continue
            end = self._buf.find(b"\n", 0, MAX_HEADER_LINE_BYTES + 1)
            if end < 0:
                if len(self._buf) > MAX_HEADER_LINE_BYTES:
                    yield self._fail(
                        PARSE_ERROR,
                        f"a header line is longer than {MAX_HEADER_LINE_BYTES} bytes",
                        drop=1,
                    )
                    continue
                return
            line = bytes(self._buf[:end])
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line.strip():
                del self._buf[: end + 1]
                if self._headers:  # the blank line that ends a header block
                    error = self._end_of_headers()
                    if error is not None:
                        yield error
                continue  # (a stray blank line between frames is skipped)
            name, sep, value = line.partition(b":")
            if not sep or not _HEADER_NAME.fullmatch(name.strip()):
                # Drop one byte only: a Content-Length header further along this line
                # (a body without a line end, then the next frame) is found again.
                yield self._fail(PARSE_ERROR, f"malformed header line {_show(line)}", drop=1)
                continue
            del self._buf[: end + 1]
            self._headers[name.strip().lower()] = value.strip()
            if len(self._headers) > MAX_HEADERS:
                yield self._fail(PARSE_ERROR, f"more than {MAX_HEADERS} header lines")

    def _end_of_headers(self) -> FrameError | None:
        raw = self._headers.get(b"content-length")
        self._headers = {}
        if raw is None:
            return self._fail(PARSE_ERROR, "a frame without a Content-Length header")
        if not raw.isdigit():
            return self._fail(
                PARSE_ERROR,
                f"invalid Content-Length {_show(raw)}: not a non-negative integer",
            )
        if len(raw) > 18 or int(raw) > self.max_frame_bytes:
            return self._fail(
                INVALID_REQUEST,
                f"Content-Length {_show(raw)} exceeds the limit of {self.max_frame_bytes} "
                "bytes",
            )
        self._body_len = int(raw)
        return None

    def _fail(self, code: int, what: str, drop: int = 0) -> FrameError:
        """Start resynchronising; ``drop`` bytes first so the same header is not found again."""
        del self._buf[:drop]
        self._headers = {}
        self._body_len = None
        self._resync = True
        return FrameError(code, f"{what}; skipping to the next Content-Length header")

    def _skip_to_header(self) -> bool:
        m = _CONTENT_LENGTH.search(self._buf)
        if m is None:
            del self._buf[: max(0, len(self._buf) - _RESYNC_TAIL)]
            return False
        del self._buf[: m.start()]
        self._resync = False
        return True


def _show(raw: bytes, limit: int = 60) -> str:
    """A header or value for an error message: short and printable."""
    text = raw[:limit].decode("utf-8", "replace")
    return repr(text) + ("..." if len(raw) > limit else "")


# ---- messages -----------------------------------------------------------------------------


class WrongType(TypeError):
    """A JSON value of the wrong kind where lsprotocol wants a plain int, str, bool, float."""


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _strict(
    kind: str, ok: Callable[[Any], bool], exact: type, plain: cattrs.Converter
) -> Callable[[Any, Any], Any]:
    """A hook for ``exact`` that refuses other JSON kinds. The hook also receives the
    subclasses (an ``IntEnum`` is an ``int`` to cattrs' dispatch): those are built the
    way pygls' own converter (``plain``) builds them, so ``SymbolKind`` stays an enum."""

    def hook(value: Any, type_: Any) -> Any:
        if not ok(value):
            raise WrongType(f"expected {kind}, got {_json_kind(value)}")
        return value if type_ is exact else plain.structure(value, type_)

    return hook


def _is_sequence(t: Any) -> bool:
    return get_origin(t) is collections.abc.Sequence  # lsprotocol's arrays: Sequence[X]


def _strict_sequence(t: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    base = homogenous_tuple_structure_factory(t, conv)  # what cattrs does for Sequence[X]

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise WrongType(f"expected an array, got {_json_kind(value)}")
        return base(value, type_)

    return hook


def _camel(name: str) -> str:
    """lsprotocol's wire name of a field: ``text_document`` -> ``textDocument``,
    ``from_`` -> ``from`` (lsprotocol._hooks._to_camel_case)."""
    first, *rest = name.removesuffix("_").split("_")
    return first + "".join(p.title() for p in rest)


def _strict_attrs(cls: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    # lsprotocol's own hook for its classes (camelCase names), behind an object check:
    # its generated code tests ``"key" in value``, which a string or an array also
    # answers, so ``"capabilities": "none"`` would pass as an empty object.
    renames = {a.name: cattrs.gen.override(rename=_camel(a.name)) for a in attrs.fields(cls)}
    base = cattrs.gen.make_dict_structure_fn(cls, conv, **renames)

    def hook(value: Any, type_: Any) -> Any:
        if not isinstance(value, dict):
            raise WrongType(f"expected an object, got {_json_kind(value)}")
        return base(value, type_)

    return hook


def strict_converter() -> cattrs.Converter:
    """pygls' converter, with plain ``int``/``str``/``bool``/``float`` fields taken only
    from JSON values of that kind, arrays only from JSON arrays, objects only from JSON
    objects. cattrs would coerce (``int("3")``, ``str(7)``, ``bool("false") is True``,
    ``"all"`` as the array ``["a", "l", "l"]``, ``"none"`` as an empty object), so
    ``{"line": "3"}`` or ``{"uri": 7}`` would be served as if valid instead of answered
    with InvalidParams. (pygls' own message classes keep their hooks: cattrs asks
    class-specific hooks before these factories.)"""
    conv = default_converter()
    conv.register_structure_hook_factory(_is_sequence, _strict_sequence)
    conv.register_structure_hook_factory(attrs.has, _strict_attrs)

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    plain = default_converter()
    conv.register_structure_hook(int, _strict("an integer", is_int, int, plain))
    conv.register_structure_hook(
        str, _strict("a string", lambda v: isinstance(v, str), str, plain)
    )
    conv.register_structure_hook(
        bool, _strict("a boolean", lambda v: isinstance(v, bool), bool, plain)
    )
    conv.register_structure_hook(
        float, _strict("a number", lambda v: is_int(v) or isinstance(v, float), float, plain)
    )
    return conv


def _format_leaf(exc: BaseException, type_: Any) -> str:
    # lsprotocol's validators ("Position.line should be in range [0:2147483647], but was
    # -1.") and WrongType say exactly what is wrong; cattrs' default says "invalid value".
    if isinstance(exc, WrongType | ValueError) and exc.args and isinstance(exc.args[0], str):
        return exc.args[0]
    return cattrs.v.format_exception(exc, type_)


def describe_structure_error(exc: BaseException) -> str:
    """One line for a client: what was wrong, and where (``$.params.position.line``)."""
    if isinstance(exc, cattrs.BaseValidationError):
        parts = cattrs.transform_error(exc, path="$", format_exception=_format_leaf)
        text = "; ".join(parts[:4]) + ("; ..." if len(parts) > 4 else "")
    else:
        text = str(exc) or type(exc).__name__
    return text[:500]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# A "\uD800".."\uDFFF" escape: JSON lets a string hold a lone surrogate (a JavaScript
# string may, and JSON.stringify writes it so), Python text keeps it, and every later
# .encode("utf-8") (the index, the tokenizer, our own output) raises on it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_lone_surrogates(data: Any) -> Any:
    """Every lone surrogate in the strings of ``data`` (fresh from json.loads, changed in
    place) replaced by U+FFFD: one UTF-16 unit and one code point each, as the surrogate
    was, so positions keep their meaning (json.loads has already joined the valid pairs
    into one character). Iterative: a message may nest as deep as json.loads takes."""
    if isinstance(data, str):
        return _LONE_SURROGATE.sub("\ufffd", data)
    stack = [data]
    while stack:
        node = stack.pop()
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, value in items:
            if isinstance(value, str):
                value = _LONE_SURROGATE.sub("\ufffd", value)
            elif isinstance(value, list | dict):
                stack.append(value)
            if isinstance(key, str) and _LONE_SURROGATE.search(key):
                del node[key]
                key = _LONE_SURROGATE.sub("\ufffd", key)
            node[key] = value
    return data


def _valid_id(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


class EcholineProtocol(LanguageServerProtocol):
    """pygls' protocol with every request answered, LSP line ends in ``didChange``, and
    ``$/cancelRequest`` forwarded to the server so running jobs stop, not just queued ones."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before pygls' __init__, which reads every attribute (work_done_token included).
        self._ctx_work_done_token: contextvars.ContextVar[types.ProgressToken | None] = (
            contextvars.ContextVar("work_done_token", default=None))
        super().__init__(*args, **kwargs)

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        if not _valid_id(msg_id):  # lsprotocol lets any JSON value through as an id
            log.warning("$/cancelRequest with an invalid id %r: ignored", msg_id)
            return
        hook = getattr(self._server, "cancel_request", None)
        if hook is not None:
            hook(msg_id)
        super()._handle_cancel_notification(msg_id)

    # -- the future table ---------------------------------------------------------------------
    # pygls files a future in ``_request_futures`` for every handler it runs: a client
    # request's (removed when its answer is sent), but also each notification's and each
    # step of a generator handler (didOpen/didChange/didClose, executeCommand) under a fresh
    # uuid that nothing ever removes, ~2 KB per keystroke; and a request we sent that is
    # given up on (timed out) stays until an answer that never comes. Here every future
    # leaves the table once it is done.
    def _forget_when_done(self, key: Any, future: Any, sent: bool = False) -> None:
        def forget(done: Any) -> None:
            if self._request_futures.get(key) is done:
                del self._request_futures[key]
                if sent:
                    self._result_types.pop(key, None)

        future.add_done_callback(forget)

    def _execute_handler(
        self,
        msg_id: Any,
        handler: Any,
        callback: Any,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        before = self._request_futures.get(msg_id)
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        future = self._request_futures.get(msg_id)
        if future is not None and future is not before:
            self._forget_when_done(msg_id, future)

    def send_request(
        self, method: str, params: Any = None, callback: Any = None, msg_id: Any = None
    ) -> Any:
        if msg_id is None:
            msg_id = str(uuid.uuid4())
        future = super().send_request(method, params, callback, msg_id)
        self._forget_when_done(msg_id, future, sent=True)
        return future

    @property
    def work_done_token(self) -> types.ProgressToken | None:
        """The ``workDoneToken`` of the request being handled (a handler reads it before
        its first await): progress for that request goes there, not on a new token."""
        return contextvars.copy_context().get(self._ctx_work_done_token)

    def pending_futures(self) -> int:
        """Handlers running and requests to the client awaiting their answer."""
        return len(self._request_futures)

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Iterator[Any]:
        """pygls' shutdown, iterating over a copy of the future table: cancelling a
        request's future runs its done callbacks at once (answering it and removing it from
        the table), which failed the shutdown with "dictionary changed size during
        iteration" whenever a rewrite was in flight."""
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        current_id = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        self._shutdown = True
        return None

    # -- answering --------------------------------------------------------------------------
    def reply_error(self, msg_id: Any, code: int, message: str) -> None:
        """An error response. Written as a dict: lsprotocol's ResponseErrorMessage drops
        ``"id": null``, which JSON-RPC requires when the id could not be read."""
        self._send_data(
            {"jsonrpc": "2.0", "id": msg_id, "error": {"code": int(code), "message": message}}
        )

    def handle_body(self, body: bytes) -> None:
        """One frame's body: parse, check the JSON-RPC envelope, structure, dispatch."""
        try:
            data = json.loads(body, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            self.reply_error(
                None, PARSE_ERROR, f"Parse error: the message is not valid JSON ({str(exc)[:200]})"
            )
            return
        if _SURROGATE_ESCAPE.search(body):
            data = _replace_lone_surrogates(data)
        if isinstance(data, list):
            self.reply_error(
                None,
                INVALID_REQUEST,
                "Invalid request: batches (JSON arrays) are not part of the LSP; "
                "send each message in its own frame",
            )
            return
        if not isinstance(data, dict):
            self.reply_error(
                None,
                INVALID_REQUEST,
                f"Invalid request: a message is a JSON object, not {_json_kind(data)}",
            )
            return
        self.handle_object(data)

    def handle_object(self, data: dict[str, Any]) -> None:
        msg_id = data.get("id")
        reply_id = msg_id if _valid_id(msg_id) else None
        is_response = "method" not in data and ("result" in data or "error" in data)
        problem = None
        if data.get("jsonrpc") != "2.0":
            problem = f"'jsonrpc' must be \"2.0\", got {_json_kind(data.get('jsonrpc'))}"
        elif ("id" in data or is_response) and not _valid_id(msg_id):
            problem = f"'id' must be an integer or a string, got {_json_kind(msg_id)}"
        elif is_response and "result" in data and "error" in data:
            problem = "a response has 'result' or 'error', not both"
        elif not is_response and not isinstance(data.get("method"), str):
            problem = f"'method' must be a string, got {_json_kind(data.get('method'))}"
        if problem is not None:
            if is_response:  # nobody answers a response: fail whoever waits for it
                self._fail_pending(reply_id, f"malformed response: {problem}")
            else:
                self.reply_error(reply_id, INVALID_REQUEST, f"Invalid request: {problem}")
            return
        if is_response:
            self._dispatch_response(data)
            return
        method = data["method"]
        params = data.get("params")
        if "id" not in data:
            if params is not None and not isinstance(params, dict | list):
                log.warning("dropped notification %s: params is %s", method, _json_kind(params))
                return
            self._dispatch(data, None, method)
            return
        if params is not None and not isinstance(params, dict | list):
            self.reply_error(
                msg_id,
                INVALID_PARAMS,
                f"Invalid params for {method}: params must be an object or an array, "
                f"got {_json_kind(params)}",
            )
            return
        if self._shutdown and method != types.EXIT:
            self.reply_error(
                msg_id, INVALID_REQUEST, f"{method}: the server is shutting down (after shutdown)"
            )
            return
        if method != types.INITIALIZE and not self._initialized():
            self.reply_error(
                msg_id, SERVER_NOT_INITIALIZED, f"{method}: the server is not initialized yet"
            )
            return
        self._dispatch(data, msg_id, method)

    def _initialized(self) -> bool:
        try:
            self.workspace  # noqa: B018 - raises RuntimeError before initialize
        except RuntimeError:
            return False
        return True

    def _dispatch(self, data: dict[str, Any], msg_id: Any, method: str) -> None:
        """Structure a request (``msg_id`` set) or notification, then hand it to pygls."""
        default = JsonRPCNotification if msg_id is None else JsonRPCRequestMessage
        try:
            message = self._converter.structure(data, self.get_message_type(method) or default)
        except Exception as exc:
            if msg_id is None:
                log.warning("dropped notification %s: %s", method, describe_structure_error(exc))
                return
            try:
                self._get_handler(method)
            except JsonRpcMethodNotFound as err:
                self.reply_error(msg_id, err.code, err.message)
                return
            self.reply_error(
                msg_id,
                INVALID_PARAMS,
                f"Invalid params for {method}: {describe_structure_error(exc)}",
            )
            return
        # The token a client put in this request for its progress (None: none), read by
        # handlers before their first await, as pygls' msg_id is.
        self._ctx_work_done_token.set(getattr(getattr(message, "params", None), "work_done_token", None))
        try:
            self.handle_message(message)
        except Exception as exc:  # pygls answers handler errors itself; this is its own
            log.exception("could not handle %s", method)
            if msg_id is not None:
                self.reply_error(msg_id, INTERNAL_ERROR, f"{method}: internal error: {exc}")

    def _dispatch_response(self, data: dict[str, Any]) -> None:
        msg_id = data["id"]
        try:
            if "error" in data:
                message = self._converter.structure(data, types.ResponseErrorMessage)
            else:
                cls = self._result_types.pop(msg_id, None) or JsonRPCResponseMessage
                message = self._converter.structure(data, cls)
        except Exception as exc:
            self._fail_pending(msg_id, f"malformed response: {describe_structure_error(exc)}")
            return
        self.handle_message(message)

    def _fail_pending(self, msg_id: Any, message: str) -> None:
        """A response we cannot read still ends the server's wait for it (as an error)."""
        log.warning("response %r: %s", msg_id, message)
        if msg_id is not None and msg_id in self._request_futures:
            self._result_types.pop(msg_id, None)
            self._handle_response(
                msg_id, None, types.ResponseError(code=INVALID_PARAMS, message=message)
            )

    # -- document sync ----------------------------------------------------------------------
    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(
        self, params: types.DidChangeTextDocumentParams
    ) -> Iterator[Any]:
        """Apply edits over LSP lines in the negotiated encoding. pygls' own version
        indexes ``str.splitlines`` lines, so an edit below a form feed or U+2028 lands
        on the wrong line and the server's copy of the document drifts from the editor's."""
        uri = params.text_document.uri
        doc = find_document(self.workspace, uri)
        if doc is None:
            log.warning("didChange for %s, which is not open: ignored", uri)
        else:
            text = doc.source
            encoding = normalize_encoding(self.workspace.position_encoding)
            for change in params.content_changes:
                if isinstance(change, types.TextDocumentContentChangePartial):
                    text = apply_change(text, change.range, change.text, encoding)
                else:
                    text = change.text
            self.workspace.update_text_document(
                params.text_document, types.TextDocumentContentChangeWholeDocument(text=text)
            )
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None


class EcholineServer(LanguageServer):
    def __init__(self, loader: Any = None) -> None:
        super().__init__(
            "echoline",
            VERSION,
            protocol_cls=EcholineProtocol,
            converter_factory=strict_converter,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.settings = cfg.Settings()
        self.worker = EngineWorker(loader or _default_loader)
        self.index: WorkspaceIndex | None = None
        self.jobs_by_msg: dict[Any, Job] = {}
        #: Each open document's inline prompt head start (``inline_head_start``'s ``keep``):
        #: the next request keeps it where it fits, so its cached head is reused.
        self.inline_head_starts = HeadStarts()
        #: Ids of requests the client cancelled (the latest few): a rewrite whose generation
        #: had already finished when its cancel arrived must still not send its edit.
        self.cancelled_ids: collections.deque[Any] = collections.deque(maxlen=256)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.last_tok_s = 0.0
        self.last_acceptance = 0.0
        #: Bounds on waits that depend on something else going right: a job (a bug or a
        #: stuck model must not hold a request forever) and the editor's answer to
        #: workspace/applyEdit (an editor that never answers must not hold the rewrite).
        self.job_timeout_s = JOB_TIMEOUT_S
        self.apply_edit_timeout_s = APPLY_EDIT_TIMEOUT_S
        self._loaded_key: tuple | None = None
        #: The load's latest phase ("downloading 12.0 / 469.0 MiB", "compiling kernels
        #: (first run only)", ...), and the progress bars of requests waiting for it.
        self.load_message = ""
        self._load_percentage: int | None = None
        self._load_watchers: set[WorkDone] = set()
        self.idle_prefill = IdlePrefill(
            self.worker, lambda: self.settings, self._doc_text,
            lambda info: self.protocol.notify(NOTIFY_PREFILL, info),
        )
        self.inline_warm = InlineWarm(
            self.worker, lambda: self.settings, self._doc_state, lambda: self.position_encoding,
            self.inline_head_starts, lambda info: self.protocol.notify(NOTIFY_INLINE_WARM, info),
        )

    def _doc_text(self, uri: str) -> str | None:
        doc = find_document(self.workspace, uri)
        return None if doc is None else doc.source

    def _doc_state(self, uri: str) -> tuple[str, int | None] | None:
        doc = find_document(self.workspace, uri)
        return None if doc is None else (doc.source, doc.version)

    @property
    def position_encoding(self) -> str:
        """The ``positionEncoding`` agreed at initialize (pygls picks the client's first
        offered one it knows: utf-8, utf-16 or utf-32); UTF-16 before that."""
        try:
            return normalize_encoding(self.workspace.position_encoding)
        except RuntimeError:
            return UTF16

    # ---- transport ---------------------------------------------------------------------
    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve over stdio through ``FrameParser`` (pygls' reader would allocate whatever
        a ``Content-Length`` claims). Reads run on the thread pool, as pygls' do."""
        self._stop_event = threading.Event()
        stream = stdin or sys.stdin.buffer
        read = getattr(stream, "read1", stream.read)  # read1: what is there, not N bytes
        pool = self.thread_pool
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))

        def read_chunk() -> Awaitable[bytes]:
            return asyncio.get_running_loop().run_in_executor(pool, read, READ_CHUNK_BYTES)

        try:
            asyncio.run(self.serve(read_chunk))
        except BrokenPipeError:
            log.error("the client's pipe is closed; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def start_tcp(self, host: str, port: int, token: str | None = None) -> None:
        """Serve ONE client over TCP, through the same frame reader (``sidecar.tcp_guard``).

        A connection must open with the token line; one that does not, one that looks like
        HTTP, and any connection while a client is served are closed without touching the
        protocol, so they can neither drive the server nor end it. The served client's
        disconnect ends the server, as stdio's EOF does.
        """
        self._stop_event = threading.Event()
        busy = False

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal busy
            peer = writer.get_extra_info("peername")
            if busy:
                log.warning("TCP: refused %s: a client is already served", peer)
                writer.close()
                return
            if token is not None:
                try:
                    first = await asyncio.wait_for(reader.readline(), timeout=10)
                except (TimeoutError, ValueError, ConnectionError):
                    first = b""
                why = tcp_guard.check_first_line(first, token)
                if why is not None:
                    log.warning("TCP: refused %s: %s", peer, why)
                    writer.close()
                    return
            busy = True
            self.protocol.set_writer(writer)  # type: ignore[arg-type]
            await self.serve(lambda: reader.read(READ_CHUNK_BYTES))
            self.shutdown()

        async def main() -> None:
            self._server = await asyncio.start_server(connection, host, port)
            async with self._server:
                await self._server.serve_forever()

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            log.debug("TCP server stopped")

    async def serve(self, read_chunk: Callable[[], Awaitable[bytes]]) -> None:
        """Read frames until EOF (or ``exit``); a bad frame is answered and skipped."""
        parser = FrameParser()
        stop = self._stop_event
        while stop is None or not stop.is_set():
            data = await read_chunk()
            if not data:
                break
            parser.feed(data)
            for item in parser.frames():
                if isinstance(item, FrameError):
                    log.warning("bad frame: %s", item.message)
                    self.protocol.reply_error(None, item.code, item.message)
                    continue
                try:
                    self.protocol.handle_body(item)
                except BrokenPipeError:
                    raise
                except Exception:  # never let one message end the server
                    log.exception("could not handle a message")
                # A coroutine handler only starts when the loop runs it: without this,
                # every later frame of the same read (a didChange, a didClose) would be
                # applied first and the request served against text it was not sent
                # with. One loop step runs each new handler up to its first real wait;
                # handlers read the document (text, version, positions) before that.
                await asyncio.sleep(0)

    # ---- plumbing ----------------------------------------------------------------------
    def cancel_request(self, msg_id: Any) -> None:
        self.cancelled_ids.append(msg_id)
        job = self.jobs_by_msg.get(msg_id)
        if job is not None:
            job.request_cancel()

    def from_thread(self, fn: Any, *args: Any) -> None:
        """Run ``fn`` on the event loop (worker-thread callbacks must not write directly)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def supports_progress(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    def show_error(self, message: str) -> None:
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=message)
        )

    def send_status(self, message: str = "") -> None:
        st = self.worker.state
        state = {"idle": "loading", "loading": "loading"}.get(st, st)
        self.protocol.notify(
            NOTIFY_STATUS,
            {
                "state": state,
                "model": self.worker.model_label or self.settings.model,
                "message": message or (self.worker.error or ""),
                "tokS": round(self.last_tok_s, 2),
                "acceptance": round(self.last_acceptance, 4),
                **remote_status(self.worker.engine, brief=True),
            },
        )

    # ---- model -------------------------------------------------------------------------
    async def load_model(self) -> None:
        s = self.settings
        self._loaded_key = s.engine_key()
        self.load_message, self._load_percentage = "starting", None
        # Queue the load first: from here on, requests see "loading" and wait for it.
        job = self.worker.load(s.model, progress=self._load_reporter(), backend=s.backend,
                               kv_budget_bytes=s.kv_budget_bytes, cpu_activations=s.cpu_activations,
                               reply_history=s.reply_history, **s.engine_kwargs())
        bar = WorkDone(self, "echoline")
        self._load_watchers.add(bar)
        self.send_status(self.load_message)
        await bar.begin(f"Loading model {s.model}")
        t0 = time.monotonic()
        try:
            engine = await asyncio.wrap_future(job.future)
        except Exception as exc:
            msg = self.worker.error or f"could not load model {s.model!r}: {exc}"
            self._load_watchers.discard(bar)
            bar.end("failed")
            self.show_error(f"echoline: {msg}")
            self.send_status(msg)
            return
        finally:
            self.load_message = ""
        self._load_watchers.discard(bar)
        backend = engine.backend_variant if isinstance(engine, EngineLike) else "?"
        done = f"{self.worker.model_label} on {backend} in {time.monotonic() - t0:.1f}s"
        bar.end(done)
        self.send_status(done)

    def _load_reporter(self) -> Callable[[str, int, int], None]:
        """The engine's ``LoadProgress`` for this load: on the worker thread, at most every
        ``PROGRESS_INTERVAL_S`` within a phase (every new phase at once), handed to the loop."""
        last = {"phase": "", "at": 0.0}

        def progress(phase: str, done: int, total: int) -> None:  # worker thread
            now = time.monotonic()
            if phase == last["phase"] and now - last["at"] < PROGRESS_INTERVAL_S and done < total:
                return
            last.update(phase=phase, at=now)
            self.from_thread(self._load_phase, *load_message(phase, done, total))

        return progress

    def _load_phase(self, message: str, percentage: int | None) -> None:  # event loop
        if self.worker.state not in ("idle", "loading"):
            return  # a late report of a load that is over
        self.load_message, self._load_percentage = message, percentage
        for bar in list(self._load_watchers):
            bar.report(message, percentage)
        self.send_status(message)

    async def wait_for_model(self, bar: WorkDone | None = None) -> str:
        """Wait, at most ``readyTimeoutS``, while the model loads; the worker's state after
        (``ready``, ``error``, or ``loading`` on timeout). ``bar``: a begun progress of the
        waiting request, which shows the load's phases meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ready_timeout_s
        if bar is not None and self.worker.state in ("idle", "loading"):
            self._load_watchers.add(bar)
            if self.load_message:
                bar.report(self.load_message, self._load_percentage)
        try:
            while self.worker.state in ("idle", "loading") and loop.time() <= deadline:
                await asyncio.sleep(0.05)
        finally:
            if bar is not None:
                self._load_watchers.discard(bar)
        return self.worker.state

    async def engine_ready(self, bar: WorkDone | None = None) -> None:
        """Wait (bounded) for the model; a clear error when it is not there."""
        state = await self.wait_for_model(bar)
        if state in ("idle", "loading"):
            raise request_failed(
                f"echoline: model {self.settings.model!r} is still loading after "
                f"{self.settings.ready_timeout_s:.0f}s ({self.load_message or 'loading'}); "
                "try again shortly"
            )
        if state == "error":
            raise request_failed(
                f"echoline: no model available ({self.worker.error}). "
                "Fix the 'model' setting (echoline.model) and the server reloads it."
            )

    async def run_job(self, fn: Any, kind: str, key: Any = None) -> Any:
        job = self.worker.submit(fn, kind=kind, key=key)
        msg_id = self.protocol.msg_id
        if msg_id is not None:
            self.jobs_by_msg[msg_id] = job
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)),
                                          self.job_timeout_s)
        except TimeoutError:
            job.request_cancel()
            raise request_failed(f"{kind} took longer than {self.job_timeout_s:g} s; cancelled") from None
        except asyncio.CancelledError:
            job.request_cancel()
            raise
        finally:
            if msg_id is not None:
                self.jobs_by_msg.pop(msg_id, None)

    def note_stats(self, stats: dict[str, Any]) -> None:
        self.last_tok_s = float(stats.get("tokens_per_s", 0.0))
        self.last_acceptance = float(stats.get("acceptance", 0.0))

    # ---- settings ----------------------------------------------------------------------
    def apply_settings(self, raw: Any) -> None:
        new, errors = cfg.apply(self.settings, cfg.unwrap(raw))
        for err in errors:
            self.show_error(err)
        old = self.settings
        self.settings = new
        if old.prefill_on_idle and not new.prefill_on_idle:
            self.idle_prefill.stop_all()
        if old.inline_warm and not new.inline_warm:
            self.inline_warm.stop_all()
        if self.index is not None and (
            new.max_file_bytes != old.max_file_bytes or new.max_index_mb != old.max_index_mb
        ):
            self.index.max_file_bytes = new.max_file_bytes
            self.index.max_total_bytes = new.max_index_bytes
            threading.Thread(target=self.index.scan, daemon=True).start()
        if new.reply_history != old.reply_history and self._loaded_key == new.engine_key():
            # No reload: the loaded engine keeps fewer (or more) replies from now on.
            n = new.reply_history
            self.worker.submit(lambda e, _c: e.set_reply_history(n) if e is not None else None, kind="settings")
        if self._loaded_key is not None and new.engine_key() != self._loaded_key:
            self._loaded_key = new.engine_key()
            asyncio.ensure_future(self.load_model())

    # ---- workspace index ---------------------------------------------------------------
    def start_index(self) -> None:
        roots = []
        for folder in self.workspace.folders.values():
            path = uris.to_fs_path(folder.uri)
            if path:
                roots.append(path)
        if not roots and self.workspace.root_path:
            roots.append(self.workspace.root_path)
        roots = [r for r in roots if os.path.isdir(r)]
        if self.index is not None:
            self.index.stop()
        self.index = WorkspaceIndex(
            roots,
            self.worker,
            max_file_bytes=self.settings.max_file_bytes,
            max_total_bytes=self.settings.max_index_bytes,
            debounce_ms=int(os.environ.get("ECHOLINE_WATCH_DEBOUNCE_MS", "300")),
        )
        self.index.start()

    def buffer_changed(self, uri: str) -> None:
        if self.index is None:
            return
        doc = find_document(self.workspace, uri)
        if doc is not None:
            self.index.open_buffer(uri, doc.source)


# ---- handlers -----------------------------------------------------------------------------


def on_initialize(ls: EcholineServer, params: types.InitializeParams) -> None:
    ls.loop = asyncio.get_running_loop()
    ls.apply_settings(params.initialization_options)


async def on_initialized(ls: EcholineServer, params: types.InitializedParams) -> None:
    ls.loop = asyncio.get_running_loop()
    ls.start_index()
    asyncio.ensure_future(ls.load_model())


def on_shutdown(ls: EcholineServer, *args: Any) -> None:
    """Stop generating and watching; the process exits on ``exit``."""
    ls.idle_prefill.stop_all(final=True)
    ls.inline_warm.stop_all(final=True)
    for job in list(ls.jobs_by_msg.values()):
        job.request_cancel()
    if ls.index is not None:
        ls.index.stop()
    ls.worker.stop()


def on_did_open(ls: EcholineServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.inline_head_starts.opened(params.text_document.uri)
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)


def on_did_change(ls: EcholineServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.inline_head_starts.edited(params.text_document.uri, list(params.content_changes))
    ls.buffer_changed(params.text_document.uri)
    ls.idle_prefill.changed(params.text_document.uri)
    ls.inline_warm.edited(params.text_document.uri)


def on_did_close(ls: EcholineServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.idle_prefill.forget(params.text_document.uri)
    ls.inline_warm.closed(params.text_document.uri)
    ls.inline_head_starts.closed(params.text_document.uri)
    if ls.index is not None:
        ls.index.close_buffer(params.text_document.uri)


async def on_did_change_configuration(
    ls: EcholineServer, params: types.DidChangeConfigurationParams
) -> None:
    raw = cfg.unwrap(params.settings)
    if raw is None:  # pull model: ask the client for the "echoline" section
        try:
            got = await ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="echoline")])
            )
            raw = got[0] if got else None
        except Exception:
            raw = None
    ls.apply_settings(raw)


def on_did_change_folders(ls: EcholineServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
    ls.start_index()


def on_cursor(ls: EcholineServer, params: Any) -> None:
    """``echoline/cursor`` {textDocument: {uri, version?}, position}: where the editor's
    cursor rests (a notification: nothing is answered; a malformed one is logged and
    dropped). Warms that document's inline session there (``sidecar/inline_warm.py``)."""
    try:
        uri, version, pos = _cursor_params(params)
    except ValueError as exc:
        log.warning("%s dropped: %s", CURSOR, exc)
        return
    if ls.settings.inline_warm and find_document(ls.workspace, uri) is not None:
        ls.inline_warm.cursor(uri, version, pos)


def _cursor_params(params: Any) -> tuple[str, int | None, types.Position]:
    """(uri, version or None, position) of an ``echoline/cursor``; ValueError naming what
    is wrong (``PositionError`` for the position)."""
    raw = plain_params(params)
    if not isinstance(raw, dict):
        raise ValueError("params must be an object {textDocument, position}")
    doc = raw.get("textDocument")
    uri = doc.get("uri") if isinstance(doc, dict) else None
    if not isinstance(uri, str) or not uri:
        raise ValueError("textDocument.uri must be a non-empty string")
    version = doc.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ValueError("textDocument.version must be an integer")
    return uri, version, parse_position(raw.get("position"), "position")


async def on_inline_completion(
    ls: EcholineServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList:
    uri = params.text_document.uri
    doc = get_doc(ls.workspace, uri)
    pos = params.position
    encoding = ls.position_encoding
    # The text the position was sent against: a didChange while the model loads must
    # not move the cursor's offset under it.
    text, version, edits = doc.source, doc.version, ls.inline_head_starts.edits(uri)
    offset = checked_offset(text, pos, encoding, "position")
    # While the model loads (or after it failed), an empty answer, never an error: an
    # editor would show one per keystroke. The state is in echoline/status and, when the
    # request carried a workDoneToken, in its progress bar.
    bar = None
    if ls.worker.state in ("idle", "loading") and params.work_done_token is not None:
        bar = WorkDone(ls, "echoline")
        await bar.begin(ls.load_message or "loading the model", params.work_done_token)
    state = "cancelled"
    try:
        state = await ls.wait_for_model(bar)
    finally:
        if bar is not None:
            bar.end("model ready" if state == "ready" else ls.load_message or state)
    if state != "ready":
        return types.InlineCompletionList(items=[])
    prefix, suffix = text[:offset], text[offset:]
    cursor_line = text[line_start(text, offset) : offset]
    rest = rest_of_line(text, offset)
    ls.inline_warm.asked(uri, version, pos)  # a warm-up here now would only repeat this request
    job = inline_job(prefix, suffix, cursor_line, uri, ls.settings.inline_max_tokens, ls.settings.speculation,
                     ls.settings.inline_suffix_tokens, starts=ls.inline_head_starts, edits=edits)
    try:
        out = await ls.run_job(job, kind="inline", key=("inline", uri))
    except JobCancelled:
        out = None
    if out is None or out.text is None:  # superseded (or cancelled): an empty answer
        return types.InlineCompletionList(items=[])
    completion = out.text
    ls.note_stats(out.stats)
    if not completion:
        return types.InlineCompletionList(items=[])
    end = completion_end(pos, rest, completion, encoding)
    item = types.InlineCompletionItem(insert_text=completion, range=types.Range(start=pos, end=end))
    return types.InlineCompletionList(items=[item])


def on_code_action(ls: EcholineServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    rng = params.range
    if (rng.start.line, rng.start.character) == (rng.end.line, rng.end.character):
        return []
    if params.context.only and not any(
        str(k).startswith("refactor") for k in params.context.only
    ):
        return []
    doc = find_document(ls.workspace, params.text_document.uri)
    if doc is None:
        return []
    arg = {
        "uri": params.text_document.uri,
        "version": doc.version,
        "range": _converter.unstructure(rng),
        "instruction": "",
        "mode": "apply",
    }
    title = "Rewrite with echoline…"
    return [
        types.CodeAction(
            title=title,
            kind=types.CodeActionKind.RefactorRewrite,
            command=types.Command(title=title, command=CMD_REWRITE, arguments=[arg]),
        )
    ]


async def cmd_rewrite(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    """Rewrite a range: check the request, run the job with progress, then answer, preview
    or apply as ``rewrite_request.decide`` says."""
    # Read before the first await: they are this request's.
    request_id = ls.protocol.msg_id
    client_token = ls.protocol.work_done_token
    req: RewriteArgs = rewrite_request.rewrite_args(_converter, args)
    doc = get_doc(ls.workspace, req.uri)
    if doc.version != req.version:
        raise JsonRpcException(
            f"stale version: the request is for version {req.version} but {req.uri} is at "
            f"version {doc.version}; nothing was changed",
            code=CONTENT_MODIFIED,
        )
    # The text of the version checked above, whatever arrives meanwhile: everything up
    # to the first await runs before the server reads the next frame (see ``serve``).
    text = doc.source
    start = checked_offset(text, req.range.start, ls.position_encoding, "range.start")
    end = checked_offset(text, req.range.end, ls.position_encoding, "range.end")
    bar = WorkDone(ls, "echoline rewrite", cancellable=True)
    if client_token is not None:  # the client's bar: it shows the model load too
        await bar.begin(req.instruction or "reproduce selection", client_token)
    try:
        await ls.engine_ready(bar if client_token is not None else None)
    except (JsonRpcException, asyncio.CancelledError) as exc:
        bar.end("failed" if isinstance(exc, JsonRpcException) else "cancelled")
        raise
    reporter = RewriteProgress(req.uri, bar, ls.protocol.notify, ls.from_thread)
    settings = ls.settings

    def job(engine: EngineLike, cancel: threading.Event) -> Any:
        return run_rewrite(
            engine, text, start, end, req.instruction, name=req.uri,
            max_tokens=settings.max_tokens, spec=settings.speculation,
            session=rewrite_session(req.uri), on_progress=reporter.report, cancel=cancel,
        )

    # This request prefills the document's prefix itself: no idle prefill for it after.
    ls.idle_prefill.forget(req.uri)
    # The job is queued BEFORE a server-made progress is created: creating it is a round
    # trip to the client, which must not delay the first token (reports wait meanwhile).
    running = asyncio.ensure_future(ls.run_job(job, kind="rewrite"))
    try:
        if client_token is None:
            await bar.begin(req.instruction or "reproduce selection")
    except asyncio.CancelledError:
        running.cancel()
        bar.end("cancelled")
        raise
    bar.on_cancel(lambda: ls.cancel_request(request_id))  # the bar's cancel button
    try:
        outcome = await running
    except JobCancelled:
        bar.end("cancelled")
        return {"applied": False, "reason": "cancelled", "text": "", "stats": {}}
    except asyncio.CancelledError:
        running.cancel()
        bar.end("cancelled")
        raise
    except Exception as exc:
        bar.end("failed")
        raise request_failed(f"echoline: rewrite failed: {exc}") from exc
    ls.note_stats(outcome.stats)
    ls.send_status()
    current = find_document(ls.workspace, req.uri)
    verdict = rewrite_request.decide(
        finish_reason=outcome.finish_reason, mode=req.mode, max_tokens=settings.max_tokens,
        request_cancelled=request_id is not None and request_id in ls.cancelled_ids,
        version=req.version, current_version=None if current is None else current.version,
    )
    base = {"text": outcome.text, "stats": outcome.stats, "finishReason": outcome.finish_reason}
    edit = types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
        text_document=types.OptionalVersionedTextDocumentIdentifier(uri=req.uri, version=req.version),
        edits=[types.TextEdit(range=req.range, new_text=outcome.text)],
    )])
    if not verdict.apply:
        bar.end(verdict.progress)
        extra = {"edit": _converter.unstructure(edit)} if verdict.edit_in_answer else {}
        return {"applied": False, "reason": verdict.reason, **extra, **base}
    applied, reason, shown = await apply_edit(ls, edit, req.version)
    bar.end(shown)
    return {"applied": applied, "reason": reason, **base}


async def apply_edit(ls: EcholineServer, edit: types.WorkspaceEdit, version: int) -> tuple[bool, str, str]:
    """Send ``edit`` with workspace/applyEdit: (applied, reason, progress end message)."""
    try:
        resp = await asyncio.wait_for(
            ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label="echoline rewrite")),
            ls.apply_edit_timeout_s,
        )
    except TimeoutError:
        return False, (f"the editor did not answer workspace/applyEdit within {ls.apply_edit_timeout_s:g} s "
                       f"(the edit is tied to version {version}: the editor refuses it if the text "
                       "changed)"), "no answer from the editor"
    except Exception as exc:
        return False, f"workspace/applyEdit failed: {exc}", "client refused the edit"
    if resp.applied:
        return True, "applied", "applied"
    return False, resp.failure_reason or "the client did not apply the edit", "not applied"


async def cmd_status(ls: EcholineServer, *args: Any) -> dict[str, Any]:
    """Model state, settings and index figures; with {uri}, whether that file is indexed."""
    out: dict[str, Any] = {
        "state": ls.worker.state,
        "model": ls.worker.model_label or ls.settings.model,
        "error": ls.worker.error,
        "settings": cfg.as_lsp_dict(ls.settings),
        "tokS": ls.last_tok_s,
        "acceptance": ls.last_acceptance,
        "lastPrefill": ls.idle_prefill.last,
        "lastInlineWarm": ls.inline_warm.last,
    }
    engine = ls.worker.engine
    if isinstance(engine, EngineLike):
        out["backend"] = engine.backend_name
        out["variant"] = engine.backend_variant
    out.update(remote_status(engine))
    if ls.index is not None:
        out["index"] = ls.index.stats().as_dict()
        out["index"]["pendingSources"] = ls.worker.pending_sources()
        if args and isinstance(args[0], dict) and isinstance(args[0].get("uri"), str):
            uri = normalize_uri(args[0]["uri"])
            out["indexed"] = uri in ls.index.indexed_uris()
    if engine is not None:
        # Measured on the worker thread, after pending source updates are applied.
        worker = ls.worker
        try:
            src, cache = await asyncio.wait_for(
                asyncio.wrap_future(
                    worker.submit(
                        lambda e, _c: (e.source_memory_bytes(), worker.token_cache_bytes()), kind="status"
                    ).future
                ),
                ls.settings.ready_timeout_s,
            )
            out["sourceMemoryBytes"], out["tokenCacheBytes"] = src, cache
        except Exception:
            out["sourceMemoryBytes"] = out["tokenCacheBytes"] = None
    out["recentJobs"] = [job.summary() for job in list(ls.worker.finished)]
    # Handlers running + requests to the client unanswered (this command's own two
    # included): flat over a session, or something leaks (see EcholineProtocol).
    out["pendingFutures"] = ls.protocol.pending_futures()
    return out


def create_server(loader: Any = None) -> EcholineServer:
    """A fresh server with every feature registered (one per connection)."""
    ls = EcholineServer(loader)
    ls.feature(types.INITIALIZE)(on_initialize)
    ls.feature(types.INITIALIZED)(on_initialized)
    ls.feature(types.SHUTDOWN)(on_shutdown)
    ls.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_did_open)
    ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_did_change)
    ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_did_close)
    ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)(on_did_change_configuration)
    ls.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)(on_did_change_folders)
    ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())(
        on_inline_completion
    )
    ls.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]),
    )(on_code_action)
    ls.feature(CURSOR)(on_cursor)
    ls.command(CMD_REWRITE)(cmd_rewrite)
    ls.command(CMD_STATUS)(cmd_status)
    return ls


def run_stdio() -> None:
    """Serve one client over stdin/stdout (what editors spawn)."""
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "WARNING"))
    create_server().start_io()


def run_tcp(host: str = "127.0.0.1", port: int = 2087, *, allow_remote: bool = False) -> None:
    """Serve over TCP (debugging): loopback unless ``allow_remote``, one client, a token.

    The token comes from ``ECHOLINE_TCP_TOKEN``, else a random one is printed on stderr.
    """
    logging.basicConfig(level=os.environ.get("ECHOLINE_LOG", "INFO"))
    tcp_guard.check_bind(host, allow_remote)
    if allow_remote and not tcp_guard.is_loopback(host):
        log.warning("TCP: listening on %s: reachable from other machines (--allow-remote)", host)
    token, generated = tcp_guard.server_token()
    if generated:
        sys.stderr.write(f"echoline: TCP token (send 'Echoline-Token: <token>' first): {token}\n")
        sys.stderr.flush()
    create_server().start_tcp(host, port, token)
