/* optim.c - AdamW over an adapter's parameter groups, clipping, schedule (see optim.h). */
#include "src/train/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/train/schedule.h"

int ft_optim_init(ft_optim *o, const ft_optim_cfg *c, ft_lora *l)
{
    memset(o, 0, sizeof *o);
    o->cfg = *c;
    o->lora = l;
    if (!(c->loraplus_lr_ratio > 0)) return 0;
    int64_t n = ft_lora_slices(l, NULL, 0);
    o->slices = malloc((size_t)(n > 0 ? n : 1) * sizeof *o->slices);
    if (!o->slices) return ft_err(-ENOMEM, "out of memory for the LoRA+ parameter groups");
    o->n_slices = ft_lora_slices(l, o->slices, n);
    o->segs = malloc((size_t)(o->n_slices > 0 ? o->n_slices : 1) * sizeof *o->segs);
    if (!o->segs) {
        ft_optim_free(o);
        return ft_err(-ENOMEM, "out of memory for the LoRA+ parameter groups");
    }
    int64_t covered = 0;
    for (int64_t k = 0; k < o->n_slices; k++) covered += o->slices[k].n;
    if (covered != l->n_params) {
        ft_optim_free(o);
        return ft_err(FT_E_INVALID, "LoRA+: the A/B slices cover %lld of %lld adapter parameters",
                      (long long)covered, (long long)l->n_params);
    }
    return 0;
}

void ft_optim_free(ft_optim *o)
{
    if (!o) return;
    free(o->slices);
    free(o->segs);
    memset(o, 0, sizeof *o);
}

double ft_optim_lr(const ft_optim *o, int64_t step)
{
    const ft_optim_cfg *c = &o->cfg;
    return ft_schedule_lr(c->schedule, c->lr, step, c->warmup_steps, c->total_steps,
                          c->min_lr_ratio);
}

int ft_optim_zero_grad(ft_optim *o)
{
    ft_lora *l = o->lora;
    return l->be->ops->zero(l->be, l->grads, (size_t)l->n_params * sizeof(float));
}

int ft_optim_grad_norm(ft_optim *o, double *norm)
{
    ft_lora *l = o->lora;
    double sq;
    FT_TRY(l->be->ops->sumsq(l->be, &sq, l->grads, l->n_params));
    *norm = sqrt(sq);
    return 0;
}

int ft_optim_clip(ft_optim *o, double norm)
{
    ft_lora *l = o->lora;
    const double max = o->cfg.max_grad_norm;
    if (!(max > 0 && norm > max)) return 0;
    return l->be->ops->scale(l->be, l->grads, (float)(max / (norm + 1e-6)), l->n_params);
}

int ft_optim_step(ft_optim *o, double lr, int64_t adam_step)
{
    ft_lora *l = o->lora;
    ft_backend *be = l->be;
    const ft_optim_cfg *c = &o->cfg;
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps;
    const float wd = (float)c->weight_decay;
    if (!o->slices) {
        if (be->ops->adamw_multi) {
            const ft_adamw_seg all = {l->params, l->grads, l->m, l->v, l->n_params, (float)lr};
            return be->ops->adamw_multi(be, &all, 1, b1, b2, eps, wd, adam_step);
        }
        return be->ops->adamw(be, l->params, l->grads, l->m, l->v, l->n_params, (float)lr, b1, b2,
                              eps, wd, adam_step);
    }
    const float lrs[2] = {(float)lr, (float)(lr * c->loraplus_lr_ratio)}; /* by ft_lora_group */
    if (be->ops->adamw_multi) {
        for (int64_t k = 0; k < o->n_slices; k++) {
            const ft_lora_slice *s = &o->slices[k];
            o->segs[k] = (ft_adamw_seg){l->params + s->off, l->grads + s->off, l->m + s->off,
                                        l->v + s->off, s->n, lrs[s->group]};
        }
        return be->ops->adamw_multi(be, o->segs, o->n_slices, b1, b2, eps, wd, adam_step);
    }
    for (int64_t k = 0; k < o->n_slices; k++) {
        const ft_lora_slice *s = &o->slices[k];
        FT_TRY(be->ops->adamw(be, l->params + s->off, l->grads + s->off, l->m + s->off,
                              l->v + s->off, s->n, lrs[s->group], b1, b2, eps, wd, adam_step));
    }
    return 0;
}
