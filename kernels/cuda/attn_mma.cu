/* attn_mma.cu - causal GQA attention over packed sequences on the tensor cores, forward and
 * backward: FlashAttention-2 (Dao 2023, Alg. 1 forward, Alg. 2 backward) with mma.sync
 * m16n8k16 (bf16 inputs, fp32 accumulators), ldmatrix and cp.async, for head dims 64 and 128.
 * Semantics: kernels/kernels.h (attention_fwd, attention_bwd); CPU twin kernels/cpu/attn_impl.h.
 * attn_gemm.cu routes the op table here when the context is not precise and D is 64 or 128.
 *
 * Formulas (row i = query token, j = key token, s = scale q_i.k_j, valid for seq_start[i] <= j <= i):
 *   forward   online softmax over key tiles in base 2: x = s log2(e); m <- max(m, max_j x);
 *             l <- l 2^(m_old - m) + sum_j 2^(x - m); o <- o 2^(m_old - m) + sum_j 2^(x - m) v_j;
 *             at the end o /= l, lse = (m + log2 l) ln 2 (natural log, as the op table says).
 *   backward  P = 2^(x - lse log2 e) (recomputed); dP = do.v; Delta_i = do_i.o_i;
 *             dS = P (dP - Delta); dq = scale dS k; dk = scale dS^T q; dv = P^T do.
 *
 * Precision: q, k, v and dout are rounded to bf16 by a pre-pass into the attention workspace;
 * P and dS are rounded to bf16 as the second GEMM's input, as FlashAttention-2 does in bf16.
 * Scores, the softmax statistics, lse, Delta and every accumulator are fp32. Delta is
 * sum_d bf16(do_d) o_d: the same dO that dP sees, so a query that sees only itself gets
 * dP - Delta = 0 up to fp32 rounding (its dq and dk are 0, as the CPU's).
 *
 * Tiles (a warp owns 16 rows of the first operand, all of the tile's columns; smem rows of D
 * bf16 with the 16-byte chunks XOR-swizzled by row % 8, so ldmatrix and cp.async are free of
 * bank conflicts):
 *   k_mma_fwd  block = (query head, 64 query rows), 4 warps. Visits key tiles of 64 from
 *              seq_start[i0] to i1 - 1 only (packed short sequences cost sum(len^2)), K/V tiles
 *              double-buffered with cp.async; per warp, tiles it cannot see are skipped and
 *              the mask is applied only on tiles that need it. Query tiles run longest first.
 *   k_mma_dq   block = (query head, 64 query rows), 4 warps: the forward's key walk,
 *              recomputing S and dP; dq accumulates in registers, written once.
 *   k_mma_dkv  block = (query head, 64 key rows), 4 warps: walks the query tiles (64 rows,
 *              double-buffered, computed in sub-tiles of 32) that can see its keys (from j0
 *              while seq_start[i0] < j1), recomputing S^T = K Q^T and dP^T = V dO^T; dk, dv
 *              accumulate in registers. With H / Hkv = 1 it writes dk, dv; otherwise
 *              per-query-head partials (workspace), summed over each group in a fixed order by
 *              k_mma_group_sum (a block per kv head would leave too few blocks for the causal
 *              imbalance). No atomics anywhere: the same bits every run.
 * Shared memory per block (D = 128 / 64): fwd 80 / 40 KB, dq 96 / 48 KB, dkv 97.5 / 49.5 KB;
 * two blocks per SM (__launch_bounds__; ptxas: no spills, up to 255 registers).
 *
 * Workspace (cx->attn, ft_cuda_mma_attn_ws_bytes): bf16 q, k, v, dout in their (T, heads, D)
 * layout, Delta (T, H) fp32, and with GQA the fp32 partials of dk and dv (T, H, D) each; for
 * T = 2048, H = 32, Hkv = 8, D = 128: 104 MiB. seq_start stays on the device (no host copy, no
 * synchronization); it is not validated here (the CPU op checks it), values are clamped so a
 * malformed one cannot make a kernel read outside its inputs.
 *
 * ft_cuda_mma_attn_selfcheck checks on the host (no GPU) the index math the kernels share:
 * the ldmatrix lane addresses and swizzle against the PTX fragment layouts, and the tile
 * visiting / skipping / masking decisions against brute force over random packings.
 * tests/emu/emu_attn_mma.cc (in `make test`) runs the kernels themselves on the CPU through
 * tests/emu/cuda_emu.h (FT_MMA_EMU below leaves out the inline PTX and the launchers; the
 * emulation supplies them).
 */
#ifndef FT_MMA_EMU
#include "kernels/cuda/cuda_common.h"
#else /* host compilation for tests/emu/emu_attn_mma.cc's CPU emulation: device code only */
#include <cuda_runtime.h>
#include "src/core/err.h"
#endif

#include <cuda_bf16.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

#define MMA_BK 64          /* key rows per tile (fwd, dq) and per dkv block */
#define FWD_WARPS 4        /* fwd: 64 query rows per block */
#define BWD_WARPS 4        /* dq: 64 query rows per block; dkv: 64 key rows per block */
#define DKV_BQ 64          /* dkv: query rows per tile (one cp.async stage) */
#define DKV_SUB 32         /* dkv: query rows per sub-tile (one S^T / dP^T register block) */
#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

/* ---- index math shared by the kernels and the host self-check ------------------------- */

/* Element offset of (row, col) in a smem tile of rows of D bf16; col's 16-byte chunk is
 * XOR-ed with row % 8 (8 consecutive rows at one chunk hit 8 different bank groups). */
