/* resident.c - where the base weights live on a device backend (exec.h): a copy of the
 * model's weights made once at setup (projections in bf16 where the backend takes bf16, the
 * rest in fp32), or, for a packed base (QLoRA), every layer's pack block resident in device
 * memory with its NF4 projections dequantized to bf16 into one staging buffer per layer
 * visit. On a host-memory backend (CPU) the model's own arrays are used in place. */
#include <stdlib.h>
#include <string.h>

#include "offload/exec_internal.h"
#include "src/core/err.h"

/* bf16 for the projections when the backend takes it and its memory is not the host's (a
 * device copy is being made anyway: half the bytes, twice the tensor-core rate); fp32 else. */
static int proj_wtype(const ft_backend *be)
{
    return !be->ops->host_memory && (be->ops->weight_types & FT_WTYPE_BIT(FT_W_BF16)) ? FT_W_BF16
                                                                                         : FT_W_F32;
}

static size_t floats_for(int64_t n, int wtype)
{
    int64_t f = wtype == FT_W_BF16 ? (n + 1) / 2 : n;
    return (size_t)((f + 15) & ~(int64_t)15);
}

/* Bytes of the global tensors (embeddings, LM head when untied, final norm) in fp32. */
static size_t global_bytes(const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    size_t n = floats_for(c->vocab_size * c->hidden_size, FT_W_F32) * (m->lm_head != m->embed ? 2 : 1) +
               floats_for(c->hidden_size, FT_W_F32);
    return (n + 64) * sizeof(float);
}

size_t ft_exec_weight_bytes(const ft_backend *be, const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    int wt = proj_wtype(be);
    size_t n = global_bytes(m) / sizeof(float);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const ft_layer_weights *w = &m->layers[l];
        n += 2 * floats_for(c->hidden_size, FT_W_F32);
        for (int p = 0; p < FT_N_PROJ; p++)
            n += floats_for(w->proj[p].out_n * w->proj[p].in_n, wt) +
                 (w->proj[p].b ? floats_for(w->proj[p].out_n, FT_W_F32) : 0);
    }
    return (n + 64) * sizeof(float);
}

/* fp32 -> bf16, round to nearest even (NaN kept quiet). */
static void to_bf16_host(uint16_t *dst, const float *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            dst[i] = (uint16_t)((u >> 16) | 0x40);
        else
            dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
}

