/* report.c - the run report as one HTML file with inline SVG charts (see report.h). */
#include "src/train/report.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/model_card.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/checkpoint.h"

void ft_report_smooth(const double *y, int64_t n, double w, double *out)
{
    int constant = 1;
    for (int64_t i = 1; i < n && constant; i++) constant = y[i] == y[0];
    double last = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        if (constant || !isfinite(y[i])) {
            out[i] = y[i];
            continue;
        }
        last = last * w + (1 - w) * y[i];
        k++;
        out[i] = w != 1 ? last / (1 - pow(w, (double)k)) : last;
    }
}

/* A curve: (x, y) points in step order. */
typedef struct series { int64_t n, cap; double *x, *y; } series;

static int series_add(series *s, double x, double y)
{
    if (!isfinite(y)) return 0;
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx) return ft_err(-ENOMEM, "out of memory");
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny) return ft_err(-ENOMEM, "out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

static void series_free(series *s)
{
    free(s->x);
    free(s->y);
}

enum { S_LOSS, S_SMOOTH, S_EVAL, S_LR, S_TPS, S_N };
static const char *const k_series[S_N] = {"train_loss", "train_loss_smoothed", "eval_loss", "lr",
                                          "tokens_per_s"};

typedef struct rundata {
    char label[256];
    const char *dir, *status;
    cJSON *params;       /* object or NULL */
    series s[S_N];
    cJSON *summary;      /* summary.json or NULL */
    cJSON *config;       /* the latest checkpoint's run config or NULL */
    cJSON *samples;      /* array of samples.jsonl objects or NULL */
} rundata;

static void rundata_free(rundata *r)
{
    for (int i = 0; i < S_N; i++) series_free(&r->s[i]);
    cJSON_Delete(r->params);
    cJSON_Delete(r->summary);
    cJSON_Delete(r->config);
    cJSON_Delete(r->samples);
}

static double num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Each complete line of the JSONL file path (a last line without '\n', which a run is
 * writing, is left out; blank lines are skipped) parsed and passed to fn. *found = 0 if
 * the file does not exist. */
static int read_jsonl(const char *path, int *found, int (*fn)(rundata *, cJSON *), rundata *r)
{
    char *txt;
    size_t len;
    int rc = ft_read_file(path, &txt, &len);
    *found = rc != -ENOENT;
    if (rc == -ENOENT) return 0;
    FT_TRY(rc);
    int64_t lineno = 0;
    for (size_t i = 0; i < len && !rc;) {
        size_t j = i;
        while (j < len && txt[j] != '\n') j++;
        lineno++;
        size_t k = i;
        while (k < j && (txt[k] == ' ' || txt[k] == '\t' || txt[k] == '\r')) k++;
        if (j < len && k < j) {
            cJSON *o = cJSON_ParseWithLength(txt + i, j - i);
            if (!cJSON_IsObject(o)) {
                cJSON_Delete(o);
                rc = ft_err(FT_E_INVALID, "%s:%lld: not a JSON object", path, (long long)lineno);
            } else {
                rc = fn(r, o); /* takes o */
            }
        }
        i = j + 1;
    }
    free(txt);
    return rc;
}

static int metrics_line(rundata *r, cJSON *o)
{
    double step = num_of(o, "step");
    int rc = 0;
    if (isfinite(step)) {
        if (cJSON_HasObjectItem(o, "eval_loss")) {
            rc = series_add(&r->s[S_EVAL], step, num_of(o, "eval_loss"));
        } else if (cJSON_HasObjectItem(o, "loss")) {
            rc = series_add(&r->s[S_LOSS], step, num_of(o, "loss"));
            if (!rc) rc = series_add(&r->s[S_LR], step, num_of(o, "lr"));
            if (!rc) rc = series_add(&r->s[S_TPS], step, num_of(o, "tokens_per_s"));
        }
    }
    cJSON_Delete(o);
    return rc;
}

static int sample_line(rundata *r, cJSON *o)
{
    if (!r->samples && !(r->samples = cJSON_CreateArray())) {
        cJSON_Delete(o);
        return ft_err(-ENOMEM, "out of memory");
    }
    cJSON_AddItemToArray(r->samples, o);
    return 0;
}

/* dir/name parsed as a JSON object into *out (NULL when the file does not exist). */
static int read_object(const char *dir, const char *name, cJSON **out)
{
    char path[4200];
    FT_TRY(ft_path_join(path, sizeof path, dir, name));
    char *txt;
    size_t len;
    *out = NULL;
    int rc = ft_read_file(path, &txt, &len);
    if (rc == -ENOENT) return 0;
    FT_TRY(rc);
    cJSON *o = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return ft_err(FT_E_INVALID, "%s: not a JSON object", path);
    }
    *out = o;
    return 0;
}

