/* test_cuda_nf4_gemm.c - the fused NF4 GEMMs (kernels/cuda/nf4_gemm.cu) against the CPU:
 *   - forward y = x W^T and input gradient dx = dy W, W quantized by the CPU quantizer
 *     (src/numeric/nf4.c) and the reference dequantized by ft_nf4_dequant, rounded to bf16 like
 *     the kernel's operand, x / dy rounded to bf16, products summed in double: over W shapes
 *     whose output tiles are whole or half (N, K = 192, 320, ...), T = 1, 7, 20, 50, 100, 2048
 *     (every tile height, ragged last tiles), the tile heights and split-K counts chosen by the
 *     kernel and forced ones, beta 0 (the output prefilled with NaN: must not be read), 1, 0.5;
 *   - the dequantized values themselves: an identity activation (x = I, T = K; dy = I, T = N)
 *     makes the GEMM output W exactly (one product by 1.0 per output), compared bit for bit
 *     with the plain kernel dequant_nf4 (kernels/cuda/nf4.cu) for both directions, nested and
 *     plain absmax, blocksize 64 and 128, with and without split-K;
 *   - agreement with the staging path it replaces (dequant_nf4 + the bf16 linear_fwd /
 *     linear_bwd_x ops, cuBLAS);
 *   - bad descriptions refused with FT_E_INVALID.
 * Skips when no GPU is visible or ftune was built without CUDA. */
#include "tests/unit/harness.h"
#include "tests/gpu/gpu_fixture.h"

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"

/* GEMM output vs the double reference: |got - ref| <= ABS + REL * sum_k |a_k b_k|. The bf16
 * products are exact in fp32; what differs is the fp32 summation (tensor-core accumulation of
 * Kred / 16 chained mma steps, split-K partials added in fp32): about Kred / 16 roundings of
 * partial sums no larger than sum |a b|, <= 256 * 2^-24 = 1.5e-5 for Kred <= 4096, doubled.
 * A single wrong term of a sum of 4096 similar ones is ~2.4e-4 of it: above the bound. */
#define TOL_GEMM_REL 3e-5
#define TOL_GEMM_ABS 1e-6

#ifdef FT_HAVE_CUDA
#include "kernels/cuda/cuda_entry.h" /* ft_cuda_nf4_linear with tile height and split-K exposed */
#endif

static int setup(void **state) { return gpu_fixture_setup(state, 9876, 0); }
static int teardown(void **state) { return gpu_fixture_teardown(state); }

#ifdef FT_HAVE_CUDA
static void *dev_copy(fix *f, const void *h, size_t bytes)
{
    void *d = f->gpu->ops->alloc(f->gpu, bytes ? bytes : 16);
    assert_non_null(d);
    if (h && bytes) assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, bytes), 0);
    return d;
}

/* A quantized W (N, K) on the device and its bf16-rounded dequantization on the host. */
typedef struct qw {
    int64_t N, K;
    ft_nf4_tensor t;  /* device pointers */
    float *wq;        /* (N, K) host: bf16(ft_nf4_dequant) */
    void *d[6];       /* device buffers to free */
} qw;

static void qw_make(fix *f, qw *q, int64_t N, int64_t K, int64_t bs, int64_t nbs)
{
    int64_t n = N * K;
    float map[256];
    ft_nf4_dynamic_map(map);
    ft_nf4_layout l;
    assert_int_equal(ft_nf4_layout_init(&l, n, bs, nbs), 0);
    float *x = malloc(n * 4), *am = malloc(l.n_blocks * 4), off = 0;
    for (int64_t i = 0; i < n; i++) /* a scale that varies per block (no all-zero block: see dequant test) */
        x[i] = (2 * ft_rng_uniform(&f->rng) - 1) * (float)(1 + (i / bs) % 5) * 0.05f;
    uint8_t *codes = malloc(l.code_bytes), *qam = malloc(l.n_blocks);
    float *nam = malloc((l.n_nested + 1) * 4);
    assert_int_equal(ft_nf4_quantize(x, &l, map, codes, nbs ? qam : NULL, nam, &off, am), 0);
    ft_nf4_view v = {l, codes, nbs ? qam : NULL, nbs ? NULL : am, nbs ? nam : NULL, nbs ? map : NULL,
                     ft_nf4_code, off};
    assert_int_equal(ft_nf4_dequant(&v, x), 0);
    for (int64_t i = 0; i < n; i++) x[i] = ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(x[i]));
    q->N = N;
    q->K = K;
    q->wq = x;
    q->d[0] = dev_copy(f, codes, l.code_bytes);
    q->d[1] = dev_copy(f, qam, l.n_blocks);
    q->d[2] = dev_copy(f, am, l.n_blocks * 4);
    q->d[3] = dev_copy(f, nam, l.n_nested * 4 + 4);
    q->d[4] = dev_copy(f, map, sizeof map);
    q->d[5] = dev_copy(f, ft_nf4_code, 16 * 4);
    ft_nf4_tensor t = {n, bs, nbs, q->d[0], nbs ? q->d[1] : NULL, nbs ? NULL : (const float *)q->d[2],
                       nbs ? (const float *)q->d[3] : NULL, nbs ? (const float *)q->d[4] : NULL,
                       (const float *)q->d[5], off};
    q->t = t;
    free(am);
    free(codes);
    free(qam);
    free(nam);
}

