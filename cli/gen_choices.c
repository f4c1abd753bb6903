/* gen_choices.c - the output lines of `ftune generate --prompts` (gen_choices.h): a plain
 * record's line, or an OpenAI batch request's Batch API line (the format is in gen_batch.c's
 * header) with its choices. Split from gen_batch.c, which decodes the records' choices as
 * separate slots and calls in here once all choices of a record are done. */
#include "cli/gen_choices.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/gen_prompt_lp.h"
#include "src/core/err.h"
#include "src/core/rng.h"

uint64_t gen_choice_seed(uint64_t seed, int64_t c)
{
    if (c == 0) return seed;
    /* splitmix64's finalizer of the seed first: with seed ^ (a function of c) alone, and a
     * record's seed being --seed ^ (the same function of its index), choice c of record i
     * and choice i of record c would draw alike (seed ^ M(i) ^ M(c) both) */
    const uint64_t h = ft_mix64(seed ^ 0x63686f696365ull); /* "choice" */
    return ft_gen_record_seed(h & ((1ull << 53) - 1), c);
}

/* 16 hex digits of custom_id: FNV-1a 64 (Fowler, Noll, Vo) mixed by splitmix64's finalizer
 * (Steele et al. 2014), the ids of a batch output line. */
static void id_hex(const char *s, char out[17])
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    snprintf(out, 17, "%016llx", (unsigned long long)ft_mix64(h));
}

/* A completions choice's "text": with echo the prompt, then the reply (vLLM's
 * request_output_to_completion_response: prompt_text + output.text), malloc'ed. */
static char *choice_text(const batch_rec *x, const char *reply)
{
    const char *pre = x->echo ? x->q.user : "";
    const size_t a = strlen(pre), b = strlen(reply);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, pre, a);
        memcpy(s + a, reply, b + 1);
    }
    return s;
}

/* Adds key "prompt_logprobs" (gen_plp_json of x's values) to j. */
static int add_plp(cJSON *j, const ft_tokenizer *tok, const batch_rec *x)
{
    cJSON *a = NULL;
    FT_TRY(gen_plp_json(tok, &x->plp, &a));
    if (cJSON_AddItemToObject(j, "prompt_logprobs", a)) return 0;
    cJSON_Delete(a);
    return ft_err(-ENOMEM, "out of memory");
}

/* Choice `index` of a batch request x's reply (vLLM's ChatCompletionResponseChoice /
 * CompletionResponseChoice): {"index", "message": {"role", "content"} | "text", "logprobs",
 * "finish_reason", "stop_reason", "prompt_logprobs"? (completions)}; takes over c->lp. Returns
 * 0 or an error (*out NULL). */
static int choice_json(const ft_tokenizer *tok, const batch_rec *x, int64_t index, gen_choice *c,
                       int32_t eos, cJSON **out)
{
    const gen_result *r = &c->r;
    cJSON *j = cJSON_CreateObject();
    cJSON *lp = c->lp;
    c->lp = NULL;
    *out = NULL;
    int rc = j ? 0 : ft_err(-ENOMEM, "out of memory");
    if (!rc && lp && x->echo) rc = gen_plp_echo(tok, &x->plp, x->lp_top, lp);
    if (rc) {
        cJSON_Delete(j);
        cJSON_Delete(lp);
        return rc;
    }
    cJSON_AddNumberToObject(j, "index", (double)index);
    const char *text = r->text ? r->text : "";
    if (x->q.api == FT_GEN_API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(j, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        char *t = choice_text(x, text);
        if (!t || !cJSON_AddStringToObject(j, "text", t)) rc = ft_err(-ENOMEM, "out of memory");
        free(t);
    }
    if (lp) cJSON_AddItemToObject(j, "logprobs", lp);
    else cJSON_AddNullToObject(j, "logprobs");
    cJSON_AddStringToObject(j, "finish_reason", r->stop == GEN_STOP_LENGTH ? "length" : "stop");
    /* vLLM's check_stop (vllm/v1/core/sched/utils.py): null for the EOS (unless ignore_eos,
     * which skips that check: then a stop_token_ids EOS gives its id), the id of any other
     * stop token (a stop_token_ids entry, the template's end of turn), the stop string */
    if (r->stop == GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", x->stop[r->stop_str]);
    else if (r->stop == GEN_STOP_TOKEN && (c->stop_tok != eos || x->ignore_eos))
        cJSON_AddNumberToObject(j, "stop_reason", c->stop_tok);
    else cJSON_AddNullToObject(j, "stop_reason");
    /* vLLM: each completions choice carries the request's prompt_logprobs; chat: the body */
    if (!rc && x->plp_k >= 0 && x->q.api == FT_GEN_API_COMPLETIONS) rc = add_plp(j, tok, x);
    if (rc) cJSON_Delete(j);
    else *out = j;
    return rc;
}

/* The Batch API output object of batch request x with its choices c[0..x->n_choices) (see
 * gen_batch.c's header); takes over their "logprobs". Returns 0 or an error (*out NULL). */
static int batch_line(const gen_opts *o, const ft_tokenizer *tok, const batch_rec *x, gen_choice *c,
                      int32_t eos, cJSON **out)
{
    const int chat = x->q.api == FT_GEN_API_CHAT;
    char h[17], id[64];
    id_hex(x->q.custom_id, h);
    cJSON *j = cJSON_CreateObject(), *resp = cJSON_CreateObject(), *body = cJSON_CreateObject();
    cJSON *choices = cJSON_CreateArray(), *usage = cJSON_CreateObject();
    *out = NULL;
    if (!j || !resp || !body || !choices || !usage) {
        cJSON_Delete(j);
        cJSON_Delete(resp);
        cJSON_Delete(body);
        cJSON_Delete(choices);
        cJSON_Delete(usage);
        return ft_err(-ENOMEM, "out of memory");
    }
    snprintf(id, sizeof id, "batch_req_%s", h);
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "custom_id", x->q.custom_id);
    cJSON_AddItemToObject(j, "response", resp);
    cJSON_AddNullToObject(j, "error");
    cJSON_AddNumberToObject(resp, "status_code", 200);
    snprintf(id, sizeof id, "req_%s", h);
    cJSON_AddStringToObject(resp, "request_id", id);
    cJSON_AddItemToObject(resp, "body", body);
    snprintf(id, sizeof id, "%s%s", chat ? "chatcmpl-" : "cmpl-", h);
    cJSON_AddStringToObject(body, "id", id);
    cJSON_AddStringToObject(body, "object", chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(body, "created", (double)time(NULL));
    cJSON_AddStringToObject(body, "model", o->model_given ? o->model_given : o->model);
    cJSON_AddItemToObject(body, "choices", choices);
    /* usage as vLLM's serving_chat / serving_completion count it: the prompt once, the
     * completion tokens summed over the choices, each with the stop token that ended it (its
     * output token_ids end with it, vllm-project/vllm#28185) */
    int64_t done = 0;
    int rc = 0;
    for (int64_t k = 0; k < x->n_choices && !rc; k++) {
        const gen_result *r = &c[k].r;
        done += r->n_out + (r->stop == GEN_STOP_TOKEN);
        cJSON *cj = NULL;
        rc = choice_json(tok, x, k, &c[k], eos, &cj);
        if (!rc && !cJSON_AddItemToArray(choices, cj)) {
            cJSON_Delete(cj);
            rc = ft_err(-ENOMEM, "out of memory");
        }
    }
    cJSON_AddNumberToObject(usage, "prompt_tokens", (double)x->n);
    cJSON_AddNumberToObject(usage, "completion_tokens", (double)done);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)(x->n + done));
    cJSON_AddItemToObject(body, "usage", usage);
    /* vLLM's ChatCompletionResponse.prompt_logprobs: once, after usage */
    if (!rc && x->plp_k >= 0 && chat) rc = add_plp(body, tok, x);
    if (rc) cJSON_Delete(j);
    else *out = j;
    return rc;
}

