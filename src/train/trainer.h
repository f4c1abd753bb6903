/* trainer.h - one training run: model + data -> LoRA adapter (the tool's main job).
 *
 * ft_train_run loads the model and tokenizer, reads and packs the data, plans the
 * executor's memory (one allocation), initialises the adapter as PEFT does, then runs
 * optimizer steps (gradient accumulation over micro-batches, global gradient-norm clipping
 * as torch.nn.utils.clip_grad_norm_, AdamW, warmup + schedule), evaluates on the held-out
 * examples (split off the data, or cfg->eval_data), writes metrics JSONL, the PEFT adapter
 * and a summary JSON under cfg->out (its "data", like the run config's info.data: the
 * training file's name, or with several files an array of their names in order).
 * Progress is reported through a callback; the library prints nothing.
 *
 * Reliability (checkpoint.h):
 *   - checkpoints OUT/checkpoint-<step>/ every save_every steps, at the end and when
 *     stopped, the last `keep` kept; cfg->resume continues a run from one so that the
 *     final adapter is bit-identical to that of an uninterrupted run (same seed; any
 *     --threads, the CPU ops being thread-count independent, kernels.h). The run config
 *     (every setting that changes the trajectory: sequence length, batch, grad-accum,
 *     schedule length and warmup, optimizer and LoRA settings, seed, the tokenized data)
 *     must match the checkpoint's, else FT_E_INVALID lists the differences. The examples
 *     of cfg->eval_data are not part of it (eval changes no training state): that file
 *     may change on resume (or be added to a run of --eval-fraction 0, whose training is
 *     the same), while changed cfg->data is refused (another file's content, a file added,
 *     removed or moved in the list; the file names may change), naming --data.
 *   - cfg->stop: set asynchronously (a signal handler in cli/); checked between steps: the
 *     trainer finishes the step (and its scheduled mid-run eval, so that the metrics of
 *     the resumed run match; the final eval is left to the resumed run), saves a
 *     checkpoint and returns 0 with res->stopped = 1.
 *   - the best-so-far eval loss, its step and the early-stopping counter are part of the
 *     checkpoint state, so a resumed run keeps the best and stops where an uninterrupted
 *     one does; OUT/best is rewritten only by a new best (the trajectory is the same).
 *   - a step whose loss or gradient norm is not finite is skipped (gradients zeroed, no
 *     AdamW update, the schedule still advances), reported as FT_EV_WARN and counted in
 *     metrics.jsonl / summary.json ("bad_steps"); max_bad_steps consecutive ones stop the
 *     run with FT_E_NUMERIC.
 */
#ifndef FT_TRAINER_H
#define FT_TRAINER_H

#include <signal.h>
#include <stdint.h>

#include "src/comm/comm.h"
#include "src/model/lora.h"
#include "src/data/dataset.h"
#include "src/train/dpo.h"

#define FT_TRAIN_QUANT_AUTO 0

/* Test hooks (fault injection for the tests; cli/cmd_train.c reads them from the environment,
 * FTUNE_TEST_STOP_HOLD_MS and FTUNE_TEST_INF_EMBEDDING, since library code reads none). */
typedef struct ft_train_test_hooks {
    int64_t stop_hold_ms;       /* > 0: a run stopped through cfg->stop waits this long before its
                                 * stop checkpoint, so that a test's second signal lands while
                                 * the process still runs (on a tiny model the save and exit take
                                 * a few ms, less than a loaded test runner's reaction) */
    int64_t inf_embedding;      /* >= 0: the input embedding row of this token id is set to +Inf
                                 * once the weights are read, so that the micro-batches holding
                                 * it give non-finite losses and gradients (the skipped-step
                                 * path) while the others train; a model file cannot carry such
                                 * a row (the loaders refuse non-finite weights). Only an untied
                                 * model read into memory (FT_E_INVALID otherwise). -1: off */
    int64_t kill_at_step;       /* > 0: the process of rank kill_rank sends itself kill_signal
                                 * (0: SIGKILL; SIGSTOP: a rank that hangs) as optimizer step
                                 * kill_at_step begins, for the data-parallel tests; 0: off */
    int kill_rank, kill_signal;
} ft_train_test_hooks;

