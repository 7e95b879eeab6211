"""Apply a rewrite to an EditCase and run its check.

A rewrite is judged by running code, not by comparing text: many replacements are
correct, and only executing the edited file tells them apart from plausible-looking wrong
ones. Each check runs in a fresh temporary folder, in its own process (group), with a
timeout and no stdin, so a model's infinite loop or ``input()`` costs one failure rather
than a hung benchmark.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from echoline.sidecar.bench.edit_cases import EditCase

_CHECK_EXT = {"python": "py", "javascript": "js", "bash": "sh"}
_PROGRAMS = {"javascript": "node", "bash": "bash"}
_TAIL_LINES = 25


class RuntimeUnavailable(RuntimeError):
    """The interpreter a check needs is not installed.

    Raised instead of reporting a failure so a missing ``node`` skips cases rather than
    scoring every JavaScript rewrite as wrong.
    """


def split_lines(text: str) -> list[str]:
    """``text`` cut after each "\\n", line ends kept.

    Unlike ``str.splitlines`` this splits on "\\n" only: a form feed, "\\r" or a Unicode
    line separator inside code must not shift the 1-based line numbers of a selection.
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def apply_edit(case: EditCase, replacement: str) -> str:
    """The whole file with the selected lines (case.lines) replaced by ``replacement``.

    A replacement missing its final newline gets one when the selection had one, so a
    model that drops the trailing "\\n" does not glue its last line onto the next line.
    """
    lines = split_lines(case.source)
    start, end = case.lines
    if not 1 <= start <= end <= len(lines):
        raise ValueError(f"{case.id}: lines {case.lines} outside 1..{len(lines)}")
    if replacement and not replacement.endswith("\n") and lines[end - 1].endswith("\n"):
        replacement += "\n"
    return "".join(lines[: start - 1]) + replacement + "".join(lines[end:])


def _command(language: str) -> list[str]:
    """The interpreter for ``language``; Python checks use this very interpreter."""
    if language == "python":
        return [sys.executable]
    if language not in _PROGRAMS:
        raise ValueError(f"unknown language: {language!r}")
    program = shutil.which(_PROGRAMS[language])
    if program is None:
        raise RuntimeUnavailable(f"{_PROGRAMS[language]} is not installed")
    return [program]


def runtime_available(language: str) -> bool:
    """Whether checks for ``language`` can run here (python always can)."""
    try:
        _command(language)
    except RuntimeUnavailable:
        return False
    return True


def _tail(output: str, note: str = "") -> str:
    lines = (output.rstrip("\n") + ("\n" + note if note else "")).strip("\n").split("\n")
    return "\n".join(lines[-_TAIL_LINES:])


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill the check and anything it started (a shell pipeline, a child process)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows has no process groups here
            proc.kill()
    except ProcessLookupError:
        pass


def run_check(case: EditCase, edited_source: str, timeout_s: float = 20.0) -> tuple[bool, str]:
    """Write edited_source to <tmp>/<case.filename> and the check to <tmp>/check.<ext>, run it
    with cwd=<tmp>, a timeout and stdin closed; return (passed, last lines of its output).

    A missing runtime raises RuntimeUnavailable rather than counting as a failure; a
    timeout is a failure.
    """
    command = _command(case.language)
    check_name = f"check.{_CHECK_EXT[case.language]}"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONSAFEPATH", None)  # the check imports the edited module from its folder
    with tempfile.TemporaryDirectory(prefix="echoline-edit-") as tmp:
        folder = Path(tmp)
        (folder / case.filename).write_text(edited_source, encoding="utf-8")
        (folder / check_name).write_text(case.check, encoding="utf-8")
        proc = subprocess.Popen(
            [*command, check_name],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            output, _ = proc.communicate()
            return False, _tail(output or "", f"timed out after {timeout_s:g} s")
    return proc.returncode == 0, _tail(output or "")
