/* gen_env.h - what `ftune generate` shares between one --prompt (cmd_generate.c), a
 * --prompts file decoded in batches (gen_batch.c) and a --chat conversation (gen_chat.c): the
 * options, the loaded model with its KV caches and sampler (gen_env), a reply, and their
 * helpers. Private to cli/. */
#ifndef FT_CLI_GEN_ENV_H
#define FT_CLI_GEN_ENV_H

#include <cjson/cJSON.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/args.h"
#include "cli/session.h"
#include "src/tokenizer/tokenizer.h"
#include "src/infer/generate.h"
#include "src/infer/sample.h"
#include "src/infer/stop_text.h"

#define MAX_STOP 16     /* stop token ids */
#define GEN_EXEC_T 64 /* tokens of the executor that serves generation its weights */
#define GEN_BATCH_DEFAULT 8 /* --prompts records decoded together unless --batch says */
/* Rows of logits per forward of a prompt whose log-probabilities are asked for (prompt_logprobs,
 * echo): its prefill runs in forwards of this many tokens, each returning (rows, V) logits, so
 * that a long prompt never needs (prompt, V) of them (128k vocabulary: 128 MiB of fp32 host
 * logits, as much in the backend's arena). */
#define GEN_PLP_ROWS 256

/* --stop-token-ids ID,ID,...: the token ids (each below the model's vocabulary size, checked
 * once it is loaded). */
typedef struct gen_id_list {
    int32_t v[FT_GEN_MAX_STOP_IDS];
    int64_t n;
} gen_id_list;

typedef struct gen_opts {
    const char *model, *adapter, *prompt, *system, *prompts, *out, *quant, *cache_dir;
    const char *model_given;    /* --model as given (a hub id stays an id; model: the resolved path) */
    int raw, json, tmpl, no_think;
    int64_t max_new, top_k, seed, threads, batch;
    int batch_set;              /* --batch given (else GEN_BATCH_DEFAULT, fitted to a GPU budget) */
    const char *device;         /* --device (NULL: $FTUNE_DEVICE, else auto) */
    int64_t gpu_mem, host_mem;  /* --gpu-mem, --host-mem (0: defaults) */
    float temperature, top_p, min_p, rep_penalty;
    float presence_penalty, frequency_penalty; /* OpenAI's, over the reply's ids (0: off) */
    ft_str_list stop;           /* --stop strings */
    gen_id_list stop_ids;       /* --stop-token-ids (with --prompts: records without their own) */
    int chat, quiet;            /* --chat (stdin lines are user turns), --quiet (no per-turn stats) */
    int64_t ctx_size;           /* --ctx-size: the chat's KV cache in tokens (0: the default) */
    int64_t logprobs;           /* --logprobs N: the reply's log-probabilities with N alternatives
                                 * per token (0..FT_GEN_MAX_LOGPROBS); -1: none (the default) */
    int64_t prompt_logprobs;    /* --prompt-logprobs K (--prompts): the prompt tokens'
                                 * log-probabilities with K alternatives each for the records
                                 * that do not set "prompt_logprobs"; -1: none (the default) */
} gen_opts;

/* What ended a reply. */
enum { GEN_STOP_LENGTH, GEN_STOP_TOKEN, GEN_STOP_STRING };

/* The reply to one prompt. */
typedef struct gen_result {
    const int32_t *prompt_ids, *out_ids; /* out_ids: the env's buffer, valid until the next prompt */
    int64_t n_prompt, n_out;
    int stop;                   /* GEN_STOP_*: --max-new-tokens, a stop token or a --stop string */
    int stop_str;               /* GEN_STOP_STRING: the --stop string that matched */
    int32_t stop_tok;           /* GEN_STOP_TOKEN: the token that ended it (not in out_ids) */
    double prefill_s, decode_s; /* decode_s covers n_out - 1 forwards (+ sampling) */
    int64_t n_decode;           /* decode forwards */
    int64_t n_cached;           /* prompt tokens the cache already held (not prefilled) */
    int interrupted;            /* 1: a stop request (SIGINT in --chat) ended it early */
    char *text;                 /* full decode of out_ids (skip special), malloc'ed */
    /* With log-probabilities (else lp NULL): for reply token i, lp_ids[i * lp_stride] is the
     * token and lp[i * lp_stride] its log-probability, then lp_top alternatives (ids and
     * log-probabilities, the most likely first): the env's buffers, valid as out_ids. */
    float *lp;
    int32_t *lp_ids;
    int64_t lp_stride, lp_top;
} gen_result;

