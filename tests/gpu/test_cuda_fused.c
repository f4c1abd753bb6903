/* test_cuda_fused.c - the fused CUDA kernels of issue 34 against their CPU twins
 * (kernels/cpu/bf16_ops.c) on a GPU:
 *   - adamw_multi with FT_CUDA_FUSED_ADAMW (kernels/cuda/adamw_multi.cu): params and moments
 *     bit for bit the CPU's adamw on each segment (tolerance 0), 1, 7 and 1,300 segments (three
 *     launches), steps 1 and 9; without the option the op loops over the CUDA adamw: within
 *     1e-6 relative of the CPU (TOL_ADAMW_LOOP: its kernel contracts into FMA);
 *   - add_rmsnorm_bf16_fwd/bwd (kernels/cuda/bf16_ops.cu): bit for bit (the fixed-order row
 *     sums), T 1, 5, 2048 x C 64, 576, 4096, with and without the residual;
 *   - rope_qk_bf16 forward/inverse and swiglu_bf16_fwd/bwd: within 2^-8 relative of the twin per
 *     element plus 1e-5 (RoPE) / 1e-4 (SwiGLU) absolute (the device's double sin/cos and expf
 *     need not round as glibc's; TOL_* below).
 * Skipped without a GPU. Run by `make test-gpu`. */
#include "tests/unit/harness.h"
#include "tests/gpu/gpu_fixture.h"

#include <string.h>

#include "src/numeric/quant.h"

#define TOL_ADAMW_LOOP 1e-6 /* the CUDA adamw (FMA-contracted) against the CPU's, relative */
#define TOL_ADAMW_LOOP_ABS 1e-9 /* ... and absolute: a moment near 0 by cancellation (m ~ 1e-3) */
/* RoPE, SwiGLU against the twin: one bf16 rounding apart (relative 2^-8) where the device's sin,
 * cos or expf differ from glibc's by an fp32 ulp or two, plus an absolute part for results near
 * zero by cancellation (x0 cos - x1 sin; 1 + g (1 - s)): inputs up to 3 (RoPE) and |dh u| <= 8
 * with |g| <= 30 (SwiGLU) move such a result by at most ~4e-7 and ~3e-5 before rounding. */
#define TOL_REL 0x1p-8
#define TOL_ABS_ROPE 1e-5
#define TOL_ABS_SWIGLU 1e-4

static int setup(void **state) { return gpu_fixture_setup(state, 34, 1); }
static int teardown(void **state) { return gpu_fixture_teardown(state); }

static void *dev_up(fix *f, const void *h, size_t bytes)
{
    void *d = f->gpu->ops->alloc(f->gpu, bytes ? bytes : 16);
    assert_non_null(d);
    if (bytes && h) assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, bytes), 0);
    return d;
}

static void dev_down(fix *f, void *h, const void *d, size_t bytes)
{
    assert_int_equal(ft_backend_sync(f->gpu), 0);
    if (bytes) assert_int_equal(f->gpu->ops->copy(f->gpu, h, d, bytes), 0);
}

static uint16_t *brand(fix *f, int64_t n, float lo, float hi)
{
    uint16_t *v = malloc((size_t)(n ? n : 1) * 2);
    for (int64_t i = 0; i < n; i++) v[i] = ft_quant_f32_to_bf16(lo + (hi - lo) * ft_rng_uniform(&f->rng));
    return v;
}

/* |a - b| in units of the tolerance (rel * max(|a|, |b|) + abs); > 1 fails. */
static double off_by(uint16_t a, uint16_t b, double abs_tol)
{
    const double x = ft_quant_bf16_to_f32(a), y = ft_quant_bf16_to_f32(b);
    return fabs(x - y) / (TOL_REL * fmax(fabs(x), fabs(y)) + abs_tol);
}

