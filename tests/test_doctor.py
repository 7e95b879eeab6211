"""``echoline doctor``: the set-up report (no model load) and ``--invariance`` (the real check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from echoline.engine.setup_check import setup_report

from tests.synth import write_fim_qwen2_model

ROOT = Path(__file__).resolve().parents[1]


def _doctor(*args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "echoline", "doctor", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_setup_report_names_what_runs(smollm2_path: Path) -> None:
    """A cached named model is reported verified; every required check passes on this machine."""
    report = setup_report("smollm2", "auto")
    names = {c["name"]: c for c in report["checks"]}
    assert {"python", "numba", "gguf", "backend", "model", "models cache"} <= set(names)
    assert report["model"]["hash_state"] == "verified" and report["model"]["path"] == str(smollm2_path)
    assert report["backend"] in ("cpu", "cuda", "mlx") and report["ok"], report["checks"]
    assert report["libraries"]["numba"] and report["caches"]["models"]["bytes"] > 0


def test_doctor_fails_clearly_on_a_missing_model(tmp_path: Path) -> None:
    rc, report = _doctor("--model", str(tmp_path / "missing.gguf"))
    model = next(c for c in report["checks"] if c["name"] == "model")
    assert rc == 1 and not report["ok"] and not model["ok"] and "no such file" in model["detail"]


def test_doctor_invariance_on_a_model(tmp_path: Path) -> None:
    """--invariance loads the model and compares verify and prefill rows with decoded ones."""
    path = write_fim_qwen2_model(tmp_path / "tiny.gguf")
    rc, report = _doctor("--invariance", "--model", str(path), "--backend", "cpu")
    assert rc == 0 and report["batch_invariant"] is True
    assert set(report["verify_rows"]) == {"1", "2", "8", "16"}
    assert set(report["prefill_chunks"]) == {"1", "5", "16", "64"}