int ft_exec_place_weights(ft_exec *e, int with_layers)
{
    ft_backend *be = e->be;
    const ft_model *m = e->m;
    const ft_model_config *c = &m->cfg;
    if (be->ops->host_memory) {
        e->layers = m->layers;
        e->embed = m->embed;
        e->final_norm = m->final_norm;
        e->lm_head = m->lm_head;
        return 0;
    }
    int wt = proj_wtype(be);
    if (!e->layers) e->layers = calloc((size_t)c->num_hidden_layers, sizeof *e->layers);
    e->weights_bytes = with_layers ? ft_exec_weight_bytes(be, m) : global_bytes(m);
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
    uint16_t *stage = wt == FT_W_BF16 ? malloc((size_t)biggest * sizeof(uint16_t)) : NULL;
    if (wt == FT_W_BF16 && !stage)
        return ft_err(-ENOMEM, "out of memory converting weights to bf16 (%lld values)", (long long)biggest);
    float *p = e->weights;
    int64_t VC = c->vocab_size * c->hidden_size;
    int rc = 0;
#define PUT(dst, src, n) do { float *d_ = ft_exec_carve(&p, (n)); \
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
        for (int q = 0; q < FT_N_PROJ && !rc; q++) {
            const ft_linear *s = &src->proj[q];
            int64_t n = s->out_n * s->in_n;
            if (wt == FT_W_BF16) {
                float *d = ft_exec_carve(&p, (int64_t)floats_for(n, FT_W_BF16));
                to_bf16_host(stage, s->w, n);
                rc = be->ops->copy(be, d, stage, (size_t)n * sizeof(uint16_t));
                dst->proj[q].w = d;
                dst->proj[q].wtype = FT_W_BF16;
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


/* ---- a pack resident in device memory (QLoRA on a GPU) ------------------------------------ */

static int64_t staging_floats(const ft_model *m)
{
    int64_t n = 0;
    for (int k = 0; k < FT_N_PROJ; k++)
        n += (m->layers[0].proj[k].out_n * m->layers[0].proj[k].in_n + 1) / 2 + 16;
    return n;
}

size_t ft_exec_packed_weight_bytes(const ft_backend *be, const ft_model *m, const ft_pack_file *pack)
{
    (void)be;
    size_t total = global_bytes(m) + (size_t)staging_floats(m) * sizeof(float);
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) total += ft_pack_block_bytes(pack, l);
    return total;
}

int ft_exec_pack_to_device(ft_exec *e, ft_pack_file *pack)
{
    ft_backend *be = e->be;
    const ft_model_config *c = ft_pack_config(pack);
    int64_t L = c->num_hidden_layers;
    if (!be->ops->dequant_nf4 || !(be->ops->weight_types & FT_WTYPE_BIT(FT_W_BF16)))
        return ft_err(FT_E_UNSUPPORTED, "%s: the %s backend cannot compute from a packed base",
                      ft_pack_path(pack), be->ops->name);
    /* every block, back to back, 4096-aligned as in the file */
    size_t total = 0, raw = ft_pack_max_layer_bytes(pack);
    for (int64_t l = 0; l < L; l++) total += ft_pack_block_bytes(pack, l);
    int64_t stage_floats = staging_floats(e->m); /* one layer's projections in bf16 */
    void *host = NULL;
    if (posix_memalign(&host, FT_PACK_ALIGN, raw)) host = NULL;
    e->pack_dev_off = calloc((size_t)L, sizeof *e->pack_dev_off);
    e->pack_dir = calloc((size_t)L, sizeof *e->pack_dir);
    e->pack_dir_n = calloc((size_t)L, sizeof *e->pack_dir_n);
    int rc = host && e->pack_dev_off && e->pack_dir && e->pack_dir_n
                 ? 0 : ft_err(-ENOMEM, "out of host memory loading the pack %s", ft_pack_path(pack));
    if (!rc && e->weights_with_layers) {
        /* a full copy of the layers (ft_exec_init) goes: only the global tensors stay */
        be->ops->free(be, e->weights);
        e->weights = NULL;
        rc = ft_exec_place_weights(e, 0);
    }
    if (!rc) {
        e->pack_dev = be->ops->alloc(be, total);
        e->layer_f32 = be->ops->alloc(be, (size_t)stage_floats * sizeof(float));
        if (!e->pack_dev || !e->layer_f32)
            rc = ft_err(-ENOMEM, "out of %s memory for the packed base: %.2f GiB of layer blocks "
                        "and %.1f MiB of bf16 staging", be->ops->name, total / 1073741824.0,
                        stage_floats * 4.0 / 1048576.0);
    }
    size_t off = 0;
    for (int64_t l = 0; l < L && !rc; l++) {
        size_t nb = ft_pack_block_bytes(pack, l);
        const ft_pack_tensor *dir;
        int64_t n;
        rc = ft_pack_read_block(pack, l, host, raw, 1);
        if (!rc) rc = ft_pack_block_dir(pack, l, host, &dir, &n);
        if (!rc) rc = be->ops->copy(be, e->pack_dev + off, host, nb);
        if (!rc) {
            e->pack_dir[l] = malloc((size_t)n * sizeof *dir);
            if (!e->pack_dir[l]) rc = ft_err(-ENOMEM, "out of host memory loading the pack");
            else memcpy(e->pack_dir[l], dir, (size_t)n * sizeof *dir);
        }
        e->pack_dir_n[l] = n;
        e->pack_dev_off[l] = (int64_t)off;
        e->pack_reads++;
        off += nb;
    }
    free(host);
    if (rc) return rc;
    e->pack = pack;
    e->pack_dev_bytes = total;
    e->fetched_layer = -1;
    return 0;
}

/* Layer l from the resident blocks: F32 norms and biases and BF16 projections are used in
 * place; NF4 projections are dequantized into the staging buffer (kept when the same layer
 * is fetched again right away: the last of the forward is the first of the backward). */
int ft_exec_fetch_device(ft_exec *e, int64_t l, const ft_layer_weights **w)
{
    ft_backend *be = e->be;
    *w = &e->fetched;
    if (e->fetched_layer == l) return 0;
    e->fetched_layer = -1;
    const ft_pack_tensor *dir = e->pack_dir[l];
    const uint8_t *blk = e->pack_dev + e->pack_dev_off[l];
    ft_layer_weights *f = &e->fetched;
    memset(f, 0, sizeof *f);
    for (int k = 0; k < FT_N_PROJ; k++) { /* shapes from the model; pointers from the block */
        f->proj[k].out_n = e->m->layers[l].proj[k].out_n;
        f->proj[k].in_n = e->m->layers[l].proj[k].in_n;
    }
    float *stage = e->layer_f32;
    for (int64_t i = 0; i < e->pack_dir_n[l]; i++) {
        const ft_pack_tensor *r = &dir[i];
        const void *data = blk + r->data_off;
        if (r->role == FT_PACK_ROLE_ATTN_NORM || r->role == FT_PACK_ROLE_FFN_NORM ||
            r->role >= FT_PACK_ROLE_B0) {
            if (r->dtype != FT_PACK_DT_F32)
                return ft_err(FT_E_CORRUPT, "%s: layer %lld: tensor role %u is not F32",
                              ft_pack_path(e->pack), (long long)l, r->role);
            float *p = (float *)data;
            if (r->role == FT_PACK_ROLE_ATTN_NORM) f->attn_norm = p;
            else if (r->role == FT_PACK_ROLE_FFN_NORM) f->ffn_norm = p;
            else f->proj[r->role - FT_PACK_ROLE_B0].b = p;
            continue;
        }
        ft_linear *li = &f->proj[r->role - FT_PACK_ROLE_W0];
        li->wtype = FT_W_BF16;
        if (r->dtype == FT_PACK_DT_BF16) {
            li->w = (float *)data;
            continue;
        }
        if (r->dtype != FT_PACK_DT_NF4)
            return ft_err(FT_E_CORRUPT, "%s: layer %lld: projection of dtype %u", ft_pack_path(e->pack),
                          (long long)l, r->dtype);
        ft_nf4_tensor t = {r->rows * r->cols, r->blocksize, r->nested_blocksize, blk + r->data_off,
                           r->nested_blocksize ? blk + r->absmax_off : NULL,
                           r->nested_blocksize ? NULL : (const float *)(blk + r->absmax_off),
                           r->nested_blocksize ? (const float *)(blk + r->nested_off) : NULL,
                           r->nested_blocksize ? (const float *)(blk + r->map_off) : NULL,
                           (const float *)(blk + r->code_off), r->offset};
        FT_TRY(be->ops->dequant_nf4(be, (uint16_t *)stage, &t));
        if (r->rows != li->out_n || r->cols != li->in_n)
            return ft_err(FT_E_CORRUPT, "%s: layer %lld: %s is %lld x %lld, the model's is %lld x %lld",
                          ft_pack_path(e->pack), (long long)l, ft_proj_name[r->role - FT_PACK_ROLE_W0],
                          (long long)r->rows, (long long)r->cols, (long long)li->out_n, (long long)li->in_n);
        FT_TRY(be->ops->dequant_nf4(be, (uint16_t *)stage, &t));
        li->w = stage;
        stage += (t.n + 1) / 2 + 16 - ((t.n + 1) / 2) % 16;
    }
    int complete = f->attn_norm && f->ffn_norm;
    for (int k = 0; k < FT_N_PROJ; k++)
        complete &= f->proj[k].w != NULL && (!e->m->layers[l].proj[k].b || f->proj[k].b);
    if (!complete)
        return ft_err(FT_E_CORRUPT, "%s: layer %lld: the block lacks a norm, projection or bias",
                      ft_pack_path(e->pack), (long long)l);
    e->fetched_layer = l;
    return 0;
}
