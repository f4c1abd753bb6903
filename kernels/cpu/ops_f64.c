/* ops_f64.c - the fp64 instance of the CPU ops (tests only, see cpu_f64.h): the bodies in
 * ops_impl.h and attn_impl.h compiled with double and cblas_dgemm. */

/* FP operations never trap in ftune (no feenableexcept anywhere), so GCC may if-convert
 * and vectorize float selects and floorf (the exp in the softmax and SiLU loops). Results
 * are the same; only the floating-point exception flags could differ. */
#pragma GCC optimize("no-trapping-math")

#include "kernels/cpu/cpu_f64.h"

#include <math.h>

#define FT_CPU_REAL double
#define FT_CPU_SUFFIX f64
#define FT_CPU_GEMM cblas_dgemm
#define FT_CPU_GEMV cblas_dgemv
#define FT_CPU_EXP exp
#define FT_CPU_SQRT sqrt
#include "kernels/cpu/ops_impl.h"
#include "kernels/cpu/attn_impl.h"
