"""``echoline.status``: the server's state in one answer, for people and for tests.

Why apart from ``server.py``: the report reads every part of the server (the worker and
its engines, the settings, the index, the background prefills, the inline store, the
protocol's open futures) and one field needs a round trip to the worker thread; gathered
here, the command's handler stays a line that calls ``report``. The parts take the server
as ``ls`` (never imported: the server imports this module).

The answer's keys, in this order (docs/sidecar.md): state, model, error, settings, tokS,
acceptance, lastPrefill, lastInlineWarm, models, modelSummary, engines, memory, then
backend/variant (an in-process engine), the remote engine's fields, index/indexed (with an
index), sourceMemoryBytes/tokenCacheBytes (with an engine), recentJobs, inlineStore,
pendingFutures.
"""

from __future__ import annotations

import asyncio
from typing import Any

from echoline.sidecar import config as cfg
from echoline.sidecar.engine_choice import remote_status
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.worker import PRIMARY
from echoline.sidecar.workspace_index import normalize_uri

COMMAND = "echoline.status"


async def report(ls: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """The whole answer; ``args``: the command's arguments (an optional ``{uri}`` asks
    whether that file is indexed)."""
    out = overview(ls)
    engine = ls.worker.engine
    out.update(engine_fields(engine))
    if ls.index is not None:
        out.update(index_fields(ls, args))
    if engine is not None:
        out.update(await memory_on_worker(ls))
    out["recentJobs"] = [job.summary() for job in list(ls.worker.finished)]
    out["inlineStore"] = inline_store_fields(ls)
    # Handlers running + requests to the client unanswered (this command's own two
    # included): flat over a session, or something leaks (see EcholineProtocol).
    out["pendingFutures"] = ls.protocol.pending_futures()
    return out


def overview(ls: Any) -> dict[str, Any]:
    """What the server knows without asking anyone: model state, settings, the last
    figures, the background prefills' last runs, each job's model, this process's memory."""
    return {
        "state": ls.worker.state,
        "model": ls.worker.model_of(PRIMARY) or ls.settings.model,
        "error": ls.worker.error,
        "settings": cfg.as_lsp_dict(ls.settings),
        "tokS": ls.last_tok_s,
        "acceptance": ls.last_acceptance,
        "lastPrefill": ls.idle_prefill.last,
        "lastInlineWarm": ls.inline_warm.last,
        **ls.models_status(),
        "engines": ls.worker.engines(),
        "memory": resident_memory(),
    }


def engine_fields(engine: Any) -> dict[str, Any]:
    """The primary engine's backend (an in-process engine) and a shared server's figures
    (a remote one; nothing otherwise)."""
    out: dict[str, Any] = {}
    if isinstance(engine, EngineLike):
        out["backend"] = engine.backend_name
        out["variant"] = engine.backend_variant
    out.update(remote_status(engine))
    return out


def index_fields(ls: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """The workspace index's figures with the source updates still queued for the worker;
    with ``{uri}`` as the argument, ``indexed``: whether that file is a draft source."""
    out: dict[str, Any] = {"index": ls.index.stats().as_dict()}
    out["index"]["pendingSources"] = ls.worker.pending_sources()
    if args and isinstance(args[0], dict) and isinstance(args[0].get("uri"), str):
        uri = normalize_uri(args[0]["uri"])
        out["indexed"] = uri in ls.index.indexed_uris()
    return out


async def memory_on_worker(ls: Any) -> dict[str, Any]:
    """``sourceMemoryBytes`` and ``tokenCacheBytes``, measured on the worker thread (after
    pending source updates are applied: they would change both); None for both when the
    worker does not answer within ``readyTimeoutS`` or the measure fails."""
    worker = ls.worker
    try:
        src, cache = await asyncio.wait_for(
            asyncio.wrap_future(
                worker.submit(
                    lambda e, _c: (e.source_memory_bytes(), worker.token_cache_bytes()), kind="status"
                ).future
            ),
            ls.settings.ready_timeout_s,
        )
    except Exception:
        return {"sourceMemoryBytes": None, "tokenCacheBytes": None}
    return {"sourceMemoryBytes": src, "tokenCacheBytes": cache}


def inline_store_fields(ls: Any) -> dict[str, Any]:
    """Inline answers with no model run (typed through a suggestion, recent) and those that
    ran (misses), and the completions computed ahead (sidecar/inline_store.py)."""
    return {**ls.inline_store.hits, "ahead": ls.inline_ahead.runs,
            "aheadKept": ls.inline_ahead.kept, "aheadPending": ls.inline_ahead.pending,
            "lastRun": ls.inline_store.last_run}


def resident_memory() -> dict[str, int | None]:
    """This process's resident memory now and at its peak (``rssBytes``, ``peakRssBytes``:
    VmRSS and VmHWM of /proc/self/status; None where there is no /proc)."""
    out: dict[str, int | None] = {"rssBytes": None, "peakRssBytes": None}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out["rssBytes" if name == "VmRSS" else "peakRssBytes"] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out
