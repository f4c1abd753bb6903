/* jinja_ops.c - attribute and item access, slicing, iteration and the operators of the Jinja
 * interpreter (jinja_internal.h), with jinja2's sandboxed getattr/getitem and Python's rules.
 *
 * x.name: a method of str/dict/list first (a bound method, or a refused mutating one), then a
 * dict key, else an Undefined carrying jinja2's hint ("'dict object' has no attribute 'x'");
 * x[key]: the key/index first, then x.key for a string key (environment.getitem). Slices,
 * indexing and iteration of strings count code points. Arithmetic: int/float promotion with
 * bool as int, floor division and modulo toward -inf (CPython's float_divmod for floats),
 * int64 overflow fails with FT_E_RANGE (Python would grow the int), str/list concatenation and
 * repetition, str % args (jstr_percent). Comparison: ==/!= on any values, ordering on numbers,
 * strings and sequences only, `in` on strings (substring), lists, dicts (keys), Undefined
 * (always false).
 */
#include "src/template/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

/* ---- attribute and item access ------------------------------------------------------------ */

static const char *obj_desc(const jv *x)
{
    switch (x->k) {
    case JV_NONE: return "None";
    case JV_DICT: return "'dict object'";
    case JV_LIST: return x->u.l->tuple ? "'tuple object'" : "'list object'";
    case JV_STR: return "'str object'";
    case JV_INT: return "'int object'";
    case JV_FLOAT: return "'float object'";
    case JV_BOOL: return "'bool object'";
    case JV_NS: return "'Namespace object'";
    default: return "'object'";
    }
}

static jv undef_attr(jctx *c, const jv *obj, const char *name)
{
    const char *d = obj_desc(obj);
    char *hint = jalloc(c, strlen(d) + strlen(name) + 40);
    sprintf(hint, "%s has no attribute '%s'", d, name);
    return jv_undef(hint);
}

static jv loop_attr(jctx *c, jloop *l, const char *name)
{
    int64_t i = l->i, n = l->n;
    if (!strcmp(name, "index")) return jv_int(i + 1);
    if (!strcmp(name, "index0")) return jv_int(i);
    if (!strcmp(name, "revindex")) return jv_int(n - i);
    if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return jv_int(n);
    if (!strcmp(name, "depth")) return jv_int(l->depth);
    if (!strcmp(name, "depth0")) return jv_int(l->depth - 1);
    if (!strcmp(name, "previtem"))
        return i > 0 ? l->items[i - 1] : jv_undef("there is no previous item");
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->items[i + 1] : jv_undef("there is no next item");
    if (!strcmp(name, "cycle")) {
        jv f = {.k = JV_FUNC};
        f.u.fn = jalloc(c, sizeof *f.u.fn);
        f.u.fn->kind = JF_METHOD;
        f.u.fn->name = "cycle";
        f.u.fn->self.k = JV_LOOP;
        f.u.fn->self.u.loop = l;
        return f;
    }
    jv self = {.k = JV_LOOP};
    self.u.loop = l;
    return undef_attr(c, &self, name);
}

jv jgetattr(jctx *c, const jv *obj, const char *name)
{
    switch (obj->k) {
    case JV_UNDEF: jfail_undef(c, obj);
    case JV_LOOP: return loop_attr(c, obj->u.loop, name);
    case JV_NS: {
        jv *v = jdict_getz(obj->u.d, name);
        return v ? *v : undef_attr(c, obj, name);
    }
    default: break;
    }
    int mk = jmethod_kind(obj, name);
    if (mk) {
        jv f = {.k = JV_FUNC};
        f.u.fn = jalloc(c, sizeof *f.u.fn);
        f.u.fn->kind = mk > 0 ? JF_METHOD : JF_UNSAFE;
        f.u.fn->name = name;
        f.u.fn->self = *obj;
        return f;
    }
    if (obj->k == JV_DICT) {
        jv *v = jdict_getz(obj->u.d, name);
        if (v) return *v;
    }
    return undef_attr(c, obj, name);
}

static int64_t index_of(jctx *c, const jv *k, int *ok)
{
    *ok = 1;
    if (k->k == JV_INT) return k->u.i;
    if (k->k == JV_BOOL) return k->u.b;
    (void)c;
    *ok = 0;
    return 0;
}

