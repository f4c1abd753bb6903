/* test_generate.c - generation: the KV-cache attention op, cached decoding against full
 * recomputation, prefill against the training executor's logits, sampling (greedy,
 * temperature, top-k, top-p) with a fixed seed, stop tokens, generation prompts and the
 * streaming detokenizer, and the prompts of a --prompts file (records, their ids, per-record
 * seeds, a cache reused across prompts), and the weights read through an executor (an NF4
 * pack: CPU streamed and resident, cpu-device tiers, tied and untied; a device's bf16 copies). Model: tests/fixtures/tiny-llama (2 layers, GQA 4/2 heads). */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/template/chat.h"
#include "src/data/dataset.h"
#include "src/infer/generate.h"
#include "src/infer/gen_prompt.h"
#include "src/infer/stop_text.h"
#include "src/tools/init_model.h"
#include "src/model/model.h"
#include "src/infer/sample.h"
#include "tests/unit/model_fixture.h"
#include "tests/unit/tok_template.h"

#define TOK_LLAMA3 "tests/fixtures/tokenizers/llama3"
#define TOK_LLAMA2 "tests/fixtures/tokenizers/llama2"

/* attention_kv_fwd (fp32, online softmax) vs a float64 reference: fp32 rounding of dot
 * products over D <= 64 and sums over <= 400 keys, a few 1e-7 relative in practice. */
#define FT_TOL_KV_ATTN_ABS 2e-6
#define FT_TOL_KV_ATTN_REL 1e-5
/* Cached decoding vs full recomputation of the same tokens: the same math with the
 * attention summed in another order (attention_kv_fwd vs attention_fwd's BLAS tiles), so
 * fp32 reassociation only; relative to the largest |logit|. */
#define FT_TOL_KV_DECODE_REL 1e-5
/* The same on a device backend, which rounds each GEMM's activations to bf16 (cpu-device as
 * CUDA): an fp32 reassociation can move an activation to the neighbouring bf16 value, one bf16
 * ulp (2^-8 relative) of that term; measured 1.1e-4 of max |logit| at worst on tiny-llama. */
#define FT_TOL_KV_DECODE_BF16_REL 3.90625e-3
/* Empirical frequencies of N draws vs the distribution: |f - p| <= Z * sqrt(p(1-p)/N). */
#define FT_SAMPLE_Z 5.0
#define FT_SAMPLE_N 40000

/* ---- helpers ------------------------------------------------------------------------------ */

static void fill(float *x, int64_t n, ft_rng *r, float amp)
{
    for (int64_t i = 0; i < n; i++) x[i] = (2.0f * ft_rng_uniform(r) - 1.0f) * amp;
}

/* float64 causal attention of queries at positions p..p+nq-1 against keys 0..p+i. */
static void attn_ref(double *out, const float *q, const float *k, const float *v, int64_t p,
                     int64_t nq, int64_t H, int64_t Hkv, int64_t D, double scale)
{
    const int64_t G = H / Hkv;
    double *s = malloc((size_t)(p + nq) * sizeof *s);
    for (int64_t i = 0; i < nq; i++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / G, nk = p + i + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < nk; j++) {
                double d = 0;
                for (int64_t e = 0; e < D; e++)
                    d += (double)q[(i * H + h) * D + e] * (double)k[(j * Hkv + g) * D + e];
                s[j] = d * scale;
                mx = fmax(mx, s[j]);
            }
            for (int64_t j = 0; j < nk; j++) sum += (s[j] = exp(s[j] - mx));
            for (int64_t e = 0; e < D; e++) {
                double o = 0;
                for (int64_t j = 0; j < nk; j++) o += s[j] * (double)v[(j * Hkv + g) * D + e];
                out[(i * H + h) * D + e] = o / sum;
            }
        }
    free(s);
}

/* ---- attention_kv_fwd --------------------------------------------------------------------- */

static void check_kv_case(ft_backend *be, int64_t p, int64_t nq, int64_t H, int64_t Hkv,
                          int64_t D, uint64_t seed)
{
    const int64_t nk = p + nq;
    float *q = malloc((size_t)(nq * H * D) * 4), *k = malloc((size_t)(nk * Hkv * D) * 4),
          *v = malloc((size_t)(nk * Hkv * D) * 4), *o = malloc((size_t)(nq * H * D) * 4);
    double *ref = malloc((size_t)(nq * H * D) * 8);
    ft_rng r;
    ft_rng_seed(&r, seed);
    fill(q, nq * H * D, &r, 2.0f); /* scores of a few units: a peaked softmax */
    fill(k, nk * Hkv * D, &r, 2.0f);
    fill(v, nk * Hkv * D, &r, 1.0f);
    const float scale = 1.0f / sqrtf((float)D);
    assert_int_equal(be->ops->attention_kv_fwd(be, o, q, k, v, p, nq, H, Hkv, D, scale), 0);
    attn_ref(ref, q, k, v, p, nq, H, Hkv, D, scale);
    double err = 0;
    int bad = 0;
    for (int64_t i = 0; i < nq * H * D; i++) {
        double d = fabs((double)o[i] - ref[i]);
        err = fmax(err, d);
        if (d > FT_TOL_KV_ATTN_ABS + FT_TOL_KV_ATTN_REL * fabs(ref[i]) && bad++ < 3)
            printf("  mismatch at %lld: %.9g vs %.9g\n", (long long)i, o[i], ref[i]);
    }
    printf("attention_kv_fwd p=%lld n_q=%lld H=%lld Hkv=%lld D=%lld: max abs err %.3e vs fp64\n",
           (long long)p, (long long)nq, (long long)H, (long long)Hkv, (long long)D, err);
    assert_int_equal(bad, 0);
    free(q); free(k); free(v); free(o); free(ref);
}

static void test_attention_kv_vs_fp64(void **state)
{
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    check_kv_case(be, 0, 1, 4, 2, 16, 1);     /* first token: attends to itself only */
    check_kv_case(be, 37, 1, 4, 2, 16, 2);    /* one decode step */
    check_kv_case(be, 300, 1, 9, 3, 64, 3);   /* SmolLM2 heads, > 2 key tiles of 128 */
    check_kv_case(be, 21, 7, 4, 1, 32, 4);    /* a chunk after a cached prefix, MQA */
    check_kv_case(be, 250, 40, 8, 8, 8, 5);   /* MHA, chunk crossing a tile boundary */
    ft_backend_free(be);
}

/* With p = 0 the op computes what attention_fwd does on one sequence. */
static void test_attention_kv_matches_attention_fwd(void **state)
{
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    const int64_t T = 200, H = 6, Hkv = 2, D = 32;
    float *q = malloc((size_t)(T * H * D) * 4), *k = malloc((size_t)(T * Hkv * D) * 4),
          *v = malloc((size_t)(T * Hkv * D) * 4), *o1 = malloc((size_t)(T * H * D) * 4),
          *o2 = malloc((size_t)(T * H * D) * 4), *lse = malloc((size_t)(T * H) * 4),
          *o3 = malloc((size_t)(T * H * D) * 4);
    int32_t *ss = calloc((size_t)T, 4);
    ft_rng r;
    ft_rng_seed(&r, 11);
    fill(q, T * H * D, &r, 1.5f);
    fill(k, T * Hkv * D, &r, 1.5f);
    fill(v, T * Hkv * D, &r, 1.0f);
    const float sc = 1.0f / sqrtf((float)D);
    assert_int_equal(be->ops->attention_fwd(be, o1, lse, q, k, v, ss, T, H, Hkv, D, sc), 0);
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, q, k, v, 0, T, H, Hkv, D, sc), 0);
    /* the last 50 rows as a chunk after 150 cached ones */
    const int64_t p = 150;
    assert_int_equal(be->ops->attention_kv_fwd(be, o3, q + p * H * D, k, v, p, T - p, H, Hkv,
                                               D, sc), 0);
    double e2 = max_diff(o1, o2, T * H * D), e3 = max_diff(o1 + p * H * D, o3, (T - p) * H * D);
    printf("attention_kv_fwd vs attention_fwd (T=%lld): max abs diff %.3e (p=0), %.3e (p=%lld)\n",
           (long long)T, e2, e3, (long long)p);
    assert_true(e2 <= FT_TOL_KV_ATTN_ABS + FT_TOL_KV_ATTN_REL * max_abs(o1, T * H * D));
    assert_true(e3 <= FT_TOL_KV_ATTN_ABS + FT_TOL_KV_ATTN_REL * max_abs(o1, T * H * D));
    /* bad arguments are errors, not crashes */
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, q, k, v, -1, 1, H, Hkv, D, sc), FT_E_INVALID);
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, q, k, v, 0, 1, 5, 2, D, sc), FT_E_INVALID);
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, q, k, v, 0, 1, H, Hkv, 0, sc), FT_E_INVALID);
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, NULL, k, v, 0, 1, H, Hkv, D, sc), FT_E_INVALID);
    assert_int_equal(be->ops->attention_kv_fwd(be, o2, q, k, v, 3, 0, H, Hkv, D, sc), 0);
    free(q); free(k); free(v); free(o1); free(o2); free(o3); free(lse); free(ss);
    ft_backend_free(be);
}

/* ---- the model with a KV cache ----------------------------------------------------------- */

typedef model_fix fix;

/* 2 threads; r 4, alpha 8, every target; B = 0 at init would make the adapter a no-op: random
 * A and B (seed 99, scale 0.4), large enough to move the logits well beyond the tolerances */
static int setup(void **state)
{
    const ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    return model_fix_setup(state, 2, &lc, 99, 0.4f);
}

#define N_SEQ 24
/* "The quick brown fox jumps over the lazy dog near the river." (Llama-2 ids, with BOS),
 * then 8 more ids */
static const int32_t SEQ[N_SEQ] = {1, 415, 2936, 9060, 285, 1142, 461, 10575, 754, 272, 17898,
                                   3914, 3065, 272, 7782, 28723, 13, 1014, 4242, 349, 2,
                                   31999, 0, 12};

/* Cached decoding (prefill n0 tokens, then one token per forward, plus one multi-token
 * chunk) against a full recomputation of every prefix. */
static void decode_vs_recompute(fix *f, const ft_lora *lora, const char *label)
{
    const int64_t V = f->m->cfg.vocab_size, n0 = 6;
    ft_gen inc, full;
    assert_int_equal(ft_gen_init(&inc, f->be, f->m, lora, N_SEQ, N_SEQ, N_SEQ), 0);
    assert_int_equal(ft_gen_init(&full, f->be, f->m, lora, N_SEQ, N_SEQ, N_SEQ), 0);
    float *li = malloc((size_t)(N_SEQ * V) * 4), *lf = malloc((size_t)(N_SEQ * V) * 4);
    double worst = 0, scale = 0;

    assert_int_equal(ft_gen_forward(&inc, SEQ, n0, li, 1), 0);
    for (int64_t t = n0; t <= N_SEQ; t++) {
        /* inc holds t tokens and li the logits of token t-1 */
        ft_gen_reset(&full);
        assert_int_equal(ft_gen_forward(&full, SEQ, t, lf, 1), 0);
        assert_int_equal(full.n_past, t);
        assert_int_equal(inc.n_past, t);
        double d = max_diff(li, lf, V), s = max_abs(lf, V);
        worst = fmax(worst, d / s);
        scale = fmax(scale, s);
        if (d > FT_TOL_KV_DECODE_REL * s) printf("  step %lld: max diff %.3e (|logit| %.3g)\n", (long long)t, d, s);
        assert_true(d <= FT_TOL_KV_DECODE_REL * s);
        if (t < N_SEQ) assert_int_equal(ft_gen_forward(&inc, SEQ + t, 1, li, 1), 0);
    }
    /* a full cache refuses more tokens and stays as it was */
    assert_int_equal(ft_gen_forward(&inc, SEQ, 1, li, 1), FT_E_RANGE);
    assert_int_equal(inc.n_past, N_SEQ);

    /* chunk: 5 tokens, then 11 at once (every row's logits), then decode */
    const int64_t a = 5, b = 11;
    ft_gen_reset(&inc);
    assert_int_equal(ft_gen_forward(&inc, SEQ, a, li, 1), 0);
    assert_int_equal(ft_gen_forward(&inc, SEQ + a, b, li, b), 0);
    ft_gen_reset(&full);
    assert_int_equal(ft_gen_forward(&full, SEQ, a + b, lf, a + b), 0);
    double dc = max_diff(li, lf + a * V, b * V), sc = max_abs(lf + a * V, b * V);
    printf("[%s] cached decode vs recompute, %d steps: max diff %.3e of max |logit| (bound %.0e); "
           "chunk of %lld after %lld cached: %.3e\n", label, (int)(N_SEQ - n0 + 1), worst,
           FT_TOL_KV_DECODE_REL, (long long)b, (long long)a, dc / sc);
    assert_true(dc <= FT_TOL_KV_DECODE_REL * sc);
    /* the comparison can fail: logits of a different prefix are far off */
    ft_gen_reset(&full);
    assert_int_equal(ft_gen_forward(&full, SEQ + 1, a + b - 1, lf, 1), 0);
    assert_true(max_diff(li + (b - 1) * V, lf, V) > 100 * FT_TOL_KV_DECODE_REL * sc);
    free(li);
    free(lf);
    ft_gen_free(&inc);
    ft_gen_free(&full);
}

static void test_kv_decode_matches_recompute(void **state)
{
    fix *f = *state;
    decode_vs_recompute(f, NULL, "tiny-llama");
    decode_vs_recompute(f, &f->lora, "tiny-llama + LoRA r4");
}

/* SEQ as one micro-batch (next-token targets): ids receives it, le (N_SEQ, V) the executor's
 * logits of it. */
