/* test_report.c - the HTML run report (src/train/report.h): TensorBoard's smoothing against
 * values worked by hand, a run folder of known metrics drawn as curves of the right number
 * of points (a skipped step's null loss and a torn last line left out), the summary,
 * settings of the latest checkpoint and samples shown with their text escaped, nothing
 * loaded from the network, a report of several runs (one curve per run, a pruned one
 * dashed, the params as table columns), and the errors: no metrics.jsonl, a bad line named
 * by file and line, params that are not an object. */
#include "tests/unit/harness.h"

#include <sys/stat.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/report.h"

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void put(const char *dir, const char *name, const char *txt)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
}

static char *slurp(const char *path)
{
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    char *s = malloc(len + 1);
    memcpy(s, txt, len);
    s[len] = 0;
    free(txt);
    return s;
}

/* The number of points of the polyline of series `kind` and run `run`, or -1. */
static int points(const char *html, const char *kind, const char *run)
{
    char key[256];
    snprintf(key, sizeof key, "data-series=\"%s\" data-run=\"%s\"", kind, run);
    const char *p = strstr(html, key);
    if (!p) return -1;
    const char *q = strstr(p, " points=\"") + 9; /* not data-points */
    int n = 1;
    for (; *q != '"'; q++) n += *q == ' ';
    return n;
}

static void test_smooth(void **state)
{
    (void)state;
    double y[4] = {1, 2, NAN, 4}, o[4];
    ft_report_smooth(y, 4, 0.6, o);
    /* last = 0.4; 0.4/0.4 = 1 | last = 0.24 + 0.8 = 1.04; 1.04 / (1 - 0.36) = 1.625 |
     * NaN kept | last = 0.624 + 1.6 = 2.224; 2.224 / (1 - 0.216) */
    assert_near(o[0], 1.0, 1e-12);
    assert_near(o[1], 1.625, 1e-12);
    assert_true(isnan(o[2]));
    assert_near(o[3], 2.224 / 0.784, 1e-12);
    double c[3] = {5, 5, 5};
    ft_report_smooth(c, 3, 0.6, c); /* a constant series is left as it is, in place */
    assert_true(c[0] == 5 && c[1] == 5 && c[2] == 5);
}

static const char k_metrics[] =
    "{\"step\": 0, \"eval_loss\": 3.0, \"eval_tokens\": 10, \"elapsed_s\": 0.1}\n"
    "{\"step\": 1, \"loss\": 2.9, \"lr\": 0.0001, \"grad_norm\": 1, \"tokens\": 5, \"tokens_per_s\": 100, \"elapsed_s\": 0.2, \"bad_steps\": 0}\n"
    "{\"step\": 2, \"loss\": null, \"lr\": 0.0002, \"grad_norm\": null, \"tokens\": 5, \"tokens_per_s\": 110, \"elapsed_s\": 0.3, \"skipped\": true, \"bad_steps\": 1}\n"
    "\n"
    "{\"step\": 3, \"loss\": 2.5, \"lr\": 0.0002, \"grad_norm\": 1, \"tokens\": 10, \"tokens_per_s\": 120, \"elapsed_s\": 0.4, \"bad_steps\": 1}\n"
    "{\"step\": 3, \"eval_loss\": 2.7, \"eval_tokens\": 10, \"elapsed_s\": 0.5}\n"
    "{\"step\": 4, \"loss\": 2.2, \"lr\": 0.0001, \"grad_norm\": 1, \"tokens\": 15, \"tokens_per_s\": 130, \"elapsed_s\": 0.6, \"bad_steps\": 1}\n"
    "{\"step\": 5, \"loss\": 2.0, \"lr\""; /* torn: a run in progress */

static char *make_run(void)
{
    char *dir = t_tmpdir();
    put(dir, "metrics.jsonl", k_metrics);
    put(dir, "summary.json", "{\"steps\": 4, \"final_train_loss\": 2.2, \"final_eval_loss\": 2.7, "
                             "\"best_eval_loss\": 2.7, \"data\": \"d<1>.jsonl\"}");
    put(dir, "samples.jsonl", "{\"step\": 3, \"prompt\": \"Say <script>alert(1)</script>\", \"reply\": \"ok & done\"}\n"
                              "{\"step\": 3, \"prompt\": \"Two\", \"reply\": \"2\"}\n"
                              "{\"step\": 4, \"prompt\": \"Three\", \"reply\": \"3\"}\n");
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoint-4", dir);
    assert_int_equal(ft_mkdir_p(ck), 0);
    put(ck, "trainer_state.json", "{\"step\": 4, \"config\": {\"lr\": 0.0002, \"lora_r\": 16, "
                                  "\"info\": {\"model\": \"tiny\"}}}");
    put(ck, "adapter_model.safetensors", "x");
    put(ck, "adapter_config.json", "{}");
    put(ck, "optimizer.safetensors", "x");
    return dir;
}

