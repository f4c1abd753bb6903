/* sweep_prune.c - the sweep's trial scheduler and ASHA's stopping rule (sweep_prune.h). */
#include "src/train/sweep_prune.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

static const char *const status_names[FT_TRIAL_N_STATUS] = {"pending", "running", "pruned", "completed",
                                                             "failed"};

const char *ft_trial_status_name(int status)
{
    return status >= 0 && status < FT_TRIAL_N_STATUS ? status_names[status] : "unknown";
}

int ft_trial_status_parse(const char *s)
{
    for (int i = 0; i < FT_TRIAL_N_STATUS; i++)
        if (!strcmp(s, status_names[i])) return i;
    return -1;
}

const char *ft_prune_mode_name(int mode)
{
    return mode == FT_PRUNE_NONE ? "none" : mode == FT_PRUNE_HALVING ? "halving" : "unknown";
}

int ft_prune_mode_parse(const char *s)
{
    if (!strcmp(s, "none")) return FT_PRUNE_NONE;
    if (!strcmp(s, "halving")) return FT_PRUNE_HALVING;
    return -1;
}

int64_t ft_sweep_rung_steps(int64_t first, int64_t eta, int64_t total_steps, int64_t *steps, int64_t max)
{
    int64_t n = 0;
    if (first < 1 || eta < 2) return 0;
    for (int64_t r = first; r < total_steps && n < max;) {
        steps[n++] = r;
        if (__builtin_mul_overflow(r, eta, &r)) break;
    }
    return n;
}

void ft_sweep_sched_free(ft_sweep_sched *s)
{
    if (!s) return;
    free(s->rung_step);
    free(s->status);
    free(s->n_reported);
    free(s->loss);
    memset(s, 0, sizeof *s);
}

int ft_sweep_sched_init(ft_sweep_sched *s, int64_t n_trials, const int64_t *rung_step, int64_t n_rungs,
                        int mode, int64_t eta, int64_t slots)
{
    memset(s, 0, sizeof *s);
    if (n_trials < 0 || n_rungs < 0) return ft_err(FT_E_INVALID, "sweep: %lld trials, %lld rungs",
                                                   (long long)n_trials, (long long)n_rungs);
    if (mode != FT_PRUNE_NONE && mode != FT_PRUNE_HALVING)
        return ft_err(FT_E_INVALID, "sweep: unknown pruning mode %d (none, halving)", mode);
    if (eta < 2) return ft_err(FT_E_INVALID, "sweep: the reduction factor eta must be >= 2, got %lld", (long long)eta);
    if (slots < 1) return ft_err(FT_E_INVALID, "sweep: adapters per pass must be >= 1, got %lld", (long long)slots);
    for (int64_t k = 0; k < n_rungs; k++)
        if (rung_step[k] < 1 || (k && rung_step[k] <= rung_step[k - 1]))
            return ft_err(FT_E_INVALID, "sweep: rung %lld at step %lld: the rungs' steps must increase from 1",
                          (long long)k, (long long)rung_step[k]);
    s->mode = mode;
    s->eta = eta;
    s->slots = slots;
    s->n_trials = n_trials;
    s->n_rungs = n_rungs;
    s->rung_step = malloc((size_t)(n_rungs ? n_rungs : 1) * sizeof *s->rung_step);
    s->status = calloc((size_t)(n_trials ? n_trials : 1), sizeof *s->status);
    s->n_reported = calloc((size_t)(n_trials ? n_trials : 1), sizeof *s->n_reported);
    s->loss = malloc((size_t)(n_trials * n_rungs > 0 ? n_trials * n_rungs : 1) * sizeof *s->loss);
    if (!s->rung_step || !s->status || !s->n_reported || !s->loss) {
        ft_sweep_sched_free(s);
        return ft_err(-ENOMEM, "sweep of %lld trials: out of memory", (long long)n_trials);
    }
    if (n_rungs) memcpy(s->rung_step, rung_step, (size_t)n_rungs * sizeof *rung_step);
    for (int64_t i = 0; i < n_trials * n_rungs; i++) s->loss[i] = NAN;
    return 0;
}

int64_t ft_sweep_sched_count(const ft_sweep_sched *s, int status)
{
    int64_t n = 0;
    for (int64_t i = 0; i < s->n_trials; i++) n += s->status[i] == status;
    return n;
}

