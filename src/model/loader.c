/* loader.c - ft_model_load for HF folders (config.json + safetensors) and GGUF files,
 * weights converted to fp32 HF layout (see model.h). Tensor names: formats.md 2.3 (HF) and
 * 4.2 (GGUF base names); llama.cpp's q/k row permutation is undone per formats.md 2.4. Also
 * ft_gguf_load_tokenizer (declared in gguf.h). */
#include <stddef.h> /* config.h uses size_t without including it */

#include "src/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dirent.h>

#include "src/core/align.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/bnb4.h"
#include "src/formats/gguf.h"
#include "src/numeric/quant.h"
#include "src/formats/safetensors.h"
#include "src/template/chat.h"

/* GGUF base names by projection (gguf-py TENSOR_NAMES, formats.md 4.2). */
static const char *const k_gguf_proj[FT_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down"};

typedef struct {
    float *glob;       /* embed | final_norm | lm_head (untied only) */
    float **layer;     /* one buffer per layer */
    int64_t n_layer;
} model_priv;

static float *alloc_floats(int64_t n, const char *path)
{
    void *p = NULL;
    if (n <= 0 || (uint64_t)n > SIZE_MAX / 4 || posix_memalign(&p, 64, (size_t)n * 4)) {
        ft_err(-ENOMEM, "%s: out of memory: cannot allocate %lld floats for the weights", path, (long long)n);
        return NULL;
    }
    return p;
}

/* Allocates all fp32 buffers and points the model's arrays into them. */
static int carve(ft_model *m, int o_bias)
{
    const ft_model_config *c = &m->cfg;
    const int64_t C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    model_priv *pv = calloc(1, sizeof *pv);
    m->layers = calloc((size_t)L, sizeof *m->layers);
    if (!pv || !m->layers) {
        free(pv);
        return ft_err(-ENOMEM, "%s: out of memory", m->path);
    }
    m->priv = pv;
    pv->layer = calloc((size_t)L, sizeof *pv->layer);
    if (!pv->layer) return ft_err(-ENOMEM, "%s: out of memory", m->path);
    pv->n_layer = L;
    int64_t g = ft_pad16(V * C) + ft_pad16(C) + (c->tie_word_embeddings ? 0 : ft_pad16(V * C));
    if (!(pv->glob = alloc_floats(g, m->path))) return -ENOMEM;
    m->embed = pv->glob;
    m->final_norm = m->embed + ft_pad16(V * C);
    m->lm_head = c->tie_word_embeddings ? m->embed : m->final_norm + ft_pad16(C);
    int64_t lf = ft_layer_floats(c, o_bias);
    for (int64_t l = 0; l < L; l++) {
        if (!(pv->layer[l] = alloc_floats(lf, m->path))) return -ENOMEM;
        ft_layer_carve(c, o_bias, pv->layer[l], &m->layers[l]);
    }
    return 0;
}

static void drop_weights(ft_model *m);

void ft_model_free(ft_model *m)
{
    if (!m) return;
    drop_weights(m);
    free(m);
}

int64_t ft_model_n_params(const ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    int64_t n = c->vocab_size * c->hidden_size * (c->tie_word_embeddings ? 1 : 2) + c->hidden_size;
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const ft_layer_weights *w = &m->layers[l];
        n += 2 * c->hidden_size + (c->qk_norm ? 2 * c->head_dim : 0);
        for (int p = 0; p < FT_N_PROJ; p++) {
            /* a pack-only model has no bias arrays: the config says which exist */
            int bias = m->pack_only[0] || ft_model_deferred(m)
                           ? ft_proj_has_bias(c, p, strcmp(c->model_type, "qwen2") != 0)
                           : w->proj[p].b != NULL;
            n += w->proj[p].out_n * w->proj[p].in_n + (bias ? w->proj[p].out_n : 0);
        }
    }
    return n;
}

static void fmt_shape(char *buf, size_t n, const int64_t *s, int nd)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < nd && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)s[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ---- Hugging Face folder ---------------------------------------------------------------- */

/* Reads tensor `name` of HF shape (rows[, cols]) into dst as fp32; with dst NULL only checks
 * that it exists with that shape and a convertible dtype. */
static int hf_tensor(const ft_st_set *s, const char *dir, const char *name, int nd, int64_t rows,
                     int64_t cols, float *dst)
{
    const ft_st_file *f = NULL;
    const ft_st_tensor *t = ft_st_set_find(s, name, &f);
    if (!t)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" not found in the model's safetensors", dir,
                      name);
    if (nd == 2 && ft_bnb4_detect(s, name)) { /* a bitsandbytes 4-bit weight (formats.md 5.5) */
        if (dst) return ft_bnb4_dequant(s, name, rows, cols, dst);
        ft_bnb4_tensor b;
        int rc = ft_bnb4_open(s, name, rows, cols, &b);
        ft_bnb4_free(&b);
        return rc;
    }
    int64_t want[2] = {rows, cols};
    int ok = t->n_dims == nd;
    for (int d = 0; ok && d < nd; d++) ok = t->shape[d] == want[d];
    if (!ok) {
        char a[128], b[128];
        fmt_shape(a, sizeof a, t->shape, t->n_dims);
        fmt_shape(b, sizeof b, want, nd);
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" has shape %s, expected %s (from "
                      "config.json)", ft_st_path(f), name, a, b);
    }
    if (t->dtype != FT_ST_F32 && t->dtype != FT_ST_F16 && t->dtype != FT_ST_BF16)
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\": dtype %s cannot be converted to fp32 "
                      "(F32, F16 and BF16 can)", ft_st_path(f), name, ft_st_dtype_name(t->dtype));
    if (!dst) return 0; /* checking pass */
    int rc = ft_st_to_f32(t, dst, nd == 2 ? rows * cols : rows);
    if (rc < 0) return ft_err_prefix(rc, "%s", ft_st_path(f));
    return 0;
}

