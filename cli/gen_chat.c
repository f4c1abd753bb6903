/* gen_chat.c - `ftune generate --chat`: a conversation with the model (and adapter) on stdin,
 * one user turn per line, each reply streamed to stdout, the KV cache reused across turns
 * (cmd_generate.c's header describes the command; llama.cpp's `llama-cli -cnv` and
 * mlx_lm.chat are the models of the behaviour).
 *
 * Each turn renders the whole conversation (the --system message, the user and assistant
 * turns so far, the new user turn) exactly as a --prompts record {"messages": [...]} is
 * rendered (ft_gen_req_parse + ft_gen_req_ids: the same template path, so the ids are that
 * record's), then prefills only the tokens after the longest common prefix with what sequence 0's
 * cache holds (the cache cut back to it, ft_gen_truncate_seq; llama.cpp's server and
 * llama-cli reuse a prompt's cached prefix the same way). A template that rewrites earlier
 * turns (qwen3 drops earlier <think> blocks; a reply retokenized differently from the tokens
 * generated) only shortens that prefix. The assistant turn kept in the history is the reply's
 * text (with --stop, the text cut before the string), as a record would give it.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gen_cli.h"
#include "src/core/err.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"
#include "src/formats/config.h"

#define CHAT_CTX_DEFAULT 4096 /* --ctx-size when the model allows more */

/* ---- SIGINT ------------------------------------------------------------------------------ */

static volatile sig_atomic_t g_replying; /* 1 while a turn is prefilled or decoded */
static volatile sig_atomic_t g_stop;     /* set by SIGINT during a reply: end it */

/* Async-signal-safe: during a reply, only the flag (the reply ends at the next token and the
 * chat goes back to the prompt); at the prompt (a second ^C), write(2) and _exit(2). */
static void on_sigint(int sig)
{
    if (g_replying) {
        g_stop = 1;
        return;
    }
    static const char bye[] = "\n";
    ssize_t w = write(2, bye, sizeof bye - 1);
    (void)w;
    _exit(128 + sig);
}

/* ---- the conversation -------------------------------------------------------------------- */

/* turns[0..n): user, assistant, user, ... (even: user; odd: assistant), malloc'ed strings. */
typedef struct chat_hist {
    char **turn;
    int64_t n, cap;
} chat_hist;

static int hist_push(chat_hist *h, const char *s, size_t len)
{
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 16;
        char **p = realloc(h->turn, (size_t)cap * sizeof *p);
        if (!p) return ft_err(-ENOMEM, "out of memory");
        h->turn = p;
        h->cap = cap;
    }
    char *d = malloc(len + 1);
    if (!d) return ft_err(-ENOMEM, "out of memory");
    memcpy(d, s, len);
    d[len] = 0;
    h->turn[h->n++] = d;
    return 0;
}

/* Drops the first k turns (k = 2: the oldest user turn and its reply). */
static void hist_drop_front(chat_hist *h, int64_t k)
{
    for (int64_t i = 0; i < k; i++) free(h->turn[i]);
    memmove(h->turn, h->turn + k, (size_t)(h->n - k) * sizeof *h->turn);
    h->n -= k;
}

static void hist_pop(chat_hist *h)
{
    free(h->turn[--h->n]);
}

static void hist_free(chat_hist *h)
{
    while (h->n) hist_pop(h);
    free(h->turn);
    memset(h, 0, sizeof *h);
}

/* The ids of the conversation h->turn[from..n) (from even; ending with a user turn) with the
 * generation prompt: the --prompts record {"messages": [{"role", "content"}...]} read and
 * rendered as gen_prompts.c reads and renders it (--system for its system message). *ids
 * malloc'ed. */
