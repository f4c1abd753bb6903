/* pack_build.c - the pack builder (see pack.h ft_pack_build / ft_pack_build_ex): each layer
 * block is assembled in memory (two buffers: block l + 1 is made while a writer thread
 * hashes and writes block l); the global block (embeddings, LM head) is streamed through two
 * chunk buffers to the same writer, which hashes it in file order. */
#include "offload/pack.h"

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "offload/pack_internal.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/numeric/quant.h"

#define CHUNK_FLOATS ((int64_t)1 << 24)  /* serial source: values per read_f32 call */
#define TASK_FLOATS ((int64_t)1 << 16)   /* concurrent source: values per thread chunk */
#define STREAM_BYTES ((int64_t)32 << 20) /* global block: bytes per writer chunk */

/* ---- the writer thread --------------------------------------------------------------------
 * Jobs run in submission order: hash (the global block's running xxh64, or a layer block's
 * one-shot xxh64 into *digest), pwrite, start writeback. Buffers are named by slot; the
 * producer waits for a slot's jobs before refilling it. After an error the remaining jobs
 * are skipped (their slots still released) and the first error is kept. */

enum { SLOT_LAYER0, SLOT_LAYER1, SLOT_STREAM0, SLOT_STREAM1, SLOT_SMALL, N_SLOTS };
#define WQ 16

typedef struct wjob {
    const uint8_t *buf;
    size_t len;
    int64_t off;
    uint64_t *digest;          /* one-shot xxh64 of this job into *digest; NULL: stream hash */
    int slot;
} wjob;

typedef struct writer {
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    wjob q[WQ];
    int head, count, stop;
    int busy[N_SLOTS];
    int fd;
    int fd_direct;             /* the same file opened with O_DIRECT, or -1 */
    const char *path;
    ft_xxh64_state stream;     /* running hash of the global block */
    int rc;
    char msg[600];
    double busy_s;             /* seconds spent hashing and writing */
} writer;

