/* test_model_card.c - what makes an adapter folder loadable by any PEFT user
 * (adapters/peft.h, adapters/model_card.h): floats written as the user gave them (the
 * shortest decimal of the float32), Hugging Face repository ids checked as huggingface_hub
 * does, base_model_name_or_path inferred from a GGUF's metadata (each key in its order of
 * precedence, URLs that are no model id ignored, --base-model-id first, a bad id refused),
 * and the README.md model card: front matter, data, settings, results, usage; a local base
 * gets no base_model key. */
#include "tests/unit/harness.h"

#include <cjson/cJSON.h>

#include "adapters/model_card.h"
#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/gguf_write.h"

static void test_float_repr(void **state)
{
    (void)state;
    assert_true(ft_peft_float_repr(0.05f) == 0.05);
    assert_true(ft_peft_float_repr(0.1f) == 0.1);
    assert_true(ft_peft_float_repr(32.0f) == 32.0);
    assert_true(ft_peft_float_repr(16.5f) == 16.5);
    assert_true(ft_peft_float_repr(0.0f) == 0.0);
    assert_true(ft_peft_float_repr(1e-4f) == 1e-4);
    assert_true(ft_peft_float_repr(0.123457f) == 0.123457); /* 6 digits come back */
    /* every float reads back as itself */
    const float v[5] = {0.3f, 1.0f / 3.0f, 3.4028235e38f, 1.4e-45f, 123456.789f};
    for (int i = 0; i < 5; i++) assert_true((float)ft_peft_float_repr(v[i]) == v[i]);
    assert_true(isnan(ft_peft_float_repr(NAN)));
    /* cJSON prints the double in its shortest form */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "lora_dropout", ft_peft_float_repr(0.05f));
    char *s = cJSON_PrintUnformatted(o);
    assert_string_equal(s, "{\"lora_dropout\":0.05}");
    free(s);
    cJSON_Delete(o);
}

static void test_repo_id(void **state)
{
    (void)state;
    assert_true(ft_peft_is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
    assert_true(ft_peft_is_repo_id("meta-llama/Llama-3.1-8B"));
    assert_true(ft_peft_is_repo_id("a/b"));
    assert_false(ft_peft_is_repo_id("SmolLM2"));                /* no org */
    assert_false(ft_peft_is_repo_id("a/b/c"));
    assert_false(ft_peft_is_repo_id("/abs/path"));
    assert_false(ft_peft_is_repo_id("org/"));
    assert_false(ft_peft_is_repo_id("org/na me"));
    assert_false(ft_peft_is_repo_id("org/-name"));
    assert_false(ft_peft_is_repo_id("org/name."));
    assert_false(ft_peft_is_repo_id("org/na--me"));
    assert_false(ft_peft_is_repo_id("org/na..me"));
    assert_false(ft_peft_is_repo_id("./model"));
    char longid[120];
    memset(longid, 'a', sizeof longid);
    longid[3] = '/';
    longid[100] = 0;
    assert_false(ft_peft_is_repo_id(longid));                   /* > 96 characters */
}

/* A GGUF with only the given string metadata (pairs key, value; NULL-terminated). */
static char *gguf_with(const char *dir, const char *name, const char *const *kv)
{
    char *p = malloc(4200);
    snprintf(p, 4200, "%s/%s", dir, name);
    ft_gguf_w *w;
    assert_int_equal(ft_gguf_w_open(&w, p, 0), 0);
    assert_int_equal(ft_gguf_w_kv_str(w, "general.architecture", "llama"), 0);
    for (int i = 0; kv[i]; i += 2) assert_int_equal(ft_gguf_w_kv_str(w, kv[i], kv[i + 1]), 0);
    assert_int_equal(ft_gguf_w_begin_data(w), 0);
    assert_int_equal(ft_gguf_w_close(w), 0);
    return p;
}

static void test_base_name(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    char out[512];
    const char *src;
    struct { const char *kv[7]; const char *want, *src; } cases[] = {
        {{"general.source.huggingface.repository", "org-a/model-a", NULL}, "org-a/model-a",
         "general.source.huggingface.repository"},
        {{"general.source.hugginface.repository", "org-b/model-b", NULL}, "org-b/model-b",
         "general.source.hugginface.repository"},
        {{"general.source.repo_url", "https://huggingface.co/org-c/model-c", NULL}, "org-c/model-c",
         "general.source.repo_url"},
        {{"general.repo_url", "https://hf.co/org-d/model-d/", NULL}, "org-d/model-d", "general.repo_url"},
        {{"general.base_model.0.repo_url", "https://huggingface.co/org-e/model-e", NULL},
         "org-e/model-e", "general.base_model.0.repo_url"},
        /* the model's own repository before the one it was made from */
        {{"general.base_model.0.repo_url", "https://huggingface.co/parent/p",
          "general.source.repo_url", "https://huggingface.co/self/s", NULL}, "self/s",
         "general.source.repo_url"},
        /* not a Hugging Face model URL: skipped for the next key */
        {{"general.source.repo_url", "https://github.com/org/code",
          "general.base_model.0.repo_url", "https://huggingface.co/org-f/model-f", NULL},
         "org-f/model-f", "general.base_model.0.repo_url"},
        {{"general.repo_url", "https://huggingface.co/org/model/tree/main", NULL}, NULL, NULL},
        {{"general.source.huggingface.repository", "not an id", NULL}, NULL, NULL},
        {{"general.name", "tiny", NULL}, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%zu.gguf", i);
        char *p = gguf_with(dir, name, cases[i].kv);
        assert_int_equal(ft_peft_base_name(p, NULL, out, sizeof out, &src), 0);
        if (cases[i].want) {
            assert_string_equal(out, cases[i].want);
            assert_string_equal(src, cases[i].src);
        } else {
            assert_string_equal(out, p); /* the path */
            assert_null(src);
        }
        /* --base-model-id wins over the metadata */
        assert_int_equal(ft_peft_base_name(p, "mine/override", out, sizeof out, &src), 0);
        assert_string_equal(out, "mine/override");
        assert_string_equal(src, "--base-model-id");
        free(p);
    }
    assert_int_equal(ft_peft_base_name("x.gguf", "org/name@v1.0", out, sizeof out, &src), 0);
    assert_string_equal(out, "org/name@v1.0");
    assert_int_equal(ft_peft_base_name("x.gguf", "no id", out, sizeof out, &src), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "'no id'"));
    /* a folder, a missing or broken .gguf: the path (the loader reports the problem) */
    assert_int_equal(ft_peft_base_name(dir, NULL, out, sizeof out, &src), 0);
    assert_string_equal(out, dir);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/broken.gguf", dir);
    assert_int_equal(ft_write_file_atomic(bad, "GGUFxx", 6), 0);
    assert_int_equal(ft_peft_base_name(bad, NULL, out, sizeof out, &src), 0);
    assert_string_equal(out, bad);
    assert_null(src);
    t_rmtree(dir);
}

static void put(const char *dir, const char *name, const char *txt)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
}

