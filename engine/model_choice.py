"""Which model does which job on this machine, and why.

Why: quality depends on the model that answers (on held-out multi-line
refactors the Qwen2.5-Coder 0.5B passed 3/10, the 1.5B 9/10), while inline completion
wants the fastest model. So a rewrite gets the best model this machine runs within the
latency target, and inline completion (and edit prediction) keeps the 0.5B.

The choice itself is a pure function (``choose_rewrite_model``: backend, measured speeds,
cores -> model and a reason a person reads), so it is tested on many machine profiles
without one. What it reads from the machine is gathered apart (``machine_choice``): the
backend ``auto`` resolves to and the speeds a loaded engine recorded (``record_speeds``:
the sidecar does it after each load's calibration). Nothing here loads a model.

The estimate, for a warm rewrite of a 10-line selection in a 300-line file (the file's
prefix already cached by the idle prefill): the prompt's tail (selection, instruction,
~``REWRITE_TAIL_TOKENS``) is prefilled, then ~``REPLY_TOKENS`` are decoded at plain speed
times ``SPEC_GAIN``. Both are calibrated on the measured case (``echoline bench lsp --model
qwen2.5-coder-1.5b --source engine/gguf_file.py --file-lines 300 --selection-lines 10``,
2-core Zen 4, docs/models.md): the request prefilled 118-120 tokens and the reply was 62
tokens at ~3x the plain speed (a rewrite mostly copies its selection), 2.35 s in all; from
that machine's recorded speeds (1.52 s for a ``TAIL_TOKENS`` tail of 160, 55 ms a step)
the estimate says 2.31 s. It used to charge the whole 160-token tail (2.7 s): a margin
that left a machine 10 % inside the target one noisy measurement from the 0.5B, and a
measured 1.5B that is judged too slow is never loaded, so never measured again.

A CPU no model has been measured on yet is judged by its instruction set (``unmeasured_cpu``):
int8 dot products in 512-bit or VNNI form make the 1.5B's warm rewrite fit the target
on two cores (Zen 4: 2.35 s), AVX2 alone does not (a 2-core Zen 2 prefills ~2x slower);
the first load records real speeds, and the next choice uses them.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echoline import paths

BEST = "qwen2.5-coder-1.5b"  # the rewrite model wherever it meets the target
FASTEST = "qwen2.5-coder-0.5b"  # inline completion, and rewrites elsewhere
JOBS = ("rewrite", "inline")
#: Seconds a warm rewrite of a 10-line selection in a 300-line file may take (p50, CPU).
TARGET_S = 3.0
TAIL_TOKENS = 160  # the recorded tail's length (Speeds.tail_s): a prefill after ~2,000 cached
#: What a warm rewrite of 10 lines prefills after the cached file (selection, instruction,
#: chat template): 118-120 tokens measured (docs/models.md)
REWRITE_TAIL_TOKENS = 120
REPLY_TOKENS = 64  # the rewritten 10 lines and the closing fence (62 measured)
SPEC_GAIN = 3.0
#: From the 0.5B's speed to the 1.5B's on the same machine (docs/benchmarks.md, cpu/q8:
#: one-row decode 15.4 against 29.6 ms on a Zen 5, 98.6 against 46.8 tok/s; 16-row forward
#: 108.9 against 287.7 ms): decode is bandwidth-bound, prefill compute-bound.
DECODE_SCALE = 2.1
PREFILL_SCALE = 2.7
#: Unmeasured CPUs with only AVX2-class int8 products get the 1.5B from this many cores on.
UNMEASURED_CORES = 8
#: Instruction sets (LLVM names) whose int8 dot products put the 1.5B within the target on
#: two cores, unmeasured: AVX-512 VNNI, AVX-VNNI, Arm's dot product.
FAST_INT8 = frozenset({"avx512vnni", "avxvnni", "dotprod"})
SPEEDS_FILE = "model-speeds.json"


@dataclass(frozen=True)
class Speeds:
    """A loaded model's measured costs on this machine: one decode step and a
    ``TAIL_TOKENS`` prefill, seconds, both after ~2,000 cached tokens
    (``Engine.prefill_seconds``)."""

    decode_s: float
    tail_s: float


@dataclass(frozen=True)
class Choice:
    """A job's model and why (``reason``: a few words for the status line and doctor)."""

    model: str
    reason: str
    estimate_s: float | None = None  # the warm-rewrite estimate behind it, when there is one

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "reason": self.reason, "estimateS": self.estimate_s}


def rewrite_seconds(speeds: Speeds) -> float:
    """Estimated seconds of a warm 10-line rewrite at these speeds."""
    return speeds.tail_s * REWRITE_TAIL_TOKENS / TAIL_TOKENS + REPLY_TOKENS * speeds.decode_s / SPEC_GAIN


def unmeasured_cpu(cores: int | None, features: frozenset[str] | None) -> Choice:
    """The rewrite model for a CPU no model has been measured on: the 1.5B on two or more
    cores with fast int8 products (``FAST_INT8``), or on ``UNMEASURED_CORES`` cores
    without them; else the 0.5B until a load measures the machine."""
    fast = sorted((features or frozenset()) & FAST_INT8)
    if cores is not None and cores >= 2 and fast:
        return Choice(BEST, f"CPU, {cores} cores with {fast[0]} (not measured yet)")
    if cores is not None and cores >= UNMEASURED_CORES:
        return Choice(BEST, f"CPU, {cores} cores (not measured yet)")
    return Choice(FASTEST, f"CPU, {cores or '?'} cores without fast int8 products, not measured yet")


