/* test_exec.c - the per-layer executor and the LoRA training math on a real (tiny) model:
 * weight-fetch counting under gradient accumulation, accumulation == one big micro-batch,
 * LoRA gradients vs central finite differences through the whole network, PEFT round trip. */
#include "tests/unit/harness.h"

#include "adapters/lora.h"
#include "adapters/peft.h"
#include "offload/exec.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "tests/unit/model_fixture.h"

/* fp32 forward/backward of a 2-layer model vs central differences in fp32 with h = 1e-2:
 * truncation error O(h^2) and rounding O(eps * |L| / h) ~ 1e-5 give a few 1e-3 relative. */
#define FT_TOL_FD_F32_REL 3e-2
#define FT_TOL_FD_F32_ABS 2e-4
/* The same sums computed in a different order (micro-batch split): fp32 reassociation. */
#define FT_TOL_ACCUM_REL 1e-4

typedef model_fix fix;

/* 2 threads; r 4, alpha 8, every target; B = 0 at init makes dA vanish, so A and B random
 * (seed 99, scale 0.2) and every path is exercised */
static int setup(void **state)
{
    const ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    return model_fix_setup(state, 2, &lc, 99, 0.2f);
}

/* rows x S tokens: row r holds two packed sequences (lengths S/2 and S - S/2). */
static ft_batch make_batch(int64_t rows, int64_t S, int64_t V, uint64_t seed)
{
    ft_batch b = {rows, S, rows * S};
    b.ids = malloc(b.T * 4);
    b.targets = malloc(b.T * 4);
    b.pos = malloc(b.T * 4);
    b.seq_start = malloc(b.T * 4);
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int64_t t = 0; t < b.T; t++) b.ids[t] = (int32_t)(ft_rng_next(&rng) % (uint64_t)V);
    for (int64_t r = 0; r < rows; r++) {
        int64_t half = S / 2;
        for (int64_t j = 0; j < S; j++) {
            int64_t t = r * S + j, start = r * S + (j < half ? 0 : half);
            int64_t end = r * S + (j < half ? half : S);
            b.pos[t] = (int32_t)(t - start);
            b.seq_start[t] = (int32_t)start;
            b.targets[t] = t + 1 < end ? b.ids[t + 1] : -100;
            if (b.targets[t] >= 0) b.n_targets++;
        }
    }
    return b;
}

static void free_batch(ft_batch *b)
{
    free(b->ids); free(b->targets); free(b->pos); free(b->seq_start);
}

static ft_batch row_of(const ft_batch *b, int64_t r)
{
    ft_batch o = {1, b->seq_len, b->seq_len};
    int64_t off = r * b->seq_len;
    o.ids = b->ids + off;
    o.targets = b->targets + off;
    o.pos = b->pos + off;
    o.seq_start = malloc(o.T * 4);
    for (int64_t t = 0; t < o.T; t++) {
        o.seq_start[t] = b->seq_start[off + t] - (int32_t)off;
        if (o.targets[t] >= 0) o.n_targets++;
    }
    return o;
}

static void test_fetch_count(void **state)
{
    fix *f = *state;
    ft_exec ex;
    int64_t S = 16, L = f->m->cfg.num_hidden_layers;
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, S, 4, S), 0);
    ft_batch mb[4];
    int64_t nt = 0;
    for (int i = 0; i < 4; i++) {
        mb[i] = make_batch(1, S, f->m->cfg.vocab_size, 10 + i);
        nt += mb[i].n_targets;
    }
    double ls;
    int64_t nv;
    f->be->ops->zero(f->be, f->lora.grads, f->lora.n_params * 4);
    assert_int_equal(ft_exec_train_step(&ex, mb, 4, nt, 0, &ls, &nv), 0);
    assert_int_equal(ex.layer_fetches, 2 * L); /* once forward, once backward per layer */
    assert_int_equal(nv, nt);
    for (int i = 0; i < 4; i++) free_batch(&mb[i]);
    ft_exec_free(&ex);
}

