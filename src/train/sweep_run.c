/* sweep_run.c - `ftune sweep`'s runner (see sweep_run.h): the trials' settings and folders,
 * the base opened and placed once for K adapters per pass, the trials started in free slots,
 * pruned at the rungs, ended as `ftune train` ends a run, and the sweep's state at sync
 * points; at the end DIR/best/ and DIR/report.html. */
#include "src/train/sweep_run.h"

#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/eval.h"
#include "src/train/report.h"
#include "src/train/sweep_prune.h"
#include "src/train/sweep_ranks.h"
#include "src/train/sweep_state.h"
#include "src/train/train_run.h"
#include "src/train/validate.h"

#define SW_MAX_RUNGS 64
#define SW_PATH 4200

typedef struct sweep sweep;

/* Where a slot's events go: the trial in it, for the "[name] " prefix. */
typedef struct slot_sink {
    sweep *sw;
    int64_t trial;
} slot_sink;

struct sweep {
    const ft_sweep_cfg *c;
    const ft_sweep_trials *t;
    ft_train_job *r;
    int64_t n;                  /* trials */
    ft_train_cfg *tc;           /* (n) each trial's settings */
    char (*out)[SW_PATH];       /* (n) DIR/trials/<name> */
    char (*resume)[SW_PATH];    /* (n) its checkpoint to resume from */
    char (*bad)[512];           /* (n) a trial's own bad setting ("" if none) */
    ft_train_result *tres;      /* (n) */
    ft_sweep_result *res;       /* (n) */
    ft_sweep_sched sched;
    int64_t slot_trial[FT_TRAIN_MAX_ADAPTERS]; /* -1: free */
    slot_sink ss[FT_TRAIN_MAX_ADAPTERS];
    int64_t rung[SW_MAX_RUNGS], n_rungs;
    int64_t r_max;
    int64_t k;                  /* adapters per pass asked for (0: the planner's) */
    char json[SW_PATH], resume_json[SW_PATH];
    int64_t positions;          /* token positions of the trials ended this session */
    int dirty;                  /* the state changed since the last sync */
    int64_t passes;             /* passes over the base this session */
    double t_loop;              /* the first pass's start (0 before) */
    const ft_comm *comm;        /* the sweep's ranks (NULL: one process); trials train alone */
    int rank, size;
    int xrank;                  /* 1: --prune halving over several ranks: rungs all-gathered */
    volatile sig_atomic_t stop; /* xrank: the passes' stop flag, set only once every rank knows */
};


/* A trial's events: its lines to the caller prefixed with its name; steps, evals and
 * checkpoints only in its own metrics. */
static void trial_event(const ft_train_event *ev, void *user)
{
    const slot_sink *ss = user;
    if (ev->kind == FT_EV_STEP || ev->kind == FT_EV_EVAL || ev->kind == FT_EV_CKPT) return;
    ft_train_info(&ss->sw->r->sink, ev->kind, "[%s] %s", ss->sw->t->t[ss->trial].name,
                  ev->text ? ev->text : "");
}

static void session_note(void *user, int kind, const char *line)
{
    const ft_train_job *r = user;
    const int ev = kind == FT_SESSION_WARN ? FT_EV_WARN : kind == FT_SESSION_PLAN ? FT_EV_PLAN : FT_EV_INFO;
    ft_train_info(&r->sink, ev, "%s", line);
}

