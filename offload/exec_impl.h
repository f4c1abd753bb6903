/* exec_impl.h - the executor's state and its in-place constructors: private to offload/
 * (exec.c, exec_step.c, resident.c, tiers.c, actckpt.c, place.c, prefetch.c, session.c, ...)
 * and the unit tests. Everything else sees an incomplete struct ft_exec (exec.h) and uses
 * ft_exec_open, ft_exec_close and the accessors there. */
#ifndef FT_EXEC_IMPL_H
#define FT_EXEC_IMPL_H

#include "offload/exec.h"

struct ft_exec {
    ft_backend *be;
    /* The executor's one host-or-device decision, made at init (exec.c init_impl) from its
     * backend, which the rest of the executor reads instead of asking the backend: 1 the base
     * and the buffers live in device memory (weights copied in, packed blocks by tier, copies
     * and events ordered on the lanes); 0 host memory, the model's and the pack's arrays used
     * where they are and work timed as it runs. */
    int on_device;
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
    /* Data-parallel training (src/train/dist.h): the index in the optimizer step of this
     * process's first micro-batch, added to the micro-batch index from which the dropout masks
     * and the NEFTune noise are drawn, so that rank r's micro-batch i gets the masks of the
     * step's micro-batch mb_base + i in a single process. 0 in a single process
     * (ft_exec_set_mb_base). */
    int64_t mb_base;
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
    /* Device tiers: 1 when NF4 projections go to the backend's dequant-fused GEMM (FT_WTYPE_NF4)
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
    struct ft_actckpt *ckt;   /* layer-input checkpoints in host memory (offload/actckpt.c), NULL: on the device */
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
};

/* The in-place constructors behind ft_exec_open (e: caller storage, zeroed by them). */
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

/* As ft_exec_init_ex with the layer-input checkpoints in pinned host memory from the start
 * (exec.h ft_exec_ckpt_to_host: dev_layers, n_sets), so the device never holds every
 * checkpoint. */
int ft_exec_init_ckpt_host(ft_exec *e, ft_backend *be, const ft_model *m, ft_lora *lora,
                           int64_t T_max, int64_t n_micro, int64_t rope_seq_len, int place_layers,
                           int64_t dev_layers, int n_sets);

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

#endif
