/* test_uring.c - the NVMe reader (offload/uring.h): io_uring + O_DIRECT reads, aligned and
 * unaligned ranges, against the file's bytes; the pread fallback; short reads and missing
 * files as errors. */
#include "tests/unit/harness.h"

#include "offload/uring.h"
#include "src/core/err.h"

#define FILE_BYTES ((size_t)(5 << 20) + 12345)

static char *g_path;
static unsigned char *g_data;

static int setup(void **state)
{
    (void)state;
    g_data = malloc(FILE_BYTES);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < FILE_BYTES; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        g_data[i] = (unsigned char)x;
    }
    /* under the build folder's file system, not /tmp, which may be tmpfs (no O_DIRECT) */
    char dir[] = "build-uring-test-XXXXXX";
    if (!mkdtemp(dir)) return -1;
    g_path = malloc(strlen(dir) + 16);
    sprintf(g_path, "%s/blob", dir);
    FILE *f = fopen(g_path, "wb");
    if (!f || fwrite(g_data, 1, FILE_BYTES, f) != FILE_BYTES) return -1;
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    *strrchr(g_path, '/') = 0;
    rmdir(g_path);
    free(g_path);
    free(g_data);
    return 0;
}

static void check_ranges(ft_reader *r)
{
    unsigned char *buf;
    assert_int_equal(posix_memalign((void **)&buf, FT_READER_ALIGN, FILE_BYTES + FT_READER_ALIGN), 0);
    const struct { uint64_t off; size_t len; size_t shift; } cases[] = {
        {0, FILE_BYTES, 0},             /* the whole file, aligned start, odd end */
        {4096, 3 << 20, 0},             /* aligned, several chunks in flight */
        {4096 * 7 + 100, 1 << 20, 100}, /* same misalignment of buffer and offset */
        {333, 777777, 0},               /* buffer aligned, offset not: page-cache path */
        {FILE_BYTES - 5000, 5000, 0},   /* the tail */
        {12288, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(buf, 0xAB, FILE_BYTES);
        unsigned char *p = buf + cases[i].shift;
        assert_int_equal(ft_reader_read(r, p, cases[i].len, cases[i].off), 0);
        assert_memory_equal(p, g_data + cases[i].off, cases[i].len);
    }
    /* past the end: a short read is an error, not silent zeros */
    assert_int_equal(ft_reader_read(r, buf, 8192, FILE_BYTES - 4096), FT_E_CORRUPT);
    printf("reader %s: ok (%llu bytes)\n", ft_reader_mode(r), (unsigned long long)ft_reader_bytes(r));
    free(buf);
}

static void test_direct(void **state)
{
    (void)state;
    ft_reader *r;
    assert_int_equal(ft_reader_open(&r, g_path, 4, 256 << 10, 1), 0);
    check_ranges(r);
#ifdef FT_HAVE_URING
    /* on ext4/xfs the direct path must really be taken (tmpfs would say pread) */
    printf("mode: %s\n", ft_reader_mode(r));
#endif
    ft_reader_close(r);
}

static void test_pread(void **state)
{
    (void)state;
    ft_reader *r;
    assert_int_equal(ft_reader_open(&r, g_path, 0, 0, 0), 0);
    assert_non_null(strstr(ft_reader_mode(r), "pread"));
    check_ranges(r);
    ft_reader_close(r);
}

static void test_missing(void **state)
{
    (void)state;
    ft_reader *r;
    assert_int_equal(ft_reader_open(&r, "no/such/file", 0, 0, 1), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "no/such/file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct),
        cmocka_unit_test(test_pread),
        cmocka_unit_test(test_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
