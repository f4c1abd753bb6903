/* test_gen_truncate.c - ft_gen_truncate_seq (src/infer/generate.h), the prefix reuse of
 * `ftune generate --chat`: a cache that held a prompt A + B and its decode, cut back to A and
 * continued with C, gives the logits of a cache that only ever saw A + C (and of A + C
 * recomputed from scratch); bad cuts are refused and change nothing; a cut of one seq leaves
 * the others alone. Model: tests/fixtures/tiny-llama (2 layers, GQA 4/2 heads), with a random
 * LoRA so that the adapter path is covered too. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/infer/generate.h"
#include "src/model/model.h"
#include "src/infer/sample.h"
#include "tests/unit/model_fixture.h"

/* A continuation after a cut vs the same tokens in a cache that never held the cut rows:
 * the kept rows were computed in a longer prefill (attention_fwd's BLAS tiles over more
 * rows), so fp32 reassociation only, as test_generate.c's FT_TOL_KV_DECODE_REL (relative to
 * the largest |logit|). */
#define FT_TOL_TRUNC_REL 1e-5

typedef model_fix fix;

/* 2 threads; r 4, alpha 8, every target; A and B random (seed 5, scale 0.4: B = 0 at init
 * would make the adapter a no-op) */
static int setup(void **state)
{
    const ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    return model_fix_setup(state, 2, &lc, 5, 0.4f);
}

/* A (shared prefix, with BOS), B (the first turn's rest), C (the second turn's rest) */
#define NA 7
#define NB 6
#define NC 5
static const int32_t A[NA] = {1, 415, 2936, 9060, 285, 1142, 461};
static const int32_t B[NB] = {10575, 754, 272, 17898, 3914, 3065};
static const int32_t C[NC] = {272, 7782, 28723, 13, 1014};

/* Sequence `seq` of g: A + B prefilled, 4 greedy tokens decoded, cut back to A, C prefilled;
 * lg (V) receives C's last logits. */
static void branch_and_cut(ft_gen *g, int64_t seq, const fix *f, float *lg)
{
    const int64_t V = f->m->cfg.vocab_size;
    int32_t ab[NA + NB];
    memcpy(ab, A, sizeof A);
    memcpy(ab + NA, B, sizeof B);
    assert_int_equal(ft_gen_forward_seq(g, seq, ab, NA + NB, lg, 1), 0);
    for (int t = 0; t < 4; t++) {
        int32_t id = ft_sample_argmax(lg, V);
        assert_int_equal(ft_gen_forward_seq(g, seq, &id, 1, lg, 1), 0);
    }
    assert_int_equal(g->past[seq], NA + NB + 4);
    assert_int_equal(ft_gen_truncate_seq(g, seq, NA), 0);
    assert_int_equal(g->past[seq], NA);
    assert_int_equal(ft_gen_forward_seq(g, seq, C, NC, lg, 1), 0);
    assert_int_equal(g->past[seq], NA + NC);
}

static void cut_case(fix *f, const ft_lora *lora, const char *label)
{
    const int64_t V = f->m->cfg.vocab_size, ctx = 32;
    float *lt = malloc((size_t)V * 4), *lf = malloc((size_t)V * 4), *lr = malloc((size_t)V * 4);
    ft_gen cut, fresh, full;
    assert_int_equal(ft_gen_init(&cut, f->be, f->m, lora, ctx, 16, 1), 0);
    assert_int_equal(ft_gen_init(&fresh, f->be, f->m, lora, ctx, 16, 1), 0);
    assert_int_equal(ft_gen_init(&full, f->be, f->m, lora, ctx, 16, 1), 0);
    branch_and_cut(&cut, 0, f, lt);
    assert_int_equal(cut.n_past, NA + NC); /* seq 0 mirrors past[0] */
    /* the same op sequence in a cache that never held B: A, then C against the cache */
    assert_int_equal(ft_gen_forward(&fresh, A, NA, lf, 1), 0);
    assert_int_equal(ft_gen_forward(&fresh, C, NC, lf, 1), 0);
    /* and A + C in one prefill */
    int32_t ac[NA + NC];
    memcpy(ac, A, sizeof A);
    memcpy(ac + NA, C, sizeof C);
    assert_int_equal(ft_gen_forward(&full, ac, NA + NC, lr, 1), 0);
    const double s = max_abs(lr, V), d_fresh = max_diff(lt, lf, V), d_full = max_diff(lt, lr, V);
    /* the logits the cut rows would give: appending C after A + B + 4 decoded tokens */
    ft_gen_reset(&fresh);
    int32_t ab[NA + NB];
    memcpy(ab, A, sizeof A);
    memcpy(ab + NA, B, sizeof B);
    assert_int_equal(ft_gen_forward(&fresh, ab, NA + NB, lf, 1), 0);
    assert_int_equal(ft_gen_forward(&fresh, C, NC, lf, 1), 0);
    const double d_stale = max_diff(lt, lf, V);
    printf("[%s] after a cut to %d of %d cached tokens: vs a cache that never held them %.3e, "
           "vs one prefill %.3e of max |logit| %.3g (bound %.0e); without the cut %.3e\n", label, NA,
           NA + NB + 4, d_fresh / s, d_full / s, s, FT_TOL_TRUNC_REL, d_stale / s);
    assert_true(d_fresh <= FT_TOL_TRUNC_REL * s);
    assert_true(d_full <= FT_TOL_TRUNC_REL * s);
    assert_true(d_stale > 100 * FT_TOL_TRUNC_REL * s); /* the comparison can fail */
    ft_gen_free(&cut);
    ft_gen_free(&fresh);
    ft_gen_free(&full);
    free(lt);
    free(lf);
    free(lr);
}