static int ends_with(const char *s, const char *suf);

/* ---- pack-only folder -------------------------------------------------------------------- */

/* 1 if dir has no model.safetensors, index or *.safetensors file (then a pack may stand in). */
static int no_safetensors(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return 0; /* let the safetensors path report it */
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dp)))
        n += ends_with(de->d_name, ".safetensors") || !strcmp(de->d_name, "model.safetensors.index.json");
    closedir(dp);
    return n == 0;
}

/* Frees the host weights of m (the model's shapes stay in m->cfg). */
static void drop_weights(ft_model *m)
{
    model_priv *pv = m->priv;
    if (pv) {
        for (int64_t l = 0; l < pv->n_layer; l++) free(pv->layer[l]);
        free(pv->layer);
        free(pv->glob);
        free(pv);
    }
    free(m->layers);
    m->priv = NULL;
    m->layers = NULL;
    m->embed = m->final_norm = m->lm_head = NULL;
}

/* The shapes of m->cfg without weights (model.h's pack-only form): every projection's
 * out_n/in_n, every array NULL. */
static int shapes_only(ft_model *m)
{
    const ft_model_config *c = &m->cfg;
    model_priv *pv = calloc(1, sizeof *pv);
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!pv || !m->layers) {
        free(pv);
        return ft_err(-ENOMEM, "%s: out of memory", m->path);
    }
    m->priv = pv;
    for (int64_t l = 0; l < c->num_hidden_layers; l++)
        for (int q = 0; q < FT_N_PROJ; q++)
            ft_proj_dims(c, q, &m->layers[l].proj[q].out_n, &m->layers[l].proj[q].in_n);
    return 0;
}

/* The pack-only form of m (model.h): shapes without weights, pack_only = the pack's path. The
 * pack itself is not opened here: offload/pack_model.h checks it against the config. */
static int pack_only_form(ft_model *m, const char *pack)
{
    if (strlen(pack) >= sizeof m->pack_only) return ft_err(FT_E_RANGE, "%s: path too long", pack);
    FT_TRY(shapes_only(m));
    snprintf(m->pack_only, sizeof m->pack_only, "%s", pack);
    return 0;
}

int ft_model_require_weights(const ft_model *m, const char *what)
{
    if (!m->pack_only[0]) return 0;
    return ft_err(FT_E_UNSUPPORTED, "%s: pack-only model (no safetensors, weights only in %s): "
                  "%s needs the model's weights in memory; only training/eval through the "
                  "executor reads it (write safetensors with `ftune init-model --pack "
                  "--safetensors`)", m->path, m->pack_only, what ? what : "this command");
}

int64_t ft_model_global_floats(const ft_model_config *c)
{
    const int64_t C = c->hidden_size, V = c->vocab_size;
    return ft_pad16(V * C) + ft_pad16(C) + (c->tie_word_embeddings ? 0 : ft_pad16(V * C));
}

void ft_model_take_globals(ft_model *m, float *buf)
{
    const ft_model_config *c = &m->cfg;
    model_priv *pv = m->priv;
    pv->glob = buf;
    m->embed = buf;
    m->final_norm = buf + ft_pad16(c->vocab_size * c->hidden_size);
    m->lm_head = c->tie_word_embeddings ? m->embed : m->final_norm + ft_pad16(c->hidden_size);
}

/* A Hugging Face folder (or a pack-only one). defer: check every tensor, read none (the
 * shapes-only form, ft_model_deferred). */
static int load_hf(ft_model *m, const char *dir, int defer)
{
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, "config.json"));
    FT_TRY(ft_config_load(&m->cfg, p));
    const ft_model_config *c = &m->cfg;
    if (no_safetensors(dir)) { /* `ftune init-model --pack`: config.json + the pack only */
        static const char *const packs[] = {FT_PACK_LOCAL_NF4, FT_PACK_LOCAL_BF16};
        for (int k = 0; k < 2; k++) {
            FT_TRY(ft_path_join(p, sizeof p, dir, packs[k]));
            if (access(p, F_OK) == 0) return pack_only_form(m, p);
        }
    }
    ft_st_set *s;
    FT_TRY(ft_st_set_open(&s, dir));
    /* llama-type attention_bias also gives o_proj a bias; qwen2 never has one */
    int o_bias = strcmp(c->model_type, "qwen2") != 0, rc = 0;
    const int64_t C = c->hidden_size, V = c->vocab_size;
    char name[256];
    if (!c->attention_bias && ft_st_set_find(s, "model.layers.0.self_attn.q_proj.bias", NULL))
        rc = ft_err(FT_E_INVALID, "%s: the checkpoint has attention biases "
                    "(model.layers.0.self_attn.q_proj.bias) but config.json does not set "
                    "attention_bias", dir);
    /* pass 0 checks every name, shape and dtype before anything is allocated (so the
     * allocation is bounded by the files' sizes); pass 1 converts */
    for (int pass = 0; pass < (defer ? 1 : 2) && !rc; pass++) {
        if (pass == 1 && (rc = carve(m, o_bias)) < 0) break;
#define DST(x) (pass ? (x) : NULL)
        rc = hf_tensor(s, dir, "model.embed_tokens.weight", 2, V, C, DST(m->embed));
        if (!rc) rc = hf_tensor(s, dir, "model.norm.weight", 1, C, 0, DST(m->final_norm));
        if (!rc && !c->tie_word_embeddings)
            rc = hf_tensor(s, dir, "lm_head.weight", 2, V, C, DST(m->lm_head));
        for (int64_t l = 0; !rc && l < c->num_hidden_layers; l++) {
            ft_layer_weights *w = pass ? &m->layers[l] : NULL;
            snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
            rc = hf_tensor(s, dir, name, 1, C, 0, DST(w->attn_norm));
            snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight",
                     (long long)l);
            if (!rc) rc = hf_tensor(s, dir, name, 1, C, 0, DST(w->ffn_norm));
            for (int k = 0; !rc && c->qk_norm && k < 2; k++) { /* Qwen3 per-head q/k norms */
                snprintf(name, sizeof name, "model.layers.%lld.self_attn.%s.weight", (long long)l,
                         k ? "k_norm" : "q_norm");
                if (!ft_st_set_find(s, name, NULL))
                    rc = ft_err(FT_E_INVALID, "%s: tensor \"%s\" not found in the model's "
                                "safetensors (model_type %s normalizes q and k per head: "
                                "self_attn.q_norm and k_norm of head_dim = %lld values per layer)",
                                dir, name, c->model_type, (long long)c->head_dim);
                else
                    rc = hf_tensor(s, dir, name, 1, c->head_dim, 0, DST(k ? w->k_norm : w->q_norm));
            }
            for (int q = 0; !rc && q < FT_N_PROJ; q++) {
                int64_t out, in;
                ft_proj_dims(c, q, &out, &in);
                snprintf(name, sizeof name, "model.layers.%lld.%s.%s.weight", (long long)l,
                         ft_proj_parent[q], ft_proj_name[q]);
                rc = hf_tensor(s, dir, name, 2, out, in, DST(w->proj[q].w));
                if (!rc && ft_proj_has_bias(c, q, o_bias)) {
                    snprintf(name, sizeof name, "model.layers.%lld.%s.%s.bias", (long long)l,
                             ft_proj_parent[q], ft_proj_name[q]);
                    rc = hf_tensor(s, dir, name, 1, out, 0, DST(w->proj[q].b));
                }
            }
        }
