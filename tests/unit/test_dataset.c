/* test_dataset.c - data sets (src/data/dataset.h): schema detection, chat rendering and loss
 * masks on the real Llama-2/Llama-3 tokenizers, errors with file and line, skip-bad-records,
 * truncation, deterministic shuffle and eval split, an eval set from its own file
 * (ft_dataset_load_eval, checked whole under its cap), several training files
 * (ft_dataset_load_files), each example's origin (file, record, truncated), and padding-free
 * packing invariants with the map from each micro-batch back to its examples (ex_index).
 * tests/ref/test_chat_ref.py checks ids and masks against jinja2 + `tokenizers`.
 * Run from the repository root. */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/unit/data_fixture.h"
#include "tests/unit/tok_template.h"

#include <cjson/cJSON.h>

#define LLAMA2_DIR "tests/fixtures/tokenizers/llama2"
#define LLAMA3_DIR "tests/fixtures/tokenizers/llama3"
#define SEED_JSONL "examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl"
#define ZH_JSON "examples/data/alpaca-zh/alpaca_zh_1000.json"

static ft_tokenizer *L2, *L3;

static int group_setup(void **state)
{
    if (ft_tok_load_dir(&L2, LLAMA2_DIR) < 0 || ft_tok_load_dir(&L3, LLAMA3_DIR) < 0) {
        fprintf(stderr, "tokenizer fixtures: %s\n", ft_errmsg());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    ft_tok_free(L2);
    ft_tok_free(L3);
    return 0;
}

static ft_data_cfg cfg_plain(void)
{
    ft_data_cfg c;
    memset(&c, 0, sizeof c);
    c.seq_len = INT64_MAX;
    c.no_shuffle = 1;
    return c;
}

static char *write_str(const char *name, const char *s)
{
    char *p = t_write_tmp(name, s, strlen(s));
    assert_non_null(p);
    return p;
}

static void test_schemas_detected(void **state)
{
    static const struct { const char *rec; int format; } cases[] = {
        {"{\"instruction\":\"Add 2 and 3.\",\"input\":\"\",\"output\":\"5\"}", FT_DATA_ALPACA},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello!\"}]}", FT_DATA_MESSAGES},
        {"{\"conversations\":[{\"from\":\"human\",\"value\":\"Hi\"},{\"from\":\"gpt\",\"value\":\"Hello!\"}]}", FT_DATA_SHAREGPT},
        {"{\"prompt\":\"The sky is\",\"completion\":\" blue.\"}", FT_DATA_PROMPT_COMPLETION},
        {"{\"text\":\"Once upon a time.\"}", FT_DATA_TEXT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s\n%s\n", cases[i].rec, cases[i].rec);
        char *p = write_str("d.jsonl", buf);
        ft_data_cfg c = cfg_plain();
        ft_dataset ds;
        int rc = ft_dataset_load(&ds, p, &c, L3);
        if (rc) fprintf(stderr, "case %zu: %s\n", i, ft_errmsg());
        assert_int_equal(rc, 0);
        assert_int_equal(ds.format, cases[i].format);
        assert_int_equal(ds.n_records, 2);
        assert_int_equal(ds.n_train, 2);
        assert_true(ds.train[0].n > 2);
        ft_dataset_free(&ds);
        free(p);
    }
}

/* Llama-3 template: only the assistant content and <|eot_id|> are trained; BOS once. */
static void test_llama3_mask(void **state)
{
    const char *rec = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                      "{\"role\":\"user\",\"content\":\"What is 2+2?\"},"
                      "{\"role\":\"assistant\",\"content\":\"  4  \"},"
                      "{\"role\":\"user\",\"content\":\"And 3+3?\"},"
                      "{\"role\":\"assistant\",\"content\":\"6\",\"weight\":0},"
                      "{\"role\":\"user\",\"content\":\"And 4+4?\"},"
                      "{\"role\":\"assistant\",\"content\":\"8\"}]}";
    ft_example ex;
    assert_int_equal(ft_dataset_encode_record(&ex, rec, FT_DATA_AUTO, FT_CHAT_AUTO, 0, L3), 0);
    assert_int_equal(ex.ids[0], ft_tok_bos(L3));
    assert_int_not_equal(ex.ids[1], ft_tok_bos(L3));
    char *s = trained_text(L3, &ex);
    /* trim() removes the spaces; the weight-0 turn is not trained */
    assert_string_equal(s, "4<|eot_id|>8<|eot_id|>");
    free(s);
    char *all;
    assert_int_equal(ft_tok_decode(L3, ex.ids, ex.n, 0, &all), 0);
    assert_non_null(strstr(all, "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"));
    free(all);
    free(ex.ids);
    free(ex.labels);

    /* --train-on-prompt trains every token */
    assert_int_equal(ft_dataset_encode_record(&ex, rec, FT_DATA_AUTO, FT_CHAT_AUTO, 1, L3), 0);
    for (int64_t i = 0; i < ex.n; i++) assert_int_equal(ex.labels[i], ex.ids[i]);
    free(ex.ids);
    free(ex.labels);
}

/* Alpaca prompt on the Llama-2 tokenizer: BOS from the post-processor, output + </s> trained. */
static void test_alpaca_prompt_mask(void **state)
{
    const char *rec = "{\"instruction\":\"Name a colour.\",\"input\":\"Sky\",\"output\":\"Blue.\"}";
    ft_example ex;
    assert_int_equal(ft_dataset_encode_record(&ex, rec, FT_DATA_AUTO, FT_CHAT_ALPACA, 0, L2), 0);
    assert_int_equal(ex.ids[0], ft_tok_bos(L2));
    assert_int_equal(ex.ids[ex.n - 1], ft_tok_eos(L2));
    char *s = trained_text(L2, &ex);
    assert_string_equal(s, "Blue.</s>");
    free(s);
    char *all;
    assert_int_equal(ft_tok_decode(L2, ex.ids, ex.n, 1, &all), 0);
    assert_non_null(strstr(all, "### Input:\nSky\n\n### Response:Blue."));
    free(all);
    free(ex.ids);
    free(ex.labels);

    /* the Llama-2 [INST] template (its tokenizer_config has none, so it is forced) */
    assert_int_equal(ft_dataset_encode_record(&ex, rec, FT_DATA_AUTO, FT_CHAT_LLAMA2, 0, L2), 0);
    s = trained_text(L2, &ex);
    assert_string_equal(s, "Blue. </s>");
    free(s);
    free(ex.ids);
    free(ex.labels);
}

/* Text and prompt/completion append EOS once (TRL); prompt tokens are not trained. */
static void test_text_and_completion(void **state)
{
    ft_example ex;
    assert_int_equal(ft_dataset_encode_record(&ex, "{\"prompt\":\"The sky is\",\"completion\":\" blue.\"}",
                                              FT_DATA_AUTO, FT_CHAT_AUTO, 0, L2), 0);
    char *s = trained_text(L2, &ex);
    assert_string_equal(s, "blue.</s>");
    free(s);
    assert_int_equal(ex.labels[0], FT_IGNORE_INDEX);
    free(ex.ids);
    free(ex.labels);
    assert_int_equal(ft_dataset_encode_record(&ex, "{\"text\":\"Hello world</s>\"}", FT_DATA_AUTO,
                                              FT_CHAT_AUTO, 0, L2), 0);
    int eos = 0;
    for (int64_t i = 0; i < ex.n; i++) eos += ex.ids[i] == ft_tok_eos(L2);
    assert_int_equal(eos, 1);
    assert_int_equal(ex.labels[ex.n - 1], ft_tok_eos(L2));
    free(ex.ids);
    free(ex.labels);
}

static void expect_error_t(const char *name, const char *content, const ft_tokenizer *t,
                           int tmpl, const char *needle)
{
    char *p = write_str(name, content);
    ft_data_cfg c = cfg_plain();
    c.chat_template = tmpl;
    ft_dataset ds;
    int rc = ft_dataset_load(&ds, p, &c, t);
    printf("  %-12s -> %s\n", name, ft_errmsg());
    assert_true(rc < 0);
    assert_non_null(strstr(ft_errmsg(), p));
    if (!strstr(ft_errmsg(), needle)) fail_msg("'%s' not in '%s'", needle, ft_errmsg());
    free(p);
}

static void expect_error(const char *name, const char *content, const ft_tokenizer *t,
                         const char *needle)
{
    expect_error_t(name, content, t, FT_CHAT_AUTO, needle);
}

static void test_errors_name_file_and_line(void **state)
{
    const char *good = "{\"instruction\":\"a\",\"input\":\"\",\"output\":\"b\"}\n";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s{\"instruction\": \"a\", \"output\": \n%s", good, good, good);
    expect_error("bad3.jsonl", buf, L3, "line 3: malformed JSON");
    expect_error("empty.jsonl", "", L3, "no records");
    expect_error("blank.jsonl", "\n  \n", L3, "no records");
    expect_error("schema.jsonl", "{\"foo\":1,\"bar\":2}\n", L3, "line 1: unknown data schema (keys 'foo', 'bar')");
    snprintf(buf, sizeof buf, "%s{\"instruction\":\"a\",\"input\":\"\"}\n", good);
    expect_error("field.jsonl", buf, L3, "line 2: alpaca record needs a string 'output'");
    expect_error("role.jsonl", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}\n", L3,
                 "line 1: message 0: unknown role 'wizard'");
    expect_error("arr.json", "[{\"text\":\"a\"}, 5]", L3, "record 2: a record must be a JSON object");
    expect_error("arr2.json", "[{\"text\":\"a\"},\n {\"text\": }]", L3, "line 2, column");
    expect_error_t("alt.jsonl", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},{\"role\":\"assistant\",\"content\":\"c\"}]}",
                   L2, FT_CHAT_LLAMA2, "line 1: message 1: the llama2 template needs roles that alternate");

    ft_data_cfg c = cfg_plain();
    ft_dataset ds;
    assert_int_equal(ft_dataset_load(&ds, "/nonexistent/data.jsonl", &c, L3), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "/nonexistent/data.jsonl"));
}

