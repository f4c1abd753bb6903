/* cmd_bench.c - `ftune bench io|step`: what the offload tiers can move on this machine.
 *
 *   ftune bench io --path FILE [--bytes N] [--device cpu|cuda|cuda:N] [--json]
 *     the disk read rate through the NVMe reader at its best queue depth x chunk size
 *     (offload/probe.h), and on a GPU the pinned host <-> device copy rates; a table on
 *     stdout, or one JSON line with --json.
 *   ftune bench io --path PACK --stream [--steps N] [--stage N] [--slots N] [--compute-ms X] ...
 *     the disk read-ahead of the streamed tiers driven as a training step with every layer on
 *     the disk tier drives it, without compute (offload/stream_bench.h): its read rate against
 *     the raw rate of the same blocks probed in the same call (issue 6). An option of
 *     `bench io` rather than a command of its own: it measures the same file with the same
 *     probe (--path, --bytes), and a pack is a file; a --model form would have to find or
 *     build the pack (minutes for a 70B base) before measuring anything.
 *   ftune bench step [--svg FILE] TRAIN-OPTIONS...
 *     `ftune train TRAIN-OPTIONS --max-steps 2 --timeline FILE` (default bench-step.svg): the
 *     trainer records the second step's spans per lane and draws them (offload/timeline.h).
 *
 * Exit 0 on success, 1 on error, 2 on usage. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/env.h"
#include "cli/session.h"
#include "kernels/kernels.h"
#include "offload/pack.h"
#include "offload/probe.h"
#include "offload/stream_bench.h"
#include "src/core/err.h"

#define STEP_SVG_DEFAULT "bench-step.svg"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: ftune bench io --path FILE [--bytes N] [--device cpu|cuda|cuda:N] [--json]\n"
        "         disk read rate of FILE through the NVMe reader (io_uring + O_DIRECT) at the best\n"
        "         queue depth x chunk size, and on a GPU the pinned host<->device copy rates\n"
        "       ftune bench io --path PACK --stream [--steps N] [--stage N] [--slots N] [--compute-ms X]\n"
        "         the streamed tiers' disk read-ahead over N training steps with every layer of the\n"
        "         pack on disk and no compute, against the raw rate of the same blocks\n"
        "       ftune bench step [--svg FILE] TRAIN-OPTIONS...\n"
        "         two training steps (ftune train TRAIN-OPTIONS --max-steps 2) with the second\n"
        "         step's timeline drawn to FILE (default " STEP_SVG_DEFAULT ")\n\n"
        "`ftune bench io --help` lists its options.\n");
}

static const char *size_str(char *b, size_t n, double bytes)
{
    if (bytes >= 1073741824.0) snprintf(b, n, "%.2f GiB", bytes / 1073741824.0);
    else if (bytes >= 1048576.0) snprintf(b, n, "%.0f MiB", bytes / 1048576.0);
    else snprintf(b, n, "%.0f KiB", bytes / 1024.0);
    return b;
}

/* One span's figures as a JSON object (rates in decimal GB/s; ratio to the raw probe). */
static cJSON *span_json(const ft_stream_bench_span *sp, double raw)
{
    cJSON *o = cJSON_CreateObject();
    double rate = sp->seconds > 0 ? sp->bytes / sp->seconds : 0;
    cJSON_AddNumberToObject(o, "steps", (double)sp->steps);
    cJSON_AddNumberToObject(o, "blocks", (double)sp->blocks);
    cJSON_AddNumberToObject(o, "bytes", (double)sp->bytes);
    cJSON_AddNumberToObject(o, "seconds", sp->seconds);
    cJSON_AddNumberToObject(o, "gb_per_s", rate / 1e9);
    cJSON_AddNumberToObject(o, "ratio_to_raw", raw > 0 ? rate / raw : 0);
    cJSON_AddNumberToObject(o, "busy_seconds", sp->busy_seconds);
    cJSON_AddNumberToObject(o, "busy_share", sp->seconds > 0 ? sp->busy_seconds / sp->seconds : 0);
    cJSON_AddNumberToObject(o, "busy_gb_per_s", sp->busy_seconds > 0 ? sp->bytes / sp->busy_seconds / 1e9 : 0);
    cJSON_AddNumberToObject(o, "host_wait_seconds", sp->wait_seconds);
    cJSON_AddNumberToObject(o, "compute_stall_seconds", sp->stall_seconds);
    return o;
}

