/* jinja_filters.c - filters of the Jinja interpreter (jinja.h), with jinja2 3.1's semantics
 * (filters.py) and transformers' tojson = json.dumps(x, ensure_ascii=False, indent,
 * separators, sort_keys) (positional arguments in that order, as its signature has them).
 *
 * Filters: abs, attr, capitalize, center, count, d/default, dictsort, e/escape/forceescape,
 * first, float, indent, int, items, join, last, length, list, lower, map, max, min, reject,
 * rejectattr, replace, reverse (a list, not an iterator), round, safe, select, selectattr,
 * sort, string, sum, title, tojson, trim, unique, upper, wordcount, format (printf-style).
 * Known to jinja2 but not done here (a render reaching one fails with FT_E_INVALID): batch,
 * slice, groupby, truncate, wordwrap, urlize, urlencode, striptags, xmlattr,
 * filesizeformat, pprint, random. escape returns a plain string (no Markup: a later
 * concatenation does not escape the other side, unlike jinja2 with autoescape objects).
 */
#include "src/template/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

static jv mkstr(const char *p, size_t n)
{
    jv s = {.k = JV_STR};
    s.u.s.p = p; s.u.s.n = n;
    return s;
}

static jv bufstr(jbuf *b) { return mkstr(b->p ? b->p : "", b->n); }

static int is_num(const jv *x) { return x->k == JV_BOOL || x->k == JV_INT || x->k == JV_FLOAT; }

static int64_t int_opt(jctx *c, const jv *x, int64_t dflt, const char *what)
{
    if (!x || x->k == JV_NONE) return dflt;
    if (x->k == JV_INT) return x->u.i;
    if (x->k == JV_BOOL) return x->u.b;
    jfail(c, FT_E_INVALID, "%s must be an integer, not %s", what, jv_typename(x));
}

static int bool_opt(const jv *x, int dflt) { return x ? jv_truthy(x) : dflt; }

static jv lower_if_str(jctx *c, const jv *x)
{
    return x->k == JV_STR ? jstr_case(c, x, 0) : *x;
}

/* environment.getitem along a dotted path ("a.b", "0") */
static jv attr_path(jctx *c, const jv *item, const jv *path)
{
    if (path->k == JV_INT) return jgetitem(c, item, path);
    if (path->k != JV_STR) jfail(c, FT_E_INVALID, "attribute must be a string or an integer");
    jv cur = *item;
    const char *p = path->u.s.p, *e = p + path->u.s.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        const char *q = dot ? dot : e;
        jv key = mkstr(p, (size_t)(q - p));
        int digits = q > p;
        for (const char *r = p; r < q; r++) if (*r < '0' || *r > '9') digits = 0;
        if (digits) key = jv_int(strtoll(p, NULL, 10));
        if (cur.k == JV_UNDEF) return cur;
        cur = jgetitem(c, &cur, &key);
        if (!dot) break;
        p = dot + 1;
    }
    return cur;
}

/* stable merge sort by cmp(key) */
typedef struct sort_item { jv key, val; } sort_item;
static void merge_sort(jctx *c, sort_item *a, sort_item *tmp, int64_t n, int reverse)
{
    if (n < 2) return;
    int64_t h = n / 2;
    merge_sort(c, a, tmp, h, reverse);
    merge_sort(c, a + h, tmp, n - h, reverse);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = jv_cmp(c, &a[j].key, &a[i].key);
        /* Python's sort(reverse=True) keeps equal items in their original order */
        if (reverse ? r > 0 : r < 0) tmp[k++] = a[j++];
        else tmp[k++] = a[i++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

static jv sorted_list(jctx *c, sort_item *it, int64_t n, int reverse)
{
    sort_item *tmp = jalloc(c, (size_t)(n ? n : 1) * sizeof *tmp);
    merge_sort(c, it, tmp, n, reverse);
    jv out = jv_list(c, n);
    for (int64_t i = 0; i < n; i++) jlist_push(c, out.u.l, it[i].val);
    return out;
}

static void html_escape(jctx *c, jbuf *b, const jv *s)
{
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        switch (ch) {
        case '&': jbuf_puts(c, b, "&amp;"); break;
        case '<': jbuf_puts(c, b, "&lt;"); break;
        case '>': jbuf_puts(c, b, "&gt;"); break;
        case '\'': jbuf_puts(c, b, "&#39;"); break;
        case '"': jbuf_puts(c, b, "&#34;"); break;
        default: jbuf_putc(c, b, ch);
        }
    }
}

/* Python int(str): optional sign, digits with single underscores, surrounding whitespace */
static int parse_int(const jv *s, int64_t *out)
{
    jv t = *s;
    const char *p = t.u.s.p;
    size_t n = t.u.s.n, i = 0;
    while (i < n && (p[i] == ' ' || (p[i] >= 9 && p[i] <= 13))) i++;
    while (n > i && (p[n - 1] == ' ' || (p[n - 1] >= 9 && p[n - 1] <= 13))) n--;
    int neg = 0;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (i >= n || p[i] < '0' || p[i] > '9') return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (p[i] == '_' && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '9' && p[i - 1] != '_') continue;
        if (p[i] < '0' || p[i] > '9') return 0;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, p[i] - '0', &v)) return 0;
    }
    *out = neg ? -v : v;
    return 1;
}

