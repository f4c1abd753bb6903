/* hf_tok.c - ft_hf_tok_from_gguf: tokenizer.json and tokenizer_config.json from a GGUF
 * file's tokenizer.ggml.* metadata (formats.md 4.3 and 6; llama.cpp's keys), the inverse of
 * export_tok.c. The JSON describes, in the huggingface/tokenizers serialization, the
 * tokenizer that ft_tok_from_spec (src/tokenizer/tok_spec.c) builds from the same metadata:
 *
 *  model "gpt2": BPE {vocab = every token under its GGUF id, merges = tokenizer.ggml.merges
 *    in rank order, no unk_token (characters missing from the vocabulary are dropped),
 *    ignore_merges for llama-bpe}, decoder ByteLevel; by tokenizer.ggml.pre:
 *      smollm            pre_tokenizer Sequence[Digits(individual_digits), ByteLevel(use_regex)]
 *      llama-bpe, llama3 Sequence[Split(Llama-3 regex, Isolated), ByteLevel(use_regex false)]
 *      qwen2             normalizer NFC; Sequence[Split(Qwen2 regex, Isolated), ByteLevel(no regex)]
 *      gpt2, default     ByteLevel(use_regex: GPT-2's regex)
 *  model "llama" (SentencePiece-style, the way transformers' LlamaConverter writes Llama-2):
 *    normalizer Sequence[Prepend("▁") if add_space_prefix, Replace(" " -> "▁")], no
 *    pre-tokenizer; BPE {byte_fallback, fuse_unk, unk_token}; decoder Sequence[Replace("▁" ->
 *    " "), ByteFallback, Fuse, Strip(" ", 1, 0) if add_space_prefix]. The merges come from
 *    the scores as transformers' SentencePieceExtractor makes them: every split of a piece
 *    (at a character boundary) into two pieces, ordered by the piece's score, highest first
 *    (ties: piece id, then the ids of the parts). BPE by merge rank then equals llama.cpp's
 *    "merge the pair whose concatenation has the highest score" (ftune's TK_MODEL_SPM) as
 *    long as distinct pieces that merges produce have distinct scores, each part a merge
 *    starts from is a piece, and all 256 <0xHH> byte pieces exist; a vocabulary that breaks
 *    one of these is refused. Pieces of control/user-defined tokens are exempt from the first
 *    two conditions: their text never reaches the model (it is split off as an added token).
 *  Token types 3 (control) and 4 (user-defined) become added_tokens (special for 3; not
 *    normalized), as in ft_tok_from_spec; so does a type-2 (unknown) piece if ftune's GGUF
 *    tokenizer matches it literally. Every token also stays in model.vocab under its GGUF
 *    id, so that tokenizers keeps the ids of added tokens. A TemplateProcessing
 *    post-processor adds BOS when add_bos_token is set and EOS when add_eos_token is (and
 *    the ids exist), as ft_tok_from_spec does.
 *  tokenizer_config.json (transformers): bos/eos/unk/pad tokens, add_bos_token,
 *    add_eos_token, added_tokens_decoder, chat_template, model_max_length, and
 *    tokenizer_class PreTrainedTokenizerFast, which uses tokenizer.json as written.
 * Merges are written "a b", or ["a", "b"] (tokenizers >= 0.20) when a part holds a space.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adapters/export/hf_tok.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/tokenizer/tokenizer.h"

/* The pre-tokenizer regexes of tok_spec.c (tok_util.c TK_RE_*), as in the models' own
 * tokenizer.json files; the self-check catches any drift between the two copies. */
static const char k_re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char k_metaspace[] = "\xE2\x96\x81"; /* U+2581 */

/* Probe texts (after llama.cpp's convert_hf_to_gguf.py chktxt): whitespace runs, digits,
 * contractions in both cases, CJK, emoji, Cyrillic, combining accents (NFC), code, CRLF. */
static const char *const k_probe[] = {
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 1314151 \xD9\xA3\xD9\xA4",
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "\xF0\x9F\x9A\x80 (normal) \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F (multiple emojis "
    "concatenated) \xE2\x9C\x85 \xF0\x9F\xA6\x99\xF0\x9F\xA6\x99 \xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
    "apple\xE5\xB7\xA5\xE4\xBD\x9C" "1314151\xE5\xA4\xA9\xEF\xBD\x9E",
    "------======= \xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE \xD0\xBD\xD0\xB0 \xD0\x91\xD1\x8A\xD0\xBB\xD0\xB3"
    "\xD0\xB0\xD1\x80\xD1\x81\xD0\xBA\xD0\xB8 ''''''```````\"\"\"\"......!!!!!!??????",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x**2  # comment\r\n\tif x:\n\t\tpass\n",
    "cafe\xCC\x81 caf\xC3\xA9 na\xC3\xAFve A\xCC\x8A \xEF\xAC\x81 \xE2\x84\xAB",
    "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9 "
    "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80 \xCE\xB5\xCE\xBB",
    "Below is an instruction. ### Response: Sure, here is the answer.",
    "",
};

