/* sweep_state.c - sweep.json, written and read back (sweep_state.h). */
#include "src/train/sweep_state.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"

#define EXACT_INT 9007199254740992.0 /* 2^53 */

void ft_sweep_results_init(ft_sweep_result *r, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].best_eval_loss = NAN;
    }
}

int64_t ft_sweep_best(const ft_sweep_sched *s, const ft_sweep_result *r)
{
    int64_t best = -1;
    for (int64_t i = 0; i < s->n_trials; i++)
        if (s->status[i] == FT_TRIAL_COMPLETED && isfinite(r[i].best_eval_loss) &&
            (best < 0 || r[i].best_eval_loss < r[best].best_eval_loss))
            best = i;
    return best;
}

/* --- writing ----------------------------------------------------------------------------- */

/* numbers as raw text that reads back to the same double (cJSON keeps 15 digits) */
static cJSON *raw_num(double x)
{
    char buf[64];
    ft_sweep_num_text(x, buf, sizeof buf);
    return cJSON_CreateRaw(buf);
}

static cJSON *raw_int(int64_t x)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)x);
    return cJSON_CreateRaw(buf);
}

/* Adds item to o under key; 0, or -1 when item is NULL (out of memory). */
static int add(cJSON *o, const char *key, cJSON *item)
{
    if (!item) return -1;
    if (key) return cJSON_AddItemToObject(o, key, item) ? 0 : (cJSON_Delete(item), -1);
    return cJSON_AddItemToArray(o, item) ? 0 : (cJSON_Delete(item), -1);
}

static cJSON *trial_json(const ft_sweep_trials *t, const ft_sweep_sched *s, const ft_sweep_result *r, int64_t i)
{
    cJSON *o = cJSON_CreateObject(), *params = cJSON_CreateObject(), *rungs = cJSON_CreateArray();
    int bad = !o || !params || !rungs;
    if (bad) {
        cJSON_Delete(params);
        cJSON_Delete(rungs);
        cJSON_Delete(o);
        return NULL;
    }
    for (int k = 0; k < t->n_keys && !bad; k++)
        bad |= add(params, t->keys[k]->name, ft_sweep_key_to_json(t->keys[k], t->t[i].vals[k]));
    for (int64_t k = 0; k < s->n_reported[i] && !bad; k++) bad |= add(rungs, NULL, raw_num(s->loss[i * s->n_rungs + k]));
    bad |= add(o, "name", cJSON_CreateString(t->t[i].name));
    bad |= add(o, "params", params);
    bad |= add(o, "status", cJSON_CreateString(ft_trial_status_name(s->status[i])));
    bad |= add(o, "best_eval_loss", raw_num(r[i].best_eval_loss));
    bad |= add(o, "best_eval_step", raw_int(r[i].best_eval_step));
    bad |= add(o, "steps", raw_int(r[i].steps));
    bad |= add(o, "tokens", raw_int(r[i].tokens));
    bad |= add(o, "rung_losses", rungs);
    if (s->status[i] == FT_TRIAL_FAILED) bad |= add(o, "error", cJSON_CreateString(r[i].error));
    if (bad) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int ft_sweep_json_format(const ft_sweep_trials *t, const ft_sweep_sched *s, const ft_sweep_result *r, char **text)
{
    *text = NULL;
    if (t->n != s->n_trials)
        return ft_err(FT_E_INVALID, "sweep.json: %lld trials, and the scheduler has %lld", (long long)t->n,
                      (long long)s->n_trials);
    cJSON *o = cJSON_CreateObject(), *prune = cJSON_CreateObject(), *steps = cJSON_CreateArray(),
          *trials = cJSON_CreateArray();
    int bad = !o || !prune || !steps || !trials;
    for (int64_t k = 0; k < s->n_rungs && !bad; k++) bad |= add(steps, NULL, raw_int(s->rung_step[k]));
    if (!bad) {
        bad |= add(prune, "method", cJSON_CreateString(ft_prune_mode_name(s->mode)));
        bad |= add(prune, "eta", raw_int(s->eta));
        bad |= add(prune, "adapters_per_pass", raw_int(s->slots));
        bad |= add(prune, "rung_steps", steps);
        steps = NULL;
    }
    for (int64_t i = 0; i < t->n && !bad; i++) bad |= add(trials, NULL, trial_json(t, s, r, i));
    if (!bad) {
        int64_t best = ft_sweep_best(s, r);
        bad |= add(o, "version", raw_int(FT_SWEEP_JSON_VERSION));
        bad |= add(o, "prune", prune);
        prune = NULL;
        bad |= add(o, "trials", trials);
        trials = NULL;
        bad |= add(o, "best", best < 0 ? cJSON_CreateNull() : cJSON_CreateString(t->t[best].name));
    }
    char *txt = bad ? NULL : cJSON_Print(o);
    cJSON_Delete(steps);
    cJSON_Delete(prune);
    cJSON_Delete(trials);
    cJSON_Delete(o);
    if (!txt) return ft_err(-ENOMEM, "sweep.json: out of memory");
    size_t len = strlen(txt);
    char *out = realloc(txt, len + 2);
    if (!out) {
        free(txt);
        return ft_err(-ENOMEM, "sweep.json: out of memory");
    }
    out[len] = '\n';
    out[len + 1] = 0;
    *text = out;
    return 0;
}

int ft_sweep_json_write(const char *path, const ft_sweep_trials *t, const ft_sweep_sched *s,
                        const ft_sweep_result *r)
{
    char *text;
    FT_TRY(ft_sweep_json_format(t, s, r, &text));
    int rc = ft_write_file_atomic(path, text, strlen(text)); /* its messages name the path */
    free(text);
    return rc;
}

/* --- reading ----------------------------------------------------------------------------- */

/* What a read builds before it replaces s's and r's state. */
typedef struct doc {
    const char *name;         /* the file, for messages */
    const ft_sweep_trials *t;
    const ft_sweep_sched *s;
    int *status;              /* (n) */
    int64_t *n_reported;      /* (n) */
    double *loss;             /* (n, n_rungs) */
    ft_sweep_result *r;       /* (n) */
} doc;

/* The keys of object o are all in allowed (NULL-terminated): 0, or FT_E_INVALID naming the
 * first other one; where is the object's path ("" for the top). */
static int only_keys(const doc *d, const cJSON *o, const char *where, const char *const *allowed)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(it->string, allowed[i]);
        if (!ok)
            return ft_err(FT_E_INVALID, "%s: %s%sunknown key \"%s\"", d->name, where, *where ? ": " : "", it->string);
    }
    return 0;
}

