/* test_pref_data.c - preference pairs for DPO (src/data/pref.h, dataset.h preference mode,
 * ft_pack_pairs): the TRL and LLaMA-Factory schemas split into prompt/chosen/rejected, TRL's
 * implicit-prompt extraction (the space rule, UTF-8), each side equal to the SFT encoding of
 * its prompt-completion (or alpaca/sharegpt) record on the real Llama-3 tokenizer and through
 * ChatML, bad records named by file and line, truncation and drop counts, the shuffle and
 * eval split moving whole pairs, and the pair packer's layout. Fixtures: tests/fixtures/pref.
 * Run from the repository root. */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"
#include "src/data/pref.h"
#include "src/data/records.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/unit/data_fixture.h"
#include "tests/unit/tok_template.h"

#include <cjson/cJSON.h>

#define LLAMA3_DIR "tests/fixtures/tokenizers/llama3"
#define PAIRS "tests/fixtures/pref/pairs.jsonl"
#define BAD "tests/fixtures/pref/bad.jsonl"
#define LF_SHAREGPT "tests/fixtures/pref/lf_sharegpt.json"
#define CHATML_TMPL "tests/fixtures/jinja/templates/chatref-chatml.jinja"

static ft_tokenizer *L3;

static int group_setup(void **state)
{
    if (ft_tok_load_dir(&L3, LLAMA3_DIR) < 0) {
        fprintf(stderr, "tokenizer fixture: %s\n", ft_errmsg());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    ft_tok_free(L3);
    return 0;
}

static ft_data_cfg cfg_pref(void)
{
    ft_data_cfg c;
    memset(&c, 0, sizeof c);
    c.seq_len = INT64_MAX;
    c.no_shuffle = 1;
    c.preference = 1;
    return c;
}

static void ex_free(ft_example *e)
{
    free(e->ids);
    free(e->labels);
    memset(e, 0, sizeof *e);
}

/* Line `line` (1-based) of file path, as a new string. */
static char *file_line(const char *path, int line)
{
    char *src;
    size_t n;
    assert_int_equal(ft_read_file(path, &src, &n), 0);
    char *p = src;
    for (int i = 1; i < line; i++) {
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    char *e = strchr(p, '\n');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char *out = malloc(len + 1);
    memcpy(out, p, len);
    out[len] = 0;
    free(src);
    return out;
}

static void assert_ex_equal(const ft_example *a, const ft_example *b)
{
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->ids, b->ids, (size_t)a->n * sizeof *a->ids);
    assert_memory_equal(a->labels, b->labels, (size_t)a->n * sizeof *a->labels);
}

/* Index of the first trained label (the untrained prefix's length). */
static int64_t first_trained(const ft_example *e)
{
    int64_t k = 0;
    while (k < e->n && e->labels[k] == FT_IGNORE_INDEX) k++;
    return k;
}

/* The pair of a record (JSON text) must equal the SFT encodings of sft_chosen/sft_rejected
 * (JSON text, schema format) with template tmpl; the two sides share their untrained prefix. */
static void assert_pair_is_sft(const char *rec, const char *sft_chosen, const char *sft_rejected,
                               int format, int tmpl, const ft_tokenizer *tok)
{
    ft_example p[2], s[2];
    int rc = ft_dataset_encode_pair(p, rec, tmpl, tok);
    if (rc) fail_msg("pair %s: %s", rec, ft_errmsg());
    const char *sft[2] = {sft_chosen, sft_rejected};
    for (int k = 0; k < 2; k++) {
        rc = ft_dataset_encode_record(&s[k], sft[k], format, tmpl, 0, tok);
        if (rc) fail_msg("sft %s: %s", sft[k], ft_errmsg());
        assert_ex_equal(&p[k], &s[k]);
        ex_free(&s[k]);
    }
    int64_t a = first_trained(&p[0]), b = first_trained(&p[1]);
    assert_true(a > 0 && a < p[0].n);
    assert_int_equal(a, b);
    assert_memory_equal(p[0].ids, p[1].ids, (size_t)a * sizeof *p[0].ids);
    ex_free(&p[0]);
    ex_free(&p[1]);
}

/* ---- implicit prompt: TRL extract_prompt on strings ---------------------------------------- */

static void test_common_prefix(void **state)
{
    static const struct { const char *a, *b; size_t k; } cases[] = {
        /* the space rule: the prompt ends before the space, completions start with it */
        {"Q: What is 2+2? A: 4", "Q: What is 2+2? A: 5", 18},
        {"The sky is blue.", "The sky is green.", 10},
        /* no space before the divergence */
        {"abcX", "abcY", 3},
        /* UTF-8: é (C3 A9) vs è (C3 A8) differ in their second byte: back to the first */
        {"Caf\xc3\xa9 au lait", "Caf\xc3\xa8 noir", 3},
        /* ... then the space step: "I say" */
        {"I say \xc3\xa9", "I say \xc3\xa8", 5},
        /* 3-byte characters differing in the third byte (語 E8 AA 9E, 誠 E8 AA A0) */
        {"\xe6\x97\xa5\xe8\xaa\x9e", "\xe6\x97\xa5\xe8\xaa\xa0", 3},
        /* ... and at a lead byte (語 vs 人 E4 BA BA) */
        {"\xe6\x97\xa5\xe8\xaa\x9e", "\xe6\x97\xa5\xe4\xba\xba", 3},
        /* one a prefix of the other, or equal: TRL's index stops on the shorter's last char */
        {"abc", "abcd", 2},
        {"ab c", "ab c", 3},
        {"x\xc3\xa9", "x\xc3\xa9y", 1},
        /* different at once: an empty prompt (TRL would index [-1]) */
        {"a b", "b b", 0},
        {"", "abc", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t k = ft_pref_common_prefix(cases[i].a, strlen(cases[i].a), cases[i].b, strlen(cases[i].b));
        if (k != cases[i].k) fail_msg("case %zu: %zu, expected %zu", i, k, cases[i].k);
    }
}

/* ---- the schemas: the split ------------------------------------------------------------------ */

static const cJSON *msg_content(const cJSON *list, int i)
{
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(list, i), "content");
}

static void test_split_schemas(void **state)
{
    ft_records rr;
    ft_record rec;
    assert_int_equal(ft_records_open(&rr, PAIRS), 0);
    int line = 0;
    ft_pref_rec pr;
    while (ft_records_next(&rr, &rec) == 1) {
        line++;
        assert_non_null(rec.json);
        int rc = ft_pref_split(rec.json, &pr);
        if (rc) fail_msg("line %d: %s", line, ft_errmsg());
        assert_non_null(pr.side[0]);
        assert_non_null(pr.side[1]);
        switch (line) {
        case 1:
            assert_int_equal(pr.schema, FT_PREF_TRL);
            assert_int_equal(pr.conversational, 0);
            assert_int_equal(pr.format, FT_DATA_PROMPT_COMPLETION);
            assert_string_equal(pr.prompt->valuestring, "The sky is");
            assert_string_equal(pr.chosen->valuestring, " blue.");
            assert_string_equal(pr.rejected->valuestring, " green.");
            break;
        case 3:
            assert_int_equal(pr.schema, FT_PREF_TRL_IMPLICIT);
            assert_int_equal(pr.conversational, 0);
            assert_string_equal(pr.prompt->valuestring, "Q: What is 2+2? A:");
            assert_string_equal(pr.chosen->valuestring, " 4");
            assert_string_equal(pr.rejected->valuestring, " 5");
            break;
        case 2: case 4: case 5:
            /* the same pair three ways: explicit; implicit; a string prompt beside
             * conversations (extracted, as maybe_extract_prompt does) */
            assert_int_equal(pr.schema, line == 2 ? FT_PREF_TRL : FT_PREF_TRL_IMPLICIT);
            assert_int_equal(pr.conversational, 1);
            assert_int_equal(pr.format, FT_DATA_PROMPT_COMPLETION);
            assert_int_equal(cJSON_GetArraySize(pr.prompt), 1);
            assert_string_equal(msg_content(pr.prompt, 0)->valuestring, "What color is the sky?");
            assert_int_equal(cJSON_GetArraySize(pr.chosen), 1);
            assert_string_equal(msg_content(pr.chosen, 0)->valuestring, "It is blue.");
            assert_int_equal(cJSON_GetArraySize(pr.rejected), 1);
            assert_string_equal(msg_content(pr.rejected, 0)->valuestring, "It is green.");
            /* the sides are prompt-completion records sharing the prompt */
            assert_ptr_equal(cJSON_GetObjectItemCaseSensitive(pr.side[0], "completion"), pr.chosen);
            assert_true(cJSON_Compare(cJSON_GetObjectItemCaseSensitive(pr.side[1], "prompt"), pr.prompt, 1));
            break;
        case 6: case 7:
            assert_int_equal(pr.schema, FT_PREF_LF_ALPACA);
            assert_int_equal(pr.format, FT_DATA_ALPACA);
            assert_int_equal(pr.last_only, 1);
            assert_null(pr.prompt);
            assert_string_equal(pr.chosen->valuestring, line == 6 ? "5" : "6");
            assert_string_equal(pr.rejected->valuestring, line == 6 ? "6" : "8");
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(pr.side[1], "output")->valuestring,
                                pr.rejected->valuestring);
            assert_int_equal(!!cJSON_GetObjectItemCaseSensitive(pr.side[0], "history"), line == 7);
            break;
        case 8: case 9: {
            assert_int_equal(pr.schema, FT_PREF_LF_SHAREGPT);
            assert_int_equal(pr.format, FT_DATA_SHAREGPT);
            assert_int_equal(pr.last_only, 1);
            int np = line == 8 ? 1 : 3;
            assert_int_equal(cJSON_GetArraySize(pr.prompt), np);
            const cJSON *turns = cJSON_GetObjectItemCaseSensitive(pr.side[1], "conversations");
            assert_int_equal(cJSON_GetArraySize(turns), np + 1);
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(turns, np), "value")->valuestring,
                                line == 8 ? "Go away." : "Red.");
            assert_int_equal(!!cJSON_GetObjectItemCaseSensitive(pr.side[0], "system"), line == 8);
            break;
        }
        default:
            fail_msg("unexpected line %d", line);
        }
        ft_pref_rec_free(&pr);
    }
    ft_records_close(&rr);
    assert_int_equal(line, 9);

    /* message lists: whole messages compared; chosen a prefix of rejected (TRL's index stops
     * on the shorter's last message) */
    cJSON *j = cJSON_Parse("{\"chosen\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                           "\"assistant\", \"content\": \"b\"}], \"rejected\": [{\"role\": \"user\", "
                           "\"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
                           "{\"role\": \"user\", \"content\": \"c\"}, {\"role\": \"assistant\", "
                           "\"content\": \"d\"}]}");
    assert_int_equal(ft_pref_split(j, &pr), 0);
    assert_int_equal(cJSON_GetArraySize(pr.prompt), 1);
    assert_int_equal(cJSON_GetArraySize(pr.chosen), 1);
    assert_int_equal(cJSON_GetArraySize(pr.rejected), 3);
    ft_pref_rec_free(&pr);
    cJSON_Delete(j);
    /* key order does not make messages differ (Python dict equality) */
    j = cJSON_Parse("{\"chosen\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                    "\"content\": \"b\"}], \"rejected\": [{\"content\": \"a\", \"role\": \"user\"}, "
                    "{\"role\": \"assistant\", \"content\": \"c\"}], \"tools\": [{\"type\": \"function\"}]}");
    assert_int_equal(ft_pref_split(j, &pr), 0);
    assert_int_equal(cJSON_GetArraySize(pr.prompt), 1);
    /* tools go to both sides */
    assert_non_null(cJSON_GetObjectItemCaseSensitive(pr.side[0], "tools"));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(pr.side[1], "tools"));
    ft_pref_rec_free(&pr);
    cJSON_Delete(j);
}

