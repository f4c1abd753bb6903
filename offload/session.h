/* session.h - one runtime session: what a run over a base model holds (the model, its
 * tokenizer, the backend, an adapter, the weight pack, the executor) and where the base goes,
 * decided once for training, eval, logits, generation and `bench step`.
 *
 * A session opens in two stages, so that a caller can read its data between them (training
 * sizes its sequences from the model's config and reports a bad data file before a device is
 * opened): ft_session_open_model (the model deferred, no weights read; its tokenizer) and
 * ft_session_open_backend (the backend, then what the forward commands ask for at open: the
 * NF4 pack of --quant nf4, the weights on a host backend, the PEFT adapter with its
 * quantization correction). ft_session_open does both.
 *
 * ft_session_place is the one placement decision, for micro-batches of T tokens:
 *   - the base's quantization (training's --quant auto: bf16, or nf4 when a device backend's
 *     budget cannot hold the bf16 run with every layer resident);
 *   - resident or streamed: a bf16 base not read yet is read when the executor with every
 *     layer resident (offload/exec.h ft_exec_bytes) plus 1 GiB to spare fits what the
 *     device budget leaves (--gpu-mem, else the device's total, less what is in use and the
 *     caller's gpu_reserve), else streamed from its bf16 pack; an NF4 base always comes from
 *     its pack (found or built under cache_dir, offload/pack.h ft_pack_ensure_loaded);
 *   - a packed base on a device: measured, planned and placed by the offload planner
 *     (offload/place.h: tiers, micro-batches, checkpoints), within gpu_mem and host_mem;
 *   - a resident base on a device, training: refused up front (FT_E_RANGE naming the smallest
 *     --gpu-mem) when the run does not fit, and every layer's activations kept for the
 *     backward when they fit too (the spare kept); on the host: the recompute
 *     schedule, the pack read per visit (or held in memory: pack_in_memory).
 * What it decided and measured is reported through the session's note callback (the library
 * prints nothing) and kept in the session (quant, quant_why, n_micro, base_layers).
 */
#ifndef FT_SESSION_H
#define FT_SESSION_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "src/data/dataset.h"
#include "src/model/lora.h"
#include "src/model/model.h"
#include "src/tokenizer/tokenizer.h"

/* The kinds of a note: a status line, a warning (a recoverable problem), a line of the plan. */
enum ft_session_note_kind { FT_SESSION_INFO = 0, FT_SESSION_WARN, FT_SESSION_PLAN };
/* Receives one line (no newline) of what the session did or decided. */
typedef void (*ft_session_note_fn)(void *user, int kind, const char *line);

/* ft_session_cfg.quant: no explicit choice (see there). The other values are enum
 * ft_pack_quant (FT_PACK_QUANT_BF16, FT_PACK_QUANT_NF4). */
#define FT_SESSION_QUANT_AUTO 0

typedef struct ft_session_cfg {
    const char *model;          /* model folder or .gguf file (a path; hub ids resolved) */
    const char *device;         /* "cpu", "cuda", "cuda:N", "cpu-device", "auto" (kernels.h) */
    int threads;                /* CPU threads (0: all) */
    int train;                  /* 1: a training run: training's quantization choice and its
                                 * report (the plan, the probe, the pack's reuse); 0: eval,
                                 * logits, generation */
    int quant;                  /* the base's linear weights. Training: FT_SESSION_QUANT_AUTO
                                 * (bf16, or nf4 when a device cannot hold the bf16 base),
                                 * FT_PACK_QUANT_NF4 (QLoRA) or FT_PACK_QUANT_BF16. Otherwise:
                                 * AUTO and BF16 the model's weights as they are (on a device a
                                 * bf16 base that does not fit is streamed from its bf16 pack;
                                 * BF16 refuses a folder holding only an NF4 pack), NF4 the NF4
                                 * pack at open (the base a QLoRA adapter was trained on) */
    const char *cache_dir;      /* where packs are kept (the program gives its default, cli/env.c
                                 * ft_env_pack_cache_dir; NULL: none, an error when a pack is
                                 * needed) */
    int64_t gpu_mem, host_mem;  /* device backends: the budgets in bytes (--gpu-mem, --host-mem;
                                 * 0: what is free / available memory less 4 GiB) */
    const char *adapter;        /* the forward commands' PEFT adapter folder, or NULL; with an
                                 * NF4 base it gets back its run's quantization correction */
    int tokenizer;              /* 1: open the model's tokenizer too (s->tok) */
    ft_session_note_fn note;    /* may be NULL */
    void *note_user;
    unsigned cuda_fused;        /* FT_CUDA_FUSED_* bits set on a CUDA backend at open (kernels.h
                                 * ft_backend_cuda_set_fused); non-zero on another backend ->
                                 * FT_E_INVALID. 0: none */
    ft_backend_tune tune;       /* copied into the backend at open (kernels.h; zero: defaults) */
} ft_session_cfg;

