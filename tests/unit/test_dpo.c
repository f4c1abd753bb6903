/* test_dpo.c - DPO (src/train/dpo.h, dpo_run.h, offload/exec.h ft_exec_train_step_seq):
 *   - the pair loss of each type (sigmoid, hinge, ipo, robust) against its formula (TRL 1.16
 *     DPOTrainer._compute_loss) and its derivatives against central differences in double;
 *     policy == reference gives ln 2 for sigmoid; bad settings are refused;
 *   - the executor's per-sequence losses: ft_exec_eval_seq's nll of each sequence is the
 *     token loss of that sequence alone (ft_exec_eval on a micro-batch holding only it), and
 *     they sum to the micro-batch's;
 *   - a sequence objective whose scales are 1 / (the step's targets) is the token loss: its
 *     LoRA gradients equal ft_exec_train_step's (to fp32 rounding: the head scales after the
 *     CE instead of inside it), over two micro-batches;
 *   - the DPO step's LoRA gradients (sigmoid and ipo) against central differences of the mean
 *     pair loss computed from ft_exec_eval_seq, on tests/fixtures/tiny-llama with B != 0;
 *   - the device executor (cpu-device backend, NF4 pack): streamed tiers, host checkpoints and
 *     kept activations give the DPO step's bits of every block resident;
 *   - whole runs (ft_train_run, method DPO, on examples/data/alpaca-seed-tasks/
 *     alpaca_seed_pref.jsonl): the step-0 eval and, with dropout off, the first step's loss
 *     are ln 2 (policy == reference); metrics.jsonl and summary.json carry the DPO fields; a
 *     run stopped after 2 of 4 steps and resumed ends bit-identical to an uninterrupted one
 *     (the reference recomputed), also stopped in the second epoch (pairs re-packed) and with
 *     an --init-adapter reference; a resume with another beta or loss, or without the
 *     --init-adapter the run started from, is refused naming it; bad settings are refused
 *     before anything loads. */
#include "tests/unit/harness.h"

#include <math.h>
#include <signal.h>

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/plan.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/model.h"
#include "src/train/dpo.h"
#include "src/train/dpo_refcache.h"
#include "src/train/dpo_run.h"
#include "src/train/trainer.h"
#include "tests/unit/stream_fixture.h"
#include "tests/unit/train_fixture.h"

#define THREADS 2
/* fp32 forward/backward vs central differences in fp32 with h = 1e-2 (test_exec.c's bounds) */
#define TOL_FD_REL 3e-2
#define TOL_FD_ABS 2e-4

/* ---- the pair loss ---------------------------------------------------------------------- */

static double pair_loss(const ft_dpo_cfg *c, const double x[4], const int64_t n[2])
{
    ft_dpo_pair o;
    assert_int_equal(ft_dpo_pair_loss(c, x[0], n[0], x[1], n[1], x[2], x[3], &o), 0);
    return o.loss;
}

static double log_sigmoid_ref(double x) { return -log(1.0 + exp(-x)); }