/* ---- token ids: each side is the SFT encoding of its record ------------------------------------ */

static void test_standard_pairs(void **state)
{
    /* TRL standard: prompt + completion + EOS, completion trained, as SFT prompt-completion */
    char *rec = file_line(PAIRS, 1);
    assert_pair_is_sft(rec, "{\"prompt\": \"The sky is\", \"completion\": \" blue.\"}",
                       "{\"prompt\": \"The sky is\", \"completion\": \" green.\"}",
                       FT_DATA_PROMPT_COMPLETION, FT_CHAT_AUTO, L3);
    ft_example p[2];
    assert_int_equal(ft_dataset_encode_pair(p, rec, FT_CHAT_AUTO, L3), 0);
    /* the shared prompt is the prompt's own tokens (BOS + "The sky is") */
    int32_t *pid;
    int64_t pn;
    assert_int_equal(ft_tok_encode(L3, "The sky is", 10, 1, &pid, &pn), 0);
    assert_int_equal(first_trained(&p[0]), pn);
    assert_memory_equal(p[1].ids, pid, (size_t)pn * sizeof *pid);
    free(pid);
    char *s = trained_text(L3, &p[1]), want[128];
    snprintf(want, sizeof want, " green.%s", ft_tok_eos_str(L3));
    assert_string_equal(s, want);
    free(s);
    ex_free(&p[0]);
    ex_free(&p[1]);
    free(rec);

    /* implicit prompt: the same as the explicit split */
    rec = file_line(PAIRS, 3);
    assert_pair_is_sft(rec, "{\"prompt\": \"Q: What is 2+2? A:\", \"completion\": \" 4\"}",
                       "{\"prompt\": \"Q: What is 2+2? A:\", \"completion\": \" 5\"}",
                       FT_DATA_PROMPT_COMPLETION, FT_CHAT_AUTO, L3);
    free(rec);
    /* a completion that already ends with EOS gets no second one (SFT rule) */
    snprintf(want, sizeof want, "{\"prompt\": \"A\", \"chosen\": \" b%s\", \"rejected\": \" c\"}",
             ft_tok_eos_str(L3));
    char sft[128];
    snprintf(sft, sizeof sft, "{\"prompt\": \"A\", \"completion\": \" b%s\"}", ft_tok_eos_str(L3));
    assert_pair_is_sft(want, sft, "{\"prompt\": \"A\", \"completion\": \" c\"}",
                       FT_DATA_PROMPT_COMPLETION, FT_CHAT_AUTO, L3);
}

