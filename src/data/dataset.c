/* dataset.c - records to examples: schema detection, conversion to chat messages, rendering,
 * tokenization, loss masks, truncation, deterministic shuffle and eval split (over the union
 * of one or more files), or eval examples from a file of their own (dataset.h). Preference
 * records (cfg->preference, DPO) give two examples each, their sides written as SFT records
 * by pref.c and encoded here by the same rules; the shuffle and split move whole pairs.
 *
 * Masks follow TRL SFTTrainer (formats.md 8.2): the rendered text is tokenized once, and each
 * boundary between untrained and trained text is mapped to a token index by tokenizing the
 * prefix before it (the prompt/prompt+completion method of TRL and Stanford Alpaca; the
 * prefixes go through a piece memo of the whole text, tokenizer.h ft_tok_memo, so the pieces
 * before a boundary are not encoded again: the same ids, faster). Where a
 * token straddles a boundary (the prefix's last token merges with the text after it, e.g.
 * "\n" + " Paris" -> "\n " in byte-level BPE), it is trained: a token is trained when it
 * overlaps trained text, as transformers' return_assistant_tokens_mask decides.
 */
#include "src/data/dataset.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/core/json.h"
#include "src/template/chat.h"
#include "src/data/pref.h"
#include "src/data/records.h"

static const char *const FORMAT_NAME[] = {"auto", "alpaca", "messages", "sharegpt",
                                          "prompt-completion", "text"};

const char *ft_data_format_name(int f)
{
    if (f < 0 || f >= (int)(sizeof FORMAT_NAME / sizeof *FORMAT_NAME)) return "unknown";
    return FORMAT_NAME[f];
}

int ft_data_format_parse(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < (int)(sizeof FORMAT_NAME / sizeof *FORMAT_NAME); i++)
        if (!strcmp(name, FORMAT_NAME[i])) return i;
    if (!strcmp(name, "openai") || !strcmp(name, "chat")) return FT_DATA_MESSAGES;
    if (!strcmp(name, "completion")) return FT_DATA_PROMPT_COMPLETION;
    return -1;
}

/* Schema from a record's keys (formats.md 8.1), or -1. */
static int detect_format(const cJSON *j)
{
    if (!cJSON_IsObject(j)) return -1;
    if (cJSON_GetObjectItemCaseSensitive(j, "messages")) return FT_DATA_MESSAGES;
    if (cJSON_GetObjectItemCaseSensitive(j, "conversations")) return FT_DATA_SHAREGPT;
    if (cJSON_GetObjectItemCaseSensitive(j, "instruction") &&
        cJSON_GetObjectItemCaseSensitive(j, "output"))
        return FT_DATA_ALPACA;
    if (cJSON_GetObjectItemCaseSensitive(j, "prompt") &&
        cJSON_GetObjectItemCaseSensitive(j, "completion"))
        return FT_DATA_PROMPT_COMPLETION;
    if (cJSON_GetObjectItemCaseSensitive(j, "text")) return FT_DATA_TEXT;
    return -1;
}

/* "a, b, c" of an object's first keys, for the unknown-schema message. */
static void key_list(const cJSON *j, char *buf, size_t n)
{
    buf[0] = 0;
    if (!cJSON_IsObject(j)) {
        snprintf(buf, n, "not a JSON object");
        return;
    }
    size_t k = 0;
    int i = 0;
    for (const cJSON *c = j->child; c && k + 1 < n; c = c->next, i++) {
        if (i == 6) { snprintf(buf + k, n - k, ", ..."); break; }
        int w = snprintf(buf + k, n - k, "%s'%s'", i ? ", " : "", c->string ? c->string : "?");
        if (w < 0) break;
        k += (size_t)w;
    }
    if (i == 0) snprintf(buf, n, "an empty object");
}

/* ---- records to messages ----------------------------------------------------------------- */

typedef struct msgs {
    ft_chat_msg *m;
    int64_t n, cap;
} msgs;

static int msgs_add(msgs *v, int role, const char *s, size_t n, int train)
{
    if (v->n == v->cap) {
        int64_t cap = v->cap ? 2 * v->cap : 8;
        ft_chat_msg *p = realloc(v->m, (size_t)cap * sizeof *p);
        if (!p) return ft_err(-ENOMEM, "out of memory");
        v->m = p;
        v->cap = cap;
    }
    v->m[v->n++] = (ft_chat_msg){.role = role, .content = s, .content_n = n, .train = train};
    return 0;
}

/* A required string field. */
static int get_str(const cJSON *j, const char *key, const char *what, const char **s, size_t *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v))
        return ft_err(FT_E_INVALID, "%s record needs a string '%s'%s", what, key,
                      v ? " (found another JSON type)" : "");
    *s = v->valuestring;
    *n = strlen(v->valuestring);
    return 0;
}

/* An optional string field: NULL/0 when absent or null. */
static int opt_str(const cJSON *j, const char *key, const char *what, const char **s, size_t *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *s = NULL;
    *n = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v))
        return ft_err(FT_E_INVALID, "%s record: '%s' must be a string", what, key);
    *s = v->valuestring;
    *n = strlen(v->valuestring);
    return 0;
}

static int role_of(const char *r)
{
    if (!strcmp(r, "system") || !strcmp(r, "developer")) return FT_ROLE_SYSTEM;
    if (!strcmp(r, "user") || !strcmp(r, "human")) return FT_ROLE_USER;
    if (!strcmp(r, "assistant") || !strcmp(r, "gpt") || !strcmp(r, "function_call") ||
        !strcmp(r, "model"))
        return FT_ROLE_ASSISTANT;
    if (!strcmp(r, "tool") || !strcmp(r, "observation") || !strcmp(r, "function") ||
        !strcmp(r, "ipython"))
        return FT_ROLE_TOOL;
    return -1;
}

/* What a record's conversion makes (joined content parts, JSON objects converted from
 * LLaMA-Factory's forms), freed together after the record is encoded: a block holds a string
 * s[] or owns one cJSON tree (json, NULL for a string block). */
typedef struct arena_blk { struct arena_blk *prev; cJSON *json; char s[]; } arena_blk;

/* Hands j (may be NULL: out of memory while building it) to *arena. Returns 0 or -ENOMEM
 * (j deleted). */
static int arena_keep(arena_blk **arena, cJSON *j)
{
    arena_blk *b = j ? malloc(sizeof *b) : NULL;
    if (!b) {
        cJSON_Delete(j);
        return ft_err(-ENOMEM, "out of memory");
    }
    b->prev = *arena;
    b->json = j;
    *arena = b;
    return 0;
}

/* JSON text s parsed whole (trailing text other than whitespace is an error, as in Python's
 * json.loads); NULL, with the byte offset of the error in *err_at, when it does not parse,
 * or (*nul set) when a string in it holds \u0000, which cJSON's strings would end at
 * (json.h: refused, never cut). */
