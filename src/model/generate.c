/* generate.c - KV-cache inference, generation prompts and streaming detokenization (see
 * generate.h). */
#include "src/model/generate.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/data/chat.h"
#include "src/data/dataset.h"

#define GEN_MAX_HALF_D 1024 /* head_dim / 2 bound of the inv_freq staging array */

/* ---- plan ------------------------------------------------------------------------------- */

/* Floats of every region, in carving order (each rounded up to 16 floats = 64 bytes). */
typedef struct gen_layout {
    int64_t kv, x, y, xn, rstd, q, att, lse, h, gate, up, act, u, logits, inv, ints, xd, kt;
} gen_layout;

static int64_t up16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* xd (linear_fwd's scratch) only with a source: the model's own weights are fp32 */
static gen_layout plan(const ft_model *m, const ft_lora *lora, int64_t ctx, int64_t chunk,
                       int64_t rows, int64_t slots, int with_xd)
{
    const ft_model_config *c = &m->cfg;
    const int64_t C = c->hidden_size, HD = c->num_attention_heads * c->head_dim;
    const int64_t KD = c->num_key_value_heads * c->head_dim;
    gen_layout L;
    L.kv = slots * c->num_hidden_layers * ctx * KD;
    L.x = L.y = L.xn = L.h = chunk * C;
    L.rstd = chunk;
    L.q = L.att = chunk * HD;
    L.lse = chunk * c->num_attention_heads;
    L.gate = L.up = L.act = chunk * c->intermediate_size;
    L.u = chunk * (lora ? lora->cfg.r : 1);
    L.logits = rows * c->vocab_size;
    L.inv = slots * up16(c->head_dim / 2 + 1); /* one RoPE table per slot */
    L.ints = 3 * chunk; /* ids, pos, seq_start: int32 in float-sized slots */
    int64_t wide = C > HD ? C : HD;
    if (c->intermediate_size > wide) wide = c->intermediate_size;
    L.xd = with_xd ? chunk * wide : 0;
    L.kt = slots > 1 ? 2 * chunk * KD : 0; /* a batched decode's new k and v rows */
    return L;
}

static int64_t plan_floats(const gen_layout *L)
{
    return 2 * up16(L->kv) + up16(L->x) + up16(L->y) + up16(L->xn) + up16(L->rstd) +
           up16(L->q) + up16(L->att) + up16(L->lse) + up16(L->h) + up16(L->gate) +
           up16(L->up) + up16(L->act) + up16(L->u) + up16(L->logits) + up16(L->inv) +
           up16(L->ints) + up16(L->xd) + up16(L->kt);
}

/* 1 when the sizes are out of range (gen_init's checks, without messages). */
static int bad_sizes(const ft_model_config *c, int64_t ctx_max, int64_t chunk_max,
                     int64_t logit_rows_max, int64_t n_slots)
{
    return ctx_max < 1 || chunk_max < 1 || logit_rows_max < 1 || chunk_max > ctx_max ||
           logit_rows_max > chunk_max || n_slots < 1 || n_slots > FT_GEN_MAX_SLOTS ||
           (double)n_slots * (double)ctx_max * (double)c->num_hidden_layers *
                   (double)c->num_key_value_heads * (double)c->head_dim > 1e15 ||
           (double)logit_rows_max * (double)c->vocab_size > 1e15;
}

size_t ft_gen_source_bytes(const ft_model *m, const ft_lora *lora, int64_t ctx_max,
                           int64_t chunk_max, int64_t logit_rows_max, int64_t n_slots)
{
    if (bad_sizes(&m->cfg, ctx_max, chunk_max, logit_rows_max, n_slots)) return 0;
    gen_layout L = plan(m, lora, ctx_max, chunk_max, logit_rows_max, n_slots, 1);
    return (size_t)plan_floats(&L) * sizeof(float);
}

static float *carve(float **p, int64_t n)
{
    float *r = *p;
    *p += up16(n);
    return r;
}

static int place_weights(ft_gen *g);

/* Slot s's RoPE table (head_dim / 2 floats, backend memory). */
static float *inv_of(const ft_gen *g, int64_t s)
{
    return g->inv_freq + s * up16(g->m->cfg.head_dim / 2 + 1);
}

static int gen_init(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                    const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                    int64_t logit_rows_max, int64_t n_slots)
{
    memset(g, 0, sizeof *g);
    if (!be || !m) return ft_err(FT_E_INVALID, "generate: no backend or model");
    if (src && (!src->layer || !src->final_norm || !src->lm_head || (!src->embed && !src->embed_rows)))
        return ft_err(FT_E_INVALID, "generate: the weight source lacks its layers, final norm, "
                      "LM head or embeddings");
    if (ctx_max < 1 || chunk_max < 1 || logit_rows_max < 1 || chunk_max > ctx_max ||
        logit_rows_max > chunk_max)
        return ft_err(FT_E_INVALID,
                      "generate: sizes context %lld, chunk %lld, logit rows %lld; expected "
                      "1 <= logit rows <= chunk <= context",
                      (long long)ctx_max, (long long)chunk_max, (long long)logit_rows_max);
    if (n_slots < 1 || n_slots > FT_GEN_MAX_SLOTS)
        return ft_err(FT_E_INVALID, "generate: %lld sequences at once, expected 1..%d",
                      (long long)n_slots, FT_GEN_MAX_SLOTS);
    const ft_model_config *c = &m->cfg;
    if (c->head_dim / 2 > GEN_MAX_HALF_D)
        return ft_err(FT_E_UNSUPPORTED, "generate: head_dim %lld, at most %d supported",
                      (long long)c->head_dim, 2 * GEN_MAX_HALF_D);
    if (lora && lora->n_layers != c->num_hidden_layers)
        return ft_err(FT_E_INVALID, "generate: the adapter has %lld layers, the model %lld",
                      (long long)lora->n_layers, (long long)c->num_hidden_layers);
    /* the largest region must fit int64 floats with room for the sum */
    if (bad_sizes(c, ctx_max, chunk_max, logit_rows_max, n_slots))
        return ft_err(FT_E_RANGE, "generate: a context of %lld tokens x %lld sequences is too large",
                      (long long)ctx_max, (long long)n_slots);
    gen_layout L = plan(m, lora, ctx_max, chunk_max, logit_rows_max, n_slots, src != NULL);
    g->past = calloc((size_t)n_slots, sizeof *g->past);
    if (!g->past) return ft_err(-ENOMEM, "out of memory");
    g->arena_bytes = (size_t)plan_floats(&L) * sizeof(float);
    g->arena = be->ops->alloc(be, g->arena_bytes);
    if (!g->arena) {
        free(g->past);
        g->past = NULL;
        return ft_err(-ENOMEM, "out of memory: generation needs %.1f MiB (KV cache of %lld "
                      "tokens x %lld sequences: %.1f MiB; try fewer --max-new-tokens, a shorter "
                      "prompt or a smaller --batch)",
                      g->arena_bytes / 1048576.0, (long long)ctx_max, (long long)n_slots,
                      2.0 * (double)L.kv * sizeof(float) / 1048576.0);
    }
    g->be = be;
    g->m = m;
    g->lora = lora;
    g->src = src;
    g->ctx_max = ctx_max;
    g->chunk_max = chunk_max;
    g->logit_rows_max = logit_rows_max;
    g->n_slots = n_slots;
    float *p = g->arena;
    g->kc = carve(&p, L.kv);
    g->vc = carve(&p, L.kv);
    g->x = carve(&p, L.x);
    g->y = carve(&p, L.y);
    g->xn = carve(&p, L.xn);
    g->rstd = carve(&p, L.rstd);
    g->q = carve(&p, L.q);
    g->att = carve(&p, L.att);
    g->lse = carve(&p, L.lse);
    g->h = carve(&p, L.h);
    g->gate = carve(&p, L.gate);
    g->up = carve(&p, L.up);
    g->act = carve(&p, L.act);
    g->u = carve(&p, L.u);
    g->logits = carve(&p, L.logits);
    g->inv_freq = carve(&p, L.inv);
    int32_t *ip = (int32_t *)carve(&p, L.ints);
    g->ids = ip;
    g->pos = ip + chunk_max;
    g->seq_start = ip + 2 * chunk_max;
    g->xd = src ? carve(&p, L.xd) : NULL;
    g->kt = n_slots > 1 ? carve(&p, L.kt) : NULL;

    int rc = place_weights(g);
    if (!rc) rc = be->ops->zero(be, g->seq_start, (size_t)chunk_max * sizeof(int32_t));
    float inv[GEN_MAX_HALF_D];
    ft_rope_inv_freq(c, ctx_max, inv);
    for (int64_t s = 0; !rc && s < n_slots; s++)
        rc = be->ops->copy(be, inv_of(g, s), inv, (size_t)(c->head_dim / 2) * sizeof(float));
    if (rc) ft_gen_free(g);
    return rc;
}

int ft_gen_init(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                int64_t ctx_max, int64_t chunk_max, int64_t logit_rows_max)
{
    return gen_init(g, be, m, lora, NULL, ctx_max, chunk_max, logit_rows_max, 1);
}

int ft_gen_init_source(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                       const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                       int64_t logit_rows_max)
{
    if (!src) return ft_err(FT_E_INVALID, "generate: no weight source");
    return gen_init(g, be, m, lora, src, ctx_max, chunk_max, logit_rows_max, 1);
}

int ft_gen_init_slots(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                      const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                      int64_t logit_rows_max, int64_t n_slots)
{
    return gen_init(g, be, m, lora, src, ctx_max, chunk_max, logit_rows_max, n_slots);
}

/* The weights where the backend reads them (see ft_gen): the source's, or the model's host
 * arrays in place. */
static int place_weights(ft_gen *g)
{
    const ft_model *m = g->m;
    if (g->src) { /* the layers are fetched per visit (block) */
        g->embed = g->src->embed;
        g->final_norm = g->src->final_norm;
        g->lm_head = g->src->lm_head;
        return 0;
    }
    if (!m->embed || !m->layers)
        return ft_err(FT_E_UNSUPPORTED, "%s: generate needs the model's weights (a pack-only model "
                      "has none outside its pack: generate reads it with --quant nf4, or bf16 "
                      "for a bf16 pack)", m->path);
    if (!g->be->ops->host_memory)
        return ft_err(FT_E_UNSUPPORTED, "generate: on %s the weights are read through an executor "
                      "(ft_gen_init_source, offload/exec.h ft_exec_gen_source)", g->be->ops->name);
    g->layers = m->layers;
    g->embed = m->embed;
    g->final_norm = m->final_norm;
    g->lm_head = m->lm_head;
    return 0;
}

void ft_gen_free(ft_gen *g)
{
    if (!g) return;
    if (g->be) g->be->ops->free(g->be, g->arena);
    free(g->past);
    memset(g, 0, sizeof *g);
}

void ft_gen_reset(ft_gen *g) { ft_gen_reset_slot(g, 0); }

void ft_gen_reset_slot(ft_gen *g, int64_t slot)
{
    if (!g || !g->past || slot < 0 || slot >= g->n_slots) return;
    g->past[slot] = 0;
    if (slot == 0) g->n_past = 0;
}

int ft_gen_set_rope_len(ft_gen *g, int64_t seq_len) { return ft_gen_set_rope_len_slot(g, 0, seq_len); }

int ft_gen_set_rope_len_slot(ft_gen *g, int64_t slot, int64_t seq_len)
{
    if (!g || !g->arena || slot < 0 || slot >= g->n_slots)
        return ft_err(FT_E_INVALID, "generate: no sequence slot %lld", (long long)slot);
    const ft_model_config *c = &g->m->cfg;
    float inv[GEN_MAX_HALF_D];
    ft_rope_inv_freq(c, seq_len, inv);
    return g->be->ops->copy(g->be, inv_of(g, slot), inv, (size_t)(c->head_dim / 2) * sizeof(float));
}

/* ---- forward ---------------------------------------------------------------------------- */

/* As llama.c: 1/sqrt(D) times the square of RoPE's attention factor (yarn). */
static float attn_scale(const ft_model_config *cfg, int64_t D)
{
    float m = (float)cfg->rope_attention_factor;
    if (!(m > 0)) m = 1.0f;
    return m * m / sqrtf((float)D);
}

/* y (n, out) = x W^T (+ b) + scale * (x A^T) B^T (+ scale * (x A0^T) B0^T, the frozen
 * correction of a quantized base): llama.c lin_fwd without dropout, the same calls in the same
 * order (the adapter first, the frozen GEMM adding into y). fp32 weights go to gemm; the
 * source's bf16/NF4 ones to linear_fwd with g->xd as its scratch. */
static int lin(ft_gen *g, const ft_layer_weights *lw, int64_t layer, int pj, const float *x,
               float *y, int64_t n)
{
    ft_backend *be = g->be;
    const ft_backend_ops *o = be->ops;
    const ft_linear *w = &lw->proj[pj];
    const int64_t in = w->in_n, out = w->out_n;
    const ft_lora *l = g->lora;
    const ft_lora_linear *ll = l && l->lin[layer][pj].A ? &l->lin[layer][pj] : NULL;
    float beta = 0.0f;
    if (ll) {
        const int64_t r = l->cfg.r;
        FT_TRY(o->gemm(be, 0, 1, n, r, in, 1.0f, x, in, ll->A, in, 0.0f, g->u, r));
        FT_TRY(o->gemm(be, 0, 1, n, out, r, l->scale, g->u, r, ll->B, r, 0.0f, y, out));
        beta = 1.0f;
        if (ll->A0) {
            FT_TRY(o->gemm(be, 0, 1, n, r, in, 1.0f, x, in, ll->A0, in, 0.0f, g->u, r));
            FT_TRY(o->gemm(be, 0, 1, n, out, r, l->scale, g->u, r, ll->B0, r, 1.0f, y, out));
        }
    }
    if (w->wtype == FT_W_F32)
        FT_TRY(o->gemm(be, 0, 1, n, out, in, 1.0f, x, in, w->w, in, beta, y, out));
    else
        FT_TRY(o->linear_fwd(be, y, x, w->wtype == FT_W_NF4 ? (const void *)w->nf4 : (const void *)w->w,
                             w->wtype, n, out, in, beta, g->xd));
    if (w->b) FT_TRY(o->bias_add(be, y, w->b, n, out));
    return 0;
}

/* The rows of one forward: either a chunk of n tokens of one sequence (slots NULL: slot
 * `slot`, positions past[slot] + i), or one token of each of n sequences (row i: slot
 * slots[i] at position past[slots[i]]). */
typedef struct gen_rows {
    int64_t slot;
    const int64_t *slots;
} gen_rows;

/* Layer l's K and V cache of slot s: (ctx_max, Hkv, D) each. */
static float *kv_of(const ft_gen *g, float *base, int64_t s, int64_t l)
{
    const ft_model_config *c = &g->m->cfg;
    const int64_t KD = c->num_key_value_heads * c->head_dim;
    return base + ((s * c->num_hidden_layers + l) * g->ctx_max) * KD;
}

static int rope_rows(ft_gen *g, const gen_rows *rw, float *x, int64_t n, int64_t heads)
{
    const ft_model_config *c = &g->m->cfg;
    const ft_backend_ops *o = g->be->ops;
    if (!rw->slots) return o->rope_fwd(g->be, x, g->pos, inv_of(g, rw->slot), n, heads, c->head_dim);
    if (c->rope_type != FT_ROPE_DYNAMIC) /* every slot's table is the same */
        return o->rope_fwd(g->be, x, g->pos, inv_of(g, rw->slots[0]), n, heads, c->head_dim);
    for (int64_t i = 0; i < n; i++) /* dynamic NTK: each sequence's own table */
        FT_TRY(o->rope_fwd(g->be, x + i * heads * c->head_dim, g->pos + i, inv_of(g, rw->slots[i]),
                           1, heads, c->head_dim));
    return 0;
}

/* One decoder block on the forward's n rows: out (n, C) from x (n, C); writes the tokens'
 * k and v into their cache rows. */
static int block(ft_gen *g, int64_t l, const gen_rows *rw, int64_t n, const float *x, float *out)
{
    const ft_layer_weights *w = NULL;
    if (g->src) FT_TRY(g->src->layer(g->src->ctx, l, n, &w));
    else w = &g->layers[l];
    ft_backend *be = g->be;
    const ft_backend_ops *o = be->ops;
    const ft_model_config *c = &g->m->cfg;
    const int64_t C = c->hidden_size, H = c->num_attention_heads, Hkv = c->num_key_value_heads,
                  D = c->head_dim, F = c->intermediate_size, KD = Hkv * D;
    const int64_t p = rw->slots ? 0 : g->past[rw->slot];
    /* the new tokens' k and v: straight into the cache rows of a one-sequence chunk, or
     * staged (kt) and copied into each sequence's cache */
    float *kn, *vn;
    if (rw->slots) {
        kn = g->kt;
        vn = g->kt + n * KD;
    } else {
        kn = kv_of(g, g->kc, rw->slot, l) + p * KD;
        vn = kv_of(g, g->vc, rw->slot, l) + p * KD;
    }

    FT_TRY(o->rmsnorm_fwd(be, g->xn, g->rstd, x, w->attn_norm, n, C, c->rms_norm_eps));
    if (c->qk_norm) {
        /* Qwen3: each head of q and k RMS-normalized before RoPE (llama.c ft_block_fwd); the
         * projections pass through att (free until attention), the 1/rms through lse
         * (n*H floats >= n*Hkv) */
        if (!w->q_norm || !w->k_norm)
            return ft_err(FT_E_INVALID, "generate: layer %lld has no q_norm/k_norm weights",
                          (long long)l);
        FT_TRY(lin(g, w, l, FT_Q, g->xn, g->att, n));
        FT_TRY(o->rmsnorm_fwd(be, g->q, g->lse, g->att, w->q_norm, n * H, D, c->rms_norm_eps));
        FT_TRY(lin(g, w, l, FT_K, g->xn, g->att, n));
        FT_TRY(o->rmsnorm_fwd(be, kn, g->lse, g->att, w->k_norm, n * Hkv, D, c->rms_norm_eps));
    } else {
        FT_TRY(lin(g, w, l, FT_Q, g->xn, g->q, n));
        FT_TRY(lin(g, w, l, FT_K, g->xn, kn, n));
    }
    FT_TRY(lin(g, w, l, FT_V, g->xn, vn, n));
    FT_TRY(rope_rows(g, rw, g->q, n, H));
    FT_TRY(rope_rows(g, rw, kn, n, Hkv));
    const float sc = attn_scale(c, D);
    if (rw->slots) {
        /* each row: its k/v appended to its sequence's cache, then attention over it */
        for (int64_t i = 0; i < n; i++) {
            const int64_t s = rw->slots[i], ps = g->past[s];
            float *kl = kv_of(g, g->kc, s, l), *vl = kv_of(g, g->vc, s, l);
            FT_TRY(o->copy(be, kl + ps * KD, kn + i * KD, (size_t)KD * sizeof(float)));
            FT_TRY(o->copy(be, vl + ps * KD, vn + i * KD, (size_t)KD * sizeof(float)));
            FT_TRY(o->attention_kv_fwd(be, g->att + i * H * D, g->q + i * H * D, kl, vl, ps, 1, H,
                                       Hkv, D, sc));
        }
    } else if (p == 0) { /* an empty cache: the training kernel on one sequence */
        FT_TRY(o->attention_fwd(be, g->att, g->lse, g->q, kn, vn, g->seq_start, n, H, Hkv, D, sc));
    } else {
        FT_TRY(o->attention_kv_fwd(be, g->att, g->q, kv_of(g, g->kc, rw->slot, l),
                                   kv_of(g, g->vc, rw->slot, l), p, n, H, Hkv, D, sc));
    }
    FT_TRY(lin(g, w, l, FT_O, g->att, g->h, n));
    FT_TRY(o->axpy(be, 1.0f, x, g->h, n * C));

    FT_TRY(o->rmsnorm_fwd(be, g->xn, g->rstd, g->h, w->ffn_norm, n, C, c->rms_norm_eps));
    FT_TRY(lin(g, w, l, FT_GATE, g->xn, g->gate, n));
    FT_TRY(lin(g, w, l, FT_UP, g->xn, g->up, n));
    FT_TRY(o->swiglu_fwd(be, g->act, g->gate, g->up, n * F));
    FT_TRY(lin(g, w, l, FT_DOWN, g->act, out, n));
    return o->axpy(be, 1.0f, g->h, out, n * C);
}

static int forward_rows(ft_gen *g, const gen_rows *rw, const int32_t *ids, int64_t n, float *logits,
                        int64_t rows)
{
    ft_backend *be = g->be;
    const ft_backend_ops *o = be->ops;
    const ft_model *m = g->m;
    const ft_model_config *c = &m->cfg;
    const int64_t C = c->hidden_size, V = c->vocab_size;
    int32_t pos[256];
    FT_TRY(o->copy(be, g->ids, ids, (size_t)n * sizeof(int32_t)));
    for (int64_t i0 = 0; i0 < n; i0 += 256) { /* positions, staged through the stack */
        const int64_t k = n - i0 < 256 ? n - i0 : 256;
        for (int64_t i = 0; i < k; i++)
            pos[i] = (int32_t)(rw->slots ? g->past[rw->slots[i0 + i]] : g->past[rw->slot] + i0 + i);
        FT_TRY(o->copy(be, g->pos + i0, pos, (size_t)k * sizeof(int32_t)));
    }
    if (g->embed) FT_TRY(o->embedding_fwd(be, g->x, g->ids, g->embed, n, C, V));
    else FT_TRY(g->src->embed_rows(g->src->ctx, ids, n, g->x));
    float *x = g->x, *y = g->y;
    if (g->src && g->src->begin) FT_TRY(g->src->begin(g->src->ctx));
    int rc = 0;
    for (int64_t l = 0; !rc && l < c->num_hidden_layers; l++) {
        rc = block(g, l, rw, n, x, y);
        float *t = x;
        x = y;
        y = t;
    }
    /* the source's visit ends also after a failed layer (its message kept) */
    if (g->src && g->src->end) {
        char msg[1024];
        if (rc) snprintf(msg, sizeof msg, "%s", ft_errmsg());
        int re = g->src->end(g->src->ctx);
        if (rc) return ft_err(rc, "%s", msg);
        FT_TRY(re);
    }
    FT_TRY(rc);
    FT_TRY(o->rmsnorm_fwd(be, g->xn, g->rstd, x + (n - rows) * C, g->final_norm, rows, C,
                          c->rms_norm_eps));
    FT_TRY(o->lm_head_logits(be, g->logits, g->xn, g->lm_head, rows, C, V));
    return o->copy(be, logits, g->logits, (size_t)(rows * V) * sizeof(float));
}

/* FT_E_INVALID unless every id is in the vocabulary. */
static int check_ids(const ft_gen *g, const int32_t *ids, int64_t n)
{
    const int64_t V = g->m->cfg.vocab_size;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return ft_err(FT_E_INVALID, "generate: token %lld has id %d, expected 0..%lld",
                          (long long)i, ids[i], (long long)V - 1);
    return 0;
}

int ft_gen_forward(ft_gen *g, const int32_t *ids, int64_t n, float *logits, int64_t rows)
{
    return ft_gen_forward_slot(g, 0, ids, n, logits, rows);
}

int ft_gen_forward_slot(ft_gen *g, int64_t slot, const int32_t *ids, int64_t n, float *logits,
                        int64_t rows)
{
    if (!g || !g->arena) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (slot < 0 || slot >= g->n_slots)
        return ft_err(FT_E_RANGE, "generate: sequence slot %lld, expected 0..%lld", (long long)slot,
                      (long long)g->n_slots - 1);
    if (n < 1 || n > g->chunk_max)
        return ft_err(FT_E_RANGE, "generate: %lld tokens in one forward, expected 1..%lld",
                      (long long)n, (long long)g->chunk_max);
    const int64_t rmax = n < g->logit_rows_max ? n : g->logit_rows_max;
    if (rows < 1 || rows > rmax)
        return ft_err(FT_E_RANGE, "generate: %lld logits rows, expected 1..%lld", (long long)rows,
                      (long long)rmax);
    if (g->past[slot] + n > g->ctx_max)
        return ft_err(FT_E_RANGE, "generate: context full: %lld cached + %lld new tokens exceed "
                      "the %lld planned", (long long)g->past[slot], (long long)n,
                      (long long)g->ctx_max);
    if (!ids || !logits) return ft_err(FT_E_INVALID, "generate: NULL ids or logits");
    FT_TRY(check_ids(g, ids, n));
    gen_rows rw = {slot, NULL};
    int rc = forward_rows(g, &rw, ids, n, logits, rows);
    g->past[slot] = rc ? 0 : g->past[slot] + n; /* on a failure the rows are partly written */
    if (slot == 0) g->n_past = g->past[0];
    return rc;
}

int ft_gen_decode(ft_gen *g, const int64_t *slots, const int32_t *ids, int64_t n, float *logits)
{
    if (!g || !g->arena) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (!slots || !ids || !logits) return ft_err(FT_E_INVALID, "generate: NULL slots, ids or logits");
    if (n < 1 || n > g->n_slots || n > g->chunk_max || n > g->logit_rows_max)
        return ft_err(FT_E_RANGE, "generate: %lld sequences in one decode step, expected 1..%lld",
                      (long long)n, (long long)(g->n_slots < g->logit_rows_max ? g->n_slots
                                                                                : g->logit_rows_max));
    if (n > 1 && !g->kt) return ft_err(FT_E_INVALID, "generate: one sequence slot only");
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = slots[i];
        if (s < 0 || s >= g->n_slots)
            return ft_err(FT_E_RANGE, "generate: sequence slot %lld, expected 0..%lld", (long long)s,
                          (long long)g->n_slots - 1);
        for (int64_t j = 0; j < i; j++)
            if (slots[j] == s)
                return ft_err(FT_E_INVALID, "generate: sequence slot %lld twice in one decode step",
                              (long long)s);
        if (g->past[s] < 1)
            return ft_err(FT_E_INVALID, "generate: sequence slot %lld is empty (a decode step "
                          "follows its prompt)", (long long)s);
        if (g->past[s] + 1 > g->ctx_max)
            return ft_err(FT_E_RANGE, "generate: context full: slot %lld holds %lld tokens of the "
                          "%lld planned", (long long)s, (long long)g->past[s], (long long)g->ctx_max);
    }
    FT_TRY(check_ids(g, ids, n));
    if (n == 1) return ft_gen_forward_slot(g, slots[0], ids, 1, logits, 1);
    gen_rows rw = {0, slots};
    int rc = forward_rows(g, &rw, ids, n, logits, n);
    for (int64_t i = 0; i < n; i++) /* on a failure each sequence's rows are partly written */
        g->past[slots[i]] = rc ? 0 : g->past[slots[i]] + 1;
    g->n_past = g->past[0];
    return rc;
}

