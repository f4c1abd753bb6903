/* generate.c - KV-cache inference (generate.h: ft_gen_*; the prompt side is gen_prompt.c, the
 * streamed text and its detokenizer stop_text.c). */
#include "src/infer/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/align.h"

#define GEN_MAX_HALF_D 1024 /* head_dim / 2 bound of the inv_freq staging array */

/* ---- plan ------------------------------------------------------------------------------- */

/* Floats of every region, in carving order (each rounded up to 16 floats = 64 bytes). */
typedef struct gen_layout {
    int64_t kv, x, y, xn, rstd, q, att, lse, h, gate, up, act, u, logits, inv, ints, xd, kt;
} gen_layout;

/* xd (linear_fwd's scratch) only with a source: the model's own weights are fp32 */
static gen_layout plan(const ft_model *m, const ft_lora *lora, int64_t ctx, int64_t chunk,
                       int64_t rows, int64_t seqs, int with_xd)
{
    const ft_model_config *c = &m->cfg;
    const int64_t C = c->hidden_size, HD = c->num_attention_heads * c->head_dim;
    const int64_t KD = c->num_key_value_heads * c->head_dim;
    gen_layout L;
    L.kv = seqs * c->num_hidden_layers * ctx * KD;
    L.x = L.y = L.xn = L.h = chunk * C;
    L.rstd = chunk;
    L.q = L.att = chunk * HD;
    L.lse = chunk * c->num_attention_heads;
    L.gate = L.up = L.act = chunk * c->intermediate_size;
    L.u = chunk * (lora ? lora->cfg.r : 1);
    L.logits = rows * c->vocab_size;
    L.inv = seqs * ft_pad16(c->head_dim / 2 + 1); /* one RoPE table per sequence */
    L.ints = 3 * chunk; /* ids, pos, seq_start: int32 in float-sized sequences */
    int64_t wide = C > HD ? C : HD;
    if (c->intermediate_size > wide) wide = c->intermediate_size;
    L.xd = with_xd ? chunk * wide : 0;
    L.kt = seqs > 1 ? 2 * chunk * KD : 0; /* a batched decode's or prefill's new k and v rows */
    return L;
}

static int64_t plan_floats(const gen_layout *L)
{
    return 2 * ft_pad16(L->kv) + ft_pad16(L->x) + ft_pad16(L->y) + ft_pad16(L->xn) +
           ft_pad16(L->rstd) + ft_pad16(L->q) + ft_pad16(L->att) + ft_pad16(L->lse) +
           ft_pad16(L->h) + ft_pad16(L->gate) + ft_pad16(L->up) + ft_pad16(L->act) +
           ft_pad16(L->u) + ft_pad16(L->logits) + ft_pad16(L->inv) + ft_pad16(L->ints) +
           ft_pad16(L->xd) + ft_pad16(L->kt);
}

/* 1 when a chunk exceeds what the caches can take in one forward: ctx_max tokens of one
 * sequence, or n_seqs sequences of up to ctx_max each (ft_gen_prefill). */
static int chunk_over(int64_t ctx_max, int64_t chunk_max, int64_t n_seqs)
{
    return (double)chunk_max > (double)ctx_max * (double)(n_seqs > 1 ? n_seqs : 1);
}

/* 1 when the sizes are out of range (gen_init's checks, without messages). */
static int bad_sizes(const ft_model_config *c, int64_t ctx_max, int64_t chunk_max,
                     int64_t logit_rows_max, int64_t n_seqs)
{
    return ctx_max < 1 || chunk_max < 1 || logit_rows_max < 1 ||
           chunk_over(ctx_max, chunk_max, n_seqs) ||
           logit_rows_max > chunk_max || n_seqs < 1 || n_seqs > FT_GEN_MAX_SEQS ||
           (double)n_seqs * (double)ctx_max * (double)c->num_hidden_layers *
                   (double)c->num_key_value_heads * (double)c->head_dim > 1e15 ||
           (double)logit_rows_max * (double)c->vocab_size > 1e15;
}

size_t ft_gen_source_bytes(const ft_model *m, const ft_lora *lora, int64_t ctx_max,
                           int64_t chunk_max, int64_t logit_rows_max, int64_t n_seqs)
{
    if (bad_sizes(&m->cfg, ctx_max, chunk_max, logit_rows_max, n_seqs)) return 0;
    gen_layout L = plan(m, lora, ctx_max, chunk_max, logit_rows_max, n_seqs, 1);
    return (size_t)plan_floats(&L) * sizeof(float);
}

