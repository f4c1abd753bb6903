/* test_kernels_fwd.c - the CPU backend's fp32 ops (through the op table) against the fp64
 * instance of the same bodies (kernels/cpu/cpu_f64.h) and against independent references
 * written here: a naive O(T^2) attention with the full score matrix, cross-entropy on the
 * full logits, an AdamW step computed by hand, dropout statistics, the NEFTune noise (its
 * statistics, its values from the definition, cpu-device == cpu), RoPE round trips, and
 * the invalid-argument paths. Prints the max error of each comparison, then a small
 * microbenchmark (sgemm GFLOP/s, attention forward time) that asserts nothing.
 */
#include "tests/unit/harness.h"

#include <cblas.h>
#include <omp.h>
#include <time.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_f64.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "tests/unit/kernels_fixture.h"

/* fp32 against an fp64 result of the same formula: harness FT_TOL_F32_ABS / _REL.
 * Cross-entropy sums T rows of logsumexp in double from fp32 logits: relative part. */
#define TOL_CE_LOSS_REL 1e-5
/* f64 instance against the naive fp64 references here: only rounding differs. */
#define TOL_F64_ABS 1e-12
#define TOL_F64_REL 1e-10
/* Dropout p = 0.5 over 2^20 elements: the kept fraction has sd 0.5/sqrt(n) = 4.9e-4; allow
 * 6 sd (a false failure once in ~5e8 seeds; the seeds here are fixed anyway). */
#define TOL_DROPOUT_FRAC 3e-3
/* NEFTune noise over 2^20 values of mag * U(-1, 1): the sample mean has sd mag/sqrt(3n),
 * allowed 6 sd; the sample mean of u^2 (1/3) has sd sqrt((1/5 - 1/9) / n) = 2.9e-4, 8.8e-4
 * relative to 1/3: 6 sd is 5.3e-3. A draw on [0, 1) or [-1/2, 1/2) fails both by far. */
#define TOL_NOISE_MEAN_SD 6.0
#define TOL_NOISE_VAR_REL 5.3e-3

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t g_rng = 0xC0FFEEu;
static double t_unif(double lo, double hi) { return t_unif_at(&g_rng, lo, hi); }

/* A pair of arrays with the same random values: fp32 for the op, fp64 for the reference. */
typedef struct {
    float *f;
    double *d;
    int64_t n;
} pair;

static pair p_new(int64_t n, double lo, double hi)
{
    pair p = {malloc((size_t)(n ? n : 1) * sizeof(float)), malloc((size_t)(n ? n : 1) * sizeof(double)), n};
    assert_non_null(p.f);
    assert_non_null(p.d);
    for (int64_t i = 0; i < n; i++) {
        p.f[i] = (float)t_unif(lo, hi);
        p.d[i] = p.f[i];
    }
    return p;
}

static void p_free(pair *p) { free(p->f), free(p->d); }

/* got (fp32) vs ref (fp64): |got - ref| <= abs + rel * |ref| everywhere. Prints the max
 * errors and the first mismatches. */
static void t_cmp_f(const char *name, const float *got, const double *ref, int64_t n,
                    double abs_tol, double rel_tol)
{
    double max_abs = 0, max_rel = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > max_abs) max_abs = d;
        double r = t_relerr(got[i], ref[i], 1e-3);
        if (r > max_rel) max_rel = r;
        if (!(d <= abs_tol + rel_tol * fabs(ref[i]))) {
            if (bad < 5)
                print_message("%s: [%lld] got %.9g, expected %.12g\n", name, (long long)i,
                              (double)got[i], ref[i]);
            bad++;
        }
    }
    print_message("%s: max abs err %.2e, max rel err %.2e over %lld entries\n", name, max_abs,
                  max_rel, (long long)n);
    assert_int_equal(bad, 0);
}

static void t_cmp_d(const char *name, const double *got, const double *ref, int64_t n,
                    double abs_tol, double rel_tol)
{
    double max_abs = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (d > max_abs) max_abs = d;
        if (!(d <= abs_tol + rel_tol * fabs(ref[i]))) {
            if (bad < 5)
                print_message("%s: [%lld] got %.15g, expected %.15g\n", name, (long long)i,
                              got[i], ref[i]);
            bad++;
        }
    }
    print_message("%s: max abs err %.2e over %lld entries\n", name, max_abs, (long long)n);
    assert_int_equal(bad, 0);
}

#define F32_TOL FT_TOL_F32_ABS, FT_TOL_F32_REL

static double t_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- memory ----------------------------------------------------------------------------- */

static void test_memory(void **state)
{
    (void)state;
    const ft_backend_ops *o = g_be->ops;
    assert_string_equal(o->name, "cpu");
    size_t sizes[] = {0, 1, 63, 64, 1000, (size_t)9 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = o->alloc(g_be, sizes[i]), *q = o->alloc(g_be, sizes[i]);
        assert_non_null(p);
        assert_non_null(q);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t j = 0; j < sizes[i]; j++) p[j] = (unsigned char)(j * 7 + 1);
        assert_int_equal(o->copy(g_be, q, p, sizes[i]), 0);
        if (sizes[i]) assert_memory_equal(p, q, sizes[i]);
        assert_int_equal(o->zero(g_be, q, sizes[i]), 0);
        for (size_t j = 0; j < sizes[i]; j++) assert_int_equal(q[j], 0);
        o->free(g_be, p);
        o->free(g_be, q);
    }
    o->free(g_be, NULL);
    assert_int_equal(o->copy(g_be, NULL, sizes, 8), FT_E_INVALID);
    assert_int_equal(o->zero(g_be, NULL, 8), FT_E_INVALID);
}

/* ---- BLAS-like ---------------------------------------------------------------------------- */

/* c = alpha op(a) op(b) + beta c for all four transpose combinations, padded strides,
 * against a triple loop in double; the padding must stay untouched. */