static void test_accum_equals_big_batch(void **state)
{
    fix *f = *state;
    int64_t S = 12, n = f->lora.n_params;
    ft_batch big = make_batch(2, S, f->m->cfg.vocab_size, 5);
    ft_batch r0 = row_of(&big, 0), r1 = row_of(&big, 1);
    float *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    double l1, l2;
    int64_t n1, n2;
    ft_exec ex;
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, 2 * S, 1, S), 0);
    f->be->ops->zero(f->be, f->lora.grads, n * 4);
    assert_int_equal(ft_exec_train_step(&ex, &big, 1, big.n_targets, 0, &l1, &n1), 0);
    memcpy(g1, f->lora.grads, n * 4);
    ft_exec_free(&ex);
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, S, 2, S), 0);
    ft_batch two[2] = {r0, r1};
    f->be->ops->zero(f->be, f->lora.grads, n * 4);
    assert_int_equal(ft_exec_train_step(&ex, two, 2, big.n_targets, 0, &l2, &n2), 0);
    memcpy(g2, f->lora.grads, n * 4);
    ft_exec_free(&ex);
    assert_int_equal(n1, n2);
    assert_true(fabs(l1 - l2) <= FT_TOL_ACCUM_REL * fabs(l1));
    double gmax = 0, dmax = 0;
    for (int64_t i = 0; i < n; i++) {
        gmax = fmax(gmax, fabs(g1[i]));
        dmax = fmax(dmax, fabs(g1[i] - g2[i]));
    }
    printf("accumulation vs one micro-batch: max abs grad diff %.3g (max |g| %.3g)\n", dmax, gmax);
    assert_true(gmax > 0);
    assert_true(dmax <= FT_TOL_ACCUM_REL * gmax);
    free(g1); free(g2); free(r0.seq_start); free(r1.seq_start); free_batch(&big);
}

/* Keeping every layer's activations (no recompute in the backward) gives the same bits as
 * the recompute schedule, with dropout on and two micro-batches. */
static void test_kept_activations_bit_identical(void **state)
{
    fix *f = *state;
    int64_t S = 12, n = f->lora.n_params;
    ft_batch big = make_batch(2, S, f->m->cfg.vocab_size, 8);
    ft_batch two[2] = {row_of(&big, 0), row_of(&big, 1)};
    float *g[2] = {malloc(n * 4), malloc(n * 4)};
    double l[2];
    int64_t nt[2];
    for (int keep = 0; keep <= 1; keep++) {
        ft_exec ex;
        assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, S, 2, S), 0);
        assert_null(ex.kept); /* the CPU recomputes by default */
        if (keep) {
            assert_int_equal(ft_exec_keep_activations(&ex, 0), 0); /* no budget: not kept */
            assert_int_equal(ft_exec_keep_activations(&ex, ft_exec_kept_bytes(&ex)), 1);
        }
        f->be->ops->zero(f->be, f->lora.grads, n * 4);
        assert_int_equal(ft_exec_train_step(&ex, two, 2, big.n_targets, 0xfeed, &l[keep], &nt[keep]), 0);
        memcpy(g[keep], f->lora.grads, n * 4);
        ft_exec_free(&ex);
    }
    printf("kept activations vs recompute: loss %.9g vs %.9g\n", l[1], l[0]);
    assert_true(l[0] == l[1]);
    assert_memory_equal(g[0], g[1], n * 4);
    free(g[0]); free(g[1]); free(two[0].seq_start); free(two[1].seq_start); free_batch(&big);
}

static double mean_loss(ft_exec *ex, const ft_batch *b)
{
    double ls;
    int64_t nv;
    assert_int_equal(ft_exec_eval(ex, b, &ls, &nv), 0);
    return ls / (double)nv;
}

