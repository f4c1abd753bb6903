/* jinja_internal.h - shared types of the Jinja interpreter (jinja.h): the arena, the value
 * type, tokens, syntax-tree nodes and the render context. Internal to src/template/jinja*.c.
 *
 * Memory: a template's tokens and nodes live in the template's arena; every value made while
 * rendering lives in the render's arena, freed at once when the render ends. Errors inside
 * the lexer, parser and evaluator record a message (ft_err) and longjmp to the public entry
 * point, which frees the arena and returns the code: no partial cleanup paths.
 */
#ifndef FT_JINJA_INTERNAL_H
#define FT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "src/template/jinja.h"

/* ---- arena ---------------------------------------------------------------------------- */

typedef struct jchunk { struct jchunk *next; size_t cap, used; } jchunk;
typedef struct jarena {
    jchunk *head;
    size_t total, limit;     /* bytes taken from malloc; limit 0 = none */
    int over_limit;          /* set when ja_alloc refused for the limit (not malloc) */
} jarena;

/* Returns zeroed memory or NULL (out of memory, or past the limit: then a->over_limit). */
void *ja_alloc(jarena *a, size_t n);
void ja_free(jarena *a);

/* ---- values --------------------------------------------------------------------------- */

enum jv_kind {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR,
    JV_LIST,      /* list or tuple (jlist.tuple) */
    JV_DICT, JV_NS, /* dict (insertion order) / namespace() object: both a jdict */
    JV_FUNC,      /* macro, global function, bound method, caller */
    JV_LOOP,      /* the `loop` object of a for */
};

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
    int k;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;   /* JV_STR; JV_UNDEF: its name or hint */
        jlist *l;
        jdict *d;
        jfunc *fn;
        jloop *loop;
    } u;
} jv;

struct jlist { jv *v; int64_t n, cap; int tuple; };
struct jdict { jv *key, *val; int64_t n, cap; };

typedef struct jnode jnode;
typedef struct jscope jscope;

enum jfunc_kind { JF_MACRO, JF_BUILTIN, JF_METHOD, JF_CALLER, JF_UNSAFE };
struct jfunc {
    int kind;
    const char *name;        /* builtin / method name */
    const jnode *node;       /* JF_MACRO: the macro; JF_CALLER: the call block */
    jscope *scope;           /* JF_CALLER: the scope the call block runs in */
    jv self;                 /* JF_METHOD: the object; JF_CALLER: the macro's caller value */
};

struct jloop { jv *items; int64_t n, i; int depth; };

/* ---- tokens ----------------------------------------------------------------------------- */

enum jtok_kind {
    JT_EOF = 0, JT_TEXT, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP,
};

/* operators (JT_OP's op) */
enum jop {
    JO_ADD = 1, JO_SUB, JO_DIV, JO_FLOORDIV, JO_MUL, JO_MOD, JO_POW, JO_TILDE,
    JO_LBRACKET, JO_RBRACKET, JO_LPAREN, JO_RPAREN, JO_LBRACE, JO_RBRACE,
    JO_EQ, JO_NE, JO_GT, JO_GE, JO_LT, JO_LE, JO_ASSIGN, JO_DOT, JO_COLON, JO_PIPE,
    JO_COMMA, JO_SEMICOLON,
    /* not tokens: compare operators of a JN_CMP, logical */
    JO_IN, JO_NOTIN, JO_AND, JO_OR,
};

typedef struct jtok {
    int kind, op;
    const char *s; size_t n;  /* JT_TEXT/JT_NAME/JT_STRING (decoded): the text */
    int64_t i; double f;
    int line, col;
} jtok;

/* Tokenizes src (already newline-normalised by the caller) into *toks (arena). Errors
 * longjmp through *jb with FT_E_INVALID "NAME:LINE:COL: ...". */
void jlex(jarena *a, jmp_buf *jb, const char *name, const char *src, size_t n, jtok **toks,
          int64_t *n_toks);

/* ---- nodes ------------------------------------------------------------------------------ */