static void test_gemm(void **state)
{
    (void)state;
    /* small (one BLAS call) and large enough to be split over the OpenMP team, by rows
     * (m >= n) and by columns (n > m) */
    const int64_t shapes[3][3] = {{7, 5, 9}, {100, 70, 60}, {40, 130, 60}};
    for (int si = 0; si < 3; si++) {
        const int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2], pad = 3;
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
                pair a = p_new(ar * lda, -1, 1), b = p_new(br * ldb, -1, 1),
                     c = p_new(m * ldc, -1, 1);
                double *ref = malloc(m * ldc * sizeof(double));
                memcpy(ref, c.d, m * ldc * sizeof(double));
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double acc = 0;
                        for (int64_t l = 0; l < k; l++)
                            acc += (ta ? a.d[l * lda + i] : a.d[i * lda + l]) *
                                   (tb ? b.d[j * ldb + l] : b.d[l * ldb + j]);
                        ref[i * ldc + j] = 0.7 * acc + 0.3 * c.d[i * ldc + j];
                    }
                assert_int_equal(g_be->ops->gemm(g_be, ta, tb, m, n, k, 0.7f, a.f, lda, b.f, ldb,
                                                 0.3f, c.f, ldc),
                                 0);
                assert_int_equal(ft_cpu_gemm_f64(ta, tb, m, n, k, 0.7, a.d, lda, b.d, ldb, 0.3,
                                                 c.d, ldc),
                                 0);
                char name[96];
                snprintf(name, sizeof name, "gemm %lldx%lldx%lld ta=%d tb=%d fp32", (long long)m,
                         (long long)n, (long long)k, ta, tb);
                t_cmp_f(name, c.f, ref, m * ldc, F32_TOL); /* padding included: untouched */
                snprintf(name, sizeof name, "gemm %lldx%lldx%lld ta=%d tb=%d fp64", (long long)m,
                         (long long)n, (long long)k, ta, tb);
                t_cmp_d(name, c.d, ref, m * ldc, TOL_F64_ABS, TOL_F64_REL);
                p_free(&a), p_free(&b), p_free(&c), free(ref);
            }
        }
    }
    /* k = 0: c = beta c */
    float c0[4] = {1, 2, 3, 4};
    assert_int_equal(g_be->ops->gemm(g_be, 0, 0, 2, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.5f, c0, 2), 0);
    assert_true(c0[0] == 0.5f && c0[3] == 2.0f);
    /* stride shorter than the row, size beyond 32-bit BLAS */
    float a1[6] = {0}, b1[6] = {0}, c1[4] = {0};
    assert_int_equal(g_be->ops->gemm(g_be, 0, 0, 2, 2, 3, 1, a1, 2, b1, 2, 0, c1, 2), FT_E_INVALID);
    assert_true(strstr(ft_errmsg(), "lda") != NULL);
    assert_int_equal(g_be->ops->gemm(g_be, 0, 0, (int64_t)1 << 31, 1, 1, 1, a1, 1, b1, 1, 0, c1, 1),
                     FT_E_INVALID);
}

static void test_blas1(void **state)
{
    (void)state;
    const int64_t n = 100003; /* above the parallel threshold, odd */
    pair x = p_new(n, -1, 1), y = p_new(n, -1, 1);
    assert_int_equal(g_be->ops->axpy(g_be, 0.25f, x.f, y.f, n), 0);
    assert_int_equal(ft_cpu_axpy_f64(0.25, x.d, y.d, n), 0);
    t_cmp_f("axpy", y.f, y.d, n, F32_TOL);
    assert_int_equal(g_be->ops->scale(g_be, y.f, -3.0f, n), 0);
    assert_int_equal(ft_cpu_scale_f64(y.d, -3.0, n), 0);
    t_cmp_f("scale", y.f, y.d, n, F32_TOL);

    double s1, s2, ref = 0;
    for (int64_t i = 0; i < n; i++) ref += x.d[i] * x.d[i];
    assert_int_equal(g_be->ops->sumsq(g_be, &s1, x.f, n), 0);
    assert_int_equal(g_be->ops->sumsq(g_be, &s2, x.f, n), 0);
    print_message("sumsq: %.15g vs %.15g, rel err %.2e\n", s1, ref, fabs(s1 - ref) / ref);
    assert_true(fabs(s1 - ref) <= TOL_F64_REL * ref); /* fp32 squares are exact in double */
    assert_true(s1 == s2);                           /* fixed summation order */
    assert_int_equal(g_be->ops->sumsq(g_be, &s1, x.f, 0), 0);
    assert_true(s1 == 0);

    const int64_t T = 300, O = 130;
    pair yb = p_new(T * O, -1, 1), bias = p_new(O, -1, 1);
    assert_int_equal(g_be->ops->bias_add(g_be, yb.f, bias.f, T, O), 0);
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < O; o++) yb.d[t * O + o] += bias.d[o];
    t_cmp_f("bias_add", yb.f, yb.d, T * O, F32_TOL);
    assert_int_equal(g_be->ops->axpy(g_be, 1, NULL, y.f, 5), FT_E_INVALID);
    assert_int_equal(g_be->ops->scale(g_be, y.f, 1, -1), FT_E_INVALID);
    p_free(&x), p_free(&y), p_free(&yb), p_free(&bias);
}

static void test_embedding(void **state)
{
    (void)state;
    const int64_t V = 50, C = 24, T = 9;
    pair tab = p_new(V * C, -1, 1);
    int32_t ids[9] = {0, 49, 3, 3, 17, 0, 48, 1, 2};
    float *out = malloc(T * C * sizeof(float));
    assert_int_equal(g_be->ops->embedding_fwd(g_be, out, ids, tab.f, T, C, V), 0);
    for (int64_t t = 0; t < T; t++)
        assert_memory_equal(out + t * C, tab.f + ids[t] * C, C * sizeof(float));
    ids[4] = 50; /* == V */
    assert_int_equal(g_be->ops->embedding_fwd(g_be, out, ids, tab.f, T, C, V), FT_E_INVALID);
    assert_true(strstr(ft_errmsg(), "ids[4] = 50") != NULL);
    ids[4] = -1;
    assert_int_equal(g_be->ops->embedding_fwd(g_be, out, ids, tab.f, T, C, V), FT_E_INVALID);
    print_message("embedding_fwd: exact copy; out-of-range id -> \"%s\"\n", ft_errmsg());
    p_free(&tab), free(out);
}

