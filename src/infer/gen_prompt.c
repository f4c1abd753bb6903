/* gen_prompt.c - the prompt side of generation (gen_prompt.h): a prompt's chat-template ids,
 * prompts-file records with their own generation settings (ftune generate --prompts), record
 * seeds. */
#include "src/infer/gen_prompt.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/json.h"
#include "src/core/rng.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"

/* ---- prompt ------------------------------------------------------------------------------ */

/* Renders messages m[0..k) with tools (NULL: none) and its generation prompt (flags:
 * FT_GEN_*) with tmpl (resolved) or the template training takes for them
 * (ft_chat_template_for; *used gets it), and encodes them as training does. */
static int msgs_ids(const ft_tokenizer *tok, int tmpl, const ft_chat_msg *m, int64_t k,
                    const cJSON *tools, int flags, int32_t **ids, int64_t *n, int *used)
{
    ft_chat_ctx ctx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), ft_tok_chat_template(tok),
                       !!(flags & FT_GEN_NO_THINK), tools};
    ft_chat_text t = {0};
    int rc = ft_chat_template_for(tok, tmpl, m, k, &ctx, &tmpl);
    if (used) *used = tmpl;
    if (!rc) rc = ft_chat_render_prompt(&t, tmpl, m, k, &ctx);
    /* chat templates write BOS themselves; the Alpaca prompt relies on the tokenizer's
     * post-processor, as in training (dataset.c) */
    if (!rc) rc = ft_tok_encode(tok, t.text ? t.text : "", t.n, tmpl == FT_CHAT_ALPACA, ids, n);
    ft_chat_text_free(&t);
    return rc;
}

int ft_gen_prompt_ids(const ft_tokenizer *tok, int tmpl, const char *system, const char *prompt,
                      int flags, int32_t **ids, int64_t *n, int *tmpl_out)
{
    *ids = NULL;
    *n = 0;
    if (!tok || !prompt) return ft_err(FT_E_INVALID, "generate: no tokenizer or prompt");
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    if (tmpl_out) *tmpl_out = tmpl;
    if (flags & FT_GEN_RAW) return ft_tok_encode(tok, prompt, strlen(prompt), 1, ids, n);
    ft_chat_msg m[2];
    int64_t k = 0;
    memset(m, 0, sizeof m);
    if (system) m[k++] = (ft_chat_msg){FT_ROLE_SYSTEM, system, strlen(system), NULL, 0, 0};
    m[k++] = (ft_chat_msg){FT_ROLE_USER, prompt, strlen(prompt), NULL, 0, 0};
    return msgs_ids(tok, tmpl, m, k, NULL, flags, ids, n, NULL);
}

/* ---- prompts files ----------------------------------------------------------------------- */

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void ft_gen_req_free(ft_gen_req *q)
{
    if (!q) return;
    for (int64_t i = 0; i < q->n_msgs; i++) {
        free((char *)q->msgs[i].content);
        free((char *)q->msgs[i].input);
        free((char *)q->msgs[i].reasoning);
        cJSON_Delete((cJSON *)q->msgs[i].json);
    }
    free(q->msgs);
    cJSON_Delete(q->tools);
    free(q->user);
    free(q->reference);
    for (int64_t i = 0; i < q->params.n_stop; i++) free(q->params.stop[i]);
    free(q->params.stop);
    free(q->params.stop_ids);
    memset(q, 0, sizeof *q);
}

/* Appends a message with copies of s[0..n) and in[0..in_n) (in may be NULL). */
static int req_add(ft_gen_req *q, int role, const char *s, size_t n, const char *in, size_t in_n)
{
    ft_chat_msg *p = realloc(q->msgs, (size_t)(q->n_msgs + 1) * sizeof *p);
    if (!p) return ft_err(-ENOMEM, "out of memory");
    q->msgs = p;
    char *c = dup_str(s, n), *d = in ? dup_str(in, in_n) : NULL;
    if (!c || (in && !d)) {
        free(c);
        free(d);
        return ft_err(-ENOMEM, "out of memory");
    }
    q->msgs[q->n_msgs++] = (ft_chat_msg){role, c, n, d, d ? in_n : 0, 0};
    return 0;
}

/* An optional string field: *s NULL when absent or null. */
static int req_opt_str(const cJSON *j, const char *key, const char **s)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *s = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return ft_err(FT_E_INVALID, "'%s' must be a string", key);
    *s = v->valuestring;
    return 0;
}

