"""The editor clients agree with themselves, with the server and with the docs (no editor run).

Fast checks of what the e2e tests cannot see cheaply: every command VS Code's
package.json contributes is registered in the extension's source and the other
way round; keybindings and menus name real commands; the extension sends every
server setting it exposes (SERVER_KEYS in src/config.ts) and nothing the server
does not know; the defaults of the server settings are one value everywhere
(sidecar/config.py, package.json, src/config.ts, the Neovim plugin, docs/editors.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from echoline.sidecar.config import KEYS, Settings

REPO = Path(__file__).resolve().parent.parent
VSCODE = REPO / "editors" / "vscode"
NVIM = REPO / "editors" / "nvim"
DOCS = REPO / "docs" / "editors.md"

PKG = json.loads((VSCODE / "package.json").read_text())
CONTRIB = PKG["contributes"]
PROPS = CONTRIB["configuration"]["properties"]
SRC = {p.name: p.read_text() for p in sorted((VSCODE / "src").glob("*.ts"))}
CONFIG_TS = SRC["config.ts"]
SERVER_DEFAULTS = {
    key: getattr(Settings(), name) for key, (name, _) in KEYS.items()
}  # camelCase key -> the server's default


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def registered_commands() -> set[str]:
    return {m for text in SRC.values() for m in re.findall(r"registerCommand\(\s*'([^']+)'", text)}


def contributed_commands() -> set[str]:
    return {c["command"] for c in CONTRIB["commands"]}


def server_keys_ts() -> list[str]:
    m = re.search(r"export const SERVER_KEYS = \[(.*?)\] as const", CONFIG_TS, re.S)
    assert m, "SERVER_KEYS not found in src/config.ts"
    return re.findall(r"'([^']+)'", m.group(1))


def test_every_contributed_command_is_registered_and_back() -> None:
    assert contributed_commands() == registered_commands()


def test_keybindings_and_menus_name_contributed_commands() -> None:
    commands = contributed_commands()
    for kb in CONTRIB["keybindings"]:
        assert kb["command"] in commands, kb
    for where, items in CONTRIB["menus"].items():
        for item in items:
            assert item["command"] in commands, (where, item)
    bound = {kb["command"]: kb for kb in CONTRIB["keybindings"]}
    # Rewrite on a selection, and accept/reject of the preview through a context key.
    assert "editorHasSelection" in bound["echoline.rewriteSelection"]["when"]
    assert bound["echoline.rewriteSelection"]["key"] == "ctrl+alt+r"
    assert bound["echoline.rewriteSelection"]["mac"] == "cmd+alt+r"
    for cmd in ("echoline.acceptRewrite", "echoline.rejectRewrite"):
        assert "echoline.previewActive" in bound[cmd]["when"], bound[cmd]
    assert "'setContext', 'echoline.previewActive', true" in SRC["rewrite.ts"]
    assert "'setContext', 'echoline.previewActive', false" in SRC["rewrite.ts"]


def test_no_modal_dialogs() -> None:
    for name, text in SRC.items():
        assert not re.search(r"modal:\s*true", text), name


def test_status_bar_item_opens_the_menu() -> None:
    assert "new StatusItem('echoline.menu')" in SRC["extension.ts"]
    menu = SRC["menu.ts"]
    for cmd in (
        "echoline.toggleInlineCompletions",
        "echoline.pickModel",
        "echoline.showLog",
        "echoline.restart",
    ):
        assert f"command: '{cmd}'" in menu, cmd
    # The model picker asks the server's CLI, with the known names as fallback.
    assert "'models', 'list', '--json'" in CONFIG_TS
    known = re.search(r"KNOWN_MODELS = \[(.*?)\]", CONFIG_TS).group(1)
    from echoline.engine.model_catalog import MODELS

    assert set(re.findall(r"'([^']+)'", known)) == set(MODELS)


def test_extension_sends_every_server_setting_it_has() -> None:
    keys = server_keys_ts()
    exposed = {k.removeprefix("echoline.") for k in PROPS} & set(KEYS)
    assert set(keys) == exposed, "SERVER_KEYS must list every echoline.* setting the server knows"
    assert set(keys) <= set(KEYS), "the server reports unknown keys as errors"
    # The live sync uses SERVER_KEYS (no hand-kept subset in extension.ts).
    assert "changedServerKeys(e)" in SRC["extension.ts"]
    assert "serverKeys" not in SRC["extension.ts"]
    # serverSettings() reads each of them, with package.json's default as fallback.
    body = CONFIG_TS[CONFIG_TS.index("export function serverSettings") :]
    body = body[: body.index("\n}\n")]
    for k in keys:
        m = re.search(rf"cfg\.get<[^>]+>\('{k}', ([^)]+)\)", body)
        assert m, f"serverSettings() does not read {k}"
        fallback = json.loads(m.group(1).replace("'", '"'))
        assert _same(fallback, PROPS[f"echoline.{k}"]["default"]), (k, fallback)


@pytest.mark.parametrize("key", sorted({k.removeprefix("echoline.") for k in PROPS} & set(KEYS)))
def test_vscode_defaults_are_the_servers(key: str) -> None:
    assert _same(PROPS[f"echoline.{key}"]["default"], SERVER_DEFAULTS[key]), key


def nvim_defaults() -> dict[str, Any]:
    """Server settings among the Neovim plugin's defaults, by the server's key."""
    text = (NVIM / "lua" / "echoline" / "config.lua").read_text()
    block = text[text.index("M.defaults = {") : text.index("\n}\n")]
    literal: dict[str, Any] = {}
    for name, value in re.findall(r"^  (\w+) = ([^,\n]+),", block, re.M):
        value = value.strip()
        if value == "nil":
            literal[name] = None
        elif value in ("true", "false"):
            literal[name] = value == "true"
        elif re.fullmatch(r"-?\d+(\.\d+)?", value):
            literal[name] = float(value) if "." in value else int(value)
        elif re.fullmatch(r"'[^']*'", value):
            literal[name] = value[1:-1]
    mapping = dict(re.findall(r"^    (\w+) = o\.(\w+),", text, re.M))  # server key -> option
    assert mapping, "server_settings() mapping not found in config.lua"
    return {key: literal[opt] for key, opt in mapping.items() if opt in literal}


def test_nvim_defaults_are_the_servers() -> None:
    found = nvim_defaults()
    assert {"model", "maxTokens", "prefillIdleMs", "replyHistory"} <= set(found)
    for key, value in found.items():
        assert key in KEYS, key
        if value is not None:  # nil: the server decides
            assert _same(value, SERVER_DEFAULTS[key]), (key, value, SERVER_DEFAULTS[key])


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def doc_table(heading: str) -> dict[str, str]:
    """The first table after ``heading`` in docs/editors.md: first column -> second column."""
    text = DOCS.read_text()
    text = text[text.index(heading) :]
    rows: dict[str, str] = {}
    started = False
    for line in text.splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            m = re.fullmatch(r"`([^`]+)`", cells[0])
            if m and len(cells) > 1:
                rows[m.group(1)] = cells[1]
        elif started:
            break
    return rows


def test_docs_server_settings_table() -> None:
    rows = doc_table("Settings the server reads")
    for key, cell in rows.items():
        assert key in KEYS, key
        literal = re.fullmatch(r"`([^`]*)`", cell)
        if literal:  # other cells say "server's choice" and the like
            assert literal.group(1) == _cell(SERVER_DEFAULTS[key]), (key, cell)
    assert {"model", "maxTokens", "prefillOnIdle", "prefillIdleMs", "replyHistory"} <= set(rows)


def test_docs_vscode_settings_table() -> None:
    rows = doc_table("Settings (all under `echoline.`")
    assert set(rows) == set(PROPS), set(rows) ^ set(PROPS)
    for key, cell in rows.items():
        literal = re.fullmatch(r"`([^`]*)`", cell)
        assert literal, (key, cell)
        assert (
            literal.group(1) == _cell(PROPS[key]["default"])
            or json.loads(literal.group(1)) == PROPS[key]["default"]
        ), (key, cell)


def test_docs_name_every_vscode_command_and_keybinding() -> None:
    text = DOCS.read_text()
    for c in CONTRIB["commands"]:
        assert f"echoline: {c['title']}" in text, c
    for kb in CONTRIB["keybindings"]:
        key = kb["key"].replace("ctrl", "Ctrl").replace("alt", "Alt").replace("escape", "Escape")
        key = "+".join(p[:1].upper() + p[1:] for p in key.split("+"))
        assert key in text, kb


def test_server_settings_dataclass_is_covered() -> None:
    # Every Settings field has an LSP key (so the defaults above cover them all).
    assert {name for name, _ in KEYS.values()} == {f.name for f in fields(Settings)}


def test_docs_sidecar_settings_table() -> None:
    """docs/sidecar.md's settings table names every server key once, with the server's
    default wherever the cell is a literal (it had said "smollm2" long after the default
    became the 0.5B)."""
    text = (REPO / "docs" / "sidecar.md").read_text()
    text = text[text.index("## Settings") :]
    rows: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            # a cell may hold an escaped pipe (`"a"` \| `"b"`)
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            key = re.match(r"`([^`]+)`", cells[0])
            assert key, line
            rows[key.group(1)] = cells[2]
        elif rows and not line.startswith("|"):
            break
    assert set(rows) == set(KEYS), set(rows) ^ set(KEYS)
    for key, cell in rows.items():
        literal = re.fullmatch(r'`("[^"]*"|true|false|-?\d+(\.\d+)?)`|(-?\d+(\.\d+)?)', cell)
        if literal:  # others say "null (engine default)" and the like
            value = json.loads(literal.group(1) or literal.group(3))
            assert _same(value, SERVER_DEFAULTS[key]), (key, cell, SERVER_DEFAULTS[key])
        else:
            assert SERVER_DEFAULTS[key] is None or key in ("engine", "serverKind"), (key, cell)
