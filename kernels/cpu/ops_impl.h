/* ops_impl.h - bodies of the CPU ops except attention (attn_impl.h), written once for an
 * element type REAL. Template: no include guard; included by ops_f32.c and ops_f64.c, which
 * define before the #include
 *     FT_CPU_REAL    float | double
 *     FT_CPU_SUFFIX  f32   | f64        (function names ft_cpu_<op>_<suffix>)
 *     FT_CPU_GEMM    cblas_sgemm | cblas_dgemm
 *     FT_CPU_GEMV    cblas_sgemv | cblas_dgemv
 *     FT_CPU_EXP, FT_CPU_SQRT          expf, sqrtf | exp, sqrt
 * Declarations, argument rules: ops_decl.h. Semantics and shapes: kernels/kernels.h.
 *
 * Threading: loops over rows (or large element ranges) run under `omp parallel for` with a
 * static schedule. OpenBLAS (the pthread build) is set to one thread by backend.c and is
 * called from OpenMP threads: gemm_raw splits C over the team, the attention calls it per
 * tile. Reductions that feed a scalar result (sumsq, the CE loss) are summed in a fixed
 * order, so results do not depend on the thread count.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"
#include "src/core/err.h"

#define REAL FT_CPU_REAL
#define FN(name) FT_CPU_CAT(ft_cpu_##name, FT_CPU_SUFFIX)
#define R_EXP FT_CPU_EXP
#define R_SQRT FT_CPU_SQRT

/* ---- linear algebra ------------------------------------------------------------------ */

/* cblas ?gemm, row-major, no checks. One row (m = 1: a decoded token) is ?gemv, which
 * reads op(b) in place where ?gemm first packs it (OpenBLAS: 28% of a decode step's time
 * went to packing the weights); c = 0 first when beta = 0, as BLAS implementations differ on
 * whether a zero beta reads c (NaN * 0). */
