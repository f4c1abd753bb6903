/* adapter.c - one adapter being trained: set-up, start or resume, the per-step update, its
 * checkpoints (see adapter.h). */
#include "src/train/adapter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/train/dist.h"
#include "src/train/dpo_refcache.h"
#include "src/train/eval.h"
#include "src/train/run_config.h"

int ft_train_adapter_init(ft_train_adapter *a, const ft_train_cfg *c, ft_session *s,
                          const char *base_name, ft_train_result *res)
{
    memset(a, 0, sizeof *a);
    a->cfg = c;
    a->res = res;
    a->base_name = base_name;
    a->eval_reward_accuracy = NAN;
    a->saved_step = -1;
    ft_lora_cfg lc = c->lora;
    lc.seed = c->seed;
    if (c->init_adapter) {
        ft_lora_cfg from;
        FT_TRY(ft_peft_read_config(c->init_adapter, &from));
        lc.r = from.r;
        lc.alpha = from.alpha;
        lc.use_rslora = from.use_rslora;
        lc.targets = from.targets;
    }
    a->lc = lc;
    FT_TRY(ft_lora_init(&a->lora, s->model, &lc, s->be));
    a->lora_ok = 1;
    FT_TRY(ft_eval_samples_load(&a->samples, c->eval_prompts, s, &a->lora,
                                c->data_cfg.chat_template, c->eval_max_new_tokens));
    /* DPO on resume: the reference pass reads the starting adapter before the checkpoint's */
    if (c->init_adapter && (!c->resume || c->method == FT_TRAIN_METHOD_DPO))
        FT_TRY(ft_peft_load_weights(c->init_adapter, &a->lora));
    return 0;
}

int ft_train_adapter_plan(ft_train_adapter *a, const ft_session *s, const ft_train_data *d,
                          int64_t total, int64_t warmup)
{
    const ft_train_cfg *c = a->cfg;
    ft_optim_cfg oc = {c->lr, c->schedule, warmup, total, c->min_lr_ratio, c->adam_beta1,
                       c->adam_beta2, c->adam_eps, c->weight_decay, c->max_grad_norm,
                       c->loraplus_lr_ratio};
    FT_TRY(ft_optim_init(&a->opt, &oc, &a->lora));
    char dpo_ref[64] = "";
    if (c->method == FT_TRAIN_METHOD_DPO) FT_TRY(ft_train_dpo_reference_id(c, dpo_ref, sizeof dpo_ref));
    a->cfg_json = ft_train_run_config(c, &a->lc, s->model, &d->ds, d->seq_len, total, warmup,
                                      a->lora.n_params, s->quant, dpo_ref);
    if (!a->cfg_json) return ft_err(-ENOMEM, "out of memory");
    ft_ckpt_state *st = &a->st;
    memset(st, 0, sizeof *st);
    a->res->total_steps = st->total_steps = total;
    st->warmup_steps = warmup;
    st->initial_eval_loss = st->last_eval_loss = st->last_loss = st->best_eval_loss = NAN;
    return 0;
}

/* A run id for a fresh start: time and pid, mixed (identifies the run's checkpoints). */
static void new_run_id(char *out, size_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 40);
    snprintf(out, n, "%016llx", (unsigned long long)ft_splitmix64(&x));
}

/* The key of a's DPO reference in OUT/dpo_reference.bin (dpo_refcache.h). */
static void dpo_ref_key(const ft_train_adapter *a, const ft_session *s, const ft_train_data *d,
                        ft_dpo_ref_key *key)
{
    memset(key, 0, sizeof *key);
    snprintf(key->run_id, sizeof key->run_id, "%s", a->st.run_id);
    ft_train_eval_set_id(d, a->cfg->eval_max_batches, key->eval_set, sizeof key->eval_set);
    /* a bf16 base read from its pack (streamed, or a pack-only folder) has the pack's bf16
     * embeddings and LM head, the resident one the checkpoint's: for an fp32/fp16 checkpoint
     * the reference differs, so the two are told apart ("cuda+pack") */
    snprintf(key->backend, sizeof key->backend, "%.10s%s", s->be->ops->name,
             s->pack && s->quant == FT_PACK_QUANT_BF16 ? "+pack" : "");
    key->quant = s->quant;
    /* the model itself: a resume may name another folder or file of the same shapes */
    if (s->pack) key->model_id = ft_pack_header(s->pack)->identity;
    else if (ft_pack_model_identity(a->cfg->model, &key->model_id) < 0) key->model_id = 0;
}

