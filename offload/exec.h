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

#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "offload/pack.h"
#include "src/data/dataset.h"
#include "src/infer/generate.h"
#include "src/model/llama.h"
#include "src/model/model.h"

struct ft_timeline;
struct ft_tl_mark;
struct ft_disk_prefetch;
struct ft_ckpt_tier;

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
    /* NEFTune (Jain et al. 2023, arXiv 2310.05914): neftune_alpha > 0 adds uniform noise of
     * magnitude alpha / sqrt(seq_len * hidden_size) to the embeddings of every micro-batch of
     * ft_exec_train_step (never ft_exec_eval or ft_exec_logits), drawn from neftune_seed and
     * the micro-batch index (exec_step.c neftune). Zero after init (off); the caller sets both
     * before a step, the seed a pure function of its run seed and the step, so that a
     * resumed run draws the same noise. */
    double neftune_alpha;
    uint64_t neftune_seed;
    double *seq_buf;            /* host scratch of the sequence objectives (ft_exec_train_step_seq):
                                 * nll, scale and counts of one micro-batch; sized for T_max
                                 * sequences at the first such step */
    int64_t seq_cap;            /* sequences it holds */
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
    ft_layer_weights fetched;   /* points into layer_f32 (or the block, tiers.c) */
    int64_t fetched_layer;      /* the layer layer_f32 holds, -1 if none */
    /* Device tiers: 1 when NF4 projections go to the backend's dequant-fused GEMM (FT_W_NF4)
     * as these descriptions of the fetched block, instead of a bf16 copy in layer_f32. Set at
     * init from be->tune.nf4_gemm (ft_exec_nf4_gemm_mode: fused -> 1); the placer
     * (offload/place.h) sets it from its probe with auto. Read by ft_exec_use_pack_tiers and
     * the probe. */
    int nf4_fused;
    ft_nf4_tensor fetched_nf4[FT_N_PROJ];
    int64_t pack_reads;         /* blocks read from the pack (test hook) */
    int64_t gen_nf4_fetches;    /* generation visits served NF4 in place (test hook) */
    uint8_t *pack_host;         /* host-resident blocks (ft_exec_use_pack_ex resident), or NULL */
    /* Device backends (resident.c): every layer block of the pack in device memory. */
    uint8_t *pack_dev;
    size_t pack_dev_bytes;
    int64_t *pack_dev_off;      /* per layer: offset of its block in pack_dev */
    ft_pack_tensor **pack_dir;  /* per layer: a host copy of its tensor directory */
    int64_t *pack_dir_n;
    /* Device tiers (tiers.c; offload/plan.h enum ft_tier): a layer's block lives in device
     * memory (pack_dev), in pinned host memory (pack_pinned) or only in the pack file; the
     * last two reach the GPU through n_slots device slots, filled on the H2D lane ahead of
     * compute (disk blocks first read into n_stage pinned staging buffers), in the order of
     * the current operation's layer visits. */
    uint8_t *tier;              /* per layer; NULL: every block in device memory */
    uint8_t *pack_pinned;
    size_t pack_pinned_bytes;
    int64_t *pack_pin_off;      /* per layer: offset in pack_pinned, -1 if not there */
    int n_slots, n_stage;
    size_t slot_bytes;
    uint8_t *slot_mem;          /* device, n_slots * slot_bytes */
    uint8_t *stage_mem;         /* pinned host, n_stage * slot_bytes */
    int64_t slot_layer[8];      /* layer issued into each slot, -1 */
    int slot_busy[8];           /* 1 from issue until released after its layer's compute */
    int64_t slot_ring, stage_ring;
    int cur_slot;               /* slot of fetched_layer, -1 */
    int64_t *visits;            /* the current operation's layer order (2 L entries max) */
    int64_t n_visits, next_issue;
    uint64_t h2d_bytes, disk_bytes; /* streamed since init */
    double disk_seconds;        /* seconds the disk was busy reading streamed blocks (overlapping reads counted once) */
    int32_t *ids_host;          /* pack-only models: token ids for the host embedding gather */
    float *embed_host;          /* pinned T_max * C floats */
    /* A pack-only model on a host-memory backend whose table has lm_head_logits_bf16
     * (ft_exec_globals_from_pack; not with be->tune.gen_head_f32): globals_lazy = 1, and the
     * embeddings and LM head are kept as the pack stores them, bf16 (V, C) each (one table
     * when tied) in globals_bf16, for generation (ft_exec_gen_source: the head through
     * lm_head_logits_bf16, the embedding rows widened). embed and lm_head stay NULL until the
     * first operation that reads them in fp32 (a training step, eval, logits, a generation
     * head of more than FT_LM_HEAD_BF16_ROWS rows) calls ft_exec_globals_f32, which frees
     * the bf16 copy and reads the fp32 tables from the pack into globals_f32, the values the
     * executor held before (bf16 widened exactly). weights_bytes counts them in fp32. */
    int globals_lazy;
    uint16_t *globals_bf16;     /* backend (host) memory; embed_bf16, lm_head_bf16 point into it */
    const uint16_t *embed_bf16, *lm_head_bf16;
    float *globals_f32;         /* backend memory, the fp32 tables once read, or NULL */
    struct ft_disk_prefetch *dpf; /* disk tier read-ahead (offload/prefetch.c), NULL if unused */
    struct ft_ckpt_tier *ckt;   /* layer-input checkpoints in host memory (offload/actckpt.c), NULL: on the device */
    struct ft_timeline *tl;     /* when set, spans of each operation are recorded (tiers.c) */
    int tl_next_ev;             /* next free event id for the timeline */
    double tl_host0;            /* host clock at the operation's origin event */
    int64_t tl_n_marks;
    struct ft_tl_mark *tl_marks;
    /* Several adapters per pass (ft_exec_init_multi, ft_exec_train_step_multi): a pass
     * micro-batch holds up to n_adapters adapters' micro-batches of up to adapter_T_max tokens
     * each, one after another (T_max = n_adapters * adapter_T_max rows); activations are sized
     * for LoRA ranks up to r_max. ft_exec_init(_ex) makes n_adapters = 1, adapter_T_max =
     * T_max, r_max = its adapter's rank (1 without one). */
    int64_t n_adapters;
    int64_t adapter_T_max;
    int64_t r_max;
    int adapters_per_step;      /* 1: made by ft_exec_init_multi (lora NULL: each step names its
                                 * adapters) */
    /* 0 (default): the frozen projections of a pass micro-batch run as one GEMM per adapter's
     * rows, so that each adapter gets the bits of its run alone, whatever shares its pass;
     * 1: one GEMM over all its adapters' rows (ft_block_io.concat_gemms), which rounds a row
     * otherwise wherever the backend's GEMM rounds a row by the row count and the tile it
     * falls in (OpenBLAS; cuBLAS picks kernels by shape): on the tiny model up to 2e-6 of the
     * largest gradient of a step in fp32 and 6e-4 with bf16 operands, and AdamW's first
     * steps, near lr * sign(g) for each element, turn that into parameter differences up to
     * 2 lr on the elements whose gradient is that small (tests/unit/test_exec_multi.c). Set
     * before a step. */
    int concat_gemms;
    /* The current operation's passes (host, sized at init): pass micro-batch mb has
     * op_nseg[mb] segments op_segs[mb * n_adapters + k] (of steps op_seg_step[...]) over
     * op_rows[mb] rows; op_loss / op_ntok (n_adapters) sum each step's head. */
    ft_block_seg *op_segs;
    int64_t *op_seg_step, *op_rows, *op_nseg, *op_ntok;
    double *op_loss;
} ft_exec;

