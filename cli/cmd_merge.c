/* cmd_merge.c - `ftune merge --model DIR|FILE.gguf --adapter DIR --out DIR
 * [--format safetensors|gguf] [--dtype bf16|f16|f32|q8_0] [--shard-size 5GB]`: the base model
 * with the LoRA adapter merged in (adapters/export/merge.h), streamed a block of rows at a time.
 * Prints what was written, the peak resident memory and the model's size. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "adapters/export/merge.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/paths.h"
#include "src/numeric/quant.h"

/* "5GB", "500MB", "2GiB", "123456" -> bytes (decimal units as transformers' max_shard_size). */
static int opt_size(const char *v, void *dst, char *err, size_t n)
{
    char *end;
    double x = strtod(v, &end);
    while (*end == ' ') end++;
    double mul = 1;
    if (!*end || !strcasecmp(end, "B")) mul = 1;
    else if (!strcasecmp(end, "KB")) mul = 1e3;
    else if (!strcasecmp(end, "MB")) mul = 1e6;
    else if (!strcasecmp(end, "GB")) mul = 1e9;
    else if (!strcasecmp(end, "KiB")) mul = 1024.0;
    else if (!strcasecmp(end, "MiB")) mul = 1048576.0;
    else if (!strcasecmp(end, "GiB")) mul = 1073741824.0;
    else {
        snprintf(err, n, "bad size '%s' (e.g. 5GB, 500MB, 2GiB)", v);
        return -1;
    }
    if (!(x * mul >= 1) || x * mul > 9e18) {
        snprintf(err, n, "size '%s' out of range", v);
        return -1;
    }
    *(int64_t *)dst = (int64_t)(x * mul);
    return 0;
}

/* Peak resident memory of this process: VmHWM of /proc/self/status (the high-water mark of
 * this program's own address space), else getrusage's ru_maxrss, which on Linux also keeps
 * the resident size of the parent that forked us at the time of exec (a Python test runner's
 * tens of MiB), so it overstates a small run. */
static double peak_rss_mib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    if (kb >= 0) return kb / 1024.0;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) < 0) return -1;
    return ru.ru_maxrss / 1024.0; /* Linux: kilobytes */
}

int ft_cmd_merge(int argc, char **argv)
{
    const char *model = NULL, *adapter = NULL, *out = NULL, *format = "safetensors", *dtype = NULL;
    int64_t shard = FT_MERGE_DEFAULT_SHARD_BYTES;
    int quiet = 0;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &model, "base model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &adapter, "PEFT adapter folder to merge", 0, "DIR"},
        {"out", FT_OPT_STR, &out, "output folder (gguf: a folder for model.gguf, or a FILE.gguf)", 0, "PATH"},
        {"format", FT_OPT_STR, &format, "safetensors (default) or gguf", 0, "NAME"},
        {"dtype", FT_OPT_STR, &dtype, "bf16 (default), f16, f32; gguf also q8_0 (default f16)", 0, "TYPE"},
        {"shard-size", FT_OPT_FN, &shard, "largest safetensors shard (default 5GB)", opt_size, "SIZE"},
        {"quiet", FT_OPT_FLAG, &quiet, "print nothing on success"},
        {NULL},
    };
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) return rc;
    if (!model || !adapter || !out) {
        fprintf(stderr, "ftune: merge needs --model, --adapter and --out\n");
        return 2;
    }
    char model_buf[4096], adapter_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&adapter, adapter_buf, sizeof adapter_buf, 0, "adapter"))
        return 1;
    const ft_path_arg outs[] = {{"--out", out, NULL}};
    const ft_path_arg ins[] = {{"--model", model, NULL}, {"--adapter", adapter, NULL}};
    if (ft_paths_check(outs, 1, ins, 2) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    ft_merge_opts o = {0};
    o.shard_bytes = shard;
    if (!strcmp(format, "safetensors")) o.format = FT_MERGE_SAFETENSORS;
    else if (!strcmp(format, "gguf")) o.format = FT_MERGE_GGUF;
    else {
        fprintf(stderr, "ftune: merge --format '%s': expected safetensors or gguf\n", format);
        return 2;
    }
    if (!dtype) dtype = o.format == FT_MERGE_GGUF ? "f16" : "bf16";
    if (!strcmp(dtype, "bf16")) o.dtype = FT_GGML_BF16;
    else if (!strcmp(dtype, "f16")) o.dtype = FT_GGML_F16;
    else if (!strcmp(dtype, "f32")) o.dtype = FT_GGML_F32;
    else if (!strcmp(dtype, "q8_0")) o.dtype = FT_GGML_Q8_0;
    else {
        fprintf(stderr, "ftune: merge --dtype '%s': expected bf16, f16, f32 or q8_0\n", dtype);
        return 2;
    }
    /* one run per output folder (issue 31): a folder --out is locked while it is written (a
     * --format gguf FILE.gguf is one file, written under a temporary name and renamed) */
    ft_dirlock out_lock = {.fd = -1};
    if (!ft_merge_out_is_file(o.format, out) && ft_session_out_lock(&out_lock, "--out", out) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    ft_merge_report r;
    rc = ft_merge(model, adapter, out, &o, &r);
    ft_dirlock_release(&out_lock);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    if (!quiet) {
        fprintf(stderr, "ftune: wrote %s: %s %s, arch %s, %lld tensors (%lld merged, scale %g), "
                "%lld file(s), %.1f MiB; source tensors %.1f MiB; peak RSS %.1f MiB\n",
                r.out_path, format, dtype, r.arch, (long long)r.n_tensors, (long long)r.n_merged,
                r.scale, (long long)r.n_files, r.bytes_out / 1048576.0, r.src_bytes / 1048576.0,
                peak_rss_mib());
        if (r.n_skipped)
            fprintf(stderr, "ftune: %lld source tensor(s) have no place in the output and were "
                    "left out (e.g. rotary_emb.inv_freq)\n", (long long)r.n_skipped);
        if (r.note[0]) fprintf(stderr, "ftune: note: %s\n", r.note);
    }
    return 0;
}
