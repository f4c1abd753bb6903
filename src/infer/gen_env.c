/* gen_env.c - the loaded model, KV caches and sampler of a generation run, and the reply to
 * one prompt (gen_env.h). */
#include "src/infer/gen_env.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/core/err.h"
#include "src/template/chat.h"

double ft_gen_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ft_gen_id_listed(const int32_t *ids, int64_t n, int32_t t)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] == t) return 1;
    return 0;
}

int ft_gen_ids_check(const int32_t *ids, int64_t n, int64_t V, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= V)
            return ft_err(FT_E_INVALID, "%sitem %lld: %d is no token id of the model (its vocabulary "
                          "has %lld, ids 0..%lld)", what, (long long)i + 1, (int)ids[i],
                          (long long)V, (long long)V - 1);
    return 0;
}

int ft_gen_env_load(ft_gen_env *e)
{
    e->m = e->s.model;
    return ft_model_tokenizer(e->m, &e->tok);
}

/* The forward sizes: chunk (a prompt's prefill) and wide (the prompts that start together),
 * and on a device with fit the sequences and wide lowered until the arena takes at most a
 * quarter of the budget (the sequences first: every decode step gains from them, a prefill once
 * per prompt). */
static void fit_sizes(ft_gen_env *e, const ft_gen_need *nd, int64_t gpu_mem, int fit,
                      int64_t *n_seqs, int64_t *chunk, int64_t *wide)
{
    const int64_t ctx = nd->ctx, maxp = nd->max_prompt;
    *chunk = maxp < FT_GEN_CHUNK_DEFAULT ? maxp : FT_GEN_CHUNK_DEFAULT;
    if (*chunk < *n_seqs) *chunk = *n_seqs;
    *wide = maxp < FT_GEN_CHUNK_DEFAULT / *n_seqs ? maxp * *n_seqs : FT_GEN_CHUNK_DEFAULT;
    if (*wide < *chunk) *wide = *chunk;
    if (e->s.be->ops->host_memory) return;
    const ft_lora *lora = e->s.has_lora ? &e->s.lora : NULL;
    ft_mem_budget mb = {0};
    const uint64_t budget = ft_backend_mem_budget(e->s.be, gpu_mem, 0, &mb) ? 0 : mb.budget;
    while (fit && *n_seqs > 1 && budget &&
           ft_gen_source_bytes(e->m, lora, ctx, *chunk, *n_seqs, *n_seqs) > budget / 4)
        (*n_seqs)--;
    if (*wide > maxp * *n_seqs) *wide = maxp * *n_seqs;
    if (*wide < *chunk) *wide = *chunk;
    while (fit && budget && *wide > *chunk &&
           ft_gen_source_bytes(e->m, lora, ctx, *wide, *n_seqs, *n_seqs) > budget / 4)
        *wide = *wide - maxp > *chunk ? *wide - maxp : *chunk;
    /* the KV caches and buffers are allocated after the placement: kept out of its budget */
    e->s.gpu_reserve = (int64_t)ft_gen_source_bytes(e->m, lora, ctx, *wide, *n_seqs, *n_seqs);
}

int ft_gen_env_plan(ft_gen_env *e, const ft_gen_need *nd, const ft_sample_cfg *sc, int tmpl,
                    int64_t n_seqs, int64_t gpu_mem, int fit, int *eot_warn)
{
    const int64_t V = e->m->cfg.vocab_size, ctx = nd->ctx;
    if (eot_warn) *eot_warn = 0;
    if (n_seqs > ctx) n_seqs = ctx; /* a decode step has at most chunk <= ctx rows */
    int64_t chunk, wide;
    fit_sizes(e, nd, gpu_mem, fit, &n_seqs, &chunk, &wide);
    e->n_seqs = n_seqs;
    const ft_lora *lora = e->s.has_lora ? &e->s.lora : NULL;
    const ft_gen_source *src = NULL;
    if (e->m->pack_only[0] || !e->s.be->ops->host_memory) {
        /* the weights through an executor: on a device the bf16 copies it places (as training
         * reads them) or the pack's blocks; over a pack on the CPU the whole pack in memory, as
         * every token visits every layer. Its activation arena (sized by T) stays small. */
        e->s.pack_in_memory = 1;
        FT_TRY(ft_session_plan(&e->s, chunk < FT_GEN_EXEC_T ? chunk : FT_GEN_EXEC_T));
        FT_TRY(ft_exec_gen_source(e->s.ex, &e->src));
        src = &e->src;
    }
    FT_TRY(ft_gen_init_seqs(&e->g, e->s.be, e->m, lora, src, ctx, wide, n_seqs, n_seqs));
    FT_TRY(ft_sampler_init(&e->smp, sc, V));
    if (nd->seen) { /* each sequence's ids, for the penalty */
        e->seen = calloc((size_t)n_seqs, sizeof *e->seen);
        if (!e->seen) return ft_err(-ENOMEM, "out of memory");
        for (int64_t k = 0; k < n_seqs; k++) FT_TRY(ft_sample_seen_init(&e->seen[k], V));
    }
    e->logits = malloc((size_t)(n_seqs * V) * sizeof(float));
    e->max_new = nd->max_new;
    e->out_ids = malloc((size_t)(n_seqs * nd->max_new) * sizeof(int32_t));
    if (!e->logits || !e->out_ids) return ft_err(-ENOMEM, "out of memory");
    const char *eot = ft_chat_end_of_turn(tmpl);
    char jeot[64];
    if (tmpl == FT_CHAT_JINJA) { /* what the model's template writes after a reply */
        ft_chat_ctx cc = {ft_tok_bos_str(e->tok), ft_tok_eos_str(e->tok), ft_tok_chat_template(e->tok)};
        /* a template that cannot render the probe leaves only the EOS ids to stop on */
        if (ft_chat_jinja_end_of_turn(&cc, jeot, sizeof jeot) && eot_warn) *eot_warn = 1;
        eot = jeot[0] ? jeot : NULL;
    }
    e->n_eos = ft_sample_stop_ids(&e->m->cfg, e->tok, eot, e->eos, FT_GEN_MAX_EOS);
    return 0;
}

