/* test_safetensors.c - safetensors reader/writer (formats.md 1.1, 1.2) and HF folder
 * loading through ft_model_load (formats.md 2.3), on tests/fixtures/tiny-llama and on
 * crafted bad files. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/model/model.h"
#include "src/numeric/quant.h"
#include "src/formats/safetensors.h"
#include "tests/unit/format_fixture.h"

#define TINY "tests/fixtures/tiny-llama"

/* Writes [u64 hlen][header][data] (hlen = strlen(header) unless hlen >= 0) to a temp file. */
static char *mkst(const char *header, const void *data, size_t dlen, long long hlen)
{
    size_t hn = strlen(header);
    size_t n = 8 + hn + dlen;
    uint8_t *buf = malloc(n);
    uint64_t h = hlen >= 0 ? (uint64_t)hlen : hn;
    memcpy(buf, &h, 8);
    memcpy(buf + 8, header, hn);
    if (dlen) memcpy(buf + 8 + hn, data, dlen);
    char *p = t_write_tmp("x.safetensors", buf, n);
    free(buf);
    return p;
}

static int open_st(const char *header, const void *data, size_t dlen, long long hlen, char **path)
{
    *path = mkst(header, data, dlen, hlen);
    ft_st_file *f = NULL;
    ft_err_clear();
    int rc = ft_st_open(&f, *path);
    ft_st_close(f);
    return rc;
}

/* Opens a crafted file; asserts the code and that the message names the file + fragments. */
#define EXPECT_ST(hdr, data, dlen, hlen, want, ...)                                   \
    do {                                                                              \
        char *p_;                                                                     \
        int rc_ = open_st(hdr, data, dlen, hlen, &p_);                                \
        expect_err(rc_, want, p_, __VA_ARGS__);                                       \
        rm_tmp(p_);                                                                   \
    } while (0)

