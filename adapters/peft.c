/* peft.c - PEFT adapter folder read/write (see peft.h). */
#include "adapters/peft.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"
#include "src/formats/gguf.h"
#include "src/formats/hub_cache.h"
#include "src/numeric/quant.h"
#include "src/formats/safetensors.h"

void ft_peft_key(char *out, size_t n, int64_t layer, int p, char which)
{
    snprintf(out, n, "base_model.model.model.layers.%lld.%s.%s.lora_%c.weight", (long long)layer,
             ft_proj_parent[p], ft_proj_name[p], which);
}

/* The shortest decimal that reads back as the same float32, as a double: a float the user
 * gave (--lora-dropout 0.05, stored as the float32 0.05f) is written as they wrote it,
 * "0.05", not as that float's exact value 0.05000000074505806. Any decimal of up to 6
 * significant digits reads back from float32 as itself, so this is the number typed. */
double ft_peft_float_repr(float v)
{
    if (!isfinite(v)) return v;
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v) return strtod(buf, NULL);
    }
    return v;
}

/* "org/name" of a Hugging Face URL "https://huggingface.co/org/name[/]" (or hf.co) into
 * out, and 1; 0 for another shape. */
static int hf_url_id(const char *url, char *out, size_t n)
{
    static const char *const pre[4] = {"https://huggingface.co/", "http://huggingface.co/",
                                       "https://hf.co/", "http://hf.co/"};
    for (int i = 0; i < 4; i++) {
        size_t l = strlen(pre[i]);
        if (strncmp(url, pre[i], l)) continue;
        char id[256];
        size_t k = strlen(url + l);
        if (k == 0 || k >= sizeof id) return 0;
        memcpy(id, url + l, k + 1);
        if (id[k - 1] == '/') id[k - 1] = 0;
        if (!ft_peft_is_repo_id(id)) return 0;
        snprintf(out, n, "%s", id);
        return 1;
    }
    return 0;
}

int ft_peft_is_repo_id(const char *s)
{
    /* huggingface_hub's validate_repo_id: [A-Za-z0-9._-] parts, no "--" or "..", not
     * starting or ending with '-' or '.', at most 96 characters; one '/' here (org/name) */
    size_t n = strlen(s);
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/') || n > 96 || strstr(s, "--") || strstr(s, "..")) return 0;
    for (const char *p = s; *p; p++) {
        int ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                 *p == '.' || *p == '_' || *p == '-' || p == slash;
        if (!ok) return 0;
        int edge = p == s || p == slash - 1 || p == slash + 1 || p[1] == 0;
        if (edge && (*p == '.' || *p == '-' || *p == '/')) return 0;
    }
    return 1;
}

/* The GGUF keys that name the Hugging Face repository a GGUF file was made from, in the
 * order they are tried: the id key of earlier gguf-py versions (and its misspelling, which
 * gguf-py wrote at first), the source repository URL that current gguf-py writes
 * (Keys.General.SOURCE_REPO_URL, REPO_URL), then the first base model's URL, which
 * llama.cpp's convert takes from the model card's base_model (the model this one was made
 * from: the same weights only when the GGUF is a conversion of that repository, so it is
 * the last resort and said so). */
static const char *const k_gguf_repo_keys[] = {
    "general.source.huggingface.repository", "general.source.hugginface.repository",
    "general.source.repo_url", "general.repo_url", "general.base_model.0.repo_url"};

