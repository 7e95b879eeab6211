"""The runaway stop rules (sidecar/rewrite_stops.py): each on a recorded runaway reply, none
on correct edits, and with a real model a stopped reply's token ids are a prefix of the plain
reply's, identical with speculation on and off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from echoline.sidecar.bench.edit_cases import CASES
from echoline.sidecar.rewrite_stops import (
    AFTER,
    REPEAT,
    TOO_LONG,
    RewriteStops,
    duplicates_after,
    stop_rules,
)

RECORDED = json.loads((Path(__file__).parent / "data" / "runaway_replies.json").read_text(encoding="utf-8"))
_BY_ID = {r["id"]: r for r in RECORDED}


def _stream(stops: RewriteStops, reply: str, step: int = 3) -> tuple[str, int | None]:
    """Feed ``reply`` as a stream grows (``step`` characters at a time), as the engine does:
    (the text kept, the length of the stream when the rule fired, None if none did)."""
    for n in range(step, len(reply) + step, step):
        text = reply[:n]
        cut = stops(text)
        if cut is not None:
            assert 0 <= cut <= len(text)
            return text[:cut], len(text)
    return reply, None


def _stops_for(rec: dict) -> RewriteStops:
    return stop_rules(rec["file"], rec["start"], rec["end"])


def test_a_function_repeated_five_times_stops_after_the_first_copy() -> None:
    rec = _BY_ID["repeat-five-times"]
    stops = _stops_for(rec)
    kept, at = _stream(stops, rec["reply"])
    assert stops.rule == REPEAT == rec["rule"]
    assert kept == rec["kept"] + "\n"  # the first copy and the blank line before the second
    assert rec["reply"].startswith(kept)
    # it fired when the second copy was complete, long before the five copies end
    assert at is not None and at < 2 * len(rec["kept"]) + 8


def test_a_reply_that_goes_on_into_the_next_function_is_cut_before_it() -> None:
    rec = _BY_ID["continues-into-next-function"]
    stops = _stops_for(rec)
    kept, _ = _stream(stops, rec["reply"])
    assert stops.rule == AFTER == rec["rule"]
    assert kept == rec["kept"]
    assert "save_config" not in kept
    after = rec["file"][rec["end"]:]
    assert duplicates_after(rec["reply"], after) and not duplicates_after(kept, after)


def test_a_reply_far_longer_than_the_selection_stops_at_the_limit() -> None:
    rec = _BY_ID["grows-far-past-selection"]
    stops = _stops_for(rec)
    kept, _ = _stream(stops, rec["reply"])
    assert stops.rule == TOO_LONG == rec["rule"]
    assert kept.count("\n") == rec["kept_lines"]
    assert rec["reply"].startswith(kept)


def test_each_rule_reads_only_new_lines() -> None:
    """Incremental: a text seen once is not scanned again (the line count only grows)."""
    rec = _BY_ID["repeat-five-times"]
    stops = _stops_for(rec)
    half = rec["kept"][: len(rec["kept"]) // 2]
    stops(half)
    seen = stops._lines
    stops(half)
    assert stops._lines == seen and stops.rule is None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_no_rule_fires_on_a_correct_edit(case) -> None:
    """The benchmark's solutions (each a right edit), as replies: nothing is cut."""
    from echoline.sidecar.bench.edits import selection_offsets

    start, end = selection_offsets(case)
    stops = stop_rules(case.source, start, end)
    kept, at = _stream(stops, case.solution + "```", step=1)
    assert at is None and stops.rule is None, (kept, stops.rule)


def test_a_selection_that_repeats_a_block_may_be_reproduced() -> None:
    block = "    total += price * quantity\n    count += quantity\n"
    selection = "def tally(rows):\n" + block + block + "    return total, count\n"
    stops = RewriteStops(selection=selection, after="\n\ndef other():\n    return tally([])\n")
    kept, at = _stream(stops, selection, step=1)
    assert at is None and kept == selection


def test_short_or_generic_lines_after_the_selection_are_no_anchor() -> None:
    """A selection inside a block: the closing brace after it is written by any edit."""
    stops = RewriteStops(selection="  const a = 1;\n  return a;\n", after="}\n\nmodule.exports = { f };\n")
    kept, at = _stream(stops, "  const a = 2;\n  return a;\n}\n", step=1)
    assert at is None


# ---- with a real model -------------------------------------------------------------------


@pytest.mark.slow
def test_a_stopped_reply_is_a_prefix_of_the_plain_reply_with_a_real_model() -> None:
    """A prompt that makes the model repeat a function: the repeat rule ends the reply; its
    token ids are the same with speculation on and off, and a prefix of the ids plain decoding
    writes without the rule (with the same budget)."""
    from echoline.engine.api import Engine

    engine = Engine.load("smollm2")
    fn = "def area(width, height):\n    return width * height\n\n\n"
    prompt = engine.tokenizer.encode("# geometry.py\n" + fn * 3, add_bos=False, parse_special=False)
    budget = 80
    plain = engine.generate(prompt, max_tokens=budget, spec=False)
    runs = {}
    for spec in (False, True):
        stops = RewriteStops(selection=fn)
        runs[spec] = (engine.generate(prompt, max_tokens=budget, spec=spec, stop_when=stops), stops.rule)
    (off, rule_off), (on, rule_on) = runs[False], runs[True]
    assert rule_off == rule_on == REPEAT, (plain.text, rule_off)
    assert on.token_ids == off.token_ids
    assert off.finish_reason == "stop" and len(off.token_ids) < len(plain.token_ids)
    assert plain.token_ids[: len(off.token_ids)] == off.token_ids
    assert plain.text.startswith(off.text) and len(off.text) < len(plain.text)
