"""Plain data passed across the engine's public API (what the sidecar and CLI see)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    """What one request cost and how speculation fared.

    ``per_source`` maps a draft source id ("prompt", "reply", "file:…", or "history:n",
    an earlier reply kept as a source) to ``{"drafted": n, "accepted": m}``.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    decode_s: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    kv_bytes: int = 0
    #: Decode rounds' wall time in the forward pass (device work and its sync, argmax
    #: included) and outside it (drafting, controller, acceptance, callbacks): where a
    #: round's time goes, the split a controller must charge (host time is per round).
    forward_s: float = 0.0
    host_s: float = 0.0
    #: Rounds that looked up drafts (the rest were plain-arm rounds) and the host seconds
    #: those lookups took (drafting and the controller's choice; part of ``host_s``).
    lookups: int = 0
    lookups_ahead: int = 0  # lookups made while the previous verify ran (CUDA), then used
    lookup_s: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: generated tokens over the time after the first token."""
        if self.generated_tokens <= 1 or self.decode_s <= 0:
            return self.generated_tokens / self.total_s if self.total_s > 0 else 0.0
        return (self.generated_tokens - 1) / self.decode_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_s": round(self.ttft_s, 6),
            "total_s": round(self.total_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 4),
            "per_source": {k: dict(v) for k, v in self.per_source.items()},
            "kv_bytes": self.kv_bytes,
            "forward_s": round(self.forward_s, 6),
            "host_s": round(self.host_s, 6),
            "lookups": self.lookups,
            "lookup_s": round(self.lookup_s, 6),
        }


@dataclass
class TokenEvent:
    """Streamed after each round: the new tokens and text, and the running stats."""

    new_ids: list[int]
    text_delta: str
    text: str
    stats: GenerationStats


@dataclass
class GenerationResult:
    """The reply. ``finish_reason``: "eos", "stop", "length" or "cancelled"."""

    token_ids: list[int]
    text: str
    finish_reason: str
    stats: GenerationStats