/* A conversational record (messages, sharegpt, alpaca, conversational prompt/completion),
 * converted as training converts it (ft_data_record_messages): a final assistant turn is the
 * reference; what is left must end with a user or tool turn; the default system message goes
 * first when the record has none. */
static int req_conversation(ft_gen_req *q, const cJSON *rec, const char *system)
{
    ft_data_msgs dm;
    int rc = ft_data_record_messages(rec, FT_DATA_AUTO, 1, &dm);
    int64_t n = dm.n, has_system = 0;
    if (!rc && n && dm.m[n - 1].role == FT_ROLE_ASSISTANT) {
        const ft_chat_msg *a = &dm.m[n - 1];
        /* a tool-call turn without text: its calls are the reply to compare with */
        const cJSON *calls = a->json ? cJSON_GetObjectItemCaseSensitive(a->json, "tool_calls") : NULL;
        if (a->content_n == 0 && calls && !cJSON_IsNull(calls))
            q->reference = cJSON_PrintUnformatted(calls);
        else
            q->reference = dup_str(a->content, a->content_n);
        if (!q->reference) rc = ft_err(-ENOMEM, "out of memory");
        n--;
    }
    if (!rc && (n == 0 || (dm.m[n - 1].role != FT_ROLE_USER && dm.m[n - 1].role != FT_ROLE_TOOL)))
        rc = ft_err(FT_E_INVALID, "the conversation must end with a user turn (or with an "
                    "assistant turn after one, taken as the reference reply)");
    for (int64_t i = 0; !rc && i < n; i++) has_system |= dm.m[i].role == FT_ROLE_SYSTEM;
    if (!rc && system && !has_system) rc = req_add(q, FT_ROLE_SYSTEM, system, strlen(system), NULL, 0);
    for (int64_t i = 0; !rc && i < n; i++) {
        rc = req_add(q, dm.m[i].role, dm.m[i].content, dm.m[i].content_n, dm.m[i].input,
                     dm.m[i].input_n);
        /* the message object as the template sees it (tool_calls, name, tool_call_id...) */
        if (!rc && dm.m[i].json &&
            !(q->msgs[q->n_msgs - 1].json = cJSON_Duplicate(dm.m[i].json, 1)))
            rc = ft_err(-ENOMEM, "out of memory");
        if (!rc && dm.m[i].reasoning) { /* "reasoning_content" (the qwen3 template writes it) */
            char *r = dup_str(dm.m[i].reasoning, dm.m[i].reasoning_n);
            if (!r) rc = ft_err(-ENOMEM, "out of memory");
            q->msgs[q->n_msgs - 1].reasoning = r;
            q->msgs[q->n_msgs - 1].reasoning_n = dm.m[i].reasoning_n;
        }
    }
    /* the text reported as the prompt: the last user turn, with its alpaca input */
    for (int64_t k = n - 1; !rc && k >= 0 && !q->user; k--) {
        const ft_chat_msg *u = &dm.m[k];
        if (u->role != FT_ROLE_USER) continue;
        size_t in_n = u->input ? u->input_n : 0, L = u->content_n + (in_n ? 2 + in_n : 0);
        if (!(q->user = malloc(L + 1))) {
            rc = ft_err(-ENOMEM, "out of memory");
            break;
        }
        memcpy(q->user, u->content, u->content_n);
        if (in_n) {
            memcpy(q->user + u->content_n, "\n\n", 2);
            memcpy(q->user + u->content_n + 2, u->input, in_n);
        }
        q->user[L] = 0;
    }
    if (!rc && !q->user) rc = ft_err(FT_E_INVALID, "the conversation has no user turn");
    ft_data_msgs_free(&dm);
    return rc;
}

/* A prompt string p, from a string record (j NULL) or a {"prompt": p, ...} record j. */
static int req_prompt(ft_gen_req *q, const char *p, const cJSON *j, const char *system, int raw)
{
    const char *sys = NULL, *ref = NULL;
    if (j) {
        FT_TRY(req_opt_str(j, "system", &sys));
        FT_TRY(req_opt_str(j, "completion", &ref));
    }
    if (raw && sys)
        return ft_err(FT_E_INVALID, "with --raw a record has no 'system' (the prompt is encoded as is)");
    if (raw && j && cJSON_GetObjectItemCaseSensitive(j, "tools"))
        return ft_err(FT_E_INVALID, "with --raw a record has no 'tools' (the prompt is encoded as "
                      "is; without --raw the model's template writes them)");
    if (!sys) sys = system; /* as --system: present even when "" */
    if (!raw && sys) FT_TRY(req_add(q, FT_ROLE_SYSTEM, sys, strlen(sys), NULL, 0));
    FT_TRY(req_add(q, FT_ROLE_USER, p, strlen(p), NULL, 0));
    if (!(q->user = dup_str(p, strlen(p)))) return ft_err(-ENOMEM, "out of memory");
    if (ref && !(q->reference = dup_str(ref, strlen(ref)))) return ft_err(-ENOMEM, "out of memory");
    return 0;
}