static void qw_free(fix *f, qw *q)
{
    for (int i = 0; i < 6; i++) f->gpu->ops->free(f->gpu, q->d[i]);
    free(q->wq);
}

/* ref (T, ncols) and sum |a b| per output, in double: forward a (T, K) . wq^T, input gradient
 * a (T, N) . wq. */
static void reference(const qw *q, int dgrad, const float *a, int64_t T, double *ref, double *mag)
{
    const int64_t N = q->N, K = q->K, kred = dgrad ? N : K, ncols = dgrad ? K : N;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; t++) {
        const float *ar = a + t * kred;
        double *r = ref + t * ncols, *m = mag + t * ncols;
        if (!dgrad) {
            for (int64_t c = 0; c < ncols; c++) {
                const float *wr = q->wq + c * K;
                double s = 0, sa = 0;
                for (int64_t k = 0; k < K; k++) {
                    double p = (double)ar[k] * wr[k];
                    s += p;
                    sa += fabs(p);
                }
                r[c] = s;
                m[c] = sa;
            }
        } else {
            for (int64_t c = 0; c < ncols; c++) r[c] = m[c] = 0;
            for (int64_t k = 0; k < N; k++) {
                const float *wr = q->wq + k * K;
                double av = ar[k];
                for (int64_t c = 0; c < ncols; c++) {
                    double p = av * wr[c];
                    r[c] += p;
                    m[c] += fabs(p);
                }
            }
        }
    }
}

/* Random bf16 activation (T, cols): host floats (bf16 values) and the device bits. */
static uint16_t *activation(fix *f, int64_t T, int64_t cols, float **host)
{
    float *h = malloc(T * cols * 4);
    uint16_t *b = malloc(T * cols * 2);
    for (int64_t i = 0; i < T * cols; i++) {
        b[i] = ft_quant_f32_to_bf16(2 * ft_rng_uniform(&f->rng) - 1);
        h[i] = ft_quant_bf16_to_f32(b[i]);
    }
    uint16_t *d = dev_copy(f, b, T * cols * 2);
    free(b);
    *host = h;
    return d;
}

/* Worst |got - ref| / (ABS + REL mag) over n outputs (> 1: out of tolerance); counts NaNs. */
static double worst(const float *got, const double *ref, const double *mag, const float *prev, float beta,
                    int64_t n, int64_t *nan_n, int64_t *at)
{
    double w = 0;
    *nan_n = 0;
    *at = -1;
    for (int64_t i = 0; i < n; i++) {
        double r = ref[i] + (beta != 0 ? (double)beta * prev[i] : 0);
        double m = mag[i] + (beta != 0 ? fabs((double)beta * prev[i]) : 0);
        if (isnan(got[i])) { (*nan_n)++; continue; }
        double e = fabs(got[i] - r) / (TOL_GEMM_ABS + TOL_GEMM_REL * m);
        if (e > w) { w = e; *at = i; }
    }
    return w;
}

/* One GEMM on the GPU vs the CPU; bm/splits 0 = the kernel's choice; api 1: through the
 * fwd / bwd_x entry points. Returns the worst error ratio. */
