// echoline CUDA kernels: GGUF matrix products, attention, norms, RoPE, cache writes.
//
// Batch invariance is the design rule: a row's result never depends on how many rows
// share a launch. Matrix products give each warp whole output columns and loop over
// the input rows with one fixed per-row reduction order (no split-K); attention splits
// the cache into chunks of a FIXED number of keys, so a verify step and a decode step
// reduce the same chunks in the same order. Built with --fmad=false: every fused
// multiply-add below is written out (fmaf), so instantiations cannot differ.

#include "quant.cuh"

#define MM_WARPS 4

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

// Y[r, col] = sum_k X[r, k] * W[col, k] for r < n, col < out_rows.
// A warp owns C whole output columns; lane l owns chunks l, l+32, ... of each row.
// Rows are taken R at a time, so a weight chunk is dequantized once per R rows and an
// input chunk is loaded once per C columns. Whatever R and C, the (row, column)
// value is the same sequence of fmaf over the same chunks, then the same butterfly:
// bit-identical for every row count.
template <int QT, int R, int C>
__device__ __forceinline__ void mm_body(const u8* __restrict__ W, long long row_bytes, int out_rows,
                                        int K, const float* __restrict__ X, int ldx, int n,
                                        float* __restrict__ Y, int ldy) {
    int col0 = (blockIdx.x * MM_WARPS + (threadIdx.x >> 5)) * C;
    int lane = threadIdx.x & 31;
    if (col0 >= out_rows) return;
    int nchunks = K >> 3;
    for (int r0 = 0; r0 < n; r0 += R) {
        float acc[R][C];
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int cc = 0; cc < C; ++cc) acc[j][cc] = 0.0f;
        for (int c = lane; c < nchunks; c += 32) {
            float w[C][8];
#pragma unroll
            for (int cc = 0; cc < C; ++cc) {
                int col = min(col0 + cc, out_rows - 1);  // duplicate the last column, never stored
                dq8<QT>(W + (long long)col * row_bytes, c, w[cc]);
            }
            // Input rows are loaded XB at a time before any arithmetic: one load in
            // flight per row had each chunk wait 16 cache round trips at 16 rows.
            constexpr int XB = R < (C == 1 ? 8 : 4) ? R : (C == 1 ? 8 : 4);
#pragma unroll
            for (int jb = 0; jb < R; jb += XB) {
                float4 xa[XB], xb[XB];
#pragma unroll
                for (int u = 0; u < XB; ++u) {
                    int row = min(r0 + jb + u, n - 1);  // past n: a valid row, never used
                    const float4* xp = reinterpret_cast<const float4*>(X + (long long)row * ldx) + 2 * c;
                    xa[u] = xp[0];
                    xb[u] = xp[1];
                }
#pragma unroll
                for (int u = 0; u < XB; ++u) {
                    int j = jb + u;
                    if (r0 + j < n) {
                        float4 a = xa[u], b = xb[u];
#pragma unroll
                        for (int cc = 0; cc < C; ++cc) {
                            float s = acc[j][cc];
                            s = fmaf(w[cc][0], a.x, s); s = fmaf(w[cc][1], a.y, s);
                            s = fmaf(w[cc][2], a.z, s); s = fmaf(w[cc][3], a.w, s);
                            s = fmaf(w[cc][4], b.x, s); s = fmaf(w[cc][5], b.y, s);
                            s = fmaf(w[cc][6], b.z, s); s = fmaf(w[cc][7], b.w, s);
                            acc[j][cc] = s;
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < R; ++j)
#pragma unroll
            for (int cc = 0; cc < C; ++cc) {
                float v = warp_sum(acc[j][cc]);
                if (lane == 0 && r0 + j < n && col0 + cc < out_rows)
                    Y[(long long)(r0 + j) * ldy + col0 + cc] = v;
            }
    }
}

#define MM_KERNEL(NAME, QT, R, C)                                                            \
    extern "C" __global__ void __launch_bounds__(MM_WARPS * 32)                             \
        mm_##NAME##_r##R##_c##C(const u8* W, long long row_bytes, int out_rows, int K,        \
                                const float* X, int ldx, int n, float* Y, int ldy) {         \
        mm_body<QT, R, C>(W, row_bytes, out_rows, K, X, ldx, n, Y, ldy);                     \
    }

// C (columns per warp) only changes which warp computes a value, never its reduction
// order, so the backend picks C per launch: 1 keeps small matrices spread over the
// whole chip, 4 shares each input load across 4 columns for large ones.
#define MM_ALL_R(NAME, QT)                                                             \
    MM_KERNEL(NAME, QT, 1, 1) MM_KERNEL(NAME, QT, 2, 1) MM_KERNEL(NAME, QT, 4, 1)          \
    MM_KERNEL(NAME, QT, 4, 4) MM_KERNEL(NAME, QT, 8, 1) MM_KERNEL(NAME, QT, 8, 4)          \
    MM_KERNEL(NAME, QT, 16, 1) MM_KERNEL(NAME, QT, 16, 4)

MM_ALL_R(f32, QT_F32)
MM_ALL_R(f16, QT_F16)
MM_ALL_R(bf16, QT_BF16)
MM_ALL_R(q4_0, QT_Q4_0)
MM_ALL_R(q4_1, QT_Q4_1)
MM_ALL_R(q5_0, QT_Q5_0)
MM_ALL_R(q5_1, QT_Q5_1)
MM_ALL_R(q8_0, QT_Q8_0)
MM_ALL_R(q4_k, QT_Q4_K)
MM_ALL_R(q5_k, QT_Q5_K)
MM_ALL_R(q6_k, QT_Q6_K)

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
        embed_body<QT>(table, row_bytes, K, ids, out);                                          \
    }

EMBED_KERNEL(f32, QT_F32)
EMBED_KERNEL(f16, QT_F16)
EMBED_KERNEL(bf16, QT_BF16)
EMBED_KERNEL(q4_0, QT_Q4_0)
EMBED_KERNEL(q4_1, QT_Q4_1)
EMBED_KERNEL(q5_0, QT_Q5_0)
EMBED_KERNEL(q5_1, QT_Q5_1)
EMBED_KERNEL(q8_0, QT_Q8_0)
EMBED_KERNEL(q4_k, QT_Q4_K)
EMBED_KERNEL(q5_k, QT_Q5_K)
EMBED_KERNEL(q6_k, QT_Q6_K)

// RMSNorm of each row (row stride ldx), times weight; one block of 256 threads per row.
extern "C" __global__ void rms_norm(const float* X, int ldx, const float* weight, int d, float eps,
                                    float* out) {
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

// RoPE on x (n, H, hd) with row stride ldx; out contiguous. Angles in double, like ggml.
extern "C" __global__ void rope(const float* X, int ldx, const int* pos, int n, int H, int hd,
                                double base, int neox, float* out) {
    int half = hd >> 1;
    long long total = (long long)n * H * half;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        int k = (int)(t % half);
        long long rh = t / half;
        int h = (int)(rh % H);
        int i = (int)(rh / H);
        double ang = (double)pos[i] * pow(base, -2.0 * (double)k / (double)hd);
        float c = (float)cos(ang), s = (float)sin(ang);
        const float* x = X + (long long)i * ldx + (long long)h * hd;
        float* y = out + ((long long)i * H + h) * hd;
        int ia = neox ? k : 2 * k;
        int ib = neox ? k + half : 2 * k + 1;
        float a = x[ia], b = x[ib];
        y[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        y[ib] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

// cache[dst_i] = rows[i] with dst_i = dst ? dst[i] : start + i; rows have row stride ldr.
extern "C" __global__ void write_cache(float* cache, const float* rows, int ldr, int n, int width,
                                       const int* dst, int start) {
    long long total = (long long)n * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        int i = (int)(t / width), k = (int)(t % width);
        int r = dst ? dst[i] : start + i;
        cache[(long long)r * width + k] = rows[(long long)i * ldr + k];
    }
}

// Attention, pass 1: block (split s, kv head g) stages keys [s*S, s*S+S) of head g in
// shared memory, then each warp takes (row, head-in-group) items and writes that split's
// unnormalized output, max and sum. S (keys per split) is fixed per head size.
// Shared: K tile S x (hd+1) (padded: lanes read different keys), V tile S x hd.
extern "C" __global__ void __launch_bounds__(256)
    attn_partial(const float* Q, int ldq, const float* Kc, const float* Vc, const int* pos, int n,
                 int H, int KVH, int hd, int S, int window, float scale, int nsplit, float* Opart,
                 float* Mpart, float* Lpart) {
    extern __shared__ float smem[];
    int s = blockIdx.x, g = blockIdx.y;
    int j0 = s * S;
    int pmax = -1;
    for (int i = 0; i < n; ++i) pmax = max(pmax, pos[i]);
    if (j0 > pmax) return;
    int jn = min(S, pmax + 1 - j0);
    float* Ks = smem;
    float* Vs = smem + S * (hd + 1);
    // 16-byte loads, several in flight per thread (the K tile is padded: scalar stores)
    int hd4 = hd >> 2;
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
    int group = H / KVH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kpl = S >> 5;  // keys per lane, <= 4
    for (int item = warp; item < n * group; item += (blockDim.x >> 5)) {
        int i = item / group, h = g * group + item % group;
        int p = pos[i];
        int lo = window > 0 ? max(0, p - window + 1) : 0;
        if (j0 > p || j0 + S <= lo) continue;  // this split is outside row i's range
        const float* q = Q + (long long)i * ldq + (long long)h * hd;
        float sc[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        float m = -INFINITY;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (u >= kpl) break;
            int jj = lane + 32 * u, j = j0 + jj;
            float v = -INFINITY;
            if (j >= lo && j <= p) {
                // four independent chains (dims d % 4), summed in a fixed order: a quarter
                // of the latency of one chain, and the same for every row count
                const float* kr = Ks + jj * (hd + 1);
                const float4* q4 = reinterpret_cast<const float4*>(q);
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma unroll 4
                for (int e = 0; e < (hd >> 2); ++e) {
                    float4 qq = q4[e];
                    d0 = fmaf(qq.x, kr[4 * e], d0);
                    d1 = fmaf(qq.y, kr[4 * e + 1], d1);
                    d2 = fmaf(qq.z, kr[4 * e + 2], d2);
                    d3 = fmaf(qq.w, kr[4 * e + 3], d3);
                }
                float dot = __fadd_rn(__fadd_rn(d0, d1), __fadd_rn(d2, d3));
                v = __fmul_rn(dot, scale);
            }
            sc[u] = v;
            m = fmaxf(m, v);
        }
        m = warp_max(m);
        float l = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (u >= kpl) break;
            sc[u] = sc[u] == -INFINITY ? 0.0f : expf(__fsub_rn(sc[u], m));
            l = __fadd_rn(l, sc[u]);
        }
        l = warp_sum(l);
        long long base = ((long long)i * H + h) * nsplit + s;
        float acc[8];
        int dpl = (hd + 31) >> 5;  // dims per lane, <= 8
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
        int jlast = min(jn, p + 1 - j0);
#pragma unroll 4
        for (int jj = max(0, lo - j0); jj < jlast; ++jj) {
            // weight of key jj lives in lane jj % 32, slot jj / 32 (no dynamic register index)
            int slot = jj >> 5;
            float mine = slot == 0 ? sc[0] : slot == 1 ? sc[1] : slot == 2 ? sc[2] : sc[3];
            float pj = __shfl_sync(0xffffffffu, mine, jj & 31);
            const float* vr = Vs + jj * hd;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                int d = lane + 32 * e;
                if (e < dpl && d < hd) acc[e] = fmaf(pj, vr[d], acc[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            if (e >= dpl) break;
            int d = lane + 32 * e;
            if (d < hd) Opart[base * hd + d] = acc[e];
        }
        if (lane == 0) {
            Mpart[base] = m;
            Lpart[base] = l;
        }
    }
}

// Attention, pass 2: merge row i's splits in order; block (h, i), one thread per dim.
extern "C" __global__ void attn_combine(const float* Opart, const float* Mpart, const float* Lpart,
                                        const int* pos, int H, int hd, int S, int window,
                                        int nsplit, float* out) {
    int h = blockIdx.x, i = blockIdx.y, d = threadIdx.x;
    int p = pos[i];
    int lo = window > 0 ? max(0, p - window + 1) : 0;
    int s0 = lo / S, s1 = p / S;
    long long base = ((long long)i * H + h) * nsplit;
    // Loads go out 16 splits at a time (independent), the sums stay in split order:
    // a serial load-then-add loop waited one L2 round trip per split (~20 us at 2k keys).
    float M = -INFINITY;
    int s = s0;
    for (; s + 16 <= s1 + 1; s += 16) {
        float mv[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) mv[u] = Mpart[base + s + u];
#pragma unroll
        for (int u = 0; u < 16; ++u) M = fmaxf(M, mv[u]);
    }
    for (; s <= s1; ++s) M = fmaxf(M, Mpart[base + s]);
    float o = 0.0f, L = 0.0f;
    s = s0;
    for (; s + 16 <= s1 + 1; s += 16) {
        float mv[16], lv[16], ov[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            mv[u] = Mpart[base + s + u];
            lv[u] = Lpart[base + s + u];
            ov[u] = Opart[(base + s + u) * hd + d];
        }
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            float f = expf(__fsub_rn(mv[u], M));
            L = fmaf(lv[u], f, L);
            o = fmaf(ov[u], f, o);
        }
    }
    for (; s <= s1; ++s) {
        float f = expf(__fsub_rn(Mpart[base + s], M));
        L = fmaf(Lpart[base + s], f, L);
        o = fmaf(Opart[(base + s) * hd + d], f, o);
    }
    if (d < hd) out[((long long)i * H + h) * hd + d] = __fdiv_rn(o, L);
}

// Greedy pick per row: largest logit, ties to the lowest id; block of 1024 per row.
extern "C" __global__ void argmax_rows(const float* X, int ldx, int V, int* out) {
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
