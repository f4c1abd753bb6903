/* jinja_lex.c - the Jinja lexer (jinja.h): template source -> tokens.
 *
 * Follows jinja2 3.1 lexer.py with transformers' settings (trim_blocks, lstrip_blocks):
 * - text up to the first "{{", "{%" or "{#"; a "-" after the opening delimiter strips all
 *   whitespace before it; otherwise, for "{%" and "{#" (not "{{") and no "+", spaces and tabs
 *   between the line start and the tag are dropped (lstrip_blocks);
 * - "-%}", "-#}" and "-}}" strip all whitespace after the tag; "%}" and "#}" drop one "\n"
 *   after them (trim_blocks) unless written "+%}";
 * - {% raw %}...{% endraw %} is text; comments are dropped;
 * - inside a tag: names, strings (Python escapes), ints (0x/0o/0b, "_"), floats, operators;
 *   an end delimiter inside open brackets is read as operators, as jinja2's balancing stack.
 * The source given is already newline-normalised ("\r\n", "\r" -> "\n"; see jinja_parse.c).
 */
#include "src/template/jinja_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/utf8.h"

typedef struct lexer {
    jarena *a;
    jmp_buf *jb;
    const char *name, *src;
    size_t n, pos;
    jtok *t; int64_t nt, cap;
    size_t line_pos; int line;   /* line number cache: line of byte line_pos */
    char bal[256]; int nbal;
} lexer;

__attribute__((noreturn, format(printf, 3, 4)))
static void lfail(lexer *L, size_t at, const char *fmt, ...)
{
    /* line and column of byte `at` */
    int line = 1; size_t ls = 0;
    for (size_t i = 0; i < at && i < L->n; i++)
        if (L->src[i] == '\n') { line++; ls = i + 1; }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ft_err(FT_E_INVALID, "%s:%d:%d: %s", L->name, line, (int)(at - ls) + 1, msg);
    longjmp(*L->jb, FT_E_INVALID);
}

static int line_of(lexer *L, size_t at, int *col)
{
    if (at < L->line_pos) { L->line_pos = 0; L->line = 1; }
    for (size_t i = L->line_pos; i < at; i++)
        if (L->src[i] == '\n') L->line++;
    L->line_pos = at;
    size_t ls = at;
    while (ls > 0 && L->src[ls - 1] != '\n') ls--;
    *col = (int)(at - ls) + 1;
    return L->line;
}

