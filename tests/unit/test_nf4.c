/* test_nf4.c - NF4 with double quantization (src/numeric/nf4.c) and pre-quantized bitsandbytes
 * weights (src/formats/bnb4.c): the code tables, bnb's dynamic map against a published dump,
 * dQuantize against nearest-code search, quantize/dequantize error bounds, chunked
 * quantization, edge cases (odd sizes, zero blocks, non-finite input), the exact fsum, and
 * a bitsandbytes-layout safetensors file parsed back (good and bad). The byte-level
 * comparison with an independent numpy reference is tests/ref/test_nf4_ref.py. */
#include "tests/unit/harness.h"

#include <float.h>

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/formats/bnb4.h"
#include "src/numeric/nf4.h"
#include "src/formats/safetensors.h"

/* NF4 round trip of N(0, 1) data: the expected mean |w - dq| / std is ~0.0725 for blocks of
 * 64 (the tiny-llama and example-model figures in test_nf4_ref.py are 0.072-0.095); the
 * bound leaves room for sampling noise only. */
#define FT_TOL_NF4_MAE_PER_STD 0.080
/* Double quantization of absmax: the 8-bit dynamic code's step near +-1 is ~1.4% of the
 * 256-block's spread around the mean, which for the smallest absmax of a block group can be
 * several percent of that absmax (observed 4.8% on N(0, 1) data). */
#define FT_TOL_DQ_ABSMAX_REL 0.10
/* The largest half gap between adjacent NF4 codes, codes 0 and 1: (1 - 0.6961928) / 2. */
#define FT_NF4_MAX_HALF_GAP 0.1519036f

/* bitsandbytes' create_dynamic_map() as dumped from a bnb install and published in
 * EricLBuehler/mistral.rs (mistralrs-quant/src/bitsandbytes/quantize.rs, INT8_CODE), fp32
 * bit patterns. Data, not code: it pins the torch linspace rounding our generator emulates. */
static const uint32_t k_bnb_dynamic_map[256] = {
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
};

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void test_dynamic_map_matches_bnb(void **state)
{
    (void)state;
    float m[256];
    ft_nf4_dynamic_map(m);
    int bad = 0;
    for (int i = 0; i < 256; i++)
        if (bits(m[i]) != k_bnb_dynamic_map[i]) {
            if (bad++ < 5) fprintf(stderr, "map[%d] = %.9g (%08x), bnb %08x\n", i, (double)m[i],
                                   bits(m[i]), k_bnb_dynamic_map[i]);
        }
    fprintf(stderr, "dynamic map: %d of 256 entries differ from the bnb dump\n", bad);
    assert_int_equal(bad, 0);
    assert_true(m[127] == 0.0f && m[255] == 1.0f);
}

static void test_nf4_codes(void **state)
{
    (void)state;
    for (int k = 0; k < 16; k++) assert_int_equal(ft_nf4_quant4(ft_nf4_code[k]), k);
    assert_int_equal(ft_nf4_quant4(NAN), 0);          /* CUDA: 0 * inf from a zero block */
    assert_int_equal(ft_nf4_quant4(-2.0f), 0);
    assert_int_equal(ft_nf4_quant4(2.0f), 15);
    /* the four thresholds that are exact code midpoints: the kernel's literal rounds to the
     * fp32 on the far side, so the fp32 just inside the midpoint goes to the nearer code */
    const struct { uint32_t x; int q; } tie[] = {
        {0xbf591cd8u, 1}, {0xbf591cd9u, 0},   /* -0.8480964: between codes 0 and 1 */
        {0x3df64862u, 8}, {0x3df64863u, 8},   /* 0.1202553: between 8 and 9 */
        {0x3df64864u, 9},
        {0x3f006d03u, 12}, {0x3f006d04u, 13}, /* 0.5016634: between 12 and 13 */
        {0x3f5c89d9u, 14}, {0x3f5c89dau, 15}, /* 0.8614784: between 14 and 15 */
    };
    for (size_t i = 0; i < sizeof tie / sizeof tie[0]; i++) {
        int q = ft_nf4_quant4(from_bits(tie[i].x));
        if (q != tie[i].q) fprintf(stderr, "x = %08x: code %d, expected %d\n", tie[i].x, q, tie[i].q);
        assert_int_equal(q, tie[i].q);
    }
}

