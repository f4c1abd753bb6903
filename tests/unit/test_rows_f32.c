/* test_rows_f32.c - the CPU product of a few rows with a wide fp32 weight (kernels/cpu/
 * rows_f32.c): against fp64 on shapes with and without a C % 8 tail, T = 1..9 and more than
 * one pass of 64 rows; a row's bits do not depend on the rows computed with it or on the
 * thread count; the backend's lm_head_logits takes it for up to FT_CPU_ROWS_F32_MAX rows; the
 * refusals. */
#include "tests/unit/harness.h"

#include "kernels/cpu/simd_x86.h"
#include "kernels/cpu/rows_f32.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "tests/unit/rows_fixture.h"

static void test_vs_fp64(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{576, 300}, {64, 33}, {13, 17}, {1, 5}, {4096, 40}};
    const int paths[2] = {FT_ROWS_F32_PORTABLE, FT_ROWS_F32_AVX2};
    for (int s = 0; s < 5; s++) {
        const int64_t C = shapes[s][0], V = shapes[s][1], TM = 70;
        float *W = randv(V * C, 10 + s), *x = randv(TM * C, 20 + s);
        float *y = malloc((size_t)(TM * V) * sizeof(float)), *y1 = malloc((size_t)V * sizeof(float));
        for (int p = 0; p < 2; p++) {
            if (paths[p] == FT_ROWS_F32_AVX2 && !ft_cpu_have_avx2()) continue;
            for (int64_t T = 1; T <= TM; T += T < 9 ? 1 : 61) {
                assert_int_equal(ft_cpu_rows_f32(y, x, W, T, C, V, paths[p]), 0);
                double worst = 0;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t v = 0; v < V; v++) {
                        double ref = 0, mag = 0;
                        for (int64_t c = 0; c < C; c++) {
                            ref += (double)W[v * C + c] * x[t * C + c];
                            mag += fabs((double)W[v * C + c] * x[t * C + c]);
                        }
                        double e = fabs(y[t * V + v] - ref) / (mag + 1e-30);
                        worst = fmax(worst, e);
                    }
                assert_true(worst < 1e-5 * (1 + C / 512.0));
                /* each row alone: the same bits */
                for (int64_t t = 0; t < T; t++) {
                    assert_int_equal(ft_cpu_rows_f32(y1, x + t * C, W, 1, C, V, paths[p]), 0);
                    assert_memory_equal(y1, y + t * V, (size_t)V * sizeof(float));
                }
            }
        }
        free(W);
        free(x);
        free(y);
        free(y1);
    }
}

static void test_threads_backend_refusals(void **state)
{
    (void)state;
    const int64_t C = 576, V = 2000, T = 5;
    float *W = randv(V * C, 3), *x = randv(T * C, 4);
    float *y = malloc((size_t)(T * V) * sizeof(float)), *y2 = malloc((size_t)(T * V) * sizeof(float));
    rows_same_at_1_and_2_threads(y, y2, x, W, 0, T, C, V);
    /* the CPU backend's LM head: this kernel for a few rows */
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    assert_int_equal(be->ops->lm_head_logits(be, y2, x, W, T, C, V), 0);
    assert_memory_equal(y, y2, (size_t)(T * V) * sizeof(float));
    ft_backend_free(be);
    /* refusals */
    assert_int_equal(ft_cpu_rows_f32(y, x, W, -1, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_f32(y, NULL, W, T, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_f32(y, x, W, T, C, V, 7), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_f32(NULL, NULL, NULL, 0, C, V, FT_ROWS_F32_AUTO), 0);
    free(W);
    free(x);
    free(y);
    free(y2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_fp64),
        cmocka_unit_test(test_threads_backend_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
