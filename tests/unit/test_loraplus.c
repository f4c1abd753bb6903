/* test_loraplus.c - LoRA+ (ft_train_cfg.loraplus_lr_ratio, src/train/optim.c): the B
 * matrices step at ratio * lr(t), the A matrices at lr(t) (Hayou, Ghosh, Yu 2024; PEFT's
 * create_loraplus_optimizer), checked on whole training runs of tests/fixtures/tiny-llama:
 *   - ratio 1 writes the same adapter bytes as LoRA+ off (the one-call optimizer path);
 *   - Adam's first update of a parameter is lr_eff * g / (|g| + eps'), ~ lr_eff * sign(g)
 *     (times a known bias-correction factor when the first non-zero gradient comes at a
 *     later step), so the largest |change| of B and of A measures each group's lr;
 *   - a ratio <= 0 or non-finite is refused naming the flag.
 * The runs use $FTUNE_DEVICE (default cpu): FTUNE_DEVICE=cuda checks the CUDA backend's
 * per-slice adamw calls the same way. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/model/model.h"
#include "src/train/schedule.h"
#include "src/train/trainer.h"
#include "tests/unit/train_fixture.h"

#define DATA "examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl"

/* Relative tolerance of "max |update| == lr_eff * c". The largest update is that of the
 * element with the largest |g|, smaller than lr_eff * c by the factor |g| / (|g| + eps'),
 * eps' = eps = 1e-8 at step 1 and eps * sqrt(1+b2) = 1.4e-8 at step 2: a relative
 * 1.4e-8 / |g|max, < 1e-5 for any |g|max above 1.4e-3 (the largest of 8192 gradient
 * entries of norm up to 1, the clip). fp32 rounding adds < 1e-7 for B (from 0) and
 * ulp(|A| < 1/sqrt(64)) / 2 / (lr_2 c_2) = 3.7e-9 / 3.7e-4 = 1e-5 for A - A_init.
 * Measured: 7e-8 (B), 1e-6 (A). 1e-3 keeps a 100x margin; giving either group the other
 * group's lr is off by 16x (both mutations were seen to fail). */
#define TOL_REL 1e-3

/* tiny_train_cfg (no warmup: step 1 runs at the peak lr) without a held-out set. */
static void base_cfg(ft_train_cfg *c, const char *out, int64_t steps, double ratio)
{
    static const char *const data[1] = {DATA};
    tiny_train_cfg(c, out, data, steps, 2);
    c->data_cfg.eval_fraction = 0;
    c->loraplus_lr_ratio = ratio;
}

static void train_ok(const ft_train_cfg *c)
{
    ft_train_result res;
    train_run_ok(c, NULL, NULL, &res);
    assert_int_equal(res.steps, c->max_steps);
}

/* 1. ratio 1 == off, bit for bit (3 steps, dropout and weight decay on); ratio 16 differs. */
static void test_ratio_one_is_off(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    char out[3][600];
    const double ratios[3] = {0, 1, 16};
    for (int k = 0; k < 3; k++) {
        snprintf(out[k], sizeof out[k], "%s/r%d", dir, k);
        ft_train_cfg c;
        base_cfg(&c, out[k], 3, ratios[k]);
        c.weight_decay = 0.1;
        train_ok(&c);
    }
    size_t n0, n1, n2;
    char *a0 = read_out(out[0], "adapter_model.safetensors", &n0);
    char *a1 = read_out(out[1], "adapter_model.safetensors", &n1);
    char *a2 = read_out(out[2], "adapter_model.safetensors", &n2);
    assert_int_equal(n0, n1);
    assert_memory_equal(a0, a1, n0);
    assert_int_equal(n0, n2);
    assert_true(memcmp(a0, a2, n0) != 0);
    free(a0);
    free(a1);
    free(a2);
    /* the ratio is recorded only when on */
    char *s0 = read_out(out[0], "summary.json", &n0), *s2 = read_out(out[2], "summary.json", &n2);
    assert_null(strstr(s0, "loraplus_lr_ratio"));
    assert_non_null(strstr(s2, "\"loraplus_lr_ratio\":\t16"));
    free(s0);
    free(s2);
    assert_int_equal(t_rmtree(dir), 0);
}

/* Trains `steps` steps at ratio 16 (weight decay 0, cosine over `steps`, no warmup) and
 * returns the largest |B| and |A - A_init| over all adapted linears of the adapter
 * written; A_init is PEFT's init of the same seed (ft_lora_init). */
