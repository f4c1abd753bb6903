/* test_qcorr.c - the low-rank correction of a quantized base (adapters/qcorr.h) and its
 * frozen path in the block (src/model/llama.c):
 *   - an error of rank <= r is removed exactly (weight mode);
 *   - the calibrated correction's objective tr((R - sBA) H (R - sBA)^T) is what it reports,
 *     beats the weight-mode correction on that objective, and no small perturbation of A0/B0
 *     improves it (a minimum);
 *   - a block with the correction frozen in the adapter computes what the merged weights
 *     W + s B0 A0 compute, forward and backward (dx and the trainable LoRA's dA, dB);
 *   - ft_qcorr_compute on the tiny model with a perturbed base fills every adapted linear and
 *     reduces the calibrated error. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "adapters/qcorr.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/llama.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

#define TINY "tests/fixtures/tiny-llama"
/* A0, B0 are fp32: s B0 A0 reproduces an exactly rank-r R to fp32 rounding of its factors. */
#define FT_TOL_QCORR_EXACT_REL 1e-5
/* fp32 block forward/backward with the correction as a separate GEMM vs merged into W:
 * the same sums in a different order. */
#define FT_TOL_QCORR_MERGED_REL 2e-4
#define FT_TOL_QCORR_MERGED_ABS 2e-5

static double urand(ft_rng *g) { return 2.0 * ft_rng_uniform(g) - 1.0; }

/* tr((R - s B A) H (R - s B A)^T), H NULL = identity; A (r, in), B (out, r) row-major. */
static double objective(const double *R, int out, int in, const double *H, const float *A,
                        const float *B, int r, float s)
{
    double *E = malloc((size_t)out * in * sizeof *E), f = 0;
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            double m = 0;
            for (int j = 0; j < r; j++) m += (double)B[o * r + j] * A[j * in + i];
            E[o * in + i] = R[o * in + i] - s * m;
        }
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            if (!H) {
                f += E[o * in + i] * E[o * in + i];
                continue;
            }
            double hv = 0;
            for (int k = 0; k < in; k++) hv += H[i * in + k] * E[o * in + k];
            f += E[o * in + i] * hv;
        }
    free(E);
    return f;
}

static void test_exact_low_rank(void **state)
{
    (void)state;
    enum { OUT = 24, IN = 40, RK = 3 };
    ft_rng g;
    ft_rng_seed(&g, 1);
    double U[OUT * RK], V[RK * IN], R[OUT * IN];
    for (int i = 0; i < OUT * RK; i++) U[i] = urand(&g);
    for (int i = 0; i < RK * IN; i++) V[i] = urand(&g);
    for (int o = 0; o < OUT; o++)
        for (int i = 0; i < IN; i++) {
            R[o * IN + i] = 0;
            for (int j = 0; j < RK; j++) R[o * IN + i] += U[o * RK + j] * V[j * IN + i];
        }
    float A[RK * IN], B[OUT * RK], s = 2.0f;
    double err[2];
    assert_int_equal(ft_qcorr_linear(R, OUT, IN, NULL, 0.0, RK, s, 5, A, B, err), 0);
    double num = 0, den = 0;
    for (int o = 0; o < OUT; o++)
        for (int i = 0; i < IN; i++) {
            double m = 0;
            for (int j = 0; j < RK; j++) m += (double)B[o * RK + j] * A[j * IN + i];
            num += (R[o * IN + i] - s * m) * (R[o * IN + i] - s * m);
            den += R[o * IN + i] * R[o * IN + i];
        }
    assert_true(sqrt(num / den) < FT_TOL_QCORR_EXACT_REL);
    assert_true(err[1] <= 1e-9 * err[0]);
    /* rank out of range is refused */
    assert_int_equal(ft_qcorr_linear(R, OUT, IN, NULL, 0.0, OUT + 1, s, 5, A, B, err), FT_E_INVALID);
}