static void test_cut_then_continue(void **state)
{
    fix *f = *state;
    cut_case(f, NULL, "tiny-llama");
    cut_case(f, &f->lora, "tiny-llama + LoRA r4");
}

static void test_bad_cuts(void **state)
{
    fix *f = *state;
    const int64_t V = f->m->cfg.vocab_size;
    float *lg = malloc((size_t)V * 4);
    ft_gen g;
    assert_int_equal(ft_gen_init(&g, f->be, f->m, NULL, 16, 8, 1), 0);
    assert_int_equal(ft_gen_forward(&g, A, NA, lg, 1), 0);
    assert_int_equal(ft_gen_truncate_seq(&g, 0, NA + 1), FT_E_RANGE); /* more than it holds */
    assert_int_equal(ft_gen_truncate_seq(&g, 0, -1), FT_E_RANGE);
    assert_int_equal(ft_gen_truncate_seq(&g, 1, 0), FT_E_RANGE); /* one seq only */
    assert_int_equal(ft_gen_truncate_seq(&g, -1, 0), FT_E_RANGE);
    assert_int_equal(g.past[0], NA);
    assert_int_equal(g.n_past, NA);
    assert_int_equal(ft_gen_truncate_seq(&g, 0, NA), 0); /* keeping everything: a no-op */
    assert_int_equal(g.n_past, NA);
    assert_int_equal(ft_gen_truncate_seq(&g, 0, 0), 0); /* to 0: ft_gen_reset */
    assert_int_equal(g.n_past, 0);
    assert_int_equal(ft_gen_truncate_seq(NULL, 0, 0), FT_E_INVALID);
    ft_gen_free(&g);
    assert_int_equal(ft_gen_truncate_seq(&g, 0, 0), FT_E_INVALID); /* freed: zeroed */
    free(lg);
}

/* A cut of seq 1 changes neither seq 0's count nor its logits. */
static void test_cut_one_seq(void **state)
{
    fix *f = *state;
    const int64_t V = f->m->cfg.vocab_size;
    float *l0 = malloc((size_t)V * 4), *l1 = malloc((size_t)V * 4), *lr = malloc((size_t)V * 4);
    ft_gen g, one;
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, NULL, 32, 16, 2, 2), 0);
    assert_int_equal(ft_gen_init(&one, f->be, f->m, NULL, 32, 16, 1), 0);
    assert_int_equal(ft_gen_forward_seq(&g, 0, A, NA, l0, 1), 0);
    branch_and_cut(&g, 1, f, l1);
    assert_int_equal(g.past[0], NA);
    assert_int_equal(g.n_past, NA);
    /* seq 0 goes on with B as a cache of its own would */
    assert_int_equal(ft_gen_forward_seq(&g, 0, B, NB, l0, 1), 0);
    assert_int_equal(ft_gen_forward(&one, A, NA, lr, 1), 0);
    assert_int_equal(ft_gen_forward(&one, B, NB, lr, 1), 0);
    assert_memory_equal(l0, lr, (size_t)V * sizeof(float));
    ft_gen_free(&g);
    ft_gen_free(&one);
    free(l0);
    free(l1);
    free(lr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cut_then_continue, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_bad_cuts, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_cut_one_seq, setup, model_fix_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
