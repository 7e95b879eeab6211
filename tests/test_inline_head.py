"""The inline prompt's head at a new place: short until the long one is cached.

``sidecar.inline.choose_head`` asks with the short head (~250 tokens) while the long one
(~1,500) is not cached, and the warm-up then runs the long head in a session of its own;
once it is cached, requests ask with it. Which prompt is asked depends on the cache; the
reply never does: every completion is the plain greedy one of the prompt it was asked with.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from echoline.sidecar.inline import (
    HEAD_SWITCH_TOKENS,
    choose_head,
    inline_job,
    inline_long_session,
    warm_job,
)
from echoline.sidecar.prompts import INLINE_SHORT_PREFIX_CHARS, InlinePrompt

from tests.synth import write_fim_qwen2_model

LONG = InlinePrompt(ids=[1, *range(100, 1600), 2, 7, 7, 3], mode="fim", head_start=0, head_len=1501)
SHORT = InlinePrompt(ids=[1, *range(1300, 1600), 2, 7, 7, 3], mode="fim", head_start=0, head_len=301)


class _Cache:
    """A stand-in engine that holds a prefix of some prompts (``cached_prefix``)."""

    def __init__(self, held: dict[int, int]) -> None:
        self.held = held  # first head id -> tokens held

    def cached_prefix(self, ids: list[int], *, session: str | None = None) -> int:
        return self.held.get(ids[1], 0)


@pytest.mark.parametrize(("held", "head"), [
    ({}, "short"),  # a new place: nothing cached, the short head costs a fifth
    ({1300: 301}, "short"),  # typing there: the short one is cached, the long one is not
    ({100: 1501}, "long"),  # the long head warmed: it is asked
    ({100: 1501 - HEAD_SWITCH_TOKENS, 1300: 301}, "long"),  # within one chunk of it: asked
    ({100: 1500 - HEAD_SWITCH_TOKENS, 1300: 301}, "short"),
])  # fmt: skip
def test_the_long_head_is_asked_once_it_is_cached(held: dict[int, int], head: str) -> None:
    got = choose_head(_Cache(held), LONG, lambda: SHORT, "inline:x")  # type: ignore[arg-type]
    assert got.head == head
    if head == "short":
        assert got.ids == SHORT.ids and got.long_ids == LONG.ids
    else:
        assert got is LONG


def test_an_engine_that_cannot_say_what_it_holds_gets_the_long_head() -> None:
    assert choose_head(object(), LONG, lambda: SHORT, "inline:x") is LONG  # type: ignore[arg-type]
    assert choose_head(_Cache({}), LONG, lambda: LONG, "inline:x") is LONG  # type: ignore[arg-type]


def test_the_short_head_is_not_built_while_the_long_one_is_cached() -> None:
    def never() -> InlinePrompt:
        raise AssertionError("the short prompt was tokenized although the long head is cached")

    assert choose_head(_Cache({100: 1501}), LONG, never, "inline:x") is LONG  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from echoline.engine.api import Engine

    path = write_fim_qwen2_model(tmp_path_factory.mktemp("fimhead") / "fim-qwen2.gguf", seed=3, context=16384)
    return Engine.load(str(path))


def _asked(engine: Any) -> list[tuple[list[int], list[int], str | None]]:
    """Wrap ``engine.generate`` to record each (prompt, reply ids, session)."""
    seen: list[tuple[list[int], list[int], str | None]] = []
    inner = engine.generate

    def generate(ids: Any, **kw: Any) -> Any:
        out = inner(ids, **kw)
        seen.append((list(ids), list(out.token_ids), kw.get("session")))
        return out

    engine.generate = generate
    return seen


def test_a_new_place_asks_short_then_long_and_each_reply_is_plain(engine: Any) -> None:
    """At a new place in a long file the first request asks with the short head; the warm-up
    there runs it and then the long head into its own session; the next request (a keystroke
    later) asks with the long head, prefilling only the keystroke and the tail. Each reply's
    ids are the start of plain greedy decoding's on the prompt asked."""
    text = "".join(f"def h{i}(a, b):\n    return a * {i} + b\n\n" for i in range(500))
    cut = text.index("return a * 300") + len("return a * 3")
    prefix, suffix = text[:cut], text[cut:]
    assert len(prefix) > 4 * INLINE_SHORT_PREFIX_CHARS
    uri = "file:///head.py"
    seen = _asked(engine)

    def ask(pre: str, suf: str) -> Any:
        line = pre[pre.rfind("\n") + 1 :]
        return inline_job(pre, suf, line, uri, 12, True, 64)(engine, threading.Event())

    first = ask(prefix, suffix)
    assert first.stats["head"] == "short"
    # this model's tokens are about characters: the short head (1,536-2,048) and the tail
    # (64), not the long head's 6,000 and more
    assert first.stats["prefilled_tokens"] < 2200, first.stats
    report = warm_job(prefix, suffix, uri, 12, 64)(engine, threading.Event(), None)
    assert report is not None and report["head"] == "short" and report["tokens"] > 6000, report
    assert report["cached"] == report["tokens"] - 1 and report["short"]["cached"] >= 1  # the long prompt, warmed
    assert len(engine.sessions.sessions[inline_long_session(uri)].history) == report["tokens"] - 1
    second = ask(prefix + "0", suffix)  # a keystroke later
    assert second.stats["head"] == "long"
    assert second.stats["prefilled_tokens"] < 100, second.stats  # the keystroke and the tail
    del engine.generate  # the engine's own method again
    for ids, reply, _session in seen:
        plain = engine.generate(ids, max_tokens=12, spec=False)
        assert reply and plain.token_ids[: len(reply)] == reply


def test_with_warm_ups_off_the_long_head_is_always_asked(engine: Any) -> None:
    """Nothing would warm the long head, so a request never asks with the short one."""
    text = "".join(f"def k{i}(a, b):\n    return a - {i} * b\n\n" for i in range(400))
    cut = text.index("return a - 250") + len("return a - 2")
    out = inline_job(text[:cut], text[cut:], "    return a - 2", "file:///off.py", 8, True,
                     short_head=False)(engine, threading.Event())
    assert out.stats["head"] == "long"


def test_a_short_file_has_one_head(engine: Any) -> None:
    """A prefix shorter than the short head's reach: both heads are the whole prefix."""
    pre = "def f(x):\n    return x"
    out = inline_job(pre, "\n", "    return x", "file:///small.py", 8, True)(engine, threading.Event())
    assert out.stats["head"] == "long"