/* ft_nf4_quantize_part (four lanes at a time, then a scalar tail) gives exactly the codes of
 * the scalar definition, ft_nf4_quant4(x * (1 / absmax)), for every length 1..300 (odd
 * lengths, partial blocks, tails of 1-3) on random values with the thresholds and the tie
 * inputs of test_nf4_codes planted, at block sizes 64 and 32. */
static void test_quantize_matches_scalar(void **state)
{
    (void)state;
    static const uint32_t ties[] = {0xbf591cd8u, 0xbf591cd9u, 0x3df64862u, 0x3df64863u,
                                    0x3df64864u, 0x3f006d03u, 0x3f006d04u, 0x3f5c89d9u,
                                    0x3f5c89dau};
    /* dQuantizeNF4's thresholds themselves (nf4.c k_thr): x == t must take the lower code */
    static const float thr[15] = {
        -0x1.b239b2p-1f, -0x1.38a4e0p-1f, -0x1.d70900p-2f, -0x1.5bd4ecp-2f, -0x1.e079d8p-3f,
        -0x1.1a7178p-3f, -0x1.74f0e2p-5f, 0x1.45f5fep-5f,  0x1.ec90c6p-4f,  0x1.a0cfc0p-3f,
        0x1.2b05a8p-2f,  0x1.8ea7f2p-2f,  0x1.00da06p-1f,  0x1.491b5ep-1f,  0x1.b913b2p-1f,
    };
    for (int k = 0; k < 15; k++) assert_int_equal(ft_nf4_quant4(thr[k]), k);
    ft_rng r;
    ft_rng_seed(&r, 11);
    float x[300];
    uint8_t codes[150];
    float am[10];
    int64_t checked = 0, bad = 0;
    for (int bs = 32; bs <= 64; bs *= 2)
        for (int n = 1; n <= 300; n++) {
            for (int i = 0; i < n; i++) x[i] = (ft_rng_uniform(&r) * 2.0f - 1.0f) * 0.05f;
            /* a block whose absmax is 1 holds the tie values unscaled */
            if (n >= bs) {
                x[0] = 1.0f;
                for (int i = 1; i < 10; i++) x[i] = from_bits(ties[i - 1]);
                for (int i = 10; i < 25; i++) x[i] = thr[i - 10];
            }
            ft_nf4_layout l;
            assert_int_equal(ft_nf4_layout_init(&l, n, bs, 0), 0);
            assert_int_equal(ft_nf4_quantize_part(x, &l, 0, n, codes, am), 0);
            for (int i = 0; i < n; i++) {
                float inv = 1.0f / am[i / bs];
                int want = ft_nf4_quant4(x[i] * inv);
                int got = i & 1 ? codes[i / 2] & 15 : codes[i / 2] >> 4;
                bad += got != want;
                checked++;
            }
            if (n & 1) bad += (codes[n / 2] & 15) != 0; /* the padding nibble */
        }
    fprintf(stderr, "quantize vs scalar: %lld of %lld codes differ\n", (long long)bad, (long long)checked);
    assert_int_equal(bad, 0);
}

static void test_quant8_nearest(void **state)
{
    (void)state;
    float m[256];
    ft_nf4_dynamic_map(m);
    for (int i = 0; i < 256; i++) assert_int_equal(ft_nf4_quant8(m, m[i]), i);
    ft_rng r;
    ft_rng_seed(&r, 5);
    int not_nearest = 0;
    for (int t = 0; t < 200000; t++) {
        float x = ft_rng_uniform(&r) * 2.0f - 1.0f;
        if (t & 1) x *= 1e-3f;
        int q = ft_nf4_quant8(m, x), best = 0;
        for (int i = 1; i < 256; i++)
            if (fabs((double)x - m[i]) < fabs((double)x - m[best])) best = i;
        if (q != best) {
            /* only where x sits on the fp32 midpoint of the two codes (dQuantize compares
             * against (a + b) * 0.5f in fp32) */
            double gap = fabs(fabs((double)x - m[q]) - fabs((double)x - m[best]));
            assert_true(abs(q - best) == 1);
            assert_true(gap <= 2 * FLT_EPSILON * fabs((double)m[q] + m[best]));
            not_nearest++;
        }
    }
    fprintf(stderr, "dQuantize: %d of 200000 samples at a rounding tie\n", not_nearest);
}