static void test_skip_bad_records(void **state)
{
    const char *good = "{\"instruction\":\"a\",\"input\":\"\",\"output\":\"b\"}\n";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s{oops\n%s{\"instruction\":\"x\"}\n%s", good, good, good);
    char *p = write_str("skip.jsonl", buf);
    ft_data_cfg c = cfg_plain();
    c.skip_bad_records = 1;
    ft_dataset ds;
    assert_int_equal(ft_dataset_load(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_records, 5);
    assert_int_equal(ds.n_skipped, 2);
    assert_int_equal(ds.n_train, 3);
    ft_dataset_free(&ds);
    free(p);
}

/* The real data sets: every record loads; a JSON array file; truncation. */
static void test_real_data(void **state)
{
    ft_data_cfg c = cfg_plain();
    ft_dataset ds;
    assert_int_equal(ft_dataset_load(&ds, SEED_JSONL, &c, L3), 0);
    assert_int_equal(ds.n_records, 175);
    assert_int_equal(ds.n_train, 175);
    assert_int_equal(ds.format, FT_DATA_ALPACA);
    assert_int_equal(ds.chat_template, FT_CHAT_LLAMA3);
    ft_dataset_free(&ds);

    assert_int_equal(ft_dataset_load(&ds, ZH_JSON, &c, L2), 0);
    assert_int_equal(ds.n_records, 1000);
    assert_int_equal(ds.chat_template, FT_CHAT_ALPACA);
    int64_t longest = 0;
    for (int64_t i = 0; i < ds.n_train; i++) longest = ds.train[i].n > longest ? ds.train[i].n : longest;
    ft_dataset_free(&ds);

    c.seq_len = 96;
    assert_int_equal(ft_dataset_load(&ds, ZH_JSON, &c, L2), 0);
    printf("  alpaca-zh: longest %lld tokens; at 96: %lld truncated, %lld dropped\n",
           (long long)longest, (long long)ds.n_truncated, (long long)ds.n_dropped);
    assert_true(longest > 96);
    assert_true(ds.n_truncated > 0);
    for (int64_t i = 0; i < ds.n_train; i++) assert_true(ds.train[i].n <= 96);
    assert_int_equal(ds.n_skipped, 0);
    assert_true(ds.n_dropped > 0);
    assert_int_equal(ds.n_train + ds.n_dropped, 1000);
    ft_dataset_free(&ds);
}

static void test_shuffle_and_split(void **state)
{
    ft_data_cfg c = cfg_plain();
    c.no_shuffle = 0;
    c.eval_fraction = 0.1;
    c.seed = 7;
    ft_dataset a, b, d;
    assert_int_equal(ft_dataset_load(&a, SEED_JSONL, &c, L3), 0);
    assert_int_equal(ft_dataset_load(&b, SEED_JSONL, &c, L3), 0);
    c.seed = 8;
    assert_int_equal(ft_dataset_load(&d, SEED_JSONL, &c, L3), 0);
    assert_int_equal(a.n_eval, 18); /* round(0.1 * 175) */
    assert_int_equal(a.n_train, 157);
    int same_ab = 1, same_ad = 1;
    for (int64_t i = 0; i < a.n_train; i++) {
        same_ab &= a.train[i].n == b.train[i].n && !memcmp(a.train[i].ids, b.train[i].ids, (size_t)a.train[i].n * 4);
        same_ad &= a.train[i].n == d.train[i].n && !memcmp(a.train[i].ids, d.train[i].ids, (size_t)a.train[i].n * 4);
    }
    assert_true(same_ab);
    assert_false(same_ad);
    ft_dataset_free(&a);
    ft_dataset_free(&b);
    ft_dataset_free(&d);
    c.eval_max = 5;
    assert_int_equal(ft_dataset_load(&a, SEED_JSONL, &c, L3), 0);
    assert_int_equal(a.n_eval, 5);
    ft_dataset_free(&a);
    c.eval_fraction = 0.9;
    assert_int_equal(ft_dataset_load(&a, SEED_JSONL, &c, L3), FT_E_RANGE);
}

/* ft_dataset_load_eval: a held-out file of its own, in file order, capped by eval_max,
 * with its own schema detection and counts; errors name the eval file and line. */
static void test_eval_file(void **state)
{
    static const char *const recs[] = {
        "{\"instruction\":\"Add 2 and 3.\",\"input\":\"\",\"output\":\"5\"}",
        "{\"instruction\":\"Name a colour.\",\"input\":\"\",\"output\":\"Blue.\"}",
        "{\"instruction\":\"Translate.\",\"input\":\"chat\",\"output\":\"cat\"}",
        "{\"instruction\":\"Capital of France?\",\"input\":\"\",\"output\":\"Paris\"}",
        "{\"instruction\":\"Opposite of hot?\",\"input\":\"\",\"output\":\"Cold\"}",
    };
    const int64_t N = (int64_t)(sizeof recs / sizeof *recs);
    char buf[2048] = "";
    for (int64_t i = 0; i < N; i++) {
        strcat(buf, recs[i]);
        strcat(buf, "\n");
    }
    char *p = write_str("eval.jsonl", buf);
    ft_data_cfg c = cfg_plain();
    c.no_shuffle = 0; /* ignored: the eval file keeps its order */
    c.seed = 7;
    c.eval_fraction = 0.5; /* ignored: nothing is split */
    ft_dataset ds;
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_records, N);
    assert_int_equal(ds.n_eval, N);
    assert_int_equal(ds.n_train, 0);
    assert_null(ds.train);
    assert_int_equal(ds.n_skipped, 0);
    assert_int_equal(ds.eval_capped, 0);
    assert_int_equal(ds.format, FT_DATA_ALPACA);
    assert_int_equal(ds.chat_template, FT_CHAT_LLAMA3);
    for (int64_t i = 0; i < N; i++) { /* file order, encoded as the training file would be */
        ft_example ex;
        assert_int_equal(ft_dataset_encode_record(&ex, recs[i], FT_DATA_AUTO, FT_CHAT_AUTO, 0, L3), 0);
        assert_int_equal(ds.eval[i].n, ex.n);
        assert_memory_equal(ds.eval[i].ids, ex.ids, (size_t)ex.n * sizeof *ex.ids);
        assert_memory_equal(ds.eval[i].labels, ex.labels, (size_t)ex.n * sizeof *ex.labels);
        free(ex.ids);
        free(ex.labels);
    }
    int32_t first2[2][64];
    int64_t first2_n[2] = {ds.eval[0].n, ds.eval[1].n};
    assert_true(first2_n[0] <= 64 && first2_n[1] <= 64);
    memcpy(first2[0], ds.eval[0].ids, (size_t)first2_n[0] * 4);
    memcpy(first2[1], ds.eval[1].ids, (size_t)first2_n[1] * 4);
    ft_dataset_free(&ds);

    /* eval_max: the first N in file order; the rest is read and checked, not kept */
    c.eval_max = 2;
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_eval, 2);
    assert_int_equal(ds.n_records, N);
    assert_int_equal(ds.eval_capped, N - 2);
    assert_int_equal(ds.n_files, 1);
    assert_int_equal(ds.files[0].n_examples, 2);
    assert_int_equal(ds.files[0].n_over_cap, N - 2);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ds.eval[k].n, first2_n[k]);
        assert_memory_equal(ds.eval[k].ids, first2[k], (size_t)first2_n[k] * 4);
    }
    ft_dataset_free(&ds);
    c.eval_max = N; /* exactly N: nothing left over */
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_eval, N);
    assert_int_equal(ds.eval_capped, 0);
    ft_dataset_free(&ds);
    free(p);

    /* a bad record after the cap is still reported with its line (the whole file is
     * checked), or skipped and counted with skip_bad_records */
    snprintf(buf, sizeof buf, "%s\n%s\n%s\n\n{\"instruction\":\"x\",\"input\":\"\"}\n%s\n{oops\n",
             recs[0], recs[1], recs[2], recs[3]);
    p = write_str("late_bad_eval.jsonl", buf);
    c.eval_max = 2;
    int rc = ft_dataset_load_eval(&ds, p, &c, L3);
    printf("  bad record after --eval-max -> %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), p));
    assert_non_null(strstr(ft_errmsg(), "line 5: alpaca record needs a string 'output'"));
    assert_null(ds.eval);
    c.skip_bad_records = 1;
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_records, 6);
    assert_int_equal(ds.n_skipped, 2); /* line 5 and the malformed line 7 */
    assert_int_equal(ds.n_eval, 2);
    assert_int_equal(ds.eval_capped, 2); /* recs[2], recs[3] */
    for (int k = 0; k < 2; k++) assert_memory_equal(ds.eval[k].ids, first2[k], (size_t)first2_n[k] * 4);
    ft_dataset_free(&ds);
    free(p);

    /* its own schema (messages, a JSON array) while the training file is alpaca; the
     * training file itself is not split when eval_fraction is 0 */
    c = cfg_plain();
    c.no_shuffle = 0;
    ft_dataset tr;
    assert_int_equal(ft_dataset_load(&tr, SEED_JSONL, &c, L3), 0);
    assert_int_equal(tr.n_train, 175);
    assert_int_equal(tr.n_eval, 0);
    assert_int_equal(tr.format, FT_DATA_ALPACA);
    ft_dataset_free(&tr);
    p = write_str("eval.json", "[{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                                "{\"role\":\"assistant\",\"content\":\"Hello!\"}]},\n"
                                " {\"messages\":[{\"role\":\"user\",\"content\":\"Bye\"},"
                                "{\"role\":\"assistant\",\"content\":\"See you.\"}]}]");
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.format, FT_DATA_MESSAGES);
    assert_int_equal(ds.n_eval, 2);
    assert_int_equal(ds.n_records, 2);
    ft_dataset_free(&ds);
    free(p);

    /* an error names the eval file and the line; skip_bad_records counts it instead */
    snprintf(buf, sizeof buf, "%s\n%s\n{\"instruction\":\"x\",\"input\":\"\"}\n%s\n", recs[0],
             recs[1], recs[2]);
    p = write_str("bad_eval.jsonl", buf);
    c = cfg_plain();
    rc = ft_dataset_load_eval(&ds, p, &c, L3);
    printf("  bad eval file -> %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), p));
    assert_non_null(strstr(ft_errmsg(), "line 3: alpaca record needs a string 'output'"));
    assert_int_equal(ds.n_eval, 0);
    assert_null(ds.eval);
    c.skip_bad_records = 1;
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_records, 4);
    assert_int_equal(ds.n_skipped, 1);
    assert_int_equal(ds.n_eval, 3);
    ft_dataset_free(&ds);
    free(p);
    c = cfg_plain();
    assert_int_equal(ft_dataset_load_eval(&ds, "/nonexistent/eval.jsonl", &c, L3), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "/nonexistent/eval.jsonl"));

    /* truncation to seq_len and dropping, counted for this file */
    c.seq_len = 96;
    assert_int_equal(ft_dataset_load_eval(&ds, ZH_JSON, &c, L2), 0);
    assert_int_equal(ds.n_records, 1000);
    assert_true(ds.n_truncated > 0 && ds.n_dropped > 0);
    assert_int_equal(ds.n_eval + ds.n_dropped, 1000);
    for (int64_t i = 0; i < ds.n_eval; i++) assert_true(ds.eval[i].n <= 96);
    ft_dataset_free(&ds);
}

