/* tok_json.c - ft_tok_load_dir: DIR/tokenizer.json (huggingface/tokenizers serialization,
 * formats.md 6.1-6.4) and the optional DIR/tokenizer_config.json (transformers: bos_token,
 * eos_token, add_bos_token, add_eos_token, chat_template).
 *
 * tokenizer_config.json's add_bos_token / add_eos_token, when present, adjust the
 * post-processor as transformers' LlamaTokenizerFast.update_post_processor does: false
 * removes that token from the template, true adds it when the template lacks it. When the
 * keys are absent the template is used as written (what tokenizers.Tokenizer does).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"
#include "src/tokenizer/tok_internal.h"

#define WHERE_N 1200

/* snprintf for error-location strings; truncation of very long paths is acceptable. */
static void where_fmt(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

static const cJSON *jget(const cJSON *o, const char *k)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

/* The first flag of another JSON type than a boolean (or null) met while loading one file:
 * huggingface/tokenizers (serde) refuses such a file, where taking the default ("byte_fallback":
 * "true" read as false) would tokenize otherwise; load_tokenizer_json refuses it by key. */
static _Thread_local const char *g_bad_flag;
static _Thread_local const cJSON *g_bad_flag_v;

static int jbool(const cJSON *o, const char *k, int def)
{
    const cJSON *v = jget(o, k);
    if (v && !cJSON_IsBool(v) && !cJSON_IsNull(v) && !g_bad_flag) {
        g_bad_flag = k;
        g_bad_flag_v = v;
    }
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jint(const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= -1e15 && d <= 1e15) || d != (double)(int64_t)d) return 0; /* range first: the cast of a larger d is undefined */
    *out = (int64_t)d;
    return 1;
}

static const char *type_of(const cJSON *o)
{
    const char *t = jstr(o, "type");
    return t ? t : "(none)";
}

/* {"String": s} or {"Regex": r}; *is_regex tells which. */
static int pattern_of(const cJSON *o, const char **pat, int *is_regex, const char *where)
{
    const cJSON *p = jget(o, "pattern");
    const char *s = jstr(p, "String"), *r = jstr(p, "Regex");
    if (!s && !r) {
        ft_err(FT_E_INVALID, "%s: expected \"pattern\": {\"String\": ...} or {\"Regex\": ...}", where);
        return FT_E_INVALID;
    }
    *pat = s ? s : r;
    *is_regex = s == NULL;
    return 0;
}

static int dup_into(ft_tokenizer *t, char **dst, size_t *n, const char *s)
{
    *n = strlen(s);
    *dst = tk_arena_dup(&t->arena, s, *n);
    return *dst ? 0 : -ENOMEM;
}

/* A one-character string (Metaspace replacement, Strip content) as a code point. */
static int one_char(const char *s, int32_t *cp, const char *where, const char *key)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || (size_t)tk_u8dec((const unsigned char *)s, n, cp) != n || *cp < 0) {
        ft_err(FT_E_INVALID, "%s: \"%s\" must be exactly one character, found '%s'", where, key,
               s ? s : "(missing)");
        return FT_E_INVALID;
    }
    return 0;
}

static int prepend_scheme_of(const cJSON *o, int *scheme, const char *where)
{
    const char *s = jstr(o, "prepend_scheme");
    *scheme = TK_PREPEND_ALWAYS;
    if (s && !strcmp(s, "first")) *scheme = TK_PREPEND_FIRST;
    else if (s && !strcmp(s, "never")) *scheme = TK_PREPEND_NEVER;
    else if (s && strcmp(s, "always"))
        return ft_err(FT_E_INVALID, "%s: prepend_scheme '%s' (expected always, first or never)", where, s);
    if (!s && !jbool(o, "add_prefix_space", 1)) *scheme = TK_PREPEND_NEVER; /* legacy field */
    return 0;
}

/* ---- model ---------------------------------------------------------------------------------- */

