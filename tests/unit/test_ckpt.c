/* test_ckpt.c - layer-input checkpoints in host memory (offload/actckpt.c) vs on the device, on
 * the CPU backend (whose host_alloc is plain memory and copy_async a memcpy, so the host
 * tier's schedule runs as on a GPU, in order): a 6-layer model (the tiny fixture's layers
 * repeated) trains two steps with gradient accumulation 1 and 4, activations recomputed or
 * kept, for several device-layer/set counts, through both entry points
 * (ft_exec_init_ckpt_host, ft_exec_ckpt_to_host). Losses and LoRA gradients must be
 * bit-identical to the device-resident run; the bytes copied each way must be exactly the
 * stored checkpoints' (n_stored = L - dev_layers - (n_sets - 1) layers, every micro-batch's
 * rows); eval and logits copy nothing and match too; the arena shrinks by the checkpoints
 * left out. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "offload/actckpt.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "tests/unit/model_fixture.h"
#include "tests/unit/stream_fixture.h"

#define DEEP_L 6
#define T_MAX 24
#define STEPS 2

enum { MODE_DEVICE, MODE_INIT_HOST, MODE_TO_HOST };

typedef struct result {
    double loss, eval_loss;
    float *g, *logits;
    int64_t n_params;
    uint64_t d2h, h2d, eval_copies;
    int64_t tl_ckpt;                /* checkpoint spans in the last step's timeline */
    size_t arena_bytes;
} result;

/* STEPS train steps of n_mb micro-batches, then an eval and logits of micro-batch 0. */
static void run(ft_backend *be, const ft_model *m, int mode, int64_t dev, int sets, int keep,
                const ft_batch *b, int n_mb, result *r)
{
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.1f);
    ft_exec e;
    int rc;
    if (mode == MODE_INIT_HOST) {
        rc = ft_exec_init_ckpt_host(&e, be, m, &lora, T_MAX, n_mb, T_MAX, 1, dev, sets);
    } else {
        rc = ft_exec_init(&e, be, m, &lora, T_MAX, n_mb, T_MAX);
        if (!rc && mode == MODE_TO_HOST) rc = ft_exec_ckpt_to_host(&e, dev, sets);
    }
    if (rc) printf("init: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    assert_true((e.ckt != NULL) == (mode != MODE_DEVICE));
    if (keep) assert_int_equal(ft_exec_keep_activations(&e, (size_t)-1), 1);
    int64_t ntok = 0;
    for (int i = 0; i < n_mb; i++) ntok += b[i].n_targets;
    r->loss = 0;
    ft_timeline tl = {0};
    for (int s = 0; s < STEPS; s++) {
        double ls;
        int64_t nt;
        if (s == STEPS - 1) ft_exec_set_timeline(&e, &tl);
        be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4);
        rc = ft_exec_train_step(&e, b, n_mb, ntok, 0x5eed + (uint64_t)s, &ls, &nt);
        if (rc) printf("train step: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        r->loss += ls;
    }
    ft_exec_set_timeline(&e, NULL);
    r->tl_ckpt = 0;
    for (int64_t i = 0; i < tl.n; i++) r->tl_ckpt += tl.s[i].lane == FT_TL_D2H && tl.s[i].kind == FT_TL_CKPT;
    ft_timeline_free(&tl);
    r->n_params = lora.n_params;
    r->g = malloc((size_t)lora.n_params * 4);
    memcpy(r->g, lora.grads, (size_t)lora.n_params * 4);
    r->d2h = e.ckt ? e.ckt->d2h_bytes : 0;
    r->h2d = e.ckt ? e.ckt->h2d_bytes : 0;
    int64_t nt;
    assert_int_equal(ft_exec_eval(&e, &b[1], &r->eval_loss, &nt), 0);
    int64_t V = m->cfg.vocab_size;
    r->logits = malloc((size_t)(b[0].T * V) * 4);
    assert_int_equal(ft_exec_logits(&e, &b[0], r->logits), 0);
    r->eval_copies = e.ckt ? e.ckt->d2h_bytes + e.ckt->h2d_bytes - r->d2h - r->h2d : 0;
    r->arena_bytes = e.arena_bytes;
    ft_exec_free(&e);
    ft_lora_free(&lora);
}

static void free_result(result *r)
{
    free(r->g);
    free(r->logits);
}

/* The DEEP_L-layer model over tiny-llama (stream_deepen, returned; tiny-llama in *tiny) on a
 * CPU backend of 2 threads in *be, and 4 ragged micro-batches of up to T_MAX tokens in b;
 * deep_close frees them. */
static ft_model *deep_open(ft_model **tiny, ft_backend **be, ft_batch *b)
{
    assert_int_equal(tiny_open(tiny, be, NULL, 2, NULL, 0, 0.0f), 0);
    ft_model *m = stream_deepen(*tiny, DEEP_L);
    stream_make_batches_ragged(b, 4, T_MAX, 4, m->cfg.vocab_size);
    return m;
}

static void deep_close(ft_model *m, ft_model *tiny, ft_backend *be, ft_batch *b)
{
    stream_free_batches(b, 4);
    free(m->layers);
    free(m);
    tiny_close(tiny, be, NULL);
}

