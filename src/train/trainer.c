/* trainer.c - one training run (see trainer.h): its set-up through the runtime session
 * (offload/session.h: the model, the backend, the placement of the base), the data
 * (train_data.h) and the adapter (adapter.h); the step loop (loop.c); its end: the final
 * checkpoint and evaluation, the adapter, summary.json (summary.h). */
#include "src/train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "adapters/qcorr.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/correction.h"
#include "src/train/dist.h"
#include "src/train/eval.h"
#include "src/train/report.h"
#include "src/train/run_config.h"
#include "src/train/schedule.h"
#include "src/train/summary.h"
#include "src/train/train_run.h"
#include "src/train/validate.h"

_Static_assert(FT_TRAIN_QUANT_AUTO == FT_SESSION_QUANT_AUTO, "one 'auto' for --quant");

void ft_train_defaults(ft_train_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->out = "ftune-out";
    c->batch_size = 1;
    c->grad_accum = 1;
    c->epochs = 1.0;
    c->lr = 2e-4;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.999;
    c->adam_eps = 1e-8;
    c->max_grad_norm = 1.0;
    c->schedule = FT_SCHED_COSINE;
    c->warmup_ratio = 0.03;
    c->lora.r = 16;
    c->lora.alpha = 32;
    c->lora.dropout = 0.05f;
    c->lora.targets = FT_LORA_ALL_TARGETS;
    c->seed = 42;
    c->quant_correction_tokens = 4096;
    c->data_cfg.eval_fraction = 0.05;
    c->data_cfg.eval_max = 200;
    c->eval_max_new_tokens = 128;
    c->save_every = 200;
    c->keep = 2;
    c->max_bad_steps = 5;
    c->dpo.beta = 0.1; /* TRL's DPOConfig */
    c->dpo.loss_type = FT_DPO_SIGMOID;
    c->dpo.simpo_gamma = 0.5; /* LLaMA-Factory's simpo_gamma */
    c->test.inf_embedding = -1;
}

/* A fresh run's --quant-correction of an NF4 base with --init-adapter: refused (before any
 * weight is read), since that adapter was trained without the correction. */
static int check_correction(const ft_train_cfg *c, int quant)
{
    if (c->quant_correction && quant == FT_PACK_QUANT_NF4 && c->init_adapter && !c->resume)
        return ft_err(FT_E_INVALID, "--quant-correction with --init-adapter: the adapter of %s was "
                      "trained without this run's correction; drop one of them", c->init_adapter);
    return 0;
}

/* The frozen correction of the NF4 base (--quant-correction, src/train/correction.h):
 * computed and saved to OUT/quant_correction on a fresh run, read back on --resume. A fresh
 * run's plan (plan_only) neither reads the weights nor computes or writes it: the adapter gets
 * a zero correction instead, so that the plan counts its memory (A0/B0) as the run will. */
static int setup_correction(ft_train_job *r, int quant)
{
    const ft_train_cfg *c = &r->cfg;
    const ft_train_sink *k = &r->sink;
    ft_train_adapter *a = &r->ad[0];
    if (!c->quant_correction) return 0;
    if (quant != FT_PACK_QUANT_NF4) {
        ft_train_info(k, FT_EV_INFO, "quant correction: none (the base is not quantized)");
        return 0;
    }
    if (c->resume) {
        FT_TRY(ft_qcorr_load(&a->lora, c->out));
        ft_train_info(k, FT_EV_INFO, "quant correction: %s, read from %s/" FT_QCORR_DIR,
                      ft_qcorr_name(c->quant_correction), c->out);
        return 0;
    }
    if (c->plan_only) {
        float *zero = calloc((size_t)a->lora.n_params, sizeof *zero);
        if (!zero) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_lora_set_fixed(&a->lora, zero);
        free(zero);
        if (rc) return rc;
        ft_train_info(k, FT_EV_INFO, "quant correction: %s, computed at the start of the real run "
                      "(the plan counts its memory)", ft_qcorr_name(c->quant_correction));
        return 0;
    }
    ft_qcorr_cfg qc = {c->quant_correction, c->quant_correction_tokens, 0.01, c->threads, c->seed};
    ft_qcorr_stats st;
    FT_TRY(ft_correction_compute(&a->lora, r->s.model, r->s.pack, r->d.train_b, r->d.n_train_b,
                                 &qc, c->out, r->base_name, &st));
    double red = st.err_before > 0 ? 1.0 - st.err_after / st.err_before : 0.0;
    a->res->qcorr_reduction = red;
    a->res->qcorr_tokens = st.tokens;
    ft_train_info(k, FT_EV_INFO, "quant correction: %s, rank %lld%s%lld%s: %s error of the NF4 base %.1f%% smaller, in %.1f s; saved to %s/" FT_QCORR_DIR,
                  ft_qcorr_name(c->quant_correction), (long long)a->lora.cfg.r,
                  st.tokens ? " on " : "", (long long)st.tokens, st.tokens ? " calibration tokens" : "",
                  st.tokens ? "output" : "weight", 100.0 * red, st.seconds, c->out);
    return 0;
}

