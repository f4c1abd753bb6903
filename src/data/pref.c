/* pref.c - preference records to a prompt and two completions, each side written as the SFT
 * record that encodes it (pref.h). Follows TRL 1.16: data_utils.py is_conversational,
 * extract_prompt, maybe_extract_prompt and DPOTrainer._prepare_dataset (prompt extraction
 * when the first record has no "prompt"; here decided per record), and LLaMA-Factory's
 * pairwise ("ranking") alpaca and sharegpt converters (data/README.md "Preference Dataset").
 *
 * The side records are new cJSON objects whose items are references to the input record's
 * values (cJSON_AddItemReferenceToObject/Array) or new strings (an extracted string prompt
 * and completions), so nothing of the record is copied.
 */
#include "src/data/pref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/json.h"
#include "src/data/dataset.h"

void ft_pref_rec_free(ft_pref_rec *p)
{
    if (!p) return;
    cJSON_Delete(p->side[1]); /* may hold references to side[0]'s new strings */
    cJSON_Delete(p->side[0]);
    memset(p, 0, sizeof *p);
}

/* The kind of a TRL value: 1 a string, 2 a list (of messages), 0 anything else. */
enum { KIND_NONE = 0, KIND_STR = 1, KIND_LIST = 2 };
static int kind_of(const cJSON *v)
{
    if (cJSON_IsString(v)) return KIND_STR;
    if (cJSON_IsArray(v)) return KIND_LIST;
    return KIND_NONE;
}

/* A TRL completion or prompt: a string, or a list of message objects; an empty list is
 * refused for chosen/rejected (nothing to compare or train). */
static int check_trl_value(const cJSON *v, const char *key, int allow_empty)
{
    int k = kind_of(v);
    if (k == KIND_NONE)
        return ft_err(FT_E_INVALID, "'%s' must be a string or a list of messages (found %s)", key,
                      ft_json_type(v));
    if (k == KIND_LIST) {
        if (!v->child && !allow_empty)
            return ft_err(FT_E_INVALID, "'%s' is an empty list of messages", key);
        int64_t i = 0;
        for (const cJSON *m = v->child; m; m = m->next, i++)
            if (!cJSON_IsObject(m))
                return ft_err(FT_E_INVALID, "'%s' message %lld is %s, not a message object "
                              "({\"role\", \"content\"})", key, (long long)i, ft_json_type(m));
    }
    return 0;
}

size_t ft_pref_common_prefix(const char *a, size_t an, const char *b, size_t bn)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t n = an < bn ? an : bn, k = 0;
    while (k < n && x[k] == y[k]) k++;
    if (k == n) {
        /* no difference within the shorter: TRL's loop ends with its index on the shorter's
         * last character (code point), without the space step */
        if (n == 0) return 0;
        k = n - 1;
        while (k > 0 && (x[k] & 0xC0) == 0x80) k--;
        return k;
    }
    /* back to the first byte of the code point where they differ */
    while (k > 0 && ((x[k] & 0xC0) == 0x80 || (y[k] & 0xC0) == 0x80)) k--;
    if (k > 0 && x[k - 1] == ' ') k--;
    return k;
}

/* extract_prompt on message lists: the first index where the messages differ (compared as
 * whole JSON values, as Python compares dicts); when none differs within the shorter list,
 * its last index (TRL's loop variable). */
static int64_t list_common_prefix(const cJSON *a, const cJSON *b)
{
    int64_t na = cJSON_GetArraySize(a), nb = cJSON_GetArraySize(b), n = na < nb ? na : nb, k = 0;
    const cJSON *x = a->child, *y = b->child;
    while (k < n && cJSON_Compare(x, y, 1)) {
        k++;
        x = x->next;
        y = y->next;
    }
    if (k == n && n > 0) k = n - 1;
    return k;
}