/* What the adapter is trained on: the token loss of instruction data (supervised fine-tuning),
 * or preference pairs by Direct Preference Optimization (src/train/dpo.h, dpo_run.h). */
enum ft_train_method { FT_TRAIN_METHOD_SFT = 0, FT_TRAIN_METHOD_DPO };

typedef struct ft_train_cfg {
    const char *model;          /* folder or .gguf */
    const char *const *data;    /* (n_data) training files, JSON/JSONL, read in this order
                                 * (ft_dataset_load_files: each its own schema, examples
                                 * concatenated, then shuffled and split as one) */
    int64_t n_data;
    const char *eval_data;      /* held-out examples from this JSON/JSONL file (the schema,
                                 * template, mask and truncation rules of data): the first
                                 * data_cfg.eval_max of it in file order (all of it is
                                 * read and checked); every example of
                                 * data then trains (data_cfg.eval_fraction is ignored).
                                 * NULL: eval_fraction of data is split off */
    const char *out;            /* output folder */
    const char *init_adapter;   /* PEFT folder to start from, or NULL */
    const char *base_model_id;  /* the base's Hugging Face id for adapter_config.json's
                                 * base_model_name_or_path, or NULL: inferred
                                 * (ft_peft_base_name) */
    int64_t seq_len;            /* 0: min(2048, max_position_embeddings) */
    int64_t batch_size;         /* rows per micro-batch */
    int64_t grad_accum;         /* micro-batches per optimizer step; 0: the offload planner
                                 * picks (a packed base on a device), else 1 */
    int64_t max_steps;          /* > 0 overrides epochs */
    double epochs;
    double lr, min_lr_ratio, weight_decay, adam_beta1, adam_beta2, adam_eps, max_grad_norm;
    double loraplus_lr_ratio;   /* LoRA+ (Hayou, Ghosh, Yu 2024, arXiv 2402.12354): every B
                                 * is updated at lr(t) * ratio, every A at lr(t); the weight
                                 * decay coefficient is the same for both (as PEFT's
                                 * create_loraplus_optimizer). 0: off (one lr for all) */
    int balance_steps;          /* 1: each epoch's micro-batches reordered so that every optimizer
                                 * step's are of similar cost (src/data/dataset.h
                                 * ft_batch_group_by_cost, groups of grad_accum x ranks), so
                                 * data-parallel ranks reach the all-reduce together; the same
                                 * order at any rank count with the same global batch. 0: the
                                 * packer's shuffled order */
    double neftune_noise_alpha; /* NEFTune (Jain et al. 2023, arXiv 2310.05914; TRL's
                                 * neftune_noise_alpha): while training, the embeddings get
                                 * uniform noise of magnitude alpha / sqrt(seq_len *
                                 * hidden_size), drawn from (seed, step, micro-batch) so a
                                 * resumed run is bit-identical; never in eval. 0: off */
    int method;                 /* enum ft_train_method. DPO: the data are preference records
                                 * (data_cfg.preference is set from it), batch_size counts
                                 * pairs (a micro-batch holds up to 2 * batch_size * seq_len
                                 * tokens), the loss and eval loss are dpo's mean over pairs,
                                 * the reference is the starting model (dpo_run.h) */
    ft_dpo_cfg dpo;             /* with FT_TRAIN_METHOD_DPO: loss type, beta (0.1), label smoothing */
    int schedule;               /* enum ft_sched */
    int64_t warmup_steps;       /* used when > 0, else warmup_ratio * total */
    double warmup_ratio;
    ft_lora_cfg lora;
    ft_data_cfg data_cfg;       /* format, template, masks, eval split, seed (seq_len filled) */
    int64_t eval_every;         /* steps; 0: only at start and end */
    int64_t eval_max_batches;   /* cap per evaluation (0: all) */
    const char *eval_prompts;   /* JSONL/JSON prompts file (the prompt schemas of `ftune
                                 * generate --prompts`, at most FT_EVAL_SAMPLES_MAX records):
                                 * greedy replies at every evaluation into OUT/samples.jsonl
                                 * (eval_samples.h), or NULL: none */
    int64_t eval_max_new_tokens; /* new tokens per sample reply (default 128) */
    int threads;
    const char *device;         /* "cpu", "cuda", "cuda:N", "auto" or NULL (= auto) */
    int64_t gpu_mem;            /* bytes of GPU memory the run may use (0: what is free) */
    int64_t host_mem;           /* bytes of host memory for the offload tiers' pinned pool and
                                 * staging (0: available memory less 4 GiB); layers beyond it
                                 * are read from the pack file on NVMe at each visit */
    const char *tensorboard;    /* if set: the metrics also go to TensorBoard event files in
                                 * this folder (ft_metrics_tensorboard) */
    const char *timeline;       /* if set: the second step's timeline (compute, copies, disk
                                 * reads per layer) is drawn into this SVG file */
    int plan_only;              /* 1: load, measure and print the plan, then return (ftune plan) */
    int profile;                /* time every op on the GPU after the first step; the table is
                                 * reported (FT_EV_INFO) at the end */
    unsigned cuda_fused;        /* FT_CUDA_FUSED_* bits (--cuda-fused): the CUDA backend's fused
                                 * kernels to use (kernels.h ft_backend_cuda_set_fused); 0: none */
    int quant;                  /* the frozen base's linear weights: FT_TRAIN_QUANT_AUTO, or
                                 * enum ft_pack_quant (offload/pack.h): FT_PACK_QUANT_NF4 = QLoRA,
                                 * bitsandbytes NF4 with double quantization, read per layer
                                 * from a pack file and dequantized at each fetch;
                                 * FT_PACK_QUANT_BF16 = the weights as loaded (bf16 on the GPU,
                                 * fp32 on the CPU). Auto: bf16, or nf4 when a device backend's
                                 * budget cannot hold the bf16 base. */
    const char *cache_dir;      /* where nf4 packs are kept (the program gives its default,
                                 * cli/env.c ft_env_pack_cache_dir; NULL: none, an error when a
                                 * pack is needed) */
    ft_backend_tune tune;       /* the backend's kernel and placement choices (kernels.h) */
    int quant_correction;       /* enum ft_qcorr_mode (adapters/qcorr.h): with an NF4 base, a
                                 * frozen rank-r correction of its error added to the base
                                 * (calibrated on the first training micro-batches, or from the
                                 * weights alone), written to OUT/quant_correction; nothing to
                                 * do with a bf16 base. FT_QCORR_NONE (0) by default */
    int64_t quant_correction_tokens; /* calibration tokens (default 4096) */
    uint64_t seed;
    const char *resume;         /* checkpoint folder to continue from, or NULL: fresh run */
    int64_t save_every;         /* checkpoint every N steps (0: only at the end / on stop) */
    int64_t keep;               /* checkpoints kept in out (0: all) */
    int64_t max_bad_steps;      /* consecutive non-finite steps that stop the run (>= 1) */
    /* The best adapter by eval loss and early stopping, after transformers' Trainer with
     * metric_for_best_model="eval_loss" (_determine_best_metric: a new best is an eval loss
     * strictly below the best so far, no threshold) and EarlyStoppingCallback
     * (check_metric_value: an eval "improves" when it is below the best before it by more
     * than early_stopping_threshold; early_stopping_patience such evals in a row without
     * improvement stop training). Candidates are the mid-run evals (eval_every) and the
     * final one; the step-0 eval of the initial adapter is none, as transformers' eval_on_start
     * never sets best_metric. They change when training ends, not the steps taken: like the
     * eval flags, they may change on resume (not part of the run config). */
    int save_best;              /* write each new best's adapter to OUT/best/ (needs eval) */
    int64_t early_stopping_patience; /* 0: off; needs an eval split and eval_every > 0 */
    double early_stopping_threshold; /* >= 0, in eval-loss units (nats per token) */
    volatile sig_atomic_t *stop;/* if non-NULL and non-zero: stop after the current step */
    ft_train_test_hooks test;   /* off in ft_train_defaults */
    /* Data-parallel training (src/train/dist.h): the ranks this run is one of (NULL: a single
     * process). grad_accum is then per rank: a step takes size x grad_accum micro-batches. */
    const ft_comm *comm;
    double bus_gbps;            /* ftune plan over several ranks: the all-reduce's bus bandwidth
                                 * in GB/s as nccl-tests reports it (busbw), stated by the user;
                                 * 0: the all-reduce's bytes only */
} ft_train_cfg;

