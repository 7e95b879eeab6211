// echoline CUDA kernels: GGUF matrix products, attention, norms, RoPE, cache writes.
//
// Batch invariance is the design rule: a row's result never depends on how many rows
// share a launch. Matrix products give each warp whole output columns and loop over
// the input rows with one fixed per-row reduction order (no split-K); attention splits
// the cache into chunks of a FIXED number of keys, so a verify step and a decode step
// reduce the same chunks in the same order. Built with --fmad=false: every fused
// multiply-add below is written out (fmaf), so instantiations cannot differ.

#include "quant.cuh"

// Units (64 weights of K) a tensor-core product warp loads before any math: a speed choice
// (bytes in flight) that changes no bits, since each warp still adds its units in order.
// A module compiled with another value is a backend setting (tensor_units).
#ifndef MT_UNITS
#define MT_UNITS 1
#endif

// Blocks of 4 warps a tensor-core product kernel asks to keep resident per SM (the second
// __launch_bounds__ argument; KW warps per block ask for 4 / KW as many): the compiler caps
// registers to fit. A speed choice only (register allocation changes no arithmetic: every
// multiply-add is written out, --fmad=false). Qwen 0.5B's gate|up (608 blocks of 4 warps,
// 105 registers) fit 4 blocks per SM: 1.15 waves on 132 SMs. Backend setting
// tensor_min_blocks (module suffix "@bN").
#ifndef MT_MINB
#define MT_MINB 1
#endif
// Integer tensor-core products (module suffix "@i1", backend setting tensor_int8): x is
// quantized to int8 per (row, 32-element group) and each group's dot product is one exact
// integer mma (u8 weight codes x s8 x codes, s32 sums) instead of two f16 mma over codes
// decoded to f16 (see "integer form" below). Other bits than the f16 form, the same
// batch invariance.
#ifndef MT_INT8
#define MT_INT8 0
#endif
// The same for the kernels of 4 or 8 eight-row tiles per pass (NT >= 4: launches past 16
// rows), where set (module suffix "@rN", backend setting tensor_min_blocks_rows; 0: MT_MINB).
// Why apart: their accumulators need more registers, and at MT_MINB 5 (96 registers) ptxas
// spills some of them (nvcc 13.0, sm_90, integer form: mt_q4_k_n4_m2_w4, the 7B's gate|up
// at 17-32 rows, 252 bytes stored and 444 loaded; 168 registers without a bound).
#ifndef MT_MINB_ROWS
#define MT_MINB_ROWS 0
#endif
#define MT_MINB_FOR(NT) (((NT) >= 4 && MT_MINB_ROWS > 0) ? MT_MINB_ROWS : MT_MINB)
#define MT_BOUNDS(KW, NT)                                                                       \
    __launch_bounds__((KW) * 32, (MT_MINB_FOR(NT) * 4 / (KW)) > 0 ? (MT_MINB_FOR(NT) * 4 / (KW)) : 1)

#define MM_WARPS 4

// Programmatic dependent launch (Hopper and later; backend setting programmatic_launch).
// Every kernel starts with this: wait until the grids it depends on have completed and
// their writes are visible. Launched with the attribute, the next kernel in the stream is
// then set up while this one runs, and its blocks sit at their own wait: the launch gap of
// a chain of small kernels overlaps the kernel before it. Nothing is read or written before
// the wait, so no result can change; launched without the attribute it is a no-op.
// PDL_EARLY (module suffix "@p1", setting programmatic_early) also releases the next
// kernel's blocks at once instead of when this grid's blocks exit: more overlap, but the
// waiting blocks take SM slots wherever one is free, which can pack a grid onto few SMs.
#ifndef PDL_EARLY
#define PDL_EARLY 0
#endif
__device__ __forceinline__ void grid_dependency() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#if PDL_EARLY
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Activations of the gated FFN, one definition shared by the fused product epilogue
// and the standalone kernel, so both round alike.
__device__ __forceinline__ float act_glu(int act, float g, float u) {
    float a;
    if (act == 1) {
        a = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    } else {
        float g3 = __fmul_rn(__fmul_rn(g, g), g);
        float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(g, __fmul_rn(0.044715f, g3)));
        a = __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
    }
    return __fmul_rn(a, u);
}

// Y[r, col] = epilogue(sum_k X[r, k] * W[col, k]) for r < n, col < out_rows.
// A warp owns C whole weight columns; lane l owns chunks l, l+32, ... of each row.
// Rows are taken R at a time, so a weight chunk is dequantized once per R rows and an
// input chunk is loaded once per C columns. Whatever R and C, the (row, column)
// value is the same sequence of fmaf over the same chunks, then the same butterfly:
// bit-identical for every row count.
//
// Fused variants (all optional, each decided per call, never per row count):
//  - G (RMSNorm weight): the product is of rms_norm(X) * G. The weight chunk is scaled
//    by G once per column, and each row's sum of squares is accumulated from the x
//    chunks the warp loads anyway (same lanes, same order for every R, C and n), so
//    y = inv_rms(row) * sum_k (W*G)[k] x[k]: no norm launch, no extra pass over x.
//  - act (1 silu, 2 gelu-tanh): gated FFN. C is even; column cc of a warp is weight
//    column (cc & 1) * half + col0 + cc / 2, and y = act(gate) * up, written at col0 + cc/2.
//  - Res: residual / bias, y = Res[r * ldr + col] + y (ldr 0 broadcasts a bias row).
template <int QT, int R, int C, bool F>
__device__ __forceinline__ void mm_body(int bid, const u8* __restrict__ W, long long row_bytes, int out_rows,
                                        int K, const float* __restrict__ X, int ldx, int n,
                                        float* __restrict__ Y, int ldy, const float* __restrict__ G,
                                        float eps, const float* __restrict__ Res, int ldr, int act,
                                        int half, int ksplit) {
    constexpr int P = C > 1 ? C / 2 : 1;  // output columns per warp in the gated mode
    __shared__ float red[MM_WARPS][16][5];  // ksplit: per-warp totals (R <= 16, C <= 4, + ss)
    int warp = threadIdx.x >> 5;
    int wg = ksplit ? bid : bid * MM_WARPS + warp;
    int col0 = act ? wg * P : wg * C;
    int lane = threadIdx.x & 31;
    // ksplit: the block's 4 warps share its columns, warp w taking chunks w*32 + lane
    // (mod 128); their totals are added in warp order. Chosen per weight (long rows),
    // never per row count, so it is as batch-invariant as the plain mode.
    int klane = ksplit ? threadIdx.x : lane;
    int kstride = ksplit ? 32 * MM_WARPS : 32;
    if (col0 >= out_rows) return;
    int wcol[C];
#pragma unroll
    for (int cc = 0; cc < C; ++cc) {
        // past the end: duplicate the last column, never stored
        wcol[cc] = act ? (cc & 1) * half + min(col0 + (cc >> 1), out_rows - 1)
                       : min(col0 + cc, out_rows - 1);
    }
    bool norm = G != nullptr;
    int nchunks = K >> 3;
    for (int r0 = 0; r0 < n; r0 += R) {
        float acc[R][C];
        float ss[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
            ss[j] = 0.0f;
#pragma unroll
            for (int cc = 0; cc < C; ++cc) acc[j][cc] = 0.0f;
        }
        // U chunks per lane per pass: all U chunks' weights are loaded before any of
        // them is used (more bytes in flight at one row), then used in chunk order, so
        // each (row, column) still sees c, c + 32, c + 64, ... in sequence.
        if constexpr (F && FactTraits<QT>::ok) {
            // Factored chunks (quant.cuh codes8): per (row, column) and chunk c, in lane
            // order: p = sum_i q_i * xs_i (8 products, fixed order), acc = fma(scale, p, acc),
            // then acc = fma(mn, sum_i xs_i, acc) for types with a min; xs = x * G when the
            // norm is fused (applied to x once per row, not to every column's weights).
            // The same sequence for every R, C and n: batch-invariant.
            constexpr bool HM = FactTraits<QT>::has_min;
            for (int c = klane; c < nchunks; c += kstride) {
                float q[C][8], sc[C], mn[C];
#pragma unroll
                for (int cc = 0; cc < C; ++cc)
                    codes8<QT>(W + (long long)wcol[cc] * row_bytes, c, q[cc], sc[cc], mn[cc]);
                float gv[8];
                if (norm) {
                    const float4* gp = reinterpret_cast<const float4*>(G) + 2 * c;
                    float4 ga = gp[0], gb = gp[1];
                    gv[0] = ga.x; gv[1] = ga.y; gv[2] = ga.z; gv[3] = ga.w;
                    gv[4] = gb.x; gv[5] = gb.y; gv[6] = gb.z; gv[7] = gb.w;
                }
                constexpr int XB = R < (C == 1 ? 8 : 4) ? R : (C == 1 ? 8 : 4);
#pragma unroll
                for (int jb = 0; jb < R; jb += XB) {
                    float4 xa[XB], xb[XB];
#pragma unroll
                    for (int t = 0; t < XB; ++t) {
                        int row = min(r0 + jb + t, n - 1);  // past n: a valid row, never used
                        const float4* xp = reinterpret_cast<const float4*>(X + (long long)row * ldx) + 2 * c;
                        xa[t] = xp[0];
                        xb[t] = xp[1];
                    }
#pragma unroll
                    for (int t = 0; t < XB; ++t) {
                        int j = jb + t;
                        if (r0 + j < n) {
                            float4 a = xa[t], b = xb[t];
                            float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                            if (norm) {
                                float s2 = ss[j];
#pragma unroll
                                for (int e = 0; e < 8; ++e) s2 = fmaf(xs[e], xs[e], s2);
                                ss[j] = s2;
#pragma unroll
                                for (int e = 0; e < 8; ++e) xs[e] = __fmul_rn(xs[e], gv[e]);
                            }
                            float sx = 0.0f;
                            if constexpr (HM) {
                                sx = xs[0];
#pragma unroll
                                for (int e = 1; e < 8; ++e) sx = __fadd_rn(sx, xs[e]);
                            }
#pragma unroll
                            for (int cc = 0; cc < C; ++cc) {
                                float p = __fmul_rn(q[cc][0], xs[0]);
#pragma unroll
                                for (int e = 1; e < 8; ++e) p = fmaf(q[cc][e], xs[e], p);
                                float s = fmaf(sc[cc], p, acc[j][cc]);
                                if constexpr (HM) s = fmaf(mn[cc], sx, s);
                                acc[j][cc] = s;
                            }
                        }
                    }
                }
            }
        } else {
        constexpr int U = 1;  // 2-4 measured no faster (H200)
        for (int cb = klane; cb < nchunks; cb += kstride * U) {
            float wu[U][C][8];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                int c = cb + kstride * u;
                if (c >= nchunks) break;
#pragma unroll
                for (int cc = 0; cc < C; ++cc) dq8<QT>(W + (long long)wcol[cc] * row_bytes, c, wu[u][cc]);
                if (norm) {
                    const float4* gp = reinterpret_cast<const float4*>(G) + 2 * c;
                    float4 ga = gp[0], gb = gp[1];
                    float gv[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
                    for (int cc = 0; cc < C; ++cc)
#pragma unroll
                        for (int e = 0; e < 8; ++e) wu[u][cc][e] = __fmul_rn(wu[u][cc][e], gv[e]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
            int c = cb + kstride * u;
            if (c >= nchunks) break;
            float (&w)[C][8] = wu[u];
            // Input rows are loaded XB at a time before any arithmetic: one load in
            // flight per row had each chunk wait 16 cache round trips at 16 rows.
            constexpr int XB = R < (C == 1 ? 8 : 4) ? R : (C == 1 ? 8 : 4);
#pragma unroll
            for (int jb = 0; jb < R; jb += XB) {
                float4 xa[XB], xb[XB];
#pragma unroll
                for (int t = 0; t < XB; ++t) {
                    int row = min(r0 + jb + t, n - 1);  // past n: a valid row, never used
                    const float4* xp = reinterpret_cast<const float4*>(X + (long long)row * ldx) + 2 * c;
                    xa[t] = xp[0];
                    xb[t] = xp[1];
                }
#pragma unroll
                for (int t = 0; t < XB; ++t) {
                    int j = jb + t;
                    if (r0 + j < n) {
                        float4 a = xa[t], b = xb[t];
#pragma unroll
                        for (int cc = 0; cc < C; ++cc) {
                            float s = acc[j][cc];
                            s = fmaf(w[cc][0], a.x, s); s = fmaf(w[cc][1], a.y, s);
                            s = fmaf(w[cc][2], a.z, s); s = fmaf(w[cc][3], a.w, s);
                            s = fmaf(w[cc][4], b.x, s); s = fmaf(w[cc][5], b.y, s);
                            s = fmaf(w[cc][6], b.z, s); s = fmaf(w[cc][7], b.w, s);
                            acc[j][cc] = s;
                        }
                        if (norm) {
                            float q = ss[j];
                            q = fmaf(a.x, a.x, q); q = fmaf(a.y, a.y, q);
                            q = fmaf(a.z, a.z, q); q = fmaf(a.w, a.w, q);
                            q = fmaf(b.x, b.x, q); q = fmaf(b.y, b.y, q);
                            q = fmaf(b.z, b.z, q); q = fmaf(b.w, b.w, q);
                            ss[j] = q;
                        }
                    }
                }
            }
        }
        }
        }  // F
#pragma unroll
        for (int j = 0; j < R; ++j) {
#pragma unroll
            for (int cc = 0; cc < C; ++cc) acc[j][cc] = warp_sum(acc[j][cc]);
            if (norm) ss[j] = warp_sum(ss[j]);
        }
        if (ksplit) {
            if (lane == 0) {
#pragma unroll
                for (int j = 0; j < R; ++j) {
#pragma unroll
                    for (int cc = 0; cc < C; ++cc) red[warp][j][cc] = acc[j][cc];
                    red[warp][j][C] = ss[j];
                }
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < R; ++j) {
#pragma unroll
                for (int cc = 0; cc <= C; ++cc) {
                    float t = red[0][j][cc];
#pragma unroll
                    for (int w2 = 1; w2 < MM_WARPS; ++w2) t = __fadd_rn(t, red[w2][j][cc]);
                    if (cc < C) acc[j][cc] = t; else ss[j] = t;
                }
            }
            __syncthreads();  // red is rewritten by the next row tile
        }
        bool writer = lane == 0 && (!ksplit || warp == 0);
#pragma unroll
        for (int j = 0; j < R; ++j) {
            float inv = 1.0f;
            if (norm) {
                float ms = __fdiv_rn(ss[j], (float)K);
                inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
            }
            float v[C];
#pragma unroll
            for (int cc = 0; cc < C; ++cc) {
                v[cc] = acc[j][cc];
                if (norm) v[cc] = __fmul_rn(v[cc], inv);
            }
            int r = r0 + j;
            if (!writer || r >= n) continue;
            if (act) {
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    int col = col0 + p;
                    if (col >= out_rows) break;
                    float y = act_glu(act, v[2 * p], v[2 * p + 1]);
                    if (Res) y = __fadd_rn(Res[(long long)r * ldr + col], y);
                    Y[(long long)r * ldy + col] = y;
                }
            } else {
#pragma unroll
                for (int cc = 0; cc < C; ++cc) {
                    int col = col0 + cc;
                    if (col >= out_rows) break;
                    float y = v[cc];
                    if (Res) y = __fadd_rn(Res[(long long)r * ldr + col], y);
                    Y[(long long)r * ldy + col] = y;
                }
            }
        }
    }
}

#define MM_KERNEL_F(NAME, QT, R, C, F, SUF)                                                    \
    extern "C" __global__ void __launch_bounds__(MM_WARPS * 32)                               \
        mm_##NAME##_r##R##_c##C##SUF(const u8* W, long long row_bytes, int out_rows, int K,     \
                                const float* X, int ldx, int n, float* Y, int ldy,             \
                                const float* G, float eps, const float* Res, int ldr, int act, \
                                int half, int ksplit) {                                        \
        grid_dependency();                                                                     \
        mm_body<QT, R, C, F>(blockIdx.x, W, row_bytes, out_rows, K, X, ldx, n, Y, ldy, G, eps,  \
                             Res, ldr, act, half, ksplit);                                     \
    }
#define MM_KERNEL(NAME, QT, R, C) MM_KERNEL_F(NAME, QT, R, C, false, )

// Two segments of one fused weight (different quant types, e.g. q|k Q4_K + v Q6_K) in
// one launch: blocks [0, nblk_a) run segment a's columns, the rest segment b's. Each
// column runs the very mm_body its own launch would (same R, C, F): bit-identical to
// two launches, minus one launch and the small segment's latency tail.
#define MM2_KERNEL(NA, QA, NB, QB, R, C, F, SUF)                                               \
    extern "C" __global__ void __launch_bounds__(MM_WARPS * 32)                               \
        mm2_##NA##_##NB##_r##R##_c##C##SUF(                                                    \
            const u8* Wa, long long rba, int rows_a, int nblk_a, const u8* Wb, long long rbb,  \
            int rows_b, int K, const float* X, int ldx, int n, float* Ya, float* Yb, int ldy,  \
            const float* G, float eps, const float* Ra, const float* Rb, int ldr, int ksplit) { \
        grid_dependency();                                                                      \
        if ((int)blockIdx.x < nblk_a)                                                          \
            mm_body<QA, R, C, F>(blockIdx.x, Wa, rba, rows_a, K, X, ldx, n, Ya, ldy, G, eps, Ra, \
                                 ldr, 0, rows_a, ksplit);                                      \
        else                                                                                   \
            mm_body<QB, R, C, F>(blockIdx.x - nblk_a, Wb, rbb, rows_b, K, X, ldx, n, Yb, ldy, G, \
                                 eps, Rb, ldr, 0, rows_b, ksplit);                             \
    }

