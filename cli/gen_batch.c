/* gen_batch.c - `ftune generate --prompts FILE`: every record of FILE answered in one process,
 * up to --batch replies decoded together, each in its own KV cache slot, one JSON line per
 * record in record order (see cmd_generate.c's header for the format; the lines are written by
 * gen_choices.c).
 *
 * A file of OpenAI batch requests (ft_gen_req_parse: {"custom_id", "method": "POST", "url":
 * "/v1/chat/completions" | "/v1/completions", "body"}, the input of OpenAI's Batch API and of
 * vLLM's `python -m vllm.entrypoints.openai.run_batch`) is answered with the Batch API's output
 * lines (openapi.yaml BatchRequestOutput; vLLM run_batch.py BatchRequestOutput /
 * BatchResponseData), in input order:
 *   {"id": "batch_req_H", "custom_id": S, "response": {"status_code": 200, "request_id":
 *    "req_H", "body": B}, "error": null}
 * B a chat.completion ({"id": "chatcmpl-H", "object": "chat.completion", "created", "model",
 * "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "logprobs":
 * null, "finish_reason", "stop_reason"}, ...], "usage"}) or a text_completion ("cmpl-H",
 * "text_completion", choices[i].text). "choices": one per "n" (default 1, up to 16), "index"
 * 0..n-1, each a reply of its own (vLLM's parallel sampling: n sequences of one prompt) with
 * its own text, finish_reason, stop_reason and logprobs; choice 0 samples with the seed a
 * one-choice request samples with, choice c with gen_choice_seed(that seed, c) (gen_choices.h),
 * so with a temperature of 0 every choice is the same greedy reply. "logprobs" is null unless
 * the request asks for them (chat "logprobs": true, completions "logprobs": k) or --logprobs
 * is given: then OpenAI's shape for the endpoint (gen_env.h gen_logprobs_json). "model": the
 * --model value as given (a hub id, not its snapshot path); "created": the Unix time the line
 * was written; H: 16 hex digits hashed from custom_id (FNV-1a 64, then splitmix64's
 * finalizer), so two runs with the same seed write the same file but for "created" (OpenAI's
 * and vLLM's ids are random). "finish_reason": "stop" (a stop token or a stop string) or
 * "length"; "stop_reason" as vLLM's choice has it (vllm/v1/core/sched/utils.py check_stop):
 * null for the tokenizer's EOS and for "length", the token id for another stop token (a
 * "stop_token_ids" entry, the config's other eos ids, the template's end of turn), the string
 * for a stop string. A stop token's text is not part of the reply (slot_advance).
 * "usage": prompt_tokens (once, whatever n), completion_tokens (the tokens generated, summed
 * over the choices, each choice's stop token included as vLLM counts it, its output token_ids
 * ending with the EOS (vllm-project/vllm#28185): new_tokens + 1 when a stop token ended the
 * reply), total_tokens.
 * Prompt log-probabilities (vLLM's prompt_logprobs; gen_prompt_lp.h for the shapes): a request's
 * "prompt_logprobs": k (or --prompt-logprobs k for those that leave it out; with "echo" the
 * request's logprobs, as vLLM takes them) gives, for the prompt as ftune feeds it (chat template
 * applied, BOS included), each token's log-probability given the tokens before it with its rank
 * and the k most likely tokens at its place: in each completions choice's "prompt_logprobs"
 * (the same for every choice), once in a chat body's. The record's prompt is then prefilled
 * alone, in forwards of up to GEN_PLP_ROWS tokens returning all their rows of logits
 * (ft_gen_prompt_logprobs), once per record: its other choices copy that cache. A completions
 * request's "echo": true puts the prompt text before the reply's, and the prompt tokens' entries
 * before the reply's in its logprobs (the first token's log-probability and alternatives null,
 * text_offset running on through the reply); with "max_tokens": 0 nothing is generated: the text
 * is the prompt, finish_reason "length", completion_tokens 0 (vLLM's CompletionRequest.
 * to_sampling_params, mid-2025, still samples one token there, which the response does not show
 * but counts in usage, finish_reason "length" unless it is a stop token). A chat request's "echo"
 * changes no text (vLLM repeats a final message of the reply's role, which ftune refuses) but, as
 * vLLM's, asks for the prompt log-probabilities with top_logprobs (0 without it) alternatives.
 * A file mixing batch requests and plain records, a repeated custom_id, are refused. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/gen_choices.h"
#include "cli/gen_env.h"
#include "cli/gen_prompt_lp.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/template/chat.h"
#include "src/data/records.h"

/* ---- --prompts FILE ------------------------------------------------------------------------ */

typedef struct batch {
    batch_rec *r;
    int64_t n, cap;
    int api;                    /* FT_GEN_API_NONE: plain records; else OpenAI batch requests */
    int64_t n_choices;          /* the replies to generate: one per choice of each record */
    char path[4200];            /* the file as messages name it ("<stdin>" for -) */
} batch;

static void batch_free(batch *b)
{
    for (int64_t i = 0; i < b->n; i++) {
        ft_gen_req_free(&b->r[i].q);
        free(b->r[i].ids);
        ft_gen_plp_free(&b->r[i].plp);
    }
    free(b->r);
    memset(b, 0, sizeof *b);
}

