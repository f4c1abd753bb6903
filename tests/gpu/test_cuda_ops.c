/* test_cuda_ops.c - every CUDA op of the op table (except attention: test_cuda_attn.c)
 * against its CPU twin on random inputs over a sweep of shapes (dropout and the NEFTune noise
 * bit for bit), and one full training step (forward + backward through the executor) CUDA vs
 * CPU on a real tiny model: bf16 base, NF4 base, and NF4 base with a frozen correction (the
 * --quant-correction path, random A0/B0).
 * Skips cleanly when no GPU is visible (or ftune was built without CUDA).
 *
 * Tolerances are relative errors ||cuda - cpu|| / ||cpu|| over the whole output. */
#include "tests/unit/harness.h"
#include "tests/gpu/gpu_fixture.h"

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"

/* fp32 arithmetic in another order (reductions, fused multiply-add, expf vs Cephes). */
#define TOL_F32 1e-5
/* GEMMs with bf16 operands (8 significant bits, rel. rounding 2^-9 per operand) and fp32
 * accumulation: relative error of a k-term dot product of random data ~ 2^-9 / sqrt(3)
 * per product, averaging down; 1e-2 is the METHOD.md band for bf16 operands. */
#define TOL_BF16_GEMM 1e-2
/* The same GEMMs in full fp32 (set precise): cuBLAS vs OpenBLAS summation order. */
#define TOL_F32_GEMM 1e-5
/* A whole training step with bf16 GEMMs: loss and LoRA gradients. */
#define TOL_STEP_LOSS 2e-3
/* An output whose reference is 0 up to rounding (dq when every query sees only itself) is
 * judged by the RMS of the difference when the reference's RMS is below TOL_ZERO_REF. */
#define TOL_ZERO_REF 1e-4
#define TOL_ZERO_RMS 1e-6
#define TOL_STEP_GRAD 3e-2

static int setup(void **state) { return gpu_fixture_setup(state, 1234, 1); }
static int teardown(void **state) { return gpu_fixture_teardown(state); }

static float *rnd(fix *f, int64_t n, float lo, float hi)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * ft_rng_uniform(&f->rng);
    return x;
}

/* Device copy of host data. */
static void *up(fix *f, const void *h, size_t bytes)
{
    void *d = f->gpu->ops->alloc(f->gpu, bytes ? bytes : 1);
    assert_non_null(d);
    if (bytes) assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, bytes), 0);
    return d;
}

/* Device buffer filled with NaN (0xff bytes), so unwritten outputs fail. */
static float *poisoned(fix *f, int64_t n)
{
    float *d = f->gpu->ops->alloc(f->gpu, (size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(d);
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    memset(h, 0xff, (size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, (size_t)n * sizeof(float)), 0);
    free(h);
    return d;
}

static float *down(fix *f, const float *d, int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(f->gpu->ops->copy(f->gpu, h, d, (size_t)n * sizeof(float)), 0);
    return h;
}

/* ||a - b|| / ||b|| (NaN anywhere -> inf). */
static double relerr(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check(const char *what, const float *gpu_d, const float *cpu_h, int64_t n, double tol,
                  fix *f)
{
    float *g = down(f, gpu_d, n);
    double e = relerr(g, cpu_h, n);
    printf("  %-40s n=%-9lld rel err %.3g (tol %.0e)\n", what, (long long)n, e, tol);
    free(g);
    assert_true(e <= tol);
}

static void test_gemm(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 576, 576}, {300, 1536, 576},
                                 {257, 192, 1000}, {2048, 256, 512}};
    for (int precise = 0; precise <= 1; precise++) {
        assert_int_equal(ft_backend_cuda_set_precise(f->gpu, precise), 0);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int ta = 0; ta <= 1; ta++)
                for (int tb = 0; tb <= 1; tb++) {
                    int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                    float *a = rnd(f, m * k, -1, 1), *b = rnd(f, k * n, -1, 1), *c = rnd(f, m * n, -1, 1);
                    int64_t lda = ta ? m : k, ldb = tb ? k : n;
                    float *da = up(f, a, m * k * 4), *db = up(f, b, k * n * 4), *dc = up(f, c, m * n * 4);
                    assert_int_equal(f->cpu->ops->gemm(f->cpu, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c, n), 0);
                    assert_int_equal(f->gpu->ops->gemm(f->gpu, ta, tb, m, n, k, 0.5f, da, lda, db, ldb, 0.25f, dc, n), 0);
                    char what[96];
                    snprintf(what, sizeof what, "gemm %s %lldx%lldx%lld ta%d tb%d",
                             precise ? "fp32" : "bf16", (long long)m, (long long)n, (long long)k, ta, tb);
                    check(what, dc, c, m * n, precise ? TOL_F32_GEMM : TOL_BF16_GEMM, f);
                    f->gpu->ops->free(f->gpu, da);
                    f->gpu->ops->free(f->gpu, db);
                    f->gpu->ops->free(f->gpu, dc);
                    free(a);
                    free(b);
                    free(c);
                }
    }
    assert_int_equal(ft_backend_cuda_set_precise(f->gpu, 0), 0);
}

