/* simd_x86.h - what the CPU kernels with an AVX2+FMA path share (nf4_gemv.c, rows_f32.c): the
 * run-time check, the function attribute that compiles one function for AVX2+FMA inside a
 * baseline (x86-64-v2) build, and the horizontal sum of 8 lanes. FT_CPU_X86 is defined where
 * the AVX2 paths are compiled (x86-64 GCC/Clang builds); elsewhere ft_cpu_have_avx2() is 0. */
#ifndef FT_CPU_SIMD_X86_H
#define FT_CPU_SIMD_X86_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FT_CPU_X86 1
#define FT_AVX2 __attribute__((target("avx2,fma")))

/* 1 when this CPU runs AVX2 and FMA. */
static inline int ft_cpu_have_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* v[0] + ... + v[7], pairwise (halves, then pairs, then the last two). */
static inline FT_AVX2 float ft_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
static inline int ft_cpu_have_avx2(void) { return 0; }
#endif

#endif
