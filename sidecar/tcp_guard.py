"""Who may talk to ``echoline serve --tcp``: loopback unless allowed, a token, one client.

Why: stdio is private to the editor that started the server, a TCP port is not. Any
local process, or a web page through the browser (an HTTP POST carries a body the LSP
framing would happily read), could otherwise drive the model and read the workspace
index. So the server binds loopback unless ``--allow-remote`` is given, every connection
must open with the token (``Echoline-Token: <token>``, a header line of the first frame,
so an LSP client needs only one extra header), requests that look like HTTP are dropped
at once, and a second connection is refused while a client is served.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket

TOKEN_ENV = "ECHOLINE_TCP_TOKEN"
TOKEN_HEADER = b"echoline-token:"
#: The first line a client sends is at most this long (a header line, not a body).
MAX_FIRST_LINE = 1024
_HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"OPTIONS ", b"DELETE ", b"PATCH ",
                 b"CONNECT ", b"TRACE ", b"PRI ")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) resolves only to loopback addresses."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback bind unless the user asked for it by name."""
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"--tcp {host}: this would accept connections from other machines; bind 127.0.0.1, "
            "or pass --allow-remote if that is really wanted"
        )


def server_token() -> tuple[str, bool]:
    """(token, generated): from ``ECHOLINE_TCP_TOKEN``, else a fresh random one."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given, False
    return secrets.token_urlsafe(24), True


def check_first_line(line: bytes, token: str) -> str | None:
    """Why the connection must be dropped (None: the token matches).

    ``line`` is the client's first line, ``\\r\\n`` included.
    """
    if line.startswith(_HTTP_METHODS):
        return "an HTTP request, not an LSP client"
    if not line.endswith(b"\n") or len(line) > MAX_FIRST_LINE:
        return "no token line"
    name, _, value = line.strip().partition(b":")
    if name.strip().lower() + b":" != TOKEN_HEADER:
        return f"the first line must be '{TOKEN_HEADER.decode().title()} <token>'"
    if not hmac.compare_digest(value.strip(), token.encode()):
        return "wrong token"
    return None
