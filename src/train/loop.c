/* loop.c - the step loop of a training run (train_run.h). Each optimizer step is the shared
 * part, then each adapter's:
 *   shared:  the stop request; the step's next grad_accum micro-batches (a new epoch re-packs
 *            with a new seed); one pass of the base over them (offload/exec.h: forward,
 *            head, backward, every layer fetched once for all micro-batches), timed into the
 *            timeline for --timeline;
 *   adapter: its loss and gradient norm, the bad-step rule, the clip and AdamW (optim.h),
 *            its metrics line and event; then its scheduled eval, early stopping and
 *            checkpoint (adapter.h).
 * A multi-adapter job (a sweep, train_run.h multi) runs all its active adapters' steps in one
 * pass of the base (ft_exec_train_step_multi), each from its own data position, then each one's
 * part, then the job's after_pass.
 * Dropout masks and NEFTune noise are pure functions of (seed, step), so a resumed run draws
 * the same ones and needs no RNG state. */
#include "src/train/train_run.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "src/core/err.h"
#include "src/train/dist.h"
#include "src/train/eval.h"

int ft_train_adapter_active(const ft_train_adapter *a)
{
    return a->cfg && !a->early && !a->pruned && !a->failed && a->st.step < a->st.total_steps;
}

static int active(const ft_train_adapter *a)
{
    return ft_train_adapter_active(a);
}

/* Where adapter a's events go. */
static const ft_train_sink *sink_of(const ft_train_job *r, const ft_train_adapter *a)
{
    return a->sink.cb ? &a->sink : &r->sink;
}

/* The step's micro-batches from the pass position (the adapters', in step with each other:
 * r->ad[0]'s is theirs), which advances past them; a new epoch re-packs with a new seed. */
static int next_micro_batches(ft_train_job *r, const ft_batch **mbs, int64_t *n_mb)
{
    ft_ckpt_state *pos = &r->ad[0].st;
    if (pos->cursor >= r->d.n_train_b) {
        pos->epoch++;
        pos->cursor = 0;
        FT_TRY(ft_train_data_pack_epoch(&r->d, &r->cfg, pos->epoch));
    }
    const int64_t left = r->d.n_train_b - pos->cursor, ga = ft_train_dist_global_accum(&r->cfg);
    *n_mb = left < ga ? left : ga;
    *mbs = &r->d.train_b[pos->cursor];
    pos->cursor += *n_mb;
    for (int i = 1; i < r->n_ad; i++) {
        r->ad[i].st.epoch = pos->epoch;
        r->ad[i].st.cursor = pos->cursor;
    }
    return 0;
}

/* A multi-adapter job: adapter a's next micro-batches from its own position and packing,
 * as next_micro_batches does for a run's one position. */
static int own_micro_batches(ft_train_job *r, ft_train_adapter *a, const ft_batch **mbs,
                             int64_t *n_mb)
{
    ft_ckpt_state *pos = &a->st;
    if (pos->cursor >= a->n_own_b && a->own_b) {
        pos->epoch++;
        pos->cursor = 0;
    }
    if (!a->own_b || a->own_epoch != pos->epoch) FT_TRY(ft_train_adapter_pack(a, &r->d));
    const int64_t left = a->n_own_b - pos->cursor, ga = r->cfg.grad_accum;
    *n_mb = left < ga ? left : ga;
    *mbs = &a->own_b[pos->cursor];
    pos->cursor += *n_mb;
    return 0;
}

/* The targets and token positions of mbs[0..n_mb). */
static void count(const ft_batch *mbs, int64_t n_mb, int64_t *targets, int64_t *pairs,
                  int64_t *positions)
{
    *targets = *pairs = *positions = 0;
    for (int64_t i = 0; i < n_mb; i++) {
        *targets += mbs[i].n_targets;
        *pairs += mbs[i].n_pairs;
        *positions += mbs[i].T;
    }
}

/* One pass of the base over the step's micro-batches mbs[0..n_mb): the forward and backward of
 * the adapter, its gradients accumulated from zero; out gets its loss. */
