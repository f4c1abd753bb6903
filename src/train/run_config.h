/* run_config.h - what identifies a training run's trajectory: the run config stored in its
 * checkpoints (every key outside "info" changes the trajectory and must match on --resume),
 * the fingerprint of its tokenized data, and the identity of a DPO reference. */
#ifndef FT_RUN_CONFIG_H
#define FT_RUN_CONFIG_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "src/data/dataset.h"
#include "src/model/lora.h"
#include "src/model/model.h"
#include "src/train/trainer.h"

/* Fingerprint of the tokenized data as training sees it: order, lengths, ids and labels of
 * the train and, when they were split off the training file (split = 1), the eval examples
 * (covers the file, schema, template, tokenizer, split); with several --data files also how
 * many examples each gave. The examples of --eval-data (split = 0) are left out: they change
 * no training state, so a resume may change that file. Hash: checkpoint.h ft_ckpt_hash. */
uint64_t ft_train_data_fingerprint(const ft_dataset *ds, int split);

/* Adds "data" to o: the training file's name, or with several an array of them in order
 * (the shape of the --config key). */
void ft_train_add_data_json(cJSON *o, const ft_train_cfg *c);

/* What the DPO reference is, for the run config, into buf: "none" (a reference-free loss),
 * "base", or "init-adapter " and a fingerprint of --init-adapter's weights file (its name may
 * change on resume, its weights may not). Returns 0 or the read error of that file. */
int ft_train_dpo_reference_id(const ft_train_cfg *c, char *buf, size_t n);

/* The run config (JSON text, malloc'ed; NULL when out of memory) of an adapter lc of
 * n_params parameters trained with c on model m and data ds (seq_len tokens per row, total
 * steps, warmup), base quantization quant (enum ft_pack_quant), DPO reference dpo_ref.
 * Numbers are written exactly (they are compared on resume). */
char *ft_train_run_config(const ft_train_cfg *c, const ft_lora_cfg *lc, const ft_model *m,
                          const ft_dataset *ds, int64_t seq_len, int64_t total, int64_t warmup,
                          int64_t n_params, int quant, const char *dpo_ref);

/* --resume: the checkpoint's run config `saved` against this run's `cur`: 0 when they match,
 * else FT_E_INVALID naming the differences (checkpoint.h ft_ckpt_config_diff), in terms of
 * --data when the training data differ (both lists named), with the way out. */
int ft_train_config_check(const char *saved, const char *cur, const char *resume);

#endif
