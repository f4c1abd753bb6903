/* test_sample.c - the sampler's logits processing beyond temperature / top-k / top-p (which
 * test_generate.c covers): the repetition penalty on hand-computed logits (positive and
 * negative, ids repeated in the sequence, the greedy choice it flips, values below 1), min-p
 * against hand counts and a brute force over a large vocabulary, and the order in which
 * transformers' generate() applies them: the penalty on the raw logits before everything
 * (greedy included), then temperature, top-k, top-p, min-p. No model needed. */
#include "tests/unit/harness.h"

#include <float.h>

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/infer/sample.h"

/* Probabilities computed here in double from float logits vs the sampler's (double):
 * the same formula, summed in another order. */
#define FT_TOL_SAMPLE_P 1e-12
/* Hand probabilities written with 2-4 digits, from float logits log(p). */
#define FT_TOL_SAMPLE_HAND 1e-6

static ft_sample_cfg cfg(float T, int64_t k, float top_p, float min_p, float rp)
{
    ft_sample_cfg c = {0};
    c.temperature = T;
    c.top_k = k;
    c.top_p = top_p;
    c.min_p = min_p;
    c.repetition_penalty = rp;
    c.seed = 1;
    return c;
}

/* s's probability of token id (0 when it is not a candidate). */
static double cand_prob(const ft_sampler *s, int32_t id)
{
    for (int64_t i = 0; i < s->n_cand; i++)
        if (s->cand_id[i] == id) return s->cand_p[i];
    return 0;
}

/* The candidates are exactly ids[0..n) in that order, with probabilities softmax(z) over
 * them, z = the given scaled logits. */
static void expect_cands(const ft_sampler *s, const int32_t *ids, int n, const double *z, double tol)
{
    assert_int_equal(s->n_cand, n);
    double zmax = -INFINITY, tot = 0;
    for (int i = 0; i < n; i++) zmax = fmax(zmax, z[i]);
    for (int i = 0; i < n; i++) tot += exp(z[i] - zmax);
    for (int i = 0; i < n; i++) {
        assert_int_equal(s->cand_id[i], ids[i]);
        assert_true(fabs(s->cand_p[i] - exp(z[i] - zmax) / tot) < tol);
    }
}

/* ---- repetition penalty ------------------------------------------------------------------- */

