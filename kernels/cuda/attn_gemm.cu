/* attn_gemm.cu - causal GQA attention over packed sequences on the tensor cores, forward and
 * backward (kernels.h attention_fwd / attention_bwd), built from cuBLAS batched GEMMs over
 * query tiles plus three small kernels.
 *
 * Formulas as the CPU twin (kernels/cpu/attn_impl.h; FlashAttention-2, Dao 2023, Alg. 1/2):
 *   forward   S_ij = scale q_i.k_j for seq_start[i] <= j <= i;  lse_i = log sum_j exp(S_ij);
 *             P_ij = exp(S_ij - lse_i);  o_i = sum_j P_ij v_j
 *   backward  dP_ij = do_i.v_j;  Delta_i = do_i.o_i;  dS_ij = P_ij (dP_ij - Delta_i);
 *             dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij do_i
 *
 * Layout: q, k, v are first copied head-major, (H, T, D), with k and v expanded from Hkv to H
 * heads (query head h reads kv head h / (H / Hkv)), so every product below is one strided
 * batched GEMM over the H heads. Queries are processed in tiles of Bq rows [i0, i1); a tile
 * only meets keys [seq_start[i0], i1) (seq_start is non-decreasing), so a packed row of short
 * sequences costs about sum(len^2) and one long sequence about T^2 / 2 (+ T Bq / 2 for the
 * diagonal tiles). Per tile the (H, Bq, Lk) scores live in the workspace (Bq is chosen so two
 * such tiles fit), never a (T, T) matrix. The backward accumulates dk, dv per query head over
 * the tiles in order (beta = 1) and sums the H / Hkv heads of each group at the end: no
 * atomics, the same bits on every run.
 * Precision follows the context: by default the head-major copies of q, k, v, dO and the
 * probabilities P and dS are stored in bf16 and every GEMM runs on bf16 tensor cores with
 * fp32 accumulation and fp32 outputs (scores S and dP, the o, dq, dk, dv accumulators), as
 * FlashAttention-2 does in bf16; set precise, everything is fp32 with fp32 GEMMs. Softmax,
 * lse and Delta are computed in fp32 from the fp32 scores.
 *
 * Workspace (ft_cuda_attn_prepare, once at setup): 4 head-major inputs (bf16 or fp32) and 4
 * fp32 accumulators of T*H*D, two fp32 score tiles and two P/dS tiles, Delta (T*H);
 * seq_start is copied to the host once per call (T int32) to plan the tiles.
 *
 * Routing (attn_route): be->tune.attn (kernels.h; the program's FTUNE_ATTN) picks the kernels: `mma` (the
 * default: the FlashAttention-2 tensor-core kernels of attn_mma.cu when the context is not
 * precise and D is 64 or 128, else this file), `gemm` (this file, with attn.cu for packed short
 * sequences), `flash` (attn.cu's fp32 kernels, D <= 256). attn_mma.cu became the default once
 * tests/gpu/test_cuda_attn passed on a GPU (H200, 2026-11-28): on the Llama-3-8B shape at seq
 * 2048 a step ran 11,404-11,468 tok/s against this file's 9,363-9,421 (+22%), and one
 * attention call (H 32/8, D 128, one sequence of 2048) took 0.193 + 0.629 ms (fwd + bwd)
 * against 0.761 + 1.358 ms (bench/results/h200-2026-11-28).
 */
#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ROUTE_GEMM, ROUTE_FLASH, ROUTE_MMA };

/* The kernels attention_fwd/bwd use for head dim D (see the file comment). */
static int attn_route(const ft_backend *be, const ft_cuda_ctx *cx, int64_t D)
{
    if (be->tune.attn == FT_ATTN_GEMM) return ROUTE_GEMM;
    if (be->tune.attn == FT_ATTN_FLASH && D <= 256) return ROUTE_FLASH;
    return cx->gemm_bf16 && (D == 64 || D == 128) ? ROUTE_MMA : ROUTE_GEMM; /* mma, unset, other */
}

/* attn_mma.cu reads q, k, v, out and dout as float4 and writes float2/float4 (a misaligned
 * address would be a sticky CUDA fault, ending the context): a call whose buffers are not all
 * 16-byte aligned, or whose T is over its grid's limit, takes this file's kernels instead. */