#undef DST
    }
    ft_st_set_close(s);
    if (!rc && defer) rc = shapes_only(m);
    return rc;
}

/* ---- GGUF file ---------------------------------------------------------------------------- */

/* Reads an integer/float key "{arch}.{suffix}"; 0 absent (unless required), 1 read. */
static int g_int(const ft_gguf *g, const char *arch, const char *suffix, int64_t *v, int required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = ft_gguf_get_int(g, key, v);
    if (rc == FT_E_NOTFOUND && !required) return 0;
    if (rc == FT_E_NOTFOUND)
        return ft_err(FT_E_INVALID, "%s: missing required metadata key \"%s\"", ft_gguf_path(g), key);
    return rc < 0 ? rc : 1;
}

static int g_num(const ft_gguf *g, const char *arch, const char *suffix, double *v, int required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = ft_gguf_get_float(g, key, v);
    if (rc == FT_E_NOTFOUND && !required) return 0;
    if (rc == FT_E_NOTFOUND)
        return ft_err(FT_E_INVALID, "%s: missing required metadata key \"%s\"", ft_gguf_path(g), key);
    return rc < 0 ? rc : 1;
}

/* llama.cpp's converter stores Llama-3.1 rope scaling as per-frequency divisors in
 * rope_freqs.weight (factor for long wavelengths, 1 for short, smooth between). The result
 * depends only on factor, old/low_freq_factor and old/high_freq_factor, so the parameters
 * are recovered from the divisors (old fixed to original_context_length or 8192) and the
 * fit is verified against every divisor. */
static int gguf_rope_freqs(const ft_gguf *g, ft_model_config *c, int64_t orig_ctx)
{
    const ft_gguf_tensor *t = ft_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t) return 0;
    const int64_t half = c->head_dim / 2;
    if (t->n_elems != half)
        return ft_err(FT_E_INVALID, "%s: tensor \"rope_freqs.weight\" has %lld elements, expected "
                      "head_dim/2 = %lld", ft_gguf_path(g), (long long)t->n_elems, (long long)half);
    float *fr = malloc((size_t)half * sizeof *fr), *inv = malloc((size_t)half * sizeof *inv);
    int rc = fr && inv ? ft_gguf_tensor_f32(g, t, fr) : ft_err(-ENOMEM, "out of memory");
    if (rc < 0) goto done;
    double factor = 1;
    for (int64_t i = 0; i < half; i++) factor = fr[i] > factor ? fr[i] : factor;
    if (factor == 1) goto done; /* all ones: no scaling */
    ft_model_config d = *c;
    d.rope_type = FT_ROPE_DEFAULT;
    ft_rope_inv_freq(&d, 0, inv);
    double old = orig_ctx > 0 ? (double)orig_ctx : 8192.0, lf = 1, hf = 4;
    int64_t a = -1, b = -1; /* first and last smooth-region divisors */
    for (int64_t i = 0; i < half; i++)
        if (fr[i] > 1 + 1e-6 && fr[i] < factor - 1e-6) {
            if (a < 0) a = i;
            b = i;
        }
    if (a >= 0 && b > a) {
        /* s = (old/wl - lf)/(hf - lf) and 1/f = (1-s)/factor + s */
        double xa = old * inv[a] / (2 * M_PI), xb = old * inv[b] / (2 * M_PI);
        double sa = (1 / fr[a] - 1 / factor) / (1 - 1 / factor);
        double sb = (1 / fr[b] - 1 / factor) / (1 - 1 / factor);
        double width = (xb - xa) / (sb - sa);
        lf = xa - sa * width;
        hf = lf + width;
        double rl = round(lf * 1e3) / 1e3, rh = round(hf * 1e3) / 1e3;
        if (fabs(rl - lf) < 1e-3 * fabs(lf)) lf = rl;
        if (fabs(rh - hf) < 1e-3 * fabs(hf)) hf = rh;
    }
    if (!(lf > 0) || !(hf > lf)) {
        rc = ft_err(FT_E_UNSUPPORTED, "%s: tensor \"rope_freqs.weight\" does not describe llama3 "
                    "rope scaling (fitted low/high freq factors %g/%g)", ft_gguf_path(g), lf, hf);
        goto done;
    }
    for (int64_t i = 0; i < half; i++) {
        double wl = 2 * M_PI / inv[i], want;
        if (wl < old / hf) want = 1;
        else if (wl > old / lf) want = factor;
        else {
            double sm = (old / wl - lf) / (hf - lf);
            want = 1 / ((1 - sm) / factor + sm);
        }
        if (!(fabs(want - fr[i]) <= 1e-3 * want)) {
            rc = ft_err(FT_E_UNSUPPORTED, "%s: tensor \"rope_freqs.weight\": element %lld = %g is "
                        "not llama3 rope scaling (expected %g for factor %g, low/high freq "
                        "factors %g/%g); custom per-frequency factors are not supported",
                        ft_gguf_path(g), (long long)i, (double)fr[i], want, factor, lf, hf);
            goto done;
        }
    }
    c->rope_type = FT_ROPE_LLAMA3;
    c->rope_factor = factor;
    c->rope_low_freq_factor = lf;
    c->rope_high_freq_factor = hf;
    c->rope_original_max_position_embeddings = (int64_t)old;
