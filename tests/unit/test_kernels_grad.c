/* test_kernels_grad.c - every backward of the CPU ops against central finite differences,
 * entirely in fp64 (the fp64 instance of the same type-generic bodies the fp32 backend
 * uses, kernels/cpu/cpu_f64.h).
 *
 * For an op y = f(x) and a random upstream gradient g, L(x) = sum(g * y); the analytic
 * gradient from the op's backward is compared with (L(x + h e_i) - L(x - h e_i)) / 2h on
 * every entry (or an evenly spaced sample), |num - ana| <= FT_TOL_FD_ABS +
 * FT_TOL_FD_REL * |num| (harness.h). Each check prints
 * "<op> <input>: max rel err E over N entries" (rel err = |num - ana| / max(|num|, |ana|,
 * FD_REL_FLOOR)).
 *
 * One check is of a whole decoder block instead (test_block_qk_norm_bwd: a Qwen3 block, q/k
 * RMS-normalized per head before RoPE, ft_block_fwd / ft_block_bwd of src/model/llama.c):
 * the block runs through the fp32 op table, so that check uses fp32 differences with their
 * own step and tolerance (BLOCK_FD_*).
 */
#include "tests/unit/harness.h"

#include "kernels/cpu/cpu_f64.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/model/llama.h"
#include "tests/unit/kernels_fixture.h"

#define FD_H 1e-6           /* central-difference step: truncation ~h^2, rounding ~1e-16/h */
#define FD_REL_FLOOR 1e-3   /* denominator floor of the printed relative error; the
                               gradients here are O(0.01..10), so this only affects
                               entries that are exactly zero (masked, dropped) */
#define FD_MAX_ENTRIES 4096 /* inputs larger than this are sampled evenly */

/* ---- helpers ----------------------------------------------------------------------------- */

/* Deterministic uniform numbers in [lo, hi) (splitmix64). */
static uint64_t g_rng = 0x1234567u;
static double t_unif(double lo, double hi) { return t_unif_at(&g_rng, lo, hi); }

static double *t_rand(int64_t n, double lo, double hi)
{
    double *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++) a[i] = t_unif(lo, hi);
    return a;
}

