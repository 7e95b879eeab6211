"""The scripted language server the editor tests use for edit predictions (tests/scripted_lsp.py).

The editors' e2e tests trust it to answer ``echoline/nextEdit`` with the protocol's shape and
version rules (a stale request is -32801, the answer names the request's version plus the
rule's ``versionDelta``), so check that here, over stdio, in about a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig

from tests.editor_env import REPO


def _plain(obj: Any) -> Any:
    from tests.scripted_lsp import _plain as plain

    return plain(obj)


async def test_scripted_server_answers_next_edit_by_its_rules(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"log": str(log), "rules": [
        {"find": "print(b)", "replace": "log(b)", "times": 1},
        {"find": "print(c)", "replace": "log(c)", "versionDelta": -1, "times": 1},
        {"at": "cursor", "replace": "é!"},
    ]}))  # fmt: skip
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "tests.scripted_lsp", "--script", str(script)],
        server_env={"PYTHONPATH": str(REPO)},
    )
    client = await config.start()
    status: list[Any] = []
    client.feature("echoline/status")(lambda params: status.append(_plain(params)))
    try:
        await client.initialize_session(
            types.InitializeParams(capabilities=types.ClientCapabilities(),
                                   initialization_options={"echoline": {"nextEdit": True}})
        )  # fmt: skip
        uri = (tmp_path / "a.py").as_uri()
        text = "x = 'é'\nprint(b)\nprint(c)\n"
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=3, text=text)))  # fmt: skip

        def ask(version: int) -> Any:
            return client.protocol.send_request_async("echoline/nextEdit", {
                "textDocument": {"uri": uri, "version": version},
                "position": {"line": 0, "character": 7}})  # fmt: skip

        first = _plain(await ask(3))
        assert first["textDocument"] == {"uri": uri, "version": 3} and first["id"]
        assert first["edits"] == [{"range": {"start": {"line": 1, "character": 0},
                                             "end": {"line": 1, "character": 8}}, "newText": "log(b)"}]  # fmt: skip
        second = _plain(await ask(3))  # rule 1 is used up: rule 2, with a wrong version
        assert second["textDocument"]["version"] == 2
        assert second["edits"][0]["newText"] == "log(c)"
        with pytest.raises(JsonRpcException) as err:
            await ask(2)
        assert err.value.code == -32801
        third = _plain(await ask(3))  # an insertion at the cursor (UTF-16 columns kept)
        assert second["edits"][0]["range"]["start"]["line"] == 2
        assert third["edits"][0]["range"]["start"] == {"line": 0, "character": 7}
        assert status and status[0]["state"] == "ready"
    finally:
        await client.shutdown_session()
        await client.stop()
    entries = [json.loads(x) for x in log.read_text().splitlines()]
    assert entries[0]["initializationOptions"] == {"echoline": {"nextEdit": True}}
    assert [e.get("error") for e in entries if e["method"] == "echoline/nextEdit"] == [
        None,
        None,
        "stale",
        None,
    ]
