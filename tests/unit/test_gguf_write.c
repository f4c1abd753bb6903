/* test_gguf_write.c - the streaming GGUF writer (src/formats/gguf_write.h) read back through
 * our reader (src/formats/gguf.h): metadata of every value type (arrays of every element type
 * and of strings included), the default and a custom alignment with exact padded offsets,
 * tensor data of F32/F16/BF16/Q8_0 written whole or in pieces, copying entries between
 * files, and the error paths (duplicates, bad names/shapes, wrong amounts of data), none of
 * which may leave a file under the final name. (gguf-py reads the writer's files in
 * tests/ref/test_export.py and test_merge.py.) */
#include "tests/unit/harness.h"

#include <sys/stat.h>

#include "src/core/err.h"
#include "src/formats/gguf.h"
#include "src/formats/gguf_write.h"
#include "src/numeric/quant.h"

/* Tolerances (STYLE C10). */
#define FT_TOL_EXACT 0.0                 /* F32 round trip, metadata values */
#define FT_TOL_F16_REL (1.0 / 2048)      /* 11-bit significand: half an ulp */
#define FT_TOL_BF16_REL (1.0 / 256)      /* 8-bit significand: half an ulp */
#define FT_TOL_Q8_0_AMAX (1.0 / 127)     /* per block, relative to max|x|: d/2 + fp16 of d */

static char *g_dir;

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_dir, name);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static int no_tmp_left(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q '\\.tmp\\.'", g_dir);
    return system(cmd) != 0;
}

static void fill(float *x, int64_t n, unsigned seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 3.0f;
    }
}

