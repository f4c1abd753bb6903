/* test_neftune.c - NEFTune (ft_train_cfg.neftune_noise_alpha, offload/exec_step.c neftune): uniform
 * noise of magnitude alpha / sqrt(seq_len * hidden_size) on the embeddings of training
 * micro-batches only (Jain et al. 2023, arXiv 2310.05914; transformers'
 * neftune_post_forward_hook). Checked on tests/fixtures/tiny-llama:
 *   - whole training runs: alpha 0 gives the bits of the flag left out (losses, gradient norms,
 *     adapter) and records nothing; alpha 5 changes the training losses and the adapter but not
 *     the step-0 eval loss, and two alpha-5 runs are bit-identical; a run stopped after 2 steps
 *     and resumed ends bit-identical to an uninterrupted one, and a resume with another alpha
 *     is refused naming it; a negative or non-finite alpha is refused;
 *   - the executor: the noise is in ft_exec_train_step only (ft_exec_eval and ft_exec_logits
 *     with alpha set give the bits of alpha 0), a pure function of (seed, micro-batch), and the
 *     backward of layer 0 sees the noisy embeddings (LoRA gradients of layer 0 against central
 *     differences of the noisy loss, far from the noise-free gradients; kept activations ==
 *     recompute);
 *   - the device executor (cpu-device backend, a packed NF4 base): layer blocks streamed from
 *     pinned memory or disk through two slots, host checkpoints and asynchronous copy lanes
 *     give the losses and gradients of every block resident, bit for bit; the host-memory CPU
 *     streaming its pack gives those of the pack read once. */
#include "tests/unit/harness.h"

#include <signal.h>

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/plan.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "src/train/trainer.h"
#include "tests/unit/stream_fixture.h"
#include "tests/unit/train_fixture.h"

#define DATA "examples/data/alpaca-seed-tasks/alpaca_seed_175.jsonl"
#define MAX_STEPS 8
#define THREADS 2
#define ALPHA 5.0 /* the paper's usual value */
#define N_MB 2
#define EXEC_STEPS 2
/* fp32 forward/backward of the 2-layer model vs central differences in fp32 with h = 1e-2
 * (test_exec.c's bounds: truncation O(h^2), rounding O(eps |L| / h)). */
#define TOL_FD_REL 3e-2
#define TOL_FD_ABS 2e-4

/* ---- whole training runs ------------------------------------------------------------------- */

typedef struct trace {
    double loss[MAX_STEPS], gnorm[MAX_STEPS];
    int64_t n;                      /* FT_EV_STEP events seen */
    double eval0;                   /* the step-0 eval loss, NAN if none */
    int64_t stop_at;                /* > 0: raise *stop after this step */
    volatile sig_atomic_t *stop;
} trace;

static void on_event(const ft_train_event *ev, void *user)
{
    trace *t = user;
    if (ev->kind == FT_EV_STEP && t->n < MAX_STEPS) {
        t->loss[t->n] = ev->loss;
        t->gnorm[t->n] = ev->grad_norm;
        t->n++;
        if (t->stop_at > 0 && ev->step == t->stop_at) *t->stop = 1;
    }
    if (ev->kind == FT_EV_EVAL && ev->step == 0) t->eval0 = ev->eval_loss;
}

/* tiny_train_cfg with dropout left on (0.05: its masks and the noise together) and a held-out
 * set; alpha < 0: the field left as ft_train_defaults sets it (the flag left out). */
static void base_cfg(ft_train_cfg *c, const char *out, int64_t steps, double alpha)
{
    static const char *const data[1] = {DATA};
    tiny_train_cfg(c, out, data, steps, THREADS);
    c->data_cfg.eval_fraction = 0.1;
    c->data_cfg.eval_max = 8;
    if (alpha >= 0) c->neftune_noise_alpha = alpha;
}

static void train_ok(const ft_train_cfg *c, trace *t, ft_train_result *res)
{
    t->eval0 = NAN;
    train_run_ok(c, on_event, t, res);
}

/* 1. The flag left out, alpha 0, alpha 5 twice: 0 == left out, 5 != left out (training losses
 *    and adapter) with the same step-0 eval loss, 5 == 5. Only alpha 5 is recorded. */