static const char SKY_C[] = "{\"prompt\": [{\"role\": \"user\", \"content\": \"What color is the sky?\"}], "
                            "\"completion\": [{\"role\": \"assistant\", \"content\": \"It is blue.\"}]}";
static const char SKY_R[] = "{\"prompt\": [{\"role\": \"user\", \"content\": \"What color is the sky?\"}], "
                            "\"completion\": [{\"role\": \"assistant\", \"content\": \"It is green.\"}]}";

/* A conversational pair through ChatML (the model's template through the Jinja engine, and the
 * built-in renderer) equals the SFT prompt-completion encoding; explicit, implicit and
 * UltraFeedback-style records give the same examples. */
static void test_chatml_pairs(void **state)
{
    ft_tokenizer *q = t_tok_with_template(LLAMA3_DIR, CHATML_TMPL);
    const ft_tokenizer *toks[3] = {q, L3, L3};
    const int tmpls[3] = {FT_CHAT_AUTO, FT_CHAT_CHATML, FT_CHAT_AUTO /* llama3 */};
    for (int t = 0; t < 3; t++) {
        for (int line = 2; line <= 5; line++) {
            if (line == 3) continue;
            char *rec = file_line(PAIRS, line);
            assert_pair_is_sft(rec, SKY_C, SKY_R, FT_DATA_PROMPT_COMPLETION, tmpls[t], toks[t]);
            free(rec);
        }
    }
    char *rec = file_line(PAIRS, 2);
    ft_example p[2];
    assert_int_equal(ft_dataset_encode_pair(p, rec, FT_CHAT_AUTO, q), 0);
    char *s = trained_text(q, &p[0]);
    /* this tokenizer has no <|im_end|> token: "|>\n" is one token straddling the end of the
     * trained text, and trained by the SFT rule (dataset.c) */
    assert_string_equal(s, "It is blue.<|im_end|>\n");
    free(s);
    char *all;
    assert_int_equal(ft_tok_decode(q, p[1].ids, p[1].n, 0, &all), 0);
    assert_string_equal(all, "<|im_start|>user\nWhat color is the sky?<|im_end|>\n"
                             "<|im_start|>assistant\nIt is green.<|im_end|>\n");
    free(all);
    ex_free(&p[0]);
    ex_free(&p[1]);
    free(rec);
    /* implicit extraction leaving two turns in rejected: the later assistant turn is trained
     * too (the completion), the user turn between is not */
    assert_int_equal(ft_dataset_encode_pair(p, "{\"chosen\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                            "{\"role\": \"assistant\", \"content\": \"b\"}], \"rejected\": "
                                            "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
                                            "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"c\"}, "
                                            "{\"role\": \"assistant\", \"content\": \"d\"}]}", FT_CHAT_AUTO, q), 0);
    s = trained_text(q, &p[1]);
    assert_string_equal(s, "b<|im_end|>\nd<|im_end|>\n");
    free(s);
    ex_free(&p[0]);
    ex_free(&p[1]);
    ft_tok_free(q);
}

/* LLaMA-Factory pairwise: each side is the alpaca/sharegpt record answered by chosen/rejected;
 * only the final answer is trained (the history's answers are prompt). */
static void test_llamafactory_pairs(void **state)
{
    char *rec = file_line(PAIRS, 6);
    assert_pair_is_sft(rec, "{\"instruction\": \"Add the two numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}",
                       "{\"instruction\": \"Add the two numbers.\", \"input\": \"2 and 3\", \"output\": \"6\"}",
                       FT_DATA_ALPACA, FT_CHAT_AUTO, L3);
    assert_pair_is_sft(rec, "{\"instruction\": \"Add the two numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}",
                       "{\"instruction\": \"Add the two numbers.\", \"input\": \"2 and 3\", \"output\": \"6\"}",
                       FT_DATA_ALPACA, FT_CHAT_ALPACA, L3);
    free(rec);
    rec = file_line(PAIRS, 8);
    assert_pair_is_sft(rec, "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi, who are you?\"}, "
                       "{\"from\": \"gpt\", \"value\": \"A helpful assistant.\"}], \"system\": \"Be kind.\"}",
                       "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hi, who are you?\"}, "
                       "{\"from\": \"gpt\", \"value\": \"Go away.\"}], \"system\": \"Be kind.\"}",
                       FT_DATA_SHAREGPT, FT_CHAT_AUTO, L3);
    free(rec);

    /* with an earlier answer: the ids are the SFT record's, the labels only the last answer */
    static const struct { int line, format; const char *sft, *trained; } hist[] = {
        {7, FT_DATA_ALPACA, "{\"instruction\": \"And now multiply them.\", \"input\": \"\", \"system\": "
         "\"You are a calculator.\", \"history\": [[\"Add 2 and 3.\", \"5\"]], \"output\": \"8\"}", "8<|eot_id|>"},
        {9, FT_DATA_SHAREGPT, "{\"conversations\": [{\"from\": \"human\", \"value\": \"Name a color.\"}, "
         "{\"from\": \"gpt\", \"value\": \"Red.\"}, {\"from\": \"human\", \"value\": \"Another one?\"}, "
         "{\"from\": \"gpt\", \"value\": \"Red.\"}]}", "Red.<|eot_id|>"},
    };
    for (size_t i = 0; i < sizeof hist / sizeof *hist; i++) {
        rec = file_line(PAIRS, hist[i].line);
        ft_example p[2], s;
        assert_int_equal(ft_dataset_encode_pair(p, rec, FT_CHAT_AUTO, L3), 0);
        assert_int_equal(ft_dataset_encode_record(&s, hist[i].sft, hist[i].format, FT_CHAT_AUTO, 0, L3), 0);
        assert_int_equal(p[1].n, s.n);
        assert_memory_equal(p[1].ids, s.ids, (size_t)s.n * sizeof *s.ids);
        char *sft_tr = trained_text(L3, &s), *tr = trained_text(L3, &p[1]);
        assert_true(strlen(sft_tr) > strlen(tr)); /* SFT trains the history's answer too */
        assert_string_equal(tr, hist[i].trained);
        /* the trained tokens are the SFT ones from the final answer on */
        int64_t k = first_trained(&p[1]);
        assert_memory_equal(p[1].labels + k, s.labels + k, (size_t)(s.n - k) * sizeof *s.labels);
        int64_t a = first_trained(&p[0]);
        assert_int_equal(a, k);
        assert_memory_equal(p[0].ids, p[1].ids, (size_t)k * sizeof *p[0].ids);
        free(sft_tr);
        free(tr);
        ex_free(&p[0]);
        ex_free(&p[1]);
        ex_free(&s);
        free(rec);
    }
}

/* ---- loading ----------------------------------------------------------------------------------- */

static void test_load_fixture(void **state)
{
    ft_data_cfg c = cfg_pref();
    ft_dataset ds;
    int rc = ft_dataset_load(&ds, PAIRS, &c, L3);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ds.n_records, 9);
    assert_int_equal(ds.n_train, 18);
    assert_int_equal(ds.n_eval, 0);
    assert_int_equal(ds.files[0].n_examples, 18);
    assert_int_equal(ds.format, FT_DATA_PROMPT_COMPLETION); /* the first pair's */
    for (int line = 1; line <= 9; line++) {
        char *rec = file_line(PAIRS, line);
        ft_example p[2];
        assert_int_equal(ft_dataset_encode_pair(p, rec, FT_CHAT_AUTO, L3), 0);
        assert_ex_equal(&ds.train[2 * (line - 1)], &p[0]);
        assert_ex_equal(&ds.train[2 * (line - 1) + 1], &p[1]);
        ex_free(&p[0]);
        ex_free(&p[1]);
        free(rec);
    }
    ft_dataset_free(&ds);

    /* a forced schema or train_on_prompt is refused */
    c.format = FT_DATA_ALPACA;
    assert_int_equal(ft_dataset_load(&ds, PAIRS, &c, L3), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "a forced data format (--data-format alpaca) does not apply"));
    c = cfg_pref();
    c.train_on_prompt = 1;
    assert_int_equal(ft_dataset_load(&ds, PAIRS, &c, L3), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "train-on-prompt does not apply"));
}

