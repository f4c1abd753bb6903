/* args.c - flag and config-file parsing (see args.h). */
#include "cli/args.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"
#include "src/infer/generate.h"
#include "src/infer/gen_prompt.h"

/* ---- the domain of every numeric option ------------------------------------------------- */

#define D_LO_OPEN 1u /* lo itself is outside */
#define D_HI_OPEN 2u /* hi itself is outside */
#define D_LIB     4u /* refused by the library (src/train/validate.c, exit 1), not here: the
                      * early-stopping flags, whose exit 1 is test_early_stop.py's contract */
#define D_BIG 9007199254740991.0 /* 2^53 - 1: integers exact in a double (and in JSON) */

/* Every FT_OPT_INT, FT_OPT_DBL and FT_OPT_FLOAT option of every command, by name (one name,
 * one meaning: the same domain wherever a flag appears). A value given (flag or --config) is
 * refused unless it is finite and within [lo, hi] (bounds open where flagged); a default is
 * not checked (0 may mean "the default" in a command's variable, e.g. --seq-len: giving 0 is
 * refused rather than silently taken as the default). The bounds follow torch, PEFT,
 * transformers and vLLM where they have one (AdamW: 0 <= beta < 1, weight_decay >= 0; an eps
 * of 0 divides by zero where a second moment is 0, so it must be > 0 here); the upper bounds
 * of counts keep their products far from int64 overflow. ft_args_parse refuses a table whose
 * numeric option has no entry (an internal error that any run of the command, --help
 * included, reports), so no option escapes. */