def choose_rewrite_model(backend: str, speeds: Mapping[str, Speeds] | None, cores: int | None,
                         features: frozenset[str] | None = None) -> Choice:
    """The rewrite model for a machine: ``backend`` as ``auto`` resolved it ("cuda",
    "mlx", "cpu", "numpy"), ``speeds`` by model name (``BEST``, ``FASTEST``) as recorded
    on this machine's backend, ``cores`` and ``features`` (LLVM's names) the CPU's. The
    1.5B where it meets ``TARGET_S`` (a GPU or Apple silicon always does), else the 0.5B."""
    if backend == "cuda":
        return Choice(BEST, "GPU")
    if backend == "mlx":
        return Choice(BEST, "Apple silicon")
    if backend == "numpy":
        return Choice(FASTEST, "numpy reference backend: too slow for the 1.5B")
    speeds = speeds or {}
    if BEST in speeds:
        est, basis = rewrite_seconds(speeds[BEST]), "measured"
    elif FASTEST in speeds:
        small = speeds[FASTEST]
        est = rewrite_seconds(Speeds(small.decode_s * DECODE_SCALE, small.tail_s * PREFILL_SCALE))
        basis = "estimated from the 0.5B"
    else:
        return unmeasured_cpu(cores, features)
    if est <= TARGET_S:
        return Choice(BEST, f"CPU: ~{est:.1f} s a 10-line rewrite ({basis})", round(est, 2))
    return Choice(FASTEST, f"CPU too slow for the 1.5B: ~{est:.1f} s a 10-line rewrite ({basis}), "
                           f"target {TARGET_S:g} s", round(est, 2))


def choose_inline_model() -> Choice:
    """Inline completion and edit prediction: the fastest model, everywhere."""
    return Choice(FASTEST, "fastest")


# ---- what the machine says -------------------------------------------------------------------


def _speeds_path() -> Path:
    return paths.cache_dir("calibration") / SPEEDS_FILE


def _machine_key(backend: str) -> str:
    """Speeds hold for one machine and backend (a shared cache folder may serve several)."""
    return f"{platform.node()}|{os.cpu_count()}|{backend}"


def registry_name(model_file: str) -> str:
    """The registry's name of a model file (``qwen2.5-coder-0.5b-instruct.gguf`` ->
    ``qwen2.5-coder-0.5b``); the file name itself when the registry does not know it."""
    from echoline.engine.model_catalog import MODELS

    for name, spec in MODELS.items():
        if spec.filename == model_file:
            return name
    return model_file


def read_speeds(backend: str) -> dict[str, Speeds]:
    """The speeds recorded on this machine and ``backend`` (the backend's name, e.g.
    "cpu"), by model name; {} when none (or the file is unreadable)."""
    try:
        raw = json.loads(_speeds_path().read_text())
        entries = raw.get(_machine_key(backend), {})
        return {name: Speeds(float(v["decode_s"]), float(v["tail_s"])) for name, v in entries.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def record_speeds(model_file: str, backend: str, speeds: Speeds) -> None:
    """Keep a loaded model's speeds for the next choice (a failure to write is ignored:
    the next start measures again). The fastest ever recorded on this machine is kept,
    each figure apart: contention (an editor indexing, a build, tests) only ever adds time,
    and a start under load must not move rewrites to the smaller model for good."""
    path = _speeds_path()
    try:
        raw = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(raw, dict):
            raw = {}
    except (OSError, ValueError):
        raw = {}
    entry = raw.setdefault(_machine_key(backend), {})
    name = registry_name(model_file)
    old = entry.get(name)
    decode, tail = speeds.decode_s, speeds.tail_s
    if isinstance(old, dict):
        try:
            decode, tail = min(decode, float(old["decode_s"])), min(tail, float(old["tail_s"]))
        except (KeyError, TypeError, ValueError):
            pass
    entry[name] = {"decode_s": decode, "tail_s": tail, "at": time.time()}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(raw, indent=1))
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


def engine_speeds(engine: Any) -> Speeds | None:
    """A loaded local engine's speeds, from its calibration (None: an engine that does not
    know them, e.g. a remote one)."""
    seconds = getattr(engine, "prefill_seconds", None)
    if not callable(seconds):
        return None
    try:
        one, tail = seconds(1), seconds(TAIL_TOKENS)
    except Exception:  # noqa: BLE001 - a stand-in or an uncalibrated engine: nothing to record
        return None
    if not isinstance(one, int | float) or not isinstance(tail, int | float) or one <= 0 or tail <= 0:
        return None
    return Speeds(float(one), float(tail))


def machine_choice(backend: str = "auto") -> dict[str, Choice]:
    """Each job's default model on this machine (``JOBS``), from the backend ``backend``
    resolves to and the recorded speeds. No model is loaded."""
    from echoline.engine.backends import resolve_backend_name
    from echoline.engine.errors import EcholineError

    try:
        resolved = resolve_backend_name(backend)
    except EcholineError:
        resolved = "cpu"
    return {"rewrite": choose_rewrite_model(resolved, read_speeds(resolved), os.cpu_count(), _cpu_features()),
            "inline": choose_inline_model()}


def _cpu_features() -> frozenset[str] | None:
    """The host CPU's features (None when they cannot be read)."""
    try:
        from echoline.kernels.cpu.numba_setup import host_features

        return host_features()
    except Exception:  # noqa: BLE001 - no numba or an unreadable CPU: judged by cores alone
        return None


def summary(models: Mapping[str, Mapping[str, Any]]) -> str:
    """One line for a status line: ``rewrite: qwen2.5-coder-1.5b (GPU) · inline: ...``;
    ``models``: job -> {"model", "reason"}."""
    return " · ".join(f"{job}: {m.get('model')} ({m.get('reason')})" for job, m in models.items())
