/* backend.c - the CPU backend: memory entries of the op table, the table itself, and
 * ft_backend_cpu_init / ft_backend_free (kernels/kernels.h).
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

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_f32.h"
#include "kernels/cpu/decode.h"
#include "kernels/cpu/nf4_gemv.h"
#include "kernels/cpu/rows_f32.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"

typedef struct ft_cpu_ctx {
    int n_threads; /* OpenMP team size (OpenBLAS itself runs single-threaded) */
    /* device mode only (ft_backend_cpu_device_init; NULL / unused otherwise): */
    ft_backend_ops dev_ops; /* this backend's table: cpu_ops with the device entries */
    float *wtile;           /* DEV_TILE_FLOATS: bf16 weights widened to fp32, NF4 staging */
    double *ev_t;           /* FT_MAX_EVENTS host times of the last record, < 0: none */
    struct ft_cpu_lanes *lanes; /* asynchronous copy lanes (ft_backend_cpu_device_set_lag), or NULL */
    size_t dev_bytes;       /* "device memory" in use: the usable size of every live alloc */
} ft_cpu_ctx;

static void lanes_stop(struct ft_cpu_lanes *q);

/* ---- memory ---------------------------------------------------------------------------- */

static void *cpu_alloc(ft_backend *be, size_t bytes)
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

static int cpu_copy(ft_backend *be, void *dst, const void *src, size_t bytes)
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

static int cpu_zero(ft_backend *be, void *p, size_t bytes)
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

/* fp32 W, and FT_W_NF4 read in place (kernels/cpu/nf4_gemv.h: generation's decode step over a
 * pack, offload/exec.c; not advertised in weight_types, as linear_bwd_x takes fp32 only). */
static int cpu_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                          int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    if (wtype == FT_W_NF4) return ft_cpu_nf4_gemv(y, x, W, T, out, in, beta, scratch);
    if (wtype != FT_W_F32)
        return ft_err(FT_E_UNSUPPORTED, "cpu linear_fwd: weight type %d (the CPU backend takes fp32 "
                      "weights, NF4 for a few rows)", wtype);
    return cpu_gemm(be, 0, 1, T, out, in, 1.0f, x, in, (const float *)W, in, beta, y, out);
}

static int cpu_linear_bwd_x(ft_backend *be, float *dx, const float *dy, const void *W, int wtype,
                            int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    (void)scratch;
    if (wtype != FT_W_F32)
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
    return cpu_copy(be, dst, src, bytes);
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
    if (ctx) lanes_stop(ctx->lanes), free(ctx->wtile), free(ctx->ev_t); /* device mode's */
    free(be->ctx); /* CPU context: plain struct */
    be->ctx = NULL;
}

static const ft_backend_ops cpu_ops = {
    .name = "cpu",
    .host_memory = 1,
    .weight_types = FT_WTYPE_BIT(FT_W_F32),
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .copy_async = cpu_copy_async,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_sync = cpu_event_sync,
    .event_elapsed = cpu_event_elapsed,
    .gemm = cpu_gemm,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd_x = cpu_linear_bwd_x,
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
};

/* ---- device mode (ft_backend_cpu_device_init) ------------------------------------------ *
 * The same numeric entries, but host_memory = 0, so the offload executor treats the CPU as a
 * device: it copies the base weights in (projections in bf16), places a packed base by tier
 * (offload/tiers.c: device / pinned host / disk through slots on the H2D lane, the disk
 * read-ahead), and keeps checkpoints in "pinned" host memory (offload/actckpt.c), all through
 * copy_async and the events, exactly as on CUDA. Copies run at once (in queue order), so the
 * events are host times taken when recorded (event_elapsed works; the timeline gets spans).
 *
 * Numerics of the frozen products with bf16 weights follow the CUDA backend's
 * (kernels/cuda/backend.cu cu_linear_fwd / cu_linear_bwd_x): the activation (x, or dy) is
 * rounded to bf16 (nearest even) into scratch, the weight is bf16, the products are summed in
 * fp32. Here the bf16 weight rows are widened to fp32 (exact) DEV_TILE_FLOATS at a time and
 * multiplied by the same OpenBLAS sgemm as the fp32 path, so results are those of the bf16
 * operands with fp32 accumulation (not bit-identical to cuBLAS: the summation order
 * differs), and a weight too large for one tile is summed tile by tile over its input
 * dimension (deterministic: the tiling depends only on the shape). NF4 weights (FT_W_NF4, the
 * CUDA backend's dequant-fused GEMM) are dequantized tile by tile into the same fp32 tiles, so
 * they give exactly what dequant_nf4 followed by the bf16 product gives. */

