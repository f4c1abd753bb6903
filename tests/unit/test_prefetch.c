/* test_prefetch.c - the disk read-ahead (offload/prefetch.h) on a temporary file of blocks:
 * blocks come out in list order with the file's bytes (a forward then backward visit order,
 * as the executor's), the thread reads ahead on its own up to the n_stage buffers and never
 * into a buffer the consumer holds; a list continuing what was read ahead keeps it, another
 * drops it; an id that is not next is refused (the consumer reads it itself); read errors and
 * buffer_wait errors reach the next take with the file and offset, until the next start;
 * freeing with reads in flight or queued returns. On a real pack: the reader probe
 * (offload/probe.h ft_probe_pack_reader) gives the pack's reader its best grid point, and the
 * read-ahead with that setting reads every layer block as the pack's own verified reads. Also
 * the pinned pool's host-memory path (offload/pinned.h): no device node on the CPU backend,
 * memory usable, freed. */
#include "tests/unit/harness.h"

#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/kernels.h"
#include "offload/pack.h"
#include "offload/pinned.h"
#include "offload/prefetch.h"
#include "offload/probe.h"
#include "offload/uring.h"
#include "src/core/err.h"

#define N_BLK 12
#define BLK_MAX ((size_t)384 << 10)  /* the staging buffer size */
#define WAIT_S 10.0                   /* bound on waiting for the thread (never reached when it works) */

static char g_dir[] = "build-prefetch-test-XXXXXX";
static char g_path[96];
static unsigned char *g_data;
static size_t g_bytes;
static ft_dpf_block g_blk[N_BLK];     /* id = index; sizes vary; file order shuffled */

/* The consumer's view, checked by the thread's buffer_wait callback. */
typedef struct watch {
    int held[8];
    int violations, waits, fail_at; /* fail_at: the wait number that returns an error (0: none) */
    pthread_mutex_t mu;
} watch;

static int on_wait(void *user, int h)
{
    watch *w = user;
    pthread_mutex_lock(&w->mu);
    w->violations += w->held[h];
    int n = ++w->waits, fail = w->fail_at && n == w->fail_at;
    pthread_mutex_unlock(&w->mu);
    return fail ? ft_err(-EIO, "staging buffer %d: its copy failed (injected)", h) : 0;
}

static int setup(void **state)
{
    (void)state;
    /* under the build folder's file system, not /tmp, which may be tmpfs (no O_DIRECT) */
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_path, sizeof g_path, "%s/pack", g_dir);
    for (int l = 0; l < N_BLK; l++) {
        g_blk[l].id = l;
        g_blk[l].bytes = BLK_MAX - (uint64_t)((l * 7) % 5) * 4096 * 9; /* sizes vary */
    }
    uint64_t off = 4096; /* a header page, like a pack */
    for (int i = 0; i < N_BLK; i++) { /* file order differs from id order */
        int l = (i * 5) % N_BLK;
        g_blk[l].off = off;
        off += g_blk[l].bytes;
    }
    g_bytes = (size_t)off;
    g_data = malloc(g_bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < g_bytes; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        g_data[i] = (unsigned char)x;
    }
    FILE *f = fopen(g_path, "wb");
    if (!f || fwrite(g_data, 1, g_bytes, f) != g_bytes) return -1;
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_path);
    rmdir(g_dir);
    free(g_data);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits until the thread has read `want` blocks in all; returns the count reached. */
static int64_t wait_reads(ft_disk_prefetch *p, int64_t want)
{
    int64_t reads = 0, dropped = 0;
    double t0 = now_s();
    while (now_s() - t0 < WAIT_S) {
        ft_disk_prefetch_counts(p, &reads, &dropped);
        if (reads >= want) break;
        usleep(1000);
    }
    return reads;
}

typedef struct fixture {
    uint8_t *stage;
    watch w;
    ft_disk_prefetch *p;
    int n_stage;
} fixture;

