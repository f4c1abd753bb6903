/* gen_batch.c - `ftune generate --prompts FILE`: every record of FILE answered in one process,
 * up to --batch of them decoded together, each in its own KV cache slot, one JSON line each in
 * record order (see cmd_generate.c's header for the format). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/gen_env.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/data/chat.h"
#include "src/data/records.h"

/* ---- --prompts FILE ------------------------------------------------------------------------ */

typedef struct batch_rec {
    ft_gen_req q;
    char where[300];            /* "FILE: line N" / "FILE: record N" */
    int32_t *ids;
    int64_t n;
    /* its settings: the command line's, replaced by those the record sets (q.params) */
    ft_sample_cfg sc;           /* sc.seed: the record's "seed", else ft_gen_record_seed's */
    int64_t max_new;
    const char *const *stop;    /* n_stop: the --stop strings or the record's "stop" */
    int64_t n_stop;
} batch_rec;

typedef struct batch {
    batch_rec *r;
    int64_t n, cap;
} batch;

static void batch_free(batch *b)
{
    for (int64_t i = 0; i < b->n; i++) {
        ft_gen_req_free(&b->r[i].q);
        free(b->r[i].ids);
    }
    free(b->r);
    memset(b, 0, sizeof *b);
}

/* Record i's settings (x->sc, max_new, stop): the command line's, with the record's own. */
static void rec_settings(batch_rec *x, const gen_opts *o, int64_t i)
{
    const ft_gen_params *p = &x->q.params;
    const unsigned set = p->set;
    x->sc = (ft_sample_cfg){o->temperature, o->top_k, o->top_p, ft_gen_record_seed((uint64_t)o->seed, i),
                            o->rep_penalty, o->min_p};
    if (set & FT_GEN_SET_TEMPERATURE) x->sc.temperature = p->temperature;
    if (set & FT_GEN_SET_TOP_K) x->sc.top_k = p->top_k;
    if (set & FT_GEN_SET_TOP_P) x->sc.top_p = p->top_p;
    if (set & FT_GEN_SET_MIN_P) x->sc.min_p = p->min_p;
    if (set & FT_GEN_SET_REP_PENALTY) x->sc.repetition_penalty = p->repetition_penalty;
    if (set & FT_GEN_SET_SEED) x->sc.seed = p->seed;
    x->max_new = set & FT_GEN_SET_MAX_NEW ? p->max_new_tokens : o->max_new;
    x->stop = set & FT_GEN_SET_STOP ? (const char *const *)p->stop : o->stop.v;
    x->n_stop = set & FT_GEN_SET_STOP ? p->n_stop : o->stop.n;
}

/* Reads and checks every record of o->prompts (no model needed). */
static int batch_read(batch *b, const gen_opts *o)
{
    ft_records rs;
    ft_record rec;
    int rc = ft_records_open(&rs, o->prompts), k = 0;
    while (!rc && (k = ft_records_next(&rs, &rec)) == 1) {
        if (b->n == b->cap) {
            int64_t cap = b->cap ? 2 * b->cap : 64;
            batch_rec *p = realloc(b->r, (size_t)cap * sizeof *p);
            if (!p) {
                rc = ft_err(-ENOMEM, "out of memory");
                break;
            }
            b->r = p;
            b->cap = cap;
        }
        batch_rec *x = &b->r[b->n];
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
        rec_settings(x, o, b->n);
        b->n++;
    }
    if (!rc && k < 0) rc = k;
    if (!rc && b->n == 0)
        rc = ft_err(FT_E_INVALID, "%s: no records (expected JSONL or a JSON array of prompts)",
                    o->prompts);
    ft_records_close(&rs);
    return rc;
}

/* The output of --out: FILE.tmp.PID until the run completes. */
typedef struct out_file {
    FILE *f;
    char tmp[4200];
} out_file;