/* The run config ("config" of trainer_state.json) of the checkpoint-N folder of dir with
 * the highest N whose state parses (not the full check of ft_ckpt_find_latest, which
 * hashes the optimizer state: the report only reads the settings). NULL if none. */
static int latest_config(const char *dir, cJSON **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t step = ft_ckpt_parse_name(e->d_name);
        if (step <= best) continue;
        char ck[4200];
        cJSON *st = NULL;
        if (ft_path_join(ck, sizeof ck, dir, e->d_name) < 0 ||
            read_object(ck, FT_CKPT_STATE_FILE, &st) < 0 || !st) {
            ft_err_clear();
            continue;
        }
        cJSON *cfg = cJSON_DetachItemFromObjectCaseSensitive(st, "config");
        cJSON_Delete(st);
        if (!cJSON_IsObject(cfg)) {
            cJSON_Delete(cfg);
            continue;
        }
        cJSON_Delete(*out);
        *out = cfg;
        best = step;
    }
    closedir(d);
    return 0;
}

static int load_run(rundata *r, const ft_report_run *in)
{
    memset(r, 0, sizeof *r);
    r->dir = in->dir;
    r->status = in->status;
    if (in->name) {
        snprintf(r->label, sizeof r->label, "%s", in->name);
    } else {
        size_t l = strlen(in->dir);
        while (l > 1 && in->dir[l - 1] == '/') l--;
        size_t b = l;
        while (b > 0 && in->dir[b - 1] != '/') b--;
        snprintf(r->label, sizeof r->label, "%.*s", (int)(l - b), in->dir + b);
    }
    if (in->params) {
        r->params = cJSON_Parse(in->params);
        if (!cJSON_IsObject(r->params))
            return ft_err(FT_E_INVALID, "%s: the run's params are not a JSON object: %s", in->dir, in->params);
    }
    char path[4200];
    int found;
    FT_TRY(ft_path_join(path, sizeof path, in->dir, "metrics.jsonl"));
    FT_TRY(read_jsonl(path, &found, metrics_line, r));
    if (!found) return ft_err(FT_E_NOTFOUND, "%s: no metrics.jsonl (not an ftune run folder)", in->dir);
    series *l = &r->s[S_LOSS], *sm = &r->s[S_SMOOTH];
    for (int64_t i = 0; i < l->n; i++) FT_TRY(series_add(sm, l->x[i], l->y[i]));
    ft_report_smooth(l->y, l->n, FT_REPORT_SMOOTHING, sm->y);
    FT_TRY(ft_path_join(path, sizeof path, in->dir, "samples.jsonl"));
    FT_TRY(read_jsonl(path, &found, sample_line, r));
    FT_TRY(read_object(in->dir, "summary.json", &r->summary));
    return latest_config(in->dir, &r->config);
}

/* ---- HTML ---- */

static void esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

