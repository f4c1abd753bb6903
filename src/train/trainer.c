/* trainer.c - the training loop (see trainer.h). */
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "adapters/peft.h"
#include "kernels/kernels.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "offload/place.h"
#include "offload/prefetch.h"
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/template/chat.h"
#include "src/formats/hub_cache.h"
#include "src/model/model.h"
#include "src/train/checkpoint.h"
#include "src/train/correction.h"
#include "src/train/dpo_refcache.h"
#include "src/train/dpo_run.h"
#include "src/train/metrics.h"
#include "src/train/schedule.h"
#include "src/train/validate.h"

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
    c->save_every = 200;
    c->keep = 2;
    c->max_bad_steps = 5;
    c->dpo.beta = 0.1; /* TRL's DPOConfig */
    c->dpo.loss_type = FT_DPO_SIGMOID;
    c->dpo.simpo_gamma = 0.5; /* LLaMA-Factory's simpo_gamma */
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
    char line[2048];
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
    ft_pack_file *pack;         /* the NF4 base (--quant nf4), or NULL */
    ft_pack_preview *preview;   /* `ftune plan` of a pack not built yet: its sizes and probe */
    ft_metrics met;
    char *cfg_json;             /* the run config stored in checkpoints */
    double *ref_train, *ref_eval; /* DPO: reference nlls by pair (dpo_run.h), 2 per pair */
    double eval_reward_accuracy;  /* DPO: the last evaluation's (NAN before one) */
    int quant;                    /* FT_PACK_QUANT_* of the base */
    char base_name[4200];         /* adapter_config.json's base_model_name_or_path: --model, or
                                   * the id of a Hugging Face cache snapshot (hub_cache.h) */
} run;

static void run_free(run *r)
{
    ft_metrics_close(&r->met);
    if (r->ex_ok) ft_exec_free(&r->ex);
    ft_pack_close(r->pack);
    ft_pack_preview_free(r->preview);
    free(r->preview);
    if (r->lora_ok) ft_lora_free(&r->lora);
    ft_backend_free(r->be);
    ft_batches_free(r->train_b, r->n_train_b);
    ft_batches_free(r->eval_b, r->n_eval_b);
    ft_dataset_free(&r->ds);
    ft_tok_free(r->tok);
    ft_model_free(r->model);
    free(r->cfg_json);
    free(r->ref_train);
    free(r->ref_eval);
}

/* One evaluation of the held-out batches at `step`, written to metrics.jsonl and reported:
 * *loss is the mean token loss, or with DPO the mean pair loss (and the reward metrics);
 * *tokens the target tokens read. */
static int eval_and_log(run *r, const ft_train_cfg *c, int64_t step, int64_t total, double elapsed_s,
                        ft_train_cb cb, void *user, double *loss, int64_t *tokens)
{
    ft_dpo_stats ps;
    int dpo = c->method == FT_METHOD_DPO;
    if (dpo) {
        FT_TRY(ft_dpo_evaluate(&r->ex, r->eval_b, r->n_eval_b, c->eval_max_batches, r->ref_eval,
                               &c->dpo, &ps));
        *loss = ps.pairs ? ps.loss / (double)ps.pairs : NAN;
        *tokens = ps.tokens;
    } else {
        FT_TRY(evaluate(&r->ex, r->eval_b, r->n_eval_b, c->eval_max_batches, loss, tokens));
    }
    FT_TRY(ft_metrics_eval(&r->met, step, *loss, *tokens, elapsed_s, dpo ? &ps : NULL));
    ft_train_event ev = {.kind = FT_EV_EVAL, .step = step, .total_steps = total, .eval_loss = *loss};
    if (dpo && ps.pairs) {
        ev.pref = 1;
        ev.reward_accuracy = ps.accurate / (double)ps.pairs;
        ev.reward_margin = ps.margin / (double)ps.pairs;
        r->eval_reward_accuracy = ev.reward_accuracy;
    }
    emit(cb, user, &ev);
    return 0;
}

/* Fingerprint of the tokenized data as training sees it: order, lengths, ids and labels
 * of the train and, when they were split off the training file (split = 1), the eval
 * examples (covers the file, schema, template, tokenizer, split). The examples of
 * --eval-data (split = 0) are left out: they change no training state, so a resume may
 * change that file; the fingerprint is then that of a run with --eval-fraction 0, whose
 * training is the same. */
static uint64_t data_fingerprint(const ft_dataset *ds, int split)
{
    uint64_t h = FT_CKPT_HASH_INIT;
    if (ds->n_files > 1) { /* several --data: also how many examples each file gave, in
                            * order (one file hashes as before, so its checkpoints resume) */
        h = ft_ckpt_hash(h, &ds->n_files, sizeof ds->n_files);
        for (int64_t i = 0; i < ds->n_files; i++)
            h = ft_ckpt_hash(h, &ds->files[i].n_examples, sizeof ds->files[i].n_examples);
    }
    const ft_example *sets[2] = {ds->train, ds->eval};
    int64_t ns[2] = {ds->n_train, split ? ds->n_eval : 0};
    for (int k = 0; k < 2; k++) {
        h = ft_ckpt_hash(h, &ns[k], sizeof ns[k]);
        for (int64_t i = 0; i < ns[k]; i++) {
            const ft_example *e = &sets[k][i];
            h = ft_ckpt_hash(h, &e->n, sizeof e->n);
            h = ft_ckpt_hash(h, e->ids, (size_t)e->n * sizeof *e->ids);
            h = ft_ckpt_hash(h, e->labels, (size_t)e->n * sizeof *e->labels);
        }
    }
    return h;
}

/* Fingerprint (16 hex digits into buf) of the held-out batches an evaluation reads (the first
 * eval_max_batches of them): their token ids and targets. Eval losses, and so the best eval
 * loss and early stopping, compare only within one such set. */
static void eval_set_id(const run *r, const ft_train_cfg *c, char *buf, size_t n)
{
    uint64_t h = FT_CKPT_HASH_INIT;
    int64_t nb = r->n_eval_b;
    if (c->eval_max_batches > 0 && nb > c->eval_max_batches) nb = c->eval_max_batches;
    h = ft_ckpt_hash(h, &nb, sizeof nb);
    for (int64_t i = 0; i < nb; i++) {
        const ft_batch *b = &r->eval_b[i];
        h = ft_ckpt_hash(h, &b->T, sizeof b->T);
        h = ft_ckpt_hash(h, b->ids, (size_t)b->T * sizeof *b->ids);
        h = ft_ckpt_hash(h, b->targets, (size_t)b->T * sizeof *b->targets);
    }
    snprintf(buf, n, "%016llx", (unsigned long long)h);
}

/* On --resume: eval losses of another held-out set (--eval-data or --eval-max changed) do not
 * compare with the checkpoint's best, so the best and the early-stopping count start over
 * (the next evaluation is the first counted one, and with --save-best replaces OUT/best).
 * A checkpoint without the fingerprint is taken to be of the current set. */
static void resume_eval_set(const run *r, const ft_train_cfg *c, ft_ckpt_state *st,
                            ft_train_cb cb, void *user)
{
    char cur[sizeof st->eval_set];
    eval_set_id(r, c, cur, sizeof cur);
    if (st->eval_set[0] && strcmp(st->eval_set, cur) && st->n_evals > 0) {
        info(cb, user, FT_EV_WARN, "the held-out set differs from the one of the checkpoint's eval losses (--eval-data or --eval-max changed): the best eval loss (%.4f at step %lld) and early stopping start over at the next evaluation%s",
             st->best_eval_loss, (long long)st->best_eval_step,
             c->save_best ? ", which replaces OUT/best" : "");
        st->best_eval_loss = NAN;
        st->best_eval_step = st->best_saved_step = 0;
        st->n_evals = st->evals_no_improve = 0;
    }
    memcpy(st->eval_set, cur, sizeof cur);
}

/* Adds "data": the training file's name, or with several an array of them in order (the
 * shape of the --config key). */
static void add_data_json(cJSON *o, const ft_train_cfg *c)
{
    if (c->n_data == 1) {
        cJSON_AddStringToObject(o, "data", c->data[0]);
        return;
    }
    cJSON *a = cJSON_AddArrayToObject(o, "data");
    for (int64_t i = 0; i < c->n_data; i++) cJSON_AddItemToArray(a, cJSON_CreateString(c->data[i]));
}

/* "a.jsonl" or "a.jsonl, b.jsonl" (a "data" value of add_data_json) into buf, for messages. */
static void data_names(const cJSON *v, char *buf, size_t n)
{
    buf[0] = 0;
    if (cJSON_IsString(v)) {
        snprintf(buf, n, "%s", v->valuestring);
        return;
    }
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it) || k + 1 >= n) continue;
        int w = snprintf(buf + k, n - k, "%s%s", k ? ", " : "", it->valuestring);
        if (w > 0) k = k + (size_t)w < n ? k + (size_t)w : n - 1;
    }
    if (!buf[0]) snprintf(buf, n, "?");
}

/* The run config stored in checkpoints (JSON text, malloc'ed): every key outside "info"
 * changes the training trajectory and must match on --resume (ft_ckpt_config_diff). */
/* What the DPO reference is, for the run config: "base", or "init-adapter " and a fingerprint
 * of --init-adapter's weights file (its name may change on resume, its weights may not). */
static int dpo_reference_id(const ft_train_cfg *c, char *buf, size_t n)
{
    if (ft_dpo_reference_free(c->dpo.loss_type)) {
        snprintf(buf, n, "none");
        return 0;
    }
    if (!c->init_adapter) {
        snprintf(buf, n, "base");
        return 0;
    }
    char path[4200], *bytes = NULL;
    size_t len = 0;
    FT_TRY(ft_path_join(path, sizeof path, c->init_adapter, "adapter_model.safetensors"));
    int rc = ft_read_file(path, &bytes, &len);
    if (rc < 0) return ft_err_prefix(rc, "--init-adapter");
    snprintf(buf, n, "init-adapter %016llx",
             (unsigned long long)ft_ckpt_hash(FT_CKPT_HASH_INIT, bytes, len));
    free(bytes);
    return 0;
}

