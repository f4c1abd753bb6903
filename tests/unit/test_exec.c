/* test_exec.c - the per-layer executor and the LoRA training math on a real (tiny) model:
 * weight-fetch counting under gradient accumulation, accumulation == one big micro-batch,
 * LoRA gradients vs central finite differences through the whole network, PEFT round trip,
 * per-example losses of packed micro-batches (ft_exec_eval_spans). */
#include "tests/unit/harness.h"

#include "src/model/lora.h"
#include "adapters/peft.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
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

/* n_ex synthetic examples of 1..max_len tokens (random ids, about a third of the labels -100,
 * at least one trained target each), for ft_pack. */
static ft_example *rand_examples(int64_t n_ex, int64_t max_len, int64_t V, uint64_t seed)
{
    ft_example *ex = calloc((size_t)n_ex, sizeof *ex);
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int64_t i = 0; i < n_ex; i++) {
        int64_t n = 2 + (int64_t)(ft_rng_next(&rng) % (uint64_t)(max_len - 1));
        ex[i].n = n;
        ex[i].ids = malloc((size_t)n * 4);
        ex[i].labels = malloc((size_t)n * 4);
        for (int64_t t = 0; t < n; t++) {
            ex[i].ids[t] = (int32_t)(ft_rng_next(&rng) % (uint64_t)V);
            ex[i].labels[t] = ft_rng_next(&rng) % 3 == 0 ? FT_IGNORE_INDEX : ex[i].ids[t];
        }
        ex[i].labels[n - 1] = ex[i].ids[n - 1]; /* one trained target at least */
    }
    return ex;
}

static void free_examples(ft_example *ex, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        free(ex[i].ids);
        free(ex[i].labels);
    }
    free(ex);
}

/* The spans of batch b's examples (ex_index, lengths from ex) into spans (2 n_ex). */
static void spans_of(const ft_batch *b, const ft_example *ex, int64_t *spans)
{
    int64_t t0 = 0;
    for (int64_t k = 0; k < b->n_ex; k++) {
        spans[2 * k] = t0;
        spans[2 * k + 1] = ex[b->ex_index[k]].n;
        t0 += ex[b->ex_index[k]].n;
    }
    assert_int_equal(t0, b->T);
}

/* The spans' heads vs the whole micro-batch's: the LM head's GEMM over other row counts
 * rounds a row's fp32 logits differently now and then (OpenBLAS blocks by the row count), and
 * the double sums run in another order: measured 6e-11 relative on ~70 rows. */
#define FT_TOL_SPAN_SUM_REL 1e-9
/* One example alone vs packed with others: the same rows through GEMMs of other row counts
 * (bit for bit on the CPU backend; bf16 products on cpu-device round alike). */
#define FT_TOL_SPAN_ALONE_REL 1e-5

/* ft_exec_eval_spans on packed micro-batches of the tiny model, on the CPU backend (with
 * the fixture's adapter) and on cpu-device (the base alone): its whole-batch head is
 * ft_exec_eval's bit for bit, the spans' nll add up to it and their counts to its count, and
 * each example's nll equals ft_exec_eval of a micro-batch holding that example alone. */
