/* cmd_generate.c - `ftune generate --model M [--adapter DIR] --prompt S ...`: a reply of the
 * model (and adapter) to one prompt, streamed to stdout as it is decoded.
 *
 * The prompt goes through the model's chat template with the generation prompt (unless
 * --raw), is prefilled in one batched forward (chunks of FT_GEN_CHUNK_DEFAULT tokens when
 * longer), then tokens are chosen one by one (greedy by default; --temperature > 0 samples,
 * with --top-k / --top-p / --min-p; --repetition-penalty for either; src/model/sample.h) and
 * each runs one forward against the KV cache, until an EOS or end-of-turn token, a --stop
 * string or --max-new-tokens. Text is printed as whole UTF-8 characters become available;
 * speeds go to stderr. --json prints one JSON object instead (prompt and generated ids, text,
 * stop reason, timings) for scripts and tests.
 *
 * --stop STR (repeatable, up to FT_GEN_MAX_STOP_STR; in --config a string or a list) as vLLM's
 * SamplingParams.stop: the reply ends as soon as its decoded text (special tokens skipped,
 * whole UTF-8 characters) contains one of them, and its text stops before that string (the
 * string is not included); "stop": "stop_string" and "stop_reason": the string that matched
 * (vLLM's CompletionOutput.stop_reason). Its ids and new_tokens still count every token
 * generated, the one(s) that completed the string included (vLLM keeps them in token_ids).
 * When one token completes two of them, the one that ends first wins, then the one listed
 * first (vLLM's check_stop_strings takes the first listed that the new text completes).
 * Streaming holds back the longest end of the text that begins a stop string until the next
 * tokens settle it, so that nothing printed is later cut (as vLLM and llama.cpp's server do).
 *
 * --prompts FILE answers many prompts in one process: the model, adapter and KV cache are
 * loaded once (the cache sized for the longest prompt), every record of FILE (JSONL or a JSON
 * array; ft_gen_req_parse in src/model/generate.h lists the schemas) is read and encoded
 * before anything is generated, so that a bad record stops the run with its line; up to
 * --batch records are decoded together (run_batch), each in its own cache slot, reset when a
 * record takes it. One JSON line per record goes to stdout, in input order:
 *   {"index", "prompt", "reply", "reference"?, "prompt_tokens", "new_tokens",
 *    "stop" ("stop_token" | "stop_string" | "length", as --json), "stop_reason"? (the --stop
 *    string, with "stop_string"), "seconds", "seed"? (when sampling)}
 * ("seconds": from the start of the record's prefill to its last token, the records decoded
 * alongside it included)
 * or to --out FILE, written as FILE.tmp.PID and renamed at the end (an interrupted run leaves
 * no partial FILE). Record i samples with ft_gen_record_seed(seed, i) (record 0 with the
 * seed itself), so its reply is that of --prompt with that --seed.
 * A record (an object) may set its own "max_new_tokens" (or "max_tokens"), "temperature",
 * "top_p", "top_k", "min_p", "repetition_penalty", "stop" (a string or a list) and "seed"
 * (ft_gen_req_parse), as vLLM's LLM.generate takes one SamplingParams per prompt: each
 * replaces the flag for that record only, so its line is that of --prompt with the flags so
 * changed ("seed": its own when it sets one; "seed" is written when the record samples). Each
 * KV cache holds the largest prompt + new tokens of any record; each slot samples with its
 * record's settings and draws (one ft_sampler, its cfg and PRNG swapped per slot), and keeps
 * the ids it holds when any record has a repetition penalty.
 *
 * --quant nf4 generates on the base a QLoRA adapter was trained on: the model's NF4 pack
 * (built or reused under --cache-dir, as `ftune train --quant nf4` and `ftune eval --quant
 * nf4`), with the run's --quant-correction when the adapter's run had one, and no fp32 copy of
 * the model in memory; each token dequantizes every layer's block (on the CPU into fp32; on a
 * GPU into bf16, or the fused NF4 GEMM), the pack held in memory (on a GPU placed within
 * --gpu-mem / --host-mem by the offload planner, as training places it: the layers beyond the
 * budget are streamed at every token). A folder that holds only a pack (init-model --pack)
 * is served the same way without the flag. On a GPU the bf16 base also goes through the
 * executor: its bf16 weight copies, as training reads them (no fp32 copy on the device).
 *
 * Defaults: greedy decoding (temperature 0), so that a run is reproducible and two adapters
 * can be compared on the same prompt. llama.cpp's CLI samples by default (temperature 0.8,
 * top-k 40, top-p 0.95, plus min-p 0.05); `--temperature 0.8 --top-k 40 --top-p 0.95` is
 * that setting without min-p. Without --seed a sampling run picks a seed from the clock
 * and prints it on stderr.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/data/chat.h"
#include "src/data/dataset.h"
#include "src/data/records.h"
#include "src/model/generate.h"
#include "src/model/sample.h"
#include "src/model/stop_text.h"

#define MAX_STOP 16     /* stop token ids */
#define GEN_EXEC_T 64 /* tokens of the executor that serves generation its weights */
#define GEN_BATCH_DEFAULT 8 /* --prompts records decoded together unless --batch says */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int opt_template(const char *v, void *dst, char *err, size_t n)
{
    int k = ft_chat_template_parse(v);
    if (k < 0) { snprintf(err, n, "unknown chat template '%s' (auto, llama3, llama3.1, chatml, qwen3, llama2, mistral, zephyr, alpaca, jinja)", v); return -1; }
    *(int *)dst = k;
    return 0;
}

typedef struct gen_opts {
    const char *model, *adapter, *prompt, *system, *prompts, *out, *quant, *cache_dir;
    int raw, json, tmpl, no_think;
    int64_t max_new, top_k, seed, threads, batch;
    int batch_set;              /* --batch given (else GEN_BATCH_DEFAULT, fitted to a GPU budget) */
    const char *device;         /* --device (NULL: $FTUNE_DEVICE, else auto) */
    int64_t gpu_mem, host_mem;  /* --gpu-mem, --host-mem (0: defaults) */
    float temperature, top_p, min_p, rep_penalty;
    ft_str_list stop;           /* --stop strings */
} gen_opts;

/* What ended a reply. */
enum { GEN_STOP_LENGTH, GEN_STOP_TOKEN, GEN_STOP_STRING };