static void span_line(const char *name, const ft_stream_bench_span *sp, double raw)
{
    double rate = sp->seconds > 0 ? sp->bytes / sp->seconds : 0;
    printf("  %-12s %lld blocks, %.2f GB in %.2f s: %.3f GB/s = %.1f%% of raw; disk busy %.1f%% of "
           "the time (%.3f GB/s while busy)\n", name, (long long)sp->blocks, sp->bytes / 1e9,
           sp->seconds, rate / 1e9, raw > 0 ? 100.0 * rate / raw : 0,
           sp->seconds > 0 ? 100.0 * sp->busy_seconds / sp->seconds : 0,
           sp->busy_seconds > 0 ? sp->bytes / sp->busy_seconds / 1e9 : 0);
    printf("  %-12s host waited for blocks %.2f s; modelled compute lane idle between passes %.2f s\n",
           "", sp->wait_seconds, sp->stall_seconds);
}

/* `bench io --stream`: offload/stream_bench.h on the pack at path. */
static int bench_stream(const char *path, int64_t bytes, int64_t pcie_bytes, const char *device,
                        int json, int64_t steps, int64_t stage, int64_t slots, double compute_ms)
{
    ft_pack_file *pack = NULL;
    if (ft_pack_open(&pack, path, 0) < 0) {
        fprintf(stderr, "ftune: bench io --stream needs a pack file (ftune pack, or the "
                        "model-nf4.ftpack of ftune init-model --pack): %s\n", ft_errmsg());
        return 1;
    }
    ft_backend *be = NULL;
    const char *dev = ft_session_device(device);
    if (ft_backend_init(&be, dev, 1) < 0) {
        fprintf(stderr, "ftune: --device %s: %s\n", dev, ft_errmsg());
        ft_pack_close(pack);
        return 1;
    }
    double h2d = 0, d2h = 0, load0[3] = {0}, load1[3] = {0};
    int has_pcie = 1, rc = 1;
    ft_stream_bench_result *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "ftune: out of memory\n");
        goto out;
    }
    int prc = ft_probe_pcie(be, (size_t)pcie_bytes, &h2d, &d2h);
    has_pcie = prc != FT_E_UNSUPPORTED; /* a host-memory backend has no bus (offload/probe.h) */
    if (has_pcie && prc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        goto out;
    }
    ft_stream_bench_opts o = {(int)steps, (int)stage, (int)slots, compute_ms * 1e-3, h2d,
                              (uint64_t)bytes};
    if (getloadavg(load0, 3) < 3) load0[0] = load0[1] = load0[2] = -1;
    if (ft_stream_bench(be, pack, &o, r) < 0) {
        fprintf(stderr, "ftune: bench io --stream: %s\n", ft_errmsg());
        goto out;
    }
    if (getloadavg(load1, 3) < 3) load1[0] = load1[1] = load1[2] = -1;
    const ft_probe_disk_result *d = &r->probe, *d2 = &r->probe_after;
    double raw = r->raw_bytes_per_s;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "path", path);
        cJSON_AddBoolToObject(j, "stream", 1);
        cJSON_AddNumberToObject(j, "layers", (double)r->layers);
        cJSON_AddNumberToObject(j, "steps", (double)r->all.steps);
        cJSON_AddNumberToObject(j, "n_stage", r->n_stage);
        cJSON_AddNumberToObject(j, "n_slots", r->n_slots);
        cJSON_AddNumberToObject(j, "stage_bytes", (double)r->stage_bytes);
        cJSON_AddNumberToObject(j, "compute_ms", r->compute_s * 1e3);
        cJSON_AddNumberToObject(j, "copy_gb_per_s", r->h2d_bytes_per_s / 1e9);
        cJSON_AddStringToObject(j, "read_ahead", r->mode);
        cJSON_AddStringToObject(j, "staging", r->staging);
        cJSON_AddNumberToObject(j, "queue_depth", r->queue_depth);
        cJSON_AddNumberToObject(j, "chunk_bytes", (double)r->chunk_bytes);
        cJSON_AddNumberToObject(j, "raw_gb_per_s", raw / 1e9);
        for (int k = 0; k < 2; k++) {
            const ft_probe_disk_result *q = k ? d2 : d;
            cJSON *p = cJSON_AddObjectToObject(j, k ? "raw_after" : "raw_before");
            cJSON_AddStringToObject(p, "mode", q->mode);
            cJSON_AddBoolToObject(p, "page_cache", q->page_cache);
            if (q->page_cache) cJSON_AddStringToObject(p, "note", q->note);
            cJSON_AddNumberToObject(p, "bytes", (double)q->bytes);
            cJSON_AddNumberToObject(p, "seconds", q->seconds);
            cJSON_AddNumberToObject(p, "gb_per_s", q->bytes_per_s / 1e9);
            cJSON_AddNumberToObject(p, "queue_depth", q->queue_depth);
            cJSON_AddNumberToObject(p, "chunk_bytes", (double)q->chunk_bytes);
        }
        cJSON_AddItemToObject(j, "all", span_json(&r->all, raw));
        if (r->steady.steps) cJSON_AddItemToObject(j, "steady", span_json(&r->steady, raw));
        else cJSON_AddNullToObject(j, "steady");
        cJSON_AddNumberToObject(j, "reads", (double)r->reads);
        cJSON_AddNumberToObject(j, "dropped_in_run", (double)r->dropped_in_run);
        cJSON_AddNumberToObject(j, "dropped_at_end", (double)r->dropped_at_end);
        cJSON_AddStringToObject(j, "device", be->ops->name);
        if (has_pcie) cJSON_AddNumberToObject(j, "h2d_gb_per_s", h2d / 1e9);
        else cJSON_AddNullToObject(j, "h2d_gb_per_s");
        cJSON *la = cJSON_AddArrayToObject(j, "loadavg_before");
        for (int i = 0; i < 3; i++) cJSON_AddItemToArray(la, cJSON_CreateNumber(load0[i]));
        la = cJSON_AddArrayToObject(j, "loadavg_after");
        for (int i = 0; i < 3; i++) cJSON_AddItemToArray(la, cJSON_CreateNumber(load1[i]));
        char *js = cJSON_PrintUnformatted(j);
        printf("%s\n", js ? js : "{}");
        cJSON_free(js);
        cJSON_Delete(j);
    } else {
        char a[32], b[32];
        printf("ftune bench io --stream: %s (%lld layers on the disk tier, %lld steps; %d x %s staging, "
               "%d device slots modelled, %.3g ms of compute per layer pass, copies %s)\n", path,
               (long long)r->layers, (long long)r->all.steps, r->n_stage,
               size_str(a, sizeof a, (double)r->stage_bytes), r->n_slots, r->compute_s * 1e3,
               r->h2d_bytes_per_s > 0 ? "at the measured host->device rate" : "instant");
        for (int k = 0; k < 2; k++) {
            const ft_probe_disk_result *q = k ? d2 : d;
            printf("  %-12s %.3f GB/s over %s of the layer blocks in %.2f s (queue depth %d, %s chunks)%s%s\n",
                   k ? "raw after" : "raw before", q->bytes_per_s / 1e9,
                   size_str(a, sizeof a, (double)q->bytes), q->seconds, q->queue_depth,
                   size_str(b, sizeof b, (double)q->chunk_bytes), q->page_cache ? "; " : "",
                   q->page_cache ? q->note : "");
        }
        printf("  %-12s %.3f GB/s (the mean of the two; the rates below are compared with it)\n", "raw", raw / 1e9);
        printf("  %-12s %s\n", "read-ahead", r->mode);
        printf("  %-12s %s\n", "staging", r->staging);
        span_line("all steps", &r->all, raw);
        if (r->steady.steps) {
            char nm[32];
            snprintf(nm, sizeof nm, "steps 2-%lld", (long long)r->all.steps);
            span_line(nm, &r->steady, raw);
        }
        printf("  %-12s %lld read = blocks taken; dropped: %lld during the steps, %lld at the end "
               "(the next step's read-ahead)\n", "blocks", (long long)r->reads,
               (long long)r->dropped_in_run, (long long)r->dropped_at_end);
        if (has_pcie)
            printf("  %-12s %.2f GB/s host->device (pinned), the modelled copy rate\n", "PCIe", h2d / 1e9);
        printf("  %-12s %.2f %.2f %.2f before, %.2f %.2f %.2f after (1, 5, 15 min)\n", "load average",
               load0[0], load0[1], load0[2], load1[0], load1[1], load1[2]);
    }
    rc = 0;
