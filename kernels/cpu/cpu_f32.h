/* cpu_f32.h - the fp32 instance of the CPU ops (ft_cpu_<op>_f32), which the CPU backend's
 * op table (backend.c) forwards to. Declarations and argument rules: ops_decl.h;
 * semantics: kernels/kernels.h. */
#ifndef FT_CPU_F32_H
#define FT_CPU_F32_H

#define FT_CPU_REAL float
#define FT_CPU_SUFFIX f32
#include "kernels/cpu/ops_decl.h"
#undef FT_CPU_REAL
#undef FT_CPU_SUFFIX

#endif
