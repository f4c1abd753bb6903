/* sweep_keys.c - the table of per-trial training options and their values (sweep_keys.h). */
#include "src/train/sweep_keys.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/json.h"
#include "src/model/lora.h"
#include "src/model/model.h"
#include "src/train/dpo.h"
#include "src/train/schedule.h"

#define OFF(f) offsetof(ft_train_cfg, f)
#define LO FT_SWEEP_LO
#define LO_OPEN (FT_SWEEP_LO | FT_SWEEP_LO_OPEN)
#define HI FT_SWEEP_HI
#define HI_OPEN (FT_SWEEP_HI | FT_SWEEP_HI_OPEN)

/* Integers exactly held in a double (JSON numbers, cJSON's valuedouble). */
#define EXACT_INT 9007199254740992.0 /* 2^53 */

static const char *sched_name(int v) { return ft_schedule_name(v); }
static const char *dpo_loss_name(int v) { return ft_dpo_loss_name(v); }

/* The domains are those of `ftune train` (cli/cmd_train.c's parsers) and of ft_train_run's
 * check_finite_cfg / ft_dpo_cfg_check, so a trial's value is one the train command takes;
 * narrower where the command takes a value without a meaning (a negative weight decay or
 * warmup ratio, a beta of 1 or more, a ratio of the peak LR outside [0, 1]). */
const ft_sweep_key ft_sweep_keys[] = {
    {"max_steps", "steps", {"total_steps"}, FT_SWEEP_INT, OFF(max_steps), LO, 0, 0, ">= 0 (0: --epochs)"},
    {"epochs", "ep", {"num_train_epochs", "num_epochs"}, FT_SWEEP_DBL, OFF(epochs), LO_OPEN, 0, 0, "> 0"},
    {"lr", "lr", {"learning_rate"}, FT_SWEEP_DBL, OFF(lr), LO_OPEN, 0, 0, "> 0"},
    {"schedule", "", {"lr_scheduler_type", "lr_scheduler"}, FT_SWEEP_ENUM, OFF(schedule), 0, 0, 0, NULL,
     ft_schedule_parse, sched_name, "cosine, linear, constant"},
    {"warmup_steps", "wus", {0}, FT_SWEEP_INT, OFF(warmup_steps), LO, 0, 0, ">= 0 (0: --warmup-ratio)"},
    {"warmup_ratio", "wu", {0}, FT_SWEEP_DBL, OFF(warmup_ratio), LO | HI, 0, 1, "in [0, 1]"},
    {"min_lr_ratio", "minlr", {0}, FT_SWEEP_DBL, OFF(min_lr_ratio), LO | HI, 0, 1, "in [0, 1]"},
    {"weight_decay", "wd", {0}, FT_SWEEP_DBL, OFF(weight_decay), LO, 0, 0, ">= 0"},
    {"adam_beta1", "b1", {0}, FT_SWEEP_DBL, OFF(adam_beta1), LO | HI_OPEN, 0, 1, "in [0, 1)"},
    {"adam_beta2", "b2", {0}, FT_SWEEP_DBL, OFF(adam_beta2), LO | HI_OPEN, 0, 1, "in [0, 1)"},
    {"adam_eps", "eps", {"adam_epsilon"}, FT_SWEEP_DBL, OFF(adam_eps), LO_OPEN, 0, 0, "> 0"},
    {"max_grad_norm", "clip", {"grad_clip", "gradient_clipping"}, FT_SWEEP_DBL, OFF(max_grad_norm), LO, 0, 0,
     ">= 0 (0: off)"},
    {"dpo_beta", "beta", {"beta"}, FT_SWEEP_DBL, OFF(dpo.beta), LO_OPEN, 0, 0, "> 0"},
    {"dpo_loss", "", {"loss_type", "pref_loss"}, FT_SWEEP_ENUM, OFF(dpo.loss_type), 0, 0, 0, NULL,
     ft_dpo_loss_parse, dpo_loss_name, "sigmoid, hinge, ipo, robust, orpo, simpo"},
    {"simpo_gamma", "gamma", {0}, FT_SWEEP_DBL, OFF(dpo.simpo_gamma), 0, 0, 0, "finite"},
    {"dpo_label_smoothing", "ls", {"label_smoothing"}, FT_SWEEP_DBL, OFF(dpo.label_smoothing), LO | HI_OPEN,
     0, 0.5, "in [0, 0.5)"},
    {"lora_r", "r", {"r", "rank", "lora_rank"}, FT_SWEEP_INT, OFF(lora.r), LO, 1, 0, ">= 1"},
    {"lora_alpha", "alpha", {"alpha"}, FT_SWEEP_FLOAT, OFF(lora.alpha), LO_OPEN | HI, 0, FLT_MAX, "> 0"},
    {"lora_dropout", "drop", {"dropout"}, FT_SWEEP_FLOAT, OFF(lora.dropout), LO | HI_OPEN, 0, 1, "in [0, 1)"},
    {"use_rslora", "rslora", {"rslora"}, FT_SWEEP_BOOL, OFF(lora.use_rslora)},
    {"loraplus_lr_ratio", "lp", {"loraplus_ratio"}, FT_SWEEP_DBL, OFF(loraplus_lr_ratio), LO_OPEN, 0, 0, "> 0"},
    {"neftune_noise_alpha", "neft", {"neftune_alpha"}, FT_SWEEP_DBL, OFF(neftune_noise_alpha), LO, 0, 0,
     ">= 0 (0: off)"},
    {"lora_target", "tgt", {"target_modules", "lora_target_modules", "lora_targets"}, FT_SWEEP_TARGETS,
     OFF(lora.targets)},
    {"early_stopping_patience", "pat", {0}, FT_SWEEP_INT, OFF(early_stopping_patience), LO, 0, 0, ">= 0 (0: off)"},
    {"early_stopping_threshold", "thr", {0}, FT_SWEEP_DBL, OFF(early_stopping_threshold), LO, 0, 0, ">= 0"},
    {"seed", "seed", {"random_seed"}, FT_SWEEP_U64, OFF(seed)},
};
const int ft_sweep_keys_n = (int)(sizeof ft_sweep_keys / sizeof ft_sweep_keys[0]);

