/* jinja_value.c - values of the Jinja interpreter (jinja_internal.h): the arena, lists and
 * ordered dicts, conversion from cJSON, truthiness, equality and ordering (Python rules),
 * str()/repr() as Python prints them, json.dumps, and UTF-8 helpers.
 */
#include "src/template/jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

/* ---- arena ---------------------------------------------------------------------------- */

#define CHUNK_BYTES (64u << 10)

void *ja_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jchunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        if (a->limit && a->total + cap + sizeof *h > a->limit) {
            a->over_limit = 1;
            return NULL;
        }
        h = malloc(sizeof *h + cap + 16);
        if (!h) return NULL;
        h->cap = cap; h->used = 0;
        h->next = a->head;
        a->head = h;
        a->total += cap + sizeof *h;
    }
    char *base = (char *)(((uintptr_t)(h + 1) + 15) & ~(uintptr_t)15);
    void *p = base + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a)
{
    jchunk *h = a->head;
    while (h) {
        jchunk *nx = h->next;
        free(h);
        h = nx;
    }
    a->head = NULL;
    a->total = 0;
}

void *jalloc(jctx *c, size_t n)
{
    void *p = ja_alloc(&c->a, n);
    if (!p) {
        if (c->a.over_limit)
            jfail(c, FT_E_RANGE, "render memory limit of %lld bytes exceeded",
                  (long long)c->o.max_mem_bytes);
        jnomem(c);
    }
    return p;
}

/* ---- constructors -------------------------------------------------------------------- */

jv jv_none(void) { jv x = {.k = JV_NONE}; return x; }
jv jv_undef(const char *hint)
{
    jv x = {.k = JV_UNDEF};
    x.u.s.p = hint;
    x.u.s.n = hint ? strlen(hint) : 0;
    return x;
}
jv jv_bool(int b) { jv x = {.k = JV_BOOL}; x.u.b = !!b; return x; }
jv jv_int(int64_t i) { jv x = {.k = JV_INT}; x.u.i = i; return x; }
jv jv_float(double f) { jv x = {.k = JV_FLOAT}; x.u.f = f; return x; }

jv jv_str(jctx *c, const char *s, size_t n)
{
    char *p = jalloc(c, n + 1);
    if (n) memcpy(p, s, n);
    jv x = {.k = JV_STR};
    x.u.s.p = p; x.u.s.n = n;
    return x;
}

jv jv_strz(const char *s)
{
    jv x = {.k = JV_STR};
    x.u.s.p = s; x.u.s.n = strlen(s);
    return x;
}

jv jv_list(jctx *c, int64_t cap)
{
    jv x = {.k = JV_LIST};
    x.u.l = jalloc(c, sizeof *x.u.l);
    if (cap > 0) {
        x.u.l->v = jalloc(c, (size_t)cap * sizeof(jv));
        x.u.l->cap = cap;
    }
    return x;
}

jv jv_dict(jctx *c)
{
    jv x = {.k = JV_DICT};
    x.u.d = jalloc(c, sizeof *x.u.d);
    return x;
}

void jlist_push(jctx *c, jlist *l, jv x)
{
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 8;
        jv *v = jalloc(c, (size_t)cap * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v; l->cap = cap;
    }
    l->v[l->n++] = x;
}

jv *jdict_get(const jdict *d, jv key)
{
    for (int64_t i = 0; i < d->n; i++)
        if (jv_eq(&d->key[i], &key)) return &d->val[i];
    return NULL;
}

jv *jdict_getz(const jdict *d, const char *key)
{
    size_t n = strlen(key);
    for (int64_t i = 0; i < d->n; i++)
        if (d->key[i].k == JV_STR && d->key[i].u.s.n == n && !memcmp(d->key[i].u.s.p, key, n))
            return &d->val[i];
    return NULL;
}