static void adamw_case(fix *f, int n_seg, int max_n, int64_t step, int fused)
{
    ft_backend *g = f->gpu, *c = f->cpu;
    assert_int_equal(ft_backend_cuda_set_fused(g, fused ? FT_CUDA_FUSED_ADAMW : 0), 0);
    int64_t *sz = malloc(n_seg * sizeof *sz), total = 0;
    for (int k = 0; k < n_seg; k++) total += sz[k] = k % 11 == 3 ? 0 : 1 + (int64_t)(ft_rng_uniform(&f->rng) * max_n);
    float *h[4], *d[4];
    for (int a = 0; a < 4; a++) {
        h[a] = malloc((size_t)(total ? total : 1) * 4);
        for (int64_t i = 0; i < total; i++)
            h[a][i] = a == 0 ? ft_rng_uniform(&f->rng) * 2 - 1 : a == 1 ? (ft_rng_uniform(&f->rng) - 0.5f) * 0.02f
                    : a == 2 ? (step > 1 ? (ft_rng_uniform(&f->rng) - 0.5f) * 2e-3f : 0) : (step > 1 ? ft_rng_uniform(&f->rng) * 1e-5f : 0);
        d[a] = dev_up(f, h[a], (size_t)total * 4);
    }
    ft_adamw_seg *sg = malloc(n_seg * sizeof *sg), *sc = malloc(n_seg * sizeof *sc);
    for (int k = 0, off = 0; k < n_seg; off += (int)sz[k], k++) {
        const float lr = 1e-4f * (1 + k % 4);
        sg[k] = (ft_adamw_seg){d[0] + off, d[1] + off, d[2] + off, d[3] + off, sz[k], lr};
        sc[k] = (ft_adamw_seg){h[0] + off, h[1] + off, h[2] + off, h[3] + off, sz[k], lr};
    }
    assert_int_equal(g->ops->adamw_multi(g, sg, n_seg, 0.9f, 0.999f, 1e-8f, 0.01f, step), 0);
    assert_int_equal(c->ops->adamw_multi(c, sc, n_seg, 0.9f, 0.999f, 1e-8f, 0.01f, step), 0);
    float *got = malloc((size_t)(total ? total : 1) * 4);
    for (int a = 0; a < 4; a++) {
        if (a == 1) continue; /* the gradients are inputs */
        dev_down(f, got, d[a], (size_t)total * 4);
        if (fused) {
            assert_memory_equal(got, h[a], (size_t)total * 4);
        } else {
            for (int64_t i = 0; i < total; i++)
                assert_true(fabsf(got[i] - h[a][i]) <= TOL_ADAMW_LOOP * fabsf(h[a][i]) + TOL_ADAMW_LOOP_ABS);
        }
    }
    printf("adamw_multi: %d segments, %lld floats, step %lld, fused %d: %s\n", n_seg, (long long)total,
           (long long)step, fused, fused ? "bit for bit" : "within 1e-6");
    for (int a = 0; a < 4; a++) free(h[a]), g->ops->free(g, d[a]);
    free(got), free(sg), free(sc), free(sz);
    assert_int_equal(ft_backend_cuda_set_fused(g, 0), 0);
}

static void test_adamw_multi(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    adamw_case(f, 1, 100000, 1, 1);
    adamw_case(f, 7, 5000, 9, 1);
    adamw_case(f, 1300, 40, 3, 1);
    adamw_case(f, 7, 5000, 9, 0);
    assert_int_equal(ft_backend_cuda_set_fused(f->gpu, 0x80), FT_E_INVALID);
}

static void rms_case(fix *f, int64_t T, int64_t C, int with_res)
{
    ft_backend *g = f->gpu, *c = f->cpu;
    const size_t nb = (size_t)(T * C) * 2;
    uint16_t *x = brand(f, T * C, -2, 2), *res = brand(f, T * C, -3, 3), *dy = brand(f, T * C, -1, 1);
    uint16_t *dr = brand(f, T * C, -1, 1);
    float *w = malloc(C * 4), *rs_c = malloc(T * 4), *rs_g = malloc(T * 4);
    for (int64_t i = 0; i < C; i++) w[i] = 0.5f + ft_rng_uniform(&f->rng);
    uint16_t *hc = malloc(nb), *yc = malloc(nb), *oc = malloc(nb), *hg = malloc(nb), *yg = malloc(nb), *og = malloc(nb);
    assert_int_equal(c->ops->add_rmsnorm_bf16_fwd(c, hc, yc, rs_c, x, with_res ? res : NULL, w, T, C, 1e-5f), 0);
    assert_int_equal(c->ops->add_rmsnorm_bf16_bwd(c, oc, dy, with_res ? dr : NULL, hc, w, rs_c, T, C), 0);
    uint16_t *dx = dev_up(f, x, nb), *dres = dev_up(f, res, nb), *ddy = dev_up(f, dy, nb), *ddr = dev_up(f, dr, nb);
    uint16_t *dh = dev_up(f, NULL, nb), *dyo = dev_up(f, NULL, nb), *dout = dev_up(f, NULL, nb);
    float *dw = dev_up(f, w, C * 4), *drs = dev_up(f, NULL, T * 4);
    assert_int_equal(g->ops->add_rmsnorm_bf16_fwd(g, dh, dyo, drs, dx, with_res ? dres : NULL, dw, T, C, 1e-5f), 0);
    assert_int_equal(g->ops->add_rmsnorm_bf16_bwd(g, dout, ddy, with_res ? ddr : NULL, dh, dw, drs, T, C), 0);
    dev_down(f, hg, dh, nb);
    dev_down(f, yg, dyo, nb);
    dev_down(f, og, dout, nb);
    dev_down(f, rs_g, drs, T * 4);
    assert_memory_equal(hg, hc, nb);
    assert_memory_equal(rs_g, rs_c, T * 4);
    assert_memory_equal(yg, yc, nb);
    assert_memory_equal(og, oc, nb);
    void *bufs[] = {dx, dres, ddy, ddr, dh, dyo, dout, dw, drs};
    for (int i = 0; i < 9; i++) g->ops->free(g, bufs[i]);
    free(x), free(res), free(dy), free(dr), free(w), free(rs_c), free(rs_g);
    free(hc), free(yc), free(oc), free(hg), free(yg), free(og);
}