/* o[key]: a member that must be there */
static int need(const doc *d, const cJSON *o, const char *where, const char *key, const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*out) return ft_err(FT_E_INVALID, "%s: %s%sno \"%s\"", d->name, where, *where ? ": " : "", key);
    return 0;
}

/* An integer >= min (and <= 2^53) at path where.key */
static int get_int(const doc *d, const cJSON *o, const char *where, const char *key, double min, int64_t *out)
{
    const cJSON *j;
    FT_TRY(need(d, o, where, key, &j));
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < min ||
        j->valuedouble > EXACT_INT)
        return ft_err(FT_E_INVALID, "%s: %s%s%s: expected an integer >= %.0f, found %s", d->name, where,
                      *where ? "." : "", key, min, cJSON_IsNumber(j) ? "another number" : ft_json_type(j));
    *out = (int64_t)j->valuedouble;
    return 0;
}

/* A number or null (NAN) */
static int get_loss(const doc *d, const cJSON *j, const char *where, double *out)
{
    if (cJSON_IsNull(j)) *out = NAN;
    else if (cJSON_IsNumber(j)) *out = j->valuedouble;
    else return ft_err(FT_E_INVALID, "%s: %s: expected a number or null, found %s", d->name, where, ft_json_type(j));
    return 0;
}

