/* tok_decode.c - ft_tok_decode: ids -> token strings -> decoder chain -> UTF-8
 * (huggingface/tokenizers Tokenizer::decode and decoders/{byte_level,byte_fallback,fuse,
 * strip,replace}.rs, pre_tokenizers/metaspace.rs). With no decoder, tokens are joined with
 * single spaces, as tokenizers does. ft_tok_token_bytes: one token's raw bytes, by the same
 * walk over the chain in its one-token mode (tk_walk).
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

typedef struct tk_toks { tk_buf b; size_t *off, *len; int64_t n, cap; } tk_toks;

static int toks_push(tk_toks *t, const char *s, size_t n)
{
    if (t->n == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 64;
        size_t *o = realloc(t->off, (size_t)cap * sizeof *o);
        if (o) t->off = o;
        size_t *l = realloc(t->len, (size_t)cap * sizeof *l);
        if (l) t->len = l;
        if (!o || !l) return -ENOMEM;
        t->cap = cap;
    }
    t->off[t->n] = t->b.n;
    t->len[t->n] = n;
    t->n++;
    return tk_buf_put(&t->b, s, n);
}

/* Appends to the last token (which must be the last thing in the buffer). */
static int toks_extend(tk_toks *t, const char *s, size_t n)
{
    t->len[t->n - 1] += n;
    return tk_buf_put(&t->b, s, n);
}

static void toks_free(tk_toks *t)
{
    tk_buf_free(&t->b);
    free(t->off);
    free(t->len);
    memset(t, 0, sizeof *t);
}

/* String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD. */
static int put_lossy(tk_buf *out, const unsigned char *s, size_t n)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { FT_TRY(tk_buf_putc(out, (char)c)); i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else { FT_TRY(tk_buf_put(out, fffd, 3)); i++; continue; }
        size_t k = 1;
        while ((int)k <= need && i + k < n) {
            unsigned x = s[i + k];
            unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (x < l || x > h) break;
            k++;
        }
        if ((int)k == need + 1) FT_TRY(tk_buf_put(out, s + i, k));
        else FT_TRY(tk_buf_put(out, fffd, 3));
        i += k;
    }
    return 0;
}

/* How a walk over the decoder chain reads its tokens. A whole text (ft_tok_decode): invalid
 * UTF-8 becomes U+FFFD, Metaspace drops the replacement characters of the first token (unless
 * its prepend_scheme is "never"), Strip strips every token it gets. One token
 * (ft_tok_token_bytes): it stands in the middle of a text, so the bytes stay raw (a piece of a
 * character is kept as it is), Metaspace has no first token, and a Strip after Fuse, which
 * strips the ends of the whole text, leaves it alone. */
typedef struct tk_walk {
    int one_token;   /* 0: whole text; 1: one token, mid-text, raw bytes */
    int fused;       /* a Fuse step has run */
} tk_walk;

/* ByteLevel: every token's characters back to their bytes (GPT-2 bytes_to_unicode), joined
 * into one token; a whole text then goes through String::from_utf8_lossy (byte_level.rs). */
static int dec_bytelevel(const tk_walk *w, const tk_toks *in, tk_toks *out)
{
    tk_buf raw = {0};
    int rc = 0;
    for (int64_t i = 0; i < in->n && rc == 0; i++) {
        const char *s = in->b.p + in->off[i];
        size_t n = in->len[i], start = raw.n;
        int ok = 1;
        for (size_t k = 0; k < n && ok && rc == 0;) {
            int32_t cp;
            int L = tk_u8dec((const unsigned char *)s + k, n - k, &cp);
            int b = tk_cp_to_byte(cp);
            if (b < 0) ok = 0;
            else rc = tk_buf_putc(&raw, (char)b);
            k += (size_t)L;
        }
        if (!ok && rc == 0) { /* a char outside the table: the token's own bytes */
            raw.n = start;
            rc = tk_buf_put(&raw, s, n);
        }
    }
    if (w->one_token) {
        if (rc == 0) rc = toks_push(out, raw.p ? raw.p : "", raw.n);
        tk_buf_free(&raw);
        return rc;
    }
    tk_buf txt = {0};
    if (rc == 0) rc = put_lossy(&txt, (const unsigned char *)raw.p, raw.n);
    if (rc == 0) rc = toks_push(out, txt.p ? txt.p : "", txt.n);
    tk_buf_free(&raw);
    tk_buf_free(&txt);
    return rc;
}

