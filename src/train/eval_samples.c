/* eval_samples.c - sample replies during training (see eval_samples.h). */
#include "src/train/eval_samples.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/data/records.h"
#include "src/template/chat.h"

/* Adds the stop ids of resolved template tmpl (its end-of-turn word, the EOS ids) to es->stop,
 * as `ftune generate` chooses them (src/infer/gen_env.c ft_gen_env_plan). */
static void add_stops(ft_eval_samples *es, const ft_model_config *mc, const ft_tokenizer *tok,
                      int tmpl)
{
    const char *eot = ft_chat_end_of_turn(tmpl);
    char jeot[64];
    if (tmpl == FT_CHAT_JINJA) { /* what the model's template writes after a reply */
        ft_chat_ctx ctx = {ft_tok_bos_str(tok), ft_tok_eos_str(tok), ft_tok_chat_template(tok)};
        jeot[0] = 0;
        eot = ft_chat_jinja_end_of_turn(&ctx, jeot, sizeof jeot) == 0 && jeot[0] ? jeot : NULL;
    }
    int32_t ids[FT_EVAL_SAMPLES_MAX_STOP];
    int n = ft_sample_stop_ids(mc, tok, eot, ids, FT_EVAL_SAMPLES_MAX_STOP);
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < es->n_stop; j++) seen |= es->stop[j] == ids[i];
        if (!seen && es->n_stop < FT_EVAL_SAMPLES_MAX_STOP) es->stop[es->n_stop++] = ids[i];
    }
}

/* Record rec (at `where`) as prompt i: its text and token ids. */
static int add_prompt(ft_eval_samples *es, const cJSON *rec, const char *where, int tmpl,
                      const ft_session *s)
{
    ft_gen_req q;
    int rc = ft_gen_req_parse(&q, rec, NULL, 0);
    if (rc) return ft_err_prefix(rc, "%s", where);
    const int64_t i = es->n;
    int used = 0;
    rc = ft_gen_req_ids(s->tok, tmpl, &q, 0, &es->ids[i], &es->n_ids[i], &used);
    if (rc) ft_err_prefix(rc, "%s", where);
    else if (es->n_ids[i] < 1) rc = ft_err(FT_E_INVALID, "%s: the prompt encodes to no tokens", where);
    if (!rc && !(es->prompt[i] = strdup(q.user ? q.user : ""))) rc = ft_err(-ENOMEM, "out of memory");
    ft_gen_req_free(&q);
    if (rc) {
        free(es->ids[i]);
        es->ids[i] = NULL;
        return rc;
    }
    es->n++;
    if (es->n_ids[i] > es->max_prompt) es->max_prompt = es->n_ids[i];
    add_stops(es, &s->model->cfg, s->tok, used);
    return 0;
}

/* Every record of the file into es (at most FT_EVAL_SAMPLES_MAX). */
static int read_prompts(ft_eval_samples *es, int tmpl, const ft_session *s)
{
    ft_records rs;
    ft_record rec;
    char where[4300];
    int rc = ft_records_open(&rs, es->path), k = 0;
    if (rc) return ft_err_prefix(rc, "--eval-prompts");
    while (!rc && (k = ft_records_next(&rs, &rec)) == 1) {
        ft_records_where(&rs, rec.loc, where, sizeof where);
        if (!rec.json) rc = ft_err(FT_E_INVALID, "%s: %s", where, rec.err);
        else if (es->n == FT_EVAL_SAMPLES_MAX)
            rc = ft_err(FT_E_INVALID, "%s: more than %d prompts (--eval-prompts takes a few dozen: each is answered at every evaluation)",
                        where, FT_EVAL_SAMPLES_MAX);
        else rc = add_prompt(es, rec.json, where, tmpl, s);
    }
    if (!rc && k < 0) rc = k;
    if (!rc && es->n == 0)
        rc = ft_err(FT_E_INVALID, "%s: no prompts (--eval-prompts: JSONL or a JSON array of prompts)", es->path);
    ft_records_close(&rs);
    return rc;
}

