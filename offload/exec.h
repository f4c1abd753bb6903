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
 * All memory is allocated in ft_exec_open (one backend allocation); steps allocate nothing.
 */
#ifndef FT_EXEC_H
#define FT_EXEC_H

#include <stdint.h>

#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "offload/pack.h"
#include "src/data/dataset.h"
#include "offload/weight_source.h"
#include "src/model/llama.h"
#include "src/model/model.h"

struct ft_timeline;
struct ft_tl_mark;
struct ft_disk_prefetch;
struct ft_actckpt;

/* The executor (its state: offload/exec_impl.h, private to offload/; tests may read it). Made
 * by ft_exec_open, or by the runtime session (offload/session.h ft_session_place). */
typedef struct ft_exec ft_exec;

/* What ft_exec_open plans for: zero fields take the defaults named. */
typedef struct ft_exec_cfg {
    ft_lora *lora;              /* the adapter of every step; NULL: the base alone (eval and
                                 * logits of the base), or with n_adapters > 0 each step names
                                 * its adapters (ft_exec_train_step_multi) */
    int64_t T_max;              /* tokens per micro-batch (rows * seq_len), >= 1 */
    int64_t n_micro;            /* micro-batches per optimizer step (0: 1) */
    int64_t rope_seq_len;       /* for ft_rope_inv_freq (dynamic scaling); 0: T_max */
    int defer_layers;           /* 1: the layers' weights are left out of a device backend's
                                 * copy (the caller follows with ft_exec_use_pack*), so a packed
                                 * base never has a full copy of the layers in device memory */
    int ckpt_sets;              /* 0: layer-input checkpoints in the arena; 2..4: in pinned
                                 * host memory through that many device sets (ft_exec_ckpt_to_host) */
    int64_t ckpt_dev_layers;    /* with ckpt_sets: the last layers whose inputs stay on the device */
    int64_t n_adapters;         /* > 0: passes of up to n_adapters adapters (lora NULL) */
    int64_t r_max;              /* with n_adapters: the largest LoRA rank (1..4096) */
} ft_exec_cfg;

/* Plans and allocates an executor on backend be for model m (both must outlive it) into *out:
 * the arena of every buffer a step uses (one backend allocation), and on a device backend the
 * copy of the base weights (unless cfg->defer_layers). Returns 0, -ENOMEM (the message gives
 * the bytes asked for), FT_E_INVALID (bad sizes or counts), FT_E_UNSUPPORTED (host checkpoints
 * on a backend without pinned copies); on an error *out is NULL. */
int ft_exec_open(ft_exec **out, ft_backend *be, const ft_model *m, const ft_exec_cfg *cfg);
/* Frees everything e holds and e itself (NULL-safe). */
void ft_exec_close(ft_exec *e);

/* What an executor holds and has done (accessors for code outside offload/). */
typedef struct ft_exec_info {
    int64_t T_max, n_micro_max;     /* its sizes */
    size_t arena_bytes;             /* the one backend allocation of its buffers */
    size_t weights_bytes;           /* the device copy of the base (0: the model's own arrays) */
    size_t kept_bytes;              /* kept forward activations (ft_exec_keep_activations) */
    int kept;                       /* 1: the backward reuses kept activations (no recompute) */
    int nf4_fused;                  /* 1: NF4 projections go to the dequant-fused GEMM */
    int on_device;                  /* 1: its base and buffers are in device memory; 0: host
                                     * memory, the model's arrays used in place */
    int64_t layer_fetches;          /* base-weight fetches since it was made */
    int64_t pack_reads;             /* layer blocks read from the pack */
    uint64_t h2d_bytes, disk_bytes; /* streamed host-to-device and from disk since made */
    double disk_seconds;            /* seconds the disk was busy with streamed blocks */
} ft_exec_info;
void ft_exec_get_info(const ft_exec *e, ft_exec_info *out);
/* The adapter e runs (may be NULL), and a swap: points e at l (NULL: the base model alone)
 * and returns the one it ran before. l must have e's adapter's shapes (a rank within the
 * activations e was sized for). */
ft_lora *ft_exec_adapter(const ft_exec *e);
ft_lora *ft_exec_set_adapter(ft_exec *e, ft_lora *l);
/* NEFTune (Jain et al. 2023, arXiv 2310.05914) of ft_exec_train_step: alpha > 0 adds uniform
 * noise of magnitude alpha / sqrt(seq_len * hidden_size) to the embeddings of every
 * micro-batch, drawn from seed and the micro-batch index; 0 (after open): off. Set before a
 * step; the seed a pure function of the run seed and the step, so a resumed run draws the
 * same noise. */
