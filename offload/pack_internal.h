/* pack_internal.h - layout helpers shared by pack.c (reader), pack_build.c and pack_src.c,
 * and tiers.c (which bias records a block holds); not part of the public interface. */
#ifndef FT_PACK_INTERNAL_H
#define FT_PACK_INTERNAL_H

#include <stdint.h>

#include "offload/pack.h"

#define FT_PACK_MAX_SLOTS 24

static inline int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* One tensor of a block in directory order: role, shape, and whether it is a linear
 * weight (quantized in NF4 packs). */
typedef struct ft_pack_slot { int role; int64_t rows, cols; int linear; } ft_pack_slot;

/* 1 if projection p carries a bias (q/k/v with attention_bias; o too unless qwen2). */
int ft_pack_has_bias(const ft_model_config *c, int p);
/* The slots of block l (-1: global); returns their count (<= FT_PACK_MAX_SLOTS). */
int ft_pack_block_slots(const ft_model_config *c, int64_t l, ft_pack_slot *out);
/* Fills record r for slot sl stored as dtype, data placed from *pos (advanced). */
int ft_pack_place(ft_pack_tensor *r, const ft_pack_slot *sl, int dtype, int64_t bs, int64_t nbs,
                  int64_t *pos);
/* The fewest bytes block l (-1: global) of a pack of quant `quant` can have for config c:
 * its directory and every tensor's values (NF4 codes only; no alignment). UINT64_MAX when a
 * tensor's element count or the sum would overflow (heads * head_dim * hidden can, within
 * config.c's per-field bounds). */
uint64_t ft_pack_min_block_bytes(const ft_model_config *c, int64_t l, uint32_t quant);
/* Plans block l: records, count, padded size, and which slots come pre-quantized. */
int ft_pack_plan_block(const ft_model_config *c, const ft_pack_settings *s, const ft_pack_src *src,
                       int64_t l, ft_pack_tensor *rec, int *n_rec, int64_t *bytes, int *pre);

#endif
