/* cmd_eval.c - `ftune eval --model M --data F [--data F2 ...] [--adapter DIR]`: mean token
 * loss and perplexity over every record of the files (the same masks as training), one JSON
 * line. --per-example FILE also writes each example's loss, one JSON line per example in
 * data-file order (per-sample losses, as lm-evaluation-harness and transformers' Trainer
 * predict give them). With --method dpo the files hold preference records and the line has
 * the mean DPO pair loss and TRL's reward metrics of the adapter against the reference: the
 * base model, or the base with --ref-adapter (src/train/dpo.h; the reference-free losses need
 * none). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/paths.h"
#include "src/data/dataset.h"
#include "src/train/dpo_run.h"
#include "src/train/trainer.h"

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
    int rc = ft_pack(&b, &nb, ds->train, ds->n_train, seq_len, batch, 0);
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
            rc = ft_exec_eval_spans(&s->ex, &b[i], spans, b[i].n_ex, bnll, btok, &ls, &nv);
            for (int64_t k = 0; !rc && k < b[i].n_ex; k++) {
                ex_nll[b[i].ex_index[k]] = bnll[k];
                ex_tok[b[i].ex_index[k]] = btok[k];
            }
        } else {
            rc = ft_exec_eval(&s->ex, &b[i], &ls, &nv);
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

/* A JSON number, or null when x is not finite (JSON has no NaN). */
static int put_num(char *buf, size_t n, double x)
{
    return isfinite(x) ? snprintf(buf, n, "%.17g", x) : snprintf(buf, n, "null");
}

/* The --per-example lines of ds (its examples in data-file order: eval loads without a
 * shuffle or split) from ex_nll/ex_tok, into path: a temporary name in its folder, fsynced,
 * renamed (ft_write_file_atomic), or standard output for "-". paths: the --data files, as
 * ft_example.file indexes them. Returns 0, -ENOMEM, -errno naming the path. */
static int write_per_example(const char *path, const ft_str_list *paths, const ft_dataset *ds,
                             const double *ex_nll, const int64_t *ex_tok)
{
    char **name = calloc((size_t)paths->n, sizeof *name); /* each path as a JSON string */
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    int rc = name && out ? 0 : ft_err(-ENOMEM, "out of memory for the per-example lines");
    for (int64_t f = 0; !rc && f < paths->n; f++) {
        cJSON *j = cJSON_CreateString(paths->v[f]);
        name[f] = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        if (!name[f]) rc = ft_err(-ENOMEM, "out of memory for the per-example lines");
    }
    for (int64_t i = 0; !rc && i < ds->n_train; i++) {
        const ft_example *e = &ds->train[i];
        char loss[32], nll[32];
        put_num(loss, sizeof loss, ex_tok[i] ? ex_nll[i] / (double)ex_tok[i] : NAN);
        put_num(nll, sizeof nll, ex_nll[i]);
        size_t need = strlen(name[e->file]) + 256; /* the rest is 79 + at most 113 bytes */
        if (len + need > cap) {
            size_t nc = 2 * cap + need;
            char *p = realloc(out, nc);
            if (!p) {
                rc = ft_err(-ENOMEM, "out of memory for the per-example lines");
                break;
            }
            out = p;
            cap = nc;
        }
        char line[32];
        if (e->line > 0) snprintf(line, sizeof line, "%lld", (long long)e->line);
        else snprintf(line, sizeof line, "null");
        len += (size_t)snprintf(out + len, cap - len,
                                "{\"file\": %s, \"record\": %lld, \"line\": %s, \"tokens\": %lld, "
                                "\"loss\": %s, \"nll\": %s, \"truncated\": %s}\n", name[e->file],
                                (long long)e->record, line, (long long)ex_tok[i], loss, nll,
                                e->truncated ? "true" : "false");
    }
    if (!rc && !strcmp(path, "-")) {
        if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0)
            rc = ft_err(-EIO, "--per-example: writing to standard output failed");
    } else if (!rc) {
        rc = ft_write_file_atomic(path, out, len);
    }
    for (int64_t f = 0; name && f < paths->n; f++) free(name[f]);
    free(name);
    free(out);
    return rc;
}

/* --per-example FILE's checks before any work: a name, not a folder, in a folder that
 * exists, and none of the --data files. Returns 0 or prints "ftune: ..." and returns 1. */
