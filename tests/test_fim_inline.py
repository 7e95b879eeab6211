"""Inline completion on a FIM-shaped model, through the real server over stdio.

The model is a tiny random ``qwen2`` GGUF whose vocabulary holds
``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>`` (tests/synth.py), so
the server must build a fill-in-the-middle prompt. The server runs as this file
executed as a script: the real ``sidecar.server`` with the real engine, with
``Engine.generate`` wrapped to log what the engine received (prompt ids) and
produced, so the test can check the prompt layout token by token:
prefix before suffix, the special tokens' ids, user text that merely spells a
special token staying plain text, and that the reply is the model's greedy one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the probe server: python tests/test_fim_inline.py LOG

    def _probe(log_path: str) -> None:
        from echoline.engine.api import Engine
        from echoline.sidecar import server

        original = Engine.generate

        def generate(self: Any, prompt_ids: Any, **kw: Any) -> Any:
            result = original(self, prompt_ids, **kw)
            record = {
                "session": kw.get("session"),
                "prompt": [int(t) for t in prompt_ids],
                "token_ids": [int(t) for t in result.token_ids],
                "text": result.text,
                "finish": result.finish_reason,
                "prefilled": int(result.stats.prefilled_tokens),
            }
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            return result

        Engine.generate = generate  # type: ignore[method-assign]
        server.run_stdio()

    _probe(sys.argv[1])
    sys.exit(0)

import asyncio  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import pytest_asyncio  # noqa: E402
from echoline.sidecar.inline import line_end, typing_in_line  # noqa: E402
from echoline.sidecar.lsp_utils import plain_params  # noqa: E402
from echoline.sidecar.prompts import finish_completion, indentation, unheal  # noqa: E402
from lsprotocol import types  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

from tests.synth import FIM_MERGES, _byte_chars, fim_vocab, write_fim_qwen2_model  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

INLINE_MAX = 24
TOKENS, _TYPES, _MERGES = fim_vocab()
ID = {t: i for i, t in enumerate(TOKENS)}
N_PLAIN = 256 + len(FIM_MERGES)  # ids below this are byte / merged tokens (plain text)

# User text that spells special tokens: it must reach the model as plain bytes.
PREFIX = (
    "import math\n"
    "\n"
    "# markers typed by the user: <|fim_suffix|> <|fim_middle|>\n"
    "def area(r):\n"
    "    return "
)
SUFFIX = (
    "\n"
    "\n"
    "\n"
    "def label():\n"
    '    return "<|fim_prefix|>"\n'
)
MID_PREFIX = "def total(xs):\n    s = sum("
MID_SUFFIX = ")\n    return s\n"


def reply_text(ids: list[int]) -> str:
    """A reply's text up to its first control token (which ends an inline completion)."""
    back = {c: b for b, c in enumerate(_byte_chars())}
    out = bytearray()
    for t in ids:
        if t >= N_PLAIN:
            break
        out.extend(back[c] for c in TOKENS[t])
    return out.decode("utf-8", errors="replace")


def decode_plain(ids: list[int]) -> str:
    """Bytes of plain token ids, decoded without the engine (from the vocabulary written)."""
    back = {c: b for b, c in enumerate(_byte_chars())}
    out = bytearray()
    for t in ids:
        assert t < N_PLAIN, f"special token id {t} ({TOKENS[t]!r}) inside user text"
        out.extend(back[c] for c in TOKENS[t])
    return out.decode("utf-8")


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # context 16,384: room for a whole 6,000-character head (the jump test), so the prompt
    # is never trimmed to the text nearest the cursor
    return write_fim_qwen2_model(tmp_path_factory.mktemp("fim") / "fim-qwen2.gguf", seed=2, context=16384)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fimws")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fim_lsp(fim_model: Path, workspace: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "generate.jsonl"
    config = ClientServerConfig(server_command=[sys.executable, str(Path(__file__).resolve()), str(log)])
    client = await config.start()
    statuses: list[Any] = []

    warms: list[dict[str, Any]] = []

    @client.feature("echoline/status")
    def _status(params: Any) -> None:
        statuses.append(params if isinstance(params, dict) else dict(params._asdict()))

    @client.feature("echoline/inlineWarm")
    def _warm(params: Any) -> None:
        warms.append(plain_params(params))

    await client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
            initialization_options={"echoline": {"model": str(fim_model), "inlineMaxTokens": INLINE_MAX}},
        )
    )
    end = time.monotonic() + 120
    while time.monotonic() < end and not any(s.get("state") in ("ready", "error") for s in statuses):
        await asyncio.sleep(0.05)
    assert any(s.get("state") == "ready" for s in statuses), statuses
    client.log_path = log  # type: ignore[attr-defined]
    client.warms = warms  # type: ignore[attr-defined]
    yield client
    await client.shutdown_session()
    await client.stop()


