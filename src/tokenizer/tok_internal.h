/* tok_internal.h - internals shared by the tokenizer files (tokenizer.c, tok_*.c); not a
 * public interface. The pipeline follows huggingface/tokenizers (formats.md 6):
 *   added tokens (normalized:false) -> normalizers per piece -> added tokens (normalized:true)
 *   -> pre-tokenizers -> model (BPE by merge rank, or SentencePiece-style by piece score)
 *   -> post-processor (prefix/suffix ids, only when add_special).
 * All text is UTF-8 bytes; pieces are byte ranges of one growing work buffer.
 */
#ifndef FT_TOK_INTERNAL_H
#define FT_TOK_INTERNAL_H

#include <locale.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "src/core/hash.h"
#include "src/core/utf8.h"
#include "src/tokenizer/tokenizer.h"

#define TK_MAX_ID (1 << 26)      /* sanity cap on token ids (allocation guard) */
#define TK_MAX_STAGES 32         /* normalizers / pre-tokenizers / decoders after flattening */

/* ---- small containers (tok_util.c) ------------------------------------------------ */

typedef struct tk_buf { char *p; size_t n, cap; } tk_buf;
int tk_buf_reserve(tk_buf *b, size_t extra);
int tk_buf_put(tk_buf *b, const void *s, size_t n);  /* s must not point into b */
int tk_buf_putc(tk_buf *b, char c);
void tk_buf_free(tk_buf *b);

/* Stable-pointer string arena (blocks are never moved). */
typedef struct tk_arena { char **blk; int64_t n_blk; size_t used, cap; } tk_arena;
char *tk_arena_dup(tk_arena *a, const char *s, size_t n); /* NUL-terminated copy or NULL */
void tk_arena_free(tk_arena *a);

/* String -> int32 hash map; keys are borrowed (must outlive the map). */
typedef struct tk_strmap {
    const char **key; uint32_t *klen; int32_t *val;
    int64_t n, cap;
    uint32_t *slot; uint64_t mask;  /* slot = entry index + 1, 0 = empty */
} tk_strmap;
int tk_strmap_init(tk_strmap *m, int64_t expected);
int tk_strmap_put(tk_strmap *m, const char *k, size_t n, int32_t v); /* overwrites */
int32_t tk_strmap_get(const tk_strmap *m, const char *k, size_t n);  /* -1 if absent */
void tk_strmap_free(tk_strmap *m);

/* (id_a, id_b) -> (rank, merged id) for BPE merges. */
typedef struct tk_pairmap { uint64_t *key; uint32_t *rank; int32_t *val; uint64_t mask; int64_t n; } tk_pairmap;
int tk_pairmap_init(tk_pairmap *m, int64_t expected);
void tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id); /* overwrites */
int tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id);
void tk_pairmap_free(tk_pairmap *m);

/* UTF-8: length of the character at s (1..4; 1 for an invalid or truncated sequence). */
int tk_u8len(const unsigned char *s, size_t n);
/* Decodes one character; *cp = -1 when invalid (length 1). */
int tk_u8dec(const unsigned char *s, size_t n, int32_t *cp);
int tk_is_space(int32_t cp);  /* Unicode White_Space */

/* GPT-2 bytes_to_unicode: byte -> code point (U+0021.. / U+0100..U+0143), and inverse. */
uint32_t tk_byte_to_cp(uint8_t b);
int tk_cp_to_byte(int32_t cp); /* -1 if cp is not in the table */

/* PCRE2 regex compiled once (UTF, UCP, MATCH_INVALID_UTF; JIT when available). */
typedef struct tk_re { pcre2_code *code; } tk_re;
/* Compiles pat (literal if `literal`); on error records "<where>: ..." and returns FT_E_INVALID. */
int tk_re_compile(tk_re *re, const char *pat, size_t n, int literal, const char *where);
void tk_re_free(tk_re *re);
/* Finds the next match at or after `from`: 1 found (*ms,*me), 0 none, FT_E_INVALID on engine error. */
int tk_re_next(const tk_re *re, pcre2_match_data *md, const char *s, size_t n, size_t from,
               size_t *ms, size_t *me);