/* linear_fwd / linear_bwd_x with bf16 weights against the CPU on the same bf16-rounded
 * operands (so only the summation order differs), and with fp32 weights. */
static void test_linear(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int64_t shapes[][3] = {{1, 8, 8}, {37, 576, 192}, {300, 1536, 576}, {2048, 1024, 4096}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t T = shapes[s][0], out = shapes[s][1], in = shapes[s][2];
        float *x = rnd(f, T * in, -1, 1), *W = rnd(f, out * in, -0.1f, 0.1f), *dy = rnd(f, T * out, -1, 1);
        float *y0 = rnd(f, T * out, -1, 1), *dx0 = rnd(f, T * in, -1, 1);
        uint16_t *Wb = malloc(out * in * 2);
        float *Wr = malloc(out * in * 4), *xr = malloc(T * in * 4), *dyr = malloc(T * out * 4);
        for (int64_t i = 0; i < out * in; i++) Wr[i] = ft_quant_bf16_to_f32(Wb[i] = ft_quant_f32_to_bf16(W[i]));
        for (int64_t i = 0; i < T * in; i++) xr[i] = ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(x[i]));
        for (int64_t i = 0; i < T * out; i++) dyr[i] = ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(dy[i]));
        float *y = malloc(T * out * 4), *dxc = malloc(T * in * 4);
        memcpy(y, y0, T * out * 4);
        memcpy(dxc, dx0, T * in * 4);
        assert_int_equal(f->cpu->ops->linear_fwd(f->cpu, y, xr, Wr, FT_WTYPE_F32, T, out, in, 0.5f, NULL), 0);
        assert_int_equal(f->cpu->ops->linear_bwd_x(f->cpu, dxc, dyr, Wr, FT_WTYPE_F32, T, out, in, 1.0f, NULL), 0);
        int64_t wide = out > in ? out : in;
        float *dx_ = up(f, x, T * in * 4), *dW = up(f, Wb, out * in * 2), *ddy = up(f, dy, T * out * 4);
        float *dyo = up(f, y0, T * out * 4), *ddx = up(f, dx0, T * in * 4), *scr = poisoned(f, T * wide);
        assert_int_equal(f->gpu->ops->linear_fwd(f->gpu, dyo, dx_, dW, FT_WTYPE_BF16, T, out, in, 0.5f, scr), 0);
        assert_int_equal(f->gpu->ops->linear_bwd_x(f->gpu, ddx, ddy, dW, FT_WTYPE_BF16, T, out, in, 1.0f, scr), 0);
        char what[96];
        snprintf(what, sizeof what, "linear_fwd bf16 W %lldx%lldx%lld", (long long)T, (long long)out, (long long)in);
        check(what, dyo, y, T * out, TOL_F32_GEMM * 10, f);
        snprintf(what, sizeof what, "linear_bwd_x bf16 W %lldx%lldx%lld", (long long)T, (long long)out, (long long)in);
        check(what, ddx, dxc, T * in, TOL_F32_GEMM * 10, f);
        void *bufs[] = {dx_, dW, ddy, dyo, ddx, scr};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
        free(x); free(W); free(dy); free(y0); free(dx0); free(Wb); free(Wr); free(xr); free(dyr);
        free(y); free(dxc);
    }
    /* an unknown weight type is refused */
    assert_int_equal(f->gpu->ops->linear_fwd(f->gpu, NULL, NULL, NULL, 7, 1, 1, 1, 0.0f, NULL), FT_E_UNSUPPORTED);
}

/* dequant_nf4 against the CPU's ft_nf4_dequant rounded to bf16: bit-identical, nested
 * (double quantization) and plain absmax, sizes that end in a partial block. */