static void test_roundtrip(void **state)
{
    float f32[6] = {1.5f, -2.25f, 0.0f, 1e-8f, 3.0e38f, -0.0f};
    uint16_t f16[4] = {ft_quant_f32_to_f16(1.0f), ft_quant_f32_to_f16(-2.5f),
                       ft_quant_f32_to_f16(65504.0f), ft_quant_f32_to_f16(5.960464477539063e-08f)};
    uint16_t bf[3] = {ft_quant_f32_to_bf16(1.0f), ft_quant_f32_to_bf16(-3.140625f),
                      ft_quant_f32_to_bf16(1e30f)};
    uint8_t u8[5] = {1, 2, 3, 4, 5};
    int64_t i64 = -123456789012345LL;
    ft_st_out ts[] = {
        {"b.f32", FT_ST_F32, 2, {2, 3}, f32},
        {"a.f16", FT_ST_F16, 1, {4}, f16},
        {"bf \"quoted\"\\name", FT_ST_BF16, 3, {1, 3, 1}, bf},
        {"u8", FT_ST_U8, 1, {5}, u8},
        {"scalar", FT_ST_I64, 0, {0}, &i64},
        {"empty", FT_ST_F32, 2, {0, 3}, NULL},
    };
    const char *mk[] = {"format", "note"}, *mv[] = {"pt", "tab\there \"q\" \\ \xe4\xb8\xad"};
    char *dir = t_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);
    int rc = ft_st_write(path, ts, 6, mk, mv, 2);
    if (rc) fail_msg("%s", ft_errmsg());
    ft_st_file *f;
    rc = ft_st_open(&f, path);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_st_count(f), 6);
    assert_string_equal(ft_st_meta(f, "format"), "pt");
    assert_string_equal(ft_st_meta(f, "note"), mv[1]);
    assert_null(ft_st_meta(f, "absent"));
    assert_string_equal(ft_st_path(f), path);
    for (int i = 0; i < 6; i++) {
        const ft_st_tensor *t = ft_st_find(f, ts[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, ts[i].dtype);
        assert_int_equal(t->n_dims, ts[i].n_dims);
        size_t nb = ft_st_dtype_size(ts[i].dtype);
        for (int d = 0; d < t->n_dims; d++) {
            assert_int_equal(t->shape[d], ts[i].shape[d]);
            nb *= (size_t)ts[i].shape[d];
        }
        assert_int_equal(t->nbytes, nb);
        if (nb) assert_memory_equal(t->data, ts[i].data, nb);
        assert_non_null(ft_st_at(f, i));
    }
    /* tensors come back in offset (= write) order; data starts 8-byte aligned */
    assert_string_equal(ft_st_at(f, 0)->name, "b.f32");
    assert_int_equal(ft_st_at(f, 0)->file_offset % 8, 0);
    assert_null(ft_st_find(f, "nope"));
    /* conversions */
    float out[6];
    assert_int_equal(ft_st_to_f32(ft_st_find(f, "a.f16"), out, 4), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.5f && out[2] == 65504.0f &&
                out[3] == 5.960464477539063e-08f);
    assert_int_equal(ft_st_to_f32(ft_st_find(f, ts[2].name), out, 3), 0);
    assert_true(out[0] == 1.0f && out[1] == -3.140625f);
    assert_true(fabsf(out[2] - 1e30f) <= 1e30f / 256);
    assert_int_equal(ft_st_to_f32(ft_st_find(f, "b.f32"), out, 6), 0);
    assert_memory_equal(out, f32, sizeof f32);
    ft_err_clear();
    expect_err(ft_st_to_f32(ft_st_find(f, "u8"), out, 5), FT_E_UNSUPPORTED, "\"u8\"", "U8", NULL);
    expect_err(ft_st_to_f32(ft_st_find(f, "a.f16"), out, 5), FT_E_RANGE, "a.f16", NULL);
    ft_st_close(f);

    /* a NaN or infinity is refused, naming the tensor, the element and its file offset */
    float nanf32[5] = {1.0f, 2.0f, NAN, INFINITY, 0.0f};
    uint16_t inf16[3] = {ft_quant_f32_to_f16(1.0f), 0x7c00 /* +inf */, 0};
    uint16_t nanbf[4] = {0, 0, 0, 0xffc1 /* NaN */};
    ft_st_out bad[] = {
        {"w.nan", FT_ST_F32, 1, {5}, nanf32},
        {"w.inf16", FT_ST_F16, 1, {3}, inf16},
        {"w.nanbf", FT_ST_BF16, 2, {2, 2}, nanbf},
    };
    char bpath[560];
    snprintf(bpath, sizeof bpath, "%s/bad.safetensors", dir);
    assert_int_equal(ft_st_write(bpath, bad, 3, NULL, NULL, 0), 0);
    assert_int_equal(ft_st_open(&f, bpath), 0);
    const ft_st_tensor *tn = ft_st_find(f, "w.nan"), *ti = ft_st_find(f, "w.inf16"),
                       *tb = ft_st_find(f, "w.nanbf");
    char off[64];
    snprintf(off, sizeof off, "offset %lld:", (long long)(tn->file_offset + 8));
    expect_err(ft_st_to_f32(tn, out, 5), FT_E_CORRUPT, off, "\"w.nan\"", "element 2 is NaN", NULL);
    assert_int_equal(ft_st_to_f32(tn, out, 2), 0); /* the finite prefix converts */
    snprintf(off, sizeof off, "offset %lld:", (long long)(ti->file_offset + 2));
    expect_err(ft_st_to_f32(ti, out, 3), FT_E_CORRUPT, off, "element 1 is infinite", NULL);
    expect_err(ft_st_to_f32(tb, out, 4), FT_E_CORRUPT, "\"w.nanbf\"", "element 3 is NaN", NULL);
    ft_st_close(f);
    unlink(bpath);

    /* header layout: compact, __metadata__ first, padded with spaces to 8 */
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    uint64_t hl;
    memcpy(&hl, txt, 8);
    assert_int_equal(hl % 8, 0);
    assert_true(!strncmp(txt + 8, "{\"__metadata__\":{\"format\":\"pt\",", 30));
    assert_true(strstr(txt + 8, "\"b.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}") != NULL);
    free(txt);
    /* nothing else left in the directory (no temporaries) */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
    t_rmtree(dir);
}

