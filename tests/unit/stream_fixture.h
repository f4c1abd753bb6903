/* stream_fixture.h - micro-batches shared by the streaming tests (tests/unit/test_stream.c,
 * tests/gpu/test_cuda_stream.c): n micro-batches of one row of S random tokens below V, two
 * packed sequences each (targets: the next token, -100 at each sequence's end). */
#ifndef FT_TEST_STREAM_FIXTURE_H
#define FT_TEST_STREAM_FIXTURE_H

#include <stdlib.h>

#include "src/core/rng.h"
#include "src/data/dataset.h"

static void stream_make_batches(ft_batch *b, int n, int64_t S, int64_t V)
{
    ft_rng rng;
    ft_rng_seed(&rng, 31);
    for (int i = 0; i < n; i++) {
        b[i] = (ft_batch){1, S, S};
        b[i].ids = malloc(S * 4);
        b[i].targets = malloc(S * 4);
        b[i].pos = malloc(S * 4);
        b[i].seq_start = malloc(S * 4);
        for (int64_t t = 0; t < S; t++) b[i].ids[t] = (int32_t)(ft_rng_next(&rng) % (uint64_t)V);
        for (int64_t t = 0; t < S; t++) {
            int64_t start = t < S / 2 ? 0 : S / 2, end = t < S / 2 ? S / 2 : S;
            b[i].pos[t] = (int32_t)(t - start);
            b[i].seq_start[t] = (int32_t)start;
            b[i].targets[t] = t + 1 < end ? b[i].ids[t + 1] : -100;
            b[i].n_targets += b[i].targets[t] >= 0;
        }
    }
}

static void stream_free_batches(ft_batch *b, int n)
{
    for (int i = 0; i < n; i++) {
        free(b[i].ids);
        free(b[i].targets);
        free(b[i].pos);
        free(b[i].seq_start);
    }
}

#endif
