/* test_pack.c - the pack file (offload/pack*.c), the executor's packed base
 * (ft_exec_use_pack) and init-model (src/model/init_model.c):
 *   XXH64 against published vectors, one-shot == streaming;
 *   the cache: built, reused, another quant setting gets its own file, corruption of a data
 *   byte / the header / the complete flag / the length detected and rebuilt with a reason,
 *   and ft_pack_open's errors;
 *   the layer weights read back: a BF16 pack of a bf16 model is exact, an NF4 pack equals
 *   nf4.c's quantize + dequantize of the model's weights bit for bit;
 *   the executor: a BF16 pack gives the bit-identical loss of the resident model, an NF4
 *   pack a close one, and a training step reads each block once per pass;
 *   init-model: sharded safetensors with index that ft_model_load reads, norms 1, biases 0,
 *   weights ~ N(0, 0.02) in bf16, and a pack written directly from the random values that is
 *   byte-identical to the pack built from those safetensors. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "adapters/lora.h"
#include "offload/exec.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/init_model.h"
#include "src/model/model.h"

#define TINY "tests/fixtures/tiny-llama"
/* NF4 base vs the bf16 base of the random tiny model: the eval loss moves by the effect of
 * ~7% (of std) weight noise on a near-uniform predictor; observed well under 1%. */
#define FT_TOL_NF4_LOSS_REL 0.02
/* init-model: sample std of 100k+ N(0, 0.02) values rounded to bf16 (std error ~0.3%). */
#define FT_TOL_INIT_STD_REL 0.03

static void test_xxh64(void **state)
{
    (void)state;
    /* xxHash reference values (seed 0): "" and "abc" (xxhash spec / Fastly docs),
     * "Hello, world!" (InfluxData hash.xxhash64 docs), the python-xxhash README string */
    const struct { const char *s; uint64_t h; } v[] = {
        {"", 0xEF46DB3751D8E999ull},
        {"abc", 0x44BC2CF5AD770999ull},
        {"Hello, world!", 17691043854468224118ull},
        {"Nobody inspects the spammish repetition", 0xfbcea83c8a378bf1ull},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        assert_true(ft_pack_xxh64(v[i].s, strlen(v[i].s), 0) == v[i].h);
    uint8_t buf[1000];
    ft_rng r;
    ft_rng_seed(&r, 1);
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)ft_rng_next(&r);
    uint64_t one = ft_pack_xxh64(buf, sizeof buf, 7);
    for (int t = 0; t < 50; t++) {
        ft_xxh64 h;
        ft_xxh64_init(&h, 7);
        size_t pos = 0;
        while (pos < sizeof buf) {
            size_t k = ft_rng_next(&r) % 70;
            if (k > sizeof buf - pos) k = sizeof buf - pos;
            ft_xxh64_update(&h, buf + pos, k);
            pos += k;
        }
        assert_true(ft_xxh64_digest(&h) == one);
    }
}

/* Rewrites `n` bytes at `off` of a file. */
static void poke(const char *path, int64_t off, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, n, off), (ssize_t)n);
    close(fd);
}