static int out_open(out_file *of, const char *path)
{
    of->f = NULL;
    if (!path) return 0;
    if (snprintf(of->tmp, sizeof of->tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof of->tmp)
        return ft_err(FT_E_RANGE, "%s: path too long", path);
    of->f = fopen(of->tmp, "w");
    if (!of->f) return ft_err(-errno, "%s: cannot create: %s", of->tmp, strerror(errno));
    return 0;
}

/* Completes (ok = 1: flush, fsync, rename to path) or abandons (removes the temporary). */
static int out_close(out_file *of, const char *path, int ok)
{
    if (!of->f) return 0;
    int rc = 0;
    if (ok && (fflush(of->f) != 0 || fsync(fileno(of->f)) < 0))
        rc = ft_err(-errno, "%s: write failed: %s", of->tmp, strerror(errno));
    if (fclose(of->f) != 0 && ok && !rc)
        rc = ft_err(-errno, "%s: write failed: %s", of->tmp, strerror(errno));
    of->f = NULL;
    if (ok && !rc && rename(of->tmp, path) < 0)
        rc = ft_err(-errno, "%s: rename from %s failed: %s", path, of->tmp, strerror(errno));
    if (!ok || rc) unlink(of->tmp);
    else ft_fsync_parent(path);
    return rc;
}

static int put_line(FILE *f, const gen_opts *o, int64_t i, const batch_rec *x, const gen_result *r,
                    double seconds)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "index", (double)i);
    cJSON_AddStringToObject(j, "prompt", x->q.user);
    cJSON_AddStringToObject(j, "reply", r->text ? r->text : "");
    if (x->q.reference) cJSON_AddStringToObject(j, "reference", x->q.reference);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)r->n_prompt);
    cJSON_AddNumberToObject(j, "new_tokens", (double)r->n_out);
    cJSON_AddStringToObject(j, "stop", gen_stop_name(r));
    if (r->stop == GEN_STOP_STRING) cJSON_AddStringToObject(j, "stop_reason", x->stop[r->stop_str]);
    cJSON_AddNumberToObject(j, "seconds", seconds);
    if (x->sc.temperature > 0) gen_add_seed(j, x->sc.seed);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return ft_err(-ENOMEM, "out of memory");
    int bad = fputs(s, f) < 0 || fputc('\n', f) == EOF || fflush(f) != 0;
    free(s);
    return bad ? ft_err(-EIO, "%s: write failed: %s", o->out ? o->out : "stdout", strerror(errno)) : 0;
}

/* A sequence being generated in one of the env's slots (--prompts with --batch). */
typedef struct slot_run {
    int64_t rec;                /* the record, -1: the slot is free */
    const batch_rec *x;         /* its prompt and settings */
    gen_result r;
    ft_rng rng;                 /* the record's sampling state (seeded with x->sc.seed) */
    int32_t next;               /* the sampled token to feed, when pending */
    int pending;                /* 1: `next` needs a decode forward */
    double t0;
    ft_stop_text st;            /* the reply's text, with stop strings */
    ft_sample_seen *seen;       /* the slot's ids (env's seen[k]), with a repetition penalty */
} slot_run;

/* A finished record, held until the records before it are written: its reply decoded when it
 * finishes (r.text), as its tokens are in the slot's buffer, which the next record takes. */
typedef struct done_rec {
    int done;
    gen_result r;               /* r.out_ids NULL */
    double seconds;
} done_rec;

/* Records slot sr's finished reply in dn[sr->rec] (its text decoded now, or with stop strings
 * the text cut before the one that matched) and frees the slot. */
static int slot_finish(gen_env *e, slot_run *sr, done_rec *dn)
{
    const batch_rec *x = sr->x;
    int rc = x->n_stop ? ft_stop_text_flush(&sr->st, x->stop, x->n_stop) : 0;
    if (!rc && sr->st.hit >= 0) {
        sr->r.stop = GEN_STOP_STRING;
        sr->r.stop_str = sr->st.hit;
    }
    done_rec *d = &dn[sr->rec];
    d->r = sr->r;
    d->r.out_ids = NULL;
    d->r.text = NULL;
    d->seconds = gen_now_s() - sr->t0;
    d->done = 1;
    sr->rec = -1;
    if (!rc) rc = x->n_stop ? ft_stop_text_take(&sr->st, &d->r.text)
                            : ft_tok_decode(e->tok, sr->r.out_ids, sr->r.n_out, 1, &d->r.text);
    ft_stop_text_free(&sr->st);
    return rc;
}

/* Samples slot k's next token from logits (V) with its record's settings and draws, and
 * updates its reply: finished (a stop token, a stop string, or its max new tokens reached) or
 * pending with the token to feed. *fin = 1 when finished. */
static int slot_advance(gen_env *e, slot_run *sr, const float *logits, int *fin)
{
    const batch_rec *x = sr->x;
    int32_t t;
    *fin = 0;
    e->smp.cfg = x->sc; /* checked in slot_start; the sampler derives nothing from it */
    e->smp.rng = sr->rng;
    int rc = ft_sample_next_seen(&e->smp, logits, sr->seen, &t);
    sr->rng = e->smp.rng;
    if (rc) return rc;
    sr->pending = 0;
    if (gen_is_stop(e, t)) {
        sr->r.stop = GEN_STOP_TOKEN;
        *fin = 1;
        return 0;
    }
    ((int32_t *)sr->r.out_ids)[sr->r.n_out++] = t;
    if (sr->seen) ft_sample_seen_add(sr->seen, &t, 1);
    if (x->n_stop) FT_TRY(ft_stop_text_push(&sr->st, x->stop, x->n_stop, t));
    if (sr->st.hit >= 0 || sr->r.n_out >= x->max_new) *fin = 1;
    else sr->next = t, sr->pending = 1;
    return 0;
}