static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char h = s[k];
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'A' && h <= 'F') ? h - 'A' + 10
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A run of byte-fallback bytes as one token; in a whole text, a run that is not valid UTF-8
 * gives one U+FFFD per byte instead (byte_fallback.rs). */
static int flush_bytes(const tk_walk *w, tk_buf *bytes, tk_toks *out)
{
    if (!bytes->n) return 0;
    int valid = 1;
    for (size_t i = 0; i < bytes->n && valid && !w->one_token;) { /* one token: raw */
        int32_t cp;
        i += (size_t)tk_u8dec((const unsigned char *)bytes->p + i, bytes->n - i, &cp);
        valid = cp >= 0;
    }
    if (valid) FT_TRY(toks_push(out, bytes->p, bytes->n));
    else
        for (size_t i = 0; i < bytes->n; i++) FT_TRY(toks_push(out, "\xEF\xBF\xBD", 3));
    bytes->n = 0;
    return 0;
}

static int dec_bytefallback(const tk_walk *w, const tk_toks *in, tk_toks *out)
{
    tk_buf bytes = {0};
    int rc = 0;
    for (int64_t i = 0; i < in->n && rc == 0; i++) {
        const char *s = in->b.p + in->off[i];
        int v = byte_token(s, in->len[i]);
        if (v >= 0) {
            rc = tk_buf_putc(&bytes, (char)v);
        } else {
            rc = flush_bytes(w, &bytes, out);
            if (rc == 0) rc = toks_push(out, s, in->len[i]);
        }
    }
    if (rc == 0) rc = flush_bytes(w, &bytes, out);
    tk_buf_free(&bytes);
    return rc;
}

/* One decoder step: the tokens of in through d, appended to out (empty). */
static int dec_step(const tk_dec *d, tk_walk *w, const tk_toks *in, tk_toks *out)
{
    switch (d->type) {
    case TK_DEC_BYTELEVEL: return dec_bytelevel(w, in, out);
    case TK_DEC_BYTEFALLBACK: return dec_bytefallback(w, in, out);
    case TK_DEC_FUSE:
        w->fused = 1;
        FT_TRY(toks_push(out, "", 0));
        return in->n ? toks_extend(out, in->b.p, in->b.n) : 0;
    default: break;
    }
    for (int64_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->off[i];
        size_t n = in->len[i];
        FT_TRY(toks_push(out, "", 0));
        if (d->type == TK_DEC_REPLACE) {
            size_t k = 0;
            while (k < n) {
                const char *hit = d->a_n ? memmem(s + k, n - k, d->a, d->a_n) : NULL;
                if (!hit) break;
                FT_TRY(toks_extend(out, s + k, (size_t)(hit - (s + k))));
                FT_TRY(toks_extend(out, d->b, d->b_n));
                k = (size_t)(hit - s) + d->a_n;
            }
            FT_TRY(toks_extend(out, s + k, n - k));
        } else if (d->type == TK_DEC_STRIP) {
            char u[4];
            size_t cl = (size_t)ft_utf8_encode((uint32_t)d->ch, u), a = 0, b = n;
            int keep = w->one_token && w->fused; /* after Fuse it strips the whole text's ends */
            int start = keep ? 0 : d->start, stop = keep ? 0 : d->stop;
            for (int k = 0; k < start && a + cl <= b && !memcmp(s + a, u, cl); k++) a += cl;
            for (int k = 0; k < stop && b >= a + cl && !memcmp(s + b - cl, u, cl); k++) b -= cl;
            FT_TRY(toks_extend(out, s + a, b - a));
        } else { /* TK_DEC_METASPACE: the replacement character is a space, except in a text's
                  * first token when the pre-tokenizer prepends one */
            char u[4];
            size_t cl = (size_t)ft_utf8_encode((uint32_t)d->ch, u);
            int first = !w->one_token && i == 0 && d->prepend_scheme != TK_PREPEND_NEVER;
            for (size_t k = 0; k < n;) {
                if (k + cl <= n && !memcmp(s + k, u, cl)) {
                    if (!first) FT_TRY(toks_extend(out, " ", 1));
                    k += cl;
                } else {
                    FT_TRY(toks_extend(out, s + k, 1));
                    k++;
                }
            }
        }
    }
    return 0;
}

