/* adamw_multi.cu - AdamW over many tensors in one launch (the op table's adamw_multi, kernels.h).
 *
 * Formula: torch.optim.AdamW's single-tensor path (Loshchilov & Hutter 2019, decoupled weight
 * decay), as the CPU twin kernels/cpu/ops_impl.h adamw writes it, operation for operation:
 *     m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g;  denom = sqrt(v) / sqrt(bc2) + eps;
 *     p = p decay - (step_size m) / denom,
 * with bc1 = 1 - b1^step, bc2 = 1 - b2^step in double on the host, step_size = (float)(lr / bc1)
 * and decay = (float)(1 - lr wd) per segment. Every operation is an explicitly rounded intrinsic
 * (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn: nvcc contracts none of them into an FMA), so the
 * result is the CPU's bit for bit (the CPU build is ISO C, -ffp-contract off, and SSE/AVX sqrt and
 * division round correctly). tests/emu/emu_adamw_multi.cc runs this kernel on the CPU against
 * the twin (bit equality); tests/gpu/test_cuda_fused.c does the same on a GPU.
 *
 * Layout (multi-tensor apply): the segments' elements form one index space [0, total); the table
 * of up to FT_ADAMW_MULTI_LAUNCH segments (pointers, start offset, step_size, decay) is a kernel
 * parameter (about 24 KiB: CUDA 12.1+ takes up to 32,764 bytes of parameters on sm_70+), so a
 * launch needs no copy and no workspace. Thread i of the grid-stride loop finds its segment by a
 * binary search over the starts once, then moves a cursor forward as i grows.
 */
#include "kernels/cuda/cuda_common.h"

#include <math.h>
#include <string.h>

typedef struct adamw_mt_seg {
    float *p;
    const float *g;
    float *m, *v;
    int64_t start; /* first index of the segment in the launch's index space */
    float step_size, decay;
} adamw_mt_seg;

typedef struct adamw_mt_table {
    adamw_mt_seg seg[FT_ADAMW_MULTI_LAUNCH];
    int n_seg;
    int64_t total;
    float b1, b2, one_b1, one_b2, bc2_sqrt, eps;
} adamw_mt_table;

static_assert(sizeof(adamw_mt_table) <= 32764, "adamw_multi's table exceeds the kernel parameter limit");

/* The table's segment holding index i (start <= i; empty segments are never in a table). */
static __device__ __forceinline__ int adamw_mt_find(const adamw_mt_table &tb, int64_t i)
{
    int lo = 0, hi = tb.n_seg - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tb.seg[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__global__ void __launch_bounds__(256) k_adamw_multi(const adamw_mt_table tb)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= tb.total) return;
    int s = adamw_mt_find(tb, i);
    for (; i < tb.total; i += stride) {
        while (s + 1 < tb.n_seg && tb.seg[s + 1].start <= i) s++;
        const adamw_mt_seg &q = tb.seg[s];
        const int64_t j = i - q.start;
        const float gi = q.g[j];
        const float mi = __fadd_rn(__fmul_rn(tb.b1, q.m[j]), __fmul_rn(tb.one_b1, gi));
        const float vi = __fadd_rn(__fmul_rn(tb.b2, q.v[j]), __fmul_rn(__fmul_rn(tb.one_b2, gi), gi));
        q.m[j] = mi;
        q.v[j] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), tb.bc2_sqrt), tb.eps);
        q.p[j] = __fadd_rn(__fmul_rn(q.p[j], q.decay), -__fdiv_rn(__fmul_rn(q.step_size, mi), denom));
    }
}

/* Fills tb with segments seg[*next ..) (skipping empty ones) until FT_ADAMW_MULTI_LAUNCH are in
 * or seg runs out; *next moves past what was taken. The shared scalars as the CPU twin computes
 * them. Returns the table's element count. */
static int64_t adamw_mt_fill(adamw_mt_table *tb, const ft_adamw_seg *seg, int64_t n_seg, int64_t *next,
                             float b1, float b2, float eps, float wd, int64_t step)
{
    const double bc1 = 1.0 - pow((double)b1, (double)step), bc2 = 1.0 - pow((double)b2, (double)step);
    tb->b1 = b1;
    tb->b2 = b2;
    tb->one_b1 = 1 - b1;
    tb->one_b2 = 1 - b2;
    tb->bc2_sqrt = (float)sqrt(bc2);
    tb->eps = eps;
    tb->n_seg = 0;
    tb->total = 0;
    for (; *next < n_seg && tb->n_seg < FT_ADAMW_MULTI_LAUNCH; (*next)++) {
        const ft_adamw_seg *s = &seg[*next];
        if (!s->n) continue;
        adamw_mt_seg *d = &tb->seg[tb->n_seg++];
        d->p = s->p;
        d->g = s->g;
        d->m = s->m;
        d->v = s->v;
        d->start = tb->total;
        d->step_size = (float)((double)s->lr / bc1);
        d->decay = (float)(1.0 - (double)s->lr * (double)wd);
        tb->total += s->n;
    }
    return tb->total;
}

/* The arguments adamw_multi refuses (kernels.h), one ft_err line each. */
static int adamw_mt_check(const ft_adamw_seg *seg, int64_t n_seg, float b1, float b2, int64_t step)
{
    if (n_seg < 0 || (n_seg && !seg))
        return ft_err(FT_E_INVALID, "cuda adamw_multi: %lld segments at %p", (long long)n_seg, (const void *)seg);
    if (step < 1) return ft_err(FT_E_INVALID, "cuda adamw_multi: step = %lld, expected >= 1", (long long)step);
    if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
        return ft_err(FT_E_INVALID, "cuda adamw_multi: beta1 = %g, beta2 = %g, expected in [0, 1)", (double)b1,
                      (double)b2);
    for (int64_t k = 0; k < n_seg; k++) {
        const ft_adamw_seg *s = &seg[k];
        if (s->n < 0 || (s->n && (!s->p || !s->g || !s->m || !s->v)))
            return ft_err(FT_E_INVALID, "cuda adamw_multi: segment %lld: n = %lld with a NULL array", (long long)k,
                          (long long)s->n);
    }
    return 0;
}

#ifndef FT_MMA_EMU
extern "C" int ft_cuda_adamw_multi(ft_backend *be, const ft_adamw_seg *seg, int64_t n_seg, float beta1,
                                   float beta2, float eps, float weight_decay, int64_t step)
{
    FT_TRY(adamw_mt_check(seg, n_seg, beta1, beta2, step));
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (!(cx->fused & FT_CUDA_FUSED_ADAMW)) { /* the default: the CUDA adamw per segment */
        for (int64_t k = 0; k < n_seg; k++)
            FT_TRY(be->ops->adamw(be, seg[k].p, seg[k].g, seg[k].m, seg[k].v, seg[k].n, seg[k].lr, beta1, beta2,
                                  eps, weight_decay, step));
        return 0;
    }
    adamw_mt_table tbs; /* 24 KiB on the host stack; the launch copies it */
    adamw_mt_table *tb = &tbs;
    for (int64_t next = 0; next < n_seg;) {
        const int64_t total = adamw_mt_fill(tb, seg, n_seg, &next, beta1, beta2, eps, weight_decay, step);
        if (!total) continue;
        const unsigned want = ft_cuda_blocks(total, 256), most = (unsigned)cx->n_sm * 8;
        const unsigned blocks = want < most ? want : most; /* grid-stride beyond n_sm * 8 blocks */
        k_adamw_multi<<<blocks, 256, 0, cx->stream>>>(*tb);
        FT_CUDA_LAUNCH("adamw_multi");
    }
    return 0;
}
#endif
