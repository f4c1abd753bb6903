/* cmd_pack.c - `ftune pack --model DIR|FILE.gguf [--quant nf4|bf16] [--cache-dir D] [--force]`:
 * builds (or finds) the packed base-weight file of a model (offload/pack.h) and reports
 * where it is, its size, the time and the write rate. Human-readable lines go to stderr;
 * stdout gets one JSON object (path, action, reason, bytes, seconds, mb_per_s, peak RSS,
 * largest layer) for scripts and tests. Exit 0 on success, 1 on error, 2 on usage. */
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/opt_parse.h"
#include "cli/commands.h"
#include "cli/env.h"
#include "cli/session.h"
#include "offload/pack.h"
#include "src/core/err.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ft_cmd_pack(int argc, char **argv)
{
    const char *model = NULL, *cache = NULL;
    int quant = FT_PACK_QUANT_NF4, force = 0, quiet = 0;
    int64_t threads = 0;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &model, "model folder (safetensors, also bitsandbytes 4-bit) or .gguf file", 0, "PATH"},
        {"quant", FT_OPT_FN, &quant, "nf4 (default; bitsandbytes layout, double quantization) | bf16", ft_opt_pack_quant, "TYPE"},
        {"cache-dir", FT_OPT_STR, &cache, "pack cache (default $XDG_CACHE_HOME/ftune/packs or ~/.cache/ftune/packs)", 0, "DIR"},
        {"force", FT_OPT_FLAG, &force, "rebuild even if a valid pack exists"},
        {"threads", FT_OPT_INT, &threads, "CPU threads (default: all cores)"},
        {"quiet", FT_OPT_FLAG, &quiet, "print only the JSON line"},
        {NULL},
    };
    int rc = ft_args_cmd(opts, argc, argv, NULL);
    if (rc >= 0) return rc;
    if (!model) {
        fprintf(stderr, "ftune: pack needs --model (see ftune pack --help)\n");
        return 2;
    }
    char model_buf[4096];
    if (ft_session_model_path(&model, model_buf, sizeof model_buf, 0)) return 1;
    if (threads > 0) omp_set_num_threads((int)threads);
    ft_pack_settings s;
    ft_pack_settings_default(&s, quant);
    ft_pack_ensure_info info;
    double t0 = now_s();
    char cache_buf[4096];
    cache = ft_env_pack_cache_dir(cache, cache_buf, sizeof cache_buf);
    rc = ft_pack_ensure_loaded(model, NULL, cache, &s, force, &info, quiet ? NULL : ft_session_pack_wait_note, NULL);
    double dt = now_s() - t0;
    if (rc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    ft_pack_file *p;
    if (ft_pack_open(&p, info.path, 0) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    uint64_t bytes = ft_pack_header(p)->file_bytes;
    int64_t L = ft_pack_header(p)->n_layers;
    size_t max_layer = ft_pack_max_layer_bytes(p);
    ft_pack_close(p);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t rss = (int64_t)ru.ru_maxrss * 1024;
    const char *act = info.action == FT_PACK_REUSED ? "reused" : info.action == FT_PACK_REBUILT ? "rebuilt" : "built";
    double mbs = dt > 0 ? bytes / 1e6 / dt : 0;
    if (!quiet) {
        if (info.action == FT_PACK_REBUILT && force)
            fprintf(stderr, "ftune: pack: rebuilding the cached pack (--force)\n");
        else if (info.action == FT_PACK_REBUILT)
            fprintf(stderr, "ftune: pack: the cached pack is not usable, rebuilding it: %s\n",
                    info.reason);
        fprintf(stderr, "ftune: pack: %s %s\n", act, info.path);
        fprintf(stderr, "ftune: pack: %s, %lld layers, %.1f MB (largest layer block %.1f MB) in "
                "%.2f s: %.1f MB/s %s; peak RSS %.1f MiB\n", ft_pack_quant_name(quant),
                (long long)L, bytes / 1e6, max_layer / 1e6, dt, mbs,
                info.action != FT_PACK_REUSED ? "written"
                : info.verified ? "verified" : "verified earlier (its .verified stamp matches)",
                rss / 1048576.0);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", info.path);
    cJSON_AddStringToObject(o, "action", act);
    cJSON_AddStringToObject(o, "reason", info.reason);
    if (info.action == FT_PACK_REUSED) cJSON_AddBoolToObject(o, "checksums_read", info.verified);
    cJSON_AddNumberToObject(o, "waited_s", info.waited_s);
    cJSON_AddStringToObject(o, "quant", ft_pack_quant_name(quant));
    cJSON_AddNumberToObject(o, "bytes", (double)bytes);
    cJSON_AddNumberToObject(o, "layers", (double)L);
    cJSON_AddNumberToObject(o, "seconds", dt);
    cJSON_AddNumberToObject(o, "mb_per_s", mbs);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)rss);
    cJSON_AddNumberToObject(o, "max_layer_bytes", (double)max_layer);
    cJSON_AddNumberToObject(o, "max_layer_src_bf16_bytes", (double)info.stats.max_layer_src_bf16_bytes);
    cJSON_AddNumberToObject(o, "build_buffer_bytes", (double)info.stats.buffer_bytes);
    char id[20];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)info.identity);
    cJSON_AddStringToObject(o, "identity", id);
    char *js = cJSON_PrintUnformatted(o);
    printf("%s\n", js ? js : "{}");
    cJSON_free(js);
    cJSON_Delete(o);
    return 0;
}
