/* jinja_parse.c - the Jinja parser (jinja.h): tokens -> syntax tree; ft_jinja_parse/free.
 *
 * A recursive-descent parser with jinja2 3.1 parser.py's grammar and precedence:
 *   condexpr (a if c else b) < or < and < not < compare (==, !=, <, <=, >, >=, in, not in)
 *   < + - < ~ < * / // % < ** < unary - + < primary, then postfix (.name, [i], [a:b:c], call)
 *   and filters / tests (x|f(a), x is t a, x is not t) bind to the unary operand.
 * Tags: if/elif/else, for (tuple targets, inline `if`, else), set (name, tuple, ns.attr,
 * block set with filters), macro, call (with caller parameters), filter, with, print,
 * break/continue (loopcontrols), generation (transformers' AssistantTracker), raw (lexer).
 * Node field use per kind:
 *   CONST val | NAME s | LIST/TUPLE v | DICT v keys, w values | ATTR a.s | ITEM a[b]
 *   SLICE b:c:d (inside ITEM.b) | CALL a(v, names=w) | FILTER a|s(v, names=w) (a NULL in
 *   block filters) | TEST a is s(v) | BIN a op b | CMP a (ops[i] v[i])... | CONCAT v |
 *   NOT/NEG/POS a | AND/OR a b | COND a if b else c | NSREF s.s2
 *   TEXT s,sn | OUT a | IF a: v else w | FOR a in b if c: v else w | SET a = b |
 *   SETBLOCK a = (c filter) v | MACRO s(names = w defaults of the last nw): v |
 *   CALLBLOCK a, caller(names = w): v | FILTERBLOCK a: v | GEN v | WITH names = w: v
 */
#include "src/template/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

#define MAX_NEST 200   /* expression and block nesting, so a hostile template cannot
                        * overflow the C stack */

typedef struct parser {
    ft_jinja *t;
    jmp_buf *jb;
    jtok *tok; int64_t nt, i;
    int depth;
    const char *block_stack[MAX_NEST]; int nblock;
} parser;

__attribute__((noreturn, format(printf, 3, 4)))
static void pfail(parser *P, const jtok *at, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ft_err(FT_E_INVALID, "%s:%d:%d: %s", P->t->name, at->line, at->col, msg);
    longjmp(*P->jb, FT_E_INVALID);
}

static void *palloc(parser *P, size_t n)
{
    void *p = ja_alloc(&P->t->a, n);
    if (!p) { ft_err(-ENOMEM, "out of memory"); longjmp(*P->jb, -ENOMEM); }
    return p;
}

static jtok *cur(parser *P) { return &P->tok[P->i]; }
static jtok *peek(parser *P, int k)
{
    int64_t j = P->i + k;
    return &P->tok[j < P->nt ? j : P->nt - 1];
}
static jtok *next(parser *P)
{
    jtok *t = cur(P);
    if (P->i < P->nt - 1) P->i++;
    return t;
}

static int is_op(const jtok *t, int op) { return t->kind == JT_OP && t->op == op; }
static int is_name(const jtok *t, const char *s)
{
    return t->kind == JT_NAME && t->n == strlen(s) && !memcmp(t->s, s, t->n);
}

static const char *describe(const jtok *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_TEXT: return "template data";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: break;
    }
    snprintf(buf, cap, "%.*s", (int)(t->n > 60 ? 60 : t->n), t->s ? t->s : "operator");
    if (t->kind == JT_OP) snprintf(buf, cap, "operator");
    return buf;
}

static void expect_op(parser *P, int op, const char *what)
{
    if (!is_op(cur(P), op)) {
        char b[80];
        pfail(P, cur(P), "expected token '%s', got '%s'", what, describe(cur(P), b, sizeof b));
    }
    next(P);
}

static void expect_kind(parser *P, int kind, const char *what)
{
    if (cur(P)->kind != kind) {
        char b[80];
        pfail(P, cur(P), "expected token '%s', got '%s'", what, describe(cur(P), b, sizeof b));
    }
    next(P);
}

static const char *tok_str(parser *P, const jtok *t)
{
    char *s = palloc(P, t->n + 1);
    memcpy(s, t->s, t->n);
    return s;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->kind != JT_NAME) {
        char b[80];
        pfail(P, cur(P), "expected token 'name', got '%s'", describe(cur(P), b, sizeof b));
    }
    return tok_str(P, next(P));
}

