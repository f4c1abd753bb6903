/* attn.cu - causal GQA attention over packed sequences on the GPU, FlashAttention-2 style
 * (Dao 2023, "FlashAttention-2", Alg. 1 forward and Alg. 2 backward), fp32 on CUDA cores.
 * Semantics: kernels/kernels.h (attention_fwd, attention_bwd, attention_kv_fwd); the CPU twin
 * is kernels/cpu/attn_impl.h, which these kernels match to fp32 rounding.
 *
 * Formulas (row i = query token, j = key token, scale = 1/sqrt(D) usually):
 *   forward   S_ij = scale q_i.k_j for seq_start[i] <= j <= i (else masked, P_ij = 0);
 *             online softmax over key tiles: m_i <- max(m_i, max_j S_ij),
 *             l_i <- l_i exp(m_old - m_i) + sum_j exp(S_ij - m_i),
 *             o_i <- o_i exp(m_old - m_i) + sum_j exp(S_ij - m_i) v_j;
 *             at the end o_i /= l_i and lse_i = m_i + log l_i (kept for the backward).
 *   backward  P_ij = exp(S_ij - lse_i) (recomputed from q, k, lse: no stored P);
 *             dP_ij = do_i.v_j;  Delta_i = do_i.o_i (= sum_j P_ij dP_ij);
 *             dS_ij = P_ij (dP_ij - Delta_i);
 *             dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij do_i.
 *   Query head h reads kv head g = h / (H / Hkv) (GQA); dk, dv of head g sum over the H / Hkv
 *   query heads of its group.
 *
 * Tiling: tiles of BQ = 32 query rows and BK = 32 key rows; a block has 256 threads, 8 per
 * tile row. In a query-row block thread t owns row r = t / 8, the 4 score columns
 * c = t % 8 + 8 cc (cc < 4) of each tile, and the accumulator columns d = t % 8 + 8 dc of
 * its row (dc < DC = ceil(D / 8) rounded up to 8, 16 or 32: registers, D <= 256), so the
 * softmax statistics of a row live in the 8 threads (one quarter warp) that also hold its
 * output and row reductions are three shuffles. A key-row block is the same with the roles of
 * queries and keys swapped. Shared memory holds the tiles with rows padded to D + 1 floats
 * (no bank conflicts when 8 threads read 8 rows at the same d).
 *   - k_fa_fwd: block = (query tile, query head h). Visits key tiles from seq_start[i0] to
 *     i1 - 1 only (i0, i1 = the tile's rows), so packed short sequences cost sum(len^2), not
 *     T^2; entries outside a row's own sequence or above the diagonal are masked. Also serves
 *     attention_kv_fwd: query row i at absolute position p + i, keys 0 .. p + i (seq_start
 *     NULL = one sequence from key 0, lse not written).
 *   - k_fa_delta: Delta (T, H) into cx->work, one warp per (row, head).
 *   - k_fa_dq: block = (query tile, query head): the forward's key walk, recomputing P and
 *     dP per key tile; dq accumulates in registers.
 *   - k_fa_dkv: block = (key tile j0 .. j1-1, kv head g): loops over the H / Hkv query heads
 *     of the group and over the query tiles that can see its keys (i0 from j0 while
 *     seq_start[i0] < j1); dk, dv accumulate in registers.
 * Every output element is written by exactly one thread, summing in a fixed order: no
 * atomics, the same bits on every run.
 *
 * Memory: no (T, T) matrix and nothing proportional to T beyond the inputs and outputs, plus
 * Delta (T * H floats of cx->work) in the backward. Shared memory per block (fp32, Dp = D + 1):
 *   fwd (BQ + BK) Dp + BQ (BK + 1)           D = 64: 20.9 KB, 128: 37.2 KB, 256: 70.0 KB
 *   dq  (2 BQ + BK) Dp + BQ (BK + 1)         D = 64: 29.2 KB, 128: 53.7 KB, 256: 102.9 KB
 *   dkv 2 (BQ + BK) Dp + 2 BK (BQ + 1) + 2 BQ   64: 42.0 KB, 128: 74.8 KB, 256: 140.3 KB
 * (above 48 KB the kernel's dynamic shared memory limit is raised with cudaFuncSetAttribute;
 * sm_90 allows 227 KB per block).
 *
 * seq_start lives in device memory and is not validated here (the CPU op checks it); values
 * are clamped so that a malformed one cannot make a kernel read outside q, k, v.
 * Everything runs on cx->stream; no allocation, no synchronization.
 */
