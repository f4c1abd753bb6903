/* test_tok_cache.c - the word cache of the tokenizer's model step (src/data/tok_cache.c):
 * ft_tok_encode_cached gives ft_tok_encode's ids exactly, with a cache large enough to keep
 * every word and with one so small that it is emptied again and again, on the Llama-2
 * (SentencePiece-style BPE, byte fallback) and Llama-3 (byte-level BPE) tokenizers, over text
 * drawn from a pool of words, numbers, punctuation, multi-byte and invalid UTF-8, special
 * tokens written literally, and words longer than the cache takes. */
#include "tests/unit/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/rng.h"
#include "src/data/tokenizer.h"

static const char *const POOL[] = {
    "the", " the", "The", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".",
    ",", "!", "?", "\n", "\n\n", "  ", "\t", " 12345", " 3.14159", "2026", " don't", " it's",
    " naïve", " café", " 東京", " 日本語", " 🙂", " Ελληνικά", " привет", " <|begin_of_text|>",
    " <s>", "</s>", " <|eot_id|>", "\xff\xfe", "\xc3", " supercalifragilisticexpialidocious",
    " aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "    indented", " x=y+z;", " {\"key\": [1, 2]}", " https://example.org/a?b=c", " ___",
};

static char *random_text(ft_rng *r, size_t *n)
{
    size_t words = 1 + ft_rng_next(r) % 60, cap = 1, k = 0;
    const size_t npool = sizeof POOL / sizeof *POOL;
    for (size_t i = 0; i < npool; i++) cap += strlen(POOL[i]);
    cap *= words; /* generous */
    char *s = malloc(cap);
    for (size_t i = 0; i < words; i++) {
        const char *w = POOL[ft_rng_next(r) % npool];
        size_t l = strlen(w);
        memcpy(s + k, w, l);
        k += l;
    }
    s[k] = 0;
    *n = k;
    return s;
}

/* expect_resets: the cache is too small for the pool; mostly_hits: a byte-level tokenizer
 * whose pre-tokenizer splits the text into words (Llama-2's tokenizer.json has none: a text
 * is one "word", cached only when short). */
static void same_ids(const char *dir, int64_t cache_words, int expect_resets, int mostly_hits)
{
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    ft_tok_cache *c = ft_tok_cache_new(cache_words);
    assert_non_null(c);
    ft_rng r;
    ft_rng_seed(&r, 7);
    int64_t total = 0;
    for (int it = 0; it < 400; it++) {
        size_t n;
        char *s = random_text(&r, &n);
        for (int sp = 0; sp < 2; sp++) {
            int32_t *a, *b;
            int64_t na, nb;
            assert_int_equal(ft_tok_encode(t, s, n, sp, &a, &na), 0);
            assert_int_equal(ft_tok_encode_cached(t, c, s, n, sp, &b, &nb), 0);
            if (na != nb || memcmp(a, b, (size_t)na * sizeof *a)) fail_msg("%s: ids differ for \"%s\"", dir, s);
            total += na;
            free(a);
            free(b);
        }
        free(s);
    }
    uint64_t hits, misses, resets;
    ft_tok_cache_stats(c, &hits, &misses, &resets);
    fprintf(stderr, "%s, cache of %lld words: %lld tokens, %llu hits, %llu misses, %llu resets\n",
            dir, (long long)cache_words, (long long)total, (unsigned long long)hits,
            (unsigned long long)misses, (unsigned long long)resets);
    assert_true(hits > 0);
    if (mostly_hits) assert_true(hits > 100 * misses); /* the pool repeats itself */
    assert_true(expect_resets ? resets > 10 : resets == 0);
    ft_tok_cache_free(c);
    ft_tok_free(t);
}

static void test_llama2(void **state)
{
    (void)state;
    same_ids("tests/fixtures/tokenizers/llama2", 10000, 0, 0);
    same_ids("tests/fixtures/tokenizers/llama2", 16, 1, 0);
}

static void test_llama3(void **state)
{
    (void)state;
    same_ids("tests/fixtures/tokenizers/llama3", 10000, 0, 1);
    same_ids("tests/fixtures/tokenizers/llama3", 16, 1, 0);
}

/* The same text through one cache twice: the second pass is all hits and gives the same ids;
 * an empty text and NULL cache work as ft_tok_encode. */
static void test_hits(void **state)
{
    (void)state;
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, "tests/fixtures/tokenizers/llama3"), 0);
    ft_tok_cache *c = ft_tok_cache_new(1000);
    const char *s = "Hello world, hello again: the world is wide.";
    int32_t *a, *b;
    int64_t na, nb;
    uint64_t h0, m0, r0, h1, m1, r1;
    assert_int_equal(ft_tok_encode_cached(t, c, s, strlen(s), 1, &a, &na), 0);
    ft_tok_cache_stats(c, &h0, &m0, &r0);
    assert_int_equal(ft_tok_encode_cached(t, c, s, strlen(s), 1, &b, &nb), 0);
    ft_tok_cache_stats(c, &h1, &m1, &r1);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    assert_int_equal(m1, m0);      /* nothing new */
    assert_true(h1 - h0 == h0 + m0); /* every word of the second pass hit */
    free(a);
    free(b);
    assert_int_equal(ft_tok_encode_cached(t, c, "", 0, 0, &a, &na), 0);
    assert_int_equal(na, 0);
    free(a);
    assert_int_equal(ft_tok_encode_cached(t, NULL, s, strlen(s), 1, &a, &na), 0);
    assert_int_equal(na, nb);
    free(a);
    ft_tok_cache_free(c);
    ft_tok_cache_free(NULL);
    ft_tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_hits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