static jnode *node(parser *P, int kind, const jtok *at)
{
    jnode *n = palloc(P, sizeof *n);
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* growable node arrays */
typedef struct nvec { jnode **v; int n, cap; } nvec;
static void nv_push(parser *P, nvec *a, jnode *x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 4;
        jnode **v = palloc(P, (size_t)cap * sizeof *v);
        if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof *v);
        a->v = v; a->cap = cap;
    }
    a->v[a->n++] = x;
}
typedef struct svec { const char **v; int n, cap; } svec;
static void sv_push(parser *P, svec *a, const char *x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 4;
        const char **v = palloc(P, (size_t)cap * sizeof *v);
        if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof *v);
        a->v = v; a->cap = cap;
    }
    a->v[a->n++] = x;
}

static void enter(parser *P)
{
    if (++P->depth > MAX_NEST) pfail(P, cur(P), "expression nested too deeply");
}

static jnode *parse_expression(parser *P, int with_condexpr);
static jnode *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end,
                          int explicit_parens, int with_namespace);
static jnode *parse_primary(parser *P, int with_namespace);
static jnode *parse_postfix(parser *P, jnode *n);
static jnode *parse_filter(parser *P, jnode *n, int start_inline);

static jnode *parse_condexpr(parser *P);
static jnode *parse_or(parser *P);