static void test_bad_records(void **state)
{
    ft_data_cfg c = cfg_pref();
    ft_dataset ds;
    int rc = ft_dataset_load(&ds, BAD, &c, L3);
    printf("  %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "bad.jsonl: line 2: preference record has 'chosen' but no 'rejected'"));

    /* each bad line alone names its line and what is wrong */
    static const struct { int line; const char *needle; } bad[] = {
        {3, "bad.jsonl: line 1: 'chosen' must be a string or a list of messages (found a number)"},
        {4, "bad.jsonl: line 1: 'chosen' is a string but 'rejected' is a list of messages"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *l = file_line(BAD, bad[i].line);
        char *p = t_write_tmp("bad.jsonl", l, strlen(l));
        rc = ft_dataset_load(&ds, p, &c, L3);
        printf("  %s\n", ft_errmsg());
        assert_int_equal(rc, FT_E_INVALID);
        if (!strstr(ft_errmsg(), bad[i].needle)) fail_msg("'%s' not in '%s'", bad[i].needle, ft_errmsg());
        free(p);
        free(l);
    }

    /* skipped and counted */
    c.skip_bad_records = 1;
    rc = ft_dataset_load(&ds, BAD, &c, L3);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ds.n_records, 5);
    assert_int_equal(ds.n_skipped, 3);
    assert_int_equal(ds.n_train, 4);
    char *rec = file_line(BAD, 5);
    ft_example p[2];
    assert_int_equal(ft_dataset_encode_pair(p, rec, FT_CHAT_AUTO, L3), 0);
    assert_ex_equal(&ds.train[2], &p[0]);
    assert_ex_equal(&ds.train[3], &p[1]);
    ex_free(&p[0]);
    ex_free(&p[1]);
    free(rec);
    ft_dataset_free(&ds);

    /* a JSON array names the record; LLaMA-Factory's turn checks */
    c.skip_bad_records = 0;
    rc = ft_dataset_load(&ds, LF_SHAREGPT, &c, L3);
    printf("  %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "lf_sharegpt.json: record 2: pairwise sharegpt record "
                                        "(LLaMA-Factory): 'rejected' is a 'human' turn"));
    c.skip_bad_records = 1;
    rc = ft_dataset_load(&ds, LF_SHAREGPT, &c, L3);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ds.n_records, 3);
    assert_int_equal(ds.n_skipped, 2);
    assert_int_equal(ds.n_train, 2);
    ft_dataset_free(&ds);
    /* the conversation ending with an answer */
    cJSON *j = cJSON_Parse("{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": "
                           "\"gpt\", \"value\": \"b\"}], \"chosen\": {\"from\": \"gpt\", \"value\": \"c\"}, "
                           "\"rejected\": {\"from\": \"gpt\", \"value\": \"d\"}}");
    ft_pref_rec pr;
    assert_int_equal(ft_pref_split(j, &pr), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "ends with a 'gpt' turn"));
    assert_null(pr.side[0]);
    cJSON_Delete(j);

    /* other shapes */
    static const struct { const char *rec, *needle; } shapes[] = {
        {"{\"prompt\": \"a\", \"completion\": \"b\"}", "not a preference record: no 'chosen' and 'rejected' (keys 'prompt', 'completion')"},
        {"{\"rejected\": \"b\"}", "has 'rejected' but no 'chosen'"},
        {"[1]", "must be a JSON object"},
        {"{\"chosen\": [], \"rejected\": []}", "'chosen' is an empty list of messages"},
        {"{\"chosen\": [\"a\"], \"rejected\": [\"b\"]}", "'chosen' message 0 is a string, not a message object"},
        {"{\"prompt\": 3, \"chosen\": \"a\", \"rejected\": \"b\"}", "'prompt' must be a string or a list of messages (found a number)"},
        {"{\"instruction\": \"a\", \"chosen\": [\"x\"], \"rejected\": \"y\"}", "pairwise alpaca record (LLaMA-Factory): 'chosen' must be a string (found a list)"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}], \"chosen\": \"x\", \"rejected\": \"y\"}", "'chosen' must be a turn object"},
        {"{\"conversations\": [], \"chosen\": {}, \"rejected\": {}}", "'conversations' must be a non-empty list of turns (the prompt; found an empty list)"},
        /* a side that does not encode names it */
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"b\"}], "
         "\"rejected\": [{\"role\": \"wizard\", \"content\": \"c\"}]}", "rejected: completion message 0: unknown role 'wizard'"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        rc = ft_dataset_encode_pair(p, shapes[i].rec, FT_CHAT_AUTO, L3);
        printf("  shape %zu -> %s\n", i, ft_errmsg());
        assert_int_equal(rc, FT_E_INVALID);
        if (!strstr(ft_errmsg(), shapes[i].needle)) fail_msg("'%s' not in '%s'", shapes[i].needle, ft_errmsg());
        assert_null(p[0].ids);
        assert_null(p[1].ids);
    }
}