static int pwrite_all(int fd, const void *buf, size_t n, int64_t off, const char *path)
{
    const char *p = buf;
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = pwrite(fd, p, k, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return ft_err(-e, "%s: write failed at offset %lld: %s", path, (long long)off, strerror(e));
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *writer_main(void *arg)
{
    writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->count && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->count) break;
        wjob j = w->q[w->head];
        int failed = w->rc != 0;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        if (!failed) {
            double t0 = now_s();
            if (j.digest) *j.digest = ft_xxh64(j.buf, j.len, 0);
            else ft_xxh64_update(&w->stream, j.buf, j.len);
            /* with direct_io, aligned jobs (all but a tiny pack's) go straight to the device:
             * no copy into the page cache, no pile of dirty pages for the final fsync */
            int direct = w->fd_direct >= 0 && ((uintptr_t)j.buf % FT_PACK_ALIGN) == 0 &&
                         j.len % FT_PACK_ALIGN == 0 && j.off % FT_PACK_ALIGN == 0;
            if (direct) {
                rc = pwrite_all(w->fd_direct, j.buf, j.len, j.off, w->path);
                if (rc == -EINVAL) { /* the file system refuses O_DIRECT after all */
                    close(w->fd_direct);
                    w->fd_direct = -1;
                    direct = 0;
                    ft_err_clear();
                }
            }
            if (!direct) rc = pwrite_all(w->fd, j.buf, j.len, j.off, w->path);
#ifdef SYNC_FILE_RANGE_WRITE
            /* start writeback now, so the final fsync has little left (errors: fsync's) */
            if (!rc && !direct && j.len >= ((size_t)1 << 20))
                (void)sync_file_range(w->fd, j.off, (off_t)j.len, SYNC_FILE_RANGE_WRITE);
#endif
            w->busy_s += now_s() - t0;
        }
        pthread_mutex_lock(&w->mu);
        if (rc && !w->rc) {
            w->rc = rc;
            snprintf(w->msg, sizeof w->msg, "%s", ft_errmsg());
        }
        w->head = (w->head + 1) % WQ;
        w->count--;
        w->busy[j.slot]--;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int writer_start(writer *w, int fd, const char *path, int direct)
{
    memset(w, 0, sizeof *w);
    w->fd = fd;
    w->fd_direct = direct ? open(path, O_WRONLY | O_DIRECT | O_CLOEXEC) : -1; /* -1: buffered */
    w->path = path;
    ft_xxh64_init(&w->stream, 0);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int e = pthread_create(&w->th, NULL, writer_main, w);
    if (e) {
        if (w->fd_direct >= 0) close(w->fd_direct);
        return ft_err(-e, "%s: cannot start the writer thread: %s", path, strerror(e));
    }
    w->started = 1;
    return 0;
}

/* The writer's first error (recorded again in this thread), or 0. */
static int writer_error(writer *w)
{
    pthread_mutex_lock(&w->mu);
    int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    return rc ? ft_err(rc, "%s", w->msg) : 0;
}

static int writer_submit(writer *w, const void *buf, size_t len, int64_t off, uint64_t *digest,
                         int slot)
{
    pthread_mutex_lock(&w->mu);
    while (w->count == WQ) pthread_cond_wait(&w->cv, &w->mu);
    w->q[(w->head + w->count) % WQ] = (wjob){buf, len, off, digest, slot};
    w->count++;
    w->busy[slot]++;
    pthread_cond_broadcast(&w->cv);
    int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    return rc ? writer_error(w) : 0;
}

/* Waits until every job of slot (or, slot < 0, every job) is done; returns the writer's error. */
static int writer_wait(writer *w, int slot)
{
    pthread_mutex_lock(&w->mu);
    while (slot >= 0 ? w->busy[slot] > 0 : w->count > 0) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return writer_error(w);
}

static void writer_stop(writer *w)
{
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    if (w->fd_direct >= 0) close(w->fd_direct);
    w->fd_direct = -1;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->started = 0;
}

/* ---- the exact sum of the absmax values ------------------------------------------------- */

double ft_pack_sum_nonneg(const float *x, int64_t n)
{
    /* x = M * 2^(max(e, 1) - 150) for the exponent field e and 24-bit significand M: per
     * exponent, the sum of the significands is an exact integer (2^40 values fit in 64
     * bits). Then sum bins[e] * 2^(max(e, 1) - 1) in a 384-bit integer (units of 2^-149)
     * and round it to 53 bits, half to even. */
    if (n <= 0) return 0.0;
    if (n > ((int64_t)1 << 40)) return ft_nf4_fsum(x, n);
    uint64_t bins[255] = {0};
    int bad = 0;
#pragma omp parallel if (n > 65536)
    {
        uint64_t my[255] = {0};
        int my_bad = 0;
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            uint32_t e = u >> 23; /* sign bit set: e >= 256 */
            if (e >= 255) {
                my_bad = 1;
                continue;
            }
            my[e] += (u & 0x7fffffu) | (e ? 0x800000u : 0);
        }
#pragma omp critical(ft_pack_sum_bins)
        {
            for (int e = 0; e < 255; e++) bins[e] += my[e];
            bad |= my_bad;
        }
    }
    if (bad) return ft_nf4_fsum(x, n);
    uint64_t acc[6] = {0};
    for (int e = 0; e < 255; e++) {
        if (!bins[e]) continue;
        int s = (e ? e : 1) - 1, w = s / 64, b = s % 64;
        uint64_t lo = bins[e] << b, hi = b ? bins[e] >> (64 - b) : 0;
        uint64_t c = 0;
        for (int k = w; k < 6; k++) {
            uint64_t add = k == w ? lo : k == w + 1 ? hi : 0;
            uint64_t t = acc[k] + add;
            uint64_t c1 = t < add;
            uint64_t t2 = t + c;
            c = c1 | (t2 < t);
            acc[k] = t2;
            if (k > w + 1 && !c) break;
        }
    }
    int top = -1;
    for (int k = 5; k >= 0 && top < 0; k--)
        if (acc[k]) top = k * 64 + 63 - __builtin_clzll(acc[k]);
    if (top < 0) return 0.0;
    if (top < 53) return ldexp((double)acc[0], -149); /* exact */
#define BIT(i) ((acc[(i) / 64] >> ((i) % 64)) & 1u)
    uint64_t mant = 0;
    for (int i = top; i > top - 53; i--) mant = mant << 1 | BIT(i);
    int guard = (int)BIT(top - 53), sticky = 0;
    for (int i = top - 54; i >= 0 && !sticky; i--) sticky = (int)BIT(i);
#undef BIT
    if (guard && (sticky || (mant & 1))) mant++;
    return ldexp((double)mant, top - 52 - 149);
}

/* ---- building -------------------------------------------------------------------------- */

typedef struct builder {
    const ft_model_config *c;
    const ft_pack_settings *s;
    const ft_pack_src *src;
    const char *path;
    int fd;
    int concurrent;
    int n_threads;             /* OpenMP team size with a concurrent source */
    float map[256];
    float *scratch;            /* serial source: a chunk of fp32 source values */
    int64_t scratch_n;
    float *tscratch;           /* concurrent source: n_threads chunks of task_n floats */
    int64_t task_n;
    float *absmax;             /* per-tensor fp32 absmax (largest n_blocks) */
    int64_t absmax_n;
    uint8_t *block[2];         /* two layer blocks (the largest) */
    int64_t block_n;
    uint8_t *stream[2];        /* the global block's chunk buffers (stream_n + stream_slack) */
    int64_t stream_n;          /* bytes per write, a multiple of FT_PACK_ALIGN */
    int64_t stream_slack;      /* the most bytes appended at once (>= one row in fp32) */
    writer w;
} builder;

/* Rows per chunk: as many as fit cap values, a multiple that keeps NF4 blocks whole. */
static int64_t chunk_rows(int64_t rows, int64_t cols, int64_t bs, int64_t cap)
{
    int64_t r = cap / cols;
    if (bs > 0) {
        int64_t g = cols, b = bs; /* rows per whole number of blocks: bs / gcd(cols, bs) */
        while (b) { int64_t t = g % b; g = b; b = t; }
        int64_t unit = bs / g;
        r = r / unit * unit;
        if (r < unit) r = unit;
    }
    if (r < 1) r = 1;
    return r > rows ? rows : r;
}

/* fp32 -> bf16 into block bytes (2-aligned: every offset in a block is even). */
static void to_bf16(const float *x, uint8_t *dst, int64_t n)
{
    ft_quant_f32_to_bf16_n((uint16_t *)(void *)dst, x, n);
}

/* Stores cnt source values (elements e0.. of tensor r) into the block: BF16, F32 or NF4
 * stage 1 (codes + fp32 absmax). */
static int store_values(builder *b, int64_t l, const ft_pack_tensor *r, const ft_nf4_layout *lay,
                        const float *x, int64_t e0, int64_t cnt, uint8_t *blk)
{
    if (r->dtype == FT_PACK_DT_BF16) {
        to_bf16(x, blk + r->data_off + 2 * e0, cnt);
    } else if (r->dtype == FT_PACK_DT_F32) {
        memcpy(blk + r->data_off + 4 * e0, x, (size_t)cnt * 4);
    } else {
        int rc = ft_nf4_quantize_part(x, lay, e0, cnt, blk + r->data_off, b->absmax);
        if (rc < 0)
            return ft_err_prefix(rc, "layer %lld %s", (long long)l,
                                 ft_proj_name[r->role - FT_PACK_ROLE_W0]);
    }
    return 0;
}

/* The first error of a parallel loop, by task index (so the message does not depend on
 * the thread count or the schedule). */
typedef struct par_err {
    int64_t task;
    int rc;
    char msg[600];
} par_err;

static void par_err_put(par_err *pe, int64_t task, int rc)
{
#pragma omp critical(ft_pack_par_err)
    if (task < pe->task) {
#pragma omp atomic write
        pe->task = task;
        pe->rc = rc;
        snprintf(pe->msg, sizeof pe->msg, "%s", ft_errmsg());
    }
}

/* Where put() stores a chunk: a layer block (NF4 stage 1 / BF16 / F32 at the element's
 * place, lay for NF4) or a stream chunk that starts at row row0 of the tensor. */
typedef struct put_ctx {
    const ft_nf4_layout *lay;
    uint8_t *dst;
    int64_t row0;
    int stream;
} put_ctx;

/* Stores rows [r0, r0 + nr) of tensor r (values x) as put_ctx says. */
static int put_rows(builder *b, int64_t l, const ft_pack_tensor *r, const put_ctx *pc,
                    const float *x, int64_t r0, int64_t nr)
{
    int64_t cnt = nr * r->cols;
    if (!pc->stream) return store_values(b, l, r, pc->lay, x, r0 * r->cols, cnt, pc->dst);
    uint8_t *to = pc->dst + (r0 - pc->row0) * r->cols * (r->dtype == FT_PACK_DT_BF16 ? 2 : 4);
    if (r->dtype == FT_PACK_DT_BF16) to_bf16(x, to, cnt);
    else memcpy(to, x, (size_t)cnt * 4);
    return 0;
}

/* Rows [row_a, row_b) of tensor r of block l (-1: global), in row chunks read from the
 * source and stored by put_rows. Concurrent source: each OpenMP thread reads and stores its
 * own task-sized chunk (whole NF4 blocks); serial source: one big chunk at a time, the
 * conversion parallel inside. */
static int for_rows(builder *b, int64_t l, const ft_pack_tensor *r, const put_ctx *pc,
                    int64_t row_a, int64_t row_b)
{
    const ft_pack_src *src = b->src;
    const int64_t cols = r->cols, bs = r->dtype == FT_PACK_DT_NF4 ? r->blocksize : 0;
    if (!b->concurrent) {
        int64_t cr = chunk_rows(row_b - row_a, cols, bs, b->scratch_n);
        for (int64_t r0 = row_a; r0 < row_b; r0 += cr) {
            int64_t nr = r0 + cr <= row_b ? cr : row_b - r0;
            FT_TRY(src->read_f32(src->user, l, (int)r->role, r0, nr, cols, b->scratch));
            FT_TRY(put_rows(b, l, r, pc, b->scratch, r0, nr));
        }
        return 0;
    }
    int64_t cr = chunk_rows(row_b - row_a, cols, bs, b->task_n);
    int64_t n_tasks = (row_b - row_a + cr - 1) / cr;
    par_err pe = {INT64_MAX, 0, ""};
#pragma omp parallel num_threads(b->n_threads) if (n_tasks > 1)
    {
        float *x = b->tscratch + (size_t)omp_get_thread_num() * (size_t)b->task_n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; t++) {
            int64_t seen;
#pragma omp atomic read
            seen = pe.task;
            if (seen < t) continue; /* an earlier chunk failed */
            int64_t r0 = row_a + t * cr, nr = r0 + cr <= row_b ? cr : row_b - r0;
            int rc = src->read_f32(src->user, l, (int)r->role, r0, nr, cols, x);
            if (!rc) rc = put_rows(b, l, r, pc, x, r0, nr);
            if (rc < 0) par_err_put(&pe, t, rc);
        }
    }
    return pe.rc ? ft_err(pe.rc, "%s", pe.msg) : 0;
}

