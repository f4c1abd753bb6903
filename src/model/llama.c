/* llama.c - Llama decoder block forward/backward over the op table (see llama.h). */
#include "src/model/llama.h"

#include <math.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/align.h"
#include "src/core/rng.h"

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* Each region starts 64 bytes (16 floats) after a 64-byte boundary: the CUDA linear ops read an
 * activation as float4 and write bf16 pairs into the scratch (kernels/cuda/backend.cu
 * to_bf16), which a region after T floats (rstd1, lse: T odd) would misalign. base NULL:
 * nothing is carved, only counted. Returns the floats used. */
static float *take(float *base, int64_t *off, int64_t n)
{
    float *r = base ? base + *off : NULL;
    *off += ft_pad16(n);
    return r;
}

static int64_t acts_layout(ft_block_acts *a, float *p, const ft_block_dims *d)
{
    int64_t T = d->T, o = 0;
    a->xn1 = take(p, &o, T * d->C);
    a->rstd1 = take(p, &o, T);
    a->q = take(p, &o, T * d->H * d->D);
    a->k = take(p, &o, T * d->Hkv * d->D);
    a->v = take(p, &o, T * d->Hkv * d->D);
    a->att = take(p, &o, T * d->H * d->D);
    a->lse = take(p, &o, T * d->H);
    a->h = take(p, &o, T * d->C);
    a->xn2 = take(p, &o, T * d->C);
    a->rstd2 = take(p, &o, T);
    a->gate = take(p, &o, T * d->F);
    a->up = take(p, &o, T * d->F);
    a->act = take(p, &o, T * d->F);
    for (int i = 0; i < FT_N_PROJ; i++)
        a->u[i] = take(p, &o, T * d->r);
    a->rstd_q = take(p, &o, T * d->H);
    a->rstd_k = take(p, &o, T * d->Hkv);
    return o;
}

static int64_t scratch_layout(ft_block_scratch *s, float *p, const ft_block_dims *d)
{
    int64_t T = d->T, wide = max3(d->C, d->H * d->D, d->F), o = 0;
    s->d1 = take(p, &o, T * wide);
    s->d2 = take(p, &o, T * wide);
    s->dq = take(p, &o, T * d->H * d->D);
    s->dk = take(p, &o, T * d->Hkv * d->D);
    s->dv = take(p, &o, T * d->Hkv * d->D);
    s->dgate = take(p, &o, T * d->F);
    s->dup = take(p, &o, T * d->F);
    s->du = take(p, &o, T * d->r);
    s->xd = take(p, &o, 2 * T * wide);
    return o;
}

int64_t ft_block_acts_floats(const ft_block_dims *d)
{
    ft_block_acts a;
    return acts_layout(&a, NULL, d);
}

int64_t ft_block_scratch_floats(const ft_block_dims *d)
{
    ft_block_scratch s;
    return scratch_layout(&s, NULL, d);
}

void ft_block_acts_carve(ft_block_acts *a, float *p, const ft_block_dims *d, unsigned targets)
{
    acts_layout(a, p, d);
    (void)targets;
}

void ft_block_scratch_carve(ft_block_scratch *s, float *p, const ft_block_dims *d)
{
    scratch_layout(s, p, d);
}

/* Softmax scale: 1/sqrt(D), times the square of RoPE's cos/sin factor (yarn), since
 * scaling both q and k by m scales their dot products by m^2. */
static float attn_scale(const ft_model_config *cfg, int64_t D)
{
    float m = (float)cfg->rope_attention_factor;
    if (!(m > 0)) m = 1.0f;
    return m * m / sqrtf((float)D);
}

/* The adapter of projection p in `layer`, or NULL when not targeted / no adapter. */
static const ft_lora_linear *lora_of(const ft_lora *l, int64_t layer, int p)
{
    if (!l || !l->lin[layer][p].A) return NULL;
    return &l->lin[layer][p];
}

/* Dropout seed per (step/micro-batch seed, layer, projection); 0 means no dropout. */
static uint64_t proj_seed(uint64_t base, int64_t layer, int p) { return ft_seed_derive_proj(base, layer, p); }