/* The reference log-probabilities of every train and eval pair, with the executor on a's
 * adapter as it is now; got_* say which were read back instead. */
static int dpo_ref_compute(ft_train_adapter *a, ft_session *s, const ft_train_data *d,
                           int got_train, int got_eval)
{
    const int64_t np_train = d->ds.n_train / 2, np_eval = d->ds.n_eval / 2;
    ft_lora *was = ft_session_swap_adapter(s, &a->lora);
    int rc = 0;
    if (!got_train)
        rc = ft_dpo_reference(s->ex, d->train_b, d->n_train_b, 0, a->ref_train, np_train);
    if (!rc && d->n_eval_b && !got_eval)
        rc = ft_dpo_reference(s->ex, d->eval_b, d->n_eval_b, a->cfg->eval_max_batches, a->ref_eval,
                              np_eval);
    ft_session_swap_adapter(s, was);
    return rc;
}

/* DPO: the reference log-probabilities of every train and eval pair (dpo_run.h), from the
 * adapter as it is now: the run's starting adapter (a resume calls this before loading the
 * checkpoint's). They are kept in OUT/dpo_reference.bin under the run id st.run_id, and a
 * resume reads back the parts of its run (dpo_refcache.h) instead of computing them again. */
static int dpo_reference(ft_train_adapter *a, ft_session *s, const ft_train_data *d,
                         const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    double tr0 = ft_train_now_s();
    int64_t np_train = d->ds.n_train / 2, np_eval = d->ds.n_eval / 2;
    a->ref_train = calloc((size_t)(2 * (np_train ? np_train : 1)), sizeof *a->ref_train);
    a->ref_eval = calloc((size_t)(2 * (np_eval ? np_eval : 1)), sizeof *a->ref_eval);
    if (!a->ref_train || !a->ref_eval) return ft_err(-ENOMEM, "out of memory for reference log-probabilities");
    if (ft_dpo_reference_free(c->dpo.loss_type)) { /* the arrays stay zero, unread */
        char g[64] = "";
        if (c->dpo.loss_type == FT_DPO_SIMPO) snprintf(g, sizeof g, ", gamma %g", c->dpo.simpo_gamma);
        ft_train_info(k, FT_EV_INFO, "preference optimization (%s loss, beta %g%s): reference-free, on the log-probabilities averaged per completion token; %lld train and %lld eval pairs",
                      ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, g, (long long)np_train, (long long)np_eval);
        return 0;
    }
    ft_dpo_ref_key key;
    dpo_ref_key(a, s, d, &key);
    int got_train = 0, got_eval = 0;
    char why[512] = "";
    if (c->resume)
        FT_TRY(ft_dpo_ref_load(c->out, &key, a->ref_train, np_train, a->ref_eval, np_eval,
                               &got_train, &got_eval, why, sizeof why));
    if (why[0]) ft_train_info(k, FT_EV_INFO, "DPO reference log-probabilities computed again: %s", why);
    FT_TRY(dpo_ref_compute(a, s, d, got_train, got_eval));
    if (!got_train || !got_eval) {
        int rc = ft_dpo_ref_save(c->out, &key, a->ref_train, np_train, a->ref_eval, np_eval);
        if (rc < 0) /* the run goes on: a resume would compute them again */
            ft_train_info(k, FT_EV_WARN, "could not keep the DPO reference log-probabilities: %s", ft_errmsg());
    }
    char ls[64] = "";
    if (c->dpo.loss_type == FT_DPO_ROBUST)
        snprintf(ls, sizeof ls, ", label smoothing %g", c->dpo.label_smoothing);
    const char *from = c->init_adapter ? "base model with --init-adapter" : "base model";
    if (got_train && got_eval)
        ft_train_info(k, FT_EV_INFO, "DPO (%s loss, beta %g%s): reference log-probabilities of %lld train and %lld eval pairs from the %s, read back from %s/%s",
                      ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, ls, (long long)np_train,
                      (long long)np_eval, from, c->out, FT_DPO_REF_FILE);
    else
        ft_train_info(k, FT_EV_INFO, "DPO (%s loss, beta %g%s): reference log-probabilities of %lld train and %lld eval pairs from the %s, in %.1f s%s",
                      ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, ls, (long long)np_train,
                      (long long)np_eval, from, ft_train_now_s() - tr0,
                      got_train ? " (the train pairs' read back, the eval pairs' computed)" : "");
    return 0;
}