int ft_peft_base_name(const char *model, const char *base_model_id, char *out, size_t n,
                      const char **source)
{
    *source = NULL;
    if (base_model_id) {
        char id[256], rev[128];
        if (!ft_peft_is_repo_id(base_model_id) &&
            !ft_hub_split_rev(base_model_id, id, sizeof id, rev, sizeof rev))
            return ft_err(FT_E_INVALID, "base model id '%s' is not a Hugging Face repository id (org/name, or org/name@REVISION)",
                          base_model_id);
        snprintf(out, n, "%s", base_model_id);
        *source = "--base-model-id";
        return 0;
    }
    /* a model from the Hugging Face cache is named by its id, so PEFT and vLLM find it */
    if (ft_hub_repo_id(model, out, n)) {
        /* reached by another branch, a tag or a commit than main: "org/name@<commit>",
         * written as PEFT's revision */
        char commit[128];
        size_t bl = strlen(out);
        if (ft_hub_pinned_commit(model, commit, sizeof commit))
            snprintf(out + bl, n - bl, "@%s", commit);
        *source = "the Hugging Face cache";
        return 0;
    }
    snprintf(out, n, "%s", model);
    size_t ml = strlen(model);
    if (ml < 5 || strcasecmp(model + ml - 5, ".gguf") || !ft_path_exists(model)) return 0;
    ft_gguf *g;
    if (ft_gguf_open(&g, model) < 0) { /* the loader reports it */
        ft_err_clear();
        return 0;
    }
    for (size_t i = 0; i < sizeof k_gguf_repo_keys / sizeof *k_gguf_repo_keys && !*source; i++) {
        const ft_gguf_kv *kv = ft_gguf_find_kv(g, k_gguf_repo_keys[i]);
        if (!kv || kv->type != FT_GGUF_STRING || !kv->str) continue;
        if (i < 2 ? ft_peft_is_repo_id(kv->str) && snprintf(out, n, "%s", kv->str) >= 0
                  : hf_url_id(kv->str, out, n))
            *source = k_gguf_repo_keys[i];
    }
    ft_gguf_close(g);
    return 0;
}

