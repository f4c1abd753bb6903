/* sweep_space.c - search spaces (--grid, --config), their expansion into trials and the
 * trials' names (sweep_space.h). */
#include "src/train/sweep_space.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"
#include "src/core/rng.h"

#define EXACT_INT 9007199254740992.0 /* 2^53: integers a double holds exactly */

void ft_sweep_space_init(ft_sweep_space *s)
{
    memset(s, 0, sizeof *s);
}

static void dim_free(ft_sweep_dim *d)
{
    free(d->vals);
    d->vals = NULL;
}

void ft_sweep_space_free(ft_sweep_space *s)
{
    if (!s) return;
    for (int i = 0; i < s->n_dims; i++) dim_free(&s->dims[i]);
    free(s->dims);
    memset(s, 0, sizeof *s);
}

/* Drops the dimensions from n on (a failed load leaves s as it was). */
static void truncate_dims(ft_sweep_space *s, int n)
{
    while (s->n_dims > n) dim_free(&s->dims[--s->n_dims]);
}

/* A new dimension for key k, or NULL: -ENOMEM, or FT_E_INVALID when k already has one. */
static ft_sweep_dim *add_dim(ft_sweep_space *s, const ft_sweep_key *k, int dist, const char *from, int *rc)
{
    for (int i = 0; i < s->n_dims; i++)
        if (s->dims[i].key == k) {
            *rc = ft_err(FT_E_INVALID, "%s: %s is given twice (also by %s)", from, k->name, s->dims[i].from);
            return NULL;
        }
    if (s->n_dims == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        ft_sweep_dim *d = realloc(s->dims, (size_t)cap * sizeof *d);
        if (!d) {
            *rc = ft_err(-ENOMEM, "%s: out of memory", from);
            return NULL;
        }
        s->dims = d;
        s->cap = cap;
    }
    ft_sweep_dim *d = &s->dims[s->n_dims++];
    memset(d, 0, sizeof *d);
    d->key = k;
    d->dist = dist;
    snprintf(d->from, sizeof d->from, "%s", from);
    return d;
}

static int unknown_key(const char *where, const char *key)
{
    char msg[1024];
    ft_sweep_key_unknown_msg(key, msg, sizeof msg);
    return ft_err(FT_E_INVALID, "%s: %s", where, msg);
}

/* --- --grid KEY=V1,V2,... ------------------------------------------------------------ */

int ft_sweep_space_add_grid(ft_sweep_space *s, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return ft_err(FT_E_INVALID, "--grid %s: expected KEY=V1,V2,... (a training option and its values)", arg);
    char key[96], from[192];
    if ((size_t)(eq - arg) >= sizeof key) return unknown_key("--grid", arg);
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg), arg);
    snprintf(from, sizeof from, "--grid %s", key);
    const ft_sweep_key *k = ft_sweep_key_find(key);
    if (!k) return unknown_key(from, key);
    const char *v = eq + 1;
    if (!*v) return ft_err(FT_E_INVALID, "%s: no values (expected %s=V1,V2,...)", from, k->name);
    int64_t n = 1;
    for (const char *p = v; *p; p++) n += *p == ',';
    int rc = 0;
    ft_sweep_dim *d = add_dim(s, k, FT_DIST_GRID, from, &rc);
    if (!d) return rc;
    d->vals = calloc((size_t)n, sizeof *d->vals);
    if (!d->vals) {
        truncate_dims(s, s->n_dims - 1);
        return ft_err(-ENOMEM, "%s: out of memory", from);
    }
    char one[256];
    for (int64_t i = 0; i < n; i++) {
        const char *e = strchr(v, ',');
        size_t len = e ? (size_t)(e - v) : strlen(v);
        if (!len) rc = ft_err(FT_E_INVALID, "%s: value %lld is empty", from, (long long)i + 1);
        else if (len >= sizeof one) rc = ft_err(FT_E_INVALID, "%s: value %lld is too long", from, (long long)i + 1);
        if (rc) break;
        snprintf(one, sizeof one, "%.*s", (int)len, v);
        rc = ft_sweep_key_parse(k, one, &d->vals[i]);
        if (rc) {
            rc = ft_err_prefix(rc, "%s", from);
            break;
        }
        for (int64_t j = 0; j < i; j++)
            if (ft_sweep_val_equal(k, d->vals[j], d->vals[i])) {
                rc = ft_err(FT_E_INVALID, "%s: value %s is given twice (values %lld and %lld)", from, one,
                            (long long)j + 1, (long long)i + 1);
                break;
            }
        if (rc) break;
        d->n_vals++;
        v += len + (e != NULL);
    }
    if (rc) truncate_dims(s, s->n_dims - 1);
    return rc;
}