static double t_dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* Compares ana[i] with the central difference of loss() in x[i]; x is restored. */
static void fd_check(const char *name, double *x, const double *ana, int64_t n, loss_fn loss,
                     void *ctx)
{
    int64_t stride = n > FD_MAX_ENTRIES ? (n + FD_MAX_ENTRIES - 1) / FD_MAX_ENTRIES : 1;
    double max_rel = 0;
    int64_t count = 0, bad = 0;
    for (int64_t i = 0; i < n; i += stride) {
        double xi = x[i];
        x[i] = xi + FD_H;
        double fp = loss(ctx);
        x[i] = xi - FD_H;
        double fm = loss(ctx);
        x[i] = xi;
        double num = (fp - fm) / (2 * FD_H);
        double rel = t_relerr(num, ana[i], FD_REL_FLOOR);
        if (rel > max_rel) max_rel = rel;
        if (!(fabs(num - ana[i]) <= FT_TOL_FD_ABS + FT_TOL_FD_REL * fabs(num))) {
            if (bad < 5)
                print_message("%s: entry %lld: numeric %.12g, analytic %.12g\n", name,
                              (long long)i, num, ana[i]);
            bad++;
        }
        count++;
    }
    print_message("%s: max rel err %.1e over %lld entries\n", name, max_rel, (long long)count);
    assert_int_equal(bad, 0);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */

typedef struct {
    int64_t T, C;
    double *x, *w, *g, *y, *rstd, eps;
} rms_ctx;

static double rms_loss(void *p)
{
    rms_ctx *c = p;
    assert_int_equal(ft_cpu_rmsnorm_fwd_f64(c->y, c->rstd, c->x, c->w, c->T, c->C, c->eps), 0);
    return t_dot(c->g, c->y, c->T * c->C);
}

static void test_rmsnorm_bwd(void **state)
{
    (void)state;
    rms_ctx c = {.T = 8, .C = 48, .eps = 1e-5};
    int64_t n = c.T * c.C;
    c.x = t_rand(n, -2, 2);
    c.w = t_rand(c.C, 0.5, 1.5);
    c.g = t_rand(n, -1, 1);
    c.y = t_rand(n, 0, 0);
    c.rstd = t_rand(c.T, 0, 0);
    double *base = t_rand(n, -1, 1), *dx = malloc(n * sizeof(double));
    memcpy(dx, base, n * sizeof(double));
    rms_loss(&c);
    /* rmsnorm_bwd accumulates: the gradient is what it added to the random base */
    assert_int_equal(ft_cpu_rmsnorm_bwd_f64(dx, c.g, c.x, c.w, c.rstd, c.T, c.C), 0);
    for (int64_t i = 0; i < n; i++) dx[i] -= base[i];
    fd_check("rmsnorm_bwd dx", c.x, dx, n, rms_loss, &c);
    free(c.x), free(c.w), free(c.g), free(c.y), free(c.rstd), free(base), free(dx);
}

/* ---- RoPE --------------------------------------------------------------------------------- */

typedef struct {
    int64_t T, H, D;
    double *x, *g, *tmp, *inv_freq;
    int32_t *pos;
} rope_ctx;

static double rope_loss(void *p)
{
    rope_ctx *c = p;
    int64_t n = c->T * c->H * c->D;
    memcpy(c->tmp, c->x, n * sizeof(double));
    assert_int_equal(ft_cpu_rope_fwd_f64(c->tmp, c->pos, c->inv_freq, c->T, c->H, c->D), 0);
    return t_dot(c->g, c->tmp, n);
}

static void test_rope_bwd(void **state)
{
    (void)state;
    rope_ctx c = {.T = 5, .H = 3, .D = 8};
    int64_t n = c.T * c.H * c.D;
    c.x = t_rand(n, -1, 1);
    c.g = t_rand(n, -1, 1);
    c.tmp = t_rand(n, 0, 0);
    c.inv_freq = t_rand(c.D / 2, 0, 0);
    for (int64_t i = 0; i < c.D / 2; i++) c.inv_freq[i] = pow(10000.0, -2.0 * i / c.D);
    int32_t pos[5] = {0, 1, 7, 300, 2047};
    c.pos = pos;
    double *dx = malloc(n * sizeof(double));
    memcpy(dx, c.g, n * sizeof(double));
    assert_int_equal(ft_cpu_rope_bwd_f64(dx, c.pos, c.inv_freq, c.T, c.H, c.D), 0);
    fd_check("rope_bwd dx", c.x, dx, n, rope_loss, &c);
    free(c.x), free(c.g), free(c.tmp), free(c.inv_freq), free(dx);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct {
    int64_t T, H, Hkv, D;
    double scale, *q, *k, *v, *g, *out, *lse;
    const int32_t *seq_start;
} attn_ctx;

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    assert_int_equal(ft_cpu_attention_fwd_f64(c->out, c->lse, c->q, c->k, c->v, c->seq_start,
                                              c->T, c->H, c->Hkv, c->D, c->scale),
                     0);
    return t_dot(c->g, c->out, c->T * c->H * c->D);
}

static void attn_grad_case(const char *tag, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                           const int64_t *lens, int n_seq)
{
    attn_ctx c = {.T = T, .H = H, .Hkv = Hkv, .D = D, .scale = 1.0 / sqrt((double)D)};
    int64_t nq = T * H * D, nk = T * Hkv * D;
    int32_t *ss = t_seq_start(lens, n_seq, T);
    c.seq_start = ss;
    c.q = t_rand(nq, -1.5, 1.5); /* scores of a few units: softmax far from uniform */
    c.k = t_rand(nk, -1.5, 1.5);
    c.v = t_rand(nk, -1, 1);
    c.g = t_rand(nq, -1, 1);
    c.out = t_rand(nq, 0, 0);
    c.lse = t_rand(T * H, 0, 0);
    double *dq = t_rand(nq, 9, 9), *dk = t_rand(nk, 9, 9), *dv = t_rand(nk, 9, 9);
    attn_loss(&c);
    assert_int_equal(ft_cpu_attention_bwd_f64(dq, dk, dv, c.g, c.q, c.k, c.v, c.out, c.lse, ss,
                                              T, H, Hkv, D, c.scale),
                     0);
    char name[96];
    snprintf(name, sizeof name, "attention_bwd dq (%s)", tag);
    fd_check(name, c.q, dq, nq, attn_loss, &c);
    snprintf(name, sizeof name, "attention_bwd dk (%s)", tag);
    fd_check(name, c.k, dk, nk, attn_loss, &c);
    snprintf(name, sizeof name, "attention_bwd dv (%s)", tag);
    fd_check(name, c.v, dv, nk, attn_loss, &c);
    free(ss), free(c.q), free(c.k), free(c.v), free(c.g), free(c.out), free(c.lse);
    free(dq), free(dk), free(dv);
}

static void test_attention_bwd(void **state)
{
    (void)state;
    /* GQA (2 query heads per kv head), three packed sequences */
    const int64_t lens1[] = {5, 2, 5};
    attn_grad_case("T=12 H=4 Hkv=2 D=8, seqs 5+2+5", 12, 4, 2, 8, lens1, 3);
    /* 3 query heads per kv head; a one-token sequence; sequences crossing the 32-key
     * blocks of the dk/dv pass */
    const int64_t lens2[] = {21, 1, 18};
    attn_grad_case("T=40 H=6 Hkv=2 D=8, seqs 21+1+18", 40, 6, 2, 8, lens2, 3);
    /* one sequence longer than the 64-key online-softmax block, MQA, odd D */
    const int64_t lens3[] = {70};
    attn_grad_case("T=70 H=2 Hkv=1 D=5, one seq", 70, 2, 1, 5, lens3, 1);
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    double *gate, *up, *g, *h;
} swiglu_ctx;

static double swiglu_loss(void *p)
{
    swiglu_ctx *c = p;
    assert_int_equal(ft_cpu_swiglu_fwd_f64(c->h, c->gate, c->up, c->n), 0);
    return t_dot(c->g, c->h, c->n);
}

static void test_swiglu_bwd(void **state)
{
    (void)state;
    swiglu_ctx c = {.n = 96};
    c.gate = t_rand(c.n, -6, 6);
    c.up = t_rand(c.n, -2, 2);
    c.g = t_rand(c.n, -1, 1);
    c.h = t_rand(c.n, 0, 0);
    double *dgate = t_rand(c.n, 0, 0), *dup = t_rand(c.n, 0, 0);
    assert_int_equal(ft_cpu_swiglu_bwd_f64(dgate, dup, c.g, c.gate, c.up, c.n), 0);
    fd_check("swiglu_bwd dgate", c.gate, dgate, c.n, swiglu_loss, &c);
    fd_check("swiglu_bwd dup", c.up, dup, c.n, swiglu_loss, &c);
    free(c.gate), free(c.up), free(c.g), free(c.h), free(dgate), free(dup);
}

/* ---- LM head + cross-entropy -------------------------------------------------------------- */

typedef struct {
    int64_t T, C, V, chunk;
    double *x, *W, *scratch, grad_scale;
    const int32_t *targets;
} ce_ctx;

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    double loss;
    int64_t nv;
    assert_int_equal(ft_cpu_lm_head_ce_f64(&loss, &nv, NULL, c->x, c->W, c->targets, c->T, c->C,
                                           c->V, c->grad_scale, c->scratch, c->chunk),
                     0);
    return c->grad_scale * loss;
}