static int same_example(const ft_example *a, const ft_example *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids) &&
           !memcmp(a->labels, b->labels, (size_t)a->n * sizeof *a->labels);
}

/* Several training files (ft_dataset_load_files): each its own schema, examples joined in
 * the order given, the shuffle and split over the union (so two halves of a file give
 * exactly what the whole file gives), per-file counts, errors naming the file. */
static void test_several_files(void **state)
{
    /* an alpaca JSONL file and a messages JSON array: each detected on its own */
    char *a = write_str("mix_a.jsonl", "{\"instruction\":\"Add 2 and 3.\",\"input\":\"\",\"output\":\"5\"}\n"
                                       "{oops\n"
                                       "{\"instruction\":\"Name a colour.\",\"input\":\"\",\"output\":\"Blue.\"}\n");
    char *b = write_str("mix_b.json", "[{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                                      "{\"role\":\"assistant\",\"content\":\"Hello!\"}]},\n"
                                      " {\"messages\":[{\"role\":\"user\",\"content\":\"Bye\"},"
                                      "{\"role\":\"assistant\",\"content\":\"See you.\"}]},\n"
                                      " {\"messages\":[{\"role\":\"user\",\"content\":\"Why?\"},"
                                      "{\"role\":\"assistant\",\"content\":\"Because.\"}]}]");
    ft_data_cfg c = cfg_plain();
    c.skip_bad_records = 1;
    ft_dataset da, db, ab, ba;
    assert_int_equal(ft_dataset_load(&da, a, &c, L3), 0);
    assert_int_equal(ft_dataset_load(&db, b, &c, L3), 0);
    const char *const pab[] = {a, b}, *const pba[] = {b, a};
    assert_int_equal(ft_dataset_load_files(&ab, pab, 2, &c, L3), 0);
    assert_int_equal(ft_dataset_load_files(&ba, pba, 2, &c, L3), 0);
    assert_int_equal(ab.n_files, 2);
    assert_int_equal(ab.files[0].format, FT_DATA_ALPACA);
    assert_int_equal(ab.files[1].format, FT_DATA_MESSAGES);
    assert_int_equal(ab.format, FT_DATA_AUTO); /* mixed */
    assert_int_equal(ab.files[0].n_records, 3);
    assert_int_equal(ab.files[0].n_skipped, 1);
    assert_int_equal(ab.files[0].n_examples, 2);
    assert_int_equal(ab.files[1].n_records, 3);
    assert_int_equal(ab.files[1].n_examples, 3);
    assert_int_equal(ab.n_records, 6);
    assert_int_equal(ab.n_skipped, 1);
    assert_int_equal(ab.n_train, 5);
    for (int64_t i = 0; i < 2; i++) { /* file order, then the next file */
        assert_true(same_example(&ab.train[i], &da.train[i]));
        assert_true(same_example(&ba.train[3 + i], &da.train[i]));
    }
    for (int64_t i = 0; i < 3; i++) {
        assert_true(same_example(&ab.train[2 + i], &db.train[i]));
        assert_true(same_example(&ba.train[i], &db.train[i]));
    }
    ft_dataset_free(&da);
    ft_dataset_free(&db);
    ft_dataset_free(&ab);
    ft_dataset_free(&ba);

    /* an explicit --data-format applies to every file: the messages file fails, named */
    c.skip_bad_records = 0;
    c.format = FT_DATA_ALPACA;
    const char *const pa_only[] = {SEED_JSONL, b};
    int rc = ft_dataset_load_files(&ab, pa_only, 2, &c, L3);
    printf("  forced alpaca on a messages file -> %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), b));
    assert_non_null(strstr(ft_errmsg(), "record 1: alpaca record needs a string 'instruction'"));
    assert_int_equal(ab.n_train, 0);
    assert_null(ab.files);
    c.format = FT_DATA_AUTO;

    /* an error in the second file names it and the line; a missing one names it */
    rc = ft_dataset_load_files(&ab, pba, 2, &c, L3);
    printf("  bad line in the second file -> %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), a));
    assert_non_null(strstr(ft_errmsg(), "line 2: malformed JSON"));
    const char *const pmiss[] = {b, "/nonexistent/second.jsonl"};
    assert_int_equal(ft_dataset_load_files(&ab, pmiss, 2, &c, L3), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "/nonexistent/second.jsonl"));
    /* a file with nothing usable is an error, as it is alone */
    char *bad = write_str("mix_bad.jsonl", "{oops\n");
    const char *const pbad[] = {b, bad};
    c.skip_bad_records = 1;
    assert_int_equal(ft_dataset_load_files(&ab, pbad, 2, &c, L3), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), bad));
    assert_non_null(strstr(ft_errmsg(), "no usable records"));
    c.skip_bad_records = 0;
    free(bad);
    free(a);
    free(b);

    /* the shuffle and eval split run over the union: the file cut in two halves (given in
     * order) gives exactly the whole file's train and eval examples */
    char *whole_txt;
    size_t whole_n;
    FILE *f = fopen(SEED_JSONL, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    whole_n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    whole_txt = malloc(whole_n + 1);
    assert_int_equal(fread(whole_txt, 1, whole_n, f), whole_n);
    fclose(f);
    whole_txt[whole_n] = 0;
    char *cut = whole_txt;
    for (int k = 0; k < 100; k++) cut = strchr(cut, '\n') + 1; /* after line 100 */
    char *h2 = write_str("half2.jsonl", cut);
    *cut = 0;
    char *h1 = write_str("half1.jsonl", whole_txt);
    free(whole_txt);
    c = cfg_plain();
    c.no_shuffle = 0;
    c.seed = 11;
    c.eval_fraction = 0.1;
    ft_dataset whole, halves, swapped;
    const char *const ph[] = {h1, h2}, *const phs[] = {h2, h1};
    assert_int_equal(ft_dataset_load(&whole, SEED_JSONL, &c, L3), 0);
    assert_int_equal(ft_dataset_load_files(&halves, ph, 2, &c, L3), 0);
    assert_int_equal(ft_dataset_load_files(&swapped, phs, 2, &c, L3), 0);
    assert_int_equal(halves.files[0].n_examples, 100);
    assert_int_equal(halves.files[1].n_examples, 75);
    assert_int_equal(halves.n_train, whole.n_train);
    assert_int_equal(halves.n_eval, whole.n_eval);
    assert_int_equal(whole.n_eval, 18);
    int same_swapped = 1;
    for (int64_t i = 0; i < whole.n_train; i++) {
        assert_true(same_example(&halves.train[i], &whole.train[i]));
        same_swapped &= same_example(&swapped.train[i], &whole.train[i]);
    }
    for (int64_t i = 0; i < whole.n_eval; i++) assert_true(same_example(&halves.eval[i], &whole.eval[i]));
    assert_false(same_swapped); /* the order of the files matters */
    ft_dataset_free(&whole);
    ft_dataset_free(&halves);
    ft_dataset_free(&swapped);
    free(h1);
    free(h2);
}

/* The alpaca-zh file at seq_len 128 with bad records skipped, the packing tests' data. */
static void load_zh_128(ft_dataset *ds)
{
    ft_data_cfg c = cfg_plain();
    c.seq_len = 128;
    c.skip_bad_records = 1;
    assert_int_equal(ft_dataset_load(ds, ZH_JSON, &c, L2), 0);
}

/* Packing: every example exactly once, budget kept, positions/seq_start/targets right. */
static void test_pack_invariants(void **state)
{
    ft_dataset ds;
    load_zh_128(&ds);
    const int64_t rows = 3, L = 128;
    ft_batch *b, *b2;
    int64_t nb, nb2;
    assert_int_equal(ft_batch_pack(&b, &nb, ds.train, ds.n_train, L, rows, 1), 0);
    int64_t total = 0, want_targets = 0;
    for (int64_t i = 0; i < ds.n_train; i++) {
        total += ds.train[i].n;
        for (int64_t k = 1; k < ds.train[i].n; k++) want_targets += ds.train[i].labels[k] != FT_IGNORE_INDEX;
    }
    int64_t got_T = 0, got_targets = 0, n_seq = 0;
    for (int64_t i = 0; i < nb; i++) {
        assert_true(b[i].T <= rows * L && b[i].T > 0);
        got_T += b[i].T;
        int64_t nt = 0;
        for (int64_t t = 0; t < b[i].T; t++) {
            if (b[i].pos[t] == 0) {
                assert_int_equal(b[i].seq_start[t], t);
                n_seq++;
            } else {
                assert_int_equal(b[i].pos[t], b[i].pos[t - 1] + 1);
                assert_int_equal(b[i].seq_start[t], b[i].seq_start[t - 1]);
            }
            assert_true(b[i].pos[t] < L);
            int last = t + 1 == b[i].T || b[i].pos[t + 1] == 0;
            if (last) assert_int_equal(b[i].targets[t], FT_IGNORE_INDEX);
            else if (b[i].targets[t] != FT_IGNORE_INDEX) assert_int_equal(b[i].targets[t], b[i].ids[t + 1]);
            nt += b[i].targets[t] != FT_IGNORE_INDEX;
        }
        assert_int_equal(nt, b[i].n_targets);
        got_targets += nt;
    }
    assert_int_equal(got_T, total);
    assert_int_equal(n_seq, ds.n_train);
    assert_int_equal(got_targets, want_targets);
    int64_t lower = (total + rows * L - 1) / (rows * L);
    printf("  packed %lld examples (%lld tokens) into %lld micro-batches (lower bound %lld, fill %.1f%%)\n",
           (long long)ds.n_train, (long long)total, (long long)nb, (long long)lower,
           100.0 * (double)total / (double)(nb * rows * L));
    /* first-fit-decreasing uses at most 11/9 OPT + 6/9 bins (Dosa 2007) */
    assert_true(nb <= (11 * lower) / 9 + 1);

    /* deterministic for a seed */
    assert_int_equal(ft_batch_pack(&b2, &nb2, ds.train, ds.n_train, L, rows, 1), 0);
    assert_int_equal(nb, nb2);
    for (int64_t i = 0; i < nb; i++) {
        assert_int_equal(b[i].T, b2[i].T);
        assert_memory_equal(b[i].ids, b2[i].ids, (size_t)b[i].T * 4);
    }
    ft_batches_free(b2, nb2);
    ft_batches_free(b, nb);

    /* an example longer than seq_len is refused */
    assert_int_equal(ft_batch_pack(&b, &nb, ds.train, ds.n_train, 16, 1, 1), FT_E_RANGE);
    assert_int_equal(ft_batch_pack(&b, &nb, ds.train, ds.n_train, 1, 1, 1), FT_E_INVALID);
    ft_dataset_free(&ds);
}

/* Index of micro-batch b (by its ids array, which grouping moves but never copies) in the
 * packer's order orig[0..n), or -1. */
static int64_t orig_index(const ft_batch *orig, int64_t n, const ft_batch *b)
{
    for (int64_t i = 0; i < n; i++)
        if (orig[i].ids == b->ids) return i;
    return -1;
}

/* The mean over full steps of group micro-batches of (max cost - min cost) within the step. */
static double mean_step_spread(const ft_batch *b, int64_t n, int64_t group, double w)
{
    double sum = 0;
    int64_t steps = n / group;
    for (int64_t s = 0; s < steps; s++) {
        double lo = 1e300, hi = -1e300;
        for (int64_t j = 0; j < group; j++) {
            double c = ft_batch_cost(&b[s * group + j], w);
            lo = c < lo ? c : lo;
            hi = c > hi ? c : hi;
        }
        sum += hi - lo;
    }
    return steps ? sum / (double)steps : 0.0;
}

/* ft_batch_group_by_cost: a permutation of the packed micro-batches; within each window of
 * FT_BATCH_GROUP_STEPS steps the steps hold consecutive runs of the cost order (no two steps'
 * cost ranges interleave); the short last step holds the last window's cheapest; each step's
 * spread of cost well below the packer's order; a function of (order, group, weight, seed);
 * group 1 a no-op; bad arguments refused, the order kept. */
static void test_group_by_cost(void **state)
{
    ft_dataset ds;
    load_zh_128(&ds);
    const double w = 1.4;
    const int64_t groups[] = {2, 3, 4};
    for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++) {
        const int64_t group = groups[gi];
        ft_batch *b, *orig, *b2;
        int64_t nb, nb2;
        assert_int_equal(ft_batch_pack(&b, &nb, ds.train, ds.n_train, 128, 1, 3), 0);
        assert_true(nb > group * FT_BATCH_GROUP_STEPS); /* more than one window */
        orig = malloc((size_t)nb * sizeof *orig);
        assert_non_null(orig);
        memcpy(orig, b, (size_t)nb * sizeof *b);
        const double before = mean_step_spread(b, nb, group, w);
        assert_int_equal(ft_batch_group_by_cost(b, nb, group, w, 11), 0);
        /* a permutation */
        char *seen = calloc((size_t)nb, 1);
        assert_non_null(seen);
        for (int64_t i = 0; i < nb; i++) {
            int64_t k = orig_index(orig, nb, &b[i]);
            assert_true(k >= 0 && !seen[k]);
            seen[k] = 1;
        }
        free(seen);
        /* steps of a window: cost ranges that do not interleave */
        const int64_t W = group * FT_BATCH_GROUP_STEPS, full = nb / group;
        for (int64_t s = 0; s < full; s++)
            for (int64_t t = s + 1; t < full && t / FT_BATCH_GROUP_STEPS == s / FT_BATCH_GROUP_STEPS; t++) {
                double slo = 1e300, shi = -1e300, tlo = 1e300, thi = -1e300;
                for (int64_t j = 0; j < group; j++) {
                    double cs = ft_batch_cost(&b[s * group + j], w), ct = ft_batch_cost(&b[t * group + j], w);
                    slo = cs < slo ? cs : slo, shi = cs > shi ? cs : shi;
                    tlo = ct < tlo ? ct : tlo, thi = ct > thi ? ct : thi;
                }
                assert_true(shi <= tlo || thi <= slo);
            }
        /* the short last step: the last window's cheapest, at the end */
        if (nb % group) {
            double tail_hi = -1e300, rest_lo = 1e300;
            for (int64_t i = full * group; i < nb; i++) {
                double c = ft_batch_cost(&b[i], w);
                tail_hi = c > tail_hi ? c : tail_hi;
            }
            for (int64_t i = (nb - 1) / W * W; i < full * group; i++) {
                double c = ft_batch_cost(&b[i], w);
                rest_lo = c < rest_lo ? c : rest_lo;
            }
            assert_true(tail_hi <= rest_lo);
        }
        const double after = mean_step_spread(b, nb, group, w);
        printf("  group %lld: %lld micro-batches, mean cost spread within a step %.1f -> %.1f\n",
               (long long)group, (long long)nb, before, after);
        assert_true(after < 0.5 * before);
        /* the same for the same input and seed; another seed, another order of the steps */
        assert_int_equal(ft_batch_pack(&b2, &nb2, ds.train, ds.n_train, 128, 1, 3), 0);
        assert_int_equal(ft_batch_group_by_cost(b2, nb2, group, w, 11), 0);
        for (int64_t i = 0; i < nb; i++) assert_memory_equal(b[i].ids, b2[i].ids, (size_t)b[i].T * 4);
        ft_batches_free(b2, nb2);
        assert_int_equal(ft_batch_pack(&b2, &nb2, ds.train, ds.n_train, 128, 1, 3), 0);
        assert_int_equal(ft_batch_group_by_cost(b2, nb2, group, w, 12), 0);
        int64_t moved = 0;
        for (int64_t i = 0; i < nb; i++) moved += b[i].T != b2[i].T || memcmp(b[i].ids, b2[i].ids, (size_t)b[i].T * 4);
        assert_true(moved > 0);
        ft_batches_free(b2, nb2);
        free(orig);
        ft_batches_free(b, nb);
    }
    /* group 1: nothing to balance, the order kept; bad arguments refused */
    ft_batch *b;
    int64_t nb;
    assert_int_equal(ft_batch_pack(&b, &nb, ds.train, ds.n_train, 128, 1, 3), 0);
    int32_t *first = b[0].ids, *last = b[nb - 1].ids;
    assert_int_equal(ft_batch_group_by_cost(b, nb, 1, w, 11), 0);
    assert_int_equal(ft_batch_group_by_cost(b, nb, 0, w, 11), FT_E_INVALID);
    assert_int_equal(ft_batch_group_by_cost(b, nb, 2, -1.0, 11), FT_E_INVALID);
    assert_int_equal(ft_batch_group_by_cost(b, nb, 2, NAN, 11), FT_E_INVALID);
    assert_ptr_equal(b[0].ids, first);
    assert_ptr_equal(b[nb - 1].ids, last);
    ft_err_clear();
    ft_batches_free(b, nb);
    ft_dataset_free(&ds);
}

