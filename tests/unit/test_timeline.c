/* test_timeline.c - step timelines (offload/timeline.h): spans added and grown past the
 * first allocation, busy time as the union of a lane's spans (overlaps counted once), the
 * step's length, and the SVG picture's structure (one <rect> per span, lane rows and labels,
 * escaped title, well-formed ending), written atomically; an unwritable path as -errno. */
#include "tests/unit/harness.h"

#include <errno.h>
#include <sys/stat.h>

#include "offload/timeline.h"
#include "src/core/err.h"

/* cmocka 1.1 has no assert_double_equal */
#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_add_busy_span(void **state)
{
    (void)state;
    ft_timeline t = {0};
    assert_int_equal(ft_timeline_span(&t), 0);
    assert_true(ft_timeline_busy(&t, FT_TL_COMPUTE) == 0);
    /* compute: [0, 1] and [0.5, 2] overlap -> [0, 2]; [3, 4] apart; [3.2, 3.5] inside it */
    assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_FWD, 0, 0, 0.0, 1.0), 0);
    assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_BWD, 1, 0, 3.2, 3.5), 0);
    assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_FWD, 1, 0, 0.5, 2.0), 0);
    assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_HEAD, -1, -1, 3.0, 4.0), 0);
    /* h2d: two touching spans [1, 2] [2, 2.5] -> 1.5 */
    assert_int_equal(ft_timeline_add(&t, FT_TL_H2D, FT_TL_WEIGHTS, 0, -1, 1.0, 2.0), 0);
    assert_int_equal(ft_timeline_add(&t, FT_TL_H2D, FT_TL_WEIGHTS, 1, -1, 2.0, 2.5), 0);
    assert_int_equal(t.n, 6);
    assert_near(ft_timeline_busy(&t, FT_TL_COMPUTE), 3.0, 1e-12);
    assert_near(ft_timeline_busy(&t, FT_TL_H2D), 1.5, 1e-12);
    assert_true(ft_timeline_busy(&t, FT_TL_D2H) == 0);
    assert_near(ft_timeline_span(&t), 4.0, 1e-12);
    /* fields kept */
    assert_int_equal(t.s[3].layer, -1);
    assert_int_equal(t.s[3].kind, FT_TL_HEAD);
    assert_int_equal(t.s[4].lane, FT_TL_H2D);
    assert_int_equal(t.s[0].micro, 0);
    /* t1 < t0 is stored as an empty span */
    assert_int_equal(ft_timeline_add(&t, FT_TL_DISK, FT_TL_WEIGHTS, 2, -1, 5.0, 4.0), 0);
    assert_true(t.s[6].t1 == t.s[6].t0);
    /* a lane outside the enum is refused */
    assert_int_equal(ft_timeline_add(&t, FT_TL_N_LANES, FT_TL_FWD, 0, 0, 0, 1), FT_E_INVALID);
    assert_int_equal(t.n, 7);

    ft_timeline_reset(&t);
    assert_int_equal(t.n, 0);
    assert_int_equal(ft_timeline_span(&t), 0);
    /* growth past the first allocation, and a brute-force union on a grid of 1/8 s cells */
    enum { N = 1000 };
    unsigned char cell[8 * 100] = {0};
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int a = (int)(x % 780), len = (int)((x >> 20) % 20);
        assert_int_equal(ft_timeline_add(&t, FT_TL_DISK, FT_TL_OTHER, i, -1, a / 8.0, (a + len) / 8.0), 0);
        for (int c = a; c < a + len; c++) cell[c] = 1;
    }
    double want = 0;
    for (size_t c = 0; c < sizeof cell; c++) want += cell[c] / 8.0;
    assert_int_equal(t.n, N);
    assert_true(t.cap >= N);
    assert_near(ft_timeline_busy(&t, FT_TL_DISK), want, 1e-9);
    ft_timeline_free(&t);
    assert_null(t.s);
    ft_timeline_free(NULL);
}