enum jnode_kind {
    /* expressions */
    JN_CONST = 1, JN_NAME, JN_LIST, JN_TUPLE, JN_DICT, JN_ATTR, JN_ITEM, JN_SLICE, JN_CALL,
    JN_FILTER, JN_TEST, JN_BIN, JN_CMP, JN_CONCAT, JN_NOT, JN_NEG, JN_POS, JN_AND, JN_OR,
    JN_COND, JN_NSREF,
    /* statements */
    JN_TEXT, JN_OUT, JN_IF, JN_FOR, JN_SET, JN_SETBLOCK, JN_MACRO, JN_CALLBLOCK,
    JN_FILTERBLOCK, JN_BREAK, JN_CONTINUE, JN_GEN, JN_WITH,
};

struct jnode {
    int kind, op, line, col;
    const char *s, *s2; size_t sn;   /* names, text, filter/test/attr names */
    jv val;                          /* JN_CONST */
    jnode *a, *b, *c, *d;            /* operands (see jinja_parse.c per kind) */
    jnode **v; int nv;               /* items, positional args, body */
    jnode **w; int nw;               /* dict values, keyword values, else body, defaults */
    const char **names; int nnames;  /* keyword names, macro parameters */
    int *ops;                        /* JN_CMP: operator per right operand */
};

struct ft_jinja {
    jarena a;
    char *name;
    jnode **body; int nbody;
};

/* Parses the token list into the template's body. Errors longjmp through *jb. */
void jparse(ft_jinja *t, jmp_buf *jb, jtok *toks, int64_t n_toks);

/* ---- render context ------------------------------------------------------------------- */

typedef struct jbuf { char *p; size_t n, cap; } jbuf;

typedef struct jvar { const char *name; jv val; } jvar;
struct jscope {
    jscope *parent;
    jvar *vars; int n, cap;
};

typedef struct jctx {
    jmp_buf jb;
    jarena a;
    const ft_jinja *t;
    ft_jinja_opts o;
    jbuf out;                /* the main output */
    jbuf *cur;               /* where text goes now (out or a capture) */
    int capture_depth;
    ft_jinja_span *gen; int64_t n_gen, cap_gen;
    int64_t steps;
    int depth;
    int line;                /* line of the node being evaluated (error messages) */
    jdict *vars;             /* the render's variables (from cJSON) */
    jscope *root;            /* the template's top-level scope */
} jctx;

/* Records "NAME:LINE: msg" and longjmps with code. */
__attribute__((noreturn, format(printf, 3, 4)))
void jfail(jctx *c, int code, const char *fmt, ...);
__attribute__((noreturn)) void jnomem(jctx *c);

/* ---- values (jinja_value.c) ------------------------------------------------------------- */

void *jalloc(jctx *c, size_t n);            /* zeroed; fails the render past the limit */
jv jv_none(void);
jv jv_undef(const char *hint);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jctx *c, const char *s, size_t n);  /* copies */
jv jv_strz(const char *s);                    /* borrows a static/arena string */
jv jv_list(jctx *c, int64_t cap);
jv jv_dict(jctx *c);
void jlist_push(jctx *c, jlist *l, jv x);
jv *jdict_get(const jdict *d, jv key);
jv *jdict_getz(const jdict *d, const char *key);
void jdict_set(jctx *c, jdict *d, jv key, jv val);
jv jv_from_cjson(jctx *c, const cJSON *j);

int jv_truthy(const jv *x);
int jv_eq(const jv *a, const jv *b);
/* <0, 0, >0; fails the render for incomparable types (Python's TypeError). */
int jv_cmp(jctx *c, const jv *a, const jv *b);
const char *jv_typename(const jv *x);       /* Python's type names: 'str', 'dict', ... */

void jbuf_put(jctx *c, jbuf *b, const char *s, size_t n);
void jbuf_puts(jctx *c, jbuf *b, const char *s);
void jbuf_putc(jctx *c, jbuf *b, char ch);
/* str(x) / repr(x) as Python writes them. */
void jv_str_to(jctx *c, jbuf *b, const jv *x);
void jv_repr_to(jctx *c, jbuf *b, const jv *x);
jv jv_to_str(jctx *c, const jv *x);
void jfloat_repr(char *dst, size_t cap, double f);  /* Python float repr */