/* Fills the defaults a user expects (r 16, alpha 32, all linear targets, lr 2e-4, one epoch,
 * batch 1, grad-accum 1, cosine with 3% warmup, clip 1.0, AdamW (0.9, 0.999, 1e-8), wd 0;
 * a checkpoint every 200 steps, 2 kept, stop after 5 consecutive non-finite steps; test
 * hooks off). */
void ft_train_defaults(ft_train_cfg *c);

/* FT_EV_WARN: a recoverable problem (a skipped step), text = one line.
 * FT_EV_CKPT: a checkpoint was written, text = its folder, step = its step. */
enum ft_train_event_kind { FT_EV_INFO = 0, FT_EV_PLAN, FT_EV_STEP, FT_EV_EVAL, FT_EV_DONE,
                           FT_EV_WARN, FT_EV_CKPT };

typedef struct ft_train_event {
    int kind;
    const char *text;           /* FT_EV_INFO/PLAN/DONE/WARN: one line; FT_EV_CKPT: folder */
    int64_t step, total_steps;
    double loss, lr, grad_norm, tokens_per_s, elapsed_s, eta_s;
    int64_t tokens;             /* cumulative trained target tokens */
    double eval_loss;
    int pref;                   /* 1: a DPO step or eval: the reward metrics below are set */
    double reward_accuracy;     /* fraction of pairs whose chosen reward beats the rejected */
    double reward_margin;       /* mean reward_chosen - reward_rejected */
} ft_train_event;

