/* cmd_report.c - `ftune report DIR [DIR ...] [--out FILE] [--title TEXT]`: the HTML report
 * of a run folder (src/train/report.h), DIR/report.html; with several folders one report
 * comparing them (one curve per run, a sortable table of runs) into --out. Can be run while
 * a training run is in progress (what metrics.jsonl holds so far). Prints the path written.
 * Exit 0 on success, 1 on error, 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "src/core/err.h"
#include "src/train/report.h"

static void report_usage(FILE *f)
{
    fputs("usage: ftune report DIR [--out FILE] [--title TEXT]\n"
          "       ftune report DIR1 DIR2 ... --out FILE [--title TEXT]\n\n"
          "One self-contained HTML file (inline SVG charts, readable offline) of a training run:\n"
          "train loss (raw and smoothed as TensorBoard smooths, EMA 0.6), eval loss, learning rate\n"
          "and tokens/s against steps, the run's summary and settings, and its samples.jsonl.\n"
          "`ftune train` writes OUT/report.html at the end of every run; this command redraws it\n"
          "(also mid-run). With several run folders: one curve per run and a sortable table.\n\n"
          "  --out FILE     where to write (default DIR/report.html; needed with several DIRs)\n"
          "  --title TEXT   the page's heading (default \"ftune report: DIR\")\n", f);
}

int ft_cmd_report(int argc, char **argv)
{
    const char *out = NULL, *title = NULL;
    ft_report_run *runs = calloc((size_t)(argc > 1 ? argc : 1), sizeof *runs);
    if (!runs) {
        fprintf(stderr, "ftune: out of memory\n");
        return 1;
    }
    int n = 0, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            report_usage(stdout);
            free(runs);
            return 0;
        }
        const char **dst = !strcmp(a, "--out") ? &out : !strcmp(a, "--title") ? &title : NULL;
        if (dst) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ftune: %s needs a value (see ftune report --help)\n", a);
                rc = 2;
            } else {
                *dst = argv[++i];
            }
        } else if (!strncmp(a, "--out=", 6)) {
            out = a + 6;
        } else if (!strncmp(a, "--title=", 8)) {
            title = a + 8;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ftune: report: unknown option '%s' (see ftune report --help)\n", a);
            rc = 2;
        } else {
            runs[n++].dir = a;
        }
    }
    if (!rc && n == 0) {
        fprintf(stderr, "ftune: report needs a run folder: ftune report DIR (see ftune report --help)\n");
        rc = 2;
    }
    if (!rc && n > 1 && !out) {
        fprintf(stderr, "ftune: report of %d runs needs --out FILE (see ftune report --help)\n", n);
        rc = 2;
    }
    if (rc) {
        free(runs);
        return rc;
    }
    char path[4300], head[4400];
    int err;
    if (!out && !title) {
        err = ft_report_write(runs[0].dir, path, sizeof path);
    } else {
        if (!out) snprintf(path, sizeof path, "%s/%s", runs[0].dir, FT_REPORT_FILE);
        else snprintf(path, sizeof path, "%s", out);
        if (!title && n == 1) snprintf(head, sizeof head, "ftune report: %s", runs[0].dir);
        err = ft_report_write_runs(path, title ? title : n == 1 ? head : NULL, runs, n);
    }
    free(runs);
    if (err < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        return 1;
    }
    printf("%s\n", path);
    return 0;
}
