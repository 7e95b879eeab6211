"""VS Code's first-run help, checked without an editor (as tests/test_editor_static.py does):
the "Check Setup" command and the report it reads, the walkthrough, the icon and the
Marketplace metadata."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from echoline.sidecar.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
VSCODE = REPO / "editors" / "vscode"
PKG = json.loads((VSCODE / "package.json").read_text())
SETUP_TS = (VSCODE / "src" / "setup.ts").read_text()
CONFIG_TS = (VSCODE / "src" / "config.ts").read_text()
COMMANDS = {c["command"] for c in PKG["contributes"]["commands"]}


def test_check_setup_runs_the_doctor_the_way_the_model_picker_runs_models_list() -> None:
    assert "echoline.checkSetup" in COMMANDS
    tail = re.search(r"doctorCommand\(model: string\).*?\{\s*return cliCommand\((\[.*?\])\)", CONFIG_TS, re.S)
    assert tail, "doctorCommand must derive from cliCommand (the server command with `serve` replaced)"
    assert "return cliCommand(['models', 'list', '--json'])" in CONFIG_TS
    # The arguments it builds are a valid `echoline` command line (the model is a setting).
    args = [a.strip().strip("'") for a in tail.group(1).strip("[]").split(",")]
    assert args == ["doctor", "--json", "--model", "model"]
    parsed = build_parser().parse_args(["doctor", "--json", "--model", "smollm2"])
    assert (parsed.command, parsed.json, parsed.model, parsed.invariance) == ("doctor", True, "smollm2", False)


def test_the_report_has_every_field_the_view_reads() -> None:
    """setup.ts's SetupReport against the real report (no model load, no download)."""
    from echoline.engine.setup_check import setup_report

    report = json.loads(json.dumps(setup_report("smollm2")))
    interface = re.search(r"export interface SetupReport \{(.*?)\n\}", SETUP_TS, re.S).group(1)
    fields = re.findall(r"^\s+(\w+)\??:", interface, re.M)
    assert set(fields) <= set(report), set(fields) - set(report)
    check = re.search(r"export interface SetupCheck \{(.*?)\n\}", SETUP_TS, re.S).group(1)
    for c in report["checks"]:
        assert set(re.findall(r"^\s+(\w+):", check, re.M)) <= set(c)


def test_the_walkthrough_links_real_commands_and_ships_its_pages() -> None:
    (walk,) = PKG["contributes"]["walkthroughs"]
    assert [s["id"] for s in walk["steps"]] == ["setup", "model", "inline", "rewrite"]
    for step in walk["steps"]:
        for cmd in re.findall(r"\(command:([\w.]+)\)", step["description"]):
            assert cmd in COMMANDS, (step["id"], cmd)
        for event in step["completionEvents"]:
            assert event.startswith("onCommand:") and event.split(":", 1)[1] in COMMANDS
        page = VSCODE / step["media"]["markdown"]
        assert page.is_file() and page.read_text().startswith("# "), page


def test_the_icon_is_the_drawn_one_and_the_metadata_is_there() -> None:
    from tools.make_vscode_icon import draw, png

    icon = VSCODE / PKG["icon"]
    data = icon.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (128, 128)  # the Marketplace's minimum size
    assert data == png(draw()), "regenerate with: python -m tools.make_vscode_icon"
    assert PKG["repository"]["url"].startswith("https://github.com/") and PKG["bugs"]["url"]
    assert len(PKG["keywords"]) >= 5
