/* gen_batch.c - the batch scheduler of a prompts file (gen_env.h ft_gen_batch): up to n_seqs
 * replies decoded together, each in its own KV cache row; the prompts that start together
 * prefilled in one forward; the replies handed back in item order. */
#include "src/infer/gen_env.h"

#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/rng.h"

/* A reply being generated in one of the env's sequences. */
typedef struct seq_run {
    int64_t item;               /* -1: the sequence is free */
    const ft_gen_item *x;
    ft_gen_result r;
    ft_rng rng;                 /* its sampling state */
    int32_t next;               /* the sampled token to feed, when pending */
    int pending;                /* 1: `next` needs a decode forward */
    double t0;
    ft_stop_text st;            /* the reply's text, with stop strings */
    ft_sample_seen *seen;       /* the env's seen[k], with a repetition penalty */
} seq_run;

/* A finished reply, held until the items before it are handed back. */
typedef struct done_rec {
    int done;
    ft_gen_result r;            /* r.text malloc'ed; r.out_ids NULL */
    double seconds;
} done_rec;

/* Records sequence sr's finished reply in dn[its item] (its text decoded now, or with stop
 * strings cut before the one that matched) and frees the sequence. */
static int seq_finish(ft_gen_env *e, seq_run *sr, done_rec *dn)
{
    const ft_gen_reply_cfg *c = &sr->x->c;
    int rc = c->n_stop ? ft_stop_text_flush(&sr->st, c->stop, c->n_stop) : 0;
    if (!rc && sr->st.hit >= 0) {
        sr->r.stop = FT_GEN_STOP_STRING;
        sr->r.stop_str = sr->st.hit;
    }
    done_rec *d = &dn[sr->item];
    d->r = sr->r;
    d->r.out_ids = NULL;
    d->r.text = NULL;
    d->seconds = ft_gen_now_s() - sr->t0;
    d->done = 1;
    sr->item = -1;
    if (!rc) rc = c->n_stop ? ft_stop_text_take(&sr->st, &d->r.text)
                            : ft_tok_decode(e->tok, sr->r.out_ids, sr->r.n_out, 1, &d->r.text);
    ft_stop_text_free(&sr->st);
    return rc;
}

/* Samples sequence sr's next token from logits (V) with its item's settings and draws, and
 * updates its reply: finished (a stop token, a stop string, its max new tokens) or pending
 * with the token to feed. A stop token (the env's, or one of the item's stop ids) is no part
 * of the reply's ids or text (as vLLM's). *fin = 1 when finished. */
static int seq_advance(ft_gen_env *e, seq_run *sr, const float *logits, int *fin)
{
    const ft_gen_reply_cfg *c = &sr->x->c;
    int32_t t;
    *fin = 0;
    e->smp.cfg = c->sc; /* checked in seq_begin; the sampler derives nothing from it */
    e->smp.rng = sr->rng;
    int rc = ft_sample_next_seen(&e->smp, logits, sr->seen, &t);
    sr->rng = e->smp.rng;
    if (rc) return rc;
    sr->pending = 0;
    if (ft_gen_id_listed(e->eos, e->n_eos, t) || ft_gen_id_listed(c->stop_ids, c->n_stop_ids, t)) {
        sr->r.stop = FT_GEN_STOP_TOKEN;
        sr->r.stop_tok = t;
        *fin = 1;
        return 0;
    }
    ((int32_t *)sr->r.out_ids)[sr->r.n_out++] = t;
    if (sr->seen) ft_sample_seen_add(sr->seen, &t, 1);
    if (c->n_stop) FT_TRY(ft_stop_text_push(&sr->st, c->stop, c->n_stop, t));
    if (sr->st.hit >= 0 || sr->r.n_out >= c->max_new) *fin = 1;
    else sr->next = t, sr->pending = 1;
    return 0;
}

/* Sets sequence k up for item i (its draws, stop text, penalty), its cache emptied and its
 * RoPE table that of a cache sized for this prompt alone (dynamic NTK scaling). */
