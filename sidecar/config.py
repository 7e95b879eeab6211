"""Sidecar settings: read from ``initializationOptions`` and ``workspace/didChangeConfiguration``.

Each key is validated on its own so one bad value does not throw away the good
ones: a bad value produces a human-readable error (the server shows it with
``window/showMessage``) and the last good value is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from echoline.engine.backends import BACKEND_NAMES as BACKENDS
from echoline.engine.backends import CPU_ACTIVATIONS
from echoline.engine.model_catalog import DEFAULT_MODEL
from echoline.engine.remote.kinds import KINDS as SERVER_KINDS

ENGINES = ("local", "openai")
#: The ``model`` value that leaves each job's model to the machine (engine/model_choice.py).
AUTO = "auto"
#: The jobs that may each have a model of their own: rewrites, and inline completion with
#: edit prediction.
JOBS = ("rewrite", "inline")
#: Environment variables ``echoline serve --engine/--endpoint/--server-kind`` set: the
#: defaults a client's settings then override (an editor that sends none keeps them).
ENV_ENGINE, ENV_ENDPOINT, ENV_SERVER_KIND = "ECHOLINE_ENGINE", "ECHOLINE_ENDPOINT", "ECHOLINE_SERVER_KIND"


@dataclass(frozen=True)
class Settings:
    """Everything the user can tune. Names mirror the LSP keys (camelCase there)."""

    # The model of both jobs; "auto": each job's default on this machine (engine/model_choice.py:
    # the rewrite model from the calibrated speed, the fastest for inline). A job's own
    # setting (rewrite_model, inline_model) wins over it; None there: follow ``model``.
    model: str = AUTO
    rewrite_model: str | None = None  # rewrites and instruction edits
    inline_model: str | None = None  # inline completion and edit prediction
    backend: str = "auto"
    cpu_activations: str | None = None  # None: the server's environment decides (default auto)
    speculation: bool = True
    max_tokens: int = 512
    kv_budget_mb: int | None = None
    max_file_bytes: int = 512 * 1024
    max_index_mb: float = 64.0
    inline_max_tokens: int = 64
    # Tokens after the cursor an inline prompt carries (whole lines); None: "auto", what the
    # engine prefills within 1.25 s (sidecar/prompts.py auto_suffix_tokens); 0: none.
    inline_suffix_tokens: int | None = None
    # Warm the inline session at the cursor the editor reports (echoline/cursor) once it
    # rests inline_warm_ms (sidecar/inline_warm.py).
    inline_warm: bool = True
    inline_warm_ms: int = 300
    # Edit predictions (textDocument/copilotInlineEdit, echoline/nextEdit; sidecar/next_edit.py):
    # off by default until a model's precision on `echoline bench next-edit` earns it.
    next_edit: bool = False
    next_edit_debounce_ms: int = 150  # a request waits this long after the document's last change
    next_edit_region_lines: int = 10  # lines above and below the cursor the prediction may change
    # Who predicts: "repeat" (the last change at its next place, no model: right far more often
    # than the 0.5B in ``bench next-edit``), "model" (the inline model rewrites the region), or
    # "both" (repeat where it finds a place, else the model)
    next_edit_predictor: str = "repeat"
    ready_timeout_s: float = 60.0
    prefill_on_idle: bool = True
    prefill_idle_ms: int = 400
    reply_history: int = 4  # engine.api.REPLY_HISTORY: earlier replies kept as draft sources
    # Where the forward passes run: "local" (in-process) or "openai" (an inference server at
    # ``endpoint``, of kind ``server_kind``; ``model`` then names the GGUF whose tokenizer the
    # server shares). The API key is never a setting: it is read from the variable ``api_key_env``.
    engine: str = field(default_factory=lambda: os.environ.get(ENV_ENGINE) or "local")
    endpoint: str | None = field(default_factory=lambda: os.environ.get(ENV_ENDPOINT) or None)
    server_kind: str = field(default_factory=lambda: os.environ.get(ENV_SERVER_KIND) or "llama")
    api_key_env: str = "ECHOLINE_API_KEY"

    @property
    def kv_budget_bytes(self) -> int | None:
        return None if self.kv_budget_mb is None else int(self.kv_budget_mb) * 1024 * 1024

    @property
    def max_index_bytes(self) -> int:
        return int(self.max_index_mb * 1024 * 1024)

    def engine_key(self) -> tuple[Any, ...]:
        """What requires a model reload (or a reconnect) when it changes."""
        local = (self.model, self.backend, self.cpu_activations, self.kv_budget_mb)
        if self.engine == "local":
            return ("local", *local, self.rewrite_model, self.inline_model)
        return ("openai", self.model, self.endpoint, self.server_kind, self.api_key_env)

    def job_model(self, job: str) -> tuple[str, str]:
        """(model or ``AUTO``, the setting that decided it) for ``job`` ("rewrite" or
        "inline"): the job's own setting wins over ``model``. A remote engine serves one
        model to both jobs: ``model``, the GGUF whose tokenizer the server shares."""
        if job not in JOBS:
            raise ValueError(f"unknown job {job!r}; known: {', '.join(JOBS)}")
        own = self.rewrite_model if job == "rewrite" else self.inline_model
        if self.engine != "local":
            return (DEFAULT_MODEL if self.model == AUTO else self.model), "model"
        if own is not None:
            return own, f"{job}Model"
        return self.model, "model"

    def job_engine_key(self, model: str) -> tuple[Any, ...]:
        """What tells two jobs' engines apart: jobs whose keys are equal share one engine."""
        if self.engine == "local":
            return ("local", model, self.backend, self.cpu_activations, self.kv_budget_mb)
        return ("openai", model, self.endpoint, self.server_kind, self.api_key_env)

    def engine_kwargs(self) -> dict[str, Any]:
        """What the loader needs beyond the local engine's arguments (sidecar/engine_choice.py)."""
        if self.engine == "local":
            return {}
        return {"engine": self.engine, "endpoint": self.endpoint, "server_kind": self.server_kind,
                "api_key_env": self.api_key_env}


