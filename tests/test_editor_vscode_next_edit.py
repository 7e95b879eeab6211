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
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.editor_env import MODEL, REPO, SAMPLE, free_port
from tests.test_editor_vscode import node_env, tools, vsix, wait_http  # noqa: F401 (fixtures)

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

    ext_dir, user_dir = tmp_path / "extensions", tmp_path / "user-data"
    (user_dir / "User").mkdir(parents=True)
    settings = {
        "echoline.command": [sys.executable, "-m", "tests.scripted_lsp", "--script", str(script)],
        "echoline.model": MODEL,
        "echoline.nextEdit": True,
        "echoline.nextEditDebounceMs": DEBOUNCE_MS,
        "echoline.inlineCompletions": False,
        "editor.inlineSuggest.enabled": False,
        "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
        "editor.suggestOnTriggerCharacters": False,
        "editor.autoClosingBrackets": "never",
        "workbench.startupEditor": "none",
        "workbench.secondarySideBar.defaultVisibility": "hidden",
        "chat.disableAIFeatures": True,
        "workbench.tips.enabled": False,
        "security.workspace.trust.enabled": False,
        "telemetry.telemetryLevel": "off",
        "extensions.autoCheckUpdates": False,
        "files.autoSave": "off",
    }
    (user_dir / "User" / "settings.json").write_text(json.dumps(settings, indent=2))
    env = node_env(tools)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"), XDG_DATA_HOME=str(tmp_path / "xdg-data")
    )
    cs = [tools["NODE"], tools["CODE_SERVER"]]
    common = ["--extensions-dir", str(ext_dir), "--user-data-dir", str(user_dir)]
    subprocess.run([*cs, *common, "--install-extension", str(vsix)], env=env, check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    cfg = tmp_path / "code-server.yaml"
    cfg.write_text("auth: none\ncert: false\n")
    port = free_port()
    out = tmp_path / "e2e.json"
    shot = tmp_path / "next-edit.png"
    with open(tmp_path / "code-server.log", "w") as log:
        server = subprocess.Popen(
            [*cs, "--config", str(cfg), "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
             "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
             *common, str(ws)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60)
            drive_env = dict(
                env,
                PLAYWRIGHT_CORE=str(Path(tools["NODE_TOOLS"]) / "playwright-core"),
                CHROMIUM=tools["CHROMIUM"],
                E2E_URL=f"http://127.0.0.1:{port}",
                E2E_WORKSPACE=str(ws),
                E2E_FILE=src.name,
                E2E_USER_DATA=str(user_dir),
                E2E_BROWSER_PROFILE=str(tmp_path / "chromium-profile"),
                E2E_OUT=str(out),
                E2E_SCREENSHOT=str(shot),
            )
            proc = subprocess.run([tools["NODE"], str(DRIVER)], env=drive_env, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    record = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and record.get("ok"), (
        f"{record.get('error')}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
        f"log:\n{record.get('log', '')[-4000:]}"
    )
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