/* Test hook (cfg->test.stop_hold_ms): a stopped run waits before its stop checkpoint. */
static void test_stop_hold(int64_t ms)
{
    for (int64_t i = 0; i < ms; i += 10) usleep(10000); /* a signal's _exit ends it */
}

/* Test hook (cfg->test.inf_embedding, fault injection for tests/ref/test_resume.py): the input
 * embedding row of token id is set to +Inf. Only an untied model's table is touched (tied, the
 * LM head would be poisoned for every token). */
static int test_inf_embedding(ft_model *m, int64_t id, const ft_train_sink *k)
{
    const int64_t C = m->cfg.hidden_size;
    if (id >= m->cfg.vocab_size || !m->embed || m->embed == m->lm_head)
        return ft_err(FT_E_INVALID, "FTUNE_TEST_INF_EMBEDDING=%lld: expected a token id below %lld of "
                      "a model with untied embeddings read into memory", (long long)id,
                      (long long)m->cfg.vocab_size);
    for (int64_t i = 0; i < C; i++) m->embed[id * C + i] = INFINITY;
    ft_train_info(k, FT_EV_WARN, "test hook: the input embedding of token %lld is +Inf", (long long)id);
    return 0;
}

/* The session's notes as the run's events. */
static void session_note(void *user, int kind, const char *line)
{
    const ft_train_job *r = user;
    const int ev = kind == FT_SESSION_WARN   ? FT_EV_WARN
                   : kind == FT_SESSION_PLAN ? FT_EV_PLAN
                                             : FT_EV_INFO;
    ft_train_info(&r->sink, ev, "%s", line);
}

/* The training run's steps inside the placement (offload/session.h ft_session_place): once the
 * quantization is chosen, the correction's refusal; once the base is settled, the test hook on
 * a resident base's weights and the quantization correction. */
static int place_hook(void *user, ft_session *s, int stage)
{
    ft_train_job *r = user;
    const ft_train_cfg *c = &r->cfg;
    if (stage == FT_SESSION_QUANT_CHOSEN) {
        r->ad[0].res->quant = s->quant;
        return check_correction(c, s->quant);
    }
    if (c->test.inf_embedding >= 0 && !s->pack && !s->preview && !c->plan_only)
        FT_TRY(test_inf_embedding(s->model, c->test.inf_embedding, &r->sink));
    return setup_correction(r, s->quant);
}

/* The model, its data, the backend and the adapter, and the placement of the base (which
 * chooses --grad-accum auto on a device). */
