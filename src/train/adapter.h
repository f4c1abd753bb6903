/* adapter.h - everything that belongs to one adapter being trained: its LoRA parameters and
 * AdamW moments (src/model/lora.h), its optimizer settings, schedule and clip (optim.h), its
 * checkpoint state (checkpoint.h ft_ckpt_state: step, AdamW count, data position, bad-step
 * counts, best eval loss and early stopping), its metrics writer, out folder and run config,
 * its DPO reference, and its result.
 *
 * A run holds its adapters side by side over one session and one data set (trainer.c, loop.c):
 * each step is one pass of the base over the step's micro-batches, then each adapter's
 * operations (ft_train_adapter_update, ft_train_adapter_after_step). ft_train_run trains one
 * adapter; a sweep (sweep_run.h) trains several in one pass over the base, each with its own
 * cfg, step, data position and packing (own_b), sharing the session and the examples.
 */
#ifndef FT_TRAIN_ADAPTER_H
#define FT_TRAIN_ADAPTER_H

#include <stdint.h>

#include "offload/session.h"
#include "src/model/lora.h"
#include "src/train/checkpoint.h"
#include "src/train/dpo_run.h"
#include "src/train/eval_samples.h"
#include "src/train/events.h"
#include "src/train/metrics.h"
#include "src/train/optim.h"
#include "src/train/train_data.h"
#include "src/train/trainer.h"

typedef struct ft_train_adapter {
    const ft_train_cfg *cfg;    /* its settings: LoRA, optimizer, schedule, seed, out folder,
                                 * eval and checkpoint flags (the run's shared ones, model,
                                 * data, seq_len, batch, grad-accum and device, are its run's) */
    ft_lora_cfg lc;             /* the LoRA it was made with (--init-adapter's shapes, if any) */
    ft_lora lora;               /* parameters, gradients, AdamW moments */
    int lora_ok;
    ft_optim opt;
    ft_ckpt_state st;           /* what its checkpoints keep */
    ft_metrics met;             /* OUT/metrics.jsonl */
    ft_eval_samples samples;    /* --eval-prompts: OUT/samples.jsonl (eval_samples.h) */
    char *cfg_json;             /* the run config (run_config.h) stored in its checkpoints */
    const char *base_name;      /* adapter_config.json's base_model_name_or_path (the run's) */
    double *ref_train, *ref_eval; /* DPO: reference nlls by pair (dpo_run.h), 2 per pair */
    double eval_reward_accuracy;  /* DPO: the last evaluation's (NAN before one) */
    ft_train_result *res;       /* its result */
    /* this session of the run (a resumed run is a new session) */
    int64_t start;              /* the step it started from */
    int64_t saved_step;         /* the last step it checkpointed (-1: none yet) */
    int64_t positions0;         /* st.positions at the start */
    double base_s;              /* run time of earlier sessions (st.elapsed_s at the start) */
    int early;                  /* 1: early stopping ended it */
    int pruned;                 /* 1: a sweep's pruning ended it after its last eval */
    int failed;                 /* a multi-adapter job: its own step failed with this error
                                 * (error: the message); it takes no more steps */
    char error[512];
    /* a multi-adapter job (train_run.h): its own training micro-batches of epoch own_epoch
     * (ft_train_data_pack with its cfg) and where its events go (sink.cb NULL: the job's) */
    ft_batch *own_b;
    int64_t n_own_b, own_epoch;
    ft_train_sink sink;
    /* a multi-adapter job's evaluation done in a pass shared with other adapters (loop.c):
     * pre_eval 1 while pre_loss / pre_tokens wait for ft_train_eval_log to log them */
    int pre_eval;
    double pre_loss;
    int64_t pre_tokens;
} ft_train_adapter;

/* The adapter of cfg c on session s (backend open): its LoRA from c->lora (rank, alpha,
 * rsLoRA and targets of c->init_adapter when given, whose weights are loaded unless the run
 * resumes, where the checkpoint's replace them; DPO loads them anyway: its reference is the
 * starting adapter), the seed c->seed. res is where its result goes. Returns 0 or an error
 * naming the folder. */