static int write_config(const char *path, const ft_lora *l, const char *base_name)
{
    /* Keys in sorted order, as PEFT writes them (json.dumps(sort_keys=True)). */
    cJSON *o = cJSON_CreateObject();
    /* "org/name@REV": the id, and REV as PEFT's revision of the base */
    char id[256], rev[128];
    const int pinned = ft_hub_split_rev(base_name, id, sizeof id, rev, sizeof rev);
    cJSON_AddItemToObject(o, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddStringToObject(o, "base_model_name_or_path", pinned ? id : base_name ? base_name : "");
    cJSON_AddStringToObject(o, "bias", "none");
    cJSON_AddBoolToObject(o, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    cJSON_AddNullToObject(o, "layers_pattern");
    cJSON_AddNullToObject(o, "layers_to_transform");
    cJSON_AddNumberToObject(o, "lora_alpha", ft_peft_float_repr(l->cfg.alpha));
    cJSON_AddNumberToObject(o, "lora_dropout", ft_peft_float_repr(l->cfg.dropout));
    cJSON_AddNullToObject(o, "modules_to_save");
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddNumberToObject(o, "r", (double)l->cfg.r);
    cJSON_AddItemToObject(o, "rank_pattern", cJSON_CreateObject());
    if (pinned) cJSON_AddStringToObject(o, "revision", rev);
    else cJSON_AddNullToObject(o, "revision");
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
    (void)m;
    FT_TRY(ft_lora_pull(l));
    return ft_peft_save_values(dir, l, l->host, base_name);
}

/* No adapter leaves ftune holding an inf or NaN (PEFT and vLLM would load it and compute
 * garbage): FT_E_NUMERIC naming the tensor and the element, or 0. */
static int check_finite_values(const char *dir, const ft_lora *l, const float *values)
{
    if (!isfinite(l->cfg.alpha) || !isfinite(l->cfg.dropout))
        return ft_err(FT_E_NUMERIC, "%s/adapter_config.json: lora_alpha %g, lora_dropout %g: "
                      "not written (a config holds finite numbers only)", dir,
                      (double)l->cfg.alpha, (double)l->cfg.dropout);
    for (int64_t i = 0; i < l->n_layers; i++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            for (int w = 0; w < 2; w++) {
                const float *v = values + ((w ? ll->B : ll->A) - l->params);
                int64_t n = l->cfg.r * (w ? ll->out_n : ll->in_n);
                int64_t bad = ft_quant_first_nonfinite(v, n);
                if (bad == n) continue;
                char key[160];
                ft_peft_key(key, sizeof key, i, p, w ? 'B' : 'A');
                return ft_err(FT_E_NUMERIC, "%s/adapter_model.safetensors: tensor %s element %lld "
                              "is %s: the adapter is not written (training diverged, or its "
                              "settings do: see metrics.jsonl)", dir, key, (long long)bad,
                              isnan(v[bad]) ? "NaN" : "infinite");
            }
        }
    return 0;
}

int ft_peft_save_values(const char *dir, const ft_lora *l, const float *values, const char *base_name)
{
    FT_TRY(check_finite_values(dir, l, values));
    FT_TRY(ft_mkdir_p(dir));
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
            ts[k] = (ft_st_out){names[k], FT_ST_F32, 2, {l->cfg.r, ll->in_n}, values + offA};
            k++;
            ft_peft_key(names[k], sizeof names[k], i, p, 'B');
            ts[k] = (ft_st_out){names[k], FT_ST_F32, 2, {ll->out_n, l->cfg.r}, values + offB};
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
    return write_config(path, l, base_name);
}

/* A key that must be absent, null, false or an empty list/object for ftune to apply the
 * adapter as plain LoRA on every layer. */
static int must_be_empty(const cJSON *o, const char *key, const char *path, const char *why)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if ((cJSON_IsArray(v) || cJSON_IsObject(v)) && cJSON_GetArraySize(v) == 0) return 0;
    return ft_err(FT_E_UNSUPPORTED, "%s: \"%s\" is set: %s", path, key, why);
}

/* The JSON types PEFT's LoraConfig fields have (peft/tuners/lora/config.py): a key of another
 * type is refused by name, as PEFT fails on it or reads it otherwise than ftune would
 * ("lora_alpha": "32" fails in PEFT's alpha / r; "use_rslora": "true" and "use_dora": 1 are
 * true to Python). Absent keys take PEFT's defaults; null is accepted where PEFT treats None
 * as the default (the flags, the strings, target_modules' missing case is refused below). */
enum { T_NUM = 1, T_INT = 2, T_BOOL = 4, T_STR = 8, T_NULL = 16, T_STRS = 32 };
static const struct { const char *key; unsigned types; const char *what; } g_key_types[] = {
    {"peft_type", T_STR, "a string"},
    {"r", T_INT, "a positive integer"},
    {"lora_alpha", T_NUM, "a number"},
    {"lora_dropout", T_NUM, "a number"},
    {"use_rslora", T_BOOL | T_NULL, "true or false"},
    {"use_dora", T_BOOL | T_NULL, "true or false"},
    {"use_qalora", T_BOOL | T_NULL, "true or false"},
    {"fan_in_fan_out", T_BOOL | T_NULL, "true or false"},
    {"inference_mode", T_BOOL | T_NULL, "true or false"},
    {"bias", T_STR | T_NULL, "a string"},
    {"base_model_name_or_path", T_STR | T_NULL, "a string or null"},
    {"revision", T_STR | T_NULL, "a string or null"},
    {"task_type", T_STR | T_NULL, "a string or null"},
    {"target_modules", T_STR | T_STRS, "a string or a list of strings"},
};

static int json_has_type(const cJSON *v, unsigned types)
{
    if ((types & T_NULL) && cJSON_IsNull(v)) return 1;
    if ((types & T_BOOL) && cJSON_IsBool(v)) return 1;
    if ((types & T_STR) && cJSON_IsString(v)) return 1;
    if ((types & (T_NUM | T_INT)) && cJSON_IsNumber(v)) return 1;
    if ((types & T_STRS) && cJSON_IsArray(v)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) if (!cJSON_IsString(it)) return 0;
        return 1;
    }
    return 0;
}

static int check_key_types(const cJSON *o, const char *path)
{
    for (size_t i = 0; i < sizeof g_key_types / sizeof g_key_types[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, g_key_types[i].key);
        if (!v || json_has_type(v, g_key_types[i].types)) continue;
        return ft_err(FT_E_INVALID, "%s: key \"%s\": expected %s, found %s%s", path,
                      g_key_types[i].key, g_key_types[i].what, ft_json_type(v),
                      cJSON_IsArray(v) ? " holding a non-string" : "");
    }
    return 0;
}

