/* rows_f32.c - y = x W^T for a few fp32 rows x and a wide W stored as fp32 or bf16, each row
 * of W read once (rows_f32.h).
 *
 * Per row v of W, the T rows of x are taken four at a time; each of them has one
 * accumulator (8 lanes of FMAs over C in order, then the lanes summed, then the C % 8 tail in
 * order), so its sum is the same whatever the other rows. The portable path sums each dot
 * product in one sequential loop. A bf16 W is the same code with each weight widened to fp32
 * where it is loaded (exact: the bf16 bits are the upper half of the fp32 ones), so its
 * results are the fp32 kernel's on the widened W, bit for bit, at half the weight bytes.
 *
 * Its speed against OpenBLAS sgemm on the LM head: bench/results/code-measurements.md. */
#include "kernels/cpu/rows_f32.h"

#include <string.h>

#include "kernels/cpu/simd_x86.h"
#include "src/core/err.h"

/* Weight k of row w, fp32 (bf16 = 0) or bf16 widened (bf16 = 1; a constant at every call). */
static inline __attribute__((always_inline)) float w_at(const void *w, int64_t k, const int bf16)
{
    if (!bf16) return ((const float *)w)[k];
    const uint32_t u = (uint32_t)((const uint16_t *)w)[k] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- portable C ------------------------------------------------------------------------ */

static inline __attribute__((always_inline)) void
row_c(const void *w, const float *x, int64_t T, int64_t C, float *res, const int bf16)
{
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * C;
        float s = 0.0f;
        for (int64_t c = 0; c < C; c++) s += w_at(w, c, bf16) * xt[c];
        res[t] = s;
    }
}

/* ---- AVX2 + FMA -------------------------------------------------------------------------- */

#ifdef FT_CPU_X86

/* Weights c .. c+7 of row w as 8 fp32 lanes. */
static inline FT_AVX2 __attribute__((always_inline)) __m256 w_load8(const void *w, int64_t c,
                                                                     const int bf16)
{
    if (!bf16) return _mm256_loadu_ps((const float *)w + c);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + c));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* res[i] (i < N, N constant 1..4: inlined per value) = w . x_i, one accumulator per row. */
static inline FT_AVX2 __attribute__((always_inline)) void
dots(const void *w, const float *x, int64_t C, const int N, float *res, const int bf16)
{
    __m256 a[4];
    for (int i = 0; i < N; i++) a[i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) {
        const __m256 wv = w_load8(w, c, bf16);
        for (int i = 0; i < N; i++) a[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * C + c), a[i]);
    }
    for (int i = 0; i < N; i++) {
        float s = ft_hsum8(a[i]);
        for (int64_t k = c; k < C; k++) s += w_at(w, k, bf16) * x[i * C + k];
        res[i] = s;
    }
}

static inline FT_AVX2 __attribute__((always_inline)) void
row_avx2(const void *w, const float *x, int64_t T, int64_t C, float *res, const int bf16)
{
    for (int64_t t = 0; t < T; t += 4) {
        const float *xt = x + t * C;
        switch (T - t < 4 ? T - t : 4) {
        case 1: dots(w, xt, C, 1, res + t, bf16); break;
        case 2: dots(w, xt, C, 2, res + t, bf16); break;
        case 3: dots(w, xt, C, 3, res + t, bf16); break;
        default: dots(w, xt, C, 4, res + t, bf16); break;
        }
    }
}

static FT_AVX2 void row_avx2_f32(const void *w, const float *x, int64_t T, int64_t C, float *res)
{
    row_avx2(w, x, T, C, res, 0);
}

static FT_AVX2 void row_avx2_bf16(const void *w, const float *x, int64_t T, int64_t C, float *res)
{
    row_avx2(w, x, T, C, res, 1);
}

#endif

static void row_c_f32(const void *w, const float *x, int64_t T, int64_t C, float *res)
{
    row_c(w, x, T, C, res, 0);
}

static void row_c_bf16(const void *w, const float *x, int64_t T, int64_t C, float *res)
{
    row_c(w, x, T, C, res, 1);
}

/* ---- the entries --------------------------------------------------------------------------- */

#define ROWS_PASS 64 /* rows of x per pass (res is on the stack) */

/* y = x W^T with W's rows of esz bytes per weight (4: fp32, 2: bf16); what both entries check
 * and run. */
static int rows(const char *op, float *y, const float *x, const void *W, int64_t T, int64_t C,
                int64_t V, int path, int bf16)
{
    if (T < 0 || C < 0 || V < 0)
        return ft_err(FT_E_INVALID, "%s: T = %lld, C = %lld, V = %lld", op, (long long)T,
                      (long long)C, (long long)V);
    if (path != FT_ROWS_F32_AUTO && path != FT_ROWS_F32_PORTABLE && path != FT_ROWS_F32_AVX2)
        return ft_err(FT_E_INVALID, "%s: code path %d", op, path);
    if (!T || !V) return 0;
    if (!y || !x || !W) return ft_err(FT_E_INVALID, "%s: NULL y, x or W", op);
    const int have = ft_cpu_have_avx2();
    if (path == FT_ROWS_F32_AVX2 && !have)
        return ft_err(FT_E_UNSUPPORTED, "%s: this CPU has no AVX2 and FMA", op);
    const int avx2 = path == FT_ROWS_F32_AVX2 || (path == FT_ROWS_F32_AUTO && have);
    void (*row)(const void *, const float *, int64_t, int64_t, float *) =
        bf16 ? row_c_bf16 : row_c_f32;
#ifdef FT_CPU_X86
    if (avx2) row = bf16 ? row_avx2_bf16 : row_avx2_f32;
#else
    (void)avx2;
#endif
    const size_t row_bytes = (size_t)C * (bf16 ? sizeof(uint16_t) : sizeof(float));
    for (int64_t r0 = 0; r0 < T; r0 += ROWS_PASS) {
        const int64_t n = T - r0 < ROWS_PASS ? T - r0 : ROWS_PASS;
        const float *xr = x + r0 * C;
        float *yr = y + r0 * V;
#pragma omp parallel for schedule(static) if (V * C * n > 65536)
        for (int64_t v = 0; v < V; v++) {
            float res[ROWS_PASS];
            row((const char *)W + (size_t)v * row_bytes, xr, n, C, res);
            for (int64_t i = 0; i < n; i++) yr[i * V + v] = res[i];
        }
    }
    return 0;
}

int ft_cpu_rows_f32(float *y, const float *x, const float *W, int64_t T, int64_t C, int64_t V,
                    int path)
{
    return rows("rows_f32", y, x, W, T, C, V, path, 0);
}

int ft_cpu_rows_bf16(float *y, const float *x, const uint16_t *W, int64_t T, int64_t C, int64_t V,
                     int path)
{
    return rows("rows_bf16", y, x, W, T, C, V, path, 1);
}