/* ---- prompt ------------------------------------------------------------------------------ */

/* Renders messages m[0..k) with tools (NULL: none) and its generation prompt (flags:
 * FT_GEN_*) with tmpl (resolved) or the template training takes for them
 * (ft_chat_template_for; *used gets it), and encodes them as training does. */
static int msgs_ids(const ft_tokenizer *tok, int tmpl, const ft_chat_msg *m, int64_t k,
                    const cJSON *tools, int flags, int32_t **ids, int64_t *n, int *used)
{
    ft_chat_ctx ctx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), ft_tok_chat_template(tok),
                       !!(flags & FT_GEN_NO_THINK), tools};
    ft_chat_text t = {0};
    int rc = ft_chat_template_for(tok, tmpl, m, k, &ctx, &tmpl);
    if (used) *used = tmpl;
    if (!rc) rc = ft_chat_render_prompt(&t, tmpl, m, k, &ctx);
    /* chat templates write BOS themselves; the Alpaca prompt relies on the tokenizer's
     * post-processor, as in training (dataset.c) */
    if (!rc) rc = ft_tok_encode(tok, t.text ? t.text : "", t.n, tmpl == FT_CHAT_ALPACA, ids, n);
    ft_chat_text_free(&t);
    return rc;
}

int ft_gen_prompt_ids(const ft_tokenizer *tok, int tmpl, const char *system, const char *prompt,
                      int flags, int32_t **ids, int64_t *n, int *tmpl_out)
{
    *ids = NULL;
    *n = 0;
    if (!tok || !prompt) return ft_err(FT_E_INVALID, "generate: no tokenizer or prompt");
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    if (tmpl_out) *tmpl_out = tmpl;
    if (flags & FT_GEN_RAW) return ft_tok_encode(tok, prompt, strlen(prompt), 1, ids, n);
    ft_chat_msg m[2];
    int64_t k = 0;
    memset(m, 0, sizeof m);
    if (system) m[k++] = (ft_chat_msg){FT_ROLE_SYSTEM, system, strlen(system), NULL, 0, 0};
    m[k++] = (ft_chat_msg){FT_ROLE_USER, prompt, strlen(prompt), NULL, 0, 0};
    return msgs_ids(tok, tmpl, m, k, NULL, flags, ids, n, NULL);
}