static jnode *parse_expression(parser *P, int with_condexpr)
{
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

static jnode *parse_condexpr(parser *P)
{
    enter(P);
    jnode *e1 = parse_or(P);
    while (is_name(cur(P), "if")) {
        jnode *n = node(P, JN_COND, next(P));
        n->b = parse_or(P);
        if (is_name(cur(P), "else")) { next(P); n->c = parse_condexpr(P); }
        n->a = e1;
        e1 = n;
    }
    P->depth--;
    return e1;
}

static jnode *parse_and(parser *P);
static jnode *parse_not(parser *P);
static jnode *parse_compare(parser *P);
static jnode *parse_math1(parser *P);
static jnode *parse_concat(parser *P);
static jnode *parse_math2(parser *P);
static jnode *parse_pow(parser *P);
static jnode *parse_unary(parser *P, int with_filter);

static jnode *parse_or(parser *P)
{
    jnode *l = parse_and(P);
    while (is_name(cur(P), "or")) {
        jnode *n = node(P, JN_OR, next(P));
        n->a = l; n->b = parse_and(P);
        l = n;
    }
    return l;
}

static jnode *parse_and(parser *P)
{
    jnode *l = parse_not(P);
    while (is_name(cur(P), "and")) {
        jnode *n = node(P, JN_AND, next(P));
        n->a = l; n->b = parse_not(P);
        l = n;
    }
    return l;
}

static jnode *parse_not(parser *P)
{
    if (is_name(cur(P), "not")) {
        enter(P);
        jnode *n = node(P, JN_NOT, next(P));
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_compare(parser *P)
{
    const jtok *at = cur(P);
    jnode *e = parse_math1(P);
    nvec rhs = {0};
    int ops[64], nops = 0;
    for (;;) {
        jtok *t = cur(P);
        int op = 0;
        if (t->kind == JT_OP && (t->op == JO_EQ || t->op == JO_NE || t->op == JO_LT ||
                                 t->op == JO_LE || t->op == JO_GT || t->op == JO_GE)) {
            op = t->op; next(P);
        } else if (is_name(t, "in")) {
            op = JO_IN; next(P);
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = JO_NOTIN; next(P); next(P);
        } else {
            break;
        }
        if (nops == 64) pfail(P, t, "comparison chain too long");
        ops[nops++] = op;
        nv_push(P, &rhs, parse_math1(P));
    }
    if (!nops) return e;
    jnode *n = node(P, JN_CMP, at);
    n->a = e; n->v = rhs.v; n->nv = rhs.n;
    n->ops = palloc(P, (size_t)nops * sizeof *n->ops);
    memcpy(n->ops, ops, (size_t)nops * sizeof *ops);
    return n;
}

static jnode *parse_math1(parser *P)
{
    jnode *l = parse_concat(P);
    while (is_op(cur(P), JO_ADD) || is_op(cur(P), JO_SUB)) {
        jtok *t = next(P);
        jnode *n = node(P, JN_BIN, t);
        n->op = t->op; n->a = l; n->b = parse_concat(P);
        l = n;
    }
    return l;
}

static jnode *parse_concat(parser *P)
{
    const jtok *at = cur(P);
    jnode *first = parse_math2(P);
    if (!is_op(cur(P), JO_TILDE)) return first;
    nvec args = {0};
    nv_push(P, &args, first);
    while (is_op(cur(P), JO_TILDE)) {
        next(P);
        nv_push(P, &args, parse_math2(P));
    }
    jnode *n = node(P, JN_CONCAT, at);
    n->v = args.v; n->nv = args.n;
    return n;
}

static jnode *parse_math2(parser *P)
{
    jnode *l = parse_pow(P);
    while (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_DIV) || is_op(cur(P), JO_FLOORDIV) ||
           is_op(cur(P), JO_MOD)) {
        jtok *t = next(P);
        jnode *n = node(P, JN_BIN, t);
        n->op = t->op; n->a = l; n->b = parse_pow(P);
        l = n;
    }
    return l;
}

static jnode *parse_pow(parser *P)
{
    jnode *l = parse_unary(P, 1);
    while (is_op(cur(P), JO_POW)) {
        jtok *t = next(P);
        jnode *n = node(P, JN_BIN, t);
        n->op = JO_POW; n->a = l; n->b = parse_unary(P, 1);
        l = n;
    }
    return l;
}

static void parse_call_args(parser *P, jnode *n)
{
    const jtok *at = cur(P);
    expect_op(P, JO_LPAREN, "(");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    int need_comma = 0;
    while (!is_op(cur(P), JO_RPAREN)) {
        if (need_comma) {
            expect_op(P, JO_COMMA, ",");
            if (is_op(cur(P), JO_RPAREN)) break;
        }
        if (is_op(cur(P), JO_MUL) || is_op(cur(P), JO_POW))
            pfail(P, cur(P), "*args and **kwargs in calls are not supported");
        if (cur(P)->kind == JT_NAME && is_op(peek(P, 1), JO_ASSIGN)) {
            sv_push(P, &kwn, tok_str(P, next(P)));
            next(P);
            nv_push(P, &kwv, parse_expression(P, 1));
        } else {
            if (kwn.n) pfail(P, at, "invalid syntax for function call expression");
            nv_push(P, &args, parse_expression(P, 1));
        }
        need_comma = 1;
    }
    expect_op(P, JO_RPAREN, ")");
    n->v = args.v; n->nv = args.n;
    n->w = kwv.v; n->nw = kwv.n;
    n->names = kwn.v; n->nnames = kwn.n;
}

static jnode *parse_call(parser *P, jnode *callee)
{
    jnode *n = node(P, JN_CALL, cur(P));
    n->a = callee;
    parse_call_args(P, n);
    return n;
}

static jnode *parse_filter(parser *P, jnode *x, int start_inline)
{
    while (is_op(cur(P), JO_PIPE) || start_inline) {
        if (!start_inline) next(P);
        const jtok *at = cur(P);
        const char *name = expect_name(P);
        jnode *n = node(P, JN_FILTER, at);
        n->s = name; n->a = x;
        if (is_op(cur(P), JO_LPAREN)) parse_call_args(P, n);
        x = n;
        start_inline = 0;
    }
    return x;
}

static jnode *parse_test(parser *P, jnode *x)
{
    const jtok *at = next(P);  /* "is" */
    int negated = 0;
    if (is_name(cur(P), "not")) { next(P); negated = 1; }
    jnode *n = node(P, JN_TEST, at);
    n->s = expect_name(P);
    n->a = x;
    jtok *t = cur(P);
    if (is_op(t, JO_LPAREN)) {
        parse_call_args(P, n);
    } else if ((t->kind == JT_NAME || t->kind == JT_STRING || t->kind == JT_INT ||
                t->kind == JT_FLOAT || is_op(t, JO_LPAREN) || is_op(t, JO_LBRACKET) ||
                is_op(t, JO_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) pfail(P, t, "You cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P, 0));
        n->v = palloc(P, sizeof *n->v);
        n->v[0] = arg; n->nv = 1;
    }
    if (!negated) return n;
    jnode *no = node(P, JN_NOT, at);
    no->a = n;
    return no;
}

static jnode *parse_filter_expr(parser *P, jnode *x)
{
    for (;;) {
        if (is_op(cur(P), JO_PIPE)) x = parse_filter(P, x, 0);
        else if (is_name(cur(P), "is")) x = parse_test(P, x);
        else if (is_op(cur(P), JO_LPAREN)) x = parse_call(P, x);
        else return x;
    }
}

static jnode *parse_unary(parser *P, int with_filter)
{
    enter(P);
    jtok *t = cur(P);
    jnode *x;
    if (is_op(t, JO_SUB) || is_op(t, JO_ADD)) {
        next(P);
        x = node(P, t->op == JO_SUB ? JN_NEG : JN_POS, t);
        x->a = parse_unary(P, 0);
    } else {
        x = parse_primary(P, 0);
    }
    x = parse_postfix(P, x);
    if (with_filter) x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static jnode *parse_subscribed(parser *P)
{
    const jtok *at = cur(P);
    jnode *parts[3] = {0};
    if (is_op(cur(P), JO_COLON)) {
        next(P);
    } else {
        jnode *e = parse_expression(P, 1);
        if (!is_op(cur(P), JO_COLON)) return e;
        next(P);
        parts[0] = e;
    }
    if (!is_op(cur(P), JO_COLON) && !is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA))
        parts[1] = parse_expression(P, 1);
    if (is_op(cur(P), JO_COLON)) {
        next(P);
        if (!is_op(cur(P), JO_RBRACKET) && !is_op(cur(P), JO_COMMA))
            parts[2] = parse_expression(P, 1);
    }
    jnode *n = node(P, JN_SLICE, at);
    n->b = parts[0]; n->c = parts[1]; n->d = parts[2];
    return n;
}

static jnode *parse_postfix(parser *P, jnode *x)
{
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, JO_DOT)) {
            next(P);
            jtok *a = cur(P);
            if (a->kind == JT_NAME) {
                next(P);
                jnode *n = node(P, JN_ATTR, t);
                n->a = x; n->s = tok_str(P, a);
                x = n;
            } else if (a->kind == JT_INT) {
                next(P);
                jnode *k = node(P, JN_CONST, a);
                k->val = jv_int(a->i);
                jnode *n = node(P, JN_ITEM, t);
                n->a = x; n->b = k;
                x = n;
            } else {
                pfail(P, a, "expected name or number");
            }
        } else if (is_op(t, JO_LBRACKET)) {
            next(P);
            nvec args = {0};
            while (!is_op(cur(P), JO_RBRACKET)) {
                if (args.n) expect_op(P, JO_COMMA, ",");
                nv_push(P, &args, parse_subscribed(P));
            }
            expect_op(P, JO_RBRACKET, "]");
            if (!args.n) pfail(P, t, "expected subscript expression");
            jnode *n = node(P, JN_ITEM, t);
            n->a = x;
            if (args.n == 1) {
                n->b = args.v[0];
            } else {
                jnode *tu = node(P, JN_TUPLE, t);
                tu->v = args.v; tu->nv = args.n;
                n->b = tu;
            }
            x = n;
        } else if (is_op(t, JO_LPAREN)) {
            x = parse_call(P, x);
        } else {
            return x;
        }
    }
}

static jnode *parse_primary(parser *P, int with_namespace)
{
    jtok *t = cur(P);
    jnode *n;
    if (t->kind == JT_NAME) {
        next(P);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
            is_name(t, "False")) {
            n = node(P, JN_CONST, t);
            n->val = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n = node(P, JN_CONST, t);
            n->val = jv_none();
        } else if (with_namespace && is_op(cur(P), JO_DOT)) {
            next(P);
            n = node(P, JN_NSREF, t);
            n->s = tok_str(P, t);
            n->s2 = expect_name(P);
        } else {
            n = node(P, JN_NAME, t);
            n->s = tok_str(P, t);
        }
    } else if (t->kind == JT_STRING) {
        next(P);
        size_t len = t->n;
        for (int64_t j = P->i; P->tok[j].kind == JT_STRING; j++) len += P->tok[j].n;
        char *s = palloc(P, len + 1);
        memcpy(s, t->s, t->n);
        size_t o = t->n;
        while (cur(P)->kind == JT_STRING) {
            jtok *u = next(P);
            memcpy(s + o, u->s, u->n);
            o += u->n;
        }
        n = node(P, JN_CONST, t);
        n->val.k = JV_STR; n->val.u.s.p = s; n->val.u.s.n = len;
    } else if (t->kind == JT_INT || t->kind == JT_FLOAT) {
        next(P);
        n = node(P, JN_CONST, t);
        n->val = t->kind == JT_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (is_op(t, JO_LPAREN)) {
        next(P);
        enter(P);
        n = parse_tuple(P, 0, 1, NULL, 1, 0);
        P->depth--;
        expect_op(P, JO_RPAREN, ")");
    } else if (is_op(t, JO_LBRACKET)) {
        next(P);
        enter(P);
        nvec items = {0};
        while (!is_op(cur(P), JO_RBRACKET)) {
            if (items.n) expect_op(P, JO_COMMA, ",");
            if (is_op(cur(P), JO_RBRACKET)) break;
            nv_push(P, &items, parse_expression(P, 1));
        }
        expect_op(P, JO_RBRACKET, "]");
        P->depth--;
        n = node(P, JN_LIST, t);
        n->v = items.v; n->nv = items.n;
    } else if (is_op(t, JO_LBRACE)) {
        next(P);
        enter(P);
        nvec keys = {0}, vals = {0};
        while (!is_op(cur(P), JO_RBRACE)) {
            if (keys.n) expect_op(P, JO_COMMA, ",");
            if (is_op(cur(P), JO_RBRACE)) break;
            nv_push(P, &keys, parse_expression(P, 1));
            expect_op(P, JO_COLON, ":");
            nv_push(P, &vals, parse_expression(P, 1));
        }
        expect_op(P, JO_RBRACE, "}");
        P->depth--;
        n = node(P, JN_DICT, t);
        n->v = keys.v; n->nv = keys.n; n->w = vals.v; n->nw = vals.n;
    } else {
        char b[80];
        pfail(P, t, "unexpected '%s'", describe(t, b, sizeof b));
    }
    return n;
}

static int is_tuple_end(parser *P, const char *extra_end)
{
    jtok *t = cur(P);
    if (t->kind == JT_VAR_END || t->kind == JT_BLOCK_END || is_op(t, JO_RPAREN)) return 1;
    return extra_end && is_name(t, extra_end);
}

static jnode *parse_tuple(parser *P, int simplified, int with_condexpr, const char *extra_end,
                          int explicit_parens, int with_namespace)
{
    const jtok *at = cur(P);
    nvec args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n) expect_op(P, JO_COMMA, ",");
        if (is_tuple_end(P, extra_end)) break;
        nv_push(P, &args, simplified ? parse_primary(P, with_namespace)
                                     : parse_expression(P, with_condexpr));
        if (is_op(cur(P), JO_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char b[80];
            pfail(P, cur(P), "Expected an expression, got '%s'", describe(cur(P), b, sizeof b));
        }
    }
    jnode *n = node(P, JN_TUPLE, at);
    n->v = args.v; n->nv = args.n;
    return n;
}

