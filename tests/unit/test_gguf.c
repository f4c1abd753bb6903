/* test_gguf.c - GGUF reader (formats.md 4.3), ggml dequantization (src/numeric/quant.h) and
 * GGUF model loading with llama.cpp's q/k permutation undone (formats.md 2.4).
 * Fixtures: tests/fixtures/gguf, made by tests/ref/make_gguf_fixtures.py with gguf-py, and
 * kquant_<TYPE>.bin by tests/ref/make_kquant_fixtures.py. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/gguf.h"
#include "src/model/model.h"
#include "src/numeric/quant.h"
#include "src/formats/safetensors.h"
#include "tests/unit/format_fixture.h"

#define FIX "tests/fixtures/gguf/"

/* Tolerances (STYLE C10). Dequantization must match gguf-py bit for bit: same fp32 ops. */
#define FT_TOL_DEQUANT_EXACT 0.0
/* Against the values before quantization, per 32-element block: */
#define FT_TOL_Q8_0_AMAX (1.0 / 127) /* rounding d/2 = amax/254, plus fp16 rounding of d */
#define FT_TOL_Q4_0_AMAX 0.126       /* d = amax/8; the clipped extreme errs by up to d */
#define FT_TOL_Q4_1_RANGE 0.07       /* d = (max-min)/15: d/2 plus fp16 rounding of d and m */
#define FT_TOL_Q4_1_MIN 1e-3         /* ... times |min| for fp16 rounding of m */
#define FT_TOL_F16_REL (1.0 / 2048)  /* fp16 has an 11-bit significand */
#define FT_TOL_F16_ABS 3e-8          /* fp16 subnormal spacing 2^-24, half of it */
#define FT_TOL_BF16_REL (1.0 / 256)  /* bf16 has an 8-bit significand */
#define FT_TOL_SUM_REL 1e-9          /* double sums of the same floats in another order */

/* ---- scalar conversions ----------------------------------------------------------------- */

static void test_scalar_conversions(void **state)
{
    /* every fp16 pattern: f16 -> f32 -> f16 is the identity (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ft_quant_f16_to_f32((uint16_t)h);
        uint16_t back = ft_quant_f32_to_f16(f);
        if (isnan(f)) {
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
            continue;
        }
        if (back != h) fail_msg("f16 0x%04x -> %g -> 0x%04x", h, f, back);
        uint16_t b = (uint16_t)h;
        float g = ft_quant_bf16_to_f32(b);
        if (!isnan(g) && ft_quant_f32_to_bf16(g) != b) fail_msg("bf16 0x%04x round trip", h);
    }
    /* known values, including rounding to nearest even */
    assert_true(ft_quant_f16_to_f32(0x3c00) == 1.0f);
    assert_true(ft_quant_f16_to_f32(0xc000) == -2.0f);
    assert_true(ft_quant_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(ft_quant_f16_to_f32(0x0001) == 5.960464477539063e-08f);
    assert_true(isinf(ft_quant_f16_to_f32(0x7c00)));
    assert_int_equal(ft_quant_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(ft_quant_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(ft_quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);        /* tie -> even */
    assert_int_equal(ft_quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie -> even */
    assert_int_equal(ft_quant_f32_to_f16(0x1p-25f), 0x0000);               /* tie -> 0 */
    assert_int_equal(ft_quant_f32_to_f16(0x1.000002p-25f), 0x0001);
    assert_int_equal(ft_quant_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(ft_quant_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);        /* tie -> even */
    assert_int_equal(ft_quant_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_true(ft_quant_bf16_to_f32(0x3f80) == 1.0f);
    /* block geometry */
    int64_t bn, bb;
    assert_int_equal(ft_quant_block(FT_GGML_Q4_1, &bn, &bb), 0);
    assert_true(bn == 32 && bb == 20);
    assert_int_equal(ft_quant_block(16, &bn, &bb), 0); /* IQ2_XXS parses, cannot dequantize */
    assert_true(bn == 256 && bb == 66 && !ft_quant_can_dequant(16));
    assert_int_equal(ft_quant_block(4, &bn, &bb), FT_E_UNSUPPORTED); /* removed Q4_2 */
    assert_int_equal(ft_quant_bytes(FT_GGML_Q8_0, 64), 68);
    assert_int_equal(ft_quant_bytes(FT_GGML_Q8_0, 48), -1);
    float out[256];
    uint8_t blk[66] = {0};
    expect_err(ft_quant_dequant(16, blk, out, 256), FT_E_UNSUPPORTED, "IQ2_XXS", "Q4_K",
               "IQ4_XS", NULL);
    expect_err(ft_quant_dequant(FT_GGML_Q8_0, blk, out, 16), FT_E_INVALID, "Q8_0", NULL);
    /* a hand-made Q4_0 block: d = 0.5 (fp16 0x3800); element 0 = low nibble of byte 0,
     * element 16 = its high nibble */
    uint8_t q4[18] = {0x00, 0x38};
    q4[2] = 0xF3; /* lo 3 -> (3-8)*0.5 = -2.5, hi 15 -> 3.5 */
    assert_int_equal(ft_quant_dequant(FT_GGML_Q4_0, q4, out, 32), 0);
    assert_true(out[0] == -2.5f && out[16] == 3.5f && out[1] == -4.0f);
}

/* ---- dequantization against gguf-py ------------------------------------------------------ */

static double block_tol(int type, const float *orig)
{
    float mn = orig[0], mx = orig[0], amax = 0;
    for (int i = 0; i < 32; i++) {
        mn = fminf(mn, orig[i]);
        mx = fmaxf(mx, orig[i]);
        amax = fmaxf(amax, fabsf(orig[i]));
    }
    switch (type) {
    case FT_GGML_Q8_0: return amax * FT_TOL_Q8_0_AMAX;
    case FT_GGML_Q4_0: return amax * FT_TOL_Q4_0_AMAX;
    case FT_GGML_Q4_1: return (mx - mn) * FT_TOL_Q4_1_RANGE + fabsf(mn) * FT_TOL_Q4_1_MIN;
    default: return 0;
    }
}

/* Max |a-b| and whether every element is within the type's tolerance of ref. */
static double compare(int type, const float *got, const float *ref, int64_t n, const char *what)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]), tol;
        if (type == FT_GGML_F32 || type == FT_GGML_BF16) tol = 0; /* bf16 sources: exact */
        else if (type == FT_GGML_F16) tol = fabs(ref[i]) * FT_TOL_F16_REL + FT_TOL_F16_ABS;
        else tol = block_tol(type, ref + (i / 32) * 32);
        if (e > worst) worst = e;
        if (!(e <= tol))
            fail_msg("%s [%lld]: %.9g vs %.9g (err %.3g > tol %.3g, %s)", what, (long long)i,
                     got[i], ref[i], e, tol, ft_quant_name(type));
    }
    return worst;
}

static void test_dequant_vs_gguf_py(void **state)
{
    ft_gguf *g;
    ft_st_file *ex;
    if (ft_gguf_open(&g, FIX "quant_types.gguf")) fail_msg("%s", ft_errmsg());
    if (ft_st_open(&ex, FIX "quant_types.expected.safetensors")) fail_msg("%s", ft_errmsg());
    static const struct { const char *name; int type; } ts[] = {
        {"t_f32", FT_GGML_F32}, {"t_f16", FT_GGML_F16}, {"t_bf16", FT_GGML_BF16},
        {"t_q8_0", FT_GGML_Q8_0}, {"t_q4_0", FT_GGML_Q4_0}, {"t_q4_1", FT_GGML_Q4_1},
    };
    float got[16 * 128], ref[16 * 128], orig[16 * 128];
    for (int k = 0; k < 6; k++) {
        const ft_gguf_tensor *t = ft_gguf_find_tensor(g, ts[k].name);
        assert_non_null(t);
        assert_int_equal(t->type, ts[k].type);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], 128); /* ggml ne = [cols, rows] of the (16, 128) array */
        assert_int_equal(t->ne[1], 16);
        assert_int_equal(t->n_elems, 16 * 128);
        assert_int_equal(t->nbytes, ft_quant_bytes(t->type, 16 * 128));
        assert_int_equal(t->file_offset % ft_gguf_alignment(g), 0);
        assert_int_equal(ft_gguf_tensor_f32(g, t, got), 0);
        char nm[64];
        snprintf(nm, sizeof nm, "%s.dequant", ts[k].name);
        assert_int_equal(ft_st_to_f32(ft_st_find(ex, nm), ref, 16 * 128), 0);
        snprintf(nm, sizeof nm, "%s.orig", ts[k].name);
        assert_int_equal(ft_st_to_f32(ft_st_find(ex, nm), orig, 16 * 128), 0);
        double dq = 0;
        for (int i = 0; i < 16 * 128; i++) {
            double e = fabs((double)got[i] - ref[i]);
            if (e > dq) dq = e;
            if (e > FT_TOL_DEQUANT_EXACT || memcmp(&got[i], &ref[i], 4))
                fail_msg("%s[%d] = %.9g, gguf.quants.dequantize gives %.9g", ts[k].name, i,
                         got[i], ref[i]);
        }
        double vs_orig;
        if (ts[k].type == FT_GGML_BF16) {
            vs_orig = 0;
            for (int i = 0; i < 16 * 128; i++) {
                double e = fabs((double)got[i] - orig[i]);
                if (e > fabs(orig[i]) * FT_TOL_BF16_REL) fail_msg("bf16[%d] %g vs %g", i, got[i], orig[i]);
                vs_orig = fmax(vs_orig, e);
            }
        } else {
            vs_orig = compare(ts[k].type, got, orig, 16 * 128, ts[k].name);
        }
        printf("  %-6s: max abs err vs gguf.quants.dequantize %.3g (tol %g, bit-exact); "
               "vs the unquantized values %.4g\n", ft_quant_name(ts[k].type), dq,
               FT_TOL_DEQUANT_EXACT, vs_orig);
    }
    /* a 3-D tensor: ne is innermost first */
    const ft_gguf_tensor *t3 = ft_gguf_find_tensor(g, "t_3d");
    assert_int_equal(t3->n_dims, 3);
    assert_true(t3->ne[0] == 32 && t3->ne[1] == 3 && t3->ne[2] == 2 && t3->ne[3] == 1);
    float v3[192];
    assert_int_equal(ft_gguf_tensor_f32(g, t3, v3), 0);
    for (int i = 0; i < 192; i++) assert_true(v3[i] == (float)i * 0.5f - 7);
    assert_null(ft_gguf_find_tensor(g, "t_q4_2"));
    ft_st_close(ex);
    ft_gguf_close(g);
}