static void fill_normal(float *x, int64_t n, uint64_t seed, float std)
{
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i += 2) {
        float u1 = 1.0f - ft_rng_uniform(&r), u2 = ft_rng_uniform(&r);
        float rr = sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
        x[i] = std * rr * cosf(t);
        if (i + 1 < n) x[i + 1] = std * rr * sinf(t);
    }
}

typedef struct q4 {
    ft_nf4_layout l;
    uint8_t *codes, *qa;
    float *na, *am, off, map[256];
} q4;

static void q4_alloc(q4 *q, int64_t n)
{
    assert_int_equal(ft_nf4_layout_init(&q->l, n, FT_NF4_BLOCK, FT_NF4_NESTED_BLOCK), 0);
    q->codes = calloc((size_t)q->l.code_bytes, 1);
    q->qa = calloc((size_t)q->l.n_blocks, 1);
    q->na = calloc((size_t)q->l.n_nested, 4);
    q->am = calloc((size_t)q->l.n_blocks, 4);
    ft_nf4_dynamic_map(q->map);
}

static void q4_free(q4 *q)
{
    free(q->codes);
    free(q->qa);
    free(q->na);
    free(q->am);
}

static ft_nf4_view q4_view(const q4 *q)
{
    ft_nf4_view v = {q->l, q->codes, q->qa, NULL, q->na, q->map, ft_nf4_code, q->off};
    return v;
}

static void test_roundtrip_error(void **state)
{
    (void)state;
    const int64_t n = 256 * 1024 + 64 * 7 + 3; /* partial absmax and nested blocks, odd n */
    const float sd = 0.02f;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    fill_normal(x, n, 11, sd);
    q4 q;
    q4_alloc(&q, n);
    assert_int_equal(ft_nf4_quantize(x, &q.l, q.map, q.codes, q.qa, q.na, &q.off, q.am), 0);
    ft_nf4_view v = q4_view(&q);
    assert_int_equal(ft_nf4_dequant(&v, y), 0);
    double mae = 0, worst = 0;
    int64_t over = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = i / FT_NF4_BLOCK;
        double e = fabs((double)x[i] - y[i]);
        double bound = FT_NF4_MAX_HALF_GAP * q.am[b] * 1.0001 + fabs((double)q.am[b] - ft_nf4_block_absmax(&v, b));
        mae += e;
        if (e > bound) over++;
        if (e / sd > worst) worst = e / sd;
    }
    mae /= (double)n;
    fprintf(stderr, "NF4 round trip: mean |err| = %.3e (%.4f std), max %.3f std, %lld over the "
            "per-block bound\n", mae, mae / sd, worst, (long long)over);
    assert_true(mae / sd < FT_TOL_NF4_MAE_PER_STD);
    assert_int_equal(over, 0);
    assert_int_equal(q.codes[q.l.code_bytes - 1] & 15, 0); /* odd n: low nibble padding */
    /* the absmax values survive double quantization closely (8-bit code of the spread) */
    double amax_err = 0;
    for (int64_t b = 0; b < q.l.n_blocks; b++)
        amax_err = fmax(amax_err, fabs(ft_nf4_block_absmax(&v, b) - q.am[b]) / q.am[b]);
    fprintf(stderr, "double quantization: max relative absmax error %.3e\n", amax_err);
    assert_true(amax_err < FT_TOL_DQ_ABSMAX_REL);

    /* chunked quantization (the pack builder's row chunks) gives the same bytes */
    q4 c;
    q4_alloc(&c, n);
    for (int64_t e0 = 0; e0 < n; e0 += 64 * 100) {
        int64_t cnt = e0 + 64 * 100 <= n ? 64 * 100 : n - e0;
        assert_int_equal(ft_nf4_quantize_part(x + e0, &c.l, e0, cnt, c.codes, c.am), 0);
    }
    assert_int_equal(ft_nf4_quantize_nested(c.am, &c.l, c.map, c.qa, c.na, &c.off), 0);
    assert_memory_equal(c.codes, q.codes, (size_t)q.l.code_bytes);
    assert_memory_equal(c.qa, q.qa, (size_t)q.l.n_blocks);
    assert_memory_equal(c.na, q.na, (size_t)q.l.n_nested * 4);
    assert_true(bits(c.off) == bits(q.off));
    /* a ranged dequant equals the whole */
    float *z = malloc(1000 * 4);
    assert_int_equal(ft_nf4_dequant_range(&v, 12345, 1000, z), 0);
    assert_memory_equal(z, y + 12345, 1000 * 4);
    free(z);
    q4_free(&c);
    q4_free(&q);
    free(x);
    free(y);
}