/* ---- statements ---------------------------------------------------------------------- */

static void subparse(parser *P, nvec *body, const char *const *end);

static void parse_statements(parser *P, nvec *body, const char *const *end, int drop_needle)
{
    if (is_op(cur(P), JO_COLON)) next(P);
    expect_kind(P, JT_BLOCK_END, "end of statement block");
    subparse(P, body, end);
    if (cur(P)->kind == JT_EOF) {
        char want[256] = "";
        for (int k = 0; end[k]; k++) {
            size_t l = strlen(want);
            snprintf(want + l, sizeof want - l, "%s'%s'", k ? " or " : "", end[k]);
        }
        pfail(P, cur(P), "Unexpected end of template. Jinja was looking for the following "
              "tags: %s. The innermost block that needs to be closed is '%s'.", want,
              P->nblock ? P->block_stack[P->nblock - 1] : "?");
    }
    if (drop_needle) next(P);
}

/* jinja2's can_assign: names, namespace attributes (set only) and tuples of them */
static void check_target(parser *P, const jnode *t)
{
    if (t->kind == JN_NAME || t->kind == JN_NSREF) return;
    if (t->kind == JN_TUPLE) {
        for (int k = 0; k < t->nv; k++)
            if (t->v[k]->kind != JN_NAME && t->v[k]->kind != JN_NSREF)
                pfail(P, cur(P), "can't assign to 'tuple'");
        return;
    }
    pfail(P, cur(P), "can't assign to '%s'", t->kind == JN_CONST ? "const" : "expression");
}