static jtok *push(lexer *L, int kind, size_t at)
{
    if (L->nt == L->cap) {
        int64_t cap = L->cap ? 2 * L->cap : 256;
        jtok *t = ja_alloc(L->a, (size_t)cap * sizeof *t);
        if (!t) { ft_err(-ENOMEM, "out of memory"); longjmp(*L->jb, -ENOMEM); }
        if (L->nt) memcpy(t, L->t, (size_t)L->nt * sizeof *t);
        L->t = t; L->cap = cap;
    }
    jtok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line_of(L, at, &t->col);
    return t;
}

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Length of the whitespace code point ending at s[0..n) (0 if none): Python's str.isspace. */
static size_t ws_before(const char *s, size_t n)
{
    if (!n) return 0;
    unsigned char ch = (unsigned char)s[n - 1];
    if (ch < 0x80) return (is_ws((char)ch) || (ch >= 0x1c && ch <= 0x1f)) ? 1 : 0;
    size_t k = n - 1;
    while (k > 0 && n - k < 4 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    int len = ju_dec(s + k, n - k, &cp);
    return ((size_t)len == n - k && ju_isspace(cp)) ? n - k : 0;
}

static size_t ws_after(const char *s, size_t n)
{
    if (!n) return 0;
    unsigned char ch = (unsigned char)s[0];
    if (ch < 0x80) return (is_ws((char)ch) || (ch >= 0x1c && ch <= 0x1f)) ? 1 : 0;
    uint32_t cp;
    int len = ju_dec(s, n, &cp);
    return ju_isspace(cp) ? (size_t)len : 0;
}

static size_t rstrip_len(const char *s, size_t n)
{
    size_t k;
    while ((k = ws_before(s, n)) > 0) n -= k;
    return n;
}

static size_t skip_ws(const char *s, size_t n, size_t p)
{
    size_t k;
    while (p < n && (k = ws_after(s + p, n - p)) > 0) p += k;
    return p;
}

/* Text src[from..to) before a tag at `to` whose sign is `sign` ('-', '+' or 0); lstrip:
 * the tag is a block or comment. Emits the (stripped) text token. */
static void emit_text(lexer *L, size_t from, size_t to, char sign, int lstrip)
{
    const char *s = L->src + from;
    size_t n = to - from;
    if (sign == '-') {
        n = rstrip_len(s, n);
    } else if (sign != '+' && lstrip) {
        size_t lp = n;
        while (lp > 0 && s[lp - 1] != '\n') lp--;
        int line_starting = from == 0 || L->src[from - 1] == '\n';
        if ((lp > 0 || line_starting) && lp < n) {
            /* whitespace_re.fullmatch(text, l_pos): \s+ to the end */
            size_t e = skip_ws(s, n, lp);
            if (e == n) n = lp;
        }
    }
    if (n) {
        jtok *t = push(L, JT_TEXT, from);
        t->s = s; t->n = n;
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decodes the body of a string literal (Python "unicode-escape" on the source text). */
static void lex_string(lexer *L, size_t start, size_t end, jtok *t)
{
    const char *s = L->src + start;
    size_t n = end - start;
    char *o = ja_alloc(L->a, n + 1);
    if (!o) { ft_err(-ENOMEM, "out of memory"); longjmp(*L->jb, -ENOMEM); }
    size_t on = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[on++] = s[i]; continue; }
        char e = s[++i];
        switch (e) {
        case '\n': break;
        case '\\': o[on++] = '\\'; break;
        case '\'': o[on++] = '\''; break;
        case '"': o[on++] = '"'; break;
        case 'a': o[on++] = '\a'; break;
        case 'b': o[on++] = '\b'; break;
        case 'f': o[on++] = '\f'; break;
        case 'n': o[on++] = '\n'; break;
        case 'r': o[on++] = '\r'; break;
        case 't': o[on++] = '\t'; break;
        case 'v': o[on++] = '\v'; break;
        case 'x': case 'u': case 'U': {
            int want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < want; k++) {
                int h = i + 1 + (size_t)k < n ? hexval(s[i + 1 + k]) : -1;
                if (h < 0)
                    lfail(L, start + i - 1, "(unicode error) 'unicodeescape' codec can't decode "
                          "bytes: truncated \\%c escape", e);
                cp = cp * 16 + (uint32_t)h;
            }
            if (cp > 0x10FFFF)
                lfail(L, start + i - 1, "illegal Unicode character in string literal");
            i += (size_t)want;
            /* 6 >= 4 output bytes for a >= 4 byte escape; \xhh (4 bytes) -> <= 2 bytes */
            on += (size_t)ft_utf8_encode(cp, o + on);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[++i] - '0');
                on += (size_t)ft_utf8_encode(cp, o + on);   /* <= 0777: 2 bytes for >= 2 source bytes */
            } else {
                o[on++] = '\\';     /* unknown escape: kept (Python's DeprecationWarning) */
                o[on++] = e;
            }
        }
    }
    o[on] = 0;
    t->s = o; t->n = on;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_name0(char ch) { return ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }
static int is_name(char ch) { return is_name0(ch) || is_digit(ch); }

/* digits with single "_" separators: (\d+_)*\d+ ; returns end or p if none */
static size_t digits(const char *s, size_t n, size_t p)
{
    size_t q = p;
    if (q >= n || !is_digit(s[q])) return p;
    while (q < n) {
        if (is_digit(s[q])) q++;
        else if (s[q] == '_' && q + 1 < n && is_digit(s[q + 1])) q++;
        else break;
    }
    return q;
}