#define DEV_TILE_FLOATS ((int64_t)1 << 20) /* 4 MiB of fp32 weights per tile */

static double dev_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* v = the NF4 tensor t (kernels.h) as src/numeric/nf4.h reads it. Returns 0 or FT_E_INVALID. */
static int dev_nf4_view(ft_nf4_view *v, const ft_nf4_tensor *t)
{
    *v = (ft_nf4_view){{0}, t->codes, t->qabsmax, t->absmax, t->nested_absmax, t->nested_map,
                       t->code, t->offset};
    return ft_nf4_layout_init(&v->lay, t->n, t->blocksize, t->nested_blocksize);
}

/* dst (rows, cols) fp32 = W[r0 + i][c0 + j] of W (row stride ld) as the bf16 products see it:
 * a bf16 matrix widened (exact), or an FT_W_NF4 tensor dequantized (ft_nf4_dequant_range,
 * bitsandbytes' fp32 arithmetic) and rounded to bf16, the values dequant_nf4 gives; so an NF4
 * product equals dequant_nf4 followed by the bf16 product, bit for bit. Returns 0 or
 * FT_E_INVALID (a bad NF4 description). */
static int dev_tile(float *dst, const void *W, int wtype, int64_t ld, int64_t r0, int64_t rows,
                    int64_t c0, int64_t cols)
{
    if (wtype == FT_W_NF4) {
        ft_nf4_view v;
        FT_TRY(dev_nf4_view(&v, W));
        int rc = 0;
#pragma omp parallel for schedule(static) reduction(| : rc) if (rows * cols > 65536)
        for (int64_t i = 0; i < rows; i++)
            rc |= ft_nf4_dequant_range(&v, (r0 + i) * ld + c0, cols, dst + i * cols) ? 1 : 0;
        if (rc) return ft_err(FT_E_INVALID, "cpu-device: NF4 weight tile outside the tensor");
        ft_quant_round_bf16_n(dst, dst, rows * cols);
        return 0;
    }
    const uint16_t *w = W;
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t i = 0; i < rows; i++) ft_quant_bf16_to_f32_n(dst + i * cols, w + (r0 + i) * ld + c0, cols);
    return 0;
}

static int dev_linear_check(const char *op, int wtype, int64_t T, int64_t out, int64_t in,
                            const void *W, const float *a, const float *scratch)
{
    if (wtype != FT_W_F32 && wtype != FT_W_BF16 && wtype != FT_W_NF4)
        return ft_err(FT_E_UNSUPPORTED, "cpu-device %s: weight type %d", op, wtype);
    if (T < 0 || out < 0 || in < 0)
        return ft_err(FT_E_INVALID, "cpu-device %s: T = %lld, out = %lld, in = %lld", op,
                      (long long)T, (long long)out, (long long)in);
    if (wtype != FT_W_F32 && T && out && in && (!W || !a || !scratch))
        return ft_err(FT_E_INVALID, "cpu-device %s: NULL weight, activation or scratch", op);
    /* cu_linear_fwd's to_bf16 reads the activation as float4 and writes bf16 pairs: the same
     * alignment here, so a misplaced buffer fails on the CPU as it would on the GPU */
    if (wtype != FT_W_F32 && T && out && in && (((uintptr_t)a & 15) || ((uintptr_t)scratch & 7)))
        return ft_err(FT_E_INVALID, "cpu-device %s: unaligned activation or scratch buffer "
                      "(%p, %p; 16 and 8 bytes expected)", op, (const void *)a,
                      (const void *)scratch);
    if (wtype == FT_W_NF4 && W) {
        const ft_nf4_tensor *t = W;
        if (t->n != out * in || !ft_nf4_fusable(out, in, t->blocksize, t->nested_blocksize))
            return ft_err(FT_E_INVALID, "cpu-device %s: NF4 weight of %lld values (blocksize %lld, "
                          "nested %lld) for %lld x %lld", op, (long long)t->n, (long long)t->blocksize,
                          (long long)t->nested_blocksize, (long long)out, (long long)in);
    }
    return 0;
}