/* The origin of each example (ft_example.file, record, truncated): two files, a bad record
 * skipped (its index counted), a blank JSONL line (no record), a record dropped by seq_len
 * and one cut to it; kept through the shuffle; a preference record's two examples share it. */
static void test_example_origin(void **state)
{
    const char *ok = "{\"instruction\":\"Add 2 and 3.\",\"input\":\"\",\"output\":\"5\"}\n";
    char long_out[600], long_in[900], buf[4096];
    snprintf(long_out, sizeof long_out, "{\"instruction\":\"Count.\",\"input\":\"\",\"output\":\"%s\"}\n",
             "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
             "fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two");
    snprintf(long_in, sizeof long_in, "{\"instruction\":\"%s\",\"input\":\"\",\"output\":\"Yes.\"}\n",
             "Read every word of this instruction before you answer, because it is long on "
             "purpose: its answer must start past the cut, so that nothing of it is trained, "
             "and the record is dropped from the data set while still counted as a record");
    /* records: 0 ok, 1 bad, 2 long answer (cut), blank line, 3 long prompt (dropped), 4 ok */
    snprintf(buf, sizeof buf, "%s{oops\n%s\n%s%s", ok, long_out, long_in, ok);
    char *a = write_str("origin_a.jsonl", buf);
    char *b = write_str("origin_b.json", "[{\"text\":\"x\"}, {\"text\":\"y z\"}]");
    ft_data_cfg c = cfg_plain();
    c.skip_bad_records = 1;
    c.seq_len = 30; /* record 2 has 37 tokens (L3: the llama3 template), record 3 answers past 30 */
    ft_dataset ds;
    const char *const p[] = {a, b};
    assert_int_equal(ft_dataset_load_files(&ds, p, 2, &c, L3), 0);
    assert_int_equal(ds.n_skipped, 1);
    assert_int_equal(ds.n_dropped, 1);
    assert_int_equal(ds.n_train, 5);
    const int64_t want_file[] = {0, 0, 0, 1, 1}, want_rec[] = {0, 2, 4, 0, 1};
    const int32_t want_cut[] = {0, 1, 0, 0, 0};
    for (int64_t i = 0; i < ds.n_train; i++) {
        assert_int_equal(ds.train[i].file, want_file[i]);
        assert_int_equal(ds.train[i].record, want_rec[i]);
        assert_int_equal(ds.train[i].truncated, want_cut[i]);
        assert_true(ds.train[i].n <= c.seq_len);
    }
    ft_dataset_free(&ds);
    /* the shuffle and split move the origin with the example */
    c.no_shuffle = 0;
    c.seed = 3;
    c.eval_fraction = 0.4;
    assert_int_equal(ft_dataset_load_files(&ds, p, 2, &c, L3), 0);
    assert_int_equal(ds.n_train + ds.n_eval, 5);
    int seen[5] = {0};
    for (int64_t i = 0; i < ds.n_train + ds.n_eval; i++) {
        const ft_example *e = i < ds.n_train ? &ds.train[i] : &ds.eval[i - ds.n_train];
        int k = -1;
        for (int q = 0; q < 5; q++)
            if (e->file == want_file[q] && e->record == want_rec[q]) k = q;
        assert_true(k >= 0);
        seen[k]++;
        assert_int_equal(e->truncated, want_cut[k]);
    }
    for (int q = 0; q < 5; q++) assert_int_equal(seen[q], 1);
    ft_dataset_free(&ds);
    /* preference records: both examples of a pair carry its record */
    char *pr = write_str("origin_pref.jsonl",
                         "{\"prompt\": \"Hi\", \"chosen\": \" there\", \"rejected\": \" no\"}\n"
                         "{oops\n"
                         "{\"prompt\": \"Bye\", \"chosen\": \" now\", \"rejected\": \" never\"}\n");
    c = cfg_plain();
    c.preference = 1;
    c.skip_bad_records = 1;
    assert_int_equal(ft_dataset_load(&ds, pr, &c, L3), 0);
    assert_int_equal(ds.n_train, 4);
    for (int64_t i = 0; i < 4; i++) {
        assert_int_equal(ds.train[i].file, 0);
        assert_int_equal(ds.train[i].record, i < 2 ? 0 : 2);
    }
    ft_dataset_free(&ds);
    free(pr);
    free(a);
    free(b);
}

