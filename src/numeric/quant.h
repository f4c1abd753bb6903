/* quant.h - ggml tensor types: block sizes and dequantization to fp32, plus the scalar
 * fp16/bf16 conversions used by the safetensors and GGUF readers.
 *
 * Block layouts (ggml-common.h; gguf-py gguf/quants.py, checked bit-exact by
 * tests/unit/test_gguf.c against fixtures made with gguf.quants):
 *   Q8_0: 34 bytes = fp16 d, int8 q[32];              x[i] = q[i] * d
 *   Q4_0: 18 bytes = fp16 d, uint8 qs[16];            x[i] = ((qs[i] & 15) - 8) * d,
 *                                                     x[i+16] = ((qs[i] >> 4) - 8) * d
 *   Q4_1: 20 bytes = fp16 d, fp16 m, uint8 qs[16];    x[i] = (qs[i] & 15) * d + m,
 *                                                     x[i+16] = (qs[i] >> 4) * d + m
 *   Q5_0: 22 bytes = fp16 d, uint32 qh (LE), uint8 qs[16];
 *         q[i] = (qs[i] & 15) | (qh bit i) << 4, q[i+16] = (qs[i] >> 4) | (qh bit i+16) << 4,
 *         x = (q - 16) * d
 *   Q5_1: 24 bytes = fp16 d, fp16 m, uint32 qh, uint8 qs[16]; q as Q5_0, x = q * d + m
 *   IQ4_NL: 18 bytes = fp16 d, uint8 qs[16]; nibbles as Q4_0, x = kvalues[nibble] * d
 *   K-quants (QK_K = 256 elements per super-block):
 *   Q2_K:  84 bytes = uint8 scales[16], uint8 qs[64], fp16 d, fp16 dmin
 *   Q3_K: 110 bytes = uint8 hmask[32], uint8 qs[64], uint8 scales[12], fp16 d
 *   Q4_K: 144 bytes = fp16 d, fp16 dmin, uint8 scales[12], uint8 qs[128]
 *   Q5_K: 176 bytes = fp16 d, fp16 dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128]
 *   Q6_K: 210 bytes = uint8 ql[128], uint8 qh[64], int8 scales[16], fp16 d
 *   IQ4_XS: 136 bytes = fp16 d, uint16 scales_h, uint8 scales_l[4], uint8 qs[128]
 *   (the per-element formulas are at each dequantizer in quant.c).
 *   F32, F16, BF16: one element per block, little-endian.
 * Type codes are ggml's enum ggml_type values as stored in GGUF files (formats.md 4.3).
 * Fixtures for the types above Q4_1: tests/ref/make_kquant_fixtures.py.
 */
#ifndef FT_QUANT_H
#define FT_QUANT_H

#include <stdint.h>

enum ft_ggml_type {
    FT_GGML_F32 = 0,
    FT_GGML_F16 = 1,
    FT_GGML_Q4_0 = 2,
    FT_GGML_Q4_1 = 3,
    FT_GGML_Q5_0 = 6,
    FT_GGML_Q5_1 = 7,
    FT_GGML_Q8_0 = 8,
    FT_GGML_Q2_K = 10,
    FT_GGML_Q3_K = 11,
    FT_GGML_Q4_K = 12,
    FT_GGML_Q5_K = 13,
    FT_GGML_Q6_K = 14,
    FT_GGML_IQ4_NL = 20,
    FT_GGML_IQ4_XS = 23,
    FT_GGML_BF16 = 30,
    FT_GGML_TYPE_LIMIT = 64, /* type codes >= this are rejected as unknown */
};

#define FT_QK8_0 32
#define FT_QK4_0 32
#define FT_QK4_1 32
#define FT_QK5_0 32
#define FT_QK5_1 32
#define FT_QK4_NL 32
#define FT_QK_K 256 /* K-quant and IQ4_XS super-block */

/* The types ft_quant_dequant converts, as error messages list them. */
#define FT_QUANT_DEQUANT_LIST \
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS"

/* Block geometry of a ggml type: elements per block and bytes per block. Known for every
 * type ggml defines (so files holding K-quants still parse), even where ft_quant_dequant
 * cannot convert them. Returns 0, or FT_E_UNSUPPORTED for an unknown/removed code. */
int ft_quant_block(int type, int64_t *block_n, int64_t *block_bytes);

/* ggml's name of a type ("Q4_1", "F32", ...), or "type<N>" style "unknown" for others. */
const char *ft_quant_name(int type);

/* 1 if ft_quant_dequant converts this type (FT_QUANT_DEQUANT_LIST). */
int ft_quant_can_dequant(int type);

/* Bytes of n elements of a type; -1 if the type is unknown, n is not a multiple of the
 * block size, or the size overflows int64. */
int64_t ft_quant_bytes(int type, int64_t n);

/* Dequantizes n elements (a multiple of the block size) from src (any alignment; exactly
 * ft_quant_bytes(type, n) bytes are read) into dst (fp32), bit-identical to gguf-py 0.19's
 * gguf.quants.dequantize. Returns 0, FT_E_UNSUPPORTED (type has no dequantizer) or FT_E_INVALID (n not
 * a multiple of the block size); records a message naming the type. */
int ft_quant_dequant(int type, const void *src, float *dst, int64_t n);

/* The index of the first of v[0..n) that is NaN or infinite, or n when all are finite (the
 * loaders' check that a model holds no such value: loader.c for GGUF tensors, safetensors.c
 * ft_st_to_f32). Large n is scanned in parallel (OpenMP); the answer is the same. */
int64_t ft_quant_first_nonfinite(const float *v, int64_t n);

/* Exact IEEE binary16 -> binary32 (subnormals, inf, NaN kept). */
float ft_quant_f16_to_f32(uint16_t h);
/* Exact bfloat16 -> binary32 (the top 16 bits of the float). */
float ft_quant_bf16_to_f32(uint16_t b);
/* binary32 -> binary16, round to nearest even (as numpy astype(float16)). */
uint16_t ft_quant_f32_to_f16(float f);
/* binary32 -> bfloat16, round to nearest even (as torch .to(bfloat16)); NaN stays NaN. */
uint16_t ft_quant_f32_to_bf16(float f);

/* The same conversions over arrays of n values, written so the loops vectorize, and run
 * with OpenMP threads for large n (the caller's thread count):
 * dst[i] = ft_quant_bf16_to_f32(src[i]) */
void ft_quant_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
/* dst[i] = ft_quant_f32_to_bf16(src[i]) */
void ft_quant_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n);
/* y[i] = x[i] rounded to bf16 (ft_quant_f32_to_bf16) and kept as fp32; y may equal x. */
void ft_quant_round_bf16_n(float *y, const float *x, int64_t n);

#endif
