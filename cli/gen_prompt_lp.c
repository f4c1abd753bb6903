/* gen_prompt_lp.c - the prompt log-probabilities of `ftune generate --prompts` as JSON
 * (gen_prompt_lp.h): vLLM's prompt_logprobs list and the prompt part of an echoed completions
 * logprobs object. */
#include "cli/gen_prompt_lp.h"

#include <stdio.h>
#include <stdlib.h>

#include "cli/gen_env.h"
#include "src/core/err.h"

int64_t gen_plp_alternatives(const ft_gen_params *p, int api, int64_t flag, int64_t lp_top)
{
    if (p->set & FT_GEN_SET_PROMPT_LOGPROBS) return p->prompt_logprobs;
    /* what the request's echo implies comes before the command's default */
    if (p->echo && api == FT_GEN_API_CHAT) return lp_top >= 0 ? lp_top : 0; /* top_logprobs */
    if (p->echo && api == FT_GEN_API_COMPLETIONS && lp_top >= 0) return lp_top; /* logprobs */
    return flag >= 0 ? flag : -1;
}

/* Sets o[key] to item (a key met again keeps its place and takes the new value, as a Python
 * dict built in this order). Returns 0 or -ENOMEM (item freed). */
static int put(cJSON *o, const char *key, cJSON *item)
{
    if (!item) return -ENOMEM;
    if (cJSON_GetObjectItemCaseSensitive(o, key)) {
        if (cJSON_ReplaceItemInObjectCaseSensitive(o, key, item)) return 0;
    } else if (cJSON_AddItemToObject(o, key, item)) {
        return 0;
    }
    cJSON_Delete(item);
    return -ENOMEM;
}

/* o["<id>"] = {"logprob", "rank", "decoded_token"} (vLLM's Logprob). */
static int plp_entry(cJSON *o, const ft_tokenizer *tok, int32_t id, float lp, int64_t rank)
{
    char key[16], *text = NULL;
    FT_TRY(gen_token_text(tok, id, &text, NULL));
    snprintf(key, sizeof key, "%d", (int)id);
    cJSON *e = cJSON_CreateObject();
    if (e && (!cJSON_AddNumberToObject(e, "logprob", gen_lp_out(lp)) ||
              !cJSON_AddNumberToObject(e, "rank", (double)rank) ||
              !cJSON_AddStringToObject(e, "decoded_token", text))) {
        cJSON_Delete(e);
        e = NULL;
    }
    free(text);
    return put(o, key, e) ? ft_err(-ENOMEM, "out of memory") : 0;
}

/* Position q's dict (q >= 1): the prompt token with its rank, then the alternatives, ranks 1..k. */
static int plp_position(const ft_tokenizer *tok, const ft_gen_plp *p, int64_t q, cJSON **out)
{
    const int64_t w = 1 + p->k;
    const float *lp = p->lp + q * w;
    const int32_t *ids = p->ids + q * w;
    cJSON *o = cJSON_CreateObject();
    if (!o) return ft_err(-ENOMEM, "out of memory");
    int rc = plp_entry(o, tok, ids[0], lp[0], p->rank[q]);
    for (int64_t j = 1; !rc && j < w && ids[j] >= 0; j++) rc = plp_entry(o, tok, ids[j], lp[j], j);
    if (rc) cJSON_Delete(o);
    else *out = o;
    return rc;
}

int gen_plp_json(const ft_tokenizer *tok, const ft_gen_plp *p, cJSON **out)
{
    *out = NULL;
    cJSON *a = cJSON_CreateArray();
    if (!a || (p->n > 0 && !cJSON_AddItemToArray(a, cJSON_CreateNull()))) {
        cJSON_Delete(a);
        return ft_err(-ENOMEM, "out of memory");
    }
    for (int64_t q = 1; q < p->n; q++) {
        cJSON *o = NULL;
        int rc = plp_position(tok, p, q, &o);
        if (!rc && !cJSON_AddItemToArray(a, o)) {
            cJSON_Delete(o);
            rc = ft_err(-ENOMEM, "out of memory");
        }
        if (rc) {
            cJSON_Delete(a);
            return rc;
        }
    }
    *out = a;
    return 0;
}

/* The completions arrays of an echo (gen_plp_echo). */
typedef struct echo_arrays {
    cJSON *tokens, *tlp, *tops, *offs;
} echo_arrays;

