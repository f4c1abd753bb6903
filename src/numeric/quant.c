/* quant.c - ggml block dequantization and fp16/bf16 conversions (see quant.h).
 * Arithmetic follows gguf-py 0.19 gguf/quants.py dequantize_blocks in fp32, operation for
 * operation (integers converted to float exactly, then one multiply, or a multiply and then
 * an add/subtract for Q4_1, Q5_1, Q2_K, Q4_K, Q5_K; K-quant sub-block scales are the fp32
 * product d * scale first, as numpy computes them), so results are bit-identical to numpy's.
 * This relies on a*b+c not being fused into an FMA: the build is -std=c11 (gcc's default
 * there is -ffp-contract=off) for x86-64-v2 (no FMA); tests/unit/test_gguf.c checks bits. */
#include "src/numeric/quant.h"

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
    case FT_GGML_Q5_0: case FT_GGML_Q5_1:
    case FT_GGML_Q2_K: case FT_GGML_Q3_K: case FT_GGML_Q4_K: case FT_GGML_Q5_K: case FT_GGML_Q6_K:
    case FT_GGML_IQ4_NL: case FT_GGML_IQ4_XS:
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

static inline uint32_t load32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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

int64_t ft_quant_first_nonfinite(const float *v, int64_t n)
{
    int64_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n > 262144)
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i]) && i < bad) bad = i;
    return bad;
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

/* Round to nearest even on the bits; a NaN keeps its sign and top payload and is made quiet.
 * A select, not a branch, so that loops over it vectorize. */
static inline uint16_t bf16_rne(uint32_t u)
{
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t ft_quant_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return bf16_rne(x);
}

#define CONV_PAR_MIN 65536 /* below this a loop runs on the calling thread */

void ft_quant_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > CONV_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

void ft_quant_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > CONV_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        dst[i] = bf16_rne(u);
    }
}

void ft_quant_round_bf16_n(float *y, const float *x, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > CONV_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (uint32_t)bf16_rne(u) << 16;
        memcpy(&y[i], &u, 4);
    }
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

/* Q5_0 (ggml-common.h block_q5_0; gguf-py Q5_0.dequantize_blocks): 22 bytes = fp16 d,
 * uint32 qh (little-endian), uint8 qs[16]. Element j < 16 takes the low nibble of qs[j],
 * element j + 16 its high nibble; bit j of qh is bit 4 of element j.
 * x[j] = (float)(q[j] - 16) * d. */
static void deq_q5_0(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 22;
        float d = ft_quant_f16_to_f32(load16(p));
        uint32_t qh = load32(p + 2);
        const uint8_t *qs = p + 6;
        float *y = dst + b * FT_QK5_0;
        for (int j = 0; j < FT_QK5_0 / 2; j++) {
            int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            y[j] = (float)(lo - 16) * d;
            y[j + FT_QK5_0 / 2] = (float)(hi - 16) * d;
        }
    }
}

/* Q5_1 (block_q5_1; gguf-py Q5_1.dequantize_blocks): 24 bytes = fp16 d, fp16 m, uint32 qh,
 * uint8 qs[16]; the 5-bit q[j] as in Q5_0, unsigned. x[j] = (float)q[j] * d + m (multiply,
 * then add). */
static void deq_q5_1(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 24;
        float d = ft_quant_f16_to_f32(load16(p));
        float m = ft_quant_f16_to_f32(load16(p + 2));
        uint32_t qh = load32(p + 4);
        const uint8_t *qs = p + 8;
        float *y = dst + b * FT_QK5_1;
        for (int j = 0; j < FT_QK5_1 / 2; j++) {
            int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            float a = (float)lo * d, c = (float)hi * d;
            y[j] = a + m;
            y[j + FT_QK5_1 / 2] = c + m;
        }
    }
}

/* Q2_K (block_q2_K; gguf-py Q2_K.dequantize_blocks): 84 bytes = uint8 scales[16],
 * uint8 qs[64], fp16 d, fp16 dmin. Sixteen sub-blocks of 16: dl[g] = d * (scales[g] & 15),
 * ml[g] = dmin * (scales[g] >> 4). Element j = 128c + 32s + l (c < 2, s < 4, l < 32) is
 * q = (qs[32c + l] >> 2s) & 3, and x[j] = dl[j/16] * q - ml[j/16] (multiply, then subtract). */
static void deq_q2_k(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 84;
        const uint8_t *sc = p, *qs = p + 16;
        float d = ft_quant_f16_to_f32(load16(p + 80));
        float dmin = ft_quant_f16_to_f32(load16(p + 82));
        float dl[16], ml[16];
        for (int g = 0; g < 16; g++) {
            dl[g] = d * (float)(sc[g] & 0x0f);
            ml[g] = dmin * (float)(sc[g] >> 4);
        }
        float *y = dst + b * FT_QK_K;
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++) {
                const int j0 = 128 * c + 32 * s; /* elements j0 .. j0 + 31: sub-blocks g, g+1 */
                for (int l = 0; l < 32; l++) {
                    const int g = (j0 + l) / 16;
                    float t = dl[g] * (float)((qs[32 * c + l] >> (2 * s)) & 3);
                    y[j0 + l] = t - ml[g];
                }
            }
    }
}