static int parse_float(const jv *s, double *out)
{
    char buf[128];
    size_t n = s->u.s.n, k = 0;
    if (n >= sizeof buf) return 0;
    for (size_t i = 0; i < n; i++) if (s->u.s.p[i] != '_') buf[k++] = s->u.s.p[i];
    buf[k] = 0;
    char *end;
    const char *b = buf;
    while (*b == ' ' || (*b >= 9 && *b <= 13)) b++;
    if (!*b) return 0;
    if ((b[0] == '0' && (b[1] == 'x' || b[1] == 'X')) ||
        ((b[0] == '+' || b[0] == '-') && b[1] == '0' && (b[2] == 'x' || b[2] == 'X')))
        return 0;   /* Python float() takes no hex */
    double v = strtod(b, &end);
    while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
    if (*end) return 0;
    *out = v;
    return 1;
}

static double py_round(double x, int64_t nd)
{
    if (!isfinite(x)) return x;
    if (nd > 300) return x;
    if (nd < -300) return 0.0 * x;
    char buf[512];
    if (nd >= 0) {
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);   /* correctly rounded, ties to even */
        return strtod(buf, NULL);
    }
    double p = pow(10.0, (double)-nd), y = x / p, r = nearbyint(y);
    if (fabs(y - trunc(y)) == 0.5) r = 2.0 * nearbyint(y / 2.0);
    return r * p;
}

static jv select_reject(jctx *c, jscope *sc, jv *args, int nargs, int attr, int reject)
{
    jv *items;
    int64_t n;
    jiter(c, &args[0], &items, &n);
    int ti = attr ? 2 : 1;
    if (attr && nargs < 2) jfail(c, FT_E_INVALID, "Missing parameter for attribute name");
    const char *test = NULL;
    if (nargs > ti) {
        if (args[ti].k != JV_STR) jfail(c, FT_E_INVALID, "test name must be a string");
        char *t = jalloc(c, args[ti].u.s.n + 1);
        memcpy(t, args[ti].u.s.p, args[ti].u.s.n);
        test = t;
    }
    jv out = jv_list(c, 0);
    int nt = nargs > ti ? nargs - ti : 1;
    jv *targs = jalloc(c, (size_t)nt * sizeof *targs);
    for (int64_t i = 0; i < n; i++) {
        jstep(c);
        jv v = attr ? attr_path(c, &items[i], &args[1]) : items[i];
        int ok;
        if (test) {
            targs[0] = v;
            for (int k = ti + 1; k < nargs; k++) targs[k - ti] = args[k];
            ok = jtest(c, sc, test, targs, nargs - ti);
        } else {
            ok = jv_truthy(&v);
        }
        if (ok != reject) jlist_push(c, out.u.l, items[i]);
    }
    return out;
}