static void gemm_blas(int ta, int tb, int64_t m, int64_t n, int64_t k, REAL alpha,
                      const REAL *a, int64_t lda, const REAL *b, int64_t ldb, REAL beta,
                      REAL *c, int64_t ldc)
{
    if (m == 1) {
        if (beta == 0) memset(c, 0, (size_t)n * sizeof(REAL));
        /* x = row 0 of op(a): a's first row, or its first column when transposed */
        const int incx = ta ? (int)lda : 1;
        if (tb) /* op(b) = b^T, b (n, k): c = b x */
            FT_CPU_GEMV(CblasRowMajor, CblasNoTrans, (int)n, (int)k, alpha, b, (int)ldb, a, incx,
                        beta, c, 1);
        else /* b (k, n): c = b^T x */
            FT_CPU_GEMV(CblasRowMajor, CblasTrans, (int)k, (int)n, alpha, b, (int)ldb, a, incx,
                        beta, c, 1);
        return;
    }
    FT_CPU_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* GEMMs with fewer multiply-adds than this run on the calling thread. */
#define GEMM_PAR_MIN 262144.0

/* gemm without argument checks (callers have done them). The CPU backend runs OpenBLAS
 * single-threaded (backend.c) and splits C here over the OpenMP team, by rows (or by
 * columns when n > m) into P slices with 16-aligned boundaries, one BLAS call each.
 * P = clamp(len / 256, 2, 8) depends on the shape only (each slice re-packs the other
 * operand, so slices stay >= ~256 long), hence results are bit-identical for any thread
 * count. (OpenBLAS' own pthread workers busy-wait after each call and, on a 2-core
 * machine, slowed the OpenMP loops that followed by 10-20x.) Inside a parallel region, or
 * when OpenBLAS is itself multi-threaded, it is one BLAS call. */
static void gemm_raw(int ta, int tb, int64_t m, int64_t n, int64_t k, REAL alpha,
                     const REAL *a, int64_t lda, const REAL *b, int64_t ldb, REAL beta,
                     REAL *c, int64_t ldc)
{
    const int split_m = m >= n;
    const int64_t len = split_m ? m : n;
    if (omp_in_parallel() || (double)m * (double)n * (double)k < GEMM_PAR_MIN || len < 64 ||
        openblas_get_num_threads() > 1) {
        gemm_blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const int64_t parts = FT_CPU_MIN((int64_t)8, FT_CPU_MAX((int64_t)2, len / 256));
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < parts; p++) {
        const int64_t s = p == 0 ? 0 : FT_CPU_MIN(len, (p * len / parts + 15) / 16 * 16);
        const int64_t e =
            p == parts - 1 ? len : FT_CPU_MIN(len, ((p + 1) * len / parts + 15) / 16 * 16);
        if (e <= s) continue;
        if (split_m) /* rows s..e of op(a) and c */
            gemm_blas(ta, tb, e - s, n, k, alpha, a + (ta ? s : s * lda), lda, b, ldb, beta,
                      c + s * ldc, ldc);
        else /* columns s..e of op(b) and c */
            gemm_blas(ta, tb, m, e - s, k, alpha, a, lda, b + (tb ? s * ldb : s), ldb, beta,
                      c + s, ldc);
    }
}

/* Checks that a BLAS dimension or stride fits the 32-bit blasint of OpenBLAS. */
static int blas_int_ok(const char *op, const char *what, int64_t v)
{
    if (v < 0 || v > INT_MAX)
        return ft_err(FT_E_INVALID, "cpu %s: %s = %lld, expected 0..%d (32-bit BLAS)", op,
                      what, (long long)v, INT_MAX);
    return 0;
}

int FN(gemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, REAL alpha,
             const REAL *a, int64_t lda, const REAL *b, int64_t ldb, REAL beta, REAL *c,
             int64_t ldc)
{
    const char *op = "gemm";
    FT_TRY(blas_int_ok(op, "m", m));
    FT_TRY(blas_int_ok(op, "n", n));
    FT_TRY(blas_int_ok(op, "k", k));
    FT_TRY(blas_int_ok(op, "lda", lda));
    FT_TRY(blas_int_ok(op, "ldb", ldb));
    FT_TRY(blas_int_ok(op, "ldc", ldc));
    /* Row-major: a is stored (m, k), or (k, m) when transposed; its rows hold lda >= row
     * length elements. Same for b (k, n) / (n, k) and c (m, n). */
    int64_t a_row = trans_a ? m : k, b_row = trans_b ? k : n;
    if (lda < FT_CPU_MAX(a_row, 1) || ldb < FT_CPU_MAX(b_row, 1) || ldc < FT_CPU_MAX(n, 1))
        return ft_err(FT_E_INVALID,
                      "cpu gemm: strides lda=%lld ldb=%lld ldc=%lld, expected >= row lengths "
                      "%lld, %lld, %lld (m=%lld n=%lld k=%lld trans_a=%d trans_b=%d)",
                      (long long)lda, (long long)ldb, (long long)ldc, (long long)a_row,
                      (long long)b_row, (long long)n, (long long)m, (long long)n,
                      (long long)k, trans_a, trans_b);
    if (m == 0 || n == 0) return 0;
    FT_CPU_CHECK_PTR(op, c, m * n);
    if (k == 0) { /* c = beta * c; BLAS implementations differ on k == 0 */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0 ? 0 : beta * c[i * ldc + j];
        return 0;
    }
    FT_CPU_CHECK_PTR(op, a, m * k);
    FT_CPU_CHECK_PTR(op, b, k * n);
    gemm_raw(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}

int FN(axpy)(REAL alpha, const REAL *x, REAL *y, int64_t n)
{
    FT_CPU_CHECK_NONNEG("axpy", n);
    FT_CPU_CHECK_PTR("axpy", x, n);
    FT_CPU_CHECK_PTR("axpy", y, n);
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return 0;
}

int FN(scale)(REAL *x, REAL alpha, int64_t n)
{
    FT_CPU_CHECK_NONNEG("scale", n);
    FT_CPU_CHECK_PTR("scale", x, n);
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= alpha;
    return 0;
}

int FN(sumsq)(double *out, const REAL *x, int64_t n)
{
    FT_CPU_CHECK_NONNEG("sumsq", n);
    FT_CPU_CHECK_PTR("sumsq", x, n);
    FT_CPU_CHECK_PTR("sumsq", out, 1);
    /* At most 1024 blocks whose size depends on n only: the partial sums, and so the
     * result, are the same for any thread count. */
    enum { MAX_BLOCKS = 1024 };
    int64_t bs = FT_CPU_MAX((int64_t)8192, (n + MAX_BLOCKS - 1) / MAX_BLOCKS);
    int64_t nb = (n + bs - 1) / bs;
    double part[MAX_BLOCKS];
#pragma omp parallel for schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i1 = FT_CPU_MIN(n, (b + 1) * bs);
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = b * bs; i < i1; i++) s += (double)x[i] * (double)x[i];
        part[b] = s;
    }
    double s = 0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    *out = s;
    return 0;
}