static void test_lora_grad_fd(void **state)
{
    fix *f = *state;
    int64_t S = 10, n = f->lora.n_params;
    ft_batch b = make_batch(1, S, f->m->cfg.vocab_size, 3);
    ft_exec ex;
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, S, 1, S), 0);
    double ls;
    int64_t nv;
    f->be->ops->zero(f->be, f->lora.grads, n * 4);
    assert_int_equal(ft_exec_train_step(&ex, &b, 1, b.n_targets, 0, &ls, &nv), 0);
    float *g = malloc(n * 4);
    memcpy(g, f->lora.grads, n * 4);
    ft_rng rng;
    ft_rng_seed(&rng, 1234);
    double max_rel = 0;
    int checked = 0;
    const float h = 1e-2f;
    for (int k = 0; k < 40; k++) {
        int64_t i = (int64_t)(ft_rng_next(&rng) % (uint64_t)n);
        float keep = f->lora.params[i];
        f->lora.params[i] = keep + h;
        double lp = mean_loss(&ex, &b);
        f->lora.params[i] = keep - h;
        double lm = mean_loss(&ex, &b);
        f->lora.params[i] = keep;
        double num = (lp - lm) / (2.0 * h);
        double err = fabs(num - g[i]);
        if (err > FT_TOL_FD_F32_ABS + FT_TOL_FD_F32_REL * fabs(num))
            printf("  param %lld: analytic %.6g numeric %.6g\n", (long long)i, g[i], num);
        assert_true(err <= FT_TOL_FD_F32_ABS + FT_TOL_FD_F32_REL * fabs(num));
        if (fabs(num) > 1e-3) max_rel = fmax(max_rel, err / fabs(num));
        checked++;
    }
    printf("LoRA grads through the network vs finite differences: max rel err %.3g over %d params\n",
           max_rel, checked);
    free(g);
    free_batch(&b);
    ft_exec_free(&ex);
}

static void test_peft_roundtrip(void **state)
{
    fix *f = *state;
    char *dir = t_tmpdir();
    assert_int_equal(ft_peft_save(dir, &f->lora, f->m, TINY), 0);
    ft_lora_cfg c;
    assert_int_equal(ft_peft_read_config(dir, &c), 0);
    assert_int_equal(c.r, f->lora.cfg.r);
    assert_true(c.alpha == f->lora.cfg.alpha);
    assert_int_equal(c.targets, f->lora.cfg.targets);
    ft_lora l2;
    assert_int_equal(ft_lora_init(&l2, f->m, &c, f->be), 0);
    assert_int_equal(ft_peft_load_weights(dir, &l2), 0);
    assert_memory_equal(l2.params, f->lora.params, f->lora.n_params * sizeof(float));
    ft_lora_free(&l2);
    /* wrong rank -> shape error naming the file */
    c.r = 2;
    assert_int_equal(ft_lora_init(&l2, f->m, &c, f->be), 0);
    assert_true(ft_peft_load_weights(dir, &l2) < 0);
    assert_non_null(strstr(ft_errmsg(), "adapter_model.safetensors"));
    ft_lora_free(&l2);
    free(dir);
}

/* The device bytes of the base count the same whether the model's weights are read or only
 * its shapes are known (a deferred model: the resident/streamed decision is taken before any
 * weight is read): qwen2's q/k/v biases included, which a deferred model has no pointers for. */
static void test_weight_bytes_deferred(void **state)
{
    (void)state;
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 1), 0);
    const char *models[] = {TINY, "tests/fixtures/gguf/qwen2-tiny.gguf"};
    for (int i = 0; i < 2; i++) {
        ft_model *a = NULL, *b = NULL;
        assert_int_equal(ft_model_load(&a, models[i]), 0);
        assert_int_equal(ft_model_load_deferred(&b, models[i]), 0);
        assert_true(ft_model_deferred(b));
        size_t wa = ft_exec_weight_bytes(dev, a), wb = ft_exec_weight_bytes(dev, b);
        printf("%s: %zu bytes loaded, %zu deferred\n", models[i], wa, wb);
        assert_true(wa == wb);
        ft_model_free(a);
        ft_model_free(b);
    }
    ft_backend_free(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_count),
        cmocka_unit_test(test_accum_equals_big_batch),
        cmocka_unit_test(test_kept_activations_bit_identical),
        cmocka_unit_test(test_lora_grad_fd),
        cmocka_unit_test(test_peft_roundtrip),
        cmocka_unit_test(test_weight_bytes_deferred),
    };
    return cmocka_run_group_tests(tests, setup, model_fix_teardown);
}
