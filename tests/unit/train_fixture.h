/* train_fixture.h - shared by the training tests on tests/fixtures/tiny-llama (test_dpo.c,
 * test_neftune.c, test_loraplus.c): the settings of a whole run, a run that must succeed, and
 * reading what a run wrote. Include after harness.h. */
#ifndef FT_TEST_TRAIN_FIXTURE_H
#define FT_TEST_TRAIN_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/train/trainer.h"
#include "tests/unit/model_fixture.h"

/* The settings the whole-run tests start from: ft_train_defaults, then tiny-llama trained on
 * data[0] (a static array: c keeps the pointer) into out for `steps` steps on $FTUNE_DEVICE
 * (cpu unless set; run_tests.sh sets cpu) with `threads` threads; 64-token sequences, seed 5,
 * lr 1e-3 without warmup, LoRA r 4 alpha 8, no checkpoints but the final one (keep 1). */
static inline void tiny_train_cfg(ft_train_cfg *c, const char *out, const char *const *data,
                                  int64_t steps, int threads)
{
    ft_train_defaults(c);
    c->model = TINY;
    c->data = data;
    c->n_data = 1;
    c->out = out;
    const char *dev = getenv("FTUNE_DEVICE");
    c->device = dev && *dev ? dev : "cpu";
    c->threads = threads;
    c->seq_len = 64;
    c->max_steps = steps;
    c->seed = 5;
    c->lr = 1e-3;
    c->warmup_ratio = 0;
    c->lora.r = 4;
    c->lora.alpha = 8;
    c->save_every = 0;
    c->keep = 1;
}

/* ft_train_run(c, on_event, user, res) succeeds (else its message on stderr) with no bad step. */
static inline void train_run_ok(const ft_train_cfg *c, ft_train_cb on_event, void *user,
                                ft_train_result *res)
{
    int rc = ft_train_run(c, on_event, user, res);
    if (rc < 0) fprintf(stderr, "train: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(res->bad_steps, 0);
}

/* The file dir/name read whole (a NUL after it; its size in *len unless len is NULL); the
 * caller frees it. */
static inline char *read_out(const char *dir, const char *name, size_t *len)
{
    char p[4400];
    size_t n;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *s = NULL;
    assert_int_equal(ft_read_file(p, &s, len ? len : &n), 0);
    return s;
}

/* 1 if the runs in folders a and b wrote the same adapter_model.safetensors bytes. */
static inline int same_adapter(const char *a, const char *b)
{
    size_t na, nb;
    char *x = read_out(a, "adapter_model.safetensors", &na), *y = read_out(b, "adapter_model.safetensors", &nb);
    int same = na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

#endif
