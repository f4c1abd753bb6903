/* exec_step.c - the executor's schedule (exec.h): an operation's forward over every layer for
 * all its micro-batches, the head, the backward. The micro-batches of an operation are passes
 * (exec.h ft_exec_train_step_multi): pass micro-batch i holds micro-batch i of each adapter
 * that has one, as segments one after another (src/model/llama.h ft_block_seg); a
 * one-adapter operation (ft_exec_train_step, ft_exec_eval, ...) is the pass of one segment per
 * micro-batch, which the block runs with its one-adapter ops. Checkpoints are addressed
 * through ck_*() below: in the arena by default ((L + 1) * n_micro buffers), or through the
 * host tier (offload/actckpt.h) when e->ckt is set. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "offload/actckpt.h"
#include "offload/exec_internal.h"
#include "offload/timeline.h"
#include "src/core/err.h"

/* Checkpoints: ck_*() give the device buffers of checkpoint j (micro-batch mb at
 * + mb * ck_stride(e)): the arena's when every checkpoint stays on the device, the host
 * tier's otherwise (offload/actckpt.h; its hooks order the copies around compute). */
static int64_t ck_stride(const ft_exec *e) { return e->T_max * e->m->cfg.hidden_size; }

/* Floats between micro-batches in e->dx: T_max x hidden rounded up to 16 (exec.c plan). */
static int64_t dx_stride(const ft_exec *e)
{
    return ft_pad16(e->T_max * e->m->cfg.hidden_size);
}

static int ck_write(ft_exec *e, int64_t j, float **out)
{
    if (e->ckt) return ft_actckpt_write(e, j, out);
    *out = e->ckpt + j * e->n_micro_max * ck_stride(e);
    return 0;
}

static int ck_read(ft_exec *e, int64_t j, float **at)
{
    if (e->ckt) return ft_actckpt_read(e, j, at);
    *at = e->ckpt + j * e->n_micro_max * ck_stride(e);
    return 0;
}

static int ck_written(ft_exec *e, int64_t j) { return e->ckt ? ft_actckpt_written(e, j) : 0; }
static int ck_used(ft_exec *e, int64_t j) { return e->ckt ? ft_actckpt_used(e, j) : 0; }

/* ---- passes ------------------------------------------------------------------------------ */

/* The dropout seed of an adapter's micro-batch mb (0: no dropout). */
static uint64_t mb_seed(uint64_t seed, int64_t mb)
{
    return seed ? seed ^ ((uint64_t)(mb + 1) * 0xd1b54a32d192ed03ull) : 0;
}

/* Segment k of pass micro-batch mb, its step and that step's micro-batch. */
static const ft_block_seg *seg_at(const ft_exec *e, int64_t mb, int64_t k)
{
    return &e->op_segs[mb * e->n_adapters + k];
}

static const ft_exec_adapter_step *seg_step(const ft_exec *e, const ft_exec_adapter_step *st,
                                            int64_t mb, int64_t k)
{
    return &st[e->op_seg_step[mb * e->n_adapters + k]];
}

static const ft_batch *seg_batch(const ft_exec *e, const ft_exec_adapter_step *st, int64_t mb,
                                 int64_t k)
{
    return &seg_step(e, st, mb, k)->mbs[mb];
}

/* Checks K steps against the executor's sizes (before any work, so that bad input stops no
 * operation half way) and lays out the passes in e->op_*: *n_pass = the most micro-batches of
 * a step. train: every step needs an adapter, and dropout seeds apply. */
