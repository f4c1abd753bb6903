/* nf4.h - NF4 4-bit weights with double quantization, byte-compatible with bitsandbytes.
 *
 * Layout and arithmetic (formats.md 5; bitsandbytes csrc/kernels.cu kQuantizeBlockwise,
 * dQuantizeNF4, dQuantize<0>, kDequantizeBlockwise; functional.py quantize_4bit with
 * compress_statistics=True, quantize_blockwise, create_dynamic_map):
 *   - the weight (out, in) is flattened row-major and cut into blocks of `blocksize` (64)
 *     elements, the last one possibly partial;
 *   - per block: absmax = max |x| (fp32), inv = 1.0f / absmax, q = the number of NF4
 *     thresholds t_k with x * inv > t_k (strict; a NaN, e.g. from an all-zero block, gives
 *     q = 0 as on CUDA); two codes per byte, the FIRST element in the HIGH nibble; the
 *     thresholds are the kernel's float literals rounded as nvcc rounds them (nf4.c: four
 *     are exact code midpoints and differ by one ulp from fp32 midpoints);
 *   - double quantization: offset = mean(absmax); the values absmax - offset are cut into
 *     blocks of `nested_blocksize` (256) and quantized to 8 bits with the signed dynamic map
 *     (create_dynamic_map(True, 7, 8)): nested_absmax = max |v|, code = dQuantize<0>(v *
 *     (1.0f / nested_absmax)) (CUDA's binary search from pivot 127 with fp32 midpoints);
 *   - dequantization: absmax[b] = map[qabsmax[b]] * nested_absmax[b / 256] + offset (a
 *     multiply, then an add: two fp32 roundings), w = nf4[q] * absmax[b] (fp32).
 * Where this differs from a bitsandbytes run (documented, not hidden):
 *   - bnb's CUDA library is built with --use_fast_math, so its 1.0f/absmax is an
 *     approximate reciprocal; we use IEEE division (bnb's own CPU NF4 path does too);
 *   - bnb's offset is torch's fp32 mean (reduction order differs between CPU and CUDA);
 *     ours is the exact sum of the absmax values rounded to double (Shewchuk, as Python's
 *     math.fsum), divided by the count in double, rounded to fp32;
 *   - bnb's CPU backend differs from its own CUDA kernels in places; we follow CUDA: its
 *     NF4 path (backends/default) compares against fp32 midpoints (one ulp off at the four
 *     ties above) and gives code 7 to all-zero blocks (CUDA: 0); its 8-bit quantizer
 *     (cpu_ops.cpp, 2026) rounds through a 65536-bin lookup table.
 * Everything downstream of a given offset is bit-exact, and dequantization of a bnb file
 * is bit-exact (it uses the file's own maps and offset).
 * The comparison with bitsandbytes' CUDA kernels (codes, absmax, maps, dequantization) is in
 * bench/results/code-measurements.md (H100, 2026-11-23).
 */
#ifndef FT_NF4_H
#define FT_NF4_H

#include <stdint.h>

#define FT_NF4_BLOCK 64          /* elements per absmax block (bnb default) */
#define FT_NF4_NESTED_BLOCK 256  /* absmax values per nested block (bnb quantize_4bit) */

/* The 16 NF4 values, index 0..15 (bnb get_4bit_type("nf4"), formats.md 5.1). */
extern const float ft_nf4_code[16];

/* bnb's create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 sorted
 * fp32 values, map[0] = -0.99296875, map[127] = 0, map[255] = 1. Bit-exact with torch 2.x on
 * x86 (its fp32 linspace contracts start + step * i into one fused multiply-add), checked
 * against a published dump of bnb's map in tests/unit/test_nf4.c. */
void ft_nf4_dynamic_map(float map[256]);

/* Sizes of one quantized tensor of n elements. nested_blocksize 0 = no double quantization
 * (absmax stored as fp32). */
typedef struct ft_nf4_layout {
    int64_t n;                /* elements */
    int64_t blocksize;        /* 32..4096, a power of two (bnb's valid sizes) */
    int64_t nested_blocksize; /* 0, or a power of two >= 2 */
    int64_t code_bytes;       /* (n + 1) / 2 */
    int64_t n_blocks;         /* ceil(n / blocksize): absmax entries */
    int64_t n_nested;         /* ceil(n_blocks / nested_blocksize), 0 when not nested */
} ft_nf4_layout;

