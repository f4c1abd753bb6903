/* peft.h - PEFT LoRA adapter folders (formats.md 3 and 9): adapter_config.json +
 * adapter_model.safetensors, as transformers + PEFT and vLLM load them unchanged.
 * Keys: base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A,B}.weight,
 * A (r, in), B (out, r), F32, __metadata__ {"format": "pt"}. */
#ifndef FT_PEFT_H
#define FT_PEFT_H

#include "adapters/lora.h"
#include "src/model/model.h"

/* Writes DIR/adapter_model.safetensors then DIR/adapter_config.json, each to a temporary
 * name, fsynced and renamed (a failure leaves no partial file under the final names).
 * base_name goes to base_model_name_or_path. Creates DIR. Returns 0 or -errno. */
int ft_peft_save(const char *dir, ft_lora *l, const ft_model *m, const char *base_name);

/* Reads DIR/adapter_config.json into cfg (r, lora_alpha, lora_dropout, use_rslora,
 * target_modules). Rejects what ftune cannot apply (use_dora, bias != "none",
 * fan_in_fan_out, unknown target modules) with FT_E_UNSUPPORTED naming the file and key. */
int ft_peft_read_config(const char *dir, ft_lora_cfg *cfg);

/* Loads DIR/adapter_model.safetensors into an adapter initialised with the same config
 * (ft_lora_init): every targeted A/B must be present with the right shape (F32, F16 or
 * BF16). Errors name the file and tensor. */
int ft_peft_load_weights(const char *dir, ft_lora *l);

/* The PEFT key of layer i, projection p, which = 'A' or 'B', into out. */
void ft_peft_key(char *out, size_t n, int64_t layer, int p, char which);

#endif
