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

Q = gguf.GGMLQuantizationType
QK_K = 256


@dataclass(frozen=True)
class Kind:
    """How a quant type is represented in the kernels."""

    block: int  # inputs per scale block
    scaled: bool
    offset: bool
    wdtype: str  # "int8" or "float32"


KINDS: dict[Q, Kind] = {
    Q.F32: Kind(32, False, False, "float32"),
    Q.F16: Kind(32, False, False, "float32"),
    Q.BF16: Kind(32, False, False, "float32"),
    Q.Q4_0: Kind(32, True, False, "int8"),
    Q.Q5_0: Kind(32, True, False, "int8"),
    Q.Q8_0: Kind(32, True, False, "int8"),
    Q.Q4_1: Kind(32, True, True, "int8"),
    Q.Q5_1: Kind(32, True, True, "int8"),
    Q.Q4_K: Kind(32, True, True, "int8"),
    Q.Q5_K: Kind(32, True, True, "int8"),
    Q.Q6_K: Kind(16, True, False, "int8"),
}


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes (…, 2) → float32 (…)."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(…, 16) bytes → (…, 32) values: low nibbles first, then high (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(…, 4) bytes of a little-endian uint32 → (…, 32) bits 0..31."""
    word = np.ascontiguousarray(qh).view("<u4")[..., 0].astype(np.uint32)
    return ((word[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of Q4_K/Q5_K → eight 6-bit scales and eight 6-bit mins."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 6) << 4)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=-1)
    return sc, mn


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
        d = _f16(b[..., 0:2])
        if qtype == Q.Q8_0:
            q = b[..., 2:34].view(np.int8)
            return q.reshape(rows, cols), d, None
        if qtype == Q.Q4_0:
            q = _nibbles(b[..., 2:18]).astype(np.int8) - np.int8(8)
            return q.reshape(rows, cols), d, None
        if qtype == Q.Q4_1:
            q = _nibbles(b[..., 4:20]).astype(np.int8)
            return q.reshape(rows, cols), d, _f16(b[..., 2:4])
        if qtype == Q.Q5_0:
            q = (_nibbles(b[..., 6:22]) | (_high_bits(b[..., 2:6]) << 4)).astype(np.int8) - np.int8(16)
            return q.reshape(rows, cols), d, None
        q = (_nibbles(b[..., 8:24]) | (_high_bits(b[..., 4:8]) << 4)).astype(np.int8)
        return q.reshape(rows, cols), d, _f16(b[..., 2:4])
    nsb = cols // QK_K
    if qtype in (Q.Q4_K, Q.Q5_K):
        bsize = gguf.GGML_QUANT_SIZES[qtype][1]
        b = raw.reshape(rows, nsb, bsize)
        d = _f16(b[..., 0:2])[..., None]
        dmin = _f16(b[..., 2:4])[..., None]
        sc, mn = _k_scale_min(b[..., 4:16])
        scale = d * sc.astype(np.float32)  # (rows, nsb, 8): same op order as ggml
        offset = -(dmin * mn.astype(np.float32))
        if qtype == Q.Q4_K:
            qs = b[..., 16:144].reshape(rows, nsb, 4, 32)
            q = np.stack([qs & 0x0F, qs >> 4], axis=3)  # (rows, nsb, 4, 2, 32)
        else:
            qh = b[..., 16:48]  # (rows, nsb, 32): bit j of qh[l] belongs to sub-block j
            qs = b[..., 48:176].reshape(rows, nsb, 4, 32)
            low = np.stack([qs & 0x0F, qs >> 4], axis=3)
            hb = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (rows,nsb,8,32)
            q = low.reshape(rows, nsb, 8, 32) | (hb << 4)
        q = q.astype(np.int8).reshape(rows, cols)
        return q, scale.reshape(rows, nsb * 8), offset.reshape(rows, nsb * 8)
    if qtype == Q.Q6_K:
        b = raw.reshape(rows, nsb, 210)
        ql = b[..., 0:128].reshape(rows, nsb, 2, 64)
        qh = b[..., 128:192].reshape(rows, nsb, 2, 32)
        sc = b[..., 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[..., 208:210])[..., None]
        low = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(rows, nsb, 2, 4, 32)
        high = (qh[..., None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 3
        q = (low | (high << 4)).astype(np.int8) - np.int8(32)
        scale = d * sc  # (rows, nsb, 16)
        return q.reshape(rows, cols), scale.reshape(rows, nsb * 16), None
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
