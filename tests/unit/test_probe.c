/* test_probe.c - the I/O probes (offload/probe.h): the disk probe reads the whole range it
 * was given (all of a small file, or max_bytes of it), with a positive rate and its grid of
 * queue depths x chunks when O_DIRECT is in use; missing, empty and directory paths are
 * errors naming the path; the PCIe probe refuses the CPU backend. No rates are asserted
 * beyond being positive (no timing assertions). */
#include "tests/unit/harness.h"

#include <errno.h>
#include <sys/vfs.h>

#include "kernels/kernels.h"
#include "offload/probe.h"
#include "src/core/err.h"

#define FILE_BYTES ((size_t)(64 << 20) + 12345) /* odd tail: the reader's page-cache path */

static char g_dir[] = "build-probe-test-XXXXXX";
static char g_path[64], g_empty[64];

static int setup(void **state)
{
    (void)state;
    /* under the build folder's file system, not /tmp, which may be tmpfs (no O_DIRECT) */
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/blob", g_dir);
    snprintf(g_empty, sizeof g_empty, "%s/empty", g_dir);
    FILE *f = fopen(g_path, "wb");
    if (!f) return -1;
    size_t blk_n = 1 << 20;
    uint64_t *blk = malloc(blk_n), x = 88172645463325252ull;
    for (size_t done = 0; done < FILE_BYTES;) {
        for (size_t i = 0; i < blk_n / 8; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            blk[i] = x;
        }
        size_t n = FILE_BYTES - done < blk_n ? FILE_BYTES - done : blk_n;
        if (fwrite(blk, 1, n, f) != n) return -1;
        done += n;
    }
    free(blk);
    fclose(f);
    f = fopen(g_empty, "wb");
    if (!f) return -1;
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    unlink(g_empty);
    rmdir(g_dir);
    return 0;
}

static int in_grid(int qd, size_t chunk)
{
    return (qd == 4 || qd == 8 || qd == 16 || qd == 32) &&
           (chunk == (256 << 10) || chunk == (1 << 20) || chunk == (4 << 20));
}

static void test_disk_whole_file(void **state)
{
    (void)state;
    ft_probe_disk_result r;
    /* max_bytes 0 = 2 GiB, more than the file: the whole file is read */
    assert_int_equal(ft_probe_disk(g_path, 0, &r), 0);
    printf("probe: %s: %.3f GB/s, qd %d, chunk %zu, %s\n", g_path, r.bytes_per_s / 1e9,
           r.queue_depth, r.chunk_bytes, r.mode);
    assert_int_equal(r.file_bytes, FILE_BYTES);
    assert_int_equal(r.bytes, FILE_BYTES);
    assert_true(r.bytes_per_s > 0);
    assert_true(r.seconds > 0);
    assert_true(r.mode[0] != 0);
    uint64_t grid_sum = 0;
    if (strstr(r.mode, "pread")) {
        assert_true(r.page_cache);
        assert_non_null(strstr(r.note, "page cache"));
        assert_int_equal(r.n_grid, 0);
    } else {
        assert_non_null(strstr(r.mode, "O_DIRECT"));
        assert_int_equal(r.n_grid, FT_PROBE_GRID_QD * FT_PROBE_GRID_CHUNK);
        assert_true(in_grid(r.queue_depth, r.chunk_bytes));
        double best = 0;
        for (int i = 0; i < r.n_grid; i++) {
            assert_true(in_grid(r.grid[i].queue_depth, r.grid[i].chunk_bytes));
            assert_true(r.grid[i].bytes > 0 && r.grid[i].bytes <= FILE_BYTES);
            assert_true(r.grid[i].bytes_per_s > 0);
            if (r.grid[i].bytes_per_s > best) best = r.grid[i].bytes_per_s;
            grid_sum += r.grid[i].bytes;
        }
        /* the chosen point is within 8% of the grid's best, and no other point that is moves
         * more bytes per request round (queue depth x chunk; ties: the larger chunk) */
        int found = 0;
        for (int i = 0; i < r.n_grid; i++) {
            const ft_probe_disk_point *p = &r.grid[i];
            if (p->queue_depth == r.queue_depth && p->chunk_bytes == r.chunk_bytes) {
                found = 1;
                assert_true(p->bytes_per_s >= 0.92 * best);
            } else if (p->bytes_per_s >= 0.92 * best) {
                double q = (double)p->queue_depth * p->chunk_bytes,
                       qc = (double)r.queue_depth * r.chunk_bytes;
                assert_true(q < qc || (q == qc && p->chunk_bytes < r.chunk_bytes));
            }
        }
        assert_true(found);
        /* the reader's mode names the chosen setting */
        char want[64];
        snprintf(want, sizeof want, "queue depth %d, %zu KiB", r.queue_depth, r.chunk_bytes / 1024);
        assert_non_null(strstr(r.mode, want));
    }
    assert_int_equal(r.total_bytes, grid_sum + FILE_BYTES);
}

static void test_disk_max_bytes(void **state)
{
    (void)state;
    ft_probe_disk_result r;
    const uint64_t want = (10 << 20) + 4097; /* unaligned end */
    assert_int_equal(ft_probe_disk(g_path, want, &r), 0);
    assert_int_equal(r.bytes, want);
    assert_int_equal(r.file_bytes, FILE_BYTES);
    assert_true(r.bytes_per_s > 0);
    for (int i = 0; i < r.n_grid; i++) assert_true(r.grid[i].bytes <= want);
}

static void test_disk_errors(void **state)
{
    (void)state;
    ft_probe_disk_result r;
    ft_err_clear();
    assert_int_equal(ft_probe_disk("no/such/file", 0, &r), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "no/such/file"));
    assert_int_equal(ft_probe_disk(g_empty, 0, &r), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), g_empty));
    assert_int_equal(ft_probe_disk(g_dir, 0, &r), -EISDIR);
    assert_non_null(strstr(ft_errmsg(), g_dir));
}

/* A file on tmpfs is memory: the probe says so whichever path the reader takes. */
static void test_disk_tmpfs(void **state)
{
    (void)state;
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || (unsigned long)sf.f_type != 0x01021994) {
        printf("no tmpfs at /dev/shm: skipped\n");
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/ftune-probe-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("cannot write %s: skipped\n", path);
        return;
    }
    static char blk[1 << 16];
    memset(blk, 7, sizeof blk);
    for (int i = 0; i < 64; i++) assert_int_equal(fwrite(blk, 1, sizeof blk, f), sizeof blk);
    fclose(f);
    ft_probe_disk_result r;
    int rc = ft_probe_disk(path, 0, &r);
    unlink(path);
    assert_int_equal(rc, 0);
    assert_int_equal(r.bytes, 64 * sizeof blk);
    assert_true(r.page_cache);
    assert_true(r.note[0] != 0);
}

static void test_pcie_cpu(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    double h2d = -1, d2h = -1;
    ft_err_clear();
    assert_int_equal(ft_probe_pcie(be, 1 << 20, &h2d, &d2h), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "no PCIe on the CPU backend"));
    assert_true(h2d == 0 && d2h == 0);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disk_whole_file),
        cmocka_unit_test(test_disk_max_bytes),
        cmocka_unit_test(test_disk_errors),
        cmocka_unit_test(test_disk_tmpfs),
        cmocka_unit_test(test_pcie_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
