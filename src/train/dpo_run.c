/* dpo_run.c - DPO over the executor (see dpo_run.h). */
#include "src/train/dpo_run.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

/* Visits every pair of b[0..n_b) (at most cap batches when cap > 0) after the forward of its
 * micro-batch (ft_exec_eval_seq): fn(ctx, p, nll[2], n_tok[2]) for pair index p. Returns 0,
 * fn's error, or the executor's. */
typedef int (*pair_fn)(void *ctx, int64_t p, const double *nll, const int64_t *n_tok);

static int each_pair(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, pair_fn fn, void *ctx)
{
    if (cap > 0 && n_b > cap) n_b = cap;
    int64_t most = 1;
    for (int64_t i = 0; i < n_b; i++)
        if (b[i].n_pairs > most) most = b[i].n_pairs;
    double *nll = malloc((size_t)(2 * most) * sizeof *nll);
    int64_t *n_tok = malloc((size_t)(2 * most) * sizeof *n_tok);
    int rc = !nll || !n_tok ? ft_err(-ENOMEM, "out of memory for sequence losses") : 0;
    for (int64_t i = 0; i < n_b && !rc; i++) {
        rc = ft_exec_eval_seq(ex, &b[i], nll, n_tok);
        for (int64_t k = 0; k < b[i].n_pairs && !rc; k++)
            rc = fn(ctx, b[i].pairs[k * FT_PAIR_FIELDS + FT_PAIR_INDEX], nll + 2 * k, n_tok + 2 * k);
    }
    free(nll);
    free(n_tok);
    return rc;
}

typedef struct ref_ctx { double *ref; int64_t n_pairs; } ref_ctx;

static int store_ref(void *ctx, int64_t p, const double *nll, const int64_t *n_tok)
{
    ref_ctx *c = ctx;
    if (p < 0 || p >= c->n_pairs)
        return ft_err(FT_E_INVALID, "DPO: pair index %lld outside the %lld pairs", (long long)p,
                      (long long)c->n_pairs);
    c->ref[2 * p] = nll[0];
    c->ref[2 * p + 1] = nll[1];
    return 0;
}

int ft_dpo_reference(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, double *ref,
                     int64_t n_pairs)
{
    ref_ctx c = {ref, n_pairs};
    return each_pair(ex, b, n_b, cap, store_ref, &c);
}

/* Pair p's loss (*o) from its policy nlls nll[0..1] (chosen, rejected) and the reference, added
 * to st. */
static int score_pair(const ft_dpo_cfg *c, const double *ref, int64_t p, const double *nll,
                      const int64_t *n_tok, ft_dpo_stats *st, ft_dpo_pair *o)
{
    FT_TRY(ft_dpo_pair_loss(c, nll[0], n_tok[0], nll[1], n_tok[1], ref[2 * p], ref[2 * p + 1], o));
    ft_dpo_stats_add(st, o, nll[0], n_tok[0], nll[1], n_tok[1]);
    return 0;
}

typedef struct eval_ctx { const double *ref; const ft_dpo_cfg *cfg; ft_dpo_stats *st; } eval_ctx;

static int add_pair(void *ctx, int64_t p, const double *nll, const int64_t *n_tok)
{
    eval_ctx *c = ctx;
    ft_dpo_pair o;
    return score_pair(c->cfg, c->ref, p, nll, n_tok, c->st, &o);
}

int ft_dpo_evaluate(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, const double *ref,
                    const ft_dpo_cfg *c, ft_dpo_stats *st)
{
    memset(st, 0, sizeof *st);
    eval_ctx e = {ref, c, st};
    return each_pair(ex, b, n_b, cap, add_pair, &e);
}

int ft_dpo_step_grad(void *user, int64_t mb, const ft_batch *b, const double *nll,
                     const int64_t *n_tok, double *scale)
{
    ft_dpo_step *s = user;
    double inv = s->step_pairs > 0 ? 1.0 / (double)s->step_pairs : 0.0;
    for (int64_t k = 0; k < b->n_pairs; k++) {
        int64_t p = b->pairs[k * FT_PAIR_FIELDS + FT_PAIR_INDEX];
        ft_dpo_pair o;
        FT_TRY(score_pair(s->cfg, s->ref, p, nll + 2 * k, n_tok + 2 * k, &s->st, &o));
        scale[2 * k] = o.d_nll_chosen * inv;
        scale[2 * k + 1] = o.d_nll_rejected * inv;
    }
    return 0;
}