static char *run_config(const ft_train_cfg *c, const ft_lora_cfg *lc, const ft_model *m,
                        const ft_dataset *ds, int64_t seq_len, int64_t total, int64_t warmup,
                        int64_t n_params, int quant, const char *dpo_ref)
{
    const ft_model_config *mc = &m->cfg;
    char buf[64];
    cJSON *o = cJSON_CreateObject();
    snprintf(buf, sizeof buf, "%s L%lld C%lld F%lld H%lld/%lld V%lld", mc->model_type,
             (long long)mc->num_hidden_layers, (long long)mc->hidden_size,
             (long long)mc->intermediate_size, (long long)mc->num_attention_heads,
             (long long)mc->num_key_value_heads, (long long)mc->vocab_size);
    cJSON_AddStringToObject(o, "model_shape", buf);
    int split = !c->eval_data;
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)data_fingerprint(ds, split));
    cJSON_AddStringToObject(o, "data_fingerprint", buf);
    cJSON_AddNumberToObject(o, "n_train", (double)ds->n_train);
    /* examples held out of the training file (0 with --eval-data: all of it trains) */
    cJSON_AddNumberToObject(o, "n_eval", split ? (double)ds->n_eval : 0.0);
    cJSON_AddNumberToObject(o, "seq_len", (double)seq_len);
    cJSON_AddNumberToObject(o, "batch_size", (double)c->batch_size);
    cJSON_AddNumberToObject(o, "grad_accum", (double)c->grad_accum);
    cJSON_AddNumberToObject(o, "total_steps", (double)total);
    cJSON_AddNumberToObject(o, "warmup_steps", (double)warmup);
    cJSON_AddStringToObject(o, "schedule", ft_schedule_name(c->schedule));
    cJSON_AddNumberToObject(o, "lr", c->lr);
    cJSON_AddNumberToObject(o, "min_lr_ratio", c->min_lr_ratio);
    cJSON_AddNumberToObject(o, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(o, "adam_beta1", c->adam_beta1);
    cJSON_AddNumberToObject(o, "adam_beta2", c->adam_beta2);
    cJSON_AddNumberToObject(o, "adam_eps", c->adam_eps);
    cJSON_AddNumberToObject(o, "max_grad_norm", c->max_grad_norm);
    /* LoRA+ shapes the trajectory; recorded only when on, so that checkpoints written
     * before the flag existed still resume (a changed ratio is named by the diff) */
    if (c->loraplus_lr_ratio > 0)
        cJSON_AddNumberToObject(o, "loraplus_lr_ratio", c->loraplus_lr_ratio);
    /* NEFTune's noise shapes it too; likewise recorded only when on */
    if (c->neftune_noise_alpha > 0)
        cJSON_AddNumberToObject(o, "neftune_noise_alpha", c->neftune_noise_alpha);
    /* the objective: recorded only for DPO, so that SFT checkpoints of before still resume */
    if (c->method == FT_METHOD_DPO) {
        cJSON_AddStringToObject(o, "method", "dpo");
        cJSON_AddStringToObject(o, "dpo_loss", ft_dpo_loss_name(c->dpo.loss_type));
        cJSON_AddNumberToObject(o, "dpo_beta", c->dpo.beta);
        cJSON_AddNumberToObject(o, "dpo_label_smoothing", c->dpo.label_smoothing);
        if (c->dpo.loss_type == FT_DPO_SIMPO)
            cJSON_AddNumberToObject(o, "simpo_gamma", c->dpo.simpo_gamma);
        /* the reference model: a resume with another --init-adapter (or none) would change
         * every loss, unlike SFT's, where the checkpoint's adapter replaces it */
        cJSON_AddStringToObject(o, "dpo_reference", dpo_ref);
    }
    cJSON_AddNumberToObject(o, "lora_r", (double)lc->r);
    cJSON_AddNumberToObject(o, "lora_alpha", lc->alpha);
    cJSON_AddNumberToObject(o, "lora_dropout", lc->dropout);
    cJSON_AddBoolToObject(o, "use_rslora", lc->use_rslora);
    cJSON *t = cJSON_AddArrayToObject(o, "lora_targets");
    for (int p = 0; p < FT_N_PROJ; p++)
        if (lc->targets & (1u << p)) cJSON_AddItemToArray(t, cJSON_CreateString(ft_proj_name[p]));
    cJSON_AddNumberToObject(o, "n_params", (double)n_params);
    /* the base's quantization shapes the trajectory; recorded only for NF4 so that
     * checkpoints written before --quant existed (all bf16) still resume */
    if (quant == FT_PACK_QUANT_NF4) cJSON_AddStringToObject(o, "base_quant", "nf4");
    if (quant == FT_PACK_QUANT_NF4 && c->quant_correction) { /* likewise only when used */
        cJSON_AddStringToObject(o, "quant_correction", ft_qcorr_name(c->quant_correction));
        if (c->quant_correction == FT_QCORR_CALIBRATED)
            cJSON_AddNumberToObject(o, "quant_correction_tokens", (double)c->quant_correction_tokens);
    }
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)c->seed); /* > 2^53 as a string */
    cJSON_AddStringToObject(o, "seed", buf);
    /* "info": recorded, free to change on resume */
    cJSON *info = cJSON_AddObjectToObject(o, "info");
    cJSON_AddStringToObject(info, "model", c->model);
    add_data_json(info, c);
    if (c->eval_data) {
        cJSON_AddStringToObject(info, "eval_data", c->eval_data);
        cJSON_AddNumberToObject(info, "n_eval_data", (double)ds->n_eval);
    }
    if (c->init_adapter) cJSON_AddStringToObject(info, "init_adapter", c->init_adapter);
    cJSON_AddNumberToObject(info, "max_steps", (double)c->max_steps);
    cJSON_AddNumberToObject(info, "epochs", c->epochs);
    cJSON_AddNumberToObject(info, "threads", c->threads);
    cJSON_AddNumberToObject(info, "eval_every", (double)c->eval_every);
    /* they end the run earlier or keep a copy of an adapter; the steps taken are the same */
    cJSON_AddBoolToObject(info, "save_best", c->save_best);
    cJSON_AddNumberToObject(info, "early_stopping_patience", (double)c->early_stopping_patience);
    cJSON_AddNumberToObject(info, "early_stopping_threshold", c->early_stopping_threshold);
    char *s = ft_ckpt_json_print(o, 0); /* numbers exact: they are compared on resume */
    cJSON_Delete(o);
    return s;
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

/* Writes checkpoint st->step, prunes old ones, reports it. */
static int save_checkpoint(run *r, const ft_train_cfg *c, ft_ckpt_state *st, double elapsed,
                           ft_train_cb cb, void *user, ft_train_result *res)
{
    char path[4200];
    st->elapsed_s = elapsed;
    int rc = ft_ckpt_save(c->out, st, r->cfg_json, &r->lora, r->model, r->base_name, path, sizeof path);
    if (rc < 0) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        if (res->checkpoint[0])
            return ft_err(rc, "%s; the previous checkpoint %s is intact", msg, res->checkpoint);
        return ft_err(rc, "%s; no earlier checkpoint of this run exists", msg);
    }
    snprintf(res->checkpoint, sizeof res->checkpoint, "%s", path);
    ft_ckpt_prune(c->out, st->step, st->run_id, c->keep); /* best effort */
    ft_train_event ev = {.kind = FT_EV_CKPT, .text = path, .step = st->step,
                         .total_steps = st->total_steps};
    emit(cb, user, &ev);
    return 0;
}

/* Packs the training micro-batches of `epoch` (epoch 0 uses the seed itself). */
static int pack_epoch(run *r, const ft_train_cfg *c, int64_t seq_len, int64_t epoch)
{
    ft_batches_free(r->train_b, r->n_train_b);
    r->train_b = NULL;
    r->n_train_b = 0;
    if (c->method == FT_METHOD_DPO)
        return ft_pack_pairs(&r->train_b, &r->n_train_b, r->ds.train, r->ds.n_train / 2, seq_len,
                             c->batch_size, c->seed + (uint64_t)epoch);
    return ft_pack(&r->train_b, &r->n_train_b, r->ds.train, r->ds.n_train, seq_len,
                   c->batch_size, c->seed + (uint64_t)epoch);
}

/* DPO: the reference log-probabilities of every train and eval pair (dpo_run.h), from the
 * adapter as it is now: the run's starting adapter (a resume calls this before loading the
 * checkpoint's). They are kept in OUT/dpo_reference.bin under the run id st->run_id, and a
 * resume reads back the parts of its run (dpo_refcache.h) instead of computing them again. */
static int dpo_reference(run *r, const ft_train_cfg *c, const ft_ckpt_state *st, ft_train_cb cb,
                         void *user)
{
    double tr0 = now_s();
    int64_t np_train = r->ds.n_train / 2, np_eval = r->ds.n_eval / 2;
    r->ref_train = calloc((size_t)(2 * (np_train ? np_train : 1)), sizeof *r->ref_train);
    r->ref_eval = calloc((size_t)(2 * (np_eval ? np_eval : 1)), sizeof *r->ref_eval);
    if (!r->ref_train || !r->ref_eval) return ft_err(-ENOMEM, "out of memory for reference log-probabilities");
    if (ft_dpo_reference_free(c->dpo.loss_type)) { /* the arrays stay zero, unread */
        char g[64] = "";
        if (c->dpo.loss_type == FT_DPO_SIMPO) snprintf(g, sizeof g, ", gamma %g", c->dpo.simpo_gamma);
        info(cb, user, FT_EV_INFO, "preference optimization (%s loss, beta %g%s): reference-free, on the log-probabilities averaged per completion token; %lld train and %lld eval pairs",
             ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, g, (long long)np_train, (long long)np_eval);
        return 0;
    }
    ft_dpo_ref_key key;
    memset(&key, 0, sizeof key);
    snprintf(key.run_id, sizeof key.run_id, "%s", st->run_id);
    eval_set_id(r, c, key.eval_set, sizeof key.eval_set);
    /* a bf16 base read from its pack (streamed, or a pack-only folder) has the pack's bf16
     * embeddings and LM head, the resident one the checkpoint's: for an fp32/fp16 checkpoint
     * the reference differs, so the two are told apart ("cuda+pack") */
    snprintf(key.backend, sizeof key.backend, "%.10s%s", r->be->ops->name,
             r->pack && r->quant == FT_PACK_QUANT_BF16 ? "+pack" : "");
    key.quant = r->quant;
    /* the model itself: a resume may name another folder or file of the same shapes */
    if (r->pack) key.model_id = ft_pack_header(r->pack)->identity;
    else if (ft_pack_model_identity(c->model, &key.model_id) < 0) key.model_id = 0;
    int got_train = 0, got_eval = 0;
    char why[512] = "";
    if (c->resume)
        FT_TRY(ft_dpo_ref_load(c->out, &key, r->ref_train, np_train, r->ref_eval, np_eval,
                               &got_train, &got_eval, why, sizeof why));
    if (why[0]) info(cb, user, FT_EV_INFO, "DPO reference log-probabilities computed again: %s", why);
    if (!got_train)
        FT_TRY(ft_dpo_reference(&r->ex, r->train_b, r->n_train_b, 0, r->ref_train, np_train));
    if (r->n_eval_b && !got_eval)
        FT_TRY(ft_dpo_reference(&r->ex, r->eval_b, r->n_eval_b, c->eval_max_batches, r->ref_eval,
                                np_eval));
    if (!got_train || !got_eval) {
        int rc = ft_dpo_ref_save(c->out, &key, r->ref_train, np_train, r->ref_eval, np_eval);
        if (rc < 0) /* the run goes on: a resume would compute them again */
            info(cb, user, FT_EV_WARN, "could not keep the DPO reference log-probabilities: %s", ft_errmsg());
    }
    char ls[64] = "";
    if (c->dpo.loss_type == FT_DPO_ROBUST)
        snprintf(ls, sizeof ls, ", label smoothing %g", c->dpo.label_smoothing);
    const char *from = c->init_adapter ? "base model with --init-adapter" : "base model";
    if (got_train && got_eval)
        info(cb, user, FT_EV_INFO, "DPO (%s loss, beta %g%s): reference log-probabilities of %lld train and %lld eval pairs from the %s, read back from %s/%s",
             ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, ls, (long long)np_train,
             (long long)np_eval, from, c->out, FT_DPO_REF_FILE);
    else
        info(cb, user, FT_EV_INFO, "DPO (%s loss, beta %g%s): reference log-probabilities of %lld train and %lld eval pairs from the %s, in %.1f s%s",
             ft_dpo_loss_name(c->dpo.loss_type), c->dpo.beta, ls, (long long)np_train,
             (long long)np_eval, from, now_s() - tr0,
             got_train ? " (the train pairs' read back, the eval pairs' computed)" : "");
    return 0;
}