/* Reads adapter_config.json into cfg and base_model_name_or_path into base (may be NULL). */
static int read_config(const char *dir, ft_lora_cfg *cfg, char *base, size_t base_n)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, "adapter_config.json"));
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(path, &txt, &len));
    const char *end = NULL;
    unsigned long oom_mark = ft_json_oom_mark();
    cJSON *o = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    if (!o && ft_json_oom_since(oom_mark)) {
        free(txt);
        return ft_err(-ENOMEM, "%s: out of memory while parsing it", path);
    }
    size_t nul = ft_json_find_nul(txt, len);
    size_t err_at = end ? (size_t)(end - txt) : 0, tail = err_at;
    while (o && tail < len && strchr(" \t\r\n", txt[tail])) tail++;
    free(txt);
    if (o && tail < len) {
        cJSON_Delete(o);
        return ft_err(FT_E_INVALID, "%s: offset %zu: text after the JSON object", path, tail);
    }
    if (!o || !cJSON_IsObject(o)) {
        int rc = o ? ft_err(FT_E_INVALID, "%s: not a JSON object (found %s)", path, ft_json_type(o))
                   : ft_err(FT_E_INVALID, "%s: not valid JSON (parse error at byte %zu)", path, err_at);
        cJSON_Delete(o);
        return rc;
    }
    if (nul < len) {
        cJSON_Delete(o);
        return ft_err(FT_E_INVALID, "%s: offset %zu: %s", path, nul, FT_JSON_NUL_WHY);
    }
    int oom = 0;
    const char *dup = ft_json_dup_key(o, 1, &oom);
    int rc = oom ? ft_err(-ENOMEM, "%s: out of memory", path)
           : dup ? ft_err(FT_E_INVALID, "%s: key \"%s\" appears twice in one object (PEFT's "
                          "json.load takes the last one): give it once", path, dup)
           : check_key_types(o, path);
    if (rc < 0) {
        cJSON_Delete(o);
        return rc;
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(o, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "r");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "lora_dropout");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "use_rslora");
    const cJSON *dora = cJSON_GetObjectItemCaseSensitive(o, "use_dora");
    const cJSON *qa = cJSON_GetObjectItemCaseSensitive(o, "use_qalora");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(o, "bias");
    const cJSON *fifo = cJSON_GetObjectItemCaseSensitive(o, "fan_in_fan_out");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "target_modules");
    const cJSON *bn = cJSON_GetObjectItemCaseSensitive(o, "base_model_name_or_path");
    memset(cfg, 0, sizeof *cfg);
    const cJSON *rev = cJSON_GetObjectItemCaseSensitive(o, "revision");
    if (base && base_n) {
        base[0] = 0;
        if (cJSON_IsString(bn)) snprintf(base, base_n, "%s", bn->valuestring);
        /* a hub id with PEFT's revision reads as "org/name@REV", as --model takes it; a
         * local folder named like an id stays as it is (transformers ignores the revision
         * of a local path) */
        char id[256], rv[128];
        size_t bl = strlen(base);
        if (bl && cJSON_IsString(rev) && rev->valuestring[0] && !strchr(base, '@') &&
            !ft_path_exists(base) &&
            bl + 1 + strlen(rev->valuestring) < base_n) {
            snprintf(base + bl, base_n - bl, "@%s", rev->valuestring);
            /* kept as an id with a revision, or as a local folder "name@REV" (which an
             * adapter of such a folder once split into name and revision) */
            if (!ft_path_exists(base) && !ft_hub_split_rev(base, id, sizeof id, rv, sizeof rv))
                base[bl] = 0; /* a path */
        }
    }
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA"))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"peft_type\" must be \"LORA\"", path);
    else if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1 && r->valuedouble <= 9007199254740992.0) ||
             r->valuedouble != floor(r->valuedouble)) /* bounded: the int64 cast below */
        rc = ft_err(FT_E_INVALID, "%s: \"r\" must be a positive integer", path);
    else if (a && !isfinite(a->valuedouble))
        rc = ft_err(FT_E_INVALID, "%s: key \"lora_alpha\": %g is not a finite number", path,
                    a->valuedouble);
    else if (d && !(d->valuedouble >= 0 && d->valuedouble <= 1)) /* torch's nn.Dropout */
        rc = ft_err(FT_E_INVALID, "%s: key \"lora_dropout\": %g is not a probability 0..1", path,
                    d->valuedouble);
    else if (cJSON_IsTrue(dora))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"use_dora\": DoRA adapters are not supported", path);
    else if (cJSON_IsTrue(qa))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"use_qalora\": QALoRA adapters (group-pooled inputs) "
                    "are not supported", path);
    else if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"bias\" must be \"none\"", path);
    else if (cJSON_IsTrue(fifo))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: \"fan_in_fan_out\" true is not a Llama layout", path);
    if (!rc) rc = must_be_empty(o, "lora_bias", path, "LoRA biases are not supported");
    if (!rc) rc = must_be_empty(o, "modules_to_save", path, "fully trained modules besides LoRA are not supported");
    if (!rc) rc = must_be_empty(o, "layers_to_transform", path, "ftune adapts every layer");
    if (!rc) rc = must_be_empty(o, "rank_pattern", path, "per-module ranks are not supported");
    if (!rc) rc = must_be_empty(o, "alpha_pattern", path, "per-module alphas are not supported");
    if (!rc) rc = must_be_empty(o, "exclude_modules", path, "ftune adapts every module target_modules names");
    if (!rc) rc = must_be_empty(o, "layer_replication", path, "a model with replicated layers is not supported");
    if (!rc) rc = must_be_empty(o, "trainable_token_indices", path, "trained token embeddings are not supported");
    if (!rc) rc = must_be_empty(o, "target_parameters", path, "LoRA on parameters (not modules) is not supported");
    if (!rc) rc = must_be_empty(o, "alora_invocation_tokens", path, "activated LoRA (aLoRA) is not supported");
    if (!rc) {
        cfg->r = (int64_t)r->valuedouble;
        cfg->alpha = a ? (float)a->valuedouble : 8.0f; /* PEFT default */
        cfg->dropout = d ? (float)d->valuedouble : 0.0f;
        cfg->use_rslora = cJSON_IsTrue(rs);
        if (cJSON_IsString(tm)) {
            rc = ft_lora_parse_targets(tm->valuestring, &cfg->targets);
        } else if (cJSON_IsArray(tm)) {
            const cJSON *it;
            cJSON_ArrayForEach(it, tm) {
                unsigned bit;
                if ((rc = ft_lora_parse_targets(it->valuestring, &bit)) < 0) break;
                cfg->targets |= bit;
            }
        } else {
            rc = ft_err(FT_E_INVALID, "missing \"target_modules\"");
        }
        if (rc < 0) ft_err_prefix(rc, "%s", path);
        else if (!cfg->targets)
            rc = ft_err(FT_E_INVALID, "%s: \"target_modules\" is empty", path);
    }
    if (!rc && !isfinite(cfg->alpha)) /* a double past FLT_MAX */
        rc = ft_err(FT_E_INVALID, "%s: key \"lora_alpha\": %g is out of range", path, a->valuedouble);
    cJSON_Delete(o);
    return rc;
}