/* tests/fixtures/gguf/kquant_<TYPE>.bin (tests/ref/make_kquant_fixtures.py): n blocks of
 * raw bytes, then the n * block_n float32 values gguf.quants.dequantize gives for them. */
static void test_kquant_vs_gguf_py(void **state)
{
    static const struct { int type; const char *name; int block_n, block_bytes; } ts[] = {
        {FT_GGML_Q5_0, "Q5_0", 32, 22},      {FT_GGML_Q5_1, "Q5_1", 32, 24},
        {FT_GGML_Q2_K, "Q2_K", 256, 84},     {FT_GGML_Q3_K, "Q3_K", 256, 110},
        {FT_GGML_Q4_K, "Q4_K", 256, 144},    {FT_GGML_Q5_K, "Q5_K", 256, 176},
        {FT_GGML_Q6_K, "Q6_K", 256, 210},    {FT_GGML_IQ4_NL, "IQ4_NL", 32, 18},
        {FT_GGML_IQ4_XS, "IQ4_XS", 256, 136},
    };
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        int64_t bn, bb;
        assert_int_equal(ft_quant_block(ts[k].type, &bn, &bb), 0);
        assert_true(bn == ts[k].block_n && bb == ts[k].block_bytes);
        assert_string_equal(ft_quant_name(ts[k].type), ts[k].name);
        assert_true(ft_quant_can_dequant(ts[k].type));
        char path[128];
        snprintf(path, sizeof path, FIX "kquant_%s.bin", ts[k].name);
        char *all;
        size_t len;
        if (ft_read_file(path, &all, &len)) fail_msg("%s", ft_errmsg());
        size_t per = (size_t)(bb + 4 * bn);
        if (len == 0 || len % per) fail_msg("%s: %zu bytes is not n x %zu", path, len, per);
        int64_t nb = (int64_t)(len / per), n = nb * bn;
        assert_int_equal(ft_quant_bytes(ts[k].type, n), nb * bb);
        assert_int_equal(ft_quant_bytes(ts[k].type, n + 1), -1);
        /* the blocks in a buffer of exactly their size (an over-read shows under ASan) */
        uint8_t *blocks = malloc((size_t)(nb * bb));
        float *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        assert_true(blocks && ref && got);
        memcpy(blocks, all, (size_t)(nb * bb));
        memcpy(ref, all + nb * bb, (size_t)n * 4); /* little-endian host */
        memset(got, 0xff, (size_t)n * 4);          /* NaN: an element left unwritten fails */
        assert_int_equal(ft_quant_dequant(ts[k].type, blocks, got, n), 0);
        int64_t same = 0, nz = 0;
        double amax = 0;
        for (int64_t i = 0; i < n; i++) {
            assert_false(isnan(ref[i]));
            if (memcmp(&got[i], &ref[i], 4) || got[i] != ref[i]) {
                uint32_t gb, rb;
                memcpy(&gb, &got[i], 4);
                memcpy(&rb, &ref[i], 4);
                fail_msg("%s block %lld element %lld = %.9g (0x%08x), gguf.quants.dequantize "
                         "gives %.9g (0x%08x)", ts[k].name, (long long)(i / bn),
                         (long long)(i % bn), got[i], gb, ref[i], rb);
            }
            same++;
            nz += ref[i] != 0;
            amax = fmax(amax, fabs(ref[i]));
        }
        /* block 0 has d = 0 (K-quants with dmin can still be nonzero there) */
        printf("  %-6s: %lld blocks, %lld/%lld floats bit-identical to gguf.quants.dequantize "
               "(%lld nonzero, max |x| %.4g)\n", ts[k].name, (long long)nb, (long long)same,
               (long long)n, (long long)nz, amax);
        /* a count that is not whole blocks */
        expect_err(ft_quant_dequant(ts[k].type, blocks, got, bn - 1 + (bn == 1)), FT_E_INVALID,
                   ts[k].name, "not a multiple", NULL);
        expect_err(ft_quant_dequant(ts[k].type, blocks, got, -bn), FT_E_INVALID, ts[k].name,
                   NULL);
        free(blocks);
        free(ref);
        free(got);
        free(all);
    }
}