/* ---- RMSNorm, RoPE, SwiGLU: fp32 vs fp64 instance ------------------------------------------ */

static void test_rmsnorm(void **state)
{
    (void)state;
    const int64_t T = 64, C = 576;
    pair x = p_new(T * C, -3, 3), w = p_new(C, 0.5, 1.5), y = p_new(T * C, 0, 0),
         rstd = p_new(T, 0, 0), dy = p_new(T * C, -1, 1), dx = p_new(T * C, -1, 1);
    assert_int_equal(g_be->ops->rmsnorm_fwd(g_be, y.f, rstd.f, x.f, w.f, T, C, 1e-5f), 0);
    assert_int_equal(ft_cpu_rmsnorm_fwd_f64(y.d, rstd.d, x.d, w.d, T, C, (double)1e-5f), 0);
    t_cmp_f("rmsnorm_fwd y", y.f, y.d, T * C, F32_TOL);
    t_cmp_f("rmsnorm_fwd rstd", rstd.f, rstd.d, T, F32_TOL);
    assert_int_equal(g_be->ops->rmsnorm_bwd(g_be, dx.f, dy.f, x.f, w.f, rstd.f, T, C), 0);
    assert_int_equal(ft_cpu_rmsnorm_bwd_f64(dx.d, dy.d, x.d, w.d, rstd.d, T, C), 0);
    t_cmp_f("rmsnorm_bwd dx (accumulated)", dx.f, dx.d, T * C, F32_TOL);
    p_free(&x), p_free(&w), p_free(&y), p_free(&rstd), p_free(&dy), p_free(&dx);
}

static void test_rope(void **state)
{
    (void)state;
    const int64_t T = 40, H = 9, D = 64;
    pair x = p_new(T * H * D, -2, 2), invf = p_new(D / 2, 0, 0);
    for (int64_t i = 0; i < D / 2; i++) {
        invf.f[i] = (float)pow(100000.0, -2.0 * i / D);
        invf.d[i] = invf.f[i];
    }
    int32_t *pos = malloc(T * sizeof(int32_t));
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(t < 20 ? t : 4000 + 37 * t);
    float *x0 = malloc(T * H * D * sizeof(float));
    memcpy(x0, x.f, T * H * D * sizeof(float));
    assert_int_equal(g_be->ops->rope_fwd(g_be, x.f, pos, invf.f, T, H, D), 0);
    assert_int_equal(ft_cpu_rope_fwd_f64(x.d, pos, invf.d, T, H, D), 0);
    t_cmp_f("rope_fwd", x.f, x.d, T * H * D, F32_TOL);
    /* rope_bwd is the inverse rotation: rope then rope_bwd is the identity */
    double *x0d = malloc(T * H * D * sizeof(double));
    for (int64_t i = 0; i < T * H * D; i++) x0d[i] = x0[i];
    assert_int_equal(g_be->ops->rope_bwd(g_be, x.f, pos, invf.f, T, H, D), 0);
    t_cmp_f("rope_fwd then rope_bwd = identity", x.f, x0d, T * H * D, F32_TOL);
    /* the pair (x_i, x_{i+D/2}) of head 0, token 1 rotated by pos 1 * inv_freq[0] = 1 rad */
    float v[4] = {1, 0, 0, 0}, f1[1] = {1};
    int32_t p1 = 1;
    assert_int_equal(g_be->ops->rope_fwd(g_be, v, &p1, f1, 1, 1, 2), 0);
    assert_true(fabs(v[0] - cos(1.0)) < FT_TOL_F32_ABS && fabs(v[1] - sin(1.0)) < FT_TOL_F32_ABS);
    assert_int_equal(g_be->ops->rope_fwd(g_be, x.f, pos, invf.f, T, H, 7), FT_E_INVALID);
    p_free(&x), p_free(&invf), free(pos), free(x0), free(x0d);
}

static void test_swiglu(void **state)
{
    (void)state;
    const int64_t n = 50000;
    pair g = p_new(n, -10, 10), u = p_new(n, -3, 3), h = p_new(n, 0, 0), dh = p_new(n, -1, 1),
         dg = p_new(n, 0, 0), du = p_new(n, 0, 0);
    g.f[0] = -200, g.d[0] = -200, g.f[1] = 200, g.d[1] = 200; /* exp overflow paths */
    assert_int_equal(g_be->ops->swiglu_fwd(g_be, h.f, g.f, u.f, n), 0);
    assert_int_equal(ft_cpu_swiglu_fwd_f64(h.d, g.d, u.d, n), 0);
    t_cmp_f("swiglu_fwd", h.f, h.d, n, F32_TOL);
    assert_int_equal(g_be->ops->swiglu_bwd(g_be, dg.f, du.f, dh.f, g.f, u.f, n), 0);
    assert_int_equal(ft_cpu_swiglu_bwd_f64(dg.d, du.d, dh.d, g.d, u.d, n), 0);
    t_cmp_f("swiglu_bwd dgate", dg.f, dg.d, n, F32_TOL);
    t_cmp_f("swiglu_bwd dup", du.f, du.d, n, F32_TOL);
    p_free(&g), p_free(&u), p_free(&h), p_free(&dh), p_free(&dg), p_free(&du);
}

/* ---- attention ---------------------------------------------------------------------------- */

/* Naive reference: the full (T, T) score matrix per head with the causal/sequence mask,
 * softmax in double, then P V. */
static void naive_attention(double *out, double *lse, const double *q, const double *k,
                            const double *v, const int32_t *ss, int64_t T, int64_t H,
                            int64_t Hkv, int64_t D, double scale)
{
    double *S = malloc(T * T * sizeof(double));
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / Hkv);
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < T; j++) {
                int allowed = j <= i && j >= ss[i];
                double s = 0;
                for (int64_t d = 0; d < D; d++)
                    s += q[(i * H + h) * D + d] * k[(j * Hkv + g) * D + d];
                S[i * T + j] = allowed ? scale * s : -INFINITY;
            }
        for (int64_t i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < T; j++) mx = fmax(mx, S[i * T + j]);
            for (int64_t j = 0; j < T; j++) sum += exp(S[i * T + j] - mx);
            lse[i * H + h] = mx + log(sum);
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t j = 0; j < T; j++)
                    o += exp(S[i * T + j] - mx) / sum * v[(j * Hkv + g) * D + d];
                out[(i * H + h) * D + d] = o;
            }
        }
    }
    free(S);
}