/* y (T, out) = bf16(x) W^T + beta y (see the section comment); fp32 W as cpu_linear_fwd. */
static int cpu_dev_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                              int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    FT_TRY(dev_linear_check("linear_fwd", wtype, T, out, in, W, x, scratch));
    if (wtype == FT_W_F32) return cpu_linear_fwd(be, y, x, W, wtype, T, out, in, beta, scratch);
    if (!T || !out) return 0;
    if (!in) return beta == 0.0f ? cpu_zero(be, y, (size_t)(T * out) * sizeof(float))
                                 : ft_cpu_scale_f32(y, beta, T * out);
    float *tile = ((ft_cpu_ctx *)be->ctx)->wtile;
    ft_quant_round_bf16_n(scratch, x, T * in);
    int64_t kb = in < DEV_TILE_FLOATS ? in : DEV_TILE_FLOATS;
    int64_t ob = DEV_TILE_FLOATS / kb;
    for (int64_t o0 = 0; o0 < out; o0 += ob) {
        int64_t on = out - o0 < ob ? out - o0 : ob;
        for (int64_t k0 = 0; k0 < in; k0 += kb) {
            int64_t kn = in - k0 < kb ? in - k0 : kb;
            FT_TRY(dev_tile(tile, W, wtype, in, o0, on, k0, kn));
            FT_TRY(ft_cpu_gemm_f32(0, 1, T, on, kn, 1.0f, scratch + k0, in, tile, kn,
                                   k0 ? 1.0f : beta, y + o0, out));
        }
    }
    return 0;
}

/* dx (T, in) = bf16(dy) W + beta dx (see the section comment). */
static int cpu_dev_linear_bwd_x(ft_backend *be, float *dx, const float *dy, const void *W,
                                int wtype, int64_t T, int64_t out, int64_t in, float beta,
                                float *scratch)
{
    FT_TRY(dev_linear_check("linear_bwd_x", wtype, T, out, in, W, dy, scratch));
    if (wtype == FT_W_F32) return cpu_linear_bwd_x(be, dx, dy, W, wtype, T, out, in, beta, scratch);
    if (!T || !in) return 0;
    if (!out) return beta == 0.0f ? cpu_zero(be, dx, (size_t)(T * in) * sizeof(float))
                                  : ft_cpu_scale_f32(dx, beta, T * in);
    float *tile = ((ft_cpu_ctx *)be->ctx)->wtile;
    ft_quant_round_bf16_n(scratch, dy, T * out);
    int64_t cb = in < DEV_TILE_FLOATS ? in : DEV_TILE_FLOATS;
    int64_t ob = DEV_TILE_FLOATS / cb;
    for (int64_t c0 = 0; c0 < in; c0 += cb) {
        int64_t cn = in - c0 < cb ? in - c0 : cb;
        for (int64_t o0 = 0; o0 < out; o0 += ob) {
            int64_t on = out - o0 < ob ? out - o0 : ob;
            FT_TRY(dev_tile(tile, W, wtype, in, o0, on, c0, cn));
            FT_TRY(ft_cpu_gemm_f32(0, 0, T, cn, on, 1.0f, scratch + o0, out, tile, cn,
                                   o0 ? 1.0f : beta, dx + c0, in));
        }
    }
    return 0;
}

/* dst (n bf16) = t dequantized by src/numeric/nf4.c (ft_nf4_dequant_range: bitsandbytes' fp32
 * arithmetic, the same as kernels/cuda/nf4.cu), then rounded to bf16 to nearest even
 * (ft_quant_f32_to_bf16's rule, as __floats2bfloat162_rn), DEV_TILE_FLOATS at a time. */
static int cpu_dev_dequant_nf4(ft_backend *be, uint16_t *dst, const ft_nf4_tensor *t)
{
    if (!dst || !t) return ft_err(FT_E_INVALID, "cpu-device dequant_nf4: NULL argument");
    ft_nf4_view v;
    FT_TRY(dev_nf4_view(&v, t));
    float *tile = ((ft_cpu_ctx *)be->ctx)->wtile;
    for (int64_t e0 = 0; e0 < t->n; e0 += DEV_TILE_FLOATS) {
        int64_t n = t->n - e0 < DEV_TILE_FLOATS ? t->n - e0 : DEV_TILE_FLOATS;
        FT_TRY(ft_nf4_dequant_range(&v, e0, n, tile));
        ft_quant_f32_to_bf16_n(dst + e0, tile, n);
    }
    return 0;
}