void ft_exec_set_neftune(ft_exec *e, double alpha, uint64_t seed);
/* Multi-adapter passes: 1 runs one frozen GEMM over all a pass's adapters' rows instead of
 * one per adapter (offload/exec_impl.h concat_gemms says what that rounds otherwise). */
void ft_exec_set_concat_gemms(ft_exec *e, int on);
/* Data-parallel training (src/train/dist.h): mb_base is the index in the optimizer step of
 * this process's first micro-batch, from which its micro-batches' dropout masks and NEFTune
 * noise are drawn (so rank r's micro-batch i gets the masks of the step's micro-batch
 * mb_base + i in one process). 0 after open. Set before a step. */
void ft_exec_set_mb_base(ft_exec *e, int64_t mb_base);


/* Makes the executor take the base model's layer weights (norms, projections, biases) from
 * a pack instead of the model's fp32 arrays. Host-memory backend (CPU): at every layer fetch
 * the block is read (pread, checksum verified) and dequantized to fp32 (NF4 with bitsandbytes
 * arithmetic, nf4.h), so the block math is unchanged and only one layer is ever held in fp32.
 * Device backend (CUDA): every block is read and checksummed once and kept in device memory
 * (4-bit), the layers' copied weights are freed, and each layer visit dequantizes its NF4
 * projections to bf16 in one staging buffer (resident.c). Embeddings, final
 * norm and LM head still come from the model. The pack must describe the same architecture
 * as e's model (FT_E_INVALID otherwise); it stays owned by the caller and must outlive e.
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
 * ft_exec_info.nf4_fused says. out (may be NULL): 2 T C floats (host), the block's output of the last
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
 * FT_NF4_GEMM_DEQUANT on a host-memory backend or one without FT_WTYPE_NF4. */
int ft_exec_nf4_gemm_mode(const ft_backend *be);
/* Bytes of the device copy of the base model's weights on backend be (embeddings counted
 * once when tied; projections in bf16 where the backend takes bf16 weights, else fp32). */
size_t ft_exec_weight_bytes(const ft_backend *be, const ft_model *m);

/* Forward + backward of one optimizer step over n_mb micro-batches. LoRA gradients
 * accumulate into lora->grads (the caller zeroes them per step); the loss is normalised
 * by grad_norm_tokens (the step's total count of targets) so gradients are those of the
 * mean token loss. *loss_sum receives the summed token loss, *n_tokens the target count.
 * dropout_seed != 0 enables LoRA dropout with masks derived from it; a NEFTune alpha > 0
 * (ft_exec_set_neftune) adds its noise to the embeddings. */
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
 * default (each adapter's bits), or one over all rows (ft_exec_set_concat_gemms). So weight
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
    double neftune_alpha;       /* NEFTune on its embeddings (0: off), as ft_exec_set_neftune */
    uint64_t neftune_seed;
    double *loss_sum;           /* out (may be NULL): its summed token loss */
    int64_t *n_tokens;          /* out (may be NULL): its target count */
} ft_exec_adapter_step;

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

/* Forward + backward of one optimizer step of K adapters (1 <= K <= its n_adapters (ft_exec_cfg), distinct
 * adapters) in one pass: for each adapter, the losses, target counts and LoRA gradients of
 * ft_exec_train_step on its own micro-batches, normalization, dropout seed and NEFTune: its
 * bits (tests/unit/test_exec_multi.c), or with ft_exec_set_concat_gemms(e, 1) those up to the rounding
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
 * each), one adapter (ft_exec_adapter; FT_E_UNSUPPORTED on an executor of several adapters per pass,
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

/* The weights of an executor, as generation reads them (offload/weight_source.h; src/infer/
 * generate.h ft_gen_init_source): each layer fetched per visit as a training forward fetches it (placed
 * weights: the model's on the host, bf16 copies on a device; over a pack (ft_exec_use_pack,
 * _ex, _tiers): the block dequantized to fp32 on the host, on a device bound in its tier with
 * NF4 dequantized to bf16 or fused), the globals the executor placed. On the host, a visit of
 * at most 8 tokens (a decode step) over an NF4 pack hands the projections to linear_fwd as
 * stored, which the CPU reads in place (kernels/cpu/nf4_gemv.h: about 4.1 bits per weight
 * instead of a dequantized fp32 copy written and read back), equal to the dequantized product
 * up to fp32 rounding; visits of more than 8 tokens (a prefill of a longer prompt) dequantize
 * as training does, so their logits are ft_exec_logits' bit for bit; an untied pack-only
 * model on a device gathers its embedding rows from the pack (T_max tokens at a time). A
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
