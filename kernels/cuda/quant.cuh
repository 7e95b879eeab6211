// Dequantize 8 consecutive weights of a GGUF row, read straight from the stored blocks.
//
// Every quantized matrix product and the embedding lookup go through dq8<QT>: one
// place that knows each block layout (ggml's, as gguf-py documents them). Chunk c of
// a row holds elements [8c, 8c + 8). Arithmetic uses __fmul_rn/__fsub_rn so the
// compiler can never contract it differently in different kernel instantiations:
// the same weight must dequantize to the same float in every kernel that reads it.

#define QT_F32 0
#define QT_F16 1
#define QT_Q4_0 2
#define QT_Q4_1 3
#define QT_Q5_0 6
#define QT_Q5_1 7
#define QT_Q8_0 8
#define QT_Q4_K 12
#define QT_Q5_K 13
#define QT_Q6_K 14
#define QT_IQ4_NL 20
#define QT_IQ4_XS 23
#define QT_BF16 30

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float ldh(const u8* p) {
    // 2-byte aligned in every block layout used here.
    return h2f(*reinterpret_cast<const u16*>(p));
}

__device__ __forceinline__ u32 ldh16(const u8* p) {
    // A 2-byte aligned little-endian 16-bit integer.
    return *reinterpret_cast<const u16*>(p);
}

__device__ __forceinline__ u32 ld32u(const u8* p) {
    // 4 bytes at a 2-byte aligned address.
    const u16* h = reinterpret_cast<const u16*>(p);
    return (u32)h[0] | ((u32)h[1] << 16);
}

__device__ __forceinline__ void ld8(const u8* p, u8 b[8]) {
    // 8 bytes at a 2-byte aligned address, as four 16-bit loads.
    const u16* h = reinterpret_cast<const u16*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u16 v = h[i];
        b[2 * i] = (u8)(v & 0xFF);
        b[2 * i + 1] = (u8)(v >> 8);
    }
}

// Byte k of v (an integer 0..255) as a float, minus (bias - 2^23): exact for these small
// integers, and two full-rate instructions (byte permute into the mantissa of 2^23, then
// a subtract) instead of shift, mask and the quarter-rate int-to-float conversion.
// Every quant type converts its codes through here, so each weight dequantizes to the
// same float as before (checked against gguf-py by the embedding test).
template <int k>
__device__ __forceinline__ float byte_f(u32 v, float bias) {
    return __fsub_rn(__int_as_float(__byte_perm(v, 0x4B000000u, 0x7650 | k)), bias);
}

// Four codes of one 32-bit word as floats (code - (bias - 2^23)).
__device__ __forceinline__ void bytes4_f(u32 v, float bias, float* f) {
    f[0] = byte_f<0>(v, bias);
    f[1] = byte_f<1>(v, bias);
    f[2] = byte_f<2>(v, bias);
    f[3] = byte_f<3>(v, bias);
}

#define MAGIC 8388608.0f

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int QT>
__device__ __forceinline__ void dq8(const u8* row, int c, float w[8]);

