/* summary.c - OUT/summary.json (see summary.h). */
#include "src/train/summary.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/qcorr.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/run_config.h"

/* The best eval, the best adapter's folder and the run's end. */
static int add_best(cJSON *js, const ft_train_adapter *a, int has_eval)
{
    const ft_train_cfg *c = a->cfg;
    const ft_ckpt_state *st = &a->st;
    /* the best eval (mid-run or final; the step-0 eval is no candidate), with eval only */
    if (has_eval) {
        if (st->best_eval_step > 0) {
            cJSON_AddNumberToObject(js, "best_eval_loss", st->best_eval_loss);
            cJSON_AddNumberToObject(js, "best_eval_step", (double)st->best_eval_step);
        } else {
            cJSON_AddNullToObject(js, "best_eval_loss");
            cJSON_AddNullToObject(js, "best_eval_step");
        }
    }
    char best_dir[4200];
    FT_TRY(ft_path_join(best_dir, sizeof best_dir, c->out, FT_CKPT_BEST_DIR));
    if (c->save_best && st->best_eval_step > 0 && st->best_saved_step == st->best_eval_step)
        cJSON_AddStringToObject(js, "best_adapter", best_dir);
    else if (c->save_best)
        cJSON_AddNullToObject(js, "best_adapter");
    cJSON_AddBoolToObject(js, "early_stopped", a->early); /* then "steps" is where it stopped */
    return 0;
}

/* The settings that change what the adapter is: DPO, LoRA+, NEFTune, the correction. */
static void add_method(cJSON *js, const ft_train_cfg *c, const ft_train_result *res, int has_eval)
{
    if (c->method == FT_TRAIN_METHOD_DPO) {
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
        else if (has_eval)
            cJSON_AddNullToObject(js, "final_eval_reward_accuracy");
    }
    if (c->loraplus_lr_ratio > 0) cJSON_AddNumberToObject(js, "loraplus_lr_ratio", c->loraplus_lr_ratio);
    if (c->neftune_noise_alpha > 0) cJSON_AddNumberToObject(js, "neftune_noise_alpha", c->neftune_noise_alpha);
    if (c->balance_steps) cJSON_AddBoolToObject(js, "balance_steps", 1);
    if (c->quant_correction && res->quant == FT_PACK_QUANT_NF4) {
        cJSON_AddStringToObject(js, "quant_correction", ft_qcorr_name(c->quant_correction));
        if (!c->resume) {
            cJSON_AddNumberToObject(js, "quant_correction_error_reduction", res->qcorr_reduction);
            cJSON_AddNumberToObject(js, "quant_correction_tokens", (double)res->qcorr_tokens);
        }
    }
}

int ft_train_summary_write(const ft_train_adapter *a, int has_eval, const char *pack)
{
    const ft_train_cfg *c = a->cfg;
    const ft_train_result *res = a->res;
    cJSON *js = cJSON_CreateObject();
    if (!js) return ft_err(-ENOMEM, "out of memory writing summary.json");
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
    ft_train_add_data_json(js, c); /* a string, or with several --data an array in order */
    cJSON_AddNumberToObject(js, "n_train", (double)res->n_train);
    cJSON_AddNumberToObject(js, "n_eval", (double)res->n_eval);
    if (c->eval_data) cJSON_AddStringToObject(js, "eval_data", c->eval_data);
    cJSON_AddNumberToObject(js, "n_skipped", (double)res->n_skipped);
    cJSON_AddNumberToObject(js, "n_truncated", (double)res->n_truncated);
    cJSON_AddNumberToObject(js, "n_dropped", (double)res->n_dropped);
    cJSON_AddNumberToObject(js, "bad_steps", (double)res->bad_steps);
    int rc = add_best(js, a, has_eval);
    if (rc < 0) {
        cJSON_Delete(js);
        return rc;
    }
    cJSON_AddNumberToObject(js, "resumed_from_step", (double)res->resumed_from);
    cJSON_AddStringToObject(js, "checkpoint", res->checkpoint);
    cJSON_AddStringToObject(js, "base_quant", ft_pack_quant_name(res->quant));
    if (res->base_layers[0] >= 0) { /* where the offload planner put the base's layers */
        cJSON *bl = cJSON_AddObjectToObject(js, "base_layers");
        static const char *const tier[3] = {"gpu", "host", "disk"};
        for (int t = 0; bl && t < 3; t++)
            cJSON_AddNumberToObject(bl, tier[t], (double)res->base_layers[t]);
    }
    add_method(js, c, res, has_eval);
    if (pack) cJSON_AddStringToObject(js, "pack", pack);
    /* numbers exact: best_eval_loss is a metrics.jsonl value */
    char *out = ft_ckpt_json_print(js, 1);
    cJSON_Delete(js);
    if (!out) return ft_err(-ENOMEM, "out of memory writing summary.json");
    char path[4200];
    rc = ft_path_join(path, sizeof path, c->out, "summary.json");
    if (!rc) rc = ft_write_file_atomic(path, out, strlen(out));
    free(out);
    return rc;
}
