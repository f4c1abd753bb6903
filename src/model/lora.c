/* lora.c - LoRA parameter allocation and PEFT-compatible initialisation (see lora.h). */
#include "src/model/lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/rng.h"

static int64_t lin_in(const ft_model *m, int p)
{
    return m->layers[0].proj[p].in_n;
}

static int64_t lin_out(const ft_model *m, int p)
{
    return m->layers[0].proj[p].out_n;
}

float ft_lora_scale(const ft_lora_cfg *c)
{
    return c->use_rslora ? c->alpha / sqrtf((float)c->r) : c->alpha / (float)c->r;
}

size_t ft_lora_bytes(const ft_model *m, const ft_lora_cfg *cfg, int fixed)
{
    int64_t per_layer = 0; /* ft_lora_init's count */
    for (int p = 0; p < FT_N_PROJ; p++)
        if (cfg->targets & (1u << p)) per_layer += cfg->r * (lin_in(m, p) + lin_out(m, p));
    return (size_t)(per_layer * m->cfg.num_hidden_layers) * sizeof(float) * (fixed ? 5 : 4);
}

int ft_lora_init(ft_lora *l, const ft_model *m, const ft_lora_cfg *cfg, ft_backend *be)
{
    memset(l, 0, sizeof *l);
    if (cfg->r < 1 || cfg->r > 4096)
        return ft_err(FT_E_INVALID, "lora rank r=%lld out of range (1..4096)", (long long)cfg->r);
    if (!(cfg->targets & FT_LORA_ALL_TARGETS))
        return ft_err(FT_E_INVALID, "no LoRA target modules selected");
    if (!(cfg->dropout >= 0 && cfg->dropout < 1)) /* NaN too */
        return ft_err(FT_E_INVALID, "lora dropout %g out of range [0, 1)", cfg->dropout);
    l->cfg = *cfg;
    l->be = be;
    l->n_layers = m->cfg.num_hidden_layers;
    l->scale = ft_lora_scale(cfg);
    int64_t per_layer = 0;
    for (int p = 0; p < FT_N_PROJ; p++)
        if (cfg->targets & (1u << p))
            per_layer += cfg->r * (lin_in(m, p) + lin_out(m, p));
    l->n_params = per_layer * l->n_layers;
    size_t bytes = (size_t)l->n_params * sizeof(float);
    l->lin = calloc((size_t)l->n_layers, sizeof *l->lin);
    l->host = malloc(bytes);
    l->params = be->ops->alloc(be, bytes);
    l->grads = be->ops->alloc(be, bytes);
    l->m = be->ops->alloc(be, bytes);
    l->v = be->ops->alloc(be, bytes);
    if (!l->lin || !l->host || !l->params || !l->grads || !l->m || !l->v) {
        ft_lora_free(l);
        return ft_err(-ENOMEM, "out of memory allocating %lld LoRA parameters", (long long)l->n_params);
    }
    int64_t off = 0;
    for (int64_t i = 0; i < l->n_layers; i++) {
        for (int p = 0; p < FT_N_PROJ; p++) {
            if (!(cfg->targets & (1u << p))) continue;
            ft_lora_linear *ll = &l->lin[i][p];
            ll->in_n = m->layers[i].proj[p].in_n;
            ll->out_n = m->layers[i].proj[p].out_n;
            ll->A = l->params + off;
            ll->dA = l->grads + off;
            off += cfg->r * ll->in_n;
            ll->B = l->params + off;
            ll->dB = l->grads + off;
            off += cfg->r * ll->out_n;
        }
    }
    /* Host init, then one copy: A uniform in +-1/sqrt(in), B zero. The stream of random
     * numbers is consumed in layer, projection, row-major element order. */
    ft_rng rng;
    ft_rng_seed(&rng, cfg->seed ^ 0x4c6f5241ull /* "LoRA" */);
    off = 0;
    for (int64_t i = 0; i < l->n_layers; i++) {
        for (int p = 0; p < FT_N_PROJ; p++) {
            if (!(cfg->targets & (1u << p))) continue;
            const ft_lora_linear *ll = &l->lin[i][p];
            float bound = 1.0f / sqrtf((float)ll->in_n);
            for (int64_t j = 0; j < cfg->r * ll->in_n; j++)
                l->host[off + j] = (2.0f * ft_rng_uniform(&rng) - 1.0f) * bound;
            off += cfg->r * ll->in_n;
            memset(l->host + off, 0, (size_t)(cfg->r * ll->out_n) * sizeof(float));
            off += cfg->r * ll->out_n;
        }
    }
    FT_TRY(ft_lora_push(l));
    FT_TRY(be->ops->zero(be, l->grads, bytes));
    FT_TRY(be->ops->zero(be, l->m, bytes));
    FT_TRY(be->ops->zero(be, l->v, bytes));
    return 0;
}

