/* config.c - HF config.json for Llama-family models and RoPE inverse frequencies
 * (see config.h; fields and defaults: formats.md 2.1 / transformers LlamaConfig; RoPE
 * scaling: formats.md 2.2 / transformers modeling_rope_utils.py, fp32 as torch computes). */
#include <stddef.h> /* config.h uses size_t without including it */

#include "src/formats/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"

#define CFG_MAX_DIM ((int64_t)1 << 30) /* sanity bound on every size field */

/* The item under key, or NULL when absent or JSON null. */
static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int missing(const char *name, const char *prefix, const char *key, const char *why)
{
    return ft_err(FT_E_INVALID, "%s: missing required key \"%s%s\"%s", name, prefix, key, why);
}

static int type_err(const char *name, const char *prefix, const char *key, const char *want,
                    const cJSON *v)
{
    return ft_err(FT_E_INVALID, "%s: key \"%s%s\": expected %s, found %s", name, prefix, key,
                  want, ft_json_type(v));
}

/* Integer field: 0 when absent (v untouched; FT_E_INVALID if `required`), 1 when read. */
static int get_int(const cJSON *o, const char *prefix, const char *key, int64_t *v,
                   int required, const char *name)
{
    const cJSON *x = item(o, key);
    if (!x) return required ? missing(name, prefix, key, "") : 0;
    double d = x->valuedouble;
    if (!cJSON_IsNumber(x) || d != floor(d) || fabs(d) > 9007199254740992.0)
        return type_err(name, prefix, key, "an integer", x);
    *v = (int64_t)d;
    return 1;
}

static int get_num(const cJSON *o, const char *prefix, const char *key, double *v,
                   int required, const char *name)
{
    const cJSON *x = item(o, key);
    if (!x) return required ? missing(name, prefix, key, "") : 0;
    if (!cJSON_IsNumber(x)) return type_err(name, prefix, key, "a number", x);
    *v = x->valuedouble;
    return 1;
}

static int get_bool(const cJSON *o, const char *key, int *v, const char *name)
{
    const cJSON *x = item(o, key);
    if (!x) return 0;
    if (!cJSON_IsBool(x)) return type_err(name, "", key, "true or false", x);
    *v = cJSON_IsTrue(x);
    return 1;
}

static int get_str(const cJSON *o, const char *prefix, const char *key, const char **v,
                   const char *name)
{
    const cJSON *x = item(o, key);
    if (!x) return 0;
    if (!cJSON_IsString(x)) return type_err(name, prefix, key, "a string", x);
    *v = x->valuestring;
    return 1;
}