/* A plain record's line (cmd_generate.c's header) from its one reply c; takes over c->lp.
 * Returns 0 or an error (*out NULL). */
static int plain_line(const ft_tokenizer *tok, int64_t i, const batch_rec *x, gen_choice *c,
                      int32_t eos, cJSON **out)
{
    const gen_result *r = &c->r;
    cJSON *lp = c->lp;
    c->lp = NULL;
    cJSON *j = cJSON_CreateObject();
    *out = NULL;
    if (!j) {
        cJSON_Delete(lp);
        return ft_err(-ENOMEM, "out of memory");
    }
    cJSON_AddNumberToObject(j, "index", (double)i);
    cJSON_AddStringToObject(j, "prompt", x->q.user);
    cJSON_AddStringToObject(j, "reply", r->text ? r->text : "");
    if (x->q.reference) cJSON_AddStringToObject(j, "reference", x->q.reference);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(j, "new_tokens", (double)r->n_out);
    cJSON_AddStringToObject(j, "stop", gen_stop_name(r));
    if (r->stop == GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", x->stop[r->stop_str]);
    /* a stop token the record (or --stop-token-ids) asked for: its id, as vLLM's
     * CompletionOutput.stop_reason (not for the EOS, which vLLM checks first) */
    if (r->stop == GEN_STOP_TOKEN && (c->stop_tok != eos || x->ignore_eos) &&
        gen_id_listed(x->stop_ids, x->n_stop_ids, c->stop_tok))
        cJSON_AddNumberToObject(j, "stop_reason", c->stop_tok);
    cJSON_AddNumberToObject(j, "seconds", c->seconds);
    if (x->sc.temperature > 0) gen_add_seed(j, x->sc.seed);
    if (lp && !cJSON_AddItemToObject(j, "logprobs", lp)) cJSON_Delete(lp);
    int rc = x->plp_k >= 0 ? add_plp(j, tok, x) : 0;
    if (rc) cJSON_Delete(j);
    else *out = j;
    return rc;
}

int gen_put_record(FILE *f, const gen_opts *o, const ft_tokenizer *tok, int64_t i,
                   const batch_rec *x, gen_choice *c, int32_t eos)
{
    cJSON *j = NULL;
    int rc = x->q.api != FT_GEN_API_NONE ? batch_line(o, tok, x, c, eos, &j)
                                         : plain_line(tok, i, x, c, eos, &j);
    for (int64_t k = 0; k < x->n_choices; k++) { /* what a failed line left */
        cJSON_Delete(c[k].lp);
        c[k].lp = NULL;
    }
    FT_TRY(rc);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    int bad = fputs(s, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    free(s);
    return bad ? ft_err(-EIO, "%s: write failed: %s", o->out ? o->out : "stdout", strerror(errno)) : 0;
}