/* Events: everything has run when it is queued, so an event is the host time of its record. */
static int cpu_dev_event_record(ft_backend *be, int ev, int lane)
{
    (void)lane;
    if (ev < 0 || ev >= FT_MAX_EVENTS) return ft_err(FT_E_INVALID, "cpu-device: event %d", ev);
    ((ft_cpu_ctx *)be->ctx)->ev_t[ev] = dev_now();
    return 0;
}

static int cpu_dev_event_elapsed(ft_backend *be, int ev0, int ev1, float *ms)
{
    const double *t = ((ft_cpu_ctx *)be->ctx)->ev_t;
    *ms = 0;
    if (ev0 < 0 || ev0 >= FT_MAX_EVENTS || ev1 < 0 || ev1 >= FT_MAX_EVENTS || t[ev0] < 0 || t[ev1] < 0)
        return ft_err(FT_E_INVALID, "cpu-device: event %d or %d out of range or never recorded",
                      ev0, ev1);
    *ms = (float)((t[ev1] - t[ev0]) * 1e3);
    return 0;
}

/* ---- device mode, asynchronous copy lanes (ft_backend_cpu_device_set_lag) -------------- *
 * The H2D and D2H lanes become one worker thread each, running its queue in order, every
 * item after `lag` microseconds, as a GPU's copy engines run beside its compute: a copy the
 * executor forgets to order by an event then reads or writes its buffer at the wrong time,
 * and the results change. The compute lane stays the calling thread (ops run as called):
 *   event_record(ev, lane):   compute: passed at once; copy lane: passed when the worker
 *                             reaches it (a marker item, which also stamps the time);
 *   event_wait(lane, ev):     compute: the caller blocks until ev passed; copy lane: a wait
 *                             item, so later items on the lane run after ev;
 *   event_sync(ev):           the caller blocks until ev passed (any thread);
 *   copy_async(lane, ...):    a copy item; free and host_free first drain both lanes, as
 *                             cudaFree / cudaFreeHost synchronize the device.
 * An event waited on refers to its latest record, as with CUDA events. */

#define LANE_Q 256

typedef struct lane_item {
    int kind; /* 0 copy, 1 marker (event), 2 wait */
    void *dst;
    const void *src;
    size_t bytes;
    int ev, wait_lane;
    uint64_t wait_seq;
} lane_item;

typedef struct ft_cpu_lanes {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, started;
    long lag_us;
    double *ev_t;
    pthread_t th[FT_N_LANES];
    lane_item q[FT_N_LANES][LANE_Q];
    uint64_t enq[FT_N_LANES], done[FT_N_LANES]; /* items queued / finished per lane */
    int ev_lane[FT_MAX_EVENTS];
    uint64_t ev_seq[FT_MAX_EVENTS];             /* passed when done[ev_lane] >= ev_seq */
} ft_cpu_lanes;

typedef struct lane_arg {
    ft_cpu_lanes *q;
    int lane;
} lane_arg;

static int ev_passed(const ft_cpu_lanes *q, int ev)
{
    return q->done[q->ev_lane[ev]] >= q->ev_seq[ev];
}

static void *lane_main(void *p)
{
    ft_cpu_lanes *q = ((lane_arg *)p)->q;
    int l = ((lane_arg *)p)->lane;
    free(p);
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->stop && q->done[l] == q->enq[l]) pthread_cond_wait(&q->cv, &q->mu);
        if (q->done[l] == q->enq[l]) break; /* stopping, queue empty */
        lane_item it = q->q[l][q->done[l] % LANE_Q];
        if (it.kind == 2) {
            while (q->done[it.wait_lane] < it.wait_seq) pthread_cond_wait(&q->cv, &q->mu);
        } else {
            pthread_mutex_unlock(&q->mu);
            if (q->lag_us > 0) {
                struct timespec ts = {q->lag_us / 1000000, (q->lag_us % 1000000) * 1000};
                nanosleep(&ts, NULL);
            }
            if (it.kind == 0) memcpy(it.dst, it.src, it.bytes);
            pthread_mutex_lock(&q->mu);
            if (it.kind == 1) q->ev_t[it.ev] = dev_now();
        }
        q->done[l]++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Queues an item on copy lane l (blocks while the queue is full); mutex held. */