static int load_model(ft_tokenizer *t, const cJSON *m, const char *path)
{
    char where[WHERE_N];
    if (!cJSON_IsObject(m)) return ft_err(FT_E_INVALID, "%s: missing \"model\" object", path);
    const char *type = jstr(m, "type");
    const cJSON *vocab = jget(m, "vocab"), *merges = jget(m, "merges");
    if (type && strcmp(type, "BPE"))
        return ft_err(FT_E_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", path, type);
    if (!type && !merges)
        return ft_err(FT_E_UNSUPPORTED, "%s: model has no \"type\" and no \"merges\" (only BPE is supported)", path);
    if (!cJSON_IsObject(vocab))
        return ft_err(FT_E_INVALID, "%s: model.vocab: expected an object of token -> id", path);
    if (!cJSON_IsArray(merges))
        return ft_err(FT_E_INVALID, "%s: model.merges: expected an array", path);
    const char *pre = jstr(m, "continuing_subword_prefix"), *suf = jstr(m, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return ft_err(FT_E_UNSUPPORTED, "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported", path);
    t->model = TK_MODEL_BPE;
    t->fuse_unk = jbool(m, "fuse_unk", 0);
    t->byte_fallback = jbool(m, "byte_fallback", 0);
    t->ignore_merges = jbool(m, "ignore_merges", 0);

    FT_TRY(tk_vocab_init(t, cJSON_GetArraySize(vocab)));
    where_fmt(where, sizeof where, "%s: model.vocab", path);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int64_t id;
        if (!jint(e, &id))
            return ft_err(FT_E_INVALID, "%s: token '%s': expected an integer id", where, e->string);
        FT_TRY(tk_vocab_add(t, e->string, strlen(e->string), id, where));
    }
    FT_TRY(tk_pairmap_init(&t->merges, cJSON_GetArraySize(merges)));
    where_fmt(where, sizeof where, "%s: model.merges", path);
    uint32_t rank = 0;
    int64_t idx = 0;
    for (const cJSON *e = merges->child; e; e = e->next, idx++) {
        const char *a = NULL, *b = NULL;
        size_t an = 0, bn = 0;
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!strncmp(s, "#version", 8)) continue;
            if (!sp || strchr(sp + 1, ' '))
                return ft_err(FT_E_INVALID, "%s[%lld]: expected \"a b\" (two parts), found '%s'", where,
                              (long long)idx, s);
            a = s; an = (size_t)(sp - s);
            b = sp + 1; bn = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            a = e->child->valuestring; an = strlen(a);
            b = e->child->next->valuestring; bn = strlen(b);
        } else {
            return ft_err(FT_E_INVALID, "%s[%lld]: expected \"a b\" or [\"a\", \"b\"]", where, (long long)idx);
        }
        FT_TRY(tk_merge_add(t, a, an, b, bn, rank++, where));
    }
    const char *unk = jstr(m, "unk_token");
    if (unk) t->unk_id = tk_strmap_get(&t->vocab, unk, strlen(unk));
    return 0;
}

static int load_added(ft_tokenizer *t, const cJSON *arr, const char *path)
{
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr)) return ft_err(FT_E_INVALID, "%s: added_tokens: expected an array", path);
    int64_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        const char *content = jstr(e, "content");
        int64_t id;
        if (!content || !jint(jget(e, "id"), &id))
            return ft_err(FT_E_INVALID, "%s: added_tokens[%lld]: expected \"id\" and \"content\"", path, (long long)i);
        int special = jbool(e, "special", 0);
        FT_TRY(tk_added_add(t, content, strlen(content), id, jbool(e, "single_word", 0),
                            jbool(e, "lstrip", 0), jbool(e, "rstrip", 0),
                            jbool(e, "normalized", !special), special, path));
    }
    return 0;
}

/* ---- normalizers, pre-tokenizers --------------------------------------------------------- */

