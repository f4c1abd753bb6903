/* test_config.c - config.json parsing (formats.md 2.1) and RoPE inverse frequencies (2.2). */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/formats/config.h"
#include "tests/unit/format_fixture.h"

/* fp32 RoPE vs the reference values below: the references emulate torch's fp32 ops with
 * numpy (same glibc powf as ours); 1e-6 relative (~8 ulp) allows torch's own pow to differ
 * by an ulp or two. */
#define FT_TOL_ROPE_REL 1e-6

#define NAME "cfg.json"

static int parse(ft_model_config *c, const char *js)
{
    ft_err_clear();
    return ft_config_parse(c, js, strlen(js), NAME);
}

#define BASE "\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":128," \
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100"

static void check_inv(const float *got, const float *ref, int n, const char *what)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = fabs((double)got[i] - ref[i]) / fabs(ref[i]);
        if (r > worst) worst = r;
        if (r > FT_TOL_ROPE_REL)
            fail_msg("%s inv_freq[%d] = %.9g, reference %.9g (rel %.3g > %g)", what, i, got[i],
                     ref[i], r, FT_TOL_ROPE_REL);
    }
    printf("  %s inv_freq: %d values, max rel err %.3g (tol %g)\n", what, n, worst, FT_TOL_ROPE_REL);
}

static void test_tiny_llama_config(void **state)
{
    ft_model_config c;
    int rc = ft_config_load(&c, "tests/fixtures/tiny-llama/config.json");
    if (rc) fail_msg("%s", ft_errmsg());
    assert_string_equal(c.model_type, "llama");
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 128);
    assert_int_equal(c.num_hidden_layers, 2);
    assert_int_equal(c.num_attention_heads, 4);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.vocab_size, 32000);
    assert_true(c.rms_norm_eps == 1e-5f);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_type, FT_ROPE_DEFAULT);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_id[0], 2);
    /* default RoPE, D = 16, theta 1e4 (python: see test_rope_llama3) */
    static const float ref[8] = {1, 0.316227764f, 0.100000001f, 0.0316227786f, 0.00999999978f,
                                 0.00316227786f, 0.00100000005f, 0.000316227786f};
    float inv[8];
    ft_rope_inv_freq(&c, 128, inv);
    check_inv(inv, ref, 8, "default");
}

static void test_defaults(void **state)
{
    ft_model_config c;
    assert_int_equal(parse(&c, "{" BASE "}"), 0);
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.rope_factor == 1.0);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_int_equal(c.attention_bias, 0);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_id[0], 2);
    /* head_dim present and different from hidden/heads; unknown keys ignored */
    assert_int_equal(parse(&c, "{" BASE ",\"head_dim\":32,\"pretraining_tp\":1,\"use_cache\":true,"
                               "\"rope_interleaved\":false,\"auto_map\":{}}"), 0);
    assert_int_equal(c.head_dim, 32);
    /* model_type from architectures when the key is absent */
    assert_int_equal(parse(&c, "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,"
                               "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                               "\"num_attention_heads\":4,\"vocab_size\":100}"), 0);
    assert_string_equal(c.model_type, "mistral");
}

static void test_missing_required(void **state)
{
    static const char *const keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "vocab_size"};
    for (int k = 0; k < 5; k++) {
        char js[512], want[128];
        int n = snprintf(js, sizeof js, "{\"model_type\":\"llama\"");
        for (int j = 0; j < 5; j++)
            if (j != k) n += snprintf(js + n, sizeof js - (size_t)n, ",\"%s\":64", keys[j]);
        snprintf(js + n, sizeof js - (size_t)n, "}");
        ft_model_config c;
        int rc = parse(&c, js);
        snprintf(want, sizeof want, NAME ": missing required key \"%s\"", keys[k]);
        expect_err(rc, FT_E_INVALID, want, NULL);
        assert_string_equal(ft_errmsg(), want);
    }
    /* null counts as missing */
    ft_model_config c;
    expect_err(parse(&c, "{\"model_type\":\"llama\",\"hidden_size\":null,\"intermediate_size\":1,"
                         "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":1}"),
               FT_E_INVALID, "missing required key \"hidden_size\"", NULL);
    expect_err(parse(&c, "{\"hidden_size\":64}"), FT_E_INVALID, NAME, "\"model_type\"", NULL);
}