template <>
__device__ __forceinline__ void dq8<QT_F32>(const u8* row, int c, float w[8]) {
    const float4* p = reinterpret_cast<const float4*>(row) + 2 * c;
    float4 a = p[0], b = p[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

template <>
__device__ __forceinline__ void dq8<QT_F16>(const u8* row, int c, float w[8]) {
    uint4 v = reinterpret_cast<const uint4*>(row)[c];
    u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = h2f((u16)(u[i] & 0xFFFF));
        w[2 * i + 1] = h2f((u16)(u[i] >> 16));
    }
}

template <>
__device__ __forceinline__ void dq8<QT_BF16>(const u8* row, int c, float w[8]) {
    uint4 v = reinterpret_cast<const uint4*>(row)[c];
    u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = __uint_as_float(u[i] << 16);
        w[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
}

// Q4_0 and IQ4_NL share a layout (18-byte blocks: d, 16 index bytes; byte j's low nibble is
// element j, its high nibble element j + 16); IQ4_NL maps each index to its level
// (iq4_levels, below), as a byte + 128.
template <bool LEVELS>
__device__ __forceinline__ void dq8_d16(const u8* row, int c, float w[8]);

template <>
__device__ __forceinline__ void dq8<QT_Q4_0>(const u8* row, int c, float w[8]) {
    dq8_d16<false>(row, c, w);
}

template <>
__device__ __forceinline__ void dq8<QT_Q4_1>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 2) * 20;
    int sub = c & 3;
    float d = ldh(blk), m = ldh(blk + 2);
    const u8* qs = blk + 4 + (sub & 1) * 8;
    int shift = (sub >> 1) * 4;
    float f[8];
    bytes4_f((ld32u(qs) >> shift) & 0x0F0F0F0Fu, MAGIC, f);
    bytes4_f((ld32u(qs + 4) >> shift) & 0x0F0F0F0Fu, MAGIC, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fadd_rn(__fmul_rn(d, f[i]), m);
}

template <>
__device__ __forceinline__ void dq8<QT_Q5_0>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 2) * 22;
    int sub = c & 3;
    float d = ldh(blk);
    u32 qh = ld32u(blk + 2);
    u8 b[8];
    ld8(blk + 6 + (sub & 1) * 8, b);
    int shift = (sub >> 1) * 4;
    int e0 = sub * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = ((b[i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
        w[i] = __fmul_rn(d, (float)(q - 16));
    }
}

template <>
__device__ __forceinline__ void dq8<QT_Q5_1>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 2) * 24;
    int sub = c & 3;
    float d = ldh(blk), m = ldh(blk + 2);
    u32 qh = ld32u(blk + 4);
    u8 b[8];
    ld8(blk + 8 + (sub & 1) * 8, b);
    int shift = (sub >> 1) * 4;
    int e0 = sub * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = ((b[i] >> shift) & 0xF) | (((qh >> (e0 + i)) & 1) << 4);
        w[i] = __fadd_rn(__fmul_rn(d, (float)q), m);
    }
}

template <>
__device__ __forceinline__ void dq8<QT_Q8_0>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 2) * 34;
    float d = ldh(blk);
    const u8* qs = blk + 2 + (c & 3) * 8;
    float f[8];  // signed codes: flip the sign bit (b + 128), subtract 128 more
    bytes4_f(ld32u(qs) ^ 0x80808080u, MAGIC + 128.0f, f);
    bytes4_f(ld32u(qs + 4) ^ 0x80808080u, MAGIC + 128.0f, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fmul_rn(d, f[i]);
}

template <>
__device__ __forceinline__ void dq8<QT_Q4_K>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 5) * 144;
    int e0 = (c & 31) * 8;
    int j = e0 >> 6, h = (e0 >> 5) & 1, l0 = e0 & 31;
    float d = ldh(blk), dmin = ldh(blk + 2);
    int sc, mn;
    scale_min_k4(2 * j + h, blk + 4, sc, mn);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)mn);
    uint2 v = *reinterpret_cast<const uint2*>(blk + 16 + 32 * j + l0);  // 8-aligned: 144 = 16 * 9
    int shift = h * 4;
    float f[8];
    bytes4_f((v.x >> shift) & 0x0F0F0F0Fu, MAGIC, f);
    bytes4_f((v.y >> shift) & 0x0F0F0F0Fu, MAGIC, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fsub_rn(__fmul_rn(d1, f[i]), m1);
}

