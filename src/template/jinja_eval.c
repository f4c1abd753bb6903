/* jinja_eval.c - the Jinja tree walker (jinja.h): statements, expressions, scopes, calls;
 * ft_jinja_render.
 *
 * Scoping follows jinja2: a for-loop iteration, a macro call, a caller() body and a with
 * block each get a fresh scope whose writes ({% set %}) vanish when it ends (hence
 * namespace()); if/elif/else and generation blocks write to the enclosing scope. A macro's
 * body sees the template's top-level names as they are when it is called. Names resolve
 * through the scopes, then the render's variables, then the globals.
 * Operators are in jinja_ops.c; here: chained comparisons, `and`/`or` returning an operand,
 * `~` joining str() of each side, conditional expressions (a missing else is Undefined).
 * Errors longjmp to ft_jinja_render, which frees the render's arena and returns the code.
 */
#include "src/template/jinja_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

enum { FLOW_NORMAL = 0, FLOW_BREAK, FLOW_CONTINUE };

void jfail(jctx *c, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ft_err(code, "%s:%d: %s", c->t->name, c->line, msg);
    longjmp(c->jb, code);
}

void jnomem(jctx *c)
{
    ft_err(-ENOMEM, "%s: out of memory while rendering", c->t->name);
    longjmp(c->jb, -ENOMEM);
}

void jstep(jctx *c)
{
    if (++c->steps > c->o.max_steps)
        jfail(c, FT_E_RANGE, "more than %lld loop iterations and calls",
              (long long)c->o.max_steps);
}

/* ---- scopes ------------------------------------------------------------------------------ */

static jscope *scope_new(jctx *c, jscope *parent)
{
    jscope *s = jalloc(c, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(jctx *c, jscope *s, const char *name, jv val)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->vars[i].name, name)) { s->vars[i].val = val; return; }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        jvar *v = jalloc(c, (size_t)cap * sizeof *v);
        if (s->n) memcpy(v, s->vars, (size_t)s->n * sizeof *v);
        s->vars = v; s->cap = cap;
    }
    s->vars[s->n].name = name;
    s->vars[s->n++].val = val;
}

static jv *scope_find(jscope *s, const char *name)
{
    for (; s; s = s->parent)
        for (int i = 0; i < s->n; i++)
            if (!strcmp(s->vars[i].name, name)) return &s->vars[i].val;
    return NULL;
}

static jv lookup(jctx *c, jscope *sc, const char *name)
{
    jv *v = scope_find(sc, name);
    if (v) return *v;
    v = jdict_getz(c->vars, name);
    if (v) return *v;
    jv g;
    if (jglobal_lookup(name, &g)) return g;
    char *hint = jalloc(c, strlen(name) + 20);
    sprintf(hint, "'%s' is undefined", name);
    return jv_undef(hint);
}

void jfail_undef(jctx *c, const jv *u)
{
    jfail(c, FT_E_INVALID, "%.*s", (int)u->u.s.n, u->u.s.p ? u->u.s.p : "undefined value");
}

/* ---- calls ------------------------------------------------------------------------------------- */

static int exec_body(jctx *c, jscope *sc, jnode **body, int n);

static jv capture(jctx *c, jscope *sc, jnode **body, int n)
{
    jbuf b = {0};
    jbuf *saved = c->cur;
    c->cur = &b;
    c->capture_depth++;
    exec_body(c, sc, body, n);
    c->capture_depth--;
    c->cur = saved;
    jv s = {.k = JV_STR};
    s.u.s.p = b.p ? b.p : "";
    s.u.s.n = b.n;
    return s;
}