static void flip_byte(const char *path, int64_t off)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static void test_cache_and_corruption(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    ft_pack_settings s, sb;
    ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
    ft_pack_settings_default(&sb, FT_PACK_QUANT_BF16);
    ft_pack_ensure_info a, b;
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &a), 0);
    assert_int_equal(a.action, FT_PACK_BUILT);
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
    assert_int_equal(b.action, FT_PACK_REUSED);
    assert_string_equal(a.path, b.path);
    assert_int_equal(ft_pack_ensure(TINY, dir, &sb, 0, &b), 0); /* another setting: its own file */
    assert_int_equal(b.action, FT_PACK_BUILT);
    assert_string_not_equal(a.path, b.path);

    ft_pack_file *p;
    assert_int_equal(ft_pack_open(&p, a.path, 1), 0);
    const ft_pack_hdr h = *ft_pack_header(p);
    int64_t l1 = (int64_t)h.header_bytes + (int64_t)ft_pack_block_bytes(p, 0);
    ft_pack_close(p);
    struct { const char *what; int64_t off; const char *needle; } cases[] = {
        {"a byte of layer 1's NF4 data", l1 + 3000, "checksum"},
        {"a byte of the config text", (int64_t)sizeof(ft_pack_hdr) + 5, "header checksum"},
        {"the complete flag", (int64_t)offsetof(ft_pack_hdr, complete), "complete flag"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flip_byte(a.path, cases[i].off);
        int rc = ft_pack_open(&p, a.path, 1);
        fprintf(stderr, "corrupt %s: %s\n", cases[i].what, ft_errmsg());
        assert_int_equal(rc, FT_E_CORRUPT);
        assert_non_null(strstr(ft_errmsg(), cases[i].needle));
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
        assert_int_equal(b.action, FT_PACK_REBUILT);
        assert_non_null(strstr(b.reason, cases[i].needle));
        assert_int_equal(ft_pack_open(&p, a.path, 1), 0); /* the rebuilt file is good */
        ft_pack_close(p);
    }
    /* every byte of the file is covered by the header checksum or a block checksum: any
     * flipped byte is caught by a verifying open (and flipping it back restores the file) */
    struct stat fst;
    assert_int_equal(stat(a.path, &fst), 0);
    ft_rng fr;
    ft_rng_seed(&fr, 17);
    int caught = 0;
    for (int t = 0; t < 200; t++) {
        int64_t off = (int64_t)(ft_rng_next(&fr) % (uint64_t)fst.st_size);
        flip_byte(a.path, off);
        int rc = ft_pack_open(&p, a.path, 1);
        if (rc == 0) ft_pack_close(p);
        caught += rc == FT_E_CORRUPT || rc == FT_E_UNSUPPORTED;
        flip_byte(a.path, off);
    }
    fprintf(stderr, "random single-byte corruption: %d of 200 detected\n", caught);
    assert_int_equal(caught, 200);
    assert_int_equal(ft_pack_open(&p, a.path, 1), 0);
    ft_pack_close(p);
    /* truncated: the size no longer matches; the checked read reports it */
    assert_int_equal(truncate(a.path, l1 + 4096), 0);
    assert_int_equal(ft_pack_open(&p, a.path, 0), FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), "truncated"));
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
    assert_int_equal(b.action, FT_PACK_REBUILT);
    /* not a pack / a newer version */
    poke(a.path, 0, "XXXX", 4);
    assert_int_equal(ft_pack_open(&p, a.path, 0), FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), "magic"));
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 1, &b), 0); /* --force */
    assert_int_equal(b.action, FT_PACK_REBUILT);
    uint32_t v = 99;
    poke(a.path, 8, &v, 4);
    assert_int_equal(ft_pack_open(&p, a.path, 0), FT_E_UNSUPPORTED);
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
    assert_int_equal(b.action, FT_PACK_REBUILT);
    /* a read of one block checks its checksum too */
    assert_int_equal(ft_pack_open(&p, a.path, 0), 0);
    flip_byte(a.path, l1 + 100);
    size_t n = ft_pack_max_layer_bytes(p);
    void *buf = aligned_alloc(4096, n);
    assert_int_equal(ft_pack_read_block(p, 0, buf, n, 1), 0);
    assert_int_equal(ft_pack_read_block(p, 1, buf, n, 1), FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), "layer 1"));
    free(buf);
    ft_pack_close(p);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

