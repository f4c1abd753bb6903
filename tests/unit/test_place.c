/* test_place.c - offload/place.h ft_place_packed when something fails, on the CPU backend in
 * device mode (ft_backend_cpu_device_init, as tests/unit/test_tiers.c): the backend's table
 * is copied with entries wrapped, so that the n-th acquisition (alloc, host_alloc,
 * host_register) or the n-th copy fails, and every live acquisition is counted. For each n
 * up to the last of a successful placement, the call returns the error, the backend holds
 * what it held before (the probe, the executor's init and the calls after it freed what they
 * took: the trainer frees the executor only on success), *ex is zeroed when the failure came
 * during or after the executor's init, and the message is the failure's, not one recorded
 * while freeing (after the failure every event fails, as with a sticky device error, and the
 * executor's free drains its copy lane with events while the pinned staging is held). */
#include "tests/unit/harness.h"

#include "adapters/lora.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "offload/place.h"
#include "offload/probe.h"
#include "src/core/err.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

#define TINY "tests/fixtures/tiny-llama"
#define THREADS 2
#define NOISE "recorded while freeing"

static const ft_backend_ops *g_orig; /* the device-mode table being wrapped */
static int64_t g_calls;              /* acquisitions since the counter was reset */
static int64_t g_fail_at;            /* the one that fails (1-based); 0: none */
static int64_t g_live;               /* acquired and not yet released */
static int64_t g_copies;             /* copy calls since the counter was reset */
static int64_t g_fail_copy_at;       /* the copy that fails (1-based); 0: none */
static int64_t g_pcie_at;            /* acquisition number of the PCIe probe's device buffer */
static int64_t g_pcie_copies;        /* copies made before it (the probe's) */

/* 1 if this acquisition is the one to fail. */
static int fail_now(void) { return ++g_calls == g_fail_at; }

/* Whether an injected failure has happened in this placement. */
static int failed(void)
{
    return (g_fail_at && g_calls >= g_fail_at) || (g_fail_copy_at && g_copies >= g_fail_copy_at);
}

static void *w_alloc(ft_backend *be, size_t bytes)
{
    if (fail_now()) return NULL;
    void *p = g_orig->alloc(be, bytes);
    if (p && bytes == FT_PROBE_PCIE_DEFAULT_BYTES && !g_pcie_at) {
        g_pcie_at = g_calls;
        g_pcie_copies = g_copies;
    }
    g_live += p != NULL;
    return p;
}

static void w_free(ft_backend *be, void *p)
{
    g_live -= p != NULL;
    g_orig->free(be, p);
}

static void *w_host_alloc(ft_backend *be, size_t bytes)
{
    if (fail_now()) return NULL;
    void *p = g_orig->host_alloc(be, bytes);
    g_live += p != NULL;
    return p;
}

static void w_host_free(ft_backend *be, void *p)
{
    g_live -= p != NULL;
    g_orig->host_free(be, p);
}

static int w_host_register(ft_backend *be, void *p, size_t bytes)
{
    if (fail_now()) return ft_err(-ENOMEM, "injected: cannot page-lock %zu bytes", bytes);
    int rc = g_orig->host_register(be, p, bytes);
    g_live += rc == 0;
    return rc;
}

static void w_host_unregister(ft_backend *be, void *p)
{
    g_live -= p != NULL;
    g_orig->host_unregister(be, p);
}

/* Once the injected failure happened, every event fails with a message of its own, as a
 * sticky device error would (the executor's free drains the H2D lane through events). */
static int w_event_record(ft_backend *be, int ev, int lane)
{
    if (failed()) return ft_err(-EIO, NOISE);
    return g_orig->event_record(be, ev, lane);
}

static int w_event_sync(ft_backend *be, int ev)
{
    if (failed()) return ft_err(-EIO, NOISE);
    return g_orig->event_sync(be, ev);
}

/* The PCIe probe's 256 MiB copies shortened to 1 MiB: its rates do not matter here, and
 * each placement would otherwise spend a second copying. */
static int w_copy_async(ft_backend *be, int lane, void *dst, const void *src, size_t bytes)
{
    size_t n = bytes == FT_PROBE_PCIE_DEFAULT_BYTES ? (size_t)1 << 20 : bytes;
    return g_orig->copy_async(be, lane, dst, src, n);
}

static int w_copy(ft_backend *be, void *dst, const void *src, size_t bytes)
{
    if (++g_copies == g_fail_copy_at)
        return ft_err(-EIO, "injected: copy %lld fails", (long long)g_copies);
    return g_orig->copy(be, dst, src, bytes);
}