/* ft_session_place_cfg.hook stages: the quantization is chosen (s->quant; nothing read yet);
 * the base is settled (its weights read, or its pack open in s->pack, or previewed), before
 * the executor is made. */
enum ft_session_stage { FT_SESSION_QUANT_CHOSEN = 1, FT_SESSION_BASE_READY };

struct ft_session;
/* A caller's step inside the placement (training: its --quant-correction checks and set-up);
 * a non-zero return stops the placement with that error. */
typedef int (*ft_session_hook_fn)(void *user, struct ft_session *s, int stage);

typedef struct ft_session_place_cfg {
    int64_t T;                  /* tokens per micro-batch (rows * seq_len) */
    int64_t n_micro;            /* micro-batches per step; 0: the offload planner picks (a packed
                                 * base on a device), else 1 */
    int64_t rope_seq_len;       /* for the executor's RoPE (ft_exec_init); 0: T */
    ft_lora *lora;              /* the adapter the executor runs; NULL: the session's own, if
                                 * any */
    const ft_batch *probe;      /* a real micro-batch of T tokens whose layout (pos, seq_start)
                                 * the planner's probe takes, or NULL */
    int plan_only;              /* training's `ftune plan`: decide and report; read no weights,
                                 * build no pack (a pack not built is previewed), make no
                                 * executor */
    int nf4_weights;            /* read the unquantized weights before an NF4 pack is made (a
                                 * fresh --quant-correction computes from them) */
    ft_session_hook_fn hook;    /* may be NULL */
    void *hook_user;
    /* Several adapters per pass (offload/exec.h ft_exec_init_multi, a sweep): n_adapters >= 1
     * makes an executor for that many, each step naming its adapters (T is one adapter's
     * micro-batch, lora the one the probe runs); k_max >= 1 with n_adapters 0 takes the most
     * that fit, up to k_max: a packed base on a device by the offload planner
     * (ft_plan_max_adapters), else the executor of K adapters (ft_exec_bytes_multi) plus
     * adapter_bytes per adapter within the budget (on the host: --host-mem, else available
     * memory less 4 GiB; on a device the resident rule's). r_max: the largest rank among them;
     * adapter_bytes: each adapter's LoRA state (src/model/lora.h ft_lora_bytes) and share of
     * the working set (ft_exec_adapter_sizes.work). All 0: one adapter (lora). */
    int64_t n_adapters, k_max, r_max;
    uint64_t adapter_bytes;
} ft_session_place_cfg;