static void test_edge_cases(void **state)
{
    (void)state;
    float x[200];
    for (int i = 0; i < 200; i++) x[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 64; i++) x[i] = 0.0f; /* a zero block */
    q4 q;
    q4_alloc(&q, 200);
    assert_int_equal(ft_nf4_quantize(x, &q.l, q.map, q.codes, q.qa, q.na, &q.off, q.am), 0);
    assert_true(q.am[0] == 0.0f);
    for (int i = 0; i < 32; i++) assert_int_equal(q.codes[i], 0); /* NaN -> code 0, as CUDA */
    float y[200];
    ft_nf4_view v = q4_view(&q);
    assert_int_equal(ft_nf4_dequant(&v, y), 0);
    for (int i = 0; i < 64; i++) assert_true(fabsf(y[i]) <= fabsf(ft_nf4_block_absmax(&v, 0)));
    /* non-finite input is an error naming the element */
    x[150] = INFINITY;
    assert_int_equal(ft_nf4_quantize(x, &q.l, q.map, q.codes, q.qa, q.na, &q.off, q.am), FT_E_NUMERIC);
    assert_non_null(strstr(ft_errmsg(), "element 150"));
    x[150] = NAN;
    assert_int_equal(ft_nf4_quantize(x, &q.l, q.map, q.codes, q.qa, q.na, &q.off, q.am), FT_E_NUMERIC);
    /* bad layouts and part ranges */
    ft_nf4_layout l;
    assert_int_equal(ft_nf4_layout_init(&l, 100, 48, 256), FT_E_INVALID);
    assert_int_equal(ft_nf4_layout_init(&l, 0, 64, 256), FT_E_INVALID);
    assert_int_equal(ft_nf4_layout_init(&l, 100, 64, 3), FT_E_INVALID);
    assert_int_equal(ft_nf4_quantize_part(x, &q.l, 10, 64, q.codes, q.am), FT_E_INVALID);
    q4_free(&q);
}

static void test_fsum(void **state)
{
    (void)state;
    float a[] = {1e8f, 1.0f, -1e8f, 3e-8f, 1.0f};
    double s = ft_nf4_fsum(a, 5);
    fprintf(stderr, "fsum = %.17g (naive float sum %.9g)\n", s, (double)(a[0] + a[1] + a[2] + a[3] + a[4]));
    assert_true(s == 2.0 + (double)3e-8f);
    float b[1000];
    double exact = 0;
    for (int i = 0; i < 1000; i++) {
        b[i] = 1.0f / (float)(i + 1);
        exact += (double)b[i]; /* all partial sums fit: compare with a loose bound */
    }
    assert_true(fabs(ft_nf4_fsum(b, 1000) - exact) < 1e-12);
}

/* ---- bitsandbytes checkpoints ---------------------------------------------------------- */

typedef struct bnbfile {
    char *dir, path[512];
    float *w;
    q4 q;
} bnbfile;

/* Writes a one-weight bnb-layout safetensors file; `json` overrides the quant state. */
static void write_bnb(bnbfile *f, int64_t rows, int64_t cols, const char *json, int drop_nested)
{
    int64_t n = rows * cols;
    f->w = malloc(n * 4);
    fill_normal(f->w, n, 3, 0.05f);
    q4_alloc(&f->q, n);
    assert_int_equal(ft_nf4_quantize(f->w, &f->q.l, f->q.map, f->q.codes, f->q.qa, f->q.na,
                                     &f->q.off, f->q.am), 0);
    char js[512];
    if (!json) {
        snprintf(js, sizeof js, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", "
                 "\"shape\": [%lld, %lld], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", "
                 "\"nested_offset\": %.9g}", (long long)rows, (long long)cols, (double)f->q.off);
        json = js;
    }
    const char *P = "model.layers.0.mlp.up_proj.weight";
    char nm[6][128];
    const char *sfx[6] = {"", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                          ".quant_state.bitsandbytes__nf4"};
    for (int i = 0; i < 6; i++) snprintf(nm[i], sizeof nm[i], "%s%s", P, sfx[i]);
    ft_st_out t[6] = {
        {nm[0], FT_ST_U8, 2, {f->q.l.code_bytes, 1}, f->q.codes},
        {nm[1], FT_ST_U8, 1, {f->q.l.n_blocks}, f->q.qa},
        {nm[2], FT_ST_F32, 1, {16}, ft_nf4_code},
        {nm[3], FT_ST_F32, 1, {f->q.l.n_nested}, f->q.na},
        {nm[4], FT_ST_F32, 1, {256}, f->q.map},
        {nm[5], FT_ST_U8, 1, {(int64_t)strlen(json)}, json},
    };
    if (drop_nested) t[3] = t[5];
    f->dir = t_tmpdir();
    assert_non_null(f->dir);
    snprintf(f->path, sizeof f->path, "%s/model.safetensors", f->dir);
    const char *k[] = {"format"}, *v[] = {"pt"};
    assert_int_equal(ft_st_write(f->path, t, drop_nested ? 5 : 6, k, v, 1), 0);
}

