/* backend.c - the CPU backend: memory entries of the op table, the table itself, and
 * ft_backend_cpu_init / ft_backend_free (kernels/kernels.h). Its device mode, cpu-device, is
 * cpu_device.c.
 *
 * The numeric entries forward to the fp32 instance of the type-generic ops
 * (cpu_f32.h; bodies in ops_impl.h and attn_impl.h), which check their arguments and
 * return FT_E_INVALID with an ft_err() line on bad ones. Host memory is the backend
 * memory, so copy is memcpy.
 */
#include <cblas.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/bf16_ops.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_f32.h"
#include "kernels/cpu/decode.h"
#include "kernels/cpu/nf4_gemv.h"
#include "kernels/cpu/rows_f32.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"



/* ---- memory ---------------------------------------------------------------------------- */

void *ft_cpu_alloc(ft_backend *be, size_t bytes)
{
    (void)be;
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still gets a real block so
     * that NULL always means failure. */
    if (bytes > SIZE_MAX - 64) return NULL;
    size_t n = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    return aligned_alloc(64, n);
}

static void cpu_free(ft_backend *be, void *p)
{
    (void)be;
    free(p);
}

/* Large copies are split over the team: one core cannot saturate memory bandwidth. */
#define COPY_PAR_BYTES ((size_t)8 << 20)
#define COPY_PIECE ((size_t)1 << 20)

int ft_cpu_copy(ft_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes == 0) return 0;
    if (!dst || !src)
        return ft_err(FT_E_INVALID, "cpu copy: %s pointer is NULL for %zu bytes",
                      dst ? "source" : "destination", bytes);
    if (bytes < COPY_PAR_BYTES) {
        memmove(dst, src, bytes);
        return 0;
    }
    const char *s = src;
    char *d = dst;
    if ((d < s + bytes) && (s < d + bytes)) { /* overlapping: serial memmove */
        memmove(dst, src, bytes);
        return 0;
    }
    const int64_t pieces = (int64_t)((bytes + COPY_PIECE - 1) / COPY_PIECE);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < pieces; i++) {
        size_t off = (size_t)i * COPY_PIECE;
        size_t n = bytes - off < COPY_PIECE ? bytes - off : COPY_PIECE;
        memcpy(d + off, s + off, n);
    }
    return 0;
}

int ft_cpu_zero(ft_backend *be, void *p, size_t bytes)
{
    (void)be;
    if (bytes == 0) return 0;
    if (!p) return ft_err(FT_E_INVALID, "cpu zero: pointer is NULL for %zu bytes", bytes);
    if (bytes < COPY_PAR_BYTES) {
        memset(p, 0, bytes);
        return 0;
    }
    char *d = p;
    const int64_t pieces = (int64_t)((bytes + COPY_PIECE - 1) / COPY_PIECE);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < pieces; i++) {
        size_t off = (size_t)i * COPY_PIECE;
        memset(d + off, 0, bytes - off < COPY_PIECE ? bytes - off : COPY_PIECE);
    }
    return 0;
}

/* ---- numeric entries: the fp32 instance ---------------------------------------------- */

static int cpu_gemm(ft_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float beta, float *c, int64_t ldc)
{
    (void)be;
    return ft_cpu_gemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* fp32 W, and FT_WTYPE_NF4 read in place (kernels/cpu/nf4_gemv.h: generation's decode step over a
 * pack, offload/exec.c; not advertised in weight_types, as linear_bwd_x takes fp32 only). */
int ft_cpu_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                      int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    if (wtype == FT_WTYPE_NF4) return ft_cpu_nf4_gemv(y, x, W, T, out, in, beta, scratch);
    if (wtype != FT_WTYPE_F32)
        return ft_err(FT_E_UNSUPPORTED, "cpu linear_fwd: weight type %d (the CPU backend takes fp32 "
                      "weights, NF4 for a few rows)", wtype);
    return cpu_gemm(be, 0, 1, T, out, in, 1.0f, x, in, (const float *)W, in, beta, y, out);
}

