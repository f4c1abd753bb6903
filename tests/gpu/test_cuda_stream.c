/* test_cuda_stream.c - the device tiers of a packed base (offload/tiers.c): the same QLoRA
 * steps with every layer block in device memory, in pinned host memory (streamed over the H2D
 * lane through two slots), read from the pack file at every visit (NVMe tier, through pinned
 * staging), and a mix of the three give bit-identical losses and LoRA gradients (only where
 * the bytes live changes, not the math); the disk tier reads each block twice per optimizer
 * step with gradient accumulation 4, less the blocks still loaded at a turn; the timeline
 * records one compute span per layer visit. The layer-input checkpoints in pinned host memory
 * (offload/actckpt.h: stored on the checkpoint lane after the forward, loaded back ahead of the
 * backward, ordered by events) give the same bits again, alone and with streamed weights, on
 * the tiny model and on a 6-layer one (its layers repeated) for several device-layer and set
 * counts, grad-accum 1 and 4, recomputed or kept activations, with the bytes each way and the
 * checkpoint spans of the timeline counted. With FTUNE_NF4_GEMM=fused (the dequant-fused NF4
 * GEMM instead of dequant_nf4 + cuBLAS) the tiers agree bit for bit again, and with the
 * dequantizing run within 1e-4 (fp32 sums in another order). A Qwen3 model (per-head q/k
 * norms carried in the blocks) gives equal bits across the tiers and the host CPU's loss
 * within 1e-3. Skipped without a GPU. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "offload/actckpt.h"
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
    stream_pack sp;
    stream_pack_open(&sp, TINY);
    ft_pack_file *pack = sp.pack;
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    tier_sets ts;
    tiers_fill(&ts, m->cfg.num_hidden_layers);
    result r[4];
    tiers_compare(be, m, pack, b, &ts, r);
    /* the dequant-fused NF4 GEMM (nf4_gemm.cu) against dequant_nf4 + cuBLAS: the same bf16
     * operands, fp32 sums in another order */
    tiers_nf4_fused(be, m, pack, b, &ts, &r[0], 1e-4);
    for (int k = 0; k < 4; k++) free(r[k].g);
    stream_free_batches(b, N_MB);
    stream_pack_close(&sp);
    ft_model_free(m);
    ft_backend_free(be);
}

/* A Qwen3 model (q/k norms in the blocks) through every tier (tiers_cases.h tiers_qwen3). */
static void test_tiers_qwen3(void **state)
{
    (void)state;
    ft_backend *be;
    if (ft_backend_cuda_init(&be, 0) < 0) skip();
    tiers_qwen3(be, 1e-3);
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
                                       cmocka_unit_test(test_tiers_qwen3),
                                       cmocka_unit_test(test_host_ckpt_deep)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
