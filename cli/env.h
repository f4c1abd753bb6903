/* env.h - the environment variables the library's behaviour depends on, read in one place:
 * only the program reads the environment (docs/architecture.md); it passes the values down
 * as options and config fields.
 *
 *   FTUNE_ATTN       gemm | flash | (unset, mma, other: auto)  -> ft_backend_tune.attn
 *   FTUNE_NF4_GEMM   fused | auto | (unset, other: dequant)    -> ft_backend_tune.nf4_gemm
 *   FTUNE_GEN_HEAD   f32 | (unset, other: bf16 tables)         -> ft_backend_tune.gen_head_f32
 *   FTUNE_CKPT_HOST  N > 0 | auto | (unset, other: last resort) -> ft_backend_tune.ckpt_host
 *   FTUNE_PACK_DIRECT 1 (O_DIRECT pack writes of init-model)   -> ft_init_cfg.pack_direct
 *   HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME -> ft_hub_env
 *   XDG_CACHE_HOME, HOME                                       -> the default --cache-dir
 */
#ifndef FT_CLI_ENV_H
#define FT_CLI_ENV_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "src/formats/hub_cache.h"

/* The backend's kernel and placement choices from the environment (see above). */
void ft_env_tune(ft_backend_tune *t);

/* The Hugging Face cache's variables (pointers into the environment, valid until it
 * changes). */
void ft_env_hub(ft_hub_env *e);

/* The pack cache folder: given (--cache-dir) if not NULL, else the default of $XDG_CACHE_HOME
 * and $HOME (offload/pack.h ft_pack_default_cache_dir) in buf (n bytes), else NULL (neither
 * set, or too long: the library then refuses a run that needs a pack, naming --cache-dir). */
const char *ft_env_pack_cache_dir(const char *given, char *buf, size_t n);

/* 1 when FTUNE_PACK_DIRECT starts with '1': init-model writes its pack with O_DIRECT. */
int ft_env_pack_direct(void);

#endif