out:
    free(r);
    ft_backend_free(be);
    ft_pack_close(pack);
    return rc;
}

static int bench_io(int argc, char **argv)
{
    const char *path = NULL, *device = NULL;
    int64_t bytes = 0, pcie_bytes = 0;
    int json = 0, stream = 0;
    int64_t steps = INT64_MIN, stage = INT64_MIN, slots = INT64_MIN; /* MIN: not given */
    double compute_ms = NAN;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ftune bench io --path FILE [options]: the disk read rate of FILE through the\n"
                   "NVMe reader and, on a GPU, the pinned host<->device copy rates; with --stream (FILE a\n"
                   "pack) the streamed tiers' disk read-ahead over training steps, against that rate\n");
            break;
        }
    const ft_opt opts[] = {
        {"path", FT_OPT_STR, &path, "file (or block device) to read; put it on the disk the offload tier will use", 0, "FILE"},
        {"bytes", FT_OPT_FN, &bytes, "read at most this much of it (default 2G; less if the file is smaller)", ft_opt_bytes, "SIZE"},
        {"device", FT_OPT_STR, &device, "cpu | cuda | cuda:N | auto (default: $FTUNE_DEVICE, else auto); on a GPU the PCIe copy rates are measured too", 0, "DEV"},
        {"pcie-bytes", FT_OPT_FN, &pcie_bytes, "bytes per timed host<->device copy (default 256M)", ft_opt_bytes, "SIZE"},
        {"json", FT_OPT_FLAG, &json, "print one JSON line instead of the table"},
        {"stream", FT_OPT_FLAG, &stream, "FILE is a pack: run the streamed tiers' disk read-ahead over training steps with every layer on disk and no compute (offload/stream_bench.h), against the raw rate of the same blocks (--bytes of them, probed before and after)"},
        {"steps", FT_OPT_INT, &steps, "with --stream: training steps (default 3)", 0, "N"},
        {"stage", FT_OPT_INT, &stage, "with --stream: staging buffers, 1..8 (default min(layers, 3), the planner's)", 0, "N"},
        {"slots", FT_OPT_INT, &slots, "with --stream: device slots modelled, 2..8 (default 2, the planner's)", 0, "N"},
        {"compute-ms", FT_OPT_DBL, &compute_ms, "with --stream: modelled compute per layer pass (each forward and backward), ms (default 0)", 0, "X"},
        {NULL},
    };
    int rc = ft_args_cmd(opts, argc, argv, "bench io");
    if (rc >= 0) return rc;
    if (!path) {
        fprintf(stderr, "ftune: bench io needs --path FILE (see ftune bench io --help)\n");
        return 2;
    }
    if (bytes < 0 || pcie_bytes < 0) {
        fprintf(stderr, "ftune: bench io: sizes must be positive\n");
        return 2;
    }
    if (!stream) {
        const char *only = steps != INT64_MIN ? "--steps" : stage != INT64_MIN ? "--stage"
                         : slots != INT64_MIN ? "--slots" : !isnan(compute_ms) ? "--compute-ms" : NULL;
        if (only) {
            fprintf(stderr, "ftune: bench io: %s needs --stream\n", only);
            return 2;
        }
    } else {
        if (steps == INT64_MIN) steps = 3;
        if (stage == INT64_MIN) stage = 0;
        if (slots == INT64_MIN) slots = 2;
        if (isnan(compute_ms)) compute_ms = 0;
        char bad[96] = "";
        if (steps < 1 || steps > 100000) snprintf(bad, sizeof bad, "--steps %lld (1..100000)", (long long)steps);
        else if (stage < 0 || stage > 8) snprintf(bad, sizeof bad, "--stage %lld (1..8)", (long long)stage);
        else if (slots < 2 || slots > 8) snprintf(bad, sizeof bad, "--slots %lld (2..8)", (long long)slots);
        else if (!(compute_ms >= 0) || !isfinite(compute_ms))
            snprintf(bad, sizeof bad, "--compute-ms %g (a number >= 0)", compute_ms);
        if (bad[0]) {
            fprintf(stderr, "ftune: bench io --stream: %s\n", bad);
            return 2;
        }
        return bench_stream(path, bytes, pcie_bytes, device, json, steps, stage, slots, compute_ms);
    }

    ft_backend *be = NULL;
    const char *dev = ft_session_device(device);
    if (ft_backend_init(&be, dev, 1) < 0) {
        fprintf(stderr, "ftune: --device %s: %s\n", dev, ft_errmsg());
        return 1;
    }
    ft_env_tune(&be->tune);
    ft_probe_disk_result d;
    if (ft_probe_disk(path, (uint64_t)bytes, &d) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        ft_backend_free(be);
        return 1;
    }
    double h2d = 0, d2h = 0;
    int prc = ft_probe_pcie(be, (size_t)pcie_bytes, &h2d, &d2h);
    int has_pcie = prc != FT_E_UNSUPPORTED; /* a host-memory backend has no bus (offload/probe.h) */
    if (has_pcie && prc < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        ft_backend_free(be);
        return 1;
    }
    const char *be_name = be->ops->name;

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", path);
        cJSON_AddStringToObject(o, "mode", d.mode);
        cJSON_AddBoolToObject(o, "page_cache", d.page_cache);
        if (d.page_cache) cJSON_AddStringToObject(o, "note", d.note);
        cJSON_AddNumberToObject(o, "file_bytes", (double)d.file_bytes);
        cJSON_AddNumberToObject(o, "bytes", (double)d.bytes);
        cJSON_AddNumberToObject(o, "seconds", d.seconds);
        cJSON_AddNumberToObject(o, "disk_gb_per_s", d.bytes_per_s / 1e9);
        cJSON_AddNumberToObject(o, "queue_depth", d.queue_depth);
        cJSON_AddNumberToObject(o, "chunk_bytes", (double)d.chunk_bytes);
        cJSON *g = cJSON_AddArrayToObject(o, "grid");
        for (int i = 0; i < d.n_grid; i++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddNumberToObject(p, "queue_depth", d.grid[i].queue_depth);
            cJSON_AddNumberToObject(p, "chunk_bytes", (double)d.grid[i].chunk_bytes);
            cJSON_AddNumberToObject(p, "bytes", (double)d.grid[i].bytes);
            cJSON_AddNumberToObject(p, "gb_per_s", d.grid[i].bytes_per_s / 1e9);
            cJSON_AddItemToArray(g, p);
        }
        cJSON_AddStringToObject(o, "device", be_name);
        if (has_pcie) {
            cJSON_AddNumberToObject(o, "pcie_bytes", (double)(pcie_bytes ? pcie_bytes : (int64_t)FT_PROBE_PCIE_DEFAULT_BYTES));
            cJSON_AddNumberToObject(o, "h2d_gb_per_s", h2d / 1e9);
            cJSON_AddNumberToObject(o, "d2h_gb_per_s", d2h / 1e9);
        } else {
            cJSON_AddNullToObject(o, "h2d_gb_per_s");
            cJSON_AddNullToObject(o, "d2h_gb_per_s");
        }
        char *js = cJSON_PrintUnformatted(o);
        printf("%s\n", js ? js : "{}");
        cJSON_free(js);
        cJSON_Delete(o);
    } else {
        char a[32], b[32], c[32];
        printf("ftune bench io: %s (%s read of %s)\n", path, size_str(a, sizeof a, (double)d.bytes),
               size_str(b, sizeof b, (double)d.file_bytes));
        if (d.n_grid) {
            printf("  grid, GB/s on short slices (queue depth x chunk):\n    %8s", "depth");
            for (int ci = 0; ci < FT_PROBE_GRID_CHUNK; ci++)
                printf(" %10s", size_str(a, sizeof a, (double)d.grid[ci].chunk_bytes));
            for (int i = 0; i < d.n_grid; i++) {
                if (i % FT_PROBE_GRID_CHUNK == 0) printf("\n    %8d", d.grid[i].queue_depth);
                printf(" %10.3f", d.grid[i].bytes_per_s / 1e9);
            }
            printf("\n");
        }
        printf("  %-12s %s\n", "reader", d.mode);
        if (d.page_cache && !d.n_grid)
            printf("  %-12s %.3f GB/s over %s in %.2f s; %s\n", "disk", d.bytes_per_s / 1e9,
                   size_str(a, sizeof a, (double)d.bytes), d.seconds, d.note);
        else if (d.page_cache)
            printf("  %-12s %.3f GB/s over %s in %.2f s (best: queue depth %d, %s chunks); %s\n",
                   "disk", d.bytes_per_s / 1e9, size_str(a, sizeof a, (double)d.bytes), d.seconds,
                   d.queue_depth, size_str(c, sizeof c, (double)d.chunk_bytes), d.note);
        else
            printf("  %-12s %.3f GB/s over %s in %.2f s (best: queue depth %d, %s chunks; O_DIRECT, no page cache)\n",
                   "disk", d.bytes_per_s / 1e9, size_str(a, sizeof a, (double)d.bytes), d.seconds,
                   d.queue_depth, size_str(c, sizeof c, (double)d.chunk_bytes));
        if (has_pcie) {
            size_t pb = pcie_bytes ? (size_t)pcie_bytes : FT_PROBE_PCIE_DEFAULT_BYTES;
            printf("  %-12s %.2f GB/s (pinned, %s copies, median of 5)\n", "host->device", h2d / 1e9,
                   size_str(a, sizeof a, (double)pb));
            printf("  %-12s %.2f GB/s (pinned, %s copies, median of 5)\n", "device->host", d2h / 1e9,
                   size_str(a, sizeof a, (double)pb));
        } else {
            printf("  %-12s none: the %s backend computes in host memory\n", "PCIe", be_name);
        }
    }
    ft_backend_free(be);
    return 0;
}

