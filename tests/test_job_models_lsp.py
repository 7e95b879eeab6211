"""A model per job over stdio (issue 49), with two small real models: rewriteModel
smollm2, inlineModel gemma3-270m. Each job runs on its own engine; the inline engine
loads on the first inline request, not before; one model named for both jobs is one
engine; and an inline completion is the same whether or not the other model is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from echoline.sidecar.lsp_utils import plain_params
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.test_sidecar_lsp import (
    Recorder,
    inline_params,
    open_doc,
    rewrite,
    start_client,
    status,
    wait_state,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

TEXT = (
    "import math\n\n\n"
    "def area(radius):\n"
    '    """Area of a circle."""\n'
    "    return math.pi * radius ** 2\n\n\n"
    "def circumference(radius):\n"
    "    return 2 * math.pi * "
)
CURSOR = (9, len("    return 2 * math.pi * "))


async def _inline(client: LanguageClient, uri: str) -> str:
    res = await client.text_document_inline_completion_async(inline_params(uri, *CURSOR))
    return res.items[0].insert_text if res is not None and res.items else ""


def _engines(st: dict[str, Any]) -> dict[str, list[str]]:
    return {e["model"]: e["jobs"] for e in st["engines"]}


@pytest.fixture
def models() -> tuple[Path, Path]:
    from echoline.engine.model_catalog import resolve_model

    return Path(resolve_model("smollm2")), Path(resolve_model("gemma3-270m"))


async def test_each_job_runs_on_its_own_engine_loaded_lazily(tmp_path: Path, models: tuple[Path, Path]) -> None:
    smol, gemma = models
    # readyTimeoutS: the inline request waits for its engine's load (a hang guard, not a speed check)
    opts = {"maxTokens": 48, "inlineMaxTokens": 12, "prefillOnIdle": False, "inlineWarm": False,
            "readyTimeoutS": 600}

    # One model named for both jobs: one engine serves both (one load).
    rec = Recorder()
    client = await start_client(tmp_path, {**opts, "model": "gemma3-270m"}, rec)
    try:
        assert (await wait_state(rec, {"ready", "error"}))["state"] == "ready", rec.status
        uri = open_doc(client, tmp_path, TEXT, "alone.py")
        alone = await _inline(client, uri)
        st = await status(client)
        assert _engines(st) == {gemma.name: ["inline", "rewrite"]}
        assert {j: m["model"] for j, m in st["models"].items()} == {"rewrite": "gemma3-270m", "inline": "gemma3-270m"}
    finally:
        await client.shutdown_session()
        await client.stop()
    assert alone, "gemma wrote no completion here: pick another cursor"

    # rewriteModel smollm2, inlineModel gemma: the rewrite engine at start, gemma on first use.
    rec = Recorder()
    client = await start_client(tmp_path, {**opts, "rewriteModel": "smollm2", "inlineModel": "gemma3-270m"}, rec)
    try:
        ready = plain_params(await wait_state(rec, {"ready", "error"}))  # nested namedtuples -> dicts
        assert ready["state"] == "ready", rec.status
        assert ready["models"]["inline"]["state"] == "idle" and ready["models"]["rewrite"]["model"] == "smollm2"
        assert "rewrite: smollm2 (rewriteModel setting)" in ready["modelSummary"]
        uri = open_doc(client, tmp_path, TEXT, "both.py")
        res = await rewrite(client, uri=uri, version=1, mode="preview", instruction="Rename radius to r.",
                            range={"start": {"line": 3, "character": 0}, "end": {"line": 6, "character": 0}})
        assert "text" in res
        st = await status(client)
        assert _engines(st) == {smol.name: ["rewrite"]}, st["engines"]  # still no inline engine
        assert st["models"]["inline"]["state"] == "idle"
        rss_one = st["memory"]["rssBytes"]

        both = await _inline(client, uri)
        st = await status(client)
        assert _engines(st) == {smol.name: ["rewrite"], gemma.name: ["inline"]}, st["engines"]
        assert st["models"]["inline"]["state"] == "ready"
        ran = {j["kind"]: j["model"] for j in st["recentJobs"]}
        assert ran == {"rewrite": smol.name, "inline": gemma.name}, st["recentJobs"]
        assert st["memory"]["rssBytes"] is None or st["memory"]["rssBytes"] > rss_one * 0.9
        # The inline engine's load had a progress bar of its own, naming its job.
        begins = [v[0].message for v in client.progress_reports.values()
                  if v and isinstance(v[0], types.WorkDoneProgressBegin)]
        assert any("gemma3-270m (for inline)" in (m or "") for m in begins), begins
    finally:
        await client.shutdown_session()
        await client.stop()
    assert both == alone  # the second model being loaded changes no inline completion