static int load_norm(ft_tokenizer *t, const cJSON *o, const char *where)
{
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = type_of(o);
    char sub[WHERE_N];
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "normalizers");
        if (!cJSON_IsArray(list)) return ft_err(FT_E_INVALID, "%s: Sequence without \"normalizers\"", where);
        int i = 0;
        for (const cJSON *e = list->child; e; e = e->next, i++) {
            where_fmt(sub, sizeof sub, "%s.normalizers[%d]", where, i);
            FT_TRY(load_norm(t, e, sub));
        }
        return 0;
    }
    if (t->n_norm == TK_MAX_STAGES) return ft_err(FT_E_UNSUPPORTED, "%s: more than %d normalizers", where, TK_MAX_STAGES);
    tk_norm *z = &t->norm[t->n_norm];
    memset(z, 0, sizeof *z);
    if (!strcmp(type, "Prepend")) {
        const char *s = jstr(o, "prepend");
        if (!s) return ft_err(FT_E_INVALID, "%s: Prepend without \"prepend\"", where);
        z->type = TK_NORM_PREPEND;
        FT_TRY(dup_into(t, &z->a, &z->a_n, s));
    } else if (!strcmp(type, "Replace")) {
        const char *pat = NULL, *content = jstr(o, "content");
        int is_re = 0;
        FT_TRY(pattern_of(o, &pat, &is_re, where));
        if (!content) return ft_err(FT_E_INVALID, "%s: Replace without \"content\"", where);
        z->type = TK_NORM_REPLACE;
        FT_TRY(dup_into(t, &z->a, &z->a_n, pat));
        FT_TRY(dup_into(t, &z->b, &z->b_n, content));
        if (is_re) FT_TRY(tk_re_compile(&z->re, pat, strlen(pat), 0, where));
    } else if (!strcmp(type, "NFC")) {
        z->type = TK_NORM_NFC;
    } else if (!strcmp(type, "Lowercase")) {
        z->type = TK_NORM_LOWER;
        if (!t->lower_loc) t->lower_loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    } else {
        return ft_err(FT_E_UNSUPPORTED, "%s: normalizer type '%s' is not supported", where, type);
    }
    t->n_norm++;
    return 0;
}

static int behavior_of(const char *s, int *b)
{
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    static const int vals[] = {TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_PREV, TK_SPLIT_NEXT, TK_SPLIT_CONTIG};
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, names[i])) { *b = vals[i]; return 1; }
    return 0;
}

static int load_pre(ft_tokenizer *t, const cJSON *o, const char *where)
{
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = type_of(o);
    char sub[WHERE_N];
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "pretokenizers");
        if (!cJSON_IsArray(list)) return ft_err(FT_E_INVALID, "%s: Sequence without \"pretokenizers\"", where);
        int i = 0;
        for (const cJSON *e = list->child; e; e = e->next, i++) {
            where_fmt(sub, sizeof sub, "%s.pretokenizers[%d]", where, i);
            FT_TRY(load_pre(t, e, sub));
        }
        return 0;
    }
    if (t->n_pre == TK_MAX_STAGES) return ft_err(FT_E_UNSUPPORTED, "%s: more than %d pre-tokenizers", where, TK_MAX_STAGES);
    tk_pre *z = &t->pre[t->n_pre];
    memset(z, 0, sizeof *z);
    if (!strcmp(type, "Split")) {
        const char *pat = NULL, *beh = jstr(o, "behavior");
        int is_re = 0;
        FT_TRY(pattern_of(o, &pat, &is_re, where));
        if (!behavior_of(beh, &z->behavior))
            return ft_err(FT_E_INVALID, "%s: Split behavior '%s' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)",
                          where, beh ? beh : "(missing)");
        z->type = TK_PRE_SPLIT;
        z->invert = jbool(o, "invert", 0);
        FT_TRY(tk_re_compile(&z->re, pat, strlen(pat), !is_re, where));
    } else if (!strcmp(type, "ByteLevel")) {
        z->type = TK_PRE_BYTELEVEL;
        z->add_prefix_space = jbool(o, "add_prefix_space", 1);
        z->use_regex = jbool(o, "use_regex", 1);
        if (z->use_regex) FT_TRY(tk_re_compile(&z->re, TK_RE_GPT2, strlen(TK_RE_GPT2), 0, where));
    } else if (!strcmp(type, "Metaspace")) {
        int32_t cp;
        FT_TRY(one_char(jstr(o, "replacement"), &cp, where, "replacement"));
        z->type = TK_PRE_METASPACE;
        z->repl_n = ft_utf8_encode((uint32_t)cp, z->repl);
        z->split = jbool(o, "split", 1);
        FT_TRY(prepend_scheme_of(o, &z->prepend_scheme, where));
    } else if (!strcmp(type, "Digits")) {
        /* char::is_numeric per char: Isolated, or runs (Contiguous) == \p{N}+ Isolated */
        const char *re = jbool(o, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+";
        z->type = TK_PRE_SPLIT;
        z->behavior = TK_SPLIT_ISOLATED;
        FT_TRY(tk_re_compile(&z->re, re, strlen(re), 0, where));
    } else {
        return ft_err(FT_E_UNSUPPORTED, "%s: pre-tokenizer type '%s' is not supported", where, type);
    }
    t->n_pre++;
    return 0;
}

/* ---- post-processor, decoder ------------------------------------------------------------------ */