static void test_nf4(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    float map[256];
    ft_nf4_dynamic_map(map);
    const int64_t ns[] = {64, 1000, 4096 * 14 + 33, 1 << 22};
    for (int nested = 0; nested <= 1; nested++)
        for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
            int64_t n = ns[s];
            ft_nf4_layout l;
            assert_int_equal(ft_nf4_layout_init(&l, n, 64, nested ? 256 : 0), 0);
            float *x = rnd(f, n, -0.05f, 0.05f), *am = malloc(l.n_blocks * 4), *ref = malloc(n * 4);
            uint8_t *codes = malloc(l.code_bytes), *qam = malloc(l.n_blocks);
            float *nam = malloc((l.n_nested + 1) * 4), off = 0;
            assert_int_equal(ft_nf4_quantize(x, &l, map, codes, nested ? qam : NULL, nam, &off, am), 0);
            ft_nf4_view v = {l, codes, nested ? qam : NULL, nested ? NULL : am, nested ? nam : NULL,
                             nested ? map : NULL, ft_nf4_code, off};
            assert_int_equal(ft_nf4_dequant(&v, ref), 0);
            uint8_t *dcodes = up(f, codes, l.code_bytes), *dqam = up(f, qam, l.n_blocks);
            float *dam = up(f, am, l.n_blocks * 4), *dnam = up(f, nam, (l.n_nested + 1) * 4);
            float *dmap = up(f, map, 256 * 4), *dcode = up(f, ft_nf4_code, 16 * 4);
            uint16_t *dout = (uint16_t *)poisoned(f, (n + 1) / 2);
            ft_nf4_tensor t = {n, 64, nested ? 256 : 0, dcodes, nested ? dqam : NULL,
                               nested ? NULL : dam, nested ? dnam : NULL, nested ? dmap : NULL,
                               dcode, off};
            assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, dout, &t), 0);
            uint16_t *got = malloc(n * 2);
            assert_int_equal(f->gpu->ops->copy(f->gpu, got, dout, n * 2), 0);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) bad += got[i] != ft_quant_f32_to_bf16(ref[i]);
            printf("  dequant_nf4 %s n=%lld: %lld of %lld bf16 values differ from the CPU's\n",
                   nested ? "nested" : "plain", (long long)n, (long long)bad, (long long)n);
            assert_int_equal(bad, 0);
            void *bufs[] = {dcodes, dqam, dam, dnam, dmap, dcode, dout};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
            free(x); free(am); free(ref); free(codes); free(qam); free(nam); free(got);
        }
}