#include "kernels/cuda/cuda_common.h"

#include <math.h>

#define FA_BQ 32        /* query rows per tile */
#define FA_BK 32        /* key rows per tile */
#define FA_THREADS 256  /* 8 threads per tile row */
#define FA_MAX_D 256

/* ---- device helpers ------------------------------------------------------------------ */

/* Max / sum over the 8 consecutive lanes that share a tile row. */
__device__ __forceinline__ float fa_max8(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}

__device__ __forceinline__ float fa_sum8(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x + __shfl_xor_sync(0xffffffffu, x, 1);
}

/* dst[rr * Dp + d] = src[(row0 + rr) * stride + d] for rr < nrows, d < D; rows >= end are 0.
 * src already points at the head's first element. All threads of the block call it. */
__device__ __forceinline__ void fa_load(float *dst, const float *src, int64_t row0, int64_t end,
                                        int64_t stride, int D, int Dp, int nrows)
{
    for (int e = threadIdx.x; e < nrows * D; e += FA_THREADS) {
        int rr = e / D, d = e - rr * D;
        int64_t row = row0 + rr;
        dst[rr * Dp + d] = row < end ? src[row * stride + d] : 0.f;
    }
}

__device__ __forceinline__ float fa_dot(const float *a, const float *b, int D)
{
    float s = 0.f;
    for (int d = 0; d < D; d++) s = fmaf(a[d], b[d], s);
    return s;
}

/* First key of query row i (its sequence start), clamped to [0, i]. */
__device__ __forceinline__ int64_t fa_lo(const int32_t *ss, int64_t i)
{
    if (!ss) return 0;
    int64_t s = ss[i];
    return s < 0 ? 0 : (s > i ? i : s);
}

/* ---- forward (Alg. 1); also attention against a KV cache --------------------------- */

/* Block (query tile blockIdx.x, query head blockIdx.y). Query rows i < n_q at absolute
 * positions p + i; q, out (n_q, H, D); k, v (p + n_q, Hkv, D); lse (n_q, H) or NULL;
 * ss (n_q) or NULL (one sequence from key 0). */
template <int DC>
__global__ void __launch_bounds__(FA_THREADS)
k_fa_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
         const int32_t *ss, int64_t n_q, int64_t p, int64_t H, int64_t Hkv, int D, float scale)
{
    extern __shared__ float sm[];
    const int Dp = D + 1, tid = threadIdx.x, r = tid >> 3, l8 = tid & 7;
    float *Qs = sm, *KVs = Qs + FA_BQ * Dp, *Ps = KVs + FA_BK * Dp;
    const int64_t h = blockIdx.y, g = h / (H / Hkv), qs = H * D, ks = Hkv * D;
    const int64_t i0 = (int64_t)blockIdx.x * FA_BQ;
    const int64_t i1 = min(n_q, i0 + (int64_t)FA_BQ);
    const int64_t i = i0 + r;
    const bool row_ok = i < n_q;
    const int64_t ia = p + i, lo = row_ok ? fa_lo(ss, i) : 0;
    const int64_t jstart = fa_lo(ss, i0), jend = p + i1; /* keys [jstart, jend) */

    fa_load(Qs, q + h * D, i0, n_q, qs, D, Dp, FA_BQ);
    float acc[DC];
#pragma unroll
    for (int c = 0; c < DC; c++) acc[c] = 0.f;
    float m = -INFINITY, l = 0.f;

    for (int64_t j0 = jstart; j0 < jend; j0 += FA_BK) {
        __syncthreads(); /* Q loaded / previous V tile consumed */
        fa_load(KVs, k + g * D, j0, jend, ks, D, Dp, FA_BK);
        __syncthreads();
        float s[4];
        float mt = -INFINITY;
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            const int c = l8 + 8 * cc;
            const int64_t j = j0 + c;
            const bool ok = row_ok && j < jend && j >= lo && j <= ia;
            const float x = fa_dot(Qs + r * Dp, KVs + c * Dp, D) * scale;
            s[cc] = ok ? x : -INFINITY;
            mt = fmaxf(mt, s[cc]);
        }
        mt = fa_max8(mt);
        const float mn = fmaxf(m, mt);
        /* mn = -inf: nothing of this row seen yet (acc = 0, l = 0): keep everything at 0 */
        const float corr = mn == -INFINITY ? 1.f : expf(m - mn);
        float rs = 0.f;
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            const float pv = s[cc] == -INFINITY ? 0.f : expf(s[cc] - mn);
            Ps[r * (FA_BK + 1) + l8 + 8 * cc] = pv;
            rs += pv;
        }
        rs = fa_sum8(rs);
        l = l * corr + rs;
        m = mn;
        __syncthreads(); /* K tile consumed, P written */
        fa_load(KVs, v + g * D, j0, jend, ks, D, Dp, FA_BK);
        __syncthreads();