/* Settings no trial can run with, refused before anything is read. */
static int check_cfg(const ft_sweep_cfg *c)
{
    const ft_train_cfg *b = &c->base;
    if (b->method == FT_TRAIN_METHOD_DPO)
        return ft_err(FT_E_INVALID, "sweep: --method dpo trains one adapter per pass (its "
                      "sequence objective); sweep SFT runs, or run each DPO setting with ftune train");
    if (b->quant_correction)
        return ft_err(FT_E_INVALID, "sweep: --quant-correction computes one frozen correction "
                      "per run; train with it alone (ftune train), or sweep without it");
    if (b->resume)
        return ft_err(FT_E_INVALID, "sweep: --resume takes no folder (the sweep's is --out)");
    if (b->tensorboard)
        return ft_err(FT_E_INVALID, "sweep: --tensorboard is not taken (each trial's "
                      "metrics.jsonl and DIR/report.html hold the curves)");
    for (int k = 0; k < c->trials->n_keys; k++)
        if (c->trials->keys[k]->off == offsetof(ft_train_cfg, seed))
            return ft_err(FT_E_INVALID, "sweep: seed cannot be a sweep key: it also splits and "
                          "orders the data, which the trials of a pass share; give --seed as the "
                          "fixed part (one sweep per seed)");
    if (c->prune == FT_PRUNE_HALVING && ft_comm_size(b->comm) > 1 && c->resume)
        return ft_err(FT_E_UNSUPPORTED, "sweep: --resume of a --prune halving sweep over %d ranks: "
                      "not supported yet (each rank's resume point holds its own trials' rungs); rerun "
                      "the sweep, or sweep with --prune none under mpirun", ft_comm_size(b->comm));
    if (c->prune == FT_PRUNE_HALVING && b->eval_every <= 0)
        return ft_err(FT_E_INVALID, "sweep: --prune halving ranks the trials at their "
                      "evaluations: give --eval-every N (the first rung comes after N steps)");
    if (c->adapters_per_pass < 0 || c->adapters_per_pass > FT_TRAIN_MAX_ADAPTERS)
        return ft_err(FT_E_INVALID, "--adapters-per-pass %lld: expected 1 to %d (0: the planner's)",
                      (long long)c->adapters_per_pass, FT_TRAIN_MAX_ADAPTERS);
    if (c->trials->n < 1) return ft_err(FT_E_INVALID, "sweep: no trials");
    return 0;
}

/* Each trial's settings: the fixed part with its values, its folder, save and keep rules of
 * the sweep (sweep_run.h), its own bad setting kept for its failure. */
static int make_trials(sweep *sw)
{
    const ft_train_cfg *b = &sw->c->base;
    sw->r_max = 1;
    int64_t init_r = 0; /* --init-adapter: its rank is every trial's */
    if (b->init_adapter) {
        ft_lora_cfg from;
        FT_TRY(ft_peft_read_config(b->init_adapter, &from));
        init_r = from.r;
    }
    for (int64_t i = 0; i < sw->n; i++) {
        ft_train_cfg *tc = &sw->tc[i];
        *tc = *b;
        ft_sweep_trial_apply(sw->t, i, tc);
        char dir[SW_PATH];
        FT_TRY(ft_path_join(dir, sizeof dir, b->out, "trials"));
        FT_TRY(ft_path_join(sw->out[i], sizeof sw->out[i], dir, sw->t->t[i].name));
        tc->out = sw->out[i];
        tc->save_every = 0; /* the sweep's sync points save */
        if (tc->keep == 1) tc->keep = 2;
        tc->tensorboard = NULL;
        tc->timeline = NULL;
        tc->resume = NULL;
        tc->comm = NULL; /* one rank trains a trial: no data-parallel split, each writes its own */
        if (ft_train_cfg_validate(tc) < 0) {
            snprintf(sw->bad[i], sizeof sw->bad[i], "%s", ft_errmsg());
            ft_err_clear();
        } else if ((init_r ? init_r : tc->lora.r) > sw->r_max) {
            sw->r_max = init_r ? init_r : tc->lora.r;
        }
    }
    return 0;
}

/* The schedule of a trial of settings c: total steps and warmup (trainer.c's rule). */
static void schedule_of(const ft_train_job *r, const ft_train_cfg *c, int64_t *total,
                        int64_t *warmup)
{
    const int64_t ga = r->cfg.grad_accum, spe = (r->d.n_train_b + ga - 1) / ga;
    *total = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * (double)spe);
    if (*total < 1) *total = 1;
    *warmup = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)ceil(c->warmup_ratio * (double)*total);
}

/* The model, the data, the backend, and the base placed for K adapters per pass (the largest
 * rank's activations; the planner's K unless --adapters-per-pass). */