static int lex_number(lexer *L, size_t p, size_t *endp)
{
    const char *s = L->src;
    size_t n = L->n;
    /* float: (\d+_)*\d+ ((\.(\d+_)*\d+)? e[+-]? (\d+_)*\d+ | \.(\d+_)*\d+) */
    size_t q = digits(s, n, p), fe = 0;
    if (p > 0 && s[p - 1] == '.') q = p;  /* (?<!\.) */
    if (q > p) {
        size_t r = q;
        int frac = 0;
        if (r < n && s[r] == '.') {
            size_t r2 = digits(s, n, r + 1);
            if (r2 > r + 1) { r = r2; frac = 1; }
        }
        if (r < n && (s[r] == 'e' || s[r] == 'E')) {
            size_t r2 = r + 1;
            if (r2 < n && (s[r2] == '+' || s[r2] == '-')) r2++;
            size_t r3 = digits(s, n, r2);
            if (r3 > r2) fe = r3;
        }
        if (!fe && frac) fe = r;
    }
    char buf[128];
    if (fe) {
        size_t k = 0;
        for (size_t i = p; i < fe && k + 1 < sizeof buf; i++)
            if (s[i] != '_') buf[k++] = s[i];
        buf[k] = 0;
        jtok *t = push(L, JT_FLOAT, p);
        t->f = strtod(buf, NULL);
        *endp = fe;
        return 1;
    }
    /* integer: 0b / 0o / 0x / [1-9](_?\d)* / 0(_?0)* */
    if (!is_digit(s[p])) return 0;
    int base = 10;
    size_t r = p;
    if (s[p] == '0' && p + 1 < n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
        char b = (char)(s[p + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        r = p + 2;
        size_t st = r;
        while (r < n) {
            size_t rr = r;
            if (s[rr] == '_') rr++;
            int h = rr < n ? hexval(s[rr]) : -1;
            if (h < 0 || h >= base) break;
            r = rr + 1;
        }
        if (r == st) base = 10, r = p + 1;   /* "0" then a name */
    } else if (s[p] == '0') {
        r = p + 1;
        while (r < n && (s[r] == '0' || (s[r] == '_' && r + 1 < n && s[r + 1] == '0'))) r++;
    } else {
        r = p + 1;
        while (r < n && (is_digit(s[r]) || (s[r] == '_' && r + 1 < n && is_digit(s[r + 1])))) r++;
    }
    uint64_t v = 0;
    int over = 0;
    for (size_t i = (base == 10 ? p : p + 2); i < r; i++) {
        if (s[i] == '_') continue;
        int h = hexval(s[i]);
        if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base) over = 1;
        v = v * (uint64_t)base + (uint64_t)h;
    }
    if (over || v > (uint64_t)INT64_MAX) lfail(L, p, "integer literal too large");
    jtok *t = push(L, JT_INT, p);
    t->i = (int64_t)v;
    *endp = r;
    return 1;
}

static const struct { const char *s; int op; } OPS[] = {
    {"//", JO_FLOORDIV}, {"**", JO_POW}, {"==", JO_EQ}, {"!=", JO_NE}, {">=", JO_GE},
    {"<=", JO_LE}, {"+", JO_ADD}, {"-", JO_SUB}, {"/", JO_DIV}, {"*", JO_MUL}, {"%", JO_MOD},
    {"~", JO_TILDE}, {"[", JO_LBRACKET}, {"]", JO_RBRACKET}, {"(", JO_LPAREN},
    {")", JO_RPAREN}, {"{", JO_LBRACE}, {"}", JO_RBRACE}, {">", JO_GT}, {"<", JO_LT},
    {"=", JO_ASSIGN}, {".", JO_DOT}, {":", JO_COLON}, {"|", JO_PIPE}, {",", JO_COMMA},
    {";", JO_SEMICOLON},
};

/* Lexes the inside of a {{ }} (block=0) or {% %} (block=1) tag from L->pos to its end. */
static void lex_tag(lexer *L, int block, size_t tag_start)
{
    const char *s = L->src;
    size_t n = L->n;
    L->nbal = 0;
    for (;;) {
        size_t p = L->pos;
        if (p >= n)
            lfail(L, tag_start, "unexpected end of template, expected '%s'",
                  block ? "end of statement block" : "end of print statement");
        if (L->nbal == 0) {
            if (block) {
                if (s[p] == '+' && p + 2 < n + 0 && s[p + 1] == '%' && s[p + 2] == '}') {
                    push(L, JT_BLOCK_END, p);
                    L->pos = p + 3;
                    return;
                }
                if (s[p] == '-' && p + 2 < n && s[p + 1] == '%' && s[p + 2] == '}') {
                    push(L, JT_BLOCK_END, p);
                    L->pos = skip_ws(s, n, p + 3);
                    return;
                }
                if (s[p] == '%' && p + 1 < n && s[p + 1] == '}') {
                    push(L, JT_BLOCK_END, p);
                    L->pos = p + 2 + (p + 2 < n && s[p + 2] == '\n');
                    return;
                }
            } else {
                if (s[p] == '-' && p + 2 < n && s[p + 1] == '}' && s[p + 2] == '}') {
                    push(L, JT_VAR_END, p);
                    L->pos = skip_ws(s, n, p + 3);
                    return;
                }
                if (s[p] == '}' && p + 1 < n && s[p + 1] == '}') {
                    push(L, JT_VAR_END, p);
                    L->pos = p + 2;
                    return;
                }
            }
        }
        size_t q = skip_ws(s, n, p);
        if (q > p) { L->pos = q; continue; }
        size_t e;
        if (is_digit(s[p]) && lex_number(L, p, &e)) { L->pos = e; continue; }
        if (is_name0(s[p])) {
            e = p + 1;
            while (e < n && is_name(s[e])) e++;
            jtok *t = push(L, JT_NAME, p);
            t->s = s + p; t->n = e - p;
            L->pos = e;
            continue;
        }
        if (s[p] == '\'' || s[p] == '"') {
            char qch = s[p];
            e = p + 1;
            while (e < n && s[e] != qch) e += (s[e] == '\\' && e + 1 < n) ? 2 : 1;
            if (e >= n) lfail(L, p, "unexpected char %s at %zu", qch == '"' ? "'\"'" : "\"'\"", p);
            jtok *t = push(L, JT_STRING, p);
            lex_string(L, p + 1, e, t);
            L->pos = e + 1;
            continue;
        }
        int op = 0; size_t ol = 0;
        for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++) {
            size_t l = strlen(OPS[k].s);
            if (p + l <= n && !memcmp(s + p, OPS[k].s, l)) { op = OPS[k].op; ol = l; break; }
        }
        if (!op) {
            if ((unsigned char)s[p] >= 0x80) lfail(L, p, "unexpected char at %zu", p);
            lfail(L, p, "unexpected char '%c' at %zu", s[p], p);
        }
        if (op == JO_LPAREN || op == JO_LBRACKET || op == JO_LBRACE) {
            if (L->nbal == (int)sizeof L->bal) lfail(L, p, "brackets nested too deeply");
            L->bal[L->nbal++] = op == JO_LPAREN ? ')' : op == JO_LBRACKET ? ']' : '}';
        } else if (op == JO_RPAREN || op == JO_RBRACKET || op == JO_RBRACE) {
            if (!L->nbal) lfail(L, p, "unexpected '%c'", s[p]);
            char want = L->bal[--L->nbal];
            if (want != s[p]) lfail(L, p, "unexpected '%c', expected '%c'", s[p], want);
        }
        jtok *t = push(L, JT_OP, p);
        t->op = op;
        L->pos = p + ol;
    }
}