#pragma unroll
        for (int c = 0; c < DC; c++) acc[c] *= corr;
        for (int jj = 0; jj < FA_BK; jj++) {
            const float pv = Ps[r * (FA_BK + 1) + jj];
            const float *vr = KVs + jj * Dp;
#pragma unroll
            for (int c = 0; c < DC; c++) {
                const int d = l8 + 8 * c;
                if (d < D) acc[c] = fmaf(pv, vr[d], acc[c]);
            }
        }
    }
    if (row_ok) {
        /* l >= exp(S_ii - m) > 0: key i is always visible to row i */
        const float inv = 1.f / l;
        float *o = out + i * qs + h * D;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const int d = l8 + 8 * c;
            if (d < D) o[d] = acc[c] * inv;
        }
        if (lse && l8 == 0) lse[i * H + h] = m + logf(l);
    }
}

/* ---- backward (Alg. 2) ---------------------------------------------------------------- */

/* delta (T, H) = rowwise dot of dout and out, one warp per (token, head) row of D. */
__global__ void k_fa_delta(float *delta, const float *dout, const float *out, int64_t n, int D)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; w < n;
         w += warps) {
        const float *a = dout + w * D, *b = out + w * D;
        float s = 0.f;
        for (int d = lane; d < D; d += 32) s = fmaf(a[d], b[d], s);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) delta[w] = s;
    }
}