static int setup_base(ft_train_job *r)
{
    ft_train_cfg *c = &r->cfg;
    const ft_train_sink *k = &r->sink;
    ft_session_cfg sc = {c->model, c->device, c->threads, 1, c->quant, c->cache_dir, c->gpu_mem,
                         c->host_mem, NULL, 1, session_note, r};
    sc.cuda_fused = c->cuda_fused;
    sc.tune = c->tune;
    FT_TRY(ft_session_open_model(&r->s, &sc));
    const ft_model_config *mc = &r->s.model->cfg;
    ft_train_info(k, FT_EV_INFO, "model %s: %s, %lld layers, hidden %lld, %lld/%lld heads, vocab %lld, %.1fM params (loaded in %.1f s)",
                  c->model, mc->model_type, (long long)mc->num_hidden_layers,
                  (long long)mc->hidden_size, (long long)mc->num_attention_heads,
                  (long long)mc->num_key_value_heads, (long long)mc->vocab_size,
                  ft_model_n_params(r->s.model) / 1e6, ft_train_now_s() - r->t0);
    int64_t seq_len = c->seq_len;
    if (seq_len == 0)
        seq_len = mc->max_position_embeddings < 2048 ? mc->max_position_embeddings : 2048;
    FT_TRY(ft_train_data_load(&r->d, c, r->s.tok, seq_len, ft_train_data_target_weight(mc), k));
    FT_TRY(ft_session_open_backend(&r->s));
    r->n_ad = 1;
    FT_TRY(ft_train_adapter_init(&r->ad[0], c, &r->s, r->base_name, r->ad[0].res));
    r->T = (c->method == FT_TRAIN_METHOD_DPO ? 2 : 1) * c->batch_size * seq_len; /* DPO: pairs of two */
    ft_session_place_cfg pc = {r->T, c->grad_accum, seq_len, &r->ad[0].lora,
                               r->d.n_train_b > 0 ? &r->d.train_b[0] : NULL, c->plan_only,
                               c->quant_correction && !c->resume && !c->plan_only, place_hook, r};
    FT_TRY(ft_session_place(&r->s, &pc));
    c->grad_accum = r->s.n_micro;
    for (int t = 0; t < 3; t++) r->ad[0].res->base_layers[t] = r->s.base_layers[t];
    return 0;
}

/* The plan line: backend, base, adapter, micro-batches, schedule, executor memory. */
static void plan_line(const ft_train_job *r, int64_t warmup)
{
    const ft_train_cfg *c = &r->cfg;
    const ft_session *s = &r->s;
    const ft_train_adapter *a = &r->ad[0];
    ft_exec_info ex;
    ft_exec_get_info(s->ex, &ex);
    size_t pack_bytes = s->pack ? ft_exec_pack_bytes(s->pack) : 0;
    ft_train_info(&r->sink, FT_EV_PLAN, "plan: backend %s, base %s%s%s), LoRA r=%lld alpha=%g%s on %d modules (%.2fM trainable), %lld micro-batches of %lld x %lld tokens, grad-accum %lld, %lld steps (warmup %lld, %s), executor memory %.1f MiB%s",
                  s->be->ops->name,
                  s->quant != FT_PACK_QUANT_NF4 ? "bf16 (unquantized"
                  : ex.nf4_fused ? "nf4 (QLoRA: bitsandbytes NF4, double quantization, dequantized inside the GEMMs from the pack"
                                  : "nf4 (QLoRA: bitsandbytes NF4, double quantization, dequantized per layer from the pack",
                  s->quant_why[0] ? "; " : "", s->quant_why, (long long)a->lc.r, a->lc.alpha,
                  a->lc.use_rslora ? " (rsLoRA)" : "", __builtin_popcount(a->lc.targets),
                  a->lora.n_params / 1e6, (long long)r->d.n_train_b,
                  (long long)((c->method == FT_TRAIN_METHOD_DPO ? 2 : 1) * c->batch_size),
                  (long long)r->d.seq_len,
                  (long long)c->grad_accum, (long long)r->total, (long long)warmup,
                  ft_schedule_name(c->schedule),
                  (ex.arena_bytes + ex.weights_bytes + ex.kept_bytes + pack_bytes) / 1048576.0,
                  ex.kept ? " (activations kept: no recompute)"
                  : !ex.on_device ? "" : " (activations recomputed in the backward)");
}

/* The run's set-up up to its first step: the base placed, the schedule, the plan, the adapter
 * started (fresh or resumed) and, on a fresh run, evaluated at step 0. With plan_only it ends
 * after the placement. */
