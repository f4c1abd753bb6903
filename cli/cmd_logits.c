/* cmd_logits.c - `ftune logits --model M --ids 1,2,3 [--adapter DIR] [--out FILE]
 * [--quant nf4] [--cache-dir DIR] [--gpu-mem SIZE]`: the raw logits of one sequence (debugging
 * and the numpy reference test). Writes (T, V) float32 little-endian to FILE and prints
 * {"loss","n_tokens","vocab"} (mean next-token cross-entropy over the T-1 predictions).
 * --quant nf4: on the NF4 base as `ftune eval --quant nf4`; on a GPU a bf16 base that does not
 * fit --gpu-mem is streamed from its bf16 pack (cli/session.h ft_session_open_quant). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/paths.h"
#include "src/core/fsutil.h"

static int parse_ids(const char *s, int32_t **ids, int64_t *n)
{
    int64_t cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (v && *p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) {
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) { free(v); return -1; }
    }
    if (!v || k == 0) { free(v); return -1; }
    *ids = v;
    *n = k;
    return 0;
}

int ft_cmd_logits(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *ids_s = NULL, *out = NULL, *device = NULL;
    const char *quant = NULL, *cache_dir = NULL;
    int64_t budget[2] = {0, 0}; /* --gpu-mem, --host-mem */
    int64_t threads = 0;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &model, "model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &adapter, "PEFT adapter folder to apply", 0, "DIR"},
        {"ids", FT_OPT_STR, &ids_s, "comma-separated token ids", 0, "LIST"},
        {"out", FT_OPT_STR, &out, "write (T, V) float32 logits here", 0, "FILE"},
        {"threads", FT_OPT_INT, &threads, "CPU threads"},
        {"device", FT_OPT_STR, &device, FT_DEVICE_HELP, 0, "DEV"},
        {"quant", FT_OPT_STR, &quant, "base linear weights: bf16 (default: the model's weights unquantized; on a GPU streamed from its bf16 pack, as in training, when its layers do not all fit --gpu-mem) | nf4 (the QLoRA base: the NF4 pack, built or reused under --cache-dir, with the adapter run's --quant-correction)", 0, "TYPE"},
        {"gpu-mem", FT_OPT_FN, &budget[0], FT_GPU_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"host-mem", FT_OPT_FN, &budget[1], FT_HOST_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"cache-dir", FT_OPT_STR, &cache_dir, FT_CACHE_DIR_HELP, 0, "DIR"},
        {NULL},
    };
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) return rc;
    if (ft_session_bad_quant(quant)) return 2;
    int32_t *ids;
    int64_t T;
    if (!model || !ids_s || parse_ids(ids_s, &ids, &T) < 0) {
        fprintf(stderr, "ftune: logits needs --model and --ids with comma-separated token ids\n");
        return 2;
    }
    char model_buf[4096], adapter_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&adapter, adapter_buf, sizeof adapter_buf, 0, "adapter")) {
        free(ids);
        return 1;
    }
    const ft_path_arg outs[] = {{"--out", out, NULL}};
    const ft_path_arg ins[] = {{"--model", model, NULL}, {"--adapter", adapter, NULL}};
    if (ft_paths_check(outs, 1, ins, 2) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        free(ids);
        return 1;
    }
    int32_t *targets = malloc((size_t)T * sizeof(int32_t)), *pos = malloc((size_t)T * sizeof(int32_t)),
            *ss = calloc((size_t)T, sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) {
        pos[t] = (int32_t)t;
        targets[t] = t + 1 < T ? ids[t + 1] : -100;
    }
    ft_batch b = {1, T, T, ids, targets, pos, ss, T - 1};
    ft_session s;
    float *logits = NULL;
    double loss = 0;
    int64_t nv = 0;
    rc = ft_session_open_quant(&s, model, adapter, device, (int)threads, quant, cache_dir, budget[0],
                               budget[1], NULL);
    if (!rc) rc = ft_session_plan(&s, T);
    int64_t V = s.model ? s.model->cfg.vocab_size : 0;
    for (int64_t t = 0; t < T && !rc; t++) /* found here, not inside the embedding kernel */
        if (ids[t] < 0 || ids[t] >= V)
            rc = ft_err(FT_E_INVALID, "--ids: id %d (position %lld) is no token id of the model "
                        "(its vocabulary has %lld, ids 0..%lld)", ids[t], (long long)t,
                        (long long)V, (long long)(V - 1));
    if (!rc) {
        logits = malloc((size_t)(T * V) * sizeof(float));
        rc = logits ? ft_exec_logits(s.ex, &b, logits) : ft_err(-ENOMEM, "out of memory");
    }
    if (!rc) rc = ft_exec_eval(s.ex, &b, &loss, &nv);
    if (!rc && out) rc = ft_write_file_atomic(out, logits, (size_t)(T * V) * sizeof(float));
    if (!rc)
        printf("{\"loss\": %.9g, \"n_tokens\": %lld, \"vocab\": %lld}\n", nv ? loss / nv : NAN,
               (long long)T, (long long)V);
    else
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
    ft_session_close(&s);
    free(logits);
    free(ids);
    free(targets);
    free(pos);
    free(ss);
    return rc ? 1 : 0;
}
