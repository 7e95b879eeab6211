"""Fast sidecar unit tests: settings, prompts, block ends, worker queue, CLI arguments."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from echoline.sidecar import config as cfg
from echoline.sidecar.cli import parse_hostport
from echoline.sidecar.inline import completion_end
from echoline.sidecar.prompts import (
    REPRODUCE_INSTRUCTION,
    REWRITE_SYSTEM,
    block_end,
    file_window,
    finish_completion,
    fit_selection,
    heal_prefix,
    inline_prompt,
    rewrite_prompt,
    strip_fence,
    unheal,
)
from echoline.sidecar.rewrite_cli import parse_range
from echoline.sidecar.worker import EngineWorker, JobCancelled
from lsprotocol import types


def test_settings_good_and_bad_values() -> None:
    s, errs = cfg.apply(cfg.Settings(), {"echoline": {"maxTokens": 100}}["echoline"])
    assert s.max_tokens == 100 and errs == []
    s2, errs = cfg.apply(s, {"maxTokens": "lots", "speculation": False, "backend": "tpu", "bogus": 1})
    assert s2.max_tokens == 100 and s2.speculation is False and s2.backend == "auto"
    assert len(errs) == 3
    assert any("maxTokens" in e and "keeping 100" in e for e in errs)
    assert any("backend" in e and "one of" in e for e in errs)
    s3, errs = cfg.apply(s2, {"index": {"maxFileBytes": 1000}, "inlineCompletion": {"maxTokens": 9}})
    assert (s3.max_file_bytes, s3.inline_max_tokens, errs) == (1000, 9, [])
    assert cfg.unwrap({"echoline": {"model": "x"}}) == {"model": "x"}
    assert cfg.apply(s3, "nope")[1]
    assert cfg.apply(s3, {"kvBudgetMB": None})[0].kv_budget_bytes is None
    assert cfg.apply(s3, {"kvBudgetMB": 2})[0].kv_budget_bytes == 2 * 1024 * 1024


def test_cpu_activations_setting_reloads_the_engine() -> None:
    """cpuActivations picks the cpu backend's mode; a change is a reload, a bad value an error."""
    from echoline.engine.backends import CPU_ACTIVATIONS

    assert cfg.CPU_ACTIVATIONS == CPU_ACTIVATIONS  # the sidecar's copy keeps up with the engine
    base = cfg.Settings()
    q8, errs = cfg.apply(base, {"cpuActivations": "q8"})
    assert q8.cpu_activations == "q8" and errs == []
    assert q8.engine_key() != base.engine_key()
    back, errs = cfg.apply(q8, {"cpuActivations": None})
    assert back.cpu_activations is None and back.engine_key() == base.engine_key() and errs == []
    kept, errs = cfg.apply(q8, {"cpuActivations": "int4"})
    assert kept.cpu_activations == "q8" and any("cpuActivations" in e and "one of" in e for e in errs)


def test_rewrite_prompt_layout_file_first() -> None:
    text = "import os\n\ndef f(t):\n    return t\n"
    start = text.index("def")
    p = rewrite_prompt(text, start, len(text), "", name="file:///w/m.py")
    assert p.messages[0] == {"role": "system", "content": REWRITE_SYSTEM}
    content = p.messages[-1]["content"]
    volatile = REPRODUCE_INSTRUCTION + "\n```python\ndef f(t):\n    return t\n```"
    assert content.endswith(volatile)
    assert content.index(text) < content.index(volatile)
    assert p.prime == "```python\n"
    # the stable part does not depend on the selection or the instruction
    q = rewrite_prompt(text, start, len(text), "rename t", name="file:///w/m.py")
    stable = content[: content.index(volatile)]
    qc = q.messages[-1]["content"]
    assert qc.startswith(stable)
    assert qc.endswith("```python\ndef f(t):\n    return t\n```\nrename t")


def test_strip_fence_and_fit() -> None:
    assert strip_fence("def f():\n    pass\n```\nExplanation") == "def f():\n    pass\n"
    assert strip_fence("```python\nx = 1\n```") == "x = 1\n"
    assert strip_fence("x = 1\n") == "x = 1\n"
    assert fit_selection("x = 1", "x = 2\n") == "x = 1\n"
    assert fit_selection("x = 1\n\n", "x = 2") == "x = 1"


def test_file_window_keeps_selection() -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    start = text.index("line 2500\n")
    win = file_window(text, start, start + 10, limit=2000)
    assert "line 2500\n" in win and len(win) <= 2100 and win.startswith("line ")


