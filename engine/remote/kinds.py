"""What differs between servers: request extras, where token ids and cache figures come back.

Every server gets the same OpenAI ``POST /v1/completions`` with ``stream: true``, a prompt
of token ids and greedy settings; this module adds each server's own fields and reads
each server's own answers. Kept apart from the engine so that a request body can be
checked without a server (tests/test_remote_engine.py does, per kind).

- ``llama`` (llama.cpp ``llama-server``): ``cache_prompt`` and a slot pinned per buffer
  (``id_slot``) so a buffer's prompt meets its own cached prefix; the token ids of each
  chunk come back in ``__verbose.tokens`` when the request asks for ``return_tokens`` and
  ``verbose``; an idle prefill is ``n_predict: 0`` on ``/completion``.
- ``vllm``: ``return_token_ids`` (ids in each chunk's choice), ``request_id`` (so logs and
  aborts name the request), ``cache_salt`` (prefix-cache isolation per user or team).
- ``sglang``: ``rid`` (its request id, which ``/abort_request`` takes); workspace files go
  to its n-gram drafter as an external corpus (``/add_external_corpus``).
- ``openai``: any other OpenAI-compatible server; nothing beyond the standard fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("llama", "vllm", "sglang", "openai")
#: The header an affinity router reads to keep one buffer's requests on one replica
#: (vLLM production-stack: ``--routing-logic session --session-key x-session-id``).
SESSION_HEADER = "X-Session-Id"


@dataclass(frozen=True)
class RequestExtras:
    """Per-request identifiers the engine chose; each kind sends those it understands."""

    request_id: str
    session_key: str | None = None  # stable per buffer (a hash, never a path)
    slot: int | None = None  # llama-server slot pinned to the buffer
    cache_salt: str | None = None  # vLLM: prefix-cache isolation (per user or team)


def completion_body(kind: str, prompt: Sequence[int], max_tokens: int, extras: RequestExtras,
                    *, model: str | None = None) -> dict[str, Any]:
    """The streamed greedy ``/v1/completions`` request for ``prompt`` (token ids)."""
    if kind not in KINDS:
        raise ValueError(f"server kind must be one of {', '.join(KINDS)}, got {kind!r}")
    body: dict[str, Any] = {
        "prompt": [int(t) for t in prompt],
        "max_tokens": int(max_tokens),
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "stream": True,
        "echo": False,
    }
    if model:
        body["model"] = model
    if extras.session_key:
        body["user"] = extras.session_key  # the OpenAI field routers and logs already know
    if kind == "llama":
        body.update({"cache_prompt": True, "return_tokens": True, "verbose": True, "top_k": 1,
                     "samplers": ["top_k"]})
        if extras.slot is not None:
            body["id_slot"] = int(extras.slot)
    elif kind == "vllm":
        body.update({"return_token_ids": True, "request_id": extras.request_id, "top_k": 1,
                     "stream_options": {"include_usage": True}})
        if extras.cache_salt:
            body["cache_salt"] = extras.cache_salt
    elif kind == "sglang":
        body.update({"rid": extras.request_id, "top_k": 1, "stream_options": {"include_usage": True}})
    return body


def prefill_request(kind: str, prompt: Sequence[int], extras: RequestExtras,
                    *, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, body) that runs ``prompt`` into the server's prefix cache with no reply.

    llama-server evaluates the prompt and stops with ``n_predict: 0``; the OpenAI servers
    need at least one token, so they generate one (greedy, discarded).
    """
    ids = [int(t) for t in prompt]
    if kind == "llama":
        body: dict[str, Any] = {"prompt": ids, "n_predict": 0, "cache_prompt": True, "stream": False}
        if extras.slot is not None:
            body["id_slot"] = int(extras.slot)
        return "/completion", body
    body = completion_body(kind, ids, 1, extras, model=model)
    body["stream"] = False
    body.pop("stream_options", None)
    return "/v1/completions", body


def request_headers(extras: RequestExtras) -> dict[str, str]:
    """Headers for routers: the buffer's session key and the request id."""
    h = {"X-Request-Id": extras.request_id}
    if extras.session_key:
        h[SESSION_HEADER] = extras.session_key
    return h


def chunk_token_ids(chunk: dict[str, Any]) -> list[int] | None:
    """The token ids a streamed chunk carries, or None when it carries none (text only)."""
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        ids = choices[0].get("token_ids")  # vLLM return_token_ids
        if isinstance(ids, list):
            return [int(t) for t in ids]
    verbose = chunk.get("__verbose")  # llama-server return_tokens + verbose
    if isinstance(verbose, dict) and isinstance(verbose.get("tokens"), list):
        return [int(t) for t in verbose["tokens"]]
    if isinstance(chunk.get("tokens"), list):  # llama-server's native /completion
        return [int(t) for t in chunk["tokens"]]
    return None


def chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        text = choices[0].get("text")
        return text if isinstance(text, str) else ""
    content = chunk.get("content")
    return content if isinstance(content, str) else ""


def chunk_finish(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    return None


def cached_tokens(doc: dict[str, Any]) -> int | None:
    """Prompt tokens the server took from its prefix cache, where it says so."""
    verbose = doc.get("__verbose")
    usage = doc.get("usage")
    timings = doc.get("timings")
    for value in (
        (usage or {}).get("prompt_tokens_details", {}) if isinstance(usage, dict) else {},
        timings if isinstance(timings, dict) else {},
    ):
        if isinstance(value, dict):
            for key in ("cached_tokens", "cache_n"):
                if isinstance(value.get(key), int):
                    return int(value[key])
    if isinstance(verbose, dict) and isinstance(verbose.get("timings"), dict):
        n = verbose["timings"].get("cache_n")
        if isinstance(n, int):
            return n
    return None


def tokenize_request(kind: str, text: str, *, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, body) asking the server for ``text``'s ids: no BOS, special-token text plain."""
    if kind == "llama":
        return "/tokenize", {"content": text, "add_special": False, "parse_special": False}
    body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
    if model:
        body["model"] = model
    return "/tokenize", body


def abort_request(kind: str, request_id: str) -> tuple[str, dict[str, Any]] | None:
    """The server's abort call for a request, where it has one besides closing the stream."""
    if kind == "sglang":
        return "/abort_request", {"rid": request_id}
    return None
