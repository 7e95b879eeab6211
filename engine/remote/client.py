"""A small HTTP client for an OpenAI-style inference server: JSON calls and SSE streams.

Why the standard library (``http.client``), not a client package: the remote engine needs
four things — a JSON POST/GET, a streamed POST read as server-sent events, a bounded wait
for every read, and a cancel that interrupts a read blocked in another thread — and all
four fit in this module without a new dependency for every echoline user.

Cancellation closes the connection: a watcher shuts the socket down when the caller's
event is set, so a read blocked on a server that is thinking (or hung) returns at once.
Servers take a closed stream as the end of the request (llama-server and vLLM abort the
generation when the client goes away).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from echoline.engine.errors import EcholineError

#: How much of a server's error body an error message quotes.
QUOTE_CHARS = 300
READ_CHUNK = 16 * 1024
CANCEL_POLL_S = 0.02  # how often the watcher looks at the cancel flag


class RemoteError(EcholineError):
    """The server could not be reached, answered with an error, or broke a stream."""


class RemoteTimeout(RemoteError):
    """The server sent nothing for longer than the read timeout."""


class StreamCancelled(RemoteError):
    """The caller's cancel flag was set; the connection was closed."""


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: ``http(s)://host:port/base`` split once."""

    scheme: str
    host: str
    port: int
    base: str  # path prefix without a trailing slash ("" or "/v1-proxy")

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteError(f"endpoint must be an http:// or https:// URL with a host, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):  # users paste the OpenAI base URL; paths here name /v1 themselves
            base = base[: -len("/v1")]
        return cls(parts.scheme, parts.hostname, port, base)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base}"