static cJSON *parse_text(const char *s, size_t *err_at, int *nul)
{
    const char *end = NULL;
    size_t n = strlen(s), z = ft_json_find_nul(s, n);
    *nul = z < n;
    if (*nul) {
        *err_at = z;
        return NULL;
    }
    cJSON *j = cJSON_ParseWithOpts(s, &end, 1);
    *err_at = !j && end && end >= s ? (size_t)(end - s) : 0;
    return j;
}

/* Message content: a string, or a list of {"type":"text","text":...} parts joined (OpenAI).
 * Joined parts live in *arena (freed by the caller). */
static int content_of(const cJSON *c, const char *where, int64_t i, arena_blk **arena,
                      const char **s, size_t *n)
{
    if (cJSON_IsString(c)) {
        *s = c->valuestring;
        *n = strlen(c->valuestring);
        return 0;
    }
    if (cJSON_IsNull(c)) {
        *s = "";
        *n = 0;
        return 0;
    }
    if (!cJSON_IsArray(c))
        return ft_err(FT_E_INVALID, "%s %lld: content must be a string or a list of text parts",
                      where, (long long)i);
    size_t total = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t))
            return ft_err(FT_E_INVALID, "%s %lld: a content part without a string 'text' "
                          "(only text parts can be trained)", where, (long long)i);
        total += strlen(t->valuestring);
    }
    arena_blk *b = malloc(sizeof *b + total + 1);
    if (!b) return ft_err(-ENOMEM, "out of memory");
    b->prev = *arena;
    b->json = NULL;
    *arena = b;
    size_t k = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t L = strlen(t);
        memcpy(b->s + k, t, L);
        k += L;
    }
    b->s[k] = 0;
    *s = b->s;
    *n = k;
    return 0;
}

static void arena_free(arena_blk *a)
{
    while (a) {
        arena_blk *prev = a->prev;
        cJSON_Delete(a->json);
        free(a);
        a = prev;
    }
}

/* A LLaMA-Factory "function_call" turn (its data/README.md sharegpt form; its OpenAI-form
 * converter writes the same): content c is JSON text, {"name": N, "arguments": A} or a list
 * of such (parallel calls), as its FunctionFormatter reads it. *out gets the message in
 * OpenAI form, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
 * "function": {"name": N, "arguments": A}}, ...]} (A as written: an object, or a string),
 * owned by *arena. Returns 0, -ENOMEM, FT_E_INVALID (naming the turn). */
static int function_call_of(const cJSON *c, const char *key, const char *where, int64_t i,
                            arena_blk **arena, const cJSON **out)
{
    static const char FORM[] = "{\"name\": ..., \"arguments\": {...}} or a list of them";
    if (!cJSON_IsString(c))
        return ft_err(FT_E_INVALID, "%s %lld: a function_call turn's '%s' must be JSON text, %s",
                      where, (long long)i, key, FORM);
    size_t at;
    int nul;
    cJSON *calls = parse_text(c->valuestring, &at, &nul);
    if (!calls && nul)
        return ft_err(FT_E_INVALID, "%s %lld: the function_call '%s' (JSON text) at byte %zu: %s",
                      where, (long long)i, key, at, FT_JSON_NUL_WHY);
    if (!calls)
        return ft_err(FT_E_INVALID, "%s %lld: the function_call '%s' is not valid JSON (at byte "
                      "%zu%s%.24s%s); expected %s", where, (long long)i, key, at,
                      c->valuestring[at] ? ": '" : ", the end", c->valuestring + at,
                      c->valuestring[at] ? "'" : "", FORM);
    FT_TRY(arena_keep(arena, calls));
    cJSON *msg = cJSON_CreateObject(), *tc = NULL;
    int rc = arena_keep(arena, msg);
    if (!rc && (!cJSON_AddStringToObject(msg, "role", "assistant") ||
                !cJSON_AddStringToObject(msg, "content", "") ||
                !(tc = cJSON_AddArrayToObject(msg, "tool_calls"))))
        rc = ft_err(-ENOMEM, "out of memory");
    if (rc) return rc;
    const cJSON *x, *one = cJSON_IsObject(calls) ? calls : NULL;
    int n = 0;
    if (!one && !cJSON_IsArray(calls)) n = -1;
    for (x = one ? one : calls->child; n >= 0 && x; x = one ? NULL : x->next, n++) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(x, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(x, "arguments");
        if (!cJSON_IsObject(x) || !cJSON_IsString(name) || !args) {
            n = -1;
            break;
        }
        cJSON *call = cJSON_CreateObject(), *fn = NULL;
        if (!call || !cJSON_AddItemToArray(tc, call)) {
            cJSON_Delete(call);
            return ft_err(-ENOMEM, "out of memory");
        }
        cJSON *a = cJSON_Duplicate(args, 1);
        if (!a || !cJSON_AddStringToObject(call, "type", "function") ||
            !(fn = cJSON_AddObjectToObject(call, "function")) ||
            !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
            !cJSON_AddItemToObject(fn, "arguments", a)) {
            cJSON_Delete(a);
            return ft_err(-ENOMEM, "out of memory");
        }
    }
    if (n <= 0)
        return ft_err(FT_E_INVALID, "%s %lld: the function_call '%s' must be %s (a string "
                      "'name' and an 'arguments' in each)", where, (long long)i, key, FORM);
    *out = msg;
    return 0;
}

