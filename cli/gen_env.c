/* gen_env.c - the loaded model, KV caches and sampler of `ftune generate`, and the helpers
 * one --prompt and a --prompts file share (gen_env.h). */
#include "cli/gen_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/core/err.h"
#include "src/template/chat.h"
#include "src/infer/sample.h"

double gen_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 when token t ends a reply (the template's end-of-turn or an EOS id). */
int gen_is_stop(const gen_env *e, int32_t t)
{
    for (int s = 0; s < e->n_stop; s++)
        if (t == e->stop[s]) return 1;
    return 0;
}

int gen_id_listed(const int32_t *ids, int64_t n, int32_t t)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

int gen_stop_ids_check(const int32_t *ids, int64_t n, int64_t V, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= V)
            return ft_err(FT_E_INVALID, "%sitem %lld: %d is no token id of the model (its vocabulary "
                          "has %lld, ids 0..%lld)", what, (long long)i + 1, (int)ids[i],
                          (long long)V, (long long)V - 1);
    return 0;
}

void gen_put_piece(const char *s, size_t n, int *last_nl)
{
    if (!n) return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    *last_nl = s[n - 1] == '\n';
}

/* "stop" of the JSON output. */
const char *gen_stop_name(const gen_result *r)
{
    return r->stop == GEN_STOP_STRING ? "stop_string" : r->stop == GEN_STOP_TOKEN ? "stop_token" : "length";
}

/* The same, for the stderr summaries. */
const char *gen_stop_said(const gen_result *r)
{
    return r->stop == GEN_STOP_STRING ? "stop string" : r->stop == GEN_STOP_TOKEN ? "end token" : "--max-new-tokens";
}

/* Streams what ft_stop_text_safe allows of a reply's text (stop_text.h). */
void gen_show_text(ft_stop_text *x, const ft_str_list *stop, int final, int *last_nl)
{
    const size_t safe = ft_stop_text_safe(x, stop->v, stop->n, final);
    if (safe > x->shown) {
        gen_put_piece(x->buf + x->shown, safe - x->shown, last_nl);
        x->shown = safe;
    }
}

/* Loads the model, backend, adapter and tokenizer (cli/session.h ft_session_open_quant). With
 * --quant nf4 the model is loaded deferred and every base weight is read from its NF4 pack
 * (as `ftune eval --quant nf4`: the base a QLoRA adapter was trained on, with the run's
 * --quant-correction), no fp32 copy in memory; on a device the bf16 base stays deferred too
 * until gen_env_plan's ft_session_plan reads it or streams it from its bf16 pack. */
int gen_env_open(gen_env *e, const gen_opts *o)
{
    memset(e, 0, sizeof *e);
    int rc = ft_session_open_quant(&e->s, o->model, o->adapter, o->device, (int)o->threads,
                                   o->quant, o->cache_dir, o->gpu_mem, o->host_mem, NULL);
    e->m = e->s.model;
    if (!rc) rc = ft_model_tokenizer(e->m, &e->tok);
    if (!rc) rc = gen_stop_ids_check(o->stop_ids.v, o->stop_ids.n, e->m->cfg.vocab_size,
                                     "--stop-token-ids: ");
    return rc;
}

/* Sizes the KV caches of `slots` sequences (decoded together) for nd->ctx tokens each
 * (prompts of up to nd->max_prompt tokens, prefilled in chunks of at most
 * FT_GEN_CHUNK_DEFAULT, and their replies); the sampler (the command line's settings), the
 * buffers and the stop tokens of the resolved template tmpl. With several slots the forwards
 * take up to max_prompt * slots tokens (at most FT_GEN_CHUNK_DEFAULT), so that the prompts
 * that start together are prefilled in one forward (ft_gen_prefill); on a device with the
 * default batch, only as many as keep the arena within a quarter of the budget. */
/* Rows of logits per forward: one per slot for a decode step, or plp for a prompt whose
 * log-probabilities are asked for, whichever is more. */
static int64_t rows_of(int64_t slots, int64_t plp) { return slots > plp ? slots : plp; }