static void test_lm_head_ce_dx(void **state)
{
    (void)state;
    /* ignored rows first, inside a chunk, and last; chunk (3) smaller than T (10) */
    const int32_t targets[10] = {-100, -100, 3, -100, 5, 16, 0, 7, 2, -100};
    ce_ctx c = {.T = 10, .C = 8, .V = 17, .chunk = 3, .grad_scale = 0.37, .targets = targets};
    c.x = t_rand(c.T * c.C, -1, 1);
    c.W = t_rand(c.V * c.C, -1, 1);
    c.scratch = t_rand(c.chunk * c.V, 0, 0);
    double *dx = t_rand(c.T * c.C, 5, 5), loss;
    int64_t nv;
    assert_int_equal(ft_cpu_lm_head_ce_f64(&loss, &nv, dx, c.x, c.W, targets, c.T, c.C, c.V,
                                           c.grad_scale, c.scratch, c.chunk),
                     0);
    assert_int_equal(nv, 6);
    for (int64_t t = 0; t < c.T; t++)
        if (targets[t] < 0)
            for (int64_t i = 0; i < c.C; i++) assert_true(dx[t * c.C + i] == 0.0);
    fd_check("lm_head_ce dx", c.x, dx, c.T * c.C, ce_loss, &c);
    free(c.x), free(c.W), free(c.scratch), free(dx);
}

