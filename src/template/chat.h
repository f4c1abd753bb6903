/* chat.h - built-in chat template renderers (formats.md 7.2): a conversation becomes one
 * text plus a list of segments, each flagged trained or not, so that the loss mask can be
 * mapped onto the tokens of the whole text (dataset.c). Internal to src/data.
 *
 * Trained segments (formats.md 8.2, TRL assistant_only_loss semantics): the content of each
 * trained assistant turn and its end-of-turn token:
 *   llama3  <|start_header_id|>assistant<|end_header_id|>\n\n | trim(content)<|eot_id|> |
 *           (also llama3.1)
 *   chatml  <|im_start|>assistant\n | content<|im_end|> | \n          ("\n" is not trained)
 *   llama2  ... [/INST] | ␠strip(content)␠</s> |                  (Llama-2-chat template)
 *           ... [/INST] | content</s> |                            (Mistral template)
 *   alpaca  ...### Response: | output</s> |
 *   zephyr  <|assistant|>\n | content</s> | \n
 *   qwen3   <|im_start|>assistant\n | [<think>\n...\n</think>\n\n]content<|im_end|> | \n
 *           (the thinking block, where the template writes one, is trained with the answer,
 *           as in TRL's qwen3_training.jinja {% generation %} span)
 * (the eos/bos strings are the tokenizer's own).
 */
#ifndef FT_CHAT_H
#define FT_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "src/tokenizer/tokenizer.h"

/* The chat template a data set is rendered with (--chat-template; FT_CHAT_AUTO: chosen from
 * the tokenizer's chat_template). */
enum ft_chat_template {
    FT_CHAT_AUTO = 0,  /* match tokenizer_config chat_template; alpaca prompt if none */
    FT_CHAT_LLAMA3,    /* <|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|> */
    FT_CHAT_CHATML,    /* <|im_start|>role\n content <|im_end|>\n (Qwen, SmolLM) */
    FT_CHAT_LLAMA2,    /* <s>[INST] <<SYS>>..<</SYS>> user [/INST] assistant </s> (Llama-2, Mistral) */
    FT_CHAT_ALPACA,    /* Stanford Alpaca prompt, "### Response:" */
    FT_CHAT_QWEN3,     /* ChatML + Qwen3's <think> blocks (chat.c) */
    FT_CHAT_LLAMA31,   /* Llama-3.1/3.2/3.3: llama3 + the system turn with its date lines */
    FT_CHAT_ZEPHYR,    /* <|user|>\n content </s>\n (Zephyr, TinyLlama-Chat) */
    FT_CHAT_JINJA,     /* the tokenizer's own chat_template through the Jinja engine (chat_jinja.c) */
};

enum ft_chat_role { FT_ROLE_SYSTEM = 0, FT_ROLE_USER, FT_ROLE_ASSISTANT, FT_ROLE_TOOL };

/* One message. Strings are borrowed (not copied) and need not be NUL-terminated. */
typedef struct ft_chat_msg {
    int role;                /* enum ft_chat_role */
    const char *content;     /* UTF-8 */
    size_t content_n;
    const char *input;       /* user turns made from alpaca records: the "input" field, */
    size_t input_n;          /* NULL/0 if none. Chat templates render content + "\n\n" + input */
    int train;               /* assistant turns: 1 trained, 0 not ("weight": 0, prompt part) */
    const char *reasoning;   /* assistant turns: the record's "reasoning_content" (may be ""), */
    size_t reasoning_n;      /* NULL if it has none. Only the qwen3 template writes it (in place
                              * of reasoning parsed from <think>...</think> in content); the
                              * other templates' Jinja sources ignore the field, as here */
    const void *json;        /* borrowed cJSON object: the record's message as written (with
                              * "tool_calls", "name", "tool_call_id"...), or the OpenAI-form
                              * object a LLaMA-Factory function_call turn is converted to;
                              * NULL for messages ftune makes up (alpaca, a sharegpt "system"
                              * field). Only the
                              * Jinja renderer reads it (chat_jinja.c vars_of) */
} ft_chat_msg;

/* A rendered text: segments cover text[0..n) contiguously, in order. */
typedef struct ft_chat_seg { size_t off, n; int train; } ft_chat_seg;
typedef struct ft_chat_text {
    char *text; size_t n, cap;          /* NUL-terminated */
    ft_chat_seg *seg; int64_t n_seg, cap_seg;
} ft_chat_text;

/* What the renderers need from the tokenizer. */
typedef struct ft_chat_ctx {
    const char *bos;         /* BOS token string ("" if none) */
    const char *eos;         /* EOS token string ("" if none) */
    const char *tmpl_src;    /* the tokenizer's chat_template (NULL if none): selects the
                              * SmolLM/Qwen default system turn and the Mistral variant */
    int no_think;            /* 1: the generation prompt as with enable_thinking=False (qwen3:
                              * an empty <think></think> block the model continues after);
                              * 0: enable_thinking undefined. Read by qwen3, and passed by the
                              * Jinja engine to the model's template as enable_thinking */
    const void *tools;       /* borrowed cJSON array: the record's "tools" (function schemas),
                              * NULL if none; passed to the Jinja renderer as `tools` (the
                              * built-in renderers write no tools: ft_chat_uses_tools) */
} ft_chat_ctx;

/* Appends n bytes of s as one segment (merged with the previous one if the flag is the
 * same). Returns 0 or -ENOMEM. */
int ft_chat_text_put(ft_chat_text *t, const char *s, size_t n, int train);
void ft_chat_text_free(ft_chat_text *t);  /* NULL-safe; leaves t zeroed */

