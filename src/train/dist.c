/* dist.c - data-parallel training over a communicator (dist.h). */
#include "src/train/dist.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/core/err.h"

int ft_train_dist_writer(const ft_train_cfg *c) { return ft_comm_rank(c->comm) == 0; }

int64_t ft_train_dist_global_accum(const ft_train_cfg *c)
{
    return (int64_t)ft_comm_size(c->comm) * c->grad_accum;
}

/* What every rank must agree on before the first step. */
typedef struct rank_rec {
    int64_t n_train_b, grad_accum, method;
    uint64_t fp;
} rank_rec;

int ft_train_dist_check(const ft_train_cfg *c, int64_t n_train_b, uint64_t fp)
{
    const int P = ft_comm_size(c->comm);
    if (P == 1) return 0;
    if (c->method == FT_TRAIN_METHOD_DPO)
        return ft_err(FT_E_UNSUPPORTED, "--method dpo over %d ranks: not supported yet (data-parallel "
                      "training covers the SFT token loss; run DPO in one process)", P);
    rank_rec me = {n_train_b, c->grad_accum, c->method, fp};
    rank_rec *all = calloc((size_t)P, sizeof *all);
    if (!all) return ft_err(-ENOMEM, "out of memory");
    int rc = ft_comm_allgather(c->comm, &me, sizeof me, all);
    for (int r = 1; !rc && r < P; r++) {
        if (all[r].fp != all[0].fp || all[r].n_train_b != all[0].n_train_b)
            rc = ft_err(FT_E_INVALID, "rank %d packed other training data than rank 0 (%lld micro-batches, "
                        "fingerprint %016llx; rank 0: %lld, %016llx): every rank must read the same --data "
                        "with the same flags", r, (long long)all[r].n_train_b,
                        (unsigned long long)all[r].fp, (long long)all[0].n_train_b,
                        (unsigned long long)all[0].fp);
        else if (all[r].grad_accum != all[0].grad_accum)
            rc = ft_err(FT_E_INVALID, "rank %d runs grad-accum %lld, rank 0 %lld (the planner chose by each "
                        "GPU's budget): give --grad-accum N explicitly", r, (long long)all[r].grad_accum,
                        (long long)all[0].grad_accum);
    }
    free(all);
    return rc;
}

void ft_train_dist_share(const ft_train_cfg *c, const ft_batch *mbs, int64_t n,
                         const ft_batch **mine, int64_t *n_mine, int64_t *first)
{
    const int64_t r = ft_comm_rank(c->comm), ga = c->grad_accum;
    int64_t a = r * ga, b = (r + 1) * ga;
    if (a > n) a = n;
    if (b > n) b = n;
    *first = a;
    *n_mine = b - a;
    *mine = mbs + a;
}

int ft_train_dist_reduce(const ft_train_cfg *c, ft_lora *l, double *loss_sum, int64_t *n_tokens)
{
    const ft_comm *cm = c->comm;
    if (!cm || (ft_comm_size(cm) == 1 && !ft_comm_has_device_allreduce(cm))) return 0;
    ft_backend *be = l->be;
    if (be->ops->host_memory) {
        FT_TRY(ft_comm_allreduce_f32(cm, l->grads, l->n_params));
    } else if (ft_comm_has_device_allreduce(cm)) {
        FT_TRY(ft_backend_sync(be));
        FT_TRY(ft_comm_allreduce_f32_device(cm, l->grads, l->n_params));
    } else {
        if (!l->host) return ft_err(FT_E_INVALID, "data-parallel: the adapter has no host staging buffer");
        const size_t bytes = (size_t)l->n_params * sizeof(float);
        FT_TRY(ft_backend_sync(be));
        FT_TRY(be->ops->copy(be, l->host, l->grads, bytes));
        FT_TRY(ft_comm_allreduce_f32(cm, l->host, l->n_params));
        FT_TRY(be->ops->copy(be, l->grads, l->host, bytes));
    }
    /* the stop request with them: a signal that reached some ranks stops all after this step */
    double counts[3] = {*loss_sum, (double)*n_tokens, c->stop && *c->stop ? (double)*c->stop : 0.0};
    FT_TRY(ft_comm_allreduce_f64(cm, counts, 3));
    *loss_sum = counts[0];
    *n_tokens = (int64_t)counts[1];
    if (c->stop && !*c->stop && counts[2] > 0) *c->stop = SIGTERM;
    return 0;
}

