"""Inline completions while typing, through the real server over stdio with a real model
(smollm2): typing through a shown suggestion, an undo, the completion computed ahead of
its acceptance, and an edit that warms the inline prompt like ``echoline/cursor``.

The server is ``tests/test_fim_inline.py`` run as a script: the real server with
``Engine.generate`` wrapped to log each run (session, prompt ids, reply ids), so the test
can count model runs and check every suggestion against a cold plain-decoding run of its
prompt (``sidecar/inline_store.py`` says why answering a suggestion's rest is sound).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from echoline.sidecar.inline import line_end, typing_in_line
from echoline.sidecar.lsp_utils import plain_params
from echoline.sidecar.prompts import finish_completion, indentation, unheal
from lsprotocol import types
from pytest_lsp import ClientServerConfig

from tests.test_fim_inline import generations as runs  # the engine's logged runs of a session

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

PROBE = Path(__file__).resolve().parent / "test_fim_inline.py"
MAX = 24
HEAD = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
TAIL = "\n\n\nprint(fibonacci(10))\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lsp(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("log") / "generate.jsonl"
    client = await ClientServerConfig(server_command=[sys.executable, str(PROBE), str(log)]).start()
    statuses: list[Any] = []
    warms: list[dict[str, Any]] = []

    @client.feature("echoline/status")
    def _status(params: Any) -> None:
        statuses.append(plain_params(params))

    @client.feature("echoline/inlineWarm")
    def _warm(params: Any) -> None:
        warms.append(plain_params(params))

    ws = tmp_path_factory.mktemp("ws")
    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=ws.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=ws.as_uri(), name="ws")],
        initialization_options={"echoline": {"model": str(smollm2_path), "inlineMaxTokens": MAX,
                                             "inlineWarmMs": 100, "prefillOnIdle": False}}))
    end = time.monotonic() + 300
    while time.monotonic() < end and not any(s.get("state") in ("ready", "error") for s in statuses):
        await asyncio.sleep(0.05)
    assert any(s.get("state") == "ready" for s in statuses), statuses
    client.log_path, client.warms, client.ws = log, warms, ws  # type: ignore[attr-defined]
    yield client
    await client.shutdown_session()
    await client.stop()


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> Any:
    from echoline.engine.api import Engine

    return Engine.load(str(smollm2_path))


def at(text: str, offset: int) -> types.Position:
    return types.Position(line=text.count("\n", 0, offset), character=offset - (text.rfind("\n", 0, offset) + 1))


class Doc:
    """An open document and the cursor in it, edited as a plain LSP client does."""

    def __init__(self, client: Any, name: str, text: str) -> None:
        self.client, self.text, self.version = client, text, 1
        path = client.ws / name
        path.write_text(text)
        self.uri = path.as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=self.uri, language_id="python", version=1, text=text)))

    def edit(self, start: int, end: int, new: str) -> None:
        rng = types.Range(start=at(self.text, start), end=at(self.text, end))
        self.text = self.text[:start] + new + self.text[end:]
        self.version += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
            content_changes=[types.TextDocumentContentChangePartial(range=rng, text=new)]))

    async def ask(self, offset: int) -> str:
        res = await self.client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri), position=at(self.text, offset),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
        return res.items[0].insert_text if res.items else ""

    async def store(self) -> dict[str, Any]:
        got = await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="echoline.status", arguments=[]))
        return dict(plain_params(got)["inlineStore"])


def plain_suggestion(reference: Any, run: dict[str, Any], prefix: str) -> str:
    """The suggestion a cold plain-decoding run of ``run``'s prompt gives (the server's
    post-processing: the healed space, the block's end), after checking the server's reply
    ids are that run's first ones."""
    plain = reference.generate(run["prompt"], max_tokens=MAX, spec=False)
    assert plain.token_ids[: len(run["token_ids"])] == run["token_ids"]
    removed = " " if prefix.endswith(" ") else ""
    reply = unheal(reference.tokenizer.decode(run["token_ids"]), removed)
    cursor_line = prefix.rsplit("\n", 1)[-1]
    cut = line_end(reply) if typing_in_line(cursor_line) else None  # typing within a line: its end
    return finish_completion(reply if cut is None else reply[:cut], indentation(cursor_line))