static void parse_signature(parser *P, jnode *n)
{
    svec names = {0};
    nvec defs = {0};
    expect_op(P, JO_LPAREN, "(");
    while (!is_op(cur(P), JO_RPAREN)) {
        if (names.n) expect_op(P, JO_COMMA, ",");
        sv_push(P, &names, expect_name(P));
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            nv_push(P, &defs, parse_expression(P, 1));
        } else if (defs.n) {
            pfail(P, cur(P), "non-default argument follows default argument");
        }
    }
    expect_op(P, JO_RPAREN, ")");
    n->names = names.v; n->nnames = names.n;
    n->w = defs.v; n->nw = defs.n;
}

static jnode *parse_statement(parser *P)
{
    static const char *const END_FOR[] = {"endfor", "else", NULL};
    static const char *const END_FOR2[] = {"endfor", NULL};
    static const char *const END_IF[] = {"elif", "else", "endif", NULL};
    static const char *const END_IF2[] = {"endif", NULL};
    static const char *const END_SET[] = {"endset", NULL};
    static const char *const END_MACRO[] = {"endmacro", NULL};
    static const char *const END_CALL[] = {"endcall", NULL};
    static const char *const END_FILTER[] = {"endfilter", NULL};
    static const char *const END_GEN[] = {"endgeneration", NULL};
    static const char *const END_WITH[] = {"endwith", NULL};
    jtok *t = cur(P);
    if (t->kind != JT_NAME) pfail(P, t, "tag name expected");
    if (P->nblock == MAX_NEST) pfail(P, t, "blocks nested too deeply");
    P->block_stack[P->nblock++] = tok_str(P, t);
    jnode *n = NULL;
    nvec body = {0}, els = {0};
    if (is_name(t, "if")) {
        n = node(P, JN_IF, next(P));
        jnode *cur_if = n;
        for (;;) {
            cur_if->a = parse_tuple(P, 0, 0, NULL, 0, 0);
            nvec b = {0};
            parse_statements(P, &b, END_IF, 0);
            cur_if->v = b.v; cur_if->nv = b.n;
            jtok *e = next(P);
            if (is_name(e, "elif")) {
                jnode *sub = node(P, JN_IF, e);
                cur_if->w = palloc(P, sizeof *cur_if->w);
                cur_if->w[0] = sub; cur_if->nw = 1;
                cur_if = sub;
                continue;
            }
            if (is_name(e, "else")) {
                nvec eb = {0};
                parse_statements(P, &eb, END_IF2, 1);
                cur_if->w = eb.v; cur_if->nw = eb.n;
            }
            break;
        }
    } else if (is_name(t, "for")) {
        n = node(P, JN_FOR, next(P));
        n->a = parse_tuple(P, 1, 1, "in", 0, 0);
        check_target(P, n->a);
        if (!is_name(cur(P), "in")) pfail(P, cur(P), "expected token 'in'");
        next(P);
        n->b = parse_tuple(P, 0, 0, "recursive", 0, 0);
        if (is_name(cur(P), "if")) { next(P); n->c = parse_expression(P, 1); }
        if (is_name(cur(P), "recursive")) pfail(P, cur(P), "recursive for loops are not supported");
        parse_statements(P, &body, END_FOR, 0);
        if (is_name(next(P), "else")) parse_statements(P, &els, END_FOR2, 1);
        n->v = body.v; n->nv = body.n; n->w = els.v; n->nw = els.n;
    } else if (is_name(t, "set")) {
        const jtok *at = next(P);
        jnode *target = parse_tuple(P, 1, 1, NULL, 0, 1);
        check_target(P, target);
        if (is_op(cur(P), JO_ASSIGN)) {
            next(P);
            n = node(P, JN_SET, at);
            n->a = target;
            n->b = parse_tuple(P, 0, 1, NULL, 0, 0);
        } else {
            n = node(P, JN_SETBLOCK, at);
            n->a = target;
            n->c = parse_filter(P, NULL, 0);
            parse_statements(P, &body, END_SET, 1);
            n->v = body.v; n->nv = body.n;
        }
    } else if (is_name(t, "macro")) {
        n = node(P, JN_MACRO, next(P));
        n->s = expect_name(P);
        parse_signature(P, n);
        parse_statements(P, &body, END_MACRO, 1);
        n->v = body.v; n->nv = body.n;
    } else if (is_name(t, "call")) {
        n = node(P, JN_CALLBLOCK, next(P));
        if (is_op(cur(P), JO_LPAREN)) parse_signature(P, n);
        n->a = parse_expression(P, 1);
        if (n->a->kind != JN_CALL) pfail(P, t, "expected call");
        parse_statements(P, &body, END_CALL, 1);
        n->v = body.v; n->nv = body.n;
    } else if (is_name(t, "filter")) {
        n = node(P, JN_FILTERBLOCK, next(P));
        n->a = parse_filter(P, NULL, 1);
        parse_statements(P, &body, END_FILTER, 1);
        n->v = body.v; n->nv = body.n;
    } else if (is_name(t, "with")) {
        n = node(P, JN_WITH, next(P));
        svec names = {0};
        nvec vals = {0};
        while (cur(P)->kind != JT_BLOCK_END) {
            if (names.n) expect_op(P, JO_COMMA, ",");
            sv_push(P, &names, expect_name(P));
            expect_op(P, JO_ASSIGN, "=");
            nv_push(P, &vals, parse_expression(P, 1));
        }
        parse_statements(P, &body, END_WITH, 1);
        n->names = names.v; n->nnames = names.n; n->w = vals.v; n->nw = vals.n;
        n->v = body.v; n->nv = body.n;
    } else if (is_name(t, "print")) {
        n = node(P, JN_OUT, next(P));
        nvec items = {0};
        while (cur(P)->kind != JT_BLOCK_END) {
            if (items.n) expect_op(P, JO_COMMA, ",");
            nv_push(P, &items, parse_expression(P, 1));
        }
        n->v = items.v; n->nv = items.n;
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        int in_loop = 0;
        for (int k = P->nblock - 2; k >= 0; k--) {
            if (!strcmp(P->block_stack[k], "for")) { in_loop = 1; break; }
            if (!strcmp(P->block_stack[k], "macro") || !strcmp(P->block_stack[k], "call")) break;
        }
        if (!in_loop) pfail(P, t, "'%s' must be inside a for loop", t->s[0] == 'b' ? "break" : "continue");
        n = node(P, t->s[0] == 'b' ? JN_BREAK : JN_CONTINUE, next(P));
    } else if (is_name(t, "generation")) {
        n = node(P, JN_GEN, next(P));
        parse_statements(P, &body, END_GEN, 1);
        n->v = body.v; n->nv = body.n;
    } else if (is_name(t, "block") || is_name(t, "extends") || is_name(t, "include") ||
               is_name(t, "import") || is_name(t, "from") || is_name(t, "autoescape")) {
        pfail(P, t, "tag '%.*s' is not supported", (int)t->n, t->s);
    } else {
        pfail(P, t, "Encountered unknown tag '%.*s'.", (int)(t->n > 60 ? 60 : t->n), t->s);
    }
    P->nblock--;
    return n;
}