/* --- --config FILE -------------------------------------------------------------------- */

/* The values of JSON list j (non-empty) for key k into d->vals; where: "FILE: grid.lr". */
static int json_values(ft_sweep_dim *d, const cJSON *j, const char *where, int unique)
{
    if (!cJSON_IsArray(j))
        return ft_err(FT_E_INVALID, "%s: expected a list of values, found %s", where, ft_json_type(j));
    int64_t n = cJSON_GetArraySize(j);
    if (!n) return ft_err(FT_E_INVALID, "%s: the list is empty", where);
    d->vals = calloc((size_t)n, sizeof *d->vals);
    if (!d->vals) return ft_err(-ENOMEM, "%s: out of memory", where);
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        int64_t i = d->n_vals;
        int rc = ft_sweep_key_from_json(d->key, e, &d->vals[i]);
        if (rc) return ft_err_prefix(rc, "%s[%lld]", where, (long long)i);
        for (int64_t q = 0; unique && q < i; q++)
            if (ft_sweep_val_equal(d->key, d->vals[q], d->vals[i]))
                return ft_err(FT_E_INVALID, "%s[%lld]: the value of %s[%lld] again", where, (long long)i, where,
                              (long long)q);
        d->n_vals++;
    }
    return 0;
}

static int parse_grid(ft_sweep_space *s, const cJSON *g, const char *name)
{
    char where[192];
    if (!cJSON_IsObject(g))
        return ft_err(FT_E_INVALID, "%s: grid: expected an object {\"KEY\": [V1, V2, ...]}, found %s", name,
                      ft_json_type(g));
    if (!g->child) return ft_err(FT_E_INVALID, "%s: grid: the object is empty", name);
    const cJSON *it;
    cJSON_ArrayForEach(it, g) {
        snprintf(where, sizeof where, "%s: grid.%s", name, it->string);
        const ft_sweep_key *k = ft_sweep_key_find(it->string);
        if (!k) return unknown_key(where, it->string);
        int rc = 0;
        ft_sweep_dim *d = add_dim(s, k, FT_DIST_GRID, where, &rc);
        if (!d) return rc;
        FT_TRY(json_values(d, it, where, 1));
    }
    return 0;
}

/* {"uniform" | "log_uniform": [lo, hi]} for a numeric key */
static int parse_bounds(ft_sweep_dim *d, const cJSON *b, const char *where)
{
    const ft_sweep_key *k = d->key;
    int num = k->type == FT_SWEEP_INT || k->type == FT_SWEEP_U64 || k->type == FT_SWEEP_DBL ||
              k->type == FT_SWEEP_FLOAT;
    if (!num)
        return ft_err(FT_E_INVALID, "%s: %s takes %s, which have no bounds: give {\"choice\": [...]}", where,
                      k->name, k->type == FT_SWEEP_BOOL ? "true or false" : "names");
    if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 || !cJSON_IsNumber(b->child) ||
        !cJSON_IsNumber(b->child->next))
        return ft_err(FT_E_INVALID, "%s: expected [lo, hi] (two numbers), found %s", where,
                      cJSON_IsArray(b) ? "another list" : ft_json_type(b));
    double lo = b->child->valuedouble, hi = b->child->next->valuedouble;
    char lo_t[40], hi_t[40];
    ft_sweep_num_text(lo, lo_t, sizeof lo_t);
    ft_sweep_num_text(hi, hi_t, sizeof hi_t);
    int rc = ft_sweep_key_check_num(k, lo);
    if (rc) return ft_err_prefix(rc, "%s[0]", where);
    rc = ft_sweep_key_check_num(k, hi);
    if (rc) return ft_err_prefix(rc, "%s[1]", where);
    if (!(lo < hi)) return ft_err(FT_E_INVALID, "%s: expected lo < hi, got [%s, %s]", where, lo_t, hi_t);
    if (d->dist == FT_DIST_LOG_UNIFORM && !(lo > 0))
        return ft_err(FT_E_INVALID, "%s: the bounds of a log-uniform draw must be > 0, got [%s, %s]", where,
                      lo_t, hi_t);
    d->lo = lo;
    d->hi = hi;
    return 0;
}