static char *card(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/README.md", dir);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(p, &txt, &len), 0);
    char *s = malloc(len + 1);
    memcpy(s, txt, len);
    s[len] = 0;
    free(txt);
    return s;
}

static void test_card(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    put(dir, "adapter_config.json", "{\"base_model_name_or_path\": \"org/base-model\", \"revision\": null, "
                                    "\"r\": 32, \"lora_alpha\": 16, \"lora_dropout\": 0.05, "
                                    "\"target_modules\": [\"q_proj\", \"v_proj\"], \"use_rslora\": false}");
    cJSON *summary = cJSON_Parse("{\"data\": [\"a.jsonl\", \"b.jsonl\"], \"n_train\": 90, \"n_eval\": 10, "
                                 "\"steps\": 12, \"tokens\": 3000, \"final_train_loss\": 1.23456, "
                                 "\"final_eval_loss\": 1.5, \"best_eval_loss\": 1.4, \"best_eval_step\": 8}");
    cJSON *settings = cJSON_Parse("{\"lr\": 0.0002, \"seq_len\": 512, \"schedule\": \"cosine\", "
                                  "\"lora_dropout\": 0.05000000074505806, \"info\": {\"model\": \"x\"}}");
    assert_int_equal(ft_model_card_write(dir, summary, settings), 0);
    char *c = card(dir);
    assert_int_equal(strncmp(c, "---\nbase_model: org/base-model\nlibrary_name: peft\n", 50), 0);
    assert_non_null(strstr(c, "- base_model:adapter:org/base-model\n"));
    assert_non_null(strstr(c, "[org/base-model](https://huggingface.co/org/base-model)"));
    assert_non_null(strstr(c, "- `a.jsonl`\n- `b.jsonl`\n"));
    assert_non_null(strstr(c, "90 training examples, 10 held-out examples."));
    assert_non_null(strstr(c, "| lora_dropout | 0.05 |"));
    assert_non_null(strstr(c, "| target_modules | `q_proj`, `v_proj` |"));
    assert_non_null(strstr(c, "| lr | 0.0002 |"));
    assert_non_null(strstr(c, "| seq_len | 512 |"));
    assert_null(strstr(c, "0.05000000074505806"));
    assert_null(strstr(c, "| info")); /* nested settings are left out */
    assert_non_null(strstr(c, "| final train loss | 1.2346 |"));
    assert_non_null(strstr(c, "| final eval loss | 1.5000 |"));
    assert_non_null(strstr(c, "| best eval step | 8 |"));
    assert_non_null(strstr(c, "AutoPeftModelForCausalLM.from_pretrained("));
    assert_non_null(strstr(c, "vllm serve org/base-model --enable-lora --lora-modules adapter="));
    assert_non_null(strstr(c, "--max-lora-rank 32")); /* r 32 > vLLM's default 16 */
    assert_non_null(strstr(c, "llama-cli -m base.gguf --lora adapter.gguf"));
    free(c);

    /* a local base: no base_model key, PeftModel with the base given */
    put(dir, "adapter_config.json", "{\"base_model_name_or_path\": \"/models/local.gguf\", \"r\": 8}");
    assert_int_equal(ft_model_card_write(dir, NULL, NULL), 0);
    c = card(dir);
    assert_null(strstr(c, "base_model:"));
    assert_non_null(strstr(c, "library_name: peft"));
    assert_non_null(strstr(c, "`/models/local.gguf` (a local path"));
    assert_non_null(strstr(c, "PeftModel.from_pretrained(base, "));
    assert_null(strstr(c, "--max-lora-rank"));
    assert_null(strstr(c, "## Results"));
    free(c);

    put(dir, "adapter_config.json", "[1]");
    assert_int_equal(ft_model_card_write(dir, NULL, NULL), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "adapter_config.json"));
    cJSON_Delete(summary);
    cJSON_Delete(settings);
    t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_repr),
        cmocka_unit_test(test_repo_id),
        cmocka_unit_test(test_base_name),
        cmocka_unit_test(test_card),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