static void test_pair_loss(void **state)
{
    (void)state;
    const int types[6] = {FT_DPO_SIGMOID, FT_DPO_HINGE, FT_DPO_IPO, FT_DPO_ROBUST, FT_DPO_ORPO,
                          FT_DPO_SIMPO};
    ft_rng g;
    ft_rng_seed(&g, 11);
    for (int t = 0; t < 6; t++) {
        ft_dpo_cfg c = {types[t], 0.1 + 0.2 * t, types[t] == FT_DPO_ROBUST ? 0.2 : 0.0, 0.5};
        for (int k = 0; k < 50; k++) {
            /* nll chosen, nll rejected, ref chosen, ref rejected (nats), counts */
            double x[4];
            for (int i = 0; i < 4; i++) x[i] = 20.0 + 30.0 * ft_rng_uniform(&g);
            int64_t n[2] = {1 + (int64_t)(ft_rng_next(&g) % 40), 1 + (int64_t)(ft_rng_next(&g) % 40)};
            ft_dpo_pair o;
            assert_int_equal(ft_dpo_pair_loss(&c, x[0], n[0], x[1], n[1], x[2], x[3], &o), 0);
            double lc = x[2] - x[0], lr = x[3] - x[1], d = lc - lr, b = c.beta, want = NAN;
            if (types[t] == FT_DPO_SIGMOID) want = -log_sigmoid_ref(b * d);
            else if (types[t] == FT_DPO_HINGE) want = fmax(0.0, 1.0 - b * d);
            else if (types[t] == FT_DPO_IPO) want = pow(lc / n[0] - lr / n[1] - 1.0 / (2 * b), 2);
            else if (types[t] == FT_DPO_ROBUST)
                want = (-(1 - c.label_smoothing) * log_sigmoid_ref(b * d) +
                        c.label_smoothing * log_sigmoid_ref(-b * d)) / (1 - 2 * c.label_smoothing);
            /* reference-free, on mean log-probabilities (the ref arguments are ignored) */
            double a = -x[0] / n[0], bb = -x[1] / n[1];
            if (types[t] == FT_DPO_ORPO) /* -a - beta log sigmoid(log odds(a) - log odds(b)) */
                want = -a - b * log_sigmoid_ref(log(exp(a) / (1 - exp(a))) - log(exp(bb) / (1 - exp(bb))));
            if (types[t] == FT_DPO_SIMPO) want = -log_sigmoid_ref(b * (a - bb) - c.simpo_gamma);
            assert_true(fabs(o.loss - want) <= 1e-11 * (1 + fabs(want)));
            if (ft_dpo_reference_free(types[t]))
                assert_true(o.reward_chosen == b * a && o.reward_rejected == b * bb);
            else
                assert_true(o.reward_chosen == b * lc && o.reward_rejected == b * lr);
            /* derivatives vs central differences (hinge: away from its kink) */
            if (types[t] == FT_DPO_HINGE && fabs(1.0 - b * d) < 1e-3) continue;
            const double h = 1e-5;
            for (int i = 0; i < 2; i++) {
                double xp[4], xm[4];
                memcpy(xp, x, sizeof xp);
                memcpy(xm, x, sizeof xm);
                xp[i] += h;
                xm[i] -= h;
                double num = (pair_loss(&c, xp, n) - pair_loss(&c, xm, n)) / (2 * h);
                double ana = i ? o.d_nll_rejected : o.d_nll_chosen;
                assert_true(fabs(num - ana) <= 1e-6 * (1 + fabs(num)));
            }
        }
    }
    /* policy == reference: sigmoid gives ln 2 and -/+ beta/2; no reward accuracy */
    ft_dpo_cfg c = {FT_DPO_SIGMOID, 0.1, 0};
    ft_dpo_pair o;
    assert_int_equal(ft_dpo_pair_loss(&c, 31.5, 7, 12.25, 3, 31.5, 12.25, &o), 0);
    assert_true(o.loss == log(2.0));
    assert_true(o.d_nll_chosen == 0.05 && o.d_nll_rejected == -0.05);
    ft_dpo_stats st = {0};
    ft_dpo_stats_add(&st, &o, 31.5, 7, 12.25, 3);
    assert_true(st.pairs == 1 && st.tokens == 10 && st.accurate == 0 && st.margin == 0);
    assert_true(st.logp_chosen == -31.5 && st.logp_rejected == -12.25);
    /* large margins stay finite (no exp overflow) */
    assert_int_equal(ft_dpo_pair_loss(&c, 0, 1, 1e5, 1, 1e5, 0, &o), 0);
    assert_true(o.loss == 0 || (o.loss > 0 && o.loss < 1e-300));
    assert_int_equal(ft_dpo_pair_loss(&c, 1e5, 1, 0, 1, 0, 1e5, &o), 0);
    assert_true(fabs(o.loss - 2e4) < 1e-6 && fabs(o.d_nll_chosen - 0.1) < 1e-12);
    /* refused */
    ft_dpo_cfg bad = {FT_DPO_SIGMOID, 0, 0};
    assert_int_equal(ft_dpo_pair_loss(&bad, 1, 1, 1, 1, 1, 1, &o), FT_E_INVALID);
    bad = (ft_dpo_cfg){FT_DPO_ROBUST, 0.1, 0.5};
    assert_int_equal(ft_dpo_pair_loss(&bad, 1, 1, 1, 1, 1, 1, &o), FT_E_INVALID);
    bad = (ft_dpo_cfg){17, 0.1, 0};
    assert_int_equal(ft_dpo_pair_loss(&bad, 1, 1, 1, 1, 1, 1, &o), FT_E_INVALID);
    assert_int_equal(ft_dpo_pair_loss(&c, 1, 0, 1, 1, 1, 1, &o), FT_E_INVALID);
    /* names */
    for (int t = 0; t < 6; t++) assert_int_equal(ft_dpo_loss_parse(ft_dpo_loss_name(t)), t);
    assert_int_equal(ft_dpo_loss_parse("kto"), -1);
}

/* ---- preference micro-batches ----------------------------------------------------------- */

/* A micro-batch of n_pairs pairs: pair k is a prompt of P_k tokens then a chosen completion of
 * c_k tokens, and the same prompt then a rejected completion of r_k tokens (targets on the
 * completions: labels[t] = ids[t] there, so targets[t] = ids[t+1] for t from P_k - 1). Pair
 * indices are first_pair + k. */
static void make_pair_batch(ft_batch *b, int n_pairs, int64_t first_pair, uint64_t seed, int64_t V)
{
    ft_rng g;
    ft_rng_seed(&g, seed);
    int64_t lens[16][3], T = 0;
    assert_true(n_pairs <= 16);
    for (int k = 0; k < n_pairs; k++) {
        lens[k][0] = 3 + (int64_t)(ft_rng_next(&g) % 5);
        lens[k][1] = 2 + (int64_t)(ft_rng_next(&g) % 6);
        lens[k][2] = 2 + (int64_t)(ft_rng_next(&g) % 6);
        T += 2 * lens[k][0] + lens[k][1] + lens[k][2];
    }
    memset(b, 0, sizeof *b);
    b->rows = 1;
    b->seq_len = T;
    b->T = T;
    b->ids = malloc(T * 4);
    b->targets = malloc(T * 4);
    b->pos = malloc(T * 4);
    b->seq_start = malloc(T * 4);
    b->n_pairs = n_pairs;
    b->pairs = malloc((size_t)n_pairs * FT_PAIR_FIELDS * sizeof *b->pairs);
    int64_t t = 0;
    int32_t prompt[16];
    for (int k = 0; k < n_pairs; k++) {
        int64_t P = lens[k][0];
        for (int64_t i = 0; i < P; i++) prompt[i] = (int32_t)(ft_rng_next(&g) % (uint64_t)V);
        int64_t *pr = b->pairs + k * FT_PAIR_FIELDS;
        pr[FT_PAIR_INDEX] = first_pair + k;
        for (int side = 0; side < 2; side++) {
            int64_t n = P + lens[k][1 + side], s0 = t;
            pr[side ? FT_PAIR_REJECTED_START : FT_PAIR_CHOSEN_START] = s0;
            pr[side ? FT_PAIR_REJECTED_LEN : FT_PAIR_CHOSEN_LEN] = n;
            for (int64_t i = 0; i < n; i++)
                b->ids[s0 + i] = i < P ? prompt[i] : (int32_t)(ft_rng_next(&g) % (uint64_t)V);
            for (int64_t i = 0; i < n; i++, t++) {
                b->pos[t] = (int32_t)i;
                b->seq_start[t] = (int32_t)s0;
                b->targets[t] = i + 1 < n && i + 1 >= P ? b->ids[t + 1] : -100;
                b->n_targets += b->targets[t] >= 0;
            }
        }
    }
}

