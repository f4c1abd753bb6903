/* nf4_word.cuh - NF4 code bytes to bf16, the step shared by the plain dequantization
 * (nf4.cu) and the fused GEMM's shared-memory dequantizer (nf4_gemm.cu): the same fp32
 * operations as the CPU (src/numeric/nf4.c), then bf16 round-to-nearest-even. */
#ifndef FT_NF4_WORD_CUH
#define FT_NF4_WORD_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* Four code bytes (little-endian word: byte 0 = the lowest address = elements 0 and 1, the
 * first element in the high nibble) -> 8 bf16 values as one 16-byte vector; code: the
 * 16-entry NF4 table, am: the block's absmax. */
__device__ __forceinline__ uint4 nf4_word_bf16(uint32_t w, const float *code, float am)
{
    uint4 v;
    uint32_t *o = reinterpret_cast<uint32_t *>(&v);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t byte = (w >> (8 * k)) & 0xff;
        __nv_bfloat162 p = __floats2bfloat162_rn(__fmul_rn(code[byte >> 4], am),
                                                 __fmul_rn(code[byte & 15], am));
        o[k] = *reinterpret_cast<uint32_t *>(&p);
    }
    return v;
}

#endif
