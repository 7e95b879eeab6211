"""A scripted language server for the editor tests: answers ``echoline/nextEdit`` from rules.

Why: the editors' edit-prediction UI (show, jump, accept, refuse a stale version) must be
tested end to end in a real editor without depending on what a model predicts. This
server speaks real LSP over stdio (pygls), keeps the documents the editor syncs, and
answers ``echoline/nextEdit`` from a JSON script, so the test knows the exact edit the
editor should show and apply. It checks versions the way the real server does (-32801
ContentModified for a stale request) and records every request and setting in a JSONL
log the test reads.

    python -m tests.scripted_lsp --script SCRIPT.json

The script: ``{"log": PATH, "model": NAME, "rules": [RULE, ...]}``. A request takes the
first rule whose ``find`` occurs in the document (or, with ``"at": "cursor"``, any rule
with ``at``), while its ``times`` (default unlimited) last. A rule answers:

- ``find`` → ``replace``: one edit replacing the first occurrence of ``find``;
- ``"at": "cursor"``: one insertion of ``replace`` at the request's position;
- ``when``: the rule applies only while the document contains this text;
- ``versionDelta`` (default 0): added to the version in the answer (a wrong version that
  the editor must refuse); ``delayMs``: wait before answering (the editor may have moved
  on: the answer then names an older version).

No rule: ``{"edits": []}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer

CONTENT_MODIFIED = -32801
INVALID_PARAMS = -32602


def _plain(obj: Any) -> Any:
    """Params of a custom method as plain JSON data (pygls gives attribute objects)."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return [_plain(v) for v in obj]
    if hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if hasattr(obj, "__dict__"):
        return {k: _plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return obj


def utf16_position(text: str, offset: int) -> dict[str, int]:
    """LSP position (UTF-16 code units) of a character offset in ``text``."""
    before = text[:offset]
    line = before.count("\n")
    col_text = before[before.rfind("\n") + 1 :]
    return {"line": line, "character": len(col_text.encode("utf-16-le")) // 2}


class Scripted:
    """The script, its remaining uses per rule, and the request log."""

    def __init__(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self.rules: list[dict[str, Any]] = list(doc.get("rules", []))
        self.used = [0] * len(self.rules)
        self.model = str(doc.get("model", "scripted"))
        self.log_path = Path(doc["log"]) if doc.get("log") else None
        self.lock = threading.Lock()
        self.count = 0

    def record(self, entry: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        with self.lock, self.log_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def pick(self, text: str) -> tuple[int, dict[str, Any]] | None:
        for i, rule in enumerate(self.rules):
            times = rule.get("times")
            if times is not None and self.used[i] >= int(times):
                continue
            if rule.get("when") and str(rule["when"]) not in text:
                continue
            if rule.get("at") == "cursor" or str(rule.get("find", "")) and rule["find"] in text:
                self.used[i] += 1
                return i, rule
        return None


def build(script: Scripted) -> LanguageServer:
    server = LanguageServer("echoline-scripted", "0")

    @server.feature(types.INITIALIZED)
    def initialized(ls: LanguageServer, _params: types.InitializedParams) -> None:
        ls.protocol.notify("echoline/status", {"state": "ready", "model": script.model})

    @server.feature(types.INITIALIZE)
    def initialize(_ls: LanguageServer, params: types.InitializeParams) -> None:
        script.record(
            {"method": "initialize", "initializationOptions": _plain(params.initialization_options)}
        )

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(
        _ls: LanguageServer, params: types.DidChangeConfigurationParams
    ) -> None:
        script.record(
            {"method": "workspace/didChangeConfiguration", "settings": _plain(params.settings)}
        )

    @server.feature("echoline/cursor")
    def cursor(_ls: LanguageServer, _params: Any) -> None:
        return None

    @server.feature("echoline/nextEdit")
    async def next_edit(ls: LanguageServer, params: Any) -> dict[str, Any]:
        p = _plain(params)
        uri = p["textDocument"]["uri"]
        version = p["textDocument"]["version"]
        doc = ls.workspace.text_documents.get(uri)
        entry: dict[str, Any] = {"method": "echoline/nextEdit", "params": p}
        if doc is None:
            script.record({**entry, "error": "unknown document"})
            raise JsonRpcException(f"unknown document {uri}", code=INVALID_PARAMS)
        if doc.version != version:
            script.record({**entry, "error": "stale", "docVersion": doc.version})
            raise JsonRpcException(
                f"stale version: request {version}, document {doc.version}", code=CONTENT_MODIFIED
            )
        text = doc.source
        script.count += 1
        answer: dict[str, Any] = {"textDocument": {"uri": uri, "version": version}, "edits": [],
                                  "id": f"scripted-{script.count}"}  # fmt: skip
        picked = script.pick(text)
        if picked is not None:
            index, rule = picked
            if rule.get("at") == "cursor":
                pos = p["position"]
                rng = {"start": pos, "end": pos}
            else:
                start = text.index(rule["find"])
                end = start + len(rule["find"])
                rng = {"start": utf16_position(text, start), "end": utf16_position(text, end)}
            answer["edits"] = [{"range": rng, "newText": str(rule.get("replace", ""))}]
            answer["textDocument"]["version"] = version + int(rule.get("versionDelta", 0))
            entry["rule"] = index
            if rule.get("delayMs"):
                await asyncio.sleep(float(rule["delayMs"]) / 1000)
        script.record({**entry, "result": answer})
        return answer

    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", required=True, type=Path)
    args = ap.parse_args(argv)
    build(Scripted(args.script)).start_io()


if __name__ == "__main__":
    main()