// C (columns per warp) only changes which warp computes a value, never its reduction
// order, so the backend picks C per launch: 1 keeps small matrices spread over the
// whole chip, 4 shares each input load across 4 columns for large ones; the gated
// mode takes gate/up pairs (C = 2 or 4).
#define MM_ALL_R(NAME, QT)                                                                    \
    MM_KERNEL(NAME, QT, 1, 1) MM_KERNEL(NAME, QT, 1, 2) MM_KERNEL(NAME, QT, 1, 4)               \
    MM_KERNEL(NAME, QT, 2, 1) MM_KERNEL(NAME, QT, 2, 2) MM_KERNEL(NAME, QT, 2, 4)               \
    MM_KERNEL(NAME, QT, 4, 1) MM_KERNEL(NAME, QT, 4, 2) MM_KERNEL(NAME, QT, 4, 4)               \
    MM_KERNEL(NAME, QT, 8, 1) MM_KERNEL(NAME, QT, 8, 2) MM_KERNEL(NAME, QT, 8, 4)               \
    MM_KERNEL(NAME, QT, 16, 1) MM_KERNEL(NAME, QT, 16, 2) MM_KERNEL(NAME, QT, 16, 4)

// The factored (quant.cuh codes8) products, suffix _f, for the types that have them.
#define MM_ALL_RF(NAME, QT)                                                                   \
    MM_KERNEL_F(NAME, QT, 1, 1, true, _f) MM_KERNEL_F(NAME, QT, 1, 2, true, _f)                \
    MM_KERNEL_F(NAME, QT, 1, 4, true, _f) MM_KERNEL_F(NAME, QT, 2, 1, true, _f)                \
    MM_KERNEL_F(NAME, QT, 2, 2, true, _f) MM_KERNEL_F(NAME, QT, 2, 4, true, _f)                \
    MM_KERNEL_F(NAME, QT, 4, 1, true, _f) MM_KERNEL_F(NAME, QT, 4, 2, true, _f)                \
    MM_KERNEL_F(NAME, QT, 4, 4, true, _f) MM_KERNEL_F(NAME, QT, 8, 1, true, _f)                \
    MM_KERNEL_F(NAME, QT, 8, 2, true, _f) MM_KERNEL_F(NAME, QT, 8, 4, true, _f)                \
    MM_KERNEL_F(NAME, QT, 16, 1, true, _f) MM_KERNEL_F(NAME, QT, 16, 2, true, _f)              \
    MM_KERNEL_F(NAME, QT, 16, 4, true, _f)

// Two-segment launches for one pair of types, plain (F false) or factored (suffix _f).
#define MM2_ALL_R(NA, QA, NB, QB, F, SUF)                                                     \
    MM2_KERNEL(NA, QA, NB, QB, 1, 1, F, SUF) MM2_KERNEL(NA, QA, NB, QB, 1, 4, F, SUF)          \
    MM2_KERNEL(NA, QA, NB, QB, 2, 1, F, SUF) MM2_KERNEL(NA, QA, NB, QB, 2, 4, F, SUF)          \
    MM2_KERNEL(NA, QA, NB, QB, 4, 1, F, SUF) MM2_KERNEL(NA, QA, NB, QB, 4, 4, F, SUF)          \
    MM2_KERNEL(NA, QA, NB, QB, 8, 1, F, SUF) MM2_KERNEL(NA, QA, NB, QB, 8, 4, F, SUF)          \
    MM2_KERNEL(NA, QA, NB, QB, 16, 1, F, SUF) MM2_KERNEL(NA, QA, NB, QB, 16, 4, F, SUF)

// ---- tensor-core products (backend flag tensor_products) ----
//
// Y[r, col] = epilogue(sum_k X[r, k] W[col, k]) with mma.sync m16n8k16 (f16 inputs, f32
// accumulation) for ANY row count, one row included: A = the codes of 16 weight columns
// (exact small integers in f16, decoded in registers from the stored blocks), B = 8 input
// rows (x rounded to f16), so each output element is its own dot product inside the
// instruction and rows never mix. x is rounded per (row, 64-element unit) after scaling by
// the power of two that puts the unit's largest |x| in [2^14, 2^15): no overflow, no
// subnormals, plain f16 relative rounding; the power is undone exactly with the weight
// scale. Per (row, column) and 32-group of a unit, in this order:
//     D = codes . x'  (two k16 mma chained; types with a scale per 16 weights: two D)
//     acc = fma(scale * 2^-e, D, acc);  types with a min: acc = fma(min * 2^-e, S, acc)
// with S = sum x' of the group (an mma with A = 1). A block's KW warps split K by units
// (warp w takes u = w, w + KW, ...), totals added in warp order; KW is chosen per weight
// shape. Nothing depends on the row count, NT (8-row tiles per pass) or MT (16-column
// tiles per warp): batch-invariant, decode == verify bit for bit.
//
// mma k-slots: a lane (gq = lane / 4, t = lane % 4) owns slots {2t, 2t+1, 2t+8, 2t+9};
// for a group's first mma they hold elements 4t + {0, 2, 1, 3} (codes_h2 splits a word
// of four code bytes into bytes 0,2 and 1,3), for its second mma 16 + 4t + {...}.

__device__ __forceinline__ u32 h2_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// A lane's 16 elements of a (row, unit) scaled by the power of two that puts the unit's
// largest |x| (mx, over the unit's 4 lanes) in [2^14, 2^15), rounded to f16 pairs in mma
// slot order; returns the power's inverse. The last step of x_lane_convert, which mt_body
// and xprep both call: one rounding.
__device__ __forceinline__ float x_scale_pack(const float (&xv)[16], float mx, u32 (&b)[4][2]) {
    int E = max((__float_as_int(mx) >> 23) & 0xFF, 15);
    float P = __int_as_float((268 - E) << 23);  // 2^(141 - E)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        b[q][0] = h2_pack(__fmul_rn(xv[4 * q], P), __fmul_rn(xv[4 * q + 2], P));
        b[q][1] = h2_pack(__fmul_rn(xv[4 * q + 1], P), __fmul_rn(xv[4 * q + 3], P));
    }
    return __int_as_float((E - 14) << 23);  // 2^(E - 141)
}

// A lane's 16 elements of x (row, elements k0 + 16q + e: group q >> 1, its mma q & 1) for
// mt_body's own conversion: loaded (zeros past n), with a fused norm its sum of squares added
// to ss and x * G taken. The f16 and the int8 forms start alike.
__device__ __forceinline__ void x_lane_load(const float* __restrict__ X, int ldx, int row, int n,
                                            int k0, bool norm, const float (&gv)[16], float& ss,
                                            float (&xv)[16]) {
    if (row < n) {
        const float* xr = X + (long long)row * ldx + k0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float4 xx = *reinterpret_cast<const float4*>(xr + 16 * q);
            xv[4 * q] = xx.x; xv[4 * q + 1] = xx.y; xv[4 * q + 2] = xx.z; xv[4 * q + 3] = xx.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 16; ++e) xv[e] = 0.0f;
    }
    if (norm) {
        float q = ss;
#pragma unroll
        for (int e = 0; e < 16; ++e) q = fmaf(xv[e], xv[e], q);
        ss = q;
#pragma unroll
        for (int e = 0; e < 16; ++e) xv[e] = __fmul_rn(xv[e], gv[e]);
    }
}

// The f16 form: x_lane_load, then x_scale_pack over the unit's 4 lanes. Every lane of the
// warp must call it (shuffles).
__device__ __forceinline__ float x_lane_convert(const float* __restrict__ X, int ldx, int row,
                                                int n, int k0, bool norm, const float (&gv)[16],
                                                float& ss, u32 (&b)[4][2]) {
    const unsigned full = 0xffffffffu;
    float xv[16];
    x_lane_load(X, ldx, row, n, k0, norm, gv, ss, xv);
    float mx = fabsf(xv[0]);
#pragma unroll
    for (int e = 1; e < 16; ++e) mx = fmaxf(mx, fabsf(xv[e]));
    mx = fmaxf(mx, __shfl_xor_sync(full, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(full, mx, 2));
    return x_scale_pack(xv, mx, b);
}

// The integer form of x: each 32-element group of a (row, unit) as int8 codes q = rint(x *
// inv), inv = 127 * rcp(amax) (the hardware's approximate reciprocal: one instruction, the
// same bits wherever it runs on one GPU model), with the group's scale xd = amax / 127
// (x ~ xd * q; |x * inv| < 127.5, so no code leaves [-127, 127]), amax taken over the
// group's 4 lanes. A lane's words are the mma's B operand as loaded: b[i][0] elements
// 32i + 4t .. +3, b[i][1] elements 32i + 16 + 4t .. +3 (byte e = element + e). amax is the
// largest |x| bit pattern (integer max: a NaN or inf beats every finite value, so xd, and
// the row's outputs, turn NaN instead of the value vanishing); a group of zeros (or below
// 1e-30) gets codes 0. Every lane must call it (shuffles).
__device__ __forceinline__ void x_quant8(const float (&xv)[16], u32 (&b)[2][2], float (&xd)[2]) {
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        u32 mb = __float_as_uint(xv[8 * i]) & 0x7FFFFFFFu;
#pragma unroll
        for (int e = 1; e < 8; ++e) mb = max(mb, __float_as_uint(xv[8 * i + e]) & 0x7FFFFFFFu);
        mb = max(mb, __shfl_xor_sync(full, mb, 1));
        mb = max(mb, __shfl_xor_sync(full, mb, 2));
        float amax = __uint_as_float(mb), r;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(amax));
        float inv = amax >= 1e-30f && amax <= 3.4028235e38f ? __fmul_rn(127.0f, r) : 0.0f;
        xd[i] = __fmul_rn(amax, 1.0f / 127.0f);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            int q[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) q[e] = __float2int_rn(__fmul_rn(xv[8 * i + 4 * j + e], inv));
            // low bytes of q0, q1 and of q2, q3, then the four together
            b[i][j] = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
        }
    }
}

// x converted once per product instead of once per column tile (xprep, below): h holds
// each (row, unit, lane t)'s b[4][2] (8 words, 32 bytes apart per lane), s each (row,
// unit)'s power inverse, ss each row's sum of squares for a fused norm, added in the order
// the consuming kernel's warps would (kwg). All null: mt_body converts x itself.
struct XPre {
    const u32* h;
    const float* s;
    const float* ss;
};

// Per (row, unit): the f16 form's 32 words and one power; the integer form's (MT_INT8) 16
// words (lane t's b[2][2] at 4t) and two group scales.
#define XP_WORDS (MT_INT8 ? 16 : 32)
#define XP_SCALES (MT_INT8 ? 2 : 1)

__device__ __forceinline__ XPre xpre_rows(XPre xp, int row0, int K) {
    if (!xp.h) return xp;
    long long units = (long long)row0 * (K >> 6);
    return {xp.h + units * XP_WORDS, xp.s + units * XP_SCALES, xp.ss ? xp.ss + row0 : nullptr};
}

// Four offset code bytes (code + OFF) of w as two f16 pairs of exact codes: bytes 0,2
// and bytes 1,3 (1024 + byte is exact in f16; subtracting 1024 + OFF is exact too).
template <int OFF>
__device__ __forceinline__ void codes_h2(u32 w, u32& lo, u32& hi) {
    constexpr u32 sub = (u32)(0x6400 + OFF) * 0x10001u;
    u32 a = (w & 0x00FF00FFu) | 0x64006400u;
    u32 b = ((w >> 8) & 0x00FF00FFu) | 0x64006400u;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(a), "r"(sub));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(b), "r"(sub));
}