static void test_add_rmsnorm(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    static const int64_t Ts[] = {1, 5, 2048}, Cs[] = {64, 576, 4096};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int r = 0; r <= 1; r++) rms_case(f, Ts[i], Cs[j], r);
    printf("add_rmsnorm_bf16 fwd/bwd: 18 shapes bit for bit\n");
}

static void test_rope_swiglu(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    ft_backend *g = f->gpu, *c = f->cpu;
    const int64_t T = 300, H = 8, Hkv = 2, D = 128, nq = T * H * D, nk = T * Hkv * D;
    int32_t pos[300];
    float inv[64];
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(t * 13 % 4096);
    for (int64_t i = 0; i < D / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / D);
    double worst = 0;
    for (int inverse = 0; inverse <= 1; inverse++) {
        uint16_t *q = brand(f, nq, -3, 3), *k = brand(f, nk, -3, 3), *qg = malloc(nq * 2), *kg = malloc(nk * 2);
        uint16_t *dq = dev_up(f, q, nq * 2), *dk = dev_up(f, k, nk * 2);
        int32_t *dpos = dev_up(f, pos, sizeof pos);
        float *dinv = dev_up(f, inv, sizeof inv);
        assert_int_equal(g->ops->rope_qk_bf16(g, dq, dk, dpos, dinv, T, H, Hkv, D, inverse), 0);
        assert_int_equal(c->ops->rope_qk_bf16(c, q, k, pos, inv, T, H, Hkv, D, inverse), 0);
        dev_down(f, qg, dq, nq * 2);
        dev_down(f, kg, dk, nk * 2);
        for (int64_t i = 0; i < nq; i++) worst = fmax(worst, off_by(qg[i], q[i], TOL_ABS_ROPE));
        for (int64_t i = 0; i < nk; i++) worst = fmax(worst, off_by(kg[i], k[i], TOL_ABS_ROPE));
        void *bufs[] = {dq, dk, dpos, dinv};
        for (int i = 0; i < 4; i++) g->ops->free(g, bufs[i]);
        free(q), free(k), free(qg), free(kg);
    }
    printf("rope_qk_bf16: worst %.3g of the tolerance from the twin\n", worst);
    assert_true(worst <= 1);
    const int64_t n = 1 << 20;
    uint16_t *ga = brand(f, n, -30, 30), *u = brand(f, n, -4, 4), *dh = brand(f, n, -2, 2);
    uint16_t *hc = malloc(n * 2), *dgc = malloc(n * 2), *duc = malloc(n * 2), *out = malloc(n * 2);
    assert_int_equal(c->ops->swiglu_bf16_fwd(c, hc, ga, u, n), 0);
    assert_int_equal(c->ops->swiglu_bf16_bwd(c, dgc, duc, dh, ga, u, n), 0);
    uint16_t *dga = dev_up(f, ga, n * 2), *du = dev_up(f, u, n * 2), *ddh = dev_up(f, dh, n * 2);
    uint16_t *dhh = dev_up(f, NULL, n * 2), *ddg = dev_up(f, NULL, n * 2), *ddu = dev_up(f, NULL, n * 2);
    assert_int_equal(g->ops->swiglu_bf16_fwd(g, dhh, dga, du, n), 0);
    assert_int_equal(g->ops->swiglu_bf16_bwd(g, ddg, ddu, ddh, dga, du, n), 0);
    double w2 = 0;
    uint16_t *ref[] = {hc, dgc, duc}, *dv[] = {dhh, ddg, ddu};
    for (int o = 0; o < 3; o++) {
        dev_down(f, out, dv[o], n * 2);
        for (int64_t i = 0; i < n; i++) w2 = fmax(w2, off_by(out[i], ref[o][i], TOL_ABS_SWIGLU));
    }
    printf("swiglu_bf16 fwd/bwd: worst %.3g of the tolerance from the twin\n", w2);
    assert_true(w2 <= 1);
    void *bufs[] = {dga, du, ddh, dhh, ddg, ddu};
    for (int i = 0; i < 6; i++) g->ops->free(g, bufs[i]);
    free(ga), free(u), free(dh), free(hc), free(dgc), free(duc), free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_multi),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_rope_swiglu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