static int pass(ft_train_job *r, int64_t step, const ft_batch *mbs, int64_t n_mb,
                ft_train_step_out *out)
{
    ft_train_adapter *a = &r->ad[0];
    ft_exec *ex = r->s.ex;
    int64_t n_targets, step_pairs, positions;
    count(mbs, n_mb, &n_targets, &step_pairs, &positions);
    FT_TRY(ft_optim_zero_grad(&a->opt));
    int64_t n_all = n_mb; /* data-parallel: this rank's share of the step (dist.h) */
    int64_t mb_base = 0;
    ft_train_dist_share(&r->cfg, mbs, n_all, &mbs, &n_mb, &mb_base);
    ft_exec_set_mb_base(ex, mb_base);
    uint64_t dseed = ft_train_adapter_dropout_seed(a, step);
    ft_exec_set_neftune(ex, r->cfg.neftune_noise_alpha, ft_train_adapter_neftune_seed(a, step));
    memset(out, 0, sizeof *out);
    out->dpo = (ft_dpo_step){.cfg = &a->cfg->dpo, .ref = a->ref_train, .step_pairs = step_pairs};
    if (a->cfg->method == FT_TRAIN_METHOD_DPO) {
        FT_TRY(ft_exec_train_step_seq(ex, mbs, n_mb, ft_dpo_step_grad, &out->dpo, dseed));
        out->loss_sum = out->dpo.st.loss; /* the mean over the step's pairs: adapter.c */
        out->n_tokens = out->dpo.st.tokens;
        return 0;
    }
    if (n_mb == 0) return 0; /* the step's last micro-batches did not reach this rank */
    return ft_exec_train_step(ex, mbs, n_mb, n_targets, dseed, &out->loss_sum, &out->n_tokens);
}

/* A multi-adapter job's pass: each active adapter's next micro-batches (on[i] = 1 for those,
 * positions[i] their token positions), all of them forward and backward in one pass of the
 * base (ft_exec_train_step_multi), each with its own gradients, dropout and NEFTune; out[i]
 * gets adapter i's loss. *first: an adapter's first micro-batch (for the timeline title). */
static int pass_multi(ft_train_job *r, int *on, int64_t *positions, ft_train_step_out *out,
                      const ft_batch **first, int64_t *first_n)
{
    ft_exec_adapter_step st[FT_TRAIN_MAX_ADAPTERS];
    int64_t K = 0;
    *first = NULL;
    for (int i = 0; i < r->n_ad; i++) {
        ft_train_adapter *a = &r->ad[i];
        on[i] = active(a);
        if (!on[i]) continue;
        const ft_batch *mbs;
        int64_t n_mb, n_targets, pairs;
        FT_TRY(own_micro_batches(r, a, &mbs, &n_mb));
        count(mbs, n_mb, &n_targets, &pairs, &positions[i]);
        if (!*first) {
            *first = mbs;
            *first_n = n_mb;
        }
        FT_TRY(ft_optim_zero_grad(&a->opt));
        memset(&out[i], 0, sizeof out[i]);
        const int64_t step = a->st.step;
        st[K++] = (ft_exec_adapter_step){&a->lora, mbs, n_mb, n_targets,
                                         ft_train_adapter_dropout_seed(a, step),
                                         a->cfg->neftune_noise_alpha,
                                         ft_train_adapter_neftune_seed(a, step), &out[i].loss_sum,
                                         &out[i].n_tokens};
    }
    return K ? ft_exec_train_step_multi(r->s.ex, st, K) : 0;
}

/* --timeline: the step recorded is the session's second (its first when it has one), drawn
 * into the SVG file once it ends. */
static int timeline_end(ft_train_job *r, int64_t step, const ft_batch *mbs, int64_t n_mb)
{
    const ft_train_cfg *c = &r->cfg;
    ft_exec_set_timeline(r->s.ex, NULL);
    char title[512];
    snprintf(title, sizeof title, "ftune step %lld: %lld micro-batches of %lld tokens, %s",
             (long long)step + 1, (long long)n_mb, (long long)mbs[0].T, c->model);
    FT_TRY(ft_timeline_write_svg(&r->tl, c->timeline, title));
    ft_train_info(&r->sink, FT_EV_INFO, "timeline: %s: step %.3f s, compute busy %.3f s, H2D %.3f s, disk %.3f s",
                  c->timeline, ft_timeline_span(&r->tl), ft_timeline_busy(&r->tl, FT_TL_COMPUTE),
                  ft_timeline_busy(&r->tl, FT_TL_H2D), ft_timeline_busy(&r->tl, FT_TL_DISK));
    return 0;
}

/* --profile: the first step warms up; the steps after it are timed per op. */
static void profile_start(ft_train_job *r, int64_t step_done)
{
    if (ft_backend_profile(r->s.be, 1) == 0) {
        r->prof_t0 = ft_train_now_s();
        r->prof_step0 = step_done;
    } else {
        ft_train_info(&r->sink, FT_EV_WARN, "--profile: %s", ft_errmsg());
    }
}