/* name in the '_' form, lower case, into out[n] */
static void norm(const char *name, char *out, size_t n)
{
    size_t i = 0;
    for (; name[i] && i + 1 < n; i++)
        out[i] = name[i] == '-' ? '_' : (char)tolower((unsigned char)name[i]);
    out[i] = 0;
}

const ft_sweep_key *ft_sweep_key_find(const char *name)
{
    char n[96];
    if (strlen(name) >= sizeof n) return NULL;
    size_t i = 0;
    for (; name[i]; i++) n[i] = name[i] == '-' ? '_' : name[i];
    n[i] = 0;
    for (int k = 0; k < ft_sweep_keys_n; k++)
        if (!strcmp(ft_sweep_keys[k].name, n)) return &ft_sweep_keys[k];
    return NULL;
}

/* Levenshtein distance of a and b (each cut to 63 characters). */
static int edit_distance(const char *a, const char *b)
{
    int la = (int)strnlen(a, 63), lb = (int)strnlen(b, 63);
    int row[64];
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const ft_sweep_key *ft_sweep_key_nearest(const char *name)
{
    char n[64];
    norm(name, n, sizeof n);
    const ft_sweep_key *best = NULL;
    int best_d = 1 << 30;
    for (int k = 0; k < ft_sweep_keys_n; k++) {
        const ft_sweep_key *key = &ft_sweep_keys[k];
        for (int a = 0; a < 3 && key->also[a]; a++)
            if (!strcmp(key->also[a], n)) return key; /* another tool's name for it */
        int d = edit_distance(n, key->name);
        if (d < best_d) {
            best_d = d;
            best = key;
        }
    }
    int len = (int)strlen(n), limit = len / 3 > 2 ? len / 3 : 2;
    return best_d <= limit ? best : NULL;
}

void ft_sweep_key_unknown_msg(const char *name, char *msg, size_t n)
{
    const ft_sweep_key *near = ft_sweep_key_nearest(name);
    if (near) {
        snprintf(msg, n, "not a training option a trial can set; did you mean %s?", near->name);
        return;
    }
    size_t o = (size_t)snprintf(msg, n, "not a training option a trial can set (those are:");
    for (int k = 0; k < ft_sweep_keys_n && o < n; k++)
        o += (size_t)snprintf(msg + o, n - o, "%s %s", k ? "," : "", ft_sweep_keys[k].name);
    if (o < n)
        snprintf(msg + o, n - o, "; options of the whole pass, such as seq_len, go on the command line)");
}

/* --- numbers in short form --------------------------------------------------------- */

/* The shortest decimal digits of x (finite, != 0) that read back to x: digits (no sign, no
 * point, no trailing zeros) into d[20] and the decimal exponent of the first one. */
static void shortest_digits(double x, char d[20], int *e10)
{
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, fabs(x));
        if (strtod(buf, NULL) == fabs(x)) break;
    }
    /* buf: D[.DDD]e[+-]XX */
    int n = 0;
    const char *s = buf;
    for (; *s && *s != 'e'; s++)
        if (isdigit((unsigned char)*s)) d[n++] = *s;
    while (n > 1 && d[n - 1] == '0') n--;
    d[n] = 0;
    *e10 = atoi(s + 1);
}

