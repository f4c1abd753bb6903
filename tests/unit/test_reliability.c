/* test_reliability.c - the library side of issue 31's classes 1-5, where a library function
 * is the unit: ft_json_next_nul (a NUL in a JSON string: the escape \u0000 or a raw 0 byte,
 * never a literal backslash-u0000; the top-level array element holding it), the record
 * reader's refusal of such a record (JSONL by column, JSON array by element), the special
 * ids of ft_tok_from_spec, ft_train_cfg_validate (every setting's domain, before anything is
 * loaded), ft_peft_save_values (no adapter with an inf or NaN is written) and ft_peft_open /
 * ft_peft_tensor_f64 (an adapter holding one is refused, naming the tensor). */
#include "tests/unit/harness.h"

#include <sys/stat.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/json.h"
#include "src/data/records.h"
#include "src/tokenizer/tokenizer.h"
#include "src/train/validate.h"
#include "tests/unit/model_fixture.h"

/* ---- NUL in JSON strings ------------------------------------------------------------- */

static size_t find(const char *s)
{
    return ft_json_find_nul(s, strlen(s));
}

static void test_json_nul_scan(void **state)
{
    (void)state;
    assert_int_equal(find("{\"a\": \"x\"}"), 10);                  /* none: n */
    assert_int_equal(find("{\"a\": \"x\\u0000y\"}"), 8);            /* the backslash */
    assert_int_equal(find("{\"a\": \"x\\\\u0000y\"}"), 18);         /* \\ then text: none */
    assert_int_equal(find("{\"a\": \"x\\\\\\u0000\"}"), 10);        /* \\ then \u0000 */
    assert_int_equal(find("{\"a\\u0000\": 1}"), 3);                 /* in a key too */
    assert_int_equal(find("{\"a\": \"\\\"\\u0000\"}"), 9);          /* after an escaped quote */
    assert_int_equal(find("{\"a\": 1} \\u0000"), 15);               /* outside a string: not one */
    const char raw[] = "{\"a\": \"x\0y\"}";
    assert_int_equal(ft_json_find_nul(raw, sizeof raw - 1), 8);
    /* every hit of an array, with the element holding it */
    const char arr[] = "[{\"a\": \"\\u0000\"}, [1, 2], {\"b\": [\"x\", \"y\\u0000\\u0000\"]},\0 3]";
    ft_json_nul_scan st = {0};
    int64_t elems[8];
    size_t offs[8];
    int k = 0;
    while (k < 8 && ft_json_next_nul(&st, arr, sizeof arr - 1)) {
        elems[k] = st.elem;
        offs[k++] = st.off;
    }
    assert_int_equal(k, 4);
    assert_int_equal(elems[0], 0);
    assert_int_equal(elems[1], 2);
    assert_int_equal(elems[2], 2);
    assert_int_equal(elems[3], 3); /* a raw byte after the comma: the next element's */
    assert_int_equal(offs[1] + 6, offs[2]);
    assert_int_equal(arr[offs[3]], 0);
}

static void test_records_refuse_nul(void **state)
{
    (void)state;
    const char jsonl[] = "{\"text\": \"ok\"}\n{\"text\": \"cut\\u0000here\"}\n"
                         "{\"text\": \"a \\\\u0000 b\"}\n";
    char *p = t_write_tmp("d.jsonl", jsonl, sizeof jsonl - 1);
    ft_records r;
    ft_record rec;
    assert_int_equal(ft_records_open(&r, p), 0);
    assert_int_equal(ft_records_next(&r, &rec), 1);
    assert_non_null(rec.json);
    assert_int_equal(ft_records_next(&r, &rec), 1);
    assert_null(rec.json);
    assert_int_equal(rec.loc, 2);
    assert_non_null(strstr(rec.err, "column 14: a string holds U+0000"));
    assert_int_equal(ft_records_next(&r, &rec), 1); /* a literal backslash: the whole text */
    assert_non_null(rec.json);
    assert_string_equal(cJSON_GetObjectItem(rec.json, "text")->valuestring, "a \\u0000 b");
    assert_int_equal(ft_records_next(&r, &rec), 0);
    ft_records_close(&r);
    free(p);

    const char arr[] = "[{\"text\": \"ok\"},\n {\"text\": \"x\\u0000\"},\n {\"text\": \"fine\"}]";
    p = t_write_tmp("a.json", arr, sizeof arr - 1);
    assert_int_equal(ft_records_open(&r, p), 0);
    const char *want[] = {"ok", NULL, "fine"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ft_records_next(&r, &rec), 1);
        if (want[i]) {
            assert_non_null(rec.json);
            assert_string_equal(cJSON_GetObjectItem(rec.json, "text")->valuestring, want[i]);
        } else {
            assert_null(rec.json);
            assert_non_null(strstr(rec.err, "line 2, column 13: a string holds U+0000"));
        }
    }
    assert_int_equal(ft_records_next(&r, &rec), 0);
    ft_records_close(&r);
    free(p);
}

/* ---- special ids of a tokenizer spec ------------------------------------------------------ */

