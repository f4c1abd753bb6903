/* test_stream_bench.c - the disk read-ahead's stream bench (offload/stream_bench.h) on a small
 * random NF4 pack of 6 layers (ft_init_model, under the build folder's file system: O_DIRECT):
 * for every setting tried (steps, staging buffers, slots, a modelled compute and copy rate) it
 * takes exactly the blocks of tiers.c's visit lists (2 L - 1 in step 1, 2 L - 2 after: the
 * block kept at the turn and the one kept from the previous step are not read again) with
 * their bytes (counted here from the pack's block table), the read-ahead reads each once and
 * drops none during the steps (its predictions of the next step are kept), and the rates are
 * positive. A modelled compute makes the steps last at least steps x 2 L passes (the host
 * waits for the compute at each step's end): a lower bound from the sleeps, not a timing
 * assertion. Options out of range are refused with a message naming them. */
#include "tests/unit/harness.h"

#include <math.h>

#include "kernels/kernels.h"
#include "offload/pack.h"
#include "offload/stream_bench.h"
#include "src/core/err.h"
#include "src/tools/init_model.h"

#define N_LAYERS 6

static char g_dir[] = "build-stream-bench-test-XXXXXX";
static char g_pack[4200];

static int setup(void **state)
{
    (void)state;
    /* under the build folder's file system, not /tmp, which may be tmpfs (no O_DIRECT) */
    if (!mkdtemp(g_dir)) return -1;
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", g_dir);
    FILE *f = fopen(cfg, "w");
    if (!f) return -1;
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
               "\"hidden_size\": 128, \"intermediate_size\": 256, \"num_attention_heads\": 4, "
               "\"num_key_value_heads\": 2, \"head_dim\": 32, \"num_hidden_layers\": %d, "
               "\"vocab_size\": 256, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
               "\"max_position_embeddings\": 512, \"tie_word_embeddings\": false}\n", N_LAYERS);
    fclose(f);
    ft_init_cfg c = {0};
    c.config_path = cfg;
    c.out_dir = g_dir;
    c.seed = 7;
    c.pack_quant = FT_PACK_QUANT_NF4;
    ft_init_result *res = calloc(1, sizeof *res);
    if (!res || ft_init_model(&c, res) != 0) {
        fprintf(stderr, "setup: %s\n", ft_errmsg());
        free(res);
        return -1;
    }
    snprintf(g_pack, sizeof g_pack, "%s", res->pack_path);
    free(res);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char p[256];
    unlink(g_pack);
    snprintf(p, sizeof p, "%s/config.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    return 0;
}

/* Bytes of layers [a, b] of the pack, from its block table. */
static uint64_t layer_bytes(ft_pack_file *pack, int64_t a, int64_t b)
{
    uint64_t sum = 0;
    for (int64_t l = a; l <= b; l++) {
        uint64_t off, n;
        assert_int_equal(ft_pack_block_extent(pack, l, &off, &n), 0);
        sum += n;
    }
    return sum;
}

/* busy_bound: the disk-busy time lies within the span (true for steps 1..N, which start with
 * the read-ahead; steps 2..N may count reads done ahead during step 1) */
static void check_span(const ft_stream_bench_span *s, int64_t steps, int64_t blocks, uint64_t bytes,
                       int busy_bound)
{
    assert_int_equal(s->steps, steps);
    assert_int_equal(s->blocks, blocks);
    assert_int_equal(s->bytes, bytes);
    if (steps == 0) return;
    assert_true(s->seconds > 0);
    assert_true(s->bytes / s->seconds > 0);
    assert_true(s->busy_seconds > 0);
    if (busy_bound) assert_true(s->busy_seconds <= s->seconds);
    assert_true(s->wait_seconds >= 0 && s->stall_seconds >= 0);
}