/* A new list holding references to the items [from, to) of list l. */
static cJSON *list_slice(const cJSON *l, int64_t from, int64_t to)
{
    cJSON *out = cJSON_CreateArray();
    if (!out) return NULL;
    int64_t i = 0;
    for (cJSON *m = l->child; m; m = m->next, i++) {
        if (i < from || i >= to) continue;
        if (!cJSON_AddItemReferenceToArray(out, m)) {
            cJSON_Delete(out);
            return NULL;
        }
    }
    return out;
}

static int add_ref(cJSON *o, const char *key, const cJSON *v)
{
    if (!v) return 0;
    if (!cJSON_AddItemReferenceToObject(o, key, (cJSON *)v)) return ft_err(-ENOMEM, "out of memory");
    return 0;
}

/* Takes item v (NULL: out of memory) into o under key. */
static int add_new(cJSON *o, const char *key, cJSON *v)
{
    if (!v || !cJSON_AddItemToObject(o, key, v)) {
        cJSON_Delete(v);
        return ft_err(-ENOMEM, "out of memory");
    }
    return 0;
}

/* The two sides {"prompt", "completion", "tools"?} of a TRL record: prompt p (a new item
 * taken by side 0, or NULL to reference rec_prompt), completions c and r (new items, or NULL
 * to reference rec_c/rec_r). Sets out->prompt/chosen/rejected to the items in the sides. */
static int trl_sides(ft_pref_rec *out, const cJSON *rec, cJSON *p, cJSON *c, cJSON *r,
                     const cJSON *rec_prompt, const cJSON *rec_c, const cJSON *rec_r)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(rec, "tools");
    int rc = 0;
    for (int s = 0; s < 2; s++)
        if (!(out->side[s] = cJSON_CreateObject())) rc = ft_err(-ENOMEM, "out of memory");
    if (!rc) rc = p ? add_new(out->side[0], "prompt", p) : add_ref(out->side[0], "prompt", rec_prompt);
    else cJSON_Delete(p);
    if (!rc) out->prompt = cJSON_GetObjectItemCaseSensitive(out->side[0], "prompt");
    if (!rc) rc = add_ref(out->side[1], "prompt", out->prompt);
    if (!rc) rc = c ? add_new(out->side[0], "completion", c) : add_ref(out->side[0], "completion", rec_c);
    else cJSON_Delete(c);
    if (!rc) rc = r ? add_new(out->side[1], "completion", r) : add_ref(out->side[1], "completion", rec_r);
    else cJSON_Delete(r);
    for (int s = 0; s < 2 && !rc; s++) rc = add_ref(out->side[s], "tools", tools);
    if (!rc) {
        out->chosen = cJSON_GetObjectItemCaseSensitive(out->side[0], "completion");
        out->rejected = cJSON_GetObjectItemCaseSensitive(out->side[1], "completion");
    }
    return rc;
}

