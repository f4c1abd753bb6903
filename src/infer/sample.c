/* sample.c - repetition penalty, greedy / temperature / top-k / top-p / min-p next-token
 * choice and the stop set (see sample.h for the order of the filters and their sources). */
#include "src/infer/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"

typedef struct zpair {
    float z;     /* logit / temperature */
    int32_t id;
} zpair;

/* Candidates whose scaled logit is below max - PREFILTER_GAP have a probability below
 * e^-25 = 1.4e-11 of the top token's; top-p first sorts only the others, and falls back
 * to sorting everything when their mass does not reach top_p (so the result is exact). */
#define PREFILTER_GAP 25.0f

int ft_sample_cfg_check(const ft_sample_cfg *cfg)
{
    if (!cfg) return ft_err(FT_E_INVALID, "sampler: no settings");
    if (!(cfg->temperature >= 0) || !isfinite(cfg->temperature))
        return ft_err(FT_E_INVALID, "sampler: temperature %g, expected a finite value >= 0",
                      (double)cfg->temperature);
    if (cfg->top_k < 0)
        return ft_err(FT_E_INVALID, "sampler: top-k %lld, expected >= 0 (0: off)",
                      (long long)cfg->top_k);
    if (!(cfg->top_p > 0 && cfg->top_p <= 1))
        return ft_err(FT_E_INVALID, "sampler: top-p %g, expected 0 < top-p <= 1 (1: off)",
                      (double)cfg->top_p);
    if (!(cfg->repetition_penalty >= 0) || !isfinite(cfg->repetition_penalty))
        return ft_err(FT_E_INVALID, "sampler: repetition penalty %g, expected a finite value > 0 "
                      "(1: off)", (double)cfg->repetition_penalty);
    if (!(cfg->min_p >= 0 && cfg->min_p <= 1))
        return ft_err(FT_E_INVALID, "sampler: min-p %g, expected 0 <= min-p <= 1 (0: off)",
                      (double)cfg->min_p);
    return 0;
}

int ft_sampler_init(ft_sampler *s, const ft_sample_cfg *cfg, int64_t V)
{
    memset(s, 0, sizeof *s);
    FT_TRY(ft_sample_cfg_check(cfg));
    if (V < 1 || V > INT32_MAX)
        return ft_err(FT_E_INVALID, "sampler: vocabulary of %lld logits, expected 1..%d",
                      (long long)V, INT32_MAX);
    s->cfg = *cfg;
    s->V = V;
    ft_sampler_reseed(s, cfg->seed);
    s->cand_id = malloc((size_t)V * sizeof *s->cand_id);
    s->cand_p = malloc((size_t)V * sizeof *s->cand_p);
    s->pairs = malloc((size_t)V * sizeof(zpair));
    if (!s->cand_id || !s->cand_p || !s->pairs) {
        ft_sampler_free(s);
        return ft_err(-ENOMEM, "sampler: out of memory for %lld logits", (long long)V);
    }
    return 0;
}

void ft_sampler_reseed(ft_sampler *s, uint64_t seed)
{
    s->cfg.seed = seed;
    ft_rng_seed(&s->rng, seed);
}

void ft_sampler_free(ft_sampler *s)
{
    if (!s) return;
    free(s->cand_id);
    free(s->cand_p);
    free(s->pairs);
    memset(s, 0, sizeof *s);
}

/* ---- the ids a sequence holds (repetition penalty) ---------------------------------------- */

int ft_sample_seen_init(ft_sample_seen *h, int64_t V)
{
    memset(h, 0, sizeof *h);
    if (V < 1 || V > INT32_MAX)
        return ft_err(FT_E_INVALID, "sampler: vocabulary of %lld ids, expected 1..%d",
                      (long long)V, INT32_MAX);
    h->bits = calloc((size_t)((V + 63) / 64), sizeof *h->bits);
    if (!h->bits) return ft_err(-ENOMEM, "sampler: out of memory for %lld ids", (long long)V);
    h->V = V;
    return 0;
}

void ft_sample_seen_free(ft_sample_seen *h)
{
    if (!h) return;
    free(h->bits);
    memset(h, 0, sizeof *h);
}

void ft_sample_seen_clear(ft_sample_seen *h)
{
    if (h->bits) memset(h->bits, 0, (size_t)((h->V + 63) / 64) * sizeof *h->bits);
}

void ft_sample_seen_add(ft_sample_seen *h, const int32_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < h->V) h->bits[ids[i] >> 6] |= 1ull << (ids[i] & 63);
}