static void exec_seq_logits(ft_exec *ex, int32_t *ids, float *le)
{
    const int64_t T = N_SEQ;
    int32_t tg[N_SEQ], pos[N_SEQ], ss[N_SEQ] = {0};
    for (int64_t t = 0; t < T; t++) {
        ids[t] = SEQ[t];
        pos[t] = (int32_t)t;
        tg[t] = t + 1 < T ? SEQ[t + 1] : -100;
    }
    ft_batch b = {1, T, T, ids, tg, pos, ss, T - 1};
    assert_int_equal(ft_exec_logits(ex, &b, le), 0);
}

/* A prompt prefilled in one forward gives the logits of the training executor (ftune
 * logits) bit for bit: the same ops on the same shapes in the same order. */
static void prefill_vs_exec(fix *f, ft_lora *lora, const char *label)
{
    const int64_t T = N_SEQ, V = f->m->cfg.vocab_size;
    ft_exec ex;
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, lora, T, 1, T), 0);
    int32_t ids[N_SEQ];
    float *le = malloc((size_t)(T * V) * 4), *lg = malloc((size_t)(T * V) * 4);
    exec_seq_logits(&ex, ids, le);
    ft_gen g;
    assert_int_equal(ft_gen_init(&g, f->be, f->m, lora, T, T, T), 0);
    assert_int_equal(ft_gen_forward(&g, ids, T, lg, T), 0);
    double d = max_diff(le, lg, T * V);
    printf("[%s] prefill logits vs ft_exec_logits (T=%lld): max abs diff %.3e (%s)\n", label,
           (long long)T, d, memcmp(le, lg, (size_t)(T * V) * 4) ? "not bit-identical" : "bit-identical");
    assert_memory_equal(le, lg, (size_t)(T * V) * 4);
    /* the last row alone (what generation asks for) */
    ft_gen_reset(&g);
    assert_int_equal(ft_gen_forward(&g, ids, T, lg, 1), 0);
    d = max_diff(le + (T - 1) * V, lg, V);
    printf("[%s] prefill last row only: max abs diff %.3e\n", label, d);
    assert_true(d <= FT_TOL_KV_DECODE_REL * max_abs(le + (T - 1) * V, V));
    ft_gen_free(&g);
    ft_exec_free(&ex);
    free(le);
    free(lg);
}

static void test_prefill_equals_exec_logits(void **state)
{
    fix *f = *state;
    prefill_vs_exec(f, NULL, "tiny-llama");
    prefill_vs_exec(f, &f->lora, "tiny-llama + LoRA r4");
}

static void test_gen_bad_input(void **state)
{
    fix *f = *state;
    ft_gen g;
    float lg[32000];
    int32_t bad[2] = {1, 32000};
    assert_int_equal(ft_gen_init(&g, f->be, f->m, NULL, 4, 8, 1), FT_E_INVALID); /* chunk > ctx */
    assert_int_equal(ft_gen_init(&g, f->be, f->m, NULL, 0, 0, 0), FT_E_INVALID);
    assert_int_equal(ft_gen_init(&g, f->be, f->m, NULL, 8, 4, 2), 0);
    assert_int_equal(ft_gen_forward(&g, bad, 2, lg, 1), FT_E_INVALID); /* id >= V */
    assert_int_equal(g.n_past, 0);
    assert_int_equal(ft_gen_forward(&g, SEQ, 5, lg, 1), FT_E_RANGE);   /* > chunk */
    assert_int_equal(ft_gen_forward(&g, SEQ, 2, lg, 3), FT_E_RANGE);   /* rows > n */
    assert_int_equal(ft_gen_forward(&g, SEQ, 4, lg, 1), 0);
    assert_int_equal(ft_gen_forward(&g, SEQ, 4, lg, 1), 0);
    assert_int_equal(ft_gen_forward(&g, SEQ, 1, lg, 1), FT_E_RANGE);   /* cache full */
    assert_true(strstr(ft_errmsg(), "context full") != NULL);
    ft_gen_free(&g);
    ft_gen_free(&g); /* twice: zeroed, harmless */
}

/* ft_gen_prompt_logprobs against ft_sample_logprobs over the rows of one forward of the whole
 * prompt: a 10-token prompt in forwards of 3 rows (4 forwards, the later ones through the KV
 * cache) gives each token's log-probability and alternatives within FT_TOL_PLP (the chunked
 * logits are those of cached decoding, FT_TOL_KV_DECODE_REL of max |logit|; a log-softmax moves
 * by at most twice that), vLLM's ranks (ties within the tolerance aside), the first token's row
 * empty; the seq then holds the prompt and logits[0] the last row. Refusals change nothing. */
#define FT_TOL_PLP_REL (2 * FT_TOL_KV_DECODE_REL)

static void test_sample_greedy(void **state)
{
    ft_sampler s;
    ft_sample_cfg c = {0.0f, 0, 1.0f, 1};
    float x[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -INFINITY};
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    int32_t t = -1;
    assert_int_equal(ft_sample_next(&s, x, &t), 0);
    assert_int_equal(t, 1); /* tie 1 and 3: the lower id */
    assert_int_equal(s.n_cand, 1);
    x[2] = NAN;
    assert_int_equal(ft_sample_next(&s, x, &t), FT_E_NUMERIC);
    x[2] = INFINITY;
    assert_int_equal(ft_sample_next(&s, x, &t), FT_E_NUMERIC);
    ft_sampler_free(&s);
    /* settings are checked */
    ft_sample_cfg b1 = {-0.5f, 0, 1.0f, 0}, b2 = {1.0f, -1, 1.0f, 0}, b3 = {1.0f, 0, 0.0f, 0},
                  b4 = {1.0f, 0, 1.5f, 0};
    assert_int_equal(ft_sampler_init(&s, &b1, 6), FT_E_INVALID);
    assert_int_equal(ft_sampler_init(&s, &b2, 6), FT_E_INVALID);
    assert_int_equal(ft_sampler_init(&s, &b3, 6), FT_E_INVALID);
    assert_int_equal(ft_sampler_init(&s, &b4, 6), FT_E_INVALID);
    assert_int_equal(ft_sampler_init(&s, &c, 0), FT_E_INVALID);
}

/* Draws FT_SAMPLE_N tokens and checks every frequency against s->cand_p; returns the
 * largest z-score. Tokens outside the candidates must never appear. */
static double check_draws(ft_sampler *s, const float *x, int64_t V)
{
    assert_int_equal(ft_sample_dist(s, x), 0);
    double *want = calloc((size_t)V, sizeof *want), sum = 0;
    for (int64_t i = 0; i < s->n_cand; i++) {
        want[s->cand_id[i]] = s->cand_p[i];
        sum += s->cand_p[i];
    }
    assert_true(fabs(sum - 1.0) < 1e-12);
    int64_t *cnt = calloc((size_t)V, sizeof *cnt);
    for (int i = 0; i < FT_SAMPLE_N; i++) {
        int32_t t;
        assert_int_equal(ft_sample_next(s, x, &t), 0);
        assert_true(t >= 0 && t < V);
        cnt[t]++;
    }
    double zmax = 0;
    for (int64_t i = 0; i < V; i++) {
        double p = want[i], f = (double)cnt[i] / FT_SAMPLE_N;
        if (p == 0) {
            assert_int_equal(cnt[i], 0);
            continue;
        }
        double z = fabs(f - p) / sqrt(p * (1 - p) / FT_SAMPLE_N + 1e-300);
        zmax = fmax(zmax, z);
    }
    free(want);
    free(cnt);
    assert_true(zmax <= FT_SAMPLE_Z);
    return zmax;
}

/* probabilities 0.4 0.25 0.15 0.1 0.06 0.04 as logits (log p) */
static void probs_logits(float *x)
{
    const double p[6] = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
    const int perm[6] = {3, 0, 5, 1, 4, 2}; /* token ids not in probability order */
    for (int i = 0; i < 6; i++) x[perm[i]] = (float)log(p[i]);
}

static void test_sample_temperature(void **state)
{
    float x[6];
    probs_logits(x);
    const float T = 0.7f;
    ft_sampler s;
    ft_sample_cfg c = {T, 0, 1.0f, 42};
    assert_int_equal(ft_sampler_init(&s, &c, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 6);
    /* p_i = softmax(x / T) */
    double Z = 0;
    for (int i = 0; i < 6; i++) Z += exp((double)(x[i] / T));
    double err = 0;
    for (int64_t i = 0; i < s.n_cand; i++)
        err = fmax(err, fabs(s.cand_p[i] - exp((double)(x[s.cand_id[i]] / T)) / Z));
    assert_true(err < 1e-12);
    double z = check_draws(&s, x, 6);
    printf("temperature %.1f: softmax(x/T) max err %.1e; %d draws, max z-score %.2f (bound %.0f)\n",
           T, err, FT_SAMPLE_N, z, FT_SAMPLE_Z);
    ft_sampler_free(&s);
    /* a higher temperature flattens: the top probability drops */
    ft_sample_cfg hot = {2.0f, 0, 1.0f, 42}, cold = {0.25f, 0, 1.0f, 42};
    double ptop[2];
    ft_sample_cfg *cs[2] = {&hot, &cold};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ft_sampler_init(&s, cs[k], 6), 0);
        assert_int_equal(ft_sample_dist(&s, x), 0);
        ptop[k] = 0;
        for (int64_t i = 0; i < s.n_cand; i++)
            if (s.cand_id[i] == 3) ptop[k] = s.cand_p[i];
        ft_sampler_free(&s);
    }
    assert_true(ptop[0] < 0.4 && ptop[1] > 0.8);
}

static void test_sample_top_k_top_p(void **state)
{
    float x[6];
    probs_logits(x); /* ids by probability: 3 (0.4), 0 (.25), 5 (.15), 1 (.1), 4 (.06), 2 (.04) */
    ft_sampler s;
    /* top-k 3: ids 3, 0, 5 with 0.4, 0.25, 0.15 renormalised by 0.8 */
    ft_sample_cfg ck = {1.0f, 3, 1.0f, 5};
    assert_int_equal(ft_sampler_init(&s, &ck, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 3);
    const int32_t want_k[3] = {3, 0, 5};
    const double pk[3] = {0.5, 0.3125, 0.1875};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s.cand_id[i], want_k[i]);
        assert_true(fabs(s.cand_p[i] - pk[i]) < 1e-6);
    }
    double zk = check_draws(&s, x, 6);
    ft_sampler_free(&s);
    /* top-p: the shortest head reaching p (the crossing token kept) */
    const float tp[4] = {0.3f, 0.6f, 0.85f, 1.0f};
    const int64_t nk[4] = {1, 2, 4, 6};
    double zp = 0;
    for (int k = 0; k < 4; k++) {
        ft_sample_cfg cp = {1.0f, 0, tp[k], 6};
        assert_int_equal(ft_sampler_init(&s, &cp, 6), 0);
        assert_int_equal(ft_sample_dist(&s, x), 0);
        assert_int_equal(s.n_cand, nk[k]);
        if (tp[k] < 1) {
            double mass = 0;
            const double p[6] = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
            for (int i = 0; i < nk[k]; i++) mass += p[i];
            for (int i = 0; i < nk[k]; i++) assert_true(fabs(s.cand_p[i] - p[i] / mass) < 1e-6);
        }
        if (nk[k] > 1) zp = fmax(zp, check_draws(&s, x, 6));
        ft_sampler_free(&s);
    }
    /* both: top-k 4 (mass 0.9) then top-p 0.7 of that: 0.4/0.9 = .44, +.25/.9 = .72 >= .7 */
    ft_sample_cfg cb = {1.0f, 4, 0.7f, 8};
    assert_int_equal(ft_sampler_init(&s, &cb, 6), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    assert_int_equal(s.n_cand, 2);
    assert_int_equal(s.cand_id[0], 3);
    assert_int_equal(s.cand_id[1], 0);
    ft_sampler_free(&s);
    printf("top-k 3 and top-p 0.3/0.6/0.85/1: kept sets exact; max z-score %.2f / %.2f (bound %.0f)\n",
           zk, zp, FT_SAMPLE_Z);
}

/* Large vocabularies: the sorted head (and the prefilter shortcut of top-p) against a full
 * sort done here. */