/* Fills l. Returns 0 or FT_E_INVALID (n < 1, bad block size). */
int ft_nf4_layout_init(ft_nf4_layout *l, int64_t n, int64_t blocksize, int64_t nested_blocksize);

/* A quantized tensor in memory (pointers into the caller's, a pack's or a mapped file's
 * bytes; any alignment). Nested: qabsmax, nested_absmax, nested_map and offset are used;
 * not nested: absmax (fp32). `code` is the 16-value 4-bit code (ft_nf4_code for NF4). */
typedef struct ft_nf4_view {
    ft_nf4_layout lay;
    const uint8_t *codes;         /* code_bytes */
    const uint8_t *qabsmax;       /* n_blocks (nested) */
    const float *absmax;          /* n_blocks (not nested) */
    const float *nested_absmax;   /* n_nested */
    const float *nested_map;      /* 256 */
    const float *code;            /* 16 */
    float offset;
} ft_nf4_view;

/* Quantizes x (n fp32 values) per l. Outputs: codes (code_bytes), and either (nested)
 * qabsmax (n_blocks), nested_absmax (n_nested), *offset, with absmax_tmp (n_blocks floats)
 * as scratch, or (not nested) absmax_tmp receives the fp32 absmax. map: 256 floats (the
 * dynamic map) when nested. Deterministic for any thread count. Returns 0 or FT_E_INVALID
 * (a NULL buffer) / FT_E_NUMERIC (a NaN or infinite input, named by its index).
 * Equivalent to ft_nf4_quantize_part over [0, n) followed by ft_nf4_quantize_nested. */
int ft_nf4_quantize(const float *x, const ft_nf4_layout *l, const float *map, uint8_t *codes,
                    uint8_t *qabsmax, float *nested_absmax, float *offset, float *absmax_tmp);

/* Stage 1 on elements [e0, e0 + count) of the tensor, x pointing at element e0: writes
 * their packed codes into codes (the whole tensor's code array) and their blocks' fp32
 * absmax into absmax (the whole tensor's n_blocks array). e0 must be a multiple of the
 * blocksize and count too, unless e0 + count == n. Lets a large tensor be quantized in row
 * chunks with bounded memory. Returns 0, FT_E_INVALID or FT_E_NUMERIC (index in the tensor). */
int ft_nf4_quantize_part(const float *x, const ft_nf4_layout *l, int64_t e0, int64_t count,
                         uint8_t *codes, float *absmax);

/* Stage 2, double quantization of the n_blocks absmax values: *offset, qabsmax (n_blocks)
 * and nested_absmax (n_nested). Returns 0 or FT_E_INVALID. */
int ft_nf4_quantize_nested(const float *absmax, const ft_nf4_layout *l, const float *map,
                           uint8_t *qabsmax, float *nested_absmax, float *offset);

/* ft_nf4_quantize_nested with the sum of the n_blocks absmax values given: absmax_sum must
 * be their exact sum rounded to double (as ft_nf4_fsum returns it; the pack builder computes
 * it in parallel). The outputs are then the same bits. Returns 0 or FT_E_INVALID. */
int ft_nf4_quantize_nested_sum(const float *absmax, const ft_nf4_layout *l, const float *map,
                               double absmax_sum, uint8_t *qabsmax, float *nested_absmax,
                               float *offset);

/* Dequantizes v into out (n fp32 values). Returns 0 or FT_E_INVALID (a NULL buffer). */
int ft_nf4_dequant(const ft_nf4_view *v, float *out);

/* Dequantizes elements [e0, e0 + count) of v into out (count floats). Returns 0 or
 * FT_E_INVALID (a NULL buffer, a range outside [0, n)). */
int ft_nf4_dequant_range(const ft_nf4_view *v, int64_t e0, int64_t count, float *out);

/* The fp32 absmax of block b (dequantized from the nested state when nested). */
float ft_nf4_block_absmax(const ft_nf4_view *v, int64_t b);

/* One element of bnb's dQuantize<0> (CUDA, non-stochastic): the index in the sorted
 * 256-entry map chosen for x in [-1, 1]. Exposed for tests. */
uint8_t ft_nf4_quant8(const float *map, float x);

/* One NF4 code: the number of thresholds below x (dQuantizeNF4). Exposed for tests. */
uint8_t ft_nf4_quant4(float x);

/* math.fsum-style correctly rounded double sum of n floats (Shewchuk's algorithm). */
double ft_nf4_fsum(const float *x, int64_t n);

#endif
