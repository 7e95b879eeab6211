"""Device check: the doctor's procedure (fresh cache per call, decode a prefix, then k rows)."""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path

import numpy as np


def rows(model, ids, prefix, k):
    cache = model.new_cache(len(ids) + 8)
    for t in ids[:prefix]:
        model.forward([t], cache, all_logits=False)
    return model.backend.to_host(model.forward(ids[prefix : prefix + k], cache))[0]


def main() -> int:
    import gguf
    from echoline.engine.backends.cupy_backend import CupyBackend
    from echoline.engine.models.loader import load_model

    from tests.synth import write_model

    path = sys.argv[1] if len(sys.argv) > 1 else None
    if path is None:
        path = write_model(Path(tempfile.mkdtemp()) / "m.gguf", "llama", qtype=gguf.GGMLQuantizationType.Q4_1,
                           vocab=300, d_model=128, n_ff=256, n_heads=4, n_kv_heads=2)
    b = CupyBackend()
    model = load_model(path, b)[1]
    ids = list(np.random.default_rng(0).integers(0, 300, size=64))
    for label, setup in (("eager", lambda: setattr(b, "graph_max_rows", 0)),
                         ("graph", lambda: setattr(b, "graph_max_rows", 17)),
                         ("graph+drop", lambda: b.drop_graphs()),
                         ("graph+gc", lambda: gc.collect())):
        setup()
        ref = rows(model, ids, 32, 1)
        diffs = []
        for k in (1, 2, 8, 16):
            setup()
            got = rows(model, ids, 32, k)
            diffs.append(float(np.max(np.abs(got - ref))))
        print(label, diffs, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