static int plan_passes(ft_exec *e, const ft_exec_adapter_step *st, int64_t K, int train,
                       int64_t *n_pass)
{
    if (K < 1 || K > e->n_adapters || !st)
        return ft_err(FT_E_RANGE, "a pass of %lld adapters: the executor was made for 1..%lld",
                      (long long)K, (long long)e->n_adapters);
    int64_t n = 0;
    for (int64_t k = 0; k < K; k++) {
        const ft_exec_adapter_step *s = &st[k];
        if (s->n_mb < 1 || s->n_mb > e->n_micro_max)
            return ft_err(FT_E_RANGE, "step of %lld micro-batches exceeds the planned %lld",
                          (long long)s->n_mb, (long long)e->n_micro_max);
        if (train && !s->lora) return ft_err(FT_E_INVALID, "train step without an adapter");
        if (!s->mbs)
            return ft_err(FT_E_INVALID, "adapter %lld's step has no micro-batches", (long long)k);
        if (s->lora && s->lora->cfg.r > e->r_max)
            return ft_err(FT_E_INVALID, "adapter %lld has rank %lld, the executor was made for "
                          "ranks up to %lld", (long long)k, (long long)s->lora->cfg.r,
                          (long long)e->r_max);
        for (int64_t j = 0; j < k && s->lora; j++)
            if (st[j].lora == s->lora)
                return ft_err(FT_E_INVALID, "adapters %lld and %lld of a pass are the same adapter",
                              (long long)j, (long long)k);
        for (int64_t mb = 0; mb < s->n_mb; mb++)
            if (s->mbs[mb].T > e->adapter_T_max || s->mbs[mb].T < 0)
                return ft_err(FT_E_RANGE, "micro-batch of %lld tokens exceeds the planned %lld",
                              (long long)s->mbs[mb].T, (long long)e->adapter_T_max);
        if (s->n_mb > n) n = s->n_mb;
    }
    for (int64_t mb = 0; mb < n; mb++) {
        int64_t rows = 0, ns = 0;
        for (int64_t k = 0; k < K; k++) {
            if (mb >= st[k].n_mb) continue;
            int64_t i = mb * e->n_adapters + ns++;
            uint64_t seed = train ? mb_seed(st[k].dropout_seed, e->mb_base + mb) : 0;
            e->op_segs[i] = (ft_block_seg){st[k].lora, rows, st[k].mbs[mb].T, seed};
            e->op_seg_step[i] = k;
            rows += st[k].mbs[mb].T;
        }
        e->op_rows[mb] = rows;
        e->op_nseg[mb] = ns;
    }
    *n_pass = n;
    return 0;
}

/* A one-adapter operation's step: e->lora (may be NULL), e's NEFTune settings. */
static ft_exec_adapter_step one_step(const ft_exec *e, const ft_batch *mbs, int64_t n_mb,
                                     int64_t grad_norm_tokens, uint64_t seed, double *loss_sum,
                                     int64_t *n_tokens)
{
    return (ft_exec_adapter_step){e->lora, mbs, n_mb, grad_norm_tokens, seed, e->neftune_alpha,
                                  e->neftune_seed, loss_sum, n_tokens};
}

/* Micro-batch b's token arrays into rows [row0, row0 + T) of pass micro-batch mb. */
static int upload(ft_exec *e, const ft_batch *b, int64_t mb, int64_t row0)
{
    ft_backend *be = e->be;
    size_t n = (size_t)b->T * sizeof(int32_t);
    int64_t o = mb * e->T_max + row0;
    FT_TRY(be->ops->copy(be, e->ids + o, b->ids, n));
    FT_TRY(be->ops->copy(be, e->targets + o, b->targets, n));
    FT_TRY(be->ops->copy(be, e->pos + o, b->pos, n));
    return be->ops->copy(be, e->seq_start + o, b->seq_start, n);
}

/* The block inputs of pass micro-batch mb (each segment's seq_start counts from its first
 * row, as uploaded; the segments carry their dropout seeds). */
static ft_block_io io_of(ft_exec *e, int64_t mb)
{
    ft_block_io io = {e->pos + mb * e->T_max, e->seq_start + mb * e->T_max, e->inv_freq, 0,
                      e->concat_gemms};
    return io;
}

/* NEFTune (Jain et al. 2023, arXiv 2310.05914; transformers' neftune_post_forward_hook):
 * adds uniform(-mag, mag) noise to the embeddings x (T, C) of an adapter's training
 * micro-batch mb, where the hook's mag = alpha / sqrt(L * d) for a (B, L, d) embedding output.
 * ftune packs examples into rows of seq_len tokens (as TRL with packing), so L = the batch's
 * seq_len (T when a hand-made batch leaves it 0) and d = hidden_size. The draw is a pure
 * function of (seed, mb, element): a resumed run draws the same noise, an adapter draws the
 * same whatever else shares its pass, and as the noise lands before checkpoint 0 is stored
 * (ck_written), the backward of layer 0 (its recompute, or the kept activations) starts from
 * the same noisy values. The embedding is frozen, so the backward needs nothing else: the
 * noise is additive. */