static void test_write_failures(void **state)
{
    char *dir = t_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    static float big[64 * 1024];
    for (int i = 0; i < 64 * 1024; i++) big[i] = (float)i;
    ft_st_out t = {"big", FT_ST_F32, 1, {64 * 1024}, big};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    /* a good file first */
    assert_int_equal(ft_st_write(path, &t, 1, mk, mv, 1), 0);
    struct stat st0;
    assert_int_equal(stat(path, &st0), 0);

    /* invalid input: nothing written, old file intact */
    ft_st_out bad = {"x", FT_ST_OTHER, 1, {4}, big};
    expect_err(ft_st_write(path, &bad, 1, mk, mv, 1), FT_E_INVALID, path, "\"x\"", NULL);
    ft_st_out dup[2] = {t, t};
    expect_err(ft_st_write(path, dup, 2, mk, mv, 1), FT_E_INVALID, "duplicate", NULL);
    ft_st_out neg = {"n", FT_ST_F32, 1, {-1}, big};
    expect_err(ft_st_write(path, &neg, 1, mk, mv, 1), FT_E_INVALID, "shape[0]", NULL);

    /* I/O failure injected with RLIMIT_FSIZE: write() fails with EFBIG part-way */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 100000; /* the file needs 262144 + header bytes */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    t.shape[0] = 64 * 1024;
    big[0] = -1; /* different content than the file on disk */
    int rc = ft_st_write(path, &t, 1, mk, mv, 1);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    expect_err(rc, -EFBIG, path, "write failed at offset", NULL);
    struct stat st1;
    assert_int_equal(stat(path, &st1), 0);
    assert_int_equal(st1.st_size, st0.st_size);
    ft_st_file *f;
    assert_int_equal(ft_st_open(&f, path), 0);
    assert_true(((const float *)ft_st_find(f, "big")->data)[0] == 0.0f); /* old content */
    ft_st_close(f);
    /* and no temporary left behind; a failed write to a fresh name leaves no file at all */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
    char p2[600];
    snprintf(p2, sizeof p2, "%s/fresh.safetensors", dir);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    signal(SIGXFSZ, SIG_IGN);
    rc = ft_st_write(p2, &t, 1, mk, mv, 1);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, -EFBIG);
    assert_int_equal(access(p2, F_OK), -1);
    assert_int_equal(system(cmd), 0);
    /* a directory that does not exist */
    snprintf(p2, sizeof p2, "%s/no/such/dir/x.safetensors", dir);
    expect_err(ft_st_write(p2, &t, 1, mk, mv, 1), -ENOENT, "no/such/dir", NULL);
    t_rmtree(dir);
}

static void test_bad_files(void **state)
{
    char *p;
    float d4[4] = {1, 2, 3, 4};
    /* shorter than 8 bytes */
    for (int n = 0; n < 8; n++) {
        p = t_write_tmp("short.safetensors", "\x10\0\0\0\0\0\0", (size_t)n);
        ft_st_file *f = NULL;
        expect_err(ft_st_open(&f, p), FT_E_CORRUPT, p, "shorter than the 8-byte header", NULL);
        rm_tmp(p);
    }
    /* header length beyond the file */
    EXPECT_ST("{}", NULL, 0, 1000, FT_E_CORRUPT, "header length 1000 exceeds file size 10", NULL);
    EXPECT_ST("{}", NULL, 0, 200000000, FT_E_CORRUPT, "exceeds the limit", NULL);
    /* truncated data: header promises 16 bytes, file holds 8 */
    const char *h1 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    EXPECT_ST(h1, d4, 8, -1, FT_E_CORRUPT, "\"w\"", "data_offsets [0, 16]",
               "truncated", NULL);
    /* the same, valid */
    assert_int_equal(open_st(h1, d4, 16, -1, &p), 0);
    rm_tmp(p);
    /* leading whitespace and space padding are fine */
    assert_int_equal(open_st("  {\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}   ",
                             d4, 16, -1, &p), 0);
    rm_tmp(p);
    /* trailing bytes after the last tensor */
    float d5[5] = {0};
    EXPECT_ST(h1, d5, 20, -1, FT_E_CORRUPT, "4 bytes after the last tensor", NULL);
    /* size mismatch */
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", d4, 12, -1, FT_E_CORRUPT, "\"w\"", "[0, 12]", "need 16", NULL);
    /* gap, overlap, first not at 0 */
    EXPECT_ST("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d4, 16, -1, FT_E_CORRUPT, "not contiguous", "\"a\" ends at data offset 4", "\"b\"", NULL);
    EXPECT_ST("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", d4, 12, -1, FT_E_CORRUPT, "not contiguous", NULL);
    EXPECT_ST("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d4, 16, -1, FT_E_CORRUPT, "\"a\" starts at data offset 8", NULL);
    /* bad dtype, shape, offsets */
    EXPECT_ST("{\"w\":{\"dtype\":\"F17\",\"shape\":[4],\"data_offsets\":[0,16]}}", d4, 16, -1, FT_E_INVALID, "\"w\"", "unknown dtype \"F17\"", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", d4, 16, -1, FT_E_INVALID, "\"w\"", "shape[0]", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,16]}}", d4, 16, -1, FT_E_INVALID, "shape[0]", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,4],\"data_offsets\":[0,16]}}",
                       d4, 16, -1, FT_E_UNSUPPORTED, "9 dims", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", d4, 16, -1, FT_E_INVALID, "data_offsets", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[4]}}", d4, 16, -1, FT_E_INVALID, "data_offsets", NULL);
    EXPECT_ST("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", d4, 2, -1, FT_E_INVALID, "whole number of bytes", NULL);
    /* duplicate names */
    EXPECT_ST("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d4, 16, -1, FT_E_INVALID, "duplicate tensor name \"w\"", NULL);
    /* metadata values must be strings */
    EXPECT_ST("{\"__metadata__\":{\"format\":\"pt\",\"n\":3},"
                       "\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d4, 16, -1, FT_E_INVALID, "key \"n\"", "not a string", NULL);
    EXPECT_ST("{\"__metadata__\":[1]}", NULL, 0, -1, FT_E_INVALID, "__metadata__", NULL);
    /* not JSON / not an object / garbage padding */
    EXPECT_ST("[1,2]", NULL, 0, -1, FT_E_INVALID, "offset 8", NULL);
    EXPECT_ST("{\"w\": oops}", NULL, 0, -1, FT_E_INVALID, "does not parse", NULL);
    EXPECT_ST("{}xx", NULL, 0, -1, FT_E_INVALID, "offset 10", NULL);
    /* an empty header with no data is a valid (empty) file */
    assert_int_equal(open_st("{}      ", NULL, 0, -1, &p), 0);
    rm_tmp(p);
    /* missing file / directory */
    ft_st_file *f;
    expect_err(ft_st_open(&f, "/nonexistent/x.safetensors"), -ENOENT, "/nonexistent/x.safetensors", NULL);
    expect_err(ft_st_open(&f, "/tmp"), -EISDIR, "/tmp", NULL);
}