static int cmp_desc(const void *a, const void *b)
{
    const float *x = a, *y = b;
    return x[0] > y[0] ? -1 : x[0] < y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

static void brute_top_p(const float *x, int64_t V, float T, int64_t k, float top_p, int64_t *n,
                        int32_t *ids)
{
    float (*pr)[2] = malloc((size_t)V * sizeof *pr);
    for (int64_t i = 0; i < V; i++) {
        pr[i][0] = x[i] / T;
        pr[i][1] = (float)i;
    }
    qsort(pr, (size_t)V, sizeof *pr, cmp_desc);
    int64_t m = k > 0 && k < V ? k : V;
    double tot = 0, cum = 0;
    for (int64_t i = 0; i < m; i++) tot += exp((double)pr[i][0] - (double)pr[0][0]);
    int64_t c = 0;
    for (; c < m; c++) {
        ids[c] = (int32_t)pr[c][1];
        cum += exp((double)pr[c][0] - (double)pr[0][0]);
        if (top_p < 1 && cum >= top_p * tot) { c++; break; }
    }
    *n = c;
    free(pr);
}

static void test_sample_large_vocab(void **state)
{
    const int64_t V = 50000;
    float *x = malloc((size_t)V * 4);
    int32_t *ids = malloc((size_t)V * 4);
    ft_rng r;
    ft_rng_seed(&r, 3);
    /* logits spread over 40 units: with T <= 1 most fall below the prefilter cut (25 under
     * the top), with T = 2 none do; a tie at the top */
    for (int64_t i = 0; i < V; i++) x[i] = 40.0f * ft_rng_uniform(&r);
    x[777] = x[778] = 41.0f;
    struct { float T, top_p; int64_t k; } cases[] = {
        {1.0f, 0.9f, 0}, {0.5f, 0.5f, 0}, {0.8f, 0.95f, 40}, {1.0f, 1.0f, 1000}, {2.0f, 0.3f, 0},
    };
    ft_sampler s;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ft_sample_cfg sc = {cases[c].T, cases[c].k, cases[c].top_p, 1};
        assert_int_equal(ft_sampler_init(&s, &sc, V), 0);
        assert_int_equal(ft_sample_dist(&s, x), 0);
        int64_t n;
        brute_top_p(x, V, cases[c].T, cases[c].k, cases[c].top_p, &n, ids);
        assert_int_equal(s.n_cand, n);
        for (int64_t i = 0; i < n; i++) assert_int_equal(s.cand_id[i], ids[i]);
        assert_int_equal(s.cand_id[0], 777); /* the tie: lower id first */
        ft_sampler_free(&s);
    }
    /* one dominant token 26 above the rest: the prefilter head (within 25 of the top)
     * misses 50000 e^-26 = 2.6e-7 of the mass, so top-p = 1 - 2^-24 must fall back to
     * sorting everything */
    for (int64_t i = 0; i < V; i++) x[i] = 0.0f;
    x[5] = 26.0f;
    ft_sample_cfg sc = {1.0f, 0, 0.99999994f, 1};
    assert_true(sc.top_p < 1.0f);
    assert_int_equal(ft_sampler_init(&s, &sc, V), 0);
    assert_int_equal(ft_sample_dist(&s, x), 0);
    int64_t n;
    brute_top_p(x, V, 1.0f, 0, sc.top_p, &n, ids);
    assert_true(n > 1);
    assert_int_equal(s.n_cand, n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(s.cand_id[i], ids[i]);
    ft_sampler_free(&s);
    printf("V=%lld: top-k/top-p candidate lists equal a full sort in 6 cases (fallback: %lld kept)\n",
           (long long)V, (long long)n);
    free(x);
    free(ids);
}

static void test_sample_seeded(void **state)
{
    const int64_t V = 1000;
    float *x = malloc((size_t)V * 4);
    ft_rng r;
    ft_rng_seed(&r, 9);
    for (int64_t i = 0; i < V; i++) x[i] = 3.0f * ft_rng_uniform(&r);
    int32_t a[64], b[64], c[64];
    uint64_t seeds[3] = {1234, 1234, 1235};
    int32_t *outs[3] = {a, b, c};
    for (int k = 0; k < 3; k++) {
        ft_sampler s;
        ft_sample_cfg sc = {1.0f, 50, 0.9f, seeds[k]};
        assert_int_equal(ft_sampler_init(&s, &sc, V), 0);
        for (int i = 0; i < 64; i++) assert_int_equal(ft_sample_next(&s, x, &outs[k][i]), 0);
        ft_sampler_free(&s);
    }
    assert_memory_equal(a, b, sizeof a);
    int same = 0;
    for (int i = 0; i < 64; i++) same += a[i] == c[i];
    assert_true(same < 32); /* another seed, another sequence */
    free(x);
}

/* ---- stop tokens, prompts, streaming ------------------------------------------------------ */

static void test_stop_ids_and_prompt(void **state)
{
    fix *f = *state;
    ft_tokenizer *t2, *t3;
    assert_int_equal(ft_tok_load_dir(&t2, TOK_LLAMA2), 0);
    assert_int_equal(ft_tok_load_dir(&t3, TOK_LLAMA3), 0);
    int32_t st[8];
    /* tiny-llama: config eos 2, tokenizer </s> = 2; "<|im_end|>" is not in the vocabulary */
    int n = ft_sample_stop_ids(&f->m->cfg, t2, "<|im_end|>", st, 8);
    assert_int_equal(n, 1);
    assert_int_equal(st[0], 2);
    n = ft_sample_stop_ids(NULL, t3, ft_chat_end_of_turn(FT_CHAT_LLAMA3), st, 8);
    int has_eot = 0;
    for (int i = 0; i < n; i++) has_eot |= st[i] == ft_tok_id(t3, "<|eot_id|>");
    assert_true(has_eot && ft_tok_id(t3, "<|eot_id|>") == 128009);

    /* llama3 template with the generation prompt */
    int32_t *ids;
    int64_t k;
    int tm;
    char *text;
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_AUTO, "Be brief.", "Hi there", 0, &ids, &k, &tm), 0);
    assert_int_equal(tm, FT_CHAT_LLAMA3);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                              "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                              "Hi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(ids);
    free(text);
    /* llama3.1 forced: the system turn with its date lines comes first, then the user's */
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_LLAMA31, " Be brief. ", "Hi", 0, &ids, &k, &tm), 0);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                              "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                              "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(ids);
    free(text);
    /* chatml forced on the same tokenizer */
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_CHATML, NULL, "Hi", 0, &ids, &k, &tm), 0);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(ids);
    free(text);
    /* qwen3 forced: the prompt is ChatML's (the model opens its own <think>), and an earlier
     * assistant turn loses its reasoning (it precedes the last user query) */
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_QWEN3, "Sys", "Hi", 0, &ids, &k, &tm), 0);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n");
    free(ids);
    free(text);
    /* --no-think (enable_thinking=False): the template's empty thinking block ends the prompt;
     * chatml has no such switch and ignores the flag */
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_QWEN3, "Sys", "Hi", FT_GEN_NO_THINK, &ids, &k, &tm), 0);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(ids);
    free(text);
    assert_int_equal(ft_gen_prompt_ids(t3, FT_CHAT_CHATML, NULL, "Hi", FT_GEN_NO_THINK, &ids, &k, &tm), 0);
    assert_int_equal(ft_tok_decode(t3, ids, k, 0, &text), 0);
    assert_string_equal(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(ids);
    free(text);
    {
        ft_chat_msg h[3] = {{FT_ROLE_USER, "a", 1, NULL, 0, 0},
                            {FT_ROLE_ASSISTANT, "<think>r</think>\nb", 18, NULL, 0, 1},
                            {FT_ROLE_USER, "c", 1, NULL, 0, 0}};
        ft_chat_text q = {0};
        assert_int_equal(ft_chat_render_prompt(&q, FT_CHAT_QWEN3, h, 3, NULL), 0);
        assert_string_equal(q.text, "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                                    "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n");
        assert_string_equal(ft_chat_end_of_turn(FT_CHAT_QWEN3), "<|im_end|>");
        assert_int_equal(ft_chat_template_parse("qwen3"), FT_CHAT_QWEN3);
        assert_string_equal(ft_chat_template_name(FT_CHAT_QWEN3), "qwen3");
        assert_int_equal(ft_chat_detect_str("<|im_start|>{{ '<think>' }} ns.last_query_index"),
                         FT_CHAT_QWEN3);
        /* ChatML with <think> but not Qwen3's rules (QwQ, distills): the template itself */
        assert_int_equal(ft_chat_detect_str("<|im_start|>{{ '<think>' }}"), FT_CHAT_JINJA);
        assert_int_equal(ft_chat_detect_str("<|im_start|>{{ x }}"), FT_CHAT_CHATML);
        assert_int_equal(ft_chat_detect_str("<|start_header_id|> Cutting Knowledge Date"), FT_CHAT_LLAMA31);
        assert_int_equal(ft_chat_template_parse("llama3.1"), FT_CHAT_LLAMA31);
        assert_int_equal(ft_chat_detect_str("<|user|>..<|assistant|>"), FT_CHAT_ZEPHYR);
        /* Phi-3 has no built-in renderer: the engine renders its template; no template at all
         * is the Alpaca prompt */
        assert_int_equal(ft_chat_detect_str("<|user|>..<|assistant|>..<|end|>"), FT_CHAT_JINJA);
        assert_int_equal(ft_chat_detect_str(NULL), FT_CHAT_ALPACA);
        assert_int_equal(ft_chat_template_parse("jinja"), FT_CHAT_JINJA);
        /* what a template writes after a reply: the end-of-turn token generation stops on */
        static const struct { const char *src, *eot; } E[] = {
            {"{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content | trim }}<end_of_turn>\n"
             "{% endfor %}", "<end_of_turn>"},
            {"{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
             "{% if not add_generation_prompt %}{{ eos_token }}{% endif %}", "<|end|>"},
            {"{% for m in messages %}{{ m.content }} {{ eos_token }}{% endfor %}", "</s>"},
            {"{% for m in messages %}{{ m.content }}\n\n{% endfor %}", ""},
        };
        for (size_t i = 0; i < sizeof E / sizeof *E; i++) {
            char eot[64] = "x";
            ft_chat_ctx jc = {"<s>", "</s>", E[i].src};
            assert_int_equal(ft_chat_jinja_end_of_turn(&jc, eot, sizeof eot), 0);
            assert_string_equal(eot, E[i].eot);
        }
        ft_chat_text z = {0};
        ft_chat_ctx zc = {"<s>", "</s>", NULL};
        assert_int_equal(ft_chat_render_prompt(&z, FT_CHAT_ZEPHYR, h, 3, &zc), 0);
        assert_string_equal(z.text, "<|user|>\na</s>\n<|assistant|>\n<think>r</think>\nb</s>\n"
                                    "<|user|>\nc</s>\n<|assistant|>\n");
        ft_chat_text_free(&z);
        ft_chat_text_free(&q);
    }
    /* llama2 (tiny-llama's tokenizer has no template: alpaca by detection; force llama2) */
    assert_int_equal(ft_gen_prompt_ids(t2, FT_CHAT_LLAMA2, NULL, "Hi", 0, &ids, &k, &tm), 0);
    assert_int_equal(ids[0], 1); /* BOS from the template */
    assert_int_equal(ft_tok_decode(t2, ids, k, 1, &text), 0);
    assert_string_equal(text, "[INST] Hi [/INST]");
    free(ids);
    free(text);
    /* raw: BOS from the post-processor, then the text */
    assert_int_equal(ft_gen_prompt_ids(t2, FT_CHAT_AUTO, NULL, "Hello", 1, &ids, &k, &tm), 0);
    assert_int_equal(ids[0], 1);
    assert_true(k >= 2);
    free(ids);
    /* a prompt ending with an assistant turn has no generation prompt */
    ft_chat_msg m = {FT_ROLE_ASSISTANT, "x", 1, NULL, 0, 0};
    ft_chat_text ct = {0};
    assert_int_equal(ft_chat_render_prompt(&ct, FT_CHAT_CHATML, &m, 1, NULL), FT_E_INVALID);
    ft_chat_text_free(&ct);
    ft_tok_free(t2);
    ft_tok_free(t3);
}

static int valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!L || i + L > n) return 0;
        for (size_t k = 1; k < L; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += L;
    }
    return 1;
}

static void stream_check(const char *dir, const char *text)
{
    ft_tokenizer *t;
    assert_int_equal(ft_tok_load_dir(&t, dir), 0);
    int32_t *ids;
    int64_t n;
    assert_int_equal(ft_tok_encode(t, text, strlen(text), 0, &ids, &n), 0);
    char *full;
    assert_int_equal(ft_tok_decode(t, ids, n, 1, &full), 0);
    ft_detok d;
    ft_detok_init(&d, t);
    char *acc = calloc(strlen(full) + 64, 1);
    size_t an = 0;
    int held = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *p;
        size_t pn;
        assert_int_equal(ft_detok_push(&d, ids[i], &p, &pn), 0);
        if (pn == 0) held++;
        assert_true(valid_utf8(p, pn));          /* whole characters only */
        assert_null(strstr(p, "\xEF\xBF\xBD")); /* never a replacement character */
        assert_true(an + pn <= strlen(full));
        memcpy(acc + an, p, pn);
        an += pn;
    }
    const char *p;
    size_t pn;
    assert_int_equal(ft_detok_flush(&d, &p, &pn), 0);
    memcpy(acc + an, p, pn);
    an += pn;
    acc[an] = 0;
    printf("stream %s: %lld tokens, %d held back (split characters), %zu bytes\n", dir,
           (long long)n, held, an);
    assert_string_equal(acc, full);
    assert_true(held > 0); /* the text has characters split over several tokens */
    ft_detok_free(&d);
    free(acc);
    free(full);
    free(ids);
    ft_tok_free(t);
}

static void test_stream_utf8(void **state)
{
    const char *text = " Tokyo — 東京 😀 café 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꧁꧂ and 🇺🇸!\nNext line  ok";
    stream_check(TOK_LLAMA3, text); /* byte-level BPE */
    stream_check(TOK_LLAMA2, text); /* SentencePiece with <0xHH> byte fallback */
}

/* ---- prompts files (ftune generate --prompts) --------------------------------------------- */

/* Parses the JSON text j into q; returns ft_gen_req_parse's code. */
static int parse_req(ft_gen_req *q, const char *j, const char *sys, int raw)
{
    cJSON *c = cJSON_Parse(j);
    assert_non_null(c);
    int rc = ft_gen_req_parse(q, c, sys, raw);
    cJSON_Delete(c); /* q owns its strings */
    return rc;
}

/* A record ft_gen_req_parse must refuse: FT_E_INVALID, a message holding `why`. */
typedef struct bad_req { const char *json; int raw; const char *why; } bad_req;

/* Each of bad[0..n) is refused with its message, and q is left empty. */
static void expect_refused(const bad_req *bad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ft_gen_req q;
        memset(&q, 0x5a, sizeof q);
        int rc = parse_req(&q, bad[i].json, NULL, bad[i].raw);
        if (rc != FT_E_INVALID || !strstr(ft_errmsg(), bad[i].why))
            fail_msg("record %s: rc %d, message '%s' (expected '%s')", bad[i].json, rc,
                     ft_errmsg(), bad[i].why);
        assert_null(q.msgs);
        assert_int_equal(q.n_msgs, 0);
        assert_null(q.user);
        assert_null(q.tools);
        assert_null(q.params.stop);
        assert_null(q.params.stop_ids);
        assert_int_equal(q.params.set, 0);
    }
}

