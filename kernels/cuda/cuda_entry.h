/* cuda_entry.h - the CUDA backend's kernels outside the op table, as plain C prototypes (no
 * CUDA headers): the attention implementations attn_gemm.cu chooses among, and the fused NF4
 * GEMM not yet in the op table. Included by cuda_common.h and by the C tests and benches that
 * call one kernel directly. Contracts are at the definitions. */
#ifndef FT_CUDA_ENTRY_H
#define FT_CUDA_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FlashAttention-2 on CUDA cores (attn.cu): the contracts of kernels.h's attention_fwd,
 * attention_bwd and attention_kv_fwd; fp32, D <= 256, Delta in cx->work. attention_kv_fwd is
 * this one; attention_fwd/bwd use it for packed rows of short sequences (attn_gemm.cu
 * chooses). */
int ft_cuda_flash_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                                const float *k, const float *v, const int32_t *seq_start,
                                int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale);
int ft_cuda_flash_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse,
                                const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                                int64_t D, float scale);
int ft_cuda_flash_attention_kv_fwd(ft_backend *be, float *out, const float *q, const float *k,
                                   const float *v, int64_t p, int64_t n_q, int64_t H,
                                   int64_t Hkv, int64_t D, float scale);

/* FlashAttention-2 on the tensor cores (attn_mma.cu, the default; FTUNE_ATTN=gemm opts out):
 * the same contracts, D 64 or 128, bf16 operands; its workspace bytes; a host self-check of its
 * index math. */
size_t ft_cuda_mma_attn_ws_bytes(int64_t T, int64_t H, int64_t Hkv, int64_t D);
int ft_cuda_mma_attention_fwd(ft_backend *be, float *out, float *lse, const float *q,
                              const float *k, const float *v, const int32_t *seq_start,
                              int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale);
int ft_cuda_mma_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv,
                              const float *dout, const float *q, const float *k,
                              const float *v, const float *out, const float *lse,
                              const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                              int64_t D, float scale);
int ft_cuda_mma_attn_selfcheck(char *msg, size_t n);

/* The NF4-dequant-fused GEMM (nf4_gemm.cu): forward (dgrad 0) and input gradient (dgrad 1),
 * bf16 activations, fp32 output + beta * output. */
int ft_cuda_nf4_linear(ft_backend *be, int dgrad, float *c, const uint16_t *a,
                       const ft_nf4_tensor *w, int64_t T, int64_t N, int64_t K, float beta,
                       int bm, int splits);
int ft_cuda_nf4_linear_fwd(ft_backend *be, float *y, const uint16_t *x, const ft_nf4_tensor *w,
                           int64_t T, int64_t N, int64_t K, float beta);
int ft_cuda_nf4_linear_bwd_x(ft_backend *be, float *dx, const uint16_t *dy,
                             const ft_nf4_tensor *w, int64_t T, int64_t N, int64_t K, float beta);

#ifdef __cplusplus
}
#endif

#endif