/* Loads the checkpoint c->resume into r and st after checking its config against ours. */
static int resume_from(run *r, const ft_train_cfg *c, ft_ckpt_state *st, int64_t seq_len,
                       ft_train_cb cb, void *user)
{
    char *saved = NULL;
    ft_ckpt_state want = *st;
    int rc = ft_ckpt_load(c->resume, st, &saved, NULL);
    if (rc < 0) return ft_err_prefix(rc, "--resume %s", c->resume);
    rc = ft_ckpt_config_diff(saved, r->cfg_json);
    if (rc < 0) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        /* other training data: say so in terms of --data, naming both lists */
        cJSON *a = cJSON_Parse(saved), *b = cJSON_Parse(r->cfg_json);
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(a, "data_fingerprint");
        const cJSON *fb = cJSON_GetObjectItemCaseSensitive(b, "data_fingerprint");
        if (cJSON_IsString(fa) && cJSON_IsString(fb) && strcmp(fa->valuestring, fb->valuestring)) {
            char was[1024], now[1024];
            data_names(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a, "info"), "data"), was, sizeof was);
            data_names(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "info"), "data"), now, sizeof now);
            cJSON_Delete(a);
            cJSON_Delete(b);
            free(saved);
            return ft_err(rc, "--resume %s: --data differs from the checkpoint's (it trained on %s; this run reads %s): the training files, their contents and their order must not change on resume (to train on other data, start a new run with --init-adapter %s); %s",
                          c->resume, was, now, c->resume, msg);
        }
        cJSON_Delete(a);
        cJSON_Delete(b);
        free(saved);
        return ft_err(rc, "--resume %s: %s. Resume with the flags of the original run (--threads, eval, logging and checkpoint flags may change); to train on with other settings, start a new run with --init-adapter %s",
                      c->resume, msg, c->resume);
    }
    free(saved);
    /* DPO: the reference is the starting adapter, still in r->lora until the load below */
    if (c->method == FT_METHOD_DPO) FT_TRY(dpo_reference(r, c, st, cb, user));
    rc = ft_ckpt_load(c->resume, st, NULL, &r->lora);
    if (rc < 0) return ft_err_prefix(rc, "--resume %s", c->resume);
    if (st->total_steps != want.total_steps || st->warmup_steps != want.warmup_steps)
        return ft_err(FT_E_INVALID, "--resume %s: schedule of %lld steps (warmup %lld), this run has %lld (%lld)",
                      c->resume, (long long)st->total_steps, (long long)st->warmup_steps,
                      (long long)want.total_steps, (long long)want.warmup_steps);
    if (st->epoch > 0) FT_TRY(pack_epoch(r, c, seq_len, st->epoch));
    if (st->cursor > r->n_train_b)
        return ft_err(FT_E_CORRUPT, "%s/" FT_CKPT_STATE_FILE ": \"cursor\" %lld beyond the %lld micro-batches of epoch %lld",
                      c->resume, (long long)st->cursor, (long long)r->n_train_b, (long long)st->epoch);
    return 0;
}

/* GiB, for messages. */
static double gib(double bytes) { return bytes / 1073741824.0; }

/* The device memory a run may use: what is in use already (CUDA context, workspace, the
 * adapter and its moments), the budget (--gpu-mem, else the GPU's total), and what is left
 * of it (never more than is free). */
static int device_budget(run *r, const ft_train_cfg *c, size_t *used, size_t *budget,
                         size_t *avail, size_t *total)
{
    ft_mem_budget b;
    FT_TRY(ft_backend_mem_budget(r->be, c->gpu_mem, 0, &b));
    *used = b.used;
    *budget = b.budget;
    *avail = b.avail;
    *total = b.total;
    return 0;
}

/* The device memory (bytes) of a run with the bf16 base resident (every layer in device
 * memory, plan_device_memory's executor, 1 GiB spare) and what the budget leaves for it. */
static int resident_need(run *r, const ft_train_cfg *c, int64_t T, size_t *need, size_t *avail,
                         size_t *used)
{
    size_t budget, total;
    FT_TRY(device_budget(r, c, used, &budget, avail, &total));
    *need = ft_exec_bytes(r->be, r->model, &r->lora, T, c->grad_accum > 0 ? c->grad_accum : 1) +
            FT_EXEC_SPARE_BYTES;
    return 0;
}

/* Chooses the base's quantization (--quant, or auto: bf16 unless a device backend's budget
 * cannot hold the bf16 base, then nf4) and says why in `why`. NF4 needs a backend that
 * dequantizes it (the CPU on the host, CUDA with dequant_nf4): FT_E_UNSUPPORTED on another,
 * naming the way out. */
static int choose_quant(run *r, const ft_train_cfg *c, int64_t T, int *quant, char *why, size_t n)
{
    why[0] = 0;
    if (r->model->pack_only[0]) { /* only the pack exists: its quantization it is */
        int pq = ft_pack_quant_of_path(r->model->pack_only);
        if (c->quant != FT_TRAIN_QUANT_AUTO && c->quant != pq)
            return ft_err(FT_E_INVALID, "%s holds only %s (a pack-only model): --quant %s cannot be "
                          "served; drop --quant", c->model, r->model->pack_only,
                          ft_pack_quant_name(c->quant));
        *quant = pq;
        snprintf(why, n, "the model folder holds only the pack %.160s", r->model->pack_only);
    } else if (c->quant == FT_PACK_QUANT_NF4 || c->quant == FT_PACK_QUANT_BF16) {
        *quant = c->quant;
    } else if (c->quant != FT_TRAIN_QUANT_AUTO) {
        return ft_err(FT_E_INVALID, "unknown base quantization %d (nf4, bf16)", c->quant);
    } else if (r->be->ops->host_memory) {
        *quant = FT_PACK_QUANT_BF16;
        snprintf(why, n, "auto: the %s backend holds the base in host memory", r->be->ops->name);
    } else {
        size_t need, avail, used;
        FT_TRY(resident_need(r, c, T, &need, &avail, &used));
        *quant = need <= avail ? FT_PACK_QUANT_BF16 : FT_PACK_QUANT_NF4;
        snprintf(why, n, "auto: the bf16 base run needs %.2f GiB, %s allows %.2f GiB",
                 gib((double)need), c->gpu_mem > 0 ? "--gpu-mem" : "the GPU", gib((double)avail));
    }
    if (*quant == FT_PACK_QUANT_NF4 && !r->be->ops->host_memory && !r->be->ops->dequant_nf4)
        return ft_err(FT_E_UNSUPPORTED, "QLoRA (--quant nf4%s%s) needs NF4 kernels, which the %s "
                      "backend lacks; use --device cpu%s",
                      why[0] ? "; " : "", why, r->be->ops->name,
                      c->quant == FT_TRAIN_QUANT_AUTO
                          ? ", a larger --gpu-mem, or a smaller --batch-size, --seq-len or --grad-accum"
                          : " or --quant bf16");
    return 0;
}

/* `ftune plan` (plan_only) of a base whose pack is not in the cache (or not usable there): the
 * pack is not built; r->preview gets the sizes it will have and, for a device backend's probe,
 * a probe pack of layer 0's block (offload/pack.h ft_pack_preview_make; nothing stays in the
 * cache folder). Reported as a plan line: the size, where it goes, the build time estimate. */
static int preview_pack(run *r, const ft_train_cfg *c, const ft_pack_settings *ps,
                        const ft_pack_ensure_info *pi, ft_train_cb cb, void *user)
{
    if (pi->action == FT_PACK_REBUILT)
        info(cb, user, FT_EV_WARN, "the cached pack is not usable (`ftune train` rebuilds it): %s",
             pi->reason);
    r->preview = calloc(1, sizeof *r->preview);
    if (!r->preview) return ft_err(-ENOMEM, "out of memory");
    int probe = !r->be->ops->host_memory; /* the CPU backend's plan measures nothing */
    FT_TRY(ft_pack_preview_make(c->model, r->model, pi->path, ps, probe, r->preview));
    const ft_pack_preview *pv = r->preview;
    char est[256] = "", t[32];
    double e = pv->build_estimate_s;
    if (e >= 600) snprintf(t, sizeof t, "%.0f min", ceil(e / 60));
    else snprintf(t, sizeof t, e >= 10 ? "%.0f s" : "%.1f s", e);
    if (e > 0)
        snprintf(est, sizeof est, "; building it takes about %s (layer 0's block took %.3f s here; "
                 "the final fsync not counted)", t, pv->probe_seconds);
    info(cb, user, FT_EV_PLAN, "plan: the %s pack is not built yet: `ftune train` first writes "
         "%llu bytes (%.2f GB: %lld layer blocks of up to %llu bytes, embeddings and head %llu "
         "bytes) to %s%s", ft_pack_quant_name(pv->quant), (unsigned long long)pv->file_bytes,
         pv->file_bytes / 1e9, (long long)pv->n_layers, (unsigned long long)pv->max_layer_bytes,
         (unsigned long long)pv->block_bytes[pv->n_layers], pv->path, est);
    return 0;
}

