/* jinja_methods.c - Python methods on template values (jinja.h): str (strip, split,
 * startswith, replace, find, count, format, join, case mapping, ...), dict (items, keys,
 * values, get, copy) and list/tuple (index, count, copy), plus the string helpers the
 * filters share.
 *
 * The sandbox is kept: mutating methods (list.append/extend/insert/pop/remove/sort/reverse/
 * clear, dict.update/pop/popitem/setdefault/clear) are found but refused when called, as
 * jinja2's ImmutableSandboxedEnvironment refuses them. Case mapping is utf8proc's simple
 * one-to-one mapping (Python's full mapping turns "ß".upper() into "SS"; this keeps "ß").
 */
#include "src/template/jinja_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "src/core/err.h"

const jv *jarg(jv *args, int nargs, int i, const char **kwn, jv *kwv, int nkw, const char *kw)
{
    if (i < nargs) return &args[i];
    for (int k = 0; kw && k < nkw; k++)
        if (!strcmp(kwn[k], kw)) return &kwv[k];
    return NULL;
}

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit", "splitlines",
    "upper", "lower", "title", "capitalize", "swapcase", "replace", "find", "rfind", "index",
    "rindex", "count", "format", "join", "isdigit", "isalpha", "isalnum", "isspace", "islower",
    "isupper", "isnumeric", "isdecimal", "istitle", "center", "ljust", "rjust", "zfill",
    "partition", "rpartition", "removeprefix", "removesuffix", "casefold", "expandtabs", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"update", "pop", "popitem", "setdefault", "clear",
                                          "fromkeys", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "sort",
                                          "reverse", "clear", NULL};

static int in_set(const char *const *set, const char *name)
{
    for (int i = 0; set[i]; i++)
        if (!strcmp(set[i], name)) return 1;
    return 0;
}

int jmethod_kind(const jv *self, const char *name)
{
    switch (self->k) {
    case JV_STR: return in_set(STR_METHODS, name);
    case JV_DICT:
        if (in_set(DICT_METHODS, name)) return 1;
        return in_set(DICT_UNSAFE, name) ? -1 : 0;
    case JV_LIST:
        if (in_set(LIST_METHODS, name) && (strcmp(name, "copy") || !self->u.l->tuple)) return 1;
        return !self->u.l->tuple && in_set(LIST_UNSAFE, name) ? -1 : 0;
    default: return 0;
    }
}

static jv mkstr(const char *p, size_t n)
{
    jv s = {.k = JV_STR};
    s.u.s.p = p; s.u.s.n = n;
    return s;
}

static jv bufstr(jbuf *b) { return mkstr(b->p ? b->p : "", b->n); }

static const jv *need_str(jctx *c, const jv *x, const char *what)
{
    if (!x || x->k != JV_STR)
        jfail(c, FT_E_INVALID, "%s must be str, not %s", what, x ? jv_typename(x) : "nothing");
    return x;
}

/* ---- string helpers ------------------------------------------------------------------------ */

static int in_chars(const jv *chars, uint32_t cp)
{
    const char *s = chars->u.s.p;
    size_t n = chars->u.s.n;
    for (size_t i = 0; i < n;) {
        uint32_t c2;
        i += (size_t)ju_dec(s + i, n - i, &c2);
        if (c2 == cp) return 1;
    }
    return 0;
}

jv jstr_strip(jctx *c, const jv *s, const jv *chars, int left, int right)
{
    if (chars && chars->k == JV_NONE) chars = NULL;
    if (chars) need_str(c, chars, "strip arg");
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    while (left && a < b) {
        uint32_t cp;
        int l = ju_dec(p + a, b - a, &cp);
        if (chars ? !in_chars(chars, cp) : !ju_isspace(cp)) break;
        a += (size_t)l;
    }
    while (right && b > a) {
        size_t k = b - 1;
        while (k > a && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        ju_dec(p + k, b - k, &cp);
        if (chars ? !in_chars(chars, cp) : !ju_isspace(cp)) break;
        b = k;
    }
    return mkstr(p + a, b - a);
}

static void put_cp(jctx *c, jbuf *b, uint32_t cp)
{
    char o[4];
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)o);
    jbuf_put(c, b, o, (size_t)(n > 0 ? n : 0));
}