static jv do_tojson(jctx *c, jv *args, int nargs, const char **kwn, jv *kwv, int nkw)
{
    const jv *ea = jarg(args, nargs, 1, kwn, kwv, nkw, "ensure_ascii");
    const jv *ind = jarg(args, nargs, 2, kwn, kwv, nkw, "indent");
    const jv *sep = jarg(args, nargs, 3, kwn, kwv, nkw, "separators");
    const jv *sk = jarg(args, nargs, 4, kwn, kwv, nkw, "sort_keys");
    const char *indent = NULL;
    if (ind && ind->k != JV_NONE) {
        if (ind->k == JV_STR) {
            char *s = jalloc(c, ind->u.s.n + 1);
            memcpy(s, ind->u.s.p, ind->u.s.n);
            indent = s;
        } else if (ind->k == JV_INT || ind->k == JV_BOOL) {
            int64_t w = ind->k == JV_INT ? ind->u.i : ind->u.b;
            if (w > 4096) jfail(c, FT_E_RANGE, "tojson indent too large");
            char *s = jalloc(c, (size_t)(w > 0 ? w : 0) + 1);
            for (int64_t i = 0; i < w; i++) s[i] = ' ';
            indent = s;
        } else {
            jfail(c, FT_E_INVALID, "tojson indent must be an int or a str");
        }
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (sep && sep->k != JV_NONE) {
        if (sep->k != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].k != JV_STR ||
            sep->u.l->v[1].k != JV_STR)
            jfail(c, FT_E_INVALID, "tojson separators must be a pair of strings");
        char *a = jalloc(c, sep->u.l->v[0].u.s.n + 1), *b = jalloc(c, sep->u.l->v[1].u.s.n + 1);
        memcpy(a, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
        memcpy(b, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
        item_sep = a; key_sep = b;
    }
    jbuf b = {0};
    jv_json_to(c, &b, &args[0], bool_opt(ea, 0), indent, item_sep, key_sep, bool_opt(sk, 0), 0);
    return bufstr(&b);
}

static jv do_indent(jctx *c, const jv *s0, const jv *width, int first, int blank)
{
    jv s = jv_to_str(c, s0);
    jbuf ind = {0};
    if (width && width->k == JV_STR) {
        jbuf_put(c, &ind, width->u.s.p, width->u.s.n);
    } else {
        int64_t w = int_opt(c, width, 4, "width");
        if (w > 4096) jfail(c, FT_E_RANGE, "indent width too large");
        for (int64_t i = 0; i < w; i++) jbuf_putc(c, &ind, ' ');
    }
    /* s += "\n"; lines = s.splitlines() */
    jbuf t = {0};
    jbuf_put(c, &t, s.u.s.p, s.u.s.n);
    jbuf_putc(c, &t, '\n');
    jv st = bufstr(&t);
    jv lines = jmethod_call(c, &st, "splitlines", NULL, 0, NULL, NULL, 0);
    jbuf b = {0};
    if (first) jbuf_put(c, &b, ind.p, ind.n);
    for (int64_t i = 0; i < lines.u.l->n; i++) {
        const jv *ln = &lines.u.l->v[i];
        if (i) {
            jbuf_putc(c, &b, '\n');
            if (blank || ln->u.s.n) jbuf_put(c, &b, ind.p, ind.n);
        }
        jbuf_put(c, &b, ln->u.s.p, ln->u.s.n);
    }
    return bufstr(&b);
}

static int is_word(uint32_t cp)
{
    return cp == '_' || (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
           (cp >= 'A' && cp <= 'Z') || (cp >= 0x80 && !ju_isspace(cp) && cp != 0xa0 &&
                                        !(cp >= 0x2000 && cp <= 0x206f) && !(cp >= 0x3000 && cp <= 0x303f));
}

static const char *const UNSUPPORTED[] = {
    "batch", "slice", "groupby", "truncate", "wordwrap", "urlize", "urlencode", "striptags",
    "xmlattr", "filesizeformat", "pprint", "random", NULL};

jv jfilter(jctx *c, jscope *sc, const char *f, jv *args, int nargs, const char **kwn, jv *kwv,
           int nkw)
{
#define ARG(i, kw) jarg(args, nargs, i, kwn, kwv, nkw, kw)
    jv *x = &args[0];
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const jv *dv = ARG(1, "default_value");
        int boolean = bool_opt(ARG(2, "boolean"), 0);
        if (x->k == JV_UNDEF || (boolean && !jv_truthy(x))) return dv ? *dv : mkstr("", 0);
        return *x;
    }
    if (!strcmp(f, "tojson")) return do_tojson(c, args, nargs, kwn, kwv, nkw);
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        switch (x->k) {
        case JV_UNDEF: return jv_int(0);
        case JV_STR: return jv_int(ju_len(x->u.s.p, x->u.s.n));
        case JV_LIST: return jv_int(x->u.l->n);
        case JV_DICT: return jv_int(x->u.d->n);
        case JV_LOOP: return jv_int(x->u.loop->n);
        default: jfail(c, FT_E_INVALID, "object of type '%s' has no len()", jv_typename(x));
        }
    }
    if (!strcmp(f, "string")) return jv_to_str(c, x);
    if (!strcmp(f, "safe")) return jv_to_str(c, x);
    if (!strcmp(f, "trim")) { jv s = jv_to_str(c, x); return jstr_strip(c, &s, ARG(1, "chars"), 1, 1); }
    if (!strcmp(f, "upper")) { jv s = jv_to_str(c, x); return jstr_case(c, &s, 1); }
    if (!strcmp(f, "lower")) { jv s = jv_to_str(c, x); return jstr_case(c, &s, 0); }
    if (!strcmp(f, "capitalize")) { jv s = jv_to_str(c, x); return jstr_case(c, &s, 3); }
    if (!strcmp(f, "title")) { jv s = jv_to_str(c, x); return jstr_case(c, &s, 4); }
    if (!strcmp(f, "replace")) {
        jv s = jv_to_str(c, x);
        const jv *o = ARG(1, "old"), *nw = ARG(2, "new");
        if (!o || !nw) jfail(c, FT_E_INVALID, "replace filter needs old and new");
        jv os = jv_to_str(c, o), ns = jv_to_str(c, nw);
        return jstr_replace(c, &s, &os, &ns, int_opt(c, ARG(3, "count"), -1, "count"));
    }
    if (!strcmp(f, "center")) {
        jv s = jv_to_str(c, x);
        jv w = jv_int(int_opt(c, ARG(1, "width"), 80, "width"));
        return jmethod_call(c, &s, "center", &w, 1, NULL, NULL, 0);
    }
    if (!strcmp(f, "indent"))
        return do_indent(c, x, ARG(1, "width"), bool_opt(ARG(2, "first"), 0),
                         bool_opt(ARG(3, "blank"), 0));
    if (!strcmp(f, "wordcount")) {
        jv s = jv_to_str(c, x);
        int64_t k = 0;
        int in = 0;
        for (size_t i = 0; i < s.u.s.n;) {
            uint32_t cp;
            i += (size_t)ju_dec(s.u.s.p + i, s.u.s.n - i, &cp);
            int w = is_word(cp);
            if (w && !in) k++;
            in = w;
        }
        return jv_int(k);
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape")) {
        jv s = jv_to_str(c, x);
        jbuf b = {0};
        html_escape(c, &b, &s);
        return bufstr(&b);
    }
    if (!strcmp(f, "items")) {
        if (x->k == JV_UNDEF) return jv_list(c, 0);
        if (x->k != JV_DICT) jfail(c, FT_E_INVALID, "Can only get item pairs from a mapping.");
        return jmethod_call(c, x, "items", NULL, 0, NULL, NULL, 0);
    }
    if (!strcmp(f, "list")) {
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        jv out = jv_list(c, n);
        for (int64_t i = 0; i < n; i++) jlist_push(c, out.u.l, items[i]);
        return out;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        jv *items;
        int64_t n;
        if (x->k == JV_UNDEF && f[0] == 'l') return jv_undef("No last item, sequence was empty.");
        jiter(c, x, &items, &n);
        if (!n) return jv_undef(f[0] == 'f' ? "No first item, sequence was empty."
                                            : "No last item, sequence was empty.");
        return items[f[0] == 'f' ? 0 : n - 1];
    }
    if (!strcmp(f, "reverse")) {
        if (x->k == JV_STR) {   /* value[::-1], by code points */
            jv *items;
            int64_t n;
            jiter(c, x, &items, &n);
            jbuf b = {0};
            for (int64_t i = n - 1; i >= 0; i--) jbuf_put(c, &b, items[i].u.s.p, items[i].u.s.n);
            return bufstr(&b);
        }
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        jv out = jv_list(c, n);
        for (int64_t i = n - 1; i >= 0; i--) jlist_push(c, out.u.l, items[i]);
        return out;
    }
    if (!strcmp(f, "join")) {
        const jv *d = ARG(1, "d"), *attr = ARG(2, "attribute");
        jv sep = d ? jv_to_str(c, d) : mkstr("", 0);
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        jbuf b = {0};
        for (int64_t i = 0; i < n; i++) {
            if (i) jbuf_put(c, &b, sep.u.s.p, sep.u.s.n);
            jv v = attr && attr->k != JV_NONE ? attr_path(c, &items[i], attr) : items[i];
            jv_str_to(c, &b, &v);
        }
        return bufstr(&b);
    }
    if (!strcmp(f, "int")) {
        const jv *dflt = ARG(1, "default");
        int64_t base = int_opt(c, ARG(2, "base"), 10, "base");
        jv d = dflt ? *dflt : jv_int(0);
        switch (x->k) {
        case JV_INT: return *x;
        case JV_BOOL: return jv_int(x->u.b);
        case JV_FLOAT:
            if (!isfinite(x->u.f)) jfail(c, FT_E_INVALID, "cannot convert float to integer");
            if (fabs(x->u.f) >= 9.2e18) jfail(c, FT_E_RANGE, "integer too large");
            return jv_int((int64_t)x->u.f);
        case JV_STR: {
            int64_t v;
            if (base == 10 && parse_int(x, &v)) return jv_int(v);
            if (base != 10) {
                char buf[80];
                if (x->u.s.n < sizeof buf) {
                    memcpy(buf, x->u.s.p, x->u.s.n);
                    buf[x->u.s.n] = 0;
                    char *end;
                    long long r = strtoll(buf, &end, (int)base);
                    if (end != buf && !*end) return jv_int(r);
                }
            }
            double fv;
            if (parse_float(x, &fv) && isfinite(fv) && fabs(fv) < 9.2e18) return jv_int((int64_t)fv);
            return d;
        }
        default: return d;
        }
    }
    if (!strcmp(f, "float")) {
        const jv *dflt = ARG(1, "default");
        jv d = dflt ? *dflt : jv_float(0.0);
        double fv;
        switch (x->k) {
        case JV_INT: return jv_float((double)x->u.i);
        case JV_BOOL: return jv_float(x->u.b);
        case JV_FLOAT: return *x;
        case JV_STR: return parse_float(x, &fv) ? jv_float(fv) : d;
        default: return d;
        }
    }
    if (!strcmp(f, "abs")) {
        if (x->k == JV_INT) {
            if (x->u.i == INT64_MIN) jfail(c, FT_E_RANGE, "integer overflow in abs");
            return jv_int(x->u.i < 0 ? -x->u.i : x->u.i);
        }
        if (x->k == JV_BOOL) return jv_int(x->u.b);
        if (x->k == JV_FLOAT) return jv_float(fabs(x->u.f));
        if (x->k == JV_UNDEF) jfail(c, FT_E_INVALID, "%.*s", (int)x->u.s.n, x->u.s.p ? x->u.s.p : "undefined");
        jfail(c, FT_E_INVALID, "bad operand type for abs(): '%s'", jv_typename(x));
    }
    if (!strcmp(f, "round")) {
        int64_t prec = int_opt(c, ARG(1, "precision"), 0, "precision");
        const jv *method = ARG(2, "method");
        int m = 0;
        if (method) {
            if (method->k == JV_STR && method->u.s.n == 4 && !memcmp(method->u.s.p, "ceil", 4)) m = 1;
            else if (method->k == JV_STR && method->u.s.n == 5 && !memcmp(method->u.s.p, "floor", 5)) m = 2;
            else if (!(method->k == JV_STR && method->u.s.n == 6 && !memcmp(method->u.s.p, "common", 6)))
                jfail(c, FT_E_INVALID, "method must be common, ceil or floor");
        }
        if (!is_num(x)) jfail(c, FT_E_INVALID, "type %s doesn't define __round__ method", jv_typename(x));
        if (m == 0 && x->k != JV_FLOAT) return jv_int(x->k == JV_INT ? x->u.i : x->u.b);
        double v = x->k == JV_FLOAT ? x->u.f : (double)(x->k == JV_INT ? x->u.i : x->u.b);
        if (m == 0) return jv_float(py_round(v, prec));
        double p = pow(10.0, (double)prec);
        return jv_float((m == 1 ? ceil(v * p) : floor(v * p)) / p);
    }
    if (!strcmp(f, "dictsort")) {
        if (x->k != JV_DICT) jfail(c, FT_E_INVALID, "dictsort needs a mapping");
        int cs = bool_opt(ARG(1, "case_sensitive"), 0);
        const jv *by = ARG(2, "by");
        int by_value = 0;
        if (by && by->k == JV_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5)) by_value = 1;
        else if (by && !(by->k == JV_STR && by->u.s.n == 3 && !memcmp(by->u.s.p, "key", 3)))
            jfail(c, FT_E_INVALID, "You can only sort by either \"key\" or \"value\"");
        jdict *d = x->u.d;
        sort_item *it = jalloc(c, (size_t)(d->n ? d->n : 1) * sizeof *it);
        for (int64_t i = 0; i < d->n; i++) {
            jv t = jv_list(c, 2);
            t.u.l->tuple = 1;
            jlist_push(c, t.u.l, d->key[i]);
            jlist_push(c, t.u.l, d->val[i]);
            jv k = by_value ? d->val[i] : d->key[i];
            it[i].key = cs ? k : lower_if_str(c, &k);
            it[i].val = t;
        }
        return sorted_list(c, it, d->n, bool_opt(ARG(3, "reverse"), 0));
    }
    if (!strcmp(f, "sort")) {
        int rev = bool_opt(ARG(1, "reverse"), 0), cs = bool_opt(ARG(2, "case_sensitive"), 0);
        const jv *attr = ARG(3, "attribute");
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        sort_item *it = jalloc(c, (size_t)(n ? n : 1) * sizeof *it);
        for (int64_t i = 0; i < n; i++) {
            jv k = attr && attr->k != JV_NONE ? attr_path(c, &items[i], attr) : items[i];
            it[i].key = cs ? k : lower_if_str(c, &k);
            it[i].val = items[i];
        }
        return sorted_list(c, it, n, rev);
    }
    if (!strcmp(f, "unique")) {
        int cs = bool_opt(ARG(1, "case_sensitive"), 0);
        const jv *attr = ARG(2, "attribute");
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        jv out = jv_list(c, 0), seen = jv_list(c, 0);
        for (int64_t i = 0; i < n; i++) {
            jstep(c);
            jv k = attr && attr->k != JV_NONE ? attr_path(c, &items[i], attr) : items[i];
            if (!cs) k = lower_if_str(c, &k);
            int dup = 0;
            for (int64_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_eq(&seen.u.l->v[j], &k);
            if (dup) continue;
            jlist_push(c, seen.u.l, k);
            jlist_push(c, out.u.l, items[i]);
        }
        return out;
    }
    if (!strcmp(f, "min") || !strcmp(f, "max")) {
        int cs = bool_opt(ARG(1, "case_sensitive"), 0);
        const jv *attr = ARG(2, "attribute");
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        if (!n) return jv_undef("No aggregated item, sequence was empty.");
        int64_t best = 0;
        jv bk = {0};
        for (int64_t i = 0; i < n; i++) {
            jv k = attr && attr->k != JV_NONE ? attr_path(c, &items[i], attr) : items[i];
            if (!cs) k = lower_if_str(c, &k);
            if (i == 0) { bk = k; continue; }
            int r = jv_cmp(c, &k, &bk);
            if (f[1] == 'i' ? r < 0 : r > 0) { best = i; bk = k; }
        }
        return items[best];
    }
    if (!strcmp(f, "sum")) {
        const jv *attr = ARG(1, "attribute"), *start = ARG(2, "start");
        jv acc = start ? *start : jv_int(0);
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        for (int64_t i = 0; i < n; i++) {
            jv v = attr && attr->k != JV_NONE ? attr_path(c, &items[i], attr) : items[i];
            if (!is_num(&acc) || !is_num(&v))
                jfail(c, FT_E_INVALID, "unsupported operand type(s) for +: '%s' and '%s'",
                      jv_typename(&acc), jv_typename(&v));
            if (acc.k == JV_FLOAT || v.k == JV_FLOAT) {
                double a = acc.k == JV_FLOAT ? acc.u.f : (double)(acc.k == JV_INT ? acc.u.i : acc.u.b);
                double b = v.k == JV_FLOAT ? v.u.f : (double)(v.k == JV_INT ? v.u.i : v.u.b);
                acc = jv_float(a + b);
            } else {
                int64_t a = acc.k == JV_INT ? acc.u.i : acc.u.b, b = v.k == JV_INT ? v.u.i : v.u.b, r;
                if (__builtin_add_overflow(a, b, &r)) jfail(c, FT_E_RANGE, "integer overflow in sum");
                acc = jv_int(r);
            }
        }
        return acc;
    }
    if (!strcmp(f, "select")) return select_reject(c, sc, args, nargs, 0, 0);
    if (!strcmp(f, "reject")) return select_reject(c, sc, args, nargs, 0, 1);
    if (!strcmp(f, "selectattr")) return select_reject(c, sc, args, nargs, 1, 0);
    if (!strcmp(f, "rejectattr")) return select_reject(c, sc, args, nargs, 1, 1);
    if (!strcmp(f, "map")) {
        jv *items;
        int64_t n;
        jiter(c, x, &items, &n);
        jv out = jv_list(c, n);
        const jv *attr = NULL, *dflt = NULL;
        for (int k = 0; k < nkw; k++) {
            if (!strcmp(kwn[k], "attribute")) attr = &kwv[k];
            else if (!strcmp(kwn[k], "default")) dflt = &kwv[k];
        }
        if (nargs < 2 && attr) {
            for (int64_t i = 0; i < n; i++) {
                jv v = attr_path(c, &items[i], attr);
                if (v.k == JV_UNDEF && dflt) v = *dflt;
                jlist_push(c, out.u.l, v);
            }
            return out;
        }
        if (nargs < 2 || args[1].k != JV_STR) jfail(c, FT_E_INVALID, "map requires a filter argument");
        char *name = jalloc(c, args[1].u.s.n + 1);
        memcpy(name, args[1].u.s.p, args[1].u.s.n);
        jv *fa = jalloc(c, (size_t)(nargs - 1) * sizeof *fa);
        for (int64_t i = 0; i < n; i++) {
            jstep(c);
            fa[0] = items[i];
            for (int k = 2; k < nargs; k++) fa[k - 1] = args[k];
            jlist_push(c, out.u.l, jfilter(c, sc, name, fa, nargs - 1, kwn, kwv, nkw));
        }
        return out;
    }
    if (!strcmp(f, "format")) {   /* filters.py do_format: str(value) % (kwargs or args) */
        if (nargs > 1 && nkw) jfail(c, FT_E_INVALID, "can't handle positional and keyword arguments at the same time");
        jv fmt = jv_to_str(c, x);
        jv a;
        if (nkw) {
            a = jv_dict(c);
            for (int k = 0; k < nkw; k++) jdict_set(c, a.u.d, jv_strz(kwn[k]), kwv[k]);
        } else {
            a = jv_list(c, nargs);
            a.u.l->tuple = 1;
            for (int k = 1; k < nargs; k++) jlist_push(c, a.u.l, args[k]);
        }
        return jstr_percent(c, &fmt, &a);
    }
    if (!strcmp(f, "attr")) {
        const jv *name = ARG(1, "name");
        if (!name || name->k != JV_STR) jfail(c, FT_E_INVALID, "attr needs a name");
        char *s = jalloc(c, name->u.s.n + 1);
        memcpy(s, name->u.s.p, name->u.s.n);
        /* Python getattr only: a dict's keys are not attributes (filters.py do_attr) */
        if (x->k == JV_DICT && !jmethod_kind(x, s)) return jv_undef("no such attribute");
        return jgetattr(c, x, s);
    }
    for (int i = 0; UNSUPPORTED[i]; i++)
        if (!strcmp(f, UNSUPPORTED[i])) jfail(c, FT_E_INVALID, "filter '%s' is not supported", f);
    jfail(c, FT_E_INVALID, "No filter named '%s'.", f);
#undef ARG
}

static const char *const FILTER_NAMES[] = {
    "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "forceescape", "first", "float", "format", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique",
    "upper", "wordcount", NULL};
static int in_list(const char *const *set, const char *name)
{
    for (int i = 0; set[i]; i++)
        if (!strcmp(set[i], name)) return 1;
    return 0;
}

int jfilter_known(const char *name) { return in_list(FILTER_NAMES, name) || in_list(UNSUPPORTED, name); }
