"""Draft-length controller: how many guessed tokens to verify this round.

Why: a verify round of k drafts costs a whole forward pass of k+1 rows, T(k+1), and only
pays off when the expected tokens gained beat that cost (shared/reading: the verify
step's cost decides everything). Per round we maximise

    speedup(k) = E[tokens | k] × T(1) / T(k+1),   E = 1 + Σ_{i≤k} Π_{j≤i} p_j

with T measured on this machine (whole-forward times, updated online) and p_j the chance
that draft position j is accepted given the earlier ones were. p_j is tracked per source and
per *effective match length* (the match length plus the j-1 tokens accepted before it),
because a longer match predicts a longer copy. The index reports a match of at most its
``max_n`` (32) tokens, so the controller also follows the *copy streak*: when this round's
draft continues the same source exactly where the last round's accepted tokens left it, the
text just written matches that source for the whole streak, and the match length counted is
the streak's (buckets up to 128). Why: a reply that re-copies a long passage (a repeated
request, an edit of code it wrote before) was judged like any 32-token match, so drafts
stayed short where whole rounds were being accepted. k = 0 unless the best speedup clears a
small margin. When drafts keep failing, p falls and k goes to 0 within a round or two; an
exploration budget (a fraction of plain-decode time, 1% by default) pays for occasional
probes so that a source that starts matching later is noticed.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from statistics import median

from echoline.engine.drafting.ngram_index import Draft
from echoline.engine.drafting.plain_arm import PlainArm, plain_arm_enabled

# Match-length buckets (lower bounds) and the prior acceptance for each: a brand-new
# source with a long match is worth trying; a 1-token match rarely is.
# Past 32 (the index's longest match) only a copy streak reaches them.
MATCH_BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)
PRIOR_ACCEPT: tuple[float, ...] = (0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.72, 0.8, 0.85, 0.9, 0.92, 0.94, 0.96)


_MAX_CREDIT = 1.0  # at most one plain step's worth of exploration is banked


def copy_streak_enabled() -> bool:
    """``ECHOLINE_DRAFT_STREAK=0`` judges every draft at the index's match alone: for A/B runs."""
    return os.environ.get("ECHOLINE_DRAFT_STREAK", "1") != "0"


def match_bucket(match_len: int) -> int:
    """Index of the bucket holding ``match_len`` (>= 1)."""
    return max(0, bisect.bisect_right(MATCH_BUCKETS, match_len) - 1)