/* One rank's placement, for ftune plan. */
typedef struct plan_rec {
    char backend[16];
    int32_t rank, local_rank;
    int64_t layers[3], n_micro;
    double step_s;
} plan_rec;

int ft_train_dist_plan(const ft_train_cfg *c, const ft_session *s, const ft_lora *l,
                       const ft_train_sink *k)
{
    const int P = ft_comm_size(c->comm);
    if (P == 1) return 0;
    plan_rec me;
    memset(&me, 0, sizeof me);
    snprintf(me.backend, sizeof me.backend, "%s", s->be ? s->be->ops->name : "?");
    me.rank = ft_comm_rank(c->comm);
    me.local_rank = ft_comm_local_rank(c->comm);
    for (int t = 0; t < 3; t++) me.layers[t] = s->base_layers[t];
    me.n_micro = s->n_micro;
    me.step_s = s->plan_step_s;
    plan_rec *all = calloc((size_t)P, sizeof *all);
    if (!all) return ft_err(-ENOMEM, "out of memory");
    int rc = ft_comm_gather(c->comm, &me, sizeof me, all, 0);
    if (rc || me.rank != 0) {
        free(all);
        return rc;
    }
    double slowest = 0;
    for (int r = 0; r < P; r++) {
        const plan_rec *p = &all[r];
        char where[128] = "every layer in host memory";
        if (p->layers[0] >= 0)
            snprintf(where, sizeof where, "base layers %lld on the GPU, %lld in pinned host memory, %lld read from the pack",
                     (long long)p->layers[0], (long long)p->layers[1], (long long)p->layers[2]);
        char step[96] = "no predicted step time (the planner predicts one for a packed base on a device)";
        if (p->step_s > 0) snprintf(step, sizeof step, "predicted step %.3f s", p->step_s);
        ft_train_info(k, FT_EV_PLAN, "plan: rank %d (node rank %d): backend %s, %s, %lld micro-batch(es) per step, %s",
                      (int)p->rank, (int)p->local_rank, p->backend, where, (long long)p->n_micro, step);
        if (p->step_s > slowest) slowest = p->step_s;
    }
    free(all);
    const double bytes = (double)l->n_params * sizeof(float), ring = 2.0 * (P - 1) / P * bytes;
    if (c->bus_gbps > 0) {
        const double t = ring / (c->bus_gbps * 1e9);
        char total[96] = "";
        if (slowest > 0) snprintf(total, sizeof total, "; predicted step %.3f s (slowest rank + all-reduce)", slowest + t);
        ft_train_info(k, FT_EV_PLAN, "plan: all-reduce of the LoRA gradients over %d ranks: %.1f MB per step (%lld fp32), %.1f MB on the wire per rank (ring, 2(N-1)/N), %.4f s at the stated bus bandwidth %.1f GB/s%s",
                      P, bytes / 1e6, (long long)l->n_params, ring / 1e6, t, c->bus_gbps, total);
    } else {
        ft_train_info(k, FT_EV_PLAN, "plan: all-reduce of the LoRA gradients over %d ranks: %.1f MB per step (%lld fp32), %.1f MB on the wire per rank (ring, 2(N-1)/N); give --bus-gbps G (nccl-tests' busbw) to predict its time",
                      P, bytes / 1e6, (long long)l->n_params, ring / 1e6);
    }
    return 0;
}
