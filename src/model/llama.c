/* llama.c - Llama decoder block forward/backward over the op table (see llama.h). */
#include "src/model/llama.h"

#include <math.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/align.h"

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
static uint64_t proj_seed(uint64_t base, int64_t layer, int p)
{
    if (!base) return 0;
    uint64_t x = base ^ ((uint64_t)layer * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)(p + 1) << 56);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (x ^ (x >> 29)) | 1;
}

/* The frozen weight as linear_fwd/linear_bwd_x take it (kernels.h enum ft_wtype). */
static const void *base_w(const ft_linear *w)
{
    return w->wtype == FT_W_NF4 ? (const void *)w->nf4 : (const void *)w->w;
}

/* y (T, out) = x W^T (+ b) + scale * dropout(x) A^T B^T (+ scale x A0^T B0^T, the frozen
 * correction of a quantized base, adapters/qcorr.h); u (T, r) keeps dropout(x) A^T; tmp
 * (T, r) is scratch. */
static int lin_fwd(ft_backend *be, const ft_linear *w, const ft_lora_linear *ll, float scale,
                   int64_t r, float p, uint64_t seed, const float *x, float *y, float *u,
                   float *xd, float *tmp, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    float beta = 0.0f;
    if (ll) {
        /* The adapter first: y = scale u B^T is written once, and the frozen GEMM then adds
         * into it in its epilogue (beta = 1) instead of a second pass reading and rewriting
         * y (T x out) after it. */
        const float *xin = x;
        if (p > 0 && seed) {
            FT_TRY(o->dropout(be, xd, x, T * in, p, seed));
            xin = xd;
        }
        FT_TRY(o->gemm(be, 0, 1, T, r, in, 1.0f, xin, in, ll->A, in, 0.0f, u, r));
        FT_TRY(o->gemm(be, 0, 1, T, out, r, scale, u, r, ll->B, r, 0.0f, y, out));
        beta = 1.0f;
    }
    if (ll && ll->A0) {
        FT_TRY(o->gemm(be, 0, 1, T, r, in, 1.0f, x, in, ll->A0, in, 0.0f, tmp, r));
        FT_TRY(o->gemm(be, 0, 1, T, out, r, scale, tmp, r, ll->B0, r, beta, y, out));
    }
    FT_TRY(o->linear_fwd(be, y, x, base_w(w), w->wtype, T, out, in, beta, xd));
    if (w->b) FT_TRY(o->bias_add(be, y, w->b, T, out));
    return 0;
}

/* dx (T, in) = beta * dx + dy W (+ the LoRA path); dA, dB accumulate. xd holds 2*T*in. */
static int lin_bwd_main(ft_backend *be, const ft_linear *w, const ft_lora_linear *ll, float scale,
                   int64_t r, float p, uint64_t seed, const float *x, const float *u,
                   const float *dy, float *dx, float beta, float *du, float *xd, int64_t T)
{
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    if (!ll) return o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, beta, xd);
    /* dB (out, r) += scale * dy^T u;  du (T, r) = scale * dy B */
    FT_TRY(o->gemm(be, 1, 0, out, r, T, scale, dy, out, u, r, 1.0f, ll->dB, r));
    FT_TRY(o->gemm(be, 0, 0, T, r, out, scale, dy, out, ll->B, r, 0.0f, du, r));
    int drop = p > 0 && seed;
    if (!drop) {
        /* dA (r, in) += du^T x; then the adapter's share of dx first (dx = du A + beta dx) and
         * the frozen GEMM adding into it in its epilogue (one pass over dx less). */
        FT_TRY(o->gemm(be, 1, 0, r, in, T, 1.0f, du, r, x, in, 1.0f, ll->dA, in));
        FT_TRY(o->gemm(be, 0, 0, T, in, r, 1.0f, du, r, ll->A, in, beta, dx, in));
        return o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, 1.0f, xd);
    }
    FT_TRY(o->linear_bwd_x(be, dx, dy, base_w(w), w->wtype, T, out, in, beta, xd));
    /* dA (r, in) += du^T dropout(x) */
    FT_TRY(o->dropout(be, xd, x, T * in, p, seed));
    FT_TRY(o->gemm(be, 1, 0, r, in, T, 1.0f, du, r, xd, in, 1.0f, ll->dA, in));
    float *dxin = xd + T * in;
    FT_TRY(o->gemm(be, 0, 0, T, in, r, 1.0f, du, r, ll->A, in, 0.0f, dxin, in));
    FT_TRY(o->dropout(be, xd, dxin, T * in, p, seed));
    return o->axpy(be, 1.0f, xd, dx, T * in);
}