/* ---- tokenizer object -------------------------------------------------------------- */

enum { TK_MODEL_BPE = 1, TK_MODEL_SPM = 2 };
enum { TK_NORM_PREPEND = 1, TK_NORM_REPLACE, TK_NORM_NFC, TK_NORM_LOWER };
enum { TK_PRE_SPLIT = 1, TK_PRE_BYTELEVEL, TK_PRE_METASPACE };
enum { TK_SPLIT_REMOVED = 1, TK_SPLIT_ISOLATED, TK_SPLIT_PREV, TK_SPLIT_NEXT, TK_SPLIT_CONTIG };
enum { TK_PREPEND_ALWAYS = 0, TK_PREPEND_FIRST, TK_PREPEND_NEVER };
enum { TK_DEC_BYTELEVEL = 1, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP,
       TK_DEC_METASPACE };

typedef struct tk_norm {
    int type;
    char *a; size_t a_n;     /* Prepend: text; Replace: literal pattern (when re is unset) */
    char *b; size_t b_n;     /* Replace: content */
    tk_re re;                /* Replace with a Regex pattern */
} tk_norm;

typedef struct tk_pre {
    int type;
    tk_re re;                /* Split pattern; ByteLevel: GPT-2 regex when use_regex */
    int behavior, invert;    /* Split */
    int add_prefix_space, use_regex; /* ByteLevel */
    char repl[8]; int repl_n; int prepend_scheme, split; /* Metaspace */
} tk_pre;

typedef struct tk_dec {
    int type;
    char *a; size_t a_n;     /* Replace pattern */
    char *b; size_t b_n;     /* Replace content */
    int32_t ch;              /* Strip content / Metaspace replacement (code point) */
    int start, stop;         /* Strip */
    int prepend_scheme;      /* Metaspace */
} tk_dec;

typedef struct tk_added {
    const char *content; size_t n;   /* as written */
    const char *pat; size_t pat_n;   /* matched form: content, or normalized content */
    int32_t id;
    uint8_t single_word, lstrip, rstrip, normalized, special;
} tk_added;

/* Added-token matcher: indices into added[], grouped by first byte, longest first. */
typedef struct tk_matcher { int32_t *idx; int32_t first[257]; int any; } tk_matcher;

struct ft_tokenizer {
    int model;                       /* TK_MODEL_* */
    tk_arena arena;
    /* model vocabulary */
    tk_strmap vocab;                 /* piece -> id */
    int64_t n_ids;                   /* max id + 1 over vocab and added tokens */
    const char **id_str; uint32_t *id_len; /* n_ids; model vocab string or NULL */
    float *score;                    /* n_ids (SPM) */
    tk_pairmap merges;               /* BPE */
    int32_t unk_id;                  /* -1 if none */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256];            /* "<0xHH>" ids or -1 */
    /* added tokens */
    tk_added *added; int64_t n_added;
    int32_t *added_of_id;            /* n_ids: index into added[] or -1 */
    tk_strmap added_map;             /* content -> id */
    tk_matcher m_raw, m_norm;        /* normalized:false / normalized:true */
    tk_re re_word;                   /* \w, for single_word tokens */
    int has_single_word;
    /* pipeline */
    tk_norm norm[TK_MAX_STAGES]; int n_norm;
    locale_t lower_loc;              /* C.UTF-8 for Lowercase, or (locale_t)0 */
    tk_pre pre[TK_MAX_STAGES]; int n_pre;
    tk_dec dec[TK_MAX_STAGES]; int n_dec; int has_decoder;
    int32_t *post_pre, *post_suf; int64_t n_post_pre, n_post_suf; /* added when add_special */
    int32_t post_bos;                /* first special id of the template, or -1 */
    /* tokenizer_config.json / spec */
    int32_t bos, eos;
    const char *bos_str, *eos_str;   /* "" if none */
    const char *chat_template;       /* NULL if none */
    int chat_detected;               /* enum ft_chat_template that auto resolves to for
                                      * chat_template (ft_tok_set_chat_kind: the loader's
                                      * ft_chat_template_resolve, once); 0, FT_CHAT_AUTO, before */
};