static int neftune(ft_exec *e, const ft_batch *b, int64_t mb, float *x, double alpha,
                   uint64_t nseed)
{
    const int64_t C = e->m->cfg.hidden_size;
    if (b->T < 1) return 0;
    const int64_t L = b->seq_len > 0 ? b->seq_len : b->T;
    const float mag = (float)(alpha / sqrt((double)L * (double)C));
    /* another odd constant than mb_seed's: the noise of micro-batch mb is unrelated to the
     * dropout masks even when the two seeds coincide */
    const uint64_t seed = nseed ^ ((uint64_t)(e->mb_base + mb + 1) * 0x9e6c63d0676a9a99ull);
    return e->be->ops->noise_uniform_add(e->be, x, b->T * C, mag, seed);
}

/* Forward of all layers for the n_pass pass micro-batches planned in e->op_*, vertical order;
 * checkpoint L holds each final hidden state. With train, the embeddings of each step with
 * neftune_alpha > 0 get its NEFTune noise. */
static int forward_all(ft_exec *e, const ft_exec_adapter_step *st, int64_t n_pass, int train)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    const int64_t C = c->hidden_size, sd = ck_stride(e);
    FT_TRY(ft_exec_globals_f32(e)); /* a pack-only model on the host: its fp32 tables, once */
    for (int64_t mb = 0; mb < n_pass; mb++)
        for (int64_t k = 0; k < e->op_nseg[mb]; k++)
            FT_TRY(upload(e, seg_batch(e, st, mb, k), mb, seg_at(e, mb, k)->row0));
    if (e->ckt) ft_actckpt_begin(e, e->op_rows, n_pass, train);
    float *x0;
    FT_TRY(ck_write(e, 0, &x0));
    for (int64_t mb = 0; mb < n_pass; mb++)
        for (int64_t k = 0; k < e->op_nseg[mb]; k++) {
            const ft_exec_adapter_step *s = seg_step(e, st, mb, k);
            const ft_batch *b = &s->mbs[mb];
            int64_t r0 = seg_at(e, mb, k)->row0;
            float *x = x0 + mb * sd + r0 * C;
            if (!e->embed) /* a pack-only model on a device: rows gathered from the pack file */
                FT_TRY(ft_exec_embed_from_pack(e, b->ids, b->T, x));
            else
                FT_TRY(be->ops->embedding_fwd(be, x, e->ids + mb * e->T_max + r0, e->embed, b->T,
                                              C, c->vocab_size));
            if (train && s->neftune_alpha > 0)
                FT_TRY(neftune(e, b, mb, x, s->neftune_alpha, s->neftune_seed));
        }
    FT_TRY(ft_exec_begin_op(e, train)); /* the layer order, for prefetching and the timeline */
    FT_TRY(ck_written(e, 0)); /* its store: after the timeline's origin */
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const ft_layer_weights *w;
        float *x, *y;
        FT_TRY(ft_exec_fetch_layer(e, l, &w));
        FT_TRY(ck_read(e, l, &x));
        FT_TRY(ck_write(e, l + 1, &y));
        int mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_FWD, l);
        for (int64_t mb = 0; mb < n_pass; mb++) {
            ft_block_dims d = ft_exec_dims(e, e->op_rows[mb]);
            ft_block_io io = io_of(e, mb);
            ft_block_acts *a = train && e->kept ? &e->kept[l * e->n_micro_max + mb] : &e->acts;
            FT_TRY(ft_block_fwd_segs(be, c, w, l, &d, &io, seg_at(e, mb, 0), e->op_nseg[mb],
                                     x + mb * sd, y + mb * sd, a, &e->scr, train));
        }
        ft_exec_tl_end(e, mk);
        FT_TRY(ck_used(e, l));
        FT_TRY(ck_written(e, l + 1));
    }
    return 0;
}

/* The backward of all layers for the planned passes, from the d(final hidden) in e->dx that
 * the head left. */
