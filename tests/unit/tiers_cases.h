/* tiers_cases.h - the runs shared by the device-executor tests: tests/unit/test_tiers.c (the
 * device-mode CPU backend, in CI) and tests/gpu/test_cuda_stream.c (CUDA). run_ck trains STEPS
 * optimizer steps with a packed base placed by tier and the checkpoints placed as asked, and
 * returns the losses, LoRA gradients, read counts, copied bytes and timeline spans;
 * tiers_compare checks the tiers and host checkpoints against all-on-device on the tiny model;
 * tiers_host_ckpt_deep checks host checkpoints on a 6-layer model. Include after harness.h
 * with TINY, N_MB and STEPS defined. */
#ifndef FT_TIERS_CASES_H
#define FT_TIERS_CASES_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/lora.h"
#include "offload/actckpt.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/prefetch.h"
#include "offload/timeline.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "tests/unit/stream_fixture.h"

typedef struct result {
    double loss, eval_loss;
    float *g;
    int64_t n, reads_first, reads_step, tl_compute, tl_ckpt;
    uint64_t h2d, ck_d2h, ck_h2d;
    int dpf;
    char io[512];
} result;

/* Checkpoint placement of a run: sets == 0: all on the device; else host checkpoints with
 * dev_layers kept on the device and `sets` ring sets. */
typedef struct ckcfg {
    int64_t dev_layers;
    int sets;
    int keep;
    int n_mb;
} ckcfg;

/* STEPS optimizer steps of ck->n_mb micro-batches. pack == NULL: the model's weights copied
 * to the device (ft_exec_init); else the pack placed by tier (NULL: all on the device); on a
 * host-memory backend the pack is streamed (ft_exec_use_pack_ex). */
static void run_ck(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                   const ft_batch *b, const ckcfg *ck, result *r)
{
    memset(r, 0, sizeof *r);
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.0f);
    ft_exec e;
    int n_mb = ck->n_mb, rc, host = be->ops->host_memory;
    if (ck->sets)
        rc = ft_exec_init_ckpt_host(&e, be, m, &lora, b[0].T, n_mb, b[0].seq_len,
                                    pack == NULL || host, ck->dev_layers, ck->sets);
    else
        rc = ft_exec_init_ex(&e, be, m, &lora, b[0].T, n_mb, b[0].seq_len, pack == NULL || host);
    if (rc) printf("init: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    if (pack) {
        rc = host ? ft_exec_use_pack_ex(&e, pack, 0) : ft_exec_use_pack_tiers(&e, pack, tier, 2, 2);
        if (rc) printf("use_pack: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
    }
    if (ck->keep) assert_int_equal(ft_exec_keep_activations(&e, (size_t)-1), 1);
    int64_t ntok = 0;
    for (int i = 0; i < n_mb; i++) ntok += b[i].n_targets;
    ft_timeline tl = {0};
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
    r->dpf = e.dpf != NULL;
    if (!host) ft_exec_io_describe(&e, r->io, sizeof r->io);
    ft_exec_free(&e);
    ft_lora_free(&lora);
}

static void run(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                const ft_batch *b, result *r)
{
    ckcfg ck = {0, 0, 0, N_MB};
    run_ck(be, m, pack, tier, b, &ck, r);
}

/* Per-layer tier arrays of an L-layer model (L <= 64): all pinned host, all disk, and the
 * three mixed (layer l in tier l % 3). */
typedef struct tier_sets {
    uint8_t host[64], disk[64], mix[64];
} tier_sets;

static void tiers_fill(tier_sets *ts, int64_t L)
{
    assert_true(L >= 1 && L <= 64);
    for (int64_t l = 0; l < L; l++) {
        ts->host[l] = FT_TIER_HOST;
        ts->disk[l] = FT_TIER_DISK;
        ts->mix[l] = (uint8_t)(l % 3);
    }
}

/* The comparison both device tests make on the tiny model's pack: every block on the device
 * (r[0]), in pinned host memory (r[1]), on disk (r[2]) and mixed (r[3]), then host checkpoints
 * with every block on the device and with mixed tiers. Asserts bit-identical losses and LoRA
 * gradients, the exact checkpoint bytes each way and spans, the disk tier's reads (2L - 1, then
 * 2L - 2 per step with grad-accum N_MB) and one compute span per layer visit. r[] stays with
 * the caller (free r[i].g). */
