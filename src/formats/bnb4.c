/* bnb4.c - bitsandbytes 4-bit safetensors weights (see bnb4.h; formats.md 5.5). */
#include "src/formats/bnb4.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"

#define QS_NF4 ".quant_state.bitsandbytes__nf4"
#define QS_FP4 ".quant_state.bitsandbytes__fp4"

static const ft_st_tensor *companion(const ft_st_set *s, const char *weight, const char *suffix,
                                     const ft_st_file **f)
{
    char name[512];
    if (snprintf(name, sizeof name, "%s%s", weight, suffix) >= (int)sizeof name) return NULL;
    return ft_st_set_find(s, name, f);
}

int ft_bnb4_detect(const ft_st_set *s, const char *weight)
{
    return companion(s, weight, QS_NF4, NULL) || companion(s, weight, QS_FP4, NULL);
}

static int64_t numel(const ft_st_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    return n;
}

/* A companion tensor of the given dtype and element count, else FT_E_INVALID. */
static int need(const ft_st_set *s, const char *weight, const char *suffix, int dtype, int64_t n,
                const ft_st_tensor **out)
{
    const ft_st_file *f = NULL;
    const ft_st_tensor *t = companion(s, weight, suffix, &f);
    if (!t) {
        const ft_st_file *wf = NULL;
        ft_st_set_find(s, weight, &wf);
        return ft_err(FT_E_INVALID, "%s: tensor \"%s%s\" not found: the bitsandbytes 4-bit "
                      "weight \"%s\" needs it", wf ? ft_st_path(wf) : "model", weight, suffix,
                      weight);
    }
    if (t->dtype != dtype || numel(t) != n)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s%s\" is %s with %lld elements, expected %s "
                      "with %lld", ft_st_path(f), weight, suffix, ft_st_dtype_name(t->dtype),
                      (long long)numel(t), ft_st_dtype_name(dtype), (long long)n);
    *out = t;
    return 0;
}

static int json_int(const cJSON *o, const char *key, int64_t *v, int required, const char *where)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) {
        if (required) return ft_err(FT_E_INVALID, "%s: quant state has no \"%s\"", where, key);
        return 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9e15)
        return ft_err(FT_E_INVALID, "%s: quant state \"%s\" is not an integer", where, key);
    *v = (int64_t)it->valuedouble;
    return 1;
}

/* Parses the packed quant-state JSON (bnb utils.pack_dict_to_tensor: UTF-8 json.dumps). */
static int parse_state(const ft_st_tensor *qs, const char *where, int64_t rows, int64_t cols,
                       ft_bnb4_tensor *t, int64_t *bs, int64_t *nbs, double *offset, int *nested)
{
    cJSON *o = cJSON_ParseWithLength(qs->data, qs->nbytes);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return ft_err(FT_E_INVALID, "%s: quant state is not a JSON object", where);
    }
    int rc = 0;
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(o, "quant_type");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype");
    const cJSON *nd = cJSON_GetObjectItemCaseSensitive(o, "nested_dtype");
    const cJSON *no = cJSON_GetObjectItemCaseSensitive(o, "nested_offset");
    if (!cJSON_IsString(qt) || strcmp(qt->valuestring, "nf4"))
        rc = ft_err(cJSON_IsString(qt) ? FT_E_UNSUPPORTED : FT_E_INVALID, "%s: quant_type %s%s%s "
                    "(only nf4 is supported)", where, cJSON_IsString(qt) ? "\"" : "",
                    cJSON_IsString(qt) ? qt->valuestring : "missing", cJSON_IsString(qt) ? "\"" : "");
    if (!rc && (rc = json_int(o, "blocksize", bs, 1, where)) > 0) rc = 0;
    if (!rc) {
        int ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == 2;
        int64_t d[2] = {0, 0};
        for (int k = 0; ok && k < 2; k++) {
            const cJSON *e = cJSON_GetArrayItem(sh, k);
            ok = cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) &&
                 fabs(e->valuedouble) <= 9e15; /* range first: the cast is UB outside int64 */
            if (ok) d[k] = (int64_t)e->valuedouble;
        }
        if (!ok)
            rc = ft_err(FT_E_INVALID, "%s: quant state \"shape\" is not [out, in], expected "
                        "[%lld, %lld] (from config.json)", where, (long long)rows, (long long)cols);
        else if (d[0] != rows || d[1] != cols)
            rc = ft_err(FT_E_INVALID, "%s: quant state \"shape\" is [%lld, %lld], expected "
                        "[%lld, %lld] (from config.json)", where, (long long)d[0], (long long)d[1],
                        (long long)rows, (long long)cols);
    }
    if (!rc && cJSON_IsString(dt)) snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
    *nested = 0;
    if (!rc && (rc = json_int(o, "nested_blocksize", nbs, 0, where)) > 0) {
        rc = 0;
        *nested = 1;
        if (nd && (!cJSON_IsString(nd) || strcmp(nd->valuestring, "float32")))
            rc = ft_err(FT_E_UNSUPPORTED, "%s: nested_dtype is not \"float32\"", where);
        if (!rc && !cJSON_IsNumber(no))
            rc = ft_err(FT_E_INVALID, "%s: quant state has nested_blocksize but no numeric "
                        "nested_offset", where);
        else if (!rc && !(fabs(no->valuedouble) <= FLT_MAX)) /* the float cast would be UB */
            rc = ft_err(FT_E_INVALID, "%s: quant state nested_offset %g is not a float32 value",
                        where, no->valuedouble);
        if (!rc) *offset = no->valuedouble;
    }
    cJSON_Delete(o);
    return rc;
}