/* Every truncation of a valid two-tensor file fails cleanly. */
static void test_truncations(void **state)
{
    float d[6] = {1, 2, 3, 4, 5, 6};
    char *p = mkst("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                   "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                   d, 24, -1);
    char *all;
    size_t n;
    assert_int_equal(ft_read_file(p, &all, &n), 0);
    int fails = 0;
    for (size_t k = 0; k < n; k++) {
        char *q = t_write_tmp("t.safetensors", all, k);
        ft_st_file *f = NULL;
        ft_err_clear();
        int rc = ft_st_open(&f, q);
        if (rc == 0) fail_msg("truncated to %zu of %zu bytes but opened", k, n);
        if (!strstr(ft_errmsg(), q)) fail_msg("message \"%s\" lacks the path", ft_errmsg());
        fails++;
        rm_tmp(q);
    }
    printf("  %d truncations of a %zu-byte file all rejected\n", fails, n);
    free(all);
    rm_tmp(p);
}

/* Random mutations of header bytes (deterministic xorshift) of a small file and of the
 * tiny-llama checkpoint: an error naming the file, or a valid open whose tensors all lie
 * inside the mapping; never a crash. */
static uint64_t rng_state = 0x2545F4914F6CDD1DULL;
static uint64_t rnd(void) { return t_xorshift(&rng_state); }

static void mutate_run(const char *src, int iters)
{
    char *all;
    size_t n;
    assert_int_equal(ft_read_file(src, &all, &n), 0);
    uint64_t hl;
    memcpy(&hl, all, 8);
    size_t hdr = 8 + (size_t)hl;
    char *p = t_write_tmp("mut.safetensors", all, n);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    static const char special[] = "{}[]\",:0123456789-. e\\";
    int ok = 0, bad = 0;
    for (int it = 0; it < iters; it++) {
        size_t pos[3];
        int k = 1 + (int)(rnd() % 3);
        for (int j = 0; j < k; j++) {
            pos[j] = (size_t)(rnd() % hdr);
            uint8_t b = rnd() % 4 ? (uint8_t)special[rnd() % (sizeof special - 1)] : (uint8_t)rnd();
            assert_int_equal(pwrite(fd, &b, 1, (off_t)pos[j]), 1);
        }
        ft_st_file *f = NULL;
        ft_err_clear();
        int rc = ft_st_open(&f, p);
        if (rc) {
            bad++;
            if (!strstr(ft_errmsg(), p)) fail_msg("message \"%s\" lacks the path", ft_errmsg());
        } else {
            ok++;
            for (int64_t i = 0; i < ft_st_count(f); i++) {
                const ft_st_tensor *t = ft_st_at(f, i);
                assert_true(t->file_offset >= 8 && (size_t)t->file_offset + t->nbytes <= n);
            }
            ft_st_close(f);
        }
        for (int j = 0; j < k; j++) assert_int_equal(pwrite(fd, all + pos[j], 1, (off_t)pos[j]), 1);
    }
    close(fd);
    printf("  %d mutations of the %zu-byte header of %s: %d rejected, %d still valid\n", iters,
           hdr, src, bad, ok);
    rm_tmp(p);
    free(all);
}