static void test_off_and_on(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    const double alphas[4] = {-1, 0, ALPHA, ALPHA};
    char out[4][600];
    trace t[4];
    memset(t, 0, sizeof t);
    for (int k = 0; k < 4; k++) {
        snprintf(out[k], sizeof out[k], "%s/a%d", dir, k);
        ft_train_cfg c;
        base_cfg(&c, out[k], 3, alphas[k]);
        ft_train_result res;
        train_ok(&c, &t[k], &res);
        assert_int_equal(t[k].n, 3);
        assert_true(isfinite(t[k].eval0));
    }
    for (int s = 0; s < 3; s++)
        print_message("step %d: loss %.9g (off) %.9g (alpha 0) %.9g (alpha %g)\n", s + 1, t[0].loss[s],
                      t[1].loss[s], t[2].loss[s], ALPHA);
    print_message("step-0 eval loss: %.17g (off), %.17g (alpha %g)\n", t[0].eval0, t[2].eval0, ALPHA);
    /* alpha 0 is off, bit for bit */
    assert_memory_equal(t[1].loss, t[0].loss, 3 * sizeof(double));
    assert_memory_equal(t[1].gnorm, t[0].gnorm, 3 * sizeof(double));
    assert_true(same_adapter(out[0], out[1]));
    /* alpha 5: every training loss moves (the noise is in each step's forward), eval does not */
    for (int s = 0; s < 3; s++) assert_true(t[2].loss[s] != t[0].loss[s]);
    assert_false(same_adapter(out[0], out[2]));
    assert_true(t[2].eval0 == t[0].eval0);
    /* and it is reproducible */
    assert_memory_equal(t[3].loss, t[2].loss, 3 * sizeof(double));
    assert_memory_equal(t[3].gnorm, t[2].gnorm, 3 * sizeof(double));
    assert_true(same_adapter(out[2], out[3]));
    /* recorded only when on (so checkpoints of runs without it still resume) */
    size_t n;
    for (int k = 0; k < 3; k++) {
        char *s = read_out(out[k], "summary.json", &n);
        if (k < 2) assert_null(strstr(s, "neftune"));
        else assert_non_null(strstr(s, "\"neftune_noise_alpha\":\t5"));
        free(s);
    }
    assert_int_equal(t_rmtree(dir), 0);
}

/* 2. alpha 5: stopped after 2 of 4 steps (checkpoint), resumed: the losses and the adapter of
 *    the uninterrupted run. A resume with another alpha, or without it, is refused. */
static void test_resume_bit_identical(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    char full[600], part[600];
    snprintf(full, sizeof full, "%s/full", dir);
    snprintf(part, sizeof part, "%s/part", dir);
    ft_train_cfg c;
    ft_train_result res;
    trace tf = {0}, tp = {0};
    base_cfg(&c, full, 4, ALPHA);
    train_ok(&c, &tf, &res);
    assert_int_equal(tf.n, 4);

    volatile sig_atomic_t stop = 0;
    tp.stop = &stop;
    tp.stop_at = 2;
    base_cfg(&c, part, 4, ALPHA);
    c.stop = &stop;
    train_ok(&c, &tp, &res);
    assert_int_equal(res.stopped, 1);
    assert_int_equal(res.steps, 2);
    assert_int_equal(tp.n, 2);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s", res.checkpoint);
    print_message("stopped after step 2: %s\n", ckpt);
    assert_non_null(strstr(ckpt, "checkpoint-2"));

    /* another alpha, or none, is refused naming it */
    const double other[2] = {1.0, 0.0};
    for (int k = 0; k < 2; k++) {
        base_cfg(&c, part, 4, other[k]);
        c.resume = ckpt;
        assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
        print_message("resume with alpha %g: %s\n", other[k], ft_errmsg());
        assert_non_null(strstr(ft_errmsg(), "neftune_noise_alpha"));
    }

    base_cfg(&c, part, 4, ALPHA);
    c.resume = ckpt;
    tp.stop_at = 0;
    train_ok(&c, &tp, &res);
    assert_int_equal(res.resumed_from, 2);
    assert_int_equal(res.steps, 4);
    assert_int_equal(tp.n, 4);
    for (int s = 0; s < 4; s++)
        print_message("step %d: loss %.17g (uninterrupted) %.17g (stopped + resumed)\n", s + 1,
                      tf.loss[s], tp.loss[s]);
    assert_memory_equal(tp.loss, tf.loss, 4 * sizeof(double));
    assert_memory_equal(tp.gnorm, tf.gnorm, 4 * sizeof(double));
    assert_true(same_adapter(full, part));
    assert_int_equal(t_rmtree(dir), 0);
}

