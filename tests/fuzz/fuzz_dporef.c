/* fuzz_dporef.c - libFuzzer target: the DPO reference cache OUT/dpo_reference.bin
 * (src/train/dpo_refcache.c), as a resumed DPO run reads it back (src/train/adapter.c dpo_reference).
 *
 * Input: the whole file. Before writing it, the target recomputes the trailing checksum
 * (ft_ckpt_hash over every byte before the last 8, dpo_refcache.h) so that mutations reach
 * the header fields and values behind it; checksum failures themselves are covered by
 * tests/unit/test_dpo.c (test_reference_file).
 * Per input: ft_dpo_ref_load twice with the fixed key below, once with the fixed buffer
 * sizes NP_TRAIN / NP_EVAL (what a run of that many pairs passes) and once, when the header's
 * pair counts are small, with exactly those counts; each buffer is malloc'ed at its exact size
 * so that ASan catches a copy past it. The contract checked (dpo_refcache.h): rc is 0 (or
 * -ENOMEM with a message); an eval part only with the train part; what is not loaded is left
 * untouched and comes with a reason (the file exists, so "" is no reason) of printable
 * characters; what is loaded equals the file's bytes at the layout's offsets, is finite, and
 * comes from a file whose size is the one its header gives.
 * Seeds (tests/fuzz/corpus/dporef/): files written by ft_dpo_ref_save with this key (train
 * and eval parts of a few sizes, with and without the eval part, another held-out set) and
 * damaged copies (header fields, sizes, non-finite values), written once and committed, plus
 * inputs kept from a fuzzing run (fuzz_*; tests/fuzz/RESULTS.md). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/train/checkpoint.h"
#include "src/train/dpo_refcache.h"
#include "tests/fuzz/fuzz_util.h"

#define HEADER 104  /* dpo_refcache.h: the fixed-size header */
#define NP_TRAIN 6  /* the fixed buffer sizes (pairs) */
#define NP_EVAL 2
#define NP_MAX 4096 /* larger header counts are not given a second call */
#define FILL 0xA5   /* the untouched-buffer pattern */

static ft_dpo_ref_key g_key;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    memset(&g_key, 0, sizeof g_key);
    snprintf(g_key.run_id, sizeof g_key.run_id, "0123456789abcdef");
    snprintf(g_key.eval_set, sizeof g_key.eval_set, "fedcba9876543210");
    snprintf(g_key.backend, sizeof g_key.backend, "cpu");
    g_key.quant = 0;
    g_key.model_id = 0x1234abcdull;
    return 0;
}

static void fail(const char *what, int64_t np_t, int64_t np_e, const char *why)
{
    fprintf(stderr, "fuzz_dporef: %s (buffers of %lld / %lld pairs; why: \"%s\")\n", what,
            (long long)np_t, (long long)np_e, why);
    abort();
}

static int untouched(const double *a, int64_t np)
{
    const unsigned char *b = (const unsigned char *)a;
    for (size_t i = 0; i < (size_t)(2 * np) * sizeof(double); i++)
        if (b[i] != FILL) return 0;
    return 1;
}

/* 1 if a[0, 2 np) equals the file's doubles at off and each is finite. */
static int same_finite(const double *a, int64_t np, const uint8_t *file, size_t off)
{
    size_t bytes = (size_t)(2 * np) * sizeof(double);
    if (memcmp(a, file + off, bytes)) return 0;
    for (int64_t i = 0; i < 2 * np; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

static void load(const uint8_t *file, size_t size, int64_t np_t, int64_t np_e)
{
    /* exact sizes (one byte for an empty part, which the reader must not write) */
    size_t bt = (size_t)(2 * np_t) * sizeof(double), be = (size_t)(2 * np_e) * sizeof(double);
    double *train = malloc(bt ? bt : 1), *eval = malloc(be ? be : 1);
    if (!train || !eval) abort();
    memset(train, FILL, bt ? bt : 1);
    memset(eval, FILL, be ? be : 1);
    int got_t = -1, got_e = -1, rc;
    char why[512];
    memset(why, 'x', sizeof why);
    FUZZ_CALL(rc, ft_dpo_ref_load(fuzz_dir(), &g_key, train, np_t, eval, np_e, &got_t, &got_e,
                                  why, sizeof why));
    if (rc < 0 && rc != -ENOMEM) fail("returned an error other than -ENOMEM", np_t, np_e, "");
    if (!memchr(why, 0, sizeof why)) fail("reason not terminated", np_t, np_e, "");
    for (const char *c = why; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
            fail("reason holds a non-printable byte", np_t, np_e, why);
    if ((got_t != 0 && got_t != 1) || (got_e != 0 && got_e != 1))
        fail("got_train / got_eval not 0 or 1", np_t, np_e, why);
    if (got_e && !got_t) fail("eval part without the train part", np_t, np_e, why);
    if (!got_t) {
        if (!why[0]) fail("nothing loaded and no reason", np_t, np_e, why);
        if (!untouched(train, np_t) || !untouched(eval, np_e))
            fail("nothing loaded but a buffer was written", np_t, np_e, why);
    } else {
        int64_t hn[2];
        memcpy(hn, file + 88, sizeof hn); /* n_train_pairs, n_eval_pairs */
        if (size < HEADER + 8 || hn[0] != np_t || hn[1] < 0 || hn[1] > (int64_t)size ||
            size != HEADER + (size_t)(2 * (hn[0] + hn[1])) * sizeof(double) + 8)
            fail("loaded a file whose size is not the one its header gives", np_t, np_e, why);
        if (!same_finite(train, np_t, file, HEADER))
            fail("train part not the file's finite values", np_t, np_e, why);
        if (got_e && !same_finite(eval, np_e, file, HEADER + bt))
            fail("eval part not the file's finite values", np_t, np_e, why);
        if (got_e && why[0]) fail("all loaded, yet a reason", np_t, np_e, why);
        if (!got_e && (!why[0] || !untouched(eval, np_e)))
            fail("eval part not loaded: no reason, or its buffer written", np_t, np_e, why);
    }
    free(train);
    free(eval);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *img = malloc(size ? size : 1);
    if (!img) abort();
    memcpy(img, data, size);
    if (size >= 8) {
        uint64_t sum = ft_ckpt_hash(FT_CKPT_HASH_INIT, img, size - 8);
        memcpy(img + size - 8, &sum, 8);
    }
    fuzz_write(FT_DPO_REF_FILE, img, size);

    load(img, size, NP_TRAIN, NP_EVAL);
    if (size >= HEADER) {
        int64_t hn[2];
        memcpy(hn, img + 88, sizeof hn);
        if (hn[0] >= 0 && hn[0] <= NP_MAX && hn[1] >= 0 && hn[1] <= NP_MAX &&
            (hn[0] != NP_TRAIN || hn[1] != NP_EVAL))
            load(img, size, hn[0], hn[1]);
    }
    free(img);
    return 0;
}