static int is_cased_letter(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static int is_alpha(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

static int is_digitcp(uint32_t cp)
{
    return utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ND;
}

static int is_numericcp(uint32_t cp)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* jinja2's title filter splits words at runs of [-\s({\[<] */
static int title_sep(uint32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp);
}

jv jstr_case(jctx *c, const jv *s, int mode)
{
    jbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    int prev_cased = 0, first = 1, at_word = 1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)ju_dec(p + i, n - i, &cp);
        utf8proc_int32_t u = (utf8proc_int32_t)cp, o = u;
        switch (mode) {
        case 0: o = utf8proc_tolower(u); break;
        case 1: o = utf8proc_toupper(u); break;
        case 2:   /* str.title: upper after an uncased char, lower after a cased one */
            o = prev_cased ? utf8proc_tolower(u) : utf8proc_totitle(u);
            prev_cased = is_cased_letter(cp);
            break;
        case 3: o = first ? utf8proc_totitle(u) : utf8proc_tolower(u); break;
        case 4:   /* jinja title: first char of each word upper, the rest lower */
            if (title_sep(cp)) { at_word = 1; break; }
            o = at_word ? utf8proc_toupper(u) : utf8proc_tolower(u);
            at_word = 0;
            break;
        case 5:   /* swapcase */
            o = utf8proc_isupper(u) ? utf8proc_tolower(u) : utf8proc_islower(u) ? utf8proc_toupper(u) : u;
            break;
        }
        first = 0;
        put_cp(c, &b, (uint32_t)o);
    }
    return bufstr(&b);
}

jv jstr_replace(jctx *c, const jv *s, const jv *old, const jv *new_, int64_t count)
{
    jbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, on = old->u.s.n;
    if (count < 0) count = INT64_MAX;
    if (!on) {   /* Python inserts new_ before every code point and at the end */
        int64_t k = 0;
        for (size_t i = 0; i <= n;) {
            if (k++ < count) jbuf_put(c, &b, new_->u.s.p, new_->u.s.n);
            if (i == n) break;
            uint32_t cp;
            int l = ju_dec(p + i, n - i, &cp);
            jbuf_put(c, &b, p + i, (size_t)l);
            i += (size_t)l;
        }
        return bufstr(&b);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < n && k < count) {
        const char *hit = memmem(p + i, n - i, old->u.s.p, on);
        if (!hit) break;
        jbuf_put(c, &b, p + i, (size_t)(hit - (p + i)));
        jbuf_put(c, &b, new_->u.s.p, new_->u.s.n);
        i = (size_t)(hit - p) + on;
        k++;
    }
    jbuf_put(c, &b, p + i, n - i);
    return bufstr(&b);
}

static int64_t count_sub(const jv *s, const jv *sub)
{
    if (!sub->u.s.n) return ju_len(s->u.s.p, s->u.s.n) + 1;
    int64_t k = 0;
    for (size_t i = 0; i + sub->u.s.n <= s->u.s.n;) {
        const char *hit = memmem(s->u.s.p + i, s->u.s.n - i, sub->u.s.p, sub->u.s.n);
        if (!hit) break;
        k++;
        i = (size_t)(hit - s->u.s.p) + sub->u.s.n;
    }
    return k;
}

static int affix(jctx *c, const jv *s, const jv *a, int end)
{
    if (a->k == JV_LIST && a->u.l->tuple) {
        for (int64_t i = 0; i < a->u.l->n; i++)
            if (affix(c, s, &a->u.l->v[i], end)) return 1;
        return 0;
    }
    if (a->k != JV_STR)
        jfail(c, FT_E_INVALID, "%s first arg must be str or a tuple of str, not %s",
              end ? "endswith" : "startswith", jv_typename(a));
    if (a->u.s.n > s->u.s.n) return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.n - a->u.s.n : 0), a->u.s.p, a->u.s.n);
}

