"""Bit-level readers of GGUF quant blocks, shared by every backend's weight preparation.

Why one module: the CPU relayout (``kernels/cpu/relayout.py``) and the MLX affine form
(``kernels/mlx/affine.py``) read the same block layouts; two copies of a nibble order or of
the Q4_K/Q5_K scale packing could drift apart and make one backend's weights wrong. Each
helper takes raw uint8 bytes (any leading shape) and returns the values in ggml's order.
Nothing here knows about models.
"""

from __future__ import annotations

import numpy as np


def half(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 bytes (…, 2) → float32 (…)."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes → 32 values: low nibbles are weights 0-15, high nibbles 16-31 (Q4_0/Q4_1/Q5_*)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def high_bits_32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4-byte qh → the fifth bit of weights 0-31 (bit j of the little-endian word)."""
    word = np.ascontiguousarray(qh).view("<u4")[..., 0].astype(np.uint32)
    return ((word[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 packed bytes → eight 6-bit scales and eight 6-bit mins (uint8)."""
    s = scales.astype(np.uint8)
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([d & 63, (md & 0x0F) | ((d >> 6) << 4)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=-1)
    return sc, mn


def k_codes_4(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes of low nibbles → 256 4-bit values: each 32-byte chunk holds
    sub-block 2i in its low nibbles and sub-block 2i + 1 in its high nibbles."""
    chunks = qs.reshape(qs.shape[:-1] + (4, 32))
    both = np.stack([chunks & 0x0F, chunks >> 4], axis=-2)  # (…, 4, 2, 32)
    return both.reshape(qs.shape[:-1] + (256,))
