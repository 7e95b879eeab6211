"""Edit predictions over stdio (the real server, smollm2: the shapes do not depend on the
model): ``textDocument/copilotInlineEdit`` as copilot-lsp sends and reads it,
``echoline/nextEdit``, stale versions, unknown documents and bad positions, supersession by
an edit, ``$/cancelRequest``, secret files, and the NES client notifications."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from echoline.sidecar.lsp_utils import plain_params
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.protocol import JsonRPCProtocol
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SRC = "".join(f"def f{i}(x):\n    print('value', x)\n    return x + {i}\n\n" for i in range(6))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from echoline.engine.model_catalog import resolve_model

    resolve_model("smollm2")
    root = tmp_path_factory.mktemp("ws-ne")
    (root / ".env").write_text("API_KEY=1\n")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lsp(workspace: Path):
    client = await ClientServerConfig(server_command=[sys.executable, "-m", "echoline", "serve"]).start()
    ready = asyncio.Event()

    @client.feature("echoline/status")
    def _status(params: Any) -> None:
        if plain_params(params).get("state") in ("ready", "error"):
            ready.set()

    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(),
        root_uri=workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
        initialization_options={"echoline": {"model": "smollm2", "nextEdit": True, "nextEditDebounceMs": 300,
                                             "nextEditRegionLines": 4, "nextEditPredictor": "model"}},
    ))
    await asyncio.wait_for(ready.wait(), 900)  # a hang guard: loads crawl on a busy machine
    yield client
    await client.shutdown_session()
    await client.stop()


_n = iter(range(1, 1000))


def open_doc(client: LanguageClient, root: Path, text: str, name: str | None = None) -> str:
    path = root / (name or f"m{next(_n)}.py")
    path.write_text(text)
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1, text=text)))
    return path.as_uri()


def change(client: LanguageClient, uri: str, version: int, line: int, c1: int, c2: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=line, character=c1),
                              end=types.Position(line=line, character=c2)), text=text)]))


def params(uri: str, version: int | None, line: int, ch: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"uri": uri}
    if version is not None:
        doc["version"] = version
    return {"textDocument": doc, "position": {"line": line, "character": ch}}


async def ask(client: LanguageClient, method: str, p: Any, msg_id: Any = None) -> dict[str, Any]:
    res = await asyncio.wait_for(client.protocol.send_request_async(method, p, msg_id=msg_id), 300)
    return plain_params(res)


def send_now(client: LanguageClient, method: str, p: dict[str, Any], msg_id: Any = None) -> Any:
    """Send a request NOW (pygls' own call; pytest-lsp's wrapper sends when first awaited),
    so that what the test sends next follows it."""
    return JsonRPCProtocol.send_request_async(client.protocol, method, p, msg_id=msg_id)


def _plain(x: Any) -> Any:
    x = plain_params(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


async def test_request_shapes_of_both_methods(lsp: LanguageClient, workspace: Path) -> None:
    uri = open_doc(lsp, workspace, SRC)
    change(lsp, uri, 2, 1, 4, 9, "log.info")  # print( -> log.info( in f0
    # copilot-lsp: make_position_params(0, "utf-16") + textDocument.version
    got = _plain(await ask(lsp, "textDocument/copilotInlineEdit", params(uri, 2, 1, 12)))
    assert set(got) == {"edits"} and isinstance(got["edits"], list)
    for e in got["edits"]:
        assert set(e) <= {"range", "text", "textDocument", "command"} and {"range", "text", "textDocument"} <= set(e)
        assert e["textDocument"] == {"uri": uri, "version": 2}
        assert set(e["range"]) == {"start", "end"} and isinstance(e["text"], str)
    ne = _plain(await ask(lsp, "echoline/nextEdit", params(uri, 2, 1, 12)))
    assert ne["textDocument"] == {"uri": uri, "version": 2} and isinstance(ne["id"], str) and ne["id"]
    assert isinstance(ne["edits"], list)
    for e in ne["edits"]:
        assert set(e) == {"range", "newText"}
    assert ne["reason"] not in ("disabled", "model not ready")
    # the client's notifications are accepted (no error, the server keeps serving)
    lsp.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": None}})
    lsp.protocol.notify("textDocument/didFocus", {"textDocument": {"uri": uri}})
    again = _plain(await ask(lsp, "textDocument/copilotInlineEdit", params(uri, 2, 1, 12)))
    assert isinstance(again["edits"], list)


async def test_stale_unknown_and_bad_position(lsp: LanguageClient, workspace: Path) -> None:
    uri = open_doc(lsp, workspace, SRC)
    change(lsp, uri, 2, 1, 4, 9, "log.info")
    for method in ("echoline/nextEdit", "textDocument/copilotInlineEdit"):
        with pytest.raises(JsonRpcException) as err:
            await ask(lsp, method, params(uri, 1, 1, 0))
        assert err.value.code == -32801 and "stale version" in str(err.value)
        with pytest.raises(JsonRpcException) as err:
            await ask(lsp, method, params(uri + "-nope", None, 0, 0))
        assert err.value.code != 0
        with pytest.raises(JsonRpcException) as err:
            await ask(lsp, method, params(uri, 2, 999, 0))
        assert "position" in str(err.value)
        with pytest.raises(JsonRpcException):
            await ask(lsp, method, {"textDocument": {"uri": 5}})
    ok = _plain(await ask(lsp, "echoline/nextEdit", params(uri, 2, 1, 0)))  # still serving
    assert ok["textDocument"]["version"] == 2


async def test_an_edit_supersedes_the_prediction(lsp: LanguageClient, workspace: Path) -> None:
    uri = open_doc(lsp, workspace, SRC)
    change(lsp, uri, 2, 1, 4, 9, "log.info")
    # sent now (not when a task first runs), so the change below follows them
    ne = send_now(lsp, "echoline/nextEdit", params(uri, 2, 1, 12))
    cp = send_now(lsp, "textDocument/copilotInlineEdit", params(uri, 2, 1, 12))
    change(lsp, uri, 3, 5, 4, 9, "log.info")  # within the debounce: both are for older text
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(ne, 300)
    assert err.value.code == -32801
    assert _plain(await asyncio.wait_for(cp, 300)) == {"edits": []}


async def test_cancel_request(lsp: LanguageClient, workspace: Path) -> None:
    uri = open_doc(lsp, workspace, SRC)
    change(lsp, uri, 2, 1, 4, 9, "log.info")
    fut = send_now(lsp, "echoline/nextEdit", params(uri, 2, 1, 12), msg_id="ne-cancel")
    lsp.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="ne-cancel"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(fut, 300)
    assert err.value.code == -32800  # RequestCancelled
    ok = _plain(await ask(lsp, "echoline/nextEdit", params(uri, 2, 1, 12)))
    assert ok["textDocument"]["version"] == 2


async def test_secret_file_gets_no_prediction(lsp: LanguageClient, workspace: Path) -> None:
    uri = open_doc(lsp, workspace, "API_KEY=1\nOTHER=2\n", name=".env")
    change(lsp, uri, 2, 0, 8, 9, "2")
    got = _plain(await ask(lsp, "echoline/nextEdit", params(uri, 2, 0, 9)))
    assert got["edits"] == [] and got["reason"] == "secret file"


async def test_repeat_predictor_answers_without_the_model(lsp: LanguageClient, workspace: Path) -> None:
    """The default predictor: the user's change (print -> log.info in f0) proposed at its next
    place (f1's print, three lines down) at once, with no model job; once every place is
    done, no edit."""
    lsp.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"echoline": {"nextEditPredictor": "repeat"}}))
    try:
        uri = open_doc(lsp, workspace, SRC)
        change(lsp, uri, 2, 1, 4, 9, "log.info")
        before = _plain(await ask(lsp, "workspace/executeCommand", types.ExecuteCommandParams(command="echoline.status")))
        got = _plain(await ask(lsp, "echoline/nextEdit", params(uri, 2, 1, 12)))
        assert got["reason"] == "repeats the last edit"
        assert got["edits"] == [{"range": {"start": {"line": 5, "character": 4}, "end": {"line": 5, "character": 9}},
                                 "newText": "log.info"}]
        after = _plain(await ask(lsp, "workspace/executeCommand", types.ExecuteCommandParams(command="echoline.status")))
        assert after.get("recentJobs") == before.get("recentJobs")  # no model run
        cp = _plain(await ask(lsp, "textDocument/copilotInlineEdit", params(uri, 2, 1, 12)))
        assert [e["text"] for e in cp["edits"]] == ["log.info"]
        lines = SRC.split("\n")
        v = 2
        for i, line in enumerate(lines):  # the user takes every place: nothing left to repeat
            if "print(" in line and i != 1:
                v += 1
                change(lsp, uri, v, i, 4, 9, "log.info")
        done = _plain(await ask(lsp, "echoline/nextEdit", params(uri, v, 21, 12)))
        assert done["edits"] == [] and done["reason"] == "no place repeats the last edit"
    finally:
        lsp.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"echoline": {"nextEditPredictor": "model"}}))