static int hist_ids(const ft_gen_env *e, const gen_opts *o, const chat_hist *h, int64_t from,
                    int32_t **ids, int64_t *n)
{
    *ids = NULL;
    *n = 0;
    cJSON *rec = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(rec, "messages");
    int rc = msgs ? 0 : ft_err(-ENOMEM, "out of memory");
    for (int64_t i = from; !rc && i < h->n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddStringToObject(m, "role", i % 2 ? "assistant" : "user") ||
            !cJSON_AddStringToObject(m, "content", h->turn[i])) {
            cJSON_Delete(m);
            rc = ft_err(-ENOMEM, "out of memory");
        } else {
            cJSON_AddItemToArray(msgs, m);
        }
    }
    ft_gen_req q;
    memset(&q, 0, sizeof q);
    if (!rc) rc = ft_gen_req_parse(&q, rec, o->system, 0);
    if (!rc) rc = ft_gen_req_ids(e->tok, o->tmpl, &q, gen_flags(o), ids, n, NULL);
    if (!rc && *n == 0) rc = ft_err(FT_E_INVALID, "the conversation encodes to no tokens");
    ft_gen_req_free(&q);
    cJSON_Delete(rec);
    return rc;
}

/* ---- stdin ------------------------------------------------------------------------------- */

/* The next user line into *buf (malloc'ed, NUL-terminated, *len bytes): a physical line
 * without its "\n" (or "\r\n"); one ending in a backslash goes on with the next line, the
 * backslash becoming a newline. Returns 1 with a line, 0 at EOF with nothing read, -ENOMEM. */
static int read_turn(char **buf, size_t *len, int tty)
{
    char *line = NULL;
    size_t cap = 0, n = 0;
    int got = 0;
    *len = 0;
    free(*buf);
    *buf = NULL;
    if (tty) fputs("> ", stderr);
    for (;;) {
        ssize_t k = getline(&line, &cap, stdin);
        if (k < 0) break;
        got = 1;
        if (k > 0 && line[k - 1] == '\n') line[--k] = 0;
        if (k > 0 && line[k - 1] == '\r') line[--k] = 0;
        const int more = k > 0 && line[k - 1] == '\\';
        if (more) line[k - 1] = '\n';
        char *p = realloc(*buf, n + (size_t)k + 1);
        if (!p) {
            free(line);
            return ft_err(-ENOMEM, "out of memory");
        }
        *buf = p;
        memcpy(*buf + n, line, (size_t)k);
        n += (size_t)k;
        (*buf)[n] = 0;
        if (!more) break;
        if (tty) fputs(". ", stderr);
    }
    free(line);
    *len = n;
    if (got && !*buf && !(*buf = calloc(1, 1))) return ft_err(-ENOMEM, "out of memory");
    return got;
}