static void test_mutations(void **state)
{
    float d[6] = {1, 2, 3, 4, 5, 6};
    char *p = mkst("{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                   "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[8,24]}}",
                   d, 24, -1);
    mutate_run(p, 3000);
    rm_tmp(p);
    mutate_run(TINY "/model.safetensors", 500);
}

/* ---- model folders --------------------------------------------------------------------- */

/* Copies tiny-llama into a temp folder with changes: tensors split over n_shards files
 * (with an index), optional F32 conversion, a dropped tensor, an extra tensor, and
 * config.json text replacements (from -> to). Returns the folder (caller frees). */
typedef struct {
    int n_shards, to_f32;
    const char *drop;
    const ft_st_out *extra; /* n_extra tensors (1 when n_extra is 0) */
    int n_extra;
    const char *cfg_from, *cfg_to;
} variant;

static char *make_variant(const variant *v)
{
    char *dir = t_tmpdir(), p[600];
    ft_st_file *src;
    if (ft_st_open(&src, TINY "/model.safetensors")) fail_msg("%s", ft_errmsg());
    int64_t n = ft_st_count(src);
    int n_extra = v->extra ? (v->n_extra ? v->n_extra : 1) : 0;
    ft_st_out *ts = calloc((size_t)(n + n_extra), sizeof *ts);
    float **bufs = calloc((size_t)(n + n_extra + 1), sizeof *bufs);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_st_at(src, i);
        if (v->drop && !strcmp(t->name, v->drop)) continue;
        ft_st_out *o = &ts[k];
        o->name = t->name;
        o->dtype = t->dtype;
        o->n_dims = t->n_dims;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = t->data;
        if (v->to_f32) {
            int64_t ne = (int64_t)(t->nbytes / ft_st_dtype_size(t->dtype));
            bufs[k] = malloc((size_t)ne * 4);
            assert_int_equal(ft_st_to_f32(t, bufs[k], ne), 0);
            o->dtype = FT_ST_F32;
            o->data = bufs[k];
        }
        k++;
    }
    for (int i = 0; i < n_extra; i++) ts[k++] = v->extra[i];
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    int ns = v->n_shards > 0 ? v->n_shards : 1;
    if (ns == 1) {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        if (ft_st_write(p, ts, k, mk, mv, 1)) fail_msg("%s", ft_errmsg());
    } else {
        char idx[65536];
        int w = snprintf(idx, sizeof idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
        int64_t per = (k + ns - 1) / ns;
        for (int s = 0; s < ns; s++) {
            int64_t a = s * per, b = a + per < k ? a + per : k;
            char fn[64];
            snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", s + 1, ns);
            snprintf(p, sizeof p, "%s/%s", dir, fn);
            if (ft_st_write(p, ts + a, b - a, mk, mv, 1)) fail_msg("%s", ft_errmsg());
            for (int64_t i = a; i < b; i++)
                w += snprintf(idx + w, sizeof idx - (size_t)w, "%s\"%s\": \"%s\"", i ? ", " : "",
                              ts[i].name, fn);
        }
        snprintf(idx + w, sizeof idx - (size_t)w, "}}");
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        assert_int_equal(ft_write_file_atomic(p, idx, strlen(idx)), 0);
    }
    char *cfg;
    size_t len;
    assert_int_equal(ft_read_file(TINY "/config.json", &cfg, &len), 0);
    char out[8192];
    if (v->cfg_from) {
        char *at = strstr(cfg, v->cfg_from);
        if (!at) fail_msg("config.json lacks \"%s\"", v->cfg_from);
        *at = 0;
        snprintf(out, sizeof out, "%s%s%s", cfg, v->cfg_to, at + strlen(v->cfg_from));
    } else {
        snprintf(out, sizeof out, "%s", cfg);
    }
    free(cfg);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(ft_write_file_atomic(p, out, strlen(out)), 0);
    for (int64_t i = 0; i < k; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    ft_st_close(src);
    return dir;
}

static void assert_same_model(const ft_model *a, const ft_model *b)
{
    const ft_model_config *c = &a->cfg;
    int64_t V = c->vocab_size, C = c->hidden_size;
    assert_memory_equal(a->embed, b->embed, (size_t)(V * C) * 4);
    assert_memory_equal(a->final_norm, b->final_norm, (size_t)C * 4);
    assert_memory_equal(a->lm_head, b->lm_head, (size_t)(V * C) * 4);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        assert_memory_equal(a->layers[l].attn_norm, b->layers[l].attn_norm, (size_t)C * 4);
        assert_memory_equal(a->layers[l].ffn_norm, b->layers[l].ffn_norm, (size_t)C * 4);
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_linear *x = &a->layers[l].proj[p], *y = &b->layers[l].proj[p];
            assert_int_equal(x->out_n, y->out_n);
            assert_int_equal(x->in_n, y->in_n);
            assert_memory_equal(x->w, y->w, (size_t)(x->out_n * x->in_n) * 4);
        }
    }
}