int gen_env_plan(gen_env *e, const gen_opts *o, const gen_need *nd, int tmpl, int64_t slots)
{
    const int64_t V = e->m->cfg.vocab_size, ctx = nd->ctx, max_prompt = nd->max_prompt;
    if (slots > ctx) slots = ctx; /* a decode step has at most chunk <= ctx rows */
    e->slots = slots;
    int64_t chunk = max_prompt < FT_GEN_CHUNK_DEFAULT ? max_prompt : FT_GEN_CHUNK_DEFAULT;
    if (chunk < slots) chunk = slots;
    /* rows of logits per forward: a decode step's (one per slot), or a prompt's whose
     * log-probabilities are asked for (ft_gen_prompt_logprobs) */
    const int64_t plp = nd->plp_rows < chunk ? nd->plp_rows : chunk;
    /* the rows of a batched prefill: every slot's prompt at once, up to the default chunk */
    int64_t wide = max_prompt < FT_GEN_CHUNK_DEFAULT / slots ? max_prompt * slots : FT_GEN_CHUNK_DEFAULT;
    if (wide < chunk) wide = chunk;
    const ft_lora *lora = e->s.has_lora ? &e->s.lora : NULL;
    if (e->m->pack_only[0] || !e->s.be->ops->host_memory) {
        /* the weights through an executor for chunks of up to `chunk` tokens: on a device the
         * bf16 copies it places (as training reads them) or the pack's blocks; over a pack on
         * the CPU the whole pack in memory, as every token visits every layer */
        e->s.pack_in_memory = 1;
        /* generation reads only the executor's weights: its activation arena (sized by T)
         * stays small, whatever the chunk (1024 tokens would be 1.65 GiB for an 8B model) */
        /* the KV cache and buffers allocated after the placement: kept out of its budget */
        if (!e->s.be->ops->host_memory) {
            /* the default batch on a GPU: at most a quarter of the budget for the KV caches
             * (each sequence has its own), so that they do not push base layers out to the
             * streamed tiers; an explicit --batch is taken as given */
            ft_mem_budget mb = {0};
            const uint64_t budget = ft_backend_mem_budget(e->s.be, o->gpu_mem, 0, &mb) ? 0 : mb.budget;
            const int64_t asked = slots;
            while (!o->batch_set && slots > 1 && budget &&
                   ft_gen_source_bytes(e->m, lora, ctx, chunk, rows_of(slots, plp), slots) >
                       budget / 4)
                slots--;
            if (slots < asked) {
                fprintf(stderr, "ftune: %lld prompts at a time, not %lld: their KV caches of %lld "
                        "tokens would take more than a quarter of the GPU budget (--batch sets it)\n",
                        (long long)slots, (long long)asked, (long long)ctx);
                e->slots = slots;
            }
            /* the batched prefill's rows within what is left of that quarter (the slots first:
             * every decode step gains from them, a prefill once per prompt) */
            if (wide > max_prompt * slots) wide = max_prompt * slots;
            if (wide < chunk) wide = chunk;
            while (!o->batch_set && budget && wide > chunk &&
                   ft_gen_source_bytes(e->m, lora, ctx, wide, rows_of(slots, plp), slots) >
                       budget / 4)
                wide = wide - max_prompt > chunk ? wide - max_prompt : chunk;
            e->s.gpu_reserve = (int64_t)ft_gen_source_bytes(e->m, lora, ctx, wide,
                                                            rows_of(slots, plp), slots);
        }
        FT_TRY(ft_session_plan(&e->s, chunk < GEN_EXEC_T ? chunk : GEN_EXEC_T));
        FT_TRY(ft_exec_gen_source(e->s.ex, &e->src));
        FT_TRY(ft_gen_init_slots(&e->g, e->s.be, e->m, lora, &e->src, ctx, wide,
                                 rows_of(slots, plp), slots));
    } else {
        FT_TRY(ft_gen_init_slots(&e->g, e->s.be, e->m, lora, NULL, ctx, wide,
                                 rows_of(slots, plp), slots));
    }
    const int64_t rows = e->g.logit_rows_max;
    ft_sample_cfg sc = {o->temperature, o->top_k, o->top_p, (uint64_t)o->seed, o->rep_penalty, o->min_p,
                        o->presence_penalty, o->frequency_penalty};
    FT_TRY(ft_sampler_init(&e->smp, &sc, V));
    if (o->presence_penalty != 0 || o->frequency_penalty != 0) FT_TRY(ft_sample_counts_init(&e->cnt, V));
    if (nd->seen) { /* each sequence's ids, for the penalty */
        e->seen = calloc((size_t)slots, sizeof *e->seen);
        if (!e->seen) return ft_err(-ENOMEM, "out of memory");
        for (int64_t k = 0; k < slots; k++) FT_TRY(ft_sample_seen_init(&e->seen[k], V));
    }
    e->logits = malloc((size_t)(rows * V) * sizeof(float));
    e->max_new = nd->max_new;
    e->out_ids = malloc((size_t)(slots * nd->max_new) * sizeof(int32_t));
    if (!e->logits || !e->out_ids) return ft_err(-ENOMEM, "out of memory");
    if (nd->lp_n > 0) { /* each reply token's log-probabilities, sized once */
        const size_t n = (size_t)slots * (size_t)nd->max_new * (size_t)nd->lp_n;
        e->lp_n = nd->lp_n;
        e->lp_val = malloc(n * sizeof *e->lp_val);
        e->lp_ids = malloc(n * sizeof *e->lp_ids);
        if (!e->lp_val || !e->lp_ids)
            return ft_err(-ENOMEM, "out of memory for the log-probabilities of %lld x %lld tokens",
                          (long long)slots, (long long)nd->max_new);
    }
    const char *eot = ft_chat_end_of_turn(tmpl);
    char jeot[64];
    if (tmpl == FT_CHAT_JINJA) { /* what the model's template writes after a reply */
        ft_chat_ctx ctx = {ft_tok_bos_str(e->tok), ft_tok_eos_str(e->tok), ft_tok_chat_template(e->tok)};
        /* a template that cannot render the probe leaves only the EOS ids to stop on */
        if (ft_chat_jinja_end_of_turn(&ctx, jeot, sizeof jeot))
            fprintf(stderr, "ftune: warning: no end-of-turn word from the chat template (%s); "
                    "stopping on the EOS only\n", ft_errmsg());
        eot = jeot[0] ? jeot : NULL;
    }
    e->n_stop = ft_sample_stop_ids(&e->m->cfg, e->tok, eot, e->stop, MAX_STOP);
    return 0;
}