static void test_elementwise(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int64_t ns[] = {1, 1000, 1 << 20, 3000001};
    for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
        int64_t n = ns[s];
        float *x = rnd(f, n, -4, 4), *y = rnd(f, n, -4, 4), *g = rnd(f, n, -1, 1);
        float *dx = up(f, x, n * 4), *dy = up(f, y, n * 4), *dg = up(f, g, n * 4);
        /* axpy, scale */
        float *yc = malloc(n * 4);
        memcpy(yc, y, n * 4);
        f->cpu->ops->axpy(f->cpu, 0.3f, x, yc, n);
        float *dyc = up(f, y, n * 4);
        assert_int_equal(f->gpu->ops->axpy(f->gpu, 0.3f, dx, dyc, n), 0);
        check("axpy", dyc, yc, n, TOL_F32, f);
        f->cpu->ops->scale(f->cpu, yc, -1.7f, n);
        assert_int_equal(f->gpu->ops->scale(f->gpu, dyc, -1.7f, n), 0);
        check("scale", dyc, yc, n, TOL_F32, f);
        /* sumsq */
        double s_cpu, s_gpu;
        f->cpu->ops->sumsq(f->cpu, &s_cpu, x, n);
        assert_int_equal(f->gpu->ops->sumsq(f->gpu, &s_gpu, dx, n), 0);
        printf("  sumsq n=%lld rel err %.3g\n", (long long)n, fabs(s_gpu - s_cpu) / s_cpu);
        assert_true(fabs(s_gpu - s_cpu) <= 1e-12 * s_cpu);
        /* swiglu fwd / bwd */
        float *h = malloc(n * 4), *dgc = malloc(n * 4), *duc = malloc(n * 4);
        f->cpu->ops->swiglu_fwd(f->cpu, h, x, y, n);
        float *dh = poisoned(f, n);
        assert_int_equal(f->gpu->ops->swiglu_fwd(f->gpu, dh, dx, dy, n), 0);
        check("swiglu_fwd", dh, h, n, TOL_F32, f);
        f->cpu->ops->swiglu_bwd(f->cpu, dgc, duc, g, x, y, n);
        float *ddg = poisoned(f, n), *ddu = poisoned(f, n);
        assert_int_equal(f->gpu->ops->swiglu_bwd(f->gpu, ddg, ddu, dg, dx, dy, n), 0);
        check("swiglu_bwd dgate", ddg, dgc, n, TOL_F32, f);
        check("swiglu_bwd dup", ddu, duc, n, TOL_F32, f);
        /* dropout: the same mask on both (exact up to the 1/(1-p) product) */
        f->cpu->ops->dropout(f->cpu, h, x, n, 0.1f, 77);
        assert_int_equal(f->gpu->ops->dropout(f->gpu, dh, dx, n, 0.1f, 77), 0);
        check("dropout p=0.1", dh, h, n, 0.0, f);
        /* NEFTune noise: the same draws and fp32 roundings (no FMA), so the same bits */
        {
            float *hn = malloc(n * 4);
            memcpy(hn, x, n * 4);
            assert_int_equal(f->cpu->ops->noise_uniform_add(f->cpu, hn, n, 0.37f, 4242), 0);
            float *dn = up(f, x, n * 4);
            assert_int_equal(f->gpu->ops->noise_uniform_add(f->gpu, dn, n, 0.37f, 4242), 0);
            float *gn = down(f, dn, n);
            int64_t bad = 0, moved = 0;
            for (int64_t i = 0; i < n; i++) {
                if (memcmp(&gn[i], &hn[i], 4)) {
                    if (bad < 5)
                        printf("  noise_uniform_add [%lld]: cuda %.9g, cpu %.9g\n", (long long)i,
                               (double)gn[i], (double)hn[i]);
                    bad++;
                }
                moved += hn[i] != x[i];
            }
            printf("  %-40s n=%-9lld %lld values differ from the CPU's bits\n", "noise_uniform_add",
                   (long long)n, (long long)bad);
            assert_int_equal(bad, 0);
            assert_true(moved > 0);
            /* n = 0 and mag = 0 do nothing; a negative mag is refused */
            assert_int_equal(f->gpu->ops->noise_uniform_add(f->gpu, dn, 0, 0.37f, 1), 0);
            assert_int_equal(f->gpu->ops->noise_uniform_add(f->gpu, dn, n, 0.0f, 1), 0);
            assert_int_equal(f->gpu->ops->noise_uniform_add(f->gpu, dn, n, -1.0f, 1), FT_E_INVALID);
            float *gn2 = down(f, dn, n);
            assert_memory_equal(gn2, gn, n * 4);
            f->gpu->ops->free(f->gpu, dn);
            free(hn), free(gn), free(gn2);
        }
        /* adamw */
        float *p = rnd(f, n, -1, 1), *m = rnd(f, n, -0.1f, 0.1f), *v = rnd(f, n, 0, 0.01f);
        float *dp = up(f, p, n * 4), *dm = up(f, m, n * 4), *dv = up(f, v, n * 4);
        f->cpu->ops->adamw(f->cpu, p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3);
        assert_int_equal(f->gpu->ops->adamw(f->gpu, dp, dg, dm, dv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3), 0);
        check("adamw p", dp, p, n, TOL_F32, f);
        check("adamw m", dm, m, n, TOL_F32, f);
        check("adamw v", dv, v, n, TOL_F32, f);
        void *bufs[] = {dx, dy, dg, dyc, dh, ddg, ddu, dp, dm, dv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
        free(x); free(y); free(g); free(yc); free(h); free(dgc); free(duc); free(p); free(m); free(v);
    }
}

