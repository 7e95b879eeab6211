"""Prefill on idle (sidecar.idle_prefill): over stdio, the REAL default model (smollm2).

Two servers: ``on`` prefills a document's rewrite prefix after a short idle delay,
``off`` never does (the reference). The same request on the same text must give the
same reply on both; on ``on`` it prefills only the prompt's tail.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.test_sidecar_lsp import (
    Recorder,
    _plain,
    open_doc,
    rewrite,
    rng,
    start_client,
    wait_state,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

IDLE_MS = 100


def source(functions: int) -> str:
    """A plain Python file of ``functions`` small distinct functions."""
    parts = []
    for i in range(functions):
        parts.append(
            f"def scale_{i}(values, factor={i + 2}):\n"
            f'    """Multiply each value by {i + 2} and drop negatives ({i})."""\n'
            f"    out = [v * factor for v in values if v >= {i % 5}]\n"
            f"    return sorted(out)[: {i + 3}]\n\n"
        )
    return "".join(parts)


def _deep(obj: Any) -> Any:
    """pygls hands unknown notifications' params over as (nested) namedtuples."""
    if hasattr(obj, "_asdict") or isinstance(obj, dict):
        return {k: _deep(v) for k, v in _plain(obj).items()}
    return obj


async def _server(root: Path, prefill: bool) -> LanguageClient:
    rec = Recorder()
    opts = {"model": "smollm2", "maxTokens": 80, "prefillOnIdle": prefill, "prefillIdleMs": IDLE_MS}
    client = await start_client(root, opts, rec)
    client.rec = rec  # type: ignore[attr-defined]
    client.prefills = []  # type: ignore[attr-defined]

    @client.feature("echoline/prefill")
    def _prefill(params: Any) -> None:
        client.prefills.append(_deep(params))  # type: ignore[attr-defined]

    await wait_state(rec, {"ready", "error"})
    return client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory):
    from echoline.engine.model_catalog import resolve_model

    resolve_model("smollm2")
    on_root, off_root = tmp_path_factory.mktemp("on"), tmp_path_factory.mktemp("off")
    # One after the other: two servers loading at once on a 2-core machine time their
    # forwards against each other (numba's OpenMP threads spin in both processes).
    on = await _server(on_root, True)
    off = await _server(off_root, False)
    yield on, on_root, off, off_root
    for client in (on, off):
        await client.shutdown_session()
        await client.stop()