/* ---- prompts files ----------------------------------------------------------------------- */

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void ft_gen_req_free(ft_gen_req *q)
{
    if (!q) return;
    for (int64_t i = 0; i < q->n_msgs; i++) {
        free((char *)q->msgs[i].content);
        free((char *)q->msgs[i].input);
        free((char *)q->msgs[i].reasoning);
        cJSON_Delete((cJSON *)q->msgs[i].json);
    }
    free(q->msgs);
    cJSON_Delete(q->tools);
    free(q->user);
    free(q->reference);
    for (int64_t i = 0; i < q->params.n_stop; i++) free(q->params.stop[i]);
    free(q->params.stop);
    memset(q, 0, sizeof *q);
}

/* Appends a message with copies of s[0..n) and in[0..in_n) (in may be NULL). */
static int req_add(ft_gen_req *q, int role, const char *s, size_t n, const char *in, size_t in_n)
{
    ft_chat_msg *p = realloc(q->msgs, (size_t)(q->n_msgs + 1) * sizeof *p);
    if (!p) return ft_err(-ENOMEM, "out of memory");
    q->msgs = p;
    char *c = dup_str(s, n), *d = in ? dup_str(in, in_n) : NULL;
    if (!c || (in && !d)) {
        free(c);
        free(d);
        return ft_err(-ENOMEM, "out of memory");
    }
    q->msgs[q->n_msgs++] = (ft_chat_msg){role, c, n, d, d ? in_n : 0, 0};
    return 0;
}