static int mma_fits(int64_t T, const void *const *p, int n)
{
    return T <= FT_CUDA_MMA_T_MAX && ft_cuda_misaligned16(p, n) < 0;
}

#define TILE_MAX 512      /* query rows per tile, at most */
#define SM_THREADS 256

__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }

/* out (H, T, D)[h][t][:] = in (T, Hin, D)[t][h / rep][:], stored as ST */
template <typename ST>
__global__ void k_to_heads(ST *out, const float *in, int64_t T, int64_t H, int64_t Hin, int64_t D)
{
    int64_t n = H * T * D, rep = H / Hin;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = i % D, t = (i / D) % T, h = i / (D * T);
        st(&out[i], in[(t * Hin + h / rep) * D + d]);
    }
}

/* out (T, Hout, D)[t][g][:] = sum_{r < rep} in (H, T, D)[g * rep + r][t][:], rep = H / Hout */
__global__ void k_from_heads(float *out, const float *in, int64_t T, int64_t H, int64_t Hout,
                             int64_t D)
{
    int64_t n = T * Hout * D, rep = H / Hout;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = i % D, g = (i / D) % Hout, t = i / (D * Hout);
        float s = 0.f;
        for (int64_t r = 0; r < rep; r++) s += in[((g * rep + r) * T + t) * D + d];
        out[i] = s;
    }
}

/* Delta (T, H)[t][h] = sum_d dout[t][h][d] * out[t][h][d]; one warp per (t, h). */
__global__ void k_delta(float *delta, const float *dout, const float *out, int64_t n, int64_t D)
{
    int lane = threadIdx.x & 31;
    int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    if (r >= n) return;
    float s = 0.f;
    for (int64_t d = lane; d < D; d += 32) s += dout[r * D + d] * out[r * D + d];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[r] = s;
}

__device__ float blk_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < SM_THREADS / 32; w++) r = fmaxf(r, sh[w]);
    __syncthreads();
    return r;
}

__device__ float blk_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = 0.f;
    for (int w = 0; w < SM_THREADS / 32; w++) r += sh[w];
    __syncthreads();
    return r;
}

/* Forward softmax of one tile: block (row r of the tile, head h). S (H, nb, Lk) holds
 * scale q.k for keys s0 .. s0 + Lk - 1; keys outside [seq_start[i], i] get P = 0. Writes
 * P in place and lse (T, H). */
template <typename ST>
__global__ void k_softmax_fwd(const float *S, ST *P, float *lse, const int32_t *ss, int64_t i0,
                              int64_t nb, int64_t Lk, int64_t s0, int64_t H)
{
    __shared__ float sh[SM_THREADS / 32];
    int64_t r = blockIdx.x, h = blockIdx.y, i = i0 + r;
    const float *row = S + (h * nb + r) * Lk;
    ST *prow = P + (h * nb + r) * Lk;
    int64_t lo = ss[i] - s0, hi = i - s0; /* valid key columns [lo, hi] */
    float m = -INFINITY;
    for (int64_t j = lo + threadIdx.x; j <= hi; j += SM_THREADS) m = fmaxf(m, row[j]);
    m = blk_max(m, sh);
    float s = 0.f;
    for (int64_t j = lo + threadIdx.x; j <= hi; j += SM_THREADS) s += expf(row[j] - m);
    s = blk_sum(s, sh);
    float l = m + logf(s);
    for (int64_t j = threadIdx.x; j < Lk; j += SM_THREADS)
        st(&prow[j], (j >= lo && j <= hi) ? expf(row[j] - l) : 0.f);
    if (threadIdx.x == 0) lse[i * H + h] = l;
}

