/* train_data.c - a training run's data: read, reported, packed (see train_data.h). */
#include "src/train/train_data.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/model/model.h"
#include "src/train/dist.h"
#include "src/template/chat.h"

double ft_train_data_target_weight(const ft_model_config *mc)
{
    const double blocks = ft_layer_proj_params(mc) * (double)mc->num_hidden_layers;
    return blocks > 0 ? (double)mc->vocab_size * (double)mc->hidden_size / blocks : 0.0;
}

int ft_train_data_pack(const ft_train_data *d, const ft_train_cfg *c, int64_t epoch, ft_batch **b,
                       int64_t *n)
{
    *b = NULL;
    *n = 0;
    const uint64_t seed = c->seed + (uint64_t)epoch;
    if (c->method == FT_TRAIN_METHOD_DPO)
        FT_TRY(ft_batch_pack_pairs(b, n, d->ds.train, d->ds.n_train / 2, d->seq_len, c->batch_size,
                                   seed));
    else
        FT_TRY(ft_batch_pack(b, n, d->ds.train, d->ds.n_train, d->seq_len, c->batch_size, seed));
    if (!c->balance_steps) return 0;
    int rc = ft_batch_group_by_cost(*b, *n, ft_train_dist_global_accum(c), d->target_weight, seed);
    if (rc < 0) {
        ft_batches_free(*b, *n);
        *b = NULL;
        *n = 0;
    }
    return rc;
}

int ft_train_data_pack_epoch(ft_train_data *d, const ft_train_cfg *c, int64_t epoch)
{
    ft_batches_free(d->train_b, d->n_train_b);
    d->train_b = NULL;
    d->n_train_b = 0;
    d->epoch = epoch;
    return ft_train_data_pack(d, c, epoch, &d->train_b, &d->n_train_b);
}

/* "FILE" or "N files (FILE: R records, schema[, S skipped]; ...)" for the data line. */
static void files_text(const ft_train_data *d, const ft_train_cfg *c, char *files, size_t n)
{
    if (c->n_data == 1) {
        snprintf(files, n, "%s", c->data[0]);
        return;
    }
    size_t k = (size_t)snprintf(files, n, "%lld files (", (long long)c->n_data);
    for (int64_t i = 0; i < c->n_data && k < n; i++) {
        const ft_data_file *f = &d->ds.files[i];
        char skip[48] = "";
        if (f->n_skipped) snprintf(skip, sizeof skip, ", %lld skipped", (long long)f->n_skipped);
        int w = snprintf(files + k, n - k, "%s%s: %lld records, %s%s", i ? "; " : "",
                         c->data[i], (long long)f->n_records, ft_data_format_name(f->format), skip);
        if (w > 0) k += (size_t)w;
    }
    if (k < n) snprintf(files + k, n - k, ")");
}

/* --eval-data: its examples become d->ds's eval set (every --data example trains); the part
 * of the data line that reports them goes to part. */
static int load_eval_data(ft_train_data *d, const ft_train_cfg *c, const ft_data_cfg *dc,
                          ft_tokenizer *tok, char *part, size_t n)
{
    const int dpo = c->method == FT_TRAIN_METHOD_DPO, per = dpo ? 2 : 1;
    ft_dataset ev;
    int rc = ft_dataset_load_eval(&ev, c->eval_data, dc, tok);
    if (rc < 0) return ft_err_prefix(rc, "--eval-data");
    d->ds.eval = ev.eval; /* d->ds owns them now; its split left none */
    d->ds.n_eval = ev.n_eval;
    free(ev.files);
    char cap[96] = "";
    if (ev.eval_capped)
        snprintf(cap, sizeof cap, " (the first %lld of %lld usable: --eval-max)",
                 (long long)dc->eval_max, (long long)(ev.n_eval + ev.eval_capped) / per);
    snprintf(part, n, "; eval data %s: %lld records (%s) -> %lld eval %s%s, %lld skipped, %lld truncated, %lld dropped",
             c->eval_data, (long long)ev.n_records, dpo ? "preference" : ft_data_format_name(ev.format),
             (long long)ev.n_eval / per, dpo ? "pairs" : "examples", cap, (long long)ev.n_skipped,
             (long long)ev.n_truncated, (long long)ev.n_dropped);
    return 0;
}

/* The notes after the data line: a model template that writes nothing after a reply, an
 * --eval-fraction that --eval-data makes moot. */