static void test_calibrated_minimum(void **state)
{
    (void)state;
    enum { OUT = 20, IN = 32, T = 96, RK = 4 };
    ft_rng g;
    ft_rng_seed(&g, 2);
    double R[OUT * IN], X[T * IN], H[IN * IN];
    for (int i = 0; i < OUT * IN; i++) R[i] = urand(&g);
    /* anisotropic inputs: a few channels 10x larger, as LLM activations have */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < IN; i++) X[t * IN + i] = urand(&g) * (i % 8 == 3 ? 10.0 : 1.0);
    for (int i = 0; i < IN; i++)
        for (int k = 0; k < IN; k++) {
            H[i * IN + k] = 0;
            for (int t = 0; t < T; t++) H[i * IN + k] += X[t * IN + i] * X[t * IN + k];
        }
    float A[RK * IN], B[OUT * RK], Aw[RK * IN], Bw[OUT * RK], s = 0.5f;
    double err[2], errw[2];
    assert_int_equal(ft_qcorr_linear(R, OUT, IN, H, 0.0, RK, s, 3, A, B, err), 0);
    assert_int_equal(ft_qcorr_linear(R, OUT, IN, NULL, 0.0, RK, s, 3, Aw, Bw, errw), 0);
    double f0 = objective(R, OUT, IN, H, A, B, 0, s);
    double f = objective(R, OUT, IN, H, A, B, RK, s);
    double fw = objective(R, OUT, IN, H, Aw, Bw, RK, s);
    /* damp 0 falls back to a tiny ridge: the reported numbers are the objective's */
    assert_true(fabs(err[0] - f0) <= 1e-6 * f0);
    assert_true(fabs(err[1] - f) <= 1e-4 * f0);
    assert_true(f < fw);
    assert_true(f < 0.95 * f0);
    /* a minimum: random small perturbations of A0 or B0 never lower it */
    for (int trial = 0; trial < 20; trial++) {
        float Ap[RK * IN], Bp[OUT * RK];
        memcpy(Ap, A, sizeof Ap);
        memcpy(Bp, B, sizeof Bp);
        if (trial % 2) {
            for (int i = 0; i < RK * IN; i++) Ap[i] += 1e-2f * (float)urand(&g) * fabsf(A[i] + 1e-3f);
        } else {
            for (int i = 0; i < OUT * RK; i++) Bp[i] += 1e-2f * (float)urand(&g) * fabsf(B[i] + 1e-3f);
        }
        assert_true(objective(R, OUT, IN, H, Ap, Bp, RK, s) >= f * (1 - 1e-9));
    }
}

static void assert_close(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= FT_TOL_QCORR_MERGED_ABS + FT_TOL_QCORR_MERGED_REL * fabsf(b[i])))
            fail_msg("element %lld: %.8g vs %.8g", (long long)i, a[i], b[i]);
}

