/* gen_batch_req.c - the keys of a prompts-file record (ftune generate --prompts): unknown keys
 * with a did-you-mean, for plain records and OpenAI batch request lines alike, and the batch
 * request lines themselves (OpenAI's Batch API input: custom_id, method, url and a chat
 * completions or completions body). Split from gen_prompt.c, which parses the records and
 * calls in here (gen_prompt_internal.h). */
#include "src/infer/gen_prompt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/json.h"
#include "src/data/dataset.h"

/* ---- keys a record may hold ---- */

/* Keys of the schemas (formats.md 8.1) that ft_gen_req_parse reads. */
static const char *const SCHEMA_KEYS[] = {"prompt", "system", "completion", "tools", "messages",
                                          "conversations", "instruction", "input", "output",
                                          "history", NULL};
/* A record's generation settings (gp_req_params). */
static const char *const SETTING_KEYS[] = {"max_new_tokens", "max_tokens", "max_completion_tokens",
                                           "temperature", "top_p", "top_k", "min_p",
                                           "repetition_penalty", "presence_penalty",
                                           "frequency_penalty", "stop", "seed", "logprobs",
                                           "stop_token_ids", "min_tokens", "prompt_logprobs",
                                           "logit_bias", "ignore_eos", NULL};
/* Keys of the lines `ftune generate --prompts` writes (a line fed back is a record). */
static const char *const WRITTEN_KEYS[] = {"index", "reply", "reference", "prompt_tokens",
                                           "new_tokens", "stop_reason", "seconds", NULL};
/* The keys of a batch request line (OpenAI's BatchRequestInput). */
static const char *const BATCH_KEYS[] = {"custom_id", "method", "url", "body", NULL};
/* The settings a batch request's body may give (gp_req_params with body = 1), and its content
 * keys: what a misspelt body key is compared with. */
static const char *const BODY_READ_KEYS[] = {"messages", "prompt", "tools", "max_tokens",
                                             "max_completion_tokens", "temperature", "top_p",
                                             "top_k", "min_p", "repetition_penalty",
                                             "presence_penalty", "frequency_penalty", "stop",
                                             "seed", "n", "logprobs", "top_logprobs",
                                             "stop_token_ids", "min_tokens", "prompt_logprobs",
                                             "echo", "logit_bias", "ignore_eos", NULL};

