/* peft.h - PEFT LoRA adapter folders (formats.md 3 and 9): adapter_config.json +
 * adapter_model.safetensors, as transformers + PEFT and vLLM load them unchanged.
 * Keys: base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A,B}.weight,
 * A (r, in), B (out, r), F32, __metadata__ {"format": "pt"}. */
#ifndef FT_PEFT_H
#define FT_PEFT_H

#include "src/model/lora.h"
#include "src/model/model.h"
#include "src/formats/safetensors.h"

/* Writes DIR/adapter_model.safetensors then DIR/adapter_config.json, each to a temporary
 * name, fsynced and renamed (a failure leaves no partial file under the final names).
 * base_name goes to base_model_name_or_path; a Hugging Face id with a revision, "org/name@REV"
 * (hub_cache.h ft_hub_split_rev), goes there as "org/name" with "revision": "REV", PEFT's
 * revision of the base (peft/config.py; AutoPeftModel loads the base at it); an existing
 * local path with an '@' in its name stays whole. Creates DIR.
 * Nothing is written when a value is not finite: an A or B element, lora_alpha or
 * lora_dropout (FT_E_NUMERIC naming the tensor and element). Returns 0, -errno or that. */
int ft_peft_save(const char *dir, ft_lora *l, const ft_model *m, const char *base_name);
/* ft_peft_save of other values in l's layout (values: l->n_params host floats, A where l's A
 * is, B where its B is), e.g. the frozen correction of a quantized base (adapters/qcorr.h). */
int ft_peft_save_values(const char *dir, const ft_lora *l, const float *values, const char *base_name);

/* The base_model_name_or_path of an adapter trained on `model` (the --model path, after
 * the Hugging Face cache resolved an id) into out (n bytes), and in *source what it came
 * from (a static string for messages; NULL: the path itself):
 *   base_model_id when given (checked: "org/name" or "org/name@REV" as huggingface_hub's
 *     repo ids, else FT_E_INVALID), "--base-model-id";
 *   the id of a cache snapshot path (hub_cache.h ft_hub_repo_id, "org/name@<commit>" when
 *     not main's), "the Hugging Face cache";
 *   for a .gguf file, the repository its metadata names, the key as the source: an id in
 *     general.source.huggingface.repository, or a https://huggingface.co/org/name URL in
 *     general.source.repo_url, general.repo_url or (last: the model the converted one was
 *     made from, per llama.cpp's convert) general.base_model.0.repo_url;
 *   else model as given.
 * Returns 0 or FT_E_INVALID. A GGUF that does not open is left to the loader to report. */
int ft_peft_base_name(const char *model, const char *base_model_id, char *out, size_t n,
                      const char **source);

/* 1 if s is a Hugging Face repository id "org/name" (huggingface_hub's validate_repo_id
 * rules with one '/'), else 0. */
int ft_peft_is_repo_id(const char *s);

/* The shortest decimal that reads back as v (float32), as a double: what adapter_config.json
 * writes for lora_alpha and lora_dropout, so 0.05f is written 0.05 (the number the user gave,
 * which any decimal of up to 6 significant digits is), not 0.05000000074505806. */
double ft_peft_float_repr(float v);

/* Reads DIR/adapter_config.json into cfg (r, lora_alpha, lora_dropout, use_rslora,
 * target_modules). Read strictly, as PEFT's LoraConfig types its fields: a key of another
 * JSON type ("lora_alpha": "32", "use_rslora": "true", "use_dora": 1), a non-finite
 * lora_alpha, a lora_dropout outside 0..1, a key twice, a NUL in a string or text after the
 * object is FT_E_INVALID naming the file and the key (or offset). Rejects what ftune cannot
 * apply (use_dora, use_qalora, bias != "none", fan_in_fan_out, per-module patterns,
 * exclude_modules, layer_replication, trainable_token_indices, target_parameters, aLoRA,
 * unknown target modules) with FT_E_UNSUPPORTED naming the file and key. */
int ft_peft_read_config(const char *dir, ft_lora_cfg *cfg);

