/* tok_bpe.c - the tokenizer model: vocabulary, merges and the merge loops.
 *
 * Two merge orders:
 *  - TK_MODEL_BPE: huggingface/tokenizers models/bpe (model.rs merge_word, word.rs merge_all):
 *    chars -> ids (byte_fallback "<0xHH>", unk/fuse_unk, or dropped), then repeatedly the
 *    adjacent pair of lowest merge rank, ties leftmost, via a heap with lazy invalidation.
 *  - TK_MODEL_SPM: llama.cpp llm_tokenizer_spm (GGUF "llama" vocabularies): chars, then
 *    repeatedly the adjacent pair whose concatenation is a vocabulary piece of highest score,
 *    ties leftmost; symbols that are not pieces are emitted as <0xHH> byte tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

/* ---- vocabulary and merges ------------------------------------------------------------ */

int tk_vocab_init(ft_tokenizer *t, int64_t n_vocab_hint)
{
    return tk_strmap_init(&t->vocab, n_vocab_hint);
}

int tk_vocab_add(ft_tokenizer *t, const char *s, size_t n, int64_t id, const char *where)
{
    if (id < 0 || id >= TK_MAX_ID)
        return ft_err(FT_E_INVALID, "%s: token id %lld is outside 0..%d", where, (long long)id,
                      TK_MAX_ID - 1);
    char *k = tk_arena_dup(&t->arena, s, n);
    if (!k) return -ENOMEM;
    return tk_strmap_put(&t->vocab, k, n, (int32_t)id);
}

int tk_merge_add(ft_tokenizer *t, const char *a, size_t an, const char *b, size_t bn,
                 uint32_t rank, const char *where)
{
    int32_t ia = tk_strmap_get(&t->vocab, a, an);
    int32_t ib = tk_strmap_get(&t->vocab, b, bn);
    if (ia < 0 || ib < 0)
        return ft_err(FT_E_INVALID, "%s: merge %u: token '%.*s' is not in the vocabulary", where,
                      rank, (int)(ia < 0 ? an : bn), ia < 0 ? a : b);
    char stackbuf[256];
    char *ab = an + bn <= sizeof stackbuf ? stackbuf : malloc(an + bn);
    if (!ab) return -ENOMEM;
    memcpy(ab, a, an);
    memcpy(ab + an, b, bn);
    int32_t id = tk_strmap_get(&t->vocab, ab, an + bn);
    int rc = 0;
    if (id < 0)
        rc = ft_err(FT_E_INVALID, "%s: merge %u: merged token '%.*s' is not in the vocabulary",
                    where, rank, (int)(an + bn), ab);
    else
        tk_pairmap_put(&t->merges, ia, ib, rank, id);
    if (ab != stackbuf) free(ab);
    return rc;
}

int tk_ids_finalize(ft_tokenizer *t, int64_t max_id)
{
    for (int64_t e = 0; e < t->vocab.n; e++)
        if (t->vocab.val[e] > max_id) max_id = t->vocab.val[e];
    t->n_ids = max_id + 1;
    t->id_str = calloc((size_t)t->n_ids + 1, sizeof *t->id_str);
    t->id_len = calloc((size_t)t->n_ids + 1, sizeof *t->id_len);
    if (!t->id_str || !t->id_len) return -ENOMEM;
    for (int64_t e = 0; e < t->vocab.n; e++) {
        t->id_str[t->vocab.val[e]] = t->vocab.key[e];
        t->id_len[t->vocab.val[e]] = t->vocab.klen[e];
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tk_strmap_get(&t->vocab, name, 6);
    }
    return 0;
}

/* ---- scratch: symbols and a min-heap ---------------------------------------------------- */

typedef struct tk_sym { int32_t id, prev, next; uint32_t off, len; } tk_sym; /* len 0 = merged away */
typedef struct tk_hitem { uint64_t key; int32_t a, b; } tk_hitem;          /* min (key) first */
typedef struct tk_heap { tk_hitem *v; int64_t n, cap; } tk_heap;

static int sym_reserve(tk_ctx *c, int64_t n)
{
    if (n <= c->cap_sym) return 0;
    int64_t cap = c->cap_sym ? c->cap_sym : 64;
    while (cap < n) cap *= 2;
    void *p = realloc(c->sym, (size_t)cap * sizeof(tk_sym));
    if (!p) return -ENOMEM;
    c->sym = p;
    c->cap_sym = cap;
    return 0;
}

