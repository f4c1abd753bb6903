/* test_lmhead_bf16.c - the LM head over a bf16 weight (kernels.h lm_head_logits_bf16; the
 * CPU's kernels/cpu/rows_f32.h ft_cpu_rows_bf16) and generation reading a pack's bf16 tables
 * (offload/exec.h globals_lazy):
 *   - the kernel is bit for bit the fp32 kernel on the widened weight, per code path, for
 *     T = 1..9 and more (one and two passes of 64 rows), C with and without a tail past the
 *     8 lanes, signed zeros, subnormals and large values in W, any thread count;
 *   - the CPU op is lm_head_logits' bits up to FT_LM_HEAD_BF16_ROWS rows (the fp32 op's own
 *     few-rows kernel), the few-rows kernel's above; the cpu-device table has no such op;
 *   - the refusals (negative sizes, NULL pointers, an unknown path);
 *   - an executor on a pack-only model (tied and untied) keeps the embeddings and LM head in
 *     bf16 on the CPU, and generation through it gives the logits of the fp32 tables
 *     (FTUNE_GEN_HEAD=f32) bit for bit: prefills, decode steps, a batched decode, a head of
 *     more rows than FT_LM_HEAD_BF16_ROWS (which reads the fp32 tables from the pack and frees
 *     the bf16 ones); eval and logits read the fp32 tables as before, bit for bit;
 *   - a read of the fp32 tables that fails (the pack unreadable for a moment, after the bf16
 *     table is freed) is an error, and the next forward reads them again: the embedding
 *     gather too, not only the head.
 * Model: tests/fixtures/tiny-llama as a pack-only folder (NF4 pack, V = 32000, C = 64). */
#include "tests/unit/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>

#include "kernels/cpu/rows_f32.h"
#include "kernels/cpu/simd_x86.h"
#include "kernels/kernels.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/infer/generate.h"
#include "src/tools/init_model.h"
#include "src/model/model.h"
#include "tests/unit/model_fixture.h"
#include "tests/unit/rows_fixture.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static float widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A random bf16 (V, C) weight (truncated fp32 uniforms), with a few special values mixed in
 * (signed zeros, a subnormal, large and small magnitudes), and its fp32 widening in *wf. */
static uint16_t *rand_bf16(int64_t V, int64_t C, uint64_t seed, float **wf)
{
    const int64_t n = V * C;
    float *f = randv(n, seed);
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8042, /* zeros, subnormals */
                                       0x5f00, 0x0080, 0x3f80, 0xbf80};
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        h[i] = (uint16_t)(u >> 16);
        if (i % 97 == 3) h[i] = special[(i / 97) % 8];
    }
    for (int64_t i = 0; i < n; i++) f[i] = widen(h[i]);
    *wf = f;
    return h;
}

/* ---- the kernel ----------------------------------------------------------------------------- */

/* ft_cpu_rows_bf16 == ft_cpu_rows_f32 on the widened W, bit for bit, per code path. */
static void test_kernel_vs_f32(void **state)
{
    (void)state;
    /* C: 8-lane multiples and tails of 1..7 (and C < 8: no vector part at all) */
    const int64_t shapes[][2] = {{576, 300}, {13, 17}, {1, 5},     {7, 33},
                                 {100, 129}, {65, 1000}, {4097, 40}};
    const int paths[3] = {FT_ROWS_F32_PORTABLE, FT_ROWS_F32_AVX2, FT_ROWS_F32_AUTO};
    for (int s = 0; s < 7; s++) {
        const int64_t C = shapes[s][0], V = shapes[s][1], TM = 70;
        float *Wf;
        uint16_t *W = rand_bf16(V, C, 10 + s, &Wf);
        float *x = randv(TM * C, 20 + s);
        float *y = malloc((size_t)(TM * V) * sizeof(float));
        float *yf = malloc((size_t)(TM * V) * sizeof(float));
        for (int p = 0; p < 3; p++) {
            if (paths[p] == FT_ROWS_F32_AVX2 && !ft_cpu_have_avx2()) continue;
            static const int64_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 64, 65, 70};
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                const int64_t T = Ts[k];
                memset(y, 0xff, (size_t)(T * V) * sizeof(float));
                assert_int_equal(ft_cpu_rows_bf16(y, x, W, T, C, V, paths[p]), 0);
                assert_int_equal(ft_cpu_rows_f32(yf, x, Wf, T, C, V, paths[p]), 0);
                if (memcmp(y, yf, (size_t)(T * V) * sizeof(float))) {
                    for (int64_t i = 0, shown = 0; i < T * V && shown < 5; i++)
                        if (memcmp(&y[i], &yf[i], 4))
                            printf("  C=%lld V=%lld T=%lld path %d: [%lld] bf16 %.9g, fp32 %.9g\n",
                                   (long long)C, (long long)V, (long long)T, paths[p], (long long)i,
                                   (double)y[i], (double)yf[i]), shown++;
                    fail_msg("rows_bf16 differs from rows_f32 on the widened weight");
                }
            }
        }
        free(W);
        free(Wf);
        free(x);
        free(y);
        free(yf);
    }
}