template <>
__device__ __forceinline__ void dq8<QT_Q5_K>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 5) * 176;
    int e0 = (c & 31) * 8;
    int j = e0 >> 6, h = (e0 >> 5) & 1, l0 = e0 & 31;
    float d = ldh(blk), dmin = ldh(blk + 2);
    int sc, mn;
    scale_min_k4(2 * j + h, blk + 4, sc, mn);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)mn);
    uint2 hv = *reinterpret_cast<const uint2*>(blk + 16 + l0);  // 176 = 16 * 11
    uint2 v = *reinterpret_cast<const uint2*>(blk + 48 + 32 * j + l0);
    u32 u[2] = {v.x, v.y}, uh[2] = {hv.x, hv.y};
    int shift = h * 4, hb = 2 * j + h;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int q = ((u[i >> 2] >> (8 * (i & 3) + shift)) & 0xF) |
                (((uh[i >> 2] >> (8 * (i & 3) + hb)) & 1) << 4);
        w[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

template <>
__device__ __forceinline__ void dq8<QT_Q6_K>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 5) * 210;
    int e0 = (c & 31) * 8;
    int half = e0 >> 7, r = e0 & 127;
    int quarter = r >> 5, l0 = r & 31;
    float d = ldh(blk + 208);
    int sc = (int)(signed char)blk[192 + 8 * half + (l0 >> 4) + 2 * quarter];
    float ds = __fmul_rn(d, (float)sc);
    const u8* ql = blk + 64 * half + l0 + ((quarter & 1) ? 32 : 0);
    const u8* qh = blk + 128 + 32 * half + l0;
    int lshift = (quarter >> 1) * 4, hshift = quarter * 2;
    float f[8];  // 6-bit codes, low 4 bits from ql, high 2 from qh, minus 32
    bytes4_f(((ld32u(ql) >> lshift) & 0x0F0F0F0Fu) | (((ld32u(qh) >> hshift) & 0x03030303u) << 4),
             MAGIC + 32.0f, f);
    bytes4_f(((ld32u(ql + 4) >> lshift) & 0x0F0F0F0Fu) |
                 (((ld32u(qh + 4) >> hshift) & 0x03030303u) << 4),
             MAGIC + 32.0f, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fmul_rn(ds, f[i]);
}