/* Binds parameters names[0..np) (defaults w[] for the last nw) in scope s. */
static void bind_params(jctx *c, jscope *s, const jnode *def, const char *what, jv *args,
                        int nargs, const char **kwn, jv *kwv, int nkw)
{
    int np = def->nnames, first_def = np - def->nw;
    if (nargs > np)
        jfail(c, FT_E_INVALID, "%s takes not more than %d argument(s)", what, np);
    for (int k = 0; k < nkw; k++) {
        int found = 0;
        for (int p = 0; p < np; p++) if (!strcmp(def->names[p], kwn[k])) found = 1;
        if (!found) jfail(c, FT_E_INVALID, "%s takes no keyword argument '%s'", what, kwn[k]);
    }
    for (int p = 0; p < np; p++) {
        const jv *v = NULL;
        if (p < nargs) v = &args[p];
        for (int k = 0; k < nkw; k++) if (!strcmp(def->names[p], kwn[k])) v = &kwv[k];
        if (v) { scope_set(c, s, def->names[p], *v); continue; }
        if (p >= first_def) {
            scope_set(c, s, def->names[p], jeval(c, s, def->w[p - first_def]));
            continue;
        }
        char *hint = jalloc(c, strlen(def->names[p]) + 40);
        sprintf(hint, "parameter '%s' was not provided", def->names[p]);
        scope_set(c, s, def->names[p], jv_undef(hint));
    }
}

static jv call_macro(jctx *c, const jfunc *fn, jv *args, int nargs, const char **kwn, jv *kwv,
                     int nkw, const jv *caller)
{
    const jnode *m = fn->node;
    if (++c->depth > c->o.max_depth)
        jfail(c, FT_E_RANGE, "macro calls nested deeper than %d", c->o.max_depth);
    jstep(c);
    int saved_line = c->line;
    jscope *s = scope_new(c, c->root);
    char what[160];
    snprintf(what, sizeof what, "macro '%s'", m->s);
    bind_params(c, s, m, what, args, nargs, kwn, kwv, nkw);
    if (caller) scope_set(c, s, "caller", *caller);
    jv r = capture(c, s, m->v, m->nv);
    c->line = saved_line;
    c->depth--;
    return r;
}

jv jcall(jctx *c, jscope *sc, const jv *fn, jv *args, int nargs, const char **kwn, jv *kwv,
         int nkw)
{
    (void)sc;
    if (fn->k == JV_UNDEF) jfail_undef(c, fn);
    if (fn->k != JV_FUNC) jfail(c, FT_E_INVALID, "'%s' object is not callable", jv_typename(fn));
    const jfunc *f = fn->u.fn;
    switch (f->kind) {
    case JF_BUILTIN: return jglobal_call(c, f->name, args, nargs, kwn, kwv, nkw);
    case JF_METHOD: return jmethod_call(c, &f->self, f->name, args, nargs, kwn, kwv, nkw);
    case JF_UNSAFE:
        jfail(c, FT_E_INVALID, "access to attribute '%s' of '%s' object is unsafe.", f->name,
              jv_typename(&f->self));
    case JF_MACRO: return call_macro(c, f, args, nargs, kwn, kwv, nkw, NULL);
    case JF_CALLER: {
        if (++c->depth > c->o.max_depth)
            jfail(c, FT_E_RANGE, "macro calls nested deeper than %d", c->o.max_depth);
        jstep(c);
        int saved_line = c->line;
        jscope *s = scope_new(c, f->scope);
        bind_params(c, s, f->node, "macro 'caller'", args, nargs, kwn, kwv, nkw);
        jv r = capture(c, s, f->node->v, f->node->nv);
        c->line = saved_line;
        c->depth--;
        return r;
    }
    }
    jfail(c, FT_E_INVALID, "object is not callable");
}

static void eval_args(jctx *c, jscope *sc, const jnode *n, jv **args, jv **kwv)
{
    *args = n->nv ? jalloc(c, (size_t)n->nv * sizeof **args) : NULL;
    *kwv = n->nw ? jalloc(c, (size_t)n->nw * sizeof **kwv) : NULL;
    for (int i = 0; i < n->nv; i++) (*args)[i] = jeval(c, sc, n->v[i]);
    for (int i = 0; i < n->nw; i++) (*kwv)[i] = jeval(c, sc, n->w[i]);
}

