"""One rewrite, editor-free: prompt -> generate -> code out of the fence.

Shared by the language server (``echoline.rewrite``) and ``echoline rewrite``
so both take exactly the same path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from echoline.engine.errors import EcholineError
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.prompts import FenceStripper, fit_selection, fitted_rewrite_ids
from echoline.sidecar.rewrite_checks import no_confident_edit, withholds
from echoline.sidecar.rewrite_stops import stop_rules


@dataclass
class RewriteOutcome:
    text: str  # the replacement for the selection
    reply: str  # what the model wrote (inside the primed fence)
    finish_reason: str
    stats: dict[str, Any]
    prompt_tokens: int
    # the runaway rule that ended the reply (rewrite_stops: "after", "repeat", "too-long")
    stopped_by: str | None = None
    # why the reply is no edit to apply (rewrite_checks), None when it is one
    refusal: str | None = None

    @property
    def withheld(self) -> str | None:
        """The refusal when it keeps the edit from being applied (a broken edit), else None."""
        return self.refusal if withholds(self.refusal) else None


@dataclass
class Progress:
    text: str  # replacement so far
    tokens: int
    tok_s: float
    acceptance: float
    stats: Any


def run_rewrite(
    engine: EngineLike,
    file_text: str,
    start: int,
    end: int,
    instruction: str,
    *,
    name: str = "",
    max_tokens: int = 512,
    spec: bool = True,
    session: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> RewriteOutcome:
    """Rewrite ``file_text[start:end]``. Raises nothing special on cancel: see finish_reason."""
    try:
        prompt, ids = fitted_rewrite_ids(engine, file_text, start, end, instruction, name=name,
                                         reply_room=min(max_tokens, 1024))
    except ValueError as exc:
        raise EcholineError(str(exc)) from None
    # the code out of the fence, as the reply grows: read once in all, not once a token
    stripped = FenceStripper(prompt.fence)

    def on_token(ev: Any) -> None:
        if on_progress is None:
            return
        st = ev.stats
        on_progress(
            Progress(
                text=stripped(ev.text),
                tokens=st.generated_tokens,
                tok_s=st.tokens_per_s,
                acceptance=st.acceptance,
                stats=st,
            )
        )

    # A selection is at most a few times longer in tokens than in characters/3; the
    # reply must fit its own copy plus some room for the requested change. Besides the
    # closing fence, the runaway rules (rewrite_stops) end it: a prefix of the plain reply.
    stops = stop_rules(file_text, start, end)
    result = engine.generate(
        ids,
        max_tokens=max_tokens,
        stop=(prompt.fence,),
        spec=spec,
        session=session,
        on_token=on_token,
        cancel=cancel,
        stop_when=stops,
    )
    selection = file_text[start:end]
    text = fit_selection(stripped(result.text), selection)
    refusal = None
    if result.finish_reason in ("eos", "stop"):
        refusal = no_confident_edit(file_text, start, end, text, instruction, name=name,
                                    stopped_by=stops.rule)
    return RewriteOutcome(
        text=text,
        reply=result.text,
        finish_reason=result.finish_reason,
        stats=result.stats.as_dict(),
        prompt_tokens=len(ids),
        stopped_by=stops.rule,
        refusal=refusal,
    )