static int open_base(sweep *sw)
{
    ft_train_job *r = sw->r;
    ft_train_cfg *c = &r->cfg;
    ft_session_cfg sc = {c->model, c->device, c->threads, 1, c->quant, c->cache_dir, c->gpu_mem,
                         c->host_mem, NULL, 1, session_note, r};
    FT_TRY(ft_session_open_model(&r->s, &sc));
    const ft_model_config *mc = &r->s.model->cfg;
    int64_t seq_len = c->seq_len;
    if (seq_len == 0)
        seq_len = mc->max_position_embeddings < 2048 ? mc->max_position_embeddings : 2048;
    FT_TRY(ft_train_data_load(&r->d, c, r->s.tok, seq_len, ft_train_data_target_weight(mc),
                              &r->sink));
    FT_TRY(ft_session_open_backend(&r->s));
    r->T = c->batch_size * seq_len;
    ft_lora_cfg lc = c->lora;
    lc.r = sw->r_max;
    lc.seed = c->seed;
    for (int64_t i = 0; i < sw->n; i++) lc.targets |= sw->tc[i].lora.targets;
    ft_lora probe;
    FT_TRY(ft_lora_init(&probe, r->s.model, &lc, r->s.be));
    ft_exec_adapter_sizes sz;
    ft_exec_adapter_bytes(r->s.model, sw->r_max, r->T, c->grad_accum > 0 ? c->grad_accum : 1, &sz);
    const int64_t n_own = sw->size > 1 ? (sw->n - sw->rank + sw->size - 1) / sw->size : sw->n;
    int64_t k_max = n_own < 1 ? 1 : n_own < FT_TRAIN_MAX_ADAPTERS ? n_own : FT_TRAIN_MAX_ADAPTERS;
    ft_session_place_cfg pc = {r->T, c->grad_accum, seq_len, &probe,
                               r->d.n_train_b > 0 ? &r->d.train_b[0] : NULL, c->plan_only, 0, NULL,
                               NULL, sw->k, sw->k ? 0 : k_max,
                               sw->r_max, ft_lora_bytes(r->s.model, &lc, 0) + sz.work};
    int rc = ft_session_place(&r->s, &pc);
    ft_lora_free(&probe);
    FT_TRY(rc);
    c->grad_accum = r->s.n_micro;
    r->n_ad = (int)r->s.n_adapters;
    ft_train_info(&r->sink, FT_EV_PLAN, "sweep: %lld trials, %d adapter%s per pass%s (LoRA ranks up to %lld), %lld micro-batch%s of %lld x %lld tokens per step",
                  (long long)sw->n, r->n_ad, r->n_ad == 1 ? "" : "s",
                  sw->k ? (sw->c->adapters_per_pass ? " (--adapters-per-pass)" : " (sweep.json's)")
                        : " (the planner's)",
                  (long long)sw->r_max, (long long)c->grad_accum, c->grad_accum == 1 ? "" : "es",
                  (long long)c->batch_size, (long long)seq_len);
    return 0;
}

/* Trial t in `slot` failed with msg: "failed" with its error (sweep.json), reported. */
static int fail_trial(sweep *sw, int slot, int64_t t, const char *msg)
{
    snprintf(sw->res[t].error, sizeof sw->res[t].error, "%s", msg);
    ft_train_info(&sw->r->sink, FT_EV_WARN, "[%s] failed: %s", sw->t->t[t].name, msg);
    if (slot >= 0) {
        ft_train_adapter_free(&sw->r->ad[slot]);
        sw->slot_trial[slot] = -1;
    }
    sw->dirty = 1;
    if (sw->sched.status[t] == FT_TRIAL_RUNNING) return ft_sweep_sched_end(&sw->sched, t, FT_TRIAL_FAILED);
    sw->sched.status[t] = FT_TRIAL_FAILED;
    return 0;
}

/* Starts (from_step 0) or resumes (from its checkpoint at from_step) running trial t in the
 * free `slot`: its adapter, schedule, folder, packing; a fresh one evaluated at step 0. A
 * trial's own error fails it (the sweep goes on). */
static int start_trial(sweep *sw, int slot, int64_t t, int64_t from_step)
{
    ft_train_job *r = sw->r;
    ft_train_adapter *a = &r->ad[slot];
    ft_train_cfg *tc = &sw->tc[t];
    if (sw->bad[t][0]) return fail_trial(sw, -1, t, sw->bad[t]);
    tc->resume = NULL;
    if (from_step > 0) {
        snprintf(sw->resume[t], sizeof sw->resume[t], "%s/" FT_CKPT_PREFIX "%lld", sw->out[t],
                 (long long)from_step);
        tc->resume = sw->resume[t];
    }
    ft_train_result *res = &sw->tres[t];
    memset(res, 0, sizeof *res);
    res->final_eval_reward_accuracy = NAN;
    res->quant = r->s.quant;
    for (int k = 0; k < 3; k++) res->base_layers[k] = r->s.base_layers[k];
    sw->ss[slot] = (slot_sink){sw, t};
    sw->slot_trial[slot] = t;
    int64_t total, warmup;
    schedule_of(r, tc, &total, &warmup);
    int rc = ft_train_adapter_init(a, tc, &r->s, r->base_name, res);
    a->sink = (ft_train_sink){trial_event, &sw->ss[slot]};
    if (!rc) rc = ft_train_adapter_plan(a, &r->s, &r->d, total, warmup);
    if (!rc) rc = ft_train_adapter_open(a, &r->s, &r->d, &a->sink);
    if (!rc) rc = ft_train_adapter_pack(a, &r->d);
    if (!rc && !tc->resume && r->d.n_eval_b) {
        double loss;
        int64_t tok;
        rc = ft_train_eval_log(a, &r->s, &r->d, 0, ft_train_now_s() - r->t0, &a->sink, &loss, &tok);
        a->st.initial_eval_loss = a->st.last_eval_loss = loss;
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        ft_err_clear();
        return fail_trial(sw, slot, t, msg);
    }
    a->start = a->st.step;
    a->positions0 = a->st.positions;
    a->base_s = a->st.elapsed_s;
    a->early = a->st.step < a->st.total_steps && ft_train_early_stop(a, &a->sink);
    sw->dirty = 1;
    return 0;
}