static int backward_all(ft_exec *e, int64_t n_pass)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    if (e->ckt) FT_TRY(ft_actckpt_bwd_begin(e));
    int64_t sd = ck_stride(e);
    for (int64_t l = c->num_hidden_layers - 1; l >= 0; l--) {
        const ft_layer_weights *w;
        float *xl, *out;
        FT_TRY(ft_exec_fetch_layer(e, l, &w));
        if (e->ckt) {
            FT_TRY(ft_actckpt_bwd_in(e, l, &xl));
            out = e->xf; /* the recompute's output is not used: the head's scratch takes it */
        } else {
            FT_TRY(ck_read(e, l, &xl));
            FT_TRY(ck_read(e, l + 1, &out)); /* checkpoint l+1 is no longer needed */
        }
        int mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_BWD, l);
        for (int64_t mb = 0; mb < n_pass; mb++) {
            ft_block_dims d = ft_exec_dims(e, e->op_rows[mb]);
            ft_block_io io = io_of(e, mb);
            const ft_block_seg *sg = seg_at(e, mb, 0);
            int64_t ns = e->op_nseg[mb];
            const float *x = xl + mb * sd;
            float *dx = e->dx + mb * dx_stride(e);
            ft_block_acts *a = &e->acts;
            if (e->kept)
                a = &e->kept[l * e->n_micro_max + mb];
            else /* recompute */
                FT_TRY(ft_block_fwd_segs(be, c, w, l, &d, &io, sg, ns, x,
                                         e->ckt ? out : out + mb * sd, a, &e->scr, 1));
            FT_TRY(ft_block_bwd_segs(be, c, w, l, &d, &io, sg, ns, x, dx, dx, a, &e->scr));
        }
        ft_exec_tl_end(e, mk);
        if (e->ckt) FT_TRY(ft_actckpt_bwd_done(e, l));
    }
    return ft_exec_op_end(e);
}

/* ---- heads ------------------------------------------------------------------------------- */

/* The start of a head: micro-batch mb's final hidden state (checkpoint L) into *xL, the
 * timeline mark into *mk, and the final norm of its T rows into e->xf / e->rstdf. */
static int head_begin(ft_exec *e, int64_t T, int64_t mb, float **xL, int *mk)
{
    const ft_model_config *c = &e->m->cfg;
    FT_TRY(ck_read(e, c->num_hidden_layers, xL));
    *xL += mb * ck_stride(e);
    *mk = ft_exec_tl_begin(e, FT_TL_COMPUTE, FT_TL_HEAD, -1);
    return e->be->ops->rmsnorm_fwd(e->be, e->xf, e->rstdf, *xL, e->final_norm, T, c->hidden_size,
                                   c->rms_norm_eps);
}

/* The end of a head: with dx, the gradient in e->dxf (T rows) through the final norm into dx
 * (T, C); then the timeline mark mk closes and checkpoint L is released. */
static int head_end(ft_exec *e, int64_t T, const float *xL, float *dx, int mk)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t C = c->hidden_size;
    if (dx) {
        FT_TRY(be->ops->zero(be, dx, (size_t)(T * C) * sizeof(float)));
        FT_TRY(be->ops->rmsnorm_bwd(be, dx, e->dxf, xL, e->final_norm, e->rstdf, T, C));
    }
    ft_exec_tl_end(e, mk);
    return ck_used(e, c->num_hidden_layers);
}

/* Final norm + LM head + CE of pass micro-batch mb: the norm over all its rows, the LM head +
 * CE per segment on its rows (the call a micro-batch of its adapter alone gets), with its
 * step's gradient scale 1 / grad_norm_tokens; each segment's loss sum and target count add
 * to its step's e->op_loss / op_ntok. dx (NULL: no gradient) gets d(final hidden). */
static int head(ft_exec *e, const ft_exec_adapter_step *st, int64_t mb, float *dx)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    const int64_t C = c->hidden_size, T = e->op_rows[mb];
    float *xL;
    int mk;
    FT_TRY(head_begin(e, T, mb, &xL, &mk));
    for (int64_t k = 0; k < e->op_nseg[mb]; k++) {
        const ft_block_seg *sg = seg_at(e, mb, k);
        int64_t j = e->op_seg_step[mb * e->n_adapters + k], gnt = st[j].grad_norm_tokens;
        float gs = dx && gnt > 0 ? 1.0f / (float)gnt : 0.0f;
        double ls = 0;
        int64_t nv = 0;
        FT_TRY(be->ops->lm_head_ce(be, &ls, &nv, dx ? e->dxf + sg->row0 * C : NULL,
                                   e->xf + sg->row0 * C, e->lm_head,
                                   e->targets + mb * e->T_max + sg->row0, sg->T, C, c->vocab_size,
                                   gs, e->ce_scratch, e->ce_chunk));
        e->op_loss[j] += ls;
        e->op_ntok[j] += nv;
    }
    return head_end(e, T, xL, dx, mk);
}