static void test_spec_special_ids(void **state)
{
    (void)state;
    const char *toks[] = {"<unk>", "<s>", "</s>", "a", "b", "ab"};
    const char *merges[] = {"a b"};
    ft_tok_spec sp = {.model = "gpt2", .pre = "gpt2", .n_tokens = 6, .tokens = toks,
                      .n_merges = 1, .merges = merges, .bos_id = 1, .eos_id = 2, .unk_id = -1,
                      .pad_id = -1};
    ft_tokenizer *t;
    assert_int_equal(ft_tok_from_spec(&t, &sp), 0);
    assert_int_equal(ft_tok_eos(t), 2);
    ft_tok_free(t);
    const struct { int64_t bos, eos, unk; const char *key; } bad[] = {
        {6, 2, -1, "bos_token_id = 6"}, {1, 99999, -1, "eos_token_id = 99999"},
        {-5, 2, -1, "bos_token_id = -5"}, {1, 2, 6, "unknown_token_id = 6"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ft_tok_spec s2 = sp;
        s2.bos_id = bad[i].bos;
        s2.eos_id = bad[i].eos;
        s2.unk_id = bad[i].unk;
        assert_int_equal(ft_tok_from_spec(&t, &s2), FT_E_INVALID);
        assert_null(t);
        assert_non_null(strstr(ft_errmsg(), bad[i].key));
        assert_non_null(strstr(ft_errmsg(), "ids 0..5"));
    }
    sp.bos_id = sp.eos_id = -1; /* absent: no BOS, no EOS */
    assert_int_equal(ft_tok_from_spec(&t, &sp), 0);
    assert_int_equal(ft_tok_eos(t), -1);
    ft_tok_free(t);
    /* SPM merge priorities: a NaN one is refused by index, -inf (merged last) is a number */
    float scores[6] = {0, 0, 0, -1, -2, -0.5f};
    ft_tok_spec spm = {.model = "llama", .pre = "default", .n_tokens = 6, .tokens = toks,
                       .scores = scores, .bos_id = 1, .eos_id = 2, .unk_id = 0, .pad_id = -1};
    assert_int_equal(ft_tok_from_spec(&t, &spm), 0);
    ft_tok_free(t);
    scores[4] = -INFINITY;
    assert_int_equal(ft_tok_from_spec(&t, &spm), 0);
    ft_tok_free(t);
    scores[3] = NAN;
    assert_int_equal(ft_tok_from_spec(&t, &spm), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "tokenizer.ggml.scores[3] (token 'a') is NaN"));
}

/* ---- ft_train_cfg_validate ---------------------------------------------------------------- */

static void test_train_cfg_domains(void **state)
{
    (void)state;
    ft_train_cfg c;
    ft_train_defaults(&c);
    assert_int_equal(ft_train_cfg_validate(&c), 0);
    static const struct { const char *flag; int field; double v; } bad[] = {
        {"--adam-eps", 0, 0}, {"--adam-eps", 0, -1e-8}, {"--adam-eps", 0, NAN},
        {"--adam-beta1", 1, 1}, {"--adam-beta1", 1, -0.1}, {"--adam-beta2", 2, 1.5},
        {"--weight-decay", 3, -1}, {"--weight-decay", 3, INFINITY}, {"--max-grad-norm", 4, -1},
        {"--min-lr-ratio", 5, 1.5}, {"--warmup-ratio", 6, NAN}, {"--epochs", 7, 1e300},
        {"--lora-alpha", 8, NAN}, {"--lora-alpha", 8, 0}, {"--lora-alpha", 8, INFINITY},
        {"--lora-dropout", 9, 1}, {"--lora-dropout", 9, -0.5}, {"lora rank", 10, 0},
        {"eval fraction", 11, 0.9}, {"--lr", 12, INFINITY}, {"--seq-len", 13, -64},
        {"--batch-size", 14, 0}, {"--warmup-steps", 15, -1}, {"--eval-every", 16, -1},
        {"--max-bad-steps", 17, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ft_train_defaults(&c);
        double v = bad[i].v;
        switch (bad[i].field) {
        case 0: c.adam_eps = v; break;
        case 1: c.adam_beta1 = v; break;
        case 2: c.adam_beta2 = v; break;
        case 3: c.weight_decay = v; break;
        case 4: c.max_grad_norm = v; break;
        case 5: c.min_lr_ratio = v; break;
        case 6: c.warmup_ratio = v; break;
        case 7: c.epochs = v; break;
        case 8: c.lora.alpha = (float)v; break;
        case 9: c.lora.dropout = (float)v; break;
        case 10: c.lora.r = (int64_t)v; break;
        case 11: c.data_cfg.eval_fraction = v; break;
        case 12: c.lr = v; break;
        case 13: c.seq_len = (int64_t)v; break;
        case 14: c.batch_size = (int64_t)v; break;
        case 15: c.warmup_steps = (int64_t)v; break;
        case 16: c.eval_every = (int64_t)v; break;
        case 17: c.max_bad_steps = (int64_t)v; break;
        }
        int rc = ft_train_cfg_validate(&c);
        if (rc != FT_E_INVALID || !strstr(ft_errmsg(), bad[i].flag))
            fail_msg("%s = %g: rc %d, '%s'", bad[i].flag, v, rc, ft_errmsg());
    }
    /* the boundaries that are in the domain */
    ft_train_defaults(&c);
    c.adam_beta1 = 0;
    c.weight_decay = 0;
    c.max_grad_norm = 0;
    c.warmup_ratio = 1;
    c.min_lr_ratio = 1;
    c.lora.dropout = 0;
    c.data_cfg.eval_fraction = 0.5;
    c.seq_len = 0; /* the default */
    assert_int_equal(ft_train_cfg_validate(&c), 0);
    /* epochs is not read when max_steps is set */
    c.max_steps = 3;
    c.epochs = NAN;
    assert_int_equal(ft_train_cfg_validate(&c), 0);
}

/* ft_train_run refuses an eps of 0 before it loads or writes anything */
static void test_train_run_refuses_first(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), out[256];
    snprintf(out, sizeof out, "%s/out", dir);
    static const char *const data[] = {"examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl"};
    ft_train_cfg c;
    ft_train_defaults(&c);
    c.model = TINY;
    c.data = data;
    c.n_data = 1;
    c.out = out;
    c.adam_eps = 0;
    ft_train_result res;
    assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "--adam-eps"));
    assert_int_equal(ft_path_exists(out), 0);
    free(dir);
}

