"""The plain arm: decode rounds that skip the draft lookup while drafting does not pay.

Why: the controller's k = 0 still costs a lookup, a choice and their bookkeeping every
round. On a GPU a plain step is about a millisecond and that work is a visible share of it:
SmolLM2 chat ran at 0.73x plain on the H200 with the verify itself nearly free. So the loop
asks the arm before each round whether to look up at all, and the arm charges each round
that did its true cost, in seconds, against what plain decoding would have spent:

    value = accepted × (T(1) + h_plain) − (forward − T(1)) − (host − h_plain)

``accepted`` drafts are plain steps saved (each a one-row forward T(1) plus a plain round's
host time ``h_plain``); the forward's extra over one row and the host time over a plain
round's are what the round paid for them. Where plain steps are chained (CUDA:
engine/step_chain.py) their host time is hidden, so a plain token costs one chained step's
measured time instead:

    value = (accepted + 1) × step − forward − host

A round with no draft is worth −(its lookup and choice). While a decayed average of the value stays positive, every round looks up. Once it
falls to zero or below, the loop decodes plainly and probes with one lookup after ``skip``
plain rounds: a probe that gets drafts accepted and pays switches drafting back on; one that
does not doubles ``skip`` (up to ``max_skip``). Each request starts with a probe and the
shortest skip, since its prompt may be a fresh copy source.

The arm only turns plain where a lookup is a visible share of a step: the decayed average
of the lookup's own seconds must exceed ``min_share`` of T(1). On a GPU a lookup is 5-7 % of
a ~1 ms step; on a CPU it is well under 2 % of a 10-80 ms step, where skipping it saves
nothing and a skipped round can only miss drafts (the controller's k = 0 already declines
drafts that do not pay).

Exactness does not depend on any of this: a round without a lookup is a plain step.
"""

from __future__ import annotations

import os


def plain_arm_enabled() -> bool:
    """``ECHOLINE_PLAIN_ARM=0`` turns the arm off (every round looks up): for A/B runs."""
    return os.environ.get("ECHOLINE_PLAIN_ARM", "1") != "0"


class PlainArm:
    """Decides per round whether to look up drafts; learns from each round's measured cost.

    ``weight``: how fast the average value follows new rounds. ``min_skip``/``max_skip``:
    the plain rounds between probes, doubled after each probe that did not pay.
    """

    def __init__(self, weight: float = 0.1, min_skip: int = 2, max_skip: int = 4,
                 min_share: float = 0.03) -> None:
        if not 0.0 < weight <= 1.0:
            raise ValueError("weight must be in (0, 1]")
        if not 1 <= min_skip <= max_skip:
            raise ValueError("need 1 <= min_skip <= max_skip")
        self.weight = weight
        self.min_skip = min_skip
        self.max_skip = max_skip
        self.min_share = min_share
        self.lookup_s: float | None = None  # seconds of a lookup and choice (EMA)
        self.drafting = True  # False: the plain arm (rounds skip the lookup)
        self.value_s = 0.0  # decayed average value of a lookup round, seconds
        self.h_plain_s: float | None = None  # host seconds of a plain round (EMA)
        # Where plain steps are chained (CUDA: engine/step_chain.py) their host work overlaps
        # the next step, so plain decoding costs a step's own time: ``chained_step_s``, the
        # measured seconds per step of chained runs (EMA), else one row's forward alone.
        self.plain_chained = False
        self.chained_step_s: float | None = None
        self.skip = min_skip
        self._countdown = 0  # plain rounds left before the next probe
        self.lookups = 0
        self.plain_rounds = 0
        self.switches = 0  # drafting → plain

    def start(self) -> None:
        """A new request: probe at its first round, then back off from the shortest skip."""
        self._countdown = 0
        self.skip = self.min_skip

    def look(self) -> bool:
        """Whether this round looks up drafts (always while drafting; a probe otherwise)."""
        if self.drafting or self._countdown <= 0:
            return True
        self._countdown -= 1
        return False

    def plain_run(self) -> int:
        """Called when ``look`` said no: the plain rounds to run in a row from this one up
        to the next probe, all taken now (the loop chains them: engine/step_chain.py)."""
        n = 1 + max(0, self._countdown)
        self._countdown = 0
        return n

    def observe_plain(self, host_s: float) -> None:
        """A round without a lookup: its host seconds are what a plain round costs."""
        self.plain_rounds += 1
        if host_s < 0.0:
            return
        h = self.h_plain_s
        self.h_plain_s = host_s if h is None else h + self.weight * (host_s - h)

    def observe_chained(self, step_s: float) -> None:
        """A chained run of plain steps: its seconds per step (what a plain token costs)."""
        c = self.chained_step_s
        self.chained_step_s = step_s if c is None else c + self.weight * (step_s - c)

    def round_value(self, accepted: int, extra_forward_s: float, host_s: float, t1_s: float) -> float:
        """Seconds this lookup round saved against plain decoding (negative: it lost).

        The round made accepted + 1 tokens for its forward (t1 + extra) and host time;
        plain decoding would have paid a plain step for each: t1 plus a plain round's host
        time, or, where plain steps are chained, the chained step's measured time (t1 with
        no host time until one was measured)."""
        if self.plain_chained:
            step = self.chained_step_s if self.chained_step_s is not None else t1_s
            return (accepted + 1) * step - (t1_s + max(0.0, extra_forward_s)) - host_s
        h = self.h_plain_s or 0.0
        return accepted * (t1_s + h) - max(0.0, extra_forward_s) - (host_s - h)

    def observe_lookup(self, accepted: int, extra_forward_s: float, host_s: float, t1_s: float,
                       lookup_s: float | None = None) -> None:
        """A round that looked up: ``accepted`` drafts, the forward's time over one row's
        (0 when nothing was verified), the round's host seconds, one row's forward time, and
        the lookup's own seconds (None: count the whole host time)."""
        self.lookups += 1
        seen = host_s if lookup_s is None else lookup_s
        lk = self.lookup_s
        self.lookup_s = seen if lk is None else lk + self.weight * (seen - lk)
        v = self.round_value(accepted, extra_forward_s, host_s, t1_s)
        # Entering the plain arm needs both the average and this lookup over the share (a
        # first lookup, cold caches, is often slow); leaving it, the average under it.
        visible = self.lookup_s > self.min_share * t1_s
        if self.drafting:
            self.value_s += self.weight * (v - self.value_s)
            if self.value_s <= 0.0 and visible and seen > self.min_share * t1_s:
                self.drafting = False
                self.switches += 1
                self._countdown = self.skip
            return
        # A probe. Only accepted drafts can prove drafting pays: a round with none is worth
        # −(its lookup) plus timing noise, and noise must not switch drafting back on. A
        # lookup that has become a small share of a step (the step grew) ends the plain arm.
        if (accepted > 0 and v > 0.0) or not visible:
            self.drafting = True
            self.value_s = max(v, 0.0) if accepted > 0 else 0.0
            self.skip = self.min_skip
        else:
            self.skip = min(self.skip * 2, self.max_skip)
            self._countdown = self.skip