static int bench_step(int argc, char **argv)
{
    /* argv: "step" ARGS...; --svg FILE is ours, everything else goes to train */
    const char *svg = STEP_SVG_DEFAULT;
    char **av = malloc((size_t)(argc + 6) * sizeof *av);
    if (!av) {
        fprintf(stderr, "ftune: out of memory\n");
        return 1;
    }
    int n = 0;
    av[n++] = "train";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ftune bench step [--svg FILE] TRAIN-OPTIONS...\n"
                   "  runs ftune train TRAIN-OPTIONS --max-steps 2 --timeline FILE (default "
                   STEP_SVG_DEFAULT "): the second step's spans per lane (compute, copies, disk)\n"
                   "  drawn as an SVG picture. TRAIN-OPTIONS (ftune train --help):\n");
            fflush(stdout);
            char *h[] = {"train", "--help", NULL};
            free(av);
            return ft_cmd_train(2, h);
        }
        if (!strcmp(argv[i], "--svg")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ftune: bench step: --svg needs a file\n");
                free(av);
                return 2;
            }
            svg = argv[++i];
            continue;
        }
        if (!strncmp(argv[i], "--svg=", 6)) {
            svg = argv[i] + 6;
            continue;
        }
        av[n++] = argv[i];
    }
    if (!*svg) {
        fprintf(stderr, "ftune: bench step: --svg needs a file\n");
        free(av);
        return 2;
    }
    av[n++] = "--max-steps";
    av[n++] = "2";
    av[n++] = "--timeline";
    av[n++] = (char *)svg;
    av[n] = NULL;
    struct stat st0;
    int had = stat(svg, &st0) == 0;
    int rc = ft_cmd_train(n, av);
    free(av);
    struct stat st;
    if (rc == 0 && stat(svg, &st) == 0 &&
        (!had || st.st_mtim.tv_sec != st0.st_mtim.tv_sec || st.st_mtim.tv_nsec != st0.st_mtim.tv_nsec ||
         st.st_ino != st0.st_ino))
        fprintf(stderr, "ftune: bench step: timeline of step 2 written to %s\n", svg);
    else if (rc == 0) {
        fprintf(stderr, "ftune: bench step: the run wrote no timeline to %s\n", svg);
        rc = 1;
    }
    return rc;
}

int ft_cmd_bench(int argc, char **argv)
{
    /* argv[0] is "bench" */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(sub, "io")) return bench_io(argc - 1, argv + 1);
    if (!strcmp(sub, "step")) return bench_step(argc - 1, argv + 1);
    fprintf(stderr, "ftune: bench: unknown subcommand '%s' (io or step; see ftune bench --help)\n", sub);
    return 2;
}