done:
    free(fr);
    free(inv);
    return rc;
}

int ft_gguf_model_config(const ft_gguf *g, ft_model_config *c, const char **arch_out)
{
    const char *path = ft_gguf_path(g), *arch = NULL;
    int rc = ft_gguf_get_str(g, "general.architecture", &arch);
    if (rc == FT_E_NOTFOUND)
        return ft_err(FT_E_INVALID, "%s: missing required metadata key \"general.architecture\"", path);
    FT_TRY(rc);
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3"))
        return ft_err(FT_E_UNSUPPORTED, "%s: general.architecture \"%.64s\" is not supported "
                      "(llama, qwen2, qwen3)", path, arch);
    *arch_out = arch;
    memset(c, 0, sizeof *c);
    snprintf(c->model_type, sizeof c->model_type, "%s", arch);
    FT_TRY(g_int(g, arch, "block_count", &c->num_hidden_layers, 1));
    FT_TRY(g_int(g, arch, "embedding_length", &c->hidden_size, 1));
    FT_TRY(g_int(g, arch, "feed_forward_length", &c->intermediate_size, 1));
    FT_TRY(g_int(g, arch, "attention.head_count", &c->num_attention_heads, 1));
    FT_TRY(g_int(g, arch, "attention.head_count_kv", &c->num_key_value_heads, 0));
    c->max_position_embeddings = 2048;
    FT_TRY(g_int(g, arch, "context_length", &c->max_position_embeddings, 0));
    double eps = 0;
    FT_TRY(g_num(g, arch, "attention.layer_norm_rms_epsilon", &eps, 1));
    c->rms_norm_eps = (float)eps;
    c->rope_theta = 10000.0;
    FT_TRY(g_num(g, arch, "rope.freq_base", &c->rope_theta, 0));
    int64_t rot = 0, key_len = 0;
    FT_TRY(g_int(g, arch, "rope.dimension_count", &rot, 0));
    FT_TRY(g_int(g, arch, "attention.key_length", &key_len, 0));
    c->head_dim = key_len ? key_len : rot;
    if (rot && key_len && rot != key_len)
        return ft_err(FT_E_UNSUPPORTED, "%s: %s.rope.dimension_count (%lld) differs from "
                      "attention.key_length (%lld): partial rotary embeddings are not supported",
                      path, arch, (long long)rot, (long long)key_len);
    const ft_gguf_tensor *emb = ft_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return ft_err(FT_E_INVALID, "%s: tensor \"token_embd.weight\" not found", path);
    c->vocab_size = emb->ne[1];
    int64_t v = 0;
    if (g_int(g, arch, "vocab_size", &v, 0) == 1 && v != emb->ne[1])
        return ft_err(FT_E_INVALID, "%s: %s.vocab_size = %lld but token_embd.weight has %lld rows",
                      path, arch, (long long)v, (long long)emb->ne[1]);
    c->tie_word_embeddings = ft_gguf_find_tensor(g, "output.weight") == NULL;
    c->attention_bias = !strcmp(arch, "qwen2") || ft_gguf_find_tensor(g, "blk.0.attn_q.bias");
    c->qk_norm = !strcmp(arch, "qwen3"); /* blk.N.attn_q_norm / attn_k_norm (head_dim) */

    /* rope scaling: {arch}.rope.scaling.* (llama.cpp keys), legacy rope.scale_linear */
    c->rope_type = FT_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->rope_attention_factor = 1.0;
    c->rope_beta_fast = 32.0;
    c->rope_beta_slow = 1.0;
    char key[128];
    const char *st = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    rc = ft_gguf_get_str(g, key, &st);
    if (rc < 0 && rc != FT_E_NOTFOUND) return rc;
    double f = 0;
    FT_TRY(g_num(g, arch, "rope.scaling.factor", &f, 0));
    int64_t orig = 0;
    FT_TRY(g_int(g, arch, "rope.scaling.original_context_length", &orig, 0));
    if (!st && g_num(g, arch, "rope.scale_linear", &f, 0) == 1 && f != 1.0) st = "linear";
    if (st && strcmp(st, "none")) {
        if (!strcmp(st, "linear")) c->rope_type = FT_ROPE_LINEAR;
        else if (!strcmp(st, "yarn")) c->rope_type = FT_ROPE_YARN;
        else
            return ft_err(FT_E_UNSUPPORTED, "%s: %s = \"%.32s\" is not supported (none, linear, "
                          "yarn)", path, key, st);
        if (!(f > 0))
            return ft_err(FT_E_INVALID, "%s: rope scaling \"%s\" needs %s.rope.scaling.factor > 0",
                          path, st, arch);
        c->rope_factor = f;
        c->rope_original_max_position_embeddings = orig;
        FT_TRY(g_num(g, arch, "rope.scaling.yarn_beta_fast", &c->rope_beta_fast, 0));
        FT_TRY(g_num(g, arch, "rope.scaling.yarn_beta_slow", &c->rope_beta_slow, 0));
    }
    /* special ids from the tokenizer metadata */
    c->bos_token_id = -1;
    c->n_eos = 0;
    int64_t id;
    if (ft_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &id) == 0) c->bos_token_id = id;
    if (ft_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &id) == 0) c->eos_token_id[c->n_eos++] = id;
    if (ft_gguf_get_int(g, "tokenizer.ggml.eot_token_id", &id) == 0 &&
        (c->n_eos == 0 || c->eos_token_id[0] != id))
        c->eos_token_id[c->n_eos++] = id;
    FT_TRY(ft_config_validate(c, path));
    if (c->rope_type == FT_ROPE_DEFAULT && !strcmp(arch, "llama"))
        FT_TRY(gguf_rope_freqs(g, c, orig));
    return 0;
}

