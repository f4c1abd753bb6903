/* events.h - a training run's events (trainer.h ft_train_event) to the caller's callback, for
 * the modules of the run (the library prints nothing: cli/progress.c does). */
#ifndef FT_TRAIN_EVENTS_H
#define FT_TRAIN_EVENTS_H

#include "src/train/trainer.h"

/* Where a run's events go: the caller's callback (NULL: nowhere) and its user pointer. */
typedef struct ft_train_sink {
    ft_train_cb cb;
    void *user;
} ft_train_sink;

/* Hands ev to the callback. */
void ft_train_emit(const ft_train_sink *k, ft_train_event *ev);

/* A one-line event of `kind` (FT_EV_INFO, FT_EV_PLAN, FT_EV_WARN, FT_EV_DONE): printf's fmt,
 * cut at 2047 bytes. */
void ft_train_info(const ft_train_sink *k, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Seconds on the monotonic clock. */
double ft_train_now_s(void);

#endif