# LSP key -> (field name, validator). Validators return the converted value or raise ValueError.


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v.strip()


def _opt_model(v: Any) -> str | None:
    """A job's model: a name, a path, ``auto`` (the machine's default for the job), or
    null / "" (follow ``model``)."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    return _str(v)


def _backend(v: Any) -> str:
    v = _str(v)
    if v not in BACKENDS:
        raise ValueError(f"must be one of {', '.join(BACKENDS)}")
    return v


#: ``nextEditPredictor`` values (sidecar/next_edit_request.py)
NEXT_EDIT_PREDICTORS = ("repeat", "model", "both")


def _predictor(v: Any) -> str:
    v = _str(v)
    if v not in NEXT_EDIT_PREDICTORS:
        raise ValueError(f"must be one of {', '.join(NEXT_EDIT_PREDICTORS)}")
    return v


def _cpu_activations(v: Any) -> str | None:
    if v is None:
        return None
    v = _str(v)
    if v not in CPU_ACTIVATIONS:
        raise ValueError(f"must be one of {', '.join(CPU_ACTIVATIONS)} (or null)")
    return v


def _engine(v: Any) -> str:
    v = _str(v)
    if v not in ENGINES:
        raise ValueError(f"must be one of {', '.join(ENGINES)}")
    return v


def _endpoint(v: Any) -> str | None:
    if v is None:
        return None
    v = _str(v)
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL (the server's base, e.g. http://gpu-box:8000)")
    return v


def _server_kind(v: Any) -> str:
    v = _str(v)
    if v not in SERVER_KINDS:
        raise ValueError(f"must be one of {', '.join(SERVER_KINDS)}")
    return v


def _env_name(v: Any) -> str:
    v = _str(v)
    if not v.replace("_", "").isalnum() or v[0].isdigit():
        raise ValueError("must name an environment variable (letters, digits, _), not hold the key")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("must be true or false")
    return v


def _int_range(lo: int, hi: int):
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v:
            raise ValueError(f"must be an integer between {lo} and {hi}")
        if not lo <= v <= hi:
            raise ValueError(f"must be between {lo} and {hi}")
        return int(v)

    return check


def _opt_int_range(lo: int, hi: int):
    inner = _int_range(lo, hi)

    def check(v: Any) -> int | None:
        return None if v is None else inner(v)

    return check


def _auto_or_int_range(lo: int, hi: int):
    inner = _int_range(lo, hi)

    def check(v: Any) -> int | None:
        if v is None or v == "auto":
            return None
        try:
            return inner(v)
        except ValueError as e:
            raise ValueError(f'{e}, or "auto"') from None

    return check


def _pos_number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise ValueError("must be a positive number")
    return float(v)


KEYS: dict[str, tuple[str, Any]] = {
    "model": ("model", _str),
    "rewriteModel": ("rewrite_model", _opt_model),
    "inlineModel": ("inline_model", _opt_model),
    "backend": ("backend", _backend),
    "cpuActivations": ("cpu_activations", _cpu_activations),
    "speculation": ("speculation", _bool),
    "maxTokens": ("max_tokens", _int_range(1, 8192)),
    "kvBudgetMB": ("kv_budget_mb", _opt_int_range(1, 1 << 20)),
    "maxFileBytes": ("max_file_bytes", _int_range(1, 1 << 31)),
    "maxIndexMB": ("max_index_mb", _pos_number),
    "inlineMaxTokens": ("inline_max_tokens", _int_range(1, 1024)),
    "inlineSuffixTokens": ("inline_suffix_tokens", _auto_or_int_range(0, 4096)),
    "inlineWarm": ("inline_warm", _bool),
    "inlineWarmMs": ("inline_warm_ms", _int_range(0, 60_000)),
    "nextEdit": ("next_edit", _bool),
    "nextEditDebounceMs": ("next_edit_debounce_ms", _int_range(0, 10_000)),
    "nextEditRegionLines": ("next_edit_region_lines", _int_range(1, 40)),
    "nextEditPredictor": ("next_edit_predictor", _predictor),
    "readyTimeoutS": ("ready_timeout_s", _pos_number),
    "prefillOnIdle": ("prefill_on_idle", _bool),
    "prefillIdleMs": ("prefill_idle_ms", _int_range(0, 60_000)),
    "replyHistory": ("reply_history", _int_range(0, 64)),
    "engine": ("engine", _engine),
    "endpoint": ("endpoint", _endpoint),
    "serverKind": ("server_kind", _server_kind),
    "apiKeyEnv": ("api_key_env", _env_name),
}
#: Keys refused with a reason of their own: a secret does not belong in a settings file.
REFUSED = {
    "apiKey": "an API key is never read from settings (they end up in dotfile repositories); "
              "put it in the environment variable named by apiKeyEnv (default ECHOLINE_API_KEY) "
              "before the editor starts",
}

# Nested spellings accepted as well: {"index": {"maxFileBytes": ..}, "inlineCompletion": {"maxTokens": ..}}
NESTED: dict[tuple[str, str], str] = {
    ("index", "maxFileBytes"): "maxFileBytes",
    ("index", "maxIndexMB"): "maxIndexMB",
    ("inlineCompletion", "maxTokens"): "inlineMaxTokens",
    ("inlineCompletion", "suffixTokens"): "inlineSuffixTokens",
    ("inlineCompletion", "warm"): "inlineWarm",
    ("inlineCompletion", "warmMs"): "inlineWarmMs",
}


def _flatten(raw: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict) and key in {k for k, _ in NESTED}:
            for sub, subval in value.items():
                target = NESTED.get((key, sub))
                flat[target or f"{key}.{sub}"] = subval
        else:
            flat[key] = value
    return flat


def unwrap(options: Any) -> dict[str, Any] | None:
    """Accept either ``{"echoline": {...}}`` or the bare settings object."""
    if options is None:
        return None
    if not isinstance(options, dict):
        return None
    inner = options.get("echoline")
    if isinstance(inner, dict):
        return inner
    return options


def apply(current: Settings, raw: Any) -> tuple[Settings, list[str]]:
    """Return (new settings, error messages). Unknown keys are reported, not fatal."""
    if raw is None:
        return current, []
    if not isinstance(raw, dict):
        return current, [f"echoline settings must be an object, got {type(raw).__name__}"]
    changes: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in _flatten(raw).items():
        spec = KEYS.get(key)
        if key in REFUSED:
            errors.append(f"echoline: setting {key} refused: {REFUSED[key]}")
            continue
        if spec is None:
            errors.append(f"echoline: unknown setting {key!r} (ignored)")
            continue
        name, check = spec
        try:
            changes[name] = check(value)
        except ValueError as exc:
            kept = getattr(current, name)
            errors.append(f"echoline: setting {key}={value!r} {exc}; keeping {kept!r}")
    return replace(current, **changes), errors


def as_lsp_dict(s: Settings) -> dict[str, Any]:
    """Settings back in LSP spelling (for the status command and docs)."""
    by_field = {name: key for key, (name, _) in KEYS.items()}
    return {by_field[f.name]: getattr(s, f.name) for f in fields(s) if f.name in by_field}
