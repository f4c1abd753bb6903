/* model_card.h - the README.md model card of a PEFT adapter folder, as PEFT's save_pretrained
 * writes one (peft_model.py create_or_update_model_card over huggingface_hub's ModelCard):
 * YAML front matter the Hugging Face Hub reads (base_model, library_name: peft,
 * pipeline_tag: text-generation, tags base_model:adapter:<id>, lora), then Markdown: the base
 * model, the training data, the LoRA and training settings, the results (train and eval
 * loss), and how to load the adapter with PEFT (AutoPeftModelForCausalLM), vLLM
 * (--enable-lora --lora-modules) and llama.cpp (ftune export to a GGUF LoRA, --lora).
 */
#ifndef FT_MODEL_CARD_H
#define FT_MODEL_CARD_H

#include <cjson/cJSON.h>

/* Writes dir/README.md (atomically) for the adapter in dir: its adapter_config.json gives
 * the base (base_model_name_or_path, revision) and the LoRA settings; summary (a run's
 * summary.json: data, n_train, n_eval, steps, tokens, final_train_loss, final_eval_loss,
 * best_eval_loss, best_eval_step; NULL: none) and settings (the run config of a
 * checkpoint, checkpoint.h: its scalar entries are listed; NULL: none) the rest. A base that
 * is not a Hugging Face id (a local path) gets no base_model key, which the Hub reserves for
 * ids, and the card says to pass the base model. Returns 0, -errno, FT_E_INVALID
 * (adapter_config.json not a JSON object; the message names it). */
int ft_model_card_write(const char *dir, const cJSON *summary, const cJSON *settings);

#endif