jv jgetitem(jctx *c, const jv *obj, const jv *key)
{
    int ok;
    switch (obj->k) {
    case JV_UNDEF: jfail_undef(c, obj);
    case JV_DICT: {
        jv *v = jdict_get(obj->u.d, *key);
        if (v) return *v;
        break;
    }
    case JV_LIST: {
        int64_t i = index_of(c, key, &ok);
        if (ok) {
            int64_t n = obj->u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj->u.l->v[i];
            char *hint = jalloc(c, 80);
            snprintf(hint, 80, "%s has no element %lld", obj_desc(obj), (long long)key->u.i);
            return jv_undef(hint);
        }
        break;
    }
    case JV_STR: {
        int64_t i = index_of(c, key, &ok);
        if (ok) {
            int64_t n = ju_len(obj->u.s.p, obj->u.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t a = ju_off(obj->u.s.p, obj->u.s.n, i);
                size_t b = ju_off(obj->u.s.p, obj->u.s.n, i + 1);
                jv s = {.k = JV_STR};
                s.u.s.p = obj->u.s.p + a; s.u.s.n = b - a;
                return s;
            }
            char *hint = jalloc(c, 80);
            snprintf(hint, 80, "'str object' has no element %lld", (long long)key->u.i);
            return jv_undef(hint);
        }
        break;
    }
    default: break;
    }
    if (key->k == JV_STR) {
        char *name = jalloc(c, key->u.s.n + 1);
        memcpy(name, key->u.s.p, key->u.s.n);
        return jgetattr(c, obj, name);
    }
    jbuf b = {0};
    jv_repr_to(c, &b, key);
    char *hint = jalloc(c, b.n + 64);
    snprintf(hint, b.n + 64, "%s has no element %.*s", obj_desc(obj), (int)b.n, b.p);
    return jv_undef(hint);
}

/* Python slice indices (PySlice_AdjustIndices) */
static int64_t slice_bounds(jctx *c, const jv *st, const jv *sp, const jv *se, int64_t n,
                            int64_t *start, int64_t *stop)
{
    int ok = 1;
    int64_t step = 1;
    if (se && se->k != JV_NONE) {
        step = index_of(c, se, &ok);
        if (!ok) jfail(c, FT_E_INVALID, "slice indices must be integers or None");
        if (step == 0) jfail(c, FT_E_INVALID, "slice step cannot be zero");
    }
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t a = step < 0 ? hi : lo, b = step < 0 ? lo : hi;
    if (st && st->k != JV_NONE) {
        a = index_of(c, st, &ok);
        if (!ok) jfail(c, FT_E_INVALID, "slice indices must be integers or None");
        if (a < 0) { a += n; if (a < 0) a = lo; } else if (a > hi) a = hi;
    }
    if (sp && sp->k != JV_NONE) {
        b = index_of(c, sp, &ok);
        if (!ok) jfail(c, FT_E_INVALID, "slice indices must be integers or None");
        if (b < 0) { b += n; if (b < 0) b = lo; } else if (b > hi) b = hi;
    }
    *start = a; *stop = b;
    return step;
}

jv jslice(jctx *c, const jv *obj, const jv *st, const jv *sp, const jv *se)
{
    int64_t a, b, step;
    if (obj->k == JV_UNDEF) jfail_undef(c, obj);
    if (obj->k == JV_LIST) {
        step = slice_bounds(c, st, sp, se, obj->u.l->n, &a, &b);
        jv r = jv_list(c, 0);
        r.u.l->tuple = obj->u.l->tuple;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) jlist_push(c, r.u.l, obj->u.l->v[i]);
        return r;
    }
    if (obj->k == JV_STR) {
        const char *s = obj->u.s.p;
        size_t n = obj->u.s.n;
        int64_t len = ju_len(s, n);
        step = slice_bounds(c, st, sp, se, len, &a, &b);
        if (step == 1 && len == (int64_t)n) {
            jv r = {.k = JV_STR};
            r.u.s.p = s + a; r.u.s.n = b > a ? (size_t)(b - a) : 0;
            return r;
        }
        size_t *off = jalloc(c, (size_t)(len + 1) * sizeof *off);
        size_t o = 0;
        for (int64_t i = 0; i < len; i++) {
            off[i] = o;
            uint32_t cp;
            o += (size_t)ju_dec(s + o, n - o, &cp);
        }
        off[len] = n;
        jbuf out = {0};
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            jbuf_put(c, &out, s + off[i], off[i + 1] - off[i]);
        jv r = {.k = JV_STR};
        r.u.s.p = out.p ? out.p : ""; r.u.s.n = out.n;
        return r;
    }
    jfail(c, FT_E_INVALID, "'%s' object is not subscriptable", jv_typename(obj));
}