int ft_cpu_linear_bwd_x(ft_backend *be, float *dx, const float *dy, const void *W, int wtype,
                        int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    (void)scratch;
    if (wtype != FT_WTYPE_F32)
        return ft_err(FT_E_UNSUPPORTED, "cpu linear_bwd_x: weight type %d (the CPU backend takes fp32 weights)", wtype);
    return cpu_gemm(be, 0, 0, T, in, out, 1.0f, dy, out, (const float *)W, in, beta, dx, in);
}

static int cpu_axpy(ft_backend *be, float alpha, const float *x, float *y, int64_t n)
{
    (void)be;
    return ft_cpu_axpy_f32(alpha, x, y, n);
}

static int cpu_scale(ft_backend *be, float *x, float alpha, int64_t n)
{
    (void)be;
    return ft_cpu_scale_f32(x, alpha, n);
}

static int cpu_sumsq(ft_backend *be, double *out, const float *x, int64_t n)
{
    (void)be;
    return ft_cpu_sumsq_f32(out, x, n);
}

static int cpu_bias_add(ft_backend *be, float *y, const float *bias, int64_t T, int64_t O)
{
    (void)be;
    return ft_cpu_bias_add_f32(y, bias, T, O);
}

static int cpu_embedding_fwd(ft_backend *be, float *out, const int32_t *ids,
                             const float *table, int64_t T, int64_t C, int64_t V)
{
    (void)be;
    return ft_cpu_embedding_fwd_f32(out, ids, table, T, C, V);
}

static int cpu_rmsnorm_fwd(ft_backend *be, float *y, float *rstd, const float *x,
                           const float *w, int64_t T, int64_t C, float eps)
{
    (void)be;
    return ft_cpu_rmsnorm_fwd_f32(y, rstd, x, w, T, C, eps);
}

static int cpu_rmsnorm_bwd(ft_backend *be, float *dx, const float *dy, const float *x,
                           const float *w, const float *rstd, int64_t T, int64_t C)
{
    (void)be;
    return ft_cpu_rmsnorm_bwd_f32(dx, dy, x, w, rstd, T, C);
}

static int cpu_rope_fwd(ft_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                        int64_t T, int64_t H, int64_t D)
{
    (void)be;
    return ft_cpu_rope_fwd_f32(x, pos, inv_freq, T, H, D);
}

static int cpu_rope_bwd(ft_backend *be, float *dx, const int32_t *pos, const float *inv_freq,
                        int64_t T, int64_t H, int64_t D)
{
    (void)be;
    return ft_cpu_rope_bwd_f32(dx, pos, inv_freq, T, H, D);
}

static int cpu_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                             const float *k, const float *v, const int32_t *seq_start,
                             int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale)
{
    (void)be;
    return ft_cpu_attention_fwd_f32(out, lse, q, k, v, seq_start, T, H, Hkv, D, scale);
}

static int cpu_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k,
                             const float *v, const float *out, const float *lse,
                             const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, float scale)
{
    (void)be;
    return ft_cpu_attention_bwd_f32(dq, dk, dv, dout, q, k, v, out, lse, seq_start, T, H, Hkv,
                                    D, scale);
}

static int cpu_swiglu_fwd(ft_backend *be, float *h, const float *gate, const float *up,
                          int64_t n)
{
    (void)be;
    return ft_cpu_swiglu_fwd_f32(h, gate, up, n);
}

static int cpu_swiglu_bwd(ft_backend *be, float *dgate, float *dup, const float *dh,
                          const float *gate, const float *up, int64_t n)
{
    (void)be;
    return ft_cpu_swiglu_bwd_f32(dgate, dup, dh, gate, up, n);
}

static int cpu_dropout(ft_backend *be, float *y, const float *x, int64_t n, float p,
                       uint64_t seed)
{
    (void)be;
    return ft_cpu_dropout_f32(y, x, n, p, seed);
}

/* x (n) += mag * u_i (kernels.h noise_uniform_add; u_i: cpu_common.h ft_noise_uniform). The
 * product is its own statement: C (ISO mode, -std=c11) contracts a * b + c into an FMA only
 * within one expression, and the CUDA twin rounds the product too (__fmul_rn, __fadd_rn),
 * so both give the same bits. Elementwise and counter-based: any thread count, same bits. */
