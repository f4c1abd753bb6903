/* test_stop_text.c - stop strings over a reply's text as it grows (src/infer/stop_text.h):
 * a match inside one piece or across pieces, the text cut before the string, the tie rules,
 * nothing appended after a match, and the held-back end that streaming must not show yet. */
#include "tests/unit/harness.h"

#include "src/tokenizer/tokenizer.h"
#include "src/infer/stop_text.h"

static void feed(ft_stop_text *x, const char *const *stop, int64_t n, const char *const *pieces)
{
    for (int i = 0; pieces[i]; i++)
        assert_int_equal(ft_stop_text_append(x, stop, n, pieces[i], strlen(pieces[i])), 0);
}

static void test_match_and_cut(void **st)
{
    (void)st;
    const char *stop[] = {"###", "\nUser:"};
    ft_stop_text x;
    /* within one piece */
    ft_stop_text_init(&x, NULL);
    feed(&x, stop, 2, (const char *[]){"Hello", " world### tail", NULL});
    assert_int_equal(x.hit, 0);
    assert_string_equal(x.buf, "Hello world");
    /* nothing appended after the match */
    assert_int_equal(ft_stop_text_append(&x, stop, 2, "more###", 7), 0);
    assert_string_equal(x.buf, "Hello world");
    ft_stop_text_free(&x);
    /* across three pieces, the string's first byte in the first */
    ft_stop_text_init(&x, NULL);
    feed(&x, stop, 2, (const char *[]){"answer\n", "Us", "er: next", NULL});
    assert_int_equal(x.hit, 1);
    assert_string_equal(x.buf, "answer");
    ft_stop_text_free(&x);
    /* no match: the text kept whole */
    ft_stop_text_init(&x, NULL);
    feed(&x, stop, 2, (const char *[]){"## not", " quite #", "#", NULL});
    assert_int_equal(x.hit, -1);
    assert_string_equal(x.buf, "## not quite ##");
    char *t = NULL;
    assert_int_equal(ft_stop_text_take(&x, &t), 0);
    assert_string_equal(t, "## not quite ##");
    free(t);
    ft_stop_text_free(&x);
}

static void test_ties(void **st)
{
    (void)st;
    ft_stop_text x;
    /* one piece completes both: the one that ends first wins, whatever the order listed */
    const char *a[] = {"cdef", "bc"};
    ft_stop_text_init(&x, NULL);
    feed(&x, a, 2, (const char *[]){"a", "bcdefg", NULL});
    assert_int_equal(x.hit, 1);
    assert_string_equal(x.buf, "a");
    ft_stop_text_free(&x);
    /* the same end: the first listed */
    const char *b[] = {"xyz", "yz"};
    ft_stop_text_init(&x, NULL);
    feed(&x, b, 2, (const char *[]){"..xyz", NULL});
    assert_int_equal(x.hit, 0);
    assert_string_equal(x.buf, "..");
    ft_stop_text_free(&x);
    const char *c[] = {"yz", "xyz"};
    ft_stop_text_init(&x, NULL);
    feed(&x, c, 2, (const char *[]){"..xyz", NULL});
    assert_int_equal(x.hit, 0);
    assert_string_equal(x.buf, "..x");
    ft_stop_text_free(&x);
}

