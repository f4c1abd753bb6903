/* chat.c - built-in chat template renderers and template names/detection (see chat.h).
 *
 * Each renderer reproduces the text that transformers' apply_chat_template produces with the
 * model's Jinja template (formats.md 7.1/7.2; add_generation_prompt=False):
 *   llama3: Meta-Llama-3-8B-Instruct
 *     bos + for each message: <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
 *   llama3.1: Llama-3.1/3.2/3.3-Instruct (tools undefined): bos + a system turn that is always
 *     written, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + the
 *     first system message (trimmed, if any), then the other messages as llama3; tool results
 *     as <|start_header_id|>ipython<|end_header_id|>\n\n{content|tojson}<|eot_id|>
 *   chatml: Qwen2/2.5, SmolLM2 (their default system turn when messages[0] is not a system one)
 *     <|im_start|>{role}\n{content}<|im_end|>\n
 *   llama2: Llama-2-chat (meta-llama/Llama-2-*-chat-hf tokenizer_config.json)
 *     {bos}[INST] strip(<<SYS>>\n{system}\n<</SYS>>\n\n{user}) [/INST] strip({assistant}) {eos}
 *     Mistral (template with [INST] but no <<SYS>>): no system role, so the system text is
 *     folded into the first user turn ("{system}\n\n{user}"); formats.md 7.2:
 *     {bos}[INST] {user} [/INST]{assistant}{eos}[INST] ...
 *     Mistral v3, v3-tekken and v7 templates: render_mistral_new below.
 *   zephyr: Zephyr / TinyLlama-Chat: <|{role}|>\n{content}{eos}\n (no tool turns, no BOS)
 *   alpaca: Stanford Alpaca prompt (formats.md 8.1) + output + eos, one block per
 *     user/assistant pair; system text (if any) + "\n\n" before the first block.
 *   qwen3: Qwen3's template (Qwen/Qwen3-* tokenizer_config.json, tools undefined): ChatML
 *     without a default system turn, plus its thinking blocks. An assistant turn's reasoning is
 *     the text before its first "</think>" (after the last "<think>" there, '\n' stripped) and
 *     its content the text after its last "</think>" ('\n' lstripped). Turns after the last
 *     real user query (one that is not "<tool_response>...</tool_response>") that are the last
 *     message or have reasoning are written
 *       <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n
 *     (so a plain final answer gets the empty block "<think>\n\n</think>\n\n"); every other
 *     assistant turn is <|im_start|>assistant\n{content}<|im_end|>\n, its reasoning dropped.
 *     A record's "reasoning_content" (ft_chat_msg.reasoning) replaces the parsed reasoning and
 *     leaves content whole. Tool results: "\n<tool_response>\n{content}\n</tool_response>"
 *     inside one user turn per run of consecutive tool messages.
 */
#include "src/template/chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

static const char ALPACA_INPUT_HEAD[] =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n### Instruction:\n";
static const char ALPACA_NO_INPUT_HEAD[] =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n";
static const char ALPACA_INPUT_MID[] = "\n\n### Input:\n";
static const char ALPACA_RESPONSE[] = "\n\n### Response:";

/* Default system turns of ChatML templates (rendered when messages[0] is not "system"). */
static const char *const CHATML_DEFAULT_SYSTEM[] = {
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",     /* SmolLM2 */
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",     /* Qwen2.5 */
};

static const char *const ROLE_NAME[] = {"system", "user", "assistant", "tool"};

/* ---- text buffer ------------------------------------------------------------------------ */

int ft_chat_text_put(ft_chat_text *t, const char *s, size_t n, int train)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) return ft_err(-ENOMEM, "chat template: out of memory");
        t->text = p;
        t->cap = cap;
    }
    if (n) memcpy(t->text + t->n, s, n);
    train = !!train;
    if (t->n_seg && t->seg[t->n_seg - 1].train == train) {
        t->seg[t->n_seg - 1].n += n;
    } else if (n) {
        if (t->n_seg == t->cap_seg) {
            int64_t cap = t->cap_seg ? 2 * t->cap_seg : 16;
            ft_chat_seg *p = realloc(t->seg, (size_t)cap * sizeof *p);
            if (!p) return ft_err(-ENOMEM, "chat template: out of memory");
            t->seg = p;
            t->cap_seg = cap;
        }
        t->seg[t->n_seg++] = (ft_chat_seg){t->n, n, train};
    }
    t->n += n;
    t->text[t->n] = 0;
    return 0;
}

