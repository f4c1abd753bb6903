/* gen_choices.h - the records of `ftune generate --prompts` (gen_batch.c decodes them) and their
 * output lines (gen_choices.c): a plain record's {index, prompt, reply, ...} line, or an OpenAI
 * batch request's Batch API line with its "n" choices. Private to cli/. */
#ifndef FT_CLI_GEN_CHOICES_H
#define FT_CLI_GEN_CHOICES_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/gen_env.h"

/* One record of a --prompts file, with its settings: the command line's, replaced by those
 * the record sets (q.params). */
typedef struct batch_rec {
    ft_gen_req q;
    char where[300];            /* "FILE: line N" / "FILE: record N" */
    char at[40];                /* "line N" / "record N" */
    int32_t *ids;
    int64_t n;
    ft_sample_cfg sc;           /* sc.seed: the record's "seed", else ft_gen_record_seed's (choice
                                 * 0's; gen_choice_seed gives the others') */
    int64_t max_new;
    const char *const *stop;    /* n_stop: the --stop strings or the record's "stop" */
    int64_t n_stop;
    const int32_t *stop_ids;    /* n_stop_ids: --stop-token-ids or the record's "stop_token_ids" */
    int64_t n_stop_ids;
    int64_t min_tokens;         /* the record's "min_tokens" (0: none) */
    const int32_t *bias_ids;    /* n_bias: the record's "logit_bias" ids, and their biases */
    const float *bias;
    int64_t n_bias;
    int ignore_eos;             /* the record's "ignore_eos": only its stop ids end the reply */
    int64_t lp_top;             /* log-probabilities with this many alternatives per token
                                 * (--logprobs or the record's own); -1: none */
    int64_t n_choices;          /* 1, or a batch request's "n" */
    int64_t first;              /* its first choice's place in the run's list of choices */
    int64_t plp_k;              /* its prompt's log-probabilities with this many alternatives per
                                 * token (the record's "prompt_logprobs", else
                                 * --prompt-logprobs, else with echo the request's logprobs:
                                 * gen_prompt_lp.h); -1: none */
    int echo;                   /* a completions request's "echo": true (the prompt before the
                                 * reply, in its text and log-probabilities) */
    ft_gen_plp plp;             /* the values, once its first choice's prefill computed them
                                 * (ft_gen_prompt_logprobs); freed when its line is written */
} batch_rec;

/* One finished choice (reply) of a record, held until the records before it are written. */
typedef struct gen_choice {
    int done;
    gen_result r;               /* r.text malloc'ed; r.out_ids and r.lp NULL (the slot's buffers
                                 * went to the next reply) */
    double seconds;             /* from its prefill to its last token */
    int32_t stop_tok;           /* the stop token that ended it (GEN_STOP_TOKEN), else -1 */
    cJSON *lp;                  /* its log-probabilities (gen_logprobs_json in the record's
                                 * shape), or NULL */
} gen_choice;

/* The sampling seed of choice c of a record whose seed is `seed` (choice 0's): choice 0
 * samples with seed itself, as a one-choice request does; choice c > 0 with
 * ft_gen_record_seed(h(seed), c), h splitmix64's finalizer of seed ^ 0x63686f696365 ("choice")
 * kept to 53 bits, so that no two (record, choice) pairs of a file share a seed by
 * construction (vLLM's parallel sampling gives child c seed + c; ftune's seeds stay below
 * 2^53, as for records). */
uint64_t gen_choice_seed(uint64_t seed, int64_t c);

/* Writes record i's output line to f (o->out names it in messages): the Batch API's object for
 * a batch request, its choices c[0..x->n_choices) in order; else {index, prompt, reply, ...}
 * from c[0] (cmd_generate.c's header); with x->plp_k >= 0 the prompt's log-probabilities
 * (gen_prompt_lp.h: vLLM's "prompt_logprobs" in each completions choice, once in a chat body,
 * in a plain line), with x->echo the prompt before a completions choice's text and
 * log-probabilities. tok names the tokens; eos: the tokenizer's EOS id (vLLM's stop_reason is
 * null for it). Takes over each c[j].lp (set to NULL). Returns 0, -ENOMEM, -EIO, FT_E_INVALID
 * (a token the tokenizer lacks). */
int gen_put_record(FILE *f, const gen_opts *o, const ft_tokenizer *tok, int64_t i,
                   const batch_rec *x, gen_choice *c, int32_t eos);

#endif