/* The frozen weight as linear_fwd/linear_bwd_x take it (kernels.h enum ft_wtype). */
static const void *base_w(const ft_linear *w)
{
    return w->wtype == FT_WTYPE_NF4 ? (const void *)w->nf4 : (const void *)w->w;
}

/* One segment's adapter on projection pj of a layer: the adapter's linear (NULL: none on these
 * rows), its scale, rank, dropout probability (0 outside training) and mask seed. */
typedef struct seg_lora {
    const ft_lora_linear *ll;
    float scale, p;
    int64_t r;
    uint64_t seed;
} seg_lora;

static seg_lora seg_lora_of(const ft_block_seg *g, int64_t layer, int pj, int train)
{
    seg_lora o = {lora_of(g->lora, layer, pj), 0.0f, 0.0f, 0, 0};
    if (!o.ll) return o;
    o.scale = g->lora->scale;
    o.r = g->lora->cfg.r;
    o.p = train ? g->lora->cfg.dropout : 0.0f;
    o.seed = proj_seed(train ? g->dropout_seed : 0, layer, pj);
    return o;
}

static int seg_drops(const seg_lora *g) { return g->p > 0 && g->seed; }

/* A block call's segments: n of them over T rows, u / du strided by r (the largest rank). */
typedef struct blk_segs {
    const ft_block_seg *segs;
    int64_t n, T, r, layer;
    int train, split;
} blk_segs;

/* The adapter's share of y (T, out) on one segment's rows, written first (beta = 0):
 * y = scale dropout(x) A^T B^T (+ scale x A0^T B0^T, the frozen correction of a quantized base,
 * adapters/qcorr.h); u (T, r) keeps dropout(x) A^T; xd (T, in) and tmp (T, r) are scratch. */
static int lora_fwd(ft_backend *be, const seg_lora *g, int64_t in, int64_t out, const float *x,
                    float *y, float *u, float *xd, float *tmp, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    const ft_lora_linear *ll = g->ll;
    const float *xin = x;
    if (seg_drops(g)) {
        FT_TRY(o->dropout(be, xd, x, T * in, g->p, g->seed));
        xin = xd;
    }
    FT_TRY(o->gemm(be, 0, 1, T, g->r, in, 1.0f, xin, in, ll->A, in, 0.0f, u, g->r));
    FT_TRY(o->gemm(be, 0, 1, T, out, g->r, g->scale, u, g->r, ll->B, g->r, 0.0f, y, out));
    if (!ll->A0) return 0;
    FT_TRY(o->gemm(be, 0, 1, T, g->r, in, 1.0f, x, in, ll->A0, in, 0.0f, tmp, g->r));
    return o->gemm(be, 0, 1, T, out, g->r, g->scale, tmp, g->r, ll->B0, g->r, 1.0f, y, out);
}

/* y (T, out) = x W^T (+ b) + the adapter's share, on rows of one adapter (or none): the
 * adapter first, and the frozen GEMM then adds into y in its epilogue (beta = 1) instead of a
 * second pass reading and rewriting y (T x out) after it. */
static int lin_fwd_one(ft_backend *be, const ft_linear *w, const seg_lora *g, const float *x,
                       float *y, float *u, float *xd, float *tmp, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    if (g->ll) FT_TRY(lora_fwd(be, g, in, out, x, y, u, xd, tmp, T));
    FT_TRY(o->linear_fwd(be, y, x, base_w(w), w->wtype, T, out, in, g->ll ? 1.0f : 0.0f, xd));
    if (w->b) FT_TRY(o->bias_add(be, y, w->b, T, out));
    return 0;
}

/* Projection pj over the segments' rows: one segment, or b->split (not concat_gemms):
 * lin_fwd_one per segment (each its own frozen GEMM); else each adapter's share on its rows
 * (the rows of segments without one on pj zeroed when some have one), then one frozen GEMM
 * over all rows. */