__host__ __device__ __forceinline__ int mma_sw(int row, int col, int D)
{
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

/* ldmatrix.x4 row addresses: the (row, col) offset within a 16 x 16 block that `lane` points at.
 * _a: A operand (16 rows x 16 k, row-major), and a B operand stored [k][n] read with .trans
 *     (registers: rows 0-7/k 0-7, rows 8-15/k 0-7, rows 0-7/k 8-15, rows 8-15/k 8-15; with
 *     .trans: b0, b1 of n-tile 0, then b0, b1 of n-tile 1).
 * _b: B operand stored [n][k] (K in S = Q K^T): b0, b1 of n-tile 0, then of n-tile 1. */
__host__ __device__ __forceinline__ int lm_row_a(int lane) { return lane & 15; }
__host__ __device__ __forceinline__ int lm_col_a(int lane) { return (lane >> 4) << 3; }
__host__ __device__ __forceinline__ int lm_row_b(int lane) { return (lane & 7) | ((lane >> 4) << 3); }
__host__ __device__ __forceinline__ int lm_col_b(int lane) { return ((lane >> 3) & 1) << 3; }

/* Byte offsets of a lane's ldmatrix row in the first 16 x 16 block of a tile. Every block the
 * kernels read starts at a row that is a multiple of 8, so the swizzle of the lane's row is
 * the same in all of them: block (8 m rows down, k-step kk) is at 16 m D + (off ^ 32 kk), and
 * d-tile pair dt (even) of a .trans read at off ^ 16 dt (the chunk index and the step occupy
 * different bits: no carries). The self-check verifies this against mma_sw. */
__host__ __device__ __forceinline__ int lane_off_a(int lane, int D)
{
    return 2 * mma_sw(lm_row_a(lane), lm_col_a(lane), D);
}
__host__ __device__ __forceinline__ int lane_off_b(int lane, int D)
{
    return 2 * mma_sw(lm_row_b(lane), lm_col_b(lane), D);
}
__host__ __device__ __forceinline__ int off_kstep(int off, int kk) { return off ^ (kk << 5); }
__host__ __device__ __forceinline__ int off_dpair(int off, int dt) { return off ^ (dt << 4); }

/* First key of query row i (its sequence start, clamped to [0, i]); INT_MAX for rows past T
 * (nothing visible: such rows are padding of the last tile). */
__host__ __device__ __forceinline__ int mma_lo(const int32_t *ss, int i, int T)
{
    if (i >= T) return INT_MAX;
    int s = ss[i];
    return s < 0 ? 0 : (s > i ? i : s);
}

/* Query-row warp (rows qa .. qa + 15, qa < T; lo_first = lo(qa), lo_last = lo(last row < T))
 * against keys [j0, j0 + bk): act = some pair may be visible (else the warp skips the tile),
 * msk = not every pair is visible (apply the per-element mask). */
__host__ __device__ __forceinline__ void qwarp_flags(int T, int qa, int lo_first, int lo_last,
                                                     int j0, int bk, bool *act, bool *msk)
{
    const int ql = qa + 15 < T ? qa + 15 : T - 1;
    *act = j0 <= ql && j0 + bk - 1 >= lo_first;
    *msk = qa + 15 >= T || j0 + bk - 1 > qa || j0 < lo_last;
}

/* Key-row warp (keys ka .. ka + 15, ka < T) against query rows [i0, i0 + bq) whose sequence
 * starts run from lo_first (row i0) to lo_last (last row < T). Same act / msk meaning. */
__host__ __device__ __forceinline__ void kwarp_flags(int T, int ka, int i0, int bq, int lo_first,
                                                     int lo_last, bool *act, bool *msk)
{
    const int il = (i0 + bq < T ? i0 + bq : T) - 1;
    *act = il >= ka && lo_first <= ka + 15;
    *msk = i0 < ka + 15 || i0 + bq > T || lo_last > ka;
}

/* P or dS accumulators (16 x 8 NT, C layout) -> A fragments (16 x 16 per k-step, NT / 2 of
 * them): C tile 2kk gives k columns 0-7 of step kk, tile 2kk + 1 columns 8-15. */
__host__ __device__ __forceinline__ uint32_t mma_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(v.x) | ((uint32_t)__bfloat16_as_ushort(v.y) << 16);
}

/* The float value of the bf16 in the low 16 bits of `bits`. */
__host__ __device__ __forceinline__ float mma_bf16_val(uint32_t bits)
{
    const uint32_t u = (bits & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

template <int NT>
__host__ __device__ __forceinline__ void c_to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4])
{
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int kk = 0; kk < NT / 2; kk++) {
        a[kk][0] = mma_pack(c[2 * kk][0], c[2 * kk][1]);
        a[kk][1] = mma_pack(c[2 * kk][2], c[2 * kk][3]);
        a[kk][2] = mma_pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[kk][3] = mma_pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

/* ---- device primitives (the CPU emulation, tests/emu/cuda_emu.h, defines its own) ------- */
#ifndef FT_MMA_EMU

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* c (16 x 8, fp32) += a (16 x 16, bf16, row-major) b (16 x 8, bf16, col-major) */
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared, asynchronous; ok = 0 writes 16 zero bytes (src is not read). */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
#endif /* FT_MMA_EMU */

/* Rows [row0, row0 + NR) of a bf16 matrix with row stride `stride` elements (base at the
 * head's first column) into a swizzled NR x D smem tile; rows >= limit become zeros. */
template <int D, int NR, int NTH>
__device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *base, int row0, int limit, int64_t stride)
{
    constexpr int CH = D / 8, N = NR * CH;
    static_assert(N % NTH == 0, "tile chunks must split evenly over the block");
#pragma unroll
    for (int it = 0; it < N / NTH; it++) {
        const int e = it * NTH + threadIdx.x, r = e / CH, c = e % CH;
        const int row = row0 + r;
        const bool ok = row < limit;
        const bf16 *src = ok ? base + (int64_t)row * stride + c * 8 : base;
        cp16(smem_u32(sm + mma_sw(r, c * 8, D)), src, ok);
    }
}

/* acc (16 x 8 NT) += A (16 x D) B^T, B (8 NT x D); both row-major smem tiles over D, given as
 * the shared address of the 16-row block (As) and of the first B row (Bs), with the lane's
 * offsets oa = lane_off_a, ob = lane_off_b: S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T. */
/* One step of the double-buffered K/V pipeline over key tiles of BK rows: while tile n (at
 * key j0, in buffer n & 1) is computed, tile n + 1 is copied into the other buffer. Starts that
 * copy when there is a next tile and waits for tile n's copies (and any earlier group); the
 * caller's __syncthreads() then makes tile n visible to every warp. */
template <int D, int BK, int NTH>
__device__ __forceinline__ void kv_pipeline_step(bf16 *Ks, bf16 *Vs, const bf16 *kh, const bf16 *vh,
                                                 int n, int nkt, int j0, int T, int64_t kstr)
{
    if (n + 1 < nkt) {
        const int b = (n + 1) & 1;
        load_tile<D, BK, NTH>(Ks + b * BK * D, kh, j0 + BK, T, kstr);
        load_tile<D, BK, NTH>(Vs + b * BK * D, vh, j0 + BK, T, kstr);
        cp_commit();
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
}

template <int D, int NT>
__device__ __forceinline__ void wg_nt(float (&acc)[NT][4], uint32_t As, uint32_t Bs, int oa, int ob)
{
    static_assert(NT % 2 == 0, "n-tiles go in pairs");
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        ldsm4(a, As + off_kstep(oa, kk));
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            ldsm4(b, Bs + nt * 16 * D + off_kstep(ob, kk));
            mma16816(acc[nt], a, b[0], b[1]);
            mma16816(acc[nt + 1], a, b[2], b[3]);
        }
    }
}

/* acc (16 x D) += A (16 x 16 KS: registers) B, B (16 KS x D: smem tile stored [k][d] from
 * shared address Bs; oa = lane_off_a): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q. */
template <int D, int KS>
__device__ __forceinline__ void wg_rn(float (&acc)[D / 8][4], const uint32_t (&a)[KS][4], uint32_t Bs, int oa)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
        for (int dt = 0; dt < D / 8; dt += 2) {
            uint32_t b[4];
            ldsm4t(b, Bs + kk * 32 * D + off_dpair(oa, dt));
            mma16816(acc[dt], a[kk], b[0], b[1]);
            mma16816(acc[dt + 1], a[kk], b[2], b[3]);
        }
    }
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* rows (16 x D accumulators, C layout) * f[row half] -> dst rows r0, r0 + 8 (fp32, columns
 * d = 8 dt + 2 (lane % 4) + {0, 1}); rows >= T are not written. */
template <int D>
__device__ __forceinline__ void store_rows(float *dst, int64_t stride, int r0, int T, int t4,
                                           const float (&acc)[D / 8][4], float f0, float f1)
{
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = r0 + 8 * half;
        if (r >= T) continue;
        const float f = half ? f1 : f0;
        float *row = dst + (int64_t)r * stride + 2 * t4;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *reinterpret_cast<float2 *>(row + dt * 8) =
                make_float2(acc[dt][2 * half] * f, acc[dt][2 * half + 1] * f);
    }
}

