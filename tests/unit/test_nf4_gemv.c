/* test_nf4_gemv.c - the CPU product with an NF4 weight read in place (kernels/cpu/nf4_gemv.c):
 * both code paths (portable C, AVX2) against an fp64 product of the dequantized weight
 * (ft_nf4_dequant), nested and plain absmax, rows whose blocks span two rows, 1-9 activation
 * rows (the AVX2 path's groups of four and their remainders), beta, thread-count
 * independence, the CPU backend's linear_fwd with FT_WTYPE_NF4, and the refusals; bit for bit
 * against ft_nf4_dequant where the product is exact (x a unit vector: nibble order, the
 * segment walk and nf4.c's block absmax arithmetic), over more than 64 rows (two passes),
 * with NaN in y, and with the codes at an odd address. */
#include "tests/unit/harness.h"

#include <omp.h>

#include "kernels/cpu/simd_x86.h"
#include "kernels/cpu/nf4_gemv.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/numeric/nf4.h"

/* An fp32 sum of products whose terms are exact (code * absmax, then * x), each rounded
 * once: |error| <= n eps sum |terms| (Higham 3.1), with n the row length. The factored
 * absmax adds one rounding per block. Bounded by that relative to sum |w x|, with the length
 * folded into the constant for the shapes below (in <= 1024: 1024 * 2^-24 = 6e-5). */
#define FT_TOL_NF4_GEMV_REL 1e-4

typedef struct qt {
    ft_nf4_layout lay;
    uint8_t *codes, *qabsmax;
    float *absmax, *nested_absmax, map[256], offset;
    ft_nf4_tensor t;
    float *w; /* dequantized (n) */
} qt;

/* Roughly N(0, 1): the sum of four uniforms, centred and scaled to unit variance. */
static float rnorm(ft_rng *r)
{
    float s = ft_rng_uniform(r) + ft_rng_uniform(r) + ft_rng_uniform(r) + ft_rng_uniform(r);
    return (s - 2.0f) * 1.7320508f;
}

static void qt_make(qt *q, int64_t out, int64_t in, int64_t bs, int64_t nbs, uint64_t seed)
{
    memset(q, 0, sizeof *q);
    const int64_t n = out * in;
    assert_int_equal(ft_nf4_layout_init(&q->lay, n, bs, nbs), 0);
    float *x = malloc((size_t)n * sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = rnorm(&r) * (i % 7 == 0 ? 3.0f : 0.02f);
    q->codes = malloc((size_t)q->lay.code_bytes);
    q->qabsmax = malloc((size_t)q->lay.n_blocks);
    q->absmax = malloc((size_t)q->lay.n_blocks * sizeof(float));
    q->nested_absmax = malloc((size_t)(q->lay.n_nested + 1) * sizeof(float));
    ft_nf4_dynamic_map(q->map);
    assert_int_equal(ft_nf4_quantize(x, &q->lay, q->map, q->codes, nbs ? q->qabsmax : NULL,
                                     q->nested_absmax, &q->offset, q->absmax), 0);
    q->t = (ft_nf4_tensor){n, bs, nbs, q->codes, nbs ? q->qabsmax : NULL, nbs ? NULL : q->absmax,
                           nbs ? q->nested_absmax : NULL, nbs ? q->map : NULL, ft_nf4_code, q->offset};
    ft_nf4_view v = {q->lay, q->codes, q->t.qabsmax, q->t.absmax, q->t.nested_absmax,
                     q->t.nested_map, ft_nf4_code, q->offset};
    q->w = x; /* reused for the dequantized values */
    assert_int_equal(ft_nf4_dequant(&v, q->w), 0);
}

static void qt_free(qt *q)
{
    free(q->codes);
    free(q->qabsmax);
    free(q->absmax);
    free(q->nested_absmax);
    free(q->w);
}

/* y (T, out) from the path, against sum_i w[o, i] x[t, i] + beta y0 in fp64. */
static void check_path(const qt *q, int64_t out, int64_t in, int64_t T, float beta, int path,
                       uint64_t seed)
{
    float *x = malloc((size_t)(T * in) * sizeof(float)), *y = malloc((size_t)(T * out) * sizeof(float));
    float *y0 = malloc((size_t)(T * out) * sizeof(float)), *scr = malloc((size_t)(T * in) * sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < T * in; i++) x[i] = rnorm(&r);
    for (int64_t i = 0; i < T * out; i++) y0[i] = y[i] = rnorm(&r);
    assert_int_equal(ft_cpu_nf4_gemv_path(y, x, &q->t, T, out, in, beta, scr, path), 0);
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0, m = 0;
            for (int64_t i = 0; i < in; i++) {
                double p = (double)q->w[o * in + i] * x[t * in + i];
                s += p;
                m += fabs(p);
            }
            s += (double)beta * y0[t * out + o];
            m += fabs((double)beta * y0[t * out + o]);
            double d = fabs(y[t * out + o] - s) / (m > 0 ? m : 1);
            if (d > worst) worst = d;
        }
    if (worst > FT_TOL_NF4_GEMV_REL)
        fail_msg("path %d, %lld x %lld, T %lld, beta %g: relative error %.3g", path,
                 (long long)out, (long long)in, (long long)T, beta, worst);
    free(x);
    free(y);
    free(y0);
    free(scr);
}


