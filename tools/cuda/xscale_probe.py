"""How far int8 x moves a real model's greedy replies, by the size of x's scale groups (CPU).

Why: the CUDA products' integer form quantizes x per 32 weights (``kernels.cu`` MT_INT8), as
the CPU backend's ``q8`` activations do; a scale per 256 weights (a K-quant superblock) would
let the kernels sum a superblock's groups in integers and pay one float step instead of
eight, so the next step of the 7B work depends on what the coarser scale costs in replies.
This emulates both on the numpy backend (x rounded as ``rint(x * 127 / amax) * amax / 127``
per group before every product; the products themselves in float64 BLAS), greedy-decodes
edit prompts (``engine.bench.traffic``) and reports, against float32 x, where each reply
first differs and the relative error of the prompt's last logits.

    python -m tools.cuda.xscale_probe [--model qwen2.5-coder-0.5b] [--prompts 4]
                                      [--tokens 48] [--chars 1500] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from echoline.engine.backends.numpy_backend import NumpyBackend
from echoline.engine.bench.traffic import edit_instruction, excerpt, file_message, source_paths
from echoline.engine.chat_template import encode_chat
from echoline.engine.model_catalog import resolve_model
from echoline.engine.models.loader import load_model
from echoline.engine.tokenizer import Tokenizer


def quantize_groups(x: np.ndarray, group: int) -> np.ndarray:
    """x (rows, k) rounded to int8 codes per ``group`` elements (a shorter last group where k
    is not a multiple: the 0.5B's 896) and scaled back (float64)."""
    x64 = np.asarray(x, dtype=np.float64)
    rows, k = x64.shape
    pad = -k % group
    g = np.pad(x64, ((0, 0), (0, pad))).reshape(rows, -1, group)
    amax = np.abs(g).max(axis=2, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    return (np.rint(g * (127.0 / safe)) * (safe / 127.0)).reshape(rows, -1)[:, :k]


class GroupQuantBackend(NumpyBackend):
    """The numpy backend with x quantized per ``group`` before each product (0: float32 x);
    products as one float64 matrix product (the same arithmetic for every variant)."""

    def __init__(self, group: int) -> None:
        super().__init__()
        self.group = group

    def matmul(self, x, w):
        x = np.asarray(x, dtype=np.float32).reshape(-1, w.shape[1])
        xq = quantize_groups(x, self.group) if self.group else x.astype(np.float64)
        return (xq @ w.T.astype(np.float64)).astype(self.dtype)


def greedy(model, ids: list[int], tokens: int, eos: set[int]) -> tuple[list[int], np.ndarray]:
    """The greedy reply's ids and the prompt's last logits."""
    cache = model.new_cache(len(ids) + tokens + 1)
    logits = np.asarray(model.forward(np.asarray(ids), cache, all_logits=False), dtype=np.float64)
    first = logits.reshape(-1)
    out: list[int] = []
    for _ in range(tokens):
        nxt = int(np.argmax(logits.reshape(-1)))
        out.append(nxt)
        if nxt in eos:
            break
        logits = np.asarray(model.forward(np.asarray([nxt]), cache, all_logits=False))
    return out, first


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two replies differ (a length counts), None if they are equal."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--chars", type=int, default=1500, help="excerpt length of each source file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    path = resolve_model(args.model)
    gf, _ = load_model(path, NumpyBackend())
    tok = Tokenizer.from_gguf(gf)
    eos = set(tok.stop_ids)
    prompts = []
    for i, p in enumerate(source_paths([])[: args.prompts]):
        code = excerpt(Path(p), args.chars)  # bench traffic's edit request, on a shorter excerpt
        message = {"role": "user", "content": file_message(code, edit_instruction(i, code))}
        prompts.append(encode_chat(tok, [message]))
    rows = []
    models = {g: load_model(path, GroupQuantBackend(g))[1] for g in (0, 32, 256)}
    for i, ids in enumerate(prompts):
        ref_ids, ref_logits = greedy(models[0], ids, args.tokens, eos)
        row = {"prompt": i, "prompt_tokens": len(ids), "reply_tokens": len(ref_ids)}
        for g in (32, 256):
            got, logits = greedy(models[g], ids, args.tokens, eos)
            row[f"g{g}_first_difference"] = first_difference(ref_ids, got)
            row[f"g{g}_logit_rel_err"] = float(
                np.linalg.norm(logits - ref_logits) / np.linalg.norm(ref_logits)
            )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    if args.json:
        print(json.dumps({"model": args.model, "tokens": args.tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