/* Appends a list of message objects with keys (role_key, content_key). */
static int add_list(msgs *v, const cJSON *list, const char *role_key, const char *content_key,
                    const char *where, int force_train, arena_blk **arena)
{
    if (!cJSON_IsArray(list))
        return ft_err(FT_E_INVALID, "'%s' must be a list of messages", where);
    int64_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, list) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, role_key);
        if (!cJSON_IsString(r))
            return ft_err(FT_E_INVALID, "%s %lld: needs a string '%s'", where, (long long)i, role_key);
        int role = role_of(r->valuestring);
        if (role < 0)
            return ft_err(FT_E_INVALID, "%s %lld: unknown role '%.40s' (expected system, user, "
                          "assistant or tool)", where, (long long)i, r->valuestring);
        /* "tool_calls" (OpenAI/TRL function calling): a list of call objects on an assistant
         * message, whose content may then be null or absent (""). The Jinja renderer passes
         * them to the model's template (ft_chat_msg.json). LLaMA-Factory's "function_call"
         * turns (the call as JSON text) become such messages (function_call_of) */
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        int calls = 0;
        if (tc && !cJSON_IsNull(tc)) {
            const cJSON *x;
            int objs = cJSON_IsArray(tc);
            if (objs) cJSON_ArrayForEach(x, tc) objs &= !!cJSON_IsObject(x);
            if (!objs || role != FT_ROLE_ASSISTANT)
                return ft_err(FT_E_INVALID, "%s %lld: 'tool_calls' must be a list of objects "
                              "({\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}) on "
                              "an assistant message", where, (long long)i);
            calls = 1;
        }
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, content_key);
        if (!c && !calls)
            return ft_err(FT_E_INVALID, "%s %lld: needs '%s'", where, (long long)i, content_key);
        const char *s = "";
        size_t n = 0;
        const cJSON *obj = m; /* the object the Jinja renderer sees */
        if (!calls && !strcmp(r->valuestring, "function_call"))
            FT_TRY(function_call_of(c, content_key, where, i, arena, &obj)); /* content "" */
        else if (c)
            FT_TRY(content_of(c, where, i, arena, &s, &n));
        int train = 1;
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(m, "weight"); /* OpenAI: 0 or 1 */
        if (cJSON_IsNumber(w) && w->valuedouble == 0) train = 0;
        if (force_train >= 0) train = force_train;
        FT_TRY(msgs_add(v, role, s, n, train));
        v->m[v->n - 1].json = obj; /* as written (or converted), for the Jinja renderer */
        /* "reasoning_content" (the field of Qwen3's template and of OpenAI-style APIs that
         * return reasoning, e.g. DeepSeek's and vLLM's): a string, or null for none */
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rc && !cJSON_IsNull(rc)) {
            if (role != FT_ROLE_ASSISTANT || !cJSON_IsString(rc))
                return ft_err(FT_E_INVALID, "%s %lld: 'reasoning_content' must be a string on an "
                              "assistant message", where, (long long)i);
            v->m[v->n - 1].reasoning = rc->valuestring;
            v->m[v->n - 1].reasoning_n = strlen(rc->valuestring);
        }
        i++;
    }
    return 0;
}

/* A record of a conversational schema (alpaca, messages, sharegpt, conversational
 * prompt/completion) as messages. */
static int to_messages(msgs *v, const cJSON *j, int format, arena_blk **arena, int prompt_only)
{
    const char *s, *in, *sys;
    size_t n, in_n, sys_n;
    switch (format) {
    case FT_DATA_ALPACA: {
        FT_TRY(opt_str(j, "system", "alpaca", &sys, &sys_n));
        if (sys && sys_n) FT_TRY(msgs_add(v, FT_ROLE_SYSTEM, sys, sys_n, 0));
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "history"); /* [[q, a], ...] */
        if (h && !cJSON_IsNull(h)) {
            if (!cJSON_IsArray(h))
                return ft_err(FT_E_INVALID, "alpaca record: 'history' must be a list of [query, response] pairs");
            const cJSON *pair;
            cJSON_ArrayForEach(pair, h) {
                const cJSON *q = cJSON_GetArrayItem(pair, 0), *a = cJSON_GetArrayItem(pair, 1);
                if (cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(q) || !cJSON_IsString(a))
                    return ft_err(FT_E_INVALID, "alpaca record: 'history' must be a list of [query, response] string pairs");
                FT_TRY(msgs_add(v, FT_ROLE_USER, q->valuestring, strlen(q->valuestring), 0));
                FT_TRY(msgs_add(v, FT_ROLE_ASSISTANT, a->valuestring, strlen(a->valuestring), 1));
            }
        }
        FT_TRY(get_str(j, "instruction", "alpaca", &s, &n));
        FT_TRY(opt_str(j, "input", "alpaca", &in, &in_n));
        FT_TRY(msgs_add(v, FT_ROLE_USER, s, n, 0));
        v->m[v->n - 1].input = in;
        v->m[v->n - 1].input_n = in_n;
        if (prompt_only) {
            FT_TRY(opt_str(j, "output", "alpaca", &s, &n));
            if (!s) return 0;
        } else {
            FT_TRY(get_str(j, "output", "alpaca", &s, &n));
        }
        return msgs_add(v, FT_ROLE_ASSISTANT, s, n, 1);
    }
    case FT_DATA_MESSAGES: {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!l) return ft_err(FT_E_INVALID, "messages record needs a 'messages' list");
        return add_list(v, l, "role", "content", "message", -1, arena);
    }
    case FT_DATA_SHAREGPT: {
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "conversations");
        if (!l) return ft_err(FT_E_INVALID, "sharegpt record needs a 'conversations' list");
        FT_TRY(opt_str(j, "system", "sharegpt", &sys, &sys_n));
        if (sys && sys_n) FT_TRY(msgs_add(v, FT_ROLE_SYSTEM, sys, sys_n, 0));
        return add_list(v, l, "from", "value", "conversation turn", -1, arena);
    }
    case FT_DATA_PROMPT_COMPLETION: {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "completion");
        FT_TRY(add_list(v, p, "role", "content", "prompt message", 0, arena));
        return add_list(v, c, "role", "content", "completion message", 1, arena);
    }
    }
    return ft_err(FT_E_INVALID, "schema %s has no messages", ft_data_format_name(format));
}

int ft_data_record_messages(const cJSON *rec, int format, int prompt_only, ft_data_msgs *out)
{
    memset(out, 0, sizeof *out);
    if (format == FT_DATA_AUTO) {
        format = detect_format(rec);
        if (prompt_only && (format < 0 || format == FT_DATA_TEXT) &&
            cJSON_GetObjectItemCaseSensitive(rec, "instruction"))
            format = FT_DATA_ALPACA;
    }
    if (format < 0 || format == FT_DATA_TEXT) {
        char keys[200];
        key_list(rec, keys, sizeof keys);
        return ft_err(FT_E_INVALID, "not a conversation: expected 'messages', 'conversations', "
                      "'instruction' or 'prompt' and 'completion' lists (keys %s)", keys);
    }
    msgs v = {0};
    arena_blk *arena = NULL;
    int rc = to_messages(&v, rec, format, &arena, prompt_only);
    out->m = v.m;
    out->n = v.n;
    out->cap = v.cap;
    out->arena = arena;
    out->format = format;
    return rc;
}

void ft_data_msgs_free(ft_data_msgs *v)
{
    if (!v) return;
    free(v->m);
    arena_free(v->arena);
    memset(v, 0, sizeof *v);
}

/* ---- tokenization with a mask ------------------------------------------------------------ */