/* Starts record i in slot k: its prompt prefilled into the slot's cache, its first token
 * sampled. */
static int slot_start(gen_env *e, slot_run *sr, int64_t k, const batch_rec *x, int64_t i, int *fin)
{
    memset(&sr->r, 0, sizeof sr->r);
    FT_TRY(ft_sample_cfg_check(&x->sc));
    sr->rec = i;
    sr->x = x;
    sr->r.prompt_ids = x->ids;
    sr->r.n_prompt = x->n;
    sr->r.out_ids = e->out_ids + k * e->max_new;
    sr->t0 = gen_now_s();
    ft_rng_seed(&sr->rng, x->sc.seed); /* as ft_sampler_reseed */
    ft_stop_text_free(&sr->st);
    ft_stop_text_init(&sr->st, e->tok);
    sr->seen = e->seen && x->sc.repetition_penalty != 1 ? &e->seen[k] : NULL;
    if (sr->seen) {
        ft_sample_seen_clear(sr->seen);
        ft_sample_seen_add(sr->seen, x->ids, x->n); /* the prompt's ids are penalised too */
    }
    ft_gen_reset_slot(&e->g, k);
    /* RoPE as a cache sized for this prompt alone would have it (dynamic NTK scaling) */
    int rc = ft_gen_set_rope_len_slot(&e->g, k, x->n + x->max_new);
    float *lg = e->logits + k * e->m->cfg.vocab_size;
    for (int64_t j = 0; !rc && j < x->n; j += e->g.chunk_max) {
        int64_t c = x->n - j < e->g.chunk_max ? x->n - j : e->g.chunk_max;
        rc = ft_gen_forward_slot(&e->g, k, x->ids + j, c, lg, 1);
    }
    sr->r.prefill_s = gen_now_s() - sr->t0;
    return rc ? rc : slot_advance(e, sr, lg, fin);
}

/* Every record of --prompts, one JSON line each, in record order. Up to e.slots records are
 * generated together: each prompt is prefilled alone, then one forward per step decodes the
 * next token of every unfinished one (ft_gen_decode), so each layer's weights are read once
 * per step for all of them; a finished record's slot takes the next record. */