/* The tokenizer.ggml.* metadata. Strings point into the GGUF reader's copies. */
typedef struct gg_tok {
    const char *model, *pre;
    int spm;                      /* model "llama" */
    int64_t n;                    /* tokens */
    char *const *tok;             /* n */
    int32_t *type;                /* n, malloc'ed; 1 (normal) where the key is absent */
    float *score;                 /* n, malloc'ed; NULL when absent */
    int64_t n_merges;
    char *const *merges;          /* "a b", rank order (gpt2) */
    int64_t bos, eos, unk, pad;   /* -1 when absent or outside the vocabulary */
    int add_bos, add_eos, add_space_prefix;
    const char *chat_template;
    uint8_t *added;               /* n: 0 no, 1 added, 2 added and special */
} gg_tok;

/* One merge as text: the parts a, b (b follows a in `res`'s string for SPM merges). */
typedef struct hf_merge {
    const char *a, *b;
    size_t an, bn;
    int32_t res, ia, ib;
    float score;
} hf_merge;

static int refuse(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return 1;
}

/* An error of the GGUF reader or tokenizer: system errors propagate, the rest (FT_E_*:
 * the file's tokenizer is missing, malformed or not handled) become a refusal. */
static int refuse_err(int rc, char *why, size_t n)
{
    if (rc > -4096) return rc;
    return refuse(why, n, "%s", ft_errmsg());
}

static void gg_free(gg_tok *m)
{
    free(m->type);
    free(m->score);
    free(m->added);
}

static int opt_id(const ft_gguf *g, const char *key, int64_t n, int64_t *id)
{
    int64_t v = -1;
    *id = -1;
    int rc = ft_gguf_get_int(g, key, &v);
    if (rc == FT_E_NOTFOUND) return 0;
    FT_TRY(rc);
    if (v >= 0 && v < n) *id = v;
    return 0;
}

static int opt_flag(const ft_gguf *g, const char *key, int dflt, int *v)
{
    *v = dflt;
    int rc = ft_gguf_get_bool(g, key, v);
    return rc == FT_E_NOTFOUND ? 0 : rc;
}

/* Reads the metadata with the defaults of ft_gguf_load_tokenizer (loader.c). */
static int read_meta(const ft_gguf *g, gg_tok *m)
{
    FT_TRY(ft_gguf_get_str(g, "tokenizer.ggml.model", &m->model));
    if (ft_gguf_get_str(g, "tokenizer.ggml.pre", &m->pre) < 0) m->pre = NULL;
    m->spm = !strcmp(m->model, "llama");
    const ft_gguf_kv *tk = ft_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const ft_gguf_kv *ty = ft_gguf_find_kv(g, "tokenizer.ggml.token_type");
    const ft_gguf_kv *sc = ft_gguf_find_kv(g, "tokenizer.ggml.scores");
    const ft_gguf_kv *mg = ft_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!tk || tk->type != FT_GGUF_ARRAY || tk->arr_type != FT_GGUF_STRING || tk->arr_n <= 0)
        return ft_err(FT_E_INVALID, "%s: tokenizer.ggml.tokens is not an array of strings", ft_gguf_path(g));
    m->n = tk->arr_n;
    m->tok = tk->arr_str;
    m->type = malloc((size_t)m->n * sizeof *m->type);
    m->added = calloc((size_t)m->n, 1);
    if (!m->type || !m->added) return -ENOMEM;
    if (ty && ty->arr_n == m->n) FT_TRY(ft_gguf_arr_i32(ty, m->type));
    else for (int64_t i = 0; i < m->n; i++) m->type[i] = 1;
    if (sc && sc->arr_n == m->n) {
        if (!(m->score = malloc((size_t)m->n * sizeof *m->score))) return -ENOMEM;
        FT_TRY(ft_gguf_arr_f32(sc, m->score));
    }
    if (mg && mg->type == FT_GGUF_ARRAY && mg->arr_type == FT_GGUF_STRING) {
        m->n_merges = mg->arr_n;
        m->merges = mg->arr_str;
    }
    FT_TRY(opt_id(g, "tokenizer.ggml.bos_token_id", m->n, &m->bos));
    FT_TRY(opt_id(g, "tokenizer.ggml.eos_token_id", m->n, &m->eos));
    FT_TRY(opt_id(g, "tokenizer.ggml.unknown_token_id", m->n, &m->unk));
    FT_TRY(opt_id(g, "tokenizer.ggml.padding_token_id", m->n, &m->pad));
    FT_TRY(opt_flag(g, "tokenizer.ggml.add_bos_token", m->spm, &m->add_bos));
    FT_TRY(opt_flag(g, "tokenizer.ggml.add_eos_token", 0, &m->add_eos));
    FT_TRY(opt_flag(g, "tokenizer.ggml.add_space_prefix", m->spm, &m->add_space_prefix));
    if (ft_gguf_get_str(g, "tokenizer.chat_template", &m->chat_template) < 0) m->chat_template = NULL;
    if (m->bos < 0) m->add_bos = 0; /* ft_tok_from_spec adds BOS / EOS only when they exist */
    if (m->eos < 0) m->add_eos = 0;
    return 0;
}