static void free_bnb(bnbfile *f)
{
    unlink(f->path);
    rmdir(f->dir);
    free(f->dir);
    free(f->w);
    q4_free(&f->q);
}

static void test_bnb4_roundtrip(void **state)
{
    (void)state;
    bnbfile f;
    write_bnb(&f, 96, 160, NULL, 0);
    ft_st_set *s;
    assert_int_equal(ft_st_set_open(&s, f.dir), 0);
    const char *P = "model.layers.0.mlp.up_proj.weight";
    assert_int_equal(ft_bnb4_detect(s, P), 1);
    assert_int_equal(ft_bnb4_detect(s, "model.layers.0.mlp.down_proj.weight"), 0);
    ft_bnb4_tensor t;
    assert_int_equal(ft_bnb4_open(s, P, 96, 160, &t), 0);
    assert_string_equal(t.dtype, "bfloat16");
    assert_true(bits(t.v.offset) == bits(f.q.off));
    assert_memory_equal(t.v.codes, f.q.codes, (size_t)f.q.l.code_bytes);
    float *a = malloc(96 * 160 * 4), *b = malloc(96 * 160 * 4);
    ft_nf4_view v = q4_view(&f.q);
    assert_int_equal(ft_nf4_dequant(&v, a), 0);
    assert_int_equal(ft_bnb4_dequant(s, P, 96, 160, b), 0);
    assert_memory_equal(a, b, 96 * 160 * 4);
    ft_bnb4_free(&t);
    /* the wrong shape is refused, naming the tensor */
    assert_int_equal(ft_bnb4_open(s, P, 160, 96, &t), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "up_proj"));
    ft_st_set_close(s);
    free(a);
    free(b);
    free_bnb(&f);
}

static void test_bnb4_bad(void **state)
{
    (void)state;
    const char *P = "model.layers.0.mlp.up_proj.weight";
    struct { const char *json; int drop; int rc; const char *needle; } cases[] = {
        {"{\"quant_type\": \"fp4\", \"blocksize\": 64, \"shape\": [64, 64]}", 0, FT_E_UNSUPPORTED, "fp4"},
        {"{\"quant_type\": \"nf4\", \"shape\": [64, 64]}", 0, FT_E_INVALID, "blocksize"},
        {"[1, 2]", 0, FT_E_INVALID, "JSON object"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"shape\": [64, 64], \"nested_blocksize\": 256}",
         0, FT_E_INVALID, "nested_offset"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 128, \"shape\": [64, 64], \"nested_blocksize\": 256, "
         "\"nested_offset\": 0.1}", 0, FT_E_INVALID, "absmax"},
        {NULL, 1, FT_E_INVALID, "nested_absmax"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bnbfile f;
        write_bnb(&f, 64, 64, cases[i].json, cases[i].drop);
        ft_st_set *s;
        assert_int_equal(ft_st_set_open(&s, f.dir), 0);
        ft_bnb4_tensor t;
        int rc = ft_bnb4_open(s, P, 64, 64, &t);
        fprintf(stderr, "bad bnb case %zu: %s\n", i, ft_errmsg());
        assert_int_equal(rc, cases[i].rc);
        assert_non_null(strstr(ft_errmsg(), cases[i].needle));
        ft_st_set_close(s);
        free_bnb(&f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamic_map_matches_bnb),
        cmocka_unit_test(test_nf4_codes),
        cmocka_unit_test(test_quantize_matches_scalar),
        cmocka_unit_test(test_quant8_nearest),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_fsum),
        cmocka_unit_test(test_bnb4_roundtrip),
        cmocka_unit_test(test_bnb4_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