static void test_repetition_penalty_hand(void **state)
{
    /*              id:   0     1      2     3     4      5 */
    float x[6] = {2.0f, -1.0f, 0.5f, 1.8f, -0.2f, 1.0f};
    float x0[6];
    memcpy(x0, x, sizeof x);
    ft_sample_seen seen;
    assert_int_equal(ft_sample_seen_init(&seen, 6), 0);
    /* the sequence 0 1 0 4 0 (id 0 three times: penalised once), and ids out of range */
    const int32_t seq[7] = {0, 1, 0, 4, 0, -3, 6};
    ft_sample_seen_add(&seen, seq, 7);
    for (int i = 0; i < 6; i++) assert_int_equal(ft_sample_seen_has(&seen, i), i == 0 || i == 1 || i == 4);
    assert_false(ft_sample_seen_has(&seen, 6));
    assert_false(ft_sample_seen_has(&seen, -1));

    ft_sampler s;
    /* greedy: id 0 (2.0) without the penalty; with 2: 2.0 / 2 = 1.0 < 1.8, so id 3 */
    ft_sample_cfg g = cfg(0.0f, 0, 1.0f, 0.0f, 2.0f);
    assert_int_equal(ft_sampler_init(&s, &g, 6), 0);
    int32_t t = -1;
    assert_int_equal(ft_sample_next(&s, x, &t), 0); /* no seen set: no penalty */
    assert_int_equal(t, 0);
    assert_int_equal(ft_sample_next_seen(&s, x, &seen, &t), 0);
    assert_int_equal(t, 3);
    assert_memory_equal(x, x0, sizeof x); /* the logits are not modified */
    ft_sampler_free(&s);

    /* temperature 1, no filter: softmax of the penalised logits, in id order:
     * 2 -> 1 (divided), -1 -> -2 and -0.2 -> -0.4 (multiplied); 0.5, 1.8, 1.0 not seen.
     * Were id 0 penalised three times (once per occurrence) it would be 0.25. */
    ft_sample_cfg c = cfg(1.0f, 0, 1.0f, 0.0f, 2.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
    const int32_t all[6] = {0, 1, 2, 3, 4, 5};
    const double pen2[6] = {x[0] / 2.0f, x[1] * 2.0f, x[2], x[3], x[4] * 2.0f, x[5]};
    expect_cands(&s, all, 6, pen2, FT_TOL_SAMPLE_P);
    ft_sampler_free(&s);

    /* a penalty below 1 rewards: 2 / 0.5 = 4, -1 * 0.5 = -0.5, -0.2 * 0.5 = -0.1 */
    c = cfg(1.0f, 0, 1.0f, 0.0f, 0.5f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
    const double pen05[6] = {x[0] / 0.5f, x[1] * 0.5f, x[2], x[3], x[4] * 0.5f, x[5]};
    expect_cands(&s, all, 6, pen05, FT_TOL_SAMPLE_P);
    ft_sampler_free(&s);

    /* 1 (and 0: a zeroed field) is off: the plain softmax */
    const double plain[6] = {x[0], x[1], x[2], x[3], x[4], x[5]};
    for (int k = 0; k < 2; k++) {
        c = cfg(1.0f, 0, 1.0f, 0.0f, k ? 1.0f : 0.0f);
        assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
        assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
        expect_cands(&s, all, 6, plain, FT_TOL_SAMPLE_P);
        ft_sampler_free(&s);
    }

    /* cleared for the next prompt: nothing penalised */
    ft_sample_seen_clear(&seen);
    c = cfg(0.0f, 0, 1.0f, 0.0f, 2.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_next_seen(&s, x, &seen, &t), 0);
    assert_int_equal(t, 0);
    ft_sampler_free(&s);
    ft_sample_seen_free(&seen);
    ft_sample_seen_free(&seen); /* twice: zeroed, harmless */
    assert_int_equal(ft_sample_seen_init(&seen, 0), FT_E_INVALID);
    printf("repetition penalty 2 / 0.5 on 6 logits (ids 0 x3, 1, 4 seen): softmax exact; greedy 0 -> 3\n");
}

/* A greedy decoding loop over a fixed logit table: each step's logits depend on the step
 * only, the chosen ids feed the penalty (the loop ftune generate runs). */
static void test_repetition_penalty_greedy_loop(void **state)
{
    /* the same logits at every step: without a penalty always id 2 */
    const float x[5] = {1.0f, 3.0f, 4.0f, -0.5f, 2.9f};
    const int32_t prompt[2] = {3, 3};
    ft_sample_seen seen;
    assert_int_equal(ft_sample_seen_init(&seen, 5), 0);
    ft_sample_seen_add(&seen, prompt, 2);
    ft_sampler s;
    ft_sample_cfg c = cfg(0.0f, 0, 1.0f, 0.0f, 1.5f);
    assert_int_equal(ft_sampler_init(&s, &c, 5), 0);
    /* by hand: step 0: 4.0 max -> 2; then 2 is 4/1.5 = 2.667 < 3.0 -> 1; then 1 is 2.0,
     * 2 is 2.667, 4 is 2.9 -> 4; then 4 is 1.933: 2 (2.667) again, and from then on 2 */
    const int32_t want[6] = {2, 1, 4, 2, 2, 2};
    for (int i = 0; i < 6; i++) {
        int32_t t;
        assert_int_equal(ft_sample_next_seen(&s, x, &seen, &t), 0);
        assert_int_equal(t, want[i]);
        ft_sample_seen_add(&seen, &t, 1);
    }
    ft_sampler_free(&s);
    ft_sample_seen_free(&seen);
}

static void test_settings_checked(void **state)
{
    ft_sampler s;
    const float bad_rp[3] = {-1.0f, NAN, INFINITY}, bad_mp[3] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        ft_sample_cfg c = cfg(1.0f, 0, 1.0f, 0.0f, bad_rp[i]);
        assert_int_equal(ft_sampler_init(&s, &c, 6), FT_E_INVALID);
        assert_true(strstr(ft_errmsg(), "repetition penalty") != NULL);
        c = cfg(1.0f, 0, 1.0f, bad_mp[i], 1.0f);
        assert_int_equal(ft_sampler_init(&s, &c, 6), FT_E_INVALID);
        assert_true(strstr(ft_errmsg(), "min-p") != NULL);
    }
    ft_sample_cfg ok = cfg(1.0f, 0, 1.0f, 1.0f, 0.0f); /* min-p 1, penalty unset: valid */
    assert_int_equal(ft_sampler_init(&s, &ok, 6), 0);
    ft_sampler_free(&s);
}

/* ---- min-p ---------------------------------------------------------------------------------- */

/* probabilities 0.4 0.25 0.15 0.1 0.06 0.04 as logits (log p), on ids 3 0 5 1 4 2 */
static const double P6[6] = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
static const int32_t ID6[6] = {3, 0, 5, 1, 4, 2};

static void probs_logits(float *x)
{
    for (int i = 0; i < 6; i++) x[ID6[i]] = (float)log(P6[i]);
}

static void test_min_p_hand(void **state)
{
    float x[6];
    probs_logits(x);
    ft_sampler s;
    /* min-p m keeps p >= m * 0.4: 0.2 -> >= 0.08: 4 tokens; 0.3 -> >= 0.12: 3; 0.5 -> >= 0.2: 2;
     * 1 -> the top alone. No top-k / top-p: the survivors in id order. */
    const float mp[4] = {0.2f, 0.3f, 0.5f, 1.0f};
    const int nk[4] = {4, 3, 2, 1};
    for (int k = 0; k < 4; k++) {
        ft_sample_cfg c = cfg(1.0f, 0, 1.0f, mp[k], 1.0f);
        assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
        assert_int_equal(ft_sample_dist(&s, x), 0);
        assert_int_equal(s.n_cand, nk[k]);
        double mass = 0;
        for (int i = 0; i < nk[k]; i++) mass += P6[i];
        for (int i = 0; i < 6; i++)
            assert_true(fabs(cand_prob(&s, ID6[i]) - (i < nk[k] ? P6[i] / mass : 0)) < FT_TOL_SAMPLE_HAND);
        for (int64_t i = 1; i < s.n_cand; i++) assert_true(s.cand_id[i] > s.cand_id[i - 1]);
        ft_sampler_free(&s);
    }
    /* min-p 0 is off; min-p with temperature 0 has no effect (greedy, as top-k / top-p) */
    ft_sample_cfg c = cfg(1.0f, 0, 1.0f, 0.0f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 6);
    ft_sampler_free(&s);
    c = cfg(0.0f, 0, 1.0f, 0.9f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    int32_t t;
    assert_int_equal(ft_sample_next(&s, x, &t), 0);
    assert_int_equal(t, 3);
    ft_sampler_free(&s);
    /* the draws follow the kept distribution (min-p 0.3: ids 0 3 5 with .3125 .5 .1875) */
    c = cfg(1.0f, 0, 1.0f, 0.3f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    int cnt[6] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        assert_int_equal(ft_sample_next(&s, x, &t), 0);
        cnt[t]++;
    }
    assert_int_equal(cnt[1] + cnt[2] + cnt[4], 0);
    assert_true(fabs(cnt[3] / (double)N - 0.5) < 5 * sqrt(0.25 / N)); /* 5 sigma */
    ft_sampler_free(&s);
    printf("min-p 0.2/0.3/0.5/1 on 6 tokens: kept 4/3/2/1 as counted by hand; 0 off; no effect greedy\n");
}

/* The order of transformers' generate(): repetition penalty, temperature, top-k, top-p, min-p. */
static void test_order(void **state)
{
    float x[6];
    probs_logits(x);
    ft_sampler s;
    /* min-p after the temperature: T = 0.5 squares the probability ratios, so min-p 0.3 keeps
     * ids 3 and 0 ((.25/.4)^2 = .39 >= .3; (.15/.4)^2 = .14 < .3), where min-p on the raw
     * probabilities would keep 5 as well */
    ft_sample_cfg c = cfg(0.5f, 0, 1.0f, 0.3f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    {
        const int32_t ids[2] = {0, 3};
        const double z[2] = {x[0] / 0.5f, x[3] / 0.5f};
        expect_cands(&s, ids, 2, z, FT_TOL_SAMPLE_P);
    }
    ft_sampler_free(&s);
    /* min-p after top-p: top-p 0.7 of the whole (.4 + .25 = .65 < .7, + .15 = .8) keeps 3, and
     * min-p 0.3 (>= .12) keeps those 3; min-p first would renormalise over .8 and top-p 0.7
     * would then stop at 2 (.5 + .3125) */
    c = cfg(1.0f, 0, 0.7f, 0.3f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    {
        const double z[3] = {x[3], x[0], x[5]};
        expect_cands(&s, ID6, 3, z, FT_TOL_SAMPLE_P);
    }
    ft_sampler_free(&s);
    /* top-p cuts first when it is the shorter: top-p 0.3 keeps id 3 alone, min-p 0.2 allows 4 */
    c = cfg(1.0f, 0, 0.3f, 0.2f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 1);
    assert_int_equal(s.cand_id[0], 3);
    ft_sampler_free(&s);
    /* top-k and min-p: top-k 5 then min-p 0.3 -> 3; top-k 2 then min-p 0.2 -> 2 */
    c = cfg(1.0f, 5, 1.0f, 0.3f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 3);
    ft_sampler_free(&s);
    c = cfg(1.0f, 2, 1.0f, 0.2f, 1.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 2);
    ft_sampler_free(&s);

    /* the penalty comes before top-k: with id 3 (the top, log .4) seen and a penalty of 2,
     * its logit -0.916 becomes -1.833, below id 0's log .25 = -1.386 and id 5's log .15 =
     * -1.897 stays below it: top-k 1 keeps id 0 (a penalty applied after top-k would keep 3) */
    ft_sample_seen seen;
    assert_int_equal(ft_sample_seen_init(&seen, 6), 0);
    const int32_t three = 3;
    ft_sample_seen_add(&seen, &three, 1);
    c = cfg(1.0f, 1, 1.0f, 0.0f, 2.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
    assert_int_equal(s.n_cand, 1);
    assert_int_equal(s.cand_id[0], 0);
    ft_sampler_free(&s);
    /* ... and before the temperature: T = 0.5 of the penalised logits (x * 2 / 0.5 for id 3),
     * with top-k 2 and min-p 0.5 on the result: ids 0 (-2.77) and 3 (-3.67): ratio e^-0.9 =
     * .41 < .5, so id 0 alone */
    c = cfg(0.5f, 2, 1.0f, 0.5f, 2.0f);
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
    assert_int_equal(s.n_cand, 1);
    assert_int_equal(s.cand_id[0], 0);
    ft_sampler_free(&s);
    c = cfg(0.5f, 2, 1.0f, 0.0f, 2.0f); /* without min-p: both, softmax of the scaled logits */
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
    {
        const int32_t ids[2] = {0, 3};
        const double z[2] = {x[0] / 0.5f, (x[3] * 2.0f) / 0.5f};
        expect_cands(&s, ids, 2, z, FT_TOL_SAMPLE_P);
    }
    ft_sampler_free(&s);
    ft_sample_seen_free(&seen);
}

/* ---- a large vocabulary against a brute force ----------------------------------------------- */

typedef struct { double z; int32_t id; } zid;

static int cmp_zid(const void *a, const void *b)
{
    const zid *x = a, *y = b;
    return x->z > y->z ? -1 : x->z < y->z ? 1 : (x->id > y->id) - (x->id < y->id);
}

/* The candidate set by the definitions: penalise, scale, sort, top-k, top-p of the top-k's
 * mass, then min-p (p >= min_p * p_max). Writes the kept ids sorted by id; returns the count. */
static int64_t brute(const float *x, int64_t V, const ft_sample_cfg *c, const ft_sample_seen *seen,
                     int32_t *out)
{
    zid *p = malloc((size_t)V * sizeof *p);
    for (int64_t i = 0; i < V; i++) {
        float v = x[i];
        if (seen && ft_sample_seen_has(seen, i)) v = v < 0 ? v * c->repetition_penalty : v / c->repetition_penalty;
        p[i].z = (double)(v * (1.0f / c->temperature));
        p[i].id = (int32_t)i;
    }
    qsort(p, (size_t)V, sizeof *p, cmp_zid);
    int64_t m = c->top_k > 0 && c->top_k < V ? c->top_k : V;
    double tot = 0, cum = 0;
    for (int64_t i = 0; i < m; i++) tot += exp(p[i].z - p[0].z);
    int64_t n = 0;
    for (; n < m; n++) {
        cum += exp(p[n].z - p[0].z);
        if (c->top_p < 1 && cum >= c->top_p * tot) { n++; break; }
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (exp(p[i].z - p[0].z) >= c->min_p) out[k++] = p[i].id;
    free(p);
    for (int64_t i = 1; i < k; i++) /* insertion sort by id */
        for (int64_t j = i; j > 0 && out[j] < out[j - 1]; j--) {
            int32_t t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return k;
}

static void test_large_vocab_brute(void **state)
{
    const int64_t V = 50000;
    float *x = malloc((size_t)V * sizeof *x);
    int32_t *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    ft_rng r;
    ft_rng_seed(&r, 11);
    for (int64_t i = 0; i < V; i++) x[i] = 12.0f * ft_rng_uniform(&r) - 4.0f; /* both signs */
    ft_sample_seen seen;
    assert_int_equal(ft_sample_seen_init(&seen, V), 0);
    for (int i = 0; i < 3000; i++) {
        int32_t id = (int32_t)(ft_rng_next(&r) % (uint64_t)V);
        ft_sample_seen_add(&seen, &id, 1);
    }
    struct { float T, top_p, min_p, rp; int64_t k; } cases[] = {
        {1.0f, 1.0f, 0.05f, 1.0f, 0}, {0.7f, 1.0f, 0.1f, 1.3f, 0}, {1.0f, 0.95f, 0.02f, 1.2f, 40},
        {1.5f, 0.9f, 0.3f, 1.0f, 0}, {0.8f, 1.0f, 0.01f, 1.1f, 1000}, {1.0f, 0.5f, 0.0f, 1.5f, 0},
    };
    int64_t kept[6];
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        ft_sample_cfg c = cfg(cases[ci].T, cases[ci].k, cases[ci].top_p, cases[ci].min_p, cases[ci].rp);
        ft_sampler s;
        assert_int_equal(ft_sampler_init(&s, &c, V), 0);
        assert_int_equal(ft_sample_dist_seen(&s, x, &seen), 0);
        int64_t n = brute(x, V, &c, &seen, want);
        assert_int_equal(s.n_cand, n);
        for (int64_t i = 0; i < n; i++) got[i] = s.cand_id[i];
        for (int64_t i = 1; i < n; i++) /* insertion sort by id */
            for (int64_t j = i; j > 0 && got[j] < got[j - 1]; j--) {
                int32_t t = got[j];
                got[j] = got[j - 1];
                got[j - 1] = t;
            }
        assert_memory_equal(got, want, (size_t)n * sizeof *got);
        kept[ci] = n;
        ft_sampler_free(&s);
    }
    printf("V=%lld, 3000 ids seen: candidate sets equal the brute force in 6 cases (kept %lld %lld "
           "%lld %lld %lld %lld)\n", (long long)V, (long long)kept[0], (long long)kept[1],
           (long long)kept[2], (long long)kept[3], (long long)kept[4], (long long)kept[5]);
    ft_sample_seen_free(&seen);
    free(x);
    free(want);
    free(got);
}

/* One sampler serving several sequences (ft_sampler_reseed, a seen set per sequence): the
 * same seed and ids give the same tokens whatever came before. */
static void test_reuse_across_records(void **state)
{
    const int64_t V = 300;
    float *x = malloc((size_t)V * sizeof *x);
    ft_rng r;
    ft_rng_seed(&r, 5);
    for (int64_t i = 0; i < V; i++) x[i] = 4.0f * ft_rng_uniform(&r) - 1.0f;
    ft_sample_cfg c = cfg(0.9f, 50, 0.95f, 0.05f, 1.3f);
    ft_sampler s;
    assert_int_equal(ft_sampler_init(&s, &c, V), 0);
    ft_sample_seen a, b;
    assert_int_equal(ft_sample_seen_init(&a, V), 0);
    assert_int_equal(ft_sample_seen_init(&b, V), 0);
    const int32_t prompt[4] = {7, 8, 9, 7};
    int32_t run[3][40];
    for (int k = 0; k < 3; k++) {
        /* run 1 interleaves another sequence (set b) between the draws of the first (set a) */
        ft_sampler_reseed(&s, 77);
        ft_sample_seen_clear(&a);
        ft_sample_seen_add(&a, prompt, 4);
        ft_rng mine = s.rng, other;
        ft_rng_seed(&other, 99);
        for (int i = 0; i < 40; i++) {
            s.rng = mine;
            assert_int_equal(ft_sample_next_seen(&s, x, &a, &run[k][i]), 0);
            mine = s.rng;
            ft_sample_seen_add(&a, &run[k][i], 1);
            if (k == 1) {
                int32_t t;
                s.rng = other;
                assert_int_equal(ft_sample_next_seen(&s, x, &b, &t), 0);
                other = s.rng;
                ft_sample_seen_add(&b, &t, 1);
            }
        }
    }
    assert_memory_equal(run[0], run[1], sizeof run[0]);
    assert_memory_equal(run[0], run[2], sizeof run[0]);
    int distinct = 0;
    for (int i = 0; i < 40; i++) {
        int seen_before = 0;
        for (int j = 0; j < i; j++) seen_before |= run[0][j] == run[0][i];
        distinct += !seen_before;
    }
    assert_true(distinct > 5);
    ft_sample_seen_free(&a);
    ft_sample_seen_free(&b);
    ft_sampler_free(&s);
    free(x);
}

/* Settings swapped per sequence (generate --prompts: each record its own): one sampler whose
 * cfg and PRNG are swapped between interleaved draws of three sequences gives each the tokens
 * of a sampler made with that sequence's settings alone (nothing is derived from cfg at init,
 * e.g. no scratch sized by top_k); a penalty set for one sequence only; ft_sample_cfg_check;
 * a seen set of another vocabulary refused (it would be read past its end). */
static void test_cfg_per_sequence(void **state)
{
    const int64_t V = 500;
    float *x = malloc((size_t)V * sizeof *x);
    ft_rng r;
    ft_rng_seed(&r, 8);
    for (int64_t i = 0; i < V; i++) x[i] = 5.0f * ft_rng_uniform(&r) - 2.0f;
    ft_sample_cfg c[3] = {cfg(0.0f, 0, 1.0f, 0.0f, 1.5f), cfg(1.2f, 5, 1.0f, 0.1f, 1.0f),
                          cfg(0.8f, 0, 0.5f, 0.0f, 1.2f)};
    c[1].seed = 21;
    c[2].seed = 22;
    const int32_t prompt[3] = {3, 4, 5};
    enum { N = 30 };
    int32_t alone[3][N], mixed[3][N];
    ft_sample_seen seen[3];
    for (int k = 0; k < 3; k++) assert_int_equal(ft_sample_seen_init(&seen[k], V), 0);
    for (int k = 0; k < 3; k++) { /* each alone */
        ft_sampler s;
        assert_int_equal(ft_sampler_init(&s, &c[k], V), 0);
        ft_sample_seen_clear(&seen[k]);
        ft_sample_seen_add(&seen[k], prompt, 3);
        for (int i = 0; i < N; i++) {
            assert_int_equal(ft_sample_next_seen(&s, x, &seen[k], &alone[k][i]), 0);
            ft_sample_seen_add(&seen[k], &alone[k][i], 1);
        }
        ft_sampler_free(&s);
    }
    ft_sampler s; /* made with the command line's settings (the first), serving all three */
    assert_int_equal(ft_sampler_init(&s, &c[0], V), 0);
    ft_rng rng[3];
    for (int k = 0; k < 3; k++) {
        ft_rng_seed(&rng[k], c[k].seed);
        ft_sample_seen_clear(&seen[k]);
        ft_sample_seen_add(&seen[k], prompt, 3);
    }
    for (int i = 0; i < N; i++)
        for (int k = 2; k >= 0; k--) {
            assert_int_equal(ft_sample_cfg_check(&c[k]), 0);
            s.cfg = c[k];
            s.rng = rng[k];
            assert_int_equal(ft_sample_next_seen(&s, x, &seen[k], &mixed[k][i]), 0);
            rng[k] = s.rng;
            ft_sample_seen_add(&seen[k], &mixed[k][i], 1);
        }
    for (int k = 0; k < 3; k++) assert_memory_equal(alone[k], mixed[k], sizeof alone[k]);
    /* the three differ, and greedy with the penalty is not plain greedy */
    assert_memory_not_equal(alone[0], alone[1], sizeof alone[0]);
    assert_memory_not_equal(alone[1], alone[2], sizeof alone[0]);
    int32_t g;
    s.cfg = cfg(0.0f, 0, 1.0f, 0.0f, 1.0f);
    assert_int_equal(ft_sample_next_seen(&s, x, &seen[0], &g), 0);
    assert_int_equal(g, ft_sample_argmax(x, V));
    assert_true(g != alone[0][0] || g != alone[0][1]);
    /* checks */
    ft_sample_cfg bad = cfg(1.0f, -1, 1.0f, 0.0f, 1.0f);
    assert_int_equal(ft_sample_cfg_check(&bad), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "top-k"));
    bad = cfg(1.0f, 0, 0.0f, 0.0f, 1.0f);
    assert_int_equal(ft_sample_cfg_check(&bad), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "top-p"));
    bad = cfg(INFINITY, 0, 1.0f, 0.0f, 1.0f);
    assert_int_equal(ft_sample_cfg_check(&bad), FT_E_INVALID);
    assert_int_equal(ft_sample_cfg_check(NULL), FT_E_INVALID);
    ft_sample_seen small;
    assert_int_equal(ft_sample_seen_init(&small, 64), 0);
    s.cfg = c[0];
    assert_int_equal(ft_sample_next_seen(&s, x, &small, &g), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "a set of 64 ids for 500 logits"));
    ft_sample_seen_free(&small);
    for (int k = 0; k < 3; k++) ft_sample_seen_free(&seen[k]);
    ft_sampler_free(&s);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repetition_penalty_hand),
        cmocka_unit_test(test_repetition_penalty_greedy_loop),
        cmocka_unit_test(test_settings_checked),
        cmocka_unit_test(test_min_p_hand),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_large_vocab_brute),
        cmocka_unit_test(test_reuse_across_records),
        cmocka_unit_test(test_cfg_per_sequence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
