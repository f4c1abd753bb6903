/* tokenizer.c - the encode pipeline, added tokens, finalization and accessors
 * (tokenizer.h; formats.md 6). Loading lives in tok_json.c (tokenizer.json) and tok_spec.c
 * (GGUF arrays); pieces of the pipeline in tok_pretok.c, tok_bpe.c and tok_decode.c.
 *
 * Limits, documented here once: the NFC normalizer is utf8proc's (Unicode 15; a character
 * newer than that is left as it is, where tokenizers may compose it); the
 * Lowercase normalizer uses the C.UTF-8 locale's case table (towlower_l) and falls back to
 * a small table (ASCII, Latin-1/Extended-A, Greek, Cyrillic) where that locale is missing;
 * BPE dropout, truncation and padding in tokenizer.json are ignored.
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/tokenizer/tok_internal.h"

ft_tokenizer *tk_new(void)
{
    ft_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->unk_id = -1;
    t->bos = t->eos = -1;
    t->post_bos = -1;
    t->bos_str = t->eos_str = "";
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    if (tk_strmap_init(&t->added_map, 64) < 0) {
        free(t);
        return NULL;
    }
    return t;
}

int tk_set_str(ft_tokenizer *t, const char **dst, const char *s)
{
    char *p = tk_arena_dup(&t->arena, s, strlen(s));
    if (!p) return -ENOMEM;
    *dst = p;
    return 0;
}

void ft_tok_free(ft_tokenizer *t)
{
    if (!t) return;
    tk_strmap_free(&t->vocab);
    tk_strmap_free(&t->added_map);
    tk_pairmap_free(&t->merges);
    free(t->id_str);
    free(t->id_len);
    free(t->score);
    free(t->added);
    free(t->added_of_id);
    free(t->m_raw.idx);
    free(t->m_norm.idx);
    tk_re_free(&t->re_word);
    if (t->lower_loc) freelocale(t->lower_loc);
    for (int i = 0; i < t->n_norm; i++) tk_re_free(&t->norm[i].re);
    for (int i = 0; i < t->n_pre; i++) tk_re_free(&t->pre[i].re);
    free(t->post_pre);
    free(t->post_suf);
    tk_arena_free(&t->arena);
    free(t);
}

/* ---- added tokens ------------------------------------------------------------------------- */

int tk_added_add(ft_tokenizer *t, const char *content, size_t n, int64_t json_id, int single_word,
                 int lstrip, int rstrip, int normalized, int special, const char *where)
{
    if (n == 0) return 0; /* tokenizers ignores empty added tokens */
    /* tokenizers keeps the id of a token already in the model vocabulary (AddedVocabulary
     * add_tokens); otherwise the file's id is used */
    int64_t id = tk_strmap_get(&t->vocab, content, n);
    if (id < 0) id = tk_strmap_get(&t->added_map, content, n);
    if (id < 0) id = json_id;
    if (id < 0 || id >= TK_MAX_ID)
        return ft_err(FT_E_INVALID, "%s: added token '%.*s': id %lld is outside 0..%d", where,
                      (int)(n > 64 ? 64 : n), content, (long long)json_id, TK_MAX_ID - 1);
    tk_added *a = NULL;
    if (tk_strmap_get(&t->added_map, content, n) >= 0) /* a repeated token: update it */
        for (int64_t i = 0; i < t->n_added; i++)
            if (t->added[i].n == n && !memcmp(t->added[i].content, content, n)) a = &t->added[i];
    if (!a) {
        tk_added *v = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *v);
        if (!v) return -ENOMEM;
        t->added = v;
        a = &t->added[t->n_added++];
        memset(a, 0, sizeof *a);
        char *k = tk_arena_dup(&t->arena, content, n);
        if (!k) return -ENOMEM;
        a->content = a->pat = k;
        a->n = a->pat_n = n;
    }
    a->id = (int32_t)id;
    a->single_word = (uint8_t)!!single_word;
    a->lstrip = (uint8_t)!!lstrip;
    a->rstrip = (uint8_t)!!rstrip;
    a->normalized = (uint8_t)!!normalized;
    a->special = (uint8_t)!!special;
    return tk_strmap_put(&t->added_map, a->content, n, a->id);
}

typedef struct { unsigned first; size_t len; int32_t idx; } tk_mkey;

static int mkey_cmp(const void *x, const void *y)
{
    const tk_mkey *a = x, *b = y;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->idx < b->idx ? -1 : (a->idx > b->idx);
}