static int cpu_noise_uniform_add(ft_backend *be, float *x, int64_t n, float mag, uint64_t seed)
{
    (void)be;
    FT_CPU_CHECK_NONNEG("noise_uniform_add", n);
    FT_CPU_CHECK_PTR("noise_uniform_add", x, n);
    if (!(mag >= 0) || !isfinite(mag))
        return ft_err(FT_E_INVALID, "cpu noise_uniform_add: mag = %g, expected finite and >= 0",
                      (double)mag);
    if (mag == 0 || n == 0) return 0;
    const uint64_t key = ft_dropout_mix64(seed);
#pragma omp parallel for schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float d = mag * ft_noise_uniform(key, (uint64_t)i);
        x[i] = x[i] + d;
    }
    return 0;
}

static int cpu_lm_head_ce(ft_backend *be, double *loss_sum, int64_t *n_valid, float *dx,
                          const float *x, const float *W, const int32_t *targets, int64_t T,
                          int64_t C, int64_t V, float grad_scale, float *scratch, int64_t chunk)
{
    (void)be;
    return ft_cpu_lm_head_ce_f32(loss_sum, n_valid, dx, x, W, targets, T, C, V, grad_scale,
                                 scratch, chunk);
}

/* A few rows (a decode step: one per sequence) read each row of W once (kernels/cpu/
 * rows_f32.c: 2-3x faster than sgemm there, and a row's logits do not depend on the rows
 * decoded with it); more rows (a prefill, `ftune logits`) go to sgemm. */
static int cpu_lm_head_logits(ft_backend *be, float *logits, const float *x, const float *W,
                              int64_t T, int64_t C, int64_t V)
{
    (void)be;
    if (T >= 1 && T <= FT_CPU_ROWS_F32_MAX && C >= 0 && V >= 0)
        return ft_cpu_rows_f32(logits, x, W, T, C, V, FT_ROWS_F32_AUTO);
    return ft_cpu_lm_head_logits_f32(logits, x, W, T, C, V);
}

/* lm_head_logits_bf16 equals lm_head_logits up to the rows the latter runs the few-rows kernel for */
_Static_assert(FT_LM_HEAD_BF16_ROWS == FT_CPU_ROWS_F32_MAX, "FT_LM_HEAD_BF16_ROWS != FT_CPU_ROWS_F32_MAX");

/* A bf16 W (kernels.h): the few-rows kernel for every T, reading W at 2 bytes a weight; up to
 * FT_CPU_ROWS_F32_MAX rows these are cpu_lm_head_logits' bits (the same kernel, W widened as it
 * is loaded). */
static int cpu_lm_head_logits_bf16(ft_backend *be, float *logits, const float *x, const uint16_t *W,
                                   int64_t T, int64_t C, int64_t V)
{
    (void)be;
    return ft_cpu_rows_bf16(logits, x, W, T, C, V, FT_ROWS_F32_AUTO);
}

static int cpu_adamw(ft_backend *be, float *p, const float *g, float *m, float *v, int64_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     int64_t step)
{
    (void)be;
    return ft_cpu_adamw_f32(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
}

/* The fused ops: the twins of the CUDA kernels (kernels/cpu/bf16_ops.c). */
static int cpu_adamw_multi(ft_backend *be, const ft_adamw_seg *seg, int64_t n_seg, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step)
{
    (void)be;
    return ft_cpu_adamw_multi(seg, n_seg, beta1, beta2, eps, weight_decay, step);
}

static int cpu_add_rmsnorm_bf16_fwd(ft_backend *be, uint16_t *h_out, uint16_t *y, float *rstd,
                                    const uint16_t *x, const uint16_t *res, const float *w,
                                    int64_t T, int64_t C, float eps)
{
    (void)be;
    return ft_cpu_add_rmsnorm_bf16_fwd(h_out, y, rstd, x, res, w, T, C, eps);
}

static int cpu_add_rmsnorm_bf16_bwd(ft_backend *be, uint16_t *dres_out, const uint16_t *dy,
                                    const uint16_t *dres, const uint16_t *h, const float *w,
                                    const float *rstd, int64_t T, int64_t C)
{
    (void)be;
    return ft_cpu_add_rmsnorm_bf16_bwd(dres_out, dy, dres, h, w, rstd, T, C);
}

static int cpu_rope_qk_bf16(ft_backend *be, uint16_t *q, uint16_t *k, const int32_t *pos,
                            const float *inv_freq, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                            int inverse)
{
    (void)be;
    return ft_cpu_rope_qk_bf16(q, k, pos, inv_freq, T, H, Hkv, D, inverse);
}

static int cpu_swiglu_bf16_fwd(ft_backend *be, uint16_t *h, const uint16_t *gate,
                               const uint16_t *up, int64_t n)
{
    (void)be;
    return ft_cpu_swiglu_bf16_fwd(h, gate, up, n);
}

static int cpu_swiglu_bf16_bwd(ft_backend *be, uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                               const uint16_t *gate, const uint16_t *up, int64_t n)
{
    (void)be;
    return ft_cpu_swiglu_bf16_bwd(dgate, dup, dh, gate, up, n);
}

static int cpu_attention_kv_fwd(ft_backend *be, float *out, const float *q, const float *k,
                                const float *v, int64_t p, int64_t n_q, int64_t H, int64_t Hkv,
                                int64_t D, float scale)
{
    (void)be;
    return ft_cpu_attention_kv_fwd_f32(out, q, k, v, p, n_q, H, Hkv, D, scale);
}

/* ---- transfers: a host-memory backend has one lane, run in order at once ------------- */

static void *cpu_host_alloc(ft_backend *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX - 4096) return NULL;
    size_t n = bytes == 0 ? 4096 : (bytes + 4095) / 4096 * 4096;
    return aligned_alloc(4096, n);
}