/* 3. ft_train_run refuses a negative or non-finite alpha before loading anything. */
static void test_bad_alpha_refused(void **state)
{
    (void)state;
    const double bad[3] = {-1, INFINITY, NAN};
    for (int k = 0; k < 3; k++) {
        ft_train_cfg c;
        base_cfg(&c, "/nonexistent/ftune-neftune", 1, 0);
        c.neftune_noise_alpha = bad[k];
        ft_train_result res;
        assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
        assert_non_null(strstr(ft_errmsg(), "--neftune-noise-alpha"));
    }
}

/* ---- the executor ---------------------------------------------------------------------------- */

/* One optimizer step of n_mb micro-batches: loss (mean per target) and the LoRA gradients
 * into g (n_params floats, host). */
static double step(ft_exec *e, ft_lora *l, const ft_batch *b, int n_mb, uint64_t dseed, float *g)
{
    ft_backend *be = e->be;
    int64_t ntok = 0, nt;
    for (int i = 0; i < n_mb; i++) ntok += b[i].n_targets;
    double ls;
    assert_int_equal(be->ops->zero(be, l->grads, (size_t)l->n_params * 4), 0);
    int rc = ft_exec_train_step(e, b, n_mb, ntok, dseed, &ls, &nt);
    if (rc) print_message("train step: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(nt, ntok);
    if (g) assert_int_equal(be->ops->copy(be, g, l->grads, (size_t)l->n_params * 4), 0);
    return ls / (double)nt;
}

/* 4. Only training steps are noisy; the noise is a pure function of (seed, micro-batch); kept
 *    activations (no recompute) give the bits of the recompute from checkpoint 0. */
static void test_exec_train_only(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.1f);
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    const int64_t n = lora.n_params, V = m->cfg.vocab_size, T = b[0].T;
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, T, N_MB, T), 0);
    assert_true(e.neftune_alpha == 0); /* off after init */
    /* eval and logits: alpha set or not, the same bits */
    double ev[2];
    float *lg[2] = {malloc((size_t)(T * V) * 4), malloc((size_t)(T * V) * 4)};
    for (int k = 0; k < 2; k++) {
        e.neftune_alpha = k ? ALPHA : 0;
        e.neftune_seed = 99;
        int64_t nt;
        assert_int_equal(ft_exec_eval(&e, &b[0], &ev[k], &nt), 0);
        assert_int_equal(ft_exec_logits(&e, &b[0], lg[k]), 0);
    }
    assert_true(ev[0] == ev[1]);
    assert_memory_equal(lg[0], lg[1], (size_t)(T * V) * 4);
    /* training: alpha 0, alpha 5 with seed 99 (twice), alpha 5 with seed 100 */
    float *g[4];
    double l[4];
    const uint64_t seeds[4] = {99, 99, 99, 100};
    for (int k = 0; k < 4; k++) {
        g[k] = malloc((size_t)n * 4);
        e.neftune_alpha = k ? ALPHA : 0;
        e.neftune_seed = seeds[k];
        l[k] = step(&e, &lora, b, N_MB, 0x5eed, g[k]);
    }
    print_message("train step loss: %.9g (off), %.9g (alpha %g, seed 99), %.9g (seed 100)\n", l[0],
                  l[1], ALPHA, l[3]);
    assert_true(l[1] != l[0] && l[3] != l[1] && l[3] != l[0]);
    assert_true(l[2] == l[1]);
    assert_memory_equal(g[2], g[1], (size_t)n * 4);
    assert_true(memcmp(g[3], g[1], (size_t)n * 4) != 0);
    ft_exec_free(&e);
    /* kept activations: the same bits as the recompute schedule, noise and dropout on */
    assert_int_equal(ft_exec_init(&e, be, m, &lora, T, N_MB, T), 0);
    assert_int_equal(ft_exec_keep_activations(&e, ft_exec_kept_bytes(&e)), 1);
    e.neftune_alpha = ALPHA;
    e.neftune_seed = 99;
    float *gk = malloc((size_t)n * 4);
    double lk = step(&e, &lora, b, N_MB, 0x5eed, gk);
    assert_true(lk == l[1]);
    assert_memory_equal(gk, g[1], (size_t)n * 4);
    ft_exec_free(&e);
    for (int k = 0; k < 4; k++) free(g[k]);
    free(gk), free(lg[0]), free(lg[1]);
    stream_free_batches(b, N_MB);
    tiny_close(m, be, &lora);
}