/* rope_scaling (legacy) or rope_parameters (transformers v5). */
static int parse_rope(ft_model_config *c, const cJSON *root, const char *name)
{
    c->rope_theta = 10000.0;
    c->rope_type = FT_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->rope_attention_factor = 1.0;
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    FT_TRY(get_num(root, "", "rope_theta", &c->rope_theta, 0, name));
    const cJSON *rp = item(root, "rope_parameters"), *rs = item(root, "rope_scaling");
    const cJSON *sc = rp ? rp : rs;
    const char *pre = rp ? "rope_parameters." : "rope_scaling.";
    if (!sc) return 0;
    if (!cJSON_IsObject(sc))
        return type_err(name, "", rp ? "rope_parameters" : "rope_scaling", "an object", sc);
    if (rp) FT_TRY(get_num(rp, pre, "rope_theta", &c->rope_theta, 0, name));
    const char *type = NULL;
    int has = get_str(sc, pre, "rope_type", &type, name);
    if (has < 0) return has;
    if (!has) FT_TRY(get_str(sc, pre, "type", &type, name)); /* "BC: rope_type was originally type" */
    if (!type) {
        if (rp) type = "default";
        else return missing(name, pre, "rope_type", " (or \"type\")");
    }
    const char *why = "";
    if (!strcmp(type, "default")) {
        return 0;
    } else if (!strcmp(type, "linear")) {
        c->rope_type = FT_ROPE_LINEAR;
        why = " (rope type linear)";
    } else if (!strcmp(type, "dynamic")) {
        c->rope_type = FT_ROPE_DYNAMIC;
        why = " (rope type dynamic)";
    } else if (!strcmp(type, "yarn")) {
        c->rope_type = FT_ROPE_YARN;
        why = " (rope type yarn)";
    } else if (!strcmp(type, "llama3")) {
        c->rope_type = FT_ROPE_LLAMA3;
        why = " (rope type llama3)";
    } else {
        return ft_err(FT_E_UNSUPPORTED, "%s: key \"%srope_type\": rope type \"%s\" is not "
                      "supported (default, linear, dynamic, llama3, yarn)", name, pre, type);
    }
    int rc = get_num(sc, pre, "factor", &c->rope_factor, 0, name);
    if (rc < 0) return rc;
    if (!rc) return missing(name, pre, "factor", why);
    int llama3 = c->rope_type == FT_ROPE_LLAMA3;
    if (llama3) {
        if ((rc = get_num(sc, pre, "low_freq_factor", &c->rope_low_freq_factor, 0, name)) < 0) return rc;
        if (!rc) return missing(name, pre, "low_freq_factor", why);
        if ((rc = get_num(sc, pre, "high_freq_factor", &c->rope_high_freq_factor, 0, name)) < 0) return rc;
        if (!rc) return missing(name, pre, "high_freq_factor", why);
    }
    rc = get_int(sc, pre, "original_max_position_embeddings",
                 &c->rope_original_max_position_embeddings, 0, name);
    if (rc < 0) return rc;
    if (!rc && llama3) return missing(name, pre, "original_max_position_embeddings", why);
    if (c->rope_type == FT_ROPE_YARN) {
        FT_TRY(get_num(sc, pre, "beta_fast", &c->rope_beta_fast, 0, name));
        FT_TRY(get_num(sc, pre, "beta_slow", &c->rope_beta_slow, 0, name));
        /* transformers _compute_yarn_parameters: get_mscale(factor) = 0.1 ln(factor) + 1 */
        c->rope_attention_factor = c->rope_factor > 1 ? 0.1 * log(c->rope_factor) + 1.0 : 1.0;
        FT_TRY(get_num(sc, pre, "attention_factor", &c->rope_attention_factor, 0, name));
    }
    return 0;
}

static int parse_special_ids(ft_model_config *c, const cJSON *root, const char *name)
{
    c->bos_token_id = 1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (b && cJSON_IsNull(b)) c->bos_token_id = -1;
    else FT_TRY(get_int(root, "", "bos_token_id", &c->bos_token_id, 0, name));
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    c->n_eos = 0;
    if (!e) {
        c->eos_token_id[c->n_eos++] = 2;
    } else if (cJSON_IsArray(e)) {
        int n = cJSON_GetArraySize(e);
        if (n > FT_MAX_EOS)
            return ft_err(FT_E_RANGE, "%s: key \"eos_token_id\": %d ids, at most %d supported",
                          name, n, FT_MAX_EOS);
        for (const cJSON *x = e->child; x; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
                return type_err(name, "", "eos_token_id", "an integer or a list of integers", x);
            if (fabs(x->valuedouble) > 9007199254740992.0) /* (int64_t) of more is undefined */
                return ft_err(FT_E_INVALID, "%s: key \"eos_token_id\": %g is not a token id", name,
                              x->valuedouble);
            c->eos_token_id[c->n_eos++] = (int64_t)x->valuedouble;
        }
    } else if (!cJSON_IsNull(e)) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
            return type_err(name, "", "eos_token_id", "an integer or a list of integers", e);
        if (fabs(e->valuedouble) > 9007199254740992.0)
            return ft_err(FT_E_INVALID, "%s: key \"eos_token_id\": %g is not a token id", name,
                          e->valuedouble);
        c->eos_token_id[c->n_eos++] = (int64_t)e->valuedouble;
    }
    return 0;
}

