/* export_gguf.c - GGUF LoRA adapters for llama.cpp and the GGUF metadata of merged models
 * (see export_gguf.h). Sources: formats.md 2.4 (q/k permutation), 4.2 (llama.cpp adapter
 * keys, names and shapes: convert_lora_to_gguf.py, src/llama-adapter.cpp), 4.3 (container);
 * gguf-py constants.py (Keys, TENSOR_NAMES, LlamaFileType). */
#include "adapters/export/export_gguf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/peft.h"
#include "src/core/err.h"
#include "src/formats/hub_cache.h"
#include "src/core/fsutil.h"
#include "src/formats/gguf.h"
#include "src/model/model.h"
#include "src/numeric/quant.h"

const char *const ft_export_gguf_proj[7] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                            "ffn_gate", "ffn_up", "ffn_down"};

int64_t ft_export_qk_row(int64_t g, int64_t hd)
{
    int64_t h = g / hd, r = g % hd, i = r / 2, j = r % 2;
    return h * hd + j * (hd / 2) + i;
}

/* ---- names ----------------------------------------------------------------------------- */

int ft_export_gguf_name(const char *hf, char *out, size_t n)
{
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, n, "token_embd.weight"), 1;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, n, "output_norm.weight"), 1;
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, n, "output.weight"), 1;
    long long l;
    int k = 0;
    char rest[128];
    if (sscanf(hf, "model.layers.%lld.%n", &l, &k) != 1 || k == 0 || strlen(hf + k) >= sizeof rest)
        return 0;
    snprintf(rest, sizeof rest, "%s", hf + k);
    if (!strcmp(rest, "input_layernorm.weight")) return snprintf(out, n, "blk.%lld.attn_norm.weight", l), 1;
    if (!strcmp(rest, "post_attention_layernorm.weight")) return snprintf(out, n, "blk.%lld.ffn_norm.weight", l), 1;
    if (!strcmp(rest, "self_attn.q_norm.weight")) return snprintf(out, n, "blk.%lld.attn_q_norm.weight", l), 1;
    if (!strcmp(rest, "self_attn.k_norm.weight")) return snprintf(out, n, "blk.%lld.attn_k_norm.weight", l), 1;
    for (int p = 0; p < 7; p++) {
        char w[64];
        snprintf(w, sizeof w, "%s.%s.", ft_proj_parent[p], ft_proj_name[p]);
        size_t wl = strlen(w);
        if (strncmp(rest, w, wl)) continue;
        if (!strcmp(rest + wl, "weight") || !strcmp(rest + wl, "bias"))
            return snprintf(out, n, "blk.%lld.%s.%s", l, ft_export_gguf_proj[p], rest + wl), 1;
    }
    return 0;
}

int ft_export_hf_name(const char *gg, char *out, size_t n)
{
    if (!strcmp(gg, "token_embd.weight")) return snprintf(out, n, "model.embed_tokens.weight"), 1;
    if (!strcmp(gg, "output_norm.weight")) return snprintf(out, n, "model.norm.weight"), 1;
    if (!strcmp(gg, "output.weight")) return snprintf(out, n, "lm_head.weight"), 1;
    long long l;
    int k = 0;
    if (sscanf(gg, "blk.%lld.%n", &l, &k) != 1 || k == 0) return 0;
    const char *rest = gg + k;
    if (!strcmp(rest, "attn_norm.weight")) return snprintf(out, n, "model.layers.%lld.input_layernorm.weight", l), 1;
    if (!strcmp(rest, "ffn_norm.weight")) return snprintf(out, n, "model.layers.%lld.post_attention_layernorm.weight", l), 1;
    if (!strcmp(rest, "attn_q_norm.weight")) return snprintf(out, n, "model.layers.%lld.self_attn.q_norm.weight", l), 1;
    if (!strcmp(rest, "attn_k_norm.weight")) return snprintf(out, n, "model.layers.%lld.self_attn.k_norm.weight", l), 1;
    for (int p = 0; p < 7; p++) {
        size_t wl = strlen(ft_export_gguf_proj[p]);
        if (strncmp(rest, ft_export_gguf_proj[p], wl) || rest[wl] != '.') continue;
        if (!strcmp(rest + wl + 1, "weight") || !strcmp(rest + wl + 1, "bias"))
            return snprintf(out, n, "model.layers.%lld.%s.%s.%s", l, ft_proj_parent[p],
                            ft_proj_name[p], rest + wl + 1), 1;
    }
    return 0;
}

