/* test_bf16_ops.c - the CPU twins of the fused CUDA kernels (kernels/cpu/bf16_ops.c, the op
 * table's adamw_multi, add_rmsnorm_bf16_fwd/bwd, rope_qk_bf16, swiglu_bf16_fwd/bwd) on the CPU
 * and cpu-device backends, against the formulas (the CUDA kernels themselves are checked
 * against these twins by tests/emu/emu_adamw_multi.cc and emu_bf16_ops.cc, and on a GPU by
 * tests/gpu/test_cuda_fused.c):
 *   - adamw_multi: bit for bit adamw on each segment (tolerance 0; zero-length segments; each
 *     segment's own lr), the refusals (negative counts, NULL arrays, step 0);
 *   - add_rmsnorm_bf16: h is bf16(x + res) exactly; rstd within 1e-5 relative of fp64, y within
 *     2^-8 |ref| + 1e-6 (the bf16 rounding of the output); the backward within 2^-8 |ref| +
 *     1e-5 of fp64's dh = dres + r w dy - h r^3 mean(dy w h), and against central finite
 *     differences of the fp64 forward (loss = sum(y * dy)) within 1e-2 relative (so the
 *     formula itself is the gradient); C % 8 != 0 refused;
 *   - rope_qk_bf16: bit for bit the fp32 rope_fwd / rope_bwd of the widened values, rounded;
 *   - swiglu_bf16: within 1 bf16 ulp of the fp32 swiglu_fwd / swiglu_bwd rounded. */
#include "tests/unit/harness.h"

#include "kernels/cpu/bf16_ops.h"
#include "kernels/cpu/cpu_f32.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/numeric/quant.h"

static ft_rng rng;
static float ur(float lo, float hi) { return lo + (hi - lo) * ft_rng_uniform(&rng); }
static float bf(uint16_t b) { return ft_quant_bf16_to_f32(b); }
static uint16_t *brand(int64_t n, float lo, float hi)
{
    uint16_t *v = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) v[i] = ft_quant_f32_to_bf16(ur(lo, hi));
    return v;
}
static long ulps(uint16_t a, uint16_t b)
{
    const long ia = a & 0x8000 ? -(long)(a & 0x7fff) : (long)a, ib = b & 0x8000 ? -(long)(b & 0x7fff) : (long)b;
    return labs(ia - ib);
}

static void test_adamw_multi(void **state)
{
    (void)state;
    const char *devs[2] = {"cpu", "cpu-device"};
    for (int d = 0; d < 2; d++) {
        ft_backend *be;
        assert_int_equal(ft_backend_init(&be, devs[d], 1), 0);
        assert_non_null(be->ops->adamw_multi);
        enum { NS = 9 };
        int64_t sz[NS], total = 0;
        for (int k = 0; k < NS; k++) total += sz[k] = k == 4 ? 0 : 1 + k * 37;
        float *a[4], *b[4];
        for (int j = 0; j < 4; j++) {
            a[j] = malloc(total * 4), b[j] = malloc(total * 4);
            for (int64_t i = 0; i < total; i++) a[j][i] = j == 3 ? ur(0, 1e-4f) : ur(-1, 1) * (j ? 1e-2f : 1);
            memcpy(b[j], a[j], total * 4);
        }
        ft_adamw_seg seg[NS];
        for (int k = 0, off = 0; k < NS; off += (int)sz[k], k++)
            seg[k] = (ft_adamw_seg){a[0] + off, a[1] + off, a[2] + off, a[3] + off, sz[k], 1e-3f * (1 + k)};
        for (int64_t step = 1; step <= 3; step++) {
            assert_int_equal(be->ops->adamw_multi(be, seg, NS, 0.9f, 0.99f, 1e-8f, 0.1f, step), 0);
            for (int k = 0, off = 0; k < NS; off += (int)sz[k], k++)
                assert_int_equal(be->ops->adamw(be, b[0] + off, b[1] + off, b[2] + off, b[3] + off, sz[k],
                                                1e-3f * (1 + k), 0.9f, 0.99f, 1e-8f, 0.1f, step), 0);
            for (int j = 0; j < 4; j++) assert_memory_equal(a[j], b[j], total * 4);
        }
        /* a changed lr is seen: the first segment at another lr differs */
        float p0 = a[0][0];
        seg[0].lr = 0.5f;
        assert_int_equal(be->ops->adamw_multi(be, seg, 1, 0.9f, 0.99f, 1e-8f, 0.1f, 4), 0);
        assert_true(a[0][0] != p0);
        ft_adamw_seg bad = {NULL, NULL, NULL, NULL, 3, 1e-3f};
        assert_int_equal(be->ops->adamw_multi(be, &bad, 1, 0.9f, 0.99f, 1e-8f, 0, 1), FT_E_INVALID);
        assert_int_equal(be->ops->adamw_multi(be, seg, -1, 0.9f, 0.99f, 1e-8f, 0, 1), FT_E_INVALID);
        assert_int_equal(be->ops->adamw_multi(be, seg, NS, 0.9f, 0.99f, 1e-8f, 0, 0), FT_E_INVALID);
        for (int j = 0; j < 4; j++) free(a[j]), free(b[j]);
        ft_backend_free(be);
    }
}