__device__ __forceinline__ void mma16816(float d[4], const u32 a[4], u32 b0, u32 b1, const float c[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
}

// The integer form's mma (u8 weight codes in offset form x s8 x codes, exact s32 sums): k32
// for a whole 32-group, k16 for half of one (types with a scale per 16 weights).
__device__ __forceinline__ void mma_i8_k32(int d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// The same with s8 weight codes (MT_SIGNED: the types of offset 128, I8Codes below).
__device__ __forceinline__ void mma_s8_k32(int d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// MT_SIGNED (module suffix "@s1", backend setting tensor_int8_signed_codes): the types whose
// codes are signed bytes held in offset form (TcTraits::off 128: Q8_0, IQ4_NL, IQ4_XS)
// multiply them as s8 instead (mma .s8.s8, dp4a .s32.s32). D = sum code * xq is the same
// exact integer as sum (code + 128) * xq - 128 * S, so every bit is the same, without the
// correction: one mma of three per 32-group and step (A = 1: the sums S) and a multiply-
// subtract per output. flip turns the offset form back into s8 codes (the compiler folds it
// into tc_unit's own flip).
#ifndef MT_SIGNED
#define MT_SIGNED 0
#endif
template <int QT>
struct I8Codes {
    static constexpr bool sgn = MT_SIGNED && TcTraits<QT>::off == 128;
    static constexpr int off = sgn ? 0 : TcTraits<QT>::off;
    static constexpr bool sums = TcTraits<QT>::has_min || off != 0;  // S needed
    static constexpr u32 flip = sgn ? 0x80808080u : 0u;
};

__device__ __forceinline__ void mma_i8_k16(int d[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// The end of a split-K tensor product (mts kernels): the tile's blocks (gridDim.z of them)
// have written every warp's raw sums to `part`; the block that arrives last at the tile's
// counter adds them in warp order 0..kwg-1 (mt_body's order for KW = kwg: the same bits),
// adds Res and stores Y, then zeroes the counter for the next launch. Which block is last
// changes nothing: the order of the adds is fixed. Counters: one int per (x, y) block
// column, zero between launches (the backend allocates them zeroed).
__device__ __forceinline__ void mts_finish(int bid, int out_rows, int n, float* __restrict__ Y,
                                           int ldy, const float* __restrict__ Res, int ldr,
                                           const float* __restrict__ part, long long pstride,
                                           int kwg, int cols_per_block, int* __restrict__ cnt) {
    __shared__ int last;
    __threadfence();  // this block's sums visible to the chip before it counts itself in
    __syncthreads();
    if (threadIdx.x == 0) {
        int* c = cnt + blockIdx.y * gridDim.x + blockIdx.x;
        int done = atomicAdd(c, 1) == (int)gridDim.z - 1;
        if (done) *c = 0;  // every other block of the tile has counted itself already
        last = done;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    int col0 = bid * cols_per_block;
    int cols = min(cols_per_block, out_rows - col0);
    for (int i = threadIdx.x; i < n * cols; i += blockDim.x) {
        int r = i / cols, col = col0 + i % cols;
        const float* p = part + (long long)r * out_rows + col;
        float s = __ldcg(p);  // L2, not a stale L1 line
        for (int g = 1; g < kwg; ++g) s = __fadd_rn(s, __ldcg(p + g * pstride));
        if (Res) s = __fadd_rn(Res[(long long)r * ldr + col], s);
        Y[(long long)r * ldy + col] = s;
    }
}

// The cluster form of the same end (mtc kernels, Hopper and later): the tile's CS blocks are one
// thread-block cluster. Each pass, every warp puts its sums in its block's shared memory
// (buf[warp][row][col]); after a cluster barrier each block adds a share of the pass's outputs,
// reading all CS blocks' buffers through distributed shared memory in warp order g = rank*KW
// + w (mt_body's order for KW = CS*KW), adds Res, stores Y; a second barrier frees the buffers
// (and keeps every block alive while others read its shared memory).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank) {
    u32 out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}
__device__ __forceinline__ float cluster_load(u32 addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}
#endif

template <int NT, int KW, int CS, int MT>
__device__ __forceinline__ void mtc_fold(const float (&acc)[NT][MT][4], int r0, int n, int col0,
                                         int out_rows, float* __restrict__ Y, int ldy,
                                         const float* __restrict__ Res, int ldr, float* buf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int ROWS = 8 * NT;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
            buf[(warp * ROWS + nt * 8 + 2 * t + (c & 1)) * 16 + gq + 8 * (c >> 1)] = acc[nt][0][c];
    cluster_barrier();
    u32 base = (u32)__cvta_generic_to_shared(buf);
    int rows = min(ROWS, n - r0);
    for (int e = (int)cluster_rank() * blockDim.x + threadIdx.x; e < rows * 16; e += CS * blockDim.x) {
        int r = e >> 4, col = e & 15;
        float v[CS * KW];
#pragma unroll
        for (int q = 0; q < CS; ++q) {
            u32 remote = cluster_map(base, (u32)q);
#pragma unroll
            for (int w = 0; w < KW; ++w) v[q * KW + w] = cluster_load(remote + 4u * (u32)((w * ROWS + r) * 16 + col));
        }
        float s = v[0];
#pragma unroll
        for (int g = 1; g < CS * KW; ++g) s = __fadd_rn(s, v[g]);
        int gcol = col0 + col;
        if (gcol < out_rows) {
            if (Res) s = __fadd_rn(Res[(long long)(r0 + r) * ldr + gcol], s);
            Y[(long long)(r0 + r) * ldy + gcol] = s;
        }
    }
    cluster_barrier();
#endif
}

// The integer form of one (unit, 8-row tile) step of mt_body. Per (row, column) and 32-group i
// of the unit, in this order (D exact in s32, |D| < 2^21, so its float is exact too):
//     D = sum (code + off) * xq  (one k32 mma; types with a scale per 16 weights: two k16)
//     D -= off * S               (S = sum xq of the group or half: an mma with A = 1)
//     acc = fma(scale * xd, D, acc);  types with a min: acc = fma(min * xd, S, acc)
// xd is the group's x scale of the D column's row (lanes 8t and 8t + 4 hold rows 2t, 2t + 1).
template <int QT, int MT>
__device__ __forceinline__ void mt_i8_step(const u32 (&a)[2][2][MT][4], const float (&s0)[2][MT][2],
                                           const float (&s1)[2][MT][2], const float (&mn)[2][MT][2],
                                           const u32 (&b)[2][2], const float (&xd)[2], int t,
                                           float (&acc)[MT][4]) {
    using T = TcTraits<QT>;
    using C = I8Codes<QT>;
    constexpr bool sums = C::sums;
    constexpr u32 ones = 0x01010101u;
    const unsigned full = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float pv[2] = {__shfl_sync(full, xd[i], 8 * t), __shfl_sync(full, xd[i], 8 * t + 4)};
        if constexpr (T::split) {
            int sx0[4] = {0, 0, 0, 0}, sx1[4] = {0, 0, 0, 0};
            if constexpr (sums) {
                mma_i8_k16(sx0, ones, ones, b[i][0]);
                mma_i8_k16(sx1, ones, ones, b[i][1]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                int d0[4], d1[4];
                mma_i8_k16(d0, a[i][0][mt][0], a[i][0][mt][1], b[i][0]);
                mma_i8_k16(d1, a[i][1][mt][0], a[i][1][mt][1], b[i][1]);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float p = pv[c & 1];
                    int e0 = d0[c] - C::off * sx0[c], e1 = d1[c] - C::off * sx1[c];
                    float y = fmaf(__fmul_rn(s0[i][mt][c >> 1], p), __int2float_rn(e0), acc[mt][c]);
                    acc[mt][c] = fmaf(__fmul_rn(s1[i][mt][c >> 1], p), __int2float_rn(e1), y);
                }
            }
        } else {
            int sx[4] = {0, 0, 0, 0};
            if constexpr (sums) mma_i8_k32(sx, ones, ones, ones, ones, b[i][0], b[i][1]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                int d[4];
                if constexpr (C::sgn)
                    mma_s8_k32(d, a[i][0][mt][0] ^ C::flip, a[i][0][mt][1] ^ C::flip, a[i][1][mt][0] ^ C::flip,
                               a[i][1][mt][1] ^ C::flip, b[i][0], b[i][1]);
                else
                    mma_i8_k32(d, a[i][0][mt][0], a[i][0][mt][1], a[i][1][mt][0], a[i][1][mt][1], b[i][0], b[i][1]);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float p = pv[c & 1];
                    float y = fmaf(__fmul_rn(s0[i][mt][c >> 1], p), __int2float_rn(d[c] - C::off * sx[c]), acc[mt][c]);
                    if constexpr (T::has_min) y = fmaf(__fmul_rn(mn[i][mt][c >> 1], p), __int2float_rn(sx[c]), y);
                    acc[mt][c] = y;
                }
            }
        }
    }
}

// Fused options as in mm_body: G (RMSNorm weight: x * G is what gets rounded, inv_rms(row)
// scales the total; the sum of squares comes from the unrounded x the lanes load anyway),
// act (gated: a tile's rows 0..7 are gate columns, rows 8..15 the matching up columns), Res.
//
// SPLIT (the mts / mtc kernels below): the block is one of gridDim.z blocks sharing a column
// tile; its warps are warps z*KW .. z*KW + KW - 1 of kwg = gridDim.z*KW, each taking every
// kwg-th unit exactly as mt_body with KW = kwg would. SPLIT_GLOBAL: each warp's sums go to
// `part` (plane gw, pstride floats apart) and the tile's last block adds them (mts_finish).
// SPLIT_CLUSTER: the tile's blocks are one thread-block cluster; each pass's sums go to the
// block's shared memory and, after a cluster barrier, every block adds a share of the tile's
// outputs from all of the cluster's shared memories (mtc_fold). No norm, no gated epilogue.
// UN: units whose weights are loaded before any math (bytes in flight: same bits).
#define SPLIT_NONE 0
#define SPLIT_GLOBAL 1
#define SPLIT_CLUSTER 2
template <int QT, int NT, int MT, int KW, int SPLIT = SPLIT_NONE, int UN = MT_UNITS, int CS = 1>
__device__ __forceinline__ void mt_body(int bid, const u8* __restrict__ W, long long row_bytes,
                                        int out_rows, int K, const float* __restrict__ X, int ldx,
                                        int n, float* __restrict__ Y, int ldy,
                                        const float* __restrict__ G, float eps,
                                        const float* __restrict__ Res, int ldr, int act, int half,
                                        float* smem, XPre xp, float* __restrict__ part = nullptr,
                                        long long pstride = 0, int* cnt = nullptr) {
    using T = TcTraits<QT>;
    constexpr int NV = NT * MT * 4;  // accumulators per lane
    constexpr int U = UN;            // units whose weights are loaded before any math
    // smem (MT_SMEM floats, declared by the kernel so a pair launch shares it):
    float (*red)[NV][32] = reinterpret_cast<float (*)[NV][32]>(smem);  // [KW - 1][NV][32]
    float (*ssr)[NT][8] = reinterpret_cast<float (*)[NT][8]>(smem + (KW - 1) * NV * 32);  // [KW]
    const unsigned full = 0xffffffffu;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int gw = SPLIT ? (int)blockIdx.z * KW + warp : warp;  // this warp's place in the K order
    int kwg = SPLIT ? (int)gridDim.z * KW : KW;          // warps sharing the K range
    int gq = lane >> 2, t = lane & 3;
    int per_tile = act ? 8 : 16;  // output columns of one 16-row A tile
    int col0 = bid * MT * per_tile;
    if (col0 >= out_rows) return;  // whole block
    const u8* wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        int base = col0 + mt * per_tile + gq;
        int lo = min(base, out_rows - 1);  // past the end: a valid column, never stored
        int hi = act ? half + lo : min(base + 8, out_rows - 1);
        wr[mt][0] = W + (long long)lo * row_bytes;
        wr[mt][1] = W + (long long)hi * row_bytes;
    }
    bool norm = G != nullptr;
    int nunits = K >> 6;
    const u32 ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r0 = 0; r0 < n; r0 += 8 * NT) {
        float acc[NT][MT][4];
        float ss[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            ss[nt] = 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[nt][mt][c] = 0.0f;
        }
        for (int ub = gw; ub < nunits; ub += kwg * U) {
            u32 a[U][2][2][MT][4];  // [unit][group][mma][tile][reg]
            float s0[U][2][MT][2], s1[U][2][MT][2], mn[U][2][MT][2];
#pragma unroll
            for (int v = 0; v < U; ++v) {
                int u = ub + kwg * v;
                if (u >= nunits) break;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        u32 w[2][2];
                        float ts0[2], ts1[2], tmn[2];
                        tc_unit<QT>(wr[mt][h], u, t, w, ts0, ts1, tmn);
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            s0[v][i][mt][h] = ts0[i];
                            s1[v][i][mt][h] = ts1[i];
                            mn[v][i][mt][h] = tmn[i];
#pragma unroll
                            for (int j = 0; j < 2; ++j) {
                                if constexpr (MT_INT8) {  // the code bytes are the operand
                                    a[v][i][j][mt][h] = w[i][j];
                                } else {
                                    u32 lo, hi;
                                    codes_h2<T::off>(w[i][j], lo, hi);
                                    a[v][i][j][mt][h] = lo;      // a0 (row g) / a1 (row g + 8)
                                    a[v][i][j][mt][2 + h] = hi;  // a2 / a3
                                }
                            }
                        }
                    }
            }
#pragma unroll
            for (int v = 0; v < U; ++v) {
                int u = ub + kwg * v;
                if (u >= nunits) break;
                int k0 = 64 * u + 4 * t;
                float gv[16];
                if (norm && !xp.h) {
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        float4 gg = *reinterpret_cast<const float4*>(G + k0 + 16 * q);
                        gv[4 * q] = gg.x; gv[4 * q + 1] = gg.y; gv[4 * q + 2] = gg.z; gv[4 * q + 3] = gg.w;
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    int row = r0 + nt * 8 + gq;
                    if constexpr (MT_INT8) {
                        u32 b8[2][2];
                        float xd[2];
                        if (xp.h) {  // quantized once for every tile by xprep8: the same b8, xd
                            if (row < n) {
                                long long at = (long long)row * nunits + u;
                                uint4 bb = *reinterpret_cast<const uint4*>(xp.h + at * 16 + 4 * t);
                                b8[0][0] = bb.x; b8[0][1] = bb.y; b8[1][0] = bb.z; b8[1][1] = bb.w;
                                float2 sc = *reinterpret_cast<const float2*>(xp.s + at * 2);
                                xd[0] = sc.x; xd[1] = sc.y;
                            } else {
                                b8[0][0] = b8[0][1] = b8[1][0] = b8[1][1] = 0u;
                                xd[0] = xd[1] = 0.0f;  // a row past n: computed, never stored
                            }
                        } else {
                            float xv[16];
                            x_lane_load(X, ldx, row, n, k0, norm, gv, ss[nt], xv);
                            x_quant8(xv, b8, xd);
                        }
                        mt_i8_step<QT, MT>(a[v], s0[v], s1[v], mn[v], b8, xd, t, acc[nt]);
                        continue;
                    }
                    u32 b[4][2];
                    float Pinv;
                    if (xp.h) {  // x converted once for every tile by xprep: the same b, Pinv
                        if (row < n) {
                            long long at = (long long)row * nunits + u;
                            const uint4* bp = reinterpret_cast<const uint4*>(xp.h + (at * 4 + t) * 8);
                            uint4 b0 = bp[0], b1 = bp[1];
                            b[0][0] = b0.x; b[0][1] = b0.y; b[1][0] = b0.z; b[1][1] = b0.w;
                            b[2][0] = b1.x; b[2][1] = b1.y; b[3][0] = b1.z; b[3][1] = b1.w;
                            Pinv = xp.s[at];
                        } else {
#pragma unroll
                            for (int q = 0; q < 4; ++q) b[q][0] = b[q][1] = 0u;
                            Pinv = 0.0f;  // a row past n: computed, never stored
                        }
                    } else {
                        Pinv = x_lane_convert(X, ldx, row, n, k0, norm, gv, ss[nt], b);
                    }
                    // D's columns are rows 2t and 2t+1 of the tile: their lanes gq = 2t, 2t+1
                    float pv[2] = {__shfl_sync(full, Pinv, 8 * t), __shfl_sync(full, Pinv, 8 * t + 4)};
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        float sx[4];
                        if constexpr (T::has_min) {
                            mma16816(sx, ones, b[2 * i][0], b[2 * i][1], zero);
                            mma16816(sx, ones, b[2 * i + 1][0], b[2 * i + 1][1], sx);
                        }
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            if constexpr (T::split) {
                                float d0[4], d1[4];
                                mma16816(d0, a[v][i][0][mt], b[2 * i][0], b[2 * i][1], zero);
                                mma16816(d1, a[v][i][1][mt], b[2 * i + 1][0], b[2 * i + 1][1], zero);
#pragma unroll
                                for (int c = 0; c < 4; ++c) {
                                    float p = pv[c & 1];
                                    float y = fmaf(__fmul_rn(s0[v][i][mt][c >> 1], p), d0[c], acc[nt][mt][c]);
                                    acc[nt][mt][c] = fmaf(__fmul_rn(s1[v][i][mt][c >> 1], p), d1[c], y);
                                }
                            } else {
                                float d[4];
                                mma16816(d, a[v][i][0][mt], b[2 * i][0], b[2 * i][1], zero);
                                mma16816(d, a[v][i][1][mt], b[2 * i + 1][0], b[2 * i + 1][1], d);
#pragma unroll
                                for (int c = 0; c < 4; ++c) {
                                    float p = pv[c & 1];
                                    float y = fmaf(__fmul_rn(s0[v][i][mt][c >> 1], p), d[c], acc[nt][mt][c]);
                                    if constexpr (T::has_min) y = fmaf(__fmul_rn(mn[v][i][mt][c >> 1], p), sx[c], y);
                                    acc[nt][mt][c] = y;
                                }
                            }
                        }
                    }
                }
            }
        }
        if constexpr (SPLIT == SPLIT_CLUSTER) {
            mtc_fold<NT, KW, CS>(acc, r0, n, col0, out_rows, Y, ldy, Res, ldr, smem);
            continue;
        }
        if constexpr (SPLIT == SPLIT_GLOBAL) {  // this warp's sums, raw: the tile's last block adds them
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        int r = r0 + nt * 8 + 2 * t + (c & 1);
                        int col = col0 + mt * per_tile + gq + 8 * (c >> 1);
                        if (r < n && col < out_rows)
                            part[gw * pstride + (long long)r * out_rows + col] = acc[nt][mt][c];
                    }
            continue;
        }
        // totals: warps in order (warp 0 + warp 1 + ...), norm sums of squares likewise
        if (norm && !xp.h) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                float q = __fadd_rn(ss[nt], __shfl_xor_sync(full, ss[nt], 1));
                ss[nt] = __fadd_rn(q, __shfl_xor_sync(full, q, 2));
                if (t == 0) ssr[warp][nt][gq] = ss[nt];
            }
        }
        if (warp > 0) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) red[warp - 1][(nt * MT + mt) * 4 + c][lane] = acc[nt][mt][c];
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                float inv[2] = {1.0f, 1.0f};
                if (norm) {
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        float q;
                        if (xp.h) {
                            int r = r0 + nt * 8 + 2 * t + i;
                            q = r < n ? xp.ss[r] : 0.0f;
                        } else {
                            q = ssr[0][nt][2 * t + i];
#pragma unroll
                            for (int w = 1; w < KW; ++w) q = __fadd_rn(q, ssr[w][nt][2 * t + i]);
                        }
                        float ms = __fdiv_rn(q, (float)K);
                        inv[i] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    float v[4];
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        float s = acc[nt][mt][c];
#pragma unroll
                        for (int w = 1; w < KW; ++w) s = __fadd_rn(s, red[w - 1][(nt * MT + mt) * 4 + c][lane]);
                        v[c] = norm ? __fmul_rn(s, inv[c & 1]) : s;
                    }
                    int base = col0 + mt * per_tile + gq;
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        int r = r0 + nt * 8 + 2 * t + i;
                        if (r >= n) continue;
                        if (act) {
                            if (base < out_rows) {
                                float y = act_glu(act, v[i], v[2 + i]);
                                if (Res) y = __fadd_rn(Res[(long long)r * ldr + base], y);
                                Y[(long long)r * ldy + base] = y;
                            }
                        } else {
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                int col = base + 8 * h;
                                if (col >= out_rows) continue;
                                float y = v[2 * h + i];
                                if (Res) y = __fadd_rn(Res[(long long)r * ldr + col], y);
                                Y[(long long)r * ldy + col] = y;
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();  // red / ssr are rewritten by the next row pass
    }
    if constexpr (SPLIT == SPLIT_GLOBAL) mts_finish(bid, out_rows, n, Y, ldy, Res, ldr, part, pstride, kwg, MT * per_tile, cnt);
}

#define MT_SMEM(NT, MT, KW) ((KW - 1) * NT * MT * 4 * 32 + KW * NT * 8)

// Rows of a launch split over gridDim.y blocks: block y takes whole passes of
// 8 * NT rows, span rows from y * span. A row's value never depends on which block or pass
// computes it, so the split is a scheduling choice per launch (the backend splits the
// 9-17-row launches of narrow weights, which otherwise run their passes one after another
// on too few blocks). Returns false when this block has no rows.
template <int NT>
__device__ __forceinline__ bool mt_rows(int& n, int& row0) {
    int per = 8 * NT * (int)gridDim.y;
    int span = 8 * NT * ((n + per - 1) / per);
    row0 = (int)blockIdx.y * span;
    if (row0 >= n) return false;
    n = min(span, n - row0);
    return true;
}

#define MT_KERNEL(NAME, QT, NT, MT, KW)                                                         \
    extern "C" __global__ void MT_BOUNDS(KW, NT)                                              \
        mt_##NAME##_n##NT##_m##MT##_w##KW(const u8* W, long long row_bytes, int out_rows, int K, \
                                          const float* X, int ldx, int n, float* Y, int ldy,   \
                                          const float* G, float eps, const float* Res, int ldr, \
                                          int act, int half, const u32* Xh, const float* Xs,   \
                                          const float* Xss) {                                  \
        grid_dependency();                                                                     \
        __shared__ float smem[MT_SMEM(NT, MT, KW)];                                            \
        int row0;                                                                              \
        if (!mt_rows<NT>(n, row0)) return;                                                     \
        mt_body<QT, NT, MT, KW>(blockIdx.x, W, row_bytes, out_rows, K,                         \
                                X + (long long)row0 * ldx, ldx, n, Y + (long long)row0 * ldy,  \
                                ldy, G, eps, Res ? Res + (long long)row0 * ldr : Res, ldr, act, \
                                half, smem, xpre_rows({Xh, Xs, Xss}, row0, K));                \
    }

// Split-K tensor products (weights with long rows, Qwen's 4864- and 8960-input down
// projections): gridDim.z blocks of KW warps share each 16-column tile, so a weight with few
// tiles still fills the chip at one row; the last block of a tile adds the warps' sums in
// order (mts_finish). The bits equal mt_body's with KW = gridDim.z * KW. part: gridDim.z *
// KW planes of n * out_rows floats; cnt: one zeroed int per (x, y) block.
#define MTS_KERNEL(NAME, QT, NT, KW, UN)                                                        \
    extern "C" __global__ void MT_BOUNDS(KW, NT)                                              \
        mts_##NAME##_n##NT##_w##KW##_u##UN(const u8* W, long long row_bytes, int out_rows, int K,      \
                                   const float* X, int ldx, int n, float* Y, int ldy,          \
                                   const float* Res, int ldr, float* part, int* cnt,           \
                                   const u32* Xh, const float* Xs, const float* Xss) {         \
        grid_dependency();                                                                     \
        __shared__ float smem[MT_SMEM(NT, 1, 1)];                                              \
        long long pstride = (long long)n * out_rows;                                           \
        int row0;                                                                              \
        if (!mt_rows<NT>(n, row0)) return;                                                     \
        mt_body<QT, NT, 1, KW, SPLIT_GLOBAL, UN>(blockIdx.x, W, row_bytes, out_rows, K,        \
                                     X + (long long)row0 * ldx, ldx, n,                        \
                                     Y + (long long)row0 * ldy, ldy, nullptr, 0.0f,            \
                                     Res ? Res + (long long)row0 * ldr : Res, ldr, 0, out_rows, \
                                     smem, xpre_rows({Xh, Xs, Xss}, row0, K),                  \
                                     part + (long long)row0 * out_rows, pstride, cnt);         \
    }
// The cluster form (sm_90+): gridDim.z == CS, one cluster per tile; no scratch, no counters.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MTC_KERNEL(NAME, QT, NT, KW, CS)                                                        \
    extern "C" __global__ void __cluster_dims__(1, 1, CS) MT_BOUNDS(KW, NT)                   \
        mtc_##NAME##_n##NT##_w##KW##_s##CS(const u8* W, long long row_bytes, int out_rows,     \
                                           int K, const float* X, int ldx, int n, float* Y,    \
                                           int ldy, const float* Res, int ldr, const u32* Xh,  \
                                           const float* Xs, const float* Xss) {                \
        grid_dependency();                                                                     \
        __shared__ __align__(16) float smem[KW * NT * 8 * 16];                                 \
        int row0;                                                                              \
        if (!mt_rows<NT>(n, row0)) return;                                                     \
        mt_body<QT, NT, 1, KW, SPLIT_CLUSTER, 1, CS>(                                          \
            blockIdx.x, W, row_bytes, out_rows, K, X + (long long)row0 * ldx, ldx, n,          \
            Y + (long long)row0 * ldy, ldy, nullptr, 0.0f, Res ? Res + (long long)row0 * ldr : Res, \
            ldr, 0, out_rows, smem, xpre_rows({Xh, Xs, Xss}, row0, K));                        \
    }