/* ---- dropout ------------------------------------------------------------------------------ */

typedef struct {
    int64_t n;
    double *x, *g, *y, p;
    uint64_t seed;
} drop_ctx;

static double drop_loss(void *p)
{
    drop_ctx *c = p;
    assert_int_equal(ft_cpu_dropout_f64(c->y, c->x, c->n, c->p, c->seed), 0);
    return t_dot(c->g, c->y, c->n);
}

static void test_dropout_bwd(void **state)
{
    (void)state;
    drop_ctx c = {.n = 200, .p = 0.3, .seed = 42};
    c.x = t_rand(c.n, -1, 1);
    c.g = t_rand(c.n, -1, 1);
    c.y = t_rand(c.n, 0, 0);
    double *dx = t_rand(c.n, 0, 0);
    /* the backward is the same call on the gradient with the same seed */
    assert_int_equal(ft_cpu_dropout_f64(dx, c.g, c.n, c.p, c.seed), 0);
    fd_check("dropout dx", c.x, dx, c.n, drop_loss, &c);
    free(c.x), free(c.g), free(c.y), free(dx);
}

/* ---- a LoRA linear built from gemm calls, as the trainer runs it -------------------------- */
/* y = x W^T + s * (dropout(x) A^T) B^T;  x (T, I), W (O, I) frozen, A (r, I), B (O, r).
 * Backward with dy = g:  dB = s g^T u,  du = s g B,  dA = du^T xd,
 *                        dx = g W + dropout(du A)      (u = xd A^T, xd = dropout(x)) */

typedef struct {
    int64_t T, I, O, r;
    double s, p, *x, *W, *A, *B, *g, *xd, *u, *y;
    uint64_t seed;
} lora_ctx;

static void lora_fwd(lora_ctx *c)
{
    assert_int_equal(ft_cpu_dropout_f64(c->xd, c->x, c->T * c->I, c->p, c->seed), 0);
    assert_int_equal(ft_cpu_gemm_f64(0, 1, c->T, c->r, c->I, 1, c->xd, c->I, c->A, c->I, 0, c->u,
                                     c->r),
                     0);
    assert_int_equal(ft_cpu_gemm_f64(0, 1, c->T, c->O, c->I, 1, c->x, c->I, c->W, c->I, 0, c->y,
                                     c->O),
                     0);
    assert_int_equal(ft_cpu_gemm_f64(0, 1, c->T, c->O, c->r, c->s, c->u, c->r, c->B, c->r, 1,
                                     c->y, c->O),
                     0);
}