static void test_metadata(void **state)
{
    ft_gguf *g;
    if (ft_gguf_open(&g, FIX "quant_types.gguf")) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_gguf_version(g), 3);
    assert_int_equal(ft_gguf_alignment(g), 32);
    assert_int_equal(ft_gguf_n_tensors(g), 7);
    assert_int_equal(ft_gguf_data_offset(g) % 32, 0);
    int64_t i;
    double f;
    int b;
    const char *s;
    assert_int_equal(ft_gguf_get_int(g, "test.u8", &i), 0); assert_int_equal(i, 200);
    assert_int_equal(ft_gguf_get_int(g, "test.i8", &i), 0); assert_int_equal(i, -100);
    assert_int_equal(ft_gguf_get_int(g, "test.u16", &i), 0); assert_int_equal(i, 60000);
    assert_int_equal(ft_gguf_get_int(g, "test.i16", &i), 0); assert_int_equal(i, -30000);
    assert_int_equal(ft_gguf_get_int(g, "test.u32", &i), 0); assert_int_equal(i, 4000000000LL);
    assert_int_equal(ft_gguf_get_int(g, "test.i32", &i), 0); assert_int_equal(i, -2000000000LL);
    assert_int_equal(ft_gguf_get_int(g, "test.i64", &i), 0); assert_int_equal(i, -(1LL << 40));
    assert_int_equal(ft_gguf_get_float(g, "test.f32", &f), 0); assert_true(f == 0.25);
    assert_int_equal(ft_gguf_get_float(g, "test.f64", &f), 0); assert_true(f == 1e-300);
    assert_int_equal(ft_gguf_get_float(g, "test.u16", &f), 0); assert_true(f == 60000);
    assert_int_equal(ft_gguf_get_bool(g, "test.bool", &b), 0); assert_int_equal(b, 1);
    assert_int_equal(ft_gguf_get_str(g, "test.str", &s), 0); assert_string_equal(s, "h\xc3\xa9llo");
    assert_int_equal(ft_gguf_get_str(g, "general.architecture", &s), 0); assert_string_equal(s, "test");
    const ft_gguf_kv *kv = ft_gguf_find_kv(g, "test.u64");
    assert_int_equal(kv->type, FT_GGUF_U64);
    assert_true(kv->u == (1ULL << 63) + 5);
    ft_err_clear();
    expect_err(ft_gguf_get_int(g, "test.u64", &i), FT_E_INVALID, "test.u64", NULL);
    expect_err(ft_gguf_get_int(g, "test.str", &i), FT_E_INVALID, FIX "quant_types.gguf",
               "\"test.str\"", "expected an integer, found string", NULL);
    expect_err(ft_gguf_get_str(g, "test.f32", &s), FT_E_INVALID, "expected a string, found f32", NULL);
    expect_err(ft_gguf_get_int(g, "test.nope", &i), FT_E_NOTFOUND, "\"test.nope\"", NULL);
    kv = ft_gguf_find_kv(g, "test.arr_i32");
    assert_true(kv->type == FT_GGUF_ARRAY && kv->arr_type == FT_GGUF_I32 && kv->arr_n == 3);
    int32_t ai[3];
    float af[3];
    assert_int_equal(ft_gguf_arr_i32(kv, ai), 0);
    assert_true(ai[0] == 1 && ai[1] == -2 && ai[2] == 3);
    assert_int_equal(ft_gguf_arr_f32(kv, af), 0);
    assert_true(af[1] == -2.0f);
    kv = ft_gguf_find_kv(g, "test.arr_f32");
    assert_int_equal(ft_gguf_arr_f32(kv, af), 0);
    assert_true(af[0] == 0.5f && af[1] == -1.5f);
    expect_err(ft_gguf_arr_i32(kv, ai), FT_E_INVALID, "test.arr_f32", NULL);
    kv = ft_gguf_find_kv(g, "test.arr_str");
    assert_true(kv->arr_type == FT_GGUF_STRING && kv->arr_n == 3);
    assert_string_equal(kv->arr_str[0], "a");
    assert_string_equal(kv->arr_str[1], "");
    assert_string_equal(kv->arr_str[2], "\xe4\xb8\xad\xe6\x96\x87");
    expect_err(ft_gguf_arr_f32(kv, af), FT_E_INVALID, "test.arr_str", NULL);
    kv = ft_gguf_find_kv(g, "test.arr_u8");
    uint8_t u8[4];
    memcpy(u8, kv->arr_data, 4);
    assert_true(kv->arr_n == 4 && u8[0] == 7 && u8[3] == 10);
    /* iteration covers everything once */
    int64_t n = ft_gguf_n_kv(g);
    for (int64_t k = 0; k < n; k++)
        assert_ptr_equal(ft_gguf_find_kv(g, ft_gguf_kv_at(g, k)->key), ft_gguf_kv_at(g, k));
    for (int64_t k = 0; k < ft_gguf_n_tensors(g); k++)
        assert_ptr_equal(ft_gguf_find_tensor(g, ft_gguf_tensor_at(g, k)->name), ft_gguf_tensor_at(g, k));
    assert_null(ft_gguf_kv_at(g, n));
    ft_gguf_close(g);
}

/* ---- crafted bad files ---------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static void gb_put(gbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_str(gbuf *b, const char *s) { gb_u64(b, strlen(s)); gb_put(b, s, strlen(s)); }

/* Fault knobs for a small valid file: 3 key/values, tensors "a" (F32 [8]) and "b"
 * (F32 ne [8, 2]), data ending exactly at the end of the file. */
typedef struct {
    uint32_t version;
    uint64_t n_kv, key0_len, arr_count;
    int64_t arr_elem_type;
    uint32_t align_type, align;
    uint64_t b_offset;
    uint32_t b_ndims, b_type;
    int64_t b_ne0, b_ne1;
    int dup_key, dup_tensor, long_name;
    const char *magic;
} gopt;

static gopt gdefault(void)
{
    return (gopt){.version = 3, .arr_count = 3, .arr_elem_type = FT_GGUF_I32,
                  .align_type = FT_GGUF_U32, .align = 32, .b_offset = 32, .b_ndims = 2,
                  .b_type = FT_GGML_F32, .b_ne0 = 8, .b_ne1 = 2, .magic = "GGUF"};
}

