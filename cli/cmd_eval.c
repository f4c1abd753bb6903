/* cmd_eval.c - `ftune eval --model M --data F [--data F2 ...] [--adapter DIR]`: mean token
 * loss and perplexity over every record of the files (the same masks as training), one JSON
 * line. With --method dpo the files hold preference records and the line has the mean DPO
 * pair loss and TRL's reward metrics of the adapter against the reference: the base model, or
 * the base with --ref-adapter (src/train/dpo.h; the reference-free losses need none). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/data/dataset.h"
#include "src/train/dpo_run.h"
#include "src/train/trainer.h"

/* SFT: the mean token loss of every example of ds (packed as training packs them). */
static int eval_tokens(ft_session *s, const ft_dataset *ds, int64_t seq_len, int64_t batch,
                       double *loss, int64_t *tokens)
{
    ft_batch *b = NULL;
    int64_t nb = 0;
    int rc = ft_pack(&b, &nb, ds->train, ds->n_train, seq_len, batch, 0);
    if (!rc) rc = ft_session_plan(s, batch * seq_len);
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; !rc && i < nb; i++) {
        double ls;
        int64_t nv;
        rc = ft_exec_eval(&s->ex, &b[i], &ls, &nv);
        sum += ls;
        cnt += nv;
    }
    *loss = cnt ? sum / cnt : NAN;
    *tokens = cnt;
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
    if (!rc) rc = ft_pack_pairs(&b, &nb, ds->train, n_pairs, seq_len, batch, 0);
    const int64_t T = 2 * batch * seq_len;
    if (!rc && ref_adapter && !ft_dpo_reference_free(c->loss_type)) {
        /* the reference adapter first (the session has no executor yet: the base is placed
         * for it), then the policy's, in place when it has the same rank and targets: one
         * placement of the base, two when they differ (three if the policy came first) */
        rc = ft_session_set_adapter(s, ref_adapter, T);
        if (rc < 0) rc = ft_err_prefix(rc, "--ref-adapter");
        if (!rc) rc = ft_dpo_reference(&s->ex, b, nb, 0, ref, n_pairs);
        if (!rc) rc = ft_session_set_adapter(s, adapter, T);
    } else {
        if (!rc) rc = ft_session_plan(s, T);
        if (!rc && !ft_dpo_reference_free(c->loss_type)) {
            ft_lora *policy = s->ex.lora;
            s->ex.lora = NULL; /* the base model */
            rc = ft_dpo_reference(&s->ex, b, nb, 0, ref, n_pairs);
            s->ex.lora = policy;
        }
    }
    if (!rc) rc = ft_dpo_evaluate(&s->ex, b, nb, 0, ref, c, st);
    *loss = !rc && st->pairs ? st->loss / (double)st->pairs : NAN;
    *tokens = rc ? 0 : st->tokens;
    free(ref);
    ft_batches_free(b, nb);
    return rc;
}