/* FT_E_CORRUPT naming the tensor and the element when one of n dequantized values is not
 * finite: a model has none, so an inf or NaN (a corrupt scale, say) is refused at load
 * rather than surfacing as NaN losses. first is the index of v[0] in the tensor. */
static int check_finite(const char *path, const char *name, const float *v, int64_t n,
                        int64_t first)
{
    const int64_t i = ft_quant_first_nonfinite(v, n);
    if (i == n) return 0;
    return ft_err(FT_E_CORRUPT, "%s: tensor \"%s\": element %lld dequantizes to %s (a corrupt "
                  "file)", path, name, (long long)(first + i), isnan(v[i]) ? "NaN" : "infinity");
}

/* Dequantizes tensor `name`, which must have ggml ne = [cols, rows] (HF (rows, cols)), or
 * ne = [rows] when cols == 0; with dst NULL only checks name, shape and type. If perm_heads > 0 the rows are un-permuted from llama.cpp's
 * interleaved q/k layout: hf_row[h*hd + j*hd/2 + i] = gguf_row[h*hd + 2*i + j]. */
static int gguf_tensor(const ft_gguf *g, const char *name, int64_t rows, int64_t cols,
                       int64_t head_dim, float *dst, float *tmp)
{
    const char *path = ft_gguf_path(g);
    const ft_gguf_tensor *t = ft_gguf_find_tensor(g, name);
    if (!t) return ft_err(FT_E_INVALID, "%s: tensor \"%s\" not found", path, name);
    int64_t want[FT_GGUF_MAX_DIMS] = {cols ? cols : rows, cols ? rows : 1, 1, 1};
    int ok = 1;
    for (int d = 0; d < FT_GGUF_MAX_DIMS; d++) ok &= t->ne[d] == want[d];
    if (!ok) {
        char a[128], b[128], hf[128];
        int64_t hs[2] = {rows, cols};
        fmt_shape(a, sizeof a, t->ne, t->n_dims);
        fmt_shape(b, sizeof b, want, cols ? 2 : 1);
        fmt_shape(hf, sizeof hf, hs, cols ? 2 : 1);
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" has ne %s, expected ne %s (HF shape %s; "
                      "ggml ne is innermost first)", path, name, a, b, hf);
    }
    if (!ft_quant_can_dequant(t->type))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\" has ggml type %s (%d); supported: "
                      FT_QUANT_DEQUANT_LIST, path, name, ft_quant_name(t->type), t->type);
    if (!dst) return 0; /* checking pass */
    if (!head_dim) {
        FT_TRY(ft_gguf_tensor_f32(g, t, dst));
        return check_finite(path, name, dst, t->n_elems, 0);
    }
    FT_TRY(ft_gguf_tensor_f32(g, t, tmp));
    FT_TRY(check_finite(path, name, tmp, t->n_elems, 0));
    const int64_t w = cols ? cols : 1, half = head_dim / 2, heads = rows / head_dim;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < half; i++)
                memcpy(dst + (h * head_dim + j * half + i) * w,
                       tmp + (h * head_dim + 2 * i + j) * w, (size_t)w * sizeof *dst);
    return 0;
}