/* Each batch's ex_index maps its tokens back to the examples (ft_pack, ft_pack_pairs): every
 * example in exactly one batch, back to back in ex_index order, its tokens, positions and
 * seq_start those of its span; for several shapes and seeds. */
static void check_example_map(const ft_batch *b, int64_t nb, const ft_example *ex, int64_t n_ex)
{
    int *seen = calloc((size_t)n_ex, sizeof *seen);
    for (int64_t i = 0; i < nb; i++) {
        assert_true(b[i].n_ex >= 1);
        assert_non_null(b[i].ex_index);
        int64_t t0 = 0;
        for (int64_t k = 0; k < b[i].n_ex; k++) {
            int64_t x = b[i].ex_index[k];
            assert_true(x >= 0 && x < n_ex);
            seen[x]++;
            const ft_example *e = &ex[x];
            assert_true(t0 + e->n <= b[i].T);
            assert_memory_equal(b[i].ids + t0, e->ids, (size_t)e->n * sizeof *e->ids);
            for (int64_t t = 0; t < e->n; t++) {
                assert_int_equal(b[i].pos[t0 + t], t);
                assert_int_equal(b[i].seq_start[t0 + t], t0);
                int32_t tg = t + 1 < e->n ? e->labels[t + 1] : FT_IGNORE_INDEX;
                assert_int_equal(b[i].targets[t0 + t], tg);
            }
            t0 += e->n;
        }
        assert_int_equal(t0, b[i].T);
    }
    for (int64_t x = 0; x < n_ex; x++) assert_int_equal(seen[x], 1);
    free(seen);
}