/* 1 if s is well-formed UTF-8 with no surrogates or overlong forms (JSON needs it). */
static int utf8_ok(const unsigned char *s)
{
    while (*s) {
        unsigned c = *s;
        int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0 || (n == 1 && c < 0xC2) || (n == 3 && c > 0xF4)) return 0;
        uint32_t cp = n ? c & (0x3F >> n) : c;
        for (int k = 1; k <= n; k++) {
            if ((s[k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[k] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        s += n + 1;
    }
    return 1;
}

static size_t u8len(const char *s)
{
    unsigned c = (unsigned char)*s;
    return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
}

/* Vocabulary checks that JSON and tokenizers need: valid UTF-8, one id per string (a JSON
 * object cannot hold a key twice). Also marks the added tokens. Returns 0, 1 (refused). */
static int check_vocab(const ft_tokenizer *ref, gg_tok *m, char *why, size_t why_n)
{
    for (int64_t i = 0; i < m->n; i++) {
        if (!utf8_ok((const unsigned char *)m->tok[i]))
            return refuse(why, why_n, "token %lld is not valid UTF-8", (long long)i);
        int32_t id = ft_tok_id(ref, m->tok[i]);
        if (id != i)
            return refuse(why, why_n, "tokens %lld and %d are the same string '%.40s'", (long long)i, id, m->tok[i]);
        if (m->type[i] == 3 || m->type[i] == 4) m->added[i] = m->type[i] == 3 ? 2 : 1;
    }
    /* an unknown piece that ftune's tokenizer matches literally is an added special token */
    for (int64_t i = 0; i < m->n; i++) {
        if (m->type[i] != 2 || !m->tok[i][0]) continue;
        int32_t *ids = NULL;
        int64_t k = 0;
        int rc = ft_tok_encode(ref, m->tok[i], strlen(m->tok[i]), 0, &ids, &k);
        if (rc == 0 && k == 1 && ids[0] == i) m->added[i] = 2;
        free(ids);
        FT_TRY(rc);
    }
    return 0;
}

/* ---- merges ---------------------------------------------------------------------------- */

static int gpt2_merges(const gg_tok *m, hf_merge **out, int64_t *n_out, char *why, size_t why_n)
{
    hf_merge *v = calloc((size_t)(m->n_merges ? m->n_merges : 1), sizeof *v);
    if (!v) return -ENOMEM;
    for (int64_t i = 0; i < m->n_merges; i++) {
        const char *s = m->merges[i], *sp = s[0] ? strchr(s + 1, ' ') : NULL; /* as tok_spec.c */
        if (!sp || !utf8_ok((const unsigned char *)s)) {
            free(v);
            return refuse(why, why_n, "tokenizer.ggml.merges[%lld] is not \"a b\" in UTF-8", (long long)i);
        }
        v[i] = (hf_merge){.a = s, .an = (size_t)(sp - s), .b = sp + 1, .bn = strlen(sp + 1)};
    }
    *out = v;
    *n_out = m->n_merges;
    return 0;
}

static int32_t piece_id(const ft_tokenizer *ref, const char *s, size_t n, char *buf)
{
    memcpy(buf, s, n);
    buf[n] = 0;
    return ft_tok_id(ref, buf);
}

static int cmp_spm(const void *x, const void *y)
{
    const hf_merge *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->res != b->res) return a->res < b->res ? -1 : 1;
    if (a->ia != b->ia) return a->ia < b->ia ? -1 : 1;
    return (a->ib > b->ib) - (a->ib < b->ib);
}

/* SentencePiece merges from the scores (see the file comment), with the checks that make
 * BPE by rank equal to merging by score. */
static int spm_merges(const ft_tokenizer *ref, const gg_tok *m, hf_merge **out, int64_t *n_out,
                      char *why, size_t why_n)
{
    if (!m->score) return refuse(why, why_n, "model llama without tokenizer.ggml.scores");
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        if (ft_tok_id(ref, name) < 0)
            return refuse(why, why_n, "byte piece %s is missing (tokenizers' byte_fallback would "
                          "differ from ftune's)", name);
    }
    size_t maxlen = 0;
    for (int64_t i = 0; i < m->n; i++) {
        size_t L = strlen(m->tok[i]);
        if (L > maxlen) maxlen = L;
    }
    char *buf = malloc(maxlen + 1);
    int64_t n = 0, cap = 1024;
    hf_merge *v = malloc((size_t)cap * sizeof *v);
    if (!buf || !v) {
        free(buf);
        free(v);
        return -ENOMEM;
    }
    int rc = 0;
    for (int64_t i = 0; i < m->n && rc == 0; i++) {
        const char *s = m->tok[i];
        size_t L = strlen(s);
        int exempt = m->type[i] == 3 || m->type[i] == 4;
        for (size_t k = L ? u8len(s) : 0; k < L && rc == 0; k += u8len(s + k)) {
            int32_t ia = piece_id(ref, s, k, buf), ib = piece_id(ref, s + k, L - k, buf);
            if (ia < 0 || ib < 0) {
                /* ftune's SPM also merges single characters that are not pieces */
                int sa = ia >= 0 || u8len(s) == k, sb = ib >= 0 || u8len(s + k) == L - k;
                if (sa && sb && !exempt)
                    rc = refuse(why, why_n, "piece %lld '%.40s' can be merged from a character that is "
                                "not a piece ('%.*s' + '%.*s'); tokenizers' BPE cannot", (long long)i, s,
                                (int)k, s, (int)(L - k), s + k);
                continue;
            }
            if (n == cap) {
                hf_merge *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!w) {
                    rc = -ENOMEM;
                    break;
                }
                v = w;
            }
            v[n++] = (hf_merge){.a = s, .an = k, .b = s + k, .bn = L - k, .res = (int32_t)i,
                                .ia = ia, .ib = ib, .score = m->score[i]};
        }
    }
    free(buf);
    if (rc == 0) qsort(v, (size_t)n, sizeof *v, cmp_spm);
    const hf_merge *last = NULL; /* the previous merge whose piece is not exempt */
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const hf_merge *b = &v[i];
        if (m->type[b->res] == 3 || m->type[b->res] == 4) continue;
        if (last && last->res != b->res && last->score == b->score)
            rc = refuse(why, why_n, "pieces %d and %d have the same score %g: llama.cpp merges them "
                        "leftmost first, which BPE merge ranks cannot express", last->res, b->res,
                        (double)b->score);
        last = b;
    }
    if (rc != 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------------ */

static cJSON *str_or_null(const gg_tok *m, int64_t id)
{
    return id >= 0 ? cJSON_CreateString(m->tok[id]) : cJSON_CreateNull();
}

static cJSON *pre_split(const char *re)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "pattern"), "Regex", re);
    cJSON_AddStringToObject(o, "behavior", "Isolated");
    cJSON_AddBoolToObject(o, "invert", 0);
    return o;
}