static void expect_msg(const ft_gen_req *q, int64_t i, int role, const char *content)
{
    assert_true(i < q->n_msgs);
    assert_int_equal(q->msgs[i].role, role);
    assert_string_equal(q->msgs[i].content, content);
    assert_int_equal(q->msgs[i].content_n, strlen(content));
}

static void test_gen_req_parse(void **state)
{
    ft_gen_req q;
    /* a string; the default system message goes first */
    assert_int_equal(parse_req(&q, "\"Hi\"", NULL, 0), 0);
    assert_int_equal(q.n_msgs, 1);
    expect_msg(&q, 0, FT_ROLE_USER, "Hi");
    assert_string_equal(q.user, "Hi");
    assert_null(q.reference);
    ft_gen_req_free(&q);
    assert_int_equal(parse_req(&q, "\"Hi\"", "Sys", 0), 0);
    assert_int_equal(q.n_msgs, 2);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "Sys");
    ft_gen_req_free(&q);
    /* prompt + system (its own wins over the default; "" is kept, as --system "") */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"system\": \"S\", \"completion\": \"C\", \"id\": 3}", "D", 0), 0);
    assert_int_equal(q.n_msgs, 2);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "S");
    expect_msg(&q, 1, FT_ROLE_USER, "P");
    assert_string_equal(q.reference, "C");
    ft_gen_req_free(&q);
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"system\": \"\"}", NULL, 0), 0);
    assert_int_equal(q.n_msgs, 2);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "");
    ft_gen_req_free(&q);
    /* messages: the final assistant turn is the reference; text parts joined; aliases */
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                   "{\"role\": \"gpt\", \"content\": \"b\"}, {\"role\": \"human\", "
                                   "\"content\": [{\"type\": \"text\", \"text\": \"c\"}, {\"type\": "
                                   "\"text\", \"text\": \"d\"}]}, {\"role\": \"assistant\", "
                                   "\"content\": \"ref\"}]}", "D", 0), 0);
    assert_int_equal(q.n_msgs, 4);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "D");
    expect_msg(&q, 1, FT_ROLE_USER, "a");
    expect_msg(&q, 2, FT_ROLE_ASSISTANT, "b");
    expect_msg(&q, 3, FT_ROLE_USER, "cd");
    assert_string_equal(q.user, "cd");
    assert_string_equal(q.reference, "ref");
    ft_gen_req_free(&q);
    /* a conversation with its own system turn does not get the default one */
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
                                   "{\"role\": \"user\", \"content\": \"u\"}]}", "D", 0), 0);
    assert_int_equal(q.n_msgs, 2);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "s");
    assert_null(q.reference);
    ft_gen_req_free(&q);
    /* alpaca: instruction + input; output is the reference; an empty system is none */
    assert_int_equal(parse_req(&q, "{\"instruction\": \"Add.\", \"input\": \"2 3\", \"output\": \"5\", "
                                   "\"system\": \"\", \"history\": [[\"q\", \"a\"]]}", NULL, 0), 0);
    assert_int_equal(q.n_msgs, 3);
    expect_msg(&q, 0, FT_ROLE_USER, "q");
    expect_msg(&q, 1, FT_ROLE_ASSISTANT, "a");
    expect_msg(&q, 2, FT_ROLE_USER, "Add.");
    assert_string_equal(q.msgs[2].input, "2 3");
    assert_string_equal(q.user, "Add.\n\n2 3");
    assert_string_equal(q.reference, "5");
    ft_gen_req_free(&q);
    /* sharegpt, converted as training converts it (its "system" field first) */
    assert_int_equal(parse_req(&q, "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, "
                                   "{\"from\": \"gpt\", \"value\": \"yo\"}], \"system\": \"S\"}", "D", 0), 0);
    assert_int_equal(q.n_msgs, 2);
    expect_msg(&q, 0, FT_ROLE_SYSTEM, "S");
    expect_msg(&q, 1, FT_ROLE_USER, "hi");
    assert_string_equal(q.user, "hi");
    assert_string_equal(q.reference, "yo");
    ft_gen_req_free(&q);
    /* reasoning_content is kept for the template (qwen3 writes it after the last query) */
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
                                   "{\"role\": \"assistant\", \"content\": \"c\", \"reasoning_content\": \"R\"}, "
                                   "{\"role\": \"tool\", \"content\": \"t\"}]}", NULL, 0), 0);
    assert_int_equal(q.n_msgs, 3);
    assert_non_null(q.msgs[1].reasoning);
    assert_int_equal(q.msgs[1].reasoning_n, 1);
    assert_memory_equal(q.msgs[1].reasoning, "R", 1);
    ft_gen_req_free(&q);
    /* raw: the text alone, no system message (the default one is ignored, as with --prompt) */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"<s>x\"}", "D", 1), 0);
    assert_int_equal(q.n_msgs, 1);
    assert_string_equal(q.user, "<s>x");
    ft_gen_req_free(&q);

    /* bad records: FT_E_INVALID, q left empty, a message saying why */
    static const bad_req bad[] = {
        {"42", 0, "found a number"},
        {"[\"a\"]", 0, "found a list"},
        {"{\"text\": \"a\"}", 0, "not a conversation"},
        {"{\"prompt\": 1}", 0, "'prompt' must be a string"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}]}", 0, "'messages'"},
        {"{\"prompt\": \"a\", \"system\": 2}", 0, "'system' must be a string"},
        {"{\"messages\": []}", 0, "end with a user turn"},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", 0, "end with a user turn"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\"}, {\"role\": \"assistant\", \"content\": \"c\"}]}", 0, "end with a user turn"},
        {"{\"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}", 0, "unknown role 'robot'"},
        {"{\"messages\": [{\"role\": \"user\"}]}", 0, "needs 'content'"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 0, "content must be a string"},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"tool\", "
         "\"content\": \"t\"}]}", 0, "no user turn"},
        {"{\"instruction\": 3}", 0, "needs a string 'instruction'"},
        {"{\"instruction\": \"a\", \"history\": [[\"q\"]]}", 0, "history"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", 1, "--raw"},
        {"{\"instruction\": \"a\"}", 1, "--raw"},
        {"{\"prompt\": \"a\", \"system\": \"s\"}", 1, "--raw"},
    };
    expect_refused(bad, sizeof bad / sizeof *bad);
}

/* A record's own generation settings (ft_gen_params): every key, OpenAI's / vLLM's names,
 * null as absent, in each record form; bad values refused naming the key. */
static void test_gen_req_params(void **state)
{
    ft_gen_req q;
    /* a string record and an object without settings: none */
    assert_int_equal(parse_req(&q, "\"Hi\"", NULL, 0), 0);
    assert_int_equal(q.params.set, 0);
    ft_gen_req_free(&q);
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"id\": 3, \"temperature\": null}", NULL, 0), 0);
    assert_int_equal(q.params.set, 0);
    ft_gen_req_free(&q);
    /* all of them */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"max_new_tokens\": 7, \"temperature\": 0.7, "
                                   "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, "
                                   "\"repetition_penalty\": 1.3, \"stop\": [\"a\", \"bc\"], "
                                   "\"seed\": 9007199254740991}", NULL, 0), 0);
    const ft_gen_params *p = &q.params;
    assert_int_equal(p->set, FT_GEN_SET_MAX_NEW | FT_GEN_SET_TEMPERATURE | FT_GEN_SET_TOP_P |
                                 FT_GEN_SET_TOP_K | FT_GEN_SET_MIN_P | FT_GEN_SET_REP_PENALTY |
                                 FT_GEN_SET_STOP | FT_GEN_SET_SEED);
    assert_int_equal(p->max_new_tokens, 7);
    assert_true(p->temperature == (float)0.7 && p->top_p == (float)0.9 && p->min_p == (float)0.05 &&
                p->repetition_penalty == (float)1.3);
    assert_int_equal(p->top_k, 40);
    assert_int_equal(p->n_stop, 2);
    assert_string_equal(p->stop[0], "a");
    assert_string_equal(p->stop[1], "bc");
    assert_true(p->seed == 9007199254740991ull);
    ft_gen_req_free(&q);
    assert_null(q.params.stop);
    /* a line `generate --prompts` wrote, fed back: its "stop" is why the reply ended, not a
     * stop string; its "seed" stays the record's */
    assert_int_equal(parse_req(&q, "{\"index\": 0, \"prompt\": \"P\", \"reply\": \"R\", "
                                   "\"stop\": \"length\", \"seed\": 5}", NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_SEED);
    assert_int_equal(q.params.n_stop, 0);
    ft_gen_req_free(&q);
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"stop\": \"length\"}", NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_STOP);
    ft_gen_req_free(&q);
    /* OpenAI's names; a stop string alone; [] is no stop string (set: it replaces --stop) */
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}], "
                                   "\"max_tokens\": 5, \"stop\": \"END\", \"temperature\": 0}", NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_MAX_NEW | FT_GEN_SET_STOP | FT_GEN_SET_TEMPERATURE);
    assert_int_equal(q.params.max_new_tokens, 5);
    assert_int_equal(q.params.n_stop, 1);
    assert_string_equal(q.params.stop[0], "END");
    assert_true(q.params.temperature == 0);
    ft_gen_req_free(&q);
    assert_int_equal(parse_req(&q, "{\"instruction\": \"i\", \"max_completion_tokens\": 4, "
                                   "\"max_tokens\": 4, \"stop\": []}", NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_MAX_NEW | FT_GEN_SET_STOP);
    assert_int_equal(q.params.max_new_tokens, 4);
    assert_int_equal(q.params.n_stop, 0);
    ft_gen_req_free(&q);
    /* --raw records carry them too */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"<s>x\", \"seed\": 0, \"top_k\": 0}", NULL, 1), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_SEED | FT_GEN_SET_TOP_K);
    ft_gen_req_free(&q);
    /* vLLM's stop_token_ids ([]: no stop id, set: it replaces --stop-token-ids) */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"stop_token_ids\": [7, 0, 2147483647]}",
                               NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_STOP_IDS);
    assert_int_equal(q.params.n_stop_ids, 3);
    assert_int_equal(q.params.stop_ids[0], 7);
    assert_int_equal(q.params.stop_ids[1], 0);
    assert_int_equal(q.params.stop_ids[2], INT32_MAX);
    ft_gen_req_free(&q);
    assert_null(q.params.stop_ids);
    assert_int_equal(parse_req(&q, "{\"prompt\": \"P\", \"stop_token_ids\": []}", NULL, 0), 0);
    assert_int_equal(q.params.set, FT_GEN_SET_STOP_IDS);
    assert_int_equal(q.params.n_stop_ids, 0);
    ft_gen_req_free(&q);

    static const bad_req bad[] = {
        {"{\"prompt\": \"a\", \"temperature\": -0.5}", 0, "'temperature' -0.5: expected a finite value >= 0"},
        {"{\"prompt\": \"a\", \"temperature\": 1e39}", 0, "'temperature' 1e+39"},
        {"{\"prompt\": \"a\", \"temperature\": \"1\"}", 0, "'temperature' must be a number, found a string"},
        {"{\"prompt\": \"a\", \"top_p\": 0}", 0, "'top_p' 0: expected 0 < top_p <= 1"},
        {"{\"prompt\": \"a\", \"top_p\": 1.01}", 0, "'top_p' 1.01"},
        {"{\"prompt\": \"a\", \"top_k\": -1}", 0, "'top_k' -1: expected an integer >= 0"},
        {"{\"prompt\": \"a\", \"top_k\": 0.5}", 0, "'top_k' 0.5"},
        {"{\"prompt\": \"a\", \"min_p\": -0.1}", 0, "'min_p' -0.1"},
        {"{\"prompt\": \"a\", \"repetition_penalty\": 0}", 0, "'repetition_penalty' 0: expected a finite value > 0"},
        {"{\"prompt\": \"a\", \"repetition_penalty\": [1]}", 0, "'repetition_penalty' must be a number, found a list"},
        {"{\"prompt\": \"a\", \"max_new_tokens\": 0}", 0, "'max_new_tokens' 0: expected 1..1000000"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1000001}", 0, "'max_tokens' 1000001"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", 0, "'max_tokens' 2.5"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2, \"max_completion_tokens\": 3}", 0,
         "'max_tokens' 2 and 'max_completion_tokens' 3"},
        {"{\"prompt\": \"a\", \"stop\": \"\"}", 0, "'stop': expected a non-empty string"},
        {"{\"prompt\": \"a\", \"stop\": [\"x\", \"\"]}", 0, "'stop' item 2: expected a non-empty"},
        {"{\"prompt\": \"a\", \"stop\": [\"x\", null]}", 0, "'stop' item 2 must be a string, found null"},
        {"{\"prompt\": \"a\", \"stop\": 3}", 0, "'stop' must be a string or a list of strings, found a number"},
        {"{\"prompt\": \"a\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
         "\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 0, "'stop': 17 strings, at most 16"},
        {"{\"prompt\": \"a\", \"seed\": -1}", 0, "'seed' -1"},
        {"{\"prompt\": \"a\", \"seed\": 9007199254740992}", 0, "'seed' 9007199254740992"},
        {"{\"prompt\": \"a\", \"seed\": true}", 0, "'seed' must be an integer, found a boolean"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}], \"top_p\": 2}", 0, "'top_p' 2"},
        {"{\"prompt\": \"a\", \"min_p\": 2}", 1, "'min_p' 2"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": \"x\"}", 0,
         "'stop_token_ids' must be a list of token ids, found a string"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": 5}", 0, "'stop_token_ids' must be a list"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": [1, -1]}", 0,
         "'stop_token_ids' item 2: -1 is no token id (expected an integer 0..2147483647)"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": [1e12]}", 0, "'stop_token_ids' item 1: 1000000000000 is no token id"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": [2.5]}", 0, "'stop_token_ids' item 1: 2.5 is no token id"},
        {"{\"prompt\": \"a\", \"stop_token_ids\": [\"3\"]}", 0,
         "'stop_token_ids' item 1 must be a token id (an integer), found a string"},
        /* the keys of the removed OpenAI Batch-API emulation: refused, naming the key */
        {"{\"prompt\": \"a\", \"min_tokens\": 1}", 0, "'min_tokens' was removed"},
        {"{\"prompt\": \"a\", \"n\": 2}", 0, "'n' was removed"},
        {"{\"prompt\": \"a\", \"logit_bias\": {}}", 0, "'logit_bias' was removed"},
        {"{\"prompt\": \"a\", \"presence_penalty\": 0.5}", 0, "'presence_penalty' was removed"},
        {"{\"prompt\": \"a\", \"prompt_logprobs\": 1}", 0, "vLLM or llama.cpp"},
        {"{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
         "\"body\": {\"prompt\": \"x\"}}", 0, "'body' was removed"},
    };
    expect_refused(bad, sizeof bad / sizeof *bad);
}

