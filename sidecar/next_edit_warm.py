"""Warm a document's edit-prediction session at the cursor while the user reads.

Why: a prediction is asked right after the user's edit (``nextEditDebounceMs`` later), and
its prompt opens with the file around the cursor (``sidecar.next_edit.FILE_FIRST``): cold,
that block is most of the prompt (~2.3 s of the 0.5B's ~2.4 s on a 2-core CPU). The file
up to the editable region does not depend on the edit the user is about to make, so once the
cursor rests (``echoline/cursor``, or a didChange's end, as for the inline warm-up) this runs
it into the document's prediction session; the prediction after the edit then runs the
edits, the region and what changed. Only where predictions can ask the model
(``nextEdit`` on, ``nextEditPredictor`` "model" or "both"): the "repeat" predictor runs none.

A job of the idle-prefill kind on the inline engine (loaded or not: none runs before it is),
so it leaves inline work alone and any request stops it within a chunk; the life cycle is
``BackgroundPrefill``'s. Replies never change: the engine reuses a session's cache only as
far as it matches the prompt token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from echoline.sidecar.background_prefill import BackgroundPrefill, PrefillJob
from echoline.sidecar.config import Settings
from echoline.sidecar.lsp_utils import PositionError, check_position
from echoline.sidecar.next_edit import next_edit_warm_job
from echoline.sidecar.worker import EngineWorker
from lsprotocol import types


class NextEditWarm(BackgroundPrefill):
    """The prediction prompt's file block at each document's latest cursor, ``inlineWarmMs``
    after it rests."""

    key_name = "next-edit-warm"
    job_kind = "prefill"
    engine_job = "inline"
    delay_setting = "inline_warm_ms"

    def __init__(
        self, worker: EngineWorker, settings: Callable[[], Settings], notify: Callable[[dict[str, Any]], None],
        doc_of: Callable[[str], tuple[str, int | None] | None], encoding: Callable[[], str],
        path_of: Callable[[str], str], is_secret: Callable[[str], bool],
    ) -> None:  # fmt: skip
        super().__init__(worker, settings, notify)
        self._doc_of = doc_of  # uri -> (text, version) of the open document, or None
        self._encoding = encoding
        self._path_of = path_of  # uri -> the file's name in a prompt
        self._is_secret = is_secret
        self._cursor: dict[str, tuple[int | None, types.Position]] = {}

    def enabled(self, s: Settings) -> bool:
        return s.next_edit and s.next_edit_predictor in ("model", "both")

    def cursor(self, uri: str, version: int | None, position: types.Position) -> None:
        """The editor's cursor in ``uri`` (at ``version``; None: the text as it is)."""
        if not self.enabled(self._settings()):
            return
        for other in [u for u in self._cursor if u != uri]:
            self.closed(other)  # one cursor: a warm-up elsewhere is superseded
        self._cursor[uri] = (version, position)
        self.changed(uri)

    def closed(self, uri: str) -> None:
        self._cursor.pop(uri, None)
        self.forget(uri)

    def make_job(self, uri: str) -> PrefillJob | None:
        cur, doc = self._cursor.get(uri), self._doc_of(uri)
        if cur is None or doc is None or self._is_secret(uri):
            return None
        (version, position), (text, doc_version) = cur, doc
        if version is not None and version != doc_version:
            return None  # sent against other text: a newer change or cursor re-arms
        try:
            offset = check_position(text, position, self._encoding(), "position")
        except PositionError:
            return None
        s = self._settings()
        return next_edit_warm_job(self._path_of(uri), uri, text, offset, region_lines=s.next_edit_region_lines)