static void subparse(parser *P, nvec *body, const char *const *end)
{
    for (;;) {
        jtok *t = cur(P);
        if (t->kind == JT_EOF) return;
        if (t->kind == JT_TEXT) {
            jnode *n = node(P, JN_TEXT, t);
            n->s = t->s; n->sn = t->n;
            nv_push(P, body, n);
            next(P);
        } else if (t->kind == JT_VAR_BEGIN) {
            next(P);
            jnode *n = node(P, JN_OUT, t);
            jnode *e = parse_tuple(P, 0, 1, NULL, 0, 0);
            n->v = palloc(P, sizeof *n->v);
            n->v[0] = e; n->nv = 1;
            expect_kind(P, JT_VAR_END, "end of print statement");
            nv_push(P, body, n);
        } else if (t->kind == JT_BLOCK_BEGIN) {
            next(P);
            if (end) {
                for (int k = 0; end[k]; k++)
                    if (is_name(cur(P), end[k])) return;
            }
            nv_push(P, body, parse_statement(P));
            expect_kind(P, JT_BLOCK_END, "end of statement block");
        } else {
            char b[80];
            pfail(P, t, "unexpected '%s'", describe(t, b, sizeof b));
        }
    }
}

/* jinja2's compiler rejects an unknown filter or test name unless it sits in a "soft" frame:
 * an if-statement's test or bodies, or a conditional expression (compiler.py
 * _filter_test_common); loops, macros, call/set/filter blocks open hard frames again. */