/* A record renders as --prompt does, and a conversation through the template. */
static void test_gen_req_ids(void **state)
{
    ft_tokenizer *t3;
    assert_int_equal(ft_tok_load_dir(&t3, TOK_LLAMA3), 0);
    ft_gen_req q;
    int32_t *a, *b;
    int64_t na, nb;
    int ta, tb;
    /* record, default system (--system), then the --prompt flags it must equal */
    static const struct { const char *json, *dsys, *sys, *prompt; int tmpl, raw; } same[] = {
        {"\"Hi there\"", NULL, NULL, "Hi there", FT_CHAT_AUTO, 0},
        {"{\"prompt\": \"Hi\", \"system\": \"Be brief.\"}", NULL, "Be brief.", "Hi", FT_CHAT_AUTO, 0},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
         "\"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello!\"}]}", "Other",
         "Be brief.", "Hi", FT_CHAT_CHATML, 0},
        {"\"Hi\"", "Be brief.", "Be brief.", "Hi", FT_CHAT_LLAMA2, 0},
        {"{\"instruction\": \"Hi\"}", NULL, NULL, "Hi", FT_CHAT_ALPACA, 0},
        {"\"<|begin_of_text|>Hi\"", NULL, NULL, "<|begin_of_text|>Hi", FT_CHAT_AUTO, 1},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        assert_int_equal(parse_req(&q, same[i].json, same[i].dsys, same[i].raw), 0);
        assert_int_equal(ft_gen_req_ids(t3, same[i].tmpl, &q, same[i].raw, &a, &na, &ta), 0);
        assert_int_equal(ft_gen_prompt_ids(t3, same[i].tmpl, same[i].sys, same[i].prompt,
                                           same[i].raw, &b, &nb, &tb), 0);
        assert_int_equal(ta, tb);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * sizeof *a);
        free(a);
        free(b);
        ft_gen_req_free(&q);
    }
    /* a multi-turn conversation, the reference dropped */
    char *text;
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                   "{\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": "
                                   "\"user\", \"content\": \"c\"}, {\"role\": \"assistant\", "
                                   "\"content\": \"d\"}]}", NULL, 0), 0);
    assert_int_equal(ft_gen_req_ids(t3, FT_CHAT_AUTO, &q, 0, &a, &na, &ta), 0);
    assert_int_equal(ta, FT_CHAT_LLAMA3);
    assert_int_equal(ft_tok_decode(t3, a, na, 0, &text), 0);
    assert_string_equal(text, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\nb<|eot_id|>"
                              "<|start_header_id|>user<|end_header_id|>\n\nc<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(text);
    free(a);
    ft_gen_req_free(&q);
    ft_gen_req_free(&q); /* idempotent */
    ft_tok_free(t3);
}

/* Ids of record j's conversation (less a final assistant turn) rendered by the engine with
 * the generation prompt and the record's tools, as training reads them. */
static void engine_prompt_ids(const ft_tokenizer *t, const char *j, int32_t **ids, int64_t *n)
{
    cJSON *rec = cJSON_Parse(j), *tools = NULL;
    assert_non_null(rec);
    ft_data_msgs dm;
    assert_int_equal(ft_data_record_messages(rec, FT_DATA_AUTO, 1, &dm), 0);
    assert_int_equal(ft_data_record_tools(rec, &tools), 0);
    int64_t k = dm.n - (dm.m[dm.n - 1].role == FT_ROLE_ASSISTANT);
    ft_chat_ctx ctx = {ft_tok_bos_str(t), ft_tok_eos_str(t), ft_tok_chat_template(t), 0, tools};
    ft_chat_text ct = {0};
    if (ft_chat_render_jinja(&ct, dm.m, k, &ctx, 1)) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_tok_encode(t, ct.text, ct.n, 0, ids, n), 0);
    ft_chat_text_free(&ct);
    ft_data_msgs_free(&dm);
    cJSON_Delete(tools);
    cJSON_Delete(rec);
}

/* Prompts records with function calling: "tools" and the message objects (tool_calls, and
 * LLaMA-Factory's function_call / observation turns and tools text) reach the model's
 * template (Qwen2.5's through the engine) as in training; the ids equal the engine's render
 * of the same conversation with the generation prompt. */