/* ---- pre-passes ------------------------------------------------------------------------- */

/* dst (n) = bf16(src), n a multiple of 4. */
static __global__ void k_mma_to_bf16(bf16 *__restrict__ dst, const float *__restrict__ src, int64_t n4)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = reinterpret_cast<const float4 *>(src)[i];
        uint2 o;
        o.x = mma_pack(x.x, x.y);
        o.y = mma_pack(x.z, x.w);
        reinterpret_cast<uint2 *>(dst)[i] = o;
    }
}

/* dob (rows, D) = bf16(dout); delta (rows) = sum_d bf16(dout) out, one warp per row (a
 * (token, head) pair), lanes over float4 columns, reduced in a fixed order. D % 4 == 0. */
static __global__ void k_mma_dout(bf16 *__restrict__ dob, float *__restrict__ delta,
                           const float *__restrict__ dout, const float *__restrict__ out,
                           int64_t rows, int D)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const float4 *a = reinterpret_cast<const float4 *>(dout + r * D);
        const float4 *b = reinterpret_cast<const float4 *>(out + r * D);
        uint2 *o = reinterpret_cast<uint2 *>(dob + r * D);
        float s = 0.f;
        for (int c = lane; c < D / 4; c += 32) {
            const float4 x = a[c], y = b[c];
            uint2 p;
            p.x = mma_pack(x.x, x.y);
            p.y = mma_pack(x.z, x.w);
            o[c] = p;
            s = fmaf(mma_bf16_val(p.x), y.x, s);
            s = fmaf(mma_bf16_val(p.x >> 16), y.y, s);
            s = fmaf(mma_bf16_val(p.y), y.z, s);
            s = fmaf(mma_bf16_val(p.y >> 16), y.w, s);
        }
        for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0) delta[r] = s;
    }
}

/* dk, dv (T, Hkv, D)[t][g] = sum_{r < G} pk, pv (T, H, D)[t][g G + r], r in order. */
static __global__ void k_mma_group_sum(float *__restrict__ dk, float *__restrict__ dv,
                                const float *__restrict__ pk, const float *__restrict__ pv,
                                int64_t T, int H, int Hkv, int D)
{
    const int G = H / Hkv, D4 = D / 4;
    const int64_t n = T * Hkv * D4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d4 = i % D4, gg = (i / D4) % Hkv, t = i / ((int64_t)D4 * Hkv);
        const int64_t src = ((t * H + gg * G) * D) / 4 + d4;
        float4 a = reinterpret_cast<const float4 *>(pk)[src];
        float4 b = reinterpret_cast<const float4 *>(pv)[src];
        for (int r = 1; r < G; r++) {
            const float4 x = reinterpret_cast<const float4 *>(pk)[src + (int64_t)r * D4];
            const float4 y = reinterpret_cast<const float4 *>(pv)[src + (int64_t)r * D4];
            a.x += x.x; a.y += x.y; a.z += x.z; a.w += x.w;
            b.x += y.x; b.y += y.y; b.z += y.z; b.w += y.w;
        }
        reinterpret_cast<float4 *>(dk)[i] = a;
        reinterpret_cast<float4 *>(dv)[i] = b;
    }
}

/* ---- forward (Alg. 1) ------------------------------------------------------------------- */

/* Block (query head blockIdx.x, query tile gridDim.y - 1 - blockIdx.y: the blocks with the
 * longest key ranges start first, over all heads); out (T, H, D) fp32, lse (T, H); qb (T, H, D),
 * kb, vb (T, Hkv, D) bf16. */
template <int D>
static __global__ void __launch_bounds__(FWD_WARPS * 32, 2)
k_mma_fwd(float *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ qb,
          const bf16 *__restrict__ kb, const bf16 *__restrict__ vb, const int32_t *__restrict__ ss,
          int T, int H, int Hkv, float sl2)
{
    constexpr int NTH = FWD_WARPS * 32, BQ = FWD_WARPS * 16, BK = MMA_BK, NT = BK / 8, DT = D / 8;
    extern __shared__ uint4 mma_smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(mma_smem), *Ks = Qs + BQ * D, *Vs = Ks + 2 * BK * D;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int oa = lane_off_a(lane, D), ob = lane_off_b(lane, D);
    const int tile = gridDim.y - 1 - blockIdx.y, h = blockIdx.x, kvh = h / (H / Hkv);
    const int i0 = tile * BQ, i1 = min(T, i0 + BQ);
    const int jstart = mma_lo(ss, i0, T), nkt = (i1 - jstart + BK - 1) / BK;
    const int64_t qstr = (int64_t)H * D, kstr = (int64_t)Hkv * D;
    const bf16 *qh = qb + (int64_t)h * D, *kh = kb + (int64_t)kvh * D, *vh = vb + (int64_t)kvh * D;

    load_tile<D, BQ, NTH>(Qs, qh, i0, T, qstr);
    load_tile<D, BK, NTH>(Ks, kh, jstart, T, kstr);
    load_tile<D, BK, NTH>(Vs, vh, jstart, T, kstr);
    cp_commit();

    const int qa = i0 + 16 * w, r0 = qa + g, r1 = r0 + 8;
    const bool rows = qa < T;
    const int lo0 = mma_lo(ss, r0, T), lo1 = mma_lo(ss, r1, T);
    const int lo_first = rows ? mma_lo(ss, qa, T) : INT_MAX;
    const int lo_last = rows ? mma_lo(ss, min(qa + 15, T - 1), T) : INT_MAX;

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* l: this thread's partial sums */

    for (int n = 0; n < nkt; n++) {
        const int j0 = jstart + n * BK;
        kv_pipeline_step<D, BK, NTH>(Ks, Vs, kh, vh, n, nkt, j0, T, kstr);
        __syncthreads(); /* tile n (and Q) visible to every warp */
        bool act = false, msk = true;
        if (rows) qwarp_flags(T, qa, lo_first, lo_last, j0, BK, &act, &msk);
        if (act) {
            const uint32_t Kt = smem_u32(Ks + (n & 1) * BK * D), Vt = smem_u32(Vs + (n & 1) * BK * D);
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            wg_nt<D, NT>(s, smem_u32(Qs + 16 * w * D), Kt, oa, ob);
            float mx0 = m0, mx1 = m1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[nt][e] * sl2;
                    if (msk) {
                        const int j = j0 + nt * 8 + 2 * t4 + (e & 1);
                        const int i = e < 2 ? r0 : r1, lo = e < 2 ? lo0 : lo1;
                        if (j < lo || j > i) x = -INFINITY;
                    }
                    s[nt][e] = x;
                }
                mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
                mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
            }
            mx0 = quad_max(mx0);
            mx1 = quad_max(mx1);
            /* a row with nothing visible yet keeps m = -inf: exponentiate against 0 so that
             * every term is 2^-inf = 0 instead of NaN */
            const float ref0 = mx0 == -INFINITY ? 0.f : mx0, ref1 = mx1 == -INFINITY ? 0.f : mx1;
            const float c0 = exp2f(m0 - ref0), c1 = exp2f(m1 - ref1);
            m0 = mx0;
            m1 = mx1;
            float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                s[nt][0] = exp2f(s[nt][0] - ref0);
                s[nt][1] = exp2f(s[nt][1] - ref0);
                s[nt][2] = exp2f(s[nt][2] - ref1);
                s[nt][3] = exp2f(s[nt][3] - ref1);
                ps0 += s[nt][0] + s[nt][1];
                ps1 += s[nt][2] + s[nt][3];
            }
            l0 = l0 * c0 + ps0;
            l1 = l1 * c1 + ps1;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][0] *= c0;
                o[dt][1] *= c0;
                o[dt][2] *= c1;
                o[dt][3] *= c1;
            }
            uint32_t pa[NT / 2][4];
            c_to_a<NT>(pa, s);
            wg_rn<D, NT / 2>(o, pa, Vt, oa);
        }
        __syncthreads(); /* buffer n & 1 consumed before iteration n + 1 refills it */
    }
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    if (!rows) return;
    /* l > 0 for every row < T: key i is always visible to row i */
    store_rows<D>(out + (int64_t)h * D, qstr, r0, T, t4, o, 1.f / l0, 1.f / l1);
    if (t4 == 0) {
        if (r0 < T) lse[(int64_t)r0 * H + h] = (m0 + log2f(l0)) * MMA_LN2;
        if (r1 < T) lse[(int64_t)r1 * H + h] = (m1 + log2f(l1)) * MMA_LN2;
    }
}