void gen_env_close(gen_env *e)
{
    ft_sample_counts_free(&e->cnt);
    for (int64_t k = 0; e->seen && k < e->slots; k++) ft_sample_seen_free(&e->seen[k]);
    free(e->seen);
    free(e->logits);
    free(e->out_ids);
    free(e->lp_val);
    free(e->lp_ids);
    ft_sampler_free(&e->smp);
    ft_gen_free(&e->g);
    ft_tok_free(e->tok);
    ft_session_close(&e->s);
    memset(e, 0, sizeof *e);
}

cJSON *gen_ids_json(const int32_t *ids, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* "seed": the seed as a JSON integer. cJSON prints numbers with %.15g, which writes a 16-digit
 * seed ending in 0 as 1.79577021929528e+15: exact, but a script reading it back gets a float,
 * which --seed refuses. Seeds are < 2^53 (--seed, the clock's, the per-record ones). */
void gen_add_seed(cJSON *j, uint64_t seed)
{
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)seed);
    cJSON_AddRawToObject(j, "seed", b);
}

void gen_warn_context(const gen_env *e, int64_t n_prompt, int64_t max_new, const char *what)
{
    const int64_t maxpos = e->m->cfg.max_position_embeddings;
    if (maxpos > 0 && n_prompt + max_new > maxpos)
        fprintf(stderr, "ftune: warning: %s%lld prompt + %lld new tokens exceed the model's "
                "max_position_embeddings (%lld)\n", what, (long long)n_prompt, (long long)max_new,
                (long long)maxpos);
}

/* FT_GEN_* flags of the options. */
int gen_flags(const gen_opts *o)
{
    return (o->raw ? FT_GEN_RAW : 0) | (o->no_think ? FT_GEN_NO_THINK : 0);
}