/* Fills one tensor of a layer block in memory. */
static int fill_tensor(builder *b, int64_t l, ft_pack_tensor *r, int pre, uint8_t *blk)
{
    const ft_pack_src *src = b->src;
    const int64_t rows = r->rows, cols = r->cols, n = rows * cols;
    ft_nf4_view v;
    if (pre) {
        int k = src->read_nf4(src->user, l, (int)r->role, &v);
        if (k <= 0) return k < 0 ? k : ft_err(FT_E_INVALID, "pre-quantized tensor vanished");
    }
    if (r->dtype == FT_PACK_DT_NF4 && pre) { /* copy the bitsandbytes state verbatim */
        memcpy(blk + r->data_off, v.codes, (size_t)v.lay.code_bytes);
        if (v.lay.nested_blocksize) {
            memcpy(blk + r->absmax_off, v.qabsmax, (size_t)v.lay.n_blocks);
            memcpy(blk + r->nested_off, v.nested_absmax, (size_t)v.lay.n_nested * 4);
            memcpy(blk + r->map_off, v.nested_map, 256 * 4);
            r->offset = v.offset;
        } else {
            memcpy(blk + r->absmax_off, v.absmax, (size_t)v.lay.n_blocks * 4);
        }
        memcpy(blk + r->code_off, v.code, 16 * 4);
        return 0;
    }
    ft_nf4_layout lay;
    if (r->dtype == FT_PACK_DT_NF4) FT_TRY(ft_nf4_layout_init(&lay, n, r->blocksize, r->nested_blocksize));
    if (pre) { /* a bnb weight stored as BF16: dequantize in chunks (serial source) */
        int64_t cr = chunk_rows(rows, cols, 0, b->scratch_n);
        for (int64_t r0 = 0; r0 < rows; r0 += cr) {
            int64_t nr = r0 + cr <= rows ? cr : rows - r0;
            FT_TRY(ft_nf4_dequant_range(&v, r0 * cols, nr * cols, b->scratch));
            FT_TRY(store_values(b, l, r, &lay, b->scratch, r0 * cols, nr * cols, blk));
        }
    } else {
        put_ctx pc = {&lay, blk, 0, 0};
        FT_TRY(for_rows(b, l, r, &pc, 0, rows));
    }
    if (r->dtype == FT_PACK_DT_NF4) {
        if (lay.nested_blocksize) {
            /* nf4.c's double quantization; only the offset's exact sum runs in parallel */
            FT_TRY(ft_nf4_quantize_nested_sum(b->absmax, &lay, b->map,
                                              ft_pack_sum_nonneg(b->absmax, lay.n_blocks),
                                              blk + r->absmax_off, (float *)(blk + r->nested_off),
                                              &r->offset));
            memcpy(blk + r->map_off, b->map, sizeof b->map);
        } else {
            memcpy(blk + r->absmax_off, b->absmax, (size_t)lay.n_blocks * 4);
        }
        memcpy(blk + r->code_off, ft_nf4_code, sizeof ft_nf4_code);
    }
    return 0;
}