/* The same bits for 1 and 2 threads; the backend's op against lm_head_logits; the refusals. */
static void test_op_threads_refusals(void **state)
{
    (void)state;
    const int64_t C = 577, V = 2003, TM = 20;
    float *Wf;
    uint16_t *W = rand_bf16(V, C, 3, &Wf);
    float *x = randv(TM * C, 4);
    float *y = malloc((size_t)(TM * V) * sizeof(float));
    float *y2 = malloc((size_t)(TM * V) * sizeof(float));
    rows_same_at_1_and_2_threads(y, y2, x, W, 1, 7, C, V);

    ft_backend *be, *dev;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    assert_non_null(be->ops->lm_head_logits_bf16);
    for (int64_t T = 1; T <= TM; T++) {
        assert_int_equal(be->ops->lm_head_logits_bf16(be, y, x, W, T, C, V), 0);
        if (T <= FT_LM_HEAD_BF16_ROWS) { /* the fp32 op's bits */
            assert_int_equal(be->ops->lm_head_logits(be, y2, x, Wf, T, C, V), 0);
        } else { /* past them lm_head_logits runs sgemm; the op stays the few-rows kernel */
            assert_int_equal(ft_cpu_rows_f32(y2, x, Wf, T, C, V, FT_ROWS_F32_AUTO), 0);
        }
        assert_memory_equal(y, y2, (size_t)(T * V) * sizeof(float));
    }
    /* a device table (as CUDA's) has none: callers check before asking */
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    assert_null(dev->ops->lm_head_logits_bf16);
    ft_backend_free(dev);

    /* refusals: clear errors, nothing read or written */
    assert_int_equal(ft_cpu_rows_bf16(y, x, W, -1, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "rows_bf16"));
    assert_int_equal(ft_cpu_rows_bf16(y, x, W, 2, -3, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_bf16(y, x, W, 2, C, -1, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_bf16(y, NULL, W, 2, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_bf16(y, x, NULL, 2, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_bf16(NULL, x, W, 2, C, V, FT_ROWS_F32_AUTO), FT_E_INVALID);
    assert_int_equal(ft_cpu_rows_bf16(y, x, W, 2, C, V, 7), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "code path 7"));
    assert_int_equal(be->ops->lm_head_logits_bf16(be, y, x, W, -2, C, V), FT_E_INVALID);
    assert_int_equal(be->ops->lm_head_logits_bf16(be, y, NULL, W, 3, C, V), FT_E_INVALID);
    if (!ft_cpu_have_avx2())
        assert_int_equal(ft_cpu_rows_bf16(y, x, W, 2, C, V, FT_ROWS_F32_AVX2), FT_E_UNSUPPORTED);
    /* nothing to do: no pointer is read */
    assert_int_equal(ft_cpu_rows_bf16(NULL, NULL, NULL, 0, C, V, FT_ROWS_F32_AUTO), 0);
    assert_int_equal(be->ops->lm_head_logits_bf16(be, NULL, NULL, NULL, 4, C, 0), 0);
    ft_backend_free(be);
    free(W);
    free(Wf);
    free(x);
    free(y);
    free(y2);
}

/* ---- generation over a pack's bf16 tables -------------------------------------------------- */

#define N_TOK 24

/* An executor of 5 tokens on the pack (in memory), the fp32 tables (f32 = 1: FTUNE_GEN_HEAD=f32)
 * or the bf16 ones. */
static void exec_on(ft_exec *e, ft_backend *be, const ft_model *m, ft_pack_file *pack, int f32)
{
    be->tune.gen_head_f32 = f32; /* the program's FTUNE_GEN_HEAD=f32 */
    assert_int_equal(ft_exec_init_ex(e, be, m, NULL, N_TOK, 1, N_TOK, 0), 0);
    assert_int_equal(ft_exec_use_pack_ex(e, pack, 1), 0);
    be->tune.gen_head_f32 = 0;
    assert_int_equal(e->globals_lazy, !f32);
    assert_true(f32 ? e->lm_head && e->embed && !e->globals_bf16
                    : !e->lm_head && !e->embed && e->lm_head_bf16 && e->embed_bf16);
}

/* The logits of ft_gen_forward (rows of the last `rows` tokens of ids[0..n)) from fresh caches,
 * then of decode steps: g on executor a (fp32 tables) and h on b (bf16): the same bits. */
static void same_gen(ft_gen *g, ft_gen *h, const int32_t *ids, int64_t n, int64_t rows, int64_t V)
{
    float *la = malloc((size_t)(N_TOK * V) * 4), *lb = malloc((size_t)(N_TOK * V) * 4);
    ft_gen_reset(g);
    ft_gen_reset(h);
    assert_int_equal(ft_gen_forward(g, ids, n, la, rows), 0);
    assert_int_equal(ft_gen_forward(h, ids, n, lb, rows), 0);
    assert_memory_equal(la, lb, (size_t)(rows * V) * 4);
    for (int64_t t = n; t < N_TOK; t++) {
        assert_int_equal(ft_gen_forward(g, ids + t, 1, la, 1), 0);
        assert_int_equal(ft_gen_forward(h, ids + t, 1, lb, 1), 0);
        assert_memory_equal(la, lb, (size_t)V * 4);
    }
    free(la);
    free(lb);
}

static void pack_case(ft_backend *be, const char *dir, const char *label)
{
    ft_model *m = NULL;
    ft_pack_file *pack = NULL;
    pack_only_load(dir, &m, &pack);
    const int64_t V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    const int untied = ft_exec_untied(m);
    ft_exec a, b, c;
    exec_on(&a, be, m, pack, 1);
    exec_on(&b, be, m, pack, 0);
    assert_int_equal(a.weights_bytes, b.weights_bytes); /* the fp32 plan, as before */
    /* the bf16 tables hold the fp32 tables' values */
    for (int64_t i = 0; i < V * C; i++) {
        assert_true(widen(b.embed_bf16[i]) == a.embed[i] || isnan(a.embed[i]));
        assert_true(widen(b.lm_head_bf16[i]) == a.lm_head[i] || isnan(a.lm_head[i]));
    }
    assert_true(untied ? b.lm_head_bf16 != b.embed_bf16 : b.lm_head_bf16 == b.embed_bf16);

    ft_gen_source sa, sb;
    assert_int_equal(ft_exec_gen_source(&a, &sa), 0);
    assert_int_equal(ft_exec_gen_source(&b, &sb), 0);
    assert_true(sa.lm_head && !sa.head);
    assert_true(!sb.lm_head && sb.head && !sb.embed && sb.embed_rows);
    ft_gen g, h;
    assert_int_equal(ft_gen_init_source(&g, be, m, NULL, &sa, N_TOK, N_TOK, N_TOK), 0);
    assert_int_equal(ft_gen_init_source(&h, be, m, NULL, &sb, N_TOK, N_TOK, N_TOK), 0);
    int32_t ids[N_TOK];
    ft_rng r;
    ft_rng_seed(&r, 77);
    for (int i = 0; i < N_TOK; i++) ids[i] = (int32_t)(ft_rng_uniform(&r) * (float)V) % (int32_t)V;
    ids[3] = 0;
    ids[4] = (int32_t)V - 1;
    /* prefills of 1..9 and 16 rows (bf16 head), then decode steps of one */
    for (int64_t rows = 1; rows <= FT_LM_HEAD_BF16_ROWS; rows += rows < 9 ? 1 : 7)
        same_gen(&g, &h, ids, 17, rows, V);
    same_gen(&g, &h, ids, 4, 1, V);
    assert_non_null(b.globals_bf16); /* generation of a few rows read no fp32 table */
    assert_null(b.lm_head);
    /* a batched decode of 3 sequences (ft_gen_decode: one head of 3 rows) */
    {
        ft_gen g3, h3;
        assert_int_equal(ft_gen_init_seqs(&g3, be, m, NULL, &sa, N_TOK, 8, 3, 3), 0);
        assert_int_equal(ft_gen_init_seqs(&h3, be, m, NULL, &sb, N_TOK, 8, 3, 3), 0);
        float *la = malloc((size_t)(3 * V) * 4), *lb = malloc((size_t)(3 * V) * 4);
        const int64_t seqs[3] = {2, 0, 1};
        for (int64_t s = 0; s < 3; s++) {
            assert_int_equal(ft_gen_forward_seq(&g3, s, ids + 5 * s, 3 + s, la, 1), 0);
            assert_int_equal(ft_gen_forward_seq(&h3, s, ids + 5 * s, 3 + s, lb, 1), 0);
            assert_memory_equal(la, lb, (size_t)V * 4);
        }
        for (int step = 0; step < 3; step++) {
            assert_int_equal(ft_gen_decode(&g3, seqs, ids + 16 + step, 3, la), 0);
            assert_int_equal(ft_gen_decode(&h3, seqs, ids + 16 + step, 3, lb), 0);
            assert_memory_equal(la, lb, (size_t)(3 * V) * 4);
        }
        free(la);
        free(lb);
        ft_gen_free(&g3);
        ft_gen_free(&h3);
    }
    /* a bad id through the source's gather: refused, as the fp32 gather refuses it */
    {
        float *x = malloc((size_t)C * 4);
        int32_t bad = (int32_t)V;
        assert_int_equal(sb.embed_rows(sb.ctx, &bad, 1, x), FT_E_INVALID);
        free(x);
    }
    /* a head of more rows than the bf16 op gives lm_head_logits' bits for: the fp32 tables read
     * from the pack (the bf16 ones freed), the same logits, and on from there */
    same_gen(&g, &h, ids, N_TOK, N_TOK, V);
    assert_null(b.globals_bf16);
    assert_non_null(b.lm_head);
    assert_non_null(b.embed);
    assert_memory_equal(b.lm_head, a.lm_head, (size_t)(V * C) * 4);
    same_gen(&g, &h, ids, 6, 2, V);
    printf("[%s] generation over the bf16 tables: the fp32 tables' logits, bit for bit\n", label);
    ft_gen_free(&g);
    ft_gen_free(&h);

    /* eval and logits on a fresh bf16 executor: the fp32 tables read at the first forward, the
     * loss and logits of the fp32 executor bit for bit */
    exec_on(&c, be, m, pack, 0);
    int32_t tg[N_TOK], pos[N_TOK], ss[N_TOK] = {0};
    for (int t = 0; t < N_TOK; t++) {
        pos[t] = t;
        tg[t] = t + 1 < N_TOK ? ids[t + 1] : -100;
    }
    ft_batch bt = {1, N_TOK, N_TOK, ids, tg, pos, ss, N_TOK - 1};
    double la = 0, lc = 0;
    int64_t na = 0, nc = 0;
    assert_int_equal(ft_exec_eval(&a, &bt, &la, &na), 0);
    assert_int_equal(ft_exec_eval(&c, &bt, &lc, &nc), 0);
    assert_int_equal(na, nc);
    assert_memory_equal(&la, &lc, sizeof la);
    assert_null(c.globals_bf16);
    assert_non_null(c.lm_head);
    float *qa = malloc((size_t)(N_TOK * V) * 4), *qc = malloc((size_t)(N_TOK * V) * 4);
    assert_int_equal(ft_exec_logits(&a, &bt, qa), 0);
    assert_int_equal(ft_exec_logits(&c, &bt, qc), 0);
    assert_memory_equal(qa, qc, (size_t)(N_TOK * V) * 4);
    printf("[%s] eval and logits after the bf16 placement: loss %.9g, bit for bit\n", label, lc);
    free(qa);
    free(qc);
    ft_exec_free(&a);
    ft_exec_free(&b);
    ft_exec_free(&c);
    ft_pack_close(pack);
    ft_model_free(m);
}

static void test_gen_over_pack(void **state)
{
    (void)state;
    char tied[700], untied[700], *dir = write_pack_only_pair(tied, untied, sizeof tied);
    ft_backend *cpu, *dev;
    assert_int_equal(ft_backend_cpu_init(&cpu, 2), 0);
    pack_case(cpu, tied, "cpu, tied");
    pack_case(cpu, untied, "cpu, untied");
    /* the cpu-device table has no lm_head_logits_bf16: its executor reads fp32 tables */
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    ft_model *m = NULL;
    ft_pack_file *pack = NULL;
    pack_only_load(tied, &m, &pack);
    ft_exec e;
    assert_int_equal(ft_exec_init_ex(&e, dev, m, NULL, 4, 1, 4, 0), 0);
    assert_int_equal(ft_exec_use_pack_tiers(&e, pack, NULL, 2, 1), 0);
    assert_int_equal(e.globals_lazy, 0);
    assert_non_null(e.lm_head);
    ft_gen_source s;
    assert_int_equal(ft_exec_gen_source(&e, &s), 0);
    assert_null(s.head);
    ft_exec_free(&e);
    ft_pack_close(pack);
    ft_model_free(m);
    ft_backend_free(dev);
    ft_backend_free(cpu);
    free(dir);
}

/* Points every descriptor of this process open on `path` at `to` (saved[] gets copies of the
 * originals, restore: to < 0 puts them back); the number of such descriptors. */
static int swap_fds(const char *path, int to, int *fds, int *saved, int cap)
{
    if (to < 0) {
        for (int i = 0; i < cap; i++) {
            assert_true(dup2(saved[i], fds[i]) == fds[i]);
            close(saved[i]);
        }
        return cap;
    }
    char want[PATH_MAX], link[64], got[PATH_MAX];
    assert_non_null(realpath(path, want));
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        const int fd = atoi(de->d_name);
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, got, sizeof got - 1);
        if (k <= 0) continue;
        got[k] = 0;
        if (strcmp(got, want) || n == cap) continue;
        fds[n++] = fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        saved[i] = dup(fds[i]);
        assert_true(saved[i] >= 0);
        assert_true(dup2(to, fds[i]) == fds[i]);
    }
    return n;
}

/* The fp32 tables' read fails once (the pack's descriptors on /dev/null: an early end of
 * file) at a head of many rows, which has freed the bf16 table: an error, not a crash; once
 * the pack reads again, the next forward (whose embedding gather comes first) reads the fp32
 * tables and gives the fp32 executor's logits. */
static void test_f32_read_failure(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), path[700];
    write_pack_only(dir, "tied", 0, path, sizeof path);
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    ft_model *m = NULL;
    ft_pack_file *pack = NULL;
    pack_only_load(path, &m, &pack);
    const int64_t V = m->cfg.vocab_size;
    ft_exec a, b;
    exec_on(&a, be, m, pack, 1);
    exec_on(&b, be, m, pack, 0);
    ft_gen_source sa, sb;
    assert_int_equal(ft_exec_gen_source(&a, &sa), 0);
    assert_int_equal(ft_exec_gen_source(&b, &sb), 0);
    ft_gen g, h;
    assert_int_equal(ft_gen_init_source(&g, be, m, NULL, &sa, N_TOK, N_TOK, N_TOK), 0);
    assert_int_equal(ft_gen_init_source(&h, be, m, NULL, &sb, N_TOK, N_TOK, N_TOK), 0);
    int32_t ids[N_TOK];
    for (int i = 0; i < N_TOK; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    same_gen(&g, &h, ids, 5, 1, V); /* the bf16 tables */
    assert_non_null(b.globals_bf16);

    int fds[8], saved[8];
    const int null = open("/dev/null", O_RDONLY);
    assert_true(null >= 0);
    const int nfd = swap_fds(m->pack_only, null, fds, saved, 8);
    assert_true(nfd >= 1);
    float *lb = malloc((size_t)(N_TOK * V) * 4);
    ft_gen_reset(&h);
    const int rc = ft_gen_forward(&h, ids, N_TOK, lb, N_TOK); /* > FT_LM_HEAD_BF16_ROWS rows */
    swap_fds(m->pack_only, -1, fds, saved, nfd);
    close(null);
    assert_int_not_equal(rc, 0);
    printf("a failed read of the fp32 tables: %s\n", ft_errmsg());
    assert_null(b.globals_bf16); /* freed before the read */
    assert_null(b.embed);
    /* the pack reads again: the gather of the next forward reads the tables */
    same_gen(&g, &h, ids, 5, 1, V);
    assert_non_null(b.embed);
    same_gen(&g, &h, ids, N_TOK, N_TOK, V);
    free(lb);
    ft_gen_free(&g);
    ft_gen_free(&h);
    ft_exec_free(&a);
    ft_exec_free(&b);
    ft_pack_close(pack);
    ft_model_free(m);
    ft_backend_free(be);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_vs_f32),
        cmocka_unit_test(test_op_threads_refusals),
        cmocka_unit_test(test_gen_over_pack),
        cmocka_unit_test(test_f32_read_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