static void max_changes(int64_t steps, double *max_b, double *max_da, double *lr_t)
{
    char *dir = t_tmpdir();
    assert_non_null(dir);
    ft_train_cfg c;
    base_cfg(&c, dir, steps, 16);
    train_ok(&c);
    ft_model *m;
    ft_backend *be;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    ft_lora_cfg lc = c.lora;
    lc.seed = c.seed;
    ft_lora l;
    assert_int_equal(ft_lora_init(&l, m, &lc, be), 0);
    assert_int_equal(ft_lora_pull(&l), 0); /* l.host = the initial A (and B = 0) */
    float *trained = malloc((size_t)l.n_params * sizeof *trained);
    assert_non_null(trained);
    assert_int_equal(ft_peft_load_values(dir, &l, trained), 0);
    *max_b = *max_da = 0;
    int64_t n_lin = 0;
    for (int64_t i = 0; i < l.n_layers; i++) {
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l.lin[i][p];
            if (!ll->A) continue;
            n_lin++;
            int64_t oa = ll->A - l.params, ob = ll->B - l.params;
            for (int64_t j = 0; j < l.cfg.r * ll->in_n; j++)
                *max_da = fmax(*max_da, fabs((double)trained[oa + j] - (double)l.host[oa + j]));
            for (int64_t j = 0; j < ll->out_n * l.cfg.r; j++) {
                assert_true(l.host[ob + j] == 0.0f); /* PEFT init */
                *max_b = fmax(*max_b, fabs((double)trained[ob + j]));
            }
        }
    }
    assert_int_equal(n_lin, 2 * FT_N_PROJ); /* all seven modules of both layers */
    *lr_t = ft_schedule_lr(c.schedule, c.lr, steps - 1, 0, steps, c.min_lr_ratio);
    free(trained);
    ft_lora_free(&l);
    ft_backend_free(be);
    ft_model_free(m);
    assert_int_equal(t_rmtree(dir), 0);
}

/* 2a. One step from PEFT init (B = 0): B's first update is 16 * lr_1 * g/(|g| + eps), so
 *     max|B| = 16 lr_1. A does not move: its gradient is 0 while B = 0 (dA = scale *
 *     (dy B)^T x), and Adam's update of a zero gradient with zero moments is 0.
 * 2b. Two steps: A's first non-zero gradient comes at Adam step 2 with m = v = 0 before,
 *     so m_hat = (1-b1) g / (1-b1^2) = g / (1+b1), v_hat = g^2 / (1+b2) and the update
 *     is lr_2 * sqrt(1+b2) / (1+b1) * sign(g) (lr_2 = lr/2 on the cosine of 2 steps):
 *     A steps at lr(t), not at 16 lr(t). */
static void test_first_updates(void **state)
{
    (void)state;
    double max_b, max_da, lr1;
    max_changes(1, &max_b, &max_da, &lr1);
    print_message("1 step: lr_1 %.6g, max|B| %.9g (16 lr_1 = %.9g), max|A - A_init| %g\n",
                  lr1, max_b, 16 * lr1, max_da);
    assert_true(lr1 == 1e-3);
    assert_true(fabs(max_b / (16 * lr1) - 1) < TOL_REL);
    assert_true(max_da == 0);

    double lr2;
    const double b1 = 0.9, b2 = 0.999, c2 = sqrt(1 + b2) / (1 + b1);
    max_changes(2, &max_b, &max_da, &lr2);
    print_message("2 steps: lr_2 %.6g, max|A - A_init| %.9g (lr_2 * %.6f = %.9g)\n", lr2, max_da,
                  c2, lr2 * c2);
    assert_true(fabs(lr2 - 0.5e-3) < 1e-15);
    assert_true(fabs(max_da / (lr2 * c2) - 1) < TOL_REL);
}

/* 3. ft_train_run refuses a negative or non-finite ratio before loading anything. */
static void test_bad_ratio_refused(void **state)
{
    (void)state;
    const double bad[2] = {-1, INFINITY};
    for (int k = 0; k < 2; k++) {
        ft_train_cfg c;
        base_cfg(&c, "/nonexistent/ftune-loraplus", 1, bad[k]);
        ft_train_result res;
        assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
        assert_non_null(strstr(ft_errmsg(), "--loraplus-lr-ratio"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ratio_one_is_off),
        cmocka_unit_test(test_first_updates),
        cmocka_unit_test(test_bad_ratio_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
