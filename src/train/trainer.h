/* trainer.h - one training run: model + data -> LoRA adapter (the tool's main job).
 *
 * ft_train_run loads the model and tokenizer, reads and packs the data, plans the
 * executor's memory (one allocation), initialises the adapter as PEFT does, then runs
 * optimizer steps (gradient accumulation over micro-batches, global gradient-norm clipping
 * as torch.nn.utils.clip_grad_norm_, AdamW, warmup + schedule), evaluates on the held-out
 * split, writes metrics JSONL, the PEFT adapter and a summary JSON under cfg->out.
 * Progress is reported through a callback; the library prints nothing.
 */
#ifndef FT_TRAINER_H
#define FT_TRAINER_H

#include <stdint.h>

#include "adapters/lora.h"
#include "src/data/dataset.h"

typedef struct ft_train_cfg {
    const char *model;          /* folder or .gguf */
    const char *data;           /* JSON/JSONL */
    const char *out;            /* output folder */
    const char *init_adapter;   /* PEFT folder to start from, or NULL */
    int64_t seq_len;            /* 0: min(2048, max_position_embeddings) */
    int64_t batch_size;         /* rows per micro-batch */
    int64_t grad_accum;         /* micro-batches per optimizer step */
    int64_t max_steps;          /* > 0 overrides epochs */
    double epochs;
    double lr, min_lr_ratio, weight_decay, adam_beta1, adam_beta2, adam_eps, max_grad_norm;
    int schedule;               /* enum ft_sched */
    int64_t warmup_steps;       /* used when > 0, else warmup_ratio * total */
    double warmup_ratio;
    ft_lora_cfg lora;
    ft_data_cfg data_cfg;       /* format, template, masks, eval split, seed (seq_len filled) */
    int64_t eval_every;         /* steps; 0: only at start and end */
    int64_t eval_max_batches;   /* cap per evaluation (0: all) */
    int threads;
    uint64_t seed;
} ft_train_cfg;

/* Fills the defaults a user expects (r 16, alpha 32, all linear targets, lr 2e-4, one epoch,
 * batch 1, grad-accum 1, cosine with 3% warmup, clip 1.0, AdamW (0.9, 0.999, 1e-8), wd 0). */
void ft_train_defaults(ft_train_cfg *c);

enum ft_train_event_kind { FT_EV_INFO = 0, FT_EV_PLAN, FT_EV_STEP, FT_EV_EVAL, FT_EV_DONE };

typedef struct ft_train_event {
    int kind;
    const char *text;           /* FT_EV_INFO/PLAN: one line */
    int64_t step, total_steps;
    double loss, lr, grad_norm, tokens_per_s, elapsed_s, eta_s;
    int64_t tokens;             /* cumulative trained target tokens */
    double eval_loss;
} ft_train_event;

typedef void (*ft_train_cb)(const ft_train_event *ev, void *user);

typedef struct ft_train_result {
    double initial_eval_loss, final_eval_loss, final_train_loss;
    int64_t steps;
    int64_t tokens;             /* token positions processed (input tokens, no padding) */
    int64_t trained_tokens;     /* positions with a loss target */
    int64_t n_train, n_eval, n_skipped, n_truncated, n_dropped;
    double time_s, tokens_per_s;
    int64_t layer_fetches;      /* executor base-weight fetches */
} ft_train_result;

/* Runs training. Returns 0 or the first error (message names file and position). No
 * adapter is written unless training completes. */
int ft_train_run(const ft_train_cfg *cfg, ft_train_cb cb, void *user, ft_train_result *res);

#endif
