"""Edit-prediction requests: their params, the checks before the job, and the two answer shapes.

Why apart from ``server.py``: two methods answer the same prediction (``echoline/nextEdit``
and ``textDocument/copilotInlineEdit``, the request GitHub's Copilot language server serves
for next edit suggestions, spoken by copilot-lsp and sidekick.nvim), so their shared steps
live here once and the handlers stay a few lines each.

``textDocument/copilotInlineEdit``'s shape, as copilot-lsp's client sends and reads it
(github.com/copilotlsp-nvim/copilot-lsp: ``lua/copilot-lsp/nes/init.lua`` builds the params
with ``make_position_params(0, "utf-16")`` plus ``textDocument.version``, and reads
``result.edits[i].{range, text, textDocument, command}`` (``lua/copilot-lsp/types.lua``);
it errors on a null result, assumes UTF-16, and after showing one notifies
``textDocument/didShowInlineEdit`` with ``{item: {command}}``):

    params  {textDocument: {uri, version}, position}
    result  {edits: [{range, text, textDocument: {uri, version}, command?}]}

Its positions are UTF-16 whatever encoding was negotiated (its clients assume it).
``echoline/nextEdit`` takes the same params in the negotiated encoding and answers
``{textDocument: {uri, version}, edits: [{range, newText}], id}``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echoline.sidecar.lsp_utils import checked_offset, get_doc, parse_position, plain_params
from echoline.sidecar.next_edit import NextEditOutcome, next_edit_job
from echoline.sidecar.next_edit_repeat import repeat_last_edit
from echoline.sidecar.worker import JobCancelled
from echoline.sidecar.workspace_index import in_secret_dir, is_secret_name, normalize_uri
from lsprotocol import types
from pygls import uris
from pygls.exceptions import JsonRpcException

NEXT_EDIT = "echoline/nextEdit"
COPILOT_INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW_INLINE_EDIT = "textDocument/didShowInlineEdit"
DID_FOCUS = "textDocument/didFocus"
CONTENT_MODIFIED = -32801  # LSP ContentModified: the request's version is not the document's

_ids = itertools.count(1)


@dataclass
class Answer:
    """A prediction for ``uri`` at ``version``: LSP edits in the request's encoding."""

    uri: str
    version: int | None
    edits: list[tuple[types.Range, str]] = field(default_factory=list)
    reason: str = ""
    superseded: bool = False  # the document changed (or the request was cancelled) meanwhile
    id: str = field(default_factory=lambda: f"ne-{next(_ids)}")


def parse(params: Any) -> tuple[str, int | None, types.Position]:
    """(uri, version or None, position) of either method; a clear InvalidParams otherwise."""
    raw = plain_params(params)
    if not isinstance(raw, dict):
        raise JsonRpcException("params must be an object {textDocument, position}", code=-32602)
    doc = raw.get("textDocument")
    uri = doc.get("uri") if isinstance(doc, dict) else None
    if not isinstance(uri, str) or not uri:
        raise JsonRpcException("textDocument.uri must be a non-empty string", code=-32602)
    version = doc.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise JsonRpcException("textDocument.version must be an integer", code=-32602)
    try:
        pos = parse_position(raw.get("position"), "position")
    except ValueError as exc:
        raise JsonRpcException(str(exc), code=-32602) from None
    return uri, version, pos


def secret_rule(index_of: Callable[[], Any]) -> Callable[[str], bool]:
    """``uri`` -> secret? The workspace index's rule for buffers (name, folders, symlink
    target) when there is an index; the name and folder rules alone before that."""

    def is_secret(uri: str) -> bool:
        path = uris.to_fs_path(uri)
        index = index_of()
        if index is not None:
            return bool(index._buffer_is_secret(normalize_uri(uri), path))  # the index's own rule
        if not path:
            return is_secret_name(uri.rsplit("/", 1)[-1])
        return is_secret_name(Path(path).name) or in_secret_dir(Path(path))

    return is_secret