def test_block_end_rules() -> None:
    assert block_end("x + 1\n    y = 2\n", 4) is None
    assert block_end("x + 1\n    y = 2\n\n", 4) == len("x + 1\n    y = 2")
    assert block_end("x + 1\nz = 3", 4) == len("x + 1")
    assert block_end("x + 1\n  ", 4) is None  # undecided yet
    assert finish_completion("return a + b\n\ndef other():\n", 4) == "return a + b"
    assert finish_completion("\n        self.x = x\n        self.y = y\n    def", 8) == (
        "\n        self.x = x\n        self.y = y"
    )


def test_parse_range_and_hostport() -> None:
    assert parse_range("2:4", 10) == (1, 3)
    assert parse_range("3", 10) == (2, 2)
    for bad in ("0:2", "4:2", "a:b", "1:11"):
        with pytest.raises(ValueError):
            parse_range(bad, 10)
    assert parse_hostport(":2087") == ("127.0.0.1", 2087)
    assert parse_hostport("0.0.0.0:99") == ("0.0.0.0", 99)


class SlowEngine:
    """Counts steps; honours cancel like the real engine (checked every step)."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}

    def set_source(self, sid: str, text: str) -> None:
        self.sources[sid] = text

    def remove_source(self, sid: str) -> None:
        self.sources.pop(sid, None)

    def run(self, steps: int, cancel: threading.Event) -> int:
        for i in range(steps):
            if cancel.is_set():
                return i
            time.sleep(0.01)
        return steps


def test_worker_supersession_cancel_and_sources() -> None:
    w = EngineWorker(lambda model, **kw: SlowEngine())
    try:
        w.set_source("file:a", "early")  # before the model exists: kept and replayed
        w.load("fake").future.result(5)
        assert w.state == "ready"
        w.sync_sources().future.result(5)
        assert w.engine.sources == {"file:a": "early"}
        first = w.submit(lambda e, c: e.run(1000, c), kind="inline", key=("inline", "u"))
        time.sleep(0.05)
        second = w.submit(lambda e, c: e.run(5, c), kind="inline", key=("inline", "u"))
        t0 = time.monotonic()
        assert first.future.result(5) < 1000 and first.superseded
        assert time.monotonic() - t0 < 0.5
        assert second.future.result(5) == 5
        queued = w.submit(lambda e, c: e.run(5, c), kind="rewrite")
        queued.request_cancel()
        with pytest.raises(JobCancelled):
            queued.future.result(5)
        w.remove_source("file:a")
        w.set_source("file:b", "x")
        w.sync_sources().future.result(5)
        assert w.engine.sources == {"file:b": "x"}
    finally:
        w.stop()


def test_worker_requests_cancel_background_prefill_but_status_does_not() -> None:
    w = EngineWorker(lambda model, **kw: SlowEngine())
    try:
        w.load("fake").future.result(5)
        bg = w.submit(lambda e, c: e.run(1000, c), kind="prefill", key=("prefill", "u"))
        time.sleep(0.05)
        st = w.submit(lambda e, c: "status", kind="status")
        time.sleep(0.05)
        assert not bg.cancel.is_set()  # status and source syncs leave it running
        t0 = time.monotonic()
        req = w.submit(lambda e, c: e.run(3, c), kind="rewrite")
        assert bg.cancel.is_set() and not bg.superseded
        steps = bg.future.result(5)
        assert 0 < steps < 1000 and time.monotonic() - t0 < 0.5
        assert st.future.result(5) == "status" and req.future.result(5) == 3
        # A queued background job is cancelled too; cancel_key marks it superseded.
        w.submit(lambda e, c: e.run(30, c), kind="rewrite")
        queued = w.submit(lambda e, c: e.run(1000, c), kind="prefill", key=("prefill", "v"))
        w.cancel_key(("prefill", "v"))
        with pytest.raises(JobCancelled):
            queued.future.result(5)
        assert queued.superseded
        # An inline warm-up ("warm") cancels an idle prefill (the cursor's place first) and is
        # cancelled by any request; an idle prefill submitted after it leaves it running.
        bg = w.submit(lambda e, c: e.run(1000, c), kind="prefill", key=("prefill", "u"))
        time.sleep(0.05)
        warm = w.submit(lambda e, c: e.run(1000, c), kind="warm", key=("inline-warm", "u"))
        assert bg.cancel.is_set() and not bg.superseded
        time.sleep(0.05)
        later = w.submit(lambda e, c: e.run(1, c), kind="prefill", key=("prefill", "w"))
        assert not warm.cancel.is_set()
        w.submit(lambda e, c: e.run(1, c), kind="inline")
        assert warm.cancel.is_set() and later.cancel.is_set()
        assert 0 < warm.future.result(5) < 1000
    finally:
        w.stop()


def test_idle_prefill_settings() -> None:
    new, errors = cfg.apply(cfg.Settings(), {"prefillOnIdle": False, "prefillIdleMs": 250})
    assert not errors and not new.prefill_on_idle and new.prefill_idle_ms == 250
    kept, errors = cfg.apply(new, {"prefillOnIdle": 1, "prefillIdleMs": 1.5})
    assert len(errors) == 2 and kept == new
    assert cfg.as_lsp_dict(new)["prefillIdleMs"] == 250
    warm, errors = cfg.apply(cfg.Settings(), {"inlineCompletion": {"warm": False, "warmMs": 50}})
    assert not errors and not warm.inline_warm and warm.inline_warm_ms == 50
    assert cfg.Settings().inline_warm and len(cfg.apply(warm, {"inlineWarmMs": -1})[1]) == 1


def test_worker_load_failure_is_reported() -> None:
    def boom(model: str, **kw: object) -> None:
        raise FileNotFoundError(f"{model} missing")

    w = EngineWorker(boom)
    try:
        with pytest.raises(FileNotFoundError):
            w.load("nope.gguf").future.result(5)
        assert w.state == "error" and "nope.gguf" in (w.error or "")
    finally:
        w.stop()


def test_heal_prefix_round_trip() -> None:
    assert heal_prefix("def f():\n    ") == ("def f():\n   ", " ")
    assert heal_prefix("x = ") == ("x =", " ")
    assert heal_prefix("x =") == ("x =", "")
    assert unheal(" return 1", " ") == "return 1"
    assert unheal("return 1", " ") == "return 1"
    assert unheal("\n    y = 1", " ") == "\n    y = 1"
    assert unheal("abc", "") == "abc"


FIB = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def rng(l1: int, c1: int, l2: int, c2: int) -> dict:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


def test_code_action_carries_rewrite_command() -> None:
    """Called in-process: pygls' client-side converter turns any CodeAction carrying a
    command into a bare Command (lsprotocol union hook), so the wire shape is checked here."""
    from types import SimpleNamespace

    from echoline.sidecar.server import on_code_action
    from lsprotocol.converters import get_converter
    from pygls.workspace import TextDocument

    uri = "file:///tmp/ca.py"
    ls = SimpleNamespace(
        workspace=SimpleNamespace(text_documents={uri: TextDocument(uri, FIB, version=3)})
    )
    params = types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(
            start=types.Position(line=0, character=0), end=types.Position(line=2, character=0)
        ),
        context=types.CodeActionContext(diagnostics=[]),
    )
    actions = get_converter().unstructure(on_code_action(ls, params))
    assert len(actions) == 1
    act = actions[0]
    assert act["kind"] == "refactor.rewrite" and act["title"].startswith("Rewrite with echoline")
    assert act["command"]["command"] == "echoline.rewrite"
    arg = act["command"]["arguments"][0]
    assert arg == {
        "uri": uri,
        "version": 3,
        "range": rng(0, 0, 2, 0),
        "instruction": "",
        "mode": "apply",
    }
    empty = types.CodeActionParams(
        text_document=params.text_document,
        range=types.Range(
            start=types.Position(line=1, character=0), end=types.Position(line=1, character=0)
        ),
        context=params.context,
    )
    assert on_code_action(ls, empty) == []



class CharTokenizer:
    """One token per character; FIM ids 1..3 when ``fim`` is set."""

    def __init__(self, fim: bool) -> None:
        from types import SimpleNamespace

        self.fim = SimpleNamespace(prefix=1, suffix=2, middle=3) if fim else None

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        return ([0] if add_bos is not False else []) + [ord(c) for c in text]


def test_inline_prompt_fim_and_prefix() -> None:
    from types import SimpleNamespace

    fim = inline_prompt(SimpleNamespace(tokenizer=CharTokenizer(True)), "ab", "cd")
    assert fim.mode == "fim" and fim.ids == [1, ord("a"), ord("b"), 2, ord("c"), ord("d"), 3]
    long = "x" * 9000 + "\nab"
    plain = inline_prompt(SimpleNamespace(tokenizer=CharTokenizer(False)), long, "cd")
    assert plain.mode == "prefix" and plain.ids[0] == 0 and plain.ids[-2:] == [ord("a"), ord("b")]
    assert len(plain.ids) == 1 + 2  # the window starts at the next line start: "ab"
    sliding = inline_prompt(SimpleNamespace(tokenizer=CharTokenizer(False)), "x" * 7000 + "\nab", "cd", anchor=0)
    assert len(sliding.ids) < 6100  # trimmed to the budget


def test_inline_head_start_holds_while_typing() -> None:
    """Typing at the cursor must not move the head window's start (the cached prompt
    would be lost each time it passed a line break), except once per grid step."""
    from echoline.sidecar.prompts import INLINE_ANCHOR_CHARS, INLINE_PREFIX_CHARS, inline_head

    body = "".join(f"line {i:05d} = {i * 7}\n" for i in range(1200))  # ~25k chars
    typed = "total = sum(values) + 1\n    " * 60  # ~1,800 chars typed at the end
    starts = []
    for n in range(0, len(typed), 7):
        prefix = body + typed[:n]
        head = inline_head(prefix)
        start = len(prefix) - len(head)
        assert start == 0 or prefix[start - 1] == "\n", "the head starts at a line start"
        assert INLINE_PREFIX_CHARS - 40 <= len(head) <= INLINE_PREFIX_CHARS + INLINE_ANCHOR_CHARS  # 40: a line
        starts.append(start)
    moves = sum(1 for a, b in zip(starts, starts[1:], strict=False) if a != b)
    assert moves <= len(typed) // INLINE_ANCHOR_CHARS + 1, moves
    # the sliding window (anchor 0) moves at nearly every line break typed
    slid = [len(body + typed[:n]) - len(inline_head(body + typed[:n], step=0)) for n in range(0, len(typed), 7)]
    assert sum(1 for a, b in zip(slid, slid[1:], strict=False) if a != b) > 20
    assert inline_head("short\ntext") == "short\ntext"


def test_inline_head_start_kept_across_cursor_jumps() -> None:
    """A cursor that jumps a few screens keeps the previous request's head start (its
    cached head then holds up to the nearer cursor) where the grid alone would move it;
    a start that no longer fits, or is no longer a line start, falls back to the grid."""
    import random

    from echoline.sidecar.prompts import INLINE_ANCHOR_CHARS as STEP
    from echoline.sidecar.prompts import INLINE_PREFIX_CHARS as LIMIT
    from echoline.sidecar.prompts import inline_head_start

    text = "".join(f"value_{i:05d} = compute({i}, {i * 7})\n" for i in range(2000))  # ~70k chars
    ends = [i + 1 for i, c in enumerate(text) if c == "\n"]
    rng = random.Random(5)
    cursor, keep, prev = ends[600], None, ends[600]
    kept_moves = grid_moves = 0
    for _ in range(200):
        cursor = min(max(ends[0], cursor + rng.randint(-60, 60) * 35), len(text))
        prefix = text[:cursor]
        grid = inline_head_start(prefix)
        start = inline_head_start(prefix, keep=keep)
        assert start == 0 or prefix[start - 1] == "\n"
        assert LIMIT - STEP <= len(prefix) - start < LIMIT + 2 * STEP or start == 0
        if keep is not None:
            kept_moves += start != keep
            grid_moves += grid != inline_head_start(text[:prev], keep=None)
        keep, prev = start, cursor
    assert kept_moves * 3 < grid_moves, (kept_moves, grid_moves)  # jumps of up to ~2,100 characters
    prefix = text[: ends[800]]
    grid = inline_head_start(prefix)
    too_long = max(e for e in ends if len(prefix) - e >= LIMIT + 2 * STEP)  # line starts, both
    too_short = min(e for e in ends if len(prefix) - e < LIMIT - STEP)
    assert grid not in (too_long, too_short)
    assert inline_head_start(prefix, keep=too_long) == grid  # too long a head: the grid
    assert inline_head_start(prefix, keep=too_short) == grid  # too short a head: the grid
    fits = max(e for e in ends if len(prefix) - e >= LIMIT + STEP)
    assert fits != grid and inline_head_start(prefix, keep=fits) == fits  # a line start that fits
    assert inline_head_start(prefix, keep=grid + 5) == grid  # not a line start (text above edited)
    assert inline_head_start(prefix, keep=len(prefix) + 10) == grid  # past the cursor
    sliding = inline_head_start(prefix, step=0)
    assert sliding != grid and inline_head_start(prefix, step=0, keep=grid) == sliding  # no grid, no keep
    assert inline_head_start("short\ntext", keep=6) == 0  # a short prefix: the whole of it


def test_inline_tail_keeps_whole_lines_within_the_token_budget() -> None:
    from echoline.sidecar.prompts import inline_tail_ids

    tok = CharTokenizer(True)
    suffix = ")\n    return s\n\ndef g():\n    pass\n" + "x = 1\n" * 400
    assert inline_tail_ids(tok, suffix) == [ord(c) for c in suffix[:2000]]  # no budget: characters
    for budget in (1, 5, 14, 16, 30, 100):
        ids = inline_tail_ids(tok, suffix, tokens=budget)
        text = "".join(chr(i) for i in ids)
        assert len(ids) <= budget
        assert suffix.startswith(text)
        if len(ids) > 2:
            assert text.endswith("\n"), "whole lines"
            nxt = suffix.find("\n", len(text)) + 1
            assert nxt - 0 > budget, "the next whole line would not have fitted"
    assert inline_tail_ids(tok, suffix, tokens=1) == [ord(")")]  # the cursor line alone is too long: cut
    assert inline_tail_ids(tok, suffix, tokens=0) == []
    assert inline_tail_ids(tok, "abc", tokens=8) == [ord(c) for c in "abc"]


def test_auto_suffix_budget_follows_the_prefill_speed() -> None:
    from types import SimpleNamespace

    from echoline.sidecar.prompts import auto_suffix_tokens

    def eng(rate, fixed=0.0):
        return SimpleNamespace(prefill_seconds=lambda n: fixed + n / rate)

    assert auto_suffix_tokens(eng(100.0)) == 64  # 128 tokens would take 1.28 s
    assert auto_suffix_tokens(eng(120.0)) == 128  # 1.07 s: a power of two within 1.25 s
    assert auto_suffix_tokens(eng(450.0)) == 512
    assert auto_suffix_tokens(eng(450.0, fixed=0.2)) == 256  # a forward's fixed cost counts
    assert auto_suffix_tokens(eng(10.0)) == 32  # never below the floor
    assert auto_suffix_tokens(eng(1e6)) == 1024  # a GPU: capped (the 2,000 characters bind first)
    assert auto_suffix_tokens(SimpleNamespace(prefill_seconds=lambda n: None)) is None  # a server
    assert auto_suffix_tokens(SimpleNamespace()) is None  # a stand-in without the call


def test_completion_range_end() -> None:
    pos = types.Position(line=3, character=10)
    assert completion_end(pos, "", "x)") == pos
    assert completion_end(pos, ")", "a, b)") == types.Position(line=3, character=11)
    assert completion_end(pos, "   ", "x") == types.Position(line=3, character=13)
    assert completion_end(pos, " + y", "x") == pos
    assert completion_end(pos, "é)", "1é)") == types.Position(line=3, character=12)


def test_request_waits_for_a_loading_model_then_fails_clearly() -> None:
    """A request while the model loads waits at most readyTimeoutS, then gets RequestFailed;
    once the load is done the same wait returns at once."""
    import asyncio
    import dataclasses

    from echoline.sidecar.server import REQUEST_FAILED, EcholineServer
    from pygls.exceptions import JsonRpcException

    release = threading.Event()

    def slow_loader(model: str, **kw: object) -> object:
        release.wait(10)
        return object()

    ls = EcholineServer(loader=slow_loader)
    try:
        ls.settings = dataclasses.replace(ls.settings, ready_timeout_s=0.3)
        job = ls.worker.load("slow")
        t0 = time.monotonic()
        with pytest.raises(JsonRpcException) as err:
            asyncio.run(ls.engine_ready())
        waited = time.monotonic() - t0
        assert err.value.code == REQUEST_FAILED and "still loading" in str(err.value)
        assert 0.25 <= waited < 5
        release.set()
        job.future.result(5)
        asyncio.run(asyncio.wait_for(ls.engine_ready(), 1))
        assert ls.worker.state == "ready"
    finally:
        release.set()
        ls.worker.stop()


def test_load_warms_the_engine_up_before_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first forward and the calibration happen during the load, not on the first
    request, and each phase is reported (on the worker thread) as it starts."""
    from echoline.engine.api import Engine

    from tests.synth import write_fim_qwen2_model

    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path / "cache"))  # no calibration yet
    path = write_fim_qwen2_model(tmp_path / "m.gguf", context=1024)
    phases: list[tuple[str, str]] = []
    w = EngineWorker(lambda model, **kw: Engine.load(model, backend="numpy", progress=kw["progress"]))
    try:
        def note(phase: str, done: int, total: int) -> None:
            phases.append((phase, threading.current_thread().name))

        engine = w.load(str(path), progress=note).future.result(60)
        assert w.state == "ready" and engine._controller is not None  # calibrated
        assert engine.takes_source_ids is True  # the worker tokenizes its sources for the index
        assert phases == [(p, "echoline-engine") for p in
                          ("loading weights", "warming up", "calibrating draft lengths")]
    finally:
        w.stop()