static void free_pair_batch(ft_batch *b)
{
    free(b->ids), free(b->targets), free(b->pos), free(b->seq_start), free(b->pairs);
}

/* The token batch of sequence s of b alone. */
static void one_sequence(const ft_batch *b, int s, ft_batch *o)
{
    const int64_t *pr = b->pairs + (s / 2) * FT_PAIR_FIELDS;
    int64_t t0 = pr[s % 2 ? FT_PAIR_REJECTED_START : FT_PAIR_CHOSEN_START];
    int64_t n = pr[s % 2 ? FT_PAIR_REJECTED_LEN : FT_PAIR_CHOSEN_LEN];
    memset(o, 0, sizeof *o);
    o->rows = 1;
    o->seq_len = o->T = n;
    o->ids = malloc(n * 4), o->targets = malloc(n * 4), o->pos = malloc(n * 4), o->seq_start = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) {
        o->ids[i] = b->ids[t0 + i];
        o->targets[i] = b->targets[t0 + i];
        o->pos[i] = (int32_t)i;
        o->seq_start[i] = 0;
        o->n_targets += o->targets[i] >= 0;
    }
}

/* ---- the executor ------------------------------------------------------------------------ */

static void test_eval_seq(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.0f);
    ft_batch b;
    make_pair_batch(&b, 3, 0, 5, m->cfg.vocab_size);
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, b.T, 1, b.T), 0);
    double nll[6], sum = 0, whole;
    int64_t nt[6], cnt = 0, wn;
    assert_int_equal(ft_exec_eval_seq(&e, &b, nll, nt), 0);
    assert_int_equal(ft_exec_eval(&e, &b, &whole, &wn), 0);
    for (int s = 0; s < 6; s++) {
        ft_batch o;
        one_sequence(&b, s, &o);
        double alone;
        int64_t an;
        assert_int_equal(ft_exec_eval(&e, &o, &alone, &an), 0);
        print_message("sequence %d: nll %.9g over %lld targets; alone %.9g\n", s, nll[s],
                      (long long)nt[s], alone);
        assert_int_equal(nt[s], an);
        assert_true(fabs(nll[s] - alone) <= 1e-5 * fabs(alone));
        sum += nll[s];
        cnt += nt[s];
        stream_free_batches(&o, 1);
    }
    assert_int_equal(cnt, wn);
    assert_int_equal(cnt, b.n_targets);
    assert_true(fabs(sum - whole) <= 1e-6 * fabs(whole));
    /* a micro-batch without pairs is refused */
    ft_batch np = b;
    np.n_pairs = 0;
    assert_int_equal(ft_exec_eval_seq(&e, &np, nll, nt), FT_E_INVALID);
    ft_exec_free(&e);
    free_pair_batch(&b);
    tiny_close(m, be, &lora);
}

/* The token loss as a sequence objective: scale = 1 / n_targets of the step. */
typedef struct tok_obj { int64_t n_targets; double sum; } tok_obj;

static int tok_grad(void *user, int64_t mb, const ft_batch *b, const double *nll,
                    const int64_t *n_tok, double *scale)
{
    tok_obj *o = user;
    for (int64_t s = 0; s < 2 * b->n_pairs; s++) {
        scale[s] = 1.0 / (double)o->n_targets;
        o->sum += nll[s];
    }
    return 0;
}

static void test_token_objective_same_grads(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.1f);
    ft_batch b[2];
    make_pair_batch(&b[0], 3, 0, 7, m->cfg.vocab_size);
    make_pair_batch(&b[1], 2, 3, 8, m->cfg.vocab_size);
    int64_t T = b[0].T > b[1].T ? b[0].T : b[1].T, n = lora.n_params;
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, T, 2, T), 0);
    int64_t nt = b[0].n_targets + b[1].n_targets, got;
    float *g0 = malloc(n * 4), *g1 = malloc(n * 4);
    double ls;
    assert_int_equal(be->ops->zero(be, lora.grads, n * 4), 0);
    assert_int_equal(ft_exec_train_step(&e, b, 2, nt, 0x77, &ls, &got), 0);
    memcpy(g0, lora.grads, n * 4);
    tok_obj o = {nt, 0};
    assert_int_equal(be->ops->zero(be, lora.grads, n * 4), 0);
    assert_int_equal(ft_exec_train_step_seq(&e, b, 2, tok_grad, &o, 0x77), 0);
    memcpy(g1, lora.grads, n * 4);
    assert_true(fabs(o.sum - ls) <= 1e-6 * fabs(ls));
    double num = 0, den = 0, gmax = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)g1[i] - g0[i]) * ((double)g1[i] - g0[i]);
        den += (double)g0[i] * g0[i];
        gmax = fmax(gmax, fabs(g0[i]));
    }
    print_message("token objective through the sequence head: gradient rel. diff %.3g (|g|max %.3g)\n",
                  sqrt(num / den), gmax);
    assert_true(gmax > 0);
    assert_true(sqrt(num / den) < 1e-5);
    ft_exec_free(&e);
    free(g0), free(g1);
    free_pair_batch(&b[0]), free_pair_batch(&b[1]);
    tiny_close(m, be, &lora);
}

/* The mean DPO loss of the micro-batches b[0..n_b) (through ft_exec_eval_seq). */
static double dpo_objective(ft_exec *e, const ft_batch *b, int n_b, const double *ref,
                            const ft_dpo_cfg *c)
{
    ft_dpo_stats st;
    assert_int_equal(ft_dpo_evaluate(e, b, n_b, 0, ref, c, &st), 0);
    return st.loss / (double)st.pairs;
}