/* Each side cut to seq_len; a pair counted once when either side is cut, and dropped when a
 * side has no trained token left. */
static void test_truncation_and_drop(void **state)
{
    char words[400] = "", buf[2048];
    for (int i = 0; i < 40; i++) strcat(words, " word");
    snprintf(buf, sizeof buf,
             "{\"prompt\": \"Hi\", \"chosen\": \" a\", \"rejected\": \" b\"}\n"                 /* fits */
             "{\"prompt\": \"Hi\", \"chosen\": \" a\", \"rejected\": \"%s\"}\n"                  /* cut */
             "{\"prompt\": \"Hi%s\", \"chosen\": \" a\", \"rejected\": \" b\"}\n"                /* dropped */
             "{\"prompt\": \"Yo\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n",                 /* both cut */
             words, words, words, words);
    char *p = t_write_tmp("t.jsonl", buf, strlen(buf));
    ft_data_cfg c = cfg_pref();
    c.seq_len = 12;
    ft_dataset ds;
    int rc = ft_dataset_load(&ds, p, &c, L3);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ds.n_records, 4);
    assert_int_equal(ds.n_truncated, 3);
    assert_int_equal(ds.n_dropped, 1);
    assert_int_equal(ds.n_train, 6);
    for (int64_t i = 0; i < ds.n_train; i++) {
        assert_true(ds.train[i].n <= 12);
        assert_true(first_trained(&ds.train[i]) < ds.train[i].n);
    }
    assert_int_equal(ds.train[3].n, 12);
    assert_int_equal(ds.train[2].n, ds.train[0].n); /* " a" either way */
    ft_dataset_free(&ds);
    free(p);
}