static void check_names(parser *P, const jnode *n, int soft, int depth)
{
    if (!n) return;
    if (depth > 4 * MAX_NEST) {
        jtok at = {.line = n->line, .col = n->col};
        pfail(P, &at, "template nested too deeply");
    }
    if ((n->kind == JN_FILTER && !jfilter_known(n->s)) || (n->kind == JN_TEST && !jtest_known(n->s))) {
        if (!soft) {
            jtok at = {.line = n->line, .col = n->col};
            pfail(P, &at, "No %s named '%s'.", n->kind == JN_FILTER ? "filter" : "test", n->s);
        }
    }
    int kid_soft = soft, body_soft = soft;
    switch (n->kind) {
    case JN_IF: case JN_COND: kid_soft = body_soft = 1; break;
    case JN_FOR: body_soft = 0; break;
    case JN_MACRO: case JN_CALLBLOCK: case JN_SETBLOCK: case JN_FILTERBLOCK: case JN_WITH:
    case JN_GEN: body_soft = 0; break;
    default: break;
    }
    check_names(P, n->a, kid_soft, depth + 1);
    check_names(P, n->b, kid_soft, depth + 1);
    check_names(P, n->c, n->kind == JN_FOR ? 0 : kid_soft, depth + 1);
    check_names(P, n->d, kid_soft, depth + 1);
    int stmt = n->kind >= JN_TEXT;
    for (int i = 0; i < n->nv; i++) check_names(P, n->v[i], stmt ? body_soft : kid_soft, depth + 1);
    for (int i = 0; i < n->nw; i++) check_names(P, n->w[i], stmt ? body_soft : kid_soft, depth + 1);
}