/* Record i's settings (x->sc, max_new, stop, stop ids, min_tokens, choices): the command
 * line's, with the record's own. */
static void rec_settings(batch_rec *x, const gen_opts *o, int64_t i)
{
    const ft_gen_params *p = &x->q.params;
    const unsigned set = p->set;
    x->sc = (ft_sample_cfg){o->temperature, o->top_k, o->top_p, ft_gen_record_seed((uint64_t)o->seed, i),
                            o->rep_penalty, o->min_p, o->presence_penalty, o->frequency_penalty};
    if (set & FT_GEN_SET_TEMPERATURE) x->sc.temperature = p->temperature;
    if (set & FT_GEN_SET_TOP_K) x->sc.top_k = p->top_k;
    if (set & FT_GEN_SET_TOP_P) x->sc.top_p = p->top_p;
    if (set & FT_GEN_SET_MIN_P) x->sc.min_p = p->min_p;
    if (set & FT_GEN_SET_REP_PENALTY) x->sc.repetition_penalty = p->repetition_penalty;
    if (set & FT_GEN_SET_SEED) x->sc.seed = p->seed;
    if (set & FT_GEN_SET_PRESENCE) x->sc.presence_penalty = p->presence_penalty;
    if (set & FT_GEN_SET_FREQUENCY) x->sc.frequency_penalty = p->frequency_penalty;
    x->max_new = set & FT_GEN_SET_MAX_NEW ? p->max_new_tokens : o->max_new;
    x->stop = set & FT_GEN_SET_STOP ? (const char *const *)p->stop : o->stop.v;
    x->n_stop = set & FT_GEN_SET_STOP ? p->n_stop : o->stop.n;
    x->lp_top = !(set & FT_GEN_SET_LOGPROBS) ? o->logprobs : p->logprobs ? p->top_logprobs : -1;
    x->stop_ids = set & FT_GEN_SET_STOP_IDS ? p->stop_ids : o->stop_ids.v;
    x->n_stop_ids = set & FT_GEN_SET_STOP_IDS ? p->n_stop_ids : o->stop_ids.n;
    x->min_tokens = set & FT_GEN_SET_MIN_TOKENS ? p->min_tokens : 0;
    x->n_choices = set & FT_GEN_SET_N ? p->n : 1;
    x->bias_ids = p->bias_ids;
    x->bias = p->bias;
    x->n_bias = p->n_bias;
    x->ignore_eos = p->ignore_eos;
    x->echo = x->q.api == FT_GEN_API_COMPLETIONS && p->echo;
    x->plp_k = gen_plp_alternatives(p, x->q.api, o->prompt_logprobs, x->lp_top);
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
        if (rs.is_array) snprintf(x->at, sizeof x->at, "record %lld", (long long)rec.loc + 1);
        else snprintf(x->at, sizeof x->at, "line %lld", (long long)rec.loc);
        rc = ft_gen_req_parse(&x->q, rec.json, o->system, o->raw);
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        b->n++;
        if (b->n == 1) b->api = x->q.api;
        if ((x->q.api != FT_GEN_API_NONE) != (b->api != FT_GEN_API_NONE)) {
            rc = ft_err(FT_E_INVALID, "%s: %s in a file of %s (%s is one): a prompts file holds "
                        "one kind or the other", x->where,
                        b->api ? "a plain record" : "an OpenAI batch request (it has \"body\")",
                        b->api ? "OpenAI batch requests" : "plain records", b->r[0].at);
            break;
        }
        rec_settings(x, o, b->n - 1);
        if (x->min_tokens > x->max_new) { /* vLLM's SamplingParams refuses it too */
            rc = ft_err(FT_E_INVALID, "%s: 'min_tokens' %lld is more than the reply's max new "
                        "tokens (%lld)", x->where, (long long)x->min_tokens, (long long)x->max_new);
            break;
        }
        x->first = b->n_choices;
        b->n_choices += x->n_choices;
    }
    snprintf(b->path, sizeof b->path, "%s", rs.path ? rs.path : o->prompts);
    if (!rc && k < 0) rc = k;
    if (!rc && b->n == 0)
        rc = ft_err(FT_E_INVALID, "%s: no records (expected JSONL or a JSON array of prompts)",
                    o->prompts);
    ft_records_close(&rs);
    return rc;
}

/* A record's custom_id and position (batch_unique_ids). */
typedef struct id_at {
    const char *id;
    int64_t i;
} id_at;

static int cmp_id_at(const void *pa, const void *pb)
{
    const id_at *a = pa, *b = pb;
    int c = strcmp(a->id, b->id);
    return c ? c : (a->i > b->i) - (a->i < b->i);
}

/* OpenAI's Batch API and vLLM's run_batch require each custom_id once in a file: the first
 * record (in file order) that repeats one is refused, naming the first that has it. */