static double one(fix *f, const qw *q, int dgrad, int64_t T, float beta, int bm, int splits, int api)
{
    const int64_t kred = dgrad ? q->N : q->K, ncols = dgrad ? q->K : q->N, n_out = T * ncols;
    float *a;
    uint16_t *da = activation(f, T, kred, &a);
    float *prev = malloc(n_out * 4), *got = malloc(n_out * 4);
    for (int64_t i = 0; i < n_out; i++) prev[i] = beta != 0 ? 2 * ft_rng_uniform(&f->rng) - 1 : NAN;
    float *dc = dev_copy(f, prev, n_out * 4);
    int rc = api ? (dgrad ? ft_cuda_nf4_linear_bwd_x(f->gpu, dc, da, &q->t, T, q->N, q->K, beta)
                          : ft_cuda_nf4_linear_fwd(f->gpu, dc, da, &q->t, T, q->N, q->K, beta))
                 : ft_cuda_nf4_linear(f->gpu, dgrad, dc, da, &q->t, T, q->N, q->K, beta, bm, splits);
    if (rc) printf("  %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(f->gpu->ops->copy(f->gpu, got, dc, n_out * 4), 0);
    double *ref = malloc(n_out * 8), *mag = malloc(n_out * 8);
    reference(q, dgrad, a, T, ref, mag);
    int64_t nan_n, at;
    double w = worst(got, ref, mag, prev, beta, n_out, &nan_n, &at);
    if (w > 1 || nan_n)
        printf("  %s W %lld x %lld T %lld beta %g bm %d splits %d: worst %.3g of tolerance at (%lld, %lld): "
               "got %.9g ref %.9g; %lld NaN\n", dgrad ? "bwd_x" : "fwd", (long long)q->N, (long long)q->K,
               (long long)T, beta, bm, splits, w, (long long)(at / ncols), (long long)(at % ncols),
               at >= 0 ? got[at] : 0.0, at >= 0 ? ref[at] : 0.0, (long long)nan_n);
    assert_int_equal(nan_n, 0);
    assert_true(w <= 1);
    f->gpu->ops->free(f->gpu, da);
    f->gpu->ops->free(f->gpu, dc);
    free(a); free(prev); free(got); free(ref); free(mag);
    return w;
}

static void test_nf4_gemm_sweep(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    /* (N, K): half output tiles both ways; several steps per split; a Llama-like in-width */
    const int64_t shapes[][2] = {{192, 320}, {1024, 512}, {256, 4096}};
    const int64_t Ts[] = {1, 7, 20, 50, 100, 2048};
    double w_max = 0;
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        qw q;
        qw_make(f, &q, shapes[s][0], shapes[s][1], 64, 256);
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
            for (int dgrad = 0; dgrad <= 1; dgrad++) {
                double w = one(f, &q, dgrad, Ts[i], 0.0f, 0, 0, (int)(i & 1));
                if (w > w_max) w_max = w;
                cases++;
            }
        qw_free(f, &q);
    }
    printf("  nf4 gemm: %d cases (tile heights and splits chosen by T), worst error %.3f of tolerance\n",
           cases, w_max);
}

/* Every tile height with and without split-K, beta 0 / 1 / 0.5, a plain-absmax tensor and
 * blocksize 128. */
static void test_nf4_gemm_configs(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int bms[] = {16, 32, 64, 128};
    const int splits[] = {1, 3};
    const float betas[] = {0.0f, 1.0f, 0.5f};
    double w_max = 0;
    int cases = 0;
    for (int kind = 0; kind < 3; kind++) {
        qw q; /* nested bs 64; plain absmax; nested bs 128 */
        qw_make(f, &q, 320, 448, kind == 2 ? 128 : 64, kind == 1 ? 0 : 256);
        for (int b = 0; b < 4; b++)
            for (int s = 0; s < 2; s++)
                for (int dgrad = 0; dgrad <= 1; dgrad++) {
                    double w = one(f, &q, dgrad, 100, betas[(b + s + dgrad + kind) % 3], bms[b], splits[s], 0);
                    if (w > w_max) w_max = w;
                    cases++;
                }
        qw_free(f, &q);
    }
    printf("  nf4 gemm: %d forced configurations, worst error %.3f of tolerance\n", cases, w_max);
}