static void open_fixture(fixture *fx, int n_stage, int register_buffers)
{
    memset(fx, 0, sizeof *fx);
    pthread_mutex_init(&fx->w.mu, NULL);
    fx->n_stage = n_stage;
    assert_int_equal(posix_memalign((void **)&fx->stage, 4096, (size_t)n_stage * BLK_MAX), 0);
    ft_dpf_cfg c = {0};
    c.path = g_path;
    c.queue_depth = 4;
    c.chunk_bytes = 64 << 10; /* several chunks per block: the queue spans block boundaries */
    c.stage = fx->stage;
    c.stage_bytes = BLK_MAX;
    c.n_stage = n_stage;
    c.max_blocks = 4 * N_BLK;
    c.buffer_wait = on_wait;
    c.user = &fx->w;
    c.register_buffers = register_buffers;
    assert_int_equal(ft_disk_prefetch_init(&fx->p, &c), 0);
}

static void close_fixture(fixture *fx)
{
    ft_disk_prefetch_free(fx->p);
    assert_int_equal(fx->w.violations, 0);
    free(fx->stage);
    pthread_mutex_destroy(&fx->w.mu);
}

/* Takes block id, checks its bytes, releases it. */
static void take_check(fixture *fx, int64_t id)
{
    int h = -1;
    ft_dpf_read rd;
    int rc = ft_disk_prefetch_take(fx->p, id, &h, &rd);
    if (rc < 0) printf("take %lld: %s\n", (long long)id, ft_errmsg());
    assert_int_equal(rc, 1);
    assert_true(h >= 0 && h < fx->n_stage);
    assert_true(rd.t1 >= rd.t0 && rd.busy >= 0 && rd.busy <= rd.t1 - rd.t0 + 1e-9);
    pthread_mutex_lock(&fx->w.mu);
    fx->w.held[h] = 1;
    pthread_mutex_unlock(&fx->w.mu);
    assert_memory_equal(fx->stage + (size_t)h * BLK_MAX, g_data + g_blk[id].off, g_blk[id].bytes);
    usleep(200); /* the thread meanwhile must not touch buffer h */
    pthread_mutex_lock(&fx->w.mu);
    fx->w.held[h] = 0;
    pthread_mutex_unlock(&fx->w.mu);
    ft_disk_prefetch_release(fx->p, h);
}

static int make_list(ft_dpf_block *b, const int *ids, int n)
{
    for (int i = 0; i < n; i++) b[i] = g_blk[ids[i]];
    return n;
}

/* Forward 0..11 then backward 10..0 (the executor's visits, the turn layer once), with 2 and
 * 3 buffers; the read-ahead fills every free buffer without being asked. */
static void test_order(void **state)
{
    (void)state;
    for (int ns = 1; ns <= 3; ns++) {
        fixture fx;
        open_fixture(&fx, ns, 1);
        printf("n_stage %d: %s\n", ns, ft_disk_prefetch_mode(fx.p));
        int ids[2 * N_BLK], n = 0;
        for (int l = 0; l < N_BLK; l++) ids[n++] = l;
        for (int l = N_BLK - 2; l >= 0; l--) ids[n++] = l;
        ft_dpf_block *b = ft_disk_prefetch_scratch(fx.p);
        assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, ids, n)), 0);
        /* nothing taken yet: the thread reads ns blocks ahead by itself, and no more */
        assert_int_equal(wait_reads(fx.p, ns), ns);
        usleep(20000);
        int64_t reads, dropped;
        ft_disk_prefetch_counts(fx.p, &reads, &dropped);
        assert_int_equal(reads, ns);
        for (int i = 0; i < n; i++) {
            take_check(&fx, ids[i]);
            int64_t want = i + 1 + ns < n ? i + 1 + ns : n;
            assert_int_equal(wait_reads(fx.p, want), want);
            ft_disk_prefetch_counts(fx.p, &reads, &dropped);
            assert_true(reads <= want); /* never more than ns ahead */
        }
        ft_disk_prefetch_counts(fx.p, &reads, &dropped);
        assert_int_equal(reads, n);
        assert_int_equal(dropped, 0);
        assert_true(fx.w.waits >= n); /* one wait before each buffer fill */
        /* the list is exhausted: the next id is not in the stream */
        int h;
        assert_int_equal(ft_disk_prefetch_take(fx.p, 3, &h, NULL), 0);
        close_fixture(&fx);
    }
}