static jv apply_filter(jctx *c, jscope *sc, const jnode *f, jv base)
{
    jv x = f->a ? jeval(c, sc, f->a) : base;
    jv *args = jalloc(c, (size_t)(f->nv + 1) * sizeof *args);
    args[0] = x;
    for (int i = 0; i < f->nv; i++) args[i + 1] = jeval(c, sc, f->v[i]);
    jv *kwv = f->nw ? jalloc(c, (size_t)f->nw * sizeof *kwv) : NULL;
    for (int i = 0; i < f->nw; i++) kwv[i] = jeval(c, sc, f->w[i]);
    c->line = f->line;
    return jfilter(c, sc, f->s, args, f->nv + 1, f->names, kwv, f->nw);
}

/* a filter chain of a block ({% filter %}, {% set x | f %}): the innermost has a == NULL */
static jv apply_block_filters(jctx *c, jscope *sc, const jnode *f, jv base)
{
    if (!f) return base;
    jv x = f->a ? apply_block_filters(c, sc, f->a, base) : base;
    jv *args = jalloc(c, (size_t)(f->nv + 1) * sizeof *args);
    args[0] = x;
    for (int i = 0; i < f->nv; i++) args[i + 1] = jeval(c, sc, f->v[i]);
    jv *kwv = f->nw ? jalloc(c, (size_t)f->nw * sizeof *kwv) : NULL;
    for (int i = 0; i < f->nw; i++) kwv[i] = jeval(c, sc, f->w[i]);
    return jfilter(c, sc, f->s, args, f->nv + 1, f->names, kwv, f->nw);
}

/* ---- expressions -------------------------------------------------------------------------------- */

jv jeval(jctx *c, jscope *sc, const jnode *e)
{
    c->line = e->line;
    switch (e->kind) {
    case JN_CONST: return e->val;
    case JN_NAME: return lookup(c, sc, e->s);
    case JN_LIST: case JN_TUPLE: {
        jv l = jv_list(c, e->nv);
        l.u.l->tuple = e->kind == JN_TUPLE;
        for (int i = 0; i < e->nv; i++) jlist_push(c, l.u.l, jeval(c, sc, e->v[i]));
        return l;
    }
    case JN_DICT: {
        jv d = jv_dict(c);
        for (int i = 0; i < e->nv; i++) {
            jv k = jeval(c, sc, e->v[i]);
            if (k.k == JV_LIST && !k.u.l->tuple) jfail(c, FT_E_INVALID, "unhashable type: 'list'");
            if (k.k == JV_DICT) jfail(c, FT_E_INVALID, "unhashable type: 'dict'");
            jdict_set(c, d.u.d, k, jeval(c, sc, e->w[i]));
        }
        return d;
    }
    case JN_ATTR: {
        jv o = jeval(c, sc, e->a);
        c->line = e->line;
        return jgetattr(c, &o, e->s);
    }
    case JN_ITEM: {
        jv o = jeval(c, sc, e->a);
        if (e->b->kind == JN_SLICE) {
            const jnode *s = e->b;
            jv st = s->b ? jeval(c, sc, s->b) : jv_none();
            jv sp = s->c ? jeval(c, sc, s->c) : jv_none();
            jv se = s->d ? jeval(c, sc, s->d) : jv_none();
            c->line = e->line;
            return jslice(c, &o, &st, &sp, &se);
        }
        jv k = jeval(c, sc, e->b);
        c->line = e->line;
        return jgetitem(c, &o, &k);
    }
    case JN_CALL: {
        jv fn = e->a->kind == JN_ATTR ? ({ jv o = jeval(c, sc, e->a->a); c->line = e->line;
                                           jgetattr(c, &o, e->a->s); })
                                      : jeval(c, sc, e->a);
        jv *args, *kwv;
        eval_args(c, sc, e, &args, &kwv);
        c->line = e->line;
        return jcall(c, sc, &fn, args, e->nv, e->names, kwv, e->nw);
    }
    case JN_FILTER: return apply_filter(c, sc, e, jv_undef(NULL));
    case JN_TEST: {
        jv *args = jalloc(c, (size_t)(e->nv + 1) * sizeof *args);
        args[0] = jeval(c, sc, e->a);
        for (int i = 0; i < e->nv; i++) args[i + 1] = jeval(c, sc, e->v[i]);
        c->line = e->line;
        return jv_bool(jtest(c, sc, e->s, args, e->nv + 1));
    }
    case JN_BIN: {
        jv a = jeval(c, sc, e->a), b = jeval(c, sc, e->b);
        c->line = e->line;
        return jbinop(c, e->op, &a, &b);
    }
    case JN_CMP: {
        jv l = jeval(c, sc, e->a);
        for (int i = 0; i < e->nv; i++) {
            jv r = jeval(c, sc, e->v[i]);
            c->line = e->line;
            if (!jcompare(c, e->ops[i], &l, &r)) return jv_bool(0);
            l = r;
        }
        return jv_bool(1);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        for (int i = 0; i < e->nv; i++) {
            jv x = jeval(c, sc, e->v[i]);
            jv_str_to(c, &b, &x);
        }
        jv s = {.k = JV_STR};
        s.u.s.p = b.p ? b.p : ""; s.u.s.n = b.n;
        return s;
    }
    case JN_NOT: { jv x = jeval(c, sc, e->a); return jv_bool(!jv_truthy(&x)); }
    case JN_NEG: case JN_POS: {
        jv x = jeval(c, sc, e->a);
        c->line = e->line;
        if (x.k == JV_UNDEF) jfail_undef(c, &x);
        if (x.k == JV_FLOAT) return jv_float(e->kind == JN_NEG ? -x.u.f : x.u.f);
        if (x.k == JV_INT || x.k == JV_BOOL) {
            int64_t v = x.k == JV_INT ? x.u.i : x.u.b;
            if (e->kind == JN_POS) return jv_int(v);
            if (v == INT64_MIN) jfail(c, FT_E_RANGE, "integer overflow in unary '-'");
            return jv_int(-v);
        }
        jfail(c, FT_E_INVALID, "bad operand type for unary %c: '%s'", e->kind == JN_NEG ? '-' : '+',
              jv_typename(&x));
    }
    case JN_AND: { jv a = jeval(c, sc, e->a); return jv_truthy(&a) ? jeval(c, sc, e->b) : a; }
    case JN_OR: { jv a = jeval(c, sc, e->a); return jv_truthy(&a) ? a : jeval(c, sc, e->b); }
    case JN_COND: {
        jv t = jeval(c, sc, e->b);
        if (jv_truthy(&t)) return jeval(c, sc, e->a);
        if (e->c) return jeval(c, sc, e->c);
        return jv_undef("the inline if-expression evaluated to false and no else section was defined.");
    }
    default:
        jfail(c, FT_E_INVALID, "cannot evaluate this expression");
    }
}