@pytest.fixture(scope="module")
def reference_engine(fim_model: Path) -> Any:
    from echoline.engine.api import Engine

    return Engine.load(str(fim_model))


def generations(client: LanguageClient, session: str) -> list[dict[str, Any]]:
    path: Path = client.log_path  # type: ignore[attr-defined]
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["session"] == session]


async def complete(client: LanguageClient, workspace: Path, name: str, prefix: str, suffix: str):
    path = workspace / name
    text = prefix + suffix
    path.write_text(text)
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    lines = prefix.split("\n")
    pos = types.Position(line=len(lines) - 1, character=len(lines[-1]))
    res = await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=pos,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
    )
    return uri, pos, res


def check_fim_prompt(prompt: list[int], prefix_text: str, suffix_text: str) -> None:
    pre, suf, mid = ID["<|fim_prefix|>"], ID["<|fim_suffix|>"], ID["<|fim_middle|>"]
    assert prompt[0] == pre, "a FIM prompt starts with <|fim_prefix|> (no BOS for this model)"
    assert prompt[-1] == mid, "and ends with <|fim_middle|>, where the model writes the middle"
    for special in (pre, suf, mid):
        assert prompt.count(special) == 1, f"{TOKENS[special]} occurs {prompt.count(special)} times"
    cut = prompt.index(suf)
    assert decode_plain(prompt[1:cut]) == prefix_text  # the prefix, then the suffix: PSM order
    assert decode_plain(prompt[cut + 1 : -1]) == suffix_text


def check_reply(
    client: LanguageClient, engine: Any, uri: str, pos: types.Position, res: Any, prefix: str, removed: str
) -> str:
    runs = generations(client, "inline:" + uri)
    assert len(runs) == 1, runs
    run = runs[0]
    # The reply is the model's greedy one on those ids (the server may stop it early
    # at the end of the block; the tokens it made are the start of the full reply).
    plain = engine.generate(run["prompt"], max_tokens=INLINE_MAX, spec=False)
    assert run["token_ids"] and plain.token_ids[: len(run["token_ids"])] == run["token_ids"]
    cursor_line = prefix.rsplit("\n", 1)[-1]
    reply = unheal(reply_text(run["token_ids"]), removed)
    # typing within a line, the completion ends at that line's end (a stop rule: a prefix)
    cut = line_end(reply) if typing_in_line(cursor_line) else None
    expected = finish_completion(reply if cut is None else reply[:cut], indentation(cursor_line))
    assert isinstance(res, types.InlineCompletionList)
    if not expected:
        assert res.items == []
        return ""
    assert len(res.items) == 1
    item = res.items[0]
    assert isinstance(item.insert_text, str) and item.insert_text == expected
    assert reply.startswith(item.insert_text)
    assert not any(t in item.insert_text for t in TOKENS[N_PLAIN:]), "control-token text in the completion"
    assert item.range is not None and item.range.start == pos
    assert item.range.end.line == pos.line and item.range.end.character >= pos.character
    return item.insert_text


async def test_fim_prompt_with_special_token_text_in_user_code(
    fim_lsp: LanguageClient, workspace: Path, reference_engine: Any
) -> None:
    tok = reference_engine.tokenizer
    assert tok.fim is not None and (tok.fim.prefix, tok.fim.suffix, tok.fim.middle) == (
        ID["<|fim_prefix|>"], ID["<|fim_suffix|>"], ID["<|fim_middle|>"],
    )
    uri, pos, res = await complete(fim_lsp, workspace, "area.py", PREFIX, SUFFIX)
    [run] = generations(fim_lsp, "inline:" + uri)
    # the trailing space before the cursor is left out of the prompt (token healing)
    check_fim_prompt(run["prompt"], PREFIX[:-1], SUFFIX)
    check_reply(fim_lsp, reference_engine, uri, pos, res, PREFIX, " ")