static int build_matcher(ft_tokenizer *t, tk_matcher *m, int normalized)
{
    tk_mkey *k = malloc((size_t)(t->n_added + 1) * sizeof *k);
    m->idx = malloc((size_t)(t->n_added + 1) * sizeof *m->idx);
    if (!k || !m->idx) { free(k); return -ENOMEM; }
    int32_t n = 0;
    for (int64_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].pat_n > 0)
            k[n++] = (tk_mkey){(unsigned char)t->added[i].pat[0], t->added[i].pat_n, (int32_t)i};
    qsort(k, (size_t)n, sizeof *k, mkey_cmp);
    int32_t j = 0;
    for (unsigned b = 0; b <= 256; b++) {
        m->first[b] = j;
        while (b < 256 && j < n && k[j].first == b) { m->idx[j] = k[j].idx; j++; }
    }
    m->any = n > 0;
    free(k);
    return 0;
}

static void ctx_free(tk_ctx *c)
{
    tk_buf_free(&c->w);
    tk_buf_free(&c->t1);
    tk_buf_free(&c->t2);
    free(c->a.v);
    free(c->b.v);
    free(c->out);
    free(c->sym);
    free(c->heap);
    free(c->seg);
    if (c->md) pcre2_match_data_free(c->md);
}

int tk_finalize(ft_tokenizer *t, const char *where)
{
    int64_t max_id = -1;
    for (int64_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    FT_TRY(tk_ids_finalize(t, max_id));
    t->added_of_id = malloc((size_t)t->n_ids * sizeof *t->added_of_id);
    if (!t->added_of_id) return -ENOMEM;
    for (int64_t i = 0; i < t->n_ids; i++) t->added_of_id[i] = -1;
    for (int64_t i = 0; i < t->n_added; i++) t->added_of_id[t->added[i].id] = (int32_t)i;

    /* normalized added tokens are matched in their normalized form (refresh_added_tokens) */
    tk_ctx c = {0};
    int rc = 0;
    if (!(c.md = pcre2_match_data_create(1, NULL))) return -ENOMEM;
    for (int64_t i = 0; i < t->n_added && rc == 0; i++) {
        tk_added *a = &t->added[i];
        if (!a->normalized || !t->n_norm) continue;
        tk_buf out = {0};
        rc = tk_normalize_str(t, &c, a->content, a->n, &out);
        if (rc == 0 && (out.n != a->n || memcmp(out.p, a->content, a->n))) {
            char *p = tk_arena_dup(&t->arena, out.p ? out.p : "", out.n);
            if (!p) rc = -ENOMEM;
            else { a->pat = p; a->pat_n = out.n; }
        }
        tk_buf_free(&out);
    }
    ctx_free(&c);
    FT_TRY(rc);
    FT_TRY(build_matcher(t, &t->m_raw, 0));
    FT_TRY(build_matcher(t, &t->m_norm, 1));
    for (int64_t i = 0; i < t->n_added; i++) t->has_single_word |= t->added[i].single_word;
    if (t->has_single_word) FT_TRY(tk_re_compile(&t->re_word, "\\w", 2, 0, where));

    /* BOS/EOS: configured strings, else the post-processor's first special token for BOS */
    if (t->bos < 0 && t->bos_str[0]) t->bos = ft_tok_id(t, t->bos_str);
    if (t->bos < 0 && !t->bos_str[0]) t->bos = t->post_bos;
    if (t->eos < 0 && t->eos_str[0]) t->eos = ft_tok_id(t, t->eos_str);
    if (t->bos >= t->n_ids) t->bos = -1;
    if (t->eos >= t->n_ids) t->eos = -1;
    if (t->bos >= 0 && !ft_tok_str(t, t->bos)) t->bos = -1; /* an id in range that no token has */
    if (t->eos >= 0 && !ft_tok_str(t, t->eos)) t->eos = -1;
    if (t->bos < 0) t->bos_str = ""; /* a configured token missing from the vocabulary */
    if (t->eos < 0) t->eos_str = "";
    if (t->bos >= 0 && !t->bos_str[0]) FT_TRY(tk_set_str(t, &t->bos_str, ft_tok_str(t, t->bos)));
    if (t->eos >= 0 && !t->eos_str[0]) FT_TRY(tk_set_str(t, &t->eos_str, ft_tok_str(t, t->eos)));
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------ */

int tk_out_push(tk_ctx *c, int32_t id)
{
    if (c->n_out == c->cap_out) {
        int64_t cap = c->cap_out ? c->cap_out * 2 : 64;
        int32_t *p = realloc(c->out, (size_t)cap * sizeof *p);
        if (!p) return -ENOMEM;
        c->out = p;
        c->cap_out = cap;
    }
    c->out[c->n_out++] = id;
    return 0;
}

/* Normalization, the normalized added tokens, pre-tokenization and the model step over the
 * pieces in c->a, ids appended to c->out. */
static int encode_pieces(const ft_tokenizer *t, tk_ctx *c)
{
    FT_TRY(tk_normalize_pieces(t, c));
    FT_TRY(tk_pretokenize(t, c));
    for (int64_t i = 0; i < c->a.n; i++) {
        tk_piece p = c->a.v[i];
        if (p.id >= 0) FT_TRY(tk_out_push(c, p.id));
        else FT_TRY(tk_model_word(t, c, p.off, p.n));
    }
    return 0;
}

/* ---- the piece memo (tokenizer.h ft_tok_memo) ------------------------------------------- */

/* One text piece of the recorded text (between raw added tokens): its place, its origin0
 * flag and its ids (ids[ids_off, ids_off + n_ids) of the memo). */
typedef struct memo_piece { size_t off, n; int64_t ids_off, n_ids; uint8_t origin0; } memo_piece;

struct ft_tok_memo {
    const char *text;         /* the recorded text, NULL before the first call */
    size_t len;
    int add_special;
    memo_piece *p; int64_t n_p, cap_p;
    int32_t *ids; int64_t n_ids, cap_ids;
};

ft_tok_memo *ft_tok_memo_new(void) { return calloc(1, sizeof(ft_tok_memo)); }

void ft_tok_memo_reset(ft_tok_memo *m)
{
    if (!m) return;
    m->text = NULL;
    m->len = 0;
    m->n_p = m->n_ids = 0;
}

void ft_tok_memo_free(ft_tok_memo *m)
{
    if (!m) return;
    free(m->p);
    free(m->ids);
    free(m);
}

static int memo_put(ft_tok_memo *m, tk_piece p, const int32_t *ids, int64_t n)
{
    if (m->n_p == m->cap_p) {
        int64_t cap = m->cap_p ? m->cap_p * 2 : 16;
        void *q = realloc(m->p, (size_t)cap * sizeof *m->p);
        if (!q) return -ENOMEM;
        m->p = q;
        m->cap_p = cap;
    }
    if (m->n_ids + n > m->cap_ids) {
        int64_t cap = m->cap_ids ? m->cap_ids : 256;
        while (cap < m->n_ids + n) cap *= 2;
        void *q = realloc(m->ids, (size_t)cap * sizeof *m->ids);
        if (!q) return -ENOMEM;
        m->ids = q;
        m->cap_ids = cap;
    }
    if (n) memcpy(m->ids + m->n_ids, ids, (size_t)n * sizeof *ids);
    m->p[m->n_p++] = (memo_piece){p.off, p.n, m->n_ids, n, p.origin0};
    m->n_ids += n;
    return 0;
}

/* The recorded piece at exactly p's place, or NULL; *cur walks the recorded pieces in order
 * (the pieces of a text come in increasing offsets). */
static const memo_piece *memo_find(const ft_tok_memo *m, tk_piece p, int64_t *cur)
{
    while (*cur < m->n_p && m->p[*cur].off < p.off) (*cur)++;
    if (*cur == m->n_p) return NULL;
    const memo_piece *q = &m->p[*cur];
    return q->off == p.off && q->n == p.n && q->origin0 == p.origin0 ? q : NULL;
}

/* After the raw added-token split: each text piece on its own (every later stage acts on one
 * piece at a time, so the ids are the same as all pieces at once), recorded into m, or, when
 * m holds a text this one is a prefix of, taken from it where a piece is the same. */
static int encode_memo(const ft_tokenizer *t, tk_ctx *c, ft_tok_memo *m, int reuse)
{
    int64_t n = c->a.n, cur = 0;
    tk_piece *raw = malloc((size_t)(n ? n : 1) * sizeof *raw);
    if (!raw) return -ENOMEM;
    if (n) memcpy(raw, c->a.v, (size_t)n * sizeof *raw);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        tk_piece p = raw[i];
        if (p.id >= 0) {
            rc = tk_out_push(c, p.id);
            continue;
        }
        const memo_piece *q = reuse ? memo_find(m, p, &cur) : NULL;
        if (q) {
            for (int64_t k = 0; k < q->n_ids && rc == 0; k++) rc = tk_out_push(c, m->ids[q->ids_off + k]);
            continue;
        }
        int64_t n0 = c->n_out;
        c->a.n = 0;
        rc = tk_pieces_push(&c->a, p.off, p.n, -1, p.origin0);
        if (rc == 0) rc = encode_pieces(t, c);
        if (rc == 0 && !reuse) rc = memo_put(m, p, c->out + n0, c->n_out - n0);
    }
    free(raw);
    return rc;
}

static int encode(const ft_tokenizer *t, tk_ctx *c, ft_tok_memo *m, const char *text, size_t len,
                  int add_special)
{
    if (!(c->md = pcre2_match_data_create(1, NULL))) return -ENOMEM;
    FT_TRY(tk_buf_put(&c->w, text, len));
    FT_TRY(tk_pieces_push(&c->a, 0, len, -1, 1));
    FT_TRY(tk_split_added(t, c, &t->m_raw));
    if (add_special)
        for (int64_t i = 0; i < t->n_post_pre; i++) FT_TRY(tk_out_push(c, t->post_pre[i]));
    if (!m) {
        FT_TRY(encode_pieces(t, c));
    } else {
        /* the bytes at a recorded place are the same when text is the recorded pointer and
         * no longer (the caller's promise: the text is not changed between the calls) */
        int reuse = m->text && m->text == text && len <= m->len && m->add_special == add_special;
        if (!reuse) {
            ft_tok_memo_reset(m);
            m->text = text;
            m->len = len;
            m->add_special = add_special;
        }
        FT_TRY(encode_memo(t, c, m, reuse));
    }
    if (add_special)
        for (int64_t i = 0; i < t->n_post_suf; i++) FT_TRY(tk_out_push(c, t->post_suf[i]));
    return 0;
}

int ft_tok_encode(const ft_tokenizer *t, const char *text, size_t len, int add_special,
                  int32_t **ids, int64_t *n)
{
    return ft_tok_encode_cached(t, NULL, text, len, add_special, ids, n);
}

int ft_tok_encode_cached(const ft_tokenizer *t, ft_tok_cache *cache, const char *text, size_t len,
                         int add_special, int32_t **ids, int64_t *n)
{
    return ft_tok_encode_memo(t, cache, NULL, text, len, add_special, ids, n);
}

int ft_tok_encode_memo(const ft_tokenizer *t, ft_tok_cache *cache, ft_tok_memo *memo,
                       const char *text, size_t len, int add_special, int32_t **ids, int64_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len)) return ft_err(FT_E_INVALID, "ft_tok_encode: NULL tokenizer or text");
    tk_ctx c = {.cache = cache};
    int rc = encode(t, &c, text ? memo : NULL, text ? text : "", len, add_special);
    if (rc == 0 && !c.out && !(c.out = malloc(sizeof *c.out))) rc = -ENOMEM;
    if (rc == 0) {
        *ids = c.out;
        *n = c.n_out;
        c.out = NULL;
    }
    ctx_free(&c);
    return rc;
}

