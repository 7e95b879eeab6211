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


#: IQ4_NL / IQ4_XS: a 4-bit index picks one of these 16 int8 levels (non-linear, denser near
#: zero), then a block scale multiplies it. ggml's table; every level fits int8 and f16 exactly.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def iq4_levels_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes of IQ4 indices → 32 int8 levels (weights 0-15 from low nibbles, 16-31 high)."""
    return IQ4_VALUES[nibbles_32(qs)]


def iq4_xs_scales(scales_h: np.ndarray, scales_l: np.ndarray) -> np.ndarray:
    """IQ4_XS's 2 high-bit bytes and 4 low-nibble bytes → eight signed 6-bit sub-block
    scales (int8, −32…31): sub-block j's low 4 bits are nibble j of scales_l (low first),
    its top 2 bits are bits 2j, 2j + 1 of the little-endian 16-bit scales_h."""
    low = np.stack([scales_l & 0x0F, scales_l >> 4], axis=-1).reshape(scales_l.shape[:-1] + (8,))
    word = np.ascontiguousarray(scales_h).view("<u2")[..., 0].astype(np.uint16)
    high = ((word[..., None] >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    return (low | (high << 4)).astype(np.int8) - np.int8(32)