/* Plans and allocates everything for micro-batches of up to T_max tokens and up to
 * n_micro of them per step. rope_seq_len is passed to ft_rope_inv_freq (dynamic scaling).
 * Returns 0, -ENOMEM (message gives the bytes asked for), FT_E_INVALID; on an error nothing
 * is left allocated (e zeroed; ft_exec_free is harmless). */
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

/* Layer-input checkpoints in pinned host memory (offload/actckpt.h): the inputs of the last
 * dev_layers layers stay on the device, the others are stored to the host after the forward
 * computes them and loaded back ahead of the backward, through a ring of n_sets (2..4) device
 * sets of n_micro buffers, on the checkpoint lane. Results are bit-identical to checkpoints
 * on the device (the same ops on the same inputs). ft_exec_init_ckpt_host sizes the arena
 * for it from the start (so the device never holds every checkpoint); ft_exec_ckpt_to_host
 * turns an executor made by ft_exec_init(_ex) into one (before its first operation: the
 * arena is freed and made again, smaller). Returns 0, -ENOMEM, FT_E_INVALID (bad counts, or
 * already in host memory), FT_E_UNSUPPORTED (a backend without pinned copies). */
int ft_exec_init_ckpt_host(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                           int64_t T_max, int64_t n_micro, int64_t rope_seq_len, int place_layers,
                           int64_t dev_layers, int n_sets);
