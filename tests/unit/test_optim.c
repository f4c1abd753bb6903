/* test_optim.c - src/train/optim.h (AdamW over the parameter groups, clipping, grad norm,
 * schedule) and the groups it reads, src/model/lora.h ft_lora_slices, on tiny-llama's adapter
 * on the CPU backend:
 *   - the slices tile the flat parameters in layer, projection order, A (r x in) then
 *     B (out x r), and name the linears' own A/B pointers;
 *   - LoRA+ ratio 1 updates params and both moments to the same bits as one group; ratio 16
 *     leaves every A slice as one group leaves it and changes every B slice;
 *   - the grad norm is the double sum of squares' root; clipping scales to max / (norm + 1e-6)
 *     only above the max;
 *   - slices that do not cover the parameters are refused at init. */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/train/optim.h"
#include "src/train/schedule.h"
#include "tests/unit/model_fixture.h"

#define TARGETS ((1u << FT_Q) | (1u << FT_V) | (1u << FT_DOWN))

static void open_adapter(ft_model **m, ft_backend **be, ft_lora *l, uint64_t seed)
{
    ft_lora_cfg lc = {3, 6.0f, 0.0f, 0, TARGETS, 7};
    assert_int_equal(tiny_open(m, be, l, 1, &lc, seed, 0.2f), 0);
}

/* Gradients: (uniform - 0.5) * scale from seed, copied into l->grads. */
static void set_grads(ft_lora *l, uint64_t seed, float scale)
{
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < l->n_params; i++) l->grads[i] = (ft_rng_uniform(&r) - 0.5f) * scale;
}

static void test_slices_tile(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    open_adapter(&m, &be, &l, 1);
    int64_t n = ft_lora_slices(&l, NULL, 0);
    assert_int_equal(n, 2 * l.n_layers * 3);
    ft_lora_slice *s = calloc((size_t)n, sizeof *s);
    assert_int_equal(ft_lora_slices(&l, s, n), n);
    int64_t off = 0, k = 0;
    for (int64_t i = 0; i < l.n_layers; i++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &l.lin[i][p];
            if (!(TARGETS & (1u << p))) {
                assert_null(ll->A);
                continue;
            }
            assert_int_equal(s[k].group, FT_LORA_GROUP_A);
            assert_int_equal(s[k].off, off);
            assert_int_equal(s[k].n, l.cfg.r * ll->in_n);
            assert_ptr_equal(l.params + s[k].off, ll->A);
            off += s[k++].n;
            assert_int_equal(s[k].group, FT_LORA_GROUP_B);
            assert_int_equal(s[k].off, off);
            assert_int_equal(s[k].n, ll->out_n * l.cfg.r);
            assert_ptr_equal(l.params + s[k].off, ll->B);
            off += s[k++].n;
        }
    assert_int_equal(k, n);
    assert_int_equal(off, l.n_params);
    /* a short array gets the first cap slices, the count stays the total */
    ft_lora_slice two[2];
    assert_int_equal(ft_lora_slices(&l, two, 2), n);
    for (int j = 0; j < 2; j++)
        assert_true(two[j].off == s[j].off && two[j].n == s[j].n && two[j].group == s[j].group);
    free(s);
    tiny_close(m, be, &l);
}

/* Two AdamW steps (the clip in between) of the adapter from seed 3 with LoRA+ ratio `ratio`,
 * weight decay on; *out gets params, m and v (3 n_params floats, malloc'ed). */
static float *two_steps(double ratio, int64_t *n_out)
{
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    open_adapter(&m, &be, &l, 3);
    ft_optim o;
    ft_optim_cfg c = {1e-3, FT_SCHED_COSINE, 1, 4, 0.1, 0.9, 0.999, 1e-8, 0.01, 1.0, ratio};
    assert_int_equal(ft_optim_init(&o, &c, &l), 0);
    assert_true(ratio > 0 ? o.slices != NULL : o.slices == NULL);
    for (int64_t step = 0; step < 2; step++) {
        set_grads(&l, 100 + (uint64_t)step, 0.5f);
        double norm;
        assert_int_equal(ft_optim_grad_norm(&o, &norm), 0);
        assert_int_equal(ft_optim_clip(&o, norm), 0);
        assert_int_equal(ft_optim_step(&o, ft_optim_lr(&o, step), step + 1), 0);
    }
    const int64_t n = l.n_params;
    float *out = malloc((size_t)(3 * n) * sizeof *out);
    memcpy(out, l.params, (size_t)n * sizeof *out);
    memcpy(out + n, l.m, (size_t)n * sizeof *out);
    memcpy(out + 2 * n, l.v, (size_t)n * sizeof *out);
    *n_out = n;
    ft_optim_free(&o);
    tiny_close(m, be, &l);
    return out;
}

