"""``RemoteEngine``: the calls the sidecar makes on ``Engine``, served by an inference server.

A team runs one large model on shared GPUs (vLLM, SGLang, llama-server); each editor's
sidecar keeps everything else — prompts, the workspace index, the stop rules, the
streaming detokenizer — and sends only token ids. Why ids, not text: echoline renders the
chat template and the FIM layout itself with the tokenizer of the GGUF the server runs,
so a prompt is byte-stable across requests (the server's prefix cache sees the same ids
every time) and the reply is cut by the same stop rules as a local one
(``engine.generate.ReplyBuilder``).

Per-buffer reuse becomes the server's prefix cache plus affinity: each buffer's session
name becomes a stable key (a salted hash: paths never leave the machine) that an affinity
router reads, and on llama-server a slot pinned to the buffer.

Not thread-safe, like ``Engine``: the sidecar drives it from its one worker thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echoline.engine.chat_template import PromptEncoding
from echoline.engine.errors import EcholineError
from echoline.engine.generate import ReplyBuilder, StopRules
from echoline.engine.models.loader import open_model_file
from echoline.engine.remote import kinds
from echoline.engine.remote.client import HttpClient, RemoteError, StreamCancelled
from echoline.engine.tokenizer import Tokenizer
from echoline.engine.types import GenerationResult, GenerationStats, TokenEvent

log = logging.getLogger(__name__)

#: Where the API key is read from unless the caller names another variable. Never a setting:
#: settings files end up in dotfile repositories.
API_KEY_ENV = "ECHOLINE_API_KEY"
CACHE_SALT_ENV = "ECHOLINE_CACHE_SALT"
CORPUS_SYNC_S = 10.0  # at most one SGLang corpus upload per this many seconds


@dataclass(frozen=True)
class RemoteConfig:
    """The two numbers the sidecar reads from ``engine.config``."""

    context_length: int
    vocab_size: int


@dataclass(frozen=True)
class RemoteBackend:
    """What the sidecar asks of ``engine.backend``. The server's batching is its own
    business; ``batch_invariant`` only lets an idle prefill be sent whole."""

    name: str = "remote"
    batch_invariant: bool = True


@dataclass
class Reply:
    """One streamed completion as the server sent it (ids, the cache it reused)."""

    ids: list[int]
    text: str
    finish: str  # "eos" | "stop" | "length" | "cancelled"
    cached: int | None
    stats: GenerationStats


class RemoteEngine(PromptEncoding):
    """An ``Engine`` look-alike whose forward passes run on an OpenAI-style server."""

    def __init__(self, model_path: Path, client: HttpClient, *, server_kind: str = "llama",
                 served_model: str | None = None, context_length: int | None = None,
                 tokenizer: Tokenizer | None = None, cache_salt: str | None = None) -> None:
        if server_kind not in kinds.KINDS:
            raise EcholineError(f"serverKind must be one of {', '.join(kinds.KINDS)}, got {server_kind!r}")
        t0 = time.perf_counter()
        self.model_path = Path(model_path)
        self.client = client
        self.server_kind = server_kind
        self.served_model = served_model
        gf = open_model_file(self.model_path)
        self.tokenizer = tokenizer or Tokenizer.from_gguf(gf)
        arch = gf.get("general.architecture", "")
        own_ctx = int(gf.get(f"{arch}.context_length", 0) or 0) or 4096
        ctx = min(own_ctx, context_length) if context_length else own_ctx
        self.config = RemoteConfig(context_length=ctx, vocab_size=self.tokenizer.vocab_size)
        self.cache_salt = cache_salt
        self._key_salt = secrets.token_hex(8)  # session keys are stable per sidecar, opaque to the server
        self.total_slots = 0  # llama-server's slots (0: let the server pick)
        self._slots: OrderedDict[str, int] = OrderedDict()
        self.tokenizer_check = "unchecked"
        self.exactness = "best-effort"
        self.probe: dict[str, Any] = {}
        self.text_only = False  # the server sent text without token ids at least once
        self._sources: dict[str, str] = {}
        self._corpus_dirty = False
        self._corpus_synced_at = 0.0
        self._corpus_lock = threading.Lock()
        self._corpus_name: str | None = None
        self.reply_history = 0
        self.backend = RemoteBackend()
        self.load_s = time.perf_counter() - t0

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def connect(cls, model: str | Path, endpoint: str, *, server_kind: str = "llama",
                api_key: str | None = None, api_key_env: str = API_KEY_ENV,
                read_timeout_s: float = 60.0, probe: bool = True, **_ignored: Any) -> RemoteEngine:
        """Open the tokenizer GGUF (a name or a path), reach the server, check it, probe it.

        ``model`` names the GGUF the server runs (or one with the same tokenizer); the
        server's own model name is read from ``/v1/models``. The API key comes from
        ``api_key`` or else the environment variable ``api_key_env``. Raises
        ``EcholineError`` with a clear message when the server is unreachable or its
        tokenizer differs from the GGUF's. Keyword arguments meant for ``Engine.load``
        (backend, kv budget, ...) are accepted and ignored: the server owns those.
        """
        from echoline.engine.model_catalog import resolve_model
        from echoline.engine.remote.probe import check_tokenizer, exactness_probe

        t0 = time.perf_counter()
        key = api_key if api_key is not None else os.environ.get(api_key_env) or None
        client = HttpClient(endpoint, api_key=key, read_timeout_s=read_timeout_s)
        served, ctx, slots = _discover(client, server_kind)
        engine = cls(resolve_model(model), client, server_kind=server_kind, served_model=served,
                     context_length=ctx, cache_salt=os.environ.get(CACHE_SALT_ENV) or None)
        engine.total_slots = slots
        engine.tokenizer_check = check_tokenizer(engine)
        if probe:
            engine.probe = exactness_probe(engine)
            engine.exactness = engine.probe["exactness"]
        engine.load_s = time.perf_counter() - t0
        return engine

    @property
    def model_name(self) -> str:
        return self.served_model or self.model_path.name

    @property
    def backend_name(self) -> str:
        return "remote"

    @property
    def backend_variant(self) -> str:
        return f"remote:{self.server_kind}"

    def warm_up(self, progress: Callable[[str, int, int], None] | None = None) -> None:
        """Nothing to warm: the server's kernels are its own, and the connect-time probe
        already ran requests through it."""
        return None

    def prefill_seconds(self, tokens: int) -> float | None:
        """Not known: a server's prefill is its own and, on its GPU, far from the budgets a
        local CPU needs (so the sidecar's inline prompt keeps its whole suffix)."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the status command shows about the server."""
        # Ids rebuilt from text since the probe (a text-only chunk, an ambiguous gap) void its verdict.
        exactness = "best-effort" if self.text_only else self.exactness
        return {"endpoint": self.client.endpoint.url, "serverKind": self.server_kind,
                "servedModel": self.served_model, "tokenizer": self.tokenizer_check,
                "exactness": exactness, "probe": self.probe, "textOnly": self.text_only}

    # ---- prompts ---------------------------------------------------------------------------
    # has_chat_template, encode, encode_chat: PromptEncoding (engine/chat_template.py)

    # ---- draft sources ---------------------------------------------------------------------
    # The server drafts (or not) by itself. SGLang's n-gram drafter takes the workspace's
    # files as an external corpus; other servers get nothing, and nothing is kept for them.
    def set_source(self, source_id: str, text: str) -> None:
        if self.server_kind != "sglang":
            return
        with self._corpus_lock:
            self._sources[source_id] = text
            self._corpus_dirty = True

    @property
    def takes_source_ids(self) -> bool:
        """No: SGLang's corpus takes text and other servers take nothing, so ids handed
        over would only be decoded back (or dropped) after a wasted tokenization."""
        return False

    def set_source_ids(self, source_id: str, ids: Sequence[int]) -> None:
        """SGLang takes documents as text: the ids go back to the text they came from."""
        if self.server_kind == "sglang":
            self.set_source(source_id, self.tokenizer.decode([int(t) for t in ids]))

    def remove_source(self, source_id: str) -> None:
        with self._corpus_lock:
            if self._sources.pop(source_id, None) is not None:
                self._corpus_dirty = True

    def source_memory_bytes(self) -> int:
        with self._corpus_lock:
            return sum(len(t) for t in self._sources.values())

    def corpus_id(self) -> str:
        """The SGLang corpus of this workspace: named after its files' common folder (hashed)
        when first asked, then kept — one sidecar serves one workspace, and a name that moved
        with the files would leave the old corpus behind on the server."""
        with self._corpus_lock:
            if self._corpus_name is None:
                ids = sorted(self._sources)
                root = os.path.commonpath(ids) if ids and all("/" in s for s in ids) else ""
                self._corpus_name = "echoline-" + hashlib.sha256(root.encode()).hexdigest()[:12]
            return self._corpus_name

    def sync_corpus(self, force: bool = False) -> bool:
        """Replace the workspace's corpus on an SGLang server; False when nothing was sent."""
        with self._corpus_lock:
            due = self._corpus_dirty and (force or time.monotonic() - self._corpus_synced_at >= CORPUS_SYNC_S)
            if not due:
                return False
            docs = list(self._sources.values())
            self._corpus_dirty = False
            self._corpus_synced_at = time.monotonic()
        cid = self.corpus_id()
        try:
            self.client.post_json("/remove_external_corpus", {"corpus_id": cid})
        except RemoteError:
            pass  # not there yet
        if docs:
            self.client.post_json("/add_external_corpus", {"corpus_id": cid, "documents": docs})
        return True

    def _sync_corpus_async(self) -> None:
        if self.server_kind != "sglang" or not self._corpus_dirty:
            return

        def run() -> None:
            try:
                self.sync_corpus()
            except RemoteError as exc:
                log.warning("SGLang external corpus not updated: %s", exc)

        threading.Thread(target=run, name="echoline-corpus", daemon=True).start()

    # Earlier replies are draft sources of the local engine only; these keep its calls valid.
    def set_reply_history(self, n: int) -> None:
        self.reply_history = max(0, int(n))

    def forget_replies(self) -> None:
        return None

    def history_sources(self) -> list[str]:
        return []

    # ---- sessions --------------------------------------------------------------------------
    def session_key(self, session: str | None) -> str | None:
        if session is None:
            return None
        return hashlib.sha256(f"{self._key_salt}\0{session}".encode()).hexdigest()[:24]

    def _slot(self, session: str | None) -> int | None:
        """llama-server: the slot pinned to ``session`` (least recently used one reassigned)."""
        if self.server_kind != "llama" or session is None or self.total_slots <= 0:
            return None
        if session in self._slots:
            self._slots.move_to_end(session)
            return self._slots[session]
        if len(self._slots) < self.total_slots:
            slot = len(self._slots)
        else:
            _, slot = self._slots.popitem(last=False)
        self._slots[session] = slot
        return slot

    def extras(self, session: str | None) -> kinds.RequestExtras:
        return kinds.RequestExtras(request_id=f"echoline-{uuid.uuid4().hex}", session_key=self.session_key(session),
                                   slot=self._slot(session), cache_salt=self.cache_salt)

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EcholineError("empty prompt")
        if any(t < 0 or t >= self.config.vocab_size for t in prompt):
            raise EcholineError("prompt holds token ids outside the vocabulary")
        return prompt

    # ---- generation ------------------------------------------------------------------------
    def prefill(self, prompt_ids: Sequence[int], *, session: str, cancel: threading.Event | None = None,
                chunk: int | None = None, reserve_tokens: int | None = None) -> int:
        """Run a prompt prefix into the server's cache for ``session`` (its slot, its replica).

        Returns the prompt tokens the server now holds (all but the last, as ``Engine``),
        0 when cancelled. ``chunk`` and ``reserve_tokens`` are the local cache's concerns.
        """
        prompt = self._check_prompt(prompt_ids)
        if len(prompt) < 2:
            return 0
        extras = self.extras(session)
        path, body = kinds.prefill_request(self.server_kind, prompt[:-1], extras, model=self.served_model)
        try:
            self.client.post_json(path, body, headers=kinds.request_headers(extras), cancel=cancel)
        except StreamCancelled:
            return 0
        return len(prompt) - 1

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        spec: bool = True,
        session: str | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
        cancel: threading.Event | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_when: Callable[[str], int | None] | None = None,
        stop_id_when: Callable[[int], bool] | None = None,
    ) -> GenerationResult:
        """The server's greedy reply to ``prompt_ids``, cut by echoline's own stop rules.

        ``spec`` is the server's business (its own drafter, if any). ``temperature`` > 0
        asks the server to sample (with ``seed`` where it takes one).
        """
        prompt = self._check_prompt(prompt_ids)
        self._sync_corpus_async()
        extras = self.extras(session)
        overrides: dict[str, Any] = {}
        if temperature > 0:
            overrides = {"temperature": float(temperature), "top_k": -1, "samplers": None}
            if seed is not None:
                overrides["seed"] = int(seed)
        reply = self.complete(prompt, max_tokens=max_tokens, stop=stop, extras=extras, on_token=on_token,
                              cancel=cancel, overrides=overrides, stop_when=stop_when,
                              stop_id_when=stop_id_when)
        return GenerationResult(token_ids=reply.ids, text=reply.text, finish_reason=reply.finish,
                                stats=reply.stats)

    def complete(self, prompt: list[int], *, max_tokens: int, extras: kinds.RequestExtras,
                 stop: Sequence[str] = (), on_token: Callable[[TokenEvent], None] | None = None,
                 cancel: threading.Event | None = None, overrides: dict[str, Any] | None = None,
                 stop_when: Callable[[str], int | None] | None = None,
                 stop_id_when: Callable[[int], bool] | None = None) -> Reply:
        """One streamed completion with per-request ``extras`` and body ``overrides``
        (a value None removes a field). The probe uses it to force cold and warm runs."""
        limit = min(int(max_tokens), self.config.context_length - len(prompt) - 1)
        if limit < 1:
            raise EcholineError(f"the prompt ({len(prompt)} tokens) leaves no room in the server's "
                                f"context ({self.config.context_length})")
        rules = StopRules(max_tokens=limit, stop_ids=self.tokenizer.stop_ids, stop_strings=tuple(stop),
                          stop_when=stop_when, stop_id_when=stop_id_when)
        out = ReplyBuilder(decode=self.tokenizer.decode, rules=rules, stream=self.tokenizer.stream())
        body = kinds.completion_body(self.server_kind, prompt, limit, extras, model=self.served_model)
        if self.server_kind == "llama":
            body["timings_per_token"] = True  # cache figures before the stream ends
        for key, value in (overrides or {}).items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        stats = GenerationStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        first: float | None = None
        cached: int | None = None
        server_finish: str | None = None
        cancelled = False
        events = self.client.stream("/v1/completions", body, headers=kinds.request_headers(extras), cancel=cancel)
        try:
            for chunk in _chunks(events):
                n = kinds.cached_tokens(chunk)
                if n is not None:
                    cached = n
                server_finish = kinds.chunk_finish(chunk) or server_finish
                ids = kinds.chunk_token_ids(chunk)
                ids = self._fill_gap(chunk, ids, len(out.ids))
                if ids is None:
                    text = kinds.chunk_text(chunk)
                    if not text:
                        continue
                    self.text_only = True  # ids rebuilt from text: not exact in general
                    ids = self.tokenizer.encode(text, add_bos=False, parse_special=False)
                if not ids:
                    continue
                if first is None:
                    first = time.perf_counter()
                    stats.ttft_s = first - t0
                before = len(out.text)
                new: list[int] = []
                for t in ids:
                    new.append(t)
                    if out.emit(t):
                        break
                stats.rounds += 1
                stats.generated_tokens = len(out.ids)
                now = time.perf_counter()
                stats.total_s = now - t0
                stats.decode_s = now - first
                if on_token is not None:
                    on_token(TokenEvent(new_ids=new, text_delta=out.text[before:], text=out.text, stats=stats))
                if out.finish is not None:
                    break
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
        except StreamCancelled:
            cancelled = True
        finally:
            events.close()
        if cancelled or (out.finish is None and cancel is not None and cancel.is_set()):
            self._abort(extras)
            finish = "cancelled" if out.finish is None else out.finish
        elif out.finish is not None:
            finish = out.finish
        else:
            # The server ended on its own: an end-of-generation token it did not send, or its budget.
            finish = "length" if server_finish == "length" else "eos"
        stats.total_s = time.perf_counter() - t0
        stats.generated_tokens = len(out.ids)
        if cached is not None:
            stats.reused_tokens = min(cached, len(prompt))
        stats.prefilled_tokens = len(prompt) - stats.reused_tokens
        return Reply(ids=list(out.ids), text=out.text, finish=finish, cached=cached, stats=stats)

    def _fill_gap(self, chunk: dict[str, Any], ids: list[int] | None, received: int) -> list[int] | None:
        """Put back the ids llama-server left out of its stream (``missing_ids.py``), where the
        chunk says how many tokens exist so far; ids it cannot pin down (several splits of
        the bytes, or none) keep the text right and mark the replies not exact (``text_only``)."""
        verbose = chunk.get("__verbose")
        total = verbose.get("tokens_predicted") if isinstance(verbose, dict) else None
        if ids is None or not isinstance(total, int):
            return ids
        missing = total - received - len(ids)
        if missing <= 0:
            return ids
        from echoline.engine.remote.missing_ids import recover

        text = kinds.chunk_text(chunk).encode("utf-8")
        known = b"".join(self.tokenizer.token_bytes(t) for t in ids)
        if text.endswith(known):
            found = recover(self.tokenizer, text[: len(text) - len(known)], missing)
            if found is not None:
                if not found[1]:
                    self.text_only = True
                return found[0] + ids
        self.text_only = True
        return self.tokenizer.encode(text.decode("utf-8", errors="replace"), add_bos=False, parse_special=False)

    def _abort(self, extras: kinds.RequestExtras) -> None:
        """Tell the server, where it has an abort call; closing the stream already did for the rest."""
        call = kinds.abort_request(self.server_kind, extras.request_id)
        if call is None:
            return
        path, body = call

        def run() -> None:
            try:
                self.client.post_json(path, body)
            except RemoteError as exc:
                log.info("abort of %s not taken: %s", extras.request_id, exc)

        threading.Thread(target=run, name="echoline-abort", daemon=True).start()


def _chunks(events: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a stream (a bare value is skipped)."""
    for doc in events:
        if isinstance(doc, dict):
            yield doc


def _discover(client: HttpClient, kind: str) -> tuple[str | None, int | None, int]:
    """(served model name, the server's context length, llama-server's slot count)."""
    served = None
    ctx = None
    slots = 0
    try:
        models = client.get_json("/v1/models")
    except RemoteError as exc:
        raise RemoteError(f"cannot use the inference server: {exc}") from None
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        served = data[0].get("id") if isinstance(data[0].get("id"), str) else None
        for key in ("max_model_len", "context_length"):
            if isinstance(data[0].get(key), int):
                ctx = int(data[0][key])
    if kind == "llama":
        try:
            props = client.get_json("/props")
        except RemoteError:
            props = None
        if isinstance(props, dict):
            slots = int(props.get("total_slots") or 0)
            settings = props.get("default_generation_settings")
            if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
                ctx = int(settings["n_ctx"])
    return served, ctx, slots
