/* chat_jinja.c - the model's own chat template (tokenizer_config.json "chat_template", or GGUF
 * tokenizer.chat_template) rendered by the Jinja engine (jinja.h) as transformers'
 * apply_chat_template renders it, and the loss mask of its assistant turns.
 *
 * The mask (formats.md 8.2, TRL assistant_only_loss):
 *   - a template with {% generation %} blocks marks the trained text itself: the blocks'
 *     output, taken in order as the assistant turns' (transformers' assistant_masks);
 *   - otherwise turn by turn: for assistant message i, P = render(m[0..i), generation prompt)
 *     and Q = render(m[0..i]); the turn's text is Q after the longest common prefix of P and
 *     Q (so after the assistant header the generation prompt writes), and it is trained up to
 *     its end less trailing whitespace (the "\n" templates write after an end-of-turn token
 *     is not trained, as with the built-in renderers). Q must be the start of the whole
 *     conversation's text, but for an end-of-conversation text (Phi-3's EOS: turn_end); a
 *     template that rewrites earlier turns once later ones follow (Qwen3's reasoning) has no
 *     such split and is refused with a message.
 * Function calling (formats.md 8.1): the record's message objects and "tools" reach the
 * template as written (vars_of), and an assistant turn with "tool_calls" is trained by the
 * same rule: the tool-call text the template writes (Llama-3.1's {"name": ..., "parameters":
 * ...}, Qwen2.5's <tool_call>...</tool_call>) up to its end-of-turn token.
 */
#include "src/template/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"
#include "src/template/jinja.h"

static const char *const ROLE[] = {"system", "user", "assistant", "tool"};

/* Sets o[key] to item (replacing it in place, so the keys keep the order the record gave
 * them, or appended). Takes item; 0 when out of memory. */
static int set_key(cJSON *o, const char *key, cJSON *item)
{
    if (!item) return 0;
    if (cJSON_GetObjectItemCaseSensitive(o, key) ? cJSON_ReplaceItemInObjectCaseSensitive(o, key, item)
                                                 : cJSON_AddItemToObject(o, key, item))
        return 1;
    cJSON_Delete(item);
    return 0;
}

/* A "tool_calls" key, not null, on message object j. */
static int has_tool_calls(const cJSON *j)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
    return c && !cJSON_IsNull(c);
}

int ft_chat_uses_tools(const ft_chat_msg *m, int64_t n, const ft_chat_ctx *ctx)
{
    if (ctx && ctx->tools && !cJSON_IsNull((const cJSON *)ctx->tools)) return 1;
    for (int64_t i = 0; i < n; i++)
        if (m[i].json && has_tool_calls(m[i].json)) return 1;
    return 0;
}

/* The template variables of messages m[0..n): {"messages": [...], tools, documents: None,
 * bos_token, eos_token, add_generation_prompt[, enable_thinking]}, as transformers'
 * apply_chat_template passes them (strftime_now formats 26 Jul 2024, jinja.h's default, so
 * renders are reproducible). A message with json (the record's object) is a deep copy of it,
 * so "tool_calls", "name", "tool_call_id" and any other key reach the template as written
 * (transformers passes the dicts), with "role" set to the canonical role name (sharegpt
 * "gpt" -> "assistant", "ipython" -> "tool"...) and "content" to ftune's content string, but
 * null where the record's content is null or absent beside tool_calls (templates test
 * `message.content is none`; HF datasets fill an absent key with None). A message ftune made
 * up is {role, content}. A user turn with an alpaca "input" has content + "\n\n" + input, as
 * the built-in renderers write it. "reasoning_content" as the record's string. `tools` is a
 * deep copy of ctx->tools, None when absent. NULL when out of memory. */