/* A GGUF file. defer: check every tensor, read none (the shapes-only form, ft_model_deferred). */
static int load_gguf(ft_model *m, const char *path, int defer)
{
    ft_gguf *g;
    FT_TRY(ft_gguf_open(&g, path));
    const char *arch = NULL;
    int rc = ft_gguf_model_config(g, &m->cfg, &arch);
    const ft_model_config *c = &m->cfg;
    int permute = !rc && !strcmp(arch, "llama"); /* NORM rope in llama.cpp: rows interleaved;
                                                  * qwen2/qwen3 are NEOX: rows as in HF */
    int o_bias = !rc && strcmp(arch, "qwen2") && ft_gguf_find_tensor(g, "blk.0.attn_output.bias");
    float *tmp = NULL;
    const int64_t C = c->hidden_size, V = c->vocab_size, D = c->head_dim;
    char name[128];
    /* pass 0 checks names, shapes and types before allocating; pass 1 dequantizes */
    for (int pass = 0; pass < (defer ? 1 : 2) && !rc; pass++) {
        if (pass == 1) {
            if ((rc = carve(m, o_bias)) < 0) break;
            int64_t out, in;
            ft_proj_dims(c, FT_Q, &out, &in);
            if (permute && !(tmp = alloc_floats(out * in, path))) {
                rc = -ENOMEM;
                break;
            }
        }
#define DST(x) (pass ? (x) : NULL)
        rc = gguf_tensor(g, "token_embd.weight", V, C, 0, DST(m->embed), NULL);
        if (!rc) rc = gguf_tensor(g, "output_norm.weight", C, 0, 0, DST(m->final_norm), NULL);
        if (!rc && !c->tie_word_embeddings)
            rc = gguf_tensor(g, "output.weight", V, C, 0, DST(m->lm_head), NULL);
        for (int64_t l = 0; !rc && l < c->num_hidden_layers; l++) {
            ft_layer_weights *w = pass ? &m->layers[l] : NULL;
            snprintf(name, sizeof name, "blk.%lld.attn_norm.weight", (long long)l);
            rc = gguf_tensor(g, name, C, 0, 0, DST(w->attn_norm), NULL);
            snprintf(name, sizeof name, "blk.%lld.ffn_norm.weight", (long long)l);
            if (!rc) rc = gguf_tensor(g, name, C, 0, 0, DST(w->ffn_norm), NULL);
            for (int k = 0; !rc && c->qk_norm && k < 2; k++) { /* qwen3: NEOX rope, no permutation */
                snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l,
                         k ? "attn_k_norm" : "attn_q_norm");
                rc = gguf_tensor(g, name, D, 0, 0, DST(k ? w->k_norm : w->q_norm), NULL);
            }
            for (int p = 0; !rc && p < FT_N_PROJ; p++) {
                int64_t out, in, hd = permute && (p == FT_Q || p == FT_K) ? D : 0;
                ft_proj_dims(c, p, &out, &in);
                snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l, k_gguf_proj[p]);
                rc = gguf_tensor(g, name, out, in, hd, DST(w->proj[p].w), tmp);
                if (!rc && ft_proj_has_bias(c, p, o_bias)) {
                    snprintf(name, sizeof name, "blk.%lld.%s.bias", (long long)l, k_gguf_proj[p]);
                    rc = gguf_tensor(g, name, out, 0, hd, DST(w->proj[p].b), tmp);
                }
            }
        }
#undef DST
    }
    free(tmp);
    ft_gguf_close(g);
    if (!rc && defer) rc = shapes_only(m);
    return rc;
}

/* ---- HF tensors of a GGUF model, by rows (a pack built from the file) -------------------- */

/* Numbers "model.layers.N." off an HF name: N into *layer and the rest into *rest. */
static int hf_layer_part(const char *hf, int64_t *layer, const char **rest)
{
    const char *pre = "model.layers.";
    size_t np = strlen(pre);
    if (strncmp(hf, pre, np) || hf[np] < '0' || hf[np] > '9') return 0;
    char *end;
    long long l = strtoll(hf + np, &end, 10);
    if (*end != '.') return 0;
    *layer = l;
    *rest = end + 1;
    return 1;
}

const ft_gguf_tensor *ft_gguf_hf_tensor(const ft_gguf *g, const char *hf_name, int *permuted)
{
    static const char *const glob[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                          {"model.norm.weight", "output_norm.weight"},
                                          {"lm_head.weight", "output.weight"}};
    static const char *const norms[][2] = {{"input_layernorm.weight", "attn_norm.weight"},
                                           {"post_attention_layernorm.weight", "ffn_norm.weight"},
                                           {"self_attn.q_norm.weight", "attn_q_norm.weight"},
                                           {"self_attn.k_norm.weight", "attn_k_norm.weight"}};
    *permuted = 0;
    char name[160];
    for (int k = 0; k < 3; k++)
        if (!strcmp(hf_name, glob[k][0])) return ft_gguf_find_tensor(g, glob[k][1]);
    int64_t l;
    const char *rest;
    if (!hf_layer_part(hf_name, &l, &rest)) return NULL;
    for (int k = 0; k < 4; k++)
        if (!strcmp(rest, norms[k][0])) {
            snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, norms[k][1]);
            return ft_gguf_find_tensor(g, name);
        }
    for (int p = 0; p < FT_N_PROJ; p++) {
        char w[96];
        snprintf(w, sizeof w, "%s.%s.", ft_proj_parent[p], ft_proj_name[p]);
        size_t nw = strlen(w);
        if (strncmp(rest, w, nw) || (strcmp(rest + nw, "weight") && strcmp(rest + nw, "bias")))
            continue;
        snprintf(name, sizeof name, "blk.%lld.%s.%s", (long long)l, k_gguf_proj[p], rest + nw);
        const char *arch = NULL;
        /* llama.cpp interleaves q/k rows for arch llama's NORM rope (formats.md 2.4) */
        *permuted = (p == FT_Q || p == FT_K) && !ft_gguf_get_str(g, "general.architecture", &arch) &&
                    !strcmp(arch, "llama");
        return ft_gguf_find_tensor(g, name);
    }
    return NULL;
}