/* ---- statements ------------------------------------------------------------------------------------ */

static void assign(jctx *c, jscope *sc, const jnode *target, jv val)
{
    if (target->kind == JN_NAME) { scope_set(c, sc, target->s, val); return; }
    if (target->kind == JN_NSREF) {
        jv ns = lookup(c, sc, target->s);
        if (ns.k != JV_NS) jfail(c, FT_E_INVALID, "cannot assign attribute on non-namespace object");
        if (target->s2[0] == '_')
            jfail(c, FT_E_INVALID, "Chat templates cannot store underscore-prefixed attributes on "
                  "a namespace, but got '%s'. Please rename the attribute.", target->s2);
        jdict_set(c, ns.u.d, jv_strz(target->s2), val);
        return;
    }
    /* tuple unpacking */
    jv *items;
    int64_t n;
    if (val.k == JV_UNDEF) jfail_undef(c, &val);
    jiter(c, &val, &items, &n);
    if (n != target->nv)
        jfail(c, FT_E_INVALID, n > target->nv ? "too many values to unpack (expected %d)"
                                              : "not enough values to unpack (expected %d, got %lld)",
              target->nv, (long long)n);
    for (int i = 0; i < target->nv; i++) assign(c, sc, target->v[i], items[i]);
}

static void out_value(jctx *c, const jv *x) { jv_str_to(c, c->cur, x); }