#else
#define MTC_KERNEL(NAME, QT, NT, KW, CS)
#endif
#define MTS_ALL(NAME, QT)                                                                       \
    MTS_KERNEL(NAME, QT, 1, 2, 1) MTS_KERNEL(NAME, QT, 2, 2, 1) MTS_KERNEL(NAME, QT, 4, 2, 1)   \
    MTS_KERNEL(NAME, QT, 1, 4, 1) MTS_KERNEL(NAME, QT, 2, 4, 1) MTS_KERNEL(NAME, QT, 4, 4, 1)   \
    MTS_KERNEL(NAME, QT, 1, 4, 2) MTS_KERNEL(NAME, QT, 2, 4, 2) MTS_KERNEL(NAME, QT, 4, 4, 2)   \
    MTC_KERNEL(NAME, QT, 1, 4, 4) MTC_KERNEL(NAME, QT, 2, 4, 4) MTC_KERNEL(NAME, QT, 4, 4, 4)   \
    MTC_KERNEL(NAME, QT, 1, 4, 8) MTC_KERNEL(NAME, QT, 2, 4, 8) MTC_KERNEL(NAME, QT, 4, 4, 8)   \
    MTS_NT8(NAME, QT)

// Eight 8-row tiles per pass (module suffix "@t8", backend setting tensor_max_row_tiles): a
// 64-row verify or prefill chunk in one pass over the weights instead of two, each unit read
// and unpacked once. A speed choice (rows never share arithmetic: the same bits). Built only
// where the block's reduction array fits the 48 KiB of static shared memory (KW 4 and 8,
// not 16), and only on request, so the default modules compile no more kernels.
#ifndef MT_ROW_TILES8
#define MT_ROW_TILES8 0
#endif
#if MT_ROW_TILES8
#define MT_NT8(NAME, QT)                                                                        \
    MT_KERNEL(NAME, QT, 8, 1, 4) MT_KERNEL(NAME, QT, 8, 2, 4) MT_KERNEL(NAME, QT, 8, 1, 8)
#define MT2_NT8(NA, QA, NB, QB)                                                                 \
    MT2_KERNEL(NA, QA, NB, QB, 8, 1, 4) MT2_KERNEL(NA, QA, NB, QB, 8, 2, 4)                     \
    MT2_KERNEL(NA, QA, NB, QB, 8, 1, 8)
#define MTS_NT8(NAME, QT)                                                                       \
    MTS_KERNEL(NAME, QT, 8, 2, 1) MTS_KERNEL(NAME, QT, 8, 4, 1) MTS_KERNEL(NAME, QT, 8, 4, 2)   \
    MTC_KERNEL(NAME, QT, 8, 4, 4) MTC_KERNEL(NAME, QT, 8, 4, 8)
#else
#define MT_NT8(NAME, QT)
#define MT2_NT8(NA, QA, NB, QB)
#define MTS_NT8(NAME, QT)
#endif

// Two segments of one fused weight in one launch (as MM2_KERNEL): blocks [0, nblk_a) run
// segment a's columns with a's mt_body, the rest segment b's.
#define MT2_KERNEL(NA, QA, NB, QB, NT, MT, KW)                                                  \
    extern "C" __global__ void MT_BOUNDS(KW, NT)                                              \
        mt2_##NA##_##NB##_n##NT##_m##MT##_w##KW(                                                \
            const u8* Wa, long long rba, int rows_a, int nblk_a, const u8* Wb, long long rbb,  \
            int rows_b, int K, const float* X, int ldx, int n, float* Ya, float* Yb, int ldy,  \
            const float* G, float eps, const float* Ra, const float* Rb, int ldr,              \
            const u32* Xh, const float* Xs, const float* Xss) {                                \
        grid_dependency();                                                                     \
        __shared__ float smem[MT_SMEM(NT, MT, KW)];                                            \
        int row0;                                                                              \
        if (!mt_rows<NT>(n, row0)) return;                                                     \
        X += (long long)row0 * ldx;                                                            \
        Ya += (long long)row0 * ldy;                                                           \
        Yb += (long long)row0 * ldy;                                                           \
        if (Ra) Ra += (long long)row0 * ldr;                                                   \
        if (Rb) Rb += (long long)row0 * ldr;                                                   \
        XPre xp = xpre_rows({Xh, Xs, Xss}, row0, K);                                           \
        if ((int)blockIdx.x < nblk_a)                                                          \
            mt_body<QA, NT, MT, KW>(blockIdx.x, Wa, rba, rows_a, K, X, ldx, n, Ya, ldy, G, eps, \
                                    Ra, ldr, 0, rows_a, smem, xp);                             \
        else                                                                                   \
            mt_body<QB, NT, MT, KW>(blockIdx.x - nblk_a, Wb, rbb, rows_b, K, X, ldx, n, Yb, ldy, \
                                    G, eps, Rb, ldr, 0, rows_b, smem, xp);                     \
    }

// KW (warps splitting K) 4 with one or two 16-column tiles per warp; 8 and 16 (narrow
// weights with long rows) with one tile. NT 1, 2, 4 eight-row tiles per pass; with
// MT_ROW_TILES8 also NT 8 (MT_NT8 below).
#define MT_ALL_NT(K_, NAME, QT, NT)                                                             \
    K_(NAME, QT, NT, 1, 4) K_(NAME, QT, NT, 2, 4) K_(NAME, QT, NT, 1, 8) K_(NAME, QT, NT, 1, 16)
#define MT_ALL(NAME, QT)                                                                        \
    MT_ALL_NT(MT_KERNEL, NAME, QT, 1) MT_ALL_NT(MT_KERNEL, NAME, QT, 2)                          \
    MT_ALL_NT(MT_KERNEL, NAME, QT, 4) MT_NT8(NAME, QT)
#define MT2_ALL_NT(NA, QA, NB, QB, NT)                                                          \
    MT2_KERNEL(NA, QA, NB, QB, NT, 1, 4) MT2_KERNEL(NA, QA, NB, QB, NT, 2, 4)                   \
    MT2_KERNEL(NA, QA, NB, QB, NT, 1, 8) MT2_KERNEL(NA, QA, NB, QB, NT, 1, 16)
#define MT2_ALL(NA, QA, NB, QB)                                                                 \
    MT2_ALL_NT(NA, QA, NB, QB, 1) MT2_ALL_NT(NA, QA, NB, QB, 2) MT2_ALL_NT(NA, QA, NB, QB, 4)     \
    MT2_NT8(NA, QA, NB, QB)

// ---- tensor-core products of very wide weights (the output head) ----
// mt_body reads its weights with 2- and 4-byte loads straight from global memory; on a
// 151936-column head that left it slower than the CUDA cores at one row (76.7 vs 59.8 us;
// the head is bandwidth-bound: ~145 MB, ~30 us at the H200's copy rate). Here a block of
// KW warps owns 16-column tiles: the 16 rows of a tile are consecutive in memory
// (16 * row_bytes bytes, 16-byte aligned), so the block stages the whole tile into shared
// memory with 16-byte cp.async copies (coalesced, many bytes in flight) and then runs the
// same mt_body on the staged copy, with MT = 1 and KW warps splitting the tile's units (KW =
// 1: one warp adds its units in order; KW = 2, 4: the warps' sums added in warp order, as
// mt_body always does). ST = 2: the next tile's copy is in flight while this one computes.
// Work items are (tile, row group) pairs: the rsplit argument splits the rows into groups of whole 8 * NT-row passes, each group an item of its own, so a 16-row
// launch can run its two 8-row halves in two blocks side by side (the tile is staged twice,
// the second time from L2: the items of one tile are adjacent). The grid strides over items
// (gridDim.x blocks, each taking every gridDim.x-th item).
// A row's value is mt_body's for KW warps whatever the grid, stage count, NT, row split or
// row count: tiles never share arithmetic and rows never mix (tested); KW is fixed per weight
// by the backend, never by the row count. No gated epilogue (gate and up columns are in
// different tiles): the backend sends gated products elsewhere.
__device__ __forceinline__ void mtw_stage(const u8* src, u32 dst, int bytes, int tid, int nthreads) {
    for (int off = 16 * tid; off < bytes; off += 16 * nthreads) {
        int sz = min(16, bytes - off);  // src-size < 16 zero-fills the rest: no read past the end
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + off),
                     "l"(src + off), "r"(sz)
                     : "memory");
    }
}

__device__ __forceinline__ void mtw_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int PENDING>
__device__ __forceinline__ void mtw_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// Every thread's copies visible to the block (one warp: the warp)
template <int KW>
__device__ __forceinline__ void mtw_sync() {
    if constexpr (KW == 1) __syncwarp(); else __syncthreads();
}

template <int QT, int NT, int ST, int KW>
__device__ __forceinline__ void mtw_body(const u8* __restrict__ W, long long row_bytes,
                                         int out_rows, int K, const float* __restrict__ X, int ldx,
                                         int n, float* __restrict__ Y, int ldy,
                                         const float* __restrict__ G, float eps,
                                         const float* __restrict__ Res, int ldr, int rsplit,
                                         u8* tiles, float* red, XPre xp) {
    int tid = threadIdx.x;
    int ntiles = (out_rows + 15) >> 4;
    int items = ntiles * rsplit;
    int span = 8 * NT * ((n + 8 * NT * rsplit - 1) / (8 * NT * rsplit));  // rows of a group
    long long tb = 16 * row_bytes;  // bytes of one tile (a multiple of 16)
    u32 sbase = (u32)__cvta_generic_to_shared(tiles);
    int item = blockIdx.x, stride = gridDim.x;
    if (item >= items) return;
    auto tile_bytes = [&](int tl) { return (int)(min(16, out_rows - 16 * tl) * row_bytes); };
    mtw_stage(W + (item / rsplit) * tb, sbase, tile_bytes(item / rsplit), tid, 32 * KW);
    mtw_commit();
    for (int it = 0; item < items; ++it, item += stride) {
        int buf = ST == 2 ? (it & 1) : 0;
        int tile = item / rsplit;
        if constexpr (ST == 2) {
            int next = item + stride;
            if (next < items)
                mtw_stage(W + (next / rsplit) * tb, sbase + (u32)((buf ^ 1) * tb), tile_bytes(next / rsplit),
                          tid, 32 * KW);
            mtw_commit();  // possibly empty: the wait below always leaves the newest group
            mtw_wait<1>();
        } else {
            mtw_wait<0>();
        }
        mtw_sync<KW>();  // every thread's copies visible to the whole block
        int c0 = 16 * tile, valid = min(16, out_rows - c0);
        int row0 = (item - tile * rsplit) * span, rows = min(span, n - row0);
        if (rows > 0)  // the same for every warp of the block: mt_body's barriers stay matched
            mt_body<QT, NT, 1, KW>(0, tiles + buf * tb, row_bytes, valid, K, X + (long long)row0 * ldx, ldx,
                                   rows, Y + (long long)row0 * ldy + c0, ldy, G, eps,
                                   Res ? Res + (long long)row0 * ldr + c0 : Res, ldr, 0, valid, red,
                                   xpre_rows(xp, row0, K));
        mtw_sync<KW>();  // the buffer is read by every thread before it is staged again
        if constexpr (ST == 1) {
            int next = item + stride;
            if (next < items) {
                mtw_stage(W + (next / rsplit) * tb, sbase, tile_bytes(next / rsplit), tid, 32 * KW);
                mtw_commit();
            }
        }
    }
}

// Dynamic shared memory: ST * 16 * row_bytes bytes (the backend passes it).
#define MTW_KERNEL(NAME, QT, NT, ST, KW)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * KW)                                       \
        mtw_##NAME##_n##NT##_s##ST##_w##KW(const u8* W, long long row_bytes, int out_rows, int K, \
                                   const float* X, int ldx, int n, float* Y, int ldy,          \
                                   const float* G, float eps, const float* Res, int ldr,       \
                                   int rsplit, const u32* Xh, const float* Xs,                 \
                                   const float* Xss) {                                         \
        grid_dependency();                                                                     \
        extern __shared__ __align__(16) u8 mtw_tiles[];                                        \
        __shared__ float red[MT_SMEM(NT, 1, KW)];                                              \
        mtw_body<QT, NT, ST, KW>(W, row_bytes, out_rows, K, X, ldx, n, Y, ldy, G, eps, Res, ldr, \
                                 rsplit, mtw_tiles, red, {Xh, Xs, Xss});                       \
    }
// Two stages only with one warp (they measured slower: the kernel is bound by its math)
#define MTW_ALL_NT(NAME, QT, NT)                                                                \
    MTW_KERNEL(NAME, QT, NT, 1, 1) MTW_KERNEL(NAME, QT, NT, 2, 1) MTW_KERNEL(NAME, QT, NT, 1, 2) \
    MTW_KERNEL(NAME, QT, NT, 1, 4)
#define MTW_ALL(NAME, QT) MTW_ALL_NT(NAME, QT, 1) MTW_ALL_NT(NAME, QT, 2) MTW_ALL_NT(NAME, QT, 4)

// ---- few-row products of the integer form on the CUDA cores (mtv kernels, "@i1") ----
// At one row mt_body still computes whole 8-row tiles: mma and a float epilogue for eight
// rows to keep one. In the integer form each 32-weight group's dot product D is an exact
// integer, so any order of its multiply-adds gives the same D. Here a thread owns one
// (column, K slot gw) of a product whose family splits K over kwg warps (mt: KW; mts / mtc:
// splits * KW; mtw: KW), takes that slot's units in the family's order (gw, gw + kwg, ...),
// computes each group's D with dp4a over the very code words tc_unit gives mt_body, and then
// runs mt_i8_step's float steps for that (row, column) one after another; the block adds
// the kwg slots in order 0..kwg-1 and applies mt_body's epilogue (norm, gated activation,
// residual). Every row's bits equal the family kernel's, so the backend may choose this
// kernel by row count (one to R rows). x comes prepared by xprep8 (Xh codes, Xs scales, Xss
// the norm's sums of squares or null); the group sums S of x (an mma with A = 1 in mt_body)
// are taken once per block into shared memory, per 16-element half (dynamic: R * K / 16 ints).
// Blocks of 128 threads: 128 / kwg columns each (kwg a power of two, at most 128); a
// two-segment weight's blocks [0, nblk_a) run segment a, the rest segment b.
__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) {  // u8 codes . s8 x codes + c
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ int dp4a_ss(u32 a, u32 b, int c) {  // s8 . s8 + c
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// N 32-bit words from a 2-aligned address p: aligned loads from the 4-byte boundary at or
// before p (one more when p is not 4-aligned), each word a funnel shift of two of them by 0
// or 16 bits. Reads [p & ~3, p + 4N): at most 2 bytes before p, inside any 4-aligned tensor.
template <int N>
__device__ __forceinline__ void ld_words_a2(const u8* p, u32 (&v)[N]) {
    unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const u32* q = reinterpret_cast<const u32*>(a & ~3ull);
    u32 sh = (u32)(a & 2) * 8, r[N + 1];
#pragma unroll
    for (int k = 0; k < N; ++k) r[k] = __ldg(q + k);
    r[N] = sh ? __ldg(q + N) : 0u;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = __funnelshift_r(r[k], r[k + 1], sh);
}

// One unit's code words for all four of mt_body's lanes (w[t] = tc_unit's w for lane t) and
// the group scales. Q4_K, the bulk of a Q4_K_M file: the 32 code bytes in two 16-byte loads
// (a block is 16-aligned; a misaligned row falls back), the scales as tc_unit computes them;
// Q5_K likewise; Q6_K (a Q4_K_M file's head and half its down projections) and Q8_0, whose
// blocks are only 2-aligned, from aligned 32-bit loads.
template <int QT>
__device__ __forceinline__ void mtv_words(const u8* __restrict__ row, int u, u32 (&w)[4][2][2],
                                          float (&s0)[2], float (&s1)[2], float (&mn)[2]) {
    if constexpr (QT == QT_Q6_K) {
        // 210-byte blocks are only 2-aligned: the half's 64 ql and 32 qh bytes as aligned words
        // (17 and 9 loads instead of 48 16-bit ones).
        const u8* blk = row + (long long)(u >> 2) * 210;
        int half = (u >> 1) & 1, q0 = 2 * (u & 1), lshift = 4 * (u & 1);
        u32 l[16], h[8];
        ld_words_a2(blk + 64 * half, l);
        ld_words_a2(blk + 128 + 32 * half, h);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {  // quarter q0 + i: ql bytes 32 i + 4 t and + 16
                int hshift = 2 * (q0 + i);
                w[t][i][0] = q6k_word(l[8 * i + t], h[t], lshift, hshift);
                w[t][i][1] = q6k_word(l[8 * i + 4 + t], h[4 + t], lshift, hshift);
            }
        }
        u32 sb = ld32u(blk + 192 + 8 * half + 2 * q0) ^ 0x80808080u;  // as tc_unit
        float d = ldh(blk + 208);
        q6k_scales(d, sb, 0, s0, s1, mn);
        q6k_scales(d, sb, 1, s0, s1, mn);
    } else if constexpr (QT == QT_Q8_0) {
        // 34-byte blocks: a unit is two, 68 bytes that start 4-aligned wherever the row does
        // (rows of K / 32 blocks, K a multiple of 64), so 17 aligned words hold both scales
        // and all 64 codes: block 0's codes are bytes 2-33 (words shifted by 16 bits), block
        // 1's are bytes 36-67 (words 9-16 as loaded). A row that is not 4-aligned falls back.
        const u8* unit = row + (long long)u * 68;
        if ((reinterpret_cast<unsigned long long>(unit) & 3ull) == 0) {
            const u32* q = reinterpret_cast<const u32*>(unit);
            u32 v[17];
#pragma unroll
            for (int k = 0; k < 17; ++k) v[k] = __ldg(q + k);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                w[t][0][0] = __funnelshift_r(v[t], v[t + 1], 16) ^ 0x80808080u;
                w[t][0][1] = __funnelshift_r(v[4 + t], v[5 + t], 16) ^ 0x80808080u;
                w[t][1][0] = v[9 + t] ^ 0x80808080u;
                w[t][1][1] = v[13 + t] ^ 0x80808080u;
            }
            s0[0] = s1[0] = h2f((u16)(v[0] & 0xffffu));
            s0[1] = s1[1] = h2f((u16)(v[8] >> 16));
            mn[0] = mn[1] = 0.0f;
            return;
        }
        // each block's 32 code bytes as aligned words
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u8* blk = row + (long long)(2 * u + i) * 34;
            u32 c[8];
            ld_words_a2(blk + 2, c);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                w[t][i][0] = c[t] ^ 0x80808080u;  // signed codes + 128, as tc_unit
                w[t][i][1] = c[4 + t] ^ 0x80808080u;
            }
            s0[i] = s1[i] = ldh(blk);
            mn[i] = 0.0f;
        }
    } else if constexpr (QT == QT_Q5_K) {
        // 176-byte blocks, 16-aligned: sub-block pair j's 32 code bytes and the 32 high-bit
        // bytes in four 16-byte loads
        const u8* blk = row + (long long)(u >> 2) * 176;
        int j = u & 3;
        uint4 a = *reinterpret_cast<const uint4*>(blk + 48 + 32 * j);
        uint4 b = *reinterpret_cast<const uint4*>(blk + 64 + 32 * j);
        uint4 c = *reinterpret_cast<const uint4*>(blk + 16);
        uint4 e = *reinterpret_cast<const uint4*>(blk + 32);
        u32 v0[4] = {a.x, a.y, a.z, a.w}, v1[4] = {b.x, b.y, b.z, b.w};
        u32 h0[4] = {c.x, c.y, c.z, c.w}, h1[4] = {e.x, e.y, e.z, e.w};
#pragma unroll
        for (int t = 0; t < 4; ++t) q5k_words(v0[t], v1[t], h0[t], h1[t], j, w[t]);
        q4k_unit_scales(blk, *reinterpret_cast<const u32*>(blk), j, s0, s1, mn);
    } else {
        if constexpr (QT == QT_Q4_K) {
            const u8* blk = row + (long long)(u >> 2) * 144;
            if ((reinterpret_cast<unsigned long long>(blk) & 15ull) == 0) {
                int j = u & 3;
                uint4 a = *reinterpret_cast<const uint4*>(blk + 16 + 32 * j);
                uint4 b = *reinterpret_cast<const uint4*>(blk + 32 + 32 * j);
                u32 v0[4] = {a.x, a.y, a.z, a.w}, v1[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int t = 0; t < 4; ++t) q4k_words(v0[t], v1[t], w[t]);
                q4k_unit_scales(blk, *reinterpret_cast<const u32*>(blk), j, s0, s1, mn);
                return;
            }
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) {  // lane t's words of mt_body; a group's scales are every lane's
            float a0[2], a1[2], am[2];
            tc_unit<QT>(row, u, t, w[t], a0, a1, am);
            if (t == 0) {
                s0[0] = a0[0]; s0[1] = a0[1]; s1[0] = a1[0]; s1[1] = a1[1]; mn[0] = am[0]; mn[1] = am[1];
            }
        }
    }
}