/* Identity activation: the output is W (or W^T) exactly; compared with dequant_nf4. */
static void test_nf4_gemm_dequant_values(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const struct { int64_t N, K, bs, nbs; int bm, splits; } cs[] = {
        {192, 320, 64, 256, 0, 0},  {192, 320, 64, 256, 16, 2}, {320, 192, 64, 0, 128, 1},
        {256, 512, 128, 256, 64, 3}, {256, 512, 64, 256, 32, 1},
    };
    int64_t checked = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        qw q;
        qw_make(f, &q, cs[c].N, cs[c].K, cs[c].bs, cs[c].nbs);
        const int64_t n = q.N * q.K;
        uint16_t *dw = dev_copy(f, NULL, n * 2), *plain = malloc(n * 2);
        assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, dw, &q.t), 0);
        assert_int_equal(f->gpu->ops->copy(f->gpu, plain, dw, n * 2), 0);
        for (int dgrad = 0; dgrad <= 1; dgrad++) {
            const int64_t T = dgrad ? q.N : q.K, ncols = dgrad ? q.K : q.N;
            uint16_t *eye = calloc(T * T, 2);
            for (int64_t i = 0; i < T; i++) eye[i * T + i] = ft_quant_f32_to_bf16(1.0f);
            uint16_t *de = dev_copy(f, eye, T * T * 2);
            float *dc = dev_copy(f, NULL, T * ncols * 4), *got = malloc(T * ncols * 4);
            assert_int_equal(ft_cuda_nf4_linear(f->gpu, dgrad, dc, de, &q.t, T, q.N, q.K, 0.0f, cs[c].bm,
                                                cs[c].splits), 0);
            assert_int_equal(f->gpu->ops->copy(f->gpu, got, dc, T * ncols * 4), 0);
            int64_t bad = 0, first = -1;
            for (int64_t r = 0; r < q.N; r++)
                for (int64_t k = 0; k < q.K; k++) { /* forward: y[k][r] = W[r][k]; bwd_x: dx[r][k] */
                    float g = dgrad ? got[r * q.K + k] : got[k * q.N + r];
                    if (g != ft_quant_bf16_to_f32(plain[r * q.K + k]) || g != q.wq[r * q.K + k]) {
                        if (first < 0) first = r * q.K + k;
                        bad++;
                    }
                }
            if (bad)
                printf("  %s W %lld x %lld bs %lld nested %lld bm %d splits %d: %lld values differ from "
                       "dequant_nf4 (first at %lld)\n", dgrad ? "bwd_x" : "fwd", (long long)q.N, (long long)q.K,
                       (long long)cs[c].bs, (long long)cs[c].nbs, cs[c].bm, cs[c].splits, (long long)bad,
                       (long long)first);
            assert_int_equal(bad, 0);
            checked += n;
            f->gpu->ops->free(f->gpu, de);
            f->gpu->ops->free(f->gpu, dc);
            free(eye);
            free(got);
        }
        f->gpu->ops->free(f->gpu, dw);
        free(plain);
        qw_free(f, &q);
    }
    printf("  nf4 gemm: %lld dequantized values equal to dequant_nf4 and the CPU\n", (long long)checked);
}

/* The staging path (dequant_nf4 into bf16, then linear_fwd / linear_bwd_x with FT_WTYPE_BF16)
 * against the fused kernel, same fp32 inputs: within the GEMM tolerance of each other. */
