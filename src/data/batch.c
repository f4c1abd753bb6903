/* batch.c - packing examples into micro-batches (dataset.h ft_pack), and preference pairs
 * into micro-batches that never split a pair (ft_pack_pairs, DPO).
 *
 * Padding-free packing (TRL packing_strategy="bfd" with padding_free; formats.md 8.2): whole
 * examples are placed first-fit-decreasing into micro-batches of at most rows * seq_len
 * tokens, and each micro-batch is the concatenation of its examples with no padding. RoPE
 * positions restart at 0 per example and seq_start confines attention to the example, so
 * the result equals running each example alone (the executor's attention is varlen). The
 * first-fit search is a max segment tree over the bins' free space: O(n log n). Pairs are
 * packed by the same code with a pair (its two examples, chosen then rejected) as the item.
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/data/dataset.h"

void ft_batches_free(ft_batch *b, int64_t n)
{
    if (!b) return;
    for (int64_t i = 0; i < n; i++) {
        free(b[i].ids);
        free(b[i].targets);
        free(b[i].pos);
        free(b[i].seq_start);
        free(b[i].pairs);
        free(b[i].ex_index);
    }
    free(b);
}

typedef struct order { int64_t len, key, idx; } order;

/* Longest first; ties in shuffled order (key) so equal lengths do not keep file order. */
static int by_len_desc(const void *a, const void *b)
{
    const order *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return (x->key > y->key) - (x->key < y->key);
}

/* Leftmost leaf of the max tree t (P leaves at t[P..2P)) with free space >= need. */
static int64_t first_fit(const int64_t *t, int64_t P, int64_t need)
{
    if (t[1] < need) return -1;
    int64_t i = 1;
    while (i < P) i = t[2 * i] >= need ? 2 * i : 2 * i + 1;
    return i - P;
}

static void tree_set(int64_t *t, int64_t P, int64_t leaf, int64_t v)
{
    int64_t i = leaf + P;
    t[i] = v;
    for (i /= 2; i >= 1; i /= 2) t[i] = t[2 * i] > t[2 * i + 1] ? t[2 * i] : t[2 * i + 1];
}

/* *b: the examples ex[members[0..n_mem)] concatenated in that order (T tokens in all), its
 * ex_index a copy of members. Returns 0 or -ENOMEM (the caller frees b's arrays). */
static int fill_batch(ft_batch *b, const ft_example *ex, const int64_t *members, int64_t n_mem,
                      int64_t T, int64_t rows, int64_t seq_len)
{
    b->rows = rows;
    b->seq_len = seq_len;
    b->T = T;
    size_t bytes = (size_t)(T ? T : 1) * sizeof(int32_t);
    b->ids = malloc(bytes);
    b->targets = malloc(bytes);
    b->pos = malloc(bytes);
    b->seq_start = malloc(bytes);
    b->ex_index = malloc((size_t)(n_mem ? n_mem : 1) * sizeof *b->ex_index);
    if (!b->ids || !b->targets || !b->pos || !b->seq_start || !b->ex_index)
        return ft_err(-ENOMEM, "packing: out of memory");
    b->n_ex = n_mem;
    memcpy(b->ex_index, members, (size_t)n_mem * sizeof *members);
    int64_t t = 0, nt = 0;
    for (int64_t k = 0; k < n_mem; k++) {
        const ft_example *e = &ex[members[k]];
        for (int64_t i = 0; i < e->n; i++, t++) {
            b->ids[t] = e->ids[i];
            int32_t tg = i + 1 < e->n ? e->labels[i + 1] : FT_IGNORE_INDEX;
            b->targets[t] = tg;
            nt += tg != FT_IGNORE_INDEX;
            b->pos[t] = (int32_t)i;
            b->seq_start[t] = (int32_t)(t - i);
        }
    }
    b->n_targets = nt;
    return 0;
}

/* First-fit-decreasing of n items of len[i] tokens (1..cap) into bins of cap tokens, then the
 * bins' order shuffled. The generator is seeded with seed and draws each item's tie-break key
 * in index order, then the bin shuffle. */
typedef struct ffd {
    int64_t n_bins;
    int64_t *fill;     /* (n) tokens of bin b */
    int64_t *count;    /* (n + 1) bin b's items are members[count[b] .. count[b + 1]) */
    int64_t *members;  /* (n) item indices grouped by bin, each bin in decreasing-length order */
    int64_t *perm;     /* (n) perm[i]: the bin of micro-batch i */
} ffd;