int ft_peft_read_config(const char *dir, ft_lora_cfg *cfg)
{
    return read_config(dir, cfg, NULL, 0);
}

/* Parses "base_model.model.model.layers.{i}.{parent}.{proj}.lora_{A|B}.weight". Returns 1
 * with layer, proj, which (0 = A, 1 = B) set, or 0 if the key has another form. */
static int parse_key(const char *k, int64_t *layer, int *proj, int *which)
{
    static const char pre[] = "base_model.model.model.layers.";
    if (strncmp(k, pre, sizeof pre - 1)) return 0;
    const char *p = k + sizeof pre - 1;
    if (*p < '0' || *p > '9') return 0;
    char *end;
    long long i = strtoll(p, &end, 10);
    if (*end != '.' || i < 0 || i > 1000000) return 0;
    p = end + 1;
    for (int j = 0; j < FT_N_PROJ; j++) {
        char want[96];
        snprintf(want, sizeof want, "%s.%s.lora_", ft_proj_parent[j], ft_proj_name[j]);
        size_t n = strlen(want);
        if (strncmp(p, want, n)) continue;
        const char *q = p + n;
        if ((q[0] == 'A' || q[0] == 'B') && !strcmp(q + 1, ".weight")) {
            *layer = i;
            *proj = j;
            *which = q[0] == 'B';
            return 1;
        }
        return 0;
    }
    return 0;
}