/* Tokenizes t (segments flagged trained or not) and fills ex; tc: a word cache or NULL. */
static int encode_text(ft_example *ex, const ft_chat_text *t, int add_special, int train_all,
                       const ft_tokenizer *tok, ft_tok_cache *tc)
{
    int32_t *ids = NULL, *lab = NULL, *pre = NULL;
    int64_t n = 0, np;
    /* the prefixes below share the text's pieces up to each boundary: a memo encodes each
     * shared piece once (a conversation of k turns costs about two encodes, not k) */
    ft_tok_memo *memo = !train_all && t->n_seg > 1 && t->text ? ft_tok_memo_new() : NULL;
    int rc = ft_tok_encode_memo(tok, tc, memo, t->text ? t->text : "", t->n, add_special, &ids, &n);
    if (rc < 0) {
        ft_tok_memo_free(memo);
        return rc;
    }
    lab = malloc((size_t)(n ? n : 1) * sizeof *lab);
    if (!lab) {
        free(ids);
        ft_tok_memo_free(memo);
        return ft_err(-ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) lab[i] = train_all ? ids[i] : FT_IGNORE_INDEX;
    if (!train_all) {
        /* token index of each segment start; trained segments label [start_i, start_{i+1}) */
        int64_t prev = 0;
        for (int64_t s = 0; s < t->n_seg; s++) {
            int64_t end;
            if (s + 1 == t->n_seg) {
                end = n;
            } else {
                size_t b = t->seg[s + 1].off;
                rc = ft_tok_encode_memo(tok, tc, memo, t->text, b, add_special, &pre, &np);
                if (rc < 0) break;
                int64_t k = 0;
                while (k < np && k < n && pre[k] == ids[k]) k++;
                /* a token straddling the boundary (k < np: the prefix's last token merged
                 * with text after it) overlaps trained text on one side: it is trained,
                 * as in transformers' assistant mask (every token overlapping a trained
                 * character span) */
                if (k < np && k < n && t->seg[s].train) k++;
                free(pre);
                pre = NULL;
                end = k;
            }
            if (end < prev) end = prev;
            if (t->seg[s].train)
                for (int64_t i = prev; i < end; i++) lab[i] = ids[i];
            prev = end;
        }
    }
    ft_tok_memo_free(memo);
    if (rc < 0) {
        free(ids);
        free(lab);
        return rc;
    }
    ex->ids = ids;
    ex->labels = lab;
    ex->n = n;
    return 0;
}

/* Appends the tokenizer's EOS string unless s already ends with it (TRL, formats.md 8.2). */
static int put_with_eos(ft_chat_text *t, const char *s, size_t n, int train, const char *eos)
{
    FT_TRY(ft_chat_text_put(t, s, n, train));
    size_t e = strlen(eos);
    if (e && !(n >= e && !memcmp(s + n - e, eos, e))) FT_TRY(ft_chat_text_put(t, eos, e, train));
    return 0;
}

static int has_role(const ft_chat_msg *m, int64_t n, int role)
{
    for (int64_t i = 0; i < n; i++)
        if (m[i].role == role) return 1;
    return 0;
}

/* The record's "tools" (function schemas, formats.md 8.1) into *tools: NULL when absent or
 * null, else a list of objects: the record's own list, or, for LLaMA-Factory's form (its
 * data/README.md: "tools" as JSON text), the text parsed into a list owned by *arena, each
 * schema that is not {"type": "function", ...} wrapped as {"type": "function", "function":
 * schema} (as its Llama-3, Mistral and Qwen tool formatters do), and "" or "[]" meaning none
 * (its converter's "" default; its ToolFormatter writes nothing for an empty list). Returns 0,
 * -ENOMEM or FT_E_INVALID (naming 'tools'). */
static int tools_of(const cJSON *j, arena_blk **arena, const cJSON **tools)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tools"), *x;
    *tools = NULL;
    if (!t || cJSON_IsNull(t)) return 0;
    static const char FORM[] = "a list of function schemas (JSON objects, {\"type\": "
                               "\"function\", \"function\": {\"name\", \"description\", "
                               "\"parameters\"}})";
    if (cJSON_IsString(t)) {
        const char *p = t->valuestring;
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) return 0;
        size_t at;
        int nul;
        cJSON *l = parse_text(t->valuestring, &at, &nul);
        if (!l && nul)
            return ft_err(FT_E_INVALID, "'tools' (JSON text) at byte %zu: %s", at, FT_JSON_NUL_WHY);
        if (!l)
            return ft_err(FT_E_INVALID, "'tools' is a string that is not valid JSON (at byte %zu%s"
                          "%.24s%s); expected %s, or that list as JSON text", at,
                          t->valuestring[at] ? ": '" : ", the end", t->valuestring + at,
                          t->valuestring[at] ? "'" : "", FORM);
        FT_TRY(arena_keep(arena, l));
        int ok = cJSON_IsArray(l);
        if (ok) cJSON_ArrayForEach(x, l) ok &= !!cJSON_IsObject(x);
        if (!ok)
            return ft_err(FT_E_INVALID, "'tools' (JSON text) must be %s", FORM);
        if (!l->child) return 0;
        for (cJSON *s = l->child; s; s = s->next) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
            if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "function")) continue;
            /* wrap in place: s's items move into a new "function" object (on failure l, kept
             * by the arena, is left half-wrapped and the record fails) */
            cJSON *fn = cJSON_CreateObject();
            if (!fn) return ft_err(-ENOMEM, "out of memory");
            fn->child = s->child;
            s->child = NULL;
            if (!cJSON_AddStringToObject(s, "type", "function") ||
                !cJSON_AddItemToObject(s, "function", fn)) {
                cJSON_Delete(fn);
                return ft_err(-ENOMEM, "out of memory");
            }
        }
        *tools = l;
        return 0;
    }
    int ok = cJSON_IsArray(t);
    if (ok) cJSON_ArrayForEach(x, t) ok &= !!cJSON_IsObject(x);
    if (!ok) return ft_err(FT_E_INVALID, "'tools' must be %s, or that list as JSON text", FORM);
    *tools = t;
    return 0;
}

/* The template for a conversation with tools or tool calls (ft_chat_uses_tools), which no
 * built-in renderer writes: tmpl when it is the Jinja engine; the model's own template
 * (FT_CHAT_JINJA) when tmpl is the built-in renderer detected for it (the built-ins give
 * its text where they overlap); else FT_E_INVALID: no chat_template, or a forced built-in
 * (Alpaca included) that is not the model's format. */
static int tools_template(int tmpl, const ft_tokenizer *tok, int *out)
{
    *out = tmpl;
    if (tmpl == FT_CHAT_JINJA) return 0;
    if (!ft_tok_chat_template(tok))
        return ft_err(FT_E_INVALID, "the record has 'tools' or 'tool_calls', which the %s "
                      "template does not write, and the tokenizer has no chat_template that "
                      "could (use a tokenizer whose chat_template writes tools; --chat-template "
                      "jinja renders with it)", ft_chat_template_name(tmpl));
    if (ft_chat_template_detect(tok) != tmpl)
        return ft_err(FT_E_INVALID, "the record has 'tools' or 'tool_calls', which the built-in "
                      "%s template does not write; --chat-template auto or jinja renders them "
                      "with the model's own chat_template", ft_chat_template_name(tmpl));
    *out = FT_CHAT_JINJA;
    return 0;
}