static void test_type_errors(void **state)
{
    ft_model_config c;
    expect_err(parse(&c, "{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"intermediate_size\":1,"
                         "\"num_hidden_layers\":1,\"num_attention_heads\":1,\"vocab_size\":1}"),
               FT_E_INVALID, NAME, "\"hidden_size\"", "expected an integer", "found a string", NULL);
    expect_err(parse(&c, "{" BASE ",\"num_key_value_heads\":2.5}"), FT_E_INVALID,
               "\"num_key_value_heads\"", "expected an integer", NULL);
    expect_err(parse(&c, "{" BASE ",\"rms_norm_eps\":\"1e-5\"}"), FT_E_INVALID,
               "\"rms_norm_eps\"", "expected a number", NULL);
    expect_err(parse(&c, "{" BASE ",\"tie_word_embeddings\":1}"), FT_E_INVALID,
               "\"tie_word_embeddings\"", "true or false", NULL);
    expect_err(parse(&c, "{" BASE ",\"eos_token_id\":\"</s>\"}"), FT_E_INVALID,
               "\"eos_token_id\"", NULL);
    expect_err(parse(&c, "{" BASE ",\"rope_scaling\":[1]}"), FT_E_INVALID, "\"rope_scaling\"",
               "expected an object", NULL);
    expect_err(parse(&c, "{" BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":\"2\"}}"),
               FT_E_INVALID, "\"rope_scaling.factor\"", NULL);
    expect_err(parse(&c, "[1,2]"), FT_E_INVALID, NAME, "expected a JSON object", NULL);
    expect_err(parse(&c, "{\"model_type\": \"llama\", oops}"), FT_E_INVALID, NAME,
               "not valid JSON", NULL);
}

static void test_unsupported(void **state)
{
    ft_model_config c;
    expect_err(parse(&c, "{\"model_type\":\"phi3\",\"hidden_size\":64}"), FT_E_UNSUPPORTED,
               NAME, "model_type \"phi3\"", NULL);
    expect_err(parse(&c, "{" BASE ",\"mlp_bias\":true}"), FT_E_UNSUPPORTED, "mlp_bias", NULL);
    expect_err(parse(&c, "{" BASE ",\"hidden_act\":\"gelu\"}"), FT_E_UNSUPPORTED, "hidden_act",
               "gelu", NULL);
    expect_err(parse(&c, "{" BASE ",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":4}}"),
               FT_E_UNSUPPORTED, NAME, "longrope", NULL);
    expect_err(parse(&c, "{" BASE ",\"partial_rotary_factor\":0.5}"), FT_E_UNSUPPORTED,
               "partial_rotary_factor", NULL);
    int rc = ft_config_load(&c, "/nonexistent/ftune/config.json");
    expect_err(rc, -ENOENT, "/nonexistent/ftune/config.json", NULL);
}

static void test_validate(void **state)
{
    ft_model_config c;
    expect_err(parse(&c, "{" BASE ",\"num_key_value_heads\":3}"), FT_E_INVALID, NAME,
               "num_key_value_heads (3)", NULL);
    expect_err(parse(&c, "{" BASE ",\"head_dim\":15}"), FT_E_INVALID, NAME, "head_dim", NULL);
    expect_err(parse(&c, "{\"model_type\":\"llama\",\"hidden_size\":65,\"intermediate_size\":128,"
                         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}"),
               FT_E_INVALID, "hidden_size (65)", NULL);
    expect_err(parse(&c, "{" BASE ",\"rms_norm_eps\":0}"), FT_E_INVALID, "rms_norm_eps", NULL);
    expect_err(parse(&c, "{\"model_type\":\"llama\",\"hidden_size\":-64,\"intermediate_size\":128,"
                         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}"),
               FT_E_INVALID, "\"hidden_size\" = -64", NULL);
    /* ft_config_validate fills derived fields on a hand-made config */
    memset(&c, 0, sizeof c);
    c.hidden_size = 576; c.intermediate_size = 1536; c.num_hidden_layers = 30;
    c.num_attention_heads = 9; c.vocab_size = 49152; c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5f; c.rope_theta = 1e5;
    assert_int_equal(ft_config_validate(&c, "x"), 0);
    assert_int_equal(c.num_key_value_heads, 9);
    assert_int_equal(c.head_dim, 64);
}