static int lin_fwd(ft_backend *be, const ft_linear *w, const blk_segs *b, int pj, const float *x,
                   float *y, float *u, float *xd, float *tmp)
{
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    int per_seg = b->n == 1 || b->split, n_lora = 0;
    for (int64_t k = 0; k < b->n && !per_seg; k++)
        n_lora += lora_of(b->segs[k].lora, b->layer, pj) != NULL;
    for (int64_t k = 0; k < b->n; k++) {
        const ft_block_seg *sg = &b->segs[k];
        seg_lora g = seg_lora_of(sg, b->layer, pj, b->train);
        float *yk = y + sg->row0 * out;
        const float *xk = x + sg->row0 * in;
        if (per_seg)
            FT_TRY(lin_fwd_one(be, w, &g, xk, yk, u + sg->row0 * b->r, xd, tmp, sg->T));
        else if (g.ll)
            FT_TRY(lora_fwd(be, &g, in, out, xk, yk, u + sg->row0 * b->r, xd, tmp, sg->T));
        else if (n_lora) /* the GEMM below adds into every row */
            FT_TRY(o->zero(be, yk, (size_t)(sg->T * out) * sizeof(float)));
    }
    if (per_seg) return 0;
    FT_TRY(o->linear_fwd(be, y, x, base_w(w), w->wtype, b->T, out, in, n_lora ? 1.0f : 0.0f, xd));
    if (w->b) FT_TRY(o->bias_add(be, y, w->b, b->T, out));
    return 0;
}

/* dB (out, r) += scale * dy^T u;  du (T, r) = scale * dy B. */
static int lora_bwd_b(ft_backend *be, const seg_lora *g, int64_t out, const float *u,
                      const float *dy, float *du, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    FT_TRY(o->gemm(be, 1, 0, out, g->r, T, g->scale, dy, out, u, g->r, 1.0f, g->ll->dB, g->r));
    return o->gemm(be, 0, 0, T, g->r, out, g->scale, dy, out, g->ll->B, g->r, 0.0f, du, g->r);
}

/* With dropout, after the frozen product: dA (r, in) += du^T dropout(x) and dx += dropout(du A)
 * (xd holds 2*T*in). */
static int lora_bwd_drop(ft_backend *be, const seg_lora *g, int64_t in, const float *x,
                         const float *du, float *dx, float *xd, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    FT_TRY(o->dropout(be, xd, x, T * in, g->p, g->seed));
    FT_TRY(o->gemm(be, 1, 0, g->r, in, T, 1.0f, du, g->r, xd, in, 1.0f, g->ll->dA, in));
    float *dxin = xd + T * in;
    FT_TRY(o->gemm(be, 0, 0, T, in, g->r, 1.0f, du, g->r, g->ll->A, in, 0.0f, dxin, in));
    FT_TRY(o->dropout(be, xd, dxin, T * in, g->p, g->seed));
    return o->axpy(be, 1.0f, xd, dx, T * in);
}

/* The frozen correction's share of dx: dx += scale (dy B0) A0 (du, free again by then, holds
 * dy B0). */
static int lora_bwd_fixed(ft_backend *be, const seg_lora *g, int64_t in, int64_t out,
                          const float *dy, float *dx, float *du, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    if (!g->ll || !g->ll->A0) return 0;
    FT_TRY(o->gemm(be, 0, 0, T, g->r, out, g->scale, dy, out, g->ll->B0, g->r, 0.0f, du, g->r));
    return o->gemm(be, 0, 0, T, in, g->r, 1.0f, du, g->r, g->ll->A0, in, 1.0f, dx, in);
}

/* dx (T, in) = beta * dx + dy W (+ the LoRA path); dA, dB accumulate; rows of one adapter (or
 * none). xd holds 2*T*in. */
