/* stop_text.c - a reply's text searched for stop strings (stop_text.h). */
#include "src/infer/stop_text.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

void ft_stop_text_init(ft_stop_text *x, const ft_tokenizer *tok)
{
    memset(x, 0, sizeof *x);
    ft_detok_init(&x->dt, tok);
    x->hit = -1;
}

void ft_stop_text_free(ft_stop_text *x)
{
    if (!x) return;
    ft_detok_free(&x->dt);
    free(x->buf);
    memset(x, 0, sizeof *x);
    x->hit = -1;
}

int ft_stop_text_append(ft_stop_text *x, const char *const *stop, int64_t n_stop,
                        const char *piece, size_t n)
{
    if (x->hit >= 0 || !n) return 0;
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 256;
        while (cap < x->len + n + 1) cap *= 2;
        char *b = realloc(x->buf, cap);
        if (!b) return ft_err(-ENOMEM, "out of memory");
        x->buf = b;
        x->cap = cap;
    }
    const size_t old = x->len;
    memcpy(x->buf + old, piece, n);
    x->len += n;
    x->buf[x->len] = 0;
    size_t best_end = (size_t)-1, best_pos = 0;
    for (int64_t i = 0; i < n_stop; i++) {
        const size_t sl = strlen(stop[i]);
        /* a new match ends after `old`: it starts at old + 1 - sl at the earliest */
        const size_t from = old + 1 > sl ? old + 1 - sl : 0;
        if (!sl || sl > x->len - from) continue;
        const char *f = memmem(x->buf + from, x->len - from, stop[i], sl);
        if (f && (size_t)(f - x->buf) + sl < best_end) {
            best_pos = (size_t)(f - x->buf);
            best_end = best_pos + sl;
            x->hit = (int)i;
        }
    }
    if (x->hit >= 0) {
        x->len = best_pos;
        x->buf[x->len] = 0;
    }
    return 0;
}

int ft_stop_text_push(ft_stop_text *x, const char *const *stop, int64_t n_stop, int32_t t)
{
    const char *piece;
    size_t n;
    FT_TRY(ft_detok_push(&x->dt, t, &piece, &n));
    return ft_stop_text_append(x, stop, n_stop, piece, n);
}

int ft_stop_text_flush(ft_stop_text *x, const char *const *stop, int64_t n_stop)
{
    const char *piece;
    size_t n;
    if (x->hit >= 0) return 0;
    FT_TRY(ft_detok_flush(&x->dt, &piece, &n));
    return ft_stop_text_append(x, stop, n_stop, piece, n);
}

size_t ft_stop_text_safe(const ft_stop_text *x, const char *const *stop, int64_t n_stop, int final)
{
    size_t held = 0;
    if (!final && x->hit < 0)
        for (int64_t i = 0; i < n_stop; i++) {
            const size_t sl = strlen(stop[i]);
            if (!sl) continue;
            for (size_t k = sl - 1 < x->len ? sl - 1 : x->len; k > held; k--)
                if (!memcmp(x->buf + x->len - k, stop[i], k)) {
                    held = k;
                    break;
                }
        }
    const size_t safe = x->len - held;
    return safe > x->shown ? safe : x->shown;
}

int ft_stop_text_take(const ft_stop_text *x, char **out)
{
    *out = malloc(x->len + 1);
    if (!*out) return ft_err(-ENOMEM, "out of memory");
    if (x->len) memcpy(*out, x->buf, x->len);
    (*out)[x->len] = 0;
    return 0;
}

/* ---- streaming detokenization ------------------------------------------------------------ */

void ft_detok_init(ft_detok *d, const ft_tokenizer *tok)
{
    memset(d, 0, sizeof *d);
    d->tok = tok;
}

void ft_detok_free(ft_detok *d)
{
    if (!d) return;
    free(d->ids);
    free(d->piece);
    memset(d, 0, sizeof *d);
}

/* Decodes ids[a..b) (skip_special) into a malloc'ed string; *len its length. */
static int decode_range(const ft_detok *d, int64_t a, int64_t b, char **s, size_t *len)
{
    FT_TRY(ft_tok_decode(d->tok, d->ids + a, b - a, 1, s));
    if (!*s && !(*s = calloc(1, 1))) return ft_err(-ENOMEM, "detokenizer: out of memory");
    *len = strlen(*s);
    return 0;
}

static int ends_replacement(const char *s, size_t n)
{
    return n >= 3 && (unsigned char)s[n - 3] == 0xEF && (unsigned char)s[n - 2] == 0xBF &&
           (unsigned char)s[n - 1] == 0xBD;
}

/* Emits the text of ids[prefix_off..n) beyond that of ids[prefix_off..read_off); with
 * final = 0 only when it is longer and does not end in U+FFFD. */
static int detok_step(ft_detok *d, int final, const char **piece, size_t *n)
{
    *piece = "";
    *n = 0;
    char *pre = NULL, *all = NULL;
    size_t pn = 0, an = 0;
    int rc = decode_range(d, d->prefix_off, d->read_off, &pre, &pn);
    if (!rc) rc = decode_range(d, d->prefix_off, d->n, &all, &an);
    if (!rc && an > pn && (final || !ends_replacement(all, an))) {
        free(d->piece);
        d->piece = malloc(an - pn + 1);
        if (!d->piece) {
            rc = ft_err(-ENOMEM, "detokenizer: out of memory");
        } else {
            memcpy(d->piece, all + pn, an - pn);
            d->piece[an - pn] = 0;
            *piece = d->piece;
            *n = an - pn;
            d->prefix_off = d->read_off;
            d->read_off = d->n;
        }
    }
    free(pre);
    free(all);
    return rc;
}

int ft_detok_push(ft_detok *d, int32_t id, const char **piece, size_t *n)
{
    *piece = "";
    *n = 0;
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        int32_t *p = realloc(d->ids, (size_t)cap * sizeof *p);
        if (!p) return ft_err(-ENOMEM, "detokenizer: out of memory");
        d->ids = p;
        d->cap = cap;
    }
    d->ids[d->n++] = id;
    return detok_step(d, 0, piece, n);
}

int ft_detok_flush(ft_detok *d, const char **piece, size_t *n)
{
    return detok_step(d, 1, piece, n);
}