/* Backward of one tile: P = exp(S - lse) (masked) into P, dS = P (dP - Delta) into dS. */
template <typename ST>
__global__ void k_softmax_bwd(const float *S, const float *dP, ST *P, ST *dS, const float *lse,
                              const float *delta, const int32_t *ss, int64_t i0, int64_t nb,
                              int64_t Lk, int64_t s0, int64_t H)
{
    int64_t r = blockIdx.x, h = blockIdx.y, i = i0 + r;
    const float *srow = S + (h * nb + r) * Lk, *drow = dP + (h * nb + r) * Lk;
    ST *prow = P + (h * nb + r) * Lk, *dsrow = dS + (h * nb + r) * Lk;
    int64_t lo = ss[i] - s0, hi = i - s0;
    float l = lse[i * H + h], dl = delta[i * H + h];
    for (int64_t j = threadIdx.x; j < Lk; j += SM_THREADS) {
        float p = (j >= lo && j <= hi) ? expf(srow[j] - l) : 0.f;
        st(&prow[j], p);
        st(&dsrow[j], p * (drow[j] - dl));
    }
}

template <typename ST> struct cuda_type;
template <> struct cuda_type<float> { static constexpr cudaDataType v = CUDA_R_32F; };
template <> struct cuda_type<__nv_bfloat16> { static constexpr cudaDataType v = CUDA_R_16BF; };

/* Row-major strided-batched C[b] (m, n) = alpha op(A[b]) op(B[b]) + beta C[b] over `batch`
 * matrices (the cu_gemm mapping: cuBLAS sees B first); A and B of type ST, C fp32. bf16
 * inputs run on the tensor cores with fp32 accumulation; fp32 inputs follow the context. */
template <typename ST>
static int gemm_sb(ft_cuda_ctx *cx, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const ST *a, int64_t lda, int64_t sa, const ST *b, int64_t ldb, int64_t sb,
                   float beta, float *c, int64_t ldc, int64_t sc, int64_t batch)
{
    cublasComputeType_t ct = cuda_type<ST>::v == CUDA_R_16BF || !cx->gemm_bf16
                                 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
    FT_BLAS_TRY(cx->bl.GemmStridedBatchedEx(cx->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                            &alpha, b, cuda_type<ST>::v, (int)ldb, sb, a,
                                            cuda_type<ST>::v, (int)lda, sa, &beta, c, CUDA_R_32F,
                                            (int)ldc, sc, (int)batch, ct, CUBLAS_GEMM_DEFAULT));
    return 0;
}

template <typename ST> struct attn_ws {
    ST *qh, *kx, *vx, *doh;      /* (H, T, D) each: the GEMM inputs */
    float *oh, *dkx, *dvx, *dqh; /* (H, T, D) each: fp32 accumulators */
    float *s, *dp;               /* (H, Bq, T) each: fp32 scores */
    ST *p, *ds;                  /* (H, Bq, T) each: P and dS as GEMM inputs */
    float *delta;                /* (T, H) */
    int64_t Bq;
};

static size_t round_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* Bytes of workspace for T tokens with inputs of es bytes per element. */
static size_t ws_bytes(int64_t T, int64_t H, int64_t D, int64_t Bq, size_t es)
{
    size_t hd = (size_t)(H * T * D), tile = (size_t)(H * Bq * T);
    return 4 * round_up(hd * es) + 4 * round_up(hd * 4) + 2 * round_up(tile * 4) +
           2 * round_up(tile * es) + round_up((size_t)(T * H) * 4);
}

static int64_t pick_bq(int64_t T)
{
    int64_t bq = TILE_MAX;
    /* keep one tile of scores near 64 MiB per head-row budget: long sequences, smaller tiles */
    while (bq > 64 && (int64_t)bq * T > ((int64_t)1 << 20)) bq /= 2;
    return bq < T ? bq : (T < 1 ? 1 : T);
}

static int ft_cuda_attn_prepare_bytes(ft_cuda_ctx *cx, size_t need)
{
    if (cx->attn_bytes >= need) return 0;
    if (cx->attn) cudaFree(cx->attn);
    cx->attn = NULL;
    cx->attn_bytes = 0;
    FT_CUDA_TRY(cudaMalloc(&cx->attn, need));
    cx->attn_bytes = need;
    return 0;
}

/* Sizes the workspace of the path attention will take (attn_route) for up to T tokens. */
extern "C" int ft_cuda_attn_prepare(ft_backend *be, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    if (T < 1 || H < 1 || D < 1) return 0;
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    switch (attn_route(be, cx, D)) {
    case ROUTE_MMA: return ft_cuda_attn_prepare_bytes(cx, ft_cuda_mma_attn_ws_bytes(T, H, Hkv, D));
    case ROUTE_FLASH: return 0; /* Delta lives in cx->work */
    default: return ft_cuda_attn_prepare_bytes(cx, ws_bytes(T, H, D, pick_bq(T), sizeof(float)));
    }
}

