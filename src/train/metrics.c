/* metrics.c - metrics JSONL writer (see metrics.h). */
#include "src/train/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

int ft_metrics_open(ft_metrics *m, const char *path)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->f = fopen(path, "w");
    if (!m->f) return ft_err(-errno, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

/* 1 if the JSONL line (len bytes, no newline) belongs to the run up to `step`. */
static int keep_line(const char *line, size_t len, int64_t step, int keep_eval)
{
    cJSON *o = cJSON_ParseWithLength(line, len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    int keep = 0;
    if (cJSON_IsObject(o) && cJSON_IsNumber(s)) {
        int is_eval = cJSON_HasObjectItem(o, "eval_loss");
        keep = s->valuedouble < (double)step ||
               (s->valuedouble == (double)step && (!is_eval || keep_eval));
    }
    cJSON_Delete(o);
    return keep;
}

int ft_metrics_open_resume(ft_metrics *m, const char *path, int64_t step, int keep_eval_at_step)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    char *txt = NULL;
    size_t len = 0;
    int rc = ft_read_file(path, &txt, &len);
    if (rc == -ENOENT) return ft_metrics_open(m, path);
    FT_TRY(rc);
    /* filter in place: kept lines move to the front */
    size_t out = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && txt[j] != '\n') j++;
        int complete = j < len; /* a last line without '\n' was torn by a crash */
        if (complete && keep_line(txt + i, j - i, step, keep_eval_at_step)) {
            memmove(txt + out, txt + i, j - i + 1);
            out += j - i + 1;
        }
        i = j + 1;
    }
    rc = ft_write_file_atomic(path, txt, out);
    free(txt);
    FT_TRY(rc);
    m->f = fopen(path, "a");
    if (!m->f) return ft_err(-errno, "%s: cannot open for appending: %s", path, strerror(errno));
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

/* num() with 17 significant digits: reads back as the same double, so a script can apply
 * the trainer's best-eval and early-stopping rules to metrics.jsonl exactly. */
static void num_exact(FILE *f, const char *key, double v, int last)
{
    if (isfinite(v)) fprintf(f, "\"%s\": %.17g%s", key, v, last ? "" : ", ");
    else num(f, key, v, last);
}

static int done(ft_metrics *m)
{
    fputs("}\n", m->f);
    if (fflush(m->f) != 0 || ferror(m->f))
        return ft_err(-EIO, "%s: write failed", m->path);
    return 0;
}

/* The DPO means of pref, each key after prefix ("" or "eval_"). */
static void pref_means(FILE *f, const char *prefix, const ft_dpo_stats *p)
{
    const char *keys[6] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                           "rewards/margins", "logps/chosen", "logps/rejected"};
    double sums[6] = {p->reward_chosen, p->reward_rejected, p->accurate, p->margin,
                      p->logp_chosen, p->logp_rejected};
    char key[64];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, keys[i]);
        num(f, key, p->pairs ? sums[i] / (double)p->pairs : NAN, 0);
    }
    fprintf(f, "\"%spairs\": %lld, ", prefix, (long long)p->pairs);
}

int ft_metrics_step(ft_metrics *m, int64_t step, double loss, double lr, double grad_norm,
                    int64_t tokens, double tokens_per_s, double elapsed_s, int64_t bad_steps,
                    int skipped, const ft_dpo_stats *pref)
{
    if (!m->f) return 0;
    fprintf(m->f, "{\"step\": %lld, ", (long long)step);
    num(m->f, "loss", loss, 0);
    num(m->f, "lr", lr, 0);
    num(m->f, "grad_norm", grad_norm, 0);
    fprintf(m->f, "\"tokens\": %lld, ", (long long)tokens);
    num(m->f, "tokens_per_s", tokens_per_s, 0);
    num(m->f, "elapsed_s", elapsed_s, 0);
    if (pref) pref_means(m->f, "", pref);
    if (skipped) fputs("\"skipped\": true, ", m->f);
    fprintf(m->f, "\"bad_steps\": %lld", (long long)bad_steps);
    return done(m);
}

int ft_metrics_eval(ft_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens,
                    double elapsed_s, const ft_dpo_stats *pref)
{
    if (!m->f) return 0;
    fprintf(m->f, "{\"step\": %lld, ", (long long)step);
    num_exact(m->f, "eval_loss", eval_loss, 0);
    fprintf(m->f, "\"eval_tokens\": %lld, ", (long long)eval_tokens);
    if (pref) pref_means(m->f, "eval_", pref);
    num(m->f, "elapsed_s", elapsed_s, 1);
    return done(m);
}