/* fp64 forward of one row: y = h r w, h = bf16(x + res) (widened); returns sum(y * dy). */
static double rms_row64(const double *h, const float *w, const double *dy, int64_t C, double eps)
{
    double ss = 0, l = 0;
    for (int64_t c = 0; c < C; c++) ss += h[c] * h[c];
    const double r = 1 / sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; c++) l += h[c] * r * w[c] * dy[c];
    return l;
}

static void test_add_rmsnorm(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_init(&be, "cpu-device", 1), 0);
    static const int64_t Cs[] = {8, 264, 576};
    const int64_t T = 3;
    const float eps = 1e-5f;
    for (int ci = 0; ci < 3; ci++)
        for (int wr = 0; wr <= 1; wr++) {
            const int64_t C = Cs[ci], n = T * C;
            uint16_t *x = brand(n, -2, 2), *res = brand(n, -3, 3), *dy = brand(n, -1, 1), *dr = brand(n, -1, 1);
            uint16_t *h = malloc(n * 2), *y = malloc(n * 2), *o = malloc(n * 2);
            float *w = malloc(C * 4), rs[3];
            for (int64_t c = 0; c < C; c++) w[c] = ur(0.5f, 1.5f);
            assert_int_equal(be->ops->add_rmsnorm_bf16_fwd(be, h, y, rs, x, wr ? res : NULL, w, T, C, eps), 0);
            assert_int_equal(be->ops->add_rmsnorm_bf16_bwd(be, o, dy, wr ? dr : NULL, h, w, rs, T, C), 0);
            double *h64 = malloc(C * 8), *dy64 = malloc(C * 8);
            for (int64_t t = 0; t < T; t++) {
                double ss = 0, dot = 0;
                for (int64_t c = 0; c < C; c++) {
                    const int64_t i = t * C + c;
                    const uint16_t hb = wr ? ft_quant_f32_to_bf16(bf(x[i]) + bf(res[i])) : x[i];
                    assert_int_equal(h[i], hb);
                    h64[c] = bf(hb), dy64[c] = bf(dy[i]);
                    ss += h64[c] * h64[c];
                    dot += dy64[c] * w[c] * h64[c];
                }
                const double r = 1 / sqrt(ss / C + eps);
                assert_true(fabs(rs[t] - r) <= 1e-5 * r);
                for (int64_t c = 0; c < C; c++) {
                    const int64_t i = t * C + c;
                    const double ref = h64[c] * r * w[c];
                    assert_true(fabs(bf(y[i]) - ref) <= ldexp(fabs(ref), -8) + 1e-6);
                    const double g = r * w[c] * dy64[c] - h64[c] * r * r * r * dot / C;
                    const double dref = (wr ? (double)bf(dr[i]) : 0) + g;
                    assert_true(fabs(bf(o[i]) - dref) <= ldexp(fabs(dref), -8) + 1e-5);
                    if (c < 4) { /* the formula is the gradient: central differences in fp64 */
                        const double e = 1e-4, keep = h64[c];
                        h64[c] = keep + e;
                        const double lp = rms_row64(h64, w, dy64, C, eps);
                        h64[c] = keep - e;
                        const double lm = rms_row64(h64, w, dy64, C, eps);
                        h64[c] = keep;
                        const double fd = (lp - lm) / (2 * e);
                        assert_true(fabs(fd - g) <= 1e-2 * (fabs(g) + 1e-3));
                    }
                }
            }
            free(h64), free(dy64), free(x), free(res), free(dy), free(dr), free(h), free(y), free(o), free(w);
        }
    uint16_t b[24] = {0};
    float w[12] = {0}, r[2];
    assert_int_equal(be->ops->add_rmsnorm_bf16_fwd(be, b, b, r, b, NULL, w, 1, 12, eps), FT_E_INVALID);
    assert_int_equal(be->ops->add_rmsnorm_bf16_bwd(be, b, b, NULL, b, w, r, 1, 12), FT_E_INVALID);
    ft_backend_free(be);
}