static uint8_t *gbuild(const gopt *o, size_t *len)
{
    gbuf b = {0};
    gb_put(&b, o->magic, 4);
    gb_u32(&b, o->version);
    gb_u64(&b, 2);
    gb_u64(&b, o->n_kv ? o->n_kv : 3);
    /* kv 0: general.architecture = "test" */
    if (o->key0_len) {
        gb_u64(&b, o->key0_len);
        gb_put(&b, "general.architecture", 20);
    } else {
        gb_str(&b, "general.architecture");
    }
    gb_u32(&b, FT_GGUF_STRING);
    gb_str(&b, "test");
    /* kv 1: general.alignment */
    gb_str(&b, o->dup_key ? "general.architecture" : "general.alignment");
    gb_u32(&b, o->align_type);
    if (o->align_type == FT_GGUF_STRING) gb_str(&b, "32");
    else gb_u32(&b, o->align);
    /* kv 2: an array */
    gb_str(&b, "test.arr");
    gb_u32(&b, FT_GGUF_ARRAY);
    gb_u32(&b, (uint32_t)o->arr_elem_type);
    gb_u64(&b, o->arr_count);
    for (int i = 0; i < 3; i++) gb_u32(&b, (uint32_t)(i + 1));
    /* tensor infos */
    gb_str(&b, o->long_name ? "a_name_that_is_exactly_sixty_four_bytes_long_which_ggml_rejects_" : "a");
    gb_u32(&b, 1);
    gb_u64(&b, 8);
    gb_u32(&b, FT_GGML_F32);
    gb_u64(&b, 0);
    gb_str(&b, o->dup_tensor ? "a" : "b");
    gb_u32(&b, o->b_ndims);
    for (uint32_t d = 0; d < o->b_ndims; d++) gb_u64(&b, d == 0 ? (uint64_t)o->b_ne0 : d == 1 ? (uint64_t)o->b_ne1 : 1);
    gb_u32(&b, o->b_type);
    gb_u64(&b, o->b_offset);
    while (b.n % 32) gb_put(&b, "", 1);
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bb[16];
    for (int i = 0; i < 16; i++) bb[i] = (float)(10 + i);
    gb_put(&b, a, 32);
    int64_t ne, nb = __builtin_mul_overflow(o->b_ne0, o->b_ne1, &ne) ? -1
                                                                      : ft_quant_bytes((int)o->b_type, ne);
    if (o->b_type == FT_GGML_F32 && nb == 64) gb_put(&b, bb, 64);
    else if (nb > 0 && nb <= 4096) for (int64_t i = 0; i < nb; i++) gb_put(&b, "\x3c", 1);
    while (b.n % 32) gb_put(&b, "", 1);
    *len = b.n;
    return b.p;
}

static int open_built(const gopt *o, char **path)
{
    size_t n;
    uint8_t *d = gbuild(o, &n);
    *path = t_write_tmp("x.gguf", d, n);
    free(d);
    ft_gguf *g = NULL;
    ft_err_clear();
    int rc = ft_gguf_open(&g, *path);
    ft_gguf_close(g);
    return rc;
}

#define EXPECT_G(opt, want, ...)                                                         \
    do {                                                                                 \
        char *p_;                                                                        \
        int rc_ = open_built(&(opt), &p_);                                               \
        expect_err(rc_, want, p_, __VA_ARGS__);                                          \
        rm_tmp(p_);                                                                      \
    } while (0)

static void test_bad_files(void **state)
{
    gopt o = gdefault();
    char *p;
    assert_int_equal(open_built(&o, &p), 0);
    ft_gguf *g;
    assert_int_equal(ft_gguf_open(&g, p), 0);
    const ft_gguf_tensor *tb = ft_gguf_find_tensor(g, "b");
    float v[16];
    assert_int_equal(ft_gguf_tensor_f32(g, tb, v), 0);
    assert_true(v[0] == 10 && v[15] == 25);
    ft_gguf_close(g);
    rm_tmp(p);

    o = gdefault(); o.magic = "GGML";
    EXPECT_G(o, FT_E_INVALID, "offset 0", "not a GGUF file", NULL);
    o = gdefault(); o.version = 1;
    EXPECT_G(o, FT_E_UNSUPPORTED, "version 1", NULL);
    o = gdefault(); o.version = 4;
    EXPECT_G(o, FT_E_UNSUPPORTED, "version 4", NULL);
    o = gdefault(); o.version = 0x03000000u;
    EXPECT_G(o, FT_E_UNSUPPORTED, "big-endian", NULL);
    o = gdefault(); o.version = 2; /* v2 reads like v3 */
    assert_int_equal(open_built(&o, &p), 0);
    rm_tmp(p);
    o = gdefault(); o.n_kv = 1ULL << 60;
    EXPECT_G(o, FT_E_CORRUPT, "offset 8", "cannot fit", NULL);
    o = gdefault(); o.key0_len = 1ULL << 62;
    EXPECT_G(o, FT_E_CORRUPT, "offset 24", "length 4611686018427387904", NULL);
    o = gdefault(); o.arr_count = 1ULL << 61;
    EXPECT_G(o, FT_E_CORRUPT, "\"test.arr\"", "past the end", NULL);
    o = gdefault(); o.arr_elem_type = FT_GGUF_STRING; o.arr_count = 1ULL << 40;
    EXPECT_G(o, FT_E_CORRUPT, "\"test.arr\"", "cannot fit", NULL);
    o = gdefault(); o.arr_elem_type = FT_GGUF_ARRAY;
    EXPECT_G(o, FT_E_CORRUPT, "\"test.arr\"", "invalid array element type 9", NULL);
    o = gdefault(); o.arr_elem_type = 13;
    EXPECT_G(o, FT_E_CORRUPT, "invalid array element type 13", NULL);
    o = gdefault(); o.align = 48;
    EXPECT_G(o, FT_E_CORRUPT, "general.alignment", "power of two, found 48", NULL);
    o = gdefault(); o.align_type = FT_GGUF_STRING;
    EXPECT_G(o, FT_E_CORRUPT, "general.alignment", "must be a u32, found string", NULL);
    o = gdefault(); o.align_type = 99;
    EXPECT_G(o, FT_E_CORRUPT, "invalid value type 99", NULL);
    o = gdefault(); o.dup_key = 1; o.align_type = FT_GGUF_STRING;
    EXPECT_G(o, FT_E_CORRUPT, "duplicate metadata key \"general.architecture\"", NULL);
    o = gdefault(); o.dup_tensor = 1;
    EXPECT_G(o, FT_E_CORRUPT, "duplicate tensor name \"a\"", NULL);
    o = gdefault(); o.long_name = 1;
    EXPECT_G(o, FT_E_CORRUPT, "tensor name length 64", NULL);
    o = gdefault(); o.b_offset = 64;
    EXPECT_G(o, FT_E_CORRUPT, "tensor \"b\" has offset 64, expected 32", NULL);
    o = gdefault(); o.b_offset = 0;
    EXPECT_G(o, FT_E_CORRUPT, "tensor \"b\" has offset 0, expected 32", NULL);
    o = gdefault(); o.b_ndims = 5;
    EXPECT_G(o, FT_E_CORRUPT, "\"b\" has 5 dims", NULL);
    o = gdefault(); o.b_ne0 = -8;
    EXPECT_G(o, FT_E_CORRUPT, "\"b\"", "dim 0 = -8", NULL);
    o = gdefault(); o.b_ne0 = 1LL << 40; o.b_ne1 = 1LL << 40;
    EXPECT_G(o, FT_E_CORRUPT, "\"b\"", "overflows", NULL);
    o = gdefault(); o.b_ne0 = 1LL << 40; o.b_ne1 = 1;
    EXPECT_G(o, FT_E_CORRUPT, "\"b\"", "past the end", NULL);
    o = gdefault(); o.b_type = 99;
    EXPECT_G(o, FT_E_UNSUPPORTED, "\"b\"", "unknown ggml type 99", NULL);
    o = gdefault(); o.b_type = FT_GGML_Q8_0; o.b_ne0 = 16;
    EXPECT_G(o, FT_E_CORRUPT, "\"b\"", "ne[0] = 16", "Q8_0 block size 32", NULL);
    /* a type ggml knows but ftune cannot dequantize (IQ2_XXS): opens, conversion refuses */
    o = gdefault(); o.b_type = 16; o.b_ne0 = 256; o.b_ne1 = 1;
    assert_int_equal(open_built(&o, &p), 0);
    assert_int_equal(ft_gguf_open(&g, p), 0);
    static float big[256];
    expect_err(ft_gguf_tensor_f32(g, ft_gguf_find_tensor(g, "b"), big), FT_E_UNSUPPORTED, p,
               "\"b\"", "IQ2_XXS", "supported: F32", "IQ4_XS", NULL);
    ft_gguf_close(g);
    rm_tmp(p);
    /* short and missing files */
    p = t_write_tmp("s.gguf", "GGUF\3\0\0\0", 8);
    expect_err(ft_gguf_open(&g, p), FT_E_CORRUPT, p, "8 bytes", NULL);
    rm_tmp(p);
    expect_err(ft_gguf_open(&g, "/nonexistent/x.gguf"), -ENOENT, "/nonexistent/x.gguf", NULL);
}

