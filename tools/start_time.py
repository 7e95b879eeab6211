"""Time to a first token in a fresh process, and its resident memory.

``python -m tools.start_time MODEL`` loads the model (``Engine.load``), generates one token
and prints the seconds since start and VmRSS/VmHWM from /proc (Linux). Run it several times:
the first run after a change of kernels or weight layout fills the numba and weight caches
(``ECHOLINE_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` pointed at an empty folder reproduce that).
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    t0 = time.perf_counter()
    from echoline.engine.api import Engine

    name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b"
    engine = Engine.load(name)
    engine.generate(engine.encode("def add(a, b):"), max_tokens=1, spec=False)
    seconds = time.perf_counter() - t0
    mem = {}
    try:
        with open("/proc/self/status") as fh:
            mem = {k: v.split()[0] for k, v in (ln.split(":", 1) for ln in fh) if k in ("VmRSS", "VmHWM")}
    except OSError:
        pass
    print(f"{name}: first token {seconds:.2f} s; VmRSS {int(mem.get('VmRSS', 0)) / 1024:.0f} MB, "
          f"peak {int(mem.get('VmHWM', 0)) / 1024:.0f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