/* An optional string field: *s NULL when absent or null. */
static int req_opt_str(const cJSON *j, const char *key, const char **s)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *s = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return ft_err(FT_E_INVALID, "'%s' must be a string", key);
    *s = v->valuestring;
    return 0;
}

/* A conversational record (messages, sharegpt, alpaca, conversational prompt/completion),
 * converted as training converts it (ft_data_record_messages): a final assistant turn is the
 * reference; what is left must end with a user or tool turn; the default system message goes
 * first when the record has none. */
static int req_conversation(ft_gen_req *q, const cJSON *rec, const char *system)
{
    ft_data_msgs dm;
    int rc = ft_data_record_messages(rec, FT_DATA_AUTO, 1, &dm);
    int64_t n = dm.n, has_system = 0;
    if (!rc && n && dm.m[n - 1].role == FT_ROLE_ASSISTANT) {
        const ft_chat_msg *a = &dm.m[n - 1];
        /* a tool-call turn without text: its calls are the reply to compare with */
        const cJSON *calls = a->json ? cJSON_GetObjectItemCaseSensitive(a->json, "tool_calls") : NULL;
        if (a->content_n == 0 && calls && !cJSON_IsNull(calls))
            q->reference = cJSON_PrintUnformatted(calls);
        else
            q->reference = dup_str(a->content, a->content_n);
        if (!q->reference) rc = ft_err(-ENOMEM, "out of memory");
        n--;
    }
    if (!rc && (n == 0 || (dm.m[n - 1].role != FT_ROLE_USER && dm.m[n - 1].role != FT_ROLE_TOOL)))
        rc = ft_err(FT_E_INVALID, "the conversation must end with a user turn (or with an "
                    "assistant turn after one, taken as the reference reply)");
    for (int64_t i = 0; !rc && i < n; i++) has_system |= dm.m[i].role == FT_ROLE_SYSTEM;
    if (!rc && system && !has_system) rc = req_add(q, FT_ROLE_SYSTEM, system, strlen(system), NULL, 0);
    for (int64_t i = 0; !rc && i < n; i++) {
        rc = req_add(q, dm.m[i].role, dm.m[i].content, dm.m[i].content_n, dm.m[i].input,
                     dm.m[i].input_n);
        /* the message object as the template sees it (tool_calls, name, tool_call_id...) */
        if (!rc && dm.m[i].json &&
            !(q->msgs[q->n_msgs - 1].json = cJSON_Duplicate(dm.m[i].json, 1)))
            rc = ft_err(-ENOMEM, "out of memory");
        if (!rc && dm.m[i].reasoning) { /* "reasoning_content" (the qwen3 template writes it) */
            char *r = dup_str(dm.m[i].reasoning, dm.m[i].reasoning_n);
            if (!r) rc = ft_err(-ENOMEM, "out of memory");
            q->msgs[q->n_msgs - 1].reasoning = r;
            q->msgs[q->n_msgs - 1].reasoning_n = dm.m[i].reasoning_n;
        }
    }
    /* the text reported as the prompt: the last user turn, with its alpaca input */
    for (int64_t k = n - 1; !rc && k >= 0 && !q->user; k--) {
        const ft_chat_msg *u = &dm.m[k];
        if (u->role != FT_ROLE_USER) continue;
        size_t in_n = u->input ? u->input_n : 0, L = u->content_n + (in_n ? 2 + in_n : 0);
        if (!(q->user = malloc(L + 1))) {
            rc = ft_err(-ENOMEM, "out of memory");
            break;
        }
        memcpy(q->user, u->content, u->content_n);
        if (in_n) {
            memcpy(q->user + u->content_n, "\n\n", 2);
            memcpy(q->user + u->content_n + 2, u->input, in_n);
        }
        q->user[L] = 0;
    }
    if (!rc && !q->user) rc = ft_err(FT_E_INVALID, "the conversation has no user turn");
    ft_data_msgs_free(&dm);
    return rc;
}

