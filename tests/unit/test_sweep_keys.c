/* test_sweep_keys.c - the table of per-trial training options (src/train/sweep_keys.h): the
 * names agree with `ftune train`'s flags, each key reaches its ft_train_cfg field, values
 * parse from text and JSON with their domains checked, the short forms of trial names,
 * and the suggestions for unknown names. */
#include "tests/unit/harness.h"

#include <float.h>
#include <libgen.h>

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/lora.h"
#include "src/train/schedule.h"
#include "src/train/sweep_keys.h"

static char g_argv0[4096];

static const ft_sweep_key *key(const char *name)
{
    const ft_sweep_key *k = ft_sweep_key_find(name);
    assert_non_null(k);
    return k;
}

/* Expects ft_sweep_key_parse(name, s) to fail with a message containing want. */
static void parse_fails(const char *name, const char *s, const char *want)
{
    ft_sweep_val v;
    ft_err_clear();
    int rc = ft_sweep_key_parse(key(name), s, &v);
    if (rc != FT_E_INVALID || !strstr(ft_errmsg(), want))
        fail_msg("%s '%s': rc %d, message \"%s\", expected one with \"%s\"", name, s, rc, ft_errmsg(), want);
}

static ft_sweep_val parse_ok(const char *name, const char *s)
{
    ft_sweep_val v;
    int rc = ft_sweep_key_parse(key(name), s, &v);
    if (rc) fail_msg("%s '%s': %s", name, s, ft_errmsg());
    return v;
}

static void test_table(void **state)
{
    assert_true(ft_sweep_keys_n >= 20);
    for (int i = 0; i < ft_sweep_keys_n; i++) {
        const ft_sweep_key *k = &ft_sweep_keys[i];
        /* '_' form, found by both spellings */
        assert_null(strchr(k->name, '-'));
        assert_ptr_equal(ft_sweep_key_find(k->name), k);
        char dash[96];
        size_t j = 0;
        for (; k->name[j]; j++) dash[j] = k->name[j] == '_' ? '-' : k->name[j];
        dash[j] = 0;
        assert_ptr_equal(ft_sweep_key_find(dash), k);
        /* one name, one tag: no two keys share either; enums are the only untagged ones */
        assert_true(*k->tag || k->type == FT_SWEEP_ENUM);
        for (int q = 0; q < i; q++) {
            assert_string_not_equal(ft_sweep_keys[q].name, k->name);
            if (*k->tag) assert_string_not_equal(ft_sweep_keys[q].tag, k->tag);
        }
        if (k->type == FT_SWEEP_ENUM) assert_true(k->parse && k->enum_name && k->choices);
        assert_true(k->off + sizeof(int) <= sizeof(ft_train_cfg));
    }
    assert_null(ft_sweep_key_find("seq_len"));  /* an option of the whole pass */
    assert_null(ft_sweep_key_find("model"));
    assert_null(ft_sweep_key_find("LR"));       /* exact otherwise */
    assert_null(ft_sweep_key_find(""));
}

