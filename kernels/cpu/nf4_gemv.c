/* nf4_gemv.c - y = x W^T for a few rows x and an NF4 weight W read in place (nf4_gemv.h).
 *
 * Per output row o and per block b of the row (blocksize elements, bs / 2 bytes, the first
 * element in the high nibble: bitsandbytes' order, src/numeric/nf4.h):
 *     s_t = sum_j code[byte_j >> 4] * x_t[2j] + code[byte_j & 15] * x_t[2j + 1]
 *     y_t[o] += absmax[b] * s_t
 * with the block absmax computed as nf4.c computes it (nested: map[q] * nested_absmax, then
 * + offset, two fp32 roundings). The activation rows are first split into their even and odd
 * elements, so that the high and low nibbles of consecutive bytes meet contiguous x values.
 * The AVX2 path looks the 16-entry code up with two 8-lane permutes and a blend on bit 3 of
 * the nibble; the portable path with a 256-entry table of byte -> (high, low) values. The
 * order of the sums is fixed by the shape (each row is summed by one thread, in the same order
 * whatever the other rows of x), so the result depends neither on the thread count nor on the
 * rows computed with it; the two paths round differently. Only x86-64 builds have the AVX2
 * path (elsewhere _AVX2 is refused and _AUTO takes the portable one).
 *
 * offload/exec.c reads NF4 in place for generation visits of up to 8 tokens, where this
 * kernel beats dequantize + sgemm (bench/results/code-measurements.md). */
#include "kernels/cpu/nf4_gemv.h"

#include <string.h>

#include "kernels/cpu/simd_x86.h"
#include "src/core/err.h"

int ft_cpu_nf4_gemv_ok(const ft_nf4_tensor *t, int64_t out, int64_t in)
{
    return t && out > 0 && in > 0 && t->n == out * in && t->blocksize >= 16 &&
           t->blocksize % 16 == 0 && in % 16 == 0 && t->codes && t->code &&
           (t->nested_blocksize > 0 ? t->qabsmax && t->nested_absmax && t->nested_map
                                    : t->nested_blocksize == 0 && t->absmax);
}

/* absmax of block b, nf4.c's block_absmax on the kernels.h description. */
static inline float block_absmax(const ft_nf4_tensor *t, int64_t b)
{
    if (!t->nested_blocksize) return t->absmax[b];
    float a = t->nested_map[t->qabsmax[b]] * t->nested_absmax[b / t->nested_blocksize];
    return a + t->offset;
}

/* ---- portable C ------------------------------------------------------------------------ */

/* The next block of row o as a segment [*j0, *j1) of the row's bytes (elements 2j and 2j + 1
 * are in byte j) and its absmax *a, from element *e (o * in at the start; advanced). A block
 * may span two or more rows, but every boundary is a multiple of 16 elements
 * (ft_cpu_nf4_gemv_ok), so a segment is whole groups of 8 bytes (the AVX2 loads).
 * Returns 0 past the row's end. */
static inline int segment(const ft_nf4_tensor *t, int64_t o, int64_t in, int64_t *e, int64_t *j0,
                          int64_t *j1, float *a)
{
    const int64_t row = o * in, end = row + in;
    if (*e >= end) return 0;
    const int64_t b = *e / t->blocksize, next = (b + 1) * t->blocksize < end ? (b + 1) * t->blocksize : end;
    *j0 = (*e - row) / 2;
    *j1 = (next - row) / 2;
    *a = block_absmax(t, b);
    *e = next;
    return 1;
}

/* res[i] (i < T) = row o of W times row i of x, given as its even elements xe and odd ones
 * xo (T, h = in / 2). hi/lo: the code of the high and low nibble of each byte value. */
static void row_c(const ft_nf4_tensor *t, int64_t o, int64_t in, const float *xe,
                  const float *xo, int64_t T, const float *hi, const float *lo, float *res)
{
    const int64_t h = in / 2;
    const uint8_t *cb = t->codes + o * h;
    for (int64_t i = 0; i < T; i++) res[i] = 0.0f;
    int64_t e0 = o * in, j0, j1;
    float a;
    while (segment(t, o, in, &e0, &j0, &j1, &a)) {
        for (int64_t i = 0; i < T; i++) {
            const float *e = xe + i * h, *d = xo + i * h;
            float s0 = 0.0f, s1 = 0.0f;
            for (int64_t j = j0; j < j1; j++) {
                s0 += hi[cb[j]] * e[j];
                s1 += lo[cb[j]] * d[j];
            }
            res[i] += (s0 + s1) * a;
        }
    }
}

/* ---- AVX2 + FMA -------------------------------------------------------------------------- */

#ifdef FT_CPU_X86

/* The code values of the 8 nibbles in v (0..15 each): entries 0-7 from c0, 8-15 from c1. */
static inline FT_AVX2 __m256 lut16(__m256i v, __m256 c0, __m256 c1)
{
    __m256 lo = _mm256_permutevar8x32_ps(c0, v), hi = _mm256_permutevar8x32_ps(c1, v);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));
}

/* row_c for a constant T (1 or 2, inlined per value): 16 weights per step, decoded once for the
 * T rows of x. Each row sums the high and the low nibbles in two accumulators (two chains of
 * FMAs: 2T chains), added at the end of each block segment and
 * scaled by its absmax, so every row is summed in the same order whatever T is: a row's
 * result does not depend on the rows computed with it (batched decoding gives the bits of
 * one-row decoding). */
