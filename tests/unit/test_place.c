/* test_place.c - offload/place.h ft_place_packed when something fails, on the CPU backend in
 * device mode (ft_backend_cpu_device_init, as tests/unit/test_tiers.c): the backend's table
 * is copied with entries wrapped, so that the n-th acquisition (alloc, host_alloc,
 * host_register) or the n-th copy fails, and every live acquisition is counted. For each n
 * up to the last of a successful placement, the call returns the error, the backend holds
 * what it held before (the probe, the executor's init and the calls after it freed what they
 * took: the trainer frees the executor only on success), *ex is zeroed when the failure came
 * during or after the executor's init, and the message is the failure's, not one recorded
 * while freeing (after the failure every event fails, as with a sticky device error, and the
 * executor's free drains its copy lane with events while the pinned staging is held).
 * And ft_place_preview, the plan of a pack not built yet, against the built pack's. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/place.h"
#include "offload/probe.h"
#include "src/core/err.h"
#include "src/tools/init_model.h"
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

/* ---- a pack not built yet ------------------------------------------------------------------ */

/* The plans of an existing pack (a) and of the same pack not built yet (b): the same tiers,
 * prefetch, staging, micro-batches, checkpoints and memory (the probes' times may differ). */
static void same_plan(const ft_place_result *a, const ft_place_result *b)
{
    const ft_plan *p = &a->plan, *q = &b->plan;
    assert_int_equal(p->n_layers, q->n_layers);
    assert_memory_equal(p->tier, q->tier, (size_t)p->n_layers);
    for (int t = 0; t < 3; t++) assert_int_equal(p->n_tier[t], q->n_tier[t]);
    assert_int_equal(p->prefetch_depth, q->prefetch_depth);
    assert_int_equal(p->host_slots, q->host_slots);
    assert_int_equal(p->micro_batches, q->micro_batches);
    assert_int_equal(p->ckpt_tier, q->ckpt_tier);
    assert_int_equal(p->ckpt_dev_layers, q->ckpt_dev_layers);
    assert_int_equal(p->ckpt_sets, q->ckpt_sets);
    assert_int_equal(p->keep_acts, q->keep_acts);
    assert_int_equal(p->gpu_bytes, q->gpu_bytes);
    assert_int_equal(p->host_bytes, q->host_bytes);
    assert_int_equal(a->in.layer_bytes, b->in.layer_bytes);
    assert_int_equal(a->in.slot_bytes, b->in.slot_bytes);
    assert_int_equal(a->in.gpu_fixed, b->in.gpu_fixed);
    assert_int_equal(a->in.kept_bytes, b->in.kept_bytes);
    assert_int_equal(a->in.ckpt_bytes, b->in.ckpt_bytes);
    assert_int_equal(a->pack_bytes, b->pack_bytes);
}

/* ft_place_preview (`ftune plan` before the pack is built: a probe pack of layer 0's block and
 * the layout's block sizes) against ft_place_packed with the built pack, for the same budgets:
 * every layer on the GPU; some streamed from pinned host memory; most on NVMe, where the
 * preview times a read of the model's safetensors instead of the pack (the predicted times
 * differ, the plan not), or assumes FT_PLACE_DISK_ASSUMED with no file; a budget too small is
 * refused with the same message, naming the same smallest --gpu-mem and --host-mem. */
