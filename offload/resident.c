/* resident.c - where the base weights live on a device backend (exec.h): a copy of the
 * model's weights made once at setup (projections in bf16 where the backend takes bf16, the
 * rest in fp32), or, for a packed base (QLoRA), every layer's pack block resident in device
 * memory with its NF4 projections dequantized to bf16 into one staging buffer per layer
 * visit. On a host-memory backend (CPU) the model's own arrays are used in place. */
#include <stdlib.h>
#include <string.h>

#include "offload/exec_internal.h"
#include "offload/pack_internal.h"
#include "src/core/err.h"
#include "src/numeric/quant.h"

/* bf16 for the projections when the backend takes it and its memory is not the host's (a
 * device copy is being made anyway: half the bytes, twice the tensor-core rate); fp32 else. */
static int proj_wtype(const ft_backend *be)
{
    return !be->ops->host_memory && (be->ops->weight_types & FT_WTYPE_BIT(FT_WTYPE_BF16)) ? FT_WTYPE_BF16
                                                                                         : FT_WTYPE_F32;
}

static size_t floats_for(int64_t n, int wtype)
{
    int64_t f = wtype == FT_WTYPE_BF16 ? (n + 1) / 2 : n;
    return (size_t)ft_pad16(f);
}

/* Bytes of the global tensors (embeddings, LM head when untied, final norm) in fp32. */
size_t ft_exec_global_bytes(const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    size_t n = floats_for(c->vocab_size * c->hidden_size, FT_WTYPE_F32) * (ft_exec_untied(m) ? 2 : 1) +
               floats_for(c->hidden_size, FT_WTYPE_F32);
    return (n + 64) * sizeof(float);
}

size_t ft_exec_weight_bytes(const ft_backend *be, const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    int wt = proj_wtype(be);
    size_t n = ft_exec_global_bytes(m) / sizeof(float);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const ft_layer_weights *w = &m->layers[l];
        n += 2 * floats_for(c->hidden_size, FT_WTYPE_F32);
        /* by the config as well as the pointers: a deferred or pack-only model has none */
        if (w->q_norm || c->qk_norm) n += 2 * floats_for(c->head_dim, FT_WTYPE_F32);
        for (int p = 0; p < FT_N_PROJ; p++)
            n += floats_for(w->proj[p].out_n * w->proj[p].in_n, wt) +
                 (w->proj[p].b || ft_pack_has_bias(c, p) ? floats_for(w->proj[p].out_n, FT_WTYPE_F32) : 0);
    }
    return (n + 64) * sizeof(float);
}

int ft_exec_place_weights(ft_exec *e, int with_layers)
{
    ft_backend *be = e->be;
    const ft_model *m = e->m;
    const ft_model_config *c = &m->cfg;
    if (!e->on_device) {
        e->layers = m->layers;
        e->embed = m->embed;
        e->final_norm = m->final_norm;
        e->lm_head = m->lm_head;
        return 0;
    }
    if (!m->embed) { /* a pack-only model: the globals come with the pack (tiers.c) */
        if (with_layers)
            return ft_err(FT_E_INVALID, "%s: a pack-only model has no layer weights to copy",
                          m->path);
        e->layers = calloc((size_t)c->num_hidden_layers, sizeof *e->layers);
        return e->layers ? 0 : ft_err(-ENOMEM, "out of memory");
    }
    int wt = proj_wtype(be);
    if (!e->layers) e->layers = calloc((size_t)c->num_hidden_layers, sizeof *e->layers);
    e->weights_bytes = with_layers ? ft_exec_weight_bytes(be, m) : ft_exec_global_bytes(m);
    e->weights_with_layers = with_layers;
    e->weights = e->layers ? be->ops->alloc(be, e->weights_bytes) : NULL;
    if (!e->weights)
        return ft_err(-ENOMEM, "out of memory: the base weights need %.1f GiB of %s memory",
                      e->weights_bytes / 1073741824.0, be->ops->name);
    int64_t biggest = 0;
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        for (int q = 0; q < FT_N_PROJ; q++) {
            int64_t n = m->layers[l].proj[q].out_n * m->layers[l].proj[q].in_n;
            biggest = n > biggest ? n : biggest;
        }
    uint16_t *stage = wt == FT_WTYPE_BF16 ? malloc((size_t)biggest * sizeof(uint16_t)) : NULL;
    if (wt == FT_WTYPE_BF16 && !stage)
        return ft_err(-ENOMEM, "out of memory converting weights to bf16 (%lld values)", (long long)biggest);
    float *p = e->weights;
    int64_t VC = c->vocab_size * c->hidden_size;
    int rc = 0;
#define PUT(dst, src, n) do { float *d_ = ft_carve16(&p, (n)); \
        if (!rc) { rc = be->ops->copy(be, d_, (src), (size_t)(n) * sizeof(float)); } \
        (dst) = d_; } while (0)
    PUT(e->embed, m->embed, VC);
    if (m->lm_head == m->embed)
        e->lm_head = e->embed;
    else
        PUT(e->lm_head, m->lm_head, VC);
    PUT(e->final_norm, m->final_norm, c->hidden_size);
    for (int64_t l = 0; l < c->num_hidden_layers && !rc && with_layers; l++) {
        const ft_layer_weights *src = &m->layers[l];
        ft_layer_weights *dst = &e->layers[l];
        *dst = *src;
        PUT(dst->attn_norm, src->attn_norm, c->hidden_size);
        PUT(dst->ffn_norm, src->ffn_norm, c->hidden_size);
        if (src->q_norm) {
            PUT(dst->q_norm, src->q_norm, c->head_dim);
            PUT(dst->k_norm, src->k_norm, c->head_dim);
        }
        for (int q = 0; q < FT_N_PROJ && !rc; q++) {
            const ft_linear *s = &src->proj[q];
            int64_t n = s->out_n * s->in_n;
            if (wt == FT_WTYPE_BF16) {
                float *d = ft_carve16(&p, (int64_t)floats_for(n, FT_WTYPE_BF16));
                ft_quant_f32_to_bf16_n(stage, s->w, n);
                rc = be->ops->copy(be, d, stage, (size_t)n * sizeof(uint16_t));
                dst->proj[q].w = d;
                dst->proj[q].wtype = FT_WTYPE_BF16;
            } else {
                PUT(dst->proj[q].w, s->w, n);
            }
            if (s->b) PUT(dst->proj[q].b, s->b, s->out_n);
        }
    }
#undef PUT
    free(stage);
    return rc;
}