// IQ4_NL / IQ4_XS: a 4-bit index picks one of 16 fixed int8 levels (ggml's table), which
// the block scale multiplies. iq4_levels maps four indices (one per byte, 0..15) to their
// levels + 128 (one per byte, 1..241) with two byte permutes, one per half of the table,
// and bit 3 of each index choosing between them: the "offset" code bytes that both the
// CUDA-core path (bytes4_f with bias 128) and the tensor-core path (TcTraits::off) read.
__device__ __forceinline__ u32 iq4_levels(u32 idx) {
    const u32 t0 = 0x3F2D1801u, t1 = 0x766A5D4Fu;  // levels 0-7 + 128: 1 24 45 63 79 93 106 118
    const u32 t2 = 0xA6998D81u, t3 = 0xF1D9C5B5u;  // levels 8-15 + 128: 129 ... 241
    u32 x = idx & 0x07070707u;
    u32 y = x | (x >> 4);
    u32 sel = (y & 0xFFu) | ((y >> 8) & 0xFF00u);  // byte i's index in nibble i
    u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    u32 m = ((idx >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

template <bool LEVELS>
__device__ __forceinline__ void dq8_d16(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 2) * 18;
    int sub = c & 3;
    float d = ldh(blk);
    const u8* qs = blk + 2 + (sub & 1) * 8;
    int shift = (sub >> 1) * 4;
    constexpr float bias = MAGIC + (LEVELS ? 128.0f : 8.0f);
    float f[8];
    u32 v0 = (ld32u(qs) >> shift) & 0x0F0F0F0Fu;
    bytes4_f(LEVELS ? iq4_levels(v0) : v0, bias, f);
    u32 v1 = (ld32u(qs + 4) >> shift) & 0x0F0F0F0Fu;
    bytes4_f(LEVELS ? iq4_levels(v1) : v1, bias, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fmul_rn(d, f[i]);
}

// IQ4_NL: w = d * level.
template <>
__device__ __forceinline__ void dq8<QT_IQ4_NL>(const u8* row, int c, float w[8]) {
    dq8_d16<true>(row, c, w);
}

// IQ4_XS sub-block ib's scale: f32(d * (ls - 32)), ls = 4 low bits from scales_l (nibble ib,
// low first) and 2 high bits from the 16-bit scales_h (bits 2 ib, 2 ib + 1), as ggml.
__device__ __forceinline__ float iq4_xs_scale(const u8* blk, int ib) {
    int ls = ((blk[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) | (((ldh16(blk + 2) >> (2 * ib)) & 3) << 4);
    return __fmul_rn(ldh(blk), (float)(ls - 32));
}

// IQ4_XS (136-byte superblocks: d, scales_h, scales_l[4], qs[128]; sub-block ib's 32 weights
// are qs[16 ib .. 16 ib + 15], low nibbles first): w = f32(d * (ls - 32)) * level.
template <>
__device__ __forceinline__ void dq8<QT_IQ4_XS>(const u8* row, int c, float w[8]) {
    const u8* blk = row + (c >> 5) * 136;
    int e0 = (c & 31) * 8;
    int ib = e0 >> 5, l = e0 & 31;
    float dl = iq4_xs_scale(blk, ib);
    const u8* qs = blk + 8 + 16 * ib + (l & 15);
    int shift = (l >> 4) * 4;
    float f[8];
    bytes4_f(iq4_levels((ld32u(qs) >> shift) & 0x0F0F0F0Fu), MAGIC + 128.0f, f);
    bytes4_f(iq4_levels((ld32u(qs + 4) >> shift) & 0x0F0F0F0Fu), MAGIC + 128.0f, f + 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __fmul_rn(dl, f[i]);
}

// ---- factored form: codes plus one scale (and min) per 8-weight chunk ----
// A chunk's weights are w_i = scale * q_i + mn (q_i exact small integers as floats), so a
// product can sum q_i * x_i first and apply scale and mn once per chunk: two fewer
// instructions per weight than dequantizing each weight (the head is issue-bound).
// Only the K-quants used by q4_k_m models have this form here (FACT_OK below).
template <int QT>
struct FactTraits { static constexpr bool ok = false; static constexpr bool has_min = false; };
template <> struct FactTraits<QT_Q4_K> { static constexpr bool ok = true; static constexpr bool has_min = true; };
template <> struct FactTraits<QT_Q6_K> { static constexpr bool ok = true; static constexpr bool has_min = false; };

// Small non-negative integer (< 2^23) as a float: full-rate, no int-to-float conversion.
__device__ __forceinline__ float small_f(u32 v) {
    return __fsub_rn(__int_as_float(0x4B000000u | v), MAGIC);
}

template <int QT>
__device__ __forceinline__ void codes8(const u8* row, int c, float q[8], float& scale, float& mn);

template <>
__device__ __forceinline__ void codes8<QT_Q4_K>(const u8* row, int c, float q[8], float& scale, float& mn) {
    const u8* blk = row + (c >> 5) * 144;
    int e0 = (c & 31) * 8;
    int j = e0 >> 6, h = (e0 >> 5) & 1, l0 = e0 & 31;
    u32 dd = *reinterpret_cast<const u32*>(blk);  // d | dmin << 16: blocks are 16-aligned
    int sc, m;
    scale_min_k4(2 * j + h, blk + 4, sc, m);
    scale = __fmul_rn(h2f((u16)(dd & 0xFFFF)), small_f((u32)sc));
    mn = -__fmul_rn(h2f((u16)(dd >> 16)), small_f((u32)m));  // w = scale * q - m1
    uint2 v = *reinterpret_cast<const uint2*>(blk + 16 + 32 * j + l0);
    int shift = h * 4;
    bytes4_f((v.x >> shift) & 0x0F0F0F0Fu, MAGIC, q);
    bytes4_f((v.y >> shift) & 0x0F0F0F0Fu, MAGIC, q + 4);
}

template <>
__device__ __forceinline__ void codes8<QT_Q6_K>(const u8* row, int c, float q[8], float& scale, float& mn) {
    const u8* blk = row + (c >> 5) * 210;
    int e0 = (c & 31) * 8;
    int half = e0 >> 7, r = e0 & 127;
    int quarter = r >> 5, l0 = r & 31;
    u32 sb = blk[192 + 8 * half + (l0 >> 4) + 2 * quarter] ^ 0x80u;  // signed scale + 128
    scale = __fmul_rn(ldh(blk + 208), __fsub_rn(__int_as_float(0x4B000000u | sb), MAGIC + 128.0f));
    mn = 0.0f;
    const u8* ql = blk + 64 * half + l0 + ((quarter & 1) ? 32 : 0);
    const u8* qh = blk + 128 + 32 * half + l0;
    int lshift = (quarter >> 1) * 4, hshift = quarter * 2;
    bytes4_f(((ld32u(ql) >> lshift) & 0x0F0F0F0Fu) | (((ld32u(qh) >> hshift) & 0x03030303u) << 4),
             MAGIC + 32.0f, q);
    bytes4_f(((ld32u(ql + 4) >> lshift) & 0x0F0F0F0Fu) |
                 (((ld32u(qh + 4) >> hshift) & 0x03030303u) << 4),
             MAGIC + 32.0f, q + 4);
}

// ---- tensor-core fragments (kernels.cu mt_body) ----
// One 64-weight unit u of a row (elements [64u, 64u + 64)) = two 32-weight groups i = 0, 1,
// each as two words of four code bytes in "offset" form (byte = code + TcTraits::off,
// 0..255) for the mma k-slots lane t (= lane & 3) owns: w[i][0] holds elements
// 64u + 32i + 4t .. +3, w[i][1] elements 64u + 32i + 16 + 4t .. +3. s0[i] scales w[i][0]'s
// codes, s1[i] w[i][1]'s (equal unless the type has a scale per 16 weights); mn[i] is the
// group's min (w = s * code + mn) for the types that have one. A unit's loads are shared
// by its two groups where the layout allows (Q4_K: one word holds both sub-blocks'
// nibbles; Q6_K: the high bits of quarters q and q+1 share bytes).
template <int QT>
struct TcTraits { static constexpr bool ok = false; };
template <> struct TcTraits<QT_Q4_0> { static constexpr bool ok = true, split = false, has_min = false; static constexpr int off = 8; };
template <> struct TcTraits<QT_Q4_1> { static constexpr bool ok = true, split = false, has_min = true; static constexpr int off = 0; };
template <> struct TcTraits<QT_Q5_0> { static constexpr bool ok = true, split = false, has_min = false; static constexpr int off = 16; };
template <> struct TcTraits<QT_Q5_1> { static constexpr bool ok = true, split = false, has_min = true; static constexpr int off = 0; };
template <> struct TcTraits<QT_Q8_0> { static constexpr bool ok = true, split = false, has_min = false; static constexpr int off = 128; };
template <> struct TcTraits<QT_Q4_K> { static constexpr bool ok = true, split = false, has_min = true; static constexpr int off = 0; };
template <> struct TcTraits<QT_Q5_K> { static constexpr bool ok = true, split = false, has_min = true; static constexpr int off = 0; };
template <> struct TcTraits<QT_Q6_K> { static constexpr bool ok = true, split = true, has_min = false; static constexpr int off = 32; };
template <> struct TcTraits<QT_IQ4_NL> { static constexpr bool ok = true, split = false, has_min = false; static constexpr int off = 128; };
template <> struct TcTraits<QT_IQ4_XS> { static constexpr bool ok = true, split = false, has_min = false; static constexpr int off = 128; };

template <int QT>
__device__ __forceinline__ void tc_unit(const u8* row, int u, int t, u32 w[2][2], float s0[2],
                                        float s1[2], float mn[2]);

// Q4_0 / IQ4_NL (dq8_d16's layout): element j < 16 is the low nibble of byte j, j >= 16 the
// high nibble; IQ4_NL's indices become their levels + 128 (TcTraits::off 128, Q4_0's 8).
template <bool LEVELS>
__device__ __forceinline__ void tc_unit_d16(const u8* row, int u, int t, u32 w[2][2],
                                            float s0[2], float s1[2], float mn[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* blk = row + (long long)(2 * u + i) * 18;  // 2-aligned
        u32 v = ld32u(blk + 2 + 4 * t);
        w[i][0] = LEVELS ? iq4_levels(v & 0x0F0F0F0Fu) : v & 0x0F0F0F0Fu;
        w[i][1] = LEVELS ? iq4_levels((v >> 4) & 0x0F0F0F0Fu) : (v >> 4) & 0x0F0F0F0Fu;
        s0[i] = s1[i] = ldh(blk);
        mn[i] = 0.0f;
    }
}

template <>
__device__ __forceinline__ void tc_unit<QT_Q4_0>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
    tc_unit_d16<false>(row, u, t, w, s0, s1, mn);
}

template <>
__device__ __forceinline__ void tc_unit<QT_Q4_1>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* blk = row + (long long)(2 * u + i) * 20;  // 4-aligned
        u32 dm = *reinterpret_cast<const u32*>(blk);
        u32 v = *reinterpret_cast<const u32*>(blk + 4 + 4 * t);
        w[i][0] = v & 0x0F0F0F0Fu;
        w[i][1] = (v >> 4) & 0x0F0F0F0Fu;
        s0[i] = s1[i] = h2f((u16)(dm & 0xFFFF));
        mn[i] = h2f((u16)(dm >> 16));
    }
}

// Four bits of a 32-bit high-bit word (bits 4 of four consecutive elements) spread to bit 4
// of each byte: a Q5 block's fifth bits joined to its nibbles one word at a time.
__device__ __forceinline__ u32 q5_high4(u32 qh, int first) {
    u32 h = (qh >> first) & 0xFu;
    return ((h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21)) << 4;
}

// A Q5 group's two code words for lane t: nibbles ``v`` (bytes 4t..4t+3) joined to fifth bits.
__device__ __forceinline__ void q5_words(u32 v, u32 qh, int t, u32 w[2]) {
    w[0] = (v & 0x0F0F0F0Fu) | q5_high4(qh, 4 * t);
    w[1] = ((v >> 4) & 0x0F0F0F0Fu) | q5_high4(qh, 16 + 4 * t);
}

// Q5_0 (22-byte blocks: d, qh, 16 nibble bytes; w = d * (code - 16)): element j < 16 is the
// low nibble of byte j, j >= 16 the high nibble of byte j - 16, bit 4 is bit j of qh.
template <>
__device__ __forceinline__ void tc_unit<QT_Q5_0>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* blk = row + (long long)(2 * u + i) * 22;  // 2-aligned
        q5_words(ld32u(blk + 6 + 4 * t), ld32u(blk + 2), t, w[i]);
        s0[i] = s1[i] = ldh(blk);
        mn[i] = 0.0f;
    }
}

// Q5_1 (24-byte blocks: d, m, qh, 16 nibble bytes; w = d * code + m), same element order.
template <>
__device__ __forceinline__ void tc_unit<QT_Q5_1>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* blk = row + (long long)(2 * u + i) * 24;  // 4-aligned
        u32 dm = *reinterpret_cast<const u32*>(blk);
        q5_words(*reinterpret_cast<const u32*>(blk + 8 + 4 * t),
                 *reinterpret_cast<const u32*>(blk + 4), t, w[i]);
        s0[i] = s1[i] = h2f((u16)(dm & 0xFFFF));
        mn[i] = h2f((u16)(dm >> 16));
    }
}