/* The reply to one prompt. */
typedef struct gen_result {
    const int32_t *prompt_ids, *out_ids; /* out_ids: the env's buffer, valid until the next prompt */
    int64_t n_prompt, n_out;
    int stop;                   /* GEN_STOP_*: --max-new-tokens, a stop token or a --stop string */
    int stop_str;               /* GEN_STOP_STRING: the --stop string that matched */
    double prefill_s, decode_s; /* decode_s covers n_out - 1 forwards (+ sampling) */
    int64_t n_decode;           /* decode forwards */
    char *text;                 /* full decode of out_ids (skip special), malloc'ed */
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
    ft_sample_seen *seen;       /* (slots) the ids each sequence holds, with --repetition-penalty;
                                 * else NULL */
    float *logits;              /* (slots, V) host */
    int32_t *out_ids;           /* (slots, max_new) host */
    int64_t max_new;            /* out_ids tokens per slot: the most new tokens of any reply */
    int64_t slots;              /* sequences decoded together (--batch with --prompts) */
    int32_t stop[MAX_STOP];
    int n_stop;
} gen_env;

/* 1 when token t ends a reply (the template's end-of-turn or an EOS id). */
static int is_stop(const gen_env *e, int32_t t)
{
    for (int s = 0; s < e->n_stop; s++)
        if (t == e->stop[s]) return 1;
    return 0;
}

static void put_piece(const char *s, size_t n, int *last_nl)
{
    if (!n) return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    *last_nl = s[n - 1] == '\n';
}

/* "stop" of the JSON output. */
static const char *stop_name(const gen_result *r)
{
    return r->stop == GEN_STOP_STRING ? "stop_string" : r->stop == GEN_STOP_TOKEN ? "stop_token" : "length";
}

/* The same, for the stderr summaries. */
static const char *stop_said(const gen_result *r)
{
    return r->stop == GEN_STOP_STRING ? "stop string" : r->stop == GEN_STOP_TOKEN ? "end token" : "--max-new-tokens";
}

/* Streams what ft_stop_text_safe allows of a reply's text (stop_text.h). */
static void st_show(ft_stop_text *x, const ft_str_list *stop, int final, int *last_nl)
{
    const size_t safe = ft_stop_text_safe(x, stop->v, stop->n, final);
    if (safe > x->shown) {
        put_piece(x->buf + x->shown, safe - x->shown, last_nl);
        x->shown = safe;
    }
}

/* Loads the model, backend, adapter and tokenizer (cli/session.h ft_session_open_quant). With
 * --quant nf4 the model is loaded deferred and every base weight is read from its NF4 pack
 * (as `ftune eval --quant nf4`: the base a QLoRA adapter was trained on, with the run's
 * --quant-correction), no fp32 copy in memory; on a device the bf16 base stays deferred too
 * until env_plan's ft_session_plan reads it or streams it from its bf16 pack. */
static int env_open(gen_env *e, const gen_opts *o)
{
    memset(e, 0, sizeof *e);
    int rc = ft_session_open_quant(&e->s, o->model, o->adapter, o->device, (int)o->threads,
                                   o->quant, o->cache_dir, o->gpu_mem, o->host_mem, NULL);
    e->m = e->s.model;
    if (!rc) rc = ft_model_tokenizer(e->m, &e->tok);
    return rc;
}

/* What env_plan sizes for: the longest prompt, the longest prompt plus the new tokens asked
 * of its reply (tokens per KV cache), the most new tokens of any reply, and whether some
 * sequence has a repetition penalty (each slot then keeps the ids it holds). */
typedef struct gen_need {
    int64_t max_prompt, ctx, max_new;
    int seen;
} gen_need;

/* Sizes the KV caches of `slots` sequences (decoded together) for nd->ctx tokens each
 * (prompts of up to nd->max_prompt tokens, prefilled in chunks of at most
 * FT_GEN_CHUNK_DEFAULT, and their replies); the sampler (the command line's settings), the
 * buffers and the stop tokens of the resolved template tmpl. */
