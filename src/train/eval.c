/* eval.c - an adapter's evaluation, best eval loss and early stopping (see eval.h). */
#include "src/train/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/dist.h"

int ft_train_evaluate(ft_exec *ex, const ft_batch *b, int64_t n, int64_t cap, double *loss,
                      int64_t *tokens)
{
    double sum = 0;
    int64_t cnt = 0;
    if (cap > 0 && n > cap) n = cap;
    for (int64_t i = 0; i < n; i++) {
        double ls;
        int64_t nv;
        FT_TRY(ft_exec_eval(ex, &b[i], &ls, &nv));
        sum += ls;
        cnt += nv;
    }
    *loss = cnt ? sum / (double)cnt : NAN;
    *tokens = cnt;
    return 0;
}

/* The evaluation itself, with the executor on a's adapter. */
static int eval_adapter(ft_train_adapter *a, ft_exec *ex, const ft_train_data *d,
                        ft_dpo_stats *ps, double *loss, int64_t *tokens)
{
    const ft_train_cfg *c = a->cfg;
    if (c->method == FT_TRAIN_METHOD_DPO) {
        FT_TRY(ft_dpo_evaluate(ex, d->eval_b, d->n_eval_b, c->eval_max_batches, a->ref_eval,
                               &c->dpo, ps));
        *loss = ps->pairs ? ps->loss / (double)ps->pairs : NAN;
        *tokens = ps->tokens;
        return 0;
    }
    return ft_train_evaluate(ex, d->eval_b, d->n_eval_b, c->eval_max_batches, loss, tokens);
}

int ft_train_eval_log(ft_train_adapter *a, ft_session *s, const ft_train_data *d, int64_t step,
                      double elapsed_s, const ft_train_sink *k, double *loss, int64_t *tokens)
{
    ft_dpo_stats ps;
    const int dpo = a->cfg->method == FT_TRAIN_METHOD_DPO;
    if (a->pre_eval && !dpo) { /* evaluated already, in a pass shared with other adapters */
        *loss = a->pre_loss;
        *tokens = a->pre_tokens;
        a->pre_eval = 0;
    } else {
        ft_lora *was = ft_session_swap_adapter(s, &a->lora);
        int rc = eval_adapter(a, s->ex, d, &ps, loss, tokens);
        ft_session_swap_adapter(s, was);
        FT_TRY(rc);
    }
    FT_TRY(ft_metrics_eval(&a->met, step, *loss, *tokens, elapsed_s, dpo ? &ps : NULL));
    ft_train_event ev = {.kind = FT_EV_EVAL, .step = step, .total_steps = a->st.total_steps,
                         .eval_loss = *loss};
    if (dpo && ps.pairs) {
        ev.pref = 1;
        ev.reward_accuracy = ps.accurate / (double)ps.pairs;
        ev.reward_margin = ps.margin / (double)ps.pairs;
        a->eval_reward_accuracy = ev.reward_accuracy;
    }
    ft_train_emit(k, &ev);
    double gen_s; /* --eval-prompts: the adapter's replies at this evaluation */
    FT_TRY(ft_eval_samples_run(&a->samples, s, &a->lora, step, a->met.tb, &gen_s));
    if (a->samples.on)
        ft_train_info(k, FT_EV_INFO, "samples at step %lld: %lld greedy replies in %.1f s, in %s",
                      (long long)step, (long long)a->samples.n, gen_s, a->samples.out_path);
    return 0;
}

int ft_train_track_eval(ft_train_adapter *a, double loss, int64_t step)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    double best = st->best_eval_step > 0 ? st->best_eval_loss : INFINITY;
    if (st->n_evals == 0 || (loss < best && best - loss > c->early_stopping_threshold))
        st->evals_no_improve = 0;
    else
        st->evals_no_improve++;
    st->n_evals++;
    if (!(loss < best)) return 0;
    st->best_eval_loss = loss;
    st->best_eval_step = step;
    if (!c->save_best || !ft_train_dist_writer(c)) return 0; /* rank 0 writes (dist.h) */
    FT_TRY(ft_ckpt_save_adapter(c->out, FT_CKPT_BEST_DIR, &a->lora, NULL, a->base_name, step, loss));
    st->best_saved_step = step;
    return 0;
}