static double lora_loss(void *p)
{
    lora_ctx *c = p;
    lora_fwd(c);
    return t_dot(c->g, c->y, c->T * c->O);
}

static void test_lora_chain(void **state)
{
    (void)state;
    lora_ctx c = {.T = 6, .I = 10, .O = 7, .r = 3, .s = 16.0 / 3, .p = 0.25, .seed = 7};
    c.x = t_rand(c.T * c.I, -1, 1);
    c.W = t_rand(c.O * c.I, -1, 1);
    c.A = t_rand(c.r * c.I, -0.5, 0.5);
    c.B = t_rand(c.O * c.r, -0.5, 0.5); /* nonzero (PEFT starts at 0) so dA is tested */
    c.g = t_rand(c.T * c.O, -1, 1);
    c.xd = t_rand(c.T * c.I, 0, 0);
    c.u = t_rand(c.T * c.r, 0, 0);
    c.y = t_rand(c.T * c.O, 0, 0);
    double *dB = t_rand(c.O * c.r, 0, 0), *du = t_rand(c.T * c.r, 0, 0);
    double *dA = t_rand(c.r * c.I, 0, 0), *dx = t_rand(c.T * c.I, 0, 0);
    double *dxl = t_rand(c.T * c.I, 0, 0);
    lora_fwd(&c);
    /* dB (O, r) = s * g^T (O, T) @ u (T, r) */
    assert_int_equal(ft_cpu_gemm_f64(1, 0, c.O, c.r, c.T, c.s, c.g, c.O, c.u, c.r, 0, dB, c.r), 0);
    /* du (T, r) = s * g (T, O) @ B (O, r) */
    assert_int_equal(ft_cpu_gemm_f64(0, 0, c.T, c.r, c.O, c.s, c.g, c.O, c.B, c.r, 0, du, c.r), 0);
    /* dA (r, I) = du^T (r, T) @ xd (T, I) */
    assert_int_equal(ft_cpu_gemm_f64(1, 0, c.r, c.I, c.T, 1, du, c.r, c.xd, c.I, 0, dA, c.I), 0);
    /* dx = g W + dropout(du A) */
    assert_int_equal(ft_cpu_gemm_f64(0, 0, c.T, c.I, c.O, 1, c.g, c.O, c.W, c.I, 0, dx, c.I), 0);
    assert_int_equal(ft_cpu_gemm_f64(0, 0, c.T, c.I, c.r, 1, du, c.r, c.A, c.I, 0, dxl, c.I), 0);
    assert_int_equal(ft_cpu_dropout_f64(dxl, dxl, c.T * c.I, c.p, c.seed), 0);
    assert_int_equal(ft_cpu_axpy_f64(1, dxl, dx, c.T * c.I), 0);
    fd_check("lora linear dx", c.x, dx, c.T * c.I, lora_loss, &c);
    fd_check("lora linear dA", c.A, dA, c.r * c.I, lora_loss, &c);
    fd_check("lora linear dB", c.B, dB, c.O * c.r, lora_loss, &c);
    free(c.x), free(c.W), free(c.A), free(c.B), free(c.g), free(c.xd), free(c.u), free(c.y);
    free(dB), free(du), free(dA), free(dx), free(dxl);
}

/* ---- a Qwen3 decoder block: per-head q/k RMSNorm before RoPE (fp32, op table) -------------- */
/* L = sum(g * block(x)) with LoRA on q_proj and k_proj (B non-zero so dA is exercised);
 * ft_block_bwd's dx, dB(q) and dA(k) against central differences of ft_block_fwd in fp32.
 * Every path into those gradients passes the q/k norms' backward. H*D = 16 != C = 12 and
 * Hkv = 1 < H = 2 (the k norm's gradient sums over the query heads sharing it).
 * fp32 differences with h = 1e-2: truncation O(h^2) ~ 1e-4 and rounding
 * O(eps * |L| / h) ~ 1e-5 against gradients O(0.1..1). */