async def test_fim_prompt_mid_line(fim_lsp: LanguageClient, workspace: Path, reference_engine: Any) -> None:
    uri, pos, res = await complete(fim_lsp, workspace, "total.py", MID_PREFIX, MID_SUFFIX)
    [run] = generations(fim_lsp, "inline:" + uri)
    check_fim_prompt(run["prompt"], MID_PREFIX, MID_SUFFIX)
    check_reply(fim_lsp, reference_engine, uri, pos, res, MID_PREFIX, "")


async def test_typing_reuses_the_cached_prompt_and_budgets_the_suffix(
    fim_lsp: LanguageClient, workspace: Path, reference_engine: Any
) -> None:
    """Keystrokes at the cursor: each request carries the tail in whole lines within
    ``inlineSuffixTokens`` and prefills only the typed text and that tail again (the
    buffer's session keeps the prompt up to the cursor), and every reply is still the
    model's greedy one on its prompt."""
    budget = 24
    fim_lsp.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"echoline": {"inlineSuffixTokens": budget}})
    )
    head = "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    "
    tail = "".join(f"\ndef f{i}(a, b):\n    return a * {i} + b\n" for i in range(12))
    try:
        uri, pos, _ = await complete(fim_lsp, workspace, "typing.py", head, tail)
        typed = "return total / len(xs)"
        version = 1
        for n in range(1, len(typed) + 1, 5):
            version += 1
            text = head + typed[:n] + tail
            fim_lsp.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
                )
            )
            cursor = types.Position(line=pos.line, character=pos.character + n)
            await fim_lsp.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    position=cursor,
                    context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Automatic
                    ),
                )
            )
        runs = generations(fim_lsp, "inline:" + uri)
        assert len(runs) == 1 + len(range(1, len(typed) + 1, 5))
        suf, mid = ID["<|fim_suffix|>"], ID["<|fim_middle|>"]
        for k, run in enumerate(runs):
            prompt = run["prompt"]
            carried = prompt[prompt.index(suf) + 1 : -1]
            assert prompt[-1] == mid and 0 < len(carried) <= budget
            tail_text = decode_plain(carried)
            assert tail.startswith(tail_text) and tail_text.endswith("\n"), "whole lines of the tail"
            nxt = tail.index("\n", len(tail_text)) + 1
            assert len(reference_engine.tokenizer.encode(tail[:nxt], add_bos=False, parse_special=False)) > budget
            if k:  # the session kept the prompt up to the cursor: typed text and tail run again
                typed_ids = prompt.index(suf) - runs[k - 1]["prompt"].index(suf) + 2
                assert run["prefilled"] <= typed_ids + len(carried) + 2, (run["prefilled"], typed_ids)
            plain = reference_engine.generate(prompt, max_tokens=INLINE_MAX, spec=False)
            assert plain.token_ids[: len(run["token_ids"])] == run["token_ids"]
    finally:
        fim_lsp.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"echoline": {"inlineSuffixTokens": "auto"}})
        )


async def test_cursor_jumps_keep_the_head_start(
    fim_lsp: LanguageClient, workspace: Path, reference_engine: Any
) -> None:
    """The cursor jumps down across a grid line, then back up, in a long document: the
    server keeps the document's head start (``inline_head_starts``), so each request
    prefills only the text between the two cursors and the tail, not the whole prompt the
    grid alone would give; every reply is still the model's greedy one on its prompt.
    Warm-ups are off here: this is the long head's rule alone (with them on, a request at a
    new place asks with the short head until the long one is warm: tests/test_inline_head.py
    and ``test_a_new_place_asks_short_then_long``)."""
    fim_lsp.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"echoline": {"inlineWarm": False}}))
    try:
        await _jumps(fim_lsp, workspace, reference_engine)
    finally:
        fim_lsp.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"echoline": {"inlineWarm": True}}))