/* Every key sets its own field of ft_train_cfg, and only it. */
static void test_apply_fields(void **state)
{
    struct { const char *name; const char *text; } cases[] = {
        {"lr", "3e-4"}, {"lora_r", "8"}, {"lora_alpha", "12.5"}, {"lora_dropout", "0.125"},
        {"lora_target", "q_proj+v_proj"}, {"seed", "18446744073709551615"}, {"schedule", "linear"},
        {"use_rslora", "true"}, {"epochs", "2.5"}, {"max_steps", "77"}, {"warmup_ratio", "0.1"},
        {"weight_decay", "0.01"}, {"dpo_beta", "0.25"}, {"dpo_loss", "ipo"}, {"adam_beta2", "0.95"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ft_train_cfg a, b;
        ft_train_defaults(&a);
        ft_train_defaults(&b);
        const ft_sweep_key *k = key(cases[c].name);
        ft_sweep_val v = parse_ok(cases[c].name, cases[c].text), got;
        ft_sweep_key_apply(k, v, &b);
        ft_sweep_key_get(k, &b, &got);
        assert_true(ft_sweep_val_equal(k, v, got));
        assert_memory_not_equal(&a, &b, sizeof a);
        ft_sweep_key_apply(k, (ft_sweep_val){0}, &b); /* back to the default's bytes */
        ft_sweep_key_apply(k, (ft_sweep_val){0}, &a);
        assert_memory_equal(&a, &b, sizeof a);
    }
    ft_train_cfg c;
    ft_train_defaults(&c);
    ft_sweep_key_apply(key("lr"), parse_ok("lr", "5e-4"), &c);
    ft_sweep_key_apply(key("lora_r"), parse_ok("lora_r", "8"), &c);
    ft_sweep_key_apply(key("lora_alpha"), parse_ok("lora_alpha", "12.5"), &c);
    ft_sweep_key_apply(key("lora_target"), parse_ok("lora_target", "q+v"), &c);
    ft_sweep_key_apply(key("seed"), parse_ok("seed", "7"), &c);
    ft_sweep_key_apply(key("schedule"), parse_ok("schedule", "constant"), &c);
    ft_sweep_key_apply(key("dpo_beta"), parse_ok("dpo_beta", "0.5"), &c);
    assert_true(c.lr == 5e-4);
    assert_int_equal(c.lora.r, 8);
    assert_true(c.lora.alpha == 12.5f);
    assert_int_equal(c.lora.targets, (1u << FT_Q) | (1u << FT_V));
    assert_int_equal(c.seed, 7);
    assert_int_equal(c.schedule, FT_SCHED_CONSTANT);
    assert_true(c.dpo.beta == 0.5);
    /* the default a trial starts from */
    ft_sweep_val v;
    ft_train_defaults(&c);
    ft_sweep_key_get(key("lora_dropout"), &c, &v);
    assert_true(v.d == (double)0.05f);
}

static void test_parse_text(void **state)
{
    assert_int_equal(parse_ok("lora_r", "16").i, 16);
    assert_true(parse_ok("lr", "2e-4").d == 2e-4);
    assert_true(parse_ok("lr", "0.0002").d == 2e-4);
    assert_int_equal(parse_ok("seed", "0").u, 0);
    assert_int_equal(parse_ok("use_rslora", "1").i, 1);
    assert_int_equal(parse_ok("use_rslora", "false").i, 0);
    assert_int_equal(parse_ok("schedule", "cosine").i, FT_SCHED_COSINE);
    assert_int_equal(parse_ok("lora_target", "all-linear").u, FT_LORA_ALL_TARGETS);
    assert_int_equal(parse_ok("lora_target", "all").u, FT_LORA_ALL_TARGETS);
    assert_int_equal(parse_ok("lora_target", "gate_proj+up+down").u,
                     (1u << FT_GATE) | (1u << FT_UP) | (1u << FT_DOWN));
    assert_true(parse_ok("lora_dropout", "0").d == 0);
    assert_true(parse_ok("warmup_ratio", "1").d == 1);   /* closed bound */
    assert_int_equal(parse_ok("max_steps", "0").i, 0);    /* 0: --epochs decides */

    parse_fails("lora_r", "16.5", "expected an integer, got '16.5'");
    parse_fails("lora_r", "1e3", "expected an integer, got '1e3'");
    parse_fails("lora_r", "0", "0 is outside the option's domain (>= 1)");
    parse_fails("lora_r", "99999999999999999999", "expected an integer");
    parse_fails("lr", "abc", "expected a number, got 'abc'");
    parse_fails("lr", "2e-4x", "expected a number, got '2e-4x'");
    parse_fails("lr", "inf", "expected a number, got 'inf'");
    parse_fails("lr", "nan", "expected a number");
    parse_fails("lr", "1e999", "1e999 is outside the option's domain (> 0)");
    parse_fails("lr", "0", "0 is outside the option's domain (> 0)");
    parse_fails("lr", "-1e-4", "-1e-4 is outside the option's domain (> 0)");
    parse_fails("lora_dropout", "1", "1 is outside the option's domain (in [0, 1))");
    parse_fails("lora_dropout", "-0.1", "outside the option's domain (in [0, 1))");
    parse_fails("lora_alpha", "1e39", "outside the option's domain (> 0)"); /* over FLT_MAX */
    parse_fails("dpo_label_smoothing", "0.5", "0.5 is outside the option's domain (in [0, 0.5))");
    parse_fails("adam_beta1", "1", "outside the option's domain (in [0, 1))");
    parse_fails("seed", "-1", "expected an integer >= 0, got '-1'");
    parse_fails("seed", "18446744073709551616", "below 2^64");
    parse_fails("use_rslora", "yes", "expected true or false, got 'yes'");
    parse_fails("schedule", "cosin", "expected one of cosine, linear, constant, got 'cosin'");
    parse_fails("dpo_loss", "kto", "expected one of sigmoid, hinge, ipo, robust, orpo, simpo");
    parse_fails("lora_target", "q_proj+x_proj", "unknown LoRA target module 'x_proj'");
    parse_fails("lora_target", "", "empty LoRA target list");
}

static void json_fails(const char *name, const char *json, const char *want)
{
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    ft_sweep_val v;
    ft_err_clear();
    int rc = ft_sweep_key_from_json(key(name), j, &v);
    cJSON_Delete(j);
    if (rc != FT_E_INVALID || !strstr(ft_errmsg(), want))
        fail_msg("%s %s: rc %d, message \"%s\", expected one with \"%s\"", name, json, rc, ft_errmsg(), want);
}

static ft_sweep_val json_ok(const char *name, const char *json)
{
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    ft_sweep_val v;
    int rc = ft_sweep_key_from_json(key(name), j, &v);
    cJSON_Delete(j);
    if (rc) fail_msg("%s %s: %s", name, json, ft_errmsg());
    return v;
}

static void test_parse_json(void **state)
{
    assert_int_equal(json_ok("lora_r", "8").i, 8);
    assert_int_equal(json_ok("lora_r", "8.0").i, 8);
    assert_true(json_ok("lr", "1e-4").d == 1e-4);
    assert_true(json_ok("lora_alpha", "16").d == 16);
    assert_int_equal(json_ok("seed", "12345").u, 12345);
    assert_int_equal(json_ok("seed", "\"18446744073709551615\"").u, UINT64_MAX);
    assert_int_equal(json_ok("use_rslora", "true").i, 1);
    assert_int_equal(json_ok("schedule", "\"linear\"").i, FT_SCHED_LINEAR);
    assert_int_equal(json_ok("lora_target", "\"q_proj,v_proj\"").u, (1u << FT_Q) | (1u << FT_V));
    assert_int_equal(json_ok("lora_target", "[\"q_proj\", \"o\"]").u, (1u << FT_Q) | (1u << FT_O));
    assert_int_equal(json_ok("lora_target", "\"all-linear\"").u, FT_LORA_ALL_TARGETS);

    json_fails("lr", "\"2e-4\"", "expected a number, found a string");
    json_fails("lr", "null", "expected a number, found null");
    json_fails("lr", "0", "0 is outside the option's domain (> 0)");
    json_fails("lora_r", "8.5", "8.5 is not an integer");
    json_fails("lora_r", "1e300", "is not an integer of magnitude <= 2^53");
    json_fails("lora_r", "true", "expected an integer, found a boolean");
    json_fails("lora_r", "0", "0 is outside the option's domain (>= 1)");
    json_fails("seed", "-3", "-3 is not an integer >= 0");
    json_fails("seed", "[1]", "expected an integer >= 0, found a list");
    json_fails("use_rslora", "1", "expected true or false, found a number");
    json_fails("schedule", "1", "expected a name, found a number");
    json_fails("schedule", "\"warm\"", "expected one of cosine, linear, constant, got 'warm'");
    json_fails("lora_target", "[]", "expected module names, found an empty list");
    json_fails("lora_target", "[\"q_proj\", 3]", "expected a list of module names, found a number");
    json_fails("lora_target", "[\"q_proj,v_proj\"]", "one module name per list item");
    json_fails("lora_target", "{}", "expected module names (a string or a list), found an object");
    json_fails("lora_target", "\"q_proj+v_proj\"", "unknown LoRA target module 'q_proj+v_proj'");
}

/* What JSON a value becomes, and that it reads back to the same value. */
static void test_json_round_trip(void **state)
{
    struct { const char *name, *text, *json; } cases[] = {
        {"lr", "2e-4", "2e-4"},
        {"lora_r", "16", "16"},
        {"use_rslora", "true", "true"},
        {"schedule", "linear", "\"linear\""},
        {"lora_target", "v+q", "\"q_proj,v_proj\""},
        {"lora_target", "all", "\"all-linear\""},
        {"seed", "9007199254740992", "9007199254740992"},
        {"seed", "9007199254740993", "\"9007199254740993\""}, /* above 2^53: digits */
        {"lora_dropout", "0.1", "0.1"},
        {"simpo_gamma", "0.30000000000000004", "0.30000000000000004"}, /* cJSON alone: 0.3 */
        {"lr", "1e-5", "1e-5"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ft_sweep_key *k = key(cases[c].name);
        ft_sweep_val v = parse_ok(cases[c].name, cases[c].text), back;
        cJSON *j = ft_sweep_key_to_json(k, v);
        assert_non_null(j);
        char *s = cJSON_PrintUnformatted(j);
        assert_string_equal(s, cases[c].json);
        cJSON *again = cJSON_Parse(s);
        assert_non_null(again);
        assert_int_equal(ft_sweep_key_from_json(k, again, &back), 0);
        assert_true(ft_sweep_val_equal(k, v, back));
        free(s);
        cJSON_Delete(j);
        cJSON_Delete(again);
    }
}

static const char *fmt(const char *name, ft_sweep_val v)
{
    static char buf[128];
    ft_sweep_key_format(key(name), v, buf, sizeof buf);
    return buf;
}

static void test_format(void **state)
{
    struct { double x; const char *s; } nums[] = {
        {2e-4, "2e-4"}, {1e-4, "1e-4"}, {0.05, "0.05"}, {0.5, "0.5"}, {16, "16"}, {1e-5, "1e-5"},
        {3.27e-4, "3.27e-4"}, {0.1, "0.1"}, {0.3, "0.3"}, {1000, "1e3"}, {100, "100"},
        {1234.5, "1234.5"}, {1.5e-4, "1.5e-4"}, {1.5, "1.5"}, {0.001, "1e-3"}, {0.0123, "0.0123"},
        {12, "12"}, {1e20, "1e20"}, {2.5e-10, "2.5e-10"}, {0.03, "0.03"}, {0, "0"},
        {0.1 + 0.2, "0.30000000000000004"}, {120000, "1.2e5"},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const char *s = fmt("lr", (ft_sweep_val){.d = nums[i].x});
        if (strcmp(s, nums[i].s)) fail_msg("%.17g: got \"%s\", expected \"%s\"", nums[i].x, s, nums[i].s);
    }
    assert_string_equal(fmt("simpo_gamma", (ft_sweep_val){.d = -0.5}), "-0.5");
    /* the short form reads back to the same double, for any double */
    ft_rng r;
    ft_rng_seed(&r, 5);
    for (int i = 0; i < 20000; i++) {
        uint64_t bits = ft_rng_next(&r);
        double x;
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x)) continue;
        char buf[400];
        ft_sweep_key_format(key("simpo_gamma"), (ft_sweep_val){.d = x}, buf, sizeof buf);
        if (strtod(buf, NULL) != x) fail_msg("%.17g became \"%s\"", x, buf);
    }
    assert_string_equal(fmt("lora_r", (ft_sweep_val){.i = 16}), "16");
    assert_string_equal(fmt("seed", (ft_sweep_val){.u = UINT64_MAX}), "18446744073709551615");
    assert_string_equal(fmt("use_rslora", (ft_sweep_val){.i = 1}), "rslora");
    assert_string_equal(fmt("use_rslora", (ft_sweep_val){.i = 0}), "norslora");
    assert_string_equal(fmt("schedule", (ft_sweep_val){.i = FT_SCHED_CONSTANT}), "constant");
    assert_string_equal(fmt("lora_target", (ft_sweep_val){.u = (1u << FT_V) | (1u << FT_Q)}), "q-v");
    assert_string_equal(fmt("lora_target", (ft_sweep_val){.u = (1u << FT_GATE) | (1u << FT_DOWN)}), "gate-down");
    assert_string_equal(fmt("lora_target", (ft_sweep_val){.u = FT_LORA_ALL_TARGETS}), "all");
    /* the train command's text for a value */
    char buf[64];
    ft_sweep_key_text(key("lora_target"), (ft_sweep_val){.u = (1u << FT_V) | (1u << FT_Q)}, buf, sizeof buf);
    assert_string_equal(buf, "q_proj,v_proj");
    ft_sweep_key_text(key("lr"), (ft_sweep_val){.d = 2e-4}, buf, sizeof buf);
    assert_string_equal(buf, "2e-4");
    ft_sweep_key_text(key("use_rslora"), (ft_sweep_val){.i = 0}, buf, sizeof buf);
    assert_string_equal(buf, "false");
    /* truncation keeps the NUL */
    char small[4];
    assert_int_equal(ft_sweep_key_format(key("lr"), (ft_sweep_val){.d = 3.27e-4}, small, sizeof small), 3);
    assert_string_equal(small, "3.2");
}

