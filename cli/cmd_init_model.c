/* cmd_init_model.c - `ftune init-model --config FILE --out DIR [--seed S] [--pack
 * [--quant nf4|bf16] [--safetensors]] [--shard-size MB] [--tokenizer DIR]`: a model of any
 * Llama-family config.json with random weights (src/tools/init_model.h), for benchmarks:
 * bf16 safetensors, or with --pack a pack written straight from the random values (no bf16
 * detour: a 70B NF4 pack without 140 GB of safetensors; --safetensors writes both). --config here names the architecture's config.json, not an options file, so it
 * is taken out of argv before the shared parser sees it. The Llama-3 tokenizer
 * (tests/fixtures/tokenizers/llama3, found next to the binary or under the working
 * directory, or $FTUNE_HOME) is copied when vocab_size is 128256 and no --tokenizer is given. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/env.h"
#include "cli/session.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/paths.h"
#include "src/formats/config.h"
#include "src/tools/init_model.h"

/* The Llama-3 tokenizer folder: $FTUNE_HOME, the binary's ../ and ../../, the working
 * directory. */
static const char *find_llama3_tokenizer(char *buf, size_t n)
{
    static const char rel[] = "tests/fixtures/tokenizers/llama3";
    char exe[4096], base[4200];
    const char *home = getenv("FTUNE_HOME");
    if (home && snprintf(buf, n, "%s/%s/tokenizer.json", home, rel) < (int)n && !access(buf, R_OK)) {
        snprintf(buf, n, "%s/%s", home, rel);
        return buf;
    }
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        for (int up = 1; up <= 2; up++) {
            snprintf(base, sizeof base, "%s%s", exe, up == 1 ? "/.." : "/../..");
            if (snprintf(buf, n, "%s/%s/tokenizer.json", base, rel) < (int)n && !access(buf, R_OK)) {
                snprintf(buf, n, "%s/%s", base, rel);
                return buf;
            }
        }
    }
    if (snprintf(buf, n, "%s/tokenizer.json", rel) < (int)n && !access(buf, R_OK)) {
        snprintf(buf, n, "%s", rel);
        return buf;
    }
    return NULL;
}

static int init_model(const char *config, const char *out, const char *tok, uint64_t seed,
                      int64_t shard_mb, int pack, int quant, int with_st, int64_t threads);

int ft_cmd_init_model(int argc, char **argv)
{
    /* take --config FILE / --config=FILE out before the shared parser (which reads --config
     * as an options file) */
    const char *config = NULL;
    char **av = calloc((size_t)argc + 1, sizeof *av);
    int ac = 0;
    if (!av) return 1;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (i > 0 && !strncmp(argv[i], "--config=", 9)) config = argv[i] + 9;
        else av[ac++] = argv[i];
    }
    const char *out = NULL, *tok = NULL;
    uint64_t seed = 42;
    int pack = 0, quant = FT_PACK_QUANT_NF4, with_st = 0;
    int64_t shard_mb = 0, threads = 0;
    const ft_opt opts[] = {
        {"out", FT_OPT_STR, &out, "output folder", 0, "DIR"},
        {"seed", FT_OPT_FN, &seed, "random seed (default 42)", ft_opt_u64, "N"},
        {"pack", FT_OPT_FLAG, &pack, "write a pack (OUT/model-<quant>.ftpack) straight from the random weights instead of safetensors"},
        {"quant", FT_OPT_FN, &quant, "pack quantization: nf4 (default) | bf16", ft_opt_pack_quant, "TYPE"},
        {"safetensors", FT_OPT_FLAG, &with_st, "with --pack: write the bf16 safetensors too"},
        {"shard-size", FT_OPT_INT, &shard_mb, "max MB per safetensors shard (default 5000)"},
        {"tokenizer", FT_OPT_STR, &tok, "copy tokenizer.json (+ tokenizer_config.json) from this folder", 0, "DIR"},
        {"threads", FT_OPT_INT, &threads, "CPU threads (default: all cores)"},
        {NULL},
    };
    for (int i = 1; i < ac; i++)
        if (!strcmp(av[i], "--help") || !strcmp(av[i], "-h")) { /* --config is not an options file here */
            ft_args_usage_table(stdout, opts);
            printf("  %-28s %s\n", "--config FILE", "the architecture's config.json (required)");
            free(av);
            return 0;
        }
    int rc = ft_args_cmd(opts, ac, av, NULL);
    free(av);
    if (rc >= 0) return rc;
    if (!config || !out) {
        fprintf(stderr, "ftune: init-model needs --config FILE and --out DIR (see ftune init-model --help)\n");
        return 2;
    }
    { /* no output over an input (src/core/paths.h): OUT and the files written in it */
        const ft_path_arg outs[] = {{"--out", out, NULL}, {"--out", out, "config.json"},
                                    {"--out", out, "tokenizer.json"},
                                    {"--out", out, "tokenizer_config.json"}};
        const ft_path_arg ins[] = {{"--config", config, NULL}, {"--tokenizer", tok, NULL}};
        if (ft_paths_check(outs, 4, ins, 2) < 0) {
            fprintf(stderr, "ftune: %s\n", ft_errmsg());
            return 1;
        }
    }
    /* one run per output folder (issue 31): OUT is locked while it is written */
    ft_dirlock out_lock = {.fd = -1};
    if (ft_session_out_lock(&out_lock, "--out", out) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    rc = init_model(config, out, tok, seed, shard_mb, pack, quant, with_st, threads);
    ft_dirlock_release(&out_lock);
    return rc;
}