static void test_rows(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    /* (T, C) for rmsnorm / bias / embedding; (T, H, D) for rope (D <= 1024: the kernel's
     * limit, and inv[] below holds D/2 <= 512) */
    /* C <= 1024 takes the warp-per-row kernels (the per-head q/k norms: T*H rows of D) */
    const int64_t shapes[][4] = {{1, 64, 1, 64}, {37, 576, 9, 64}, {512, 4096, 32, 128},
                                 {300, 1000, 5, 128}, {4099, 128, 4, 32}, {9, 1024, 8, 128},
                                 {5, 1026, 2, 512}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t T = shapes[s][0], C = shapes[s][1], H = shapes[s][2], D = shapes[s][3], V = 1000;
        float *x = rnd(f, T * C, -2, 2), *w = rnd(f, C, 0.5f, 1.5f), *dy = rnd(f, T * C, -1, 1);
        float *dxx = up(f, x, T * C * 4), *dw = up(f, w, C * 4), *ddy = up(f, dy, T * C * 4);
        float *y = malloc(T * C * 4), *r = malloc(T * 4);
        f->cpu->ops->rmsnorm_fwd(f->cpu, y, r, x, w, T, C, 1e-5f);
        float *dyo = poisoned(f, T * C), *dr = poisoned(f, T);
        assert_int_equal(f->gpu->ops->rmsnorm_fwd(f->gpu, dyo, dr, dxx, dw, T, C, 1e-5f), 0);
        check("rmsnorm_fwd y", dyo, y, T * C, TOL_F32, f);
        check("rmsnorm_fwd rstd", dr, r, T, TOL_F32, f);
        float *gx = rnd(f, T * C, -1, 1);
        float *dgx = up(f, gx, T * C * 4);
        f->cpu->ops->rmsnorm_bwd(f->cpu, gx, dy, x, w, r, T, C);
        assert_int_equal(f->gpu->ops->rmsnorm_bwd(f->gpu, dgx, ddy, dxx, dw, dr, T, C), 0);
        check("rmsnorm_bwd (accumulating)", dgx, gx, T * C, TOL_F32, f);
        /* bias_add */
        float *yb = malloc(T * C * 4);
        memcpy(yb, x, T * C * 4);
        f->cpu->ops->bias_add(f->cpu, yb, w, T, C);
        float *dyb = up(f, x, T * C * 4);
        assert_int_equal(f->gpu->ops->bias_add(f->gpu, dyb, dw, T, C), 0);
        check("bias_add", dyb, yb, T * C, TOL_F32, f);
        /* embedding */
        int32_t *ids = malloc(T * 4);
        for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)(ft_rng_uniform(&f->rng) * V) % V;
        float *table = rnd(f, V * C, -1, 1);
        float *dtable = up(f, table, V * C * 4);
        int32_t *dids = up(f, ids, T * 4);
        f->cpu->ops->embedding_fwd(f->cpu, y, ids, table, T, C, V);
        float *de = poisoned(f, T * C);
        assert_int_equal(f->gpu->ops->embedding_fwd(f->gpu, de, dids, dtable, T, C, V), 0);
        check("embedding_fwd", de, y, T * C, 0.0, f);
        ids[T / 2] = (int32_t)V; /* out of range: an error naming the index, not a crash */
        f->gpu->ops->copy(f->gpu, dids, ids, T * 4);
        assert_int_equal(f->gpu->ops->embedding_fwd(f->gpu, de, dids, dtable, T, C, V), FT_E_INVALID);
        printf("  embedding bad id: %s\n", ft_errmsg());
        /* rope fwd / bwd (x reinterpreted as (T, H, D) over the first T*H*D floats) */
        int64_t n = T * H * D;
        float *q = rnd(f, n, -1, 1);
        int32_t *pos = malloc(T * 4);
        for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)((t * 37) % 8000);
        float inv[512];
        for (int64_t i = 0; i < D / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / D);
        float *dq = up(f, q, n * 4), *dinv = up(f, inv, D / 2 * 4);
        int32_t *dpos = up(f, pos, T * 4);
        f->cpu->ops->rope_fwd(f->cpu, q, pos, inv, T, H, D);
        assert_int_equal(f->gpu->ops->rope_fwd(f->gpu, dq, dpos, dinv, T, H, D), 0);
        check("rope_fwd", dq, q, n, TOL_F32, f);
        f->cpu->ops->rope_bwd(f->cpu, q, pos, inv, T, H, D);
        assert_int_equal(f->gpu->ops->rope_bwd(f->gpu, dq, dpos, dinv, T, H, D), 0);
        check("rope_bwd", dq, q, n, TOL_F32, f);
        void *bufs[] = {dxx, dw, ddy, dyo, dr, dgx, dyb, dtable, dids, de, dq, dinv, dpos};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
        free(x); free(w); free(dy); free(y); free(r); free(gx); free(yb); free(ids); free(table);
        free(q); free(pos);
    }
}

/* attention_fwd / attention_bwd against the CPU twin: packed rows (several sequences, one
 * long one), GQA, D 64 and 128, fp32 GEMMs (precise) and bf16 GEMMs. */