static int parse_random(ft_sweep_space *s, const cJSON *r, const char *name)
{
    char where[192], sub[224];
    if (!cJSON_IsObject(r))
        return ft_err(FT_E_INVALID, "%s: random: expected an object {\"KEY\": {\"log_uniform\": [lo, hi]}, ...}, "
                      "found %s", name, ft_json_type(r));
    if (!r->child) return ft_err(FT_E_INVALID, "%s: random: the object is empty", name);
    const cJSON *it;
    cJSON_ArrayForEach(it, r) {
        snprintf(where, sizeof where, "%s: random.%s", name, it->string);
        const ft_sweep_key *k = ft_sweep_key_find(it->string);
        if (!k) return unknown_key(where, it->string);
        const cJSON *spec = it->child;
        int dist = -1;
        if (cJSON_IsObject(it) && spec && !spec->next) {
            if (!strcmp(spec->string, "uniform")) dist = FT_DIST_UNIFORM;
            else if (!strcmp(spec->string, "log_uniform")) dist = FT_DIST_LOG_UNIFORM;
            else if (!strcmp(spec->string, "choice")) dist = FT_DIST_CHOICE;
        }
        if (dist < 0)
            return ft_err(FT_E_INVALID, "%s: expected one of {\"uniform\": [lo, hi]}, {\"log_uniform\": [lo, hi]}, "
                          "{\"choice\": [V, ...]}, found %s", where,
                          !cJSON_IsObject(it) ? ft_json_type(it) : !spec ? "an empty object"
                          : spec->next ? "an object of several keys" : "another key");
        int rc = 0;
        ft_sweep_dim *d = add_dim(s, k, dist, where, &rc);
        if (!d) return rc;
        snprintf(sub, sizeof sub, "%s.%s", where, spec->string);
        FT_TRY(dist == FT_DIST_CHOICE ? json_values(d, spec, sub, 0) : parse_bounds(d, spec, sub));
    }
    return 0;
}

/* "trials" (an integer >= 1) or "seed" (an integer >= 0, or its digits in a string) */
static int parse_count(const cJSON *j, const char *name, const char *key, double min, uint64_t *out)
{
    if (cJSON_IsString(j) && min == 0) {
        ft_sweep_val v;
        const ft_sweep_key *seed = ft_sweep_key_find("seed");
        int rc = ft_sweep_key_parse(seed, j->valuestring, &v);
        if (rc) return ft_err_prefix(rc, "%s: %s", name, key);
        *out = v.u;
        return 0;
    }
    if (!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble) || j->valuedouble < min ||
        j->valuedouble > EXACT_INT)
        return ft_err(FT_E_INVALID, "%s: %s: expected an integer >= %.0f, found %s", name, key, min,
                      cJSON_IsNumber(j) ? "another number" : ft_json_type(j));
    *out = (uint64_t)j->valuedouble;
    return 0;
}

static int parse_config(ft_sweep_space *s, const cJSON *o, const char *name)
{
    if (!cJSON_IsObject(o))
        return ft_err(FT_E_INVALID, "%s: expected a JSON object {\"grid\": {...}, \"random\": {...}, ...}, found %s",
                      name, ft_json_type(o));
    int oom = 0;
    const char *dup = ft_json_dup_key(o, 1, &oom);
    if (oom) return ft_err(-ENOMEM, "%s: out of memory", name);
    if (dup) return ft_err(FT_E_INVALID, "%s: key \"%s\" appears twice in one object", name, dup);
    const cJSON *it, *trials = NULL, *random = NULL, *grid = NULL;
    cJSON_ArrayForEach(it, o) {
        if (!strcmp(it->string, "grid")) grid = it;
        else if (!strcmp(it->string, "random")) random = it;
        else if (!strcmp(it->string, "trials")) trials = it;
        else if (!strcmp(it->string, "seed")) {
            FT_TRY(parse_count(it, name, "seed", 0, &s->seed));
        } else {
            return ft_err(FT_E_INVALID, "%s: unknown key \"%s\" (expected grid, random, trials, seed)", name,
                          it->string);
        }
    }
    if (!grid && !random) return ft_err(FT_E_INVALID, "%s: no search space: neither \"grid\" nor \"random\"", name);
    if (random && !trials)
        return ft_err(FT_E_INVALID, "%s: random: needs \"trials\": N, the number of draws", name);
    if (trials && !random)
        return ft_err(FT_E_INVALID, "%s: trials: counts the draws of \"random\", and there is none", name);
    if (grid) FT_TRY(parse_grid(s, grid, name));
    if (random) {
        uint64_t n;
        FT_TRY(parse_count(trials, name, "trials", 1, &n));
        FT_TRY(parse_random(s, random, name));
        s->n_draws = (int64_t)n;
    }
    return 0;
}