async def test_typing_through_a_suggestion_runs_no_model(lsp: Any, reference: Any) -> None:
    """Typed characters that start the shown suggestion are answered with its rest and no
    model run; a character that departs from it runs the model (a cold plain-decoding
    completion of the new prompt); an undo back to a state seen answers with no run; and
    the completion after accepting the suggestion is computed ahead, so the request there
    runs nothing either (the ahead run's reply is also plain greedy on its prompt)."""
    doc = Doc(lsp, "fib.py", HEAD + TAIL)
    session = "inline:" + doc.uri
    cursor = len(HEAD)
    first = await doc.ask(cursor)
    [run] = runs(lsp, session)
    assert first == plain_suggestion(reference, run, HEAD)
    assert len(first) >= 3, f"the model's suggestion is too short to type through: {first!r}"

    counters = await doc.store()
    for k in (1, 2):  # type the suggestion's first characters, one at a time
        doc.edit(cursor + k - 1, cursor + k - 1, first[k - 1])
        got = await doc.ask(cursor + k)
        assert got == first[k:], (k, got, first)
        assert first.endswith(got)
    assert len(runs(lsp, session)) == 1, "typing through the suggestion ran the model"
    now = await doc.store()
    assert now["typed"] == counters["typed"] + 2 and now["misses"] == counters["misses"]

    # a character the suggestion does not continue with: the model runs, and its answer is
    # a cold plain-decoding completion of the new prompt
    odd = "#" if first[2] != "#" else "@"
    doc.edit(cursor + 2, cursor + 2, odd)
    got = await doc.ask(cursor + 3)
    after = runs(lsp, session)
    assert len(after) == 2
    assert got == plain_suggestion(reference, after[-1], doc.text[: cursor + 3])
    # ... and the kept suggestion was dropped: deleting the odd character is an undo back
    # to a state answered before (the recent results), not a type-through any more
    doc.edit(cursor + 2, cursor + 3, "")
    assert await doc.ask(cursor + 2) == first[2:]
    assert len(runs(lsp, session)) == 2
    now2 = await doc.store()
    assert now2["recent"] == now["recent"] + 1 and now2["typed"] == now["typed"]

    # accepting the suggestion: its completion was computed ahead, in the background
    end = time.monotonic() + 120
    while time.monotonic() < end:
        st = await doc.store()
        if st["aheadKept"] and not st["aheadPending"]:
            break
        await asyncio.sleep(0.2)
    assert st["aheadKept"] and not st["aheadPending"], st
    doc.edit(cursor + 2, cursor + 2, first[2:])  # the rest of the suggestion, accepted
    n_before = len(runs(lsp, session))
    got = await doc.ask(cursor + len(first))
    assert len(runs(lsp, session)) == n_before, "the accepted suggestion's next completion ran the model"
    accepted = (HEAD + first)[:-1] if first.endswith(" ") else HEAD + first
    kept = [r for r in runs(lsp, "inline-ahead:" + doc.uri)
            if r["token_ids"] and reference.tokenizer.decode(r["prompt"]).endswith(accepted)]
    assert kept, "no completion ahead at the accepted text"
    assert got == plain_suggestion(reference, kept[-1], HEAD + first)


async def test_an_edit_warms_the_inline_prompt_there(lsp: Any) -> None:
    """A didChange from a client that sends no ``echoline/cursor`` starts the inline
    warm-up at the end of its edit, so the first keystroke there runs only itself."""
    text = "".join(f"def w{i}(a, b):\n    return a * {i} + b\n\n" for i in range(60))
    doc = Doc(lsp, "warm.py", text)
    warms: list[dict[str, Any]] = lsp.warms
    seen = len(warms)
    place = text.index("return a * 40")
    doc.edit(place, place + len("return a * 40 + b"), "")  # an edit there, no cursor sent
    end = time.monotonic() + 120
    done: list[dict[str, Any]] = []
    while time.monotonic() < end and not done:
        done = [w for w in warms[seen:] if w.get("uri") == doc.uri and w.get("state") != "started"]
        await asyncio.sleep(0.05)
    assert done and done[0]["state"] == "done", warms[seen:]
    assert done[0]["detail"]["cached"] == done[0]["detail"]["tokens"] - 1 > 100, done[0]
    doc.edit(place, place, "r")  # the first keystroke there
    await doc.ask(place + 1)
    run = runs(lsp, "inline:" + doc.uri)[-1]
    # the warmed prompt ended in the line's indentation (one space healed off): only the
    # indentation's tokens and the keystroke run again, not the ~1,000-token prompt
    assert run["prefilled"] <= 8 and run["prefilled"] * 20 < len(run["prompt"]), run["prefilled"]