static int seq_begin(ft_gen_env *e, seq_run *sr, int64_t k, const ft_gen_item *x, int64_t i)
{
    memset(&sr->r, 0, sizeof sr->r);
    FT_TRY(ft_sample_cfg_check(&x->c.sc));
    sr->item = i;
    sr->x = x;
    sr->r.prompt_ids = x->ids;
    sr->r.n_prompt = x->n;
    sr->r.out_ids = e->out_ids + k * e->max_new;
    sr->r.stop_tok = -1;
    sr->t0 = ft_gen_now_s();
    ft_rng_seed(&sr->rng, x->c.sc.seed); /* as ft_sampler_reseed */
    ft_stop_text_free(&sr->st);
    ft_stop_text_init(&sr->st, e->tok);
    sr->seen = e->seen && x->c.sc.repetition_penalty != 1 ? &e->seen[k] : NULL;
    if (sr->seen) {
        ft_sample_seen_clear(sr->seen);
        ft_sample_seen_add(sr->seen, x->ids, x->n); /* the prompt's ids are penalised too */
    }
    ft_gen_reset_seq(&e->g, k);
    return ft_gen_set_rope_len_seq(&e->g, k, x->n + x->c.max_new);
}

/* The scheduler's buffers. */
typedef struct sched {
    seq_run *sl;                /* (n_seqs) */
    done_rec *dn;               /* (items) */
    int64_t *act, *seqs, *lens; /* (n_seqs) */
    int32_t *tok;               /* (n_seqs) */
    int32_t *ids;               /* (chunk_max) a group's prompts, concatenated */
    int each;
    ft_gen_batch_stats *st;
} sched;

/* Prefills sequence k's prompt alone, in chunks of the forward's tokens; e->logits' first row
 * then holds the last prompt row's logits. */
static int prefill_alone(ft_gen_env *e, const seq_run *sr, int64_t k, ft_gen_batch_stats *st)
{
    const int64_t cmax = e->g.chunk_max;
    int rc = 0;
    for (int64_t i = 0; !rc && i < sr->x->n; i += cmax) {
        int64_t c = sr->x->n - i < cmax ? sr->x->n - i : cmax;
        rc = ft_gen_forward_seq(&e->g, k, sr->x->ids + i, c, e->logits, 1);
        st->forwards++;
    }
    return rc;
}

/* Prefills the prompts of the n sequences ks[] (begun by seq_begin) and samples each one's
 * first token; a reply that finishes there frees its sequence. The prompts that fit together
 * within the chunk share one forward (ft_gen_prefill); a longer one is prefilled alone. */
static int seqs_prefill(ft_gen_env *e, sched *s, const int64_t *ks, int64_t n)
{
    const int64_t V = e->m->cfg.vocab_size, cmax = e->g.chunk_max;
    const int64_t rmax = s->each ? 1 : e->g.logit_rows_max;
    seq_run *sl = s->sl;
    for (int64_t j = 0; j < n;) {
        int64_t j2 = j, tot = 0;
        if (sl[ks[j]].x->n > cmax) {
            j2 = j + 1;
        } else {
            while (j2 < n && j2 - j < rmax && sl[ks[j2]].x->n <= cmax - tot) {
                const ft_gen_item *x = sl[ks[j2]].x;
                memcpy(s->ids + tot, x->ids, (size_t)x->n * sizeof(int32_t));
                s->seqs[j2 - j] = ks[j2];
                s->lens[j2 - j] = x->n;
                tot += x->n;
                j2++;
            }
        }
        const double t0 = ft_gen_now_s();
        int rc;
        if (tot) {
            rc = ft_gen_prefill(&e->g, j2 - j, s->seqs, s->ids, s->lens, e->logits);
            s->st->forwards++;
            if (j2 - j > 1) s->st->batched += j2 - j;
        } else {
            rc = prefill_alone(e, &sl[ks[j]], ks[j], s->st);
        }
        const double dt = ft_gen_now_s() - t0;
        if (rc)
            return ft_err_prefix(rc, "%s%s", sl[ks[j]].x->where,
                                 j2 - j > 1 ? " (and the prompts prefilled with it)" : "");
        for (int64_t i = j; i < j2; i++) {
            seq_run *sr = &sl[ks[i]];
            const char *where = sr->x->where;
            int fin = 0;
            sr->r.prefill_s = dt;
            rc = seq_advance(e, sr, e->logits + (i - j) * V, &fin);
            if (!rc && fin) rc = seq_finish(e, sr, s->dn);
            if (rc) return ft_err_prefix(rc, "%s", where);
        }
        j = j2;
    }
    return 0;
}