int ft_exec_ckpt_to_host(ft_exec *e, int64_t dev_layers, int n_sets);

/* As ft_exec_use_pack; on a host-memory backend, resident = 1 reads every layer block once
 * into host memory (the "everything resident" tier) and each fetch dequantizes from there,
 * resident = 0 streams: every layer visit reads the block from the file (io_uring + O_DIRECT
 * where possible, offload/uring.h). Both give the same bits. Device backends are always
 * resident (in device memory). */
int ft_exec_use_pack_ex(ft_exec *e, ft_pack_file *pack, int resident);

/* Bytes ft_exec_use_pack allocates for this pack. */
size_t ft_exec_pack_bytes(const ft_pack_file *pack);

/* Device memory a run keeps free beyond ft_exec_bytes with every layer resident (the CUDA
 * allocator's slack, cuBLAS workspaces): the trainer's --gpu-mem check and the resident/streamed
 * decision of training and of eval, generate and logits. */
#define FT_EXEC_SPARE_BYTES ((size_t)1 << 30)

/* Bytes ft_exec_init would allocate for these sizes on backend be (for the plan printed
 * before training and the --gpu-mem check): the arena, plus on a device backend the resident
 * copy of the base weights (ft_exec_weight_bytes). */
size_t ft_exec_bytes(const ft_backend *be, const ft_model *m, const ft_lora *lora, int64_t T_max,
                     int64_t n_micro);
/* Device backends: places the pack's layer blocks by tier (tier[l] enum ft_tier; NULL: all
 * in device memory): GPU blocks copied into device memory once, HOST blocks into one pinned
 * host allocation, DISK blocks left in the file; n_slots (2..8) device slots and n_stage
 * (1..8, used only with DISK layers) pinned staging buffers of the largest block carry the
 * streamed ones. Every block is read once here with its checksum verified; streamed reads
 * later skip it. For a pack-only model (no host weights) the global tensors are read from
 * the pack too: final norm and LM head into device memory in row chunks, the embeddings
 * gathered per token on the host from the pack file at each step. Called instead of
 * ft_exec_use_pack (which places everything in device memory). Returns 0, -ENOMEM (naming
 * the memory and bytes), FT_E_INVALID, FT_E_UNSUPPORTED, or a pack read error. */
int ft_exec_use_pack_tiers(ft_exec *e, ft_pack_file *pack, const uint8_t *tier, int n_slots,
                           int n_stage);

/* The planner's probe (device backends, a packed base): times one layer of the pack (layer
 * 0's block, read and copied once) for a micro-batch of T tokens of synthetic activations laid
 * out in sequences as pos/seq_start say (host arrays of T, a real micro-batch's, since the
 * attention cost depends on the sequence lengths; NULL: sequences of 512), on this executor's
 * arena: the NF4 dequantization into bf16, the block's forward, and its backward (LoRA
 * gradients are zeroed afterwards). Seconds, best of two after a warm-up. NF4 projections as
 * e->nf4_fused says. out (may be NULL): 2 T C floats (host), the block's output of the last
 * forward, then the input gradient of the last backward. Call before ft_exec_use_pack_tiers.
 * Returns 0, -ENOMEM, FT_E_INVALID, or a pack or kernel error. */
int ft_exec_probe_layer(ft_exec *e, ft_pack_file *pack, int64_t T, const int32_t *pos,
                        const int32_t *seq_start, double *t_dequant, double *t_fwd, double *t_bwd,
                        float *out);

/* Records the spans of the next operations (train step, eval) into tl until set to NULL:
 * compute per layer visit, H2D copies, disk reads (see offload/timeline.h). Device times come
 * from backend events resolved at the end of each operation. */
void ft_exec_set_timeline(ft_exec *e, struct ft_timeline *tl);

/* Bytes of the global tensors (embeddings, LM head when untied, final norm) in fp32. */
size_t ft_exec_global_bytes(const ft_model *m);
static inline int ft_exec_untied(const ft_model *m)
{
    return m->embed ? m->lm_head != m->embed : !m->cfg.tie_word_embeddings;
}

