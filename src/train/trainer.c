/* trainer.c - the training loop (see trainer.h). */
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adapters/peft.h"
#include "kernels/kernels.h"
#include "offload/exec.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/model/model.h"
#include "src/train/metrics.h"
#include "src/train/schedule.h"

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
    c->data_cfg.eval_fraction = 0.05;
    c->data_cfg.eval_max = 200;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(ft_train_cb cb, void *user, ft_train_event *ev)
{
    if (cb) cb(ev, user);
}

static void info(ft_train_cb cb, void *user, int kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void info(ft_train_cb cb, void *user, int kind, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ft_train_event ev = {.kind = kind, .text = line};
    emit(cb, user, &ev);
}

/* Mean token loss over the eval micro-batches (NAN if none). */
static int evaluate(ft_exec *ex, const ft_batch *b, int64_t n, int64_t cap, double *loss,
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

typedef struct run {
    ft_model *model;
    ft_tokenizer *tok;
    ft_dataset ds;
    ft_batch *train_b, *eval_b;
    int64_t n_train_b, n_eval_b;
    ft_backend *be;
    ft_lora lora;
    int lora_ok;
    ft_exec ex;
    int ex_ok;
    ft_metrics met;
} run;

static void run_free(run *r)
{
    ft_metrics_close(&r->met);
    if (r->ex_ok) ft_exec_free(&r->ex);
    if (r->lora_ok) ft_lora_free(&r->lora);
    ft_backend_free(r->be);
    ft_batches_free(r->train_b, r->n_train_b);
    ft_batches_free(r->eval_b, r->n_eval_b);
    ft_dataset_free(&r->ds);
    ft_tok_free(r->tok);
    ft_model_free(r->model);
}

static int check_finite_cfg(const ft_train_cfg *c)
{
    if (c->batch_size < 1) return ft_err(FT_E_INVALID, "--batch-size must be >= 1");
    if (c->grad_accum < 1) return ft_err(FT_E_INVALID, "--grad-accum must be >= 1");
    if (!(c->lr > 0) || !isfinite(c->lr)) return ft_err(FT_E_INVALID, "--lr must be > 0");
    if (c->max_steps < 0) return ft_err(FT_E_INVALID, "--max-steps must be >= 0");
    if (c->max_steps == 0 && !(c->epochs > 0)) return ft_err(FT_E_INVALID, "--epochs must be > 0");
    if (c->seq_len < 0 || c->seq_len == 1) return ft_err(FT_E_INVALID, "--seq-len must be >= 2");
    return 0;
}

static int train_inner(run *r, const ft_train_cfg *c, ft_train_cb cb, void *user,
                       ft_train_result *res)
{
    double t0 = now_s();
    FT_TRY(check_finite_cfg(c));
    if (!c->model) return ft_err(FT_E_INVALID, "missing --model");
    if (!c->data) return ft_err(FT_E_INVALID, "missing --data");
    FT_TRY(ft_model_load(&r->model, c->model));
    const ft_model_config *mc = &r->model->cfg;
    FT_TRY(ft_model_tokenizer(r->model, &r->tok));
    info(cb, user, FT_EV_INFO, "model %s: %s, %lld layers, hidden %lld, %lld/%lld heads, vocab %lld, %.1fM params (loaded in %.1f s)",
         c->model, mc->model_type, (long long)mc->num_hidden_layers, (long long)mc->hidden_size,
         (long long)mc->num_attention_heads, (long long)mc->num_key_value_heads,
         (long long)mc->vocab_size, ft_model_n_params(r->model) / 1e6, now_s() - t0);

    int64_t seq_len = c->seq_len;
    if (seq_len == 0) seq_len = mc->max_position_embeddings < 2048 ? mc->max_position_embeddings : 2048;
    ft_data_cfg dc = c->data_cfg;
    dc.seq_len = seq_len;
    dc.seed = c->seed;
    FT_TRY(ft_dataset_load(&r->ds, c->data, &dc, r->tok));
    if (r->ds.n_train == 0)
        return ft_err(FT_E_INVALID, "%s: no training examples left (%lld records, %lld skipped)",
                      c->data, (long long)r->ds.n_records, (long long)r->ds.n_skipped);
    info(cb, user, FT_EV_INFO, "data %s: %lld records (%s, template %s) -> %lld train / %lld eval examples, %lld skipped, %lld truncated to %lld tokens, %lld dropped (no trained token within them)",
         c->data, (long long)r->ds.n_records, ft_data_format_name(r->ds.format),
         ft_chat_template_name(r->ds.chat_template), (long long)r->ds.n_train,
         (long long)r->ds.n_eval, (long long)r->ds.n_skipped, (long long)r->ds.n_truncated,
         (long long)seq_len, (long long)r->ds.n_dropped);

    FT_TRY(ft_pack(&r->train_b, &r->n_train_b, r->ds.train, r->ds.n_train, seq_len,
                   c->batch_size, c->seed));
    if (r->ds.n_eval)
        FT_TRY(ft_pack(&r->eval_b, &r->n_eval_b, r->ds.eval, r->ds.n_eval, seq_len,
                       c->batch_size, c->seed));

    FT_TRY(ft_backend_cpu_init(&r->be, c->threads));
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
    FT_TRY(ft_lora_init(&r->lora, r->model, &lc, r->be));
    r->lora_ok = 1;
    if (c->init_adapter) FT_TRY(ft_peft_load_weights(c->init_adapter, &r->lora));

    int64_t T = c->batch_size * seq_len;
    FT_TRY(ft_exec_init(&r->ex, r->be, r->model, &r->lora, T, c->grad_accum, seq_len));
    r->ex_ok = 1;

    int64_t steps_per_epoch = (r->n_train_b + c->grad_accum - 1) / c->grad_accum;
    int64_t total = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * steps_per_epoch);
    if (total < 1) total = 1;
    int64_t warmup = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)ceil(c->warmup_ratio * total);
    info(cb, user, FT_EV_PLAN, "plan: backend %s, LoRA r=%lld alpha=%g%s on %d modules (%.2fM trainable), %lld micro-batches of %lld x %lld tokens, grad-accum %lld, %lld steps (warmup %lld, %s), executor memory %.1f MiB",
         r->be->ops->name, (long long)lc.r, lc.alpha, lc.use_rslora ? " (rsLoRA)" : "",
         __builtin_popcount(lc.targets), r->lora.n_params / 1e6, (long long)r->n_train_b,
         (long long)c->batch_size, (long long)seq_len, (long long)c->grad_accum, (long long)total,
         (long long)warmup, ft_schedule_name(c->schedule), r->ex.arena_bytes / 1048576.0);

    char path[4200];
    FT_TRY(ft_mkdir_p(c->out));
    FT_TRY(ft_path_join(path, sizeof path, c->out, "metrics.jsonl"));
    FT_TRY(ft_metrics_open(&r->met, path));

    double eval_loss = NAN;
    int64_t eval_tok = 0;
    res->initial_eval_loss = NAN;
    if (r->n_eval_b) {
        FT_TRY(evaluate(&r->ex, r->eval_b, r->n_eval_b, c->eval_max_batches, &eval_loss, &eval_tok));
        res->initial_eval_loss = eval_loss;
        FT_TRY(ft_metrics_eval(&r->met, 0, eval_loss, eval_tok, now_s() - t0));
        ft_train_event ev = {.kind = FT_EV_EVAL, .step = 0, .total_steps = total, .eval_loss = eval_loss};
        emit(cb, user, &ev);
    }

    size_t pbytes = (size_t)r->lora.n_params * sizeof(float);
    const ft_backend_ops *o = r->be->ops;
    int64_t cursor = 0, epoch = 0, tokens = 0, positions = 0;
    double train_t0 = now_s(), last_loss = NAN;
    for (int64_t step = 0; step < total; step++) {
        /* the next grad_accum micro-batches; a new epoch re-packs with a new seed */
        if (cursor >= r->n_train_b) {
            epoch++;
            cursor = 0;
            ft_batches_free(r->train_b, r->n_train_b);
            r->train_b = NULL;
            FT_TRY(ft_pack(&r->train_b, &r->n_train_b, r->ds.train, r->ds.n_train, seq_len,
                           c->batch_size, c->seed + (uint64_t)epoch));
        }
        int64_t n_mb = r->n_train_b - cursor < c->grad_accum ? r->n_train_b - cursor : c->grad_accum;
        const ft_batch *mbs = &r->train_b[cursor];
        cursor += n_mb;
        int64_t n_targets = 0, step_positions = 0;
        double step_t0 = now_s();
        for (int64_t i = 0; i < n_mb; i++) {
            step_positions += mbs[i].T;
            n_targets += mbs[i].n_targets;
            positions += mbs[i].T;
        }
        FT_TRY(o->zero(r->be, r->lora.grads, pbytes));
        double loss_sum;
        int64_t nv;
        uint64_t dseed = lc.dropout > 0 ? (c->seed * 0x9e3779b97f4a7c15ull) ^ (uint64_t)(step + 1) : 0;
        FT_TRY(ft_exec_train_step(&r->ex, mbs, n_mb, n_targets, dseed, &loss_sum, &nv));
        double loss = nv ? loss_sum / (double)nv : NAN;
        double sq;
        FT_TRY(o->sumsq(r->be, &sq, r->lora.grads, r->lora.n_params));
        double gnorm = sqrt(sq);
        if (!isfinite(loss) && nv) return ft_err(FT_E_NUMERIC, "step %lld: loss is not finite", (long long)step + 1);
        if (!isfinite(gnorm)) return ft_err(FT_E_NUMERIC, "step %lld: gradient norm is not finite", (long long)step + 1);
        if (c->max_grad_norm > 0 && gnorm > c->max_grad_norm)
            FT_TRY(o->scale(r->be, r->lora.grads, (float)(c->max_grad_norm / (gnorm + 1e-6)), r->lora.n_params));
        double lr = ft_schedule_lr(c->schedule, c->lr, step, warmup, total, c->min_lr_ratio);
        FT_TRY(o->adamw(r->be, r->lora.params, r->lora.grads, r->lora.m, r->lora.v, r->lora.n_params,
                        (float)lr, (float)c->adam_beta1, (float)c->adam_beta2, (float)c->adam_eps,
                        (float)c->weight_decay, step + 1));
        tokens += nv;
        last_loss = loss;
        double el = now_s() - train_t0, st = now_s() - step_t0;
        double tps = st > 0 ? step_positions / st : 0; /* this step's token positions per second */
        FT_TRY(ft_metrics_step(&r->met, step + 1, loss, lr, gnorm, tokens, tps, now_s() - t0));
        ft_train_event ev = {.kind = FT_EV_STEP, .step = step + 1, .total_steps = total,
                             .loss = loss, .lr = lr, .grad_norm = gnorm, .tokens_per_s = tps,
                             .elapsed_s = el, .tokens = tokens,
                             .eta_s = el / (step + 1) * (total - step - 1)};
        emit(cb, user, &ev);
        int last = step + 1 == total;
        if (r->n_eval_b && (last || (c->eval_every > 0 && (step + 1) % c->eval_every == 0))) {
            FT_TRY(evaluate(&r->ex, r->eval_b, r->n_eval_b, c->eval_max_batches, &eval_loss, &eval_tok));
            FT_TRY(ft_metrics_eval(&r->met, step + 1, eval_loss, eval_tok, now_s() - t0));
            ft_train_event e2 = {.kind = FT_EV_EVAL, .step = step + 1, .total_steps = total, .eval_loss = eval_loss};
            emit(cb, user, &e2);
        }
        res->steps = step + 1;
        res->tokens_per_s = el > 0 ? positions / el : 0;
    }
    res->time_s = now_s() - t0;
    res->final_eval_loss = eval_loss;
    res->final_train_loss = last_loss;
    res->tokens = positions;
    res->trained_tokens = tokens;
    res->n_train = r->ds.n_train;
    res->n_eval = r->ds.n_eval;
    res->n_skipped = r->ds.n_skipped;
    res->n_truncated = r->ds.n_truncated;
    res->n_dropped = r->ds.n_dropped;
    res->layer_fetches = r->ex.layer_fetches;
    FT_TRY(ft_peft_save(c->out, &r->lora, r->model, c->model));

    /* summary.json (null for a loss that was not measured, e.g. no eval split) */
    cJSON *js = cJSON_CreateObject();
    cJSON_AddStringToObject(js, "adapter", c->out);
    cJSON_AddNumberToObject(js, "steps", (double)res->steps);
    cJSON_AddNumberToObject(js, "tokens", (double)positions);
    cJSON_AddNumberToObject(js, "trained_tokens", (double)tokens);
    cJSON_AddNumberToObject(js, "time_s", res->time_s);
    cJSON_AddNumberToObject(js, "tokens_per_s", res->tokens_per_s);
    const char *keys[3] = {"final_train_loss", "initial_eval_loss", "final_eval_loss"};
    double vals[3] = {res->final_train_loss, res->initial_eval_loss, res->final_eval_loss};
    for (int i = 0; i < 3; i++) {
        if (isfinite(vals[i])) cJSON_AddNumberToObject(js, keys[i], vals[i]);
        else cJSON_AddNullToObject(js, keys[i]);
    }
    cJSON_AddNumberToObject(js, "n_train", (double)res->n_train);
    cJSON_AddNumberToObject(js, "n_eval", (double)res->n_eval);
    cJSON_AddNumberToObject(js, "n_skipped", (double)res->n_skipped);
    cJSON_AddNumberToObject(js, "n_truncated", (double)res->n_truncated);
    cJSON_AddNumberToObject(js, "n_dropped", (double)res->n_dropped);
    char *out = cJSON_Print(js);
    cJSON_Delete(js);
    if (!out) return ft_err(-ENOMEM, "out of memory writing summary.json");
    FT_TRY(ft_path_join(path, sizeof path, c->out, "summary.json"));
    int wrc = ft_write_file_atomic(path, out, strlen(out));
    free(out);
    FT_TRY(wrc);
    info(cb, user, FT_EV_DONE, "adapter written to %s", c->out);
    return 0;
}

int ft_train_run(const ft_train_cfg *cfg, ft_train_cb cb, void *user, ft_train_result *res)
{
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    int rc = train_inner(&r, cfg, cb, user, res);
    run_free(&r);
    return rc;
}