/* Q3_K (block_q3_K; gguf-py Q3_K.dequantize_blocks): 110 bytes = uint8 hmask[32],
 * uint8 qs[64], uint8 scales[12], fp16 d. Sixteen 6-bit scales of 16-element sub-blocks:
 * sc[i] = (scales[i % 8] >> 4(i / 8)) & 15 | ((scales[8 + i % 4] >> 2(i / 4)) & 3) << 4,
 * dl[i] = d * (float)(sc[i] - 32). Element j = 128c + 32s + l: low bits
 * (qs[32c + l] >> 2s) & 3, and 4 is subtracted where bit j/32 of hmask[l] is CLEAR
 * (ggml's "offset is zero when the bitmask is 1"). x[j] = dl[j/16] * (float)q. */
static void deq_q3_k(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 110;
        const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        float d = ft_quant_f16_to_f32(load16(p + 108));
        float dl[16];
        for (int i = 0; i < 16; i++) {
            int lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0f;
            int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
            dl[i] = d * (float)((lo | hi << 4) - 32);
        }
        float *y = dst + b * FT_QK_K;
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++) {
                const int j0 = 128 * c + 32 * s, hb = 4 * c + s; /* hmask bit = j / 32 */
                for (int l = 0; l < 32; l++) {
                    int q = (qs[32 * c + l] >> (2 * s)) & 3;
                    q -= ((hm[l] >> hb) & 1) ? 0 : 4;
                    y[j0 + l] = dl[(j0 + l) / 16] * (float)q;
                }
            }
    }
}

/* The 6-bit scales and mins of Q4_K/Q5_K's eight 32-element sub-blocks, packed in 12 bytes
 * (ggml get_scale_min_k4; gguf-py Q4_K.get_scale_min): for k < 4, sc[k] = s[k] & 63,
 * mn[k] = s[4+k] & 63, sc[4+k] = (s[8+k] & 15) | (s[k] >> 6) << 4,
 * mn[4+k] = (s[8+k] >> 4) | (s[4+k] >> 6) << 4. */
static void scale_min_k4(const uint8_t *s, int sc[8], int mn[8])
{
    for (int k = 0; k < 4; k++) {
        sc[k] = s[k] & 0x3f;
        mn[k] = s[4 + k] & 0x3f;
        sc[4 + k] = (s[8 + k] & 0x0f) | ((s[k] >> 2) & 0x30);
        mn[4 + k] = (s[8 + k] >> 4) | ((s[4 + k] >> 2) & 0x30);
    }
}

/* Q4_K (block_q4_K; gguf-py Q4_K.dequantize_blocks): 144 bytes = fp16 d, fp16 dmin,
 * uint8 scales[12] (scale_min_k4), uint8 qs[128]. Sub-block g = 2c + h (c < 4, h < 2),
 * element l < 32: q = (qs[32c + l] >> 4h) & 15;
 * x[32g + l] = (d * sc[g]) * q - (dmin * mn[g]) (each product rounded to fp32, then the
 * difference). */
static void deq_q4_k(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 144;
        float d = ft_quant_f16_to_f32(load16(p));
        float dmin = ft_quant_f16_to_f32(load16(p + 2));
        const uint8_t *qs = p + 16;
        int sc[8], mn[8];
        scale_min_k4(p + 4, sc, mn);
        float *y = dst + b * FT_QK_K;
        for (int g = 0; g < 8; g++) {
            float dg = d * (float)sc[g], mg = dmin * (float)mn[g];
            const uint8_t *q = qs + 32 * (g / 2);
            int sh = 4 * (g % 2);
            for (int l = 0; l < 32; l++) {
                float t = dg * (float)((q[l] >> sh) & 0x0f);
                y[32 * g + l] = t - mg;
            }
        }
    }
}

/* Q5_K (block_q5_K; gguf-py Q5_K.dequantize_blocks): 176 bytes = fp16 d, fp16 dmin,
 * uint8 scales[12] (scale_min_k4), uint8 qh[32], uint8 qs[128]. As Q4_K, with bit 4 of
 * element 32g + l being bit g of qh[l]: q = ((qs[32c + l] >> 4h) & 15) | ((qh[l] >> g) & 1) << 4,
 * x[32g + l] = (d * sc[g]) * q - (dmin * mn[g]). */
static void deq_q5_k(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 176;
        float d = ft_quant_f16_to_f32(load16(p));
        float dmin = ft_quant_f16_to_f32(load16(p + 2));
        const uint8_t *qh = p + 16, *qs = p + 48;
        int sc[8], mn[8];
        scale_min_k4(p + 4, sc, mn);
        float *y = dst + b * FT_QK_K;
        for (int g = 0; g < 8; g++) {
            float dg = d * (float)sc[g], mg = dmin * (float)mn[g];
            const uint8_t *q = qs + 32 * (g / 2);
            int sh = 4 * (g % 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> sh) & 0x0f) | ((qh[l] >> g) & 1) << 4;
                float t = dg * (float)v;
                y[32 * g + l] = t - mg;
            }
        }
    }
}