static int place_weights(ft_gen *g);

/* Sequence s's RoPE table (head_dim / 2 floats, backend memory). */
static float *inv_of(const ft_gen *g, int64_t s)
{
    return g->inv_freq + s * ft_pad16(g->m->cfg.head_dim / 2 + 1);
}

static int gen_init(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                    const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                    int64_t logit_rows_max, int64_t n_seqs)
{
    memset(g, 0, sizeof *g);
    if (!be || !m) return ft_err(FT_E_INVALID, "generate: no backend or model");
    if (src && (!src->layer || !src->final_norm || (!src->lm_head && !src->head) ||
                (!src->embed && !src->embed_rows)))
        return ft_err(FT_E_INVALID, "generate: the weight source lacks its layers, final norm, "
                      "LM head or embeddings");
    if (ctx_max < 1 || chunk_max < 1 || logit_rows_max < 1 ||
        chunk_over(ctx_max, chunk_max, n_seqs) || logit_rows_max > chunk_max)
        return ft_err(FT_E_INVALID,
                      "generate: sizes context %lld, chunk %lld, logit rows %lld, %lld sequences; "
                      "expected 1 <= logit rows <= chunk <= context x sequences",
                      (long long)ctx_max, (long long)chunk_max, (long long)logit_rows_max,
                      (long long)n_seqs);
    if (n_seqs < 1 || n_seqs > FT_GEN_MAX_SEQS)
        return ft_err(FT_E_INVALID, "generate: %lld sequences at once, expected 1..%d",
                      (long long)n_seqs, FT_GEN_MAX_SEQS);
    const ft_model_config *c = &m->cfg;
    if (c->head_dim / 2 > GEN_MAX_HALF_D)
        return ft_err(FT_E_UNSUPPORTED, "generate: head_dim %lld, at most %d supported",
                      (long long)c->head_dim, 2 * GEN_MAX_HALF_D);
    if (lora && lora->n_layers != c->num_hidden_layers)
        return ft_err(FT_E_INVALID, "generate: the adapter has %lld layers, the model %lld",
                      (long long)lora->n_layers, (long long)c->num_hidden_layers);
    /* the largest region must fit int64 floats with room for the sum */
    if (bad_sizes(c, ctx_max, chunk_max, logit_rows_max, n_seqs))
        return ft_err(FT_E_RANGE, "generate: a context of %lld tokens x %lld sequences is too large",
                      (long long)ctx_max, (long long)n_seqs);
    gen_layout L = plan(m, lora, ctx_max, chunk_max, logit_rows_max, n_seqs, src != NULL);
    g->past = calloc((size_t)n_seqs, sizeof *g->past);
    if (!g->past) return ft_err(-ENOMEM, "out of memory");
    g->arena_bytes = (size_t)plan_floats(&L) * sizeof(float);
    g->arena = be->ops->alloc(be, g->arena_bytes);
    if (!g->arena) {
        free(g->past);
        g->past = NULL;
        return ft_err(-ENOMEM, "out of memory: generation needs %.1f MiB (KV cache of %lld "
                      "tokens x %lld sequences: %.1f MiB; try fewer --max-new-tokens, a shorter "
                      "prompt or a smaller --batch)",
                      g->arena_bytes / 1048576.0, (long long)ctx_max, (long long)n_seqs,
                      2.0 * (double)L.kv * sizeof(float) / 1048576.0);
    }
    g->be = be;
    g->m = m;
    g->lora = lora;
    g->src = src;
    g->ctx_max = ctx_max;
    g->chunk_max = chunk_max;
    g->logit_rows_max = logit_rows_max;
    g->n_seqs = n_seqs;
    float *p = g->arena;
    g->kc = ft_carve16(&p, L.kv);
    g->vc = ft_carve16(&p, L.kv);
    g->x = ft_carve16(&p, L.x);
    g->y = ft_carve16(&p, L.y);
    g->xn = ft_carve16(&p, L.xn);
    g->rstd = ft_carve16(&p, L.rstd);
    g->q = ft_carve16(&p, L.q);
    g->att = ft_carve16(&p, L.att);
    g->lse = ft_carve16(&p, L.lse);
    g->h = ft_carve16(&p, L.h);
    g->gate = ft_carve16(&p, L.gate);
    g->up = ft_carve16(&p, L.up);
    g->act = ft_carve16(&p, L.act);
    g->u = ft_carve16(&p, L.u);
    g->logits = ft_carve16(&p, L.logits);
    g->inv_freq = ft_carve16(&p, L.inv);
    int32_t *ip = (int32_t *)ft_carve16(&p, L.ints);
    g->ids = ip;
    g->pos = ip + chunk_max;
    g->seq_start = ip + 2 * chunk_max;
    g->xd = src ? ft_carve16(&p, L.xd) : NULL;
    g->kt = n_seqs > 1 ? ft_carve16(&p, L.kt) : NULL;

    int rc = place_weights(g);
    if (!rc) rc = be->ops->zero(be, g->seq_start, (size_t)chunk_max * sizeof(int32_t));
    float inv[GEN_MAX_HALF_D];
    ft_rope_inv_freq(c, ctx_max, inv);
    for (int64_t s = 0; !rc && s < n_seqs; s++)
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

int ft_gen_init_seqs(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                      const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                      int64_t logit_rows_max, int64_t n_seqs)
{
    return gen_init(g, be, m, lora, src, ctx_max, chunk_max, logit_rows_max, n_seqs);
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

void ft_gen_reset(ft_gen *g) { ft_gen_reset_seq(g, 0); }

void ft_gen_reset_seq(ft_gen *g, int64_t seq)
{
    if (!g || !g->past || seq < 0 || seq >= g->n_seqs) return;
    g->past[seq] = 0;
    if (seq == 0) g->n_past = 0;
}

int ft_gen_truncate_seq(ft_gen *g, int64_t seq, int64_t n_keep)
{
    if (!g || !g->past) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (seq < 0 || seq >= g->n_seqs)
        return ft_err(FT_E_RANGE, "generate: sequence %lld, expected 0..%lld", (long long)seq,
                      (long long)g->n_seqs - 1);
    if (n_keep < 0 || n_keep > g->past[seq])
        return ft_err(FT_E_RANGE, "generate: keep %lld cached tokens of sequence %lld, expected 0..%lld",
                      (long long)n_keep, (long long)seq, (long long)g->past[seq]);
    g->past[seq] = n_keep; /* attention reads rows [0, past + n) only: the rest is dead */
    if (seq == 0) g->n_past = n_keep;
    return 0;
}

int ft_gen_set_rope_len(ft_gen *g, int64_t seq_len) { return ft_gen_set_rope_len_seq(g, 0, seq_len); }

int ft_gen_set_rope_len_seq(ft_gen *g, int64_t seq, int64_t seq_len)
{
    if (!g || !g->arena || seq < 0 || seq >= g->n_seqs)
        return ft_err(FT_E_INVALID, "generate: no sequence %lld", (long long)seq);
    const ft_model_config *c = &g->m->cfg;
    float inv[GEN_MAX_HALF_D];
    ft_rope_inv_freq(c, seq_len, inv);
    return g->be->ops->copy(g->be, inv_of(g, seq), inv, (size_t)(c->head_dim / 2) * sizeof(float));
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
    if (w->wtype == FT_WTYPE_F32)
        FT_TRY(o->gemm(be, 0, 1, n, out, in, 1.0f, x, in, w->w, in, beta, y, out));
    else
        FT_TRY(o->linear_fwd(be, y, x, w->wtype == FT_WTYPE_NF4 ? (const void *)w->nf4 : (const void *)w->w,
                             w->wtype, n, out, in, beta, g->xd));
    if (w->b) FT_TRY(o->bias_add(be, y, w->b, n, out));
    return 0;
}

/* The rows of one forward: a chunk of n tokens of one sequence (sequences NULL: sequence `seq`,
 * positions past[sequence] + i); one token of each of n sequences (lens NULL: row i is sequence
 * seqs[i] at position past[seqs[i]]); or the prompts of n_seq empty sequences one after another
 * (ft_gen_prefill: lens[i] rows of sequence seqs[i], positions 0..lens[i]-1). */
typedef struct gen_rows {
    int64_t seq;
    const int64_t *seqs;
    const int64_t *lens;
    int64_t n_seq;
} gen_rows;

/* Layer l's K and V cache of sequence s: (ctx_max, Hkv, D) each. */
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
    if (!rw->seqs) return o->rope_fwd(g->be, x, g->pos, inv_of(g, rw->seq), n, heads, c->head_dim);
    if (c->rope_type != FT_ROPE_DYNAMIC) /* every sequence's table is the same */
        return o->rope_fwd(g->be, x, g->pos, inv_of(g, rw->seqs[0]), n, heads, c->head_dim);
    if (rw->lens) { /* dynamic NTK, a prefill: each prompt's rows with its own table */
        for (int64_t i = 0, r = 0; i < rw->n_seq; r += rw->lens[i++])
            FT_TRY(o->rope_fwd(g->be, x + r * heads * c->head_dim, g->pos + r,
                               inv_of(g, rw->seqs[i]), rw->lens[i], heads, c->head_dim));
        return 0;
    }
    for (int64_t i = 0; i < n; i++) /* dynamic NTK: each sequence's own table */
        FT_TRY(o->rope_fwd(g->be, x + i * heads * c->head_dim, g->pos + i, inv_of(g, rw->seqs[i]),
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
    const int64_t p = rw->seqs ? 0 : g->past[rw->seq];
    /* the new tokens' k and v: straight into the cache rows of a one-sequence chunk, or
     * staged (kt) and copied into each sequence's cache */
    float *kn, *vn;
    if (rw->seqs) {
        kn = g->kt;
        vn = g->kt + n * KD;
    } else {
        kn = kv_of(g, g->kc, rw->seq, l) + p * KD;
        vn = kv_of(g, g->vc, rw->seq, l) + p * KD;
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
    if (rw->lens) {
        /* a prefill: each prompt's k/v rows copied into its empty cache as one block, and its
         * attention the one-sequence prefill's call on its own rows (a call over the packed
         * rows, seq_start marking each prompt, is the same math, but the CPU kernel's tiles
         * are aligned to the packed buffer: a prompt sharing a tile with the one before it
         * would sum its softmax in another order, and its replies could differ from --batch 1
         * in the last bits) */
        for (int64_t i = 0, r = 0; i < rw->n_seq; r += rw->lens[i++]) {
            const int64_t s = rw->seqs[i], len = rw->lens[i];
            FT_TRY(o->copy(be, kv_of(g, g->kc, s, l), kn + r * KD, (size_t)(len * KD) * sizeof(float)));
            FT_TRY(o->copy(be, kv_of(g, g->vc, s, l), vn + r * KD, (size_t)(len * KD) * sizeof(float)));
            FT_TRY(o->attention_fwd(be, g->att + r * H * D, g->lse + r * H, g->q + r * H * D,
                                    kn + r * KD, vn + r * KD, g->seq_start, len, H, Hkv, D, sc));
        }
    } else if (rw->seqs) {
        /* each row: its k/v appended to its sequence's cache, then attention over it */
        for (int64_t i = 0; i < n; i++) {
            const int64_t s = rw->seqs[i], ps = g->past[s];
            float *kl = kv_of(g, g->kc, s, l), *vl = kv_of(g, g->vc, s, l);
            FT_TRY(o->copy(be, kl + ps * KD, kn + i * KD, (size_t)KD * sizeof(float)));
            FT_TRY(o->copy(be, vl + ps * KD, vn + i * KD, (size_t)KD * sizeof(float)));
            FT_TRY(o->attention_kv_fwd(be, g->att + i * H * D, g->q + i * H * D, kl, vl, ps, 1, H,
                                       Hkv, D, sc));
        }
    } else if (p == 0) { /* an empty cache: the training kernel on one sequence */
        FT_TRY(o->attention_fwd(be, g->att, g->lse, g->q, kn, vn, g->seq_start, n, H, Hkv, D, sc));
    } else {
        FT_TRY(o->attention_kv_fwd(be, g->att, g->q, kv_of(g, g->kc, rw->seq, l),
                                   kv_of(g, g->vc, rw->seq, l), p, n, H, Hkv, D, sc));
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
    int64_t seq = 0, in_seq = 0; /* a prefill's row: its prompt, and its row in it */
    for (int64_t i0 = 0; i0 < n; i0 += 256) { /* positions, staged through the stack */
        const int64_t k = n - i0 < 256 ? n - i0 : 256;
        for (int64_t i = 0; i < k; i++) {
            if (rw->lens) {
                while (in_seq == rw->lens[seq]) seq++, in_seq = 0;
                pos[i] = (int32_t)in_seq++;
            } else {
                pos[i] = (int32_t)(rw->seqs ? g->past[rw->seqs[i0 + i]] : g->past[rw->seq] + i0 + i);
            }
        }
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
    const float *xl = x + (n - rows) * C; /* the rows the logits are of */
    if (rw->lens) { /* a prefill: each prompt's last row, gathered into the free buffer y */
        for (int64_t i = 0, r = 0; i < rw->n_seq; i++) {
            r += rw->lens[i];
            FT_TRY(o->copy(be, y + i * C, x + (r - 1) * C, (size_t)C * sizeof(float)));
        }
        xl = y;
    }
    FT_TRY(o->rmsnorm_fwd(be, g->xn, g->rstd, xl, g->final_norm, rows, C, c->rms_norm_eps));
    if (g->src && g->src->head) /* e.g. a pack's bf16 table (offload/exec.c gen_head) */
        FT_TRY(g->src->head(g->src->ctx, g->logits, g->xn, rows));
    else
        FT_TRY(o->lm_head_logits(be, g->logits, g->xn, g->lm_head, rows, C, V));
    return o->copy(be, logits, g->logits, (size_t)(rows * V) * sizeof(float));
}

/* FT_E_RANGE unless seqs[i] is a sequence of g, FT_E_INVALID when seqs[0..i) holds it already
 * (`what`: "prefill" or "decode step", for the message). */
static int seq_ok(const ft_gen *g, const int64_t *seqs, int64_t i, const char *what)
{
    const int64_t s = seqs[i];
    if (s < 0 || s >= g->n_seqs)
        return ft_err(FT_E_RANGE, "generate: sequence %lld, expected 0..%lld", (long long)s,
                      (long long)g->n_seqs - 1);
    for (int64_t j = 0; j < i; j++)
        if (seqs[j] == s)
            return ft_err(FT_E_INVALID, "generate: sequence %lld twice in one %s", (long long)s,
                          what);
    return 0;
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

int ft_gen_prefill(ft_gen *g, int64_t n_seq, const int64_t *seqs, const int32_t *ids,
                   const int64_t *lens, float *logits)
{
    if (!g || !g->arena) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (!seqs || !ids || !lens || !logits)
        return ft_err(FT_E_INVALID, "generate: NULL seqs, ids, lengths or logits");
    const int64_t nmax = g->n_seqs < g->logit_rows_max ? g->n_seqs : g->logit_rows_max;
    if (n_seq < 1 || n_seq > nmax)
        return ft_err(FT_E_RANGE, "generate: %lld prompts in one prefill, expected 1..%lld",
                      (long long)n_seq, (long long)nmax);
    int64_t total = 0;
    for (int64_t i = 0; i < n_seq; i++) {
        const int64_t s = seqs[i];
        FT_TRY(seq_ok(g, seqs, i, "prefill"));
        if (g->past[s] != 0)
            return ft_err(FT_E_INVALID, "generate: sequence %lld holds %lld tokens (a prefill "
                          "starts an empty cache: ft_gen_reset_seq, or ft_gen_forward_seq to "
                          "extend it)", (long long)s, (long long)g->past[s]);
        if (lens[i] < 1 || lens[i] > g->ctx_max)
            return ft_err(FT_E_RANGE, "generate: prompt %lld of the prefill has %lld tokens, "
                          "expected 1..%lld (the context planned)", (long long)i,
                          (long long)lens[i], (long long)g->ctx_max);
        total += lens[i];
    }
    if (total > g->chunk_max)
        return ft_err(FT_E_RANGE, "generate: %lld prompt tokens in one prefill, expected at most "
                      "%lld (the chunk planned: split the prompts over several prefills)",
                      (long long)total, (long long)g->chunk_max);
    const int64_t V = g->m->cfg.vocab_size;
    for (int64_t i = 0, r = 0; i < n_seq; r += lens[i++])
        for (int64_t t = 0; t < lens[i]; t++)
            if (ids[r + t] < 0 || ids[r + t] >= V)
                return ft_err(FT_E_INVALID, "generate: prompt %lld of the prefill (sequence %lld): "
                              "token %lld has id %d, expected 0..%lld", (long long)i,
                              (long long)seqs[i], (long long)t, ids[r + t], (long long)V - 1);
    if (n_seq == 1) return ft_gen_forward_seq(g, seqs[0], ids, lens[0], logits, 1);
    gen_rows rw = {0, seqs, lens, n_seq};
    int rc = forward_rows(g, &rw, ids, total, logits, n_seq);
    for (int64_t i = 0; i < n_seq; i++) /* on a failure each prompt's rows are partly written */
        g->past[seqs[i]] = rc ? 0 : lens[i];
    g->n_past = g->past[0];
    return rc;
}

int ft_gen_forward(ft_gen *g, const int32_t *ids, int64_t n, float *logits, int64_t rows)
{
    return ft_gen_forward_seq(g, 0, ids, n, logits, rows);
}

int ft_gen_forward_seq(ft_gen *g, int64_t seq, const int32_t *ids, int64_t n, float *logits,
                        int64_t rows)
{
    if (!g || !g->arena) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (seq < 0 || seq >= g->n_seqs)
        return ft_err(FT_E_RANGE, "generate: sequence %lld, expected 0..%lld", (long long)seq,
                      (long long)g->n_seqs - 1);
    if (n < 1 || n > g->chunk_max)
        return ft_err(FT_E_RANGE, "generate: %lld tokens in one forward, expected 1..%lld",
                      (long long)n, (long long)g->chunk_max);
    const int64_t rmax = n < g->logit_rows_max ? n : g->logit_rows_max;
    if (rows < 1 || rows > rmax)
        return ft_err(FT_E_RANGE, "generate: %lld logits rows, expected 1..%lld", (long long)rows,
                      (long long)rmax);
    if (g->past[seq] + n > g->ctx_max)
        return ft_err(FT_E_RANGE, "generate: context full: %lld cached + %lld new tokens exceed "
                      "the %lld planned", (long long)g->past[seq], (long long)n,
                      (long long)g->ctx_max);
    if (!ids || !logits) return ft_err(FT_E_INVALID, "generate: NULL ids or logits");
    FT_TRY(check_ids(g, ids, n));
    gen_rows rw = {seq, NULL, NULL, 0};
    int rc = forward_rows(g, &rw, ids, n, logits, rows);
    g->past[seq] = rc ? 0 : g->past[seq] + n; /* on a failure the rows are partly written */
    if (seq == 0) g->n_past = g->past[0];
    return rc;
}

int ft_gen_decode(ft_gen *g, const int64_t *seqs, const int32_t *ids, int64_t n, float *logits)
{
    if (!g || !g->arena) return ft_err(FT_E_INVALID, "generate: not initialised");
    if (!seqs || !ids || !logits) return ft_err(FT_E_INVALID, "generate: NULL seqs, ids or logits");
    if (n < 1 || n > g->n_seqs || n > g->chunk_max || n > g->logit_rows_max)
        return ft_err(FT_E_RANGE, "generate: %lld sequences in one decode step, expected 1..%lld",
                      (long long)n, (long long)(g->n_seqs < g->logit_rows_max ? g->n_seqs
                                                                                : g->logit_rows_max));
    if (n > 1 && !g->kt) return ft_err(FT_E_INVALID, "generate: one sequence only");
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = seqs[i];
        FT_TRY(seq_ok(g, seqs, i, "decode step"));
        if (g->past[s] < 1)
            return ft_err(FT_E_INVALID, "generate: sequence %lld is empty (a decode step "
                          "follows its prompt)", (long long)s);
        if (g->past[s] + 1 > g->ctx_max)
            return ft_err(FT_E_RANGE, "generate: context full: sequence %lld holds %lld tokens of the "
                          "%lld planned", (long long)s, (long long)g->past[s], (long long)g->ctx_max);
    }
    FT_TRY(check_ids(g, ids, n));
    if (n == 1) return ft_gen_forward_seq(g, seqs[0], ids, 1, logits, 1);
    gen_rows rw = {0, seqs, NULL, 0};
    int rc = forward_rows(g, &rw, ids, n, logits, n);
    for (int64_t i = 0; i < n; i++) /* on a failure each sequence's rows are partly written */
        g->past[seqs[i]] = rc ? 0 : g->past[seqs[i]] + 1;
    g->n_past = g->past[0];
    return rc;
}