/* A prompt string p, from a string record (j NULL) or a {"prompt": p, ...} record j. */
static int req_prompt(ft_gen_req *q, const char *p, const cJSON *j, const char *system, int raw)
{
    const char *sys = NULL, *ref = NULL;
    if (j) {
        FT_TRY(req_opt_str(j, "system", &sys));
        FT_TRY(req_opt_str(j, "completion", &ref));
    }
    if (raw && sys)
        return ft_err(FT_E_INVALID, "with --raw a record has no 'system' (the prompt is encoded as is)");
    if (raw && j && cJSON_GetObjectItemCaseSensitive(j, "tools"))
        return ft_err(FT_E_INVALID, "with --raw a record has no 'tools' (the prompt is encoded as "
                      "is; without --raw the model's template writes them)");
    if (!sys) sys = system; /* as --system: present even when "" */
    if (!raw && sys) FT_TRY(req_add(q, FT_ROLE_SYSTEM, sys, strlen(sys), NULL, 0));
    FT_TRY(req_add(q, FT_ROLE_USER, p, strlen(p), NULL, 0));
    if (!(q->user = dup_str(p, strlen(p)))) return ft_err(-ENOMEM, "out of memory");
    if (ref && !(q->reference = dup_str(ref, strlen(ref)))) return ft_err(-ENOMEM, "out of memory");
    return 0;
}