static void test_attention(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    /* (T = 1 is left out: one key per query makes dq exactly 0, a relative error of noise) */
    const int64_t shapes[][4] = {{2, 4, 4, 64}, {17, 4, 4, 64}, {300, 8, 2, 64}, {1024, 32, 8, 128},
                                 {2100, 8, 2, 128}};
    for (int precise = 1; precise >= 0; precise--) {
        ft_backend_cuda_set_precise(f->gpu, precise);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t T = shapes[s][0], H = shapes[s][1], Hkv = shapes[s][2], D = shapes[s][3];
            int64_t nq = T * H * D, nk = T * Hkv * D;
            int32_t *ss = malloc(T * 4);
            /* sequences of varying length (1 .. 700 tokens), the last one long */
            int64_t start = 0, len = 1 + (int64_t)(ft_rng_uniform(&f->rng) * 40);
            for (int64_t t = 0; t < T; t++) {
                if (t - start >= len && t < T - T / 3) {
                    start = t;
                    len = 1 + (int64_t)(ft_rng_uniform(&f->rng) * 700);
                }
                ss[t] = (int32_t)start;
            }
            float *q = rnd(f, nq, -1, 1), *k = rnd(f, nk, -1, 1), *v = rnd(f, nk, -1, 1), *dout = rnd(f, nq, -1, 1);
            float *o = malloc(nq * 4), *lse = malloc(T * H * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
            float sc = 1.0f / sqrtf((float)D);
            assert_int_equal(f->cpu->ops->attention_fwd(f->cpu, o, lse, q, k, v, ss, T, H, Hkv, D, sc), 0);
            assert_int_equal(f->cpu->ops->attention_bwd(f->cpu, dq, dk, dv, dout, q, k, v, o, lse, ss, T, H, Hkv, D, sc), 0);
            float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4), *gdo = up(f, dout, nq * 4);
            int32_t *gss = up(f, ss, T * 4);
            float *go = poisoned(f, nq), *glse = poisoned(f, T * H), *gdq = poisoned(f, nq), *gdk = poisoned(f, nk), *gdv = poisoned(f, nk);
            assert_int_equal(f->gpu->ops->attention_fwd(f->gpu, go, glse, gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
            assert_int_equal(f->gpu->ops->attention_bwd(f->gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, glse, gss, T, H, Hkv, D, sc), 0);
            double tol = precise ? 1e-5 : TOL_BF16_GEMM;
            char what[96];
            const char *nm[5] = {"out", "lse", "dq", "dk", "dv"};
            float *gp[5] = {go, glse, gdq, gdk, gdv}, *cp[5] = {o, lse, dq, dk, dv};
            int64_t nn[5] = {nq, T * H, nq, nk, nk};
            for (int i = 0; i < 5; i++) {
                snprintf(what, sizeof what, "attention %s %s T=%lld H=%lld/%lld D=%lld", precise ? "fp32" : "bf16",
                         nm[i], (long long)T, (long long)H, (long long)Hkv, (long long)D);
                double rms = 0;
                for (int64_t j = 0; j < nn[i]; j++) rms += (double)cp[i][j] * cp[i][j];
                rms = sqrt(rms / (double)nn[i]);
                if (rms < TOL_ZERO_REF) { /* dq, dk of queries that see only themselves are 0 */
                    float *g = down(f, gp[i], nn[i]);
                    double d = 0;
                    for (int64_t j = 0; j < nn[i]; j++) d += ((double)g[j] - cp[i][j]) * ((double)g[j] - cp[i][j]);
                    d = sqrt(d / (double)nn[i]);
                    printf("  %-40s reference ~0 (rms %.2g): rms diff %.3g (tol %.0e)\n", what, rms, d, TOL_ZERO_RMS);
                    free(g);
                    assert_true(d <= TOL_ZERO_RMS);
                    continue;
                }
                check(what, gp[i], cp[i], nn[i], tol, f);
            }
            void *bufs[] = {gq, gk, gv, gdo, gss, go, glse, gdq, gdk, gdv};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
            free(ss); free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv);
        }
    }
    ft_backend_cuda_set_precise(f->gpu, 0);
}