/* What stays loaded across prompts. */
typedef struct gen_env {
    ft_session s;               /* model, backend, adapter; the executor over the pack */
    ft_model *m;                /* s.model */
    ft_tokenizer *tok;
    ft_gen_source src;          /* the pack's weights (a pack-only model: --quant nf4, or a
                                 * folder that holds only its pack) */
    ft_gen g;
    ft_sampler smp;
    ft_sample_counts cnt;       /* slot 0's reply ids counted (gen_reply), with --presence-penalty or
                                 * --frequency-penalty; else unallocated */
    ft_sample_seen *seen;       /* (slots) the ids each sequence holds, with --repetition-penalty;
                                 * else NULL */
    float *logits;              /* (slots, V) host */
    int32_t *out_ids;           /* (slots, max_new) host */
    int64_t lp_n;               /* 1 + the most alternatives per token any reply lists; 0: no
                                 * reply has log-probabilities (lp_val, lp_ids unallocated) */
    float *lp_val;              /* (slots, max_new, lp_n) host: per reply token its
                                 * log-probability, then its alternatives' (gen_result.lp) */
    int32_t *lp_ids;            /* (slots, max_new, lp_n) host: the token, then the alternatives */
    int64_t max_new;            /* out_ids tokens per slot: the most new tokens of any reply */
    int64_t slots;              /* sequences decoded together (--batch with --prompts) */
    int32_t stop[MAX_STOP];
    int n_stop;
} gen_env;

/* What gen_env_plan sizes for: the longest prompt, the longest prompt plus the new tokens asked
 * of its reply (tokens per KV cache), the most new tokens of any reply, whether some
 * sequence has a repetition penalty (each slot then keeps the ids it holds), lp_n: 1 + the
 * most alternatives per token of a reply with log-probabilities (0: none has them), and
 * plp_rows: the rows of logits a prompt with log-probabilities needs per forward
 * (GEN_PLP_ROWS; 0: no prompt asks for them). */
typedef struct gen_need {
    int64_t max_prompt, ctx, max_new;
    int seen;
    int64_t lp_n;
    int64_t plp_rows;
} gen_need;

/* Seconds on the monotonic clock. */
double gen_now_s(void);

/* 1 when token t ends a reply (the template's end-of-turn or an EOS id). */
int gen_is_stop(const gen_env *e, int32_t t);
/* 1 when t is one of ids[0..n) (--stop-token-ids, a record's "stop_token_ids"). */
int gen_id_listed(const int32_t *ids, int64_t n, int32_t t);
/* FT_E_INVALID naming (after `what`) the first of ids[0..n) that is no id of a vocabulary of
 * V tokens ("item 2: 32000 is no token id of the model ..."); 0 when all are. */
int gen_stop_ids_check(const int32_t *ids, int64_t n, int64_t V, const char *what);

/* Writes s[0..n) to stdout and flushes (streaming); *last_nl: whether it ended a line. */
void gen_put_piece(const char *s, size_t n, int *last_nl);

/* "stop" of the JSON output. */
const char *gen_stop_name(const gen_result *r);

/* The same, for the stderr summaries. */
const char *gen_stop_said(const gen_result *r);

/* Streams what ft_stop_text_safe allows of a reply's text (stop_text.h). */
void gen_show_text(ft_stop_text *x, const ft_str_list *stop, int final, int *last_nl);

/* Loads the model, backend, adapter and tokenizer (cli/session.h ft_session_open_quant). With
 * --quant nf4 the model is loaded deferred and every base weight is read from its NF4 pack
 * (as `ftune eval --quant nf4`: the base a QLoRA adapter was trained on, with the run's
 * --quant-correction), no fp32 copy in memory; on a device the bf16 base stays deferred too
 * until gen_env_plan's ft_session_plan reads it or streams it from its bf16 pack. */
int gen_env_open(gen_env *e, const gen_opts *o);

/* Sizes the KV caches of `slots` sequences (decoded together) for nd->ctx tokens each
 * (prompts of up to nd->max_prompt tokens, prefilled in chunks of at most
 * FT_GEN_CHUNK_DEFAULT, and their replies); the sampler (the command line's settings), the
 * buffers and the stop tokens of the resolved template tmpl. The forwards return up to
 * max(slots, min(nd->plp_rows, chunk)) rows of logits (e->g.logit_rows_max), e->logits holds
 * as many rows. */
int gen_env_plan(gen_env *e, const gen_opts *o, const gen_need *nd, int tmpl, int64_t slots);

/* Frees what gen_env_open and gen_env_plan made; leaves e zeroed. */
void gen_env_close(gen_env *e);

/* ids[0..n) as a JSON array of numbers (NULL when out of memory). */
cJSON *gen_ids_json(const int32_t *ids, int64_t n);

/* "seed": the seed as a JSON integer. cJSON prints numbers with %.15g, which writes a 16-digit
 * seed ending in 0 as 1.79577021929528e+15: exact, but a script reading it back gets a float,
 * which --seed refuses. Seeds are < 2^53 (--seed, the clock's, the per-record ones). */
void gen_add_seed(cJSON *j, uint64_t seed);

/* A warning on stderr when n_prompt + max_new tokens exceed the model's
 * max_position_embeddings (`what` names the prompt). */