static void test_block_fixed_equals_merged(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    if (ft_model_load(&m, TINY) < 0) fail_msg("load %s: %s", TINY, ft_errmsg());
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    ft_lora l, plain;
    assert_int_equal(ft_lora_init(&l, m, &lc, be), 0);
    assert_int_equal(ft_lora_init(&plain, m, &lc, be), 0);
    ft_rng g;
    ft_rng_seed(&g, 11);
    float *fixed = malloc((size_t)l.n_params * sizeof *fixed);
    for (int64_t i = 0; i < l.n_params; i++) {
        l.host[i] = plain.host[i] = 0.1f * (float)urand(&g);
        fixed[i] = 0.1f * (float)urand(&g);
    }
    ft_lora_push(&l);
    ft_lora_push(&plain);
    assert_int_equal(ft_lora_set_fixed(&l, fixed), 0);

    const ft_model_config *c = &m->cfg;
    int64_t layer = 1;
    /* merged weights: W + s B0 A0 for every projection of the layer */
    ft_layer_weights wm = m->layers[layer];
    float *mw[FT_N_PROJ];
    for (int p = 0; p < FT_N_PROJ; p++) {
        const ft_linear *w = &m->layers[layer].proj[p];
        const ft_lora_linear *ll = &l.lin[layer][p];
        mw[p] = malloc((size_t)w->out_n * w->in_n * sizeof(float));
        const float *A0 = fixed + (ll->A - l.params), *B0 = fixed + (ll->B - l.params);
        for (int64_t o = 0; o < w->out_n; o++)
            for (int64_t i = 0; i < w->in_n; i++) {
                double sum = 0;
                for (int j = 0; j < lc.r; j++) sum += (double)B0[o * lc.r + j] * A0[j * w->in_n + i];
                mw[p][o * w->in_n + i] = (float)(w->w[o * w->in_n + i] + l.scale * sum);
            }
        wm.proj[p].w = mw[p];
    }
    ft_batch b;
    stream_make_batches(&b, 1, 16, c->vocab_size);
    ft_block_dims d = {b.T, c->hidden_size, c->num_attention_heads, c->num_key_value_heads,
                       c->head_dim, c->intermediate_size, lc.r};
    int64_t na = ft_block_acts_floats(&d), ns = ft_block_scratch_floats(&d), C = c->hidden_size;
    float *acts = malloc(na * 4), *acts2 = malloc(na * 4), *scr = malloc(ns * 4);
    float *x = malloc(b.T * C * 4), *y1 = malloc(b.T * C * 4), *y2 = malloc(b.T * C * 4);
    float *dy = malloc(b.T * C * 4), *dx1 = malloc(b.T * C * 4), *dx2 = malloc(b.T * C * 4);
    float inv[64];
    ft_rope_inv_freq(c, 16, inv);
    for (int64_t i = 0; i < b.T * C; i++) {
        x[i] = (float)urand(&g);
        dy[i] = (float)urand(&g);
    }
    ft_block_io io = {b.pos, b.seq_start, inv, 0};
    ft_block_acts a1, a2;
    ft_block_scratch s;
    ft_block_acts_carve(&a1, acts, &d, lc.targets);
    ft_block_acts_carve(&a2, acts2, &d, lc.targets);
    ft_block_scratch_carve(&s, scr, &d);
    assert_int_equal(ft_block_fwd(be, c, &m->layers[layer], &l, layer, &d, &io, x, y1, &a1, &s, 1), 0);
    assert_int_equal(ft_block_fwd(be, c, &wm, &plain, layer, &d, &io, x, y2, &a2, &s, 1), 0);
    assert_close(y1, y2, b.T * C);
    size_t pb = (size_t)l.n_params * 4;
    be->ops->zero(be, l.grads, pb);
    be->ops->zero(be, plain.grads, pb);
    assert_int_equal(ft_block_bwd(be, c, &m->layers[layer], &l, layer, &d, &io, x, dy, dx1, &a1, &s), 0);
    assert_int_equal(ft_block_bwd(be, c, &wm, &plain, layer, &d, &io, x, dy, dx2, &a2, &s), 0);
    assert_close(dx1, dx2, b.T * C);
    assert_close(l.grads, plain.grads, l.n_params);
    /* and the correction matters: without it the output differs */
    ft_lora_linear saved = l.lin[layer][FT_Q];
    l.lin[layer][FT_Q].A0 = l.lin[layer][FT_Q].B0 = NULL;
    assert_int_equal(ft_block_fwd(be, c, &m->layers[layer], &l, layer, &d, &io, x, y1, &a1, &s, 1), 0);
    double diff = 0;
    for (int64_t i = 0; i < b.T * C; i++) diff += fabs(y1[i] - y2[i]);
    assert_true(diff > 1e-3);
    l.lin[layer][FT_Q] = saved;

    for (int p = 0; p < FT_N_PROJ; p++) free(mw[p]);
    free(acts);
    free(acts2);
    free(scr);
    free(x);
    free(y1);
    free(y2);
    free(dy);
    free(dx1);
    free(dx2);
    free(fixed);
    stream_free_batches(&b, 1);
    ft_lora_free(&l);
    ft_lora_free(&plain);
    ft_backend_free(be);
    ft_model_free(m);
}

