/* test_tiers.c - the device executor without a GPU: tests/gpu/test_cuda_stream.c's cases on the
 * CPU backend in device mode (ft_backend_cpu_device_init: host_memory = 0, bf16 weights,
 * dequant_nf4), so CI runs offload/tiers.c, resident.c, ckpt.c and the disk read-ahead
 * (offload/prefetch.c) for real. The same QLoRA steps with every layer block "in device
 * memory", in pinned host memory (streamed over the H2D lane through two slots), read from the
 * pack file at every visit (through pinned staging and the read-ahead thread; the pack lies in
 * /tmp, a real disk here, so io_uring where the kernel allows) and a mix of the three give
 * bit-identical losses and LoRA gradients; the disk tier reads each block twice per optimizer
 * step with gradient accumulation 4, less the blocks still loaded at a turn; the timeline has
 * one compute span per layer visit. Host checkpoints (offload/actckpt.h) give the same bits
 * again with the exact bytes each way, on the tiny model and on a 6-layer one for several
 * device-layer and set counts. The device ops themselves are checked against references:
 * dequant_nf4 bit for bit against src/numeric/nf4.c + bf16 rounding, the bf16 products against a
 * double-precision product of the bf16-rounded operands (across the weight tiling), and the
 * device-mode loss against the host-mode CPU run of the same pack (within bf16 rounding). */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "offload/actckpt.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/place.h"
#include "offload/plan.h"
#include "offload/prefetch.h"
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"
#include "tests/unit/model_fixture.h"
#include "tests/unit/stream_fixture.h"

#define N_MB 4
#define STEPS 2
#define THREADS 2
#define LAG_US 200 /* the asynchronous copy lanes' delay per item */

#include "tests/unit/tiers_cases.h"

/* dequant_nf4 of the device mode equals src/numeric/nf4.c's fp32 dequantization rounded to bf16,
 * bit for bit, nested and not, over more than one of the backend's tiles. */
static void test_dequant_nf4_exact(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    assert_int_equal(be->ops->host_memory, 0);
    assert_non_null(be->ops->dequant_nf4);
    const int64_t n = ((int64_t)1 << 20) + 4096 + 64 + 3; /* odd: a half byte at the end */
    float *x = malloc((size_t)n * 4), *ref = malloc((size_t)n * 4), map[256];
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    for (int64_t i = 0; i < n; i++) x[i] = (ft_rng_uniform(&rng) - 0.5f) * (i % 977 == 0 ? 40.0f : 0.2f);
    ft_nf4_dynamic_map(map);
    for (int nested = 0; nested <= 1; nested++) {
        ft_nf4_view v = {0};
        assert_int_equal(ft_nf4_layout_init(&v.lay, n, 64, nested ? 256 : 0), 0);
        uint8_t *codes = malloc((size_t)v.lay.code_bytes), *q = malloc((size_t)v.lay.n_blocks);
        float *absmax = malloc((size_t)v.lay.n_blocks * 4), *nabs = malloc((size_t)v.lay.n_nested * 4 + 4);
        float off = 0;
        assert_int_equal(ft_nf4_quantize(x, &v.lay, map, codes, q, nabs, &off, absmax), 0);
        v.codes = codes;
        v.qabsmax = q;
        v.absmax = absmax;
        v.nested_absmax = nabs;
        v.nested_map = map;
        v.code = ft_nf4_code;
        v.offset = off;
        assert_int_equal(ft_nf4_dequant(&v, ref), 0);
        ft_nf4_tensor t = {n, 64, nested ? 256 : 0, codes, nested ? q : NULL, nested ? NULL : absmax,
                           nested ? nabs : NULL, nested ? map : NULL, ft_nf4_code, off};
        uint16_t *got = malloc((size_t)n * 2);
        assert_int_equal(be->ops->dequant_nf4(be, got, &t), 0);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += got[i] != ft_quant_f32_to_bf16(ref[i]);
        printf("dequant_nf4 (%s): %lld of %lld elements differ from nf4.c + bf16 rounding\n",
               nested ? "nested" : "plain", (long long)bad, (long long)n);
        assert_int_equal(bad, 0);
        free(got); free(codes); free(q); free(absmax); free(nabs);
    }
    free(x); free(ref);
    ft_backend_free(be);
}

