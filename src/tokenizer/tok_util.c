/* tok_util.c - containers, UTF-8 helpers, GPT-2 bytes_to_unicode and PCRE2 wrappers for the
 * tokenizer (tok_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

/* Regexes of the target models (formats.md 6.3): GPT-2 ByteLevel (tokenizers
 * pre_tokenizers/byte_level.rs), Llama-3 (tiktoken cl100k-style, transformers
 * TikTokenConverter) and Qwen2 (same with single digits, transformers Qwen2Converter). */
const char TK_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char TK_RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char TK_RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ---- tk_buf ------------------------------------------------------------------------ */

int tk_buf_reserve(tk_buf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n)
{
    FT_TRY(tk_buf_reserve(b, n));
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tk_buf_putc(tk_buf *b, char c)
{
    return tk_buf_put(b, &c, 1);
}

void tk_buf_free(tk_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- tk_arena ---------------------------------------------------------------------- */

#define TK_ARENA_BLOCK ((size_t)1 << 20)

char *tk_arena_dup(tk_arena *a, const char *s, size_t n)
{
    if (!a->n_blk || a->used + n + 1 > a->cap) {
        size_t cap = n + 1 > TK_ARENA_BLOCK ? n + 1 : TK_ARENA_BLOCK;
        char **blk = realloc(a->blk, (size_t)(a->n_blk + 1) * sizeof *blk);
        if (!blk) return NULL;
        a->blk = blk;
        if (!(blk[a->n_blk] = malloc(cap))) return NULL;
        a->n_blk++;
        a->used = 0;
        a->cap = cap;
    }
    char *p = a->blk[a->n_blk - 1] + a->used;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    a->used += n + 1;
    return p;
}

void tk_arena_free(tk_arena *a)
{
    for (int64_t i = 0; i < a->n_blk; i++) free(a->blk[i]);
    free(a->blk);
    memset(a, 0, sizeof *a);
}

/* ---- tk_strmap (FNV-1a, linear probing) -------------------------------------------- */

static uint64_t tk_hash(const char *s, size_t n)
{
    uint64_t h = ft_fnv1a64(FT_FNV64_OFFSET, s, n);
    return h ^ (h >> 29);
}

static int strmap_rehash(tk_strmap *m, uint64_t nslots)
{
    uint32_t *slot = calloc(nslots, sizeof *slot);
    if (!slot) return -ENOMEM;
    for (int64_t e = 0; e < m->n; e++) {
        uint64_t i = tk_hash(m->key[e], m->klen[e]) & (nslots - 1);
        while (slot[i]) i = (i + 1) & (nslots - 1);
        slot[i] = (uint32_t)(e + 1);
    }
    free(m->slot);
    m->slot = slot;
    m->mask = nslots - 1;
    return 0;
}

int tk_strmap_init(tk_strmap *m, int64_t expected)
{
    memset(m, 0, sizeof *m);
    if (expected < 16) expected = 16;
    uint64_t ns = 32;
    while (ns < (uint64_t)expected * 2) ns *= 2;
    m->cap = expected;
    m->key = malloc((size_t)m->cap * sizeof *m->key);
    m->klen = malloc((size_t)m->cap * sizeof *m->klen);
    m->val = malloc((size_t)m->cap * sizeof *m->val);
    if (!m->key || !m->klen || !m->val) return -ENOMEM;
    return strmap_rehash(m, ns);
}

int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t n)
{
    if (!m->slot) return -1;
    uint64_t i = tk_hash(k, n) & m->mask;
    for (uint32_t e; (e = m->slot[i]) != 0; i = (i + 1) & m->mask) {
        e--;
        if (m->klen[e] == n && !memcmp(m->key[e], k, n)) return m->val[e];
    }
    return -1;
}

int tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t v)
{
    if (n > UINT32_MAX) return FT_E_RANGE;
    uint64_t i = tk_hash(k, n) & m->mask;
    for (uint32_t e; (e = m->slot[i]) != 0; i = (i + 1) & m->mask) {
        e--;
        if (m->klen[e] == n && !memcmp(m->key[e], k, n)) {
            m->val[e] = v;
            return 0;
        }
    }
    if (m->n == m->cap) {
        int64_t cap = m->cap * 2;
        const char **key = realloc(m->key, (size_t)cap * sizeof *key);
        if (key) m->key = key;
        uint32_t *klen = realloc(m->klen, (size_t)cap * sizeof *klen);
        if (klen) m->klen = klen;
        int32_t *val = realloc(m->val, (size_t)cap * sizeof *val);
        if (val) m->val = val;
        if (!key || !klen || !val) return -ENOMEM;
        m->cap = cap;
    }
    m->key[m->n] = k;
    m->klen[m->n] = (uint32_t)n;
    m->val[m->n] = v;
    m->n++;
    if ((uint64_t)m->n * 2 > m->mask + 1) return strmap_rehash(m, (m->mask + 1) * 2);
    m->slot[i] = (uint32_t)m->n;
    return 0;
}

