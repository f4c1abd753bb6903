/* kernels_fixture.h - shared by the CPU op tests (test_kernels_fwd.c, test_kernels_grad.c):
 * the backend the ops run on, splitmix64 random numbers, packed-sequence starts. Include
 * after harness.h. */
#ifndef FT_TEST_KERNELS_FIXTURE_H
#define FT_TEST_KERNELS_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>

#include "kernels/kernels.h"

/* The CPU backend of the tests (all threads), made by kernels_setup (the group setup): its init
 * sets the threading the ops are built for (OpenMP team, OpenBLAS single-threaded), under
 * which the fp64 instance runs too. */
static ft_backend *g_be;

static inline int kernels_setup(void **state)
{
    (void)state;
    return ft_backend_cpu_init(&g_be, 0);
}

/* Frees g_be, and frees NULL (a no-op). */
static inline int kernels_teardown(void **state)
{
    (void)state;
    ft_backend_free(g_be);
    ft_backend_free(NULL);
    return 0;
}

/* splitmix64 (Steele, Lea, Flood 2014): the output for state z, the step 0x9E3779B97F4A7C15
 * added first. */
static inline uint64_t t_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The next uniform in [lo, hi) of the splitmix64 stream *s (53 bits). */
static inline double t_unif_at(uint64_t *s, double lo, double hi)
{
    const uint64_t z = t_mix64(*s);
    *s += 0x9E3779B97F4A7C15ull;
    return lo + (hi - lo) * (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* seq_start (T int32, caller frees) of n_seq contiguous sequences of lengths lens (sum T). */
static inline int32_t *t_seq_start(const int64_t *lens, int n_seq, int64_t T)
{
    int32_t *s = malloc(T * sizeof(int32_t));
    int64_t t = 0;
    for (int i = 0; i < n_seq; i++)
        for (int64_t j = 0; j < lens[i]; j++, t++) s[t] = (int32_t)(t - j);
    assert_int_equal(t, T);
    return s;
}

#endif