/* linear_fwd / linear_bwd_x with bf16 weights against a double-precision product of the
 * bf16-rounded operands: one tile, several row tiles, and an input dimension longer than a
 * tile (summed tile by tile), with beta 0 and 1. */
static void test_linear_bf16(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    assert_true(be->ops->weight_types & FT_WTYPE_BIT(FT_WTYPE_BF16));
    static const int64_t shapes[][3] = {{5, 24, 40}, {3, 600, 2048}, {2, 3, ((int64_t)1 << 20) + 100}};
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t T = shapes[s][0], out = shapes[s][1], in = shapes[s][2], mx = out > in ? out : in;
        uint16_t *W = malloc((size_t)(out * in) * 2);
        float *x = malloc((size_t)(T * in) * 4), *dy = malloc((size_t)(T * out) * 4);
        float *y = malloc((size_t)(T * out) * 4), *dx = malloc((size_t)(T * in) * 4);
        float *scr = malloc((size_t)(T * mx) * 4);
        for (int64_t i = 0; i < out * in; i++) W[i] = ft_quant_f32_to_bf16(ft_rng_uniform(&rng) - 0.5f);
        for (int64_t i = 0; i < T * in; i++) x[i] = ft_rng_uniform(&rng) - 0.5f;
        for (int64_t i = 0; i < T * out; i++) dy[i] = ft_rng_uniform(&rng) - 0.5f;
        for (int beta = 0; beta <= 1; beta++) {
            for (int64_t i = 0; i < T * out; i++) y[i] = 0.25f;
            for (int64_t i = 0; i < T * in; i++) dx[i] = -0.5f;
            assert_int_equal(be->ops->linear_fwd(be, y, x, W, FT_WTYPE_BF16, T, out, in, (float)beta, scr), 0);
            assert_int_equal(be->ops->linear_bwd_x(be, dx, dy, W, FT_WTYPE_BF16, T, out, in, (float)beta, scr), 0);
            double ey = 0, edx = 0;
            for (int64_t t = 0; t < T; t++)
                for (int64_t o = 0; o < out; o++) {
                    double a = beta * 0.25, mag = 0;
                    for (int64_t k = 0; k < in; k++) {
                        double p = (double)ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(x[t * in + k])) *
                                   ft_quant_bf16_to_f32(W[o * in + k]);
                        a += p;
                        mag += fabs(p);
                    }
                    ey = fmax(ey, fabs(y[t * out + o] - a) / (mag + 1e-30));
                }
            for (int64_t t = 0; t < T; t++)
                for (int64_t k = 0; k < in; k += in > 4096 ? 997 : 1) {
                    double a = beta * -0.5, mag = 0;
                    for (int64_t o = 0; o < out; o++) {
                        double p = (double)ft_quant_bf16_to_f32(ft_quant_f32_to_bf16(dy[t * out + o])) *
                                   ft_quant_bf16_to_f32(W[o * in + k]);
                        a += p;
                        mag += fabs(p);
                    }
                    edx = fmax(edx, fabs(dx[t * in + k] - a) / (mag + 1e-30));
                }
            printf("bf16 linear T %lld out %lld in %lld beta %d: error / sum|terms| fwd %.2e bwd %.2e\n",
                   (long long)T, (long long)out, (long long)in, beta, ey, edx);
            /* fp32 accumulation of exact bf16 x bf16 products: a few ulp of fp32 per term sum */
            assert_true(ey < 1e-5 && edx < 1e-5);
        }
        free(W); free(x); free(dy); free(y); free(dx); free(scr);
    }
    float y0 = 0;
    assert_int_equal(be->ops->linear_fwd(be, &y0, &y0, &y0, 7, 1, 1, 1, 0.0f, &y0), FT_E_UNSUPPORTED);
    ft_backend_free(be);
}

/* linear_fwd / linear_bwd_x with an FT_WTYPE_NF4 weight (the fused GEMM's contract, kernels.h)
 * equal dequant_nf4 followed by the FT_WTYPE_BF16 product bit for bit, nested and not, for a
 * weight of one tile and one spread over several (row and input tiles); a shape the fused
 * kernels do not take is refused. */