static const char *const k_palette[10] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/* A step of about range / 5 of the form {1, 2, 5} x 10^k. */
static double nice_step(double range)
{
    double raw = range / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

enum { CW = 520, CH = 280, ML = 66, MR = 14, MT = 30, MB = 42 };

typedef struct line {
    const series *s;
    const char *kind, *run, *color;
    double width, opacity;
    int dashed, markers;
} line;

/* One chart figure: axes with ticks, the lines, a legend of labels[0..n_labels). */
static void chart(FILE *f, const char *id, const char *title, const char *ylabel,
                  const line *ln, int n, const char *const *labels, const char *const *colors,
                  int n_labels)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < ln[i].s->n; k++) {
            x0 = fmin(x0, ln[i].s->x[k]), x1 = fmax(x1, ln[i].s->x[k]);
            y0 = fmin(y0, ln[i].s->y[k]), y1 = fmax(y1, ln[i].s->y[k]);
        }
    fprintf(f, "<figure class=\"chart\" id=\"chart-%s\"><svg xmlns=\"http://www.w3.org/2000/svg\" "
               "viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"",
            id, CW, CH, CW, CH);
    esc(f, title);
    fprintf(f, "\"><text class=\"title\" x=\"%d\" y=\"18\">", ML);
    esc(f, title);
    fputs("</text>", f);
    const double pw = CW - ML - MR, ph = CH - MT - MB;
    if (!(x0 <= x1)) {
        fprintf(f, "<text class=\"empty\" x=\"%g\" y=\"%g\">no data</text></svg></figure>\n",
                ML + pw / 2, MT + ph / 2);
        return;
    }
    if (x1 == x0) x0 -= 1, x1 += 1;
    double pad = (y1 - y0) * 0.05;
    if (pad == 0) pad = fabs(y0) > 0 ? fabs(y0) * 0.05 : 1;
    y0 -= pad, y1 += pad;
    fprintf(f, "<rect class=\"plot\" x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\"/>", ML, MT, pw, ph);
    double xs = nice_step(x1 - x0), ys = nice_step(y1 - y0);
    for (double t = ceil(x0 / xs) * xs; t <= x1 + xs * 1e-9; t += xs) {
        double px = ML + (t - x0) / (x1 - x0) * pw;
        fprintf(f, "<line class=\"grid\" x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%g\"/>"
                   "<text class=\"tick\" x=\"%.2f\" y=\"%g\" text-anchor=\"middle\">%g</text>",
                px, MT, px, MT + ph, px, MT + ph + 15, fabs(t) < xs * 1e-9 ? 0.0 : t);
    }
    for (double t = ceil(y0 / ys) * ys; t <= y1 + ys * 1e-9; t += ys) {
        double py = MT + (y1 - t) / (y1 - y0) * ph;
        fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.2f\" x2=\"%g\" y2=\"%.2f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.2f\" text-anchor=\"end\">%.4g</text>",
                ML, py, ML + pw, py, ML - 5, py + 4, fabs(t) < ys * 1e-9 ? 0.0 : t);
    }
    fprintf(f, "<text class=\"label\" x=\"%g\" y=\"%d\" text-anchor=\"middle\">step</text>",
            ML + pw / 2, CH - 6);
    fprintf(f, "<text class=\"label\" transform=\"translate(14 %g) rotate(-90)\" text-anchor=\"middle\">",
            MT + ph / 2);
    esc(f, ylabel);
    fputs("</text>", f);
    for (int i = 0; i < n; i++) {
        const series *s = ln[i].s;
        if (!s->n) continue;
        fprintf(f, "<polyline class=\"curve\" data-series=\"%s\" data-run=\"", ln[i].kind);
        esc(f, ln[i].run);
        fprintf(f, "\" data-points=\"%lld\" fill=\"none\" stroke=\"%s\" stroke-width=\"%g\" "
                   "stroke-opacity=\"%g\"%s points=\"",
                (long long)s->n, ln[i].color, ln[i].width, ln[i].opacity,
                ln[i].dashed ? " stroke-dasharray=\"5 3\"" : "");
        for (int64_t k = 0; k < s->n; k++)
            fprintf(f, "%s%.2f,%.2f", k ? " " : "", ML + (s->x[k] - x0) / (x1 - x0) * pw,
                    MT + (y1 - s->y[k]) / (y1 - y0) * ph);
        fputs("\"/>", f);
        for (int64_t k = 0; ln[i].markers && k < s->n; k++)
            fprintf(f, "<circle class=\"marker\" cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>",
                    ML + (s->x[k] - x0) / (x1 - x0) * pw, MT + (y1 - s->y[k]) / (y1 - y0) * ph,
                    ln[i].color);
    }
    fputs("</svg><figcaption>", f);
    for (int i = 0; i < n_labels; i++) {
        fprintf(f, "<span class=\"key\"><i style=\"background:%s\"></i>", colors[i]);
        esc(f, labels[i]);
        fputs("</span>", f);
    }
    fputs("</figcaption></figure>\n", f);
}

