/* rows_f32.h - the CPU product of a few activation rows with a wide fp32 or bf16 weight, each
 * weight row read once for all of them: the LM head of a decode step (one row per sequence
 * decoded), where OpenBLAS's sgemm packs the whole (V, C) weight for every call (2.5-3x slower
 * on the 2-core VM, see rows_f32.c). Body: rows_f32.c. */
#ifndef FT_CPU_ROWS_F32_H
#define FT_CPU_ROWS_F32_H

#include <stdint.h>

/* Most rows of x the CPU backend's lm_head_logits sends here (more go to sgemm). */
#define FT_CPU_ROWS_F32_MAX 16

enum { FT_ROWS_F32_AUTO = 0, FT_ROWS_F32_PORTABLE = 1, FT_ROWS_F32_AVX2 = 2 };

/* y (T, V) = x (T, C) W^T, fp32, W (V, C) row-major. Each output is one row of W times one
 * row of x summed in a fixed order that depends only on C (and the code path), so a row's
 * result does not depend on T, on the rows computed with it or on the thread count. Output
 * columns (rows of W) run in parallel (OpenMP); AVX2+FMA where the CPU has it (checked at run
 * time, x86-64 builds; 8 lanes summed at the end), else portable C (one sequential sum); the
 * two paths round differently. path: FT_ROWS_F32_AUTO, or one path for tests. Returns 0 (nothing
 * is read when T or V is 0), FT_E_INVALID (a NULL pointer, a negative size, an unknown path),
 * FT_E_UNSUPPORTED (FT_ROWS_F32_AVX2 on a CPU without it). */
int ft_cpu_rows_f32(float *y, const float *x, const float *W, int64_t T, int64_t C, int64_t V,
                    int path);

/* ft_cpu_rows_f32 with W (V, C) stored as bf16 (uint16_t: the upper half of the fp32 bits, as
 * kernels.h FT_WTYPE_BF16), each weight widened to fp32 where it is loaded (exact), with the same
 * sums in the same order: y is bit for bit ft_cpu_rows_f32's on the widened W (same path),
 * reading 2 bytes a weight instead of 4 (the CPU's lm_head_logits_bf16). Same returns. */
int ft_cpu_rows_bf16(float *y, const float *x, const uint16_t *W, int64_t T, int64_t C, int64_t V,
                     int path);

#endif