static void test_lm_head(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int64_t shapes[][3] = {{5, 64, 100}, {300, 576, 4999}, {1100, 256, 32000}};
    for (int precise = 0; precise <= 1; precise++) {
        ft_backend_cuda_set_precise(f->gpu, precise);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t T = shapes[s][0], C = shapes[s][1], V = shapes[s][2], chunk = 256;
            float *x = rnd(f, T * C, -1, 1), *W = rnd(f, V * C, -0.2f, 0.2f);
            int32_t *tg = malloc(T * 4);
            for (int64_t t = 0; t < T; t++)
                tg[t] = ft_rng_uniform(&f->rng) < 0.2f ? -100 : (int32_t)(ft_rng_uniform(&f->rng) * V) % V;
            float *dxc = malloc(T * C * 4), *scr = malloc(chunk * V * 4);
            double lc, lg;
            int64_t nc, ng;
            assert_int_equal(f->cpu->ops->lm_head_ce(f->cpu, &lc, &nc, dxc, x, W, tg, T, C, V, 0.01f, scr, 64), 0);
            float *dx = up(f, x, T * C * 4), *dW = up(f, W, V * C * 4), *ddx = poisoned(f, T * C);
            float *dscr = poisoned(f, chunk * V);
            int32_t *dtg = up(f, tg, T * 4);
            assert_int_equal(f->gpu->ops->lm_head_ce(f->gpu, &lg, &ng, ddx, dx, dW, dtg, T, C, V, 0.01f, dscr, chunk), 0);
            printf("  lm_head_ce %s T=%lld C=%lld V=%lld: loss %.6f vs %.6f (rel %.2g), n %lld/%lld\n",
                   precise ? "fp32" : "bf16", (long long)T, (long long)C, (long long)V, lg, lc,
                   fabs(lg - lc) / lc, (long long)ng, (long long)nc);
            assert_int_equal(ng, nc);
            assert_true(fabs(lg - lc) <= (precise ? 1e-5 : 2e-3) * fabs(lc));
            check("lm_head_ce dx", ddx, dxc, T * C, precise ? TOL_F32_GEMM * 10 : TOL_BF16_GEMM, f);
            tg[T - 1] = (int32_t)V;
            f->gpu->ops->copy(f->gpu, dtg, tg, T * 4);
            assert_int_equal(f->gpu->ops->lm_head_ce(f->gpu, &lg, &ng, ddx, dx, dW, dtg, T, C, V, 0.01f, dscr, chunk), FT_E_INVALID);
            void *bufs[] = {dx, dW, ddx, dscr, dtg};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
            free(x); free(W); free(tg); free(dxc); free(scr);
        }
    }
    ft_backend_cuda_set_precise(f->gpu, 0);
}

/* One optimizer step's forward + backward through the executor on the tiny real model
 * (tests/fixtures/tiny-llama), CUDA vs CPU, same adapter, same packed batch. */
#define TINY "tests/fixtures/tiny-llama"

/* One optimizer step of n_mb micro-batches on be (pack: the NF4 base, else the model's
 * weights); corr: with a frozen correction of the base (adapters/qcorr.h: random A0/B0, the
 * path --quant-correction adds). */
