/* cmd_eval.c - `ftune eval --model M --data F [--data F2 ...] [--adapter DIR]`: mean token
 * loss and perplexity over every record of the files (the same masks as training), one JSON
 * line. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/data/dataset.h"

static int opt_format(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_data_format_parse(v);
    if (k < 0) { snprintf(err, n, "unknown data format '%s'", v); return -1; }
    *(int *)dst = k;
    return 0;
}

static int opt_template(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_chat_template_parse(v);
    if (k < 0) { snprintf(err, n, "unknown chat template '%s'", v); return -1; }
    *(int *)dst = k;
    return 0;
}

static int run_eval(const char *model, const char *adapter, const ft_str_list *data, ft_data_cfg *dc,
                    int64_t batch, const char *device, int threads, double *loss, int64_t *tokens)
{
    ft_session s;
    ft_tokenizer *tok = NULL;
    ft_dataset ds;
    ft_batch *b = NULL;
    int64_t nb = 0;
    memset(&ds, 0, sizeof ds);
    int rc = ft_session_open(&s, model, adapter, 2, device, threads);
    if (!rc) rc = ft_model_tokenizer(s.model, &tok);
    if (!rc && dc->seq_len == 0)
        dc->seq_len = s.model->cfg.max_position_embeddings < 2048 ? s.model->cfg.max_position_embeddings : 2048;
    if (!rc) rc = ft_dataset_load_files(&ds, data->v, data->n, dc, tok);
    if (!rc && ds.n_train == 0) rc = ft_err(FT_E_INVALID, "%s: no examples to evaluate", data->v[0]);
    if (!rc) rc = ft_pack(&b, &nb, ds.train, ds.n_train, dc->seq_len, batch, 0);
    if (!rc) rc = ft_session_plan(&s, batch * dc->seq_len);
    double sum = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; !rc && i < nb; i++) {
        double ls;
        int64_t nv;
        rc = ft_exec_eval(&s.ex, &b[i], &ls, &nv);
        sum += ls;
        cnt += nv;
    }
    *loss = cnt ? sum / cnt : NAN;
    *tokens = cnt;
    ft_batches_free(b, nb);
    ft_dataset_free(&ds);
    ft_tok_free(tok);
    ft_session_close(&s);
    return rc;
}

int ft_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *device = NULL;
    ft_str_list data = {0};
    int64_t threads = 0, batch = 1;
    ft_data_cfg dc;
    memset(&dc, 0, sizeof dc);
    dc.no_shuffle = 1;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &model, "model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &adapter, "PEFT adapter folder to apply", 0, "DIR"},
        {"data", FT_OPT_LIST, &data, "data file (every record is evaluated); repeat it for several, scored together", 0, "FILE"},
        {"seq-len", FT_OPT_INT, &dc.seq_len, "tokens per packed row (default min(2048, model max))"},
        {"batch-size", FT_OPT_INT, &batch, "rows per micro-batch (default 1)"},
        {"data-format", FT_OPT_FN, &dc.format, "auto | alpaca | messages | sharegpt | prompt-completion | text", opt_format, "NAME"},
        {"chat-template", FT_OPT_FN, &dc.chat_template, "auto | llama3 | llama3.1 | chatml | qwen3 | llama2 | mistral | zephyr | alpaca | jinja (the model's own template, rendered as transformers does)", opt_template, "NAME"},
        {"train-on-prompt", FT_OPT_FLAG, &dc.train_on_prompt, "score prompt tokens too"},
        {"skip-bad-records", FT_OPT_FLAG, &dc.skip_bad_records, "skip bad records"},
        {"threads", FT_OPT_INT, &threads, "CPU threads"},
        {"device", FT_OPT_STR, &device, "cpu | cuda | cuda:N | auto (default: $FTUNE_DEVICE, else auto: cuda when a GPU is visible)", 0, "DEV"},
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
    double loss;
    int64_t tokens;
    rc = run_eval(model, adapter, &data, &dc, batch < 1 ? 1 : batch, device, (int)threads, &loss, &tokens);
    ft_str_list_free(&data);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    printf("{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld}\n", loss, exp(loss), (long long)tokens);
    return 0;
}