static void test_load_tiny(void **state)
{
    ft_model *m;
    int rc = ft_model_load(&m, TINY);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(m->is_gguf, 0);
    assert_int_equal(m->cfg.num_hidden_layers, 2);
    assert_ptr_equal(m->lm_head, m->embed);
    assert_int_equal(ft_model_n_params(m), 2122048); /* make_tiny_model.py prints it */
    /* every array equals the bf16 tensor converted independently */
    ft_st_file *f;
    assert_int_equal(ft_st_open(&f, TINY "/model.safetensors"), 0);
    const ft_st_tensor *t = ft_st_find(f, "model.layers.1.self_attn.k_proj.weight");
    assert_int_equal(t->dtype, FT_ST_BF16);
    const ft_linear *k = &m->layers[1].proj[FT_K];
    assert_int_equal(k->out_n, 32);
    assert_int_equal(k->in_n, 64);
    for (int64_t i = 0; i < 32 * 64; i++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float x;
        memcpy(&x, &u, 4);
        if (k->w[i] != x) fail_msg("k_proj[%lld] = %g, expected %g", (long long)i, k->w[i], x);
    }
    t = ft_st_find(f, "model.norm.weight");
    float ref[64];
    assert_int_equal(ft_st_to_f32(t, ref, 64), 0);
    assert_memory_equal(ref, m->final_norm, sizeof ref);
    ft_st_close(f);
    for (int p = 0; p < FT_N_PROJ; p++) assert_null(m->layers[0].proj[p].b);
    assert_string_equal(ft_proj_name[FT_DOWN], "down_proj");
    assert_string_equal(ft_proj_parent[FT_GATE], "mlp");
    assert_string_equal(ft_proj_parent[FT_O], "self_attn");

    /* the folder's tokenizer (tokenizer.json of Llama-2) */
    ft_tokenizer *tok = NULL;
    rc = ft_model_tokenizer(m, &tok);
    if (rc) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_tok_vocab_size(tok), 32000);
    ft_tok_free(tok);

    /* variants: 3 shards + index, F32 storage, an ignored rotary_emb.inv_freq */
    float invf[8] = {0};
    ft_st_out extra = {"model.layers.0.self_attn.rotary_emb.inv_freq", FT_ST_F32, 1, {8}, invf};
    variant vs[] = {{.n_shards = 3}, {.to_f32 = 1}, {.extra = &extra}};
    const char *what[] = {"sharded (3 files + index)", "F32", "with rotary_emb.inv_freq"};
    for (int i = 0; i < 3; i++) {
        char *dir = make_variant(&vs[i]);
        ft_model *m2;
        rc = ft_model_load(&m2, dir);
        if (rc) fail_msg("%s: %s", what[i], ft_errmsg());
        assert_same_model(m, m2);
        printf("  %s: identical to the single BF16 file\n", what[i]);
        ft_model_free(m2);
        t_rmtree(dir);
    }

    /* untied: lm_head.weight read separately */
    static float head[32000 * 64];
    for (int64_t i = 0; i < 32000 * 64; i++) head[i] = (float)(i % 97) * 0.01f;
    ft_st_out lm = {"lm_head.weight", FT_ST_F32, 2, {32000, 64}, head};
    variant un = {.extra = &lm, .cfg_from = "\"tie_word_embeddings\": true",
                  .cfg_to = "\"tie_word_embeddings\": false"};
    char *dir = make_variant(&un);
    ft_model *m3;
    rc = ft_model_load(&m3, dir);
    if (rc) fail_msg("untied: %s", ft_errmsg());
    assert_true(m3->lm_head != m3->embed);
    assert_memory_equal(m3->lm_head, head, sizeof head);
    assert_memory_equal(m3->embed, m->embed, 32000 * 64 * 4);
    assert_int_equal(ft_model_n_params(m3), 2122048 + 32000 * 64);
    ft_model_free(m3);
    t_rmtree(dir);
    ft_model_free(m);
}