/* A layer's weights from a pack, next to the model's. */
static void test_layer_weights(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    ft_model *m;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    const ft_model_config *c = &m->cfg;
    float map[256];
    ft_nf4_dynamic_map(map);
    for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
        ft_pack_settings s;
        ft_pack_settings_default(&s, quant);
        ft_pack_ensure_info in;
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &in), 0);
        ft_pack_file *p;
        assert_int_equal(ft_pack_open(&p, in.path, 1), 0);
        size_t n = ft_pack_max_layer_bytes(p);
        void *buf = aligned_alloc(4096, n);
        float *w32 = aligned_alloc(64, (size_t)ft_pack_layer_floats(c) * 4);
        int64_t mismatches = 0;
        for (int64_t l = 0; l < c->num_hidden_layers; l++) {
            assert_int_equal(ft_pack_read_block(p, l, buf, n, 1), 0);
            ft_layer_weights w;
            assert_int_equal(ft_pack_layer_weights(p, l, buf, w32, &w), 0);
            const ft_layer_weights *ref = &m->layers[l];
            assert_memory_equal(w.attn_norm, ref->attn_norm, (size_t)c->hidden_size * 4);
            assert_memory_equal(w.ffn_norm, ref->ffn_norm, (size_t)c->hidden_size * 4);
            for (int q = 0; q < FT_N_PROJ; q++) {
                int64_t e = ref->proj[q].out_n * ref->proj[q].in_n;
                assert_int_equal(w.proj[q].out_n, ref->proj[q].out_n);
                assert_int_equal(w.proj[q].in_n, ref->proj[q].in_n);
                float *want = malloc((size_t)e * 4);
                if (quant == FT_PACK_QUANT_BF16) {
                    memcpy(want, ref->proj[q].w, (size_t)e * 4); /* the model is bf16: exact */
                } else {
                    ft_nf4_layout lay;
                    ft_nf4_layout_init(&lay, e, 64, 256);
                    uint8_t *codes = malloc(lay.code_bytes), *qa = malloc(lay.n_blocks);
                    float *na = malloc(lay.n_nested * 4), *am = malloc(lay.n_blocks * 4), off;
                    assert_int_equal(ft_nf4_quantize(ref->proj[q].w, &lay, map, codes, qa, na, &off, am), 0);
                    ft_nf4_view v = {lay, codes, qa, NULL, na, map, ft_nf4_code, off};
                    ft_nf4_dequant(&v, want);
                    free(codes); free(qa); free(na); free(am);
                }
                mismatches += memcmp(want, w.proj[q].w, (size_t)e * 4) != 0;
                free(want);
            }
        }
        fprintf(stderr, "%s pack: %lld of %lld weights differ from the expected fp32 values\n",
                ft_pack_quant_name(quant), (long long)mismatches, (long long)(7 * c->num_hidden_layers));
        assert_int_equal(mismatches, 0);
        /* a block of another layer is refused */
        assert_int_equal(ft_pack_read_block(p, 0, buf, n, 1), 0);
        ft_layer_weights w;
        assert_int_equal(ft_pack_layer_weights(p, 1, buf, w32, &w), 0); /* same shapes: fine */
        assert_int_equal(ft_pack_layer_weights(p, 5, buf, w32, &w), FT_E_RANGE);
        free(buf);
        free(w32);
        ft_pack_close(p);
    }
    ft_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static ft_batch make_batch(int64_t S, int64_t V, uint64_t seed)
{
    ft_batch b = {1, S, S};
    b.ids = malloc(S * 4);
    b.targets = malloc(S * 4);
    b.pos = malloc(S * 4);
    b.seq_start = malloc(S * 4);
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int64_t t = 0; t < S; t++) {
        b.ids[t] = (int32_t)(ft_rng_next(&r) % (uint64_t)V);
        b.pos[t] = (int32_t)t;
        b.seq_start[t] = 0;
    }
    for (int64_t t = 0; t < S; t++) {
        b.targets[t] = t + 1 < S ? b.ids[t + 1] : -100;
        b.n_targets += b.targets[t] >= 0;
    }
    return b;
}