static void test_gen_req_tools(void **state)
{
    ft_tokenizer *t = t_tok_with_template(TOK_LLAMA3, "tests/fixtures/jinja/templates/qwen2.5-instruct-chujiezheng.jinja");
    assert_int_equal(ft_chat_template_detect(t), FT_CHAT_CHATML);
    static const char LF[] =
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"17 * 19?\"}, "
        "{\"from\": \"function_call\", \"value\": \"{\\\"name\\\": \\\"mul\\\", \\\"arguments\\\": "
        "{\\\"a\\\": 17, \\\"b\\\": 19}}\"}, {\"from\": \"observation\", \"value\": \"323\"}, "
        "{\"from\": \"gpt\", \"value\": \"It is 323.\"}], \"system\": \"Be exact.\", "
        "\"tools\": \"[{\\\"name\\\": \\\"mul\\\", \\\"description\\\": \\\"Multiply.\\\"}]\"}";
    static const char OAI[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be exact.\"}, {\"role\": \"user\", "
        "\"content\": \"17 * 19?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"mul\", \"arguments\": {\"a\": 17, "
        "\"b\": 19}}}]}, {\"role\": \"tool\", \"content\": \"323\"}], \"tools\": [{\"type\": "
        "\"function\", \"function\": {\"name\": \"mul\", \"description\": \"Multiply.\"}}]}";
    ft_gen_req q;
    int32_t *a, *b, *c;
    int64_t na, nb, nc;
    int ta;
    char *text;
    /* the record is freed after parsing (parse_req): q owns its tools and message objects */
    assert_int_equal(parse_req(&q, LF, "D", 0), 0);
    assert_non_null(q.tools);
    assert_int_equal(q.n_msgs, 4);
    assert_non_null(q.msgs[2].json);
    assert_non_null(cJSON_GetObjectItem(q.msgs[2].json, "tool_calls"));
    assert_string_equal(q.user, "17 * 19?");
    assert_string_equal(q.reference, "It is 323.");
    assert_int_equal(ft_gen_req_ids(t, FT_CHAT_AUTO, &q, 0, &a, &na, &ta), 0);
    assert_int_equal(ta, FT_CHAT_JINJA);
    engine_prompt_ids(t, LF, &b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    assert_int_equal(ft_tok_decode(t, a, na, 0, &text), 0);
    printf("  prompt with tools (%lld tokens):\n%s\n", (long long)na, text);
    assert_string_equal(text,
        "<|im_start|>system\nBe exact.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"mul\", "
        "\"description\": \"Multiply.\"}}\n</tools>\n\nFor each function call, return a json object "
        "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n17 * 19?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"mul\", "
        "\"arguments\": {\"a\": 17, \"b\": 19}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
        "<tool_response>\n323\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    free(text);
    ft_gen_req_free(&q);
    /* the same conversation in OpenAI form: the same ids */
    assert_int_equal(parse_req(&q, OAI, NULL, 0), 0);
    assert_int_equal(ft_gen_req_ids(t, FT_CHAT_AUTO, &q, 0, &c, &nc, &ta), 0);
    assert_int_equal(nc, na);
    assert_memory_equal(a, c, (size_t)na * sizeof *a);
    free(a);
    free(b);
    free(c);
    ft_gen_req_free(&q);
    /* {"prompt": S, "tools": T}: the tools block too; without tools, the plain system turn */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"Hi\", \"tools\": [{\"type\": \"function\", "
                                   "\"function\": {\"name\": \"f\"}}]}", NULL, 0), 0);
    assert_int_equal(ft_gen_req_ids(t, FT_CHAT_AUTO, &q, 0, &a, &na, &ta), 0);
    assert_int_equal(ft_tok_decode(t, a, na, 0, &text), 0);
    assert_non_null(strstr(text, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n</tools>"));
    free(text);
    free(a);
    ft_gen_req_free(&q);
    /* tool results alone under this ChatML template: Qwen2.5's <tool_response>, as training
     * renders them (not the built-in <|im_start|>tool turn) */
    assert_int_equal(parse_req(&q, "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
                                   "{\"role\": \"assistant\", \"content\": \"c\"}, {\"role\": \"tool\", "
                                   "\"content\": \"t\"}]}", NULL, 0), 0);
    assert_int_equal(ft_gen_req_ids(t, FT_CHAT_AUTO, &q, 0, &a, &na, &ta), 0);
    assert_int_equal(ta, FT_CHAT_JINJA);
    assert_int_equal(ft_tok_decode(t, a, na, 0, &text), 0);
    assert_non_null(strstr(text, "<|im_start|>user\n<tool_response>\nt\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n"));
    free(text);
    free(a);
    ft_gen_req_free(&q);
    /* a final tool-call turn is the reference: its calls as JSON */
    assert_int_equal(parse_req(&q, "{\"conversations\": [{\"from\": \"human\", \"value\": \"x\"}, "
                                   "{\"from\": \"function_call\", \"value\": \"{\\\"name\\\": \\\"f\\\", "
                                   "\\\"arguments\\\": {}}\"}]}", NULL, 0), 0);
    assert_int_equal(q.n_msgs, 1);
    assert_string_equal(q.reference, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]");
    ft_gen_req_free(&q);
    /* refused: tools with --raw, malformed tools text, no template that writes tools */
    static const bad_req bad[] = {
        {"{\"prompt\": \"a\", \"tools\": []}", 1, "with --raw a record has no 'tools'"},
        {"{\"prompt\": \"a\", \"tools\": \"[{\"}", 0, "'tools' is a string that is not valid JSON"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": 3}", 0, "'tools' must be a list"},
        {"{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"function_call\", "
         "\"value\": \"f(1)\"}, {\"from\": \"observation\", \"value\": \"1\"}]}", 0,
         "conversation turn 1: the function_call 'value' is not valid JSON"},
    };
    expect_refused(bad, sizeof bad / sizeof *bad);
    ft_tokenizer *t2;
    assert_int_equal(ft_tok_load_dir(&t2, TOK_LLAMA2), 0); /* no chat_template */
    assert_int_equal(parse_req(&q, "{\"prompt\": \"a\", \"tools\": []}", NULL, 0), 0);
    assert_int_equal(ft_gen_req_ids(t2, FT_CHAT_AUTO, &q, 0, &a, &na, &ta), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "the tokenizer has no chat_template"));
    assert_null(a);
    ft_gen_req_free(&q);
    ft_tok_free(t2);
    ft_tok_free(t);
}

static void test_gen_record_seed(void **state)
{
    const uint64_t M53 = (1ull << 53) - 1;
    assert_true(ft_gen_record_seed(7, 0) == 7);
    /* splitmix64 from state 0: its first outputs are the record masks */
    uint64_t x = 0;
    for (int64_t i = 1; i <= 1000; i++) {
        uint64_t z = ft_splitmix64(&x);
        assert_true(ft_gen_record_seed(7, i) == (7 ^ (z & M53)));
        assert_true(ft_gen_record_seed(7, i) <= M53);
        assert_true(ft_gen_record_seed(7, i) != ft_gen_record_seed(7, i - 1));
        assert_true(ft_gen_record_seed(8, i) != ft_gen_record_seed(7, i));
    }
    /* a seed above 2^53 keeps its high bits */
    assert_true(ft_gen_record_seed(1ull << 60, 5) >> 53 == 1ull << 7);
}

/* A cache sized for many prompts and reset between them gives bit for bit the logits of a
 * cache sized for each prompt alone (what makes --prompts equal separate --prompt runs). */
static void test_gen_cache_reuse(void **state)
{
    fix *f = *state;
    const int64_t V = f->m->cfg.vocab_size, P1 = 9, P2 = 14, NEW = 5;
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    assert_non_null(la);
    assert_non_null(lb);
    ft_gen big, one;
    assert_int_equal(ft_gen_init(&big, f->be, f->m, &f->lora, 64, 16, 1), 0);
    /* a first prompt and its decode fill the cache */
    assert_int_equal(ft_gen_forward(&big, SEQ, P1, la, 1), 0);
    for (int64_t t = 0; t < NEW; t++) {
        int32_t id = ft_sample_argmax(la, V);
        assert_int_equal(ft_gen_forward(&big, &id, 1, la, 1), 0);
    }
    /* the second prompt after a reset, vs a cache of its own */
    ft_gen_reset(&big);
    assert_int_equal(ft_gen_set_rope_len(&big, P2 + NEW), 0);
    assert_int_equal(ft_gen_init(&one, f->be, f->m, &f->lora, P2 + NEW, P2, 1), 0);
    assert_int_equal(ft_gen_forward(&big, SEQ + 3, P2, la, 1), 0);
    assert_int_equal(ft_gen_forward(&one, SEQ + 3, P2, lb, 1), 0);
    for (int64_t t = 0; t < NEW; t++) {
        assert_memory_equal(la, lb, (size_t)V * sizeof(float));
        int32_t id = ft_sample_argmax(la, V);
        assert_int_equal(ft_gen_forward(&big, &id, 1, la, 1), 0);
        assert_int_equal(ft_gen_forward(&one, &id, 1, lb, 1), 0);
    }
    assert_memory_equal(la, lb, (size_t)V * sizeof(float));
    ft_gen_free(&big);
    ft_gen_free(&one);
    free(la);
    free(lb);
}


/* ---- weights from a pack (ftune generate --quant nf4, pack-only folders) ------------------ */

enum { PACK_STREAMED, PACK_RESIDENT, PACK_TIERS, NO_PACK };

/* An executor of T tokens (one micro-batch) on m that reads the weights as `how` says: the
 * pack streamed, resident in host memory or in the device tiers; NO_PACK: the model's own
 * weights as the executor places them (on a device, its bf16 copies). */
static void exec_how(ft_exec *ex, ft_backend *be, const ft_model *m, ft_lora *lp, int64_t T,
                     ft_pack_file *pack, int how)
{
    assert_int_equal(ft_exec_init_ex(ex, be, m, lp, T, 1, T, how == NO_PACK), 0);
    if (how == PACK_TIERS) assert_int_equal(ft_exec_use_pack_tiers(ex, pack, NULL, 2, 1), 0);
    else if (how != NO_PACK) assert_int_equal(ft_exec_use_pack_ex(ex, pack, how == PACK_RESIDENT), 0);
}

/* Generation over an executor on the pack of `dir` (how: streamed or resident in host memory,
 * or the device tiers; NO_PACK: the model's own weights, on a device the executor's bf16
 * copies) against the executor's own logits: a prompt prefilled in one forward
 * gives them bit for bit; decoding token by token gives each row within the cached-decode
 * bound. With an adapter: random A, B and a random frozen correction A0/B0 (as a QLoRA run's
 * --quant-correction), which the comparison sees since the executor applies it. */
static void gen_pack_case(ft_backend *be, const char *dir, int how, int with_lora,
                          const char *label)
{
    ft_model *m = NULL;
    ft_pack_file *pack = NULL;
    if (how != NO_PACK) pack_only_load(dir, &m, &pack);
    else assert_int_equal(ft_model_load(&m, dir), 0);
    ft_lora lora, *lp = NULL;
    if (with_lora) {
        ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
        assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
        ft_rng rng;
        ft_rng_seed(&rng, 99);
        float *fixed = malloc((size_t)lora.n_params * sizeof(float));
        for (int64_t i = 0; i < lora.n_params; i++) {
            lora.host[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.4f;
            fixed[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.4f;
        }
        assert_int_equal(ft_lora_push(&lora), 0);
        assert_int_equal(ft_lora_set_fixed(&lora, fixed), 0);
        free(fixed);
        lp = &lora;
    }
    const int64_t T = N_SEQ, V = m->cfg.vocab_size;
    ft_exec ex;
    exec_how(&ex, be, m, lp, T, pack, how);
    int32_t ids[N_SEQ];
    float *le = malloc((size_t)(T * V) * 4), *lg = malloc((size_t)(T * V) * 4);
    exec_seq_logits(&ex, ids, le);

    ft_gen_source src;
    assert_int_equal(ft_exec_gen_source(&ex, &src), 0);
    ft_gen g;
    assert_int_equal(ft_gen_init_source(&g, be, m, lp, &src, T, T, T), 0);
    assert_int_equal(ft_gen_forward(&g, ids, T, lg, T), 0);
    printf("[%s] prefill logits through the executor vs ft_exec_logits: max abs diff %.3e (%s)\n", label,
           max_diff(le, lg, T * V),
           memcmp(le, lg, (size_t)(T * V) * 4) ? "not bit-identical" : "bit-identical");
    assert_memory_equal(le, lg, (size_t)(T * V) * 4);
    { /* an executor of a few tokens serves forwards of any length (as ftune generate's does):
       * the same bits (untied on a device: the embedding rows gathered 5 at a time) */
        ft_exec sx;
        ft_gen_source s5;
        ft_gen g5;
        exec_how(&sx, be, m, lp, 5, pack, how);
        assert_int_equal(ft_exec_gen_source(&sx, &s5), 0);
        assert_int_equal(ft_gen_init_source(&g5, be, m, lp, &s5, T, T, T), 0);
        assert_int_equal(ft_gen_forward(&g5, ids, T, lg, T), 0);
        assert_memory_equal(le, lg, (size_t)(T * V) * 4);
        ft_gen_free(&g5);
        ft_exec_free(&sx);
    }
    /* 4 tokens prefilled, then one at a time */
    const int64_t a = 4;
    ft_gen_reset(&g);
    assert_int_equal(ft_gen_forward(&g, ids, a, lg, 1), 0);
    double worst = 0;
    const double tol = be->ops->host_memory ? FT_TOL_KV_DECODE_REL : FT_TOL_KV_DECODE_BF16_REL;
    for (int64_t t = a - 1; t < T; t++) {
        double s = max_abs(le + t * V, V), d = max_diff(lg, le + t * V, V);
        worst = fmax(worst, d / s);
        if (d > tol * s)
            printf("  [%s] row %lld: max diff %.3e of max |logit| %.3g\n", label, (long long)t, d / s, s);
        assert_true(d <= tol * s);
        if (t + 1 < T) assert_int_equal(ft_gen_forward(&g, ids + t + 1, 1, lg, 1), 0);
    }
    printf("[%s] cached decode through the executor vs ft_exec_logits: max diff %.3e of max |logit| "
           "(bound %.1e)\n", label, worst, tol);
    /* on the host the 4-token prefill and each decoded token read the NF4 blocks in place
     * (offload/exec.c gen_layer); the 24-token prefills above dequantized them */
    const int64_t nf4_visits = (T - a + 1) * m->cfg.num_hidden_layers;
    assert_int_equal(ex.gen_nf4_fetches, be->ops->host_memory && how != NO_PACK ? nf4_visits : 0);
    if (be->ops->host_memory && how != NO_PACK) { /* the last visit, one token: q in place; k
                                                    * (32 x 64, not ft_nf4_fusable) in fp32 */
        assert_int_equal(ex.fetched.proj[FT_Q].wtype, FT_WTYPE_NF4);
        assert_int_equal(ex.fetched.proj[FT_K].wtype, FT_WTYPE_F32);
    }
    /* the comparison can fail: another row is far off */
    assert_true(max_diff(lg, le + (T - 2) * V, V) > 10 * tol * max_abs(lg, V));
    ft_gen_free(&g);
    /* a source must come from an executor that reads a pack, with its layers */
    ft_gen_source bad = src;
    bad.layer = NULL;
    assert_int_equal(ft_gen_init_source(&g, be, m, lp, &bad, T, T, T), FT_E_INVALID);
    ft_exec_free(&ex);
    if (lp) ft_lora_free(lp);
    ft_pack_close(pack);
    ft_model_free(m);
    free(le);
    free(lg);
}

static void test_gen_through_exec(void **state)
{
    (void)state;
    char tied[700], untied[700], *dir = write_pack_only_pair(tied, untied, sizeof tied);
    ft_backend *cpu, *dev;
    assert_int_equal(ft_backend_cpu_init(&cpu, 2), 0);
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    gen_pack_case(cpu, tied, PACK_RESIDENT, 0, "cpu, pack in memory, tied");
    gen_pack_case(cpu, tied, PACK_STREAMED, 1, "cpu, pack streamed, tied, LoRA + correction");
    gen_pack_case(cpu, untied, PACK_RESIDENT, 1, "cpu, pack in memory, untied, LoRA + correction");
    gen_pack_case(dev, tied, PACK_TIERS, 1, "cpu-device, tiers, tied, LoRA + correction");
    gen_pack_case(dev, untied, PACK_TIERS, 1, "cpu-device, tiers, untied (embedding rows from the pack), LoRA + correction");
    /* a device generates through an executor also without a pack (its bf16 weight copies) */
    gen_pack_case(dev, TINY, NO_PACK, 1, "cpu-device, the model's weights as the executor places them, LoRA + correction");
    /* the model alone cannot generate: a pack-only one has no weights, a device reads them
     * through an executor; an executor that placed no weights is no source */
    ft_model *m = NULL;
    assert_int_equal(ft_model_load(&m, tied), 0);
    ft_exec ex;
    assert_int_equal(ft_exec_init_ex(&ex, dev, m, NULL, 4, 1, 4, 0), 0);
    ft_gen_source src;
    assert_int_equal(ft_exec_gen_source(&ex, &src), FT_E_INVALID);
    ft_exec_free(&ex);
    ft_gen g;
    assert_int_equal(ft_gen_init(&g, cpu, m, NULL, 8, 4, 1), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "--quant nf4"));
    ft_model_free(m);
    assert_int_equal(ft_model_load(&m, TINY), 0);
    assert_int_equal(ft_gen_init(&g, dev, m, NULL, 8, 4, 1), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "ft_gen_init_source"));
    ft_model_free(m);
    ft_backend_free(dev);
    ft_backend_free(cpu);
    t_rmtree(dir);
}

/* A generation source over an executor of 8 tokens, for test_gen_seqs and test_gen_prefill:
 * exec_src_device: on a new cpu-device backend (2 threads, bf16 products), the model m's own
 * weights; exec_src_pack: on be, a pack-only tiny-llama (tied, in a temp folder) whose NF4
 * pack the executor holds in memory. exec_src_close frees either. */
typedef struct exec_src {
    ft_backend *be;     /* the cpu-device backend, or NULL */
    char *dir;          /* the pack-only folder, or NULL */
    ft_model *m;        /* its model, or NULL */
    ft_pack_file *pack; /* its pack, or NULL */
    ft_exec ex;
    ft_gen_source src;
} exec_src;

static void exec_src_device(exec_src *s, const ft_model *m)
{
    memset(s, 0, sizeof *s);
    assert_int_equal(ft_backend_cpu_device_init(&s->be, 2), 0);
    exec_how(&s->ex, s->be, m, NULL, 8, NULL, NO_PACK);
    assert_int_equal(ft_exec_gen_source(&s->ex, &s->src), 0);
}

static void exec_src_pack(exec_src *s, ft_backend *be)
{
    char tied[700];
    memset(s, 0, sizeof *s);
    s->dir = t_tmpdir();
    write_pack_only(s->dir, "tied", 0, tied, sizeof tied);
    pack_only_load(tied, &s->m, &s->pack);
    exec_how(&s->ex, be, s->m, NULL, 8, s->pack, PACK_RESIDENT);
    assert_int_equal(ft_exec_gen_source(&s->ex, &s->src), 0);
}

static void exec_src_close(exec_src *s)
{
    ft_exec_free(&s->ex);
    ft_pack_close(s->pack);
    ft_model_free(s->m);
    ft_backend_free(s->be);
    if (s->dir) t_rmtree(s->dir);
}

/* Batched decoding (ft_gen_init_seqs / ft_gen_decode): three sequences with prompts of 3, 7
 * and 5 tokens in their own seqs, advanced together (all three, then two, then one), give
 * each sequence's logits of a one-sequence ft_gen within the KV-decode tolerance; a finished
 * seq is reset and reused. The refusals leave every seq as it was. */
static void seqs_case(ft_backend *be, const ft_model *m, const ft_lora *lora,
                       const ft_gen_source *src, const char *label)
{
    const int64_t V = m->cfg.vocab_size, S = 3, CTX = 16;
    ft_gen g, one;
    assert_int_equal(ft_gen_init_seqs(&g, be, m, lora, src, CTX, 8, S, S), 0);
    if (src) assert_int_equal(ft_gen_init_source(&one, be, m, lora, src, CTX, 8, 1), 0);
    else assert_int_equal(ft_gen_init(&one, be, m, lora, CTX, 8, 1), 0);
    const int64_t plen[3] = {3, 7, 5}, off[3] = {0, 3, 10};
    float *lb = malloc((size_t)(S * V) * 4), *lr = malloc((size_t)V * 4), *tmp = malloc((size_t)V * 4);
    /* prompts: SEQ[off[s] .. off[s] + plen[s]) */
    for (int64_t s = 0; s < S; s++) {
        assert_int_equal(ft_gen_forward_seq(&g, s, SEQ + off[s], plen[s], lb + s * V, 1), 0);
        assert_int_equal(g.past[s], plen[s]);
    }
    double worst = 0;
    int64_t n_checked = 0;
    /* steps: all three (x2), seqs 2 and 0 (x2), seq 1 alone */
    const int64_t plan[5][3] = {{0, 1, 2}, {2, 1, 0}, {2, 0, -1}, {0, 2, -1}, {1, -1, -1}};
    int64_t fed[3] = {0, 0, 0};
    for (int st = 0; st < 5; st++) {
        int64_t sl[3], n = 0;
        int32_t tk[3];
        for (int i = 0; i < 3 && plan[st][i] >= 0; i++) {
            sl[n] = plan[st][i];
            tk[n] = SEQ[(off[sl[n]] + plen[sl[n]] + fed[sl[n]]) % N_SEQ];
            n++;
        }
        assert_int_equal(ft_gen_decode(&g, sl, tk, n, lb), 0);
        for (int64_t i = 0; i < n; i++) {
            const int64_t s = sl[i];
            fed[s]++;
            assert_int_equal(g.past[s], plen[s] + fed[s]);
            /* the reference: the same tokens through a one-sequence cache */
            int32_t ids[16];
            for (int64_t j = 0; j < plen[s]; j++) ids[j] = SEQ[off[s] + j];
            for (int64_t j = 0; j < fed[s]; j++) ids[plen[s] + j] = SEQ[(off[s] + plen[s] + j) % N_SEQ];
            ft_gen_reset(&one);
            assert_int_equal(ft_gen_forward(&one, ids, plen[s], tmp, 1), 0);
            for (int64_t j = 0; j < fed[s]; j++)
                assert_int_equal(ft_gen_forward(&one, ids + plen[s] + j, 1, lr, 1), 0);
            double d = max_diff(lb + i * V, lr, V), sc = max_abs(lr, V);
            worst = fmax(worst, d / sc);
            assert_true(d <= FT_TOL_KV_DECODE_REL * sc);
            n_checked++;
        }
    }
    /* the check can fail: seq 1's last logits (lb row 0) against seq 0's sequence */
    {
        int32_t ids[16];
        for (int64_t j = 0; j < plen[0]; j++) ids[j] = SEQ[off[0] + j];
        for (int64_t j = 0; j < fed[0]; j++) ids[plen[0] + j] = SEQ[(off[0] + plen[0] + j) % N_SEQ];
        ft_gen_reset(&one);
        assert_int_equal(ft_gen_forward(&one, ids, plen[0] + fed[0], tmp, 1), 0);
        assert_true(max_diff(lb, tmp, V) > 100 * FT_TOL_KV_DECODE_REL * max_abs(tmp, V));
    }
    printf("[%s] %lld batched decode rows vs one-sequence decoding: max diff %.3e of max |logit| "
           "(bound %.0e)\n", label, (long long)n_checked, worst, FT_TOL_KV_DECODE_REL);
    /* refusals: nothing changes */
    int64_t before[3] = {g.past[0], g.past[1], g.past[2]};
    int64_t rep[2] = {1, 1}, bad[1] = {3}, all4[4] = {0, 1, 2, 0};
    int32_t t2[4] = {5, 6, 7, 8}, badid[1] = {(int32_t)V};
    assert_int_equal(ft_gen_decode(&g, rep, t2, 2, lb), FT_E_INVALID);
    assert_int_equal(ft_gen_decode(&g, bad, t2, 1, lb), FT_E_RANGE);
    assert_int_equal(ft_gen_decode(&g, all4, t2, 4, lb), FT_E_RANGE);
    assert_int_equal(ft_gen_decode(&g, rep, badid, 1, lb), FT_E_INVALID);
    assert_int_equal(ft_gen_forward_seq(&g, 3, SEQ, 1, lb, 1), FT_E_RANGE);
    ft_gen_reset_seq(&g, 2);
    int64_t s2[1] = {2};
    assert_int_equal(ft_gen_decode(&g, s2, t2, 1, lb), FT_E_INVALID); /* empty: no prompt yet */
    assert_non_null(strstr(ft_errmsg(), "empty"));
    assert_int_equal(g.past[0], before[0]);
    assert_int_equal(g.past[1], before[1]);
    assert_int_equal(g.past[2], 0);
    /* a reused seq starts afresh: its prompt's logits are the one-sequence ones */
    assert_int_equal(ft_gen_forward_seq(&g, 2, SEQ + 1, 4, lb, 1), 0);
    ft_gen_reset(&one);
    assert_int_equal(ft_gen_forward(&one, SEQ + 1, 4, lr, 1), 0);
    assert_true(max_diff(lb, lr, V) <= FT_TOL_KV_DECODE_REL * max_abs(lr, V));
    /* a prompt longer than the chunk (8 + 4 tokens) prefilled into seq 2 while seq 0 is
     * mid-decode, then the two decoded together: each row as its one-sequence decode */
    ft_gen_reset_seq(&g, 2);
    assert_int_equal(ft_gen_forward_seq(&g, 2, SEQ + 6, 8, lb, 1), 0);
    assert_int_equal(ft_gen_forward_seq(&g, 2, SEQ + 14, 4, lb, 1), 0);
    {
        const int64_t s20[2] = {2, 0};
        int32_t ids[16], t20[2] = {SEQ[18], SEQ[(off[0] + plen[0] + fed[0]) % N_SEQ]};
        assert_int_equal(ft_gen_decode(&g, s20, t20, 2, lb), 0);
        ft_gen_reset(&one);
        assert_int_equal(ft_gen_forward(&one, SEQ + 6, 8, lr, 1), 0);
        assert_int_equal(ft_gen_forward(&one, SEQ + 14, 4, lr, 1), 0);
        assert_int_equal(ft_gen_forward(&one, t20, 1, lr, 1), 0);
        assert_true(max_diff(lb, lr, V) <= FT_TOL_KV_DECODE_REL * max_abs(lr, V));
        for (int64_t j = 0; j < plen[0]; j++) ids[j] = SEQ[off[0] + j];
        for (int64_t j = 0; j <= fed[0]; j++) ids[plen[0] + j] = SEQ[(off[0] + plen[0] + j) % N_SEQ];
        ft_gen_reset(&one);
        assert_int_equal(ft_gen_forward(&one, ids, plen[0], lr, 1), 0);
        for (int64_t j = 0; j <= fed[0]; j++)
            assert_int_equal(ft_gen_forward(&one, ids + plen[0] + j, 1, lr, 1), 0);
        assert_true(max_diff(lb + V, lr, V) <= FT_TOL_KV_DECODE_REL * max_abs(lr, V));
        assert_int_equal(g.past[2], 13);
        assert_int_equal(g.past[0], plen[0] + fed[0] + 1);
    }
    /* a full seq refuses the step */
    int64_t s1[1] = {1};
    while (g.past[1] < CTX) assert_int_equal(ft_gen_decode(&g, s1, t2, 1, lb), 0);
    assert_int_equal(ft_gen_decode(&g, s1, t2, 1, lb), FT_E_RANGE);
    /* sizes */
    ft_gen h;
    assert_int_equal(ft_gen_init_seqs(&h, be, m, lora, src, CTX, 8, 1, 0), FT_E_INVALID);
    assert_int_equal(ft_gen_init_seqs(&h, be, m, lora, src, CTX, 8, 1, FT_GEN_MAX_SEQS + 1), FT_E_INVALID);
    assert_true(ft_gen_source_bytes(m, lora, CTX, 8, 3, 3) > ft_gen_source_bytes(m, lora, CTX, 8, 3, 1));
    assert_int_equal(ft_gen_source_bytes(m, lora, CTX, 8, 3, 0), 0);
    free(lb);
    free(lr);
    free(tmp);
    ft_gen_free(&g);
    ft_gen_free(&one);
}

/* Dynamic NTK RoPE in batched decoding: the inverse frequencies depend on each sequence's
 * length (ft_gen_set_rope_len_seq), so a decode step rotates each row with its own seq's
 * table. Two seqs with prompts of 3 and 9 tokens, decoded together (seq 1 first in the
 * step), each within the KV-decode tolerance of a one-sequence ft_gen with that table, and
 * far from one with the other seq's table (what using the step's first seq's table for
 * every row would give). */
static void test_gen_seqs_dynamic_rope(void **state)
{
    fix *f = *state;
    const ft_model_config saved = f->m->cfg;
    f->m->cfg.rope_type = FT_ROPE_DYNAMIC;
    f->m->cfg.rope_factor = 4.0;
    f->m->cfg.rope_original_max_position_embeddings = 4; /* every length here scales the base */
    const int64_t V = f->m->cfg.vocab_size, CTX = 32, NEW = 4, plen[2] = {3, 9}, off[2] = {0, 5};
    ft_gen g, one;
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, &f->lora, NULL, CTX, 16, 2, 2), 0);
    assert_int_equal(ft_gen_init(&one, f->be, f->m, &f->lora, CTX, 16, 1), 0);
    float *lb = malloc((size_t)(2 * V) * 4), *lr = malloc((size_t)V * 4), *lo = malloc((size_t)V * 4);
    assert_non_null(lb);
    assert_non_null(lr);
    assert_non_null(lo);
    for (int64_t s = 0; s < 2; s++) {
        assert_int_equal(ft_gen_set_rope_len_seq(&g, s, plen[s] + NEW), 0);
        assert_int_equal(ft_gen_forward_seq(&g, s, SEQ + off[s], plen[s], lb + s * V, 1), 0);
    }
    const int64_t order[2] = {1, 0};
    for (int64_t t = 0; t < NEW - 1; t++) {
        int32_t tk[2];
        for (int i = 0; i < 2; i++) tk[i] = SEQ[off[order[i]] + plen[order[i]] + t];
        assert_int_equal(ft_gen_decode(&g, order, tk, 2, lb), 0);
    }
    double worst = 0, nearest_other = INFINITY;
    for (int i = 0; i < 2; i++) {
        const int64_t s = order[i], n = plen[s] + NEW - 1;
        for (int k = 0; k < 2; k++) { /* k = 0: seq s's own length; 1: the other seq's */
            const int64_t len = plen[k ? 1 - s : s] + NEW;
            float *out = k ? lo : lr;
            ft_gen_reset(&one);
            assert_int_equal(ft_gen_set_rope_len(&one, len), 0);
            assert_int_equal(ft_gen_forward(&one, SEQ + off[s], plen[s], out, 1), 0);
            for (int64_t j = plen[s]; j < n; j++)
                assert_int_equal(ft_gen_forward(&one, SEQ + off[s] + j, 1, out, 1), 0);
        }
        const double sc = max_abs(lr, V), d = max_diff(lb + i * V, lr, V);
        worst = fmax(worst, d / sc);
        nearest_other = fmin(nearest_other, max_diff(lb + i * V, lo, V) / sc);
        assert_true(d <= FT_TOL_KV_DECODE_REL * sc);
    }
    printf("dynamic RoPE, 2 seqs decoded together: max diff %.3e of max |logit| vs each one's "
           "own table (bound %.0e), %.3e vs the other seq's\n", worst, FT_TOL_KV_DECODE_REL,
           nearest_other);
    assert_true(nearest_other > 100 * FT_TOL_KV_DECODE_REL);
    f->m->cfg = saved;
    free(lb);
    free(lr);
    free(lo);
    ft_gen_free(&g);
    ft_gen_free(&one);
}