#define BLOCK_FD_H 1e-2f
#define BLOCK_FD_ABS 2e-3
#define BLOCK_FD_REL 2e-2

typedef struct {
    ft_model_config cfg;
    ft_layer_weights w;
    ft_lora lora;
    ft_block_dims d;
    ft_block_io io;
    ft_block_acts a;
    ft_block_scratch s;
    float *x, *g, *out;
} blk_ctx;

static float *f_rand(int64_t n, double lo, double hi)
{
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++) a[i] = (float)t_unif(lo, hi);
    return a;
}

static double blk_loss(blk_ctx *c)
{
    assert_int_equal(ft_block_fwd(g_be, &c->cfg, &c->w, &c->lora, 0, &c->d, &c->io, c->x,
                                  c->out, &c->a, &c->s, 1),
                     0);
    double l = 0;
    for (int64_t i = 0; i < c->d.T * c->d.C; i++) l += (double)c->g[i] * (double)c->out[i];
    return l;
}

static void blk_fd(const char *name, blk_ctx *c, float *v, const float *ana, int64_t n)
{
    double max_rel = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float vi = v[i];
        v[i] = vi + BLOCK_FD_H;
        double fp = blk_loss(c);
        v[i] = vi - BLOCK_FD_H;
        double fm = blk_loss(c);
        v[i] = vi;
        double num = (fp - fm) / (2.0 * (double)BLOCK_FD_H), err = fabs(num - ana[i]);
        double rel = t_relerr(num, ana[i], 1e-2);
        if (rel > max_rel) max_rel = rel;
        if (!(err <= BLOCK_FD_ABS + BLOCK_FD_REL * fabs(num))) {
            if (bad < 5)
                print_message("%s: entry %lld: numeric %.6g, analytic %.6g\n", name, (long long)i,
                              num, (double)ana[i]);
            bad++;
        }
    }
    print_message("%s: max rel err %.1e over %lld entries\n", name, max_rel, (long long)n);
    assert_int_equal(bad, 0);
}