/* x in its shortest form: the shorter of fixed ("0.05", "16") and exponent ("2e-4"), the
 * fixed one when equal. */
static int fmt_num(double x, char *buf, size_t n)
{
    if (x == 0) return snprintf(buf, n, "0");
    if (!isfinite(x)) return snprintf(buf, n, "%g", x);
    char d[20], fx[400], ex[48];
    int e;
    shortest_digits(x, d, &e);
    int nd = (int)strlen(d), o = 0;
    if (e >= 0 && nd <= e + 1) { /* an integer: the digits, then zeros */
        memcpy(fx, d, (size_t)nd);
        memset(fx + nd, '0', (size_t)(e + 1 - nd));
        o = e + 1;
    } else if (e >= 0) {         /* a point inside the digits */
        memcpy(fx, d, (size_t)e + 1);
        fx[e + 1] = '.';
        memcpy(fx + e + 2, d + e + 1, (size_t)(nd - e - 1));
        o = nd + 1;
    } else {                     /* 0.000DDD */
        memcpy(fx, "0.", 2);
        memset(fx + 2, '0', (size_t)(-e - 1));
        memcpy(fx + 1 - e, d, (size_t)nd);
        o = 1 - e + nd;
    }
    fx[o] = 0;
    int m = nd > 1 ? snprintf(ex, sizeof ex, "%c.%se%d", d[0], d + 1, e)
                   : snprintf(ex, sizeof ex, "%ce%d", d[0], e);
    return snprintf(buf, n, "%s%s", x < 0 ? "-" : "", m < o ? ex : fx);
}

/* --- domains ------------------------------------------------------------------------- */

static int out_of_domain(const ft_sweep_key *k, const char *text)
{
    return ft_err(FT_E_INVALID, "%s is outside the option's domain (%s)", text,
                  k->dom_text ? k->dom_text : "any");
}

/* x within the key's lo/hi bounds (and a float's range); text: x as the user wrote it */
static int in_domain(const ft_sweep_key *k, double x, const char *text)
{
    if (!isfinite(x)) return out_of_domain(k, text);
    if (k->type == FT_SWEEP_FLOAT && fabs(x) > FLT_MAX) return out_of_domain(k, text);
    if ((k->dom & FT_SWEEP_LO) && ((k->dom & FT_SWEEP_LO_OPEN) ? !(x > k->lo) : !(x >= k->lo)))
        return out_of_domain(k, text);
    if ((k->dom & FT_SWEEP_HI) && ((k->dom & FT_SWEEP_HI_OPEN) ? !(x < k->hi) : !(x <= k->hi)))
        return out_of_domain(k, text);
    return 0;
}