/* ---- backward (Alg. 2) ------------------------------------------------------------------ */

/* dq: block (query head blockIdx.x, query tile gridDim.y - 1 - blockIdx.y), the forward's
 * key walk. dq (T, H, D) fp32 is written once per row. */
template <int D>
static __global__ void __launch_bounds__(BWD_WARPS * 32, 2)
k_mma_dq(float *__restrict__ dq, const bf16 *__restrict__ qb, const bf16 *__restrict__ kb,
         const bf16 *__restrict__ vb, const bf16 *__restrict__ dob, const float *__restrict__ lse,
         const float *__restrict__ delta, const int32_t *__restrict__ ss, int T, int H, int Hkv,
         float sl2, float scale)
{
    constexpr int NTH = BWD_WARPS * 32, BQ = BWD_WARPS * 16, BK = MMA_BK, NT = BK / 8, DT = D / 8;
    extern __shared__ uint4 mma_smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(mma_smem), *dOs = Qs + BQ * D, *Ks = dOs + BQ * D,
         *Vs = Ks + 2 * BK * D;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int oa = lane_off_a(lane, D), ob = lane_off_b(lane, D);
    const int tile = gridDim.y - 1 - blockIdx.y, h = blockIdx.x, kvh = h / (H / Hkv);
    const int i0 = tile * BQ, i1 = min(T, i0 + BQ);
    const int jstart = mma_lo(ss, i0, T), nkt = (i1 - jstart + BK - 1) / BK;
    const int64_t qstr = (int64_t)H * D, kstr = (int64_t)Hkv * D;
    const bf16 *kh = kb + (int64_t)kvh * D, *vh = vb + (int64_t)kvh * D;

    load_tile<D, BQ, NTH>(Qs, qb + (int64_t)h * D, i0, T, qstr);
    load_tile<D, BQ, NTH>(dOs, dob + (int64_t)h * D, i0, T, qstr);
    load_tile<D, BK, NTH>(Ks, kh, jstart, T, kstr);
    load_tile<D, BK, NTH>(Vs, vh, jstart, T, kstr);
    cp_commit();

    const int qa = i0 + 16 * w, r0 = qa + g, r1 = r0 + 8;
    const bool rows = qa < T;
    const int lo0 = mma_lo(ss, r0, T), lo1 = mma_lo(ss, r1, T);
    const int lo_first = rows ? mma_lo(ss, qa, T) : INT_MAX;
    const int lo_last = rows ? mma_lo(ss, min(qa + 15, T - 1), T) : INT_MAX;
    const float ls0 = r0 < T ? lse[(int64_t)r0 * H + h] * MMA_LOG2E : 0.f;
    const float ls1 = r1 < T ? lse[(int64_t)r1 * H + h] * MMA_LOG2E : 0.f;
    const float dl0 = r0 < T ? delta[(int64_t)r0 * H + h] : 0.f;
    const float dl1 = r1 < T ? delta[(int64_t)r1 * H + h] : 0.f;

    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.f;

    for (int n = 0; n < nkt; n++) {
        const int j0 = jstart + n * BK;
        kv_pipeline_step<D, BK, NTH>(Ks, Vs, kh, vh, n, nkt, j0, T, kstr);
        __syncthreads();
        bool act = false, msk = true;
        if (rows) qwarp_flags(T, qa, lo_first, lo_last, j0, BK, &act, &msk);
        if (act) {
            const uint32_t Kt = smem_u32(Ks + (n & 1) * BK * D), Vt = smem_u32(Vs + (n & 1) * BK * D);
            float s[NT][4], dp[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.f;
            wg_nt<D, NT>(s, smem_u32(Qs + 16 * w * D), Kt, oa, ob);
            wg_nt<D, NT>(dp, smem_u32(dOs + 16 * w * D), Vt, oa, ob);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    bool ok = true;
                    if (msk) {
                        const int j = j0 + nt * 8 + 2 * t4 + (e & 1);
                        const int i = e < 2 ? r0 : r1, lo = e < 2 ? lo0 : lo1;
                        ok = j >= lo && j <= i;
                    }
                    const float p = ok ? exp2f(fmaf(s[nt][e], sl2, -(e < 2 ? ls0 : ls1))) : 0.f;
                    s[nt][e] = p * (dp[nt][e] - (e < 2 ? dl0 : dl1)); /* dS */
                }
            }
            uint32_t dsa[NT / 2][4];
            c_to_a<NT>(dsa, s);
            wg_rn<D, NT / 2>(acc, dsa, Kt, oa);
        }
        __syncthreads();
    }
    if (!rows) return;
    store_rows<D>(dq + (int64_t)h * D, qstr, r0, T, t4, acc, scale, scale);
}

/* dk, dv: block (query head blockIdx.x, key tile blockIdx.y: the first tiles see the most
 * queries and start first). Writes rows of dk, dv at head h of (T, H, D) arrays: the outputs themselves
 * when H == Hkv, the per-query-head partials otherwise. */
