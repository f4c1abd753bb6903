/* peft.c - PEFT adapter folder read/write (see peft.h). */
#include "adapters/peft.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/model/safetensors.h"

void ft_peft_key(char *out, size_t n, int64_t layer, int p, char which)
{
    snprintf(out, n, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight", (long long)layer,
             ft_proj_parent[p], ft_proj_name[p], which);
}

static int write_config(const char *path, const ft_lora *l, const char *base_name)
{
    /* Keys in sorted order, as PEFT writes them (json.dumps(sort_keys=True)). */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddStringToObject(o, "base_model_name_or_path", base_name ? base_name : "");
    cJSON_AddStringToObject(o, "bias", "none");
    cJSON_AddBoolToObject(o, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    cJSON_AddNullToObject(o, "layers_pattern");
    cJSON_AddNullToObject(o, "layers_to_transform");
    cJSON_AddNumberToObject(o, "lora_alpha", l->cfg.alpha);
    cJSON_AddNumberToObject(o, "lora_dropout", l->cfg.dropout);
    cJSON_AddNullToObject(o, "modules_to_save");
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddNumberToObject(o, "r", (double)l->cfg.r);
    cJSON_AddItemToObject(o, "rank_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(o, "revision");
    cJSON *t = cJSON_AddArrayToObject(o, "target_modules");
    for (int p = 0; p < FT_N_PROJ; p++)
        if (l->cfg.targets & (1u << p))
            cJSON_AddItemToArray(t, cJSON_CreateString(ft_proj_name[p]));
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    cJSON_AddBoolToObject(o, "use_dora", 0);
    cJSON_AddBoolToObject(o, "use_rslora", l->cfg.use_rslora);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return ft_err(-ENOMEM, "%s: out of memory", path);
    size_t n = strlen(s);
    char *buf = realloc(s, n + 2);
    if (!buf) { free(s); return -ENOMEM; }
    buf[n] = '\n';
    int rc = ft_write_file_atomic(path, buf, n + 1);
    free(buf);
    return rc;
}

int ft_peft_save(const char *dir, ft_lora *l, const ft_model *m, const char *base_name)
{
    FT_TRY(ft_mkdir_p(dir));
    FT_TRY(ft_lora_pull(l));
    int n_t = 0;
    for (int p = 0; p < FT_N_PROJ; p++)
        if (l->cfg.targets & (1u << p)) n_t++;
    int64_t n = 2 * l->n_layers * n_t;
    ft_st_out *ts = calloc((size_t)n, sizeof *ts);
    char (*names)[160] = calloc((size_t)n, sizeof *names);
    if (!ts || !names) {
        free(ts);
        free(names);
        return ft_err(-ENOMEM, "out of memory saving the adapter");
    }
    int64_t k = 0;
    for (int64_t i = 0; i < l->n_layers; i++) {
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            int64_t offA = ll->A - l->params, offB = ll->B - l->params;
            ft_peft_key(names[k], sizeof names[k], i, p, 'A');
            ts[k] = (ft_st_out){names[k], FT_ST_F32, 2, {l->cfg.r, ll->in_n}, l->host + offA};
            k++;
            ft_peft_key(names[k], sizeof names[k], i, p, 'B');
            ts[k] = (ft_st_out){names[k], FT_ST_F32, 2, {ll->out_n, l->cfg.r}, l->host + offB};
            k++;
        }
    }
    char path[4200];
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    int rc = ft_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    if (!rc) rc = ft_st_write(path, ts, k, mk, mv, 1);
    free(ts);
    free(names);
    FT_TRY(rc);
    FT_TRY(ft_path_join(path, sizeof path, dir, "adapter_config.json"));
    (void)m;
    return write_config(path, l, base_name);
}

int ft_peft_read_config(const char *dir, ft_lora_cfg *cfg)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, "adapter_config.json"));
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(path, &txt, &len));
    cJSON *o = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return ft_err(FT_E_INVALID, "%s: not a JSON object", path);
    }
    int rc = 0;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(o, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "r");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "lora_dropout");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "use_rslora");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(o, "use_dora");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(o, "bias");
    const cJSON *fifo = cJSON_GetObjectItemCaseSensitive(o, "fan_in_fan_out");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "target_modules");
    memset(cfg, 0, sizeof *cfg);
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA"))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"peft_type\" must be \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble != floor(r->valuedouble))
        rc = ft_err(FT_E_INVALID, "%s: \"r\" must be a positive integer", path);
    else if (cJSON_IsTrue(dora))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"use_dora\": DoRA adapters are not supported", path);
    else if (bias && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"bias\" must be \"none\"", path);
    else if (cJSON_IsTrue(fifo))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"fan_in_fan_out\" true is not a Llama layout", path);
    if (!rc) {
        cfg->r = (int64_t)r->valuedouble;
        cfg->alpha = cJSON_IsNumber(a) ? (float)a->valuedouble : 8.0f; /* PEFT default */
        cfg->dropout = cJSON_IsNumber(d) ? (float)d->valuedouble : 0.0f;
        cfg->use_rslora = cJSON_IsTrue(rs);
        if (cJSON_IsString(tm)) {
            rc = ft_lora_parse_targets(tm->valuestring, &cfg->targets);
        } else if (cJSON_IsArray(tm)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, tm) {
                unsigned bit;
                if (!cJSON_IsString(it)) { rc = ft_err(FT_E_INVALID, "%s: \"target_modules\" entries must be strings", path); break; }
                if ((rc = ft_lora_parse_targets(it->valuestring, &bit)) < 0) break;
                cfg->targets |= bit;
            }
        } else {
            rc = ft_err(FT_E_INVALID, "%s: missing \"target_modules\"", path);
        }
        if (rc < 0) ft_err_prefix(rc, "%s", path);
    }
    cJSON_Delete(o);
    return rc;
}

int ft_peft_load_weights(const char *dir, ft_lora *l)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, "adapter_model.safetensors"));
    ft_st_file *f;
    FT_TRY(ft_st_open(&f, path));
    int rc = 0;
    for (int64_t i = 0; i < l->n_layers && !rc; i++) {
        for (int p = 0; p < FT_N_PROJ && !rc; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            for (int w = 0; w < 2 && !rc; w++) {
                char key[160];
                ft_peft_key(key, sizeof key, i, p, w ? 'B' : 'A');
                int64_t rows = w ? ll->out_n : l->cfg.r, cols = w ? l->cfg.r : ll->in_n;
                const ft_st_tensor *t = ft_st_find(f, key);
                if (!t) {
                    rc = ft_err(FT_E_NOTFOUND, "%s: missing tensor %s", path, key);
                    break;
                }
                if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
                    rc = ft_err(FT_E_INVALID, "%s: tensor %s has shape [%lld, %lld], expected [%lld, %lld]",
                                path, key, (long long)(t->n_dims > 0 ? t->shape[0] : -1),
                                (long long)(t->n_dims > 1 ? t->shape[1] : -1), (long long)rows,
                                (long long)cols);
                    break;
                }
                float *dst = l->host + ((w ? ll->B : ll->A) - l->params);
                rc = ft_st_to_f32(t, dst, rows * cols);
                if (rc < 0) ft_err_prefix(rc, "%s: %s", path, key);
            }
        }
    }
    ft_st_close(f);
    FT_TRY(rc);
    return ft_lora_push(l);
}
