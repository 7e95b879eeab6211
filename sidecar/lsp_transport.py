"""The LSP transport under pygls: frames, a strict converter, and a protocol class that
answers every request.

Why its own module: pygls 2 reads a frame with ``read(Content-Length)`` (a header claiming
10**12 bytes is a MemoryError that ends the server), and hands every JSON object to its
converter inside ``json.loads`` (a request whose params do not structure, a body that is not
JSON or not an object, a missing ``jsonrpc``: logged, never answered, so the client waits
forever). ``FrameParser`` and ``EcholineProtocol.handle_body`` replace that path: frames are
capped at ``MAX_FRAME_BYTES``, every bad frame gets an error with ``id: null`` and the reader
resynchronises on the next ``Content-Length`` header, and every request with an id gets an
answer (-32700 parse error, -32600 invalid request, -32602 invalid params, -32601 unknown
method, -32002 not initialized). None of it knows what echoline's handlers do.

Text: a lone surrogate in a JSON string (``"\\ud800"``, which JSON allows and Unicode text
cannot hold) is read as U+FFFD, one UTF-16 unit as before.
"""

from __future__ import annotations

import collections.abc
import contextvars
import json
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, get_origin

import attrs
import cattrs
import cattrs.gen
from cattrs.cols import homogenous_tuple_structure_factory
from echoline.sidecar.lsp_utils import apply_change, find_document, normalize_encoding
from lsprotocol import types
from pygls.exceptions import JsonRpcMethodNotFound
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    JsonRPCResponseMessage,
    LanguageServerProtocol,
    default_converter,
    lsp_method,
)

log = logging.getLogger(__name__)

PARSE_ERROR = types.ErrorCodes.ParseError.value  # -32700
INVALID_REQUEST = types.ErrorCodes.InvalidRequest.value  # -32600
INVALID_PARAMS = types.ErrorCodes.InvalidParams.value  # -32602
INTERNAL_ERROR = types.ErrorCodes.InternalError.value  # -32603
SERVER_NOT_INITIALIZED = types.ErrorCodes.ServerNotInitialized.value  # -32002

# The largest frame body the server reads. Far above any real message (a 10 MB file
# opened with didOpen is ~10 MB of JSON), far below what would hurt the machine; a
# larger frame is refused with an error and skipped, never allocated.
MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_HEADER_LINE_BYTES = 8 * 1024  # one header line ("Content-Length: 123")
MAX_HEADERS = 32  # header lines in one frame's header block
READ_CHUNK_BYTES = 64 * 1024


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
