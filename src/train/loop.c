/* loop.c - the step loop of a training run (train_run.h). Each optimizer step is the shared
 * part, then each adapter's:
 *   shared:  the stop request; the step's next grad_accum micro-batches (a new epoch re-packs
 *            with a new seed); one pass of the base over them (offload/exec.h: forward,
 *            head, backward, every layer fetched once for all micro-batches), timed into the
 *            timeline for --timeline;
 *   adapter: its loss and gradient norm, the bad-step rule, the clip and AdamW (optim.h),
 *            its metrics line and event; then its scheduled eval, early stopping and
 *            checkpoint (adapter.h).
 * Dropout masks and NEFTune noise are pure functions of (seed, step), so a resumed run draws
 * the same ones and needs no RNG state. */
#include "src/train/train_run.h"

#include <stdio.h>
#include <string.h>

#include "src/core/err.h"
#include "src/train/eval.h"

/* 1 while adapter a has steps to take. */
static int active(const ft_train_adapter *a)
{
    return !a->early && a->st.step < a->st.total_steps;
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
    const int64_t left = r->d.n_train_b - pos->cursor, ga = r->cfg.grad_accum;
    *n_mb = left < ga ? left : ga;
    *mbs = &r->d.train_b[pos->cursor];
    pos->cursor += *n_mb;
    for (int i = 1; i < r->n_ad; i++) {
        r->ad[i].st.epoch = pos->epoch;
        r->ad[i].st.cursor = pos->cursor;
    }
    return 0;
}

/* One pass of the base over the step's micro-batches mbs[0..n_mb): the forward and backward of
 * the adapter, its gradients accumulated from zero; out gets its loss. The executor runs one
 * adapter (the session's, r->ad[0]); several in one pass are issue 32's. */
static int pass(ft_train_job *r, int64_t step, const ft_batch *mbs, int64_t n_mb,
                ft_train_step_out *out)
{
    ft_train_adapter *a = &r->ad[0];
    ft_exec *ex = r->s.ex;
    int64_t n_targets = 0, step_pairs = 0;
    for (int64_t i = 0; i < n_mb; i++) {
        n_targets += mbs[i].n_targets;
        step_pairs += mbs[i].n_pairs;
    }
    FT_TRY(ft_optim_zero_grad(&a->opt));
    uint64_t dseed = ft_train_adapter_dropout_seed(a, step);
    ft_exec_set_neftune(ex, r->cfg.neftune_noise_alpha, ft_train_adapter_neftune_seed(a, step));
    memset(out, 0, sizeof *out);
    out->dpo = (ft_dpo_step){.cfg = &a->cfg->dpo, .ref = a->ref_train, .step_pairs = step_pairs};
    if (a->cfg->method == FT_METHOD_DPO) {
        FT_TRY(ft_exec_train_step_seq(ex, mbs, n_mb, ft_dpo_step_grad, &out->dpo, dseed));
        out->loss_sum = out->dpo.st.loss; /* the mean over the step's pairs: adapter.c */
        out->n_tokens = out->dpo.st.tokens;
        return 0;
    }
    return ft_exec_train_step(ex, mbs, n_mb, n_targets, dseed, &out->loss_sum, &out->n_tokens);
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
    int64_t positions = 0;
    for (int64_t i = 0; i < n_mb; i++) positions += mbs[i].T;
    ft_train_step_time tm = {r->t0, r->loop_t0, ft_train_now_s()};
    int tl_on = c->timeline && (step == start + 1 || (r->total - start == 1));
    if (tl_on) ft_exec_set_timeline(r->s.ex, &r->tl);
    ft_train_step_out out[FT_TRAIN_MAX_ADAPTERS];
    FT_TRY(pass(r, step, mbs, n_mb, out));
    if (tl_on) FT_TRY(timeline_end(r, step, mbs, n_mb));
    for (int i = 0; i < r->n_ad; i++)
        if (active(&r->ad[i]))
            FT_TRY(ft_train_adapter_update(&r->ad[i], step, &out[i], positions, &tm, &r->sink));
    if (c->profile && step + 1 == start + 1) profile_start(r, step + 1);
    for (int i = 0; i < r->n_ad; i++)
        if (r->ad[i].st.step == step + 1)
            FT_TRY(ft_train_adapter_after_step(&r->ad[i], &r->s, &r->d, r->t0, &r->sink));
    return 0;
}

int ft_train_loop(ft_train_job *r)
{
    const ft_train_cfg *c = &r->cfg;
    int any = 0;
    for (int i = 0; i < r->n_ad; i++) {
        ft_train_adapter *a = &r->ad[i];
        a->start = a->st.step;
        a->positions0 = a->st.positions;
        a->base_s = a->st.elapsed_s; /* run time of earlier sessions */
        /* a resume from the final checkpoint of an early-stopped run stops again at once
         * (unless a larger --early-stopping-patience lets it go on) */
        a->early = a->st.step < a->st.total_steps && ft_train_early_stop(a, &r->sink);
        any |= active(a);
    }
    r->loop_t0 = ft_train_now_s();
    r->prof_step0 = -1;
    memset(&r->tl, 0, sizeof r->tl);
    for (int64_t step = r->ad[0].st.step; any; step++) {
        if (c->stop && *c->stop) {
            r->stopped = 1;
            break;
        }
        FT_TRY(one_step(r, step));
        any = 0;
        for (int i = 0; i < r->n_ad; i++) any |= active(&r->ad[i]);
    }
    int all_early = 1;
    for (int i = 0; i < r->n_ad; i++) all_early &= r->ad[i].early;
    if (!all_early && c->stop && *c->stop) r->stopped = 1;
    if (r->prof_step0 >= 0) FT_TRY(profile_report(r, r->ad[0].st.step));
    return 0;
}
