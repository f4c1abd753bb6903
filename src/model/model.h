/* model.h - a loaded Llama-family model: config, fp32 host weights, tokenizer source.
 *
 * ft_model_load() accepts a Hugging Face folder (config.json + model.safetensors or a
 * sharded model.safetensors.index.json; F32/F16/BF16) or a GGUF file (formats.md 4.3;
 * the ggml types of src/numeric/quant.h dequantized at load, llama.cpp's q/k row permutation undone,
 * formats.md 2.4). Weights are converted to fp32 host arrays in HF layout: every linear
 * is (out, in) row-major, y = x W^T (+ b).
 */
#ifndef FT_MODEL_H
#define FT_MODEL_H

#include <stdint.h>

#include "src/formats/config.h"
#include "src/tokenizer/tokenizer.h"

enum ft_proj { FT_Q = 0, FT_K, FT_V, FT_O, FT_GATE, FT_UP, FT_DOWN, FT_N_PROJ };

/* The layer layout (layout.c). HF module names, indexed by enum ft_proj: "q_proj", ...,
 * "down_proj". */
extern const char *const ft_proj_name[FT_N_PROJ];
/* HF parent module for each projection: "self_attn" or "mlp". */
extern const char *const ft_proj_parent[FT_N_PROJ];

/* (out_features, in_features) of projection p (enum ft_proj) of a Llama-family layer, from
 * its config: q (heads * head_dim, hidden), k/v (kv_heads * head_dim, hidden), o (hidden,
 * heads * head_dim), gate/up (intermediate, hidden), down (hidden, intermediate); HF layout
 * (formats.md 2.3). */
void ft_proj_dims(const ft_model_config *c, int p, int64_t *out, int64_t *in);

/* 1 if projection p carries a bias: q/k/v with attention_bias, o too when o_bias (llama-type
 * models with attention_bias; never qwen2; a GGUF says by its tensors). */
int ft_proj_has_bias(const ft_model_config *c, int p, int o_bias);

struct ft_nf4_tensor;

typedef struct ft_linear {
    float *w;        /* (out_n, in_n) fp32, frozen; with wtype FT_WTYPE_BF16 (an executor's device
                      * copy, kernels.h) the same pointer holds bf16 values; NULL with FT_WTYPE_NF4 */
    int wtype;       /* enum ft_wtype; 0 (fp32) for every loaded model */
    const struct ft_nf4_tensor *nf4; /* wtype FT_WTYPE_NF4 (an executor's packed block, kernels.h) */
    float *b;        /* (out_n) or NULL */
    int64_t out_n, in_n;
} ft_linear;

typedef struct ft_layer_weights {
    float *attn_norm;            /* (C) input_layernorm */
    float *ffn_norm;             /* (C) post_attention_layernorm */
    float *q_norm, *k_norm;      /* (head_dim) self_attn.q_norm / k_norm with cfg.qk_norm (qwen3), else NULL */
    ft_linear proj[FT_N_PROJ];
} ft_layer_weights;

/* fp32 floats of one layer's weights as ft_layer_carve lays them out: the norms, then each
 * projection's weight and bias, each padded to 16 floats (64 bytes). */
int64_t ft_layer_floats(const ft_model_config *c, int o_bias);

/* The base weights of one layer's projections, sum over p of out x in (ft_proj_dims): the
 * multiply-adds of one token's pass through a layer's linear maps (the norms, biases and
 * attention's quadratic term left out). */
double ft_layer_proj_params(const ft_model_config *c);

/* Points w's tensors into buf (ft_layer_floats(c, o_bias) floats, 64-byte aligned) and sets
 * the projections' shapes; everything else in w is zeroed (fp32, no bias where none). */
void ft_layer_carve(const ft_model_config *c, int o_bias, float *buf, ft_layer_weights *w);

/* The pack files a pack-only folder may hold (`ftune init-model --pack`), NF4 preferred. */
#define FT_PACK_LOCAL_NF4 "model-nf4.ftpack"
#define FT_PACK_LOCAL_BF16 "model-bf16.ftpack"

typedef struct ft_model {
    ft_model_config cfg;
    char path[4096];             /* the folder or .gguf file it came from */
    int is_gguf;
    float *embed;                /* (vocab_size, C) */
    float *final_norm;           /* (C) */
    float *lm_head;              /* (vocab_size, C); == embed when tie_word_embeddings */
    ft_layer_weights *layers;    /* num_hidden_layers */
    void *priv;                  /* loader-owned storage (buffers, the GGUF handle) */
    /* A pack-only folder (config.json + model-nf4.ftpack or model-bf16.ftpack, no
     * safetensors: `ftune init-model --pack`): the pack's path, "" otherwise. The loader knows
     * the pack by this path alone (it never opens it: offload/pack_model.h checks it against
     * config.json and reads from it). Then no host weights exist: layers[l] holds every
     * projection's out_n/in_n with w = b = NULL (biases follow cfg),
     * attn_norm/ffn_norm/embed/final_norm/lm_head are NULL until ft_model_take_globals; the
     * weights are read from the pack by the executor (ft_exec_use_pack). */
    char pack_only[4096];
} ft_model;

/* Loads a model folder or .gguf file. Errors name the file and offset/key:
 * -errno (missing path), FT_E_INVALID/FT_E_CORRUPT (bad header, offsets past the end, a
 * GGUF weight that dequantizes to inf or NaN,
 * missing tensors, shape mismatch), FT_E_UNSUPPORTED (dtype, architecture).
 * A folder with no *.safetensors and no index but model-nf4.ftpack (preferred) or
 * model-bf16.ftpack loads as a pack-only model (m->pack_only, above) from config.json alone:
 * the pack is not opened (offload/pack_model.h ft_pack_model_load checks its header, block
 * table and stored config against config.json).
 * On success the caller owns *out and frees it with ft_model_free(). */
