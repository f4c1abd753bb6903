/* stop_text.h - a reply's text as it is generated, searched for stop strings, as vLLM's
 * SamplingParams.stop (vllm/v1/engine/detokenizer.py check_stop_strings): the reply ends as
 * soon as its decoded text contains one of them, and its text stops before that string (the
 * string itself is not kept). The text is what the streaming detokenizer (ft_detok below)
 * completes: whole UTF-8 characters, special tokens skipped. When one piece
 * completes two stop strings, the one that ends first wins, then the one listed first
 * (vLLM takes the first listed that the new text completes; the two agree unless one token
 * completes both). For streaming, ft_stop_text_safe says how much can be shown: all but the
 * longest end of the text that begins a stop string, so nothing shown is ever cut later
 * (as vLLM and llama.cpp's server hold such text back).
 */
#ifndef FT_STOP_TEXT_H
#define FT_STOP_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/tokenizer.h"

/* Incremental detokenization for streaming (the prefix/read offsets of text-generation-
 * inference and vLLM's detokenize_incrementally): after each token, the text of the
 * window ids[prefix_off..] is decoded and what extends the text of ids[prefix_off..
 * read_off) is emitted, unless it ends in U+FFFD (a character whose bytes are split
 * across tokens, still incomplete). So only whole UTF-8 characters are printed, and the
 * pieces concatenate to ft_tok_decode(all ids, skip_special = 1). */
typedef struct ft_detok {
    const ft_tokenizer *tok;
    int32_t *ids;
    int64_t n, cap;
    int64_t prefix_off, read_off;
    char *piece;                /* the last emitted piece (malloc'ed, NUL-terminated) */
} ft_detok;

void ft_detok_init(ft_detok *d, const ft_tokenizer *tok);
/* Appends token id. *piece (valid until the next call) receives the newly completed
 * text, *n its length in bytes (0: nothing complete yet). Returns 0, -ENOMEM. */
int ft_detok_push(ft_detok *d, int32_t id, const char **piece, size_t *n);
/* The text still held back at the end (an incomplete character decodes as U+FFFD). */
int ft_detok_flush(ft_detok *d, const char **piece, size_t *n);
void ft_detok_free(ft_detok *d); /* NULL-safe */

typedef struct ft_stop_text {
    ft_detok dt;
    char *buf;                  /* the text so far (NUL-terminated), cut before a matched stop
                                 * string; malloc'ed */
    size_t len, cap;
    size_t shown;               /* bytes of buf the caller has shown (ft_stop_text_safe) */
    int hit;                    /* index of the stop string that ended the reply, -1: none */
} ft_stop_text;

/* An empty text decoding with tok (kept by pointer). */
void ft_stop_text_init(ft_stop_text *x, const ft_tokenizer *tok);
/* NULL-safe; leaves x empty with hit = -1 (init again before reuse). */
void ft_stop_text_free(ft_stop_text *x);

/* Appends the text piece[0..n) and searches the stop strings stop[0..n_stop) (non-empty,
 * NUL-terminated) where a new match can be: the text before the piece holds none, so a match
 * ends inside the piece. On a match the text is cut before the string that ends first (ties:
 * the first listed) and x->hit names it; after that nothing is appended. Returns 0 or
 * -ENOMEM. */
int ft_stop_text_append(ft_stop_text *x, const char *const *stop, int64_t n_stop,
                        const char *piece, size_t n);
/* Token t of the reply: the text it completes (ft_detok_push), appended as above. */
int ft_stop_text_push(ft_stop_text *x, const char *const *stop, int64_t n_stop, int32_t t);
/* At the end of the reply: the text the detokenizer still holds (an incomplete character
 * decodes as U+FFFD), appended as above. */
int ft_stop_text_flush(ft_stop_text *x, const char *const *stop, int64_t n_stop);

/* The bytes of x->buf that can be shown now: all of it when `final` (the reply ended) or a
 * stop string matched; otherwise all but its longest end that is a proper prefix of some
 * stop string (the next tokens may complete it). Never less than a previous answer. */
size_t ft_stop_text_safe(const ft_stop_text *x, const char *const *stop, int64_t n_stop,
                         int final);

/* The text as a malloc'ed NUL-terminated string into *out ("" when empty). Returns 0 or
 * -ENOMEM. */
int ft_stop_text_take(const ft_stop_text *x, char **out);

#endif