/* Rung k's group: trials[0..n) with their eval losses (slot[j] >= 0: this rank's slot) reported
 * to the scheduler; those it stops are pruned (another rank's trial keeps its status here,
 * its owner prunes it by the same decision). */
static int report_rung(sweep *sw, int64_t k, int64_t n, const int64_t *trials, const double *loss,
                       const int *slot, int *keep)
{
    ft_train_job *r = sw->r;
    for (int64_t j = 0; j < n; j++)
        if (slot[j] < 0) sw->sched.status[trials[j]] = FT_TRIAL_RUNNING;
    int rc = ft_sweep_sched_report(&sw->sched, k, n, trials, loss, keep);
    for (int64_t j = 0; j < n; j++)
        if (slot[j] < 0) sw->sched.status[trials[j]] = FT_SWEEP_ELSEWHERE;
    FT_TRY(rc);
    for (int64_t j = 0; j < n; j++)
        if (!keep[j]) {
            if (slot[j] >= 0) r->ad[slot[j]].pruned = 1;
            ft_train_info(&r->sink, FT_EV_INFO, "[%s] pruned at step %lld (rung %lld: eval loss %.4f)",
                          sw->t->t[trials[j]].name, (long long)sw->rung[k], (long long)k, loss[j]);
        }
    sw->dirty = 1;
    return 0;
}

/* The rungs reached in this pass: per rung, the trials whose step is its step (after their
 * mid-run eval there) reported as one group, over several ranks (xrank) the group of every
 * rank's trials in trial order; those the scheduler stops are pruned. */
static int rungs(sweep *sw)
{
    ft_train_job *r = sw->r;
    ft_sweep_pass_rec me = {0}, *all = NULL;
    int64_t mine_k[FT_TRAIN_MAX_ADAPTERS];
    int mine_slot[FT_TRAIN_MAX_ADAPTERS];
    for (int i = 0; i < r->n_ad; i++) {
        int64_t t = sw->slot_trial[i];
        const ft_train_adapter *a = &r->ad[i];
        if (t < 0 || a->failed || a->st.step >= a->st.total_steps) continue;
        const int64_t k = sw->sched.n_reported[t];
        if (k >= sw->n_rungs || a->st.step != sw->rung[k]) continue;
        mine_k[me.n] = k;
        mine_slot[me.n] = i;
        me.rep[me.n++] = (ft_sweep_rung_rep){t, k, a->st.last_eval_loss};
    }
    if (sw->xrank) {
        all = calloc((size_t)sw->size, sizeof *all);
        if (!all) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_sweep_ranks_exchange(sw->comm, &me, all, sw->c->base.stop, &sw->stop);
        if (rc) {
            free(all);
            return rc;
        }
    }
    /* a rung's group: at most every trial once */
    int64_t *trials = malloc((size_t)sw->n * sizeof *trials);
    double *loss = malloc((size_t)sw->n * sizeof *loss);
    int *slot = malloc((size_t)sw->n * sizeof *slot), *keep = malloc((size_t)sw->n * sizeof *keep);
    int rc = trials && loss && slot && keep ? 0 : ft_err(-ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < sw->n_rungs; k++) {
        int64_t n = 0;
        if (!all) {
            for (int64_t j = 0; j < me.n; j++)
                if (mine_k[j] == k) {
                    trials[n] = me.rep[j].trial;
                    loss[n] = me.rep[j].loss;
                    slot[n++] = mine_slot[j];
                }
        } else { /* every rank's, in trial order (trial t is rank t % size's) */
            for (int64_t t = 0; t < sw->n; t++) {
                const ft_sweep_pass_rec *q = &all[t % sw->size];
                for (int64_t j = 0; j < q->n; j++)
                    if (q->rep[j].trial == t && q->rep[j].rung == k) {
                        trials[n] = t;
                        loss[n] = q->rep[j].loss;
                        slot[n] = -1;
                        for (int64_t m = 0; t % sw->size == sw->rank && m < me.n; m++)
                            if (me.rep[m].trial == t) slot[n] = mine_slot[m];
                        n++;
                    }
            }
        }
        if (n) rc = report_rung(sw, k, n, trials, loss, slot, keep);
    }
    free(trials);
    free(loss);
    free(slot);
    free(keep);
    free(all);
    return rc;
}