/* Why a key that is not a plain LoRA A/B of a projection cannot be used. */
static int bad_key(const char *path, const char *k)
{
    if (strstr(k, "lora_embedding") || strstr(k, "embed_tokens"))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s: LoRA on the token embeddings is not "
                      "supported", path, k);
    if (strstr(k, "lm_head"))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s: LoRA on lm_head is not supported", path, k);
    if (strstr(k, "modules_to_save") || !strstr(k, "lora_"))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s is not a LoRA A/B matrix (a fully trained "
                      "module, modules_to_save): not supported", path, k);
    if (strstr(k, ".bias"))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s: LoRA biases are not supported", path, k);
    return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s is not a LoRA A/B of a Llama projection "
                  "(base_model.model.model.layers.N.{self_attn|mlp}.{q,k,v,o,gate,up,down}_proj"
                  ".lora_{A,B}.weight)", path, k);
}

void ft_peft_close(ft_peft_file *a)
{
    if (!a) return;
    ft_st_close(a->st);
    free(a->t);
    a->st = NULL;
    a->t = NULL;
}

static int open_checks(ft_peft_file *a)
{
    const char *path = a->path;
    int64_t n = ft_st_count(a->st), max_layer = -1;
    for (int64_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_st_at(a->st, i);
        int64_t layer;
        int p, w;
        if (!parse_key(t->name, &layer, &p, &w)) return bad_key(path, t->name);
        if (!(a->cfg.targets & (1u << p)))
            return ft_err(FT_E_INVALID, "%s: tensor %s: %s is not in target_modules of "
                          "adapter_config.json", path, t->name, ft_proj_name[p]);
        if (layer > max_layer) max_layer = layer;
    }
    if (max_layer < 0)
        return ft_err(FT_E_INVALID, "%s: no LoRA tensors (expected base_model.model.model.layers.N"
                      ".<module>.lora_A.weight / lora_B.weight)", path);
    a->n_layers = max_layer + 1;
    a->t = calloc((size_t)a->n_layers, sizeof *a->t);
    if (!a->t) return ft_err(-ENOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_st_at(a->st, i);
        int64_t layer;
        int p, w;
        parse_key(t->name, &layer, &p, &w);
        if (t->dtype != FT_ST_F32 && t->dtype != FT_ST_F16 && t->dtype != FT_ST_BF16)
            return ft_err(FT_E_UNSUPPORTED, "%s: tensor %s has dtype %s (F32, F16 or BF16 expected)",
                          path, t->name, ft_st_dtype_name(t->dtype));
        if (t->n_dims != 2)
            return ft_err(FT_E_INVALID, "%s: tensor %s has %d dims, expected 2", path, t->name,
                          t->n_dims);
        int64_t rank = w ? t->shape[1] : t->shape[0];
        if (rank != a->cfg.r)
            return ft_err(FT_E_INVALID, "%s: tensor %s has shape [%lld, %lld]: rank %lld, but "
                          "adapter_config.json has r = %lld", path, t->name, (long long)t->shape[0],
                          (long long)t->shape[1], (long long)rank, (long long)a->cfg.r);
        int64_t dim = w ? t->shape[0] : t->shape[1], *ref = w ? &a->out_n[p] : &a->in_n[p];
        if (*ref == 0) *ref = dim;
        if (dim != *ref)
            return ft_err(FT_E_INVALID, "%s: tensor %s has shape [%lld, %lld], but other layers' "
                          "%s has %s %lld", path, t->name, (long long)t->shape[0],
                          (long long)t->shape[1], ft_proj_name[p], w ? "out" : "in", (long long)*ref);
        a->t[layer][p][w] = t;
    }
    for (int64_t l = 0; l < a->n_layers; l++)
        for (int p = 0; p < FT_N_PROJ; p++)
            for (int w = 0; w < 2 && (a->cfg.targets & (1u << p)); w++)
                if (!a->t[l][p][w]) {
                    char key[160];
                    ft_peft_key(key, sizeof key, l, p, w ? 'B' : 'A');
                    return ft_err(FT_E_NOTFOUND, "%s: missing tensor %s (the file has layers up to "
                                  "%lld and target_modules includes %s)", path, key,
                                  (long long)(a->n_layers - 1), ft_proj_name[p]);
                }
    return 0;
}