static int batch_unique_ids(const batch *b)
{
    if (b->api == FT_GEN_API_NONE || b->n < 2) return 0;
    id_at *v = malloc((size_t)b->n * sizeof *v);
    if (!v) return ft_err(-ENOMEM, "out of memory");
    for (int64_t i = 0; i < b->n; i++) v[i] = (id_at){b->r[i].q.custom_id, i};
    qsort(v, (size_t)b->n, sizeof *v, cmp_id_at);
    int64_t first = -1, later = -1;
    for (int64_t i = 1, run = 0; i < b->n; i++) {
        if (strcmp(v[i - 1].id, v[i].id)) {
            run = i; /* v[run]: the first holder of this id */
            continue;
        }
        if (later < 0 || v[i].i < later) {
            first = v[run].i;
            later = v[i].i;
        }
    }
    free(v);
    if (later < 0) return 0;
    return ft_err(FT_E_INVALID, "%s: custom_id \"%s\" is also that of %s: the custom_ids of a batch "
                  "file must be unique (OpenAI's and vLLM's rule)", b->r[later].where,
                  b->r[later].q.custom_id, b->r[first].at);
}

/* One unknown key of one record (warn_unknown_keys). */
typedef struct key_seen {
    const char *key, *hint;
    int64_t rec, pos;
} key_seen;