int ft_sweep_space_parse(ft_sweep_space *s, const char *text, size_t len, const char *name)
{
    if (s->n_draws) return ft_err(FT_E_INVALID, "%s: a second search-space file (one --config)", name);
    const char *ep = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(text, len, &ep, 0);
    if (!o) {
        long off = ep ? (long)(ep - text) : 0;
        return ft_err(FT_E_INVALID, "%s: offset %ld: not valid JSON", name, off);
    }
    int n0 = s->n_dims;
    uint64_t seed0 = s->seed;
    int rc = parse_config(s, o, name);
    cJSON_Delete(o);
    if (rc) {
        truncate_dims(s, n0);
        s->seed = seed0;
        s->n_draws = 0;
    }
    return rc;
}

int ft_sweep_space_load(ft_sweep_space *s, const char *path)
{
    char *text;
    size_t len;
    FT_TRY(ft_read_file(path, &text, &len));
    int rc = ft_sweep_space_parse(s, text, len, path);
    free(text);
    return rc;
}

/* --- draws ----------------------------------------------------------------------------- */

/* 53 random bits as a double in [0, 1) */
static double uniform53(ft_rng *r)
{
    return (double)(ft_rng_next(r) >> 11) * 0x1p-53;
}

/* x rounded to FT_SWEEP_DRAW_DIGITS significant digits, kept inside [lo, hi]: the nearest
 * such value, else the one on the inside of x (rounded toward lo or hi), else x itself (no
 * such value lies between x and the bound). */
static double round_draw(double x, double lo, double hi)
{
    char buf[48];
    if (x == 0) return x;
    snprintf(buf, sizeof buf, "%.*e", FT_SWEEP_DRAW_DIGITS - 1, x);
    double r = strtod(buf, NULL);
    if (r >= lo && r <= hi) return r;
    double unit = pow(10.0, floor(log10(fabs(x))) - (FT_SWEEP_DRAW_DIGITS - 1)); /* of the last digit */
    double in = r > hi ? floor(x / unit) * unit : ceil(x / unit) * unit;
    snprintf(buf, sizeof buf, "%.*e", FT_SWEEP_DRAW_DIGITS - 1, in); /* the decimal's nearest double */
    in = strtod(buf, NULL);
    return in >= lo && in <= hi ? in : x;
}

static void draw(const ft_sweep_dim *d, ft_rng *r, ft_sweep_val *v)
{
    double u = uniform53(r);
    int integer = d->key->type == FT_SWEEP_INT || d->key->type == FT_SWEEP_U64;
    if (d->dist == FT_DIST_CHOICE) {
        int64_t i = (int64_t)(u * (double)d->n_vals);
        *v = d->vals[i < d->n_vals ? i : d->n_vals - 1];
        return;
    }
    double x;
    if (integer) {
        if (d->dist == FT_DIST_UNIFORM) x = d->lo + floor((d->hi - d->lo + 1) * u);
        else x = floor(exp(log(d->lo) + (log(d->hi + 1) - log(d->lo)) * u));
        if (x > d->hi) x = d->hi; /* exp/log rounding at the top end */
        if (x < d->lo) x = d->lo;
        if (d->key->type == FT_SWEEP_INT) v->i = (int64_t)x;
        else v->u = (uint64_t)x;
        return;
    }
    if (d->dist == FT_DIST_UNIFORM) x = d->lo + (d->hi - d->lo) * u;
    else x = exp(log(d->lo) + (log(d->hi) - log(d->lo)) * u);
    if (x > d->hi) x = d->hi;
    if (x < d->lo) x = d->lo;
    v->d = round_draw(x, d->lo, d->hi);
}

/* --- names ----------------------------------------------------------------------------- */

typedef struct name_ref { const char *name; int64_t i; } name_ref;

