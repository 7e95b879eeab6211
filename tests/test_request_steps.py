"""The request modules' steps without a server: the parts of ``echoline.rewrite``,
``textDocument/inlineCompletion`` and ``echoline.status`` that the handlers in
sidecar/server.py only call (tests/test_sidecar_lsp.py runs them through a real server).

A ``SimpleNamespace`` stands in for the server: each step reads only the attributes it
names, which is what lets the steps live apart from ``server.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from echoline.sidecar import inline_request, rewrite_request, status
from echoline.sidecar.lsp_utils import UTF16
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.workspace import TextDocument

URI = "file:///tmp/steps.py"
TEXT = "def f(x):\n    return x + 1\n"


def server(text: str = TEXT, version: int = 4, **more: Any) -> SimpleNamespace:
    docs = {URI: TextDocument(URI, text, version=version)}
    return SimpleNamespace(workspace=SimpleNamespace(text_documents=docs), position_encoding=UTF16, **more)


def pos(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def args(version: int, start: types.Position, end: types.Position) -> rewrite_request.RewriteArgs:
    return rewrite_request.RewriteArgs(URI, version, types.Range(start=start, end=end))


def test_check_document_reads_the_range_in_the_requested_version() -> None:
    target = rewrite_request.check_document(server(), args(4, pos(1, 4), pos(1, 16)))
    assert target.text == TEXT and TEXT[target.start : target.end] == "return x + 1"


def test_check_document_refuses_another_version_and_a_range_past_the_text() -> None:
    with pytest.raises(JsonRpcException) as err:
        rewrite_request.check_document(server(), args(3, pos(0, 0), pos(1, 0)))
    assert err.value.code == -32801 and "stale version" in str(err.value)
    with pytest.raises(JsonRpcException) as err:
        rewrite_request.check_document(server(), args(4, pos(0, 0), pos(9, 0)))
    assert err.value.code == -32602 and "range.end" in str(err.value)


def edit_server(answer: Any, timeout_s: float = 5.0) -> SimpleNamespace:
    async def apply(_params: types.ApplyWorkspaceEditParams) -> Any:
        if isinstance(answer, Exception):
            raise answer
        if answer is None:
            await asyncio.sleep(60)
        return answer

    return SimpleNamespace(workspace_apply_edit_async=apply, apply_edit_timeout_s=timeout_s)


@pytest.mark.parametrize(("answer", "expected"), [
    (types.ApplyWorkspaceEditResult(applied=True), (True, "applied", "applied")),
    (types.ApplyWorkspaceEditResult(applied=False, failure_reason="read-only"), (False, "read-only", "not applied")),
    (RuntimeError("gone"), (False, "workspace/applyEdit failed: gone", "client refused the edit")),
])
async def test_apply_edit_reports_what_the_editor_answered(answer: Any, expected: tuple) -> None:
    edit = types.WorkspaceEdit(changes={})
    assert await rewrite_request.apply_edit(edit_server(answer), edit, 4) == expected


async def test_apply_edit_gives_up_on_an_editor_that_never_answers() -> None:
    applied, reason, shown = await rewrite_request.apply_edit(edit_server(None, 0.05), types.WorkspaceEdit(), 7)
    assert not applied and "within 0.05 s" in reason and "version 7" in reason
    assert shown == "no answer from the editor"


def test_read_request_takes_the_text_and_cursor_before_any_wait() -> None:
    ls = server(inline_head_starts=SimpleNamespace(edits=lambda uri: 2), inline_asked=False)
    req = inline_request.read_request(ls, URI, pos(1, 11))
    assert ls.inline_asked  # only a client that asks gets warm-ups
    assert (req.version, req.edits, req.offset) == (4, 2, TEXT.index("x + 1"))
    assert req.prefix + req.suffix == TEXT and req.rest == "x + 1"
    with pytest.raises(JsonRpcException):
        inline_request.read_request(ls, URI, pos(0, 40))


def test_inline_list_replaces_the_rest_of_the_line_it_repeats() -> None:
    (item,) = inline_request.inline_list(pos(0, 6), "):", "x):", UTF16).items
    assert item.insert_text == "x):" and item.range.end == pos(0, 8)  # the auto-closed "):" replaced
    (item,) = inline_request.inline_list(pos(0, 6), " y", "x):", UTF16).items
    assert item.range.end == pos(0, 6)  # a pure insertion: the rest stays
    assert inline_request.inline_list(pos(0, 6), "):", "", UTF16).items == []


def test_status_index_fields_answer_whether_a_file_is_indexed() -> None:
    index = SimpleNamespace(stats=lambda: SimpleNamespace(as_dict=lambda: {"files": 1}),
                            indexed_uris=lambda: {URI})
    ls = SimpleNamespace(index=index, worker=SimpleNamespace(pending_sources=lambda: 0))
    assert status.index_fields(ls, ()) == {"index": {"files": 1, "pendingSources": 0}}
    assert status.index_fields(ls, ({"uri": URI},))["indexed"] is True
    assert status.index_fields(ls, ({"uri": "file:///tmp/other.py"},))["indexed"] is False


def test_status_memory_is_none_when_the_worker_does_not_answer() -> None:
    import concurrent.futures

    never = SimpleNamespace(future=concurrent.futures.Future())
    ls = SimpleNamespace(worker=SimpleNamespace(submit=lambda *a, **k: never),
                         settings=SimpleNamespace(ready_timeout_s=0.05))
    got = asyncio.run(status.memory_on_worker(ls))
    assert got == {"sourceMemoryBytes": None, "tokenCacheBytes": None}


def test_resident_memory_reads_proc_where_there_is_one() -> None:
    mem = status.resident_memory()
    assert set(mem) == {"rssBytes", "peakRssBytes"}
    if mem["rssBytes"] is not None:
        assert 0 < mem["rssBytes"] <= mem["peakRssBytes"]  # type: ignore[operator]