/* Zeroes the bytes of a block that no tensor region covers (alignment gaps, the tail), so
 * a reused buffer needs no full memset. The directory itself is copied in afterwards. */
static int cmp_region(const void *a, const void *b)
{
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

static int zero_gaps(uint8_t *blk, const ft_pack_tensor *rec, int n, int64_t bytes)
{
    int64_t reg[FT_PACK_MAX_SLOTS * 5 + 1][2];
    int k = 0;
    reg[k][0] = 0;
    reg[k++][1] = (int64_t)n * (int64_t)sizeof(ft_pack_tensor);
    for (int i = 0; i < n; i++) {
        const ft_pack_tensor *r = &rec[i];
        reg[k][0] = r->data_off;
        reg[k++][1] = r->data_bytes;
        if (r->dtype != FT_PACK_DT_NF4) continue;
        ft_nf4_layout lay;
        FT_TRY(ft_nf4_layout_init(&lay, r->rows * r->cols, r->blocksize, r->nested_blocksize));
        reg[k][0] = r->absmax_off;
        reg[k++][1] = lay.nested_blocksize ? lay.n_blocks : 4 * lay.n_blocks;
        if (lay.nested_blocksize) {
            reg[k][0] = r->nested_off;
            reg[k++][1] = 4 * lay.n_nested;
            reg[k][0] = r->map_off;
            reg[k++][1] = 4 * 256;
        }
        reg[k][0] = r->code_off;
        reg[k++][1] = 4 * 16;
    }
    qsort(reg, (size_t)k, sizeof reg[0], cmp_region);
    int64_t pos = 0;
    for (int i = 0; i < k; i++) {
        if (reg[i][0] > pos) memset(blk + pos, 0, (size_t)(reg[i][0] - pos));
        if (reg[i][0] + reg[i][1] > pos) pos = reg[i][0] + reg[i][1];
    }
    if (pos < bytes) memset(blk + pos, 0, (size_t)(bytes - pos));
    return 0;
}

/* Makes layer l's block in buffer `slot` (waiting for its previous write) and hands it to
 * the writer; the writer fills tb->checksum. */
static int build_layer(builder *b, int64_t l, int slot, ft_pack_block *tb, int64_t off)
{
    ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
    int pre[FT_PACK_MAX_SLOTS], n;
    int64_t bytes;
    FT_TRY(ft_pack_plan_block(b->c, b->s, b->src, l, rec, &n, &bytes, pre));
    FT_TRY(writer_wait(&b->w, SLOT_LAYER0 + slot));
    uint8_t *blk = b->block[slot];
    FT_TRY(zero_gaps(blk, rec, n, bytes));
    for (int i = 0; i < n; i++) {
        FT_TRY(fill_tensor(b, l, &rec[i], pre[i], blk));
        if (b->src->release) b->src->release(b->src->user, l, (int)rec[i].role);
    }
    memcpy(blk, rec, sizeof(ft_pack_tensor) * (size_t)n);
    *tb = (ft_pack_block){(uint64_t)off, (uint64_t)bytes, 0, (uint32_t)l, (uint32_t)n};
    return writer_submit(&b->w, blk, (size_t)bytes, off, &tb->checksum, SLOT_LAYER0 + slot);
}

/* ---- the global block, streamed ------------------------------------------------------------
 * Bytes are appended to stream[cur] (capacity stream_n + slack); each time stream_n bytes
 * are there they go to the writer as one chunk (aligned offset and size: O_DIRECT) and the
 * overhang (< slack) moves to the other buffer. Every append is at most slack bytes. */

typedef struct gstream {
    builder *b;
    int cur;
    int64_t used;              /* bytes filled in stream[cur] */
    int64_t off;               /* file offset of stream[cur]'s first byte */
} gstream;

static int gs_submit(gstream *g, int64_t n)
{
    return writer_submit(&g->b->w, g->b->stream[g->cur], (size_t)n, g->off, NULL,
                         SLOT_STREAM0 + g->cur);
}

/* n (<= slack) bytes at the stream's end, to be filled, then gs_commit(n). */
static uint8_t *gs_reserve(gstream *g) { return g->b->stream[g->cur] + g->used; }

static int gs_commit(gstream *g, int64_t n)
{
    builder *b = g->b;
    g->used += n;
    if (g->used < b->stream_n) return 0;
    FT_TRY(gs_submit(g, b->stream_n));
    int next = g->cur ^ 1;
    FT_TRY(writer_wait(&b->w, SLOT_STREAM0 + next));
    memcpy(b->stream[next], b->stream[g->cur] + b->stream_n, (size_t)(g->used - b->stream_n));
    g->used -= b->stream_n;
    g->off += b->stream_n;
    g->cur = next;
    return 0;
}

static int gs_zeros(gstream *g, int64_t n)
{
    while (n > 0) {
        int64_t k = n < g->b->stream_slack ? n : g->b->stream_slack;
        memset(gs_reserve(g), 0, (size_t)k);
        FT_TRY(gs_commit(g, k));
        n -= k;
    }
    return 0;
}

static int build_global(builder *b, ft_pack_block *tb, int64_t off)
{
    ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
    int pre[FT_PACK_MAX_SLOTS], n;
    int64_t bytes;
    FT_TRY(ft_pack_plan_block(b->c, b->s, b->src, -1, rec, &n, &bytes, pre));
    gstream g = {b, 0, 0, off};
    FT_TRY(writer_wait(&b->w, SLOT_STREAM0));
    int64_t dir = (int64_t)sizeof(ft_pack_tensor) * n; /* <= slack (plan_all) */
    memcpy(gs_reserve(&g), rec, (size_t)dir);
    FT_TRY(gs_commit(&g, dir));
    int64_t pos = dir;
    for (int i = 0; i < n; i++) {
        ft_pack_tensor *r = &rec[i];
        FT_TRY(gs_zeros(&g, r->data_off - pos)); /* alignment padding */
        int64_t esz = r->dtype == FT_PACK_DT_BF16 ? 2 : 4;
        int64_t cr = b->stream_slack / (esz * r->cols); /* >= 1 (plan_all) */
        if (cr > r->rows) cr = r->rows;
        for (int64_t r0 = 0; r0 < r->rows; r0 += cr) {
            int64_t nr = r0 + cr <= r->rows ? cr : r->rows - r0;
            put_ctx pc = {NULL, gs_reserve(&g), r0, 1};
            FT_TRY(for_rows(b, -1, r, &pc, r0, r0 + nr));
            FT_TRY(gs_commit(&g, nr * r->cols * esz));
        }
        pos = r->data_off + r->data_bytes;
        if (b->src->release) b->src->release(b->src->user, -1, (int)r->role);
    }
    FT_TRY(gs_zeros(&g, bytes - pos));
    if (g.used) FT_TRY(gs_submit(&g, g.used)); /* the rest: a multiple of 4096 too */
    FT_TRY(writer_wait(&b->w, -1));
    *tb = (ft_pack_block){(uint64_t)off, (uint64_t)bytes, ft_xxh64_digest(&b->w.stream),
                          FT_PACK_GLOBAL, (uint32_t)n};
    return 0;
}

/* Sizes every block and the largest buffers the build needs. */
static int plan_all(builder *b, int64_t *blk_bytes, int64_t *max_layer, int64_t *max_src)
{
    const ft_model_config *c = b->c;
    int64_t L = c->num_hidden_layers, max_n = 1, max_nb = 1, max_need = 1, max_row = 1;
    *max_layer = 0;
    *max_src = 0;
    for (int64_t l = -1; l < L; l++) {
        if (ft_pack_min_block_bytes(c, l, (uint32_t)b->s->quant) > ((uint64_t)1 << 50))
            return ft_err(FT_E_INVALID, "%s: the config's %s tensors are too large to pack "
                          "(over 1 PiB)", b->path, l < 0 ? "embedding/head" : "layer");
        ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
        int pre[FT_PACK_MAX_SLOTS], n;
        FT_TRY(ft_pack_plan_block(c, b->s, b->src, l, rec, &n, &blk_bytes[l < 0 ? L : l], pre));
        int64_t src_bytes = 0;
        for (int i = 0; i < n; i++) {
            int64_t e = rec[i].rows * rec[i].cols;
            /* a chunk must hold one row, or one NF4 row unit */
            int64_t need = rec[i].cols;
            if (rec[i].dtype == FT_PACK_DT_NF4)
                need = chunk_rows(rec[i].rows, rec[i].cols, rec[i].blocksize, 1) * rec[i].cols;
            if (need > max_need) max_need = need;
            if (l < 0 && rec[i].cols > max_row) max_row = rec[i].cols;
            if (e > max_n) max_n = e;
            if (rec[i].dtype == FT_PACK_DT_NF4 && e / rec[i].blocksize + 1 > max_nb)
                max_nb = e / rec[i].blocksize + 1;
            src_bytes += 2 * e;
        }
        if (l >= 0 && blk_bytes[l] > *max_layer) *max_layer = blk_bytes[l];
        if (l >= 0 && src_bytes > *max_src) *max_src = src_bytes;
    }
    b->scratch_n = max_n < CHUNK_FLOATS ? max_n : CHUNK_FLOATS;
    if (b->scratch_n < 2048) b->scratch_n = 2048;
    if (b->scratch_n < max_need) b->scratch_n = max_need;
    if (b->task_n < max_need) b->task_n = max_need;
    b->absmax_n = max_nb;
    b->block_n = *max_layer;
    /* the global block goes out in chunks of stream_n bytes (the whole block when smaller);
     * appends of up to stream_slack: an eighth of a chunk, at least a row in fp32 and the
     * directory */
    b->stream_n = blk_bytes[L] < b->stream_n ? blk_bytes[L] : b->stream_n;
    b->stream_slack = b->stream_n / 8;
    if (b->stream_slack < 4 * max_row) b->stream_slack = 4 * max_row;
    if (b->stream_slack < (int64_t)sizeof(ft_pack_tensor) * FT_PACK_MAX_SLOTS)
        b->stream_slack = (int64_t)sizeof(ft_pack_tensor) * FT_PACK_MAX_SLOTS;
    b->stream_slack = align_up(b->stream_slack, FT_PACK_ALIGN);
    return 0;
}

/* Bytes before block 0: the header, the config.json text and n_blocks table entries, padded
 * to FT_PACK_ALIGN. */
static int64_t header_bytes(int64_t n_blocks, size_t config_len)
{
    return align_up((int64_t)sizeof(ft_pack_hdr) + (int64_t)config_len +
                    n_blocks * (int64_t)sizeof(ft_pack_block), FT_PACK_ALIGN);
}

int ft_pack_layout(const ft_model_config *cfg, size_t config_len, const ft_pack_settings *s,
                   const ft_pack_src *src, uint64_t *block_bytes, uint64_t *file_bytes)
{
    if (s->quant != FT_PACK_QUANT_NF4 && s->quant != FT_PACK_QUANT_BF16)
        return ft_err(FT_E_INVALID, "pack layout: unknown quantization %d", s->quant);
    const int64_t L = cfg->num_hidden_layers;
    if (L < 1 || L > 100000 || config_len > (1u << 24))
        return ft_err(FT_E_INVALID, "pack layout: bad model config (%lld layers)", (long long)L);
    uint64_t total = (uint64_t)header_bytes(L + 1, config_len);
    for (int64_t l = -1; l < L; l++) { /* plan_all's checks and planning */
        if (ft_pack_min_block_bytes(cfg, l, (uint32_t)s->quant) > ((uint64_t)1 << 50))
            return ft_err(FT_E_INVALID, "pack layout: the config's %s tensors are too large to "
                          "pack (over 1 PiB)", l < 0 ? "embedding/head" : "layer");
        ft_pack_tensor rec[FT_PACK_MAX_SLOTS];
        int pre[FT_PACK_MAX_SLOTS], n;
        int64_t bytes;
        FT_TRY(ft_pack_plan_block(cfg, s, src, l, rec, &n, &bytes, pre));
        block_bytes[l < 0 ? L : l] = (uint64_t)bytes;
        total += (uint64_t)bytes;
    }
    *file_bytes = total;
    return 0;
}

int ft_pack_build(const char *path, const ft_model_config *cfg, const char *config_json,
                  size_t config_len, uint64_t identity, const ft_pack_settings *s,
                  const ft_pack_src *src, ft_pack_stats *st)
{
    return ft_pack_build_ex(path, cfg, config_json, config_len, identity, s, src, NULL, st);
}

static void *alloc_aligned(int64_t n)
{
    void *p = NULL;
    return posix_memalign(&p, FT_PACK_ALIGN, (size_t)(n > 0 ? n : 4096)) ? NULL : p;
}

int ft_pack_build_ex(const char *path, const ft_model_config *cfg, const char *config_json,
                     size_t config_len, uint64_t identity, const ft_pack_settings *s,
                     const ft_pack_src *src, const ft_pack_build_opts *o, ft_pack_stats *st)
{
    double t0 = now_s();
    if (s->quant != FT_PACK_QUANT_NF4 && s->quant != FT_PACK_QUANT_BF16)
        return ft_err(FT_E_INVALID, "%s: unknown quantization %d", path, s->quant);
    if (cfg->num_hidden_layers < 1 || cfg->num_hidden_layers > 100000 || config_len > (1u << 24))
        return ft_err(FT_E_INVALID, "%s: bad model config (%lld layers)", path,
                      (long long)cfg->num_hidden_layers);
    builder b = {cfg, s, src, path, -1};
    b.concurrent = o && o->concurrent_src;
    b.task_n = o && o->chunk_floats > 0 ? o->chunk_floats : TASK_FLOATS;
    b.stream_n = o && o->stream_bytes > 0 ? align_up(o->stream_bytes, FT_PACK_ALIGN) : STREAM_BYTES;
    b.n_threads = omp_get_max_threads();
    ft_nf4_dynamic_map(b.map);
    const int64_t L = cfg->num_hidden_layers;
    /* a partial pack: layers [0, n_lay), no global block */
    const int64_t limit = o ? o->layer_limit : 0;
    if (limit < 0 || limit > L)
        return ft_err(FT_E_INVALID, "%s: layer limit %lld outside [0, %lld]", path,
                      (long long)limit, (long long)L);
    const int partial = limit > 0;
    const int64_t n_lay = partial ? limit : L, n_blk = partial ? limit : L + 1;
    int64_t *blk_bytes = calloc((size_t)(L + 1), sizeof *blk_bytes);
    ft_pack_block *tab = calloc((size_t)(L + 1), sizeof *tab);
    int64_t hb = header_bytes(n_blk, config_len);
    uint8_t *hdr = calloc(1, (size_t)hb);
    char tmp[4200];
    int rc = 0;
    int64_t max_layer = 0, max_src = 0, buf_bytes = 0;
    if (!blk_bytes || !tab || !hdr) rc = ft_err(-ENOMEM, "%s: out of memory", path);
    if (!rc) rc = plan_all(&b, blk_bytes, &max_layer, &max_src);
    if (!rc) {
        /* layer blocks: two only when there is a next layer to overlap with; the global
         * block's stream buffers only when it is written */
        int n_blocks = n_lay > 1 ? 2 : 1;
        b.scratch = b.concurrent ? NULL : malloc((size_t)b.scratch_n * 4);
        b.tscratch = b.concurrent ? malloc((size_t)b.task_n * 4 * (size_t)b.n_threads) : NULL;
        b.absmax = malloc((size_t)b.absmax_n * 4);
        for (int i = 0; i < n_blocks; i++) b.block[i] = alloc_aligned(b.block_n);
        if (n_blocks == 1) b.block[1] = b.block[0];
        if (!partial) {
            b.stream[0] = alloc_aligned(b.stream_n + b.stream_slack);
            b.stream[1] = alloc_aligned(b.stream_n + b.stream_slack);
        }
        buf_bytes = (b.concurrent ? b.task_n * 4 * b.n_threads : b.scratch_n * 4) +
                    b.absmax_n * 4 + n_blocks * b.block_n +
                    (partial ? 0 : 2 * (b.stream_n + b.stream_slack));
        if ((!b.scratch && !b.tscratch) || !b.absmax || !b.block[0] || !b.block[1] ||
            (!partial && (!b.stream[0] || !b.stream[1])))
            rc = ft_err(-ENOMEM, "%s: cannot allocate the build buffers (%.1f MiB)", path,
                        buf_bytes / 1048576.0);
    }
    if (!rc && (b.fd = ft_tmp_open(path, tmp, sizeof tmp)) < 0) {
        rc = b.fd;
        b.fd = -1;
    }
    if (!rc) rc = writer_start(&b.w, b.fd, tmp, o && o->direct_io);
    int64_t off = hb;
    double t_lay = now_s(), layer_s = 0;
    for (int64_t l = 0; !rc && l < n_lay; l++) {
        rc = build_layer(&b, l, (int)(l & 1), &tab[l], off);
        off += blk_bytes[l];
    }
    /* a partial pack: until its blocks are written; a whole pack goes on with the global
     * block while the writer still has the last layer block (no wait added there) */
    if (!rc && partial) rc = writer_wait(&b.w, -1);
    layer_s = now_s() - t_lay;
    if (!rc && !partial) rc = build_global(&b, &tab[L], off);
    if (!rc) rc = writer_wait(&b.w, -1);
    writer_stop(&b.w);
    if (!rc) {
        if (!partial) off += blk_bytes[L];
        ft_pack_hdr h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, FT_PACK_MAGIC, 8);
        h.version = FT_PACK_VERSION;
        h.header_bytes = (uint32_t)hb;
        h.quant = (uint32_t)s->quant;
        h.blocksize = (uint32_t)s->blocksize;
        h.nested_blocksize = (uint32_t)s->nested_blocksize;
        h.n_layers = (uint32_t)L;
        h.n_blocks = (uint32_t)n_blk;
        h.config_bytes = (uint32_t)config_len;
        h.config_off = (int64_t)sizeof h;
        h.block_table_off = (int64_t)sizeof h + (int64_t)config_len;
        h.identity = identity;
        h.settings = ft_pack_settings_hash(s);
        h.file_bytes = (uint64_t)off;
        memcpy(hdr, &h, sizeof h);
        memcpy(hdr + h.config_off, config_json, config_len);
        memcpy(hdr + h.block_table_off, tab, (size_t)n_blk * sizeof *tab);
        h.header_sum = (uint32_t)ft_xxh64(hdr, (size_t)hb, 0);
        memcpy(hdr, &h, sizeof h);
        rc = pwrite_all(b.fd, hdr, (size_t)hb, 0, tmp);
        if (!rc && fsync(b.fd) < 0) rc = ft_err(-errno, "%s: fsync: %s", tmp, strerror(errno));
        uint32_t done = partial ? FT_PACK_PARTIAL : FT_PACK_COMPLETE; /* the complete flag, last */
        if (!rc) rc = pwrite_all(b.fd, &done, 4, (int64_t)offsetof(ft_pack_hdr, complete), tmp);
    }
    if (b.fd >= 0) rc = ft_tmp_commit(b.fd, tmp, path, rc); /* fsyncs the flag, renames */
    if (!rc && st) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        st->seconds = now_s() - t0;
        st->file_bytes = (uint64_t)off;
        st->peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024;
        st->buffer_bytes = buf_bytes;
        st->max_layer_bytes = max_layer;
        st->max_layer_src_bf16_bytes = max_src;
        st->layer_seconds = layer_s;
    }
    free(b.scratch);
    free(b.tscratch);
    free(b.absmax);
    if (b.block[1] != b.block[0]) free(b.block[1]);
    free(b.block[0]);
    free(b.stream[0]);
    free(b.stream[1]);
    free(blk_bytes);
    free(tab);
    free(hdr);
    return rc;
}