/* qwen2: q/k/v biases read from the checkpoint (formats.md 2.3), o has none */
static void test_load_qwen2_folder(void **state)
{
    static float qb[64], kb[32], vb[32];
    for (int i = 0; i < 64; i++) qb[i] = (float)i * 0.25f;
    for (int i = 0; i < 32; i++) kb[i] = -(float)i, vb[i] = (float)i * 0.5f + 1;
    ft_st_out ex[6];
    const float *src[3] = {qb, kb, vb};
    const char *pn[3] = {"q_proj", "k_proj", "v_proj"};
    char names[6][64];
    for (int l = 0; l < 2; l++)
        for (int p = 0; p < 3; p++) {
            int i = l * 3 + p;
            snprintf(names[i], sizeof names[i], "model.layers.%d.self_attn.%s.bias", l, pn[p]);
            ex[i] = (ft_st_out){names[i], FT_ST_F32, 1, {p ? 32 : 64}, src[p]};
        }
    variant v = {.extra = ex, .n_extra = 6, .cfg_from = "\"model_type\": \"llama\"",
                 .cfg_to = "\"model_type\": \"qwen2\""};
    char *dir = make_variant(&v);
    ft_model *m, *base;
    if (ft_model_load(&m, dir)) fail_msg("%s", ft_errmsg());
    assert_int_equal(ft_model_load(&base, TINY), 0);
    assert_string_equal(m->cfg.model_type, "qwen2");
    assert_int_equal(m->cfg.attention_bias, 1);
    for (int l = 0; l < 2; l++) {
        for (int p = 0; p < 3; p++) {
            assert_non_null(m->layers[l].proj[p].b);
            assert_memory_equal(m->layers[l].proj[p].b, src[p], (size_t)(p ? 32 : 64) * 4);
        }
        assert_null(m->layers[l].proj[FT_O].b);
    }
    assert_int_equal(ft_model_n_params(m), ft_model_n_params(base) + 2 * (64 + 32 + 32));
    ft_model_free(m);
    ft_model_free(base);
    /* the same folder without the biases: the missing tensor is named */
    variant v2 = {.cfg_from = "\"model_type\": \"llama\"", .cfg_to = "\"model_type\": \"qwen2\""};
    t_rmtree(dir);
    dir = make_variant(&v2);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "\"model.layers.0.self_attn.q_proj.bias\"",
               "not found", NULL);
    t_rmtree(dir);
}

static void test_load_errors(void **state)
{
    ft_model *m = NULL;
    char *dir;
    /* a missing tensor */
    variant v1 = {.drop = "model.layers.1.mlp.up_proj.weight"};
    dir = make_variant(&v1);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, dir, "\"model.layers.1.mlp.up_proj.weight\"",
               "not found", NULL);
    t_rmtree(dir);
    /* shape mismatch: names tensor, file, found and expected shapes */
    variant v2 = {.cfg_from = "\"intermediate_size\": 128", .cfg_to = "\"intermediate_size\": 96"};
    dir = make_variant(&v2);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "model.safetensors",
               "\"model.layers.0.mlp.gate_proj.weight\"", "shape [128, 64]", "expected [96, 64]", NULL);
    t_rmtree(dir);
    variant v2b = {.cfg_from = "\"vocab_size\": 32000", .cfg_to = "\"vocab_size\": 32001"};
    dir = make_variant(&v2b);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "\"model.embed_tokens.weight\"",
               "[32000, 64]", "[32001, 64]", NULL);
    t_rmtree(dir);
    /* untied config without lm_head */
    variant v3 = {.cfg_from = "\"tie_word_embeddings\": true", .cfg_to = "\"tie_word_embeddings\": false"};
    dir = make_variant(&v3);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "\"lm_head.weight\"", NULL);
    t_rmtree(dir);
    /* a dtype that cannot be converted */
    int32_t ints[64] = {0};
    ft_st_out norm = {"model.norm.weight", FT_ST_I32, 1, {64}, ints};
    variant v4 = {.drop = "model.norm.weight", .extra = &norm};
    dir = make_variant(&v4);
    expect_err(ft_model_load(&m, dir), FT_E_UNSUPPORTED, "model.safetensors", "\"model.norm.weight\"",
               "I32", NULL);
    t_rmtree(dir);
    /* a weight that is not finite: refused when the weights are read, naming file, tensor
     * and element (the GGUF loader's rule) */
    float normw[64];
    for (int i = 0; i < 64; i++) normw[i] = 1.0f;
    normw[7] = NAN;
    ft_st_out nn = {"model.norm.weight", FT_ST_F32, 1, {64}, normw};
    variant v4b = {.drop = "model.norm.weight", .extra = &nn};
    dir = make_variant(&v4b);
    expect_err(ft_model_load(&m, dir), FT_E_CORRUPT, "model.safetensors", "\"model.norm.weight\"",
               "element 7 is NaN", NULL);
    assert_null(m);
    assert_int_equal(ft_model_load_deferred(&m, dir), 0); /* the shapes alone are fine */
    expect_err(ft_model_load_weights(m), FT_E_CORRUPT, "\"model.norm.weight\"", "element 7", NULL);
    ft_model_free(m);
    m = NULL;
    t_rmtree(dir);
    /* biases present but not configured */
    float bias[64] = {0};
    ft_st_out qb = {"model.layers.0.self_attn.q_proj.bias", FT_ST_F32, 1, {64}, bias};
    variant v5 = {.extra = &qb};
    dir = make_variant(&v5);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "attention_bias", NULL);
    t_rmtree(dir);
    /* config errors carry the config path */
    variant v6 = {.cfg_from = "\"hidden_size\": 64,", .cfg_to = ""};
    dir = make_variant(&v6);
    expect_err(ft_model_load(&m, dir), FT_E_INVALID, "config.json: missing required key \"hidden_size\"", NULL);
    t_rmtree(dir);
    assert_null(m);
    expect_err(ft_model_load(&m, "/nonexistent/model"), -ENOENT, "/nonexistent/model", NULL);
}

