/* quant.c - ggml block dequantization and fp16/bf16 conversions (see quant.h).
 * Arithmetic follows gguf-py gguf/quants.py dequantize_blocks in fp32 (one multiply, or
 * multiply then add for Q4_1), so results are bit-identical to numpy's. */
#include "src/model/quant.h"

#include <math.h>
#include <string.h>

#include "src/core/err.h"

typedef struct {
    const char *name;
    int block_n, block_bytes;
} type_info;

/* ggml's enum ggml_type (ggml.h), as listed by gguf-py GGML_QUANT_SIZES. Removed codes
 * (4, 5: Q4_2/Q4_3; 31-33, 36-38: repacked types) have block_n 0. */
static const type_info k_types[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 40},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},  [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},  [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},  [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},       [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},  [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},  [39] = {"MXFP4", 32, 17},   [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))

int ft_quant_block(int type, int64_t *block_n, int64_t *block_bytes)
{
    if (type < 0 || type >= N_TYPES || k_types[type].block_n == 0)
        return FT_E_UNSUPPORTED;
    if (block_n) *block_n = k_types[type].block_n;
    if (block_bytes) *block_bytes = k_types[type].block_bytes;
    return 0;
}

const char *ft_quant_name(int type)
{
    if (type < 0 || type >= N_TYPES || k_types[type].block_n == 0)
        return "unknown";
    return k_types[type].name;
}

int ft_quant_can_dequant(int type)
{
    switch (type) {
    case FT_GGML_F32: case FT_GGML_F16: case FT_GGML_BF16:
    case FT_GGML_Q8_0: case FT_GGML_Q4_0: case FT_GGML_Q4_1:
        return 1;
    default:
        return 0;
    }
}

int64_t ft_quant_bytes(int type, int64_t n)
{
    int64_t bn, bb, out;
    if (n < 0 || ft_quant_block(type, &bn, &bb) < 0 || n % bn != 0)
        return -1;
    if (__builtin_mul_overflow(n / bn, bb, &out))
        return -1;
    return out;
}

/* ---- scalar conversions ------------------------------------------------------------ */

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t load16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

float ft_quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

float ft_quant_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

uint16_t ft_quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (and inf stays inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: fp16 subnormal (or zero) */
        float a = bits_f32(ax) * 0x1p24f; /* exact: a power-of-two scaling */
        return (uint16_t)(sign | (uint16_t)lrintf(a)); /* default mode: nearest even */
    }
    uint32_t h = ((((ax >> 23) - 112u)) << 10) | ((ax >> 13) & 0x3ffu);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct result */
    return (uint16_t)(sign | h);
}

uint16_t ft_quant_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- block dequantizers --------------------------------------------------------------- */

static void deq_q8_0(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 34;
        float d = ft_quant_f16_to_f32(load16(p));
        float *y = dst + b * FT_QK8_0;
        for (int j = 0; j < FT_QK8_0; j++)
            y[j] = (float)(int8_t)p[2 + j] * d;
    }
}

static void deq_q4_0(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 18;
        float d = ft_quant_f16_to_f32(load16(p));
        const uint8_t *qs = p + 2;
        float *y = dst + b * FT_QK4_0;
        for (int j = 0; j < FT_QK4_0 / 2; j++) {
            y[j] = (float)((int)(qs[j] & 0x0f) - 8) * d;
            y[j + FT_QK4_0 / 2] = (float)((int)(qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 20;
        float d = ft_quant_f16_to_f32(load16(p));
        float m = ft_quant_f16_to_f32(load16(p + 2));
        const uint8_t *qs = p + 4;
        float *y = dst + b * FT_QK4_1;
        for (int j = 0; j < FT_QK4_1 / 2; j++) {
            float lo = (float)(qs[j] & 0x0f) * d;
            float hi = (float)(qs[j] >> 4) * d;
            y[j] = lo + m;
            y[j + FT_QK4_1 / 2] = hi + m;
        }
    }
}

static void deq_16(const uint8_t *src, float *dst, int64_t n, int bf16)
{
#pragma omp parallel for schedule(static) if (n > 262144)
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = load16(src + 2 * i);
        dst[i] = bf16 ? ft_quant_bf16_to_f32(h) : ft_quant_f16_to_f32(h);
    }
}

int ft_quant_dequant(int type, const void *src, float *dst, int64_t n)
{
    int64_t bn;
    if (ft_quant_block(type, &bn, NULL) < 0 || !ft_quant_can_dequant(type))
        return ft_err(FT_E_UNSUPPORTED, "ggml type %s (%d) cannot be dequantized "
                      "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)", ft_quant_name(type), type);
    if (n < 0 || n % bn != 0)
        return ft_err(FT_E_INVALID, "ggml type %s: %lld elements is not a multiple of the "
                      "block size %lld", ft_quant_name(type), (long long)n, (long long)bn);
    const uint8_t *s = src;
    switch (type) {
    case FT_GGML_F32: memcpy(dst, s, (size_t)n * 4); break;
    case FT_GGML_F16: deq_16(s, dst, n, 0); break;
    case FT_GGML_BF16: deq_16(s, dst, n, 1); break;
    case FT_GGML_Q8_0: deq_q8_0(s, dst, n / FT_QK8_0); break;
    case FT_GGML_Q4_0: deq_q4_0(s, dst, n / FT_QK4_0); break;
    case FT_GGML_Q4_1: deq_q4_1(s, dst, n / FT_QK4_1); break;
    }
    return 0;
}