static int ids_cat(int32_t **dst, int64_t *n, const int32_t *a, int64_t an, const int32_t *b, int64_t bn)
{
    int32_t *v = malloc((size_t)(an + bn + 1) * sizeof *v);
    if (!v) return -ENOMEM;
    if (an) memcpy(v, a, (size_t)an * sizeof *v);
    if (bn) memcpy(v + an, b, (size_t)bn * sizeof *v);
    free(*dst);
    *dst = v;
    *n = an + bn;
    return 0;
}

static int load_template(ft_tokenizer *t, const cJSON *o, const char *where)
{
    const cJSON *single = jget(o, "single"), *specials = jget(o, "special_tokens");
    if (!cJSON_IsArray(single)) return ft_err(FT_E_INVALID, "%s: TemplateProcessing without \"single\"", where);
    int32_t before[64], after[64];
    int64_t nb = 0, na = 0;
    int seen_seq = 0, i = 0;
    for (const cJSON *e = single->child; e; e = e->next, i++) {
        const cJSON *sp = jget(e, "SpecialToken");
        if (jget(e, "Sequence")) { seen_seq = 1; continue; }
        const char *name = jstr(sp, "id");
        const cJSON *st = jget(specials, name ? name : ""), *ids = jget(st, "ids");
        if (!name || !cJSON_IsArray(ids))
            return ft_err(FT_E_INVALID, "%s: single[%d]: expected a Sequence or a SpecialToken listed in special_tokens", where, i);
        for (const cJSON *x = ids->child; x; x = x->next) {
            int64_t id;
            if (!jint(x, &id) || id < 0 || id >= TK_MAX_ID)
                return ft_err(FT_E_INVALID, "%s: special_tokens['%s']: bad id", where, name);
            if ((seen_seq ? na : nb) == 64) return ft_err(FT_E_UNSUPPORTED, "%s: template too long", where);
            if (seen_seq) after[na++] = (int32_t)id;
            else before[nb++] = (int32_t)id;
            if (t->post_bos < 0 && !seen_seq) t->post_bos = (int32_t)id;
        }
    }
    /* nested templates wrap what came before: new prefix first, new suffix last */
    FT_TRY(ids_cat(&t->post_pre, &t->n_post_pre, before, nb, t->post_pre, t->n_post_pre));
    return ids_cat(&t->post_suf, &t->n_post_suf, t->post_suf, t->n_post_suf, after, na);
}

static int load_post(ft_tokenizer *t, const cJSON *o, const char *where)
{
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = type_of(o);
    char sub[WHERE_N];
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "processors");
        if (!cJSON_IsArray(list)) return ft_err(FT_E_INVALID, "%s: Sequence without \"processors\"", where);
        int i = 0;
        for (const cJSON *e = list->child; e; e = e->next, i++) {
            where_fmt(sub, sizeof sub, "%s.processors[%d]", where, i);
            FT_TRY(load_post(t, e, sub));
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return load_template(t, o, where);
    return ft_err(FT_E_UNSUPPORTED, "%s: post-processor type '%s' is not supported", where, type);
}

static int load_dec(ft_tokenizer *t, const cJSON *o, const char *where)
{
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = type_of(o);
    char sub[WHERE_N];
    t->has_decoder = 1;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "decoders");
        if (!cJSON_IsArray(list)) return ft_err(FT_E_INVALID, "%s: Sequence without \"decoders\"", where);
        int i = 0;
        for (const cJSON *e = list->child; e; e = e->next, i++) {
            where_fmt(sub, sizeof sub, "%s.decoders[%d]", where, i);
            FT_TRY(load_dec(t, e, sub));
        }
        return 0;
    }
    if (t->n_dec == TK_MAX_STAGES) return ft_err(FT_E_UNSUPPORTED, "%s: more than %d decoders", where, TK_MAX_STAGES);
    tk_dec *z = &t->dec[t->n_dec];
    memset(z, 0, sizeof *z);
    if (!strcmp(type, "ByteLevel")) {
        z->type = TK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        z->type = TK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        z->type = TK_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        const char *pat = NULL, *content = jstr(o, "content");
        int is_re = 0;
        FT_TRY(pattern_of(o, &pat, &is_re, where));
        if (is_re) return ft_err(FT_E_UNSUPPORTED, "%s: Replace decoder with a Regex pattern is not supported", where);
        if (!content) return ft_err(FT_E_INVALID, "%s: Replace without \"content\"", where);
        z->type = TK_DEC_REPLACE;
        FT_TRY(dup_into(t, &z->a, &z->a_n, pat));
        FT_TRY(dup_into(t, &z->b, &z->b_n, content));
    } else if (!strcmp(type, "Strip")) {
        int64_t a = 0, b = 0;
        FT_TRY(one_char(jstr(o, "content"), &z->ch, where, "content"));
        if (!jint(jget(o, "start"), &a) || !jint(jget(o, "stop"), &b) || a < 0 || b < 0 || a > 1000 || b > 1000)
            return ft_err(FT_E_INVALID, "%s: Strip needs integer \"start\" and \"stop\"", where);
        z->type = TK_DEC_STRIP;
        z->start = (int)a;
        z->stop = (int)b;
    } else if (!strcmp(type, "Metaspace")) {
        FT_TRY(one_char(jstr(o, "replacement"), &z->ch, where, "replacement"));
        FT_TRY(prepend_scheme_of(o, &z->prepend_scheme, where));
        z->type = TK_DEC_METASPACE;
    } else {
        return ft_err(FT_E_UNSUPPORTED, "%s: decoder type '%s' is not supported", where, type);
    }
    t->n_dec++;
    return 0;
}