/* A new list that starts with the blocks read ahead keeps them; one that does not drops them
 * (after their reads finish) and reads its own; an id that is not next is refused. */
static void test_keep_drop(void **state)
{
    (void)state;
    fixture fx;
    open_fixture(&fx, 2, 1);
    ft_dpf_block *b = ft_disk_prefetch_scratch(fx.p);
    int a[] = {0, 1, 2, 3, 4, 5};
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, a, 6)), 0);
    for (int i = 0; i < 4; i++) take_check(&fx, a[i]);
    assert_int_equal(wait_reads(fx.p, 6), 6); /* 4 and 5 read ahead ("the next operation") */
    int c[] = {4, 5, 6, 7};
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, c, 4)), 2); /* kept */
    for (int i = 0; i < 4; i++) take_check(&fx, c[i]);
    int64_t reads, dropped;
    ft_disk_prefetch_counts(fx.p, &reads, &dropped);
    assert_int_equal(reads, 8);
    assert_int_equal(dropped, 0);

    int d[] = {8, 9, 10};
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, d, 3)), 0);
    assert_int_equal(wait_reads(fx.p, 10), 10);
    int e[] = {9, 10, 11}; /* 8 was predicted, 9 comes: everything read ahead goes */
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, e, 3)), 0);
    ft_disk_prefetch_counts(fx.p, &reads, &dropped);
    assert_int_equal(dropped, 2);
    int h;
    assert_int_equal(ft_disk_prefetch_take(fx.p, 11, &h, NULL), 0); /* not next: refused */
    for (int i = 0; i < 3; i++) take_check(&fx, e[i]);
    ft_disk_prefetch_counts(fx.p, &reads, &dropped);
    assert_int_equal(reads, 11);

    /* cancel with blocks read ahead, then the consumer's own use, then a restart */
    int f[] = {0, 1, 2};
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, f, 3)), 0);
    assert_int_equal(wait_reads(fx.p, 13), 13);
    ft_disk_prefetch_cancel(fx.p);
    assert_int_equal(ft_disk_prefetch_take(fx.p, 0, &h, NULL), 0);
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, f, 3)), 0);
    for (int i = 0; i < 3; i++) take_check(&fx, f[i]);
    close_fixture(&fx);
}

/* A block past the end of the file: the error, with file and offset, comes with the take of
 * that block (one buffer: nothing is read before the previous block is released), and with
 * every take until the next start, which clears it. An error of buffer_wait likewise. */
static void test_errors(void **state)
{
    (void)state;
    fixture fx;
    open_fixture(&fx, 1, 0);
    ft_dpf_block *b = ft_disk_prefetch_scratch(fx.p);
    b[0] = g_blk[0];
    b[1] = g_blk[1];
    b[2] = (ft_dpf_block){77, (uint64_t)g_bytes - 8192, 64 << 10};
    b[3] = g_blk[2];
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, 4), 0);
    take_check(&fx, 0);
    take_check(&fx, 1);
    int h = -1;
    assert_int_equal(ft_disk_prefetch_take(fx.p, 77, &h, NULL), FT_E_CORRUPT);
    printf("error: %s\n", ft_errmsg());
    assert_non_null(strstr(ft_errmsg(), g_path));
    assert_non_null(strstr(ft_errmsg(), "offset"));
    assert_int_equal(ft_disk_prefetch_take(fx.p, 2, &h, NULL), FT_E_CORRUPT); /* kept */
    assert_int_equal(ft_disk_prefetch_start(fx.p, b + 3, 1), 0);
    take_check(&fx, 2);

    pthread_mutex_lock(&fx.w.mu);
    fx.w.fail_at = fx.w.waits + 2; /* the second buffer refill from now */
    pthread_mutex_unlock(&fx.w.mu);
    int ids[] = {3, 4, 5};
    assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, ids, 3)), 0);
    take_check(&fx, 3);
    assert_int_equal(ft_disk_prefetch_take(fx.p, 4, &h, NULL), -EIO);
    assert_non_null(strstr(ft_errmsg(), "injected"));
    close_fixture(&fx);
}