/* Serving hints for an adapter of config c, one line per hint into buf ("" when there is
 * nothing to say); returns the number of hints. vLLM loads a LoRA only up to its
 * --max-lora-rank, default 16, one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vllm/config/lora.py
 * MaxLoRARanks): a larger rank needs the flag, and a rank above 512 cannot be served by vLLM at
 * all (merge it instead). Targets outside the seven linear projections are refused by ftune
 * itself, so no target hint applies to its adapters. */
int ft_peft_serving_hints(const ft_lora_cfg *c, char *buf, size_t n);

/* Loads DIR/adapter_model.safetensors into an adapter initialised with the same config
 * (ft_lora_init). The file is validated by ft_peft_open, then checked against the adapter
 * `l` (the model it was sized for): same rank and targets as l->cfg, the same number of
 * layers, and each projection's A (r, in) / B (out, r) equal to the model's; so a PEFT
 * adapter made for another base (other layer count, hidden size, heads) is refused with a
 * message naming the file, the tensor and both shapes. F32, F16 or BF16. */
int ft_peft_load_weights(const char *dir, ft_lora *l);
/* ft_peft_load_weights into values (l->n_params host floats in l's layout: A where l's A is,
 * B where its B is) instead of l's parameters, which stay as they are (the same checks). */
int ft_peft_load_values(const char *dir, const ft_lora *l, float *values);

/* The PEFT key of layer i, projection p, which = 'A' or 'B', into out. */
void ft_peft_key(char *out, size_t n, int64_t layer, int p, char which);

/* An adapter folder opened without a model (export, merge, and the checks behind
 * ft_peft_load_weights): the config, and adapter_model.safetensors mapped read-only.
 * ft_peft_open validates the file on its own: every tensor is a LoRA A or B of a known
 * projection (q/k/v/o/gate/up/down) under model.layers.{i}, in target_modules, 2-D,
 * F32/F16/BF16, A (r, in) and B (out, r) with r from adapter_config.json, the same in/out
 * for a projection in every layer, and every layer 0..n_layers-1 has every targeted A and
 * B, and every element finite (read by ft_st_to_f32, as eval and train read them, so export
 * and merge refuse an adapter holding an inf or NaN before they write anything). Errors
 * name the file and the tensor (FT_E_INVALID, FT_E_UNSUPPORTED for embedding, lm_head or
 * modules_to_save tensors, FT_E_NOTFOUND for a missing one, FT_E_CORRUPT for a non-finite
 * element, -errno). */
typedef struct ft_peft_file {
    ft_lora_cfg cfg;                 /* r, alpha, use_rslora, targets (dropout, seed unused) */
    float scale;                     /* alpha / r, or alpha / sqrt(r) with rsLoRA (fp32) */
    char base_name[1024];            /* base_model_name_or_path ("" if absent or null); a hub
                                      * id with a "revision" reads "org/name@REV" */
    char path[4200];                 /* DIR/adapter_model.safetensors */
    int64_t n_layers;
    int64_t in_n[FT_N_PROJ], out_n[FT_N_PROJ]; /* per targeted projection */
    struct ft_st_file *st;
    const struct ft_st_tensor *(*t)[FT_N_PROJ][2]; /* [n_layers][proj][0 = A, 1 = B] */
} ft_peft_file;

int ft_peft_open(ft_peft_file *a, const char *dir);
void ft_peft_close(ft_peft_file *a); /* NULL-safe, idempotent */

/* Checks an opened adapter against a base model's config: the number of layers and every
 * targeted projection's (out, in) (formats.md 2.3). `model` names the base in messages.
 * Returns 0 or FT_E_INVALID ("... the adapter was trained on another base model"). */
int ft_peft_check_base(const ft_peft_file *a, const ft_model_config *mc, const char *model);


/* Converts the A (which = 0) or B (which = 1) of layer i, projection p to fp64 in dst
 * (r*in or out*r values, row-major; dst from malloc), through ft_st_to_f32 as eval and train
 * load an adapter: so export and merge refuse an inf or NaN element too. Returns 0,
 * FT_E_UNSUPPORTED (dtype) or FT_E_CORRUPT ("DIR/adapter_model.safetensors: offset O:
 * tensor T element E is NaN, ..."). */
int ft_peft_tensor_f64(const ft_peft_file *a, int64_t layer, int p, int which, double *dst);

#endif