static const struct { const char *arch, *type; } k_arch[] = {
    {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
};

int ft_config_parse(ft_model_config *cfg, const char *json, size_t len, const char *name)
{
    memset(cfg, 0, sizeof *cfg);
    const char *end = NULL;
    unsigned long oom = ft_json_oom_mark();
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root && ft_json_oom_since(oom))
        return ft_err(-ENOMEM, "%s: out of memory while parsing it", name);
    if (!root)
        return ft_err(FT_E_INVALID, "%s: not valid JSON (parse error at byte %lld)", name,
                      (long long)(end ? end - json : 0));
    int rc = 0;
    ft_model_config *c = cfg;
    if (!cJSON_IsObject(root)) {
        rc = ft_err(FT_E_INVALID, "%s: expected a JSON object, found %s", name, ft_json_type(root));
        goto done;
    }
    const char *mt = NULL;
    if ((rc = get_str(root, "", "model_type", &mt, name)) < 0) goto done;
    if (!mt) {
        const cJSON *a = item(root, "architectures");
        const cJSON *a0 = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
        for (size_t i = 0; a0 && cJSON_IsString(a0) && i < sizeof k_arch / sizeof k_arch[0]; i++)
            if (!strcmp(a0->valuestring, k_arch[i].arch)) mt = k_arch[i].type;
        if (!mt) {
            rc = missing(name, "", "model_type", "");
            goto done;
        }
    }
    if (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2") && strcmp(mt, "qwen3")) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: model_type \"%.64s\" is not supported (llama, mistral, "
                    "qwen2, qwen3)", name, mt);
        goto done;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);

    static const char *const req[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                      "num_attention_heads", "vocab_size"};
    int64_t *dst[] = {&c->hidden_size, &c->intermediate_size, &c->num_hidden_layers,
                      &c->num_attention_heads, &c->vocab_size};
    for (int i = 0; i < 5; i++)
        if ((rc = get_int(root, "", req[i], dst[i], 1, name)) < 0) goto done;
    c->max_position_embeddings = 2048;
    c->rms_norm_eps = 1e-6f;
    double eps = 1e-6;
    if ((rc = get_int(root, "", "num_key_value_heads", &c->num_key_value_heads, 0, name)) < 0 ||
        (rc = get_int(root, "", "head_dim", &c->head_dim, 0, name)) < 0 ||
        (rc = get_int(root, "", "max_position_embeddings", &c->max_position_embeddings, 0, name)) < 0 ||
        (rc = get_num(root, "", "rms_norm_eps", &eps, 0, name)) < 0 ||
        (rc = get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, name)) < 0 ||
        (rc = get_bool(root, "attention_bias", &c->attention_bias, name)) < 0)
        goto done;
    c->rms_norm_eps = (float)eps;
    if (!strcmp(mt, "qwen2")) c->attention_bias = 1; /* q/k/v Linear(bias=True) */
    /* Qwen3Attention: q_norm/k_norm = Qwen3RMSNorm(head_dim, eps=rms_norm_eps) on each head
     * before RoPE; q/k/v/o biases follow attention_bias as LlamaAttention's */
    c->qk_norm = !strcmp(mt, "qwen3");

    int mlp_bias = 0, sliding = 0;
    int64_t max_window = 0;
    const char *act = "silu";
    double partial = 1.0;
    if ((rc = get_bool(root, "mlp_bias", &mlp_bias, name)) < 0 ||
        (rc = get_str(root, "", "hidden_act", &act, name)) < 0 ||
        (rc = get_num(root, "", "partial_rotary_factor", &partial, 0, name)) < 0 ||
        (rc = get_bool(root, "use_sliding_window", &sliding, name)) < 0 ||
        (rc = get_int(root, "", "max_window_layers", &max_window, 0, name)) < 0)
        goto done;
    if (mlp_bias) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: key \"mlp_bias\": MLP biases are not supported", name);
        goto done;
    }
    if (strcmp(act, "silu")) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: key \"hidden_act\": \"%.32s\" is not supported (silu)",
                    name, act);
        goto done;
    }
    if (partial != 1.0) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: key \"partial_rotary_factor\": %g is not supported "
                    "(1.0)", name, partial);
        goto done;
    }
    if (sliding && max_window < c->num_hidden_layers) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: key \"use_sliding_window\": sliding-window attention "
                    "(layers >= max_window_layers = %lld) is not supported", name,
                    (long long)max_window);
        goto done;
    }
    if ((rc = parse_rope(c, root, name)) < 0 || (rc = parse_special_ids(c, root, name)) < 0)
        goto done;
    rc = ft_config_validate(c, name);