template <int D>
static __global__ void __launch_bounds__(BWD_WARPS * 32, 2)
k_mma_dkv(float *__restrict__ dk, float *__restrict__ dv, const bf16 *__restrict__ qb,
          const bf16 *__restrict__ kb, const bf16 *__restrict__ vb, const bf16 *__restrict__ dob,
          const float *__restrict__ lse, const float *__restrict__ delta,
          const int32_t *__restrict__ ss, int T, int H, int Hkv, float sl2, float scale)
{
    constexpr int NTH = BWD_WARPS * 32, BKV = BWD_WARPS * 16, BQ = DKV_BQ, NT = DKV_SUB / 8, DT = D / 8;
    extern __shared__ uint4 mma_smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(mma_smem), *Vs = Ks + BKV * D, *Qs = Vs + BKV * D,
         *dOs = Qs + 2 * BQ * D;
    float *Ls = reinterpret_cast<float *>(dOs + 2 * BQ * D), *Dl = Ls + 2 * BQ;
    int *Lo = reinterpret_cast<int *>(Dl + 2 * BQ);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int oa = lane_off_a(lane, D), ob = lane_off_b(lane, D);
    const int h = blockIdx.x, kvh = h / (H / Hkv);
    const int j0 = blockIdx.y * BKV, j1 = min(T, j0 + BKV);
    const int64_t qstr = (int64_t)H * D, kstr = (int64_t)Hkv * D;
    const bf16 *qh = qb + (int64_t)h * D, *doh = dob + (int64_t)h * D;

    /* query tiles from j0 (causal) while their first row's sequence starts before j1 */
    int nqt = 0;
    for (int i0 = j0; i0 < T && mma_lo(ss, i0, T) < j1; i0 += BQ) nqt++;

    load_tile<D, BKV, NTH>(Ks, kb + (int64_t)kvh * D, j0, T, kstr);
    load_tile<D, BKV, NTH>(Vs, vb + (int64_t)kvh * D, j0, T, kstr);
    load_tile<D, BQ, NTH>(Qs, qh, j0, T, qstr);
    load_tile<D, BQ, NTH>(dOs, doh, j0, T, qstr);
    cp_commit();
    if (tid < BQ) {
        const int i = j0 + tid;
        Ls[tid] = i < T ? lse[(int64_t)i * H + h] * MMA_LOG2E : 0.f;
        Dl[tid] = i < T ? delta[(int64_t)i * H + h] : 0.f;
        Lo[tid] = mma_lo(ss, i, T);
    }

    const int ka = j0 + 16 * w, c0 = ka + g, c1 = c0 + 8; /* this warp's keys; this thread's rows */
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[dt][e] = dva[dt][e] = 0.f;

    for (int n = 0; n < nqt; n++) {
        const int i0 = j0 + n * BQ, buf = n & 1;
        if (n + 1 < nqt) {
            const int b = (n + 1) & 1, in = i0 + BQ;
            load_tile<D, BQ, NTH>(Qs + b * BQ * D, qh, in, T, qstr);
            load_tile<D, BQ, NTH>(dOs + b * BQ * D, doh, in, T, qstr);
            cp_commit();
            if (tid < BQ) {
                const int i = in + tid;
                Ls[b * BQ + tid] = i < T ? lse[(int64_t)i * H + h] * MMA_LOG2E : 0.f;
                Dl[b * BQ + tid] = i < T ? delta[(int64_t)i * H + h] : 0.f;
                Lo[b * BQ + tid] = mma_lo(ss, i, T);
            }
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const float *ls = Ls + buf * BQ, *dl = Dl + buf * BQ;
        const int *lo = Lo + buf * BQ;
        const uint32_t Qt = smem_u32(Qs + buf * BQ * D), dOt = smem_u32(dOs + buf * BQ * D);
#pragma unroll 1
        for (int sub = 0; sub < BQ / DKV_SUB; sub++) {
            const int q0 = sub * DKV_SUB, is = i0 + q0; /* sub-tile rows is .. is + DKV_SUB - 1 */
            bool act = false, msk = true;
            if (ka < T && is < T) {
                const int last = (is + DKV_SUB < T ? is + DKV_SUB : T) - 1 - i0;
                kwarp_flags(T, ka, is, DKV_SUB, lo[q0], lo[last], &act, &msk);
            }
            if (!act) continue;
            const uint32_t Qq = Qt + q0 * 2 * D, dOq = dOt + q0 * 2 * D;
            float st[NT][4], dpt[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.f;
            wg_nt<D, NT>(st, smem_u32(Ks + 16 * w * D), Qq, oa, ob);   /* S^T = K Q^T */
            wg_nt<D, NT>(dpt, smem_u32(Vs + 16 * w * D), dOq, oa, ob); /* dP^T = V dO^T */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int q = q0 + nt * 8 + 2 * t4; /* this thread's query columns q, q + 1 */
                const float2 lq = *reinterpret_cast<const float2 *>(ls + q);
                const float2 dd = *reinterpret_cast<const float2 *>(dl + q);
                const int2 loq = *reinterpret_cast<const int2 *>(lo + q);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int col = e & 1, j = e < 2 ? c0 : c1, i = i0 + q + col;
                    const bool ok = !msk || (j <= i && j >= (col ? loq.y : loq.x));
                    const float p = ok ? exp2f(fmaf(st[nt][e], sl2, -(col ? lq.y : lq.x))) : 0.f;
                    st[nt][e] = p;                                   /* P^T */
                    dpt[nt][e] = p * (dpt[nt][e] - (col ? dd.y : dd.x)); /* dS^T */
                }
            }
            uint32_t fa[NT / 2][4];
            c_to_a<NT>(fa, st);
            wg_rn<D, NT / 2>(dva, fa, dOq, oa); /* dV += P^T dO */
            c_to_a<NT>(fa, dpt);
            wg_rn<D, NT / 2>(dka, fa, Qq, oa);  /* dK += dS^T Q */
        }
        __syncthreads(); /* buffer n & 1 consumed before iteration n + 1 refills it */
    }
    if (ka >= T) return;
    store_rows<D>(dk + (int64_t)h * D, qstr, c0, T, t4, dka, scale, scale);
    store_rows<D>(dv + (int64_t)h * D, qstr, c0, T, t4, dva, 1.f, 1.f);
}

/* ---- host side ------------------------------------------------------------------------- */

/* Dynamic shared memory of each kernel (the layouts at the top of the kernels). */
static size_t smem_fwd(int D) { return (size_t)(FWD_WARPS * 16 + 4 * MMA_BK) * D * sizeof(bf16); }
static size_t smem_dq(int D) { return (size_t)(2 * BWD_WARPS * 16 + 4 * MMA_BK) * D * sizeof(bf16); }
static size_t smem_dkv(int D)
{
    return (size_t)(2 * BWD_WARPS * 16 + 4 * DKV_BQ) * D * sizeof(bf16) + 3 * 2 * DKV_BQ * sizeof(float);
}

#ifndef FT_MMA_EMU
static size_t mma_round(size_t n) { return (n + 255) & ~(size_t)255; }

/* Workspace bytes for T tokens (see the file comment); the attention workspace (cx->attn)
 * is sized with this by ft_cuda_attn_prepare when this path will run. */
extern "C" size_t ft_cuda_mma_attn_ws_bytes(int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    if (T < 1 || H < 1 || Hkv < 1 || D < 1) return 0;
    const size_t q = (size_t)T * H * D, k = (size_t)T * Hkv * D;
    size_t n = 2 * mma_round(q * 2) + 2 * mma_round(k * 2) + mma_round((size_t)T * H * 4);
    if (H != Hkv) n += 2 * mma_round(q * 4);
    return n;
}

typedef struct mma_ws {
    bf16 *q, *k, *v, *dout;
    float *delta, *pk, *pv;
} mma_ws;

/* Carves cx->attn, growing it (once, outside the step loop when the executor prepared the
 * largest shape) if a direct caller did not prepare it. */