/* dq: block (query tile blockIdx.x, query head blockIdx.y), same key walk as the forward. */
template <int DC>
__global__ void __launch_bounds__(FA_THREADS)
k_fa_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
        const float *lse, const float *delta, const int32_t *ss, int64_t T, int64_t H,
        int64_t Hkv, int D, float scale)
{
    extern __shared__ float sm[];
    const int Dp = D + 1, tid = threadIdx.x, r = tid >> 3, l8 = tid & 7;
    float *Qs = sm, *dOs = Qs + FA_BQ * Dp, *KVs = dOs + FA_BQ * Dp, *dSs = KVs + FA_BK * Dp;
    const int64_t h = blockIdx.y, g = h / (H / Hkv), qs = H * D, ks = Hkv * D;
    const int64_t i0 = (int64_t)blockIdx.x * FA_BQ;
    const int64_t i1 = min(T, i0 + (int64_t)FA_BQ);
    const int64_t i = i0 + r;
    const bool row_ok = i < T;
    const int64_t lo = row_ok ? fa_lo(ss, i) : 0;
    const float li = row_ok ? lse[i * H + h] : 0.f, dl = row_ok ? delta[i * H + h] : 0.f;
    const int64_t jstart = fa_lo(ss, i0), jend = i1;

    fa_load(Qs, q + h * D, i0, T, qs, D, Dp, FA_BQ);
    fa_load(dOs, dout + h * D, i0, T, qs, D, Dp, FA_BQ);
    float acc[DC];
#pragma unroll
    for (int c = 0; c < DC; c++) acc[c] = 0.f;

    for (int64_t j0 = jstart; j0 < jend; j0 += FA_BK) {
        __syncthreads(); /* Q, dO loaded / previous K tile consumed */
        fa_load(KVs, v + g * D, j0, jend, ks, D, Dp, FA_BK);
        __syncthreads();
        float dp[4];
#pragma unroll
        for (int cc = 0; cc < 4; cc++) dp[cc] = fa_dot(dOs + r * Dp, KVs + (l8 + 8 * cc) * Dp, D);
        __syncthreads(); /* V tile consumed */
        fa_load(KVs, k + g * D, j0, jend, ks, D, Dp, FA_BK);
        __syncthreads();
#pragma unroll
        for (int cc = 0; cc < 4; cc++) {
            const int c = l8 + 8 * cc;
            const int64_t j = j0 + c;
            const bool ok = row_ok && j < jend && j >= lo && j <= i;
            const float x = fa_dot(Qs + r * Dp, KVs + c * Dp, D) * scale;
            dSs[r * (FA_BK + 1) + c] = ok ? expf(x - li) * (dp[cc] - dl) : 0.f;
        }
        __syncthreads(); /* dS row written (read by the same 8 threads; a full barrier for simplicity) */
        for (int jj = 0; jj < FA_BK; jj++) {
            const float ds = dSs[r * (FA_BK + 1) + jj];
            const float *kr = KVs + jj * Dp;
#pragma unroll
            for (int c = 0; c < DC; c++) {
                const int d = l8 + 8 * c;
                if (d < D) acc[c] = fmaf(ds, kr[d], acc[c]);
            }
        }
    }
    if (row_ok) {
        float *o = dq + i * qs + h * D;
#pragma unroll
        for (int c = 0; c < DC; c++) {
            const int d = l8 + 8 * c;
            if (d < D) o[d] = acc[c] * scale;
        }
    }
}

/* dk, dv: block (key tile blockIdx.x, kv head blockIdx.y). Thread t owns key row c = t / 8
 * of the tile, query columns r = t % 8 + 8 rr of each query tile and accumulator columns
 * d = t % 8 + 8 dc. */
