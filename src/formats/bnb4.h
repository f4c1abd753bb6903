/* bnb4.h - pre-quantized bitsandbytes 4-bit checkpoints (the `*-bnb-4bit` models users
 * download), read in place from the mapped safetensors: no bf16 copy on disk.
 *
 * Layout (formats.md 5.5; bnb nn/modules.py Linear4bit._save_to_state_dict,
 * QuantState.as_dict(packed=True)), for a weight named P = "...q_proj.weight":
 *   P                                   U8 [(n+1)/2, 1] packed NF4, high nibble first
 *                                       (another dtype when bnb_4bit_quant_storage is not
 *                                       uint8: the same bytes reinterpreted)
 *   P.absmax                            U8 [n_blocks] (nested) | F32 [n_blocks]
 *   P.quant_map                         F32 [16]
 *   P.nested_absmax                     F32 [ceil(n_blocks / nested_blocksize)] (nested)
 *   P.nested_quant_map                  F32 [256] (nested)
 *   P.quant_state.bitsandbytes__nf4     U8 [len]: JSON {"quant_type", "blocksize", "dtype",
 *                                       "shape", "nested_blocksize", "nested_dtype",
 *                                       "nested_offset"}
 * Dequantization follows bnb exactly (nf4.h): the nested map and offset come from the file;
 * the 4-bit code is bnb's built-in NF4 table (bnb's dequantize_4bit ignores the stored
 * quant_map too; its size is still checked). FP4 checkpoints are refused (FT_E_UNSUPPORTED).
 */
#ifndef FT_BNB4_H
#define FT_BNB4_H

#include <stdint.h>

#include "src/numeric/nf4.h"
#include "src/formats/safetensors.h"

typedef struct ft_bnb4_tensor {
    ft_nf4_view v;             /* codes/qabsmax point into the mapping; fp32 arrays into owned */
    float *owned;              /* aligned copies of absmax / nested_absmax / nested map */
    int64_t rows, cols;
    char dtype[24];            /* the weight's original dtype ("bfloat16") */
} ft_bnb4_tensor;

/* 1 if `weight` (a full tensor name) is stored bitsandbytes-4-bit in s (a companion
 * "<weight>.quant_state.bitsandbytes__*" tensor exists), 0 if not. */
int ft_bnb4_detect(const ft_st_set *s, const char *weight);

/* Parses and checks one quantized weight of shape (rows, cols): the quant-state JSON (quant
 * type, block sizes, shape, offset), each companion's dtype and size. Errors name the file
 * and the tensor: FT_E_INVALID (missing/ill-sized companion, bad JSON, shape mismatch),
 * FT_E_UNSUPPORTED (fp4), -ENOMEM. On success free t with ft_bnb4_free. */
int ft_bnb4_open(const ft_st_set *s, const char *weight, int64_t rows, int64_t cols,
                 ft_bnb4_tensor *t);
void ft_bnb4_free(ft_bnb4_tensor *t); /* NULL-safe, idempotent */

/* Dequantizes `weight` (rows x cols) to fp32 into dst: the hook a loader needs to read a
 * bnb-4bit folder as fp32. Returns 0 or an ft_bnb4_open error. */
int ft_bnb4_dequant(const ft_st_set *s, const char *weight, int64_t rows, int64_t cols, float *dst);

#endif