static void test_metadata_every_type(void **state)
{
    (void)state;
    char p[512];
    path_in(p, sizeof p, "meta.gguf");
    ft_gguf_w *w;
    assert_int_equal(ft_gguf_w_open(&w, p, 0), 0);
    assert_int_equal(ft_gguf_w_kv_u8(w, "t.u8", 200), 0);
    assert_int_equal(ft_gguf_w_kv_i8(w, "t.i8", -100), 0);
    assert_int_equal(ft_gguf_w_kv_u16(w, "t.u16", 60000), 0);
    assert_int_equal(ft_gguf_w_kv_i16(w, "t.i16", -30000), 0);
    assert_int_equal(ft_gguf_w_kv_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(ft_gguf_w_kv_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(ft_gguf_w_kv_u64(w, "t.u64", 18000000000000000000ull), 0);
    assert_int_equal(ft_gguf_w_kv_i64(w, "t.i64", -9000000000000000000ll), 0);
    assert_int_equal(ft_gguf_w_kv_f32(w, "t.f32", 0.1f), 0);
    assert_int_equal(ft_gguf_w_kv_f64(w, "t.f64", 0.1), 0);
    assert_int_equal(ft_gguf_w_kv_bool(w, "t.bool", 7), 0);
    assert_int_equal(ft_gguf_w_kv_str(w, "t.str", "h\xC3\xA9llo"), 0);
    assert_int_equal(ft_gguf_w_kv_strn(w, "t.strn", "a\0b", 3), 0);
    assert_int_equal(ft_gguf_w_kv_str(w, "t.empty", ""), 0);
    const uint8_t au8[] = {1, 2, 255};
    const int8_t ai8[] = {-1, 2};
    const uint16_t au16[] = {65535};
    const int16_t ai16[] = {-32768, 5};
    const uint32_t au32[] = {1, 4294967295u};
    const int32_t ai32[] = {-7, 0, 7, 2147483647};
    const float af32[] = {1.5f, -0.25f, 1e-30f};
    const uint8_t abool[] = {1, 0, 1};
    const uint64_t au64[] = {123456789012345ull};
    const int64_t ai64[] = {-5, 5};
    const double af64[] = {3.141592653589793, -2e300};
    const char *astr[] = {"", "a", "\xE2\x96\x81the", "<0x0A>"};
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.u8", FT_GGUF_U8, au8, 3), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.i8", FT_GGUF_I8, ai8, 2), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.u16", FT_GGUF_U16, au16, 1), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.i16", FT_GGUF_I16, ai16, 2), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.u32", FT_GGUF_U32, au32, 2), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.i32", FT_GGUF_I32, ai32, 4), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.f32", FT_GGUF_F32, af32, 3), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.bool", FT_GGUF_BOOL, abool, 3), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.u64", FT_GGUF_U64, au64, 1), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.i64", FT_GGUF_I64, ai64, 2), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.f64", FT_GGUF_F64, af64, 2), 0);
    assert_int_equal(ft_gguf_w_kv_arr(w, "a.empty", FT_GGUF_I32, NULL, 0), 0);
    assert_int_equal(ft_gguf_w_kv_arr_str(w, "a.str", astr, 4), 0);
    assert_int_equal(ft_gguf_w_close(w), 0);
    assert_true(no_tmp_left());

    ft_gguf *g;
    assert_int_equal(ft_gguf_open(&g, p), 0);
    assert_int_equal(ft_gguf_version(g), 3);
    assert_int_equal(ft_gguf_alignment(g), 32);
    assert_int_equal(ft_gguf_n_tensors(g), 0);
    assert_int_equal(ft_gguf_n_kv(g), 27);
    const struct { const char *k; int type; int64_t i; } ints[] = {
        {"t.u8", FT_GGUF_U8, 200}, {"t.i8", FT_GGUF_I8, -100}, {"t.u16", FT_GGUF_U16, 60000},
        {"t.i16", FT_GGUF_I16, -30000}, {"t.u32", FT_GGUF_U32, 4000000000ll},
        {"t.i32", FT_GGUF_I32, -2000000000}, {"t.i64", FT_GGUF_I64, -9000000000000000000ll},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        const ft_gguf_kv *kv = ft_gguf_find_kv(g, ints[k].k);
        assert_non_null(kv);
        assert_int_equal(kv->type, ints[k].type);
        assert_true(kv->i == ints[k].i);
    }
    const ft_gguf_kv *kv = ft_gguf_find_kv(g, "t.u64");
    assert_int_equal(kv->type, FT_GGUF_U64);
    assert_true(kv->u == 18000000000000000000ull);
    kv = ft_gguf_find_kv(g, "t.f32");
    assert_int_equal(kv->type, FT_GGUF_F32);
    assert_true((float)kv->f == 0.1f);
    kv = ft_gguf_find_kv(g, "t.f64");
    assert_int_equal(kv->type, FT_GGUF_F64);
    assert_true(kv->f == 0.1);
    kv = ft_gguf_find_kv(g, "t.bool");
    assert_int_equal(kv->type, FT_GGUF_BOOL);
    assert_int_equal(kv->i, 1);
    kv = ft_gguf_find_kv(g, "t.str");
    assert_int_equal(kv->type, FT_GGUF_STRING);
    assert_string_equal(kv->str, "h\xC3\xA9llo");
    kv = ft_gguf_find_kv(g, "t.strn");
    assert_int_equal(kv->str_len, 3);
    assert_memory_equal(kv->str, "a\0b", 3);
    kv = ft_gguf_find_kv(g, "t.empty");
    assert_int_equal(kv->str_len, 0);

    int32_t i32[4];
    float f32[3];
    kv = ft_gguf_find_kv(g, "a.i32");
    assert_int_equal(kv->arr_type, FT_GGUF_I32);
    assert_int_equal(kv->arr_n, 4);
    assert_int_equal(ft_gguf_arr_i32(kv, i32), 0);
    assert_memory_equal(i32, ai32, sizeof ai32);
    kv = ft_gguf_find_kv(g, "a.f32");
    assert_int_equal(ft_gguf_arr_f32(kv, f32), 0);
    assert_memory_equal(f32, af32, sizeof af32);
    const struct { const char *k; int type; const void *data; size_t bytes; int64_t n; } arrs[] = {
        {"a.u8", FT_GGUF_U8, au8, sizeof au8, 3}, {"a.i8", FT_GGUF_I8, ai8, sizeof ai8, 2},
        {"a.u16", FT_GGUF_U16, au16, sizeof au16, 1}, {"a.i16", FT_GGUF_I16, ai16, sizeof ai16, 2},
        {"a.u32", FT_GGUF_U32, au32, sizeof au32, 2}, {"a.bool", FT_GGUF_BOOL, abool, sizeof abool, 3},
        {"a.u64", FT_GGUF_U64, au64, sizeof au64, 1}, {"a.i64", FT_GGUF_I64, ai64, sizeof ai64, 2},
        {"a.f64", FT_GGUF_F64, af64, sizeof af64, 2}, {"a.empty", FT_GGUF_I32, NULL, 0, 0},
    };
    for (size_t k = 0; k < sizeof arrs / sizeof arrs[0]; k++) {
        kv = ft_gguf_find_kv(g, arrs[k].k);
        assert_non_null(kv);
        assert_int_equal(kv->type, FT_GGUF_ARRAY);
        assert_int_equal(kv->arr_type, arrs[k].type);
        assert_int_equal(kv->arr_n, arrs[k].n);
        if (arrs[k].bytes) assert_memory_equal(kv->arr_data, arrs[k].data, arrs[k].bytes);
    }
    kv = ft_gguf_find_kv(g, "a.str");
    assert_int_equal(kv->arr_type, FT_GGUF_STRING);
    assert_int_equal(kv->arr_n, 4);
    for (int k = 0; k < 4; k++) assert_string_equal(kv->arr_str[k], astr[k]);

    /* copy every entry into a second file: same values, same types */
    char q[512];
    path_in(q, sizeof q, "copy.gguf");
    assert_int_equal(ft_gguf_w_open(&w, q, 0), 0);
    for (int64_t i = 0; i < ft_gguf_n_kv(g); i++)
        assert_int_equal(ft_gguf_w_kv_copy(w, ft_gguf_kv_at(g, i)), 0);
    assert_int_equal(ft_gguf_w_close(w), 0);
    /* the two files are byte-identical: same entries in the same order */
    FILE *a = fopen(p, "rb"), *b = fopen(q, "rb");
    int ca, cb;
    long n = 0;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        n++;
    } while (ca == cb && ca != EOF);
    fclose(a);
    fclose(b);
    if (ca != cb) fail_msg("copied file differs from the original at byte %ld", n - 1);
    ft_gguf_close(g);
}

