/* gen_env.h - what a generation run keeps loaded (the runtime session, the KV caches, the
 * sampler and the stop tokens: ft_gen_env), the reply to one prompt (ft_gen_reply: one
 * --prompt, a --chat turn) and the batch scheduler of a prompts file (ft_gen_batch: up to
 * n_seqs replies decoded together, one forward per token step). cli/ turns the flags into
 * these settings and prints what comes back.
 *
 * A "sequence" (seq) is one reply being generated, with its own KV cache row of ctx_max
 * tokens (generate.h); n_seqs of them are decoded together.
 */
#ifndef FT_GEN_ENV_H
#define FT_GEN_ENV_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "offload/session.h"
#include "src/infer/generate.h"
#include "src/infer/sample.h"
#include "src/infer/stop_text.h"
#include "src/tokenizer/tokenizer.h"

#define FT_GEN_MAX_EOS 16      /* stop tokens of the model and template */
#define FT_GEN_EXEC_T 64       /* tokens of the executor that serves generation its weights */
#define FT_GEN_BATCH_DEFAULT 8 /* prompts decoded together unless --batch says */

/* How one reply is sampled and what ends it. The strings and ids are the caller's. */
typedef struct ft_gen_reply_cfg {
    ft_sample_cfg sc;           /* temperature, top-k/p, min-p, repetition penalty, seed */
    int64_t max_new;            /* 1..FT_GEN_MAX_NEW_TOKENS */
    const char *const *stop;    /* n_stop stop strings (stop_text.h) */
    int64_t n_stop;
    const int32_t *stop_ids;    /* n_stop_ids token ids that end the reply besides the EOS */
    int64_t n_stop_ids;
} ft_gen_reply_cfg;

/* What ended a reply. */
enum { FT_GEN_STOP_LENGTH, FT_GEN_STOP_TOKEN, FT_GEN_STOP_STRING };

/* The reply to one prompt. */
typedef struct ft_gen_result {
    const int32_t *prompt_ids, *out_ids; /* out_ids: the env's buffer, valid until the next prompt */
    int64_t n_prompt, n_out;
    int stop;                   /* FT_GEN_STOP_* */
    int stop_str;               /* FT_GEN_STOP_STRING: the stop string that matched */
    int32_t stop_tok;           /* FT_GEN_STOP_TOKEN: the token that ended it (not in out_ids) */
    double prefill_s, decode_s; /* seconds; decode_s covers n_decode forwards (+ sampling) */
    int64_t n_decode;           /* decode forwards */
    int64_t n_cached;           /* prompt tokens the cache already held (not prefilled) */
    int interrupted;            /* 1: a stop request (SIGINT in --chat) ended it early */
    char *text;                 /* the reply's text (special tokens skipped; with stop strings
                                 * cut before the one that matched), malloc'ed */
} ft_gen_result;

/* What stays loaded across prompts. */
typedef struct ft_gen_env {
    ft_session s;               /* model, backend, adapter; the executor over the pack */
    ft_model *m;                /* s.model */
    ft_tokenizer *tok;
    ft_gen_source src;          /* the executor's weights (a pack, a device backend) */
    ft_gen g;
    ft_sampler smp;
    ft_sample_seen *seen;       /* (n_seqs) each sequence's ids, with a repetition penalty */
    float *logits;              /* (n_seqs, V) host */
    int32_t *out_ids;           /* (n_seqs, max_new) host */
    int64_t max_new;            /* out_ids tokens per sequence */
    int64_t n_seqs;             /* sequences decoded together */
    int32_t eos[FT_GEN_MAX_EOS]; /* the model's and template's stop tokens */
    int n_eos;
} ft_gen_env;

/* What ft_gen_env_plan sizes for: the longest prompt, tokens per KV cache (the longest prompt
 * + its reply), the most new tokens of any reply, whether a sequence has a repetition
 * penalty. */
typedef struct ft_gen_need {
    int64_t max_prompt, ctx, max_new;
    int seen;
} ft_gen_need;

/* Seconds on the monotonic clock. */
double ft_gen_now_s(void);

/* 1 when t is one of ids[0..n). */
int ft_gen_id_listed(const int32_t *ids, int64_t n, int32_t t);
/* FT_E_INVALID naming (after `what`) the first of ids[0..n) that is no id of a vocabulary of
 * V tokens; 0 when all are. */
int ft_gen_ids_check(const int32_t *ids, int64_t n, int64_t V, const char *what);

/* Loads the tokenizer of the session e->s (opened by the caller, offload/session.h, no
 * executor yet). Returns 0 or the tokenizer's error. */
