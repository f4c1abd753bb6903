/* tok_pretok.c - everything before the model: added-token splitting, normalizers and
 * pre-tokenizers, on a list of pieces (byte ranges of the work buffer). Semantics follow
 * huggingface/tokenizers: tokenizer/added_vocabulary.rs (find_matches), normalizer.rs
 * (split behaviours), pattern.rs, pre_tokenizers/{byte_level,metaspace,split,digits}.rs.
 * Empty pieces are dropped after every step, as PreTokenizedString::split does.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <wctype.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

int tk_pieces_push(tk_pieces *p, size_t off, size_t n, int32_t id, int origin0)
{
    if (n == 0) return 0;
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 16;
        tk_piece *v = realloc(p->v, (size_t)cap * sizeof *v);
        if (!v) return -ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tk_piece){off, n, id, (uint8_t)(origin0 != 0)};
    return 0;
}

static void swap_lists(tk_ctx *c)
{
    tk_pieces t = c->a;
    c->a = c->b;
    c->b = t;
    c->b.n = 0;
}

/* ---- added tokens ------------------------------------------------------------------------ */

static int is_word_at(const ft_tokenizer *t, tk_ctx *c, const char *s, size_t n, size_t pos)
{
    int rc = pcre2_match(t->re_word.code, (PCRE2_SPTR)s, n, pos, PCRE2_ANCHORED, c->md, NULL);
    return rc >= 0;
}

static size_t prev_char(const char *s, size_t pos)
{
    size_t k = pos - 1;
    for (int i = 0; i < 3 && k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80; i++) k--;
    return k;
}

static size_t space_leftmost_at_end(const char *s, size_t end)
{
    size_t j = end;
    while (j > 0) {
        size_t k = prev_char(s, j);
        int32_t cp;
        int L = tk_u8dec((const unsigned char *)s + k, j - k, &cp);
        if (k + (size_t)L != j || !tk_is_space(cp)) break;
        j = k;
    }
    return j;
}

static size_t space_rightmost_at_start(const char *s, size_t n)
{
    size_t j = 0;
    while (j < n) {
        int32_t cp;
        int L = tk_u8dec((const unsigned char *)s + j, n - j, &cp);
        if (!tk_is_space(cp)) break;
        j += (size_t)L;
    }
    return j;
}

int tk_split_added(const ft_tokenizer *t, tk_ctx *c, const tk_matcher *m)
{
    if (!m->any) return 0;
    c->b.n = 0;
    for (int64_t pi = 0; pi < c->a.n; pi++) {
        tk_piece p = c->a.v[pi];
        if (p.id >= 0) {
            FT_TRY(tk_pieces_push(&c->b, p.off, p.n, p.id, p.origin0));
            continue;
        }
        const char *s = c->w.p + p.off;
        size_t n = p.n, start_offset = 0, i = 0;
        while (i < n) {
            unsigned ch = (unsigned char)s[i];
            const tk_added *a = NULL;
            for (int32_t k = m->first[ch]; k < m->first[ch + 1]; k++) {
                const tk_added *x = &t->added[m->idx[k]];
                if (x->pat_n <= n - i && !memcmp(s + i, x->pat, x->pat_n)) { a = x; break; }
            }
            if (!a) { i++; continue; }
            size_t start = i, stop = i + a->pat_n;
            i = stop;
            if (a->single_word) {
                int start_space = start == 0 || !is_word_at(t, c, s, n, prev_char(s, start));
                int stop_space = stop == n || !is_word_at(t, c, s, n, stop);
                if (!start_space || !stop_space) continue;
            }
            if (a->lstrip) {
                size_t ns = space_leftmost_at_end(s, start);
                start = ns > start_offset ? ns : start_offset;
            }
            if (a->rstrip) stop += space_rightmost_at_start(s + stop, n - stop);
            if (start < start_offset) start = start_offset;
            if (start_offset < start)
                FT_TRY(tk_pieces_push(&c->b, p.off + start_offset, start - start_offset, -1,
                                      p.origin0 && start_offset == 0));
            FT_TRY(tk_pieces_push(&c->b, p.off + start, stop - start, a->id, 0));
            start_offset = stop;
            if (i < stop) i = stop;
        }
        if (start_offset < n)
            FT_TRY(tk_pieces_push(&c->b, p.off + start_offset, n - start_offset, -1,
                                  p.origin0 && start_offset == 0));
    }
    swap_lists(c);
    return 0;
}