/* lin_bwd_main, then the frozen correction's share of dx: dx += scale (dy B0) A0 (du, free
 * again by then, holds dy B0). */
static int lin_bwd(ft_backend *be, const ft_linear *w, const ft_lora_linear *ll, float scale,
                   int64_t r, float p, uint64_t seed, const float *x, const float *u,
                   const float *dy, float *dx, float beta, float *du, float *xd, int64_t T)
{
    FT_TRY(lin_bwd_main(be, w, ll, scale, r, p, seed, x, u, dy, dx, beta, du, xd, T));
    if (!ll || !ll->A0) return 0;
    const ft_backend_ops *o = be->ops;
    int64_t in = w->in_n, out = w->out_n;
    FT_TRY(o->gemm(be, 0, 0, T, r, out, scale, dy, out, ll->B0, r, 0.0f, du, r));
    return o->gemm(be, 0, 0, T, in, r, 1.0f, du, r, ll->A0, in, 1.0f, dx, in);
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
    const ft_backend_ops *o = be->ops;
    int64_t T = d->T, C = d->C, H = d->H, Hkv = d->Hkv, D = d->D, F = d->F;
    float sc = lora ? lora->scale : 0.0f, p = (lora && train) ? lora->cfg.dropout : 0.0f;
    uint64_t seed = train ? io->dropout_seed : 0;
    int64_t r = d->r;

    FT_TRY(o->rmsnorm_fwd(be, a->xn1, a->rstd1, x, w->attn_norm, T, C, cfg->rms_norm_eps));
    float *qkv[3] = {a->q, a->k, a->v};
    for (int pj = FT_Q; pj <= FT_V; pj++)
        FT_TRY(lin_fwd(be, &w->proj[pj], lora_of(lora, layer, pj), sc, r, p,
                       proj_seed(seed, layer, pj), a->xn1, qkv[pj], a->u[pj], s->xd, s->du, T));
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
    FT_TRY(o->attention_fwd(be, a->att, a->lse, qa, ka, a->v, io->seq_start, T, H, Hkv, D,
                            attn_scale(cfg, D)));
    FT_TRY(lin_fwd(be, &w->proj[FT_O], lora_of(lora, layer, FT_O), sc, r, p,
                   proj_seed(seed, layer, FT_O), a->att, a->h, a->u[FT_O], s->xd, s->du, T));
    FT_TRY(o->axpy(be, 1.0f, x, a->h, T * C));

    FT_TRY(o->rmsnorm_fwd(be, a->xn2, a->rstd2, a->h, w->ffn_norm, T, C, cfg->rms_norm_eps));
    FT_TRY(lin_fwd(be, &w->proj[FT_GATE], lora_of(lora, layer, FT_GATE), sc, r, p,
                   proj_seed(seed, layer, FT_GATE), a->xn2, a->gate, a->u[FT_GATE], s->xd, s->du, T));
    FT_TRY(lin_fwd(be, &w->proj[FT_UP], lora_of(lora, layer, FT_UP), sc, r, p,
                   proj_seed(seed, layer, FT_UP), a->xn2, a->up, a->u[FT_UP], s->xd, s->du, T));
    FT_TRY(o->swiglu_fwd(be, a->act, a->gate, a->up, T * F));
    FT_TRY(lin_fwd(be, &w->proj[FT_DOWN], lora_of(lora, layer, FT_DOWN), sc, r, p,
                   proj_seed(seed, layer, FT_DOWN), a->act, out, a->u[FT_DOWN], s->xd, s->du, T));
    return o->axpy(be, 1.0f, a->h, out, T * C);
}

int ft_block_bwd(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                 const ft_lora *lora, int64_t layer, const ft_block_dims *d,
                 const ft_block_io *io, const float *x, const float *dout, float *dx,
                 const ft_block_acts *a, ft_block_scratch *s)
{
    const ft_backend_ops *o = be->ops;
    int64_t T = d->T, C = d->C, H = d->H, Hkv = d->Hkv, D = d->D, F = d->F, r = d->r;
    float sc = lora ? lora->scale : 0.0f, p = lora ? lora->cfg.dropout : 0.0f;
    uint64_t seed = io->dropout_seed;
#define LIN_BWD(pj, xin, dy, dxo, beta)                                                       \
    FT_TRY(lin_bwd(be, &w->proj[pj], lora_of(lora, layer, pj), sc, r, p,                      \
                   proj_seed(seed, layer, pj), xin, a->u[pj], dy, dxo, beta, s->du, s->xd, T))

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
    FT_TRY(o->attention_bwd(be, s->dq, s->dk, s->dv, s->d1, qa, ka, a->v, a->att, a->lse,
                            io->seq_start, T, H, Hkv, D, attn_scale(cfg, D)));
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