template <int DC>
__global__ void __launch_bounds__(FA_THREADS)
k_fa_dkv(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
         const float *lse, const float *delta, const int32_t *ss, int64_t T, int64_t H,
         int64_t Hkv, int D, float scale)
{
    extern __shared__ float sm[];
    const int Dp = D + 1, tid = threadIdx.x, c = tid >> 3, l8 = tid & 7;
    const int Pp = FA_BQ + 1;
    float *Ks = sm, *Vs = Ks + FA_BK * Dp, *Qs = Vs + FA_BK * Dp, *dOs = Qs + FA_BQ * Dp;
    float *Ps = dOs + FA_BQ * Dp, *dSs = Ps + FA_BK * Pp, *Ls = dSs + FA_BK * Pp, *Dl = Ls + FA_BQ;
    const int64_t g = blockIdx.y, G = H / Hkv, qs = H * D, ks = Hkv * D;
    const int64_t j0 = (int64_t)blockIdx.x * FA_BK;
    const int64_t j1 = min(T, j0 + (int64_t)FA_BK);
    const int64_t j = j0 + c;
    const bool key_ok = j < T;

    fa_load(Ks, k + g * D, j0, T, ks, D, Dp, FA_BK);
    fa_load(Vs, v + g * D, j0, T, ks, D, Dp, FA_BK);
    float dka[DC], dva[DC];
#pragma unroll
    for (int e = 0; e < DC; e++) dka[e] = dva[e] = 0.f;

    for (int64_t h = g * G; h < (g + 1) * G; h++) {
        /* query tiles whose rows can see a key of [j0, j1): rows i >= j0 (causal) whose
         * sequence starts at or before j1 - 1; seq_start is non-decreasing, so stop at the
         * first tile whose first row starts a sequence at or after j1 */
        for (int64_t i0 = j0; i0 < T && (int64_t)ss[i0] < j1; i0 += FA_BQ) {
            __syncthreads(); /* previous tile's Q, dO, P, dS consumed (K, V loaded) */
            fa_load(Qs, q + h * D, i0, T, qs, D, Dp, FA_BQ);
            fa_load(dOs, dout + h * D, i0, T, qs, D, Dp, FA_BQ);
            if (tid < FA_BQ) {
                const int64_t ii = i0 + tid;
                Ls[tid] = ii < T ? lse[ii * H + h] : 0.f;
                Dl[tid] = ii < T ? delta[ii * H + h] : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < 4; rr++) {
                const int r = l8 + 8 * rr;
                const int64_t i = i0 + r;
                const bool ok = key_ok && i < T && j >= fa_lo(ss, i) && j <= i;
                float pv = 0.f, ds = 0.f;
                if (ok) {
                    const float x = fa_dot(Ks + c * Dp, Qs + r * Dp, D) * scale;
                    const float dpv = fa_dot(Vs + c * Dp, dOs + r * Dp, D);
                    pv = expf(x - Ls[r]);
                    ds = pv * (dpv - Dl[r]);
                }
                Ps[c * Pp + r] = pv;
                dSs[c * Pp + r] = ds;
            }
            __syncthreads();
            for (int r = 0; r < FA_BQ; r++) {
                const float pv = Ps[c * Pp + r], ds = dSs[c * Pp + r];
                const float *dor = dOs + r * Dp, *qr = Qs + r * Dp;
#pragma unroll
                for (int e = 0; e < DC; e++) {
                    const int d = l8 + 8 * e;
                    if (d < D) {
                        dva[e] = fmaf(pv, dor[d], dva[e]);
                        dka[e] = fmaf(ds, qr[d], dka[e]);
                    }
                }
            }
        }
    }
    if (key_ok) {
        float *okr = dk + j * ks + g * D, *ovr = dv + j * ks + g * D;
#pragma unroll
        for (int e = 0; e < DC; e++) {
            const int d = l8 + 8 * e;
            if (d < D) {
                okr[d] = dka[e] * scale;
                ovr[d] = dva[e];
            }
        }
    }
}

/* ---- host side ----------------------------------------------------------------------- */

static size_t fa_smem_fwd(int D) { return sizeof(float) * ((size_t)(FA_BQ + FA_BK) * (D + 1) + FA_BQ * (FA_BK + 1)); }
static size_t fa_smem_dq(int D) { return sizeof(float) * ((size_t)(2 * FA_BQ + FA_BK) * (D + 1) + FA_BQ * (FA_BK + 1)); }
static size_t fa_smem_dkv(int D)
{
    return sizeof(float) *
           ((size_t)2 * (FA_BQ + FA_BK) * (D + 1) + 2 * FA_BK * (FA_BQ + 1) + 2 * FA_BQ);
}

/* Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KB;
 * FT_E_UNSUPPORTED when the device cannot give that much per block. */
template <typename K>
static int fa_smem(ft_cuda_ctx *cx, K *kernel, size_t bytes, const char *op)
{
    if (bytes <= (size_t)48 * 1024) return 0;
    int optin = 0;
    FT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cx->device));
    if ((size_t)optin < bytes)
        return ft_err(FT_E_UNSUPPORTED,
                      "cuda %s: needs %zu bytes of shared memory per block, device %d allows %d",
                      op, bytes, cx->device, optin);
    FT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return 0;
}