static void test_qwen2_and_ids(void **state)
{
    ft_model_config c;
    assert_int_equal(parse(&c, "{\"model_type\":\"qwen2\",\"hidden_size\":896,\"intermediate_size\":4864,"
                               "\"num_hidden_layers\":24,\"num_attention_heads\":14,"
                               "\"num_key_value_heads\":2,\"vocab_size\":151936,\"rope_theta\":1000000.0,"
                               "\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":true,\"bos_token_id\":151643,"
                               "\"eos_token_id\":[151643,151645],\"use_sliding_window\":false,"
                               "\"sliding_window\":32768,\"max_window_layers\":21}"), 0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_token_id[1], 151645);
    assert_true(c.rope_theta == 1e6);
    expect_err(parse(&c, "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"intermediate_size\":128,"
                         "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"vocab_size\":100,"
                         "\"use_sliding_window\":true,\"max_window_layers\":2}"),
               FT_E_UNSUPPORTED, "use_sliding_window", NULL);
    assert_int_equal(parse(&c, "{" BASE ",\"bos_token_id\":null,\"eos_token_id\":null}"), 0);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(parse(&c, "{" BASE ",\"attention_bias\":true,\"eos_token_id\":[128001,128008,128009]}"), 0);
    assert_int_equal(c.attention_bias, 1);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_token_id[2], 128009);
}

/* Llama-3.1-8B rope (formats.md 2.1): theta 5e5, head_dim 128, llama3 factor 8, low 1,
 * high 4, original 8192. Reference produced with numpy (numpy 2.x, glibc powf), emulating
 * transformers _compute_llama3_parameters op by op in fp32:
 *   f32 = np.float32
 *   inv = f32(1) / (f32(5e5) ** (np.arange(0, 128, 2).astype(f32) / f32(128)))
 *   wl = (f32(1) / inv) * f32(2 * math.pi)
 *   lla = np.where(wl > f32(8192 / 1.0), inv / f32(8), inv)
 *   s = ((f32(1) / wl) * f32(8192) - f32(1)) / f32(4 - 1)
 *   sm = ((f32(1) - s) * lla) / f32(8) + s * lla
 *   med = ~(wl < f32(8192 / 4.0)) & ~(wl > f32(8192 / 1.0))
 *   print(", ".join("%.9g" % x for x in np.where(med, sm, lla)))
 * The same formula in float64 agrees within 3.3e-7 relative. */
static const float k_llama3_ref[64] = {
    1, 0.814617217f, 0.66360122f, 0.540580988f, 0.440366626f, 0.358730227f, 0.292227805f,
    0.238053843f, 0.193922758f, 0.157972813f, 0.128687382f, 0.10483095f, 0.0853971019f,
    0.0695659518f, 0.0566696189f, 0.046164047f, 0.0376060307f, 0.0306345206f, 0.0249554086f,
    0.0203291047f, 0.0165604409f, 0.0134904208f, 0.0109895291f, 0.00895225909f, 0.00729266508f,
    0.00594072975f, 0.00483942125f, 0.00394227589f, 0.00321144611f, 0.00216657063f,
    0.00137189368f, 0.00085675146f, 0.000524846022f, 0.00031269365f, 0.000178507791f,
    9.5562129e-05f, 7.78465546e-05f, 6.34151438e-05f, 5.16590735e-05f, 4.20823671e-05f,
    3.42810235e-05f, 2.79259093e-05f, 2.27489272e-05f, 1.85316694e-05f, 1.50962178e-05f,
    1.22976389e-05f, 1.00178677e-05f, 8.1607277e-06f, 6.64787058e-06f, 5.41546933e-06f,
    4.41153452e-06f, 3.59371234e-06f, 2.92749974e-06f, 2.38479174e-06f, 1.94269251e-06f,
    1.58255079e-06f, 1.28917316e-06f, 1.05018262e-06f, 8.55496921e-07f, 6.96902532e-07f,
    5.6770881e-07f, 4.6246538e-07f, 3.76732288e-07f, 3.06892588e-07f,
};