static cJSON *bytelevel(int add_prefix_space, int trim_offsets, int use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *seq(const char *type, const char *key, cJSON *a, cJSON *b)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON *l = cJSON_AddArrayToObject(o, key);
    cJSON_AddItemToArray(l, a);
    if (b) cJSON_AddItemToArray(l, b);
    return o;
}

/* normalizer, pre_tokenizer and decoder of a gpt2 model; 1 if `pre` is not handled. */
static int gpt2_pipeline(const char *pre, cJSON *root, int *ignore_merges)
{
    if (!pre) pre = "default";
    cJSON *norm = NULL, *pt;
    *ignore_merges = 0;
    if (!strcmp(pre, "smollm")) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", 1);
        pt = seq("Sequence", "pretokenizers", d, bytelevel(0, 1, 1));
    } else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        *ignore_merges = 1;
        pt = seq("Sequence", "pretokenizers", pre_split(k_re_llama3), bytelevel(0, 1, 0));
    } else if (!strcmp(pre, "qwen2")) {
        norm = cJSON_CreateObject();
        cJSON_AddStringToObject(norm, "type", "NFC");
        pt = seq("Sequence", "pretokenizers", pre_split(k_re_qwen2), bytelevel(0, 1, 0));
    } else if (!strcmp(pre, "gpt2") || !strcmp(pre, "default")) {
        pt = bytelevel(0, 1, 1);
    } else {
        return 1;
    }
    cJSON_AddItemToObject(root, "normalizer", norm ? norm : cJSON_CreateNull());
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    return 0;
}

