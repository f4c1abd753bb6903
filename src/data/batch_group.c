/* batch_group.c - reordering an epoch's micro-batches so that each optimizer step's are of
 * similar cost (dataset.h ft_batch_group_by_cost).
 *
 * With data parallelism every rank takes its share of a step's micro-batches and the step
 * ends at the all-reduce, so a step lasts as long as its costliest share. A micro-batch's cost
 * follows its tokens (the blocks) and its loss-target tokens (the LM head and cross-entropy run
 * on those rows only), and packing evens out the first but not the second. The grouping is
 * that of Hugging Face's LengthGroupedSampler (megabatches sorted by length, then shuffled),
 * with the micro-batch as the item and the cost as the length: windows of
 * FT_BATCH_GROUP_STEPS steps, sorted by cost within the window, cut into steps, the steps'
 * order shuffled within the window.
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/data/dataset.h"

typedef struct costed { double cost; int64_t idx; } costed;

/* Costliest first; ties by position (the packer's shuffled order), so the sort is a function
 * of the input alone. */
static int by_cost_desc(const void *a, const void *b)
{
    const costed *x = a, *y = b;
    if (x->cost != y->cost) return x->cost < y->cost ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

double ft_batch_cost(const ft_batch *b, double target_weight)
{
    return (double)b->T + target_weight * (double)b->n_targets;
}

/* The window [w0, w0 + m) of b: sorted by cost into tmp, its full steps' order shuffled by g,
 * written back (a short last step, m % group micro-batches, stays last). */
static void group_window(ft_batch *b, ft_batch *tmp, costed *c, int64_t *step, int64_t w0,
                         int64_t m, int64_t group, double target_weight, ft_rng *g)
{
    for (int64_t i = 0; i < m; i++) c[i] = (costed){ft_batch_cost(&b[w0 + i], target_weight), w0 + i};
    qsort(c, (size_t)m, sizeof *c, by_cost_desc);
    const int64_t full = m / group;
    for (int64_t s = 0; s < full; s++) step[s] = s;
    ft_rng_shuffle_i64(g, step, full);
    int64_t at = 0;
    for (int64_t s = 0; s < full; s++)
        for (int64_t j = 0; j < group; j++) tmp[at++] = b[c[step[s] * group + j].idx];
    for (int64_t i = full * group; i < m; i++) tmp[at++] = b[c[i].idx];
    memcpy(b + w0, tmp, (size_t)m * sizeof *b);
}

int ft_batch_group_by_cost(ft_batch *b, int64_t n, int64_t group, double target_weight,
                           uint64_t seed)
{
    if (group < 1 || !(target_weight >= 0))
        return ft_err(FT_E_INVALID, "grouping micro-batches: group %lld must be >= 1 and the target weight %g >= 0",
                      (long long)group, target_weight);
    if (group == 1 || n <= 1) return 0; /* a step of one micro-batch has nothing to balance */
    if (group > INT64_MAX / FT_BATCH_GROUP_STEPS)
        return ft_err(FT_E_RANGE, "grouping micro-batches: group %lld is too large", (long long)group);
    const int64_t W = group * FT_BATCH_GROUP_STEPS, wmax = n < W ? n : W;
    ft_batch *tmp = malloc((size_t)wmax * sizeof *tmp);
    costed *c = malloc((size_t)wmax * sizeof *c);
    int64_t *step = malloc((size_t)(wmax / group + 1) * sizeof *step);
    if (!tmp || !c || !step) {
        free(tmp);
        free(c);
        free(step);
        return ft_err(-ENOMEM, "grouping micro-batches: out of memory");
    }
    ft_rng g;
    ft_rng_seed(&g, seed ^ 0x9c0b7a1e5d3f2468ull);
    for (int64_t w0 = 0; w0 < n; w0 += W)
        group_window(b, tmp, c, step, w0, n - w0 < W ? n - w0 : W, group, target_weight, &g);
    free(tmp);
    free(c);
    free(step);
    return 0;
}
