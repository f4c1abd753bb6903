/* lmhead.cu - the LM head with cross-entropy, chunked (kernels.h lm_head_ce), and plain
 * logits, for the CUDA backend.
 *
 * For each chunk of `chunk` rows: logits (n, V) = x W^T into scratch (cuBLAS), one block per
 * row turns its logits into the loss term logsumexp - logit[target] (kept per row, in double)
 * and, when dx is wanted, into grad_scale * (softmax - onehot(target)) in place; then
 * dx (n, C) = scratch W. Rows whose target is negative (ignore index) get loss 0 and a zero
 * gradient row. The full (T, V) logits never exist. The per-row loss terms are summed at the
 * end in a fixed order, so the loss does not depend on scheduling.
 */
#include "kernels/cuda/cuda_common.h"

#include <errno.h>
#include <math.h>

#define CE_THREADS 512

static __device__ __forceinline__ float block_max_f(float v, float *sh)
{
    return ft_block_reduce(v, sh, ft_op_max());
}

static __device__ __forceinline__ double block_sum_d2(double v, double *sh)
{
    return ft_block_reduce(v, sh, ft_op_add());
}

/* First row index whose target is >= V (or INT64_MAX) into *bad. */
__global__ void k_ce_check(const int32_t *targets, int64_t T, int64_t V, int64_t *bad)
{
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T;
         t += (int64_t)gridDim.x * blockDim.x)
        if (targets[t] >= V) atomicMin((unsigned long long *)bad, (unsigned long long)t);
}

__global__ void k_ce_rows(float *s, const int32_t *tgt, int64_t V, float grad_scale,
                          int want_grad, double *rowloss)
{
    __shared__ float shf[CE_THREADS];
    __shared__ double shd[CE_THREADS];
    float *row = s + blockIdx.x * V;
    int32_t y = tgt[blockIdx.x];
    if (y < 0) {
        if (threadIdx.x == 0) rowloss[blockIdx.x] = 0;
        if (want_grad)
            for (int64_t j = threadIdx.x; j < V; j += CE_THREADS) row[j] = 0;
        return;
    }
    float lt = row[y];
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += CE_THREADS) mx = fmaxf(mx, row[j]);
    mx = block_max_f(mx, shf);
    double sum = 0;
    for (int64_t j = threadIdx.x; j < V; j += CE_THREADS) {
        float e = expf(row[j] - mx);
        if (want_grad) row[j] = e;
        sum += (double)e;
    }
    sum = block_sum_d2(sum, shd);
    if (threadIdx.x == 0) rowloss[blockIdx.x] = (double)mx + log(sum) - (double)lt;
    if (want_grad) {
        float f = (float)((double)grad_scale / sum);
        for (int64_t j = threadIdx.x; j < V; j += CE_THREADS) row[j] *= f;
        __syncthreads();
        if (threadIdx.x == 0) row[y] -= grad_scale;
    }
}

/* Sum of the row losses and count of rows with a target, one block, fixed order. */
__global__ void k_ce_total(double *loss, int64_t *count, const double *rowloss,
                           const int32_t *tgt, int64_t T)
{
    __shared__ double shd[CE_THREADS];
    double s = 0, c = 0;
    for (int64_t t = threadIdx.x; t < T; t += CE_THREADS) {
        s += rowloss[t];
        c += tgt[t] >= 0;
    }
    s = block_sum_d2(s, shd);
    c = block_sum_d2(c, shd);
    if (threadIdx.x == 0) {
        *loss = s;
        *count = (int64_t)c;
    }
}

extern "C" int ft_cuda_lm_head_ce(ft_backend *be, double *loss_sum, int64_t *n_valid, float *dx,
                                  const float *x, const float *W, const int32_t *targets,
                                  int64_t T, int64_t C, int64_t V, float grad_scale,
                                  float *scratch, int64_t chunk)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    const ft_backend_ops *o = be->ops;
    if (T < 0 || C < 0 || V < 1 || chunk < 1 || chunk > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda lm_head_ce: T = %lld, C = %lld, V = %lld, chunk = %lld "
                      "(expected T, C >= 0, V >= 1, 1 <= chunk <= %d)", (long long)T, (long long)C,
                      (long long)V, (long long)chunk, INT32_MAX);
    if ((size_t)T * sizeof(double) > cx->work_bytes)
        return ft_err(-ENOMEM, "cuda lm_head_ce: %lld rows need %lld bytes of workspace, have %zu",
                      (long long)T, (long long)T * 8, cx->work_bytes);
    *loss_sum = 0;
    *n_valid = 0;
    if (T == 0) return 0;
    int64_t none = INT64_MAX, bad;
    FT_TRY(o->copy(be, cx->d_count, &none, sizeof none));
    k_ce_check<<<ft_cuda_blocks(T, 256), 256, 0, cx->stream>>>(targets, T, V, cx->d_count);
    FT_CUDA_LAUNCH("lm_head_ce");
    FT_TRY(o->copy(be, &bad, cx->d_count, sizeof bad));
    if (bad != INT64_MAX) {
        int32_t y;
        FT_TRY(o->copy(be, &y, targets + bad, sizeof y));
        return ft_err(FT_E_INVALID, "cuda lm_head_ce: targets[%lld] = %d, expected < V = %lld",
                      (long long)bad, y, (long long)V);
    }
    double *rowloss = (double *)cx->work;
    for (int64_t c0 = 0; c0 < T; c0 += chunk) {
        int64_t n = T - c0 < chunk ? T - c0 : chunk;
        if (C > 0)
            FT_TRY(o->gemm(be, 0, 1, n, V, C, 1.0f, x + c0 * C, C, W, C, 0.0f, scratch, V));
        else
            FT_TRY(o->zero(be, scratch, (size_t)(n * V) * sizeof(float)));
        k_ce_rows<<<(unsigned)n, CE_THREADS, 0, cx->stream>>>(scratch, targets + c0, V, grad_scale,
                                                             dx != NULL, rowloss + c0);
        FT_CUDA_LAUNCH("lm_head_ce");
        if (dx && C > 0) FT_TRY(o->gemm(be, 0, 0, n, C, V, 1.0f, scratch, V, W, C, 0.0f, dx + c0 * C, C));
    }
    k_ce_total<<<1, CE_THREADS, 0, cx->stream>>>(cx->d_sum, cx->d_count, rowloss, targets, T);
    FT_CUDA_LAUNCH("lm_head_ce");
    FT_TRY(o->copy(be, loss_sum, cx->d_sum, sizeof(double)));
    return o->copy(be, n_valid, cx->d_count, sizeof(int64_t));
}

extern "C" int ft_cuda_lm_head_logits(ft_backend *be, float *logits, const float *x,
                                      const float *W, int64_t T, int64_t C, int64_t V)
{
    if (T < 0 || C < 0 || V < 1)
        return ft_err(FT_E_INVALID, "cuda lm_head_logits: T = %lld, C = %lld, V = %lld",
                      (long long)T, (long long)C, (long long)V);
    if (C == 0) return be->ops->zero(be, logits, (size_t)(T * V) * sizeof(float));
    return be->ops->gemm(be, 0, 1, T, V, C, 1.0f, x, C, W, C, 0.0f, logits, V);
}