static void charts(FILE *f, const rundata *r, int64_t n)
{
    line *ln = calloc((size_t)(2 * n), sizeof *ln);
    const char **labels = calloc((size_t)(n + 2), sizeof *labels);
    const char **colors = calloc((size_t)(n + 2), sizeof *colors);
    char (*names)[300] = calloc((size_t)n, sizeof *names);
    if (!ln || !labels || !colors || !names) goto out;
    static const char *const titles[S_N] = {"Train loss", "", "Eval loss", "Learning rate",
                                            "Tokens per second"};
    static const char *const ylabels[S_N] = {"loss", "", "eval loss", "lr", "tokens/s"};
    static const char *const ids[S_N] = {"train_loss", "", "eval_loss", "lr", "tokens_per_s"};
    static const char *const single[S_N] = {"#1f77b4", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"};
    for (int64_t i = 0; i < n; i++) {
        const char *pr = r[i].status && !strcmp(r[i].status, "pruned") ? " (pruned)" : "";
        snprintf(names[i], sizeof names[i], "%s%s", r[i].label, pr);
        labels[i] = names[i];
        colors[i] = k_palette[i % 10];
    }
    fputs("<section class=\"charts\">\n", f);
    for (int c = 0; c < S_N; c++) {
        if (c == S_SMOOTH) continue;
        int m = 0;
        for (int64_t i = 0; i < n; i++) {
            const char *col = n == 1 ? single[c] : k_palette[i % 10];
            int dashed = r[i].status && !strcmp(r[i].status, "pruned");
            if (c == S_LOSS) {
                ln[m++] = (line){&r[i].s[S_LOSS], k_series[S_LOSS], r[i].label, col, 1, 0.3, dashed, 0};
                ln[m++] = (line){&r[i].s[S_SMOOTH], k_series[S_SMOOTH], r[i].label, col, 2, 1, dashed, 0};
            } else {
                ln[m++] = (line){&r[i].s[c], k_series[c], r[i].label, col, c == S_EVAL ? 2 : 1.5, 1,
                                 dashed, c == S_EVAL};
            }
        }
        if (n == 1) {
            static const char *const lab2[2] = {"raw", "smoothed (EMA 0.6, as TensorBoard)"};
            static const char *const col2[2] = {"rgba(31,119,180,0.3)", "#1f77b4"};
            const char *lab1[1] = {r[0].label};
            const char *col1[1] = {single[c]};
            chart(f, ids[c], titles[c], ylabels[c], ln, m, c == S_LOSS ? lab2 : lab1,
                  c == S_LOSS ? col2 : col1, c == S_LOSS ? 2 : 1);
        } else {
            chart(f, ids[c], titles[c], ylabels[c], ln, m, labels, colors, (int)n);
        }
    }
    fputs("</section>\n", f);
out:
    free(ln);
    free(labels);
    free(colors);
    free(names);
}

/* A JSON value as table-cell text: strings as they are, numbers %.6g, arrays of scalars
 * joined with ", ", other values as compact JSON. */
static void cell_value(FILE *f, const cJSON *v)
{
    if (cJSON_IsString(v)) {
        esc(f, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        fprintf(f, "%.6g", v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", f);
    } else if (cJSON_IsNull(v)) {
        fputs("null", f);
    } else {
        char *s = cJSON_PrintUnformatted(v);
        if (s) esc(f, s);
        free(s);
    }
}

/* A table of an object's keys and values; nested objects as "outer.inner" rows. */
static void kv_rows(FILE *f, const cJSON *o, const char *prefix)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        char key[512];
        snprintf(key, sizeof key, "%s%s", prefix, it->string ? it->string : "");
        if (cJSON_IsObject(it) && cJSON_GetArraySize(it) > 0) {
            char p[520];
            snprintf(p, sizeof p, "%s.", key);
            kv_rows(f, it, p);
            continue;
        }
        fputs("<tr><th>", f);
        esc(f, key);
        fputs("</th><td>", f);
        cell_value(f, it);
        fputs("</td></tr>\n", f);
    }
}

static void kv_table(FILE *f, const char *h, const cJSON *o, const char *none)
{
    fprintf(f, "<h2>%s</h2>\n", h);
    if (!o) {
        fprintf(f, "<p class=\"note\">%s</p>\n", none);
        return;
    }
    fputs("<table class=\"kv\">\n", f);
    kv_rows(f, o, "");
    fputs("</table>\n", f);
}

static void samples(FILE *f, const cJSON *a)
{
    if (!a) return;
    fputs("<h2>Samples</h2>\n", f);
    double step = NAN;
    const cJSON *it;
    int open = 0;
    cJSON_ArrayForEach(it, a) {
        double s = num_of(it, "step");
        if (!open || !(s == step)) {
            if (open) fputs("</table></details>\n", f);
            fprintf(f, "<details open><summary>step %.0f</summary><table class=\"samples\">"
                       "<tr><th>prompt</th><th>reply</th></tr>\n", s);
            open = 1;
            step = s;
        }
        fputs("<tr><td>", f);
        cell_value(f, cJSON_GetObjectItemCaseSensitive(it, "prompt"));
        fputs("</td><td>", f);
        cell_value(f, cJSON_GetObjectItemCaseSensitive(it, "reply"));
        fputs("</td></tr>\n", f);
    }
    if (open) fputs("</table></details>\n", f);
}

/* A number cell sortable by its value (data-v); null as empty. */
static void num_cell(FILE *f, const cJSON *o, const char *key)
{
    double v = num_of(o, key);
    if (isfinite(v)) fprintf(f, "<td data-v=\"%.17g\">%.6g</td>", v, v);
    else fputs("<td data-v=\"\"></td>", f);
}

static void runs_table(FILE *f, const rundata *r, int64_t n)
{
    /* the params columns: every key of any run, in first-seen order */
    cJSON *keys = cJSON_CreateArray();
    for (int64_t i = 0; i < n && keys; i++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, r[i].params) {
            int seen = 0;
            const cJSON *k;
            cJSON_ArrayForEach(k, keys) seen |= !strcmp(k->valuestring, it->string);
            if (!seen) cJSON_AddItemToArray(keys, cJSON_CreateString(it->string));
        }
    }
    static const char *const cols[6] = {"steps", "final_train_loss", "final_eval_loss",
                                        "best_eval_loss", "best_eval_step", "tokens_per_s"};
    fputs("<h2>Runs</h2>\n<p class=\"note\">Click a column header to sort.</p>\n"
          "<table class=\"runs sortable\" id=\"runs\"><thead><tr><th>run</th><th>status</th>", f);
    const cJSON *k;
    cJSON_ArrayForEach(k, keys) {
        fputs("<th>", f);
        esc(f, k->valuestring);
        fputs("</th>", f);
    }
    for (int c = 0; c < 6; c++) fprintf(f, "<th>%s</th>", cols[c]);
    fputs("</tr></thead><tbody>\n", f);
    for (int64_t i = 0; i < n; i++) {
        fprintf(f, "<tr><td><i class=\"sw\" style=\"background:%s\"></i>", k_palette[i % 10]);
        esc(f, r[i].label);
        fputs("</td><td>", f);
        esc(f, r[i].status ? r[i].status : r[i].summary ? "completed" : "running");
        fputs("</td>", f);
        cJSON_ArrayForEach(k, keys) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(r[i].params, k->valuestring);
            if (cJSON_IsNumber(v)) fprintf(f, "<td data-v=\"%.17g\">", v->valuedouble);
            else fputs("<td>", f);
            if (v) cell_value(f, v);
            fputs("</td>", f);
        }
        for (int c = 0; c < 6; c++) num_cell(f, r[i].summary, cols[c]);
        fputs("</tr>\n", f);
    }
    fputs("</tbody></table>\n", f);
    /* sorting: a click on a header orders the rows by that column (numbers by data-v,
     * text by its content), a second click reverses */
    fputs("<script>\n"
          "document.querySelectorAll('table.sortable').forEach(function (t) {\n"
          "  t.querySelectorAll('thead th').forEach(function (th, col) {\n"
          "    th.addEventListener('click', function () {\n"
          "      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);\n"
          "      var dir = th.dataset.dir === 'asc' ? -1 : 1;\n"
          "      t.querySelectorAll('thead th').forEach(function (h) { delete h.dataset.dir; });\n"
          "      th.dataset.dir = dir > 0 ? 'asc' : 'desc';\n"
          "      function key(r) { var c = r.cells[col]; return c.dataset.v !== undefined ? "
          "(c.dataset.v === '' ? Infinity : parseFloat(c.dataset.v)) : c.textContent; }\n"
          "      rows.sort(function (a, b) { var x = key(a), y = key(b); "
          "return (x < y ? -1 : x > y ? 1 : 0) * dir; });\n"
          "      rows.forEach(function (r) { body.appendChild(r); });\n"
          "    });\n"
          "  });\n"
          "});\n"
          "</script>\n", f);
    cJSON_Delete(keys);
}