/* Writes F32, F16, BF16 and Q8_0 tensors (some in pieces, one empty, odd sizes to force
 * padding) with the given alignment and checks offsets, padding and values. */
static void check_tensors(uint32_t align)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tensors-%u.gguf", g_dir, align);
    enum { ROWS = 5, COLS = 96 };
    static float x[ROWS * COLS], y[ROWS * COLS];
    fill(x, ROWS * COLS, align);
    const int types[] = {FT_GGML_F32, FT_GGML_F16, FT_GGML_BF16, FT_GGML_Q8_0};
    ft_gguf_w *w;
    assert_int_equal(ft_gguf_w_open(&w, p, align == 32 ? 0 : align), 0);
    assert_int_equal(ft_gguf_w_kv_str(w, "general.architecture", "llama"), 0);
    int64_t ne[2] = {COLS, ROWS}, ne1[1] = {3}, ne0[1] = {0};
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", ft_quant_name(types[k]));
        assert_int_equal(ft_gguf_w_tensor(w, name, types[k], 2, ne), 2 * k);
        snprintf(name, sizeof name, "odd.%d", k);
        assert_int_equal(ft_gguf_w_tensor(w, name, FT_GGML_F32, 1, k == 2 ? ne0 : ne1), 2 * k + 1);
    }
    assert_int_equal(ft_gguf_w_begin_data(w), 0);
    const float odd[3] = {1, 2, 3};
    for (int k = 0; k < 4; k++) {
        if (k % 2) {
            assert_int_equal(ft_gguf_w_data_f32(w, x, ROWS * COLS), 0);
        } else {
            /* row by row: pieces of whole blocks */
            for (int r = 0; r < ROWS; r++) assert_int_equal(ft_gguf_w_data_f32(w, x + r * COLS, COLS), 0);
        }
        if (k != 2) assert_int_equal(ft_gguf_w_data(w, odd, sizeof odd), 0);
    }
    int64_t bytes = ft_gguf_w_bytes(w);
    assert_int_equal(ft_gguf_w_close(w), 0);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal((int64_t)st.st_size, bytes);

    ft_gguf *g;
    if (ft_gguf_open(&g, p)) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_gguf_alignment(g), align);
    assert_int_equal(ft_gguf_data_offset(g) % align, 0);
    assert_int_equal(ft_gguf_n_tensors(g), 8);
    const ft_gguf_kv *al = ft_gguf_find_kv(g, "general.alignment");
    if (align == 32) assert_null(al);
    else assert_true(al && al->type == FT_GGUF_U32 && al->u == align);
    for (int64_t i = 0; i < 8; i++)
        assert_int_equal(ft_gguf_tensor_at(g, i)->offset % align, 0);
    double worst[4] = {0};
    for (int k = 0; k < 4; k++) {
        const ft_gguf_tensor *t = ft_gguf_tensor_at(g, 2 * k);
        assert_int_equal(t->type, types[k]);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->ne[0], COLS);
        assert_int_equal(t->ne[1], ROWS);
        assert_int_equal(ft_gguf_tensor_f32(g, t, y), 0);
        for (int b = 0; b < ROWS * COLS / 32; b++) {
            double amax = 0;
            for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[b * 32 + j]));
            for (int j = 0; j < 32; j++) {
                int i = b * 32 + j;
                double e = fabs((double)y[i] - x[i]), tol;
                switch (types[k]) {
                case FT_GGML_F32: tol = FT_TOL_EXACT; break;
                case FT_GGML_F16: tol = FT_TOL_F16_REL * fabs(x[i]); break;
                case FT_GGML_BF16: tol = FT_TOL_BF16_REL * fabs(x[i]); break;
                default: tol = FT_TOL_Q8_0_AMAX * amax; break;
                }
                worst[k] = fmax(worst[k], e / (tol > 0 ? tol : 1));
                if (e > tol)
                    fail_msg("%s element %d: %.9g written, %.9g read (tolerance %.3g)",
                             ft_quant_name(types[k]), i, x[i], y[i], tol);
            }
        }
        const ft_gguf_tensor *o = ft_gguf_tensor_at(g, 2 * k + 1);
        if (k == 2) {
            assert_int_equal(o->nbytes, 0);
        } else {
            assert_int_equal(o->nbytes, 12);
            assert_memory_equal(o->data, odd, 12);
        }
    }
    printf("  alignment %u: max error / tolerance F32 %.3g F16 %.3g BF16 %.3g Q8_0 %.3g\n", align,
           worst[0], worst[1], worst[2], worst[3]);
    /* the padding between tensors is zero */
    const uint8_t *base = (const uint8_t *)ft_gguf_tensor_at(g, 0)->data;
    for (int64_t i = 0; i + 1 < 8; i++) {
        const ft_gguf_tensor *t = ft_gguf_tensor_at(g, i), *u = ft_gguf_tensor_at(g, i + 1);
        for (uint64_t b = t->offset + t->nbytes; b < u->offset; b++) assert_int_equal(base[b], 0);
    }
    ft_gguf_close(g);
}