static void test_attention(void **state)
{
    (void)state;
    /* a sequence longer than the 64-key softmax block, a one-token one, GQA 3:1 */
    const int64_t T = 90, H = 6, Hkv = 2, D = 16;
    const int64_t lens[] = {67, 1, 22};
    int32_t *ss = t_seq_start(lens, 3, T);
    const double scale = 1.0 / sqrt((double)D);
    pair q = p_new(T * H * D, -2, 2), k = p_new(T * Hkv * D, -2, 2), v = p_new(T * Hkv * D, -1, 1);
    pair out = p_new(T * H * D, 0, 0), lse = p_new(T * H, 0, 0);
    double *ro = malloc(T * H * D * sizeof(double)), *rl = malloc(T * H * sizeof(double));
    naive_attention(ro, rl, q.d, k.d, v.d, ss, T, H, Hkv, D, scale);
    assert_int_equal(ft_cpu_attention_fwd_f64(out.d, lse.d, q.d, k.d, v.d, ss, T, H, Hkv, D, scale), 0);
    t_cmp_d("attention_fwd fp64 vs naive: out", out.d, ro, T * H * D, TOL_F64_ABS, TOL_F64_REL);
    t_cmp_d("attention_fwd fp64 vs naive: lse", lse.d, rl, T * H, TOL_F64_ABS, TOL_F64_REL);
    assert_int_equal(g_be->ops->attention_fwd(g_be, out.f, lse.f, q.f, k.f, v.f, ss, T, H, Hkv, D,
                                              (float)scale),
                     0);
    t_cmp_f("attention_fwd fp32 vs naive: out", out.f, ro, T * H * D, F32_TOL);
    t_cmp_f("attention_fwd fp32 vs naive: lse", lse.f, rl, T * H, F32_TOL);

    /* backward: fp32 vs fp64 instance (the fp64 one is checked by finite differences) */
    pair dout = p_new(T * H * D, -1, 1), dq = p_new(T * H * D, 0, 0), dk = p_new(T * Hkv * D, 0, 0),
         dv = p_new(T * Hkv * D, 0, 0);
    assert_int_equal(g_be->ops->attention_bwd(g_be, dq.f, dk.f, dv.f, dout.f, q.f, k.f, v.f, out.f,
                                              lse.f, ss, T, H, Hkv, D, (float)scale),
                     0);
    assert_int_equal(ft_cpu_attention_bwd_f64(dq.d, dk.d, dv.d, dout.d, q.d, k.d, v.d, out.d, lse.d,
                                              ss, T, H, Hkv, D, scale),
                     0);
    t_cmp_f("attention_bwd dq", dq.f, dq.d, T * H * D, F32_TOL);
    t_cmp_f("attention_bwd dk", dk.f, dk.d, T * Hkv * D, F32_TOL);
    t_cmp_f("attention_bwd dv", dv.f, dv.d, T * Hkv * D, F32_TOL);

    /* invalid: H not a multiple of Hkv; seq_start not contiguous sequences */
    assert_int_equal(g_be->ops->attention_fwd(g_be, out.f, lse.f, q.f, k.f, v.f, ss, T, H, 4, D, 1),
                     FT_E_INVALID);
    ss[70] = 3;
    assert_int_equal(g_be->ops->attention_fwd(g_be, out.f, lse.f, q.f, k.f, v.f, ss, T, H, Hkv, D, 1),
                     FT_E_INVALID);
    print_message("attention_fwd bad seq_start -> \"%s\"\n", ft_errmsg());
    assert_int_equal(g_be->ops->attention_bwd(g_be, dq.f, dk.f, dv.f, dout.f, q.f, k.f, v.f, out.f,
                                              lse.f, ss, T, H, Hkv, D, 1),
                     FT_E_INVALID);
    free(ss), free(ro), free(rl);
    p_free(&q), p_free(&k), p_free(&v), p_free(&out), p_free(&lse);
    p_free(&dout), p_free(&dq), p_free(&dk), p_free(&dv);
}

/* ---- dropout ------------------------------------------------------------------------------ */