/* Renders messages m[0..n) with template tmpl (FT_CHAT_LLAMA3/LLAMA31/CHATML/LLAMA2/ALPACA/QWEN3; not
 * AUTO) into *out (appended to; caller frees with ft_chat_text_free).
 * Returns 0, -ENOMEM, FT_E_INVALID (message says why, without a file location: roles that
 * the template cannot render, e.g. non-alternating user/assistant for llama2, a tool turn
 * for llama2/alpaca, a system message after the first turn for llama2). */
int ft_chat_render(ft_chat_text *out, int tmpl, const ft_chat_msg *m, int64_t n,
                   const ft_chat_ctx *ctx);

/* Renders messages m[0..n) as ft_chat_render does, then the template's generation prompt
 * (transformers add_generation_prompt=True, formats.md 7.2): the assistant header
 * "<|start_header_id|>assistant<|end_header_id|>\n\n" (llama3, llama3.1), "<|im_start|>assistant\n"
 * (chatml; qwen3 too, as with enable_thinking left undefined: the model opens its own
 * <think>; with ctx->no_think, "<|im_start|>assistant\n<think>\n\n</think>\n\n", the
 * template's enable_thinking=False branch), "<|assistant|>\n" (zephyr); nothing for llama2/mistral (the user turn ends with " [/INST]") and alpaca (it
 * ends with "### Response:"). All of it is one untrained segment.
 * Returns 0, -ENOMEM, FT_E_INVALID (as ft_chat_render, or n == 0, or the last message is
 * an assistant turn). */
int ft_chat_render_prompt(ft_chat_text *out, int tmpl, const ft_chat_msg *m, int64_t n,
                          const ft_chat_ctx *ctx);

/* The token string that closes an assistant turn of template tmpl: "<|eot_id|>" (llama3),
 * "<|im_end|>" (chatml, qwen3), "<|eot_id|>" also for llama3.1; NULL for llama2 and alpaca, whose turns end with the tokenizer's
 * EOS. Generation stops there. */
const char *ft_chat_end_of_turn(int tmpl);

/* FT_CHAT_* for a chat_template source string by substring (llama.cpp
 * llm_chat_detect_template): "<|im_start|>" -> CHATML (QWEN3 when the source also has
 * "<think>" and Qwen3's "last_query_index"; JINJA with "<think>" otherwise: QwQ and the
 * distills rewrite reasoning as plain ChatML does not; JINJA for Phi-4's "<|im_sep|>"; LLAMA31 for "<|start_header_id|>"
 * with "Cutting Knowledge Date"; ZEPHYR for "<|user|>" and "<|assistant|>" without Phi-3's
 * "<|end|>"), "<|start_header_id|>" -> LLAMA3, "[INST]" -> LLAMA2, NULL -> ALPACA, any other
 * template -> JINJA (the template itself, jinja.h). */
int ft_chat_detect_str(const char *tmpl_src);

/* Renders messages m[0..n) with the template source ctx->tmpl_src through the Jinja engine
 * (jinja.h: as transformers' apply_chat_template, with bos_token, eos_token,
 * add_generation_prompt = gen_prompt and, with ctx->no_think, enable_thinking = false),
 * appended to *out. With gen_prompt the text is one untrained segment; otherwise the trained
 * segments are the assistant turns (m[i].train) as chat_jinja.c's file comment defines them:
 * the template's {% generation %} blocks, or each turn's text after the generation prompt up
 * to its end-of-turn token. Returns 0, -ENOMEM, FT_E_INVALID (no template, a parse or
 * render error of the template with its line, raise_exception's message, a template that
 * rewrites earlier turns so a trained turn has no place), FT_E_RANGE (a render limit). */
int ft_chat_render_jinja(ft_chat_text *out, const ft_chat_msg *m, int64_t n,
                         const ft_chat_ctx *ctx, int gen_prompt);

/* 1 when the conversation m[0..n) with ctx needs a template that writes tools: ctx->tools is
 * set (even an empty list: Llama-3.1's template tests `tools is not none`), or a message's
 * json has a "tool_calls" key that is not null; else 0. The built-in renderers write
 * neither (dataset.c renders such records with the model's own template, or refuses them). */
int ft_chat_uses_tools(const ft_chat_msg *m, int64_t n, const ft_chat_ctx *ctx);

/* The end-of-turn string of the Jinja template ctx->tmpl_src into buf (n bytes): the first
 * word (up to whitespace) the template writes after an assistant reply ("<end_of_turn>",
 * "<|end|>", "<|im_end|>", the EOS); "" when it writes none, or there is no template.
 * Generation stops on it when the tokenizer has it as a token. Returns 0 or the render error. */
int ft_chat_jinja_end_of_turn(const ft_chat_ctx *ctx, char *buf, size_t n);

/* Python str.strip() whitespace (str.isspace) on UTF-8: trims s[0..*n) in place by moving
 * *s and *n. Jinja's `trim` filter and `.strip()` use this set. */
void ft_chat_strip(const char **s, size_t *n);

/* The enum ft_chat_template FT_CHAT_AUTO resolves to for tok's chat_template: the substring
 * rules of ft_chat_detect_str, and for ChatML the built-in-vs-engine probe, which renders. Its
 * loader runs it once and stores the result in the tokenizer (ft_tok_set_chat_kind, as
 * src/model/loader.c ft_model_tokenizer does); ft_chat_template_detect reads it. Needs tok's
 * BOS/EOS strings. Never fails (a probe that cannot render keeps the built-in). */
int ft_chat_template_resolve(const ft_tokenizer *tok);

#endif