/* Runs the decoder chain dec[0..n_dec) over the tokens of *a (one_token: see tk_walk), then
 * hands out their bytes joined: *p malloc'ed, NUL-terminated, *n its length (unset on error).
 * *a is freed either way. Returns 0 or -ENOMEM. */
static int dec_walk(const tk_dec *dec, int n_dec, tk_toks *a, int one_token, char **p, size_t *n)
{
    tk_walk w = {.one_token = one_token};
    tk_toks b = {0};
    int rc = 0;
    for (int k = 0; k < n_dec && rc == 0; k++) {
        b.n = 0;
        b.b.n = 0;
        rc = dec_step(&dec[k], &w, a, &b);
        tk_toks x = *a;
        *a = b;
        b = x;
    }
    toks_free(&b);
    if (rc == 0) rc = tk_buf_reserve(&a->b, 0); /* room for the NUL, and a buffer for "" */
    if (rc == 0) {
        a->b.p[a->b.n] = 0;
        *p = a->b.p;
        *n = a->b.n;
        a->b.p = NULL;
    }
    toks_free(a);
    return rc;
}

int ft_tok_decode(const ft_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                  char **text)
{
    *text = NULL;
    if (!t || (!ids && n > 0)) return ft_err(FT_E_INVALID, "ft_tok_decode: NULL tokenizer or ids");
    tk_toks a = {0};
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        size_t len;
        const char *s = tk_id_text(t, ids[i], &len);
        if (!s) continue; /* unknown ids are skipped, as tokenizers does */
        if (skip_special && t->added_of_id[ids[i]] >= 0 && t->added[t->added_of_id[ids[i]]].special)
            continue;
        if (!t->has_decoder && a.n > 0) rc = toks_extend(&a, " ", 1);
        else if (!t->has_decoder) rc = toks_push(&a, "", 0);
        else rc = toks_push(&a, s, len);
        if (rc == 0 && !t->has_decoder) rc = toks_extend(&a, s, len);
    }
    if (rc < 0) {
        toks_free(&a);
        return rc;
    }
    size_t text_n;
    return dec_walk(t->dec, t->n_dec, &a, 0, text, &text_n);
}

int ft_tok_token_bytes(const ft_tokenizer *t, int32_t id, char **bytes, size_t *n)
{
    if (bytes) *bytes = NULL;
    if (n) *n = 0;
    if (!t || !bytes || !n) return ft_err(FT_E_INVALID, "ft_tok_token_bytes: NULL argument");
    size_t len;
    const char *s = id >= 0 && id < t->n_ids ? tk_id_text(t, id, &len) : NULL;
    if (!s) return ft_err(FT_E_INVALID, "token id %d is not in the vocabulary (%lld ids)", (int)id,
                          (long long)t->n_ids);
    const tk_added *a = t->added_of_id[id] >= 0 ? &t->added[t->added_of_id[id]] : NULL;
    if (a && a->special) { /* its content as written, not decoded */
        s = a->content;
        len = a->n;
    }
    tk_toks tk = {0};
    int rc = toks_push(&tk, s, len);
    if (rc == 0) {
        int n_dec = t->has_decoder && !(a && a->special) ? t->n_dec : 0; /* else no steps */
        rc = dec_walk(t->dec, n_dec, &tk, 1, bytes, n);
    } else {
        toks_free(&tk);
    }
    if (rc < 0) return ft_err(-ENOMEM, "out of memory");
    return 0;
}

int ft_tok_utf8_lossy(const char *s, size_t n, char **out, size_t *out_n)
{
    *out = NULL;
    if (out_n) *out_n = 0;
    tk_buf b = {0};
    int rc = tk_buf_reserve(&b, n + 1);
    if (rc == 0) rc = put_lossy(&b, (const unsigned char *)s, n);
    if (rc < 0) {
        tk_buf_free(&b);
        return ft_err(-ENOMEM, "out of memory");
    }
    b.p[b.n] = 0;
    *out = b.p;
    if (out_n) *out_n = b.n;
    return 0;
}
