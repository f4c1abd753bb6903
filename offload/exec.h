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
#include "offload/pack.h"
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
    /* The base weights as the backend reads them: the model's own host arrays on a host-memory
     * backend (CPU); on a device backend (CUDA), copies in one device allocation made at init
     * (every layer resident: the streaming tiers are the offload issue's), the projections in
 * bf16 when the backend takes bf16 weights (CUDA), everything else in fp32. */
    ft_layer_weights *layers;   /* num_hidden_layers; == m->layers on the CPU */
    const float *embed, *final_norm, *lm_head;
    float *weights;             /* the device copy (NULL on the CPU) */
    int weights_with_layers;    /* 1: weights holds the layers too, 0: the global tensors only */
    size_t weights_bytes;
    /* Activations kept from the forward for the backward, per layer and micro-batch
     * ([l * n_micro_max + mb]), when memory allows (ft_exec_keep_activations): the backward
     * then skips the recompute (one forward of the base less per step, a quarter to a third
     * of the step's FLOPs). NULL: recompute from the layer-input checkpoints. */
    ft_block_acts *kept;
    float *kept_mem;
    size_t kept_bytes;
    /* Packed base (ft_exec_use_pack; QLoRA with NF4): each fetch reads the layer's block
     * from the pack into pack_raw and dequantizes it into layer_f32; NULL: the model's
     * resident fp32 weights are used. */
    ft_pack_file *pack;
    void *pack_raw;             /* host, 4096-aligned, the largest layer block */
    size_t pack_raw_bytes;
    float *layer_f32;           /* backend memory, ft_pack_layer_floats floats */
    ft_layer_weights fetched;   /* points into layer_f32 */
    int64_t fetched_layer;      /* the layer layer_f32 holds, -1 if none */
    int64_t pack_reads;         /* blocks read from the pack (test hook) */
    uint8_t *pack_host;         /* host-resident blocks (ft_exec_use_pack_ex resident), or NULL */
    /* Device backends (resident.c): every layer block of the pack in device memory. */
    uint8_t *pack_dev;
    size_t pack_dev_bytes;
    int64_t *pack_dev_off;      /* per layer: offset of its block in pack_dev */
    ft_pack_tensor **pack_dir;  /* per layer: a host copy of its tensor directory */
    int64_t *pack_dir_n;
} ft_exec;

/* Plans and allocates everything for micro-batches of up to T_max tokens and up to
 * n_micro of them per step. rope_seq_len is passed to ft_rope_inv_freq (dynamic scaling).
 * Returns 0, -ENOMEM (message gives the bytes asked for), FT_E_INVALID. */
int ft_exec_init(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                 int64_t n_micro, int64_t rope_seq_len);
/* As ft_exec_init; place_layers = 0 leaves the layers' weights out of a device backend's
 * copy (the caller follows with ft_exec_use_pack), so a packed base never has a full copy of
 * the layers in device memory, not even for a moment. */
int ft_exec_init_ex(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora, int64_t T_max,
                    int64_t n_micro, int64_t rope_seq_len, int place_layers);
void ft_exec_free(ft_exec *e);

/* Makes the executor take the base model's layer weights (norms, projections, biases) from
 * a pack instead of the model's fp32 arrays. Host-memory backend (CPU): at every layer fetch
 * the block is read (pread, checksum verified) and dequantized to fp32 (NF4 with bitsandbytes
 * arithmetic, nf4.h), so the block math is unchanged and only one layer is ever held in fp32.
 * Device backend (CUDA): every block is read and checksummed once and kept in device memory
 * (4-bit), the layers' copied weights are freed, and each layer visit dequantizes its NF4
 * projections to bf16 in one staging buffer (resident.c). Embeddings, final
 * norm and LM head still come from the model. The pack must describe the same architecture
 * as e->m (FT_E_INVALID otherwise); it stays owned by the caller and must outlive e.
 * Allocates once (the largest block + one layer in fp32); returns 0, -ENOMEM, FT_E_INVALID. */
int ft_exec_use_pack(ft_exec *e, ft_pack_file *pack);

/* Bytes ft_exec_keep_activations would allocate (every layer's activations for every
 * micro-batch of T_max tokens). */
size_t ft_exec_kept_bytes(const ft_exec *e);
/* Keeps every layer's forward activations for the backward instead of recomputing them,
 * if ft_exec_kept_bytes(e) fits in budget_bytes: one allocation. Results are bit-identical
 * to the recompute schedule (the recompute repeats the same ops on the same inputs).
 * Returns 1 when kept, 0 when it does not fit (nothing allocated), -ENOMEM when the
 * allocation itself fails. */
int ft_exec_keep_activations(ft_exec *e, size_t budget_bytes);

/* As ft_exec_use_pack; on a host-memory backend, resident = 1 reads every layer block once
 * into host memory (the "everything resident" tier) and each fetch dequantizes from there,
 * resident = 0 streams: every layer visit reads the block from the file (io_uring + O_DIRECT
 * where possible, offload/uring.h). Both give the same bits. Device backends are always
 * resident (in device memory). */
int ft_exec_use_pack_ex(ft_exec *e, ft_pack_file *pack, int resident);

/* Bytes ft_exec_use_pack allocates for this pack. */
size_t ft_exec_pack_bytes(const ft_pack_file *pack);

/* Bytes ft_exec_init would allocate for these sizes on backend be (for the plan printed
 * before training and the --gpu-mem check): the arena, plus on a device backend the resident
 * copy of the base weights (ft_exec_weight_bytes). */
size_t ft_exec_bytes(const ft_backend *be, const ft_model *m, const ft_lora *lora, int64_t T_max,
                     int64_t n_micro);
/* Bytes a device backend holds for a packed base (resident.c): the global tensors in fp32,
 * every layer block of the pack, and one layer's projections in bf16 (the staging). */
size_t ft_exec_packed_weight_bytes(const ft_backend *be, const ft_model *m, const ft_pack_file *pack);
/* Bytes of the device copy of the base model's weights on backend be (embeddings counted
 * once when tied; projections in bf16 where the backend takes bf16 weights, else fp32). */
size_t ft_exec_weight_bytes(const ft_backend *be, const ft_model *m);

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