static void test_gen_seqs(void **state)
{
    fix *f = *state;
    seqs_case(f->be, f->m, &f->lora, NULL, "cpu, host weights, LoRA");
    seqs_case(f->be, f->m, NULL, NULL, "cpu, host weights, no adapter");
    /* through an executor on cpu-device (bf16 products) */
    exec_src s;
    exec_src_device(&s, f->m);
    seqs_case(s.be, f->m, NULL, &s.src, "cpu-device, the executor's weights");
    exec_src_close(&s);
    /* an NF4 pack on the CPU: visits of up to 8 rows read the NF4 codes in place */
    exec_src_pack(&s, f->be);
    int64_t before = s.ex.gen_nf4_fetches;
    seqs_case(f->be, s.m, NULL, &s.src, "cpu, NF4 pack in memory, codes read in place");
    assert_true(s.ex.gen_nf4_fetches > before);
    exec_src_close(&s);
}

/* ---- batched prefill (ft_gen_prefill) ------------------------------------------------------ */

/* A batched prefill (ft_gen_prefill) vs each prompt prefilled alone: the same math, the
 * projections' GEMMs over all the prompts' rows at once, which OpenBLAS's sgemm sums in
 * another order for a row depending on its place among the rows (its micro-kernel tails:
 * rows of a 37-row product differ from those of a 300-row product in the last bit), so fp32
 * reassociation only, as the batched decode (FT_TOL_KV_DECODE_REL). Measured on tiny-llama:
 * 8.8e-7 of max |logit| with a LoRA adapter, 2.1e-7 without, 1.5e-7 through an NF4 pack; too
 * close to 1e-6 to bound it there on other OpenBLAS kernels. */
#define FT_TOL_PREFILL_REL FT_TOL_KV_DECODE_REL

/* Three prompts of 37, 9 and 50 tokens (over the CPU attention's 32-query and 64-key tiles, all
 * longer than the 8 rows an NF4 pack serves in place) and their first decode steps. */
#define PF_N 3
static const int64_t PF_LEN[PF_N] = {37, 9, 50};
#define PF_CTX 64
#define PF_CHUNK 128

static void pf_ids(int32_t *ids, int64_t n, int64_t V, uint64_t seed)
{
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(ft_rng_next(&r) % (uint64_t)V);
}

/* ft_gen_prefill of the three prompts into seqs 2, 0, 3 of a 4-seq ft_gen against each
 * prompt prefilled alone (ft_gen_forward_seq) into the same seq of another one, then three
 * decode steps of the three in both: the same logits within FT_TOL_PREFILL_REL (each
 * prompt's attention is the one-sequence call on its own rows; the projections' GEMMs run
 * over all 96 rows, and OpenBLAS's sgemm rounds a row differently with the rows around it). */