/* ---- accessors ---------------------------------------------------------------------------- */

const char *tk_id_text(const ft_tokenizer *t, int32_t id, size_t *n)
{
    if (!t || id < 0 || id >= t->n_ids) return NULL;
    if (t->added_of_id[id] >= 0) {
        const tk_added *a = &t->added[t->added_of_id[id]];
        *n = a->pat_n; /* simple_id_to_token: the normalized form of a normalized token */
        return a->pat;
    }
    if (!t->id_str[id]) return NULL;
    *n = t->id_len[id];
    return t->id_str[id];
}

int32_t ft_tok_id(const ft_tokenizer *t, const char *token)
{
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t id = tk_strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : tk_strmap_get(&t->vocab, token, n);
}

const char *ft_tok_str(const ft_tokenizer *t, int32_t id)
{
    size_t n;
    return tk_id_text(t, id, &n);
}

int64_t ft_tok_vocab_size(const ft_tokenizer *t) { return t ? t->n_ids : 0; }
int32_t ft_tok_bos(const ft_tokenizer *t) { return t ? t->bos : -1; }
int32_t ft_tok_eos(const ft_tokenizer *t) { return t ? t->eos : -1; }
const char *ft_tok_bos_str(const ft_tokenizer *t) { return t ? t->bos_str : ""; }
const char *ft_tok_eos_str(const ft_tokenizer *t) { return t ? t->eos_str : ""; }
const char *ft_tok_chat_template(const ft_tokenizer *t) { return t ? t->chat_template : NULL; }
void ft_tok_set_chat_kind(ft_tokenizer *t, int kind) { if (t) t->chat_detected = kind; }
int ft_tok_chat_kind(const ft_tokenizer *t) { return t ? t->chat_detected : 0; }