/* ---- normalizers ------------------------------------------------------------------------ */

/* Lowercase per character, as Rust's char::to_lowercase: towlower_l in the C.UTF-8 locale
 * (full simple case mapping) and the one special mapping U+0130 -> "i\u0307"; without that
 * locale, only ASCII, Latin-1/Extended-A, Greek, Cyrillic and full-width Latin capitals. */
static int32_t lower_cp(const ft_tokenizer *t, int32_t c)
{
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0xC0) return c;
    if (t->lower_loc) return (int32_t)towlower_l((wint_t)c, t->lower_loc);
    if (c <= 0xDE && c != 0xD7) return c + 32;
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
    if (c == 0x178) return 0xFF;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

static int replace_literal(const tk_norm *z, const tk_buf *in, tk_buf *out)
{
    size_t i = 0;
    while (i < in->n) {
        const char *hit = z->a_n ? memmem(in->p + i, in->n - i, z->a, z->a_n) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - in->p);
        FT_TRY(tk_buf_put(out, in->p + i, at - i));
        FT_TRY(tk_buf_put(out, z->b, z->b_n));
        i = at + z->a_n;
    }
    return tk_buf_put(out, in->p + i, in->n - i);
}

static int replace_regex(const tk_norm *z, tk_ctx *c, const tk_buf *in, tk_buf *out)
{
    size_t i = 0, from = 0, ms, me;
    int rc;
    while ((rc = tk_re_next(&z->re, c->md, in->p, in->n, from, &ms, &me)) == 1) {
        if (me == ms) { /* empty matches replace nothing; step one character */
            if (ms >= in->n) break;
            from = ms + (size_t)tk_u8len((const unsigned char *)in->p + ms, in->n - ms);
            continue;
        }
        FT_TRY(tk_buf_put(out, in->p + i, ms - i));
        FT_TRY(tk_buf_put(out, z->b, z->b_n));
        i = from = me;
    }
    if (rc < 0) return rc;
    return tk_buf_put(out, in->p + i, in->n - i);
}

static int apply_norm(const ft_tokenizer *t, const tk_norm *z, tk_ctx *c, const tk_buf *in,
                      tk_buf *out)
{
    out->n = 0;
    switch (z->type) {
    case TK_NORM_PREPEND:
        if (in->n) FT_TRY(tk_buf_put(out, z->a, z->a_n));
        return tk_buf_put(out, in->p, in->n);
    case TK_NORM_REPLACE:
        return z->re.code ? replace_regex(z, c, in, out) : replace_literal(z, in, out);
    case TK_NORM_LOWER:
        for (size_t i = 0; i < in->n;) {
            int32_t cp;
            int L = tk_u8dec((const unsigned char *)in->p + i, in->n - i, &cp);
            int32_t lc = cp < 0 ? cp : lower_cp(t, cp);
            if (cp == 0x130) {
                FT_TRY(tk_buf_put(out, "i\xCC\x87", 3));
            } else if (lc == cp) {
                FT_TRY(tk_buf_put(out, in->p + i, (size_t)L));
            } else {
                char u[4];
                FT_TRY(tk_buf_put(out, u, (size_t)ft_utf8_encode((uint32_t)lc, u)));
            }
            i += (size_t)L;
        }
        return 0;
    default: { /* TK_NORM_NFC: canonical composition (utf8proc: UAX #15, Unicode 15) */
        size_t a = 0;
        while (a < in->n && (unsigned char)in->p[a] < 0x80) a++;
        if (a == in->n) return tk_buf_put(out, in->p, in->n); /* ASCII is NFC */
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)in->p, (utf8proc_ssize_t)in->n, &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        /* not valid UTF-8 (bytes from a file, never from tokenizers' str): left as it is */
        int rc = k < 0 ? tk_buf_put(out, in->p, in->n) : tk_buf_put(out, (const char *)nfc, (size_t)k);
        free(nfc);
        return rc;
    }
    }
}

int tk_normalize_str(const ft_tokenizer *t, tk_ctx *c, const char *s, size_t n, tk_buf *out)
{
    c->t1.n = 0;
    FT_TRY(tk_buf_put(&c->t1, s, n));
    for (int k = 0; k < t->n_norm; k++) {
        FT_TRY(apply_norm(t, &t->norm[k], c, &c->t1, &c->t2));
        tk_buf x = c->t1;
        c->t1 = c->t2;
        c->t2 = x;
    }
    return tk_buf_put(out, c->t1.p, c->t1.n);
}

