/* model_fixture.h - shared by the tests that run tests/fixtures/tiny-llama (test_exec.c,
 * test_generate.c, test_gen_truncate.c, test_checkpoint.c, test_ckpt.c, test_lmhead_bf16.c,
 * test_dpo.c, test_neftune.c, test_tiers.c): the model on a CPU backend with a random
 * adapter, as a cmocka fixture or opened in a test; on a cpu-device backend with its NF4
 * pack; a pack-only copy of it; the logit comparisons of the generation tests. Include
 * after harness.h. */
#ifndef FT_TEST_MODEL_FIXTURE_H
#define FT_TEST_MODEL_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/lora.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/tools/init_model.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

#define TINY "tests/fixtures/tiny-llama"

/* tiny-llama in *m, a CPU backend of `threads` threads in *be and, with lc (else lora is left
 * zeroed), the adapter lc in *lora with every parameter, A and B, (uniform - 0.5) * scale from
 * seed (B = 0 at init would make the adapter a no-op), pushed. 0, or -1 with the error on
 * stderr (what was opened stays for tiny_close). */
static inline int tiny_open(ft_model **m, ft_backend **be, ft_lora *lora, int threads,
                            const ft_lora_cfg *lc, uint64_t seed, float scale)
{
    *m = NULL;
    *be = NULL;
    if (lora) memset(lora, 0, sizeof *lora);
    if (ft_model_load(m, TINY) < 0) {
        fprintf(stderr, "load %s: %s\n", TINY, ft_errmsg());
        return -1;
    }
    if (ft_backend_cpu_init(be, threads) < 0) return -1;
    if (!lc) return 0;
    if (ft_lora_init(lora, *m, lc, *be) < 0) return -1;
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int64_t i = 0; i < lora->n_params; i++) lora->host[i] = (ft_rng_uniform(&rng) - 0.5f) * scale;
    return ft_lora_push(lora) < 0 ? -1 : 0;
}

/* Frees what tiny_open made (lora may be NULL or zeroed). */
static inline void tiny_close(ft_model *m, ft_backend *be, ft_lora *lora)
{
    ft_lora_free(lora);
    ft_backend_free(be);
    ft_model_free(m);
}

/* tiny-llama in *m on a new CPU backend of `threads` threads in *be, with stream_lora_init's
 * adapter (the given dropout) in *lora; tiny_close frees them. */
static inline void tiny_stream_open(ft_model **m, ft_backend **be, ft_lora *lora, int threads,
                                    float dropout)
{
    assert_int_equal(tiny_open(m, be, NULL, threads, NULL, 0, 0.0f), 0);
    stream_lora_init(lora, *be, *m, dropout);
}

/* tiny-llama in *m on a new cpu-device backend (the executor's device mode) of `threads`
 * threads in *be, and its NF4 pack in a temp cache folder (stream_pack_open) in sp;
 * tiny_device_close frees them. */
static inline void tiny_device_open(ft_model **m, ft_backend **be, stream_pack *sp, int threads)
{
    assert_int_equal(ft_backend_cpu_device_init(be, threads), 0);
    assert_int_equal(ft_model_load(m, TINY), 0);
    stream_pack_open(sp, TINY);
}

static inline void tiny_device_close(ft_model *m, ft_backend *be, stream_pack *sp)
{
    stream_pack_close(sp);
    ft_model_free(m);
    ft_backend_free(be);
}

/* The cmocka fixture of tiny_open: *state = a model_fix (lc: settings of the test's own). */
typedef struct model_fix { ft_model *m; ft_backend *be; ft_lora lora; ft_lora_cfg lc; } model_fix;

static inline int model_fix_teardown(void **state)
{
    model_fix *f = *state;
    if (f) tiny_close(f->m, f->be, &f->lora);
    free(f);
    return 0;
}

static inline int model_fix_setup(void **state, int threads, const ft_lora_cfg *lc, uint64_t seed,
                                  float scale)
{
    model_fix *f = calloc(1, sizeof *f);
    *state = f;
    if (f && tiny_open(&f->m, &f->be, &f->lora, threads, lc, seed, scale) == 0) return 0;
    model_fix_teardown(state); /* cmocka runs no teardown after a failed setup */
    *state = NULL;
    return -1;
}

/* A pack-only tiny-llama (config.json + NF4 pack + tokenizer) in dir/name, its path in out (n
 * bytes); untied: its config with tie_word_embeddings false, so the pack holds an LM head
 * apart from the embeddings. */
static inline void write_pack_only(const char *dir, const char *name, int untied, char *out, size_t n)
{
    char cfg[700];
    snprintf(out, n, "%s/%s", dir, name);
    snprintf(cfg, sizeof cfg, "%s", TINY "/config.json");
    if (untied) {
        char *txt;
        size_t len;
        assert_int_equal(ft_read_file(TINY "/config.json", &txt, &len), 0);
        char *at = strstr(txt, "\"tie_word_embeddings\": true");
        assert_non_null(at);
        memcpy(at, "\"tie_word_embeddings\":false", 27);
        snprintf(cfg, sizeof cfg, "%s/%s.json", dir, name);
        assert_int_equal(ft_write_file_atomic(cfg, txt, len), 0);
        free(txt);
    }
    ft_init_cfg c = {cfg, out, 5, 0, 0, FT_PACK_QUANT_NF4, TINY};
    ft_init_result res;
    assert_int_equal(ft_init_model(&c, &res), 0);
}

/* write_pack_only's tied and untied tiny-llama (folders "tied", "untied", n bytes for each
 * path) in a new temp folder, which is returned (t_rmtree removes it). */
static inline char *write_pack_only_pair(char *tied, char *untied, size_t n)
{
    char *dir = t_tmpdir();
    assert_non_null(dir);
    write_pack_only(dir, "tied", 0, tied, n);
    write_pack_only(dir, "untied", 1, untied, n);
    return dir;
}

/* The model of a pack-only folder dir (write_pack_only: no weights of its own) in *m and its
 * pack, opened, in *pack (ft_pack_close, then ft_model_free). */
static inline void pack_only_load(const char *dir, ft_model **m, ft_pack_file **pack)
{
    assert_int_equal(ft_model_load(m, dir), 0);
    assert_true((*m)->pack_only[0] && !(*m)->embed);
    assert_int_equal(ft_pack_open(pack, (*m)->pack_only, 0), 0);
}

/* max |x[i]| over n floats (logits), in double. */
static inline double max_abs(const float *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* max |a[i] - b[i]| over n floats, in double. */
static inline double max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

#endif