/* ---- base config ----------------------------------------------------------------------- */

static int gguf_base(const ft_gguf *g, ft_model_config *c, char *arch_out, size_t an, int *rf)
{
    const char *arch;
    FT_TRY(ft_gguf_model_config(g, c, &arch));
    snprintf(arch_out, an, "%s", arch);
    if (rf) *rf = ft_gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    return 0;
}

int ft_export_base_config(const char *path, ft_model_config *c, char *arch, size_t an, int *rf)
{
    if (rf) *rf = 0;
    int isdir = ft_is_dir(path);
    if (isdir < 0) return ft_err(isdir, "%s: cannot open the base model: %s", path, strerror(-isdir));
    if (isdir) {
        char p[4200];
        FT_TRY(ft_path_join(p, sizeof p, path, "config.json"));
        FT_TRY(ft_config_load(c, p));
        const char *mt = c->model_type;
        /* llama.cpp's arch names (formats.md 2.4): mistral converts as llama */
        int qwen = !strcmp(mt, "qwen2") || !strcmp(mt, "qwen3");
        snprintf(arch, an, "%s", qwen ? mt : "llama");
        if (strcmp(mt, "llama") && strcmp(mt, "mistral") && !qwen)
            return ft_err(FT_E_UNSUPPORTED, "%s: model_type \"%s\" has no GGUF architecture here "
                          "(llama, mistral, qwen2, qwen3)", p, mt);
        return 0;
    }
    ft_gguf *g;
    FT_TRY(ft_gguf_open(&g, path));
    int rc = gguf_base(g, c, arch, an, rf);
    ft_gguf_close(g);
    return rc;
}

/* ---- LoRA adapter ---------------------------------------------------------------------- */

static const char *base_name_of(const char *p)
{
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    const char *s = p + n;
    while (s > p && s[-1] != '/') s--;
    return s;
}

/* Writes lora_a (A as is) and lora_b (B with q/k rows permuted when hd > 0). */
static int write_pair(ft_gguf_w *w, const ft_peft_file *a, int64_t l, int p, int64_t hd,
                      float *buf)
{
    const int64_t r = a->cfg.r, in = a->in_n[p], out = a->out_n[p];
    double *d = malloc((size_t)(r * (in > out ? in : out)) * sizeof *d);
    if (!d) return ft_err(-ENOMEM, "out of memory exporting the adapter");
    int rc = ft_peft_tensor_f64(a, l, p, 0, d);
    for (int64_t i = 0; !rc && i < r * in; i++) buf[i] = (float)d[i];
    if (!rc) rc = ft_gguf_w_data_f32(w, buf, r * in);
    if (!rc) rc = ft_peft_tensor_f64(a, l, p, 1, d);
    for (int64_t g = 0; !rc && g < out; g++) {
        int64_t src = hd ? ft_export_qk_row(g, hd) : g;
        for (int64_t k = 0; k < r; k++) buf[g * r + k] = (float)d[src * r + k];
    }
    if (!rc) rc = ft_gguf_w_data_f32(w, buf, out * r);
    free(d);
    return rc;
}