int ft_sample_seen_has(const ft_sample_seen *h, int64_t id)
{
    return id >= 0 && id < h->V && (h->bits[id >> 6] >> (id & 63) & 1);
}

/* The penalty factor to apply to the ids of seen: 0 when there is none (no set, or a
 * penalty of 1 or unset). */
static float penalty_of(const ft_sampler *s, const ft_sample_seen *seen)
{
    const float rp = s->cfg.repetition_penalty;
    return seen && seen->bits && rp > 0 && rp != 1 ? rp : 0;
}

/* Logit i after the repetition penalty rp (0: none), as transformers'
 * RepetitionPenaltyLogitsProcessor computes it in float: x < 0 ? x * rp : x / rp. */
static inline float penalised(const float *logits, int64_t i, const ft_sample_seen *seen, float rp)
{
    const float x = logits[i];
    if (!rp || !(seen->bits[i >> 6] >> (i & 63) & 1)) return x;
    return x < 0 ? x * rp : x / rp;
}

int32_t ft_sample_argmax(const float *x, int64_t n)
{
    int32_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (x[i] == x[i] && (best < 0 || x[i] > x[best])) best = (int32_t)i;
    return best;
}

/* a ranks before b: larger z, then the lower id. */
static inline int better(const zpair *a, const zpair *b)
{
    return a->z > b->z || (a->z == b->z && a->id < b->id);
}

static int cmp_rank(const void *pa, const void *pb)
{
    const zpair *a = pa, *b = pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Moves the k best of p[0..n) to p[0..k), sorted (a min-heap of the k best so far, root =
 * the worst of them; then a sort of the k). O(n log k). */
static void top_k_select(zpair *p, int64_t n, int64_t k)
{
    for (int64_t i = 0; i < n; i++) {
        zpair x = p[i];
        int64_t c;
        if (i < k) { /* sift up into heap p[0..i] */
            c = i;
            while (c > 0) {
                int64_t par = (c - 1) / 2;
                if (!better(&p[par], &x)) break; /* parent is worse: stop */
                p[c] = p[par];
                c = par;
            }
            p[c] = x;
            continue;
        }
        if (!better(&x, &p[0])) continue;
        c = 0; /* replace the root, sift down */
        for (;;) {
            int64_t l = 2 * c + 1, r = l + 1, w = c;
            const zpair *wv = &x;
            if (l < k && better(wv, &p[l])) { w = l; wv = &p[l]; }
            if (r < k && better(wv, &p[r])) { w = r; wv = &p[r]; }
            if (w == c) break;
            p[c] = p[w];
            c = w;
        }
        p[c] = x;
    }
    qsort(p, (size_t)k, sizeof *p, cmp_rank);
}

/* Fills cand_* with the n sorted pairs p[0..n) weighted exp(z - zmax), keeping the head
 * whose mass reaches top_p of `total` (the mass of every survivor, which may include
 * tokens beyond p[n)), then of that head the tokens that min-p keeps (a weight of at least
 * min_p, the top token's being exp(0) = 1: both filters cut a tail of the sorted list, so
 * the shorter head is what applying top-p and then min-p leaves), renormalised. */
static void take_sorted(ft_sampler *s, const zpair *p, int64_t n, float zmax, double total)
{
    const double top_p = s->cfg.top_p, min_p = s->cfg.min_p;
    double cum = 0;
    int64_t m = 0;
    for (; m < n; m++) {
        double w = exp((double)p[m].z - (double)zmax);
        if (w < min_p) break; /* never the first: its w is 1 */
        s->cand_id[m] = p[m].id;
        s->cand_p[m] = w;
        cum += w;
        if (top_p < 1 && cum >= top_p * total) { m++; break; }
    }
    s->n_cand = m;
    for (int64_t i = 0; i < m; i++) s->cand_p[i] /= cum;
}

int ft_sample_dist(ft_sampler *s, const float *logits)
{
    return ft_sample_dist_seen(s, logits, NULL);
}

int ft_sample_dist_seen(ft_sampler *s, const float *logits, const ft_sample_seen *seen)
{
    const int64_t V = s->V;
    if (seen && seen->bits && seen->V != V) /* its bits would be read past their end */
        return ft_err(FT_E_INVALID, "sampler: a set of %lld ids for %lld logits",
                      (long long)seen->V, (long long)V);
    const float rp = penalty_of(s, seen);
    for (int64_t i = 0; i < V; i++)
        if (logits[i] != logits[i] || logits[i] == INFINITY)
            return ft_err(FT_E_NUMERIC, "sampler: logit %lld is %g: no distribution",
                          (long long)i, (double)logits[i]);
    if (s->cfg.temperature == 0) { /* the argmax of the penalised logits, the lowest id on ties */
        int32_t a = -1;
        float best = -INFINITY;
        for (int64_t i = 0; i < V; i++) {
            const float x = penalised(logits, i, seen, rp);
            if (a < 0 || x > best) {
                a = (int32_t)i;
                best = x;
            }
        }
        if (a < 0) return ft_err(FT_E_NUMERIC, "sampler: no finite logit");
        s->cand_id[0] = a;
        s->cand_p[0] = 1.0;
        s->n_cand = 1;
        return 0;
    }
    zpair *p = s->pairs;
    const float T = s->cfg.temperature;
    float zmax = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        p[i].z = penalised(logits, i, seen, rp) / T; /* as HF: scores / temperature in float */
        p[i].id = (int32_t)i;
        zmax = p[i].z > zmax ? p[i].z : zmax;
    }
    if (!(zmax > -INFINITY)) return ft_err(FT_E_NUMERIC, "sampler: every logit is -inf");

    const int use_k = s->cfg.top_k > 0 && s->cfg.top_k < V;
    if (use_k) {
        const int64_t k = s->cfg.top_k;
        top_k_select(p, V, k);
        double total = 0;
        for (int64_t i = 0; i < k; i++) total += exp((double)p[i].z - (double)zmax);
        take_sorted(s, p, k, zmax, total);
        return 0;
    }
    if (s->cfg.top_p < 1) {
        /* mass of everything, then of the prefiltered head moved to the front */
        double total = 0, head = 0;
        int64_t nh = 0;
        const float cut = zmax - PREFILTER_GAP;
        for (int64_t i = 0; i < V; i++) {
            double w = exp((double)p[i].z - (double)zmax);
            total += w;
            if (p[i].z >= cut) {
                zpair t = p[nh];
                p[nh] = p[i];
                p[i] = t;
                nh++;
                head += w;
            }
        }
        if (head < s->cfg.top_p * total) nh = V; /* the head misses mass: sort everything */
        qsort(p, (size_t)nh, sizeof *p, cmp_rank);
        take_sorted(s, p, nh, zmax, total);
        return 0;
    }
    /* no top-k or top-p: softmax of every token (min-p: of those with a weight of at least
     * min_p, the top token's weight being 1), in id order */
    const double min_p = s->cfg.min_p;
    double total = 0;
    int64_t m = 0;
    for (int64_t i = 0; i < V; i++) {
        double w = exp((double)p[i].z - (double)zmax);
        if (w < min_p) continue;
        s->cand_id[m] = (int32_t)i;
        s->cand_p[m++] = w;
        total += w;
    }
    for (int64_t i = 0; i < m; i++) s->cand_p[i] /= total;
    s->n_cand = m;
    return 0;
}