template <>
__device__ __forceinline__ void tc_unit<QT_Q8_0>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u8* blk = row + (long long)(2 * u + i) * 34;
        w[i][0] = ld32u(blk + 2 + 4 * t) ^ 0x80808080u;  // signed codes + 128
        w[i][1] = ld32u(blk + 18 + 4 * t) ^ 0x80808080u;
        s0[i] = s1[i] = ldh(blk);
        mn[i] = 0.0f;
    }
}

// A Q4_K / Q5_K unit's nibble words: v0, v1 (bytes 4t.. and 16 + 4t.. of sub-block pair j's 32
// bytes) hold sub-block 2j's codes in their low nibbles and 2j + 1's in their high ones.
__device__ __forceinline__ void q4k_words(u32 v0, u32 v1, u32 w[2][2]) {
    w[0][0] = v0 & 0x0F0F0F0Fu;
    w[0][1] = v1 & 0x0F0F0F0Fu;
    w[1][0] = (v0 >> 4) & 0x0F0F0F0Fu;
    w[1][1] = (v1 >> 4) & 0x0F0F0F0Fu;
}

// The scales and mins of sub-blocks 2j and 2j + 1 of a Q4_K / Q5_K block (dd: its first word,
// d | dmin << 16; the 12 scale bytes follow it): w = s * code + mn.
__device__ __forceinline__ void q4k_unit_scales(const u8* blk, u32 dd, int j, float s0[2],
                                                float s1[2], float mn[2]) {
    float d = h2f((u16)(dd & 0xFFFF)), dmin = h2f((u16)(dd >> 16));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int sc, m;
        scale_min_k4(2 * j + i, blk + 4, sc, m);
        s0[i] = s1[i] = __fmul_rn(d, small_f((u32)sc));
        mn[i] = -__fmul_rn(dmin, small_f((u32)m));
    }
}