static void tiers_compare(ft_backend *be, const ft_model *m, ft_pack_file *pack, const ft_batch *b,
                          const tier_sets *ts, result r[4])
{
    const int64_t L = m->cfg.num_hidden_layers;
    run(be, m, pack, NULL, b, &r[0]);
    run(be, m, pack, ts->host, b, &r[1]);
    run(be, m, pack, ts->disk, b, &r[2]);
    run(be, m, pack, ts->mix, b, &r[3]);
    /* host checkpoints: with every block on the device, and with streamed blocks (both lanes) */
    ckcfg ck = {0, 2, 0, N_MB};
    result rc1, rc2;
    run_ck(be, m, pack, NULL, b, &ck, &rc1);
    run_ck(be, m, pack, ts->mix, b, &ck, &rc2);
    uint64_t want = (uint64_t)STEPS * (uint64_t)(L - 1) * N_MB * (uint64_t)(b[0].T * m->cfg.hidden_size) * 4;
    printf("host checkpoints: loss %.9g / %.9g (streamed), %llu bytes each way (expected %llu), "
           "%lld checkpoint spans\n", rc1.loss, rc2.loss, (unsigned long long)rc2.ck_d2h,
           (unsigned long long)want, (long long)rc2.tl_ckpt);
    assert_true(r[0].loss == rc1.loss && r[0].loss == rc2.loss && r[0].eval_loss == rc2.eval_loss);
    assert_memory_equal(r[0].g, rc1.g, (size_t)r[0].n * 4);
    assert_memory_equal(r[0].g, rc2.g, (size_t)r[0].n * 4);
    assert_true(rc1.ck_d2h == want && rc1.ck_h2d == want && rc2.ck_d2h == want && rc2.ck_h2d == want);
    assert_int_equal(rc2.tl_ckpt, 2 * (L - 1)); /* one store and one load of each stored layer */
    free(rc1.g);
    free(rc2.g);
    printf("loss device %.9g host %.9g disk %.9g mix %.9g; disk reads first step %lld, then %lld "
           "(%lld layers, grad-accum %d); h2d bytes host %llu; timeline compute spans %lld\n",
           r[0].loss, r[1].loss, r[2].loss, r[3].loss, (long long)r[2].reads_first,
           (long long)r[2].reads_step, (long long)L, N_MB, (unsigned long long)r[1].h2d,
           (long long)r[2].tl_compute);
    for (int k = 1; k < 4; k++) {
        assert_true(r[0].loss == r[k].loss);
        assert_memory_equal(r[0].g, r[k].g, (size_t)r[0].n * 4);
    }
    assert_int_equal(r[2].reads_first, 2 * L - 1);
    assert_int_equal(r[2].reads_step, 2 * L - 2);
    assert_int_equal(r[0].reads_step, 0);
    assert_int_equal(r[2].tl_compute, 2 * L); /* one span per layer visit */
}

/* FTUNE_NF4_GEMM=fused (offload/exec.h ft_exec_nf4_gemm_mode): the NF4 projections the fused
 * kernels take (on the tiny model q, o, gate, up and down; k and v are 32 wide) go to
 * linear_fwd/linear_bwd_x as FT_WTYPE_NF4 straight from the block, and the bf16 staging shrinks by
 * exactly theirs; runs with every block on the device, streamed from pinned host memory and
 * from disk give bit-identical results among themselves, and against ref (the dequantizing
 * run, all on the device) bit-identical results when tol is 0, else a loss within tol
 * (relative) and LoRA gradients within 10 tol of the largest. */