int tk_normalize_pieces(const ft_tokenizer *t, tk_ctx *c)
{
    if (t->n_norm) {
        for (int64_t i = 0; i < c->a.n; i++) {
            tk_piece *p = &c->a.v[i];
            if (p->id >= 0) continue;
            size_t off = c->w.n;
            /* tk_normalize_str copies the input before it appends to c->w */
            FT_TRY(tk_normalize_str(t, c, c->w.p + p->off, p->n, &c->w));
            p->off = off;
            p->n = c->w.n - off;
        }
        c->b.n = 0;
        for (int64_t i = 0; i < c->a.n; i++) {
            tk_piece p = c->a.v[i];
            FT_TRY(tk_pieces_push(&c->b, p.off, p.n, p.id, p.origin0));
        }
        swap_lists(c);
    }
    return tk_split_added(t, c, &t->m_norm);
}

/* ---- pre-tokenizers --------------------------------------------------------------------- */

typedef struct tk_seg { size_t s, e; int match; } tk_seg;

static int seg_push(tk_ctx *c, int64_t *n, size_t s, size_t e, int match)
{
    if (*n == c->cap_seg) {
        int64_t cap = c->cap_seg ? c->cap_seg * 2 : 64;
        void *p = realloc(c->seg, (size_t)cap * sizeof(tk_seg));
        if (!p) return -ENOMEM;
        c->seg = p;
        c->cap_seg = cap;
    }
    ((tk_seg *)c->seg)[(*n)++] = (tk_seg){s, e, match};
    return 0;
}

/* Matches of re in s[0..n) as alternating segments (pattern.rs find_matches). Empty matches
 * split too; an empty match right after a match is skipped (onig/regex find_iter). */
static int find_segments(tk_ctx *c, const tk_re *re, const char *s, size_t n, int64_t *ns)
{
    size_t prev = 0, from = 0, ms, me, last_end = (size_t)-1;
    int rc;
    *ns = 0;
    while ((rc = tk_re_next(re, c->md, s, n, from, &ms, &me)) == 1) {
        if (ms == me && last_end == me) {
            if (me >= n) break;
            from = me + (size_t)tk_u8len((const unsigned char *)s + me, n - me);
            continue;
        }
        if (prev != ms) FT_TRY(seg_push(c, ns, prev, ms, 0));
        FT_TRY(seg_push(c, ns, ms, me, 1));
        prev = last_end = from = me;
    }
    if (rc < 0) return rc;
    if (prev != n) FT_TRY(seg_push(c, ns, prev, n, 0));
    return 0;
}

/* Applies a split behaviour to segments (normalizer.rs NormalizedString::split) and pushes
 * the resulting pieces of piece p. */
static int split_piece(tk_ctx *c, const tk_re *re, int behavior, int invert, tk_piece p)
{
    int64_t ns;
    FT_TRY(find_segments(c, re, c->w.p + p.off, p.n, &ns));
    tk_seg *g = c->seg;
    if (invert)
        for (int64_t i = 0; i < ns; i++) g[i].match = !g[i].match;
    int64_t m = 0; /* compacted output in g[0..m): match field = "remove" */
    if (behavior == TK_SPLIT_NEXT) {
        int prev_match = 0;
        for (int64_t i = ns - 1; i >= 0; i--) { /* reverse fold, written from the back */
            tk_seg x = g[i];
            if (x.match && !prev_match && m > 0) {
                g[ns - m].s = x.s;
            } else {
                g[ns - 1 - m] = (tk_seg){x.s, x.e, 0};
                m++;
            }
            prev_match = x.match;
        }
        memmove(g, g + ns - m, (size_t)m * sizeof *g);
    } else {
        int prev_match = 0;
        for (int64_t i = 0; i < ns; i++) {
            tk_seg x = g[i];
            if (behavior == TK_SPLIT_ISOLATED) {
                g[m++] = (tk_seg){x.s, x.e, 0};
            } else if (behavior == TK_SPLIT_REMOVED) {
                g[m++] = x;
            } else if (behavior == TK_SPLIT_CONTIG) {
                if (x.match == prev_match && m > 0) g[m - 1].e = x.e;
                else g[m++] = (tk_seg){x.s, x.e, 0};
            } else { /* TK_SPLIT_PREV */
                if (x.match && !prev_match && m > 0) g[m - 1].e = x.e;
                else g[m++] = (tk_seg){x.s, x.e, 0};
            }
            prev_match = x.match;
        }
    }
    for (int64_t i = 0; i < m; i++)
        if (!g[i].match)
            FT_TRY(tk_pieces_push(&c->b, p.off + g[i].s, g[i].e - g[i].s, -1,
                                  p.origin0 && g[i].s == 0));
    return 0;
}

