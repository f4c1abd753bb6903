/* nf4.c - NF4 + double quantization, bitsandbytes layout (see nf4.h for the sources and
 * the exact arithmetic). Compiled as ISO C11, so GCC keeps a * b + c as two roundings
 * (-ffp-contract=off), which the bnb dequantization order requires; the one fused
 * multiply-add the dynamic map needs is written as fmaf(). */
#include "src/numeric/nf4.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

const float ft_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* dQuantizeNF4's thresholds (kernels.cu): the decimal literals "-0.8480964004993439f", ...,
 * each correctly rounded to fp32 as nvcc (and gcc, and strtof) converts a float literal,
 * written here as exact hex floats so no compiler can round them differently. Four of them
 * (k = 0, 8, 12, 14) are exact midpoints of two codes, printed to 16-17 digits; the direct
 * decimal -> fp32 rounding then lands one ulp away from np.float32(float(literal)) (double
 * rounding) and from bnb's CPU fp32 midpoints (code[k] + code[k+1]) / 2 (formats.md 5.2
 * says these agree; they do except at these four ties). */
static const float k_thr[15] = {
    -0x1.b239b2p-1f, -0x1.38a4e0p-1f, -0x1.d70900p-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,
    -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f,  0x1.ec90c6p-4f,  0x1.a0cfc0p-3f,
    0x1.2b05a8p-2f,  0x1.8ea7f2p-2f,  0x1.00da06p-1f,  0x1.491b5ep-1f,  0x1.b913b2p-1f,
};

typedef float ft_v4f __attribute__((vector_size(16)));
typedef int32_t ft_v4i __attribute__((vector_size(16)));

uint8_t ft_nf4_quant4(float x)
{
    /* the count of thresholds strictly below x; NaN compares false everywhere -> 0, as
     * the CUDA decision tree gives */
    uint8_t q = 0;
    for (int k = 0; k < 15; k++) q += x > k_thr[k];
    return q;
}

/* torch.linspace(start, end, steps, dtype=float32) on the CPU (aten RangeFactoriesKernel):
 * step = (end - start) / (steps - 1) in fp32; the first half start + step * i, the second
 * end - step * (steps - i - 1), each contracted to one fused multiply-add by the compiler
 * torch is built with (a published dump of bnb's map agrees only with the fused form). */
static void linspace_f32(float start, float end, int steps, float *out)
{
    float step = (end - start) / (float)(steps - 1);
    int half = steps / 2;
    for (int i = 0; i < steps; i++)
        out[i] = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - i - 1), end);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void ft_nf4_dynamic_map(float map[256])
{
    /* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i in 0..6,
     * 2^i + 1 boundaries in [0.1, 1], their midpoints scaled by 10^(i-6) (the scale is a
     * Python float, cast to fp32 by torch's scalar multiply), both signs; then 0 and 1 */
    static const double k_scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    float b[65];
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int n = (1 << i) + 1;
        linspace_f32(0.1f, 1.0f, n, b);
        float s = (float)k_scale[i];
        for (int j = 0; j + 1 < n; j++) {
            float mean = (b[j] + b[j + 1]) / 2.0f;
            float v = s * mean;
            map[k++] = v;
            map[k++] = -v;
        }
    }
    map[k++] = 0.0f;
    map[k++] = 1.0f;
    qsort(map, 256, sizeof *map, cmp_float); /* k == 256 */
}

uint8_t ft_nf4_quant8(const float *code, float x)
{
    /* bnb kernels.cu dQuantize<0>, step for step (including its fp32 midpoints) */
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = code[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = code[pivot];
    }
    if (upper_pivot == 255) upper = code[upper_pivot];
    if (lower_pivot == 0) lower = code[lower_pivot];
    if (x > val) {
        float midpoint = (upper + val) * 0.5f;
        return (uint8_t)(x > midpoint ? upper_pivot : pivot);
    }
    float midpoint = (lower + val) * 0.5f;
    return (uint8_t)(x < midpoint ? lower_pivot : pivot);
}

double ft_nf4_fsum(const float *x, int64_t n)
{
    /* Shewchuk's exact summation with a list of non-overlapping partials (the algorithm of
     * Python's math.fsum); the result is the exact sum correctly rounded to double. */
    double p[128];
    int np = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        int j = 0;
        for (int k = 0; k < np; k++) {
            double y = p[k];
            if (fabs(v) < fabs(y)) {
                double t = v;
                v = y;
                y = t;
            }
            double hi = v + y, lo = y - (hi - v);
            if (lo != 0.0) p[j++] = lo;
            v = hi;
        }
        if (j < 128) p[j++] = v; /* at most ~40 partials for finite doubles */
        np = j;
    }
    /* sum the partials from the top, with the half-way correction of math.fsum */
    if (np == 0) return 0.0;
    double hi = p[--np], lo = 0.0;
    while (np > 0) {
        double v = hi, y = p[--np];
        hi = v + y;
        double yr = hi - v;
        lo = y - yr;
        if (lo != 0.0) break;
    }
    if (np > 0 && ((lo < 0 && p[np - 1] < 0) || (lo > 0 && p[np - 1] > 0))) {
        double y = lo * 2, v = hi + y, yr = v - hi;
        if (y == yr) hi = v;
    }
    return hi;
}