static const char k_css[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;"
    "margin:24px;color:#222;background:#fff}h1{font-size:22px;margin:0 0 4px}"
    "h2{font-size:17px;margin:28px 0 8px}.sub,.note{color:#666;font-size:13px;margin:2px 0}"
    ".charts{display:flex;flex-wrap:wrap;gap:12px}.chart{margin:0;border:1px solid #ddd;"
    "border-radius:4px;padding:4px}.chart svg{display:block}.plot{fill:#fafafa;stroke:#bbb}"
    ".grid{stroke:#e4e4e4}.tick{font-size:11px;fill:#555}.label{font-size:12px;fill:#333}"
    ".title{font-size:14px;font-weight:600;fill:#222}.empty{font-size:13px;fill:#999;"
    "text-anchor:middle}figcaption{font-size:12px;padding:2px 8px 6px}.key{margin-right:14px;"
    "white-space:nowrap}.key i,.sw{display:inline-block;width:14px;height:3px;"
    "vertical-align:middle;margin-right:5px}table{border-collapse:collapse;font-size:13px}"
    "th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
    "table.kv th{background:#f6f6f6;font-weight:500}table.sortable th{cursor:pointer;"
    "background:#f0f0f0}table.sortable th[data-dir=asc]::after{content:' \\25B2'}"
    "table.sortable th[data-dir=desc]::after{content:' \\25BC'}table.samples td{"
    "white-space:pre-wrap;max-width:560px}details{margin:6px 0}summary{cursor:pointer}\n";

static int page(const char *out_path, const char *title, const rundata *r, int64_t n, int single)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return ft_err(-ENOMEM, "%s: out of memory", out_path);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width\"><title>", f);
    esc(f, title);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>", k_css);
    esc(f, title);
    fputs("</h1>\n", f);
    if (single) {
        fputs("<p class=\"sub\">", f);
        esc(f, r[0].dir);
        fprintf(f, " &middot; %lld steps logged, %lld evaluations%s</p>\n", (long long)r[0].s[S_LOSS].n,
                (long long)r[0].s[S_EVAL].n, r[0].summary ? "" : " &middot; no summary.json yet (in progress, or stopped)");
    } else {
        fprintf(f, "<p class=\"sub\">%lld runs</p>\n", (long long)n);
    }
    charts(f, r, n);
    if (single) {
        kv_table(f, "Summary", r[0].summary, "No summary.json: the run is in progress or did not complete.");
        kv_table(f, "Settings", r[0].config, "No checkpoint holds this run's settings yet.");
        samples(f, r[0].samples);
    } else {
        runs_table(f, r, n);
    }
    fputs("</body></html>\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return ft_err(-ENOMEM, "%s: out of memory", out_path);
    }
    int rc = ft_write_file_atomic(out_path, buf, len);
    free(buf);
    return rc;
}

