/* weight_source.h - where generation (src/infer/generate.h) reads the weights of a model
 * that has none in memory, as an interface the executor implements (offload/exec.h
 * ft_exec_gen_source), so that offload/ needs no header of src/infer (a higher layer). */
#ifndef FT_WEIGHT_SOURCE_H
#define FT_WEIGHT_SOURCE_H

#include <stdint.h>

#include "src/model/model.h"

/* Where generation reads the weights of a model that has none in memory (a QLoRA base
 * served from its NF4 pack, a pack-only folder): offload/exec.h ft_exec_gen_source gives
 * one over an executor on the pack. All pointers are in the backend's memory.
 *   begin(ctx) / end(ctx): around each forward's layer visits 0..L-1 (may be NULL);
 *   layer(ctx, l, n, &w): layer l's weights for a forward of n tokens (projections of any
 *     wtype the backend's linear_fwd takes: fp32, bf16, NF4; a source may choose by n), valid
 *     until the next call;
 *   embed: the (V, C) table, or NULL: embed_rows(ctx, ids (host), n, out (n, C)) gathers;
 *   final_norm (C), lm_head (V, C) fp32 for lm_head_logits, or NULL when head is set:
 *   head(ctx, logits (rows, V), x (rows, C), rows): the LM head computed by the source (may be
 *     NULL; when set, every forward's logits come from it), e.g. over a bf16 table
 *     (lm_head_logits_bf16: an executor on a pack on the CPU). */
typedef struct ft_gen_source {
    void *ctx;
    int (*begin)(void *ctx);
    int (*layer)(void *ctx, int64_t l, int64_t n, const ft_layer_weights **w);
    int (*end)(void *ctx);
    int (*embed_rows)(void *ctx, const int32_t *ids, int64_t n, float *out);
    const float *embed, *final_norm, *lm_head;
    int (*head)(void *ctx, float *logits, const float *x, int64_t rows);
} ft_gen_source;

#endif