/* 5. The LoRA gradients of layer 0 are those of the noisy loss (central differences of the
 *    training step's loss, the same noise each time), and far from the noise-free gradients:
 *    a backward that recomputed layer 0 from clean embeddings would fail. Dropout off. */
static void test_exec_grad_fd(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.0f);
    ft_batch b[1];
    stream_make_batches(b, 1, 12, m->cfg.vocab_size);
    const int64_t n = lora.n_params;
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, b[0].T, 1, b[0].T), 0);
    float *g = malloc((size_t)n * 4), *g0 = malloc((size_t)n * 4);
    step(&e, &lora, b, 1, 0, g0);
    e.neftune_alpha = ALPHA;
    e.neftune_seed = 7;
    step(&e, &lora, b, 1, 0, g);
    ft_rng rng;
    ft_rng_seed(&rng, 4321);
    const float h = 1e-2f;
    double max_rel = 0, max_clean = 0;
    int checked = 0;
    for (int p = 0; p < FT_N_PROJ; p++) {
        const ft_lora_linear *ll = &lora.lin[0][p]; /* layer 0: its input is the embedding */
        if (!ll->A) continue;
        for (int k = 0; k < 4; k++) {
            float *base = k % 2 ? ll->B : ll->A;
            int64_t cnt = k % 2 ? ll->out_n * lora.cfg.r : lora.cfg.r * ll->in_n;
            int64_t i = (base - lora.params) + (int64_t)(ft_rng_next(&rng) % (uint64_t)cnt);
            float keep = lora.params[i];
            lora.params[i] = keep + h;
            double lp = step(&e, &lora, b, 1, 0, NULL);
            lora.params[i] = keep - h;
            double lm = step(&e, &lora, b, 1, 0, NULL);
            lora.params[i] = keep;
            double num = (lp - lm) / (2.0 * h), err = fabs(num - g[i]);
            if (err > TOL_FD_ABS + TOL_FD_REL * fabs(num))
                print_message("  %s %s[%lld]: analytic %.6g numeric %.6g (noise-free %.6g)\n",
                              ft_proj_name[p], k % 2 ? "B" : "A", (long long)i, (double)g[i], num,
                              (double)g0[i]);
            assert_true(err <= TOL_FD_ABS + TOL_FD_REL * fabs(num));
            if (fabs(num) > 1e-3) max_rel = fmax(max_rel, err / fabs(num));
            /* how far the noise-free gradient is, in units of the tolerance */
            max_clean = fmax(max_clean, fabs(num - g0[i]) / (TOL_FD_ABS + TOL_FD_REL * fabs(num)));
            checked++;
        }
    }
    print_message("layer-0 LoRA grads with NEFTune vs central differences: max rel err %.3g over "
                  "%d params; the noise-free grads are up to %.1f tolerances off\n", max_rel,
                  checked, max_clean);
    assert_true(checked >= 8);
    assert_true(max_clean > 10); /* the check can tell noisy from clean inputs */
    ft_exec_free(&e);
    free(g), free(g0);
    stream_free_batches(b, 1);
    tiny_close(m, be, &lora);
}

/* ---- the device executor: streamed == resident ------------------------------------------------ */

typedef struct exrun {
    double loss[EXEC_STEPS], eval;
    float *g;
} exrun;

/* EXEC_STEPS steps of N_MB micro-batches with NEFTune at alpha (seed 1000 + step) and dropout
 * 0.1. Device backends: the pack placed by tier (NULL: every block in device memory), host
 * checkpoints with host_ck (dev_layers 0, two sets), kept activations with keep. Host-memory
 * backend: the pack streamed (tier == NULL) or read once (resident). */