/* Every truncation of a real fixture fails without crashing. */
static void test_truncations(void **state)
{
    char *all;
    size_t n;
    assert_int_equal(ft_read_file(FIX "quant_types.gguf", &all, &n), 0);
    char *p = t_write_tmp("t.gguf", all, n);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    size_t rejected = 0;
    int codes[3] = {0};
    for (size_t k = n; k-- > 0;) {
        assert_int_equal(ftruncate(fd, (off_t)k), 0);
        ft_gguf *g = NULL;
        ft_err_clear();
        int rc = ft_gguf_open(&g, p);
        if (rc == 0) fail_msg("truncated to %zu of %zu bytes but opened", k, n);
        if (!strstr(ft_errmsg(), p)) fail_msg("message \"%s\" lacks the path", ft_errmsg());
        codes[rc == FT_E_CORRUPT ? 0 : rc == FT_E_INVALID ? 1 : 2]++;
        rejected++;
    }
    close(fd);
    assert_int_equal(codes[2], 0);
    printf("  %zu truncations of %s rejected (%d corrupt, %d invalid magic)\n", rejected,
           "quant_types.gguf", codes[0], codes[1]);
    rm_tmp(p);
    free(all);
}

/* Random byte mutations of the header region (deterministic xorshift): opening either
 * fails with an error naming the file or succeeds, and then every tensor converts; never a
 * crash (run under ASan/UBSan in development). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) { return t_xorshift(&rng_state); }

static void mutate_run(const char *fixture, int iters, int as_model)
{
    char *all;
    size_t n;
    assert_int_equal(ft_read_file(fixture, &all, &n), 0);
    ft_gguf *g0;
    assert_int_equal(ft_gguf_open(&g0, fixture), 0);
    size_t hdr = (size_t)ft_gguf_data_offset(g0);
    ft_gguf_close(g0);
    char *p = t_write_tmp("mut.gguf", all, n);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    int ok = 0, bad = 0;
    static const uint8_t special[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x40};
    for (int it = 0; it < iters; it++) {
        size_t pos[4];
        int k = 1 + (int)(rnd() % 4);
        for (int j = 0; j < k; j++) {
            pos[j] = (size_t)(rnd() % hdr);
            uint8_t b = rnd() % 2 ? special[rnd() % sizeof special] : (uint8_t)rnd();
            assert_int_equal(pwrite(fd, &b, 1, (off_t)pos[j]), 1);
        }
        ft_err_clear();
        int rc;
        if (as_model) {
            ft_model *m = NULL;
            rc = ft_model_load(&m, p);
            ft_model_free(m);
        } else {
            ft_gguf *g = NULL;
            rc = ft_gguf_open(&g, p);
            for (int64_t t = 0; !rc && t < ft_gguf_n_tensors(g); t++) {
                const ft_gguf_tensor *tt = ft_gguf_tensor_at(g, t);
                float *buf = malloc((size_t)(tt->n_elems ? tt->n_elems : 1) * sizeof *buf);
                assert_non_null(buf);
                int r2 = ft_gguf_tensor_f32(g, tt, buf);
                assert_true(r2 == 0 || r2 == FT_E_UNSUPPORTED);
                free(buf);
            }
            ft_gguf_close(g);
        }
        if (rc) {
            bad++;
            if (!strstr(ft_errmsg(), p)) fail_msg("message \"%s\" lacks the path", ft_errmsg());
        } else {
            ok++;
        }
        for (int j = 0; j < k; j++) assert_int_equal(pwrite(fd, all + pos[j], 1, (off_t)pos[j]), 1);
    }
    close(fd);
    printf("  %d mutations of the %zu-byte header of %s: %d rejected, %d still valid\n", iters,
           hdr, fixture, bad, ok);
    rm_tmp(p);
    free(all);
}

static void test_mutations(void **state)
{
    mutate_run(FIX "quant_types.gguf", 3000, 0);
    mutate_run(FIX "tiny-llama.gguf", 300, 1);
}

/* ---- models ------------------------------------------------------------------------------ */