void ft_lora_free(ft_lora *l)
{
    if (!l) return;
    if (l->be) {
        l->be->ops->free(l->be, l->params);
        l->be->ops->free(l->be, l->grads);
        l->be->ops->free(l->be, l->m);
        l->be->ops->free(l->be, l->v);
        l->be->ops->free(l->be, l->fixed);
    }
    free(l->lin);
    free(l->host);
    memset(l, 0, sizeof *l);
}

int ft_lora_set_fixed(ft_lora *l, const float *host)
{
    size_t bytes = (size_t)l->n_params * sizeof(float);
    if (!l->fixed && !(l->fixed = l->be->ops->alloc(l->be, bytes)))
        return ft_err(-ENOMEM, "out of memory for the base correction (%zu bytes)", bytes);
    FT_TRY(l->be->ops->copy(l->be, l->fixed, host, bytes));
    for (int64_t i = 0; i < l->n_layers; i++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            ll->A0 = l->fixed + (ll->A - l->params);
            ll->B0 = l->fixed + (ll->B - l->params);
        }
    return 0;
}

int64_t ft_lora_slices(const ft_lora *l, ft_lora_slice *out, int64_t cap)
{
    int64_t k = 0;
    for (int64_t i = 0; i < l->n_layers; i++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l->lin[i][p];
            if (!ll->A) continue;
            const ft_lora_slice s[2] = {{ll->A - l->params, l->cfg.r * ll->in_n, FT_LORA_GROUP_A},
                                        {ll->B - l->params, ll->out_n * l->cfg.r, FT_LORA_GROUP_B}};
            for (int g = 0; g < 2; g++, k++)
                if (k < cap) out[k] = s[g];
        }
    return k;
}

int ft_lora_pull(ft_lora *l)
{
    return l->be->ops->copy(l->be, l->host, l->params, (size_t)l->n_params * sizeof(float));
}

int ft_lora_push(ft_lora *l)
{
    return l->be->ops->copy(l->be, l->params, l->host, (size_t)l->n_params * sizeof(float));
}

int ft_lora_parse_targets(const char *s, unsigned *mask)
{
    *mask = 0;
    if (!strcmp(s, "all") || !strcmp(s, "all-linear")) {
        *mask = FT_LORA_ALL_TARGETS;
        return 0;
    }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int j = 0; j < FT_N_PROJ; j++) {
            size_t k = strlen(ft_proj_name[j]);
            /* accept "q_proj" and the short form "q" */
            if ((n == k && !strncmp(p, ft_proj_name[j], n)) ||
                (n == k - 5 && !strncmp(p, ft_proj_name[j], n)))
                found = j;
        }
        if (found < 0)
            return ft_err(FT_E_INVALID, "unknown LoRA target module '%.*s' (expected q_proj, k_proj, "
                          "v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)", (int)n, p);
        *mask |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!*mask) return ft_err(FT_E_INVALID, "empty LoRA target list");
    return 0;
}