def _quote(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("message", doc.get("detail")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            text = str(err)
    return text[:QUOTE_CHARS]


class HttpClient:
    """JSON and SSE calls to one endpoint. Thread-safe: each call opens its own connection.

    ``read_timeout_s`` bounds every wait for bytes (not the whole reply): a server that
    stops sending for that long is reported as hung, however long the reply is.
    """

    def __init__(self, url: str, *, api_key: str | None = None, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 60.0, headers: dict[str, str] | None = None) -> None:
        self.endpoint = Endpoint.parse(url)
        self.api_key = api_key
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.headers = dict(headers or {})

    # ---- connections ---------------------------------------------------------------------
    def _connect(self) -> http.client.HTTPConnection:
        ep = self.endpoint
        if ep.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                ep.host, ep.port, timeout=self.connect_timeout_s, context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(ep.host, ep.port, timeout=self.connect_timeout_s)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise RemoteError(f"cannot reach {ep.url}: {exc}") from None
        conn.sock.settimeout(self.read_timeout_s)
        return conn

    def _headers(self, extra: dict[str, str] | None, accept: str) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": accept, **self.headers, **(extra or {})}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _send(self, conn: http.client.HTTPConnection, method: str, path: str, body: Any,
              headers: dict[str, str]) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.request(method, self.endpoint.base + path, body=data, headers=headers)
            return conn.getresponse()
        except TimeoutError:
            raise RemoteTimeout(f"{self.endpoint.url}{path}: no answer within {self.read_timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise RemoteError(f"{self.endpoint.url}{path}: {exc}") from None

    # ---- JSON ----------------------------------------------------------------------------
    def request_json(self, method: str, path: str, body: Any = None, *,
                     headers: dict[str, str] | None = None, cancel: threading.Event | None = None) -> Any:
        """One request, the JSON reply; an HTTP error status raises with the server's message.

        A set ``cancel`` closes the connection (``StreamCancelled``): an idle prefill of a
        long prompt must give way to the user's request at once."""
        with self._watched(cancel) as conn:
            resp = self._send(conn, method, path, body, self._headers(headers, "application/json"))
            try:
                raw = resp.read()
            except TimeoutError:
                raise RemoteTimeout(f"{self.endpoint.url}{path}: reply stalled for {self.read_timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as exc:
                raise RemoteError(f"{self.endpoint.url}{path}: {exc}") from None
            if resp.status >= 400:
                raise RemoteError(f"{self.endpoint.url}{path}: HTTP {resp.status}: {_quote(raw)}")
            try:
                return json.loads(raw) if raw.strip() else None
            except ValueError:
                raise RemoteError(f"{self.endpoint.url}{path}: reply is not JSON: {_quote(raw)}") from None

    @contextlib.contextmanager
    def _watched(self, cancel: threading.Event | None) -> Iterator[http.client.HTTPConnection]:
        """A connection that a set ``cancel`` shuts down from a watcher thread (a blocked read
        then returns at once); a ``RemoteError`` raised after cancel becomes ``StreamCancelled``,
        and the connection is closed however the block ends."""
        conn = self._connect()
        done = threading.Event()
        watcher = _watch(conn, cancel, done)
        try:
            yield conn
        except StreamCancelled:
            raise
        except RemoteError:
            if cancel is not None and cancel.is_set():
                raise StreamCancelled("cancelled") from None
            raise
        finally:
            done.set()
            _shutdown(conn)
            if watcher is not None:
                watcher.join()

    def post_json(self, path: str, body: Any, *, headers: dict[str, str] | None = None,
                  cancel: threading.Event | None = None) -> Any:
        return self.request_json("POST", path, body, headers=headers, cancel=cancel)

    def get_json(self, path: str) -> Any:
        return self.request_json("GET", path)

    # ---- streams -------------------------------------------------------------------------
    def stream(self, path: str, body: Any, *, headers: dict[str, str] | None = None,
               cancel: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """POST ``body`` and yield each server-sent event's JSON payload until ``[DONE]``.

        Bytes are split into lines before any decoding, so a chunk boundary inside a
        line or inside a UTF-8 character is harmless. The stream ends cleanly only on
        ``data: [DONE]`` or on an event whose choice carries a ``finish_reason`` followed
        by the end of the body; any other end raises ``RemoteError`` (the server went away
        mid-reply). A set ``cancel`` closes the connection and raises ``StreamCancelled``;
        so does closing the generator early (the caller's own stop rules).
        """
        finished = False
        with self._watched(cancel) as conn:
            resp = self._send(conn, "POST", path, body, self._headers(headers, "text/event-stream"))
            if resp.status >= 400:
                raise RemoteError(f"{self.endpoint.url}{path}: HTTP {resp.status}: {_quote(_read_all(resp))}")
            for event in _sse_events(resp, cancel, self.read_timeout_s, self.endpoint.url + path):
                if event == "[DONE]":
                    return
                try:
                    doc = json.loads(event)
                except ValueError:
                    raise RemoteError(f"{self.endpoint.url}{path}: event is not JSON: {event[:QUOTE_CHARS]!r}") from None
                if isinstance(doc, dict) and "error" in doc and "choices" not in doc:
                    raise RemoteError(f"{self.endpoint.url}{path}: {_quote(event.encode())}")
                if _finished(doc):
                    finished = True
                yield doc
            if not finished:
                raise RemoteError(f"{self.endpoint.url}{path}: the stream ended before the reply did "
                                  "(server closed the connection)")


def _finished(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    choices = doc.get("choices")
    if isinstance(choices, list):
        return any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
    return bool(doc.get("stop"))  # llama-server's native /completion stream


def _read_all(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read()
    except (OSError, http.client.HTTPException):
        return b""


def _shut_socket(conn: http.client.HTTPConnection) -> None:
    """Shut the connection's socket both ways (a read blocked on it returns at once)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _shutdown(conn: http.client.HTTPConnection) -> None:
    _shut_socket(conn)
    conn.close()


def _watch(conn: http.client.HTTPConnection, cancel: threading.Event | None,
           done: threading.Event) -> threading.Thread | None:
    if cancel is None:
        return None
    watcher = threading.Thread(target=_close_on_cancel, args=(conn, cancel, done),
                               name="echoline-remote-cancel", daemon=True)
    watcher.start()
    return watcher


def _close_on_cancel(conn: http.client.HTTPConnection, cancel: threading.Event, done: threading.Event) -> None:
    """Shut the socket down as soon as ``cancel`` is set, so a blocked read returns."""
    while not done.is_set():
        if cancel.wait(CANCEL_POLL_S):
            if not done.is_set():
                _shut_socket(conn)
            return


def _sse_events(resp: http.client.HTTPResponse, cancel: threading.Event | None, timeout_s: float,
                where: str) -> Iterator[str]:
    """The ``data`` of each event (several ``data:`` lines joined by newlines)."""
    buf = b""
    data: list[bytes] = []
    while True:
        if cancel is not None and cancel.is_set():
            raise StreamCancelled("cancelled")
        try:
            chunk = resp.read1(READ_CHUNK)
        except TimeoutError:
            raise RemoteTimeout(f"{where}: no data for {timeout_s:g} s (server hung?)") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cancel is not None and cancel.is_set():
                raise StreamCancelled("cancelled") from None
            raise RemoteError(f"{where}: connection lost mid-stream: {exc}") from None
        if not chunk:
            if cancel is not None and cancel.is_set():
                raise StreamCancelled("cancelled")
            if data:  # a last event without its blank line
                yield b"\n".join(data).decode("utf-8", errors="replace")
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if not line:
                if data:
                    yield b"\n".join(data).decode("utf-8", errors="replace")
                    data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"error:"):  # llama-server names an error event this way
                raise RemoteError(f"{where}: {_quote(line[6:].strip())}")
            # other fields (event:, id:, retry:, ": comment") carry nothing the engine uses