void jiter(jctx *c, const jv *x, jv **items, int64_t *n)
{
    switch (x->k) {
    case JV_UNDEF: *items = NULL; *n = 0; return;
    case JV_LIST: *items = x->u.l->v; *n = x->u.l->n; return;
    case JV_DICT: *items = x->u.d->key; *n = x->u.d->n; return;
    case JV_STR: {
        int64_t len = ju_len(x->u.s.p, x->u.s.n);
        jv *v = jalloc(c, (size_t)(len ? len : 1) * sizeof *v);
        size_t o = 0;
        for (int64_t i = 0; i < len; i++) {
            uint32_t cp;
            int l = ju_dec(x->u.s.p + o, x->u.s.n - o, &cp);
            v[i].k = JV_STR; v[i].u.s.p = x->u.s.p + o; v[i].u.s.n = (size_t)l;
            o += (size_t)l;
        }
        *items = v; *n = len;
        return;
    }
    default:
        jfail(c, FT_E_INVALID, "'%s' object is not iterable", jv_typename(x));
    }
}

/* ---- operators ------------------------------------------------------------------------------ */

static int is_num(const jv *x) { return x->k == JV_BOOL || x->k == JV_INT || x->k == JV_FLOAT; }
static double num_f(const jv *x)
{
    return x->k == JV_FLOAT ? x->u.f : x->k == JV_INT ? (double)x->u.i : (double)x->u.b;
}
static int64_t num_i(const jv *x) { return x->k == JV_INT ? x->u.i : (int64_t)x->u.b; }

static const char *op_name(int op)
{
    switch (op) {
    case JO_ADD: return "+"; case JO_SUB: return "-"; case JO_MUL: return "*";
    case JO_DIV: return "/"; case JO_FLOORDIV: return "//"; case JO_MOD: return "%";
    case JO_POW: return "** or pow()"; default: return "?";
    }
}

static jv repeat(jctx *c, const jv *seq, int64_t k)
{
    if (k < 0) k = 0;
    if (seq->k == JV_STR) {
        if (seq->u.s.n && (int64_t)seq->u.s.n * k > c->o.max_output_bytes)
            jfail(c, FT_E_RANGE, "string repetition longer than the output limit");
        jbuf b = {0};
        for (int64_t i = 0; i < k; i++) jbuf_put(c, &b, seq->u.s.p, seq->u.s.n);
        jv r = {.k = JV_STR};
        r.u.s.p = b.p ? b.p : ""; r.u.s.n = b.n;
        return r;
    }
    jv r = jv_list(c, 0);
    r.u.l->tuple = seq->u.l->tuple;
    for (int64_t i = 0; i < k; i++) {
        jstep(c);
        for (int64_t j = 0; j < seq->u.l->n; j++) jlist_push(c, r.u.l, seq->u.l->v[j]);
    }
    return r;
}