def test_a_stand_in_that_is_no_engine_is_not_warmed_up() -> None:
    """Test stand-ins with a few methods load as they are (EngineLike decides)."""
    from echoline.sidecar.engine_like import EngineLike

    class Bare:
        def generate(self, *a: object, **kw: object) -> None:
            raise AssertionError("warm-up ran on a stand-in")

    assert not isinstance(Bare(), EngineLike)
    w = EngineWorker(lambda model, **kw: Bare())
    try:
        w.load("bare").future.result(5)
        assert w.state == "ready" and w.model_label == "bare"
    finally:
        w.stop()


def test_reply_history_setting_applies_to_the_loaded_engine_without_a_reload() -> None:
    """replyHistory (earlier replies kept as draft sources) is validated, is no engine_key
    change, and reaches the loaded engine through a worker job."""
    from echoline.sidecar.server import EcholineServer

    base = cfg.Settings()
    two, errs = cfg.apply(base, {"replyHistory": 2})
    assert two.reply_history == 2 and errs == [] and two.engine_key() == base.engine_key()
    kept, errs = cfg.apply(two, {"replyHistory": -1})
    assert kept.reply_history == 2 and any("replyHistory" in e for e in errs)
    assert cfg.as_lsp_dict(two)["replyHistory"] == 2

    class HistoryEngine:
        def __init__(self, **kw: object) -> None:
            self.loaded_with = kw.get("reply_history")
            self.set_to: list[int] = []

        @property
        def controller(self) -> object:
            return object()

        def encode(self, text: str) -> list[int]:
            return [1, 2, 3]

        def generate(self, ids: list[int], **kw: object) -> None:
            return None

        def set_reply_history(self, n: int) -> None:
            self.set_to.append(n)

    ls = EcholineServer(loader=lambda model, **kw: HistoryEngine(**kw))
    try:
        engine = ls.worker.load("m", reply_history=ls.settings.reply_history).future.result(5)
        assert engine.loaded_with == 4
        ls._loaded_key = ls.settings.engine_key()
        ls.apply_settings({"replyHistory": 1})
        ls.apply_settings({"replyHistory": 1})  # unchanged: no second job
        ls.worker.sync_sources().future.result(5)
        assert engine.set_to == [1] and ls.settings.reply_history == 1
    finally:
        ls.worker.stop()