/* Finds or builds the pack of the model in `quant` (NF4, or bf16 for a bf16 base streamed by
 * the offload executor) under --cache-dir and opens it (checksums were verified by
 * ft_pack_ensure when it was reused); reports what happened: a rebuilt pack (truncated,
 * corrupted, other settings) as a warning naming the reason. `ftune plan` opens a usable pack
 * the same way, and builds none: see preview_pack. */
typedef struct pack_wait { ft_train_cb cb; void *user; } pack_wait;

static void pack_wait_note(const char *path, long pid, void *u)
{
    const pack_wait *w = u;
    char line[4400];
    ft_pack_wait_text(line, sizeof line, path, pid);
    info(w->cb, w->user, FT_EV_INFO, "pack: %s", line);
}

static int open_pack(run *r, const ft_train_cfg *c, int quant, ft_train_cb cb, void *user)
{
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, quant);
    ft_pack_ensure_info *pi = malloc(sizeof *pi);
    if (!pi) return ft_err(-ENOMEM, "out of memory");
    pack_wait pw = {cb, user};
    int rc = c->plan_only ? ft_pack_locate(c->model, c->cache_dir, &ps, pi) /* builds nothing */
                          : ft_pack_ensure_loaded(c->model, r->model, c->cache_dir, &ps, 0, pi,
                                                  pack_wait_note, &pw);
    if (!rc && c->plan_only && pi->action != FT_PACK_REUSED) {
        rc = preview_pack(r, c, &ps, pi, cb, user);
        free(pi);
        return rc;
    }
    if (!rc && pi->action == FT_PACK_REBUILT)
        info(cb, user, FT_EV_WARN, "the cached pack was not usable, rebuilt it: %s", pi->reason);
    if (!rc && pi->action == FT_PACK_REUSED)
        info(cb, user, FT_EV_INFO, "pack: reusing %s (identity and settings match, checksums %s)%s",
             pi->path, pi->verified ? "verified" : "verified at an earlier start: its .verified "
             "stamp matches the file", pi->waited_s > 0 ? "; another run built it" : "");
    else if (!rc)
        info(cb, user, FT_EV_INFO, "pack: built %s: %.1f MB in %.1f s (%.1f MB/s), largest layer block %.1f MB",
             pi->path, pi->stats.file_bytes / 1e6, pi->stats.seconds,
             pi->stats.seconds > 0 ? pi->stats.file_bytes / 1e6 / pi->stats.seconds : 0.0,
             pi->stats.max_layer_bytes / 1e6);
    if (!rc) rc = ft_pack_open(&r->pack, pi->path, 0);
    free(pi);
    return rc;
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
static int setup_correction(run *r, const ft_train_cfg *c, int quant, ft_train_cb cb, void *user,
                            ft_train_result *res)
{
    if (!c->quant_correction) return 0;
    if (quant != FT_PACK_QUANT_NF4) {
        info(cb, user, FT_EV_INFO, "quant correction: none (the base is not quantized)");
        return 0;
    }
    if (c->resume) {
        FT_TRY(ft_correction_load(&r->lora, c->out));
        info(cb, user, FT_EV_INFO, "quant correction: %s, read from %s/" FT_QCORR_DIR,
             ft_qcorr_name(c->quant_correction), c->out);
        return 0;
    }
    if (c->plan_only) {
        float *zero = calloc((size_t)r->lora.n_params, sizeof *zero);
        if (!zero) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_lora_set_fixed(&r->lora, zero);
        free(zero);
        if (rc) return rc;
        info(cb, user, FT_EV_INFO, "quant correction: %s, computed at the start of the real run "
             "(the plan counts its memory)", ft_qcorr_name(c->quant_correction));
        return 0;
    }
    ft_qcorr_cfg qc = {c->quant_correction, c->quant_correction_tokens, 0.01, c->threads, c->seed};
    ft_qcorr_stats st;
    FT_TRY(ft_correction_compute(&r->lora, r->model, r->pack, r->train_b, r->n_train_b, &qc,
                                 c->out, r->base_name, &st));
    double red = st.err_before > 0 ? 1.0 - st.err_after / st.err_before : 0.0;
    res->qcorr_reduction = red;
    res->qcorr_tokens = st.tokens;
    info(cb, user, FT_EV_INFO, "quant correction: %s, rank %lld%s%lld%s: %s error of the NF4 base %.1f%% smaller, in %.1f s; saved to %s/" FT_QCORR_DIR,
         ft_qcorr_name(c->quant_correction), (long long)r->lora.cfg.r,
         st.tokens ? " on " : "", (long long)st.tokens, st.tokens ? " calibration tokens" : "",
         st.tokens ? "output" : "weight", 100.0 * red, st.seconds, c->out);
    return 0;
}

/* Sizes the executor against the device memory budget (--gpu-mem, else what is free) and
 * creates it: refuses up front, naming the smallest budget that would work, rather than
 * failing mid-run; then keeps every layer's activations (no recompute in the backward) when
 * they fit too, with 1 GiB to spare for cuBLAS and the CUDA context's growth. Host-memory
 * backends (CPU) skip the budget and keep the recompute schedule. A packed base on a device
 * goes through place_offload instead. */
static int plan_device_memory(run *r, const ft_train_cfg *c, int64_t T, int64_t seq_len)
{
    ft_backend *be = r->be;
    size_t need = ft_exec_bytes(be, r->model, &r->lora, T, c->grad_accum);
    size_t wb = ft_exec_weight_bytes(be, r->model);
    if (be->ops->host_memory) {
        FT_TRY(ft_exec_init(&r->ex, be, r->model, &r->lora, T, c->grad_accum, seq_len));
        r->ex_ok = 1;
        return 0;
    }
    size_t used, budget, avail, total_b;
    FT_TRY(device_budget(r, c, &used, &budget, &avail, &total_b));
    size_t free_b = total_b - used;
    const size_t spare = FT_EXEC_SPARE_BYTES;
    if (need + spare > avail)
        return ft_err(FT_E_RANGE, "the run needs at least %.2f GiB of GPU memory (%.2f GiB in use "
                      "by the CUDA context and the adapter, %.2f GiB of base weights, "
                      "%.2f GiB of activation checkpoints and workspace, 1 GiB spare) but %s "
                      "allows %.2f GiB: use --gpu-mem %.0fG or more, or a smaller --batch-size, "
                      "--seq-len or --grad-accum",
                      gib((double)(used + need + spare)), gib((double)used), gib((double)wb),
                      gib((double)(need - wb)),
                      c->gpu_mem > 0 ? "--gpu-mem" : "the GPU's free memory",
                      gib((double)(c->gpu_mem > 0 ? budget : used + free_b)),
                      ceil(gib((double)(used + need + spare))));
    FT_TRY(ft_exec_init(&r->ex, be, r->model, &r->lora, T, c->grad_accum, seq_len));
    r->ex_ok = 1;
    int rc = ft_exec_keep_activations(&r->ex, avail - need - spare);
    return rc < 0 ? rc : 0;
}

/* Test hook: FTUNE_TEST_STOP_HOLD_MS=N makes a run stopped by a signal wait N ms before its
 * stop checkpoint, so that a test's second signal lands while the process still runs (on a
 * tiny model the save and exit take a few ms, less than a loaded test runner's reaction). */
static void test_stop_hold(void)
{
    const char *v = getenv("FTUNE_TEST_STOP_HOLD_MS");
    long long ms = v && *v ? strtoll(v, NULL, 10) : 0;
    for (long long i = 0; i < ms; i += 10) usleep(10000); /* a signal's _exit ends it */
}

/* Test hook (fault injection for tests/ref/test_resume.py): FTUNE_TEST_INF_EMBEDDING=ID sets
 * the input embedding row of token ID to +Inf once the weights are read, so that the
 * micro-batches holding that token give non-finite losses and gradients (the skipped-step
 * path) while the others train. A model file cannot carry such a row: the loaders refuse
 * non-finite weights. Only an untied model's table is touched (tied, the LM head would be
 * poisoned for every token). */
static int test_inf_embedding(ft_model *m, ft_train_cb cb, void *user)
{
    const char *v = getenv("FTUNE_TEST_INF_EMBEDDING");
    if (!v || !*v) return 0;
    char *end;
    long long id = strtoll(v, &end, 10);
    const int64_t C = m->cfg.hidden_size;
    if (*end || id < 0 || id >= m->cfg.vocab_size || !m->embed || m->embed == m->lm_head)
        return ft_err(FT_E_INVALID, "FTUNE_TEST_INF_EMBEDDING=%s: expected a token id below %lld of "
                      "a model with untied embeddings read into memory", v, (long long)m->cfg.vocab_size);
    for (int64_t i = 0; i < C; i++) m->embed[id * C + i] = INFINITY;
    info(cb, user, FT_EV_WARN, "test hook: the input embedding of token %lld is +Inf", id);
    return 0;
}

/* A packed base on a device backend: measured, planned (offload/place.h) and placed; the
 * plan's lines are reported; *grad_accum gets the planned micro-batch count, res->base_layers
 * the layers per tier. */
static int place_offload(run *r, const ft_train_cfg *c, int64_t T, int64_t seq_len,
                         int64_t *grad_accum, ft_train_cb cb, void *user, ft_train_result *res)
{
    ft_place_opts po = {T, seq_len, c->grad_accum, (uint64_t)c->gpu_mem, (uint64_t)c->host_mem,
                        NULL, NULL};
    if (r->n_train_b > 0 && r->train_b[0].T == T) { /* the probe sees the data's sequence lengths */
        po.pos = r->train_b[0].pos;
        po.seq_start = r->train_b[0].seq_start;
    }
    ft_place_result *pr = calloc(1, sizeof *pr);
    if (!pr) return ft_err(-ENOMEM, "out of memory");
    int rc;
    if (r->preview) { /* `ftune plan` of a pack not built yet */
        ft_place_nopack np = {r->preview->probe, r->preview->block_bytes, r->preview->disk_file,
                              r->preview->disk_same_device};
        rc = ft_place_preview(r->be, r->model, &r->lora, &np, &po, pr);
    } else {
        rc = ft_place_packed(r->be, r->model, &r->lora, r->pack, &po, !c->plan_only, &r->ex, pr);
    }
    if (!rc || pr->text[0]) {
        char disk[1200] = "";
        if (pr->disk_rate > 0)
            snprintf(disk, sizeof disk, "; disk %.2f GB/s (%s%s%s)", pr->disk_rate / 1e9, pr->disk_mode,
                     pr->disk_source[0] ? "; " : "", pr->disk_source);
        info(cb, user, FT_EV_INFO, "probe: one layer of %lld tokens: dequant %.2f ms, forward %.2f ms, "
             "backward %.2f ms; PCIe H2D %.1f GB/s%s",
             (long long)T, pr->t_dequant * 1e3, pr->in.t_fwd_layer * 1e3,
             pr->in.t_bwd_layer * 1e3, pr->in.rates.h2d / 1e9, disk);
        if (pr->nf4_probed)
            info(cb, user, FT_EV_INFO, "probe (FTUNE_NF4_GEMM=auto): one layer's forward + backward "
                 "%.2f ms with the NF4 projections dequantized per visit, %.2f ms with the fused "
                 "NF4 GEMM (outputs agree to %.1e; at most %.0e taken): %s",
                 pr->nf4_t_dequant_path * 1e3, pr->nf4_t_fused_path * 1e3, pr->nf4_err,
                 FT_PLACE_NF4_MAX_ERR, pr->nf4_fused ? "fused" : "dequantized");
        char *line = pr->text, *nl;
        while (line && *line) {
            nl = strchr(line, '\n');
            if (nl) *nl = 0;
            info(cb, user, FT_EV_PLAN, "%s", line);
            line = nl ? nl + 1 : NULL;
        }
    }
    if (!rc && !c->plan_only) {
        r->ex_ok = 1;
        size_t fb = 0, tb = 0;
        if (!ft_backend_mem_free(r->be, &fb, &tb))
            info(cb, user, FT_EV_INFO, "placed: device memory in use %.2f GiB of %.2f GiB (budget %.2f GiB), "
                 "host RSS %.2f GiB (budget %.2f GiB for the pinned pool and staging)",
                 gib((double)(tb - fb)), gib((double)tb), gib((double)pr->in.gpu_budget),
                 gib((double)ft_place_rss()), gib((double)pr->in.host_budget));
        char io[1024];
        ft_exec_io_describe(&r->ex, io, sizeof io);
        if (io[0]) info(cb, user, FT_EV_INFO, "%s", io);
    }
    *grad_accum = pr->plan.micro_batches;
    if (!rc)
        for (int t = 0; t < 3; t++) res->base_layers[t] = pr->plan.n_tier[t];
    free(pr);
    return rc;
}