jv jbinop(jctx *c, int op, const jv *a, const jv *b)
{
    if (op == JO_MOD && a->k == JV_STR && b->k == JV_UNDEF) return jstr_percent(c, a, b);
    if (a->k == JV_UNDEF) jfail_undef(c, a);
    if (b->k == JV_UNDEF) jfail_undef(c, b);
    if (is_num(a) && is_num(b)) {
        int fl = a->k == JV_FLOAT || b->k == JV_FLOAT;
        if (!fl) {
            int64_t x = num_i(a), y = num_i(b), r;
            switch (op) {
            case JO_ADD: if (!__builtin_add_overflow(x, y, &r)) return jv_int(r); break;
            case JO_SUB: if (!__builtin_sub_overflow(x, y, &r)) return jv_int(r); break;
            case JO_MUL: if (!__builtin_mul_overflow(x, y, &r)) return jv_int(r); break;
            case JO_DIV:
                if (!y) jfail(c, FT_E_INVALID, "division by zero");
                return jv_float((double)x / (double)y);
            case JO_FLOORDIV: case JO_MOD: {
                if (!y) jfail(c, FT_E_INVALID, op == JO_MOD ? "integer modulo by zero"
                                                            : "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) break;
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(op == JO_MOD ? m : q);
            }
            case JO_POW:
                if (y >= 0) {
                    int64_t acc = 1, base = x, e = y;
                    int over = 0;
                    while (e && !over) {
                        if (e & 1) over |= __builtin_mul_overflow(acc, base, &acc);
                        e >>= 1;
                        if (e) over |= __builtin_mul_overflow(base, base, &base);
                    }
                    if (!over) return jv_int(acc);
                    jfail(c, FT_E_RANGE, "integer power too large");
                }
                fl = 1;
                break;
            }
            if (!fl) jfail(c, FT_E_RANGE, "integer overflow in '%s'", op_name(op));
        }
        double x = num_f(a), y = num_f(b);
        switch (op) {
        case JO_ADD: return jv_float(x + y);
        case JO_SUB: return jv_float(x - y);
        case JO_MUL: return jv_float(x * y);
        case JO_DIV:
            if (y == 0) jfail(c, FT_E_INVALID, "float division by zero");
            return jv_float(x / y);
        case JO_FLOORDIV: case JO_MOD: {
            if (y == 0) jfail(c, FT_E_INVALID, "float modulo");
            /* CPython float_divmod */
            double m = fmod(x, y), d = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) { m += y; d -= 1.0; }
            } else {
                m = copysign(0.0, y);
            }
            if (op == JO_MOD) return jv_float(m);
            double fd;
            if (d != 0) { fd = floor(d); if (d - fd > 0.5) fd += 1.0; }
            else fd = copysign(0.0, x / y);
            return jv_float(fd);
        }
        case JO_POW:
            if (x == 0 && y < 0) jfail(c, FT_E_INVALID, "0.0 cannot be raised to a negative power");
            return jv_float(pow(x, y));
        }
    }
    if (op == JO_ADD && a->k == JV_STR && b->k == JV_STR) {
        jbuf r = {0};
        jbuf_put(c, &r, a->u.s.p, a->u.s.n);
        jbuf_put(c, &r, b->u.s.p, b->u.s.n);
        jv s = {.k = JV_STR};
        s.u.s.p = r.p ? r.p : ""; s.u.s.n = r.n;
        return s;
    }
    if (op == JO_ADD && a->k == JV_LIST && b->k == JV_LIST && a->u.l->tuple == b->u.l->tuple) {
        jv r = jv_list(c, a->u.l->n + b->u.l->n);
        r.u.l->tuple = a->u.l->tuple;
        for (int64_t i = 0; i < a->u.l->n; i++) jlist_push(c, r.u.l, a->u.l->v[i]);
        for (int64_t i = 0; i < b->u.l->n; i++) jlist_push(c, r.u.l, b->u.l->v[i]);
        return r;
    }
    if (op == JO_MUL && (a->k == JV_STR || a->k == JV_LIST) && (b->k == JV_INT || b->k == JV_BOOL))
        return repeat(c, a, num_i(b));
    if (op == JO_MUL && (b->k == JV_STR || b->k == JV_LIST) && (a->k == JV_INT || a->k == JV_BOOL))
        return repeat(c, b, num_i(a));
    if (op == JO_MOD && a->k == JV_STR) return jstr_percent(c, a, b);
    if (op == JO_ADD && (a->k == JV_STR || b->k == JV_STR) && a->k != b->k)
        jfail(c, FT_E_INVALID, a->k == JV_STR ? "can only concatenate str (not \"%s\") to str"
                                              : "unsupported operand type(s) for +: '%s' and 'str'",
              jv_typename(a->k == JV_STR ? b : a));
    jfail(c, FT_E_INVALID, "unsupported operand type(s) for %s: '%s' and '%s'", op_name(op),
          jv_typename(a), jv_typename(b));
}

static int contains(jctx *c, const jv *hay, const jv *needle)
{
    switch (hay->k) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (needle->k == JV_UNDEF) jfail_undef(c, needle);
        if (needle->k != JV_STR)
            jfail(c, FT_E_INVALID, "'in <string>' requires string as left operand, not %s",
                  jv_typename(needle));
        if (!needle->u.s.n) return 1;
        return memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n) != NULL;
    case JV_LIST:
        for (int64_t i = 0; i < hay->u.l->n; i++)
            if (jv_eq(&hay->u.l->v[i], needle)) return 1;
        return 0;
    case JV_DICT: return jdict_get(hay->u.d, *needle) != NULL;
    default:
        jfail(c, FT_E_INVALID, "argument of type '%s' is not iterable", jv_typename(hay));
    }
}

int jcompare(jctx *c, int op, const jv *a, const jv *b)
{
    switch (op) {
    case JO_EQ: return jv_eq(a, b);
    case JO_NE: return !jv_eq(a, b);
    case JO_IN: return contains(c, b, a);
    case JO_NOTIN: return !contains(c, b, a);
    default: break;
    }
    if (a->k == JV_UNDEF) jfail_undef(c, a);
    if (b->k == JV_UNDEF) jfail_undef(c, b);
    int r = jv_cmp(c, a, b);
    switch (op) {
    case JO_LT: return r < 0;
    case JO_LE: return r <= 0;
    case JO_GT: return r > 0;
    default: return r >= 0;
    }
}

