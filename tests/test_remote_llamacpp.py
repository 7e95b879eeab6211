"""RemoteEngine against a real llama-server (smollm2), and the real sidecar on top of it.

llama-server is built from the llama.cpp sources vendored in the llama-cpp-python sdist
(``tools/llamacpp_peer.py``: explicit ISA flags, only the ``llama-server`` target; cached
under ~/.cache/echoline-peer, keyed by the sdist version and the flags). A cold build takes
about 13 minutes on a 2-core machine, so ``tests/conftest.py`` starts it in the background
at the lowest priority as soon as these tests are collected; the fixture below waits for it.
A failed build fails these tests. They skip only where there is no C++ tool chain at all (no cmake or no compiler).

The server runs with ``-t 1 --poll 0``: one thread that sleeps when idle, so it leaves the
other core to the test and the sidecar.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import pytest_asyncio
from echoline.engine.remote.engine import RemoteEngine
from lsprotocol import types

from tests.conftest import cpu_backend_name, reference_data

pytestmark = pytest.mark.slow


def _toolchain_missing() -> str | None:
    if shutil.which("cmake") is None:
        return "cmake is not installed (llama-server cannot be built here)"
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        return "no C++ compiler (llama-server cannot be built here)"
    return None


@pytest.fixture(scope="module")
def llama_server(smollm2_path: Path):
    reason = _toolchain_missing()
    if reason:
        pytest.skip(reason)
    from tools.llamacpp_peer import LlamaServer, build

    exe = build()  # raises (and so fails the tests) when a build step fails
    with LlamaServer(smollm2_path, exe=exe, threads=1, ctx=4096, parallel=2,
                     extra=["--poll", "0", "-tb", "1"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def remote(llama_server, smollm2_path) -> RemoteEngine:
    return RemoteEngine.connect(smollm2_path, llama_server.url, server_kind="llama")


def _slots(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/slots", timeout=5) as r:
        return json.load(r)


def test_connect_checks_the_tokenizer_and_probes(remote: RemoteEngine) -> None:
    assert remote.tokenizer_check == "match"
    assert remote.total_slots == 2
    assert remote.served_model  # read from /v1/models
    probe = remote.probe
    assert probe["tokens"] > 0 and not probe["textOnly"]
    assert probe["warmCached"] and probe["warmCached"] > 0, probe  # the warm run hit the cache
    assert remote.exactness in ("verified", "best-effort")
    assert remote.exactness == ("verified" if not probe["differs"] else "best-effort")


def test_token_id_prompts_stream_and_match_llamacpps_own_greedy(remote: RemoteEngine, llama_server) -> None:
    """The reply to a prompt sent as ids is llama.cpp's greedy reply to those ids (its own
    /completion, no cache), and it arrives in several chunks before the end."""
    ref = reference_data()["models"]["SmolLM2-135M-Instruct.Q4_1.gguf"]
    for key in ("py_fib", "go_http"):
        case = ref[key]
        events: list = []
        res = remote.generate(case["prompt_ids"], max_tokens=len(case["greedy_ids"]), session=f"t:{key}",
                              on_token=lambda ev, out=events: out.append((time.perf_counter(), ev)))
        own = llama_server.greedy(case["prompt_ids"], len(case["greedy_ids"]))
        assert res.token_ids == own["ids"], key
        assert res.text == remote.tokenizer.decode(res.token_ids)
        assert len(events) >= 3, "the reply was not streamed"
        assert sum(len(ev.new_ids) for _, ev in events) == len(res.token_ids)
        assert events[0][0] < events[-1][0]


def test_local_and_remote_replies_agree_where_local_matches_llamacpp(
    remote: RemoteEngine, llama_server, smollm2_path
) -> None:
    """The local engine and llama.cpp do different arithmetic (docs/models.md: ~95 % of
    tokens teacher-forced), so their replies can part after a near-tie. Cold on both sides
    (llama.cpp promises no warm == cold; and the reference file came from another llama.cpp
    build, whose replies differ on py_fib), the remote reply is this server's own, and where
    the local reply is that too, all agree."""
    from echoline.engine.api import Engine

    local = Engine.load(smollm2_path, backend=cpu_backend_name())
    stops = remote.tokenizer.stop_ids
    ref = reference_data()["models"]["SmolLM2-135M-Instruct.Q4_1.gguf"]
    compared = []
    for key, case in ref.items():
        n = len(case["greedy_ids"])
        mine = [t for t in local.generate(case["prompt_ids"], max_tokens=n, spec=False).token_ids if t not in stops]
        own = [t for t in llama_server.greedy(case["prompt_ids"], n)["ids"] if t not in stops]
        theirs = remote.complete(case["prompt_ids"], max_tokens=n, extras=remote.extras(None),
                                 overrides={"cache_prompt": False}).ids
        assert [t for t in theirs if t not in stops] == own, key
        if mine == own:
            assert theirs[: len(mine)] == mine, key
            compared.append(key)
    sys.stderr.write(f"local == remote on {compared} of {list(ref)}\n")
    assert compared, "the local engine matched llama.cpp on no reference prompt"


def test_cancel_stops_the_reply_within_half_a_second(remote: RemoteEngine, llama_server) -> None:
    prompt = remote.encode_chat([{"role": "user", "content": "Count from 1 to 500, one number a line."}])
    cancel = threading.Event()
    stamps: dict[str, float] = {}
    seen = []

    def press_cancel() -> None:  # from another thread, while the engine waits on the stream
        stamps["cancel"] = time.perf_counter()
        cancel.set()

    def on_token(ev) -> None:
        seen.append(ev)
        if len(seen) == 3:
            threading.Timer(0.05, press_cancel).start()

    res = remote.generate(prompt, max_tokens=1000, session="t:cancel", on_token=on_token, cancel=cancel)
    stopped = time.perf_counter()
    assert res.finish_reason == "cancelled"
    assert stopped - stamps["cancel"] < 0.5, stopped - stamps["cancel"]
    assert len(res.token_ids) < 900
    # The server dropped the request too: its slot is idle again soon after.
    deadline = time.monotonic() + 5
    while any(s.get("is_processing") for s in _slots(llama_server.url)):
        assert time.monotonic() < deadline, "llama-server kept generating after the stream closed"
        time.sleep(0.05)


def test_prefix_reuse_and_idle_prefill(remote: RemoteEngine) -> None:
    head = remote.encode(Path(__file__).read_text()[:3000])
    a = remote.generate(head + remote.encode("\n# first"), max_tokens=4, session="t:reuse")
    b = remote.generate(head + remote.encode("\n# second"), max_tokens=4, session="t:reuse")
    assert a.stats.reused_tokens < len(head) // 2  # a fresh slot
    assert b.stats.reused_tokens >= len(head) - 2, (b.stats.reused_tokens, len(head))  # tokens_cached
    # An idle prefill (n_predict 0 on the buffer's slot) leaves the next request only its tail.
    other = remote.encode("# another buffer\n" + Path(__file__).read_text()[3000:5000])
    assert remote.prefill(other, session="t:prefill") == len(other) - 1
    c = remote.generate(other + remote.encode("\n# tail"), max_tokens=4, session="t:prefill")
    assert c.stats.reused_tokens >= len(other) - 2, (c.stats.reused_tokens, len(other))
    assert c.stats.prefilled_tokens < 16


# ---- the real sidecar over stdio, on the remote engine -----------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def lsp_remote(llama_server, smollm2_path, tmp_path_factory):
    from pytest_lsp import ClientServerConfig

    from tests.test_sidecar_lsp import Recorder, _plain, wait_state

    root = tmp_path_factory.mktemp("ws-remote")
    rec = Recorder()
    # The serve flags give the engine settings; the editor names only the tokenizer's GGUF.
    cmd = [sys.executable, "-m", "echoline", "serve", "--engine", "openai", "--endpoint", llama_server.url,
           "--server-kind", "llama"]
    client = await ClientServerConfig(server_command=cmd).start()
    client.feature("echoline/status")(lambda params: rec.status.append(_plain(params)))
    client.feature("echoline/rewriteProgress")(lambda params: rec.rewrite_progress.append(_plain(params)))

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def _apply(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        rec.edits.append(params)
        return types.ApplyWorkspaceEditResult(applied=True)

    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(
            window=types.WindowClientCapabilities(work_done_progress=True),
            workspace=types.WorkspaceClientCapabilities(apply_edit=True, configuration=True)),
        root_uri=root.as_uri(), workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="ws")],
        initialization_options={"echoline": {"model": str(smollm2_path), "maxTokens": 160}},
    ))
    client.rec = rec  # type: ignore[attr-defined]
    client.root = root  # type: ignore[attr-defined]
    await wait_state(rec, {"ready", "error"})
    yield client
    await client.shutdown_session()
    await client.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_rewrite_through_the_real_sidecar_on_llama_server(lsp_remote) -> None:
    from tests.test_sidecar_lsp import FIB, open_doc, rewrite, rng, status

    rec = lsp_remote.rec
    ready = [s for s in rec.status if s.get("state") == "ready"]
    assert ready, rec.status
    assert ready[-1]["exactness"] in ("verified", "best-effort") and ready[-1]["endpoint"]
    st = await status(lsp_remote)
    assert st["variant"] == "remote:llama" and st["remote"]["tokenizer"] == "match"
    assert st["exactness"] == ready[-1]["exactness"]
    uri = open_doc(lsp_remote, lsp_remote.root, FIB)
    rec.edits.clear()
    res = await asyncio.wait_for(rewrite(lsp_remote, uri=uri, version=1, range=rng(0, 0, 5, 0),
                                         instruction="", mode="apply"), 120)
    assert res["applied"] is True, res
    assert len(rec.edits) == 1 and rec.edits[0].edit.document_changes[0].edits[0].new_text == res["text"]
    assert res["stats"]["generated_tokens"] > 0
    assert any(p["uri"] == uri and p["tokens"] > 0 for p in rec.rewrite_progress)  # streamed progress
    # The second rewrite on the buffer finds the file part in the server's cache.
    again = await asyncio.wait_for(rewrite(lsp_remote, uri=uri, version=1, range=rng(2, 0, 5, 0),
                                           instruction="", mode="preview"), 120)
    assert again["stats"]["reused_tokens"] > 0, again["stats"]