async def _jumps(fim_lsp: LanguageClient, workspace: Path, reference_engine: Any) -> None:
    from echoline.sidecar.prompts import inline_head_start

    text = "".join(f"def g{i}(a, b):\n    return a * {i} + b\n\n" for i in range(700))  # ~22k chars
    ends = [i for i, c in enumerate(text) if c == "\n" and text[i - 1] == "b"]  # after "+ b"
    a, b = next((x, y) for x, y in zip(ends, ends[3:], strict=False)
                if x > 9000 and inline_head_start(text[:x]) != inline_head_start(text[:y]))
    path = workspace / "jumps.py"
    path.write_text(text)
    uri = path.as_uri()
    fim_lsp.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def at(offset: int) -> types.Position:
        line = text.count("\n", 0, offset)
        return types.Position(line=line, character=offset - (text.rfind("\n", 0, offset) + 1))

    # back up to the line above a: the state at a itself would be answered from the recent
    # results (sidecar/inline_store.py), with no run, as checked below
    a2 = ends[ends.index(a) - 1]
    answers = []
    for offset in (a, b, a2):
        answers.append(await fim_lsp.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=at(offset),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))))
    runs = generations(fim_lsp, "inline:" + uri)
    assert len(runs) == 3
    again = await fim_lsp.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=at(a),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
    assert len(generations(fim_lsp, "inline:" + uri)) == 3, "a state seen before runs nothing"
    assert [i.insert_text for i in again.items] == [i.insert_text for i in answers[0].items]
    suf = ID["<|fim_suffix|>"]
    starts = [off - len(decode_plain(r["prompt"][1 : r["prompt"].index(suf)])) for off, r in zip((a, b, a2), runs,
                                                                                              strict=True)]
    assert starts[0] == starts[1] == starts[2] == inline_head_start(text[:a])  # kept: not the grid's for b
    between = len(reference_engine.tokenizer.encode(text[a:b], add_bos=False, parse_special=False))
    for run in runs[1:]:
        tail = len(run["prompt"]) - run["prompt"].index(suf)
        assert run["prefilled"] <= between + tail + 2, (run["prefilled"], between, tail)
        assert run["prefilled"] * 4 < len(run["prompt"])  # the grid alone: the whole prompt again
        plain = reference_engine.generate(run["prompt"], max_tokens=INLINE_MAX, spec=False)
        assert plain.token_ids[: len(run["token_ids"])] == run["token_ids"]

    # two characters typed near the top (far above the head): the start's LINE holds (its
    # offset moved by two, no longer a line start) and the head's text is unchanged, so a
    # request at b (whose grid start differs) prefills only the text from a to b and the tail
    edited = text.replace("def g3(", "def eeg3(", 1)
    fim_lsp.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=at(text.index("g3(")), end=at(text.index("g3("))), text="ee")]))
    await fim_lsp.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=at(b),  # b's line and column
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
    run = generations(fim_lsp, "inline:" + uri)[-1]
    cut = run["prompt"].index(suf)
    assert b + 2 - len(decode_plain(run["prompt"][1:cut])) == starts[0] + 2 != inline_head_start(edited[: b + 2])
    assert edited[: b + 2].endswith(decode_plain(run["prompt"][1:cut]))
    # the session holds the prompt at a2 (the last request), a line above a
    since = len(reference_engine.tokenizer.encode(text[a2:b], add_bos=False, parse_special=False))
    assert run["prefilled"] <= since + len(run["prompt"]) - cut + 2, (run["prefilled"], since)