static int read_prune(const doc *d, const cJSON *root)
{
    static const char *const keys[] = {"method", "eta", "adapters_per_pass", "rung_steps", NULL};
    const ft_sweep_sched *s = d->s;
    const cJSON *p, *m, *steps;
    FT_TRY(need(d, root, "", "prune", &p));
    if (!cJSON_IsObject(p))
        return ft_err(FT_E_INVALID, "%s: prune: expected an object, found %s", d->name, ft_json_type(p));
    FT_TRY(only_keys(d, p, "prune", keys));
    FT_TRY(need(d, p, "prune", "method", &m));
    int mode = cJSON_IsString(m) ? ft_prune_mode_parse(m->valuestring) : -1;
    if (mode < 0)
        return ft_err(FT_E_INVALID, "%s: prune.method: expected \"none\" or \"halving\", found %s", d->name,
                      cJSON_IsString(m) ? m->valuestring : ft_json_type(m));
    if (mode != s->mode)
        return ft_err(FT_E_INVALID, "%s: prune.method: %s in the file, this sweep prunes %s (--prune %s continues it)",
                      d->name, m->valuestring, ft_prune_mode_name(s->mode), m->valuestring);
    int64_t eta, k;
    FT_TRY(get_int(d, p, "prune", "eta", 2, &eta));
    FT_TRY(get_int(d, p, "prune", "adapters_per_pass", 1, &k));
    if (eta != s->eta)
        return ft_err(FT_E_INVALID, "%s: prune.eta: %lld in the file, this sweep has %lld", d->name, (long long)eta,
                      (long long)s->eta);
    if (k != s->slots)
        return ft_err(FT_E_INVALID, "%s: prune.adapters_per_pass: %lld in the file, this sweep has %lld (which "
                      "trials run together decides which are pruned: --adapters-per-pass %lld continues it)",
                      d->name, (long long)k, (long long)s->slots, (long long)k);
    FT_TRY(need(d, p, "prune", "rung_steps", &steps));
    if (!cJSON_IsArray(steps))
        return ft_err(FT_E_INVALID, "%s: prune.rung_steps: expected a list of steps, found %s", d->name,
                      ft_json_type(steps));
    int64_t n = cJSON_GetArraySize(steps), i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, steps) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 1 ||
            e->valuedouble > EXACT_INT)
            return ft_err(FT_E_INVALID, "%s: prune.rung_steps[%lld]: expected an integer >= 1, found %s", d->name,
                          (long long)i, cJSON_IsNumber(e) ? "another number" : ft_json_type(e));
        if (i < s->n_rungs && (int64_t)e->valuedouble != s->rung_step[i]) break;
        i++;
    }
    if (i != n || n != s->n_rungs) {
        char here[256] = "";
        for (int64_t q = 0, o = 0; q < s->n_rungs && o < (int64_t)sizeof here; q++)
            o += snprintf(here + o, sizeof here - (size_t)o, "%s%lld", q ? ", " : "", (long long)s->rung_step[q]);
        return ft_err(FT_E_INVALID, "%s: prune.rung_steps: other rungs than this sweep's [%s] (the steps, --eval-every "
                      "or the pruning changed)", d->name, here);
    }
    return 0;
}

/* trials[i].params: exactly this sweep's keys, with trial i's values */
static int read_params(const doc *d, const cJSON *p, int64_t i, const char *where)
{
    const ft_sweep_trials *t = d->t;
    if (!cJSON_IsObject(p))
        return ft_err(FT_E_INVALID, "%s: %s.params: expected an object, found %s", d->name, where, ft_json_type(p));
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        int known = 0;
        for (int k = 0; k < t->n_keys && !known; k++) known = ft_sweep_key_find(it->string) == t->keys[k];
        if (!known)
            return ft_err(FT_E_INVALID, "%s: %s.params: \"%s\" is not an option of this sweep (the search space changed: "
                          "give the same --grid/--config, or another --out)", d->name, where, it->string);
    }
    for (int k = 0; k < t->n_keys; k++) {
        const ft_sweep_key *key = t->keys[k];
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(p, key->name);
        if (!j)
            return ft_err(FT_E_INVALID, "%s: %s.params: no \"%s\" (the search space changed: give the same "
                          "--grid/--config, or another --out)", d->name, where, key->name);
        ft_sweep_val v;
        int rc = ft_sweep_key_from_json(key, j, &v);
        if (rc) return ft_err_prefix(rc, "%s: %s.params.%s", d->name, where, key->name);
        if (!ft_sweep_val_equal(key, v, t->t[i].vals[k])) {
            char file_v[160], here_v[160];
            ft_sweep_key_text(key, v, file_v, sizeof file_v);
            ft_sweep_key_text(key, t->t[i].vals[k], here_v, sizeof here_v);
            return ft_err(FT_E_INVALID, "%s: %s.params.%s: %s, and this sweep's trial %lld (%s) has %s (the search "
                          "space changed: give the same --grid/--config, or another --out)", d->name, where,
                          key->name, file_v, (long long)i, t->t[i].name, here_v);
        }
    }
    return 0;
}

