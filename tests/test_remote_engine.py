"""RemoteEngine and its HTTP client against a scripted server on 127.0.0.1.

The server here is a script, not a model: it answers with token ids the test chose, so
each test checks one thing the client must get right — a chunk split inside a line or a
UTF-8 character, a stall, a dropped connection, a cancel, a refused tokenizer, the
request each server kind gets. The real server is in tests/test_remote_llamacpp.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from echoline.engine.remote import kinds
from echoline.engine.remote.client import HttpClient, RemoteError, RemoteTimeout, StreamCancelled
from echoline.engine.remote.engine import RemoteEngine
from echoline.engine.remote.probe import TokenizerMismatch

from tests.scripted_server import Request, ScriptedServer, event, send_json, start_sse, write


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from echoline.engine.gguf_file import GGUFFile
    from echoline.engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(smollm2_path))


@pytest.fixture
def server():
    with ScriptedServer() as srv:
        yield srv


# ---- the client: SSE framing, timeouts, disconnects, cancel -------------------------------


def test_events_split_inside_lines_and_utf8_characters(server):
    docs = [{"choices": [{"text": "héllo — 日本", "finish_reason": None}]},
            {"choices": [{"text": "🙂", "finish_reason": "stop"}]}]
    raw = b"".join(event(d) for d in docs) + event("[DONE]")

    def route(h, _req):
        start_sse(h)
        for i in range(len(raw)):  # one byte per write: every split falls somewhere odd
            write(h, raw[i : i + 1])

    server.script.routes["/v1/completions"] = route
    got = list(HttpClient(server.url).stream("/v1/completions", {}))
    assert got == docs
    assert "日本".encode()[1:2] in raw  # the multi-byte characters were there to be split


def test_crlf_lines_multiline_data_and_comments(server):
    def route(h, _req):
        start_sse(h)
        write(h, b": keep-alive\r\n\r\nevent: message\r\ndata: {\"choices\": [{\"text\": \r\n")
        write(h, b"data: \"a\", \"finish_reason\": \"length\"}]}\r\n\r\ndata: [DONE]\r\n\r\n")

    server.script.routes["/v1/completions"] = route
    got = list(HttpClient(server.url).stream("/v1/completions", {}))
    assert got == [{"choices": [{"text": "a", "finish_reason": "length"}]}]


def test_a_silent_server_times_out(server):
    def route(h, _req):
        start_sse(h)
        write(h, event({"choices": [{"text": "a", "finish_reason": None}]}))
        time.sleep(3)

    server.script.routes["/v1/completions"] = route
    client = HttpClient(server.url, read_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RemoteTimeout, match="no data for 0.3 s"):
        list(client.stream("/v1/completions", {}))
    assert time.monotonic() - t0 < 2.0


def test_a_connection_dropped_mid_reply_is_an_error(server):
    def route(h, _req):
        start_sse(h)
        write(h, event({"choices": [{"text": "a", "finish_reason": None}]}) + b"data: {\"cho")
        # the handler returns: the connection closes without [DONE] or a finish_reason

    server.script.routes["/v1/completions"] = route
    with pytest.raises(RemoteError, match="ended before the reply did"):
        list(HttpClient(server.url).stream("/v1/completions", {}))


def test_http_errors_quote_the_server(server):
    server.script.routes["/v1/completions"] = lambda h, _r: send_json(
        h, {"error": {"message": "prompt is too long (9000 > 8192)"}}, status=400)
    with pytest.raises(RemoteError, match=r"HTTP 400: prompt is too long \(9000 > 8192\)"):
        list(HttpClient(server.url).stream("/v1/completions", {}))
    with pytest.raises(RemoteError, match="cannot reach"):
        HttpClient("http://127.0.0.1:9").get_json("/v1/models")  # nothing listens on port 9
    with pytest.raises(RemoteError, match="http:// or https://"):
        HttpClient("ftp://example.org")


def test_cancel_closes_the_stream_promptly(server):
    gone = threading.Event()

    def route(h, _req):
        start_sse(h)
        try:
            for _ in range(100):
                write(h, event({"choices": [{"text": "a", "finish_reason": None}]}), pause_s=0.05)
        except (BrokenPipeError, ConnectionResetError):
            gone.set()
            raise

    server.script.routes["/v1/completions"] = route
    cancel = threading.Event()
    got = []
    stamps = {}

    def consume():
        try:
            for doc in HttpClient(server.url).stream("/v1/completions", {}, cancel=cancel):
                got.append(doc)
        except StreamCancelled:
            stamps["stopped"] = time.monotonic()

    t = threading.Thread(target=consume)
    t.start()
    while len(got) < 2:
        time.sleep(0.01)
    stamps["cancel"] = time.monotonic()
    cancel.set()
    t.join(5)
    assert "stopped" in stamps
    assert stamps["stopped"] - stamps["cancel"] < 0.5
    assert gone.wait(3), "the server never saw the connection close"


# ---- the engine: a scripted OpenAI-style server ---------------------------------------------


def chunk_for(kind: str, tok: Any, ids: list[int], finish: str | None, cached: int | None) -> dict:
    choice: dict[str, Any] = {"index": 0, "text": tok.decode(ids), "finish_reason": finish}
    doc: dict[str, Any] = {"object": "text_completion", "choices": [choice]}
    if kind == "vllm":
        choice["token_ids"] = ids
    elif kind == "llama":
        doc["__verbose"] = {"tokens": ids}
        if cached is not None:
            doc["timings"] = {"cache_n": cached}
    if finish and cached is not None and kind != "llama":
        doc["usage"] = {"prompt_tokens_details": {"cached_tokens": cached}}
    return doc


def fake_server(srv: ScriptedServer, tok: Any, kind: str, reply: str | list[int], *, slots: int = 4,
                per_chunk: int = 2, pause_s: float = 0.0, shift_tokenize: bool = False,
                warm_reply: list[int] | None = None) -> list[int]:
    """Routes of a server of ``kind`` that always answers ``reply`` (token ids)."""
    ids = reply if isinstance(reply, list) else tok.encode(reply, add_bos=False, parse_special=False)
    seen: dict[tuple, int] = {}

    def models(h, _r):
        send_json(h, {"data": [{"id": "team-model", "max_model_len": 2048}]})

    def props(h, _r):
        send_json(h, {"total_slots": slots, "default_generation_settings": {"n_ctx": 1024}})

    def tokenize(h, r: Request):
        text = r.body.get("content", r.body.get("prompt"))
        got = tok.encode(text, add_bos=False, parse_special=False)
        send_json(h, {"tokens": [t + 1 for t in got] if shift_tokenize else got})

    def complete(h, r: Request):
        key = tuple(r.body["prompt"])
        n = seen[key] = seen.get(key, 0) + 1
        out = warm_reply if (warm_reply is not None and n > 1) else ids
        start_sse(h)
        limit = min(len(out), r.body["max_tokens"])
        for i in range(0, limit, per_chunk):
            part = out[i : min(i + per_chunk, limit)]
            last = i + per_chunk >= limit
            write(h, event(chunk_for(kind, tok, part, ("length" if limit < len(out) else "stop") if last else None,
                                     len(key) - 1 if n > 1 else 0)), pause_s)
        write(h, event("[DONE]"))

    def prefill(h, r: Request):
        send_json(h, {"content": "", "tokens_cached": len(r.body["prompt"])})

    srv.script.routes.update({"/v1/models": models, "/tokenize": tokenize, "/v1/completions": complete,
                              "/completion": prefill, "/abort_request": lambda h, r: send_json(h, {}),
                              "/add_external_corpus": lambda h, r: send_json(h, {"success": True}),
                              "/remove_external_corpus": lambda h, r: send_json(h, {"success": True})})
    if kind == "llama":
        srv.script.routes["/props"] = props
    return ids


def connect(srv: ScriptedServer, smollm2_path, kind: str, **kw: Any) -> RemoteEngine:
    return RemoteEngine.connect(smollm2_path, srv.url, server_kind=kind, **kw)


def test_a_server_with_another_tokenizer_is_refused(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "llama", "x", shift_tokenize=True)
    with pytest.raises(TokenizerMismatch, match="tokenizes differently from SmolLM2") as info:
        connect(server, smollm2_path, "llama")
    assert "Point the 'model' setting at the GGUF the server runs" in str(info.value)
    assert not server.script.of("/v1/completions"), "nothing is generated on a mismatched server"


@pytest.mark.parametrize("kind", ["llama", "vllm", "sglang"])
def test_request_bodies_per_server_kind(server, tokenizer, smollm2_path, kind, monkeypatch):
    monkeypatch.setenv("ECHOLINE_API_KEY", "sk-test-123")
    monkeypatch.setenv("ECHOLINE_CACHE_SALT", "team-a")
    fake_server(server, tokenizer, kind, "    return a + b\n")
    engine = connect(server, smollm2_path, kind, probe=False)
    assert engine.served_model == "team-model"
    assert engine.config.context_length == (1024 if kind == "llama" else 2048)
    assert engine.tokenizer_check == "match"
    prompt = engine.encode("def add(a, b):\n")
    server.script.requests.clear()
    engine.generate(prompt, max_tokens=8, session="rewrite:file:///home/me/secret/a.py")
    engine.generate(prompt, max_tokens=8, session="rewrite:file:///home/me/secret/a.py")
    engine.generate(prompt, max_tokens=8, session="rewrite:file:///home/me/secret/b.py")
    reqs = server.script.of("/v1/completions")
    a1, a2, b = (r.body for r in reqs)
    assert a1["prompt"] == prompt and a1["stream"] is True and a1["temperature"] == 0.0
    assert a1["max_tokens"] == 8 and a1["model"] == "team-model"
    heads = [r.headers for r in reqs]
    assert all(h["authorization"] == "Bearer sk-test-123" for h in heads)
    key = heads[0]["x-session-id"]
    assert key == heads[1]["x-session-id"] != heads[2]["x-session-id"]
    assert a1["user"] == key and "secret" not in key and "a.py" not in key
    assert heads[0]["x-request-id"] != heads[1]["x-request-id"]
    if kind == "llama":
        assert a1["cache_prompt"] is True and a1["return_tokens"] is True and a1["verbose"] is True
        assert a1["id_slot"] == a2["id_slot"] != b["id_slot"]
    else:
        assert "id_slot" not in a1 and "cache_prompt" not in a1
    if kind == "vllm":
        assert a1["return_token_ids"] is True and a1["cache_salt"] == "team-a"
        assert a1["request_id"] == heads[0]["x-request-id"]
    else:
        assert "cache_salt" not in a1 and "return_token_ids" not in a1
    if kind == "sglang":
        assert a1["rid"] == heads[0]["x-request-id"]


def test_reply_ids_text_stop_rules_and_progress(server, tokenizer, smollm2_path):
    reply = "    return a + b\n```\nMore text after the fence"
    ids = fake_server(server, tokenizer, "vllm", reply)
    engine = connect(server, smollm2_path, "vllm", probe=False)
    events = []
    res = engine.generate(engine.encode("def add(a, b):\n"), max_tokens=64, stop=("```",),
                          session="s", on_token=events.append)
    assert res.finish_reason == "stop"
    assert res.text == "    return a + b\n"
    assert res.token_ids == ids[: len(res.token_ids)]
    assert "".join(e.text_delta for e in events) == res.text
    assert events[-1].stats.generated_tokens == len(res.token_ids)
    # the server's own end: budget ("length") and end of generation ("eos")
    assert engine.generate(engine.encode("x"), max_tokens=3).finish_reason == "length"
    short = engine.generate(engine.encode("y"), max_tokens=5, stop=("never",))
    assert short.finish_reason == "length" and len(short.token_ids) == 5


def test_text_only_servers_are_marked_not_exact(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "openai", "print('hi')\n")
    engine = connect(server, smollm2_path, "openai")
    assert engine.text_only and engine.exactness == "best-effort"
    assert engine.describe()["textOnly"] is True


def test_cancel_mid_reply(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "sglang", "x = 1\n" * 200, per_chunk=1, pause_s=0.02)
    engine = connect(server, smollm2_path, "sglang", probe=False)
    cancel = threading.Event()
    seen = []

    def on_token(ev):
        seen.append(ev)
        if len(seen) == 5:
            cancel.set()

    t0 = time.monotonic()
    res = engine.generate(engine.encode("def f():\n"), max_tokens=400, on_token=on_token, cancel=cancel)
    assert res.finish_reason == "cancelled"
    assert 5 <= len(res.token_ids) < 20
    assert time.monotonic() - t0 < 2.0
    deadline = time.monotonic() + 3
    while not server.script.of("/abort_request") and time.monotonic() < deadline:
        time.sleep(0.02)
    (abort,) = server.script.of("/abort_request")
    assert abort.body["rid"] == server.script.of("/v1/completions")[-1].body["rid"]


def test_exactness_probe(server, tokenizer, smollm2_path):
    steady = tokenizer.encode("    if n < 2:\n        return n\n", add_bos=False, parse_special=False)
    fake_server(server, tokenizer, "llama", steady)
    engine = connect(server, smollm2_path, "llama")
    assert engine.exactness == "verified", engine.probe
    assert engine.probe["differs"] == [] and engine.probe["warmCached"] > 0
    bodies = server.script.bodies("/v1/completions")
    assert bodies[0]["cache_prompt"] is False  # the cold run
    assert sum(1 for b in bodies if b["prompt"] == bodies[0]["prompt"]) == 4  # cold, fill, warm, load


def test_exactness_probe_catches_a_warm_difference(server, tokenizer, smollm2_path):
    cold = tokenizer.encode("    return n\n", add_bos=False, parse_special=False)
    warm = tokenizer.encode("    return 1\n", add_bos=False, parse_special=False)
    fake_server(server, tokenizer, "vllm", cold, warm_reply=warm)
    engine = connect(server, smollm2_path, "vllm")
    assert engine.exactness == "best-effort"
    assert engine.probe["differs"] == ["warm", "load"]
    salts = {b.get("cache_salt") for b in server.script.bodies("/v1/completions")}
    assert len(salts) == 2  # the cold run had a fresh salt of its own


def test_llama_idle_prefill_is_n_predict_zero_on_the_buffer_slot(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "llama", "x")
    engine = connect(server, smollm2_path, "llama", probe=False)
    prompt = engine.encode("def main():\n    pass\n")
    assert engine.prefill(prompt, session="rewrite:a") == len(prompt) - 1
    engine.generate(prompt, max_tokens=1, session="rewrite:a")
    (pre,) = server.script.bodies("/completion")
    gen = server.script.bodies("/v1/completions")[-1]
    assert pre["n_predict"] == 0 and pre["cache_prompt"] is True and pre["prompt"] == prompt[:-1]
    assert pre["id_slot"] == gen["id_slot"]


def test_llama_slots_are_pinned_least_recently_used(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "llama", "x", slots=2)
    engine = connect(server, smollm2_path, "llama", probe=False)
    assert [engine.extras(s).slot for s in ("a", "b", "a", "c", "a", "b")] == [0, 1, 0, 1, 0, 1]
    assert engine.extras(None).slot is None


def test_sglang_workspace_corpus(server, tokenizer, smollm2_path):
    fake_server(server, tokenizer, "sglang", "x")
    engine = connect(server, smollm2_path, "sglang", probe=False)
    assert engine.takes_source_ids is False  # the sidecar hands it text, untokenized
    engine.set_source("file:///w/proj/a.py", "def a(): pass\n")
    engine.set_source("file:///w/proj/pkg/b.py", "def b(): pass\n")
    assert engine.source_memory_bytes() == 28
    assert engine.sync_corpus(force=True)
    (add,) = server.script.bodies("/add_external_corpus")
    assert add["corpus_id"] == engine.corpus_id() and add["corpus_id"].startswith("echoline-")
    assert sorted(add["documents"]) == ["def a(): pass\n", "def b(): pass\n"]
    assert not engine.sync_corpus(force=True)  # nothing changed since
    engine.remove_source("file:///w/proj/a.py")
    assert engine.sync_corpus(force=True)
    assert server.script.bodies("/add_external_corpus")[-1]["documents"] == ["def b(): pass\n"]
    assert server.script.bodies("/remove_external_corpus")[-1]["corpus_id"] == add["corpus_id"]


def test_bad_prompts_and_settings_are_clear_errors(server, tokenizer, smollm2_path):
    from echoline.engine.errors import EcholineError

    fake_server(server, tokenizer, "vllm", "x")
    engine = connect(server, smollm2_path, "vllm", probe=False)
    with pytest.raises(EcholineError, match="outside the vocabulary"):
        engine.generate([10**7])
    with pytest.raises(EcholineError, match="leaves no room"):
        engine.generate([1] * 2048)
    with pytest.raises(EcholineError, match="serverKind must be one of"):
        connect(server, smollm2_path, "tgi")
    with pytest.raises(ValueError, match="server kind"):
        kinds.completion_body("tgi", [1], 1, kinds.RequestExtras("r"))


# ---- settings and the engine choice --------------------------------------------------------


def test_remote_settings_are_checked_and_a_key_in_settings_is_refused():
    from echoline.sidecar import config as cfg

    s, errors = cfg.apply(cfg.Settings(), {"engine": "openai", "endpoint": "http://gpu-box:8000/v1",
                                           "serverKind": "vllm", "apiKeyEnv": "TEAM_KEY"})
    assert errors == []
    assert s.engine_kwargs() == {"engine": "openai", "endpoint": "http://gpu-box:8000/v1",
                                 "server_kind": "vllm", "api_key_env": "TEAM_KEY"}
    assert s.engine_key() != cfg.Settings().engine_key()
    bad, errors = cfg.apply(s, {"engine": "cloud", "endpoint": "gpu-box:8000", "serverKind": "tgi",
                                "apiKeyEnv": "sk-live-abc=", "apiKey": "sk-live-secret"})
    assert bad == s  # every bad value kept the last good one
    assert len(errors) == 5
    assert not any("sk-live-secret" in e for e in errors)
    assert any("apiKey refused" in e and "ECHOLINE_API_KEY" in e for e in errors)
    assert cfg.Settings().engine_kwargs() == {}


def test_engine_choice_errors(monkeypatch):
    from echoline.engine.errors import EcholineError
    from echoline.sidecar import config as cfg
    from echoline.sidecar.engine_choice import load_engine

    with pytest.raises(EcholineError, match="needs an endpoint"):
        load_engine("smollm2", engine="openai")
    with pytest.raises(EcholineError, match="cannot use the inference server"):
        load_engine("smollm2", engine="openai", endpoint="http://127.0.0.1:9", backend="cpu")
    monkeypatch.setenv(cfg.ENV_ENGINE, "openai")
    monkeypatch.setenv(cfg.ENV_ENDPOINT, "http://127.0.0.1:9")
    assert cfg.Settings().engine_kwargs()["endpoint"] == "http://127.0.0.1:9"  # `serve --endpoint`


def _gappy_llama(server, tokenizer, reply):
    """A llama-server stream of ``reply`` that, like the real one, sends no chunk for a token
    ending inside a UTF-8 character; the next chunk has both tokens' text, its own id and the
    running count (``tokens_predicted``)."""
    fake_server(server, tokenizer, "llama", "x")

    def complete(h, r):
        start_sse(h)
        pending = b""
        for i, t in enumerate(reply):
            pending += tokenizer.token_bytes(t)
            try:
                text = pending.decode("utf-8")
            except UnicodeDecodeError:
                continue  # what llama-server does: nothing sent for this token
            pending = b""
            doc = {"choices": [{"text": text, "finish_reason": None}],
                   "__verbose": {"tokens": [t], "tokens_predicted": i + 1}}
            write(h, event(doc))
        write(h, event({"choices": [{"text": "", "finish_reason": "stop"}], "__verbose": {"tokens": []}}))
        write(h, event("[DONE]"))

    server.script.routes["/v1/completions"] = complete


def test_an_id_llama_server_leaves_out_of_its_stream_is_recovered(server, tokenizer, smollm2_path):
    enc = lambda s: tokenizer.encode(s, add_bos=False, parse_special=False)  # noqa: E731
    reply = enc("x =") + [4636, 10644] + enc(" 1")  # " \xe2" then "\x88\x92": " −" (U+2212)
    assert tokenizer.token_bytes(4636) == b" \xe2" and tokenizer.token_bytes(10644) == b"\x88\x92"
    _gappy_llama(server, tokenizer, reply)
    engine = connect(server, smollm2_path, "llama", probe=False)
    res = engine.generate(engine.encode("Say it:"), max_tokens=64)
    assert res.token_ids == reply and res.text == "x = \u2212 1"
    assert not engine.text_only


def test_ambiguous_left_out_ids_keep_the_text_and_mark_the_engine(server, tokenizer, smollm2_path):
    reply = tokenizer.encode("naïve 日本語 🙂 done", add_bos=False, parse_special=False)
    _gappy_llama(server, tokenizer, reply)
    engine = connect(server, smollm2_path, "llama", probe=False)
    res = engine.generate(engine.encode("Say it:"), max_tokens=64)
    assert res.text == "naïve 日本語 🙂 done"
    assert engine.text_only  # " \xe6"+"\x97" or " "+"\xe6\x97": the bytes cannot tell
    assert engine.describe()["exactness"] == "best-effort"


def test_gap_recovery_refuses_ambiguous_bytes(tokenizer):
    from echoline.engine.remote.missing_ids import recover

    assert recover(tokenizer, b" \xe2", 1) == ([4636], True)
    a, b = (tokenizer.encode(c, add_bos=False, parse_special=False) for c in "ab")
    assert recover(tokenizer, b"ab", 2) == (a + b, True)  # one split into two entries
    assert recover(tokenizer, b"the", 2)[1] is False  # "t"+"he" and "th"+"e": ambiguous
    assert recover(tokenizer, b"\xff\xfe\xfd" * 3, 1) is None  # no single token has those bytes