class VerifyCost:
    """Whole-forward time T(rows, ctx) for ``rows`` new rows after ``ctx`` cached positions.

    Stored on a grid (measured row counts × context buckets), interpolated linearly in
    both and extrapolated from the last two points beyond the grid. Each grid cell keeps
    its recent observations and reads as their median, so online timings (which include
    everything a real step does) replace the start-up measurement, and a stray slow step
    (GC, another process) does not swing the choice.
    """

    def __init__(
        self,
        rows: Sequence[int],
        ctxs: Sequence[int],
        times: Sequence[Sequence[float]],
        window: int = 9,
    ) -> None:
        if list(rows) != sorted(set(rows)) or rows[0] != 1:
            raise ValueError("rows must be increasing and start at 1")
        if list(ctxs) != sorted(set(ctxs)) or not ctxs:
            raise ValueError("ctxs must be increasing and non-empty")
        if len(times) != len(rows) or any(len(r) != len(ctxs) for r in times):
            raise ValueError("times must be len(rows) × len(ctxs)")
        self.rows = [int(r) for r in rows]
        self.ctxs = [int(c) for c in ctxs]
        self.window = window
        # The start-up measurement counts as a few observations: one stray online timing
        # cannot move the median, a sustained change replaces it after ~window/2 rounds.
        seed = max(1, window // 3)
        self._seed_count = seed
        self._seed = [[float(t) for t in row] for row in times]
        self._obs = [[deque([float(t)] * seed, maxlen=window) for t in row] for row in times]
        self._t = [[float(t) for t in row] for row in times]
        self._last_seen = [[0] * len(row) for row in times]
        self._t_used = [row[:] for row in self._t]  # the values the caches were built from
        self._cache: dict[int, list[float]] = {}
        self._ratio_cache: dict[tuple[int, int], list[float]] = {}
        self.observations = 0

    # ----- construction -----
    @classmethod
    def measure(
        cls,
        fn: Callable[[int, int], float],
        rows: Iterable[int] = tuple(range(1, 18)),
        ctxs: Iterable[int] = (0, 512, 2048, 8192),
        repeats: int = 3,
    ) -> VerifyCost:
        """Build from ``fn(rows, ctx) -> seconds`` (one whole forward); median of repeats."""
        rows, ctxs = sorted(set(rows)), sorted(set(ctxs))
        times = [[median(fn(r, c) for _ in range(max(1, repeats))) for c in ctxs] for r in rows]
        return cls(rows, ctxs, times)

    @classmethod
    def from_ratios(cls, ratios: Sequence[float], t1: float = 1.0) -> VerifyCost:
        """Context-independent costs: T(r) = t1 × ratios[r-1] (ratios[0] should be 1)."""
        rows = list(range(1, len(ratios) + 1))
        return cls(rows, [0], [[t1 * r] for r in ratios])

    # ----- queries -----
    def time(self, rows: int, ctx: int) -> float:
        """Interpolated T(rows, ctx) in seconds (exact context), on the physical curve."""
        return _interp(self.rows, self._column(float(ctx)), rows)

    def t1(self, ctx: int) -> float:
        """T(1, ctx) from the per-32-positions cache: cheap enough to ask every round."""
        return self._times_at(ctx)[0]

    def ratio(self, rows: int, ctx: int) -> float:
        """T(rows, ctx) / T(1, ctx): the cost of a verify round in plain-decode steps."""
        return self.time(rows, ctx) / self.time(1, ctx)

    def ratios(self, max_rows: int, ctx: int) -> list[float]:
        """[T(r)/T(1) for r in 0 … max_rows] (index = rows; [0] = 0).

        Cached per 32 context positions: ``choose`` runs every round and the cost curve
        barely moves over 32 positions.
        """
        key = (max(0, int(ctx)) >> 5, max_rows)
        out = self._ratio_cache.get(key)
        if out is None:
            ts = self._times_at(ctx)
            out = [0.0] + [_interp(self.rows, ts, r) / ts[0] for r in range(1, max_rows + 1)]
            if len(self._ratio_cache) > 4096:
                self._ratio_cache.clear()
            self._ratio_cache[key] = out
        return out

    #: Observations (of any cell) after which a cell nobody measured goes back to its
    #: start-up value. Why: a burst of contention (a build, another process on the second
    #: core) slows multi-row forwards most, the cells it inflated make the controller stop
    #: choosing those row counts, and a cell that is never chosen is never re-measured —
    #: seen: Gemma copy traffic stuck at 1.9x instead of 3.3x for a whole benchmark run.
    STALE_AFTER = 256

    # ----- online updates -----
    def observe(self, rows: int, ctx: int, seconds: float) -> None:
        """Record one measured whole forward of ``rows`` rows at context ``ctx``."""
        if seconds <= 0 or rows < 1:
            return
        ri = _nearest(self.rows, rows)
        ci = _nearest(self.ctxs, ctx)
        # Move the observation to the grid point along the current model's shape.
        here = self.time(rows, ctx)
        there = self._t[ri][ci]
        value = seconds * (there / here) if here > 0 else seconds
        cell = self._obs[ri][ci]
        cell.append(value)
        m = median(cell)
        self._t[ri][ci] = m
        self.observations += 1
        self._last_seen[ri][ci] = self.observations
        if self.observations % 64 == 0:
            self._revert_stale()
        # Every round observes; rebuild the cached curves only on a real move (> 1%).
        used = self._t_used[ri][ci]
        if abs(m - used) > 0.01 * used:
            self._cache.clear()
            self._ratio_cache.clear()
            self._t_used = [row[:] for row in self._t]

    def _revert_stale(self) -> None:
        """Cells unobserved for STALE_AFTER observations forget their online values."""
        moved = False
        for ri, row in enumerate(self._t):
            for ci, t in enumerate(row):
                seed = self._seed[ri][ci]
                if t != seed and self.observations - self._last_seen[ri][ci] >= self.STALE_AFTER:
                    self._obs[ri][ci] = deque([seed] * self._seed_count, maxlen=self.window)
                    row[ci] = seed
                    moved = True
        if moved:
            self._cache.clear()
            self._ratio_cache.clear()
            self._t_used = [r[:] for r in self._t]

    # ----- internals -----
    def _column(self, c: float) -> list[float]:
        """T(rows) for every grid row count at context c, kept physical.

        Cells are updated one at a time, so a few slow one-row steps (contention) can leave
        T(3) < T(1) — a draft that looks cheaper than no draft. So: never cheaper than fewer
        rows, never dearer than one plain step per row.
        """
        ts = [max(_interp(self.ctxs, row, c), 1e-12) for row in self._t]
        for i in range(1, len(ts)):
            ts[i] = min(max(ts[i], ts[i - 1]), self.rows[i] * ts[0])
        return ts

    def _times_at(self, ctx: int) -> list[float]:
        key = max(0, int(ctx)) >> 5  # 32-position granularity is plenty for interpolation
        ts = self._cache.get(key)
        if ts is None:
            ts = self._column(float(key << 5))
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = ts
        return ts


def _interp(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys); constant below, linear (non-decreasing) above."""
    n = len(xs)
    if n == 1 or x <= xs[0]:
        return ys[0]
    i = bisect.bisect_right(xs, x)
    if i >= n:
        x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
        slope = max(0.0, (y1 - y0) / (x1 - x0))
        return y1 + slope * (x - x1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _nearest(xs: Sequence[int], x: float) -> int:
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return 0
    if i >= len(xs):
        return len(xs) - 1
    return i if xs[i] - x < x - xs[i - 1] else i - 1


class _Counts:
    """Decayed accepted/tried counts per match bucket."""

    __slots__ = ("s", "n")

    def __init__(self) -> None:
        self.s = [0.0] * len(MATCH_BUCKETS)
        self.n = [0.0] * len(MATCH_BUCKETS)

    def add(self, b: int, ok: bool, decay: float) -> None:
        self.s[b] = decay * self.s[b] + (1.0 if ok else 0.0)
        self.n[b] = decay * self.n[b] + 1.0


class AcceptanceModel:
    """P(draft position accepted | earlier ones were), by source and effective match length.

    Two levels: a pool per source kind ("reply", "prompt", "file", …) shrunk towards the
    static prior, and each source shrunk towards its pool, so a new file inherits what
    files have been doing. Counts decay per observation, so the model follows the traffic.
    """

    def __init__(
        self,
        prior: Sequence[float] = PRIOR_ACCEPT,
        prior_weight: float = 2.0,
        source_weight: float = 2.0,
        decay: float = 0.9,
    ) -> None:
        self.prior = list(prior)
        self.prior_weight = prior_weight
        self.source_weight = source_weight
        self.decay = decay
        self._pool: dict[str, _Counts] = {}
        self._src: dict[str, _Counts] = {}
        self._cache: dict[tuple[str, int, int], list[float]] = {}
        self._prior_cache: dict[tuple[int, int], list[float]] = {}

    @staticmethod
    def kind(source: str) -> str:
        return source.split(":", 1)[0]

    def p(self, source: str, match_len: int) -> float:
        b = match_bucket(match_len)
        pool = self._pool.get(self.kind(source))
        w0 = self.prior_weight
        pp = self.prior[b] if pool is None else (pool.s[b] + w0 * self.prior[b]) / (pool.n[b] + w0)
        src = self._src.get(source)
        if src is None:
            return pp
        w1 = self.source_weight
        return (src.s[b] + w1 * pp) / (src.n[b] + w1)

    def position_probs(self, source: str, match_len: int, k: int) -> list[float]:
        """[p_1 … p_k]: position j is judged at effective match length match_len + j - 1.

        Cached until the next observation: rounds that do not draft (the common case in
        chat) then cost a dictionary lookup here.
        """
        cap = MATCH_BUCKETS[-1]
        key = (source, min(match_len, cap), k)
        out = self._cache.get(key)
        if out is not None:
            return out
        out = []
        self._cache[key] = out
        last_b, last_p = -1, 0.0
        for j in range(k):
            b = match_bucket(min(match_len + j, cap))
            if b != last_b:
                last_b, last_p = b, self.p(source, min(match_len + j, cap))
            out.append(last_p)
        return out

    def prior_probs(self, match_len: int, k: int) -> list[float]:
        cap = MATCH_BUCKETS[-1]
        key = (min(match_len, cap), k)
        out = self._prior_cache.get(key)
        if out is None:
            out = [self.prior[match_bucket(min(match_len + j, cap))] for j in range(k)]
            self._prior_cache[key] = out
        return out

    def observe(self, source: str, match_len: int, drafted: int, accepted: int) -> None:
        """One verify round: positions 1…accepted passed, position accepted+1 failed."""
        if drafted <= 0 or match_len <= 0:
            return
        accepted = max(0, min(accepted, drafted))
        self._cache.clear()
        pool = self._pool.setdefault(self.kind(source), _Counts())
        src = self._src.setdefault(source, _Counts())
        cap = MATCH_BUCKETS[-1]
        tried = accepted + (1 if accepted < drafted else 0)
        for j in range(tried):
            b = match_bucket(min(match_len + j, cap))
            ok = j < accepted
            pool.add(b, ok, self.decay)
            src.add(b, ok, self.decay)

    def forget(self, source: str) -> None:
        self._src.pop(source, None)
        self._cache.clear()


def expected_tokens(probs: Sequence[float]) -> list[float]:
    """E[tokens per round] for k = 0 … len(probs): 1 + Σ_i Π_{j≤i} p_j."""
    out = [1.0]
    acc, run = 1.0, 1.0
    for p in probs:
        run *= p
        acc += run
        out.append(acc)
    return out


class DraftController:
    """Picks k (drafts to verify) per round; k = 0 means a plain decode step.

    ``min_gain``: k > 0 only when the expected speedup exceeds 1 + min_gain (estimates are
    noisy; a tie is not worth the risk). ``explore_budget``: fraction of plain-decode time
    that probes may waste when the model says no; a probe verifies the k the static prior
    would pick, and is charged T(k+1)/T(1) - 1 plain steps of that budget. ``arm``: the
    plain arm (``plain_arm.PlainArm``), which skips the lookup itself while drafting does not
    pay; None → one by default, none when ``ECHOLINE_PLAIN_ARM=0``.
    """

    def __init__(
        self,
        cost: VerifyCost,
        max_draft: int = 16,
        acceptance: AcceptanceModel | None = None,
        min_gain: float = 0.02,
        explore_budget: float = 0.01,
        arm: PlainArm | None = None,
    ) -> None:
        self.cost = cost
        self.arm = arm if arm is not None else (PlainArm() if plain_arm_enabled() else None)
        self.max_draft = max_draft
        self.acceptance = acceptance or AcceptanceModel()
        self.min_gain = min_gain
        self.explore_budget = explore_budget
        self._credit = 0.0
        self.rounds = 0
        self.probes = 0
        self.last_speedup = 1.0
        # Seconds a round spends outside the forward pass (lookup, this choice, acceptance,
        # index and text updates). Every round pays it whatever k is, so it dilutes the
        # verify cost: (T(k+1) + o) / (T(1) + o). On a GPU step of ~1 ms it is a fifth of
        # the round; ignoring it kept drafts too short there. Measured online (EMA).
        self.overhead_s = 0.0
        # The copy streak (see the module docstring): (source, the position its next draft
        # would start at, the match length there, the context length then), or None; and
        # the last choice's (source, position, match length, context length).
        self._run: tuple[str, int, int, int] | None = None
        self._chosen: tuple[str, int, int, int] | None = None
        self.streak = copy_streak_enabled()

    def effective_match(self, draft: Draft, context_len: int) -> int:
        """The match length ``draft`` is judged at: its own, or the copy streak's when it
        continues the last round's source right where that round's tokens ended, with
        nothing written in between (the draft's match, which includes the last token
        written, then proves every earlier one)."""
        run = self._run
        if not self.streak or run is None or draft.match_len <= 0:
            return draft.match_len
        source, position, match, at = run
        if (source, position, at) == (draft.source, draft.position, context_len):
            return max(draft.match_len, match)
        return draft.match_len

    def _follow(self, chosen: tuple[str, int, int, int], verified: int, accepted: int) -> None:
        """After a round that verified ``verified`` drafts of ``chosen``: the streak goes on
        while all were accepted (the next draft's position proves the round's last token),
        else it ends."""
        source, position, match, context_len = chosen
        if position >= 0 and match > 0 and accepted >= verified:
            grown = verified + 1
            self._run = (source, position + grown, match + grown, context_len + grown)
        else:
            self._run = None

    def _limit(self, draft: Draft, remaining: int | None) -> int:
        k = min(len(draft.tokens), self.max_draft)
        if remaining is not None:
            k = min(k, remaining - 1)
        return max(0, k)

    def expected_tokens(self, k: int, source: str, match_len: int) -> float:
        return expected_tokens(self.acceptance.position_probs(source, match_len, k))[k]

    def expected_speedup(self, k: int, source: str, match_len: int, context_len: int) -> float:
        """E[tokens | k] × T(1) / T(k+1) at this context length."""
        if k <= 0:
            return 1.0
        return self.expected_tokens(k, source, match_len) / self.cost.ratio(k + 1, context_len)

    @staticmethod
    def _best(
        probs: Sequence[float], ratios: Sequence[float], share: float = 0.0, pow2: bool = False
    ) -> tuple[int, float]:
        """argmax_k E[tokens | k] / (T(k+1)/T(1)); (0, 1.0) when nothing beats plain decode.
        ``share``: the round's overhead share of a plain round, which every round pays (the
        ratios become r × (1 − share) + share, computed only as far as the scan goes).
        ``pow2``: only k whose k + 1 rows are a power of two (a graph backend verifies those
        widths alone, cutting any other k down: judging k = 40 and verifying 31 is no choice)."""
        best_k, best_s = 0, 1.0
        run = acc = 1.0
        k = 1
        keep = 1.0 - share
        for p in probs:
            run *= p
            acc += run
            if not pow2 or (k + 1) & k == 0:
                s = acc / (ratios[k + 1] * keep + share)
                if s > best_s:
                    best_k, best_s = k, s
                elif run < 1e-3:  # later positions add almost nothing and cost more
                    break
            k += 1
        return best_k, best_s

    def choose(self, draft: Draft, context_len: int, remaining: int | None = None, pow2: bool = False) -> int:
        """How many of ``draft.tokens`` to verify now (0 … min(len, max_draft, remaining-1));
        ``pow2``: a graph backend's widths only (k + 1 a power of two)."""
        match = self.effective_match(draft, context_len)
        k = self._choose(draft, match, context_len, remaining, pow2)
        chosen = (draft.source, draft.position, match, context_len)
        if k > 0:
            self._chosen = chosen
        else:  # a plain step: the streak goes on if its token continues the copy
            self._chosen = None
            self._follow(chosen, 0, 0)
        return k

    def _choose(self, draft: Draft, match: int, context_len: int, remaining: int | None, pow2: bool) -> int:
        """``choose`` for a draft judged at match length ``match`` (``effective_match``)."""
        self.rounds += 1
        kmax = self._limit(draft, remaining)
        if kmax == 0 or draft.match_len <= 0:
            self.last_speedup = 1.0
            return 0
        ratios = self.cost.ratios(kmax + 1, context_len)
        share = 0.0
        if self.overhead_s > 0.0:
            t1 = self.cost.t1(context_len)
            share = self.overhead_s / (t1 + self.overhead_s)
        probs = self.acceptance.position_probs(draft.source, match, kmax)
        k, s = self._best(probs, ratios, share, pow2)
        if k > 0 and s > 1.0 + self.min_gain:
            self.last_speedup = s
            return k

        def extra(rows: int) -> float:  # a verify's cost over a plain round, in plain rounds
            return (ratios[rows] - 1.0) * (1.0 - share)

        # The model says no. Bank a little exploration credit; probe when it pays for one.
        self._credit = min(self._credit + self.explore_budget, _MAX_CREDIT)
        if self._credit < extra(2):  # not even a 1-token probe is affordable yet
            self.last_speedup = 1.0
            return 0
        pk, ps = self._best(self.acceptance.prior_probs(match, kmax), ratios, share, pow2)
        while pk > 1 and extra(pk + 1) > _MAX_CREDIT:  # keep a probe affordable
            pk = (pk + 1) // 2 - 1 if pow2 else pk - 1
        if pk > 0 and ps > 1.0 + self.min_gain:
            price = max(extra(pk + 1), 1e-3)
            if self._credit >= price:
                self._credit -= price
                self.probes += 1
                self.last_speedup = 1.0
                return pk
        self.last_speedup = 1.0
        return 0

    def observe(self, source: str, match_len: int, drafted: int, accepted: int) -> None:
        """After a verify round: how many of the ``drafted`` tokens the model accepted (of
        the draft last chosen, whose copy streak it judged at, and now follows)."""
        chosen, self._chosen = self._chosen, None
        if chosen is not None and chosen[0] == source:
            match_len = max(match_len, chosen[2])
            self._follow(chosen, drafted, accepted)
        else:
            self._run = None
        self.acceptance.observe(source, match_len, drafted, accepted)

    def observe_overhead(self, seconds: float, weight: float = 0.05) -> None:
        """After a round: its wall time outside the forward pass (see ``overhead_s``)."""
        if seconds < 0.0:
            return
        o = self.overhead_s
        self.overhead_s = seconds if o == 0.0 else o + weight * (seconds - o)

    def observe_cost(self, rows: int, context_len: int, seconds: float) -> None:
        """After any forward pass (plain decode is rows=1): feed the measured time back."""
        self.cost.observe(rows, context_len, seconds)