static int lin_bwd_one(ft_backend *be, const ft_linear *w, const seg_lora *g, const float *x,
                       const float *u, const float *dy, float *dx, float beta, float *du,
                       float *xd, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    if (!g->ll) return o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, beta, xd);
    FT_TRY(lora_bwd_b(be, g, out, u, dy, du, T));
    if (!seg_drops(g)) {
        /* dA (r, in) += du^T x; then the adapter's share of dx first (dx = du A + beta dx) and
         * the frozen GEMM adding into it in its epilogue (one pass over dx less). */
        FT_TRY(o->gemm(be, 1, 0, g->r, in, T, 1.0f, du, g->r, x, in, 1.0f, g->ll->dA, in));
        FT_TRY(o->gemm(be, 0, 0, T, in, g->r, 1.0f, du, g->r, g->ll->A, in, beta, dx, in));
        FT_TRY(o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, 1.0f, xd));
    } else {
        FT_TRY(o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, beta, xd));
        FT_TRY(lora_bwd_drop(be, g, in, x, du, dx, xd, T));
    }
    return lora_bwd_fixed(be, g, in, out, dy, dx, du, T);
}

/* The backward of projection pj over the segments' rows. One segment, or b->split:
 * lin_bwd_one per segment. Else, per row the ops of lin_bwd_one in its order, with one frozen
 * GEMM over all rows: first each adapter's dB and du (segment k's du at du + row0 * r, kept
 * through the GEMM) and, without dropout, its dA and dx = du A + beta dx; then the GEMM, which
 * adds into those rows (beta 1) and applies beta to the others (with both kinds present, the
 * others' rows are scaled by beta first and the GEMM adds into every row); then the dropout
 * adapters' shares and the frozen corrections. */
static int lin_bwd(ft_backend *be, const ft_linear *w, const blk_segs *b, int pj, const float *x,
                   const float *u, const float *dy, float *dx, float beta, float *du, float *xd)
{
    const ft_backend_ops *o = be->ops;
    const int64_t in = w->in_n, out = w->out_n, R = b->r;
    if (b->n == 1 || b->split) {
        for (int64_t k = 0; k < b->n; k++) {
            const ft_block_seg *sg = &b->segs[k];
            seg_lora g = seg_lora_of(sg, b->layer, pj, 1);
            int64_t r0 = sg->row0;
            FT_TRY(lin_bwd_one(be, w, &g, x + r0 * in, u + r0 * R, dy + r0 * out, dx + r0 * in,
                               beta, du, xd, sg->T));
        }
        return 0;
    }
    int64_t n_lora = 0, n_first = 0; /* adapters on pj; those whose dx share comes first */
    for (int64_t k = 0; k < b->n; k++) {
        seg_lora g = seg_lora_of(&b->segs[k], b->layer, pj, 1);
        n_lora += g.ll != NULL;
        n_first += g.ll && !seg_drops(&g);
    }
    if (!n_lora) return o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, b->T, out, in, beta, xd);
    for (int64_t k = 0; k < b->n; k++) {
        const ft_block_seg *sg = &b->segs[k];
        seg_lora g = seg_lora_of(sg, b->layer, pj, 1);
        int64_t r0 = sg->row0, T = sg->T;
        float *dxk = dx + r0 * in, *duk = du + r0 * R;
        if (g.ll) FT_TRY(lora_bwd_b(be, &g, out, u + r0 * R, dy + r0 * out, duk, T));
        if (g.ll && !seg_drops(&g)) {
            FT_TRY(o->gemm(be, 1, 0, g.r, in, T, 1.0f, duk, g.r, x + r0 * in, in, 1.0f, g.ll->dA,
                           in));
            FT_TRY(o->gemm(be, 0, 0, T, in, g.r, 1.0f, duk, g.r, g.ll->A, in, beta, dxk, in));
        } else if (n_first && beta != 1.0f) { /* the GEMM adds into these rows too */
            if (beta == 0.0f)
                FT_TRY(o->zero(be, dxk, (size_t)(T * in) * sizeof(float)));
            else
                FT_TRY(o->scale(be, dxk, beta, T * in));
        }
    }
    FT_TRY(o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, b->T, out, in, n_first ? 1.0f : beta,
                           xd));
    for (int64_t k = 0; k < b->n; k++) {
        const ft_block_seg *sg = &b->segs[k];
        seg_lora g = seg_lora_of(sg, b->layer, pj, 1);
        int64_t r0 = sg->row0;
        if (g.ll && seg_drops(&g))
            FT_TRY(lora_bwd_drop(be, &g, in, x + r0 * in, du + r0 * R, dx + r0 * in, xd, sg->T));
    }
    for (int64_t k = 0; k < b->n; k++) {
        const ft_block_seg *sg = &b->segs[k];
        seg_lora g = seg_lora_of(sg, b->layer, pj, 1);
        int64_t r0 = sg->row0;
        FT_TRY(lora_bwd_fixed(be, &g, in, out, dy + r0 * out, dx + r0 * in, du + r0 * R, sg->T));
    }
    return 0;
}

