/* export_gguf.h - what ftune writes for llama.cpp: a GGUF LoRA adapter (formats.md 4.2, 9.3,
 * as llama.cpp's convert_lora_to_gguf.py writes it), and the GGUF metadata of a merged
 * model (llama/qwen2 keys from a config, tokenizer.ggml.* keys from tokenizer.json), plus
 * the HF <-> GGUF tensor names and the q/k row permutation (formats.md 2.4) they share.
 */
#ifndef FT_EXPORT_GGUF_H
#define FT_EXPORT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "src/formats/config.h"
#include "src/formats/gguf_write.h"
#include "src/formats/hub_cache.h"

/* The base model an adapter belongs to, read without its weights: config.json of a folder,
 * or the metadata of a .gguf file (general.architecture llama/qwen2, {arch}.* keys,
 * tokenizer.ggml.bos/eos ids; vocab and tie from token_embd/output). arch is the GGUF
 * architecture: "llama" for model_type llama/mistral, "qwen2" for qwen2. *has_rope_freqs
 * (may be NULL) is set when a GGUF file carries rope_freqs.weight (llama3 rope scaling,
 * which this reader does not decode: cfg->rope_type stays default). Returns 0, -errno,
 * FT_E_INVALID, FT_E_UNSUPPORTED, each naming the file and key. */
int ft_export_base_config(const char *path, ft_model_config *cfg, char *arch, size_t arch_n,
                          int *has_rope_freqs);

/* GGUF base-tensor name of projection p ("attn_q", ..., "ffn_down"; gguf-py TENSOR_NAMES). */
extern const char *const ft_export_gguf_proj[7];

/* llama.cpp's row order of a q or k projection (arch llama): GGUF row g holds HF row
 * ft_export_qk_row(g, head_dim): g = h*hd + 2*i + j  <->  HF row h*hd + j*hd/2 + i. */
int64_t ft_export_qk_row(int64_t g, int64_t head_dim);

/* HF tensor name -> GGUF name (model.embed_tokens.weight -> token_embd.weight, ...,
 * model.layers.{i}.self_attn.q_proj.bias -> blk.{i}.attn_q.bias). Returns 1 and fills out,
 * or 0 for names with no GGUF counterpart (rotary_emb.inv_freq, unknown modules). The
 * inverse, GGUF -> HF, is ft_export_hf_name. */
int ft_export_gguf_name(const char *hf, char *out, size_t n);
int ft_export_hf_name(const char *gguf, char *out, size_t n);

typedef struct ft_export_info {
    char arch[32];
    int64_t n_tensors;
    int64_t n_layers;
    int permuted;            /* lora_b of q/k permuted (arch llama) */
    float alpha_written;     /* adapter.lora.alpha (lora_alpha * sqrt(r) for rsLoRA) */
    int64_t bytes;
    char base[4200];         /* the base config that was used */
} ft_export_info;

/* Writes the PEFT adapter in adapter_dir as a GGUF LoRA file `out` (temporary name, fsync,
 * rename). KV: general.architecture, general.type "adapter", general.name,
 * general.file_type, general.quantization_version, adapter.type "lora", adapter.lora.alpha
 * (f32). Tensors blk.{i}.{attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down}
 * .weight.lora_a with ne [in, r] (PEFT A (r, in), same bytes) and .lora_b with ne [r, out]
 * (PEFT B (out, r)); for arch llama the rows of attn_q / attn_k lora_b are permuted as the
 * base weights (formats.md 2.4, with num_attention_heads / num_key_value_heads).
 * type: FT_GGML_F32 or FT_GGML_F16. model: the base model (folder or .gguf), or NULL to use
 * base_model_name_or_path when that is a local path or a Hugging Face id in the cache that
 * hub names (src/formats/hub_cache.h; NULL: no cache). The adapter's layers and shapes are
 * checked against the base. Returns 0 or an error naming the file. */
int ft_export_gguf_lora(const char *adapter_dir, const char *out, const char *model, int type,
                        const ft_hub_env *hub, ft_export_info *info);

/* Writes the model metadata of a merged GGUF built from an HF folder: general.* (type
 * "model", name, file_type, quantization_version 2), {arch}.block_count, context_length,
 * embedding_length, feed_forward_length, attention.head_count(_kv), key_length,
 * value_length, layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count, vocab_size,
 * rope scaling (linear, yarn; llama3 is the rope_freqs tensor, ft_export_rope_freqs). */
int ft_export_model_kv(ft_gguf_w *w, const ft_model_config *c, const char *arch,
                       const char *name, uint32_t file_type);

/* llama3 rope scaling as llama.cpp stores it: head_dim/2 factors (convert_hf_to_gguf.py
 * LlamaModel.generate_extra_tensors). Returns 0, or 1 when the config has no llama3 scaling. */
int ft_export_rope_freqs(const ft_model_config *c, float *out);

/* tokenizer.ggml.* keys from DIR/tokenizer.json (+ tokenizer_config.json): model "gpt2"
 * (byte-level BPE: tokens, token_type, merges, pre from the pre-tokenizer: smollm,
 * llama-bpe, qwen2, gpt2) or "llama" (SentencePiece-style BPE with byte fallback: tokens,
 * scores = -rank of the merge that makes the token, token_type incl. byte tokens,
 * add_space_prefix), bos/eos/unk/pad ids, add_bos_token, add_eos_token, chat_template.
 * Returns 0 or FT_E_UNSUPPORTED naming tokenizer.json and what is not handled. */
int ft_export_tokenizer_kv(ft_gguf_w *w, const char *dir, const ft_model_config *c);

#endif
