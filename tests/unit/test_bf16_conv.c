/* test_bf16_conv.c - the array conversions of src/numeric/quant.h (ft_quant_bf16_to_f32_n,
 * ft_quant_f32_to_bf16_n, ft_quant_round_bf16_n) against fixed bit patterns worked out by
 * hand from round-to-nearest-even (torch .to(bfloat16) gives the same) and against the
 * scalar functions over random bits, on both sides of the OpenMP threshold. */
#include "tests/unit/harness.h"

#include <omp.h>

#include "src/core/rng.h"
#include "src/numeric/quant.h"

static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* fp32 bits -> the bf16 bits round-to-nearest-even gives */
static const uint32_t k_cases[][2] = {
    {0x00000000u, 0x0000u}, {0x80000000u, 0x8000u},   /* +-0 */
    {0x3f800000u, 0x3f80u},                           /* 1 */
    {0x3f808000u, 0x3f80u},                           /* 1 + 2^-8: a tie, to even (down) */
    {0x3f818000u, 0x3f82u},                           /* 1 + 3*2^-8: a tie, to even (up) */
    {0x3f808001u, 0x3f81u},                           /* just above the tie */
    {0x3f807fffu, 0x3f80u},                           /* just below it */
    {0x00008000u, 0x0000u}, {0x00018000u, 0x0002u},   /* subnormal ties */
    {0x7f7fffffu, 0x7f80u},                           /* max finite rounds to inf */
    {0x7f7f7fffu, 0x7f7fu},                           /* stays finite */
    {0x7f800000u, 0x7f80u}, {0xff800000u, 0xff80u},   /* +-inf */
    {0x7fc00000u, 0x7fc0u},                           /* quiet NaN */
    {0x7f800001u, 0x7fc0u},                           /* signalling NaN, low payload: quieted */
    {0xff810000u, 0xffc1u},                           /* negative sNaN, top payload kept */
    {0x7fffffffu, 0x7fffu},                           /* NaN that a plain round would carry */
};
#define N_CASES ((int)(sizeof k_cases / sizeof k_cases[0]))

static void test_fixed_patterns(void **state)
{
    (void)state;
    float x[N_CASES], y[N_CASES], back[N_CASES];
    uint16_t h[N_CASES];
    for (int i = 0; i < N_CASES; i++) x[i] = f_of(k_cases[i][0]);
    ft_quant_f32_to_bf16_n(h, x, N_CASES);
    ft_quant_round_bf16_n(y, x, N_CASES);
    ft_quant_bf16_to_f32_n(back, h, N_CASES);
    for (int i = 0; i < N_CASES; i++) {
        if (h[i] != k_cases[i][1])
            fail_msg("0x%08x -> 0x%04x, expected 0x%04x", k_cases[i][0], h[i], k_cases[i][1]);
        assert_int_equal(ft_quant_f32_to_bf16(x[i]), k_cases[i][1]);
        assert_int_equal(u_of(y[i]), k_cases[i][1] << 16);
        assert_int_equal(u_of(back[i]), k_cases[i][1] << 16);
    }
}

/* n random bit patterns (every exponent, NaNs included): the arrays equal the scalars. */
static void check_random(int64_t n, int threads)
{
    omp_set_num_threads(threads);
    uint32_t *u = malloc((size_t)n * 4);
    float *y = malloc((size_t)n * 4), *back = malloc((size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    assert_true(u && y && back && h);
    ft_rng rng;
    ft_rng_seed(&rng, 11);
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)(ft_rng_next(&rng) >> 32);
    const float *x = (const float *)u;
    ft_quant_f32_to_bf16_n(h, x, n);
    ft_quant_round_bf16_n(y, x, n);
    ft_quant_bf16_to_f32_n(back, h, n);
    for (int64_t i = 0; i < n; i++) {
        uint16_t want = ft_quant_f32_to_bf16(x[i]);
        if (h[i] != want || u_of(y[i]) != (uint32_t)want << 16 ||
            u_of(back[i]) != u_of(ft_quant_bf16_to_f32(want)))
            fail_msg("element %lld (0x%08x): 0x%04x / 0x%08x / 0x%08x, scalar 0x%04x", (long long)i,
                     u[i], h[i], u_of(y[i]), u_of(back[i]), want);
    }
    ft_quant_round_bf16_n((float *)u, x, n); /* in place */
    for (int64_t i = 0; i < n; i++) assert_int_equal(u[i], u_of(y[i]));
    free(u);
    free(y);
    free(back);
    free(h);
}

static void test_random_small(void **state) { (void)state; check_random(1000, 1); }
static void test_random_threads(void **state) { (void)state; check_random(300001, 2); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_patterns),
        cmocka_unit_test(test_random_small),
        cmocka_unit_test(test_random_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