/* The K steps' loss sums and counts (e->op_loss / op_ntok) to their outputs. */
static void put_losses(ft_exec *e, const ft_exec_adapter_step *st, int64_t K)
{
    for (int64_t k = 0; k < K; k++) {
        if (st[k].loss_sum) *st[k].loss_sum = e->op_loss[k];
        if (st[k].n_tokens) *st[k].n_tokens = e->op_ntok[k];
    }
}

static void zero_losses(ft_exec *e, int64_t K)
{
    memset(e->op_loss, 0, (size_t)K * sizeof *e->op_loss);
    memset(e->op_ntok, 0, (size_t)K * sizeof *e->op_ntok);
}

/* ---- training and eval steps ------------------------------------------------------------- */

static int train_passes(ft_exec *e, const ft_exec_adapter_step *st, int64_t K)
{
    int64_t n_pass;
    FT_TRY(plan_passes(e, st, K, 1, &n_pass));
    FT_TRY(forward_all(e, st, n_pass, 1));
    zero_losses(e, K);
    for (int64_t mb = 0; mb < n_pass; mb++) FT_TRY(head(e, st, mb, e->dx + mb * dx_stride(e)));
    put_losses(e, st, K);
    return backward_all(e, n_pass);
}

int ft_exec_train_step_multi(ft_exec *e, const ft_exec_adapter_step *steps, int64_t K)
{
    return train_passes(e, steps, K);
}

int ft_exec_train_step(ft_exec *e, const ft_batch *mbs, int64_t n_mb, int64_t grad_norm_tokens,
                       uint64_t dropout_seed, double *loss_sum, int64_t *n_tokens)
{
    ft_exec_adapter_step s =
        one_step(e, mbs, n_mb, grad_norm_tokens, dropout_seed, loss_sum, n_tokens);
    return train_passes(e, &s, 1);
}

int ft_exec_eval_multi(ft_exec *e, const ft_exec_adapter_step *steps, int64_t K)
{
    for (int64_t k = 0; steps && k < K; k++)
        if (steps[k].n_mb != 1)
            return ft_err(FT_E_INVALID, "eval of adapter %lld: %lld micro-batches (one per adapter "
                          "per pass)", (long long)k, (long long)steps[k].n_mb);
    int64_t n_pass;
    FT_TRY(plan_passes(e, steps, K, 0, &n_pass));
    FT_TRY(forward_all(e, steps, n_pass, 0));
    zero_losses(e, K);
    FT_TRY(head(e, steps, 0, NULL));
    put_losses(e, steps, K);
    return ft_exec_op_end(e);
}

int ft_exec_eval(ft_exec *e, const ft_batch *mb, double *loss_sum, int64_t *n_tokens)
{
    ft_exec_adapter_step s = one_step(e, mb, 1, 0, 0, loss_sum, n_tokens);
    return ft_exec_eval_multi(e, &s, 1);
}

/* The forward of one micro-batch of e->lora (an eval: no dropout, no noise). */
static int forward_one(ft_exec *e, const ft_batch *mb)
{
    ft_exec_adapter_step s = one_step(e, mb, 1, 0, 0, NULL, NULL);
    int64_t n_pass;
    FT_TRY(plan_passes(e, &s, 1, 0, &n_pass));
    return forward_all(e, &s, n_pass, 0);
}

/* ---- sequence-level objectives (DPO) ----------------------------------------------------- */

/* Room for n sequences in e->seq_buf: nll, scale (doubles) and n_tok (int64). */
static int seq_room(ft_exec *e, int64_t n)
{
    if (n <= e->seq_cap) return 0;
    double *p = realloc(e->seq_buf, (size_t)n * (2 * sizeof(double) + sizeof(int64_t)));
    if (!p) return ft_err(-ENOMEM, "out of memory for %lld sequence losses", (long long)n);
    e->seq_buf = p;
    e->seq_cap = n;
    return 0;
}

/* Sequence s of a preference micro-batch (2k: pair k's chosen, 2k+1: its rejected): its
 * first token *t0 and length *n. */
