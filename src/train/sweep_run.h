/* sweep_run.h - `ftune sweep`: many trials (sweep_space.h) trained as adapters side by side in
 * passes over one base (train_run.h multi: the model loaded, the data tokenized and the base
 * placed once), pruned by successive halving (sweep_prune.h), with their state in
 * DIR/sweep.json (sweep_state.h).
 *
 * Each trial is `ftune train` with the sweep's fixed options and its own overrides, its run
 * folder DIR/trials/<name>/ written as that command writes it (adapter, metrics.jsonl,
 * summary.json, checkpoints, report.html); its steps are those of that run alone, bit for bit
 * on the CPU (the executor runs one GEMM per adapter's rows, offload/exec.h concat_gemms 0),
 * whatever else shares its passes, since every trial keeps its own data position and packing.
 * K trials run at once (adapters_per_pass, else the most the budgets fit,
 * offload/session.h k_max); a slot freed by a trial's end is given to the next pending
 * trial. Options of the pass itself cannot differ between trials (not sweep keys); the seed
 * is refused as a key too, since it also splits the data into train and eval examples, which
 * the trials share.
 *
 * DIR/sweep.json is rewritten (atomically) whenever the state changes: a rung, a trial's end, a
 * refill. Resume points come every base.save_every passes, at a stop and at the end: each
 * running trial checkpointed at its current step, then the state also into
 * DIR/sweep.resume.json (FT_SWEEP_RESUME_FILE, the same schema). A killed sweep resumed from
 * it (each running trial from its checkpoint at its "steps", a trial at step 0 started
 * afresh, the trials ended or started since then run again) continues as the uninterrupted
 * one did, so every trial ends with the same bits (trainer.h's resume rule). Trials keep at
 * least 2 checkpoints (--keep 1 is raised to 2) so that the resume point's survives the
 * trial's final one.
 *
 * Over several ranks (base.comm of size N > 1, mpirun): trial t runs on rank t % N, trained by
 * that rank alone (each trial's settings get comm NULL: no data-parallel split, no all-reduce),
 * each rank K per pass for its share; each rank writes its trials' folders and its own resume
 * point (rank 0 DIR/sweep.resume.json, rank R DIR/sweep.resume.R.json, the other ranks' trials
 * pending there); at the end the trial records are all-gathered (ft_comm_allgather) and rank 0
 * alone writes DIR/sweep.json, DIR/best/ and DIR/report.html. With --prune halving, after each
 * pass every rank all-gathers its rung reports and all run the same scheduler on them (each
 * rung's group in trial order), a rank without trials taking part until all are done, and a
 * stop is shared there so all stop after the same pass. A resume file with a started trial of
 * another rank is refused (FT_E_INVALID: another number of ranks), as is --resume of a halving
 * sweep over several ranks (FT_E_UNSUPPORTED).
 */
#ifndef FT_SWEEP_RUN_H
#define FT_SWEEP_RUN_H

#include <stdint.h>

#include "src/train/sweep_space.h"
#include "src/train/trainer.h"

#define FT_SWEEP_RESUME_FILE "sweep.resume.json"

typedef struct ft_sweep_cfg {
    ft_train_cfg base;          /* the fixed part; base.out is the sweep's DIR */
    const ft_sweep_trials *trials;
    int prune;                  /* enum ft_prune_mode */
    int64_t eta;                /* its reduction factor (>= 2) */
    int64_t adapters_per_pass;  /* K (1..FT_TRAIN_MAX_ADAPTERS); 0: the planner's */
    int resume;                 /* 1: continue DIR/sweep.json's sweep */
} ft_sweep_cfg;

typedef struct ft_sweep_outcome {
    int64_t adapters_per_pass;
    int64_t n_completed, n_pruned, n_failed;
    int64_t best;               /* the best trial (sweep_state.h ft_sweep_best), or -1 */
    int stopped;                /* 1: stopped through base.stop; --resume continues */
    double time_s;              /* this session's wall time */
    double tokens_per_s;        /* aggregate token positions trained per second from the first
                                 * pass on (as a run's: the set-up not counted) */
} ft_sweep_outcome;

/* Runs the sweep: events go to cb (the sweep's lines, and each trial's info, warning and done
 * lines prefixed with "[name] "; step, eval and checkpoint events only into the trial's
 * metrics), including an FT_EV_INFO progress line "sweep: R running, P pruned, C completed,
 * F failed, Q pending; N tok/s" at each sync point. At the end DIR/best/ holds the best
 * trial's adapter and DIR/report.html every trial's curves (report.h ft_report_write_runs).
 * Returns 0 (also when some trials failed: each is "failed" in sweep.json with its error, and
 * reported as FT_EV_WARN) or an error of the sweep itself: FT_E_INVALID for settings no
 * trial can run with (--method dpo, --quant-correction, the seed as a key, --prune halving
 * without an eval set or --eval-every, a --resume whose sweep.json disagrees, naming the file
 * and key), the model's, the data's, the placement's or a pass's error. */
int ft_sweep_run(const ft_sweep_cfg *c, ft_train_cb cb, void *user, ft_sweep_outcome *out);

#endif
