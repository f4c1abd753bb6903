/* schedule.h - learning-rate schedules with linear warmup, as transformers'
 * get_{cosine,linear,constant}_schedule_with_warmup (optimization.py):
 *   step < warmup:  lr * step / warmup
 *   cosine:         lr * (min + (1 - min) * 0.5 * (1 + cos(pi * progress)))
 *   linear:         lr * (min + (1 - min) * (1 - progress))
 *   constant:       lr
 * with progress = (step - warmup) / (total - warmup) and min = min_lr_ratio (0 in HF). */
#ifndef FT_SCHEDULE_H
#define FT_SCHEDULE_H

#include <stdint.h>

enum ft_sched { FT_SCHED_COSINE = 0, FT_SCHED_LINEAR, FT_SCHED_CONSTANT };

/* LR for optimizer step `step` (0-based) of `total`. */
double ft_schedule_lr(int kind, double lr, int64_t step, int64_t warmup, int64_t total,
                      double min_lr_ratio);
/* "cosine" | "linear" | "constant" -> enum, or -1. */
int ft_schedule_parse(const char *s);
const char *ft_schedule_name(int kind);

#endif