static void dpo_grad_fd(int loss_type)
{
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.0f);
    /* B != 0 so that the policy differs from any reference and both A and B get gradients */
    ft_rng g;
    ft_rng_seed(&g, 99);
    for (int64_t i = 0; i < lora.n_params; i++) lora.params[i] += 0.05f * (float)(ft_rng_uniform(&g) - 0.5);
    ft_batch b[2];
    make_pair_batch(&b[0], 2, 0, 21, m->cfg.vocab_size);
    make_pair_batch(&b[1], 2, 2, 22, m->cfg.vocab_size);
    int64_t T = b[0].T > b[1].T ? b[0].T : b[1].T, n = lora.n_params;
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, T, 2, T), 0);
    /* a reference: the policy's own nlls, shifted so that the pairs sit at different points
     * of the loss (sigmoid: margins of several beta units, both signs) */
    double ref[8];
    assert_int_equal(ft_dpo_reference(&e, b, 2, 0, ref, 4), 0);
    for (int i = 0; i < 8; i++) ref[i] += (i % 3 - 1) * 4.0 + 0.5 * i;
    ft_dpo_cfg c = {loss_type, 0.5, 0, 0.5};
    ft_dpo_step st = {.cfg = &c, .ref = ref, .step_pairs = 4};
    assert_int_equal(be->ops->zero(be, lora.grads, n * 4), 0);
    assert_int_equal(ft_exec_train_step_seq(&e, b, 2, ft_dpo_step_grad, &st, 0), 0);
    assert_int_equal(st.st.pairs, 4);
    double J = dpo_objective(&e, b, 2, ref, &c);
    assert_true(fabs(st.st.loss / 4 - J) <= 1e-6 * fabs(J));
    float *grad = malloc(n * 4);
    memcpy(grad, lora.grads, n * 4);
    const float h = 1e-2f;
    int checked = 0;
    double max_rel = 0;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            const ft_lora_linear *ll = &lora.lin[l][p];
            if (!ll->A) continue;
            for (int k = 0; k < 2; k++) {
                float *base = k ? ll->B : ll->A;
                int64_t cnt = k ? ll->out_n * lora.cfg.r : lora.cfg.r * ll->in_n;
                int64_t i = (base - lora.params) + (int64_t)(ft_rng_next(&g) % (uint64_t)cnt);
                float keep = lora.params[i];
                lora.params[i] = keep + h;
                double jp = dpo_objective(&e, b, 2, ref, &c);
                lora.params[i] = keep - h;
                double jm = dpo_objective(&e, b, 2, ref, &c);
                lora.params[i] = keep;
                double num = (jp - jm) / (2.0 * h), err = fabs(num - grad[i]);
                if (err > TOL_FD_ABS + TOL_FD_REL * fabs(num))
                    print_message("  layer %lld %s %s[%lld]: analytic %.6g numeric %.6g\n", (long long)l,
                                  ft_proj_name[p], k ? "B" : "A", (long long)i, (double)grad[i], num);
                assert_true(err <= TOL_FD_ABS + TOL_FD_REL * fabs(num));
                if (fabs(num) > 1e-3) max_rel = fmax(max_rel, err / fabs(num));
                checked++;
            }
        }
    print_message("DPO %s: loss %.6g, LoRA grads vs central differences: max rel err %.3g over %d params\n",
                  ft_dpo_loss_name(loss_type), J, max_rel, checked);
    assert_true(checked >= 8);
    ft_exec_free(&e);
    free(grad);
    free_pair_batch(&b[0]), free_pair_batch(&b[1]);
    tiny_close(m, be, &lora);
}

static void test_dpo_grad_fd_sigmoid(void **state) { (void)state; dpo_grad_fd(FT_DPO_SIGMOID); }
static void test_dpo_grad_fd_ipo(void **state) { (void)state; dpo_grad_fd(FT_DPO_IPO); }
static void test_dpo_grad_fd_orpo(void **state) { (void)state; dpo_grad_fd(FT_DPO_ORPO); }
static void test_dpo_grad_fd_simpo(void **state) { (void)state; dpo_grad_fd(FT_DPO_SIMPO); }

/* The reference is looked up by pair index, not by place: computed over one packing of the
 * preference set and read back over another (another seed, as a later epoch packs), the
 * unchanged policy gives every pair log-ratio 0, i.e. ln 2 (to the rounding of a sequence
 * computed beside other sequences). A lookup by position would pair the nlls of other
 * sequences: tens of nats apart. */