int ft_export_gguf_lora(const char *adapter_dir, const char *out, const char *model, int type,
                        const ft_hub_env *hub_env, ft_export_info *info)
{
    memset(info, 0, sizeof *info);
    if (type != FT_GGML_F32 && type != FT_GGML_F16)
        return ft_err(FT_E_INVALID, "GGUF LoRA tensors are written as F32 or F16, not %s",
                      ft_quant_name(type));
    ft_peft_file a;
    FT_TRY(ft_peft_open(&a, adapter_dir));
    int rc = 0;
    char hub[4096];
    if (!model) {
        /* a local path, or an id in the Hugging Face cache (what training writes for a model
         * it found there) */
        int h = ft_path_exists(a.base_name) ? 0 : ft_hub_resolve(a.base_name, hub_env, hub, sizeof hub);
        model = h == 1 ? hub : a.base_name;
        if (h < 0)
            rc = ft_err_prefix(h, "%s/adapter_config.json: base_model_name_or_path (or give the base "
                               "model with --model)", adapter_dir);
        else if (h == 0 && !ft_path_exists(a.base_name))
            rc = ft_err(FT_E_INVALID, "%s/adapter_config.json: base_model_name_or_path \"%s\" is not a "
                        "local model folder or .gguf file, nor a Hugging Face id: give the base "
                        "model with --model (its config sets the architecture and the heads of the "
                        "q/k permutation)", adapter_dir, a.base_name);
    }
    ft_model_config c;
    if (!rc) rc = ft_export_base_config(model, &c, info->arch, sizeof info->arch, NULL);
    if (!rc) rc = ft_peft_check_base(&a, &c, model);
    if (rc < 0) {
        ft_peft_close(&a);
        return rc;
    }
    snprintf(info->base, sizeof info->base, "%s", model);
    info->permuted = !strcmp(info->arch, "llama");
    info->n_layers = a.n_layers;
    /* llama.cpp scales by alpha / r only (no rsLoRA): fold sqrt(r) into alpha (formats.md 4.2) */
    info->alpha_written = a.cfg.use_rslora ? a.cfg.alpha * sqrtf((float)a.cfg.r) : a.cfg.alpha;

    ft_gguf_w *w;
    rc = ft_gguf_w_open(&w, out, 0);
    if (rc < 0) {
        ft_peft_close(&a);
        return rc;
    }
    ft_gguf_w_kv_str(w, "general.architecture", info->arch);
    ft_gguf_w_kv_str(w, "general.type", "adapter");
    ft_gguf_w_kv_str(w, "general.name", base_name_of(adapter_dir));
    ft_gguf_w_kv_u32(w, "general.file_type", type == FT_GGML_F16 ? 1 : 0); /* LlamaFileType */
    ft_gguf_w_kv_u32(w, "general.quantization_version", 2);
    ft_gguf_w_kv_str(w, "adapter.type", "lora");
    ft_gguf_w_kv_f32(w, "adapter.lora.alpha", info->alpha_written);
    int64_t maxn = 0;
    for (int64_t l = 0; l < a.n_layers; l++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            if (!(a.cfg.targets & (1u << p))) continue;
            char name[96];
            int64_t ne_a[2] = {a.in_n[p], a.cfg.r}, ne_b[2] = {a.cfg.r, a.out_n[p]};
            snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_a", (long long)l, ft_export_gguf_proj[p]);
            ft_gguf_w_tensor(w, name, type, 2, ne_a);
            snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_b", (long long)l, ft_export_gguf_proj[p]);
            ft_gguf_w_tensor(w, name, type, 2, ne_b);
            info->n_tensors += 2;
            int64_t m = a.cfg.r * (a.in_n[p] > a.out_n[p] ? a.in_n[p] : a.out_n[p]);
            if (m > maxn) maxn = m;
        }
    rc = ft_gguf_w_begin_data(w);
    float *buf = rc ? NULL : malloc((size_t)maxn * sizeof *buf);
    if (!rc && !buf) rc = ft_err(-ENOMEM, "out of memory exporting the adapter");
    for (int64_t l = 0; l < a.n_layers && !rc; l++)
        for (int p = 0; p < FT_N_PROJ && !rc; p++) {
            if (!(a.cfg.targets & (1u << p))) continue;
            int64_t hd = info->permuted && (p == FT_Q || p == FT_K) ? c.head_dim : 0;
            rc = write_pair(w, &a, l, p, hd, buf);
        }
    free(buf);
    info->bytes = ft_gguf_w_bytes(w);
    if (rc < 0) ft_gguf_w_abort(w);
    else rc = ft_gguf_w_close(w);
    ft_peft_close(&a);
    return rc;
}