static void test_nearest(void **state)
{
    struct { const char *typo, *want; } cases[] = {
        {"learning_rate", "lr"}, {"learning-rate", "lr"}, {"lora_rank", "lora_r"}, {"r", "lora_r"},
        {"lora_dropuot", "lora_dropout"}, {"lora-alpah", "lora_alpha"}, {"target_modules", "lora_target"},
        {"lora_targets", "lora_target"}, {"num_train_epochs", "epochs"}, {"Weight_Decay", "weight_decay"},
        {"warmup_ration", "warmup_ratio"}, {"sed", "seed"}, {"max_step", "max_steps"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ft_sweep_key *k = ft_sweep_key_nearest(cases[i].typo);
        if (!k || strcmp(k->name, cases[i].want))
            fail_msg("%s: suggested %s, expected %s", cases[i].typo, k ? k->name : "nothing", cases[i].want);
    }
    assert_null(ft_sweep_key_nearest("seq_len"));
    assert_null(ft_sweep_key_nearest("model"));
    assert_null(ft_sweep_key_nearest("batch_size"));
    char msg[1024];
    ft_sweep_key_unknown_msg("learning_rate", msg, sizeof msg);
    assert_string_equal(msg, "not a training option a trial can set; did you mean lr?");
    ft_sweep_key_unknown_msg("seq_len", msg, sizeof msg);
    assert_non_null(strstr(msg, "not a training option a trial can set (those are: max_steps, epochs, lr,"));
    assert_non_null(strstr(msg, ", seed; options of the whole pass, such as seq_len, go on the command line)"));
    char tiny[16]; /* cut, never overrun */
    ft_sweep_key_unknown_msg("seq_len", tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), sizeof tiny - 1);
}