/* Free with reads in flight, with blocks staged and not taken, right after init, and with
 * a buffer that may not be registerable (file-backed memory): always returns, and the reads
 * that happen give the file's bytes. */
static void test_shutdown(void **state)
{
    (void)state;
    for (int round = 0; round < 3; round++) {
        fixture fx;
        open_fixture(&fx, 3, 1);
        if (round > 0) {
            ft_dpf_block *b = ft_disk_prefetch_scratch(fx.p);
            int ids[] = {0, 1, 2, 3, 4, 5, 6, 7};
            assert_int_equal(ft_disk_prefetch_start(fx.p, b, make_list(b, ids, 8)), 0);
            take_check(&fx, 0);
            if (round == 2) wait_reads(fx.p, 4); /* buffers full, the thread idle */
        }
        close_fixture(&fx);
    }
    /* staging in a shared file mapping: io_uring may refuse to register it (then says so) */
    char path[128];
    snprintf(path, sizeof path, "%s/stage", g_dir);
    FILE *f = fopen(path, "wb+");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)(2 * BLK_MAX)), 0);
    uint8_t *m = mmap(NULL, 2 * BLK_MAX, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
    assert_true(m != MAP_FAILED);
    watch w = {0};
    pthread_mutex_init(&w.mu, NULL);
    ft_dpf_cfg c = {g_path, 4, 64 << 10, m, BLK_MAX, 2, 8, on_wait, &w, 1};
    ft_disk_prefetch *p;
    assert_int_equal(ft_disk_prefetch_init(&p, &c), 0);
    const char *mode = ft_disk_prefetch_mode(p);
    printf("file-backed staging: %s\n", mode);
    assert_true(strstr(mode, "registered buffers") || strstr(mode, "not registered") ||
                strstr(mode, "pread"));
    ft_dpf_block *b = ft_disk_prefetch_scratch(p);
    b[0] = g_blk[5];
    b[1] = g_blk[6];
    assert_int_equal(ft_disk_prefetch_start(p, b, 2), 0);
    for (int i = 5; i <= 6; i++) {
        int h;
        assert_int_equal(ft_disk_prefetch_take(p, i, &h, NULL), 1);
        assert_memory_equal(m + (size_t)h * BLK_MAX, g_data + g_blk[i].off, g_blk[i].bytes);
        ft_disk_prefetch_release(p, h);
    }
    ft_disk_prefetch_free(p);
    munmap(m, 2 * BLK_MAX);
    fclose(f);
    unlink(path);
}

/* A pack of the tiny model (built under the test folder: O_DIRECT): the probe sets the pack's
 * reader to its best point; the read-ahead, opened with that setting, reads each layer block
 * (forward then backward) with the bytes ft_pack_read_block returns after checking them. */