static int fa_check(const char *op, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    if (T < 0 || H < 0 || Hkv < 0)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, H = %lld, Hkv = %lld, expected >= 0", op,
                      (long long)T, (long long)H, (long long)Hkv);
    if (H > 0 && (Hkv < 1 || H % Hkv != 0))
        return ft_err(FT_E_INVALID, "cuda %s: H = %lld, expected a multiple of Hkv = %lld", op,
                      (long long)H, (long long)Hkv);
    if (D < 1 || D > FA_MAX_D)
        return ft_err(FT_E_INVALID, "cuda %s: head dim D = %lld, expected 1..%d", op,
                      (long long)D, FA_MAX_D);
    if (H > 65535)
        return ft_err(FT_E_INVALID, "cuda %s: H = %lld, expected <= 65535 (grid y)", op,
                      (long long)H);
    if (T > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, expected <= %d (int32 seq_start)", op,
                      (long long)T, INT32_MAX);
    return 0;
}

/* Forward launch shared by attention_fwd (p = 0, ss, lse) and attention_kv_fwd. */
template <int DC>
static int fa_fwd_launch(ft_cuda_ctx *cx, float *out, float *lse, const float *q, const float *k,
                         const float *v, const int32_t *ss, int64_t n_q, int64_t p, int64_t H,
                         int64_t Hkv, int D, float scale, const char *op)
{
    const size_t sm = fa_smem_fwd(D);
    FT_TRY(fa_smem(cx, k_fa_fwd<DC>, sm, op));
    dim3 grid((unsigned)((n_q + FA_BQ - 1) / FA_BQ), (unsigned)H);
    k_fa_fwd<DC><<<grid, FA_THREADS, sm, cx->stream>>>(out, lse, q, k, v, ss, n_q, p, H, Hkv, D, scale);
    FT_CUDA_LAUNCH(op);
    return 0;
}

static int fa_fwd(ft_cuda_ctx *cx, float *out, float *lse, const float *q, const float *k,
                  const float *v, const int32_t *ss, int64_t n_q, int64_t p, int64_t H,
                  int64_t Hkv, int64_t D, float scale, const char *op)
{
    if (D <= 64) return fa_fwd_launch<8>(cx, out, lse, q, k, v, ss, n_q, p, H, Hkv, (int)D, scale, op);
    if (D <= 128) return fa_fwd_launch<16>(cx, out, lse, q, k, v, ss, n_q, p, H, Hkv, (int)D, scale, op);
    return fa_fwd_launch<32>(cx, out, lse, q, k, v, ss, n_q, p, H, Hkv, (int)D, scale, op);
}

template <int DC>
static int fa_bwd_launch(ft_cuda_ctx *cx, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v, const float *lse,
                         const float *delta, const int32_t *ss, int64_t T, int64_t H,
                         int64_t Hkv, int D, float scale)
{
    const char *op = "attention_bwd";
    const size_t sq = fa_smem_dq(D), skv = fa_smem_dkv(D);
    FT_TRY(fa_smem(cx, k_fa_dq<DC>, sq, op));
    FT_TRY(fa_smem(cx, k_fa_dkv<DC>, skv, op));
    const unsigned nt = (unsigned)((T + FA_BQ - 1) / FA_BQ), nk = (unsigned)((T + FA_BK - 1) / FA_BK);
    k_fa_dq<DC><<<dim3(nt, (unsigned)H), FA_THREADS, sq, cx->stream>>>(
        dq, dout, q, k, v, lse, delta, ss, T, H, Hkv, D, scale);
    FT_CUDA_LAUNCH(op);
    k_fa_dkv<DC><<<dim3(nk, (unsigned)Hkv), FA_THREADS, skv, cx->stream>>>(
        dk, dv, dout, q, k, v, lse, delta, ss, T, H, Hkv, D, scale);
    FT_CUDA_LAUNCH(op);
    return 0;
}

/* out (T, H, D), lse (T, H) = causal GQA attention of q (T, H, D) over k, v (T, Hkv, D) with
 * packed sequences seq_start (T), all fp32 device memory (kernels.h attention_fwd). Returns
 * 0, FT_E_INVALID (negative sizes, H % Hkv != 0, D outside 1..256, NULL pointers), or -EIO
 * on a launch error. */