/* Shapes: blocks within rows (in a multiple of 64), blocks spanning two rows (in = 48, 80),
 * nested and plain absmax, blocksize 32..256. */
static void test_paths_match_fp64(void **state)
{
    (void)state;
    const int64_t shapes[][4] = {{64, 64, 64, 256}, {37, 48, 64, 256}, {16, 80, 64, 0},
                                 {128, 576, 64, 256}, {24, 1024, 256, 4}, {9, 32, 32, 2},
                                 {50, 96, 32, 0}};
    int paths[2] = {FT_NF4_GEMV_PORTABLE, FT_NF4_GEMV_AVX2};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t out = shapes[s][0], in = shapes[s][1];
        qt q;
        qt_make(&q, out, in, shapes[s][2], shapes[s][3], 100 + s);
        assert_true(ft_cpu_nf4_gemv_ok(&q.t, out, in));
        for (int p = 0; p < 2; p++) {
            if (paths[p] == FT_NF4_GEMV_AVX2 && !ft_cpu_have_avx2()) continue;
            for (int64_t T = 1; T <= 9; T += (T < 5 ? 1 : 4))
                for (int b = 0; b < 2; b++) check_path(&q, out, in, T, b ? 0.5f : 0.0f, paths[p], 7 * T + b);
        }
        qt_free(&q);
    }
}

/* The same bits for 1 and 2 threads (each row summed by one thread in a fixed order), and
 * the auto path equals the one it picks. */
static void test_threads_and_auto(void **state)
{
    (void)state;
    const int64_t out = 256, in = 576, T = 3;
    qt q;
    qt_make(&q, out, in, 64, 256, 5);
    float *x = malloc((size_t)(T * in) * sizeof(float)), *scr = malloc((size_t)(T * in) * sizeof(float));
    float *y1 = calloc((size_t)(T * out), sizeof(float)), *y2 = calloc((size_t)(T * out), sizeof(float));
    float *y3 = calloc((size_t)(T * out), sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, 9);
    for (int64_t i = 0; i < T * in; i++) x[i] = rnorm(&r);
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(ft_cpu_nf4_gemv(y1, x, &q.t, T, out, in, 0.0f, scr), 0);
    omp_set_num_threads(2);
    assert_int_equal(ft_cpu_nf4_gemv(y2, x, &q.t, T, out, in, 0.0f, scr), 0);
    omp_set_num_threads(nt);
    assert_memory_equal(y1, y2, (size_t)(T * out) * sizeof(float));
    int path = ft_cpu_have_avx2() ? FT_NF4_GEMV_AVX2 : FT_NF4_GEMV_PORTABLE;
    assert_int_equal(ft_cpu_nf4_gemv_path(y3, x, &q.t, T, out, in, 0.0f, scr, path), 0);
    assert_memory_equal(y1, y3, (size_t)(T * out) * sizeof(float));
    free(x);
    free(scr);
    free(y1);
    free(y2);
    free(y3);
    qt_free(&q);
}

/* Rows of x that are unit vectors e_k: each output is one product code[q] * absmax, rounded
 * once as ft_nf4_dequant rounds it, so y[t, o] equals w[o, k_t] bit for bit (with beta,
 * w + beta * y0 in fp32, the kernel's expression). Catches a swapped nibble, a block absmax
 * computed otherwise than nf4.c's (two fp32 roundings) and a segment given the wrong block
 * (blocks spanning 2 and 16 rows, a partial last block). T = 70: two passes of ROWS_MAX. */
