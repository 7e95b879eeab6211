"""The one decode loop: plain (k = 0) and speculative greedy generation.

Exactness argument, in the order the code relies on it:
1. Each round runs one forward over ``[pending] + drafts[:k]``. Row i's
   logits are what plain decoding would compute at that position *if* the
   drafts before it are right, because backends are batch-invariant.
2. Drafts are accepted while they equal the model's own argmax; the first
   mismatch is replaced by that argmax. So every emitted token is the argmax
   plain decoding would emit, whatever the drafts were.
3. Stop rules (stop ids, stop strings, predicates, ``max_tokens``) are applied token by
   token to the emitted sequence, identically for both modes, so the reply
   ends at the same token.
4. When generation ends for any reason, the cache is cut or extended so it
   holds exactly prompt + reply: drafts past the end are dropped, and a
   reply's last token that has not yet been through the model is run (the
   trailing-token rule), so a later turn reusing this cache computes the same
   thing as a cold start.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from echoline.engine.kvcache import KVCache
from echoline.engine.models.base import Transformer
from echoline.engine.step_chain import make_chain
from echoline.engine.types import GenerationResult, GenerationStats, TokenEvent

DRAFT_CONTEXT = 64  # context tokens handed to the n-gram lookup


@dataclass
class StopRules:
    """When a reply ends: a stop id (EOS/EOT), a stop string in the text, the budget, or
    ``stop_when``: a predicate on the reply text so far that answers where to cut it (a
    character offset, at most its length) to end the reply there, or None to go on.

    ``stop_when`` is called after every token with the whole text, so it must keep its
    own place (look only at what is new); it sees the same text token by token in both
    modes, so a reply it ends is a prefix of the plain reply, as with a stop string.

    ``stop_id_when``: a predicate on each token id; True ends the reply at that token as a
    stop id does (its text never joins the reply; finish "stop"). Why a predicate and not
    more ``stop_ids``: a caller's rule can be a class of tokens (every control token of a
    FIM model) that would otherwise mean listing a vocabulary per request.
    """

    max_tokens: int = 256
    stop_ids: frozenset[int] = frozenset()
    stop_strings: Sequence[str] = ()
    stop_when: Callable[[str], int | None] | None = None
    stop_id_when: Callable[[int], bool] | None = None


@dataclass
class ReplyBuilder:
    """The reply as it grows, with its text and the stop decision.

    With ``stream`` (an incremental decoder with ``push(id) -> str``), text grows
    by deltas, so a token costs O(1) however long the reply: on a GPU a step takes
    about a millisecond, and re-decoding the whole reply per token would eat a
    visible share of it. Without one, the whole reply is decoded each time.
    """

    decode: Callable[[list[int]], str]
    rules: StopRules
    stream: object | None = None
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None

    def _grow(self) -> str:
        """The decoded text after the newest token (incomplete UTF-8 held back)."""
        if self.stream is not None:
            return self.text + self.stream.push(self.ids[-1])
        full = self.decode([t for t in self.ids if t not in self.rules.stop_ids])
        return full.rstrip("\ufffd") if full.endswith("\ufffd") else full

    def emit(self, token: int) -> bool:
        """Append one token; True when the reply ends with it."""
        self.ids.append(token)
        if token in self.rules.stop_ids:
            self.finish = "eos"
            return True
        if self.rules.stop_id_when is not None and self.rules.stop_id_when(token):
            self.finish = "stop"
            return True
        full = self._grow()
        for s in self.rules.stop_strings:
            if not s:
                continue
            at = full.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                self.text = full[:at]
                self.finish = "stop"
                return True
        if self.rules.stop_when is not None:
            cut = self.rules.stop_when(full)
            if cut is not None:
                self.text = full[: max(0, min(cut, len(full)))]
                self.finish = "stop"
                return True
        self.text = full
        if len(self.ids) >= self.rules.max_tokens:
            self.finish = "length"
            return True
        return False


class Sampler:
    """Temperature sampling for plain decoding.

    Speculation is greedy-only: at temperature > 0 the engine decodes plainly
    (one token per step) rather than implement the rejection-sampling rule,
    so a sampled reply follows exactly the model's distribution.
    """

    def __init__(self, temperature: float, seed: int | None = None) -> None:
        import numpy as np

        self.temperature = float(temperature)
        self.rng = np.random.default_rng(seed)

    def pick(self, logits) -> int:
        import numpy as np

        z = np.asarray(logits, dtype=np.float64) / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        return int(self.rng.choice(p.shape[0], p=p))


def run_rows(model: Transformer, cache: KVCache, rows: Sequence[int], all_logits: bool = True):
    """One forward over ``rows``; on a backend that is not batch-invariant, padded to a fixed count.

    Padding makes decode, verify and prefill all run the same multi-row kernels,
    so a row's result cannot depend on how many rows shared its pass. Pad rows
    sit after the real ones, which causal attention never lets the real rows
    see, and the cache is cut back to the real rows. The same padding takes a short
    prefill on a graph-replaying backend to a verify width (``_graph_width``).
    """
    backend = model.backend
    n = len(rows)
    width = backend.padded_rows
    if width and n > width:
        raise ValueError(f"{n} rows exceed the backend's fixed row count {width}")
    if not width and not all_logits:  # a short prefill through a verify graph (_graph_width)
        width = _graph_width(backend, cache, n)
    if not width:
        return model.forward(rows, cache, all_logits=all_logits)
    base = cache.length
    logits = model.forward(list(rows) + [rows[-1]] * (width - n), cache, all_logits=True)
    cache.truncate(base + n)
    return logits[:n] if all_logits else logits[n - 1 : n]


#: Verify widths on a graph-replaying backend (generate_tokens' ``pow2`` rule): powers of two
#: up to the backend's ``graph_max_rows`` (``graph_widths``).
GRAPH_WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def width_drafts(k: int) -> int:
    """The most drafts ≤ ``k`` that fill a graph width with the pending token (0, 1, 3, 7 … 63):
    a graph backend verifies 2, 4, 8 … rows, never a new row count."""
    return (1 << (k + 1).bit_length() - 1) - 1 if k > 0 else 0


def graph_widths(backend: object) -> tuple[int, ...]:
    """The verify widths ``backend`` replays as graphs (GRAPH_WIDTHS up to its graph_max_rows)."""
    top = getattr(backend, "graph_max_rows", 0)
    return tuple(w for w in GRAPH_WIDTHS if w <= top)


#: A prefill chunk this short runs as graph-width pieces (``prefill``): one or two 16-row
#: replays cost less than one eager forward, which is host-bound (H200: SmolLM2 14 ms, Qwen
#: 0.5B 7 ms, Qwen 1.5B 8 ms against 1.0, 1.3 and 2.7 ms a 16-row replay). A chunk up to
#: the widest graph is padded to the next width (``_graph_width``); past it a chunk runs
#: eagerly and captures nothing, so longer chunks stay whole.
SHORT_PREFILL = 32


def _graph_width(backend: object, cache: KVCache, n: int) -> int:
    """The verify width a short prefill of ``n`` rows runs as, or 0 (run it as it is).

    Why: a backend that captures a graph per row count (CUDA) pays an eager forward and a
    capture the first time a count is used on a cache's buffers, tens of milliseconds on a
    small model, and a prefill's tail (what changed since the last request, a chat turn's
    header) has a new length almost every time, so each was a capture used once: SmolLM2
    chat ran below plain decoding in `bench spec` while its steady state was 1.15x. Padded
    to the next verify width, it replays a graph the speculative rounds use anyway. Exact:
    the pad rows come after the real ones (causal attention never lets a real row see
    them), rows never depend on how many share a pass (batch invariance), and the cache is
    cut back to the real rows, as a verify round's rejected drafts are.
    """
    widths = graph_widths(backend)
    if n < 1 or len(widths) < 5 or n > widths[-1]:  # at least 16-row graphs, or none of this
        return 0
    if cache.ring or os.environ.get("ECHOLINE_PREFILL_GRAPH_WIDTHS", "1") == "0":
        return 0
    width = next(w for w in widths if w >= n)
    # the pad rows must fit the cache as it is: growing it would replace its buffers
    return width if cache.length + width <= cache.capacity else 0


def prefill(
    model: Transformer,
    cache: KVCache,
    tokens: Sequence[int],
    chunk: int,
    cancel: threading.Event | None,
) -> object | None:
    """Run ``tokens`` into the cache in chunks; logits of the last row, or None if cancelled.

    Chunking bounds the latency of a cancel and the size of one forward; with
    batch-invariant kernels it changes no value.
    """
    backend = model.backend
    if backend.padded_rows:
        chunk = min(chunk, backend.padded_rows)
    chunk = max(1, chunk)
    spans = [(s, min(len(tokens), s + chunk)) for s in range(0, len(tokens), chunk)]
    if spans and _graph_width(backend, cache, 1):
        # A short last chunk as verify-width pieces (SHORT_PREFILL says why).
        s0, end = spans[-1]
        if end - s0 <= SHORT_PREFILL:
            w = min(graph_widths(backend)[-1], SHORT_PREFILL)
            spans[-1:] = [(s, min(end, s + w)) for s in range(s0, end, w)]
    logits = None
    for start, end in spans:
        if cancel is not None and cancel.is_set():
            return None
        logits = run_rows(model, cache, tokens[start:end], all_logits=False)
    return logits


def generate_tokens(
    model: Transformer,
    cache: KVCache,
    prompt_ids: Sequence[int],
    *,
    decode: Callable[[list[int]], str],
    rules: StopRules,
    index=None,
    controller=None,
    on_token: Callable[[TokenEvent], None] | None = None,
    cancel: threading.Event | None = None,
    prefill_chunk: int = 512,
    stats: GenerationStats | None = None,
    sampler: Sampler | None = None,
    stream: Callable[[], object] | None = None,
) -> GenerationResult:
    """Generate greedily after ``prompt_ids``; the cache may already hold a prefix of them.

    ``index``/``controller`` enable speculation (None → plain decoding). The
    index must already hold the prompt as source "prompt"; the loop feeds the
    reply into source "reply".
    """
    stats = stats or GenerationStats()
    backend = model.backend
    t_start = time.perf_counter()
    stats.prompt_tokens = len(prompt_ids)
    reused = cache.length
    if reused >= len(prompt_ids):
        raise ValueError("the cache must leave at least one prompt token to run")
    stats.reused_tokens = reused
    stats.prefilled_tokens = len(prompt_ids) - reused
    reply = ReplyBuilder(decode=decode, rules=rules, stream=stream() if stream is not None else None)
    # Reply tokens not yet in the index: it is read only at a lookup, so rounds that skip the
    # lookup (the plain arm) skip this work too; a lookup adds them first.
    unindexed: list[int] = []

    def index_reply() -> None:
        if unindexed:
            index.extend_source("reply", unindexed)
            unindexed.clear()

    def finish(reason: str | None = None) -> GenerationResult:
        if index is not None:
            index_reply()
        stats.generated_tokens = len(reply.ids)
        stats.total_s = time.perf_counter() - t_start
        stats.kv_bytes = cache.bytes_reserved
        return GenerationResult(list(reply.ids), reply.text, reason or reply.finish or "length", stats)

    if rules.max_tokens <= 0:
        # Nothing to generate, but the prompt still goes through so the cache is complete.
        prefill(model, cache, prompt_ids[reused:], prefill_chunk, cancel)
        return finish("cancelled" if cancel is not None and cancel.is_set() else "length")

    logits = prefill(model, cache, prompt_ids[reused:], prefill_chunk, cancel)
    if logits is None:
        return finish("cancelled")
    pending = int(backend.argmax(logits)[-1]) if sampler is None else sampler.pick(backend.to_host(logits)[-1])
    stats.ttft_s = time.perf_counter() - t_start
    t_first = time.perf_counter()
    context = list(prompt_ids)

    def push(new_ids: list[int], prev_text: str) -> None:
        context.extend(new_ids)
        if index is not None:
            unindexed.extend(new_ids)
        stats.decode_s = time.perf_counter() - t_first
        if on_token is not None:
            stats.generated_tokens = len(reply.ids)
            on_token(TokenEvent(new_ids, reply.text[len(prev_text) :], reply.text, stats))

    prev_text = reply.text
    if reply.emit(pending):
        run_rows(model, cache, [pending])  # trailing-token rule
        push([pending], prev_text)
        return finish()
    push([pending], prev_text)

    speculate = index is not None and controller is not None
    if not speculate and sampler is None:  # plain greedy: every step chained to the end
        _, end = _chained_steps(model, cache, pending, reply, push, cancel, stats, None)
        return finish("cancelled" if end == "cancelled" else None)
    rounds = SpeculativeRounds(model, cache, reply, stats, push, context, index_reply,
                               index=index if speculate else None, controller=controller if speculate else None,
                               sampler=sampler)
    while True:
        if cancel is not None and cancel.is_set():
            run_rows(model, cache, [pending])  # the reply so far is complete in the cache
            return finish("cancelled")
        pending, end = rounds.turn(pending, cancel)
        if end is not None:
            return finish("cancelled" if end == "cancelled" else None)


class SpeculativeRounds:
    """The rounds of ``generate_tokens`` after its first token, when it does not chain plain
    steps to the end: speculative greedy decoding, or sampling (one row a round, no drafts).

    A round drafts (an n-gram lookup, skipped on the plain arm's turns), verifies
    ``[pending] + drafts`` in one batched forward, accepts the drafts up to the first that
    differs from the model's argmax, and emits the accepted tokens and that argmax (the
    module docstring's steps 1-4). Why a class: what carries from one round to the next (a
    lookup made ahead, the last round's ids, the round clock) and what is fixed for the
    whole reply (verify widths, the arm) would otherwise be a dozen locals of one long loop.
    """

    def __init__(self, model: Transformer, cache: KVCache, reply: ReplyBuilder, stats: GenerationStats,
                 push: Callable[[list[int], str], None], context: list[int], index_reply: Callable[[], None], *,
                 index=None, controller=None, sampler: Sampler | None = None) -> None:  # fmt: skip
        backend = model.backend
        self.model, self.cache, self.backend = model, cache, backend
        self.reply, self.stats, self.push, self.context = reply, stats, push, context
        self.index_reply = index_reply
        self.index, self.controller, self.sampler = index, controller, sampler
        self.speculate = index is not None and controller is not None
        self.arm = getattr(controller, "arm", None) if self.speculate else None
        if self.arm is not None:
            self.arm.start()
            self.arm.plain_chained = bool(getattr(backend, "graph_chain", False)) and sampler is None
        self.observe_overhead = getattr(controller, "observe_overhead", None)
        # On a backend that replays a captured graph per (row count, cache), every new width on a
        # new cache pays a capture (several ms): verify only 2, 4, 8 … 64 rows there (a free
        # choice rounded down; choosing among the widths instead did no better in a replay:
        # docs/history/benchmarks-sessions.md, 2026-12-07).
        # ECHOLINE_DRAFT_WIDTHS=all / pow2 forces either way (A/B runs).
        widths = os.environ.get("ECHOLINE_DRAFT_WIDTHS", "")
        self.pow2 = self.speculate and (
            widths == "pow2" or (widths != "all" and getattr(backend, "graph_max_rows", 0) > 0))
        # Where a forward returns before the device finishes (CUDA graphs), the next round's
        # lookup is made while the verify runs, for the outcome the drafts predict (all taken,
        # then the draft's next token); the next round uses it when that came true.
        # ECHOLINE_LOOKUP_AHEAD=0 turns it off (A/B runs).
        self.overlap = (self.speculate and getattr(backend, "graph_chain", False)
                        and os.environ.get("ECHOLINE_LOOKUP_AHEAD", "1") != "0")
        self.ahead: tuple[list[int], object] | None = None
        self.last_ids: list[int] = []
        self.t_round = time.perf_counter()

    def turn(self, pending: int, cancel: threading.Event | None) -> tuple[int, str | None]:
        """One turn of the loop after ``pending`` (emitted, not yet in the cache): a chained
        run of plain-arm rounds, or one round. Returns (pending, None) to go on, or (last
        token, "end" | "cancelled") once the reply has ended with the cache complete."""
        pre, self.ahead = self.ahead, None  # a lookup made ahead serves the very next round only
        arm = self.arm
        look = self.speculate and (arm is None or arm.look())
        run_plain = arm.plain_run() if not look and arm is not None and self.sampler is None else 0
        if run_plain > 1:
            return self._plain_run(pending, run_plain, cancel)
        return self._round(pending, look, pre)

    def _plain_run(self, pending: int, steps: int, cancel: threading.Event | None) -> tuple[int, str | None]:
        """The plain arm's rounds until its next probe, chained: on a GPU the host's work
        between them overlaps the next step, as in plain decoding."""
        t_seg = time.perf_counter()
        base = self.cache.length
        pending, end = _chained_steps(self.model, self.cache, pending, self.reply, self.push, cancel,
                                      self.stats, steps)
        if end is not None:
            return pending, end
        per_step = (time.perf_counter() - t_seg) / steps
        t1 = self.controller.cost.t1(base)
        for _ in range(steps):
            self.arm.observe_plain(max(0.0, per_step - t1))
        self.arm.observe_chained(per_step)
        self.t_round = time.perf_counter()
        return pending, None

    def _lookup(self, pre: tuple[list[int], object] | None) -> tuple[object, list[int], float]:
        """Draft: (the index's draft, the drafts to verify, the lookup's seconds)."""
        stats, controller = self.stats, self.controller
        t_look = time.perf_counter()
        self.index_reply()
        if pre is not None and pre[0] == self.last_ids:
            draft = pre[1]
            stats.lookups_ahead += 1
        else:
            draft = self.index.draft(self.context[-DRAFT_CONTEXT:], controller.max_draft)
        remaining = self.reply.rules.max_tokens - len(self.reply.ids)
        k = controller.choose(draft, self.cache.length, remaining, pow2=self.pow2) if draft.tokens else 0
        if self.pow2:
            k = width_drafts(k)  # rows 2, 4, 8 … 64: a graph each per cache (the controller picks those; any other keeps to them too)
        stats.lookups += 1
        lookup_s = time.perf_counter() - t_look
        stats.lookup_s += lookup_s
        return draft, list(draft.tokens[:k]), lookup_s

    def _round(self, pending: int, look: bool, pre: tuple[list[int], object] | None) -> tuple[int, str | None]:
        """One round: draft (if ``look``), verify in one forward, accept, emit."""
        stats, cache, controller = self.stats, self.cache, self.controller
        draft, drafts, lookup_s = self._lookup(pre) if look else (None, [], 0.0)
        base = cache.length
        rows = [pending] + drafts
        t0 = time.perf_counter()
        logits = run_rows(self.model, cache, rows)
        if self.overlap and look and len(draft.tokens) > len(drafts) > 0:
            guess = drafts + [draft.tokens[len(drafts)]]
            more = self.index.draft(self.context[len(guess) - DRAFT_CONTEXT :] + guess, controller.max_draft)
            self.ahead = (guess, more)
        if self.sampler is None:
            best = self.backend.argmax(logits)
        else:  # sampling runs plain decoding only (no drafts), one row per step
            best = [self.sampler.pick(self.backend.to_host(logits)[-1])]
        dt = time.perf_counter() - t0
        stats.forward_s += dt
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == int(best[accepted]):
            accepted += 1
        new_ids = drafts[:accepted] + [int(best[accepted])]
        stats.rounds += 1
        if self.speculate:
            if look or stats.rounds % 16 == 0:  # plain-arm rounds: a sample keeps T(1) current
                controller.cost.observe(len(rows), base, dt)
            if drafts:
                controller.observe(draft.source, draft.match_len, len(drafts), accepted)
        if drafts:
            stats.drafted += len(drafts)
            stats.accepted += accepted
            src = stats.per_source.setdefault(draft.source, {"drafted": 0, "accepted": 0})
            src["drafted"] += len(drafts)
            src["accepted"] += accepted
        last = self._emit(new_ids, accepted, base)
        if last is not None:
            return last, "end"
        self.last_ids = new_ids
        self._observe_host(look, len(drafts), accepted, base, dt, lookup_s)
        return new_ids[-1], None

    def _emit(self, new_ids: list[int], accepted: int, base: int) -> int | None:
        """Emit a round's tokens one by one (the stop rules see each). Returns the token that
        ended the reply, with the cache cut or extended to hold exactly prompt + reply, or
        None when the reply goes on."""
        cache, reply = self.cache, self.reply
        # Valid cache rows: pending and the accepted drafts.
        cache.truncate(base + 1 + accepted)
        prev_text = reply.text
        for i, tok in enumerate(new_ids):
            if reply.emit(tok):
                if i < accepted:
                    cache.truncate(base + 2 + i)  # drafts after this one are not in the reply
                else:
                    run_rows(self.model, cache, [tok])  # trailing-token rule
                self.push(new_ids[: i + 1], prev_text)
                return tok
        self.push(new_ids, prev_text)
        return None

    def _observe_host(self, look: bool, drafts: int, accepted: int, base: int, dt: float, lookup_s: float) -> None:
        """Charge the round's host time (all but its forward) to the stats and the controller."""
        now = time.perf_counter()
        host = now - self.t_round - dt
        self.stats.host_s += host
        if look:
            if self.observe_overhead is not None:
                self.observe_overhead(host)
            if self.arm is not None:
                t1 = self.controller.cost.t1(base)
                self.arm.observe_lookup(accepted, dt - t1 if drafts else 0.0, host, t1, lookup_s)
        elif self.arm is not None:
            self.arm.observe_plain(host)
        self.t_round = now


def _chained_steps(model: Transformer, cache: KVCache, pending: int, reply: ReplyBuilder,
                   push: Callable[[list[int], str], None], cancel: threading.Event | None,
                   stats: GenerationStats, steps: int | None) -> tuple[int, str | None]:
    """Up to ``steps`` plain steps (None: until the reply ends), each queued before the
    previous one's id is read (engine/step_chain.py says why this is exact).

    At the top of each turn the step of the reply's last token is queued and its output
    untaken, so the cache already holds prompt + reply: a cancel only drains. The step
    queued before reading id t runs t through the model, which the trailing-token rule
    needs whenever t ends the reply. The last of ``steps`` queues nothing ahead, so the
    caller resumes as after a plain round: ``pending`` (returned) not yet in the cache.
    Returns (pending, None) after ``steps``, or (last token, "end" | "cancelled").
    """
    chain = make_chain(model, cache, lambda tok: run_rows(model, cache, [tok]))
    chain.push(pending)
    t_round = time.perf_counter()
    done = 0
    while True:
        if cancel is not None and cancel.is_set():
            chain.drain()
            return pending, "cancelled"
        done += 1
        last = steps is not None and done >= steps
        if not last:
            chain.push(None)
        t0 = time.perf_counter()
        tok = chain.take()
        dt = time.perf_counter() - t0
        stats.forward_s += dt
        stats.rounds += 1
        prev_text = reply.text
        if reply.emit(tok):
            if last:
                chain.push(None)  # the trailing-token rule: tok through the model
            chain.drain()
            push([tok], prev_text)
            return tok, "end"
        push([tok], prev_text)
        pending = tok
        now = time.perf_counter()
        stats.host_s += now - t_round - dt
        t_round = now
        if last:
            return pending, None