static void test_pack_probe(void **state)
{
    (void)state;
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info *pi = calloc(1, sizeof *pi);
    assert_int_equal(ft_pack_ensure("tests/fixtures/tiny-llama", g_dir, &ps, 0, pi), 0);
    ft_pack_file *pack;
    assert_int_equal(ft_pack_open(&pack, pi->path, 1), 0);
    uint64_t before = ft_pack_bytes_read(pack);
    ft_probe_disk_result *r = calloc(1, sizeof *r);
    assert_int_equal(ft_probe_pack_reader(pack, 0, r), 0);
    int qd;
    size_t chunk;
    ft_pack_reader_params(pack, &qd, &chunk);
    printf("probe: %d grid points, best qd %d x %zu KiB at %.2f GB/s over %llu bytes; pack reader %s\n",
           r->n_grid, r->queue_depth, r->chunk_bytes >> 10, r->bytes_per_s / 1e9,
           (unsigned long long)r->bytes, ft_pack_read_mode(pack));
    int64_t L = ft_pack_config(pack)->num_hidden_layers;
    uint64_t o0, n0, o1, n1;
    assert_int_equal(ft_pack_block_extent(pack, 0, &o0, &n0), 0);
    assert_int_equal(ft_pack_block_extent(pack, L - 1, &o1, &n1), 0);
    assert_int_equal(r->bytes, o1 + n1 - o0); /* the layer blocks, all of them (a small pack) */
    assert_int_equal(ft_pack_block_extent(pack, L, &o1, &n1), FT_E_RANGE);
    if (r->n_grid > 0) { /* O_DIRECT: the best point is now the pack's setting */
        assert_int_equal(qd, r->queue_depth);
        assert_int_equal(chunk, r->chunk_bytes);
    }
    size_t big = ft_pack_max_layer_bytes(pack);
    uint8_t *want, *stage;
    assert_int_equal(posix_memalign((void **)&want, 4096, big), 0);
    assert_int_equal(posix_memalign((void **)&stage, 4096, 2 * big), 0);
    watch w = {0};
    pthread_mutex_init(&w.mu, NULL);
    ft_dpf_cfg c = {ft_pack_path(pack), qd, chunk, stage, big, 2, (int)(4 * L + 4), on_wait, &w, 1};
    ft_disk_prefetch *p;
    assert_int_equal(ft_disk_prefetch_init(&p, &c), 0);
    printf("read-ahead: %s\n", ft_disk_prefetch_mode(p));
    ft_dpf_block *b = ft_disk_prefetch_scratch(p);
    int n = 0;
    for (int64_t l = 0; l < L; l++) b[n++].id = l;
    for (int64_t l = L - 1; l >= 0; l--) b[n++].id = l;
    for (int i = 0; i < n; i++) assert_int_equal(ft_pack_block_extent(pack, b[i].id, &b[i].off, &b[i].bytes), 0);
    int64_t ids[64];
    for (int i = 0; i < n; i++) ids[i] = b[i].id;
    assert_int_equal(ft_disk_prefetch_start(p, b, n), 0);
    for (int i = 0; i < n; i++) {
        int h;
        assert_int_equal(ft_disk_prefetch_take(p, ids[i], &h, NULL), 1);
        size_t nb = ft_pack_block_bytes(pack, ids[i]);
        assert_int_equal(ft_pack_read_block(pack, ids[i], want, big, 1), 0); /* checksummed */
        assert_memory_equal(stage + (size_t)h * big, want, nb);
        ft_disk_prefetch_release(p, h);
    }
    ft_disk_prefetch_free(p);
    assert_int_equal(w.violations, 0);
    assert_true(ft_pack_bytes_read(pack) > before); /* the counter survives the new reader */
    pthread_mutex_destroy(&w.mu);
    free(want);
    free(stage);
    free(r);
    ft_pack_close(pack);
    unlink(pi->path);
    free(pi);
}

/* The pinned pool on the CPU backend: no device, so no node; the memory is 4096-aligned,
 * usable, described, freed; a node preference (libnuma) still gives usable memory. */
static void test_pinned_cpu(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    assert_int_equal(ft_pinned_node(be), -1);
    for (int node = -1; node <= 0; node++) {
        void *p = NULL;
        assert_int_equal(ft_pinned_alloc(be, (3 << 20) + 5, node, &p), 0);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 4096, 0);
        assert_int_equal(ft_pinned_bytes(p), (size_t)(3 << 20) + 4096);
        memset(p, 0x5a, (3 << 20) + 5);
        char d[256];
        ft_pinned_describe(p, d, sizeof d);
        printf("node %d: %s\n", node, d);
        assert_non_null(strstr(d, "3.0 MiB"));
        if (node < 0) assert_non_null(strstr(d, "no NUMA preference"));
        ft_pinned_free(be, p);
    }
    ft_pinned_free(be, NULL);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_keep_drop),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_pack_probe),
        cmocka_unit_test(test_pinned_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