static const struct opt_domain {
    const char *name;
    double lo, hi;
    unsigned flags;
    const char *text;  /* "expected ..." */
} g_domains[] = {
    /* train, plan, eval */
    {"seq-len", 2, 1073741824.0, 0, "an integer 2..1073741824 (tokens per row; leave it out for the default)"},
    {"batch-size", 1, 1048576.0, 0, "an integer 1..1048576"},
    {"max-steps", 1, D_BIG, 0, "an integer >= 1 (leave it out to train --epochs)"},
    {"epochs", 0, 1e6, D_LO_OPEN, "a number > 0 and <= 1e6"},
    {"lr", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0"},
    {"bus-gbps", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0 (GB/s)"},
    {"warmup-steps", 0, D_BIG, 0, "an integer >= 0"},
    {"warmup-ratio", 0, 1, 0, "a number 0..1 (a fraction of the steps)"},
    {"min-lr-ratio", 0, 1, 0, "a number 0..1 (a fraction of --lr)"},
    {"weight-decay", 0, INFINITY, D_HI_OPEN, "a finite number >= 0 (as torch's AdamW)"},
    {"adam-beta1", 0, 1, D_HI_OPEN, "a number 0 <= X < 1 (as torch's AdamW)"},
    {"adam-beta2", 0, 1, D_HI_OPEN, "a number 0 <= X < 1 (as torch's AdamW)"},
    {"adam-eps", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0 (AdamW divides by sqrt(v) + eps, and v is 0 wherever a gradient is 0)"},
    {"max-grad-norm", 0, INFINITY, D_HI_OPEN, "a finite number >= 0 (0: no clipping)"},
    {"simpo-gamma", -INFINITY, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number"},
    {"dpo-beta", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0"},
    {"dpo-label-smoothing", 0, 0.5, D_HI_OPEN, "a number 0 <= X < 0.5"},
    {"lora-r", 1, 4096, 0, "an integer 1..4096"},
    {"lora-alpha", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0 (the adapter is scaled by alpha / r)"},
    {"eval-fraction", 0, 0.5, 0, "a number 0..0.5"},
    {"eval-max", 0, D_BIG, 0, "an integer >= 0 (0: no cap)"},
    {"eval-every", 0, D_BIG, 0, "an integer >= 0 (0: at the start and the end only)"},
    {"eval-max-new-tokens", 1, FT_GEN_MAX_NEW_TOKENS, 0, "an integer 1..1000000"},
    {"early-stopping-patience", 0, D_BIG, D_LIB, "an integer >= 0 (0: off)"},
    {"early-stopping-threshold", 0, INFINITY, D_HI_OPEN | D_LIB, "a finite number >= 0"},
    {"save-every", 0, D_BIG, 0, "an integer >= 0 (0: only at the end)"},
    {"keep", 0, D_BIG, 0, "an integer >= 0 (0: all)"},
    {"max-bad-steps", 1, D_BIG, 0, "an integer >= 1"},
    {"quant-correction-tokens", 1, D_BIG, 0, "an integer >= 1"},
    {"log-every", 1, D_BIG, 0, "an integer >= 1 (leave it out for about 50 lines a run)"},
    {"threads", 1, 4096, 0, "an integer 1..4096 (leave it out for all cores)"},
    /* generate */
    {"ctx-size", 1, 1073741824.0, 0, "an integer 1..1073741824 (leave it out for the default)"},
    {"max-new-tokens", 1, FT_GEN_MAX_NEW_TOKENS, 0, "an integer 1..1000000"},
    {"temperature", 0, INFINITY, D_HI_OPEN, "a finite number >= 0 (0: greedy)"},
    {"top-k", 0, D_BIG, 0, "an integer >= 0 (0: off)"},
    {"top-p", 0, 1, D_LO_OPEN, "a number 0 < X <= 1 (1: off)"},
    {"min-p", 0, 1, 0, "a number 0..1 (0: off)"},
    {"repetition-penalty", 0, INFINITY, D_LO_OPEN | D_HI_OPEN, "a finite number > 0 (1: off)"},
    {"batch", 1, FT_GEN_MAX_SEQS, 0, "an integer 1..256 (leave it out for the default)"},
    {"seed", 0, D_BIG, 0, "an integer 0..9007199254740991 (2^53 - 1: exact in the JSON output)"},
    /* init-model (--shard-size in MB; merge's is a size, parsed by its own function) */
    {"shard-size", 1, 1e12, 0, "an integer >= 1 (MB)"},
    /* bench io --stream */
    {"steps", 1, 100000, 0, "1..100000"},
    {"stage", 1, 8, 0, "1..8"},
    {"slots", 2, 8, 0, "2..8"},
    {"compute-ms", 0, INFINITY, D_HI_OPEN, "a finite number >= 0 (ms)"},
};

static const struct opt_domain *domain_of(const char *name)
{
    for (size_t i = 0; i < sizeof g_domains / sizeof g_domains[0]; i++)
        if (!strcmp(g_domains[i].name, name)) return &g_domains[i];
    return NULL;
}

static int is_numeric(const ft_opt *o)
{
    return o->type == FT_OPT_INT || o->type == FT_OPT_DBL || o->type == FT_OPT_FLOAT;
}

/* x (as the option will hold it) within o's domain: 0, or -1 with the message in err. */
static int check_domain(const ft_opt *o, double x, const char *val, const char *where, char *err,
                        size_t n)
{
    const struct opt_domain *d = domain_of(o->name);
    if (!d) { /* ft_args_parse checks the table first: not reached */
        snprintf(err, n, "internal error: option --%s has no domain in cli/args.c", o->name);
        return -1;
    }
    if (d->flags & D_LIB) return 0;
    int ok = isfinite(x) && ((d->flags & D_LO_OPEN) ? x > d->lo : x >= d->lo) &&
             ((d->flags & D_HI_OPEN) ? x < d->hi : x <= d->hi);
    if (ok) return 0;
    snprintf(err, n, "%s--%s %s: expected %s", where, o->name, val, d->text);
    return -1;
}

static const ft_opt *find(const ft_opt *opts, const char *name)
{
    char norm[128];
    size_t i = 0;
    for (; name[i] && i < sizeof norm - 1; i++)
        norm[i] = name[i] == '_' ? '-' : name[i];
    norm[i] = 0;
    for (const ft_opt *o = opts; o->name; o++)
        if (!strcmp(o->name, norm)) return o;
    return NULL;
}

void ft_str_list_free(ft_str_list *l)
{
    if (!l) return;
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Appends val; the first value from the command line (where == "") drops the config's. */
static int list_add(ft_str_list *l, const char *val, const char *where, const char *name,
                    char *err, size_t n)
{
    if (!*val) {
        snprintf(err, n, "%s--%s: expected a value, got ''", where, name);
        return -1;
    }
    if (!*where && !l->from_cli) {
        l->n = 0;
        l->from_cli = 1;
    }
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 4;
        const char **p = realloc(l->v, (size_t)cap * sizeof *p);
        if (!p) {
            snprintf(err, n, "%s--%s: out of memory", where, name);
            return -1;
        }
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = val;
    return 0;
}

static int set(const ft_opt *o, const char *val, const char *where, char *err, size_t n)
{
    char *end;
    switch (o->type) {
    case FT_OPT_STR:
        *(const char **)o->dst = val;
        return 0;
    case FT_OPT_LIST:
        return list_add(o->dst, val, where, o->name, err, n);
    case FT_OPT_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end) {
            snprintf(err, n, "%s--%s: expected an integer, got '%s'", where, o->name, val);
            return -1;
        }
        if (check_domain(o, (double)v, val, where, err, n) < 0) return -1;
        *(int64_t *)o->dst = v;
        return 0;
    }
    case FT_OPT_DBL:
    case FT_OPT_FLOAT: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end) {
            snprintf(err, n, "%s--%s: expected a number, got '%s'", where, o->name, val);
            return -1;
        }
        if (o->type == FT_OPT_FLOAT && isfinite(v) && fabs(v) > FLT_MAX) { /* (float)v: undefined */
            snprintf(err, n, "%s--%s: %s is out of range (at most %g in magnitude)", where, o->name,
                     val, (double)FLT_MAX);
            return -1;
        }
        /* the domain of the value the option holds: a float may round a tiny X to 0 */
        if (check_domain(o, o->type == FT_OPT_FLOAT ? (double)(float)v : v, val, where, err, n) < 0)
            return -1;
        if (o->type == FT_OPT_DBL) *(double *)o->dst = v;
        else *(float *)o->dst = (float)v;
        return 0;
    }
    case FT_OPT_FLAG:
        if (!strcmp(val, "1") || !strcmp(val, "true")) *(int *)o->dst = 1;
        else if (!strcmp(val, "0") || !strcmp(val, "false")) *(int *)o->dst = 0;
        else {
            snprintf(err, n, "%s--%s: expected true or false, got '%s'", where, o->name, val);
            return -1;
        }
        return 0;
    case FT_OPT_FN: {
        char e2[256] = "";
        if (o->fn(val, o->dst, e2, sizeof e2) < 0) {
            snprintf(err, n, "%s--%s: %s", where, o->name, e2);
            return -1;
        }
        return 0;
    }
    }
    return -1;
}

/* Config values are kept alive for the process (strings point into them). */
static cJSON *g_config;

static int load_config(const ft_opt *opts, const char *path, char *err, size_t n)
{
    char *txt;
    size_t len;
    if (ft_read_file(path, &txt, &len) < 0) {
        snprintf(err, n, "--config: %s", ft_errmsg());
        return -1;
    }
    const char *ep = NULL;
    unsigned long oom = ft_json_oom_mark();
    cJSON *o = cJSON_ParseWithLengthOpts(txt, len, &ep, 0);
    if (!o && ft_json_oom_since(oom)) {
        snprintf(err, n, "%s: out of memory while parsing it", path);
        free(txt);
        return -1;
    }
    if (!o || !cJSON_IsObject(o)) {
        long off = ep ? (long)(ep - txt) : 0;
        snprintf(err, n, "%s: offset %ld: expected a JSON object of options", path, off);
        free(txt);
        cJSON_Delete(o);
        return -1;
    }
    size_t nul = ft_json_find_nul(txt, len);
    free(txt);
    if (nul < len) { /* a path or a name would be read cut (src/core/json.h) */
        snprintf(err, n, "%s: offset %zu: %s", path, nul, FT_JSON_NUL_WHY);
        cJSON_Delete(o);
        return -1;
    }
    char where[512];
    snprintf(where, sizeof where, "%s: ", path);
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const ft_opt *opt = find(opts, it->string);
        if (!opt || !strcmp(it->string, "config")) {
            snprintf(err, n, "%s: unknown key \"%s\"", path, it->string);
            cJSON_Delete(o);
            return -1;
        }
        if (cJSON_IsArray(it) && opt->type == FT_OPT_LIST) { /* each string, in order */
            const cJSON *e;
            cJSON_ArrayForEach(e, it) {
                if (!cJSON_IsString(e)) {
                    snprintf(err, n, "%s: key \"%s\": expected a string or a list of strings",
                             path, it->string);
                    cJSON_Delete(o);
                    return -1;
                }
                if (set(opt, e->valuestring, where, err, n) < 0) {
                    cJSON_Delete(o);
                    return -1;
                }
            }
            continue;
        }
        char buf[64];
        const char *val = buf;
        if (!cJSON_IsString(it) && (opt->type == FT_OPT_STR || opt->type == FT_OPT_LIST)) {
            snprintf(err, n, "%s: key \"%s\": expected a string%s, found %s", path, it->string,
                     opt->type == FT_OPT_LIST ? " or a list of strings" : "", ft_json_type(it));
            cJSON_Delete(o);
            return -1;
        }
        if (cJSON_IsNumber(it) && opt->type == FT_OPT_INT &&
            !(fabs(it->valuedouble) < 9.3e18 && it->valuedouble == floor(it->valuedouble))) {
            snprintf(err, n, "%s: key \"%s\": expected an integer, found %.17g", path, it->string,
                     it->valuedouble); /* "%.0f" would round 8.7 to 9 */
            cJSON_Delete(o);
            return -1;
        }
        if (cJSON_IsString(it)) val = it->valuestring;
        else if (cJSON_IsBool(it)) val = cJSON_IsTrue(it) ? "true" : "false";
        else if (cJSON_IsNumber(it)) {
            if (opt->type == FT_OPT_INT) snprintf(buf, sizeof buf, "%.0f", it->valuedouble);
            else snprintf(buf, sizeof buf, "%.17g", it->valuedouble);
        } else {
            snprintf(err, n, "%s: key \"%s\": expected a string, number or boolean", path, it->string);
            cJSON_Delete(o);
            return -1;
        }
        if (set(opt, val, where, err, n) < 0) {
            cJSON_Delete(o);
            return -1;
        }
    }
    cJSON_Delete(g_config);
    g_config = o;
    return 0;
}

int ft_args_parse(const ft_opt *opts, int argc, char **argv, char *err, size_t n)
{
    for (const ft_opt *o = opts; o->name; o++)
        if (is_numeric(o) && !domain_of(o->name)) {
            snprintf(err, n, "internal error: option --%s has no domain in cli/args.c "
                     "(g_domains)", o->name);
            return -1;
        }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            ft_args_usage(stdout, opts);
            return 1;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                snprintf(err, n, "--config needs a file");
                return -1;
            }
            if (load_config(opts, argv[i + 1], err, n) < 0) return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) {
            snprintf(err, n, "unexpected argument '%s'", a);
            return -1;
        }
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq ? eq - name : (long)strlen(name)), name);
        const ft_opt *o = find(opts, key);
        if (!o) {
            snprintf(err, n, "unknown option '--%s' (see --help)", key);
            return -1;
        }
        const char *val;
        if (eq) val = eq + 1;
        else if (o->type == FT_OPT_FLAG) val = "true";
        else if (i + 1 < argc) val = argv[++i];
        else {
            snprintf(err, n, "--%s needs a value", o->name);
            return -1;
        }
        if (set(o, val, "", err, n) < 0) return -1;
    }
    return 0;
}