static void test_pack_example_map(void **state)
{
    ft_dataset ds;
    load_zh_128(&ds);
    const struct { int64_t n_ex, seq_len, rows; uint64_t seed; } shapes[] = {
        {1, 128, 1, 0}, {7, 128, 1, 0}, {ds.n_train, 128, 1, 0}, {ds.n_train, 128, 3, 1},
        {ds.n_train, 256, 2, 9}, {50, 1024, 4, 2},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        ft_batch *b;
        int64_t nb;
        assert_int_equal(ft_batch_pack(&b, &nb, ds.train, shapes[k].n_ex, shapes[k].seq_len,
                                 shapes[k].rows, shapes[k].seed), 0);
        check_example_map(b, nb, ds.train, shapes[k].n_ex);
        int64_t most = 0;
        for (int64_t i = 0; i < nb; i++) most = b[i].n_ex > most ? b[i].n_ex : most;
        printf("  %lld examples, seq_len %lld, rows %lld: %lld micro-batches of up to %lld examples\n",
               (long long)shapes[k].n_ex, (long long)shapes[k].seq_len, (long long)shapes[k].rows,
               (long long)nb, (long long)most);
        ft_batches_free(b, nb);
    }
    /* preference pairs: ex_index lists 2p, 2p + 1 of each pair of pairs[] in order */
    const int64_t n_pairs = ds.n_train / 2;
    ft_batch *b;
    int64_t nb;
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ds.train, n_pairs, 128, 2, 4), 0);
    check_example_map(b, nb, ds.train, 2 * n_pairs);
    for (int64_t i = 0; i < nb; i++) {
        assert_int_equal(b[i].n_ex, 2 * b[i].n_pairs);
        for (int64_t q = 0; q < b[i].n_pairs; q++) {
            const int64_t *row = b[i].pairs + q * FT_PAIR_FIELDS;
            assert_int_equal(b[i].ex_index[2 * q], 2 * row[FT_PAIR_INDEX]);
            assert_int_equal(b[i].ex_index[2 * q + 1], 2 * row[FT_PAIR_INDEX] + 1);
        }
    }
    ft_batches_free(b, nb);
    ft_dataset_free(&ds);
}