static void test_unit_rows_exact(void **state)
{
    (void)state;
    const int64_t shapes[][4] = {{37, 48, 64, 256}, {40, 16, 256, 2}, {16, 80, 64, 0},
                                 {9, 32, 32, 2}, {20, 576, 64, 256}};
    const int64_t T = 70;
    int paths[2] = {FT_NF4_GEMV_PORTABLE, FT_NF4_GEMV_AVX2};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t out = shapes[s][0], in = shapes[s][1];
        qt q;
        qt_make(&q, out, in, shapes[s][2], shapes[s][3], 200 + s);
        float *x = calloc((size_t)(T * in), sizeof(float)), *y = malloc((size_t)(T * out) * sizeof(float));
        float *y0 = malloc((size_t)(T * out) * sizeof(float)), *scr = malloc((size_t)(T * in) * sizeof(float));
        int64_t k[70];
        for (int64_t t = 0; t < T; t++) {
            k[t] = (t * 7 + s) % in;
            x[t * in + k[t]] = 1.0f;
        }
        ft_rng r;
        ft_rng_seed(&r, 31 + s);
        for (int64_t i = 0; i < T * out; i++) y0[i] = rnorm(&r);
        for (int p = 0; p < 2; p++) {
            if (paths[p] == FT_NF4_GEMV_AVX2 && !ft_cpu_have_avx2()) continue;
            for (int b = 0; b < 2; b++) {
                const float beta = b ? 0.5f : 0.0f;
                memcpy(y, y0, (size_t)(T * out) * sizeof(float));
                assert_int_equal(ft_cpu_nf4_gemv_path(y, x, &q.t, T, out, in, beta, scr, paths[p]), 0);
                for (int64_t t = 0; t < T; t++)
                    for (int64_t o = 0; o < out; o++) {
                        const float w = q.w[o * in + k[t]];
                        const float want = b ? w + beta * y0[t * out + o] : w;
                        if (y[t * out + o] != want)
                            fail_msg("path %d, %lld x %lld (blocksize %lld), beta %g: y[%lld, %lld] "
                                     "= %.9g, w[%lld, %lld] gives %.9g", paths[p], (long long)out,
                                     (long long)in, (long long)shapes[s][2], beta, (long long)t,
                                     (long long)o, y[t * out + o], (long long)o, (long long)k[t], want);
                    }
            }
        }
        free(x);
        free(y);
        free(y0);
        free(scr);
        qt_free(&q);
    }
}

/* beta 0 overwrites y without reading it (NaN there stays out); beta != 0 reads it (NaN
 * comes through, as in BLAS), for both paths; T = 130 (three passes of ROWS_MAX) agrees with
 * the same rows computed one at a time; the codes at an odd address (a pack's bytes have
 * any alignment, and the AVX2 path loads 8 of them at a time, the last 8 of the tensor
 * included: codes_odd is exactly code_bytes long) give the same bits. */
static void test_nan_passes_alignment(void **state)
{
    (void)state;
    const int64_t out = 24, in = 48, T = 130;
    qt q;
    qt_make(&q, out, in, 64, 256, 17);
    float *x = malloc((size_t)(T * in) * sizeof(float)), *scr = malloc((size_t)(T * in) * sizeof(float));
    float *y = malloc((size_t)(T * out) * sizeof(float)), *y1 = malloc((size_t)(T * out) * sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, 23);
    for (int64_t i = 0; i < T * in; i++) x[i] = rnorm(&r);
    uint8_t *raw = malloc((size_t)q.lay.code_bytes + 1);
    memcpy(raw + 1, q.codes, (size_t)q.lay.code_bytes);
    ft_nf4_tensor odd = q.t;
    odd.codes = raw + 1;
    int paths[2] = {FT_NF4_GEMV_PORTABLE, FT_NF4_GEMV_AVX2};
    for (int p = 0; p < 2; p++) {
        if (paths[p] == FT_NF4_GEMV_AVX2 && !ft_cpu_have_avx2()) continue;
        for (int64_t i = 0; i < T * out; i++) y[i] = NAN;
        assert_int_equal(ft_cpu_nf4_gemv_path(y, x, &q.t, T, out, in, 0.0f, scr, paths[p]), 0);
        for (int64_t i = 0; i < T * out; i++) assert_false(isnan(y[i]));
        for (int64_t t = 0; t < T; t++) /* one row at a time: one pass each */
            assert_int_equal(ft_cpu_nf4_gemv_path(y1 + t * out, x + t * in, &q.t, 1, out, in, 0.0f,
                                                  scr, paths[p]), 0);
        assert_memory_equal(y, y1, (size_t)(T * out) * sizeof(float));
        assert_int_equal(ft_cpu_nf4_gemv_path(y1, x, &odd, T, out, in, 0.0f, scr, paths[p]), 0);
        assert_memory_equal(y, y1, (size_t)(T * out) * sizeof(float));
        y1[5] = NAN; /* beta != 0: that output, and only it, is NaN */
        assert_int_equal(ft_cpu_nf4_gemv_path(y1, x, &q.t, T, out, in, 1.0f, scr, paths[p]), 0);
        for (int64_t i = 0; i < T * out; i++) assert_int_equal(isnan(y1[i]) != 0, i == 5);
    }
    free(raw);
    free(x);
    free(scr);
    free(y);
    free(y1);
    qt_free(&q);
}