/* Host memory is host memory: nothing to lock, no device to locate. */
static int cpu_host_register(ft_backend *be, void *p, size_t bytes)
{
    (void)be, (void)p, (void)bytes;
    return 0;
}

static void cpu_host_unregister(ft_backend *be, void *p)
{
    (void)be, (void)p;
}

static int cpu_device_pci_id(ft_backend *be, char *buf, size_t n)
{
    (void)be;
    if (n) buf[0] = 0;
    return ft_err(FT_E_UNSUPPORTED, "the CPU backend has no PCI device");
}

static int cpu_copy_async(ft_backend *be, int lane, void *dst, const void *src, size_t bytes)
{
    (void)lane;
    return ft_cpu_copy(be, dst, src, bytes);
}

static int cpu_event_record(ft_backend *be, int ev, int lane)
{
    (void)be, (void)ev, (void)lane;
    return 0;
}

static int cpu_event_wait(ft_backend *be, int lane, int ev)
{
    (void)be, (void)ev, (void)lane;
    return 0;
}

static int cpu_event_sync(ft_backend *be, int ev)
{
    (void)be, (void)ev;
    return 0;
}

static int cpu_event_elapsed(ft_backend *be, int ev0, int ev1, float *ms)
{
    (void)be, (void)ev0, (void)ev1;
    *ms = 0;
    return ft_err(FT_E_UNSUPPORTED, "the CPU backend keeps no event times");
}

static void cpu_destroy(ft_backend *be)
{
    ft_cpu_ctx *ctx = be->ctx;
    if (ctx) ft_cpu_device_ctx_free(ctx); /* device mode's (cpu_device.c) */
    free(be->ctx); /* CPU context: plain struct */
    be->ctx = NULL;
}

const ft_backend_ops ft_cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .weight_types = FT_WTYPE_BIT(FT_WTYPE_F32),
    .destroy = cpu_destroy,
    .alloc = ft_cpu_alloc,
    .free = cpu_free,
    .copy = ft_cpu_copy,
    .zero = ft_cpu_zero,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .copy_async = cpu_copy_async,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_sync = cpu_event_sync,
    .event_elapsed = cpu_event_elapsed,
    .gemm = cpu_gemm,
    .linear_fwd = ft_cpu_linear_fwd,
    .linear_bwd_x = ft_cpu_linear_bwd_x,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .bias_add = cpu_bias_add,
    .embedding_fwd = cpu_embedding_fwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .dropout = cpu_dropout,
    .noise_uniform_add = cpu_noise_uniform_add,
    .lm_head_ce = cpu_lm_head_ce,
    .lm_head_logits = cpu_lm_head_logits,
    .lm_head_logits_bf16 = cpu_lm_head_logits_bf16,
    .adamw = cpu_adamw,
    .attention_kv_fwd = cpu_attention_kv_fwd,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
    .device_pci_id = cpu_device_pci_id,
    .adamw_multi = cpu_adamw_multi,
    .add_rmsnorm_bf16_fwd = cpu_add_rmsnorm_bf16_fwd,
    .add_rmsnorm_bf16_bwd = cpu_add_rmsnorm_bf16_bwd,
    .rope_qk_bf16 = cpu_rope_qk_bf16,
    .swiglu_bf16_fwd = cpu_swiglu_bf16_fwd,
    .swiglu_bf16_bwd = cpu_swiglu_bf16_bwd,
};

