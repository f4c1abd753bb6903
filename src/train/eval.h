/* eval.h - an adapter's evaluation during training: the held-out loss (SFT: the mean token
 * loss; DPO: the mean pair loss and TRL's reward metrics), written to metrics.jsonl and
 * reported; the best eval loss, --save-best and early stopping, after transformers' Trainer
 * (metric_for_best_model="eval_loss": a new best is strictly below the best so far;
 * EarlyStoppingCallback: an eval "improves" when it is below the best before it by more than
 * early_stopping_threshold, early_stopping_patience such evals in a row without one stop the
 * run; the step-0 eval is no candidate); the fingerprint of the held-out set they compare on.
 */
#ifndef FT_TRAIN_EVAL_H
#define FT_TRAIN_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "offload/exec.h"
#include "src/train/adapter.h"

/* Mean token loss over the eval micro-batches b[0..n) (the first cap when cap > 0) into
 * *loss (NAN without a target), their targets into *tokens. Returns 0 or the executor's
 * error. */
int ft_train_evaluate(ft_exec *ex, const ft_batch *b, int64_t n, int64_t cap, double *loss,
                      int64_t *tokens);

/* One evaluation of adapter a on d's held-out batches after step `step`, written to its
 * metrics.jsonl (elapsed_s: the run's time) and reported (FT_EV_EVAL): *loss is the mean
 * token loss, or with DPO the mean pair loss (and the reward metrics); *tokens the target
 * tokens read. The session's executor runs a's adapter for it. With --eval-prompts, then the
 * adapter's sample replies (eval_samples.h) and their FT_EV_INFO line. Returns 0 or an error. */
int ft_train_eval_log(ft_train_adapter *a, ft_session *s, const ft_train_data *d, int64_t step,
                      double elapsed_s, const ft_train_sink *k, double *loss, int64_t *tokens);

/* Counts a mid-run or final evaluation (eval loss `loss` of the adapter after step `step`) in
 * the order of transformers' Trainer._maybe_log_save_evaluate: first
 * EarlyStoppingCallback.check_metric_value against the best before it (the first counted
 * eval, best_metric None there, resets the counter; the improvement must exceed the
 * threshold), then _determine_best_metric (a strictly lower loss is the new best, no
 * threshold; a NaN loss never is). With --save-best a new best's adapter goes to OUT/best.
 * Returns 0 or the error of that save. */
int ft_train_track_eval(ft_train_adapter *a, double loss, int64_t step);

/* 1 when early stopping ends the adapter now (--early-stopping-patience evals in a row
 * without an improvement), with its info line reported. */
int ft_train_early_stop(const ft_train_adapter *a, const ft_train_sink *k);

/* Fingerprint (16 hex digits into buf) of the held-out batches an evaluation reads (the first
 * eval_max_batches of them): their token ids and targets. Eval losses, and so the best eval
 * loss and early stopping, compare only within one such set. */
void ft_train_eval_set_id(const ft_train_data *d, int64_t eval_max_batches, char *buf, size_t n);

/* On --resume: eval losses of another held-out set (--eval-data or --eval-max changed) do not
 * compare with the checkpoint's best, so the best and the early-stopping count start over
 * (the next evaluation is the first counted one, and with --save-best replaces OUT/best),
 * with a warning. A checkpoint without the fingerprint is taken to be of the current set. */
void ft_train_resume_eval_set(ft_train_adapter *a, const ft_train_data *d, const ft_train_sink *k);

/* On --resume with --save-best: OUT/best must hold the adapter of the checkpoint's best
 * step, which its ftune_step.json says (checkpoint.h ft_ckpt_adapter_step). Otherwise (a
 * later best written after the checkpoint or by the final eval, the flag added on resume, the
 * folder lost) it is restored from OUT/checkpoint-<best>/ when that still exists, else
 * removed with a warning (it would name another step). Returns 0 or an error. */
int ft_train_resume_best(ft_train_adapter *a, const ft_train_sink *k);

#endif
