/* profile.cu - per-op GPU time of the CUDA backend (ft_backend_profile_*, kernels.h).
 *
 * Profiling swaps the backend's op table for a wrapper table: each top-level op call is
 * bracketed by two CUDA events on the backend's stream (ops called from inside another op,
 * such as the GEMMs of lm_head_ce, count toward the outer op). Events are resolved in batches
 * when the ring fills and at report time, so profiling adds no synchronization per op. Time
 * is summed per op name; GEMMs are split into the large ones (every dimension > 64) and the
 * skinny ones of the LoRA path (a dimension <= 64, the rank). Beside the GPU time, the host
 * time inside each top-level call (argument checks, launches, cuBLAS's host work; CLOCK_MONOTONIC)
 * is summed too: the host-side cost per op, which the GPU waits on when it exceeds the op's GPU
 * time (launch-bound small ops).
 */
#include "kernels/cuda/cuda_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    P_GEMM, P_GEMM_LORA, P_LINEAR_FWD, P_LINEAR_BWD, P_AXPY, P_SCALE, P_SUMSQ, P_BIAS, P_EMBED,
    P_RMS_FWD, P_RMS_BWD, P_ROPE_FWD, P_ROPE_BWD, P_ATT_FWD, P_ATT_BWD, P_SWIGLU_FWD,
    P_SWIGLU_BWD, P_DROPOUT, P_NOISE, P_CE, P_LOGITS, P_ADAMW, P_ATT_KV, P_ZERO,
    P_ADAMW_MULTI, P_ADD_RMS_FWD, P_ADD_RMS_BWD, P_ROPE_QK, P_SWIGLU16_FWD, P_SWIGLU16_BWD, P_N
};
static const char *const prof_name[P_N] = {
    "gemm (large)", "gemm (LoRA, a dim <= 64)", "linear_fwd (frozen W)", "linear_bwd_x (frozen W)",
    "axpy", "scale", "sumsq", "bias_add", "embedding_fwd", "rmsnorm_fwd", "rmsnorm_bwd",
    "rope_fwd", "rope_bwd", "attention_fwd", "attention_bwd", "swiglu_fwd", "swiglu_bwd",
    "dropout", "noise_uniform_add", "lm_head_ce", "lm_head_logits", "adamw", "attention_kv_fwd", "zero",
    "adamw_multi", "add_rmsnorm_bf16_fwd", "add_rmsnorm_bf16_bwd", "rope_qk_bf16", "swiglu_bf16_fwd",
    "swiglu_bf16_bwd"};
static_assert(sizeof prof_name / sizeof prof_name[0] == P_N, "a profiled op without a name");

#define RING 16384

typedef struct prof_state {
    const ft_backend_ops *inner;
    ft_backend_ops table;
    cudaEvent_t ev[2 * RING];
    int id[RING];
    int n, depth;
    double ms[P_N];
    double host_ms[P_N];    /* host time inside the top-level calls */
    double h0;              /* host time at the current top-level call's begin (ms) */
    int64_t calls[P_N];
} prof_state;

static double host_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static prof_state *ps_of(ft_backend *be) { return (prof_state *)FT_CUDA_CTX(be)->prof; }

/* Resolves the recorded event pairs into the per-op sums. */
static int flush(ft_backend *be, prof_state *ps)
{
    if (!ps->n) return 0;
    FT_CUDA_TRY(cudaStreamSynchronize(FT_CUDA_CTX(be)->stream));
    for (int i = 0; i < ps->n; i++) {
        float t = 0;
        FT_CUDA_TRY(cudaEventElapsedTime(&t, ps->ev[2 * i], ps->ev[2 * i + 1]));
        ps->ms[ps->id[i]] += t;
        ps->calls[ps->id[i]]++;
    }
    ps->n = 0;
    return 0;
}

static int begin(ft_backend *be, prof_state *ps, int id)
{
    if (ps->depth++) return 0;
    if (ps->n == RING) FT_TRY(flush(be, ps));
    ps->id[ps->n] = id;
    ps->h0 = host_now_ms();
    FT_CUDA_TRY(cudaEventRecord(ps->ev[2 * ps->n], FT_CUDA_CTX(be)->stream));
    return 0;
}

static int end(ft_backend *be, prof_state *ps, int rc)
{
    if (--ps->depth) return rc;
    cudaError_t st = cudaEventRecord(ps->ev[2 * ps->n + 1], FT_CUDA_CTX(be)->stream);
    ps->host_ms[ps->id[ps->n]] += host_now_ms() - ps->h0;
    ps->n++;
    if (st != cudaSuccess && !rc) return ft_cuda_status(st, "cudaEventRecord", __FILE__, __LINE__);
    return rc;
}

/* One wrapper per op: sig<> takes the op's function-pointer type apart; the member pointer
 * names the inner op, ID its row in the report. */
template <typename F> struct sig;
template <typename... A> struct sig<int (*)(ft_backend *, A...)> {
    template <int (*ft_backend_ops::*MP)(ft_backend *, A...), int ID>
    static int call(ft_backend *be, A... a)
    {
        prof_state *ps = ps_of(be);
        FT_TRY(begin(be, ps, ID));
        return end(be, ps, (ps->inner->*MP)(be, a...));
    }
};
#define WRAP(field, id) sig<decltype(ft_backend_ops::field)>::template call<&ft_backend_ops::field, id>

