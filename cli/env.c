/* env.c - the environment variables the library's behaviour depends on (env.h). */
#include "cli/env.h"

#include <stdlib.h>
#include <string.h>

#include "offload/pack.h"

static int is(const char *v, const char *s) { return v && !strcmp(v, s); }

void ft_env_tune(ft_backend_tune *t)
{
    memset(t, 0, sizeof *t);
    const char *v = getenv("FTUNE_ATTN");
    t->attn = is(v, "gemm") ? FT_ATTN_GEMM : is(v, "flash") ? FT_ATTN_FLASH : FT_ATTN_AUTO;
    v = getenv("FTUNE_NF4_GEMM");
    t->nf4_gemm = is(v, "fused") ? FT_NF4_GEMM_FUSED : is(v, "auto") ? FT_NF4_GEMM_AUTO
                                                                      : FT_NF4_GEMM_DEQUANT;
    t->gen_head_f32 = is(getenv("FTUNE_GEN_HEAD"), "f32");
    v = getenv("FTUNE_CKPT_HOST");
    t->ckpt_host = v && atoi(v) > 0 ? FT_CKPT_HOST_ALWAYS
                 : is(v, "auto")    ? FT_CKPT_HOST_AUTO
                                    : FT_CKPT_HOST_LAST_RESORT;
}

void ft_env_hub(ft_hub_env *e)
{
    e->hf_hub_cache = getenv("HF_HUB_CACHE");
    e->huggingface_hub_cache = getenv("HUGGINGFACE_HUB_CACHE");
    e->hf_home = getenv("HF_HOME");
    e->xdg_cache_home = getenv("XDG_CACHE_HOME");
    e->home = getenv("HOME");
}

const char *ft_env_pack_cache_dir(const char *given, char *buf, size_t n)
{
    if (given) return given;
    return ft_pack_default_cache_dir(getenv("XDG_CACHE_HOME"), getenv("HOME"), buf, n) < 0 ? NULL
                                                                                            : buf;
}

int ft_env_pack_direct(void)
{
    const char *v = getenv("FTUNE_PACK_DIRECT");
    return v && v[0] == '1';
}
