/* test_stop_text.c - stop strings over a reply's text as it grows (src/model/stop_text.h):
 * a match inside one piece or across pieces, the text cut before the string, the tie rules,
 * nothing appended after a match, and the held-back end that streaming must not show yet. */
#include "tests/unit/harness.h"

#include "src/model/stop_text.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_and_cut),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
