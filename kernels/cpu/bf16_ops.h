/* bf16_ops.h - the CPU twins of the fused bf16 activation ops and of the multi-tensor AdamW
 * (kernels.h: adamw_multi, add_rmsnorm_bf16_fwd/bwd, rope_qk_bf16, swiglu_bf16_fwd/bwd; the same
 * contracts without the backend argument). They are the references of the CUDA kernels
 * (kernels/cuda/adamw_multi.cu, bf16_ops.cu): each writes the kernel's arithmetic in the same
 * order (the RMSNorm row sums as 32 lane partial sums and a butterfly), so the emulation tests
 * (tests/emu) compare bit for bit. bf16 is src/numeric/quant.h's (round to nearest even).
 * Every function returns 0 or FT_E_INVALID with one ft_err line naming the op and argument. */
#ifndef FT_CPU_BF16_OPS_H
#define FT_CPU_BF16_OPS_H

#include <stdint.h>

#include "kernels/kernels.h"

/* Row ops take C a multiple of this (8 bf16: one 16-byte load per lane on CUDA). */
#define FT_BF16_ROW_GROUP 8
/* Lanes of the fixed-order row sums (one CUDA warp). */
#define FT_BF16_ROW_LANES 32

int ft_cpu_adamw_multi(const ft_adamw_seg *seg, int64_t n_seg, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step);
int ft_cpu_add_rmsnorm_bf16_fwd(uint16_t *h_out, uint16_t *y, float *rstd, const uint16_t *x,
                                const uint16_t *res, const float *w, int64_t T, int64_t C, float eps);
int ft_cpu_add_rmsnorm_bf16_bwd(uint16_t *dres_out, const uint16_t *dy, const uint16_t *dres,
                                const uint16_t *h, const float *w, const float *rstd, int64_t T,
                                int64_t C);
int ft_cpu_rope_qk_bf16(uint16_t *q, uint16_t *k, const int32_t *pos, const float *inv_freq,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, int inverse);
int ft_cpu_swiglu_bf16_fwd(uint16_t *h, const uint16_t *gate, const uint16_t *up, int64_t n);
int ft_cpu_swiglu_bf16_bwd(uint16_t *dgate, uint16_t *dup, const uint16_t *dh, const uint16_t *gate,
                           const uint16_t *up, int64_t n);

#endif