/* ---- a record's generation settings ---- */

/* Record key `key`: NULL when absent or null. */
static const cJSON *param_item(const cJSON *rec, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number in [lo, hi] (lo_open: lo excluded), as float (the flags' strtod -> float); finite. */
static int param_float(const cJSON *v, const char *key, double lo, int lo_open, double hi,
                       const char *expect, float *out)
{
    /* beyond float's range the conversion is undefined: taken as not finite */
    const float f = cJSON_IsNumber(v) && fabs(v->valuedouble) <= FLT_MAX ? (float)v->valuedouble : NAN;
    if (!cJSON_IsNumber(v) || !isfinite(f) || f < lo || (lo_open && f == lo) || f > hi) {
        if (cJSON_IsNumber(v))
            return ft_err(FT_E_INVALID, "'%s' %g: expected %s", key, v->valuedouble, expect);
        return ft_err(FT_E_INVALID, "'%s' must be a number, found %s", key, ft_json_type(v));
    }
    *out = f;
    return 0;
}

/* An integer in [lo, hi] (a JSON number without a fraction). */
static int param_int(const cJSON *v, const char *key, int64_t lo, int64_t hi, const char *expect,
                     int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return ft_err(FT_E_INVALID, "'%s' must be an integer, found %s", key, ft_json_type(v));
    const double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return ft_err(FT_E_INVALID, "'%s' %.17g: expected %s", key, d, expect);
    *out = (int64_t)d;
    return 0;
}

/* "stop": a non-empty string or a list of up to FT_GEN_MAX_STOP_STR of them. */
static int param_stop(const cJSON *v, ft_gen_params *p)
{
    const int list = cJSON_IsArray(v);
    const int64_t n = list ? cJSON_GetArraySize(v) : 1;
    if (!list && !cJSON_IsString(v))
        return ft_err(FT_E_INVALID, "'stop' must be a string or a list of strings, found %s",
                      ft_json_type(v));
    if (n > FT_GEN_MAX_STOP_STR)
        return ft_err(FT_E_INVALID, "'stop': %lld strings, at most %d", (long long)n,
                      FT_GEN_MAX_STOP_STR);
    p->stop = calloc((size_t)(n ? n : 1), sizeof *p->stop);
    if (!p->stop) return ft_err(-ENOMEM, "out of memory");
    const cJSON *e = list ? v->child : v;
    for (int64_t i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsString(e))
            return ft_err(FT_E_INVALID, "'stop' item %lld must be a string, found %s",
                          (long long)i + 1, ft_json_type(e));
        if (!e->valuestring[0] && list) /* it would match at once */
            return ft_err(FT_E_INVALID, "'stop' item %lld: expected a non-empty string", (long long)i + 1);
        if (!e->valuestring[0])
            return ft_err(FT_E_INVALID, "'stop': expected a non-empty string");
        if (!(p->stop[i] = dup_str(e->valuestring, strlen(e->valuestring))))
            return ft_err(-ENOMEM, "out of memory");
        p->n_stop = i + 1;
    }
    return 0;
}

/* "stop_token_ids": a list of up to FT_GEN_MAX_STOP_IDS integers 0..2^31 - 1 (vLLM's
 * SamplingParams.stop_token_ids; their bound, the vocabulary, is checked once the model is
 * loaded). */
static int param_stop_ids(const cJSON *v, ft_gen_params *p)
{
    if (!cJSON_IsArray(v))
        return ft_err(FT_E_INVALID, "'stop_token_ids' must be a list of token ids, found %s",
                      ft_json_type(v));
    const int64_t n = cJSON_GetArraySize(v);
    if (n > FT_GEN_MAX_STOP_IDS)
        return ft_err(FT_E_INVALID, "'stop_token_ids': %lld ids, at most %d", (long long)n,
                      FT_GEN_MAX_STOP_IDS);
    p->stop_ids = calloc((size_t)(n ? n : 1), sizeof *p->stop_ids);
    if (!p->stop_ids) return ft_err(-ENOMEM, "out of memory");
    const cJSON *e = v->child;
    for (int64_t i = 0; i < n; i++, e = e->next) {
        if (!cJSON_IsNumber(e))
            return ft_err(FT_E_INVALID, "'stop_token_ids' item %lld must be a token id (an "
                          "integer), found %s", (long long)i + 1, ft_json_type(e));
        const double d = e->valuedouble;
        if (!(d >= 0 && d <= INT32_MAX) || d != floor(d))
            return ft_err(FT_E_INVALID, "'stop_token_ids' item %lld: %.17g is no token id "
                          "(expected an integer 0..%d)", (long long)i + 1, d, INT32_MAX);
        p->stop_ids[i] = (int32_t)d;
        p->n_stop_ids = i + 1;
    }
    return 0;
}

/* Keys of the OpenAI Batch-API emulation that `ftune generate` no longer reads: a record
 * that sets one is refused, naming it, rather than answered without it. */
static const char *const REMOVED_KEYS[] = {"presence_penalty", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "prompt_logprobs", "n", "best_of", "echo", "min_tokens",
    "ignore_eos", "body", NULL};

/* The generation settings of object record rec into *p (see ft_gen_req_parse). On error *p
 * may hold a partial stop list (ft_gen_req_free frees it). */
static int req_params(ft_gen_params *p, const cJSON *rec)
{
    static const char *const max_keys[] = {"max_new_tokens", "max_tokens", "max_completion_tokens"};
    const char *max_key = NULL;
    const cJSON *v;
    for (int i = 0; REMOVED_KEYS[i]; i++)
        if (param_item(rec, REMOVED_KEYS[i]))
            return ft_err(FT_E_INVALID, "'%s' was removed from ftune generate (it keeps what "
                          "evaluating an adapter needs); to serve the exported adapter or the merged "
                          "model with an OpenAI-style API, load it into vLLM or llama.cpp",
                          REMOVED_KEYS[i]);
    for (int i = 0; i < 3; i++) {
        int64_t m;
        if (!(v = param_item(rec, max_keys[i]))) continue;
        FT_TRY(param_int(v, max_keys[i], 1, FT_GEN_MAX_NEW_TOKENS, "1..1000000", &m));
        if (max_key && m != p->max_new_tokens)
            return ft_err(FT_E_INVALID, "'%s' %lld and '%s' %lld: give one of them",
                          max_key, (long long)p->max_new_tokens, max_keys[i], (long long)m);
        max_key = max_keys[i];
        p->max_new_tokens = m;
        p->set |= FT_GEN_SET_MAX_NEW;
    }
    if ((v = param_item(rec, "temperature"))) {
        FT_TRY(param_float(v, "temperature", 0, 0, INFINITY, "a finite value >= 0 (0: greedy)",
                           &p->temperature));
        p->set |= FT_GEN_SET_TEMPERATURE;
    }
    if ((v = param_item(rec, "top_p"))) {
        FT_TRY(param_float(v, "top_p", 0, 1, 1, "0 < top_p <= 1 (1: off)", &p->top_p));
        p->set |= FT_GEN_SET_TOP_P;
    }
    if ((v = param_item(rec, "top_k"))) {
        FT_TRY(param_int(v, "top_k", 0, (INT64_C(1) << 53) - 1, "an integer >= 0 (0: off)", &p->top_k));
        p->set |= FT_GEN_SET_TOP_K;
    }
    if ((v = param_item(rec, "min_p"))) {
        FT_TRY(param_float(v, "min_p", 0, 0, 1, "0 <= min_p <= 1 (0: off)", &p->min_p));
        p->set |= FT_GEN_SET_MIN_P;
    }
    if ((v = param_item(rec, "repetition_penalty"))) {
        FT_TRY(param_float(v, "repetition_penalty", 0, 1, INFINITY, "a finite value > 0 (1: off)",
                           &p->repetition_penalty));
        p->set |= FT_GEN_SET_REP_PENALTY;
    }
    /* a line that `ftune generate --prompts` wrote ("reply" is no input key) fed back as a
     * prompts file: its "stop" is why that reply ended ("length", ...), not a stop string */
    if ((v = param_item(rec, "stop")) && !cJSON_GetObjectItemCaseSensitive(rec, "reply")) {
        FT_TRY(param_stop(v, p));
        p->set |= FT_GEN_SET_STOP;
    }
    if ((v = param_item(rec, "stop_token_ids"))) {
        FT_TRY(param_stop_ids(v, p));
        p->set |= FT_GEN_SET_STOP_IDS;
    }
    if ((v = param_item(rec, "seed"))) {
        int64_t sd;
        FT_TRY(param_int(v, "seed", 0, (INT64_C(1) << 53) - 1, "an integer 0..2^53 - 1", &sd));
        p->seed = (uint64_t)sd;
        p->set |= FT_GEN_SET_SEED;
    }
    return 0;
}

/* ---- a key given twice ---- */

/* FT_E_INVALID naming the first key (in sorted order) that object o holds twice (prefix "" or
 * "body."), or with nested, that an object below o (a message, a tool) holds twice: JSON
 * readers disagree on which one counts (cJSON, and so ftune, takes the first; Python's json,
 * which OpenAI's and vLLM's servers parse with, the last), so that a record that repeats one
 * would not be read as they read it. The record's and body's own keys are checked first, so
 * that their messages keep the "body." prefix; the same rule as the training data reader. */
static int dup_keys(const cJSON *o, int nested)
{
    int oom = 0;
    const char *d = ft_json_dup_key(o, nested, &oom);
    if (oom) return ft_err(-ENOMEM, "out of memory");
    if (d)
        return ft_err(FT_E_INVALID, "key '%s' appears twice%s: JSON readers differ on which one "
                      "counts (Python's json takes the last); give it once", d,
                      nested ? " in one object" : "");
    return 0;
}

int ft_gen_req_parse(ft_gen_req *q, const cJSON *rec, const char *system, int raw)
{
    memset(q, 0, sizeof *q);
    int rc;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
    if (cJSON_IsObject(rec) && (rc = dup_keys(rec, 0))) return rc;
    if (cJSON_IsObject(rec) && (rc = req_params(&q->params, rec))) {
        ft_gen_req_free(q);
        return rc;
    }
    if (cJSON_IsString(rec)) {
        rc = req_prompt(q, rec->valuestring, NULL, system, raw);
    } else if (cJSON_IsObject(rec) && cJSON_IsString(p)) {
        rc = req_prompt(q, p->valuestring, rec, system, raw);
    } else if (p && !(cJSON_IsArray(p) && cJSON_GetObjectItemCaseSensitive(rec, "completion"))) {
        rc = ft_err(FT_E_INVALID, "'prompt' must be a string (a conversation goes in 'messages', "
                    "or in 'prompt' and 'completion' lists)");
    } else if (raw) {
        rc = ft_err(FT_E_INVALID, "with --raw a record is a string or {\"prompt\": S}, found %s",
                    ft_json_type(rec));
    } else if (cJSON_IsObject(rec)) {
        rc = req_conversation(q, rec, system);
    } else {
        rc = ft_err(FT_E_INVALID, "expected a string or an object; found %s", ft_json_type(rec));
    }
    /* function schemas, as training reads them (the model's template writes them) */
    if (!rc && !raw && cJSON_IsObject(rec)) rc = ft_data_record_tools(rec, &q->tools);
    if (!rc && cJSON_IsObject(rec)) rc = dup_keys(rec, 1);
    if (rc) ft_gen_req_free(q);
    return rc;
}

int ft_gen_req_ids(const ft_tokenizer *tok, int tmpl, const ft_gen_req *q, int flags,
                   int32_t **ids, int64_t *n, int *tmpl_out)
{
    *ids = NULL;
    *n = 0;
    if (!tok || !q || !q->user || q->n_msgs < 1)
        return ft_err(FT_E_INVALID, "generate: no tokenizer or prompt");
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    if (tmpl_out) *tmpl_out = tmpl;
    if (flags & FT_GEN_RAW) return ft_tok_encode(tok, q->user, strlen(q->user), 1, ids, n);
    return msgs_ids(tok, tmpl, q->msgs, q->n_msgs, q->tools, flags, ids, n, tmpl_out);
}

uint64_t ft_gen_record_seed(uint64_t seed, int64_t i)
{
    /* splitmix64's output after i steps from state 0 */
    return seed ^ (ft_mix64((uint64_t)i * 0x9e3779b97f4a7c15ull) & ((1ull << 53) - 1));
}
