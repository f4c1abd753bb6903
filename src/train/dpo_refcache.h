/* dpo_refcache.h - a DPO run's reference log-probabilities kept in OUT/dpo_reference.bin, so a
 * resume reads them back instead of running the reference pass again (a forward over every
 * training pair: on a large data set a third of an epoch's compute, on every resume).
 *
 * The file belongs to one run (the run id of its checkpoints) of one model (its identity) on
 * one backend and base quantization; its eval part to one held-out set (the eval-set fingerprint of
 * checkpoint.h). A resume passes the config check first, so the same run id means the same
 * model, data, packing, starting adapter and DPO settings: the numbers are the ones the pass
 * would compute again, and the resumed run stays bit-identical. A part whose key differs (an
 * eval set changed by --eval-data/--eval-max, another --device) is computed again.
 *
 * Layout (host byte order, version 1):
 *   0   char magic[8] = "FTDPOREF"     8  u32 version      12 u32 0
 *   16  char run_id[24]                40 char eval_set[20] 60 char backend[16]
 *   76  i32 quant                      80 u64 model_id
 *   88  i64 n_train_pairs              96 i64 n_eval_pairs
 *   104 f64 train[2 * n_train_pairs], then f64 eval[2 * n_eval_pairs] (dpo_run.h's order:
 *       chosen then rejected summed nll of each pair)
 *   end u64 ft_ckpt_hash (FNV-1a, checkpoint.h) of every byte before it
 * Written to a temporary name, fsynced and renamed (fsutil.h).
 */
#ifndef FT_DPO_REFCACHE_H
#define FT_DPO_REFCACHE_H

#include <stddef.h>
#include <stdint.h>

#define FT_DPO_REF_FILE "dpo_reference.bin"

typedef struct ft_dpo_ref_key {
    char run_id[24];   /* ft_ckpt_state.run_id */
    char eval_set[20]; /* ft_ckpt_state.eval_set: the held-out batches the eval part scores */
    char backend[16];  /* the backend's name ("cpu", "cuda") */
    int32_t quant;     /* FT_PACK_QUANT_* of the base */
    uint64_t model_id; /* the model's identity (offload/pack.h ft_pack_model_identity, or its
                        * pack's) */
} ft_dpo_ref_key;

/* Writes OUT/dpo_reference.bin: train (2 * np_train doubles) and eval (2 * np_eval) under key
 * k. Returns 0 or -errno (message names the path). */
int ft_dpo_ref_save(const char *out_dir, const ft_dpo_ref_key *k, const double *train,
                    int64_t np_train, const double *eval, int64_t np_eval);

/* Reads OUT/dpo_reference.bin into train / eval where the file is of run k->run_id, model,
 * backend and quant with np_train pairs (*got_train = 1), and for the eval part also of held-out set
 * k->eval_set with np_eval pairs (*got_eval = 1). Anything else (no file, another run, a
 * truncated or corrupted file, a reserved field set, a non-finite value) leaves both 0 and the arrays untouched, with the reason in why
 * (n bytes; "" when there is no file). Returns 0; -ENOMEM only. */
int ft_dpo_ref_load(const char *out_dir, const ft_dpo_ref_key *k, double *train, int64_t np_train,
                    double *eval, int64_t np_eval, int *got_train, int *got_eval, char *why,
                    size_t n);

#endif