int ft_sweep_key_check_num(const ft_sweep_key *k, double x)
{
    char t[64];
    fmt_num(x, t, sizeof t);
    if (k->type == FT_SWEEP_INT || k->type == FT_SWEEP_U64) {
        if (!isfinite(x) || x != floor(x) || fabs(x) > EXACT_INT || (k->type == FT_SWEEP_U64 && x < 0))
            return ft_err(FT_E_INVALID, "%s is not an integer%s%s", t,
                          k->type == FT_SWEEP_U64 ? " >= 0" : "",
                          isfinite(x) && x == floor(x) ? " of magnitude <= 2^53" : "");
    } else if (k->type != FT_SWEEP_DBL && k->type != FT_SWEEP_FLOAT) {
        return ft_err(FT_E_INVALID, "the option takes %s, not a number",
                      k->type == FT_SWEEP_BOOL ? "true or false" : "names");
    }
    return in_domain(k, x, t);
}

int ft_sweep_key_check(const ft_sweep_key *k, ft_sweep_val v)
{
    switch (k->type) {
    case FT_SWEEP_INT: {
        char t[32];
        snprintf(t, sizeof t, "%lld", (long long)v.i);
        return in_domain(k, (double)v.i, t);
    }
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT: return ft_sweep_key_check_num(k, v.d);
    case FT_SWEEP_BOOL:
        return v.i == 0 || v.i == 1 ? 0 : ft_err(FT_E_INVALID, "%lld is not a boolean", (long long)v.i);
    case FT_SWEEP_ENUM:
        return v.i >= 0 && v.i < 1024 && k->parse(k->enum_name((int)v.i)) == v.i
                   ? 0 : ft_err(FT_E_INVALID, "%lld is not one of %s", (long long)v.i, k->choices);
    case FT_SWEEP_TARGETS:
        return v.u && !(v.u & ~(uint64_t)FT_LORA_ALL_TARGETS)
                   ? 0 : ft_err(FT_E_INVALID, "0x%llx is not a set of target modules",
                                (unsigned long long)v.u);
    default: return 0; /* FT_SWEEP_U64: every value */
    }
}

/* --- parsing ------------------------------------------------------------------------- */

static int expected(const ft_sweep_key *k, const char *what, const char *s)
{
    return ft_err(FT_E_INVALID, "expected %s, got '%s'", what, s);
}

static int parse_targets(const ft_sweep_key *k, const char *s, char sep, ft_sweep_val *v)
{
    char buf[256];
    if (strlen(s) >= sizeof buf) return expected(k, "module names", s);
    size_t i = 0;
    for (; s[i]; i++) buf[i] = s[i] == sep ? ',' : s[i];
    buf[i] = 0;
    unsigned mask;
    if (sep != ',' && strchr(s, ',')) /* a ',' inside a --grid value cannot reach here */
        return expected(k, "module names joined by '+'", s);
    if (ft_lora_parse_targets(buf, &mask) < 0) return FT_E_INVALID; /* its message names the module */
    v->u = mask;
    return 0;
}

int ft_sweep_key_parse(const ft_sweep_key *k, const char *s, ft_sweep_val *v)
{
    char *end;
    errno = 0;
    switch (k->type) {
    case FT_SWEEP_INT: {
        long long x = strtoll(s, &end, 10);
        if (errno || end == s || *end) return expected(k, "an integer", s);
        v->i = x;
        return ft_sweep_key_check(k, *v);
    }
    case FT_SWEEP_U64: {
        if (!isdigit((unsigned char)*s)) return expected(k, "an integer >= 0", s);
        unsigned long long x = strtoull(s, &end, 10);
        if (errno || *end) return expected(k, "an integer >= 0 below 2^64", s);
        v->u = x;
        return 0;
    }
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT: {
        double x = strtod(s, &end);
        if (errno == ERANGE && fabs(x) > 1) return out_of_domain(k, s);
        if (end == s || *end || isnan(x) || isinf(x)) return expected(k, "a number", s);
        v->d = x;
        return ft_sweep_key_check(k, *v);
    }
    case FT_SWEEP_BOOL:
        if (!strcmp(s, "true") || !strcmp(s, "1")) v->i = 1;
        else if (!strcmp(s, "false") || !strcmp(s, "0")) v->i = 0;
        else return expected(k, "true or false", s);
        return 0;
    case FT_SWEEP_ENUM: {
        int e = k->parse(s);
        if (e < 0) return ft_err(FT_E_INVALID, "expected one of %s, got '%s'", k->choices, s);
        v->i = e;
        return 0;
    }
    case FT_SWEEP_TARGETS:
        return parse_targets(k, s, '+', v);
    }
    return ft_err(FT_E_INVALID, "unknown option type %d", k->type);
}