static void write_text(const char *dir, const char *name, const char *txt)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(ft_write_file_atomic(p, txt, strlen(txt)), 0);
}

static void test_sets(void **state)
{
    ft_st_set *s = NULL;
    /* empty folder */
    char *dir = t_tmpdir();
    expect_err(ft_st_set_open(&s, dir), -ENOENT, dir, "no model.safetensors", NULL);
    /* pickle weights only */
    write_text(dir, "pytorch_model.bin", "PK");
    expect_err(ft_st_set_open(&s, dir), FT_E_UNSUPPORTED, dir, "pytorch_model.bin",
               "safe_serialization=True", NULL);
    /* one other *.safetensors file is used */
    float x[2] = {1, 2};
    ft_st_out t = {"x", FT_ST_F32, 1, {2}, x};
    char p[600];
    snprintf(p, sizeof p, "%s/weights.safetensors", dir);
    assert_int_equal(ft_st_write(p, &t, 1, NULL, NULL, 0), 0);
    assert_int_equal(ft_st_set_open(&s, dir), 0);
    const ft_st_file *f = NULL;
    assert_non_null(ft_st_set_find(s, "x", &f));
    assert_string_equal(ft_st_path(f), p);
    assert_null(ft_st_set_find(s, "y", NULL));
    ft_st_set_close(s);
    /* two of them and no index: ambiguous */
    snprintf(p, sizeof p, "%s/other.safetensors", dir);
    assert_int_equal(ft_st_write(p, &t, 1, NULL, NULL, 0), 0);
    expect_err(ft_st_set_open(&s, dir), FT_E_INVALID, dir, "2 *.safetensors files", NULL);
    t_rmtree(dir);

    /* sharded set errors: a missing shard, a wrong mapping, bad JSON */
    variant v = {.n_shards = 2};
    dir = make_variant(&v);
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    assert_int_equal(ft_st_set_open(&s, dir), 0);
    assert_non_null(ft_st_set_find(s, "model.norm.weight", &f));
    assert_true(strstr(ft_st_path(f), "-of-00002.safetensors") != NULL);
    ft_st_set_close(s);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(idx, &txt, &len), 0);
    char *orig = strdup(txt);
    char *at = strstr(txt, "model-00002-of-00002");
    memcpy(at, "model-00009-of-00002", 20);
    write_text(dir, "model.safetensors.index.json", txt);
    expect_err(ft_st_set_open(&s, dir), -ENOENT, idx, "shard \"model-00009-of-00002.safetensors\"",
               NULL);
    /* map a tensor of shard 2 to shard 1 */
    strcpy(txt, orig);
    at = strstr(txt, "model-00002-of-00002");
    memcpy(at, "model-00001-of-00002", 20);
    write_text(dir, "model.safetensors.index.json", txt);
    expect_err(ft_st_set_open(&s, dir), FT_E_CORRUPT, idx, "does not hold it", NULL);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [1]}");
    expect_err(ft_st_set_open(&s, dir), FT_E_INVALID, idx, "weight_map", NULL);
    write_text(dir, "model.safetensors.index.json", "{oops");
    expect_err(ft_st_set_open(&s, dir), FT_E_INVALID, idx, "not valid JSON", NULL);
    /* a corrupt shard: the error names the index and the shard */
    write_text(dir, "model.safetensors.index.json", orig);
    char sp[600];
    snprintf(sp, sizeof sp, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(truncate(sp, 100), 0);
    expect_err(ft_st_set_open(&s, dir), FT_E_CORRUPT, idx, sp, NULL);
    free(orig);
    free(txt);
    t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_write_failures),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_load_tiny),
        cmocka_unit_test(test_load_qwen2_folder),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_sets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