static void ffd_free(ffd *f)
{
    free(f->fill);
    free(f->count);
    free(f->members);
    free(f->perm);
    memset(f, 0, sizeof *f);
}

/* Returns 0 or -ENOMEM (f freed). n >= 1. */
static int ffd_pack(ffd *f, const int64_t *len, int64_t n, int64_t cap, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    int64_t P = 1;
    while (P < n) P *= 2;
    order *o = malloc((size_t)n * sizeof *o);
    int64_t *tree = malloc((size_t)(2 * P) * sizeof *tree);
    int64_t *bin_of = malloc((size_t)n * sizeof *bin_of);
    f->fill = calloc((size_t)n, sizeof *f->fill);
    f->count = calloc((size_t)n + 1, sizeof *f->count);
    f->perm = malloc((size_t)n * sizeof *f->perm);
    f->members = malloc((size_t)n * sizeof *f->members);
    int rc = 0;
    if (!o || !tree || !bin_of || !f->fill || !f->count || !f->perm || !f->members) {
        rc = ft_err(-ENOMEM, "packing: out of memory");
        goto done;
    }
    ft_rng g;
    ft_rng_seed(&g, seed ^ 0xba7c4ed5ull);
    for (int64_t i = 0; i < n; i++) o[i] = (order){len[i], (int64_t)(ft_rng_next(&g) >> 1), i};
    qsort(o, (size_t)n, sizeof *o, by_len_desc);
    for (int64_t i = 0; i < 2 * P; i++) tree[i] = 0;
    for (int64_t i = 0; i < P; i++) tree[P + i] = i < n ? cap : 0;
    for (int64_t i = P - 1; i >= 1; i--)
        tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
    int64_t n_bins = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t bin = first_fit(tree, P, o[k].len); /* always found: n bins of cap >= len */
        bin_of[o[k].idx] = bin;
        f->fill[bin] += o[k].len;
        tree_set(tree, P, bin, cap - f->fill[bin]);
        if (bin + 1 > n_bins) n_bins = bin + 1;
    }
    /* members grouped by bin, each bin in decreasing-length order (counting sort) */
    for (int64_t k = 0; k < n; k++) f->count[bin_of[o[k].idx] + 1]++;
    for (int64_t i = 0; i < n_bins; i++) f->count[i + 1] += f->count[i];
    {
        int64_t *at = f->perm; /* reuse as write cursors */
        for (int64_t i = 0; i < n_bins; i++) at[i] = f->count[i];
        for (int64_t k = 0; k < n; k++) f->members[at[bin_of[o[k].idx]]++] = o[k].idx;
    }
    /* the micro-batch order is shuffled too, so training does not run longest-first */
    for (int64_t i = 0; i < n_bins; i++) f->perm[i] = i;
    ft_rng_shuffle_i64(&g, f->perm, n_bins);
    f->n_bins = n_bins;
done:
    free(o);
    free(tree);
    free(bin_of);
    if (rc < 0) ffd_free(f);
    return rc;
}

/* The checks ft_pack and ft_pack_pairs share: seq_len, rows, and the budget of
 * seq_len * rows * per_row tokens within int32 indices. */
static int check_budget(int64_t seq_len, int64_t rows, int64_t per_row)
{
    if (seq_len < 2 || rows < 1)
        return ft_err(FT_E_INVALID, "packing: seq_len %lld and rows %lld must be >= 2 and >= 1",
                      (long long)seq_len, (long long)rows);
    if (rows > INT32_MAX / per_row || seq_len > INT32_MAX / (rows * per_row))
        return ft_err(FT_E_RANGE, "packing: %.0f tokens per micro-batch exceeds int32 indices",
                      (double)seq_len * (double)rows * (double)per_row);
    return 0;
}

static int check_examples(const ft_example *ex, int64_t n_ex, int64_t seq_len)
{
    for (int64_t i = 0; i < n_ex; i++)
        if (ex[i].n < 1 || ex[i].n > seq_len)
            return ft_err(FT_E_RANGE, "packing: example %lld has %lld tokens (allowed 1..%lld)",
                          (long long)i, (long long)ex[i].n, (long long)seq_len);
    return 0;
}