void tk_strmap_free(tk_strmap *m)
{
    free(m->key);
    free(m->klen);
    free(m->val);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* ---- tk_pairmap ---------------------------------------------------------------------- */

#define TK_PAIR_EMPTY UINT64_MAX

static uint64_t pair_slot(uint64_t key, uint64_t mask)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (key ^ (key >> 32)) & mask;
}

int tk_pairmap_init(tk_pairmap *m, int64_t expected)
{
    memset(m, 0, sizeof *m);
    uint64_t ns = 64;
    while (ns < (uint64_t)expected * 2) ns *= 2;
    m->key = malloc(ns * sizeof *m->key);
    m->rank = malloc(ns * sizeof *m->rank);
    m->val = malloc(ns * sizeof *m->val);
    if (!m->key || !m->rank || !m->val) return -ENOMEM;
    memset(m->key, 0xff, ns * sizeof *m->key);
    m->mask = ns - 1;
    return 0;
}

/* The caller sized the map for all merges (expected), so the load stays <= 1/2. */
void tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t i = pair_slot(key, m->mask);
    while (m->key[i] != TK_PAIR_EMPTY && m->key[i] != key) i = (i + 1) & m->mask;
    if (m->key[i] == TK_PAIR_EMPTY) m->n++;
    m->key[i] = key;
    m->rank[i] = rank;
    m->val[i] = id;
}

int tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    if (!m->key) return 0;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = pair_slot(key, m->mask); m->key[i] != TK_PAIR_EMPTY; i = (i + 1) & m->mask) {
        if (m->key[i] == key) {
            *rank = m->rank[i];
            *id = m->val[i];
            return 1;
        }
    }
    return 0;
}

void tk_pairmap_free(tk_pairmap *m)
{
    free(m->key);
    free(m->rank);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

int tk_u8dec(const unsigned char *s, size_t n, int32_t *cp)
{
    unsigned c = s[0];
    int len;
    int32_t v, min;
    if (c < 0x80) { *cp = (int32_t)c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
    else { *cp = -1; return 1; }
    if ((size_t)len > n) { *cp = -1; return 1; }
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = -1; return 1; }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = -1; return 1; }
    *cp = v;
    return len;
}

int tk_u8len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80) return 1;
    int32_t cp;
    return tk_u8dec(s, n, &cp);
}

int tk_is_space(int32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- GPT-2 bytes_to_unicode ------------------------------------------------------------ */

static int printable_byte(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tk_byte_to_cp(uint8_t b)
{
    /* the 68 other bytes map to U+0100.. in increasing byte order: 0x00-0x20 (33),
     * 0x7F-0xA0 (34), 0xAD (1) */
    if (printable_byte(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    return 256u + 67u; /* 0xAD */
}

int tk_cp_to_byte(int32_t cp)
{
    if (cp >= 0 && cp < 256) return printable_byte((unsigned)cp) ? cp : -1;
    if (cp >= 256 && cp <= 288) return cp - 256;
    if (cp >= 289 && cp <= 322) return cp - 289 + 0x7F;
    if (cp == 323) return 0xAD;
    return -1;
}

/* ---- PCRE2 ------------------------------------------------------------------------------ */

int tk_re_compile(tk_re *re, const char *pat, size_t n, int literal, const char *where)
{
    int errcode;
    PCRE2_SIZE erroff;
    /* PCRE2_LITERAL refuses PCRE2_UCP (and needs no character classes) */
    uint32_t opt = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    re->code = pcre2_compile((PCRE2_SPTR)pat, n, opt, &errcode, &erroff, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return ft_err(FT_E_INVALID, "%s: regex does not compile at pattern offset %zu: %s",
                      where, (size_t)erroff, (const char *)msg);
    }
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* interpreter if JIT is absent */
    return 0;
}

void tk_re_free(tk_re *re)
{
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

int tk_re_next(const tk_re *re, pcre2_match_data *md, const char *s, size_t n, size_t from,
               size_t *ms, size_t *me)
{
    if (from > n) return 0;
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, 0, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return ft_err(FT_E_INVALID, "tokenizer regex: matching failed at byte %zu: %s", from,
                      (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}