int ft_train_early_stop(const ft_train_adapter *a, const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    const ft_ckpt_state *st = &a->st;
    if (!(c->early_stopping_patience > 0 && st->evals_no_improve >= c->early_stopping_patience))
        return 0;
    char best[64] = "none finite";
    if (st->best_eval_step > 0)
        snprintf(best, sizeof best, "%.4f at step %lld", st->best_eval_loss, (long long)st->best_eval_step);
    ft_train_info(k, FT_EV_INFO, "early stopping after step %lld/%lld: %lld evaluations in a row without an eval loss more than %g below the best (%s; --early-stopping-patience %lld)",
                  (long long)st->step, (long long)st->total_steps, (long long)st->evals_no_improve,
                  c->early_stopping_threshold, best, (long long)c->early_stopping_patience);
    return 1;
}

void ft_train_eval_set_id(const ft_train_data *d, int64_t eval_max_batches, char *buf, size_t n)
{
    uint64_t h = FT_CKPT_HASH_INIT;
    int64_t nb = d->n_eval_b;
    if (eval_max_batches > 0 && nb > eval_max_batches) nb = eval_max_batches;
    h = ft_ckpt_hash(h, &nb, sizeof nb);
    for (int64_t i = 0; i < nb; i++) {
        const ft_batch *b = &d->eval_b[i];
        h = ft_ckpt_hash(h, &b->T, sizeof b->T);
        h = ft_ckpt_hash(h, b->ids, (size_t)b->T * sizeof *b->ids);
        h = ft_ckpt_hash(h, b->targets, (size_t)b->T * sizeof *b->targets);
    }
    snprintf(buf, n, "%016llx", (unsigned long long)h);
}

void ft_train_resume_eval_set(ft_train_adapter *a, const ft_train_data *d, const ft_train_sink *k)
{
    ft_ckpt_state *st = &a->st;
    char cur[sizeof st->eval_set];
    ft_train_eval_set_id(d, a->cfg->eval_max_batches, cur, sizeof cur);
    if (st->eval_set[0] && strcmp(st->eval_set, cur) && st->n_evals > 0) {
        ft_train_info(k, FT_EV_WARN, "the held-out set differs from the one of the checkpoint's eval losses (--eval-data or --eval-max changed): the best eval loss (%.4f at step %lld) and early stopping start over at the next evaluation%s",
                      st->best_eval_loss, (long long)st->best_eval_step,
                      a->cfg->save_best ? ", which replaces OUT/best" : "");
        st->best_eval_loss = NAN;
        st->best_eval_step = st->best_saved_step = 0;
        st->n_evals = st->evals_no_improve = 0;
    }
    memcpy(st->eval_set, cur, sizeof cur);
}

int ft_train_resume_best(ft_train_adapter *a, const ft_train_sink *k)
{
    const ft_train_cfg *c = a->cfg;
    ft_ckpt_state *st = &a->st;
    char best[4200], ck[4200], name[64];
    ft_ckpt_adapter_cleanup(c->out, FT_CKPT_BEST_DIR, 0);
    FT_TRY(ft_path_join(best, sizeof best, c->out, FT_CKPT_BEST_DIR));
    /* OUT/best says which step it holds: it may be a later best than the checkpoint's (written
     * after the checkpoint, or by the final eval), which the resumed run must not report */
    if (st->best_eval_step == 0 || ft_ckpt_adapter_step(c->out, FT_CKPT_BEST_DIR) == st->best_eval_step)
        return 0;
    snprintf(name, sizeof name, FT_CKPT_PREFIX "%lld", (long long)st->best_eval_step);
    FT_TRY(ft_path_join(ck, sizeof ck, c->out, name));
    ft_ckpt_state cs;
    if (ft_ckpt_load(ck, &cs, NULL, NULL) == 0 && cs.step == st->best_eval_step) {
        float *vals = malloc((size_t)a->lora.n_params * sizeof *vals);
        if (!vals) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_peft_load_values(ck, &a->lora, vals);
        if (!rc) rc = ft_ckpt_save_adapter(c->out, FT_CKPT_BEST_DIR, &a->lora, vals, a->base_name,
                                           st->best_eval_step, st->best_eval_loss);
        free(vals);
        FT_TRY(rc);
        st->best_saved_step = st->best_eval_step;
        ft_train_info(k, FT_EV_INFO, "--save-best: %s holds the best adapter so far (eval loss %.4f at step %lld), copied from %s",
                      best, st->best_eval_loss, (long long)st->best_eval_step, ck);
        return 0;
    }
    ft_ckpt_adapter_cleanup(c->out, FT_CKPT_BEST_DIR, 1);
    st->best_saved_step = 0;
    ft_train_info(k, FT_EV_WARN, "--save-best: the best adapter so far (eval loss %.4f at step %lld) was not saved and %s is gone; %s will hold the adapter of the next improvement only",
                  st->best_eval_loss, (long long)st->best_eval_step, ck, best);
    return 0;
}