def prompt_path(uri: str, root: str | None) -> str:
    """The file's name in a prompt: relative to the workspace root when inside it."""
    path = uris.to_fs_path(uri) or uri.rsplit("/", 1)[-1]
    if root:
        rel = os.path.relpath(path, root)
        if not rel.startswith(".."):
            return rel.replace(os.sep, "/")
    return os.path.basename(path)


def _stale(uri: str, version: int, current: int | None) -> JsonRpcException:
    return JsonRpcException(f"stale version: the request is for version {version} but {uri} is at version "
                            f"{current}; nothing predicted", code=CONTENT_MODIFIED)


async def predict(ls: Any, uri: str, version: int | None, pos: types.Position, encoding: str) -> Answer:
    """Check the request against the document, wait out the debounce, run the job on the
    inline job's engine, and convert its edit. Raises: unknown document, a position past
    the text (InvalidParams), a stale version (ContentModified). A document changed while
    waiting or predicting gives ``superseded``."""
    doc = get_doc(ls.workspace, uri)
    if version is not None and doc.version != version:
        raise _stale(uri, version, doc.version)
    # The text of this version, read before the first await (see ``server.serve``).
    text, version = doc.source, doc.version
    offset = checked_offset(text, pos, encoding, "position")
    s = ls.settings
    if not s.next_edit:
        return Answer(uri, version, reason="disabled")
    if ls.edit_history.is_secret(uri):
        return Answer(uri, version, reason="secret file")
    wait = s.next_edit_debounce_ms / 1000.0 - ls.edit_history.since_change(uri)
    if wait > 0:
        await asyncio.sleep(wait)
    if get_doc(ls.workspace, uri).version != version:
        return Answer(uri, version, reason="superseded", superseded=True)
    events = ls.edit_history.events()
    if s.next_edit_predictor in ("repeat", "both"):  # no model: answered at once
        edit = repeat_last_edit(text, offset, events[-1] if events else None, s.next_edit_region_lines)
        if edit is not None:
            return Answer(uri, version, [edit.lsp(text, encoding)], "repeats the last edit")
        if s.next_edit_predictor == "repeat":
            return Answer(uri, version, reason="no place repeats the last edit")
    ls.ensure_engine("inline")  # the inline job's engine: loaded on first use
    if await ls.wait_for_model(None, "inline") != "ready":
        return Answer(uri, version, reason="model not ready")
    job = next_edit_job(prompt_path(uri, ls.workspace.root_path), uri, text, offset, events,
                        spec=s.speculation, region_lines=s.next_edit_region_lines)
    try:
        out: NextEditOutcome = await ls.run_job(job, kind="next_edit", key=("next-edit", uri))
    except JobCancelled:  # a newer request for this document, or the client's cancel
        out = None
    changed = get_doc(ls.workspace, uri).version != version
    if changed:  # an edit came meanwhile: this prediction is for older text
        return Answer(uri, version, reason="superseded by an edit", superseded=True)
    if out is None or out.reason == "cancelled":
        return Answer(uri, version, reason="cancelled")
    ls.note_stats(out.stats)
    return Answer(uri, version, [e.lsp(text, encoding) for e in out.edits], out.reason)


def _range(conv: Any, rng: types.Range) -> Any:
    return conv.unstructure(rng)


def next_edit_result(ans: Answer, conv: Any) -> dict[str, Any]:
    """``echoline/nextEdit``'s answer."""
    if ans.superseded:
        raise JsonRpcException(f"{ans.uri} changed while predicting; ask again", code=CONTENT_MODIFIED)
    return {"textDocument": {"uri": ans.uri, "version": ans.version},
            "edits": [{"range": _range(conv, r), "newText": t} for r, t in ans.edits],
            "id": ans.id, "reason": ans.reason}


def copilot_result(ans: Answer, conv: Any) -> dict[str, Any]:
    """``textDocument/copilotInlineEdit``'s answer: ``{edits: []}`` when there is nothing
    (never null, never an error for a superseded request: its clients show errors)."""
    if ans.superseded:
        return {"edits": []}
    return {"edits": [{"range": _range(conv, r), "text": t,
                       "textDocument": {"uri": ans.uri, "version": ans.version}}
                      for r, t in ans.edits]}
