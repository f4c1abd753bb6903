/* decode.h - CPU ops used only for generation (inference with a KV cache), fp32.
 * Semantics: the op-table entries of the same name in kernels/kernels.h, without the
 * ft_backend argument. Bodies: decode.c. */
#ifndef FT_CPU_DECODE_H
#define FT_CPU_DECODE_H

#include <stdint.h>

/* attention_kv_fwd (kernels.h): out (n_q, H, D) for queries q (n_q, H, D) at positions
 * [p, p + n_q) against k, v (p + n_q, Hkv, D). Returns 0 or FT_E_INVALID. */
int ft_cpu_attention_kv_fwd_f32(float *out, const float *q, const float *k, const float *v,
                                int64_t p, int64_t n_q, int64_t H, int64_t Hkv, int64_t D,
                                float scale);

#endif