static int put_str(ft_chat_text *t, const char *s, int train)
{
    return ft_chat_text_put(t, s, strlen(s), train);
}

void ft_chat_text_free(ft_chat_text *t)
{
    if (!t) return;
    free(t->text);
    free(t->seg);
    memset(t, 0, sizeof *t);
}

/* ---- Python whitespace ------------------------------------------------------------------- */

static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes the UTF-8 character at s[0..n) forward; returns its length (1 for invalid). */
static size_t u8_fwd(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (L == 0 || L > n) { *cp = 0xFFFFFFFFu; return 1; }
    uint32_t v = L == 1 ? c : L == 2 ? (c & 0x1F) : L == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t i = 1; i < L; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = 0xFFFFFFFFu; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return L;
}

void ft_chat_strip(const char **s, size_t *n)
{
    const unsigned char *p = (const unsigned char *)*s;
    size_t a = 0, b = *n;
    while (a < b) {
        uint32_t cp;
        size_t L = u8_fwd(p + a, b - a, &cp);
        if (!py_space(cp)) break;
        a += L;
    }
    while (b > a) {
        size_t k = b - 1; /* start of the last character */
        while (k > a && (p[k] & 0xC0) == 0x80 && b - k < 4) k--;
        uint32_t cp;
        size_t L = u8_fwd(p + k, b - k, &cp);
        if (L != b - k || !py_space(cp)) break; /* an invalid tail byte is not a space */
        b = k;
    }
    *s += a;
    *n = b - a;
}

/* ---- message content --------------------------------------------------------------------- */

/* Scratch for content + "\n\n" + input (and the llama2 system block). */
typedef struct scratch { char *p; size_t n, cap; } scratch;