/* ---- files ------------------------------------------------------------------------------------ */

static int parse_file(const char *path, cJSON **root)
{
    char *data;
    size_t len;
    *root = NULL;
    FT_TRY(ft_read_file(path, &data, &len));
    const char *end = NULL;
    unsigned long oom = ft_json_oom_mark();
    *root = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    size_t at = end && end >= data ? (size_t)(end - data) : 0;
    size_t nul = *root ? ft_json_find_nul(data, len) : len;
    free(data);
    if (!*root && ft_json_oom_since(oom))
        return ft_err(-ENOMEM, "%s: out of memory while parsing its %zu bytes of JSON", path, len);
    if (!*root) return ft_err(FT_E_INVALID, "%s: invalid JSON at byte %zu of %zu", path, at, len);
    if (nul < len) { /* a token, pattern or template would be read cut (json.h) */
        cJSON_Delete(*root);
        *root = NULL;
        return ft_err(FT_E_INVALID, "%s: offset %zu: %s", path, nul, FT_JSON_NUL_WHY);
    }
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return ft_err(FT_E_INVALID, "%s: expected a JSON object at the top level", path);
    }
    return 0;
}

static const char *token_content(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

typedef struct { int add_bos, add_eos; } tk_cfg_flags; /* -1 absent, 0/1 */

static int load_config(ft_tokenizer *t, const char *path, tk_cfg_flags *f)
{
    cJSON *root;
    int rc = parse_file(path, &root);
    if (rc == -ENOENT) { ft_err_clear(); return 0; }
    FT_TRY(rc);
    /* the types transformers reads (a token: a string, an AddedToken object or null; a flag:
     * a boolean or null; the template: a string, a list of named ones or null): another one
     * is refused by key rather than read as absent */
    static const struct { const char *key; int kind; } keys[] = {
        {"bos_token", 0}, {"eos_token", 0}, {"add_bos_token", 1}, {"add_eos_token", 1},
        {"chat_template", 2},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0] && rc == 0; i++) {
        const cJSON *v = jget(root, keys[i].key);
        int ok = !v || cJSON_IsNull(v) ||
                 (keys[i].kind == 0 ? cJSON_IsString(v) || (cJSON_IsObject(v) && jstr(v, "content"))
                  : keys[i].kind == 1 ? cJSON_IsBool(v) : cJSON_IsString(v) || cJSON_IsArray(v));
        if (!ok)
            rc = ft_err(FT_E_INVALID, "%s: key \"%s\": expected %s, found %s", path, keys[i].key,
                        keys[i].kind == 0 ? "a token (a string, or an object with a string "
                                            "\"content\")"
                        : keys[i].kind == 1 ? "true or false" : "a string or a list of templates",
                        ft_json_type(v));
    }
    if (rc < 0) {
        cJSON_Delete(root);
        return rc;
    }
    const char *bos = token_content(jget(root, "bos_token"));
    const char *eos = token_content(jget(root, "eos_token"));
    if (bos && rc == 0) rc = tk_set_str(t, &t->bos_str, bos);
    if (eos && rc == 0) rc = tk_set_str(t, &t->eos_str, eos);
    const cJSON *ab = jget(root, "add_bos_token"), *ae = jget(root, "add_eos_token");
    if (cJSON_IsBool(ab)) f->add_bos = cJSON_IsTrue(ab);
    if (cJSON_IsBool(ae)) f->add_eos = cJSON_IsTrue(ae);
    const cJSON *ct = jget(root, "chat_template");
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) { /* [{name, template}]: "default", else the first */
        for (const cJSON *e = ct->child; e && !tmpl; e = e->next) {
            const char *name = jstr(e, "name");
            if (name && !strcmp(name, "default")) tmpl = jstr(e, "template");
        }
        if (!tmpl && ct->child) tmpl = jstr(ct->child, "template");
    }
    if (tmpl && rc == 0) rc = tk_set_str(t, &t->chat_template, tmpl);
    cJSON_Delete(root);
    return rc;
}