static int env_plan(gen_env *e, const gen_opts *o, const gen_need *nd, int tmpl, int64_t slots)
{
    const int64_t V = e->m->cfg.vocab_size, ctx = nd->ctx, max_prompt = nd->max_prompt;
    if (slots > ctx) slots = ctx; /* a decode step has at most chunk <= ctx rows */
    e->slots = slots;
    int64_t chunk = max_prompt < FT_GEN_CHUNK_DEFAULT ? max_prompt : FT_GEN_CHUNK_DEFAULT;
    if (chunk < slots) chunk = slots;
    const ft_lora *lora = e->s.has_lora ? &e->s.lora : NULL;
    if (e->m->pack_only[0] || !e->s.be->ops->host_memory) {
        /* the weights through an executor for chunks of up to `chunk` tokens: on a device the
         * bf16 copies it places (as training reads them) or the pack's blocks; over a pack on
         * the CPU the whole pack in memory, as every token visits every layer */
        e->s.pack_in_memory = 1;
        /* generation reads only the executor's weights: its activation arena (sized by T)
         * stays small, whatever the chunk (1024 tokens would be 1.65 GiB for an 8B model) */
        /* the KV cache and buffers allocated after the placement: kept out of its budget */
        if (!e->s.be->ops->host_memory) {
            /* the default batch on a GPU: at most a quarter of the budget for the KV caches
             * (each sequence has its own), so that they do not push base layers out to the
             * streamed tiers; an explicit --batch is taken as given */
            ft_mem_budget mb = {0};
            const uint64_t budget = ft_backend_mem_budget(e->s.be, o->gpu_mem, 0, &mb) ? 0 : mb.budget;
            const int64_t asked = slots;
            while (!o->batch_set && slots > 1 && budget &&
                   ft_gen_source_bytes(e->m, lora, ctx, chunk, slots, slots) > budget / 4)
                slots--;
            if (slots < asked) {
                fprintf(stderr, "ftune: %lld prompts at a time, not %lld: their KV caches of %lld "
                        "tokens would take more than a quarter of the GPU budget (--batch sets it)\n",
                        (long long)slots, (long long)asked, (long long)ctx);
                e->slots = slots;
            }
            e->s.gpu_reserve = (int64_t)ft_gen_source_bytes(e->m, lora, ctx, chunk, slots, slots);
        }
        FT_TRY(ft_session_plan(&e->s, chunk < GEN_EXEC_T ? chunk : GEN_EXEC_T));
        FT_TRY(ft_exec_gen_source(&e->s.ex, &e->src));
        FT_TRY(ft_gen_init_slots(&e->g, e->s.be, e->m, lora, &e->src, ctx, chunk, slots, slots));
    } else {
        FT_TRY(ft_gen_init_slots(&e->g, e->s.be, e->m, lora, NULL, ctx, chunk, slots, slots));
    }
    ft_sample_cfg sc = {o->temperature, o->top_k, o->top_p, (uint64_t)o->seed, o->rep_penalty, o->min_p};
    FT_TRY(ft_sampler_init(&e->smp, &sc, V));
    if (nd->seen) { /* each sequence's ids, for the penalty */
        e->seen = calloc((size_t)slots, sizeof *e->seen);
        if (!e->seen) return ft_err(-ENOMEM, "out of memory");
        for (int64_t k = 0; k < slots; k++) FT_TRY(ft_sample_seen_init(&e->seen[k], V));
    }
    e->logits = malloc((size_t)(slots * V) * sizeof(float));
    e->max_new = nd->max_new;
    e->out_ids = malloc((size_t)(slots * nd->max_new) * sizeof(int32_t));
    if (!e->logits || !e->out_ids) return ft_err(-ENOMEM, "out of memory");
    const char *eot = ft_chat_end_of_turn(tmpl);
    char jeot[64];
    if (tmpl == FT_CHAT_JINJA) { /* what the model's template writes after a reply */
        ft_chat_ctx ctx = {ft_tok_bos_str(e->tok), ft_tok_eos_str(e->tok), ft_tok_chat_template(e->tok)};
        /* a template that cannot render the probe leaves only the EOS ids to stop on */
        if (ft_chat_jinja_end_of_turn(&ctx, jeot, sizeof jeot))
            fprintf(stderr, "ftune: warning: no end-of-turn word from the chat template (%s); "
                    "stopping on the EOS only\n", ft_errmsg());
        eot = jeot[0] ? jeot : NULL;
    }
    e->n_stop = ft_sample_stop_ids(&e->m->cfg, e->tok, eot, e->stop, MAX_STOP);
    return 0;
}

static void env_close(gen_env *e)
{
    for (int64_t k = 0; e->seen && k < e->slots; k++) ft_sample_seen_free(&e->seen[k]);
    free(e->seen);
    free(e->logits);
    free(e->out_ids);
    ft_sampler_free(&e->smp);
    ft_gen_free(&e->g);
    ft_tok_free(e->tok);
    ft_session_close(&e->s);
    memset(e, 0, sizeof *e);
}

/* The reply to prompt ids[0..n) from an empty cache, sampling with `seed`; streamed to stdout
 * when stream = 1. */
static int gen_one(gen_env *e, const gen_opts *o, const int32_t *ids, int64_t n, uint64_t seed,
                   int stream, gen_result *r)
{
    memset(r, 0, sizeof *r);
    r->prompt_ids = ids;
    r->n_prompt = n;
    r->out_ids = e->out_ids;
    ft_gen_reset(&e->g);
    ft_sampler_reseed(&e->smp, seed);
    ft_sample_seen *seen = e->seen; /* slot 0's; NULL without --repetition-penalty */
    if (seen) {
        ft_sample_seen_clear(seen);
        ft_sample_seen_add(seen, ids, n); /* the prompt's ids are penalised too */
    }
    ft_stop_text st; /* streamed text and --stop */
    ft_stop_text_init(&st, e->tok);
    const int use_st = stream || o->stop.n > 0;
    /* RoPE as a cache sized for this prompt alone would have it (dynamic NTK scaling) */
    int rc = ft_gen_set_rope_len(&e->g, n + o->max_new);
    const int64_t chunk = e->g.chunk_max;

    /* prefill, in chunks of at most `chunk` tokens */
    double t0 = now_s();
    for (int64_t i = 0; !rc && i < n; i += chunk) {
        int64_t k = n - i < chunk ? n - i : chunk;
        rc = ft_gen_forward(&e->g, ids + i, k, e->logits, 1);
    }
    r->prefill_s = now_s() - t0;

    /* decode */
    int last_nl = 1;
    t0 = now_s();
    while (!rc && r->n_out < o->max_new) {
        int32_t t;
        rc = ft_sample_next_seen(&e->smp, e->logits, seen, &t);
        if (rc) break;
        if (is_stop(e, t)) {
            r->stop = GEN_STOP_TOKEN;
            break;
        }
        e->out_ids[r->n_out++] = t;
        if (seen) ft_sample_seen_add(seen, &t, 1);
        if (use_st) rc = ft_stop_text_push(&st, o->stop.v, o->stop.n, t);
        if (!rc && stream) st_show(&st, &o->stop, 0, &last_nl);
        if (!rc && st.hit >= 0) break;
        if (!rc && r->n_out < o->max_new) {
            rc = ft_gen_forward(&e->g, &t, 1, e->logits, 1);
            r->n_decode++;
        }
    }
    r->decode_s = now_s() - t0;
    if (!rc && use_st) rc = ft_stop_text_flush(&st, o->stop.v, o->stop.n);
    if (!rc && st.hit >= 0) {
        r->stop = GEN_STOP_STRING;
        r->stop_str = st.hit;
    }
    if (!rc && stream) {
        st_show(&st, &o->stop, 1, &last_nl);
        if (!last_nl) putchar('\n');
        fflush(stdout);
    }
    /* with --stop the text cut before the stop string; else the ids decoded */
    if (!rc) rc = o->stop.n ? ft_stop_text_take(&st, &r->text) : ft_tok_decode(e->tok, e->out_ids, r->n_out, 1, &r->text);
    ft_stop_text_free(&st);
    return rc;
}

static cJSON *ids_json(const int32_t *ids, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* "seed": the seed as a JSON integer. cJSON prints numbers with %.15g, which writes a 16-digit
 * seed ending in 0 as 1.79577021929528e+15: exact, but a script reading it back gets a float,
 * which --seed refuses. Seeds are < 2^53 (--seed, the clock's, the per-record ones). */
static void add_seed(cJSON *j, uint64_t seed)
{
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)seed);
    cJSON_AddRawToObject(j, "seed", b);
}