static void test_tensors_default_alignment(void **state) { (void)state; check_tensors(32); }
static void test_tensors_custom_alignment(void **state) { (void)state; check_tensors(64); check_tensors(1); }

/* Q8_0 bytes on hand-made blocks: d = amax/127 as fp16, q = roundf(x/d) (half away). */
static void test_q8_0_bytes(void **state)
{
    (void)state;
    float x[64];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) * 0.5f;  /* amax 8 at j = 0 */
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;               /* all-zero block: d = 0 */
    uint8_t q[68];
    assert_int_equal(ft_gguf_from_f32(FT_GGML_Q8_0, x, q, 64), 0);
    uint16_t d;
    memcpy(&d, q, 2);
    assert_int_equal(d, ft_quant_f32_to_f16(8.0f / 127.0f));
    assert_int_equal((int8_t)q[2 + 0], -127);
    for (int j = 0; j < 32; j++) {
        float id = 1.0f / (8.0f / 127.0f);
        int want = (int)roundf(x[j] * id);
        assert_int_equal((int8_t)q[2 + j], want);
    }
    memcpy(&d, q + 34, 2);
    assert_int_equal(d, 0);
    for (int j = 0; j < 32; j++) assert_int_equal(q[36 + j], 0);
    /* half-way cases round away from zero, as roundf (not to even as rint) */
    float h[32] = {0};
    h[0] = 127.0f;   /* d = 1 exactly */
    h[1] = 2.5f;
    h[2] = -2.5f;
    h[3] = 0.5f;
    assert_int_equal(ft_gguf_from_f32(FT_GGML_Q8_0, h, q, 32), 0);
    assert_int_equal((int8_t)q[3], 3);
    assert_int_equal((int8_t)q[4], -3);
    assert_int_equal((int8_t)q[5], 1);
    assert_int_equal(ft_gguf_from_f32(FT_GGML_Q8_0, h, q, 31), FT_E_INVALID);
    assert_int_equal(ft_gguf_from_f32(FT_GGML_Q4_0, h, q, 32), FT_E_UNSUPPORTED);
}