template <>
__device__ __forceinline__ void tc_unit<QT_Q4_K>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
    const u8* blk = row + (long long)(u >> 2) * 144;  // 16-aligned
    int j = u & 3;  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles) of 32 bytes
    u32 dd = *reinterpret_cast<const u32*>(blk);
    const u8* qs = blk + 16 + 32 * j + 4 * t;
    q4k_words(*reinterpret_cast<const u32*>(qs), *reinterpret_cast<const u32*>(qs + 16), w);
    q4k_unit_scales(blk, dd, j, s0, s1, mn);
}

// A Q5_K unit's code words: q4k_words' nibbles (v0, v1) with bit 2j + h of the high-bit
// bytes (h0, h1: bytes 4t.. and 16 + 4t.. of qh) as bit 4 of sub-block 2j + h's codes.
__device__ __forceinline__ void q5k_words(u32 v0, u32 v1, u32 h0, u32 h1, int j, u32 w[2][2]) {
    h0 >>= 2 * j;
    h1 >>= 2 * j;
    w[0][0] = (v0 & 0x0F0F0F0Fu) | ((h0 & 0x01010101u) << 4);
    w[0][1] = (v1 & 0x0F0F0F0Fu) | ((h1 & 0x01010101u) << 4);
    w[1][0] = ((v0 >> 4) & 0x0F0F0F0Fu) | (((h0 >> 1) & 0x01010101u) << 4);
    w[1][1] = ((v1 >> 4) & 0x0F0F0F0Fu) | (((h1 >> 1) & 0x01010101u) << 4);
}