int ft_chat_template_for(const ft_tokenizer *tok, int tmpl, const ft_chat_msg *m, int64_t n,
                         const ft_chat_ctx *ctx, int *out)
{
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    *out = tmpl;
    /* tools and tool calls: the model's own template, as no built-in writes them */
    if (ft_chat_uses_tools(m, n, ctx)) return tools_template(tmpl, tok, out);
    /* tool results: the built-in ChatML renderer writes plain <|im_start|>tool turns, but a
     * detected ChatML template may write them otherwise (Qwen2.5: <tool_response> in a user
     * turn), so those conversations take the model's own template too */
    if (tmpl == FT_CHAT_CHATML && has_role(m, n, FT_ROLE_TOOL) && ft_tok_chat_template(tok) &&
        ft_chat_template_detect(tok) == tmpl)
        *out = FT_CHAT_JINJA;
    return 0;
}

int ft_data_record_tools(const cJSON *rec, cJSON **tools)
{
    arena_blk *arena = NULL;
    const cJSON *t = NULL;
    *tools = NULL;
    int rc = tools_of(rec, &arena, &t);
    if (!rc && t && !(*tools = cJSON_Duplicate(t, 1))) rc = ft_err(-ENOMEM, "out of memory");
    arena_free(arena);
    return rc;
}

/* Renders and tokenizes record j of schema `format` into *ex. last_only = 1 (preference
 * records of LLaMA-Factory's schemas, pref.h): of a conversation only the final message is
 * trained, the earlier answers being prompt; 0 for every SFT record. */
static int encode_json(ft_example *ex, const cJSON *j, int format, int tmpl, int train_on_prompt,
                       int last_only, const ft_tokenizer *tok, ft_tok_cache *tc)
{
    memset(ex, 0, sizeof *ex);
    if (!cJSON_IsObject(j)) return ft_err(FT_E_INVALID, "a record must be a JSON object");
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    ft_chat_ctx ctx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), ft_tok_chat_template(tok)};
    ft_chat_text t = {0};
    msgs v = {0};
    arena_blk *arena = NULL;
    int rc = 0, add_special = 0;
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (format == FT_DATA_TEXT) {
        const char *s;
        size_t n;
        rc = get_str(j, "text", "text", &s, &n);
        if (!rc) rc = put_with_eos(&t, s, n, 1, ctx.eos);
        add_special = 1;
    } else if (format == FT_DATA_PROMPT_COMPLETION && cJSON_IsString(pc)) {
        /* plain prompt/completion: prompt + completion + eos, completion trained (TRL) */
        const char *p, *c;
        size_t pn, cn;
        rc = get_str(j, "prompt", "prompt-completion", &p, &pn);
        if (!rc) rc = get_str(j, "completion", "prompt-completion", &c, &cn);
        if (!rc) rc = ft_chat_text_put(&t, p, pn, 0);
        if (!rc) rc = put_with_eos(&t, c, cn, 1, ctx.eos);
        add_special = 1;
    } else {
        const cJSON *tools = NULL;
        rc = tools_of(j, &arena, &tools);
        ctx.tools = tools;
        if (!rc) rc = to_messages(&v, j, format, &arena, 0);
        if (!rc && v.n == 0) rc = ft_err(FT_E_INVALID, "the conversation has no messages");
        if (!rc && last_only)
            for (int64_t i = 0; i + 1 < v.n; i++) v.m[i].train = 0;
        if (!rc) rc = ft_chat_template_for(tok, tmpl, v.m, v.n, &ctx, &tmpl);
        if (!rc) rc = ft_chat_render(&t, tmpl, v.m, v.n, &ctx);
        /* chat templates write BOS themselves; the Alpaca prompt relies on the tokenizer's
         * post-processor (add_special_tokens=True), as Stanford Alpaca's train.py does */
        add_special = tmpl == FT_CHAT_ALPACA;
    }
    if (!rc) {
        int any = 0;
        for (int64_t s = 0; s < t.n_seg; s++) any |= t.seg[s].train;
        if (!any && !train_on_prompt)
            rc = ft_err(FT_E_INVALID, "nothing to train on (no assistant or completion text)");
    }
    if (!rc) rc = encode_text(ex, &t, add_special, train_on_prompt, tok, tc);
    ft_chat_text_free(&t);
    free(v.m);
    arena_free(arena);
    return rc;
}

int ft_dataset_encode_record(ft_example *ex, const char *record_json, int format,
                             int chat_template, int train_on_prompt, const ft_tokenizer *tok)
{
    size_t z = ft_json_find_nul(record_json, strlen(record_json));
    if (record_json[z]) return ft_err(FT_E_INVALID, "byte %zu: %s", z, FT_JSON_NUL_WHY);
    cJSON *j = cJSON_Parse(record_json);
    if (!j) return ft_err(FT_E_INVALID, "malformed JSON record");
    if (format == FT_DATA_AUTO) format = detect_format(j);
    int rc;
    if (format < 0) {
        char keys[200];
        key_list(j, keys, sizeof keys);
        rc = ft_err(FT_E_INVALID, "unknown data schema (keys %s)", keys);
    } else {
        rc = encode_json(ex, j, format, chat_template, train_on_prompt, 0, tok, NULL);
    }
    cJSON_Delete(j);
    return rc;
}

/* ---- the whole file ------------------------------------------------------------------------ */

static void example_free(ft_example *e)
{
    free(e->ids);
    free(e->labels);
    memset(e, 0, sizeof *e);
}

void ft_dataset_free(ft_dataset *ds)
{
    if (!ds) return;
    for (int64_t i = 0; i < ds->n_train; i++) example_free(&ds->train[i]);
    for (int64_t i = 0; i < ds->n_eval; i++) example_free(&ds->eval[i]);
    free(ds->train);
    free(ds->eval);
    free(ds->files);
    memset(ds, 0, sizeof *ds);
}

/* Trained positions of an example after the next-token shift (labels[1..n)). */
static int64_t n_trained(const ft_example *e)
{
    int64_t k = 0;
    for (int64_t i = 1; i < e->n; i++) k += e->labels[i] != FT_IGNORE_INDEX;
    return k;
}

/* A growing list of examples (the union of the files, in the order read). */
typedef struct ex_vec {
    ft_example *v;
    int64_t n, cap;
} ex_vec;

static void ex_vec_truncate(ex_vec *x, int64_t n)
{
    for (int64_t i = n; i < x->n; i++) example_free(&x->v[i]);
    x->n = n;
}

static int ex_vec_push(ex_vec *x, const ft_example *e, int64_t k)
{
    if (x->n + k > x->cap) {
        int64_t nc = x->cap ? 2 * x->cap : 256;
        ft_example *p = realloc(x->v, (size_t)nc * sizeof *p);
        if (!p) return ft_err(-ENOMEM, "out of memory");
        x->v = p;
        x->cap = nc;
    }
    memcpy(x->v + x->n, e, (size_t)k * sizeof *e);
    x->n += k;
    return 0;
}

