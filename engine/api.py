"""The engine's public face: load a model once, generate many replies.

The sidecar and the CLI use only this module (plus ``engine.types``): a
loaded model with its tokenizer, per-buffer sessions, a draft index that
callers can feed with extra sources (workspace files), and ``generate``.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from echoline.engine.backends import get_backend
from echoline.engine.backends.base import Backend
from echoline.engine.calibration import measure_verify_cost
from echoline.engine.chat_template import PromptEncoding
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.drafting.ngram_index import NgramIndex
from echoline.engine.errors import EcholineError
from echoline.engine.generate import Sampler, StopRules, generate_tokens
from echoline.engine.model_catalog import resolve_model
from echoline.engine.models.loader import load_model
from echoline.engine.sessions import SessionStore
from echoline.engine.tokenizer import Tokenizer
from echoline.engine.types import GenerationResult, GenerationStats, TokenEvent

#: Drafts per verify round where the backend says nothing wider (``Backend.verify_max_rows``).
MAX_DRAFT = 16
#: Earlier replies kept as draft sources (``history:<n>``). Why: an editor asks again about
#: text it was just given — an inline completion re-requested after a keystroke, a rewrite
#: retried with another instruction — and the new reply repeats much of the last one.
REPLY_HISTORY = 4
HISTORY = "history"
HISTORY_CONTEXT = 16  # prompt tokens kept in front of a remembered reply
# Room a prefill leaves for the request that follows it: a selection, an instruction and a
# default-length reply (maxTokens 256) fit without growing the cache.
PREFILL_HEADROOM = 1024
#: Cached positions at which ``prefill_seconds`` reads the calibration: an inline prompt's
#: head (~1,500-2,000 tokens) sits in front of the suffix it prices.
PREFILL_COST_CONTEXT = 2048

#: ``progress(phase, done, total)`` while a model is fetched, loaded and warmed up, so that
#: a first run (a download, a kernel compile, a calibration: minutes in all) is never
#: silent. ``total`` is 0 for a phase without a count; the download's are bytes.
LoadProgress = Callable[[str, int, int], None]
DOWNLOADING = "downloading"  # the registry's labels (model_catalog.pull)
VERIFYING = "verifying"
LOADING = "loading weights"
COMPILING = "compiling kernels (first run only)"
WARMING = "warming up"
CALIBRATING = "calibrating draft lengths"


def default_max_draft(backend: Backend) -> int:
    """Drafts per round when the caller names none: the backend's widest verify less the
    pending token; ``ECHOLINE_MAX_DRAFT`` overrides it (A/B runs of draft length)."""
    env = os.environ.get("ECHOLINE_MAX_DRAFT", "")
    if env.strip():
        return max(1, int(env))
    return max(1, int(getattr(backend, "verify_max_rows", MAX_DRAFT + 1)) - 1)


class Engine(PromptEncoding):
    """A model ready to generate, with sessions and a draft index.

    Not thread-safe: the sidecar drives it from one worker thread.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        backend: str | Backend = "auto",
        kv_budget_bytes: int | None = None,
        prefill_chunk: int = 512,
        max_draft: int | None = None,
        tokenizer: Tokenizer | None = None,
        cpu_activations: str | None = None,
        reply_history: int = REPLY_HISTORY,
    ) -> None:
        t0 = time.perf_counter()
        self.model_path = Path(model_path)
        if isinstance(backend, str):
            backend = get_backend(backend, cpu_activations=cpu_activations)
        self.gguf, self.model = load_model(self.model_path, backend)
        self.config = self.model.config
        self.backend = self.model.backend
        # Tests of tokenizer-less synthetic models pass a stand-in tokenizer.
        self.tokenizer = tokenizer or Tokenizer.from_gguf(self.gguf)
        max_draft = default_max_draft(self.backend) if max_draft is None else max(1, int(max_draft))
        fixed = self.backend.padded_rows
        if fixed:
            # Every forward is padded to fixed rows: a verify round can carry at most fixed - 1 drafts.
            max_draft = min(max_draft, fixed - 1)
            prefill_chunk = min(prefill_chunk, fixed)
        self.prefill_chunk = prefill_chunk
        self.sessions = SessionStore(self.model, kv_budget_bytes, max_rows=max(prefill_chunk, max_draft + 1))
        self.index = NgramIndex()
        self.max_draft = max_draft
        self.reply_history = max(0, int(reply_history))
        self._history: list[str] = []  # source ids of the kept replies, oldest first
        self._history_count = 0
        self._controller: DraftController | None = None
        self._start_cost: VerifyCost | None = None  # the calibrated curve as measured
        self.load_s = time.perf_counter() - t0

    @property
    def controller(self) -> DraftController:
        """The draft controller, calibrated on first use (the cost curve is cached on disk)."""
        return self._calibrated()

    def _calibrated(self, on_measure: Callable[[], None] | None = None) -> DraftController:
        if self._controller is None:
            cost = measure_verify_cost(self.model, self.model_path, on_measure=on_measure)
            self._controller = DraftController(cost, max_draft=self.max_draft)
            self._start_cost = copy.deepcopy(cost)
        return self._controller

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` new tokens after ~2,000 cached ones (the start-up
        calibration's curve, extrapolated past its 17 rows: within ~10 % of a measured
        prefill from 32 to 256 tokens on a 2-core CPU). What a caller that must choose how
        much prompt to run again per request (the sidecar's inline suffix) budgets with.

        Read from a copy of the curve taken at calibration, not the live one: online
        timings move the live curve, and a budget that moved between requests would
        change the prompts, and with them the cached prefixes."""
        self._calibrated()
        assert self._start_cost is not None
        return self._start_cost.time(max(1, int(tokens)), PREFILL_COST_CONTEXT)

    def warm_up(self, progress: LoadProgress | None = None) -> None:
        """Pay the one-off costs now rather than on the first request: the first forward
        (compiling the kernels, or reading them from their cache) and the draft controller's
        calibration (measured once per model and machine, then read from disk)."""
        report = progress or (lambda phase, done, total: None)
        report(WARMING if self.backend.kernels_cached() else COMPILING, 0, 0)
        self.generate(self.encode("def f(x):\n"), max_tokens=2, spec=False)
        self._calibrated(on_measure=lambda: report(CALIBRATING, 0, 0))

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model: str | Path = "smollm2",
        *,
        backend: str = "auto",
        kv_budget_bytes: int | None = None,
        prefill_chunk: int = 512,
        cpu_activations: str | None = None,
        reply_history: int = REPLY_HISTORY,
        progress: LoadProgress | None = None,
    ) -> Engine:
        """Resolve a model name or path (pulling a known name if needed) and load it.

        ``cpu_activations``: the cpu backend's f32 | q8 mode (None: the environment's).
        ``progress``: told the download's bytes and then each phase (``LoadProgress``)."""
        path = resolve_model(model, progress=progress)
        if progress is not None:
            progress(LOADING, 0, 0)
        return cls(
            path,
            backend=backend,
            kv_budget_bytes=kv_budget_bytes,
            prefill_chunk=prefill_chunk,
            cpu_activations=cpu_activations,
            reply_history=reply_history,
        )

    @property
    def model_name(self) -> str:
        return self.model_path.name

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def backend_variant(self) -> str:
        """``backend_name`` plus a numeric mode when one is set (``Backend.variant``)."""
        return self.backend.variant

    # ---- prompts ---------------------------------------------------------------------------
    # has_chat_template, encode, encode_chat: PromptEncoding (engine/chat_template.py)

    # ---- draft sources ---------------------------------------------------------------------
    def set_source(self, source_id: str, text: str) -> None:
        """Register or replace an extra draft source (a workspace file), tokenized here."""
        self.index.set_source(source_id, self.tokenizer.encode(text, add_bos=False, parse_special=False))

    @property
    def takes_source_ids(self) -> bool:
        """The n-gram index drafts from token ids: a sidecar tokenizes sources incrementally."""
        return True

    def set_source_ids(self, source_id: str, ids: Sequence[int]) -> None:
        """Register or replace a draft source already tokenized by the caller (no BOS)."""
        self.index.set_source(source_id, [int(t) for t in ids])

    def remove_source(self, source_id: str) -> None:
        self.index.remove_source(source_id)

    def source_memory_bytes(self) -> int:
        return self.index.memory_bytes()

    def remember_reply(self, reply_ids: Sequence[int], before: Sequence[int] = ()) -> None:
        """Keep a finished reply as a draft source; the oldest beyond ``reply_history`` goes.

        ``before``: the last tokens of its prompt, kept in front of the reply so that a request
        ending the same way (a retry; every chat prompt ends with the assistant header) matches
        them and drafts the reply from its first token, not only once it has begun.
        """
        if self.reply_history <= 0 or len(reply_ids) < 2:
            return
        sid = f"{HISTORY}:{self._history_count}"
        self._history_count += 1
        self.index.set_source(sid, [int(t) for t in before] + [int(t) for t in reply_ids])
        self._history.append(sid)
        while len(self._history) > self.reply_history:
            self.index.remove_source(self._history.pop(0))

    def set_reply_history(self, n: int) -> None:
        """Keep at most ``n`` earlier replies from now on (0: none); the oldest beyond go."""
        self.reply_history = max(0, int(n))
        while len(self._history) > self.reply_history:
            self.index.remove_source(self._history.pop(0))

    def forget_replies(self) -> None:
        """Drop every kept reply (benchmarks measure requests that have no history)."""
        for sid in self._history:
            self.index.remove_source(sid)
        self._history.clear()

    def history_sources(self) -> list[str]:
        """Ids of the kept replies still in the index, oldest first."""
        return [s for s in self._history if self.index.has_source(s)]

    # ---- generation ------------------------------------------------------------------------
    def cached_prefix(self, prompt_ids: Sequence[int], *, session: str | None = None) -> int:
        """How many of ``prompt_ids`` a request in ``session`` would find cached (its own
        cache, or another session's lent to it), without running or changing anything.
        Why: a caller that can ask with one of several prompts (the sidecar's inline head,
        long or short) picks the one whose uncached part it can afford; each reply is still
        the plain greedy one of the prompt that was chosen."""
        return self.sessions.reusable(session, list(prompt_ids))

    def prefill(
        self,
        prompt_ids: Sequence[int],
        *,
        session: str,
        cancel: threading.Event | None = None,
        chunk: int | None = None,
        reserve_tokens: int | None = None,
    ) -> int:
        """Run a prompt prefix into ``session``'s cache ahead of a request; no reply.

        Why: an editor can prefill the stable part of the next prompt (the edited file)
        while the user pauses, so the request that follows prefills only its tail. The
        cache ends holding exactly what ran (a cancel stops between chunks and keeps the
        whole chunks done), so a later ``generate`` reuses it like any earlier request.
        ``chunk`` (default: the engine's prefill chunk) bounds how long a cancel waits.
        ``reserve_tokens`` sizes the cache for the request that will follow (default: the
        prefix + PREFILL_HEADROOM): sized to the prefix alone, that request would grow the
        cache — a reallocation and copy on its critical path (~40 ms at 1k tokens).
        Returns the number of tokens the session's cache now holds of ``prompt_ids``.
        """
        from echoline.engine.generate import prefill

        prompt = [int(t) for t in prompt_ids]
        if len(prompt) < 2:
            return 0
        if any(t < 0 or t >= self.config.vocab_size for t in prompt):
            raise EcholineError("prompt holds token ids outside the vocabulary")
        reserve = reserve_tokens if reserve_tokens is not None else len(prompt) + PREFILL_HEADROOM
        reserve = min(max(reserve, len(prompt)) + self.max_draft + 2, self.config.context_length)
        sess = self.sessions.prepare(session, prompt, reserve)
        cache = sess.cache
        step = max(1, int(chunk or self.prefill_chunk))
        try:
            # Keep the last prompt token out, as generate does: its logits start the reply.
            if cache.length < len(prompt) - 1:
                prefill(self.model, cache, prompt[cache.length : len(prompt) - 1], step, cancel)
        except BaseException:
            self.sessions.drop(session)
            raise
        self.sessions.finish(sess, prompt[: cache.length], [])
        return cache.length

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
        """Greedy reply to ``prompt_ids``; identical token ids with ``spec`` on or off.

        ``stop_when``: an extra stop rule on the reply text (``StopRules.stop_when``);
        ``stop_id_when``: one on each token id (``StopRules.stop_id_when``).

        ``session`` names a buffer whose cache is reused (None: a one-off cache).
        ``temperature`` > 0 samples instead, with plain decoding (speculation is
        greedy-only; see ``engine.generate.Sampler``).
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EcholineError("empty prompt")
        if any(t < 0 or t >= self.config.vocab_size for t in prompt):
            raise EcholineError("prompt holds token ids outside the vocabulary")
        reserve = len(prompt) + max(0, max_tokens) + self.max_draft + 2
        reserve = min(reserve, self.config.context_length)
        sess = self.sessions.prepare(session, prompt, reserve)
        stats = GenerationStats()
        sampler = Sampler(temperature, seed) if temperature > 0 else None
        use_spec = spec and sampler is None
        if use_spec:
            self.index.set_source("prompt", prompt)
            self.index.set_source("reply", [])
        rules = StopRules(
            max_tokens=min(max_tokens, self.config.context_length - len(prompt) - 1),
            stop_ids=self.tokenizer.stop_ids,
            stop_strings=tuple(stop),
            stop_when=stop_when,
            stop_id_when=stop_id_when,
        )
        try:
            result = generate_tokens(
                self.model,
                sess.cache,
                prompt,
                decode=self.tokenizer.decode,
                rules=rules,
                index=self.index if use_spec else None,
                controller=self.controller if use_spec else None,
                on_token=on_token,
                cancel=cancel,
                prefill_chunk=self.prefill_chunk,
                stats=stats,
                sampler=sampler,
                stream=getattr(self.tokenizer, "stream", None),
            )
        except BaseException:
            # The cache's state is unknown after a failure mid-forward: start that buffer afresh.
            if session is not None:
                self.sessions.drop(session)
            raise
        if session is not None:
            self.sessions.finish(sess, prompt, result.token_ids)
        self.remember_reply(
            [t for t in result.token_ids if t not in self.tokenizer.stop_ids], before=prompt[-HISTORY_CONTEXT:]
        )
        result.stats.kv_bytes = self.sessions.bytes_in_use
        return result