static cJSON *vars_of(const ft_chat_msg *m, int64_t n, const ft_chat_ctx *ctx, int gen_prompt)
{
    cJSON *v = cJSON_CreateObject(), *l = v ? cJSON_AddArrayToObject(v, "messages") : NULL;
    if (!l) goto oom;
    for (int64_t i = 0; i < n; i++) {
        const cJSON *j = m[i].json;
        cJSON *o = j ? cJSON_Duplicate(j, 1) : cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(l, o)) {
            cJSON_Delete(o);
            goto oom;
        }
        size_t cn = m[i].content_n + (m[i].input ? 2 + m[i].input_n : 0);
        char *c = malloc(cn + 1);
        if (!c) goto oom;
        memcpy(c, m[i].content, m[i].content_n);
        if (m[i].input) {
            memcpy(c + m[i].content_n, "\n\n", 2);
            memcpy(c + m[i].content_n + 2, m[i].input, m[i].input_n);
        }
        c[cn] = 0;
        const cJSON *jc = j ? cJSON_GetObjectItemCaseSensitive(j, "content") : NULL;
        int null_content = j && (!jc || cJSON_IsNull(jc)) && has_tool_calls(j);
        /* (cJSON strings end at the first NUL: a record's "\u0000" cannot pass through) */
        /* role first in a made-up message: the key order of users' data, seen by tojson */
        int ok = set_key(o, "role", cJSON_CreateString(ROLE[m[i].role])) &&
                 set_key(o, "content", null_content ? cJSON_CreateNull() : cJSON_CreateString(c));
        free(c);
        if (!ok) goto oom;
        if (m[i].reasoning) {
            char *r = strndup(m[i].reasoning, m[i].reasoning_n);
            ok = r && set_key(o, "reasoning_content", cJSON_CreateString(r));
            free(r);
            if (!ok) goto oom;
        }
    }
    /* transformers passes tools and documents always, None when absent */
    const cJSON *tools = ctx->tools;
    if (!set_key(v, "tools", tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull()) ||
        !cJSON_AddNullToObject(v, "documents") ||
        !cJSON_AddStringToObject(v, "bos_token", ctx->bos ? ctx->bos : "") ||
        !cJSON_AddStringToObject(v, "eos_token", ctx->eos ? ctx->eos : "") ||
        !cJSON_AddBoolToObject(v, "add_generation_prompt", gen_prompt) ||
        (ctx->no_think && !cJSON_AddFalseToObject(v, "enable_thinking")))
        goto oom;
    return v;
oom:
    cJSON_Delete(v);
    return NULL;
}

/* Renders m[0..n) (with the generation prompt when gen_prompt) into *r. */
static int render(const ft_jinja *t, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *ctx,
                  int gen_prompt, ft_jinja_out *r)
{
    cJSON *v = vars_of(m, n, ctx, gen_prompt);
    if (!v) return ft_err(-ENOMEM, "chat template: out of memory");
    int rc = ft_jinja_render(t, v, NULL, r);
    cJSON_Delete(v);
    return rc;
}

/* Appends r's text to out with the trained byte ranges tr[0..k) (sorted, disjoint). */
static int put_spans(ft_chat_text *out, const ft_jinja_out *r, const ft_jinja_span *tr, int64_t k)
{
    size_t at = 0;
    for (int64_t i = 0; i < k; i++) {
        FT_TRY(ft_chat_text_put(out, r->text + at, tr[i].off - at, 0));
        FT_TRY(ft_chat_text_put(out, r->text + tr[i].off, tr[i].n, 1));
        at = tr[i].off + tr[i].n;
    }
    return ft_chat_text_put(out, r->text + at, r->n - at, 0);
}

static size_t common_prefix(const char *a, size_t an, const char *b, size_t bn)
{
    size_t i = 0;
    while (i < an && i < bn && a[i] == b[i]) i++;
    return i;
}

/* Where the text q of the conversation up to an assistant turn ends inside the whole text r:
 * q's length when q is a prefix of r (the usual case). Phi-3's template writes the EOS only
 * after the last message, so q = (start of r) + EOS: then the point where they part, moved
 * back before a marker cut open there ("<|" of "<|endoftext|>" against "<|user|>"), when what
 * q has beyond it is also how r ends (the end-of-conversation text), and the two part after
 * the turn's start (byte `start`). -1 otherwise (a template that rewrites earlier turns:
 * two replies that read the same must not pass for an end-of-conversation text). */
static size_t turn_end(const ft_jinja_out *q, const ft_jinja_out *r, size_t start)
{
    size_t e = common_prefix(q->text, q->n, r->text, r->n);
    if (e == q->n) return e;
    if (e <= start) return (size_t)-1; /* parted before the turn: earlier text rewritten */
    for (size_t j = e; j-- > 0 && q->text[j] != '>' && !strchr(" \t\r\n", q->text[j]);)
        if (q->text[j] == '<') {
            e = j;
            break;
        }
    size_t junk = q->n - e;
    return junk <= r->n && !memcmp(q->text + e, r->text + r->n - junk, junk) ? e : (size_t)-1;
}

/* The trained spans of the full render r (see the file comment) into tr (one per assistant
 * message, *k of them). */