static void seq_span(const ft_batch *b, int64_t s, int64_t *t0, int64_t *n)
{
    const int64_t *pr = b->pairs + (s / 2) * FT_PAIR_FIELDS;
    *t0 = pr[s % 2 ? FT_PAIR_REJECTED_START : FT_PAIR_CHOSEN_START];
    *n = pr[s % 2 ? FT_PAIR_REJECTED_LEN : FT_PAIR_CHOSEN_LEN];
}

/* A preference micro-batch's pairs tile whole sequences within its T tokens: checked before
 * the forward, so that a bad batch stops no operation half way. */
static int check_pairs(const ft_batch *b)
{
    if (b->n_pairs < 1 || !b->pairs)
        return ft_err(FT_E_INVALID, "a sequence objective on a micro-batch without preference pairs");
    for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
        int64_t t0, n;
        seq_span(b, s, &t0, &n);
        if (t0 < 0 || n < 1 || t0 + n > b->T)
            return ft_err(FT_E_INVALID, "preference pair %lld: sequence [%lld, +%lld) outside the %lld-token micro-batch",
                          (long long)(s / 2), (long long)t0, (long long)n, (long long)b->T);
    }
    return 0;
}

/* The LM head + CE of the rows [t0, t0 + n) of micro-batch mb on their own, from the final
 * norm's output in e->xf: *nll (nats) and *n_tok of their targets; with grad, d nll / d x of
 * those rows into the same rows of e->dxf. The op chunks the rows by e->ce_chunk into
 * e->ce_scratch, as a whole micro-batch's head does. */
static int span_ce(ft_exec *e, int64_t mb, int64_t t0, int64_t n, int grad, double *nll,
                   int64_t *n_tok)
{
    const ft_model_config *c = &e->m->cfg;
    const int64_t C = c->hidden_size;
    return e->be->ops->lm_head_ce(e->be, nll, n_tok, grad ? e->dxf + t0 * C : NULL, e->xf + t0 * C,
                                  e->lm_head, e->targets + mb * e->T_max + t0, n, C,
                                  c->vocab_size, 1.0f, e->ce_scratch, e->ce_chunk);
}

/* The head of a preference micro-batch: final norm, then the LM head + CE of each sequence
 * on its own rows (nll[s], n_tok[s]); with dx: d nll[s] / d x of each sequence's rows,
 * scaled by fn's scale[s], then through the final norm into dx. */
static int head_seq(ft_exec *e, const ft_batch *b, int64_t mb, float *dx, double *nll,
                    int64_t *n_tok, ft_exec_seq_grad_fn fn, void *user)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = b->T, C = c->hidden_size;
    float *xL;
    int mk;
    FT_TRY(head_begin(e, T, mb, &xL, &mk));
    if (dx) FT_TRY(be->ops->zero(be, e->dxf, (size_t)(T * C) * sizeof(float)));
    for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
        int64_t t0, n;
        seq_span(b, s, &t0, &n);
        FT_TRY(span_ce(e, mb, t0, n, dx != NULL, &nll[s], &n_tok[s]));
    }
    if (dx) {
        double *scale = nll + 2 * b->n_pairs;
        FT_TRY(fn(user, mb, b, nll, n_tok, scale));
        for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
            int64_t t0, n;
            seq_span(b, s, &t0, &n);
            FT_TRY(be->ops->scale(be, e->dxf + t0 * C, (float)scale[s], n * C));
        }
    }
    return head_end(e, T, xL, dx, mk);
}

int ft_exec_train_step_seq(ft_exec *e, const ft_batch *mbs, int64_t n_mb, ft_exec_seq_grad_fn fn,
                           void *user, uint64_t dropout_seed)
{
    if (e->n_adapters > 1)
        return ft_err(FT_E_UNSUPPORTED, "a sequence objective (DPO) trains one adapter at a time: "
                      "this executor was made for %lld adapters per pass (ft_exec_init_multi)",
                      (long long)e->n_adapters);
    if (n_mb < 1 || n_mb > e->n_micro_max)
        return ft_err(FT_E_RANGE, "step of %lld micro-batches exceeds the planned %lld",
                      (long long)n_mb, (long long)e->n_micro_max);
    if (!e->lora) return ft_err(FT_E_INVALID, "train step without an adapter");
    if (!fn) return ft_err(FT_E_INVALID, "a sequence objective without its gradient function");
    for (int64_t mb = 0; mb < n_mb; mb++) FT_TRY(check_pairs(&mbs[mb]));
    /* room for the most sequences a micro-batch can hold (one token each), so that the
     * buffer is sized at the first step and never again */
    FT_TRY(seq_room(e, e->T_max));
    ft_exec_adapter_step s = one_step(e, mbs, n_mb, 0, dropout_seed, NULL, NULL);
    int64_t n_pass;
    FT_TRY(plan_passes(e, &s, 1, 1, &n_pass));
    FT_TRY(forward_all(e, &s, n_pass, 1));
    for (int64_t mb = 0; mb < n_mb; mb++) {
        double *nll = e->seq_buf;
        int64_t *n_tok = (int64_t *)(e->seq_buf + 2 * e->seq_cap);
        FT_TRY(head_seq(e, &mbs[mb], mb, e->dx + mb * dx_stride(e), nll, n_tok, fn, user));
    }
    return backward_all(e, n_pass);
}