static int split_trl(const cJSON *rec, const cJSON *c, const cJSON *r, ft_pref_rec *out)
{
    FT_TRY(check_trl_value(c, "chosen", 0));
    FT_TRY(check_trl_value(r, "rejected", 0));
    int kc = kind_of(c), kr = kind_of(r);
    if (kc != kr)
        return ft_err(FT_E_INVALID, "'chosen' is %s but 'rejected' is %s: both must be strings "
                      "or both lists of messages", kc == KIND_STR ? "a string" : "a list of messages",
                      kr == KIND_STR ? "a string" : "a list of messages");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
    if (cJSON_IsNull(p)) p = NULL;
    if (p) FT_TRY(check_trl_value(p, "prompt", 1));
    out->format = FT_DATA_PROMPT_COMPLETION;
    out->conversational = kc == KIND_LIST;
    if (p && kind_of(p) == kc) { /* explicit prompt of the same kind: as written */
        out->schema = FT_PREF_TRL;
        return trl_sides(out, rec, NULL, NULL, NULL, p, c, r);
    }
    /* implicit: the prompt is inside chosen and rejected (a "prompt" of the other kind is
     * ignored, as maybe_extract_prompt ignores it) */
    out->schema = FT_PREF_TRL_IMPLICIT;
    cJSON *np = NULL, *nc = NULL, *nr = NULL;
    if (kc == KIND_STR) {
        const char *a = c->valuestring, *b = r->valuestring;
        size_t an = strlen(a), bn = strlen(b), k = ft_pref_common_prefix(a, an, b, bn);
        char *buf = malloc(k + 1);
        if (buf) {
            memcpy(buf, a, k);
            buf[k] = 0;
            np = cJSON_CreateString(buf);
            free(buf);
        }
        nc = cJSON_CreateString(a + k);
        nr = cJSON_CreateString(b + k);
    } else {
        int64_t k = list_common_prefix(c, r);
        np = list_slice(c, 0, k);
        nc = list_slice(c, k, INT64_MAX);
        nr = list_slice(r, k, INT64_MAX);
    }
    if (!np || !nc || !nr) {
        cJSON_Delete(np);
        cJSON_Delete(nc);
        cJSON_Delete(nr);
        return ft_err(-ENOMEM, "out of memory");
    }
    return trl_sides(out, rec, np, nc, nr, NULL, NULL, NULL);
}

/* Copies the listed keys of rec (those present) into o as references. */
static int ref_keys(cJSON *o, const cJSON *rec, const char *const *keys, int n)
{
    for (int i = 0; i < n; i++) FT_TRY(add_ref(o, keys[i], cJSON_GetObjectItemCaseSensitive(rec, keys[i])));
    return 0;
}

static int split_lf_alpaca(const cJSON *rec, const cJSON *c, const cJSON *r, ft_pref_rec *out)
{
    static const char *const KEYS[] = {"instruction", "input", "system", "history", "tools"};
    const cJSON *v[2] = {c, r};
    for (int s = 0; s < 2; s++)
        if (!cJSON_IsString(v[s]))
            return ft_err(FT_E_INVALID, "pairwise alpaca record (LLaMA-Factory): '%s' must be a "
                          "string (found %s)", s ? "rejected" : "chosen", ft_json_type(v[s]));
    out->schema = FT_PREF_LF_ALPACA;
    out->format = FT_DATA_ALPACA;
    out->conversational = 1;
    out->last_only = 1;
    for (int s = 0; s < 2; s++) {
        if (!(out->side[s] = cJSON_CreateObject())) return ft_err(-ENOMEM, "out of memory");
        FT_TRY(ref_keys(out->side[s], rec, KEYS, (int)(sizeof KEYS / sizeof *KEYS)));
        FT_TRY(add_ref(out->side[s], "output", v[s]));
    }
    out->chosen = c;
    out->rejected = r;
    return 0;
}

/* LLaMA-Factory's assistant tags for a ranking answer: gpt and function_call (its
 * accept_tags[-1]); "assistant"/"model" as the role map of dataset.c accepts them. */
static int is_answer_tag(const char *t)
{
    return !strcmp(t, "gpt") || !strcmp(t, "assistant") || !strcmp(t, "model") ||
           !strcmp(t, "function_call");
}