int ft_bnb4_open(const ft_st_set *s, const char *weight, int64_t rows, int64_t cols,
                 ft_bnb4_tensor *t)
{
    memset(t, 0, sizeof *t);
    const ft_st_file *f = NULL;
    const ft_st_tensor *w = ft_st_set_find(s, weight, &f);
    if (!w) return ft_err(FT_E_INVALID, "tensor \"%s\" not found in the model's safetensors", weight);
    char where[600];
    snprintf(where, sizeof where, "%s: tensor \"%s\"", ft_st_path(f), weight);
    if (companion(s, weight, QS_FP4, NULL))
        return ft_err(FT_E_UNSUPPORTED, "%s: bitsandbytes FP4 weights are not supported (NF4 are)",
                      where);
    const ft_st_tensor *qs = companion(s, weight, QS_NF4, NULL);
    if (!qs || qs->dtype != FT_ST_U8)
        return ft_err(FT_E_INVALID, "%s: no U8 \"%s\" quant state", where, QS_NF4 + 1);
    int64_t bs = 0, nbs = 0;
    double off = 0;
    int nested = 0;
    FT_TRY(parse_state(qs, where, rows, cols, t, &bs, &nbs, &off, &nested));
    if (rows < 1 || cols < 1 || rows > INT64_MAX / cols)
        return ft_err(FT_E_INVALID, "%s: bad shape %lld x %lld", where, (long long)rows, (long long)cols);
    int rc = ft_nf4_layout_init(&t->v.lay, rows * cols, bs, nested ? nbs : 0);
    if (rc < 0) return ft_err_prefix(rc, "%s", where);
    if ((int64_t)w->nbytes != t->v.lay.code_bytes)
        return ft_err(FT_E_INVALID, "%s: %zu bytes of packed codes, expected %lld for %lld x %lld "
                      "NF4 values", where, w->nbytes, (long long)t->v.lay.code_bytes, (long long)rows,
                      (long long)cols);
    const ft_st_tensor *am, *qm, *na = NULL, *nm = NULL;
    const ft_nf4_layout *l = &t->v.lay;
    FT_TRY(need(s, weight, ".absmax", nested ? FT_ST_U8 : FT_ST_F32, l->n_blocks, &am));
    FT_TRY(need(s, weight, ".quant_map", FT_ST_F32, 16, &qm));
    if (nested) {
        FT_TRY(need(s, weight, ".nested_absmax", FT_ST_F32, l->n_nested, &na));
        FT_TRY(need(s, weight, ".nested_quant_map", FT_ST_F32, 256, &nm));
    }
    /* fp32 arrays copied to aligned memory (safetensors offsets need not be 4-aligned) */
    int64_t nf = nested ? l->n_nested + 256 : l->n_blocks;
    t->owned = malloc((size_t)nf * 4);
    if (!t->owned) return ft_err(-ENOMEM, "%s: out of memory", where);
    t->rows = rows;
    t->cols = cols;
    t->v.codes = w->data;
    t->v.code = ft_nf4_code;
    if (nested) {
        memcpy(t->owned, na->data, (size_t)l->n_nested * 4);
        memcpy(t->owned + l->n_nested, nm->data, 256 * 4);
        t->v.qabsmax = am->data;
        t->v.nested_absmax = t->owned;
        t->v.nested_map = t->owned + l->n_nested;
        t->v.offset = (float)off; /* json.dumps of the fp32 offset's double: exact round trip */
    } else {
        memcpy(t->owned, am->data, (size_t)l->n_blocks * 4);
        t->v.absmax = t->owned;
    }
    return 0;
}

void ft_bnb4_free(ft_bnb4_tensor *t)
{
    if (!t) return;
    free(t->owned);
    t->owned = NULL;
}

int ft_bnb4_dequant(const ft_st_set *s, const char *weight, int64_t rows, int64_t cols, float *dst)
{
    ft_bnb4_tensor t;
    FT_TRY(ft_bnb4_open(s, weight, rows, cols, &t));
    int rc = ft_nf4_dequant(&t.v, dst);
    ft_bnb4_free(&t);
    return rc;
}