static void test_counts(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    ft_pack_file *pack;
    assert_int_equal(ft_pack_open(&pack, g_pack, 1), 0);
    const int64_t L = N_LAYERS;
    assert_int_equal(ft_pack_config(pack)->num_hidden_layers, L);
    /* step 1: 0..L-1 then L-2..0; later steps: 1..L-1 then L-2..0 */
    uint64_t first = layer_bytes(pack, 0, L - 1) + layer_bytes(pack, 0, L - 2);
    uint64_t later = layer_bytes(pack, 1, L - 1) + layer_bytes(pack, 0, L - 2);
    const struct {
        ft_stream_bench_opts o;
        int want_stage, want_slots;
    } cases[] = {
        {{3, 0, 0, 0, 0, 0}, 3, 2},             /* the defaults: min(L, 3) buffers, 2 slots */
        {{1, 1, 2, 0, 0, 0}, 1, 2},             /* one step, one buffer */
        {{2, 8, 8, 0, 0, 0}, 8, 8},             /* more buffers than blocks in flight */
        {{2, 2, 3, 0.002, 2e8, 0}, 2, 3},       /* modelled compute and copies */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ft_stream_bench_opts *o = &cases[i].o;
        ft_stream_bench_result *r = calloc(1, sizeof *r);
        int rc = ft_stream_bench(be, pack, o, r);
        if (rc) fprintf(stderr, "case %zu: %s\n", i, ft_errmsg());
        assert_int_equal(rc, 0);
        printf("case %zu: %d steps, %d buffers, %d slots, %g ms compute: %lld blocks, %llu bytes in "
               "%.3f s (%.3f GB/s; raw %.3f GB/s, busy %.0f%%); %s\n", i, o->steps, r->n_stage,
               r->n_slots, o->compute_s * 1e3, (long long)r->all.blocks,
               (unsigned long long)r->all.bytes, r->all.seconds, r->all.bytes / r->all.seconds / 1e9,
               r->raw_bytes_per_s / 1e9, 100.0 * r->all.busy_seconds / r->all.seconds, r->mode);
        assert_int_equal(r->layers, L);
        assert_int_equal(r->n_stage, cases[i].want_stage);
        assert_int_equal(r->n_slots, cases[i].want_slots);
        assert_int_equal(r->stage_bytes, ft_pack_max_layer_bytes(pack));
        int64_t n = o->steps;
        check_span(&r->all, n, (2 * L - 1) + (n - 1) * (2 * L - 2), first + (uint64_t)(n - 1) * later, 1);
        check_span(&r->steady, n - 1, (n - 1) * (2 * L - 2), (uint64_t)(n - 1) * later, 0);
        assert_int_equal(r->reads, r->all.blocks);   /* each block read once, all taken */
        assert_int_equal(r->dropped_in_run, 0);      /* every next-step prediction kept */
        assert_true(r->dropped_at_end >= 0 && r->dropped_at_end <= r->n_stage);
        /* the raw probes: the layer blocks (a small pack: all of them), positive rates */
        assert_int_equal(r->probe.bytes, layer_bytes(pack, 0, L - 1));
        assert_true(r->probe.bytes_per_s > 0 && r->probe_after.bytes_per_s > 0);
        assert_true(fabs(r->raw_bytes_per_s - 0.5 * (r->probe.bytes_per_s + r->probe_after.bytes_per_s)) <=
                    1e-9 * r->raw_bytes_per_s);
        if (o->compute_s > 0) /* the host waits for every pass at the step's end */
            assert_true(r->all.seconds >= n * 2 * L * o->compute_s);
        free(r);
    }
    ft_pack_close(pack);
    ft_backend_free(be);
}

static void test_bad_options(void **state)
{
    (void)state;
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    ft_pack_file *pack;
    assert_int_equal(ft_pack_open(&pack, g_pack, 0), 0);
    const struct {
        ft_stream_bench_opts o;
        const char *needle;     /* the message names the option */
    } bad[] = {
        {{0, 0, 0, 0, 0, 0}, "0 steps"},
        {{-2, 0, 0, 0, 0, 0}, "-2 steps"},
        {{1, 9, 0, 0, 0, 0}, "9 staging buffers (1..8)"},
        {{1, -1, 0, 0, 0, 0}, "-1 staging buffers"},
        {{1, 0, 1, 0, 0, 0}, "1 device slots (2..8)"},
        {{1, 0, 9, 0, 0, 0}, "9 device slots"},
        {{1, 0, 0, -0.001, 0, 0}, "-0.001 s of compute"},
        {{1, 0, 0, NAN, 0, 0}, "nan s of compute"},
        {{1, 0, 0, 0, -1, 0}, "copy rate of -1"},
        {{1, 0, 0, 0, INFINITY, 0}, "copy rate of inf"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ft_stream_bench_result *r = calloc(1, sizeof *r);
        assert_int_equal(ft_stream_bench(be, pack, &bad[i].o, r), FT_E_INVALID);
        printf("refused: %s\n", ft_errmsg());
        assert_non_null(strstr(ft_errmsg(), "stream bench: "));
        assert_non_null(strstr(ft_errmsg(), bad[i].needle));
        assert_int_equal(r->all.blocks, 0); /* nothing read */
        free(r);
    }
    ft_pack_close(pack);
    ft_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