static jv do_split(jctx *c, const jv *s, const jv *sep, int64_t maxsplit, int right)
{
    jv out = jv_list(c, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && sep->k != JV_NONE) {
        need_str(c, sep, "separator");
        size_t sn = sep->u.s.n;
        if (!sn) jfail(c, FT_E_INVALID, "empty separator");
        if (!right) {
            size_t i = 0;
            int64_t k = 0;
            while (k < maxsplit) {
                const char *hit = memmem(p + i, n - i, sep->u.s.p, sn);
                if (!hit) break;
                jlist_push(c, out.u.l, mkstr(p + i, (size_t)(hit - (p + i))));
                i = (size_t)(hit - p) + sn;
                k++;
            }
            jlist_push(c, out.u.l, mkstr(p + i, n - i));
            return out;
        }
        /* rsplit: collect from the right, then reverse */
        size_t e = n;
        int64_t k = 0;
        while (k < maxsplit && e >= sn) {
            size_t j = e - sn + 1, found = (size_t)-1;
            while (j-- > 0) if (!memcmp(p + j, sep->u.s.p, sn)) { found = j; break; }
            if (found == (size_t)-1) break;
            jlist_push(c, out.u.l, mkstr(p + found + sn, e - found - sn));
            e = found;
            k++;
        }
        jlist_push(c, out.u.l, mkstr(p, e));
        for (int64_t a = 0, b = out.u.l->n - 1; a < b; a++, b--) {
            jv t = out.u.l->v[a]; out.u.l->v[a] = out.u.l->v[b]; out.u.l->v[b] = t;
        }
        return out;
    }
    /* whitespace split: runs of whitespace, no empty strings */
    if (!right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            while (i < n) { uint32_t cp; int l = ju_dec(p + i, n - i, &cp); if (!ju_isspace(cp)) break; i += (size_t)l; }
            if (i >= n) break;
            if (k == maxsplit) {   /* the remainder, trailing whitespace kept (CPython) */
                jlist_push(c, out.u.l, mkstr(p + i, n - i));
                break;
            }
            size_t st = i;
            while (i < n) { uint32_t cp; int l = ju_dec(p + i, n - i, &cp); if (ju_isspace(cp)) break; i += (size_t)l; }
            jlist_push(c, out.u.l, mkstr(p + st, i - st));
            k++;
        }
        return out;
    }
    jv parts = do_split(c, s, NULL, -1, 0);
    int64_t np = parts.u.l->n;
    if (np <= maxsplit + 1) return parts;
    /* rsplit(None, k): the last k words, and the rest (left part, right-stripped) first */
    const jv *first_kept = &parts.u.l->v[np - maxsplit];
    size_t end = (size_t)(first_kept->u.s.p - p);
    jv head = jstr_strip(c, &(jv){.k = JV_STR, .u.s = {p, end}}, NULL, 0, 1);
    jlist_push(c, out.u.l, head);
    for (int64_t i = np - maxsplit; i < np; i++) jlist_push(c, out.u.l, parts.u.l->v[i]);
    return out;
}

static jv splitlines(jctx *c, const jv *s, int keepends)
{
    jv out = jv_list(c, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, st = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = ju_dec(p + i, n - i, &cp);
        int brk = cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || cp == 0x1c ||
                  cp == 0x1d || cp == 0x1e || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) { i += (size_t)l; continue; }
        size_t e = i + (size_t)l;
        if (cp == '\r' && e < n && p[e] == '\n') e++;
        jlist_push(c, out.u.l, mkstr(p + st, (keepends ? e : i) - st));
        st = i = e;
    }
    if (st < n) jlist_push(c, out.u.l, mkstr(p + st, n - st));
    return out;
}

/* str.format: {} {0} {name} fields (no format specs or conversions) */
static jv str_format(jctx *c, const jv *s, jv *args, int nargs, const char **kwn, jv *kwv, int nkw)
{
    jbuf b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    int auto_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '{' && i + 1 < n && p[i + 1] == '{') { jbuf_putc(c, &b, '{'); i++; continue; }
        if (p[i] == '}' && i + 1 < n && p[i + 1] == '}') { jbuf_putc(c, &b, '}'); i++; continue; }
        if (p[i] == '}') jfail(c, FT_E_INVALID, "Single '}' encountered in format string");
        if (p[i] != '{') { jbuf_putc(c, &b, p[i]); continue; }
        size_t e = i + 1;
        while (e < n && p[e] != '}') e++;
        if (e >= n) jfail(c, FT_E_INVALID, "Single '{' encountered in format string");
        const char *f = p + i + 1;
        size_t fl = e - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            jfail(c, FT_E_INVALID, "str.format with format specs is not supported");
        const jv *v = NULL;
        if (!fl) {
            if (auto_i >= nargs) jfail(c, FT_E_INVALID, "Replacement index %d out of range", auto_i);
            v = &args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            int k = atoi(f);
            if (k >= nargs) jfail(c, FT_E_INVALID, "Replacement index %d out of range", k);
            v = &args[k];
        } else {
            for (int k = 0; k < nkw; k++)
                if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl)) v = &kwv[k];
            if (!v) jfail(c, FT_E_INVALID, "'%.*s'", (int)fl, f);
        }
        jv_str_to(c, &b, v);
        i = e;
    }
    return bufstr(&b);
}