/* Trial t's results so far into sweep.json's record. */
static void note_result(sweep *sw, int64_t t, const ft_train_adapter *a)
{
    ft_sweep_result *x = &sw->res[t];
    x->best_eval_loss = a->st.best_eval_loss;
    x->best_eval_step = a->st.best_eval_step;
    x->steps = a->st.step;
    x->tokens = a->st.positions;
}

/* The trial in `slot`, which takes no more steps: ended as `ftune train` ends a run
 * (completed, early stopped or pruned), or failed. */
static int end_trial(sweep *sw, int slot)
{
    ft_train_job *r = sw->r;
    ft_train_adapter *a = &r->ad[slot];
    int64_t t = sw->slot_trial[slot];
    sw->positions += a->st.positions - a->positions0;
    if (a->failed) {
        note_result(sw, t, a);
        return fail_trial(sw, slot, t, a->error);
    }
    int rc = ft_train_finish(r, a);
    note_result(sw, t, a);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        ft_err_clear();
        return fail_trial(sw, slot, t, msg);
    }
    if (!a->pruned) FT_TRY(ft_sweep_sched_end(&sw->sched, t, FT_TRIAL_COMPLETED));
    ft_train_adapter_free(a);
    sw->slot_trial[slot] = -1;
    sw->dirty = 1;
    return 0;
}

/* The progress line: trials by status, aggregate token positions per second this session. */
static void progress(sweep *sw)
{
    const ft_train_job *r = sw->r;
    int64_t pos = sw->positions;
    for (int i = 0; i < r->n_ad; i++)
        if (sw->slot_trial[i] >= 0) pos += r->ad[i].st.positions - r->ad[i].positions0;
    double el = sw->t_loop > 0 ? ft_train_now_s() - sw->t_loop : 0;
    const ft_sweep_sched *s = &sw->sched;
    ft_train_info(&r->sink, FT_EV_INFO, "sweep: %lld running, %lld pruned, %lld completed, %lld failed, %lld pending; %.0f tok/s",
                  (long long)ft_sweep_sched_count(s, FT_TRIAL_RUNNING),
                  (long long)ft_sweep_sched_count(s, FT_TRIAL_PRUNED),
                  (long long)ft_sweep_sched_count(s, FT_TRIAL_COMPLETED),
                  (long long)ft_sweep_sched_count(s, FT_TRIAL_FAILED),
                  (long long)ft_sweep_sched_count(s, FT_TRIAL_PENDING), el > 0 ? pos / el : 0.0);
}

/* The state as it is now into path, another rank's trials written as pending. */
static int write_state(sweep *sw, const char *path)
{
    if (sw->size == 1) return ft_sweep_json_write(path, sw->t, &sw->sched, sw->res);
    ft_sweep_sched view;
    FT_TRY(ft_sweep_ranks_view(&sw->sched, &view));
    int rc = ft_sweep_json_write(path, sw->t, &view, sw->res);
    free(view.status);
    free(view.n_reported);
    return rc;
}

/* DIR/sweep.json: the state as it is now (the running trials' steps so far). With `point`, a
 * resume point first: every running trial checkpointed at its current step (none at step 0:
 * it starts afresh), then the same state also into DIR/sweep.resume.json, which --resume
 * reads. */
static int sync_state(sweep *sw, int point)
{
    ft_train_job *r = sw->r;
    for (int i = 0; i < r->n_ad; i++) {
        int64_t t = sw->slot_trial[i];
        if (t < 0) continue;
        ft_train_adapter *a = &r->ad[i];
        if (point && a->st.step > 0 && a->saved_step != a->st.step) {
            FT_TRY(ft_train_adapter_save(a, r->s.model, r->t0, &a->sink));
            a->saved_step = a->st.step;
        }
        note_result(sw, t, a);
    }
    if (point) FT_TRY(write_state(sw, sw->resume_json));
    if (sw->rank == 0) FT_TRY(write_state(sw, sw->json));
    sw->dirty = 0;
    progress(sw);
    return 0;
}