static void test_dropout(void **state)
{
    (void)state;
    const int64_t n = (int64_t)1 << 20;
    pair x = p_new(n, 0.5, 1.5); /* never zero, so y == 0 means dropped */
    float *y = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float));
    double *yd = malloc(n * sizeof(double));
    /* p = 0 copies (also in place) */
    assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, 0.0f, 1), 0);
    assert_memory_equal(y, x.f, n * sizeof(float));
    assert_int_equal(g_be->ops->dropout(g_be, y, y, n, 0.0f, 1), 0);
    assert_memory_equal(y, x.f, n * sizeof(float));
    /* p = 0.5: about half kept, kept ones scaled by exactly 2 */
    assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, 0.5f, 1234), 0);
    int64_t kept = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (y[i] != 0) {
            kept++;
            bad += y[i] != 2.0f * x.f[i];
        }
    }
    double frac = (double)kept / n;
    print_message("dropout p=0.5: kept fraction %.5f (|err| %.1e, tol %.1e), scale 2 exact\n", frac,
                  fabs(frac - 0.5), TOL_DROPOUT_FRAC);
    assert_int_equal(bad, 0);
    assert_true(fabs(frac - 0.5) <= TOL_DROPOUT_FRAC);
    /* same seed: same mask, also in the fp64 instance and in place; other seed: ~half agree */
    assert_int_equal(ft_cpu_dropout_f64(yd, x.d, n, 0.5, 1234), 0);
    memcpy(y2, x.f, n * sizeof(float));
    assert_int_equal(g_be->ops->dropout(g_be, y2, y2, n, 0.5f, 1234), 0);
    int64_t agree_f64 = 0, agree_inplace = 0, agree_other = 0;
    for (int64_t i = 0; i < n; i++) {
        agree_f64 += (y[i] != 0) == (yd[i] != 0);
        agree_inplace += y[i] == y2[i];
    }
    assert_int_equal(agree_f64, n);
    assert_int_equal(agree_inplace, n);
    assert_int_equal(g_be->ops->dropout(g_be, y2, x.f, n, 0.5f, 1235), 0);
    for (int64_t i = 0; i < n; i++) agree_other += (y[i] != 0) == (y2[i] != 0);
    print_message("dropout seeds 1234 vs 1235: masks agree on %.4f of entries\n",
                  (double)agree_other / n);
    assert_true(fabs((double)agree_other / n - 0.5) <= TOL_DROPOUT_FRAC);
    /* p = 0.1 */
    assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, 0.1f, 99), 0);
    kept = 0;
    for (int64_t i = 0; i < n; i++) kept += y[i] != 0;
    print_message("dropout p=0.1: kept fraction %.5f\n", (double)kept / n);
    assert_true(fabs((double)kept / n - 0.9) <= TOL_DROPOUT_FRAC);
    /* the mask against its definition written out here (cpu_common.h's comment), in double:
     * keep iff (double)(t_mix64(t_mix64(seed) ^ i) >> 40) >= p * 2^24, for p whose p * 2^24 is
     * an integer (0.5, 0.25, 2^-24) or not (0.05, 0.1, 1e-7, 0.9999) */
    const float ps[] = {0.5f, 0.25f, 0x1p-24f, 0.05f, 0.1f, 1e-7f, 0.9999f};
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
        assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, ps[k], 77 + k), 0);
        const uint64_t key = t_mix64(77 + k);
        const double thr = (double)ps[k] * 16777216.0;
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; i++)
            wrong += (y[i] != 0) != ((double)(t_mix64(key ^ (uint64_t)i) >> 40) >= thr);
        assert_int_equal(wrong, 0);
    }
    /* at the threshold itself: a draw of exactly ceil(p 2^24) is kept, one less is dropped */
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
        const uint32_t t = ft_dropout_threshold((double)ps[k]);
        assert_true((double)t >= (double)ps[k] * 16777216.0 && (double)(t - 1) < (double)ps[k] * 16777216.0);
    }
    assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, 1.0f, 1), FT_E_INVALID);
    assert_int_equal(g_be->ops->dropout(g_be, y, x.f, n, -0.1f, 1), FT_E_INVALID);
    p_free(&x), free(y), free(y2), free(yd);
}

/* ---- NEFTune noise ------------------------------------------------------------------------ */

/* The draw written out here from the definition (kernels.h noise_uniform_add), independently
 * of cpu_common.h: splitmix64 (t_mix64) of (splitmix64(seed) ^ i), its top 24 bits k,
 * u = k/2^23 - 1. */
static void test_noise_uniform_add(void **state)
{
    (void)state;
    const int64_t n = (int64_t)1 << 20;
    const float mag = 0.0625f * 3; /* alpha 5 / sqrt(seq_len * C) is of this size */
    float *x = calloc((size_t)n, sizeof(float)), *y = malloc(n * sizeof(float));
    float *z = malloc(n * sizeof(float));
    assert_non_null(x), assert_non_null(y), assert_non_null(z);
    /* statistics of the noise itself (x = 0): mean ~0, |d| <= mag, variance ~mag^2/3 */
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, x, n, mag, 1234), 0);
    double sum = 0, sq = 0, lo = 0, hi = 0;
    int64_t out_of_range = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = x[i];
        sum += d, sq += d * d;
        lo = fmin(lo, d), hi = fmax(hi, d);
        out_of_range += !(d >= -mag && d < mag);
    }
    double mean = sum / n, var = sq / n - mean * mean;
    print_message("noise_uniform_add n=%lld mag %g: mean %.3g (tol %.3g), var / (mag^2/3) = %.5f "
                  "(tol %.1e), range [%.6f, %.6f] mag\n", (long long)n, (double)mag, mean,
                  TOL_NOISE_MEAN_SD * mag / sqrt(3.0 * n), var / (mag * mag / 3.0), TOL_NOISE_VAR_REL,
                  lo / mag, hi / mag);
    assert_int_equal(out_of_range, 0);
    assert_true(fabs(mean) <= TOL_NOISE_MEAN_SD * mag / sqrt(3.0 * n));
    assert_true(fabs(var / (mag * mag / 3.0) - 1.0) <= TOL_NOISE_VAR_REL);
    assert_true(lo < -0.999 * mag && hi > 0.999 * mag); /* all of [-mag, mag) is reached */
    /* the values: x + (float)(mag * u_i) with u_i from the definition, bit for bit */
    pair xs = p_new(n, -2, 2);
    memcpy(y, xs.f, n * sizeof(float));
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, y, n, mag, 77), 0);
    int64_t bad = 0, moved = 0;
    const uint64_t key = t_mix64(77);
    for (int64_t i = 0; i < n; i++) {
        float u = (float)((double)(t_mix64(key ^ (uint64_t)i) >> 40) / 8388608.0 - 1.0);
        float d = mag * u;
        float want = xs.f[i] + d;
        if (memcmp(&want, &y[i], sizeof want)) {
            if (bad < 5)
                print_message("noise_uniform_add: [%lld] got %.9g, expected %.9g\n", (long long)i,
                              (double)y[i], (double)want);
            bad++;
        }
        moved += y[i] != xs.f[i];
    }
    assert_int_equal(bad, 0);
    assert_true(moved > n / 2);
    /* deterministic for a seed; another seed gives other noise */
    memcpy(z, xs.f, n * sizeof(float));
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, mag, 77), 0);
    assert_memory_equal(z, y, n * sizeof(float));
    memcpy(z, xs.f, n * sizeof(float));
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, mag, 78), 0);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += z[i] == y[i];
    print_message("noise_uniform_add seeds 77 vs 78: %lld of %lld values equal\n", (long long)same,
                  (long long)n);
    assert_true(same < n / 100);
    /* the cpu-device table runs the same op: the same bits */
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    assert_string_equal(dev->ops->name, "cpu-device");
    assert_ptr_not_equal(dev->ops->noise_uniform_add, NULL);
    memcpy(z, xs.f, n * sizeof(float));
    assert_int_equal(dev->ops->noise_uniform_add(dev, z, n, mag, 77), 0);
    assert_memory_equal(z, y, n * sizeof(float));
    ft_backend_free(dev);
    /* n = 0 (NULL allowed) and mag = 0 change nothing; bad arguments are refused */
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, NULL, 0, mag, 1), 0);
    memcpy(z, xs.f, n * sizeof(float));
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, 0.0f, 1), 0);
    assert_memory_equal(z, xs.f, n * sizeof(float));
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, -1, mag, 1), FT_E_INVALID);
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, NULL, 4, mag, 1), FT_E_INVALID);
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, -0.5f, 1), FT_E_INVALID);
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, NAN, 1), FT_E_INVALID);
    assert_int_equal(g_be->ops->noise_uniform_add(g_be, z, n, INFINITY, 1), FT_E_INVALID);
    p_free(&xs), free(x), free(y), free(z);
}

