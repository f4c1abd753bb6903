/* test_plan.c - the offload planner (offload/plan.c) on Llama-3-70B-like sizes: 80 NF4 layers
 * of 0.45 GB, 10 GiB of fixed device memory, fp32 layer-input checkpoints of 2048 tokens,
 * H2D 25 GB/s, NVMe 3 GB/s, 12 ms per layer forward at 2048 tokens. Checks the placement
 * rules, the memory formula against the budgets, the exact minimum budgets, that the step
 * time model never predicts faster for more streaming, the micro-batch pick, the host
 * backend case and bad input. No timing is measured: every number is a model output. */
#include "tests/unit/harness.h"

#include "offload/plan.h"
#include "src/core/err.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024ull * 1024ull)
#define REL_EPS 1e-9 /* model outputs compared with each other: float sums of the same terms */

static uint64_t gib_b(double g) { return (uint64_t)(g * GIB); }

static ft_plan_in in70(void)
{
    ft_plan_in in;
    memset(&in, 0, sizeof in);
    in.n_layers = 80;
    in.layer_bytes = 450000000;
    in.slot_bytes = 450000000;
    in.packed = 1;
    in.device = 1;
    in.gpu_fixed = gib_b(10);
    in.ckpt_bytes = 2048ull * 8192 * 4;             /* fp32 hidden state of one micro-batch */
    in.per_micro_bytes = 2048ull * 8192 * 4 + 65536; /* dx + ids, targets, positions */
    in.kept_bytes = 900000000;
    in.host_fixed = gib_b(3);
    in.t_fwd_layer = 0.012;
    in.t_bwd_layer = 0.024;
    in.t_head = 0.03;
    in.tokens_per_micro = 2048;
    in.gpu_budget = gib_b(24);
    in.host_budget = gib_b(48);
    in.rates.h2d = 25e9;
    in.rates.d2h = 25e9;
    in.rates.disk = 3e9;
    return in;
}

/* Compute seconds of one step with every layer resident (the header's formula): per layer
 * a forward and a backward visit, each paying t_visit once for its m micro-batches. */
static double compute_s(const ft_plan_in *in, int64_t m, int keep)
{
    double f = in->t_fwd_layer, b = in->t_bwd_layer, v = in->t_visit;
    return (double)in->n_layers * 2 * v +
           (double)m * ((double)in->n_layers * (f + (keep ? 0 : f) + b) + in->t_head);
}

/* Layers whose checkpoints have a host home in a plan (plan.h). */
static uint64_t ckpt_host_layers(const ft_plan_in *in, const ft_plan *p)
{
    int64_t n = in->n_layers - p->ckpt_dev_layers - (p->ckpt_sets - 1);
    return p->ckpt_tier == FT_TIER_HOST && n > 0 ? (uint64_t)n : 0;
}

/* Device bytes of a plan by the documented formula. */
static uint64_t gpu_formula(const ft_plan_in *in, const ft_plan *p)
{
    uint64_t L = (uint64_t)in->n_layers, m = (uint64_t)p->micro_batches;
    uint64_t g = in->gpu_fixed + (uint64_t)p->n_tier[FT_TIER_GPU] * in->layer_bytes +
                 (uint64_t)p->prefetch_depth * in->slot_bytes + m * in->per_micro_bytes;
    g += p->ckpt_tier == FT_TIER_GPU ? (L + 1) * m * in->ckpt_bytes
                                     : (uint64_t)(p->ckpt_dev_layers + p->ckpt_sets) * m * in->ckpt_bytes;
    if (p->keep_acts) g += L * m * in->kept_bytes;
    return g;
}

static uint64_t host_formula(const ft_plan_in *in, const ft_plan *p)
{
    uint64_t L = (uint64_t)in->n_layers, m = (uint64_t)p->micro_batches;
    uint64_t h = ((uint64_t)p->n_tier[FT_TIER_HOST] + (uint64_t)p->host_slots) * in->layer_bytes;
    (void)L;
    h += ckpt_host_layers(in, p) * m * in->ckpt_bytes;
    return in->device ? h : 0;
}

