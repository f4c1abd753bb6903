/* align.h - the carving unit of ftune's arenas (src/model/llama.c, generate.c, loader.c,
 * offload/exec.c, resident.c): every region is a whole number of 16 floats, so that a 64-byte
 * aligned base keeps each region on 64 bytes. CUDA's linear ops and tensor-core attention read
 * activations as float4 (16 bytes; kernels/cuda/backend.cu to_bf16, attn_mma.cu). */
#ifndef FT_ALIGN_H
#define FT_ALIGN_H

#include <stdint.h>

/* n (floats) rounded up to a multiple of 16; n >= 0. */
static inline int64_t ft_pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Returns *p and advances it past n floats, rounded up to 16: the next region of an arena. */
static inline float *ft_carve16(float **p, int64_t n)
{
    float *r = *p;
    *p += ft_pad16(n);
    return r;
}

#endif