int ft_gguf_hf_rows(const ft_gguf *g, const ft_model_config *c, const char *hf_name, int64_t row0,
                    int64_t n_rows, int64_t cols, float *dst)
{
    const char *path = ft_gguf_path(g);
    int perm;
    const ft_gguf_tensor *t = ft_gguf_hf_tensor(g, hf_name, &perm);
    if (!t) return ft_err(FT_E_INVALID, "%s: no tensor for \"%s\"", path, hf_name);
    int two_d = cols > 1 || t->n_dims == 2;
    int64_t rows = two_d ? t->ne[1] : t->ne[0];
    if ((two_d && (t->n_dims != 2 || t->ne[0] != cols)) || (!two_d && t->n_dims != 1) ||
        row0 < 0 || n_rows < 0 || row0 + n_rows > rows)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\" (ne %lld x %lld): rows [%lld, %lld) of %lld "
                      "values asked for", path, t->name, (long long)t->ne[0], (long long)t->ne[1],
                      (long long)row0, (long long)(row0 + n_rows), (long long)cols);
    if (!ft_quant_can_dequant(t->type))
        return ft_err(FT_E_UNSUPPORTED, "%s: tensor \"%s\" has ggml type %s (%d); supported: "
                      FT_QUANT_DEQUANT_LIST, path, t->name, ft_quant_name(t->type), t->type);
    const int64_t D = c->head_dim, half = D / 2;
    if (perm && (D < 2 || rows % D))
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\": %lld rows are not whole heads of %lld",
                      path, t->name, (long long)rows, (long long)D);
    if (!two_d) { /* a norm or bias: small, dequantized whole */
        float *tmp = alloc_floats(rows, path);
        if (!tmp) return -ENOMEM;
        int rc = ft_gguf_tensor_f32(g, t, tmp);
        if (!rc) rc = check_finite(path, t->name, tmp, rows, 0);
        for (int64_t k = 0; !rc && k < n_rows; k++) {
            int64_t r = row0 + k, h = r / (D ? D : 1), e = r % (D ? D : 1);
            dst[k] = tmp[perm ? h * D + 2 * (e % half) + e / half : r];
        }
        free(tmp);
        return rc;
    }
    int64_t rb = ft_quant_bytes(t->type, cols);
    if (rb < 0)
        return ft_err(FT_E_INVALID, "%s: tensor \"%s\": rows of %lld values are not whole %s blocks",
                      path, t->name, (long long)cols, ft_quant_name(t->type));
    for (int64_t k = 0; k < n_rows; k++) {
        int64_t r = row0 + k, gr = r;
        if (perm) { /* HF row h*D + j*half + i is GGUF row h*D + 2*i + j */
            int64_t h = r / D, e = r % D;
            gr = h * D + 2 * (e % half) + e / half;
        }
        FT_TRY(ft_quant_dequant(t->type, (const uint8_t *)t->data + gr * rb, dst + k * cols, cols));
        FT_TRY(check_finite(path, t->name, dst + k * cols, cols, gr * cols));
    }
    return 0;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int model_load(ft_model **out, const char *path, int defer)
{
    *out = NULL;
    int isdir = ft_is_dir(path);
    if (isdir < 0)
        return ft_err(isdir, "%s: cannot open model: %s", path, strerror(-isdir));
    ft_model *m = calloc(1, sizeof *m);
    if (!m) return ft_err(-ENOMEM, "%s: out of memory", path);
    if (snprintf(m->path, sizeof m->path, "%s", path) >= (int)sizeof m->path) {
        free(m);
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    }
    int rc;
    if (isdir) {
        rc = load_hf(m, path, defer);
    } else if (ends_with(path, ".gguf") || ends_with(path, ".GGUF")) {
        m->is_gguf = 1;
        rc = load_gguf(m, path, defer);
    } else {
        /* a file without the extension: GGUF if it starts with the magic */
        FILE *f = fopen(path, "rb");
        char mg[4] = {0};
        if (f) {
            if (fread(mg, 1, 4, f) != 4) mg[0] = 0;
            fclose(f);
        }
        if (!memcmp(mg, "GGUF", 4)) {
            m->is_gguf = 1;
            rc = load_gguf(m, path, defer);
        } else {
            rc = ft_err(FT_E_UNSUPPORTED, "%s: expected a model folder (config.json + "
                        "*.safetensors) or a .gguf file", path);
        }
    }
    if (rc < 0) {
        ft_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int ft_model_load(ft_model **out, const char *path)
{
    return model_load(out, path, 0);
}

int ft_model_load_deferred(ft_model **out, const char *path)
{
    return model_load(out, path, 1);
}

int ft_model_load_weights(ft_model *m)
{
    if (!ft_model_deferred(m)) return 0;
    drop_weights(m);
    int rc = m->is_gguf ? load_gguf(m, m->path, 0) : load_hf(m, m->path, 0);
    if (rc < 0) { /* back to the deferred form, not half loaded; the read's message stays */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ft_errmsg());
        drop_weights(m);
        shapes_only(m);
        return ft_err(rc, "%s", msg);
    }
    return rc;
}

int ft_model_set_pack_only(ft_model *m, const char *pack)
{
    if (m->pack_only[0]) return 0;
    if (strlen(pack) >= sizeof m->pack_only) return ft_err(FT_E_RANGE, "%s: path too long", pack);
    drop_weights(m);
    return pack_only_form(m, pack);
}

/* Every id the tokenizer can give has an embedding row: its largest id (vocabulary or added
 * token) below the model's vocab_size (the rows of the embedding, which the loader checks
 * against config.json). Else FT_E_INVALID naming the tokenizer's file, the token and the
 * model's file: found here, at load, rather than inside the embedding kernel mid-run. */
static int check_tokenizer_fits(const ft_model *m, const ft_tokenizer *t)
{
    const int64_t n = ft_tok_vocab_size(t), V = m->cfg.vocab_size;
    if (n <= V) return 0;
    const char *tok = ft_tok_str(t, (int32_t)(n - 1));
    if (m->is_gguf)
        return ft_err(FT_E_INVALID, "%s: the tokenizer (tokenizer.ggml.tokens) has token '%.64s' "
                      "at id %lld, but token_embd.weight has %lld rows (ids 0..%lld): every id "
                      "the tokenizer gives must have an embedding row", m->path, tok ? tok : "",
                      (long long)(n - 1), (long long)V, (long long)(V - 1));
    return ft_err(FT_E_INVALID, "%s/tokenizer.json: token '%.64s' has id %lld, but the model has "
                  "%lld token embeddings (vocab_size in %s/config.json, ids 0..%lld): the "
                  "tokenizer belongs to another model, or the model's embeddings were not "
                  "resized for its added tokens", m->path, tok ? tok : "", (long long)(n - 1),
                  (long long)V, m->path, (long long)(V - 1));
}

int ft_model_tokenizer(const ft_model *m, ft_tokenizer **out)
{
    int rc = m->is_gguf ? ft_gguf_load_tokenizer(m->path, out) : ft_tok_load_dir(out, m->path);
    if (!rc) rc = check_tokenizer_fits(m, *out);
    if (!rc) ft_tok_set_chat_kind(*out, ft_chat_template_resolve(*out)); /* once, for every render */
    if (rc < 0) {
        ft_tok_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- tokenizer from GGUF metadata -------------------------------------------------------- */

static int tok_id(const ft_gguf *g, const char *key, int64_t *id)
{
    *id = -1;
    int rc = ft_gguf_get_int(g, key, id);
    if (rc == FT_E_NOTFOUND) {
        *id = -1;
        return 0;
    }
    return rc;
}

static int tok_flag(const ft_gguf *g, const char *key, int *v, int dflt)
{
    *v = dflt;
    int rc = ft_gguf_get_bool(g, key, v);
    if (rc == FT_E_NOTFOUND) ft_err_clear(); /* absent: the default, and no stale message */
    return rc == FT_E_NOTFOUND ? 0 : rc;
}

int ft_gguf_load_tokenizer(const char *path, ft_tokenizer **out)
{
    *out = NULL;
    ft_gguf *g;
    FT_TRY(ft_gguf_open(&g, path));
    ft_tok_spec sp;
    memset(&sp, 0, sizeof sp);
    float *scores = NULL;
    int32_t *types = NULL;
    int rc = ft_gguf_get_str(g, "tokenizer.ggml.model", &sp.model);
    if (rc == FT_E_NOTFOUND)
        rc = ft_err(FT_E_INVALID, "%s: missing metadata key \"tokenizer.ggml.model\" (no tokenizer "
                    "in this GGUF file)", path);
    if (!rc && (rc = ft_gguf_get_str(g, "tokenizer.ggml.pre", &sp.pre)) == FT_E_NOTFOUND) {
        sp.pre = NULL;
        rc = 0;
    }
    const ft_gguf_kv *tk = ft_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!rc && (!tk || tk->type != FT_GGUF_ARRAY || tk->arr_type != FT_GGUF_STRING))
        rc = ft_err(FT_E_INVALID, "%s: metadata key \"tokenizer.ggml.tokens\" %s", path,
                    tk ? "is not an array of strings" : "not found");
    if (!rc) {
        sp.n_tokens = tk->arr_n;
        sp.tokens = (const char *const *)tk->arr_str;
        const ft_gguf_kv *sc = ft_gguf_find_kv(g, "tokenizer.ggml.scores");
        const ft_gguf_kv *ty = ft_gguf_find_kv(g, "tokenizer.ggml.token_type");
        const ft_gguf_kv *mg = ft_gguf_find_kv(g, "tokenizer.ggml.merges");
        if (sc && (sc->type != FT_GGUF_ARRAY || sc->arr_n != sp.n_tokens))
            rc = ft_err(FT_E_INVALID, "%s: tokenizer.ggml.scores must be an array of %lld numbers",
                        path, (long long)sp.n_tokens);
        else if (ty && (ty->type != FT_GGUF_ARRAY || ty->arr_n != sp.n_tokens))
            rc = ft_err(FT_E_INVALID, "%s: tokenizer.ggml.token_type must be an array of %lld "
                        "integers", path, (long long)sp.n_tokens);
        else if (mg && (mg->type != FT_GGUF_ARRAY || mg->arr_type != FT_GGUF_STRING))
            rc = ft_err(FT_E_INVALID, "%s: tokenizer.ggml.merges must be an array of strings", path);
        if (!rc && sc) {
            scores = malloc((size_t)(sp.n_tokens ? sp.n_tokens : 1) * sizeof *scores);
            rc = scores ? ft_gguf_arr_f32(sc, scores) : -ENOMEM;
            if (rc < 0) ft_err_prefix(rc, "%s", path);
            sp.scores = scores;
        }
        if (!rc && ty) {
            types = malloc((size_t)(sp.n_tokens ? sp.n_tokens : 1) * sizeof *types);
            rc = types ? ft_gguf_arr_i32(ty, types) : -ENOMEM;
            if (rc < 0) ft_err_prefix(rc, "%s", path);
            sp.token_type = types;
        }
        if (!rc && mg) {
            sp.n_merges = mg->arr_n;
            sp.merges = (const char *const *)mg->arr_str;
        }
    }
    if (!rc) rc = tok_id(g, "tokenizer.ggml.bos_token_id", &sp.bos_id);
    if (!rc) rc = tok_id(g, "tokenizer.ggml.eos_token_id", &sp.eos_id);
    if (!rc) rc = tok_id(g, "tokenizer.ggml.unknown_token_id", &sp.unk_id);
    if (!rc) rc = tok_id(g, "tokenizer.ggml.padding_token_id", &sp.pad_id);
    int spm = sp.model && !strcmp(sp.model, "llama");
    if (!rc) rc = tok_flag(g, "tokenizer.ggml.add_bos_token", &sp.add_bos, spm);
    if (!rc) rc = tok_flag(g, "tokenizer.ggml.add_eos_token", &sp.add_eos, 0);
    if (!rc) rc = tok_flag(g, "tokenizer.ggml.add_space_prefix", &sp.add_space_prefix, spm);
    if (!rc && (rc = ft_gguf_get_str(g, "tokenizer.chat_template", &sp.chat_template)) == FT_E_NOTFOUND) {
        sp.chat_template = NULL;
        rc = 0;
    }
    if (!rc) {
        rc = ft_tok_from_spec(out, &sp);
        if (rc < 0) ft_err_prefix(rc, "%s", path);
    }
    free(scores);
    free(types);
    ft_gguf_close(g);
    return rc;
}