static void check_consistent(const ft_plan_in *in, const ft_plan *p)
{
    int64_t n[3] = {0, 0, 0};
    for (int64_t l = 0; l < p->n_layers; l++) {
        assert_true(p->tier[l] <= FT_TIER_DISK);
        n[p->tier[l]]++;
    }
    assert_int_equal(p->n_layers, in->n_layers);
    for (int t = 0; t < 3; t++) assert_int_equal(n[t], p->n_tier[t]);
    assert_true(p->gpu_bytes <= in->gpu_budget);
    assert_true(p->host_bytes <= in->host_budget);
    assert_true(p->gpu_bytes == gpu_formula(in, p));
    assert_true(p->host_bytes == host_formula(in, p));
    int64_t streamed = n[1] + n[2];
    assert_int_equal(p->prefetch_depth, streamed == 0 ? 0 : 2);
    if (!(in->rates.d2h > 0)) assert_int_equal(p->ckpt_tier, FT_TIER_GPU);
    uint64_t m = (uint64_t)p->micro_batches, all = (uint64_t)(in->n_layers + 1) * m * in->ckpt_bytes;
    if (p->ckpt_tier == FT_TIER_HOST) {
        /* two sets; the device memory left keeps the last layers' checkpoints, up to L - 2 */
        assert_int_equal(p->ckpt_sets, 2);
        int64_t e_max = in->n_layers > 2 ? in->n_layers - 2 : 0;
        assert_true(p->ckpt_dev_layers >= 0 && p->ckpt_dev_layers <= e_max);
        if (p->ckpt_dev_layers < in->n_layers - 2)
            assert_true(p->gpu_bytes + m * in->ckpt_bytes > in->gpu_budget);
        assert_int_equal(p->ckpt_host_layers, (int64_t)ckpt_host_layers(in, p));
        assert_true(p->ckpt_gpu_bytes == (uint64_t)(p->ckpt_dev_layers + 2) * m * in->ckpt_bytes);
        assert_true(p->ckpt_host_bytes == ckpt_host_layers(in, p) * m * in->ckpt_bytes);
        assert_true(p->ckpt_freed_bytes == (all > p->ckpt_gpu_bytes ? all - p->ckpt_gpu_bytes : 0));
    } else {
        assert_true(p->ckpt_gpu_bytes == all);
        assert_true(p->ckpt_host_bytes == 0 && p->ckpt_freed_bytes == 0 && p->t_d2h == 0);
    }
    assert_true(p->t_step >= p->t_d2h * (1 - REL_EPS));
    assert_int_equal(p->host_slots, in->device && n[2] ? (n[2] < 3 ? n[2] : 3) : 0);
    if (!in->packed) assert_int_equal(n[2], 0);
    if (!in->device) {
        assert_int_equal(n[1], 0);
        assert_int_equal(p->ckpt_tier, FT_TIER_GPU);
    }
    /* resident layers are the last ones */
    for (int64_t l = 0; l < p->n_layers; l++)
        assert_int_equal(p->tier[l] == FT_TIER_GPU, l >= p->n_layers - n[0]);
    assert_true(p->t_step > 0 && isfinite(p->t_step));
    assert_true(p->t_step >= p->t_compute * (1 - REL_EPS));
    assert_true(p->t_step >= p->t_h2d * (1 - REL_EPS));
    assert_true(p->t_step >= p->t_disk * (1 - REL_EPS));
    assert_true(fabs(p->t_compute - compute_s(in, p->micro_batches, p->keep_acts)) <= REL_EPS * p->t_compute);
    assert_true(fabs(p->tokens_per_s - (double)p->micro_batches * (double)in->tokens_per_micro / p->t_step) <=
                REL_EPS * p->tokens_per_s);
    assert_true(fabs(ft_plan_step_seconds(in, p) - p->t_step) <= REL_EPS * p->t_step);
    assert_non_null(p->bound);
}

static void print_plan(const char *what, const ft_plan_in *in, const ft_plan *p)
{
    char buf[1024];
    ft_plan_format(in, p, buf, sizeof buf);
    printf("%s:\n%s", what, buf);
}

static void test_everything_fits(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.gpu_budget = gib_b(80);
    in.micro_batches = 2;
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("80 GiB GPU", &in, &p);
    check_consistent(&in, &p);
    assert_int_equal(p.n_tier[FT_TIER_GPU], 80);
    assert_int_equal(p.prefetch_depth, 0);
    assert_int_equal(p.host_slots, 0);
    assert_int_equal(p.ckpt_tier, FT_TIER_GPU);
    assert_int_equal(p.keep_acts, 0); /* 80 x 2 x 0.9 GB of activations do not fit */
    assert_int_equal(p.host_bytes, 0);
    assert_string_equal(p.bound, "compute");
    assert_true(p.t_h2d == 0 && p.t_disk == 0);
    assert_true(fabs(p.t_step - compute_s(&in, 2, 0)) <= REL_EPS * p.t_step);

    /* a small model whose activations fit: kept, no recompute */
    in.n_layers = 16;
    in.layer_bytes = in.slot_bytes = 50000000;
    in.kept_bytes = 100000000;
    in.gpu_fixed = gib_b(4);
    assert_int_equal(ft_plan_make(&in, &p), 0);
    check_consistent(&in, &p);
    assert_int_equal(p.keep_acts, 1);
    assert_true(fabs(p.t_step - compute_s(&in, 2, 1)) <= REL_EPS * p.t_step);
    assert_true(p.t_step < compute_s(&in, 2, 0));

    /* a per-visit binding time (NF4 dequantization): paid by the forward and the backward
     * visit of each layer, once for both micro-batches; kept activations or recomputed */
    in.t_visit = 0.0015;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.keep_acts, 1);
    assert_true(fabs(p.t_step - compute_s(&in, 2, 1)) <= REL_EPS * p.t_step);
    assert_true(fabs(p.t_compute - compute_s(&in, 2, 1)) <= REL_EPS * p.t_step);
    in.kept_bytes = 0;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.keep_acts, 0);
    assert_true(fabs(p.t_step - compute_s(&in, 2, 0)) <= REL_EPS * p.t_step);
    in.t_visit = -1;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "per-visit time"));

    /* no h2d rate is needed when nothing streams */
    in = in70();
    in.gpu_budget = gib_b(80);
    in.rates.h2d = in.rates.d2h = in.rates.disk = 0;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.n_tier[FT_TIER_GPU], 80);
}