static void test_linear_nf4(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    assert_true(be->ops->weight_types & FT_WTYPE_BIT(FT_WTYPE_NF4));
    static const int64_t shapes[][3] = {{5, 64, 128}, {3, 1088, 2048}, {2, 64, ((int64_t)1 << 20) + 128}};
    float map[256];
    ft_nf4_dynamic_map(map);
    ft_rng rng;
    ft_rng_seed(&rng, 11);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int nested = 0; nested <= 1; nested++) {
            int64_t T = shapes[s][0], out = shapes[s][1], in = shapes[s][2], n = out * in;
            int64_t mx = out > in ? out : in;
            float *w = malloc((size_t)n * 4);
            for (int64_t i = 0; i < n; i++) w[i] = (ft_rng_uniform(&rng) - 0.5f) * 0.1f;
            ft_nf4_layout lay;
            assert_int_equal(ft_nf4_layout_init(&lay, n, 64, nested ? 256 : 0), 0);
            uint8_t *codes = malloc((size_t)lay.code_bytes), *q = malloc((size_t)lay.n_blocks);
            float *absmax = malloc((size_t)lay.n_blocks * 4), *nabs = malloc((size_t)lay.n_nested * 4 + 4);
            float off = 0;
            assert_int_equal(ft_nf4_quantize(w, &lay, map, codes, q, nabs, &off, absmax), 0);
            ft_nf4_tensor t = {n, 64, nested ? 256 : 0, codes, nested ? q : NULL, nested ? NULL : absmax,
                               nested ? nabs : NULL, nested ? map : NULL, ft_nf4_code, off};
            uint16_t *wb = malloc((size_t)n * 2);
            assert_int_equal(be->ops->dequant_nf4(be, wb, &t), 0);
            float *x = malloc((size_t)(T * in) * 4), *dy = malloc((size_t)(T * out) * 4);
            float *y[2], *dx[2], *scr = malloc((size_t)(T * mx) * 4);
            for (int k = 0; k < 2; k++) {
                y[k] = malloc((size_t)(T * out) * 4);
                dx[k] = malloc((size_t)(T * in) * 4);
            }
            for (int64_t i = 0; i < T * in; i++) x[i] = ft_rng_uniform(&rng) - 0.5f;
            for (int64_t i = 0; i < T * out; i++) dy[i] = ft_rng_uniform(&rng) - 0.5f;
            for (int beta = 0; beta <= 1; beta++) {
                for (int k = 0; k < 2; k++) { /* k 0: dequant + bf16, k 1: fused */
                    for (int64_t i = 0; i < T * out; i++) y[k][i] = 0.25f;
                    for (int64_t i = 0; i < T * in; i++) dx[k][i] = -0.5f;
                    const void *W = k ? (const void *)&t : (const void *)wb;
                    int wt = k ? FT_WTYPE_NF4 : FT_WTYPE_BF16;
                    assert_int_equal(be->ops->linear_fwd(be, y[k], x, W, wt, T, out, in, (float)beta, scr), 0);
                    assert_int_equal(be->ops->linear_bwd_x(be, dx[k], dy, W, wt, T, out, in, (float)beta, scr), 0);
                }
                printf("nf4 linear (%s) T %lld out %lld in %lld beta %d: y[0] %.7g, dx[0] %.7g\n",
                       nested ? "nested" : "plain", (long long)T, (long long)out, (long long)in, beta,
                       y[1][0], dx[1][0]);
                assert_memory_equal(y[0], y[1], (size_t)(T * out) * 4);
                assert_memory_equal(dx[0], dx[1], (size_t)(T * in) * 4);
            }
            if (s == 0) { /* out 32: not a multiple of 64; a wrong element count */
                assert_int_equal(be->ops->linear_fwd(be, y[0], x, &t, FT_WTYPE_NF4, T, 32, 2 * in, 0.0f, scr),
                                 FT_E_INVALID);
                assert_int_equal(be->ops->linear_fwd(be, y[0], x, &t, FT_WTYPE_NF4, T, out, in - 64, 0.0f, scr),
                                 FT_E_INVALID);
            }
            for (int k = 0; k < 2; k++) {
                free(y[k]);
                free(dx[k]);
            }
            free(w); free(codes); free(q); free(absmax); free(nabs); free(wb); free(x); free(dy); free(scr);
        }
    ft_backend_free(be);
}

