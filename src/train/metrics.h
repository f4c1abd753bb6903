/* metrics.h - machine-readable run output: metrics JSONL (one object per line, flushed
 * as written) and the final summary JSON (written atomically). */
#ifndef FT_METRICS_H
#define FT_METRICS_H

#include <stdint.h>
#include <stdio.h>

typedef struct ft_metrics { FILE *f; char path[4096]; } ft_metrics;

/* Creates/truncates path. Returns 0 or -errno (message names the path). */
int ft_metrics_open(ft_metrics *m, const char *path);
void ft_metrics_close(ft_metrics *m);

/* One training step: {"step","loss","lr","grad_norm","tokens","tokens_per_s","elapsed_s"}. */
int ft_metrics_step(ft_metrics *m, int64_t step, double loss, double lr, double grad_norm,
                    int64_t tokens, double tokens_per_s, double elapsed_s);
/* One evaluation: {"step","eval_loss","eval_tokens","elapsed_s"}. */
int ft_metrics_eval(ft_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens,
                    double elapsed_s);

#endif