/* Every element of every tensor finite, read as eval and train read them (ft_st_to_f32):
 * an adapter holding an inf or NaN is refused when it is opened, before export or merge
 * writes anything. */
static int check_finite_tensors(const ft_peft_file *a)
{
    int64_t n = ft_st_count(a->st), max = 0;
    for (int64_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_st_at(a->st, i);
        if (t->shape[0] * t->shape[1] > max) max = t->shape[0] * t->shape[1];
    }
    float *buf = malloc((size_t)(max ? max : 1) * sizeof *buf);
    if (!buf) return ft_err(-ENOMEM, "%s: out of memory", a->path);
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        const ft_st_tensor *t = ft_st_at(a->st, i);
        rc = ft_st_to_f32(t, buf, t->shape[0] * t->shape[1]);
        if (rc < 0) ft_err_prefix(rc, "%s", a->path);
    }
    free(buf);
    return rc;
}

int ft_peft_open(ft_peft_file *a, const char *dir)
{
    memset(a, 0, sizeof *a);
    FT_TRY(read_config(dir, &a->cfg, a->base_name, sizeof a->base_name));
    a->scale = ft_lora_scale(&a->cfg);
    FT_TRY(ft_path_join(a->path, sizeof a->path, dir, "adapter_model.safetensors"));
    FT_TRY(ft_st_open(&a->st, a->path));
    int rc = open_checks(a);
    if (!rc) rc = check_finite_tensors(a);
    if (rc < 0) ft_peft_close(a);
    return rc;
}

int ft_peft_check_base(const ft_peft_file *a, const ft_model_config *mc, const char *model)
{
    const char *bn = a->base_name[0] ? a->base_name : "(not recorded)";
    if (a->n_layers != mc->num_hidden_layers)
        return ft_err(FT_E_INVALID, "%s: the adapter has %lld layers but the model %s has %lld: the "
                      "adapter was trained on another base model (base_model_name_or_path %s)",
                      a->path, (long long)a->n_layers, model, (long long)mc->num_hidden_layers, bn);
    for (int p = 0; p < FT_N_PROJ; p++) {
        if (!(a->cfg.targets & (1u << p))) continue;
        int64_t out, in;
        ft_proj_dims(mc, p, &out, &in);
        if (out != a->out_n[p] || in != a->in_n[p]) {
            const ft_st_tensor *A = a->t[0][p][0];
            return ft_err(FT_E_INVALID, "%s: tensor %s has shape [%lld, %lld] and its B %lld rows: "
                          "%s is (%lld x %lld) in the adapter but (%lld x %lld) in the model %s: the "
                          "adapter was trained on another base model (base_model_name_or_path %s)",
                          a->path, A->name, (long long)A->shape[0], (long long)A->shape[1],
                          (long long)a->out_n[p], ft_proj_name[p], (long long)a->out_n[p],
                          (long long)a->in_n[p], (long long)out, (long long)in, model, bn);
        }
    }
    return 0;
}

