"""``echoline doctor``: does this backend, on this machine, compute rows independently?

Exact speculation rests on it: a row's logits must be bit-identical whether
the row is decoded alone, verified among k others, or prefilled inside a
chunk. The doctor checks each on the real model and says so plainly.
"""

from __future__ import annotations

import sys

import numpy as np
from echoline.engine.api import Engine

VERIFY_ROWS = (1, 2, 8, 16)
CHUNKS = (1, 5, 16, 64)
PROMPT = (
    "import os\n\n\ndef walk(root):\n    for dirpath, _, files in os.walk(root):\n"
    "        for name in files:\n            yield os.path.join(dirpath, name)\n"
)


def _logits_rows(engine: Engine, ids: list[int], prefix: int, rows: int) -> np.ndarray:
    """Logits of ids[prefix:prefix+rows] computed in one forward after a decoded prefix."""
    cache = engine.model.new_cache(len(ids) + 8)
    for t in ids[:prefix]:
        engine.model.forward([t], cache, all_logits=False)
    return engine.backend.to_host(engine.model.forward(ids[prefix : prefix + rows], cache))


def _chunked_last(engine: Engine, ids: list[int], chunk: int) -> np.ndarray:
    cache = engine.model.new_cache(len(ids) + 8)
    out = None
    for s in range(0, len(ids), chunk):
        out = engine.model.forward(ids[s : s + chunk], cache, all_logits=False)
    return engine.backend.to_host(out)[-1]


def check(engine: Engine) -> dict:
    ids = engine.encode(PROMPT)
    ids = (ids * (1 + 64 // max(1, len(ids))))[:64]
    prefix = 32
    reference = _logits_rows(engine, ids, prefix, 1)[0]
    verify = {}
    for k in VERIFY_ROWS:
        got = _logits_rows(engine, ids, prefix, k)[0]
        verify[str(k)] = {
            "identical": bool(np.array_equal(got, reference)),
            "max_abs_diff": float(np.max(np.abs(got - reference))),
        }
    chunk_ref = _chunked_last(engine, ids, 1)
    chunks = {}
    for c in CHUNKS:
        got = _chunked_last(engine, ids, c)
        chunks[str(c)] = {
            "identical": bool(np.array_equal(got, chunk_ref)),
            "max_abs_diff": float(np.max(np.abs(got - chunk_ref))),
        }
    ok = all(v["identical"] for v in verify.values()) and all(v["identical"] for v in chunks.values())
    return {
        "backend": engine.backend_name,
        "variant": engine.backend_variant,
        "model": engine.model_name,
        "batch_invariant": ok,
        "backend_claims_invariant": bool(engine.backend.batch_invariant),
        "verify_rows": verify,
        "prefill_chunks": chunks,
    }


def run(model: str, backend: str) -> dict:
    engine = Engine.load(model, backend=backend)
    report = check(engine)
    out = sys.stderr
    out.write(f"echoline doctor: {report['model']} on {report['backend']}\n")
    for k, v in report["verify_rows"].items():
        out.write(f"  row 0 of a {k:>2}-row forward vs decode: {'identical' if v['identical'] else 'DIFFERS'}"
                  f" (max |diff| {v['max_abs_diff']:.3g})\n")
    for c, v in report["prefill_chunks"].items():
        out.write(f"  prefill in chunks of {c:>2} vs token by token: {'identical' if v['identical'] else 'DIFFERS'}"
                  f" (max |diff| {v['max_abs_diff']:.3g})\n")
    verdict = "batch-invariant: speculative decoding is exact here" if report["batch_invariant"] else (
        "NOT batch-invariant: decode must run through the multi-row path")
    out.write(f"  => {verdict}\n")
    return report