static int setup(ft_train_job *r)
{
    ft_train_cfg *c = &r->cfg;
    const ft_train_sink *k = &r->sink;
    FT_TRY(ft_train_cfg_validate(c));
    if (!c->model) return ft_err(FT_E_INVALID, "missing --model");
    /* the base's Hugging Face id when known, so PEFT and vLLM find it (adapters/peft.h) */
    const char *base_src;
    FT_TRY(ft_peft_base_name(c->model, c->base_model_id, r->base_name, sizeof r->base_name, &base_src));
    if (base_src && strncmp(base_src, "general.", 8) == 0)
        ft_train_info(k, FT_EV_INFO, "base model id %s, from the GGUF's %s (adapter_config.json's base_model_name_or_path; --base-model-id ID names another)",
                      r->base_name, base_src);
    if (!c->data || c->n_data < 1) return ft_err(FT_E_INVALID, "missing --data");
    FT_TRY(setup_base(r));
    if (c->plan_only) return ft_train_dist_plan(c, &r->s, &r->ad[0].lora, k); /* ranks' lines */
    FT_TRY(ft_train_dist_check(c, r->d.n_train_b, ft_train_data_fingerprint(&r->d.ds, !c->eval_data)));
    const int64_t ga = ft_train_dist_global_accum(c); /* micro-batches per step, all ranks */
    int64_t steps_per_epoch = (r->d.n_train_b + ga - 1) / ga;
    r->total = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * steps_per_epoch);
    if (r->total < 1) r->total = 1;
    int64_t warmup = c->warmup_steps > 0 ? c->warmup_steps
                                         : (int64_t)ceil(c->warmup_ratio * r->total);
    plan_line(r, warmup);
    if (c->loraplus_lr_ratio > 0)
        ft_train_info(k, FT_EV_INFO, "LoRA+: the B matrices train at %g x the learning rate of the A matrices",
                      c->loraplus_lr_ratio);
    /* set before the step-0 eval too: the executor adds the noise in training steps only */
    ft_exec_set_neftune(r->s.ex, c->neftune_noise_alpha, 0);
    if (c->neftune_noise_alpha > 0)
        ft_train_info(k, FT_EV_INFO, "NEFTune: noise alpha %g: uniform noise of magnitude %.3g (alpha / sqrt(seq_len %lld * hidden %lld)) on the training embeddings, none in eval",
                      c->neftune_noise_alpha,
                      c->neftune_noise_alpha /
                          sqrt((double)r->d.seq_len * (double)r->s.model->cfg.hidden_size),
                      (long long)r->d.seq_len, (long long)r->s.model->cfg.hidden_size);
    for (int i = 0; i < r->n_ad; i++) {
        ft_train_adapter *a = &r->ad[i];
        FT_TRY(ft_train_adapter_plan(a, &r->s, &r->d, r->total, warmup));
        FT_TRY(ft_train_adapter_open(a, &r->s, &r->d, k));
        if (!a->cfg->resume && r->d.n_eval_b) {
            double loss;
            int64_t tok;
            FT_TRY(ft_train_eval_log(a, &r->s, &r->d, 0, ft_train_now_s() - r->t0, k, &loss, &tok));
            a->st.initial_eval_loss = a->st.last_eval_loss = loss;
        }
    }
    return 0;
}

