/* timeline.c - spans of one step and their SVG picture (see timeline.h).
 *
 * The picture: a title line, a legend of the span kinds, then one row per lane that has spans
 * (the lane's name and its busy fraction on the left, a bar per span, colored by kind and
 * labeled with its layer when wide enough, a <title> tooltip with the exact times), and an
 * axis in milliseconds with "nice" ticks (1, 2 or 5 x 10^k) below. Only spans are drawn as
 * <rect> elements (the legend uses circles), so a reader can count spans in the file. */
#include "offload/timeline.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

static const char *const lane_name[FT_TL_N_LANES] = {"compute", "H2D copy", "D2H copy", "disk read"};
static const char *const lane_id[FT_TL_N_LANES] = {"compute", "h2d", "d2h", "disk"};
static const char *const kind_name[] = {"fwd", "bwd", "head", "weights", "ckpt", "other"};
static const char *const kind_color[] = {"#4e79a7", "#e15759", "#b07aa1", "#59a14f", "#f28e2b", "#9c9c9c"};
#define N_KINDS ((int)(sizeof kind_name / sizeof kind_name[0]))

int ft_timeline_add(ft_timeline *t, int lane, int kind, int64_t layer, int64_t micro,
                    double t0, double t1)
{
    if (lane < 0 || lane >= FT_TL_N_LANES)
        return ft_err(FT_E_INVALID, "timeline: lane %d outside 0..%d", lane, FT_TL_N_LANES - 1);
    if (kind < 0 || kind >= N_KINDS) kind = FT_TL_OTHER;
    if (t->n == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 256;
        ft_tl_span *s = realloc(t->s, (size_t)cap * sizeof *s);
        if (!s) return ft_err(-ENOMEM, "timeline: out of memory (%lld spans)", (long long)cap);
        t->s = s;
        t->cap = cap;
    }
    ft_tl_span *s = &t->s[t->n++];
    s->t0 = t0;
    s->t1 = t1 < t0 ? t0 : t1;
    s->layer = layer < INT32_MIN ? INT32_MIN : layer > INT32_MAX ? INT32_MAX : (int32_t)layer;
    s->lane = (int8_t)lane;
    s->kind = (int8_t)kind;
    s->micro = micro < -1 ? -1 : micro > INT16_MAX ? INT16_MAX : (int16_t)micro;
    return 0;
}

void ft_timeline_reset(ft_timeline *t) { t->n = 0; }

void ft_timeline_free(ft_timeline *t)
{
    if (!t) return;
    free(t->s);
    t->s = NULL;
    t->n = t->cap = 0;
}

typedef struct { double a, b; } ival;

static int ival_cmp(const void *x, const void *y)
{
    double a = ((const ival *)x)->a, b = ((const ival *)y)->a;
    return (a > b) - (a < b);
}

/* Union length of the lane's spans: sorted by start, merged. NAN if out of memory. */
double ft_timeline_busy(const ft_timeline *t, int lane)
{
    int64_t m = 0;
    for (int64_t i = 0; i < t->n; i++) m += t->s[i].lane == lane;
    if (m == 0) return 0;
    ival *v = malloc((size_t)m * sizeof *v);
    if (!v) return NAN;
    m = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->s[i].lane == lane) v[m++] = (ival){t->s[i].t0, t->s[i].t1};
    qsort(v, (size_t)m, sizeof *v, ival_cmp);
    double busy = 0, a = v[0].a, b = v[0].b;
    for (int64_t i = 1; i < m; i++) {
        if (v[i].a > b) {
            busy += b - a;
            a = v[i].a;
            b = v[i].b;
        } else if (v[i].b > b) {
            b = v[i].b;
        }
    }
    busy += b - a;
    free(v);
    return busy;
}

double ft_timeline_span(const ft_timeline *t)
{
    double e = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->s[i].t1 > e) e = t->s[i].t1;
    return e;
}

/* ---- SVG ----------------------------------------------------------------------------- */

#define W_PX 1200.0   /* picture width */
#define LEFT_PX 150.0 /* lane names and busy fractions */
#define RIGHT_PX 24.0
#define TOP_PX 62.0   /* title, subtitle, legend */
#define ROW_PX 30.0
#define BAR_PX 22.0
#define AXIS_PX 36.0
#define CHAR_PX 6.6   /* width of one character of the 11 px labels, roughly */

static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            /* control characters are not allowed in XML 1.0 */
            if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n') fputc('?', f);
            else fputc(*s, f);
        }
    }
}

