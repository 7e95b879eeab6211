"""The real Qwen2.5-Coder-0.5B through the real server over stdio: FIM inline completion,
a rewrite applied as a versioned edit, a second request reusing the buffer's cache, and the
inline warm-up at a resting cursor.

The completion is checked against llama.cpp: on the same fill-in-the-middle layout its
greedy reply starts ``sum(xs) / len(xs)`` (tests/data/llamacpp-qwen.json, prompt "fim").
"""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.conftest import qwen_reference
from tests.test_sidecar_lsp import Recorder, open_doc, rewrite, rng, start_client, wait_state

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

MODEL = "qwen2.5-coder-0.5b"
PREFIX = "def mean(xs):\n    if not xs:\n        raise ValueError('empty')\n    return "
SUFFIX = "\n\nprint(mean([1, 2, 3]))\n"
SCALE = "import math\n\n\ndef scale(x, t):\n    return x * t\n\n\nprint(scale(2, 3))\n"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from echoline.engine.model_catalog import resolve_model

    resolve_model(MODEL)  # pull (and verify) before the server starts on a fresh machine
    root = tmp_path_factory.mktemp("qwen-ws")
    (root / "README.md").write_text("# demo\n")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lsp(workspace: Path):
    rec = Recorder()
    client = await start_client(workspace, {"model": MODEL, "maxTokens": 128, "inlineMaxTokens": 24}, rec)
    client.rec = rec  # type: ignore[attr-defined]
    ready = await wait_state(rec, {"ready", "error"})
    assert ready["state"] == "ready", ready
    yield client
    await client.shutdown_session()
    await client.stop()


async def test_fim_inline_completion_matches_llamacpp(lsp: LanguageClient, workspace: Path) -> None:
    reference = next(m for m in qwen_reference().values() if m["name"] == MODEL)["prompts"]["fim"]
    assert reference["greedy_text"].startswith("sum(xs) / len(xs)")
    uri = open_doc(lsp, workspace, PREFIX + SUFFIX, "stats_mean.py")
    pos = types.Position(line=3, character=len("    return "))
    res = await lsp.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    assert isinstance(res, types.InlineCompletionList) and len(res.items) == 1, res
    item = res.items[0]
    assert isinstance(item.insert_text, str)
    assert item.insert_text.startswith("sum(xs) / len(xs)"), item.insert_text
    assert item.range is not None and item.range.start == pos
    assert "<|" not in item.insert_text  # no control-token text leaks into the buffer


async def test_rewrite_applies_a_versioned_edit_and_reuses_the_cache(
    lsp: LanguageClient, workspace: Path
) -> None:
    uri = open_doc(lsp, workspace, SCALE, "scale_q.py")
    lsp.rec.edits.clear()
    res = await rewrite(lsp, uri=uri, version=1, range=rng(3, 0, 5, 0),
                        instruction="Rename the parameter t to weight.", mode="apply")
    assert res["applied"] is True, res
    assert res["text"] == "def scale(x, weight):\n    return x * weight\n", res["text"]
    [edit] = lsp.rec.edits
    dc = edit.edit.document_changes[0]
    assert dc.text_document.uri == uri and dc.text_document.version == 1
    edited = SCALE.replace("def scale(x, t):\n    return x * t\n", dc.edits[0].new_text)
    ast.parse(edited)
    assert res["stats"]["generated_tokens"] > 0
    # A second request on the same (unchanged) buffer prefills only what follows the file.
    again = await rewrite(lsp, uri=uri, version=1, range=rng(7, 0, 8, 0), mode="preview")
    assert again["stats"]["reused_tokens"] >= 30, again["stats"]
    assert again["text"].startswith("print("), again["text"]  # (the 0.5B may simplify it)


async def test_cursor_warm_up_then_completion_equals_a_cold_one(lsp: LanguageClient, workspace: Path) -> None:
    """``echoline/cursor`` as the editor plugins send it, deep in a real source file: the
    server runs the inline prompt there with the default model (every prompt token cached
    but the last), and the completion asked at that cursor next is the one the engine gives
    on a cold cache, with plain decoding, for the same request (``sidecar.inline.inline_job``)."""
    from echoline.engine.api import Engine
    from echoline.sidecar.inline import inline_job

    text = (Path(__file__).resolve().parents[1] / "engine" / "generate.py").read_text()
    lines = text.split("\n")
    row = next(i for i in range(int(len(lines) * 0.6), len(lines)) if lines[i].strip().startswith("return "))
    pos = types.Position(line=row, character=lines[row].index("return ") + len("return "))  # mid-line
    uri = open_doc(lsp, workspace, text, "generate_copy.py")
    seen = len(lsp.rec.inline_warms)
    lsp.protocol.notify("echoline/cursor", {"textDocument": {"uri": uri, "version": 1},
                                            "position": {"line": pos.line, "character": pos.character}})
    end = time.monotonic() + 300
    done = None
    while done is None and time.monotonic() < end:
        done = next((w for w in lsp.rec.inline_warms[seen:] if w["uri"] == uri and w["state"] != "started"), None)
        await asyncio.sleep(0.1)
    assert done is not None and done["state"] == "done", done
    detail = done["detail"]
    assert detail["mode"] == "fim" and detail["tokens"] > 1000 and detail["cached"] == detail["tokens"] - 1, detail

    res = await lsp.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    offset = sum(len(line) + 1 for line in lines[:row]) + pos.character
    # the warmed cursor's prompt has the long head (cached); a cold engine would ask with the
    # short one (sidecar.inline.choose_head), so the reference asks with the long head too
    # and with the server's suffix budget: it is measured once per process (a cold engine in
    # this process may measure another power of two on a busy machine), so the warm-up
    # reports the one it used
    cold = inline_job(text[:offset], text[offset:], lines[row][: pos.character], "file:///cold.py", 24, False,
                      detail["suffix_tokens"], auto_suffix=False, short_head=False)(Engine.load(MODEL), threading.Event())
    assert cold.text, "the cold request completes something there"
    assert isinstance(res, types.InlineCompletionList)
    assert len(res.items) == 1 and res.items[0].insert_text == cold.text, (res.items, cold.text)