/* ---- init / free ------------------------------------------------------------------------ */

/* n_threads <= 0: omp_get_num_procs(). The thread count is process-wide state of OpenMP
 * (the calling thread's team size) and OpenBLAS, set here once: OpenMP teams get n_threads
 * threads, and OpenBLAS runs single-threaded in whichever thread calls it, the gemm op
 * splitting C over the OpenMP team itself (ops_impl.h gemm_raw). Reason: the pthread
 * OpenBLAS workers busy-wait after each call; on a 2-core machine the OpenMP loops that
 * followed an sgemm ran 10-20x slower (rmsnorm 2048x576: 0.2 ms alone, ~4 ms after an
 * sgemm), and the attention tiles call BLAS from inside OpenMP regions. */
/* OpenBLAS takes a work buffer (BUFFER_SIZE: 128 MiB on x86-64 builds, plus a page) the
 * first time a thread calls it and keeps it for the process; when that allocation fails it
 * retries forever (memory.c blas_memory_alloc), so a run under a small `ulimit -v` would spin
 * in its first GEMM. The backend therefore checks, before any GEMM, that one such buffer per
 * OpenMP thread (each makes one BLAS call at a time, gemm_raw) can be had, and then makes
 * every thread take its buffer at once, while the memory is known to be there: a GEMM of
 * about a millisecond on each thread, entered together after a barrier, so that the calls
 * overlap and each holds its own buffer. */
#define BLAS_BUFFER_BYTES (((size_t)128 << 20) + ((size_t)1 << 20))
#define BLAS_WARM_N 192

static int blas_buffers_take(int n_threads)
{
    void **probe = calloc((size_t)n_threads, sizeof *probe);
    int ok = probe != NULL;
    for (int i = 0; i < n_threads && ok; i++) ok = (probe[i] = malloc(BLAS_BUFFER_BYTES)) != NULL;
    for (int i = 0; probe && i < n_threads; i++) free(probe[i]);
    free(probe);
    if (!ok)
        return ft_err(-ENOMEM, "out of memory: the CPU backend needs %d x %zu MiB of address space for OpenBLAS work buffers (%d threads; see ulimit -v, or use fewer --threads)",
                      n_threads, BLAS_BUFFER_BYTES >> 20, n_threads);
    const size_t el = (size_t)BLAS_WARM_N * BLAS_WARM_N;
    float *m = calloc(3 * el * (size_t)n_threads, sizeof *m);
    if (!m) return ft_err(-ENOMEM, "out of memory: the CPU backend's OpenBLAS warm-up");
#pragma omp parallel num_threads(n_threads)
    {
        float *a = m + 3 * el * (size_t)omp_get_thread_num();
#pragma omp barrier
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BLAS_WARM_N, BLAS_WARM_N, BLAS_WARM_N,
                    1.0f, a, BLAS_WARM_N, a + el, BLAS_WARM_N, 0.0f, a + 2 * el, BLAS_WARM_N);
    }
    free(m);
    return 0;
}

int ft_backend_cpu_init(ft_backend **out, int n_threads)
{
    if (!out) return ft_err(FT_E_INVALID, "ft_backend_cpu_init: out is NULL");
    *out = NULL;
    ft_backend *be = calloc(1, sizeof *be);
    ft_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return ft_err(-ENOMEM, "ft_backend_cpu_init: out of memory");
    }
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    if (n_threads < 1) n_threads = 1;
    ctx->n_threads = n_threads;
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(1);
    int rc = blas_buffers_take(n_threads);
    if (rc < 0) {
        free(be);
        free(ctx);
        return rc;
    }
    be->ops = &ft_cpu_ops;
    be->ctx = ctx;
    *out = be;
    return 0;
}