static void test_svg(void **state)
{
    (void)state;
    ft_timeline t = {0};
    int L = 4, n = 0;
    double c = 0;
    for (int l = 0; l < L; l++, n++) { /* forward, weights copied ahead */
        assert_int_equal(ft_timeline_add(&t, FT_TL_H2D, FT_TL_WEIGHTS, l, -1, c, c + 0.004), 0);
        n++;
        assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_FWD, l, 0, c + 0.004, c + 0.010), 0);
        c += 0.010;
    }
    assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_HEAD, -1, 0, c, c + 0.003), 0);
    n++;
    c += 0.003;
    for (int l = L - 1; l >= 0; l--, n++) {
        assert_int_equal(ft_timeline_add(&t, FT_TL_COMPUTE, FT_TL_BWD, l, 0, c, c + 0.012), 0);
        c += 0.012;
    }
    assert_int_equal(ft_timeline_add(&t, FT_TL_D2H, FT_TL_CKPT, 2, 0, 0.02, 0.0201), 0); /* tiny */
    n++;
    assert_int_equal(t.n, n);

    char *dir = t_tmpdir();
    assert_non_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/step.svg", dir);
    assert_int_equal(ft_timeline_write_svg(&t, path, "8B <QLoRA> & friends"), 0);
    char *s = NULL;
    size_t len = 0;
    {
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        len = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        s = calloc(1, len + 1);
        assert_int_equal(fread(s, 1, len, f), len);
        fclose(f);
    }
    assert_non_null(strstr(s, "<?xml"));
    assert_non_null(strstr(s, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(s, "</svg>\n"));
    assert_true(strstr(s, "</svg>") > strstr(s, "<svg"));
    /* one <rect> per span, each closed */
    assert_int_equal(count(s, "<rect "), n);
    assert_int_equal(count(s, "</rect>"), n);
    /* a row per lane with spans (no disk row), with names and busy fractions */
    assert_int_equal(count(s, "<g class=\"lane\""), 3);
    assert_non_null(strstr(s, "id=\"lane-compute\""));
    assert_non_null(strstr(s, "id=\"lane-h2d\""));
    assert_non_null(strstr(s, "id=\"lane-d2h\""));
    assert_null(strstr(s, "id=\"lane-disk\""));
    assert_int_equal(count(s, ">busy "), 3);
    /* compute is busy all of the step except the h2d lead-in of layer 0 */
    char want[64];
    double span = ft_timeline_span(&t), busy = ft_timeline_busy(&t, FT_TL_COMPUTE);
    snprintf(want, sizeof want, ">busy %.1f%%", 100.0 * busy / span);
    assert_non_null(strstr(s, want));
    /* the title, escaped; no raw markup from it */
    assert_non_null(strstr(s, "8B &lt;QLoRA&gt; &amp; friends"));
    assert_null(strstr(s, "<QLoRA>"));
    /* kind colors of fwd and bwd, layer labels in bars and tooltips, an ms axis */
    assert_non_null(strstr(s, "fill=\"#4e79a7\""));
    assert_non_null(strstr(s, "fill=\"#e15759\""));
    assert_non_null(strstr(s, "<title>bwd layer 3 micro 0: "));
    assert_non_null(strstr(s, "text-anchor=\"middle\" pointer-events=\"none\">3</text>"));
    assert_non_null(strstr(s, ">ms</text>"));
    assert_non_null(strstr(s, ">0</text>"));
    /* tags balance: every '<' has its '>' (text is escaped) */
    assert_int_equal(count(s, "<"), count(s, ">"));
    /* no temporary left behind */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    struct stat st;
    assert_int_equal(stat(tmp, &st), -1);
    free(s);

    /* an empty timeline still makes a picture */
    ft_timeline e = {0};
    assert_int_equal(ft_timeline_write_svg(&e, path, NULL), 0);
    assert_int_equal(stat(path, &st), 0);

    /* a folder that does not exist: -ENOENT, the message names the path */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/step.svg", dir);
    ft_err_clear();
    assert_int_equal(ft_timeline_write_svg(&t, bad, "x"), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), bad));

    unlink(path);
    rmdir(dir);
    free(dir);
    ft_timeline_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_busy_span),
        cmocka_unit_test(test_svg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