static const char *json_type(const cJSON *j)
{
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "a list";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsString(j)) return "a string";
    return "another JSON type";
}

/* ---- a record's generation settings ---- */

/* Record key `key`: NULL when absent or null. */
static const cJSON *param_item(const cJSON *rec, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number in [lo, hi] (lo_open: lo excluded), as float (the flags' strtod -> float); finite. */
static int param_float(const cJSON *v, const char *key, double lo, int lo_open, double hi,
                       const char *expect, float *out)
{
    /* beyond float's range the conversion is undefined: taken as not finite */
    const float f = cJSON_IsNumber(v) && fabs(v->valuedouble) <= FLT_MAX ? (float)v->valuedouble : NAN;
    if (!cJSON_IsNumber(v) || !isfinite(f) || f < lo || (lo_open && f == lo) || f > hi) {
        if (cJSON_IsNumber(v))
            return ft_err(FT_E_INVALID, "'%s' %g: expected %s", key, v->valuedouble, expect);
        return ft_err(FT_E_INVALID, "'%s' must be a number, found %s", key, json_type(v));
    }
    *out = f;
    return 0;
}

/* An integer in [lo, hi] (a JSON number without a fraction). */
static int param_int(const cJSON *v, const char *key, int64_t lo, int64_t hi, const char *expect,
                     int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return ft_err(FT_E_INVALID, "'%s' must be an integer, found %s", key, json_type(v));
    const double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return ft_err(FT_E_INVALID, "'%s' %.17g: expected %s", key, d, expect);
    *out = (int64_t)d;
    return 0;
}

/* "stop": a non-empty string or a list of up to FT_GEN_MAX_STOP_STR of them. */
static int param_stop(const cJSON *v, ft_gen_params *p)
{
    const int list = cJSON_IsArray(v);
    const int64_t n = list ? cJSON_GetArraySize(v) : 1;
    if (!list && !cJSON_IsString(v))
        return ft_err(FT_E_INVALID, "'stop' must be a string or a list of strings, found %s",
                      json_type(v));
    if (n > FT_GEN_MAX_STOP_STR)
        return ft_err(FT_E_INVALID, "'stop': %lld strings, at most %d", (long long)n,
                      FT_GEN_MAX_STOP_STR);
    p->stop = calloc((size_t)(n ? n : 1), sizeof *p->stop);
    if (!p->stop) return ft_err(-ENOMEM, "out of memory");
    const cJSON *e = list ? v->child : v;
    for (int64_t i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e))
            return ft_err(FT_E_INVALID, "'stop' item %lld must be a string, found %s",
                          (long long)i + 1, json_type(e));
        if (!e->valuestring[0] && list) /* it would match at once */
            return ft_err(FT_E_INVALID, "'stop' item %lld: expected a non-empty string", (long long)i + 1);
        if (!e->valuestring[0])
            return ft_err(FT_E_INVALID, "'stop': expected a non-empty string");
        if (!(p->stop[i] = dup_str(e->valuestring, strlen(e->valuestring))))
            return ft_err(-ENOMEM, "out of memory");
        p->n_stop = i + 1;
    }
    return 0;
}