int ft_sweep_sched_start(ft_sweep_sched *s, int64_t *trial)
{
    if (ft_sweep_sched_count(s, FT_TRIAL_RUNNING) >= s->slots) return 0;
    for (int64_t i = 0; i < s->n_trials; i++)
        if (s->status[i] == FT_TRIAL_PENDING) {
            s->status[i] = FT_TRIAL_RUNNING;
            *trial = i;
            return 1;
        }
    return 0;
}

/* 1 if trial a's loss x ranks before trial b's loss y at a rung: finite before non-finite,
 * lower first, then the lower index. */
static int ranks_before(double x, int64_t a, double y, int64_t b)
{
    int fx = isfinite(x), fy = isfinite(y);
    if (fx != fy) return fx;
    if (fx && x != y) return x < y;
    return a < b;
}

int ft_sweep_sched_report(ft_sweep_sched *s, int64_t rung, int64_t n, const int64_t *trials,
                          const double *losses, int *keep)
{
    if (rung < 0 || rung >= s->n_rungs)
        return ft_err(FT_E_INVALID, "sweep: rung %lld reported, the sweep has %lld", (long long)rung,
                      (long long)s->n_rungs);
    for (int64_t i = 0; i < n; i++) {
        int64_t t = trials[i];
        if (t < 0 || t >= s->n_trials)
            return ft_err(FT_E_INVALID, "sweep: trial %lld reported, the sweep has %lld", (long long)t,
                          (long long)s->n_trials);
        if (s->status[t] != FT_TRIAL_RUNNING)
            return ft_err(FT_E_INVALID, "sweep: trial %lld reported at rung %lld, and it is %s", (long long)t,
                          (long long)rung, ft_trial_status_name(s->status[t]));
        if (s->n_reported[t] != rung)
            return ft_err(FT_E_INVALID, "sweep: trial %lld reported at rung %lld after %lld rungs", (long long)t,
                          (long long)rung, (long long)s->n_reported[t]);
        for (int64_t j = 0; j < i; j++)
            if (trials[j] == t)
                return ft_err(FT_E_INVALID, "sweep: trial %lld reported twice at rung %lld", (long long)t,
                              (long long)rung);
    }
    for (int64_t i = 0; i < n; i++) {
        s->loss[trials[i] * s->n_rungs + rung] = losses[i];
        s->n_reported[trials[i]] = rung + 1;
    }
    /* the rung's record: every trial that has reached it */
    int64_t reached = 0;
    for (int64_t t = 0; t < s->n_trials; t++) reached += s->n_reported[t] > rung;
    int64_t q = reached / s->eta; /* ASHA's top floor(n / eta) */
    for (int64_t i = 0; i < n; i++) {
        int64_t t = trials[i];
        double x = losses[i];
        int go;
        if (s->mode == FT_PRUNE_NONE) go = 1;
        else if (!isfinite(x)) go = 0;
        else if (reached < s->eta) go = 1;
        else {
            int64_t rank = 0; /* trials of the rung ranked before t */
            for (int64_t u = 0; u < s->n_trials && rank < q; u++)
                if (u != t && s->n_reported[u] > rung && ranks_before(s->loss[u * s->n_rungs + rung], u, x, t))
                    rank++;
            go = rank < q;
        }
        if (!go) s->status[t] = FT_TRIAL_PRUNED;
        if (keep) keep[i] = go;
    }
    return 0;
}

int ft_sweep_sched_end(ft_sweep_sched *s, int64_t trial, int status)
{
    if (trial < 0 || trial >= s->n_trials)
        return ft_err(FT_E_INVALID, "sweep: trial %lld ends, the sweep has %lld", (long long)trial,
                      (long long)s->n_trials);
    if (status != FT_TRIAL_COMPLETED && status != FT_TRIAL_FAILED)
        return ft_err(FT_E_INVALID, "sweep: trial %lld cannot end as %s", (long long)trial,
                      ft_trial_status_name(status));
    if (s->status[trial] != FT_TRIAL_RUNNING)
        return ft_err(FT_E_INVALID, "sweep: trial %lld ends, and it is %s", (long long)trial,
                      ft_trial_status_name(s->status[trial]));
    s->status[trial] = status;
    return 0;
}

int ft_sweep_sched_done(const ft_sweep_sched *s)
{
    return !ft_sweep_sched_count(s, FT_TRIAL_PENDING) && !ft_sweep_sched_count(s, FT_TRIAL_RUNNING);
}
