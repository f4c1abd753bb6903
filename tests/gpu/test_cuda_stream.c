/* test_cuda_stream.c - the device tiers of a packed base (offload/tiers.c): the same QLoRA
 * steps with every layer block in device memory, in pinned host memory (streamed over the H2D
 * lane through two slots), read from the pack file at every visit (NVMe tier, through pinned
 * staging), and a mix of the three give bit-identical losses and LoRA gradients (only where
 * the bytes live changes, not the math); the disk tier reads each block twice per optimizer
 * step with gradient accumulation 4, less the blocks still loaded at a turn; the timeline
 * records one compute span per layer visit. Skipped without a GPU. */
#include "tests/unit/harness.h"

#include "adapters/lora.h"
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
    double loss;
    float *g;
    int64_t n, reads_first, reads_step, tl_compute;
    uint64_t h2d;
} result;

/* STEPS optimizer steps of N_MB micro-batches with the given tiers (NULL: all on the GPU). */
static int run(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
               const ft_batch *b, result *r)
{
    ft_lora lora;
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 5};
    assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
    ft_rng rng;
    ft_rng_seed(&rng, 77);
    for (int64_t i = 0; i < lora.n_params; i++) lora.host[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.1f;
    assert_int_equal(ft_lora_push(&lora), 0);
    ft_exec e;
    assert_int_equal(ft_exec_init_ex(&e, be, m, &lora, b[0].T, N_MB, b[0].seq_len, 0), 0);
    int rc = ft_exec_use_pack_tiers(&e, pack, tier, 2, 2);
    if (rc) printf("use_pack_tiers: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    int64_t ntok = 0;
    for (int i = 0; i < N_MB; i++) ntok += b[i].n_targets;
    ft_timeline tl = {0};
    r->loss = 0;
    for (int s = 0; s < STEPS; s++) {
        int64_t before = e.pack_reads, nt;
        double ls;
        if (s == STEPS - 1) ft_exec_set_timeline(&e, &tl);
        be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4);
        rc = ft_exec_train_step(&e, b, N_MB, ntok, 0, &ls, &nt);
        if (rc) printf("train step: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        ft_exec_set_timeline(&e, NULL);
        r->loss += ls;
        r->reads_step = e.pack_reads - before;
        if (s == 0) r->reads_first = r->reads_step;
    }
    r->tl_compute = 0;
    for (int64_t i = 0; i < tl.n; i++) r->tl_compute += tl.s[i].lane == FT_TL_COMPUTE && tl.s[i].layer >= 0;
    ft_timeline_free(&tl);
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
    result rg, rh, rd, rm;
    run(be, m, pack, NULL, b, &rg);
    run(be, m, pack, host, b, &rh);
    run(be, m, pack, disk, b, &rd);
    run(be, m, pack, mix, b, &rm);
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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiers_bit_identical)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