done:
    cJSON_Delete(root);
    return rc;
}

int ft_config_load(ft_model_config *cfg, const char *path)
{
    char *txt;
    size_t len;
    FT_TRY(ft_read_file(path, &txt, &len));
    int rc = ft_config_parse(cfg, txt, len, path);
    free(txt);
    return rc;
}

static int bad(const char *name, const char *what, long long v)
{
    return ft_err(FT_E_INVALID, "%s: %s (found %lld)", name, what, v);
}

int ft_config_validate(ft_model_config *c, const char *name)
{
    struct { const char *key; int64_t v; } dims[] = {
        {"hidden_size", c->hidden_size}, {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_hidden_layers}, {"num_attention_heads", c->num_attention_heads},
        {"vocab_size", c->vocab_size}, {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v <= 0 || dims[i].v > CFG_MAX_DIM)
            return ft_err(FT_E_INVALID, "%s: key \"%s\" = %lld, expected 1..%lld", name, dims[i].key,
                          (long long)dims[i].v, (long long)CFG_MAX_DIM);
    if (c->num_key_value_heads == 0) c->num_key_value_heads = c->num_attention_heads;
    if (c->num_key_value_heads < 0 || c->num_key_value_heads > c->num_attention_heads ||
        c->num_attention_heads % c->num_key_value_heads)
        return ft_err(FT_E_INVALID, "%s: num_attention_heads (%lld) must be a multiple of "
                      "num_key_value_heads (%lld)", name, (long long)c->num_attention_heads,
                      (long long)c->num_key_value_heads);
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads)
            return ft_err(FT_E_INVALID, "%s: hidden_size (%lld) is not a multiple of "
                          "num_attention_heads (%lld) and head_dim is not given", name,
                          (long long)c->hidden_size, (long long)c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > CFG_MAX_DIM)
        return bad(name, "head_dim must be positive and even", (long long)c->head_dim);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return ft_err(FT_E_INVALID, "%s: rms_norm_eps must be positive (found %g)", name,
                      (double)c->rms_norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return ft_err(FT_E_INVALID, "%s: rope_theta must be positive (found %g)", name, c->rope_theta);
    if (c->rope_type < FT_ROPE_DEFAULT || c->rope_type > FT_ROPE_YARN)
        return bad(name, "unknown rope type", c->rope_type);
    if (c->rope_type == FT_ROPE_DEFAULT) c->rope_factor = 1.0;
    if (!(c->rope_factor > 0) || !isfinite(c->rope_factor))
        return ft_err(FT_E_INVALID, "%s: rope factor must be positive (found %g)", name,
                      c->rope_factor);
    if (c->rope_type == FT_ROPE_LLAMA3 &&
        (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
         c->rope_original_max_position_embeddings <= 0))
        return ft_err(FT_E_INVALID, "%s: llama3 rope needs 0 < low_freq_factor (%g) < "
                      "high_freq_factor (%g) and original_max_position_embeddings > 0 (%lld)",
                      name, c->rope_low_freq_factor, c->rope_high_freq_factor,
                      (long long)c->rope_original_max_position_embeddings);
    if (c->rope_original_max_position_embeddings < 0)
        return bad(name, "original_max_position_embeddings must be positive",
                   (long long)c->rope_original_max_position_embeddings);
    if (c->n_eos < 0 || c->n_eos > FT_MAX_EOS)
        return bad(name, "bad number of eos ids", c->n_eos);
    return 0;
}

/* ---- RoPE ----------------------------------------------------------------------------------
 * Each step mirrors the torch expression in transformers modeling_rope_utils.py, in fp32
 * with python-float scalars rounded to fp32 (torch's wrapped-number rule); `a / t` with a
 * scalar a and tensor t is computed by torch as reciprocal(t) * a. */

static void default_inv_freq(float base, int64_t D, float *inv)
{
    for (int64_t i = 0; i < D / 2; i++) {
        float e = (float)(2 * i) / (float)D;
        inv[i] = 1.0f / powf(base, e);
    }
}

static double yarn_corr_dim(double rot, int64_t D, double base, double max_pos)
{
    return ((double)D * log(max_pos / (rot * 2 * M_PI))) / (2 * log(base));
}

void ft_rope_inv_freq(const ft_model_config *cfg, int64_t seq_len, float *inv)
{
    const int64_t D = cfg->head_dim, half = D / 2;
    const double factor = cfg->rope_factor;
    int64_t orig = cfg->rope_original_max_position_embeddings > 0
                       ? cfg->rope_original_max_position_embeddings
                       : cfg->max_position_embeddings;
    switch (cfg->rope_type) {
    case FT_ROPE_LINEAR:
        default_inv_freq((float)cfg->rope_theta, D, inv);
        for (int64_t i = 0; i < half; i++) inv[i] = inv[i] / (float)factor;
        return;
    case FT_ROPE_DYNAMIC: {
        /* _compute_dynamic_ntk_parameters: base in python double, then the default formula */
        double sl = seq_len > orig ? (double)seq_len : (double)orig;
        double base = cfg->rope_theta *
                      pow(factor * sl / (double)orig - (factor - 1), (double)D / (double)(D - 2));
        default_inv_freq((float)base, D, inv);
        return;
    }
    case FT_ROPE_LLAMA3: {
        /* _compute_llama3_parameters */
        default_inv_freq((float)cfg->rope_theta, D, inv);
        const double lf = cfg->rope_low_freq_factor, hf = cfg->rope_high_freq_factor;
        const double old = (double)cfg->rope_original_max_position_embeddings;
        const float low_wl = (float)(old / lf), high_wl = (float)(old / hf);
        const float f = (float)factor, two_pi = (float)(2 * M_PI);
        for (int64_t i = 0; i < half; i++) {
            float x = inv[i];
            float wl = (1.0f / x) * two_pi;
            float lla = wl > low_wl ? x / f : x;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float s = ((1.0f / wl) * (float)old - (float)lf) / (float)(hf - lf);
                lla = ((1.0f - s) * lla) / f + s * lla;
            }
            inv[i] = lla;
        }
        return;
    }
    case FT_ROPE_YARN: {
        /* _compute_yarn_parameters (truncate = True); the attention factor is not applied here */
        const float base = (float)cfg->rope_theta;
        double low = floor(yarn_corr_dim(cfg->rope_beta_fast, D, cfg->rope_theta, (double)orig));
        double high = ceil(yarn_corr_dim(cfg->rope_beta_slow, D, cfg->rope_theta, (double)orig));
        if (low < 0) low = 0;
        if (high > (double)(D - 1)) high = (double)(D - 1);
        if (low == high) high += 0.001;
        for (int64_t i = 0; i < half; i++) {
            float pos = powf(base, (float)(2 * i) / (float)D);
            float extra = 1.0f / pos;
            float inter = 1.0f / ((float)factor * pos);
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp;
            inv[i] = inter * (1.0f - ef) + extra * ef;
        }
        return;
    }
    default:
        default_inv_freq((float)cfg->rope_theta, D, inv);
        return;
    }
}
