"""GGUF blocks rewritten as MLX affine groups (w = scale·q + bias, 32 weights a group).

Why: ``mx.quantized_matmul`` reads 4-8 bits a weight, so on Apple GPUs a
decode step reads a fraction of the bytes a float copy would. The rewrite is
only done where it is EXACT, i.e. where MLX's ``scale·q + bias`` reproduces
gguf's dequantized float32 value bit for bit:

* Q4_0 ``d·(q-8)``   → bits 4, scale d, bias -8d
* Q4_1 ``d·q + m``   → bits 4, scale d, bias m
* Q5_0 ``d·(q-16)``  → bits 5, scale d, bias -16d
* Q5_1 ``d·q + m``   → bits 5, scale d, bias m
* Q8_0 ``d·q`` (int8) → bits 8, q+128, scale d, bias -128d
* Q4_K/Q5_K ``(d·sc)·q - dmin·m`` per 32 → bits 4/5, scale d·sc, bias -dmin·m

Scales and biases are float32: d·sc carries 17 significant bits (half-float d
times a 6-bit sc), which neither float16 nor bfloat16 holds, and every product
scale·q then stays below 24 bits, so the only rounding is the final add, as in
gguf. Q6_K (16-weight groups; MLX's smallest is 32) has no exact rewrite.

This module is numpy only (no MLX import) so it is testable anywhere; the
packing is MLX's: a little-endian bit stream of ``bits``-wide codes per row,
viewed as uint32.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
from echoline.kernels.gguf_blocks import half, high_bits_32, k_codes_4, k_scale_min, nibbles_32
from echoline.kernels.quant_types import QUANT_TYPES

Q = gguf.GGMLQuantizationType
GROUP = 32

#: Bits of the affine code each exactly-rewritable quant type becomes.
AFFINE_BITS: dict[Q, int] = {
    t.qtype: t.mlx_affine_bits for t in QUANT_TYPES if t.mlx_affine_bits is not None
}


@dataclass
class AffineRows:
    """Unpacked affine form of a matrix: codes (rows, cols) and per-32 scale/bias (rows, cols/32)."""

    codes: np.ndarray  # uint8
    scales: np.ndarray  # float32
    biases: np.ndarray  # float32
    bits: int


def _blocks(data: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    """(rows, n_blocks, block_bytes) uint8 view of a tensor's raw rows."""
    raw = np.ascontiguousarray(np.asarray(data)).view(np.uint8).reshape(rows, -1)
    return raw.reshape(rows, -1, block_bytes)


def unpack(qtype: Q, data: np.ndarray, rows: int, cols: int) -> AffineRows:
    """The affine form of a GGUF tensor of an exactly-rewritable type."""
    if qtype not in AFFINE_BITS:
        raise ValueError(f"{qtype.name} has no exact affine rewrite")
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    b = _blocks(data, rows, block_bytes)
    nb = b.shape[1]
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = half(b[..., 0:2])
        if qtype == Q.Q8_0:
            codes = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            bias = -128.0 * d
        elif qtype == Q.Q4_0:
            codes, bias = nibbles_32(b[..., 2:18]), -8.0 * d
        elif qtype == Q.Q4_1:
            codes, bias = nibbles_32(b[..., 4:20]), half(b[..., 2:4])
        elif qtype == Q.Q5_0:
            codes = nibbles_32(b[..., 6:22]) | (high_bits_32(b[..., 2:6]) << 4)
            bias = -16.0 * d
        else:  # Q5_1
            codes = nibbles_32(b[..., 8:24]) | (high_bits_32(b[..., 4:8]) << 4)
            bias = half(b[..., 2:4])
        return AffineRows(
            codes.reshape(rows, cols).astype(np.uint8),
            d.astype(np.float32),
            np.asarray(bias, dtype=np.float32),
            AFFINE_BITS[qtype],
        )
    # Q4_K / Q5_K: super-blocks of 256 = 8 groups of 32
    d = half(b[..., 0:2])[..., None]
    dmin = half(b[..., 2:4])[..., None]
    sc, mn = k_scale_min(b[..., 4:16])
    if qtype == Q.Q4_K:
        codes = k_codes_4(b[..., 16:144])
    else:
        qh = b[..., 16:48]  # bit s of qh[l] is the fifth bit of weight l of sub-block s
        high = ((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(rows, nb, 256)
        codes = k_codes_4(b[..., 48:176]) | (high << 4)
    scales = (d * sc.astype(np.float32)).astype(np.float32)
    biases = -(dmin * mn.astype(np.float32)).astype(np.float32)
    return AffineRows(
        codes.reshape(rows, cols).astype(np.uint8),
        scales.reshape(rows, nb * 8),
        biases.reshape(rows, nb * 8),
        AFFINE_BITS[qtype],
    )


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) codes → MLX's packed uint32 (rows, cols·bits/32): a little-endian bit stream."""
    rows, cols = codes.shape
    if (cols * bits) % 32:
        raise ValueError(f"{cols} columns of {bits} bits do not fill whole 32-bit words")
    if bits == 8:
        return np.ascontiguousarray(codes.astype(np.uint8)).view(np.uint32)
    if bits == 4:
        pairs = codes.astype(np.uint8).reshape(rows, cols // 2, 2)
        return np.ascontiguousarray(pairs[..., 0] | (pairs[..., 1] << 4)).view(np.uint32)
    shifts = np.arange(bits, dtype=np.uint8)
    stream = ((codes[..., None] >> shifts) & 1).astype(np.uint8).reshape(rows, cols * bits)
    return np.ascontiguousarray(np.packbits(stream, axis=1, bitorder="little")).view(np.uint32)


def dequantize(a: AffineRows) -> np.ndarray:
    """float32 scale·q + bias in numpy (what MLX computes), for checking a rewrite."""
    rows, cols = a.codes.shape
    q = a.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
    w = q * a.scales[..., None] + a.biases[..., None]
    return w.reshape(rows, cols).astype(np.float32)