async def _warm_end(client: LanguageClient, uri: str, seen: int, timeout: float = 60.0) -> dict[str, Any]:
    """The first ``echoline/inlineWarm`` end notification for ``uri`` after the first
    ``seen`` notifications."""
    warms: list[dict[str, Any]] = client.warms  # type: ignore[attr-defined]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done = [w for w in warms[seen:] if w.get("uri") == uri and w.get("state") != "started"]
        if done:
            return done[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no inline warm-up ended for {uri}: {warms[seen:]}")


async def test_cursor_rest_warms_the_inline_prompt(
    fim_lsp: LanguageClient, workspace: Path, reference_engine: Any
) -> None:
    """``echoline/cursor`` on a freshly opened long document: once the cursor rests the
    server prefills the inline prompt there (``sidecar/inline_warm.py``), so the request
    that follows at that cursor runs one token instead of the whole ~2,000-token prompt,
    and after a keystroke (the cursor sent before its didChange, as an editor may) only
    the typed text and the tail; every reply is the model's greedy one on its prompt, and
    every prompt the one it would be without warm-ups (a warm-up never records the
    document's head start). A malformed cursor is dropped and the server keeps serving; a
    cursor at the place of the request just made warms nothing; with ``inlineWarm`` off
    nothing is warmed."""
    text = "".join(f"def w{i}(a, b):\n    return a * {i} + b\n\n" for i in range(400))  # ~13k chars
    c = [i for i, ch in enumerate(text) if ch == "\n" and text[i - 1] == "b"][250]
    path = workspace / "warm.py"
    path.write_text(text)
    uri = path.as_uri()
    fim_lsp.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))

    def at(src: str, offset: int) -> types.Position:
        line = src.count("\n", 0, offset)
        return types.Position(line=line, character=offset - (src.rfind("\n", 0, offset) + 1))

    def cursor(version: int, pos: types.Position) -> None:
        fim_lsp.protocol.notify("echoline/cursor", {
            "textDocument": {"uri": uri, "version": version},
            "position": {"line": pos.line, "character": pos.character}})

    async def ask(pos: types.Position) -> dict[str, Any]:
        await fim_lsp.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
        run = generations(fim_lsp, "inline:" + uri)[-1]
        plain = reference_engine.generate(run["prompt"], max_tokens=INLINE_MAX, spec=False)
        assert plain.token_ids[: len(run["token_ids"])] == run["token_ids"]
        return run

    from echoline.sidecar.prompts import inline_head_start

    warms: list[dict[str, Any]] = fim_lsp.warms  # type: ignore[attr-defined]
    suf = ID["<|fim_suffix|>"]

    def head_start(run: dict[str, Any], offset: int) -> int:
        return offset - len(decode_plain(run["prompt"][1 : run["prompt"].index(suf)]))

    fim_lsp.protocol.notify("echoline/cursor", {"textDocument": {"uri": uri}, "position": {"line": -1}})
    # First the cursor rests further down, at b, whose head start a request at c would keep
    # were it recorded: a warm-up reads the document's kept start but never records one, so
    # the prompts stay what they would be without warm-ups.
    grid_c = inline_head_start(text[:c])
    b = next(x for x in range(c, len(text)) if text[x] == "\n" and text[x - 1] == "b"
             and grid_c != inline_head_start(text[:x]) == inline_head_start(text[:c], keep=inline_head_start(text[:x])))
    seen = len(warms)
    cursor(1, at(text, b))
    assert (await _warm_end(fim_lsp, uri, seen))["state"] == "done"
    seen = len(warms)
    cursor(1, at(text, c))
    done = await _warm_end(fim_lsp, uri, seen)
    assert done["state"] == "done", done
    detail = done["detail"]
    assert detail["tokens"] > 1500 and detail["cached"] == detail["tokens"] - 1, detail
    run = await ask(at(text, c))
    assert len(run["prompt"]) == detail["tokens"] and run["prefilled"] <= 1, (run["prefilled"], detail)
    assert head_start(run, c) == grid_c

    # Enter and an indent typed at the cursor; the editor's cursor arrives before the change
    typed = "\n    "
    edited = text[:c] + typed + text[c:]
    seen = len(warms)
    cursor(2, at(edited, c + len(typed)))
    fim_lsp.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=at(text, c), end=at(text, c)), text=typed)]))
    done = await _warm_end(fim_lsp, uri, seen)
    assert done["state"] == "done", done
    run = await ask(at(edited, c + len(typed)))
    assert run["prefilled"] <= 1, run["prefilled"]
    # what the warm-up spared the keystroke: the request before it had to run the tail again
    assert len(run["prompt"]) - run["prompt"].index(suf) > 8

    # the cursor the editor reports after a keystroke's request, at that request's place:
    # no warm-up (it would only repeat the request)
    seen = len(warms)
    cursor(2, at(edited, c + len(typed)))
    await asyncio.sleep(1.0)
    assert not [w for w in warms[seen:] if w.get("uri") == uri], warms[seen:]

    # off: a resting cursor warms nothing
    fim_lsp.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"echoline": {"inlineWarm": False}}))
    try:
        seen = len(warms)
        cursor(2, at(edited, 10))
        await asyncio.sleep(1.0)
        assert not [w for w in warms[seen:] if w.get("uri") == uri], warms[seen:]
    finally:
        fim_lsp.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"echoline": {"inlineWarm": True}}))