static int heap_push(tk_ctx *c, tk_heap *h, uint64_t key, int32_t a, int32_t b)
{
    if (h->n == h->cap) {
        int64_t cap = h->cap ? h->cap * 2 : 64;
        void *p = realloc(h->v, (size_t)cap * sizeof *h->v);
        if (!p) return -ENOMEM;
        h->v = p;
        h->cap = cap;
        c->heap = p;
        c->cap_heap = cap;
    }
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (h->v[p].key <= key) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = (tk_hitem){key, a, b};
    return 0;
}

static tk_hitem heap_pop(tk_heap *h)
{
    tk_hitem top = h->v[0], last = h->v[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        tk_hitem best = last;
        if (l < h->n && h->v[l].key < best.key) { m = l; best = h->v[l]; }
        if (l + 1 < h->n && h->v[l + 1].key < best.key) m = l + 1;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static int sym_add(tk_ctx *c, int64_t *ns, int32_t id, uint32_t off, uint32_t len)
{
    FT_TRY(sym_reserve(c, *ns + 1));
    tk_sym *s = c->sym;
    s[*ns] = (tk_sym){id, (int32_t)(*ns - 1), -1, off, len};
    if (*ns > 0) s[*ns - 1].next = (int32_t)*ns;
    (*ns)++;
    return 0;
}

/* ---- BPE by merge rank ------------------------------------------------------------------ */

static int bpe_try_push(const ft_tokenizer *t, tk_ctx *c, tk_heap *h, int32_t pos)
{
    tk_sym *s = c->sym;
    if (pos < 0 || s[pos].next < 0) return 0;
    uint32_t rank;
    int32_t id;
    if (!tk_pairmap_get(&t->merges, s[pos].id, s[s[pos].next].id, &rank, &id)) return 0;
    return heap_push(c, h, (uint64_t)rank << 32 | (uint32_t)pos, id, 0);
}

static int bpe_word(const ft_tokenizer *t, tk_ctx *c, const char *w, size_t n)
{
    if (t->ignore_merges) {
        int32_t id = tk_strmap_get(&t->vocab, w, n);
        if (id >= 0) return tk_out_push(c, id);
    }
    int64_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_off = 0, unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t L = (uint32_t)tk_u8len((const unsigned char *)w + i, n - i);
        int32_t id = tk_strmap_get(&t->vocab, w + i, L);
        if (id >= 0) {
            if (unk >= 0) { FT_TRY(sym_add(c, &ns, unk, unk_off, unk_len)); unk = -1; }
            FT_TRY(sym_add(c, &ns, id, (uint32_t)i, L));
        } else {
            int bytes_ok = t->byte_fallback;
            for (uint32_t k = 0; bytes_ok && k < L; k++)
                bytes_ok = t->byte_id[(unsigned char)w[i + k]] >= 0;
            if (bytes_ok) {
                /* as tokenizers does, a pending unk is not flushed before byte tokens */
                for (uint32_t k = 0; k < L; k++)
                    FT_TRY(sym_add(c, &ns, t->byte_id[(unsigned char)w[i + k]], (uint32_t)(i + k), 1));
            } else if (t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk) {
                    unk_len += L;
                } else {
                    if (unk >= 0) FT_TRY(sym_add(c, &ns, unk, unk_off, unk_len));
                    unk = t->unk_id;
                    unk_off = (uint32_t)i;
                    unk_len = L;
                }
            } /* else: no unk token, the character is dropped (tokenizers does the same) */
        }
        i += L;
    }
    if (unk >= 0) FT_TRY(sym_add(c, &ns, unk, unk_off, unk_len));

    tk_heap h = {c->heap, 0, c->cap_heap};
    for (int32_t i = 0; i + 1 < ns; i++) FT_TRY(bpe_try_push(t, c, &h, i));
    while (h.n) {
        tk_hitem top = heap_pop(&h);
        tk_sym *s = c->sym;
        int32_t pos = (int32_t)(uint32_t)top.key;
        if (s[pos].len == 0 || s[pos].next < 0) continue;
        int32_t nx = s[pos].next;
        uint32_t rank;
        int32_t id;
        if (!tk_pairmap_get(&t->merges, s[pos].id, s[nx].id, &rank, &id) || id != top.a)
            continue; /* stale entry */
        s[pos].id = id;
        s[pos].len += s[nx].len;
        s[pos].next = s[nx].next;
        s[nx].len = 0;
        if (s[pos].next >= 0) s[s[pos].next].prev = pos;
        FT_TRY(bpe_try_push(t, c, &h, s[pos].prev));
        FT_TRY(bpe_try_push(t, c, &h, pos));
    }
    tk_sym *s = c->sym;
    for (int64_t i = 0; i < ns; i++)
        if (s[i].len) FT_TRY(tk_out_push(c, s[i].id));
    return 0;
}

