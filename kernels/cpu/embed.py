"""Embedding lookup that dequantizes only the requested rows."""

from __future__ import annotations

import numpy as np
from echoline.kernels.cpu.relayout import KINDS, dequantize_relayout


def embed_rows(qtype, data: np.ndarray, cols: int, ids: np.ndarray) -> np.ndarray:
    """Float32 rows ``ids`` of a (vocab, cols) table stored as raw GGUF rows."""
    if qtype not in KINDS:
        raise ValueError(f"unsupported embedding quant type {qtype!r}")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    vocab = data.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise IndexError(f"token id out of range [0, {vocab})")
    picked = np.asarray(data)[ids]
    return np.ascontiguousarray(dequantize_relayout(qtype, picked, cols), dtype=np.float32)
