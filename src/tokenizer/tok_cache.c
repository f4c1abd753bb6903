/* tok_cache.c - a word -> token ids cache for the tokenizer model step (tokenizer.h
 * ft_tok_cache). The model's output for a pre-tokenized word depends on the word's bytes
 * alone, and natural text repeats its words, so huggingface/tokenizers keeps such a cache in
 * its BPE model (tokenizers/src/models/bpe/model.rs: `cache`, 10,000 words by default, words
 * longer than a limit are not cached). Ours: an open-addressing table of FNV-1a hashes over
 * a byte arena of keys and an int32 arena of ids; when it is full it is emptied and refilled
 * (bounded memory, and it follows a corpus whose vocabulary drifts). One cache serves one
 * thread at a time.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

#define TC_MAX_WORD 64 /* bytes: longer words are rare and not worth a slot */

typedef struct tc_entry {
    uint64_t hash;
    uint32_t key_off, ids_off; /* into keys / ids */
    uint16_t key_len, n_ids;
} tc_entry;

struct ft_tok_cache {
    uint32_t *slot;            /* entry index + 1; 0 = empty */
    uint64_t mask;
    tc_entry *e;
    int64_t n, max;            /* entries, and the most before a reset */
    char *keys;
    size_t keys_n, keys_cap;
    int32_t *ids;
    size_t ids_n, ids_cap;
    uint64_t hits, misses, resets;
};

static uint64_t fnv1a(const char *s, size_t n) { return ft_fnv1a64(FT_FNV64_OFFSET, s, n); }

ft_tok_cache *ft_tok_cache_new(int64_t max_words)
{
    if (max_words < 16) max_words = 16;
    if (max_words > (1 << 24)) max_words = 1 << 24;
    ft_tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    uint64_t slots = 1;
    while (slots < (uint64_t)max_words * 2) slots <<= 1; /* load factor at most 1/2 */
    c->mask = slots - 1;
    c->max = max_words;
    c->keys_cap = (size_t)max_words * 12; /* about 6 bytes per word; a reset when they run out */
    c->ids_cap = (size_t)max_words * 3;
    c->slot = calloc(slots, sizeof *c->slot);
    c->e = malloc((size_t)max_words * sizeof *c->e);
    c->keys = malloc(c->keys_cap);
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    if (!c->slot || !c->e || !c->keys || !c->ids) {
        ft_tok_cache_free(c);
        return NULL;
    }
    return c;
}

void ft_tok_cache_free(ft_tok_cache *c)
{
    if (!c) return;
    free(c->slot);
    free(c->e);
    free(c->keys);
    free(c->ids);
    free(c);
}

void ft_tok_cache_stats(const ft_tok_cache *c, uint64_t *hits, uint64_t *misses, uint64_t *resets)
{
    *hits = c ? c->hits : 0;
    *misses = c ? c->misses : 0;
    *resets = c ? c->resets : 0;
}

static void reset(ft_tok_cache *c)
{
    memset(c->slot, 0, (size_t)(c->mask + 1) * sizeof *c->slot);
    c->n = 0;
    c->keys_n = c->ids_n = 0;
    c->resets++;
}

int tk_cache_get(ft_tok_cache *c, const char *w, size_t n, const int32_t **ids, int64_t *n_ids)
{
    if (n > TC_MAX_WORD) return 0;
    uint64_t h = fnv1a(w, n);
    for (uint64_t i = h & c->mask; c->slot[i]; i = (i + 1) & c->mask) {
        const tc_entry *e = &c->e[c->slot[i] - 1];
        if (e->hash == h && e->key_len == n && !memcmp(c->keys + e->key_off, w, n)) {
            *ids = c->ids + e->ids_off;
            *n_ids = e->n_ids;
            c->hits++;
            return 1;
        }
    }
    c->misses++;
    return 0;
}

void tk_cache_put(ft_tok_cache *c, const char *w, size_t n, const int32_t *ids, int64_t n_ids)
{
    if (n > TC_MAX_WORD || n_ids > UINT16_MAX || (size_t)n_ids > c->ids_cap || n > c->keys_cap)
        return;
    if (c->n == c->max || c->keys_n + n > c->keys_cap || c->ids_n + (size_t)n_ids > c->ids_cap)
        reset(c);
    uint64_t h = fnv1a(w, n), i = h & c->mask;
    while (c->slot[i]) i = (i + 1) & c->mask; /* callers put only what get missed */
    tc_entry *e = &c->e[c->n];
    *e = (tc_entry){h, (uint32_t)c->keys_n, (uint32_t)c->ids_n, (uint16_t)n, (uint16_t)n_ids};
    memcpy(c->keys + c->keys_n, w, n);
    if (n_ids) memcpy(c->ids + c->ids_n, ids, (size_t)n_ids * sizeof *ids);
    c->keys_n += n;
    c->ids_n += (size_t)n_ids;
    c->slot[i] = (uint32_t)(++c->n);
}
