/* jinja_tests.c - tests (`x is ...`) and global functions of the Jinja interpreter (jinja.h),
 * with jinja2 3.1's semantics (tests.py, defaults.py, sandbox.py) and transformers' globals.
 *
 * Tests: boolean, callable, defined, divisibleby, eq/equalto/==, escaped, even, false, filter,
 * float, ge/>=, gt/greaterthan/>, in, integer, iterable, le/<=, lower, lt/lessthan/<,
 * mapping, ne/!=, none, number, odd, sameas, sequence, string, test, true, undefined, upper.
 * `number` is true for bools (Python's Number), `sequence` and `iterable` for str, list,
 * tuple, dict and Undefined; `sameas` compares identity (small ints, None, bools, objects).
 * Globals: range (the sandbox's 100000-item cap), namespace (refusing "_" names, as
 * transformers' TemplateNamespace), dict, raise_exception (FT_E_INVALID "template error:
 * MSG"), strftime_now (ft_jinja_opts.now, UTC, C-locale strftime).
 */
#include "src/template/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/core/err.h"

#define MAX_RANGE 100000   /* jinja2 sandbox.py MAX_RANGE */

static jv mkstr(const char *p, size_t n)
{
    jv s = {.k = JV_STR};
    s.u.s.p = p; s.u.s.n = n;
    return s;
}

static int is_num(const jv *x) { return x->k == JV_BOOL || x->k == JV_INT || x->k == JV_FLOAT; }

static const char *const TEST_NAMES[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even",
    "false", "filter", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer",
    "iterable", "le", "<=", "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none",
    "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", NULL};


int jtest_known(const char *name)
{
    for (int i = 0; TEST_NAMES[i]; i++)
        if (!strcmp(TEST_NAMES[i], name)) return 1;
    return 0;
}

static int64_t need_int(jctx *c, const jv *x)
{
    if (x->k == JV_UNDEF) jfail(c, FT_E_INVALID, "%.*s", (int)x->u.s.n, x->u.s.p ? x->u.s.p : "undefined");
    if (x->k == JV_INT) return x->u.i;
    if (x->k == JV_BOOL) return x->u.b;
    jfail(c, FT_E_INVALID, "unsupported operand type(s) for %%: '%s' and 'int'", jv_typename(x));
}