/* Encodes one record into *e and applies seq_len: returns 1 when e is usable, 0 when it was
 * dropped (no trained token within seq_len; freed), < 0 on error (e freed). *cut: 1 when it
 * was truncated to seq_len (dropped or not). */
static int encode_one(ft_example *e, const cJSON *json, int format, int tmpl,
                      const ft_data_cfg *cfg, const ft_tokenizer *tok, ft_tok_cache *tc, int *cut)
{
    *cut = 0;
    int rc = encode_json(e, json, format, tmpl, cfg->train_on_prompt, 0, tok, tc);
    if (rc < 0) return rc;
    if (e->n > cfg->seq_len) {
        e->n = cfg->seq_len;
        e->truncated = 1;
        *cut = 1;
    }
    if (n_trained(e) == 0) { /* the response starts beyond seq_len */
        example_free(e);
        return 0;
    }
    return 1;
}

/* ---- preference pairs (pref.h) ------------------------------------------------------------ */

/* One preference record into e[0] (prompt + chosen) and e[1] (prompt + rejected), each the
 * SFT encoding of its side's record (pref.h; labels on the completion only), not truncated.
 * *format (may be NULL) gets the SFT schema of the sides. Returns 0, -ENOMEM, FT_E_INVALID
 * (the message names the side, "chosen: ..."); e[] is zeroed on error. */
static int encode_pair_raw(ft_example e[2], const cJSON *json, int tmpl, const ft_tokenizer *tok,
                           ft_tok_cache *tc, int *format)
{
    ft_pref_rec pr;
    memset(e, 0, 2 * sizeof *e);
    int rc = ft_pref_split(json, &pr);
    for (int s = 0; s < 2 && !rc; s++) {
        rc = encode_json(&e[s], pr.side[s], pr.format, tmpl, 0, pr.last_only, tok, tc);
        if (rc < 0 && rc != -ENOMEM) rc = ft_err_prefix(rc, "%s", s ? "rejected" : "chosen");
    }
    if (!rc && format) *format = pr.format;
    ft_pref_rec_free(&pr);
    if (rc < 0) {
        example_free(&e[0]);
        example_free(&e[1]);
    }
    return rc;
}

int ft_dataset_encode_pair(ft_example ex[2], const char *record_json, int chat_template,
                           const ft_tokenizer *tok)
{
    memset(ex, 0, 2 * sizeof *ex);
    size_t z = ft_json_find_nul(record_json, strlen(record_json));
    if (record_json[z]) return ft_err(FT_E_INVALID, "byte %zu: %s", z, FT_JSON_NUL_WHY);
    cJSON *j = cJSON_Parse(record_json);
    if (!j) return ft_err(FT_E_INVALID, "malformed JSON record");
    if (chat_template == FT_CHAT_AUTO) chat_template = ft_chat_template_detect(tok);
    int rc = encode_pair_raw(ex, j, chat_template, tok, NULL, NULL);
    cJSON_Delete(j);
    return rc;
}

/* encode_pair_raw, then seq_len applied to each side: returns 1 when the pair is usable, 0
 * when it was dropped (either side without a trained token within seq_len; both freed), < 0
 * on error (e[] freed). *cut: 1 when either side was cut. */
static int encode_pair(ft_example e[2], const cJSON *json, int tmpl, const ft_data_cfg *cfg,
                       const ft_tokenizer *tok, ft_tok_cache *tc, int *format, int *cut)
{
    *cut = 0;
    int rc = encode_pair_raw(e, json, tmpl, tok, tc, format);
    if (rc < 0) return rc;
    int empty = 0;
    for (int s = 0; s < 2; s++) {
        if (e[s].n > cfg->seq_len) {
            e[s].n = cfg->seq_len;
            e[s].truncated = 1;
            *cut = 1;
        }
        empty |= n_trained(&e[s]) == 0;
    }
    if (empty) {
        example_free(&e[0]);
        example_free(&e[1]);
        return 0;
    }
    return 1;
}

/* ---- a file, in chunks of records encoded in parallel ------------------------------------- */

#define CHUNK_RECORDS 512      /* records read, then encoded together */
#define CACHE_WORDS 16384      /* per thread (tokenizer.h ft_tok_cache) */

/* One record of a chunk: read in order, encoded by any thread, taken in order. */
typedef struct rec_job {
    cJSON *own;                /* a JSONL line's tree (owned); NULL for an array element */
    const cJSON *json;         /* NULL: the line is not valid JSON (err says why) */
    int64_t loc;
    char err[160];
    int checked;               /* 1: the malformed/duplicate-key check ran (rc says) */
    int rc, cut, format;       /* encode_one / encode_pair's result; format: a pair's schema */
    char *msg;                 /* rc < 0: the message, "FILE: line N: ..." */
    ft_example e[2];
} rec_job;

typedef struct file_ctx {
    ft_records *rr;
    const ft_data_cfg *cfg;
    int tmpl, format;
    const ft_tokenizer *tok;
} file_ctx;

static void job_fail(rec_job *j, int rc)
{
    j->rc = rc;
    j->msg = strdup(ft_errmsg());
    if (!j->msg) j->rc = -ENOMEM;
}

/* The record's own faults: not JSON, or a key twice in one object. */
static void job_check(const file_ctx *f, rec_job *j)
{
    char where[4300];
    int oom = 0;
    j->checked = 1;
    j->rc = 0;
    ft_records_where(f->rr, j->loc, where, sizeof where);
    const char *dup = j->json ? ft_json_dup_key(j->json, 1, &oom) : NULL;
    if (!j->json) {
        job_fail(j, ft_err(FT_E_INVALID, "%s: %s", where, j->err));
    } else if (oom) {
        job_fail(j, ft_err(-ENOMEM, "%s: out of memory", where));
    } else if (dup) {
        /* Hugging Face datasets reads the record with Python's json: the last one counts */
        job_fail(j, ft_err(FT_E_INVALID, "%s: key '%.64s' appears twice in one object: JSON "
                           "readers differ on which one counts (Python's json, as Hugging Face "
                           "datasets, takes the last); give it once", where, dup));
    }
}

static void job_encode(const file_ctx *f, rec_job *j, ft_tok_cache *tc)
{
    if (!j->checked) job_check(f, j);
    if (j->rc < 0) return;
    int rc = f->cfg->preference
                 ? encode_pair(j->e, j->json, f->tmpl, f->cfg, f->tok, tc, &j->format, &j->cut)
                 : encode_one(&j->e[0], j->json, f->format, f->tmpl, f->cfg, f->tok, tc, &j->cut);
    if (rc < 0 && rc != -ENOMEM) {
        char where[4300];
        ft_records_where(f->rr, j->loc, where, sizeof where);
        rc = ft_err_prefix(rc, "%s", where);
    }
    if (rc < 0) job_fail(j, rc);
    else j->rc = rc;
}

