/* sweep_ranks.h - a sweep over several ranks (sweep_run.h): which rank runs which trial, the
 * records gathered at the end, and the per-pass exchange of rung reports that lets
 * --prune halving rank the trials of every rank at the same eval points.
 *
 * Trial t is rank t % size's. In a rank's scheduler (sweep_prune.h) the other ranks' trials
 * have the status FT_SWEEP_ELSEWHERE: neither pending nor running, so that rank never starts
 * them; they are written as "pending" into its files until ft_sweep_ranks_gather. */
#ifndef FT_SWEEP_RANKS_H
#define FT_SWEEP_RANKS_H

#include <signal.h>
#include <stdint.h>

#include "src/comm/comm.h"
#include "src/train/sweep_prune.h"
#include "src/train/sweep_space.h"
#include "src/train/sweep_state.h"
#include "src/train/train_run.h"

#define FT_SWEEP_ELSEWHERE FT_TRIAL_N_STATUS

/* One rung report of a pass: trial, rung index, its eval loss (nats per token). */
typedef struct ft_sweep_rung_rep {
    int64_t trial, rung;
    double loss;
} ft_sweep_rung_rep;

/* One rank's record of a pass: its reports (at most one per slot), done (1: no trial left
 * there), stop (the signal number seen there, 0: none). The same size on every rank. */
typedef struct ft_sweep_pass_rec {
    int64_t n, done, stop;
    ft_sweep_rung_rep rep[FT_TRAIN_MAX_ADAPTERS];
} ft_sweep_pass_rec;

/* Sets the trials of other ranks (t % size != rank) aside in s (FT_SWEEP_ELSEWHERE); size 1
 * changes nothing. After a resume read (file: its name for the message) a trial of another
 * rank that is not pending means another number of ranks: FT_E_INVALID naming the file, the
 * trial and its rank, s unchanged. */
int ft_sweep_ranks_set_aside(ft_sweep_sched *s, const ft_sweep_trials *t, int rank, int size,
                             const char *file);

/* The view of s to write into this rank's files: view->status and view->n_reported malloc'ed
 * (caller frees both), the trials set aside shown pending with no rung reported. -ENOMEM. */
int ft_sweep_ranks_view(const ft_sweep_sched *s, ft_sweep_sched *view);

/* At the end, on every rank (a collective): each trial's status, rung losses and results
 * (res[0..n)) taken from its rank's, so that every rank holds the whole sweep. Size 1: no-op.
 * Errors: the communicator's, -ENOMEM. */
int ft_sweep_ranks_gather(const ft_comm *c, ft_sweep_sched *s, ft_sweep_result *res);

/* One pass's exchange (a collective): me->stop set from *signal, then every rank's record
 * into all[0..size); when a rank saw a signal, *pass_stop (and *signal, if 0) take it. */
int ft_sweep_ranks_exchange(const ft_comm *c, ft_sweep_pass_rec *me, ft_sweep_pass_rec *all,
                            volatile sig_atomic_t *signal, volatile sig_atomic_t *pass_stop);

/* A rank with no trial left: exchanges (done 1, no reports) until every rank is done or a
 * stop reached every rank (*pass_stop). */
int ft_sweep_ranks_idle(const ft_comm *c, volatile sig_atomic_t *signal, volatile sig_atomic_t *pass_stop);

#endif
