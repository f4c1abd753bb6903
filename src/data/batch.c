/* batch.c - packing examples into micro-batches (dataset.h ft_pack).
 *
 * Padding-free packing (TRL packing_strategy="bfd" with padding_free; formats.md 8.2): whole
 * examples are placed first-fit-decreasing into micro-batches of at most rows * seq_len
 * tokens, and each micro-batch is the concatenation of its examples with no padding. RoPE
 * positions restart at 0 per example and seq_start confines attention to the example, so
 * the result equals running each example alone (the executor's attention is varlen). The
 * first-fit search is a max segment tree over the bins' free space: O(n log n).
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
    if (!b->ids || !b->targets || !b->pos || !b->seq_start)
        return ft_err(-ENOMEM, "packing: out of memory");
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

int ft_pack(ft_batch **batches, int64_t *n_batches, const ft_example *ex, int64_t n_ex,
            int64_t seq_len, int64_t rows, uint64_t seed)
{
    *batches = NULL;
    *n_batches = 0;
    if (seq_len < 2 || rows < 1)
        return ft_err(FT_E_INVALID, "packing: seq_len %lld and rows %lld must be >= 2 and >= 1",
                      (long long)seq_len, (long long)rows);
    int64_t cap = seq_len * rows;
    if (cap > INT32_MAX) return ft_err(FT_E_RANGE, "packing: %lld tokens per micro-batch exceeds int32 indices", (long long)cap);
    if (n_ex == 0) return 0;
    for (int64_t i = 0; i < n_ex; i++)
        if (ex[i].n < 1 || ex[i].n > seq_len)
            return ft_err(FT_E_RANGE, "packing: example %lld has %lld tokens (allowed 1..%lld)",
                          (long long)i, (long long)ex[i].n, (long long)seq_len);

    int64_t P = 1;
    while (P < n_ex) P *= 2;
    order *o = malloc((size_t)n_ex * sizeof *o);
    int64_t *tree = malloc((size_t)(2 * P) * sizeof *tree);
    int64_t *bin_of = malloc((size_t)n_ex * sizeof *bin_of);
    int64_t *fill = calloc((size_t)n_ex, sizeof *fill);
    int64_t *count = calloc((size_t)n_ex + 1, sizeof *count);
    int64_t *perm = malloc((size_t)n_ex * sizeof *perm);
    int64_t *members = malloc((size_t)n_ex * sizeof *members);
    ft_batch *b = NULL;
    int64_t n_bins = 0;
    int rc = 0;
    if (!o || !tree || !bin_of || !fill || !count || !perm || !members) {
        rc = ft_err(-ENOMEM, "packing: out of memory");
        goto done;
    }
    ft_rng g;
    ft_rng_seed(&g, seed ^ 0xba7c4ed5ull);
    for (int64_t i = 0; i < n_ex; i++) o[i] = (order){ex[i].n, (int64_t)(ft_rng_next(&g) >> 1), i};
    qsort(o, (size_t)n_ex, sizeof *o, by_len_desc);
    for (int64_t i = 0; i < 2 * P; i++) tree[i] = 0;
    for (int64_t i = 0; i < P; i++) tree[P + i] = i < n_ex ? cap : 0;
    for (int64_t i = P - 1; i >= 1; i--)
        tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
    for (int64_t k = 0; k < n_ex; k++) {
        int64_t bin = first_fit(tree, P, o[k].len); /* always found: n_ex bins of cap >= len */
        bin_of[o[k].idx] = bin;
        fill[bin] += o[k].len;
        tree_set(tree, P, bin, cap - fill[bin]);
        if (bin + 1 > n_bins) n_bins = bin + 1;
    }
    /* members grouped by bin, each bin in decreasing-length order (counting sort) */
    for (int64_t k = 0; k < n_ex; k++) count[bin_of[o[k].idx] + 1]++;
    for (int64_t i = 0; i < n_bins; i++) count[i + 1] += count[i];
    {
        int64_t *at = perm; /* reuse as write cursors */
        for (int64_t i = 0; i < n_bins; i++) at[i] = count[i];
        for (int64_t k = 0; k < n_ex; k++) members[at[bin_of[o[k].idx]]++] = o[k].idx;
    }
    /* the micro-batch order is shuffled too, so training does not run longest-first */
    for (int64_t i = 0; i < n_bins; i++) perm[i] = i;
    for (int64_t i = n_bins - 1; i > 0; i--) {
        int64_t k = (int64_t)(ft_rng_next(&g) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    b = calloc((size_t)n_bins, sizeof *b);
    if (!b) {
        rc = ft_err(-ENOMEM, "packing: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n_bins && rc == 0; i++) {
        int64_t bin = perm[i];
        rc = fill_batch(&b[i], ex, members + count[bin], count[bin + 1] - count[bin], fill[bin],
                        rows, seq_len);
    }
    if (rc < 0) {
        ft_batches_free(b, n_bins);
        b = NULL;
        n_bins = 0;
    }
done:
    free(o);
    free(tree);
    free(bin_of);
    free(fill);
    free(count);
    free(perm);
    free(members);
    *batches = b;
    *n_batches = n_bins;
    return rc;
}