static void exec_run(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                     int host_ck, int keep, int resident, const ft_batch *b, double alpha, exrun *r)
{
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.1f);
    ft_exec e;
    int64_t T = b[0].T;
    int rc, host = be->ops->host_memory;
    if (host_ck) rc = ft_exec_init_ckpt_host(&e, be, m, &lora, T, N_MB, T, host, 0, 2);
    else rc = ft_exec_init_ex(&e, be, m, &lora, T, N_MB, T, host);
    if (rc) print_message("init: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    rc = host ? ft_exec_use_pack_ex(&e, pack, resident) : ft_exec_use_pack_tiers(&e, pack, tier, 2, 2);
    if (rc) print_message("use pack: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    if (keep) assert_int_equal(ft_exec_keep_activations(&e, (size_t)-1), 1);
    e.neftune_alpha = alpha;
    r->g = malloc((size_t)lora.n_params * 4);
    for (int s = 0; s < EXEC_STEPS; s++) {
        e.neftune_seed = 1000 + (uint64_t)s;
        r->loss[s] = step(&e, &lora, b, N_MB, 0x5eed + (uint64_t)s, r->g);
    }
    int64_t nt;
    assert_int_equal(ft_exec_eval(&e, &b[0], &r->eval, &nt), 0);
    ft_exec_free(&e);
    ft_lora_free(&lora);
}

static void expect_same(const char *what, const exrun *a, const exrun *ref, int64_t n)
{
    print_message("%-44s loss %.9g %.9g, eval %.9g\n", what, a->loss[0], a->loss[1], a->eval);
    assert_memory_equal(a->loss, ref->loss, sizeof a->loss);
    assert_true(a->eval == ref->eval);
    assert_memory_equal(a->g, ref->g, (size_t)n * 4);
}

/* 6. Streamed layer blocks (pinned host, disk, mixed), host checkpoints (layer 0's noisy input
 *    stored to the host and loaded back for the backward), kept activations and asynchronous
 *    copy lanes: the bits of every block resident, with the noise on. */
static void test_streamed_same_as_resident(void **state)
{
    (void)state;
    ft_backend *be, *ab, *cpu;
    ft_model *m;
    stream_pack sp;
    tiny_device_open(&m, &be, &sp, THREADS);
    assert_int_equal(ft_backend_cpu_device_init(&ab, THREADS), 0);
    assert_int_equal(ft_backend_cpu_device_set_lag(ab, 200), 0);
    assert_int_equal(ft_backend_cpu_init(&cpu, THREADS), 0);
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    const int64_t L = m->cfg.num_hidden_layers;
    assert_true(L >= 2 && L <= 64);
    uint8_t host[64], disk[64], mix[64];
    for (int64_t l = 0; l < L; l++) {
        host[l] = FT_TIER_HOST;
        disk[l] = FT_TIER_DISK;
        mix[l] = (uint8_t)(l % 3);
    }
    ft_lora probe;
    stream_lora_init(&probe, cpu, m, 0.1f);
    const int64_t n = probe.n_params;
    ft_lora_free(&probe);
    exrun ref, off, r;
    exec_run(be, m, sp.pack, NULL, 0, 0, 0, b, ALPHA, &ref);
    exec_run(be, m, sp.pack, NULL, 0, 0, 0, b, 0, &off);
    print_message("device mode, every block resident: loss %.9g %.9g with NEFTune, %.9g %.9g without\n",
                  ref.loss[0], ref.loss[1], off.loss[0], off.loss[1]);
    assert_true(off.loss[0] != ref.loss[0] && off.loss[1] != ref.loss[1]);
    free(off.g);
    static const struct { const char *what; int tier, host_ck, keep, lag; } cases[] = {
        {"pinned host tier", 1, 0, 0, 0},
        {"disk tier", 2, 0, 0, 0},
        {"mixed tiers + host checkpoints", 3, 1, 0, 0},
        {"disk tier + host checkpoints + kept acts", 2, 1, 1, 0},
        {"async lanes: disk tier + host checkpoints", 2, 1, 0, 1},
        {"async lanes: mixed tiers + host checkpoints", 3, 1, 0, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const uint8_t *t = cases[k].tier == 1 ? host : cases[k].tier == 2 ? disk : mix;
        exec_run(cases[k].lag ? ab : be, m, sp.pack, t, cases[k].host_ck, cases[k].keep, 0, b, ALPHA, &r);
        expect_same(cases[k].what, &r, &ref, n);
        free(r.g);
    }
    /* the host-memory CPU: the pack streamed from the file at every visit == read once */
    exrun cs, cr;
    exec_run(cpu, m, sp.pack, NULL, 0, 0, 1, b, ALPHA, &cr);
    exec_run(cpu, m, sp.pack, NULL, 0, 0, 0, b, ALPHA, &cs);
    expect_same("host-memory CPU, pack streamed vs resident", &cs, &cr, n);
    free(cs.g), free(cr.g), free(ref.g);
    stream_free_batches(b, N_MB);
    ft_backend_free(cpu);
    ft_backend_free(ab);
    tiny_device_close(m, be, &sp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_and_on),
        cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_bad_alpha_refused),
        cmocka_unit_test(test_exec_train_only),
        cmocka_unit_test(test_exec_grad_fd),
        cmocka_unit_test(test_streamed_same_as_resident),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
