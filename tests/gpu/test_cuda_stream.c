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

#include "tests/unit/tiers_cases.h"

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

/* Host checkpoints on a 6-layer model (tiers_cases.h) on the GPU. */
static void test_host_ckpt_deep(void **state)
{
    (void)state;
    ft_backend *be;
    if (ft_backend_cuda_init(&be, 0) < 0) skip();
    tiers_host_ckpt_deep(be);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiers_bit_identical),
                                       cmocka_unit_test(test_host_ckpt_deep)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