/* Checks the segments of a block call and fills *b. */
static int segs_of(blk_segs *b, const ft_block_dims *d, const ft_block_io *io,
                   const ft_block_seg *segs, int64_t n, int64_t layer, int train)
{
    *b = (blk_segs){segs, n, d->T, d->r, layer, train, !io->concat_gemms};
    if (n < 1 || !segs)
        return ft_err(FT_E_INVALID, "block: %lld segments", (long long)n);
    int64_t next = 0;
    for (int64_t k = 0; k < n; k++) {
        const ft_block_seg *g = &segs[k];
        if (g->row0 != next || g->T < 0 || g->T > d->T - next)
            return ft_err(FT_E_INVALID, "block: segment %lld is rows [%lld, +%lld), expected to "
                          "start at row %lld within the %lld rows", (long long)k,
                          (long long)g->row0, (long long)g->T, (long long)next, (long long)d->T);
        if (g->lora && g->lora->cfg.r > d->r)
            return ft_err(FT_E_INVALID, "block: segment %lld's adapter has rank %lld, the "
                          "activations hold rank %lld", (long long)k, (long long)g->lora->cfg.r,
                          (long long)d->r);
        next += g->T;
    }
    if (next != d->T)
        return ft_err(FT_E_INVALID, "block: the segments cover %lld of the %lld rows",
                      (long long)next, (long long)d->T);
    return 0;
}

/* With qk_norm: the q and k attention reads, from the projections a->q / a->k (T, H, D) /
 * (T, Hkv, D): qn = rope(rmsnorm_per_head(q) * q_norm) into s->d2, kn likewise into s->xd
 * (both at least T * max(C, H*D, F) floats); the 1/rms per (token, head) go to rq / rk
 * (T*H, T*Hkv floats). The forward and the backward's recompute call this alike, so both
 * see the same bits. */
static int qk_normed(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                     const ft_block_dims *d, const ft_block_io *io, const ft_block_acts *a,
                     ft_block_scratch *s, float *rq, float *rk)
{
    const ft_backend_ops *o = be->ops;
    int64_t T = d->T, H = d->H, Hkv = d->Hkv, D = d->D;
    if (!w->q_norm || !w->k_norm)
        return ft_err(FT_E_INVALID, "block: the model normalizes q and k per head (qk_norm) but "
                      "the layer has no q_norm/k_norm weights");
    FT_TRY(o->rmsnorm_fwd(be, s->d2, rq, a->q, w->q_norm, T * H, D, cfg->rms_norm_eps));
    FT_TRY(o->rmsnorm_fwd(be, s->xd, rk, a->k, w->k_norm, T * Hkv, D, cfg->rms_norm_eps));
    FT_TRY(o->rope_fwd(be, s->d2, io->pos, io->inv_freq, T, H, D));
    return o->rope_fwd(be, s->xd, io->pos, io->inv_freq, T, Hkv, D);
}

int ft_block_fwd(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                 const ft_lora *lora, int64_t layer, const ft_block_dims *d,
                 const ft_block_io *io, const float *x, float *out, ft_block_acts *a,
                 ft_block_scratch *s, int train)
{
    ft_block_seg one = {lora, 0, d->T, io->dropout_seed};
    return ft_block_fwd_segs(be, cfg, w, layer, d, io, &one, 1, x, out, a, s, train);
}