/* ---- LM head + cross-entropy -------------------------------------------------------------- */

/* Direct computation on the full logits in double. */
static double naive_ce(double *dx, int64_t *nv, const double *x, const double *W,
                       const int32_t *tg, int64_t T, int64_t C, int64_t V, double gs)
{
    double loss = 0, *lg = malloc(V * sizeof(double));
    *nv = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < C; i++) dx[t * C + i] = 0;
        if (tg[t] < 0) continue;
        (*nv)++;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < V; j++) {
            double s = 0;
            for (int64_t i = 0; i < C; i++) s += x[t * C + i] * W[j * C + i];
            lg[j] = s;
            mx = fmax(mx, s);
        }
        for (int64_t j = 0; j < V; j++) sum += exp(lg[j] - mx);
        double lse = mx + log(sum);
        loss += lse - lg[tg[t]];
        for (int64_t j = 0; j < V; j++) {
            double d = gs * (exp(lg[j] - lse) - (j == tg[t]));
            for (int64_t i = 0; i < C; i++) dx[t * C + i] += d * W[j * C + i];
        }
    }
    free(lg);
    return loss;
}

static void test_lm_head_ce(void **state)
{
    (void)state;
    const int64_t T = 20, C = 32, V = 300;
    const float gs = 1.0f / 13;
    pair x = p_new(T * C, -1, 1), W = p_new(V * C, -0.5, 0.5), dx = p_new(T * C, 7, 7);
    int32_t tg[20];
    for (int64_t t = 0; t < T; t++) tg[t] = (int32_t)(t * 37 % V);
    tg[0] = tg[5] = tg[6] = tg[19] = -100;
    double *rdx = malloc(T * C * sizeof(double)), loss32, loss64, loss_nodx;
    int64_t rnv, nv32, nv64, nv_nodx;
    double rloss = naive_ce(rdx, &rnv, x.d, W.d, tg, T, C, V, (double)gs);
    const int64_t chunks[] = {1, 6, 20, 64};
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
        int64_t ch = chunks[ci];
        float *scr = malloc(ch * V * sizeof(float));
        double *scrd = malloc(ch * V * sizeof(double));
        assert_int_equal(g_be->ops->lm_head_ce(g_be, &loss32, &nv32, dx.f, x.f, W.f, tg, T, C, V,
                                               gs, scr, ch),
                         0);
        assert_int_equal(ft_cpu_lm_head_ce_f64(&loss64, &nv64, dx.d, x.d, W.d, tg, T, C, V,
                                               (double)gs, scrd, ch),
                         0);
        assert_int_equal(g_be->ops->lm_head_ce(g_be, &loss_nodx, &nv_nodx, NULL, x.f, W.f, tg, T,
                                               C, V, gs, scr, ch),
                         0);
        print_message("lm_head_ce chunk=%lld: loss fp32 %.10g, fp64 %.12g, naive %.12g "
                      "(rel err %.1e)\n",
                      (long long)ch, loss32, loss64, rloss, fabs(loss32 - rloss) / rloss);
        assert_int_equal(nv32, rnv);
        assert_int_equal(nv64, rnv);
        assert_int_equal(nv_nodx, rnv);
        assert_true(loss_nodx == loss32);
        assert_true(fabs(loss32 - rloss) <= TOL_CE_LOSS_REL * fabs(rloss));
        assert_true(fabs(loss64 - rloss) <= TOL_F64_REL * fabs(rloss));
        t_cmp_f("lm_head_ce dx fp32 vs naive", dx.f, rdx, T * C, F32_TOL);
        t_cmp_d("lm_head_ce dx fp64 vs naive", dx.d, rdx, T * C, TOL_F64_ABS, TOL_F64_REL);
        free(scr), free(scrd);
    }
    /* logits */
    float *lg = malloc(T * V * sizeof(float));
    double *rlg = malloc(T * V * sizeof(double));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < V; j++) {
            double s = 0;
            for (int64_t i = 0; i < C; i++) s += x.d[t * C + i] * W.d[j * C + i];
            rlg[t * V + j] = s;
        }
    assert_int_equal(g_be->ops->lm_head_logits(g_be, lg, x.f, W.f, T, C, V), 0);
    t_cmp_f("lm_head_logits", lg, rlg, T * V, F32_TOL);
    /* target >= V is invalid; nothing is written */
    float *scr = malloc(6 * V * sizeof(float));
    tg[7] = (int32_t)V;
    loss32 = -1;
    assert_int_equal(g_be->ops->lm_head_ce(g_be, &loss32, &nv32, dx.f, x.f, W.f, tg, T, C, V, gs,
                                           scr, 6),
                     FT_E_INVALID);
    print_message("lm_head_ce target >= V -> \"%s\"\n", ft_errmsg());
    assert_true(loss32 == -1);
    tg[7] = 3;
    assert_int_equal(g_be->ops->lm_head_ce(g_be, &loss32, &nv32, dx.f, x.f, W.f, tg, T, C, V, gs,
                                           scr, 0),
                     FT_E_INVALID);
    p_free(&x), p_free(&W), p_free(&dx), free(rdx), free(lg), free(rlg), free(scr);
}