int ft_batch_pack(ft_batch **batches, int64_t *n_batches, const ft_example *ex, int64_t n_ex,
            int64_t seq_len, int64_t rows, uint64_t seed)
{
    *batches = NULL;
    *n_batches = 0;
    FT_TRY(check_budget(seq_len, rows, 1));
    if (n_ex == 0) return 0;
    FT_TRY(check_examples(ex, n_ex, seq_len));

    int64_t *len = malloc((size_t)n_ex * sizeof *len);
    if (!len) return ft_err(-ENOMEM, "packing: out of memory");
    for (int64_t i = 0; i < n_ex; i++) len[i] = ex[i].n;
    ffd f;
    int rc = ffd_pack(&f, len, n_ex, seq_len * rows, seed);
    free(len);
    if (rc < 0) return rc;
    ft_batch *b = calloc((size_t)f.n_bins, sizeof *b);
    if (!b) {
        ffd_free(&f);
        return ft_err(-ENOMEM, "packing: out of memory");
    }
    for (int64_t i = 0; i < f.n_bins && rc == 0; i++) {
        int64_t bin = f.perm[i];
        rc = fill_batch(&b[i], ex, f.members + f.count[bin], f.count[bin + 1] - f.count[bin],
                        f.fill[bin], rows, seq_len);
    }
    int64_t n_bins = f.n_bins;
    ffd_free(&f);
    if (rc < 0) {
        ft_batches_free(b, n_bins);
        return rc;
    }
    *batches = b;
    *n_batches = n_bins;
    return 0;
}

int ft_batch_pack_pairs(ft_batch **batches, int64_t *n_batches, const ft_example *ex,
                  int64_t n_pairs, int64_t seq_len, int64_t rows, uint64_t seed)
{
    *batches = NULL;
    *n_batches = 0;
    FT_TRY(check_budget(seq_len, rows, 2));
    if (n_pairs == 0) return 0;
    FT_TRY(check_examples(ex, 2 * n_pairs, seq_len));

    int64_t *len = malloc((size_t)n_pairs * sizeof *len);
    int64_t *idx = malloc((size_t)(2 * n_pairs) * sizeof *idx); /* one batch's examples */
    if (!len || !idx) {
        free(len);
        free(idx);
        return ft_err(-ENOMEM, "packing: out of memory");
    }
    for (int64_t p = 0; p < n_pairs; p++) len[p] = ex[2 * p].n + ex[2 * p + 1].n;
    ffd f;
    int rc = ffd_pack(&f, len, n_pairs, 2 * seq_len * rows, seed);
    free(len);
    ft_batch *b = NULL;
    if (!rc && !(b = calloc((size_t)f.n_bins, sizeof *b))) rc = ft_err(-ENOMEM, "packing: out of memory");
    for (int64_t i = 0; !rc && i < f.n_bins; i++) {
        int64_t bin = f.perm[i], k0 = f.count[bin], np = f.count[bin + 1] - k0;
        for (int64_t k = 0; k < np; k++) {
            idx[2 * k] = 2 * f.members[k0 + k];
            idx[2 * k + 1] = 2 * f.members[k0 + k] + 1;
        }
        /* the budget is 2 * rows rows of seq_len: T <= b->rows * b->seq_len holds */
        rc = fill_batch(&b[i], ex, idx, 2 * np, f.fill[bin], 2 * rows, seq_len);
        if (!rc && !(b[i].pairs = malloc((size_t)(np * FT_PAIR_FIELDS) * sizeof *b[i].pairs)))
            rc = ft_err(-ENOMEM, "packing: out of memory");
        if (rc) break;
        b[i].n_pairs = np;
        int64_t off = 0;
        for (int64_t k = 0; k < np; k++) {
            int64_t p = f.members[k0 + k], *row = b[i].pairs + k * FT_PAIR_FIELDS;
            row[FT_PAIR_INDEX] = p;
            row[FT_PAIR_CHOSEN_START] = off;
            row[FT_PAIR_CHOSEN_LEN] = ex[2 * p].n;
            row[FT_PAIR_REJECTED_START] = off + ex[2 * p].n;
            row[FT_PAIR_REJECTED_LEN] = ex[2 * p + 1].n;
            off += ex[2 * p].n + ex[2 * p + 1].n;
        }
    }
    free(idx);
    int64_t n_bins = f.n_bins;
    ffd_free(&f);
    if (rc < 0) {
        ft_batches_free(b, b ? n_bins : 0);
        return rc;
    }
    *batches = b;
    *n_batches = n_bins;
    return 0;
}
