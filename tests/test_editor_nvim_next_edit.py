"""Neovim's edit predictions in a real headless Neovim, against the scripted server.

tests/scripted_lsp.py answers ``echoline/nextEdit`` from rules (which edit after which user
edit), so the test knows what the plugin must draw and apply whatever a model would
predict. editors/nvim/tests/next_edit.lua types through the main loop (autocmds fire as
for a user): an edit, the pause, the prediction drawn as extmarks (struck-through old
text, new text as virtual text, a hint at the cursor), ``<M-n>`` jumps then applies; the
next one dismissed; an answer for another version never drawn; :EcholineNextEdit's
insertion applied with one key; a prediction the buffer moved past not applied; a cursor
move away dismisses. The assertions read the written file and the server's request log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.editor_env import REPO, SAMPLE
from tests.test_editor_nvim_units import nvim, nvim_env  # noqa: F401 (fixture)

pytestmark = [pytest.mark.editor]

SCRIPT = REPO / "editors" / "nvim" / "tests" / "next_edit.lua"
RULES = [
    {"when": "logger.info(add", "find": "print(fibonacci(10))", "replace": "logger.info(fibonacci(10))", "times": 1},
    {"when": "logger.info(fibonacci", "find": "print(message)", "replace": "logger.info(message)", "times": 1},
    {"when": "def fib(", "find": "fibonacci(n - 1)", "replace": "fib(n - 1)", "times": 1, "versionDelta": -1},
    {"when": "def fib(", "at": "cursor", "replace": "  # sum", "times": 1},
    {"when": "# sum", "at": "cursor", "replace": "!!", "times": 1},
    {"when": "# sum", "find": "def add", "replace": "def plus"},
]  # fmt: skip


def test_nvim_next_edit_drawn_jumped_accepted_and_stale_refused(
    nvim: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    src = tmp_path / "sample.py"
    src.write_text(SAMPLE)
    log = tmp_path / "server.jsonl"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"log": str(log), "model": "smollm2", "rules": RULES}))
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "tests.scripted_lsp", "--script", str(script)]
    env = nvim_env(
        tmp_path,
        ECHOLINE_TEST_FILE=str(src),
        ECHOLINE_TEST_OUT=str(out),
        ECHOLINE_TEST_CMD=json.dumps(cmd),
        ECHOLINE_TEST_PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {SCRIPT}"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)  # fmt: skip
    record = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and record.get("ok"), (
        f"{record.get('error')}\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}\n{record}"
    )
    asked = [json.loads(x) for x in log.read_text().splitlines()]
    init = next(r for r in asked if r["method"] == "initialize")["initializationOptions"]
    assert init["nextEdit"] is True and init["nextEditDebounceMs"] == 150, init
    asked = [r for r in asked if r["method"] == "echoline/nextEdit"]
    # The mapping is the documented one, in both modes; <Tab> is left alone.
    assert "predicted edit" in record["maps"]["n"] and "predicted edit" in record["maps"]["i"]
    assert not record["maps"]["tab"].startswith("echoline"), record["maps"]

    # A: drawn where it happens, with a hint at the cursor; jump, then apply.
    a = record["a"]
    assert a["drawn"]["struck"] == [{"row": 18, "col": 4, "text": "print(fibonacci(10))"}], a
    assert a["drawn"]["virt"] == [{"row": 18, "col": 24, "text": "logger.info(fibonacci(10))",
                                   "hl": "EcholineNextEditAdd"}], a  # fmt: skip
    assert len(a["drawn"]["hint"]) == 1 and a["drawn"]["hint"][0]["row"] == 17
    assert "<M-n>: edit at line 18" in a["drawn"]["hint"][0]["text"]
    assert a["jumped_to"] == [18, 4] and a["line18_after_jump"] == "    print(fibonacci(10))"
    assert a["line18"] == "    logger.info(fibonacci(10))"
    # After the new text: on its last character in Normal mode.
    assert a["cursor_after"] == [18, 4 + len("logger.info(fibonacci(10))") - 1]
    first = next(r for r in asked if r.get("rule") == 0)
    assert first["params"]["position"] == {"line": 16, "character": 14}, first  # on the last typed char

    # B: the chained prediction dismissed; the key then changed nothing.
    assert record["b"]["drawn"]["struck"][0]["row"] == 13
    assert record["b"]["after"] == {"struck": [], "virt": [], "hint": []}
    assert record["b"]["line13"] == "    print(message)"

    # C: the answer named the version before the request's: never drawn.
    stale = [r for r in asked if r.get("rule") == 2]
    assert len(stale) == 1
    assert stale[0]["result"]["textDocument"]["version"] == stale[0]["params"]["textDocument"]["version"] - 1
    assert record["c"] == {"drawn": {"struck": [], "virt": [], "hint": []}, "shown": False}

    # D: an insertion at the cursor, drawn as ghost text, applied with one key.
    d = record["d"]
    assert d["insertion"] is True and d["drawn"]["virt"][0]["hl"] == "EcholineNextEditGhost", d
    assert d["line2"] == "    return a + b  # sum"

    # E: shown, then the buffer moved on: not applied.
    assert record["e"]["drawn"]["virt"][0]["text"] == "!!"
    assert record["e"]["accepted"] is True and record["e"]["last"] == "stale"
    assert record["e"]["line2"] == "    return a + b  # sum"

    # F: dismissed by a cursor move.
    assert record["f"]["drawn"]["struck"][0]["text"] == "def add"
    assert record["f"]["after"] == {"struck": [], "virt": [], "hint": []}

    text = src.read_text().splitlines()
    assert text[0] == "def add(a, b):" and text[1] == "    return a + b  # sum"
    assert text[4] == "def fib(n):" and "fibonacci(n - 1)" in text[7]
    assert text[12] == "    print(message)"
    assert text[16:18] == ["    logger.info(add(1, 2))", "    logger.info(fibonacci(10))"]
    assert text[-1] == "# appended" and len(text) == 19
    assert not any(r.get("error") for r in asked), asked


def _server_answers_next_edit() -> bool:
    """The real server registers echoline/nextEdit (its handler lives in sidecar/server.py)."""
    return "echoline/nextEdit" in (REPO / "sidecar" / "server.py").read_text()


def _apply(lines: list[str], edits: list[dict]) -> list[str]:
    """The plugin's edits (0-based rows, byte columns) applied to ``lines``, last first."""
    data = [line.encode() for line in lines]
    text = b"\n".join(data)
    starts = [0]
    for line in data[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    for e in sorted(edits, key=lambda e: (e["srow"], e["scol"]), reverse=True):
        s = starts[e["srow"]] + e["scol"]
        end = starts[e["erow"]] + e["ecol"]
        text = text[:s] + e["text"].encode() + text[end:]
    return text.decode().split("\n")


@pytest.mark.slow
@pytest.mark.skipif(not _server_answers_next_edit(), reason="the server does not answer echoline/nextEdit yet")
def test_nvim_next_edit_with_the_real_server(
    nvim: str,  # noqa: F811
    tmp_path: Path,
    smollm2_path: Path,
) -> None:
    """Whatever the model predicts after a repeated change, the plugin gets it without
    error for the buffer's version, and the mapping applies exactly that answer."""
    from tests.editor_env import BACKEND, MODEL, server_cmd

    src = tmp_path / "sample.py"
    src.write_text(SAMPLE)
    out = tmp_path / "out.json"
    env = nvim_env(
        tmp_path,
        ECHOLINE_TEST_FILE=str(src),
        ECHOLINE_TEST_OUT=str(out),
        ECHOLINE_TEST_CMD=json.dumps(server_cmd()),
        ECHOLINE_TEST_PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        ECHOLINE_TEST_MODEL=MODEL,
        ECHOLINE_TEST_BACKEND=BACKEND,
    )
    script = REPO / "editors" / "nvim" / "tests" / "next_edit_real.lua"
    proc = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {script}"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)  # fmt: skip
    record = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and record.get("ok"), (
        f"{record.get('error')}\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}"
    )
    assert record["what"] in ("shown", "none"), record
    if record["what"] == "shown":
        assert record["pred_version"] == record["version"]
        assert record["last"] == "accepted", record
        assert record["after"] == _apply(record["before"], record["edits"]), record
    else:
        assert record["after"] == record["before"]