/* The model, adapter and data of the command, then eval_tokens (dpo NULL) or eval_pairs. */
/* quant, cache_dir, budget (--gpu-mem, --host-mem): as ft_session_open_quant takes them. */
static int run_eval(const char *model, const char *adapter, const char *ref_adapter,
                    const char *quant, const char *cache_dir, const int64_t budget[2],
                    const ft_str_list *data, ft_data_cfg *dc,
                    int64_t batch, const char *device, int threads, const ft_dpo_cfg *dpo,
                    ft_dpo_stats *pst, double *loss, int64_t *tokens)
{
    ft_session s;
    ft_tokenizer *tok = NULL;
    ft_dataset ds;
    memset(&ds, 0, sizeof ds);
    int qcorr = 0;
    /* the executor is planned once the batches' size is known (eval_tokens, eval_pairs) */
    int rc = ft_session_open_quant(&s, model, adapter, device, threads, quant, cache_dir, budget[0],
                                   budget[1], &qcorr);
    /* the DPO reference swaps the adapter out, and the correction with it */
    if (!rc && qcorr && dpo && !ft_dpo_reference_free(dpo->loss_type))
        rc = ft_err(FT_E_UNSUPPORTED, "%s: --method dpo --quant nf4 with an adapter trained with "
                    "--quant-correction is not supported yet (its reference is the corrected base)",
                    adapter);
    if (!rc) rc = ft_model_tokenizer(s.model, &tok);
    if (!rc && dc->seq_len == 0)
        dc->seq_len = s.model->cfg.max_position_embeddings < 2048 ? s.model->cfg.max_position_embeddings : 2048;
    if (!rc) rc = ft_dataset_load_files(&ds, data->v, data->n, dc, tok);
    if (!rc && ds.n_train == 0) rc = ft_err(FT_E_INVALID, "%s: no examples to evaluate", data->v[0]);
    if (!rc) rc = dpo ? eval_pairs(&s, adapter, ref_adapter, &ds, dc->seq_len, batch, dpo, pst, loss, tokens)
                      : eval_tokens(&s, &ds, dc->seq_len, batch, loss, tokens);
    ft_dataset_free(&ds);
    ft_tok_free(tok);
    ft_session_close(&s);
    return rc;
}

