/* progress.h - the progress display: a redrawn bar on a terminal (step, loss, tokens/s,
 * ETA), plain lines otherwise (logs, pipes, CI). */
#ifndef FT_PROGRESS_H
#define FT_PROGRESS_H

#include "src/train/trainer.h"

typedef struct ft_progress {
    int tty;          /* stderr is a terminal */
    int quiet;        /* only warnings (and the errors cli/ prints) */
    int64_t log_every;/* plain mode: a line every N steps (0: automatic) */
    int bar_open;     /* a bar is drawn on the current line */
} ft_progress;

void ft_progress_init(ft_progress *p, int quiet);
/* ft_train_cb-compatible: user = ft_progress *. */
void ft_progress_cb(const ft_train_event *ev, void *user);
/* Ends a bar line before other output. */
void ft_progress_flush(ft_progress *p);

#endif