// Q5_K (176-byte blocks: d, dmin, 12 scale bytes, qh[32], qs[128]): Q4_K's nibbles and
// scales, plus bit 2j + h of qh[l] as bit 4 of sub-block 2j + h's element l.
template <>
__device__ __forceinline__ void tc_unit<QT_Q5_K>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
    const u8* blk = row + (long long)(u >> 2) * 176;  // 16-aligned
    int j = u & 3;  // sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles) of 32 bytes
    u32 dd = *reinterpret_cast<const u32*>(blk);
    const u8* qs = blk + 48 + 32 * j + 4 * t;
    const u8* qh = blk + 16 + 4 * t;
    q5k_words(*reinterpret_cast<const u32*>(qs), *reinterpret_cast<const u32*>(qs + 16),
              *reinterpret_cast<const u32*>(qh), *reinterpret_cast<const u32*>(qh + 16), j, w);
    q4k_unit_scales(blk, dd, j, s0, s1, mn);
}

// A Q6_K code word: four low nibbles (v >> lshift) with their two high bits (h >> hshift).
__device__ __forceinline__ u32 q6k_word(u32 v, u32 h, int lshift, int hshift) {
    return ((v >> lshift) & 0x0F0F0F0Fu) | (((h >> hshift) & 0x03030303u) << 4);
}