typedef void (*ft_train_cb)(const ft_train_event *ev, void *user);

typedef struct ft_train_result {
    double initial_eval_loss, final_eval_loss, final_train_loss;
    double final_eval_reward_accuracy; /* DPO with eval: the final eval's (NAN otherwise) */
    int64_t steps;              /* optimizer steps done (of total_steps) */
    int64_t total_steps;        /* the schedule's length (0 if training did not start) */
    int64_t tokens;             /* token positions processed (input tokens, no padding) */
    int64_t trained_tokens;     /* positions with a loss target */
    int64_t n_train, n_eval, n_skipped, n_truncated, n_dropped;
    double time_s, tokens_per_s;
    int64_t layer_fetches;      /* executor base-weight fetches */
    int64_t bad_steps;          /* steps skipped for a non-finite loss / gradient norm */
    double qcorr_reduction;     /* --quant-correction: relative error removed (0..1) */
    int64_t qcorr_tokens;       /* its calibration tokens */
    int64_t resumed_from;       /* step the run resumed from (0: fresh start) */
    int stopped;                /* 1: stopped through cfg->stop before completing */
    int early_stopped;          /* 1: ended by early stopping (a complete run: adapter and
                                 * summary written; steps < total_steps) */
    double best_eval_loss;      /* NAN if no candidate eval had a finite loss */
    int64_t best_eval_step;     /* 0 if none */
    int quant;                  /* the base's quantization used (enum ft_pack_quant); 0 if
                                 * training did not get that far */
    int64_t base_layers[3];     /* a packed base on a device, as the offload planner placed
                                 * it: layers on the GPU, in pinned host memory, read from the
                                 * pack file (enum ft_tier order); all -1 otherwise */
    char checkpoint[4200];      /* the last checkpoint written or resumed from ("" if none);
                                 * set on error too, for the resume hint */
} ft_train_result;

/* Runs training. Returns 0 (completed, or res->stopped) or the first error (message names
 * file and position). No adapter is written to cfg->out unless training completes. */
int ft_train_run(const ft_train_cfg *cfg, ft_train_cb cb, void *user, ft_train_result *res);

#endif