void jdict_set(jctx *c, jdict *d, jv key, jv val)
{
    jv *old = jdict_get(d, key);
    if (old) { *old = val; return; }
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 8;
        jv *k = jalloc(c, (size_t)cap * sizeof *k), *v = jalloc(c, (size_t)cap * sizeof *v);
        if (d->n) {
            memcpy(k, d->key, (size_t)d->n * sizeof *k);
            memcpy(v, d->val, (size_t)d->n * sizeof *v);
        }
        d->key = k; d->val = v; d->cap = cap;
    }
    d->key[d->n] = key;
    d->val[d->n++] = val;
}

jv jv_from_cjson(jctx *c, const cJSON *j)
{
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double f = j->valuedouble;
        if (f == floor(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);   /* cJSON keeps doubles only */
        return jv_float(f);
    }
    if (cJSON_IsString(j)) return jv_str(c, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        jv l = jv_list(c, cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next) jlist_push(c, l.u.l, jv_from_cjson(c, e));
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict(c);
        for (const cJSON *e = j->child; e; e = e->next)
            jdict_set(c, d.u.d, jv_str(c, e->string, strlen(e->string)), jv_from_cjson(c, e));
        return d;
    }
    return jv_none();   /* cJSON_Raw / invalid: not produced by cJSON_Parse */
}

/* ---- truthiness, equality, ordering ----------------------------------------------------- */

int jv_truthy(const jv *x)
{
    switch (x->k) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return x->u.b;
    case JV_INT: return x->u.i != 0;
    case JV_FLOAT: return x->u.f != 0.0;
    case JV_STR: return x->u.s.n != 0;
    case JV_LIST: return x->u.l->n != 0;
    case JV_DICT: return x->u.d->n != 0;
    default: return 1;
    }
}

static int is_num(const jv *x) { return x->k == JV_BOOL || x->k == JV_INT || x->k == JV_FLOAT; }
static double num_f(const jv *x)
{
    return x->k == JV_FLOAT ? x->u.f : x->k == JV_INT ? (double)x->u.i : (double)x->u.b;
}
static int64_t num_i(const jv *x) { return x->k == JV_INT ? x->u.i : (int64_t)x->u.b; }

int jv_eq(const jv *a, const jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->k == JV_FLOAT || b->k == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->k != b->k) return 0;
    switch (a->k) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST:
        if (a->u.l->tuple != b->u.l->tuple || a->u.l->n != b->u.l->n) return 0;
        for (int64_t i = 0; i < a->u.l->n; i++)
            if (!jv_eq(&a->u.l->v[i], &b->u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n) return 0;
        for (int64_t i = 0; i < a->u.d->n; i++) {
            jv *o = jdict_get(b->u.d, a->u.d->key[i]);
            if (!o || !jv_eq(&a->u.d->val[i], o)) return 0;
        }
        return 1;
    case JV_NS: return a->u.d == b->u.d;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_LOOP: return a->u.loop == b->u.loop;
    default: return 0;
    }
}