static int read_trial(doc *d, const cJSON *o, int64_t i)
{
    static const char *const keys[] = {"name", "params", "status", "best_eval_loss", "best_eval_step", "steps",
                                       "tokens", "rung_losses", "error", NULL};
    char where[48], sub[112];
    snprintf(where, sizeof where, "trials[%lld]", (long long)i);
    if (!cJSON_IsObject(o))
        return ft_err(FT_E_INVALID, "%s: %s: expected an object, found %s", d->name, where, ft_json_type(o));
    FT_TRY(only_keys(d, o, where, keys));
    const cJSON *name, *params, *status, *loss, *rungs, *err;
    FT_TRY(need(d, o, where, "name", &name));
    if (!cJSON_IsString(name))
        return ft_err(FT_E_INVALID, "%s: %s.name: expected a string, found %s", d->name, where, ft_json_type(name));
    if (strcmp(name->valuestring, d->t->t[i].name))
        return ft_err(FT_E_INVALID, "%s: %s.name: \"%s\", and this sweep's trial %lld is \"%s\" (the search space "
                      "changed: give the same --grid/--config, or another --out)", d->name, where, name->valuestring,
                      (long long)i, d->t->t[i].name);
    FT_TRY(need(d, o, where, "params", &params));
    FT_TRY(read_params(d, params, i, where));
    FT_TRY(need(d, o, where, "status", &status));
    int st = cJSON_IsString(status) ? ft_trial_status_parse(status->valuestring) : -1;
    if (st < 0)
        return ft_err(FT_E_INVALID, "%s: %s.status: expected one of pending, running, pruned, completed, failed, "
                      "found %s%s%s", d->name, where, cJSON_IsString(status) ? "\"" : "",
                      cJSON_IsString(status) ? status->valuestring : ft_json_type(status),
                      cJSON_IsString(status) ? "\"" : "");
    if (st == FT_TRIAL_PRUNED && d->s->mode == FT_PRUNE_NONE)
        return ft_err(FT_E_INVALID, "%s: %s.status: pruned, in a sweep that prunes none", d->name, where);
    d->status[i] = st;
    ft_sweep_result *r = &d->r[i];
    ft_sweep_results_init(r, 1);
    FT_TRY(need(d, o, where, "best_eval_loss", &loss));
    snprintf(sub, sizeof sub, "%s.best_eval_loss", where);
    FT_TRY(get_loss(d, loss, sub, &r->best_eval_loss));
    FT_TRY(get_int(d, o, where, "best_eval_step", 0, &r->best_eval_step));
    FT_TRY(get_int(d, o, where, "steps", 0, &r->steps));
    FT_TRY(get_int(d, o, where, "tokens", 0, &r->tokens));
    FT_TRY(need(d, o, where, "rung_losses", &rungs));
    if (!cJSON_IsArray(rungs))
        return ft_err(FT_E_INVALID, "%s: %s.rung_losses: expected a list, found %s", d->name, where,
                      ft_json_type(rungs));
    int64_t n = cJSON_GetArraySize(rungs), k = 0;
    if (n > d->s->n_rungs)
        return ft_err(FT_E_INVALID, "%s: %s.rung_losses: %lld losses, and the sweep has %lld rungs", d->name, where,
                      (long long)n, (long long)d->s->n_rungs);
    if (n && st == FT_TRIAL_PENDING)
        return ft_err(FT_E_INVALID, "%s: %s.rung_losses: a pending trial with rung losses (%lld)", d->name, where,
                      (long long)n);
    const cJSON *e;
    cJSON_ArrayForEach(e, rungs) {
        snprintf(sub, sizeof sub, "%s.rung_losses[%lld]", where, (long long)k);
        FT_TRY(get_loss(d, e, sub, &d->loss[i * d->s->n_rungs + k]));
        k++;
    }
    if (!n && st == FT_TRIAL_PRUNED)
        return ft_err(FT_E_INVALID, "%s: %s.rung_losses: a pruned trial without the rung loss it was pruned at",
                      d->name, where);
    d->n_reported[i] = n;
    err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err && !cJSON_IsString(err))
        return ft_err(FT_E_INVALID, "%s: %s.error: expected a string, found %s", d->name, where, ft_json_type(err));
    if (err && st == FT_TRIAL_FAILED) snprintf(r->error, sizeof r->error, "%s", err->valuestring);
    return 0;
}