/* One AdamW update of the whole adapter at the scheduled lr, adam step `step` (>= 1).
 * Without LoRA+ (cfg loraplus_lr_ratio 0): one call over the flat array. With it: the
 * parameter groups of PEFT's create_loraplus_optimizer (peft/optimizers/loraplus.py:
 * lora_A -> lr, lora_B -> lr * ratio, both with the same weight_decay coefficient, so
 * decoupled decay on B is lr * ratio * wd, as torch.optim.AdamW applies a group's lr), as
 * one backend adamw call per A and per B slice (A and B of each linear alternate in
 * params, src/model/lora.h; grads, m and v share the layout). adamw is elementwise, so
 * ratio 1 gives the same bits as the single call. Returns 0 or the backend's error;
 * FT_E_INVALID if the slices do not cover params (a layout change not followed here). */
static int adamw_update(run *r, const ft_train_cfg *c, double lr, int64_t step)
{
    ft_backend *be = r->be;
    const ft_lora *l = &r->lora;
    const float b1 = (float)c->adam_beta1, b2 = (float)c->adam_beta2, eps = (float)c->adam_eps;
    const float wd = (float)c->weight_decay;
    if (!(c->loraplus_lr_ratio > 0))
        return be->ops->adamw(be, l->params, l->grads, l->m, l->v, l->n_params, (float)lr, b1, b2,
                              eps, wd, step);
    const float lr_b = (float)(lr * c->loraplus_lr_ratio);
    int64_t covered = 0;
    for (int64_t i = 0; i < l->n_layers; i++) {
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            const int64_t off[2] = {ll->A - l->params, ll->B - l->params};
            const int64_t n[2] = {l->cfg.r * ll->in_n, ll->out_n * l->cfg.r};
            const float lrs[2] = {(float)lr, lr_b};
            for (int k = 0; k < 2; k++) {
                FT_TRY(be->ops->adamw(be, l->params + off[k], l->grads + off[k], l->m + off[k],
                                      l->v + off[k], n[k], lrs[k], b1, b2, eps, wd, step));
                covered += n[k];
            }
        }
    }
    if (covered != l->n_params)
        return ft_err(FT_E_INVALID, "LoRA+: the A/B slices cover %lld of %lld adapter parameters",
                      (long long)covered, (long long)l->n_params);
    return 0;
}

/* Counts a mid-run or final evaluation (eval loss `loss` of the adapter after step `step`)
 * in the order of transformers' Trainer._maybe_log_save_evaluate: first
 * EarlyStoppingCallback.check_metric_value against the best before it (the first counted
 * eval, best_metric None there, resets the counter; the improvement must exceed the
 * threshold), then _determine_best_metric (a strictly lower loss is the new best, no
 * threshold; a NaN loss never is). With --save-best a new best's adapter goes to OUT/best.
 * Returns 0 or the error of that save. */
static int track_eval(run *r, const ft_train_cfg *c, ft_ckpt_state *st, double loss, int64_t step)
{
    double best = st->best_eval_step > 0 ? st->best_eval_loss : INFINITY;
    if (st->n_evals == 0 || (loss < best && best - loss > c->early_stopping_threshold))
        st->evals_no_improve = 0;
    else
        st->evals_no_improve++;
    st->n_evals++;
    if (!(loss < best)) return 0;
    st->best_eval_loss = loss;
    st->best_eval_step = step;
    if (!c->save_best) return 0;
    FT_TRY(ft_ckpt_save_adapter(c->out, FT_CKPT_BEST_DIR, &r->lora, NULL, r->base_name, step, loss));
    st->best_saved_step = step;
    return 0;
}

/* On --resume with --save-best: OUT/best must hold the adapter of the checkpoint's best
 * step, which its ftune_step.json says (ft_ckpt_adapter_step). Otherwise (a later best
 * written after the checkpoint or by the final eval, the flag added on resume, the folder
 * lost) it is restored from OUT/checkpoint-<best>/ when that still exists, else removed with
 * a warning (it would name another step). */
static int resume_best(run *r, const ft_train_cfg *c, ft_ckpt_state *st, ft_train_cb cb, void *user)
{
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
        float *vals = malloc((size_t)r->lora.n_params * sizeof *vals);
        if (!vals) return ft_err(-ENOMEM, "out of memory");
        int rc = ft_peft_load_values(ck, &r->lora, vals);
        if (!rc) rc = ft_ckpt_save_adapter(c->out, FT_CKPT_BEST_DIR, &r->lora, vals, r->base_name,
                                           st->best_eval_step, st->best_eval_loss);
        free(vals);
        FT_TRY(rc);
        st->best_saved_step = st->best_eval_step;
        info(cb, user, FT_EV_INFO, "--save-best: %s holds the best adapter so far (eval loss %.4f at step %lld), copied from %s",
             best, st->best_eval_loss, (long long)st->best_eval_step, ck);
        return 0;
    }
    ft_ckpt_adapter_cleanup(c->out, FT_CKPT_BEST_DIR, 1);
    st->best_saved_step = 0;
    info(cb, user, FT_EV_WARN, "--save-best: the best adapter so far (eval loss %.4f at step %lld) was not saved and %s is gone; %s will hold the adapter of the next improvement only",
         st->best_eval_loss, (long long)st->best_eval_step, ck, best);
    return 0;
}

/* The early-stopping info line. */
static void early_stop_info(const ft_train_cfg *c, const ft_ckpt_state *st, ft_train_cb cb,
                            void *user)
{
    char best[64] = "none finite";
    if (st->best_eval_step > 0)
        snprintf(best, sizeof best, "%.4f at step %lld", st->best_eval_loss, (long long)st->best_eval_step);
    info(cb, user, FT_EV_INFO, "early stopping after step %lld/%lld: %lld evaluations in a row without an eval loss more than %g below the best (%s; --early-stopping-patience %lld)",
         (long long)st->step, (long long)st->total_steps, (long long)st->evals_no_improve,
         c->early_stopping_threshold, best, (long long)c->early_stopping_patience);
}