void ft_gen_env_close(ft_gen_env *e)
{
    for (int64_t k = 0; e->seen && k < e->n_seqs; k++) ft_sample_seen_free(&e->seen[k]);
    free(e->seen);
    free(e->logits);
    free(e->out_ids);
    ft_sampler_free(&e->smp);
    ft_gen_free(&e->g);
    ft_tok_free(e->tok);
    ft_session_close(&e->s);
    memset(e, 0, sizeof *e);
}

/* Hands what ft_stop_text_safe allows of a reply's text to on_text. */
static void show_text(ft_stop_text *x, const ft_gen_reply_cfg *c, int final, ft_gen_text_fn on_text,
                      void *user)
{
    const size_t safe = ft_stop_text_safe(x, c->stop, c->n_stop, final);
    if (safe > x->shown) {
        on_text(user, x->buf + x->shown, safe - x->shown);
        x->shown = safe;
    }
}

int ft_gen_reply(ft_gen_env *e, const ft_gen_reply_cfg *c, const int32_t *ids, int64_t n,
                 int64_t keep, ft_gen_text_fn on_text, void *user,
                 const volatile sig_atomic_t *stop, ft_gen_result *r)
{
    memset(r, 0, sizeof *r);
    r->prompt_ids = ids;
    r->n_prompt = n;
    r->n_cached = keep;
    r->out_ids = e->out_ids;
    if (keep < 0 || keep >= n)
        return ft_err(FT_E_INVALID, "generate: %lld cached tokens of a %lld-token prompt", (long long)keep,
                      (long long)n);
    ft_sample_seen *seen = e->seen; /* sequence 0's; NULL without a repetition penalty */
    if (seen) {
        ft_sample_seen_clear(seen);
        ft_sample_seen_add(seen, ids, n); /* the prompt's ids are penalised too */
    }
    ft_stop_text st; /* streamed text and stop strings */
    ft_stop_text_init(&st, e->tok);
    const int use_st = on_text || c->n_stop > 0;
    /* RoPE as a cache sized for this prompt alone would have it (dynamic NTK scaling) */
    int rc = ft_gen_truncate_seq(&e->g, 0, keep);
    if (!rc) rc = ft_gen_set_rope_len_seq(&e->g, 0, n + c->max_new);
    const int64_t chunk = e->g.chunk_max;
    double t0 = ft_gen_now_s();
    for (int64_t i = keep; !rc && i < n && !(stop && *stop); i += chunk) {
        int64_t k = n - i < chunk ? n - i : chunk;
        rc = ft_gen_forward_seq(&e->g, 0, ids + i, k, e->logits, 1);
    }
    r->prefill_s = ft_gen_now_s() - t0;
    if (!rc && stop && *stop) r->interrupted = 1;
    t0 = ft_gen_now_s();
    while (!rc && !r->interrupted && r->n_out < c->max_new) {
        int32_t t;
        rc = ft_sample_next_seen(&e->smp, e->logits, seen, &t);
        if (rc) break;
        if (ft_gen_id_listed(e->eos, e->n_eos, t) || ft_gen_id_listed(c->stop_ids, c->n_stop_ids, t)) {
            r->stop = FT_GEN_STOP_TOKEN; /* its text is not part of the reply (as vLLM's) */
            r->stop_tok = t;
            break;
        }
        e->out_ids[r->n_out++] = t;
        if (seen) ft_sample_seen_add(seen, &t, 1);
        if (use_st) rc = ft_stop_text_push(&st, c->stop, c->n_stop, t);
        if (!rc && on_text) show_text(&st, c, 0, on_text, user);
        if (!rc && st.hit >= 0) break;
        if (!rc && stop && *stop) r->interrupted = 1;
        else if (!rc && r->n_out < c->max_new) {
            rc = ft_gen_forward_seq(&e->g, 0, &t, 1, e->logits, 1);
            r->n_decode++;
        }
    }
    r->decode_s = ft_gen_now_s() - t0;
    if (!rc && use_st) rc = ft_stop_text_flush(&st, c->stop, c->n_stop);
    if (!rc && st.hit >= 0) {
        r->stop = FT_GEN_STOP_STRING;
        r->stop_str = st.hit;
    }
    if (!rc && on_text) show_text(&st, c, 1, on_text, user);
    /* with stop strings the text cut before the one that matched; else the ids decoded */
    if (!rc) rc = c->n_stop ? ft_stop_text_take(&st, &r->text) : ft_tok_decode(e->tok, e->out_ids, r->n_out, 1, &r->text);
    ft_stop_text_free(&st);
    if (rc) ft_gen_reset_seq(&e->g, 0); /* a failed forward empties it; so does any error */
    return rc;
}
