/* dpo_run.c - DPO over the executor (see dpo_run.h). */
#include "src/train/dpo_run.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

/* Room for the nlls and counts of the largest micro-batch of b[0..n_b). */
static int seq_buffers(const ft_batch *b, int64_t n_b, double **nll, int64_t **n_tok)
{
    int64_t most = 1;
    for (int64_t i = 0; i < n_b; i++)
        if (b[i].n_pairs > most) most = b[i].n_pairs;
    *nll = malloc((size_t)(2 * most) * sizeof **nll);
    *n_tok = malloc((size_t)(2 * most) * sizeof **n_tok);
    if (!*nll || !*n_tok) {
        free(*nll);
        free(*n_tok);
        return ft_err(-ENOMEM, "out of memory for sequence losses");
    }
    return 0;
}

int ft_dpo_reference(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, double *ref,
                     int64_t n_pairs)
{
    if (cap > 0 && n_b > cap) n_b = cap;
    double *nll;
    int64_t *n_tok;
    FT_TRY(seq_buffers(b, n_b, &nll, &n_tok));
    int rc = 0;
    for (int64_t i = 0; i < n_b && !rc; i++) {
        rc = ft_exec_eval_seq(ex, &b[i], nll, n_tok);
        for (int64_t k = 0; k < b[i].n_pairs && !rc; k++) {
            int64_t p = b[i].pairs[k * FT_PAIR_FIELDS + FT_PAIR_INDEX];
            if (p < 0 || p >= n_pairs) {
                rc = ft_err(FT_E_INVALID, "DPO: pair index %lld outside the %lld pairs",
                            (long long)p, (long long)n_pairs);
                break;
            }
            ref[2 * p] = nll[2 * k];
            ref[2 * p + 1] = nll[2 * k + 1];
        }
    }
    free(nll);
    free(n_tok);
    return rc;
}

int ft_dpo_evaluate(ft_exec *ex, const ft_batch *b, int64_t n_b, int64_t cap, const double *ref,
                    const ft_dpo_cfg *c, ft_dpo_stats *st)
{
    memset(st, 0, sizeof *st);
    if (cap > 0 && n_b > cap) n_b = cap;
    double *nll;
    int64_t *n_tok;
    FT_TRY(seq_buffers(b, n_b, &nll, &n_tok));
    int rc = 0;
    for (int64_t i = 0; i < n_b && !rc; i++) {
        rc = ft_exec_eval_seq(ex, &b[i], nll, n_tok);
        for (int64_t k = 0; k < b[i].n_pairs && !rc; k++) {
            int64_t p = b[i].pairs[k * FT_PAIR_FIELDS + FT_PAIR_INDEX];
            ft_dpo_pair o;
            rc = ft_dpo_pair_loss(c, nll[2 * k], n_tok[2 * k], nll[2 * k + 1], n_tok[2 * k + 1],
                                  ref[2 * p], ref[2 * p + 1], &o);
            if (!rc) ft_dpo_stats_add(st, &o, nll[2 * k], n_tok[2 * k], nll[2 * k + 1], n_tok[2 * k + 1]);
        }
    }
    free(nll);
    free(n_tok);
    return rc;
}

int ft_dpo_step_grad(void *user, int64_t mb, const ft_batch *b, const double *nll,
                     const int64_t *n_tok, double *scale)
{
    ft_dpo_step *s = user;
    double inv = s->step_pairs > 0 ? 1.0 / (double)s->step_pairs : 0.0;
    for (int64_t k = 0; k < b->n_pairs; k++) {
        int64_t p = b->pairs[k * FT_PAIR_FIELDS + FT_PAIR_INDEX];
        ft_dpo_pair o;
        FT_TRY(ft_dpo_pair_loss(s->cfg, nll[2 * k], n_tok[2 * k], nll[2 * k + 1], n_tok[2 * k + 1],
                                s->ref[2 * p], s->ref[2 * p + 1], &o));
        ft_dpo_stats_add(&s->st, &o, nll[2 * k], n_tok[2 * k], nll[2 * k + 1], n_tok[2 * k + 1]);
        scale[2 * k] = o.d_nll_chosen * inv;
        scale[2 * k + 1] = o.d_nll_rejected * inv;
    }
    return 0;
}
