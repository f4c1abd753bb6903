/* sweep_ranks.c - a sweep over several ranks (sweep_ranks.h). */
#include "src/train/sweep_ranks.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

int ft_sweep_ranks_set_aside(ft_sweep_sched *s, const ft_sweep_trials *t, int rank, int size,
                             const char *file)
{
    for (int64_t i = 0; i < s->n_trials && size > 1; i++)
        if (i % size != rank && s->status[i] != FT_TRIAL_PENDING)
            return ft_err(FT_E_INVALID, "%s: trials[%lld] (%s) is %s, and under %d ranks it is rank %lld's: "
                          "resume with the number of ranks the sweep ran with", file, (long long)i,
                          t->t[i].name, ft_trial_status_name(s->status[i]), size, (long long)(i % size));
    for (int64_t i = 0; i < s->n_trials && size > 1; i++)
        if (i % size != rank) s->status[i] = FT_SWEEP_ELSEWHERE;
    return 0;
}

int ft_sweep_ranks_view(const ft_sweep_sched *s, ft_sweep_sched *view)
{
    *view = *s;
    view->status = malloc((size_t)s->n_trials * sizeof *view->status);
    view->n_reported = malloc((size_t)s->n_trials * sizeof *view->n_reported);
    if (!view->status || !view->n_reported) {
        free(view->status);
        free(view->n_reported);
        view->status = NULL;
        view->n_reported = NULL;
        return ft_err(-ENOMEM, "out of memory");
    }
    for (int64_t t = 0; t < s->n_trials; t++) {
        const int away = s->status[t] == FT_SWEEP_ELSEWHERE; /* its rung losses: its rank's */
        view->status[t] = away ? FT_TRIAL_PENDING : s->status[t];
        view->n_reported[t] = away ? 0 : s->n_reported[t];
    }
    return 0;
}

/* One trial's record as gathered across the ranks. */
typedef struct trial_rec {
    int64_t status, n_reported;
    ft_sweep_result res;
} trial_rec;

int ft_sweep_ranks_gather(const ft_comm *c, ft_sweep_sched *s, ft_sweep_result *res)
{
    const int size = ft_comm_size(c);
    if (size == 1) return 0;
    const int64_t n = s->n_trials, nr = s->n_rungs;
    const size_t head = (size_t)n * sizeof(trial_rec), one = head + (size_t)(n * nr) * sizeof(double);
    unsigned char *me = calloc(1, one), *all = calloc((size_t)size, one);
    int rc = me && all ? 0 : ft_err(-ENOMEM, "out of memory");
    trial_rec *rec = (trial_rec *)me;
    for (int64_t t = 0; !rc && t < n; t++) rec[t] = (trial_rec){s->status[t], s->n_reported[t], res[t]};
    if (!rc && nr) memcpy(me + head, s->loss, (size_t)(n * nr) * sizeof(double));
    if (!rc) rc = ft_comm_allgather(c, me, one, all);
    for (int64_t t = 0; !rc && t < n; t++) {
        const unsigned char *from = all + (size_t)(t % size) * one;
        const trial_rec *x = (const trial_rec *)from + t;
        s->status[t] = (int)x->status;
        s->n_reported[t] = x->n_reported;
        res[t] = x->res;
        if (nr) memcpy(s->loss + t * nr, from + head + (size_t)(t * nr) * sizeof(double), (size_t)nr * sizeof(double));
    }
    free(me);
    free(all);
    return rc;
}

int ft_sweep_ranks_exchange(const ft_comm *c, ft_sweep_pass_rec *me, ft_sweep_pass_rec *all,
                            volatile sig_atomic_t *signal, volatile sig_atomic_t *pass_stop)
{
    me->stop = signal ? *signal : 0;
    FT_TRY(ft_comm_allgather(c, me, sizeof *me, all));
    for (int q = 0; q < ft_comm_size(c); q++)
        if (all[q].stop && !*pass_stop) {
            *pass_stop = (sig_atomic_t)all[q].stop;
            if (signal && !*signal) *signal = (sig_atomic_t)all[q].stop;
        }
    return 0;
}

int ft_sweep_ranks_idle(const ft_comm *c, volatile sig_atomic_t *signal, volatile sig_atomic_t *pass_stop)
{
    const int size = ft_comm_size(c);
    ft_sweep_pass_rec me = {0, 1, 0, {{0}}}, *all = calloc((size_t)size, sizeof *all);
    if (!all) return ft_err(-ENOMEM, "out of memory");
    int rc = 0;
    while (!rc && !*pass_stop) {
        rc = ft_sweep_ranks_exchange(c, &me, all, signal, pass_stop);
        int done = 1;
        for (int q = 0; q < size; q++) done &= all[q].done != 0;
        if (done) break;
    }
    free(all);
    return rc;
}