int ft_eval_samples_load(ft_eval_samples *es, const char *file, ft_session *s,
                         const ft_lora *lora, int tmpl, int64_t max_new)
{
    memset(es, 0, sizeof *es);
    es->fd = -1;
    if (!file) return 0;
    if (max_new < 1 || max_new > FT_GEN_MAX_NEW_TOKENS)
        return ft_err(FT_E_INVALID, "--eval-max-new-tokens must be an integer 1..%d", FT_GEN_MAX_NEW_TOKENS);
    if (!s->tok) return ft_err(FT_E_INVALID, "--eval-prompts: the session has no tokenizer");
    es->on = 1;
    es->tok = s->tok;
    es->max_new = max_new;
    es->path = strdup(file);
    es->prompt = calloc(FT_EVAL_SAMPLES_MAX, sizeof *es->prompt);
    es->ids = calloc(FT_EVAL_SAMPLES_MAX, sizeof *es->ids);
    es->n_ids = calloc(FT_EVAL_SAMPLES_MAX, sizeof *es->n_ids);
    if (!es->path || !es->prompt || !es->ids || !es->n_ids) return ft_err(-ENOMEM, "out of memory");
    FT_TRY(read_prompts(es, tmpl, s));
    if (s->be && !s->be->ops->host_memory) /* the KV cache and buffers, allocated after placing */
        s->gpu_reserve += (int64_t)ft_gen_source_bytes(s->model, lora, es->max_prompt + max_new,
                                                       es->max_prompt < FT_GEN_CHUNK_DEFAULT ? es->max_prompt : FT_GEN_CHUNK_DEFAULT,
                                                       1, 1);
    return 0;
}

/* Groups lines[0..n) (parsed objects) by step into text events of tb. */
static int tb_replay(ft_tfevents *tb, cJSON *const *lines, int64_t n);

/* The kept lines of a resumed run's samples.jsonl, rewritten; replayed into tb. */
static int resume_file(ft_eval_samples *es, int64_t step, int keep_at_step, ft_tfevents *tb)
{
    char *txt = NULL;
    size_t len = 0;
    int rc = ft_read_file(es->out_path, &txt, &len);
    if (rc == -ENOENT) return 0;
    FT_TRY(rc);
    char *keep = malloc(len + 1);
    cJSON **objs = NULL;
    int64_t n_obj = 0, cap = 0;
    size_t kn = 0;
    if (!keep) rc = ft_err(-ENOMEM, "out of memory");
    for (size_t off = 0; !rc && off < len;) {
        char *nl = memchr(txt + off, '\n', len - off);
        if (!nl) break; /* a torn last line */
        size_t ll = (size_t)(nl - (txt + off)) + 1;
        cJSON *o = cJSON_ParseWithLength(txt + off, ll - 1);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
        double sv = cJSON_IsNumber(st) ? st->valuedouble : -1;
        if (cJSON_IsObject(o) && sv >= 0 && (sv < (double)step || (keep_at_step && sv == (double)step))) {
            memcpy(keep + kn, txt + off, ll);
            kn += ll;
            if (n_obj == cap) {
                cap = cap ? 2 * cap : 64;
                cJSON **p = realloc(objs, (size_t)cap * sizeof *p);
                if (!p) rc = ft_err(-ENOMEM, "out of memory");
                else objs = p;
            }
            if (!rc) objs[n_obj++] = o, o = NULL;
        }
        cJSON_Delete(o);
        off += ll;
    }
    if (!rc) rc = ft_write_file_atomic(es->out_path, keep, kn);
    if (!rc && tb) rc = tb_replay(tb, objs, n_obj);
    for (int64_t i = 0; i < n_obj; i++) cJSON_Delete(objs[i]);
    free(objs);
    free(keep);
    free(txt);
    return rc;
}