int FN(bias_add)(REAL *y, const REAL *bias, int64_t T, int64_t O)
{
    FT_CPU_CHECK_NONNEG("bias_add", T);
    FT_CPU_CHECK_NONNEG("bias_add", O);
    FT_CPU_CHECK_PRODUCT("bias_add", T, O);
    FT_CPU_CHECK_PTR("bias_add", y, T * O);
    FT_CPU_CHECK_PTR("bias_add", bias, T > 0 ? O : 0);
#pragma omp parallel for schedule(static) if (T * O > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        REAL *restrict yr = y + t * O;
        const REAL *restrict br = bias;
#pragma omp simd
        for (int64_t o = 0; o < O; o++) yr[o] += br[o];
    }
    return 0;
}

/* ---- embedding ----------------------------------------------------------------------- */

int FN(embedding_fwd)(REAL *out, const int32_t *ids, const REAL *table, int64_t T, int64_t C,
                      int64_t V)
{
    const char *op = "embedding_fwd";
    FT_CPU_CHECK_NONNEG(op, T);
    FT_CPU_CHECK_NONNEG(op, C);
    FT_CPU_CHECK_NONNEG(op, V);
    FT_CPU_CHECK_PRODUCT(op, T, C);
    FT_CPU_CHECK_PRODUCT(op, V, C);
    FT_CPU_CHECK_PTR(op, ids, T);
    FT_CPU_CHECK_PTR(op, out, T * C);
    FT_CPU_CHECK_PTR(op, table, T > 0 ? V * C : 0);
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return ft_err(FT_E_INVALID, "cpu %s: ids[%lld] = %d, expected 0..%lld", op,
                          (long long)t, ids[t], (long long)V - 1);
#pragma omp parallel for schedule(static) if (T * C > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * C, table + (int64_t)ids[t] * C, (size_t)C * sizeof(REAL));
    return 0;
}

/* ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm: y = w * (x * rsqrt(mean x^2 + eps)))
 */

int FN(rmsnorm_fwd)(REAL *y, REAL *rstd, const REAL *x, const REAL *w, int64_t T, int64_t C,
                    REAL eps)
{
    const char *op = "rmsnorm_fwd";
    FT_CPU_CHECK_NONNEG(op, T);
    FT_CPU_CHECK_NONNEG(op, C);
    FT_CPU_CHECK_PRODUCT(op, T, C);
    FT_CPU_CHECK_PTR(op, y, T * C);
    FT_CPU_CHECK_PTR(op, x, T * C);
    FT_CPU_CHECK_PTR(op, rstd, T);
    FT_CPU_CHECK_PTR(op, w, T > 0 ? C : 0);
    if (!(eps >= 0)) return ft_err(FT_E_INVALID, "cpu %s: eps = %g, expected >= 0", op, (double)eps);
    if (C == 0) {
        for (int64_t t = 0; t < T; t++) rstd[t] = 0;
        return 0;
    }
#pragma omp parallel for schedule(static) if (T * C > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const REAL *restrict xr = x + t * C;
        REAL *restrict yr = y + t * C;
        double ss = 0; /* sum of squares in double: C terms of one sign */
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < C; i++) ss += (double)xr[i] * (double)xr[i];
        REAL r = (REAL)(1.0 / sqrt(ss / (double)C + (double)eps));
        rstd[t] = r;