/* Loads the checkpoint cfg->resume into a after checking its config against a's; the data
 * of its epoch are packed in d. */
static int resume_from(ft_train_adapter *a, ft_session *s, ft_train_data *d, const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    char *saved = NULL;
    ft_ckpt_state want = *st;
    int rc = ft_ckpt_load(c->resume, st, &saved, NULL);
    if (rc < 0) return ft_err_prefix(rc, "--resume %s", c->resume);
    rc = ft_train_config_check(saved, a->cfg_json, c->resume);
    free(saved);
    FT_TRY(rc);
    /* DPO: the reference is the starting adapter, still in a->lora until the load below */
    if (c->method == FT_TRAIN_METHOD_DPO) FT_TRY(dpo_reference(a, s, d, k));
    rc = ft_ckpt_load(c->resume, st, NULL, &a->lora);
    if (rc < 0) return ft_err_prefix(rc, "--resume %s", c->resume);
    if (st->total_steps != want.total_steps || st->warmup_steps != want.warmup_steps)
        return ft_err(FT_E_INVALID, "--resume %s: schedule of %lld steps (warmup %lld), this run has %lld (%lld)",
                      c->resume, (long long)st->total_steps, (long long)st->warmup_steps,
                      (long long)want.total_steps, (long long)want.warmup_steps);
    if (st->epoch > 0) FT_TRY(ft_train_data_pack_epoch(d, c, st->epoch));
    if (st->cursor > d->n_train_b)
        return ft_err(FT_E_CORRUPT, "%s/" FT_CKPT_STATE_FILE ": \"cursor\" %lld beyond the %lld micro-batches of epoch %lld",
                      c->resume, (long long)st->cursor, (long long)d->n_train_b, (long long)st->epoch);
    return 0;
}

int ft_train_adapter_open(ft_train_adapter *a, ft_session *s, ft_train_data *d,
                          const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    char path[4200];
    const int w = ft_train_dist_writer(c); /* data-parallel: only rank 0 writes (dist.h) */
    if (w) FT_TRY(ft_mkdir_p(c->out));
    FT_TRY(ft_path_join(path, sizeof path, c->out, "metrics.jsonl"));
    int64_t latest = -1;
    int n_old = ft_ckpt_count(c->out, &latest);
    if (c->resume) {
        FT_TRY(resume_from(a, s, d, k));
        a->res->resumed_from = st->step;
        snprintf(a->res->checkpoint, sizeof a->res->checkpoint, "%s", c->resume);
        ft_train_info(k, FT_EV_INFO, "resuming from %s: step %lld/%lld, epoch %lld, micro-batch %lld/%lld, %lld bad steps so far",
                      c->resume, (long long)st->step, (long long)st->total_steps, (long long)st->epoch,
                      (long long)st->cursor, (long long)d->n_train_b, (long long)st->bad_steps);
        if (latest > st->step)
            ft_train_info(k, FT_EV_INFO, "note: %s holds checkpoints after step %lld (up to %s%lld); they are removed at this run's next checkpoint",
                          c->out, (long long)st->step, FT_CKPT_PREFIX, (long long)latest);
        if (w) FT_TRY(ft_metrics_open_resume(&a->met, path, st->step, st->step < st->total_steps));
        ft_train_resume_eval_set(a, d, k);
        if (c->save_best && w) FT_TRY(ft_train_resume_best(a, k));
        a->saved_step = st->step;
    } else {
        new_run_id(st->run_id, sizeof st->run_id);
        if (c->method == FT_TRAIN_METHOD_DPO) FT_TRY(dpo_reference(a, s, d, k));
        if (c->save_best && w) /* an earlier run's */
            ft_ckpt_adapter_cleanup(c->out, FT_CKPT_BEST_DIR, 1);
        ft_train_eval_set_id(d, c->eval_max_batches, st->eval_set, sizeof st->eval_set);
        if (n_old > 0)
            ft_train_info(k, FT_EV_INFO, "note: %s holds %d checkpoint(s) of an earlier run (latest %s%lld); this run starts over and removes them at its first checkpoint (stop now and add --resume to continue that run instead)",
                          c->out, n_old, FT_CKPT_PREFIX, (long long)latest);
        if (w) FT_TRY(ft_metrics_open(&a->met, path));
    }
    if (w) FT_TRY(ft_metrics_tensorboard(&a->met, c->tensorboard));
    if (w)
        FT_TRY(ft_eval_samples_open(&a->samples, c->out, c->resume != NULL, st->step,
                                    st->step < st->total_steps, d->n_eval_b > 0, a->met.tb));
    else
        a->samples.on = 0; /* data-parallel: rank 0 alone writes the sample replies */
    return 0;
}

