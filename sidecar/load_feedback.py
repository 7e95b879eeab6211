"""First-run feedback on stderr, shared by ``echoline`` and ``echoline rewrite``.

Its own module so that the two command-line modules need not import each other.
"""

from __future__ import annotations

import sys


class LoadFeedback:
    """What a first run is doing, on stderr (``echoline.engine.api.LoadProgress``): a tqdm
    bar in bytes for the download and its check, a line for each one-off phase (compiling
    kernels, calibrating). Phases every start has (loading weights, warming up) stay quiet."""

    QUIET = ("loading weights", "warming up")

    def __init__(self) -> None:
        self._bar = None
        self._label = ""

    def __call__(self, label: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if total <= 0:
            self.close()
            if label not in self.QUIET:
                sys.stderr.write(f"echoline: {label}…\n")
                sys.stderr.flush()
            return
        if self._bar is None or label != self._label:
            self.close()
            self._label = label
            self._bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                             file=sys.stderr, leave=True)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