int jv_cmp(jctx *c, const jv *a, const jv *b)
{
    if (is_num(a) && is_num(b)) {
        if (a->k == JV_FLOAT || b->k == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->k == JV_STR && b->k == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n);  /* UTF-8 byte order = code point order */
        if (r) return r < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n ? 1 : 0;
    }
    if (a->k == JV_LIST && b->k == JV_LIST && a->u.l->tuple == b->u.l->tuple) {
        int64_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (int64_t i = 0; i < n; i++) {
            if (jv_eq(&a->u.l->v[i], &b->u.l->v[i])) continue;
            return jv_cmp(c, &a->u.l->v[i], &b->u.l->v[i]);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
    }
    jfail(c, FT_E_INVALID, "'<' not supported between instances of '%s' and '%s'",
          jv_typename(a), jv_typename(b));
}

const char *jv_typename(const jv *x)
{
    switch (x->k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return x->u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return x->u.fn->kind == JF_MACRO || x->u.fn->kind == JF_CALLER ? "Macro"
                                                                                 : "function";
    case JV_LOOP: return "LoopContext";
    default: return "object";
    }
}

/* ---- buffers ------------------------------------------------------------------------------ */

void jbuf_put(jctx *c, jbuf *b, const char *s, size_t n)
{
    if (!n) return;
    if ((int64_t)(b->n + n) > c->o.max_output_bytes)
        jfail(c, FT_E_RANGE, "output longer than the limit of %lld bytes",
              (long long)c->o.max_output_bytes);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = jalloc(c, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jbuf_puts(jctx *c, jbuf *b, const char *s) { jbuf_put(c, b, s, strlen(s)); }
void jbuf_putc(jctx *c, jbuf *b, char ch) { jbuf_put(c, b, &ch, 1); }

/* ---- printing --------------------------------------------------------------------------- */

void jfloat_repr(char *dst, size_t cap, double f)
{
    if (isnan(f)) { snprintf(dst, cap, "nan"); return; }
    if (isinf(f)) { snprintf(dst, cap, f < 0 ? "-inf" : "inf"); return; }
    if (f == 0) { snprintf(dst, cap, signbit(f) ? "-0.0" : "0.0"); return; }
    /* shortest round-trip digits (Python repr, float_repr_style 'short') */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *p = e;
    int neg = 0;
    if (*p == '-') { neg = 1; p++; }
    char dig[24]; int nd = 0;
    for (; *p && *p != 'e'; p++) if (*p != '.') dig[nd++] = *p;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int ex = atoi(p + 1);   /* value = 0.d1d2... * 10^(ex+1) */
    char out[64]; int o = 0;
    if (neg) out[o++] = '-';
    if (ex < -4 || ex >= 16) {
        out[o++] = dig[0];
        if (nd > 1) { out[o++] = '.'; for (int i = 1; i < nd; i++) out[o++] = dig[i]; }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex < 0) {
        out[o++] = '0'; out[o++] = '.';
        for (int i = 0; i < -ex - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = dig[i];
    } else {
        for (int i = 0; i <= ex; i++) out[o++] = i < nd ? dig[i] : '0';
        out[o++] = '.';
        if (nd > ex + 1) for (int i = ex + 1; i < nd; i++) out[o++] = dig[i];
        else out[o++] = '0';
    }
    out[o] = 0;
    snprintf(dst, cap, "%s", out);
}

static void repr_str(jctx *c, jbuf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    jbuf_putc(c, b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = ju_dec(s + i, n - i, &cp);
        char tmp[12];
        if (cp == (uint32_t)q || cp == '\\') { tmp[0] = '\\'; tmp[1] = (char)cp; jbuf_put(c, b, tmp, 2); }
        else if (cp == '\n') jbuf_put(c, b, "\\n", 2);
        else if (cp == '\r') jbuf_put(c, b, "\\r", 2);
        else if (cp == '\t') jbuf_put(c, b, "\\t", 2);
        else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
            snprintf(tmp, sizeof tmp, "\\x%02x", cp);
            jbuf_puts(c, b, tmp);
        } else if (cp == 0x2028 || cp == 0x2029 || (cp >= 0x200b && cp <= 0x200f) || cp == 0xfeff) {
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            jbuf_puts(c, b, tmp);
        } else {
            jbuf_put(c, b, s + i, (size_t)len);
        }
        i += (size_t)len;
    }
    jbuf_putc(c, b, q);
}

static void repr_any(jctx *c, jbuf *b, const jv *x, int depth)
{
    if (depth > 200) jfail(c, FT_E_INVALID, "value nested too deeply to print");
    switch (x->k) {
    case JV_STR: repr_str(c, b, x->u.s.p, x->u.s.n); return;
    case JV_LIST: {
        jlist *l = x->u.l;
        jbuf_putc(c, b, l->tuple ? '(' : '[');
        for (int64_t i = 0; i < l->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            repr_any(c, b, &l->v[i], depth + 1);
        }
        if (l->tuple && l->n == 1) jbuf_putc(c, b, ',');
        jbuf_putc(c, b, l->tuple ? ')' : ']');
        return;
    }
    case JV_DICT:
    case JV_NS: {
        jdict *d = x->u.d;
        jbuf_puts(c, b, x->k == JV_NS ? "<Namespace {" : "{");
        for (int64_t i = 0; i < d->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            repr_any(c, b, &d->key[i], depth + 1);
            jbuf_put(c, b, ": ", 2);
            repr_any(c, b, &d->val[i], depth + 1);
        }
        jbuf_puts(c, b, x->k == JV_NS ? "}>" : "}");
        return;
    }
    default: jv_str_to(c, b, x); return;
    }
}

void jv_repr_to(jctx *c, jbuf *b, const jv *x) { repr_any(c, b, x, 0); }

void jv_str_to(jctx *c, jbuf *b, const jv *x)
{
    char tmp[64];
    switch (x->k) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_put(c, b, "None", 4); return;
    case JV_BOOL: jbuf_puts(c, b, x->u.b ? "True" : "False"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)x->u.i); jbuf_puts(c, b, tmp); return;
    case JV_FLOAT: jfloat_repr(tmp, sizeof tmp, x->u.f); jbuf_puts(c, b, tmp); return;
    case JV_STR: jbuf_put(c, b, x->u.s.p, x->u.s.n); return;
    case JV_LIST: case JV_DICT: case JV_NS: repr_any(c, b, x, 0); return;
    case JV_FUNC:
        if (x->u.fn->kind == JF_MACRO || x->u.fn->kind == JF_CALLER) {
            jbuf_puts(c, b, "<Macro '");
            jbuf_puts(c, b, x->u.fn->kind == JF_CALLER ? "caller" : x->u.fn->node->s);
            jbuf_puts(c, b, "'>");
        } else {
            jbuf_puts(c, b, "<built-in method ");
            jbuf_puts(c, b, x->u.fn->name);
            jbuf_putc(c, b, '>');
        }
        return;
    case JV_LOOP: jbuf_puts(c, b, "<LoopContext>"); return;
    }
}

jv jv_to_str(jctx *c, const jv *x)
{
    if (x->k == JV_STR) return *x;
    jbuf b = {0};
    jv_str_to(c, &b, x);
    jv s = {.k = JV_STR};
    s.u.s.p = b.p ? b.p : "";
    s.u.s.n = b.n;
    return s;
}

/* ---- json.dumps ---------------------------------------------------------------------------- */

static void json_str(jctx *c, jbuf *b, const char *s, size_t n, int ensure_ascii)
{
    jbuf_putc(c, b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[16];
        if (ch == '"') { jbuf_put(c, b, "\\\"", 2); i++; continue; }
        if (ch == '\\') { jbuf_put(c, b, "\\\\", 2); i++; continue; }
        if (ch == '\n') { jbuf_put(c, b, "\\n", 2); i++; continue; }
        if (ch == '\r') { jbuf_put(c, b, "\\r", 2); i++; continue; }
        if (ch == '\t') { jbuf_put(c, b, "\\t", 2); i++; continue; }
        if (ch == '\b') { jbuf_put(c, b, "\\b", 2); i++; continue; }
        if (ch == '\f') { jbuf_put(c, b, "\\f", 2); i++; continue; }
        if (ch < 0x20 || (ensure_ascii && ch == 0x7f)) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            jbuf_puts(c, b, tmp);
            i++;
            continue;
        }
        if (ch < 0x80 || !ensure_ascii) {
            size_t j = i + 1;
            if (ch >= 0x80) while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            jbuf_put(c, b, s + i, j - i);
            i = j;
            continue;
        }
        uint32_t cp;
        i += (size_t)ju_dec(s + i, n - i, &cp);
        if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        } else {
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
        }
        jbuf_puts(c, b, tmp);
    }
    jbuf_putc(c, b, '"');
}

