/* train_data.h - the data of a training run, shared by its adapters: the tokenized examples
 * (src/data/dataset.h: the training files, their eval split or --eval-data), the eval
 * micro-batches and the training micro-batches of the current epoch (src/data/batch.c
 * ft_pack / ft_pack_pairs: first-fit-decreasing sequence packing, re-packed each epoch with
 * the seed + epoch). */
#ifndef FT_TRAIN_DATA_H
#define FT_TRAIN_DATA_H

#include <stdint.h>

#include "src/data/dataset.h"
#include "src/formats/config.h"
#include "src/train/events.h"
#include "src/train/trainer.h"

typedef struct ft_train_data {
    ft_dataset ds;              /* examples (DPO: a pair is two, chosen then rejected) */
    ft_batch *train_b, *eval_b; /* micro-batches of the current epoch, and of the held-out set */
    int64_t n_train_b, n_eval_b;
    int64_t epoch;              /* the epoch train_b is packed for */
    int64_t seq_len;            /* tokens per packed row */
    double target_weight;       /* ft_train_data_target_weight of the run's model: the cost of a
                                 * loss-target token for cfg.balance_steps */
} ft_train_data;

/* The cost of one loss-target token (its LM head row and cross-entropy, forward and backward)
 * relative to one token's pass through the blocks, from the model's shape: vocab_size *
 * hidden_size over the base weights of all layers' projections (ft_layer_proj_params), both counted as
 * multiply-adds per token; attention's quadratic term is left out. A proxy for
 * ft_batch_group_by_cost, not a timing. */
double ft_train_data_target_weight(const ft_model_config *mc);

/* Reads c->data (and c->eval_data) with tok as the run's data (seq_len tokens per row: the
 * data_cfg's schema, template, masks, truncation, split; target_weight: the model's
 * ft_train_data_target_weight, for c->balance_steps), reports the data line (and a chat
 * template that cannot end a reply, an --eval-fraction that --eval-data makes moot) to k, and
 * packs epoch 0 and the eval micro-batches. Returns 0 or an error naming the file: FT_E_INVALID
 * also when no training example is left, or when --early-stopping-patience or --save-best
 * have no eval examples. */
int ft_train_data_load(ft_train_data *d, const ft_train_cfg *c, ft_tokenizer *tok,
                       int64_t seq_len, double target_weight, const ft_train_sink *k);

/* Packs the training micro-batches of `epoch` (epoch 0 uses the seed itself), as
 * ft_train_data_pack. Returns 0 or -ENOMEM. */
int ft_train_data_pack_epoch(ft_train_data *d, const ft_train_cfg *c, int64_t epoch);

/* The training micro-batches of `epoch` packed from d's examples with c's batch size, seed and
 * method into *b (*n of them; the caller frees them, ft_batches_free), as
 * ft_train_data_pack_epoch packs d's; with c->balance_steps grouped by cost in steps of
 * ft_train_dist_global_accum(c) micro-batches (ft_batch_group_by_cost, seed + epoch).
 * Returns 0 or -ENOMEM. */
int ft_train_data_pack(const ft_train_data *d, const ft_train_cfg *c, int64_t epoch, ft_batch **b,
                       int64_t *n);

void ft_train_data_free(ft_train_data *d); /* zeroes *d */

#endif
