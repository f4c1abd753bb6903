/* pack_model.c - a model's base from its pack file (see pack_model.h). */
#include "offload/pack_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/pack.h"
#include "src/core/align.h"
#include "src/core/err.h"

/* The shapes that must agree between config.json (a) and the pack's stored config (b): 1 if
 * they do, else 0 with the first difference in what. */
static int same_shapes(const ft_model_config *a, const ft_model_config *b, char *what, size_t n)
{
#define CMP(f)                                                                                   \
    if (a->f != b->f) {                                                                          \
        snprintf(what, n, #f " %lld in config.json, %lld in the pack", (long long)a->f,          \
                 (long long)b->f);                                                               \
        return 0;                                                                                \
    }
    CMP(num_hidden_layers) CMP(hidden_size) CMP(intermediate_size) CMP(num_attention_heads)
    CMP(num_key_value_heads) CMP(head_dim) CMP(vocab_size) CMP(tie_word_embeddings)
    CMP(attention_bias)
#undef CMP
    if (strcmp(a->model_type, b->model_type)) {
        snprintf(what, n, "model_type \"%s\" in config.json, \"%s\" in the pack", a->model_type,
                 b->model_type);
        return 0;
    }
    return 1;
}

int ft_pack_model_check(const ft_model *m)
{
    if (!m->pack_only[0]) return 0;
    ft_pack_file *p;
    int rc = ft_pack_open(&p, m->pack_only, 0);
    if (rc < 0) return ft_err_prefix(rc, "%s: pack-only model (no safetensors)", m->path);
    char what[256];
    if (!same_shapes(&m->cfg, ft_pack_config(p), what, sizeof what))
        rc = ft_err(FT_E_INVALID, "%s: pack-only model: %s does not match config.json: %s",
                    m->path, m->pack_only, what);
    ft_pack_close(p);
    return rc;
}

/* load (ft_model_load or ft_model_load_deferred), then the pack-only check. */
static int load_checked(ft_model **out, const char *path, int (*load)(ft_model **, const char *))
{
    FT_TRY(load(out, path));
    int rc = ft_pack_model_check(*out);
    if (rc < 0) {
        ft_model_free(*out);
        *out = NULL;
    }
    return rc;
}

int ft_pack_model_load(ft_model **out, const char *path)
{
    return load_checked(out, path, ft_model_load);
}

int ft_pack_model_load_deferred(ft_model **out, const char *path)
{
    return load_checked(out, path, ft_model_load_deferred);
}

int ft_pack_model_load_globals(ft_model *m)
{
    if (!m->pack_only[0] || m->embed) return 0;
    const ft_model_config *c = &m->cfg;
    const int64_t C = c->hidden_size, V = c->vocab_size, g = ft_model_global_floats(c);
    void *mem = NULL;
    if (g <= 0 || (uint64_t)g > SIZE_MAX / 4 || posix_memalign(&mem, 64, (size_t)g * 4))
        return ft_err(-ENOMEM, "%s: out of memory: cannot allocate %lld floats for the weights", m->path,
                      (long long)g);
    float *emb = mem, *fn = emb + ft_pad16(V * C);
    float *head = c->tie_word_embeddings ? emb : fn + ft_pad16(C);
    ft_pack_file *p = NULL;
    int rc = ft_pack_open(&p, m->pack_only, 0);
    if (!rc) rc = ft_pack_read_global(p, FT_PACK_ROLE_EMBED, 0, V, emb);
    if (!rc) rc = ft_pack_read_global(p, FT_PACK_ROLE_FINAL_NORM, 0, C, fn);
    if (!rc && !c->tie_word_embeddings)
        rc = ft_pack_read_global(p, FT_PACK_ROLE_LM_HEAD, 0, V, head);
    ft_pack_close(p);
    if (rc < 0) {
        free(mem);
        return rc;
    }
    ft_model_take_globals(m, mem);
    return 0;
}

int ft_pack_model_use(ft_model *m, const char *pack)
{
    if (m->pack_only[0]) return 0;
    ft_pack_file *p; /* checked before anything is dropped: on an error m is as it was */
    FT_TRY(ft_pack_open(&p, pack, 0));
    char what[256];
    int same = same_shapes(&m->cfg, ft_pack_config(p), what, sizeof what);
    ft_pack_close(p);
    if (!same) return ft_err(FT_E_INVALID, "%s: %s does not match the model: %s", m->path, pack, what);
    return ft_model_set_pack_only(m, pack);
}