def test_prompts_fit_the_context_in_tokens_not_characters() -> None:
    """Dense text is ~1 token a character: a 16,000-character window would overflow a 2k
    context. The rewrite window shrinks (keeping the selection) until prompt + reply room
    fit; the inline prompt keeps the tokens nearest the cursor; a selection too large for
    the context is a clear error."""
    from types import SimpleNamespace

    from echoline.sidecar.prompts import fitted_rewrite_ids

    eng = SimpleNamespace(tokenizer=CharTokenizer(False), has_chat_template=False,
                          config=SimpleNamespace(context_length=2000))
    line = "東京タワー" * 10 + "\n"
    text = line * 200 + "def f(x):\n    return x\n" + line * 200
    start = text.index("def f")
    end = start + len("def f(x):\n    return x\n")
    prompt, ids = fitted_rewrite_ids(eng, text, start, end, "rename x", reply_room=256)
    assert len(ids) + 256 <= 2000 and "def f(x):\n    return x" in prompt.plain
    with pytest.raises(ValueError, match="select less"):
        fitted_rewrite_ids(eng, text, 0, len(text), "", reply_room=256)
    fim_eng = SimpleNamespace(tokenizer=CharTokenizer(True), config=SimpleNamespace(context_length=600))
    fim = inline_prompt(fim_eng, "頭" * 5000 + "cursor", "尾" * 1900)
    assert len(fim.ids) <= 300 and fim.ids[0] == 1 and fim.ids[-1] == 3
    cut = fim.ids.index(2)
    assert fim.ids[cut - 6 : cut] == [ord(c) for c in "cursor"]  # the text at the cursor kept