/* ---- merged-model metadata --------------------------------------------------------------- */

int ft_export_model_kv(ft_gguf_w *w, const ft_model_config *c, const char *arch,
                       const char *name, uint32_t file_type)
{
    char k[128];
#define K(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    ft_gguf_w_kv_str(w, "general.architecture", arch);
    ft_gguf_w_kv_str(w, "general.type", "model");
    ft_gguf_w_kv_str(w, "general.name", name);
    ft_gguf_w_kv_u32(w, K("block_count"), (uint32_t)c->num_hidden_layers);
    ft_gguf_w_kv_u32(w, K("context_length"), (uint32_t)c->max_position_embeddings);
    ft_gguf_w_kv_u32(w, K("embedding_length"), (uint32_t)c->hidden_size);
    ft_gguf_w_kv_u32(w, K("feed_forward_length"), (uint32_t)c->intermediate_size);
    ft_gguf_w_kv_u32(w, K("attention.head_count"), (uint32_t)c->num_attention_heads);
    ft_gguf_w_kv_u32(w, K("attention.head_count_kv"), (uint32_t)c->num_key_value_heads);
    ft_gguf_w_kv_f32(w, K("rope.freq_base"), (float)c->rope_theta);
    ft_gguf_w_kv_f32(w, K("attention.layer_norm_rms_epsilon"), c->rms_norm_eps);
    ft_gguf_w_kv_u32(w, K("attention.key_length"), (uint32_t)c->head_dim);
    ft_gguf_w_kv_u32(w, K("attention.value_length"), (uint32_t)c->head_dim);
    ft_gguf_w_kv_u32(w, K("rope.dimension_count"), (uint32_t)c->head_dim);
    ft_gguf_w_kv_u32(w, K("vocab_size"), (uint32_t)c->vocab_size);
    if (c->rope_type == FT_ROPE_LINEAR || c->rope_type == FT_ROPE_YARN) {
        ft_gguf_w_kv_str(w, K("rope.scaling.type"), c->rope_type == FT_ROPE_LINEAR ? "linear" : "yarn");
        ft_gguf_w_kv_f32(w, K("rope.scaling.factor"), (float)c->rope_factor);
        if (c->rope_type == FT_ROPE_YARN) {
            ft_gguf_w_kv_u32(w, K("rope.scaling.original_context_length"),
                             (uint32_t)c->rope_original_max_position_embeddings);
            ft_gguf_w_kv_f32(w, K("rope.scaling.yarn_beta_fast"), (float)c->rope_beta_fast);
            ft_gguf_w_kv_f32(w, K("rope.scaling.yarn_beta_slow"), (float)c->rope_beta_slow);
        }
    } else if (c->rope_type == FT_ROPE_DYNAMIC) {
        return ft_err(FT_E_UNSUPPORTED, "dynamic NTK rope scaling has no GGUF equivalent");
    }
#undef K
    ft_gguf_w_kv_u32(w, "general.file_type", file_type);
    return ft_gguf_w_kv_u32(w, "general.quantization_version", 2);
}

int ft_export_rope_freqs(const ft_model_config *c, float *out)
{
    if (c->rope_type != FT_ROPE_LLAMA3) return 1;
    const double base = c->rope_theta, factor = c->rope_factor, lf = c->rope_low_freq_factor,
                 hf = c->rope_high_freq_factor, old = (double)c->rope_original_max_position_embeddings;
    const double low_wl = old / lf, high_wl = old / hf;
    const int64_t D = c->head_dim;
    for (int64_t i = 0; i < D / 2; i++) {
        double freq = 1.0 / pow(base, (double)(2 * i) / (double)D), wl = 2 * M_PI / freq, r;
        if (wl < high_wl) r = 1;
        else if (wl > low_wl) r = factor;
        else {
            double s = (old / wl - lf) / (hf - lf);
            r = 1 / ((1 - s) / factor + s);
        }
        out[i] = (float)r;
    }
    return 0;
}