/* init-model after its checks and under the lock of out: 0, or 1 after printing the error. */
static int init_model(const char *config, const char *out, const char *tok, uint64_t seed,
                      int64_t shard_mb, int pack, int quant, int with_st, int64_t threads)
{
    int no_st = pack && !with_st;
    if (threads > 0) omp_set_num_threads((int)threads);
    ft_model_config cfg;
    if (ft_config_load(&cfg, config) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    char tbuf[4300];
    const char *tok_dir = tok;
    if (!tok_dir && cfg.vocab_size == 128256) tok_dir = find_llama3_tokenizer(tbuf, sizeof tbuf);
    ft_init_cfg c = {config, out, seed, shard_mb * 1000000, !no_st, pack ? quant : 0, tok_dir,
                     ft_env_pack_direct()};
    ft_init_result res;
    int rc = ft_init_model(&c, &res);
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    fprintf(stderr, "ftune: init-model: %s: %lld layers, hidden %lld, %.3fB parameters ~ N(0, %g), "
            "seed %llu\n", out, (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size,
            res.n_params / 1e9, res.init_std, (unsigned long long)seed);
    if (!no_st)
        fprintf(stderr, "ftune: init-model: bf16 safetensors: %d shard%s, %.1f MB in %.1f s (%.1f MB/s)\n",
                res.n_shards, res.n_shards == 1 ? "" : "s", res.st_bytes / 1e6, res.st_seconds,
                res.st_seconds > 0 ? res.st_bytes / 1e6 / res.st_seconds : 0.0);
    if (res.tokenizer_files)
        fprintf(stderr, "ftune: init-model: tokenizer copied from %s\n", tok_dir);
    else
        fprintf(stderr, "ftune: init-model: no tokenizer written (vocab_size %lld%s; pass --tokenizer DIR)\n",
                (long long)cfg.vocab_size, cfg.vocab_size == 128256 ? ", Llama-3 tokenizer not found" : "");
    if (pack) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        fprintf(stderr, "ftune: init-model: pack %s: %s, %.1f MB in %.1f s (%.1f MB/s), largest layer "
                "block %.1f MB (%.1f MB as bf16), build buffers %.1f MiB, peak RSS %.1f MiB\n",
                res.pack_path, ft_pack_quant_name(quant), res.pack.file_bytes / 1e6, res.pack.seconds,
                res.pack.seconds > 0 ? res.pack.file_bytes / 1e6 / res.pack.seconds : 0.0,
                res.pack.max_layer_bytes / 1e6, res.pack.max_layer_src_bf16_bytes / 1e6,
                res.pack.buffer_bytes / 1048576.0, ru.ru_maxrss / 1024.0);
    }
    return 0;
}
