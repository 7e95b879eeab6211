"""The inline completion's stops as engine stop rules: incremental, exact, never a cancel.

``InlineStops`` reads only the text added since its last call; it must cut exactly where
``block_end`` / ``line_end`` (run over the whole unhealed text, as the inline job did on
every token) first cut. As stop rules (a text predicate, and an id predicate for control
tokens) the reply they end is the same with speculation on and off, a prefix of the plain
reply, and finishes "stop", not "cancelled".
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from echoline.engine.generate import StopRules, generate_tokens
from echoline.engine.types import GenerationStats
from echoline.sidecar.inline import inline_job, line_end
from echoline.sidecar.inline_stops import InlineStops
from echoline.sidecar.prompts import block_end, finish_completion, unheal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.synth import write_model
from tests.test_generate_exact import FixedController, ScriptedIndex

# ---- InlineStops against the whole-text rules ----------------------------------------------


def reference_cut(raw: str, removed: str, indent: int, one_line: bool) -> int | None:
    """Where the old per-token check cut ``raw`` (the engine's reply text), in its offsets:
    ``line_end`` then ``block_end`` on the unhealed text, shifted back by what ``unheal``
    dropped."""
    text = unheal(raw, removed)
    cut = line_end(text) if one_line else None
    cut = cut if cut is not None else block_end(text, indent)
    return None if cut is None else cut + len(raw) - len(text)


def first_cut(pieces: list[str], stops: Any) -> tuple[int, int | None]:
    """Feed the growing text piece by piece: (pieces fed when ``stops`` cut, the cut)."""
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        cut = stops(text)
        if cut is not None:
            return i, cut
    return len(pieces), None


PIECE = st.lists(st.sampled_from([" ", "  ", "\t", "\n", "x", "if a:", "\r", "é", " \n"]), max_size=4).map("".join)


@settings(max_examples=600, deadline=None)
@given(pieces=st.lists(PIECE, max_size=24), indent=st.integers(0, 6), one_line=st.booleans(),
       removed=st.sampled_from(["", " "]))  # fmt: skip
def test_incremental_stops_cut_where_the_whole_text_rules_first_cut(
    pieces: list[str], indent: int, one_line: bool, removed: str
) -> None:
    def whole(text: str) -> int | None:
        return reference_cut(text, removed, indent, one_line)

    stops = InlineStops(indent, one_line)
    assert first_cut(pieces, stops) == first_cut(pieces, whole)
    if stops.cut is not None:  # once cut, it stays
        assert stops("".join(pieces) + "\nmore") == stops.cut


def test_incremental_stops_examples() -> None:
    assert first_cut(["x + 1\n", "    y = 2\n", "\n"], InlineStops(4)) == (2, len("x + 1\n    y = 2"))
    assert first_cut(["x + 1\n", "z", " = 3"], InlineStops(4)) == (1, len("x + 1"))
    assert first_cut(["x + 1\n", "  "], InlineStops(4)) == (2, None)  # undecided yet
    assert first_cut(["foo(a", ")\n", "    b"], InlineStops(4, one_line=True)) == (1, len("foo(a)"))
    assert first_cut(["  \n", "    b\n", "c"], InlineStops(4, one_line=True)) == (2, len("  \n    b"))


def test_each_call_reads_only_the_new_text() -> None:
    """A long undecided line is read once in all, not once per token."""

    class Counting(str):
        read = 0

        def find(self, sub: str, start: int = 0, *args: Any) -> int:  # type: ignore[override]
            Counting.read += len(self) - start
            return str.find(self, sub, start, *args)

    stops = InlineStops(0)
    text = "a\n"
    for _ in range(400):
        text += "b"
        assert stops(Counting(text)) is None
    assert Counting.read <= 2 * len(text)


# ---- as engine stop rules: speculative == plain, a prefix, no cancel ------------------------

ALPHABET = "\n\n\n  \t" + "abcdefghij"  # ids map to these: lines, indentation, code


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_model(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from echoline.engine.backends.numpy_backend import NumpyBackend
    from echoline.engine.models.loader import load_model

    path = write_model(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", request.param, vocab=50, seed=5)
    return load_model(path, NumpyBackend())[1]


def decode(ids: list[int]) -> str:
    return "".join(ALPHABET[t % len(ALPHABET)] for t in ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 49), min_size=1, max_size=10), k=st.integers(1, 6),
       mode=st.sampled_from(["right", "wrong", "mixed"]), seed=st.integers(0, 1000),
       indent=st.integers(0, 3), one_line=st.booleans(), control=st.one_of(st.none(), st.integers(0, 49)))  # fmt: skip
def test_predicate_stops_keep_speculation_exact(
    tiny_model: Any, prompt: list[int], k: int, mode: str, seed: int, indent: int, one_line: bool, control: int | None
) -> None:
    """The text predicate and the id predicate, token by token, give the same reply ids
    with speculation on and off (whatever the drafts), a prefix of the unstopped reply."""
    free, _ = run_decoded(tiny_model, prompt, StopRules(max_tokens=24))

    def rules() -> StopRules:
        return StopRules(max_tokens=24, stop_when=InlineStops(indent, one_line),
                         stop_id_when=None if control is None else (lambda t: t == control))  # fmt: skip

    plain, pc = run_decoded(tiny_model, prompt, rules())
    index = ScriptedIndex(free.token_ids, len(prompt), mode, np.random.default_rng(seed))
    spec, sc = run_decoded(tiny_model, prompt, rules(), index=index, k=k)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason != "cancelled"
    assert free.token_ids[: len(plain.token_ids)] == plain.token_ids
    assert free.text.startswith(plain.text)
    if control is not None and control in free.token_ids:
        first = free.token_ids.index(control)
        assert len(plain.token_ids) <= first + 1
        if len(plain.token_ids) == first + 1:  # ended by the control token: its text is not kept
            assert plain.finish_reason == "stop" and plain.text == decode(free.token_ids[:first])
    # trailing-token rule: both caches hold exactly prompt + reply
    assert pc.length == sc.length == len(prompt) + len(plain.token_ids)


def run_decoded(model: Any, prompt: list[int], rules: StopRules, index: Any = None, k: int = 0) -> tuple[Any, Any]:
    """``tests.test_generate_exact.run`` with this module's decode (newlines and indentation)."""
    cache = model.new_cache(64)
    res = generate_tokens(model, cache, prompt, decode=decode, rules=rules, index=index,
                              controller=FixedController(k) if index is not None else None, prefill_chunk=4,
                              stats=GenerationStats())  # fmt: skip
    return res, cache


# ---- the inline job on a real model --------------------------------------------------------

HEAD = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"
CASES = [  # (prefix, suffix): a block-end stop, a line-end stop (typing mid-line), a healed space
    (HEAD + "    ", "\n\n\nprint(add(1, 2))\n"),
    (HEAD + "    return a", "\n"),
    (HEAD + "    return ", "\n"),
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Any:
    from echoline.engine.api import Engine

    return Engine.load(str(smollm2_path))


@pytest.mark.slow
@pytest.mark.parametrize("prefix,suffix", CASES)
def test_inline_job_stops_are_exact_and_no_cancel(smollm2: Any, prefix: str, suffix: str) -> None:
    """The inline job ends at the block's (or line's) end with a stop, never a cancel: the
    job's cancel event is left unset, the reply finishes "stop" with the same ids with
    speculation on and off, a prefix of the unstopped plain reply, and the completion is
    what the whole-text rules give on that plain reply."""
    engine = smollm2
    max_tokens = 32
    seen: list[tuple[list[int], Any]] = []
    original = engine.generate

    def recording(prompt_ids: Any, **kw: Any) -> Any:
        result = original(prompt_ids, **kw)
        seen.append(([int(t) for t in prompt_ids], result))
        return result

    engine.generate = recording
    try:
        outs = {}
        for spec in (False, True):
            cancel = threading.Event()
            job = inline_job(prefix, suffix, prefix.rsplit("\n", 1)[-1], f"file:///stops{len(prefix)}.py",
                             max_tokens, spec, auto_suffix=False, session=f"stops-{spec}")  # fmt: skip
            outs[spec] = job(engine, cancel)
            assert not cancel.is_set()
    finally:
        del engine.generate
    (ids_off, off), (ids_on, on) = seen
    assert ids_off == ids_on
    assert on.token_ids == off.token_ids and on.text == off.text
    assert off.finish_reason == "stop", (off.finish_reason, off.text)
    assert outs[False].text is not None and outs[False].text == outs[True].text
    plain = engine.generate(ids_off, max_tokens=max_tokens, spec=False)
    assert len(off.token_ids) < len(plain.token_ids)
    assert plain.token_ids[: len(off.token_ids)] == off.token_ids
    removed = " " if prefix.endswith(" ") else ""
    cursor_line = prefix.rsplit("\n", 1)[-1]
    indent = len(cursor_line) - len(cursor_line.lstrip(" \t"))
    whole = unheal(plain.text, removed)
    cut = line_end(whole) if cursor_line.strip() else None
    assert outs[False].text == finish_completion(whole if cut is None else whole[:cut], indent)
