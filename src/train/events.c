/* events.c - a training run's events to the caller's callback (see events.h). */
#include "src/train/events.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

void ft_train_emit(const ft_train_sink *k, ft_train_event *ev)
{
    if (k->cb) k->cb(ev, k->user);
}

void ft_train_info(const ft_train_sink *k, int kind, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ft_train_event ev = {.kind = kind, .text = line};
    ft_train_emit(k, &ev);
}

double ft_train_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