void ft_args_usage(FILE *f, const ft_opt *opts)
{
    ft_args_usage_table(f, opts);
    fprintf(f, "  %-28s %s\n", "--config FILE", "JSON object of options (keys as above, '-' or '_'); flags override it");
}

void ft_args_usage_table(FILE *f, const ft_opt *opts)
{
    for (const ft_opt *o = opts; o->name; o++) {
        char left[64];
        const char *mv = o->metavar ? o->metavar
                         : o->type == FT_OPT_INT ? "N"
                         : (o->type == FT_OPT_DBL || o->type == FT_OPT_FLOAT) ? "X"
                         : o->type == FT_OPT_FLAG ? "" : "S";
        snprintf(left, sizeof left, "--%s%s%s", o->name, *mv ? " " : "", mv);
        fprintf(f, "  %-28s %s\n", left, o->help);
    }
}

int ft_opt_bytes(const char *v, void *dst, char *err, size_t n)
{
    static const struct { const char *suffix; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"M", 1048576.0}, {"MiB", 1048576.0},
        {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
    };
    char *end;
    double x = strtod(v, &end);
    if (end == v) {
        snprintf(err, n, "bad size '%s' (e.g. 24G, 512M, 24GB)", v);
        return -1;
    }
    while (*end == ' ') end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(end, units[i].suffix)) {
            double b = x * units[i].mul;
            if (!(b >= 1) || b > 9e18) {
                snprintf(err, n, "size '%s' out of range", v);
                return -1;
            }
            *(int64_t *)dst = (int64_t)b;
            return 0;
        }
    snprintf(err, n, "bad size '%s' (e.g. 24G, 512M, 24GB)", v);
    return -1;
}

int ft_args_cmd(const ft_opt *opts, int argc, char **argv, const char *cmd)
{
    char err[1024];
    int rc = ft_args_parse(opts, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc < 0) {
        fprintf(stderr, "ftune: %s%s%s\n", cmd ? cmd : "", cmd ? ": " : "", err);
        return 2;
    }
    return -1;
}
