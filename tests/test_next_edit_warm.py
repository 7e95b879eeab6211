"""The edit prediction's file block, warmed at a resting cursor (``sidecar/next_edit_warm.py``).

Before the user's edit, the prompt's start up to the editable region is fixed by the
cursor's place (``sidecar.next_edit.warm_ids``); warmed into the document's prediction
session, the prediction after the edit runs only the rest. The reply is the same as a
cold one's, token for token.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from echoline.sidecar import config as cfg
from echoline.sidecar.bench.next_edit import case_events, load_cases
from echoline.sidecar.next_edit import (
    next_edit_session,
    next_edit_warm_job,
    prompt_parts,
    run_next_edit,
    warm_ids,
)
from echoline.sidecar.next_edit_warm import NextEditWarm

from tests.synth import write_fim_qwen2_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from echoline.engine.api import Engine

    path: Path = write_fim_qwen2_model(tmp_path_factory.mktemp("nesw") / "fim-qwen2.gguf", seed=4, context=16384)
    return Engine.load(str(path))


def test_a_warmed_file_block_leaves_the_prediction_the_rest_and_the_same_reply(engine: Any) -> None:
    for case in load_cases(split="tune")[:3]:
        uri = "file:///" + case.path
        parts = prompt_parts(case.path, case.edited, case.cursor, case_events(case), uri)
        cold = run_next_edit(engine, parts, spec=False, session=None)  # nothing cached: the whole prompt
        assert cold.stats["prefilled_tokens"] == cold.prompt_tokens
        report = next_edit_warm_job(case.path, uri, case.edited, case.cursor)(engine, threading.Event(), None)
        block = warm_ids(engine, parts)
        assert report is not None and report["state"] == "done" and report["tokens"] == len(block) > 50, report
        warmed = run_next_edit(engine, parts, spec=True, session=next_edit_session(uri))
        assert warmed.stats["prefilled_tokens"] <= warmed.prompt_tokens - len(block) + 2, warmed.stats
        used = warmed.used_tokens
        assert used == cold.used_tokens and warmed.token_ids[:used] == cold.token_ids[:used]
        assert warmed.edits == cold.edits and warmed.reason == cold.reason
        engine.sessions.drop(next_edit_session(uri))


def test_only_formats_with_the_file_first_are_warmed(engine: Any) -> None:
    case = load_cases(split="tune")[0]
    parts = prompt_parts(case.path, case.edited, case.cursor, case_events(case), "file:///x.py")
    assert warm_ids(engine, parts, "zeta") == [] and warm_ids(engine, parts, "chat") == []
    assert warm_ids(engine, parts, "sweep") == warm_ids(engine, parts, "filesep")


@pytest.mark.parametrize(("on", "predictor", "warmed"), [
    (False, "model", False), (True, "repeat", False), (True, "model", True), (True, "both", True)])  # fmt: skip
def test_warmed_only_where_predictions_ask_the_model(on: bool, predictor: str, warmed: bool) -> None:
    settings = cfg.Settings(next_edit=on, next_edit_predictor=predictor)
    warm = NextEditWarm(None, lambda: settings, lambda _i: None, lambda _u: None, lambda: "utf-16",  # type: ignore[arg-type]
                        lambda u: u, lambda _u: False)
    assert warm.enabled(settings) is warmed