def test_a_selection_holding_a_code_fence_gets_a_longer_fence() -> None:
    """Generation stops at the closing fence: a selection with ``` inside (Markdown, a
    docstring example) must not end the reply at its inner fence."""
    from echoline.sidecar.prompts import fence_for, rewrite_prompt, strip_fence

    assert fence_for("plain code\n") == "```"
    doc = "# Usage\n\n```python\nrun()\n```\n\nMore text.\n"
    assert fence_for(doc) == "````" and fence_for("a ````` b") == "``````"
    p = rewrite_prompt(doc, 0, len(doc), "Fix the typo.", name="README.md")
    assert p.fence == "````" and p.prime == "````markdown\n"
    assert "````markdown\n# Usage" in p.plain and "Rewrite this code:\n````markdown\n" in p.plain
    reply = "# Usage\n\n```python\nrun()\n```\n\nMore text.\n````\nDone."
    assert strip_fence(reply, p.fence) == doc
    assert strip_fence("x = 1\n```\nnote") == "x = 1\n"  # plain files keep the ``` fence


def test_a_job_that_runs_too_long_fails_the_request_and_is_cancelled() -> None:
    """A stuck job (a bug, a wedged model) must not hold its request forever: after
    job_timeout_s the request fails clearly and the job is asked to stop."""
    import asyncio

    from echoline.sidecar.server import REQUEST_FAILED, EcholineServer
    from pygls.exceptions import JsonRpcException

    ls = EcholineServer(loader=lambda model, **kw: object())
    stopped = threading.Event()

    def stuck(engine: object, cancel: threading.Event) -> None:
        cancel.wait(5)
        stopped.set()

    try:
        ls.worker.load("m").future.result(5)
        ls.job_timeout_s = 0.3
        with pytest.raises(JsonRpcException) as err:
            asyncio.run(ls.run_job(stuck, kind="inline"))
        assert err.value.code == REQUEST_FAILED and "longer than 0.3 s" in str(err.value)
        assert stopped.wait(3), "the job was not cancelled"
    finally:
        ls.worker.stop()