static int train_inner(run *r, const ft_train_cfg *c_in, ft_train_cb cb, void *user,
                       ft_train_result *res)
{
    ft_train_cfg c_local = *c_in; /* grad_accum may be chosen by the planner */
    ft_train_cfg *cm = &c_local;
    const ft_train_cfg *c = cm;
    double t0 = now_s();
    FT_TRY(ft_train_cfg_validate(c));
    if (!c->model) return ft_err(FT_E_INVALID, "missing --model");
    /* a model from the Hugging Face cache is named by its id, so PEFT and vLLM find the base */
    if (!ft_hub_repo_id(c->model, r->base_name, sizeof r->base_name)) {
        snprintf(r->base_name, sizeof r->base_name, "%s", c->model);
    } else {
        /* reached by another branch, a tag or a commit than main: "org/name@<commit>",
         * written as PEFT's revision (adapters/peft.h) */
        char commit[128];
        size_t bl = strlen(r->base_name);
        if (ft_hub_pinned_commit(c->model, commit, sizeof commit))
            snprintf(r->base_name + bl, sizeof r->base_name - bl, "@%s", commit);
    }
    if (!c->data || c->n_data < 1) return ft_err(FT_E_INVALID, "missing --data");
    /* the weights are read once the base's quantization is known: a QLoRA base comes from the
     * pack, built by streaming the safetensors, so the fp32 model is never in host memory */
    FT_TRY(ft_model_load_deferred(&r->model, c->model));
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
    if (c->eval_data) dc.eval_fraction = 0; /* every example of --data trains */
    const int dpo = c->method == FT_METHOD_DPO;
    dc.preference = dpo;
    const int per = dpo ? 2 : 1;  /* examples per record: a pair gives two */
    const char *unit = dpo ? "pairs" : "examples";
    r->eval_reward_accuracy = NAN;
    /* --threads holds for the data's reading too (its records are encoded on every OpenMP
     * thread), which comes before the backend (ft_backend_init) sets it for the ops */
    if (c->threads > 0) omp_set_num_threads(c->threads);
    FT_TRY(ft_dataset_load_files(&r->ds, c->data, c->n_data, &dc, r->tok));
    /* "FILE" or "N files (FILE: R records, schema[, S skipped]; ...)" for the data line */
    char files[1400];
    if (c->n_data == 1) {
        snprintf(files, sizeof files, "%s", c->data[0]);
    } else {
        size_t k = (size_t)snprintf(files, sizeof files, "%lld files (", (long long)c->n_data);
        for (int64_t i = 0; i < c->n_data && k < sizeof files; i++) {
            const ft_data_file *f = &r->ds.files[i];
            char skip[48] = "";
            if (f->n_skipped) snprintf(skip, sizeof skip, ", %lld skipped", (long long)f->n_skipped);
            int w = snprintf(files + k, sizeof files - k, "%s%s: %lld records, %s%s", i ? "; " : "",
                             c->data[i], (long long)f->n_records, ft_data_format_name(f->format), skip);
            if (w > 0) k += (size_t)w;
        }
        if (k < sizeof files) snprintf(files + k, sizeof files - k, ")");
    }
    if (r->ds.n_train == 0)
        return ft_err(FT_E_INVALID, "%s: no training examples left (%lld records, %lld skipped)",
                      files, (long long)r->ds.n_records, (long long)r->ds.n_skipped);
    char eval_part[1200] = "";
    if (c->eval_data) {
        ft_dataset ev;
        int rc = ft_dataset_load_eval(&ev, c->eval_data, &dc, r->tok);
        if (rc < 0) return ft_err_prefix(rc, "--eval-data");
        r->ds.eval = ev.eval; /* r->ds owns them now; its split left none */
        r->ds.n_eval = ev.n_eval;
        free(ev.files);
        char cap[96] = "";
        if (ev.eval_capped)
            snprintf(cap, sizeof cap, " (the first %lld of %lld usable: --eval-max)",
                     (long long)dc.eval_max, (long long)(ev.n_eval + ev.eval_capped) / per);
        snprintf(eval_part, sizeof eval_part, "; eval data %s: %lld records (%s) -> %lld eval %s%s, %lld skipped, %lld truncated, %lld dropped",
                 c->eval_data, (long long)ev.n_records, dpo ? "preference" : ft_data_format_name(ev.format),
                 (long long)ev.n_eval / per, unit, cap, (long long)ev.n_skipped, (long long)ev.n_truncated,
                 (long long)ev.n_dropped);
    }
    info(cb, user, FT_EV_INFO, "data %s: %lld records (%s, template %s) -> %lld train / %lld eval %s, %lld skipped, %lld truncated to %lld tokens, %lld dropped (no trained token within them)%s",
         files, (long long)r->ds.n_records,
         dpo ? "preference pairs"
             : r->ds.format == FT_DATA_AUTO ? "mixed schemas" : ft_data_format_name(r->ds.format),
         ft_chat_template_name(r->ds.chat_template), (long long)r->ds.n_train / per,
         c->eval_data ? 0LL : (long long)r->ds.n_eval / per, unit, (long long)r->ds.n_skipped,
         (long long)r->ds.n_truncated, (long long)seq_len, (long long)r->ds.n_dropped, eval_part);
    if (r->ds.chat_template == FT_CHAT_JINJA && !c->data_cfg.train_on_prompt) {
        /* the model's own template: it may write nothing after a reply (GLM-4 opens the next
         * turn instead), and then no trained token tells the model where a reply ends */
        char eot[64] = "";
        ft_chat_ctx cx = {ft_tok_bos_str(r->tok), ft_tok_eos_str(r->tok), ft_tok_chat_template(r->tok)};
        if (ft_chat_jinja_end_of_turn(&cx, eot, sizeof eot) == 0 && !eot[0])
            info(cb, user, FT_EV_WARN, "the chat template writes nothing after an assistant reply, so the trained tokens of a turn end with its text: the model does not learn to end a reply (GLM-4's template opens the next turn instead); --train-on-prompt trains the next turn's opening too");
        ft_err_clear();
    }
    if (c->eval_data) {
        /* a fraction other than the default was asked for (flag or --config): say once
         * that it has no effect */
        ft_train_cfg def;
        ft_train_defaults(&def);
        if (c->data_cfg.eval_fraction != 0 && c->data_cfg.eval_fraction != def.data_cfg.eval_fraction)
            info(cb, user, FT_EV_INFO, "note: --eval-fraction %g is ignored with --eval-data: every example of %s trains",
                 c->data_cfg.eval_fraction, c->n_data == 1 ? c->data[0] : "--data");
    }

    if (!r->ds.n_eval && (c->early_stopping_patience > 0 || c->save_best))
        return ft_err(FT_E_INVALID, "%s needs evaluation, and this run has no eval examples (--eval-fraction %g%s): add --eval-data FILE or a --eval-fraction above 0",
                      c->early_stopping_patience > 0 ? "--early-stopping-patience" : "--save-best",
                      c->eval_data ? 0.0 : c->data_cfg.eval_fraction,
                      c->eval_data ? ", --eval-data gave none" : "");
    FT_TRY(pack_epoch(r, c, seq_len, 0));
    if (r->ds.n_eval && dpo)
        FT_TRY(ft_pack_pairs(&r->eval_b, &r->n_eval_b, r->ds.eval, r->ds.n_eval / 2, seq_len,
                             c->batch_size, c->seed));
    else if (r->ds.n_eval)
        FT_TRY(ft_pack(&r->eval_b, &r->n_eval_b, r->ds.eval, r->ds.n_eval, seq_len,
                       c->batch_size, c->seed));

    FT_TRY(ft_backend_init(&r->be, c->device, c->threads));
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
    /* DPO on resume: the reference pass reads the starting adapter before the checkpoint's */
    if (c->init_adapter && (!c->resume || dpo)) FT_TRY(ft_peft_load_weights(c->init_adapter, &r->lora));

    int64_t T = per * c->batch_size * seq_len; /* DPO: batch_size pairs of two sequences */
    int quant = FT_PACK_QUANT_BF16;
    char why[256];
    FT_TRY(choose_quant(r, c, T, &quant, why, sizeof why));
    res->quant = r->quant = quant;
    FT_TRY(check_correction(c, quant));
    /* the base comes from a pack: NF4 (QLoRA), a pack-only folder, or a bf16 base that a
     * device cannot hold whole, streamed by the offload executor as a QLoRA base is */
    int packed = quant == FT_PACK_QUANT_NF4 || r->model->pack_only[0];
    if (!packed && !r->be->ops->host_memory) {
        size_t need, avail, used;
        FT_TRY(resident_need(r, c, T, &need, &avail, &used));
        if (need > avail) {
            packed = 1;
            info(cb, user, FT_EV_INFO, "the bf16 base run needs %.3f GiB of GPU memory with every "
                 "layer resident, %s allows %.3f GiB (%.3f GiB in use): the base is streamed from "
                 "its bf16 pack", gib((double)need), c->gpu_mem > 0 ? "--gpu-mem" : "the GPU",
                 gib((double)avail), gib((double)used));
        }
    }
    if (packed) {
        /* a fresh --quant-correction is computed from the unquantized weights */
        if (quant == FT_PACK_QUANT_NF4 && c->quant_correction && !c->resume && !c->plan_only)
            FT_TRY(ft_model_load_weights(r->model));
        FT_TRY(open_pack(r, c, quant, cb, user));
    } else if (!c->plan_only) {
        double tl = now_s();
        FT_TRY(ft_model_load_weights(r->model));
        info(cb, user, FT_EV_INFO, "model weights read in %.1f s", now_s() - tl);
        FT_TRY(test_inf_embedding(r->model, cb, user));
    }
    FT_TRY(setup_correction(r, c, quant, cb, user, res));
    /* from here the base is the pack's: the host copy (a GGUF file's dequantized weights, or
     * those the correction read) is freed, and the executor reads every weight from the pack
     * as for a pack-only folder (offload/tiers.c ft_exec_globals_from_pack) */
    if (r->pack) FT_TRY(ft_model_use_pack(r->model, ft_pack_path(r->pack)));
    if ((r->pack || r->preview) && !r->be->ops->host_memory) {
        FT_TRY(place_offload(r, c, T, seq_len, &cm->grad_accum, cb, user, res));
        if (c->plan_only) return 0;
    } else {
        if (cm->grad_accum < 1) cm->grad_accum = 1;
        if (c->plan_only) {
            info(cb, user, FT_EV_PLAN, "plan: backend %s, base %s: every layer %s; %lld micro-batch%s of %lld tokens per step",
                 r->be->ops->name, quant == FT_PACK_QUANT_NF4 ? "nf4" : "bf16",
                 r->be->ops->host_memory ? (r->pack || r->preview ? "streamed from the pack file per visit" : "in host memory")
                                         : "in device memory",
                 (long long)cm->grad_accum, cm->grad_accum == 1 ? "" : "es", (long long)T);
            return 0;
        }
        FT_TRY(plan_device_memory(r, c, T, seq_len));
    }
    if (r->pack && !r->ex.pack) FT_TRY(ft_exec_use_pack(&r->ex, r->pack));
    size_t pack_bytes = r->pack ? ft_exec_pack_bytes(r->pack) : 0;

    int64_t steps_per_epoch = (r->n_train_b + c->grad_accum - 1) / c->grad_accum;
    int64_t total = c->max_steps > 0 ? c->max_steps : (int64_t)ceil(c->epochs * steps_per_epoch);
    if (total < 1) total = 1;
    int64_t warmup = c->warmup_steps > 0 ? c->warmup_steps : (int64_t)ceil(c->warmup_ratio * total);
    info(cb, user, FT_EV_PLAN, "plan: backend %s, base %s%s%s), LoRA r=%lld alpha=%g%s on %d modules (%.2fM trainable), %lld micro-batches of %lld x %lld tokens, grad-accum %lld, %lld steps (warmup %lld, %s), executor memory %.1f MiB%s",
         r->be->ops->name,
         quant != FT_PACK_QUANT_NF4 ? "bf16 (unquantized"
         : r->ex.nf4_fused ? "nf4 (QLoRA: bitsandbytes NF4, double quantization, dequantized inside the GEMMs from the pack"
                                    : "nf4 (QLoRA: bitsandbytes NF4, double quantization, dequantized per layer from the pack",
         why[0] ? "; " : "", why, (long long)lc.r, lc.alpha, lc.use_rslora ? " (rsLoRA)" : "",
         __builtin_popcount(lc.targets), r->lora.n_params / 1e6, (long long)r->n_train_b,
         (long long)(per * c->batch_size), (long long)seq_len, (long long)c->grad_accum, (long long)total,
         (long long)warmup, ft_schedule_name(c->schedule),
         (r->ex.arena_bytes + r->ex.weights_bytes + r->ex.kept_bytes + pack_bytes) / 1048576.0,
         r->ex.kept ? " (activations kept: no recompute)" : r->be->ops->host_memory ? "" : " (activations recomputed in the backward)");

    if (c->loraplus_lr_ratio > 0)
        info(cb, user, FT_EV_INFO, "LoRA+: the B matrices train at %g x the learning rate of the A matrices",
             c->loraplus_lr_ratio);
    /* set before the step-0 eval too: the executor adds the noise in training steps only */
    r->ex.neftune_alpha = c->neftune_noise_alpha;
    if (c->neftune_noise_alpha > 0)
        info(cb, user, FT_EV_INFO, "NEFTune: noise alpha %g: uniform noise of magnitude %.3g (alpha / sqrt(seq_len %lld * hidden %lld)) on the training embeddings, none in eval",
             c->neftune_noise_alpha, c->neftune_noise_alpha / sqrt((double)seq_len * (double)r->model->cfg.hidden_size),
             (long long)seq_len, (long long)r->model->cfg.hidden_size);
    char dpo_ref[64] = "";
    if (dpo) FT_TRY(dpo_reference_id(c, dpo_ref, sizeof dpo_ref));
    r->cfg_json = run_config(c, &lc, r->model, &r->ds, seq_len, total, warmup, r->lora.n_params,
                             quant, dpo_ref);
    if (!r->cfg_json) return ft_err(-ENOMEM, "out of memory");
    ft_ckpt_state st;
    memset(&st, 0, sizeof st);
    res->total_steps = st.total_steps = total;
    st.warmup_steps = warmup;
    st.initial_eval_loss = st.last_eval_loss = st.last_loss = st.best_eval_loss = NAN;

    char path[4200];
    FT_TRY(ft_mkdir_p(c->out));
    FT_TRY(ft_path_join(path, sizeof path, c->out, "metrics.jsonl"));
    int64_t latest = -1;
    int n_old = ft_ckpt_count(c->out, &latest);
    if (c->resume) {
        FT_TRY(resume_from(r, c, &st, seq_len, cb, user));
        res->resumed_from = st.step;
        snprintf(res->checkpoint, sizeof res->checkpoint, "%s", c->resume);
        info(cb, user, FT_EV_INFO, "resuming from %s: step %lld/%lld, epoch %lld, micro-batch %lld/%lld, %lld bad steps so far",
             c->resume, (long long)st.step, (long long)total, (long long)st.epoch,
             (long long)st.cursor, (long long)r->n_train_b, (long long)st.bad_steps);
        if (latest > st.step)
            info(cb, user, FT_EV_INFO, "note: %s holds checkpoints after step %lld (up to %s%lld); they are removed at this run's next checkpoint",
                 c->out, (long long)st.step, FT_CKPT_PREFIX, (long long)latest);
        FT_TRY(ft_metrics_open_resume(&r->met, path, st.step, st.step < total));
        resume_eval_set(r, c, &st, cb, user);
        if (c->save_best) FT_TRY(resume_best(r, c, &st, cb, user));
    } else {
        new_run_id(st.run_id, sizeof st.run_id);
        if (dpo) FT_TRY(dpo_reference(r, c, &st, cb, user));
        if (c->save_best) ft_ckpt_adapter_cleanup(c->out, FT_CKPT_BEST_DIR, 1); /* an earlier run's */
        eval_set_id(r, c, st.eval_set, sizeof st.eval_set);
        if (n_old > 0)
            info(cb, user, FT_EV_INFO, "note: %s holds %d checkpoint(s) of an earlier run (latest %s%lld); this run starts over and removes them at its first checkpoint (stop now and add --resume to continue that run instead)",
                 c->out, n_old, FT_CKPT_PREFIX, (long long)latest);
        FT_TRY(ft_metrics_open(&r->met, path));
    }

    double eval_loss = NAN;
    int64_t eval_tok = 0;
    if (!c->resume && r->n_eval_b) {
        FT_TRY(eval_and_log(r, c, 0, total, now_s() - t0, cb, user, &eval_loss, &eval_tok));
        st.initial_eval_loss = st.last_eval_loss = eval_loss;
    }

    size_t pbytes = (size_t)r->lora.n_params * sizeof(float);
    const ft_backend_ops *o = r->be->ops;
    const int64_t start = st.step;
    int64_t saved_step = c->resume ? st.step : -1, positions0 = st.positions;
    double base_s = st.elapsed_s; /* run time of earlier sessions */
    double train_t0 = now_s();
    int stopped = 0;
    /* a resume from the final checkpoint of an early-stopped run stops again at once
     * (unless a larger --early-stopping-patience lets it go on) */
    int early = c->early_stopping_patience > 0 && st.step < total &&
                st.evals_no_improve >= c->early_stopping_patience;
    if (early) early_stop_info(c, &st, cb, user);
    double prof_t0 = 0;
    int64_t prof_step0 = -1;
    ft_timeline tl = {0};
    for (int64_t step = st.step; step < total && !early; step++) {
        if (c->stop && *c->stop) {
            stopped = 1;
            break;
        }
        /* the next grad_accum micro-batches; a new epoch re-packs with a new seed */
        if (st.cursor >= r->n_train_b) {
            st.epoch++;
            st.cursor = 0;
            FT_TRY(pack_epoch(r, c, seq_len, st.epoch));
        }
        int64_t n_mb = r->n_train_b - st.cursor < c->grad_accum ? r->n_train_b - st.cursor : c->grad_accum;
        const ft_batch *mbs = &r->train_b[st.cursor];
        st.cursor += n_mb;
        int64_t n_targets = 0, step_positions = 0, step_pairs = 0;
        double step_t0 = now_s();
        for (int64_t i = 0; i < n_mb; i++) {
            step_positions += mbs[i].T;
            n_targets += mbs[i].n_targets;
            step_pairs += mbs[i].n_pairs;
        }
        FT_TRY(o->zero(r->be, r->lora.grads, pbytes));
        double loss_sum;
        int64_t nv;
        /* dropout masks: a pure function of (seed, step), so a resumed run needs no RNG state */
        uint64_t dseed = lc.dropout > 0 ? (c->seed * 0x9e3779b97f4a7c15ull) ^ (uint64_t)(step + 1) : 0;
        /* NEFTune noise: likewise a pure function of (seed, step); the executor mixes in
         * the micro-batch */
        r->ex.neftune_seed = (c->seed * 0xbf58476d1ce4e5b9ull) ^ (uint64_t)(step + 1);
        int tl_on = c->timeline && (step == start + 1 || (total - start == 1));
        if (tl_on) ft_exec_set_timeline(&r->ex, &tl);
        ft_dpo_step ds = {.cfg = &c->dpo, .ref = r->ref_train, .step_pairs = step_pairs};
        if (dpo) {
            FT_TRY(ft_exec_train_step_seq(&r->ex, mbs, n_mb, ft_dpo_step_grad, &ds, dseed));
            loss_sum = ds.st.loss; /* the mean over the step's pairs, below */
            nv = ds.st.tokens;
        } else {
            FT_TRY(ft_exec_train_step(&r->ex, mbs, n_mb, n_targets, dseed, &loss_sum, &nv));
        }
        if (tl_on) {
            ft_exec_set_timeline(&r->ex, NULL);
            char title[512];
            snprintf(title, sizeof title, "ftune step %lld: %lld micro-batches of %lld tokens, %s",
                     (long long)step + 1, (long long)n_mb, (long long)mbs[0].T, c->model);
            FT_TRY(ft_timeline_write_svg(&tl, c->timeline, title));
            info(cb, user, FT_EV_INFO, "timeline: %s: step %.3f s, compute busy %.3f s, H2D %.3f s, disk %.3f s",
                 c->timeline, ft_timeline_span(&tl), ft_timeline_busy(&tl, FT_TL_COMPUTE),
                 ft_timeline_busy(&tl, FT_TL_H2D), ft_timeline_busy(&tl, FT_TL_DISK));
        }
        double loss = dpo ? (ds.st.pairs ? loss_sum / (double)ds.st.pairs : NAN)
                          : nv ? loss_sum / (double)nv : NAN;
        double sq;
        FT_TRY(o->sumsq(r->be, &sq, r->lora.grads, r->lora.n_params));
        double gnorm = sqrt(sq);
        double lr = ft_schedule_lr(c->schedule, c->lr, step, warmup, total, c->min_lr_ratio);
        int bad = (nv && !isfinite(loss)) || !isfinite(gnorm);
        if (bad) {
            /* skip: no update, gradients dropped; the schedule position still advances */
            FT_TRY(o->zero(r->be, r->lora.grads, pbytes));
            st.bad_steps++;
            st.bad_run++;
            char ls[32], gs[32];
            snprintf(ls, sizeof ls, isnan(loss) ? "NaN" : "%g", loss);
            snprintf(gs, sizeof gs, isnan(gnorm) ? "NaN" : "%g", gnorm);
            info(cb, user, FT_EV_WARN, "step %lld: %s is not finite (loss %s, gradient norm %s); step skipped, no update (%lld bad steps, %lld in a row, --max-bad-steps %lld)",
                 (long long)step + 1, !isfinite(loss) ? "the loss" : "the gradient norm", ls, gs,
                 (long long)st.bad_steps, (long long)st.bad_run, (long long)c->max_bad_steps);
        } else {
            st.bad_run = 0;
            if (c->max_grad_norm > 0 && gnorm > c->max_grad_norm)
                FT_TRY(o->scale(r->be, r->lora.grads, (float)(c->max_grad_norm / (gnorm + 1e-6)), r->lora.n_params));
            FT_TRY(adamw_update(r, c, lr, st.adam_step + 1));
            st.adam_step++;
            st.tokens += nv;
            st.last_loss = loss;
        }
        st.positions += step_positions;
        st.step = step + 1;
        double el = now_s() - train_t0, sd = now_s() - step_t0;
        double tps = sd > 0 ? step_positions / sd : 0; /* this step's token positions per second */
        FT_TRY(ft_metrics_step(&r->met, st.step, loss, lr, gnorm, st.tokens, tps,
                               base_s + now_s() - t0, st.bad_steps, bad, dpo ? &ds.st : NULL));
        ft_train_event ev = {.kind = FT_EV_STEP, .step = st.step, .total_steps = total,
                             .loss = loss, .lr = lr, .grad_norm = gnorm, .tokens_per_s = tps,
                             .elapsed_s = el, .tokens = st.tokens,
                             .eta_s = el / (double)(st.step - start) * (double)(total - st.step)};
        if (dpo && ds.st.pairs) {
            ev.pref = 1;
            ev.reward_accuracy = ds.st.accurate / (double)ds.st.pairs;
            ev.reward_margin = ds.st.margin / (double)ds.st.pairs;
        }
        emit(cb, user, &ev);
        if (c->profile && st.step == start + 1) { /* the first step warms up; time the rest */
            if (ft_backend_profile(r->be, 1) == 0) {
                prof_t0 = now_s();
                prof_step0 = st.step;
            } else {
                info(cb, user, FT_EV_WARN, "--profile: %s", ft_errmsg());
            }
        }
        if (bad && st.bad_run >= c->max_bad_steps)
            return ft_err(FT_E_NUMERIC, "stopped at step %lld/%lld after %lld consecutive steps with a non-finite loss or gradient norm (--max-bad-steps %lld): the model diverged (try a lower --lr or --max-grad-norm) or the data or base weights produce Inf/NaN; no adapter written",
                          (long long)st.step, (long long)total, (long long)st.bad_run,
                          (long long)c->max_bad_steps);
        /* a scheduled mid-run eval runs even when stopping, so the metrics of a resumed
         * run are those of an uninterrupted one (it precedes the step's checkpoint) */
        if (r->n_eval_b && st.step < total && c->eval_every > 0 && st.step % c->eval_every == 0) {
            FT_TRY(eval_and_log(r, c, st.step, total, base_s + now_s() - t0, cb, user, &eval_loss,
                                &eval_tok));
            st.last_eval_loss = eval_loss;
            FT_TRY(track_eval(r, c, &st, eval_loss, st.step));
            if (c->early_stopping_patience > 0 && st.evals_no_improve >= c->early_stopping_patience) {
                early = 1; /* the end path below: checkpoint, adapter, summary */
                early_stop_info(c, &st, cb, user);
                break;
            }
        }
        int stopping = c->stop && *c->stop; /* then the save below the loop */
        if (!stopping && c->save_every > 0 && st.step % c->save_every == 0 && st.step < total) {
            FT_TRY(save_checkpoint(r, c, &st, base_s + now_s() - t0, cb, user, res));
            saved_step = st.step;
        }
    }
    if (!early && c->stop && *c->stop) stopped = 1;
    if (prof_step0 >= 0) {
        char tab[4096];
        double wall = now_s() - prof_t0;
        FT_TRY(ft_backend_profile_report(r->be, tab, sizeof tab, 1));
        FT_TRY(ft_backend_profile(r->be, 0));
        info(cb, user, FT_EV_INFO, "profile: GPU time per op over steps %lld-%lld (%.1f ms of wall time per step):",
             (long long)prof_step0 + 1, (long long)st.step,
             st.step > prof_step0 ? 1e3 * wall / (double)(st.step - prof_step0) : 0.0);
        for (char *line = strtok(tab, "\n"); line; line = strtok(NULL, "\n"))
            info(cb, user, FT_EV_INFO, "profile: %s", line);
    }
    double sess = now_s() - train_t0;
    res->steps = st.step;
    res->tokens = st.positions;
    res->trained_tokens = st.tokens;
    res->bad_steps = st.bad_steps;
    res->initial_eval_loss = st.initial_eval_loss;
    res->final_train_loss = st.last_loss;
    res->tokens_per_s = sess > 0 ? (double)(st.positions - positions0) / sess : 0;
    res->n_train = r->ds.n_train;
    res->n_eval = r->ds.n_eval;
    res->n_skipped = r->ds.n_skipped;
    res->n_truncated = r->ds.n_truncated;
    res->n_dropped = r->ds.n_dropped;
    res->layer_fetches = r->ex.layer_fetches;
    if (stopped) test_stop_hold();
    if (saved_step != st.step && (st.step > 0 || !stopped))
        FT_TRY(save_checkpoint(r, c, &st, base_s + now_s() - t0, cb, user, res));
    if (stopped) {
        res->stopped = 1;
        res->final_eval_loss = st.last_eval_loss;
        res->time_s = base_s + now_s() - t0;
        return 0;
    }

    /* the final evaluation comes after the last checkpoint (a resume from it redoes it);
     * an early stop has just evaluated this adapter (as transformers, which stops right
     * after that evaluation), so its loss is the final one */
    if (r->n_eval_b && !early) {
        FT_TRY(eval_and_log(r, c, st.step, total, base_s + now_s() - t0, cb, user, &eval_loss,
                            &eval_tok));
        st.last_eval_loss = eval_loss;
        FT_TRY(track_eval(r, c, &st, eval_loss, st.step));
    }
    res->early_stopped = early;
    res->best_eval_loss = st.best_eval_loss;
    res->best_eval_step = st.best_eval_step;
    res->final_eval_loss = st.last_eval_loss;
    res->final_eval_reward_accuracy = r->eval_reward_accuracy;
    res->time_s = base_s + now_s() - t0;
    FT_TRY(ft_peft_save(c->out, &r->lora, r->model, r->base_name));
    char hint[512];
    if (ft_peft_serving_hints(&r->lora.cfg, hint, sizeof hint) > 0)
        info(cb, user, FT_EV_WARN, "serving: %s", hint);

    /* summary.json (null for a loss that was not measured, e.g. no eval split) */
    cJSON *js = cJSON_CreateObject();
    cJSON_AddStringToObject(js, "adapter", c->out);
    cJSON_AddNumberToObject(js, "steps", (double)res->steps);
    cJSON_AddNumberToObject(js, "tokens", (double)res->tokens);
    cJSON_AddNumberToObject(js, "trained_tokens", (double)res->trained_tokens);
    cJSON_AddNumberToObject(js, "time_s", res->time_s);
    cJSON_AddNumberToObject(js, "tokens_per_s", res->tokens_per_s);
    const char *keys[3] = {"final_train_loss", "initial_eval_loss", "final_eval_loss"};
    double vals[3] = {res->final_train_loss, res->initial_eval_loss, res->final_eval_loss};
    for (int i = 0; i < 3; i++) {
        if (isfinite(vals[i])) cJSON_AddNumberToObject(js, keys[i], vals[i]);
        else cJSON_AddNullToObject(js, keys[i]);
    }
    add_data_json(js, c); /* a string, or with several --data an array in order */
    cJSON_AddNumberToObject(js, "n_train", (double)res->n_train);
    cJSON_AddNumberToObject(js, "n_eval", (double)res->n_eval);
    if (c->eval_data) cJSON_AddStringToObject(js, "eval_data", c->eval_data);
    cJSON_AddNumberToObject(js, "n_skipped", (double)res->n_skipped);
    cJSON_AddNumberToObject(js, "n_truncated", (double)res->n_truncated);
    cJSON_AddNumberToObject(js, "n_dropped", (double)res->n_dropped);
    cJSON_AddNumberToObject(js, "bad_steps", (double)res->bad_steps);
    /* the best eval (mid-run or final; the step-0 eval is no candidate), with eval only */
    if (r->n_eval_b) {
        if (st.best_eval_step > 0) {
            cJSON_AddNumberToObject(js, "best_eval_loss", st.best_eval_loss);
            cJSON_AddNumberToObject(js, "best_eval_step", (double)st.best_eval_step);
        } else {
            cJSON_AddNullToObject(js, "best_eval_loss");
            cJSON_AddNullToObject(js, "best_eval_step");
        }
    }
    char best_dir[4200];
    FT_TRY(ft_path_join(best_dir, sizeof best_dir, c->out, FT_CKPT_BEST_DIR));
    if (c->save_best && st.best_eval_step > 0 && st.best_saved_step == st.best_eval_step)
        cJSON_AddStringToObject(js, "best_adapter", best_dir);
    else if (c->save_best)
        cJSON_AddNullToObject(js, "best_adapter");
    cJSON_AddBoolToObject(js, "early_stopped", early); /* then "steps" is where it stopped */
    cJSON_AddNumberToObject(js, "resumed_from_step", (double)res->resumed_from);
    cJSON_AddStringToObject(js, "checkpoint", res->checkpoint);
    cJSON_AddStringToObject(js, "base_quant", ft_pack_quant_name(res->quant));
    if (res->base_layers[0] >= 0) { /* where the offload planner put the base's layers */
        cJSON *bl = cJSON_AddObjectToObject(js, "base_layers");
        static const char *const tier[3] = {"gpu", "host", "disk"};
        for (int t = 0; bl && t < 3; t++) cJSON_AddNumberToObject(bl, tier[t], (double)res->base_layers[t]);
    }
    if (dpo) {
        cJSON_AddStringToObject(js, "method", "dpo");
        cJSON_AddStringToObject(js, "dpo_loss", ft_dpo_loss_name(c->dpo.loss_type));
        cJSON_AddNumberToObject(js, "dpo_beta", c->dpo.beta);
        if (c->dpo.loss_type == FT_DPO_ROBUST)
            cJSON_AddNumberToObject(js, "dpo_label_smoothing", c->dpo.label_smoothing);
        if (c->dpo.loss_type == FT_DPO_SIMPO)
            cJSON_AddNumberToObject(js, "simpo_gamma", c->dpo.simpo_gamma);
        cJSON_AddNumberToObject(js, "n_train_pairs", (double)(res->n_train / 2));
        cJSON_AddNumberToObject(js, "n_eval_pairs", (double)(res->n_eval / 2));
        if (isfinite(res->final_eval_reward_accuracy))
            cJSON_AddNumberToObject(js, "final_eval_reward_accuracy", res->final_eval_reward_accuracy);
        else if (r->n_eval_b)
            cJSON_AddNullToObject(js, "final_eval_reward_accuracy");
    }
    if (c->loraplus_lr_ratio > 0) cJSON_AddNumberToObject(js, "loraplus_lr_ratio", c->loraplus_lr_ratio);
    if (c->neftune_noise_alpha > 0) cJSON_AddNumberToObject(js, "neftune_noise_alpha", c->neftune_noise_alpha);
    if (c->quant_correction && res->quant == FT_PACK_QUANT_NF4) {
        cJSON_AddStringToObject(js, "quant_correction", ft_qcorr_name(c->quant_correction));
        if (!c->resume) {
            cJSON_AddNumberToObject(js, "quant_correction_error_reduction", res->qcorr_reduction);
            cJSON_AddNumberToObject(js, "quant_correction_tokens", (double)res->qcorr_tokens);
        }
    }
    if (r->pack) cJSON_AddStringToObject(js, "pack", ft_pack_path(r->pack));
    char *out = ft_ckpt_json_print(js, 1); /* numbers exact: best_eval_loss is a metrics.jsonl value */
    cJSON_Delete(js);
    if (!out) return ft_err(-ENOMEM, "out of memory writing summary.json");
    FT_TRY(ft_path_join(path, sizeof path, c->out, "summary.json"));
    int wrc = ft_write_file_atomic(path, out, strlen(out));
    free(out);
    FT_TRY(wrc);
    if (st.best_eval_step > 0 && (c->save_best || early || st.best_eval_step != st.step))
        info(cb, user, FT_EV_INFO, "best eval loss %.4f at step %lld%s%s", st.best_eval_loss,
             (long long)st.best_eval_step, c->save_best ? ": adapter in " : "",
             c->save_best ? best_dir : "");
    info(cb, user, FT_EV_DONE, "adapter written to %s%s", c->out,
         early ? " (the last step's; early stopped)" : "");
    return 0;
}

int ft_train_run(const ft_train_cfg *cfg, ft_train_cb cb, void *user, ft_train_result *res)
{
    run r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    res->final_eval_reward_accuracy = NAN;
    res->base_layers[0] = res->base_layers[1] = res->base_layers[2] = -1;
    int rc = train_inner(&r, cfg, cb, user, res);
    run_free(&r);
    return rc;
}