/* One decode step of every pending sequence; *n: how many there were. */
static int decode_step(ft_gen_env *e, sched *s, int64_t *n)
{
    const int64_t V = e->m->cfg.vocab_size;
    *n = 0;
    for (int64_t k = 0; k < e->n_seqs; k++)
        if (s->sl[k].item >= 0 && s->sl[k].pending) {
            s->act[*n] = k;
            s->tok[(*n)++] = s->sl[k].next;
        }
    if (!*n) return 0;
    const double t0 = ft_gen_now_s();
    int rc = ft_gen_decode(&e->g, s->act, s->tok, *n, e->logits);
    const double dt = ft_gen_now_s() - t0;
    s->st->steps++;
    if (rc && *n == 1) return ft_err_prefix(rc, "%s", s->sl[s->act[0]].x->where);
    if (rc) return ft_err_prefix(rc, "decoding %lld prompts together", (long long)*n);
    for (int64_t i = 0; i < *n; i++) {
        seq_run *sr = &s->sl[s->act[i]];
        const char *where = sr->x->where;
        int fin = 0;
        sr->r.n_decode++;
        sr->r.decode_s += dt;
        rc = seq_advance(e, sr, e->logits + i * V, &fin);
        if (!rc && fin) rc = seq_finish(e, sr, s->dn);
        if (rc) return ft_err_prefix(rc, "%s", where);
    }
    return 0;
}

static int sched_run(ft_gen_env *e, sched *s, const ft_gen_item *items, int64_t n_items,
                     ft_gen_done_fn done, void *user)
{
    int64_t next = 0, emitted = 0;
    int rc = 0;
    while (!rc && emitted < n_items) {
        /* free sequences take the next prompts, prefilled together; a reply may finish at its
         * first token, and its sequence then takes another */
        while (!rc && next < n_items) {
            int64_t m = 0;
            for (int64_t k = 0; !rc && k < e->n_seqs && next < n_items; k++) {
                if (s->sl[k].item >= 0) continue;
                rc = seq_begin(e, &s->sl[k], k, &items[next], next);
                if (rc) ft_err_prefix(rc, "%s", items[next].where);
                next++;
                s->act[m++] = k;
            }
            if (!rc && !m) break;
            if (!rc) rc = seqs_prefill(e, s, s->act, m);
        }
        int64_t n = 0;
        if (!rc) rc = decode_step(e, s, &n);
        while (!rc && emitted < n_items && s->dn[emitted].done) {
            done_rec *d = &s->dn[emitted];
            rc = done(user, emitted, &d->r, d->seconds);
            if (rc) ft_err_prefix(rc, "%s", items[emitted].where);
            s->st->new_tokens += d->r.n_out;
            free(d->r.text);
            d->r.text = NULL;
            emitted++;
        }
        if (!rc && !n && emitted < n_items && next >= n_items) /* every reply finishes */
            rc = ft_err(FT_E_INVALID, "generate: %lld prompts left unfinished",
                        (long long)(n_items - emitted));
    }
    return rc;
}

int ft_gen_batch(ft_gen_env *e, const ft_gen_item *items, int64_t n, int prefill_each,
                 ft_gen_done_fn done, void *user, ft_gen_batch_stats *st)
{
    memset(st, 0, sizeof *st);
    const size_t ns = (size_t)(e->n_seqs > 0 ? e->n_seqs : 1);
    sched s = {calloc(ns, sizeof(seq_run)), calloc((size_t)(n > 0 ? n : 1), sizeof(done_rec)),
               malloc(ns * sizeof(int64_t)), malloc(ns * sizeof(int64_t)),
               malloc(ns * sizeof(int64_t)), malloc(ns * sizeof(int32_t)),
               malloc((size_t)(e->g.chunk_max > 0 ? e->g.chunk_max : 1) * sizeof(int32_t)),
               prefill_each, st};
    int rc = 0;
    if (!s.sl || !s.dn || !s.act || !s.seqs || !s.lens || !s.tok || !s.ids)
        rc = ft_err(-ENOMEM, "out of memory");
    for (int64_t k = 0; !rc && k < e->n_seqs; k++) s.sl[k].item = -1;
    if (!rc) rc = sched_run(e, &s, items, n, done, user);
    for (int64_t k = 0; s.sl && k < e->n_seqs; k++) ft_stop_text_free(&s.sl[k].st);
    for (int64_t i = 0; s.dn && i < n; i++) free(s.dn[i].r.text); /* held when a run fails */
    free(s.sl);
    free(s.dn);
    free(s.act);
    free(s.seqs);
    free(s.lens);
    free(s.tok);
    free(s.ids);
    return rc;
}