static void prefill_case(ft_backend *be, const ft_model *m, const ft_lora *lora,
                         const ft_gen_source *src, const char *label)
{
    const int64_t V = m->cfg.vocab_size, S = 4;
    const int64_t seqs[PF_N] = {2, 0, 3};
    ft_gen g, one;
    assert_int_equal(ft_gen_init_seqs(&g, be, m, lora, src, PF_CTX, PF_CHUNK, S, S), 0);
    assert_int_equal(ft_gen_init_seqs(&one, be, m, lora, src, PF_CTX, PF_CHUNK, S, S), 0);
    int32_t ids[37 + 9 + 50];
    pf_ids(ids, 96, V, 5);
    float *lb = malloc((size_t)(S * V) * 4), *lr = malloc((size_t)(S * V) * 4);
    assert_non_null(lb);
    assert_non_null(lr);
    assert_int_equal(ft_gen_prefill(&g, PF_N, seqs, ids, PF_LEN, lb), 0);
    int64_t bad_rows = 0;
    double worst = 0;
    for (int64_t i = 0, r = 0; i < PF_N; r += PF_LEN[i++]) {
        assert_int_equal(g.past[seqs[i]], PF_LEN[i]);
        assert_int_equal(ft_gen_forward_seq(&one, seqs[i], ids + r, PF_LEN[i], lr + i * V, 1), 0);
        bad_rows += memcmp(lb + i * V, lr + i * V, (size_t)V * 4) != 0;
        worst = fmax(worst, max_diff(lb + i * V, lr + i * V, V) / max_abs(lr + i * V, V));
    }
    assert_int_equal(g.past[1], 0);
    assert_int_equal(g.n_past, PF_LEN[1]);
    /* the check can fail: prompt 0's logits against prompt 1's */
    assert_true(max_diff(lb, lr + V, V) > 100 * FT_TOL_PREFILL_REL * max_abs(lr + V, V));
    /* the decode steps read the caches the prefill wrote */
    for (int st = 0; st < 3; st++) {
        int32_t tk[PF_N];
        for (int i = 0; i < PF_N; i++) tk[i] = (int32_t)((7 + 31 * st + 1000 * i) % V);
        assert_int_equal(ft_gen_decode(&g, seqs, tk, PF_N, lb), 0);
        assert_int_equal(ft_gen_decode(&one, seqs, tk, PF_N, lr), 0);
        for (int i = 0; i < PF_N; i++) {
            bad_rows += memcmp(lb + i * V, lr + i * V, (size_t)V * 4) != 0;
            worst = fmax(worst, max_diff(lb + i * V, lr + i * V, V) / max_abs(lr + i * V, V));
        }
    }
    printf("[%s] prefill of %d prompts in one forward, then 3 decode steps, vs each prompt "
           "prefilled alone: %lld of %d logits rows differ, max diff %.3e of max |logit| (bound "
           "%.0e)\n", label, PF_N, (long long)bad_rows, 4 * PF_N, worst, FT_TOL_PREFILL_REL);
    assert_true(worst <= FT_TOL_PREFILL_REL);
    free(lb);
    free(lr);
    ft_gen_free(&g);
    ft_gen_free(&one);
}

/* A weight source over a model's host arrays whose layer() fails at call fail_at (counting
 * from 1; 0: never), for the failure path of ft_gen_prefill. */
typedef struct fail_src { const ft_model *m; int64_t calls, fail_at; } fail_src;

static int fail_layer(void *ctx, int64_t l, int64_t n, const ft_layer_weights **w)
{
    fail_src *f = ctx;
    (void)n;
    if (++f->calls == f->fail_at) return ft_err(-EIO, "test: layer %lld unreadable", (long long)l);
    *w = &f->m->layers[l];
    return 0;
}

static void test_gen_prefill(void **state)
{
    fix *f = *state;
    prefill_case(f->be, f->m, &f->lora, NULL, "cpu, host weights, LoRA");
    prefill_case(f->be, f->m, NULL, NULL, "cpu, host weights, no adapter");
    exec_src s;
    exec_src_device(&s, f->m);
    int64_t visits = s.ex.layer_fetches;
    prefill_case(s.be, f->m, NULL, &s.src, "cpu-device, the executor's weights");
    /* g: one forward for the three prompts; one: three */
    assert_int_equal(s.ex.layer_fetches - visits, f->m->cfg.num_hidden_layers * (1 + 3 + 2 * 3));
    exec_src_close(&s);
    /* an NF4 pack in memory on the CPU (prompts of more than 8 tokens: the layer dequantized) */
    exec_src_pack(&s, f->be);
    prefill_case(f->be, s.m, NULL, &s.src, "cpu, NF4 pack in memory");
    exec_src_close(&s);
}

/* Dynamic NTK RoPE: each prompt of a batched prefill is rotated with its own seq's table, as
 * when prefilled alone (within FT_TOL_PREFILL_REL), and not with another seq's (what one
 * table for every row would give). */
static void test_gen_prefill_dynamic_rope(void **state)
{
    fix *f = *state;
    const ft_model_config saved = f->m->cfg;
    f->m->cfg.rope_type = FT_ROPE_DYNAMIC;
    f->m->cfg.rope_factor = 4.0;
    f->m->cfg.rope_original_max_position_embeddings = 4;
    const int64_t V = f->m->cfg.vocab_size, seqs[PF_N] = {1, 2, 0};
    ft_gen g, one;
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, &f->lora, NULL, PF_CTX, PF_CHUNK, 3, 3), 0);
    assert_int_equal(ft_gen_init_seqs(&one, f->be, f->m, &f->lora, NULL, PF_CTX, PF_CHUNK, 3, 3), 0);
    int32_t ids[96];
    pf_ids(ids, 96, V, 11);
    float *lb = malloc((size_t)(3 * V) * 4), *lr = malloc((size_t)V * 4), *lo = malloc((size_t)V * 4);
    assert_non_null(lb);
    assert_non_null(lr);
    assert_non_null(lo);
    for (int i = 0; i < PF_N; i++) { /* each seq's table for its prompt + 4 new tokens */
        assert_int_equal(ft_gen_set_rope_len_seq(&g, seqs[i], PF_LEN[i] + 4), 0);
        assert_int_equal(ft_gen_set_rope_len_seq(&one, seqs[i], PF_LEN[i] + 4), 0);
    }
    assert_int_equal(ft_gen_prefill(&g, PF_N, seqs, ids, PF_LEN, lb), 0);
    double nearest_other = INFINITY, worst = 0;
    for (int64_t i = 0, r = 0; i < PF_N; r += PF_LEN[i++]) {
        assert_int_equal(ft_gen_forward_seq(&one, seqs[i], ids + r, PF_LEN[i], lr, 1), 0);
        worst = fmax(worst, max_diff(lb + i * V, lr, V) / max_abs(lr, V));
        /* the next seq's table (another length) */
        const int64_t o = seqs[(i + 1) % PF_N];
        ft_gen_reset_seq(&one, o);
        assert_int_equal(ft_gen_forward_seq(&one, o, ids + r, PF_LEN[i], lo, 1), 0);
        ft_gen_reset_seq(&one, o);
        nearest_other = fmin(nearest_other, max_diff(lb + i * V, lo, V) / max_abs(lr, V));
    }
    printf("dynamic RoPE, batched prefill of 3 prompts: %.3e of max |logit| from each one's own "
           "table (bound %.0e), %.3e from the other seqs' tables\n", worst, FT_TOL_PREFILL_REL,
           nearest_other);
    assert_true(worst <= FT_TOL_PREFILL_REL);
    assert_true(nearest_other > 100 * FT_TOL_PREFILL_REL);
    f->m->cfg = saved;
    free(lb);
    free(lr);
    free(lo);
    ft_gen_free(&g);
    ft_gen_free(&one);
}

/* Refusals (nothing changes: the caches keep what they hold), sizes, and a failed forward
 * (the seqs' caches left empty, the source's message kept). */
static void test_gen_prefill_refusals(void **state)
{
    fix *f = *state;
    const int64_t V = f->m->cfg.vocab_size, CTX = 16, CHUNK = 20;
    ft_gen g;
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, NULL, CTX, CHUNK, 2, 3), 0);
    float *lg = malloc((size_t)(3 * V) * 4);
    assert_non_null(lg);
    int32_t ids[40];
    pf_ids(ids, 40, V, 3);
    assert_int_equal(ft_gen_forward_seq(&g, 1, ids, 4, lg, 1), 0); /* seq 1 holds 4 tokens */
    const int64_t s02[2] = {0, 2}, s01[2] = {0, 1}, s00[2] = {0, 0}, s03[2] = {0, 3},
                  s012[3] = {0, 1, 2}, sm1[1] = {-1};
    const int64_t l55[2] = {5, 5}, l05[2] = {0, 5}, l17[2] = {17, 1}, l1010[2] = {10, 11},
                  l111[3] = {1, 1, 1};
    assert_int_equal(ft_gen_prefill(&g, 0, s02, ids, l55, lg), FT_E_RANGE);
    assert_int_equal(ft_gen_prefill(&g, 3, s012, ids, l111, lg), FT_E_RANGE); /* > logit rows */
    assert_int_equal(ft_gen_prefill(&g, 1, sm1, ids, l55, lg), FT_E_RANGE);
    assert_int_equal(ft_gen_prefill(&g, 2, s03, ids, l55, lg), FT_E_RANGE);
    assert_int_equal(ft_gen_prefill(&g, 2, s00, ids, l55, lg), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "twice"));
    assert_int_equal(ft_gen_prefill(&g, 2, s01, ids, l55, lg), FT_E_INVALID); /* seq 1 holds 4 */
    assert_non_null(strstr(ft_errmsg(), "holds 4 tokens"));
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l05, lg), FT_E_RANGE);
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l17, lg), FT_E_RANGE);  /* > context */
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l1010, lg), FT_E_RANGE); /* 21 > chunk */
    assert_non_null(strstr(ft_errmsg(), "21 prompt tokens"));
    assert_int_equal(ft_gen_prefill(&g, 2, s02, NULL, l55, lg), FT_E_INVALID);
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l55, NULL), FT_E_INVALID);
    int32_t badid[10];
    memcpy(badid, ids, sizeof badid);
    badid[7] = (int32_t)V; /* prompt 1's token 2 */
    assert_int_equal(ft_gen_prefill(&g, 2, s02, badid, l55, lg), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "prompt 1 of the prefill (sequence 2): token 2 has id"));
    assert_int_equal(g.past[0], 0);
    assert_int_equal(g.past[1], 4);
    assert_int_equal(g.past[2], 0);
    /* one prompt: ft_gen_forward_seq's logits */
    const int64_t s2[1] = {2}, l9[1] = {9};
    assert_int_equal(ft_gen_prefill(&g, 1, s2, ids, l9, lg), 0);
    assert_int_equal(g.past[2], 9);
    ft_gen_reset_seq(&g, 2);
    assert_int_equal(ft_gen_forward_seq(&g, 2, ids, 9, lg + V, 1), 0);
    assert_memory_equal(lg, lg + V, (size_t)V * 4);
    ft_gen_free(&g);
    /* sizes: a chunk beyond one context only with several seqs */
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, NULL, CTX, 2 * CTX, 2, 2), 0);
    ft_gen_free(&g);
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, NULL, CTX, 2 * CTX + 1, 2, 2),
                     FT_E_INVALID);
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, NULL, CTX, CTX + 1, 1, 1), FT_E_INVALID);
    assert_int_equal(ft_gen_source_bytes(f->m, NULL, CTX, 2 * CTX + 1, 2, 2), 0);
    assert_true(ft_gen_source_bytes(f->m, NULL, CTX, 2 * CTX, 2, 2) >
                ft_gen_source_bytes(f->m, NULL, CTX, CTX, 2, 2));
    /* a layer that fails mid-forward: the seqs' caches left empty, the message kept */
    fail_src fs = {f->m, 0, 2};
    ft_gen_source src = {&fs, NULL, fail_layer, NULL, NULL, f->m->embed, f->m->final_norm,
                         f->m->lm_head, NULL};
    assert_int_equal(ft_gen_init_seqs(&g, f->be, f->m, NULL, &src, CTX, CHUNK, 2, 3), 0);
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l55, lg), -EIO);
    assert_non_null(strstr(ft_errmsg(), "layer 1 unreadable"));
    assert_int_equal(g.past[0], 0);
    assert_int_equal(g.past[2], 0);
    fs.fail_at = 0;
    assert_int_equal(ft_gen_prefill(&g, 2, s02, ids, l55, lg), 0); /* then it works */
    assert_int_equal(g.past[0], 5);
    assert_int_equal(g.past[2], 5);
    ft_gen_free(&g);
    free(lg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_kv_vs_fp64),
        cmocka_unit_test(test_attention_kv_matches_attention_fwd),
        cmocka_unit_test_setup_teardown(test_kv_decode_matches_recompute, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_prefill_equals_exec_logits, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_gen_bad_input, setup, model_fix_teardown),
        cmocka_unit_test(test_sample_greedy),
        cmocka_unit_test(test_sample_temperature),
        cmocka_unit_test(test_sample_top_k_top_p),
        cmocka_unit_test(test_sample_large_vocab),
        cmocka_unit_test(test_sample_seeded),
        cmocka_unit_test_setup_teardown(test_stop_ids_and_prompt, setup, model_fix_teardown),
        cmocka_unit_test(test_stream_utf8),
        cmocka_unit_test(test_gen_req_parse),
        cmocka_unit_test(test_gen_req_params),
        cmocka_unit_test(test_gen_req_ids),
        cmocka_unit_test(test_gen_req_tools),
        cmocka_unit_test(test_gen_record_seed),
        cmocka_unit_test_setup_teardown(test_gen_cache_reuse, setup, model_fix_teardown),
        cmocka_unit_test(test_gen_through_exec),
        cmocka_unit_test_setup_teardown(test_gen_seqs, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_gen_seqs_dynamic_rope, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_gen_prefill, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_gen_prefill_dynamic_rope, setup, model_fix_teardown),
        cmocka_unit_test_setup_teardown(test_gen_prefill_refusals, setup, model_fix_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