static int prof_gemm(ft_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc)
{
    prof_state *ps = ps_of(be);
    FT_TRY(begin(be, ps, (m <= 64 || n <= 64 || k <= 64) ? P_GEMM_LORA : P_GEMM));
    return end(be, ps, ps->inner->gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

static int prof_zero(ft_backend *be, void *p, size_t bytes)
{
    prof_state *ps = ps_of(be);
    FT_TRY(begin(be, ps, P_ZERO));
    return end(be, ps, ps->inner->zero(be, p, bytes));
}

extern "C" int ft_backend_cuda_profile(ft_backend *be, int on)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    prof_state *ps = (prof_state *)cx->prof;
    if (!on) {
        if (ps) be->ops = ps->inner;
        return 0;
    }
    if (!ps) {
        ps = (prof_state *)calloc(1, sizeof *ps);
        if (!ps) return ft_err(-ENOMEM, "cuda profile: out of memory");
        for (int i = 0; i < 2 * RING; i++)
            if (cudaEventCreate(&ps->ev[i]) != cudaSuccess) {
                for (int j = 0; j < i; j++) cudaEventDestroy(ps->ev[j]);
                free(ps);
                return ft_err(-EIO, "cuda profile: cannot create events");
            }
        ps->inner = be->ops;
        ps->table = *be->ops;
        ft_backend_ops *t = &ps->table;
        t->gemm = prof_gemm;
        t->zero = prof_zero;
        t->linear_fwd = WRAP(linear_fwd, P_LINEAR_FWD);
        t->linear_bwd_x = WRAP(linear_bwd_x, P_LINEAR_BWD);
        t->axpy = WRAP(axpy, P_AXPY);
        t->scale = WRAP(scale, P_SCALE);
        t->sumsq = WRAP(sumsq, P_SUMSQ);
        t->bias_add = WRAP(bias_add, P_BIAS);
        t->embedding_fwd = WRAP(embedding_fwd, P_EMBED);
        t->rmsnorm_fwd = WRAP(rmsnorm_fwd, P_RMS_FWD);
        t->rmsnorm_bwd = WRAP(rmsnorm_bwd, P_RMS_BWD);
        t->rope_fwd = WRAP(rope_fwd, P_ROPE_FWD);
        t->rope_bwd = WRAP(rope_bwd, P_ROPE_BWD);
        t->attention_fwd = WRAP(attention_fwd, P_ATT_FWD);
        t->attention_bwd = WRAP(attention_bwd, P_ATT_BWD);
        t->swiglu_fwd = WRAP(swiglu_fwd, P_SWIGLU_FWD);
        t->swiglu_bwd = WRAP(swiglu_bwd, P_SWIGLU_BWD);
        t->dropout = WRAP(dropout, P_DROPOUT);
        t->noise_uniform_add = WRAP(noise_uniform_add, P_NOISE);
        t->lm_head_ce = WRAP(lm_head_ce, P_CE);
        t->lm_head_logits = WRAP(lm_head_logits, P_LOGITS);
        t->adamw = WRAP(adamw, P_ADAMW);
        t->attention_kv_fwd = WRAP(attention_kv_fwd, P_ATT_KV);
        t->adamw_multi = WRAP(adamw_multi, P_ADAMW_MULTI);
        t->add_rmsnorm_bf16_fwd = WRAP(add_rmsnorm_bf16_fwd, P_ADD_RMS_FWD);
        t->add_rmsnorm_bf16_bwd = WRAP(add_rmsnorm_bf16_bwd, P_ADD_RMS_BWD);
        t->rope_qk_bf16 = WRAP(rope_qk_bf16, P_ROPE_QK);
        t->swiglu_bf16_fwd = WRAP(swiglu_bf16_fwd, P_SWIGLU16_FWD);
        t->swiglu_bf16_bwd = WRAP(swiglu_bf16_bwd, P_SWIGLU16_BWD);
        cx->prof = ps;
    }
    be->ops = &ps->table;
    return 0;
}

extern "C" int ft_backend_cuda_profile_report(ft_backend *be, char *buf, size_t n, int reset)
{
    prof_state *ps = (prof_state *)FT_CUDA_CTX(be)->prof;
    if (!ps) return ft_err(FT_E_INVALID, "cuda profile: profiling was never enabled");
    FT_TRY(flush(be, ps));
    double tot = 0, host = 0;
    int order[P_N];
    for (int i = 0; i < P_N; i++) {
        tot += ps->ms[i];
        host += ps->host_ms[i];
        order[i] = i;
    }
    for (int i = 1; i < P_N; i++) /* by time, descending */
        for (int j = i; j > 0 && ps->ms[order[j]] > ps->ms[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t o = (size_t)snprintf(buf, n, "%-26s %10s %6s %8s %9s\n", "op", "GPU ms", "share", "calls", "host ms");
    for (int k = 0; k < P_N && o < n; k++) {
        int i = order[k];
        if (!ps->calls[i]) continue;
        o += (size_t)snprintf(buf + o, n - o, "%-26s %10.1f %5.1f%% %8lld %9.1f\n", prof_name[i], ps->ms[i],
                              tot > 0 ? 100 * ps->ms[i] / tot : 0, (long long)ps->calls[i], ps->host_ms[i]);
    }
    if (o < n) snprintf(buf + o, n - o, "%-26s %10.1f %6s %8s %9.1f\n", "total (ops)", tot, "", "", host);
    if (reset) {
        memset(ps->host_ms, 0, sizeof ps->host_ms);
        memset(ps->ms, 0, sizeof ps->ms);
        memset(ps->calls, 0, sizeof ps->calls);
    }
    return 0;
}

extern "C" void ft_cuda_profile_free(ft_cuda_ctx *cx)
{
    prof_state *ps = (prof_state *)cx->prof;
    if (!ps) return;
    for (int i = 0; i < 2 * RING; i++) cudaEventDestroy(ps->ev[i]);
    free(ps);
    cx->prof = NULL;
}