static void test_safe(void **st)
{
    (void)st;
    const char *stop[] = {"</s>", "END"};
    ft_stop_text x;
    ft_stop_text_init(&x, NULL);
    feed(&x, stop, 2, (const char *[]){"one two <", NULL});
    assert_int_equal(ft_stop_text_safe(&x, stop, 2, 0), strlen("one two ")); /* "<" held */
    x.shown = ft_stop_text_safe(&x, stop, 2, 0);
    feed(&x, stop, 2, (const char *[]){"/", NULL});
    assert_int_equal(ft_stop_text_safe(&x, stop, 2, 0), strlen("one two ")); /* "</" held */
    feed(&x, stop, 2, (const char *[]){"b> EN", NULL}); /* "</b>" is no stop string */
    assert_int_equal(x.hit, -1);
    assert_int_equal(ft_stop_text_safe(&x, stop, 2, 0), strlen("one two </b> ")); /* "EN" held */
    assert_int_equal(ft_stop_text_safe(&x, stop, 2, 1), strlen("one two </b> EN")); /* final */
    feed(&x, stop, 2, (const char *[]){"D", NULL});
    assert_int_equal(x.hit, 1);
    assert_string_equal(x.buf, "one two </b> ");
    assert_int_equal(ft_stop_text_safe(&x, stop, 2, 0), strlen("one two </b> "));
    /* never less than what was shown */
    x.shown = 5;
    assert_true(ft_stop_text_safe(&x, stop, 2, 0) >= 5);
    ft_stop_text_free(&x);
    ft_stop_text_free(NULL);
}

/* 1 when s[0..n) is whole UTF-8 characters (a cut never splits one). */
static int whole_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        const size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!L || i + L > n) return 0;
        i += L;
    }
    return 1;
}

/* Tokens whose characters are split across several of them (byte-level BPE; SentencePiece's
 * <0xHH> byte fallback): a stop string holding such characters is found at the first token
 * whose text (ft_tok_decode of the ids so far) contains it, the text cut before it; what
 * streaming may show is never cut later and never splits a character. */
static void split_chars(const char *dir)
{
    static const char *const text = "Tokyo \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80 caf\xc3\xa9 and more";
    static const char *const stops[] = {"\xe6\x9d\xb1\xe4\xba\xac", "\xe4\xba\xac \xf0\x9f\x98\x80",
                                        "\xf0\x9f\x98\x80 ca", "\xc3\xa9 and", "\xc3\xa9", "more!"};
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    int32_t *ids;
    int64_t n;
    assert_int_equal(ft_tok_encode(t, text, strlen(text), 0, &ids, &n), 0);
    for (size_t si = 0; si < sizeof stops / sizeof *stops; si++) {
        const char *stop[1] = {stops[si]};
        /* the reference: the first k whose decode contains the string */
        int64_t k_ref = -1;
        char *cut_ref = NULL;
        for (int64_t k = 1; k <= n && k_ref < 0; k++) {
            char *d;
            assert_int_equal(ft_tok_decode(t, ids, k, 1, &d), 0);
            const char *f = d ? strstr(d, stop[0]) : NULL;
            if (f) {
                k_ref = k;
                cut_ref = strndup(d, (size_t)(f - d));
            }
            free(d);
        }
        ft_stop_text x;
        ft_stop_text_init(&x, t);
        int64_t k = 0;
        size_t shown = 0;
        while (k < n && x.hit < 0) {
            assert_int_equal(ft_stop_text_push(&x, stop, 1, ids[k++]), 0);
            const size_t safe = ft_stop_text_safe(&x, stop, 1, 0);
            assert_true(safe >= shown && whole_utf8(x.buf, safe));
            shown = safe;
            x.shown = safe;
        }
        if (x.hit < 0) assert_int_equal(ft_stop_text_flush(&x, stop, 1), 0);
        if (k_ref < 0) { /* "more!" never comes: the whole text, all shown at the end */
            assert_int_equal(x.hit, -1);
            assert_string_equal(x.buf, text);
            assert_int_equal(ft_stop_text_safe(&x, stop, 1, 1), strlen(text));
        } else {
            assert_int_equal(x.hit, 0);
            assert_int_equal(k, k_ref);
            assert_string_equal(x.buf, cut_ref);
            assert_true(shown <= x.len); /* nothing shown was cut */
        }
        free(cut_ref);
        ft_stop_text_free(&x);
    }
    free(ids);
    ft_tok_free(t);
}

static void test_split_characters(void **st)
{
    (void)st;
    split_chars("tests/fixtures/tokenizers/llama3"); /* byte-level BPE */
    split_chars("tests/fixtures/tokenizers/llama2"); /* SentencePiece with byte fallback */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_and_cut),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_safe),
        cmocka_unit_test(test_split_characters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
