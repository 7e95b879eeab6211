"""Q6_K matrix product as an MLX custom Metal kernel (Apple GPUs only).

Why a kernel: Q6_K groups are 16 weights, MLX's affine groups are 32 or more,
so there is no exact rewrite; a float32 copy would read 32 bits a weight
instead of 6.56. This kernel reads the GGUF blocks as stored.

Layout (per 256-weight block, 210 bytes): ql[128] low nibbles, qh[64] high
2-bit pairs, scales int8[16], d half. Weight y = d · sc · (q - 32), computed
in float32 as gguf does (d · sc is exact, one rounding after).

One simdgroup (32 lanes) computes one output element; lane l always handles
the same 8 weights of each block and the lanes are summed by ``simd_sum``, so
the reduction order depends on the weight shape only, never on how many rows
share the call (batch-invariant by construction).

NOT RUN on the development machine (Linux, no Metal): the backend only uses it
after ``self_check`` agrees with the float32 path on the device.
"""

from __future__ import annotations

from typing import Any

SOURCE = """
    uint row = thread_position_in_grid.x / 32;
    uint lane = thread_index_in_simdgroup;
    uint r = thread_position_in_grid.y;
    const uint nblk = IN / 256;
    const device uint8_t* wrow = w + (ulong)row * nblk * 210;
    const device float* xr = x + (ulong)r * IN;
    float acc = 0.0f;
    for (uint b = 0; b < nblk; ++b) {
        const device uint8_t* blk = wrow + b * 210;
        float d = float(as_type<half>(ushort(blk[208]) | (ushort(blk[209]) << 8)));
        const device float* xb = xr + b * 256;
        for (uint h = 0; h < 2; ++h) {
            const device uint8_t* ql = blk + 64 * h;
            const device uint8_t* qh = blk + 128 + 32 * h;
            const device uint8_t* sc = blk + 192 + 8 * h;
            uint is = lane / 16;
            uint8_t lo0 = ql[lane];
            uint8_t lo1 = ql[lane + 32];
            uint8_t hi = qh[lane];
            int q1 = int((lo0 & 0xF) | ((hi & 3) << 4)) - 32;
            int q2 = int((lo1 & 0xF) | (((hi >> 2) & 3) << 4)) - 32;
            int q3 = int((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32;
            int q4 = int((lo1 >> 4) | (((hi >> 6) & 3) << 4)) - 32;
            float s1 = d * float(as_type<char>(sc[is + 0]));
            float s2 = d * float(as_type<char>(sc[is + 2]));
            float s3 = d * float(as_type<char>(sc[is + 4]));
            float s4 = d * float(as_type<char>(sc[is + 6]));
            uint base = 128 * h + lane;
            acc += (s1 * float(q1)) * xb[base];
            acc += (s2 * float(q2)) * xb[base + 32];
            acc += (s3 * float(q3)) * xb[base + 64];
            acc += (s4 * float(q4)) * xb[base + 96];
        }
    }
    float total = simd_sum(acc);
    if (lane == 0) {
        out[(ulong)r * ROWS + row] = total;
    }
"""

_KERNEL: Any = None


def _kernel() -> Any:
    global _KERNEL
    if _KERNEL is None:
        import mlx.core as mx

        _KERNEL = mx.fast.metal_kernel(
            name="echoline_q6k_matmul",
            input_names=["x", "w"],
            output_names=["out"],
            source=SOURCE,
        )
    return _KERNEL


def q6k_matmul(x: Any, blocks: Any, rows: int, in_features: int) -> Any:
    """x (n, in) float32 @ W.T for W given as Q6_K blocks (rows, in/256·210) uint8 → (n, rows)."""
    import mlx.core as mx

    n = x.shape[0]
    (out,) = _kernel()(
        inputs=[x, blocks],
        template=[("IN", in_features), ("ROWS", rows)],
        grid=(32 * rows, n, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(n, rows)],
        output_dtypes=[mx.float32],
    )
    return out