/* At src[p] == "{%": matches {%(-|+|)\s*raw\s*(-%}\s*|%}) ; returns end or 0. */
static size_t match_raw_begin(lexer *L, size_t p, char *sign)
{
    const char *s = L->src;
    size_t n = L->n, q = p + 2;
    *sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q = skip_ws(s, n, q);
    if (q + 3 > n || memcmp(s + q, "raw", 3)) return 0;
    q += 3;
    size_t r = skip_ws(s, n, q);
    if (r == q && r < n && is_name(s[r])) return 0;   /* "rawx" is another tag */
    q = r;
    if (q + 3 <= n && !memcmp(s + q, "-%}", 3)) return skip_ws(s, n, q + 3);
    if (q + 2 <= n && !memcmp(s + q, "%}", 2)) return q + 2;
    return 0;
}

/* From p, finds {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?); *at: the "{%"; returns the end. */
static size_t find_raw_end(lexer *L, size_t p, size_t *at, char *sign)
{
    const char *s = L->src;
    size_t n = L->n;
    for (size_t i = p; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t q = i + 2;
        char sg = 0;
        if (q < n && (s[q] == '-' || s[q] == '+')) sg = s[q++];
        q = skip_ws(s, n, q);
        if (q + 6 > n || memcmp(s + q, "endraw", 6)) continue;
        q = skip_ws(s, n, q + 6);
        size_t e = 0;
        if (q + 3 <= n && !memcmp(s + q, "+%}", 3)) e = q + 3;
        else if (q + 3 <= n && !memcmp(s + q, "-%}", 3)) e = skip_ws(s, n, q + 3);
        else if (q + 2 <= n && !memcmp(s + q, "%}", 2)) e = q + 2 + (q + 2 < n && s[q + 2] == '\n');
        if (!e) continue;
        *at = i; *sign = sg;
        return e;
    }
    return 0;
}