int ft_block_bwd(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                 const ft_lora *lora, int64_t layer, const ft_block_dims *d,
                 const ft_block_io *io, const float *x, const float *dout, float *dx,
                 const ft_block_acts *a, ft_block_scratch *s)
{
    ft_block_seg one = {lora, 0, d->T, io->dropout_seed};
    return ft_block_bwd_segs(be, cfg, w, layer, d, io, &one, 1, x, dout, dx, a, s);
}

int ft_block_fwd_segs(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                      int64_t layer, const ft_block_dims *d, const ft_block_io *io,
                      const ft_block_seg *segs, int64_t n, const float *x, float *out,
                      ft_block_acts *a, ft_block_scratch *s, int train)
{
    const ft_backend_ops *o = be->ops;
    int64_t T = d->T, C = d->C, H = d->H, Hkv = d->Hkv, D = d->D, F = d->F;
    blk_segs b;
    FT_TRY(segs_of(&b, d, io, segs, n, layer, train));

    FT_TRY(o->rmsnorm_fwd(be, a->xn1, a->rstd1, x, w->attn_norm, T, C, cfg->rms_norm_eps));
    float *qkv[3] = {a->q, a->k, a->v};
    for (int pj = FT_Q; pj <= FT_V; pj++)
        FT_TRY(lin_fwd(be, &w->proj[pj], &b, pj, a->xn1, qkv[pj], a->u[pj], s->xd, s->du));
    const float *qa = a->q, *ka = a->k; /* what attention reads */
    if (cfg->qk_norm) {
        /* a->q / a->k keep the projections for the norm's backward */
        FT_TRY(qk_normed(be, cfg, w, d, io, a, s, a->rstd_q, a->rstd_k));
        qa = s->d2;
        ka = s->xd;
    } else {
        FT_TRY(o->rope_fwd(be, a->q, io->pos, io->inv_freq, T, H, D));
        FT_TRY(o->rope_fwd(be, a->k, io->pos, io->inv_freq, T, Hkv, D));
    }
    for (int64_t k = 0; k < n; k++) { /* per segment: see ft_block_seg */
        int64_t r0 = segs[k].row0;
        FT_TRY(o->attention_fwd(be, a->att + r0 * H * D, a->lse + r0 * H, qa + r0 * H * D,
                                ka + r0 * Hkv * D, a->v + r0 * Hkv * D, io->seq_start + r0,
                                segs[k].T, H, Hkv, D, attn_scale(cfg, D)));
    }
    FT_TRY(lin_fwd(be, &w->proj[FT_O], &b, FT_O, a->att, a->h, a->u[FT_O], s->xd, s->du));
    FT_TRY(o->axpy(be, 1.0f, x, a->h, T * C));

    FT_TRY(o->rmsnorm_fwd(be, a->xn2, a->rstd2, a->h, w->ffn_norm, T, C, cfg->rms_norm_eps));
    FT_TRY(lin_fwd(be, &w->proj[FT_GATE], &b, FT_GATE, a->xn2, a->gate, a->u[FT_GATE], s->xd,
                   s->du));
    FT_TRY(lin_fwd(be, &w->proj[FT_UP], &b, FT_UP, a->xn2, a->up, a->u[FT_UP], s->xd, s->du));
    FT_TRY(o->swiglu_fwd(be, a->act, a->gate, a->up, T * F));
    FT_TRY(lin_fwd(be, &w->proj[FT_DOWN], &b, FT_DOWN, a->act, out, a->u[FT_DOWN], s->xd, s->du));
    return o->axpy(be, 1.0f, a->h, out, T * C);
}