#pragma omp simd
        for (int64_t i = 0; i < C; i++) yr[i] = w[i] * (xr[i] * r);
    }
    return 0;
}

/* y_i = w_i x_i r with r = (mean(x^2) + eps)^(-1/2), dr/dx_i = -r^3 x_i / C, so
 * dx_i = r (dy_i w_i - x_i (r^2 / C) sum_j dy_j w_j x_j). Accumulates into dx. */
int FN(rmsnorm_bwd)(REAL *dx, const REAL *dy, const REAL *x, const REAL *w, const REAL *rstd,
                    int64_t T, int64_t C)
{
    const char *op = "rmsnorm_bwd";
    FT_CPU_CHECK_NONNEG(op, T);
    FT_CPU_CHECK_NONNEG(op, C);
    FT_CPU_CHECK_PRODUCT(op, T, C);
    FT_CPU_CHECK_PTR(op, dx, T * C);
    FT_CPU_CHECK_PTR(op, dy, T * C);
    FT_CPU_CHECK_PTR(op, x, T * C);
    FT_CPU_CHECK_PTR(op, rstd, C > 0 ? T : 0);
    FT_CPU_CHECK_PTR(op, w, T > 0 ? C : 0);
    if (C == 0) return 0;
#pragma omp parallel for schedule(static) if (T * C > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const REAL *restrict xr = x + t * C, *restrict dyr = dy + t * C;
        REAL *restrict dxr = dx + t * C;
        REAL r = rstd[t];
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; i++) s += (double)dyr[i] * (double)w[i] * (double)xr[i];
        REAL c = (REAL)(s * (double)r * (double)r / (double)C);
#pragma omp simd
        for (int64_t i = 0; i < C; i++) dxr[i] += r * (dyr[i] * w[i] - xr[i] * c);
    }
    return 0;
}

/* ---- RoPE, HF rotate-half layout (transformers rotate_half / apply_rotary_pos_emb) ----- */

/* Rotates every head of x (T, H, D) in place by angle sign * pos[t] * inv_freq[i]. The
 * angle and its cos/sin are computed in double (HF computes them in fp32; the difference
 * is the rounding of the angle, ~|angle| * 6e-8 rad). */
