/* cpu_common.h - helpers shared by the two instances of the CPU ops (ops_impl.h,
 * attn_impl.h) and the dropout mask and NEFTune noise definitions that every backend must
 * reproduce.
 *
 * Dropout mask (counter-based, so forward and backward regenerate the same mask from the
 * seed without storing it, and any thread or device can compute element i on its own):
 *     key     = splitmix64_mix(seed)
 *     u_i     = splitmix64_mix(key ^ i) >> 40            (24-bit integer, uniform)
 *     keep[i] = u_i >= p * 2^24                           (P(keep) = 1 - p, exact for p = k/2^24)
 * splitmix64_mix is the output function of Steele, Lea & Flood, "Fast splittable
 * pseudorandom number generators" (OOPSLA 2014), as in Vigna's splitmix64.c: add the golden
 * gamma 0x9E3779B97F4A7C15, then the two xor-shift-multiply rounds (constants
 * 0xBF58476D1CE4E5B9, 0x94D049BB133111EB). Hashing the seed first makes the masks of two
 * seeds unrelated (with seed ^ i directly, seeds 0 and 1 would give the same mask with
 * neighbouring elements swapped).
 * The NEFTune noise (kernels.h noise_uniform_add) reuses the 24-bit draw k_i: its value is
 * k_i 2^-23 - 1, uniform in [-1, 1) (ft_noise_uniform).
 */
#ifndef FT_CPU_COMMON_H
#define FT_CPU_COMMON_H

#include <math.h>
#include <stdint.h>

#include "src/core/err.h"

#ifndef FT_HD
#define FT_HD /* __host__ __device__ when a CUDA file includes this header */
#endif

/* Elementwise loops whose every output is one sequence of roundings with no reduction (and
 * no contraction into FMA: ISO C mode, -std=c11, leaves -ffp-contract off), so that any vector
 * width gives the same bits: compiled for x86-64-v4 (AVX-512) and v3 (AVX2) beside the
 * baseline, the variant picked once at load by the CPU (GCC target_clones, an ifunc). The
 * build's baseline is x86-64-v2 (SSE4.2), for any x86-64 machine; dropout's 64-bit hash runs
 * 6.5x faster with AVX-512 (0.50 -> 3.28 Gelem/s, one core of the project's VM). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define FT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FT_CPU_CLONES
#endif

/* splitmix64 output function of the state z (see the file comment). */
static inline FT_HD uint64_t ft_dropout_mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Keep threshold for drop probability p in [0, 1): keep element i iff its 24-bit draw u_i
 * is >= p * 2^24, that is (u_i an integer) u_i >= ceil(p * 2^24), this value (at most 2^24;
 * the integer compare spares a conversion to double per element). */
static inline FT_HD uint32_t ft_dropout_threshold(double p) { return (uint32_t)ceil(p * 16777216.0); }

/* 1 if element i is kept under key = ft_dropout_mix64(seed) and threshold thr. */
static inline FT_HD int ft_dropout_keep(uint64_t key, uint64_t i, uint32_t thr)
{
    return (uint32_t)(ft_dropout_mix64(key ^ i) >> 40) >= thr;
}

/* NEFTune noise draw (kernels.h noise_uniform_add) of element i under key =
 * ft_dropout_mix64(seed): the same 24-bit draw k as the dropout mask, as k * 2^-23 - 1, a
 * value in [-1, 1) on a grid of 2^-23 (mean -2^-24, variance 1/3 up to 2^-46). Every step
 * is exact in fp32 (k < 2^24 converts exactly, the product is a power-of-two scaling, the
 * difference has at most 24 significant bits), so a fused multiply-add gives the same. */
static inline FT_HD float ft_noise_uniform(uint64_t key, uint64_t i)
{
    return (float)(uint32_t)(ft_dropout_mix64(key ^ i) >> 40) * 0x1p-23f - 1.0f;
}

/* ---- internal to kernels/cpu ------------------------------------------------------- */

/* exp(x) for float, written so that `omp simd` loops vectorize it (libm expf is an opaque
 * call). Cephes expf (S. L. Moshier, Cephes Math Library 2.2, expf.c): n = round(x/ln2),
 * r = x - n ln2 with ln2 split in two (0.693359375 - 2.12194440e-4), exp(r) = 1 + r +
 * r^2 P(r) with Cephes' degree-5 P, result = exp(r) * 2^n built in the exponent bits.
 * Accuracy: max rel error ~2 ulp (tested in test_kernels_fwd.c). x < -87.33 (below the
 * smallest normal, including -inf) gives 0; x > 88 is clamped to 88 (exp = 1.65e38, never
 * inf); NaN gives NaN. Its loops vectorize only with -fno-trapping-math (set per file by
 * the pragma in ops_f32.c). */
static inline float ft_cpu_expf(float x)
{
    const float lo = -87.3365447504f, hi = 88.0f;
    const int under = x < lo;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const float nc = n == n ? n : 0.0f; /* NaN x: n is NaN, converting it would be UB */
    uint32_t bits = (uint32_t)((int32_t)nc + 127) << 23; /* 2^n, n in [-126, 127] */
    float s;
    __builtin_memcpy(&s, &bits, sizeof s);
    return under ? 0.0f : p * s;
}

#define FT_CPU_CAT_(a, b) a##_##b
#define FT_CPU_CAT(a, b) FT_CPU_CAT_(a, b)

/* Below this many elements of work a loop runs on the calling thread only: waking the
 * OpenMP team costs a few microseconds. */
#define FT_CPU_PAR_MIN 32768

#define FT_CPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FT_CPU_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Argument checks used at the top of every op; `op` is the op's name. */
#define FT_CPU_CHECK_NONNEG(op, v)                                                          \
    do {                                                                                    \
        if ((v) < 0)                                                                        \
            return ft_err(FT_E_INVALID, "cpu %s: %s = %lld, expected >= 0", op, #v,         \
                          (long long)(v));                                                  \
    } while (0)

#define FT_CPU_CHECK_PTR(op, p, count)                                                      \
    do {                                                                                    \
        if ((count) > 0 && !(p))                                                            \
            return ft_err(FT_E_INVALID, "cpu %s: %s is NULL, expected %lld elements", op,   \
                          #p, (long long)(count));                                          \
    } while (0)

/* a * b without int64 overflow (both >= 0), else FT_E_INVALID. */
#define FT_CPU_CHECK_PRODUCT(op, a, b)                                                      \
    do {                                                                                    \
        if ((b) > 0 && (a) > INT64_MAX / 8 / (b))                                           \
            return ft_err(FT_E_INVALID, "cpu %s: %s * %s = %lld * %lld overflows", op, #a,  \
                          #b, (long long)(a), (long long)(b));                              \
    } while (0)

#endif