/* One placement with acquisition fail_at and copy fail_copy_at failing (0: none); returns
 * its status. */
static int place(ft_backend *be, const ft_model *m, ft_lora *lora, ft_pack_file *pack,
                 const ft_place_opts *po, int64_t fail_at, int64_t fail_copy_at, ft_exec *e,
                 ft_place_result *res)
{
    g_calls = g_copies = 0;
    g_fail_at = fail_at;
    g_fail_copy_at = fail_copy_at;
    ft_err_clear();
    memset(e, 0x5a, sizeof *e); /* the caller's executor is garbage before the call */
    return ft_place_packed(be, m, lora, pack, po, 1, e, res);
}

/* After a failed placement: nothing more held than before, the failure's own message, and
 * *e zeroed when the failure came during or after the executor's init (init_from: the
 * acquisition or copy number where that init starts). Returns 1 for the latter. */
static int check_failed(int rc, const char *what, int64_t n, int64_t n_total, int64_t live0,
                        const ft_exec *e, int64_t init_from)
{
    static const ft_exec zero;
    printf("%s %lld of %lld fails: rc %d, %lld still held: %s\n", what, (long long)n,
           (long long)n_total, rc, (long long)(g_live - live0), ft_errmsg());
    assert_true(rc < 0);
    assert_int_equal(g_live, live0);
    assert_true(ft_errmsg()[0] != 0);
    assert_null(strstr(ft_errmsg(), NOISE));
    if (n < init_from) return 0;
    assert_memory_equal(e, &zero, sizeof *e);
    return 1;
}

static void test_place_failures(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    g_orig = be->ops;
    assert_non_null(g_orig->host_alloc);
    assert_non_null(g_orig->host_register);
    ft_backend_ops ops = *g_orig;
    ops.alloc = w_alloc;
    ops.free = w_free;
    ops.host_alloc = w_host_alloc;
    ops.host_free = w_host_free;
    ops.host_register = w_host_register;
    ops.host_unregister = w_host_unregister;
    ops.event_record = w_event_record;
    ops.event_sync = w_event_sync;
    ops.copy_async = w_copy_async;
    ops.copy = w_copy;
    be->ops = &ops;

    ft_model *m;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    stream_pack sp;
    stream_pack_open(&sp, TINY);
    ft_batch b[1];
    stream_make_batches(b, 1, 24, m->cfg.vocab_size);
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.0f);
    ft_place_opts po = {b[0].T, b[0].seq_len, 1, 0, 0, b[0].pos, b[0].seq_start};
    ft_place_result *res = calloc(1, sizeof *res);
    assert_non_null(res);
    ft_exec e;

    /* a successful placement: how many acquisitions and copies, and where the PCIe probe's
     * are (the executor's init follows them: its first acquisition and copy come after) */
    int64_t live0 = g_live;
    int rc = place(be, m, &lora, sp.pack, &po, 0, 0, &e, res);
    if (rc) printf("place: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    int64_t n_acq = g_calls, n_copies = g_copies;
    assert_true(g_pcie_at > 0 && g_pcie_at + 2 <= n_acq);
    ft_exec_free(&e);
    assert_int_equal(g_live, live0);
    int64_t acq_init = g_pcie_at + 2, copy_init = g_pcie_copies + 1;
    assert_true(copy_init <= n_copies);

    /* each acquisition: the probe's (its executor's init, then its layer's buffers), the
     * PCIe probe's two, and from the executor's init on */
    int64_t n_fail = 0, n_after_init = 0;
    for (int64_t n = 1; n <= n_acq; n++, n_fail++) {
        rc = place(be, m, &lora, sp.pack, &po, n, 0, &e, res);
        n_after_init += check_failed(rc, "acquisition", n, n_acq, live0, &e, acq_init);
    }
    /* each copy; those after the pinned staging is taken fail with it held, and freeing it
     * drains the copy lane through events (which fail after the injected failure) */
    for (int64_t n = 1; n <= n_copies; n++, n_fail++) {
        rc = place(be, m, &lora, sp.pack, &po, 0, n, &e, res);
        n_after_init += check_failed(rc, "copy", n, n_copies, live0, &e, copy_init);
    }
    printf("%lld failing placements (%lld of them at or after the executor's init); %lld "
           "acquisitions and %lld copies in a successful one\n", (long long)n_fail,
           (long long)n_after_init, (long long)n_acq, (long long)n_copies);
    assert_true(n_after_init >= 4);

    free(res);
    ft_lora_free(&lora);
    stream_free_batches(b, 1);
    stream_pack_close(&sp);
    ft_model_free(m);
    be->ops = g_orig;
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_place_failures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
