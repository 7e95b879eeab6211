"""Which engine the server holds: the in-process model, or a shared inference server.

Why a module of its own: the server's loader stays one call, and the choice (with the
arguments that only one side understands) lives next to nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from echoline.engine.errors import EcholineError

if TYPE_CHECKING:
    from echoline.engine.model_choice import Choice
    from echoline.sidecar.config import Settings
    from echoline.sidecar.engine_like import EngineLike

#: Arguments of the local engine a remote one has no use for (the server owns its memory).
_LOCAL_ONLY = ("backend", "kv_budget_bytes", "cpu_activations", "prefill_chunk")


def load_engine(model: str, *, engine: str = "local", endpoint: str | None = None,
                server_kind: str = "llama", api_key_env: str | None = None, **kwargs: Any) -> Any:
    """``Engine.load(model, **kwargs)``, or with ``engine="openai"`` a ``RemoteEngine``
    connected to ``endpoint`` (``model`` then names the GGUF whose tokenizer it uses)."""
    if engine == "local":
        from echoline.engine.api import Engine

        return Engine.load(model, **kwargs)
    if engine != "openai":
        raise EcholineError(f"engine must be 'local' or 'openai', got {engine!r}")
    if not endpoint:
        raise EcholineError("engine 'openai' needs an endpoint (the server's URL, e.g. http://gpu-box:8000)")
    from echoline.engine.remote.engine import API_KEY_ENV, RemoteEngine

    for key in _LOCAL_ONLY:
        kwargs.pop(key, None)
    progress = kwargs.pop("progress", None)
    if progress is not None:
        progress(f"connecting to {endpoint}", 0, 0)
    kwargs.pop("reply_history", None)
    return RemoteEngine.connect(model, endpoint, server_kind=server_kind, api_key_env=api_key_env or API_KEY_ENV)


def remote_status(engine: EngineLike, *, brief: bool = False) -> dict[str, Any]:
    """What a remote engine reports (endpoint, server kind, tokenizer check, exactness);
    ``{}`` for the local engine. ``brief``: only what the ``echoline/status`` notification
    carries for the editors' status line."""
    describe = getattr(engine, "describe", None)
    if not callable(describe):
        return {}
    info = describe()
    if brief:
        return {"exactness": info.get("exactness"), "endpoint": info.get("endpoint")}
    return {"remote": info, "exactness": info.get("exactness")}


@dataclass(frozen=True)
class JobModel:
    """The model one job runs, why, and the key its engine is shared by (jobs with equal
    keys get one engine: no second load of the same model)."""

    job: str
    model: str
    reason: str
    key: tuple[Any, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "reason": self.reason}


def job_models(settings: Settings, machine: Callable[[str], dict[str, Choice]] | None = None) -> dict[str, JobModel]:
    """Each job's model (``config.JOBS``): the job's own setting, else ``model``; ``auto``
    asks ``machine`` (default ``engine.model_choice.machine_choice``, called only then: it
    may import a GPU library to see whether there is a GPU)."""
    from echoline.sidecar.config import AUTO, JOBS

    choices: dict[str, Choice] | None = None
    out: dict[str, JobModel] = {}
    for job in JOBS:
        model, setting = settings.job_model(job)
        if model == AUTO:
            if choices is None:
                if machine is None:
                    from echoline.engine.model_choice import machine_choice as machine
                choices = machine(settings.backend)
            choice = choices[job]
            model, reason = choice.model, choice.reason
        else:
            reason = f"{setting} setting"
        out[job] = JobModel(job, model, reason, settings.job_engine_key(model))
    return out