static void data_notes(const ft_train_data *d, const ft_train_cfg *c, ft_tokenizer *tok,
                       const ft_train_sink *k)
{
    if (d->ds.chat_template == FT_CHAT_JINJA && !c->data_cfg.train_on_prompt) {
        /* the model's own template: it may write nothing after a reply (GLM-4 opens the next
         * turn instead), and then no trained token tells the model where a reply ends */
        char eot[64] = "";
        ft_chat_ctx cx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), ft_tok_chat_template(tok)};
        if (ft_chat_jinja_end_of_turn(&cx, eot, sizeof eot) == 0 && !eot[0])
            ft_train_info(k, FT_EV_WARN, "the chat template writes nothing after an assistant reply, so the trained tokens of a turn end with its text: the model does not learn to end a reply (GLM-4's template opens the next turn instead); --train-on-prompt trains the next turn's opening too");
        ft_err_clear();
    }
    if (c->eval_data) {
        /* a fraction other than the default was asked for (flag or --config): say once
         * that it has no effect */
        ft_train_cfg def;
        ft_train_defaults(&def);
        if (c->data_cfg.eval_fraction != 0 && c->data_cfg.eval_fraction != def.data_cfg.eval_fraction)
            ft_train_info(k, FT_EV_INFO, "note: --eval-fraction %g is ignored with --eval-data: every example of %s trains",
                          c->data_cfg.eval_fraction, c->n_data == 1 ? c->data[0] : "--data");
    }
}

int ft_train_data_load(ft_train_data *d, const ft_train_cfg *c, ft_tokenizer *tok,
                       int64_t seq_len, double target_weight, const ft_train_sink *k)
{
    d->seq_len = seq_len;
    d->target_weight = target_weight;
    ft_data_cfg dc = c->data_cfg;
    dc.seq_len = seq_len;
    dc.seed = c->seed;
    if (c->eval_data) dc.eval_fraction = 0; /* every example of --data trains */
    const int dpo = c->method == FT_TRAIN_METHOD_DPO;
    dc.preference = dpo;
    const int per = dpo ? 2 : 1; /* examples per record: a pair gives two */
    /* --threads holds for the data's reading too (its records are encoded on every OpenMP
     * thread), which comes before the backend (ft_backend_init) sets it for the ops */
    if (c->threads > 0) omp_set_num_threads(c->threads);
    FT_TRY(ft_dataset_load_files(&d->ds, c->data, c->n_data, &dc, tok));
    char files[1400];
    files_text(d, c, files, sizeof files);
    if (d->ds.n_train == 0)
        return ft_err(FT_E_INVALID, "%s: no training examples left (%lld records, %lld skipped)",
                      files, (long long)d->ds.n_records, (long long)d->ds.n_skipped);
    char eval_part[1200] = "";
    if (c->eval_data) FT_TRY(load_eval_data(d, c, &dc, tok, eval_part, sizeof eval_part));
    const ft_dataset *ds = &d->ds;
    ft_train_info(k, FT_EV_INFO, "data %s: %lld records (%s, template %s) -> %lld train / %lld eval %s, %lld skipped, %lld truncated to %lld tokens, %lld dropped (no trained token within them)%s",
                  files, (long long)ds->n_records,
                  dpo ? "preference pairs"
                      : ds->format == FT_DATA_AUTO ? "mixed schemas" : ft_data_format_name(ds->format),
                  ft_chat_template_name(ds->chat_template), (long long)ds->n_train / per,
                  c->eval_data ? 0LL : (long long)ds->n_eval / per, dpo ? "pairs" : "examples",
                  (long long)ds->n_skipped, (long long)ds->n_truncated, (long long)seq_len,
                  (long long)ds->n_dropped, eval_part);
    data_notes(d, c, tok, k);
    if (!ds->n_eval && (c->early_stopping_patience > 0 || c->save_best))
        return ft_err(FT_E_INVALID, "%s needs evaluation, and this run has no eval examples (--eval-fraction %g%s): add --eval-data FILE or a --eval-fraction above 0",
                      c->early_stopping_patience > 0 ? "--early-stopping-patience" : "--save-best",
                      c->eval_data ? 0.0 : c->data_cfg.eval_fraction,
                      c->eval_data ? ", --eval-data gave none" : "");
    FT_TRY(ft_train_data_pack_epoch(d, c, 0));
    if (ds->n_eval && dpo)
        FT_TRY(ft_batch_pack_pairs(&d->eval_b, &d->n_eval_b, ds->eval, ds->n_eval / 2, seq_len,
                             c->batch_size, c->seed));
    else if (ds->n_eval)
        FT_TRY(ft_batch_pack(&d->eval_b, &d->n_eval_b, ds->eval, ds->n_eval, seq_len, c->batch_size,
                       c->seed));
    return 0;
}

void ft_train_data_free(ft_train_data *d)
{
    ft_batches_free(d->train_b, d->n_train_b);
    ft_batches_free(d->eval_b, d->n_eval_b);
    ft_dataset_free(&d->ds);
    memset(d, 0, sizeof *d);
}