/* json.dumps(x, ensure_ascii, indent (NULL: none), separators (NULL: default), sort_keys) */
void jv_json_to(jctx *c, jbuf *b, const jv *x, int ensure_ascii, const char *indent,
                const char *item_sep, const char *key_sep, int sort_keys, int level);

/* UTF-8 helpers: number of code points; byte offset of code point i (clamped). */
int64_t ju_len(const char *s, size_t n);
size_t ju_off(const char *s, size_t n, int64_t i);
/* Decodes one code point at s[0..n); returns its byte length (>= 1). */
int ju_dec(const char *s, size_t n, uint32_t *cp);
int ju_isspace(uint32_t cp);

/* ---- evaluation (jinja_eval.c) and operators (jinja_ops.c) ------------------------------ */

/* Fails the render with an Undefined's hint ("'x' is undefined"), as jinja2 does when an
 * undefined value is used (attribute, call, arithmetic, ordering). */
__attribute__((noreturn)) void jfail_undef(jctx *c, const jv *u);
jv jslice(jctx *c, const jv *obj, const jv *start, const jv *stop, const jv *step);
/* op: JO_ADD .. JO_POW, JO_TILDE excluded */
jv jbinop(jctx *c, int op, const jv *a, const jv *b);
/* op: JO_EQ .. JO_LE, JO_IN, JO_NOTIN */
int jcompare(jctx *c, int op, const jv *a, const jv *b);

jv jeval(jctx *c, jscope *sc, const jnode *e);
/* Calls a callable value with positional and keyword arguments. */
jv jcall(jctx *c, jscope *sc, const jv *fn, jv *args, int nargs, const char **kwn, jv *kwv,
         int nkw);
jv jgetattr(jctx *c, const jv *obj, const char *name);
jv jgetitem(jctx *c, const jv *obj, const jv *key);
/* Iterates a value as Python's iter() does; items in arena. */
void jiter(jctx *c, const jv *x, jv **items, int64_t *n);
void jstep(jctx *c);                        /* counts one step against max_steps */

/* ---- filters, tests, methods, globals (jinja_filters.c, jinja_tests.c, jinja_methods.c) -- */

/* Applies filter name. args[0] is the filtered value. */
jv jfilter(jctx *c, jscope *sc, const char *name, jv *args, int nargs, const char **kwn,
           jv *kwv, int nkw);
/* Does jinja2 know this filter / test name (supported here or not)? An unknown name fails
 * at parse time outside if-statements and conditional expressions, as in jinja2. */
int jfilter_known(const char *name);
int jtest_known(const char *name);
/* Applies test name; args[0] is the tested value. */
int jtest(jctx *c, jscope *sc, const char *name, jv *args, int nargs);
/* Is `name` a method of this value (str, dict, list)? 1 safe, -1 unsafe (sandbox), 0 no. */
int jmethod_kind(const jv *self, const char *name);
jv jmethod_call(jctx *c, const jv *self, const char *name, jv *args, int nargs,
                const char **kwn, jv *kwv, int nkw);
/* Global functions: 1 and *out if name is one (range, namespace, dict, ...). */
int jglobal_lookup(const char *name, jv *out);
jv jglobal_call(jctx *c, const char *name, jv *args, int nargs, const char **kwn, jv *kwv,
                int nkw);

/* Keyword-or-positional argument i named kw (NULL if absent). */
const jv *jarg(jv *args, int nargs, int i, const char **kwn, jv *kwv, int nkw,
               const char *kw);

/* str helpers shared by filters and methods */
jv jstr_strip(jctx *c, const jv *s, const jv *chars, int left, int right);
jv jstr_case(jctx *c, const jv *s, int mode);   /* 0 lower, 1 upper, 2 title (str.title),
                                                   3 capitalize, 4 jinja title filter */
jv jstr_replace(jctx *c, const jv *s, const jv *old, const jv *new_, int64_t count);
jv jstr_percent(jctx *c, const jv *fmt, const jv *arg);   /* Python's fmt % arg */

#endif