/* --no-think with a template that has no enable_thinking switch: said once, as transformers
 * passes enable_thinking to any template and those ignore it. */
void gen_warn_no_think(const gen_opts *o, const ft_tokenizer *tok, int tmpl)
{
    const char *src = ft_tok_chat_template(tok);
    /* the engine passes enable_thinking=false to the model's template, which may read it */
    int reads = tmpl == FT_CHAT_QWEN3 || (tmpl == FT_CHAT_JINJA && src && strstr(src, "enable_thinking"));
    if (o->no_think && !reads)
        fprintf(stderr, "ftune: warning: --no-think has no effect with chat template %s (it has no "
                "enable_thinking switch)\n", ft_chat_template_name(tmpl));
}

/* ---- log-probabilities ------------------------------------------------------------------- */

void gen_lp_attach(const gen_env *e, int64_t k, int64_t top, gen_result *r)
{
    if (top < 0 || top >= e->lp_n) return;
    if (top > e->smp.V) top = e->smp.V; /* a vocabulary smaller than k: every token listed */
    r->lp = e->lp_val + k * e->max_new * e->lp_n;
    r->lp_ids = e->lp_ids + k * e->max_new * e->lp_n;
    r->lp_stride = e->lp_n;
    r->lp_top = top;
}

int gen_lp_note(const gen_env *e, gen_result *r, const float *logits, int32_t t)
{
    if (!r->lp) return 0;
    const int64_t at = r->n_out * r->lp_stride;
    r->lp_ids[at] = t;
    return ft_sample_logprobs(logits, e->smp.V, t, r->lp_top, &r->lp[at], &r->lp_ids[at + 1],
                              &r->lp[at + 1], NULL);
}

/* ---- log-probabilities as JSON ------------------------------------------------------------- */

/* OpenAI's and vLLM's stand-in for a log-probability of -inf (JSON has no infinity). */
#define LOGPROB_FLOOR -9999.0

/* v for JSON: the -inf stand-in below the floor; else the double nearest to v's 9 significant
 * digits, which read back as v in float (FLT_DECIMAL_DIG) and which cJSON prints in as many
 * digits (it would print v's own double in 17). */
double gen_lp_out(float v)
{
    if (!(v > LOGPROB_FLOOR)) return LOGPROB_FLOOR;
    char b[32];
    snprintf(b, sizeof b, "%.9g", (double)v);
    return strtod(b, NULL);
}

/* Token id's text (its bytes as valid UTF-8) and raw bytes, malloc'ed; *chars its length in
 * characters. */
static int token_strs(const ft_tokenizer *tok, int32_t id, char **text, char **raw, size_t *raw_n,
                      int64_t *chars)
{
    *text = NULL;
    FT_TRY(ft_tok_token_bytes(tok, id, raw, raw_n));
    size_t tn = 0;
    int rc = ft_tok_utf8_lossy(*raw, *raw_n, text, &tn);
    if (rc) {
        free(*raw);
        *raw = NULL;
        return rc;
    }
    int64_t c = 0;
    for (size_t i = 0; i < tn; i++) c += ((unsigned char)(*text)[i] & 0xC0) != 0x80;
    *chars = c;
    return 0;
}

int gen_token_text(const ft_tokenizer *tok, int32_t id, char **text, int64_t *chars)
{
    char *raw = NULL;
    size_t raw_n = 0;
    int64_t c = 0;
    int rc = token_strs(tok, id, text, &raw, &raw_n, &c);
    free(raw);
    if (chars) *chars = c;
    return rc;
}

