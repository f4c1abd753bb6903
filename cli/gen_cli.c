/* gen_cli.c - the helpers the parts of `ftune generate` in cli/ share (gen_cli.h). */
#include "cli/gen_cli.h"

#include <stdio.h>
#include <string.h>

#include "cli/session.h"
#include "src/core/err.h"
#include "src/template/chat.h"

ft_gen_reply_cfg gen_reply_cfg(const gen_opts *o)
{
    ft_gen_reply_cfg c = {{o->temperature, o->top_k, o->top_p, (uint64_t)o->seed, o->rep_penalty, o->min_p},
                          o->max_new, o->stop.v, o->stop.n, o->stop_ids.v, o->stop_ids.n};
    return c;
}

int gen_flags(const gen_opts *o)
{
    return (o->raw ? FT_GEN_RAW : 0) | (o->no_think ? FT_GEN_NO_THINK : 0);
}

int gen_open(ft_gen_env *e, const gen_opts *o)
{
    memset(e, 0, sizeof *e);
    int rc = ft_session_open_quant(&e->s, o->model, o->adapter, o->device, (int)o->threads,
                                   o->quant, o->cache_dir, o->gpu_mem, o->host_mem, NULL);
    if (!rc) rc = ft_gen_env_load(e);
    if (!rc) rc = ft_gen_ids_check(o->stop_ids.v, o->stop_ids.n, e->m->cfg.vocab_size,
                                   "--stop-token-ids: ");
    return rc;
}

int gen_plan(ft_gen_env *e, const gen_opts *o, const ft_gen_need *nd, int tmpl, int64_t n_seqs)
{
    const ft_gen_reply_cfg c = gen_reply_cfg(o);
    int eot_warn = 0;
    FT_TRY(ft_gen_env_plan(e, nd, &c.sc, tmpl, n_seqs, o->gpu_mem, !o->batch_set, &eot_warn));
    if (eot_warn)
        fprintf(stderr, "ftune: warning: no end-of-turn word from the chat template (%s); "
                "stopping on the EOS only\n", ft_errmsg());
    if (e->n_seqs < n_seqs && !e->s.be->ops->host_memory)
        fprintf(stderr, "ftune: %lld prompts at a time, not %lld: their KV caches of %lld "
                "tokens would take more than a quarter of the GPU budget (--batch sets it)\n",
                (long long)e->n_seqs, (long long)n_seqs, (long long)nd->ctx);
    return 0;
}

void gen_put_text(void *user, const char *s, size_t n)
{
    if (!n) return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    *(int *)user = s[n - 1] == '\n';
}

const char *gen_stop_name(const ft_gen_result *r)
{
    return r->stop == FT_GEN_STOP_STRING ? "stop_string" : r->stop == FT_GEN_STOP_TOKEN ? "stop_token" : "length";
}

const char *gen_stop_said(const ft_gen_result *r)
{
    return r->stop == FT_GEN_STOP_STRING ? "stop string" : r->stop == FT_GEN_STOP_TOKEN ? "end token" : "--max-new-tokens";
}

cJSON *gen_ids_json(const int32_t *ids, int64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

void gen_add_seed(cJSON *j, uint64_t seed)
{
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)seed);
    cJSON_AddRawToObject(j, "seed", b);
}

void gen_warn_context(const ft_gen_env *e, int64_t n_prompt, int64_t max_new, const char *what)
{
    const int64_t maxpos = e->m->cfg.max_position_embeddings;
    if (maxpos > 0 && n_prompt + max_new > maxpos)
        fprintf(stderr, "ftune: warning: %s%lld prompt + %lld new tokens exceed the model's "
                "max_position_embeddings (%lld)\n", what, (long long)n_prompt, (long long)max_new,
                (long long)maxpos);
}

void gen_warn_no_think(const gen_opts *o, const ft_tokenizer *tok, int tmpl)
{
    const char *src = ft_tok_chat_template(tok);
    /* the engine passes enable_thinking=false to the model's template, which may read it */
    int reads = tmpl == FT_CHAT_QWEN3 || (tmpl == FT_CHAT_JINJA && src && strstr(src, "enable_thinking"));
    if (o->no_think && !reads)
        fprintf(stderr, "ftune: warning: --no-think has no effect with chat template %s (it has no "
                "enable_thinking switch)\n", ft_chat_template_name(tmpl));
}