/* A "quantized" base: every weight rounded to a grid of 1/8 of its row's absmax. */
typedef struct coarse { const ft_model *m; float *buf[FT_N_PROJ]; } coarse;

static int coarse_base(void *ctx, int64_t layer, ft_layer_weights *w)
{
    coarse *k = ctx;
    *w = k->m->layers[layer];
    for (int p = 0; p < FT_N_PROJ; p++) {
        const ft_linear *src = &k->m->layers[layer].proj[p];
        for (int64_t o = 0; o < src->out_n; o++) {
            float amax = 0;
            for (int64_t i = 0; i < src->in_n; i++) amax = fmaxf(amax, fabsf(src->w[o * src->in_n + i]));
            float q = amax / 8;
            for (int64_t i = 0; i < src->in_n; i++)
                k->buf[p][o * src->in_n + i] = q > 0 ? q * nearbyintf(src->w[o * src->in_n + i] / q) : 0;
        }
        w->proj[p].w = k->buf[p];
    }
    return 0;
}

static void test_compute_tiny(void **state)
{
    (void)state;
    ft_model *m;
    ft_backend *be;
    if (ft_model_load(&m, TINY) < 0) fail_msg("load %s: %s", TINY, ft_errmsg());
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    ft_lora_cfg lc = {2, 4.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    ft_lora l;
    assert_int_equal(ft_lora_init(&l, m, &lc, be), 0);
    coarse k = {m};
    for (int p = 0; p < FT_N_PROJ; p++)
        k.buf[p] = malloc((size_t)m->layers[0].proj[p].out_n * m->layers[0].proj[p].in_n * 4);
    ft_batch b[3];
    stream_make_batches(b, 3, 16, m->cfg.vocab_size);
    float *out = calloc((size_t)l.n_params, sizeof *out);
    for (int mode = FT_QCORR_CALIBRATED; mode <= FT_QCORR_WEIGHT; mode++) {
        ft_qcorr_cfg qc = {mode, 20, 0.01, 2, 42};
        ft_qcorr_stats st;
        memset(out, 0, (size_t)l.n_params * sizeof *out);
        assert_int_equal(ft_qcorr_compute(m, &l, coarse_base, &k, b, 3, &qc, out, &st), 0);
        /* 20 tokens: whole micro-batches until at least 20, i.e. the first two */
        assert_int_equal(st.tokens, mode == FT_QCORR_CALIBRATED ? 32 : 0);
        assert_true(st.err_after < 0.9 * st.err_before);
        for (int64_t i = 0; i < l.n_layers; i++)
            for (int p = 0; p < FT_N_PROJ; p++) {
                const ft_lora_linear *ll = &l.lin[i][p];
                double a = 0, bb = 0;
                for (int64_t j = 0; j < lc.r * ll->in_n; j++) a += fabs(out[(ll->A - l.params) + j]);
                for (int64_t j = 0; j < lc.r * ll->out_n; j++) bb += fabs(out[(ll->B - l.params) + j]);
                assert_true(a > 0 && bb > 0 && isfinite(a) && isfinite(bb));
            }
    }
    ft_qcorr_cfg bad = {FT_QCORR_CALIBRATED, 20, 0.01, 2, 42};
    ft_qcorr_stats st;
    assert_int_equal(ft_qcorr_compute(m, &l, coarse_base, &k, b, 0, &bad, out, &st), FT_E_INVALID);
    int mode;
    assert_int_equal(ft_qcorr_parse("calibrated", &mode), 0);
    assert_int_equal(mode, FT_QCORR_CALIBRATED);
    assert_int_equal(ft_qcorr_parse("loftq", &mode), FT_E_INVALID);
    stream_free_batches(b, 3);
    for (int p = 0; p < FT_N_PROJ; p++) free(k.buf[p]);
    free(out);
    ft_lora_free(&l);
    ft_backend_free(be);
    ft_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_low_rank),
        cmocka_unit_test(test_calibrated_minimum),
        cmocka_unit_test(test_block_fixed_equals_merged),
        cmocka_unit_test(test_compute_tiny),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
