/* config.h - a Llama-family model configuration (HF config.json or GGUF metadata).
 * Fields and defaults: formats.md 2.1 (transformers LlamaConfig); RoPE: formats.md 2.2. */
#ifndef FT_CONFIG_H
#define FT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum ft_rope_type {
    FT_ROPE_DEFAULT = 0,
    FT_ROPE_LINEAR,  /* inv_freq /= factor */
    FT_ROPE_LLAMA3,  /* transformers _compute_llama3_parameters */
    FT_ROPE_DYNAMIC, /* NTK-aware dynamic: base scaled when seq > original max */
    FT_ROPE_YARN,
};

#define FT_MAX_EOS 8

typedef struct ft_model_config {
    char model_type[32];          /* "llama", "mistral", "qwen2", "qwen3" */
    int64_t vocab_size;           /* rows of embed_tokens (may exceed the tokenizer) */
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;             /* from config when present, else hidden / heads */
    int64_t max_position_embeddings;
    float rms_norm_eps;
    double rope_theta;
    int rope_type;                /* enum ft_rope_type */
    double rope_factor;           /* linear/llama3/dynamic/yarn factor (1 if none) */
    double rope_low_freq_factor;  /* llama3 */
    double rope_high_freq_factor; /* llama3 */
    int64_t rope_original_max_position_embeddings; /* llama3/yarn */
    double rope_beta_fast, rope_beta_slow;         /* yarn (defaults 32, 1) */
    double rope_attention_factor; /* scales cos/sin: yarn 0.1*ln(factor)+1 or attention_factor; 1 otherwise */
    int tie_word_embeddings;
    int attention_bias;           /* q/k/v carry a bias (qwen2 always; llama if attention_bias) */
    int qk_norm;                  /* q and k RMS-normalized per head (head_dim weights) before RoPE (qwen3) */
    int64_t bos_token_id;         /* -1 if none */
    int64_t eos_token_id[FT_MAX_EOS];
    int n_eos;
} ft_model_config;

/* Parses a config.json file. Unknown keys are ignored; a missing required field
 * (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size)
 * or an unsupported model_type/rope type gives FT_E_INVALID / FT_E_UNSUPPORTED with a
 * message naming the file and the key. Returns 0, -errno, FT_E_INVALID, FT_E_UNSUPPORTED. */
int ft_config_load(ft_model_config *cfg, const char *path);

/* Same, from a JSON text held in memory; `name` is used in error messages. */
int ft_config_parse(ft_model_config *cfg, const char *json, size_t len, const char *name);

/* RoPE inverse frequencies (head_dim/2 floats) after scaling, computed as transformers'
 * modeling_rope_utils in fp32: inv_freq[i] = 1 / theta^(2i/D), then the scaling type.
 * For FT_ROPE_DYNAMIC the scaling uses seq_len (pass the training sequence length). */
void ft_rope_inv_freq(const ft_model_config *cfg, int64_t seq_len, float *inv_freq);

/* Fills derived fields and checks consistency (heads divide, head_dim even, ...).
 * Returns 0 or FT_E_INVALID naming `name`. */
int ft_config_validate(ft_model_config *cfg, const char *name);

#endif