/* Function calling (formats.md 8.1): the template variables carry the record's message
 * objects and "tools" as written (chat_jinja.c vars_of); records with tools or tool calls are
 * refused where no template can write them. */
static void test_tool_calls(void **state)
{
    /* the variables, seen through tojson: key order as written, canonical roles, content null
     * beside tool_calls (null or absent in the record), a made-up message {role, content} */
    cJSON *j = cJSON_Parse(
        "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"m\":["
        "{\"from\":\"human\",\"value\":\"hi\",\"x\":1},"
        "{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}],\"role\":\"assistant\",\"content\":null},"
        "{\"role\":\"ipython\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
        "{\"role\":\"assistant\",\"tool_calls\":[]}]}");
    assert_non_null(j);
    const cJSON *l = cJSON_GetObjectItem(j, "m");
    ft_chat_msg m[5] = {{FT_ROLE_SYSTEM, "sys", 3, NULL, 0, 0},
                        {FT_ROLE_USER, "hi", 2, NULL, 0, 0},
                        {FT_ROLE_ASSISTANT, "", 0, NULL, 0, 1},
                        {FT_ROLE_TOOL, "42", 2, NULL, 0, 0},
                        {FT_ROLE_ASSISTANT, "", 0, NULL, 0, 1}};
    for (int i = 1; i < 5; i++) m[i].json = cJSON_GetArrayItem(l, i - 1);
    ft_chat_ctx ctx = {"", "", "{{ tools | tojson }}\n{% for m in messages %}{{ m | tojson }}\n"
                       "{% endfor %}", 0, cJSON_GetObjectItem(j, "tools")};
    ft_chat_text t = {0};
    int rc = ft_chat_render_jinja(&t, m, 5, &ctx, 1);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_string_equal(t.text,
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]\n"
        "{\"role\": \"system\", \"content\": \"sys\"}\n"
        "{\"from\": \"human\", \"value\": \"hi\", \"x\": 1, \"role\": \"user\", \"content\": \"hi\"}\n"
        "{\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}], \"role\": "
        "\"assistant\", \"content\": null}\n"
        "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}\n"
        "{\"role\": \"assistant\", \"tool_calls\": [], \"content\": null}\n");
    ft_chat_text_free(&t);
    /* without tools: `tools` is None */
    ctx.tools = NULL;
    assert_int_equal(ft_chat_render_jinja(&t, m, 2, &ctx, 1), 0);
    assert_non_null(strstr(t.text, "null\n{\"role\": \"system\""));
    ft_chat_text_free(&t);
    /* what needs a template that writes tools: tools (even []), or a tool_calls key not null */
    assert_int_equal(ft_chat_uses_tools(m, 2, &ctx), 0);
    assert_int_equal(ft_chat_uses_tools(m, 3, &ctx), 1);
    assert_int_equal(ft_chat_uses_tools(m + 4, 1, &ctx), 1);
    cJSON *empty = cJSON_CreateArray(), *nul = cJSON_CreateNull();
    ctx.tools = empty;
    assert_int_equal(ft_chat_uses_tools(m, 2, &ctx), 1);
    ctx.tools = nul;
    assert_int_equal(ft_chat_uses_tools(m, 2, &ctx), 0);
    cJSON_Delete(empty);
    cJSON_Delete(nul);
    cJSON_Delete(j);

    /* records: refused without a chat_template (Llama-2 fixture), with a forced built-in that
     * is not the model's (Llama-3 fixture: llama3 detected), and malformed tools/tool_calls */
    static const char *const CALL = "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                                    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}";
    char rec[1024];
    snprintf(rec, sizeof rec, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},%s]}", CALL);
    static const struct { const char *rec; int tmpl, l3; const char *needle; } bad[] = {
        {NULL, FT_CHAT_AUTO, 0, "the tokenizer has no chat_template"},
        {"{\"tools\":[{\"type\":\"function\"}],\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
         "{\"role\":\"assistant\",\"content\":\"b\"}]}", FT_CHAT_LLAMA2, 0, "--chat-template jinja"},
        {NULL, FT_CHAT_CHATML, 1, "--chat-template auto or jinja"},
        {NULL, FT_CHAT_ALPACA, 1, "built-in alpaca template does not write; --chat-template auto"},
        {"{\"tools\":\"{}\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
         "{\"role\":\"assistant\",\"content\":\"b\"}]}", FT_CHAT_AUTO, 1, "'tools' (JSON text) must be a list"},
        {"{\"tools\":[1],\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
         "{\"role\":\"assistant\",\"content\":\"b\"}]}", FT_CHAT_AUTO, 1, "'tools' must be a list"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[{}]},"
         "{\"role\":\"assistant\",\"content\":\"b\"}]}", FT_CHAT_AUTO, 1, "message 0: 'tool_calls' must be"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
         "{\"role\":\"assistant\",\"tool_calls\":{}}]}", FT_CHAT_AUTO, 1, "message 1: 'tool_calls' must be"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
         "{\"role\":\"assistant\",\"tool_calls\":null}]}", FT_CHAT_AUTO, 1, "message 1: needs 'content'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ft_example ex;
        rc = ft_dataset_encode_record(&ex, bad[i].rec ? bad[i].rec : rec, FT_DATA_AUTO,
                                      bad[i].tmpl, 0, bad[i].l3 ? L3 : L2);
        printf("  tools %zu -> %s\n", i, ft_errmsg());
        assert_int_equal(rc, FT_E_INVALID);
        if (!strstr(ft_errmsg(), bad[i].needle)) fail_msg("'%s' not in '%s'", bad[i].needle, ft_errmsg());
        if (i < 4) assert_non_null(strstr(ft_errmsg(), "the record has 'tools' or 'tool_calls'"));
    }
    /* content absent beside tool_calls: accepted (the Llama-3 fixture's own template renders it) */
    snprintf(rec, sizeof rec, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
             "{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]},"
             "{\"role\":\"tool\",\"content\":\"1\"},{\"role\":\"assistant\",\"content\":\"b\"}]}");
    ft_example ex;
    rc = ft_dataset_encode_record(&ex, rec, FT_DATA_AUTO, FT_CHAT_AUTO, 0, L3);
    if (rc) fail_msg("%s", ft_errmsg());
    free(ex.ids);
    free(ex.labels);
}

/* LLaMA-Factory's sharegpt function calling (its data/README.md): "tools" as JSON text,
 * "function_call" turns whose value is the call as JSON text (one, or a list: parallel
 * calls), "observation" turns. Rendered by the model's template (Qwen2.5's, through the
 * engine) to the ids and labels of the same conversation written in OpenAI form; malformed
 * JSON text is refused naming 'tools' or the turn. */
