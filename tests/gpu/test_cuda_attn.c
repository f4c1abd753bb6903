/* test_cuda_attn.c - the CUDA FlashAttention-2 kernels (kernels/cuda/attn.cu, fp32; and
 * kernels/cuda/attn_mma.cu, bf16 tensor cores) against the CPU backend's attention ops
 * (kernels/cpu/attn_impl.h) on random inputs over a sweep of shapes and sequence packings:
 * forward (out, lse), backward (dq, dk, dv), attention against a KV cache; bit-identical
 * repeats (no atomics); FT_E_INVALID for bad shapes; the op table's routing to attn_mma.cu.
 * Outputs are poisoned with NaN before every call, so an element a kernel fails to write
 * fails the test. GPU cases skip cleanly when no GPU is visible or ftune was built without
 * CUDA; the host self-check of attn_mma.cu's index math runs without a GPU.
 *
 * Error measure: ||gpu - cpu|| / ||cpu|| over a whole output (fp32 both sides). */
#include "tests/unit/harness.h"
#include "tests/gpu/gpu_fixture.h"

#include <time.h>

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"

/* fp32 on both sides, summed in other orders (tile shapes, fmaf, expf vs the CPU's exp). */
#define TOL_F32 1e-5
/* An output whose reference is zero up to rounding (dq when every query sees only itself:
 * dS = P (dP - Delta) with P = 1 and dP = Delta up to summation order): compared by the RMS
 * of the difference instead, when the reference RMS is below TOL_ZERO_REF. */
#define TOL_ZERO_REF 1e-4
#define TOL_ZERO_RMS 1e-6
/* attn_mma.cu: q, k, v, dout, P and dS rounded to bf16 (8-bit mantissa, relative rounding
 * 2^-9) with fp32 accumulation; the bound of the bf16 GEMM path before it (TOL_BF16_GEMM in
 * test_cuda_ops.c). Zero references (singletons) keep TOL_ZERO_RMS: attn_mma.cu computes
 * Delta from the same bf16 dO as dP, so dP - Delta is fp32 rounding there. */
#define TOL_BF16 1e-2

#ifdef FT_HAVE_CUDA
#include "kernels/cuda/cuda_entry.h"
#define GPU_FWD ft_cuda_flash_attention_fwd
#define GPU_BWD ft_cuda_flash_attention_bwd
#define GPU_KV ft_cuda_flash_attention_kv_fwd
#endif

static int setup(void **state) { return gpu_fixture_setup(state, 20261123, 1); }
static int teardown(void **state) { return gpu_fixture_teardown(state); }

/* Helpers below run only with the CUDA backend built in (FT_HAVE_CUDA). */
#ifdef FT_HAVE_CUDA
/* FT_ATTN_TEST_SMALL=1 (for runs under compute-sanitizer): T <= 300, no timing cases. */
static int small_run(void)
{
    const char *e = getenv("FT_ATTN_TEST_SMALL");
    return e && *e && *e != '0';
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* n uniform floats in [lo, hi), never exactly 0 (a zero would hide a missing term). */
static float *rnd(fix *f, int64_t n, float lo, float hi)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float u = lo + (hi - lo) * ft_rng_uniform(&f->rng);
        x[i] = u != 0.0f ? u : 0.5f * hi;
    }
    return x;
}

static void *up(fix *f, const void *h, size_t bytes)
{
    void *d = f->gpu->ops->alloc(f->gpu, bytes ? bytes : 1);
    assert_non_null(d);
    if (bytes) assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, bytes), 0);
    return d;
}