/* Work state of one encode call (encode is reentrant: the tokenizer is read-only). */
typedef struct tk_piece { size_t off, n; int32_t id; uint8_t origin0; } tk_piece;
typedef struct tk_pieces { tk_piece *v; int64_t n, cap; } tk_pieces;
typedef struct tk_ctx {
    tk_buf w;                        /* all piece text */
    tk_pieces a, b;                  /* current / next piece lists */
    pcre2_match_data *md;
    int32_t *out; int64_t n_out, cap_out;
    void *sym; int64_t cap_sym;      /* model scratch */
    void *heap; int64_t cap_heap;
    void *seg; int64_t cap_seg;      /* split segments scratch */
    tk_buf t1, t2;                   /* normalizer scratch */
    ft_tok_cache *cache;             /* the model step's word cache, or NULL (tok_cache.c) */
} tk_ctx;

int tk_pieces_push(tk_pieces *p, size_t off, size_t n, int32_t id, int origin0);
int tk_out_push(tk_ctx *c, int32_t id);

/* tok_pretok.c */
int tk_split_added(const ft_tokenizer *t, tk_ctx *c, const tk_matcher *m); /* a -> a */
int tk_normalize_pieces(const ft_tokenizer *t, tk_ctx *c);                 /* a -> a */
int tk_pretokenize(const ft_tokenizer *t, tk_ctx *c);                      /* a -> a */
/* Runs the normalizer chain on s; result appended to out. */
int tk_normalize_str(const ft_tokenizer *t, tk_ctx *c, const char *s, size_t n, tk_buf *out);

/* tok_cache.c: 1 and the word's cached ids (valid until the next put), or 0 */
int tk_cache_get(ft_tok_cache *c, const char *w, size_t n, const int32_t **ids, int64_t *n_ids);
void tk_cache_put(ft_tok_cache *c, const char *w, size_t n, const int32_t *ids, int64_t n_ids);

/* tok_bpe.c */
int tk_model_word(const ft_tokenizer *t, tk_ctx *c, size_t off, size_t n); /* ids -> c->out */
int tk_vocab_init(ft_tokenizer *t, int64_t n_vocab_hint);
int tk_vocab_add(ft_tokenizer *t, const char *s, size_t n, int64_t id, const char *where);
int tk_ids_finalize(ft_tokenizer *t, int64_t max_id); /* id arrays, byte ids */
/* Adds merge (a, b) with rank; a+b must be in the vocabulary. */
int tk_merge_add(ft_tokenizer *t, const char *a, size_t an, const char *b, size_t bn,
                 uint32_t rank, const char *where);

/* tokenizer.c */
int tk_added_add(ft_tokenizer *t, const char *content, size_t n, int64_t json_id, int single_word,
                 int lstrip, int rstrip, int normalized, int special, const char *where);
int tk_finalize(ft_tokenizer *t, const char *where); /* matchers, normalized patterns, BOS/EOS,
                                                      * the chat template's kind */
ft_tokenizer *tk_new(void);
const char *tk_id_text(const ft_tokenizer *t, int32_t id, size_t *n); /* added first, then vocab */
int tk_set_str(ft_tokenizer *t, const char **dst, const char *s);

/* tok_util.c: GPT-2 ByteLevel regex and other fixed patterns. */
extern const char TK_RE_GPT2[];
extern const char TK_RE_LLAMA3[];
extern const char TK_RE_QWEN2[];

#endif