static void test_small_gpu_uses_host_tier(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    for (int64_t m = 1; m <= 2; m++) {
        in.micro_batches = m;
        ft_plan p;
        assert_int_equal(ft_plan_make(&in, &p), 0);
        print_plan("24 GiB GPU, 48 GiB host", &in, &p);
        check_consistent(&in, &p);
        int64_t k = p.n_tier[FT_TIER_GPU];
        assert_true(k > 0 && k < 80);
        assert_int_equal(p.n_tier[FT_TIER_HOST], 80 - k);
        assert_int_equal(p.n_tier[FT_TIER_DISK], 0);
        assert_int_equal(p.tier[79], FT_TIER_GPU);
        assert_int_equal(p.tier[0], FT_TIER_HOST);
        assert_int_equal(p.prefetch_depth, 2);
        assert_true(p.t_h2d > 0);
        /* greedy: no room for one more resident layer */
        assert_true(p.gpu_bytes + in.layer_bytes > in.gpu_budget);
    }
    /* without a d2h rate the checkpoints cannot go to the host: they stay on the GPU */
    in.rates.d2h = 0;
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    check_consistent(&in, &p);
    assert_int_equal(p.ckpt_tier, FT_TIER_GPU);
}

/* ckpt_host_last_resort: checkpoints stay on the device whenever a plan with them there fits,
 * even when host checkpoints would be faster; when none fits, the host plan is taken. */
static void test_host_checkpoints_last_resort(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.micro_batches = 2;
    in.ckpt_host_last_resort = 1;
    ft_plan p, free_choice, dev;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.ckpt_tier, FT_TIER_GPU);
    in.ckpt_host_last_resort = 0;
    assert_int_equal(ft_plan_make(&in, &free_choice), 0);
    assert_int_equal(free_choice.ckpt_tier, FT_TIER_HOST); /* faster, but not taken above */
    /* the largest GPU budget (0.25 GiB steps) where only host checkpoints fit */
    int found = 0;
    for (uint64_t b = in.gpu_budget; b > ((uint64_t)4 << 30) && !found; b -= (uint64_t)1 << 28) {
        ft_plan_in t = in;
        t.gpu_budget = b;
        t.rates.d2h = 0;
        if (ft_plan_make(&t, &dev) == 0) continue;
        ft_err_clear();
        t.rates.d2h = in.rates.d2h;
        if (ft_plan_make(&t, &free_choice) != 0) {
            ft_err_clear();
            break; /* nothing fits at all below here */
        }
        t.ckpt_host_last_resort = 1;
        assert_int_equal(ft_plan_make(&t, &p), 0);
        assert_int_equal(p.ckpt_tier, FT_TIER_HOST);
        printf("--gpu-mem %.2f GiB: only host checkpoints fit; last resort takes them (%.4f s/step)\n",
               (double)b / (1 << 30), p.t_step);
        found = 1;
    }
    assert_true(found);
}

/* A tight --gpu-mem: the checkpoints go to pinned host memory, and the device memory they
 * free holds more layers; the predicted step counts their traffic exactly (a store of every
 * host checkpoint after its forward visit, a load before its backward visit) inside the
 * recurrence, overlapped with compute, and slower D2H never predicts faster. */