static int found(const ft_sweep_key *k, const char *what, const cJSON *j)
{
    return ft_err(FT_E_INVALID, "expected %s, found %s", what, ft_json_type(j));
}

int ft_sweep_key_from_json(const ft_sweep_key *k, const cJSON *j, ft_sweep_val *v)
{
    switch (k->type) {
    case FT_SWEEP_INT:
        if (!cJSON_IsNumber(j)) return found(k, "an integer", j);
        FT_TRY(ft_sweep_key_check_num(k, j->valuedouble));
        v->i = (int64_t)j->valuedouble;
        return 0;
    case FT_SWEEP_U64:
        if (cJSON_IsString(j)) return ft_sweep_key_parse(k, j->valuestring, v);
        if (!cJSON_IsNumber(j)) return found(k, "an integer >= 0", j);
        FT_TRY(ft_sweep_key_check_num(k, j->valuedouble));
        v->u = (uint64_t)j->valuedouble;
        return 0;
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT:
        if (!cJSON_IsNumber(j)) return found(k, "a number", j);
        v->d = j->valuedouble;
        return ft_sweep_key_check(k, *v);
    case FT_SWEEP_BOOL:
        if (!cJSON_IsBool(j)) return found(k, "true or false", j);
        v->i = cJSON_IsTrue(j);
        return 0;
    case FT_SWEEP_ENUM:
        if (!cJSON_IsString(j)) return found(k, "a name", j);
        return ft_sweep_key_parse(k, j->valuestring, v);
    case FT_SWEEP_TARGETS:
        if (cJSON_IsString(j)) return parse_targets(k, j->valuestring, ',', v);
        if (cJSON_IsArray(j)) {
            unsigned mask = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, j) {
                if (!cJSON_IsString(e)) return found(k, "a list of module names", e);
                ft_sweep_val one;
                if (strchr(e->valuestring, ',')) return expected(k, "one module name per list item", e->valuestring);
                FT_TRY(parse_targets(k, e->valuestring, ',', &one));
                mask |= (unsigned)one.u;
            }
            if (!mask) return ft_err(FT_E_INVALID, "expected module names, found an empty list");
            v->u = mask;
            return 0;
        }
        return found(k, "module names (a string or a list)", j);
    }
    return ft_err(FT_E_INVALID, "unknown option type %d", k->type);
}

int ft_sweep_val_equal(const ft_sweep_key *k, ft_sweep_val a, ft_sweep_val b)
{
    switch (k->type) {
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT: return a.d == b.d;
    case FT_SWEEP_U64:
    case FT_SWEEP_TARGETS: return a.u == b.u;
    default: return a.i == b.i;
    }
}

/* --- formatting ---------------------------------------------------------------------- */

/* The modules of mask in enum ft_proj order joined by sep, their short names ("q") or HF
 * names ("q_proj"); the whole set as "all" / "all-linear". Returns the length as snprintf. */
static int fmt_targets(uint64_t mask, char sep, int short_names, char *buf, size_t n)
{
    if (mask == FT_LORA_ALL_TARGETS) return snprintf(buf, n, short_names ? "all" : "all-linear");
    char t[160];
    size_t o = 0;
    for (int p = 0; p < FT_N_PROJ; p++) {
        if (!(mask & (1u << p))) continue;
        const char *name = ft_proj_name[p];
        size_t len = strlen(name) - (short_names ? 5 : 0); /* less "_proj" */
        if (o) t[o++] = sep;
        memcpy(t + o, name, len);
        o += len;
    }
    t[o] = 0;
    return snprintf(buf, n, "%s", t);
}