static void spm_pipeline(const gg_tok *m, cJSON *root)
{
    cJSON *rep = cJSON_CreateObject();
    cJSON_AddStringToObject(rep, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(rep, "pattern"), "String", " ");
    cJSON_AddStringToObject(rep, "content", k_metaspace);
    cJSON *norm = rep;
    if (m->add_space_prefix) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "Prepend");
        cJSON_AddStringToObject(p, "prepend", k_metaspace);
        norm = seq("Sequence", "normalizers", p, rep);
    }
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON_AddNullToObject(root, "pre_tokenizer");
}

static cJSON *spm_decoder(const gg_tok *m)
{
    cJSON *o = cJSON_CreateObject(), *l;
    cJSON_AddStringToObject(o, "type", "Sequence");
    l = cJSON_AddArrayToObject(o, "decoders");
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", k_metaspace);
    cJSON_AddStringToObject(r, "content", " ");
    cJSON_AddItemToArray(l, r);
    static const char *const simple[] = {"ByteFallback", "Fuse"};
    for (int i = 0; i < 2; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", simple[i]);
        cJSON_AddItemToArray(l, x);
    }
    if (m->add_space_prefix) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "type", "Strip");
        cJSON_AddStringToObject(s, "content", " ");
        cJSON_AddNumberToObject(s, "start", 1);
        cJSON_AddNumberToObject(s, "stop", 0);
        cJSON_AddItemToArray(l, s);
    }
    return o;
}

/* {"SpecialToken": {"id": tok, "type_id": part}} into list l. */
static void tmpl_special(cJSON *l, const char *tok, int part)
{
    cJSON *st = cJSON_CreateObject();
    cJSON *a = cJSON_AddObjectToObject(st, "SpecialToken");
    cJSON_AddStringToObject(a, "id", tok);
    cJSON_AddNumberToObject(a, "type_id", part);
    cJSON_AddItemToArray(l, st);
}

/* A TemplateProcessing post-processor: BOS before (add_bos) and EOS after (add_eos) each
 * sequence, as transformers' LlamaTokenizerFast.update_post_processor writes it. */
static cJSON *template_special(const gg_tok *m)
{
    const char *bos = m->add_bos ? m->tok[m->bos] : NULL, *eos = m->add_eos ? m->tok[m->eos] : NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "TemplateProcessing");
    static const char *const lists[] = {"single", "pair"};
    for (int k = 0; k < 2; k++) {
        cJSON *l = cJSON_AddArrayToObject(o, lists[k]);
        for (int part = 0; part <= k; part++) {
            if (bos) tmpl_special(l, bos, part);
            cJSON *sq = cJSON_CreateObject();
            cJSON *b = cJSON_AddObjectToObject(sq, "Sequence");
            cJSON_AddStringToObject(b, "id", part ? "B" : "A");
            cJSON_AddNumberToObject(b, "type_id", part);
            cJSON_AddItemToArray(l, sq);
            if (eos) tmpl_special(l, eos, part);
        }
    }
    cJSON *sp = cJSON_AddObjectToObject(o, "special_tokens");
    const char *toks[2] = {bos, eos};
    int64_t ids[2] = {m->bos, m->eos};
    for (int k = 0; k < 2; k++) {
        if (!toks[k] || (k == 1 && bos && !strcmp(bos, eos))) continue;
        cJSON *e = cJSON_AddObjectToObject(sp, toks[k]);
        cJSON_AddStringToObject(e, "id", toks[k]);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "ids"), cJSON_CreateNumber((double)ids[k]));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "tokens"), cJSON_CreateString(toks[k]));
    }
    return o;
}