int ft_train_adapter_init(ft_train_adapter *a, const ft_train_cfg *c, ft_session *s,
                          const char *base_name, ft_train_result *res);

/* Once the base is placed: the schedule of `total` steps with `warmup` (the optimizer), the
 * run config (run_config.h: the data d, seq_len, the base's quantization s->quant) and the
 * checkpoint state of a fresh start. Returns 0, -ENOMEM, or the DPO reference's read error. */
int ft_train_adapter_plan(ft_train_adapter *a, const ft_session *s, const ft_train_data *d,
                          int64_t total, int64_t warmup);

/* Opens OUT (metrics.jsonl) and starts the adapter: a fresh run gets a run id, its DPO
 * reference and the notes on an earlier run's checkpoints; cfg->resume loads the checkpoint
 * (its run config must match: run_config.h ft_train_config_check), re-packs the data of its
 * epoch in d, continues metrics.jsonl and the best adapter (eval.h). Returns 0 or an error
 * naming the file. */
int ft_train_adapter_open(ft_train_adapter *a, ft_session *s, ft_train_data *d,
                          const ft_train_sink *k);

/* The dropout mask seed of optimizer step `step` (0-based): a pure function of (seed, step),
 * so a resumed run needs no RNG state; 0 without dropout. */
uint64_t ft_train_adapter_dropout_seed(const ft_train_adapter *a, int64_t step);
/* The NEFTune noise seed of step `step`, likewise (the executor mixes in the micro-batch). */
uint64_t ft_train_adapter_neftune_seed(const ft_train_adapter *a, int64_t step);

/* What one step's pass over the base gave an adapter: its summed token loss and target
 * count, or with DPO the step's objective (dpo.st: the sums over its pairs). */
typedef struct ft_train_step_out {
    double loss_sum;
    int64_t n_tokens;
    ft_dpo_step dpo;
} ft_train_step_out;

/* The clock readings (ft_train_now_s) a step's metrics line and event are timed from. */
typedef struct ft_train_step_time {
    double run_t0;              /* the run's start, this session (ft_train_run) */
    double loop_t0;             /* this session's first step */
    double step_t0;             /* this step's start */
} ft_train_step_time;

/* After step `step` (0-based) whose micro-batches held `positions` token positions: the loss
 * and the global gradient norm; a non-finite one skips the step (gradients dropped, no
 * update, the schedule advances; FT_EV_WARN, counted in st.bad_steps), else the clip and
 * the AdamW update at the scheduled lr; then the metrics line and the FT_EV_STEP event.
 * Returns 0 or an error (the backend's, the metrics file's). */
int ft_train_adapter_update(ft_train_adapter *a, int64_t step, const ft_train_step_out *o,
                            int64_t positions, const ft_train_step_time *tm,
                            const ft_train_sink *k);

/* After the update: FT_E_NUMERIC once --max-bad-steps steps in a row were skipped (no adapter
 * written); the scheduled mid-run eval (even when stopping, so that a resumed run's metrics
 * are those of an uninterrupted one), which may early-stop the adapter (a->early); the
 * periodic checkpoint, unless a stop was asked (cfg->stop: the stop's checkpoint follows the
 * loop). run_t0: the run's start this session (ft_train_now_s). Returns 0 or an error. */
int ft_train_adapter_after_step(ft_train_adapter *a, ft_session *s, const ft_train_data *d,
                                double run_t0, const ft_train_sink *k);

/* Writes checkpoint st.step (checkpoint.h ft_ckpt_save; st.elapsed_s the run time of all
 * sessions, this one's since run_t0), prunes old ones (--keep), reports it (FT_EV_CKPT);
 * res->checkpoint names it. On a failure the message says whether an earlier checkpoint of
 * the run is intact. */
int ft_train_adapter_save(ft_train_adapter *a, const ft_model *m, double run_t0,
                          const ft_train_sink *k);

/* Packs a's own training micro-batches of st.epoch from d's examples (a multi-adapter job).
 * Returns 0 or -ENOMEM. */
int ft_train_adapter_pack(ft_train_adapter *a, const ft_train_data *d);

void ft_train_adapter_free(ft_train_adapter *a); /* zeroes *a */

#endif