static void lane_push(ft_cpu_lanes *q, int l, const lane_item *it)
{
    while (q->enq[l] - q->done[l] >= LANE_Q) pthread_cond_wait(&q->cv, &q->mu);
    q->q[l][q->enq[l] % LANE_Q] = *it;
    q->enq[l]++;
    pthread_cond_broadcast(&q->cv);
}

static void lanes_drain(ft_cpu_lanes *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    for (int l = 1; l < FT_N_LANES; l++)
        while (q->done[l] < q->enq[l]) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static void lanes_stop(ft_cpu_lanes *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int l = 1; l < q->started; l++) pthread_join(q->th[l], NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

static int lane_ok(int lane, int ev)
{
    if (lane < 0 || lane >= FT_N_LANES || ev < 0 || ev >= FT_MAX_EVENTS)
        return ft_err(FT_E_INVALID, "cpu-device: lane %d, event %d", lane, ev);
    return 0;
}

static int cpu_async_copy(ft_backend *be, int lane, void *dst, const void *src, size_t bytes)
{
    ft_cpu_lanes *q = ((ft_cpu_ctx *)be->ctx)->lanes;
    FT_TRY(lane_ok(lane, 0));
    if (lane == FT_LANE_COMPUTE || !bytes) return cpu_copy(be, dst, src, bytes);
    if (!dst || !src) return ft_err(FT_E_INVALID, "cpu-device copy_async: NULL pointer");
    lane_item it = {0, dst, src, bytes, 0, 0, 0};
    pthread_mutex_lock(&q->mu);
    lane_push(q, lane, &it);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static int cpu_async_event_record(ft_backend *be, int ev, int lane)
{
    ft_cpu_ctx *ctx = be->ctx;
    ft_cpu_lanes *q = ctx->lanes;
    FT_TRY(lane_ok(lane, ev));
    pthread_mutex_lock(&q->mu);
    if (lane == FT_LANE_COMPUTE) {
        ctx->ev_t[ev] = dev_now();
    } else {
        lane_item it = {1, NULL, NULL, 0, ev, 0, 0};
        lane_push(q, lane, &it);
    }
    q->ev_lane[ev] = lane;
    q->ev_seq[ev] = q->enq[lane];
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static int cpu_async_event_wait(ft_backend *be, int lane, int ev)
{
    ft_cpu_lanes *q = ((ft_cpu_ctx *)be->ctx)->lanes;
    FT_TRY(lane_ok(lane, ev));
    pthread_mutex_lock(&q->mu);
    if (lane == FT_LANE_COMPUTE) {
        while (!ev_passed(q, ev)) pthread_cond_wait(&q->cv, &q->mu);
    } else if (!ev_passed(q, ev)) {
        lane_item it = {2, NULL, NULL, 0, ev, q->ev_lane[ev], q->ev_seq[ev]};
        lane_push(q, lane, &it);
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static int cpu_async_event_sync(ft_backend *be, int ev)
{
    ft_cpu_lanes *q = ((ft_cpu_ctx *)be->ctx)->lanes;
    FT_TRY(lane_ok(0, ev));
    pthread_mutex_lock(&q->mu);
    while (!ev_passed(q, ev)) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static void cpu_async_free(ft_backend *be, void *p)
{
    lanes_drain(((ft_cpu_ctx *)be->ctx)->lanes);
    free(p);
}

/* Device memory of cpu-device: host memory, counted (malloc_usable_size, the same at alloc and
 * free) so that ft_backend_mem_free reports what the backend holds as a GPU's would. */
static void *cpu_dev_alloc(ft_backend *be, size_t bytes)
{
    void *p = cpu_alloc(be, bytes);
    if (p) __atomic_add_fetch(&((ft_cpu_ctx *)be->ctx)->dev_bytes, malloc_usable_size(p), __ATOMIC_RELAXED);
    return p;
}

static void cpu_dev_free(ft_backend *be, void *p)
{
    ft_cpu_ctx *ctx = be->ctx;
    if (!p) return;
    __atomic_sub_fetch(&ctx->dev_bytes, malloc_usable_size(p), __ATOMIC_RELAXED);
    if (ctx->lanes) lanes_drain(ctx->lanes); /* a queued copy may still read it */
    free(p);
}

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
    be->ops = &cpu_ops;
    be->ctx = ctx;
    *out = be;
    return 0;
}

int ft_backend_cpu_device_init(ft_backend **out, int n_threads)
{
    if (!out) return ft_err(FT_E_INVALID, "ft_backend_cpu_device_init: out is NULL");
    FT_TRY(ft_backend_cpu_init(out, n_threads));
    ft_backend *be = *out;
    ft_cpu_ctx *ctx = be->ctx;
    ctx->wtile = aligned_alloc(64, (size_t)DEV_TILE_FLOATS * sizeof(float));
    ctx->ev_t = malloc(FT_MAX_EVENTS * sizeof(double));
    if (!ctx->wtile || !ctx->ev_t) {
        ft_backend_free(be);
        *out = NULL;
        return ft_err(-ENOMEM, "ft_backend_cpu_device_init: out of memory");
    }
    for (int i = 0; i < FT_MAX_EVENTS; i++) ctx->ev_t[i] = -1.0;
    ctx->dev_ops = cpu_ops;
    ctx->dev_ops.name = "cpu-device";
    ctx->dev_ops.host_memory = 0;
    ctx->dev_ops.weight_types = FT_WTYPE_BIT(FT_W_F32) | FT_WTYPE_BIT(FT_W_BF16) | FT_WTYPE_BIT(FT_W_NF4);
    ctx->dev_ops.linear_fwd = cpu_dev_linear_fwd;
    ctx->dev_ops.linear_bwd_x = cpu_dev_linear_bwd_x;
    ctx->dev_ops.dequant_nf4 = cpu_dev_dequant_nf4;
    ctx->dev_ops.lm_head_logits_bf16 = NULL; /* as on CUDA: a device's heads are fp32 */
    ctx->dev_ops.event_record = cpu_dev_event_record;
    ctx->dev_ops.event_elapsed = cpu_dev_event_elapsed;
    ctx->dev_ops.alloc = cpu_dev_alloc;
    ctx->dev_ops.free = cpu_dev_free;
    be->ops = &ctx->dev_ops;
    return 0;
}

int ft_backend_cpu_device_mem(ft_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    ft_cpu_ctx *ctx = be ? be->ctx : NULL;
    if (!ctx || !ctx->wtile) /* device mode (its table may be a caller's wrapped copy) */
        return ft_err(FT_E_INVALID, "ft_backend_cpu_device_mem: not a cpu-device backend");
    long pg = sysconf(_SC_PAGESIZE), ph = sysconf(_SC_PHYS_PAGES);
    if (pg <= 0 || ph < 0) return ft_err(-EIO, "sysconf: cannot read the memory size");
    size_t total = (size_t)ph * (size_t)pg, used = __atomic_load_n(&ctx->dev_bytes, __ATOMIC_RELAXED);
    *free_bytes = used < total ? total - used : 0;
    if (total_bytes) *total_bytes = total;
    return 0;
}

int ft_backend_cpu_device_set_lag(ft_backend *be, long lag_us)
{
    ft_cpu_ctx *ctx = be ? be->ctx : NULL;
    if (!ctx || !ctx->wtile || be->ops != &ctx->dev_ops)
        return ft_err(FT_E_INVALID, "ft_backend_cpu_device_set_lag: not a cpu-device backend");
    if (ctx->lanes)
        return ft_err(FT_E_INVALID, "ft_backend_cpu_device_set_lag: the copy lanes already run");
    ft_cpu_lanes *q = calloc(1, sizeof *q);
    if (!q) return ft_err(-ENOMEM, "ft_backend_cpu_device_set_lag: out of memory");
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->lag_us = lag_us > 0 ? lag_us : 0;
    q->ev_t = ctx->ev_t;
    q->started = 1;
    for (int l = 1; l < FT_N_LANES; l++) {
        lane_arg *a = malloc(sizeof *a);
        if (a) *a = (lane_arg){q, l};
        if (!a || pthread_create(&q->th[l], NULL, lane_main, a)) {
            free(a);
            lanes_stop(q);
            return ft_err(-ENOMEM, "ft_backend_cpu_device_set_lag: cannot start the copy lanes");
        }
        q->started = l + 1;
    }
    ctx->lanes = q;
    ctx->dev_ops.copy_async = cpu_async_copy;
    ctx->dev_ops.event_record = cpu_async_event_record;
    ctx->dev_ops.event_wait = cpu_async_event_wait;
    ctx->dev_ops.event_sync = cpu_async_event_sync;
    ctx->dev_ops.host_free = cpu_async_free; /* .free (cpu_dev_free) drains the lanes itself */
    return 0;
}