void jparse(ft_jinja *t, jmp_buf *jb, jtok *toks, int64_t n_toks)
{
    parser P = {.t = t, .jb = jb, .tok = toks, .nt = n_toks};
    nvec body = {0};
    subparse(&P, &body, NULL);
    t->body = body.v;
    t->nbody = body.n;
    for (int i = 0; i < body.n; i++) check_names(&P, body.v[i], 0, 0);
}

int ft_jinja_parse(ft_jinja **out, const char *src, size_t n, const char *name)
{
    *out = NULL;
    ft_jinja *t = calloc(1, sizeof *t);
    if (!t) return -ENOMEM;
    t->name = strdup(name ? name : "template");
    if (!t->name) { free(t); return -ENOMEM; }
    jmp_buf jb;
    int rc = setjmp(jb);
    if (rc) {
        ft_jinja_free(t);
        return rc;
    }
    /* newline normalisation and keep_trailing_newline=False (lexer.py tokeniter) */
    char *s = ja_alloc(&t->a, n + 1);
    if (!s) { ft_err(-ENOMEM, "out of memory"); longjmp(jb, -ENOMEM); }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else {
            s[m++] = src[i];
        }
    }
    if (m && s[m - 1] == '\n') m--;
    s[m] = 0;
    jtok *toks;
    int64_t nt;
    jlex(&t->a, &jb, t->name, s, m, &toks, &nt);
    jparse(t, &jb, toks, nt);
    *out = t;
    return 0;
}

void ft_jinja_free(ft_jinja *t)
{
    if (!t) return;
    ja_free(&t->a);
    free(t->name);
    free(t);
}