int ft_train_finish(ft_train_job *r, ft_train_adapter *a)
{
    const ft_train_cfg *c = a->cfg;
    const ft_train_sink *k = a->sink.cb ? &a->sink : &r->sink;
    const ft_dataset *ds = &r->d.ds;
    ft_ckpt_state *st = &a->st;
    ft_train_result *res = a->res;
    double sess = ft_train_now_s() - r->loop_t0;
    res->steps = st->step;
    res->tokens = st->positions;
    res->trained_tokens = st->tokens;
    res->bad_steps = st->bad_steps;
    res->initial_eval_loss = st->initial_eval_loss;
    res->final_train_loss = st->last_loss;
    res->tokens_per_s = sess > 0 ? (double)(st->positions - a->positions0) / sess : 0;
    res->n_train = ds->n_train;
    res->n_eval = ds->n_eval;
    res->n_skipped = ds->n_skipped;
    res->n_truncated = ds->n_truncated;
    res->n_dropped = ds->n_dropped;
    ft_exec_info xi = {0};
    if (r->s.has_ex) ft_exec_get_info(r->s.ex, &xi);
    res->layer_fetches = xi.layer_fetches;
    if (a->saved_step != st->step && (st->step > 0 || !r->stopped))
        FT_TRY(ft_train_adapter_save(a, r->s.model, r->t0, k));
    if (r->stopped) {
        res->stopped = 1;
        res->final_eval_loss = st->last_eval_loss;
        res->time_s = a->base_s + ft_train_now_s() - r->t0;
        return 0;
    }
    if (r->d.n_eval_b && !a->early && !a->pruned) {
        double loss;
        int64_t tok;
        FT_TRY(ft_train_eval_log(a, &r->s, &r->d, st->step, a->base_s + ft_train_now_s() - r->t0, k,
                                 &loss, &tok));
        st->last_eval_loss = loss;
        FT_TRY(ft_train_track_eval(a, loss, st->step));
    }
    res->early_stopped = a->early;
    res->best_eval_loss = st->best_eval_loss;
    res->best_eval_step = st->best_eval_step;
    res->final_eval_loss = st->last_eval_loss;
    res->final_eval_reward_accuracy = a->eval_reward_accuracy;
    res->time_s = a->base_s + ft_train_now_s() - r->t0;
    if (!ft_train_dist_writer(c)) return 0; /* data-parallel: rank 0 writes */
    FT_TRY(ft_peft_save(c->out, &a->lora, r->s.model, r->base_name));
    char hint[512];
    if (ft_peft_serving_hints(&a->lora.cfg, hint, sizeof hint) > 0)
        ft_train_info(k, FT_EV_WARN, "serving: %s", hint);
    FT_TRY(ft_train_summary_write(a, r->d.n_eval_b > 0,
                                  r->s.pack ? ft_pack_path(r->s.pack) : NULL));
    char best_dir[4200];
    FT_TRY(ft_path_join(best_dir, sizeof best_dir, c->out, FT_CKPT_BEST_DIR));
    if (st->best_eval_step > 0 && (c->save_best || a->early || st->best_eval_step != st->step))
        ft_train_info(k, FT_EV_INFO, "best eval loss %.4f at step %lld%s%s", st->best_eval_loss,
                      (long long)st->best_eval_step, c->save_best ? ": adapter in " : "",
                      c->save_best ? best_dir : "");
    char rpath[4200];
    if (ft_report_write(c->out, rpath, sizeof rpath) < 0 || ft_report_model_card(c->out) < 0)
        ft_train_info(k, FT_EV_WARN, "report: %s", ft_errmsg());
    ft_train_info(k, FT_EV_DONE, "adapter written to %s%s", c->out,
                  a->early ? " (the last step's; early stopped)"
                  : a->pruned ? " (the last step's; pruned)" : "");
    return 0;
}

static int train(ft_train_job *r)
{
    FT_TRY(setup(r));
    if (r->cfg.plan_only) return 0;
    FT_TRY(ft_train_loop(r));
    if (r->stopped) test_stop_hold(r->cfg.test.stop_hold_ms);
    for (int i = 0; i < r->n_ad; i++) FT_TRY(ft_train_finish(r, &r->ad[i]));
    return 0;
}

int ft_train_run(const ft_train_cfg *cfg, ft_train_cb cb, void *user, ft_train_result *res)
{
    ft_train_job *r = calloc(1, sizeof *r);
    memset(res, 0, sizeof *res);
    res->final_eval_reward_accuracy = NAN;
    res->base_layers[0] = res->base_layers[1] = res->base_layers[2] = -1;
    if (!r) return ft_err(-ENOMEM, "out of memory");
    r->cfg = *cfg; /* grad_accum may be chosen by the planner */
    r->sink = (ft_train_sink){cb, user};
    r->t0 = ft_train_now_s();
    r->ad[0].res = res;
    int rc = train(r);
    for (int i = 0; i < FT_TRAIN_MAX_ADAPTERS; i++) ft_train_adapter_free(&r->ad[i]);
    ft_train_data_free(&r->d);
    ft_session_close(&r->s);
    free(r);
    return rc;
}