/* A row's result does not depend on the rows computed with it: T = 1..9 rows of a wide
 * weight (long block segments, where one-chain and two-chain sums round differently) equal
 * the same rows computed one at a time, bit for bit, on both paths (batched decoding relies
 * on it). */
static void test_rows_independent(void **state)
{
    (void)state;
    const int64_t out = 48, in = 2048, TM = 9;
    qt q;
    qt_make(&q, out, in, 64, 256, 31);
    float *x = malloc((size_t)(TM * in) * sizeof(float)), *scr = malloc((size_t)(TM * in) * sizeof(float));
    float *y = malloc((size_t)(TM * out) * sizeof(float)), *y1 = malloc((size_t)(TM * out) * sizeof(float));
    ft_rng r;
    ft_rng_seed(&r, 77);
    for (int64_t i = 0; i < TM * in; i++) x[i] = rnorm(&r);
    int paths[2] = {FT_NF4_GEMV_PORTABLE, FT_NF4_GEMV_AVX2};
    for (int p = 0; p < 2; p++) {
        if (paths[p] == FT_NF4_GEMV_AVX2 && !ft_cpu_have_avx2()) continue;
        for (int64_t t = 0; t < TM; t++)
            assert_int_equal(ft_cpu_nf4_gemv_path(y1 + t * out, x + t * in, &q.t, 1, out, in, 0.0f,
                                                  scr, paths[p]), 0);
        for (int64_t T = 2; T <= TM; T++) {
            assert_int_equal(ft_cpu_nf4_gemv_path(y, x, &q.t, T, out, in, 0.0f, scr, paths[p]), 0);
            assert_memory_equal(y, y1, (size_t)(T * out) * sizeof(float));
        }
    }
    free(x);
    free(scr);
    free(y);
    free(y1);
    qt_free(&q);
}

/* The CPU backend's linear_fwd takes FT_WTYPE_NF4 and gives the kernel's result. */
static void test_backend_linear_fwd(void **state)
{
    (void)state;
    ft_backend *be = NULL;
    assert_int_equal(ft_backend_init(&be, "cpu", 0), 0);
    const int64_t out = 64, in = 128, T = 2;
    qt q;
    qt_make(&q, out, in, 64, 256, 11);
    float x[T * 128], ya[T * 64], yb[T * 64], scr[T * 128];
    for (int64_t i = 0; i < T * in; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
    assert_int_equal(be->ops->linear_fwd(be, ya, x, &q.t, FT_WTYPE_NF4, T, out, in, 0.0f, scr), 0);
    assert_int_equal(ft_cpu_nf4_gemv(yb, x, &q.t, T, out, in, 0.0f, scr), 0);
    assert_memory_equal(ya, yb, sizeof ya);
    ft_backend_free(be);
    qt_free(&q);
}

static void test_refusals(void **state)
{
    (void)state;
    qt q;
    qt_make(&q, 8, 40, 32, 0, 3); /* in = 40: not a multiple of 16 */
    float x[40], y[8], scr[40];
    memset(x, 0, sizeof x);
    assert_false(ft_cpu_nf4_gemv_ok(&q.t, 8, 40));
    assert_int_equal(ft_cpu_nf4_gemv(y, x, &q.t, 1, 8, 40, 0.0f, scr), FT_E_UNSUPPORTED);
    assert_false(ft_cpu_nf4_gemv_ok(&q.t, 8, 48));
    assert_int_equal(ft_cpu_nf4_gemv(y, x, &q.t, -1, 8, 40, 0.0f, scr), FT_E_INVALID);
    assert_int_equal(ft_cpu_nf4_gemv(y, x, &q.t, 0, 8, 40, 0.0f, scr), 0); /* nothing to do */
    assert_int_equal(ft_cpu_nf4_gemv(NULL, x, &q.t, 1, 8, 40, 0.0f, scr), FT_E_INVALID);
    assert_false(ft_cpu_nf4_gemv_ok(NULL, 8, 40));
    assert_int_equal(ft_cpu_nf4_gemv(y, x, NULL, 1, 8, 40, 0.0f, scr), FT_E_INVALID);
    assert_int_equal(ft_cpu_nf4_gemv_path(y, x, &q.t, 1, 8, 40, 0.0f, scr, 7), FT_E_INVALID);
    qt_free(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_match_fp64),
        cmocka_unit_test(test_threads_and_auto),
        cmocka_unit_test(test_rows_independent),
        cmocka_unit_test(test_unit_rows_exact),
        cmocka_unit_test(test_nan_passes_alignment),
        cmocka_unit_test(test_backend_linear_fwd),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