/* Ends the trials that take no more steps, gives free slots to pending trials, and syncs
 * when the state changed (or every save_every passes). */
static int settle(sweep *sw)
{
    ft_train_job *r = sw->r;
    for (int i = 0; i < r->n_ad; i++)
        if (sw->slot_trial[i] >= 0 && !ft_train_adapter_active(&r->ad[i])) FT_TRY(end_trial(sw, i));
    for (int i = 0; i < r->n_ad; i++) {
        int64_t t;
        while (sw->slot_trial[i] < 0 && ft_sweep_sched_start(&sw->sched, &t)) {
            FT_TRY(start_trial(sw, i, t, 0));
            if (sw->slot_trial[i] >= 0 && !ft_train_adapter_active(&r->ad[i])) FT_TRY(end_trial(sw, i));
        }
    }
    const int64_t every = sw->c->base.save_every;
    const int point = every > 0 && r->n_pass > 0 && r->n_pass % every == 0;
    if (sw->dirty || point) FT_TRY(sync_state(sw, point));
    return 0;
}

static int after_pass(void *user, ft_train_job *r)
{
    sweep *sw = user;
    (void)r;
    FT_TRY(rungs(sw));
    return settle(sw);
}

/* Copies file `name` of folder from into folder to (atomically). */
static int copy_file(const char *from, const char *to, const char *name)
{
    char src[SW_PATH], dst[SW_PATH];
    FT_TRY(ft_path_join(src, sizeof src, from, name));
    FT_TRY(ft_path_join(dst, sizeof dst, to, name));
    const void *map;
    size_t size;
    FT_TRY(ft_map_file(src, "an adapter file", &map, &size));
    int rc = ft_write_file_atomic(dst, map ? map : "", size);
    ft_unmap_file(map, size);
    return rc < 0 ? ft_err(rc, "cannot write %s", dst) : 0;
}

/* DIR/best/: the best trial's adapter (its two PEFT files), and DIR/report.html. */
static int write_outputs(sweep *sw, int64_t best)
{
    const char *dir = sw->c->base.out;
    const ft_train_sink *k = &sw->r->sink;
    char path[SW_PATH];
    if (best >= 0) {
        FT_TRY(ft_path_join(path, sizeof path, dir, FT_CKPT_BEST_DIR));
        FT_TRY(ft_mkdir_p(path));
        FT_TRY(copy_file(sw->out[best], path, "adapter_config.json"));
        FT_TRY(copy_file(sw->out[best], path, "adapter_model.safetensors"));
        ft_train_info(k, FT_EV_INFO, "best trial %s: eval loss %.4f at step %lld; its adapter in %s",
                      sw->t->t[best].name, sw->res[best].best_eval_loss,
                      (long long)sw->res[best].best_eval_step, path);
    }
    ft_report_run *runs = calloc((size_t)sw->n, sizeof *runs);
    char **params = calloc((size_t)sw->n, sizeof *params);
    int64_t n = 0;
    for (int64_t i = 0; runs && params && i < sw->n; i++) {
        char m[SW_PATH];
        if (ft_path_join(m, sizeof m, sw->out[i], "metrics.jsonl") || !ft_path_exists(m)) continue;
        cJSON *o = cJSON_CreateObject();
        for (int j = 0; o && j < sw->t->n_keys; j++)
            cJSON_AddItemToObject(o, sw->t->keys[j]->name,
                                  ft_sweep_key_to_json(sw->t->keys[j], sw->t->t[i].vals[j]));
        params[n] = o ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        runs[n] = (ft_report_run){sw->out[i], sw->t->t[i].name,
                                  ft_trial_status_name(sw->sched.status[i]), params[n]};
        n++;
    }
    int rc = runs && params ? 0 : ft_err(-ENOMEM, "out of memory");
    FT_TRY(ft_path_join(path, sizeof path, dir, FT_REPORT_FILE));
    if (!rc && n > 0) rc = ft_report_write_runs(path, "ftune sweep", runs, n);
    if (!rc && n > 0) ft_train_info(k, FT_EV_INFO, "report: %s (%lld trials)", path, (long long)n);
    for (int64_t i = 0; params && i < n; i++) free(params[i]);
    free(params);
    free(runs);
    return rc;
}

/* --resume without --adapters-per-pass: the K of DIR/sweep.json's sweep (0 if it has none: the
 * read that follows names the problem). */