static int mma_carve(ft_cuda_ctx *cx, mma_ws *w, const char *op, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    const size_t need = ft_cuda_mma_attn_ws_bytes(T, H, Hkv, D);
    if (need > cx->attn_bytes) {
        if (cx->attn) cudaFree(cx->attn);
        cx->attn = NULL;
        cx->attn_bytes = 0;
        if (cudaMalloc(&cx->attn, need) != cudaSuccess) {
            cudaGetLastError();
            cx->attn = NULL;
            return ft_err(-ENOMEM, "cuda %s: out of memory for %.1f MiB of attention workspace (T = %lld, "
                          "H = %lld, D = %lld)", op, need / 1048576.0, (long long)T, (long long)H, (long long)D);
        }
        cx->attn_bytes = need;
    }
    const size_t q = (size_t)T * H * D, k = (size_t)T * Hkv * D;
    char *p = (char *)cx->attn;
    w->q = (bf16 *)p, p += mma_round(q * 2);
    w->dout = (bf16 *)p, p += mma_round(q * 2);
    w->k = (bf16 *)p, p += mma_round(k * 2);
    w->v = (bf16 *)p, p += mma_round(k * 2);
    w->delta = (float *)p, p += mma_round((size_t)T * H * 4);
    w->pk = w->pv = NULL;
    if (H != Hkv) {
        w->pk = (float *)p, p += mma_round(q * 4);
        w->pv = (float *)p;
    }
    return 0;
}

static int mma_check(const char *op, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    if (T < 0 || H < 0 || Hkv < 1 || (H % Hkv) != 0)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, H = %lld, Hkv = %lld (expected H a multiple "
                      "of Hkv >= 1)", op, (long long)T, (long long)H, (long long)Hkv);
    if (D != 64 && D != 128)
        return ft_err(FT_E_INVALID, "cuda %s: head dim D = %lld; the tensor-core kernels take 64 or 128",
                      op, (long long)D);
    if (T > FT_CUDA_MMA_T_MAX)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, expected <= %lld (grid y of 64-row tiles)",
                      op, (long long)T, (long long)FT_CUDA_MMA_T_MAX);
    return 0;
}

/* The kernels' float4 / float2 accesses need 16-byte aligned buffers (the op table routes a
 * misaligned call elsewhere, attn_gemm.cu mma_fits); FT_E_INVALID for a direct caller. */
static int mma_aligned(const char *op, const void *const *p, int n)
{
    const int i = ft_cuda_misaligned16(p, n);
    if (i >= 0)
        return ft_err(FT_E_INVALID, "cuda %s: buffer %d at %p is not 16-byte aligned", op, i, p[i]);
    return 0;
}

template <typename K>
static int mma_smem_attr(ft_cuda_ctx *cx, K *kernel, size_t bytes, const char *op)
{
    int optin = 0;
    FT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cx->device));
    if ((size_t)optin < bytes)
        return ft_err(FT_E_UNSUPPORTED, "cuda %s: needs %zu bytes of shared memory per block, device %d "
                      "allows %d", op, bytes, cx->device, optin);
    FT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return 0;
}

static int to_bf16(ft_cuda_ctx *cx, bf16 *dst, const float *src, int64_t n)
{
    k_mma_to_bf16<<<ft_cuda_blocks(n / 4, 256), 256, 0, cx->stream>>>(dst, src, n / 4);
    FT_CUDA_LAUNCH("attention");
    return 0;
}

/* Carves the workspace and stages q, k, v in it as bf16 (both directions start so). */
static int mma_stage(ft_cuda_ctx *cx, mma_ws *w, const char *op, const float *q, const float *k,
                     const float *v, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    FT_TRY(mma_carve(cx, w, op, T, H, Hkv, D));
    FT_TRY(to_bf16(cx, w->q, q, T * H * D));
    FT_TRY(to_bf16(cx, w->k, k, T * Hkv * D));
    return to_bf16(cx, w->v, v, T * Hkv * D);
}

template <int D>
static int mma_fwd(ft_cuda_ctx *cx, float *out, float *lse, const mma_ws *w, const int32_t *ss,
                   int64_t T, int64_t H, int64_t Hkv, float scale)
{
    const char *op = "attention_fwd";
    const size_t sm = smem_fwd(D);
    FT_TRY(mma_smem_attr(cx, k_mma_fwd<D>, sm, op));
    const unsigned nq = (unsigned)((T + FWD_WARPS * 16 - 1) / (FWD_WARPS * 16));
    k_mma_fwd<D><<<dim3((unsigned)H, nq), FWD_WARPS * 32, sm, cx->stream>>>(
        out, lse, w->q, w->k, w->v, ss, (int)T, (int)H, (int)Hkv, scale * MMA_LOG2E);
    FT_CUDA_LAUNCH(op);
    return 0;
}

template <int D>
static int mma_bwd(ft_cuda_ctx *cx, float *dq, float *dk, float *dv, const float *lse,
                   const mma_ws *w, const int32_t *ss, int64_t T, int64_t H, int64_t Hkv, float scale)
{
    const char *op = "attention_bwd";
    const size_t sq = smem_dq(D), skv = smem_dkv(D);
    FT_TRY(mma_smem_attr(cx, k_mma_dq<D>, sq, op));
    FT_TRY(mma_smem_attr(cx, k_mma_dkv<D>, skv, op));
    const float sl2 = scale * MMA_LOG2E;
    const unsigned nq = (unsigned)((T + BWD_WARPS * 16 - 1) / (BWD_WARPS * 16));
    const unsigned nk = (unsigned)((T + BWD_WARPS * 16 - 1) / (BWD_WARPS * 16));
    float *pk = H == Hkv ? dk : w->pk, *pv = H == Hkv ? dv : w->pv;
    k_mma_dkv<D><<<dim3((unsigned)H, nk), BWD_WARPS * 32, skv, cx->stream>>>(
        pk, pv, w->q, w->k, w->v, w->dout, lse, w->delta, ss, (int)T, (int)H, (int)Hkv, sl2, scale);
    FT_CUDA_LAUNCH(op);
    k_mma_dq<D><<<dim3((unsigned)H, nq), BWD_WARPS * 32, sq, cx->stream>>>(
        dq, w->q, w->k, w->v, w->dout, lse, w->delta, ss, (int)T, (int)H, (int)Hkv, sl2, scale);
    FT_CUDA_LAUNCH(op);
    if (H != Hkv) {
        k_mma_group_sum<<<ft_cuda_blocks(T * Hkv * D / 4, 256), 256, 0, cx->stream>>>(
            dk, dv, w->pk, w->pv, T, (int)H, (int)Hkv, (int)D);
        FT_CUDA_LAUNCH(op);
    }
    return 0;
}

/* out (T, H, D), lse (T, H) = causal GQA attention of q (T, H, D) over k, v (T, Hkv, D), packed
 * sequences seq_start (T), fp32 device memory (kernels.h attention_fwd), on the tensor cores
 * with bf16 inputs. Returns 0, FT_E_INVALID (bad sizes, D not 64 or 128, NULL buffers),
 * -ENOMEM (workspace) or -EIO. */
extern "C" int ft_cuda_mma_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                                         const float *k, const float *v, const int32_t *seq_start,
                                         int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale)
{
    const char *op = "attention_fwd";
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(mma_check(op, T, H, Hkv, D));
    if (T == 0 || H == 0) return 0;
    if (!out || !lse || !q || !k || !v || !seq_start) return ft_err(FT_E_INVALID, "cuda %s: NULL buffer", op);
    const void *const al[] = {out, q, k, v};
    FT_TRY(mma_aligned(op, al, 4));
    mma_ws w;
    FT_TRY(mma_stage(cx, &w, op, q, k, v, T, H, Hkv, D));
    if (D == 64) return mma_fwd<64>(cx, out, lse, &w, seq_start, T, H, Hkv, scale);
    return mma_fwd<128>(cx, out, lse, &w, seq_start, T, H, Hkv, scale);
}