static int blank(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

static void chat_help(void)
{
    fputs("ftune: each line is your message; a line ending in '\\' goes on with the next one.\n"
          "  /reset   a new conversation (the --system message kept)\n"
          "  /exit    quit (also end of input: Ctrl-D)\n"
          "  /help    this list\n"
          "  //text   sends '/text' (a message beginning with '/')\n"
          "  Ctrl-C   stops a reply; at the prompt, quits\n", stderr);
}

/* ---- one turn ---------------------------------------------------------------------------- */

/* What sequence 0's cache holds: the ids, and the RoPE table length they were rotated with. */
typedef struct chat_cache {
    int32_t *ids;               /* (ctx) host */
    int64_t n;
    int64_t rope_len;           /* ft_gen_set_rope_len's seq_len of those rows */
} chat_cache;

/* Tokens of ids[0..n) the cache can keep: the longest common prefix, less one when it is all
 * of ids (the last prompt token is run again for its logits); 0 when the RoPE table for
 * rope_len differs from the cached rows' (a dynamic NTK model past its original length). */
static int64_t cache_keep(const ft_gen_env *e, const chat_cache *c, const int32_t *ids, int64_t n,
                          int64_t rope_len)
{
    int64_t k = 0;
    while (k < c->n && k < n && c->ids[k] == ids[k]) k++;
    if (k >= n) k = n - 1;
    if (k > 0 && rope_len != c->rope_len) {
        const ft_model_config *cfg = &e->m->cfg;
        float a[1024], b[1024]; /* head_dim / 2 <= 1024 (generate.c GEN_MAX_HALF_D) */
        if (cfg->head_dim / 2 > 1024) return 0;
        ft_rope_inv_freq(cfg, rope_len, a);
        ft_rope_inv_freq(cfg, c->rope_len, b);
        if (memcmp(a, b, (size_t)(cfg->head_dim / 2) * sizeof(float)) != 0) k = 0;
    }
    return k;
}

/* Records what the cache holds after a reply r to ids[0..n): ids, then the reply's tokens,
 * e->g.past[0] of them. */
static void cache_note(const ft_gen_env *e, chat_cache *c, const ft_gen_result *r, int64_t rope_len)
{
    const int64_t past = e->g.past[0];
    const int64_t from_prompt = past < r->n_prompt ? past : r->n_prompt;
    memcpy(c->ids, r->prompt_ids, (size_t)from_prompt * sizeof *c->ids);
    if (past > from_prompt) memcpy(c->ids + from_prompt, r->out_ids, (size_t)(past - from_prompt) * sizeof *c->ids);
    c->n = past;
    c->rope_len = rope_len;
}

/* ---- the loop ---------------------------------------------------------------------------- */

int gen_run_chat(const gen_opts *o)
{
    ft_gen_env e;
    chat_hist h = {0};
    chat_cache cache = {0};
    char *line = NULL;
    size_t len = 0;
    int rc = gen_open(&e, o);
    const int64_t maxpos = e.m ? e.m->cfg.max_position_embeddings : 0;
    int64_t ctx = o->ctx_size;
    if (!ctx) ctx = maxpos > 0 && maxpos < CHAT_CTX_DEFAULT ? maxpos : CHAT_CTX_DEFAULT;
    if (!rc && ctx <= o->max_new)
        rc = ft_err(FT_E_INVALID, "--max-new-tokens %lld leaves no room for a prompt in a context of "
                    "%lld tokens (--ctx-size)", (long long)o->max_new, (long long)ctx);
    if (!rc && maxpos > 0 && ctx > maxpos)
        fprintf(stderr, "ftune: warning: --ctx-size %lld exceeds the model's max_position_embeddings "
                "(%lld)\n", (long long)ctx, (long long)maxpos);
    const int tmpl = o->tmpl == FT_CHAT_AUTO && e.tok ? ft_chat_template_detect(e.tok) : o->tmpl;
    if (!rc) gen_warn_no_think(o, e.tok, tmpl);
    /* one cache of ctx tokens: prompts of up to ctx - max_new tokens and their replies */
    const ft_gen_need nd = {ctx - o->max_new, ctx, o->max_new, o->rep_penalty != 1};
    if (!rc) rc = gen_plan(&e, o, &nd, tmpl, 1);
    if (!rc && !(cache.ids = malloc((size_t)ctx * sizeof *cache.ids))) rc = ft_err(-ENOMEM, "out of memory");
    const int tty = isatty(0);
    /* ^C from here on: a reply stops, the prompt quits */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_replying = 0;
    g_stop = 0;
    const int installed = !rc && sigaction(SIGINT, &sa, &old) == 0;
    if (!rc && o->temperature > 0) fprintf(stderr, "ftune: seed %lld\n", (long long)o->seed);
    if (!rc && (!o->quiet || tty))
        fprintf(stderr, "ftune: chat (template %s, context %lld tokens, up to %lld per reply); /help "
                "lists the commands\n", ft_chat_template_name(tmpl), (long long)ctx, (long long)o->max_new);

    int64_t turn = 0;
    while (!rc) {
        fflush(stdout);
        int k = read_turn(&line, &len, tty);
        if (k < 0) rc = k;
        if (k <= 0) break;
        if (blank(line)) continue;
        const char *text = line;
        if (line[0] == '/' && line[1] != '/') {
            char *w = line, *end = line + len; /* the command word, trailing blanks ignored */
            while (end > w && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
            if (!strcmp(w, "/exit")) break;
            if (!strcmp(w, "/help")) {
                chat_help();
            } else if (!strcmp(w, "/reset")) {
                hist_free(&h); /* the cache stays: the next turn reuses the system part */
                turn = 0;
                fputs("ftune: new conversation\n", stderr);
            } else {
                fprintf(stderr, "ftune: unknown command '%s' (/help lists the commands; '//' starts "
                        "a message with '/')\n", w);
            }
            continue;
        }
        if (line[0] == '/') text = line + 1; /* "//...": the text with one '/' removed */

        rc = hist_push(&h, text, strlen(text));
        int32_t *ids = NULL;
        int64_t n = 0, from = 0;
        /* the conversation that fits: the oldest user/assistant pairs left out (turns before
         * `from`), dropped from the history only once the turn is sent, so that a refused
         * message leaves the conversation as it was */
        for (;;) {
            if (!rc) rc = hist_ids(&e, o, &h, from, &ids, &n);
            if (rc || n + o->max_new <= ctx || h.n - from < 3) break;
            free(ids);
            ids = NULL;
            from += 2;
        }
        if (rc == FT_E_INVALID || rc == FT_E_RANGE) { /* a template that cannot render it */
            fprintf(stderr, "ftune: this turn is dropped: %s\n", ft_errmsg());
            hist_pop(&h);
            rc = 0;
            free(ids);
            continue;
        }
        if (!rc && n + o->max_new > ctx) {
            fprintf(stderr, "ftune: this message is too long: %lld prompt tokens + --max-new-tokens "
                    "%lld exceed --ctx-size %lld; it is not sent\n", (long long)n, (long long)o->max_new,
                    (long long)ctx);
            hist_pop(&h);
            free(ids);
            continue;
        }
        if (!rc && from) {
            const int64_t dropped = from / 2;
            hist_drop_front(&h, from);
            fprintf(stderr, "ftune: context: dropped the oldest %lld exchange%s (user turn and reply) "
                    "to fit --ctx-size %lld\n", (long long)dropped, dropped > 1 ? "s" : "", (long long)ctx);
        }
        ft_gen_result r;
        memset(&r, 0, sizeof r);
        turn++;
        if (!rc) {
            const int64_t rope_len = n + o->max_new;
            const int64_t keep = cache_keep(&e, &cache, ids, n, rope_len);
            g_stop = 0;
            g_replying = 1;
            int last_nl = 1;
            const ft_gen_reply_cfg c = gen_reply_cfg(o);
            rc = ft_gen_reply(&e, &c, ids, n, keep, gen_put_text, &last_nl, &g_stop, &r);
            if (!rc && !last_nl) putchar('\n');
            g_replying = 0;
            if (!rc) cache_note(&e, &cache, &r, rope_len);
            else cache.n = 0;
        }
        const char *reply = r.text ? r.text : "";
        const int withdrawn = !rc && r.interrupted && !r.n_out;
        if (!rc && !reply[0] && !withdrawn) putchar('\n'); /* an empty reply: an empty line */
        if (!rc) fflush(stdout);
        if (!rc && r.interrupted)
            fprintf(stderr, "ftune: reply interrupted after %lld tokens%s\n", (long long)r.n_out,
                    r.n_out ? " (kept in the conversation)" : "; the message is withdrawn");
        if (withdrawn) hist_pop(&h);
        else if (!rc) rc = hist_push(&h, reply, strlen(reply));
        if (!rc && !o->quiet)
            fprintf(stderr, "ftune: turn %lld: %lld prompt tokens (%lld from the cache, %lld prefilled "
                    "in %.3f s); %lld reply tokens in %.3f s (%.2f tok/s); stop: %s\n", (long long)turn,
                    (long long)r.n_prompt, (long long)r.n_cached, (long long)(r.n_prompt - r.n_cached),
                    r.prefill_s, (long long)r.n_out, r.decode_s,
                    r.decode_s > 0 && r.n_decode > 0 ? r.n_decode / r.decode_s : 0.0,
                    r.interrupted ? "interrupted" : gen_stop_said(&r));
        if (withdrawn) turn--;
        free(r.text);
        free(ids);
    }
    if (!rc) fflush(stdout);
    if (installed) sigaction(SIGINT, &old, NULL);
    free(line);
    free(cache.ids);
    hist_free(&h);
    ft_gen_env_close(&e);
    return rc;
}