// Quarter q0 + i's two scales (s0 its first 16 weights, s1 the last) from the block's d and
// the half's four signed scale bytes + 128 (sb); Q6_K has no min.
__device__ __forceinline__ void q6k_scales(float d, u32 sb, int i, float s0[2], float s1[2],
                                           float mn[2]) {
    s0[i] = __fmul_rn(d, __fsub_rn(__int_as_float(0x4B000000u | ((sb >> (16 * i)) & 0xFF)), MAGIC + 128.0f));
    s1[i] = __fmul_rn(d, __fsub_rn(__int_as_float(0x4B000000u | ((sb >> (16 * i + 8)) & 0xFF)), MAGIC + 128.0f));
    mn[i] = 0.0f;
}

template <>
__device__ __forceinline__ void tc_unit<QT_Q6_K>(const u8* row, int u, int t, u32 w[2][2],
                                                 float s0[2], float s1[2], float mn[2]) {
    const u8* blk = row + (long long)(u >> 2) * 210;  // 2-aligned
    int half = (u >> 1) & 1, q0 = 2 * (u & 1);        // quarters q0, q0 + 1 of this half
    const u8* ql = blk + 64 * half + 4 * t;
    const u8* qh = blk + 128 + 32 * half + 4 * t;
    int lshift = (q0 >> 1) * 4;
    u32 h0 = ld32u(qh), h1 = ld32u(qh + 16);  // both quarters' high bits
    u32 sb = ld32u(blk + 192 + 8 * half + 2 * q0) ^ 0x80808080u;  // 4 signed scales + 128
    float d = ldh(blk + 208);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int q = q0 + i, hshift = 2 * q;
        const u8* l = ql + ((q & 1) ? 32 : 0);
        w[i][0] = q6k_word(ld32u(l), h0, lshift, hshift);
        w[i][1] = q6k_word(ld32u(l + 16), h1, lshift, hshift);
        q6k_scales(d, sb, i, s0, s1, mn);
    }
}

template <>
__device__ __forceinline__ void tc_unit<QT_IQ4_NL>(const u8* row, int u, int t, u32 w[2][2],
                                                   float s0[2], float s1[2], float mn[2]) {
    tc_unit_d16<true>(row, u, t, w, s0, s1, mn);
}

// IQ4_XS: unit u is sub-blocks 2j, 2j + 1 (j = u & 3) of superblock u >> 2, each with its
// own scale (iq4_xs_scale) and IQ4_NL's element order within its 16 bytes.
template <>
__device__ __forceinline__ void tc_unit<QT_IQ4_XS>(const u8* row, int u, int t, u32 w[2][2],
                                                   float s0[2], float s1[2], float mn[2]) {
    const u8* blk = row + (long long)(u >> 2) * 136;  // 8-aligned
    int j = u & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int ib = 2 * j + i;
        u32 v = *reinterpret_cast<const u32*>(blk + 8 + 16 * ib + 4 * t);
        w[i][0] = iq4_levels(v & 0x0F0F0F0Fu);
        w[i][1] = iq4_levels((v >> 4) & 0x0F0F0F0Fu);
        s0[i] = s1[i] = iq4_xs_scale(blk, ib);
        mn[i] = 0.0f;
    }
}