static jv pad(jctx *c, const jv *s, int64_t width, const jv *fill, int mode)
{
    int64_t len = ju_len(s->u.s.p, s->u.s.n);
    if (width <= len) return *s;
    if (width > c->o.max_output_bytes) jfail(c, FT_E_RANGE, "padding longer than the output limit");
    const char *fp = " ";
    size_t fn = 1;
    if (fill) {
        need_str(c, fill, "fill character");
        if (ju_len(fill->u.s.p, fill->u.s.n) != 1)
            jfail(c, FT_E_INVALID, "The fill character must be exactly one character long");
        fp = fill->u.s.p; fn = fill->u.s.n;
    }
    int64_t marg = width - len, left;
    if (mode == 0) left = marg / 2 + (marg & width & 1);   /* CPython str.center */
    else if (mode == 1) left = 0;                          /* ljust */
    else left = marg;                                      /* rjust */
    jbuf b = {0};
    for (int64_t i = 0; i < left; i++) jbuf_put(c, &b, fp, fn);
    jbuf_put(c, &b, s->u.s.p, s->u.s.n);
    for (int64_t i = 0; i < marg - left; i++) jbuf_put(c, &b, fp, fn);
    return bufstr(&b);
}

static int64_t int_arg(jctx *c, const jv *x, int64_t dflt, const char *what)
{
    if (!x || x->k == JV_NONE) return dflt;
    if (x->k == JV_INT) return x->u.i;
    if (x->k == JV_BOOL) return x->u.b;
    jfail(c, FT_E_INVALID, "%s must be an integer, not %s", what, jv_typename(x));
}

static int all_cp(const jv *s, int (*pred)(uint32_t))
{
    if (!s->u.s.n) return 0;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += (size_t)ju_dec(s->u.s.p + i, s->u.s.n - i, &cp);
        if (!pred(cp)) return 0;
    }
    return 1;
}

static int is_alnumcp(uint32_t cp) { return is_alpha(cp) || is_numericcp(cp); }
static int is_spacecp(uint32_t cp) { return ju_isspace(cp); }

/* islower/isupper: at least one cased char and no cased char of the other case */
static int case_test(const jv *s, int upper)
{
    int cased = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        uint32_t cp;
        i += (size_t)ju_dec(s->u.s.p + i, s->u.s.n - i, &cp);
        utf8proc_int32_t u = (utf8proc_int32_t)cp;
        if (upper ? utf8proc_islower(u) : utf8proc_isupper(u)) return 0;
        if (upper ? utf8proc_isupper(u) : utf8proc_islower(u)) cased = 1;
    }
    return cased;
}

static int64_t find_sub(const jv *s, const jv *sub, int right)
{
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, sn = sub->u.s.n;
    size_t at = (size_t)-1;
    if (!right) {
        const char *hit = sn ? memmem(p, n, sub->u.s.p, sn) : p;
        if (hit) at = (size_t)(hit - p);
    } else if (sn <= n) {
        for (size_t j = n - sn + 1; j-- > 0;)
            if (!memcmp(p + j, sub->u.s.p, sn)) { at = j; break; }
    }
    if (at == (size_t)-1) return -1;
    return ju_len(p, at);
}

