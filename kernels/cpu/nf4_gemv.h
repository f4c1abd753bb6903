/* nf4_gemv.h - the CPU product of a few activation rows with an NF4 weight read in place
 * (4.5 bits per weight read from memory with fp32 absmax, about 4.1 double-quantized, instead
 * of the 32 of a dequantized fp32 copy): generation's decode step over a QLoRA base
 * (offload/exec.c hands the pack's NF4 blocks to the CPU backend's linear_fwd for forwards of
 * a few tokens). Body: nf4_gemv.c. */
#ifndef FT_CPU_NF4_GEMV_H
#define FT_CPU_NF4_GEMV_H

#include <stdint.h>

#include "kernels/kernels.h"

/* 1 when ft_cpu_nf4_gemv takes W (out, in) = t: t->n == out * in, in and blocksize multiples
 * of 16 (every row and block boundary falls between two groups of 8 code bytes; a block may
 * span two or more rows), the buffers of t's kind (nested or not) present; else 0. Every shape
 * ft_nf4_fusable (kernels.h) accepts qualifies. */
int ft_cpu_nf4_gemv_ok(const ft_nf4_tensor *t, int64_t out, int64_t in);

/* y (T, out) = x (T, in) W^T + beta * y, fp32, W (out, in) the NF4 tensor t (kernels.h;
 * bitsandbytes' layout and block absmax arithmetic, src/numeric/nf4.h). Each output is
 * sum over the row's blocks b of absmax[b] * (sum over i in b of code[q_i] * x_i), in fp32:
 * the dequantized weights' product up to fp32 rounding (the absmax is factored out of each
 * block), not bit-identical to ft_nf4_dequant followed by sgemm. beta 0 overwrites y (a NaN
 * there is not read); otherwise y's values, NaN included, enter the sum. scratch:
 * min(T, 64) * in floats (at most 64 rows of x per pass, split into even and odd elements);
 * x, y and scratch must not overlap. Output rows run in parallel (OpenMP); AVX2+FMA where the CPU has
 * it (checked at run time, x86-64 builds), else portable C; the result does not depend on
 * the thread count. Returns 0 (nothing is read when T or out is 0), FT_E_INVALID (a NULL
 * pointer, a negative size) or FT_E_UNSUPPORTED (!ft_cpu_nf4_gemv_ok). */
int ft_cpu_nf4_gemv(float *y, const float *x, const ft_nf4_tensor *t, int64_t T, int64_t out,
                    int64_t in, float beta, float *scratch);

/* ft_cpu_nf4_gemv with the code path chosen (tests, benches): FT_NF4_GEMV_AUTO as above,
 * _PORTABLE the C loop, _AVX2 the AVX2 one (FT_E_UNSUPPORTED on a CPU or build without AVX2 +
 * FMA); another value -> FT_E_INVALID. */
enum { FT_NF4_GEMV_AUTO = 0, FT_NF4_GEMV_PORTABLE = 1, FT_NF4_GEMV_AVX2 = 2 };
int ft_cpu_nf4_gemv_path(float *y, const float *x, const ft_nf4_tensor *t, int64_t T,
                         int64_t out, int64_t in, float beta, float *scratch, int path);

#endif
