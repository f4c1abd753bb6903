/* cpu_f64.h - the fp64 instance of the CPU ops (ft_cpu_<op>_f64): the same bodies as the
 * backend's fp32 ops, compiled with double (gemm through cblas_dgemm). Internal: used by
 * the finite-difference tests (tests/unit/test_kernels_grad.c) and as the reference the
 * fp32 ops are checked against (tests/unit/test_kernels_fwd.c). Declarations and argument
 * rules: ops_decl.h; semantics: kernels/kernels.h. */
#ifndef FT_CPU_F64_H
#define FT_CPU_F64_H

#define FT_CPU_REAL double
#define FT_CPU_SUFFIX f64
#include "kernels/cpu/ops_decl.h"
#undef FT_CPU_REAL
#undef FT_CPU_SUFFIX

#endif