def test_inline_prompt_drops_a_kept_start_the_context_would_cut() -> None:
    """On a small context a kept start that makes the head too long falls back to the
    grid; a head cut to the context anyway reports no start to keep (its first token is
    mid-line and moves with the cursor)."""
    from types import SimpleNamespace

    from echoline.sidecar.prompts import INLINE_ANCHOR_CHARS as STEP
    from echoline.sidecar.prompts import inline_head_start, inline_prompt

    text = "".join(f"v{i:04d} = {i:04d}\n" for i in range(2000))  # 13 characters a line
    prefix = text[: 13 * 1500]
    grid = inline_head_start(prefix)  # a 7,202-character head
    keep = grid - 13 * 100  # a line start 1,300 characters above: an 8,502-character head
    assert inline_head_start(prefix, keep=keep) == keep
    roomy = SimpleNamespace(tokenizer=CharTokenizer(True), config=SimpleNamespace(context_length=32768))
    assert inline_prompt(roomy, prefix, "x\n", keep_start=keep).head_start == keep
    # room 8,192 tokens (one a character): the grid's ~6,000-8,000 fit, the kept 9,000 do not
    mid = SimpleNamespace(tokenizer=CharTokenizer(True), config=SimpleNamespace(context_length=16384))
    got = inline_prompt(mid, prefix, "x\n", keep_start=keep)
    assert got.head_start == grid and len(got.ids) == 3 + len(prefix) - grid + 2
    small = SimpleNamespace(tokenizer=CharTokenizer(True), config=SimpleNamespace(context_length=4096))
    cut = inline_prompt(small, prefix, "x\n", keep_start=keep)
    assert cut.head_start is None and len(cut.ids) <= 2048
    plain = SimpleNamespace(tokenizer=CharTokenizer(False), config=SimpleNamespace(context_length=4096))
    assert inline_prompt(plain, prefix, "", keep_start=keep).head_start is None
    assert len(prefix) - keep < 10_000 < 5 * STEP  # within the kept window: only the context drops it