static void test_eval_spans(void **state)
{
    fix *f = *state;
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    const int64_t V = f->m->cfg.vocab_size, S = 24, rows = 3, n_ex = 13;
    ft_example *ex = rand_examples(n_ex, S, V, 77);
    for (int bi = 0; bi < 2; bi++) {
        ft_backend *be = bi ? dev : f->be;
        ft_exec e;
        assert_int_equal(ft_exec_init(&e, be, f->m, bi ? NULL : &f->lora, rows * S, 1, S), 0);
        ft_batch *b;
        int64_t nb;
        assert_int_equal(ft_batch_pack(&b, &nb, ex, n_ex, S, rows, 0), 0);
        double *alone = calloc((size_t)n_ex, sizeof *alone);
        int64_t *alone_n = calloc((size_t)n_ex, sizeof *alone_n);
        for (int64_t i = 0; i < n_ex; i++) { /* each example in a micro-batch of its own */
            ft_batch *one;
            int64_t n1;
            assert_int_equal(ft_batch_pack(&one, &n1, ex + i, 1, S, 1, 0), 0);
            assert_int_equal(n1, 1);
            assert_int_equal(ft_exec_eval(&e, one, &alone[i], &alone_n[i]), 0);
            ft_batches_free(one, n1);
        }
        double max_sum = 0, max_alone = 0;
        int64_t seen = 0;
        for (int64_t i = 0; i < nb; i++) {
            int64_t *spans = malloc((size_t)(2 * b[i].n_ex) * sizeof *spans);
            double *nll = malloc((size_t)b[i].n_ex * sizeof *nll), ls, ls_spans;
            int64_t *nt = malloc((size_t)b[i].n_ex * sizeof *nt), nv, nv_spans;
            spans_of(&b[i], ex, spans);
            assert_int_equal(ft_exec_eval(&e, &b[i], &ls, &nv), 0);
            assert_int_equal(ft_exec_eval_spans(&e, &b[i], spans, b[i].n_ex, nll, nt, &ls_spans,
                                                &nv_spans), 0);
            assert_true(ls_spans == ls); /* the same head on the same forward */
            assert_int_equal(nv_spans, nv);
            double sum = 0;
            int64_t cnt = 0;
            for (int64_t k = 0; k < b[i].n_ex; k++) {
                int64_t x = b[i].ex_index[k];
                sum += nll[k];
                cnt += nt[k];
                assert_int_equal(nt[k], alone_n[x]);
                double d = fabs(nll[k] - alone[x]) / fabs(alone[x]);
                max_alone = fmax(max_alone, d);
                assert_true(d <= FT_TOL_SPAN_ALONE_REL);
                seen++;
            }
            assert_int_equal(cnt, nv);
            double d = fabs(sum - ls) / fabs(ls);
            max_sum = fmax(max_sum, d);
            assert_true(d <= FT_TOL_SPAN_SUM_REL);
            /* without the whole head: the same spans' values */
            double nll2[64];
            int64_t nt2[64];
            assert_true(b[i].n_ex <= 64);
            assert_int_equal(ft_exec_eval_spans(&e, &b[i], spans, b[i].n_ex, nll2, nt2, NULL, NULL), 0);
            assert_memory_equal(nll2, nll, (size_t)b[i].n_ex * sizeof *nll);
            assert_memory_equal(nt2, nt, (size_t)b[i].n_ex * sizeof *nt);
            free(spans);
            free(nll);
            free(nt);
        }
        assert_int_equal(seen, n_ex);
        printf("%s: %lld examples in %lld micro-batches: spans' nll sum vs whole head max rel %.3g; "
               "packed vs alone max rel %.3g\n", bi ? "cpu-device" : "cpu", (long long)n_ex,
               (long long)nb, max_sum, max_alone);
        /* a span outside the micro-batch, a negative count: refused before any work */
        int64_t bad[2] = {b[0].T - 1, 2};
        double x;
        int64_t xn;
        assert_int_equal(ft_exec_eval_spans(&e, &b[0], bad, 1, &x, &xn, NULL, NULL), FT_E_INVALID);
        assert_non_null(strstr(ft_errmsg(), "outside"));
        assert_int_equal(ft_exec_eval_spans(&e, &b[0], bad, -1, &x, &xn, NULL, NULL), FT_E_INVALID);
        free(alone);
        free(alone_n);
        ft_batches_free(b, nb);
        ft_exec_free(&e);
    }
    free_examples(ex, n_ex);
    ft_backend_free(dev);
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

/* The public constructor (exec.h ft_exec_open) makes what ft_exec_init makes: the same
 * train-step bits and the same counts through the accessors; the adapter swap and NEFTune
 * setters reach the executor; bad sizes are refused with *out NULL. */
static void test_open_and_accessors(void **state)
{
    fix *f = *state;
    int64_t S = 16, n = f->lora.n_params, L = f->m->cfg.num_hidden_layers;
    ft_batch mb[2] = {make_batch(1, S, f->m->cfg.vocab_size, 21), make_batch(1, S, f->m->cfg.vocab_size, 22)};
    int64_t nt = mb[0].n_targets + mb[1].n_targets, nv[2];
    double ls[2];
    float *g = malloc(n * 4);
    ft_exec ex;
    assert_int_equal(ft_exec_init(&ex, f->be, f->m, &f->lora, S, 2, S), 0);
    f->be->ops->zero(f->be, f->lora.grads, n * 4);
    assert_int_equal(ft_exec_train_step(&ex, mb, 2, nt, 0, &ls[0], &nv[0]), 0);
    memcpy(g, f->lora.grads, n * 4);
    ft_exec_free(&ex);

    ft_exec *e = NULL;
    ft_exec_cfg c = {.lora = &f->lora, .T_max = S, .n_micro = 2}; /* rope_seq_len 0: T_max */
    assert_int_equal(ft_exec_open(&e, f->be, f->m, &c), 0);
    assert_non_null(e);
    assert_ptr_equal(ft_exec_adapter(e), &f->lora);
    f->be->ops->zero(f->be, f->lora.grads, n * 4);
    assert_int_equal(ft_exec_train_step(e, mb, 2, nt, 0, &ls[1], &nv[1]), 0);
    assert_true(ls[0] == ls[1] && nv[0] == nv[1]);
    assert_memory_equal(g, f->lora.grads, n * 4);
    ft_exec_info in;
    ft_exec_get_info(e, &in);
    assert_int_equal(in.T_max, S);
    assert_int_equal(in.n_micro_max, 2);
    assert_int_equal(in.layer_fetches, 2 * L);
    assert_true(in.arena_bytes > 0 && !in.kept && !in.nf4_fused && !in.on_device);
    assert_int_equal(in.weights_bytes, 0); /* the CPU reads the model's own arrays */
    /* NEFTune on: the step's loss moves (noise on the embeddings); off again: the same bits */
    ft_exec_set_neftune(e, 5.0, 1234);
    double ln;
    int64_t nn;
    assert_int_equal(ft_exec_train_step(e, mb, 2, nt, 0, &ln, &nn), 0);
    assert_true(ln != ls[0]);
    ft_exec_set_neftune(e, 0.0, 0);
    assert_int_equal(ft_exec_train_step(e, mb, 2, nt, 0, &ln, &nn), 0);
    assert_true(ln == ls[0]);
    /* the base alone, then the adapter back */
    assert_ptr_equal(ft_exec_set_adapter(e, NULL), &f->lora);
    assert_null(ft_exec_adapter(e));
    double lb;
    assert_int_equal(ft_exec_eval(e, &mb[0], &lb, &nn), 0);
    assert_ptr_equal(ft_exec_set_adapter(e, &f->lora), NULL);
    ft_exec_close(e);
    ft_exec_close(NULL);

    /* on a device (cpu-device): the base copied in, the executor placed on the device */
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    ft_lora_cfg lc0 = f->lora.cfg;
    ft_lora dl;
    assert_int_equal(ft_lora_init(&dl, f->m, &lc0, dev), 0);
    c.lora = &dl;
    assert_int_equal(ft_exec_open(&e, dev, f->m, &c), 0);
    ft_exec_get_info(e, &in);
    assert_true(in.on_device && in.weights_bytes > 0);
    ft_exec_close(e);
    ft_lora_free(&dl);
    ft_backend_free(dev);
    c.lora = &f->lora;

    c.T_max = 0;
    e = (ft_exec *)&c; /* not NULL before the call */
    assert_true(ft_exec_open(&e, f->be, f->m, &c) < 0);
    assert_null(e);
    assert_int_equal(ft_exec_open(&e, f->be, f->m, NULL), FT_E_INVALID);
    assert_null(e);
    free(g);
    free_batch(&mb[0]);
    free_batch(&mb[1]);
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
        cmocka_unit_test(test_eval_spans),
        cmocka_unit_test(test_open_and_accessors),
    };
    return cmocka_run_group_tests(tests, setup, model_fix_teardown);
}