static void test_exec_with_pack(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    ft_model *m;
    ft_backend *be;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    ft_lora lora;
    assert_int_equal(ft_lora_init(&lora, m, &lc, be), 0);
    ft_rng r;
    ft_rng_seed(&r, 3);
    for (int64_t i = 0; i < lora.n_params; i++) lora.host[i] = (ft_rng_uniform(&r) - 0.5f) * 0.1f;
    ft_lora_push(&lora);
    const int64_t S = 32, L = m->cfg.num_hidden_layers;
    ft_batch b = make_batch(S, m->cfg.vocab_size, 9);
    double base_loss, loss[3];
    int64_t nt;
    ft_exec ex;
    assert_int_equal(ft_exec_init(&ex, be, m, &lora, S, 1, S), 0);
    assert_int_equal(ft_exec_eval(&ex, &b, &base_loss, &nt), 0);
    ft_exec_free(&ex);
    ft_pack_file *packs[3] = {0};
    for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
        ft_pack_settings s;
        ft_pack_settings_default(&s, quant);
        ft_pack_ensure_info in;
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &in), 0);
        assert_int_equal(ft_pack_open(&packs[quant], in.path, 0), 0);
        assert_int_equal(ft_exec_init(&ex, be, m, &lora, S, 1, S), 0);
        assert_int_equal(ft_exec_use_pack(&ex, packs[quant]), 0);
        assert_int_equal(ft_exec_eval(&ex, &b, &loss[quant], &nt), 0);
        assert_int_equal(ex.pack_reads, L);
        /* a training step: forward reads L blocks, backward L - 1 (the last is still held) */
        lora.cfg.dropout = 0;
        be->ops->zero(be, lora.grads, (size_t)lora.n_params * 4);
        double ls;
        int64_t nv;
        ex.pack_reads = 0;
        assert_int_equal(ft_exec_train_step(&ex, &b, 1, b.n_targets, 0, &ls, &nv), 0);
        assert_int_equal(ex.pack_reads, 2 * L - 1);
        assert_int_equal(ex.layer_fetches, L + 2 * L);
        assert_true(ls / nv == loss[quant] / nt || fabs(ls / nv - loss[quant] / nt) < 1e-6);
        ft_exec_free(&ex);
    }
    double rel = fabs(loss[FT_PACK_QUANT_NF4] - base_loss) / base_loss;
    fprintf(stderr, "eval loss: resident %.6f, bf16 pack %.6f, nf4 pack %.6f (rel %.2e)\n",
            base_loss / nt, loss[FT_PACK_QUANT_BF16] / nt, loss[FT_PACK_QUANT_NF4] / nt, rel);
    assert_true(loss[FT_PACK_QUANT_BF16] == base_loss); /* bf16 model, bf16 pack: identical */
    assert_true(rel < FT_TOL_NF4_LOSS_REL);
    assert_true(loss[FT_PACK_QUANT_NF4] != base_loss);  /* the NF4 base is really used */
    /* a pack of another architecture is refused */
    ft_model_config other = m->cfg;
    m->cfg.hidden_size *= 2;
    assert_int_equal(ft_exec_init(&ex, be, m, &lora, S, 1, S), 0);
    assert_int_equal(ft_exec_use_pack(&ex, packs[FT_PACK_QUANT_NF4]), FT_E_INVALID);
    ft_exec_free(&ex);
    m->cfg = other;
    for (int q = 0; q < 3; q++) ft_pack_close(packs[q]);
    free(b.ids); free(b.targets); free(b.pos); free(b.seq_start);
    ft_lora_free(&lora);
    ft_backend_free(be);
    ft_model_free(m);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static int files_equal(const char *a, const char *b)
{
    char *x, *y;
    size_t nx, ny;
    if (ft_read_file(a, &x, &nx) < 0 || ft_read_file(b, &y, &ny) < 0) return 0;
    int eq = nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return eq;
}