// One unit u of one column (wrow) for rows 0..n-1 (n <= R): mt_i8_step's steps per group.
template <int QT, int R>
__device__ __forceinline__ void mtv_unit(const u8* __restrict__ wrow, int u, int nunits, int n,
                                         const u32* __restrict__ Xh, const float* __restrict__ Xs,
                                         const int* S, int nh, float (&acc)[R]) {
    using T = TcTraits<QT>;
    using C = I8Codes<QT>;
    constexpr bool sums = C::sums;
    u32 w[4][2][2];
    float s0[2], s1[2], mn[2];
    mtv_words<QT>(wrow, u, w, s0, s1, mn);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= n) break;
        long long at = (long long)r * nunits + u;
        const uint4* bp = reinterpret_cast<const uint4*>(Xh + at * 16);
        uint4 b[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) b[t] = __ldg(bp + t);  // lane t's b8[0][0], [0][1], [1][0], [1][1]
        float2 xd = __ldg(reinterpret_cast<const float2*>(Xs + at * 2));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int d0 = 0, d1 = 0;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                if constexpr (C::sgn) {
                    d0 = dp4a_ss(w[t][i][0] ^ C::flip, i ? b[t].z : b[t].x, d0);
                    d1 = dp4a_ss(w[t][i][1] ^ C::flip, i ? b[t].w : b[t].y, d1);
                } else {
                    d0 = dp4a_us(w[t][i][0], i ? b[t].z : b[t].x, d0);
                    d1 = dp4a_us(w[t][i][1], i ? b[t].w : b[t].y, d1);
                }
            }
            const int* sh = S + r * nh + 4 * u + 2 * i;
            int sx0 = sums ? sh[0] : 0, sx1 = sums ? sh[1] : 0;
            float p = i ? xd.y : xd.x;
            if constexpr (T::split) {
                int e0 = d0 - C::off * sx0, e1 = d1 - C::off * sx1;
                float y = fmaf(__fmul_rn(s0[i], p), __int2float_rn(e0), acc[r]);
                acc[r] = fmaf(__fmul_rn(s1[i], p), __int2float_rn(e1), y);
            } else {
                int sx = sx0 + sx1;
                float y = fmaf(__fmul_rn(s0[i], p), __int2float_rn(d0 + d1 - C::off * sx), acc[r]);
                if constexpr (T::has_min) y = fmaf(__fmul_rn(mn[i], p), __int2float_rn(sx), y);
                acc[r] = y;
            }
        }
    }
}

template <int QT, int R>
__device__ __forceinline__ void mtv_body(int bid, const u8* __restrict__ W, long long row_bytes,
                                         int cols, int K, int kwg, int n,
                                         const u32* __restrict__ Xh, const float* __restrict__ Xs,
                                         const float* __restrict__ Xss, float eps,
                                         float* __restrict__ Y, int ldy,
                                         const float* __restrict__ Res, int ldr, int act, int half,
                                         int* S, float* red) {
    int nunits = K >> 6, nh = 4 * nunits, tid = threadIdx.x;
    // S: each (row, 16-element half) sum of x codes, exact (as mt_body's mma with A = 1)
    for (int e = tid; I8Codes<QT>::sums && e < n * nh; e += blockDim.x) {
        int r = e / nh, h = e - r * nh;
        const u32* words = Xh + ((long long)r * nunits + (h >> 2)) * 16 + (h & 3);
        int s = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) s = dp4a_ss(__ldg(words + 4 * t), 0x01010101u, s);
        S[e] = s;
    }
    __syncthreads();
    int cpb = (int)blockDim.x / kwg, cl = tid / kwg, gw = tid - cl * kwg;
    int col = bid * cpb + cl;
    float acc[2][R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = 0.0f;
    if (col < cols) {
        const u8* w0 = W + (long long)col * row_bytes;
        const u8* w1 = W + (long long)(half + col) * row_bytes;  // act: the up column
#pragma unroll 2
        for (int u = gw; u < nunits; u += kwg) {
            mtv_unit<QT, R>(w0, u, nunits, n, Xh, Xs, S, nh, acc[0]);
            if (act) mtv_unit<QT, R>(w1, u, nunits, n, Xh, Xs, S, nh, acc[1]);
        }
    }
    // red[(cl * kwg + gw) * R + r][2]: every slot's sums, then added in slot order
#pragma unroll
    for (int r = 0; r < R; ++r) {
        red[(tid * R + r) * 2] = acc[0][r];
        red[(tid * R + r) * 2 + 1] = acc[1][r];
    }
    __syncthreads();
    for (int e = tid; e < cpb * n; e += blockDim.x) {
        int c = e / n, r = e - c * n;
        int oc = bid * cpb + c;
        if (oc >= cols) continue;
        float v[2];
#pragma unroll
        for (int a = 0; a < 2; ++a) {
            const float* p = red + ((c * kwg) * R + r) * 2 + a;
            float s = p[0];
            for (int g = 1; g < kwg; ++g) s = __fadd_rn(s, p[g * R * 2]);
            v[a] = s;
        }
        if (Xss) {
            float ms = __fdiv_rn(Xss[r], (float)K);
            float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
            v[0] = __fmul_rn(v[0], inv);
            v[1] = __fmul_rn(v[1], inv);
        }
        float y = act ? act_glu(act, v[0], v[1]) : v[0];
        if (Res) y = __fadd_rn(Res[(long long)r * ldr + oc], y);
        Y[(long long)r * ldy + oc] = y;
    }
}

#define MTV_KERNEL(NAME, QA, QB, R)                                                             \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        mtv_##NAME##_r##R(const u8* Wa, long long rba, int cols_a, int nblk_a, const u8* Wb,    \
                          long long rbb, int cols_b, int K, int kwg, int n, const u32* Xh,      \
                          const float* Xs, const float* Xss, float eps, float* Ya, float* Yb,   \
                          int ldy, const float* Ra, const float* Rb, int ldr, int act, int half) { \
        grid_dependency();                                                                      \
        extern __shared__ int mtv_sums[];                                                       \
        __shared__ float red[128 * R * 2];                                                      \
        if ((int)blockIdx.x < nblk_a)                                                           \
            mtv_body<QA, R>(blockIdx.x, Wa, rba, cols_a, K, kwg, n, Xh, Xs, Xss, eps, Ya, ldy,  \
                            Ra, ldr, act, half, mtv_sums, red);                                 \
        else                                                                                    \
            mtv_body<QB, R>(blockIdx.x - nblk_a, Wb, rbb, cols_b, K, kwg, n, Xh, Xs, Xss, eps,  \
                            Yb, ldy, Rb, ldr, 0, 0, mtv_sums, red);                             \
    }
// One type (mtv_<q>_r<R>) or a pair (mtv_<a>_<b>_r<R>): up to 1, 2 or 4 rows.
#define MTV_ALL(NAME, QT) MTV_KERNEL(NAME, QT, QT, 1) MTV_KERNEL(NAME, QT, QT, 2) MTV_KERNEL(NAME, QT, QT, 4)
#define MTV2_ALL(NA, QA, NB, QB)                                                                \
    MTV_KERNEL(NA##_##NB, QA, QB, 1) MTV_KERNEL(NA##_##NB, QA, QB, 2) MTV_KERNEL(NA##_##NB, QA, QB, 4)

// ---- many-row products of the integer form (mtb kernels, "@i1") ----
// A verify of 17-64 rows on mt_body runs up to two passes over the weights, each warp reading
// its weight codes and every row's x words from global memory on its own (64 rows cost 5.3x one
// row on a 7B). Here a block stages each step's weights and x in shared memory once, with
// 16-byte cp.async copies three steps ahead, and its warps compute from there: a block owns 32
// weight rows (two 16-row A tiles, as mt_body's MT 2) for 16 * NT rows of x (a pass) and SL
// consecutive K slots of the weight's family (mt: KW; mts / mtc: splits * KW; mtw: KW; kwg in
// all); warp w runs slot gw = z * SL + w % SL for rows (w / SL) * 8 * NT onwards. A step
// stages units c * kwg + z * SL .. + SL - 1, one for each slot, so each slot still takes its
// units gw, gw + kwg, ... in order, each through mt_i8_step, the family's very float steps.
// The slots' sums are added in order 0..kwg-1: in the block (z == 1) or, with gridDim.z = kwg /
// SL blocks a tile, through scratch planes and the tile's last block (as mts_finish). Then the
// family's epilogue (norm from xprep8's sums of squares, gated activation, residual). Every
// row's bits equal the family kernel's for any row count: the backend may choose this kernel by
// row count (tensor_batch_min_rows). x comes from xprep8 (required).
// Weight rows are staged as the 16-aligned span around a step's bytes (the type's QK weights in
// blocks of bsz bytes; SL units of a step never straddle a 256-weight block), tc_unit reading
// the staged copy at its own offsets; rows of x past n are not staged (computed, never stored).
// Shared memory per stage: 32 WB * wspan (weights) + 16 NT * XS (codes) + 16 NT * 8 SL (scales).
// WB 2 (kernels mtbw_, modules "@w1", MTB_WIDE): a block owns 64 weight rows with twice the
// warps (warp w also takes block rows 32 * (w / (2 SL)) onwards), so each staged step of x
// serves twice the weight rows: x's share of the bytes a step stages falls from about two
// thirds to one half. Rows never share arithmetic, so the bits are WB 1's.
template <int SL>
struct MtbGeom {
    // x codes: a row's SL units (64 bytes each) padded so that the 8 rows an mma reads start 4
    // banks apart modulo 8 (16-byte loads of a quarter warp: no conflicts)
    static constexpr int XS = SL == 4 ? 320 : SL == 2 ? 192 : 64;
    static constexpr int ST = 3;  // stages in flight
};

__device__ __forceinline__ void cp_async8(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}

// The epilogue of output (row r, block output o) from the slots' raw sums get(g, j), j the
// block's weight row (A-tile order: mt * 16 + h * 8 + g, mt < 2 WB): slots added in order, then the norm,
// the gated activation (gate j = mt * 16 + g, up j + 8), the residual: mt_body's order.
template <typename Get>
__device__ __forceinline__ float mtb_value(Get get, int kwg, int r, int o, int act, int K,
                                           const float* __restrict__ Xss, float eps) {
    int ja = act ? (o >> 3) * 16 + (o & 7) : o;
    float v[2];
#pragma unroll
    for (int a = 0; a < 2; ++a) {
        if (a == 1 && !act) break;
        int j = ja + 8 * a;
        float s = get(0, j);
        for (int g = 1; g < kwg; ++g) s = __fadd_rn(s, get(g, j));
        v[a] = s;
    }
    if (Xss) {
        float ms = __fdiv_rn(Xss[r], (float)K);
        float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
        v[0] = __fmul_rn(v[0], inv);
        if (act) v[1] = __fmul_rn(v[1], inv);
    }
    return act ? act_glu(act, v[0], v[1]) : v[0];
}

template <int QT, int SL, int NT, int WB>
__device__ __forceinline__ void mtb_body(int bid, const u8* __restrict__ W, long long row_bytes,
                                         int out_rows, int K, int n, float* __restrict__ Y, int ldy,
                                         float eps, const float* __restrict__ Res, int ldr, int act,
                                         int half, int bsz, int wspan, XPre xp,
                                         float* __restrict__ part, int* __restrict__ cnt, u8* smem) {
    using G = MtbGeom<SL>;
    constexpr int RP = 16 * NT;  // rows of a pass
    constexpr int WR = 32 * WB;  // weight rows of a block
    constexpr int XS = G::XS, ST = G::ST;
    const int nthreads = 64 * SL * WB, tid = threadIdx.x;
    int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, t = lane & 3;
    // WB 1: wb is 0 at compile time (the kernel as it was, register for register)
    int slot = warp % SL, rh = WB == 1 ? warp / SL : (warp / SL) & 1, wb = WB == 1 ? 0 : warp / (2 * SL);
    int Z = (int)gridDim.z, kwg = Z * SL, gw0 = (int)blockIdx.z * SL, gw = gw0 + slot;
    int per_tile = act ? 8 : 16;
    int col0 = bid * 2 * WB * per_tile;
    int nunits = K >> 6;
    int nchunks = nunits > gw0 ? (nunits - gw0 + kwg - 1) / kwg : 0;
    int stage_bytes = WR * wspan + RP * XS + RP * SL * 8;
    u32 sbase = (u32)__cvta_generic_to_shared(smem);
    int nout = (act ? 16 : 32) * WB;
    int pcols = (int)gridDim.x * WR;  // a scratch plane's columns (block weight rows)
    long long pstride = (long long)n * pcols;
    constexpr int QK = (QT == QT_Q4_K || QT == QT_Q5_K || QT == QT_Q6_K || QT == QT_IQ4_XS) ? 256 : 32;
    auto wrow_of = [&](int j) {  // the weight row of the block's row j (A-tile order)
        int mt = j >> 4, h = (j >> 3) & 1, g = j & 7;
        int base = col0 + mt * per_tile + g;
        int lo = min(base, out_rows - 1);  // past the end: a valid row, never stored
        return h == 0 ? lo : act ? half + lo : min(base + 8, out_rows - 1);
    };
    // Copies are assigned once, no division in the loop: weights, 2 SL threads a row (row
    // tid / (2 SL), pieces tid % (2 SL) + 2 SL k); x codes, TX threads a row of the pass (pieces
    // tid % TX + TX k of the row's 4 SL, k < KX); scales, one (row, unit) a thread while any
    // are left.
    constexpr int TW = 2 * SL, TX = 4 * SL * WB / NT, KX = NT / WB;
    const u8* wsrc = W + (long long)wrow_of(tid / TW) * row_bytes;
    u32 wdst = (u32)((tid / TW) * wspan);
    int xr = tid / TX, xq = tid % TX;
    int sr = tid / SL, sq = tid % SL;
    // the four rows this lane reads (block rows 32 wb + ...): each one's offset modulo 16 (the
    // staged copy keeps it)
    int rmis[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            rmis[mt][h] = (int)((unsigned long long)(W + (long long)wrow_of(32 * wb + mt * 16 + h * 8 + gq) * row_bytes) & 15ull);
    auto stage = [&](int c, int r0, int buf) {
        int u0 = c * kwg + gw0, u1 = min(u0 + SL, nunits);
        long long b0 = (long long)(64 * u0 / QK) * bsz, b1 = (long long)((64 * u1 + QK - 1) / QK) * bsz;
        u32 sw = sbase + (u32)(buf * stage_bytes);
        {  // weights: the 16-aligned span around [b0, b1) of each of the WR rows
            unsigned long long a0 = (unsigned long long)(wsrc + b0) & ~15ull;
            unsigned long long end = (unsigned long long)(wsrc + b1);
            for (int q = tid % TW; 16 * q < wspan; q += TW) {
                unsigned long long src = a0 + 16ull * (unsigned long long)q;
                if (src >= end) break;
                int sz = (int)min(16ull, end - src);  // zero-fills past the step's bytes
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sw + wdst + (u32)(16 * q)),
                             "l"(src), "r"(sz)
                             : "memory");
            }
        }
        // x codes (16-aligned: a unit is 64 bytes) and scales (8 bytes a unit); rows past n
        // are not staged
        u32 sx = sw + (u32)(WR * wspan), ss = sx + (u32)(RP * XS);
        int nq = 4 * (u1 - u0);
        if (r0 + xr < n) {
            const u32* src = xp.h + ((long long)(r0 + xr) * nunits + u0) * 16;
#pragma unroll
            for (int k = 0; k < KX; ++k) {
                int q = xq + TX * k;
                if (q < nq)
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sx + (u32)(xr * XS + 16 * q)),
                                 "l"(src + 4 * q)
                                 : "memory");
            }
        }
        if (sr < RP && r0 + sr < n && sq < u1 - u0)
            cp_async8(ss + (u32)((sr * SL + sq) * 8), xp.s + ((long long)(r0 + sr) * nunits + u0 + sq) * 2);
    };
    for (int r0 = 0; r0 < n; r0 += RP) {
        float acc[NT][2][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[nt][mt][c] = 0.0f;
#pragma unroll
        for (int s = 0; s < ST - 1; ++s) {
            if (s < nchunks) stage(s, r0, s);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        for (int c = 0; c < nchunks; ++c) {
            if (c + ST - 1 < nchunks) stage(c + ST - 1, r0, (c + ST - 1) % ST);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 1) : "memory");
            __syncthreads();
            int u = c * kwg + gw;
            if (u < nunits) {
                const u8* sb = smem + (c % ST) * stage_bytes;
                long long b0 = (long long)(64 * (c * kwg + gw0) / QK) * bsz;
                u32 a[2][2][2][4];
                float s0[2][2][2], s1[2][2][2], mn[2][2][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        int j = 32 * wb + mt * 16 + h * 8 + gq;
                        int mis = (int)((rmis[mt][h] + b0) & 15);
                        // the staged row as tc_unit addresses it: byte b0 of the row at offset mis
                        const u8* vrow = sb + j * wspan + mis - b0;
                        u32 w[2][2];
                        float ts0[2], ts1[2], tmn[2];
                        tc_unit<QT>(vrow, u, t, w, ts0, ts1, tmn);
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            s0[i][mt][h] = ts0[i];
                            s1[i][mt][h] = ts1[i];
                            mn[i][mt][h] = tmn[i];
#pragma unroll
                            for (int jj = 0; jj < 2; ++jj) a[i][jj][mt][h] = w[i][jj];
                        }
                    }
                const u8* sx = sb + WR * wspan;
                const float* sc = reinterpret_cast<const float*>(sx + RP * XS);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    int lr = rh * 8 * NT + nt * 8 + gq;
                    uint4 bb = *reinterpret_cast<const uint4*>(sx + lr * XS + slot * 64 + 16 * t);
                    u32 b8[2][2] = {{bb.x, bb.y}, {bb.z, bb.w}};
                    float2 xs2 = *reinterpret_cast<const float2*>(sc + (lr * SL + slot) * 2);
                    float xd[2] = {xs2.x, xs2.y};
                    mt_i8_step<QT, 2>(a, s0, s1, mn, b8, xd, t, acc[nt]);
                }
            }
            __syncthreads();  // this buffer is read by every warp before it is staged again
        }
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        // each slot's raw sums: to its scratch plane (Z > 1: the tile's last block adds them), else
        // to red[slot][row of the pass][j], then every output in slot order
        float* red = reinterpret_cast<float*>(smem);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    int lr = rh * 8 * NT + nt * 8 + 2 * t + (c & 1), j = 32 * wb + mt * 16 + gq + 8 * (c >> 1);
                    if (Z == 1)
                        red[(slot * RP + lr) * WR + j] = acc[nt][mt][c];
                    else if (r0 + lr < n)
                        part[gw * pstride + (long long)(r0 + lr) * pcols + bid * WR + j] = acc[nt][mt][c];
                }
        if (Z > 1) continue;
        __syncthreads();
        int rows = min(RP, n - r0);
        for (int e = tid; e < rows * nout; e += nthreads) {
            int lr = e / nout, o = e - lr * nout;
            int col = col0 + (act ? (o >> 3) * 8 + (o & 7) : o);
            if (col >= out_rows) continue;
            int r = r0 + lr;
            auto get = [&](int g, int j) { return red[(g * RP + lr) * WR + j]; };
            float y = mtb_value(get, SL, r, o, act, K, xp.ss, eps);
            if (Res) y = __fadd_rn(Res[(long long)r * ldr + col], y);
            Y[(long long)r * ldy + col] = y;
        }
        __syncthreads();  // red is staging memory again in the next pass
    }
    if (Z == 1) return;
    __shared__ int last;
    __threadfence();  // this block's sums visible to the chip before it counts itself in
    __syncthreads();
    if (tid == 0) {
        int* cp = cnt + blockIdx.x;
        int done = atomicAdd(cp, 1) == Z - 1;
        if (done) *cp = 0;  // every other block of the tile has counted itself already
        last = done;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int e = tid; e < n * nout; e += nthreads) {
        int r = e / nout, o = e - r * nout;
        int col = col0 + (act ? (o >> 3) * 8 + (o & 7) : o);
        if (col >= out_rows) continue;
        const float* p = part + (long long)r * pcols + bid * WR;
        auto get = [&](int g, int j) { return __ldcg(p + g * pstride + j); };  // L2, not a stale L1 line
        float y = mtb_value(get, kwg, r, o, act, K, xp.ss, eps);
        if (Res) y = __fadd_rn(Res[(long long)r * ldr + col], y);
        Y[(long long)r * ldy + col] = y;
    }
}