int jtest(jctx *c, jscope *sc, const char *t, jv *args, int nargs)
{
    (void)sc;
    const jv *x = &args[0];
    const jv *a1 = nargs > 1 ? &args[1] : NULL;
    if (!strcmp(t, "defined")) return x->k != JV_UNDEF;
    if (!strcmp(t, "undefined")) return x->k == JV_UNDEF;
    if (!strcmp(t, "none")) return x->k == JV_NONE;
    if (!strcmp(t, "boolean")) return x->k == JV_BOOL;
    if (!strcmp(t, "true")) return x->k == JV_BOOL && x->u.b;
    if (!strcmp(t, "false")) return x->k == JV_BOOL && !x->u.b;
    if (!strcmp(t, "integer")) return x->k == JV_INT;
    if (!strcmp(t, "float")) return x->k == JV_FLOAT;
    if (!strcmp(t, "number")) return is_num(x);
    if (!strcmp(t, "string")) return x->k == JV_STR;
    if (!strcmp(t, "mapping")) return x->k == JV_DICT;
    if (!strcmp(t, "sequence"))
        return x->k == JV_STR || x->k == JV_LIST || x->k == JV_DICT || x->k == JV_UNDEF;
    if (!strcmp(t, "iterable"))
        return x->k == JV_STR || x->k == JV_LIST || x->k == JV_DICT || x->k == JV_UNDEF ||
               x->k == JV_LOOP;
    if (!strcmp(t, "callable")) return x->k == JV_FUNC;
    if (!strcmp(t, "escaped")) return 0;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        jv s = jv_to_str(c, x);
        jv r = jmethod_call(c, &s, t[0] == 'l' ? "islower" : "isupper", NULL, 0, NULL, NULL, 0);
        return r.u.b;
    }
    if (!strcmp(t, "odd")) return (need_int(c, x) % 2 + 2) % 2 == 1;
    if (!strcmp(t, "even")) return need_int(c, x) % 2 == 0;
    if (!strcmp(t, "divisibleby")) {
        if (!a1) jfail(c, FT_E_INVALID, "divisibleby needs an argument");
        int64_t d = need_int(c, a1);
        if (!d) jfail(c, FT_E_INVALID, "integer modulo by zero");
        return need_int(c, x) % d == 0;
    }
    if (!strcmp(t, "sameas")) {
        if (!a1) jfail(c, FT_E_INVALID, "sameas needs an argument");
        if (x->k != a1->k) return 0;
        switch (x->k) {
        case JV_NONE: case JV_UNDEF: return 1;
        case JV_BOOL: return x->u.b == a1->u.b;
        case JV_INT: return x->u.i == a1->u.i && x->u.i >= -5 && x->u.i <= 256;
        case JV_STR: return x->u.s.p == a1->u.s.p && x->u.s.n == a1->u.s.n;
        case JV_LIST: return x->u.l == a1->u.l;
        case JV_DICT: case JV_NS: return x->u.d == a1->u.d;
        case JV_FUNC: return x->u.fn == a1->u.fn;
        default: return 0;
        }
    }
    if (!strcmp(t, "filter") || !strcmp(t, "test")) {
        if (x->k != JV_STR) return 0;
        char *name = jalloc(c, x->u.s.n + 1);
        memcpy(name, x->u.s.p, x->u.s.n);
        return t[0] == 'f' ? jfilter_known(name) : jtest_known(name);
    }
    struct { const char *name; int op; } CMP[] = {
        {"eq", JO_EQ}, {"equalto", JO_EQ}, {"==", JO_EQ}, {"ne", JO_NE}, {"!=", JO_NE},
        {"gt", JO_GT}, {"greaterthan", JO_GT}, {">", JO_GT}, {"ge", JO_GE}, {">=", JO_GE},
        {"lt", JO_LT}, {"lessthan", JO_LT}, {"<", JO_LT}, {"le", JO_LE}, {"<=", JO_LE},
        {"in", JO_IN}};
    for (size_t i = 0; i < sizeof CMP / sizeof CMP[0]; i++) {
        if (strcmp(t, CMP[i].name)) continue;
        if (!a1) jfail(c, FT_E_INVALID, "test '%s' needs an argument", t);
        if (CMP[i].op == JO_EQ) return jv_eq(x, a1);
        if (CMP[i].op == JO_NE) return !jv_eq(x, a1);
        if (CMP[i].op == JO_IN) {
            jv *items;
            int64_t n;
            if (a1->k == JV_STR) {
                if (x->k != JV_STR)
                    jfail(c, FT_E_INVALID, "'in <string>' requires string as left operand, not %s",
                          jv_typename(x));
                return !x->u.s.n || memmem(a1->u.s.p, a1->u.s.n, x->u.s.p, x->u.s.n) != NULL;
            }
            if (a1->k == JV_DICT) return jdict_get(a1->u.d, *x) != NULL;
            jiter(c, a1, &items, &n);
            for (int64_t k = 0; k < n; k++) if (jv_eq(&items[k], x)) return 1;
            return 0;
        }
        if (x->k == JV_UNDEF || a1->k == JV_UNDEF)
            jfail(c, FT_E_INVALID, "%s", x->k == JV_UNDEF && x->u.s.p ? x->u.s.p
                                         : a1->u.s.p ? a1->u.s.p : "undefined value");
        int r = jv_cmp(c, x, a1);
        switch (CMP[i].op) {
        case JO_GT: return r > 0;
        case JO_GE: return r >= 0;
        case JO_LT: return r < 0;
        default: return r <= 0;
        }
    }
    jfail(c, FT_E_INVALID, "No test named '%s'.", t);
}

/* ---- globals -------------------------------------------------------------------------------- */

static jfunc G_RANGE = {JF_BUILTIN, "range", NULL, NULL, {0}};
static jfunc G_NAMESPACE = {JF_BUILTIN, "namespace", NULL, NULL, {0}};
static jfunc G_DICT = {JF_BUILTIN, "dict", NULL, NULL, {0}};
static jfunc G_RAISE = {JF_BUILTIN, "raise_exception", NULL, NULL, {0}};
static jfunc G_STRFTIME = {JF_BUILTIN, "strftime_now", NULL, NULL, {0}};

int jglobal_lookup(const char *name, jv *out)
{
    jfunc *f = NULL;
    if (!strcmp(name, "range")) f = &G_RANGE;
    else if (!strcmp(name, "namespace")) f = &G_NAMESPACE;
    else if (!strcmp(name, "dict")) f = &G_DICT;
    else if (!strcmp(name, "raise_exception")) f = &G_RAISE;
    else if (!strcmp(name, "strftime_now")) f = &G_STRFTIME;
    if (!f) return 0;
    out->k = JV_FUNC;
    out->u.fn = f;   /* read-only: builtins carry no state */
    return 1;
}