static int exec_for(jctx *c, jscope *sc, const jnode *f)
{
    jv it = jeval(c, sc, f->b);
    c->line = f->line;
    jv *items;
    int64_t n;
    jiter(c, &it, &items, &n);
    if (f->c) {   /* inline filter: `for x in xs if cond` (loop.length counts kept items) */
        jv *kept = jalloc(c, (size_t)(n ? n : 1) * sizeof *kept);
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++) {
            jstep(c);
            jscope *s = scope_new(c, sc);
            assign(c, s, f->a, items[i]);
            jv t = jeval(c, s, f->c);
            if (jv_truthy(&t)) kept[k++] = items[i];
        }
        items = kept; n = k;
    } else if (n) {
        jv *copy = jalloc(c, (size_t)n * sizeof *copy);   /* the body may not change the items */
        memcpy(copy, items, (size_t)n * sizeof *copy);
        items = copy;
    }
    jloop *lp = jalloc(c, sizeof *lp);
    lp->items = items; lp->n = n;
    lp->depth = 1;   /* loop.depth grows only in recursive loops, which are not supported */
    for (int64_t i = 0; i < n; i++) {
        jstep(c);
        jscope *s = scope_new(c, sc);
        lp->i = i;
        jv lv = {.k = JV_LOOP};
        lv.u.loop = lp;
        scope_set(c, s, "loop", lv);
        assign(c, s, f->a, items[i]);
        int fl = exec_body(c, s, f->v, f->nv);
        if (fl == FLOW_BREAK) break;
    }
    if (!n && f->nw) exec_body(c, scope_new(c, sc), f->w, f->nw);
    return FLOW_NORMAL;
}

static int exec_stmt(jctx *c, jscope *sc, const jnode *s)
{
    c->line = s->line;
    switch (s->kind) {
    case JN_TEXT: jbuf_put(c, c->cur, s->s, s->sn); return FLOW_NORMAL;
    case JN_OUT:
        for (int i = 0; i < s->nv; i++) {
            jv x = jeval(c, sc, s->v[i]);
            out_value(c, &x);
        }
        return FLOW_NORMAL;
    case JN_IF: {
        jv t = jeval(c, sc, s->a);
        if (jv_truthy(&t)) return exec_body(c, sc, s->v, s->nv);
        return exec_body(c, sc, s->w, s->nw);
    }
    case JN_FOR: return exec_for(c, sc, s);
    case JN_SET: {
        jv v = jeval(c, sc, s->b);
        c->line = s->line;
        assign(c, sc, s->a, v);
        return FLOW_NORMAL;
    }
    case JN_SETBLOCK: {
        jv v = capture(c, sc, s->v, s->nv);
        v = apply_block_filters(c, sc, s->c, v);
        c->line = s->line;
        assign(c, sc, s->a, v);
        return FLOW_NORMAL;
    }
    case JN_MACRO: {
        jv f = {.k = JV_FUNC};
        f.u.fn = jalloc(c, sizeof *f.u.fn);
        f.u.fn->kind = JF_MACRO;
        f.u.fn->node = s;
        f.u.fn->name = s->s;
        scope_set(c, sc, s->s, f);
        return FLOW_NORMAL;
    }
    case JN_CALLBLOCK: {
        const jnode *call = s->a;
        jv fn = call->a->kind == JN_ATTR ? ({ jv o = jeval(c, sc, call->a->a);
                                             jgetattr(c, &o, call->a->s); })
                                         : jeval(c, sc, call->a);
        jv *args, *kwv;
        eval_args(c, sc, call, &args, &kwv);
        c->line = s->line;
        jv caller = {.k = JV_FUNC};
        caller.u.fn = jalloc(c, sizeof *caller.u.fn);
        caller.u.fn->kind = JF_CALLER;
        caller.u.fn->node = s;
        caller.u.fn->scope = sc;
        jv r;
        if (fn.k == JV_FUNC && fn.u.fn->kind == JF_MACRO)
            r = call_macro(c, fn.u.fn, args, call->nv, call->names, kwv, call->nw, &caller);
        else
            r = jcall(c, sc, &fn, args, call->nv, call->names, kwv, call->nw);
        out_value(c, &r);
        return FLOW_NORMAL;
    }
    case JN_FILTERBLOCK: {
        jv v = capture(c, sc, s->v, s->nv);
        v = apply_block_filters(c, sc, s->a, v);
        out_value(c, &v);
        return FLOW_NORMAL;
    }
    case JN_BREAK: return FLOW_BREAK;
    case JN_CONTINUE: return FLOW_CONTINUE;
    case JN_GEN: {
        size_t start = c->cur->n;
        int fl = exec_body(c, sc, s->v, s->nv);
        size_t len = c->cur->n - start;
        if (c->n_gen == c->cap_gen) {
            int64_t cap = c->cap_gen ? 2 * c->cap_gen : 16;
            ft_jinja_span *g = jalloc(c, (size_t)cap * sizeof *g);
            if (c->n_gen) memcpy(g, c->gen, (size_t)c->n_gen * sizeof *g);
            c->gen = g; c->cap_gen = cap;
        }
        /* transformers: start = length of the main output so far, end = start + len(body) */
        c->gen[c->n_gen].off = c->capture_depth ? c->out.n : start;
        c->gen[c->n_gen++].n = len;
        return fl;
    }
    case JN_WITH: {
        jscope *ws = scope_new(c, sc);
        for (int i = 0; i < s->nnames; i++) scope_set(c, ws, s->names[i], jeval(c, sc, s->w[i]));
        return exec_body(c, ws, s->v, s->nv);
    }
    default:
        jfail(c, FT_E_INVALID, "cannot execute this statement");
    }
}