static void expect_fail(int rc, const char *needle)
{
    if (rc >= 0) fail_msg("expected an error containing \"%s\", got %d", needle, rc);
    if (!strstr(ft_errmsg(), needle)) fail_msg("message \"%s\" lacks \"%s\"", ft_errmsg(), needle);
    printf("  ok: %s\n", ft_errmsg());
}

static void test_errors_leave_no_file(void **state)
{
    (void)state;
    char p[512];
    path_in(p, sizeof p, "bad.gguf");
    ft_gguf_w *w;
    int64_t ne[2] = {32, 2};
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = 0;

    assert_int_equal(ft_gguf_w_open(&w, p, 48), FT_E_INVALID);
    struct { const char *what; } cases[] = {{"duplicate key"}, {"alignment key"}, {"duplicate tensor"},
        {"long name"}, {"block size"}, {"too many bytes"}, {"incomplete"}, {"dims"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(ft_gguf_w_open(&w, p, 0), 0);
        int rc = 0;
        switch (c) {
        case 0:
            ft_gguf_w_kv_u32(w, "k", 1);
            expect_fail(ft_gguf_w_kv_str(w, "k", "x"), "duplicate metadata key \"k\"");
            break;
        case 1:
            expect_fail(ft_gguf_w_kv_u32(w, "general.alignment", 64), "general.alignment");
            break;
        case 2:
            ft_gguf_w_tensor(w, "a", FT_GGML_F32, 2, ne);
            expect_fail((int)ft_gguf_w_tensor(w, "a", FT_GGML_F16, 2, ne), "duplicate tensor name \"a\"");
            break;
        case 3:
            expect_fail((int)ft_gguf_w_tensor(w, longname, FT_GGML_F32, 2, ne), "has 64 bytes");
            break;
        case 4: {
            int64_t bad[2] = {33, 2};
            expect_fail((int)ft_gguf_w_tensor(w, "q", FT_GGML_Q8_0, 2, bad), "block size");
            break;
        }
        case 5: {
            float z[128] = {0};
            ft_gguf_w_tensor(w, "a", FT_GGML_F32, 2, ne);
            ft_gguf_w_begin_data(w);
            expect_fail(ft_gguf_w_data(w, z, sizeof z / 2 + 4), "left of its 256");
            break;
        }
        case 6: {
            float z[32] = {0};
            ft_gguf_w_tensor(w, "a", FT_GGML_F32, 2, ne);
            ft_gguf_w_begin_data(w);
            ft_gguf_w_data_f32(w, z, 32);
            expect_fail(ft_gguf_w_close(w), "incomplete (128 of 256 bytes");
            w = NULL;
            break;
        }
        case 7:
            expect_fail((int)ft_gguf_w_tensor(w, "a", FT_GGML_F32, 5, ne), "5 dims");
            break;
        }
        /* a poisoned writer keeps failing, and closing it leaves nothing behind */
        if (w) {
            rc = ft_gguf_w_close(w);
            assert_true(rc < 0);
        }
        assert_false(exists(p));
        assert_true(no_tmp_left());
    }
    /* abort after some data: nothing left either */
    assert_int_equal(ft_gguf_w_open(&w, p, 0), 0);
    ft_gguf_w_tensor(w, "a", FT_GGML_F32, 2, ne);
    ft_gguf_w_begin_data(w);
    ft_gguf_w_abort(w);
    assert_false(exists(p));
    assert_true(no_tmp_left());
    /* an unwritable place */
    expect_fail(ft_gguf_w_open(&w, "/nonexistent-dir/x.gguf", 0), "/nonexistent-dir/x.gguf");
}

static int setup(void **state)
{
    (void)state;
    g_dir = t_tmpdir();
    return g_dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) return -1;
    free(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata_every_type),
        cmocka_unit_test(test_tensors_default_alignment),
        cmocka_unit_test(test_tensors_custom_alignment),
        cmocka_unit_test(test_q8_0_bytes),
        cmocka_unit_test(test_errors_leave_no_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
