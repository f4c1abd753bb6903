/* eval_run.c - `ftune eval`'s evaluation over a runtime session (see eval_run.h). */
#include "src/train/eval_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/train/dpo_run.h"

/* SFT: the mean token loss of every example of ds (packed as training packs them): *loss,
 * *tokens and their summed loss *nll. With ex_nll and ex_tok (n_train each, else NULL), each
 * example's summed loss and target count too: the heads of its rows alone
 * (ft_exec_eval_spans), from the same forward as the micro-batch's head, which still gives
 * the totals, so that these are the same with or without them. */
static int eval_tokens(ft_session *s, const ft_dataset *ds, int64_t seq_len, int64_t batch,
                       double *loss, int64_t *tokens, double *nll, double *ex_nll, int64_t *ex_tok)
{
    ft_batch *b = NULL;
    int64_t nb = 0, most = 1;
    int64_t *spans = NULL, *btok = NULL;
    double *bnll = NULL;
    int rc = ft_batch_pack(&b, &nb, ds->train, ds->n_train, seq_len, batch, 0);
    for (int64_t i = 0; i < nb; i++) most = b[i].n_ex > most ? b[i].n_ex : most;
    if (!rc && ex_nll) { /* one micro-batch's spans and values, sized once */
        spans = malloc((size_t)(2 * most) * sizeof *spans);
        bnll = malloc((size_t)most * sizeof *bnll);
        btok = malloc((size_t)most * sizeof *btok);
        if (!spans || !bnll || !btok) rc = ft_err(-ENOMEM, "out of memory for per-example losses");
    }
    if (!rc) rc = ft_session_plan(s, batch * seq_len);
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; !rc && i < nb; i++) {
        double ls;
        int64_t nv;
        if (ex_nll) {
            int64_t t0 = 0;
            for (int64_t k = 0; k < b[i].n_ex; k++) { /* the examples lie back to back */
                spans[2 * k] = t0;
                spans[2 * k + 1] = ds->train[b[i].ex_index[k]].n;
                t0 += spans[2 * k + 1];
            }
            rc = ft_exec_eval_spans(s->ex, &b[i], spans, b[i].n_ex, bnll, btok, &ls, &nv);
            for (int64_t k = 0; !rc && k < b[i].n_ex; k++) {
                ex_nll[b[i].ex_index[k]] = bnll[k];
                ex_tok[b[i].ex_index[k]] = btok[k];
            }
        } else {
            rc = ft_exec_eval(s->ex, &b[i], &ls, &nv);
        }
        sum += ls;
        cnt += nv;
    }
    *loss = cnt ? sum / cnt : NAN;
    *tokens = cnt;
    *nll = sum;
    free(spans);
    free(bnll);
    free(btok);
    ft_batches_free(b, nb);
    return rc;
}

/* DPO: the pairs of ds scored with the session's adapter (from `adapter`) against the
 * reference: the base model (the adapter switched off for the reference pass), or the base
 * with the adapter of ref_adapter (loaded for the reference pass, then `adapter` again); none
 * for the reference-free losses. *st, the mean pair loss and the completion tokens read. */
static int eval_pairs(ft_session *s, const char *adapter, const char *ref_adapter,
                      const ft_dataset *ds, int64_t seq_len, int64_t batch,
                      const ft_dpo_cfg *c, ft_dpo_stats *st, double *loss, int64_t *tokens)
{
    ft_batch *b = NULL;
    int64_t nb = 0, n_pairs = ds->n_train / 2;
    double *ref = calloc((size_t)(2 * (n_pairs ? n_pairs : 1)), sizeof *ref);
    int rc = ref ? 0 : ft_err(-ENOMEM, "out of memory for reference log-probabilities");
    if (!rc) rc = ft_batch_pack_pairs(&b, &nb, ds->train, n_pairs, seq_len, batch, 0);
    const int64_t T = 2 * batch * seq_len;
    if (!rc && ref_adapter && !ft_dpo_reference_free(c->loss_type)) {
        /* the reference adapter first (the session has no executor yet: the base is placed
         * for it), then the policy's, in place when it has the same rank and targets: one
         * placement of the base, two when they differ (three if the policy came first) */
        rc = ft_session_set_adapter(s, ref_adapter, T);
        if (rc < 0) rc = ft_err_prefix(rc, "--ref-adapter");
        if (!rc) rc = ft_dpo_reference(s->ex, b, nb, 0, ref, n_pairs);
        if (!rc) rc = ft_session_set_adapter(s, adapter, T);
    } else {
        if (!rc) rc = ft_session_plan(s, T);
        if (!rc && !ft_dpo_reference_free(c->loss_type)) {
            ft_lora *policy = ft_session_swap_adapter(s, NULL); /* the base model */
            rc = ft_dpo_reference(s->ex, b, nb, 0, ref, n_pairs);
            ft_session_swap_adapter(s, policy);
        }
    }
    if (!rc) rc = ft_dpo_evaluate(s->ex, b, nb, 0, ref, c, st);
    *loss = !rc && st->pairs ? st->loss / (double)st->pairs : NAN;
    *tokens = rc ? 0 : st->tokens;
    free(ref);
    ft_batches_free(b, nb);
    return rc;
}

int ft_eval_run(ft_session *s, const ft_eval_cfg *c, ft_eval_result *o)
{
    memset(o, 0, sizeof *o);
    o->loss = NAN;
    const ft_dpo_cfg *dpo = c->dpo;
    ft_data_cfg dc = c->data_cfg;
    ft_tokenizer *tok = NULL;
    int rc = 0;
    /* the DPO reference swaps the adapter out, and the correction with it */
    if (s->qcorr && dpo && !ft_dpo_reference_free(dpo->loss_type))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: --method dpo --quant nf4 with an adapter trained with "
                    "--quant-correction is not supported yet (its reference is the corrected base)",
                    c->adapter);
    if (!rc) rc = ft_model_tokenizer(s->model, &tok);
    if (!rc && dc.seq_len == 0)
        dc.seq_len = s->model->cfg.max_position_embeddings < 2048 ? s->model->cfg.max_position_embeddings : 2048;
    if (!rc) rc = ft_dataset_load_files(&o->ds, c->data, c->n_data, &dc, tok);
    if (!rc && o->ds.n_train == 0) rc = ft_err(FT_E_INVALID, "%s: no examples to evaluate", c->data[0]);
    if (!rc && c->per_example) {
        o->ex_nll = calloc((size_t)o->ds.n_train, sizeof *o->ex_nll);
        o->ex_tok = calloc((size_t)o->ds.n_train, sizeof *o->ex_tok);
        if (!o->ex_nll || !o->ex_tok) rc = ft_err(-ENOMEM, "out of memory for %lld per-example losses",
                                                  (long long)o->ds.n_train);
    }
    if (!rc) rc = dpo ? eval_pairs(s, c->adapter, c->ref_adapter, &o->ds, dc.seq_len, c->batch, dpo,
                                   &o->dpo, &o->loss, &o->tokens)
                      : eval_tokens(s, &o->ds, dc.seq_len, c->batch, &o->loss, &o->tokens, &o->nll,
                                    o->ex_nll, o->ex_tok);
    o->examples = o->ds.n_train;
    o->skipped = o->ds.n_skipped;
    o->dropped = o->ds.n_dropped;
    ft_tok_free(tok);
    return rc;
}

void ft_eval_result_free(ft_eval_result *o)
{
    free(o->ex_nll);
    free(o->ex_tok);
    ft_dataset_free(&o->ds);
    memset(o, 0, sizeof *o);
}