/* ---- AdamW -------------------------------------------------------------------------------- */

/* Two steps of torch.optim.AdamW on one parameter, by hand (lr 0.1, betas (0.9, 0.999),
 * eps 1e-8, weight_decay 0.01, p0 = 1, g = 0.5 then -0.25):
 * step 1: p = 1 * (1 - 0.001) = 0.999; m = 0.05; v = 0.00025; m^ = 0.05 / 0.1 = 0.5;
 *         sqrt(v^) = sqrt(0.00025 / 0.001) = 0.5; p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8)
 *         = 0.899000002
 * step 2: p = 0.899000002 * 0.999 = 0.898101001998; m = 0.045 - 0.025 = 0.02;
 *         v = 0.00024975 + 0.0000625 = 0.00031225; m^ = 0.02 / 0.19 = 0.1052631579;
 *         sqrt(v^) = sqrt(0.00031225 / 0.001999) = 0.3952254; p = 0.898101002 - 0.1 *
 *         0.1052631579 / 0.3952254 = 0.8714672987 */
static void test_adamw(void **state)
{
    (void)state;
    float p = 1, m = 0, v = 0, g = 0.5f;
    assert_int_equal(g_be->ops->adamw(g_be, &p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1), 0);
    print_message("adamw step 1: p %.9g (hand 0.899000002), m %.9g, v %.9g\n", p, m, v);
    assert_true(fabs(p - 0.899000002) <= FT_TOL_F32_ABS + FT_TOL_F32_REL * 0.899);
    assert_true(fabs(m - 0.05) <= FT_TOL_F32_REL * 0.05 && fabs(v - 0.00025) <= FT_TOL_F32_REL * 0.00025);
    g = -0.25f;
    assert_int_equal(g_be->ops->adamw(g_be, &p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2), 0);
    print_message("adamw step 2: p %.9g (hand 0.8714672987)\n", p);
    assert_true(fabs(p - 0.8714672987) <= FT_TOL_F32_ABS + FT_TOL_F32_REL * 0.87);
    assert_true(fabs(m - 0.02) <= FT_TOL_F32_REL * 0.02 && fabs(v - 0.00031225) <= FT_TOL_F32_REL * 0.00031225);

    /* many elements, a later step: fp32 vs fp64 instance */
    const int64_t n = 70001;
    pair pp = p_new(n, -1, 1), gg = p_new(n, -1, 1), mm = p_new(n, -0.1, 0.1), vv = p_new(n, 0, 0.01);
    assert_int_equal(g_be->ops->adamw(g_be, pp.f, gg.f, mm.f, vv.f, n, 2e-4f, 0.9f, 0.999f, 1e-8f,
                                      0.1f, 17),
                     0);
    assert_int_equal(ft_cpu_adamw_f64(pp.d, gg.d, mm.d, vv.d, n, (double)2e-4f, (double)0.9f,
                                      (double)0.999f, (double)1e-8f, (double)0.1f, 17),
                     0);
    t_cmp_f("adamw p", pp.f, pp.d, n, F32_TOL);
    t_cmp_f("adamw m", mm.f, mm.d, n, F32_TOL);
    t_cmp_f("adamw v", vv.f, vv.d, n, F32_TOL);
    assert_int_equal(g_be->ops->adamw(g_be, &p, &g, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 0),
                     FT_E_INVALID);
    p_free(&pp), p_free(&gg), p_free(&mm), p_free(&vv);
}

/* ---- the vectorizable expf of the fp32 instance ------------------------------------------ */

/* Cephes expf is ~2 ulp; allow 4 ulp (4 * FLT_EPSILON relative). */
#define TOL_EXPF_REL (4 * 1.1920929e-7)

static void test_expf(void **state)
{
    (void)state;
    double max_rel = 0;
    int64_t n = 0;
    for (double x = -87.0; x <= 88.0; x += 1.37e-4, n++) {
        float xf = (float)x;
        double ref = exp((double)xf), got = ft_cpu_expf(xf);
        double rel = fabs(got - ref) / ref;
        if (rel > max_rel) max_rel = rel;
    }
    print_message("ft_cpu_expf: max rel err %.2e over %lld points in [-87, 88]\n", max_rel,
                  (long long)n);
    assert_true(max_rel <= TOL_EXPF_REL);
    assert_true(ft_cpu_expf(0.0f) == 1.0f);
    assert_true(ft_cpu_expf(-INFINITY) == 0.0f);
    assert_true(ft_cpu_expf(-200.0f) == 0.0f);
    assert_true(isfinite(ft_cpu_expf(1000.0f)) && ft_cpu_expf(1000.0f) > 1e38f);
    assert_true(isnan(ft_cpu_expf(NAN)));
}

/* ---- results do not depend on the thread count ----------------------------------------------- */