int ft_gen_env_load(ft_gen_env *e);

/* Sizes the KV caches of n_seqs sequences for nd->ctx tokens each (prompts prefilled in
 * chunks of at most FT_GEN_CHUNK_DEFAULT; the prompts that start together in one forward of
 * up to that many tokens), places the weights (ft_session_plan: a pack or a device backend
 * reads them through the executor; its budget leaves room for the caches, e->s.gpu_reserve),
 * and sets up the sampler (sc), the buffers and the stop tokens of template tmpl. On a device
 * with fit = 1 (the default --batch), n_seqs is lowered until the caches take at most a
 * quarter of the gpu_mem budget (e->n_seqs says how many). Returns 0, -ENOMEM, or the
 * session's and ft_gen_init_seqs' errors; *eot_warn (may be NULL) is set to 1 when the
 * model's own template gave no end-of-turn word (only the EOS stops a reply). */
int ft_gen_env_plan(ft_gen_env *e, const ft_gen_need *nd, const ft_sample_cfg *sc, int tmpl,
                    int64_t n_seqs, int64_t gpu_mem, int fit, int *eot_warn);

/* Frees what the session, ft_gen_env_load and ft_gen_env_plan made; leaves e zeroed. */
void ft_gen_env_close(ft_gen_env *e);

/* Receives the text of a streamed reply as it becomes final (whole UTF-8 characters, nothing
 * that a stop string may later cut). */
typedef void (*ft_gen_text_fn)(void *user, const char *s, size_t n);

/* The reply to prompt ids[0..n) in sequence 0, whose cache already holds ids[0..keep) (0 <= keep
 * < n): the cache is cut back to them (ft_gen_truncate_seq), RoPE set for n + c->max_new
 * tokens, ids[keep..n) prefilled in chunks, then tokens decoded with e->smp as it stands (the
 * caller seeds it; c->sc's other settings are the env's) until a stop token, a stop string or
 * c->max_new; the repetition penalty sees ids[0..n) and the reply. on_text (may be NULL)
 * receives the streamed text. A non-zero *stop (may be NULL; set by a signal handler) ends
 * the prefill or the reply at the next token, r->interrupted = 1. Afterwards sequence 0's
 * cache holds the first e->g.past[0] tokens of ids followed by r->out_ids. Returns 0 or a
 * forward/sampler error (the cache is then empty). */
int ft_gen_reply(ft_gen_env *e, const ft_gen_reply_cfg *c, const int32_t *ids, int64_t n,
                 int64_t keep, ft_gen_text_fn on_text, void *user,
                 const volatile sig_atomic_t *stop, ft_gen_result *r);

/* One prompt of a batch: its ids, settings (c.sc.seed: its draws) and a name for messages. */
typedef struct ft_gen_item {
    const int32_t *ids;
    int64_t n;
    ft_gen_reply_cfg c;
    const char *where;          /* "FILE: line N" */
} ft_gen_item;

/* Called once per prompt, in item order, when its reply and those before it are done: r
 * (r->text malloc'ed, owned by the scheduler; r->out_ids NULL), seconds from the start of its
 * prefill to its last token. A non-zero return stops the batch with that error. */
typedef int (*ft_gen_done_fn)(void *user, int64_t i, const ft_gen_result *r, double seconds);

/* Counts of a batch run. */
typedef struct ft_gen_batch_stats {
    int64_t steps;              /* decode forwards, each one token of every running sequence */
    int64_t forwards;           /* prefill forwards */
    int64_t batched;            /* prompts prefilled in a forward with others */
    int64_t new_tokens;
} ft_gen_batch_stats;

/* Generates the replies to items[0..n), up to e->n_seqs together: the prompts that start
 * together are prefilled in one forward as far as the chunk allows (ft_gen_prefill; with
 * prefill_each = 1 one prompt per forward, for comparisons), then one forward per step
 * (ft_gen_decode) decodes the next token of every running sequence, so each layer's weights
 * are read once per step for all of them; a finished sequence's cache row takes the next
 * prompt. Each sequence samples with its item's settings and draws (the env's sampler, its
 * cfg and PRNG swapped per sequence), so an item's reply is that of ft_gen_reply with the
 * same settings (up to the last bits of a GEMM over more rows). done() gets the replies in
 * item order. Errors are prefixed with the item's `where`. */
int ft_gen_batch(ft_gen_env *e, const ft_gen_item *items, int64_t n, int prefill_each,
                 ft_gen_done_fn done, void *user, ft_gen_batch_stats *st);

#endif
