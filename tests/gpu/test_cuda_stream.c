/* test_cuda_stream.c - the device tiers of a packed base (offload/tiers.c): the same QLoRA
 * steps with every layer block in device memory, in pinned host memory (streamed over the H2D
 * lane through two slots), read from the pack file at every visit (NVMe tier, through pinned
 * staging), and a mix of the three give bit-identical losses and LoRA gradients (only where
 * the bytes live changes, not the math); the disk tier reads each block twice per optimizer
 * step with gradient accumulation 4, less the blocks still loaded at a turn; the timeline
 * records one compute span per layer visit. The layer-input checkpoints in pinned host memory
 * (offload/ckpt.h: stored on the checkpoint lane after the forward, loaded back ahead of the
 * backward, ordered by events) give the same bits again, alone and with streamed weights, on
 * the tiny model and on a 6-layer one (its layers repeated) for several device-layer and set
 * counts, grad-accum 1 and 4, recomputed or kept activations, with the bytes each way and the
 * checkpoint spans of the timeline counted. Skipped without a GPU. */
#include "tests/unit/harness.h"

#include "adapters/lora.h"
#include "offload/ckpt.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "offload/plan.h"
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

#define TINY "tests/fixtures/tiny-llama"
#define N_MB 4
#define STEPS 2

typedef struct result {
    double loss, eval_loss;
    float *g;
    int64_t n, reads_first, reads_step, tl_compute, tl_ckpt;
    uint64_t h2d, ck_d2h, ck_h2d;
} result;

/* Checkpoint placement of a run: sets == 0: all on the device; else host checkpoints with
 * dev_layers kept on the device and `sets` ring sets. */
typedef struct ckcfg {
    int64_t dev_layers;
    int sets;
    int keep;
    int n_mb;
} ckcfg;

static int run_ck(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                  const ft_batch *b, const ckcfg *ck, result *r);

/* STEPS optimizer steps of N_MB micro-batches with the given tiers (NULL: all on the GPU). */
static int run(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
               const ft_batch *b, result *r)
{
    ckcfg ck = {0, 0, 0, N_MB};
    return run_ck(be, m, pack, tier, b, &ck, r);
}

/* As run, with the checkpoints placed as ck says; pack == NULL: the model's weights copied to
 * the device (ft_exec_init). */