static void step_on(ft_backend *be, const ft_model *m, const ft_batch *b, int64_t n_mb,
                    double *loss, float *grads, int64_t *n_params, ft_pack_file *pack, int corr)
{
    ft_lora lora;
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
    ft_rng rng;
    ft_rng_seed(&rng, 99);
    for (int64_t i = 0; i < lora.n_params; i++) lora.host[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.2f;
    assert_int_equal(ft_lora_push(&lora), 0);
    if (corr) {
        float *fixed = malloc((size_t)lora.n_params * 4);
        for (int64_t i = 0; i < lora.n_params; i++) fixed[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.2f;
        assert_int_equal(ft_lora_set_fixed(&lora, fixed), 0);
        free(fixed);
    }
    ft_exec e;
    assert_int_equal(ft_exec_init_ex(&e, be, m, &lora, b[0].T, n_mb, b[0].seq_len, pack == NULL), 0);
    if (pack) assert_int_equal(ft_exec_use_pack(&e, pack), 0);
    int64_t ntok = 0;
    for (int64_t i = 0; i < n_mb; i++)
        for (int64_t t = 0; t < b[i].T; t++) ntok += b[i].targets[t] >= 0;
    int64_t nt;
    assert_int_equal(ft_exec_train_step(&e, b, n_mb, ntok, 0, loss, &nt), 0);
    assert_int_equal(be->ops->copy(be, grads, lora.grads, (size_t)lora.n_params * 4), 0);
    *n_params = lora.n_params;
    ft_exec_free(&e);
    ft_lora_free(&lora);
}

/* nf4: 0 bf16 base, 1 NF4 pack, 2 NF4 + frozen correction; qwen3: the tiny Qwen3
 * (t_tiny_model("--qwen3"): per-head q/k norms, H*D != hidden) instead of tiny-llama. */
static void train_step_cmp(void **state, int nf4, int qwen3)
{
    fix *f = *state;
    NEED_GPU(f);
    char *mdir = qwen3 ? t_tiny_model("--qwen3") : NULL;
    const char *model = qwen3 ? mdir : TINY;
    if (qwen3) assert_non_null(mdir);
    ft_model *m;
    assert_int_equal(ft_model_load(&m, model), 0);
    const int64_t rows = 2, S = 64, n_mb = 2;
    ft_batch b[2];
    for (int64_t i = 0; i < n_mb; i++) {
        ft_batch *x = &b[i];
        *x = (ft_batch){rows, S, rows * S};
        x->ids = malloc(x->T * 4);
        x->targets = malloc(x->T * 4);
        x->pos = malloc(x->T * 4);
        x->seq_start = malloc(x->T * 4);
        for (int64_t t = 0; t < x->T; t++) {
            int64_t r = t / S, j = t % S, half = S / 3;
            int64_t s0 = r * S + (j < half ? 0 : half);
            x->ids[t] = (int32_t)((t * 7919 + i * 31) % m->cfg.vocab_size);
            x->targets[t] = j % 5 == 0 ? -100 : (int32_t)((t * 104729 + 3) % m->cfg.vocab_size);
            x->pos[t] = (int32_t)(t - s0);
            x->seq_start[t] = (int32_t)s0;
        }
    }
    int64_t np = 0;
    float *gc = malloc(1 << 24), *gg = malloc(1 << 24);
    double lc, lg;
    ft_pack_file *pack = NULL;
    char *dir = NULL;
    if (nf4) { /* the NF4 pack of the tiny model, built into a fresh cache folder */
        dir = t_tmpdir();
        ft_pack_settings ps;
        ft_pack_settings_default(&ps, FT_PACK_QUANT_NF4);
        ft_pack_ensure_info *pi = calloc(1, sizeof *pi);
        assert_int_equal(ft_pack_ensure(model, dir, &ps, 0, pi), 0);
        assert_int_equal(ft_pack_open(&pack, pi->path, 1), 0);
        free(pi);
    }
    step_on(f->cpu, m, b, n_mb, &lc, gc, &np, pack, nf4 == 2);
    step_on(f->gpu, m, b, n_mb, &lg, gg, &np, pack, nf4 == 2);
    double e = relerr(gg, gc, np);
    printf("  train step %s(%s, 2 micro-batches of 2x64, packed rows): loss %.6f vs %.6f (rel %.2g), "
           "LoRA grads rel err %.3g over %lld params\n",
           nf4 == 2 ? "QLoRA NF4 base + frozen correction " : nf4 ? "QLoRA NF4 base " : "",
           qwen3 ? "tiny Qwen3" : "tiny-llama", lg, lc,
           fabs(lg - lc) / lc, e, (long long)np);
    ft_pack_close(pack);
    free(dir);
    assert_true(fabs(lg - lc) <= TOL_STEP_LOSS * fabs(lc));
    assert_true(e <= TOL_STEP_GRAD);
    for (int64_t i = 0; i < n_mb; i++) {
        free(b[i].ids); free(b[i].targets); free(b[i].pos); free(b[i].seq_start);
    }
    free(gc);
    free(gg);
    ft_model_free(m);
    if (mdir) assert_int_equal(t_rmtree(mdir), 0);
}

static void test_train_step(void **state) { train_step_cmp(state, 0, 0); }
static void test_train_step_nf4(void **state) { train_step_cmp(state, 1, 0); }
static void test_train_step_nf4_corr(void **state) { train_step_cmp(state, 2, 0); }
static void test_train_step_qwen3(void **state) { train_step_cmp(state, 0, 1); }
static void test_train_step_qwen3_nf4(void **state) { train_step_cmp(state, 1, 1); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_nf4),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_lm_head),
        cmocka_unit_test(test_train_step),
        cmocka_unit_test(test_train_step_nf4),
        cmocka_unit_test(test_train_step_nf4_corr),
        cmocka_unit_test(test_train_step_qwen3),
        cmocka_unit_test(test_train_step_qwen3_nf4),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