static void test_nf4_gemm_vs_staging(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    qw q;
    qw_make(f, &q, 1024, 512, 64, 256);
    const int64_t n = q.N * q.K, Ts[] = {7, 300};
    uint16_t *dw = dev_copy(f, NULL, n * 2);
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, dw, &q.t), 0);
    double w_max = 0;
    for (int i = 0; i < 2; i++)
        for (int dgrad = 0; dgrad <= 1; dgrad++) {
            const int64_t T = Ts[i], kred = dgrad ? q.N : q.K, ncols = dgrad ? q.K : q.N;
            float *a;
            uint16_t *da = activation(f, T, kred, &a); /* a holds bf16 values: rounding is exact */
            float *da32 = dev_copy(f, a, T * kred * 4), *scratch = dev_copy(f, NULL, T * 1024 * 4);
            float *d1 = dev_copy(f, NULL, T * ncols * 4), *d2 = dev_copy(f, NULL, T * ncols * 4);
            float *g1 = malloc(T * ncols * 4), *g2 = malloc(T * ncols * 4);
            assert_int_equal(ft_cuda_nf4_linear(f->gpu, dgrad, d1, da, &q.t, T, q.N, q.K, 0.0f, 0, 0), 0);
            if (dgrad)
                assert_int_equal(f->gpu->ops->linear_bwd_x(f->gpu, d2, da32, dw, FT_WTYPE_BF16, T, q.N, q.K, 0.0f,
                                                           scratch), 0);
            else
                assert_int_equal(f->gpu->ops->linear_fwd(f->gpu, d2, da32, dw, FT_WTYPE_BF16, T, q.N, q.K, 0.0f,
                                                         scratch), 0);
            assert_int_equal(f->gpu->ops->copy(f->gpu, g1, d1, T * ncols * 4), 0);
            assert_int_equal(f->gpu->ops->copy(f->gpu, g2, d2, T * ncols * 4), 0);
            double *ref = malloc(T * ncols * 8), *mag = malloc(T * ncols * 8);
            reference(&q, dgrad, a, T, ref, mag);
            for (int64_t j = 0; j < T * ncols; j++) ref[j] = g2[j]; /* staging output as the reference */
            int64_t nan_n, at;
            double w = worst(g1, ref, mag, NULL, 0.0f, T * ncols, &nan_n, &at);
            if (w > 1) printf("  vs staging %s T %lld: worst %.3g of tolerance\n", dgrad ? "bwd_x" : "fwd",
                              (long long)T, w);
            assert_int_equal(nan_n, 0);
            assert_true(w <= 2); /* two GPU sums, each within one tolerance of the exact one */
            if (w > w_max) w_max = w;
            f->gpu->ops->free(f->gpu, da);
            f->gpu->ops->free(f->gpu, da32);
            f->gpu->ops->free(f->gpu, scratch);
            f->gpu->ops->free(f->gpu, d1);
            f->gpu->ops->free(f->gpu, d2);
            free(a); free(g1); free(g2); free(ref); free(mag);
        }
    f->gpu->ops->free(f->gpu, dw);
    qw_free(f, &q);
    printf("  nf4 gemm vs dequant_nf4 + cuBLAS: worst difference %.3f of the GEMM tolerance\n", w_max);
}

static void test_nf4_gemm_refused(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    qw q;
    qw_make(f, &q, 128, 256, 64, 256);
    uint16_t *x = dev_copy(f, NULL, 64 * 256 * 2 + 16); /* bf16 (16, 256) fits */
    float *y = dev_copy(f, NULL, 64 * 256 * 4);
    ft_nf4_tensor t = q.t;
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 128, 256, 0.0f), 0);
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 96, 256, 0.0f), FT_E_INVALID); /* n != N K */
    t.n = 160 * 256;
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 160, 256, 0.0f), FT_E_INVALID); /* N % 64 */
    t = q.t;
    t.blocksize = 16;
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 128, 256, 0.0f), FT_E_INVALID);
    t = q.t;
    t.qabsmax = NULL;
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 128, 256, 0.0f), FT_E_INVALID);
    t = q.t;
    t.codes += 8; /* codes not 16-byte aligned */
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &t, 16, 128, 256, 0.0f), FT_E_INVALID);
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x + 4, &q.t, 16, 128, 256, 0.0f), FT_E_INVALID);
    /* forced split-K partials beyond the workspace (64 MB): 1000 x 65536 x 128 floats */
    assert_int_equal(ft_cuda_nf4_linear(f->gpu, 0, y, x, &q.t, 65536, 128, 256, 0.0f, 128, 1000),
                     FT_E_INVALID);
    assert_int_equal(ft_cuda_nf4_linear_fwd(f->gpu, y, x, &q.t, 0, 128, 256, 0.0f), 0); /* T = 0 */
    f->gpu->ops->free(f->gpu, x);
    f->gpu->ops->free(f->gpu, y);
    qw_free(f, &q);
}
#else
static void test_nf4_gemm_sweep(void **state) { skip(); }
static void test_nf4_gemm_configs(void **state) { skip(); }
static void test_nf4_gemm_dequant_values(void **state) { skip(); }
static void test_nf4_gemm_vs_staging(void **state) { skip(); }
static void test_nf4_gemm_refused(void **state) { skip(); }
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nf4_gemm_dequant_values),
        cmocka_unit_test(test_nf4_gemm_sweep),
        cmocka_unit_test(test_nf4_gemm_configs),
        cmocka_unit_test(test_nf4_gemm_vs_staging),
        cmocka_unit_test(test_nf4_gemm_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