/* Position q's top_logprobs dict of an echo: the first top + 1 of [token, alternatives not equal
 * to it] (vLLM's dict items, deduplicated by id), keyed by their text. */
static int echo_top(const ft_tokenizer *tok, const ft_gen_plp *p, int64_t q, int64_t top, cJSON **out)
{
    const int64_t w = 1 + p->k;
    const float *lp = p->lp + q * w;
    const int32_t *ids = p->ids + q * w;
    cJSON *o = cJSON_CreateObject();
    int rc = o ? 0 : ft_err(-ENOMEM, "out of memory");
    for (int64_t j = 0, taken = 0; !rc && j < w && taken <= top && ids[j] >= 0; j++) {
        if (j > 0 && ids[j] == ids[0]) continue; /* listed first */
        char *text = NULL;
        rc = gen_token_text(tok, ids[j], &text, NULL);
        if (!rc && put(o, text, cJSON_CreateNumber(gen_lp_out(lp[j]))))
            rc = ft_err(-ENOMEM, "out of memory");
        free(text);
        taken++;
    }
    if (rc) cJSON_Delete(o);
    else *out = o;
    return rc;
}

/* Appends prompt position q (its token ids[q * (1 + k)]) to a; *chars advances by its text's
 * length. */
static int echo_position(const ft_tokenizer *tok, const ft_gen_plp *p, int64_t q, int64_t top,
                         echo_arrays *a, int64_t *chars)
{
    const int32_t id = p->ids[q * (1 + p->k)];
    char *text = NULL;
    int64_t nc = 0;
    FT_TRY(gen_token_text(tok, id, &text, &nc));
    cJSON *t = NULL;
    int rc = q ? echo_top(tok, p, q, top, &t) : 0;
    if (!rc && (!cJSON_AddItemToArray(a->tokens, cJSON_CreateString(text)) ||
                !cJSON_AddItemToArray(a->tlp, q ? cJSON_CreateNumber(gen_lp_out(p->lp[q * (1 + p->k)]))
                                                : cJSON_CreateNull()) ||
                !cJSON_AddItemToArray(a->tops, q ? t : cJSON_CreateNull()) ||
                !cJSON_AddItemToArray(a->offs, cJSON_CreateNumber((double)*chars))))
        rc = ft_err(-ENOMEM, "out of memory");
    free(text);
    *chars += nc;
    return rc;
}

/* Moves the items of lp[key] to the end of dst, each number plus `shift` when shift != 0. */
static int echo_move(cJSON *lp, const char *key, cJSON *dst, int64_t shift)
{
    cJSON *src = cJSON_GetObjectItemCaseSensitive(lp, key);
    if (!cJSON_IsArray(src)) return ft_err(FT_E_INVALID, "generate: no '%s' in the logprobs", key);
    while (src->child) {
        cJSON *it = cJSON_DetachItemViaPointer(src, src->child);
        if (shift) cJSON_SetNumberValue(it, it->valuedouble + (double)shift);
        cJSON_AddItemToArray(dst, it);
    }
    return 0;
}

int gen_plp_echo(const ft_tokenizer *tok, const ft_gen_plp *p, int64_t top, cJSON *lp)
{
    if (!p->n) return ft_err(FT_E_INVALID, "generate: no prompt log-probabilities to echo");
    echo_arrays a = {cJSON_CreateArray(), cJSON_CreateArray(), cJSON_CreateArray(), cJSON_CreateArray()};
    int rc = a.tokens && a.tlp && a.tops && a.offs ? 0 : ft_err(-ENOMEM, "out of memory");
    int64_t chars = 0;
    for (int64_t q = 0; !rc && q < p->n; q++) rc = echo_position(tok, p, q, top, &a, &chars);
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    cJSON *dst[] = {a.tokens, a.tlp, a.tops, a.offs};
    for (int i = 0; !rc && i < 4; i++) /* every check before anything moves */
        if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(lp, keys[i])))
            rc = ft_err(FT_E_INVALID, "generate: no '%s' in the logprobs", keys[i]);
    for (int i = 0; !rc && i < 4; i++) {
        rc = echo_move(lp, keys[i], dst[i], i == 3 ? chars : 0);
        if (!rc && cJSON_ReplaceItemInObjectCaseSensitive(lp, keys[i], dst[i])) dst[i] = NULL;
        else if (!rc) rc = ft_err(-ENOMEM, "out of memory");
    }
    for (int i = 0; i < 4; i++) cJSON_Delete(dst[i]);
    return rc;
}
