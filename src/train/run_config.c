/* run_config.c - the run config and the fingerprints of a training run (see run_config.h). */
#include "src/train/run_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/qcorr.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/checkpoint.h"
#include "src/train/dist.h"
#include "src/train/schedule.h"

/* Fingerprint of the tokenized data as training sees it: order, lengths, ids and labels
 * of the train and, when they were split off the training file (split = 1), the eval
 * examples (covers the file, schema, template, tokenizer, split). The examples of
 * --eval-data (split = 0) are left out: they change no training state, so a resume may
 * change that file; the fingerprint is then that of a run with --eval-fraction 0, whose
 * training is the same. */
uint64_t ft_train_data_fingerprint(const ft_dataset *ds, int split)
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


/* Adds "data": the training file's name, or with several an array of them in order (the
 * shape of the --config key). */
void ft_train_add_data_json(cJSON *o, const ft_train_cfg *c)
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

int ft_train_dpo_reference_id(const ft_train_cfg *c, char *buf, size_t n)
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

char *ft_train_run_config(const ft_train_cfg *c, const ft_lora_cfg *lc, const ft_model *m,
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
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)ft_train_data_fingerprint(ds, split));
    cJSON_AddStringToObject(o, "data_fingerprint", buf);
    cJSON_AddNumberToObject(o, "n_train", (double)ds->n_train);
    /* examples held out of the training file (0 with --eval-data: all of it trains) */
    cJSON_AddNumberToObject(o, "n_eval", split ? (double)ds->n_eval : 0.0);
    cJSON_AddNumberToObject(o, "seq_len", (double)seq_len);
    cJSON_AddNumberToObject(o, "batch_size", (double)c->batch_size);
    /* the micro-batches of one optimizer step over all ranks (dist.h): N ranks of grad-accum
     * g train as one process of grad-accum N x g, and may resume as one */
    cJSON_AddNumberToObject(o, "grad_accum", (double)ft_train_dist_global_accum(c));
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
    /* the grouping of micro-batches into steps changes which examples share a step; likewise
     * recorded only when on */
    if (c->balance_steps) cJSON_AddBoolToObject(o, "balance_steps", 1);
    /* NEFTune's noise shapes it too; likewise recorded only when on */
    if (c->neftune_noise_alpha > 0)
        cJSON_AddNumberToObject(o, "neftune_noise_alpha", c->neftune_noise_alpha);
    /* the objective: recorded only for DPO, so that SFT checkpoints of before still resume */
    if (c->method == FT_TRAIN_METHOD_DPO) {
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
    ft_train_add_data_json(info, c);
    if (c->eval_data) {
        cJSON_AddStringToObject(info, "eval_data", c->eval_data);
        cJSON_AddNumberToObject(info, "n_eval_data", (double)ds->n_eval);
    }
    if (c->init_adapter) cJSON_AddStringToObject(info, "init_adapter", c->init_adapter);
    cJSON_AddNumberToObject(info, "max_steps", (double)c->max_steps);
    cJSON_AddNumberToObject(info, "epochs", c->epochs);
    cJSON_AddNumberToObject(info, "threads", c->threads);
    cJSON_AddNumberToObject(info, "ranks", ft_comm_size(c->comm));
    cJSON_AddNumberToObject(info, "eval_every", (double)c->eval_every);
    /* they end the run earlier or keep a copy of an adapter; the steps taken are the same */
    cJSON_AddBoolToObject(info, "save_best", c->save_best);
    cJSON_AddNumberToObject(info, "early_stopping_patience", (double)c->early_stopping_patience);
    cJSON_AddNumberToObject(info, "early_stopping_threshold", c->early_stopping_threshold);
    char *s = ft_ckpt_json_print(o, 0); /* numbers exact: they are compared on resume */
    cJSON_Delete(o);
    return s;
}

int ft_train_config_check(const char *saved, const char *cur, const char *resume)
{
    int rc = ft_ckpt_config_diff(saved, cur);
    if (rc >= 0) return 0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ft_errmsg());
    /* other training data: say so in terms of --data, naming both lists */
    cJSON *a = cJSON_Parse(saved), *b = cJSON_Parse(cur);
    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(a, "data_fingerprint");
    const cJSON *fb = cJSON_GetObjectItemCaseSensitive(b, "data_fingerprint");
    if (cJSON_IsString(fa) && cJSON_IsString(fb) && strcmp(fa->valuestring, fb->valuestring)) {
        char was[1024], now[1024];
        data_names(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(a, "info"), "data"), was, sizeof was);
        data_names(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(b, "info"), "data"), now, sizeof now);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return ft_err(rc, "--resume %s: --data differs from the checkpoint's (it trained on %s; this run reads %s): the training files, their contents and their order must not change on resume (to train on other data, start a new run with --init-adapter %s); %s",
                      resume, was, now, resume, msg);
    }
    /* another number of ranks that changes the global batch: say so in those terms */
    const cJSON *ia = cJSON_GetObjectItemCaseSensitive(a, "info"), *ib = cJSON_GetObjectItemCaseSensitive(b, "info");
    const cJSON *na = cJSON_GetObjectItemCaseSensitive(ia, "ranks"), *nb = cJSON_GetObjectItemCaseSensitive(ib, "ranks");
    const cJSON *ga = cJSON_GetObjectItemCaseSensitive(a, "grad_accum"), *gb = cJSON_GetObjectItemCaseSensitive(b, "grad_accum");
    int ra = cJSON_IsNumber(na) ? na->valueint : 1, rb = cJSON_IsNumber(nb) ? nb->valueint : 1;
    if (ra != rb && cJSON_IsNumber(ga) && cJSON_IsNumber(gb) && ga->valuedouble != gb->valuedouble) {
        int rc2 = ft_err(rc, "--resume %s: the checkpoint was trained by %d rank(s) with %g micro-batches per optimizer step; this run has %d rank(s), %g micro-batches per step: resume with %d ranks, or give --grad-accum so that ranks x grad-accum stays %g",
                         resume, ra, ga->valuedouble, rb, gb->valuedouble, ra, ga->valuedouble);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return rc2;
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    return ft_err(rc, "--resume %s: %s. Resume with the flags of the original run (--threads, eval, logging and checkpoint flags may change); to train on with other settings, start a new run with --init-adapter %s",
                  resume, msg, resume);
}