/* {"token", "logprob", "bytes"} of a chat entry. */
static cJSON *chat_entry(const char *text, const char *raw, size_t raw_n, float lp)
{
    cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateArray();
    if (!o || !b) {
        cJSON_Delete(o);
        cJSON_Delete(b);
        return NULL;
    }
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", gen_lp_out(lp));
    for (size_t i = 0; i < raw_n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    cJSON_AddItemToObject(o, "bytes", b);
    return o;
}

/* Sets key text of object o to v (a key met again keeps its place and takes the last value,
 * as a Python dict built in this order would). */
static void dict_set(cJSON *o, const char *text, double v)
{
    cJSON *it = cJSON_GetObjectItemCaseSensitive(o, text);
    if (it) cJSON_SetNumberValue(it, v);
    else cJSON_AddNumberToObject(o, text, v);
}

int gen_logprobs_json(const ft_tokenizer *tok, const gen_result *r, int api, cJSON **out)
{
    *out = NULL;
    if (!r->lp) return ft_err(FT_E_INVALID, "generate: no log-probabilities were computed");
    cJSON *root = NULL, *content = NULL, *tokens = NULL, *tlp = NULL, *tops = NULL, *offs = NULL;
    if (api == FT_GEN_API_CHAT) {
        root = cJSON_CreateObject();
        content = cJSON_AddArrayToObject(root, "content");
        cJSON_AddNullToObject(root, "refusal");
    } else if (api == FT_GEN_API_COMPLETIONS) {
        root = cJSON_CreateObject();
        tokens = cJSON_AddArrayToObject(root, "tokens");
        tlp = cJSON_AddArrayToObject(root, "token_logprobs");
        tops = cJSON_AddArrayToObject(root, "top_logprobs");
        offs = cJSON_AddArrayToObject(root, "text_offset");
    } else {
        root = content = cJSON_CreateArray();
    }
    if (!root || !content == !tokens || (tokens && (!tlp || !tops || !offs)))
        goto oom;
    int64_t offset = 0;
    for (int64_t i = 0; i < r->n_out; i++) {
        const float *v = r->lp + i * r->lp_stride;
        const int32_t *d = r->lp_ids + i * r->lp_stride;
        char *text = NULL, *raw = NULL;
        size_t raw_n = 0;
        int64_t chars = 0;
        int rc = token_strs(tok, d[0], &text, &raw, &raw_n, &chars);
        if (rc) {
            cJSON_Delete(root);
            return rc;
        }
        cJSON *e = NULL, *top = NULL;
        if (api == FT_GEN_API_CHAT) {
            e = chat_entry(text, raw, raw_n, v[0]);
            top = e ? cJSON_AddArrayToObject(e, "top_logprobs") : NULL;
            if (e) cJSON_AddItemToArray(content, e);
        } else if (api == FT_GEN_API_COMPLETIONS) {
            cJSON_AddItemToArray(tokens, cJSON_CreateString(text));
            cJSON_AddItemToArray(tlp, cJSON_CreateNumber(gen_lp_out(v[0])));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
            offset += chars;
            top = cJSON_CreateObject();
            if (top) {
                cJSON_AddItemToArray(tops, top);
                dict_set(top, text, gen_lp_out(v[0])); /* the token first (vLLM's order) */
            }
        } else {
            e = cJSON_CreateObject();
            if (e) {
                cJSON_AddItemToArray(content, e);
                cJSON_AddNumberToObject(e, "id", d[0]);
                cJSON_AddStringToObject(e, "token", text);
                cJSON_AddNumberToObject(e, "logprob", gen_lp_out(v[0]));
                top = cJSON_AddArrayToObject(e, "top");
            }
        }
        free(text);
        free(raw);
        if (!top) goto oom;
        for (int64_t j = 1; j <= r->lp_top; j++) {
            if (api == FT_GEN_API_NONE) {
                cJSON *pair = cJSON_CreateArray();
                if (!pair) goto oom;
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(d[j]));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(gen_lp_out(v[j])));
                cJSON_AddItemToArray(top, pair);
                continue;
            }
            if (api == FT_GEN_API_COMPLETIONS && d[j] == d[0]) continue; /* listed first */
            rc = token_strs(tok, d[j], &text, &raw, &raw_n, &chars);
            if (rc) {
                cJSON_Delete(root);
                return rc;
            }
            if (api == FT_GEN_API_CHAT) {
                cJSON *a = chat_entry(text, raw, raw_n, v[j]);
                if (a) cJSON_AddItemToArray(top, a);
                else rc = -ENOMEM;
            } else {
                dict_set(top, text, gen_lp_out(v[j]));
            }
            free(text);
            free(raw);
            if (rc) goto oom;
        }
    }
    *out = root;
    return 0;
oom:
    cJSON_Delete(root);
    return ft_err(-ENOMEM, "out of memory");
}