static void tiers_nf4_fused(ft_backend *be, const ft_model *m, ft_pack_file *pack, const ft_batch *b,
                            const tier_sets *ts, const result *ref, double tol)
{
    size_t staged = ft_exec_packed_weight_bytes(be, m, pack, 0);
    size_t fused_bytes = ft_exec_packed_weight_bytes(be, m, pack, 1);
    assert_int_equal(ft_exec_nf4_gemm_mode(be), FT_NF4_GEMM_DEQUANT);
    be->tune.nf4_gemm = FT_NF4_GEMM_AUTO;
    assert_int_equal(ft_exec_nf4_gemm_mode(be), FT_NF4_GEMM_AUTO);
    be->tune.nf4_gemm = FT_NF4_GEMM_FUSED;
    assert_int_equal(ft_exec_nf4_gemm_mode(be), FT_NF4_GEMM_FUSED);
    int64_t C = m->cfg.hidden_size, F = m->cfg.intermediate_size;
    int64_t qo = m->cfg.num_attention_heads * m->cfg.head_dim;
    size_t want_saved = 4 * (size_t)((C * qo + 1) / 2 + 16 + (qo * C + 1) / 2 + 16 + 3 * ((F * C + 1) / 2 + 16));
    printf("fused NF4: packed weight bytes %zu -> %zu (staging of q, o, gate, up, down: %zu)\n", staged,
           fused_bytes, want_saved);
    assert_true(staged - fused_bytes == want_saved);
    const uint8_t *tiers[3] = {NULL, ts->host, ts->disk};
    result r[3];
    for (int k = 0; k < 3; k++) {
        run(be, m, pack, tiers[k], b, &r[k]);
        double gmax = 0, gerr = 0;
        for (int64_t i = 0; i < ref->n; i++) {
            gmax = fmax(gmax, fabs(ref->g[i]));
            gerr = fmax(gerr, fabs((double)r[k].g[i] - ref->g[i]));
        }
        printf("fused NF4, %s: loss %.9g, eval %.9g (dequantized: %.9g, %.9g); LoRA gradients: "
               "max |difference| %.3g of max |g| %.3g\n", k == 0 ? "device" : k == 1 ? "host tier" : "disk tier",
               r[k].loss, r[k].eval_loss, ref->loss, ref->eval_loss, gerr, gmax);
        if (tol == 0) {
            assert_true(r[k].loss == ref->loss && r[k].eval_loss == ref->eval_loss);
            assert_memory_equal(r[k].g, ref->g, (size_t)ref->n * 4);
        } else {
            assert_true(fabs(r[k].loss - ref->loss) <= tol * fabs(ref->loss));
            assert_true(fabs(r[k].eval_loss - ref->eval_loss) <= tol * fabs(ref->eval_loss));
            assert_true(gerr <= 10 * tol * gmax);
        }
        if (k) {
            assert_true(r[k].loss == r[0].loss && r[k].eval_loss == r[0].eval_loss);
            assert_memory_equal(r[k].g, r[0].g, (size_t)ref->n * 4);
        }
    }
    for (int k = 0; k < 3; k++) free(r[k].g);
    be->tune.nf4_gemm = FT_NF4_GEMM_DEQUANT;
}

/* Host checkpoints on a 6-layer model with its weights on the device: every ring size and
 * device-layer count, grad-accum 1 and 4, recomputed and kept activations. */
static void tiers_host_ckpt_deep(ft_backend *be)
{
    ft_model *tiny;
    assert_int_equal(ft_model_load(&tiny, TINY), 0);
    const int64_t L = 6;
    ft_model *m = stream_deepen(tiny, L);
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
}

/* A Qwen3 model (per-head q/k RMSNorm, whose weights travel in each layer's block as the
 * Q_NORM / K_NORM records; H*D != hidden): every tier gives the bits of the all-on-device
 * run, and it matches the host-memory CPU (fp32 weights) within tol (relative to the loss):
 * bf16 operands on a device backend. The model is t_tiny_model("--qwen3"). */
static void tiers_qwen3(ft_backend *be, double tol)
{
    char *path = t_tiny_model("--qwen3");
    assert_non_null(path);
    ft_backend *cpu;
    assert_int_equal(ft_backend_cpu_init(&cpu, 2), 0);
    ft_model *m;
    assert_int_equal(ft_model_load(&m, path), 0);
    assert_true(m->cfg.qk_norm && m->layers[0].q_norm);
    assert_true(m->cfg.num_attention_heads * m->cfg.head_dim != m->cfg.hidden_size);
    stream_pack sp;
    stream_pack_open(&sp, path);
    ft_batch b[N_MB];
    stream_make_batches(b, N_MB, 24, m->cfg.vocab_size);
    tier_sets ts;
    tiers_fill(&ts, m->cfg.num_hidden_layers);
    result r[4], rcpu;
    tiers_compare(be, m, sp.pack, b, &ts, r); /* asserts the tiers' bits equal */
    run(cpu, m, sp.pack, NULL, b, &rcpu);
    double e = t_relerr(r[0].loss, rcpu.loss, 1e-3);
    printf("qwen3 (%s): loss %.9g, host-memory CPU (fp32 weights) %.9g, relative %.3g\n",
           be->ops->name, r[0].loss, rcpu.loss, e);
    assert_true(e < tol);
    for (int k = 0; k < 4; k++) free(r[k].g);
    free(rcpu.g);
    stream_free_batches(b, N_MB);
    stream_pack_close(&sp);
    ft_model_free(m);
    ft_backend_free(cpu);
    assert_int_equal(t_rmtree(path), 0);
}

#endif