int ft_sample_next(ft_sampler *s, const float *logits, int32_t *token)
{
    return ft_sample_next_seen(s, logits, NULL, token);
}

int ft_sample_next_seen(ft_sampler *s, const float *logits, const ft_sample_seen *seen,
                        int32_t *token)
{
    FT_TRY(ft_sample_dist_seen(s, logits, seen));
    if (s->n_cand == 1) {
        *token = s->cand_id[0];
        return 0;
    }
    /* u uniform in [0, 1) with 53 random bits; the first candidate whose cumulative
     * probability exceeds u (the last one if rounding leaves the sum just below u) */
    const double u = (double)(ft_rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
    double cum = 0;
    for (int64_t i = 0; i < s->n_cand; i++) {
        cum += s->cand_p[i];
        if (u < cum) {
            *token = s->cand_id[i];
            return 0;
        }
    }
    *token = s->cand_id[s->n_cand - 1];
    return 0;
}

static int add_id(int32_t *ids, int n, int cap, int64_t id)
{
    if (id < 0 || id > INT32_MAX || n >= cap) return n;
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return n;
    ids[n] = (int32_t)id;
    return n + 1;
}

int ft_sample_stop_ids(const ft_model_config *cfg, const ft_tokenizer *tok, const char *eot,
                       int32_t *ids, int cap)
{
    int n = 0;
    if (cfg)
        for (int i = 0; i < cfg->n_eos && i < FT_MAX_EOS; i++) n = add_id(ids, n, cap, cfg->eos_token_id[i]);
    if (tok) {
        n = add_id(ids, n, cap, ft_tok_eos(tok));
        if (eot) n = add_id(ids, n, cap, ft_tok_id(tok, eot));
    }
    return n;
}