static void test_host_checkpoints(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.micro_batches = 2;
    ft_plan p, q;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("24 GiB GPU, 2 micro-batches", &in, &p);
    check_consistent(&in, &p);
    assert_int_equal(p.ckpt_tier, FT_TIER_HOST);
    assert_true(p.ckpt_host_layers > 0 && p.ckpt_freed_bytes > 0);
    char buf[1024];
    ft_plan_format(&in, &p, buf, sizeof buf);
    assert_non_null(strstr(buf, "checkpoints in pinned host memory: layers 0-"));
    assert_non_null(strstr(buf, "GiB of GPU memory freed"));
    /* the same budget without host checkpoints: fewer resident layers, never faster (with one
     * micro-batch, PCIe-bound: slower) */
    for (int64_t m = 1; m <= 2; m++) {
        in.micro_batches = m;
        ft_plan ph;
        assert_int_equal(ft_plan_make(&in, &ph), 0);
        in.rates.d2h = 0;
        assert_int_equal(ft_plan_make(&in, &q), 0);
        in.rates.d2h = 25e9;
        check_consistent(&in, &q);
        printf("%lld micro-batches: host checkpoints %.4f s/step with %lld GPU layers, device "
               "checkpoints %.4f s/step with %lld\n", (long long)m, ph.t_step,
               (long long)ph.n_tier[FT_TIER_GPU], q.t_step, (long long)q.n_tier[FT_TIER_GPU]);
        assert_int_equal(ph.ckpt_tier, FT_TIER_HOST);
        assert_int_equal(q.ckpt_tier, FT_TIER_GPU);
        assert_true(ph.n_tier[FT_TIER_GPU] > q.n_tier[FT_TIER_GPU]);
        assert_true(ph.t_step <= q.t_step * (1 + REL_EPS));
        if (m == 1) assert_true(ph.t_step < q.t_step);
    }
    /* the traffic, exactly: weights of the streamed layers (2s - 1 visits fetch: layer 0 is
     * still in its slot from the previous backward) and the stored checkpoints each way */
    double ck = (double)p.micro_batches * (double)in.ckpt_bytes, x = (double)in.layer_bytes / in.rates.h2d;
    int64_t s = p.n_tier[FT_TIER_HOST], n_st = p.ckpt_host_layers;
    double want_d2h = (double)n_st * ck / in.rates.d2h;
    double want_h2d = (double)(2 * s - 1) * x + (double)n_st * ck / in.rates.h2d;
    printf("t_step %.4f s: compute %.4f, H2D %.4f (expected %.4f), D2H %.4f (expected %.4f)\n", p.t_step,
           p.t_compute, p.t_h2d, want_h2d, p.t_d2h, want_d2h);
    assert_true(fabs(p.t_d2h - want_d2h) <= REL_EPS * want_d2h);
    assert_true(fabs(p.t_h2d - want_h2d) <= REL_EPS * want_h2d);
    /* overlapped: well under the sum of the lanes; never faster than without the traffic */
    assert_true(p.t_step < p.t_compute + p.t_h2d + p.t_d2h);
    q = p;
    q.ckpt_tier = FT_TIER_GPU;
    assert_true(p.t_step >= ft_plan_step_seconds(&in, &q) * (1 - REL_EPS));
    /* keeping more checkpoint layers on the device never predicts slower */
    double prev = p.t_step;
    for (q = p; q.ckpt_dev_layers < 78; q.ckpt_dev_layers++) {
        double t = ft_plan_step_seconds(&in, &q);
        assert_true(t <= prev * (1 + REL_EPS));
        prev = t;
    }
    /* slower stores never predict faster; very slow ones bound the step */
    prev = p.t_step;
    for (double d2h = 24e9; d2h >= 1e9; d2h -= 1e9) {
        in.rates.d2h = d2h;
        double t = ft_plan_step_seconds(&in, &p);
        assert_true(t >= prev * (1 - REL_EPS));
        prev = t;
    }
    in.rates.d2h = 0.2e9;
    assert_true(ft_plan_step_seconds(&in, &p) >= (double)n_st * ck / 0.2e9);
    /* forced host checkpoints (FTUNE_CKPT_HOST=1) on a GPU that holds everything: all but the
     * minimum kept on the device, one layer's through the host */
    in = in70();
    in.gpu_budget = gib_b(80);
    in.micro_batches = 2;
    in.ckpt_host_only = 1;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("80 GiB GPU, host checkpoints forced", &in, &p);
    check_consistent(&in, &p);
    assert_int_equal(p.ckpt_tier, FT_TIER_HOST);
    assert_int_equal(p.n_tier[FT_TIER_GPU], 80);
    assert_int_equal(p.ckpt_dev_layers, 78);
    assert_int_equal(p.ckpt_host_layers, 1);
    assert_true(p.t_d2h > 0);
    /* forced, but without a d2h rate: they stay on the device */
    in.rates.d2h = 0;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.ckpt_tier, FT_TIER_GPU);
}

static void test_small_host_uses_nvme(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.host_budget = gib_b(8);
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("24 GiB GPU, 8 GiB host", &in, &p);
    check_consistent(&in, &p);
    assert_true(p.n_tier[FT_TIER_DISK] > 0);
    assert_true(p.n_tier[FT_TIER_HOST] > 0);
    assert_int_equal(p.host_slots, 3);
    assert_true(p.t_disk > 0);
    assert_string_equal(p.bound, "disk");
    /* the pool is full: one more pool layer would not fit */
    assert_true(p.host_bytes + in.layer_bytes > in.host_budget);

    /* not packed: no NVMe tier, refused, naming both budgets */
    in.packed = 0;
    ft_err_clear();
    assert_int_equal(ft_plan_make(&in, &p), FT_E_RANGE);
    printf("%s\n", ft_errmsg());
    assert_non_null(strstr(ft_errmsg(), "--gpu-mem"));
    assert_non_null(strstr(ft_errmsg(), "--host-mem"));
}

/* The value after "flag " in the message, in GiB (-1 if absent). */
static double msg_gib(const char *msg, const char *flag)
{
    const char *s = strstr(msg, flag);
    double v = -1;
    if (s && sscanf(s + strlen(flag), " %lfG", &v) != 1) v = -1;
    return v;
}