int ft_report_write_runs(const char *out_path, const char *title, const ft_report_run *runs,
                         int64_t n_runs)
{
    if (n_runs < 1) return ft_err(FT_E_INVALID, "%s: a report needs at least one run", out_path);
    rundata *r = calloc((size_t)n_runs, sizeof *r);
    if (!r) return ft_err(-ENOMEM, "out of memory");
    int rc = 0;
    int64_t loaded = 0;
    for (; loaded < n_runs && !rc; loaded++) rc = load_run(&r[loaded], &runs[loaded]);
    int single = n_runs == 1 && !runs[0].status && !runs[0].params;
    if (!rc) rc = page(out_path, title ? title : "ftune report", r, n_runs, single);
    for (int64_t i = 0; i < loaded; i++) rundata_free(&r[i]);
    free(r);
    return rc;
}

int ft_report_write(const char *dir, char *path, size_t n)
{
    char p[4200], title[4300];
    FT_TRY(ft_path_join(p, sizeof p, dir, FT_REPORT_FILE));
    ft_report_run run = {.dir = dir};
    snprintf(title, sizeof title, "ftune report: %s", dir);
    FT_TRY(ft_report_write_runs(p, title, &run, 1));
    if (path && n) snprintf(path, n, "%s", p);
    return 0;
}

int ft_report_model_card(const char *dir)
{
    cJSON *summary, *config = NULL;
    FT_TRY(read_object(dir, "summary.json", &summary));
    int rc = latest_config(dir, &config);
    if (!rc) rc = ft_model_card_write(dir, summary, config);
    cJSON_Delete(summary);
    cJSON_Delete(config);
    return rc;
}
