/* dpo_run.h - DPO over the executor: the reference log-probabilities, evaluation and the
 * gradient of a training step, on preference micro-batches (ft_pack_pairs; dpo.h has the
 * loss).
 *
 * The reference model is the model the run starts from, as TRL's DPOTrainer takes it with a
 * PEFT model and no ref_model: the base with a new adapter (B = 0 at initialisation, so the
 * adapter adds nothing), or the base with --init-adapter (TRL's "ref" copy of a pretrained
 * adapter); a frozen quantization correction is part of the base. Its log-probabilities are
 * computed once, before the first step (TRL's precompute_ref_log_probs), and again on
 * resume before the checkpoint's adapter is loaded: the same forward over the same batches
 * gives the same numbers, so a resumed run matches an uninterrupted one.
 */
#ifndef FT_DPO_RUN_H
#define FT_DPO_RUN_H

#include <stdint.h>

#include "offload/exec.h"
#include "src/data/dataset.h"
#include "src/train/dpo.h"

/* The reference nlls of every pair in batches b[0..n_b) (at most cap of them when cap > 0):
 * ref[2p] = summed -log p of pair p's chosen completion, ref[2p+1] its rejected one's, for
 * the pair indices p the batches name (< n_pairs). Runs ft_exec_eval_seq with the adapter as
 * it is. Returns 0, FT_E_INVALID (a pair index out of range), or the executor's error. */
int ft_dpo_reference(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, double *ref,
                     int64_t n_pairs);

/* Evaluation: the DPO loss and metrics of every pair in b[0..n_b) (at most cap batches),
 * summed into *st (zeroed first), against the reference nlls ref. */
int ft_dpo_evaluate(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, const double *ref,
                    const ft_dpo_cfg *c, ft_dpo_stats *st);

/* One training step's objective: the mean DPO loss over the step's pairs. */
typedef struct ft_dpo_step {
    const ft_dpo_cfg *cfg;
    const double *ref;          /* reference nlls by pair index (ft_dpo_reference) */
    int64_t step_pairs;         /* pairs in the step's micro-batches: the mean's divisor */
    ft_dpo_stats st;            /* the step's sums */
} ft_dpo_step;

/* The ft_exec_seq_grad_fn of a DPO step (user = ft_dpo_step *): each pair's loss and
 * d loss / d nll of both sequences, divided by step_pairs, added to the step's sums. */
int ft_dpo_step_grad(void *user, int64_t mb, const ft_batch *b, const double *nll,
                     const int64_t *n_tok, double *scale);

#endif