// Dynamic shared memory: 3 stages (the backend passes it and opts in past 48 KiB).
#define MTB_KERNEL(PRE, NAME, QT, SL, NT, WB)                                                   \
    extern "C" __global__ void __launch_bounds__(64 * SL * WB, 8 / (SL * WB))                 \
        PRE##_##NAME##_s##SL##_n##NT(const u8* W, long long row_bytes, int out_rows, int K, int n, \
                                     float* Y, int ldy, float eps, const float* Res, int ldr,    \
                                     int act, int half, int bsz, int wspan, const u32* Xh,       \
                                     const float* Xs, const float* Xss, float* part, int* cnt) { \
        grid_dependency();                                                                      \
        extern __shared__ __align__(16) u8 mtb_stages[];                                        \
        mtb_body<QT, SL, NT, WB>(blockIdx.x, W, row_bytes, out_rows, K, n, Y, ldy, eps, Res,    \
                                 ldr, act, half, bsz, wspan, {Xh, Xs, Xss}, part, cnt, mtb_stages); \
    }
// SL 1, 2 or 4 K slots a block (families of kwg 1, 2, or a multiple of 4); 32 or 64 rows a
// pass; 32 weight rows a block (mtb_), or with MTB_WIDE (modules "@w1") 64 (mtbw_) instead:
// the backend takes every integer-form kernel from that module then, so it is built once
#define MTB_SET(PRE, NAME, QT, WB)                                                              \
    MTB_KERNEL(PRE, NAME, QT, 1, 2, WB) MTB_KERNEL(PRE, NAME, QT, 1, 4, WB)                     \
    MTB_KERNEL(PRE, NAME, QT, 2, 2, WB) MTB_KERNEL(PRE, NAME, QT, 2, 4, WB)                     \
    MTB_KERNEL(PRE, NAME, QT, 4, 2, WB) MTB_KERNEL(PRE, NAME, QT, 4, 4, WB)
#ifndef MTB_WIDE
#define MTB_WIDE 0
#endif
#if MTB_WIDE
#define MTB_ALL(NAME, QT) MTB_SET(mtbw, NAME, QT, 2)
#else
#define MTB_ALL(NAME, QT) MTB_SET(mtb, NAME, QT, 1)
#endif

// out[i, :] = dequant(table[ids[i], :]); grid (ceil(K/8/128), n).
template <int QT>
__device__ __forceinline__ void embed_body(const u8* table, long long row_bytes, int K, const int* ids,
                                           float* out) {
    int i = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (K >> 3)) return;
    float w[8];
    dq8<QT>(table + (long long)ids[i] * row_bytes, c, w);
    float4* o = reinterpret_cast<float4*>(out + (long long)i * K) + 2 * c;
    o[0] = make_float4(w[0], w[1], w[2], w[3]);
    o[1] = make_float4(w[4], w[5], w[6], w[7]);
}

#define EMBED_KERNEL(NAME, QT)                                                                   \
    extern "C" __global__ void embed_##NAME(const u8* table, long long row_bytes, int K,         \
                                            const int* ids, float* out) {                         \
        grid_dependency();                                                                        \
        embed_body<QT>(table, row_bytes, K, ids, out);                                          \
    }


#ifdef ECHOLINE_COMMON
// Kernels that do not depend on a quant type: built once, in the common module.

// RMSNorm of each row (row stride ldx), times weight; one block of 256 threads per row.
extern "C" __global__ void rms_norm(const float* X, int ldx, const float* weight, int d, float eps,
                                    float* out) {
    grid_dependency();
    __shared__ float red[256];
    const float* x = X + (long long)blockIdx.x * ldx;
    float s = 0.0f;
    for (int k = threadIdx.x; k < d; k += 256) s = fmaf(x[k], x[k], s);
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] = __fadd_rn(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    float ms = __fdiv_rn(red[0], (float)d);
    float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
    float* y = out + (long long)blockIdx.x * d;
    for (int k = threadIdx.x; k < d; k += 256) y[k] = __fmul_rn(__fmul_rn(x[k], inv), weight[k]);
}

// One RoPE pair (k, k + hd/2 for neox, else 2k, 2k+1) of one head vector; angles in
// double, like ggml. Shared by rope and rope_store so both rotate alike, bit for bit.
__device__ __forceinline__ void rope_pair(const float* x, float* y, int k, int hd, int p,
                                          double base, int neox) {
    int half = hd >> 1;
    double ang = (double)p * pow(base, -2.0 * (double)k / (double)hd);
    float c = (float)cos(ang), s = (float)sin(ang);
    int ia = neox ? k : 2 * k;
    int ib = neox ? k + half : 2 * k + 1;
    float a = x[ia], b = x[ib];
    y[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    y[ib] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// RoPE on x (n, H, hd) with row stride ldx; out contiguous.
extern "C" __global__ void rope(const float* X, int ldx, const int* pos, int n, int H, int hd,
                                double base, int neox, float* out) {
    grid_dependency();
    int half = hd >> 1;
    long long total = (long long)n * H * half;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t % half);
        long long rh = t / half;
        int h = (int)(rh % H);
        int i = (int)(rh / H);
        rope_pair(X + (long long)i * ldx + (long long)h * hd, out + ((long long)i * H + h) * hd, k, hd,
                  pos[i], base, neox);
    }
}

// The attention prologue of one layer in one launch: q rotated into qout (n, H, hd);
// k rotated straight into kc[pos[i]] and v copied into vc[pos[i]] (linear caches).
// Same arithmetic as rope + write_cache, so both paths agree bit for bit.
extern "C" __global__ void rope_store(const float* Qx, int ldq, const float* Kx, int ldk,
                                      const float* Vx, int ldv, const int* pos, int n, int H,
                                      int KVH, int hd, double base, int neox, float* qout,
                                      float* kc, float* vc) {
    grid_dependency();
    int half = hd >> 1;
    long long nq = (long long)n * H * half, nk = (long long)n * KVH * half;
    long long vw = (long long)KVH * hd;
    long long total = nq + nk + n * vw;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        if (t < nq) {
            int k = (int)(t % half);
            long long rh = t / half;
            int h = (int)(rh % H), i = (int)(rh / H);
            rope_pair(Qx + (long long)i * ldq + (long long)h * hd, qout + ((long long)i * H + h) * hd,
                      k, hd, pos[i], base, neox);
        } else if (t < nq + nk) {
            long long u = t - nq;
            int k = (int)(u % half);
            long long rh = u / half;
            int h = (int)(rh % KVH), i = (int)(rh / KVH);
            rope_pair(Kx + (long long)i * ldk + (long long)h * hd,
                      kc + ((long long)pos[i] * KVH + h) * hd, k, hd, pos[i], base, neox);
        } else {
            long long u = t - nq - nk;
            int i = (int)(u / vw);
            long long r = u - i * vw;
            vc[(long long)pos[i] * vw + r] = Vx[(long long)i * ldv + r];
        }
    }
}

// out = act(gate) * up for the gated FFN when the product could not fuse it (gate and
// up in different quant types); same arithmetic as the fused epilogue.
extern "C" __global__ void glu_act(const float* Gt, int ldg, const float* U, int ldu, int n,
                                   int width, int act, float* out) {
    grid_dependency();
    long long total = (long long)n * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        int i = (int)(t / width), k = (int)(t % width);
        out[t] = act_glu(act, Gt[(long long)i * ldg + k], U[(long long)i * ldu + k]);
    }
}

// a[t] <-> b[t] for t < n, in place: two sessions' cache buffers trade contents so the
// graphs captured on one set of buffers serve whichever session runs (engine/kvcache.py
// exchange_buffers); one launch per buffer instead of a copy and two assignments.
extern "C" __global__ void swap_values(float* a, float* b, long long n) {
    grid_dependency();
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n;
         t += (long long)gridDim.x * blockDim.x) {
        float x = a[t];
        a[t] = b[t];
        b[t] = x;
    }
}

// cache[dst_i] = rows[i] with dst_i = dst ? dst[i] : start + i; rows have row stride ldr.
extern "C" __global__ void write_cache(float* cache, const float* rows, int ldr, int n, int width,
                                       const int* dst, int start) {
    grid_dependency();
    long long total = (long long)n * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        int i = (int)(t / width), k = (int)(t % width);
        int r = dst ? dst[i] : start + i;
        cache[(long long)r * width + k] = rows[(long long)i * ldr + k];
    }
}

// Attention, pass 1: block (item chunk z, kv head g, split s) stages keys [s*S, s*S+S)
// of head g in shared memory, with the q vectors of its items (row, head-in-group)
// z*8 .. z*8+7; warp w takes item z*8+w and writes that split's unnormalized output,
// max and sum. S (keys per split) is fixed per backend. A row's arithmetic does not
// depend on which block or warp computes it: the same for every row count.
// Shared: K tile S x (hd+1) (padded: lanes read different keys), V tile S x hd, q per_block x hd.
// DPL = hd / 32 dims per lane, a compile-time constant (no predicated-off work).
// A block stages one split's K/V for up to `per_block` (row, head) items of one GQA group
// (chosen by the backend). Its 8 warps take IPW consecutive items at a time (warp w items
// w * IPW .. + IPW - 1, then 8 * IPW further on): a lane reads each K and V element from
// shared memory once for all IPW items, which is what bounds a many-row launch (every item
// re-read the split's K and V: ~144 shared loads per item at hd 64). Each item's arithmetic
// is the same sequence whichever block, warp or IPW runs it, so per_block and IPW change no
// bits: keys outside an item's range take no multiply-add at all (as with IPW = 1), so a
// non-finite V there is never seen.
// items one attention block may take (the backend keeps per_block within it)
#define ATTN_MAX_ITEMS 256
template <int DPL, int IPW, int KPL>
__device__ __forceinline__ void attn_partial_body(const float* Q, int ldq, const float* Kc,
                                                  const float* Vc, const int* pos, int n, int H,
                                                  int KVH, int S, int window, float scale,
                                                  int nsplit, float* Opart, float* Mpart,
                                                  float* Lpart, int per_block) {
    constexpr int hd = DPL * 32;
    extern __shared__ float smem[];
    // grid (item chunks, kv heads, splits): the splits vary slowest, so the blocks of the
    // splits past every position (see below) are dispatched last, in the tail of the real
    // work, and a split's chunks, which stage the same keys, run side by side
    int s = blockIdx.z, g = blockIdx.y;
    int group = H / KVH;
    int item0 = blockIdx.x * per_block;
    int items = min(per_block, n * group - item0);
    int j0 = s * S;
    // the items' positions, loaded in parallel (a thread each) rather than one after another
    // by every thread; a block whose split starts past all of them leaves at the barrier.
    // A graph's grid covers the cache's capacity, so at a context just past a power of two
    // half its blocks are such (H200, 2026-12-03: 3.6 us of a 16-row launch at context 1,024 with
    // a 2,048-row cache when each thread loaded every position itself).
    __shared__ int ps[ATTN_MAX_ITEMS];
    bool reach = false;
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        int p = pos[(item0 + it) / group];
        ps[it] = p;
        reach = reach || p >= j0;
    }
    if (!__syncthreads_or(reach)) return;
    int pmax = -1;
    for (int it = 0; it < items; ++it) pmax = max(pmax, ps[it]);
    int jn = min(S, pmax + 1 - j0);
    float* Ks = smem;
    float* Vs = smem + S * (hd + 1);
    float* Qs = Vs + S * hd;
    constexpr int hd4 = hd / 4;
    for (int t = threadIdx.x; t < items * hd4; t += blockDim.x) {
        int it = t / hd4, d = (t - it * hd4) << 2;
        int item = item0 + it;
        int i = item / group, h = g * group + item % group;
        *reinterpret_cast<float4*>(Qs + it * hd + d) =
            *reinterpret_cast<const float4*>(Q + (long long)i * ldq + (long long)h * hd + d);
    }
