/* gen_prompt.h - the prompt side of generation: a prompt's chat-template ids, the records of a
 * prompts file (ftune generate --prompts) with their own generation settings, and the
 * sampling seed of record i (gen_prompt.c). */
#ifndef FT_GEN_PROMPT_H
#define FT_GEN_PROMPT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "src/template/chat.h"
#include "src/tokenizer/tokenizer.h"

/* Flags of ft_gen_prompt_ids / ft_gen_req_ids. */
enum {
    FT_GEN_RAW = 1,      /* no chat template: the prompt text is encoded as is (with BOS) */
    FT_GEN_NO_THINK = 2, /* the generation prompt of enable_thinking=False (ft_chat_ctx.no_think:
                          * qwen3's empty <think></think>; the Jinja engine passes
                          * enable_thinking=false to the model's template; the other built-in
                          * templates have no such switch) */
};

/* Token ids of a generation prompt: without FT_GEN_RAW in flags the messages [system,] user
 * are rendered with chat template tmpl (enum ft_chat_template; FT_CHAT_AUTO detects it from
 * the tokenizer's chat_template) followed by its generation prompt (ft_chat_render_prompt,
 * FT_GEN_NO_THINK as ft_chat_ctx.no_think), and encoded as training does (BOS only through
 * the template, except for alpaca); with FT_GEN_RAW, `prompt` is encoded as is with the
 * tokenizer's special tokens (BOS). system may be NULL. *ids is malloc'ed (caller frees).
 * *tmpl_out (may be NULL) receives the resolved template. Returns 0, -ENOMEM, FT_E_INVALID
 * (template or tokenizer error). */
int ft_gen_prompt_ids(const ft_tokenizer *tok, int tmpl, const char *system, const char *prompt,
                      int flags, int32_t **ids, int64_t *n, int *tmpl_out);

/* ---- prompts files (ftune generate --prompts) ----------------------------------------------- */

/* Largest --max-new-tokens (and a record's "max_new_tokens"). */
#define FT_GEN_MAX_NEW_TOKENS 1000000
/* Most stop strings of a reply (--stop flags, a record's "stop" list). */
#define FT_GEN_MAX_STOP_STR 16
/* Most stop token ids of a reply (--stop-token-ids, a record's "stop_token_ids" list). */
#define FT_GEN_MAX_STOP_IDS 64

/* Bits of ft_gen_params.set: the fields a record gives. */
enum {
    FT_GEN_SET_MAX_NEW = 1 << 0,
    FT_GEN_SET_TEMPERATURE = 1 << 1,
    FT_GEN_SET_TOP_P = 1 << 2,
    FT_GEN_SET_TOP_K = 1 << 3,
    FT_GEN_SET_MIN_P = 1 << 4,
    FT_GEN_SET_REP_PENALTY = 1 << 5,
    FT_GEN_SET_STOP = 1 << 6,
    FT_GEN_SET_SEED = 1 << 7,
    FT_GEN_SET_STOP_IDS = 1 << 8,
};

/* Generation settings of one prompts-file record, each replacing the command line's for that
 * record only (vLLM's LLM.generate with one SamplingParams per prompt). A field counts only
 * when its FT_GEN_SET_* bit is in `set`; the ranges are those of the flags (sample.h). */
typedef struct ft_gen_params {
    unsigned set;               /* FT_GEN_SET_* */
    int64_t max_new_tokens;     /* 1..FT_GEN_MAX_NEW_TOKENS */
    float temperature;          /* finite, >= 0; 0: greedy */
    float top_p;                /* (0, 1] */
    int64_t top_k;              /* >= 0; 0: off */
    float min_p;                /* [0, 1] */
    float repetition_penalty;   /* finite, > 0; 1: off */
    char **stop;                /* n_stop non-empty strings, malloc'ed (an empty list: none) */
    int64_t n_stop;             /* 0..FT_GEN_MAX_STOP_STR */
    uint64_t seed;              /* 0..2^53 - 1: replaces ft_gen_record_seed's */
    int32_t *stop_ids;          /* n_stop_ids token ids 0..INT32_MAX (the vocabulary bound is
                                 * checked once the model is loaded), malloc'ed; [] : none */
    int64_t n_stop_ids;         /* 0..FT_GEN_MAX_STOP_IDS */
} ft_gen_params;