static int rope_apply(const char *op, REAL *x, const int32_t *pos, const REAL *inv_freq,
                      int64_t T, int64_t H, int64_t D, double sign)
{
    FT_CPU_CHECK_NONNEG(op, T);
    FT_CPU_CHECK_NONNEG(op, H);
    FT_CPU_CHECK_NONNEG(op, D);
    if (D % 2 != 0 || D > FT_CPU_MAX_HEAD_DIM)
        return ft_err(FT_E_INVALID, "cpu %s: head dim D = %lld, expected even and <= %d", op,
                      (long long)D, FT_CPU_MAX_HEAD_DIM);
    FT_CPU_CHECK_PRODUCT(op, T, H * D);
    FT_CPU_CHECK_PTR(op, x, T * H * D);
    FT_CPU_CHECK_PTR(op, pos, H * D > 0 ? T : 0);
    FT_CPU_CHECK_PTR(op, inv_freq, T * H > 0 ? D / 2 : 0);
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static) if (T * H * D > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        REAL cs[FT_CPU_MAX_HEAD_DIM / 2], sn[FT_CPU_MAX_HEAD_DIM / 2];
        for (int64_t i = 0; i < half; i++) {
            double a = (double)pos[t] * (double)inv_freq[i];
            cs[i] = (REAL)cos(a);
            sn[i] = (REAL)(sign * sin(a));
        }
        for (int64_t h = 0; h < H; h++) {
            REAL *restrict lo = x + (t * H + h) * D;
            REAL *restrict hi = lo + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                REAL x0 = lo[i], x1 = hi[i];
                lo[i] = x0 * cs[i] - x1 * sn[i];
                hi[i] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
    return 0;
}

int FN(rope_fwd)(REAL *x, const int32_t *pos, const REAL *inv_freq, int64_t T, int64_t H,
                 int64_t D)
{
    return rope_apply("rope_fwd", x, pos, inv_freq, T, H, D, 1.0);
}

/* The rotation is orthogonal, so its Jacobian transpose is the rotation by -angle. */
int FN(rope_bwd)(REAL *dx, const int32_t *pos, const REAL *inv_freq, int64_t T, int64_t H,
                 int64_t D)
{
    return rope_apply("rope_bwd", dx, pos, inv_freq, T, H, D, -1.0);
}

/* ---- SwiGLU (Shazeer 2020; HF LlamaMLP: act_fn(gate) * up with act_fn = SiLU) -------- */
/* In-place use (h == gate or h == up; dgate == dh, ...) is allowed: element i is read
 * before it is written and no other element is touched. */

FT_CPU_CLONES int FN(swiglu_fwd)(REAL *h, const REAL *gate, const REAL *up, int64_t n)
{
    FT_CPU_CHECK_NONNEG("swiglu_fwd", n);
    FT_CPU_CHECK_PTR("swiglu_fwd", h, n);
    FT_CPU_CHECK_PTR("swiglu_fwd", gate, n);
    FT_CPU_CHECK_PTR("swiglu_fwd", up, n);
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN / 8)
    for (int64_t i = 0; i < n; i++) {
        REAL g = gate[i];
        REAL s = 1 / (1 + R_EXP(-g)); /* exp overflow -> s = 0, no NaN */
        h[i] = g * s * up[i];
    }
    return 0;
}

/* h = g s(g) u with s' = s (1 - s): dgate = dh u s (1 + g (1 - s)), dup = dh g s. */
FT_CPU_CLONES int FN(swiglu_bwd)(REAL *dgate, REAL *dup, const REAL *dh, const REAL *gate,
                                 const REAL *up, int64_t n)
{
    FT_CPU_CHECK_NONNEG("swiglu_bwd", n);
    FT_CPU_CHECK_PTR("swiglu_bwd", dgate, n);
    FT_CPU_CHECK_PTR("swiglu_bwd", dup, n);
    FT_CPU_CHECK_PTR("swiglu_bwd", dh, n);
    FT_CPU_CHECK_PTR("swiglu_bwd", gate, n);
    FT_CPU_CHECK_PTR("swiglu_bwd", up, n);
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN / 8)
    for (int64_t i = 0; i < n; i++) {
        REAL g = gate[i], u = up[i], d = dh[i];
        REAL s = 1 / (1 + R_EXP(-g));
        dgate[i] = d * u * s * (1 + g * (1 - s));
        dup[i] = d * g * s;
    }
    return 0;
}

/* ---- dropout (mask: cpu_common.h) ----------------------------------------------------- */

FT_CPU_CLONES int FN(dropout)(REAL *y, const REAL *x, int64_t n, REAL p, uint64_t seed)
{
    FT_CPU_CHECK_NONNEG("dropout", n);
    FT_CPU_CHECK_PTR("dropout", y, n);
    FT_CPU_CHECK_PTR("dropout", x, n);
    if (!(p >= 0 && p < 1))
        return ft_err(FT_E_INVALID, "cpu dropout: p = %g, expected 0 <= p < 1", (double)p);
    if (p == 0) {
        if (y != x && n > 0) memmove(y, x, (size_t)n * sizeof(REAL));
        return 0;
    }
    const uint64_t key = ft_dropout_mix64(seed);
    const uint32_t thr = ft_dropout_threshold((double)p);
    const REAL sc = 1 / (1 - p);
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] = ft_dropout_keep(key, (uint64_t)i, thr) ? x[i] * sc : 0;
    return 0;
}

