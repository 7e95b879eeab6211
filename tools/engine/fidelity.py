"""How faithfully each cpu numeric mode computes the model: top-1 agreement with float64.

Run: ``python -m tools.engine.fidelity --model smollm2 --prompts 2 [--json]``. It runs the
copy traffic's prompts (real source code under the chat template) through one teacher-forced
forward each on the float64 numpy backend and on the cpu backend in every mode the host
supports, and counts the positions where a mode's argmax equals float64's.

Why it exists: llama.cpp's greedy outputs are no referee between the modes (its own CPU
products quantize activations too, so it disagrees with both by a few tokens in a few
hundred); the float64 model is the function the file defines. ``docs/architecture.md``
(numeric modes) quotes this to explain why ``f32`` stays the default.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from echoline.engine.api import Engine
from echoline.engine.backends import CPU_ACTIVATIONS
from echoline.engine.backends.cpu_backend import CpuBackend
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.bench import traffic
from echoline.engine.bench.spec import _prompts
from echoline.engine.model_catalog import resolve_model


def top1(engine: Engine, ids: list[int]) -> np.ndarray:
    """Argmax at every position of one teacher-forced forward over ``ids``."""
    logits = engine.model.forward(ids, engine.model.new_cache(len(ids) + 8))
    return np.argmax(engine.backend.to_host(logits), axis=-1)


def modes_available() -> list[str]:
    from echoline.kernels.cpu.q8act import vnni_available

    return [m for m in CPU_ACTIVATIONS if m != "q8" or vnni_available()]


def reference(path: Path, tokenizer=None) -> Engine:
    """The float64 model (numpy backend): the function the file defines."""
    return Engine(path, backend=NumpyBackend(dtype=np.float64), tokenizer=tokenizer)


def agreement(path: Path, prompts: list[list[int]], tokenizer=None, ref: Engine | None = None) -> dict[str, object]:
    """Share of positions whose argmax equals float64's, per cpu mode this host runs."""
    ref = ref or reference(path, tokenizer)
    want = [top1(ref, p) for p in prompts]
    out: dict[str, object] = {"model": path.name, "positions": int(sum(len(w) for w in want))}
    for mode in modes_available():
        eng = Engine(path, backend=CpuBackend(activations=mode), tokenizer=tokenizer)
        same = sum(int((top1(eng, p) == w).sum()) for p, w in zip(prompts, want, strict=True))
        out[mode] = round(same / max(1, out["positions"]), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=2, help="copy prompts to run (~1,000 tokens each)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = resolve_model(args.model)
    ref = reference(path)
    prompts = _prompts(ref, "copy", traffic.source_paths([]))[: max(1, args.prompts)]
    out = agreement(path, prompts, ref=ref)
    if args.json:
        print(json.dumps(out))
        return
    for mode in modes_available():
        print(f"{out['model']} {mode}: {out[mode]:.2%} of {out['positions']} positions agree with float64")


if __name__ == "__main__":
    main()