static void job_free(rec_job *j)
{
    cJSON_Delete(j->own);
    free(j->msg);
    example_free(&j->e[0]);
    example_free(&j->e[1]);
    memset(j, 0, sizeof *j);
}

/* The schema of an SFT file whose format is auto: from its first record that passes
 * job_check (the caller has run it on j). Returns 0 (f->format and fs->format set) or the
 * unknown schema's error, which ends the file whatever --skip-bad-records says. */
static int detect_file_format(file_ctx *f, const rec_job *j, ft_data_file *fs)
{
    int fm = detect_format(j->json);
    if (fm >= 0) {
        f->format = fs->format = fm;
        return 0;
    }
    char keys[200], where[4300];
    key_list(j->json, keys, sizeof keys);
    ft_records_where(f->rr, j->loc, where, sizeof where);
    int pair = cJSON_IsObject(j->json) && cJSON_GetObjectItemCaseSensitive(j->json, "chosen") &&
               cJSON_GetObjectItemCaseSensitive(j->json, "rejected");
    return ft_err(FT_E_INVALID, "%s: unknown data schema (keys %s); expected alpaca "
                  "(instruction/input/output), messages, sharegpt (conversations), "
                  "prompt/completion or text, or name one with --data-format%s", where, keys,
                  pair ? " (chosen/rejected: a preference record; train on it with --method dpo)" : "");
}

/* Job j's outcome, in file order: appended to *x with its origin (file index, record
 * index, JSONL line or 0), or (past keep_max usable examples of this file, keep_max > 0) freed and counted in
 * fs->n_over_cap; counted as truncated/dropped. Returns 0 or j's error (re-raised here; the
 * caller skips or stops). */
static int job_take(rec_job *j, const ft_data_cfg *cfg, int64_t n0, int64_t keep_max,
                    ft_data_file *fs, ex_vec *x, int32_t file, int64_t record, int64_t line)
{
    if (j->rc < 0) return ft_err(j->rc, "%s", j->msg ? j->msg : "out of memory");
    const int k = cfg->preference ? 2 : 1;
    if (cfg->preference && fs->format == FT_DATA_AUTO) fs->format = j->format;
    fs->n_truncated += j->cut;
    if (j->rc == 0) {
        fs->n_dropped++;
        return 0;
    }
    if (keep_max > 0 && x->n - n0 == k * keep_max) { /* beyond the cap: checked, then freed */
        fs->n_over_cap += k;
        return 0;
    }
    for (int q = 0; q < k; q++) {
        j->e[q].file = file;
        j->e[q].record = record;
        j->e[q].line = line;
    }
    FT_TRY(ex_vec_push(x, j->e, k));
    memset(j->e, 0, sizeof j->e); /* x owns them now */
    return 0;
}

/* Reads path (file: its index in the caller's list, each example's ft_example.file) into
 * examples appended to *x: schema detection (from this file's first record
 * unless cfg->format forces one), the resolved chat template tmpl, masks, truncation to
 * cfg->seq_len, bad records skipped and counted when cfg->skip_bad_records. *fs gets this
 * file's counts and schema. keep_max > 0: only the first keep_max usable examples are kept;
 * the records after them are still read, encoded and checked (an error there is reported,
 * or skipped and counted, as for the kept ones), then freed and counted in fs->n_over_cap.
 * Records are read in chunks and each chunk is encoded by all OpenMP threads (one word cache
 * each), then taken in file order, so the examples, counts and the error reported (the first
 * in the file) are those of reading one record at a time. On error the examples this call
 * appended are freed (x->n is as on entry); fs's counts say how far it got. */
static int read_file(const char *path, int32_t file, const ft_data_cfg *cfg, int tmpl,
                     const ft_tokenizer *tok, int64_t keep_max, ft_data_file *fs, ex_vec *x)
{
    memset(fs, 0, sizeof *fs);
    ft_records rr;
    FT_TRY(ft_records_open(&rr, path));
    file_ctx f = {&rr, cfg, tmpl, cfg->format, tok};
    fs->format = cfg->format;
    const int64_t n0 = x->n;
    const int nt = omp_get_max_threads();
    rec_job *jobs = calloc(CHUNK_RECORDS, sizeof *jobs);
    ft_tok_cache **tc = calloc((size_t)nt, sizeof *tc);
    int rc = jobs && tc ? 0 : ft_err(-ENOMEM, "out of memory");
    for (int i = 0; i < nt && !rc; i++)
        if (!(tc[i] = ft_tok_cache_new(CACHE_WORDS))) rc = ft_err(-ENOMEM, "out of memory");
    int done = 0;
    while (!rc && !done) {
        /* an SFT file of auto schema: one record at a time until the first good one names it */
        const int cap = f.format == FT_DATA_AUTO && !cfg->preference ? 1 : CHUNK_RECORDS;
        int n = 0;
        while (n < cap) {
            ft_record rec;
            int got = ft_records_next(&rr, &rec);
            if (got < 0) { rc = got; break; }
            if (got == 0) { done = 1; break; }
            rec_job *j = &jobs[n++];
            j->own = ft_records_take(&rr);
            j->json = rec.json;
            j->loc = rec.loc;
            snprintf(j->err, sizeof j->err, "%s", rec.err);
        }
        if (!rc && n == 1 && cap == 1) {
            job_check(&f, &jobs[0]);
            if (jobs[0].rc == 0) {
                rc = detect_file_format(&f, &jobs[0], fs);
                if (rc) fs->n_records++; /* fatal: the schema comes from this record */
            }
        }
        if (!rc) {
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
            for (int i = 0; i < n; i++) job_encode(&f, &jobs[i], tc[omp_get_thread_num()]);
        }
        for (int i = 0; i < n; i++) {
            if (!rc) {
                fs->n_records++;
                rc = job_take(&jobs[i], cfg, n0, keep_max, fs, x, file, fs->n_records - 1,
                              rr.is_array ? 0 : jobs[i].loc);
                if (rc < 0 && rc != -ENOMEM && cfg->skip_bad_records) {
                    fs->n_skipped++;
                    rc = 0;
                }
            }
            job_free(&jobs[i]);
        }
    }
    for (int i = 0; tc && i < nt; i++) ft_tok_cache_free(tc[i]);
    free(tc);
    free(jobs);
    ft_records_close(&rr);
    fs->n_examples = x->n - n0;
    if (rc == 0 && fs->n_records == 0)
        rc = ft_err(FT_E_INVALID, "%s: no records (the file is empty or blank)", ft_input_name(path));
    if (rc == 0 && fs->n_examples == 0)
        rc = ft_err(FT_E_INVALID, "%s: no usable records (%lld read, %lld skipped as bad, "
                    "%lld without a trained token in the first %lld tokens)", ft_input_name(path),
                    (long long)fs->n_records, (long long)fs->n_skipped, (long long)fs->n_dropped,
                    (long long)cfg->seq_len);
    if (rc < 0) {
        ex_vec_truncate(x, n0);
        fs->n_examples = 0;
        return rc;
    }
    if (fs->format == FT_DATA_AUTO) fs->format = f.format;
    return 0;
}