uint64_t ft_train_adapter_dropout_seed(const ft_train_adapter *a, int64_t step)
{
    return a->lc.dropout > 0 ? ft_seed_derive(a->cfg->seed, FT_SEED_DROPOUT, step) : 0;
}

uint64_t ft_train_adapter_neftune_seed(const ft_train_adapter *a, int64_t step)
{
    return ft_seed_derive(a->cfg->seed, FT_SEED_NEFTUNE, step);
}

/* A skipped step's warning: which value is not finite, the counts. */
static void bad_step_warn(const ft_train_adapter *a, int64_t step, double loss, double gnorm,
                          const ft_train_sink *k)
{
    char ls[32], gs[32];
    snprintf(ls, sizeof ls, isnan(loss) ? "NaN" : "%g", loss);
    snprintf(gs, sizeof gs, isnan(gnorm) ? "NaN" : "%g", gnorm);
    ft_train_info(k, FT_EV_WARN, "step %lld: %s is not finite (loss %s, gradient norm %s); step skipped, no update (%lld bad steps, %lld in a row, --max-bad-steps %lld)",
                  (long long)step + 1, !isfinite(loss) ? "the loss" : "the gradient norm", ls, gs,
                  (long long)a->st.bad_steps, (long long)a->st.bad_run,
                  (long long)a->cfg->max_bad_steps);
}

int ft_train_adapter_update(ft_train_adapter *a, int64_t step, const ft_train_step_out *o,
                            int64_t positions, const ft_train_step_time *tm,
                            const ft_train_sink *k)
{
    ft_ckpt_state *st = &a->st;
    const int dpo = a->cfg->method == FT_TRAIN_METHOD_DPO;
    const ft_dpo_stats *ps = &o->dpo.st;
    double loss = dpo ? (ps->pairs ? o->loss_sum / (double)ps->pairs : NAN)
                      : o->n_tokens ? o->loss_sum / (double)o->n_tokens : NAN;
    double gnorm;
    FT_TRY(ft_optim_grad_norm(&a->opt, &gnorm));
    double lr = ft_optim_lr(&a->opt, step);
    int bad = (o->n_tokens && !isfinite(loss)) || !isfinite(gnorm);
    if (bad) {
        /* skip: no update, gradients dropped; the schedule position still advances */
        FT_TRY(ft_optim_zero_grad(&a->opt));
        st->bad_steps++;
        st->bad_run++;
        bad_step_warn(a, step, loss, gnorm, k);
    } else {
        st->bad_run = 0;
        FT_TRY(ft_optim_clip(&a->opt, gnorm));
        FT_TRY(ft_optim_step(&a->opt, lr, st->adam_step + 1));
        st->adam_step++;
        st->tokens += o->n_tokens;
        st->last_loss = loss;
    }
    st->positions += positions;
    st->step = step + 1;
    double now = ft_train_now_s(), el = now - tm->loop_t0, sd = now - tm->step_t0;
    double tps = sd > 0 ? positions / sd : 0; /* this step's token positions per second */
    FT_TRY(ft_metrics_step(&a->met, st->step, loss, lr, gnorm, st->tokens, tps,
                           a->base_s + ft_train_now_s() - tm->run_t0, st->bad_steps, bad,
                           dpo ? ps : NULL));
    ft_train_event ev = {.kind = FT_EV_STEP, .step = st->step, .total_steps = st->total_steps,
                         .loss = loss, .lr = lr, .grad_norm = gnorm, .tokens_per_s = tps,
                         .elapsed_s = el, .tokens = st->tokens,
                         .eta_s = el / (double)(st->step - a->start) *
                                  (double)(st->total_steps - st->step)};
    if (dpo && ps->pairs) {
        ev.pref = 1;
        ev.reward_accuracy = ps->accurate / (double)ps->pairs;
        ev.reward_margin = ps->margin / (double)ps->pairs;
    }
    ft_train_emit(k, &ev);
    return 0;
}

