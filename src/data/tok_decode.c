/* tok_decode.c - ft_tok_decode: ids -> token strings -> decoder chain -> UTF-8
 * (huggingface/tokenizers Tokenizer::decode and decoders/{byte_level,byte_fallback,fuse,
 * strip,replace}.rs, pre_tokenizers/metaspace.rs). With no decoder, tokens are joined with
 * single spaces, as tokenizers does. ft_tok_token_bytes: one token's raw bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/data/tok_internal.h"

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

static int dec_bytelevel(const tk_toks *in, tk_toks *out)
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

static int flush_bytes(tk_buf *bytes, tk_toks *out)
{
    if (!bytes->n) return 0;
    int valid = 1;
    for (size_t i = 0; i < bytes->n && valid;) {
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

static int dec_bytefallback(const tk_toks *in, tk_toks *out)
{
    tk_buf bytes = {0};
    int rc = 0;
    for (int64_t i = 0; i < in->n && rc == 0; i++) {
        const char *s = in->b.p + in->off[i];
        int v = byte_token(s, in->len[i]);
        if (v >= 0) {
            rc = tk_buf_putc(&bytes, (char)v);
        } else {
            rc = flush_bytes(&bytes, out);
            if (rc == 0) rc = toks_push(out, s, in->len[i]);
        }
    }
    if (rc == 0) rc = flush_bytes(&bytes, out);
    tk_buf_free(&bytes);
    return rc;
}

static int dec_one(const tk_dec *d, const tk_toks *in, tk_toks *out)
{
    switch (d->type) {
    case TK_DEC_BYTELEVEL: return dec_bytelevel(in, out);
    case TK_DEC_BYTEFALLBACK: return dec_bytefallback(in, out);
    case TK_DEC_FUSE:
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
            size_t cl = (size_t)tk_u8enc((uint32_t)d->ch, u), a = 0, b = n;
            for (int k = 0; k < d->start && a + cl <= b && !memcmp(s + a, u, cl); k++) a += cl;
            for (int k = 0; k < d->stop && b >= a + cl && !memcmp(s + b - cl, u, cl); k++) b -= cl;
            FT_TRY(toks_extend(out, s + a, b - a));
        } else { /* TK_DEC_METASPACE */
            char u[4];
            size_t cl = (size_t)tk_u8enc((uint32_t)d->ch, u);
            for (size_t k = 0; k < n;) {
                if (k + cl <= n && !memcmp(s + k, u, cl)) {
                    if (!(i == 0 && d->prepend_scheme != TK_PREPEND_NEVER)) FT_TRY(toks_extend(out, " ", 1));
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

int ft_tok_decode(const ft_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                  char **text)
{
    *text = NULL;
    if (!t || (!ids && n > 0)) return ft_err(FT_E_INVALID, "ft_tok_decode: NULL tokenizer or ids");
    tk_toks a = {0}, b = {0};
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
    for (int k = 0; k < t->n_dec && rc == 0; k++) {
        b.n = 0;
        b.b.n = 0;
        rc = dec_one(&t->dec[k], &a, &b);
        tk_toks x = a;
        a = b;
        b = x;
    }
    tk_buf joined = {0};
    if (rc == 0) rc = tk_buf_put(&joined, a.b.p ? a.b.p : "", a.b.n);
    toks_free(&a);
    toks_free(&b);
    if (rc < 0) {
        tk_buf_free(&joined);
        return rc;
    }
    *text = joined.p;
    return 0;
}

/* One token through the decoder chain, as ft_tok_token_bytes describes: buf holds the token's
 * text and receives its bytes. */
static int token_dec(const ft_tokenizer *t, tk_buf *buf)
{
    tk_buf tmp = {0};
    int rc = 0, fused = 0;
    for (int k = 0; k < t->n_dec && rc == 0; k++) {
        const tk_dec *d = &t->dec[k];
        const char *s = buf->p ? buf->p : "";
        const size_t n = buf->n;
        tmp.n = 0;
        switch (d->type) {
        case TK_DEC_BYTELEVEL: { /* each character its byte; a character outside the table
                                  * leaves the token's own bytes, as dec_bytelevel does */
            int ok = 1;
            for (size_t i = 0; i < n && ok && rc == 0;) {
                int32_t cp;
                int L = tk_u8dec((const unsigned char *)s + i, n - i, &cp);
                int b = tk_cp_to_byte(cp);
                if (b < 0) ok = 0;
                else rc = tk_buf_putc(&tmp, (char)b);
                i += (size_t)L;
            }
            if (!ok && rc == 0) {
                tmp.n = 0;
                rc = tk_buf_put(&tmp, s, n);
            }
            break;
        }
        case TK_DEC_BYTEFALLBACK: {
            int v = byte_token(s, n);
            rc = v >= 0 ? tk_buf_putc(&tmp, (char)v) : tk_buf_put(&tmp, s, n);
            break;
        }
        case TK_DEC_FUSE: /* one token: nothing to join */
            fused = 1;
            rc = tk_buf_put(&tmp, s, n);
            break;
        case TK_DEC_STRIP: { /* after Fuse it strips the whole text's ends: not a token's */
            size_t a = 0, b = n;
            if (!fused) {
                char u[4];
                size_t cl = (size_t)tk_u8enc((uint32_t)d->ch, u);
                for (int j = 0; j < d->start && a + cl <= b && !memcmp(s + a, u, cl); j++) a += cl;
                for (int j = 0; j < d->stop && b >= a + cl && !memcmp(s + b - cl, u, cl); j++) b -= cl;
            }
            rc = tk_buf_put(&tmp, s + a, b - a);
            break;
        }
        case TK_DEC_REPLACE: {
            size_t i = 0;
            while (rc == 0 && i < n) {
                const char *hit = d->a_n ? memmem(s + i, n - i, d->a, d->a_n) : NULL;
                if (!hit) break;
                rc = tk_buf_put(&tmp, s + i, (size_t)(hit - (s + i)));
                if (rc == 0) rc = tk_buf_put(&tmp, d->b, d->b_n);
                i = (size_t)(hit - s) + d->a_n;
            }
            if (rc == 0) rc = tk_buf_put(&tmp, s + i, n - i);
            break;
        }
        default: { /* TK_DEC_METASPACE: the replacement character is a space (not a first token) */
            char u[4];
            size_t cl = (size_t)tk_u8enc((uint32_t)d->ch, u);
            for (size_t i = 0; rc == 0 && i < n;) {
                if (i + cl <= n && !memcmp(s + i, u, cl)) {
                    rc = tk_buf_putc(&tmp, ' ');
                    i += cl;
                } else {
                    rc = tk_buf_putc(&tmp, s[i]);
                    i++;
                }
            }
            break;
        }
        }
        tk_buf x = *buf; /* tmp becomes the token's text */
        *buf = tmp;
        tmp = x;
    }
    tk_buf_free(&tmp);
    return rc;
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
    if (a && a->special) { /* its content as written */
        s = a->content;
        len = a->n;
    }
    tk_buf b = {0};
    int rc = tk_buf_put(&b, s, len); /* tk_buf keeps a NUL after its n bytes */
    if (rc == 0 && !(a && a->special) && t->has_decoder) rc = token_dec(t, &b);
    if (rc == 0 && !b.p) rc = tk_buf_reserve(&b, 1);
    if (rc < 0) {
        tk_buf_free(&b);
        return ft_err(-ENOMEM, "out of memory");
    }
    b.p[b.n] = 0;
    *n = b.n;
    *bytes = b.p;
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
