"""Turn raw GGUF blocks into int8 values plus per-block float32 scale/offset.

For every supported quant type, weight = scale * q + offset in float32
reproduces ``gguf.quants.dequantize`` bit for bit: the scales are computed with
the same float32 operations in the same order as ggml (for K-quants,
scale = f32(d * sc) and offset = -f32(dmin * m)). Float weights (F32/F16/BF16)
become float32 values with no scale. Nothing here knows about models.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
from echoline.kernels.gguf_blocks import (
    half,
    high_bits_32,
    iq4_levels_32,
    iq4_xs_scales,
    k_codes_4,
    k_scale_min,
    nibbles_32,
)
from echoline.kernels.quant_types import QUANT_TYPES

Q = gguf.GGMLQuantizationType
QK_K = 256


@dataclass(frozen=True)
class Kind:
    """How a quant type is represented in the kernels."""

    block: int  # inputs per scale block
    scaled: bool
    offset: bool
    wdtype: str  # "int8" or "float32"


#: Each supported type's representation, from its ``kernels.quant_types`` entry.
KINDS: dict[Q, Kind] = {
    t.qtype: Kind(t.cpu_block, t.cpu_weights == "int8", t.cpu_offset, t.cpu_weights)
    for t in QUANT_TYPES
}


def unpack(qtype: Q, data: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Rows of raw blocks → (values (rows, cols), scale (rows, nb) or None, offset or None).

    values are int8 (quantized types) or float32 (float types); nb = cols / block.
    """
    rows = data.shape[0]
    if qtype == Q.F32:
        return np.asarray(data, dtype=np.float32).reshape(rows, cols), None, None
    if qtype == Q.F16:
        return np.asarray(data).view(np.float16).reshape(rows, cols).astype(np.float32), None, None
    if qtype == Q.BF16:
        raw = np.ascontiguousarray(data).view(np.uint16).reshape(rows, cols).astype(np.uint32)
        return (raw << 16).view(np.float32), None, None
    raw = np.ascontiguousarray(data, dtype=np.uint8)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        bsize = gguf.GGML_QUANT_SIZES[qtype][1]
        b = raw.reshape(rows, cols // 32, bsize)
        d = half(b[..., 0:2])
        if qtype == Q.Q8_0:
            q = b[..., 2:34].view(np.int8)
            return q.reshape(rows, cols), d, None
        if qtype == Q.Q4_0:
            q = nibbles_32(b[..., 2:18]).astype(np.int8) - np.int8(8)
            return q.reshape(rows, cols), d, None
        if qtype == Q.Q4_1:
            q = nibbles_32(b[..., 4:20]).astype(np.int8)
            return q.reshape(rows, cols), d, half(b[..., 2:4])
        if qtype == Q.Q5_0:
            q = (nibbles_32(b[..., 6:22]) | (high_bits_32(b[..., 2:6]) << 4)).astype(np.int8) - np.int8(16)
            return q.reshape(rows, cols), d, None
        q = (nibbles_32(b[..., 8:24]) | (high_bits_32(b[..., 4:8]) << 4)).astype(np.int8)
        return q.reshape(rows, cols), d, half(b[..., 2:4])
    nsb = cols // QK_K
    if qtype in (Q.Q4_K, Q.Q5_K):
        bsize = gguf.GGML_QUANT_SIZES[qtype][1]
        b = raw.reshape(rows, nsb, bsize)
        d = half(b[..., 0:2])[..., None]
        dmin = half(b[..., 2:4])[..., None]
        sc, mn = k_scale_min(b[..., 4:16])
        scale = d * sc.astype(np.float32)  # (rows, nsb, 8): same op order as ggml
        offset = -(dmin * mn.astype(np.float32))
        if qtype == Q.Q4_K:
            q = k_codes_4(b[..., 16:144])  # (rows, nsb, 256)
        else:
            qh = b[..., 16:48]  # (rows, nsb, 32): bit j of qh[l] belongs to sub-block j
            low = k_codes_4(b[..., 48:176]).reshape(rows, nsb, 8, 32)
            hb = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (rows,nsb,8,32)
            q = low | (hb << 4)
        q = q.astype(np.int8).reshape(rows, cols)
        return q, scale.reshape(rows, nsb * 8), offset.reshape(rows, nsb * 8)
    if qtype == Q.Q6_K:
        b = raw.reshape(rows, nsb, 210)
        ql = b[..., 0:128].reshape(rows, nsb, 2, 64)
        qh = b[..., 128:192].reshape(rows, nsb, 2, 32)
        sc = b[..., 192:208].view(np.int8).astype(np.float32)
        d = half(b[..., 208:210])[..., None]
        low = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(rows, nsb, 2, 4, 32)
        high = (qh[..., None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
        q = (low | (high << 4)).astype(np.int8) - np.int8(32)
        scale = d * sc  # (rows, nsb, 16)
        return q.reshape(rows, cols), scale.reshape(rows, nsb * 16), None
    if qtype == Q.IQ4_NL:
        b = raw.reshape(rows, cols // 32, 18)
        return iq4_levels_32(b[..., 2:18]).reshape(rows, cols), half(b[..., 0:2]), None
    if qtype == Q.IQ4_XS:  # 136-byte superblocks: d, scales_h[2], scales_l[4], qs[128]
        b = raw.reshape(rows, nsb, 136)
        d = half(b[..., 0:2])[..., None]
        scale = d * iq4_xs_scales(b[..., 2:4], b[..., 4:8]).astype(np.float32)  # ggml's f32(d * ls)
        q = iq4_levels_32(b[..., 8:136].reshape(rows, nsb, 8, 16))
        return q.reshape(rows, cols), scale.reshape(rows, nsb * 8), None
    raise ValueError(f"unsupported quant type {qtype!r}")


def dequantize_relayout(qtype: Q, data: np.ndarray, cols: int) -> np.ndarray:
    """scale * q + offset in float32: used by tests to check exactness against gguf."""
    q, scale, offset = unpack(qtype, data, cols)
    if scale is None:
        return q.astype(np.float32)
    block = KINDS[qtype].block
    rows = q.shape[0]
    w = q.reshape(rows, -1, block).astype(np.float32) * scale[..., None]
    if offset is not None:
        w = w + offset[..., None]
    return w.reshape(rows, cols)
