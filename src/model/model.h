/* model.h - a loaded Llama-family model: config, fp32 host weights, tokenizer source.
 *
 * ft_model_load() accepts a Hugging Face folder (config.json + model.safetensors or a
 * sharded model.safetensors.index.json; F32/F16/BF16) or a GGUF file (formats.md 4.3;
 * F32/F16/BF16/Q8_0/Q4_0/Q4_1 dequantized at load, llama.cpp's q/k row permutation undone,
 * formats.md 2.4). Weights are converted to fp32 host arrays in HF layout: every linear
 * is (out, in) row-major, y = x W^T (+ b).
 */
#ifndef FT_MODEL_H
#define FT_MODEL_H

#include <stdint.h>

#include "src/model/config.h"
#include "src/data/tokenizer.h"

enum ft_proj { FT_Q = 0, FT_K, FT_V, FT_O, FT_GATE, FT_UP, FT_DOWN, FT_N_PROJ };

/* HF module names, indexed by enum ft_proj: "q_proj", ..., "down_proj". */
extern const char *const ft_proj_name[FT_N_PROJ];
/* HF parent module for each projection: "self_attn" or "mlp". */
extern const char *const ft_proj_parent[FT_N_PROJ];

struct ft_nf4_tensor;

typedef struct ft_linear {
    float *w;        /* (out_n, in_n) fp32, frozen; with wtype FT_W_BF16 (an executor's device
                      * copy, kernels.h) the same pointer holds bf16 values; NULL with FT_W_NF4 */
    int wtype;       /* enum ft_wtype; 0 (fp32) for every loaded model */
    const struct ft_nf4_tensor *nf4; /* wtype FT_W_NF4 (an executor's packed block, kernels.h) */
    float *b;        /* (out_n) or NULL */
    int64_t out_n, in_n;
} ft_linear;

typedef struct ft_layer_weights {
    float *attn_norm;            /* (C) input_layernorm */
    float *ffn_norm;             /* (C) post_attention_layernorm */
    float *q_norm, *k_norm;      /* (head_dim) self_attn.q_norm / k_norm with cfg.qk_norm (qwen3), else NULL */
    ft_linear proj[FT_N_PROJ];
} ft_layer_weights;

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
     * safetensors: `ftune init-model --pack`): the pack's path, "" otherwise. Then no host
     * weights exist: layers[l] holds every projection's out_n/in_n with w = b = NULL (biases
     * follow cfg), attn_norm/ffn_norm/embed/final_norm/lm_head are NULL until
     * ft_model_load_pack_globals; the weights are read from the pack by the executor
     * (ft_exec_use_pack) and ft_pack_read_global. */
    char pack_only[4096];
} ft_model;

/* Loads a model folder or .gguf file. Errors name the file and offset/key:
 * -errno (missing path), FT_E_INVALID/FT_E_CORRUPT (bad header, offsets past the end,
 * missing tensors, shape mismatch), FT_E_UNSUPPORTED (dtype, architecture).
 * A folder with no *.safetensors and no index but model-nf4.ftpack (preferred) or
 * model-bf16.ftpack loads as a pack-only model (m->pack_only, above): the pack's header and
 * block table are validated (not its checksums: ft_pack_ensure verifies them) and its stored
 * config must match config.json's shapes (FT_E_INVALID naming both otherwise; a corrupt pack
 * gives the pack's own FT_E_CORRUPT naming the file).
 * On success the caller owns *out and frees it with ft_model_free(). */
int ft_model_load(ft_model **out, const char *path);
void ft_model_free(ft_model *m); /* NULL-safe */

/* 0 when m has host weights; for a pack-only model FT_E_UNSUPPORTED naming the folder and
 * `what` ("generate", "merge", ...): only training/eval through the executor read it. */
int ft_model_require_weights(const ft_model *m, const char *what);

/* For a pack-only model: reads the embeddings, final norm and LM head (== embed when tied)
 * from the pack's global block into fp32 host arrays owned by m (2 x vocab x hidden floats
 * untied: 8.4 GB for Llama-3-70B), so code that reads m->embed/final_norm/lm_head works;
 * the layers stay in the pack. No-op (0) if already loaded or not pack-only. Returns 0,
 * -ENOMEM, or the pack's errors. */
int ft_model_load_pack_globals(ft_model *m);

/* The model config of a GGUF file from its {arch}.* metadata (llama.cpp keys; formats.md
 * 4.3), without reading any weight: rope scaling from rope.scaling.* or rope_freqs.weight
 * (llama3), special ids from tokenizer.ggml.*. *arch points into g ("llama", "qwen2", "qwen3").
 * Returns 0, FT_E_INVALID (a missing required key, naming it and the file),
 * FT_E_UNSUPPORTED (architecture, rope type, partial rotary). */
struct ft_gguf;
int ft_gguf_model_config(const struct ft_gguf *g, ft_model_config *c, const char **arch);

/* The model's tokenizer: DIR/tokenizer.json (+ tokenizer_config.json) for a folder, the
 * tokenizer.ggml.* metadata for a GGUF file (ft_tok_from_spec). Returns 0 or an error
 * naming the file. */
int ft_model_tokenizer(const ft_model *m, ft_tokenizer **out);

/* Number of parameters of the base model (embeddings counted once when tied). */
int64_t ft_model_n_params(const ft_model *m);

#endif