/* A tick step of 1, 2 or 5 x 10^k ms giving at most ~10 ticks over total_ms. */
static double tick_step(double total_ms)
{
    double raw = total_ms / 10.0, p = pow(10.0, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

int ft_timeline_write_svg(const ft_timeline *t, const char *path, const char *title)
{
    int used[FT_TL_N_LANES] = {0}, row[FT_TL_N_LANES], n_rows = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (t->s[i].lane >= 0 && t->s[i].lane < FT_TL_N_LANES) used[t->s[i].lane] = 1;
    for (int l = 0; l < FT_TL_N_LANES; l++) row[l] = used[l] ? n_rows++ : -1;

    double total = ft_timeline_span(t);
    double total_ms = total > 0 ? total * 1e3 : 1.0;
    double plot_w = W_PX - LEFT_PX - RIGHT_PX;
    double sx = plot_w / total_ms; /* px per ms */
    double rows_h = (n_rows ? n_rows : 1) * ROW_PX;
    double h = TOP_PX + rows_h + AXIS_PX;

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return ft_err(-ENOMEM, "%s: out of memory", path);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\" "
               "style=\"background:#ffffff\">\n", W_PX, h, W_PX, h);
    fputs("<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">", f);
    put_escaped(f, title ? title : "ftune step timeline");
    fputs("</text>\n", f);
    fprintf(f, "<text x=\"8\" y=\"34\" fill=\"#444\">step %.2f ms, %lld spans", total * 1e3,
            (long long)t->n);
    for (int l = 0; l < FT_TL_N_LANES; l++)
        if (used[l]) {
            double b = ft_timeline_busy(t, l);
            fprintf(f, "; %s busy %.1f%%", lane_name[l], total > 0 ? 100.0 * b / total : 0.0);
        }
    fputs("</text>\n", f);
    /* legend: circles, so that <rect> elements are exactly the spans */
    double lx = LEFT_PX;
    for (int k = 0; k < N_KINDS; k++) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"48\" r=\"5\" fill=\"%s\"/>"
                   "<text x=\"%.1f\" y=\"52\">%s</text>\n", lx, kind_color[k], lx + 8, kind_name[k]);
        lx += 80;
    }

    /* grid lines and axis */
    double step = tick_step(total_ms);
    double y_axis = TOP_PX + rows_h;
    fprintf(f, "<g stroke=\"#dddddd\" stroke-width=\"1\">\n");
    for (double v = 0; v <= total_ms * (1 + 1e-9); v += step)
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\"/>\n", LEFT_PX + v * sx,
                TOP_PX, LEFT_PX + v * sx, y_axis);
    fputs("</g>\n", f);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>\n",
            LEFT_PX, y_axis, LEFT_PX + plot_w, y_axis);
    fprintf(f, "<g class=\"axis\" text-anchor=\"middle\">\n");
    int prec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    for (double v = 0; v <= total_ms * (1 + 1e-9); v += step) {
        double x = LEFT_PX + v * sx;
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#000\"/>"
                   "<text x=\"%.2f\" y=\"%.1f\">%.*f</text>\n",
                x, y_axis, x, y_axis + 5, x, y_axis + 17, prec, v);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">ms</text>\n</g>\n", LEFT_PX + plot_w / 2, y_axis + 31);

    /* lanes: name, busy fraction, bars */
    for (int l = 0; l < FT_TL_N_LANES; l++) {
        if (row[l] < 0) continue;
        double y = TOP_PX + row[l] * ROW_PX + (ROW_PX - BAR_PX) / 2;
        double b = ft_timeline_busy(t, l);
        fprintf(f, "<g class=\"lane\" id=\"lane-%s\">\n", lane_id[l]);
        fprintf(f, "<text x=\"8\" y=\"%.1f\" font-weight=\"bold\">", y + 10);
        put_escaped(f, lane_name[l]);
        fprintf(f, "</text><text x=\"8\" y=\"%.1f\" fill=\"#444\">busy %.1f%% (%.2f ms)</text>\n",
                y + 22, total > 0 ? 100.0 * b / total : 0.0, b * 1e3);
        for (int64_t i = 0; i < t->n; i++) {
            const ft_tl_span *s = &t->s[i];
            if (s->lane != l) continue;
            int k = s->kind >= 0 && s->kind < N_KINDS ? s->kind : FT_TL_OTHER;
            double x = LEFT_PX + s->t0 * 1e3 * sx, w = (s->t1 - s->t0) * 1e3 * sx;
            if (w < 0.5) w = 0.5; /* keep very short spans visible */
            fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
                       "fill-opacity=\"0.9\" stroke=\"#ffffff\" stroke-width=\"0.5\">"
                       "<title>%s", x, y, w, BAR_PX, kind_color[k], kind_name[k]);
            if (s->layer >= 0) fprintf(f, " layer %d", (int)s->layer);
            if (s->micro >= 0) fprintf(f, " micro %d", (int)s->micro);
            fprintf(f, ": %.3f - %.3f ms (%.3f ms)</title></rect>\n", s->t0 * 1e3, s->t1 * 1e3,
                    (s->t1 - s->t0) * 1e3);
            char lab[24];
            if (s->layer >= 0) snprintf(lab, sizeof lab, "%d", (int)s->layer);
            else snprintf(lab, sizeof lab, "%s", kind_name[k]);
            if (w >= strlen(lab) * CHAR_PX + 4)
                fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" fill=\"#ffffff\" text-anchor=\"middle\" "
                           "pointer-events=\"none\">%s</text>\n", x + w / 2, y + BAR_PX / 2 + 4, lab);
        }
        fputs("</g>\n", f);
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return ft_err(-ENOMEM, "%s: out of memory", path);
    }
    int rc = ft_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}
