/* rows_fixture.h - shared by the tests of the CPU's few-rows products (test_rows_f32.c,
 * test_lmhead_bf16.c: kernels/cpu/rows_f32.h): random operands and the thread-count check.
 * Include after harness.h. */
#ifndef FT_TEST_ROWS_FIXTURE_H
#define FT_TEST_ROWS_FIXTURE_H

#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/rows_f32.h"
#include "src/core/rng.h"

/* n fp32 uniforms in [-1, 1) from seed (caller frees). */
static inline float *randv(int64_t n, uint64_t seed)
{
    float *v = malloc((size_t)n * sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = ft_rng_uniform(&r) * 2.0f - 1.0f;
    return v;
}

/* The (T, V) rows of x (T, C) times W (V, C; bf16: uint16_t bf16 values, else fp32), path
 * FT_ROWS_F32_AUTO, at 1 OpenMP thread into y and at 2 into y2: the same bits. The thread
 * count is put back. */
static inline void rows_same_at_1_and_2_threads(float *y, float *y2, const float *x, const void *W,
                                                int bf16, int64_t T, int64_t C, int64_t V)
{
    const int nt = omp_get_max_threads();
    float *out[2] = {y, y2};
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        assert_int_equal(bf16 ? ft_cpu_rows_bf16(out[k], x, W, T, C, V, FT_ROWS_F32_AUTO)
                              : ft_cpu_rows_f32(out[k], x, W, T, C, V, FT_ROWS_F32_AUTO), 0);
    }
    omp_set_num_threads(nt);
    assert_memory_equal(y, y2, (size_t)(T * V) * sizeof(float));
}

#endif
