/* test_uring.c - the NVMe reader (offload/uring.h): io_uring + O_DIRECT reads, aligned and
 * unaligned ranges, against the file's bytes; the pread fallback; short reads and missing
 * files as errors; the extent queue (chunks of several extents in flight together, extents
 * returned in queue order, an error in one drains and empties the queue, cancel); reads into
 * registered buffers (fixed-buffer ops) giving the same bytes. */
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

/* Queues extents (aligned, unaligned, out of file order) and polls them out. */
static void check_queue(ft_reader *r)
{
    const struct { uint64_t off; size_t len; } ext[] = {
        {1 << 20, 3 << 20}, {0, 256 << 10}, {4096 * 3 + 7, 100000}, {4 << 20, 4096}, {8192, 1 << 20},
    };
    const int n = (int)(sizeof ext / sizeof ext[0]);
    unsigned char *buf[8];
    for (int i = 0; i < n; i++) {
        assert_int_equal(posix_memalign((void **)&buf[i], FT_READER_ALIGN, ext[i].len + FT_READER_ALIGN), 0);
        memset(buf[i], 0xAB, ext[i].len);
        assert_int_equal(ft_reader_queue(r, buf[i], ext[i].len, ext[i].off, 100 + (uint64_t)i), 0);
    }
    assert_int_equal(ft_reader_queued(r), n);
    /* ft_reader_read refuses to cut in */
    assert_int_equal(ft_reader_read(r, buf[0], 4096, 0), FT_E_INVALID);
    for (int i = 0; i < n; i++) {
        uint64_t tag = 0;
        int rc;
        while ((rc = ft_reader_poll(r, 1, &tag)) == 0) {
        }
        assert_int_equal(rc, 1);
        assert_int_equal(tag, 100 + (uint64_t)i); /* in queue order */
        assert_memory_equal(buf[i], g_data + ext[i].off, ext[i].len);
    }
    assert_int_equal(ft_reader_queued(r), 0);
    assert_int_equal(ft_reader_unsubmitted(r), 0);
    uint64_t tag;
    assert_int_equal(ft_reader_poll(r, 1, &tag), 0); /* nothing queued */

    /* an extent past the end: the error names the file and offset, the queue is emptied */
    assert_int_equal(ft_reader_queue(r, buf[0], 256 << 10, 0, 1), 0);
    int rc = ft_reader_queue(r, buf[1], 64 << 10, (FILE_BYTES / 4096) * 4096 - 8192, 2);
    while (rc >= 0) { /* direct: the error comes from a chunk, the good extent may come first */
        rc = ft_reader_poll(r, 1, &tag);
        if (rc == 1) assert_int_equal(tag, 1);
        assert_true(rc <= 0 || ft_reader_queued(r) == 1);
    }
    assert_int_equal(rc, FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), g_path));
    assert_non_null(strstr(ft_errmsg(), "offset"));
    if (ft_reader_queued(r)) { /* pread: the read failed in ft_reader_queue, the good one waits */
        assert_int_equal(ft_reader_poll(r, 1, &tag), 1);
        assert_int_equal(tag, 1);
    }
    assert_int_equal(ft_reader_queued(r), 0);

    /* cancel with reads in flight: the buffers are free afterwards, the reader still works */
    for (int i = 0; i < n; i++) assert_int_equal(ft_reader_queue(r, buf[i], ext[i].len, ext[i].off, 0), 0);
    (void)ft_reader_poll(r, 0, &tag);
    ft_reader_cancel(r);
    assert_int_equal(ft_reader_queued(r), 0);
    assert_int_equal(ft_reader_read(r, buf[0], ext[0].len, ext[0].off), 0);
    assert_memory_equal(buf[0], g_data + ext[0].off, ext[0].len);
    for (int i = 0; i < n; i++) free(buf[i]);
}

static void test_queue(void **state)
{
    (void)state;
    ft_reader *r;
    assert_int_equal(ft_reader_open(&r, g_path, 4, 64 << 10, 1), 0);
    check_queue(r);
    ft_reader_close(r);
    assert_int_equal(ft_reader_open(&r, g_path, 0, 0, 0), 0); /* pread: same behaviour */
    check_queue(r);
    ft_reader_close(r);
}

/* Reads into registered buffers go through fixed-buffer ops and give the same bytes; where
 * registration is refused (locked-memory limit, no io_uring) the reader says why and reads
 * as before. */
static void test_registered(void **state)
{
    (void)state;
    ft_reader *r;
    assert_int_equal(ft_reader_open(&r, g_path, 4, 64 << 10, 1), 0);
    const size_t n = 1 << 20;
    unsigned char *a, *b;
    assert_int_equal(posix_memalign((void **)&a, FT_READER_ALIGN, n), 0);
    assert_int_equal(posix_memalign((void **)&b, FT_READER_ALIGN, n), 0);
    void *bufs[2] = {a, b};
    size_t lens[2] = {n, n};
    int rc = ft_reader_register(r, bufs, lens, 2);
    printf("register: %s -> %s\n", rc ? ft_errmsg() : "ok", ft_reader_mode(r));
    int direct = strncmp(ft_reader_mode(r), "pread", 5) != 0;
    if (rc == 0) {
        assert_non_null(strstr(ft_reader_mode(r), "2 registered buffers"));
    } else {
        assert_true(strlen(ft_errmsg()) > 0);
        assert_null(strstr(ft_reader_mode(r), "registered"));
    }
    assert_int_equal(ft_reader_queue(r, a, n, 4096, 1), 0);
    assert_int_equal(ft_reader_queue(r, b + 4096, n - 8192, 2 << 20, 2), 0); /* inside b */
    uint64_t tag;
    for (int i = 1; i <= 2; i++) {
        while ((rc = ft_reader_poll(r, 1, &tag)) == 0) {
        }
        assert_int_equal(rc, 1);
        assert_int_equal(tag, (uint64_t)i);
    }
    assert_memory_equal(a, g_data + 4096, n);
    assert_memory_equal(b + 4096, g_data + (2 << 20), n - 8192);
    if (direct && strstr(ft_reader_mode(r), "registered"))
        assert_true(ft_reader_fixed_reads(r) >= 2 * (n / (64 << 10)) - 1);
    else
        assert_int_equal(ft_reader_fixed_reads(r), 0);
    /* too many pieces: refused with a reason, the registered set is dropped, reads go on */
    void *many[FT_READER_MAX_FIXED + 1];
    size_t many_n[FT_READER_MAX_FIXED + 1];
    for (int i = 0; i <= FT_READER_MAX_FIXED; i++) {
        many[i] = a;
        many_n[i] = 4096;
    }
    if (direct) {
        assert_int_equal(ft_reader_register(r, many, many_n, FT_READER_MAX_FIXED + 1), FT_E_RANGE);
        assert_null(strstr(ft_reader_mode(r), "registered"));
        uint64_t fixed = ft_reader_fixed_reads(r);
        assert_int_equal(ft_reader_read(r, a, n, 8192), 0);
        assert_memory_equal(a, g_data + 8192, n);
        assert_int_equal(ft_reader_fixed_reads(r), fixed);
    } else {
        assert_int_equal(ft_reader_register(r, many, many_n, 1), FT_E_UNSUPPORTED);
    }
    ft_reader_close(r);
    free(a);
    free(b);
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
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_registered),
        cmocka_unit_test(test_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