static int run_ck(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                  const ft_batch *b, const ckcfg *ck, result *r)
{
    ft_lora lora;
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 5};
    assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
    ft_rng rng;
    ft_rng_seed(&rng, 77);
    for (int64_t i = 0; i < lora.n_params; i++) lora.host[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.1f;
    assert_int_equal(ft_lora_push(&lora), 0);
    ft_exec e;
    int n_mb = ck->n_mb, rc;
    if (ck->sets)
        rc = ft_exec_init_ckpt_host(&e, be, m, &lora, b[0].T, n_mb, b[0].seq_len, pack == NULL,
                                    ck->dev_layers, ck->sets);
    else
        rc = ft_exec_init_ex(&e, be, m, &lora, b[0].T, n_mb, b[0].seq_len, pack == NULL);
    if (rc) printf("init: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    if (pack) {
        rc = ft_exec_use_pack_tiers(&e, pack, tier, 2, 2);
        if (rc) printf("use_pack_tiers: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
    }
    if (ck->keep) assert_int_equal(ft_exec_keep_activations(&e, (size_t)-1), 1);
    int64_t ntok = 0;
    for (int i = 0; i < n_mb; i++) ntok += b[i].n_targets;
    ft_timeline tl = {0};
    r->loss = 0;
    for (int s = 0; s < STEPS; s++) {
        int64_t before = e.pack_reads, nt;
        double ls;
        if (s == STEPS - 1) ft_exec_set_timeline(&e, &tl);
        be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4);
        rc = ft_exec_train_step(&e, b, n_mb, ntok, 0, &ls, &nt);
        if (rc) printf("train step: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        ft_exec_set_timeline(&e, NULL);
        r->loss += ls;
        r->reads_step = e.pack_reads - before;
        if (s == 0) r->reads_first = r->reads_step;
    }
    r->tl_compute = r->tl_ckpt = 0;
    for (int64_t i = 0; i < tl.n; i++) {
        r->tl_compute += tl.s[i].lane == FT_TL_COMPUTE && tl.s[i].layer >= 0;
        r->tl_ckpt += tl.s[i].lane == FT_TL_D2H && tl.s[i].kind == FT_TL_CKPT;
    }
    ft_timeline_free(&tl);
    r->ck_d2h = e.ckt ? e.ckt->d2h_bytes : 0;
    r->ck_h2d = e.ckt ? e.ckt->h2d_bytes : 0;
    int64_t nt;
    rc = ft_exec_eval(&e, &b[0], &r->eval_loss, &nt);
    if (rc) printf("eval: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    if (e.ckt) assert_true(e.ckt->d2h_bytes == r->ck_d2h && e.ckt->h2d_bytes == r->ck_h2d);
    r->n = lora.n_params;
    r->g = malloc((size_t)lora.n_params * 4);
    assert_int_equal(be->ops->copy(be, r->g, lora.grads, (size_t)lora.n_params * 4), 0);
    r->h2d = e.h2d_bytes;
    ft_exec_free(&e);
    ft_lora_free(&lora);
    return 0;
}

static void test_tiers_bit_identical(void **state)
{
    (void)state;
    ft_backend *be;
    if (ft_backend_cuda_init(&be, 0) < 0) skip();
    ft_model *m;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    char *dir = t_tmpdir();
    ft_pack_settings ps;
    ft_pack_settings_default(&ps, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info *pi = calloc(1, sizeof *pi);
    assert_int_equal(ft_pack_ensure(TINY, dir, &ps, 0, pi), 0);
    ft_pack_file *pack;
    assert_int_equal(ft_pack_open(&pack, pi->path, 1), 0);
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    int64_t L = m->cfg.num_hidden_layers;
    uint8_t host[64], disk[64], mix[64];
    for (int64_t l = 0; l < L; l++) {
        host[l] = FT_TIER_HOST;
        disk[l] = FT_TIER_DISK;
        mix[l] = (uint8_t)(l % 3);
    }
    result rg, rh, rd, rm, rc1, rc2;
    run(be, m, pack, NULL, b, &rg);
    run(be, m, pack, host, b, &rh);
    run(be, m, pack, disk, b, &rd);
    run(be, m, pack, mix, b, &rm);
    /* host checkpoints: with every block on the GPU, and with streamed blocks (both lanes) */
    ckcfg ck = {0, 2, 0, N_MB};
    run_ck(be, m, pack, NULL, b, &ck, &rc1);
    run_ck(be, m, pack, mix, b, &ck, &rc2);
    uint64_t want = (uint64_t)STEPS * (uint64_t)(L - 1) * N_MB * (uint64_t)(b[0].T * m->cfg.hidden_size) * 4;
    printf("host checkpoints: loss %.9g / %.9g (streamed), %llu bytes each way (expected %llu), "
           "%lld checkpoint spans\n", rc1.loss, rc2.loss, (unsigned long long)rc2.ck_d2h,
           (unsigned long long)want, (long long)rc2.tl_ckpt);
    assert_true(rg.loss == rc1.loss && rg.loss == rc2.loss && rg.eval_loss == rc2.eval_loss);
    assert_memory_equal(rg.g, rc1.g, (size_t)rg.n * 4);
    assert_memory_equal(rg.g, rc2.g, (size_t)rg.n * 4);
    assert_true(rc1.ck_d2h == want && rc1.ck_h2d == want && rc2.ck_d2h == want && rc2.ck_h2d == want);
    assert_int_equal(rc2.tl_ckpt, 2 * (L - 1)); /* one store and one load of each stored layer */
    free(rc1.g); free(rc2.g);
    printf("loss gpu %.9g host %.9g disk %.9g mix %.9g; disk reads first step %lld, then %lld "
           "(%lld layers, grad-accum %d); h2d bytes host %llu; timeline compute spans %lld\n",
           rg.loss, rh.loss, rd.loss, rm.loss, (long long)rd.reads_first, (long long)rd.reads_step,
           (long long)L, N_MB, (unsigned long long)rh.h2d, (long long)rd.tl_compute);
    assert_true(rg.loss == rh.loss);
    assert_true(rg.loss == rd.loss);
    assert_true(rg.loss == rm.loss);
    assert_memory_equal(rg.g, rh.g, (size_t)rg.n * 4);
    assert_memory_equal(rg.g, rd.g, (size_t)rg.n * 4);
    assert_memory_equal(rg.g, rm.g, (size_t)rg.n * 4);
    assert_int_equal(rd.reads_first, 2 * L - 1);
    assert_int_equal(rd.reads_step, 2 * L - 2);
    assert_int_equal(rg.reads_step, 0);
    assert_int_equal(rd.tl_compute, 2 * L); /* one span per layer visit */
    free(rg.g); free(rh.g); free(rd.g); free(rm.g);
    stream_free_batches(b, N_MB);
    free(pi); free(dir);
    ft_pack_close(pack);
    ft_model_free(m);
    ft_backend_free(be);
}

/* The tiny model with its layers repeated to L layers (shares the weight arrays). */
static ft_model *deepen(const ft_model *m, int64_t L)
{
    ft_model *d = malloc(sizeof *d);
    *d = *m;
    d->cfg.num_hidden_layers = L;
    d->layers = malloc((size_t)L * sizeof *d->layers);
    for (int64_t l = 0; l < L; l++) d->layers[l] = m->layers[l % m->cfg.num_hidden_layers];
    d->priv = NULL;
    return d;
}

/* Host checkpoints on a 6-layer model with its weights on the device: every ring size and
 * device-layer count, grad-accum 1 and 4, recomputed and kept activations. */
static void test_host_ckpt_deep(void **state)
{
    (void)state;
    ft_backend *be;
    if (ft_backend_cuda_init(&be, 0) < 0) skip();
    ft_model *tiny;
    assert_int_equal(ft_model_load(&tiny, TINY), 0);
    const int64_t L = 6;
    ft_model *m = deepen(tiny, L);
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    static const int64_t cfgs[][2] = {{0, 2}, {2, 3}, {1, 4}, {3, 2}, {5, 2}};
    int cases = 0;
    for (int n_mb = 1; n_mb <= N_MB; n_mb += N_MB - 1)
        for (int keep = 0; keep <= 1; keep++) {
            ckcfg c0 = {0, 0, keep, n_mb};
            result ref;
            run_ck(be, m, NULL, NULL, b, &c0, &ref);
            for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
                ckcfg c = {cfgs[k][0], (int)cfgs[k][1], keep, n_mb};
                result r;
                run_ck(be, m, NULL, NULL, b, &c, &r);
                int64_t stored = L - c.dev_layers - (c.sets - 1) > 0 ? L - c.dev_layers - (c.sets - 1) : 0;
                uint64_t want = (uint64_t)(STEPS * stored * n_mb * b[0].T * m->cfg.hidden_size) * 4;
                printf("grad-accum %d, %s, %lld device layers, %d sets: loss %.9g (device %.9g), "
                       "D2H %llu B, H2D %llu B (expected %llu), checkpoint spans %lld\n", n_mb,
                       keep ? "kept" : "recomputed", (long long)c.dev_layers, c.sets, r.loss, ref.loss,
                       (unsigned long long)r.ck_d2h, (unsigned long long)r.ck_h2d,
                       (unsigned long long)want, (long long)r.tl_ckpt);
                assert_true(r.loss == ref.loss);
                assert_true(r.eval_loss == ref.eval_loss);
                assert_memory_equal(r.g, ref.g, (size_t)ref.n * 4);
                assert_true(r.ck_d2h == want && r.ck_h2d == want);
                assert_int_equal(r.tl_ckpt, 2 * stored);
                free(r.g);
                cases++;
            }
            free(ref.g);
        }
    assert_int_equal(cases, 2 * 2 * 5);
    stream_free_batches(b, N_MB);
    free(m->layers);
    free(m);
    ft_model_free(tiny);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiers_bit_identical),
                                       cmocka_unit_test(test_host_ckpt_deep)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