/* The shuffle and eval split move whole pairs; eval_fraction and eval_max count pairs; the
 * eval file's cap counts pairs. */
static void test_split_keeps_pairs(void **state)
{
    enum { N = 40 };
    char *buf = malloc(N * 128), *w = buf;
    for (int i = 0; i < N; i++)
        w += sprintf(w, "{\"prompt\": \"Item %d:\", \"chosen\": \" yes %d\", \"rejected\": \" no %d\"}\n", i, i, i);
    char *p = t_write_tmp("s.jsonl", buf, strlen(buf));
    free(buf);
    /* the prompt of each record, to identify pairs */
    int32_t *pid[N];
    int64_t pn[N];
    for (int i = 0; i < N; i++) {
        char s[32];
        int n = snprintf(s, sizeof s, "Item %d:", i);
        assert_int_equal(ft_tok_encode(L3, s, (size_t)n, 1, &pid[i], &pn[i]), 0);
    }
    int order[3][N];
    for (int run = 0; run < 3; run++) {
        ft_data_cfg c = cfg_pref();
        c.no_shuffle = 0;
        c.eval_fraction = 0.25;
        c.seed = run == 2 ? 99 : 7;
        ft_dataset ds;
        int rc = ft_dataset_load(&ds, p, &c, L3);
        if (rc) fail_msg("%s", ft_errmsg());
        assert_int_equal(ds.n_eval, 2 * 10);
        assert_int_equal(ds.n_train, 2 * 30);
        int seen[N] = {0}, k = 0;
        for (int side = 0; side < 2; side++) {
            const ft_example *ex = side ? ds.train : ds.eval;
            int64_t n = side ? ds.n_train : ds.n_eval;
            for (int64_t i = 0; i < n; i += 2) {
                int64_t a = first_trained(&ex[i]);
                assert_int_equal(a, first_trained(&ex[i + 1]));
                assert_memory_equal(ex[i].ids, ex[i + 1].ids, (size_t)a * sizeof *ex[i].ids);
                int r = -1;
                for (int q = 0; q < N; q++)
                    if (pn[q] == a && !memcmp(pid[q], ex[i].ids, (size_t)a * sizeof *pid[q])) r = q;
                assert_true(r >= 0);
                assert_int_equal(seen[r], 0); /* no pair twice, none on both sides */
                seen[r] = 1;
                /* chosen first: " yes i" */
                char *s = trained_text(L3, &ex[i]), want[48];
                snprintf(want, sizeof want, " yes %d%s", r, ft_tok_eos_str(L3));
                assert_string_equal(s, want);
                free(s);
                order[run][k++] = r;
            }
        }
        assert_int_equal(k, N);
        ft_dataset_free(&ds);
    }
    /* the same seed gives the same order, another seed another */
    assert_memory_equal(order[0], order[1], sizeof order[0]);
    assert_memory_not_equal(order[0], order[2], sizeof order[0]);
    /* eval_max caps pairs */
    ft_data_cfg c = cfg_pref();
    c.no_shuffle = 0;
    c.eval_fraction = 0.25;
    c.eval_max = 3;
    ft_dataset ds;
    assert_int_equal(ft_dataset_load(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_eval, 6);
    assert_int_equal(ds.n_train, 2 * (N - 3));
    ft_dataset_free(&ds);
    /* an eval file: the first eval_max pairs in file order, the rest checked and counted */
    assert_int_equal(ft_dataset_load_eval(&ds, p, &c, L3), 0);
    assert_int_equal(ds.n_eval, 6);
    assert_int_equal(ds.n_train, 0);
    assert_int_equal(ds.eval_capped, 2 * (N - 3));
    assert_int_equal(ds.n_records, N);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(first_trained(&ds.eval[2 * i]), pn[i]);
        assert_memory_equal(ds.eval[2 * i + 1].ids, pid[i], (size_t)pn[i] * sizeof *pid[i]);
    }
    ft_dataset_free(&ds);
    for (int i = 0; i < N; i++) free(pid[i]);
    free(p);
}

