/* pack_model.h - a model whose base weights live in a pack file (offload/pack.h): the pack-only
 * folders of `ftune init-model --pack` and a base handed to its pack (QLoRA, a streamed bf16
 * base). The loader (src/model/model.h) knows such a pack by its path alone; these open it:
 * they check its header, block table and stored config against the model's config, read its
 * global tensors into the model, and turn a loaded model into a pack-only one. */
#ifndef FT_PACK_MODEL_H
#define FT_PACK_MODEL_H

#include "src/model/model.h"

/* ft_model_load, then for a pack-only folder ft_pack_model_check: the pack's header and block
 * table are validated (not its checksums: ft_pack_ensure verifies them) and its stored config
 * must match config.json's shapes. Returns ft_model_load's errors, the pack's own
 * FT_E_CORRUPT naming the file (prefixed "DIR: pack-only model (no safetensors)"), or
 * FT_E_INVALID naming both files and the first shape that differs; *out is NULL after an
 * error. */
int ft_pack_model_load(ft_model **out, const char *path);
/* The same over ft_model_load_deferred (weights checked, not read). */
int ft_pack_model_load_deferred(ft_model **out, const char *path);

/* For a pack-only model (no-op, 0, for any other): its pack opens and its stored config has
 * the shapes of m->cfg (config.json). Errors as ft_pack_model_load. */
int ft_pack_model_check(const ft_model *m);

/* For a pack-only model: reads the embeddings, final norm and LM head (== embed when tied)
 * from the pack's global block into fp32 host arrays owned by m (ft_model_take_globals; 2 x
 * vocab x hidden floats untied: 8.4 GB for Llama-3-70B), so code that reads
 * m->embed/final_norm/lm_head works; the layers stay in the pack. No-op (0) if already loaded
 * or not pack-only. Returns 0, -ENOMEM, or the pack's errors. */
int ft_pack_model_load_globals(ft_model *m);

/* Makes m a pack-only model of the pack file `pack` (ft_model_set_pack_only), freeing its host
 * weights if it had any: a QLoRA run once its pack is ready. The pack is opened and its
 * stored config compared with m's before anything is dropped: on an error m is as it was.
 * No-op on a pack-only model. Returns 0, FT_E_INVALID (the pack's stored config has other
 * shapes, naming the model and the pack), or the pack's open errors. */
int ft_pack_model_use(ft_model *m, const char *pack);

#endif