static void test_tiny_model_equals_safetensors(void **state)
{
    ft_model *hf, *gg;
    if (ft_model_load(&hf, "tests/fixtures/tiny-llama")) fail_msg("%s", ft_errmsg());
    if (ft_model_load(&gg, FIX "tiny-llama.gguf")) fail_msg("%s", ft_errmsg());
    const ft_model_config *a = &hf->cfg, *b = &gg->cfg;
    assert_int_equal(gg->is_gguf, 1);
    assert_string_equal(b->model_type, "llama");
    assert_true(a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size);
    assert_true(a->num_hidden_layers == b->num_hidden_layers);
    assert_true(a->num_attention_heads == b->num_attention_heads);
    assert_true(a->num_key_value_heads == b->num_key_value_heads && a->head_dim == b->head_dim);
    assert_true(a->vocab_size == b->vocab_size && a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta && b->rope_type == FT_ROPE_DEFAULT);
    assert_true(b->tie_word_embeddings == 1 && gg->lm_head == gg->embed);
    assert_true(b->bos_token_id == 1 && b->n_eos == 1 && b->eos_token_id[0] == 2);
    assert_int_equal(ft_model_n_params(gg), ft_model_n_params(hf));

    ft_gguf *g;
    assert_int_equal(ft_gguf_open(&g, FIX "tiny-llama.gguf"), 0);
    const int64_t C = a->hidden_size, V = a->vocab_size;
    double e = compare(ft_gguf_find_tensor(g, "token_embd.weight")->type, gg->embed, hf->embed,
                       V * C, "token_embd");
    printf("  token_embd.weight (%s): max abs err %.4g\n",
           ft_quant_name(ft_gguf_find_tensor(g, "token_embd.weight")->type), e);
    compare(FT_GGML_F32, gg->final_norm, hf->final_norm, C, "output_norm");
    static const char *const gn[FT_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                              "ffn_gate", "ffn_up", "ffn_down"};
    for (int64_t l = 0; l < a->num_hidden_layers; l++) {
        compare(FT_GGML_F32, gg->layers[l].attn_norm, hf->layers[l].attn_norm, C, "attn_norm");
        compare(FT_GGML_F32, gg->layers[l].ffn_norm, hf->layers[l].ffn_norm, C, "ffn_norm");
        for (int p = 0; p < FT_N_PROJ; p++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l, gn[p]);
            const ft_gguf_tensor *t = ft_gguf_find_tensor(g, name);
            const ft_linear *x = &gg->layers[l].proj[p], *y = &hf->layers[l].proj[p];
            assert_true(x->out_n == y->out_n && x->in_n == y->in_n);
            e = compare(t->type, x->w, y->w, x->out_n * x->in_n, name);
            printf("  %-22s (%-4s): max abs err %.4g\n", name, ft_quant_name(t->type), e);
        }
    }
    /* the file really holds permuted rows: gguf_row[h*hd + 2i + j] = hf_row[h*hd + j*hd/2 + i] */
    const ft_gguf_tensor *tk = ft_gguf_find_tensor(g, "blk.0.attn_k.weight");
    float *raw = malloc(tk->n_elems * sizeof *raw);
    assert_int_equal(ft_gguf_tensor_f32(g, tk, raw), 0);
    const int64_t hd = a->head_dim;
    const float *hfk = hf->layers[0].proj[FT_K].w;
    assert_true(memcmp(raw, hfk, (size_t)tk->n_elems * 4) != 0);
    for (int64_t h = 0; h < a->num_key_value_heads; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < hd / 2; i++)
                assert_memory_equal(raw + (h * hd + 2 * i + j) * C, hfk + (h * hd + j * hd / 2 + i) * C,
                                    (size_t)C * 4);
    free(raw);
    ft_gguf_close(g);
    /* no tokenizer in this file: a clear error */
    ft_tokenizer *tok = NULL;
    expect_err(ft_model_tokenizer(gg, &tok), FT_E_INVALID, FIX "tiny-llama.gguf",
               "tokenizer.ggml.model", NULL);
    ft_model_free(gg);
    ft_model_free(hf);
}

static void test_rope_freqs_llama3(void **state)
{
    ft_model *m;
    if (ft_model_load(&m, FIX "rope-llama3.gguf")) fail_msg("%s", ft_errmsg());
    const ft_model_config *c = &m->cfg;
    assert_int_equal(c->rope_type, FT_ROPE_LLAMA3);
    printf("  recovered llama3 rope: factor %g, low %g, high %g, original %lld\n", c->rope_factor,
           c->rope_low_freq_factor, c->rope_high_freq_factor,
           (long long)c->rope_original_max_position_embeddings);
    assert_true(fabs(c->rope_factor - 8) < 1e-6);
    assert_true(fabs(c->rope_low_freq_factor - 1) < 1e-3);
    assert_true(fabs(c->rope_high_freq_factor - 4) < 1e-3);
    ft_model_config ref = *c;
    ref.rope_low_freq_factor = 1;
    ref.rope_high_freq_factor = 4;
    ref.rope_original_max_position_embeddings = 8192;
    float x[32], y[32];
    ft_rope_inv_freq(c, 0, x);
    ft_rope_inv_freq(&ref, 0, y);
    double worst = 0;
    for (int i = 0; i < 32; i++) worst = fmax(worst, fabs((double)x[i] - y[i]) / y[i]);
    printf("  inv_freq vs exact Llama-3.1 parameters: max rel err %.3g (tol 1e-6)\n", worst);
    assert_true(worst <= 1e-6);
    ft_model_free(m);
}

/* make_gguf_fixtures.py pattern(): value of flat HF index k of tensor `name`. */
static float pattern(const char *name, int64_t k)
{
    return (float)((double)((k * 7 + (int64_t)strlen(name)) % 101 - 50) / 1000.0);
}

static void check_pattern(const char *name, const float *w, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        if (w[k] != pattern(name, k))
            fail_msg("%s[%lld] = %.9g, expected %.9g", name, (long long)k, w[k], pattern(name, k));
}

static void test_qwen2_gguf(void **state)
{
    ft_model *m;
    if (ft_model_load(&m, FIX "qwen2-tiny.gguf")) fail_msg("%s", ft_errmsg());
    const ft_model_config *c = &m->cfg;
    assert_string_equal(c->model_type, "qwen2");
    assert_true(c->hidden_size == 32 && c->intermediate_size == 64 && c->num_hidden_layers == 1);
    assert_true(c->num_attention_heads == 2 && c->num_key_value_heads == 1 && c->head_dim == 16);
    assert_true(c->vocab_size == 16 && c->tie_word_embeddings == 0 && c->attention_bias == 1);
    assert_true(c->rope_theta == 1e6 && c->rms_norm_eps == 1e-6f && c->max_position_embeddings == 4096);
    assert_true(c->bos_token_id == 15 && c->n_eos == 1 && c->eos_token_id[0] == 14);
    check_pattern("token_embd.weight", m->embed, 16 * 32);
    check_pattern("output.weight", m->lm_head, 16 * 32);
    check_pattern("output_norm.weight", m->final_norm, 32);
    const ft_layer_weights *w = &m->layers[0];
    check_pattern("blk.0.attn_norm.weight", w->attn_norm, 32);
    check_pattern("blk.0.ffn_norm.weight", w->ffn_norm, 32);
    static const char *const gn[FT_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                              "ffn_gate", "ffn_up", "ffn_down"};
    for (int p = 0; p < FT_N_PROJ; p++) {
        char name[64];
        snprintf(name, sizeof name, "blk.0.%s.weight", gn[p]);
        check_pattern(name, w->proj[p].w, w->proj[p].out_n * w->proj[p].in_n);
        if (p <= FT_V) {
            assert_non_null(w->proj[p].b);
            snprintf(name, sizeof name, "blk.0.%s.bias", gn[p]);
            check_pattern(name, w->proj[p].b, w->proj[p].out_n);
        } else {
            assert_null(w->proj[p].b);
        }
    }
    /* params: untied embeddings twice, q/k/v biases counted */
    assert_int_equal(ft_model_n_params(m), 2 * 16 * 32 + 32 + 2 * 32 + 32 * 32 + 2 * 16 * 32 +
                                               32 * 32 + 3 * 64 * 32 + 32 + 16 + 16);
    printf("  qwen2: every element of 15 tensors (q/k/v biases included, no permutation) as written\n");
    ft_model_free(m);
}