static void test_tiers_bit_identical(void **state)
{
    (void)state;
    ft_backend *be, *cpu;
    ft_model *m;
    stream_pack sp; /* /tmp: a real file system for the read-ahead (tmpfs: pread) */
    tiny_device_open(&m, &be, &sp, THREADS);
    assert_int_equal(ft_backend_cpu_init(&cpu, THREADS), 0);
    ft_pack_file *pack = sp.pack;
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    int64_t L = m->cfg.num_hidden_layers;
    assert_true(L >= 2);
    tier_sets ts;
    tiers_fill(&ts, L);
    result r[4], rcpu;
    tiers_compare(be, m, pack, b, &ts, r);
    result rg = r[0], rh = r[1], rd = r[2], rm = r[3];
    run(cpu, m, pack, NULL, b, &rcpu); /* host-memory CPU: fp32 dequantized weights */
    printf("host-memory CPU, fp32 weights: loss %.9g\nio (disk tier): %s\n", rcpu.loss, rd.io);
    assert_true(rg.eval_loss == rd.eval_loss && rg.eval_loss == rm.eval_loss);
    ckcfg ck = {0, 2, 0, N_MB};
    uint64_t want = (uint64_t)STEPS * (uint64_t)(L - 1) * N_MB * (uint64_t)(b[0].T * m->cfg.hidden_size) * 4;
    uint64_t blocks = 0;
    for (int64_t l = 0; l < L; l++) blocks += ft_pack_block_bytes(pack, l);
    /* streamed from host: each block twice per step less the two still loaded at the turns */
    assert_true(rh.h2d > 0 && rh.h2d <= (uint64_t)STEPS * 2 * blocks + 2 * blocks);
    assert_int_equal(rg.h2d, 0);
    /* the disk tier went through the read-ahead thread */
    assert_true(rd.dpf && strstr(rd.io, "disk read-ahead") != NULL);
    assert_false(rg.dpf || rh.dpf);
    /* the device mode does the host-memory CPU's math up to bf16 rounding of the operands */
    assert_true(t_relerr(rg.loss, rcpu.loss, 1e-3) < 2e-2);
    assert_true(rg.loss != rcpu.loss); /* and it really ran on bf16 weights */
    /* Again with asynchronous copy lanes (worker threads, every copy LAG_US late): the
     * executor's events alone order the slots, staging buffers and checkpoint sets. */
    ft_backend *ab;
    assert_int_equal(ft_backend_cpu_device_init(&ab, THREADS), 0);
    assert_int_equal(ft_backend_cpu_device_set_lag(ab, LAG_US), 0);
    assert_int_equal(ft_backend_cpu_device_set_lag(ab, LAG_US), FT_E_INVALID);
    const uint8_t *tiers[3] = {ts.host, ts.disk, ts.mix};
    for (int k = 0; k < 4; k++) {
        result ra;
        if (k < 3) run(ab, m, pack, tiers[k], b, &ra);
        else run_ck(ab, m, pack, ts.mix, b, &ck, &ra);
        printf("async lanes, %s: loss %.9g, eval %.9g, disk reads %lld per step, %lld compute spans\n",
               k == 0 ? "host tier" : k == 1 ? "disk tier" : k == 2 ? "mixed tiers" : "mixed + host checkpoints",
               ra.loss, ra.eval_loss, (long long)ra.reads_step, (long long)ra.tl_compute);
        assert_true(ra.loss == rg.loss && ra.eval_loss == rg.eval_loss);
        assert_memory_equal(ra.g, rg.g, (size_t)rg.n * 4);
        assert_int_equal(ra.tl_compute, 2 * L);
        if (k == 1) assert_true(ra.reads_first == 2 * L - 1 && ra.reads_step == 2 * L - 2);
        if (k == 3) assert_true(ra.ck_d2h == want && ra.ck_h2d == want && ra.tl_ckpt == 2 * (L - 1));
        free(ra.g);
    }
    ft_backend_free(ab);
    /* FTUNE_NF4_GEMM=fused: the same bits (the device mode dequantizes tile by tile to the
     * values dequant_nf4 gives) */
    tiers_nf4_fused(be, m, pack, b, &ts, &rg, 0.0);
    cpu->tune.nf4_gemm = FT_NF4_GEMM_FUSED;
    assert_int_equal(ft_exec_nf4_gemm_mode(cpu), FT_NF4_GEMM_DEQUANT); /* host memory: fp32 */
    cpu->tune.nf4_gemm = FT_NF4_GEMM_DEQUANT;
    free(rg.g); free(rh.g); free(rd.g); free(rm.g); free(rcpu.g);
    stream_free_batches(b, N_MB);
    ft_backend_free(cpu);
    tiny_device_close(m, be, &sp);
}

