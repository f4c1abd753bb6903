/* optim.h - the optimizer of one adapter: AdamW over its parameter groups (LoRA+), the
 * learning-rate schedule, the global gradient norm and its clipping.
 *
 * AdamW is torch.optim.AdamW's (Loshchilov & Hutter 2019, decoupled weight decay; the
 * backend's adamw op, kernels.h), the clip torch.nn.utils.clip_grad_norm_'s (one norm over
 * every gradient, scale max_norm / (norm + 1e-6) when above max_norm), the schedule
 * transformers' (schedule.h). The parameter groups come from the adapter's layout
 * (src/model/lora.h ft_lora_slices): the optimizer does not know how A and B lie in the flat
 * arrays. The AdamW moments are the adapter's (ft_lora.m, v: saved in its checkpoints), the
 * adam step count the caller's (ft_ckpt_state.adam_step), so that a resumed run continues
 * bit for bit. Nothing is allocated after ft_optim_init.
 */
#ifndef FT_OPTIM_H
#define FT_OPTIM_H

#include <stdint.h>

#include "src/model/lora.h"

typedef struct ft_optim_cfg {
    double lr;                  /* peak learning rate */
    int schedule;               /* enum ft_sched (schedule.h) */
    int64_t warmup_steps;       /* linear warmup steps */
    int64_t total_steps;        /* the schedule's length */
    double min_lr_ratio;        /* final lr as a fraction of lr */
    double beta1, beta2, eps, weight_decay; /* AdamW */
    double max_grad_norm;       /* clip the global gradient norm to this (0: off) */
    double loraplus_lr_ratio;   /* LoRA+ (Hayou, Ghosh, Yu 2024, arXiv 2402.12354): every
                                 * lora_B at lr(t) * ratio, every lora_A at lr(t), the same
                                 * weight-decay coefficient for both, as PEFT's
                                 * create_loraplus_optimizer. 0: off (one group) */
} ft_optim_cfg;

typedef struct ft_optim {
    ft_optim_cfg cfg;
    ft_lora *lora;              /* the adapter it updates (params, grads, m, v) */
    ft_lora_slice *slices;      /* LoRA+: the adapter's A and B tensors (ft_lora_slices), else
                                 * NULL */
    int64_t n_slices;
    ft_adamw_seg *segs;         /* LoRA+: the slices as adamw_multi's table (n_slices), else NULL */
} ft_optim;

/* The optimizer of adapter l with settings c. With LoRA+ the adapter's slices are read once
 * (one allocation) and must tile its parameters. Returns 0, -ENOMEM, or FT_E_INVALID when the
 * slices do not cover l->n_params (a layout change not followed by lora.h). */
int ft_optim_init(ft_optim *o, const ft_optim_cfg *c, ft_lora *l);
void ft_optim_free(ft_optim *o); /* NULL-safe; zeroes *o */

/* The scheduled learning rate of optimizer step `step` (0-based, of cfg.total_steps). */
double ft_optim_lr(const ft_optim *o, int64_t step);

/* Zeroes the adapter's gradients (before a step's micro-batches accumulate into them, and to
 * drop a skipped step's). Returns 0 or the backend's error. */
int ft_optim_zero_grad(ft_optim *o);

/* *norm = the global L2 norm of the adapter's gradients (sqrt of the backend's sumsq, a double
 * sum). Returns 0 or the backend's error. */
int ft_optim_grad_norm(ft_optim *o, double *norm);

/* Clips the gradients to cfg.max_grad_norm given their norm (ft_optim_grad_norm): when the
 * clip is on and norm exceeds it, every gradient is scaled by max_grad_norm / (norm + 1e-6)
 * (torch.nn.utils.clip_grad_norm_); otherwise nothing changes. Returns 0 or the backend's
 * error. */
int ft_optim_clip(ft_optim *o, double norm);

/* One AdamW update of the whole adapter at learning rate lr (ft_optim_lr), bias correction of
 * adam step `adam_step` (>= 1), through the backend's adamw_multi where it has one (one segment
 * without LoRA+, one per slice with it; the loop over adamw otherwise, the same bits on the CPU and
 * on CUDA without FT_CUDA_FUSED_ADAMW). Without LoRA+: the flat arrays at lr.
 * With it: A slices at lr and B slices at lr * ratio (decoupled decay on
 * B is then lr * ratio * weight_decay, as torch.optim.AdamW applies a group's lr); adamw is
 * elementwise, so ratio 1 gives the bits of the single call. Returns 0 or the backend's
 * error. */
int ft_optim_step(ft_optim *o, double lr, int64_t adam_step);

#endif
