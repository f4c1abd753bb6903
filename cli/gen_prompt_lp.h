/* gen_prompt_lp.h - the prompt log-probabilities of `ftune generate --prompts` as JSON (vLLM's
 * prompt_logprobs; OpenAI's legacy completions echo), from the values ft_gen_prompt_logprobs
 * computes (src/infer/generate.h ft_gen_plp). Private to cli/.
 *
 * Sources: vllm/logprobs.py (Logprob: logprob, rank, decoded_token; PromptLogprobs, a list with
 * None for the first prompt token; append_logprobs_for_next_position: the token first with its
 * rank, then the top k with ranks 1..k, a token listed twice keeping its first place and the
 * later value), vllm/entrypoints/openai/serving_completion.py (request_output_to_completion_
 * response: echo joins prompt and reply text and log-probabilities; _create_completion_logprobs:
 * token_logprobs and top_logprobs None for the first prompt token, the first k + 1 entries of
 * each position's dict, text_offset the running sum of the token texts' lengths),
 * vllm/entrypoints/openai/protocol.py (CompletionRequest.to_sampling_params: prompt_logprobs
 * defaults to logprobs with echo; ChatCompletionRequest: to top_logprobs), serving_engine.py
 * clamp_prompt_logprobs (-inf written -9999.0). */
#ifndef FT_CLI_GEN_PROMPT_LP_H
#define FT_CLI_GEN_PROMPT_LP_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "src/tokenizer/tokenizer.h"
#include "src/infer/generate.h"

/* The alternatives per prompt token of a record (-1: no prompt log-probabilities): its own
 * "prompt_logprobs" (p, FT_GEN_SET_PROMPT_LOGPROBS; a plain record's false: -1), else, with
 * "echo" (api: FT_GEN_API_*), the reply's alternatives lp_top as vLLM takes the request's
 * logprobs for them (chat: 0 without them; completions without logprobs: none implied), else
 * the command line's (flag, -1 when not given). */
int64_t gen_plp_alternatives(const ft_gen_params *p, int api, int64_t flag, int64_t lp_top);

/* vLLM's prompt_logprobs list of p (n entries): null for the first token, then for each position
 * {"<id>": {"logprob", "rank", "decoded_token"}, ...}: the prompt token with its rank, then its
 * k alternatives with ranks 1..k (k entries when the token is one of them, else k + 1).
 * "decoded_token": the token's text as the reply's log-probabilities name it (gen_token_text).
 * *out is NULL on error. Returns 0, -ENOMEM, FT_E_INVALID (a token the tokenizer lacks). */
int gen_plp_json(const ft_tokenizer *tok, const ft_gen_plp *p, cJSON **out);

/* Echo: puts the prompt's entries (p) before the reply's in lp, a completions logprobs object
 * ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}, gen_logprobs_json): the first
 * token with null log-probability and alternatives, each other with at most top + 1 entries of
 * its dict (the token first, then its alternatives), and the reply's text offsets moved past the
 * prompt tokens' text. Returns 0, -ENOMEM, FT_E_INVALID (a token the tokenizer lacks; lp is then
 * as it was). */
int gen_plp_echo(const ft_tokenizer *tok, const ft_gen_plp *p, int64_t top, cJSON *lp);

#endif