/* Bytes a device backend holds for a packed base (resident.c): the global tensors in fp32,
 * every layer block of the pack, and one layer's projections in bf16 (the staging; with
 * nf4_fused, none for the projections the fused NF4 GEMM takes). */
size_t ft_exec_packed_weight_bytes(const ft_backend *be, const ft_model *m, const ft_pack_file *pack,
                                   int nf4_fused);
/* The NF4 GEMM mode (kernels.h enum ft_nf4_gemm) for backend be: be->tune.nf4_gemm (the
 * program's FTUNE_NF4_GEMM: dequant | fused | auto; unset or another value: dequant, the
 * default until the fused kernel is measured on a GPU: bench/results/qlora.md);
 * FT_NF4_GEMM_DEQUANT on a host-memory backend or one without FT_W_NF4. */
int ft_exec_nf4_gemm_mode(const ft_backend *be);
/* Bytes of the device copy of the base model's weights on backend be (embeddings counted
 * once when tied; projections in bf16 where the backend takes bf16 weights, else fp32). */
size_t ft_exec_weight_bytes(const ft_backend *be, const ft_model *m);

/* Forward + backward of one optimizer step over n_mb micro-batches. LoRA gradients
 * accumulate into lora->grads (the caller zeroes them per step); the loss is normalised
 * by grad_norm_tokens (the step's total count of targets) so gradients are those of the
 * mean token loss. *loss_sum receives the summed token loss, *n_tokens the target count.
 * dropout_seed != 0 enables LoRA dropout with masks derived from it; e->neftune_alpha > 0
 * NEFTune noise on the embeddings (see the field). */
int ft_exec_train_step(ft_exec *e, const ft_batch *mbs, int64_t n_mb, int64_t grad_norm_tokens,
                       uint64_t dropout_seed, double *loss_sum, int64_t *n_tokens);

/* Forward only (no dropout): summed loss and target count of one micro-batch. */
int ft_exec_eval(ft_exec *e, const ft_batch *mb, double *loss_sum, int64_t *n_tokens);

/* ---- several adapters in one pass over the base (issue 32) ------------------------------
 * A pass trains (or evaluates) K adapters at once: at each layer visit the base weights are
 * fetched once, from whatever tier holds them, and micro-batch i of the pass is the
 * concatenation of micro-batch i of every adapter that has one this step (adapters may have
 * different micro-batch counts), in the order of the steps. The frozen projections, norms,
 * RoPE and SwiGLU run over all its rows, attention per adapter's rows, and each adapter's LoRA
 * path (rank, scale, dropout, targets, frozen correction) on its own rows only
 * (src/model/llama.h ft_block_seg); the LM head + cross-entropy runs per adapter's rows with
 * its own gradient normalization. The frozen projections run one GEMM per adapter's rows by
 * default (each adapter's bits), or one over all rows (ft_exec.concat_gemms). So weight
 * traffic (layer_fetches, pack_reads) is that of one adapter whatever K, while activations
 * and checkpoints grow with K. */

/* One adapter's share of a multi-adapter step. */
typedef struct ft_exec_adapter_step {
    ft_lora *lora;              /* its adapter (rank <= the executor's r_max); LoRA gradients
                                 * accumulate into lora->grads (the caller zeroes them). Eval:
                                 * may be NULL (the base model) */
    const ft_batch *mbs;        /* its micro-batches this step, each of <= adapter_T_max tokens,
                                 * whole sequences (ft_pack's) */
    int64_t n_mb;               /* 1 .. n_micro_max (eval: 1) */
    int64_t grad_norm_tokens;   /* its step's target count: its gradients are those of its mean
                                 * token loss (ft_exec_train_step's normalization) */
    uint64_t dropout_seed;      /* LoRA dropout masks (0: none), as ft_exec_train_step's */
    double neftune_alpha;       /* NEFTune on its embeddings (0: off), as the ft_exec fields */
    uint64_t neftune_seed;
    double *loss_sum;           /* out (may be NULL): its summed token loss */
    int64_t *n_tokens;          /* out (may be NULL): its target count */
} ft_exec_adapter_step;

/* Plans and allocates an executor for passes of up to n_adapters adapters, each with up to
 * n_micro micro-batches of up to T_max tokens per step and LoRA ranks up to r_max (1..4096).
 * n_sets = 0 keeps the layer-input checkpoints in the arena; 2..4 puts them in pinned host
 * memory with dev_layers layers kept on the device (ft_exec_init_ckpt_host). e->lora is NULL:
 * the adapters come with each step. ft_exec_use_pack(_ex, _tiers) and
 * ft_exec_keep_activations apply as to any executor (kept activations: for all adapters).
 * Returns as ft_exec_init_ckpt_host (FT_E_INVALID for bad counts). */