/* The profile table of the timed steps, after the loop. */
static int profile_report(ft_train_job *r, int64_t last_step)
{
    char tab[4096];
    double wall = ft_train_now_s() - r->prof_t0;
    FT_TRY(ft_backend_profile_report(r->s.be, tab, sizeof tab, 1));
    FT_TRY(ft_backend_profile(r->s.be, 0));
    ft_train_info(&r->sink, FT_EV_INFO, "profile: GPU time per op over steps %lld-%lld (%.1f ms of wall time per step):",
                  (long long)r->prof_step0 + 1, (long long)last_step,
                  last_step > r->prof_step0 ? 1e3 * wall / (double)(last_step - r->prof_step0) : 0.0);
    for (char *line = strtok(tab, "\n"); line; line = strtok(NULL, "\n"))
        ft_train_info(&r->sink, FT_EV_INFO, "profile: %s", line);
    return 0;
}

/* One optimizer step `step` (0-based): the shared pass, then each active adapter's part. */
static int one_step(ft_train_job *r, int64_t step)
{
    const ft_train_cfg *c = &r->cfg;
    const int64_t start = r->ad[0].start;
    const ft_batch *mbs;
    int64_t n_mb;
    FT_TRY(next_micro_batches(r, &mbs, &n_mb));
    if (c->test.kill_at_step > 0 && step + 1 == c->test.kill_at_step &&
        ft_comm_rank(c->comm) == c->test.kill_rank)
        raise(c->test.kill_signal ? c->test.kill_signal : SIGKILL);
    int64_t positions = 0;
    for (int64_t i = 0; i < n_mb; i++) positions += mbs[i].T;
    ft_train_step_time tm = {r->t0, r->loop_t0, ft_train_now_s()};
    int tl_on = c->timeline && (step == start + 1 || (r->total - start == 1));
    if (tl_on) ft_exec_set_timeline(r->s.ex, &r->tl);
    ft_train_step_out out[1];
    FT_TRY(pass(r, step, mbs, n_mb, out));
    FT_TRY(ft_train_dist_reduce(c, &r->ad[0].lora, &out[0].loss_sum, &out[0].n_tokens));
    if (tl_on) FT_TRY(timeline_end(r, step, mbs, n_mb));
    ft_train_adapter *a = &r->ad[0];
    FT_TRY(ft_train_adapter_update(a, step, &out[0], positions, &tm, &r->sink));
    if (c->profile && step + 1 == start + 1) profile_start(r, step + 1);
    return ft_train_adapter_after_step(a, &r->s, &r->d, r->t0, &r->sink);
}

/* An adapter's own step part (its update, eval, checkpoint) that failed with rc: in a
 * multi-adapter job that adapter alone stops (a->failed, its message kept); the others go on. */
static void own_error(ft_train_adapter *a, int rc)
{
    if (!rc) return;
    a->failed = rc;
    snprintf(a->error, sizeof a->error, "%s", ft_errmsg());
    ft_err_clear();
}

/* A multi-adapter job's scheduled mid-run evaluations after this pass (on[i] and due as
 * ft_train_adapter_after_step's rule: an eval set, eval_every, a step before the end), done
 * together: each eval micro-batch in one forward pass for all of them (ft_exec_eval_multi:
 * the base fetched once per batch whatever their number), the sums in ft_train_evaluate's
 * order, so each adapter gets the loss of its eval alone; ft_train_eval_log logs them. */