static int byte_level(const tk_pre *z, tk_ctx *c, tk_piece p)
{
    if (z->add_prefix_space && c->w.p[p.off] != ' ') {
        FT_TRY(tk_buf_reserve(&c->w, p.n + 1));
        size_t off = c->w.n;
        c->w.p[c->w.n++] = ' ';
        memcpy(c->w.p + c->w.n, c->w.p + p.off, p.n);
        c->w.n += p.n;
        p.off = off;
        p.n += 1;
    }
    int64_t first = c->b.n;
    if (z->use_regex) FT_TRY(split_piece(c, &z->re, TK_SPLIT_ISOLATED, 0, p));
    else FT_TRY(tk_pieces_push(&c->b, p.off, p.n, -1, p.origin0));
    for (int64_t i = first; i < c->b.n; i++) {
        tk_piece *q = &c->b.v[i];
        FT_TRY(tk_buf_reserve(&c->w, 2 * q->n));
        size_t off = c->w.n;
        for (size_t k = 0; k < q->n; k++) {
            char u[4];
            int L = ft_utf8_encode(tk_byte_to_cp((uint8_t)c->w.p[q->off + k]), u);
            memcpy(c->w.p + c->w.n, u, (size_t)L);
            c->w.n += (size_t)L;
        }
        q->off = off;
        q->n = c->w.n - off;
    }
    return 0;
}

static int metaspace(const tk_pre *z, tk_ctx *c, tk_piece p)
{
    size_t spaces = 0;
    for (size_t k = 0; k < p.n; k++) spaces += c->w.p[p.off + k] == ' ';
    FT_TRY(tk_buf_reserve(&c->w, p.n + (spaces + 1) * (size_t)z->repl_n));
    size_t off = c->w.n;
    const char *s = c->w.p + p.off;
    int starts = p.n > 0 && (s[0] == ' ' ||
                             (p.n >= (size_t)z->repl_n && !memcmp(s, z->repl, (size_t)z->repl_n)));
    int prepend = !starts && (z->prepend_scheme == TK_PREPEND_ALWAYS ||
                              (z->prepend_scheme == TK_PREPEND_FIRST && p.origin0));
    char *o = c->w.p + c->w.n;
    if (prepend) { memcpy(o, z->repl, (size_t)z->repl_n); o += z->repl_n; }
    for (size_t k = 0; k < p.n; k++) {
        if (s[k] == ' ') { memcpy(o, z->repl, (size_t)z->repl_n); o += z->repl_n; }
        else *o++ = s[k];
    }
    c->w.n = (size_t)(o - c->w.p);
    tk_piece q = {off, c->w.n - off, -1, p.origin0};
    if (!z->split) return tk_pieces_push(&c->b, q.off, q.n, -1, q.origin0);
    /* split before each replacement char (MergedWithNext) */
    const char *r = c->w.p + q.off;
    size_t start = 0;
    for (size_t k = 1; k + (size_t)z->repl_n <= q.n; k++) {
        if (!memcmp(r + k, z->repl, (size_t)z->repl_n)) {
            FT_TRY(tk_pieces_push(&c->b, q.off + start, k - start, -1, q.origin0 && start == 0));
            start = k;
        }
    }
    return tk_pieces_push(&c->b, q.off + start, q.n - start, -1, q.origin0 && start == 0);
}

int tk_pretokenize(const ft_tokenizer *t, tk_ctx *c)
{
    for (int k = 0; k < t->n_pre; k++) {
        const tk_pre *z = &t->pre[k];
        c->b.n = 0;
        for (int64_t i = 0; i < c->a.n; i++) {
            tk_piece p = c->a.v[i];
            if (p.id >= 0) {
                FT_TRY(tk_pieces_push(&c->b, p.off, p.n, p.id, p.origin0));
                continue;
            }
            switch (z->type) {
            case TK_PRE_SPLIT: FT_TRY(split_piece(c, &z->re, z->behavior, z->invert, p)); break;
            case TK_PRE_BYTELEVEL: FT_TRY(byte_level(z, c, p)); break;
            default: FT_TRY(metaspace(z, c, p)); break;
            }
        }
        swap_lists(c);
    }
    return 0;
}
