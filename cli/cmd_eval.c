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
#include "src/train/eval_run.h"
#include "src/train/trainer.h"

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

/* The session of the command's flags (cli/session.h ft_session_open_quant: quant, cache_dir,
 * budget = --gpu-mem, --host-mem), then the library's evaluation (src/train/eval_run.h); with
 * per_example (SFT) each example's loss written there (write_per_example). */
static int run_eval(const char *model, const char *quant, const char *cache_dir,
                    const int64_t budget[2], const char *device, int threads,
                    const ft_str_list *data, const ft_eval_cfg *ec, const char *per_example,
                    ft_eval_result *o)
{
    ft_session s;
    int rc = ft_session_open_quant(&s, model, ec->adapter, device, threads, quant, cache_dir,
                                   budget[0], budget[1], NULL);
    if (!rc) rc = ft_eval_run(&s, ec, o);
    if (!rc && per_example) rc = write_per_example(per_example, data, &o->ds, o->ex_nll, o->ex_tok);
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
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) { ft_str_list_free(&data); return rc; }
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
    ft_eval_cfg ec = {(const char *const *)data.v, data.n, dc, batch < 1 ? 1 : batch,
                      is_dpo ? &dpo : NULL, adapter, ref_adapter, per_example != NULL};
    ft_eval_result o;
    memset(&o, 0, sizeof o);
    o.loss = NAN;
    rc = run_eval(model, quant, cache_dir, budget, device, (int)threads, &data, &ec, per_example, &o);
    ft_str_list_free(&data);
    const double loss = o.loss;
    const int64_t tokens = o.tokens;
    const ft_dpo_stats st = o.dpo;
    const double sum_nll = o.nll;
    const int64_t examples = o.examples, skipped = o.skipped, dropped = o.dropped;
    ft_eval_result_free(&o);
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
    put_num(nll, sizeof nll, sum_nll);
    fprintf(sum, "{\"loss\": %.6f, \"perplexity\": %.4f, \"tokens\": %lld, \"nll\": %s, "
            "\"examples\": %lld, \"skipped\": %lld, \"dropped\": %lld}\n", loss, exp(loss),
            (long long)tokens, nll, (long long)examples, (long long)skipped, (long long)dropped);
    return 0;
}