static int in_list(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

/* The optimal-string-alignment distance between a and b (Levenshtein's insertions, deletions
 * and substitutions, plus transpositions of two adjacent characters), or cap + 1 when it is
 * above cap (also for strings over 64 bytes, which are not compared). */
static int edit_distance(const char *a, const char *b, int cap)
{
    enum { M = 64 };
    const size_t na = strlen(a), nb = strlen(b);
    if (na > M || nb > M) return cap + 1;
    if ((na > nb ? na - nb : nb - na) > (size_t)cap) return cap + 1;
    int d[M + 1][M + 1];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[na][nb] <= cap ? d[na][nb] : cap + 1;
}

/* The key of `lists` (NULL-terminated lists, NULL after the last) nearest to k within edit
 * distance 2, the first listed on ties; NULL when none is. */
static const char *near_key(const char *k, const char *const *const *lists)
{
    const char *best = NULL;
    int bd = 3;
    for (; *lists; lists++)
        for (const char *const *c = *lists; *c; c++) {
            int dd = edit_distance(k, *c, 2);
            if (dd > 0 && dd < bd) { /* a known key in the wrong place is no misspelling */
                bd = dd;
                best = *c;
            }
        }
    return best;
}

/* Appends unknown key prefix + k (prefix "" or "body.") with its hint. */
static int add_unknown(ft_gen_req *q, const char *prefix, const char *k, const char *hint)
{
    const int64_t n = q->n_unknown + 1;
    char **u = realloc(q->unknown, (size_t)n * sizeof *u);
    if (!u) return ft_err(-ENOMEM, "out of memory");
    q->unknown = u;
    const char **h = realloc(q->unknown_hint, (size_t)n * sizeof *h);
    if (!h) return ft_err(-ENOMEM, "out of memory");
    q->unknown_hint = h;
    const size_t np = strlen(prefix), nk = strlen(k);
    char *s = malloc(np + nk + 1);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    memcpy(s, prefix, np);
    memcpy(s + np, k, nk + 1);
    u[q->n_unknown] = s;
    h[q->n_unknown] = hint;
    q->n_unknown = n;
    return 0;
}

/* The keys of plain object record rec that are neither schema keys, settings nor keys ftune
 * writes back, into q->unknown. */
int gp_plain_unknown(ft_gen_req *q, const cJSON *rec)
{
    static const char *const *const hint_lists[] = {SETTING_KEYS, SCHEMA_KEYS, NULL};
    for (const cJSON *c = rec->child; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        if (in_list(SCHEMA_KEYS, k) || in_list(SETTING_KEYS, k) || in_list(WRITTEN_KEYS, k))
            continue;
        FT_TRY(add_unknown(q, "", k, near_key(k, hint_lists)));
    }
    return 0;
}

/* ---- OpenAI batch requests ---- */

/* What a body field that ftune does not implement may be: the values that change nothing. */
enum {
    B_IGNORE,   /* any value: no effect on the reply (ids, metadata, service options) */
    B_FALSE,    /* false or null */
    B_TRUE,     /* true or null */
    B_ONE,      /* 1 or null */
    B_EMPTY,    /* null, "", [] or {} (and the default a few have: body_ok) */
};

/* The request body fields ftune does not read, by what it accepts of them: OpenAI's chat
 * completions and completions request bodies (openapi.yaml CreateChatCompletionRequest,
 * CreateCompletionRequest) and vLLM's extra fields (vllm/entrypoints/openai/protocol.py
 * ChatCompletionRequest, CompletionRequest). A value outside what the rule accepts would
 * change the response: the request is refused, naming the field. */
static const struct body_field { const char *key; int rule; const char *why; } BODY_FIELDS[] = {
    {"model", B_IGNORE, NULL},  /* the reply comes from --model (written back as "model") */
    {"user", B_IGNORE, NULL},
    {"metadata", B_IGNORE, NULL},
    {"store", B_IGNORE, NULL},
    {"service_tier", B_IGNORE, NULL},
    {"prompt_cache_key", B_IGNORE, NULL},
    {"safety_identifier", B_IGNORE, NULL},
    {"request_id", B_IGNORE, NULL},
    {"priority", B_IGNORE, NULL},
    {"cache_salt", B_IGNORE, NULL},
    {"stream_options", B_IGNORE, NULL},
    {"prediction", B_IGNORE, NULL},    /* OpenAI: a latency hint, the reply is the same */
    {"kv_transfer_params", B_IGNORE, NULL},
    {"spaces_between_special_tokens", B_IGNORE, NULL},
    {"stream", B_FALSE, "the reply is written whole"},
    {"include_stop_str_in_output", B_FALSE, "the reply stops before the stop string"},
    {"use_beam_search", B_FALSE, NULL},
    {"continue_final_message", B_FALSE, NULL},
    {"return_tokens_as_token_ids", B_FALSE, NULL},
    {"return_token_ids", B_FALSE, NULL},
    {"add_generation_prompt", B_TRUE, NULL},
    {"skip_special_tokens", B_TRUE, "the reply's text skips special tokens"},
    {"parallel_tool_calls", B_TRUE, NULL},
    {"best_of", B_ONE, NULL},
    {"length_penalty", B_ONE, NULL},
    {"bad_words", B_EMPTY, NULL},
    {"allowed_token_ids", B_EMPTY, NULL},
    {"logits_processors", B_EMPTY, NULL},
    {"vllm_xargs", B_EMPTY, NULL},
    {"chat_template", B_EMPTY, "the template is the model's or --chat-template's"},
    {"chat_template_kwargs", B_EMPTY, "the template's switches are flags: --no-think"},
    {"mm_processor_kwargs", B_EMPTY, NULL},
    {"documents", B_EMPTY, NULL},
    {"response_format", B_EMPTY, "no constrained decoding; {\"type\": \"text\"} is accepted"},
    {"structured_outputs", B_EMPTY, "no constrained decoding"},
    {"guided_json", B_EMPTY, "no constrained decoding"},
    {"guided_regex", B_EMPTY, "no constrained decoding"},
    {"guided_choice", B_EMPTY, "no constrained decoding"},
    {"guided_grammar", B_EMPTY, "no constrained decoding"},
    {"structural_tag", B_EMPTY, "no constrained decoding"},
    {"guided_decoding_backend", B_EMPTY, NULL},
    {"guided_whitespace_pattern", B_EMPTY, NULL},
    {"tool_choice", B_EMPTY, "the model chooses; \"auto\" is accepted"},
    {"functions", B_EMPTY, "function schemas go in \"tools\""},
    {"function_call", B_EMPTY, NULL},
    {"modalities", B_EMPTY, "text only; [\"text\"] is accepted"},
    {"audio", B_EMPTY, NULL},
    {"web_search_options", B_EMPTY, NULL},
    {"reasoning_effort", B_EMPTY, NULL},
    {"verbosity", B_EMPTY, NULL},
    {"truncate_prompt_tokens", B_EMPTY, NULL},
    {"suffix", B_EMPTY, NULL},
    {"add_special_tokens", B_IGNORE, NULL}, /* checked in body_fields */
};

/* 1 when v is the value that `rule` accepts (null always is). */
static int body_ok(const char *key, int rule, const cJSON *v)
{
    if (cJSON_IsNull(v) || rule == B_IGNORE) return 1;
    switch (rule) {
    case B_FALSE: return cJSON_IsFalse(v);
    case B_TRUE: return cJSON_IsTrue(v);
    case B_ONE: return cJSON_IsNumber(v) && v->valuedouble == 1;
    default: break;
    }
    /* B_EMPTY, and the defaults that OpenAI's API spells out */
    if ((cJSON_IsString(v) && !v->valuestring[0]) || ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child))
        return 1;
    if (!strcmp(key, "tool_choice")) return cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
    if (!strcmp(key, "response_format")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        return cJSON_IsObject(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(t) &&
               !strcmp(t->valuestring, "text");
    }
    if (!strcmp(key, "modalities"))
        return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child) &&
               !strcmp(v->child->valuestring, "text");
    return 0;
}

