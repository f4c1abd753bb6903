/* stream_bench.c - the disk read-ahead driven as offload/tiers.c drives it, without compute
 * (see stream_bench.h). The visit lists, the read-ahead lists and the host's issue/pump/fetch
 * follow tiers.c's ft_exec_begin_op, dpf_start, issue, pump and ft_exec_fetch_device line for
 * line, for a base whose layers are all on the disk tier; the GPU's lanes are replaced by the
 * modelled times of struct sb_run. */
#include "offload/stream_bench.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload/pack.h"
#include "offload/pinned.h"
#include "offload/prefetch.h"
#include "src/core/err.h"

#define SB_MAX_SLOTS 8
#define SB_MAX_STAGE 8

/* The modelled end of each staging buffer's last copy, read by the read-ahead thread. */
typedef struct sb_stage {
    pthread_mutex_t mu;
    double ready[SB_MAX_STAGE];
} sb_stage;

typedef struct sb_run {
    ft_pack_file *pack;
    ft_disk_prefetch *dpf;
    sb_stage *stage;
    int64_t L;
    int n_slots;
    double compute_s, h2d;
    /* tiers.c's executor state, as far as the disk tier needs it */
    int64_t *visits;            /* 2 L + 2 */
    int64_t n_visits, next_issue;
    int64_t fetched;            /* fetched_layer: the layer whose block cur_slot holds */
    int cur_slot;
    int slot_busy[SB_MAX_SLOTS];
    int64_t slot_layer[SB_MAX_SLOTS];
    int64_t slot_ring;
    /* the modelled device (CLOCK_MONOTONIC seconds) */
    double slot_ready[SB_MAX_SLOTS]; /* copy into the slot done (tiers.c: EV_READY) */
    double slot_free[SB_MAX_SLOTS];  /* the slot's last compute done (EV_FREE) */
    double h2d_end, compute_end;
    ft_stream_bench_span acc;   /* the current step's figures */
} sb_run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double max2(double a, double b) { return a > b ? a : b; }

