"""`echoline rewrite` (sidecar.rewrite_cli) with the real model, and `serve --tcp`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from echoline.sidecar.rewrite_cli import main

SRC = "import math\n\n\ndef scale(x, t):\n    return x * t\n\n\nprint(scale(2, 3))\n"


@pytest.mark.slow
def test_rewrite_cli_json_diff_and_file_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.py"
    f.write_text(SRC)
    rc = main([str(f), "--range", "4:5", "--instruction", "Rename the parameter t to weight.", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == "def scale(x, weight):\n    return x * weight\n"
    assert "-def scale(x, t):" in out["diff"] and "+def scale(x, weight):" in out["diff"]
    assert out["stats"]["generated_tokens"] > 0
    assert f.read_text() == SRC  # never writes the file

    rc = main([str(f), "--range", "4:5", "--diff"])  # empty instruction: reproduce exactly
    assert rc == 0
    assert capsys.readouterr().out == ""  # no change, empty diff


def test_rewrite_cli_bad_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.py"
    f.write_text(SRC)
    assert main([str(f), "--range", "7:99"]) == 2
    assert "only 8 line(s)" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.py"), "--range", "1:1"]) == 2
    assert "cannot read" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _closed_without_reply(conn: socket.socket, payload: bytes) -> bool:
    """Send ``payload``; True when the server closes the connection without a byte."""
    with conn:
        conn.sendall(payload)
        try:
            return conn.recv(65536) == b""
        except ConnectionResetError:
            return True


def test_serve_tcp_guards_then_answers_initialize(tmp_path: Path) -> None:
    """--tcp: an HTTP POST, a missing or wrong token are closed without a reply and without
    ending the server; the client with the token is served; a second connection meanwhile
    is refused; a non-loopback bind is refused without --allow-remote."""
    import os

    refused = subprocess.run([sys.executable, "-m", "echoline", "serve", "--tcp", "0.0.0.0:1"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--allow-remote" in refused.stderr
    port = _free_port()
    env = dict(os.environ, ECHOLINE_TCP_TOKEN="s3cret-token")
    proc = subprocess.Popen(
        [sys.executable, "-m", "echoline", "serve", "--tcp", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    init = _frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"processId": None, "rootUri": None, "capabilities": {}}})

    def connect() -> socket.socket:
        deadline = time.monotonic() + 20
        while True:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                assert time.monotonic() < deadline, "server never listened"
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.1)

    try:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}).encode()
        post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        assert _closed_without_reply(connect(), post)
        assert _closed_without_reply(connect(), init)  # no token
        assert _closed_without_reply(connect(), b"Echoline-Token: wrong\r\n" + init)
        assert proc.poll() is None  # none of them ended the server
        conn = connect()
        with conn:
            conn.sendall(b"Echoline-Token: s3cret-token\r\n" + init)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, rest = data.partition(b"\r\n\r\n")
            headers = dict(line.split(b":", 1) for line in head.split(b"\r\n"))
            length = int(headers[b"Content-Length"])
            while len(rest) < length:
                rest += conn.recv(65536)
            reply = json.loads(rest[:length])
            # while this client is served, another connection (even with the token) is refused
            assert _closed_without_reply(connect(), b"Echoline-Token: s3cret-token\r\n" + init)
        caps = reply["result"]["capabilities"]
        assert reply["result"]["serverInfo"]["name"] == "echoline"
        assert "echoline.rewrite" in caps["executeCommandProvider"]["commands"]
        assert caps["inlineCompletionProvider"] is not None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_version_and_stdio_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from echoline.sidecar.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"echoline {version('echoline')}"
    args = build_parser().parse_args(["serve", "--stdio"])  # editors that pass it
    assert args.stdio and args.tcp is None
    assert build_parser().parse_args(["serve", "--tcp", ":2087"]).tcp == ("127.0.0.1", 2087)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tcp", "host:notaport"])


def test_a_first_run_says_what_it_is_doing(tmp_path: Path) -> None:
    """On a fresh cache, `echoline rewrite` says it calibrates (a one-off phase) on stderr
    and prints its answer as ever."""
    from tests.synth import write_fim_qwen2_model

    model = write_fim_qwen2_model(tmp_path / "m.gguf", context=1024)
    f = tmp_path / "m.py"
    f.write_text(SRC)
    env = {**os.environ, "ECHOLINE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "echoline", "rewrite", str(f), "--range", "4:5", "--model",
           str(model), "--backend", "numpy", "--max-tokens", "4", "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "echoline: calibrating draft lengths…" in first.stderr.splitlines()
    assert "compiling kernels" not in first.stderr  # numpy has nothing to compile
    assert "text" in json.loads(first.stdout)


def test_compiled_kernels_are_known_by_their_index_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes a load say "compiling kernels (first run only)": no numba index file in
    this machine's kernel cache folder yet."""
    from echoline.engine.backends.cpu_backend import CpuBackend
    from echoline.kernels.cpu import numba_setup

    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    assert not numba_setup.has_compiled_kernels() and not CpuBackend.kernels_cached(CpuBackend.__new__(CpuBackend))
    (numba_setup.cache_root() / "__pycache__").mkdir()
    (numba_setup.cache_root() / "__pycache__" / "echoline_mm_x.kernel-1.py311.nbi").write_bytes(b"")
    assert numba_setup.has_compiled_kernels()