/* ---- LM head + cross-entropy --------------------------------------------------------- */

int FN(lm_head_logits)(REAL *logits, const REAL *x, const REAL *W, int64_t T, int64_t C,
                       int64_t V)
{
    const char *op = "lm_head_logits";
    FT_TRY(blas_int_ok(op, "T", T));
    FT_TRY(blas_int_ok(op, "C", C));
    FT_TRY(blas_int_ok(op, "V", V));
    FT_CPU_CHECK_PTR(op, logits, T * V);
    FT_CPU_CHECK_PTR(op, x, T * C);
    FT_CPU_CHECK_PTR(op, W, V * C);
    return FN(gemm)(0, 1, T, V, C, 1, x, FT_CPU_MAX(C, 1), W, FT_CPU_MAX(C, 1), 0, logits,
                    FT_CPU_MAX(V, 1));
}

/* Rows of one chunk [c0, c1) are handled in sub-blocks of this many rows so that their
 * loss terms fit a stack array and are summed in row order. */
#define CE_SUB 256

/* Softmax of nb rows of logits in place (s = scratch rows), loss terms into rl[]; rows
 * with tgt < 0 are zeroed (their dx is 0). When want_grad, each row becomes
 * grad_scale * (softmax - onehot(target)). */
static void ce_rows(REAL *s, const int32_t *tgt, int64_t nb, int64_t V, REAL grad_scale,
                    int want_grad, double *rl)
{
#pragma omp parallel for schedule(static) if (nb * V > FT_CPU_PAR_MIN)
    for (int64_t r = 0; r < nb; r++) {
        REAL *restrict row = s + r * V;
        if (tgt[r] < 0) {
            rl[r] = 0;
            if (want_grad) memset(row, 0, (size_t)V * sizeof(REAL));
            continue;
        }
        double lt = (double)row[tgt[r]];
        REAL mx = row[0];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; j++) {
            REAL e = R_EXP(row[j] - mx);
            row[j] = e;
            sum += (double)e;
        }
        rl[r] = (double)mx + log(sum) - lt; /* logsumexp - logit[target] */
        if (want_grad) {
            REAL f = (REAL)((double)grad_scale / sum);
#pragma omp simd
            for (int64_t j = 0; j < V; j++) row[j] *= f;
            row[tgt[r]] -= grad_scale;
        }
    }
}

/* Chunks start at a valid row and end at one, so masked prompt spans cost no GEMM; the
 * rows of a chunk are logits = x W^T (one GEMM into scratch), softmax in place, then
 * dx = scratch W (one GEMM). Rows outside every chunk get dx = 0. */