static void test_loraplus_groups(void **state)
{
    (void)state;
    int64_t n, n1, n16;
    float *off = two_steps(0, &n), *one = two_steps(1, &n1), *plus = two_steps(16, &n16);
    assert_int_equal(n, n1);
    assert_memory_equal(off, one, (size_t)(3 * n) * sizeof *off);
    /* ratio 16: each A slice as without LoRA+, each B slice other (its lr is 16 x) */
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    open_adapter(&m, &be, &l, 3);
    ft_lora_slice s[64];
    int64_t ns = ft_lora_slices(&l, s, 64);
    assert_true(ns <= 64);
    for (int64_t k = 0; k < ns; k++) {
        const size_t bytes = (size_t)s[k].n * sizeof(float);
        int same = !memcmp(off + s[k].off, plus + s[k].off, bytes);
        if (s[k].group == FT_LORA_GROUP_A) assert_true(same);
        else assert_false(same);
    }
    tiny_close(m, be, &l);
    free(off);
    free(one);
    free(plus);
}

static void test_norm_and_clip(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    open_adapter(&m, &be, &l, 5);
    ft_optim o;
    ft_optim_cfg c = {2e-4, FT_SCHED_LINEAR, 2, 10, 0, 0.9, 0.999, 1e-8, 0, 0.5, 0};
    assert_int_equal(ft_optim_init(&o, &c, &l), 0);
    for (int64_t step = 0; step < 10; step++)
        assert_true(ft_optim_lr(&o, step) == ft_schedule_lr(FT_SCHED_LINEAR, 2e-4, step, 2, 10, 0));
    set_grads(&l, 9, 0.5f);
    double sq = 0, norm;
    for (int64_t i = 0; i < l.n_params; i++) sq += (double)l.grads[i] * l.grads[i];
    assert_int_equal(ft_optim_grad_norm(&o, &norm), 0);
    assert_true(fabs(norm - sqrt(sq)) <= 1e-12 * sqrt(sq));
    assert_true(norm > 0.5);
    float *before = malloc((size_t)l.n_params * sizeof *before);
    memcpy(before, l.grads, (size_t)l.n_params * sizeof *before);
    /* above the max: scaled by max / (norm + 1e-6) */
    assert_int_equal(ft_optim_clip(&o, norm), 0);
    const float f = (float)(0.5 / (norm + 1e-6));
    for (int64_t i = 0; i < l.n_params; i++) assert_true(l.grads[i] == before[i] * f);
    double after;
    assert_int_equal(ft_optim_grad_norm(&o, &after), 0);
    assert_true(fabs(after - 0.5) < 1e-5);
    /* at or below the max, or with the clip off: unchanged */
    memcpy(before, l.grads, (size_t)l.n_params * sizeof *before);
    assert_int_equal(ft_optim_clip(&o, 0.5), 0);
    o.cfg.max_grad_norm = 0;
    assert_int_equal(ft_optim_clip(&o, 1e9), 0);
    assert_memory_equal(before, l.grads, (size_t)l.n_params * sizeof *before);
    assert_int_equal(ft_optim_zero_grad(&o), 0);
    for (int64_t i = 0; i < l.n_params; i++) assert_true(l.grads[i] == 0.0f);
    free(before);
    ft_optim_free(&o);
    tiny_close(m, be, &l);
}

static void test_uncovered_refused(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    ft_lora l;
    open_adapter(&m, &be, &l, 1);
    ft_optim o;
    ft_optim_cfg c = {1e-3, FT_SCHED_CONSTANT, 0, 1, 0, 0.9, 0.999, 1e-8, 0, 1.0, 16};
    l.n_params++; /* a parameter no slice names */
    assert_int_equal(ft_optim_init(&o, &c, &l), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "LoRA+"));
    assert_null(o.slices);
    l.n_params--;
    c.loraplus_lr_ratio = 0; /* one group: nothing to check */
    l.n_params++;
    assert_int_equal(ft_optim_init(&o, &c, &l), 0);
    l.n_params--;
    ft_optim_free(&o);
    tiny_close(m, be, &l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_tile),
        cmocka_unit_test(test_loraplus_groups),
        cmocka_unit_test(test_norm_and_clip),
        cmocka_unit_test(test_uncovered_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