async def wait_prefill(client: Any, uri: str, states: set[str], after: int = 0, timeout: float = 60) -> dict:
    """The first echoline/prefill notification for ``uri`` in ``states`` (index >= after)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for note in client.prefills[after:]:
            if note.get("uri") == uri and note.get("state") in states:
                return note
        await asyncio.sleep(0.005)
    raise AssertionError(f"no prefill {states} for {uri}; got {client.prefills}")


def edit_line(client: LanguageClient, uri: str, version: int, line: int, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=types.Position(line=line, character=0),
                                      end=types.Position(line=line, character=0)),
                    text=text,
                )
            ],
        )
    )


async def test_prefix_ids_are_a_token_prefix_of_every_rewrite_prompt() -> None:
    from echoline.engine.api import Engine
    from echoline.sidecar.prompts import (
        MAX_FILE_CHARS,
        rewrite_prefix_ids,
        rewrite_prompt,
        rewrite_prompt_ids,
    )

    engine = Engine.load("smollm2")
    for text in (source(6), source(6).rstrip("\n"), "x = 1", "print('hi')\n\n\n"):
        name = "file:///w/mod.py"
        prefix = rewrite_prefix_ids(engine, text, name=name)
        assert prefix and len(prefix) > 10
        for start, end in ((0, len(text)), (len(text) // 2, len(text)), (0, 1)):
            for instruction in ("", "rename factor to k"):
                ids = rewrite_prompt_ids(engine, rewrite_prompt(text, start, end, instruction, name=name))
                assert ids[: len(prefix)] == prefix
                assert len(ids) - len(prefix) < 60 + (end - start)  # only the volatile tail is left
    big = "y = 0\n" * (MAX_FILE_CHARS // 6 + 10)
    assert rewrite_prefix_ids(engine, big, name="file:///w/big.py") is None  # window follows the selection


async def test_rewrite_after_idle_prefill_prefills_only_the_tail_and_matches(servers) -> None:
    on, on_root, off, off_root = servers
    text = source(14)
    sel = rng(1 + 5 * 7, 0, 1 + 5 * 7 + 4, 0)  # one function, below the edited first line
    # Reference: no idle prefill; the whole prompt is prefilled by the request.
    ref_uri = open_doc(off, off_root, text, name="mod.py")
    edit_line(off, ref_uri, 2, 0, "# tuned\n")
    await asyncio.sleep(3 * IDLE_MS / 1000)
    ref = await rewrite(off, uri=ref_uri, version=2, range=sel, mode="preview")
    assert not off.prefills
    assert ref["stats"]["prefilled_tokens"] > 0.9 * ref["stats"]["prompt_tokens"]

    uri = open_doc(on, on_root, text, name="mod.py")
    first = await wait_prefill(on, uri, {"done", "cancelled", "failed"})
    assert first["state"] == "done", first
    mark = len(on.prefills)
    edit_line(on, uri, 2, 0, "# tuned\n")
    done = await wait_prefill(on, uri, {"done", "cancelled", "failed"}, after=mark)
    assert done["state"] == "done", done
    detail = done["detail"]
    assert detail["cached"] == detail["tokens"] - 1
    res = await rewrite(on, uri=uri, version=2, range=sel, mode="preview")
    st = res["stats"]
    assert st["prompt_tokens"] == ref["stats"]["prompt_tokens"]
    assert st["reused_tokens"] >= detail["cached"]
    assert st["prefilled_tokens"] < 0.25 * st["prompt_tokens"], st
    assert res["text"] == ref["text"] and res["finishReason"] == ref["finishReason"]
    assert st["generated_tokens"] == ref["stats"]["generated_tokens"]


async def test_request_during_idle_prefill_cancels_it_and_matches(servers) -> None:
    on, on_root, off, off_root = servers
    # ~1k tokens: 16 of idle prefill's 64-token chunks, seconds of work even on a fast
    # machine, so the request lands inside it (a 3k-token file took 2 minutes on 2 cores).
    text = source(30)
    sel = rng(5 * 15, 0, 5 * 15 + 4, 0)
    ref_uri = open_doc(off, off_root, text, name="big.py")
    ref = await rewrite(off, uri=ref_uri, version=1, range=sel, mode="preview")

    mark = len(on.prefills)
    uri = open_doc(on, on_root, text, name="big.py")
    started = await wait_prefill(on, uri, {"started"}, after=mark)
    assert started["tokens"] > 600
    res = await rewrite(on, uri=uri, version=1, range=sel, mode="preview")
    stopped = await wait_prefill(on, uri, {"done", "cancelled", "failed"}, after=mark)
    assert stopped["state"] == "cancelled", stopped
    assert stopped["cancelled"] and stopped["stopLatencyS"] is not None
    assert stopped["detail"]["cached"] < stopped["detail"]["tokens"] - 1
    st = res["stats"]
    assert st["reused_tokens"] == stopped["detail"]["cached"]  # the chunks done were kept
    assert res["text"] == ref["text"] and res["finishReason"] == ref["finishReason"]
    assert st["generated_tokens"] == ref["stats"]["generated_tokens"]
    await asyncio.sleep(3 * IDLE_MS / 1000)
    # The request covered the prefix itself: no idle prefill is rescheduled after it.
    assert not [n for n in on.prefills[mark:] if n.get("state") == "started" and n is not started]


async def test_settings_validated(servers) -> None:
    on, *_ = servers
    n = len(on.messages)
    on.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"echoline": {"prefillIdleMs": -5, "prefillOnIdle": "yes"}})
    )
    end = time.monotonic() + 5
    while len(on.messages) < n + 2 and time.monotonic() < end:
        await asyncio.sleep(0.02)
    text = " ".join(m.message for m in on.messages[n:])
    assert "prefillIdleMs" in text and "prefillOnIdle" in text
    st = await on.workspace_execute_command_async(
        types.ExecuteCommandParams(command="echoline.status", arguments=[])
    )
    assert st["settings"]["prefillOnIdle"] is True and st["settings"]["prefillIdleMs"] == IDLE_MS
    assert st["lastPrefill"] is not None