int ft_exec_eval_seq(ft_exec *e, const ft_batch *mb, double *nll, int64_t *n_tok)
{
    FT_TRY(check_pairs(mb));
    FT_TRY(forward_one(e, mb));
    FT_TRY(head_seq(e, mb, 0, NULL, nll, n_tok, NULL, NULL));
    return ft_exec_op_end(e);
}

/* ---- per-span eval and logits ------------------------------------------------------------ */

int ft_exec_eval_spans(ft_exec *e, const ft_batch *mb, const int64_t *spans, int64_t n_spans,
                       double *nll, int64_t *n_tok, double *loss_sum, int64_t *n_tokens)
{
    if (n_spans < 0 || (n_spans > 0 && (!spans || !nll || !n_tok)))
        return ft_err(FT_E_INVALID, "ft_exec_eval_spans: %lld spans%s", (long long)n_spans,
                      n_spans < 0 ? "" : " without their arrays");
    for (int64_t s = 0; s < n_spans; s++) {
        int64_t t0 = spans[2 * s], n = spans[2 * s + 1];
        if (t0 < 0 || n < 1 || t0 > mb->T - n)
            return ft_err(FT_E_INVALID, "span %lld: rows [%lld, +%lld) outside the %lld-token micro-batch",
                          (long long)s, (long long)t0, (long long)n, (long long)mb->T);
    }
    FT_TRY(forward_one(e, mb));
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    float *xL;
    int mk;
    FT_TRY(head_begin(e, mb->T, 0, &xL, &mk));
    if (loss_sum || n_tokens) { /* ft_exec_eval's head: the same call on the same rows */
        double ls;
        int64_t nv;
        FT_TRY(be->ops->lm_head_ce(be, &ls, &nv, NULL, e->xf, e->lm_head, e->targets, mb->T,
                                   c->hidden_size, c->vocab_size, 0.0f, e->ce_scratch, e->ce_chunk));
        if (loss_sum) *loss_sum = ls;
        if (n_tokens) *n_tokens = nv;
    }
    for (int64_t s = 0; s < n_spans; s++)
        FT_TRY(span_ce(e, 0, spans[2 * s], spans[2 * s + 1], 0, &nll[s], &n_tok[s]));
    FT_TRY(head_end(e, mb->T, xL, NULL, mk));
    return ft_exec_op_end(e);
}

int ft_exec_logits(ft_exec *e, const ft_batch *mb, float *logits)
{
    ft_backend *be = e->be;
    const ft_model_config *c = &e->m->cfg;
    int64_t T = mb->T, C = c->hidden_size, V = c->vocab_size;
    float *xL;
    FT_TRY(forward_one(e, mb));
    FT_TRY(ck_read(e, c->num_hidden_layers, &xL));
    FT_TRY(be->ops->rmsnorm_fwd(be, e->xf, e->rstdf, xL, e->final_norm, T, C, c->rms_norm_eps));
    FT_TRY(ck_used(e, c->num_hidden_layers));
    float *out = be->ops->alloc(be, (size_t)(T * V) * sizeof(float));
    if (!out) return ft_err(-ENOMEM, "out of memory for (%lld, %lld) logits", (long long)T, (long long)V);
    int rc = be->ops->lm_head_logits(be, out, e->xf, e->lm_head, T, C, V);
    if (!rc) rc = be->ops->copy(be, logits, out, (size_t)(T * V) * sizeof(float));
    be->ops->free(be, out);
    return rc;
}