/* Loads a patched copy of tiny-llama.gguf: `n` bytes at the first occurrence of `at`
 * (+ skip) replaced by `with`. */
static int load_patched(const char *at, size_t skip, const void *with, size_t n, size_t trunc,
                        char **path)
{
    char *all;
    size_t len;
    assert_int_equal(ft_read_file(FIX "tiny-llama.gguf", &all, &len), 0);
    if (at) {
        char *pos = memmem(all, len, at, strlen(at));
        assert_non_null(pos);
        memcpy(pos + skip, with, n);
    }
    *path = t_write_tmp("m.gguf", all, trunc ? trunc : len);
    free(all);
    ft_model *m = NULL;
    ft_err_clear();
    int rc = ft_model_load(&m, *path);
    ft_model_free(m);
    return rc;
}

#define EXPECT_M(at, skip, with, n, trunc, want, ...)                                     \
    do {                                                                                  \
        char *p_;                                                                         \
        int rc_ = load_patched(at, skip, with, n, trunc, &p_);                            \
        expect_err(rc_, want, p_, __VA_ARGS__);                                           \
        rm_tmp(p_);                                                                       \
    } while (0)

static void test_model_errors(void **state)
{
    /* general.architecture: key, u32 type, u64 length, then the 5 bytes "llama" */
    EXPECT_M("general.architecture", 20 + 4 + 8, "bloom", 5, 0, FT_E_UNSUPPORTED,
             "general.architecture \"bloom\"", NULL);
    EXPECT_M("llama.block_count", 0, "llama.block_cnxxx", 17, 0, FT_E_INVALID,
             "missing required metadata key \"llama.block_count\"", NULL);
    uint32_t ff = 96;
    EXPECT_M("llama.feed_forward_length", 25 + 4, &ff, 4, 0, FT_E_INVALID,
             "\"blk.0.ffn_gate.weight\"", "ne [64, 128]", "expected ne [64, 96]", "HF shape [96, 64]", NULL);
    uint32_t vt = FT_GGUF_STRING;
    EXPECT_M("llama.attention.head_count", 26, &vt, 4, 0, FT_E_CORRUPT, NULL);
    /* blk.1.ffn_up.weight: name, u32 n_dims, 2 x u64 ne, u32 type: F32 (0) -> I32 (26),
     * which has the same element size, so the file stays consistent; ggml knows I32 but it
     * is no weight type */
    uint32_t i32 = 26;
    EXPECT_M("blk.1.ffn_up.weight", 19 + 4 + 16, &i32, 4, 0, FT_E_UNSUPPORTED,
             "\"blk.1.ffn_up.weight\"", "I32", NULL);
    /* blk.1.attn_v.weight Q4_0 (2) -> IQ4_NL (20), the same block geometry: loads */
    uint32_t iq = 20;
    char *pq;
    assert_int_equal(load_patched("blk.1.attn_v.weight", 19 + 4 + 16, &iq, 4, 0, &pq), 0);
    rm_tmp(pq);
    /* a missing tensor: rename the only ffn_up of layer 1 */
    EXPECT_M("blk.1.ffn_up.weight", 0, "blk.1.ffn_xx.weight", 19, 0, FT_E_INVALID,
             "tensor \"blk.1.ffn_up.weight\" not found", NULL);
    /* truncated in the middle of the data */
    EXPECT_M(NULL, 0, NULL, 0, 700000, FT_E_CORRUPT, "extends past the end", NULL);
    ft_model *m;
    expect_err(ft_model_load(&m, "/nonexistent/x.gguf"), -ENOENT, "/nonexistent/x.gguf", NULL);
}

/* A weight that dequantizes to NaN or infinity (a corrupt value or scale) is refused at load,
 * and by the row reads a streamed pack uses, naming the tensor and the element. */
static void test_nonfinite_weights(void **state)
{
    (void)state;
    ft_gguf *g;
    assert_int_equal(ft_gguf_open(&g, FIX "tiny-llama.gguf"), 0);
    const ft_gguf_tensor *tn = ft_gguf_find_tensor(g, "blk.0.attn_norm.weight");
    const ft_gguf_tensor *tq = ft_gguf_find_tensor(g, "blk.1.attn_v.weight");
    assert_non_null(tn);
    assert_non_null(tq);
    assert_int_equal(tn->type, FT_GGML_F32);
    assert_int_equal(tq->type, FT_GGML_Q4_0);
    int64_t off_n = tn->file_offset, off_q = tq->file_offset;
    ft_gguf_close(g);
    char *all;
    size_t len;
    assert_int_equal(ft_read_file(FIX "tiny-llama.gguf", &all, &len), 0);
    for (int k = 0; k < 2; k++) {
        char *copy = malloc(len);
        assert_non_null(copy);
        memcpy(copy, all, len);
        if (k == 0) { /* element 5 of an F32 norm: NaN */
            uint32_t nan = 0x7fc00000u;
            memcpy(copy + off_n + 5 * 4, &nan, 4);
        } else { /* block 2's fp16 scale of a Q4_0 weight: +inf */
            uint16_t inf = 0x7c00u;
            memcpy(copy + off_q + 2 * 18, &inf, 2);
        }
        char *path = t_write_tmp("m.gguf", copy, len);
        ft_model *m = NULL;
        ft_err_clear();
        expect_err(ft_model_load(&m, path), FT_E_CORRUPT,
                   k ? "\"blk.1.attn_v.weight\"" : "\"blk.0.attn_norm.weight\"",
                   k ? "element 64" : "element 5 dequantizes to NaN", "corrupt", NULL);
        /* the streamed rows (a pack built from the file) refuse it too */
        ft_model *d = NULL;
        assert_int_equal(ft_model_load_deferred(&d, path), 0);
        assert_int_equal(ft_gguf_open(&g, path), 0);
        int64_t out = k ? d->layers[1].proj[FT_V].out_n : d->cfg.hidden_size;
        int64_t cols = k ? d->layers[1].proj[FT_V].in_n : 1;
        float *buf = malloc((size_t)(out * cols) * sizeof *buf);
        assert_non_null(buf);
        expect_err(ft_gguf_hf_rows(g, &d->cfg, k ? "model.layers.1.self_attn.v_proj.weight"
                                                 : "model.layers.0.input_layernorm.weight",
                                   0, out, cols, buf),
                   FT_E_CORRUPT, "dequantizes to", NULL);
        free(buf);
        ft_gguf_close(g);
        ft_model_free(d);
        rm_tmp(path);
        free(copy);
    }
    free(all);
}