static void check_min_budgets(ft_plan_in in)
{
    uint64_t g, h;
    ft_plan_min_budgets(&in, &g, &h);
    assert_true(g > 0);
    ft_plan p;
    in.gpu_budget = g;
    in.host_budget = h;
    int rc = ft_plan_make(&in, &p);
    if (rc) printf("%s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    check_consistent(&in, &p);
    in.gpu_budget = g - MIB;
    ft_err_clear();
    assert_int_equal(ft_plan_make(&in, &p), FT_E_RANGE);
    const char *least = strstr(ft_errmsg(), "at least");
    assert_non_null(least);
    double mg = msg_gib(least, "--gpu-mem"), mh2 = msg_gib(least, "--host-mem");
    /* the printed budgets are enough and at most 0.1 GiB above the minimum */
    assert_true(mg * GIB >= (double)g && mg * GIB < (double)g + 0.1 * GIB + 1);
    assert_true(mh2 * GIB >= (double)h && mh2 * GIB < (double)h + 0.1 * GIB + 1);
    if (h >= MIB) {
        in.gpu_budget = g;
        in.host_budget = h - MIB;
        assert_int_equal(ft_plan_make(&in, &p), FT_E_RANGE);
    }
}

static void test_min_budgets_exact(void **st)
{
    (void)st;
    for (int dev = 0; dev <= 1; dev++)
        for (int packed = 0; packed <= 1; packed++)
            for (int64_t m = 0; m <= 3; m += 3) {
                ft_plan_in in = in70();
                in.device = dev;
                in.packed = packed;
                in.micro_batches = m;
                check_min_budgets(in);
                /* tiny models, slots rounded above the layer size */
                for (int64_t L = 1; L <= 4; L++) {
                    in.n_layers = L;
                    in.slot_bytes = in.layer_bytes + 2 * MIB;
                    check_min_budgets(in);
                    in.ckpt_bytes = 0;
                    check_min_budgets(in);
                    in.ckpt_bytes = 2048ull * 8192 * 4;
                    in.rates.d2h = 0; /* checkpoints kept on the device */
                    check_min_budgets(in);
                    in.rates.d2h = 25e9;
                }
            }
    /* the smallest plan of the 70B streams everything with the checkpoints on the host */
    ft_plan_in in = in70();
    uint64_t g, h;
    ft_plan_min_budgets(&in, &g, &h);
    assert_true(g == in.gpu_fixed + 2 * in.slot_bytes + 2 * in.ckpt_bytes + in.per_micro_bytes);
    assert_true(h == 3 * in.layer_bytes + 79 * in.ckpt_bytes); /* layer 79's stays in its set */
    in.gpu_budget = g;
    in.host_budget = h;
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("70B at its minimum budgets", &in, &p);
    assert_int_equal(p.n_tier[FT_TIER_DISK], 80);
    assert_int_equal(p.ckpt_tier, FT_TIER_HOST);
    /* without host checkpoints (d2h unknown) they all stay on the device */
    in.rates.d2h = 0;
    ft_plan_min_budgets(&in, &g, &h);
    assert_true(g == in.gpu_fixed + 2 * in.slot_bytes + 81 * in.ckpt_bytes + in.per_micro_bytes);
    assert_true(h == 3 * in.layer_bytes);
    /* invalid input: 0, 0 */
    in.n_layers = 0;
    ft_plan_min_budgets(&in, &g, &h);
    assert_true(g == 0 && h == 0);
}

static void test_more_streaming_never_faster(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.micro_batches = 2;
    uint64_t g0, h0;
    ft_plan_min_budgets(&in, &g0, &h0);
    /* GPU budget from the minimum to everything resident */
    ft_plan prev, p;
    int have = 0;
    for (uint64_t G = g0; G <= gib_b(64); G += gib_b(0.5)) {
        in.gpu_budget = G;
        assert_int_equal(ft_plan_make(&in, &p), 0);
        check_consistent(&in, &p);
        if (have) {
            assert_true(p.t_step <= prev.t_step * (1 + REL_EPS));
        }
        prev = p;
        have = 1;
    }
    assert_int_equal(prev.n_tier[FT_TIER_GPU], 80);
    /* host budget from the minimum to every streamed layer in the pool */
    in.gpu_budget = gib_b(24);
    have = 0;
    for (uint64_t H = h0; H <= gib_b(48); H += gib_b(0.5)) {
        in.host_budget = H;
        if (ft_plan_make(&in, &p)) continue; /* below the minimum for this GPU budget */
        check_consistent(&in, &p);
        if (have) {
            assert_true(p.t_step <= prev.t_step * (1 + REL_EPS));
            assert_true(p.n_tier[FT_TIER_DISK] <= prev.n_tier[FT_TIER_DISK]);
        }
        prev = p;
        have = 1;
    }
    assert_true(have);
    assert_int_equal(prev.n_tier[FT_TIER_DISK], 0);
    /* one layer at a time, through ft_plan_step_seconds: GPU -> host -> NVMe */
    in.host_budget = gib_b(8);
    assert_int_equal(ft_plan_make(&in, &p), 0);
    double t = p.t_step;
    ft_plan q = p;
    for (int64_t l = 79; l >= 0; l--) {
        if (q.tier[l] != FT_TIER_GPU) continue;
        q.tier[l] = FT_TIER_HOST;
        q.n_tier[FT_TIER_GPU]--;
        q.n_tier[FT_TIER_HOST]++;
        double t2 = ft_plan_step_seconds(&in, &q);
        assert_true(t2 >= t * (1 - REL_EPS));
        t = t2;
    }
    for (int64_t l = 0; l < 80; l++) {
        if (q.tier[l] != FT_TIER_HOST) continue;
        q.tier[l] = FT_TIER_DISK;
        q.n_tier[FT_TIER_HOST]--;
        q.n_tier[FT_TIER_DISK]++;
        q.host_slots = 3;
        double t2 = ft_plan_step_seconds(&in, &q);
        assert_true(t2 >= t * (1 - REL_EPS));
        t = t2;
    }
    /* slower links never predict faster */
    in.host_budget = gib_b(48);
    assert_int_equal(ft_plan_make(&in, &p), 0);
    double last = p.t_step;
    for (double h2d = 20e9; h2d >= 2e9; h2d -= 2e9) {
        in.rates.h2d = in.rates.d2h = h2d;
        double t2 = ft_plan_step_seconds(&in, &p);
        assert_true(t2 >= last * (1 - REL_EPS));
        last = t2;
    }
}

/* in at copy rate h2d both ways (bytes/s), its minimum GPU budget and 64 GiB of host memory: a
 * plan in *p that streams all 80 layers from the host pool. */
static void plan_streamed(ft_plan_in *in, double h2d, ft_plan *p)
{
    in->rates.h2d = in->rates.d2h = h2d;
    uint64_t g, h;
    ft_plan_min_budgets(in, &g, &h);
    in->gpu_budget = g;
    in->host_budget = gib_b(64);
    assert_int_equal(ft_plan_make(in, p), 0);
    assert_int_equal(p->n_tier[FT_TIER_HOST], 80);
}

/* The pipeline formula: all layers streamed from the pool, no checkpoint traffic; the
 * recurrence is within one visit of the sum over visits of max(compute, copy). */
static void test_step_formula(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.ckpt_bytes = 0;
    in.micro_batches = 1;
    for (double h2d = 8e9; h2d <= 50e9; h2d += 6e9) {
        ft_plan p;
        plan_streamed(&in, h2d, &p);
        double x = (double)in.layer_bytes / h2d, cf = in.t_fwd_layer, cb = in.t_fwd_layer + in.t_bwd_layer;
        /* fetched per step: every visit but layer 0's forward and layer 79's backward,
         * which find their layer still in its slot */
        double sum = in.t_head + cf + cb + 79 * fmax(cf, x) + 79 * fmax(cb, x);
        printf("h2d %.0f GB/s: step %.4f s, sum of maxima %.4f s, bound %s\n", h2d / 1e9, p.t_step, sum,
               p.bound);
        assert_true(fabs(p.t_step - sum) <= fmax(x, cb) + REL_EPS);
        assert_true(fabs(p.t_h2d - 158 * x) <= REL_EPS * p.t_h2d);
        if (x <= cf) assert_true(fabs(p.t_step - p.t_compute) <= REL_EPS * p.t_step);
        /* the bound: the per-visit maxima summed by the lane that wins each visit */
        double sum_c = in.t_head + cf + cb + (x > cf ? 0 : 79 * cf) + (x > cb ? 0 : 79 * cb);
        double sum_p = (x > cf ? 79 * x : 0) + (x > cb ? 79 * x : 0);
        assert_string_equal(p.bound, sum_c >= sum_p ? "compute" : "PCIe");
    }
}

static void test_micro_batch_pick(void **st)
{
    (void)st;
    /* reachable: the pick is the smallest m at >= 0.9 of the compute-bound rate */
    for (double h2d = 8e9; h2d <= 32e9; h2d += 4e9) {
        ft_plan_in in = in70();
        in.rates.h2d = in.rates.d2h = h2d;
        ft_plan p, q;
        assert_int_equal(ft_plan_make(&in, &p), 0);
        check_consistent(&in, &p);
        printf("h2d %.0f GB/s: %lld micro-batches, %.3f of compute-bound\n", h2d / 1e9,
               (long long)p.micro_batches, p.t_compute / p.t_step);
        if (p.t_compute >= 0.9 * p.t_step) {
            for (int64_t m = 1; m < p.micro_batches; m++) {
                in.micro_batches = m;
                if (ft_plan_make(&in, &q) == 0) assert_true(q.t_compute < 0.9 * q.t_step);
            }
        }
        in.micro_batches = p.micro_batches;
        assert_int_equal(ft_plan_make(&in, &q), 0);
        assert_true(fabs(q.t_step - p.t_step) <= REL_EPS * p.t_step);
    }
    /* the 24 GiB / 48 GiB 70B at 25 GB/s reaches it */
    ft_plan_in in = in70();
    ft_plan p, q;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_true(p.t_compute >= 0.9 * p.t_step);
    /* unreachable (NVMe-bound with an 8 GiB pool): the best tokens/s over the counts */
    in.host_budget = gib_b(8);
    in.max_micro_batches = 6;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_true(p.t_compute < 0.9 * p.t_step);
    assert_true(p.micro_batches >= 1 && p.micro_batches <= 6);
    for (int64_t m = 1; m <= 6; m++) {
        in.micro_batches = m;
        if (ft_plan_make(&in, &q) == 0) assert_true(q.tokens_per_s <= p.tokens_per_s * (1 + REL_EPS));
    }
}

static void test_host_backend(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.device = 0;
    in.gpu_budget = gib_b(30);
    in.host_budget = 0;
    in.rates.h2d = in.rates.d2h = 0; /* nothing crosses PCIe: not needed */
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    print_plan("host backend, 30 GiB", &in, &p);
    check_consistent(&in, &p);
    assert_true(p.n_tier[FT_TIER_DISK] > 0 && p.n_tier[FT_TIER_GPU] > 0);
    assert_int_equal(p.n_tier[FT_TIER_HOST], 0);
    assert_int_equal(p.host_bytes, 0);
    assert_int_equal(p.host_slots, 0);
    assert_true(p.t_h2d == 0 && p.t_disk > 0);
    uint64_t g, h;
    ft_plan_min_budgets(&in, &g, &h);
    assert_int_equal(h, 0);
    /* everything resident */
    in.gpu_budget = gib_b(100);
    assert_int_equal(ft_plan_make(&in, &p), 0);
    assert_int_equal(p.n_tier[FT_TIER_GPU], 80);
    assert_true(p.t_disk == 0);
    /* unpacked: every layer must be resident */
    in.packed = 0;
    in.gpu_budget = gib_b(30);
    assert_int_equal(ft_plan_make(&in, &p), FT_E_RANGE);
    ft_plan_min_budgets(&in, &g, &h);
    assert_true(g >= in.gpu_fixed + 80 * in.layer_bytes);
}

static void test_bad_input(void **st)
{
    (void)st;
    ft_plan p;
    ft_plan_in in = in70();
    assert_int_equal(ft_plan_make(NULL, &p), FT_E_INVALID);
    assert_int_equal(ft_plan_make(&in, NULL), FT_E_INVALID);
    in.n_layers = 0;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in.n_layers = FT_PLAN_MAX_LAYERS + 1;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.layer_bytes = 0;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.tokens_per_micro = 0;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.slot_bytes = in.layer_bytes - 1;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.t_fwd_layer = 0; /* no time and no FLOPs */
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in.flops_fwd_layer = 1e12; /* FLOPs but no rate */
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    /* FLOPs and a rate: the same as the measured time */
    in.rates.flops = in.flops_fwd_layer / 0.012;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    ft_plan_in in2 = in70();
    ft_plan q;
    assert_int_equal(ft_plan_make(&in2, &q), 0);
    assert_true(fabs(p.t_step - q.t_step) <= REL_EPS * q.t_step);
    in = in70();
    in.t_bwd_layer = NAN;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.rates.disk = -1;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    in = in70();
    in.micro_batches = -1;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    /* streaming needed but no copy rate */
    in = in70();
    in.rates.h2d = 0;
    ft_err_clear();
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "h2d"));
    printf("%s\n", ft_errmsg());
    /* NVMe needed but no disk rate */
    in = in70();
    in.host_budget = gib_b(8);
    in.rates.disk = 0;
    assert_int_equal(ft_plan_make(&in, &p), FT_E_INVALID);
    /* inconsistent plans: NaN, not a crash */
    in = in70();
    assert_int_equal(ft_plan_make(&in, &p), 0);
    q = p;
    q.n_layers = 79;
    assert_true(isnan(ft_plan_step_seconds(&in, &q)));
    q = p;
    q.tier[0] = 7;
    assert_true(isnan(ft_plan_step_seconds(&in, &q)));
    q = p;
    q.prefetch_depth = 0;
    assert_true(isnan(ft_plan_step_seconds(&in, &q)));
    q = p;
    q.micro_batches = 0;
    assert_true(isnan(ft_plan_step_seconds(&in, &q)));
    assert_true(isnan(ft_plan_step_seconds(&in, NULL)));
}

