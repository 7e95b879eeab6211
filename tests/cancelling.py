"""A cancel that fires mid-reply: the tests of cancellation share it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from echoline.engine.types import TokenEvent


def cancel_after(n: int | None) -> tuple[threading.Event, Callable[[TokenEvent], None]]:
    """An event set once ``n`` reply tokens have streamed (None: never), and the
    ``on_token`` callback that counts them."""
    cancel = threading.Event()
    seen = 0

    def on_token(event: TokenEvent) -> None:
        nonlocal seen
        seen += len(event.new_ids)
        if n is not None and seen >= n:
            cancel.set()

    return cancel, on_token