int ft_eval_samples_open(ft_eval_samples *es, const char *out_dir, int resume, int64_t step,
                         int keep_at_step, int has_eval, ft_tfevents *tb)
{
    if (!es->on) return 0;
    if (!has_eval)
        return ft_err(FT_E_INVALID, "--eval-prompts %s: the replies are made at each evaluation, and this run has none (no held-out examples: --eval-fraction 0 without --eval-data)",
                      es->path);
    FT_TRY(ft_path_join(es->out_path, sizeof es->out_path, out_dir, FT_EVAL_SAMPLES_FILE));
    if (resume) FT_TRY(resume_file(es, step, keep_at_step, tb));
    es->fd = open(es->out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (resume ? 0 : O_TRUNC), 0644);
    if (es->fd < 0) return ft_err(-errno, "%s: cannot open: %s", es->out_path, strerror(errno));
    return 0;
}

/* The generation state at the first evaluation: the weights where the session placed them. */
static int make_gen(ft_eval_samples *es, ft_session *s, const ft_lora *lora)
{
    const ft_model *m = s->model;
    const int64_t ctx = es->max_prompt + es->max_new, V = m->cfg.vocab_size;
    const int64_t chunk = es->max_prompt < FT_GEN_CHUNK_DEFAULT ? es->max_prompt : FT_GEN_CHUNK_DEFAULT;
    if (!s->pack && s->be->ops->host_memory && m->embed && m->layers) {
        FT_TRY(ft_gen_init_seqs(&es->g, s->be, m, lora, NULL, ctx, chunk, 1, 1));
    } else {
        FT_TRY(ft_exec_gen_source(s->ex, &es->src));
        FT_TRY(ft_gen_init_seqs(&es->g, s->be, m, lora, &es->src, ctx, chunk, 1, 1));
    }
    es->g_ok = 1;
    const ft_sample_cfg sc = {0, 0, 1, 0, 1, 0}; /* greedy */
    FT_TRY(ft_sampler_init(&es->smp, &sc, V));
    es->logits = malloc((size_t)V * sizeof *es->logits);
    es->out = malloc((size_t)es->max_new * sizeof *es->out);
    if (!es->logits || !es->out) return ft_err(-ENOMEM, "out of memory");
    return 0;
}

static int is_stop(const ft_eval_samples *es, int32_t t)
{
    for (int i = 0; i < es->n_stop; i++)
        if (es->stop[i] == t) return 1;
    return 0;
}

/* The greedy reply to prompt i into *text (malloc'ed), as `ftune generate` decodes one prompt
 * (src/infer/gen_env.c ft_gen_reply): the prompt prefilled in chunks, then a token at a time until
 * a stop token (not part of the reply) or max_new tokens. */
static int reply(ft_eval_samples *es, int64_t i, char **text)
{
    const int32_t *ids = es->ids[i];
    const int64_t n = es->n_ids[i], chunk = es->g.chunk_max;
    int64_t n_out = 0;
    ft_gen_reset_seq(&es->g, 0);
    int rc = ft_gen_set_rope_len(&es->g, n + es->max_new);
    for (int64_t p = 0; !rc && p < n; p += chunk)
        rc = ft_gen_forward(&es->g, ids + p, n - p < chunk ? n - p : chunk, es->logits, 1);
    while (!rc && n_out < es->max_new) {
        int32_t t;
        if ((rc = ft_sample_next(&es->smp, es->logits, &t)) || is_stop(es, t)) break;
        es->out[n_out++] = t;
        if (n_out < es->max_new) rc = ft_gen_forward(&es->g, &t, 1, es->logits, 1);
    }
    ft_gen_reset_seq(&es->g, 0);
    if (rc) return rc;
    return ft_tok_decode(es->tok, es->out, n_out, 1, text);
}

/* Writes all of buf (n bytes) to fd in one write(2) where it can, retried on a short one (an
 * O_APPEND descriptor: nothing buffered in the process). */