static jv str_method(jctx *c, const jv *s, const char *m, jv *args, int nargs, const char **kwn,
                     jv *kwv, int nkw)
{
#define ARG(i, kw) jarg(args, nargs, i, kwn, kwv, nkw, kw)
    if (!strcmp(m, "strip")) return jstr_strip(c, s, ARG(0, "chars"), 1, 1);
    if (!strcmp(m, "lstrip")) return jstr_strip(c, s, ARG(0, "chars"), 1, 0);
    if (!strcmp(m, "rstrip")) return jstr_strip(c, s, ARG(0, "chars"), 0, 1);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const jv *a = ARG(0, NULL);
        if (!a) jfail(c, FT_E_INVALID, "%s() takes at least 1 argument (0 given)", m);
        if (nargs > 1) jfail(c, FT_E_INVALID, "%s() start/end arguments are not supported", m);
        return jv_bool(affix(c, s, a, m[0] == 'e'));
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit"))
        return do_split(c, s, ARG(0, "sep"), int_arg(c, ARG(1, "maxsplit"), -1, "maxsplit"),
                        m[0] == 'r');
    if (!strcmp(m, "splitlines")) {
        const jv *k = ARG(0, "keepends");
        return splitlines(c, s, k && jv_truthy(k));
    }
    if (!strcmp(m, "upper")) return jstr_case(c, s, 1);
    if (!strcmp(m, "lower") || !strcmp(m, "casefold")) return jstr_case(c, s, 0);
    if (!strcmp(m, "title")) return jstr_case(c, s, 2);
    if (!strcmp(m, "capitalize")) return jstr_case(c, s, 3);
    if (!strcmp(m, "swapcase")) return jstr_case(c, s, 5);
    if (!strcmp(m, "replace")) {
        const jv *o = need_str(c, ARG(0, "old"), "replace() argument 1");
        const jv *nw = need_str(c, ARG(1, "new"), "replace() argument 2");
        return jstr_replace(c, s, o, nw, int_arg(c, ARG(2, "count"), -1, "count"));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "rindex")) {
        if (nargs > 1) jfail(c, FT_E_INVALID, "%s() start/end arguments are not supported", m);
        const jv *sub = need_str(c, ARG(0, NULL), "substring");
        int64_t r = find_sub(s, sub, m[0] == 'r');
        if (r < 0 && strstr(m, "index")) jfail(c, FT_E_INVALID, "substring not found");
        return jv_int(r);
    }
    if (!strcmp(m, "count")) {
        if (nargs > 1) jfail(c, FT_E_INVALID, "count() start/end arguments are not supported");
        return jv_int(count_sub(s, need_str(c, ARG(0, NULL), "count() argument")));
    }
    if (!strcmp(m, "format")) return str_format(c, s, args, nargs, kwn, kwv, nkw);
    if (!strcmp(m, "join")) {
        const jv *it = ARG(0, NULL);
        if (!it) jfail(c, FT_E_INVALID, "join() takes exactly one argument (0 given)");
        jv *items;
        int64_t n;
        jiter(c, it, &items, &n);
        jbuf b = {0};
        for (int64_t i = 0; i < n; i++) {
            if (items[i].k != JV_STR)
                jfail(c, FT_E_INVALID, "sequence item %lld: expected str instance, %s found",
                      (long long)i, jv_typename(&items[i]));
            if (i) jbuf_put(c, &b, s->u.s.p, s->u.s.n);
            jbuf_put(c, &b, items[i].u.s.p, items[i].u.s.n);
        }
        return bufstr(&b);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isdecimal")) return jv_bool(all_cp(s, is_digitcp));
    if (!strcmp(m, "isnumeric")) return jv_bool(all_cp(s, is_numericcp));
    if (!strcmp(m, "isalpha")) return jv_bool(all_cp(s, is_alpha));
    if (!strcmp(m, "isalnum")) return jv_bool(all_cp(s, is_alnumcp));
    if (!strcmp(m, "isspace")) return jv_bool(all_cp(s, is_spacecp));
    if (!strcmp(m, "islower")) return jv_bool(case_test(s, 0));
    if (!strcmp(m, "isupper")) return jv_bool(case_test(s, 1));
    if (!strcmp(m, "istitle")) {
        int cased = 0, prev = 0;
        for (size_t i = 0; i < s->u.s.n;) {
            uint32_t cp;
            i += (size_t)ju_dec(s->u.s.p + i, s->u.s.n - i, &cp);
            utf8proc_int32_t u = (utf8proc_int32_t)cp;
            if (utf8proc_isupper(u) || utf8proc_category(u) == UTF8PROC_CATEGORY_LT) {
                if (prev) return jv_bool(0);
                prev = cased = 1;
            } else if (utf8proc_islower(u)) {
                if (!prev) return jv_bool(0);
                prev = cased = 1;
            } else {
                prev = 0;
            }
        }
        return jv_bool(cased);
    }
    if (!strcmp(m, "center") || !strcmp(m, "ljust") || !strcmp(m, "rjust")) {
        int64_t w = int_arg(c, ARG(0, "width"), 0, "width");
        return pad(c, s, w, ARG(1, "fillchar"), m[0] == 'c' ? 0 : m[0] == 'l' ? 1 : 2);
    }
    if (!strcmp(m, "zfill")) {
        int64_t w = int_arg(c, ARG(0, "width"), 0, "width");
        int64_t len = ju_len(s->u.s.p, s->u.s.n);
        if (w <= len) return *s;
        if (w > c->o.max_output_bytes) jfail(c, FT_E_RANGE, "padding longer than the output limit");
        jbuf b = {0};
        size_t st = 0;
        if (s->u.s.n && (s->u.s.p[0] == '+' || s->u.s.p[0] == '-')) { jbuf_putc(c, &b, s->u.s.p[0]); st = 1; }
        for (int64_t i = 0; i < w - len; i++) jbuf_putc(c, &b, '0');
        jbuf_put(c, &b, s->u.s.p + st, s->u.s.n - st);
        return bufstr(&b);
    }
    if (!strcmp(m, "partition") || !strcmp(m, "rpartition")) {
        const jv *sep = need_str(c, ARG(0, NULL), "separator");
        if (!sep->u.s.n) jfail(c, FT_E_INVALID, "empty separator");
        jv out = jv_list(c, 3);
        out.u.l->tuple = 1;
        int64_t cpi = find_sub(s, sep, m[0] == 'r');
        if (cpi < 0) {
            jv e = mkstr("", 0);
            if (m[0] == 'r') { jlist_push(c, out.u.l, e); jlist_push(c, out.u.l, e); jlist_push(c, out.u.l, *s); }
            else { jlist_push(c, out.u.l, *s); jlist_push(c, out.u.l, e); jlist_push(c, out.u.l, e); }
            return out;
        }
        size_t at = ju_off(s->u.s.p, s->u.s.n, cpi);
        jlist_push(c, out.u.l, mkstr(s->u.s.p, at));
        jlist_push(c, out.u.l, *sep);
        jlist_push(c, out.u.l, mkstr(s->u.s.p + at + sep->u.s.n, s->u.s.n - at - sep->u.s.n));
        return out;
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        const jv *a = need_str(c, ARG(0, NULL), m);
        int suf = m[6] == 's';
        if (!affix(c, s, a, suf)) return *s;
        return mkstr(s->u.s.p + (suf ? 0 : a->u.s.n), s->u.s.n - a->u.s.n);
    }
    if (!strcmp(m, "expandtabs")) {
        int64_t ts = int_arg(c, ARG(0, "tabsize"), 8, "tabsize");
        jbuf b = {0};
        int64_t col = 0;
        for (size_t i = 0; i < s->u.s.n;) {
            uint32_t cp;
            int l = ju_dec(s->u.s.p + i, s->u.s.n - i, &cp);
            if (cp == '\t') {
                if (ts > 0) { int64_t k = ts - col % ts; for (int64_t j = 0; j < k; j++) jbuf_putc(c, &b, ' '); col += k; }
            } else {
                jbuf_put(c, &b, s->u.s.p + i, (size_t)l);
                col = (cp == '\n' || cp == '\r') ? 0 : col + 1;
            }
            i += (size_t)l;
        }
        return bufstr(&b);
    }
#undef ARG
    jfail(c, FT_E_INVALID, "'str' object has no attribute '%s'", m);
}