static void test_llamafactory_function_call(void **state)
{
    ft_tokenizer *q = t_tok_with_template(LLAMA3_DIR, "tests/fixtures/jinja/templates/qwen2.5-instruct-chujiezheng.jinja");
    assert_int_equal(ft_chat_template_detect(q), FT_CHAT_CHATML);
#define MUL_PARAMS "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}"
#define MUL_LF "{\\\"name\\\": \\\"mul\\\", \\\"description\\\": \\\"Multiply.\\\", \\\"parameters\\\": " \
               "{\\\"type\\\": \\\"object\\\", \\\"properties\\\": {\\\"a\\\": {\\\"type\\\": \\\"integer\\\"}}}}"
    static const struct { const char *lf, *oai; } same[] = {
        /* one call; a bare schema in the tools text (wrapped as LLaMA-Factory's Qwen/Llama-3
         * formatters wrap it) */
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"17 * 19?\"}, "
         "{\"from\": \"function_call\", \"value\": \"{\\\"name\\\": \\\"mul\\\", \\\"arguments\\\": "
         "{\\\"a\\\": 17, \\\"b\\\": 19}}\"}, {\"from\": \"observation\", \"value\": \"323\"}, "
         "{\"from\": \"gpt\", \"value\": \"It is 323.\"}], \"system\": \"Be exact.\", "
         "\"tools\": \"[" MUL_LF "]\"}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"Be exact.\"}, {\"role\": \"user\", "
         "\"content\": \"17 * 19?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
         "[{\"type\": \"function\", \"function\": {\"name\": \"mul\", \"arguments\": {\"a\": 17, "
         "\"b\": 19}}}]}, {\"role\": \"tool\", \"content\": \"323\"}, {\"role\": \"assistant\", "
         "\"content\": \"It is 323.\"}], \"tools\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"mul\", \"description\": \"Multiply.\", \"parameters\": " MUL_PARAMS "}}]}"},
        /* parallel calls (a list), two observations; a schema already in OpenAI form is kept */
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"2*3, 4*5\"}, "
         "{\"from\": \"function_call\", \"value\": \"[{\\\"name\\\": \\\"mul\\\", \\\"arguments\\\": "
         "{\\\"a\\\": 2}}, {\\\"name\\\": \\\"mul\\\", \\\"arguments\\\": \\\"{\\\\\\\"a\\\\\\\": 4}\\\"}]\"}, "
         "{\"from\": \"observation\", \"value\": \"6\"}, {\"from\": \"observation\", \"value\": \"20\"}, "
         "{\"from\": \"gpt\", \"value\": \"6 and 20\"}], \"tools\": \"[{\\\"type\\\": \\\"function\\\", "
         "\\\"function\\\": " MUL_LF "}]\"}",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"2*3, 4*5\"}, {\"role\": \"assistant\", "
         "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"mul\", "
         "\"arguments\": {\"a\": 2}}}, {\"type\": \"function\", \"function\": {\"name\": \"mul\", "
         "\"arguments\": \"{\\\"a\\\": 4}\"}}]}, {\"role\": \"tool\", \"content\": \"6\"}, {\"role\": "
         "\"tool\", \"content\": \"20\"}, {\"role\": \"assistant\", \"content\": \"6 and 20\"}], "
         "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"mul\", \"description\": "
         "\"Multiply.\", \"parameters\": " MUL_PARAMS "}}]}"},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        ft_example a, b;
        int rc = ft_dataset_encode_record(&a, same[i].lf, FT_DATA_AUTO, FT_CHAT_AUTO, 0, q);
        if (rc) fail_msg("LLaMA-Factory record %zu: %s", i, ft_errmsg());
        rc = ft_dataset_encode_record(&b, same[i].oai, FT_DATA_AUTO, FT_CHAT_AUTO, 0, q);
        if (rc) fail_msg("OpenAI record %zu: %s", i, ft_errmsg());
        char *text = NULL, *tr = trained_text(q, &a);
        assert_int_equal(ft_tok_decode(q, a.ids, a.n, 0, &text), 0);
        printf("  function_call %zu: %lld tokens, trained '%s'\n", i, (long long)a.n, tr);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.ids, b.ids, (size_t)a.n * sizeof *a.ids);
        assert_memory_equal(a.labels, b.labels, (size_t)a.n * sizeof *a.labels);
        /* the template's tools block, calls and results, not the JSON text as a reply */
        assert_non_null(strstr(text, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
                                     "\"mul\", \"description\": \"Multiply.\""));
        if (i == 0) {
            assert_non_null(strstr(text, "<|im_start|>system\nBe exact.\n\n# Tools"));
            assert_non_null(strstr(text, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"mul\", "
                                         "\"arguments\": {\"a\": 17, \"b\": 19}}\n</tool_call><|im_end|>"));
            assert_non_null(strstr(text, "<|im_start|>user\n<tool_response>\n323\n</tool_response><|im_end|>"));
            /* both assistant turns trained, the call as the template writes it ("\n" after
             * "<|im_end|>" too: this Llama-3 vocabulary has no <|im_end|> token, and "|>\n" is
             * one token straddling the turn's end, so trained) */
            assert_string_equal(tr, "<tool_call>\n{\"name\": \"mul\", \"arguments\": {\"a\": 17, \"b\": 19}}"
                                    "\n</tool_call><|im_end|>\nIt is 323.<|im_end|>\n");
        } else {
            assert_non_null(strstr(text, "</tool_call>\n<tool_call>\n{\"name\": \"mul\", \"arguments\": "
                                         "\"{\\\"a\\\": 4}\"}\n</tool_call><|im_end|>"));
            assert_non_null(strstr(text, "<tool_response>\n6\n</tool_response>\n<tool_response>\n20\n"));
        }
        free(text);
        free(tr);
        free(a.ids);
        free(a.labels);
        free(b.ids);
        free(b.labels);
    }
    /* "" and "[]" tools text: none (LLaMA-Factory's default; the template's plain system turn) */
    ft_example e;
    char *text = NULL;
    assert_int_equal(ft_dataset_encode_record(&e, "{\"conversations\": [{\"from\": \"human\", \"value\": "
                     "\"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}], \"tools\": \"[]\"}",
                     FT_DATA_AUTO, FT_CHAT_AUTO, 0, q), 0);
    assert_int_equal(ft_tok_decode(q, e.ids, e.n, 0, &text), 0);
    assert_null(strstr(text, "<tools>"));
    free(text);
    free(e.ids);
    free(e.labels);

    static const struct { const char *rec, *needle; } bad[] = {
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": "
         "\"b\"}], \"tools\": \"[{\\\"name\\\": \"}", "'tools' is a string that is not valid JSON (at byte"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": "
         "\"b\"}], \"tools\": \"[1]\"}", "'tools' (JSON text) must be a list of function schemas"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": "
         "\"b\"}], \"tools\": \"[] x\"}", "'tools' is a string that is not valid JSON"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"{\\\"name\\\": \\\"mul\\\", \"}]}", "conversation turn 1: the function_call 'value' is not valid JSON"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"mul(2, 3)\"}]}", "conversation turn 1: the function_call 'value' is not valid JSON"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"{\\\"arguments\\\": {}}\"}]}", "conversation turn 1: the function_call 'value' must be"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"[{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": {}}, 2]\"}]}",
         "conversation turn 1: the function_call 'value' must be"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"[]\"}]}", "conversation turn 1: the function_call 'value' must be"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"function_call\", "
         "\"content\": {\"name\": \"f\"}}]}", "message 1: a function_call turn's 'content' must be JSON text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ft_dataset_encode_record(&e, bad[i].rec, FT_DATA_AUTO, FT_CHAT_AUTO, 0, q);
        printf("  function_call bad %zu -> %s\n", i, ft_errmsg());
        assert_int_equal(rc, FT_E_INVALID);
        if (!strstr(ft_errmsg(), bad[i].needle)) fail_msg("'%s' not in '%s'", bad[i].needle, ft_errmsg());
    }
    ft_tok_free(q);
#undef MUL_PARAMS
#undef MUL_LF
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schemas_detected),
        cmocka_unit_test(test_llama3_mask),
        cmocka_unit_test(test_alpaca_prompt_mask),
        cmocka_unit_test(test_text_and_completion),
        cmocka_unit_test(test_errors_name_file_and_line),
        cmocka_unit_test(test_skip_bad_records),
        cmocka_unit_test(test_real_data),
        cmocka_unit_test(test_shuffle_and_split),
        cmocka_unit_test(test_eval_file),
        cmocka_unit_test(test_several_files),
        cmocka_unit_test(test_pack_invariants),
        cmocka_unit_test(test_group_by_cost),
        cmocka_unit_test(test_example_origin),
        cmocka_unit_test(test_pack_example_map),
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_llamafactory_function_call),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