#pragma unroll 4
    for (int t = threadIdx.x; t < jn * hd4; t += blockDim.x) {
        int jj = t / hd4, d = (t - jj * hd4) << 2;
        long long src = ((long long)(j0 + jj) * KVH + g) * hd + d;
        float4 kv = *reinterpret_cast<const float4*>(Kc + src);
        float4 vv = *reinterpret_cast<const float4*>(Vc + src);
        float* kd = Ks + jj * (hd + 1) + d;
        kd[0] = kv.x; kd[1] = kv.y; kd[2] = kv.z; kd[3] = kv.w;
        *reinterpret_cast<float4*>(Vs + jj * hd + d) = vv;
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    // keys per lane, <= 4: KPL when built in (the grouped kernels: splits of 32 keys, fewer
    // registers), else S / 32
    constexpr int NS = KPL ? KPL : 4;
    int kpl = KPL ? KPL : S >> 5;
    for (int w0 = (threadIdx.x >> 5) * IPW; w0 < items; w0 += 8 * IPW) {
        // this warp's items; a slot past the block's last item repeats it and writes nothing
        int p[IPW], lo[IPW], first[IPW], last[IPW];
        long long base[IPW];
        bool on[IPW];
        bool any = false;
#pragma unroll
        for (int k = 0; k < IPW; ++k) {
            int item = item0 + min(w0 + k, items - 1);
            int i = item / group, h = g * group + item % group;
            p[k] = ps[min(w0 + k, items - 1)];
            lo[k] = window > 0 ? max(0, p[k] - window + 1) : 0;
            on[k] = w0 + k < items && j0 <= p[k] && j0 + S > lo[k];  // else outside the split
            any = any || on[k];
            first[k] = max(0, lo[k] - j0);
            last[k] = min(jn, p[k] + 1 - j0);
            base[k] = ((long long)i * H + h) * nsplit + s;
        }
        if (!any) continue;
        const float* q = Qs + w0 * hd;
        float sc[IPW][NS], m[IPW];
#pragma unroll
        for (int k = 0; k < IPW; ++k) {
            m[k] = -INFINITY;
#pragma unroll
            for (int u = 0; u < NS; ++u) sc[k][u] = -INFINITY;
        }
    #pragma unroll
        for (int u = 0; u < NS; ++u) {
            if (u >= kpl) break;
            int jj = lane + 32 * u, j = j0 + jj;
            // four independent chains per item (dims d % 4), summed in a fixed order
            const float* kr = Ks + jj * (hd + 1);
            float d0[IPW], d1[IPW], d2[IPW], d3[IPW];
#pragma unroll
            for (int k = 0; k < IPW; ++k) d0[k] = d1[k] = d2[k] = d3[k] = 0.0f;
    #pragma unroll 8
            for (int e = 0; e < hd4; ++e) {
                float k0 = kr[4 * e], k1 = kr[4 * e + 1], k2 = kr[4 * e + 2], k3 = kr[4 * e + 3];
#pragma unroll
                for (int k = 0; k < IPW; ++k) {
                    float4 qq = reinterpret_cast<const float4*>(q + min(k, items - 1 - w0) * hd)[e];
                    d0[k] = fmaf(qq.x, k0, d0[k]);
                    d1[k] = fmaf(qq.y, k1, d1[k]);
                    d2[k] = fmaf(qq.z, k2, d2[k]);
                    d3[k] = fmaf(qq.w, k3, d3[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < IPW; ++k) {
                float dot = __fadd_rn(__fadd_rn(d0[k], d1[k]), __fadd_rn(d2[k], d3[k]));
                // a key outside [lo, p] (or past the staged keys) is -inf, its dot unused
                float v = j >= lo[k] && j <= p[k] ? __fmul_rn(dot, scale) : -INFINITY;
                sc[k][u] = v;
                m[k] = fmaxf(m[k], v);
            }
        }
        float l[IPW];
#pragma unroll
        for (int k = 0; k < IPW; ++k) {
            m[k] = warp_max(m[k]);
            l[k] = 0.0f;
#pragma unroll
            for (int u = 0; u < NS; ++u) {
                if (u >= kpl) break;
                sc[k][u] = sc[k][u] == -INFINITY ? 0.0f : expf(__fsub_rn(sc[k][u], m[k]));
                l[k] = __fadd_rn(l[k], sc[k][u]);
            }
            l[k] = warp_sum(l[k]);
        }
        float acc[IPW][DPL];
#pragma unroll
        for (int k = 0; k < IPW; ++k)
#pragma unroll
            for (int e = 0; e < DPL; ++e) acc[k][e] = 0.0f;
        int jfirst = jn, jend = 0;  // the union of the warp's items' key ranges
#pragma unroll
        for (int k = 0; k < IPW; ++k) {
            if (on[k]) {
                jfirst = min(jfirst, first[k]);
                jend = max(jend, last[k]);
            }
        }
    #pragma unroll 4
        for (int jj = jfirst; jj < jend; ++jj) {
            // weight of key jj lives in lane jj % 32, slot jj / 32 (no dynamic register index)
            int slot = jj >> 5;
            const float* vr = Vs + jj * hd + lane;
            float v[DPL];
#pragma unroll
            for (int e = 0; e < DPL; ++e) v[e] = vr[32 * e];
#pragma unroll
            for (int k = 0; k < IPW; ++k) {
                float mine = sc[k][0];
#pragma unroll
                for (int u = 1; u < NS; ++u) mine = slot == u ? sc[k][u] : mine;
                float pj = __shfl_sync(0xffffffffu, mine, jj & 31);
                if (jj >= first[k] && jj < last[k]) {  // warp-uniform
#pragma unroll
                    for (int e = 0; e < DPL; ++e) acc[k][e] = fmaf(pj, v[e], acc[k][e]);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < IPW; ++k) {
            if (!on[k]) continue;
#pragma unroll
            for (int e = 0; e < DPL; ++e) Opart[base[k] * hd + lane + 32 * e] = acc[k][e];
            if (lane == 0) {
                Mpart[base[k]] = m[k];
                Lpart[base[k]] = l[k];
            }
        }
    }  // items
}

// Blocks per SM the CUDA-core attention asks the register allocator for (a speed choice,
// the same bits: backend settings attn_min_blocks / attn_group_min_blocks, module "@aN").
// At 39 registers 6 blocks fit: Qwen 0.5B's 16-row launch (952 blocks) ran 1.2 waves (ncu).
#ifndef ATTN_MINB
#define ATTN_MINB 1
#endif
#define ATTN_PARTIAL_G(DPL, IPW, KPL, SUFFIX)                                                         \
    extern "C" __global__ void __launch_bounds__(256, ATTN_MINB) attn_partial_d##DPL##SUFFIX(   \
        const float* Q, int ldq, const float* Kc, const float* Vc, const int* pos, int n, int H,  \
        int KVH, int S, int window, float scale, int nsplit, float* Opart, float* Mpart,         \
        float* Lpart, int per_block) {                                                           \
        grid_dependency();                                                                       \
        attn_partial_body<DPL, IPW, KPL>(Q, ldq, Kc, Vc, pos, n, H, KVH, S, window, scale, nsplit,    \
                                    Opart, Mpart, Lpart, per_block);                             \
    }
#define ATTN_PARTIAL(DPL) \
    ATTN_PARTIAL_G(DPL, 1, 0, ) ATTN_PARTIAL_G(DPL, 2, 1, _g2) ATTN_PARTIAL_G(DPL, 4, 1, _g4)
ATTN_PARTIAL(1) ATTN_PARTIAL(2) ATTN_PARTIAL(3) ATTN_PARTIAL(4)
ATTN_PARTIAL(5) ATTN_PARTIAL(6) ATTN_PARTIAL(7) ATTN_PARTIAL(8)

// ---- tensor-core attention, pass 1 (backend flag tensor_attention) ----
//
// Same job and outputs as attn_partial (a split's unnormalized output, max and sum per
// (row, head)), but a GQA group's (row, head) items are the M dimension of mma.sync
// m16n8k8 tiles: scores = Q K^T with items x keys, output = P V with items x dims. Every
// score and output element is its own dot product inside the instruction, so an item
// computes alike whichever tile row it lands in and whatever items share the tile: a
// decode row and the same row in a verify batch get the same bits, and a 16-item tile
// costs what one item does. Operands are f32 split 3xTF32: x = hi + lo with hi = x
// truncated to TF32 (10-bit mantissa; truncation is exact and never rounds a large value
// up into inf) and lo = x - hi (exact), itself truncated; a.b = hi(a).hi(b) + [lo(a).hi(b)
// + hi(a).lo(b)], the three terms in three f32 accumulators (independent mma chains) added
// once at the end, h + (la + lb) (the dropped lo.lo term is ~2^-20 relative): about f32
// accuracy.
//
// Block (tile z of 16 items, kv head g, split s of 32 keys), 4 or 8 warps; the splits
// vary slowest, as in attn_partial_body, so blocks past every position are dispatched last.
// One tile a block: the earlier form put up to 4 tiles in a block of 4
// warps, 128 blocks for a 16-row Qwen 0.5B verify, too few to hide the mma chains.
//  1. The tile's positions into shared memory; a block whose split meets no item's range
//     leaves at the barrier. Stage K and V of the split as f32 (rows past the largest
//     position zero, so 0 * garbage is 0) and the tile's q vectors as hi/lo planes (every
//     warp reads all of them). Rows between a row's own position and the block's largest
//     are real V: a finite V there meets P = 0 and adds nothing, but 0 * inf is NaN, so a
//     block that staged any non-finite V takes step 3's exact form.
//  2. Scores: keys 8w..8w+7 (w = warp % 4, one n8 column of S), each half of the dims its
//     own mma chain (h + l per half) into its own score plane; K fragments are split as
//     they are read.
//  3. Every warp reads the 16 x 32 scores in the A-fragment layout (lane gq, t holds rows
//     gq, gq + 8 and keys 8j + t, 8j + t + 4): score = (half 0 + half 1) * scale, -inf
//     outside a row's [lo, p]; each row's max and sum over its keys in fixed order and a
//     butterfly over the quad (commutative steps: all lanes and warps get the same bits);
//     then its share of the output's 8-dim tiles, keys 0-15 and 16-31 as two chains.
#define ATC_S 32

// x = hi + lo as TF32 operands: hi truncated (exact), lo = x - hi, truncated too
__device__ __forceinline__ void split_tf32(float x, u32& hi, u32& lo) {
    hi = __float_as_uint(x) & 0xffffe000u;
    lo = __float_as_uint(__fsub_rn(x, __uint_as_float(hi))) & 0xffffe000u;
}

__device__ __forceinline__ void mma1688(float d[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 3xTF32 into three accumulators, three independent mma chains: h += hi(a).hi(b),
// la += lo(a).hi(b), lb += hi(a).lo(b); the value is h + (la + lb) (mma3_sum)
__device__ __forceinline__ void mma3(float h[4], float la[4], float lb[4], const u32 ah[4],
                                     const u32 al[4], u32 bh0, u32 bh1, u32 bl0, u32 bl1) {
    mma1688(la, al, bh0, bh1);
    mma1688(lb, ah, bl0, bl1);
    mma1688(h, ah, bh0, bh1);
}

__device__ __forceinline__ float mma3_sum(float h, float la, float lb) {
    return __fadd_rn(h, __fadd_rn(la, lb));
}

// One score row's softmax over the 32 keys a quad of lanes holds (8 per lane, x in key
// order 8j + t, 8j + t + 4): max, then x = exp(x - max) (-inf -> 0) and their sum, each
// reduced over the lane's 8 values in order and then a butterfly over the quad.
__device__ __forceinline__ void quad_softmax(float x[8], float& m, float& l) {
    m = -INFINITY;
#pragma unroll
    for (int u = 0; u < 8; ++u) m = fmaxf(m, x[u]);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    l = 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        x[u] = x[u] == -INFINITY ? 0.0f : expf(__fsub_rn(x[u], m));
        l = __fadd_rn(l, x[u]);
    }
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
    l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
}

// Step 3's P V for this warp's output tiles (8 dims each: warp, warp + NW, ...), written to
// the items' rows oa / ob where wa / wb. Keys 0-15 and 16-31 of the split are two
// independent chains (shorter mma dependencies), added at the end: o = (h0 + l0) + (h1 + l1).
// MASKED: keys outside [kmin, kmax] (split-relative) read a zero V instead of their own
// (the exact form, one row's pass); unmasked it is the plain tile product.
template <int DPL, int NW, bool MASKED>
__device__ __forceinline__ void attn_tc_pv(const u32 ph[4][4], const u32 pl[4][4],
                                           const float* Vs, int VST, int t, int gq, int warp,
                                           int kmin, int kmax, bool wa, bool wb, float* oa,
                                           float* ob) {
    constexpr int tiles = DPL * 4;  // hd / 8
#pragma unroll
    for (int u = 0; u < (tiles + NW - 1) / NW; ++u) {
        int tile = warp + NW * u;
        if (tile >= tiles) break;
        int col = 8 * tile + gq;
        float oh[2][4], oa2[2][4], ob2[2][4];
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) oh[c][e] = oa2[c][e] = ob2[c][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            // this lane's two B rows: keys 8j + t and 8j + t + 4 of the split
            int k0 = 8 * j + t;
            float v0 = Vs[k0 * VST + col], v1 = Vs[(k0 + 4) * VST + col];
            if (MASKED) {
                v0 = k0 >= kmin && k0 <= kmax ? v0 : 0.0f;
                v1 = k0 + 4 >= kmin && k0 + 4 <= kmax ? v1 : 0.0f;
            }
            u32 bh0, bl0, bh1, bl1;
            split_tf32(v0, bh0, bl0);
            split_tf32(v1, bh1, bl1);
            mma3(oh[j >> 1], oa2[j >> 1], ob2[j >> 1], ph[j], pl[j], bh0, bh1, bl0, bl1);
        }
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
            o[e] = __fadd_rn(mma3_sum(oh[0][e], oa2[0][e], ob2[0][e]),
                             mma3_sum(oh[1][e], oa2[1][e], ob2[1][e]));
        int d = 8 * tile + 2 * t;
        if (wa) *reinterpret_cast<float2*>(oa + d) = make_float2(o[0], o[1]);
        if (wb) *reinterpret_cast<float2*>(ob + d) = make_float2(o[2], o[3]);
    }
}

// WPT warps a tile (4 or 8) and TPB tiles a block (1 or 2): the same bits in every form.
// With 8 warps a tile, warps 4-7 take the second half of every score's dims and of the
// output tiles; with 4 each warp runs both halves as independent chains. One-row decode
// has few blocks and wants the shorter path (8 a tile); a many-row launch has blocks
// enough and wants fewer stagings of the same keys (two tiles share a block's K and V:
// Qwen 0.5B's 16-row verify otherwise reads each split's K and V from L2 seven times).
template <int DPL, int WPT, int TPB>
__device__ __forceinline__ void attn_tc_body(const float* Q, int ldq, const float* Kc,
                                             const float* Vc, const int* pos, int n, int H,
                                             int KVH, int window, float scale, int nsplit,
                                             float* Opart, float* Mpart, float* Lpart) {
    constexpr int hd = DPL * 32, S = ATC_S, half = hd / 16;  // k-steps of 8 dims per half
    // padded row strides: K, Q and score reads hit banks gq*4 + t, V reads t*8 + gq
    constexpr int KST = hd + 4, VST = hd + 8, QST = hd + 4, SST = S + 4;
    extern __shared__ float smem[];
    float* Ks = smem;
    float* Vs = Ks + S * KST;
    constexpr int NW = WPT * TPB, R = 16 * TPB;  // warps and item rows of the block
    u32* Qh = reinterpret_cast<u32*>(Vs + S * VST);
    u32* Ql = Qh + R * QST;
    float* Ss = reinterpret_cast<float*>(Ql + R * QST);  // [tile][dims half][16][SST]
    __shared__ int ps[R], pl[R];  // each item row's position and window start
    int g = blockIdx.y, s = blockIdx.z;
    int group = H / KVH;
    int bt0 = blockIdx.x * R;  // the block's first item
    int bcnt = max(0, min(R, n * group - bt0));
    int j0 = s * S;
    bool reach = false;
    if (threadIdx.x < R) {
        int p = -1, lo = 0;  // a row past the block's items sees no key
        if (threadIdx.x < bcnt) {
            p = pos[(bt0 + threadIdx.x) / group];
            lo = window > 0 ? max(0, p - window + 1) : 0;
            reach = j0 <= p && j0 + S > lo;
        }
        ps[threadIdx.x] = p;
        pl[threadIdx.x] = lo;
    }
    if (!__syncthreads_or(reach)) return;
    int pmax = -1;
#pragma unroll
    for (int r = 0; r < R; ++r) pmax = max(pmax, ps[r]);
    int jn = min(S, pmax + 1 - j0);
    constexpr int hd4 = hd / 4;
    int bad = 0;  // a non-finite V staged: step 3 then masks V per row
#pragma unroll 4
    for (int i = threadIdx.x; i < S * hd4; i += NW * 32) {
        int jj = i / hd4, d = (i - jj * hd4) << 2;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
        if (jj < jn) {
            long long src = ((long long)(j0 + jj) * KVH + g) * hd + d;
            kv = *reinterpret_cast<const float4*>(Kc + src);
            vv = *reinterpret_cast<const float4*>(Vc + src);
            bad |= !(isfinite(vv.x) && isfinite(vv.y) && isfinite(vv.z) && isfinite(vv.w));
        }
        *reinterpret_cast<float4*>(Ks + jj * KST + d) = kv;
        *reinterpret_cast<float4*>(Vs + jj * VST + d) = vv;
    }
#pragma unroll 2
    for (int i = threadIdx.x; i < R * hd4; i += NW * 32) {
        int it = i / hd4, d = (i - it * hd4) << 2;
        float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (it < bcnt) {
            int item = bt0 + it;
            int row = item / group, h = g * group + item % group;
            qv = *reinterpret_cast<const float4*>(Q + (long long)row * ldq + (long long)h * hd + d);
        }
        uint4 hi, lo;
        split_tf32(qv.x, hi.x, lo.x);
        split_tf32(qv.y, hi.y, lo.y);
        split_tf32(qv.z, hi.z, lo.z);
        split_tf32(qv.w, hi.w, lo.w);
        *reinterpret_cast<uint4*>(Qh + it * QST + d) = hi;
        *reinterpret_cast<uint4*>(Ql + it * QST + d) = lo;
    }
    bool exact_pv = __syncthreads_or(bad) != 0;
    int lane = threadIdx.x & 31;
    int gq = lane >> 2, t = lane & 3;
    // this warp's tile and its place among the tile's warps; the tile's items, positions,
    // q planes and score planes
    int tile = (threadIdx.x >> 5) / WPT, warp = (threadIdx.x >> 5) % WPT;
    int it0 = bt0 + 16 * tile;
    int cnt = max(0, min(16, bcnt - 16 * tile));
    const int* tps = ps + 16 * tile;
    const int* tpl = pl + 16 * tile;
    Qh += 16 * tile * QST;
    Ql += 16 * tile * QST;
    Ss += tile * 2 * 16 * SST;
    // 2. each half's dot products of keys 8 * (warp % 4) .. + 7: h + l per half, into the
    // half's score plane (the reader adds the halves, scales and masks)
    {
        int kt = warp & 3;
        const float* kr = Ks + (8 * kt + gq) * KST + t;
        const u32* qh = Qh + gq * QST + t;
        const u32* ql = Ql + gq * QST + t;
#pragma unroll
        for (int hf = (WPT == 8 ? warp >> 2 : 0); hf < 2; hf += (WPT == 8 ? 2 : 1)) {
            float sh[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < half; ++k) {
                int o = 8 * (hf * half + k);
                u32 bh0, bl0, bh1, bl1;
                split_tf32(kr[o], bh0, bl0);
                split_tf32(kr[o + 4], bh1, bl1);
                u32 ah[4] = {qh[o], qh[o + 8 * QST], qh[o + 4], qh[o + 4 + 8 * QST]};
                u32 al[4] = {ql[o], ql[o + 8 * QST], ql[o + 4], ql[o + 4 + 8 * QST]};
                mma3(sh, sa, sb, ah, al, bh0, bh1, bl0, bl1);
            }
            float* plane = Ss + hf * 16 * SST + 8 * kt + 2 * t;
            *reinterpret_cast<float2*>(plane + gq * SST) =
                make_float2(mma3_sum(sh[0], sa[0], sb[0]), mma3_sum(sh[1], sa[1], sb[1]));
            *reinterpret_cast<float2*>(plane + (gq + 8) * SST) =
                make_float2(mma3_sum(sh[2], sa[2], sb[2]), mma3_sum(sh[3], sa[3], sb[3]));
        }
    }
    __syncthreads();
    // 3. scores (halves added, scaled, keys outside a row's [lo, p] at -inf), softmax, P V
    float xa[8], xb[8];  // keys 8j + t (slot 2j) and 8j + t + 4 (slot 2j + 1)
    {
        int pa = tps[gq] - j0, loa = tpl[gq] - j0, pb = tps[gq + 8] - j0, lob = tpl[gq + 8] - j0;
        const float* s0 = Ss + gq * SST + t;
        const float* s1 = s0 + 16 * SST;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int key = 8 * (u >> 1) + 4 * (u & 1) + t, o = key - t;
            float va = __fmul_rn(__fadd_rn(s0[o], s1[o]), scale);
            xa[u] = key >= loa && key <= pa ? va : -INFINITY;
            xb[u] = 0.0f;
        }
        if (cnt > 8) {  // tile rows 8-15 hold items (warp-uniform; decode's tiles have <= 8)
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                int key = 8 * (u >> 1) + 4 * (u & 1) + t, o = key - t + 8 * SST;
                float vb = __fmul_rn(__fadd_rn(s0[o], s1[o]), scale);
                xb[u] = key >= lob && key <= pb ? vb : -INFINITY;
            }
        }
    }
    // a row without an item has P = 0 (what its all -inf scores give) and is never written
    float ma, la, mb = -INFINITY, lb = 0.0f;
    quad_softmax(xa, ma, la);
    if (cnt > 8) quad_softmax(xb, mb, lb);
    u32 ph[4][4], plo[4][4];  // A fragments of P per key step j
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        split_tf32(xa[2 * j], ph[j][0], plo[j][0]);
        split_tf32(xb[2 * j], ph[j][1], plo[j][1]);
        split_tf32(xa[2 * j + 1], ph[j][2], plo[j][2]);
        split_tf32(xb[2 * j + 1], ph[j][3], plo[j][3]);
    }
    int ia = it0 + gq, ib = ia + 8;
    // an item writes every split its range meets (a NaN score makes a NaN output there)
    bool wa = gq < cnt && j0 <= tps[gq] && j0 + S > tpl[gq];
    bool wb = gq + 8 < cnt && j0 <= tps[gq + 8] && j0 + S > tpl[gq + 8];
    int ra = wa ? ia / group : 0, rb = wb ? ib / group : 0;
    int ha = g * group + (wa ? ia % group : 0), hb = g * group + (wb ? ib % group : 0);
    long long basea = ((long long)ra * H + ha) * nsplit + s;
    long long baseb = ((long long)rb * H + hb) * nsplit + s;
    // One pass for the whole tile, or (exact_pv: a non-finite V was staged) one per row of
    // the tile, with V outside that row's [lo, p] read as 0 and only its items written.
    // A row's pass then sums over exactly the keys a decode of that row stages (P = 0 times
    // a zero V is the zero a finite V gives), so decode and verify keep the same bits.
    if (!exact_pv) {
        attn_tc_pv<DPL, WPT, false>(ph, plo, Vs, VST, t, gq, warp, 0, 0, wa, wb,
                                    Opart + basea * hd, Opart + baseb * hd);
    } else if (cnt > 0) {
        int rfirst = it0 / group, rlast = (it0 + cnt - 1) / group;
        for (int r = rfirst; r <= rlast; ++r) {
            int tr = max(r * group - it0, 0);  // a tile row of row r
            int kmax = tps[tr] - j0, kmin = tpl[tr] - j0;
            attn_tc_pv<DPL, WPT, true>(ph, plo, Vs, VST, t, gq, warp, kmin, kmax,
                                      wa && ra == r, wb && rb == r, Opart + basea * hd,
                                      Opart + baseb * hd);
        }
    }
    if (warp == 0 && t == 0) {
        if (wa) {
            Mpart[basea] = ma;
            Lpart[basea] = la;
        }
        if (wb) {
            Mpart[baseb] = mb;
            Lpart[baseb] = lb;
        }
    }
}

#define ATTN_TC_W(DPL, WPT, TPB, SUFFIX)                                                        \
    extern "C" __global__ void __launch_bounds__(WPT * TPB * 32) attn_tc_d##DPL##SUFFIX(        \
        const float* Q, int ldq, const float* Kc, const float* Vc, const int* pos, int n, int H,  \
        int KVH, int window, float scale, int nsplit, float* Opart, float* Mpart,               \
        float* Lpart) {                                                                          \
        grid_dependency();                                                                       \
        attn_tc_body<DPL, WPT, TPB>(Q, ldq, Kc, Vc, pos, n, H, KVH, window, scale, nsplit,      \
                                    Opart, Mpart, Lpart);                                        \
    }