static cJSON *added_token(const gg_tok *m, int64_t id, int with_id)
{
    cJSON *o = cJSON_CreateObject();
    if (with_id) cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "content", m->tok[id]);
    cJSON_AddBoolToObject(o, "single_word", 0);
    cJSON_AddBoolToObject(o, "lstrip", 0);
    cJSON_AddBoolToObject(o, "rstrip", 0);
    cJSON_AddBoolToObject(o, "normalized", 0);
    cJSON_AddBoolToObject(o, "special", m->added[id] == 2);
    return o;
}

static cJSON *merge_json(const hf_merge *x)
{
    if (!memchr(x->a, ' ', x->an) && !memchr(x->b, ' ', x->bn)) {
        char *s = malloc(x->an + x->bn + 2);
        if (!s) return NULL;
        memcpy(s, x->a, x->an);
        s[x->an] = ' ';
        memcpy(s + x->an + 1, x->b, x->bn);
        s[x->an + 1 + x->bn] = 0;
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    char *a = strndup(x->a, x->an), *b = strndup(x->b, x->bn);
    cJSON *j = a && b ? cJSON_CreateArray() : NULL;
    if (j) {
        cJSON_AddItemToArray(j, cJSON_CreateString(a));
        cJSON_AddItemToArray(j, cJSON_CreateString(b));
    }
    free(a);
    free(b);
    return j;
}

/* tokenizer.json; NULL on out of memory (*unhandled set when the pre-tokenizer is not known). */
static cJSON *tokenizer_json(const gg_tok *m, const hf_merge *mg, int64_t n_mg, int *unhandled)
{
    cJSON *root = cJSON_CreateObject();
    *unhandled = 0;
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int64_t i = 0; i < m->n; i++)
        if (m->added[i]) cJSON_AddItemToArray(added, added_token(m, i, 1));
    int ignore_merges = 0;
    if (m->spm) {
        spm_pipeline(m, root);
    } else if (gpt2_pipeline(m->pre, root, &ignore_merges)) {
        *unhandled = 1;
        cJSON_Delete(root);
        return NULL;
    }
    cJSON *tmpl = m->add_bos || m->add_eos ? template_special(m) : NULL;
    if (m->spm)
        cJSON_AddItemToObject(root, "post_processor", tmpl ? tmpl : cJSON_CreateNull());
    else
        cJSON_AddItemToObject(root, "post_processor", tmpl ? seq("Sequence", "processors", bytelevel(1, 0, 1), tmpl)
                                                           : bytelevel(1, 0, 1));
    cJSON_AddItemToObject(root, "decoder", m->spm ? spm_decoder(m) : bytelevel(1, 1, 1));
    cJSON *mo = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(mo, "type", "BPE");
    cJSON_AddNullToObject(mo, "dropout");
    cJSON_AddItemToObject(mo, "unk_token", m->spm ? str_or_null(m, m->unk) : cJSON_CreateNull());
    cJSON_AddNullToObject(mo, "continuing_subword_prefix");
    cJSON_AddNullToObject(mo, "end_of_word_suffix");
    cJSON_AddBoolToObject(mo, "fuse_unk", m->spm);
    cJSON_AddBoolToObject(mo, "byte_fallback", m->spm);
    cJSON_AddBoolToObject(mo, "ignore_merges", ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(mo, "vocab");
    for (int64_t i = 0; i < m->n; i++) cJSON_AddNumberToObject(vocab, m->tok[i], (double)i);
    cJSON *ml = cJSON_AddArrayToObject(mo, "merges");
    for (int64_t i = 0; i < n_mg; i++) {
        cJSON *x = merge_json(&mg[i]);
        if (!x) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(ml, x);
    }
    return root;
}

static cJSON *config_json(const gg_tok *m, int64_t model_max_length)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "add_bos_token", m->add_bos);
    cJSON_AddBoolToObject(o, "add_eos_token", m->add_eos);
    cJSON *dec = cJSON_AddObjectToObject(o, "added_tokens_decoder");
    for (int64_t i = 0; i < m->n; i++)
        if (m->added[i]) {
            char k[24];
            snprintf(k, sizeof k, "%lld", (long long)i);
            cJSON_AddItemToObject(dec, k, added_token(m, i, 0));
        }
    cJSON_AddItemToObject(o, "bos_token", str_or_null(m, m->bos));
    if (m->chat_template) cJSON_AddStringToObject(o, "chat_template", m->chat_template);
    cJSON_AddBoolToObject(o, "clean_up_tokenization_spaces", 0);
    cJSON_AddItemToObject(o, "eos_token", str_or_null(m, m->eos));
    if (model_max_length > 0) cJSON_AddNumberToObject(o, "model_max_length", (double)model_max_length);
    cJSON_AddItemToObject(o, "pad_token", str_or_null(m, m->pad));
    cJSON_AddStringToObject(o, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON_AddItemToObject(o, "unk_token", str_or_null(m, m->unk));
    return o;
}