static int cmp_name_ref(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* The base name of trial t: tag + value per key, '_' between, cut to FT_SWEEP_NAME_CUT. */
static void base_name(const ft_sweep_trials *ts, const ft_sweep_trial *t, char *out)
{
    char buf[FT_SWEEP_NAME_CUT + 160];
    size_t o = 0;
    for (int k = 0; k < ts->n_keys && o < FT_SWEEP_NAME_CUT; k++) {
        const ft_sweep_key *key = ts->keys[k];
        char val[128];
        ft_sweep_key_format(key, t->vals[k], val, sizeof val);
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s%s", k ? "_" : "",
                              key->type == FT_SWEEP_BOOL ? "" : key->tag, val);
    }
    if (o > FT_SWEEP_NAME_CUT) o = FT_SWEEP_NAME_CUT;
    buf[o] = 0;
    for (size_t i = 0; i < o; i++) {
        char c = buf[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '+' || c == '-';
        if (!ok) buf[i] = '-';
    }
    while (o && buf[o - 1] == '_') buf[--o] = 0; /* a cut right after a separator */
    memcpy(out, buf, o + 1);
}

/* Names every trial: base names, then "_2", "_3", ... on the later ones of equal names. */
static int name_trials(ft_sweep_trials *ts)
{
    for (int64_t i = 0; i < ts->n; i++) base_name(ts, &ts->t[i], ts->t[i].name);
    name_ref *r = malloc((size_t)ts->n * sizeof *r);
    if (!r) return ft_err(-ENOMEM, "trial names: out of memory");
    for (int64_t i = 0; i < ts->n; i++) r[i] = (name_ref){ts->t[i].name, i};
    qsort(r, (size_t)ts->n, sizeof *r, cmp_name_ref);
    int64_t *suffix = calloc((size_t)ts->n, sizeof *suffix);
    if (!suffix) {
        free(r);
        return ft_err(-ENOMEM, "trial names: out of memory");
    }
    for (int64_t j = 1, run = 1; j < ts->n; j++) {
        run = strcmp(r[j].name, r[j - 1].name) ? 1 : run + 1;
        if (run > 1) suffix[r[j].i] = run;
    }
    free(r); /* r pointed into the names, which change now */
    for (int64_t i = 0; i < ts->n; i++)
        if (suffix[i]) {
            size_t o = strlen(ts->t[i].name);
            snprintf(ts->t[i].name + o, FT_SWEEP_NAME_MAX - o, "_%lld", (long long)suffix[i]);
        }
    free(suffix);
    return 0;
}

/* --- expansion ------------------------------------------------------------------------- */

void ft_sweep_trials_free(ft_sweep_trials *t)
{
    if (!t) return;
    free(t->keys);
    free(t->t);
    free(t->vals);
    memset(t, 0, sizeof *t);
}

/* The size of the space: its factors in words into why[n] ("lr 3 x lora_r 2 x 4 draws"),
 * the product in *total (INT64_MAX when it overflows). */
static void space_size(const ft_sweep_space *s, int64_t *grid_n, int64_t *total, char *why, size_t n)
{
    size_t o = 0;
    int64_t g = 1, t;
    int over = 0;
    why[0] = 0;
    for (int i = 0; i < s->n_dims; i++) {
        const ft_sweep_dim *d = &s->dims[i];
        if (d->dist != FT_DIST_GRID) continue;
        if (__builtin_mul_overflow(g, d->n_vals, &g)) over = 1;
        if (o < n) o += (size_t)snprintf(why + o, n - o, "%s%s %lld", o ? " x " : "", d->key->name, (long long)d->n_vals);
    }
    int random = 0;
    for (int i = 0; i < s->n_dims; i++) random |= s->dims[i].dist != FT_DIST_GRID;
    t = g;
    if (random) {
        if (__builtin_mul_overflow(g, s->n_draws, &t)) over = 1;
        if (o < n) snprintf(why + o, n - o, "%s%lld random draws", o ? " x " : "", (long long)s->n_draws);
    }
    *grid_n = over ? INT64_MAX : g;
    *total = over ? INT64_MAX : t;
}

int ft_sweep_space_expand(const ft_sweep_space *s, int64_t max_trials, ft_sweep_trials *out)
{
    memset(out, 0, sizeof *out);
    if (!s->n_dims)
        return ft_err(FT_E_INVALID, "empty search space: give --grid KEY=V1,V2,... or --config FILE "
                      "(with \"grid\" or \"random\")");
    int random = 0;
    for (int i = 0; i < s->n_dims; i++) random |= s->dims[i].dist != FT_DIST_GRID;
    if (random && s->n_draws < 1)
        return ft_err(FT_E_INVALID, "random dimensions need trials >= 1 (the number of draws)");
    int64_t grid_n, total;
    char why[512];
    space_size(s, &grid_n, &total, why, sizeof why);
    if (total > max_trials) {
        char count[32];
        if (total == INT64_MAX) snprintf(count, sizeof count, "more than 2^63");
        else snprintf(count, sizeof count, "%lld", (long long)total);
        return ft_err(FT_E_RANGE, "the search space has %s trials (%s), more than --max-trials %lld: "
                      "give fewer values, or a larger --max-trials", count, why, (long long)max_trials);
    }
    int64_t draws = total / grid_n; /* 1 without random dimensions */
    int nk = s->n_dims;
    if (total > INT64_MAX / (int64_t)sizeof(ft_sweep_val) / (nk + 1))
        return ft_err(-ENOMEM, "search space of %lld trials: too large to hold", (long long)total);
    out->n = total;
    out->n_keys = nk;
    out->keys = malloc((size_t)nk * sizeof *out->keys);
    out->t = calloc((size_t)total, sizeof *out->t);
    out->vals = calloc((size_t)(total * nk), sizeof *out->vals);
    ft_sweep_val *drawn = calloc((size_t)(draws * nk), sizeof *drawn); /* (draws, nk) */
    if (!out->keys || !out->t || !out->vals || !drawn) {
        free(drawn);
        ft_sweep_trials_free(out);
        return ft_err(-ENOMEM, "search space of %lld trials: out of memory", (long long)total);
    }
    for (int k = 0; k < nk; k++) out->keys[k] = s->dims[k].key;
    /* the draws first, in (draw, dimension) order, from one stream */
    ft_rng rng;
    ft_rng_seed(&rng, s->seed);
    for (int64_t d = 0; d < draws && draws > 0; d++)
        for (int k = 0; k < nk; k++)
            if (s->dims[k].dist != FT_DIST_GRID) draw(&s->dims[k], &rng, &drawn[d * nk + k]);
    for (int64_t g = 0; g < grid_n; g++)
        for (int64_t d = 0; d < draws; d++) {
            int64_t i = g * draws + d, rest = g;
            ft_sweep_trial *t = &out->t[i];
            t->vals = out->vals + i * nk;
            /* grid point g in mixed radix, the last grid dimension the least significant */
            for (int k = nk - 1; k >= 0; k--) {
                const ft_sweep_dim *dim = &s->dims[k];
                if (dim->dist != FT_DIST_GRID) {
                    t->vals[k] = drawn[d * nk + k];
                    continue;
                }
                t->vals[k] = dim->vals[rest % dim->n_vals];
                rest /= dim->n_vals;
            }
        }
    free(drawn);
    int rc = name_trials(out);
    if (rc) ft_sweep_trials_free(out);
    return rc;
}

void ft_sweep_trial_apply(const ft_sweep_trials *t, int64_t i, ft_train_cfg *c)
{
    for (int k = 0; k < t->n_keys; k++) ft_sweep_key_apply(t->keys[k], t->t[i].vals[k], c);
}

int ft_sweep_trial_flags(const ft_sweep_trials *t, int64_t i, char *buf, size_t n)
{
    size_t o = 0;
    if (n) buf[0] = 0;
    for (int k = 0; k < t->n_keys; k++) {
        const ft_sweep_key *key = t->keys[k];
        char flag[96], val[160];
        size_t j = 0;
        for (; key->name[j] && j + 1 < sizeof flag; j++) flag[j] = key->name[j] == '_' ? '-' : key->name[j];
        flag[j] = 0;
        ft_sweep_key_text(key, t->t[i].vals[k], val, sizeof val);
        int w;
        if (key->type == FT_SWEEP_BOOL)
            w = snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, "%s--%s%s", k ? " " : "", flag,
                         t->t[i].vals[k].i ? "" : "=false");
        else
            w = snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, "%s--%s %s", k ? " " : "", flag, val);
        o += (size_t)w;
    }
    return (int)o;
}
