"""Checks at connect: does the server tokenize as echoline does, and is its greedy reply stable?

Tokenizer: echoline sends token ids it made with the GGUF's tokenizer. If the server runs
another model (or the same model with another tokenizer build), those ids mean other
text, and every reply would be silently wrong; so a mismatch refuses the connection.

Exactness: echoline promises the reply plain greedy decoding gives, and a server keeps
that promise only in some modes (vLLM with ``VLLM_BATCH_INVARIANT=1`` and no speculation,
SGLang's deterministic inference; llama.cpp's warm-cache replies can differ from cold ones).
The probe runs one prompt cold, warm (its prefix cached), and again while other requests
run beside it, and compares token ids. Equal everywhere: ``verified``; else ``best-effort``
with where they differed. One probe cannot prove a server exact, only catch one that is not;
``verified`` means "no difference seen", and the status says what was compared.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from echoline.engine.remote import kinds
from echoline.engine.remote.client import RemoteError

#: Strings compared with the server's /tokenize: code, indentation, tabs and CRLF, accents,
#: CJK, emoji (byte fallback), digits, runs of spaces and newlines (merge rules differ).
TOKENIZER_PROBES = (
    "def add(a, b):\n    return a + b\n",
    "\tif (x != y) { y += 1; }\r\n",
    "héllo wörld — naïve café",
    "日本語のテキスト、中文字符",
    "emoji 🙂🚀 and symbols ∑∆≠",
    "x = 1234567890.125e-3  # comment",
    "        \n\n\n    spaces",
)

PROBE_PROMPT = (
    "# Python\ndef fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
)
PROBE_TOKENS = 24
LOAD_PROMPTS = (
    "// C\nint main(void) {\n",
    "-- SQL\nSELECT name, count(*) FROM users\n",
    "<!-- HTML -->\n<ul>\n  <li>",
)


class TokenizerMismatch(RemoteError):
    """The server's tokenizer gives other ids than the GGUF's: the connection is refused."""


def check_tokenizer(engine: Any) -> str:
    """"match", or "unchecked" when the server has no tokenize call; raises on a mismatch."""
    tok = engine.tokenizer
    for text in TOKENIZER_PROBES:
        path, body = kinds.tokenize_request(engine.server_kind, text, model=engine.served_model)
        try:
            reply = engine.client.post_json(path, body)
        except RemoteError as exc:
            if "HTTP 404" in str(exc) or "HTTP 405" in str(exc):
                return "unchecked"
            raise
        theirs = reply.get("tokens") if isinstance(reply, dict) else None
        if not isinstance(theirs, list):
            raise RemoteError(f"the server's {path} answered without a token list: {str(reply)[:200]}")
        theirs = [int(t["id"]) if isinstance(t, dict) else int(t) for t in theirs]
        ours = tok.encode(text, add_bos=False, parse_special=False)
        if theirs and tok.bos_id is not None and theirs[0] == tok.bos_id and (not ours or ours[0] != tok.bos_id):
            theirs = theirs[1:]  # a server that adds BOS whatever it is asked
        if theirs != ours:
            at = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b),
                      min(len(theirs), len(ours)))
            raise TokenizerMismatch(
                f"the server at {engine.client.endpoint.url} tokenizes differently from "
                f"{engine.model_path.name}: for {text!r} it gives {theirs[at:at + 6]} at token {at} where "
                f"echoline gives {ours[at:at + 6]}. Point the 'model' setting at the GGUF the server "
                "runs (or one with the same tokenizer); echoline sends token ids, so a different "
                "tokenizer would turn every prompt into other text."
            )
    return "match"


def exactness_probe(engine: Any, *, tokens: int = PROBE_TOKENS, load: int = len(LOAD_PROMPTS)) -> dict[str, Any]:
    """Cold, warm and under-load replies to one prompt, compared by token id."""
    prompt = engine.encode(PROBE_PROMPT)
    session = f"echoline-probe-{secrets.token_hex(4)}"
    cold_extras = engine.extras(session)
    if engine.server_kind == "vllm":
        # A fresh salt keys a cache no earlier request can have filled: a true cold start.
        cold_extras = kinds.RequestExtras(cold_extras.request_id, cold_extras.session_key, cold_extras.slot,
                                          cache_salt="echoline-probe-" + secrets.token_hex(8))
    cold_override = {"cache_prompt": False} if engine.server_kind == "llama" else None
    cold = engine.complete(prompt, max_tokens=tokens, extras=cold_extras, overrides=cold_override)
    engine.complete(prompt, max_tokens=tokens, extras=engine.extras(session))  # fills the cache
    warm = engine.complete(prompt, max_tokens=tokens, extras=engine.extras(session))
    loaded: dict[int, Any] = {}
    errors: list[str] = []

    def run(i: int, ids: list[int], extras: kinds.RequestExtras) -> None:
        try:
            loaded[i] = engine.complete(ids, max_tokens=tokens, extras=extras)
        except RemoteError as exc:
            errors.append(str(exc))

    others = [engine.encode(p) for p in LOAD_PROMPTS[:load]]
    jobs = [(0, prompt, engine.extras(session + "-load"))]
    jobs += [(i + 1, ids, engine.extras(f"{session}-other-{i}")) for i, ids in enumerate(others)]
    threads = [threading.Thread(target=run, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RemoteError(f"exactness probe: a request under load failed: {errors[0]}")
    under_load = loaded[0]
    differ = []
    if warm.ids != cold.ids:
        differ.append("warm")
    if under_load.ids != cold.ids:
        differ.append("load")
    return {
        "exactness": "best-effort" if differ or engine.text_only else "verified",
        "compared": ["cold", "warm", f"load({len(jobs)} concurrent)"],
        "tokens": len(cold.ids),
        "warmCached": warm.cached,
        "differs": differ,
        "textOnly": bool(engine.text_only),
    }