typedef struct ft_session {
    ft_session_cfg cfg;
    ft_model *model;
    ft_tokenizer *tok;          /* cfg.tokenizer: the model's tokenizer, else NULL */
    ft_backend *be;
    ft_lora lora;               /* the session's own adapter (cfg.adapter,
                                 * ft_session_set_adapter) */
    int has_lora;
    int qcorr;                  /* 1: that adapter came with its run's quantization correction */
    ft_exec *ex;                /* the executor, made by ft_session_place (valid when has_ex) */
    int has_ex;
    ft_pack_file *pack;         /* the base's pack (NF4, a streamed bf16 base, a pack-only
                                 * folder) */
    ft_pack_preview *preview;   /* training's `ftune plan` of a pack not built yet: its sizes and
                                 * probe (offload/pack.h ft_pack_preview_make) */
    int pack_in_memory;         /* host backends: the pack read whole into memory once
                                 * (generation visits every layer per token) instead of one block
                                 * per layer visit; set before ft_session_place */
    int64_t gpu_mem, host_mem;  /* the budgets (from cfg; callers may change them before placing) */
    int64_t gpu_reserve;        /* device bytes the caller allocates after the placement
                                 * (generation's KV cache and buffers, ft_gen_source_bytes):
                                 * kept out of the budget the base is placed in */
    /* what ft_session_place decided */
    int quant;                  /* enum ft_pack_quant of the base (0 before the placement) */
    char quant_why[256];        /* training: why that quantization ("auto: ...", or "") */
    int64_t n_micro;            /* micro-batches per step the executor was made for */
    int64_t n_adapters;         /* adapters per pass it was made for (1 without the place
                                 * cfg's n_adapters / k_max) */
    int64_t base_layers[3];     /* a packed base on a device: layers on the GPU, in pinned host
                                 * memory, read from the pack file (enum ft_tier); -1 otherwise */
    double plan_step_s;         /* a packed base on a device: the planner's predicted seconds per
                                 * optimizer step (offload/plan.h t_step); 0 otherwise */
} ft_session;

/* The model of c->model, deferred (shapes, no weights: ft_pack_model_load_deferred, so a
 * pack-only folder's pack is checked), and with c->tokenizer its tokenizer. s is zeroed
 * first and keeps a copy of *c (its strings by pointer: they must outlive s). Returns 0 or
 * an error naming the file. */
int ft_session_open_model(ft_session *s, const ft_session_cfg *c);

/* The backend of s->cfg.device, then what the forward commands (cfg.train 0) ask for at
 * open: with cfg.quant NF4 the base handed to its NF4 pack (found or built under cache_dir;
 * "pack: built PATH" noted; FT_E_INVALID for a folder holding only a bf16 pack); on a host
 * backend (or for a pack-only folder) the weights read; the adapter cfg.adapter (none:
 * NULL) loaded, with an NF4 base its run's quantization correction (adapter_dir/
 * quant_correction, or that of the run folder above it, for OUT/best and OUT/checkpoint-N;
 * noted), and with cfg.quant BF16, FT_E_INVALID for a folder holding only an NF4 pack.
 * Returns 0 or an error naming the file. */
int ft_session_open_backend(ft_session *s);

/* ft_session_open_model, then ft_session_open_backend. */
int ft_session_open(ft_session *s, const ft_session_cfg *c);

/* The placement decision (see the top of this file) for micro-batches of pc->T tokens,
 * replacing the executor if there is one. Its lines go to the note callback; s->quant,
 * quant_why, n_micro and base_layers say what was decided; with pc->plan_only no executor is
 * made (s->has_ex 0). Returns 0 or an error: FT_E_INVALID (a --quant a pack-only folder
 * cannot serve; an unknown quantization), FT_E_UNSUPPORTED (NF4 on a backend without NF4
 * kernels, naming the way out), FT_E_RANGE (nothing fits the budgets: the message names the
 * smallest), the model's read errors, the pack's build errors (a deferred base then stays
 * deferred: a later placement decides again), the executor's, or the hook's. */
int ft_session_place(ft_session *s, const ft_session_place_cfg *pc);

/* The forward commands' placement: ft_session_place for one micro-batch of up to T tokens
 * with the session's own adapter. */
int ft_session_plan(ft_session *s, int64_t T);

/* Replaces the session's adapter with the PEFT adapter in adapter_dir (NULL: none, the base
 * model) and re-places for T tokens; an adapter of the same rank and targets is loaded in
 * place instead, keeping the executor (and the base it placed). Returns 0 or an error naming
 * the folder. */
int ft_session_set_adapter(ft_session *s, const char *adapter_dir, int64_t T);

/* Points the executor at adapter l (NULL: the base model alone, as DPO's reference pass
 * reads it) and returns the one it ran before. The executor must exist (ft_session_place) and
 * l must have the shapes it was made for (the same adapter, or none). */
ft_lora *ft_session_swap_adapter(ft_session *s, ft_lora *l);

/* Frees everything the session holds (NULL-safe on a zeroed session); leaves s zeroed. */
void ft_session_close(ft_session *s);

#endif