static int shared_evals(ft_train_job *r, const int *on)
{
    const ft_train_data *d = &r->d;
    ft_exec_adapter_step st[FT_TRAIN_MAX_ADAPTERS];
    double ls[FT_TRAIN_MAX_ADAPTERS], sum[FT_TRAIN_MAX_ADAPTERS];
    int64_t nv[FT_TRAIN_MAX_ADAPTERS], cnt[FT_TRAIN_MAX_ADAPTERS];
    int idx[FT_TRAIN_MAX_ADAPTERS];
    int64_t K = 0, nb = d->n_eval_b;
    for (int i = 0; i < r->n_ad; i++) {
        const ft_train_adapter *a = &r->ad[i];
        const ft_train_cfg *c = a->cfg;
        if (!on[i] || a->failed || !d->n_eval_b || c->eval_every <= 0 || c->method == FT_TRAIN_METHOD_DPO ||
            a->st.step >= a->st.total_steps || a->st.step % c->eval_every)
            continue;
        if (K && c->eval_max_batches != r->ad[idx[0]].cfg->eval_max_batches) continue;
        idx[K++] = i;
    }
    if (K < 2) return 0; /* one alone: its own eval as ft_train_run's */
    const int64_t cap = r->ad[idx[0]].cfg->eval_max_batches;
    if (cap > 0 && nb > cap) nb = cap;
    for (int64_t k = 0; k < K; k++) {
        sum[k] = 0;
        cnt[k] = 0;
    }
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t k = 0; k < K; k++)
            st[k] = (ft_exec_adapter_step){&r->ad[idx[k]].lora, &d->eval_b[b], 1, 0, 0, 0, 0,
                                           &ls[k], &nv[k]};
        FT_TRY(ft_exec_eval_multi(r->s.ex, st, K));
        for (int64_t k = 0; k < K; k++) {
            sum[k] += ls[k];
            cnt[k] += nv[k];
        }
    }
    for (int64_t k = 0; k < K; k++) {
        ft_train_adapter *a = &r->ad[idx[k]];
        a->pre_eval = 1;
        a->pre_loss = cnt[k] ? sum[k] / (double)cnt[k] : NAN;
        a->pre_tokens = cnt[k];
    }
    return 0;
}

/* One pass of a multi-adapter job: each active adapter's step (its own step count), then its
 * update and its scheduled eval and checkpoint; then the job's after_pass. */
static int one_pass(ft_train_job *r)
{
    const ft_train_cfg *c = &r->cfg;
    int on[FT_TRAIN_MAX_ADAPTERS];
    int64_t positions[FT_TRAIN_MAX_ADAPTERS];
    ft_train_step_out out[FT_TRAIN_MAX_ADAPTERS];
    ft_train_step_time tm = {r->t0, r->loop_t0, ft_train_now_s()};
    int tl_on = c->timeline && r->n_pass == 1;
    if (tl_on) ft_exec_set_timeline(r->s.ex, &r->tl);
    const ft_batch *first;
    int64_t first_n = 0;
    FT_TRY(pass_multi(r, on, positions, out, &first, &first_n));
    if (tl_on && first) FT_TRY(timeline_end(r, r->n_pass, first, first_n));
    for (int i = 0; i < r->n_ad; i++)
        if (on[i])
            own_error(&r->ad[i], ft_train_adapter_update(&r->ad[i], r->ad[i].st.step, &out[i],
                                                         positions[i], &tm, sink_of(r, &r->ad[i])));
    if (c->profile && r->n_pass == 0) profile_start(r, 1);
    FT_TRY(shared_evals(r, on));
    for (int i = 0; i < r->n_ad; i++)
        if (on[i] && !r->ad[i].failed)
            own_error(&r->ad[i], ft_train_adapter_after_step(&r->ad[i], &r->s, &r->d, r->t0,
                                                             sink_of(r, &r->ad[i])));
    r->n_pass++;
    return r->after_pass ? r->after_pass(r->after_user, r) : 0;
}

/* 1 while some adapter of r has steps to take. */
static int any_active(const ft_train_job *r)
{
    for (int i = 0; i < r->n_ad; i++)
        if (active(&r->ad[i])) return 1;
    return 0;
}

int ft_train_loop(ft_train_job *r)
{
    const ft_train_cfg *c = &r->cfg;
    for (int i = 0; i < r->n_ad; i++) {
        ft_train_adapter *a = &r->ad[i];
        if (!a->cfg) continue;
        a->start = a->st.step;
        a->positions0 = a->st.positions;
        a->base_s = a->st.elapsed_s; /* run time of earlier sessions */
        /* a resume from the final checkpoint of an early-stopped run stops again at once
         * (unless a larger --early-stopping-patience lets it go on) */
        a->early = a->st.step < a->st.total_steps && ft_train_early_stop(a, sink_of(r, a));
    }
    r->loop_t0 = ft_train_now_s();
    r->prof_step0 = -1;
    r->n_pass = 0;
    memset(&r->tl, 0, sizeof r->tl);
    for (int64_t step = r->ad[0].st.step; any_active(r); step++) {
        if (c->stop && *c->stop) {
            r->stopped = 1;
            break;
        }
        FT_TRY(r->multi ? one_pass(r) : one_step(r, step));
    }
    int all_early = 1;
    for (int i = 0; i < r->n_ad; i++) all_early &= !r->ad[i].cfg || r->ad[i].early;
    if (!all_early && c->stop && *c->stop) r->stopped = 1;
    if (r->prof_step0 >= 0)
        FT_TRY(profile_report(r, r->multi ? r->n_pass : r->ad[0].st.step));
    return 0;
}
