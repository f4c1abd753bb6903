/* eval_run.h - `ftune eval`'s evaluation of an adapter (or the base model) over data files, on
 * a runtime session (offload/session.h): every record of the files, with the masks of
 * training, packed as training packs them.
 *   SFT: the mean token loss, the targets scored and their summed loss; with per_example
 *   each example's summed loss and targets too, from the heads of its own rows
 *   (offload/exec.h ft_exec_eval_spans) in the same forward, so that the totals are the same
 *   with or without them.
 *   DPO (src/train/dpo.h): the mean pair loss and TRL's reward metrics of the session's
 *   adapter against the reference: the base model (the adapter swapped out for the reference
 *   pass), or the base with ref_adapter (loaded for the reference pass, then the adapter
 *   again: in place when it has the same rank and targets); none for the reference-free
 *   losses. */
#ifndef FT_EVAL_RUN_H
#define FT_EVAL_RUN_H

#include <stdint.h>

#include "offload/session.h"
#include "src/data/dataset.h"
#include "src/train/dpo.h"

typedef struct ft_eval_cfg {
    const char *const *data;    /* (n_data) files, read in order, scored together */
    int64_t n_data;
    ft_data_cfg data_cfg;       /* schema, template, masks (no shuffle or split: every record
                                 * scored in file order); seq_len 0: min(2048, model max);
                                 * preference set for DPO */
    int64_t batch;              /* rows per micro-batch (DPO: pairs), >= 1 */
    const ft_dpo_cfg *dpo;      /* NULL: SFT */
    const char *adapter;        /* the session's adapter folder (DPO with ref_adapter loads it
                                 * back after the reference pass), or NULL */
    const char *ref_adapter;    /* DPO: the reference's adapter, or NULL (the base model) */
    int per_example;            /* SFT: 1 for each example's loss (ex_nll, ex_tok) */
} ft_eval_cfg;

typedef struct ft_eval_result {
    double loss;                /* mean token loss (DPO: mean pair loss); NAN without a target */
    double nll;                 /* SFT: the summed token loss */
    int64_t tokens;             /* targets scored (DPO: completion tokens read) */
    int64_t examples, skipped, dropped; /* examples scored, bad records skipped, examples left
                                         * without a scored token by seq_len */
    ft_dpo_stats dpo;           /* DPO: the sums over the pairs */
    ft_dataset ds;              /* the examples (in data-file order), for the per-example lines */
    double *ex_nll;             /* per_example: each example's summed loss (ds.n_train) */
    int64_t *ex_tok;            /* ... and its targets */
} ft_eval_result;

/* Evaluates c on the session s (opened, no executor needed: it is placed here for the
 * micro-batches' size). Returns 0 or an error naming the file: FT_E_INVALID when the files
 * hold no example, FT_E_UNSUPPORTED for DPO with an NF4 adapter trained with
 * --quant-correction (its reference is the corrected base), the session's placement errors.
 * *o is filled as far as it got; free it with ft_eval_result_free either way. */
int ft_eval_run(ft_session *s, const ft_eval_cfg *c, ft_eval_result *o);
void ft_eval_result_free(ft_eval_result *o); /* zeroes *o */

#endif