int ft_model_load(ft_model **out, const char *path);
void ft_model_free(ft_model *m); /* NULL-safe */

/* As ft_model_load, but a Hugging Face folder's weights are only checked (names, shapes,
 * dtypes: the same errors), not read: the model has the pack-only form's shapes without a
 * pack (ft_model_deferred), for a run whose base may come from a pack (QLoRA), so host memory never
 * holds the fp32 base (a 70B model is 280 GB of fp32). A GGUF file likewise (its tensors
 * checked, none dequantized); a pack-only folder loads as with ft_model_load. */
int ft_model_load_deferred(ft_model **out, const char *path);
/* 1 while a model from ft_model_load_deferred has no weights yet: neither host weights nor
 * a pack (ft_model_load_weights reads them, offload/pack_model.h ft_pack_model_use hands
 * the base to a pack). */
static inline int ft_model_deferred(const ft_model *m) { return !m->pack_only[0] && !m->embed; }
/* Reads the weights of a deferred model (no-op for any other). Returns ft_model_load's
 * errors (-ENOMEM among them); after one the model is deferred again (shapes, no weights). */
int ft_model_load_weights(ft_model *m);
/* Makes m a pack-only model of the pack file `pack` (model.h's pack_only: the executor reads
 * every weight, embeddings and norms included, from the pack), freeing its host weights if
 * it had any. No-op on a pack-only model. The pack is not opened: the caller has checked it
 * (offload/pack_model.h ft_pack_model_use). Returns 0, FT_E_RANGE (path too long), -ENOMEM. */
int ft_model_set_pack_only(ft_model *m, const char *pack);

/* 0 when m has host weights; for a pack-only model FT_E_UNSUPPORTED naming the folder and
 * `what` ("generate", "merge", ...): only training/eval through the executor read it. */
int ft_model_require_weights(const ft_model *m, const char *what);

/* Floats of the global tensors as ft_model_take_globals lays them out: the embeddings
 * (vocab x hidden), the final norm (hidden), the LM head (vocab x hidden, untied only), each
 * padded to 16 floats. */
int64_t ft_model_global_floats(const ft_model_config *c);
/* For a pack-only model without them: buf (64-byte aligned, ft_model_global_floats floats,
 * laid out as said there, read by offload/pack_model.h ft_pack_model_load_globals) becomes
 * m's, freed with it; m->embed, final_norm and lm_head (== embed when tied) point into it. */
void ft_model_take_globals(ft_model *m, float *buf);

/* The model config of a GGUF file from its {arch}.* metadata (llama.cpp keys; formats.md
 * 4.3), without reading any weight: rope scaling from rope.scaling.* or rope_freqs.weight
 * (llama3), special ids from tokenizer.ggml.*. *arch points into g ("llama", "qwen2", "qwen3").
 * Returns 0, FT_E_INVALID (a missing required key, naming it and the file),
 * FT_E_UNSUPPORTED (architecture, rope type, partial rotary). */
struct ft_gguf;
int ft_gguf_model_config(const struct ft_gguf *g, ft_model_config *c, const char **arch);

/* The GGUF tensor that holds the Hugging Face tensor hf_name ("model.layers.3.self_attn.
 * q_proj.weight", "model.embed_tokens.weight", ...; gguf-py's TENSOR_NAMES, formats.md 4.2),
 * or NULL; *permuted = 1 when its rows are in llama.cpp's interleaved q/k order (arch llama,
 * q and k projections: formats.md 2.4). */
struct ft_gguf_tensor;
const struct ft_gguf_tensor *ft_gguf_hf_tensor(const struct ft_gguf *g, const char *hf_name,
                                               int *permuted);
/* Rows [row0, row0 + n_rows) of hf_name (cols values each; cols = 1 for a 1-D tensor) as fp32
 * into dst: the values ft_model_load gives that tensor (dequantized, the q/k permutation
 * undone with c->head_dim), reading only those rows of a 2-D tensor (each row is whole ggml
 * blocks). For a pack built from a GGUF file without the fp32 model in memory. Returns 0,
 * FT_E_INVALID (no such tensor; another shape; rows out of range; rows not whole blocks),
 * FT_E_UNSUPPORTED (a type ftune cannot dequantize), FT_E_CORRUPT (a value dequantizes to
 * inf or NaN, as ft_model_load refuses it), -ENOMEM. */
int ft_gguf_hf_rows(const struct ft_gguf *g, const ft_model_config *c, const char *hf_name,
                    int64_t row0, int64_t n_rows, int64_t cols, float *dst);

/* The model's tokenizer: DIR/tokenizer.json (+ tokenizer_config.json) for a folder, the
 * tokenizer.ggml.* metadata for a GGUF file (ft_tok_from_spec), checked against the model:
 * a token id (vocabulary or added token) at or past the model's vocab_size, which has no
 * embedding row, is FT_E_INVALID naming the tokenizer's file, the token and config.json (or
 * token_embd.weight). Returns 0 or an error naming the file (*out NULL). */
int ft_model_tokenizer(const ft_model *m, ft_tokenizer **out);

/* Number of parameters of the base model (embeddings counted once when tied). */
int64_t ft_model_n_params(const ft_model *m);

#endif
