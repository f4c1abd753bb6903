/* exec.h - the per-layer executor: vertical schedule with activation checkpoints.
 *
 * One optimizer step over n micro-batches runs as (DESIGN.md "offload/exec"):
 *   forward:  for each layer l: fetch l's weights once; for each micro-batch: run the block
 *             from its input checkpoint ckpt[l][mb] to ckpt[l+1][mb] (nothing else kept);
 *   head:     for each micro-batch: final RMSNorm, chunked LM head + cross-entropy, dx;
 *   backward: for each layer l in reverse: fetch l's weights once; for each micro-batch:
 *             recompute the block from ckpt[l][mb] keeping its intermediates, then run its
 *             backward, turning dx[mb] into the gradient of the layer's input and
 *             accumulating LoRA gradients.
 * So base weights are fetched exactly twice per layer per optimizer step whatever the
 * gradient-accumulation count (counted in layer_fetches). Where weights and checkpoints
 * live is the executor's business alone; the math is in src/model/llama.c.
 * All memory is allocated in ft_exec_init (one backend allocation); steps allocate nothing.
 */
#ifndef FT_EXEC_H
#define FT_EXEC_H

#include <stdint.h>

#include "adapters/lora.h"
#include "kernels/kernels.h"
#include "src/data/dataset.h"
#include "src/model/llama.h"
#include "src/model/model.h"

typedef struct ft_exec {
    ft_backend *be;
    const ft_model *m;
    ft_lora *lora;              /* may be NULL (eval/logits of the base model) */
    int64_t T_max;              /* tokens per micro-batch (rows * seq_len) */
    int64_t n_micro_max;        /* micro-batches per optimizer step */
    int64_t ce_chunk;           /* LM-head rows per chunk */
    float *arena;               /* the one backend allocation */
    size_t arena_bytes;
    float *ckpt;                /* (L + 1) * n_micro * T * C: layer inputs, then the final output */
    float *dx;                  /* n_micro * T * C */
    ft_block_acts acts;         /* one layer, one micro-batch */
    ft_block_scratch scr;
    float *xf, *rstdf, *dxf;    /* final norm: T*C, T, T*C */
    float *ce_scratch;          /* ce_chunk * V */
    float *inv_freq;            /* D / 2 */
    int32_t *ids, *targets, *pos, *seq_start; /* n_micro * T each */
    int64_t layer_fetches;      /* base-weight fetches since init (test hook) */
} ft_exec;

/* Plans and allocates everything for micro-batches of up to T_max tokens and up to
 * n_micro of them per step. rope_seq_len is passed to ft_rope_inv_freq (dynamic scaling).
 * Returns 0, -ENOMEM (message gives the bytes asked for), FT_E_INVALID. */
int ft_exec_init(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                 int64_t n_micro, int64_t rope_seq_len);
void ft_exec_free(ft_exec *e);

/* Bytes ft_exec_init would allocate for these sizes (for the plan printed before training). */
size_t ft_exec_bytes(const ft_model *m, const ft_lora *lora, int64_t T_max, int64_t n_micro);

/* Forward + backward of one optimizer step over n_mb micro-batches. LoRA gradients
 * accumulate into lora->grads (the caller zeroes them per step); the loss is normalised
 * by grad_norm_tokens (the step's total count of targets) so gradients are those of the
 * mean token loss. *loss_sum receives the summed token loss, *n_tokens the target count.
 * dropout_seed != 0 enables LoRA dropout with masks derived from it. */
int ft_exec_train_step(ft_exec *e, const ft_batch *mbs, int64_t n_mb, int64_t grad_norm_tokens,
                       uint64_t dropout_seed, double *loss_sum, int64_t *n_tokens);

/* Forward only (no dropout): summed loss and target count of one micro-batch. */
int ft_exec_eval(ft_exec *e, const ft_batch *mb, double *loss_sum, int64_t *n_tokens);

/* Forward only: logits (T, V) of one micro-batch into host memory `logits`. */
int ft_exec_logits(ft_exec *e, const ft_batch *mb, float *logits);

#endif