static void test_format(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    ft_plan p;
    assert_int_equal(ft_plan_make(&in, &p), 0);
    char buf[1024], want[128];
    int n = ft_plan_format(&in, &p, buf, sizeof buf);
    assert_int_equal(n, (int)strlen(buf));
    int64_t k = p.n_tier[FT_TIER_GPU];
    snprintf(want, sizeof want, "80 layers: %lld on the GPU (%lld-79), %lld in pinned host memory (0-%lld)",
             (long long)k, (long long)(80 - k), (long long)(80 - k), (long long)(79 - k));
    assert_non_null(strstr(buf, want));
    snprintf(want, sizeof want, "%lld micro-batch", (long long)p.micro_batches);
    assert_non_null(strstr(buf, want));
    snprintf(want, sizeof want, "%s-bound", p.bound);
    assert_non_null(strstr(buf, want));
    snprintf(want, sizeof want, "%.3g s/step", p.t_step);
    assert_non_null(strstr(buf, want));
    assert_non_null(strstr(buf, "prefetch 2"));
    /* truncation */
    char small[16];
    n = ft_plan_format(&in, &p, small, sizeof small);
    assert_int_equal(n, 15);
    assert_int_equal(strlen(small), 15);
    assert_memory_equal(small, buf, 15);
}