static int write_text(const char *dir, const char *name, const char *js)
{
    char p[4200];
    FT_TRY(ft_path_join(p, sizeof p, dir, name));
    return ft_write_file_atomic(p, js, strlen(js));
}

/* ---- self-check ------------------------------------------------------------------------ */

/* Encodes text with both tokenizers (add_special 0 and 1) and decodes the ids with both.
 * Returns 1 if all agree, 0 if not, or a negative error. */
static int same_on(const ft_tokenizer *a, const ft_tokenizer *b, const char *text)
{
    int same = 1, rc = 0;
    for (int sp = 0; sp < 2 && same && rc == 0; sp++) {
        int32_t *x = NULL, *y = NULL;
        int64_t nx = 0, ny = 0;
        char *da = NULL, *db = NULL;
        rc = ft_tok_encode(a, text, strlen(text), sp, &x, &nx);
        if (!rc) rc = ft_tok_encode(b, text, strlen(text), sp, &y, &ny);
        same = !rc && nx == ny && (nx == 0 || !memcmp(x, y, (size_t)nx * sizeof *x));
        if (same && !(rc = ft_tok_decode(a, x, nx, 0, &da))) rc = ft_tok_decode(b, x, nx, 0, &db);
        if (same && !rc) same = !strcmp(da, db);
        free(x);
        free(y);
        free(da);
        free(db);
    }
    return rc < 0 ? rc : same;
}

/* A probe of the added tokens: each of up to 8 first and 8 last added tokens, BOS, EOS and
 * the unknown piece, between words and spaces. malloc'ed. */
static char *special_probe(const gg_tok *m)
{
    int64_t ids[20], k = 0, na = 0;
    for (int64_t i = 0; i < m->n; i++) na += m->added[i] != 0;
    for (int64_t i = 0, seen = 0; i < m->n; i++) {
        if (!m->added[i]) continue;
        if ((seen < 8 || seen >= na - 8) && k < 16) ids[k++] = i;
        seen++;
    }
    ids[k++] = m->bos;
    ids[k++] = m->eos;
    ids[k++] = m->unk;
    size_t len = 64;
    for (int64_t i = 0; i < k; i++) len += (ids[i] >= 0 ? strlen(m->tok[ids[i]]) : 0) + 8;
    char *s = malloc(len), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "Hi");
    for (int64_t i = 0; i < k; i++)
        if (ids[i] >= 0) p += sprintf(p, "%s%s%s", i % 3 == 0 ? " " : "", m->tok[ids[i]], i % 2 ? "x" : "\n ");
    return s;
}

static int self_check(const ft_tokenizer *ref, const ft_tokenizer *back, const gg_tok *m,
                      char *why, size_t why_n)
{
    if (ft_tok_vocab_size(ref) != ft_tok_vocab_size(back))
        return refuse(why, why_n, "self-check: %lld ids from tokenizer.json, %lld from the GGUF",
                      (long long)ft_tok_vocab_size(back), (long long)ft_tok_vocab_size(ref));
    for (int64_t i = 0; i < ft_tok_vocab_size(ref); i++) {
        const char *x = ft_tok_str(ref, (int32_t)i), *y = ft_tok_str(back, (int32_t)i);
        if ((x == NULL) != (y == NULL) || (x && strcmp(x, y)))
            return refuse(why, why_n, "self-check: token %lld differs", (long long)i);
    }
    const char *ta = ft_tok_chat_template(ref), *tb = ft_tok_chat_template(back);
    if (ft_tok_bos(ref) != ft_tok_bos(back) || ft_tok_eos(ref) != ft_tok_eos(back) ||
        (ta == NULL) != (tb == NULL) || (ta && strcmp(ta, tb)))
        return refuse(why, why_n, "self-check: BOS/EOS or chat template differ");
    for (size_t i = 0; i < sizeof k_probe / sizeof k_probe[0]; i++) {
        int same = same_on(ref, back, k_probe[i]);
        FT_TRY(same);
        if (!same) return refuse(why, why_n, "self-check: probe text #%zu encodes or decodes differently", i);
    }
    char *sp = special_probe(m);
    if (!sp) return -ENOMEM;
    int same = same_on(ref, back, sp);
    free(sp);
    FT_TRY(same);
    return same ? 0 : refuse(why, why_n, "self-check: a text with special tokens encodes differently");
}