static int64_t resume_k(const char *path)
{
    const void *map;
    size_t size;
    if (ft_map_file(path, "sweep.json", &map, &size) < 0) {
        ft_err_clear();
        return 0;
    }
    cJSON *j = cJSON_ParseWithLength(map, size);
    ft_unmap_file(map, size);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "prune"),
                                                      "adapters_per_pass");
    int64_t K = cJSON_IsNumber(k) && k->valuedouble >= 1 && k->valuedouble <= FT_TRAIN_MAX_ADAPTERS
                    ? (int64_t)k->valuedouble : 0;
    cJSON_Delete(j);
    return K;
}

/* This rank's resume file: DIR/sweep.resume.json (rank 0, one process), DIR/sweep.resume.R.json
 * (rank R > 0): each holds its rank's trials (the others pending). */
static int resume_path(const sweep *sw, char *path, size_t n)
{
    if (sw->rank == 0) return ft_path_join(path, n, sw->c->base.out, FT_SWEEP_RESUME_FILE);
    char name[64];
    snprintf(name, sizeof name, "sweep.resume.%d.json", sw->rank);
    return ft_path_join(path, n, sw->c->base.out, name);
}

/* The sweep after the fixed part is checked: trials, base, state, the passes, the end. */
static int run(sweep *sw, ft_sweep_outcome *out)
{
    ft_train_job *r = sw->r;
    const ft_sweep_cfg *c = sw->c;
    FT_TRY(make_trials(sw));
    FT_TRY(ft_train_cfg_validate(&r->cfg));
    if (!r->cfg.model) return ft_err(FT_E_INVALID, "missing --model");
    if (!r->cfg.data || r->cfg.n_data < 1) return ft_err(FT_E_INVALID, "missing --data");
    FT_TRY(ft_peft_base_name(r->cfg.model, r->cfg.base_model_id, r->base_name, sizeof r->base_name,
                             &(const char *){NULL}));
    FT_TRY(resume_path(sw, sw->resume_json, sizeof sw->resume_json));
    if (c->resume && !c->adapters_per_pass) sw->k = resume_k(sw->resume_json);
    FT_TRY(open_base(sw));
    out->adapters_per_pass = r->n_ad;
    if (r->cfg.plan_only) return 0;
    if (c->prune == FT_PRUNE_HALVING && !r->d.n_eval_b)
        return ft_err(FT_E_INVALID, "sweep: --prune halving ranks the trials by eval loss, and "
                      "there are no eval examples (--eval-fraction 0 and no --eval-data)");
    int64_t total, warmup;
    schedule_of(r, &r->cfg, &total, &warmup);
    r->total = total;
    if (r->cfg.eval_every > 0 && r->d.n_eval_b)
        sw->n_rungs = ft_sweep_rung_steps(r->cfg.eval_every, c->eta, total, sw->rung, SW_MAX_RUNGS);
    FT_TRY(ft_sweep_sched_init(&sw->sched, sw->n, sw->rung, sw->n_rungs, c->prune, c->eta, r->n_ad));
    ft_sweep_results_init(sw->res, sw->n);
    FT_TRY(ft_mkdir_p(c->base.out));
    FT_TRY(ft_path_join(sw->json, sizeof sw->json, c->base.out, "sweep.json"));
    if (c->resume && !ft_path_exists(sw->resume_json))
        ft_train_info(&r->sink, FT_EV_WARN, "--resume: %s has no resume point yet (the first comes after --save-every %lld passes): the sweep starts over",
                      sw->resume_json, (long long)c->base.save_every);
    else if (c->resume)
        FT_TRY(ft_sweep_json_read(sw->resume_json, sw->t, &sw->sched, sw->res));
    FT_TRY(ft_sweep_ranks_set_aside(&sw->sched, sw->t, sw->rank, sw->size, sw->resume_json));
    if (sw->size > 1)
        ft_train_info(&r->sink, FT_EV_INFO, "sweep over %d ranks: trial t on rank t %% %d, each trained by its rank alone",
                      sw->size, sw->size);    for (int i = 0; i < FT_TRAIN_MAX_ADAPTERS; i++) sw->slot_trial[i] = -1;
    r->multi = 1;
    r->after_pass = after_pass;
    r->after_user = sw;
    int slot = 0;
    for (int64_t t = 0; t < sw->n; t++)
        if (sw->sched.status[t] == FT_TRIAL_RUNNING) FT_TRY(start_trial(sw, slot++, t, sw->res[t].steps));
    sw->dirty = 1;
    for (;;) {
        FT_TRY(settle(sw));
        int any = 0;
        for (int i = 0; i < r->n_ad; i++) any |= sw->slot_trial[i] >= 0;
        if (!any && sw->xrank) FT_TRY(ft_sweep_ranks_idle(sw->comm, sw->c->base.stop, &sw->stop));
        if (!any && sw->xrank && sw->stop) {
            FT_TRY(sync_state(sw, 1));
            out->stopped = 1;
            return 0;
        }
        if (!any) break;
        if (sw->t_loop == 0) sw->t_loop = ft_train_now_s();
        FT_TRY(ft_train_loop(r));
        sw->passes += r->n_pass;
        if (r->stopped) {
            FT_TRY(sync_state(sw, 1));
            out->stopped = 1;
            return 0;
        }
    }
    ft_exec_info xi;
    ft_exec_get_info(r->s.ex, &xi);
    ft_train_info(&r->sink, FT_EV_INFO, "sweep: %lld passes over the base: %lld layer fetches, %lld pack reads (the executor's counters, each shared by the trials of its pass)",
                  (long long)sw->passes, (long long)xi.layer_fetches, (long long)xi.pack_reads);
    FT_TRY(sync_state(sw, 1));
    FT_TRY(ft_sweep_ranks_gather(sw->comm, &sw->sched, sw->res));
    out->best = ft_sweep_best(&sw->sched, sw->res);
    if (sw->rank > 0) return 0; /* rank 0 writes the sweep's files */
    if (sw->size > 1) FT_TRY(ft_sweep_json_write(sw->json, sw->t, &sw->sched, sw->res));
    FT_TRY(write_outputs(sw, out->best));
    return 0;
}