static void test_reference_by_pair_index(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    ft_lora lora;
    tiny_stream_open(&m, &be, &lora, THREADS, 0.0f);
    ft_tokenizer *tok;
    assert_int_equal(ft_model_tokenizer(m, &tok), 0);
    ft_data_cfg dc = {0};
    dc.preference = 1;
    dc.seq_len = 128;
    dc.seed = 3;
    ft_dataset ds;
    int rc = ft_dataset_load(&ds, "examples/data/alpaca-seed-tasks/alpaca_seed_pref.jsonl", &dc, tok);
    if (rc) print_message("load: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    int64_t np = ds.n_train / 2;
    if (np > 24) np = 24; /* the first 24 pairs keep the test short */
    ft_batch *a, *b;
    int64_t na, nb;
    assert_int_equal(ft_batch_pack_pairs(&a, &na, ds.train, np, 128, 2, 1), 0);
    assert_int_equal(ft_batch_pack_pairs(&b, &nb, ds.train, np, 128, 2, 2), 0);
    ft_rng g;
    ft_rng_seed(&g, 5);
    for (int64_t i = 0; i < lora.n_params; i++) lora.params[i] += 0.05f * (float)(ft_rng_uniform(&g) - 0.5);
    ft_exec e;
    assert_int_equal(ft_exec_init(&e, be, m, &lora, 2 * 2 * 128, 1, 128), 0);
    double *ref = calloc((size_t)(2 * np), sizeof *ref);
    assert_int_equal(ft_dpo_reference(&e, a, na, 0, ref, np), 0);
    ft_dpo_cfg c = {FT_DPO_SIGMOID, 0.1, 0};
    ft_dpo_stats st;
    assert_int_equal(ft_dpo_evaluate(&e, b, nb, 0, ref, &c, &st), 0);
    double mean = st.loss / (double)st.pairs;
    print_message("%lld pairs in %lld / %lld micro-batches: mean loss %.12g (ln 2 %.12g), mean |margin| <= %.3g\n",
                  (long long)st.pairs, (long long)na, (long long)nb, mean, log(2.0), fabs(st.margin) / st.pairs);
    assert_int_equal(st.pairs, np);
    assert_true(fabs(mean - log(2.0)) < 1e-6);
    /* and a lookup by position would fail: the ref of the first pair of b's first batch read
     * at another pair's index differs by nats */
    int64_t p0 = b[0].pairs[FT_PAIR_INDEX], p1 = (p0 + 1) % np;
    assert_true(fabs(ref[2 * p0] - ref[2 * p1]) > 0.5);
    free(ref);
    ft_exec_free(&e);
    ft_batches_free(a, na);
    ft_batches_free(b, nb);
    ft_dataset_free(&ds);
    ft_tok_free(tok);
    tiny_close(m, be, &lora);
}

/* ---- the device executor: streamed == resident --------------------------------------------- */

typedef struct exrun { double loss[2]; float *g; } exrun;

static void exec_run(ft_backend *be, const ft_model *m, ft_pack_file *pack, const uint8_t *tier,
                     int host_ck, int keep, const ft_batch *b, exrun *r)
{
    ft_lora lora;
    stream_lora_init(&lora, be, m, 0.1f);
    int64_t T = b[0].T > b[1].T ? b[0].T : b[1].T;
    ft_exec e;
    int rc = host_ck ? ft_exec_init_ckpt_host(&e, be, m, &lora, T, 2, T, 0, 0, 2)
                     : ft_exec_init_ex(&e, be, m, &lora, T, 2, T, 0);
    if (rc) print_message("init: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    rc = ft_exec_use_pack_tiers(&e, pack, tier, 2, 2);
    if (rc) print_message("use pack: %s\n", ft_errmsg());
    assert_int_equal(rc, 0);
    if (keep) assert_int_equal(ft_exec_keep_activations(&e, (size_t)-1), 1);
    double ref[8];
    assert_int_equal(ft_dpo_reference(&e, b, 2, 0, ref, 4), 0);
    ft_dpo_cfg c = {FT_DPO_SIGMOID, 0.1, 0};
    r->g = malloc((size_t)lora.n_params * 4);
    for (int s = 0; s < 2; s++) {
        ft_dpo_step st = {.cfg = &c, .ref = ref, .step_pairs = 4};
        assert_int_equal(be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4), 0);
        rc = ft_exec_train_step_seq(&e, b, 2, ft_dpo_step_grad, &st, 0x5eed + (uint64_t)s);
        if (rc) print_message("step: %s\n", ft_errmsg());
        assert_int_equal(rc, 0);
        r->loss[s] = st.st.loss;
        assert_int_equal(be->ops->copy(be, r->g, lora.grads, (size_t)lora.n_params * 4), 0);
        /* a plain SGD move so that step 2 sees another adapter */
        assert_int_equal(be->ops->axpy(be, -0.5f, lora.grads, lora.params, lora.n_params), 0);
    }
    ft_exec_free(&e);
    ft_lora_free(&lora);
}

static void test_streamed_same_as_resident(void **state)
{
    (void)state;
    ft_backend *be;
    ft_model *m;
    stream_pack sp;
    tiny_device_open(&m, &be, &sp, THREADS);
    ft_batch b[2];
    make_pair_batch(&b[0], 3, 0, 31, m->cfg.vocab_size);
    make_pair_batch(&b[1], 1, 3, 32, m->cfg.vocab_size);
    const int64_t L = m->cfg.num_hidden_layers;
    assert_true(L >= 2 && L <= 64);
    uint8_t disk[64], mix[64];
    for (int64_t l = 0; l < L; l++) {
        disk[l] = FT_TIER_DISK;
        mix[l] = (uint8_t)(l % 3);
    }
    exrun ref, r;
    exec_run(be, m, sp.pack, NULL, 0, 0, b, &ref);
    print_message("device mode, resident: DPO loss sums %.9g %.9g\n", ref.loss[0], ref.loss[1]);
    assert_true(ref.loss[0] != ref.loss[1]); /* the adapter moved */
    static const struct { const char *what; int mix, host_ck, keep; } cases[] = {
        {"disk tier", 0, 0, 0},
        {"mixed tiers + host checkpoints", 1, 1, 0},
        {"disk tier + host checkpoints + kept acts", 0, 1, 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        exec_run(be, m, sp.pack, cases[k].mix ? mix : disk, cases[k].host_ck, cases[k].keep, b, &r);
        print_message("%-44s %.9g %.9g\n", cases[k].what, r.loss[0], r.loss[1]);
        assert_memory_equal(r.loss, ref.loss, sizeof r.loss);
        ft_lora probe;
        stream_lora_init(&probe, be, m, 0.1f);
        assert_memory_equal(r.g, ref.g, (size_t)probe.n_params * 4);
        ft_lora_free(&probe);
        free(r.g);
    }
    free(ref.g);
    free_pair_batch(&b[0]), free_pair_batch(&b[1]);
    tiny_device_close(m, be, &sp);
}

/* ---- whole runs ----------------------------------------------------------------------------- */

#define PREF "examples/data/alpaca-seed-tasks/alpaca_seed_pref.jsonl"
#define RUN_STEPS 4

#define MAX_TRACE 16

typedef struct trace {
    double loss[MAX_TRACE], gnorm[MAX_TRACE], eval[8];
    int64_t n, n_eval;
    int pref_seen;                  /* events carried the reward metrics */
    int ref_read_back, ref_computed; /* info lines: the DPO reference read from OUT, computed */
    int64_t stop_at;
    volatile sig_atomic_t *stop;
} trace;

static void on_event(const ft_train_event *ev, void *user)
{
    trace *t = user;
    if (ev->kind == FT_EV_STEP && t->n < MAX_TRACE) {
        t->loss[t->n] = ev->loss;
        t->gnorm[t->n] = ev->grad_norm;
        t->n++;
        t->pref_seen += ev->pref;
        if (t->stop_at > 0 && ev->step == t->stop_at) *t->stop = 1;
    }
    if (ev->kind == FT_EV_EVAL && t->n_eval < 8) t->eval[t->n_eval++] = ev->eval_loss;
    if (ev->kind == FT_EV_INFO && ev->text && strstr(ev->text, "reference log-probabilities of")) {
        t->ref_read_back += strstr(ev->text, "read back from") != NULL;
        t->ref_computed += strstr(ev->text, " in ") != NULL && !strstr(ev->text, "read back");
    }
}

/* tiny_train_cfg, as DPO: 128-token sequences, 2 x 2 pairs a step, seed 9, lr 2e-3, no dropout,
 * an eval every 2 steps. */
static void run_cfg(ft_train_cfg *c, const char *out, double beta, int loss_type)
{
    static const char *const data[1] = {PREF};
    tiny_train_cfg(c, out, data, RUN_STEPS, THREADS);
    c->method = FT_TRAIN_METHOD_DPO;
    c->dpo.beta = beta;
    c->dpo.loss_type = loss_type;
    c->seq_len = 128;
    c->batch_size = 2;
    c->grad_accum = 2;
    c->seed = 9;
    c->lr = 2e-3;
    c->lora.dropout = 0;            /* as the CLI's DPO default */
    c->data_cfg.eval_fraction = 0.1;
    c->data_cfg.eval_max = 6;
    c->eval_every = 2;
}

static void test_run(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    char out[600];
    snprintf(out, sizeof out, "%s/run", dir);
    ft_train_cfg c;
    run_cfg(&c, out, 0.1, FT_DPO_SIGMOID);
    trace t = {0};
    ft_train_result res;
    train_run_ok(&c, on_event, &t, &res);
    assert_int_equal(t.n, RUN_STEPS);
    assert_int_equal(t.pref_seen, RUN_STEPS);
    print_message("DPO run: step-0 eval %.17g, step losses %.9g %.9g %.9g %.9g, eval %.9g -> %.9g\n",
                  t.eval[0], t.loss[0], t.loss[1], t.loss[2], t.loss[3], res.initial_eval_loss,
                  res.final_eval_loss);
    /* policy == reference before the first update: exactly ln 2 per pair */
    assert_true(fabs(t.eval[0] - log(2.0)) < 1e-12); /* the same forward as the reference */
    /* the training forward: the same ops as eval on the CPU backends (bit-identical); a GPU
     * may order its reductions otherwise between the two paths */
    const char *dev = getenv("FTUNE_DEVICE");
    double tol = dev && *dev && strcmp(dev, "cpu") ? 1e-3 : 1e-12;
    assert_true(fabs(t.loss[0] - log(2.0)) < tol);
    assert_true(t.loss[1] != t.loss[0]); /* the adapter moved */
    assert_true(isfinite(res.final_eval_loss) && isfinite(res.final_eval_reward_accuracy));
    assert_int_equal(res.n_train % 2, 0);
    char *m = read_out(out, "metrics.jsonl", NULL), *sj = read_out(out, "summary.json", NULL);
    assert_non_null(strstr(m, "\"rewards/accuracies\""));
    assert_non_null(strstr(m, "\"eval_rewards/margins\""));
    assert_non_null(strstr(m, "\"logps/rejected\""));
    assert_non_null(strstr(sj, "\"method\":\t\"dpo\""));
    assert_non_null(strstr(sj, "\"final_eval_reward_accuracy\""));
    free(m), free(sj);
    assert_int_equal(t_rmtree(dir), 0);
}

/* OUT/dpo_reference.bin: read back only for the same run, backend and base; the eval part only
 * for the same held-out set; a missing, truncated or corrupted file gives nothing (with the
 * reason), never stale numbers. */
static void test_reference_file(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    ft_dpo_ref_key k;
    memset(&k, 0, sizeof k);
    snprintf(k.run_id, sizeof k.run_id, "0123456789abcdef");
    snprintf(k.eval_set, sizeof k.eval_set, "fedcba9876543210");
    snprintf(k.backend, sizeof k.backend, "cpu");
    k.quant = 0;
    k.model_id = 0x1234abcdull;
    double tr[6] = {1.5, 2.25, -0.0, 1e300, 3.0, 4.0}, ev[4] = {7.0, 8.5, 9.0, 10.0};
    double gt[6], ge[4];
    int a, b;
    char why[600];
    /* no file: nothing, no reason */
    assert_int_equal(ft_dpo_ref_load(dir, &k, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
    assert_true(!a && !b && !why[0]);
    assert_int_equal(ft_dpo_ref_save(dir, &k, tr, 3, ev, 2), 0);
    memset(gt, 0, sizeof gt), memset(ge, 0, sizeof ge);
    assert_int_equal(ft_dpo_ref_load(dir, &k, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
    assert_true(a && b);
    assert_memory_equal(gt, tr, sizeof tr);
    assert_memory_equal(ge, ev, sizeof ev);
    /* another held-out set: the train part only */
    ft_dpo_ref_key k2 = k;
    k2.eval_set[0] = '9';
    memset(ge, 0, sizeof ge);
    assert_int_equal(ft_dpo_ref_load(dir, &k2, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
    assert_true(a && !b && ge[0] == 0.0);
    print_message("other eval set: %s\n", why);
    assert_non_null(strstr(why, "held-out set"));
    /* another run, backend, base, model or pair count: nothing */
    const char *what[5] = {"run", "backend", "quant", "pairs", "model"};
    for (int w = 0; w < 5; w++) {
        k2 = k;
        int64_t np = 3;
        if (w == 0) k2.run_id[3] = 'x';
        if (w == 1) snprintf(k2.backend, sizeof k2.backend, "cuda");
        if (w == 2) k2.quant = 1;
        if (w == 3) np = 2;
        if (w == 4) k2.model_id ^= 1;
        assert_int_equal(ft_dpo_ref_load(dir, &k2, gt, np, ge, 2, &a, &b, why, sizeof why), 0);
        print_message("other %s: %s\n", what[w], why);
        assert_true(!a && !b && strstr(why, "another run"));
    }
    /* a flipped bit anywhere, or a truncation: nothing, with the reason */
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, FT_DPO_REF_FILE);
    char *raw = NULL;
    size_t len = 0;
    assert_int_equal(ft_read_file(path, &raw, &len), 0);
    assert_int_equal(len, 104 + 10 * sizeof(double) + 8);
    size_t at[4] = {20, 110, len - 3, 82};
    for (int i = 0; i < 4; i++) {
        raw[at[i]] ^= 0x10;
        assert_int_equal(ft_write_file_atomic(path, raw, len), 0);
        raw[at[i]] ^= 0x10;
        assert_int_equal(ft_dpo_ref_load(dir, &k, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
        print_message("bit flipped at %zu: %s\n", at[i], why);
        assert_true(!a && !b && strstr(why, "checksum"));
    }
    assert_int_equal(ft_write_file_atomic(path, raw, len - 8), 0);
    assert_int_equal(ft_dpo_ref_load(dir, &k, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
    print_message("truncated: %s\n", why);
    assert_true(!a && !b && strstr(why, "size"));
    assert_int_equal(ft_write_file_atomic(path, raw, 50), 0);
    assert_int_equal(ft_dpo_ref_load(dir, &k, gt, 3, ge, 2, &a, &b, why, sizeof why), 0);
    assert_true(!a && !b && strstr(why, "truncated"));
    free(raw);
    assert_int_equal(t_rmtree(dir), 0);
}

static void test_resume_bit_identical(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    char full[600], part[600];
    snprintf(full, sizeof full, "%s/full", dir);
    snprintf(part, sizeof part, "%s/part", dir);
    ft_train_cfg c;
    ft_train_result res;
    trace tf = {0}, tp = {0};
    run_cfg(&c, full, 0.1, FT_DPO_SIGMOID);
    train_run_ok(&c, on_event, &tf, &res);
    volatile sig_atomic_t stop = 0;
    tp.stop = &stop;
    tp.stop_at = 2;
    run_cfg(&c, part, 0.1, FT_DPO_SIGMOID);
    c.stop = &stop;
    train_run_ok(&c, on_event, &tp, &res);
    assert_int_equal(res.stopped, 1);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s", res.checkpoint);
    assert_non_null(strstr(ckpt, "checkpoint-2"));
    /* another beta or loss type is refused naming it */
    run_cfg(&c, part, 0.2, FT_DPO_SIGMOID);
    c.resume = ckpt;
    assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
    print_message("resume with beta 0.2: %s\n", ft_errmsg());
    assert_non_null(strstr(ft_errmsg(), "dpo_beta"));
    run_cfg(&c, part, 0.1, FT_DPO_IPO);
    c.resume = ckpt;
    assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "dpo_loss"));
    run_cfg(&c, part, 0.1, FT_DPO_SIGMOID);
    c.resume = ckpt;
    tp.stop_at = 0;
    tp.n_eval = 0;
    assert_int_equal(tp.ref_computed, 1);
    tp.ref_computed = 0;
    train_run_ok(&c, on_event, &tp, &res);
    assert_int_equal(res.resumed_from, 2);
    /* the resume read the reference back from OUT/dpo_reference.bin (no second pass) */
    assert_int_equal(tp.ref_read_back, 1);
    assert_int_equal(tp.ref_computed, 0);
    assert_int_equal(tp.n, RUN_STEPS);
    for (int s = 0; s < RUN_STEPS; s++)
        print_message("step %d: loss %.17g (uninterrupted) %.17g (resumed)\n", s + 1, tf.loss[s], tp.loss[s]);
    assert_memory_equal(tp.loss, tf.loss, RUN_STEPS * sizeof(double));
    assert_memory_equal(tp.gnorm, tf.gnorm, RUN_STEPS * sizeof(double));
    /* the final eval of the resumed run is the uninterrupted run's last */
    assert_true(tp.eval[tp.n_eval - 1] == tf.eval[tf.n_eval - 1]);
    assert_true(same_adapter(full, part));
    assert_int_equal(t_rmtree(dir), 0);
}

/* Writes the first n records of PREF to dir/name; returns the path (static buffer per slot). */
static const char *pref_subset(const char *dir, const char *name, int n, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    char *all = NULL;
    size_t len = 0;
    assert_int_equal(ft_read_file(PREF, &all, &len), 0);
    size_t end = 0;
    for (int k = 0; k < n && end < len; k++) {
        const char *nl = memchr(all + end, '\n', len - end);
        end = nl ? (size_t)(nl - all) + 1 : len;
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(all, 1, end, f), end);
    fclose(f);
    free(all);
    return path;
}

/* Stopped at stop_at of `steps` and resumed from that checkpoint: the uninterrupted run's
 * losses, gradient norms and adapter. init_adapter (or NULL) is the reference of both. */
static void stop_and_resume(const char *dir, const char *data, int64_t steps, int64_t stop_at,
                            const char *init_adapter, int64_t *epoch_at_stop)
{
    char full[600], part[600];
    snprintf(full, sizeof full, "%s/full-%lld", dir, (long long)stop_at);
    snprintf(part, sizeof part, "%s/part-%lld", dir, (long long)stop_at);
    const char *const files[1] = {data};
    ft_train_cfg c;
    ft_train_result res;
    trace tf = {0}, tp = {0};
    run_cfg(&c, full, 0.1, FT_DPO_SIGMOID);
    c.data = files;
    c.max_steps = steps;
    c.batch_size = 1;
    c.grad_accum = 1;
    c.init_adapter = init_adapter;
    train_run_ok(&c, on_event, &tf, &res);
    volatile sig_atomic_t stop = 0;
    tp.stop = &stop;
    tp.stop_at = stop_at;
    run_cfg(&c, part, 0.1, FT_DPO_SIGMOID);
    c.data = files;
    c.max_steps = steps;
    c.batch_size = 1;
    c.grad_accum = 1;
    c.init_adapter = init_adapter;
    c.stop = &stop;
    train_run_ok(&c, on_event, &tp, &res);
    assert_int_equal(res.stopped, 1);
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s", res.checkpoint);
    char sp[4300], *state = NULL;
    size_t slen = 0;
    snprintf(sp, sizeof sp, "%s/trainer_state.json", ckpt);
    assert_int_equal(ft_read_file(sp, &state, &slen), 0);
    const char *ep = strstr(state, "\"epoch\":");
    assert_non_null(ep);
    *epoch_at_stop = strtoll(ep + 8, NULL, 10);
    free(state);
    if (init_adapter) { /* the reference must be the same: without it, refused */
        c.init_adapter = NULL;
        c.resume = ckpt;
        assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
        print_message("resume without --init-adapter: %s\n", ft_errmsg());
        assert_non_null(strstr(ft_errmsg(), "dpo_reference"));
        c.init_adapter = init_adapter;
    }
    c.resume = ckpt;
    c.stop = NULL;
    tp.stop_at = 0;
    train_run_ok(&c, on_event, &tp, &res);
    assert_int_equal(tp.n, steps);
    assert_int_equal(tf.n, steps);
    for (int64_t k = 0; k < steps; k++)
        print_message("step %lld: loss %.17g (uninterrupted) %.17g (resumed)\n", (long long)k + 1,
                      tf.loss[k], tp.loss[k]);
    assert_memory_equal(tp.loss, tf.loss, (size_t)steps * sizeof(double));
    assert_memory_equal(tp.gnorm, tf.gnorm, (size_t)steps * sizeof(double));
    assert_true(same_adapter(full, part));
}

static void test_resume_epochs_and_init_adapter(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    assert_non_null(dir);
    char data[700];
    pref_subset(dir, "pairs8.jsonl", 8, data, sizeof data);
    /* 8 pairs, 2 held out: 6 train pairs, at most 6 micro-batches (steps) an epoch, so step 8
     * is in the second epoch or later */
    int64_t epoch = -1;
    stop_and_resume(dir, data, 12, 8, NULL, &epoch);
    print_message("stopped at step 8 in epoch %lld\n", (long long)epoch);
    assert_true(epoch >= 1);
    /* the reference from --init-adapter (the adapter that run ended with) */
    char init[700];
    snprintf(init, sizeof init, "%s/full-8", dir);
    stop_and_resume(dir, data, 4, 2, init, &epoch);
    assert_int_equal(t_rmtree(dir), 0);
}

static void test_bad_settings_refused(void **state)
{
    (void)state;
    ft_train_cfg c;
    ft_train_result res;
    struct { double beta, ls; int type, top; const char *flag; } bad[] = {
        {0, 0, FT_DPO_SIGMOID, 0, "--dpo-beta"},
        {NAN, 0, FT_DPO_SIGMOID, 0, "--dpo-beta"},
        {0.1, 0.1, FT_DPO_SIGMOID, 0, "--dpo-label-smoothing"},
        {0.1, 0.5, FT_DPO_ROBUST, 0, "--dpo-label-smoothing"},
        {0.1, 0, FT_DPO_SIGMOID, 1, "--train-on-prompt"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        run_cfg(&c, "/nonexistent/ftune-dpo", bad[k].beta, bad[k].type);
        c.dpo.label_smoothing = bad[k].ls;
        c.data_cfg.train_on_prompt = bad[k].top;
        assert_int_equal(ft_train_run(&c, NULL, NULL, &res), FT_E_INVALID);
        print_message("refused: %s\n", ft_errmsg());
        assert_non_null(strstr(ft_errmsg(), bad[k].flag));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_loss),
        cmocka_unit_test(test_eval_seq),
        cmocka_unit_test(test_token_objective_same_grads),
        cmocka_unit_test(test_dpo_grad_fd_sigmoid),
        cmocka_unit_test(test_dpo_grad_fd_ipo),
        cmocka_unit_test(test_dpo_grad_fd_orpo),
        cmocka_unit_test(test_dpo_grad_fd_simpo),
        cmocka_unit_test(test_streamed_same_as_resident),
        cmocka_unit_test(test_reference_by_pair_index),
        cmocka_unit_test(test_run),
        cmocka_unit_test(test_reference_file),
        cmocka_unit_test(test_resume_bit_identical),
        cmocka_unit_test(test_resume_epochs_and_init_adapter),
        cmocka_unit_test(test_bad_settings_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
