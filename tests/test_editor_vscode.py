"""VS Code (code-server, VS Code 1.10x+) with the packaged .vsix, driven in headless Chromium.

The extension is compiled with tsc and packed with vsce, installed into a fresh
code-server, which is then driven by playwright-core (editors/vscode/test/e2e.cjs):
activation, a rewrite from the command palette (apply mode), an inline suggestion
shown and committed, then a rewrite in preview mode started with its keybinding
(ctrl+alt+r; diff editor, no modal, accepted with ctrl+alt+enter), the live
settings sync, the status bar menu with the model list from the server's CLI, and
the inline completions toggle, then Check Setup (the doctor's report as Markdown); the
model load's phases must reach the extension with no error popup. The assertions read the
saved file from disk. Screenshots are kept in docs/images/ (vscode-rewrite.png: the
preview; vscode-rewrite-applied.png: after apply mode; vscode-check-setup.png).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.editor_env import (
    BACKEND,
    MODEL,
    REPO,
    SAMPLE,
    ensure_tools,
    expected_rewrite,
    free_port,
    line_span,
    server_cmd,
    server_env,
)

pytestmark = [pytest.mark.editor, pytest.mark.slow]

EXT = REPO / "editors" / "vscode"
DRIVER = EXT / "test" / "e2e.cjs"
SCREENSHOT = REPO / "docs" / "images" / "vscode-rewrite.png"
MAX_TOKENS = 48


def node_env(tools: dict[str, str]) -> dict[str, str]:
    node_bin = str(Path(tools["NODE"]).parent)
    return dict(os.environ, PATH=node_bin + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture(scope="module")
def tools(smollm2_path: Path) -> dict[str, str]:
    found = ensure_tools("vscode")
    for key in ("NODE", "CODE_SERVER", "VSCE", "NODE_TOOLS", "CHROMIUM"):
        if not found.get(key) or not Path(found[key]).exists():
            pytest.skip(f"{key} missing after installation: {found}")
    return found


@pytest.fixture(scope="module")
def vsix(tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compile and package the extension exactly as a release would."""
    env = node_env(tools)
    npm = str(Path(tools["NODE"]).parent / "npm")
    if not Path(npm).exists():
        npm = shutil.which("npm") or "npm"
    if not (EXT / "node_modules" / "vscode-languageclient").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=EXT, env=env, check=True, timeout=600
        )
    subprocess.run(
        [tools["NODE"], str(EXT / "node_modules" / "typescript" / "bin" / "tsc"), "-p", "."],
        cwd=EXT,
        env=env,
        check=True,
        timeout=300,
    )
    out = tmp_path_factory.mktemp("vsix") / "echoline.vsix"
    subprocess.run(
        [tools["NODE"], tools["VSCE"], "package", "--allow-missing-repository", "-o", str(out)],
        cwd=EXT,
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert out.stat().st_size > 10_000
    return out


def wait_http(url: str, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.3)
    raise TimeoutError(url)


# What every code-server run sets: a quiet workbench that neither suggests, trusts,
# updates nor saves on its own, so the driver sees only the extension's doing.
QUIET_SETTINGS = {
    "editor.quickSuggestions": {"other": False, "comments": False, "strings": False},
    "workbench.startupEditor": "none",
    "workbench.secondarySideBar.defaultVisibility": "hidden",
    "chat.disableAIFeatures": True,
    "workbench.tips.enabled": False,
    "security.workspace.trust.enabled": False,
    "telemetry.telemetryLevel": "off",
    "extensions.autoCheckUpdates": False,
    "files.autoSave": "off",
}


def drive_code_server(
    tools: dict[str, str],
    vsix: Path,
    tmp_path: Path,
    ws: Path,
    settings: dict[str, Any],
    env: dict[str, str],
    driver: Path,
    driver_env: dict[str, str],
    timeout: float,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Install the .vsix into a fresh code-server with ``settings`` (over QUIET_SETTINGS),
    serve ``ws``, run the playwright ``driver`` against it (``driver_env`` over the
    E2E_* basics) and return the findings it saved to E2E_OUT, asserting it passed."""
    ext_dir, user_dir = tmp_path / "extensions", tmp_path / "user-data"
    (user_dir / "User").mkdir(parents=True)
    (user_dir / "User" / "settings.json").write_text(
        json.dumps({**QUIET_SETTINGS, **settings}, indent=2)
    )
    env = dict(
        env, XDG_CONFIG_HOME=str(tmp_path / "xdg-config"), XDG_DATA_HOME=str(tmp_path / "xdg-data")
    )
    cs = [tools["NODE"], tools["CODE_SERVER"]]
    common = ["--extensions-dir", str(ext_dir), "--user-data-dir", str(user_dir)]
    subprocess.run([*cs, *common, "--install-extension", str(vsix)], env=env, check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    assert any(p.name.startswith("echoline.echoline-") for p in ext_dir.iterdir())
    cfg = tmp_path / "code-server.yaml"
    cfg.write_text("auth: none\ncert: false\n")
    port = free_port()
    out = tmp_path / "e2e.json"
    with open(tmp_path / "code-server.log", "w") as log:
        server = subprocess.Popen(
            [*cs, "--config", str(cfg), "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
             "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
             *common, str(ws)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd,
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60)
            drive_env = dict(
                env,
                PLAYWRIGHT_CORE=str(Path(tools["NODE_TOOLS"]) / "playwright-core"),
                CHROMIUM=tools["CHROMIUM"],
                E2E_URL=f"http://127.0.0.1:{port}",
                E2E_WORKSPACE=str(ws),
                E2E_USER_DATA=str(user_dir),
                E2E_BROWSER_PROFILE=str(tmp_path / "chromium-profile"),
                E2E_OUT=str(out),
                **driver_env,
            )
            proc = subprocess.run([tools["NODE"], str(driver)], env=drive_env, capture_output=True,
                                  text=True, timeout=timeout)  # fmt: skip
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
    return record


def test_vscode_rewrite_and_inline_suggestion(
    tools: dict[str, str], vsix: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    src = ws / "sample.py"
    line1, line2, instruction = 1, 2, "add type hints"
    src.write_text(SAMPLE)

    settings = {
        "echoline.command": server_cmd(),
        "echoline.model": MODEL,
        "echoline.backend": BACKEND,
        "echoline.maxTokens": MAX_TOKENS,
        "echoline.rewrite.confirm": False,
        "editor.inlineSuggest.enabled": True,
        # The driver types settings.json into the JSON editor: no auto-closed braces or
        # auto-indent, or the file it saves is not valid JSON (VS Code then refuses to
        # write settings, e.g. the inline completions toggle).
        "editor.autoClosingBrackets": "never",
        "editor.autoClosingQuotes": "never",
        "editor.autoIndent": "none",
        "editor.formatOnType": False,
        "echoline.trace.server": "messages",  # LSP traffic in the log, for failures
    }
    shot = tmp_path / "vscode-rewrite.png"
    preview_shot = tmp_path / "vscode-rewrite-preview.png"
    p_line1, p_line2, p_instruction = 11, 13, "use an f-string"
    record = drive_code_server(
        tools, vsix, tmp_path, ws, settings, dict(node_env(tools), **server_env()), DRIVER,
        dict(
            E2E_FILE="sample.py",
            E2E_MODEL=MODEL,
            E2E_LINE1=str(line1),
            E2E_LINE2=str(line2),
            E2E_INSTRUCTION=instruction,
            E2E_GHOST_LINE="13",  # '    print(message)' cut back to '    print('
            E2E_GHOST_BACKSPACE="8",
            E2E_GHOST_TYPE_THROUGH="2",  # type the ghost text's first characters before Tab
            E2E_PREVIEW_LINE1=str(p_line1),
            E2E_PREVIEW_LINE2=str(p_line2),
            E2E_PREVIEW_INSTRUCTION=p_instruction,
            E2E_PREVIEW_SCREENSHOT=str(preview_shot),
            E2E_MENU="1",
            E2E_SCREENSHOT=str(shot),
            E2E_SETUP_SCREENSHOT=str(tmp_path / "setup.png"),
        ),
        timeout=900,
    )  # fmt: skip
    assert record["activated"]
    # The model load's phases reached the extension (status bar, log); no error popped up.
    assert any("loading: warming up" in line for line in record["loadLog"]), record["loadLog"]
    assert record["errorToastsAtReady"] == 0
    # the extension reported the cursor moved to the ghost line; the server warmed it there
    assert record["warmsAtGhostLine"] > 0, record["warmLog"]
    # The inline suggestion was rendered as ghost text and committed into the file.
    ghost = record["ghostText"].strip()
    assert ghost
    # Line 13 was cut back to '    print(' in the editor; committing the suggestion
    # completed it with exactly the ghost text shown.
    # Typing its first characters kept the rest on screen, right after each keystroke and
    # after the server's answer (its rest, from the store of shown suggestions).
    first = record["ghostText"].splitlines()[0]
    for step in record["typeThrough"]:
        rest = first[len(step["typed"]):].rstrip()
        assert step["now"].split("\n")[0].rstrip() == rest, (step, first)
        assert step["later"].split("\n")[0].rstrip() == rest, (step, first)
    assert len(record["typeThrough"]) == min(2, len(first) - 1)
    ghost_line = record["afterGhost"].splitlines()[12]
    assert ghost_line == "    print(" + record["ghostText"].splitlines()[0].rstrip(), (ghost_line, record["ghostText"])
    # The rewrite went through the server (apply mode) and was saved: the file equals
    # the selection replaced by an editor-free greedy run of the same rewrite.
    before = record["afterGhost"]
    want = expected_rewrite(before, src.name, line1, line2, instruction, MAX_TOKENS)
    start, end = line_span(before, line1, line2)
    assert record["afterRewrite"] == before[:start] + want + before[end:]
    assert any("applied=true" in line for line in record["rewriteLog"]), record["rewriteLog"]
    assert "tok/s" in record["progressText"], record["progressText"]
    # Preview mode: the diff showed the proposal; Accept applied it and it was saved.
    after = record["afterRewrite"]
    want2 = expected_rewrite(after, src.name, p_line1, p_line2, p_instruction, MAX_TOKENS)
    start, end = line_span(after, p_line1, p_line2)
    assert record["afterPreview"] == after[:start] + want2 + after[end:]
    if want2 == after[start:end]:  # the model proposed no change: no diff, nothing to accept
        assert record["previewOutcome"] == "no change"
        # the server's answer reached the extension: the selection handed back as it was
        unchanged = "rewrite text: " + json.dumps(after[start:end], ensure_ascii=False)
        assert any(line.endswith(unchanged) for line in record["previewLog"]), record["previewLog"]
    else:
        assert record["previewOutcome"] == "accepted"
        assert any("applied=true" in line for line in record["previewLog"]), record["previewLog"]
    if record["previewOutcome"] == "accepted":
        # Reviewed without a modal dialog: the notification names the keybindings.
        assert record["modalDialogs"] == 0
        assert "Ctrl+Alt+Enter" in record["previewNotification"], record["previewNotification"]
    # Live settings sync: keys beyond the first six reach the running server.
    assert "replyHistory=3" in record["settingsSent"], record["settingsSent"]
    assert "prefillIdleMs=300" in record["settingsSent"], record["settingsSent"]
    # The status bar menu and the model picker, filled from `echoline models list --json`.
    assert any("Pick Model" in r for r in record["menuRows"]), record["menuRows"]
    assert any("Disable Inline Completions" in r for r in record["menuRows"]), record["menuRows"]
    names = " ".join(record["modelRows"])
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2", "gemma3-270m"):
        assert name in names, record["modelRows"]
    # The toggle wrote the setting off, then on; the status bar showed it.
    assert [t["setting"] for t in record["toggle"]] == [False, True]
    assert "inline off" in record["toggle"][0]["status"], record["toggle"]
    assert "inline off" not in record["toggle"][1]["status"], record["toggle"]
    # Check Setup ran `echoline doctor --json` for the configured model and showed its checks.
    assert "Ready." in record["setupReport"] and "| ok | python |" in record["setupReport"], record["setupReport"]
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    if preview_shot.exists():
        shutil.copyfile(preview_shot, SCREENSHOT)
    shutil.copyfile(shot, SCREENSHOT.with_name("vscode-rewrite-applied.png"))
    shutil.copyfile(tmp_path / "setup.png", SCREENSHOT.with_name("vscode-check-setup.png"))