int ft_nf4_layout_init(ft_nf4_layout *l, int64_t n, int64_t blocksize, int64_t nested_blocksize)
{
    memset(l, 0, sizeof *l);
    if (n < 1)
        return ft_err(FT_E_INVALID, "nf4: %lld elements (expected at least 1)", (long long)n);
    if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1)))
        return ft_err(FT_E_INVALID, "nf4: blocksize %lld (expected a power of two in 32..4096)",
                      (long long)blocksize);
    if (nested_blocksize < 0 || nested_blocksize == 1 || nested_blocksize > 65536 ||
        (nested_blocksize & (nested_blocksize - 1)))
        return ft_err(FT_E_INVALID, "nf4: nested blocksize %lld (expected 0 or a power of two "
                      "in 2..65536)", (long long)nested_blocksize);
    l->n = n;
    l->blocksize = blocksize;
    l->nested_blocksize = nested_blocksize;
    l->code_bytes = (n + 1) / 2;
    l->n_blocks = (n + blocksize - 1) / blocksize;
    l->n_nested = nested_blocksize ? (l->n_blocks + nested_blocksize - 1) / nested_blocksize : 0;
    return 0;
}

/* Block b of the tensor (x points at element e0): absmax and packed codes. Returns the
 * tensor index of a non-finite input, or -1. The codes are computed four at a time with
 * GCC/Clang vector extensions (3.3x faster than a per-element ft_nf4_quant4 call on one core,
 * bench/results/pack_8b.md); the arithmetic is the same: one fp32 multiply x * inv per
 * element, strict compares against the same thresholds (test_nf4.c checks it against
 * ft_nf4_quant4 on every length 1..300). */
static int64_t quant_block(const float *x, int64_t e0, const ft_nf4_layout *l, int64_t b,
                           uint8_t *codes, float *absmax)
{
    int64_t s = b * l->blocksize, e = s + l->blocksize < l->n ? s + l->blocksize : l->n;
    const int cnt = (int)(e - s); /* <= 4096 */
    const float *xb = x + (s - e0);
    float m = 0.0f;
    int bad = 0;
    for (int i = 0; i < cnt; i++) {
        float a = fabsf(xb[i]);
        bad |= !(a <= FLT_MAX); /* NaN or infinite */
        m = a > m ? a : m;
    }
    if (bad) {
        for (int j = 0; j < cnt; j++)
            if (!(fabsf(xb[j]) <= FLT_MAX)) return s + j;
    }
    absmax[b] = m;
    float inv = 1.0f / m;
    uint8_t q[4096 + 1];
    int i = 0;
    /* a lane compare gives -1 (true) or 0, so subtracting the masks counts thresholds */
    const ft_v4f vinv = {inv, inv, inv, inv};
    for (; i + 4 <= cnt; i += 4) {
        ft_v4f v;
        memcpy(&v, xb + i, sizeof v);
        v = v * vinv;
        ft_v4i c = {0, 0, 0, 0};
        for (int k = 0; k < 15; k++) {
            const ft_v4f t = {k_thr[k], k_thr[k], k_thr[k], k_thr[k]};
            c -= (ft_v4i)(v > t);
        }
        for (int j = 0; j < 4; j++) q[i + j] = (uint8_t)c[j];
    }
    for (; i < cnt; i++) q[i] = ft_nf4_quant4(xb[i] * inv);
    q[cnt] = 0; /* an odd n leaves the last low nibble 0 */
    /* blocksize is even, so a block starts on a byte */
    for (int j = 0; j < cnt; j += 2) codes[(s + j) / 2] = (uint8_t)(q[j] << 4 | q[j + 1]);
    return -1;
}

int ft_nf4_quantize_part(const float *x, const ft_nf4_layout *l, int64_t e0, int64_t count,
                         uint8_t *codes, float *absmax)
{
    if (!x || !codes || !absmax)
        return ft_err(FT_E_INVALID, "nf4: quantize called with a NULL buffer");
    if (e0 < 0 || count < 0 || e0 + count > l->n || e0 % l->blocksize ||
        (count % l->blocksize && e0 + count != l->n))
        return ft_err(FT_E_INVALID, "nf4: part [%lld, +%lld) of %lld elements is not on %lld-element "
                      "block boundaries", (long long)e0, (long long)count, (long long)l->n,
                      (long long)l->blocksize);
    int64_t b0 = e0 / l->blocksize, b1 = (e0 + count + l->blocksize - 1) / l->blocksize;
    int64_t bad = -1;
#pragma omp parallel for schedule(static) if (b1 - b0 > 1024)
    for (int64_t b = b0; b < b1; b++) {
        int64_t k = quant_block(x, e0, l, b, codes, absmax);
        if (k >= 0) {
#pragma omp critical(ft_nf4_bad)
            if (bad < 0 || k < bad) bad = k;
        }
    }
    if (bad >= 0)
        return ft_err(FT_E_NUMERIC, "nf4: element %lld is %g (NF4 needs finite weights)",
                      (long long)bad, (double)x[bad - e0]);
    return 0;
}

