"""``FenceStripper`` (the incremental ``strip_fence``) equals ``strip_fence`` on every prefix.

A rewrite reports its replacement after every token; the stripper must answer what
``strip_fence`` answers on the reply so far while reading only what is new.
"""

from __future__ import annotations

from typing import Any

from echoline.engine.types import GenerationResult, GenerationStats, TokenEvent
from echoline.sidecar.prompts import FENCE, FenceStripper, strip_fence
from hypothesis import given, settings
from hypothesis import strategies as st

PIECES = ["`", "``", "```", "````", "\n", "\n\n", "py", "python\n", "x = 1", " ", "é", "```\n", "````py\n"]
REPLY = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)
FENCES = st.sampled_from([FENCE, "````", "`````"])


@settings(max_examples=800, deadline=None)
@given(reply=REPLY, fence=FENCES)
def test_equals_strip_fence_on_every_prefix(reply: str, fence: str) -> None:
    stripper = FenceStripper(fence)
    for n in range(len(reply) + 1):
        assert stripper(reply[:n]) == strip_fence(reply[:n], fence), (reply[:n], fence)


@settings(max_examples=400, deadline=None)
@given(reply=REPLY, fence=FENCES, cuts=st.lists(st.integers(0, 200), max_size=12), shrink=st.integers(0, 200))
def test_equals_strip_fence_on_growing_chunks_and_a_final_cut(
    reply: str, fence: str, cuts: list[int], shrink: int
) -> None:
    """Token-sized chunks (several characters at once), then a stop rule's cut back to a
    shorter reply (the engine's last text may be shorter than the one before)."""
    stripper = FenceStripper(fence)
    ends = sorted({min(c, len(reply)) for c in cuts} | {len(reply)})
    for end in ends:
        assert stripper(reply[:end]) == strip_fence(reply[:end], fence)
    short = reply[: min(shrink, len(reply))]
    assert stripper(short) == strip_fence(short, fence)
    assert stripper(reply) == strip_fence(reply, fence)  # and grows again from there


def test_examples() -> None:
    replies = [
        "def f():\n    pass\n```\nExplanation",
        "```python\nx = 1\n```",
        "\n\n```py\nx = 1\n``",
        "x = 1\n",
        "````\nkeep ``` inside\n````\n",
    ]
    for reply in replies:
        for fence in (FENCE, "````"):
            stripper = FenceStripper(fence)
            for n in range(len(reply) + 1):
                assert stripper(reply[:n]) == strip_fence(reply[:n], fence)


def test_each_call_reads_only_the_new_text() -> None:
    """A long reply with no closing fence: the searches cover it about once in all."""

    class Counting(str):
        read = 0

        def find(self, sub: str, start: int = 0, *args: object) -> int:  # type: ignore[override]
            Counting.read += len(self) - start
            return str.find(self, sub, start, *args)

    stripper = FenceStripper()
    reply = "x = 1\n"
    for _ in range(500):
        reply += "y = 2\n"
        assert stripper(Counting(reply)) == reply
    assert Counting.read <= 3 * len(reply)


class _Tok:
    stop_ids = frozenset()

    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) % 1000 for c in text]


class _StreamingEngine:
    """Streams ``reply`` a few characters a token through ``on_token`` and the stop rules,
    as the engine does (a stop rule's cut makes the last text shorter than the one before)."""

    has_chat_template = False
    tokenizer = _Tok()

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.texts: list[str] = []

    def generate(self, ids: list[int], **kw: Any) -> GenerationResult:
        stats = GenerationStats()
        text, finish = self.reply, "length"
        for n in range(3, len(self.reply) + 3, 3):
            text = self.reply[:n]
            cut = next((text.index(s) for s in kw["stop"] if s in text), kw["stop_when"](text))
            if cut is not None:
                text, finish = text[:cut], "stop"
            self.texts.append(text)
            kw["on_token"](TokenEvent([0], "", text, stats))
            if finish == "stop":
                break
        return GenerationResult([0] * len(self.texts), text, finish, stats)


def test_rewrite_progress_is_strip_fence_of_each_reply() -> None:
    """``run_rewrite``'s progress texts and its result, against ``strip_fence`` of the reply
    each time: a closing fence, a repeat cut (the last reply shorter), a repeated opening."""
    from echoline.sidecar.rewrite import run_rewrite

    file = "def f(x):\n    return x\n\n\ndef g(y):\n    return y * 2\n"
    start, end = 0, len("def f(x):\n    return x\n")
    body = "def f(x: int) -> int:\n    return x\n"
    replies = [body + "```\nSome words", (body + "\n") * 3, "```python\n" + body + "```", body]
    for reply in replies:
        engine = _StreamingEngine(reply)
        seen: list[str] = []
        out = run_rewrite(engine, file, start, end, "Add types.", name="a.py",
                          on_progress=lambda p, seen=seen: seen.append(p.text))  # fmt: skip
        assert seen == [strip_fence(t, FENCE) for t in engine.texts]
        assert out.reply == engine.texts[-1]