int ft_peft_tensor_f64(const ft_peft_file *a, int64_t layer, int p, int which, double *dst)
{
    const ft_st_tensor *t = a->t[layer][p][which];
    int64_t n = t->shape[0] * t->shape[1];
    /* converted as eval and train load it (ft_st_to_f32: an inf or NaN is refused, naming
     * the tensor, its element and file offset), into the first half of dst, then widened in
     * place from the last element down (element i's double covers floats 2i and 2i + 1,
     * which are read by then) */
    float *f = (float *)(void *)dst;
    int rc = ft_st_to_f32(t, f, n);
    if (rc < 0) return ft_err_prefix(rc, "%s", a->path);
    for (int64_t i = n - 1; i >= 0; i--) {
        float x;
        memcpy(&x, (const char *)dst + 4 * i, 4);
        double y = x;
        memcpy((char *)dst + 8 * i, &y, 8);
    }
    return 0;
}

int ft_peft_load_weights(const char *dir, ft_lora *l)
{
    FT_TRY(ft_peft_load_values(dir, l, l->host));
    return ft_lora_push(l);
}

int ft_peft_load_values(const char *dir, const ft_lora *l, float *values)
{
    ft_peft_file a;
    FT_TRY(ft_peft_open(&a, dir));
    int rc = 0;
    if (a.cfg.r != l->cfg.r || a.cfg.targets != l->cfg.targets)
        rc = ft_err(FT_E_INVALID, "%s: the adapter has r = %lld and targets 0x%x, the LoRA it is "
                    "loaded into r = %lld and targets 0x%x", a.path, (long long)a.cfg.r,
                    a.cfg.targets, (long long)l->cfg.r, l->cfg.targets);
    else if (a.n_layers != l->n_layers)
        rc = ft_err(FT_E_INVALID, "%s: the adapter has %lld layers but the model has %lld: the "
                    "adapter was trained on another base model (base_model_name_or_path %s)",
                    a.path, (long long)a.n_layers, (long long)l->n_layers,
                    a.base_name[0] ? a.base_name : "(not recorded)");
    for (int64_t i = 0; i < l->n_layers && !rc; i++) {
        for (int p = 0; p < FT_N_PROJ && !rc; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            for (int w = 0; w < 2 && !rc; w++) {
                const ft_st_tensor *t = a.t[i][p][w];
                int64_t rows = w ? ll->out_n : l->cfg.r, cols = w ? l->cfg.r : ll->in_n;
                if (t->shape[0] != rows || t->shape[1] != cols) {
                    rc = ft_err(FT_E_INVALID, "%s: tensor %s has shape [%lld, %lld], the model "
                                "needs [%lld, %lld] (%s is %lld x %lld in the model): the adapter "
                                "was trained on another base model (base_model_name_or_path %s)",
                                a.path, t->name, (long long)t->shape[0], (long long)t->shape[1],
                                (long long)rows, (long long)cols, ft_proj_name[p],
                                (long long)ll->out_n, (long long)ll->in_n,
                                a.base_name[0] ? a.base_name : "(not recorded)");
                    break;
                }
                float *dst = values + ((w ? ll->B : ll->A) - l->params);
                rc = ft_st_to_f32(t, dst, rows * cols);
                if (rc < 0) ft_err_prefix(rc, "%s: %s", a.path, t->name);
            }
        }
    }
    ft_peft_close(&a);
    return rc;
}

int ft_peft_serving_hints(const ft_lora_cfg *c, char *buf, size_t n)
{
    static const int64_t vllm_ranks[] = {1, 8, 16, 32, 64, 128, 256, 320, 512};
    if (n) buf[0] = 0;
    if (c->r <= 16) return 0;
    for (size_t i = 0; i < sizeof vllm_ranks / sizeof vllm_ranks[0]; i++)
        if (vllm_ranks[i] >= c->r) {
            snprintf(buf, n, "rank %lld is above vLLM's default --max-lora-rank 16: serve it with "
                     "--max-lora-rank %lld (or merge it into the base with ftune merge)",
                     (long long)c->r, (long long)vllm_ranks[i]);
            return 1;
        }
    snprintf(buf, n, "rank %lld is above vLLM's largest --max-lora-rank (512): vLLM cannot load "
             "this adapter; merge it into the base with ftune merge, or use llama.cpp (ftune export)",
             (long long)c->r);
    return 1;
}