static void test_host_ckpt_bit_identical(void **state)
{
    (void)state;
    ft_model *tiny;
    ft_backend *be;
    ft_batch b[4];
    ft_model *m = deep_open(&tiny, &be, b);
    const int64_t L = DEEP_L, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    /* (device layers, sets): none kept, some, all but the stored minimum, every set count */
    static const int64_t cfgs[][2] = {{0, 2}, {2, 3}, {1, 4}, {3, 2}, {L - 1, 2}, {L, 2}};
    int cases = 0;
    for (int n_mb = 1; n_mb <= 4; n_mb += 3)
        for (int keep = 0; keep <= 1; keep++) {
            result ref;
            run(be, m, MODE_DEVICE, 0, 0, keep, b, n_mb, &ref);
            int64_t rows = 0;
            for (int i = 0; i < n_mb; i++) rows += b[i].T;
            for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
                for (int mode = MODE_INIT_HOST; mode <= MODE_TO_HOST; mode++) {
                    int64_t dev = cfgs[k][0];
                    int sets = (int)cfgs[k][1];
                    result r;
                    run(be, m, mode, dev, sets, keep, b, n_mb, &r);
                    int64_t stored = L - dev - (sets - 1) > 0 ? L - dev - (sets - 1) : 0;
                    uint64_t want = (uint64_t)(STEPS * stored * rows * C) * 4;
                    printf("grad-accum %d, %s, %lld device layers, %d sets, %s: loss %.9g (device %.9g), "
                           "D2H %llu B, H2D %llu B (expected %llu each), arena %zu B (device %zu B)\n",
                           n_mb, keep ? "kept" : "recomputed", (long long)dev, sets,
                           mode == MODE_INIT_HOST ? "init_ckpt_host" : "ckpt_to_host", r.loss, ref.loss,
                           (unsigned long long)r.d2h, (unsigned long long)r.h2d, (unsigned long long)want,
                           r.arena_bytes, ref.arena_bytes);
                    assert_true(r.loss == ref.loss);
                    assert_memory_equal(r.g, ref.g, (size_t)ref.n_params * 4);
                    assert_true(r.eval_loss == ref.eval_loss);
                    assert_memory_equal(r.logits, ref.logits, (size_t)(b[0].T * V) * 4);
                    assert_true(r.d2h == want);
                    assert_true(r.h2d == want);
                    assert_true(r.eval_copies == 0); /* forward only: nothing leaves the device */
                    assert_int_equal(r.tl_ckpt, 2 * stored); /* a store and a load per layer */
                    int64_t saved = ((L + 1) - (dev + sets)) * n_mb * T_MAX * C * 4;
                    assert_true((int64_t)ref.arena_bytes - (int64_t)r.arena_bytes == saved);
                    free_result(&r);
                    cases++;
                }
            free_result(&ref);
        }
    assert_int_equal(cases, 2 * 2 * 6 * 2);
    deep_close(m, tiny, be, b);
}

/* Fewer micro-batches than planned, bad counts, and a second conversion are handled. */
static void test_host_ckpt_edges(void **state)
{
    (void)state;
    ft_model *tiny;
    ft_backend *be;
    ft_batch b[4];
    ft_model *m = deep_open(&tiny, &be, b);
    ft_lora lora;
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 5};
    assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
    ft_exec e;
    assert_int_equal(ft_exec_init_ckpt_host(&e, be, m, &lora, T_MAX, 4, T_MAX, 1, 0, 1), FT_E_INVALID);
    assert_int_equal(ft_exec_init_ckpt_host(&e, be, m, &lora, T_MAX, 4, T_MAX, 1, 0, 5), FT_E_INVALID);
    assert_int_equal(ft_exec_init_ckpt_host(&e, be, m, &lora, T_MAX, 4, T_MAX, 1, DEEP_L + 1, 2),
                     FT_E_INVALID);
    assert_int_equal(ft_exec_init_ckpt_host(&e, be, m, &lora, T_MAX, 4, T_MAX, 1, 1, 2), 0);
    assert_int_equal(ft_exec_ckpt_to_host(&e, 1, 2), FT_E_INVALID); /* already */
    assert_true(e.ckt->host_bytes == ft_actckpt_host_bytes(DEEP_L, 4, T_MAX, m->cfg.hidden_size, 1, 2));
    /* a step of 2 micro-batches on an executor planned for 4: only their rows move */
    int64_t ntok = b[0].n_targets + b[1].n_targets, nt;
    double ls;
    assert_int_equal(ft_exec_train_step(&e, b, 2, ntok, 0, &ls, &nt), 0);
    uint64_t want = (uint64_t)((DEEP_L - 1 - 1) * (b[0].T + b[1].T) * m->cfg.hidden_size) * 4;
    assert_true(e.ckt->d2h_bytes == want && e.ckt->h2d_bytes == want);
    assert_int_equal(e.ckt->d2h_copies, (DEEP_L - 2) * 2);
    ft_exec_free(&e);
    assert_null(e.ckt);
    ft_lora_free(&lora);
    deep_close(m, tiny, be, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_host_ckpt_bit_identical),
                                       cmocka_unit_test(test_host_ckpt_edges)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