/* One prompt read from a record of a prompts file; it owns its strings and JSON (the record
 * may be freed). msgs[0..n_msgs) is the conversation to render, ending with a user (or tool)
 * turn; user is the text reported as the prompt: the last user turn (an alpaca record's
 * instruction + "\n\n" + input when there is an input), or with raw = 1 the whole text.
 * Function calling: tools and each message's json are what the model's template gets, as
 * in training (ft_chat_msg.json, ft_chat_ctx.tools). */
typedef struct ft_gen_req {
    ft_chat_msg *msgs;       /* n_msgs; content, input, reasoning malloc'ed; json a
                              * cJSON_Duplicate of the record's message, NULL for messages
                              * ftune makes up */
    int64_t n_msgs;
    cJSON *tools;            /* the record's "tools" (ft_data_record_tools), NULL if none */
    char *user;
    char *reference;         /* the expected reply, NULL if none: a final assistant turn
                              * (dropped from the prompt; its tool_calls as compact JSON when
                              * it has calls and no content), alpaca "output", "completion" */
    ft_gen_params params;    /* the record's own generation settings (none: set = 0) */
} ft_gen_req;

/* Reads one record (formats.md 8.1 schemas, as a prompt):
 *   "S"                                      the user message S;
 *   {"prompt": S, "system"?: S2, "completion"?: R, "tools"?: T}
 *                                            S after system message S2 (even ""), as
 *                                            --prompt S --system S2; R is the reference;
 *   any conversational record training reads (messages, sharegpt, alpaca with "output"
 *   optional, conversational prompt/completion), converted as training converts it
 *   (ft_data_record_messages): a final assistant turn (alpaca "output") is the reference,
 *   what is left must end with a user or tool turn.
 * system (may be NULL) is the default system message (--system) for a record without one.
 * With raw = 1 only "S" and {"prompt": S[, "completion": R]} are accepted (S encoded as is).
 * An object record may also set its own generation settings, into q->params (null is the
 * same as absent): "max_new_tokens" | "max_tokens" | "max_completion_tokens" (an integer
 * 1..FT_GEN_MAX_NEW_TOKENS; two of them: refused unless equal), "temperature", "top_p",
 * "top_k", "min_p", "repetition_penalty" (as the flags), "stop" (a non-empty string or a list
 * of up to FT_GEN_MAX_STOP_STR), "stop_token_ids" (a list of up to FT_GEN_MAX_STOP_IDS
 * integers 0..2^31 - 1), "seed" (an integer 0..2^53 - 1). A record with a "reply" key (a line
 * `ftune generate --prompts` wrote, fed back) keeps its "stop" (why that reply ended) out of
 * its settings. The keys of the removed OpenAI Batch-API emulation ("body", "n", "logprobs",
 * "logit_bias", "presence_penalty", ...) are refused, naming the key; other keys are ignored.
 * A bad value, or a key an object holds twice, is FT_E_INVALID with a message naming the key
 * (callers prefix it with the location). Returns 0, -ENOMEM, FT_E_INVALID. On error *q is
 * left empty. Free with ft_gen_req_free. */
int ft_gen_req_parse(ft_gen_req *q, const cJSON *rec, const char *system, int raw);
void ft_gen_req_free(ft_gen_req *q); /* NULL-safe; leaves q zeroed */

/* Token ids of q's prompt, as ft_gen_prompt_ids renders them (the same template path and
 * flags, so a record {"prompt": S, "system": S2} gives the ids of --prompt S --system S2),
 * with q's tools and message objects, and the template chosen as training chooses it
 * (ft_chat_template_for). *tmpl_out (may be NULL) receives the template used. Returns as
 * ft_gen_prompt_ids, and ft_chat_template_for's FT_E_INVALID. */
int ft_gen_req_ids(const ft_tokenizer *tok, int tmpl, const ft_gen_req *q, int flags,
                   int32_t **ids, int64_t *n, int *tmpl_out);

/* The sampling seed of record i of a prompts file run with seed `seed`:
 *   seed XOR (z_i mod 2^53), z_0 = 0, z_i = the i-th output of splitmix64 started at 0
 * (Steele et al. 2014, src/core/rng.h), i.e. its finalizer applied to i * 0x9e3779b97f4a7c15.
 * Record 0 uses the seed itself (a one-record file samples as --prompt does); a record's
 * draws depend only on (seed, i), not on the records around it; a seed below 2^53 gives
 * seeds below 2^53 (exact as JSON numbers, reusable as --seed). */
uint64_t ft_gen_record_seed(uint64_t seed, int64_t i);

#endif