/* The generation settings of object record rec into *p (see ft_gen_req_parse). On error
 * *p may hold a partial stop list (ft_gen_req_free frees it). */
static int req_params(ft_gen_params *p, const cJSON *rec)
{
    static const char *const max_keys[] = {"max_new_tokens", "max_tokens", "max_completion_tokens"};
    const char *max_key = NULL;
    for (int i = 0; i < 3; i++) {
        const cJSON *v = param_item(rec, max_keys[i]);
        int64_t m;
        if (!v) continue;
        FT_TRY(param_int(v, max_keys[i], 1, FT_GEN_MAX_NEW_TOKENS, "1..1000000", &m));
        if (max_key && m != p->max_new_tokens)
            return ft_err(FT_E_INVALID, "'%s' %lld and '%s' %lld: give one of them",
                          max_key, (long long)p->max_new_tokens, max_keys[i], (long long)m);
        max_key = max_keys[i];
        p->max_new_tokens = m;
        p->set |= FT_GEN_SET_MAX_NEW;
    }
    const cJSON *v;
    if ((v = param_item(rec, "temperature"))) {
        FT_TRY(param_float(v, "temperature", 0, 0, INFINITY, "a finite value >= 0 (0: greedy)",
                           &p->temperature));
        p->set |= FT_GEN_SET_TEMPERATURE;
    }
    if ((v = param_item(rec, "top_p"))) {
        FT_TRY(param_float(v, "top_p", 0, 1, 1, "0 < top_p <= 1 (1: off)", &p->top_p));
        p->set |= FT_GEN_SET_TOP_P;
    }
    if ((v = param_item(rec, "top_k"))) {
        FT_TRY(param_int(v, "top_k", 0, (INT64_C(1) << 53) - 1, "an integer >= 0 (0: off)",
                         &p->top_k));
        p->set |= FT_GEN_SET_TOP_K;
    }
    if ((v = param_item(rec, "min_p"))) {
        FT_TRY(param_float(v, "min_p", 0, 0, 1, "0 <= min_p <= 1 (0: off)", &p->min_p));
        p->set |= FT_GEN_SET_MIN_P;
    }
    if ((v = param_item(rec, "repetition_penalty"))) {
        FT_TRY(param_float(v, "repetition_penalty", 0, 1, INFINITY, "a finite value > 0 (1: off)",
                           &p->repetition_penalty));
        p->set |= FT_GEN_SET_REP_PENALTY;
    }
    /* a line that `ftune generate --prompts` wrote ("reply" is no input key) fed back as a
     * prompts file: its "stop" is why that reply ended ("length", ...), not a stop string */
    if ((v = param_item(rec, "stop")) && !cJSON_GetObjectItemCaseSensitive(rec, "reply")) {
        FT_TRY(param_stop(v, p));
        p->set |= FT_GEN_SET_STOP;
    }
    if ((v = param_item(rec, "seed"))) {
        int64_t sd;
        FT_TRY(param_int(v, "seed", 0, (INT64_C(1) << 53) - 1, "an integer 0..2^53 - 1", &sd));
        p->seed = (uint64_t)sd;
        p->set |= FT_GEN_SET_SEED;
    }
    return 0;
}