static int per_example_path_ok(const char *path, const ft_str_list *data)
{
    if (!strcmp(path, "-")) return 0;
    struct stat st, sd;
    if (!*path || path[strlen(path) - 1] == '/' || ft_is_dir(path) == 1) {
        fprintf(stderr, "ftune: --per-example '%s': expected a file name (or - for standard output)\n", path);
        return 1;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (slash && (size_t)(slash - path) >= sizeof dir) {
        fprintf(stderr, "ftune: --per-example %s: path too long\n", path);
        return 1;
    }
    if (slash == path) snprintf(dir, sizeof dir, "/");
    else if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    if (ft_is_dir(dir) != 1) {
        fprintf(stderr, "ftune: --per-example %s: the folder %s does not exist\n", path, dir);
        return 1;
    }
    if (access(dir, W_OK | X_OK) != 0) { /* found before the evaluation, not after it */
        fprintf(stderr, "ftune: --per-example %s: cannot write in the folder %s: %s\n", path, dir,
                strerror(errno));
        return 1;
    }
    if (stat(path, &st) == 0)
        for (int64_t i = 0; i < data->n; i++)
            if (!ft_input_is_stdin(data->v[i]) && stat(data->v[i], &sd) == 0 &&
                st.st_dev == sd.st_dev && st.st_ino == sd.st_ino) {
                fprintf(stderr, "ftune: --per-example %s is the --data file %s: it would be replaced\n",
                        path, data->v[i]);
                return 1;
            }
    return 0;
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

/* What run_eval found: the DPO stats (pst), or the SFT totals and the data's counts. */
typedef struct eval_out {
    double loss, nll;            /* mean (DPO: mean pair loss) and summed token loss (SFT) */
    int64_t tokens;              /* targets scored (DPO: completion tokens read) */
    int64_t examples, skipped, dropped; /* SFT: examples scored, bad records skipped,
                                         * examples left without a scored token by --seq-len */
} eval_out;

/* The model, adapter and data of the command, then eval_tokens (dpo NULL) or eval_pairs;
 * with per_example (SFT), eval_tokens' per-example values written there (write_per_example). */
/* quant, cache_dir, budget (--gpu-mem, --host-mem): as ft_session_open_quant takes them. */
static int run_eval(const char *model, const char *adapter, const char *ref_adapter,
                    const char *quant, const char *cache_dir, const int64_t budget[2],
                    const ft_str_list *data, ft_data_cfg *dc,
                    int64_t batch, const char *device, int threads, const ft_dpo_cfg *dpo,
                    const char *per_example, ft_dpo_stats *pst, eval_out *o)
{
    ft_session s;
    ft_tokenizer *tok = NULL;
    ft_dataset ds;
    memset(&ds, 0, sizeof ds);
    double *ex_nll = NULL;
    int64_t *ex_tok = NULL;
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
    if (!rc && per_example) {
        ex_nll = calloc((size_t)ds.n_train, sizeof *ex_nll);
        ex_tok = calloc((size_t)ds.n_train, sizeof *ex_tok);
        if (!ex_nll || !ex_tok) rc = ft_err(-ENOMEM, "out of memory for %lld per-example losses",
                                            (long long)ds.n_train);
    }
    if (!rc) rc = dpo ? eval_pairs(&s, adapter, ref_adapter, &ds, dc->seq_len, batch, dpo, pst,
                                   &o->loss, &o->tokens)
                      : eval_tokens(&s, &ds, dc->seq_len, batch, &o->loss, &o->tokens, &o->nll,
                                    ex_nll, ex_tok);
    if (!rc && per_example) rc = write_per_example(per_example, data, &ds, ex_nll, ex_tok);
    o->examples = ds.n_train;
    o->skipped = ds.n_skipped;
    o->dropped = ds.n_dropped;
    free(ex_nll);
    free(ex_tok);
    ft_dataset_free(&ds);
    ft_tok_free(tok);
    ft_session_close(&s);
    return rc;
}

int ft_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ref_adapter = NULL, *device = NULL;
    const char *quant = NULL, *cache_dir = NULL, *per_example = NULL;
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
        {"per-example", FT_OPT_STR, &per_example, "also write each example's loss to FILE, one JSON "
         "line per example in data-file order: {\"file\": its --data path, \"record\": its record's "
         "0-based index in that file (every record counted, bad ones too: a JSON array's index), "
         "\"line\": its line in a JSONL file (null in a JSON array), \"tokens\": scored tokens, "
         "\"loss\": their mean loss (nats), \"nll\": their sum, \"truncated\": cut to --seq-len}; "
         "FILE is written whole under a temporary name and renamed, or not at all; - for standard "
         "output, the summary line then going to standard error. The summary's loss is the "
         "tokens-weighted mean of the lines' (its \"nll\" their sum, up to rounding). A record "
         "without a scored token within --seq-len gets no line, as in the loss (the summary's "
         "\"dropped\" counts them, \"skipped\" the bad records --skip-bad-records left out): the "
         "record indices missing from FILE are these two kinds; a larger --seq-len scores the "
         "dropped ones. --method sft only", 0, "FILE"},
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
    if (per_example && is_dpo) {
        fprintf(stderr, "ftune: --per-example writes per-example token losses (--method sft); it "
                "has no per-pair form for --method dpo yet\n");
        ft_str_list_free(&data);
        return 2;
    }
    if (per_example && per_example_path_ok(per_example, &data)) {
        ft_str_list_free(&data);
        return 1;
    }
    { /* no output over an input (src/core/paths.h) */
        const ft_path_arg out = {"--per-example", per_example, NULL};
        const ft_path_arg ins[] = {{"--model", model, NULL}, {"--adapter", adapter, NULL},
                                   {"--ref-adapter", ref_adapter, NULL}};
        int bad = ft_paths_check(&out, 1, ins, 3) < 0;
        for (int64_t i = 0; i < data.n && !bad; i++)
            bad = ft_paths_check(&out, 1, &(ft_path_arg){"--data", data.v[i], NULL}, 1) < 0;
        if (bad) {
            fprintf(stderr, "ftune: %s\n", ft_errmsg());
            ft_str_list_free(&data);
            return 1;
        }
    }
    eval_out o = {NAN, 0, 0, 0, 0, 0};
    ft_dpo_stats st = {0};
    rc = run_eval(model, adapter, ref_adapter, quant, cache_dir, budget, &data, &dc, batch < 1 ? 1 : batch, device, (int)threads,
                  is_dpo ? &dpo : NULL, per_example, &st, &o);
    ft_str_list_free(&data);
    const double loss = o.loss;
    const int64_t tokens = o.tokens;
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
    /* with --per-example - the lines hold standard output: the summary goes to stderr */
    FILE *sum = per_example && !strcmp(per_example, "-") ? stderr : stdout;
    char nll[32];
    put_num(nll, sizeof nll, o.nll);
    fprintf(sum, "{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld, \"nll\": %s, "
            "\"examples\": %lld, \"skipped\": %lld, \"dropped\": %lld}\n", loss, exp(loss),
            (long long)tokens, nll, (long long)o.examples, (long long)o.skipped, (long long)o.dropped);
    return 0;
}