/* The table's names are `ftune train`'s flags: every key is in `ftune train --help` (the
 * binary beside the tests folder this test was built into, or FTUNE_BIN). */
static void test_names_are_train_flags(void **state)
{
    char bin[4200];
    const char *env = getenv("FTUNE_BIN");
    if (env && *env) snprintf(bin, sizeof bin, "%s", env);
    else {
        char a0[4096];
        snprintf(a0, sizeof a0, "%s", g_argv0);
        snprintf(bin, sizeof bin, "%s/../ftune", dirname(a0));
    }
    if (access(bin, X_OK)) {
        fprintf(stderr, "no ftune binary at %s\n", bin);
        skip();
    }
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "'%s' train --help 2>&1", bin);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char help[1 << 16];
    size_t n = fread(help, 1, sizeof help - 1, p);
    help[n] = 0;
    assert_int_equal(pclose(p), 0);
    assert_non_null(strstr(help, "--lora-r"));
    for (int i = 0; i < ft_sweep_keys_n; i++) {
        char flag[100];
        int o = snprintf(flag, sizeof flag, "  --");
        for (const char *c = ft_sweep_keys[i].name; *c; c++) flag[o++] = *c == '_' ? '-' : *c;
        flag[o++] = ' ';
        flag[o] = 0;
        if (!strstr(help, flag)) fail_msg("%s is not a flag of `ftune train` (no \"%s\" in --help)",
                                          ft_sweep_keys[i].name, flag);
    }
}

int main(int argc, char **argv)
{
    snprintf(g_argv0, sizeof g_argv0, "%s", argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_apply_fields),
        cmocka_unit_test(test_parse_text),
        cmocka_unit_test(test_parse_json),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_nearest),
        cmocka_unit_test(test_names_are_train_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