/* dq (T, H, D), dk, dv (T, Hkv, D) overwritten with the gradients (kernels.h attention_bwd),
 * given the forward's out and lse. Returns as ft_cuda_mma_attention_fwd. */
extern "C" int ft_cuda_mma_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse,
                                         const int32_t *seq_start, int64_t T, int64_t H,
                                         int64_t Hkv, int64_t D, float scale)
{
    const char *op = "attention_bwd";
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(mma_check(op, T, H, Hkv, D));
    if (T == 0 || H == 0) return 0;
    if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse || !seq_start)
        return ft_err(FT_E_INVALID, "cuda %s: NULL buffer", op);
    const void *const al[] = {dq, dk, dv, dout, q, k, v, out};
    FT_TRY(mma_aligned(op, al, 8));
    mma_ws w;
    FT_TRY(mma_stage(cx, &w, op, q, k, v, T, H, Hkv, D));
    k_mma_dout<<<ft_cuda_blocks(T * H, 8), 256, 0, cx->stream>>>(w.dout, w.delta, dout, out, T * H, (int)D);
    FT_CUDA_LAUNCH(op);
    if (D == 64) return mma_bwd<64>(cx, dq, dk, dv, lse, &w, seq_start, T, H, Hkv, scale);
    return mma_bwd<128>(cx, dq, dk, dv, lse, &w, seq_start, T, H, Hkv, scale);
}

/* ---- host self-check of the index math (no GPU) ------------------------------------------ */

/* Fragment coordinates of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane
 * l = 4 g + t: A (16 x 16) register i, half e -> (g + 8 (i & 1), 2 t + e + 8 (i >> 1));
 * B (16 x 8) register i, half e -> (k = 2 t + e + 8 i, n = g); C element e -> (g + 8 (e >> 1),
 * 2 t + (e & 1)). ldmatrix (PTX ISA, "ldmatrix"): lanes 8 m .. 8 m + 7 give the row addresses
 * of matrix m; without .trans lane l receives row l / 4, elements 2 (l % 4) + {0, 1} of
 * matrix i in register i; with .trans, element l / 4 of rows 2 (l % 4) + {0, 1}. */
static int sc_fail(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sc_fail(char *msg, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (msg && n) vsnprintf(msg, n, fmt, ap);
    va_end(ap);
    return FT_E_INVALID;
}

/* Byte offset of the 16-byte smem row `lane` hands to ldmatrix, computed as the kernels do:
 * A (b_pattern 0) or B [n][k] (b_pattern 1) block at rows r0 .., k-step c0 / 16 (wg_nt), or a
 * .trans block at rows r0 .., d-tile pair c0 / 8 (wg_rn). */
static int sc_addr(int D, int r0, int c0, int b_pattern, int trans, int lane)
{
    if (trans) return r0 * 2 * D + off_dpair(lane_off_a(lane, D), c0 / 8);
    return r0 * 2 * D + off_kstep(b_pattern ? lane_off_b(lane, D) : lane_off_a(lane, D), c0 / 16);
}

/* ldmatrix emulation over a tile whose element at offset mma_sw(r, c, D) is tagged r * D + c:
 * the tag that register `reg`, half `e` of lane `l` receives. */
static int sc_tag(int D, int r0, int c0, int b_pattern, int trans, int l, int reg, int e)
{
    const int src = trans ? 8 * reg + 2 * (l & 3) + e : 8 * reg + (l >> 2);
    const int off = sc_addr(D, r0, c0, b_pattern, trans, src) / 2 + (trans ? (l >> 2) : 2 * (l & 3) + e);
    /* invert the swizzle: offset -> (row, col) */
    const int rr = off / D, pc = (off % D) >> 3, cc = ((pc ^ (rr & 7)) << 3) | (off & 7);
    return rr * D + cc;
}

static int selfcheck_frags(int D, char *msg, size_t n)
{
    /* the swizzle is a permutation of each row, and keeps 16-byte chunks whole */
    for (int r = 0; r < 16; r++) {
        int seen[128] = {0};
        for (int c = 0; c < D; c++) {
            int o = mma_sw(r, c, D) - r * D;
            if (o < 0 || o >= D || seen[o]++ || (o & 7) != (c & 7))
                return sc_fail(msg, n, "swizzle D=%d: row %d col %d -> %d", D, r, c, o);
        }
    }
    for (int r0 = 0; r0 < 64; r0 += 16)
        for (int k0 = 0; k0 < D; k0 += 16)
            for (int l = 0; l < 32; l++) {
                const int g = l >> 2, t = l & 3;
                for (int reg = 0; reg < 4; reg++)
                    for (int e = 0; e < 2; e++) {
                        /* A (wg_nt: rows r0 + 0..15, k k0 + 0..15) */
                        int want = (r0 + g + 8 * (reg & 1)) * D + k0 + 2 * t + e + 8 * (reg >> 1);
                        if (sc_tag(D, r0, k0, 0, 0, l, reg, e) != want)
                            return sc_fail(msg, n, "A fragment D=%d k0=%d lane %d reg %d", D, k0, l, reg);
                        /* B from [n][k] rows r0 + 0..15 (n-tiles r0, r0 + 8), k k0 ..: register
                         * reg is b(reg & 1) of n-tile r0 + 8 (reg >> 1) */
                        want = (r0 + 8 * (reg >> 1) + g) * D + k0 + 2 * t + e + 8 * (reg & 1);
                        if (sc_tag(D, r0, k0, 1, 0, l, reg, e) != want)
                            return sc_fail(msg, n, "B fragment D=%d k0=%d lane %d reg %d", D, k0, l, reg);
                        /* B from [k][n] (wg_rn, .trans): k rows r0 + 0..15, n columns k0 + 0..15;
                         * register reg is b(reg & 1) of n-tile k0 + 8 (reg >> 1) */
                        want = (r0 + 2 * t + e + 8 * (reg & 1)) * D + k0 + 8 * (reg >> 1) + g;
                        if (sc_tag(D, r0, k0, 0, 1, l, reg, e) != want)
                            return sc_fail(msg, n, "B^T fragment D=%d n0=%d lane %d reg %d", D, k0, l, reg);
                    }
            }
    /* bank conflicts: the 8 rows of each ldmatrix matrix fall in 8 different 16-byte groups of
     * a 128-byte line; and the kernels' XOR-ed offsets are mma_sw's */
    for (int pat = 0; pat < 3; pat++)
        for (int r0 = 0; r0 < 64; r0 += 16)
            for (int k0 = 0; k0 < D; k0 += 16)
                for (int m = 0; m < 4; m++) {
                    int used = 0;
                    for (int r = 0; r < 8; r++) {
                        const int l = 8 * m + r;
                        const int off = sc_addr(D, r0, k0, pat == 1, pat == 2, l);
                        const int row = r0 + (pat == 1 ? lm_row_b(l) : lm_row_a(l));
                        const int col = k0 + (pat == 1 ? lm_col_b(l) : lm_col_a(l));
                        if (off != 2 * mma_sw(row, col, D))
                            return sc_fail(msg, n, "lane offset D=%d pattern %d k0=%d lane %d", D, pat, k0, l);
                        const int grp = (off / 16) & 7;
                        if (used & (1 << grp))
                            return sc_fail(msg, n, "bank conflict D=%d pattern %d k0=%d matrix %d", D, pat, k0, m);
                        used |= 1 << grp;
                    }
                }
    /* C accumulators -> A fragments (c_to_a): tag each C element with its (row, col) in a
     * 16 x 16 block (exact in bf16: < 256) */
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        float c[2][4];
        for (int tl = 0; tl < 2; tl++)
            for (int e = 0; e < 4; e++) c[tl][e] = (float)((g + 8 * (e >> 1)) * 16 + 8 * tl + 2 * t + (e & 1));
        uint32_t a[1][4];
        c_to_a<2>(a, c);
        for (int reg = 0; reg < 4; reg++)
            for (int e = 0; e < 2; e++) {
                const unsigned short bits = (unsigned short)(a[0][reg] >> (16 * e));
                uint32_t u = (uint32_t)bits << 16;
                float got;
                memcpy(&got, &u, 4);
                const int want = (g + 8 * (reg & 1)) * 16 + 2 * t + e + 8 * (reg >> 1);
                if ((int)got != want) return sc_fail(msg, n, "C->A lane %d reg %d half %d: %d", l, reg, e, (int)got);
            }
    }
    return 0;
}