int ft_sweep_run(const ft_sweep_cfg *c, ft_train_cb cb, void *user, ft_sweep_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->best = -1;
    FT_TRY(check_cfg(c));
    sweep *sw = calloc(1, sizeof *sw);
    ft_train_job *r = calloc(1, sizeof *r);
    const int64_t n = c->trials->n;
    int rc = 0;
    if (sw) {
        sw->tc = calloc((size_t)n, sizeof *sw->tc);
        sw->out = calloc((size_t)n, sizeof *sw->out);
        sw->resume = calloc((size_t)n, sizeof *sw->resume);
        sw->bad = calloc((size_t)n, sizeof *sw->bad);
        sw->tres = calloc((size_t)n, sizeof *sw->tres);
        sw->res = calloc((size_t)n, sizeof *sw->res);
    }
    if (!sw || !r || !sw->tc || !sw->out || !sw->resume || !sw->bad || !sw->tres || !sw->res) {
        rc = ft_err(-ENOMEM, "out of memory");
    } else {
        sw->c = c;
        sw->t = c->trials;
        sw->n = n;
        sw->r = r;
        sw->k = c->adapters_per_pass;
        r->cfg = c->base;
        r->cfg.comm = NULL; /* the passes train this rank's trials alone */
        sw->comm = c->base.comm;
        sw->rank = ft_comm_rank(sw->comm);
        sw->size = ft_comm_size(sw->comm);
        sw->xrank = sw->size > 1 && c->prune == FT_PRUNE_HALVING;
        if (sw->xrank) r->cfg.stop = &sw->stop; /* every rank stops after the same pass */
        r->sink = (ft_train_sink){cb, user};
        r->t0 = ft_train_now_s();
        rc = run(sw, out);
        out->time_s = ft_train_now_s() - r->t0;
        int64_t pos = sw->positions;
        for (int i = 0; i < r->n_ad; i++)
            if (sw->slot_trial[i] >= 0) pos += r->ad[i].st.positions - r->ad[i].positions0;
        double el = sw->t_loop > 0 ? ft_train_now_s() - sw->t_loop : 0;
        out->tokens_per_s = el > 0 ? pos / el : 0;
        if (sw->sched.status) {
            out->n_completed = ft_sweep_sched_count(&sw->sched, FT_TRIAL_COMPLETED);
            out->n_pruned = ft_sweep_sched_count(&sw->sched, FT_TRIAL_PRUNED);
            out->n_failed = ft_sweep_sched_count(&sw->sched, FT_TRIAL_FAILED);
        }
    }
    if (r) {
        for (int i = 0; i < FT_TRAIN_MAX_ADAPTERS; i++) ft_train_adapter_free(&r->ad[i]);
        ft_train_data_free(&r->d);
        ft_session_close(&r->s);
    }
    if (sw) {
        ft_sweep_sched_free(&sw->sched);
        free(sw->tc);
        free(sw->out);
        free(sw->resume);
        free(sw->bad);
        free(sw->tres);
        free(sw->res);
    }
    free(sw);
    free(r);
    return rc;
}