/* v as short JSON text for a message (at most n - 1 bytes, "..." when cut). */
static void short_json(const cJSON *v, char *buf, size_t n)
{
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, n, "%s", t ? t : "?");
    if (t && strlen(t) >= n && n > 4) memcpy(buf + n - 4, "...", 4);
    free(t);
}

/* The fields of body (endpoint api) that ftune does not read: each refused unless its value
 * changes nothing (BODY_FIELDS); a key that is no field of either API is an unknown key. */
static int body_fields(ft_gen_req *q, const cJSON *body, int api)
{
    static const char *const *const hint_lists[] = {BODY_READ_KEYS, NULL};
    const size_t nf = sizeof BODY_FIELDS / sizeof *BODY_FIELDS;
    for (const cJSON *c = body->child; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        char val[48];
        if (!strcmp(k, api == FT_GEN_API_CHAT ? "messages" : "prompt") ||
            (api == FT_GEN_API_CHAT && (!strcmp(k, "tools") || !strcmp(k, "top_logprobs"))) ||
            !strcmp(k, "n") || !strcmp(k, "echo") || /* the choices, echo (gp_req_params) */
            (in_list(SETTING_KEYS, k) && strcmp(k, "max_new_tokens")))
            continue;
        if (!strcmp(k, "add_special_tokens")) {
            /* vLLM: false for chat (the template writes BOS), true for completions */
            const int want = api == FT_GEN_API_COMPLETIONS;
            if (!cJSON_IsNull(c) && !(want ? cJSON_IsTrue(c) : cJSON_IsFalse(c)))
                return ft_err(FT_E_INVALID, "'body.add_special_tokens' must be %s for %s (or "
                              "left out)", want ? "true" : "false",
                              want ? "/v1/completions" : "/v1/chat/completions");
            continue;
        }
        size_t i = 0;
        while (i < nf && strcmp(BODY_FIELDS[i].key, k)) i++;
        if (i == nf) {
            FT_TRY(add_unknown(q, "body.", k, near_key(k, hint_lists)));
            continue;
        }
        if (body_ok(k, BODY_FIELDS[i].rule, c)) continue;
        static const char *const accept[] = {"", " false", " true", " 1", " null"};
        short_json(c, val, sizeof val);
        return ft_err(FT_E_INVALID, "'body.%s' %s: ftune generate does not implement it%s%s%s, and "
                      "it would change the response: leave it out or set it%s", k, val,
                      BODY_FIELDS[i].why ? " (" : "", BODY_FIELDS[i].why ? BODY_FIELDS[i].why : "",
                      BODY_FIELDS[i].why ? ")" : "", accept[BODY_FIELDS[i].rule]);
    }
    return 0;
}

/* An OpenAI batch request line (OpenAI's Batch API input, openapi.yaml BatchRequestInput;
 * vLLM's run_batch.py BatchRequestInput): {"custom_id": S, "method": "POST", "url": U,
 * "body": B}; see ft_gen_req_parse. */