int ft_exec_init_multi(ft_exec *e, ft_backend *be, const ft_model *m, int64_t n_adapters,
                       int64_t r_max, int64_t T_max, int64_t n_micro, int64_t rope_seq_len,
                       int place_layers, int64_t dev_layers, int n_sets);

/* Bytes ft_exec_init_multi would allocate (its arena with every checkpoint in it, plus the
 * device copy of the base on a device backend without a pack: as ft_exec_bytes). For
 * n_adapters = 1 and r_max = the adapter's rank this is ft_exec_bytes. */
size_t ft_exec_bytes_multi(const ft_backend *be, const ft_model *m, int64_t n_adapters,
                           int64_t r_max, int64_t T_max, int64_t n_micro);
/* Bytes per adapter a pass holds: ft_exec_bytes_multi(K + 1) - ft_exec_bytes_multi(K), the
 * same for every K >= 1 to within 64 bytes per region of the arena (each region is rounded up
 * to 64 bytes), and its parts: checkpoints (every layer input and the final hidden state of
 * every micro-batch, (L + 1) n_micro T_max C floats), per micro-batch buffers (dx and the
 * token arrays), and the one-micro-batch working set (block activations and scratch, final
 * norm buffers). Neither the base weights nor the LM-head scratch grow with K. Kept
 * activations (ft_exec_keep_activations) add kept per adapter; LoRA state (ft_lora_bytes)
 * comes on top. */
typedef struct ft_exec_adapter_sizes {
    size_t total, ckpt, per_micro, work, kept;
} ft_exec_adapter_sizes;
void ft_exec_adapter_bytes(const ft_model *m, int64_t r_max, int64_t T_max, int64_t n_micro,
                           ft_exec_adapter_sizes *out);

/* Forward + backward of one optimizer step of K adapters (1 <= K <= e->n_adapters, distinct
 * adapters) in one pass: for each adapter, the losses, target counts and LoRA gradients of
 * ft_exec_train_step on its own micro-batches, normalization, dropout seed and NEFTune: its
 * bits (tests/unit/test_exec_multi.c), or with e->concat_gemms = 1 those up to the rounding
 * of one frozen GEMM over the concatenated rows (see the field). Returns 0,
 * FT_E_RANGE (too many adapters or micro-batches, a micro-batch over adapter_T_max),
 * FT_E_INVALID (no adapter, an adapter in two steps, a rank above r_max), or what the ops
 * return; the checks come before any work. */
int ft_exec_train_step_multi(ft_exec *e, const ft_exec_adapter_step *steps, int64_t K);

/* Forward only (no dropout, no noise) of K adapters' micro-batches (n_mb = 1 each; the same
 * micro-batch may serve them all) in one pass: each step's summed loss and target count, as
 * ft_exec_eval with that adapter (NULL: the base). Returns as ft_exec_train_step_multi. */
int ft_exec_eval_multi(ft_exec *e, const ft_exec_adapter_step *steps, int64_t K);

/* ---- sequence-level objectives over preference pairs (DPO, src/train/dpo.h) ------------
 * A preference micro-batch (ft_pack_pairs) has 2 * n_pairs sequences: pair k's chosen
 * example is sequence 2k, its rejected one 2k+1 (ft_batch.pairs). nll[s] is the summed token
 * loss (-log p of each target, nats, double) of sequence s and n_tok[s] its target count.
 * The objective's gradient is given per sequence: d objective / d nll[s]. */

/* Called once per micro-batch mb (0-based within the step) after its forward: reads
 * nll/n_tok (2 * b->n_pairs each) and writes scale[s] = d objective / d nll[s]. A non-zero
 * return stops the step with that error. */
typedef int (*ft_exec_seq_grad_fn)(void *user, int64_t mb, const ft_batch *b, const double *nll,
                                   const int64_t *n_tok, double *scale);