int ft_gen_req_parse(ft_gen_req *q, const cJSON *rec, const char *system, int raw)
{
    memset(q, 0, sizeof *q);
    int rc;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
    if (cJSON_IsString(rec)) {
        rc = req_prompt(q, rec->valuestring, NULL, system, raw);
    } else if (cJSON_IsObject(rec) && cJSON_IsString(p)) {
        rc = req_prompt(q, p->valuestring, rec, system, raw);
    } else if (p && !(cJSON_IsArray(p) && cJSON_GetObjectItemCaseSensitive(rec, "completion"))) {
        rc = ft_err(FT_E_INVALID, "'prompt' must be a string (a conversation goes in 'messages', "
                    "or in 'prompt' and 'completion' lists)");
    } else if (raw) {
        rc = ft_err(FT_E_INVALID, "with --raw a record is a string or {\"prompt\": S}, found %s",
                    json_type(rec));
    } else if (cJSON_IsObject(rec)) {
        rc = req_conversation(q, rec, system);
    } else {
        rc = ft_err(FT_E_INVALID, "expected a string or an object; found %s", json_type(rec));
    }
    /* function schemas, as training reads them (the model's template writes them) */
    if (!rc && !raw && cJSON_IsObject(rec)) rc = ft_data_record_tools(rec, &q->tools);
    if (!rc && cJSON_IsObject(rec)) rc = req_params(&q->params, rec);
    if (rc) ft_gen_req_free(q);
    return rc;
}

int ft_gen_req_ids(const ft_tokenizer *tok, int tmpl, const ft_gen_req *q, int flags,
                   int32_t **ids, int64_t *n, int *tmpl_out)
{
    *ids = NULL;
    *n = 0;
    if (!tok || !q || !q->user || q->n_msgs < 1)
        return ft_err(FT_E_INVALID, "generate: no tokenizer or prompt");
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    if (tmpl_out) *tmpl_out = tmpl;
    if (flags & FT_GEN_RAW) return ft_tok_encode(tok, q->user, strlen(q->user), 1, ids, n);
    return msgs_ids(tok, tmpl, q->msgs, q->n_msgs, q->tools, flags, ids, n, tmpl_out);
}

uint64_t ft_gen_record_seed(uint64_t seed, int64_t i)
{
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull; /* splitmix64's state after i steps */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return seed ^ (z & ((1ull << 53) - 1));
}

/* ---- streaming detokenization ------------------------------------------------------------ */

void ft_detok_init(ft_detok *d, const ft_tokenizer *tok)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
}

void ft_detok_free(ft_detok *d)
{
    if (!d) return;
    free(d->ids);
    free(d->piece);
    memset(d, 0, sizeof *d);
}

/* Decodes ids[a..b) (skip_special) into a malloc'ed string; *len its length. */
static int decode_range(const ft_detok *d, int64_t a, int64_t b, char **s, size_t *len)
{
    FT_TRY(ft_tok_decode(d->tok, d->ids + a, b - a, 1, s));
    if (!*s && !(*s = calloc(1, 1))) return ft_err(-ENOMEM, "detokenizer: out of memory");
    *len = strlen(*s);
    return 0;
}

static int ends_replacement(const char *s, size_t n)
{
    return n >= 3 && (unsigned char)s[n - 3] == 0xEF && (unsigned char)s[n - 2] == 0xBF &&
           (unsigned char)s[n - 1] == 0xBD;
}

/* Emits the text of ids[prefix_off..n) beyond that of ids[prefix_off..read_off); with
 * final = 0 only when it is longer and does not end in U+FFFD. */
static int detok_step(ft_detok *d, int final, const char **piece, size_t *n)
{
    *piece = "";
    *n = 0;
    char *pre = NULL, *all = NULL;
    size_t pn = 0, an = 0;
    int rc = decode_range(d, d->prefix_off, d->read_off, &pre, &pn);
    if (!rc) rc = decode_range(d, d->prefix_off, d->n, &all, &an);
    if (!rc && an > pn && (final || !ends_replacement(all, an))) {
        free(d->piece);
        d->piece = malloc(an - pn + 1);
        if (!d->piece) {
            rc = ft_err(-ENOMEM, "detokenizer: out of memory");
        } else {
            memcpy(d->piece, all + pn, an - pn);
            d->piece[an - pn] = 0;
            *piece = d->piece;
            *n = an - pn;
            d->prefix_off = d->read_off;
            d->read_off = d->n;
        }
    }
    free(pre);
    free(all);
    return rc;
}

int ft_detok_push(ft_detok *d, int32_t id, const char **piece, size_t *n)
{
    *piece = "";
    *n = 0;
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        int32_t *p = realloc(d->ids, (size_t)cap * sizeof *p);
        if (!p) return ft_err(-ENOMEM, "detokenizer: out of memory");
        d->ids = p;
        d->cap = cap;
    }
    d->ids[d->n++] = id;
    return detok_step(d, 0, piece, n);
}

int ft_detok_flush(ft_detok *d, const char **piece, size_t *n)
{
    return detok_step(d, 1, piece, n);
}