/* ---- the example model (SmolLM2-135M-Instruct Q4_1) ---------------------------------------- */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int example_path(char *out, size_t n)
{
    FILE *f = popen("bash scripts/fetch_example.sh 2>/dev/null", "r");
    if (!f) return -1;
    int ok = fgets(out, (int)n, f) != NULL;
    int st = pclose(f);
    if (!ok || st != 0) return -1;
    out[strcspn(out, "\n")] = 0;
    return access(out, R_OK);
}

static void stats(const float *w, int64_t n, double *sum, double *sq)
{
    *sum = *sq = 0;
    for (int64_t i = 0; i < n; i++) {
        *sum += w[i];
        *sq += (double)w[i] * w[i];
    }
}

static void test_example_model(void **state)
{
    char path[4096];
    if (example_path(path, sizeof path)) {
        printf("  example model unavailable (scripts/fetch_example.sh failed): skipped\n");
        skip();
    }
    ft_model *m;
    double t0 = now();
    int rc = ft_model_load(&m, path);
    double t1 = now();
    if (rc) fail_msg("%s", ft_errmsg());
    printf("  loaded %s in %.3f s (%lld parameters, fp32 %.0f MB)\n", path, t1 - t0,
           (long long)ft_model_n_params(m), ft_model_n_params(m) * 4.0 / 1e6);
    const ft_model_config *c = &m->cfg;
    assert_string_equal(c->model_type, "llama");
    assert_true(c->num_hidden_layers == 30 && c->hidden_size == 576 && c->intermediate_size == 1536);
    assert_true(c->num_attention_heads == 9 && c->num_key_value_heads == 3 && c->head_dim == 64);
    assert_true(c->vocab_size == 49152 && c->tie_word_embeddings == 1 && m->lm_head == m->embed);
    assert_true(c->rope_theta == 100000.0 && c->rms_norm_eps == 1e-5f);
    assert_true(c->max_position_embeddings == 8192 && c->rope_type == FT_ROPE_DEFAULT);
    assert_true(c->bos_token_id == 1 && c->n_eos == 1 && c->eos_token_id[0] == 2);
    assert_int_equal(ft_model_n_params(m), 134515008);
    /* Reference statistics in HF layout from gguf-py 0.19 (tensor.data dequantized with
     * gguf.quants.dequantize, q/k un-permuted in numpy with
     * w.reshape(n, hd//2, 2, -1).swapaxes(1, 2).reshape(w.shape), n = 9 for q, 3 for k),
     * sums in float64: (name, sum, sum of squares, 4 samples (row, col, value)). */
    static const struct { const char *name; double sum, sq; int64_t r[4], c[4]; float v[4]; } ref[] = {
        {"token_embd (Q8_0)", -15353.04449415207, 520415.71544763993, {0, 1, 49151, 24579},
         {0, 5, 575, 7}, {-0.10654449462890625f, -0.0079345703125f, -0.0417022705078125f, 0.16168212890625f}},
        {"blk.0.attn_q (Q4_1)", 59.22322082519531, 26749.573275085306, {0, 1, 575, 291},
         {0, 5, 575, 7}, {-0.0963134765625f, -0.2984619140625f, -0.255859375f, 0.28289794921875f}},
        {"blk.0.attn_k (Q4_1)", 26.937057495117188, 17499.561343912734, {0, 1, 191, 99},
         {0, 5, 575, 7}, {-0.1552734375f, 0.4273681640625f, 0.3636474609375f, 0.282958984375f}},
        {"blk.29.ffn_down (Q4_1)", 49.83570861816406, 29667.074891592143, {0, 1, 575, 291},
         {0, 5, 1535, 7}, {-0.2733154296875f, 0.02496337890625f, 0.056640625f, 0.06439208984375f}},
        {"blk.0.attn_norm (F32)", 0.6129436492919922, 0.9180835409024439, {0, 1, 575, 291},
         {0, 0, 0, 0}, {0.01397705078125f, 0.0238037109375f, -0.038330078125f, -0.01239013671875f}},
        {"output_norm (F32)", 1038.33203125, 1921.7355499267578, {0, 1, 575, 291}, {0, 0, 0, 0},
         {1.7578125f, 1.8203125f, 1.984375f, 1.46875f}},
    };
    const float *w[] = {m->embed, m->layers[0].proj[FT_Q].w, m->layers[0].proj[FT_K].w,
                        m->layers[29].proj[FT_DOWN].w, m->layers[0].attn_norm, m->final_norm};
    int64_t rows[] = {49152, 576, 192, 576, 576, 576}, cols[] = {576, 576, 576, 1536, 1, 1};
    for (int k = 0; k < 6; k++) {
        double s, q;
        stats(w[k], rows[k] * cols[k], &s, &q);
        double es = fabs(s - ref[k].sum) / fmax(fabs(ref[k].sum), 1), eq = fabs(q - ref[k].sq) / ref[k].sq;
        printf("  %-24s sum %.10g (rel err %.2g), sum sq %.10g (rel err %.2g; tol %g)\n",
               ref[k].name, s, es, q, eq, FT_TOL_SUM_REL);
        assert_true(es <= FT_TOL_SUM_REL && eq <= FT_TOL_SUM_REL);
        for (int i = 0; i < 4; i++) {
            float got = w[k][ref[k].r[i] * cols[k] + ref[k].c[i]];
            if (got != ref[k].v[i])
                fail_msg("%s[%lld, %lld] = %.9g, gguf-py gives %.9g", ref[k].name,
                         (long long)ref[k].r[i], (long long)ref[k].c[i], got, ref[k].v[i]);
        }
    }
    /* its tokenizer from the GGUF metadata (gpt2-style BPE, ChatML template) */
    ft_tokenizer *tok = NULL;
    t0 = now();
    rc = ft_model_tokenizer(m, &tok);
    t1 = now();
    if (rc) fail_msg("%s", ft_errmsg());
    printf("  tokenizer from GGUF metadata in %.3f s\n", t1 - t0);
    assert_int_equal(ft_tok_vocab_size(tok), 49152);
    assert_int_equal(ft_tok_bos(tok), 1);
    assert_int_equal(ft_tok_eos(tok), 2);
    assert_int_equal(ft_tok_id(tok, "<|im_end|>"), 2);
    assert_non_null(ft_tok_chat_template(tok));
    assert_non_null(strstr(ft_tok_chat_template(tok), "<|im_start|>"));
    ft_tok_free(tok);
    ft_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalar_conversions),
        cmocka_unit_test(test_dequant_vs_gguf_py),
        cmocka_unit_test(test_kquant_vs_gguf_py),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_tiny_model_equals_safetensors),
        cmocka_unit_test(test_rope_freqs_llama3),
        cmocka_unit_test(test_qwen2_gguf),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_nonfinite_weights),
        cmocka_unit_test(test_example_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
