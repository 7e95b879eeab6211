"""VS Code's edit predictions end to end: code-server in headless Chromium, the packaged .vsix.

The server is the scripted one (tests/scripted_lsp.py): its rules say which edit is
predicted after which user edit, so the test knows exactly what the editor must draw and
apply, whatever a model would predict. editors/vscode/test/next_edit_e2e.cjs drives it:
a prediction lines away drawn as decorations, Tab jumps then Tab accepts; the next one
dismissed with Escape (Tab then indents as usual); an answer naming another version than
the document's never shown; the palette command's insertion at the cursor accepted with
one Tab. The assertions read the saved file and the server's request log.
The screenshot of a shown prediction goes to docs/images/vscode-next-edit.png.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.editor_env import MODEL, REPO, SAMPLE
from tests.test_editor_vscode import drive_code_server, node_env, tools, vsix  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.editor, pytest.mark.slow]

DRIVER = REPO / "editors" / "vscode" / "test" / "next_edit_e2e.cjs"
SCREENSHOT = REPO / "docs" / "images" / "vscode-next-edit.png"
DEBOUNCE_MS = 250

RULES = [
    # A: after the user turns line 17's print into logger.info, the same on line 18.
    {"when": "logger.info(add", "find": "print(fibonacci(10))", "replace": "logger.info(fibonacci(10))", "times": 1},
    # B: asked after the accept: line 13 (dismissed with Escape).
    {"when": "logger.info(fibonacci", "find": "print(message)", "replace": "logger.info(message)", "times": 1},
    # C: after the user renames fibonacci's def: an answer naming another version.
    {"when": "def fib(", "find": "fibonacci(n - 1)", "replace": "fib(n - 1)", "times": 1, "versionDelta": -1},
    # D: the palette command: an insertion at the cursor.
    {"when": "def fib(", "at": "cursor", "replace": "  # sum", "times": 1},
]  # fmt: skip


def test_vscode_next_edit_shown_jumped_accepted_and_stale_refused(
    tools: dict[str, str],  # noqa: F811
    vsix: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    src = ws / "sample.py"
    src.write_text(SAMPLE)
    log_path = tmp_path / "server.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"log": str(log_path), "model": MODEL, "rules": RULES}))

    settings = {
        "echoline.command": [sys.executable, "-m", "tests.scripted_lsp", "--script", str(script)],
        "echoline.model": MODEL,
        "echoline.nextEdit": True,
        "echoline.nextEditDebounceMs": DEBOUNCE_MS,
        "echoline.inlineCompletions": False,
        "editor.inlineSuggest.enabled": False,
        "editor.suggestOnTriggerCharacters": False,
        "editor.autoClosingBrackets": "never",
    }
    env = node_env(tools)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    shot = tmp_path / "next-edit.png"
    record = drive_code_server(
        tools, vsix, tmp_path, ws, settings, env, DRIVER,
        dict(E2E_FILE=src.name, E2E_SCREENSHOT=str(shot)), timeout=600, cwd=REPO,
    )  # fmt: skip
    requests = [json.loads(x) for x in log_path.read_text().splitlines()]
    asked = [r for r in requests if r["method"] == "echoline/nextEdit"]
    # The settings reached the server the way the others do.
    init = next(r for r in requests if r["method"] == "initialize")["initializationOptions"]
    assert init["nextEdit"] is True and init["nextEditDebounceMs"] == DEBOUNCE_MS, init

    # A: the prediction drawn where it happens: the old text struck through, the new text
    # beside it, a Tab hint where the cursor is; Tab moved the cursor, Tab applied it.
    assert "decoration at 18:5-18:25" in record["shownA"], record["shownA"]
    assert "print(fibonacci(10))" in record["drawnA"]["struck"], record["drawnA"]
    lines = record["drawnA"]["lines"]
    assert any("print(fibonacci(10))logger.info(fibonacci(10))" in x for x in lines), lines
    assert any("⇥ Tab: edit at line 18" in x for x in lines), lines
    assert record["cursorBeforeJump"].startswith("Ln 17"), record["cursorBeforeJump"]
    assert record["cursorAfterJump"].startswith("Ln 18, Col 5"), record["cursorAfterJump"]
    assert record["diskAfterJump"] == SAMPLE  # the jump changed nothing
    first = next(r for r in asked if r.get("rule") == 0)
    assert first["params"]["position"] == {"line": 16, "character": 15}, first  # after "logger.info"

    # B: dismissed, nothing drawn; Tab then indented; line 13 untouched.
    assert "decoration at 13:5-13:19" in record["shownB"], record["shownB"]
    assert not record["drawnB"]["struck"], record["drawnB"]
    b_lines = record["afterB"].splitlines()
    assert b_lines[16] == "    logger.info(add(1, 2))"
    assert b_lines[17].startswith("    logger.info(fibonacci(10))") and b_lines[17][30:].strip() == ""
    assert len(b_lines[17]) > 30, "Tab did not keep its usual meaning after the dismissal"
    assert b_lines[12] == "    print(message)"

    # C: the answer named version N-1 for a request at N: dropped, never shown or applied.
    stale = [r for r in asked if r.get("rule") == 2]
    assert len(stale) == 1 and stale[0]["result"]["textDocument"]["version"] == stale[0]["params"]["textDocument"]["version"] - 1
    assert not any("next edit shown" in x for x in record["logC"]), record["logC"]
    assert "fibonacci(n - 1)" in record["afterC"] and "def fib(n):" in record["afterC"]

    # D: the insertion at the cursor, shown as ghost text, accepted with one Tab.
    assert "insertion at 2:17-2:17" in record["shownD"], record["shownD"]
    assert any(x.endswith("return a + b  # sum") for x in record["drawnD"]["lines"]), record["drawnD"]
    assert not any("jumped" in x for x in record["logD"]), record["logD"]
    d_lines = record["afterD"].splitlines()
    assert d_lines[1] == "    return a + b  # sum"
    assert record["afterD"] == record["afterC"].replace("return a + b\n", "return a + b  # sum\n", 1)
    # Every request named the version the editor had; no request was refused as stale.
    assert not any(r.get("error") for r in asked), asked
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    if shot.exists():
        SCREENSHOT.write_bytes(shot.read_bytes())
