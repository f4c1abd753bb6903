/* tokenizer.h - Hugging Face tokenizer.json BPE (formats.md 6), both families:
 *   - SentencePiece-style (Llama-2, TinyLlama, Mistral): Prepend/Replace normalizers or
 *     Metaspace pre-tokenizer, byte_fallback <0xHH>, unk/fuse_unk;
 *   - byte-level (Llama-3, Qwen2, SmolLM, GPT-2): Split(Regex) / ByteLevel(use_regex) /
 *     Digits pre-tokenizers with PCRE2 regexes, GPT-2 bytes_to_unicode, ignore_merges.
 * Added/special tokens are matched before normalization; TemplateProcessing adds BOS when
 * add_special is set. Also built from GGUF metadata (tokenizer.ggml.*) via ft_tok_spec.
 */
#ifndef FT_TOKENIZER_H
#define FT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ft_tokenizer ft_tokenizer;

/* Loads DIR/tokenizer.json and (optional) DIR/tokenizer_config.json (bos/eos tokens,
 * add_bos_token, chat_template). Returns 0, -errno, FT_E_INVALID (message names the file
 * and what is wrong), FT_E_UNSUPPORTED (model type other than BPE, unknown normalizer or
 * pre-tokenizer type). */
int ft_tok_load_dir(ft_tokenizer **out, const char *dir);

/* A tokenizer described by plain arrays, as GGUF stores it (formats.md 4.3;
 * llama.cpp tokenizer.ggml.* keys). Strings are UTF-8, NUL-terminated; all are copied. */
typedef struct ft_tok_spec {
    const char *model;          /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SPM) */
    const char *pre;            /* tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "gpt2", "default", ... */
    int64_t n_tokens;
    const char *const *tokens;  /* n_tokens strings, id order */
    const float *scores;        /* n_tokens or NULL (SPM merge priority) */
    const int32_t *token_type;  /* n_tokens or NULL: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
    int64_t n_merges;
    const char *const *merges;  /* "a b" strings, rank order (byte-level BPE) */
    int64_t bos_id, eos_id, unk_id, pad_id; /* -1 if absent */
    int add_bos;                /* tokenizer.ggml.add_bos_token */
    int add_eos;                /* tokenizer.ggml.add_eos_token */
    int add_space_prefix;       /* tokenizer.ggml.add_space_prefix (SPM) */
    const char *chat_template;  /* tokenizer.chat_template or NULL */
} ft_tok_spec;

/* Builds a tokenizer from a spec. Returns 0, -ENOMEM, FT_E_INVALID (also a bos_id, eos_id
 * or unk_id other than -1 that is no id of the n_tokens: "tokenizer.ggml.bos_token_id = N
 * is no token of the vocabulary ..."), FT_E_UNSUPPORTED (unknown model/pre type, named in
 * the message). */
int ft_tok_from_spec(ft_tokenizer **out, const ft_tok_spec *spec);

void ft_tok_free(ft_tokenizer *t); /* NULL-safe */

/* Encodes len bytes of UTF-8 text. Special/added tokens written literally in the text are
 * recognized (as HF does). If add_special, the post-processor's tokens (BOS) are added.
 * *ids is malloc'ed (caller frees), *n its length. Returns 0, -ENOMEM, FT_E_INVALID
 * (invalid UTF-8 is not an error: bytes go through byte fallback / byte-level). */
int ft_tok_encode(const ft_tokenizer *t, const char *text, size_t len, int add_special,
                  int32_t **ids, int64_t *n);

/* A word -> ids cache of the model step (src/tokenizer/tok_cache.c; huggingface/tokenizers keeps
 * one in its BPE model): a pre-tokenized word's ids depend on its bytes alone, so a repeated
 * word is looked up instead of merged again. Bounded (max_words entries, words of at most 64
 * bytes; emptied when full). Its keys are the words' bytes only: a cache serves one tokenizer.
 * Not thread-safe: one cache per thread. A tokenizer without a pre-tokenizer (Llama-2's
 * tokenizer.json) gives whole segments as one "word", mostly longer than 64 bytes: there it
 * rarely hits. NULL when out of memory. */
typedef struct ft_tok_cache ft_tok_cache;
ft_tok_cache *ft_tok_cache_new(int64_t max_words);
void ft_tok_cache_free(ft_tok_cache *c); /* NULL-safe */
/* Lookups that found / did not find their word, and the times a full cache was emptied. */
void ft_tok_cache_stats(const ft_tok_cache *c, uint64_t *hits, uint64_t *misses, uint64_t *resets);