/* forward_only (eval, logits, generation): a pass is the forward visits and the head; every
 * streamed layer is fetched once per pass, nothing is kept for or timed as a backward, the
 * checkpoints never go to the host, and the texts speak of forward passes. */
static void test_forward_only(void **st)
{
    (void)st;
    ft_plan_in in = in70();
    in.forward_only = 1;
    in.t_bwd_layer = 0;
    in.t_head = 0.01;
    in.micro_batches = 1;
    in.ckpt_bytes = 0;
    for (double h2d = 8e9; h2d <= 50e9; h2d += 14e9) {
        ft_plan p;
        plan_streamed(&in, h2d, &p);
        assert_int_equal(p.ckpt_tier, FT_TIER_GPU);
        assert_int_equal(p.keep_acts, 0);
        double x = (double)in.layer_bytes / h2d, f = in.t_fwd_layer;
        /* 80 fetches per pass (the next pass starts again at layer 0) */
        assert_true(fabs(p.t_h2d - 80 * x) <= REL_EPS * p.t_h2d);
        assert_true(fabs(p.t_compute - (80 * f + in.t_head)) <= REL_EPS * p.t_compute);
        double sum = in.t_head + 80 * fmax(f, x);
        printf("forward only, h2d %.0f GB/s: pass %.4f s, sum of maxima %.4f s, bound %s\n",
               h2d / 1e9, p.t_step, sum, p.bound);
        assert_true(fabs(p.t_step - sum) <= fmax(x, f) + REL_EPS);
        char buf[1024];
        ft_plan_format(&in, &p, buf, sizeof buf);
        assert_non_null(strstr(buf, "forward passes of 2048 tokens (no backward)"));
        assert_non_null(strstr(buf, " s/forward pass"));
        assert_null(strstr(buf, "micro-batch"));
        assert_null(strstr(buf, "checkpoints"));
    }
    /* the same inputs as a training step: twice the fetches, the backward timed */
    ft_plan_in tr = in;
    tr.forward_only = 0;
    tr.t_bwd_layer = 0.024;
    ft_plan pf, pt;
    assert_int_equal(ft_plan_make(&in, &pf), 0);
    assert_int_equal(ft_plan_make(&tr, &pt), 0);
    assert_true(pt.t_step > 2 * pf.t_step);
    /* without a backward time a training plan is refused; a forward-only one is not */
    tr.t_bwd_layer = 0;
    assert_int_equal(ft_plan_make(&tr, &pt), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "layer backward time is unknown"));
    /* a budget that cannot fit: the refusal names a forward pass and the adapter */
    in.gpu_budget = gib_b(1);
    assert_int_equal(ft_plan_make(&in, &pf), FT_E_RANGE);
    printf("%s\n", ft_errmsg());
    assert_non_null(strstr(ft_errmsg(), "(a forward pass of 2048 tokens)"));
    assert_non_null(strstr(ft_errmsg(), "the adapter, working set"));
    assert_null(strstr(ft_errmsg(), "micro-batch"));
    assert_null(strstr(ft_errmsg(), "checkpoint"));
    ft_plan_in tr2 = in70();
    tr2.gpu_budget = gib_b(1);
    assert_int_equal(ft_plan_make(&tr2, &pt), FT_E_RANGE);
    assert_non_null(strstr(ft_errmsg(), "micro-batch of 2048 tokens"));
    assert_non_null(strstr(ft_errmsg(), "gradients and AdamW state"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everything_fits),     cmocka_unit_test(test_small_gpu_uses_host_tier),
        cmocka_unit_test(test_small_host_uses_nvme), cmocka_unit_test(test_min_budgets_exact),
        cmocka_unit_test(test_more_streaming_never_faster), cmocka_unit_test(test_step_formula),
        cmocka_unit_test(test_micro_batch_pick),    cmocka_unit_test(test_host_backend),
        cmocka_unit_test(test_bad_input),           cmocka_unit_test(test_format),
        cmocka_unit_test(test_host_checkpoints),
        cmocka_unit_test(test_host_checkpoints_last_resort),
        cmocka_unit_test(test_forward_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