/* Q6_K (block_q6_K; gguf-py Q6_K.dequantize_blocks): 210 bytes = uint8 ql[128],
 * uint8 qh[64], int8 scales[16], fp16 d. Element j = 128c + r (c < 2, r < 128): low nibble
 * (ql[64c + r % 64] >> 4(r / 64)) & 15, high bits (qh[32c + r % 32] >> 2(r / 32)) & 3;
 * q = (lo | hi << 4) - 32, x[j] = (d * (float)scales[j/16]) * q (signed scales). */
static void deq_q6_k(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 210;
        const uint8_t *ql = p, *qh = p + 128, *sc = p + 192;
        float d = ft_quant_f16_to_f32(load16(p + 208));
        float dg[16];
        for (int g = 0; g < 16; g++)
            dg[g] = d * (float)(int8_t)sc[g];
        float *y = dst + b * FT_QK_K;
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 4; s++) { /* r = 32s + l */
                const int j0 = 128 * c + 32 * s;
                const uint8_t *lq = ql + 64 * c + 32 * (s % 2), *hq = qh + 32 * c;
                for (int l = 0; l < 32; l++) {
                    int lo = (lq[l] >> (4 * (s / 2))) & 0x0f;
                    int hi = (hq[l] >> (2 * s)) & 0x03;
                    y[j0 + l] = dg[(j0 + l) / 16] * (float)((lo | hi << 4) - 32);
                }
            }
    }
}

/* IQ4_NL / IQ4_XS non-linear 4-bit grid (ggml-common.h kvalues_iq4nl; gguf-py
 * IQ4_NL.kvalues). */
static const int8_t k_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

/* IQ4_NL (block_iq4_nl; gguf-py IQ4_NL.dequantize_blocks): 18 bytes = fp16 d, uint8 qs[16];
 * element j < 16 is the low nibble of qs[j], j + 16 its high nibble.
 * x[j] = d * (float)k_iq4nl[nibble]. */
static void deq_iq4_nl(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 8192)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 18;
        float d = ft_quant_f16_to_f32(load16(p));
        const uint8_t *qs = p + 2;
        float *y = dst + b * FT_QK4_NL;
        for (int j = 0; j < FT_QK4_NL / 2; j++) {
            y[j] = d * (float)k_iq4nl[qs[j] & 0x0f];
            y[j + FT_QK4_NL / 2] = d * (float)k_iq4nl[qs[j] >> 4];
        }
    }
}

/* IQ4_XS (block_iq4_xs; gguf-py IQ4_XS.dequantize_blocks): 136 bytes = fp16 d,
 * uint16 scales_h (LE), uint8 scales_l[4], uint8 qs[128]. Eight 32-element sub-blocks:
 * ls[i] = ((scales_l[i/2] >> 4(i % 2)) & 15) | ((scales_h >> 2i) & 3) << 4,
 * dl[i] = d * (float)(ls[i] - 32); element 32i + 16h + m (h < 2, m < 16) is
 * x = dl[i] * (float)k_iq4nl[(qs[16i + m] >> 4h) & 15]. */
static void deq_iq4_xs(const uint8_t *src, float *dst, int64_t nb)
{
#pragma omp parallel for schedule(static) if (nb > 1024)
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = src + b * 136;
        float d = ft_quant_f16_to_f32(load16(p));
        unsigned sh = load16(p + 2);
        const uint8_t *sl = p + 4, *qs = p + 8;
        float *y = dst + b * FT_QK_K;
        for (int i = 0; i < 8; i++) {
            int ls = ((sl[i / 2] >> (4 * (i % 2))) & 0x0f) | (int)((sh >> (2 * i)) & 3u) << 4;
            float dl = d * (float)(ls - 32);
            for (int m = 0; m < 16; m++) {
                y[32 * i + m] = dl * (float)k_iq4nl[qs[16 * i + m] & 0x0f];
                y[32 * i + 16 + m] = dl * (float)k_iq4nl[qs[16 * i + m] >> 4];
            }
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
                      "(supported: " FT_QUANT_DEQUANT_LIST ")", ft_quant_name(type), type);
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
    case FT_GGML_Q5_0: deq_q5_0(s, dst, n / FT_QK5_0); break;
    case FT_GGML_Q5_1: deq_q5_1(s, dst, n / FT_QK5_1); break;
    case FT_GGML_Q2_K: deq_q2_k(s, dst, n / FT_QK_K); break;
    case FT_GGML_Q3_K: deq_q3_k(s, dst, n / FT_QK_K); break;
    case FT_GGML_Q4_K: deq_q4_k(s, dst, n / FT_QK_K); break;
    case FT_GGML_Q5_K: deq_q5_k(s, dst, n / FT_QK_K); break;
    case FT_GGML_Q6_K: deq_q6_k(s, dst, n / FT_QK_K); break;
    case FT_GGML_IQ4_NL: deq_iq4_nl(s, dst, n / FT_QK4_NL); break;
    case FT_GGML_IQ4_XS: deq_iq4_xs(s, dst, n / FT_QK_K); break;
    }
    return 0;
}