static void test_rope_swiglu(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_init(&be, "cpu", 1), 0);
    const int64_t T = 9, H = 4, Hkv = 2, D = 64, nq = T * H * D, nk = T * Hkv * D;
    int32_t pos[9];
    float inv[32];
    for (int t = 0; t < T; t++) pos[t] = t * 911;
    for (int i = 0; i < D / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / D);
    for (int inverse = 0; inverse <= 1; inverse++) {
        uint16_t *q = brand(nq, -3, 3), *k = brand(nk, -3, 3);
        float *qf = malloc(nq * 4), *kf = malloc(nk * 4);
        for (int64_t i = 0; i < nq; i++) qf[i] = bf(q[i]);
        for (int64_t i = 0; i < nk; i++) kf[i] = bf(k[i]);
        assert_int_equal(be->ops->rope_qk_bf16(be, q, k, pos, inv, T, H, Hkv, D, inverse), 0);
        int (*rope)(ft_backend *, float *, const int32_t *, const float *, int64_t, int64_t, int64_t) =
            inverse ? be->ops->rope_bwd : be->ops->rope_fwd;
        assert_int_equal(rope(be, qf, pos, inv, T, H, D), 0);
        assert_int_equal(rope(be, kf, pos, inv, T, Hkv, D), 0);
        for (int64_t i = 0; i < nq; i++) assert_int_equal(q[i], ft_quant_f32_to_bf16(qf[i]));
        for (int64_t i = 0; i < nk; i++) assert_int_equal(k[i], ft_quant_f32_to_bf16(kf[i]));
        free(q), free(k), free(qf), free(kf);
    }
    assert_int_equal(be->ops->rope_qk_bf16(be, NULL, NULL, pos, inv, 1, 1, 1, 7, 0), FT_E_INVALID);
    const int64_t n = 5000;
    uint16_t *g = brand(n, -30, 30), *u = brand(n, -4, 4), *dh = brand(n, -2, 2);
    uint16_t *h = malloc(n * 2), *dg = malloc(n * 2), *du = malloc(n * 2);
    float *gf = malloc(n * 4), *uf = malloc(n * 4), *df = malloc(n * 4), *hf = malloc(n * 4), *dgf = malloc(n * 4),
          *duf = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) gf[i] = bf(g[i]), uf[i] = bf(u[i]), df[i] = bf(dh[i]);
    assert_int_equal(be->ops->swiglu_bf16_fwd(be, h, g, u, n), 0);
    assert_int_equal(be->ops->swiglu_bf16_bwd(be, dg, du, dh, g, u, n), 0);
    assert_int_equal(be->ops->swiglu_fwd(be, hf, gf, uf, n), 0);
    assert_int_equal(be->ops->swiglu_bwd(be, dgf, duf, df, gf, uf, n), 0);
    for (int64_t i = 0; i < n; i++) {
        assert_true(ulps(h[i], ft_quant_f32_to_bf16(hf[i])) <= 1);
        assert_true(ulps(dg[i], ft_quant_f32_to_bf16(dgf[i])) <= 1);
        assert_true(ulps(du[i], ft_quant_f32_to_bf16(duf[i])) <= 1);
    }
    assert_int_equal(be->ops->swiglu_bf16_fwd(be, h, g, u, -1), FT_E_INVALID);
    free(g), free(u), free(dh), free(h), free(dg), free(du), free(gf), free(uf), free(df), free(hf), free(dgf), free(duf);
    ft_backend_free(be);
}

int main(void)
{
    ft_rng_seed(&rng, 34);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_multi),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rope_swiglu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