/* Qwen3 through every tier (tiers_cases.h tiers_qwen3). */
static void test_tiers_qwen3(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    tiers_qwen3(be, 1e-3);
    ft_backend_free(be);
}

/* FTUNE_NF4_GEMM=auto: the placer (offload/place.h) probes one layer with the NF4 projections
 * dequantized and with the fused GEMM, finds the outputs equal (bit for bit in the device
 * mode), keeps the faster, and the executor it builds runs that way; its step gives the bits
 * of a dequantizing executor's. */
static void test_place_nf4_auto(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    stream_pack sp;
    tiny_device_open(&m, &be, &sp, THREADS);
    ft_pack_file *pack = sp.pack;
    ft_batch b[1];
    stream_make_batches(b, 1, 24, m->cfg.vocab_size);
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.0f);
    double loss[2];
    for (int k = 0; k < 2; k++) { /* k 0: unset (dequantized), k 1: auto */
        if (k) be->tune.nf4_gemm = FT_NF4_GEMM_AUTO;
        ft_place_opts po = {b[0].T, b[0].seq_len, 1, 0, 0, b[0].pos, b[0].seq_start};
        ft_place_result *res = calloc(1, sizeof *res);
        ft_exec e;
        int rc = ft_place_packed(be, m, &lora, pack, &po, 1, &e, res);
        if (rc) printf("place: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        printf("FTUNE_NF4_GEMM=%s: probed %d, layer fwd+bwd %.3f ms dequantized, %.3f ms fused, "
               "outputs differ by %.3g: %s\n", k ? "auto" : "(unset)", res->nf4_probed,
               res->nf4_t_dequant_path * 1e3, res->nf4_t_fused_path * 1e3, res->nf4_err,
               e.nf4_fused ? "fused" : "dequantized");
        assert_int_equal(res->nf4_probed, k);
        assert_int_equal(e.nf4_fused, res->nf4_fused);
        if (k) {
            assert_true(res->nf4_t_dequant_path > 0 && res->nf4_t_fused_path > 0);
            assert_true(res->nf4_err == 0.0);
            assert_int_equal(e.nf4_fused, res->nf4_t_fused_path < res->nf4_t_dequant_path);
        } else {
            assert_int_equal(e.nf4_fused, 0);
        }
        int64_t nt;
        assert_int_equal(be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4), 0);
        rc = ft_exec_train_step(&e, b, 1, b[0].n_targets, 0, &loss[k], &nt);
        if (rc) printf("train step: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        ft_exec_free(&e);
        free(res);
    }
    assert_true(loss[0] == loss[1]);
    be->tune.nf4_gemm = FT_NF4_GEMM_DEQUANT;
    ft_lora_free(&lora);
    stream_free_batches(b, 1);
    tiny_device_close(m, be, &sp);
}

/* Host checkpoints on a 6-layer model (tiers_cases.h) on the device-mode CPU backend. */
static void test_host_ckpt_deep(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_device_init(&be, THREADS), 0);
    tiers_host_ckpt_deep(be);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dequant_nf4_exact),
                                       cmocka_unit_test(test_linear_bf16),
                                       cmocka_unit_test(test_linear_nf4),
                                       cmocka_unit_test(test_tiers_bit_identical),
                                       cmocka_unit_test(test_tiers_qwen3),
                                       cmocka_unit_test(test_place_nf4_auto),
                                       cmocka_unit_test(test_host_ckpt_deep)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