void jlex(jarena *a, jmp_buf *jb, const char *name, const char *src, size_t n, jtok **toks,
          int64_t *n_toks)
{
    lexer L = {.a = a, .jb = jb, .name = name, .src = src, .n = n, .line = 1};
    while (L.pos < n) {
        size_t p = L.pos, tag = p;
        int kind = 0;  /* 1 var, 2 block, 3 comment */
        for (; tag + 1 < n; tag++) {
            if (src[tag] != '{') continue;
            char c2 = src[tag + 1];
            if (c2 == '{') { kind = 1; break; }
            if (c2 == '%') { kind = 2; break; }
            if (c2 == '#') { kind = 3; break; }
        }
        if (!kind) { emit_text(&L, p, n, 0, 0); break; }
        char sign = 0;
        if (kind == 2) {
            size_t e = match_raw_begin(&L, tag, &sign);
            if (e) {
                emit_text(&L, p, tag, sign, 1);
                size_t at; char sg;
                size_t end = find_raw_end(&L, e, &at, &sg);
                if (!end) lfail(&L, tag, "Missing end of raw directive");
                emit_text(&L, e, at, sg, 1);
                L.pos = end;
                continue;
            }
        }
        size_t q = tag + 2;
        if (q < n && (src[q] == '-' || src[q] == '+')) sign = src[q++];
        emit_text(&L, p, tag, sign, kind != 1);
        if (kind == 3) {
            size_t e = q;
            while (e + 1 < n && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= n) lfail(&L, tag, "Missing end of comment tag");
            if (e > q && src[e - 1] == '-') L.pos = skip_ws(src, n, e + 2);
            else if (e > q && src[e - 1] == '+') L.pos = e + 2;
            else L.pos = e + 2 + (e + 2 < n && src[e + 2] == '\n');
            continue;
        }
        push(&L, kind == 1 ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag);
        L.pos = q;
        lex_tag(&L, kind == 2, tag);
    }
    push(&L, JT_EOF, n);
    *toks = L.t;
    *n_toks = L.nt;
}