int ft_block_bwd_segs(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                      int64_t layer, const ft_block_dims *d, const ft_block_io *io,
                      const ft_block_seg *segs, int64_t n, const float *x, const float *dout,
                      float *dx, const ft_block_acts *a, ft_block_scratch *s)
{
    const ft_backend_ops *o = be->ops;
    int64_t T = d->T, C = d->C, H = d->H, Hkv = d->Hkv, D = d->D, F = d->F;
    blk_segs b;
    FT_TRY(segs_of(&b, d, io, segs, n, layer, 1));
#define LIN_BWD(pj, xin, dy, dxo, beta)                                                       \
    FT_TRY(lin_bwd(be, &w->proj[pj], &b, pj, xin, a->u[pj], dy, dxo, beta, s->du, s->xd))

    /* MLP: d(act) = dout W_down; SwiGLU; d(xn2) from gate and up. */
    LIN_BWD(FT_DOWN, a->act, dout, s->d1, 0.0f);
    FT_TRY(o->swiglu_bwd(be, s->dgate, s->dup, s->d1, a->gate, a->up, T * F));
    LIN_BWD(FT_GATE, a->xn2, s->dgate, s->d2, 0.0f);
    LIN_BWD(FT_UP, a->xn2, s->dup, s->d2, 1.0f);
    /* dh = dout + rms2_bwd(d xn2), held in dx. */
    if (dx != dout) FT_TRY(o->copy(be, dx, dout, (size_t)(T * C) * sizeof(float)));
    FT_TRY(o->rmsnorm_bwd(be, dx, s->d2, a->h, w->ffn_norm, a->rstd2, T, C));

    /* Attention: d(att) = dh W_o; attention backward; inverse RoPE; q/k/v projections. */
    LIN_BWD(FT_O, a->att, dx, s->d1, 0.0f);
    const float *qa = a->q, *ka = a->k;
    if (cfg->qk_norm) {
        /* the normalized, rotated q/k again (d2, xd: free until the projections' backward);
         * the 1/rms it writes go to dq/dk, overwritten by attention_bwd next */
        FT_TRY(qk_normed(be, cfg, w, d, io, a, s, s->dq, s->dk));
        qa = s->d2;
        ka = s->xd;
    }
    for (int64_t k = 0; k < n; k++) { /* per segment, as the forward */
        int64_t r0 = segs[k].row0, q0 = r0 * H * D, k0 = r0 * Hkv * D;
        FT_TRY(o->attention_bwd(be, s->dq + q0, s->dk + k0, s->dv + k0, s->d1 + q0, qa + q0,
                                ka + k0, a->v + k0, a->att + q0, a->lse + r0 * H,
                                io->seq_start + r0, segs[k].T, H, Hkv, D, attn_scale(cfg, D)));
    }
    FT_TRY(o->rope_bwd(be, s->dq, io->pos, io->inv_freq, T, H, D));
    FT_TRY(o->rope_bwd(be, s->dk, io->pos, io->inv_freq, T, Hkv, D));
    const float *dq = s->dq, *dk = s->dk;
    if (cfg->qk_norm) {
        /* through the per-head norms (rmsnorm_bwd adds into its dx: d1, zeroed, free since
         * attention_bwd read it); q's before k's, as d1 holds one at a time */
        FT_TRY(o->zero(be, s->d1, (size_t)(T * H * D) * sizeof(float)));
        FT_TRY(o->rmsnorm_bwd(be, s->d1, s->dq, a->q, w->q_norm, a->rstd_q, T * H, D));
        dq = s->d1;
    }
    LIN_BWD(FT_Q, a->xn1, dq, s->d2, 0.0f);
    if (cfg->qk_norm) {
        FT_TRY(o->zero(be, s->d1, (size_t)(T * Hkv * D) * sizeof(float)));
        FT_TRY(o->rmsnorm_bwd(be, s->d1, s->dk, a->k, w->k_norm, a->rstd_k, T * Hkv, D));
        dk = s->d1;
    }
    LIN_BWD(FT_K, a->xn1, dk, s->d2, 1.0f);
    LIN_BWD(FT_V, a->xn1, s->dv, s->d2, 1.0f);
    /* dx = dh + rms1_bwd(d xn1) */
    return o->rmsnorm_bwd(be, dx, s->d2, x, w->attn_norm, a->rstd1, T, C);
#undef LIN_BWD
}