def test_head_starts_follow_edits_and_documents() -> None:
    """The kept start is a line number: an edit within a line above keeps it, lines added
    or removed above shift it, an edit across it or a whole-document change drops it; a
    recording from text older than an edit, or for a closed document, is not kept."""
    from types import SimpleNamespace as NS

    from echoline.sidecar.inline import HeadStarts

    def change(l0: int, c0: int, l1: int, c1: int, text: str) -> NS:
        return NS(range=NS(start=NS(line=l0, character=c0), end=NS(line=l1, character=c1)), text=text)

    text = "".join(f"line {i}\n" for i in range(100))
    starts, uri = HeadStarts(), "file:///a.py"
    starts.opened(uri)
    _, edits = starts.read(uri, text)
    start = text.index("line 40\n")
    starts.record(uri, text, start, edits)
    assert starts.read(uri, text)[0] == start
    starts.edited(uri, [change(3, 2, 3, 4, "XY")])  # within line 3: the same line
    assert starts.read(uri, text)[0] == start
    starts.edited(uri, [change(5, 0, 5, 0, "new\nlines\n")])  # two lines inserted above
    assert starts.read(uri, "new\nlines\n" + text)[0] == start + len("new\nlines\n")
    starts.edited(uri, [change(10, 0, 11, 0, "")])  # a line deleted above (its end at column 0)
    assert starts._line[uri] == 41  # 40 + 2 - 1
    starts.edited(uri, [change(45, 0, 45, 3, "zz")])  # below the start: unaffected
    assert starts._line[uri] == 41
    starts.edited(uri, [change(39, 2, 42, 1, "")])  # across the start line's beginning
    assert starts.read(uri, text)[0] is None
    starts.record(uri, text, start, starts.read(uri, text)[1])
    starts.edited(uri, [NS(text="whole new text")])  # a whole-document change
    assert starts.read(uri, text)[0] is None
    _, edits = starts.read(uri, text)
    starts.edited(uri, [change(80, 0, 80, 0, "x")])
    starts.record(uri, text, start, edits)  # recorded from text older than that edit
    assert starts.read(uri, text)[0] is None
    assert starts.read(uri, text[:50])[0] is None  # fewer lines than the start: none
    starts.closed(uri)
    starts.record(uri, text, start, starts.read(uri, text)[1])  # a job finishing after didClose
    assert starts.read(uri, text)[0] is None
    crlf = text.replace("\n", "\r\n")  # lines as the editor counts them: a CRLF is one break
    starts.opened(uri)
    starts.record(uri, crlf, crlf.index("line 40\r\n"), starts.read(uri, crlf)[1])
    assert starts._line[uri] == 40 and starts.read(uri, crlf)[0] == crlf.index("line 40\r\n")
    starts.edited(uri, [change(2, 0, 2, 0, "a\r\nb\r\n")])  # two CRLF lines above
    assert starts._line[uri] == 42