/* Sleeps until CLOCK_MONOTONIC reads t (returns at once for a time past). */
static void sleep_until(double t)
{
    if (t <= now_s()) return;
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* The read-ahead's buffer_wait (on its thread): buffer h's last copy out is done. */
static int stage_wait(void *user, int h)
{
    sb_stage *st = user;
    pthread_mutex_lock(&st->mu);
    double t = st->ready[h];
    pthread_mutex_unlock(&st->mu);
    sleep_until(t);
    return 0;
}

/* tiers.c dpf_start: the disk blocks of visits[from..n_visits), then the next operation's
 * forward (0..L-1, less layer 0 when this one ends on it). */
static int dpf_start(sb_run *r, int64_t from)
{
    int64_t n = 0;
    ft_dpf_block *b = ft_disk_prefetch_scratch(r->dpf);
    for (int64_t i = from; i < r->n_visits; i++, n++) {
        b[n].id = r->visits[i];
        FT_TRY(ft_pack_block_extent(r->pack, b[n].id, &b[n].off, &b[n].bytes));
    }
    int64_t last = r->n_visits > 0 ? r->visits[r->n_visits - 1] : r->fetched;
    for (int64_t l = 0; l < r->L; l++) {
        if (l == 0 && last == 0) continue;
        b[n].id = l;
        FT_TRY(ft_pack_block_extent(r->pack, l, &b[n].off, &b[n].bytes));
        n++;
    }
    int k = ft_disk_prefetch_start(r->dpf, b, (int)n);
    return k < 0 ? k : 0;
}

/* tiers.c ft_exec_begin_op(train = 1): the step's visits, then the read-ahead's list. */
static int begin_step(sb_run *r)
{
    int64_t n = 0;
    for (int64_t l = 0; l < r->L; l++)
        if (l != r->fetched || n > 0) r->visits[n++] = l;
    for (int64_t l = r->L - 1; l >= 0; l--)
        if (n == 0 ? l != r->fetched : r->visits[n - 1] != l) r->visits[n++] = l;
    r->n_visits = n;
    r->next_issue = 0;
    return dpf_start(r, 0);
}

/* tiers.c issue() for a disk block: take it from the read-ahead, queue its (modelled) copy
 * into the next slot, release the staging buffer. Returns 1, 0 (that slot is busy) or an
 * error. */
static int issue(sb_run *r, int64_t l)
{
    int s = (int)(r->slot_ring % r->n_slots);
    if (r->slot_busy[s]) return 0;
    uint64_t off, nb;
    FT_TRY(ft_pack_block_extent(r->pack, l, &off, &nb));
    ft_dpf_read rd = {0};
    int h = -1;
    double w0 = now_s();
    int ahead = ft_disk_prefetch_take(r->dpf, l, &h, &rd);
    double t = now_s();
    r->acc.wait_seconds += t - w0;
    if (ahead < 0) return ahead;
    if (ahead == 0) /* tiers.c would cancel and read it itself: here the lists disagree */
        return ft_err(FT_E_INVALID, "%s: layer %lld is not the read-ahead's next block (visit %lld "
                      "of %lld): the stream bench's lists disagree with the read-ahead's",
                      ft_pack_path(r->pack), (long long)l, (long long)r->next_issue,
                      (long long)r->n_visits);
    /* H2D lane: wait free[s] -> copy -> record ready[s] and stage[h] */
    double c0 = max2(t, max2(r->h2d_end, r->slot_free[s]));
    double c1 = c0 + (r->h2d > 0 ? (double)nb / r->h2d : 0.0);
    r->h2d_end = c1;
    r->slot_ready[s] = c1;
    pthread_mutex_lock(&r->stage->mu);
    r->stage->ready[h] = c1;
    pthread_mutex_unlock(&r->stage->mu);
    ft_disk_prefetch_release(r->dpf, h);
    r->acc.blocks++;
    r->acc.bytes += nb;
    r->acc.busy_seconds += rd.busy;
    r->slot_busy[s] = 1;
    r->slot_layer[s] = l;
    r->slot_ring++;
    return 1;
}

/* tiers.c pump(): the step's next visits while a slot is free. */
static int pump(sb_run *r)
{
    while (r->next_issue < r->n_visits) {
        int k = issue(r, r->visits[r->next_issue]);
        if (k <= 0) return k;
        r->next_issue++;
    }
    return 0;
}

/* tiers.c ft_exec_fetch_device, then the layer's (modelled) compute. */
static int fetch_compute(sb_run *r, int64_t l)
{
    if (r->fetched != l) {
        if (r->cur_slot >= 0) { /* release_current: free[s] after the compute queued on it */
            r->slot_free[r->cur_slot] = r->compute_end;
            r->slot_busy[r->cur_slot] = 0;
            r->cur_slot = -1;
        }
        r->fetched = -1;
        FT_TRY(pump(r));
        int s = -1;
        for (int i = 0; i < r->n_slots; i++)
            if (r->slot_busy[i] && r->slot_layer[i] == l) s = i;
        if (s < 0)
            return ft_err(FT_E_INVALID, "stream bench: layer %lld is not in a slot (not in the "
                          "step's visit list)", (long long)l);
        r->cur_slot = s;
        r->fetched = l;
    }
    /* compute lane: (queued now) wait ready[s] -> compute_s; idle since the previous pass
     * while the host waited for the block or its copy ran */
    double start = max2(max2(r->slot_ready[r->cur_slot], now_s()), r->compute_end);
    r->acc.stall_seconds += start - r->compute_end;
    r->compute_end = start + r->compute_s;
    return 0;
}

/* One training step: forward 0..L-1, the head (waits for the forward), backward L-1..0,
 * the step's end (waits for everything). */
static int step(sb_run *r)
{
    FT_TRY(begin_step(r));
    for (int64_t l = 0; l < r->L; l++) FT_TRY(fetch_compute(r, l));
    sleep_until(r->compute_end);
    for (int64_t l = r->L - 1; l >= 0; l--) FT_TRY(fetch_compute(r, l));
    sleep_until(r->compute_end);
    return 0;
}

static void span_add(ft_stream_bench_span *a, const ft_stream_bench_span *b)
{
    a->steps += b->steps;
    a->blocks += b->blocks;
    a->bytes += b->bytes;
    a->seconds += b->seconds;
    a->busy_seconds += b->busy_seconds;
    a->wait_seconds += b->wait_seconds;
    a->stall_seconds += b->stall_seconds;
}

int ft_stream_bench(ft_backend *be, ft_pack_file *pack, const ft_stream_bench_opts *o,
                    ft_stream_bench_result *res)
{
    memset(res, 0, sizeof *res);
    int64_t L = ft_pack_config(pack)->num_hidden_layers;
    int n_stage = o->n_stage ? o->n_stage : (L < 3 ? (int)L : 3);
    int n_slots = o->n_slots ? o->n_slots : 2;
    if (L < 1)
        return ft_err(FT_E_INVALID, "%s: the pack has no layers to stream", ft_pack_path(pack));
    if (o->steps < 1)
        return ft_err(FT_E_INVALID, "stream bench: %d steps (at least 1)", o->steps);
    if (n_stage < 1 || n_stage > SB_MAX_STAGE)
        return ft_err(FT_E_INVALID, "stream bench: %d staging buffers (1..%d)", n_stage, SB_MAX_STAGE);
    if (n_slots < 2 || n_slots > SB_MAX_SLOTS)
        return ft_err(FT_E_INVALID, "stream bench: %d device slots (2..%d)", n_slots, SB_MAX_SLOTS);
    if (!(o->compute_s >= 0) || !isfinite(o->compute_s))
        return ft_err(FT_E_INVALID, "stream bench: %g s of compute per layer pass (finite, >= 0)",
                      o->compute_s);
    if (!(o->h2d_bytes_per_s >= 0) || !isfinite(o->h2d_bytes_per_s))
        return ft_err(FT_E_INVALID, "stream bench: a copy rate of %g bytes/s (finite, >= 0; 0: "
                      "instant copies)", o->h2d_bytes_per_s);

    /* the raw rate of the same blocks; the pack's reader takes its best point */
    FT_TRY(ft_probe_pack_reader(pack, o->probe_bytes, &res->probe));

    size_t raw = ft_pack_max_layer_bytes(pack);
    sb_run r;
    memset(&r, 0, sizeof r);
    r.pack = pack;
    r.L = L;
    r.n_slots = n_slots;
    r.compute_s = o->compute_s;
    r.h2d = o->h2d_bytes_per_s;
    r.fetched = -1;
    r.cur_slot = -1;
    for (int s = 0; s < SB_MAX_SLOTS; s++) r.slot_layer[s] = -1;
    r.visits = malloc((size_t)(2 * L + 2) * sizeof *r.visits);
    sb_stage *st = calloc(1, sizeof *st);
    if (!r.visits || !st) {
        free(r.visits);
        free(st);
        return ft_err(-ENOMEM, "stream bench: out of memory");
    }
    pthread_mutex_init(&st->mu, NULL);
    r.stage = st;
    void *sp = NULL;
    int rc = ft_pinned_alloc(be, (size_t)n_stage * raw, ft_pinned_node(be), &sp);
    if (rc < 0) {
        rc = ft_err_prefix(rc, "stream bench: %d staging buffers of %.1f MiB", n_stage,
                           raw / 1048576.0);
        goto out;
    }
    /* ft_exec_use_pack_tiers places every layer through staging buffer 0 (ft_pack_read_block)
     * before the read-ahead starts; one block here faults that buffer's pages the same way.
     * How the pages were first touched matters: on the CPU VM, buffers memset before their
     * io_uring registration read ~25% slower than ones first touched by the registration or
     * by a read (physically scattered pages: more segments per 4 MiB request). */
    rc = ft_pack_read_block(pack, 0, sp, raw, 0);
    if (rc < 0) goto out;
    ft_pinned_describe(sp, res->staging, sizeof res->staging);

    ft_dpf_cfg dc = {0}; /* tiers.c's, with the modelled copies' wait */
    dc.path = ft_pack_path(pack);
    ft_pack_reader_params(pack, &dc.queue_depth, &dc.chunk_bytes);
    dc.stage = sp;
    dc.stage_bytes = raw;
    dc.n_stage = n_stage;
    dc.max_blocks = (int)(4 * L + 4);
    dc.buffer_wait = stage_wait;
    dc.user = st;
    dc.register_buffers = 1;
    rc = ft_disk_prefetch_init(&r.dpf, &dc);
    if (rc < 0) goto out;
    snprintf(res->mode, sizeof res->mode, "%s", ft_disk_prefetch_mode(r.dpf));
    double t0 = now_s();
    r.compute_end = t0; /* the lane's idle time counts from here */
    rc = dpf_start(&r, 0); /* the first step's forward, as ft_exec_use_pack_tiers ends */
    for (int k = 0; k < o->steps && rc == 0; k++) {
        memset(&r.acc, 0, sizeof r.acc);
        double s0 = k == 0 ? t0 : now_s();
        rc = step(&r);
        r.acc.seconds = now_s() - s0;
        r.acc.steps = 1;
        span_add(&res->all, &r.acc);
        if (k > 0) span_add(&res->steady, &r.acc);
    }
    if (rc == 0) {
        int64_t reads, dropped, dropped1;
        ft_disk_prefetch_counts(r.dpf, &reads, &dropped);
        res->dropped_in_run = dropped;
        ft_disk_prefetch_cancel(r.dpf); /* the next step's read-ahead */
        ft_disk_prefetch_counts(r.dpf, &reads, &dropped1);
        res->reads = reads;
        res->dropped_at_end = dropped1 - dropped;
    }
    res->layers = L;
    res->n_stage = n_stage;
    res->n_slots = n_slots;
    res->stage_bytes = raw;
    ft_pack_reader_params(pack, &res->queue_depth, &res->chunk_bytes);
    res->compute_s = o->compute_s;
    res->h2d_bytes_per_s = o->h2d_bytes_per_s;
    if (rc == 0) { /* the raw rate again: a shared or virtual disk drifts during the steps */
        ft_disk_prefetch_free(r.dpf);
        r.dpf = NULL;
        rc = ft_probe_pack_reader(pack, o->probe_bytes, &res->probe_after);
        double a = res->probe.bytes_per_s, b = res->probe_after.bytes_per_s;
        res->raw_bytes_per_s = a > 0 && b > 0 ? 0.5 * (a + b) : 0;
    }
out:
    ft_disk_prefetch_free(r.dpf); /* first: its reads land in the staging buffers */
    ft_pinned_free(be, sp);
    pthread_mutex_destroy(&st->mu);
    free(st);
    free(r.visits);
    return rc;
}
