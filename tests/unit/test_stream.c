/* test_stream.c - the packed base streamed from the file vs held resident (issue 6's CPU
 * check): the same run with every layer block in host memory and with every layer visit
 * reading its block from the pack through the reader (io_uring + O_DIRECT where the file
 * system allows) gives bit-identical losses and LoRA gradients; with gradient accumulation 4
 * the streamed run reads each layer's block twice per optimizer step (forward and backward),
 * whatever the micro-batch count, except the two still loaded at a turn (last and first
 * layer). The streamed run with the layer-input checkpoints in host memory too (offload/actckpt.h)
 * gives the same bits, storing and loading exactly layer 0's checkpoints. */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "offload/actckpt.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

#define TINY "tests/fixtures/tiny-llama"
#define N_MB 4
#define STEPS 2


/* STEPS optimizer steps of N_MB micro-batches; returns the summed loss, the final LoRA
 * gradients in g, and the pack reads of the last step in *reads_step. */
static double run(const ft_model *m, ft_pack_file *pack, int resident, int ckpt_host, const ft_batch *b,
                  float *g, int64_t *n, int64_t *reads_setup, int64_t *reads_first, int64_t *reads_step,
                  uint64_t *ckpt_bytes)
{
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.1f);
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, b[0].T, N_MB, b[0].seq_len), 0);
    assert_int_equal(ft_exec_use_pack_ex(&e, pack, resident), 0);
    if (ckpt_host) assert_int_equal(ft_exec_ckpt_to_host(&e, 0, 2), 0);
    *reads_setup = e.pack_reads;
    int64_t ntok = 0;
    for (int i = 0; i < N_MB; i++) ntok += b[i].n_targets;
    double total = 0;
    for (int s = 0; s < STEPS; s++) {
        int64_t before = e.pack_reads, nt;
        double ls;
        be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4);
        assert_int_equal(ft_exec_train_step(&e, b, N_MB, ntok, 0x5eed + (uint64_t)s, &ls, &nt), 0);
        total += ls;
        *reads_step = e.pack_reads - before;
        if (s == 0) *reads_first = *reads_step;
    }
    memcpy(g, lora.grads, (size_t)lora.n_params * 4);
    *ckpt_bytes = 0;
    if (e.ckt) {
        assert_true(e.ckt->d2h_bytes == e.ckt->h2d_bytes);
        *ckpt_bytes = e.ckt->d2h_bytes;
    }
    *n = lora.n_params;
    ft_exec_free(&e);
    ft_lora_free(&lora);
    ft_backend_free(be);
    return total;
}

static void test_streamed_equals_resident(void **state)
{
    (void)state;
    ft_model *m;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    stream_pack sp;
    stream_pack_open(&sp, TINY);
    ft_pack_file *pack = sp.pack;
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    int64_t L = m->cfg.num_hidden_layers, n = 0, setup_r, first_r, step_r, setup_s, first_s, step_s;
    float *gr = malloc(1 << 22), *gs = malloc(1 << 22), *gc = malloc(1 << 22);
    uint64_t bytes0 = ft_pack_bytes_read(pack), ck_r, ck_s, ck_c;
    double lr = run(m, pack, 1, 0, b, gr, &n, &setup_r, &first_r, &step_r, &ck_r);
    double ls = run(m, pack, 0, 0, b, gs, &n, &setup_s, &first_s, &step_s, &ck_s);
    int64_t setup_c, first_c, step_c;
    double lc = run(m, pack, 0, 1, b, gc, &n, &setup_c, &first_c, &step_c, &ck_c);
    printf("pack reads via %s: resident %lld at setup, %lld per step; streamed %lld per step "
           "(first step %lld; %d layers, grad-accum %d); %llu bytes read in all\n", ft_pack_read_mode(pack),
           (long long)setup_r, (long long)step_r, (long long)step_s, (long long)first_s, (int)L, N_MB,
           (unsigned long long)(ft_pack_bytes_read(pack) - bytes0));
    printf("loss resident %.9g, streamed %.9g\n", lr, ls);
    printf("streamed with host checkpoints: loss %.9g, %llu checkpoint bytes each way\n", lc,
           (unsigned long long)ck_c);
    assert_true(lr == ls);
    assert_memory_equal(gr, gs, (size_t)n * 4);
    assert_true(lr == lc);
    assert_memory_equal(gr, gc, (size_t)n * 4);
    /* L - (2 sets - 1) = 1 layer's inputs go through the host: layer 0's, every micro-batch */
    uint64_t rows = 0;
    for (int i = 0; i < N_MB; i++) rows += (uint64_t)b[i].T;
    assert_true(ck_c == (uint64_t)STEPS * (uint64_t)(L - 1) * rows * (uint64_t)m->cfg.hidden_size * 4);
    assert_true(ck_r == 0 && ck_s == 0);
    assert_int_equal(step_c, step_s);
    assert_int_equal(setup_r, L);
    assert_int_equal(step_r, 0);
    assert_int_equal(setup_s, 0);
    /* forward + backward per layer, less the two blocks still loaded at a turn: the last layer
     * (end of the forward = start of the backward) and layer 0 (end of the backward = start of
     * the next step's forward); the first step reads 2L - 1 */
    assert_int_equal(first_s, 2 * L - 1);
    assert_int_equal(step_s, 2 * L - 2);
    assert_int_equal(first_r + step_r, 0);
    stream_free_batches(b, N_MB);
    free(gr); free(gs); free(gc);
    stream_pack_close(&sp);
    ft_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_streamed_equals_resident)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
