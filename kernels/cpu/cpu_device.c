/* cpu_device.c - the CPU backend in device mode, "cpu-device" (kernels.h
 * ft_backend_cpu_device_init): the test-only emulation of a device over the CPU backend's
 * numeric entries (backend.c), with its own frozen products, events, copy lanes and counted
 * "device memory". */
#include <cblas.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_f32.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"

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
 * dimension (deterministic: the tiling depends only on the shape). NF4 weights (FT_WTYPE_NF4, the
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
 * a bf16 matrix widened (exact), or an FT_WTYPE_NF4 tensor dequantized (ft_nf4_dequant_range,
 * bitsandbytes' fp32 arithmetic) and rounded to bf16, the values dequant_nf4 gives; so an NF4
 * product equals dequant_nf4 followed by the bf16 product, bit for bit. Returns 0 or
 * FT_E_INVALID (a bad NF4 description). */
static int dev_tile(float *dst, const void *W, int wtype, int64_t ld, int64_t r0, int64_t rows,
                    int64_t c0, int64_t cols)
{
    if (wtype == FT_WTYPE_NF4) {
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
    if (wtype != FT_WTYPE_F32 && wtype != FT_WTYPE_BF16 && wtype != FT_WTYPE_NF4)
        return ft_err(FT_E_UNSUPPORTED, "cpu-device %s: weight type %d", op, wtype);
    if (T < 0 || out < 0 || in < 0)
        return ft_err(FT_E_INVALID, "cpu-device %s: T = %lld, out = %lld, in = %lld", op,
                      (long long)T, (long long)out, (long long)in);
    if (wtype != FT_WTYPE_F32 && T && out && in && (!W || !a || !scratch))
        return ft_err(FT_E_INVALID, "cpu-device %s: NULL weight, activation or scratch", op);
    /* cu_linear_fwd's to_bf16 reads the activation as float4 and writes bf16 pairs: the same
     * alignment here, so a misplaced buffer fails on the CPU as it would on the GPU */
    if (wtype != FT_WTYPE_F32 && T && out && in && (((uintptr_t)a & 15) || ((uintptr_t)scratch & 7)))
        return ft_err(FT_E_INVALID, "cpu-device %s: unaligned activation or scratch buffer "
                      "(%p, %p; 16 and 8 bytes expected)", op, (const void *)a,
                      (const void *)scratch);
    if (wtype == FT_WTYPE_NF4 && W) {
        const ft_nf4_tensor *t = W;
        if (t->n != out * in || !ft_nf4_fusable(out, in, t->blocksize, t->nested_blocksize))
            return ft_err(FT_E_INVALID, "cpu-device %s: NF4 weight of %lld values (blocksize %lld, "
                          "nested %lld) for %lld x %lld", op, (long long)t->n, (long long)t->blocksize,
                          (long long)t->nested_blocksize, (long long)out, (long long)in);
    }
    return 0;
}

/* y (T, out) = bf16(x) W^T + beta y (see the section comment); fp32 W as ft_cpu_linear_fwd. */
static int cpu_dev_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                              int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    FT_TRY(dev_linear_check("linear_fwd", wtype, T, out, in, W, x, scratch));
    if (wtype == FT_WTYPE_F32) return ft_cpu_linear_fwd(be, y, x, W, wtype, T, out, in, beta, scratch);
    if (!T || !out) return 0;
    if (!in) return beta == 0.0f ? ft_cpu_zero(be, y, (size_t)(T * out) * sizeof(float))
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
    if (wtype == FT_WTYPE_F32) return ft_cpu_linear_bwd_x(be, dx, dy, W, wtype, T, out, in, beta, scratch);
    if (!T || !in) return 0;
    if (!out) return beta == 0.0f ? ft_cpu_zero(be, dx, (size_t)(T * in) * sizeof(float))
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
    if (lane == FT_STREAM_COMPUTE || !bytes) return ft_cpu_copy(be, dst, src, bytes);
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
    if (lane == FT_STREAM_COMPUTE) {
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
    if (lane == FT_STREAM_COMPUTE) {
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
    void *p = ft_cpu_alloc(be, bytes);
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

void ft_cpu_device_ctx_free(ft_cpu_ctx *ctx)
{
    lanes_stop(ctx->lanes);
    free(ctx->wtile);
    free(ctx->ev_t);
}

/* ---- init ------------------------------------------------------------------------------ */

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
    ctx->dev_ops = ft_cpu_ops;
    ctx->dev_ops.name = "cpu-device";
    ctx->dev_ops.host_memory = 0;
    ctx->dev_ops.weight_types = FT_WTYPE_BIT(FT_WTYPE_F32) | FT_WTYPE_BIT(FT_WTYPE_BF16) | FT_WTYPE_BIT(FT_WTYPE_NF4);
    ctx->dev_ops.linear_fwd = cpu_dev_linear_fwd;
    ctx->dev_ops.linear_bwd_x = cpu_dev_linear_bwd_x;
    ctx->dev_ops.dequant_nf4 = cpu_dev_dequant_nf4;
    ctx->dev_ops.lm_head_logits_bf16 = NULL; /* as on CUDA: a device's heads are fp32 */
    ctx->dev_ops.event_record = cpu_dev_event_record;
    ctx->dev_ops.event_elapsed = cpu_dev_event_elapsed;
    ctx->dev_ops.alloc = cpu_dev_alloc;
    ctx->dev_ops.free = cpu_dev_free;
    ctx->dev_ops.mem_info = ft_backend_cpu_device_mem;
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
