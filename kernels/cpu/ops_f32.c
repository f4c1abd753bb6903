/* ops_f32.c - the fp32 instance of the CPU ops (the CPU backend's math): the bodies in
 * ops_impl.h and attn_impl.h compiled with float and cblas_sgemm. */

/* FP operations never trap in ftune (no feenableexcept anywhere), so GCC may if-convert
 * and vectorize float selects and floorf (the exp in the softmax and SiLU loops). Results
 * are the same; only the floating-point exception flags could differ. */
#pragma GCC optimize("no-trapping-math")

#include "kernels/cpu/cpu_f32.h"

#include <math.h>

#define FT_CPU_REAL float
#define FT_CPU_SUFFIX f32
#define FT_CPU_GEMM cblas_sgemm
#define FT_CPU_GEMV cblas_sgemv
#define FT_CPU_EXP ft_cpu_expf
#define FT_CPU_SQRT sqrtf
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