static int cmp_key_seen(const void *pa, const void *pb)
{
    const key_seen *a = pa, *b = pb;
    int c = strcmp(a->key, b->key);
    if (c) return c;
    if (a->rec != b->rec) return a->rec < b->rec ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

static int cmp_key_first(const void *pa, const void *pb)
{
    const key_seen *a = pa, *b = pb;
    if (a->rec != b->rec) return a->rec < b->rec ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Most distinct unknown keys named by warn_unknown_keys (the rest are counted). */
#define WARN_KEYS_MAX 8

/* The keys of the records that ft_gen_req_parse ignores (q.unknown): one stderr warning per
 * distinct key, in the order they first appear, naming where; a key within edit distance 2
 * of one ftune reads gets "did you mean". Records often carry ids and metadata: a warning,
 * not an error. */
static void warn_unknown_keys(const batch *b)
{
    int64_t n = 0;
    for (int64_t i = 0; i < b->n; i++) n += b->r[i].q.n_unknown;
    if (!n) return;
    key_seen *k = malloc((size_t)n * sizeof *k);
    if (!k) return; /* only a warning */
    n = 0;
    for (int64_t i = 0; i < b->n; i++)
        for (int64_t j = 0; j < b->r[i].q.n_unknown; j++)
            k[n++] = (key_seen){b->r[i].q.unknown[j], b->r[i].q.unknown_hint[j], i, j};
    qsort(k, (size_t)n, sizeof *k, cmp_key_seen);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (!m || strcmp(k[m - 1].key, k[i].key)) k[m++] = k[i];
    qsort(k, (size_t)m, sizeof *k, cmp_key_first);
    for (int64_t i = 0; i < m && i < WARN_KEYS_MAX; i++) {
        fprintf(stderr, "ftune: warning: %s: key \"%s\" (first on %s) is not a record field or "
                "setting ftune reads: ignored", b->path, k[i].key, b->r[k[i].rec].at);
        if (k[i].hint) fprintf(stderr, "; did you mean \"%s%s\"?", strncmp(k[i].key, "body.", 5) ? "" : "body.", k[i].hint);
        fputc('\n', stderr);
    }
    if (m > WARN_KEYS_MAX)
        fprintf(stderr, "ftune: warning: %s: %lld more keys that ftune does not read: ignored\n",
                b->path, (long long)(m - WARN_KEYS_MAX));
    free(k);
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

/* A sequence being generated in one of the env's slots (--prompts with --batch): one choice
 * (reply) of a record. */
typedef struct slot_run {
    int64_t rec;                /* the record, -1: the slot is free */
    int64_t choice;             /* which of its choices (0..n_choices - 1) */
    const batch_rec *x;         /* its prompt and settings */
    gen_result r;
    ft_rng rng;                 /* the choice's sampling state (seeded with gen_choice_seed) */
    int32_t next;               /* the sampled token to feed, when pending */
    int pending;                /* 1: `next` needs a decode forward */
    double t0;
    ft_stop_text st;            /* the reply's text, with stop strings */
    ft_sample_seen *seen;       /* the slot's ids (env's seen[k]), with a repetition penalty */
    ft_sample_counts cnt;       /* the reply's ids counted, for presence / frequency penalties
                                 * (allocated when a record of the slot first has one) */
    int use_cnt;                /* 1: the record has one */
    int32_t stop_tok;           /* the stop token that ended the reply (GEN_STOP_TOKEN) */
} slot_run;

/* Records slot sr's finished reply in dn[its record's first choice + its choice] (its text
 * decoded now, or with stop strings the text cut before the one that matched, as its tokens
 * are in the slot's buffer, which the next reply takes) and frees the slot. */
static int slot_finish(gen_env *e, slot_run *sr, gen_choice *dn)
{
    const batch_rec *x = sr->x;
    /* below min_tokens no stop string is searched (slot_advance) */
    const int64_t n_stop = sr->r.n_out > x->min_tokens ? x->n_stop : 0;
    int rc = x->n_stop ? ft_stop_text_flush(&sr->st, x->stop, n_stop) : 0;
    if (!rc && sr->st.hit >= 0) {
        sr->r.stop = GEN_STOP_STRING;
        sr->r.stop_str = sr->st.hit;
    }
    gen_choice *d = &dn[x->first + sr->choice];
    d->r = sr->r;
    d->r.out_ids = NULL;
    d->r.text = NULL;
    d->r.lp = NULL;
    d->r.lp_ids = NULL;
    d->seconds = gen_now_s() - sr->t0;
    d->stop_tok = sr->stop_tok;
    d->done = 1;
    sr->rec = -1;
    if (!rc) rc = x->n_stop ? ft_stop_text_take(&sr->st, &d->r.text)
                            : ft_tok_decode(e->tok, sr->r.out_ids, sr->r.n_out, 1, &d->r.text);
    if (!rc && sr->r.lp) rc = gen_logprobs_json(e->tok, &sr->r, x->q.api, &d->lp);
    ft_stop_text_free(&sr->st);
    return rc;
}

/* Most stop tokens min_tokens masks: the env's and a record's. */
#define MASK_MAX (MAX_STOP + FT_GEN_MAX_STOP_IDS)

/* The stop tokens that min_tokens masks: the env's (EOS, end of turn; those outside the
 * logits, which cannot be drawn, left out) and x's stop token ids (checked against the
 * vocabulary), into ids[] (MASK_MAX); returns how many. */
static int stop_set(const gen_env *e, const batch_rec *x, int32_t *ids)
{
    int n = 0;
    for (int s = 0; s < e->n_stop; s++)
        if (e->stop[s] < e->smp.V) ids[n++] = e->stop[s];
    for (int64_t s = 0; s < x->n_stop_ids; s++) ids[n++] = x->stop_ids[s];
    return n;
}

/* Samples slot sr's next token from logits (V) with its record's settings and the choice's
 * draws, and updates its reply: finished (a stop token, a stop string, or its max new tokens
 * reached) or pending with the token to feed. *fin = 1 when finished.
 * A stop token is the env's (EOS, the template's end of turn) or one of the record's stop
 * token ids: it ends the reply, finish_reason "stop", and is no part of its ids, text or
 * log-probabilities. vLLM leaves its text out the same way (vllm/v1/engine/detokenizer.py
 * update(): a stop-terminated step skips the last token's detokenization unless
 * include_stop_str_in_output, which ftune refuses), while counting it in token_ids (usage).
 * Below the record's min_tokens the stop tokens cannot be drawn (their logits -inf during the
 * draw, as vLLM's MinTokensLogitsProcessor masks them; the log-probabilities are those of the
 * unmasked logits, as vLLM computes raw_logprobs before its logits processors) and no stop
 * string is searched in the text of the first min_tokens tokens (vLLM's detokenizer moves its
 * stop_check_offset past it; a string that ends after it may begin inside it).
 * The record's logit_bias is added to the logits for the draw (before the penalties and the
 * min_tokens mask, as vLLM's LogitBiasLogitsProcessor runs before its penalties), its
 * log-probabilities again those of the raw logits; with ignore_eos only the record's stop
 * token ids end the reply (vLLM's check_stop skips the EOS, and update_from_generation_config
 * adds no other EOS ids then), the env's stop tokens being part of it like any other. */
static int slot_advance(gen_env *e, slot_run *sr, float *logits, int *fin)
{
    const batch_rec *x = sr->x;
    int32_t t;
    *fin = 0;
    if (x->max_new == 0) { /* echo with max_tokens 0: the prompt alone, "length" */
        *fin = 1;
        return 0;
    }
    e->smp.cfg = x->sc; /* checked in slot_begin; the sampler derives nothing from it */
    e->smp.rng = sr->rng;
    int32_t ms[MASK_MAX];
    float saved[MASK_MAX], bsaved[FT_GEN_MAX_LOGIT_BIAS];
    for (int64_t s = 0; s < x->n_bias; s++) { /* distinct ids */
        bsaved[s] = logits[x->bias_ids[s]];
        logits[x->bias_ids[s]] += x->bias[s];
    }
    const int masked = sr->r.n_out < x->min_tokens ? stop_set(e, x, ms) : 0;
    for (int s = 0; s < masked; s++) {
        saved[s] = logits[ms[s]];
        logits[ms[s]] = -INFINITY;
    }
    int rc = ft_sample_next_pen(&e->smp, logits, sr->seen, sr->use_cnt ? &sr->cnt : NULL, &t);
    /* put back in reverse order: an id listed twice ends with its own value */
    for (int s = masked - 1; s >= 0; s--) logits[ms[s]] = saved[s];
    for (int64_t s = 0; s < x->n_bias; s++) logits[x->bias_ids[s]] = bsaved[s];
    sr->rng = e->smp.rng;
    if (rc) return rc;
    sr->pending = 0;
    if ((!x->ignore_eos && gen_is_stop(e, t)) || gen_id_listed(x->stop_ids, x->n_stop_ids, t)) {
        sr->r.stop = GEN_STOP_TOKEN;
        sr->stop_tok = t;
        *fin = 1;
        return 0;
    }
    FT_TRY(gen_lp_note(e, &sr->r, logits, t)); /* the sampler leaves the logits as they are */
    ((int32_t *)sr->r.out_ids)[sr->r.n_out++] = t;
    if (sr->seen) ft_sample_seen_add(sr->seen, &t, 1);
    if (sr->use_cnt) ft_sample_counts_add(&sr->cnt, &t, 1);
    if (x->n_stop)
        FT_TRY(ft_stop_text_push(&sr->st, x->stop, sr->r.n_out > x->min_tokens ? x->n_stop : 0, t));
    if (sr->st.hit >= 0 || sr->r.n_out >= x->max_new) *fin = 1;
    else sr->next = t, sr->pending = 1;
    return 0;
}

/* Sets slot k up for choice c of record i (its settings, the choice's draws, stop text,
 * penalties), its cache emptied and its RoPE table that of a cache sized for this prompt alone
 * (dynamic NTK scaling): slots_prefill then prefills it. Each choice is a sequence of its own;
 * the choices of a record that start together share one prefill (slots_prefill copies the
 * first one's cache to the others), and the prompts that start together are prefilled in one
 * forward. */
static int slot_begin(gen_env *e, slot_run *sr, int64_t k, const batch_rec *x, int64_t i, int64_t c)
{
    memset(&sr->r, 0, sizeof sr->r);
    FT_TRY(ft_sample_cfg_check(&x->sc));
    sr->rec = i;
    sr->choice = c;
    sr->x = x;
    sr->r.prompt_ids = x->ids;
    sr->r.n_prompt = x->n;
    sr->r.out_ids = e->out_ids + k * e->max_new;
    gen_lp_attach(e, k, x->lp_top, &sr->r); /* slot k's rows of the log-probability buffers */
    sr->t0 = gen_now_s();
    ft_rng_seed(&sr->rng, gen_choice_seed(x->sc.seed, c)); /* as ft_sampler_reseed */
    ft_stop_text_free(&sr->st);
    ft_stop_text_init(&sr->st, e->tok);
    sr->seen = e->seen && x->sc.repetition_penalty != 1 ? &e->seen[k] : NULL;
    if (sr->seen) {
        ft_sample_seen_clear(sr->seen);
        ft_sample_seen_add(sr->seen, x->ids, x->n); /* the prompt's ids are penalised too */
    }
    /* OpenAI's penalties count the reply's tokens only */
    sr->use_cnt = x->sc.presence_penalty != 0 || x->sc.frequency_penalty != 0;
    if (sr->use_cnt && !sr->cnt.count) FT_TRY(ft_sample_counts_init(&sr->cnt, e->m->cfg.vocab_size));
    if (sr->cnt.count) ft_sample_counts_clear(&sr->cnt);
    sr->stop_tok = -1;
    ft_gen_reset_slot(&e->g, k);
    return ft_gen_set_rope_len_slot(&e->g, k, x->n + x->max_new);
}

/* The prefill of the slots that start together (slots_prefill). */
typedef struct prefill_buf {
    int64_t *slots, *lens;      /* (e->slots) a group's slots and prompt lengths */
    int64_t *lead, *lk;         /* (e->slots) per begun slot its leader's index (-1: none); the
                                 * leaders' slots */
    int32_t *ids;               /* (chunk_max) its prompts' ids, concatenated */
    int each;                   /* FTUNE_GEN_PREFILL=each: one prompt per forward (as before
                                 * ft_gen_prefill; for comparisons) */
    int64_t forwards, batched;  /* prefill forwards run; prompts prefilled with others */
    int64_t shared;             /* choices whose cache was copied from another choice's */
} prefill_buf;

/* "FILE: line 3, line 4, line 6" for the records of the n slots ks[] (a failed group). */
static void group_where(const batch *b, const slot_run *sl, const int64_t *ks, int64_t n, char *out,
                        size_t cap)
{
    size_t w = (size_t)snprintf(out, cap, "%s: ", b->path);
    for (int64_t j = 0; j < n && w < cap; j++)
        if (!j || sl[ks[j]].rec != sl[ks[j - 1]].rec) /* a record's choices: named once */
            w += (size_t)snprintf(out + w, cap - w, "%s%s", j ? ", " : "", b->r[sl[ks[j]].rec].at);
}

/* 1 when slot sr's record asks for its prompt's log-probabilities and no choice of it has
 * computed them yet (its prefill then computes them: prefill_alone). */
static int wants_plp(const batch *b, const slot_run *sr)
{
    const batch_rec *x = &b->r[sr->rec];
    return x->plp_k >= 0 && !x->plp.lp;
}

/* Prefills slot k's prompt alone: in chunks of the forward's tokens, or, for the record's
 * prompt log-probabilities, in forwards of e->g.logit_rows_max tokens returning all their rows
 * (ft_gen_prompt_logprobs, into the record's plp). e->logits' first row then holds the last
 * prompt row's logits. */
static int prefill_alone(gen_env *e, batch *b, const slot_run *sr, int64_t k, prefill_buf *pb)
{
    batch_rec *x = &b->r[sr->rec];
    if (wants_plp(b, sr)) {
        const int64_t rows = e->g.logit_rows_max;
        pb->forwards += (x->n + rows - 1) / rows;
        return ft_gen_prompt_logprobs(&e->g, k, x->ids, x->n, x->plp_k, rows, e->logits, &x->plp);
    }
    const int64_t cmax = e->g.chunk_max;
    int rc = 0;
    for (int64_t i = 0; !rc && i < x->n; i += cmax) {
        int64_t c = x->n - i < cmax ? x->n - i : cmax;
        rc = ft_gen_forward_slot(&e->g, k, x->ids + i, c, e->logits, 1);
        pb->forwards++;
    }
    return rc;
}

/* Prefills the prompts of the n slots ks[] (begun by slot_begin) and samples each one's first
 * token; a reply that finishes there is recorded in dn and frees its slot. The prompts that
 * fit together within the chunk (and the rows of logits), in slot order, share one forward
 * (ft_gen_prefill: each layer visited once for all of them); a prompt longer than the chunk,
 * or whose log-probabilities its record asks for, is prefilled alone (prefill_alone). Errors
 * are prefixed with the records they concern. */
static int slots_prefill(gen_env *e, slot_run *sl, const int64_t *ks0, int64_t n0, batch *b,
                         gen_choice *dn, prefill_buf *pb)
{
    const int64_t V = e->m->cfg.vocab_size, cmax = e->g.chunk_max;
    const int64_t rmax = pb->each ? 1 : e->g.logit_rows_max;
    /* A choice begun with an earlier choice of its record (ks0[] is in choice order) follows
     * that one, its leader: it is not prefilled, its cache is a copy of the leader's prompt
     * rows (ft_gen_copy_slot) and its first token is drawn from the leader's logits, the same
     * values a prefill of the same prompt gives. ks[]: the leaders, prefilled. */
    int64_t n = 0, *ks = pb->lk;
    for (int64_t i = 0; i < n0; i++) {
        pb->lead[i] = -1;
        for (int64_t q = 0; q < i && pb->lead[i] < 0; q++)
            if (pb->lead[q] < 0 && sl[ks0[q]].rec == sl[ks0[i]].rec) pb->lead[i] = q;
        if (pb->lead[i] < 0) ks[n++] = ks0[i];
    }
    for (int64_t j = 0; j < n;) {
        /* the group: ks[j..j2) */
        int64_t j2 = j, tot = 0;
        if (sl[ks[j]].x->n > cmax || wants_plp(b, &sl[ks[j]])) {
            j2 = j + 1;
        } else {
            while (j2 < n && j2 - j < rmax && sl[ks[j2]].x->n <= cmax - tot &&
                   !wants_plp(b, &sl[ks[j2]])) {
                const batch_rec *x = sl[ks[j2]].x;
                memcpy(pb->ids + tot, x->ids, (size_t)x->n * sizeof(int32_t));
                pb->slots[j2 - j] = ks[j2];
                pb->lens[j2 - j] = x->n;
                tot += x->n;
                j2++;
            }
        }
        const double t0 = gen_now_s();
        int rc = 0;
        if (tot) {
            rc = ft_gen_prefill(&e->g, j2 - j, pb->slots, pb->ids, pb->lens, e->logits);
            pb->forwards++;
            if (j2 - j > 1) pb->batched += j2 - j;
        } else { /* longer than the chunk, or its prompt's log-probabilities: alone */
            rc = prefill_alone(e, b, &sl[ks[j]], ks[j], pb);
        }
        const double dt = gen_now_s() - t0;
        if (rc) {
            char where[600];
            group_where(b, sl, ks + j, j2 - j, where, sizeof where);
            return ft_err_prefix(rc, "%s%s", where, j2 - j > 1 ? " (prompts prefilled together)" : "");
        }
        /* the followers' caches, while the leaders' slots still hold the prompts */
        for (int64_t f = 0; f < n0; f++) {
            if (pb->lead[f] < 0) continue;
            const int64_t lead_slot = ks0[pb->lead[f]];
            int in_group = 0;
            for (int64_t i = j; i < j2; i++) in_group |= ks[i] == lead_slot;
            if (!in_group) continue;
            rc = ft_gen_copy_slot(&e->g, ks0[f], lead_slot, sl[lead_slot].x->n);
            if (rc) return ft_err_prefix(rc, "%s", b->r[sl[ks0[f]].rec].where);
            pb->shared++;
        }
        for (int64_t i = j; i < j2; i++) {
            float *row = e->logits + (i - j) * V; /* slot_advance leaves it as it is */
            for (int64_t f = -1; f < n0; f++) {
                /* the leader (f = -1), then its followers */
                if (f >= 0 && (pb->lead[f] < 0 || ks0[pb->lead[f]] != ks[i])) continue;
                slot_run *sr = &sl[f < 0 ? ks[i] : ks0[f]];
                const int64_t rec = sr->rec;
                int fin = 0;
                sr->r.prefill_s = dt;
                rc = slot_advance(e, sr, row, &fin);
                if (!rc && fin) rc = slot_finish(e, sr, dn);
                if (rc) return ft_err_prefix(rc, "%s", b->r[rec].where);
            }
        }
        j = j2;
    }
    return 0;
}

/* 1 when every choice of record x is done. */
static int rec_done(const batch_rec *x, const gen_choice *dn)
{
    for (int64_t c = 0; c < x->n_choices; c++)
        if (!dn[x->first + c].done) return 0;
    return 1;
}

/* The stderr line of record i, written with its choices d[]; returns their new tokens. */
static int64_t rec_said(const batch *b, int64_t i, const gen_choice *d)
{
    const batch_rec *x = &b->r[i];
    int64_t n_new = 0;
    double s = 0;
    for (int64_t c = 0; c < x->n_choices; c++) {
        n_new += d[c].r.n_out;
        if (d[c].seconds > s) s = d[c].seconds;
    }
    fprintf(stderr, "ftune: [%lld/%lld] %lld prompt + %lld new tokens", (long long)(i + 1),
            (long long)b->n, (long long)x->n, (long long)n_new);
    if (x->n_choices > 1) fprintf(stderr, " (%lld choices)", (long long)x->n_choices);
    fprintf(stderr, " in %.3f s; stop: ", s);
    for (int64_t c = 0; c < x->n_choices; c++)
        fprintf(stderr, "%s%s", c ? ", " : "", gen_stop_said(&d[c].r));
    fputc('\n', stderr);
    return n_new;
}

/* Every record of --prompts, one JSON line each, in record order. Each choice of a record (one,
 * or a batch request's "n") is a reply of its own, and up to e.slots replies are generated
 * together: the prompts that start together (the first e.slots, then those taking the slots
 * of replies that finished in the same step) are prefilled in one forward as far as the chunk
 * allows (slots_prefill), then one forward per step decodes the next token of every
 * unfinished one (ft_gen_decode), so each layer's weights are read once per step for all of
 * them; a finished reply's slot takes the next choice (of the same record or the next one).
 * A record's line is written once all its choices are done and the records before it are
 * written. */
int gen_run_batch(const gen_opts *o)
{
    batch b = {0};
    out_file of = {0};
    gen_env e;
    memset(&e, 0, sizeof e);
    int tmpl = 0, rc = batch_read(&b, o);
    if (!rc) rc = batch_unique_ids(&b);
    if (!rc) warn_unknown_keys(&b);
    if (!rc) rc = out_open(&of, o->out);
    if (!rc) rc = gen_env_open(&e, o);
    gen_need nd = {0, 0, 0, 0, 0, 0};
    int64_t n_over = 0, over_len = 0, over_new = 0, n_sampled = 0, n_raw = 0;
    const int64_t maxpos = e.m ? e.m->cfg.max_position_embeddings : 0;
    for (int64_t i = 0; !rc && i < b.n; i++) {
        batch_rec *x = &b.r[i];
        rc = ft_gen_req_ids(e.tok, o->tmpl, &x->q, gen_flags(o), &x->ids, &x->n, &tmpl);
        if (!rc && x->n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
        if (!rc && (x->q.params.set & FT_GEN_SET_STOP_IDS))
            rc = gen_stop_ids_check(x->stop_ids, x->n_stop_ids, e.m->cfg.vocab_size,
                                x->q.api ? "body: 'stop_token_ids' " : "'stop_token_ids' ");
        if (!rc && x->n_bias)
            rc = gen_stop_ids_check(x->bias_ids, x->n_bias, e.m->cfg.vocab_size,
                                    x->q.api ? "body: 'logit_bias' " : "'logit_bias' ");
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        /* the caches hold the longest prompt + reply; a slot's buffer the longest reply */
        if (x->n > nd.max_prompt) nd.max_prompt = x->n;
        if (x->n + x->max_new > nd.ctx) nd.ctx = x->n + x->max_new;
        if (x->max_new > nd.max_new) nd.max_new = x->max_new;
        nd.seen |= x->sc.repetition_penalty != 1;
        if (x->lp_top >= 0 && 1 + x->lp_top > nd.lp_n) nd.lp_n = 1 + x->lp_top;
        if (x->plp_k >= 0) nd.plp_rows = GEN_PLP_ROWS;
        n_sampled += x->sc.temperature > 0 && !(x->q.params.set & FT_GEN_SET_SEED);
        n_raw += x->q.raw;
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
        gen_warn_context(&e, over_len, over_new, what);
    }
    if (nd.max_new < 1) nd.max_new = 1; /* echo with max_tokens 0 only: no buffer of 0 */
    /* the seed the records' own derive from (unless they set theirs) */
    if (!rc && n_sampled) fprintf(stderr, "ftune: seed %lld\n", (long long)o->seed);
    if (!rc) gen_warn_no_think(o, e.tok, tmpl);
    /* every choice is a sequence of its own: the slots are shared by all of them */
    if (!rc) rc = gen_env_plan(&e, o, &nd, tmpl, o->batch < b.n_choices ? o->batch : b.n_choices);
    char choices[64] = "";
    if (b.n_choices > b.n) snprintf(choices, sizeof choices, ", %lld choices", (long long)b.n_choices);
    if (!rc)
        fprintf(stderr, "ftune: %lld prompts from %s (template %s%s, %lld at a time, KV cache of %lld "
                "tokens each)\n", (long long)b.n, o->prompts, n_raw == b.n ? "raw" : ft_chat_template_name(tmpl),
                choices, (long long)e.slots, (long long)e.g.ctx_max);
    const int64_t V = e.m ? e.m->cfg.vocab_size : 0;
    slot_run *sl = calloc((size_t)(e.slots > 0 ? e.slots : 1), sizeof *sl);
    gen_choice *dn = calloc((size_t)(b.n_choices > 0 ? b.n_choices : 1), sizeof *dn);
    int64_t *act = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *act);
    int32_t *tok = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *tok);
    const char *pv = getenv("FTUNE_GEN_PREFILL");
    const size_t ns = (size_t)(e.slots > 0 ? e.slots : 1);
    prefill_buf pb = {malloc(ns * sizeof(int64_t)), malloc(ns * sizeof(int64_t)),
                      malloc(ns * sizeof(int64_t)), malloc(ns * sizeof(int64_t)),
                      malloc((size_t)(e.g.chunk_max > 0 ? e.g.chunk_max : 1) * sizeof(int32_t)),
                      pv && !strcmp(pv, "each"), 0, 0, 0};
    if (!rc && (!sl || !dn || !act || !tok || !pb.slots || !pb.lens || !pb.ids || !pb.lead || !pb.lk))
        rc = ft_err(-ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < e.slots; k++) sl[k].rec = -1;
    /* next, next_c: the record and choice that the next free slot takes */
    int64_t next = 0, next_c = 0, emitted = 0, total_new = 0, steps = 0;
    double t_all = gen_now_s();
    while (!rc && emitted < b.n) {
        /* free slots take the next choices, their prompts prefilled together; a reply may
         * finish at its first token, and its slot then takes another */
        while (!rc && next < b.n) {
            int64_t m = 0;
            for (int64_t k = 0; !rc && k < e.slots && next < b.n; k++) {
                if (sl[k].rec >= 0) continue;
                rc = slot_begin(&e, &sl[k], k, &b.r[next], next, next_c);
                if (rc) ft_err_prefix(rc, "%s", b.r[next].where);
                if (++next_c == b.r[next].n_choices) {
                    next++;
                    next_c = 0;
                }
                act[m++] = k;
            }
            if (!rc && !m) break;
            if (!rc) rc = slots_prefill(&e, sl, act, m, &b, dn, &pb);
        }
        /* one decode step of every pending sequence */
        int64_t n = 0;
        for (int64_t k = 0; !rc && k < e.slots; k++)
            if (sl[k].rec >= 0 && sl[k].pending) {
                act[n] = k;
                tok[n++] = sl[k].next;
            }
        if (!rc && n) {
            double t0 = gen_now_s();
            rc = ft_gen_decode(&e.g, act, tok, n, e.logits);
            double dt = gen_now_s() - t0;
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
        /* the finished records (all their choices), in order */
        while (!rc && emitted < b.n && rec_done(&b.r[emitted], dn)) {
            batch_rec *x = &b.r[emitted];
            gen_choice *d = dn + x->first;
            rc = gen_put_record(of.f ? of.f : stdout, o, e.tok, emitted, x, d, ft_tok_eos(e.tok));
            if (rc) ft_err_prefix(rc, "%s", x->where);
            else total_new += rec_said(&b, emitted, d);
            for (int64_t c = 0; c < x->n_choices; c++) {
                free(d[c].r.text);
                d[c].r.text = NULL;
            }
            ft_gen_plp_free(&x->plp);
            emitted++;
        }
        if (!rc && !n && emitted < b.n && next >= b.n) /* cannot happen: every record finishes */
            rc = ft_err(FT_E_INVALID, "generate: %lld records left unfinished", (long long)(b.n - emitted));
    }
    if (!rc) {
        double t = gen_now_s() - t_all;
        char visits[96] = "";
        if (e.src.layer) { /* the executor's counts (offload/exec.h ft_exec_info) */
            ft_exec_info xi;
            ft_exec_get_info(e.s.ex, &xi);
            int w = snprintf(visits, sizeof visits, ", %lld layer visits", (long long)xi.layer_fetches);
            if (xi.h2d_bytes)
                snprintf(visits + w, sizeof visits - (size_t)w, " (%.1f MiB streamed)",
                         (double)xi.h2d_bytes / 1048576.0);
        }
        char shared[64] = "";
        if (pb.shared) snprintf(shared, sizeof shared, ", %lld choices' caches copied", (long long)pb.shared);
        fprintf(stderr, "ftune: %lld prompts, %lld new tokens in %.3f s (%.2f tok/s; %lld decode "
                "steps); %lld prefill forwards (%lld prompts prefilled with others%s)%s%s%s\n",
                (long long)b.n, (long long)total_new, t, t > 0 ? total_new / t : 0.0,
                (long long)steps, (long long)pb.forwards, (long long)pb.batched, shared, visits,
                o->out ? "; wrote " : "", o->out ? o->out : "");
    }
    for (int64_t k = 0; sl && k < e.slots; k++) {
        ft_stop_text_free(&sl[k].st); /* a run that fails */
        ft_sample_counts_free(&sl[k].cnt);
    }
    free(sl);
    for (int64_t i = 0; dn && i < b.n_choices; i++) { /* held when a run fails */
        free(dn[i].r.text);
        cJSON_Delete(dn[i].lp);
    }
    free(dn);
    free(act);
    free(tok);
    free(pb.slots);
    free(pb.lens);
    free(pb.lead);
    free(pb.lk);
    free(pb.ids);
    int rc2 = out_close(&of, o->out, !rc);
    if (!rc) rc = rc2;
    gen_env_close(&e);
    batch_free(&b);
    return rc;
}