/* ---- SentencePiece-style by piece score (llama.cpp llm_tokenizer_spm) -------------------- */

static uint32_t score_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* monotone in f */
    return ~u;                                       /* higher score -> smaller key */
}

static int spm_try_push(const ft_tokenizer *t, tk_ctx *c, tk_heap *h, const char *w,
                        int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return 0;
    tk_sym *s = c->sym;
    uint32_t size = s[l].len + s[r].len;
    int32_t id = tk_strmap_get(&t->vocab, w + s[l].off, size);
    if (id < 0 || id >= t->n_ids) return 0;
    float sc = t->score ? t->score[id] : 0.0f;
    return heap_push(c, h, (uint64_t)score_key(sc) << 32 | (uint32_t)l, r, (int32_t)size);
}

static int spm_emit_bytes(const ft_tokenizer *t, tk_ctx *c, const char *p, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        int32_t id = t->byte_id[(unsigned char)p[k]];
        if (id < 0) id = tk_strmap_get(&t->vocab, p + k, 1);
        if (id < 0) id = t->unk_id;
        if (id >= 0) FT_TRY(tk_out_push(c, id));
    }
    return 0;
}

static int spm_word(const ft_tokenizer *t, tk_ctx *c, const char *w, size_t n)
{
    int64_t ns = 0;
    for (size_t i = 0; i < n;) {
        uint32_t L = (uint32_t)tk_u8len((const unsigned char *)w + i, n - i);
        FT_TRY(sym_add(c, &ns, -1, (uint32_t)i, L));
        i += L;
    }
    tk_heap h = {c->heap, 0, c->cap_heap};
    for (int32_t i = 1; i < ns; i++) FT_TRY(spm_try_push(t, c, &h, w, i - 1, i));
    while (h.n) {
        tk_hitem top = heap_pop(&h);
        tk_sym *s = c->sym;
        int32_t l = (int32_t)(uint32_t)top.key, r = top.a;
        if (s[l].len == 0 || s[r].len == 0 || s[l].len + s[r].len != (uint32_t)top.b) continue;
        s[l].len += s[r].len;
        s[r].len = 0;
        s[l].next = s[r].next;
        if (s[r].next >= 0) s[s[r].next].prev = l;
        FT_TRY(spm_try_push(t, c, &h, w, s[l].prev, l));
        FT_TRY(spm_try_push(t, c, &h, w, l, s[l].next));
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = ((tk_sym *)c->sym)[i].next) {
        tk_sym *s = c->sym;
        int32_t id = tk_strmap_get(&t->vocab, w + s[i].off, s[i].len);
        if (id >= 0) FT_TRY(tk_out_push(c, id));
        else FT_TRY(spm_emit_bytes(t, c, w + s[i].off, s[i].len));
    }
    return 0;
}

int tk_model_word(const ft_tokenizer *t, tk_ctx *c, size_t off, size_t n)
{
    if (n == 0) return 0;
    if (n > UINT32_MAX / 2) return ft_err(FT_E_RANGE, "tokenizer: a single word of %zu bytes", n);
    const char *w = c->w.p + off; /* c->w is not modified below */
    if (!c->cache) return t->model == TK_MODEL_SPM ? spm_word(t, c, w, n) : bpe_word(t, c, w, n);
    const int32_t *hit;
    int64_t k, n0 = c->n_out;
    if (tk_cache_get(c->cache, w, n, &hit, &k)) {
        for (int64_t i = 0; i < k; i++) FT_TRY(tk_out_push(c, hit[i]));
        return 0;
    }
    FT_TRY(t->model == TK_MODEL_SPM ? spm_word(t, c, w, n) : bpe_word(t, c, w, n));
    tk_cache_put(c->cache, w, n, c->out + n0, c->n_out - n0);
    return 0;
}