jv jmethod_call(jctx *c, const jv *self, const char *m, jv *args, int nargs, const char **kwn,
                jv *kwv, int nkw)
{
    if (self->k == JV_LOOP && !strcmp(m, "cycle")) {
        if (!nargs) jfail(c, FT_E_INVALID, "no items for cycling given");
        return args[self->u.loop->i % nargs];
    }
    if (self->k == JV_STR) return str_method(c, self, m, args, nargs, kwn, kwv, nkw);
    if (self->k == JV_DICT) {
        jdict *d = self->u.d;
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            jv out = jv_list(c, d->n);
            for (int64_t i = 0; i < d->n; i++) {
                if (m[0] == 'k') { jlist_push(c, out.u.l, d->key[i]); continue; }
                if (m[0] == 'v') { jlist_push(c, out.u.l, d->val[i]); continue; }
                jv t = jv_list(c, 2);
                t.u.l->tuple = 1;
                jlist_push(c, t.u.l, d->key[i]);
                jlist_push(c, t.u.l, d->val[i]);
                jlist_push(c, out.u.l, t);
            }
            return out;
        }
        if (!strcmp(m, "get")) {
            if (nargs < 1) jfail(c, FT_E_INVALID, "get expected at least 1 argument, got 0");
            jv *v = jdict_get(d, args[0]);
            return v ? *v : nargs > 1 ? args[1] : jv_none();
        }
        if (!strcmp(m, "copy")) {
            jv out = jv_dict(c);
            for (int64_t i = 0; i < d->n; i++) jdict_set(c, out.u.d, d->key[i], d->val[i]);
            return out;
        }
    }
    if (self->k == JV_LIST) {
        jlist *l = self->u.l;
        if (!strcmp(m, "index") || !strcmp(m, "count")) {
            if (nargs < 1) jfail(c, FT_E_INVALID, "%s() takes at least 1 argument (0 given)", m);
            int64_t k = 0;
            for (int64_t i = 0; i < l->n; i++) {
                if (!jv_eq(&l->v[i], &args[0])) continue;
                if (m[0] == 'i') return jv_int(i);
                k++;
            }
            if (m[0] == 'i') jfail(c, FT_E_INVALID, "list.index(x): x not in list");
            return jv_int(k);
        }
        if (!strcmp(m, "copy")) {
            jv out = jv_list(c, l->n);
            for (int64_t i = 0; i < l->n; i++) jlist_push(c, out.u.l, l->v[i]);
            return out;
        }
    }
    jfail(c, FT_E_INVALID, "'%s' object has no attribute '%s'", jv_typename(self), m);
}