static inline FT_AVX2 __attribute__((always_inline)) void
row_avx2_t(const ft_nf4_tensor *t, int64_t o, int64_t in, const float *xe, const float *xo,
           const int T, __m256 c0, __m256 c1, float *res)
{
    const int64_t h = in / 2;
    const uint8_t *cb = t->codes + o * h;
    const __m256i m15 = _mm256_set1_epi32(15);
    __m256 acc[2];
    for (int i = 0; i < T; i++) acc[i] = _mm256_setzero_ps();
    int64_t e0 = o * in, j0, j1;
    float a;
    while (segment(t, o, in, &e0, &j0, &j1, &a)) {
        __m256 sh[2], sl[2];
        for (int i = 0; i < T; i++) sh[i] = sl[i] = _mm256_setzero_ps();
        for (int64_t j = j0; j < j1; j += 8) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(cb + j)));
            __m256 wh = lut16(_mm256_srli_epi32(v, 4), c0, c1);
            __m256 wl = lut16(_mm256_and_si256(v, m15), c0, c1);
            for (int i = 0; i < T; i++) {
                sh[i] = _mm256_fmadd_ps(wh, _mm256_loadu_ps(xe + i * h + j), sh[i]);
                sl[i] = _mm256_fmadd_ps(wl, _mm256_loadu_ps(xo + i * h + j), sl[i]);
            }
        }
        const __m256 av = _mm256_set1_ps(a);
        for (int i = 0; i < T; i++) acc[i] = _mm256_fmadd_ps(_mm256_add_ps(sh[i], sl[i]), av, acc[i]);
    }
    for (int i = 0; i < T; i++) res[i] = ft_hsum8(acc[i]);
}


/* The rows of x two at a time: one decode of the weights for both, four FMA chains. With four
 * rows (eight chains, the absmax-scaled sums and the LUT registers) the loop spills, and two
 * passes of two were faster (bench/results/code-measurements.md). */
static FT_AVX2 void row_avx2(const ft_nf4_tensor *t, int64_t o, int64_t in, const float *xe,
                             const float *xo, int64_t T, float *res)
{
    const __m256 c0 = _mm256_loadu_ps(t->code), c1 = _mm256_loadu_ps(t->code + 8);
    const int64_t h = in / 2;
    int64_t i = 0;
    for (; i + 1 < T; i += 2) row_avx2_t(t, o, in, xe + i * h, xo + i * h, 2, c0, c1, res + i);
    if (i < T) row_avx2_t(t, o, in, xe + i * h, xo + i * h, 1, c0, c1, res + i);
}

#endif

/* ---- the entry ----------------------------------------------------------------------------- */

#define ROWS_MAX 64 /* rows of x per pass (res is on the stack) */

int ft_cpu_nf4_gemv(float *y, const float *x, const ft_nf4_tensor *t, int64_t T, int64_t out,
                    int64_t in, float beta, float *scratch)
{
    return ft_cpu_nf4_gemv_path(y, x, t, T, out, in, beta, scratch, FT_NF4_GEMV_AUTO);
}

int ft_cpu_nf4_gemv_path(float *y, const float *x, const ft_nf4_tensor *t, int64_t T,
                         int64_t out, int64_t in, float beta, float *scratch, int path)
{
    if (T < 0 || out < 0 || in < 0)
        return ft_err(FT_E_INVALID, "nf4 gemv: T = %lld, out = %lld, in = %lld", (long long)T,
                      (long long)out, (long long)in);
    if (path != FT_NF4_GEMV_AUTO && path != FT_NF4_GEMV_PORTABLE && path != FT_NF4_GEMV_AVX2)
        return ft_err(FT_E_INVALID, "nf4 gemv: code path %d", path);
    if (!T || !out) return 0;
    if (!y || !x || !t || !scratch) return ft_err(FT_E_INVALID, "nf4 gemv: NULL y, x, W or scratch");
    if (!ft_cpu_nf4_gemv_ok(t, out, in))
        return ft_err(FT_E_UNSUPPORTED, "nf4 gemv: an NF4 weight of %lld values (blocksize %lld) "
                      "for %lld x %lld", (long long)t->n, (long long)t->blocksize, (long long)out,
                      (long long)in);
    const int64_t h = in / 2;
    const int have = ft_cpu_have_avx2();
    if (path == FT_NF4_GEMV_AVX2 && !have)
        return ft_err(FT_E_UNSUPPORTED, "nf4 gemv: this CPU has no AVX2 and FMA");
    const int avx2 = path == FT_NF4_GEMV_AVX2 || (path == FT_NF4_GEMV_AUTO && have);
    (void)avx2; /* read only where the AVX2 path is compiled */
    float hi[256], lo[256];
    for (int b = 0; b < 256; b++) {
        hi[b] = t->code[b >> 4];
        lo[b] = t->code[b & 15];
    }
    for (int64_t r0 = 0; r0 < T; r0 += ROWS_MAX) {
        const int64_t n = T - r0 < ROWS_MAX ? T - r0 : ROWS_MAX;
        float *xe = scratch, *xo = scratch + n * h;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < h; j++) {
                xe[i * h + j] = x[(r0 + i) * in + 2 * j];
                xo[i * h + j] = x[(r0 + i) * in + 2 * j + 1];
            }
        float *yr = y + r0 * out;
#pragma omp parallel for schedule(static) if (out * in * n > 65536)
        for (int64_t o = 0; o < out; o++) {
            float res[ROWS_MAX];
#ifdef FT_CPU_X86
            if (avx2) row_avx2(t, o, in, xe, xo, n, res);
            else
#endif
                row_c(t, o, in, xe, xo, n, hi, lo, res);
            for (int64_t i = 0; i < n; i++) {
                float *yo = &yr[i * out + o];
                *yo = beta == 0.0f ? res[i] : res[i] + beta * *yo;
            }
        }
    }
    return 0;
}
