/* prefetch.c - disk read-ahead for the streamed tiers (see prefetch.h).
 *
 * One thread per executor owns the reader. Under the mutex it keeps: the blocks left to read
 * (list, next_read), the stream counters (seq: blocks queued so far; take_seq: blocks the
 * consumer took and released, or that were dropped), and for each staging buffer the block
 * in it and its state. Block k of the stream goes into buffer k % n_stage and may be queued
 * once k < take_seq + n_stage (the buffer's previous block released). The thread queues the
 * next block when everything queued before is in flight (ft_reader_unsubmitted == 0), so the
 * ring moves from one block to the next without draining, and between completions it looks
 * for a newly released buffer; with nothing to do it sleeps on cv_thread. The consumer sleeps
 * on cv_host for a block to be staged and for a cancel to be acknowledged.
 */
#include "offload/prefetch.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload/uring.h"
#include "src/core/err.h"

#define MAX_STAGE 8

enum { BUF_FREE = 0, BUF_READING, BUF_STAGED, BUF_HELD };

struct ft_disk_prefetch {
    ft_dpf_cfg cfg;
    ft_reader *rd;               /* touched by the thread only (after init) */
    char mode[1536];
    pthread_t th;
    int th_ok;
    pthread_mutex_t mu;
    pthread_cond_t cv_thread, cv_host;
    ft_dpf_block *list;          /* max_blocks; the blocks left to read are [next_read, n_list) */
    ft_dpf_block *scratch;       /* max_blocks, the consumer's */
    int n_list, next_read;
    int64_t seq, take_seq;
    int64_t id[MAX_STAGE];       /* per buffer: the block in it */
    uint64_t off[MAX_STAGE];
    int state[MAX_STAGE];
    double t0[MAX_STAGE], t1[MAX_STAGE];
    double last_t1;              /* consumer: completion of the block taken last */
    int err;                     /* a read error, kept until the next start */
    char errmsg[1024];
    int quit, cancel_req;
    int64_t cancel_gen;
    int64_t reads, dropped;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *ft_disk_prefetch_mode(const ft_disk_prefetch *p) { return p->mode; }

/* ---- the thread (holds mu except around waits and reads) ------------------------------ */

static void set_error(ft_disk_prefetch *p, int rc, const char *msg)
{
    if (!p->err) {
        p->err = rc;
        snprintf(p->errmsg, sizeof p->errmsg, "%s", msg);
    }
    pthread_cond_broadcast(&p->cv_host);
}

static int can_queue(ft_disk_prefetch *p)
{
    return !p->err && p->next_read < p->n_list && p->seq < p->take_seq + p->cfg.n_stage &&
           ft_reader_queued(p->rd) < FT_READER_MAX_QUEUED && ft_reader_unsubmitted(p->rd) == 0;
}

/* Queues the next block of the list into its buffer, after the buffer's last use is done. */
static void queue_next(ft_disk_prefetch *p)
{
    int64_t s = p->seq++;
    int h = (int)(s % p->cfg.n_stage);
    ft_dpf_block b = p->list[p->next_read++];
    p->id[h] = b.id;
    p->off[h] = b.off;
    p->state[h] = BUF_READING;
    pthread_mutex_unlock(&p->mu);
    char msg[1024] = "";
    int rc = p->cfg.buffer_wait ? p->cfg.buffer_wait(p->cfg.user, h) : 0;
    double t0 = now_s();
    if (!rc)
        rc = ft_reader_queue(p->rd, p->cfg.stage + (size_t)h * p->cfg.stage_bytes, (size_t)b.bytes,
                             b.off, (uint64_t)s);
    if (rc < 0) {
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        ft_reader_cancel(p->rd);
    }
    pthread_mutex_lock(&p->mu);
    p->t0[h] = t0;
    if (rc < 0) set_error(p, rc, msg);
}

/* Moves the reads along (waits for one chunk at most); marks a completed block staged. */
static void poll_once(ft_disk_prefetch *p)
{
    pthread_mutex_unlock(&p->mu);
    uint64_t tag = 0;
    char msg[1024] = "";
    int rc = ft_reader_poll(p->rd, 1, &tag);
    double t1 = now_s();
    if (rc < 0) snprintf(msg, sizeof msg, "%s", ft_errmsg());
    pthread_mutex_lock(&p->mu);
    if (rc < 0) {
        set_error(p, rc, msg);
    } else if (rc == 1) {
        int h = (int)(tag % (uint64_t)p->cfg.n_stage);
        p->t1[h] = t1;
        p->state[h] = BUF_STAGED;
        p->reads++;
        pthread_cond_broadcast(&p->cv_host);
    }
}

/* A cancel: reads in flight finish, everything not taken is dropped. */
static void drop_all(ft_disk_prefetch *p)
{
    pthread_mutex_unlock(&p->mu);
    ft_reader_cancel(p->rd);
    pthread_mutex_lock(&p->mu);
    for (int64_t s = p->take_seq; s < p->seq; s++) {
        int h = (int)(s % p->cfg.n_stage);
        if (p->state[h] == BUF_STAGED) p->reads--; /* counted as dropped, not read */
        p->state[h] = BUF_FREE;
        p->dropped++;
    }
    p->take_seq = p->seq;
    p->n_list = p->next_read = 0;
    p->err = 0;
    p->cancel_req = 0;
    p->cancel_gen++;
    pthread_cond_broadcast(&p->cv_host);
}

static void *run(void *arg)
{
    ft_disk_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->quit) {
        if (p->cancel_req) drop_all(p);
        else if (can_queue(p)) queue_next(p);
        else if (ft_reader_queued(p->rd) > 0 && !p->err) poll_once(p);
        else pthread_cond_wait(&p->cv_thread, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the consumer ----------------------------------------------------------------------- */

int ft_disk_prefetch_init(ft_disk_prefetch **out, const ft_dpf_cfg *cfg)
{
    *out = NULL;
    if (cfg->n_stage < 1 || cfg->n_stage > MAX_STAGE || cfg->max_blocks < 1 || !cfg->stage)
        return ft_err(FT_E_INVALID, "disk read-ahead: %d staging buffers (1..%d), %d blocks",
                      cfg->n_stage, MAX_STAGE, cfg->max_blocks);
    ft_disk_prefetch *p = calloc(1, sizeof *p);
    if (!p) return ft_err(-ENOMEM, "disk read-ahead: out of memory");
    p->cfg = *cfg;
    p->cfg.path = NULL; /* not kept: the reader has its own copy */
    p->list = malloc((size_t)cfg->max_blocks * sizeof *p->list);
    p->scratch = malloc((size_t)cfg->max_blocks * sizeof *p->scratch);
    if (!p->list || !p->scratch) {
        free(p->list);
        free(p->scratch);
        free(p);
        return ft_err(-ENOMEM, "disk read-ahead: out of memory");
    }
    int rc = ft_reader_open(&p->rd, cfg->path, cfg->queue_depth, cfg->chunk_bytes, 1);
    if (rc < 0) {
        free(p->list);
        free(p->scratch);
        free(p);
        return rc;
    }
    snprintf(p->mode, sizeof p->mode, "%s", ft_reader_mode(p->rd));
    if (cfg->register_buffers) {
        void *bufs[MAX_STAGE];
        size_t lens[MAX_STAGE];
        for (int h = 0; h < cfg->n_stage; h++) {
            bufs[h] = cfg->stage + (size_t)h * cfg->stage_bytes;
            lens[h] = cfg->stage_bytes;
        }
        if (ft_reader_register(p->rd, bufs, lens, cfg->n_stage) < 0) {
            char why[1024];
            snprintf(why, sizeof why, "%s", ft_errmsg());
            ft_err_clear();
            snprintf(p->mode, sizeof p->mode, "%s; staging buffers not registered (plain reads): %s",
                     ft_reader_mode(p->rd), why);
        } else {
            snprintf(p->mode, sizeof p->mode, "%s", ft_reader_mode(p->rd));
        }
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_thread, NULL);
    pthread_cond_init(&p->cv_host, NULL);
    rc = pthread_create(&p->th, NULL, run, p);
    if (rc) {
        ft_disk_prefetch_free(p);
        return ft_err(-rc, "disk read-ahead: cannot start its thread: %s", strerror(rc));
    }
    p->th_ok = 1;
    *out = p;
    return 0;
}

void ft_disk_prefetch_free(ft_disk_prefetch *p)
{
    if (!p) return;
    if (p->th_ok) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_signal(&p->cv_thread);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->th, NULL);
    }
    ft_reader_close(p->rd); /* waits for reads still in flight */
    pthread_cond_destroy(&p->cv_thread);
    pthread_cond_destroy(&p->cv_host);
    pthread_mutex_destroy(&p->mu);
    free(p->list);
    free(p->scratch);
    free(p);
}

ft_dpf_block *ft_disk_prefetch_scratch(ft_disk_prefetch *p) { return p->scratch; }

/* With mu held: drops everything not taken and waits for the thread to confirm. */
static void cancel_locked(ft_disk_prefetch *p)
{
    p->n_list = p->next_read = 0;
    if (p->seq == p->take_seq) { /* nothing read ahead: the thread touches no buffer */
        p->err = 0;
        return;
    }
    int64_t g = p->cancel_gen;
    p->cancel_req = 1;
    pthread_cond_signal(&p->cv_thread);
    while (p->cancel_gen == g) pthread_cond_wait(&p->cv_host, &p->mu);
}

void ft_disk_prefetch_cancel(ft_disk_prefetch *p)
{
    pthread_mutex_lock(&p->mu);
    cancel_locked(p);
    pthread_mutex_unlock(&p->mu);
}

int ft_disk_prefetch_start(ft_disk_prefetch *p, const ft_dpf_block *b, int n)
{
    if (n < 0 || n > p->cfg.max_blocks)
        return ft_err(FT_E_INVALID, "disk read-ahead: a list of %d blocks (at most %d)", n,
                      p->cfg.max_blocks);
    pthread_mutex_lock(&p->mu);
    int64_t k = p->seq - p->take_seq; /* read ahead (or being read), not taken */
    int keep = !p->err && k <= n;
    for (int64_t j = 0; keep && j < k; j++) {
        int h = (int)((p->take_seq + j) % p->cfg.n_stage);
        keep = p->id[h] == b[j].id && p->off[h] == b[j].off;
    }
    if (!keep) {
        cancel_locked(p);
        k = 0;
    }
    memcpy(p->list, b + k, (size_t)(n - k) * sizeof *b);
    p->n_list = (int)(n - k);
    p->next_read = 0;
    pthread_cond_signal(&p->cv_thread);
    pthread_mutex_unlock(&p->mu);
    return (int)k;
}

int ft_disk_prefetch_take(ft_disk_prefetch *p, int64_t id, int *h, ft_dpf_read *rd)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->err) {
            int rc = p->err;
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", p->errmsg);
            pthread_mutex_unlock(&p->mu);
            return ft_err(rc, "%s", msg);
        }
        if (p->take_seq < p->seq) {
            int hh = (int)(p->take_seq % p->cfg.n_stage);
            if (p->id[hh] != id) break;
            if (p->state[hh] == BUF_STAGED) {
                p->state[hh] = BUF_HELD;
                *h = hh;
                if (rd) {
                    rd->t0 = p->t0[hh];
                    rd->t1 = p->t1[hh];
                    double from = p->t0[hh] > p->last_t1 ? p->t0[hh] : p->last_t1;
                    rd->busy = p->t1[hh] > from ? p->t1[hh] - from : 0;
                }
                if (p->t1[hh] > p->last_t1) p->last_t1 = p->t1[hh];
                pthread_mutex_unlock(&p->mu);
                return 1;
            }
        } else if (!(p->next_read < p->n_list && p->list[p->next_read].id == id)) {
            break; /* not in the stream */
        }
        pthread_cond_wait(&p->cv_host, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void ft_disk_prefetch_release(ft_disk_prefetch *p, int h)
{
    pthread_mutex_lock(&p->mu);
    if (p->state[h] == BUF_HELD && (int)(p->take_seq % p->cfg.n_stage) == h) {
        p->state[h] = BUF_FREE;
        p->take_seq++;
        pthread_cond_signal(&p->cv_thread);
    }
    pthread_mutex_unlock(&p->mu);
}

void ft_disk_prefetch_counts(ft_disk_prefetch *p, int64_t *reads, int64_t *dropped)
{
    pthread_mutex_lock(&p->mu);
    *reads = p->reads;
    *dropped = p->dropped;
    pthread_mutex_unlock(&p->mu);
}
