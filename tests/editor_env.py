"""Shared plumbing for the real-editor tests: install the editors, compute expected rewrites.

Why: the editor tests run on fresh CI machines, so they install Neovim, Node 24,
code-server, vsce, playwright-core and chromium themselves (tests/editor_setup.sh,
idempotent, cached under ~/.cache/echoline-editor-test) and skip only when that
is impossible. Expected rewrite text comes from an in-process, editor-free run of
the same rewrite (plain greedy decoding, no speculation), so the tests check what
the editor wrote to disk against an independent run, not against itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "tests" / "editor_setup.sh"
MODEL = os.environ.get("ECHOLINE_EDITOR_MODEL", "smollm2")
BACKEND = os.environ.get("ECHOLINE_EDITOR_BACKEND", "auto")

SAMPLE = """def add(a, b):
    return a + b


def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def greet(name):
    message = "Hello, " + name
    print(message)


if __name__ == "__main__":
    print(add(1, 2))
    print(fibonacci(10))
"""


def ensure_tools(what: str) -> dict[str, str]:
    """Run the installer for ``what`` (nvim | vscode); skip the test when it cannot install."""
    if shutil.which("bash") is None:
        pytest.skip("bash is missing: cannot run tests/editor_setup.sh")
    env = dict(os.environ, PYTHON=sys.executable)
    try:
        proc = subprocess.run(
            ["bash", str(SETUP), what], capture_output=True, text=True, timeout=900, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing the {what} test tools took over 15 minutes")
    if proc.returncode != 0:
        pytest.skip(f"cannot install the {what} test tools: {proc.stderr.strip()[-800:]}")
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    return found


def server_cmd() -> list[str]:
    """The real language server, from this checkout."""
    return [sys.executable, "-m", "echoline", "serve"]


def server_env() -> dict[str, str]:
    """Environment that lets the server import this checkout's packages."""
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def line_span(text: str, line1: int, line2: int) -> tuple[int, int]:
    """Character offsets of lines line1..line2 (1-based, inclusive, with their newlines)."""
    lines = text.splitlines(keepends=True)
    start = sum(len(x) for x in lines[: line1 - 1])
    return start, start + sum(len(x) for x in lines[line1 - 1 : line2])


@functools.lru_cache(maxsize=1)
def _engine() -> Any:
    from echoline.engine.api import Engine

    return Engine.load(MODEL, backend=BACKEND)


def expected_rewrite(
    text: str, name: str, line1: int, line2: int, instruction: str, max_tokens: int
) -> str:
    """The replacement an editor-free greedy run of the same rewrite produces.

    Same function the server calls (sidecar.rewrite.run_rewrite), same prompt
    (the file name enters the prompt only through its base name), no editor, no
    cache shared with the server, speculation off: by the exactness contract the
    server's reply must equal it token for token.
    """
    from echoline.sidecar.rewrite import run_rewrite

    start, end = line_span(text, line1, line2)
    out = run_rewrite(
        _engine(), text, start, end, instruction, name=name, max_tokens=max_tokens, spec=False
    )
    return out.text