/* Overwrites n floats of device memory with NaN (all bits set). */
static void poison(fix *f, float *d, int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    memset(h, 0xff, (size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(f->gpu->ops->copy(f->gpu, d, h, (size_t)n * sizeof(float)), 0);
    free(h);
}

static float *dev(fix *f, int64_t n)
{
    float *d = f->gpu->ops->alloc(f->gpu, (size_t)(n ? n : 1) * sizeof(float));
    assert_non_null(d);
    return d;
}

static float *down(fix *f, const float *d, int64_t n)
{
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    assert_int_equal(f->gpu->ops->copy(f->gpu, h, d, (size_t)n * sizeof(float)), 0);
    return h;
}

/* Error of a (GPU) against b (CPU): relative 2-norm, or the RMS difference when b is zero up
 * to rounding (*zero set). Any non-finite value in a -> inf. */
static double err_of(const float *a, const float *b, int64_t n, int *zero)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    *zero = n > 0 && sqrt(den / (double)n) < TOL_ZERO_REF;
    if (*zero) return sqrt(num / (double)n);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Downloads gpu_d, compares with cpu_h, records the worst error of kind `kind`, asserts. */
static double check(fix *f, int kind, const float *gpu_d, const float *cpu_h, int64_t n,
                    const char *what)
{
    float *g = down(f, gpu_d, n);
    int zero = 0;
    double e = err_of(g, cpu_h, n, &zero);
    free(g);
    double tol = zero ? TOL_ZERO_RMS : TOL_F32;
    if (!zero && e > f->worst[kind]) f->worst[kind] = e;
    if (e > tol)
        printf("  %s: FAILED: %s %.3g (tol %.0e)\n", what,
               zero ? "zero reference, rms diff" : "rel err", e, tol);
    assert_true(e <= tol);
    return e;
}

/* Packings of T tokens (seq_start): 0 one sequence; 1 many short (1..16 tokens);
 * 2 short ones then one long one holding the last half; 3 every token alone;
 * 4 mixed lengths 1..300. */
#define N_PACK 5
static const char *pack_name[N_PACK] = {"one", "short", "short+long", "singletons", "mixed"};

static int32_t *packing(fix *f, int kind, int64_t T)
{
    int32_t *ss = malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int64_t start = 0, len = 1;
    for (int64_t t = 0; t < T; t++) {
        if (t == 0 || t - start >= len) {
            start = t;
            switch (kind) {
            case 0: len = T; break;
            case 1: len = 1 + (int64_t)(ft_rng_uniform(&f->rng) * 16); break;
            case 2: len = t < T / 2 ? 1 + (int64_t)(ft_rng_uniform(&f->rng) * 24) : T; break;
            case 3: len = 1; break;
            default: len = 1 + (int64_t)(ft_rng_uniform(&f->rng) * 300); break;
            }
            if (kind == 2 && t < T / 2 && t + len > T / 2) len = T / 2 - t;
        }
        ss[t] = (int32_t)start;
    }
    return ss;
}

enum { K_OUT, K_LSE, K_DQ, K_DK, K_DV, K_KV };
static const char *kind_name[] = {"out", "lse", "dq", "dk", "dv", "kv out"};

/* One case: CPU and GPU forward + backward on the same random inputs; compares all five
 * outputs; with `repeat`, runs the GPU ops again and requires identical bits. Returns the
 * GPU milliseconds of (forward, backward) when `ms` is non-NULL. */
static void one_case(fix *f, int64_t T, int64_t H, int64_t Hkv, int64_t D, int pack, int repeat,
                     double *ms)
{
    const int64_t nq = T * H * D, nk = T * Hkv * D;
    const float sc = 1.0f / sqrtf((float)D);
    int32_t *ss = packing(f, pack, T);
    float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2), *v = rnd(f, nk, -1, 1);
    float *dout = rnd(f, nq, -1, 1);
    float *o = malloc(nq * 4), *lse = malloc(T * H * 4), *dq = malloc(nq * 4);
    float *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    assert_int_equal(f->cpu->ops->attention_fwd(f->cpu, o, lse, q, k, v, ss, T, H, Hkv, D, sc), 0);
    assert_int_equal(f->cpu->ops->attention_bwd(f->cpu, dq, dk, dv, dout, q, k, v, o, lse, ss, T,
                                                H, Hkv, D, sc), 0);

    float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4);
    float *gdo = up(f, dout, nq * 4);
    int32_t *gss = up(f, ss, T * 4);
    float *go = dev(f, nq), *glse = dev(f, T * H), *gdq = dev(f, nq), *gdk = dev(f, nk), *gdv = dev(f, nk);
    poison(f, go, nq);
    poison(f, glse, T * H);
    poison(f, gdq, nq);
    poison(f, gdk, nk);
    poison(f, gdv, nk);
    double t0 = now_ms();
    assert_int_equal(GPU_FWD(f->gpu, go, glse, gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
    assert_int_equal(ft_backend_sync(f->gpu), 0);
    double t1 = now_ms();
    assert_int_equal(GPU_BWD(f->gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, glse, gss, T, H, Hkv, D, sc), 0);
    assert_int_equal(ft_backend_sync(f->gpu), 0);
    double t2 = now_ms();
    if (ms) {
        ms[0] = t1 - t0;
        ms[1] = t2 - t1;
    }

    char what[128];
    snprintf(what, sizeof what, "T=%lld H=%lld/%lld D=%lld %s", (long long)T, (long long)H,
             (long long)Hkv, (long long)D, pack_name[pack]);
    double e[5];
    const float *gp[5] = {go, glse, gdq, gdk, gdv}, *cp[5] = {o, lse, dq, dk, dv};
    const int64_t nn[5] = {nq, T * H, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        char w2[160];
        snprintf(w2, sizeof w2, "%s %s", what, kind_name[i]);
        e[i] = check(f, i, gp[i], cp[i], nn[i], w2);
    }
    printf("  %-36s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e%s\n", what, e[0], e[1], e[2], e[3],
           e[4], pack == 3 || T == 1 ? " (dq, dk: rms diff, zero reference)" : "");

    if (repeat) { /* same inputs again: identical bits (fixed summation order, no atomics) */
        float *h1[5], *h2[5];
        float *gpw[5] = {go, glse, gdq, gdk, gdv};
        for (int i = 0; i < 5; i++) h1[i] = down(f, gpw[i], nn[i]);
        for (int i = 0; i < 5; i++) poison(f, gpw[i], nn[i]);
        assert_int_equal(GPU_FWD(f->gpu, go, glse, gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
        assert_int_equal(GPU_BWD(f->gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, glse, gss, T, H, Hkv, D, sc), 0);
        for (int i = 0; i < 5; i++) {
            h2[i] = down(f, gpw[i], nn[i]);
            assert_memory_equal(h1[i], h2[i], (size_t)nn[i] * sizeof(float));
            free(h1[i]);
            free(h2[i]);
        }
        printf("  %-36s repeat: bit-identical\n", what);
    }

    void *bufs[] = {gq, gk, gv, gdo, gss, go, glse, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
    free(ss); free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv);
}

/* GPU milliseconds of the op table's attention_fwd + attention_bwd (whatever kernels the CUDA
 * backend uses; warm: the second of two calls), for comparison with the timings above. */
static void time_op_table(fix *f, int64_t T, int64_t H, int64_t Hkv, int64_t D, int pack,
                          int precise)
{
    const int64_t nq = T * H * D, nk = T * Hkv * D;
    const float sc = 1.0f / sqrtf((float)D);
    int32_t *ss = packing(f, pack, T);
    float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2);
    float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, k, nk * 4), *gdo = up(f, q, nq * 4);
    int32_t *gss = up(f, ss, T * 4);
    float *go = dev(f, nq), *glse = dev(f, T * H), *gdq = dev(f, nq), *gdk = dev(f, nk), *gdv = dev(f, nk);
    ft_backend *g = f->gpu;
    assert_int_equal(ft_backend_cuda_set_precise(g, precise), 0);
    if (g->ops->prepare) assert_int_equal(g->ops->prepare(g, T, H, Hkv, D), 0);
    double t0 = 0, t1 = 0, t2 = 0;
    for (int rep = 0; rep < 2; rep++) {
        t0 = now_ms();
        assert_int_equal(g->ops->attention_fwd(g, go, glse, gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
        assert_int_equal(ft_backend_sync(g), 0);
        t1 = now_ms();
        assert_int_equal(g->ops->attention_bwd(g, gdq, gdk, gdv, gdo, gq, gk, gv, go, glse, gss, T, H,
                                               Hkv, D, sc), 0);
        assert_int_equal(ft_backend_sync(g), 0);
        t2 = now_ms();
    }
    assert_int_equal(ft_backend_cuda_set_precise(g, 0), 0);
    printf("  timing op table (%s) T=%lld H=%lld/%lld D=%lld %s: fwd %.3f ms, bwd %.3f ms\n",
           precise ? "precise fp32" : "default", (long long)T, (long long)H, (long long)Hkv,
           (long long)D, pack_name[pack], t1 - t0, t2 - t1);
    void *bufs[] = {gq, gk, gv, gdo, gss, go, glse, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g->ops->free(g, bufs[i]);
    free(ss); free(q); free(k);
}

static void print_worst(fix *f, int from, int to)
{
    printf("  max rel err:");
    for (int i = from; i < to; i++) printf(" %s %.2e", kind_name[i], f->worst[i]);
    printf(" (tol %.0e)\n", TOL_F32);
}
#endif

#ifdef FT_HAVE_CUDA
/* ---- attn_mma.cu (bf16 tensor cores) ----------------------------------------------------- */

/* Compares a GPU output (downloaded) with the CPU's without aborting: prints the error and, on
 * failure, what to debug from (non-finite count: elements never written; the worst element's
 * position; the first and last token whose row is off and how many). rows x heads x D
 * layout. Returns 1 when within tolerance. */
static int mma_cmp(const char *what, const char *name, const float *g, const float *c,
                   int64_t rows, int64_t heads, int64_t D, double tol, double *err_out)
{
    const int64_t n = rows * heads * D;
    int zero = 0;
    double e = err_of(g, c, n, &zero);
    int64_t nonfinite = 0, worst = 0;
    double wd = -1, den = 0;
    for (int64_t i = 0; i < n; i++) { /* worst: the first non-finite element, else the largest diff */
        den += (double)c[i] * c[i];
        if (!isfinite(g[i])) {
            if (!nonfinite++) worst = i, wd = INFINITY;
            continue;
        }
        double d = fabs((double)g[i] - c[i]);
        if (d > wd) wd = d, worst = i;
    }
    const double t = zero ? TOL_ZERO_RMS : tol;
    *err_out = e;
    if (e <= t) return 1;
    const double rms = sqrt(den / (double)(n ? n : 1));
    int64_t first = -1, last = -1, bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        double num = 0, ref = 0;
        for (int64_t j = 0; j < heads * D; j++) {
            double d = (double)g[r * heads * D + j] - c[r * heads * D + j];
            num += isfinite(d) ? d * d : INFINITY;
            ref += (double)c[r * heads * D + j] * c[r * heads * D + j];
        }
        /* a row is off when its error is above tol relative to its own norm (or to the
         * whole output's RMS for rows near zero) */
        if (sqrt(num) > t * fmax(sqrt(ref), rms * sqrt((double)(heads * D)))) {
            if (first < 0) first = r;
            last = r;
            bad++;
        }
    }
    const int64_t wt = worst / (heads * D), wh = (worst / D) % heads, wdd = worst % D;
    printf("  %s %s: FAILED: %s %.3g (tol %.0e); %lld non-finite; worst (t %lld, head %lld, d %lld) "
           "gpu %.6g cpu %.6g; rows off: %lld (first t %lld, last t %lld)\n",
           what, name, zero ? "zero reference, rms diff" : "rel err", e, t, (long long)nonfinite,
           (long long)wt, (long long)wh, (long long)wdd, g[worst], c[worst], (long long)bad,
           (long long)first, (long long)last);
    return 0;
}

/* One attn_mma.cu case against the CPU twin: fwd + bwd through the extern functions on fresh
 * random inputs, all five outputs compared; with `repeat`, the same inputs again must give the
 * same bits. Returns the number of failed checks (never aborts, so one run shows every
 * failing shape). */
static int mma_case(fix *f, int64_t T, int64_t H, int64_t Hkv, int64_t D, int pack, int repeat)
{
    const int64_t nq = T * H * D, nk = T * Hkv * D;
    const float sc = 1.0f / sqrtf((float)D);
    int32_t *ss = packing(f, pack, T);
    float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2), *v = rnd(f, nk, -1, 1);
    float *dout = rnd(f, nq, -1, 1);
    float *o = malloc(nq * 4), *lse = malloc(T * H * 4), *dq = malloc(nq * 4);
    float *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    assert_int_equal(f->cpu->ops->attention_fwd(f->cpu, o, lse, q, k, v, ss, T, H, Hkv, D, sc), 0);
    assert_int_equal(f->cpu->ops->attention_bwd(f->cpu, dq, dk, dv, dout, q, k, v, o, lse, ss, T,
                                                H, Hkv, D, sc), 0);
    float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4);
    float *gdo = up(f, dout, nq * 4);
    int32_t *gss = up(f, ss, T * 4);
    float *go = dev(f, nq), *glse = dev(f, T * H), *gdq = dev(f, nq), *gdk = dev(f, nk), *gdv = dev(f, nk);
    float *gp[5] = {go, glse, gdq, gdk, gdv}, *cp[5] = {o, lse, dq, dk, dv};
    const int64_t nn[5] = {nq, T * H, nq, nk, nk}, hh[5] = {H, H, H, Hkv, Hkv}, dd[5] = {D, 1, D, D, D};
    char what[128];
    snprintf(what, sizeof what, "mma T=%lld H=%lld/%lld D=%lld %s", (long long)T, (long long)H,
             (long long)Hkv, (long long)D, pack_name[pack]);
    int fails = 0;
    float *h1[5] = {0};
    for (int rep = 0; rep <= repeat; rep++) {
        for (int i = 0; i < 5; i++) poison(f, gp[i], nn[i]);
        int rf = ft_cuda_mma_attention_fwd(f->gpu, go, glse, gq, gk, gv, gss, T, H, Hkv, D, sc);
        int rb = rf ? rf : ft_cuda_mma_attention_bwd(f->gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, glse,
                                                     gss, T, H, Hkv, D, sc);
        int rs = ft_backend_sync(f->gpu);
        if (rf || rb || rs) {
            printf("  %s: FAILED: fwd %d bwd %d sync %d: %s\n", what, rf, rb, rs, ft_errmsg());
            fails++;
            break;
        }
        if (rep == 0) {
            double e[5];
            for (int i = 0; i < 5; i++) {
                h1[i] = down(f, gp[i], nn[i]);
                fails += !mma_cmp(what, kind_name[i], h1[i], cp[i], T, hh[i], dd[i], TOL_BF16, &e[i]);
                if (e[i] > f->worst[i] && e[i] != INFINITY) f->worst[i] = e[i];
            }
            printf("  %-36s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e%s\n", what, e[0], e[1], e[2],
                   e[3], e[4], pack == 3 || T == 1 ? " (dq, dk: rms diff, zero reference)" : "");
        } else {
            int same = 1;
            for (int i = 0; i < 5; i++) {
                float *h2 = down(f, gp[i], nn[i]);
                if (memcmp(h1[i], h2, (size_t)nn[i] * sizeof(float))) {
                    printf("  %s %s: FAILED: repeat differs\n", what, kind_name[i]);
                    same = 0;
                }
                free(h2);
            }
            fails += !same;
            if (same) printf("  %-36s repeat: bit-identical\n", what);
        }
    }
    for (int i = 0; i < 5; i++) free(h1[i]);
    void *bufs[] = {gq, gk, gv, gdo, gss, go, glse, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
    free(ss); free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv);
    return fails;
}
#endif

/* attn_mma.cu's index math on the host: ldmatrix addresses and swizzle against the PTX
 * fragment layouts, and the tile walks against brute force (no GPU needed). */
static void test_mma_selfcheck(void **state)
{
    (void)state;
#ifdef FT_HAVE_CUDA
    char msg[256];
    int rc = ft_cuda_mma_attn_selfcheck(msg, sizeof msg);
    if (rc) printf("  attn_mma self-check: FAILED: %s\n", msg);
    assert_int_equal(rc, 0);
    printf("  attn_mma self-check: fragments, swizzle, bank groups, tile walks ok\n");
#else
    skip();
#endif
}

/* attn_mma.cu against the CPU twin: T x (H, Hkv) x D x packing (one sequence, ragged lengths,
 * every token alone; short runs and short+long at T = 300), bit-identical repeats on part of
 * them. Every case runs and prints before the test fails. */
static void test_mma_sweep(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    const int64_t Ts[] = {1, 17, 128, 300, 2048};
    const int64_t heads[][2] = {{4, 4}, {32, 8}, {9, 3}};
    const int64_t Ds[] = {64, 128};
    const int packs[] = {0, 4, 3, 1, 2};
    int fails = 0, cases = 0;
    memset(f->worst, 0, sizeof f->worst);
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t p = 0; p < sizeof packs / sizeof packs[0]; p++) {
            const int64_t T = Ts[a];
            if (T == 1 && p > 0) continue;      /* one token: one packing */
            if (p > 2 && T != 300) continue;    /* short / short+long: T = 300 only */
            if (small_run() && T > 300) continue;
            for (size_t b = 0; b < sizeof heads / sizeof heads[0]; b++)
                for (size_t c = 0; c < sizeof Ds / sizeof Ds[0]; c++) {
                    const int repeat = T <= 300 ? (int)(b == 1) : (b == 1 && c == 1 && p == 0);
                    fails += mma_case(f, T, heads[b][0], heads[b][1], Ds[c], packs[p], repeat);
                    cases++;
                }
        }
    printf("  mma max err:");
    for (int i = K_OUT; i < K_KV; i++) printf(" %s %.2e", kind_name[i], f->worst[i]);
    printf(" (tol %.0e); %d cases, %d failed checks\n", TOL_BF16, cases, fails);
    assert_int_equal(fails, 0);
#endif
}

/* With FTUNE_ATTN unset or mma (be->tune.attn FT_ATTN_AUTO, the default since 2026-11-28; the
 * test gives the backend the variable's value) the op table (context not precise) runs attn_mma.cu for D = 64
 * and 128: the same bits as the direct call; D = 96 goes elsewhere (attn_mma.cu refuses it).
 * The routing is not asserted when FTUNE_ATTN is set to something else. Bad shapes for
 * attn_mma.cu: FT_E_INVALID. */
static void test_mma_op_table(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    /* the backend reads no environment: the test gives it FTUNE_ATTN as cli/env.c would */
    const char *env = getenv("FTUNE_ATTN");
    const ft_backend_tune tune0 = f->gpu->tune;
    f->gpu->tune.attn = env && !strcmp(env, "gemm")    ? FT_ATTN_GEMM
                        : env && !strcmp(env, "flash") ? FT_ATTN_FLASH
                                                       : FT_ATTN_AUTO;
    if (env && !strcmp(env, "mma")) env = NULL;
    const int64_t cases[][4] = {{300, 32, 8, 128}, {129, 9, 3, 64}, {200, 4, 2, 96}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t T = cases[c][0], H = cases[c][1], Hkv = cases[c][2], D = cases[c][3];
        const int64_t nq = T * H * D, nk = T * Hkv * D;
        const float sc = 1.0f / sqrtf((float)D);
        int32_t *ss = packing(f, 4, T);
        float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2), *v = rnd(f, nk, -1, 1), *dout = rnd(f, nq, -1, 1);
        float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4), *gdo = up(f, dout, nq * 4);
        int32_t *gss = up(f, ss, T * 4);
        float *g1[5], *g2[5];
        const int64_t nn[5] = {nq, T * H, nq, nk, nk};
        for (int i = 0; i < 5; i++) {
            g1[i] = dev(f, nn[i]);
            g2[i] = dev(f, nn[i]);
            poison(f, g1[i], nn[i]);
            poison(f, g2[i], nn[i]);
        }
        ft_backend *g = f->gpu;
        assert_int_equal(ft_backend_cuda_set_precise(g, 0), 0);
        assert_int_equal(g->ops->attention_fwd(g, g1[0], g1[1], gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
        assert_int_equal(g->ops->attention_bwd(g, g1[2], g1[3], g1[4], gdo, gq, gk, gv, g1[0], g1[1], gss,
                                               T, H, Hkv, D, sc), 0);
        const int mma = D == 64 || D == 128;
        if (mma) {
            assert_int_equal(ft_cuda_mma_attention_fwd(g, g2[0], g2[1], gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
            assert_int_equal(ft_cuda_mma_attention_bwd(g, g2[2], g2[3], g2[4], gdo, gq, gk, gv, g2[0], g2[1],
                                                       gss, T, H, Hkv, D, sc), 0);
        } else {
            assert_int_equal(ft_cuda_mma_attention_fwd(g, g2[0], g2[1], gq, gk, gv, gss, T, H, Hkv, D, sc),
                             FT_E_INVALID);
        }
        assert_int_equal(ft_backend_sync(g), 0);
        int same = 1;
        for (int i = 0; i < 5 && mma; i++) {
            float *a = down(f, g1[i], nn[i]), *b = down(f, g2[i], nn[i]);
            same &= !memcmp(a, b, (size_t)nn[i] * 4);
            free(a);
            free(b);
        }
        printf("  op table T=%lld H=%lld/%lld D=%lld: %s\n", (long long)T, (long long)H, (long long)Hkv,
               (long long)D, !mma ? "not routed to attn_mma (D)" : same ? "attn_mma, same bits as the direct call"
               : "DIFFERENT from attn_mma");
        if (mma && !env) assert_true(same);
        if (env) printf("  (FTUNE_ATTN=%s: routing not asserted)\n", env);
        for (int i = 0; i < 5; i++) {
            g->ops->free(g, g1[i]);
            g->ops->free(g, g2[i]);
        }
        void *bufs[] = {gq, gk, gv, gdo, gss};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g->ops->free(g, bufs[i]);
        free(ss); free(q); free(k); free(v); free(dout);
    }
    /* buffers 4 bytes off a 16-byte boundary: the op table takes the cuBLAS-tile kernels (the
     * tensor-core ones read float4: a misaligned address would be a sticky fault), with the
     * aligned call's values to bf16 rounding; the direct call refuses them */
    {
        const int64_t T = 129, H = 4, Hkv = 2, D = 64, nq = T * H * D, nk = T * Hkv * D;
        const float sc = 0.125f;
        int32_t *ss = packing(f, 0, T);
        float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2), *v = rnd(f, nk, -1, 1);
        float *bq = dev(f, nq + 4), *bk = dev(f, nk + 4), *bv = dev(f, nk + 4), *bo = dev(f, nq + 4);
        float *lse = dev(f, T * H), *o_al = dev(f, nq);
        f->gpu->ops->copy(f->gpu, bq + 1, q, nq * 4);
        f->gpu->ops->copy(f->gpu, bk + 1, k, nk * 4);
        f->gpu->ops->copy(f->gpu, bv + 1, v, nk * 4);
        float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4);
        int32_t *gss = up(f, ss, T * 4);
        ft_backend *g = f->gpu;
        assert_int_equal(g->ops->attention_fwd(g, bo + 1, lse, bq + 1, bk + 1, bv + 1, gss, T, H, Hkv, D, sc), 0);
        assert_int_equal(g->ops->attention_fwd(g, o_al, lse, gq, gk, gv, gss, T, H, Hkv, D, sc), 0);
        assert_int_equal(ft_cuda_mma_attention_fwd(g, bo + 1, lse, bq + 1, bk + 1, bv + 1, gss, T, H, Hkv, D, sc),
                         FT_E_INVALID);
        assert_int_equal(ft_backend_sync(g), 0);
        float *a = down(f, bo + 1, nq), *b = down(f, o_al, nq);
        double num = 0, den = 0;
        for (int64_t i = 0; i < nq; i++) num += (a[i] - b[i]) * (double)(a[i] - b[i]), den += (double)b[i] * b[i];
        printf("  misaligned buffers through the op table: rc 0, rms diff %.2e vs the aligned call\n",
               sqrt(num / (den > 0 ? den : 1)));
        assert_true(sqrt(num / (den > 0 ? den : 1)) < 1e-2);
        void *bufs[] = {bq, bk, bv, bo, lse, o_al, gq, gk, gv, gss};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g->ops->free(g, bufs[i]);
        free(a); free(b); free(q); free(k); free(v); free(ss);
    }
    /* bad shapes for the tensor-core path */
    float *b = dev(f, 1024);
    int32_t *ss = up(f, (int32_t[4]){0, 0, 0, 0}, 16);
    assert_int_equal(ft_cuda_mma_attention_fwd(f->gpu, b, b, b, b, b, ss, 4, 1, 1, 32, 1.f), FT_E_INVALID);
    assert_int_equal(ft_cuda_mma_attention_fwd(f->gpu, b, b, b, b, b, ss, 4, 6, 4, 64, 1.f), FT_E_INVALID);
    assert_int_equal(ft_cuda_mma_attention_bwd(f->gpu, b, b, b, b, b, b, b, b, b, ss, 4, 3, 2, 64, 1.f),
                     FT_E_INVALID);
    assert_int_equal(ft_cuda_mma_attention_fwd(f->gpu, b, b, b, b, b, ss, 0, 1, 1, 64, 1.f), 0);
    f->gpu->ops->free(f->gpu, b);
    f->gpu->ops->free(f->gpu, ss);
    f->gpu->tune = tune0;
#endif
}

/* The sweep of the brief: T x packing x (H, Hkv) x D, fresh random inputs per case. */
static void test_fwd_bwd_sweep(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    const int64_t Ts[] = {1, 17, 128, 300, 1024};
    const int64_t heads[][2] = {{4, 4}, {8, 2}, {32, 8}};
    const int64_t Ds[] = {64, 128};
    memset(f->worst, 0, sizeof f->worst);
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (int pk = 0; pk < N_PACK; pk++) {
            if (Ts[a] == 1 && pk > 0) continue; /* one token: one packing */
            if (small_run() && Ts[a] > 300) continue;
            for (size_t b = 0; b < sizeof heads / sizeof heads[0]; b++)
                for (size_t c = 0; c < sizeof Ds / sizeof Ds[0]; c++)
                    one_case(f, Ts[a], heads[b][0], heads[b][1], Ds[c], pk, 0, NULL);
        }
    print_worst(f, K_OUT, K_KV);
#endif
}

/* Head dims off the models' 64/128 (the register slices' guards, D up to 256), bit-identical
 * repeats, and a long packed batch (T = 32768) with timings. */
static void test_fwd_bwd_edges(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    memset(f->worst, 0, sizeof f->worst);
    const int64_t cases[][5] = {/* T, H, Hkv, D, packing */
                                {77, 2, 1, 1, 0},    {130, 3, 3, 17, 4},  {300, 4, 2, 96, 2},
                                {257, 4, 1, 200, 1}, {300, 4, 2, 256, 4}, {64, 2, 2, 256, 0},
                                {1000, 6, 3, 72, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        one_case(f, cases[i][0], cases[i][1], cases[i][2], cases[i][3], (int)cases[i][4], 1, NULL);
    if (small_run()) return;
    double ms[2];
    one_case(f, 1024, 32, 8, 128, 0, 1, ms);
    printf("  timing T=1024 H=32/8 D=128 one sequence: fwd %.3f ms, bwd %.3f ms (first call)\n",
           ms[0], ms[1]);
    one_case(f, 1024, 32, 8, 128, 0, 0, ms);
    printf("  timing T=1024 H=32/8 D=128 one sequence: fwd %.3f ms, bwd %.3f ms\n", ms[0], ms[1]);
    one_case(f, 32768, 8, 2, 64, 4, 0, ms);
    printf("  timing T=32768 H=8/2 D=64 mixed 1..300: fwd %.3f ms, bwd %.3f ms\n", ms[0], ms[1]);
    for (int precise = 0; precise <= 1; precise++) {
        time_op_table(f, 1024, 32, 8, 128, 0, precise);
        time_op_table(f, 32768, 8, 2, 64, 4, precise);
    }
    print_worst(f, K_OUT, K_KV);
#endif
}

/* attention_kv_fwd (generation) against the CPU's, over cache lengths p and query counts. */
static void test_kv(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    memset(f->worst, 0, sizeof f->worst);
    const int64_t pn[][2] = {{0, 1}, {0, 17}, {5, 1}, {100, 7}, {1000, 1}, {1000, 64}, {37, 300}};
    const int64_t heads[][2] = {{4, 4}, {8, 2}, {32, 8}};
    const int64_t Ds[] = {64, 128};
    for (size_t a = 0; a < sizeof pn / sizeof pn[0]; a++)
        for (size_t b = 0; b < sizeof heads / sizeof heads[0]; b++)
            for (size_t c = 0; c < sizeof Ds / sizeof Ds[0]; c++) {
                int64_t p = pn[a][0], n_q = pn[a][1], H = heads[b][0], Hkv = heads[b][1], D = Ds[c];
                int64_t nq = n_q * H * D, nk = (p + n_q) * Hkv * D;
                float sc = 1.0f / sqrtf((float)D);
                float *q = rnd(f, nq, -2, 2), *k = rnd(f, nk, -2, 2), *v = rnd(f, nk, -1, 1);
                float *o = malloc(nq * 4);
                assert_int_equal(f->cpu->ops->attention_kv_fwd(f->cpu, o, q, k, v, p, n_q, H, Hkv, D, sc), 0);
                float *gq = up(f, q, nq * 4), *gk = up(f, k, nk * 4), *gv = up(f, v, nk * 4);
                float *go = dev(f, nq);
                poison(f, go, nq);
                assert_int_equal(GPU_KV(f->gpu, go, gq, gk, gv, p, n_q, H, Hkv, D, sc), 0);
                char what[96];
                snprintf(what, sizeof what, "kv p=%lld n_q=%lld H=%lld/%lld D=%lld", (long long)p,
                         (long long)n_q, (long long)H, (long long)Hkv, (long long)D);
                double e = check(f, K_KV, go, o, nq, what);
                printf("  %-40s out %.1e\n", what, e);
                void *bufs[] = {gq, gk, gv, go};
                for (size_t i = 0; i < 4; i++) f->gpu->ops->free(f->gpu, bufs[i]);
                free(q); free(k); free(v); free(o);
            }
    print_worst(f, K_KV, K_KV + 1);
#endif
}

/* Bad shapes are refused with FT_E_INVALID before anything is launched. */
static void test_invalid(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
#ifdef FT_HAVE_CUDA
    float *b = dev(f, 1024);
    int32_t *ss = up(f, (int32_t[4]){0, 0, 0, 0}, 16);
    ft_backend *g = f->gpu;
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, 4, 1, 1, 0, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, 4, 1, 1, 257, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, 4, 6, 4, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, -1, 1, 1, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, 4, 2, 0, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_BWD(g, b, b, b, b, b, b, b, b, b, ss, 4, 1, 1, 300, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_BWD(g, b, b, b, b, b, b, b, b, b, ss, 4, -2, 1, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_BWD(g, b, b, b, b, b, b, b, b, b, ss, 4, 3, 2, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_KV(g, b, b, b, b, -1, 1, 1, 1, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_KV(g, b, b, b, b, 0, -1, 1, 1, 8, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_KV(g, b, b, b, b, 0, 1, 1, 1, 0, 1.f), FT_E_INVALID);
    assert_int_equal(GPU_KV(g, b, b, b, b, 0, 1, 4, 3, 8, 1.f), FT_E_INVALID);
    /* empty inputs are a no-op */
    assert_int_equal(GPU_FWD(g, b, b, b, b, b, ss, 0, 1, 1, 8, 1.f), 0);
    assert_int_equal(GPU_KV(g, b, b, b, b, 3, 0, 1, 1, 8, 1.f), 0);
    assert_int_equal(ft_backend_sync(g), 0);
    g->ops->free(g, b);
    g->ops->free(g, ss);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fwd_bwd_sweep),
        cmocka_unit_test(test_fwd_bwd_edges),
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_mma_selfcheck),
        cmocka_unit_test(test_mma_sweep),
        cmocka_unit_test(test_mma_op_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