static void test_block_qk_norm_bwd(void **state)
{
    (void)state;
    blk_ctx c;
    memset(&c, 0, sizeof c);
    const int64_t T = 5, C = 12, H = 2, Hkv = 1, D = 8, F = 10, r = 2;
    ft_model_config *k = &c.cfg;
    snprintf(k->model_type, sizeof k->model_type, "qwen3");
    k->hidden_size = C, k->intermediate_size = F, k->num_hidden_layers = 1;
    k->num_attention_heads = H, k->num_key_value_heads = Hkv, k->head_dim = D;
    k->vocab_size = 32, k->max_position_embeddings = 64, k->rms_norm_eps = 1e-6f;
    k->rope_theta = 100.0, k->rope_type = FT_ROPE_DEFAULT, k->rope_factor = 1.0;
    k->rope_attention_factor = 1.0, k->qk_norm = 1;
    c.d = (ft_block_dims){T, C, H, Hkv, D, F, r};
    c.w.attn_norm = f_rand(C, 0.5, 1.5);
    c.w.ffn_norm = f_rand(C, 0.5, 1.5);
    c.w.q_norm = f_rand(D, 0.5, 1.5);
    c.w.k_norm = f_rand(D, 0.5, 1.5);
    const int64_t outs[FT_N_PROJ] = {H * D, Hkv * D, Hkv * D, C, F, F, C};
    const int64_t ins[FT_N_PROJ] = {C, C, C, H * D, C, C, F};
    for (int p = 0; p < FT_N_PROJ; p++) {
        ft_linear *li = &c.w.proj[p];
        li->out_n = outs[p], li->in_n = ins[p];
        li->w = f_rand(outs[p] * ins[p], -0.4, 0.4);
    }
    ft_lora_linear lin[1][FT_N_PROJ];
    memset(lin, 0, sizeof lin);
    for (int p = FT_Q; p <= FT_K; p++) {
        ft_lora_linear *l = &lin[0][p];
        l->in_n = ins[p], l->out_n = outs[p];
        l->A = f_rand(r * ins[p], -0.5, 0.5);
        l->B = f_rand(outs[p] * r, -0.5, 0.5);
        l->dA = f_rand(r * ins[p], 0, 0);
        l->dB = f_rand(outs[p] * r, 0, 0);
    }
    c.lora.cfg = (ft_lora_cfg){r, 4.0f, 0.0f, 0, (1u << FT_Q) | (1u << FT_K), 1};
    c.lora.scale = 2.0f;
    c.lora.n_layers = 1;
    c.lora.lin = lin;
    int32_t pos[5], ss[5];
    for (int i = 0; i < T; i++) pos[i] = 3 + 2 * i, ss[i] = 0;
    float inv[4];
    ft_rope_inv_freq(k, T, inv);
    c.io = (ft_block_io){pos, ss, inv, 0};
    float *acts = f_rand(ft_block_acts_floats(&c.d), 0, 0);
    float *scr = f_rand(ft_block_scratch_floats(&c.d), 0, 0);
    ft_block_acts_carve(&c.a, acts, &c.d, c.lora.cfg.targets);
    ft_block_scratch_carve(&c.s, scr, &c.d);
    c.x = f_rand(T * C, -1, 1);
    c.g = f_rand(T * C, -1, 1);
    c.out = f_rand(T * C, 0, 0);
    float *dx = f_rand(T * C, 0, 0);

    blk_loss(&c);
    assert_int_equal(ft_block_bwd(g_be, &c.cfg, &c.w, &c.lora, 0, &c.d, &c.io, c.x, c.g, dx,
                                  &c.a, &c.s),
                     0);
    blk_fd("qwen3 block dx", &c, c.x, dx, T * C);
    blk_fd("qwen3 block q_proj dB", &c, lin[0][FT_Q].B, lin[0][FT_Q].dB, H * D * r);
    blk_fd("qwen3 block k_proj dA", &c, lin[0][FT_K].A, lin[0][FT_K].dA, r * C);

    /* the block really normalizes: scaling q_proj (and its adapter) by 3 leaves the output
     * unchanged up to the norm's eps, which it would not without the per-head norm */
    double l0 = blk_loss(&c);
    for (int64_t i = 0; i < H * D * C; i++) c.w.proj[FT_Q].w[i] *= 3.0f;
    for (int64_t i = 0; i < H * D * r; i++) lin[0][FT_Q].B[i] *= 3.0f;
    double l1 = blk_loss(&c);
    print_message("qwen3 block: loss %.7g, with q_proj x3 %.7g\n", l0, l1);
    assert_true(fabs(l1 - l0) <= 1e-4 * fabs(l0) + 1e-5);

    free(c.w.attn_norm), free(c.w.ffn_norm), free(c.w.q_norm), free(c.w.k_norm);
    for (int p = 0; p < FT_N_PROJ; p++) free(c.w.proj[p].w);
    for (int p = FT_Q; p <= FT_K; p++)
        free(lin[0][p].A), free(lin[0][p].B), free(lin[0][p].dA), free(lin[0][p].dB);
    free(acts), free(scr), free(c.x), free(c.g), free(c.out), free(dx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_bwd),   cmocka_unit_test(test_rope_bwd),
        cmocka_unit_test(test_attention_bwd), cmocka_unit_test(test_swiglu_bwd),
        cmocka_unit_test(test_lm_head_ce_dx), cmocka_unit_test(test_dropout_bwd),
        cmocka_unit_test(test_lora_chain),    cmocka_unit_test(test_block_qk_norm_bwd),
    };
    return cmocka_run_group_tests(tests, kernels_setup, kernels_teardown);
}
