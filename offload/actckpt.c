/* ckpt.c - layer-input checkpoints in pinned host memory, carried through a ring of device
 * sets (see ckpt.h for the layout, the lanes and the events). */
#include "offload/actckpt.h"

#include <stdlib.h>
#include <string.h>

#include "offload/exec_internal.h"
#include "offload/timeline.h"
#include "src/core/err.h"

#define EV_COMP(s) (FT_CKPT_EV0 + (s))                    /* compute done with set s */
#define EV_COPY(s) (FT_CKPT_EV0 + FT_CKPT_MAX_SETS + (s)) /* set s's last store/load done */
#define CK_LANE FT_STREAM_D2H

_Static_assert(FT_CKPT_EV0 + 2 * FT_CKPT_MAX_SETS <= 32, "checkpoint events must stay in 24..31");

int64_t ft_actckpt_dev_buffers(int64_t n_micro, int64_t dev_layers, int n_sets)
{
    return (dev_layers + n_sets) * n_micro;
}

static int64_t n_stored_of(int64_t L, int64_t dev_layers, int n_sets)
{
    int64_t n = L - dev_layers - (n_sets - 1);
    return n > 0 ? n : 0;
}

size_t ft_actckpt_host_bytes(int64_t L, int64_t n_micro, int64_t T_max, int64_t C,
                               int64_t dev_layers, int n_sets)
{
    return (size_t)(n_stored_of(L, dev_layers, n_sets) * n_micro) * (size_t)(T_max * C) * sizeof(float);
}

int ft_actckpt_check(int64_t L, int64_t dev_layers, int n_sets)
{
    if (dev_layers < 0 || dev_layers > L || n_sets < 2 || n_sets > FT_CKPT_MAX_SETS)
        return ft_err(FT_E_INVALID, "host checkpoints: %lld device layers of %lld and %d sets "
                      "(expected 0..%lld and 2..%d)", (long long)dev_layers, (long long)L, n_sets,
                      (long long)L, FT_CKPT_MAX_SETS);
    return 0;
}

int ft_actckpt_init(ft_exec *e, int64_t dev_layers, int n_sets)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t L = c->num_hidden_layers;
    FT_TRY(ft_actckpt_check(L, dev_layers, n_sets));
    if (!be->ops->host_alloc || !be->ops->host_free || !be->ops->copy_async || !be->ops->event_record ||
        !be->ops->event_wait)
        return ft_err(FT_E_UNSUPPORTED, "the %s backend cannot keep checkpoints in host memory",
                      be->ops->name);
    ft_actckpt *k = calloc(1, sizeof *k);
    if (!k) return ft_err(-ENOMEM, "out of memory");
    e->ckt = k;
    k->L = L;
    k->n_micro = e->n_micro_max;
    k->T_max = e->T_max;
    k->C = c->hidden_size;
    k->dev_layers = dev_layers;
    k->h = L - dev_layers;
    k->n_sets = n_sets;
    k->n_stored = n_stored_of(L, dev_layers, n_sets);
    int64_t per = k->n_micro * k->T_max * k->C; /* floats of one checkpoint index */
    k->dev_keep = e->ckpt;
    k->sets = e->ckpt + dev_layers * per;
    k->rows = calloc((size_t)k->n_micro, sizeof *k->rows);
    k->stored = calloc((size_t)(L + 1), 1);
    if (!k->rows || !k->stored) return ft_err(-ENOMEM, "out of memory");
    k->host_bytes = ft_actckpt_host_bytes(L, k->n_micro, k->T_max, k->C, dev_layers, n_sets);
    if (k->host_bytes) {
        k->host = be->ops->host_alloc(be, k->host_bytes);
        if (!k->host)
            return ft_err(-ENOMEM, "out of pinned host memory for %.2f GiB of activation checkpoints "
                          "(%lld layers x %lld micro-batches of %lld tokens)", k->host_bytes / 1073741824.0,
                          (long long)k->n_stored, (long long)k->n_micro, (long long)k->T_max);
    }
    for (int s = 0; s < FT_CKPT_MAX_SETS; s++) k->hold[s] = -1;
    k->next_load = -1;
    return 0;
}

