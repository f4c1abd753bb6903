/* cmd_bench.c - `ftune bench io|step`: what the offload tiers can move on this machine.
 *
 *   ftune bench io --path FILE [--bytes N] [--device cpu|cuda|cuda:N] [--json]
 *     the disk read rate through the NVMe reader at its best queue depth x chunk size
 *     (offload/probe.h), and on a GPU the pinned host <-> device copy rates; a table on
 *     stdout, or one JSON line with --json.
 *   ftune bench step [--svg FILE] TRAIN-OPTIONS...
 *     `ftune train TRAIN-OPTIONS --max-steps 2 --timeline FILE` (default bench-step.svg): the
 *     trainer records the second step's spans per lane and draws them (offload/timeline.h).
 *
 * Exit 0 on success, 1 on error, 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "kernels/kernels.h"
#include "offload/probe.h"
#include "src/core/err.h"

#define STEP_SVG_DEFAULT "bench-step.svg"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: ftune bench io --path FILE [--bytes N] [--device cpu|cuda|cuda:N] [--json]\n"
        "         disk read rate of FILE through the NVMe reader (io_uring + O_DIRECT) at the best\n"
        "         queue depth x chunk size, and on a GPU the pinned host<->device copy rates\n"
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

static int bench_io(int argc, char **argv)
{
    const char *path = NULL, *device = NULL;
    int64_t bytes = 0, pcie_bytes = 0;
    int json = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: ftune bench io --path FILE [options]: the disk read rate of FILE through the\n"
                   "NVMe reader and, on a GPU, the pinned host<->device copy rates\n");
            break;
        }
    const ft_opt opts[] = {
        {"path", FT_OPT_STR, &path, "file (or block device) to read; put it on the disk the offload tier will use", 0, "FILE"},
        {"bytes", FT_OPT_FN, &bytes, "read at most this much of it (default 2G; less if the file is smaller)", ft_opt_bytes, "SIZE"},
        {"device", FT_OPT_STR, &device, "cpu | cuda | cuda:N | auto (default: $FTUNE_DEVICE, else auto); on a GPU the PCIe copy rates are measured too", 0, "DEV"},
        {"pcie-bytes", FT_OPT_FN, &pcie_bytes, "bytes per timed host<->device copy (default 256M)", ft_opt_bytes, "SIZE"},
        {"json", FT_OPT_FLAG, &json, "print one JSON line instead of the table"},
        {NULL},
    };
    char err[1024];
    int rc = ft_args_parse(opts, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "ftune: bench io: %s\n", err);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "ftune: bench io needs --path FILE (see ftune bench io --help)\n");
        return 2;
    }
    if (bytes < 0 || pcie_bytes < 0) {
        fprintf(stderr, "ftune: bench io: sizes must be positive\n");
        return 2;
    }

    ft_backend *be = NULL;
    const char *dev = ft_session_device(device);
    if (ft_backend_init(&be, dev, 1) < 0) {
        fprintf(stderr, "ftune: --device %s: %s\n", dev, ft_errmsg());
        return 1;
    }
    ft_probe_disk_result d;
    if (ft_probe_disk(path, (uint64_t)bytes, &d) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        ft_backend_free(be);
        return 1;
    }
    double h2d = 0, d2h = 0;
    int has_pcie = !be->ops->host_memory;
    if (has_pcie && ft_probe_pcie(be, (size_t)pcie_bytes, &h2d, &d2h) < 0) {
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