/* Walks the kernels' tile loops for one packing and compares with brute force: every visible
 * (row, key) pair lies in exactly one visited tile whose warp is active; a skipped warp-tile
 * holds no visible pair; an unmasked one holds only visible pairs. */
static int selfcheck_tiles(const int32_t *ss, int T, char *msg, size_t n)
{
    const int BQF = FWD_WARPS * 16, BQB = BWD_WARPS * 16;
    unsigned char *cnt = (unsigned char *)calloc((size_t)T * T, 1);
    if (!cnt) return -ENOMEM;
    int rc = 0;
#define VIS(i, j) ((i) < T && (j) < T && (j) <= (i) && (j) >= mma_lo(ss, (i), T))
    /* query-row walk (k_mma_fwd with 128-row tiles, k_mma_dq with 64) */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        const int BQ = pass ? BQB : BQF;
        memset(cnt, 0, (size_t)T * T);
        for (int i0 = 0; i0 < T && !rc; i0 += BQ) {
            const int i1 = i0 + BQ < T ? i0 + BQ : T, js = mma_lo(ss, i0, T), nkt = (i1 - js + MMA_BK - 1) / MMA_BK;
            for (int qa = i0; qa < i0 + BQ && qa < T && !rc; qa += 16) {
                const int lf = mma_lo(ss, qa, T), ll = mma_lo(ss, qa + 15 < T ? qa + 15 : T - 1, T);
                for (int nn = 0; nn < nkt && !rc; nn++) {
                    const int j0 = js + nn * MMA_BK;
                    bool act, msk;
                    qwarp_flags(T, qa, lf, ll, j0, MMA_BK, &act, &msk);
                    int vis = 0, all = 1;
                    for (int i = qa; i < qa + 16; i++)
                        for (int j = j0; j < j0 + MMA_BK; j++) {
                            const int v = VIS(i, j);
                            vis |= v;
                            all &= v;
                            if (v && act) cnt[(size_t)i * T + j]++;
                        }
                    if (!act && vis)
                        rc = sc_fail(msg, n, "query walk %d: T=%d rows %d keys %d skipped with a visible "
                                     "pair", pass, T, qa, j0);
                    if (act && !msk && !all)
                        rc = sc_fail(msg, n, "query walk %d: T=%d rows %d keys %d unmasked with a hidden "
                                     "pair", pass, T, qa, j0);
                }
            }
        }
        for (int i = 0; i < T && !rc; i++)
            for (int j = 0; j < T && !rc; j++)
                if (cnt[(size_t)i * T + j] != VIS(i, j))
                    rc = sc_fail(msg, n, "query walk %d: T=%d pair (%d, %d) covered %d times", pass, T, i,
                                 j, cnt[(size_t)i * T + j]);
    }
    /* key-row walk (k_mma_dkv) */
    memset(cnt, 0, (size_t)T * T);
    for (int j0 = 0; j0 < T && !rc; j0 += BQB) {
        const int j1 = j0 + BQB < T ? j0 + BQB : T;
        for (int i0 = j0; i0 < T && mma_lo(ss, i0, T) < j1 && !rc; i0 += DKV_BQ) {
            for (int is = i0; is < i0 + DKV_BQ && !rc; is += DKV_SUB) {
                if (is >= T) continue;
                const int last = (is + DKV_SUB < T ? is + DKV_SUB : T) - 1;
                for (int ka = j0; ka < j0 + BQB && ka < T && !rc; ka += 16) {
                    bool act, msk;
                    kwarp_flags(T, ka, is, DKV_SUB, mma_lo(ss, is, T), mma_lo(ss, last, T), &act, &msk);
                    int vis = 0, all = 1;
                    for (int j = ka; j < ka + 16; j++)
                        for (int i = is; i < is + DKV_SUB; i++) {
                            const int v = VIS(i, j);
                            vis |= v;
                            all &= v;
                            if (v && act) cnt[(size_t)i * T + j]++;
                        }
                    if (!act && vis)
                        rc = sc_fail(msg, n, "key walk: T=%d keys %d rows %d skipped with a visible pair",
                                     T, ka, is);
                    if (act && !msk && !all)
                        rc = sc_fail(msg, n, "key walk: T=%d keys %d rows %d unmasked with a hidden pair",
                                     T, ka, is);
                }
            }
        }
    }
    for (int i = 0; i < T && !rc; i++)
        for (int j = 0; j < T && !rc; j++)
            if (cnt[(size_t)i * T + j] != VIS(i, j))
                rc = sc_fail(msg, n, "key walk: T=%d pair (%d, %d) covered %d times", T, i, j,
                             cnt[(size_t)i * T + j]);
#undef VIS
    free(cnt);
    return rc;
}

/* Host-only check of the kernels' index math (above); 0, or FT_E_INVALID with the first
 * mismatch described in msg. Needs no GPU. */
extern "C" int ft_cuda_mma_attn_selfcheck(char *msg, size_t n)
{
    if (msg && n) msg[0] = 0;
    int rc = selfcheck_frags(64, msg, n);
    if (!rc) rc = selfcheck_frags(128, msg, n);
    const int Ts[] = {1, 2, 15, 17, 64, 100, 128, 129, 300, 513};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0] && !rc; a++)
        for (int pk = 0; pk < 5 && !rc; pk++) {
            const int T = Ts[a];
            int32_t *ss = (int32_t *)malloc((size_t)T * sizeof(int32_t));
            if (!ss) return -ENOMEM;
            int start = 0, len = 1;
            for (int t = 0; t < T; t++) {
                if (t == 0 || t - start >= len) {
                    start = t;
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    const int u = (int)(x >> 40);
                    len = pk == 0 ? T : pk == 1 ? 1 : pk == 2 ? 1 + u % 16 : pk == 3 ? 1 + u % 200 : 1 + u % 70;
                }
                ss[t] = start;
            }
            rc = selfcheck_tiles(ss, T, msg, n);
            free(ss);
        }
    return rc;
}
#endif /* FT_MMA_EMU */