/* ---- packing ----------------------------------------------------------------------------------- */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* n_pairs pairs of random lengths 1..seq_len with random ids and labels (some -100). */
static ft_example *rand_pairs(int64_t n_pairs, int64_t seq_len, uint64_t seed)
{
    ft_example *ex = calloc((size_t)(2 * n_pairs), sizeof *ex);
    for (int64_t i = 0; i < 2 * n_pairs; i++) {
        ex[i].n = 1 + (int64_t)(lcg(&seed) % (uint64_t)seq_len);
        ex[i].ids = malloc((size_t)ex[i].n * sizeof *ex[i].ids);
        ex[i].labels = malloc((size_t)ex[i].n * sizeof *ex[i].labels);
        for (int64_t t = 0; t < ex[i].n; t++) {
            ex[i].ids[t] = (int32_t)(lcg(&seed) % 1000);
            ex[i].labels[t] = lcg(&seed) % 3 ? ex[i].ids[t] : FT_IGNORE_INDEX;
        }
    }
    return ex;
}

static void free_examples(ft_example *ex, int64_t n)
{
    for (int64_t i = 0; i < n; i++) ex_free(&ex[i]);
    free(ex);
}

static void test_pack_pairs(void **state)
{
    const int64_t n_pairs = 57, seq_len = 24, rows = 2;
    ft_example *ex = rand_pairs(n_pairs, seq_len, 12345);
    ft_batch *b, *b2, *b3;
    int64_t nb, nb2, nb3;
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, n_pairs, seq_len, rows, 5), 0);
    int64_t total = 0;
    for (int64_t i = 0; i < 2 * n_pairs; i++) total += ex[i].n;
    assert_true(nb >= (total + 2 * rows * seq_len - 1) / (2 * rows * seq_len));
    int *seen = calloc((size_t)n_pairs, sizeof *seen);
    int64_t tokens = 0;
    for (int64_t i = 0; i < nb; i++) {
        const ft_batch *x = &b[i];
        assert_true(x->n_pairs >= 1);
        assert_non_null(x->pairs);
        assert_true(x->T <= 2 * rows * seq_len);
        assert_true(x->T <= x->rows * x->seq_len);
        int64_t off = 0, nt = 0, prev_len = INT64_MAX;
        for (int64_t k = 0; k < x->n_pairs; k++) {
            const int64_t *r = x->pairs + k * FT_PAIR_FIELDS;
            int64_t p = r[FT_PAIR_INDEX];
            assert_true(p >= 0 && p < n_pairs);
            assert_int_equal(seen[p], 0);
            seen[p] = 1;
            const ft_example *c = &ex[2 * p], *j = &ex[2 * p + 1];
            assert_int_equal(r[FT_PAIR_CHOSEN_START], off);
            assert_int_equal(r[FT_PAIR_CHOSEN_LEN], c->n);
            assert_int_equal(r[FT_PAIR_REJECTED_START], off + c->n); /* directly after */
            assert_int_equal(r[FT_PAIR_REJECTED_LEN], j->n);
            assert_true(c->n + j->n <= prev_len); /* placement order: longest first */
            prev_len = c->n + j->n;
            /* each example's ids/targets/pos/seq_start are ft_pack's for it */
            for (int s = 0; s < 2; s++) {
                const ft_example *e = s ? j : c;
                int64_t at = s ? r[FT_PAIR_REJECTED_START] : r[FT_PAIR_CHOSEN_START];
                ft_batch *one;
                int64_t n1;
                assert_int_equal(ft_batch_pack(&one, &n1, e, 1, seq_len, 1, 0), 0);
                assert_int_equal(n1, 1);
                assert_int_equal(one[0].n_pairs, 0);
                assert_null(one[0].pairs);
                assert_memory_equal(x->ids + at, one[0].ids, (size_t)e->n * sizeof *x->ids);
                assert_memory_equal(x->targets + at, one[0].targets, (size_t)e->n * sizeof *x->targets);
                assert_memory_equal(x->pos + at, one[0].pos, (size_t)e->n * sizeof *x->pos);
                for (int64_t t = 0; t < e->n; t++) assert_int_equal(x->seq_start[at + t], at);
                nt += one[0].n_targets;
                ft_batches_free(one, n1);
            }
            off += c->n + j->n;
        }
        assert_int_equal(off, x->T);
        assert_int_equal(nt, x->n_targets);
        tokens += x->T;
    }
    assert_int_equal(tokens, total);
    for (int64_t p = 0; p < n_pairs; p++) assert_int_equal(seen[p], 1);
    free(seen);

    /* deterministic by seed; another seed another order */
    assert_int_equal(ft_batch_pack_pairs(&b2, &nb2, ex, n_pairs, seq_len, rows, 5), 0);
    assert_int_equal(nb2, nb);
    int differs = 0;
    for (int64_t i = 0; i < nb; i++) {
        assert_int_equal(b2[i].n_pairs, b[i].n_pairs);
        assert_memory_equal(b2[i].pairs, b[i].pairs, (size_t)(b[i].n_pairs * FT_PAIR_FIELDS) * sizeof *b[i].pairs);
        assert_memory_equal(b2[i].ids, b[i].ids, (size_t)b[i].T * sizeof *b[i].ids);
    }
    assert_int_equal(ft_batch_pack_pairs(&b3, &nb3, ex, n_pairs, seq_len, rows, 6), 0);
    for (int64_t i = 0; i < nb && i < nb3; i++)
        differs |= b3[i].pairs[FT_PAIR_INDEX] != b[i].pairs[FT_PAIR_INDEX];
    assert_true(differs);
    ft_batches_free(b, nb);
    ft_batches_free(b2, nb2);
    ft_batches_free(b3, nb3);

    /* rows = 1 and full-length pairs: one pair per micro-batch */
    for (int64_t i = 0; i < 8; i++) {
        ex[i].ids = realloc(ex[i].ids, (size_t)seq_len * sizeof *ex[i].ids);
        ex[i].labels = realloc(ex[i].labels, (size_t)seq_len * sizeof *ex[i].labels);
        for (int64_t t = ex[i].n; t < seq_len; t++) ex[i].ids[t] = ex[i].labels[t] = 7;
        ex[i].n = seq_len;
    }
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 4, seq_len, 1, 1), 0);
    assert_int_equal(nb, 4);
    for (int64_t i = 0; i < nb; i++) {
        assert_int_equal(b[i].n_pairs, 1);
        assert_int_equal(b[i].T, 2 * seq_len);
    }
    ft_batches_free(b, nb);

    /* errors and the empty case */
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 0, seq_len, rows, 1), 0);
    assert_int_equal(nb, 0);
    assert_null(b);
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 4, seq_len, 0, 1), FT_E_INVALID);
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 4, 1, 1, 1), FT_E_INVALID);
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 4, seq_len - 1, 1, 1), FT_E_RANGE);
    assert_non_null(strstr(ft_errmsg(), "example 0 has 24 tokens"));
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ex, 4, 1 << 20, 1 << 11, 1), FT_E_RANGE);
    free_examples(ex, 2 * n_pairs);
}