static int split_lf_sharegpt(const cJSON *rec, const cJSON *conv, const cJSON *c, const cJSON *r,
                             ft_pref_rec *out)
{
    static const char *const KEYS[] = {"system", "tools"};
    static const char WHAT[] = "pairwise sharegpt record (LLaMA-Factory)";
    if (!cJSON_IsArray(conv) || !conv->child)
        return ft_err(FT_E_INVALID, "%s: 'conversations' must be a non-empty list of turns "
                      "(the prompt; found %s)", WHAT, cJSON_IsArray(conv) ? "an empty list" : ft_json_type(conv));
    const cJSON *last = conv->child;
    while (last->next) last = last->next;
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(last, "from");
    if (cJSON_IsString(lf) && is_answer_tag(lf->valuestring))
        return ft_err(FT_E_INVALID, "%s: the conversation (the prompt) ends with a '%.20s' turn; "
                      "it must end with the turn that chosen and rejected answer (human or "
                      "observation)", WHAT, lf->valuestring);
    const cJSON *v[2] = {c, r};
    for (int s = 0; s < 2; s++) {
        const char *key = s ? "rejected" : "chosen";
        const cJSON *from = cJSON_GetObjectItemCaseSensitive(v[s], "from");
        const cJSON *val = cJSON_GetObjectItemCaseSensitive(v[s], "value");
        if (!cJSON_IsObject(v[s]) || !cJSON_IsString(from) || !val)
            return ft_err(FT_E_INVALID, "%s: '%s' must be a turn object {\"from\": \"gpt\", "
                          "\"value\": ...} (found %s%s)", WHAT, key, ft_json_type(v[s]),
                          cJSON_IsObject(v[s]) ? " without a string 'from' and a 'value'" : "");
        if (!is_answer_tag(from->valuestring))
            return ft_err(FT_E_INVALID, "%s: '%s' is a '%.20s' turn; it must be an assistant "
                          "turn (gpt or function_call)", WHAT, key, from->valuestring);
    }
    out->schema = FT_PREF_LF_SHAREGPT;
    out->format = FT_DATA_SHAREGPT;
    out->conversational = 1;
    out->last_only = 1;
    for (int s = 0; s < 2; s++) {
        if (!(out->side[s] = cJSON_CreateObject())) return ft_err(-ENOMEM, "out of memory");
        cJSON *turns = list_slice(conv, 0, INT64_MAX);
        if (!turns || !cJSON_AddItemReferenceToArray(turns, (cJSON *)v[s])) {
            cJSON_Delete(turns);
            return ft_err(-ENOMEM, "out of memory");
        }
        FT_TRY(add_new(out->side[s], "conversations", turns));
        FT_TRY(ref_keys(out->side[s], rec, KEYS, (int)(sizeof KEYS / sizeof *KEYS)));
    }
    out->prompt = conv;
    out->chosen = c;
    out->rejected = r;
    return 0;
}

int ft_pref_split(const cJSON *rec, ft_pref_rec *out)
{
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(rec)) return ft_err(FT_E_INVALID, "a preference record must be a JSON object");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(rec, "chosen");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(rec, "rejected");
    if (!c || !r) {
        char keys[160];
        size_t k = 0;
        int i = 0;
        keys[0] = 0;
        for (const cJSON *x = rec->child; x && k + 1 < sizeof keys; x = x->next, i++) {
            if (i == 6) { snprintf(keys + k, sizeof keys - k, ", ..."); break; }
            int w = snprintf(keys + k, sizeof keys - k, "%s'%s'", i ? ", " : "", x->string ? x->string : "?");
            if (w < 0) break;
            k += (size_t)w;
        }
        if (c || r)
            return ft_err(FT_E_INVALID, "preference record has '%s' but no '%s'", c ? "chosen" : "rejected",
                          c ? "rejected" : "chosen");
        return ft_err(FT_E_INVALID, "not a preference record: no 'chosen' and 'rejected' (keys %s); "
                      "expected TRL's prompt/chosen/rejected or chosen/rejected, or LLaMA-Factory's "
                      "pairwise alpaca (instruction, chosen, rejected) or sharegpt (conversations, "
                      "chosen, rejected)", i ? keys : "none");
    }
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(rec, "conversations");
    int rc;
    if (conv)
        rc = split_lf_sharegpt(rec, conv, c, r, out);
    else if (cJSON_GetObjectItemCaseSensitive(rec, "instruction"))
        rc = split_lf_alpaca(rec, c, r, out);
    else
        rc = split_trl(rec, c, r, out);
    if (rc < 0) ft_pref_rec_free(out);
    return rc;
}