static int sc_put(scratch *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return ft_err(-ENOMEM, "chat template: out of memory");
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* The message text a chat template sees: content, plus "\n\n" + input when input is non-empty. */
static int msg_text(scratch *b, const ft_chat_msg *m, const char **s, size_t *n)
{
    if (!m->input || !m->input_n) {
        *s = m->content ? m->content : "";
        *n = m->content_n;
        return 0;
    }
    b->n = 0;
    FT_TRY(sc_put(b, m->content, m->content_n));
    FT_TRY(sc_put(b, "\n\n", 2));
    FT_TRY(sc_put(b, m->input, m->input_n));
    *s = b->p;
    *n = b->n;
    return 0;
}

static int is_trained(const ft_chat_msg *m)
{
    return m->role == FT_ROLE_ASSISTANT && m->train;
}

static int check_role(const ft_chat_msg *m, int64_t i)
{
    if (m->role < FT_ROLE_SYSTEM || m->role > FT_ROLE_TOOL)
        return ft_err(FT_E_INVALID, "message %lld: unknown role %d", (long long)i, m->role);
    return 0;
}

/* ---- renderers --------------------------------------------------------------------------- */

/* One <|start_header_id|>{role}<|end_header_id|>\n\n{trim(text)}<|eot_id|> turn (the text and
 * its <|eot_id|> trained for a trained assistant turn). */
static int llama3_turn(ft_chat_text *o, const char *role, const char *s, size_t k, int train)
{
    FT_TRY(put_str(o, "<|start_header_id|>", 0));
    FT_TRY(put_str(o, role, 0));
    FT_TRY(put_str(o, "<|end_header_id|>\n\n", 0));
    ft_chat_strip(&s, &k);
    FT_TRY(ft_chat_text_put(o, s, k, train));
    return put_str(o, "<|eot_id|>", train);
}

static int render_llama3(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                         scratch *sc)
{
    for (int64_t i = 0; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        if (i == 0) FT_TRY(put_str(o, c->bos ? c->bos : "", 0));
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        FT_TRY(llama3_turn(o, ROLE_NAME[m[i].role], s, k, is_trained(&m[i])));
    }
    return 0;
}

/* s[0..k) as a JSON string (untrained): Jinja's tojson, i.e. json.dumps(ensure_ascii=False),
 * which cJSON's printer matches (it escapes '"', '\\' and control characters only). */
static int put_json_string(ft_chat_text *o, const char *s, size_t k)
{
    char *t = malloc(k + 1), *q = NULL; /* s is not NUL-terminated */
    cJSON *js = NULL;
    if (t) {
        memcpy(t, s, k);
        t[k] = 0;
        js = cJSON_CreateString(t);
        q = js ? cJSON_PrintUnformatted(js) : NULL;
    }
    cJSON_Delete(js);
    free(t);
    if (!q) return ft_err(-ENOMEM, "chat template: out of memory");
    int rc = put_str(o, q, 0);
    cJSON_free(q);
    return rc;
}

/* Llama-3.1/3.2/3.3 Instruct (tools undefined): the system turn is always written, with the
 * template's knowledge-cutoff and date lines; date_string is the templates' fallback
 * "26 Jul 2024" (3.2/3.3 use strftime_now, today's date, where it is defined: in transformers;
 * a fixed date keeps the examples, and so runs and resumes, reproducible). A tool result is
 * an "ipython" turn whose string content the template writes through tojson (a Jinja string
 * is iterable): JSON-quoted and escaped, untrimmed. */
static int render_llama31(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                          scratch *sc)
{
    FT_TRY(put_str(o, c->bos ? c->bos : "", 0));
    FT_TRY(put_str(o, "<|start_header_id|>system<|end_header_id|>\n\n"
                      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n", 0));
    int64_t i = 0;
    if (n > 0 && m[0].role == FT_ROLE_SYSTEM) {
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[0], &s, &k));
        ft_chat_strip(&s, &k);
        FT_TRY(ft_chat_text_put(o, s, k, 0));
        i = 1;
    }
    FT_TRY(put_str(o, "<|eot_id|>", 0));
    for (; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        if (m[i].role == FT_ROLE_TOOL) {
            FT_TRY(put_str(o, "<|start_header_id|>ipython<|end_header_id|>\n\n", 0));
            FT_TRY(put_json_string(o, s, k));
            FT_TRY(put_str(o, "<|eot_id|>", 0));
        } else {
            FT_TRY(llama3_turn(o, ROLE_NAME[m[i].role], s, k, is_trained(&m[i])));
        }
    }
    return 0;
}

/* Zephyr (HuggingFaceH4/zephyr-7b-beta, TinyLlama-1.1B-Chat-v1.0; formats.md 7.2): per message
 * <|{role}|>\n{content}{eos}\n for system, user and assistant; tool messages are not written
 * (the template has no branch for them). No BOS: the template writes none. */
static int render_zephyr(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                         scratch *sc)
{
    const char *eos = c->eos ? c->eos : "";
    for (int64_t i = 0; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        if (m[i].role == FT_ROLE_TOOL) continue;
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        FT_TRY(put_str(o, "<|", 0));
        FT_TRY(put_str(o, ROLE_NAME[m[i].role], 0));
        FT_TRY(put_str(o, "|>\n", 0));
        FT_TRY(ft_chat_text_put(o, s, k, is_trained(&m[i])));
        FT_TRY(put_str(o, eos, is_trained(&m[i])));
        FT_TRY(put_str(o, "\n", 0));
    }
    return 0;
}

static int render_chatml(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                         scratch *sc)
{
    if (c->tmpl_src && (n == 0 || m[0].role != FT_ROLE_SYSTEM)) {
        for (size_t k = 0; k < sizeof CHATML_DEFAULT_SYSTEM / sizeof *CHATML_DEFAULT_SYSTEM; k++) {
            if (!strstr(c->tmpl_src, CHATML_DEFAULT_SYSTEM[k])) continue;
            FT_TRY(put_str(o, "<|im_start|>system\n", 0));
            FT_TRY(put_str(o, CHATML_DEFAULT_SYSTEM[k], 0));
            FT_TRY(put_str(o, "<|im_end|>\n", 0));
            break;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        FT_TRY(put_str(o, "<|im_start|>", 0));
        FT_TRY(put_str(o, ROLE_NAME[m[i].role], 0));
        FT_TRY(put_str(o, "\n", 0));
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        FT_TRY(ft_chat_text_put(o, s, k, is_trained(&m[i])));
        FT_TRY(put_str(o, "<|im_end|>", is_trained(&m[i])));
        FT_TRY(put_str(o, "\n", 0));
    }
    return 0;
}

/* ---- qwen3 -------------------------------------------------------------------------------- */

static int has_prefix(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && !memcmp(s, p, k);
}

static int has_suffix(const char *s, size_t n, const char *p)
{
    size_t k = strlen(p);
    return n >= k && !memcmp(s + n - k, p, k);
}

/* First (last = 0) or last (last = 1) occurrence of p in s[0..n), or NULL. */
static const char *find_in(const char *s, size_t n, const char *p, int last)
{
    const size_t k = strlen(p);
    const char *hit = NULL, *h;
    while ((h = memmem(s, n, p, k))) {
        hit = h;
        if (!last) break;
        n -= (size_t)(h + 1 - s);
        s = h + 1;
    }
    return hit;
}

/* Python str.lstrip('\n') / rstrip('\n') on s[0..*n). */
static void lstrip_nl(const char **s, size_t *n)
{
    while (*n && **s == '\n') (*s)++, (*n)--;
}
static void rstrip_nl(const char *s, size_t *n)
{
    while (*n && s[*n - 1] == '\n') (*n)--;
}

/* ns.last_query_index of the Qwen3 template into *q: the last user message whose text is not
 * a "<tool_response>...</tool_response>" wrapper, else n - 1. Returns 0 or -ENOMEM. */
static int qwen3_last_query(const ft_chat_msg *m, int64_t n, scratch *sc, int64_t *q)
{
    *q = n - 1;
    for (int64_t i = n - 1; i >= 0; i--) {
        if (m[i].role != FT_ROLE_USER) continue;
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        if (!(has_prefix(s, k, "<tool_response>") && has_suffix(s, k, "</tool_response>"))) {
            *q = i;
            break;
        }
    }
    return 0;
}

static int render_qwen3(ft_chat_text *o, const ft_chat_msg *m, int64_t n, scratch *sc)
{
    int64_t last_query;
    FT_TRY(qwen3_last_query(m, n, sc, &last_query));
    for (int64_t i = 0; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        if (m[i].role == FT_ROLE_TOOL) {
            /* consecutive tool results share one user turn */
            if (i == 0 || m[i - 1].role != FT_ROLE_TOOL) FT_TRY(put_str(o, "<|im_start|>user", 0));
            FT_TRY(put_str(o, "\n<tool_response>\n", 0));
            FT_TRY(ft_chat_text_put(o, s, k, 0));
            FT_TRY(put_str(o, "\n</tool_response>", 0));
            if (i == n - 1 || m[i + 1].role != FT_ROLE_TOOL) FT_TRY(put_str(o, "<|im_end|>\n", 0));
            continue;
        }
        FT_TRY(put_str(o, "<|im_start|>", 0));
        FT_TRY(put_str(o, ROLE_NAME[m[i].role], 0));
        FT_TRY(put_str(o, "\n", 0));
        if (m[i].role != FT_ROLE_ASSISTANT) {
            FT_TRY(ft_chat_text_put(o, s, k, 0));
            FT_TRY(put_str(o, "<|im_end|>\n", 0));
            continue;
        }
        /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n');
         * content = content.split('</think>')[-1].lstrip('\n') */
        const char *r = "", *close;
        size_t rn = 0;
        if (m[i].reasoning) { /* message.reasoning_content is string: content is kept whole */
            r = m[i].reasoning;
            rn = m[i].reasoning_n;
        } else if ((close = find_in(s, k, "</think>", 0))) {
            rn = (size_t)(close - s);
            rstrip_nl(s, &rn);
            const char *open = find_in(s, rn, "<think>", 1);
            r = open ? open + 7 : s;
            rn -= (size_t)(r - s);
            lstrip_nl(&r, &rn);
            const char *lc = find_in(s, k, "</think>", 1) + 8;
            k -= (size_t)(lc - s);
            s = lc;
            lstrip_nl(&s, &k);
        }
        const int train = is_trained(&m[i]);
        if (i > last_query && (i == n - 1 || rn)) {
            lstrip_nl(&r, &rn); /* reasoning.strip('\n') */
            rstrip_nl(r, &rn);
            lstrip_nl(&s, &k);
            FT_TRY(put_str(o, "<think>\n", train));
            FT_TRY(ft_chat_text_put(o, r, rn, train));
            FT_TRY(put_str(o, "\n</think>\n\n", train));
        }
        FT_TRY(ft_chat_text_put(o, s, k, train));
        FT_TRY(put_str(o, "<|im_end|>", train));
        FT_TRY(put_str(o, "\n", 0));
    }
    return 0;
}

/* The later Mistral templates (llama.cpp tests/test-chat-template.cpp quotes them; tools
 * undefined), by the template source:
 *   v7 ("[SYSTEM_PROMPT]" with "[INST] ", Mistral-Large-2411): bos, then per message
 *     [INST] {user}[/INST] | [SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT] | ␠{assistant}{eos}
 *   v7-tekken (the same without the spaces, Mistral-Small-2501/2503): [INST]{user}[/INST] |
 *     [SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT] | {assistant}{eos}; these templates write their
 *     own default_system_message (with today's date) when messages[0] is not a system one,
 *     which ftune does not evaluate: such a conversation is refused (give it a system turn)
 *   v3 ("[AVAILABLE_TOOLS]" with "[INST] ", Mistral-7B-Instruct-v0.3, Large-2407) and
 *   v3-tekken (without the space, Nemo-2407): bos, user/assistant alternating after one
 *     optional leading system message, [INST]␠{user}[/INST] and ␠trim({assistant}){eos} (v3)
 *     or [INST]{user}[/INST] and {assistant}{eos} (tekken); the system text goes before the
 *     user text ("{system}\n\n{user}") only when that user turn is the last message, so a
 *     conversation that ends with an assistant turn (every training example) loses it, as
 *     apply_chat_template renders it.
 * Tool messages are refused (these templates need tool-call ids). */
enum { MISTRAL_V1 = 1, MISTRAL_V3, MISTRAL_TEKKEN, MISTRAL_V7, MISTRAL_V7_TEKKEN };

/* The template writes "[INST] " (with the space) somewhere. */
static int inst_space(const char *src)
{
    return strstr(src, "\"[INST] \"") || strstr(src, "'[INST] '");
}

static int mistral_variant(const char *src)
{
    if (!src || !strstr(src, "[INST]") || strstr(src, "<<SYS>>")) return 0;
    if (strstr(src, "[SYSTEM_PROMPT]")) return inst_space(src) ? MISTRAL_V7 : MISTRAL_V7_TEKKEN;
    if (strstr(src, "[AVAILABLE_TOOLS]") || strstr(src, "loop.last and system_message"))
        return inst_space(src) ? MISTRAL_V3 : MISTRAL_TEKKEN;
    return MISTRAL_V1;
}

static int render_mistral_new(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                              scratch *sc, int variant)
{
    const char *eos = c->eos ? c->eos : "";
    const int v7 = variant == MISTRAL_V7 || variant == MISTRAL_V7_TEKKEN, spaced = variant == MISTRAL_V3 || variant == MISTRAL_V7;
    if (variant == MISTRAL_V7_TEKKEN && (n == 0 || m[0].role != FT_ROLE_SYSTEM) && c->tmpl_src &&
        strstr(c->tmpl_src, "default_system_message"))
        return ft_err(FT_E_INVALID, "this Mistral template writes its own default system prompt (with "
                      "today's date) when a conversation has no system message, which ftune does not "
                      "render: give the record a system message (a first 'system' turn, or the "
                      "alpaca/sharegpt 'system' field)");
    FT_TRY(put_str(o, c->bos ? c->bos : "", 0));
    int64_t first = 0;
    const ft_chat_msg *sys = NULL;
    if (!v7 && n > 0 && m[0].role == FT_ROLE_SYSTEM) {
        sys = &m[0];
        first = 1;
    }
    for (int64_t i = first; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        if (m[i].role == FT_ROLE_TOOL)
            return ft_err(FT_E_INVALID, "message %lld: tool messages are not supported with this "
                          "Mistral template (its tool turns need tool-call ids)", (long long)i);
        if (!v7) {
            int want = ((i - first) % 2 == 0) ? FT_ROLE_USER : FT_ROLE_ASSISTANT;
            if (m[i].role != want)
                return ft_err(FT_E_INVALID, "message %lld: this Mistral template needs one optional "
                              "leading system message, then roles that alternate "
                              "user/assistant/user/...; found '%s'", (long long)i,
                              ROLE_NAME[m[i].role]);
        }
        const char *s;
        size_t k;
        FT_TRY(msg_text(sc, &m[i], &s, &k));
        int tr = is_trained(&m[i]);
        switch (m[i].role) {
        case FT_ROLE_SYSTEM:
            FT_TRY(put_str(o, spaced ? "[SYSTEM_PROMPT] " : "[SYSTEM_PROMPT]", 0));
            FT_TRY(ft_chat_text_put(o, s, k, 0));
            FT_TRY(put_str(o, "[/SYSTEM_PROMPT]", 0));
            break;
        case FT_ROLE_USER:
            FT_TRY(put_str(o, spaced ? "[INST] " : "[INST]", 0));
            if (sys && i == n - 1) {
                FT_TRY(ft_chat_text_put(o, sys->content, sys->content_n, 0));
                FT_TRY(put_str(o, "\n\n", 0));
            }
            FT_TRY(ft_chat_text_put(o, s, k, 0));
            FT_TRY(put_str(o, "[/INST]", 0));
            break;
        default: /* assistant */
            if (variant == MISTRAL_V3) ft_chat_strip(&s, &k);
            if (spaced) FT_TRY(put_str(o, " ", tr));
            FT_TRY(ft_chat_text_put(o, s, k, tr));
            FT_TRY(put_str(o, eos, tr));
        }
    }
    return 0;
}

static int render_llama2(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c,
                         scratch *sc)
{
    const char *bos = c->bos ? c->bos : "", *eos = c->eos ? c->eos : "";
    int variant = mistral_variant(c->tmpl_src);
    if (variant > MISTRAL_V1) return render_mistral_new(o, m, n, c, sc, variant);
    int mistral = variant == MISTRAL_V1;
    const ft_chat_msg *sys = NULL;
    int64_t first = 0;
    if (n > 0 && m[0].role == FT_ROLE_SYSTEM) {
        sys = &m[0];
        first = 1;
    }
    scratch body = {0};
    int rc = 0;
    if (mistral) rc = put_str(o, bos, 0);
    for (int64_t i = first; i < n && rc == 0; i++) {
        rc = check_role(&m[i], i);
        if (rc) break;
        int want = ((i - first) % 2 == 0) ? FT_ROLE_USER : FT_ROLE_ASSISTANT;
        if (m[i].role != want) {
            rc = ft_err(FT_E_INVALID, "message %lld: the llama2 template needs %sroles that alternate "
                        "user/assistant/user/...; found '%s'", (long long)i,
                        m[i].role == FT_ROLE_SYSTEM ? "one leading system message and " : "",
                        ROLE_NAME[m[i].role]);
            break;
        }
        const char *s;
        size_t k;
        rc = msg_text(sc, &m[i], &s, &k);
        if (rc) break;
        if (i == first && sys) { /* the system text goes into the first user turn */
            body.n = 0;
            if (mistral) {
                rc = sc_put(&body, sys->content, sys->content_n);
                if (!rc) rc = sc_put(&body, "\n\n", 2);
            } else {
                rc = sc_put(&body, "<<SYS>>\n", 8);
                if (!rc) rc = sc_put(&body, sys->content, sys->content_n);
                if (!rc) rc = sc_put(&body, "\n<</SYS>>\n\n", 11);
            }
            if (!rc) rc = sc_put(&body, s, k);
            if (rc) break;
            s = body.p;
            k = body.n;
        }
        int tr = is_trained(&m[i]);
        if (mistral) {
            if (m[i].role == FT_ROLE_USER) {
                rc = put_str(o, "[INST] ", 0);
                if (!rc) rc = ft_chat_text_put(o, s, k, 0);
                if (!rc) rc = put_str(o, " [/INST]", 0);
            } else {
                rc = ft_chat_text_put(o, s, k, tr);
                if (!rc) rc = put_str(o, eos, tr);
            }
        } else {
            ft_chat_strip(&s, &k);
            if (m[i].role == FT_ROLE_USER) {
                rc = put_str(o, bos, 0);
                if (!rc) rc = put_str(o, "[INST] ", 0);
                if (!rc) rc = ft_chat_text_put(o, s, k, 0);
                if (!rc) rc = put_str(o, " [/INST]", 0);
            } else {
                rc = put_str(o, " ", tr);
                if (!rc) rc = ft_chat_text_put(o, s, k, tr);
                if (!rc) rc = put_str(o, " ", tr);
                if (!rc) rc = put_str(o, eos, tr);
            }
        }
    }
    free(body.p);
    return rc;
}

static int render_alpaca(ft_chat_text *o, const ft_chat_msg *m, int64_t n, const ft_chat_ctx *c)
{
    const char *eos = c->eos ? c->eos : "";
    for (int64_t i = 0; i < n; i++) {
        FT_TRY(check_role(&m[i], i));
        const ft_chat_msg *x = &m[i];
        switch (x->role) {
        case FT_ROLE_SYSTEM:
            FT_TRY(ft_chat_text_put(o, x->content, x->content_n, 0));
            FT_TRY(put_str(o, "\n\n", 0));
            break;
        case FT_ROLE_USER:
            if (x->input && x->input_n) {
                FT_TRY(put_str(o, ALPACA_INPUT_HEAD, 0));
                FT_TRY(ft_chat_text_put(o, x->content, x->content_n, 0));
                FT_TRY(put_str(o, ALPACA_INPUT_MID, 0));
                FT_TRY(ft_chat_text_put(o, x->input, x->input_n, 0));
            } else {
                FT_TRY(put_str(o, ALPACA_NO_INPUT_HEAD, 0));
                FT_TRY(ft_chat_text_put(o, x->content, x->content_n, 0));
            }
            FT_TRY(put_str(o, ALPACA_RESPONSE, 0));
            break;
        case FT_ROLE_ASSISTANT:
            FT_TRY(ft_chat_text_put(o, x->content, x->content_n, is_trained(x)));
            FT_TRY(put_str(o, eos, is_trained(x)));
            break;
        default:
            return ft_err(FT_E_INVALID, "message %lld: the alpaca template has no '%s' role",
                          (long long)i, ROLE_NAME[x->role]);
        }
    }
    return 0;
}

int ft_chat_render(ft_chat_text *out, int tmpl, const ft_chat_msg *m, int64_t n,
                   const ft_chat_ctx *ctx)
{
    static const ft_chat_ctx none = {"", "", NULL};
    if (!ctx) ctx = &none;
    scratch sc = {0};
    int rc;
    switch (tmpl) {
    case FT_CHAT_LLAMA3: rc = render_llama3(out, m, n, ctx, &sc); break;
    case FT_CHAT_CHATML: rc = render_chatml(out, m, n, ctx, &sc); break;
    case FT_CHAT_LLAMA2: rc = render_llama2(out, m, n, ctx, &sc); break;
    case FT_CHAT_ALPACA: rc = render_alpaca(out, m, n, ctx); break;
    case FT_CHAT_QWEN3: rc = render_qwen3(out, m, n, &sc); break;
    case FT_CHAT_LLAMA31: rc = render_llama31(out, m, n, ctx, &sc); break;
    case FT_CHAT_ZEPHYR: rc = render_zephyr(out, m, n, ctx, &sc); break;
    case FT_CHAT_JINJA: rc = ft_chat_render_jinja(out, m, n, ctx, 0); break;
    default: rc = ft_err(FT_E_INVALID, "chat template %d cannot render (resolve auto first)", tmpl);
    }
    free(sc.p);
    return rc;
}

/* ---- generation prompt ------------------------------------------------------------------- */

int ft_chat_render_prompt(ft_chat_text *out, int tmpl, const ft_chat_msg *m, int64_t n,
                          const ft_chat_ctx *ctx)
{
    if (n < 1) return ft_err(FT_E_INVALID, "generation prompt: no messages");
    if (m[n - 1].role == FT_ROLE_ASSISTANT)
        return ft_err(FT_E_INVALID, "generation prompt: message %lld is an assistant turn; the "
                      "prompt must end with a user (or tool) message", (long long)(n - 1));
    if (tmpl == FT_CHAT_JINJA) return ft_chat_render_jinja(out, m, n, ctx, 1);
    FT_TRY(ft_chat_render(out, tmpl, m, n, ctx));
    switch (tmpl) {
    case FT_CHAT_LLAMA3:
    case FT_CHAT_LLAMA31: return put_str(out, "<|start_header_id|>assistant<|end_header_id|>\n\n", 0);
    case FT_CHAT_CHATML: return put_str(out, "<|im_start|>assistant\n", 0);
    case FT_CHAT_QWEN3:
        return put_str(out, ctx && ctx->no_think ? "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                          : "<|im_start|>assistant\n", 0);
    case FT_CHAT_ZEPHYR: return put_str(out, "<|assistant|>\n", 0);
    default: return 0; /* llama2/mistral: "... [/INST]"; alpaca: "### Response:" */
    }
}

const char *ft_chat_end_of_turn(int tmpl)
{
    switch (tmpl) {
    case FT_CHAT_LLAMA3:
    case FT_CHAT_LLAMA31: return "<|eot_id|>";
    case FT_CHAT_CHATML:
    case FT_CHAT_QWEN3: return "<|im_end|>";
    default: return NULL;
    }
}

/* ---- names and detection ------------------------------------------------------------------ */

static const char *const TEMPLATE_NAME[] = {"auto", "llama3", "chatml", "llama2", "alpaca", "qwen3",
                                            "llama3.1", "zephyr", "jinja"};

const char *ft_chat_template_name(int t)
{
    if (t < 0 || t >= (int)(sizeof TEMPLATE_NAME / sizeof *TEMPLATE_NAME)) return "unknown";
    return TEMPLATE_NAME[t];
}

int ft_chat_template_parse(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < (int)(sizeof TEMPLATE_NAME / sizeof *TEMPLATE_NAME); i++)
        if (!strcmp(name, TEMPLATE_NAME[i])) return i;
    if (!strcmp(name, "mistral")) return FT_CHAT_LLAMA2; /* same renderer, variant by template */
    return -1;
}

int ft_chat_detect_str(const char *s)
{
    if (!s) return FT_CHAT_ALPACA;
    if (strstr(s, "<|im_start|>"))
        return !strstr(s, "<think>") ? (strstr(s, "<|im_sep|>") ? FT_CHAT_JINJA : FT_CHAT_CHATML)
               : strstr(s, "last_query_index") ? FT_CHAT_QWEN3 : FT_CHAT_JINJA;
    if (strstr(s, "<|start_header_id|>"))
        return strstr(s, "Cutting Knowledge Date") ? FT_CHAT_LLAMA31 : FT_CHAT_LLAMA3;
    if (strstr(s, "[INST]")) return FT_CHAT_LLAMA2;
    if (strstr(s, "<|user|>") && strstr(s, "<|assistant|>") && !strstr(s, "<|end|>") &&
        !strstr(s, "[gMASK]"))
        return FT_CHAT_ZEPHYR; /* (Phi-3's <|end|> and GLM's [gMASK] turns are other formats) */
    return FT_CHAT_JINJA;
}

/* 1 when the built-in ChatML renderer writes a two-turn probe conversation as the template
 * itself does (the engine), or when the engine cannot render it; 0 when they differ: a ChatML
 * variant the substring rules do not know (a BOS before each turn, other separators). */
static int chatml_matches(const ft_tokenizer *tok, const char *src)
{
    static const ft_chat_msg m[2] = {{FT_ROLE_USER, "ftune-probe-user", 16, NULL, 0, 0},
                                     {FT_ROLE_ASSISTANT, "ftune-probe-reply", 17, NULL, 0, 1}};
    ft_chat_ctx ctx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), src};
    ft_chat_text a = {0}, b = {0};
    int same = 1;
    if (!ft_chat_render_jinja(&b, m, 2, &ctx, 0) && !ft_chat_render(&a, FT_CHAT_CHATML, m, 2, &ctx))
        same = a.n == b.n && !memcmp(a.text, b.text, a.n);
    ft_err_clear(); /* a probe that fails is no error of the caller's */
    ft_chat_text_free(&a);
    ft_chat_text_free(&b);
    return same;
}

int ft_chat_template_resolve(const ft_tokenizer *tok)
{
    const char *src = tok ? ft_tok_chat_template(tok) : NULL;
    int t = ft_chat_detect_str(src);
    return t == FT_CHAT_CHATML && !chatml_matches(tok, src) ? FT_CHAT_JINJA : t;
}

int ft_chat_template_detect(const ft_tokenizer *tok)
{
    /* resolved once by the tokenizer's loader (ft_tok_set_chat_kind), else here */
    int k = ft_tok_chat_kind(tok);
    return k != FT_CHAT_AUTO ? k : ft_chat_template_resolve(tok);
}
