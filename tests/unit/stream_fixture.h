/* stream_fixture.h - shared by the executor tests (tests/unit/test_stream.c, test_ckpt.c,
 * tests/unit/tiers_cases.h): n micro-batches of one row of random tokens below V, two packed
 * sequences each (targets: the next token, -100 at each sequence's end), the tiny model
 * made deeper by repeating its layers, the adapter, and an NF4 pack in a temporary cache folder. Include
 * after harness.h. */
#ifndef FT_TEST_STREAM_FIXTURE_H
#define FT_TEST_STREAM_FIXTURE_H

#include <stdlib.h>
#include <unistd.h>

#include "src/model/lora.h"
#include "offload/pack.h"
#include "src/core/rng.h"
#include "src/data/dataset.h"
#include "src/model/model.h"

/* The executor tests' adapter on be: r 4, alpha 8, the given dropout, every target, and
 * random A and B (seed 77, B != 0 so the adapter changes the loss from step 1). */
static inline void stream_lora_init(ft_lora *lora, ft_backend *be, const ft_model *m, float dropout)
{
    ft_lora_cfg lc = {4, 8.0f, dropout, 0, FT_LORA_ALL_TARGETS, 5};
    assert_int_equal(ft_lora_init(lora, m, &lc, be), 0);
    ft_rng rng;
    ft_rng_seed(&rng, 77);
    for (int64_t i = 0; i < lora->n_params; i++) lora->host[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.1f;
    assert_int_equal(ft_lora_push(lora), 0);
}

/* The NF4 pack of the model folder `model`, built into a fresh cache folder under /tmp (a
 * real disk here, for the disk tier's O_DIRECT reads); stream_pack_close removes both. */
typedef struct stream_pack {
    char *dir;
    ft_pack_ensure_info *info;
    ft_pack_file *pack;
} stream_pack;

static inline void stream_pack_open(stream_pack *sp, const char *model)
{
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, FT_PACK_QUANT_NF4);
    sp->dir = t_tmpdir();
    sp->info = calloc(1, sizeof *sp->info);
    assert_non_null(sp->dir);
    assert_non_null(sp->info);
    assert_int_equal(ft_pack_ensure(model, sp->dir, &ps, 0, sp->info), 0);
    assert_int_equal(ft_pack_open(&sp->pack, sp->info->path, 1), 0);
}

static inline void stream_pack_close(stream_pack *sp)
{
    ft_pack_close(sp->pack);
    unlink(sp->info->path);
    rmdir(sp->dir);
    free(sp->info);
    free(sp->dir);
}

/* Micro-batch i has S - shrink * (i % 4) tokens (shrink 0: all S). */
static inline void stream_make_batches_ragged(ft_batch *b, int n, int64_t S_max, int64_t shrink, int64_t V)
{
    ft_rng rng;
    ft_rng_seed(&rng, 31);
    for (int i = 0; i < n; i++) {
        int64_t S = S_max - shrink * (i % 4);
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

static inline void stream_make_batches(ft_batch *b, int n, int64_t S, int64_t V)
{
    stream_make_batches_ragged(b, n, S, 0, V);
}

static inline void stream_free_batches(ft_batch *b, int n)
{
    for (int i = 0; i < n; i++) {
        free(b[i].ids);
        free(b[i].targets);
        free(b[i].pos);
        free(b[i].seq_start);
    }
}

/* The model m with its layers repeated to L layers (shares m's weight arrays; free with
 * free(d->layers), free(d), before m). */
static inline ft_model *stream_deepen(const ft_model *m, int64_t L)
{
    ft_model *d = malloc(sizeof *d);
    *d = *m;
    d->cfg.num_hidden_layers = L;
    d->layers = malloc((size_t)L * sizeof *d->layers);
    for (int64_t l = 0; l < L; l++) d->layers[l] = m->layers[l % m->cfg.num_hidden_layers];
    d->priv = NULL;
    return d;
}

#endif