/* ---- adapters: never written, never read with an inf or NaN ------------------------------------ */

static void test_peft_nonfinite(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    const ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, (1u << FT_Q) | (1u << FT_V), 7};
    assert_int_equal(tiny_open(&m, &be, &l, 1, &lc, 3, 0.2f), 0);
    char *dir = t_tmpdir(), good[256], bad[256], cfg[300];
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(bad, sizeof bad, "%s/bad", dir);
    float *v = malloc((size_t)l.n_params * sizeof *v);
    memcpy(v, l.host, (size_t)l.n_params * sizeof *v);
    assert_int_equal(ft_peft_save_values(good, &l, v, TINY), 0);

    /* an element of layer 1's v_proj B: refused, nothing written */
    const ft_lora_linear *ll = &l.lin[1][FT_V];
    v[(ll->B - l.params) + 5] = NAN;
    assert_int_equal(ft_peft_save_values(bad, &l, v, TINY), FT_E_NUMERIC);
    assert_non_null(strstr(ft_errmsg(), "layers.1.self_attn.v_proj.lora_B.weight element 5 is NaN"));
    assert_int_equal(ft_path_exists(bad), 0);
    v[(ll->B - l.params) + 5] = 0;
    l.cfg.alpha = INFINITY; /* adapter_config.json never holds null */
    assert_int_equal(ft_peft_save_values(bad, &l, v, TINY), FT_E_NUMERIC);
    assert_non_null(strstr(ft_errmsg(), "lora_alpha inf"));
    assert_int_equal(ft_path_exists(bad), 0);
    l.cfg.alpha = 8.0f;

    /* reading: the good adapter opens and converts exactly; an inf in it is refused at open */
    ft_peft_file a;
    assert_int_equal(ft_peft_open(&a, good), 0);
    const ft_lora_linear *q = &l.lin[0][FT_Q];
    double *d = malloc((size_t)(lc.r * q->in_n) * sizeof *d);
    assert_int_equal(ft_peft_tensor_f64(&a, 0, FT_Q, 0, d), 0);
    for (int64_t i = 0; i < lc.r * q->in_n; i++) assert_true(d[i] == (double)v[(q->A - l.params) + i]);
    ft_peft_close(&a);
    v[(q->A - l.params) + 7] = INFINITY;
    assert_int_equal(ft_peft_save_values(bad, &l, v, TINY), FT_E_NUMERIC); /* as above */
    /* write the inf past the writer's check: patch the saved file's element */
    snprintf(cfg, sizeof cfg, "%s/adapter_model.safetensors", good);
    ft_st_file *st;
    assert_int_equal(ft_st_open(&st, cfg), 0);
    char key[160];
    ft_peft_key(key, sizeof key, 0, FT_Q, 'A');
    int64_t off = ft_st_find(st, key)->file_offset + 7 * 4;
    ft_st_close(st);
    FILE *f = fopen(cfg, "r+b");
    assert_non_null(f);
    float inf = INFINITY;
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    assert_int_equal(fwrite(&inf, 4, 1, f), 1);
    fclose(f);
    assert_int_equal(ft_peft_open(&a, good), FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), key));
    assert_non_null(strstr(ft_errmsg(), "element 7 is infinite"));
    assert_non_null(strstr(ft_errmsg(), "good/adapter_model.safetensors: offset"));
    free(d);
    free(v);
    free(dir);
    tiny_close(m, be, &l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_nul_scan),
        cmocka_unit_test(test_records_refuse_nul),
        cmocka_unit_test(test_spec_special_ids),
        cmocka_unit_test(test_train_cfg_domains),
        cmocka_unit_test(test_train_run_refuses_first),
        cmocka_unit_test(test_peft_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