template <typename ST>
static int carve_ws(ft_cuda_ctx *cx, attn_ws<ST> *w, const char *op, int64_t T, int64_t H, int64_t D)
{
    w->Bq = pick_bq(T);
    size_t need = ws_bytes(T, H, D, w->Bq, sizeof(ST));
    /* The executor prepares the largest shape at setup; a direct caller (tests) that did not
     * gets the workspace grown here, once. */
    if (need > cx->attn_bytes && ft_cuda_attn_prepare_bytes(cx, need) < 0)
        return ft_err(-ENOMEM, "cuda %s: out of memory for %.1f MiB of attention workspace (T = %lld, "
                      "H = %lld, D = %lld)", op, need / 1048576.0, (long long)T, (long long)H, (long long)D);
    char *p = (char *)cx->attn;
    size_t hd = (size_t)(H * T * D), tile = (size_t)(H * w->Bq * T);
    ST **in[4] = {&w->qh, &w->kx, &w->vx, &w->doh};
    for (int i = 0; i < 4; i++, p += round_up(hd * sizeof(ST))) *in[i] = (ST *)p;
    float **acc[4] = {&w->oh, &w->dkx, &w->dvx, &w->dqh};
    for (int i = 0; i < 4; i++, p += round_up(hd * 4)) *acc[i] = (float *)p;
    w->s = (float *)p;
    p += round_up(tile * 4);
    w->dp = (float *)p;
    p += round_up(tile * 4);
    w->p = (ST *)p;
    p += round_up(tile * sizeof(ST));
    w->ds = (ST *)p;
    p += round_up(tile * sizeof(ST));
    w->delta = (float *)p;
    return 0;
}

/* seq_start to the host (the tile plan) and its contract check, as the CPU twin's. */
static int plan_host(ft_cuda_ctx *cx, const char *op, const int32_t *seq_start, int64_t T)
{
    if (cx->ss_cap < T) {
        int32_t *p = (int32_t *)realloc(cx->ss_host, (size_t)T * sizeof(int32_t));
        if (!p) return ft_err(-ENOMEM, "cuda %s: out of host memory", op);
        cx->ss_host = p;
        cx->ss_cap = T;
    }
    FT_CUDA_TRY(cudaMemcpyAsync(cx->ss_host, seq_start, (size_t)T * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, cx->stream));
    FT_CUDA_TRY(cudaStreamSynchronize(cx->stream));
    for (int64_t t = 0; t < T; t++) {
        int32_t s = cx->ss_host[t];
        int ok = t == 0 ? s == 0 : ((int64_t)s == t || s == cx->ss_host[t - 1]);
        if (!ok)
            return ft_err(FT_E_INVALID, "cuda %s: seq_start[%lld] = %d, expected %lld or seq_start[%lld] = %d",
                          op, (long long)t, s, (long long)t, (long long)t - 1, t ? cx->ss_host[t - 1] : 0);
    }
    return 0;
}