/* ---- printf-style formatting: str % args, the `format` filter --------------------------- */

/* Python's str % arg (printf-style formatting, Objects/unicodeobject.c): conversions
 * s r a d i u f F e E g G x X o c and %%, with (name) keys, flags "-+ 0#", width and
 * precision ("*" is not supported). arg: a tuple gives the values in order, a dict the
 * (name) lookups, anything else is the single value. */
jv jstr_percent(jctx *c, const jv *fmt, const jv *arg)
{
    jv one = *arg;
    const jv *vals = &one;
    int64_t nvals = 1, next = 0;
    if (arg->k == JV_LIST && arg->u.l->tuple) { vals = arg->u.l->v; nvals = arg->u.l->n; }
    const jdict *map = arg->k == JV_DICT ? arg->u.d : NULL;
    jbuf b = {0};
    const char *p = fmt->u.s.p, *e = p + fmt->u.s.n;
    int used_map = 0;
    while (p < e) {
        const char *pc = memchr(p, '%', (size_t)(e - p));
        if (!pc) { jbuf_put(c, &b, p, (size_t)(e - p)); break; }
        jbuf_put(c, &b, p, (size_t)(pc - p));
        p = pc + 1;
        if (p >= e) jfail(c, FT_E_INVALID, "incomplete format");
        if (*p == '%') { jbuf_putc(c, &b, '%'); p++; continue; }
        const jv *v = NULL;
        if (*p == '(') {
            const char *q = memchr(p, ')', (size_t)(e - p));
            if (!q) jfail(c, FT_E_INVALID, "incomplete format key");
            if (!map) jfail(c, FT_E_INVALID, "format requires a mapping");
            jv key = mkstr(p + 1, (size_t)(q - p - 1));
            v = jdict_get(map, key);
            if (!v) jfail(c, FT_E_INVALID, "'%.*s'", (int)key.u.s.n, key.u.s.p);
            used_map = 1;
            p = q + 1;
        }
        char flags[8]; int nf = 0;
        while (p < e && strchr("-+ 0#", *p) && nf < 7) flags[nf++] = *p++;
        flags[nf] = 0;
        int width = -1, prec = -1;
        if (p < e && *p == '*') jfail(c, FT_E_INVALID, "'*' width in format strings is not supported");
        if (p < e && *p >= '0' && *p <= '9') { width = 0; while (p < e && *p >= '0' && *p <= '9') width = width * 10 + (*p++ - '0'); }
        if (p < e && *p == '.') { p++; prec = 0; while (p < e && *p >= '0' && *p <= '9') prec = prec * 10 + (*p++ - '0'); }
        while (p < e && (*p == 'h' || *p == 'l' || *p == 'L')) p++;
        if (p >= e) jfail(c, FT_E_INVALID, "incomplete format");
        char conv = *p++;
        if (width > 4096 || prec > 4096) jfail(c, FT_E_RANGE, "format width too large");
        if (!v) {
            if (map && !(arg->k == JV_LIST && arg->u.l->tuple)) v = arg;
            else if (next >= nvals) jfail(c, FT_E_INVALID, "not enough arguments for format string");
            else v = &vals[next++];
        }
        char spec[32], tmp[4200];
        int left = strchr(flags, '-') != NULL;
        if (conv == 's' || conv == 'r' || conv == 'a') {
            jbuf sb = {0};
            if (conv == 's') jv_str_to(c, &sb, v); else jv_repr_to(c, &sb, v);
            size_t len = sb.n;
            if (prec >= 0) len = ju_off(sb.p ? sb.p : "", sb.n, prec);
            int64_t cps = ju_len(sb.p ? sb.p : "", len);
            if (!left) for (int64_t k = cps; k < width; k++) jbuf_putc(c, &b, ' ');
            jbuf_put(c, &b, sb.p ? sb.p : "", len);
            if (left) for (int64_t k = cps; k < width; k++) jbuf_putc(c, &b, ' ');
            continue;
        }
        if (conv == 'c') {
            if (v->k == JV_STR && ju_len(v->u.s.p, v->u.s.n) == 1) { jbuf_put(c, &b, v->u.s.p, v->u.s.n); continue; }
            if (v->k != JV_INT) jfail(c, FT_E_INVALID, "%%c requires an int or a unicode character");
            put_cp(c, &b, (uint32_t)v->u.i);
            continue;
        }
        int is_int_conv = strchr("diuxXo", conv) != NULL;
        if (!strchr("diuxXofFeEgG", conv)) jfail(c, FT_E_INVALID, "unsupported format character '%c'", conv);
        if (v->k != JV_INT && v->k != JV_BOOL && v->k != JV_FLOAT)
            jfail(c, FT_E_INVALID, "%%%c format: a real number is required, not %s", conv, jv_typename(v));
        if (is_int_conv) {
            if (v->k == JV_FLOAT && (conv == 'x' || conv == 'X' || conv == 'o'))
                jfail(c, FT_E_INVALID, "%%%c format: an integer is required, not float", conv);
            long long iv = v->k == JV_INT ? (long long)v->u.i : v->k == JV_BOOL ? v->u.b : (long long)v->u.f;
            char cv = conv == 'i' || conv == 'u' ? 'd' : conv;
            if (prec >= 0) snprintf(spec, sizeof spec, "%%%s%s.%dll%c", flags, width >= 0 ? "*" : "", prec, cv);
            else snprintf(spec, sizeof spec, "%%%s%sll%c", flags, width >= 0 ? "*" : "", cv);
            if (width >= 0) snprintf(tmp, sizeof tmp, spec, width, iv); else snprintf(tmp, sizeof tmp, spec, iv);
            if (conv == 'o' && strchr(flags, '#')) {   /* Python writes 0o */
                char *z = strchr(tmp, '0');
                if (z) { memmove(z + 2, z + 1, strlen(z + 1) + 1); z[1] = 'o'; }
            }
        } else {
            double fv = v->k == JV_FLOAT ? v->u.f : v->k == JV_INT ? (double)v->u.i : v->u.b;
            if (prec < 0) prec = 6;
            snprintf(spec, sizeof spec, "%%%s%s.%d%c", flags, width >= 0 ? "*" : "", prec, conv);
            if (width >= 0) snprintf(tmp, sizeof tmp, spec, width, fv); else snprintf(tmp, sizeof tmp, spec, fv);
        }
        jbuf_puts(c, &b, tmp);
    }
    if (!used_map && !(map && !(arg->k == JV_LIST && arg->u.l->tuple)) && next < nvals)
        jfail(c, FT_E_INVALID, "not all arguments converted during string formatting");
    return bufstr(&b);
}