static void test_place_preview(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    char *dir = t_tmpdir(), cfgp[600], model[600], c1[600], c2[600];
    snprintf(cfgp, sizeof cfgp, "%s/arch.json", dir);
    FILE *f = fopen(cfgp, "w");
    assert_non_null(f);
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 256, "
          "\"num_hidden_layers\": 8, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
          "\"vocab_size\": 500, \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-5}", f);
    fclose(f);
    snprintf(model, sizeof model, "%s/m", dir);
    snprintf(c1, sizeof c1, "%s/built", dir);
    snprintf(c2, sizeof c2, "%s/none", dir);
    ft_init_cfg ic = {cfgp, model, 5, 0, 1, 0, NULL};
    ft_init_result ir;
    assert_int_equal(ft_init_model(&ic, &ir), 0);
    ft_model *m; /* as the trainer has it: shapes, no weights */
    assert_int_equal(ft_model_load_deferred(&m, model), 0);
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info bi, li;
    assert_int_equal(ft_pack_ensure(model, c1, &ps, 0, &bi), 0);
    ft_pack_file *pack;
    assert_int_equal(ft_pack_open(&pack, bi.path, 1), 0);
    assert_int_equal(ft_pack_locate(model, c2, &ps, &li), 0);
    assert_int_equal(li.action, FT_PACK_BUILT);
    ft_pack_preview pv;
    assert_int_equal(ft_pack_preview_make(model, NULL, li.path, &ps, 1, &pv), 0);
    ft_place_nopack np = {pv.probe, pv.block_bytes, pv.disk_file, pv.disk_same_device};

    ft_batch b[1];
    stream_make_batches(b, 1, 24, m->cfg.vocab_size);
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.0f);
    ft_place_result *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
    assert_true(ra && rb);
    const uint64_t big = (uint64_t)64 << 30, MiB = (uint64_t)1 << 20;
    /* refused: the same message from both */
    ft_place_opts po = {b[0].T, b[0].seq_len, 1, MiB, MiB, b[0].pos, b[0].seq_start};
    assert_int_equal(ft_place_packed(be, m, &lora, pack, &po, 0, NULL, ra), FT_E_RANGE);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ft_errmsg());
    assert_int_equal(ft_place_preview(be, m, &lora, &np, &po, rb), FT_E_RANGE);
    printf("refused: %s\n", msg);
    assert_string_equal(msg, ft_errmsg());
    assert_non_null(strstr(msg, "needs at least --gpu-mem"));
    uint64_t g, h;
    ft_plan_min_budgets(&ra->in, &g, &h);
    const uint64_t lb = ra->in.layer_bytes;
    /* all on the GPU; 3 layers more than the fewest on the GPU, the rest in host memory; the
     * smallest budgets (NVMe) */
    const uint64_t budgets[][2] = {{big, big}, {g + 3 * lb, big}, {g, h}};
    for (int k = 0; k < 3; k++) {
        po.gpu_budget = budgets[k][0];
        po.host_budget = budgets[k][1];
        int rc = ft_place_packed(be, m, &lora, pack, &po, 0, NULL, ra);
        if (rc) printf("packed: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        rc = ft_place_preview(be, m, &lora, &np, &po, rb);
        if (rc) printf("preview: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        printf("budgets %llu/%llu: tiers %lld/%lld/%lld; disk %.2f GB/s (%s) vs %.2f GB/s (%s; %s)\n%s",
               (unsigned long long)po.gpu_budget, (unsigned long long)po.host_budget,
               (long long)rb->plan.n_tier[0], (long long)rb->plan.n_tier[1], (long long)rb->plan.n_tier[2],
               ra->disk_rate / 1e9, ra->disk_mode, rb->disk_rate / 1e9, rb->disk_mode, rb->disk_source,
               rb->text);
        same_plan(ra, rb);
        assert_int_equal(rb->plan.n_tier[0] == 8, k == 0);
        if (k == 1) assert_true(rb->plan.n_tier[1] > 0 && rb->plan.n_tier[2] == 0);
        if (k == 2) {
            assert_true(rb->plan.n_tier[2] > 0);
            assert_true(ra->disk_rate > 0 && rb->disk_rate > 0 && !ra->disk_source[0]);
            assert_non_null(strstr(rb->disk_source, "model.safetensors read instead"));
            /* nothing to read: the stated assumption */
            ft_place_nopack nf = np;
            nf.disk_file = NULL;
            assert_int_equal(ft_place_preview(be, m, &lora, &nf, &po, rb), 0);
            same_plan(ra, rb);
            assert_true(rb->disk_rate == FT_PLACE_DISK_ASSUMED);
            assert_non_null(strstr(rb->disk_source, "assumed 1.50 GB/s"));
        } else {
            assert_true(rb->disk_rate == 0 && !rb->disk_source[0]);
        }
    }
    /* a probe pack of another model is refused */
    ft_model_config keep = m->cfg;
    m->cfg.num_hidden_layers = 7;
    assert_int_equal(ft_place_preview(be, m, &lora, &np, &po, rb), FT_E_INVALID);
    m->cfg = keep;
    free(ra);
    free(rb);
    ft_lora_free(&lora);
    stream_free_batches(b, 1);
    ft_pack_preview_free(&pv);
    ft_pack_close(pack);
    ft_model_free(m);
    ft_backend_free(be);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", c2);
    assert_int_equal(system(cmd), 0); /* the preview left nothing in its cache folder */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_place_failures),
                                       cmocka_unit_test(test_place_preview)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