static int exec_body(jctx *c, jscope *sc, jnode **body, int n)
{
    for (int i = 0; i < n; i++) {
        int fl = exec_stmt(c, sc, body[i]);
        if (fl != FLOW_NORMAL) return fl;
    }
    return FLOW_NORMAL;
}

/* ---- entry point -------------------------------------------------------------------------------- */

int ft_jinja_render(const ft_jinja *t, const cJSON *vars, const ft_jinja_opts *o,
                    ft_jinja_out *out)
{
    memset(out, 0, sizeof *out);
    if (vars && !cJSON_IsObject(vars))
        return ft_err(FT_E_INVALID, "%s: render variables must be a JSON object", t->name);
    jctx *c = calloc(1, sizeof *c);
    if (!c) return -ENOMEM;
    c->t = t;
    if (o) c->o = *o;
    if (!c->o.now) c->o.now = 1721952000;                 /* 26 Jul 2024 00:00 UTC */
    if (c->o.max_output_bytes <= 0) c->o.max_output_bytes = (int64_t)64 << 20;
    if (c->o.max_steps <= 0) c->o.max_steps = 10000000;
    if (c->o.max_mem_bytes <= 0) c->o.max_mem_bytes = (int64_t)512 << 20;
    if (c->o.max_depth <= 0) c->o.max_depth = 100;
    c->a.limit = (size_t)c->o.max_mem_bytes;
    int rc = setjmp(c->jb);
    if (rc) {
        ja_free(&c->a);
        free(c);
        return rc;
    }
    c->line = 1;
    jv v = vars ? jv_from_cjson(c, vars) : jv_dict(c);
    c->vars = v.u.d;
    c->root = scope_new(c, NULL);
    c->cur = &c->out;
    exec_body(c, c->root, t->body, t->nbody);
    out->text = malloc(c->out.n + 1);
    out->gen = c->n_gen ? malloc((size_t)c->n_gen * sizeof *out->gen) : NULL;
    if (!out->text || (c->n_gen && !out->gen)) {
        free(out->text);
        free(out->gen);
        memset(out, 0, sizeof *out);
        ja_free(&c->a);
        free(c);
        return ft_err(-ENOMEM, "%s: out of memory", t->name);
    }
    if (c->out.n) memcpy(out->text, c->out.p, c->out.n);
    out->text[c->out.n] = 0;
    out->n = c->out.n;
    if (c->n_gen) memcpy(out->gen, c->gen, (size_t)c->n_gen * sizeof *out->gen);
    out->n_gen = c->n_gen;
    ja_free(&c->a);
    free(c);
    return 0;
}

void ft_jinja_out_free(ft_jinja_out *o)
{
    if (!o) return;
    free(o->text);
    free(o->gen);
    memset(o, 0, sizeof *o);
}
