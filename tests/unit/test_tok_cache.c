/* test_tok_cache.c - the word cache of the tokenizer's model step (src/tokenizer/tok_cache.c):
 * ft_tok_encode_cached gives ft_tok_encode's ids exactly, with a cache large enough to keep
 * every word and with one so small that it is emptied again and again, on the Llama-2
 * (SentencePiece-style BPE, byte fallback) and Llama-3 (byte-level BPE) tokenizers, over text
 * drawn from a pool of words, numbers, punctuation, multi-byte and invalid UTF-8, special
 * tokens written literally, and words longer than the cache takes. The piece memo
 * (ft_tok_memo): every prefix of a text encoded through a memo of the whole text gives
 * ft_tok_encode's ids of that prefix, cut at every byte (inside a UTF-8 character, inside an
 * added token, beside tokens that strip the spaces around them or match single words only),
 * and encodes fewer words than without it. */
#include "tests/unit/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/rng.h"
#include "src/tokenizer/tokenizer.h"

static const char *const POOL[] = {
    "the", " the", "The", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".",
    ",", "!", "?", "\n", "\n\n", "  ", "\t", " 12345", " 3.14159", "2026", " don't", " it's",
    " naïve", " café", " 東京", " 日本語", " 🙂", " Ελληνικά", " привет", " <|begin_of_text|>",
    " <s>", "</s>", " <|eot_id|>", "\xff\xfe", "\xc3", " supercalifragilisticexpialidocious",
    " aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "    indented", " x=y+z;", " {\"key\": [1, 2]}", " https://example.org/a?b=c", " ___",
};

/* A text of `words` words drawn from pool (malloc'ed, NUL-terminated; *n its length). */
static char *pool_text(ft_rng *r, const char *const *pool, size_t npool, size_t words, size_t *n)
{
    size_t cap = 1, k = 0;
    for (size_t i = 0; i < npool; i++) cap += strlen(pool[i]);
    char *s = malloc(cap * words);
    for (size_t i = 0; i < words; i++) {
        const char *w = pool[ft_rng_next(r) % npool];
        size_t l = strlen(w);
        memcpy(s + k, w, l);
        k += l;
    }
    s[k] = 0;
    *n = k;
    return s;
}

static char *random_text(ft_rng *r, size_t *n)
{
    const size_t words = 1 + ft_rng_next(r) % 60;
    return pool_text(r, POOL, sizeof POOL / sizeof *POOL, words, n);
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

/* A BPE tokenizer whose added tokens strip spaces ([M]: lstrip and rstrip), match whole
 * words only (cc), or are matched after normalization (<n>), with a Metaspace pre-tokenizer
 * that prepends its space to the first piece only. */
static const char MEMO_JSON[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":20,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
    "{\"id\":21,\"content\":\"[M]\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":false},"
    "{\"id\":22,\"content\":\"cc\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false},"
    "{\"id\":23,\"content\":\"<n>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\",\"prepend_scheme\":\"first\",\"split\":true},"
    "\"post_processor\":null,\"decoder\":null,"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"fuse_unk\":true,\"byte_fallback\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"abc\":4,\"?\":7,\"\u2581\":8,\"\u2581a\":9,\"\u2581ab\":10},"
    "\"merges\":[[\"a\",\"b\"],[\"ab\",\"c\"],[\"\u2581\",\"a\"],[\"\u2581a\",\"b\"]]}}";

static const char *const MEMO_POOL[] = {"a", "b", "c", "ab", " ", "  ", "<x>", "[M]", "cc",
                                        " cc ", "<n>", "<", "[", "abc", "\xc3\xa9", "\n"};

/* Every cut of texts from pool through one memo of the whole text equals ft_tok_encode of the
 * cut; the cuts taken in increasing order, then the whole text again, then cuts in a random
 * order (the memo keeps the whole text's pieces). */
static void memo_same_ids(const ft_tokenizer *t, const char *name, const char *const *pool,
                          size_t npool, int texts)
{
    ft_rng r;
    ft_rng_seed(&r, 11);
    ft_tok_memo *m = ft_tok_memo_new();
    assert_non_null(m);
    for (int it = 0; it < texts; it++) {
        size_t n;
        char *s = pool_text(&r, pool, npool, 1 + ft_rng_next(&r) % 24, &n);
        int sp = it & 1;
        ft_tok_memo_reset(m);
        for (int pass = 0; pass < 2; pass++) {
            for (size_t k = 0; k <= n + 1; k++) {
                /* k = 0 is the whole text (recorded on the first pass), then the cuts */
                size_t b = k == 0 ? n : pass == 0 ? k - 1 : ft_rng_next(&r) % (n + 1);
                int32_t *a, *c;
                int64_t na, nc;
                assert_int_equal(ft_tok_encode(t, s, b, sp, &a, &na), 0);
                assert_int_equal(ft_tok_encode_memo(t, NULL, m, s, b, sp, &c, &nc), 0);
                if (na != nc || memcmp(a, c, (size_t)na * sizeof *a))
                    fail_msg("%s: memo ids differ for the first %zu bytes of \"%s\"", name, b, s);
                free(a);
                free(c);
            }
        }
        free(s);
    }
    ft_tok_memo_free(m);
}

static void test_memo(void **state)
{
    (void)state;
    ft_tokenizer *t;
    const char *dirs[] = {"tests/fixtures/tokenizers/llama2", "tests/fixtures/tokenizers/llama3"};
    for (int d = 0; d < 2; d++) {
        assert_int_equal(ft_tok_load_dir(&t, dirs[d]), 0);
        memo_same_ids(t, dirs[d], POOL, sizeof POOL / sizeof *POOL, 24);
        ft_tok_free(t);
    }
    char dir[] = "/tmp/ftune_memo_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(MEMO_JSON, f);
    fclose(f);
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    unlink(path);
    rmdir(dir);
    memo_same_ids(t, "added-token tokenizer", MEMO_POOL, sizeof MEMO_POOL / sizeof *MEMO_POOL, 300);
    ft_tok_free(t);
}

/* The memo's point: the prefixes of a text of many pieces (turns between added tokens) reuse
 * the whole text's pieces, so the model step sees far fewer words (counted by a cache's
 * lookups); a text at another address, or longer than the recorded one, is encoded whole. */
static void test_memo_reuses(void **state)
{
    (void)state;
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, "tests/fixtures/tokenizers/llama3"), 0);
    char s[4096];
    size_t n = 0;
    for (int i = 0; i < 8; i++)
        n += (size_t)snprintf(s + n, sizeof s - n, "<|start_header_id|>user<|end_header_id|>\n\n"
                              "Question %d: what is the capital of country %d?<|eot_id|>", i, i);
    ft_tok_memo *m = ft_tok_memo_new();
    uint64_t lookups[2];
    for (int use = 0; use < 2; use++) {
        ft_tok_cache *c = ft_tok_cache_new(4096);
        int32_t *ids;
        int64_t k;
        ft_tok_memo_reset(m);
        for (size_t b = n; b > 0; b -= 37) {
            assert_int_equal(ft_tok_encode_memo(t, c, use ? m : NULL, s, b, 1, &ids, &k), 0);
            free(ids);
            if (b < 37) break;
        }
        uint64_t h, mi, re;
        ft_tok_cache_stats(c, &h, &mi, &re);
        lookups[use] = h + mi;
        ft_tok_cache_free(c);
    }
    fprintf(stderr, "model-step words for 20 prefixes: %llu without the memo, %llu with it\n",
            (unsigned long long)lookups[0], (unsigned long long)lookups[1]);
    assert_true(lookups[1] * 4 < lookups[0]);
    /* a copy of the text (another address) is not taken from the memo: still right */
    char *copy = strdup(s);
    int32_t *a, *b;
    int64_t na, nb;
    assert_int_equal(ft_tok_encode(t, copy, n / 2, 0, &a, &na), 0);
    assert_int_equal(ft_tok_encode_memo(t, NULL, m, copy, n / 2, 0, &b, &nb), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    free(a);
    free(b);
    free(copy);
    ft_tok_memo_free(m);
    ft_tok_memo_free(NULL);
    ft_tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_hits),
        cmocka_unit_test(test_memo),
        cmocka_unit_test(test_memo_reuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