/* add_bos_token / add_eos_token: remove the id from, or add it to, the template. */
static int adjust_post(int32_t **v, int64_t *n, int32_t id, int want, int at_front)
{
    if (want < 0 || id < 0) return 0;
    int64_t k = 0, has = 0;
    for (int64_t i = 0; i < *n; i++) has |= (*v)[i] == id;
    if (!want) {
        for (int64_t i = 0; i < *n; i++)
            if ((*v)[i] != id) (*v)[k++] = (*v)[i];
        *n = k;
        return 0;
    }
    if (has) return 0;
    return at_front ? ids_cat(v, n, &id, 1, *v, *n) : ids_cat(v, n, *v, *n, &id, 1);
}

static int load_tokenizer_json(ft_tokenizer *t, const char *path)
{
    cJSON *root;
    FT_TRY(parse_file(path, &root));
    char where[WHERE_N];
    g_bad_flag = NULL;
    int rc = load_model(t, jget(root, "model"), path);
    if (rc == 0) rc = load_added(t, jget(root, "added_tokens"), path);
    if (rc == 0) { where_fmt(where, sizeof where, "%s: normalizer", path); rc = load_norm(t, jget(root, "normalizer"), where); }
    if (rc == 0) { where_fmt(where, sizeof where, "%s: pre_tokenizer", path); rc = load_pre(t, jget(root, "pre_tokenizer"), where); }
    if (rc == 0) { where_fmt(where, sizeof where, "%s: post_processor", path); rc = load_post(t, jget(root, "post_processor"), where); }
    if (rc == 0) { where_fmt(where, sizeof where, "%s: decoder", path); rc = load_dec(t, jget(root, "decoder"), where); }
    if (rc == 0 && g_bad_flag)
        rc = ft_err(FT_E_INVALID, "%s: key \"%s\": expected true or false, found %s", path,
                    g_bad_flag, ft_json_type(g_bad_flag_v));
    g_bad_flag = NULL;
    cJSON_Delete(root);
    return rc;
}

int ft_tok_load_dir(ft_tokenizer **out, const char *dir)
{
    *out = NULL;
    char path[WHERE_N];
    if (!dir || ft_path_join(path, sizeof path, dir, "tokenizer.json") < 0)
        return ft_err(FT_E_RANGE, "tokenizer: directory path too long");
    ft_tokenizer *t = tk_new();
    if (!t) return -ENOMEM;
    tk_cfg_flags f = {-1, -1};
    int rc = load_tokenizer_json(t, path);
    if (rc == 0) {
        char cfg[WHERE_N];
        rc = ft_path_join(cfg, sizeof cfg, dir, "tokenizer_config.json");
        if (rc == 0) rc = load_config(t, cfg, &f);
    }
    if (rc == 0) rc = tk_finalize(t, path);
    if (rc == 0) rc = adjust_post(&t->post_pre, &t->n_post_pre, t->bos, f.add_bos, 1);
    if (rc == 0) rc = adjust_post(&t->post_suf, &t->n_post_suf, t->eos, f.add_eos, 0);
    for (int64_t i = 0; rc == 0 && i < t->n_post_pre + t->n_post_suf; i++) {
        int32_t id = i < t->n_post_pre ? t->post_pre[i] : t->post_suf[i - t->n_post_pre];
        if (id >= t->n_ids)
            rc = ft_err(FT_E_INVALID, "%s: post_processor: special token id %d is outside the vocabulary (%lld ids)",
                        path, id, (long long)t->n_ids);
    }
    if (rc < 0) {
        ft_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