static int read_doc(doc *d, const cJSON *root)
{
    static const char *const keys[] = {"version", "prune", "trials", "best", NULL};
    if (!cJSON_IsObject(root))
        return ft_err(FT_E_INVALID, "%s: expected a JSON object {\"trials\": [...], ...}, found %s", d->name,
                      ft_json_type(root));
    int oom = 0;
    const char *dup = ft_json_dup_key(root, 1, &oom);
    if (oom) return ft_err(-ENOMEM, "%s: out of memory", d->name);
    if (dup) return ft_err(FT_E_INVALID, "%s: key \"%s\" appears twice in one object", d->name, dup);
    FT_TRY(only_keys(d, root, "", keys));
    int64_t version;
    FT_TRY(get_int(d, root, "", "version", 0, &version));
    if (version != FT_SWEEP_JSON_VERSION)
        return ft_err(FT_E_UNSUPPORTED, "%s: version: %lld, this ftune reads version %d", d->name, (long long)version,
                      FT_SWEEP_JSON_VERSION);
    FT_TRY(read_prune(d, root));
    const cJSON *trials, *best;
    FT_TRY(need(d, root, "", "trials", &trials));
    if (!cJSON_IsArray(trials))
        return ft_err(FT_E_INVALID, "%s: trials: expected a list, found %s", d->name, ft_json_type(trials));
    int64_t n = cJSON_GetArraySize(trials), i = 0;
    if (n != d->t->n)
        return ft_err(FT_E_INVALID, "%s: trials: %lld trials, and this sweep has %lld (the search space changed: give "
                      "the same --grid/--config, or another --out)", d->name, (long long)n, (long long)d->t->n);
    const cJSON *e;
    cJSON_ArrayForEach(e, trials) FT_TRY(read_trial(d, e, i++));
    int64_t running = 0;
    for (i = 0; i < n; i++) running += d->status[i] == FT_TRIAL_RUNNING;
    if (running > d->s->slots)
        return ft_err(FT_E_INVALID, "%s: trials: %lld running, more than the %lld adapters per pass", d->name,
                      (long long)running, (long long)d->s->slots);
    FT_TRY(need(d, root, "", "best", &best));
    ft_sweep_sched view = *d->s; /* the file's statuses, for ft_sweep_best */
    view.status = d->status;
    int64_t b = ft_sweep_best(&view, d->r);
    if (!cJSON_IsNull(best) && !cJSON_IsString(best))
        return ft_err(FT_E_INVALID, "%s: best: expected a trial's name or null, found %s", d->name, ft_json_type(best));
    const char *want = b < 0 ? NULL : d->t->t[b].name, *got = cJSON_IsString(best) ? best->valuestring : NULL;
    if ((want == NULL) != (got == NULL) || (want && strcmp(want, got)))
        return ft_err(FT_E_INVALID, "%s: best: %s%s%s, and the completed trial of the lowest best_eval_loss is %s%s%s",
                      d->name, got ? "\"" : "", got ? got : "null", got ? "\"" : "", want ? "\"" : "",
                      want ? want : "none", want ? "\"" : "");
    return 0;
}

int ft_sweep_json_parse(const char *text, size_t len, const char *name, const ft_sweep_trials *t,
                        ft_sweep_sched *s, ft_sweep_result *r)
{
    if (t->n != s->n_trials)
        return ft_err(FT_E_INVALID, "%s: %lld trials, and the scheduler has %lld", name, (long long)t->n,
                      (long long)s->n_trials);
    const char *ep = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &ep, 0);
    if (!root) return ft_err(FT_E_INVALID, "%s: offset %ld: not valid JSON", name, ep ? (long)(ep - text) : 0L);
    int64_t n = t->n, nl = n * s->n_rungs;
    doc d = {name, t, s, malloc((size_t)(n ? n : 1) * sizeof(int)), calloc((size_t)(n ? n : 1), sizeof(int64_t)),
             malloc((size_t)(nl ? nl : 1) * sizeof(double)), malloc((size_t)(n ? n : 1) * sizeof(ft_sweep_result))};
    int rc = !d.status || !d.n_reported || !d.loss || !d.r ? ft_err(-ENOMEM, "%s: out of memory", name) : 0;
    for (int64_t i = 0; !rc && i < nl; i++) d.loss[i] = NAN;
    if (!rc) rc = read_doc(&d, root);
    if (!rc) {
        memcpy(s->status, d.status, (size_t)n * sizeof *d.status);
        memcpy(s->n_reported, d.n_reported, (size_t)n * sizeof *d.n_reported);
        memcpy(s->loss, d.loss, (size_t)nl * sizeof *d.loss);
        memcpy(r, d.r, (size_t)n * sizeof *d.r);
    }
    cJSON_Delete(root);
    free(d.status);
    free(d.n_reported);
    free(d.loss);
    free(d.r);
    return rc;
}

int ft_sweep_json_read(const char *path, const ft_sweep_trials *t, ft_sweep_sched *s, ft_sweep_result *r)
{
    char *text;
    size_t len;
    FT_TRY(ft_read_file(path, &text, &len));
    int rc = ft_sweep_json_parse(text, len, path, t, s, r);
    free(text);
    return rc;
}