int gen_run_batch(const gen_opts *o)
{
    batch b = {0};
    out_file of = {0};
    gen_env e;
    memset(&e, 0, sizeof e);
    int tmpl = 0, rc = batch_read(&b, o);
    if (!rc) rc = out_open(&of, o->out);
    if (!rc) rc = gen_env_open(&e, o);
    gen_need nd = {0, 0, 0, 0};
    int64_t n_over = 0, over_len = 0, over_new = 0, n_sampled = 0;
    const int64_t maxpos = e.m ? e.m->cfg.max_position_embeddings : 0;
    for (int64_t i = 0; !rc && i < b.n; i++) {
        batch_rec *x = &b.r[i];
        rc = ft_gen_req_ids(e.tok, o->tmpl, &x->q, gen_flags(o), &x->ids, &x->n, &tmpl);
        if (!rc && x->n == 0) rc = ft_err(FT_E_INVALID, "the prompt encodes to no tokens");
        if (rc) {
            ft_err_prefix(rc, "%s", x->where);
            break;
        }
        /* the caches hold the longest prompt + reply; a slot's buffer the longest reply */
        if (x->n > nd.max_prompt) nd.max_prompt = x->n;
        if (x->n + x->max_new > nd.ctx) nd.ctx = x->n + x->max_new;
        if (x->max_new > nd.max_new) nd.max_new = x->max_new;
        nd.seen |= x->sc.repetition_penalty != 1;
        n_sampled += x->sc.temperature > 0 && !(x->q.params.set & FT_GEN_SET_SEED);
        if (maxpos > 0 && x->n + x->max_new > maxpos) {
            if (!n_over++ || x->n + x->max_new > over_len + over_new) {
                over_len = x->n;
                over_new = x->max_new;
            }
        }
    }
    if (!rc && n_over) {
        char what[96];
        snprintf(what, sizeof what, "%lld of %lld records, the longest with ", (long long)n_over,
                 (long long)b.n);
        gen_warn_context(&e, over_len, over_new, what);
    }
    /* the seed the records' own derive from (unless they set theirs) */
    if (!rc && n_sampled) fprintf(stderr, "ftune: seed %lld\n", (long long)o->seed);
    if (!rc) gen_warn_no_think(o, e.tok, tmpl);
    if (!rc) rc = gen_env_plan(&e, o, &nd, tmpl, o->batch < b.n ? o->batch : b.n);
    if (!rc)
        fprintf(stderr, "ftune: %lld prompts from %s (template %s, %lld at a time, KV cache of %lld "
                "tokens each)\n", (long long)b.n, o->prompts, o->raw ? "raw" : ft_chat_template_name(tmpl),
                (long long)e.slots, (long long)e.g.ctx_max);
    const int64_t V = e.m ? e.m->cfg.vocab_size : 0;
    slot_run *sl = calloc((size_t)(e.slots > 0 ? e.slots : 1), sizeof *sl);
    done_rec *dn = calloc((size_t)(b.n > 0 ? b.n : 1), sizeof *dn);
    int64_t *act = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *act);
    int32_t *tok = malloc((size_t)(e.slots > 0 ? e.slots : 1) * sizeof *tok);
    if (!rc && (!sl || !dn || !act || !tok)) rc = ft_err(-ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < e.slots; k++) sl[k].rec = -1;
    int64_t next = 0, emitted = 0, total_new = 0, steps = 0;
    double t_all = gen_now_s();
    while (!rc && emitted < b.n) {
        /* free slots take the next records; a record may finish at its first token */
        for (int64_t k = 0; !rc && k < e.slots; k++) {
            while (!rc && sl[k].rec < 0 && next < b.n) {
                int fin = 0;
                rc = slot_start(&e, &sl[k], k, &b.r[next], next, &fin);
                if (!rc && fin) rc = slot_finish(&e, &sl[k], dn);
                if (rc) ft_err_prefix(rc, "%s", b.r[next].where);
                next++;
            }
        }
        /* one decode step of every pending sequence */
        int64_t n = 0;
        for (int64_t k = 0; !rc && k < e.slots; k++)
            if (sl[k].rec >= 0 && sl[k].pending) {
                act[n] = k;
                tok[n++] = sl[k].next;
            }
        if (!rc && n) {
            double t0 = gen_now_s();
            rc = ft_gen_decode(&e.g, act, tok, n, e.logits);
            double dt = gen_now_s() - t0;
            steps++;
            if (rc && n == 1) ft_err_prefix(rc, "%s", b.r[sl[act[0]].rec].where);
            else if (rc) ft_err_prefix(rc, "decoding %lld prompts together", (long long)n);
            for (int64_t i = 0; !rc && i < n; i++) {
                slot_run *sr = &sl[act[i]];
                const int64_t rec = sr->rec;
                int fin = 0;
                sr->r.n_decode++;
                sr->r.decode_s += dt;
                rc = slot_advance(&e, sr, e.logits + i * V, &fin);
                if (!rc && fin) rc = slot_finish(&e, sr, dn);
                if (rc) ft_err_prefix(rc, "%s", b.r[rec].where);
            }
        }
        /* the finished records, in order */
        while (!rc && emitted < b.n && dn[emitted].done) {
            done_rec *d = &dn[emitted];
            batch_rec *x = &b.r[emitted];
            rc = put_line(of.f ? of.f : stdout, o, emitted, x, &d->r, d->seconds);
            if (rc) {
                ft_err_prefix(rc, "%s", x->where);
            } else {
                total_new += d->r.n_out;
                fprintf(stderr, "ftune: [%lld/%lld] %lld prompt + %lld new tokens in %.3f s; stop: %s\n",
                        (long long)(emitted + 1), (long long)b.n, (long long)d->r.n_prompt,
                        (long long)d->r.n_out, d->seconds, gen_stop_said(&d->r));
            }
            free(d->r.text);
            d->r.text = NULL;
            emitted++;
        }
        if (!rc && !n && emitted < b.n && next >= b.n) /* cannot happen: every record finishes */
            rc = ft_err(FT_E_INVALID, "generate: %lld records left unfinished", (long long)(b.n - emitted));
    }
    if (!rc) {
        double t = gen_now_s() - t_all;
        fprintf(stderr, "ftune: %lld prompts, %lld new tokens in %.3f s (%.2f tok/s; %lld decode "
                "steps)%s%s\n", (long long)b.n, (long long)total_new, t, t > 0 ? total_new / t : 0.0,
                (long long)steps, o->out ? "; wrote " : "", o->out ? o->out : "");
    }
    for (int64_t k = 0; sl && k < e.slots; k++) ft_stop_text_free(&sl[k].st); /* a run that fails */
    free(sl);
    for (int64_t i = emitted; dn && i < b.n; i++) free(dn[i].r.text); /* held when a run fails */
    free(dn);
    free(act);
    free(tok);
    int rc2 = out_close(&of, o->out, !rc);
    if (!rc) rc = rc2;
    gen_env_close(&e);
    batch_free(&b);
    return rc;
}