static void dict_update(jctx *c, jdict *d, jv *args, int nargs, const char **kwn, jv *kwv,
                        int nkw, const char *what)
{
    if (nargs > 1) jfail(c, FT_E_INVALID, "%s expected at most 1 argument, got %d", what, nargs);
    if (nargs == 1) {
        const jv *src = &args[0];
        if (src->k == JV_DICT || src->k == JV_NS) {
            for (int64_t i = 0; i < src->u.d->n; i++) jdict_set(c, d, src->u.d->key[i], src->u.d->val[i]);
        } else {
            jv *items;
            int64_t n;
            jiter(c, src, &items, &n);
            for (int64_t i = 0; i < n; i++) {
                if (items[i].k != JV_LIST || items[i].u.l->n != 2)
                    jfail(c, FT_E_INVALID, "dictionary update sequence element #%lld has the wrong "
                          "length", (long long)i);
                jdict_set(c, d, items[i].u.l->v[0], items[i].u.l->v[1]);
            }
        }
    }
    for (int k = 0; k < nkw; k++) jdict_set(c, d, jv_strz(kwn[k]), kwv[k]);
}

jv jglobal_call(jctx *c, const char *name, jv *args, int nargs, const char **kwn, jv *kwv,
                int nkw)
{
    if (!strcmp(name, "raise_exception")) {
        jv msg = nargs ? jv_to_str(c, &args[0]) : mkstr("", 0);
        jfail(c, FT_E_INVALID, "template error: %.*s", (int)msg.u.s.n, msg.u.s.p);
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs < 1 || args[0].k != JV_STR) jfail(c, FT_E_INVALID, "strftime_now needs a format string");
        char fmt[512], out[1024];
        size_t n = args[0].u.s.n < sizeof fmt - 1 ? args[0].u.s.n : sizeof fmt - 1;
        memcpy(fmt, args[0].u.s.p, n);
        fmt[n] = 0;
        time_t t = (time_t)c->o.now;
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t k = n ? strftime(out, sizeof out, fmt, &tm) : 0;
        return jv_str(c, out, k);
    }
    if (!strcmp(name, "range")) {
        if (nkw) jfail(c, FT_E_INVALID, "range() takes no keyword arguments");
        if (nargs < 1 || nargs > 3) jfail(c, FT_E_INVALID, "range expected 1 to 3 arguments, got %d", nargs);
        int64_t v[3];
        for (int i = 0; i < nargs; i++) {
            if (args[i].k == JV_INT) v[i] = args[i].u.i;
            else if (args[i].k == JV_BOOL) v[i] = args[i].u.b;
            else jfail(c, FT_E_INVALID, "'%s' object cannot be interpreted as an integer",
                       jv_typename(&args[i]));
        }
        int64_t start = nargs > 1 ? v[0] : 0, stop = nargs > 1 ? v[1] : v[0];
        int64_t step = nargs > 2 ? v[2] : 1;
        if (!step) jfail(c, FT_E_INVALID, "range() arg 3 must not be zero");
        double len = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                              : ceil(((double)start - (double)stop) / (double)-step);
        if (len < 0) len = 0;
        if (len > MAX_RANGE)
            jfail(c, FT_E_RANGE, "Range too big. The sandbox blocks ranges larger than "
                  "MAX_RANGE (%d).", MAX_RANGE);
        jv out = jv_list(c, (int64_t)len);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            jstep(c);
            jlist_push(c, out.u.l, jv_int(i));
        }
        return out;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv d = jv_dict(c);
        dict_update(c, d.u.d, args, nargs, kwn, kwv, nkw, name);
        if (name[0] == 'n') {
            d.k = JV_NS;
            for (int64_t i = 0; i < d.u.d->n; i++)
                if (d.u.d->key[i].k == JV_STR && d.u.d->key[i].u.s.n && d.u.d->key[i].u.s.p[0] == '_')
                    jfail(c, FT_E_INVALID, "Chat templates cannot store underscore-prefixed "
                          "attributes on a namespace, but got '%.*s'. Please rename the attribute.",
                          (int)d.u.d->key[i].u.s.n, d.u.d->key[i].u.s.p);
        }
        return d;
    }
    jfail(c, FT_E_INVALID, "'%s' is not callable", name);
}