int ft_nf4_quantize_nested(const float *absmax, const ft_nf4_layout *l, const float *map,
                           uint8_t *qabsmax, float *nested_absmax, float *offset)
{
    if (!absmax)
        return ft_err(FT_E_INVALID, "nf4: nested quantization called with a NULL buffer");
    return ft_nf4_quantize_nested_sum(absmax, l, map, ft_nf4_fsum(absmax, l->n_blocks), qabsmax,
                                      nested_absmax, offset);
}

int ft_nf4_quantize_nested_sum(const float *absmax, const ft_nf4_layout *l, const float *map,
                               double absmax_sum, uint8_t *qabsmax, float *nested_absmax,
                               float *offset)
{
    if (!absmax || !map || !qabsmax || !nested_absmax || !offset || l->nested_blocksize < 2)
        return ft_err(FT_E_INVALID, "nf4: nested quantization called with a NULL buffer or "
                      "without a nested blocksize");
    /* offset = mean(absmax) (see nf4.h), then blockwise 8-bit quantization of absmax - offset */
    float off = (float)(absmax_sum / (double)l->n_blocks);
    *offset = off;
    const int64_t nb = l->nested_blocksize;
#pragma omp parallel for schedule(static) if (l->n_nested > 64)
    for (int64_t c = 0; c < l->n_nested; c++) {
        int64_t s = c * nb, e = s + nb < l->n_blocks ? s + nb : l->n_blocks;
        float m = -FLT_MAX;
        for (int64_t i = s; i < e; i++) m = fmaxf(m, fabsf(absmax[i] - off));
        nested_absmax[c] = m;
        float inv = 1.0f / m;
        for (int64_t i = s; i < e; i++) qabsmax[i] = ft_nf4_quant8(map, (absmax[i] - off) * inv);
    }
    return 0;
}

int ft_nf4_quantize(const float *x, const ft_nf4_layout *l, const float *map, uint8_t *codes,
                    uint8_t *qabsmax, float *nested_absmax, float *offset, float *absmax_tmp)
{
    FT_TRY(ft_nf4_quantize_part(x, l, 0, l->n, codes, absmax_tmp));
    if (!l->nested_blocksize) return 0;
    return ft_nf4_quantize_nested(absmax_tmp, l, map, qabsmax, nested_absmax, offset);
}

static inline float block_absmax(const ft_nf4_view *v, int64_t b)
{
    if (!v->lay.nested_blocksize) return v->absmax[b];
    float a = v->nested_map[v->qabsmax[b]] * v->nested_absmax[b / v->lay.nested_blocksize];
    return a + v->offset; /* two roundings, as bnb: dequantize_blockwise, then += offset */
}

float ft_nf4_block_absmax(const ft_nf4_view *v, int64_t b) { return block_absmax(v, b); }

int ft_nf4_dequant_range(const ft_nf4_view *v, int64_t e0, int64_t count, float *out)
{
    const ft_nf4_layout *l = &v->lay;
    if (!out || !v->codes || !v->code ||
        (l->nested_blocksize ? (!v->qabsmax || !v->nested_absmax || !v->nested_map) : !v->absmax))
        return ft_err(FT_E_INVALID, "nf4: dequantize called with a NULL buffer");
    if (e0 < 0 || count < 0 || e0 + count > l->n)
        return ft_err(FT_E_INVALID, "nf4: range [%lld, +%lld) outside the tensor's %lld elements",
                      (long long)e0, (long long)count, (long long)l->n);
    if (count == 0) return 0;
    const float *code = v->code;
    const uint8_t *codes = v->codes;
    int64_t b0 = e0 / l->blocksize, b1 = (e0 + count - 1) / l->blocksize + 1;
#pragma omp parallel for schedule(static) if (b1 - b0 > 1024)
    for (int64_t b = b0; b < b1; b++) {
        float a = block_absmax(v, b);
        int64_t s = b * l->blocksize, e = s + l->blocksize;
        if (s < e0) s = e0;
        if (e > e0 + count) e = e0 + count;
        float *o = out + (s - e0);
        const uint8_t *cb = codes + s / 2;
        int64_t j = 0, len = e - s;
        if (s & 1) { /* an odd start: its byte's low nibble */
            o[0] = code[*cb++ & 15] * a;
            j = 1;
        }
        for (; j + 1 < len; j += 2) { /* whole bytes: high nibble first (bitsandbytes' order) */
            uint8_t byte = *cb++;
            o[j] = code[byte >> 4] * a;
            o[j + 1] = code[byte & 15] * a;
        }
        if (j < len) o[j] = code[*cb >> 4] * a;
    }
    return 0;
}

int ft_nf4_dequant(const ft_nf4_view *v, float *out)
{
    return ft_nf4_dequant_range(v, 0, v->lay.n, out);
}
