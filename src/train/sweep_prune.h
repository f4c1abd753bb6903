/* sweep_prune.h - which trials of a sweep run, and which stop early: a pure scheduler over the
 * trials' eval losses at the rungs (eval points), with no training in it.
 *
 * Trials run in `slots` (the adapters of one pass over the base). ft_sweep_sched_start gives
 * a free slot to the pending trial of lowest index; a trial leaves its slot when it is
 * completed, failed or pruned, and the slot is then refilled the same way.
 *
 * Pruning, FT_PRUNE_HALVING: asynchronous successive halving (ASHA, Li, Jamieson,
 * Rostamizadeh, Gonina, Ben-Tzur, Hardt, Recht, Talwalkar, "A System for Massively Parallel
 * Hyperparameter Tuning", MLSys 2020, arXiv 1810.05934), in its stopping form (the trial
 * that reaches a rung continues or stops at once; ASHA's promotion form would pause it and
 * resume it later, which here would hold an adapter's state out of its pass). Rung k is
 * reached after the steps r * eta^k (ASHA's resource schedule with reduction factor eta;
 * ft_sweep_rung_steps). When a group of trials reaches rung k together (the adapters of one
 * pass evaluate at the same step), their losses join every loss recorded at rung k so far,
 * by trials running, pruned or ended since; with n such losses:
 *   - n < eta: every trial of the group with a finite loss continues (too few to compare;
 *     the rule of Syne Tune's ASHA stopping variant, "as long as a rung has less than eta
 *     trials, the default is to continue");
 *   - else a trial continues when its loss is among the floor(n / eta) best of the rung
 *     (ASHA's top-1/eta), the others are pruned.
 * Losses are ranked lowest first, a non-finite loss after every finite one, ties by trial
 * index (the lower first); a non-finite loss never continues. With every trial in one pass
 * this is synchronous successive halving: each rung keeps the best floor(n / eta).
 * eta = 2 (FT_PRUNE_ETA, the default): "halving" in its literal sense, half of each full
 * rung stopped, for sweeps of a handful to some tens of trials; a larger eta stops more at
 * each rung (8 trials in one pass, eta = 3: 2 continue after the first rung, and the rungs
 * after it hold fewer than 3, so both run to the end).
 *
 * FT_PRUNE_NONE: every trial runs to its end (rung losses are still recorded).
 *
 * The state (statuses, reported rungs and their losses) is plain data, written to and read
 * from sweep.json by sweep_state.h, and the decisions depend on it alone: a resumed sweep
 * decides as the uninterrupted one would, given the same groups in the same order.
 */
#ifndef FT_SWEEP_PRUNE_H
#define FT_SWEEP_PRUNE_H

#include <stdint.h>

enum ft_trial_status { FT_TRIAL_PENDING = 0, FT_TRIAL_RUNNING, FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED,
                       FT_TRIAL_FAILED, FT_TRIAL_N_STATUS };

enum ft_prune_mode { FT_PRUNE_NONE = 0, FT_PRUNE_HALVING };

#define FT_PRUNE_ETA 2 /* default reduction factor of FT_PRUNE_HALVING */

typedef struct ft_sweep_sched {
    int mode;                 /* enum ft_prune_mode */
    int64_t eta;              /* reduction factor, >= 2 */
    int64_t slots;            /* trials run at once, >= 1 */
    int64_t n_trials;
    int64_t n_rungs;
    int64_t *rung_step;       /* (n_rungs) the step of each rung, increasing (a trial's own steps) */
    int *status;              /* (n_trials) enum ft_trial_status */
    int64_t *n_reported;      /* (n_trials) rungs reported so far: rungs 0 .. n_reported - 1 */
    double *loss;             /* (n_trials, n_rungs) the eval loss at each reported rung */
} ft_sweep_sched;

/* "pending", "running", "pruned", "completed", "failed"; and back (-1 if unknown). */
const char *ft_trial_status_name(int status);
int ft_trial_status_parse(const char *s);

/* "none", "halving"; and back (-1 if unknown). */
const char *ft_prune_mode_name(int mode);
int ft_prune_mode_parse(const char *s);

/* ASHA's rungs: the steps first * eta^k, k = 0, 1, ..., below total_steps (the last step is
 * the trial's end, no rung), into steps[max]. Returns their count (at most max), 0 when
 * first < 1 or first >= total_steps. */
int64_t ft_sweep_rung_steps(int64_t first, int64_t eta, int64_t total_steps, int64_t *steps, int64_t max);

/* Every trial pending, no loss recorded. rung_step (n_rungs, increasing, >= 1) is copied.
 * Returns 0, -ENOMEM, or FT_E_INVALID (n_trials < 0, n_rungs < 0, an unknown mode, eta < 2,
 * slots < 1, rung steps not increasing). */
int ft_sweep_sched_init(ft_sweep_sched *s, int64_t n_trials, const int64_t *rung_step, int64_t n_rungs,
                        int mode, int64_t eta, int64_t slots);
void ft_sweep_sched_free(ft_sweep_sched *s);

/* Trials in `status`. */
int64_t ft_sweep_sched_count(const ft_sweep_sched *s, int status);

/* Gives a free slot to the next pending trial: 1 with its index in *trial (now running), 0
 * when every slot is taken or no trial is pending. */
int ft_sweep_sched_start(ft_sweep_sched *s, int64_t *trial);

/* Trials trials[0..n) (running, distinct, each with rungs 0..rung-1 reported) evaluated at
 * rung `rung` with losses[i]. Records the losses and decides (the rule above): keep[i] = 1
 * for a trial that continues, 0 for one now pruned (FT_PRUNE_NONE: all 1). keep may be NULL.
 * Returns 0 or FT_E_INVALID (a trial not running or out of range, twice in the group, a rung
 * out of order or past n_rungs), with nothing changed. */
int ft_sweep_sched_report(ft_sweep_sched *s, int64_t rung, int64_t n, const int64_t *trials,
                          const double *losses, int *keep);

/* Running trial `trial` ends: FT_TRIAL_COMPLETED (its last step done, or stopped early by
 * its own early stopping) or FT_TRIAL_FAILED. Returns 0 or FT_E_INVALID. */
int ft_sweep_sched_end(ft_sweep_sched *s, int64_t trial, int status);

/* 1 when no trial is pending or running (the sweep is over), else 0. */
int ft_sweep_sched_done(const ft_sweep_sched *s);

#endif