/* Forward + backward of one optimizer step over n_mb preference micro-batches (n_pairs >= 1
 * each), one adapter (e->lora; FT_E_UNSUPPORTED on an executor of several adapters per pass,
 * ft_exec_init_multi: sequence objectives train one adapter at a time): after the forward,
 * the LM head gives each sequence's nll and the gradient of its token losses, fn turns the
 * nlls into per-sequence scales, and the backward runs with d(final hidden) = sum over
 * sequences of scale[s] * d nll[s] / d hidden. LoRA gradients
 * accumulate as in ft_exec_train_step (dropout, NEFTune alike). Returns 0, fn's error,
 * FT_E_INVALID (a micro-batch without pairs), or what the ops return. */
int ft_exec_train_step_seq(ft_exec *e, const ft_batch *mbs, int64_t n_mb, ft_exec_seq_grad_fn fn,
                           void *user, uint64_t dropout_seed);

/* Forward only (no dropout, no noise): nll and n_tok (2 * mb->n_pairs each) of every
 * sequence of one preference micro-batch. */
int ft_exec_eval_seq(ft_exec *e, const ft_batch *mb, double *nll, int64_t *n_tok);

/* Forward only (no dropout, no noise), then the LM head + cross-entropy of each span of one
 * micro-batch on its own rows: span s is rows [spans[2s], spans[2s] + spans[2s + 1]) (its
 * first token as a flat offset, its length >= 1; host array (n_spans, 2)), typically one
 * packed example each (ft_batch.ex_index). nll[s] receives its summed token loss (-log p of
 * each target, nats, double) and n_tok[s] its target count (host arrays of n_spans). The
 * op is the one of ft_exec_eval's head (lm_head_ce, rows chunked by ce_chunk into the
 * executor's scratch: nothing is allocated), on a span's rows instead of the micro-batch's,
 * so where the spans tile the micro-batch their nll add up to ft_exec_eval's loss_sum up to
 * rounding: the head's GEMM over another row count may round a row's fp32 logits otherwise
 * (OpenBLAS: up to 7e-10 relative on a micro-batch's sum, test_exec.c), and the double sums
 * run in another order; a span that is the whole micro-batch gives its bits. loss_sum
 * and n_tokens (either may be NULL): also ft_exec_eval's head over the whole micro-batch,
 * from the same forward (the same bits as ft_exec_eval). Returns 0, FT_E_INVALID (a span
 * outside the micro-batch, n_spans < 0, NULL arrays), or what the ops return. */
int ft_exec_eval_spans(ft_exec *e, const ft_batch *mb, const int64_t *spans, int64_t n_spans,
                       double *nll, int64_t *n_tok, double *loss_sum, int64_t *n_tokens);

/* Forward only: logits (T, V) of one micro-batch into host memory `logits`. */
int ft_exec_logits(ft_exec *e, const ft_batch *mb, float *logits);

/* The weights of an executor, as generation reads them (src/infer/generate.h
 * ft_gen_init_source): each layer fetched per visit as a training forward fetches it (placed
 * weights: the model's on the host, bf16 copies on a device; over a pack (ft_exec_use_pack,
 * _ex, _tiers): the block dequantized to fp32 on the host, on a device bound in its tier with
 * NF4 dequantized to bf16 or fused), the globals the executor placed. On the host, a visit of
 * at most 8 tokens (a decode step) over an NF4 pack hands the projections to linear_fwd as
 * stored, which the CPU reads in place (kernels/cpu/nf4_gemv.h: about 4.1 bits per weight
 * instead of a dequantized fp32 copy written and read back), equal to the dequantized product
 * up to fp32 rounding; visits of more than 8 tokens (a prefill of a longer prompt) dequantize
 * as training does, so their logits are ft_exec_logits' bit for bit; an untied pack-only
 * model on a device gathers its embedding rows from the pack (e->T_max at a time). A
 * pack-only model on the host (globals_lazy) is read in bf16 as the pack stores it: the
 * embedding rows widened (exact), and the LM head through the source's head(): for at most
 * FT_LM_HEAD_BF16_ROWS logit rows lm_head_logits_bf16, bit for bit lm_head_logits on the fp32
 * table at half the bytes; for more rows the fp32 table, read from the pack at the first such
 * head (ft_exec_globals_f32), so every logit is the one the fp32 table gives. FTUNE_GEN_HEAD=f32
 * in the environment (tests) keeps the fp32 tables from the start, as before. None of the
 * executor's activation memory is used, so an executor of a small T_max serves forwards of
 * any length. s keeps e by pointer. Returns 0, or FT_E_INVALID when e has neither placed
 * weights nor a pack. */
int ft_exec_gen_source(ft_exec *e, ft_gen_source *s);

#endif
