"""Plain decode steps as a chain: the next step is queued before the host reads this one's id.

Why: on a GPU a one-row step takes about a millisecond, and the host's work between two
steps (the id's copy back, the stop rules, streaming the text, the next launch) left the
device idle for ~90 µs of each (``tools.cuda.bench_device --gap``). A chain queues step
N+1, fed on the device by step N's argmax, before the host waits for step N's id, so that
work overlaps the next step instead of following it.

Why it stays exact: the queued step computes what plain decoding computes next anyway
(same graph, same kernels, the same id as input, read on the device instead of the host).
When the reply ends at the id just read, the queued step is the one the trailing-token
rule runs (the reply's last token through the model), so the cache still ends at prompt
+ reply; a cancelled reply ends at the last token already in the cache, and the queued
step's row is cut.

Protocol (``push`` / ``take`` / ``drain``): ``push(tok)`` queues a step whose input is
``tok``, or the previous step's output when ``tok`` is None; ``take()`` returns the oldest
untaken step's output id; ``drain()`` completes every queued step. ``HostChain`` runs a
step only when its id is taken or drained, which is exactly the old loop, so every backend
shares one plain loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from echoline.engine.kvcache import KVCache

_KEY = ("chain", 1)


class StepChain(Protocol):
    def push(self, token: int | None) -> None: ...

    def take(self) -> int: ...

    def drain(self) -> None: ...


class HostChain:
    """Each step runs when its id is needed: one forward, then the argmax on the host."""

    def __init__(self, run_step: Callable[[int], Any], argmax: Callable[[Any], np.ndarray]) -> None:
        self._run_step = run_step
        self._argmax = argmax
        self._todo: deque[int | None] = deque()
        self._done: deque[int] = deque()
        self._last: int | None = None

    def push(self, token: int | None) -> None:
        self._todo.append(token)

    def _run_one(self) -> None:
        tok = self._todo.popleft()
        tok = self._last if tok is None else tok
        if tok is None:
            raise ValueError("a chained step needs a token or an earlier step")
        self._last = int(self._argmax(self._run_step(tok))[-1])
        self._done.append(self._last)

    def take(self) -> int:
        while not self._done:
            self._run_one()
        return self._done.popleft()

    def drain(self) -> None:
        while self._todo:
            self._run_one()


class GraphChain:
    """Steps replayed as one captured graph that feeds itself: forward, argmax, and the
    argmax written into the graph's own input with the position moved on (``argmax_feed``).
    Each launch starts an asynchronous copy of its id to pinned host memory."""

    def __init__(self, model: Any, cache: KVCache) -> None:
        self._model = model
        self._cache = cache
        self._b = model.backend
        self._copies: deque[Any] = deque()
        self._fed = False  # the graph's inputs hold the next step's (its last replay fed them)
        step = model.graph_step(cache, 1, True)
        b = self._b

        def fn(ids_dev: Any, pos_dev: Any) -> Any:  # what the graph captures (once per cache)
            return b.argmax_feed(step(ids_dev, pos_dev), ids_dev, pos_dev)

        self._fn = fn

    def push(self, token: int | None) -> None:
        cache, b = self._cache, self._b
        start = cache.length
        cache.ensure(start + 1)
        generation = self._model.graph_generation(cache)
        fed = token is None and self._fed and b.has_graph(_KEY, cache.buffers, generation)
        if token is None and not fed:
            # a new or regrown cache has no fed graph: the host supplies the previous id
            token = int(self._copies[-1].value()[-1])

        def inputs() -> list[np.ndarray]:
            return [np.array([token], np.int32), np.array([start], np.int32)]

        out = b.run_graph(_KEY, self._fn, inputs, owner=cache.buffers, generation=generation, fed=fed)
        self._fed = True
        self._copies.append(b.copy_to_host_async(out))
        cache.advance(start, 1)

    def take(self) -> int:
        return int(self._copies.popleft().value()[-1])

    def drain(self) -> None:
        self._copies.clear()  # stream order: later work on this cache runs after the steps


def make_chain(model: Any, cache: KVCache, run_step: Callable[[int], Any]) -> StepChain:
    """A ``GraphChain`` where the backend chains graphs on this cache, else a ``HostChain``."""
    b = model.backend
    if getattr(b, "graph_chain", False) and b.graph_max_rows >= 1 and not cache.ring and not b.padded_rows:
        return GraphChain(model, cache)
    return HostChain(run_step, b.argmax)