static void print_json(const gen_opts *o, int tmpl, const gen_result *r)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "template", o->raw ? "raw" : ft_chat_template_name(tmpl));
    cJSON_AddItemToObject(j, "prompt_ids", ids_json(r->prompt_ids, r->n_prompt));
    cJSON_AddItemToObject(j, "ids", ids_json(r->out_ids, r->n_out));
    cJSON_AddStringToObject(j, "text", r->text ? r->text : "");
    cJSON_AddStringToObject(j, "stop", stop_name(r));
    if (r->stop == GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", o->stop.v[r->stop_str]);
    add_seed(j, (uint64_t)o->seed);
    cJSON_AddNumberToObject(j, "prefill_s", r->prefill_s);
    cJSON_AddNumberToObject(j, "decode_s", r->decode_s);
    cJSON_AddNumberToObject(j, "decode_forwards", (double)r->n_decode);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

static void warn_context(const gen_env *e, int64_t n_prompt, int64_t max_new, const char *what)
{
    const int64_t maxpos = e->m->cfg.max_position_embeddings;
    if (maxpos > 0 && n_prompt + max_new > maxpos)
        fprintf(stderr, "ftune: warning: %s%lld prompt + %lld new tokens exceed the model's "
                "max_position_embeddings (%lld)\n", what, (long long)n_prompt, (long long)max_new,
                (long long)maxpos);
}

/* FT_GEN_* flags of the options. */
static int gen_flags(const gen_opts *o)
{
    return (o->raw ? FT_GEN_RAW : 0) | (o->no_think ? FT_GEN_NO_THINK : 0);
}

/* --no-think with a template that has no enable_thinking switch: said once, as transformers
 * passes enable_thinking to any template and those ignore it. */
static void warn_no_think(const gen_opts *o, const ft_tokenizer *tok, int tmpl)
{
    const char *src = ft_tok_chat_template(tok);
    /* the engine passes enable_thinking=false to the model's template, which may read it */
    int reads = tmpl == FT_CHAT_QWEN3 || (tmpl == FT_CHAT_JINJA && src && strstr(src, "enable_thinking"));
    if (o->no_think && !reads)
        fprintf(stderr, "ftune: warning: --no-think has no effect with chat template %s (it has no "
                "enable_thinking switch)\n", ft_chat_template_name(tmpl));
}

/* One prompt (--prompt): streamed, or one JSON object with --json. */
static int run_one(const gen_opts *o)
{
    gen_env e;
    gen_result r;
    int32_t *ids = NULL;
    int64_t n = 0;
    int tmpl = 0;
    memset(&r, 0, sizeof r);
    int rc = env_open(&e, o);
    if (!rc) rc = ft_gen_prompt_ids(e.tok, o->tmpl, o->system, o->prompt, gen_flags(o), &ids, &n, &tmpl);
    if (!rc) warn_no_think(o, e.tok, tmpl);
    if (!rc && n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
    if (!rc) warn_context(&e, n, o->max_new, "");
    const gen_need nd = {n, n + o->max_new, o->max_new, o->rep_penalty != 1};
    if (!rc) rc = env_plan(&e, o, &nd, tmpl, 1);
    if (!rc) rc = gen_one(&e, o, ids, n, (uint64_t)o->seed, !o->json, &r);
    if (!rc && o->json) print_json(o, tmpl, &r);
    if (!rc) {
        fprintf(stderr, "ftune: prefill %lld tokens in %.3f s (%.1f tok/s); decode %lld tokens in "
                "%.3f s (%.2f tok/s); stop: %s",
                (long long)r.n_prompt, r.prefill_s, r.prefill_s > 0 ? r.n_prompt / r.prefill_s : 0.0,
                (long long)r.n_out, r.decode_s,
                r.decode_s > 0 && r.n_decode > 0 ? r.n_decode / r.decode_s : 0.0, stop_said(&r));
        if (o->temperature > 0) fprintf(stderr, "; seed %lld", (long long)o->seed);
        fputc('\n', stderr);
    }
    free(r.text);
    free(ids);
    env_close(&e);
    return rc;
}

/* ---- --prompts FILE ------------------------------------------------------------------------ */

typedef struct batch_rec {
    ft_gen_req q;
    char where[300];            /* "FILE: line N" / "FILE: record N" */
    int32_t *ids;
    int64_t n;
    /* its settings: the command line's, replaced by those the record sets (q.params) */
    ft_sample_cfg sc;           /* sc.seed: the record's "seed", else ft_gen_record_seed's */
    int64_t max_new;
    const char *const *stop;    /* n_stop: the --stop strings or the record's "stop" */
    int64_t n_stop;
} batch_rec;

typedef struct batch {
    batch_rec *r;
    int64_t n, cap;
} batch;

static void batch_free(batch *b)
{
    for (int64_t i = 0; i < b->n; i++) {
        ft_gen_req_free(&b->r[i].q);
        free(b->r[i].ids);
    }
    free(b->r);
    memset(b, 0, sizeof *b);
}

/* Record i's settings (x->sc, max_new, stop): the command line's, with the record's own. */
static void rec_settings(batch_rec *x, const gen_opts *o, int64_t i)
{
    const ft_gen_params *p = &x->q.params;
    const unsigned set = p->set;
    x->sc = (ft_sample_cfg){o->temperature, o->top_k, o->top_p, ft_gen_record_seed((uint64_t)o->seed, i),
                            o->rep_penalty, o->min_p};
    if (set & FT_GEN_SET_TEMPERATURE) x->sc.temperature = p->temperature;
    if (set & FT_GEN_SET_TOP_K) x->sc.top_k = p->top_k;
    if (set & FT_GEN_SET_TOP_P) x->sc.top_p = p->top_p;
    if (set & FT_GEN_SET_MIN_P) x->sc.min_p = p->min_p;
    if (set & FT_GEN_SET_REP_PENALTY) x->sc.repetition_penalty = p->repetition_penalty;
    if (set & FT_GEN_SET_SEED) x->sc.seed = p->seed;
    x->max_new = set & FT_GEN_SET_MAX_NEW ? p->max_new_tokens : o->max_new;
    x->stop = set & FT_GEN_SET_STOP ? (const char *const *)p->stop : o->stop.v;
    x->n_stop = set & FT_GEN_SET_STOP ? p->n_stop : o->stop.n;
}

/* Reads and checks every record of o->prompts (no model needed). */
static int batch_read(batch *b, const gen_opts *o)
{
    ft_records rs;
    ft_record rec;
    int rc = ft_records_open(&rs, o->prompts), k = 0;
    while (!rc && (k = ft_records_next(&rs, &rec)) == 1) {
        if (b->n == b->cap) {
            int64_t cap = b->cap ? 2 * b->cap : 64;
            batch_rec *p = realloc(b->r, (size_t)cap * sizeof *p);
            if (!p) {
                rc = ft_err(-ENOMEM, "out of memory");
                break;
            }
            b->r = p;
            b->cap = cap;
        }
        batch_rec *x = &b->r[b->n];
        memset(x, 0, sizeof *x);
        ft_records_where(&rs, rec.loc, x->where, sizeof x->where);
        if (!rec.json) {
            rc = ft_err(FT_E_INVALID, "%s: %s", x->where, rec.err);
            break;
        }
        rc = ft_gen_req_parse(&x->q, rec.json, o->system, o->raw);
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        rec_settings(x, o, b->n);
        b->n++;
    }
    if (!rc && k < 0) rc = k;
    if (!rc && b->n == 0)
        rc = ft_err(FT_E_INVALID, "%s: no records (expected JSONL or a JSON array of prompts)",
                    o->prompts);
    ft_records_close(&rs);
    return rc;
}

/* The output of --out: FILE.tmp.PID until the run completes. */
typedef struct out_file {
    FILE *f;
    char tmp[4200];
} out_file;

static int out_open(out_file *of, const char *path)
{
    of->f = NULL;
    if (!path) return 0;
    if (snprintf(of->tmp, sizeof of->tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof of->tmp)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    of->f = fopen(of->tmp, "w");
    if (!of->f) return ft_err(-errno, "%s: cannot create: %s", of->tmp, strerror(errno));
    return 0;
}

/* Completes (ok = 1: flush, fsync, rename to path) or abandons (removes the temporary). */
static int out_close(out_file *of, const char *path, int ok)
{
    if (!of->f) return 0;
    int rc = 0;
    if (ok && (fflush(of->f) != 0 || fsync(fileno(of->f)) < 0))
        rc = ft_err(-errno, "%s: write failed: %s", of->tmp, strerror(errno));
    if (fclose(of->f) != 0 && ok && !rc)
        rc = ft_err(-errno, "%s: write failed: %s", of->tmp, strerror(errno));
    of->f = NULL;
    if (ok && !rc && rename(of->tmp, path) < 0)
        rc = ft_err(-errno, "%s: rename from %s failed: %s", path, of->tmp, strerror(errno));
    if (!ok || rc) unlink(of->tmp);
    else ft_fsync_parent(path);
    return rc;
}

static int put_line(FILE *f, const gen_opts *o, int64_t i, const batch_rec *x, const gen_result *r,
                    double seconds)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", (double)i);
    cJSON_AddStringToObject(j, "prompt", x->q.user);
    cJSON_AddStringToObject(j, "reply", r->text ? r->text : "");
    if (x->q.reference) cJSON_AddStringToObject(j, "reference", x->q.reference);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(j, "new_tokens", (double)r->n_out);
    cJSON_AddStringToObject(j, "stop", stop_name(r));
    if (r->stop == GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", x->stop[r->stop_str]);
    cJSON_AddNumberToObject(j, "seconds", seconds);
    if (x->sc.temperature > 0) add_seed(j, x->sc.seed);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    int bad = fputs(s, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    free(s);
    return bad ? ft_err(-EIO, "%s: write failed: %s", o->out ? o->out : "stdout", strerror(errno)) : 0;
}

/* A sequence being generated in one of the env's slots (--prompts with --batch). */
typedef struct slot_run {
    int64_t rec;                /* the record, -1: the slot is free */
    const batch_rec *x;         /* its prompt and settings */
    gen_result r;
    ft_rng rng;                 /* the record's sampling state (seeded with x->sc.seed) */
    int32_t next;               /* the sampled token to feed, when pending */
    int pending;                /* 1: `next` needs a decode forward */
    double t0;
    ft_stop_text st;            /* the reply's text, with stop strings */
    ft_sample_seen *seen;       /* the slot's ids (env's seen[k]), with a repetition penalty */
} slot_run;

/* A finished record, held until the records before it are written: its reply decoded when it
 * finishes (r.text), as its tokens are in the slot's buffer, which the next record takes. */
typedef struct done_rec {
    int done;
    gen_result r;               /* r.out_ids NULL */
    double seconds;
} done_rec;

/* Records slot sr's finished reply in dn[sr->rec] (its text decoded now, or with stop strings
 * the text cut before the one that matched) and frees the slot. */
static int slot_finish(gen_env *e, slot_run *sr, done_rec *dn)
{
    const batch_rec *x = sr->x;
    int rc = x->n_stop ? ft_stop_text_flush(&sr->st, x->stop, x->n_stop) : 0;
    if (!rc && sr->st.hit >= 0) {
        sr->r.stop = GEN_STOP_STRING;
        sr->r.stop_str = sr->st.hit;
    }
    done_rec *d = &dn[sr->rec];
    d->r = sr->r;
    d->r.out_ids = NULL;
    d->r.text = NULL;
    d->seconds = now_s() - sr->t0;
    d->done = 1;
    sr->rec = -1;
    if (!rc) rc = x->n_stop ? ft_stop_text_take(&sr->st, &d->r.text)
                            : ft_tok_decode(e->tok, sr->r.out_ids, sr->r.n_out, 1, &d->r.text);
    ft_stop_text_free(&sr->st);
    return rc;
}

/* Samples slot k's next token from logits (V) with its record's settings and draws, and
 * updates its reply: finished (a stop token, a stop string, or its max new tokens reached) or
 * pending with the token to feed. *fin = 1 when finished. */
static int slot_advance(gen_env *e, slot_run *sr, const float *logits, int *fin)
{
    const batch_rec *x = sr->x;
    int32_t t;
    *fin = 0;
    e->smp.cfg = x->sc; /* checked in slot_start; the sampler derives nothing from it */
    e->smp.rng = sr->rng;
    int rc = ft_sample_next_seen(&e->smp, logits, sr->seen, &t);
    sr->rng = e->smp.rng;
    if (rc) return rc;
    sr->pending = 0;
    if (is_stop(e, t)) {
        sr->r.stop = GEN_STOP_TOKEN;
        *fin = 1;
        return 0;
    }
    ((int32_t *)sr->r.out_ids)[sr->r.n_out++] = t;
    if (sr->seen) ft_sample_seen_add(sr->seen, &t, 1);
    if (x->n_stop) FT_TRY(ft_stop_text_push(&sr->st, x->stop, x->n_stop, t));
    if (sr->st.hit >= 0 || sr->r.n_out >= x->max_new) *fin = 1;
    else sr->next = t, sr->pending = 1;
    return 0;
}

/* Starts record i in slot k: its prompt prefilled into the slot's cache, its first token
 * sampled. */
static int slot_start(gen_env *e, slot_run *sr, int64_t k, const batch_rec *x, int64_t i, int *fin)
{
    memset(&sr->r, 0, sizeof sr->r);
    FT_TRY(ft_sample_cfg_check(&x->sc));
    sr->rec = i;
    sr->x = x;
    sr->r.prompt_ids = x->ids;
    sr->r.n_prompt = x->n;
    sr->r.out_ids = e->out_ids + k * e->max_new;
    sr->t0 = now_s();
    ft_rng_seed(&sr->rng, x->sc.seed); /* as ft_sampler_reseed */
    ft_stop_text_free(&sr->st);
    ft_stop_text_init(&sr->st, e->tok);
    sr->seen = e->seen && x->sc.repetition_penalty != 1 ? &e->seen[k] : NULL;
    if (sr->seen) {
        ft_sample_seen_clear(sr->seen);
        ft_sample_seen_add(sr->seen, x->ids, x->n); /* the prompt's ids are penalised too */
    }
    ft_gen_reset_slot(&e->g, k);
    /* RoPE as a cache sized for this prompt alone would have it (dynamic NTK scaling) */
    int rc = ft_gen_set_rope_len_slot(&e->g, k, x->n + x->max_new);
    float *lg = e->logits + k * e->m->cfg.vocab_size;
    for (int64_t j = 0; !rc && j < x->n; j += e->g.chunk_max) {
        int64_t c = x->n - j < e->g.chunk_max ? x->n - j : e->g.chunk_max;
        rc = ft_gen_forward_slot(&e->g, k, x->ids + j, c, lg, 1);
    }
    sr->r.prefill_s = now_s() - sr->t0;
    return rc ? rc : slot_advance(e, sr, lg, fin);
}

/* Every record of --prompts, one JSON line each, in record order. Up to e.slots records are
 * generated together: each prompt is prefilled alone, then one forward per step decodes the
 * next token of every unfinished one (ft_gen_decode), so each layer's weights are read once
 * per step for all of them; a finished record's slot takes the next record. */
static int run_batch(const gen_opts *o)
{
    batch b = {0};
    out_file of = {0};
    gen_env e;
    memset(&e, 0, sizeof e);
    int tmpl = 0, rc = batch_read(&b, o);
    if (!rc) rc = out_open(&of, o->out);
    if (!rc) rc = env_open(&e, o);
    gen_need nd = {0, 0, 0, 0};
    int64_t n_over = 0, over_len = 0, over_new = 0, n_sampled = 0;
    const int64_t maxpos = e.m ? e.m->cfg.max_position_embeddings : 0;
    for (int64_t i = 0; !rc && i < b.n; i++) {
        batch_rec *x = &b.r[i];
        rc = ft_gen_req_ids(e.tok, o->tmpl, &x->q, gen_flags(o), &x->ids, &x->n, &tmpl);
        if (!rc && x->n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        /* the caches hold the longest prompt + reply; a slot's buffer the longest reply */
        if (x->n > nd.max_prompt) nd.max_prompt = x->n;
        if (x->n + x->max_new > nd.ctx) nd.ctx = x->n + x->max_new;
        if (x->max_new > nd.max_new) nd.max_new = x->max_new;
        nd.seen |= x->sc.repetition_penalty != 1;
        n_sampled += x->sc.temperature > 0 && !(x->q.params.set & FT_GEN_SET_SEED);
        if (maxpos > 0 && x->n + x->max_new > maxpos) {
            if (!n_over++ || x->n + x->max_new > over_len + over_new) {
                over_len = x->n;
                over_new = x->max_new;
            }
        }
    }
    if (!rc && n_over) {
        char what[96];
        snprintf(what, sizeof what, "%lld of %lld records, the longest with ", (long long)n_over,
                 (long long)b.n);
        warn_context(&e, over_len, over_new, what);
    }
    /* the seed the records' own derive from (unless they set theirs) */
    if (!rc && n_sampled) fprintf(stderr, "ftune: seed %lld\n", (long long)o->seed);
    if (!rc) warn_no_think(o, e.tok, tmpl);
    if (!rc) rc = env_plan(&e, o, &nd, tmpl, o->batch < b.n ? o->batch : b.n);
    if (!rc)
        fprintf(stderr, "ftune: %lld prompts from %s (template %s, %lld at a time, KV cache of %lld "
                "tokens each)\n", (long long)b.n, o->prompts, o->raw ? "raw" : ft_chat_template_name(tmpl),
                (long long)e.slots, (long long)e.g.ctx_max);
    const int64_t V = e.m ? e.m->cfg.vocab_size : 0;
    slot_run *sl = calloc((size_t)(e.slots > 0 ? e.slots : 1), sizeof *sl);
    done_rec *dn = calloc((size_t)(b.n > 0 ? b.n : 1), sizeof *dn);
    int64_t *act = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *act);
    int32_t *tok = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *tok);
    if (!rc && (!sl || !dn || !act || !tok)) rc = ft_err(-ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < e.slots; k++) sl[k].rec = -1;
    int64_t next = 0, emitted = 0, total_new = 0, steps = 0;
    double t_all = now_s();
    while (!rc && emitted < b.n) {
        /* free slots take the next records; a record may finish at its first token */
        for (int64_t k = 0; !rc && k < e.slots; k++) {
            while (!rc && sl[k].rec < 0 && next < b.n) {
                int fin = 0;
                rc = slot_start(&e, &sl[k], k, &b.r[next], next, &fin);
                if (!rc && fin) rc = slot_finish(&e, &sl[k], dn);
                if (rc) ft_err_prefix(rc, "%s", b.r[next].where);
                next++;
            }
        }
        /* one decode step of every pending sequence */
        int64_t n = 0;
        for (int64_t k = 0; !rc && k < e.slots; k++)
            if (sl[k].rec >= 0 && sl[k].pending) {
                act[n] = k;
                tok[n++] = sl[k].next;
            }
        if (!rc && n) {
            double t0 = now_s();
            rc = ft_gen_decode(&e.g, act, tok, n, e.logits);
            double dt = now_s() - t0;
            steps++;
            if (rc && n == 1) ft_err_prefix(rc, "%s", b.r[sl[act[0]].rec].where);
            else if (rc) ft_err_prefix(rc, "decoding %lld prompts together", (long long)n);
            for (int64_t i = 0; !rc && i < n; i++) {
                slot_run *sr = &sl[act[i]];
                const int64_t rec = sr->rec;
                int fin = 0;
                sr->r.n_decode++;
                sr->r.decode_s += dt;
                rc = slot_advance(&e, sr, e.logits + i * V, &fin);
                if (!rc && fin) rc = slot_finish(&e, sr, dn);
                if (rc) ft_err_prefix(rc, "%s", b.r[rec].where);
            }
        }
        /* the finished records, in order */
        while (!rc && emitted < b.n && dn[emitted].done) {
            done_rec *d = &dn[emitted];
            batch_rec *x = &b.r[emitted];
            rc = put_line(of.f ? of.f : stdout, o, emitted, x, &d->r, d->seconds);
            if (rc) {
                ft_err_prefix(rc, "%s", x->where);
            } else {
                total_new += d->r.n_out;
                fprintf(stderr, "ftune: [%lld/%lld] %lld prompt + %lld new tokens in %.3f s; stop: %s\n",
                        (long long)(emitted + 1), (long long)b.n, (long long)d->r.n_prompt,
                        (long long)d->r.n_out, d->seconds, stop_said(&d->r));
            }
            free(d->r.text);
            d->r.text = NULL;
            emitted++;
        }
        if (!rc && !n && emitted < b.n && next >= b.n) /* cannot happen: every record finishes */
            rc = ft_err(FT_E_INVALID, "generate: %lld records left unfinished", (long long)(b.n - emitted));
    }
    if (!rc) {
        double t = now_s() - t_all;
        fprintf(stderr, "ftune: %lld prompts, %lld new tokens in %.3f s (%.2f tok/s; %lld decode "
                "steps)%s%s\n", (long long)b.n, (long long)total_new, t, t > 0 ? total_new / t : 0.0,
                (long long)steps, o->out ? "; wrote " : "", o->out ? o->out : "");
    }
    for (int64_t k = 0; sl && k < e.slots; k++) ft_stop_text_free(&sl[k].st); /* a run that fails */
    free(sl);
    for (int64_t i = emitted; dn && i < b.n; i++) free(dn[i].r.text); /* held when a run fails */
    free(dn);
    free(act);
    free(tok);
    int rc2 = out_close(&of, o->out, !rc);
    if (!rc) rc = rc2;
    env_close(&e);
    batch_free(&b);
    return rc;
}

/* `ftune generate` with the options in *o (zeroed; its --stop list is the caller's to free). */
static int generate_cmd(gen_opts *o, int argc, char **argv)
{
    o->tmpl = FT_CHAT_AUTO;
    o->max_new = 256;
    o->seed = -1;
    o->top_p = 1.0f;
    o->rep_penalty = 1.0f;
    const ft_opt opts[] = {
        {"model", FT_OPT_STR, &o->model, "model folder or .gguf", 0, "PATH"},
        {"adapter", FT_OPT_STR, &o->adapter, "PEFT adapter folder to apply", 0, "DIR"},
        {"prompt", FT_OPT_STR, &o->prompt, "the user message (the whole text with --raw)", 0, "S"},
        {"prompts", FT_OPT_STR, &o->prompts, "instead of --prompt: a JSONL file or JSON array of strings, "
         "{prompt, system?}, or any conversational record --data reads (messages, sharegpt, alpaca, "
         "prompt/completion lists; a final assistant turn or \"output\": the \"reference\"); an object record "
         "may set its own max_new_tokens (or max_tokens), temperature, top_p, top_k, min_p, "
         "repetition_penalty, stop (a string or a list) and seed, each replacing the flag for that "
         "record; one JSON line each: {index, prompt, reply, reference?, prompt_tokens, "
         "new_tokens, stop, stop_reason?, seconds, seed?}", 0, "FILE"},
        {"out", FT_OPT_STR, &o->out, "with --prompts: write the JSON lines to FILE (renamed into place "
         "when complete) instead of stdout", 0, "FILE"},
        {"system", FT_OPT_STR, &o->system, "a system message before it (with --prompts: for records without one)", 0, "S"},
        {"raw", FT_OPT_FLAG, &o->raw, "no chat template: encode --prompt (or a --prompts record: a string or {prompt}) as is (with BOS)"},
        {"chat-template", FT_OPT_FN, &o->tmpl, "llama3|llama3.1|chatml|qwen3|llama2|mistral|zephyr|alpaca|jinja (default: from the tokenizer; jinja: its own template, rendered as transformers does)", opt_template, "NAME"},
        {"no-think", FT_OPT_FLAG, &o->no_think, "qwen3: answer without thinking (the template's enable_thinking=False: "
         "the prompt ends with an empty <think></think> block)"},
        {"max-new-tokens", FT_OPT_INT, &o->max_new, "most tokens to generate (default 256)"},
        {"temperature", FT_OPT_FLOAT, &o->temperature, "0: greedy (default); > 0: sample"},
        {"top-k", FT_OPT_INT, &o->top_k, "sample among the k most likely tokens (0: off)"},
        {"top-p", FT_OPT_FLOAT, &o->top_p, "nucleus sampling mass (1: off)"},
        {"min-p", FT_OPT_FLOAT, &o->min_p, "with --temperature > 0: keep the tokens whose probability is at least X "
         "times the most likely one's, after top-k and top-p (transformers' min_p; 0: off, the default)", 0, "X"},
        {"repetition-penalty", FT_OPT_FLOAT, &o->rep_penalty, "divide the logit of every token already in the "
         "prompt or the reply by X (a negative logit: multiply), before sampling or the greedy choice "
         "(transformers' repetition_penalty, CTRL; 1: off, the default; > 1 discourages repeats)", 0, "X"},
        {"stop", FT_OPT_LIST, &o->stop, "end the reply where its text contains STR, the text cut before it "
         "(\"stop\": \"stop_string\", \"stop_reason\": STR); repeat it for up to 16; in --config a string "
         "or a list", 0, "STR"},
        {"batch", FT_OPT_INT, &o->batch, "with --prompts: generate up to N records together, one forward per "
         "token step for all of them (each layer's weights read once per step; 1: one record after "
         "the other; default 8, on a GPU fewer when their KV caches would take more than a quarter "
         "of the budget). A record's logits may differ from --batch 1's in the last bits where "
         "fp32 or bf16 GEMMs sum N rows (not the CPU's in-place NF4 products)", 0, "N"},
        {"seed", FT_OPT_INT, &o->seed, "sampling seed (default: from the clock, printed); --prompts record i "
         "uses seed XOR (splitmix64 output i mod 2^53), record 0 the seed itself"},
        {"json", FT_OPT_FLAG, &o->json, "print one JSON object (ids, text, timings), no streaming"},
        {"threads", FT_OPT_INT, &o->threads, "CPU threads"},
        {"device", FT_OPT_STR, &o->device, FT_DEVICE_HELP, 0, "DEV"},
        {"quant", FT_OPT_STR, &o->quant, "base linear weights: bf16 (default: the model's weights unquantized; on a GPU streamed from its bf16 pack, as in training, when its layers do not all fit --gpu-mem) | nf4 (the base a QLoRA adapter was trained on, as `ftune train --quant nf4`: the NF4 pack, built or reused under --cache-dir, with the run's --quant-correction; no fp32 copy of the model in memory; on a GPU placed within --gpu-mem as training places it)", 0, "TYPE"},
        {"gpu-mem", FT_OPT_FN, &o->gpu_mem, FT_GPU_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"host-mem", FT_OPT_FN, &o->host_mem, FT_HOST_MEM_HELP, ft_opt_bytes, "SIZE"},
        {"cache-dir", FT_OPT_STR, &o->cache_dir, FT_CACHE_DIR_HELP, 0, "DIR"},
        {NULL},
    };
    char err[1024];
    int rc = ft_args_parse(opts, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) { fprintf(stderr, "ftune: %s\n", err); return 2; }
    if (ft_session_bad_quant(o->quant)) return 2;
    if (!o->model || !o->prompt == !o->prompts) {
        fprintf(stderr, "ftune: generate needs --model and one of --prompt or --prompts (see ftune "
                "generate --help)\n");
        return 2;
    }
    char model_buf[4096], adapter_buf[4096];
    if (ft_session_model_path(&o->model, model_buf, sizeof model_buf, 0) ||
        ft_session_hub_path(&o->adapter, adapter_buf, sizeof adapter_buf, 0, "adapter"))
        return 1;
    if (o->prompts && o->json) {
        fprintf(stderr, "ftune: generate: --json is for --prompt; --prompts always writes JSON lines\n");
        return 2;
    }
    if (o->no_think && o->raw) {
        fprintf(stderr, "ftune: generate: --no-think changes the chat template's prompt; --raw has none\n");
        return 2;
    }
    if (o->out && !o->prompts) {
        fprintf(stderr, "ftune: generate: --out goes with --prompts\n");
        return 2;
    }
    if (o->batch && !o->prompts) {
        fprintf(stderr, "ftune: generate: --batch goes with --prompts\n");
        return 2;
    }
    if (o->batch < 0 || o->batch > FT_GEN_MAX_SLOTS) {
        fprintf(stderr, "ftune: generate: --batch %lld: expected 1..%d\n", (long long)o->batch,
                FT_GEN_MAX_SLOTS);
        return 2;
    }
    o->batch_set = o->batch > 0;
    if (!o->batch) o->batch = GEN_BATCH_DEFAULT;
    if (o->max_new < 1 || o->max_new > FT_GEN_MAX_NEW_TOKENS || o->top_k < 0 || !(o->temperature >= 0) ||
        !(o->top_p > 0 && o->top_p <= 1)) {
        fprintf(stderr, "ftune: generate: --max-new-tokens must be 1..1000000, --top-k >= 0, "
                "--temperature >= 0, 0 < --top-p <= 1\n");
        return 2;
    }
    if (!(o->rep_penalty > 0) || !isfinite(o->rep_penalty)) {
        fprintf(stderr, "ftune: generate: --repetition-penalty %g: expected a finite value > 0 (1: off)\n",
                (double)o->rep_penalty);
        return 2;
    }
    if (!(o->min_p >= 0 && o->min_p <= 1)) {
        fprintf(stderr, "ftune: generate: --min-p %g: expected 0 <= --min-p <= 1 (0: off)\n", (double)o->min_p);
        return 2;
    }
    if (o->stop.n > FT_GEN_MAX_STOP_STR) {
        fprintf(stderr, "ftune: generate: %lld --stop strings: at most %d\n", (long long)o->stop.n,
                FT_GEN_MAX_STOP_STR);
        return 2;
    }
    for (int64_t i = 0; i < o->stop.n; i++)
        if (!o->stop.v[i][0]) { /* args.c refuses them already; an empty one would match at once */
            fprintf(stderr, "ftune: generate: --stop: expected a non-empty string\n");
            return 2;
        }
    if (o->seed < 0) /* 53 bits: exact in the JSON number */
        o->seed = (int64_t)((((uint64_t)time(NULL) * 1000003u) ^ (uint64_t)getpid()) & ((1ull << 53) - 1));

    rc = o->prompts ? run_batch(o) : run_one(o);
    if (rc) fprintf(stderr, "ftune: %s\n", ft_errmsg());
    return rc ? 1 : 0;
}

int ft_cmd_generate(int argc, char **argv)
{
    gen_opts o = {0};
    int rc = generate_cmd(&o, argc, argv);
    ft_str_list_free(&o.stop);
    return rc;
}