static void test_init_model(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), cfgp[600], out[600], cache[600];
    snprintf(cfgp, sizeof cfgp, "%s/arch.json", dir);
    snprintf(out, sizeof out, "%s/model", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const char *js = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
                     "\"hidden_size\": 64, \"intermediate_size\": 160, \"num_hidden_layers\": 3, "
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
                     "\"attention_bias\": true, \"tie_word_embeddings\": false, "
                     "\"initializer_range\": 0.02, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0}";
    FILE *f = fopen(cfgp, "w");
    fputs(js, f);
    fclose(f);
    ft_init_cfg c = {cfgp, out, 77, 60000, 1, FT_PACK_QUANT_NF4, NULL};
    ft_init_result res;
    assert_int_equal(ft_init_model(&c, &res), 0);
    fprintf(stderr, "init-model: %lld params, %d shards, %llu bytes; pack %s %llu bytes\n",
            (long long)res.n_params, res.n_shards, (unsigned long long)res.st_bytes, res.pack_path,
            (unsigned long long)res.pack.file_bytes);
    assert_true(res.n_shards > 1);
    char idx[700];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", out);
    assert_int_equal(access(idx, R_OK), 0);
    ft_model *m;
    assert_int_equal(ft_model_load(&m, out), 0);
    assert_int_equal(ft_model_n_params(m), res.n_params);
    double ss = 0;
    int64_t cnt = 0;
    for (int64_t l = 0; l < 3; l++) {
        const ft_layer_weights *w = &m->layers[l];
        for (int64_t i = 0; i < 64; i++) assert_true(w->attn_norm[i] == 1.0f && w->ffn_norm[i] == 1.0f);
        for (int q = 0; q < FT_N_PROJ; q++) {
            const ft_linear *li = &w->proj[q];
            if (q <= FT_O) {
                assert_non_null(li->b);
                for (int64_t i = 0; i < li->out_n; i++) assert_true(li->b[i] == 0.0f);
            }
            for (int64_t i = 0; i < li->out_n * li->in_n; i++) {
                ss += (double)li->w[i] * li->w[i];
                cnt++;
            }
        }
    }
    double sd = sqrt(ss / (double)cnt);
    fprintf(stderr, "init-model: weight std %.5f over %lld values (target 0.02)\n", sd, (long long)cnt);
    assert_true(fabs(sd - 0.02) / 0.02 < FT_TOL_INIT_STD_REL);
    /* the same values as the generator gives, in bf16 */
    uint64_t tid = ft_init_tensor_id("model.layers.1.mlp.down_proj.weight");
    for (int64_t i = 0; i < 100; i++)
        assert_true(m->layers[1].proj[FT_DOWN].w[i] == ft_init_normal(77, tid, i, 0.02f));
    ft_model_free(m);
    /* the direct pack == the pack built from the safetensors, byte for byte */
    ft_pack_settings s;
    ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info in;
    assert_int_equal(ft_pack_ensure(out, cache, &s, 0, &in), 0);
    assert_int_equal(in.action, FT_PACK_REUSED); /* the folder's own pack */
    assert_string_equal(in.path, res.pack_path);
    assert_int_equal(ft_pack_ensure(out, cache, &s, 1, &in), 0); /* forced: from the safetensors */
    assert_string_not_equal(in.path, res.pack_path);
    assert_true(files_equal(in.path, res.pack_path));
    /* a pack-only model (no bf16 detour) */
    char out2[700];
    snprintf(out2, sizeof out2, "%s/packonly", dir);
    ft_init_cfg c2 = {cfgp, out2, 77, 0, 0, FT_PACK_QUANT_NF4, NULL};
    assert_int_equal(ft_init_model(&c2, &res), 0);
    ft_pack_file *p;
    assert_int_equal(ft_pack_open(&p, res.pack_path, 1), 0);
    assert_int_equal(ft_pack_config(p)->num_hidden_layers, 3);
    ft_pack_close(p);
    assert_int_equal(ft_pack_ensure(out2, cache, &s, 0, &in), 0);
    assert_int_equal(in.action, FT_PACK_REUSED);
    /* a bad config is refused before anything is written */
    f = fopen(cfgp, "w");
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 64}", f);
    fclose(f);
    char out3[700];
    snprintf(out3, sizeof out3, "%s/bad", dir);
    ft_init_cfg c3 = {cfgp, out3, 1, 0, 1, 0, NULL};
    assert_int_equal(ft_init_model(&c3, &res), FT_E_INVALID);
    assert_int_not_equal(access(out3, F_OK), 0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh64),
        cmocka_unit_test(test_cache_and_corruption),
        cmocka_unit_test(test_layer_weights),
        cmocka_unit_test(test_exec_with_pack),
        cmocka_unit_test(test_init_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