static int check_shape(const char *op, int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    if (T < 0 || H < 0 || Hkv < 1 || (H % Hkv) || D < 1 || D > 1024 || T > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, H = %lld, Hkv = %lld, D = %lld (expected "
                      "H a multiple of Hkv, 1 <= D <= 1024)", op, (long long)T, (long long)H,
                      (long long)Hkv, (long long)D);
    return 0;
}

#define LAUNCH_N(n) ft_cuda_blocks((n), 256), 256, 0, cx->stream

template <typename ST>
static int attn_fwd(ft_cuda_ctx *cx, float *out, float *lse, const float *q, const float *k,
                    const float *v, const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                    int64_t D, float scale)
{
    attn_ws<ST> w;
    FT_TRY(carve_ws(cx, &w, "attention_fwd", T, H, D));
    FT_TRY(plan_host(cx, "attention_fwd", seq_start, T));
    int64_t n = H * T * D;
    k_to_heads<<<LAUNCH_N(n)>>>(w.qh, q, T, H, H, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.kx, k, T, H, Hkv, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.vx, v, T, H, Hkv, D);
    FT_CUDA_LAUNCH("attention_fwd");
    for (int64_t i0 = 0; i0 < T; i0 += w.Bq) {
        int64_t nb = T - i0 < w.Bq ? T - i0 : w.Bq, i1 = i0 + nb, s0 = cx->ss_host[i0], Lk = i1 - s0;
        /* S[h] (nb, Lk) = scale Qh[h][i0:i1] Kx[h][s0:i1]^T */
        FT_TRY(gemm_sb(cx, 0, 1, nb, Lk, D, scale, w.qh + i0 * D, D, T * D, w.kx + s0 * D, D, T * D,
                       0.0f, w.s, Lk, nb * Lk, H));
        k_softmax_fwd<<<dim3((unsigned)nb, (unsigned)H), SM_THREADS, 0, cx->stream>>>(
            w.s, w.p, lse, seq_start, i0, nb, Lk, s0, H);
        FT_CUDA_LAUNCH("attention_fwd");
        /* Oh[h][i0:i1] = P[h] Vx[h][s0:i1] */
        FT_TRY(gemm_sb(cx, 0, 0, nb, D, Lk, 1.0f, w.p, Lk, nb * Lk, w.vx + s0 * D, D, T * D, 0.0f,
                       w.oh + i0 * D, D, T * D, H));
    }
    k_from_heads<<<LAUNCH_N(n)>>>(out, w.oh, T, H, H, D);
    FT_CUDA_LAUNCH("attention_fwd");
    return 0;
}

template <typename ST>
static int attn_bwd(ft_cuda_ctx *cx, float *dq, float *dk, float *dv, const float *dout,
                    const float *q, const float *k, const float *v, const float *out,
                    const float *lse, const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                    int64_t D, float scale)
{
    attn_ws<ST> w;
    FT_TRY(carve_ws(cx, &w, "attention_bwd", T, H, D));
    FT_TRY(plan_host(cx, "attention_bwd", seq_start, T));
    int64_t n = H * T * D;
    k_delta<<<(unsigned)((T * H + 7) / 8), 256, 0, cx->stream>>>(w.delta, dout, out, T * H, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.qh, q, T, H, H, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.kx, k, T, H, Hkv, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.vx, v, T, H, Hkv, D);
    k_to_heads<<<LAUNCH_N(n)>>>(w.doh, dout, T, H, H, D);
    FT_CUDA_LAUNCH("attention_bwd");
    FT_CUDA_TRY(cudaMemsetAsync(w.dkx, 0, (size_t)n * sizeof(float), cx->stream));
    FT_CUDA_TRY(cudaMemsetAsync(w.dvx, 0, (size_t)n * sizeof(float), cx->stream));
    for (int64_t i0 = 0; i0 < T; i0 += w.Bq) {
        int64_t nb = T - i0 < w.Bq ? T - i0 : w.Bq, i1 = i0 + nb, s0 = cx->ss_host[i0], Lk = i1 - s0;
        const ST *qt = w.qh + i0 * D, *dot = w.doh + i0 * D;
        /* S = scale Q K^T, dP = dO V^T (fp32), then P and dS */
        FT_TRY(gemm_sb(cx, 0, 1, nb, Lk, D, scale, qt, D, T * D, w.kx + s0 * D, D, T * D, 0.0f,
                       w.s, Lk, nb * Lk, H));
        FT_TRY(gemm_sb(cx, 0, 1, nb, Lk, D, 1.0f, dot, D, T * D, w.vx + s0 * D, D, T * D, 0.0f,
                       w.dp, Lk, nb * Lk, H));
        k_softmax_bwd<<<dim3((unsigned)nb, (unsigned)H), SM_THREADS, 0, cx->stream>>>(
            w.s, w.dp, w.p, w.ds, lse, w.delta, seq_start, i0, nb, Lk, s0, H);
        FT_CUDA_LAUNCH("attention_bwd");
        /* dV[h][s0:i1] += P^T dO;  dK[h][s0:i1] += scale dS^T Q;  dQ[h][i0:i1] = scale dS K */
        FT_TRY(gemm_sb(cx, 1, 0, Lk, D, nb, 1.0f, w.p, Lk, nb * Lk, dot, D, T * D, 1.0f,
                       w.dvx + s0 * D, D, T * D, H));
        FT_TRY(gemm_sb(cx, 1, 0, Lk, D, nb, scale, w.ds, Lk, nb * Lk, qt, D, T * D, 1.0f,
                       w.dkx + s0 * D, D, T * D, H));
        FT_TRY(gemm_sb(cx, 0, 0, nb, D, Lk, scale, w.ds, Lk, nb * Lk, w.kx + s0 * D, D, T * D,
                       0.0f, w.dqh + i0 * D, D, T * D, H));
    }
    k_from_heads<<<LAUNCH_N(n)>>>(dq, w.dqh, T, H, H, D);
    k_from_heads<<<LAUNCH_N(T * Hkv * D)>>>(dk, w.dkx, T, H, Hkv, D);
    k_from_heads<<<LAUNCH_N(T * Hkv * D)>>>(dv, w.dvx, T, H, Hkv, D);
    FT_CUDA_LAUNCH("attention_bwd");
    return 0;
}

/* Packed rows of short sequences go to the FlashAttention kernel (attn.cu): it visits only
 * each sequence's own keys, where the query tiles here would pay for many small GEMMs (on the
 * H100, T = 32768 of 1..300-token sequences: 1.3 / 4.1 ms there against 12.7 / 26.4 ms here);
 * long sequences stay on the tensor cores here (T = 1024, one sequence: 0.35 / 0.59 ms here
 * against 1.6 / 6.1 ms). The threshold is the mean sequence length. */
#define SHORT_SEQ_MEAN 256

static int use_flash(ft_cuda_ctx *cx, const char *op, const int32_t *seq_start, int64_t T)
{
    FT_TRY(plan_host(cx, op, seq_start, T));
    int64_t n_seq = 0;
    for (int64_t t = 0; t < T; t++) n_seq += cx->ss_host[t] == t;
    return n_seq > 0 && T / n_seq < SHORT_SEQ_MEAN;
}

extern "C" int ft_cuda_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                                     const float *k, const float *v, const int32_t *seq_start,
                                     int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(check_shape("attention_fwd", T, H, Hkv, D));
    if (!T || !H) return 0;
    const int route = attn_route(be, cx, D);
    const void *const mp[] = {out, q, k, v};
    if (route == ROUTE_MMA && mma_fits(T, mp, 4))
        return ft_cuda_mma_attention_fwd(be, out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
    if (route == ROUTE_FLASH)
        return ft_cuda_flash_attention_fwd(be, out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
    int fl = use_flash(cx, "attention_fwd", seq_start, T);
    if (fl < 0) return fl;
    if (fl && D <= 256) return ft_cuda_flash_attention_fwd(be, out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
    if (cx->gemm_bf16)
        return attn_fwd<__nv_bfloat16>(cx, out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
    return attn_fwd<float>(cx, out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
}

extern "C" int ft_cuda_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                                     const float *dout, const float *q, const float *k,
                                     const float *v, const float *out, const float *lse,
                                     const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                                     int64_t D, float scale)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(check_shape("attention_bwd", T, H, Hkv, D));
    if (!T || !H) return 0;
    const int route = attn_route(be, cx, D);
    const void *const mp[] = {dq, dk, dv, dout, q, k, v, out};
    if (route == ROUTE_MMA && mma_fits(T, mp, 8))
        return ft_cuda_mma_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H,
                                         Hkv, D, scale);
    if (route == ROUTE_FLASH)
        return ft_cuda_flash_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H,
                                           Hkv, D, scale);
    int fl = use_flash(cx, "attention_bwd", seq_start, T);
    if (fl < 0) return fl;
    if (fl && D <= 256)
        return ft_cuda_flash_attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H,
                                           Hkv, D, scale);
    if (cx->gemm_bf16)
        return attn_bwd<__nv_bfloat16>(cx, dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H,
                                       Hkv, D, scale);
    return attn_bwd<float>(cx, dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H, Hkv, D, scale);
}