static int turn_spans(const ft_jinja *t, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *ctx,
                      const ft_jinja_out *r, ft_jinja_span *tr, int64_t *k)
{
    int64_t n_asst = 0;
    for (int64_t i = 0; i < n; i++) n_asst += m[i].role == FT_ROLE_ASSISTANT;
    *k = 0;
    if (r->n_gen > 0) { /* the template's {% generation %} blocks */
        if (r->n_gen != n_asst)
            return ft_err(FT_E_INVALID, "chat template: %lld {%% generation %%} blocks for %lld "
                          "assistant turns; cannot tell which turn each one is",
                          (long long)r->n_gen, (long long)n_asst);
        int64_t a = 0;
        for (int64_t i = 0; i < n; i++)
            if (m[i].role == FT_ROLE_ASSISTANT) {
                if (m[i].train) tr[(*k)++] = r->gen[a];
                a++;
            }
        return 0;
    }
    size_t floor = 0;
    for (int64_t i = 0; i < n; i++) {
        if (m[i].role != FT_ROLE_ASSISTANT || !m[i].train) continue;
        ft_jinja_out p = {0}, q = {0};
        /* P of a first assistant turn: no messages and the generation prompt (so a default
         * system turn or BOS the template writes before it is not trained) */
        int rc = render(t, m, i, ctx, 1, &p);
        if (rc && i == 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", ft_errmsg());
            rc = ft_err(rc, "chat template: the conversation starts with an assistant turn and "
                        "the template cannot render an empty conversation to tell where that "
                        "turn starts (%s); start it with a user (or system) message", why);
        }
        if (!rc) rc = render(t, m, i + 1, ctx, 0, &q);
        if (!rc) {
            /* (a boundary may fall inside a marker token, e.g. after QwQ's "<think>\n" when a
             * reply starts with '<': the tokens overlapping a trained byte are trained,
             * dataset.c, so the label of that token is still right) */
            size_t s = common_prefix(p.text, p.n, q.text, q.n), e = turn_end(&q, r, s);
            if (s < floor) s = floor;
            if (e == (size_t)-1)
                rc = ft_err(FT_E_INVALID, "chat template: the text of messages 0..%lld is not the "
                            "start of the whole conversation's (the template rewrites earlier turns "
                            "when later ones follow), so assistant turn %lld has no place to train; "
                            "give the earlier assistant turns \"weight\": 0, end each conversation "
                            "with its only trained turn, or use a --chat-template that renders "
                            "this model's format", (long long)i, (long long)i);
            while (!rc && e > s && strchr(" \t\r\n", q.text[e - 1])) e--;
            if (!rc && e > s) tr[(*k)++] = (ft_jinja_span){s, e - s};
            if (!rc) floor = e > s ? e : s;
        }
        ft_jinja_out_free(&p);
        ft_jinja_out_free(&q);
        FT_TRY(rc);
    }
    return 0;
}

int ft_chat_render_jinja(ft_chat_text *out, const ft_chat_msg *m, int64_t n,
                         const ft_chat_ctx *ctx, int gen_prompt)
{
    const char *src = ctx ? ctx->tmpl_src : NULL;
    if (!src) return ft_err(FT_E_INVALID, "chat template jinja: the tokenizer has no chat_template");
    ft_jinja *t;
    FT_TRY(ft_jinja_parse(&t, src, strlen(src), "chat_template"));
    ft_jinja_out r = {0};
    ft_jinja_span *tr = NULL;
    int64_t k = 0;
    int rc = render(t, m, n, ctx, gen_prompt, &r);
    if (!rc && gen_prompt) rc = ft_chat_text_put(out, r.text, r.n, 0);
    else if (!rc) {
        tr = malloc((size_t)(n + 1) * sizeof *tr);
        rc = tr ? turn_spans(t, m, n, ctx, &r, tr, &k) : ft_err(-ENOMEM, "chat template: out of memory");
        if (!rc) rc = put_spans(out, &r, tr, k);
    }
    free(tr);
    ft_jinja_out_free(&r);
    ft_jinja_free(t);
    return rc;
}

int ft_chat_jinja_end_of_turn(const ft_chat_ctx *ctx, char *buf, size_t n)
{
    static const char A[] = "ftune-reply-probe";
    const ft_chat_msg m[2] = {{FT_ROLE_USER, "ftune-user-probe", 16, NULL, 0, 0},
                              {FT_ROLE_ASSISTANT, A, sizeof A - 1, NULL, 0, 1}};
    const char *src = ctx ? ctx->tmpl_src : NULL;
    buf[0] = 0;
    if (!src) return 0;
    ft_jinja *t;
    FT_TRY(ft_jinja_parse(&t, src, strlen(src), "chat_template"));
    ft_jinja_out r = {0};
    int rc = render(t, m, 2, ctx, 0, &r);
    const char *a = rc ? NULL : strstr(r.text, A);
    if (a) {
        a += sizeof A - 1;
        while (*a && strchr(" \t\r\n", *a)) a++;
        size_t e = strcspn(a, " \t\r\n");
        if (e && e < n) {
            memcpy(buf, a, e);
            buf[e] = 0;
        }
    }
    ft_jinja_out_free(&r);
    ft_jinja_free(t);
    return rc;
}