/* Loaded pairs through the packer: every pair of the data set once, its examples adjacent. */
static void test_load_and_pack(void **state)
{
    ft_data_cfg c = cfg_pref();
    ft_dataset ds;
    assert_int_equal(ft_dataset_load(&ds, PAIRS, &c, L3), 0);
    ft_batch *b;
    int64_t nb;
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ds.train, ds.n_train / 2, 128, 1, 3), 0);
    int64_t pairs = 0;
    for (int64_t i = 0; i < nb; i++) {
        for (int64_t k = 0; k < b[i].n_pairs; k++) {
            const int64_t *r = b[i].pairs + k * FT_PAIR_FIELDS;
            const ft_example *e = &ds.train[2 * r[FT_PAIR_INDEX] + 1];
            assert_memory_equal(b[i].ids + r[FT_PAIR_REJECTED_START], e->ids, (size_t)e->n * sizeof *e->ids);
        }
        pairs += b[i].n_pairs;
    }
    assert_int_equal(pairs, 9);
    ft_batches_free(b, nb);
    ft_dataset_free(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_common_prefix),
        cmocka_unit_test(test_split_schemas),
        cmocka_unit_test(test_standard_pairs),
        cmocka_unit_test(test_chatml_pairs),
        cmocka_unit_test(test_llamafactory_pairs),
        cmocka_unit_test(test_load_fixture),
        cmocka_unit_test(test_bad_records),
        cmocka_unit_test(test_truncation_and_drop),
        cmocka_unit_test(test_split_keeps_pairs),
        cmocka_unit_test(test_pack_pairs),
        cmocka_unit_test(test_load_and_pack),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
