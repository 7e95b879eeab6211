"""``echoline.rewrite`` apart from the server: its arguments through the lsprotocol converter,
and ``decide``, the one place a finished reply becomes an answer."""

from __future__ import annotations

import pytest
from echoline.sidecar import rewrite_request as rr
from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.exceptions import JsonRpcInvalidParams

OK = {"uri": "file:///a.py", "version": 3, "range": {"start": {"line": 0, "character": 1},
                                                     "end": {"line": 2, "character": 0}}}


@pytest.fixture(scope="module")
def converter():
    c = get_converter()
    rr.register(c)
    return c


def test_arguments_structure_into_rewrite_args(converter) -> None:
    args = rr.rewrite_args(converter, ({**OK, "instruction": "Rename x.", "mode": "preview"},))
    assert args == rr.RewriteArgs("file:///a.py", 3, types.Range(types.Position(0, 1), types.Position(2, 0)),
                                  "Rename x.", "preview")
    plain = rr.rewrite_args(converter, ({**OK, "instruction": None, "mode": None},))
    assert (plain.instruction, plain.mode) == ("", "apply")


@pytest.mark.parametrize(("args", "words"), [
    ((), "ONE argument"),
    ((OK, OK), "ONE argument"),
    ((None,), "ONE argument"),
    (({**OK, "version": True},), "'version' must be an integer"),
    (({**OK, "uri": ""},), "'uri'"),
    (({**OK, "range": [0, 1]},), "'range' must be {start, end}"),
    (({**OK, "range": {"start": {"line": -1, "character": 0}, "end": {"line": 0, "character": 0}}},),
     "range.start -1:0 is negative"),
    (({**OK, "range": {"start": {"line": 2, "character": 0}, "end": {"line": 0, "character": 0}}},),
     "range.end is before range.start"),
    (({**OK, "instruction": 5},), "'instruction' must be a string, got int"),
    (({**OK, "mode": "yolo"},), "'mode' must be \"apply\" or \"preview\", got 'yolo'"),
])
def test_bad_arguments_are_invalid_params_that_name_the_field(converter, args, words) -> None:
    with pytest.raises(JsonRpcInvalidParams) as err:
        rr.rewrite_args(converter, args)
    assert words in str(err.value)


def facts(**kw):
    base = {"finish_reason": "stop", "mode": "apply", "max_tokens": 512, "request_cancelled": False,
            "version": 3, "current_version": 3}
    return rr.decide(**{**base, **kw})


def test_a_complete_reply_on_an_unchanged_document_is_applied() -> None:
    assert facts().apply


@pytest.mark.parametrize(("kw", "reason", "shown"), [
    ({"finish_reason": "cancelled"}, "cancelled", "cancelled"),
    ({"request_cancelled": True}, "cancelled", "cancelled"),
    ({"mode": "preview"}, "preview", "preview ready"),
    ({"finish_reason": "length", "max_tokens": 7}, "maxTokens (7)", "reply truncated; not applied"),
    ({"current_version": 4}, "version 3 -> 4", "document changed; not applied"),
    ({"current_version": None}, "version 3 -> None", "document changed; not applied"),
])
def test_every_other_outcome_is_answered_unapplied_with_its_reason(kw, reason, shown) -> None:
    v = facts(**kw)
    assert not v.apply and reason in v.reason and v.progress == shown
    assert v.edit_in_answer == (kw == {"mode": "preview"})


def test_precedence_follows_what_the_user_would_want_to_know_first() -> None:
    # a preview is still shown when the document moved on or the request was cancelled
    # after the reply finished; a truncated reply is reported before a document change
    assert facts(mode="preview", current_version=9, request_cancelled=True).reason == "preview"
    assert "maxTokens" in facts(finish_reason="length", current_version=9).reason
    assert facts(finish_reason="cancelled", mode="preview").reason == "cancelled"


def test_no_confident_edit_is_answered_with_its_reason_and_not_applied() -> None:
    why = "no confident edit: the model returned the selection unchanged"
    v = facts(refusal=why)
    assert not v.apply and v.reason == why and not v.edit_in_answer
    assert v.progress == "no confident edit; not applied"
    assert facts(refusal=why, current_version=9).reason == why  # before a document change
    assert facts(mode="preview", refusal=why).edit_in_answer  # a preview is the user's to judge
    assert facts(finish_reason="cancelled", refusal=why).reason == "cancelled"
    assert facts(refusal=None).apply