void gen_warn_context(const gen_env *e, int64_t n_prompt, int64_t max_new, const char *what);

/* FT_GEN_* flags of the options. */
int gen_flags(const gen_opts *o);

/* Points r's log-probabilities (top alternatives per token, 0..lp_n - 1) at slot k's rows of
 * the env's buffers; top < 0 (or no buffers): none, r->lp left NULL. */
void gen_lp_attach(const gen_env *e, int64_t k, int64_t top, gen_result *r);

/* With r->lp set, records reply token t (about to be appended as r->out_ids[r->n_out]): its
 * log-probability and r->lp_top alternatives from logits (V, the row t was drawn from;
 * ft_sample_logprobs). Returns 0 or its errors. */
int gen_lp_note(const gen_env *e, gen_result *r, const float *logits, int32_t t);

/* The log-probabilities of reply r (r->lp set) as JSON, in the shape of `api`:
 *   FT_GEN_API_NONE (--prompts plain records, --prompt --json): [{"id", "token", "logprob",
 *     "top": [[id, logprob], ...]}, ...];
 *   FT_GEN_API_CHAT: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
 *     "logprob", "bytes"}, ...]}, ...], "refusal": null} (OpenAI's ChatCompletion choice
 *     logprobs; vLLM's ChatCompletionLogProbs);
 *   FT_GEN_API_COMPLETIONS: {"tokens", "token_logprobs", "top_logprobs": [{TOKEN: logprob}
 *     per token: the token itself first, then the alternatives not equal to it, so up to
 *     lp_top + 1 entries as OpenAI describes and vLLM writes them], "text_offset"}.
 * One entry per reply token (the stop token that ended it is not part of the reply). "token":
 * the token's bytes (ft_tok_token_bytes) as UTF-8, an invalid sequence replaced by U+FFFD
 * (a piece of a character split across tokens); "bytes": the raw byte values; "text_offset":
 * the offsets of the tokens in characters, each the previous one plus the length of its
 * token (vLLM's). A log-probability of -inf (a -inf logit) is written -9999.0, as vLLM and
 * OpenAI write it. *out is NULL on error. Returns 0, -ENOMEM, FT_E_INVALID (a token the
 * tokenizer lacks). */
int gen_logprobs_json(const ft_tokenizer *tok, const gen_result *r, int api, cJSON **out);

/* A log-probability for JSON: -9999.0 for -inf (and below it), as vLLM and OpenAI write it;
 * else the double nearest to v's 9 significant digits (it reads back as v in float). */
double gen_lp_out(float v);

/* Token id's text as the log-probabilities name it ("token", "decoded_token": its bytes as
 * UTF-8, an invalid sequence replaced by U+FFFD), malloc'ed; *chars its length in characters
 * (may be NULL). Returns 0, -ENOMEM, FT_E_INVALID (an id the tokenizer lacks). */
int gen_token_text(const ft_tokenizer *tok, int32_t id, char **text, int64_t *chars);

/* --no-think with a template that has no enable_thinking switch: said once, as transformers
 * passes enable_thinking to any template and those ignore it. */
void gen_warn_no_think(const gen_opts *o, const ft_tokenizer *tok, int tmpl);

/* The reply to prompt ids[0..n) in slot 0, whose cache already holds ids[0..keep) (0 <= keep
 * < n; 0: an empty cache): the cache is cut back to them (ft_gen_truncate_slot), RoPE set for
 * n + o->max_new tokens (the caller cuts to 0 when that changes the table of the rows it
 * keeps), ids[keep..n) prefilled in chunks, then tokens decoded with e->smp as it stands (the
 * caller seeds it) until a stop token, a --stop string or o->max_new; the repetition penalty
 * sees ids[0..n) and the reply. Streamed to stdout (whole UTF-8 characters, nothing printed
 * that a stop string later cuts, a newline at the end unless the text ended one) when stream =
 * 1. A non-zero *stop (may be NULL; set by a signal handler) ends the prefill or the reply at
 * the next token, r->interrupted = 1. Afterwards slot 0's cache holds the first e->g.past[0]
 * tokens of ids followed by r->out_ids. r->text: the reply's text (with --stop, cut before
 * the string), malloc'ed. Returns 0 or a forward/sampler error (the cache is then empty). */
int gen_reply(gen_env *e, const gen_opts *o, const int32_t *ids, int64_t n, int64_t keep, int stream,
              const volatile sig_atomic_t *stop, gen_result *r);

/* --chat: a conversation on stdin (gen_chat.c; see cmd_generate.c's header). Returns 0 (EOF,
 * /exit) or an error (the message set); a SIGINT at the prompt exits the process with 130. */
int gen_run_chat(const gen_opts *o);

/* --prompts FILE: every record answered, --batch of them decoded together, one JSON line each
 * (gen_batch.c). Returns 0 or an error (the message set). */
int gen_run_batch(const gen_opts *o);

#endif