int FN(lm_head_ce)(double *loss_sum, int64_t *n_valid, REAL *dx, const REAL *x, const REAL *W,
                   const int32_t *targets, int64_t T, int64_t C, int64_t V, REAL grad_scale,
                   REAL *scratch, int64_t chunk)
{
    const char *op = "lm_head_ce";
    FT_TRY(blas_int_ok(op, "T", T));
    FT_TRY(blas_int_ok(op, "C", C));
    FT_TRY(blas_int_ok(op, "V", V));
    if (chunk < 1 || chunk > INT_MAX)
        return ft_err(FT_E_INVALID, "cpu %s: chunk = %lld, expected 1..%d", op,
                      (long long)chunk, INT_MAX);
    if (V < 1) return ft_err(FT_E_INVALID, "cpu %s: V = %lld, expected >= 1", op, (long long)V);
    FT_CPU_CHECK_PRODUCT(op, T, C);
    FT_CPU_CHECK_PRODUCT(op, V, C);
    FT_CPU_CHECK_PRODUCT(op, chunk, V);
    FT_CPU_CHECK_PTR(op, loss_sum, 1);
    FT_CPU_CHECK_PTR(op, n_valid, 1);
    FT_CPU_CHECK_PTR(op, targets, T);
    FT_CPU_CHECK_PTR(op, x, T * C);
    FT_CPU_CHECK_PTR(op, W, V * C);
    FT_CPU_CHECK_PTR(op, scratch, T > 0 ? chunk * V : 0);
    int64_t nv = 0;
    for (int64_t t = 0; t < T; t++) {
        if (targets[t] >= V)
            return ft_err(FT_E_INVALID, "cpu %s: targets[%lld] = %d, expected < V = %lld", op,
                          (long long)t, targets[t], (long long)V);
        nv += targets[t] >= 0;
    }
    double loss = 0;
    int64_t t = 0;
    while (t < T) {
        if (targets[t] < 0) {
            if (dx) memset(dx + t * C, 0, (size_t)C * sizeof(REAL));
            t++;
            continue;
        }
        int64_t c0 = t, c1 = FT_CPU_MIN(T, c0 + chunk);
        while (targets[c1 - 1] < 0) c1--; /* stops at c0 at the latest */
        int64_t n = c1 - c0;
        if (C > 0)
            gemm_raw(0, 1, n, V, C, 1, x + c0 * C, C, W, C, 0, scratch, V);
        else
            memset(scratch, 0, (size_t)(n * V) * sizeof(REAL));
        for (int64_t sb = 0; sb < n; sb += CE_SUB) {
            int64_t nb = FT_CPU_MIN((int64_t)CE_SUB, n - sb);
            double rl[CE_SUB];
            ce_rows(scratch + sb * V, targets + c0 + sb, nb, V, grad_scale, dx != NULL, rl);
            for (int64_t r = 0; r < nb; r++) loss += rl[r];
        }
        if (dx && C > 0) gemm_raw(0, 0, n, C, V, 1, scratch, V, W, C, 0, dx + c0 * C, C);
        t = c1;
    }
    *loss_sum = loss;
    *n_valid = nv;
    return 0;
}

#undef CE_SUB

/* ---- AdamW (Loshchilov & Hutter 2019, ICLR; torch.optim.AdamW single-tensor path:
 * param.mul_(1 - lr*wd); m = b1 m + (1-b1) g (torch: m.lerp_(g, 1-b1), equal up to
 * rounding); v = b2 v + (1-b2) g^2; denom = sqrt(v) / sqrt(1 - b2^step) + eps;
 * param -= lr / (1 - b1^step) * m / denom). Bias corrections are computed in double. --- */

int FN(adamw)(REAL *p, const REAL *g, REAL *m, REAL *v, int64_t n, REAL lr, REAL beta1,
              REAL beta2, REAL eps, REAL weight_decay, int64_t step)
{
    const char *op = "adamw";
    FT_CPU_CHECK_NONNEG(op, n);
    FT_CPU_CHECK_PTR(op, p, n);
    FT_CPU_CHECK_PTR(op, g, n);
    FT_CPU_CHECK_PTR(op, m, n);
    FT_CPU_CHECK_PTR(op, v, n);
    if (step < 1)
        return ft_err(FT_E_INVALID, "cpu %s: step = %lld, expected >= 1", op, (long long)step);
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
        return ft_err(FT_E_INVALID, "cpu %s: beta1 = %g, beta2 = %g, expected in [0, 1)", op,
                      (double)beta1, (double)beta2);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    const REAL step_size = (REAL)((double)lr / bc1);
    const REAL bc2_sqrt = (REAL)sqrt(bc2);
    const REAL decay = (REAL)(1.0 - (double)lr * (double)weight_decay);
    const REAL one_b1 = 1 - beta1, one_b2 = 1 - beta2;
#pragma omp parallel for simd schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        REAL gi = g[i];
        REAL mi = beta1 * m[i] + one_b1 * gi;
        REAL vi = beta2 * v[i] + one_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        REAL denom = R_SQRT(vi) / bc2_sqrt + eps;
        p[i] = p[i] * decay - step_size * mi / denom;
    }
    return 0;
}

#undef GEMM_PAR_MIN
#undef REAL
#undef FN
#undef R_EXP
#undef R_SQRT