void ft_actckpt_free(ft_exec *e)
{
    if (!e || !e->ckt) return;
    ft_actckpt *k = e->ckt;
    if (e->be && e->be->ops->host_free) e->be->ops->host_free(e->be, k->host);
    free(k->rows);
    free(k->stored);
    free(k);
    e->ckt = NULL;
}

/* ---- the schedule ------------------------------------------------------------------------ */

static int64_t per_index(const ft_actckpt *k) { return k->n_micro * k->T_max * k->C; }
static float *set_at(const ft_actckpt *k, int s) { return k->sets + s * per_index(k); }
static float *host_at(const ft_actckpt *k, int64_t j, int64_t mb)
{
    return k->host + (j * k->n_micro + mb) * k->T_max * k->C;
}

static int set_of(const ft_actckpt *k, int64_t j)
{
    for (int s = 0; s < k->n_sets; s++)
        if (k->hold[s] == j) return s;
    return -1;
}

static int on_dev(const ft_actckpt *k, int64_t j) { return j >= k->h && j < k->L; }

void ft_actckpt_begin(ft_exec *e, const int64_t *rows, int64_t n_mb, int train)
{
    ft_actckpt *k = e->ckt;
    k->n_mb = n_mb;
    for (int64_t mb = 0; mb < n_mb; mb++) k->rows[mb] = rows[mb];
    for (int s = 0; s < FT_CKPT_MAX_SETS; s++) k->hold[s] = -1;
    memset(k->stored, 0, (size_t)(k->L + 1));
    k->ring = 0;
    k->cur = k->L;
    k->next_load = -1;
    k->train = train;
}

int ft_actckpt_write(ft_exec *e, int64_t j, float **out)
{
    ft_actckpt *k = e->ckt;
    if (on_dev(k, j)) {
        *out = k->dev_keep + (j - k->h) * per_index(k);
        return 0;
    }
    int s = (int)(k->ring % k->n_sets);
    if (j > 0 && k->hold[s] == j - 1) /* the writer's own input: n_sets >= 2 rules it out */
        return ft_err(FT_E_INVALID, "host checkpoints: set %d still holds checkpoint %lld (writing %lld)",
                      s, (long long)k->hold[s], (long long)j);
    k->ring++;
    /* its previous store (or load) must be done before it is overwritten */
    FT_TRY(e->be->ops->event_wait(e->be, FT_STREAM_COMPUTE, EV_COPY(s)));
    k->hold[s] = j;
    *out = set_at(k, s);
    return 0;
}

int ft_actckpt_read(ft_exec *e, int64_t j, float **at)
{
    ft_actckpt *k = e->ckt;
    if (on_dev(k, j)) {
        *at = k->dev_keep + (j - k->h) * per_index(k);
        return 0;
    }
    int s = set_of(k, j);
    if (s < 0)
        return ft_err(FT_E_INVALID, "host checkpoints: checkpoint %lld is not on the device", (long long)j);
    *at = set_at(k, s);
    return 0;
}

int ft_actckpt_used(ft_exec *e, int64_t j)
{
    ft_actckpt *k = e->ckt;
    int s = on_dev(k, j) ? -1 : set_of(k, j);
    return s < 0 ? 0 : e->be->ops->event_record(e->be, EV_COMP(s), FT_STREAM_COMPUTE);
}

