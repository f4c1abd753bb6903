/* metrics.h - machine-readable run output: metrics JSONL (one object per line, flushed
 * as written) and the final summary JSON (written atomically); with ft_metrics_tensorboard
 * also TensorBoard event files of the same numbers (src/formats/tfevents.h). */
#ifndef FT_METRICS_H
#define FT_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "src/formats/tfevents.h"
#include "src/train/dpo.h"

typedef struct ft_metrics {
    FILE *f;
    char path[4096];
    ft_tfevents *tb; /* the event file of ft_metrics_tensorboard, or NULL */
} ft_metrics;

/* Creates/truncates path. Returns 0 or -errno (message names the path). */
int ft_metrics_open(ft_metrics *m, const char *path);

/* Continues the metrics of a run resumed after optimizer step `step`: the lines of path
 * (if it exists) that belong to steps up to `step` are kept (rewritten atomically), the
 * rest (steps run after the checkpoint, a line torn by a crash) dropped, and the file is
 * opened for appending. An eval line at exactly `step` is kept only if keep_eval_at_step
 * (the trainer evaluates mid-run before a checkpoint, but the final eval after the last
 * one). Returns 0 or -errno. */
int ft_metrics_open_resume(ft_metrics *m, const char *path, int64_t step, int keep_eval_at_step);
void ft_metrics_close(ft_metrics *m); /* the event file too */

/* After ft_metrics_open or ft_metrics_open_resume: every line written from now on also goes
 * to a new TensorBoard event file in dir (created; dir NULL: nothing to do), one Event per
 * line at the line's step, flushed with the line. Scalars: every number of the line under
 * "train/<key>" (a step line: train/loss, train/lr, train/grad_norm, train/tokens,
 * train/tokens_per_s, train/elapsed_s, train/bad_steps, the DPO train/rewards/... and
 * train/logps/... means, train/pairs) or "eval/<key less eval_>" (an eval line: eval/loss,
 * eval/tokens, eval/elapsed_s, eval/rewards/...), plus eval/perplexity = exp(eval_loss); a
 * null (non-finite) number is NaN. Each value is the float32 nearest the number as written
 * to metrics.jsonl. The file starts with TensorBoard's session-start marker at step 0
 * (tfevents.h: earlier event files in dir are superseded), then, for a resumed run, the
 * lines kept in metrics.jsonl; so the event files say what metrics.jsonl says. Returns 0,
 * FT_E_UNSUPPORTED (built without protobuf-c) or -errno, naming the file. */
int ft_metrics_tensorboard(ft_metrics *m, const char *dir);

/* One training step: {"step","loss","lr","grad_norm","tokens","tokens_per_s","elapsed_s",
 * "bad_steps"} and "skipped": true for a step skipped for a non-finite loss or gradient
 * norm (no update); non-finite numbers are written as null. bad_steps is cumulative.
 * pref (a DPO step, else NULL) adds TRL's means over the step's pairs: "rewards/chosen",
 * "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
 * "logps/rejected", and "pairs". */
int ft_metrics_step(ft_metrics *m, int64_t step, double loss, double lr, double grad_norm,
                    int64_t tokens, double tokens_per_s, double elapsed_s, int64_t bad_steps,
                    int skipped, const ft_dpo_stats *pref);
/* One evaluation: {"step","eval_loss","eval_tokens","elapsed_s"}; eval_loss with 17
 * significant digits (the exact double the trainer compared: summary.json's
 * best_eval_loss is one of them). pref (a DPO evaluation, else NULL) adds the means above
 * as "eval_rewards/chosen" ... and "eval_pairs". */
int ft_metrics_eval(ft_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens,
                    double elapsed_s, const ft_dpo_stats *pref);

#endif
