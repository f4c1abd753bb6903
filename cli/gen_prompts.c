/* gen_prompts.c - `ftune generate --prompts FILE`: every record of FILE read and encoded before
 * anything is generated (a bad record stops the run with its line), then answered by the
 * library's batch scheduler (src/infer/gen_env.h ft_gen_batch), one JSON line per record in
 * record order (cmd_generate.c's header gives the format), to stdout or --out FILE (written as
 * FILE.tmp.PID and renamed when complete). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gen_cli.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/template/chat.h"
#include "src/data/records.h"

/* One record of the file, with its settings: the command line's, replaced by its own. */
typedef struct prompt_rec {
    ft_gen_req q;
    char where[300];            /* "FILE: line N" / "FILE: record N" */
    int32_t *ids;
} prompt_rec;

typedef struct prompts {
    prompt_rec *r;
    ft_gen_item *it;            /* (n) what the scheduler reads of each */
    int64_t n, cap;
    FILE *f;                    /* where the lines go */
    char tmp[4200];             /* --out's temporary name */
    const gen_opts *o;
    const ft_tokenizer *tok;
} prompts;

static void prompts_free(prompts *b)
{
    for (int64_t i = 0; i < b->n; i++) {
        ft_gen_req_free(&b->r[i].q);
        free(b->r[i].ids);
    }
    free(b->r);
    free(b->it);
    memset(b, 0, sizeof *b);
}

/* Record i's reply settings: the command line's, with the record's own. */
static ft_gen_reply_cfg rec_cfg(const gen_opts *o, const ft_gen_params *p, int64_t i)
{
    ft_gen_reply_cfg c = gen_reply_cfg(o);
    const unsigned set = p->set;
    c.sc.seed = ft_gen_record_seed((uint64_t)o->seed, i);
    if (set & FT_GEN_SET_TEMPERATURE) c.sc.temperature = p->temperature;
    if (set & FT_GEN_SET_TOP_K) c.sc.top_k = p->top_k;
    if (set & FT_GEN_SET_TOP_P) c.sc.top_p = p->top_p;
    if (set & FT_GEN_SET_MIN_P) c.sc.min_p = p->min_p;
    if (set & FT_GEN_SET_REP_PENALTY) c.sc.repetition_penalty = p->repetition_penalty;
    if (set & FT_GEN_SET_SEED) c.sc.seed = p->seed;
    if (set & FT_GEN_SET_MAX_NEW) c.max_new = p->max_new_tokens;
    if (set & FT_GEN_SET_STOP) c.stop = (const char *const *)p->stop, c.n_stop = p->n_stop;
    if (set & FT_GEN_SET_STOP_IDS) c.stop_ids = p->stop_ids, c.n_stop_ids = p->n_stop_ids;
    return c;
}

/* Reads and checks every record of o->prompts (no model needed). */
static int prompts_read(prompts *b, const gen_opts *o)
{
    ft_records rs;
    ft_record rec;
    int rc = ft_records_open(&rs, o->prompts), k = 0;
    while (!rc && (k = ft_records_next(&rs, &rec)) == 1) {
        if (b->n == b->cap) {
            int64_t cap = b->cap ? 2 * b->cap : 64;
            prompt_rec *p = realloc(b->r, (size_t)cap * sizeof *p);
            ft_gen_item *q = p ? realloc(b->it, (size_t)cap * sizeof *q) : NULL;
            if (p) b->r = p;
            if (q) b->it = q;
            if (!p || !q) {
                rc = ft_err(-ENOMEM, "out of memory");
                break;
            }
            b->cap = cap;
        }
        prompt_rec *x = &b->r[b->n];
        memset(x, 0, sizeof *x);
        ft_records_where(&rs, rec.loc, x->where, sizeof x->where);
        if (!rec.json) {
            rc = ft_err(FT_E_INVALID, "%s: %s", x->where, rec.err);
            break;
        }
        rc = ft_gen_req_parse(&x->q, rec.json, o->system, o->raw);
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        b->it[b->n] = (ft_gen_item){NULL, 0, rec_cfg(o, &x->q.params, b->n), x->where};
        b->n++;
    }
    if (!rc && k < 0) rc = k;
    if (!rc && b->n == 0)
        rc = ft_err(FT_E_INVALID, "%s: no records (expected JSONL or a JSON array of prompts)",
                    o->prompts);
    ft_records_close(&rs);
    return rc;
}