static void json_nl(jctx *c, jbuf *b, const char *indent, int level)
{
    jbuf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(c, b, indent);
}

/* json.dumps dict keys: str kept; int/float/bool/None converted; others TypeError */
static jv json_key(jctx *c, const jv *k)
{
    char tmp[64];
    switch (k->k) {
    case JV_STR: return *k;
    case JV_BOOL: return jv_strz(k->u.b ? "true" : "false");
    case JV_NONE: return jv_strz("null");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)k->u.i); return jv_str(c, tmp, strlen(tmp));
    case JV_FLOAT: jfloat_repr(tmp, sizeof tmp, k->u.f); return jv_str(c, tmp, strlen(tmp));
    default:
        jfail(c, FT_E_INVALID, "keys must be str, int, float, bool or None, not %s",
              jv_typename(k));
    }
}

void jv_json_to(jctx *c, jbuf *b, const jv *x, int ensure_ascii, const char *indent,
                const char *item_sep, const char *key_sep, int sort_keys, int level)
{
    char tmp[64];
    if (level > 200) jfail(c, FT_E_INVALID, "value nested too deeply for tojson");
    switch (x->k) {
    case JV_NONE: jbuf_puts(c, b, "null"); return;
    case JV_BOOL: jbuf_puts(c, b, x->u.b ? "true" : "false"); return;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)x->u.i); jbuf_puts(c, b, tmp); return;
    case JV_FLOAT:
        if (isnan(x->u.f)) jbuf_puts(c, b, "NaN");
        else if (isinf(x->u.f)) jbuf_puts(c, b, x->u.f < 0 ? "-Infinity" : "Infinity");
        else { jfloat_repr(tmp, sizeof tmp, x->u.f); jbuf_puts(c, b, tmp); }
        return;
    case JV_STR: json_str(c, b, x->u.s.p, x->u.s.n, ensure_ascii); return;
    case JV_LIST: {
        jlist *l = x->u.l;
        if (!l->n) { jbuf_puts(c, b, "[]"); return; }
        jbuf_putc(c, b, '[');
        for (int64_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(c, b, item_sep);
            if (indent) json_nl(c, b, indent, level + 1);
            jv_json_to(c, b, &l->v[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent) json_nl(c, b, indent, level);
        jbuf_putc(c, b, ']');
        return;
    }
    case JV_DICT: {
        jdict *d = x->u.d;
        if (!d->n) { jbuf_puts(c, b, "{}"); return; }
        int64_t *ord = jalloc(c, (size_t)d->n * sizeof *ord);
        jv *keys = jalloc(c, (size_t)d->n * sizeof *keys);
        for (int64_t i = 0; i < d->n; i++) { ord[i] = i; keys[i] = json_key(c, &d->key[i]); }
        if (sort_keys) {  /* insertion sort: stable, fine for template-sized dicts */
            for (int64_t i = 1; i < d->n; i++) {
                int64_t v = ord[i], j = i;
                while (j > 0 && jv_cmp(c, &keys[ord[j - 1]], &keys[v]) > 0) { ord[j] = ord[j - 1]; j--; }
                ord[j] = v;
            }
        }
        jbuf_putc(c, b, '{');
        for (int64_t i = 0; i < d->n; i++) {
            if (i) jbuf_puts(c, b, item_sep);
            if (indent) json_nl(c, b, indent, level + 1);
            json_str(c, b, keys[ord[i]].u.s.p, keys[ord[i]].u.s.n, ensure_ascii);
            jbuf_puts(c, b, key_sep);
            jv_json_to(c, b, &d->val[ord[i]], ensure_ascii, indent, item_sep, key_sep, sort_keys,
                       level + 1);
        }
        if (indent) json_nl(c, b, indent, level);
        jbuf_putc(c, b, '}');
        return;
    }
    default:
        jfail(c, FT_E_INVALID, "Object of type %s is not JSON serializable", jv_typename(x));
    }
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

int ju_dec(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) { *cp = u[0]; return 1; }
    int len = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if (len == 1 || (size_t)len > n) { *cp = u[0]; return 1; }
    uint32_t v = u[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) { *cp = u[0]; return 1; }
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    return len;
}

int64_t ju_len(const char *s, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)ju_dec(s + i, n - i, &cp);
        k++;
    }
    return k;
}

size_t ju_off(const char *s, size_t n, int64_t i)
{
    size_t o = 0;
    for (int64_t k = 0; k < i && o < n; k++) {
        uint32_t cp;
        o += (size_t)ju_dec(s + o, n - o, &cp);
    }
    return o;
}

int ju_isspace(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}