#define ATTN_TC(DPL) ATTN_TC_W(DPL, 4, 1, ) ATTN_TC_W(DPL, 8, 1, _w8) ATTN_TC_W(DPL, 4, 2, _t2)
ATTN_TC(1) ATTN_TC(2) ATTN_TC(3) ATTN_TC(4) ATTN_TC(5) ATTN_TC(6) ATTN_TC(7) ATTN_TC(8)

// Merge one more (max, sum, output) triple into a running one, online-softmax style.
__device__ __forceinline__ void softmax_merge(float& M, float& L, float& o, float m2, float l2,
                                              float o2) {
    if (m2 == -INFINITY) return;
    float nm = fmaxf(M, m2);
    float f1 = M == -INFINITY ? 0.0f : expf(__fsub_rn(M, nm));
    float f2 = expf(__fsub_rn(m2, nm));
    L = fmaf(l2, f2, __fmul_rn(L, f1));
    o = fmaf(o2, f2, __fmul_rn(o, f1));
    M = nm;
}

// Attention, pass 2: merge row i's splits; block (h, i) of 256 threads = G groups of hd
// (G = 256 / hd). Group t merges splits s0 + t, s0 + t + G, ... in batches of 8 (loads
// of a batch in flight together), then group 0 merges the G results in group order.
// The order depends on the row's position and hd only: the same for every row count.
#define COMBINE_BATCH 8
extern "C" __global__ void __launch_bounds__(256)
    attn_combine(const float* Opart, const float* Mpart, const float* Lpart, const int* pos, int H,
                 int hd, int S, int window, int nsplit, float* out) {
    grid_dependency();
    __shared__ float so[256], sm[8], sl[8];
    int h = blockIdx.x, i = blockIdx.y;
    int G = blockDim.x / hd;
    int grp = threadIdx.x / hd, d = threadIdx.x - grp * hd;
    int p = pos[i];
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    int s0 = lo / S, s1 = p / S;
    long long base = ((long long)i * H + h) * nsplit;
    float M = -INFINITY, L = 0.0f, o = 0.0f;
    if (grp < G) {
        for (int s = s0 + grp; s <= s1; s += COMBINE_BATCH * G) {
            float mv[COMBINE_BATCH], lv[COMBINE_BATCH], ov[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) {
                int su = s + u * G;
                bool ok = su <= s1;
                mv[u] = ok ? Mpart[base + su] : -INFINITY;
                lv[u] = ok ? Lpart[base + su] : 0.0f;
                ov[u] = ok ? Opart[(base + su) * hd + d] : 0.0f;
            }
            float bm = M;
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) bm = fmaxf(bm, mv[u]);
            float f = M == -INFINITY ? 0.0f : expf(__fsub_rn(M, bm));
            L = __fmul_rn(L, f);
            o = __fmul_rn(o, f);
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) {
                float e = mv[u] == -INFINITY ? 0.0f : expf(__fsub_rn(mv[u], bm));
                L = fmaf(lv[u], e, L);
                o = fmaf(ov[u], e, o);
            }
            M = bm;
        }
        so[threadIdx.x] = o;
        if (d == 0) {
            sm[grp] = M;
            sl[grp] = L;
        }
    }
    __syncthreads();
    if (grp != 0) return;
    for (int t = 1; t < G; ++t) softmax_merge(M, L, o, sm[t], sl[t], so[t * hd + d]);
    out[((long long)i * H + h) * hd + d] = __fdiv_rn(o, L);
}

// A row's sum of squares of the unrounded x for a fused norm, in the consuming kernel's order:
// lane t of warp w sums units w, w + kwg, ... element by element, lanes add as (t0 + t1) +
// (t2 + t3), warps in order (xprep and xprep8, one block per row).
__device__ __forceinline__ void xprep_sumsq(const float* __restrict__ x, int nunits, int kwg, float* out) {
    __shared__ float part[256];  // [warp of the consumer (kwg <= 64)][lane t]
    for (int idx = threadIdx.x; idx < 4 * kwg; idx += blockDim.x) {
        int w = idx >> 2, t = idx & 3;
        float q = 0.0f;
        for (int u = w; u < nunits; u += kwg) {
            const float* xr = x + 64 * u + 4 * t;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float4 xx = *reinterpret_cast<const float4*>(xr + 16 * c);
                q = fmaf(xx.x, xx.x, q);
                q = fmaf(xx.y, xx.y, q);
                q = fmaf(xx.z, xx.z, q);
                q = fmaf(xx.w, xx.w, q);
            }
        }
        part[idx] = q;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.0f;
        for (int w = 0; w < kwg; ++w) {
            float v = __fadd_rn(__fadd_rn(part[4 * w], part[4 * w + 1]), __fadd_rn(part[4 * w + 2], part[4 * w + 3]));
            tot = w == 0 ? v : __fadd_rn(tot, v);
        }
        *out = tot;
    }
}

// A lane's 16 norm weights (elements k0 + 16q + e, as x_lane_load's x) for xprep and xprep8;
// zeros without a norm or past the row.
__device__ __forceinline__ void xprep_norm_weights(const float* __restrict__ G, int k0, bool live,
                                                   float (&gv)[16]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        float4 gg = G && live ? *reinterpret_cast<const float4*>(G + k0 + 16 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
        gv[4 * q] = gg.x; gv[4 * q + 1] = gg.y; gv[4 * q + 2] = gg.z; gv[4 * q + 3] = gg.w;
    }
}

// x for the tensor-core products, converted once per product: mt_body rounds each
// (row, 64-element unit) of x to f16 in every column tile, so a wide weight (the head's 9,496
// tiles) or a 16-row verify repeats the same conversion thousands of times. xprep does it once
// with the very code mt_body runs (x_lane_convert; a unit's 4 lanes are 4 adjacent threads
// here, as in mt_body), and, for a fused norm, the row's
// sum of squares of the unrounded x in the consuming kernel's order: lane t of warp w sums
// units w, w + kwg, ... element by element, lanes add as (t0 + t1) + (t2 + t3), warps in
// order. The products then read b and the power instead of converting: the same bits.
// Grid (n); block: 4 threads per unit, a multiple of 32, at most 1024 (larger K loops).
// xprep8 (below): the same for the integer form.
// I8: the integer form's x (mt_body with MT_INT8), quantized once per product with the very
// code mt_body runs (x_lane_load, x_quant8): H holds each (row, unit)'s 16 words (lane t's
// b[2][2] at 4t), S its two group scales, SS a fused norm's sums of squares alike.
template <bool I8>
__device__ __forceinline__ void xprep_body(const float* X, int ldx, int K, const float* G, int kwg,
                                           u32* H, float* S, float* SS) {
    int row = blockIdx.x, nunits = K >> 6;
    const float* x = X + (long long)row * ldx;
    for (int base = 0; base < 4 * nunits; base += blockDim.x) {
        int idx = base + threadIdx.x, u = idx >> 2, t = idx & 3;
        bool live = u < nunits;
        int k0 = 64 * u + 4 * t;
        long long at = (long long)row * nunits + u;
        float gv[16], unused = 0.0f;
        xprep_norm_weights(G, k0, live, gv);
        if constexpr (I8) {
            float xv[16], xd[2];
            u32 b[2][2];
            x_lane_load(x, 0, live ? 0 : 1, 1, k0, G != nullptr, gv, unused, xv);
            x_quant8(xv, b, xd);
            if (live) {
                *reinterpret_cast<uint4*>(H + at * 16 + 4 * t) = make_uint4(b[0][0], b[0][1], b[1][0], b[1][1]);
                if (t == 0) *reinterpret_cast<float2*>(S + at * 2) = make_float2(xd[0], xd[1]);
            }
        } else {
            u32 b[4][2];  // mt_body's conversion itself, on "row 0 of 1" (a dead lane: past the end)
            float pinv = x_lane_convert(x, 0, live ? 0 : 1, 1, k0, G != nullptr, gv, unused, b);
            if (live) {
                uint4* hp = reinterpret_cast<uint4*>(H + (at * 4 + t) * 8);
                hp[0] = make_uint4(b[0][0], b[0][1], b[1][0], b[1][1]);
                hp[1] = make_uint4(b[2][0], b[2][1], b[3][0], b[3][1]);
                if (t == 0) S[at] = pinv;
            }
        }
    }
    if (G) xprep_sumsq(x, nunits, kwg, SS + row);
}

extern "C" __global__ void xprep(const float* X, int ldx, int n, int K, const float* G, int kwg,
                                 u32* H, float* S, float* SS) {
    grid_dependency();
    xprep_body<false>(X, ldx, K, G, kwg, H, S, SS);
}

extern "C" __global__ void xprep8(const float* X, int ldx, int n, int K, const float* G, int kwg,
                                  u32* H, float* S, float* SS) {
    grid_dependency();
    xprep_body<true>(X, ldx, K, G, kwg, H, S, SS);
}

// Greedy pick per row: largest logit, ties to the lowest id; block of 1024 per row.
extern "C" __global__ void argmax_rows(const float* X, int ldx, int V, int* out) {
    grid_dependency();
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    const float* x = X + (long long)blockIdx.x * ldx;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int k = threadIdx.x; k < V; k += 1024) {
        float v = x[k];
        if (v > best) { best = v; idx = k; }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int o = 512; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            float v2 = bv[threadIdx.x + o];
            int i2 = bi[threadIdx.x + o];
            if (v2 > bv[threadIdx.x] || (v2 == bv[threadIdx.x] && i2 < bi[threadIdx.x])) {
                bv[threadIdx.x] = v2;
                bi[threadIdx.x] = i2;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] == 0x7fffffff ? 0 : bi[0];
}

// The same argmax in two launches, for long rows (a 151,936-id vocabulary took one block
// 12.9 us): blocks of 256 threads reduce `chunk` ids each to (max, lowest id of it), then
// one warp per row reduces the parts in order. Both keep the lowest id among equal maxima
// and skip NaN, so the id is argmax_rows' for every row. With `feed`, the last row's id
// is also written to feed_ids[0] and feed_pos[0] moves on by one: a chained decode step's
// graph hands the next replay its input (engine/step_chain.py) without a host round trip.
__device__ __forceinline__ void argmax_pick(float& bv, int& bi, float v2, int i2) {
    if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
}

extern "C" __global__ void argmax_part(const float* X, int ldx, int V, int chunk, float* PV,
                                       int* PI) {
    grid_dependency();
    __shared__ float bv[256];
    __shared__ int bi[256];
    const float* x = X + (long long)blockIdx.y * ldx;
    int k0 = blockIdx.x * chunk, k1 = min(V, k0 + chunk);
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int k = k0 + threadIdx.x; k < k1; k += 256) {
        float v = x[k];
        if (v > best) { best = v; idx = k; }
    }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            float b = bv[threadIdx.x];
            int i = bi[threadIdx.x];
            argmax_pick(b, i, bv[threadIdx.x + o], bi[threadIdx.x + o]);
            bv[threadIdx.x] = b;
            bi[threadIdx.x] = i;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        PV[(long long)blockIdx.y * gridDim.x + blockIdx.x] = bv[0];
        PI[(long long)blockIdx.y * gridDim.x + blockIdx.x] = bi[0];
    }
}

extern "C" __global__ void argmax_final(const float* PV, const int* PI, int parts, int* out,
                                        int feed, int* feed_ids, int* feed_pos) {
    grid_dependency();
    int row = blockIdx.x, lane = threadIdx.x;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int c = lane; c < parts; c += 32)
        argmax_pick(best, idx, PV[(long long)row * parts + c], PI[(long long)row * parts + c]);
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_down_sync(0xffffffffu, best, o);
        int i2 = __shfl_down_sync(0xffffffffu, idx, o);
        argmax_pick(best, idx, v2, i2);
    }
    if (lane == 0) {
        int id = idx == 0x7fffffff ? 0 : idx;
        out[row] = id;
        if (feed && row == gridDim.x - 1) {
            feed_ids[0] = id;
            feed_pos[0] += 1;
        }
    }
}

#endif  // ECHOLINE_COMMON