#define L31 "\"model_type\":\"llama\",\"hidden_size\":4096,\"intermediate_size\":14336," \
            "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8," \
            "\"head_dim\":128,\"vocab_size\":128256,\"max_position_embeddings\":131072," \
            "\"rms_norm_eps\":1e-05"

static void test_rope_llama3(void **state)
{
    ft_model_config c;
    float inv[64];
    /* 1. legacy: top-level rope_theta + rope_scaling with rope_type */
    assert_int_equal(parse(&c, "{" L31 ",\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,"
                               "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                               "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}"), 0);
    assert_int_equal(c.rope_type, FT_ROPE_LLAMA3);
    assert_true(c.rope_factor == 8.0 && c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_position_embeddings, 8192);
    ft_rope_inv_freq(&c, 4096, inv);
    check_inv(inv, k_llama3_ref, 64, "llama3 (rope_scaling)");
    /* 2. transformers v5: rope_parameters holding rope_theta */
    assert_int_equal(parse(&c, "{" L31 ",\"rope_parameters\":{\"rope_theta\":500000.0,\"factor\":8.0,"
                               "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                               "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}}"), 0);
    assert_true(c.rope_theta == 500000.0);
    ft_rope_inv_freq(&c, 4096, inv);
    check_inv(inv, k_llama3_ref, 64, "llama3 (rope_parameters)");
    /* 3. legacy "type" key */
    assert_int_equal(parse(&c, "{" L31 ",\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":8.0,"
                               "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                               "\"original_max_position_embeddings\":8192,\"type\":\"llama3\"}}"), 0);
    ft_rope_inv_freq(&c, 4096, inv);
    check_inv(inv, k_llama3_ref, 64, "llama3 (\"type\")");
    /* missing keys name the key */
    static const char *const req[] = {"factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings"};
    static const char *const val[] = {"8.0", "1.0", "4.0", "8192"};
    for (int k = 0; k < 4; k++) {
        char js[1024], want[128];
        int n = snprintf(js, sizeof js, "{" L31 ",\"rope_scaling\":{\"rope_type\":\"llama3\"");
        for (int j = 0; j < 4; j++)
            if (j != k) n += snprintf(js + n, sizeof js - (size_t)n, ",\"%s\":%s", req[j], val[j]);
        snprintf(js + n, sizeof js - (size_t)n, "}}");
        snprintf(want, sizeof want, "missing required key \"rope_scaling.%s\"", req[k]);
        expect_err(parse(&c, js), FT_E_INVALID, NAME, want, NULL);
    }
    expect_err(parse(&c, "{" L31 ",\"rope_scaling\":{\"factor\":8.0}}"), FT_E_INVALID,
               "\"rope_scaling.rope_type\"", NULL);
    /* rope_parameters with only rope_theta = default rope */
    assert_int_equal(parse(&c, "{" BASE ",\"rope_parameters\":{\"rope_theta\":500000.0,"
                               "\"rope_type\":\"default\"}}"), 0);
    assert_int_equal(c.rope_type, FT_ROPE_DEFAULT);
    assert_true(c.rope_theta == 500000.0);
}

static void test_rope_other_types(void **state)
{
    ft_model_config c;
    float a[32], b[32];
    /* linear: default / factor, elementwise in fp32 */
    assert_int_equal(parse(&c, "{" BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}"), 0);
    assert_int_equal(c.rope_type, FT_ROPE_LINEAR);
    ft_rope_inv_freq(&c, 0, a);
    c.rope_type = FT_ROPE_DEFAULT;
    ft_rope_inv_freq(&c, 0, b);
    for (int i = 0; i < 8; i++) assert_true(a[i] == b[i] / 2.0f);

    /* dynamic NTK, head_dim 64, theta 1e4, factor 2, max_pos 2048, seq 4096. numpy:
     *   b = 1e4 * ((2 * 4096 / 2048) - (2 - 1)) ** (64 / 62)
     *   f32(1) / (f32(b) ** (np.arange(0, 64, 2).astype(f32) / f32(64))) */
    static const float dyn[32] = {
        1, 0.72378397f, 0.523863316f, 0.379163891f, 0.274432778f, 0.19863005f, 0.143765256f,
        0.104055002f, 0.0753133446f, 0.0545105971f, 0.0394539014f, 0.028556101f, 0.0206684489f,
        0.0149594955f, 0.0108274426f, 0.00783672929f, 0.0056721f, 0.00410537515f, 0.00297140493f,
        0.00215065549f, 0.00155661011f, 0.00112664944f, 0.000815450971f, 0.000590210373f,
        0.000427184859f, 0.000309189549f, 0.000223786439f, 0.000161973046f, 0.000117233511f,
        8.48517448e-05f, 6.14143355e-05f, 4.44507132e-05f};
    assert_int_equal(parse(&c, "{\"model_type\":\"llama\",\"hidden_size\":256,\"intermediate_size\":128,"
                               "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
                               "\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2.0}}"), 0);
    assert_int_equal(c.rope_type, FT_ROPE_DYNAMIC);
    ft_rope_inv_freq(&c, 4096, a);
    check_inv(a, dyn, 32, "dynamic (seq 4096)");
    ft_rope_inv_freq(&c, 1000, a); /* seq <= max_position_embeddings: plain default */
    c.rope_type = FT_ROPE_DEFAULT;
    ft_rope_inv_freq(&c, 0, b);
    check_inv(a, b, 32, "dynamic (seq 1000) == default");

    /* yarn, head_dim 64, theta 1e6, factor 4, original 32768, beta 32/1; numpy emulation of
     * transformers _compute_yarn_parameters (truncate=True):
     *   cd = lambda rot: (64 * math.log(32768 / (rot * 2 * math.pi))) / (2 * math.log(1e6))
     *   low = max(math.floor(cd(32)), 0); high = min(math.ceil(cd(1)), 63)
     *   pos = f32(1e6) ** (np.arange(0, 64, 2).astype(f32) / f32(64))
     *   extra = f32(1) / pos; inter = f32(1) / (f32(4) * pos)
     *   ramp = np.clip((np.arange(32, dtype=f32) - f32(low)) / f32(high - low), 0, 1)
     *   ef = f32(1) - ramp; inter * (f32(1) - ef) + extra * ef */
    static const float yarn[32] = {
        1, 0.649381638f, 0.421696514f, 0.273841977f, 0.177827939f, 0.115478203f, 0.0749894157f,
        0.0486967526f, 0.0316227786f, 0.0205352493f, 0.0133352149f, 0.00865964312f,
        0.00515479548f, 0.0030431177f, 0.00177853031f, 0.00102661783f, 0.000583333371f,
        0.000324690831f, 0.000175706897f, 9.12806499e-05f, 4.44569851e-05f, 2.88695519e-05f,
        1.87473561e-05f, 1.21741887e-05f, 7.90569356e-06f, 5.13381246e-06f, 3.33380399e-06f,
        2.16491071e-06f, 1.40585337e-06f, 9.12935377e-07f, 5.92843435e-07f, 3.84981632e-07f};
    assert_int_equal(parse(&c, "{\"model_type\":\"qwen2\",\"hidden_size\":256,\"intermediate_size\":128,"
                               "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
                               "\"max_position_embeddings\":32768,\"rope_theta\":1000000.0,"
                               "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
                               "\"original_max_position_embeddings\":32768}}"), 0);
    assert_int_equal(c.rope_type, FT_ROPE_YARN);
    assert_true(c.rope_beta_fast == 32.0 && c.rope_beta_slow == 1.0);
    ft_rope_inv_freq(&c, 0, a);
    check_inv(a, yarn, 32, "yarn");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_llama_config),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_type_errors),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_qwen2_and_ids),
        cmocka_unit_test(test_rope_llama3),
        cmocka_unit_test(test_rope_other_types),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