/* Queues the copies of checkpoint j's n_mb buffers between set s and its host home. */
static int copy_set(ft_exec *e, int64_t j, int s, int to_host)
{
    ft_actckpt *k = e->ckt;
    ft_backend *be = e->be;
    FT_TRY(be->ops->event_wait(be, CK_LANE, EV_COMP(s)));
    int mk = ft_exec_tl_begin(e, FT_TL_D2H, FT_TL_CKPT, j);
    for (int64_t mb = 0; mb < k->n_mb; mb++) {
        size_t nb = (size_t)(k->rows[mb] * k->C) * sizeof(float);
        float *dev = set_at(k, s) + mb * k->T_max * k->C, *host = host_at(k, j, mb);
        FT_TRY(be->ops->copy_async(be, CK_LANE, to_host ? (void *)host : (void *)dev,
                                   to_host ? (const void *)dev : (const void *)host, nb));
        if (to_host) {
            k->d2h_bytes += nb;
            k->d2h_copies++;
        } else {
            k->h2d_bytes += nb;
            k->h2d_copies++;
        }
    }
    ft_exec_tl_end(e, mk);
    return be->ops->event_record(be, EV_COPY(s), CK_LANE);
}

int ft_actckpt_written(ft_exec *e, int64_t j)
{
    ft_actckpt *k = e->ckt;
    if (on_dev(k, j)) return 0;
    int s = set_of(k, j);
    if (s < 0) return ft_err(FT_E_INVALID, "host checkpoints: checkpoint %lld has no set", (long long)j);
    FT_TRY(e->be->ops->event_record(e->be, EV_COMP(s), FT_STREAM_COMPUTE));
    if (!k->train || j >= k->n_stored) return 0;
    FT_TRY(copy_set(e, j, s, 1));
    k->stored[j] = 1;
    return 0;
}

/* Sets holding nothing count as consumed longest ago. */
static int64_t free_key(int64_t hold) { return hold < 0 ? INT64_MAX : hold; }

/* Issues loads of the next stored checkpoints into free sets (a set is free when the
 * checkpoint it holds is not needed any more: above the next backward layer, or none); the
 * set consumed longest ago first. */
static int pump(ft_exec *e)
{
    ft_actckpt *k = e->ckt;
    while (k->next_load >= 0) {
        int64_t j = k->next_load;
        int s = -1;
        for (int i = 0; i < k->n_sets; i++)
            if (free_key(k->hold[i]) > k->cur && (s < 0 || free_key(k->hold[i]) > free_key(k->hold[s])))
                s = i;
        if (s < 0) return 0;
        if (!k->stored[j])
            return ft_err(FT_E_INVALID, "host checkpoints: checkpoint %lld was not stored", (long long)j);
        FT_TRY(copy_set(e, j, s, 0));
        k->hold[s] = j;
        k->next_load--;
    }
    return 0;
}

int ft_actckpt_bwd_begin(ft_exec *e)
{
    ft_actckpt *k = e->ckt;
    k->cur = k->L - 1;
    for (int64_t j = k->n_stored; j < k->h; j++) /* kept in their sets through the turn */
        if (set_of(k, j) < 0)
            return ft_err(FT_E_INVALID, "host checkpoints: checkpoint %lld left its set", (long long)j);
    k->next_load = k->n_stored - 1;
    return pump(e);
}

int ft_actckpt_bwd_in(ft_exec *e, int64_t l, float **at)
{
    ft_actckpt *k = e->ckt;
    if (on_dev(k, l)) {
        *at = k->dev_keep + (l - k->h) * per_index(k);
        return 0;
    }
    k->cur = l;
    FT_TRY(pump(e));
    int s = set_of(k, l);
    if (s < 0)
        return ft_err(FT_E_INVALID, "host checkpoints: checkpoint %lld was not loaded", (long long)l);
    FT_TRY(e->be->ops->event_wait(e->be, FT_STREAM_COMPUTE, EV_COPY(s)));
    *at = set_at(k, s);
    return 0;
}

int ft_actckpt_bwd_done(ft_exec *e, int64_t l)
{
    ft_actckpt *k = e->ckt;
    int s = on_dev(k, l) ? -1 : set_of(k, l);
    if (s >= 0) FT_TRY(e->be->ops->event_record(e->be, EV_COMP(s), FT_STREAM_COMPUTE));
    k->cur = l - 1;
    return pump(e);
}
