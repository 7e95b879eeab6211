"""What the sidecar needs of an engine: the calls it really makes, and nothing else.

``echoline.engine.api.Engine`` (in-process) satisfies it; so must any other engine the
server holds (a remote one, a test's stand-in). Why a Protocol and not the class: the
sidecar should depend on the calls, so that an engine living elsewhere can be swapped in
and checked (``isinstance(x, EngineLike)`` tests that every name is there), and so that the
handlers stop guessing with ``getattr``.

Prompts are built here in the sidecar from token ids, so an engine exposes its tokenizer
(``encode``/``decode``, FIM and stop ids: ``echoline.engine.tokenizer.Tokenizer``) and its
model's ``config.context_length``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from echoline.engine.api import LoadProgress
    from echoline.engine.tokenizer import Tokenizer
    from echoline.engine.types import GenerationResult, TokenEvent


class BackendLike(Protocol):
    #: Whether a row's result is independent of how many rows share a forward (an idle
    #: prefill may then run in chunks: ``idle_prefill``).
    batch_invariant: bool


@runtime_checkable
class EngineLike(Protocol):
    """A loaded model the server drives from its one worker thread (not re-entrant)."""

    tokenizer: Tokenizer
    config: Any  # the model's hyper-parameters; the sidecar reads ``context_length``
    backend: BackendLike

    @property
    def model_name(self) -> str: ...
    @property
    def backend_name(self) -> str: ...
    @property
    def backend_variant(self) -> str: ...
    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]: ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int = ...,
        stop: Sequence[str] = ...,
        spec: bool = ...,
        session: str | None = ...,
        on_token: Callable[[TokenEvent], None] | None = ...,
        cancel: threading.Event | None = ...,
        stop_when: Callable[[str], int | None] | None = ...,
        stop_id_when: Callable[[int], bool] | None = ...,
    ) -> GenerationResult: ...

    def prefill(self, prompt_ids: Sequence[int], *, session: str, cancel: threading.Event | None = ...,
                chunk: int | None = ..., reserve_tokens: int | None = ...) -> int: ...

    def warm_up(self, progress: LoadProgress | None = None) -> None: ...
    # Seconds to prefill n tokens after a ~2,000-token prompt, fixed per loaded engine (None:
    # not known, e.g. a server's): the inline suffix's budget (prompts.py auto_suffix_tokens).
    def prefill_seconds(self, tokens: int) -> float | None: ...

    # Draft sources: workspace files and open buffers, by id. ``takes_source_ids``: whether
    # ``set_source_ids`` is how the engine wants them (the worker then tokenizes each file
    # incrementally); False hands over the text, and tokenizing it would be wasted work.
    @property
    def takes_source_ids(self) -> bool: ...
    def set_source(self, source_id: str, text: str) -> None: ...
    def set_source_ids(self, source_id: str, ids: Sequence[int]) -> None: ...
    def remove_source(self, source_id: str) -> None: ...
    def source_memory_bytes(self) -> int: ...
    def set_reply_history(self, n: int) -> None: ...