int ft_sweep_key_format(const ft_sweep_key *k, ft_sweep_val v, char *buf, size_t n)
{
    int len;
    switch (k->type) {
    case FT_SWEEP_INT: len = snprintf(buf, n, "%lld", (long long)v.i); break;
    case FT_SWEEP_U64: len = snprintf(buf, n, "%llu", (unsigned long long)v.u); break;
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT: len = fmt_num(v.d, buf, n); break;
    case FT_SWEEP_BOOL: len = snprintf(buf, n, "%s%s", v.i ? "" : "no", k->tag); break;
    case FT_SWEEP_ENUM: len = snprintf(buf, n, "%s", k->enum_name((int)v.i)); break;
    case FT_SWEEP_TARGETS: len = fmt_targets(v.u, '-', 1, buf, n); break;
    default: len = snprintf(buf, n, "?");
    }
    return n && len >= (int)n ? (int)n - 1 : len;
}

int ft_sweep_key_text(const ft_sweep_key *k, ft_sweep_val v, char *buf, size_t n)
{
    switch (k->type) {
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT: return fmt_num(v.d, buf, n);
    case FT_SWEEP_BOOL: return snprintf(buf, n, "%s", v.i ? "true" : "false");
    case FT_SWEEP_TARGETS: return fmt_targets(v.u, ',', 0, buf, n);
    default: return ft_sweep_key_format(k, v, buf, n);
    }
}

int ft_sweep_num_text(double x, char *buf, size_t n)
{
    if (!isfinite(x)) return snprintf(buf, n, "null");
    return fmt_num(x, buf, n);
}

cJSON *ft_sweep_key_to_json(const ft_sweep_key *k, ft_sweep_val v)
{
    /* numbers as raw text: cJSON prints 15 digits where they are within a few ulps of the
     * double, and a value read back must be the value written */
    char buf[400];
    switch (k->type) {
    case FT_SWEEP_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v.i);
        return cJSON_CreateRaw(buf);
    case FT_SWEEP_U64:
        snprintf(buf, sizeof buf, v.u <= (uint64_t)EXACT_INT ? "%llu" : "\"%llu\"", (unsigned long long)v.u);
        return cJSON_CreateRaw(buf);
    case FT_SWEEP_DBL:
    case FT_SWEEP_FLOAT:
        ft_sweep_num_text(v.d, buf, sizeof buf);
        return cJSON_CreateRaw(buf);
    case FT_SWEEP_BOOL: return cJSON_CreateBool(v.i != 0);
    case FT_SWEEP_ENUM: return cJSON_CreateString(k->enum_name((int)v.i));
    case FT_SWEEP_TARGETS:
        fmt_targets(v.u, ',', 0, buf, sizeof buf);
        return cJSON_CreateString(buf);
    }
    return NULL;
}

/* --- ft_train_cfg -------------------------------------------------------------------- */

void ft_sweep_key_apply(const ft_sweep_key *k, ft_sweep_val v, ft_train_cfg *c)
{
    char *f = (char *)c + k->off;
    switch (k->type) {
    case FT_SWEEP_INT: *(int64_t *)f = v.i; break;
    case FT_SWEEP_U64: *(uint64_t *)f = v.u; break;
    case FT_SWEEP_DBL: *(double *)f = v.d; break;
    case FT_SWEEP_FLOAT: *(float *)f = (float)v.d; break;
    case FT_SWEEP_BOOL:
    case FT_SWEEP_ENUM: *(int *)f = (int)v.i; break;
    case FT_SWEEP_TARGETS: *(unsigned *)f = (unsigned)v.u; break;
    }
}

void ft_sweep_key_get(const ft_sweep_key *k, const ft_train_cfg *c, ft_sweep_val *v)
{
    const char *f = (const char *)c + k->off;
    switch (k->type) {
    case FT_SWEEP_INT: v->i = *(const int64_t *)f; break;
    case FT_SWEEP_U64: v->u = *(const uint64_t *)f; break;
    case FT_SWEEP_DBL: v->d = *(const double *)f; break;
    case FT_SWEEP_FLOAT: v->d = *(const float *)f; break;
    case FT_SWEEP_BOOL:
    case FT_SWEEP_ENUM: v->i = *(const int *)f; break;
    case FT_SWEEP_TARGETS: v->u = *(const unsigned *)f; break;
    }
}