extern "C" int ft_cuda_flash_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                                           const float *k, const float *v,
                                           const int32_t *seq_start, int64_t T, int64_t H,
                                           int64_t Hkv, int64_t D, float scale)
{
    const char *op = "attention_fwd";
    FT_TRY(fa_check(op, T, H, Hkv, D));
    if (T == 0 || H == 0) return 0;
    if (!out || !lse || !q || !k || !v || !seq_start)
        return ft_err(FT_E_INVALID, "cuda %s: NULL buffer", op);
    return fa_fwd(FT_CUDA_CTX(be), out, lse, q, k, v, seq_start, T, 0, H, Hkv, D, scale, op);
}

/* dq (T, H, D), dk, dv (T, Hkv, D) overwritten with the gradients (kernels.h attention_bwd);
 * Delta (T * H floats) goes to cx->work. Returns 0, FT_E_INVALID, -ENOMEM (cx->work too
 * small for Delta) or -EIO. */
extern "C" int ft_cuda_flash_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                                           const float *dout, const float *q, const float *k,
                                           const float *v, const float *out, const float *lse,
                                           const int32_t *seq_start, int64_t T, int64_t H,
                                           int64_t Hkv, int64_t D, float scale)
{
    const char *op = "attention_bwd";
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(fa_check(op, T, H, Hkv, D));
    if (T == 0 || H == 0) return 0;
    if (!dq || !dk || !dv || !dout || !q || !k || !v || !out || !lse || !seq_start)
        return ft_err(FT_E_INVALID, "cuda %s: NULL buffer", op);
    const size_t need = (size_t)T * (size_t)H * sizeof(float);
    if (need > cx->work_bytes)
        return ft_err(-ENOMEM, "cuda %s: Delta needs %zu bytes of the context workspace, it has %zu",
                      op, need, cx->work_bytes);
    float *delta = (float *)cx->work;
    k_fa_delta<<<ft_cuda_blocks(T * H, 8), 256, 0, cx->stream>>>(delta, dout, out, T * H, (int)D);
    FT_CUDA_LAUNCH(op);
    if (D <= 64)
        return fa_bwd_launch<8>(cx, dq, dk, dv, dout, q, k, v, lse, delta, seq_start, T, H, Hkv, (int)D, scale);
    if (D <= 128)
        return fa_bwd_launch<16>(cx, dq, dk, dv, dout, q, k, v, lse, delta, seq_start, T, H, Hkv, (int)D, scale);
    return fa_bwd_launch<32>(cx, dq, dk, dv, dout, q, k, v, lse, delta, seq_start, T, H, Hkv, (int)D, scale);
}

/* out (n_q, H, D) = attention of n_q queries at positions p .. p + n_q - 1 against a cache
 * k, v (p + n_q, Hkv, D) (kernels.h attention_kv_fwd), with the forward kernel (no lse).
 * Returns 0, FT_E_INVALID (p or n_q < 0, H % Hkv != 0, D outside 1..256) or -EIO. */
extern "C" int ft_cuda_flash_attention_kv_fwd(ft_backend *be, float *out, const float *q,
                                              const float *k, const float *v, int64_t p,
                                              int64_t n_q, int64_t H, int64_t Hkv, int64_t D,
                                              float scale)
{
    const char *op = "attention_kv_fwd";
    if (p < 0)
        return ft_err(FT_E_INVALID, "cuda %s: p = %lld, expected >= 0", op, (long long)p);
    FT_TRY(fa_check(op, n_q, H, Hkv, D));
    if (p + n_q > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda %s: p + n_q = %lld, expected <= %d", op,
                      (long long)(p + n_q), INT32_MAX);
    if (n_q == 0 || H == 0) return 0;
    if (!out || !q || !k || !v) return ft_err(FT_E_INVALID, "cuda %s: NULL buffer", op);
    return fa_fwd(FT_CUDA_CTX(be), out, NULL, q, k, v, NULL, n_q, p, H, Hkv, D, scale, op);
}