/* ---- driver ---------------------------------------------------------------------------- */

static const char *const k_files[] = {"tokenizer.json", "tokenizer_config.json"};

static void remove_tmp(const char *tmp)
{
    char p[4300];
    for (int i = 0; i < 2; i++)
        if (ft_path_join(p, sizeof p, tmp, k_files[i]) == 0) unlink(p);
    rmdir(tmp);
}

/* Writes both files (tj: tokenizer.json, cj: tokenizer_config.json) into a temporary folder,
 * checks them against ref, then renames them into dir. */
static int write_checked(const char *dir, const ft_tokenizer *ref, const gg_tok *m, const char *tj,
                         const char *cj, char *why, size_t why_n)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s/.hf_tok.tmp.%d", dir, (int)getpid()) >= (int)sizeof tmp)
        return ft_err(FT_E_RANGE, "%s: path too long", dir);
    remove_tmp(tmp); /* a leftover of this pid */
    if (mkdir(tmp, 0755) < 0) return ft_err(-errno, "%s: cannot create: %s", tmp, strerror(errno));
    ft_tokenizer *back = NULL;
    int rc = write_text(tmp, k_files[0], tj);
    if (!rc) rc = write_text(tmp, k_files[1], cj);
    if (!rc && (rc = ft_tok_load_dir(&back, tmp)) < 0) {
        rc = refuse_err(rc, why, why_n);
        if (rc == 1) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", why);
            refuse(why, why_n, "self-check: ftune cannot load the rebuilt tokenizer.json: %s", msg);
        }
    }
    if (!rc) rc = self_check(ref, back, m, why, why_n);
    ft_tok_free(back);
    for (int i = 0; i < 2 && rc == 0; i++) {
        char a[4300], b[4300];
        rc = ft_path_join(a, sizeof a, tmp, k_files[i]);
        if (!rc) rc = ft_path_join(b, sizeof b, dir, k_files[i]);
        if (!rc && rename(a, b) < 0) rc = ft_err(-errno, "%s: rename from %s failed: %s", b, a, strerror(errno));
        if (!rc) ft_fsync_parent(b);
    }
    remove_tmp(tmp);
    return rc;
}

int ft_hf_tok_from_gguf(const char *dir, const ft_gguf *g, int64_t model_max_length,
                        char *why, size_t why_n)
{
    why[0] = 0;
    ft_tokenizer *ref = NULL;
    int rc = ft_gguf_load_tokenizer(ft_gguf_path(g), &ref);
    if (rc < 0) return refuse_err(rc, why, why_n);
    gg_tok m;
    memset(&m, 0, sizeof m);
    hf_merge *mg = NULL;
    int64_t n_mg = 0;
    char *tj = NULL, *cj = NULL;
    rc = read_meta(g, &m);
    if (rc < 0) rc = refuse_err(rc, why, why_n);
    if (!rc) rc = check_vocab(ref, &m, why, why_n);
    if (!rc) rc = m.spm ? spm_merges(ref, &m, &mg, &n_mg, why, why_n) : gpt2_merges(&m, &mg, &n_mg, why, why_n);
    if (!rc) {
        /* printed and freed before the check loads the files back: one copy at a time */
        int unhandled = 0;
        cJSON *t = tokenizer_json(&m, mg, n_mg, &unhandled), *c = config_json(&m, model_max_length);
        free(mg);
        mg = NULL;
        tj = t ? cJSON_PrintUnformatted(t) : NULL;
        cj = c ? cJSON_Print(c) : NULL;
        cJSON_Delete(t);
        cJSON_Delete(c);
        if (unhandled)
            rc = refuse(why, why_n, "tokenizer.ggml.pre '%s' has no tokenizer.json equivalent here", m.pre);
        else if (!tj || !cj)
            rc = ft_err(-ENOMEM, "%s: out of memory building tokenizer.json", dir);
    }
    if (!rc) rc = write_checked(dir, ref, &m, tj, cj, why, why_n);
    free(tj);
    free(cj);
    free(mg);
    gg_free(&m);
    ft_tok_free(ref);
    if (rc == 1) ft_err_clear(); /* a refusal is not an error of the merge */
    return rc;
}
