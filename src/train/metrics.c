/* metrics.c - metrics JSONL writer (see metrics.h). */
#include "src/train/metrics.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    ft_tfevents_close(m->tb);
    m->tb = NULL;
}

/* TensorBoard's tag of a metrics.jsonl key: "train/<key>" on a step line, and on an eval line
 * "eval/<key less its eval_ prefix>" (transformers' TensorBoardCallback naming: eval_loss is
 * eval/loss). */
static void tb_tag(char *out, size_t n, const char *key, int is_eval)
{
    if (is_eval) snprintf(out, n, "eval/%s", !strncmp(key, "eval_", 5) ? key + 5 : key);
    else snprintf(out, n, "train/%s", key);
}

#define TB_MAX_VALUES 32

/* v as float32; beyond float's range +-Inf (a C conversion of such a value is undefined). */
static float to_f32(double v)
{
    return fabs(v) > FLT_MAX ? (float)copysign(INFINITY, v) : (float)v;
}

/* One metrics.jsonl line (len bytes) as one event: every number (null: NaN) under its tag,
 * and on an eval line eval/perplexity = exp(eval_loss). The values are the line's numbers
 * as written (float32 of the printed decimal), so TensorBoard shows what metrics.jsonl
 * says. A line that is not an object with a "step" is skipped. */
static int tb_line(ft_metrics *m, const char *txt, size_t len)
{
    cJSON *o = cJSON_ParseWithLength(txt, len);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(s)) {
        cJSON_Delete(o);
        return 0;
    }
    int is_eval = cJSON_HasObjectItem(o, "eval_loss");
    char tags[TB_MAX_VALUES][80];
    const char *tp[TB_MAX_VALUES];
    float vals[TB_MAX_VALUES];
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        if (it == s || n >= TB_MAX_VALUES - 1 || !(cJSON_IsNumber(it) || cJSON_IsNull(it))) continue;
        double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        tb_tag(tags[n], sizeof tags[n], it->string, is_eval);
        tp[n] = tags[n];
        vals[n++] = to_f32(v);
        if (is_eval && !strcmp(it->string, "eval_loss")) {
            snprintf(tags[n], sizeof tags[n], "eval/perplexity");
            tp[n] = tags[n];
            vals[n++] = to_f32(exp(v));
        }
    }
    int64_t step = (int64_t)s->valuedouble;
    cJSON_Delete(o);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ft_tfevents_scalars(m->tb, step, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec, tp, vals, n);
}

int ft_metrics_tensorboard(ft_metrics *m, const char *dir)
{
    if (!dir) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FT_TRY(ft_tfevents_open(&m->tb, dir, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec));
    /* a resumed run: the lines kept from before the checkpoint first */
    char *txt = NULL;
    size_t len = 0;
    int rc = ft_read_file(m->path, &txt, &len);
    if (rc == -ENOENT) return 0;
    FT_TRY(rc);
    for (size_t i = 0; i < len && !rc;) {
        size_t j = i;
        while (j < len && txt[j] != '\n') j++;
        if (j < len) rc = tb_line(m, txt + i, j - i);
        i = j + 1;
    }
    free(txt);
    return rc;
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

/* A line is built in memory (line_begin) and written whole (line_end): to metrics.jsonl,
 * then, with --tensorboard, as one event of its scalars. */
typedef struct line { FILE *f; char *buf; size_t len; } line;

static int line_begin(ft_metrics *m, line *ln)
{
    ln->buf = NULL;
    ln->len = 0;
    ln->f = open_memstream(&ln->buf, &ln->len);
    if (!ln->f) return ft_err(-ENOMEM, "%s: out of memory", m->path);
    return 0;
}

static int line_end(ft_metrics *m, line *ln)
{
    fputs("}\n", ln->f);
    int bad = fclose(ln->f) != 0;
    int rc = 0;
    if (bad) rc = ft_err(-ENOMEM, "%s: out of memory", m->path);
    else if (fwrite(ln->buf, 1, ln->len, m->f) != ln->len || fflush(m->f) != 0 || ferror(m->f))
        rc = ft_err(-EIO, "%s: write failed", m->path);
    else if (m->tb)
        rc = tb_line(m, ln->buf, ln->len);
    free(ln->buf);
    return rc;
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
    line ln;
    FT_TRY(line_begin(m, &ln));
    FILE *f = ln.f;
    fprintf(f, "{\"step\": %lld, ", (long long)step);
    num(f, "loss", loss, 0);
    num(f, "lr", lr, 0);
    num(f, "grad_norm", grad_norm, 0);
    fprintf(f, "\"tokens\": %lld, ", (long long)tokens);
    num(f, "tokens_per_s", tokens_per_s, 0);
    num(f, "elapsed_s", elapsed_s, 0);
    if (pref) pref_means(f, "", pref);
    if (skipped) fputs("\"skipped\": true, ", f);
    fprintf(f, "\"bad_steps\": %lld", (long long)bad_steps);
    return line_end(m, &ln);
}

int ft_metrics_eval(ft_metrics *m, int64_t step, double eval_loss, int64_t eval_tokens,
                    double elapsed_s, const ft_dpo_stats *pref)
{
    if (!m->f) return 0;
    line ln;
    FT_TRY(line_begin(m, &ln));
    FILE *f = ln.f;
    fprintf(f, "{\"step\": %lld, ", (long long)step);
    num_exact(f, "eval_loss", eval_loss, 0);
    fprintf(f, "\"eval_tokens\": %lld, ", (long long)eval_tokens);
    if (pref) pref_means(f, "eval_", pref);
    num(f, "elapsed_s", elapsed_s, 1);
    return line_end(m, &ln);
}