int ft_train_adapter_after_step(ft_train_adapter *a, ft_session *s, const ft_train_data *d,
                                double run_t0, const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    const int64_t total = st->total_steps;
    if (st->bad_run > 0 && st->bad_run >= c->max_bad_steps)
        return ft_err(FT_E_NUMERIC, "stopped at step %lld/%lld after %lld consecutive steps with a non-finite loss or gradient norm (--max-bad-steps %lld): the model diverged (try a lower --lr or --max-grad-norm) or the data or base weights produce Inf/NaN; no adapter written",
                      (long long)st->step, (long long)total, (long long)st->bad_run,
                      (long long)c->max_bad_steps);
    /* a scheduled mid-run eval runs even when stopping, so the metrics of a resumed run are
     * those of an uninterrupted one (it precedes the step's checkpoint) */
    if (d->n_eval_b && st->step < total && c->eval_every > 0 && st->step % c->eval_every == 0) {
        double loss;
        int64_t tok;
        FT_TRY(ft_train_eval_log(a, s, d, st->step, a->base_s + ft_train_now_s() - run_t0, k,
                                 &loss, &tok));
        st->last_eval_loss = loss;
        FT_TRY(ft_train_track_eval(a, loss, st->step));
        if (ft_train_early_stop(a, k)) {
            a->early = 1; /* the end path: checkpoint, adapter, summary */
            return 0;
        }
    }
    int stopping = c->stop && *c->stop; /* then the save after the loop */
    if (!stopping && c->save_every > 0 && st->step % c->save_every == 0 && st->step < total) {
        FT_TRY(ft_train_adapter_save(a, s->model, run_t0, k));
        a->saved_step = st->step;
    }
    return 0;
}

int ft_train_adapter_save(ft_train_adapter *a, const ft_model *m, double run_t0,
                          const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    ft_train_result *res = a->res;
    char path[4200];
    st->elapsed_s = a->base_s + ft_train_now_s() - run_t0;
    if (!ft_train_dist_writer(c)) { /* data-parallel: rank 0 writes (dist.h) */
        a->saved_step = st->step;
        return 0;
    }
    int rc = ft_ckpt_save(c->out, st, a->cfg_json, &a->lora, m, a->base_name, path, sizeof path);
    if (rc < 0) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        if (res->checkpoint[0] && ft_ckpt_verify(res->checkpoint, NULL) == 0)
            return ft_err(rc, "%s; the previous checkpoint %s is intact (checked)", msg, res->checkpoint);
        if (res->checkpoint[0]) {
            char why[1024];
            snprintf(why, sizeof why, "%s", ft_errmsg());
            return ft_err(rc, "%s; the previous checkpoint %s is not intact either: %s", msg,
                          res->checkpoint, why);
        }
        return ft_err(rc, "%s; no earlier checkpoint of this run exists", msg);
    }
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", path);
    ft_ckpt_prune(c->out, st->step, st->run_id, c->keep); /* best effort */
    ft_train_event ev = {.kind = FT_EV_CKPT, .text = path, .step = st->step,
                         .total_steps = st->total_steps};
    ft_train_emit(k, &ev);
    return 0;
}

int ft_train_adapter_pack(ft_train_adapter *a, const ft_train_data *d)
{
    ft_batches_free(a->own_b, a->n_own_b);
    a->own_b = NULL;
    a->n_own_b = 0;
    a->own_epoch = a->st.epoch;
    return ft_train_data_pack(d, a->cfg, a->st.epoch, &a->own_b, &a->n_own_b);
}

void ft_train_adapter_free(ft_train_adapter *a)
{
    ft_batches_free(a->own_b, a->n_own_b);
    ft_metrics_close(&a->met);
    ft_eval_samples_free(&a->samples);
    ft_optim_free(&a->opt);
    if (a->lora_ok) ft_lora_free(&a->lora);
    free(a->cfg_json);
    free(a->ref_train);
    free(a->ref_eval);
    memset(a, 0, sizeof *a);
}