int ft_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ref_adapter = NULL, *device = NULL;
    const char *quant = NULL, *cache_dir = NULL;
    int64_t budget[2] = {0, 0}; /* --gpu-mem, --host-mem */
    ft_str_list data = {0};
    int64_t threads = 0, batch = 1;
    ft_data_cfg dc;
    memset(&dc, 0, sizeof dc);
    dc.no_shuffle = 1;
    const char *method = "sft";
    ft_train_cfg defaults;
    ft_train_defaults(&defaults);
    ft_dpo_cfg dpo = defaults.dpo; /* the trainer's */
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &model, "model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &adapter, "PEFT adapter folder to apply", 0, "DIR"},
        {"data", FT_OPT_LIST, &data, "data file (every record is evaluated); repeat it for several, scored together", 0, "FILE"},
        {"seq-len", FT_OPT_INT, &dc.seq_len, "tokens per packed row (default min(2048, model max))"},
        {"batch-size", FT_OPT_INT, &batch, "rows per micro-batch (default 1)"},
        {"data-format", FT_OPT_FN, &dc.format, "auto | alpaca | messages | sharegpt | prompt-completion | text", ft_opt_data_format, "NAME"},
        {"chat-template", FT_OPT_FN, &dc.chat_template, "auto | llama3 | llama3.1 | chatml | qwen3 | llama2 | mistral | zephyr | alpaca | jinja (the model's own template, rendered as transformers does)", ft_opt_chat_template, "NAME"},
        {"train-on-prompt", FT_OPT_FLAG, &dc.train_on_prompt, "score prompt tokens too"},
        {"skip-bad-records", FT_OPT_FLAG, &dc.skip_bad_records, "skip bad records"},
        {"method", FT_OPT_STR, &method, "sft (default) | dpo: the files hold preference records; print the mean DPO pair loss and TRL's reward metrics of --adapter against the base model", 0, "NAME"},
        {"ref-adapter", FT_OPT_STR, &ref_adapter, "with --method dpo: the reference is the base model with this PEFT adapter (the --init-adapter the run trained from) instead of the base model alone", 0, "DIR"},
        {"dpo-loss", FT_OPT_FN, &dpo.loss_type, "with --method dpo: sigmoid (default) | hinge | ipo | robust | orpo | simpo", ft_opt_dpo_loss, "NAME"},
        {"dpo-beta", FT_OPT_DBL, &dpo.beta, "with --method dpo: beta (default 0.1)"},
        {"dpo-label-smoothing", FT_OPT_DBL, &dpo.label_smoothing, "with --dpo-loss robust (default 0)"},
        {"simpo-gamma", FT_OPT_DBL, &dpo.simpo_gamma, "with --dpo-loss simpo (default 0.5)"},
        {"quant", FT_OPT_STR, &quant, "base linear weights: bf16 (default: the model's weights unquantized; on a GPU streamed from its bf16 pack, as in training, when its layers do not all fit --gpu-mem) | nf4 (as `ftune train --quant nf4` trains QLoRA: the NF4 pack, built or reused under --cache-dir, and no fp32 copy of the model in memory; on a GPU placed within --gpu-mem as training places it)", 0, "TYPE"},
        {"cache-dir", FT_OPT_STR, &cache_dir, FT_CACHE_DIR_HELP, 0, "DIR"},
        {"gpu-mem", FT_OPT_FN, &budget[0], FT_GPU_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"host-mem", FT_OPT_FN, &budget[1], FT_HOST_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"threads", FT_OPT_INT, &threads, "CPU threads"},
        {"device", FT_OPT_STR, &device, FT_DEVICE_HELP, 0, "DEV"},
        {NULL},
    };
    char err[1024];
    int rc = ft_args_parse(opts, argc, argv, err, sizeof err);
    if (rc == 1) { ft_str_list_free(&data); return 0; }
    if (rc < 0) { fprintf(stderr, "ftune: %s\n", err); ft_str_list_free(&data); return 2; }
    if (!model || !data.n) {
        fprintf(stderr, "ftune: eval needs --model and --data\n");
        ft_str_list_free(&data);
        return 2;
    }
    char model_buf[4096], adapter_buf[4096], ref_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&adapter, adapter_buf, sizeof adapter_buf, 0, "adapter") ||
        ft_session_hub_path(&ref_adapter, ref_buf, sizeof ref_buf, 0, "ref-adapter")) {
        ft_str_list_free(&data);
        return 1;
    }
    int is_dpo = !strcmp(method, "dpo");
    if (!is_dpo && strcmp(method, "sft")) {
        fprintf(stderr, "ftune: --method: unknown method '%s' (sft, dpo)\n", method);
        ft_str_list_free(&data);
        return 2;
    }
    if (ft_session_bad_quant(quant)) {
        ft_str_list_free(&data);
        return 2;
    }
    if (ref_adapter && !is_dpo) {
        fprintf(stderr, "ftune: --ref-adapter is the DPO reference: it needs --method dpo\n");
        ft_str_list_free(&data);
        return 2;
    }
    if (ref_adapter && ft_dpo_reference_free(dpo.loss_type)) {
        fprintf(stderr, "ftune: --ref-adapter: --dpo-loss %s is reference-free (it reads no reference model)\n",
                ft_dpo_loss_name(dpo.loss_type));
        ft_str_list_free(&data);
        return 2;
    }
    if (is_dpo) {
        dc.preference = 1;
        if (ft_dpo_cfg_check(&dpo) < 0) {
            fprintf(stderr, "ftune: %s\n", ft_errmsg());
            ft_str_list_free(&data);
            return 2;
        }
    }
    double loss = NAN;
    int64_t tokens = 0;
    ft_dpo_stats st = {0};
    rc = run_eval(model, adapter, ref_adapter, quant, cache_dir, budget, &data, &dc, batch < 1 ? 1 : batch, device, (int)threads,
                  is_dpo ? &dpo : NULL, &st, &loss, &tokens);
    ft_str_list_free(&data);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (is_dpo) {
        double n = st.pairs ? (double)st.pairs : NAN;
        printf("{\"loss\": %.9g, \"dpo_loss\": \"%s\", \"pairs\": %lld, \"tokens\": %lld, "
               "\"rewards/chosen\": %.9g, \"rewards/rejected\": %.9g, \"rewards/accuracies\": %.9g, "
               "\"rewards/margins\": %.9g, \"logps/chosen\": %.9g, \"logps/rejected\": %.9g}\n",
               loss, ft_dpo_loss_name(dpo.loss_type), (long long)st.pairs, (long long)tokens,
               st.reward_chosen / n, st.reward_rejected / n, st.accurate / n, st.margin / n,
               st.logp_chosen / n, st.logp_rejected / n);
        return 0;
    }
    printf("{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld}\n", loss, exp(loss), (long long)tokens);
    return 0;
}