static int write_all(int fd, const char *path, const char *buf, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = write(fd, buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ft_err(k < 0 ? -errno : -EIO, "%s: write failed: %s", path,
                          strerror(k < 0 ? errno : EIO));
        done += (size_t)k;
    }
    return 0;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int tb_replay(ft_tfevents *tb, cJSON *const *lines, int64_t n)
{
    const char **cells = malloc((size_t)(2 * (n ? n : 1)) * sizeof *cells);
    if (!cells) return ft_err(-ENOMEM, "out of memory");
    int rc = 0;
    for (int64_t a = 0, b; !rc && a < n; a = b) {
        const double step = cJSON_GetObjectItemCaseSensitive(lines[a], "step")->valuedouble;
        for (b = a; b < n && cJSON_GetObjectItemCaseSensitive(lines[b], "step")->valuedouble == step; b++) {
            const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lines[b], "prompt"));
            const char *r = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(lines[b], "reply"));
            cells[2 * (b - a)] = p ? p : "";
            cells[2 * (b - a) + 1] = r ? r : "";
        }
        rc = ft_tfevents_text(tb, (int64_t)step, wall_now(), FT_EVAL_SAMPLES_TAG, cells, b - a, 2);
    }
    free(cells);
    return rc;
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ft_eval_samples_run(ft_eval_samples *es, ft_session *s, const ft_lora *lora, int64_t step,
                        ft_tfevents *tb, double *seconds)
{
    if (seconds) *seconds = 0;
    if (!es->on) return 0;
    const double t0 = mono_now();
    if (!es->g_ok) FT_TRY(make_gen(es, s, lora));
    char **replies = calloc((size_t)es->n, sizeof *replies);
    if (!replies) return ft_err(-ENOMEM, "out of memory");
    int rc = 0;
    for (int64_t i = 0; !rc && i < es->n; i++) rc = reply(es, i, &replies[i]);
    if (seconds) *seconds = mono_now() - t0;
    char *buf = NULL;
    size_t len = 0;
    FILE *mf = rc ? NULL : open_memstream(&buf, &len);
    if (!rc && !mf) rc = ft_err(-ENOMEM, "out of memory");
    for (int64_t i = 0; !rc && i < es->n; i++) {
        cJSON *o = cJSON_CreateObject();
        char *line = NULL;
        if (o && cJSON_AddNumberToObject(o, "step", (double)step) &&
            cJSON_AddStringToObject(o, "prompt", es->prompt[i]) &&
            cJSON_AddStringToObject(o, "reply", replies[i]))
            line = cJSON_PrintUnformatted(o);
        if (line) fprintf(mf, "%s\n", line);
        else rc = ft_err(-ENOMEM, "out of memory");
        free(line);
        cJSON_Delete(o);
    }
    if (mf && fclose(mf) && !rc) rc = ft_err(-ENOMEM, "out of memory");
    if (!rc) rc = write_all(es->fd, es->out_path, buf, len);
    if (!rc && tb) {
        const char **cells = malloc((size_t)(2 * es->n) * sizeof *cells);
        if (!cells) rc = ft_err(-ENOMEM, "out of memory");
        for (int64_t i = 0; cells && i < es->n; i++) {
            cells[2 * i] = es->prompt[i];
            cells[2 * i + 1] = replies[i];
        }
        if (!rc) rc = ft_tfevents_text(tb, step, wall_now(), FT_EVAL_SAMPLES_TAG, cells, es->n, 2);
        free(cells);
    }
    free(buf);
    for (int64_t i = 0; i < es->n; i++) free(replies[i]);
    free(replies);
    return rc;
}

void ft_eval_samples_free(ft_eval_samples *es)
{
    if (!es) return;
    if (es->on && es->fd >= 0) close(es->fd);
    if (es->g_ok) ft_gen_free(&es->g);
    ft_sampler_free(&es->smp);
    for (int64_t i = 0; es->prompt && i < FT_EVAL_SAMPLES_MAX; i++) {
        free(es->prompt[i]);
        free(es->ids ? es->ids[i] : NULL);
    }
    free(es->prompt);
    free(es->ids);
    free(es->n_ids);
    free(es->logits);
    free(es->out);
    free(es->path);
    memset(es, 0, sizeof *es);
    es->fd = -1;
}