static int out_open(prompts *b, const char *path)
{
    b->f = stdout;
    if (!path) return 0;
    if (snprintf(b->tmp, sizeof b->tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof b->tmp)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    b->f = fopen(b->tmp, "w");
    if (!b->f) return ft_err(-errno, "%s: cannot create: %s", b->tmp, strerror(errno));
    return 0;
}

/* Completes (ok = 1: flush, fsync, rename to path) or abandons (removes the temporary). */
static int out_close(prompts *b, const char *path, int ok)
{
    if (!path || !b->f) return 0;
    int rc = 0;
    if (ok && (fflush(b->f) != 0 || fsync(fileno(b->f)) < 0))
        rc = ft_err(-errno, "%s: write failed: %s", b->tmp, strerror(errno));
    if (fclose(b->f) != 0 && ok && !rc)
        rc = ft_err(-errno, "%s: write failed: %s", b->tmp, strerror(errno));
    b->f = NULL;
    if (ok && !rc && rename(b->tmp, path) < 0)
        rc = ft_err(-errno, "%s: rename from %s failed: %s", path, b->tmp, strerror(errno));
    if (!ok || rc) unlink(b->tmp);
    else ft_fsync_parent(path);
    return rc;
}

/* ft_gen_done_fn: record i's line, and its stderr line. */
static int put_line(void *user, int64_t i, const ft_gen_result *r, double seconds)
{
    prompts *b = user;
    const prompt_rec *x = &b->r[i];
    const ft_gen_item *it = &b->it[i];
    cJSON *j = cJSON_CreateObject();
    if (!j) return ft_err(-ENOMEM, "out of memory");
    cJSON_AddNumberToObject(j, "index", (double)i);
    cJSON_AddStringToObject(j, "prompt", x->q.user);
    cJSON_AddStringToObject(j, "reply", r->text ? r->text : "");
    if (x->q.reference) cJSON_AddStringToObject(j, "reference", x->q.reference);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(j, "new_tokens", (double)r->n_out);
    cJSON_AddStringToObject(j, "stop", gen_stop_name(r));
    if (r->stop == FT_GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", it->c.stop[r->stop_str]);
    /* a stop token the record (or --stop-token-ids) asked for: its id, as vLLM's
     * CompletionOutput.stop_reason (not for the EOS, which vLLM checks first) */
    if (r->stop == FT_GEN_STOP_TOKEN && r->stop_tok != ft_tok_eos(b->tok) &&
        ft_gen_id_listed(it->c.stop_ids, it->c.n_stop_ids, r->stop_tok))
        cJSON_AddNumberToObject(j, "stop_reason", r->stop_tok);
    cJSON_AddNumberToObject(j, "seconds", seconds);
    if (it->c.sc.temperature > 0) gen_add_seed(j, it->c.sc.seed);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    int bad = fputs(s, b->f) < 0 || fputc('\n', b->f) == EOF || fflush(b->f) != 0;
    free(s);
    if (bad)
        return ft_err(-EIO, "%s: write failed: %s", b->o->out ? b->o->out : "stdout", strerror(errno));
    fprintf(stderr, "ftune: [%lld/%lld] %lld prompt + %lld new tokens in %.3f s; stop: %s\n",
            (long long)(i + 1), (long long)b->n, (long long)r->n_prompt, (long long)r->n_out, seconds,
            gen_stop_said(r));
    return 0;
}

/* Encodes every record (the caches are sized for the longest prompt + its reply) and warns
 * about those beyond the model's max_position_embeddings. */
static int prompts_encode(prompts *b, const ft_gen_env *e, ft_gen_need *nd, int *tmpl, int64_t *n_sampled)
{
    const gen_opts *o = b->o;
    int64_t n_over = 0, over_len = 0, over_new = 0;
    const int64_t maxpos = e->m->cfg.max_position_embeddings;
    for (int64_t i = 0; i < b->n; i++) {
        prompt_rec *x = &b->r[i];
        ft_gen_item *it = &b->it[i];
        int rc = ft_gen_req_ids(e->tok, o->tmpl, &x->q, gen_flags(o), &x->ids, &it->n, tmpl);
        if (!rc && it->n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
        if (!rc && (x->q.params.set & FT_GEN_SET_STOP_IDS))
            rc = ft_gen_ids_check(it->c.stop_ids, it->c.n_stop_ids, e->m->cfg.vocab_size,
                                  "'stop_token_ids' ");
        if (rc) return ft_err_prefix(rc, "%s", x->where);
        it->ids = x->ids;
        const int64_t need = it->n + it->c.max_new;
        if (it->n > nd->max_prompt) nd->max_prompt = it->n;
        if (need > nd->ctx) nd->ctx = need;
        if (it->c.max_new > nd->max_new) nd->max_new = it->c.max_new;
        nd->seen |= it->c.sc.repetition_penalty != 1;
        *n_sampled += it->c.sc.temperature > 0 && !(x->q.params.set & FT_GEN_SET_SEED);
        if (maxpos > 0 && need > maxpos && (!n_over++ || need > over_len + over_new)) {
            over_len = it->n;
            over_new = it->c.max_new;
        }
    }
    if (n_over) {
        char what[96];
        snprintf(what, sizeof what, "%lld of %lld records, the longest with ", (long long)n_over,
                 (long long)b->n);
        gen_warn_context(e, over_len, over_new, what);
    }
    return 0;
}

/* The summary line on stderr. */
static void prompts_said(const prompts *b, const ft_gen_env *e, const ft_gen_batch_stats *st, double t)
{
    char visits[96] = "";
    if (e->src.layer) { /* the executor's counts (offload/exec.h ft_exec_info) */
        ft_exec_info xi;
        ft_exec_get_info(e->s.ex, &xi);
        int w = snprintf(visits, sizeof visits, ", %lld layer visits", (long long)xi.layer_fetches);
        if (xi.h2d_bytes)
            snprintf(visits + w, sizeof visits - (size_t)w, " (%.1f MiB streamed)",
                     (double)xi.h2d_bytes / 1048576.0);
    }
    fprintf(stderr, "ftune: %lld prompts, %lld new tokens in %.3f s (%.2f tok/s; %lld decode "
            "steps); %lld prefill forwards (%lld prompts prefilled with others)%s%s%s\n",
            (long long)b->n, (long long)st->new_tokens, t, t > 0 ? st->new_tokens / t : 0.0,
            (long long)st->steps, (long long)st->forwards, (long long)st->batched, visits,
            b->o->out ? "; wrote " : "", b->o->out ? b->o->out : "");
}

int gen_run_prompts(const gen_opts *o)
{
    prompts b = {0};
    b.o = o;
    ft_gen_env e;
    memset(&e, 0, sizeof e);
    ft_gen_need nd = {0, 0, 0, 0};
    int64_t n_sampled = 0;
    int tmpl = 0, rc = prompts_read(&b, o);
    if (!rc) rc = out_open(&b, o->out);
    if (!rc) rc = gen_open(&e, o);
    b.tok = e.tok;
    if (!rc) rc = prompts_encode(&b, &e, &nd, &tmpl, &n_sampled);
    /* the seed the records' own derive from (unless they set theirs) */
    if (!rc && n_sampled) fprintf(stderr, "ftune: seed %lld\n", (long long)o->seed);
    if (!rc) gen_warn_no_think(o, e.tok, tmpl);
    if (!rc) rc = gen_plan(&e, o, &nd, tmpl, o->batch < b.n ? o->batch : b.n);
    if (!rc)
        fprintf(stderr, "ftune: %lld prompts from %s (template %s, %lld at a time, KV cache of %lld "
                "tokens each)\n", (long long)b.n, o->prompts, o->raw ? "raw" : ft_chat_template_name(tmpl),
                (long long)e.n_seqs, (long long)e.g.ctx_max);
    /* FTUNE_GEN_PREFILL=each: one prompt per prefill forward (for comparisons) */
    const char *pv = getenv("FTUNE_GEN_PREFILL");
    ft_gen_batch_stats st;
    const double t0 = ft_gen_now_s();
    if (!rc) rc = ft_gen_batch(&e, b.it, b.n, pv && !strcmp(pv, "each"), put_line, &b, &st);
    if (!rc) prompts_said(&b, &e, &st, ft_gen_now_s() - t0);
    int rc2 = out_close(&b, o->out, !rc);
    if (!rc) rc = rc2;
    ft_gen_env_close(&e);
    prompts_free(&b);
    return rc;
}