static void test_thread_count_invariance(void **state)
{
    (void)state;
    const int64_t T = 300, H = 6, Hkv = 2, D = 32, C = 96, V = 500, F = 160;
    const int64_t lens[] = {150, 1, 149};
    int32_t *ss = t_seq_start(lens, 3, T), tg[300];
    for (int64_t t = 0; t < T; t++) tg[t] = t % 7 == 0 ? -100 : (int32_t)(t * 13 % V);
    pair q = p_new(T * H * D, -2, 2), k = p_new(T * Hkv * D, -2, 2), v = p_new(T * Hkv * D, -1, 1);
    pair x = p_new(T * C, -1, 1), W = p_new(V * C, -0.3, 0.3), Wf = p_new(F * C, -0.3, 0.3);
    float *res[2][7];
    double loss[2], ss2[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 2);
        float *o = malloc(T * H * D * 4), *l = malloc(T * H * 4), *dq = malloc(T * H * D * 4),
              *dk = malloc(T * Hkv * D * 4), *dv = malloc(T * Hkv * D * 4),
              *dx = malloc(T * C * 4), *y = malloc(T * F * 4), *scr = malloc(64 * V * 4);
        int64_t nv;
        assert_int_equal(g_be->ops->attention_fwd(g_be, o, l, q.f, k.f, v.f, ss, T, H, Hkv, D, 0.2f), 0);
        assert_int_equal(g_be->ops->attention_bwd(g_be, dq, dk, dv, q.f, q.f, k.f, v.f, o, l, ss, T,
                                                  H, Hkv, D, 0.2f),
                         0);
        assert_int_equal(g_be->ops->lm_head_ce(g_be, &loss[run], &nv, dx, x.f, W.f, tg, T, C, V,
                                               0.01f, scr, 64),
                         0);
        assert_int_equal(g_be->ops->gemm(g_be, 0, 1, T, F, C, 1, x.f, C, Wf.f, C, 0, y, F), 0);
        assert_int_equal(g_be->ops->sumsq(g_be, &ss2[run], y, T * F), 0);
        res[run][0] = o, res[run][1] = l, res[run][2] = dq, res[run][3] = dk, res[run][4] = dv;
        res[run][5] = dx, res[run][6] = y;
        free(scr);
    }
    omp_set_num_threads(omp_get_num_procs());
    const int64_t sizes[7] = {T * H * D, T * H, T * H * D, T * Hkv * D, T * Hkv * D, T * C, T * F};
    const char *names[7] = {"attention out", "lse", "dq", "dk", "dv", "lm_head_ce dx", "gemm"};
    for (int i = 0; i < 7; i++) {
        int same = memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0;
        print_message("1 vs 2 threads: %s %s\n", names[i], same ? "bit-identical" : "DIFFERENT");
        assert_true(same);
        free(res[0][i]), free(res[1][i]);
    }
    assert_true(loss[0] == loss[1]);
    assert_true(ss2[0] == ss2[1]);
    free(ss);
    p_free(&q), p_free(&k), p_free(&v), p_free(&x), p_free(&W), p_free(&Wf);
}

/* ---- microbenchmark (printed, never asserted) ---------------------------------------------- */

static void test_microbench(void **state)
{
    (void)state;
    /* one projection of a SmolLM2-135M MLP: x (256, 576) @ W^T, W (1536, 576) */
    const int64_t M = 256, N = 1536, K = 576;
    pair a = p_new(M * K, -1, 1), b = p_new(N * K, -1, 1), c = p_new(M * N, 0, 0);
    g_be->ops->gemm(g_be, 0, 1, M, N, K, 1, a.f, K, b.f, K, 0, c.f, N); /* warm-up */
    int reps = 20;
    double t0 = t_now();
    for (int r = 0; r < reps; r++) g_be->ops->gemm(g_be, 0, 1, M, N, K, 1, a.f, K, b.f, K, 0, c.f, N);
    double dt = (t_now() - t0) / reps;
    t0 = t_now();
    for (int r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1, a.f,
                    (int)K, b.f, (int)K, 0, c.f, (int)N);
    double d1 = (t_now() - t0) / reps;
    print_message("bench: sgemm m=%lld n=%lld k=%lld: gemm op (%d threads) %.3f ms, %.1f GFLOP/s; "
                  "one cblas_sgemm call (OpenBLAS %d thread) %.3f ms, %.1f GFLOP/s\n",
                  (long long)M, (long long)N, (long long)K, omp_get_max_threads(), dt * 1e3,
                  2.0 * M * N * K / dt * 1e-9, openblas_get_num_threads(), d1 * 1e3,
                  2.0 * M * N * K / d1 * 1e-9);

    const int64_t T = 256, H = 9, Hkv = 3, D = 64;
    pair q = p_new(T * H * D, -1, 1), k = p_new(T * Hkv * D, -1, 1), v = p_new(T * Hkv * D, -1, 1);
    pair o = p_new(T * H * D, 0, 0), l = p_new(T * H, 0, 0), dq = p_new(T * H * D, 0, 0),
         dk = p_new(T * Hkv * D, 0, 0), dv = p_new(T * Hkv * D, 0, 0);
    int64_t lens[1] = {T};
    int32_t *ss = t_seq_start(lens, 1, T);
    g_be->ops->attention_fwd(g_be, o.f, l.f, q.f, k.f, v.f, ss, T, H, Hkv, D, 0.125f);
    reps = 10;
    t0 = t_now();
    for (int r = 0; r < reps; r++)
        g_be->ops->attention_fwd(g_be, o.f, l.f, q.f, k.f, v.f, ss, T, H, Hkv, D, 0.125f);
    double tf = (t_now() - t0) / reps;
    t0 = t_now();
    for (int r = 0; r < reps; r++)
        g_be->ops->attention_bwd(g_be, dq.f, dk.f, dv.f, o.f, q.f, k.f, v.f, o.f, l.f, ss, T, H,
                                 Hkv, D, 0.125f);
    double tb = (t_now() - t0) / reps;
    double fl = 2.0 * 2.0 * (T * (T + 1) / 2) * H * D; /* QK^T and PV over the causal half */
    print_message("bench: attention_fwd T=%lld H=%lld Hkv=%lld D=%lld (one causal sequence, %d "
                  "threads): %.3f ms (%.1f GFLOP/s); attention_bwd %.3f ms\n",
                  (long long)T, (long long)H, (long long)Hkv, (long long)D,
                  omp_get_max_threads(), tf * 1e3, fl / tf * 1e-9, tb * 1e3);
    free(ss);
    p_free(&a), p_free(&b), p_free(&c), p_free(&q), p_free(&k), p_free(&v), p_free(&o), p_free(&l);
    p_free(&dq), p_free(&dk), p_free(&dv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),    cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_blas1),     cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),   cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),    cmocka_unit_test(test_attention),
        cmocka_unit_test(test_dropout),   cmocka_unit_test(test_noise_uniform_add),
        cmocka_unit_test(test_lm_head_ce),
        cmocka_unit_test(test_adamw),     cmocka_unit_test(test_expf),
        cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_microbench),
    };
    return cmocka_run_group_tests(tests, kernels_setup, kernels_teardown);
}
