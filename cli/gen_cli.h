/* gen_cli.h - what the parts of `ftune generate` in cli/ share: the options (one --prompt in
 * cmd_generate.c, a --prompts file in gen_prompts.c, a --chat conversation in gen_chat.c) and
 * their printing helpers. The generation itself is src/infer/gen_env.h's. Private to cli/. */
#ifndef FT_CLI_GEN_CLI_H
#define FT_CLI_GEN_CLI_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "cli/args.h"
#include "src/infer/gen_env.h"
#include "src/infer/gen_prompt.h"

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
    int batch_set;              /* --batch given (else FT_GEN_BATCH_DEFAULT, fitted to a GPU budget) */
    const char *device;         /* --device (NULL: $FTUNE_DEVICE, else auto) */
    int64_t gpu_mem, host_mem;  /* --gpu-mem, --host-mem (0: defaults) */
    float temperature, top_p, min_p, rep_penalty;
    ft_str_list stop;           /* --stop strings */
    gen_id_list stop_ids;       /* --stop-token-ids (with --prompts: records without their own) */
    int chat, quiet;            /* --chat (stdin lines are user turns), --quiet (no per-turn stats) */
    int64_t ctx_size;           /* --ctx-size: the chat's KV cache in tokens (0: the default) */
} gen_opts;

/* The reply settings of the flags (sampling seeded with --seed). */
ft_gen_reply_cfg gen_reply_cfg(const gen_opts *o);

/* FT_GEN_* prompt flags of the options. */
int gen_flags(const gen_opts *o);

/* Opens the session of the flags (cli/session.h ft_session_open_quant) and the tokenizer, and
 * checks --stop-token-ids against the vocabulary. */
int gen_open(ft_gen_env *e, const gen_opts *o);

/* ft_gen_env_plan with the flags' sampler, --gpu-mem and --batch, warning on stderr when the
 * model's own template has no end-of-turn word or when fewer sequences than asked fit. */
int gen_plan(ft_gen_env *e, const gen_opts *o, const ft_gen_need *nd, int tmpl, int64_t n_seqs);

/* ft_gen_text_fn writing to stdout (flushed); user: an int, whether the text ended a line. */
void gen_put_text(void *user, const char *s, size_t n);

/* "stop" of the JSON output, and the same for the stderr summaries. */
const char *gen_stop_name(const ft_gen_result *r);
const char *gen_stop_said(const ft_gen_result *r);

/* ids[0..n) as a JSON array of numbers (NULL when out of memory). */
cJSON *gen_ids_json(const int32_t *ids, int64_t n);

/* "seed" as a JSON integer (cJSON's %.15g would print a 16-digit seed as a float). */
void gen_add_seed(cJSON *j, uint64_t seed);

/* A warning on stderr when n_prompt + max_new tokens exceed the model's
 * max_position_embeddings (`what` names the prompt). */
void gen_warn_context(const ft_gen_env *e, int64_t n_prompt, int64_t max_new, const char *what);

/* --no-think with a template that has no enable_thinking switch: said once. */
void gen_warn_no_think(const gen_opts *o, const ft_tokenizer *tok, int tmpl);

/* --chat (gen_chat.c) and --prompts FILE (gen_prompts.c). Return 0 or an error (the message
 * set); a SIGINT at the chat's prompt exits the process with 130. */
int gen_run_chat(const gen_opts *o);
int gen_run_prompts(const gen_opts *o);

#endif
