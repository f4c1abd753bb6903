/* gpu_fixture.h - the cmocka fixture of the GPU tests (tests/gpu/test_cuda_*.c): a CUDA
 * backend (NULL without a GPU or in a build without CUDA: NEED_GPU then skips the test), a
 * CPU backend for the CPU twins when asked, and a seeded RNG. Include after harness.h. */
#ifndef FT_TEST_GPU_FIXTURE_H
#define FT_TEST_GPU_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"

typedef struct fix {
    ft_backend *cpu, *gpu;  /* cpu: NULL unless asked for */
    ft_rng rng;
    double worst[8];        /* test_cuda_attn: the largest error seen per output kind */
} fix;

/* The fixture in *state; with_cpu: also a CPU backend (its failure fails the group). */
static int gpu_fixture_setup(void **state, uint64_t seed, int with_cpu)
{
    fix *f = calloc(1, sizeof *f);
    if (!f) return -1;
    if (ft_backend_cuda_init(&f->gpu, 0) < 0) {
        fprintf(stderr, "no CUDA backend: %s\n", ft_errmsg());
        f->gpu = NULL;
    }
    if (with_cpu && ft_backend_cpu_init(&f->cpu, 0) < 0) return -1;
    ft_rng_seed(&f->rng, seed);
    *state = f;
    return 0;
}

static int gpu_fixture_teardown(void **state)
{
    fix *f = *state;
    ft_backend_free(f->gpu);
    ft_backend_free(f->cpu);
    free(f);
    return 0;
}

#define NEED_GPU(f) do { if (!(f)->gpu) { skip(); } } while (0)

#endif