static void test_single_run(void **state)
{
    (void)state;
    char *dir = make_run();
    char path[4300];
    assert_int_equal(ft_report_write(dir, path, sizeof path), 0);
    char want[4300];
    snprintf(want, sizeof want, "%s/report.html", dir);
    assert_string_equal(path, want);
    char *h = slurp(path);
    const char *run = strrchr(dir, '/') + 1;
    assert_int_equal(points(h, "train_loss", run), 3); /* steps 1, 3, 4: null and torn out */
    assert_int_equal(points(h, "train_loss_smoothed", run), 3);
    assert_int_equal(points(h, "eval_loss", run), 2);
    assert_int_equal(points(h, "lr", run), 4);
    assert_int_equal(points(h, "tokens_per_s", run), 4);
    assert_int_equal(count(h, "<polyline"), 5);
    assert_int_equal(count(h, "<svg"), 4);
    assert_int_equal(count(h, "data-points=\"3\""), 2);
    assert_int_equal(count(h, "<circle class=\"marker\""), 2); /* eval points */
    /* summary, settings (nested keys flattened), samples grouped by step, escaped */
    assert_non_null(strstr(h, "<th>final_eval_loss</th><td>2.7</td>"));
    assert_non_null(strstr(h, "d&lt;1&gt;.jsonl"));
    assert_non_null(strstr(h, "<th>info.model</th><td>tiny</td>"));
    assert_non_null(strstr(h, "<th>lora_r</th><td>16</td>"));
    assert_int_equal(count(h, "<summary>step 3</summary>"), 1);
    assert_int_equal(count(h, "<summary>step 4</summary>"), 1);
    assert_non_null(strstr(h, "Say &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert_non_null(strstr(h, "ok &amp; done"));
    assert_null(strstr(h, "<script>alert"));
    /* self-contained: no script (one run has no sortable table), nothing fetched */
    assert_int_equal(count(h, "<script"), 0);
    assert_int_equal(count(h, "http://"), count(h, "http://www.w3.org/2000/svg")); /* xmlns only */
    assert_null(strstr(h, "https://"));
    assert_null(strstr(h, "<link"));
    assert_null(strstr(h, "src="));
    free(h);
    t_rmtree(dir);
}

static void test_runs(void **state)
{
    (void)state;
    char *a = make_run(), *b = make_run();
    /* b: a shorter run, pruned */
    put(b, "metrics.jsonl", "{\"step\": 1, \"loss\": 3.1, \"lr\": 0.0001, \"tokens_per_s\": 90}\n"
                            "{\"step\": 2, \"loss\": 3.0, \"lr\": 0.0002, \"tokens_per_s\": 95}\n"
                            "{\"step\": 2, \"eval_loss\": 3.2}\n");
    char out[4200];
    snprintf(out, sizeof out, "%s/sweep-report.html", a);
    ft_report_run runs[2] = {{a, "lr1e-4_r8", "completed", "{\"lr\": 0.0001, \"lora_r\": 8}"},
                             {b, "lr2e-4_r16", "pruned", "{\"lr\": 0.0002, \"lora_r\": 16, \"seed\": 3}"}};
    assert_int_equal(ft_report_write_runs(out, "sweep <1>", runs, 2), 0);
    char *h = slurp(out);
    assert_non_null(strstr(h, "<title>sweep &lt;1&gt;</title>"));
    assert_int_equal(points(h, "train_loss", "lr1e-4_r8"), 3);
    assert_int_equal(points(h, "train_loss", "lr2e-4_r16"), 2);
    assert_int_equal(points(h, "eval_loss", "lr2e-4_r16"), 1);
    assert_int_equal(points(h, "tokens_per_s", "lr2e-4_r16"), 2);
    assert_int_equal(count(h, "<polyline"), 10); /* 5 curves per run */
    assert_int_equal(count(h, "stroke-dasharray"), 5); /* the pruned run's */
    assert_non_null(strstr(h, "lr2e-4_r16 (pruned)"));
    /* the table: one row per run, params columns (union of keys), sortable by a script */
    assert_non_null(strstr(h, "<th>lr</th><th>lora_r</th><th>seed</th>"));
    assert_int_equal(count(h, "<tr><td><i class=\"sw\""), 2);
    assert_non_null(strstr(h, "<td data-v=\"16\">16</td>"));
    assert_int_equal(count(h, "<script>"), 1);
    assert_non_null(strstr(h, "table.sortable"));
    free(h);
    /* params that are not a JSON object */
    runs[1].params = "[1, 2]";
    assert_int_equal(ft_report_write_runs(out, NULL, runs, 2), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "params"));
    assert_int_equal(ft_report_write_runs(out, NULL, runs, 0), FT_E_INVALID);
    t_rmtree(a);
    t_rmtree(b);
}

static void test_errors(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_int_equal(ft_report_write(dir, NULL, 0), FT_E_NOTFOUND);
    assert_non_null(strstr(ft_errmsg(), "metrics.jsonl"));
    put(dir, "metrics.jsonl", "{\"step\": 1, \"loss\": 1}\n[1, 2]\n");
    assert_int_equal(ft_report_write(dir, NULL, 0), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "metrics.jsonl:2: not a JSON object"));
    put(dir, "metrics.jsonl", "{\"step\": 1, \"loss\": 1}\n");
    put(dir, "summary.json", "{\"steps\": ");
    assert_int_equal(ft_report_write(dir, NULL, 0), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "summary.json"));
    char p[4200];
    snprintf(p, sizeof p, "%s/report.html", dir);
    struct stat sb;
    assert_int_equal(stat(p, &sb), -1); /* nothing written on error */
    t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smooth),
        cmocka_unit_test(test_single_run),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