int gp_req_batch(ft_gen_req *q, const cJSON *rec, const char *system, int raw)
{
    static const char *const *const hint_lists[] = {BATCH_KEYS, NULL};
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(rec, "custom_id");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(rec, "method");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(rec, "url");
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(rec, "body");
    if (!cJSON_IsString(id))
        return ft_err(FT_E_INVALID, "an OpenAI batch request (it has 'body') needs a string "
                      "'custom_id'%s%s", id ? ", found " : "", id ? ft_json_type(id) : "");
    if (!(q->custom_id = gp_dup_str(id->valuestring, strlen(id->valuestring))))
        return ft_err(-ENOMEM, "out of memory");
    if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST")) {
        char val[48];
        short_json(method, val, sizeof val);
        return ft_err(FT_E_INVALID, "'method' %s: a batch request's method is \"POST\"",
                      method ? val : "missing");
    }
    if (!cJSON_IsString(url))
        return ft_err(FT_E_INVALID, "a batch request needs a string 'url' (\"/v1/chat/completions\" "
                      "or \"/v1/completions\")");
    if (!strcmp(url->valuestring, "/v1/chat/completions")) {
        q->api = FT_GEN_API_CHAT;
    } else if (!strcmp(url->valuestring, "/v1/completions")) {
        q->api = FT_GEN_API_COMPLETIONS;
    } else {
        char val[80];
        short_json(url, val, sizeof val);
        return ft_err(FT_E_INVALID, "'url' %s: ftune generate answers \"/v1/chat/completions\" and "
                      "\"/v1/completions\" requests", val);
    }
    if (!cJSON_IsObject(body))
        return ft_err(FT_E_INVALID, "'body' must be an object (the request), found %s", ft_json_type(body));
    FT_TRY(gp_dup_keys(body, "body.", 0));
    for (const cJSON *c = rec->child; c; c = c->next)
        if (!in_list(BATCH_KEYS, c->string ? c->string : ""))
            FT_TRY(add_unknown(q, "", c->string ? c->string : "", near_key(c->string ? c->string : "", hint_lists)));
    FT_TRY(body_fields(q, body, q->api));
    if (q->api == FT_GEN_API_COMPLETIONS) {
        /* raw text, encoded as --raw encodes it (BOS, no template): vLLM's completions
         * tokenize with add_special_tokens = True */
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(p))
            return ft_err(FT_E_INVALID, "'body.prompt' must be a string (one prompt per request; "
                          "lists and token ids are not read), found %s", p ? ft_json_type(p) : "none");
        FT_TRY(gp_req_add(q, FT_ROLE_USER, p->valuestring, strlen(p->valuestring), NULL, 0));
        if (!(q->user = gp_dup_str(p->valuestring, strlen(p->valuestring))))
            return ft_err(-ENOMEM, "out of memory");
        q->raw = 1;
    } else {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (raw)
            return ft_err(FT_E_INVALID, "a /v1/chat/completions request goes through the chat "
                          "template; --raw has none (raw text goes in /v1/completions requests)");
        if (!cJSON_IsArray(m))
            return ft_err(FT_E_INVALID, "'body.messages' must be a list of messages, found %s",
                          m ? ft_json_type(m) : "none");
        /* the conversation as a {"messages", "tools"} record: converted as training converts
         * it (content parts, tool calls), the template chosen as training chooses it */
        cJSON *r = cJSON_CreateObject();
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
        int rc = r && cJSON_AddItemReferenceToObject(r, "messages", (cJSON *)m) &&
                         (!tools || cJSON_AddItemReferenceToObject(r, "tools", (cJSON *)tools))
                     ? 0
                     : ft_err(-ENOMEM, "out of memory");
        if (!rc) rc = gp_req_conversation(q, r, system);
        if (!rc) rc = ft_data_record_tools(r, &q->tools);
        cJSON_Delete(r);
        if (rc == FT_E_INVALID) ft_err_prefix(rc, "body");
        FT_TRY(rc);
        if (q->reference)
            return ft_err(FT_E_INVALID, "'body.messages' ends with an assistant message: the API "
                          "answers after it, ftune would take it as the reference; end with a "
                          "user or tool message");
    }
    int rc = gp_req_params(&q->params, body, q->api);
    if (rc == FT_E_INVALID) ft_err_prefix(rc, "body");
    return rc;
}