def test_cursor_params_and_the_warm_up_reads_the_named_version() -> None:
    """``echoline/cursor``: malformed params are refused with the reason (the handler logs
    and drops them); the warm-up reads the position against the text of the version the
    editor named, and waits (no job) while the server holds other text or the position
    names no place in it."""
    from echoline.sidecar.inline import HeadStarts
    from echoline.sidecar.inline_warm import InlineWarm
    from echoline.sidecar.server import _cursor_params

    uri = "file:///w.py"
    good = {"textDocument": {"uri": uri, "version": 3}, "position": {"line": 1, "character": 2}}
    assert _cursor_params(good) == (uri, 3, types.Position(line=1, character=2))
    assert _cursor_params({**good, "textDocument": {"uri": uri}})[1] is None
    for bad, why in (
        ([], "params must be an object"),
        ({"position": good["position"]}, "textDocument.uri"),
        ({**good, "textDocument": {"uri": uri, "version": "3"}}, "version must be an integer"),
        ({**good, "textDocument": {"uri": uri, "version": True}}, "version must be an integer"),
        ({**good, "position": {"line": -1, "character": 0}}, "negative"),
        ({**good, "position": {"line": 1.0, "character": 0}}, "must be {line: int, character: int}"),
        ({"textDocument": good["textDocument"]}, "must be {line: int, character: int}"),
    ):
        with pytest.raises(ValueError, match=why):
            _cursor_params(bad)

    docs: dict[str, tuple[str, int | None]] = {uri: ("ab\ncdef\n", 3)}
    settings = cfg.Settings()
    warm = InlineWarm(None, lambda: settings, docs.get, lambda: "utf-16", HeadStarts(), lambda _i: None)  # type: ignore[arg-type]
    warm._cursor[uri] = (3, types.Position(line=1, character=2))
    assert warm.make_job(uri) is not None
    docs[uri] = ("ab\ncdef\nmore\n", 4)  # the server's text moved on: the cursor is stale
    assert warm.make_job(uri) is None
    warm._cursor[uri] = (None, types.Position(line=2, character=4))  # no version: the text as it is
    assert warm.make_job(uri) is not None
    warm._cursor[uri] = (4, types.Position(line=9, character=0))  # no such line
    assert warm.make_job(uri) is None
    assert warm.make_job("file:///other.py") is None  # no cursor, no document
