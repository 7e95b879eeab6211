"""A scripted HTTP server on 127.0.0.1 for the remote engine's tests.

Each test installs handlers per path; a handler gets the parsed request and writes the
answer itself, byte by byte when it wants (partial chunks, stalls, a dropped connection).
Every request is recorded (path, headers, JSON body) so tests can check what was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Script:
    routes: dict[str, Callable[[Any, Request], None]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what handlers noticed ("client gone", ...)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [r.body for r in self.requests if r.path == path]

    def of(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # a body without a length ends when the connection closes
    script: Script

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        req = Request(method, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        with self.script.lock:
            self.script.requests.append(req)
        route = self.script.routes.get(self.path)
        if route is None:
            send_json(self, {"error": {"message": f"no route {self.path}"}}, status=404)
            return
        try:
            route(self, req)
        except (BrokenPipeError, ConnectionResetError):
            with self.script.lock:
                self.script.events.append("client gone")

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


def send_json(h: BaseHTTPRequestHandler, doc: Any, status: int = 200) -> None:
    data = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def start_sse(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.end_headers()
    h.wfile.flush()


def write(h: BaseHTTPRequestHandler, data: bytes, pause_s: float = 0.0) -> None:
    h.wfile.write(data)
    h.wfile.flush()
    if pause_s:
        time.sleep(pause_s)


def event(doc: Any) -> bytes:
    """One SSE event (non-ASCII kept as UTF-8, so a split can fall inside a character)."""
    text = doc if isinstance(doc, str) else json.dumps(doc, ensure_ascii=False)
    return f"data: {text}\n\n".encode()


class ScriptedServer:
    """``with ScriptedServer() as srv:`` then ``srv.url``, ``srv.script.routes[path] = fn``."""

    def __init__(self) -> None:
        self.script = Script()
        handler = type("Handler", (_Handler,), {"script": self.script})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