/* Reads paths[0..n_paths) in order into one list *x (see read_file; keep_max applies to
 * each file, ft_dataset_load_eval's single one) and fills ds's files, counts (sums over the
 * files), format (the common one, FT_DATA_AUTO when they differ) and template. On error
 * frees everything and clears ds but for n_records. */
static int read_files(ft_dataset *ds, const char *const *paths, int64_t n_paths,
                      const ft_data_cfg *cfg, const ft_tokenizer *tok, int64_t keep_max,
                      ex_vec *x)
{
    memset(x, 0, sizeof *x);
    if (n_paths < 1 || !paths) return ft_err(FT_E_INVALID, "no data file given");
    if (n_paths > INT32_MAX) return ft_err(FT_E_RANGE, "%lld data files (at most %d)", (long long)n_paths, INT32_MAX);
    for (int64_t i = 0; i < n_paths; i++)
        if (!paths[i] || !*paths[i]) return ft_err(FT_E_INVALID, "data file %lld: empty name", (long long)i + 1);
    if (cfg->preference && cfg->format != FT_DATA_AUTO)
        return ft_err(FT_E_INVALID, "preference data: the schema is read from each record "
                      "(prompt/chosen/rejected, chosen/rejected, or LLaMA-Factory's pairwise "
                      "alpaca/sharegpt); a forced data format (--data-format %s) does not apply",
                      ft_data_format_name(cfg->format));
    if (cfg->preference && cfg->train_on_prompt)
        return ft_err(FT_E_INVALID, "preference data: the loss is on the completions only; "
                      "train-on-prompt does not apply");
    ds->files = calloc((size_t)n_paths, sizeof *ds->files);
    if (!ds->files) return ft_err(-ENOMEM, "out of memory");
    ds->n_files = n_paths;
    int tmpl = cfg->chat_template;
    if (tmpl == FT_CHAT_AUTO) tmpl = ft_chat_template_detect(tok);
    ds->chat_template = tmpl;
    int rc = 0;
    for (int64_t i = 0; i < n_paths && !rc; i++) {
        ft_data_file *fs = &ds->files[i];
        rc = read_file(paths[i], (int32_t)i, cfg, tmpl, tok, keep_max, fs, x);
        ds->n_records += fs->n_records;
        ds->n_skipped += fs->n_skipped;
        ds->n_truncated += fs->n_truncated;
        ds->n_dropped += fs->n_dropped;
        ds->eval_capped += fs->n_over_cap;
        if (!rc) ds->format = i == 0 || ds->format == fs->format ? fs->format : FT_DATA_AUTO;
    }
    if (rc < 0) {
        ex_vec_truncate(x, 0);
        free(x->v);
        memset(x, 0, sizeof *x);
        int64_t nr = ds->n_records;
        free(ds->files);
        memset(ds, 0, sizeof *ds);
        ds->n_records = nr;
    }
    return rc;
}

int ft_dataset_load_files(ft_dataset *ds, const char *const *paths, int64_t n_paths,
                          const ft_data_cfg *cfg, const ft_tokenizer *tok)
{
    memset(ds, 0, sizeof *ds);
    if (cfg->eval_fraction < 0 || cfg->eval_fraction > 0.5 || cfg->eval_fraction != cfg->eval_fraction)
        return ft_err(FT_E_RANGE, "eval fraction %g outside [0, 0.5]", cfg->eval_fraction);
    if (cfg->seq_len < 2) return ft_err(FT_E_RANGE, "sequence length %lld < 2", (long long)cfg->seq_len);
    ex_vec x;
    FT_TRY(read_files(ds, paths, n_paths, cfg, tok, 0, &x));
    ft_example *all = x.v;
    int64_t n = x.n;

    /* deterministic shuffle (Fisher-Yates) of the union, then the first n_eval are held out;
     * preference data moves whole pairs (units of 2 examples: eval_fraction and eval_max
     * count pairs) */
    const int64_t per = cfg->preference ? 2 : 1, nu = n / per;
    int64_t n_eval = 0;
    if (!cfg->no_shuffle) {
        ft_rng g;
        ft_rng_seed(&g, cfg->seed ^ 0x5eedda7a5e7ull);
        for (int64_t i = nu - 1; i > 0; i--) {
            int64_t k = (int64_t)(ft_rng_next(&g) % (uint64_t)(i + 1));
            for (int64_t q = 0; q < per; q++) {
                ft_example tmp = all[i * per + q];
                all[i * per + q] = all[k * per + q];
                all[k * per + q] = tmp;
            }
        }
        if (cfg->eval_fraction > 0 && nu >= 2) {
            n_eval = (int64_t)(cfg->eval_fraction * (double)nu + 0.5);
            if (n_eval < 1) n_eval = 1;
            if (cfg->eval_max > 0 && n_eval > cfg->eval_max) n_eval = cfg->eval_max;
            if (n_eval > nu - 1) n_eval = nu - 1;
        }
        n_eval *= per;
    }
    ds->n_eval = n_eval;
    ds->n_train = n - n_eval;
    ds->eval = n_eval ? malloc((size_t)n_eval * sizeof *ds->eval) : NULL;
    ds->train = malloc((size_t)ds->n_train * sizeof *ds->train);
    if ((n_eval && !ds->eval) || !ds->train) {
        for (int64_t i = 0; i < n; i++) example_free(&all[i]);
        free(all);
        free(ds->eval);
        free(ds->train);
        free(ds->files);
        memset(ds, 0, sizeof *ds);
        return ft_err(-ENOMEM, "%s: out of memory", paths[0]);
    }
    if (n_eval) memcpy(ds->eval, all, (size_t)n_eval * sizeof *all);
    memcpy(ds->train, all + n_eval, (size_t)ds->n_train * sizeof *all);
    free(all);
    return 0;
}

int ft_dataset_load(ft_dataset *ds, const char *path, const ft_data_cfg *cfg,
                    const ft_tokenizer *tok)
{
    return ft_dataset_load_files(ds, &path, 1, cfg, tok);
}

int ft_dataset_load_eval(ft_dataset *ds, const char *path, const ft_data_cfg *cfg,
                         const ft_tokenizer *tok)
{
    memset(ds, 0, sizeof *ds);
    if (cfg->seq_len < 2) return ft_err(FT_E_RANGE, "sequence length %lld < 2", (long long)cfg->seq_len);
    ex_vec x;
    FT_TRY(read_files(ds, &path, 1, cfg, tok, cfg->eval_max, &x));
    ds->eval = x.v; /* file order: no shuffle, nothing trains */
    ds->n_eval = x.n;
    return 0;
}
