/* metrics.c - metrics JSONL writer (see metrics.h). */
#include "src/train/metrics.h"

#include <math.h>
#include <string.h>

#include "src/core/err.h"

int ft_metrics_open(ft_metrics *m, const char *path)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->f = fopen(path, "w");
    if (!m->f) return ft_err(-errno, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

void ft_metrics_close(ft_metrics *m)
{
    if (m->f) fclose(m->f);
    m->f = NULL;
}

/* JSON has no NaN/Inf: write null for them. */
static void num(FILE *f, const char *key, double v, int last)
{
    if (isfinite(v)) fprintf(f, "\"%s\": %.6g%s", key, v, last ? "" : ", ");
    else fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
}

static int done(ft_metrics *m)
{
    fputs("}\n", m->f);
    if (fflush(m->f) != 0 || ferror(m->f))
        return ft_err(-EIO, "%s: write failed", m->path);
    return 0;
}

int ft_metrics_step(ft_metrics *m, int64_t step, double loss, double lr, double grad_norm,
                    int64_t tokens, double tokens_per_s, double elapsed_s)
{
    if (!m->f) return 0;
    fprintf(m->f, "{\"step\": %lld, ", (long long)step);
    num(m->f, "loss", loss, 0);
    num(m->f, "lr", lr, 0);
    num(m->f, "grad_norm", grad_norm, 0);
    fprintf(m->f, "\"tokens\": %lld, ", (long long)tokens);
    num(m->f, "tokens_per_s", tokens_per_s, 0);
    num(m->f, "elapsed_s", elapsed_s, 1);
    return done(m);
}

int ft_metrics_eval(ft_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens,
                    double elapsed_s)
{
    if (!m->f) return 0;
    fprintf(m->f, "{\"step\": %lld, ", (long long)step);
    num(m->f, "eval_loss", eval_loss, 0);
    fprintf(m->f, "\"eval_tokens\": %lld, ", (long long)eval_tokens);
    num(m->f, "elapsed_s", elapsed_s, 1);
    return done(m);
}