/* ft_tok_encode through cache c (NULL: none): the same ids, faster on text that repeats its
 * words. The same errors. */
int ft_tok_encode_cached(const ft_tokenizer *t, ft_tok_cache *c, const char *text, size_t len,
                         int add_special, int32_t **ids, int64_t *n);

/* A memo of one text's pieces for encoding that text's prefixes (src/tokenizer/tokenizer.c): the
 * encode pipeline splits a text at the added tokens written in it (formats.md 6) and runs
 * every later stage (normalizer, pre-tokenizer, model) on each piece alone, so a prefix
 * text[0, b) shares its pieces with text up to the one that b cuts (or an added token near
 * b that no longer matches), and their ids. ft_tok_encode_memo with an empty memo encodes
 * text and records its pieces; a later call with the same text pointer, the same add_special
 * and len no greater than the first call's encodes only the pieces that differ. The ids are
 * always those of ft_tok_encode. The caller must not change the text between the calls
 * and must use one memo with one tokenizer until it is reset (the memo compares places, not
 * bytes, and keeps no tokenizer). ft_tok_memo_reset empties it; NULL when out of
 * memory. Not thread-safe: one memo per thread. */
typedef struct ft_tok_memo ft_tok_memo;
ft_tok_memo *ft_tok_memo_new(void);
void ft_tok_memo_reset(ft_tok_memo *m); /* NULL-safe */
void ft_tok_memo_free(ft_tok_memo *m);  /* NULL-safe */

/* ft_tok_encode_cached through memo m (NULL: none), above. The same ids and errors. */
int ft_tok_encode_memo(const ft_tokenizer *t, ft_tok_cache *c, ft_tok_memo *m, const char *text,
                       size_t len, int add_special, int32_t **ids, int64_t *n);

/* Decodes ids to UTF-8 (malloc'ed, NUL-terminated). skip_special drops special tokens. */
int ft_tok_decode(const ft_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                  char **text);

/* The bytes one token contributes to decoded text, for per-token output (log-probabilities):
 * the decoder chain of ft_tok_decode applied to the token alone, as a token in the middle of
 * a text: byte-level characters mapped back to their bytes, <0xHH> byte-fallback pieces to
 * their byte, Replace and Metaspace applied with the space they write before a word kept
 * (the Metaspace prepend of a text's first token, and a Strip after Fuse, act only at the
 * start of the whole text, so they are skipped: Llama-2's "▁Hello" gives " Hello"). The
 * bytes are raw: a piece of a multi-byte character is not valid UTF-8 alone (OpenAI's
 * "bytes"; the caller replaces what is invalid when it needs text). A special added token
 * gives its content as written. *bytes is malloc'ed (NUL-terminated, caller frees; "" for a
 * token of no bytes), *n its length. Returns 0, -ENOMEM, FT_E_INVALID (NULL arguments, an id
 * outside the vocabulary). */
int ft_tok_token_bytes(const ft_tokenizer *t, int32_t id, char **bytes, size_t *n);

/* s[0..n) as valid UTF-8: each maximal invalid subpart replaced by U+FFFD, as Rust's
 * String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do (what
 * ft_tok_decode does to its output). *out is malloc'ed (NUL-terminated), *out_n its length
 * (may be NULL). Returns 0 or -ENOMEM. */
int ft_tok_utf8_lossy(const char *s, size_t n, char **out, size_t *out_n);

/* Id of a token string (vocab or added token), or -1. */
int32_t ft_tok_id(const ft_tokenizer *t, const char *token);
/* Token string of an id (NULL if out of range). Points into the tokenizer. */
const char *ft_tok_str(const ft_tokenizer *t, int32_t id);

int64_t ft_tok_vocab_size(const ft_tokenizer *t); /* max id + 1 over vocab and added tokens */
int32_t ft_tok_bos(const ft_tokenizer *t);        /* -1 if none */
int32_t ft_tok_eos(const ft_tokenizer *t);        /* -1 if none */
const char *ft_tok_bos_str(const ft_tokenizer *t); /* "" if none */
const char *ft_tok_eos_str(const ft_tokenizer *t); /* "" if none */
const char *ft_tok_chat_template(const ft_tokenizer *t); /* NULL if none */
/* The enum ft_chat_template (src/template/chat.h) that FT_CHAT_AUTO resolves to for t's
 * chat_template, as its loader worked it out once (ft_chat_template_resolve, a higher layer:
 * the tokenizer does not render templates); 0 (FT_CHAT_AUTO) until set: not resolved. */
void ft_tok_set_chat_kind(ft_tokenizer *t, int kind);
int ft_tok_chat_kind(const ft_tokenizer *t);

#endif
