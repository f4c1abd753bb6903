/* schedule.c - learning-rate schedules (see schedule.h). */
#include "src/train/schedule.h"

#include <math.h>
#include <string.h>

double ft_schedule_lr(int kind, double lr, int64_t step, int64_t warmup, int64_t total,
                      double min_lr_ratio)
{
    if (step < warmup)
        return lr * (double)step / (double)(warmup > 0 ? warmup : 1);
    if (kind == FT_SCHED_CONSTANT)
        return lr;
    double span = (double)(total - warmup);
    double progress = span > 0 ? (double)(step - warmup) / span : 1.0;
    if (progress > 1) progress = 1;
    double f = kind == FT_SCHED_LINEAR ? 1.0 - progress : 0.5 * (1.0 + cos(M_PI * progress));
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * f);
}

int ft_schedule_parse(const char *s)
{
    if (!strcmp(s, "cosine")) return FT_SCHED_COSINE;
    if (!strcmp(s, "linear")) return FT_SCHED_LINEAR;
    if (!strcmp(s, "constant")) return FT_SCHED_CONSTANT;
    return -1;
}

const char *ft_schedule_name(int kind)
{
    return kind == FT_SCHED_LINEAR ? "linear" : kind == FT_SCHED_CONSTANT ? "constant" : "cosine";
}
