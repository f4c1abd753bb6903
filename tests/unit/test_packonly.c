/* test_packonly.c - a model folder holding only config.json + the pack (+ tokenizer), as
 * `ftune init-model --pack` writes it (src/model/loader.c, model.h pack_only; the pack
 * checked and read by offload/pack_model.h):
 *   it loads: shapes of every projection, no host weights, the pack's path, the parameter
 *   count of the same model with safetensors, its tokenizer; paths that need host weights
 *   are refused naming the folder;
 *   ft_pack_model_load_globals gives the embeddings/norm/head of the safetensors model bit
 *   for bit, and the CPU executor over the pack then gives the same eval loss, bit for bit,
 *   as the safetensors model with the same pack; on a device backend (cpu-device) the
 *   tied pack-only model's globals come from the pack to the device (the embedding table is
 *   its LM head) and give the bits of the safetensors model's host globals uploaded;
 *   a BF16 pack loads too, NF4 is preferred when both exist;
 *   a corrupted, truncated or foreign pack, and a config.json that disagrees with the
 *   pack, give clear errors naming the file. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/pack.h"
#include "offload/pack_model.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/tools/init_model.h"
#include "src/model/model.h"

#define TINY "tests/fixtures/tiny-llama"

typedef struct fx {
    char *dir;
    char full[600];            /* safetensors + NF4 pack */
    char only[600];            /* config.json + NF4 pack + tokenizer */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    f->dir = t_tmpdir();
    snprintf(f->full, sizeof f->full, "%s/full", f->dir);
    snprintf(f->only, sizeof f->only, "%s/only", f->dir);
    ft_init_cfg a = {TINY "/config.json", f->full, 5, 0, 1, FT_PACK_QUANT_NF4, TINY};
    ft_init_cfg b = {TINY "/config.json", f->only, 5, 0, 0, FT_PACK_QUANT_NF4, TINY};
    ft_init_result res;
    if (ft_init_model(&a, &res) < 0 || ft_init_model(&b, &res) < 0) {
        fprintf(stderr, "setup: %s\n", ft_errmsg());
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f->dir);
    free(f);
    return rc;
}

static int has_file(const char *dir, const char *name)
{
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Copies file `name` from one folder to another. */
static void copy(const char *from, const char *to, const char *name)
{
    char a[800], b[800], *data;
    size_t n;
    snprintf(a, sizeof a, "%s/%s", from, name);
    snprintf(b, sizeof b, "%s/%s", to, name);
    assert_int_equal(ft_read_file(a, &data, &n), 0);
    assert_int_equal(ft_write_file_atomic(b, data, n), 0);
    free(data);
}

/* A new folder under the fixture's with config.json and the NF4 pack of `only`. */
static void clone_only(const fx *f, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", f->dir, name);
    assert_int_equal(ft_mkdir_p(out), 0);
    copy(f->only, out, "config.json");
    copy(f->only, out, FT_PACK_LOCAL_NF4);
}

static void test_load(void **state)
{
    fx *f = *state;
    assert_false(has_file(f->only, "model.safetensors"));
    assert_true(has_file(f->only, FT_PACK_LOCAL_NF4) && has_file(f->only, "tokenizer.json"));
    ft_model *a, *b;
    assert_int_equal(ft_pack_model_load(&a, f->full), 0);
    if (ft_pack_model_load(&b, f->only) < 0) fail_msg("%s", ft_errmsg());
    char want[800];
    snprintf(want, sizeof want, "%s/%s", f->only, FT_PACK_LOCAL_NF4);
    assert_string_equal(b->pack_only, want);
    assert_int_equal(a->pack_only[0], 0);
    assert_true(b->embed == NULL && b->final_norm == NULL && b->lm_head == NULL);
    assert_int_equal(b->cfg.num_hidden_layers, a->cfg.num_hidden_layers);
    for (int64_t l = 0; l < b->cfg.num_hidden_layers; l++) {
        assert_true(b->layers[l].attn_norm == NULL && b->layers[l].ffn_norm == NULL);
        for (int q = 0; q < FT_N_PROJ; q++) {
            const ft_linear *x = &b->layers[l].proj[q], *y = &a->layers[l].proj[q];
            assert_true(x->w == NULL && x->b == NULL);
            assert_true(x->out_n == y->out_n && x->in_n == y->in_n);
        }
    }
    assert_int_equal(ft_model_n_params(b), ft_model_n_params(a));
    assert_int_equal(ft_model_require_weights(a, "generate"), 0);
    assert_int_equal(ft_model_require_weights(b, "generate"), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), f->only));
    assert_non_null(strstr(ft_errmsg(), "pack-only"));
    assert_non_null(strstr(ft_errmsg(), "generate"));
    ft_tokenizer *tok;
    assert_int_equal(ft_model_tokenizer(b, &tok), 0);
    ft_tok_free(tok);
    /* the trainer's pack lookup finds the folder's own pack */
    ft_pack_settings s;
    ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info *in = calloc(1, sizeof *in);
    char cache[700];
    snprintf(cache, sizeof cache, "%s/cache", f->dir);
    assert_int_equal(ft_pack_ensure_loaded(f->only, b, cache, &s, 0, in, NULL, NULL), 0);
    assert_int_equal(in->action, FT_PACK_REUSED);
    assert_string_equal(in->path, want);
    free(in);
    /* a LoRA adapter only needs the shapes */
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 1), 0);
    ft_lora_cfg lc = {4, 8.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 7};
    ft_lora la, lb;
    assert_int_equal(ft_lora_init(&la, a, &lc, be), 0);
    assert_int_equal(ft_lora_init(&lb, b, &lc, be), 0);
    assert_int_equal(la.n_params, lb.n_params);
    ft_lora_free(&la);
    ft_lora_free(&lb);
    ft_backend_free(be);
    ft_model_free(a);
    ft_model_free(b);
}

/* The summed eval loss of bt (S tokens) with model m over the NF4 pack in folder dir: the
 * CPU executor reading the pack (ft_exec_use_pack; with resident, every block copied to host
 * memory by ft_exec_use_pack_ex, called twice: the second call replaces the first copy, which
 * the sanitizer build checks is freed), or on a device backend every layer from the pack's
 * tiers (ft_exec_use_pack_tiers). */
static double pack_eval_ex(ft_backend *be, ft_model *m, const char *dir, const ft_batch *bt,
                           int64_t S, int resident)
{
    char pp[800];
    snprintf(pp, sizeof pp, "%s/%s", dir, FT_PACK_LOCAL_NF4);
    ft_pack_file *p;
    assert_int_equal(ft_pack_open(&p, pp, 1), 0);
    ft_exec ex;
    int64_t nt;
    double loss;
    if (be->ops->host_memory) {
        assert_int_equal(ft_exec_init(&ex, be, m, NULL, S, 1, S), 0);
        if (resident) {
            assert_int_equal(ft_exec_use_pack_ex(&ex, p, 1), 0);
            assert_int_equal(ft_exec_use_pack_ex(&ex, p, 1), 0);
            assert_non_null(ex.pack_host);
        } else {
            assert_int_equal(ft_exec_use_pack(&ex, p), 0);
        }
    } else {
        assert_int_equal(ft_exec_init_ex(&ex, be, m, NULL, S, 1, S, 0), 0);
        if (ft_exec_use_pack_tiers(&ex, p, NULL, 2, 1) < 0) fail_msg("%s", ft_errmsg());
    }
    assert_int_equal(ft_exec_eval(&ex, bt, &loss, &nt), 0);
    assert_int_equal(nt, bt->n_targets);
    ft_exec_free(&ex);
    ft_pack_close(p);
    return loss;
}

static double pack_eval(ft_backend *be, ft_model *m, const char *dir, const ft_batch *bt, int64_t S)
{
    return pack_eval_ex(be, m, dir, bt, S, 0);
}

static void test_globals_and_exec(void **state)
{
    fx *f = *state;
    ft_model *a, *b;
    assert_int_equal(ft_pack_model_load(&a, f->full), 0);
    assert_int_equal(ft_pack_model_load(&b, f->only), 0);
    if (ft_pack_model_load_globals(b) < 0) fail_msg("%s", ft_errmsg());
    const int64_t V = a->cfg.vocab_size, C = a->cfg.hidden_size;
    assert_non_null(b->embed);
    assert_memory_equal(b->embed, a->embed, (size_t)(V * C) * sizeof(float));
    assert_memory_equal(b->final_norm, a->final_norm, (size_t)C * sizeof(float));
    assert_true(b->cfg.tie_word_embeddings && b->lm_head == b->embed);
    const float *e0 = b->embed;
    assert_int_equal(ft_pack_model_load_globals(b), 0); /* loaded once */
    assert_ptr_equal(b->embed, e0);
    /* eval through the CPU executor: safetensors model + its pack == pack-only model +
     * its pack (the same random weights), bit for bit */
    ft_backend *be;
    assert_int_equal(ft_backend_cpu_init(&be, 2), 0);
    const int64_t S = 24;
    ft_batch bt = {1, S, S};
    bt.ids = calloc((size_t)S, 4);
    bt.targets = calloc((size_t)S, 4);
    bt.pos = calloc((size_t)S, 4);
    bt.seq_start = calloc((size_t)S, 4);
    ft_rng r;
    ft_rng_seed(&r, 4);
    for (int64_t t = 0; t < S; t++) {
        bt.ids[t] = (int32_t)(ft_rng_next(&r) % (uint64_t)V);
        bt.pos[t] = (int32_t)t;
    }
    for (int64_t t = 0; t < S; t++) {
        bt.targets[t] = t + 1 < S ? bt.ids[t + 1] : -100;
        bt.n_targets += bt.targets[t] >= 0;
    }
    double loss[2];
    for (int k = 0; k < 2; k++) loss[k] = pack_eval(be, k ? b : a, k ? f->only : f->full, &bt, S);
    fprintf(stderr, "eval loss over the NF4 pack: safetensors model %.6f, pack-only model %.6f\n",
            loss[0] / (double)bt.n_targets, loss[1] / (double)bt.n_targets);
    assert_true(loss[0] == loss[1]);
    assert_true(isfinite(loss[0]) && loss[0] > 0);
    /* the blocks from a resident copy (loaded twice) give the same loss as read from the file */
    assert_true(pack_eval_ex(be, a, f->full, &bt, S, 1) == loss[0]);
    /* a device backend, the layers from the pack's tiers: the tied pack-only model (globals
     * read from the pack into device memory) == the safetensors model (host globals copied) */
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    double dloss[2];
    for (int k = 0; k < 2; k++) {
        ft_model *m = NULL;
        assert_int_equal(ft_pack_model_load(&m, k ? f->only : f->full), 0);
        assert_true(m->cfg.tie_word_embeddings && (k ? m->embed == NULL : m->embed != NULL));
        dloss[k] = pack_eval(dev, m, k ? f->only : f->full, &bt, S);
        ft_model_free(m);
    }
    fprintf(stderr, "cpu-device eval loss over the NF4 pack: host globals %.6f, tied globals "
            "from the pack %.6f\n", dloss[0] / (double)bt.n_targets, dloss[1] / (double)bt.n_targets);
    assert_true(dloss[0] == dloss[1]);
    assert_true(isfinite(dloss[0]) && dloss[0] > 0);
    ft_backend_free(dev);
    free(bt.ids); free(bt.targets); free(bt.pos); free(bt.seq_start);
    ft_backend_free(be);
    ft_model_free(a);
    ft_model_free(b);
}

static void test_bf16_and_preference(void **state)
{
    fx *f = *state;
    char d[700];
    snprintf(d, sizeof d, "%s/bf16", f->dir);
    ft_init_cfg c = {TINY "/config.json", d, 5, 0, 0, FT_PACK_QUANT_BF16, NULL};
    ft_init_result res;
    assert_int_equal(ft_init_model(&c, &res), 0);
    ft_model *m;
    assert_int_equal(ft_pack_model_load(&m, d), 0);
    assert_non_null(strstr(m->pack_only, FT_PACK_LOCAL_BF16));
    assert_int_equal(ft_pack_model_load_globals(m), 0);
    ft_model *ref;
    assert_int_equal(ft_pack_model_load(&ref, f->full), 0);
    assert_memory_equal(m->embed, ref->embed,
                        (size_t)(ref->cfg.vocab_size * ref->cfg.hidden_size) * sizeof(float));
    ft_model_free(ref);
    ft_model_free(m);
    copy(f->only, d, FT_PACK_LOCAL_NF4); /* both: NF4 is taken */
    assert_int_equal(ft_pack_model_load(&m, d), 0);
    assert_non_null(strstr(m->pack_only, FT_PACK_LOCAL_NF4));
    ft_model_free(m);
}

/* ft_pack_model_load of `dir` fails with code `rc`, its message naming the folder and `needle`. */
static void expect_fail(const char *dir, int rc, const char *needle)
{
    ft_model *m = NULL;
    int got = ft_pack_model_load(&m, dir);
    if (got != rc) fail_msg("%s: expected %d, got %d (%s)", dir, rc, got, ft_errmsg());
    assert_null(m);
    const char *msg = ft_errmsg();
    fprintf(stderr, "  %s\n", msg);
    assert_non_null(strstr(msg, dir));
    if (needle && !strstr(msg, needle)) fail_msg("'%s' not in: %s", needle, msg);
}

static void test_bad_packs(void **state)
{
    fx *f = *state;
    char d[700], pp[800];
    /* a header byte changed (n_layers): the header checksum fails, naming the pack */
    clone_only(f, "hdr", d, sizeof d);
    snprintf(pp, sizeof pp, "%s/%s", d, FT_PACK_LOCAL_NF4);
    int fd = open(pp, O_RDWR);
    assert_true(fd >= 0);
    uint32_t v = 7;
    assert_int_equal(pwrite(fd, &v, 4, (off_t)offsetof(ft_pack_hdr, n_layers)), 4);
    close(fd);
    expect_fail(d, FT_E_CORRUPT, pp);
    assert_non_null(strstr(ft_errmsg(), "header checksum"));
    assert_non_null(strstr(ft_errmsg(), "pack-only"));
    /* bad magic */
    clone_only(f, "magic", d, sizeof d);
    snprintf(pp, sizeof pp, "%s/%s", d, FT_PACK_LOCAL_NF4);
    fd = open(pp, O_RDWR);
    assert_int_equal(pwrite(fd, "NOTAPACK", 8, 0), 8);
    close(fd);
    expect_fail(d, FT_E_CORRUPT, "not an ftune pack");
    /* truncated */
    clone_only(f, "trunc", d, sizeof d);
    snprintf(pp, sizeof pp, "%s/%s", d, FT_PACK_LOCAL_NF4);
    struct stat sb;
    assert_int_equal(stat(pp, &sb), 0);
    assert_int_equal(truncate(pp, sb.st_size - 4096), 0);
    expect_fail(d, FT_E_CORRUPT, pp);
    /* config.json disagrees with the pack's stored config */
    clone_only(f, "cfg", d, sizeof d);
    char cp[800], *js;
    size_t n;
    snprintf(cp, sizeof cp, "%s/config.json", d);
    assert_int_equal(ft_read_file(cp, &js, &n), 0);
    char *at = strstr(js, "\"num_hidden_layers\": 2");
    assert_non_null(at);
    at[strlen("\"num_hidden_layers\": ")] = '3';
    assert_int_equal(ft_write_file_atomic(cp, js, n), 0);
    free(js);
    expect_fail(d, FT_E_INVALID, "num_hidden_layers 3 in config.json, 2 in the pack");
    /* neither safetensors nor a pack */
    snprintf(d, sizeof d, "%s/empty", f->dir);
    assert_int_equal(ft_mkdir_p(d), 0);
    copy(f->only, d, "config.json");
    ft_model *m = NULL;
    assert_true(ft_pack_model_load(&m, d) < 0);
    assert_null(m);
    assert_non_null(strstr(ft_errmsg(), d));
}

/* A pack-only llama with attention_bias (q/k/v/o biases in its pack, none on the host): on
 * a device backend (cpu-device) its layers bind with their biases and evaluate; a block whose
 * directory lacks the q bias is refused naming the pack, since the config says q has one
 * (offload/tiers.c bind_block decides from the config, as the pack builder does: the
 * model's bias pointers are NULL here). The pack file's own directory is checked against
 * the config when read (ft_pack_block_dir), so the executor's copy of layer 0's directory
 * is edited instead: its q bias record relabelled as a k norm, which this model lacks. */
static void test_bias_from_config(void **state)
{
    fx *f = *state;
    char cfgp[700], dir[700], pp[800];
    snprintf(cfgp, sizeof cfgp, "%s/bias_config.json", f->dir);
    snprintf(dir, sizeof dir, "%s/bias", f->dir);
    FILE *in = fopen(TINY "/config.json", "rb");
    assert_non_null(in);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[n] = 0;
    char *at = strstr(text, "\"attention_bias\": false");
    assert_non_null(at);
    FILE *out = fopen(cfgp, "wb");
    assert_non_null(out);
    fprintf(out, "%.*s\"attention_bias\": true%s", (int)(at - text), text,
            at + strlen("\"attention_bias\": false"));
    fclose(out);
    ft_init_cfg ic = {cfgp, dir, 5, 0, 0, FT_PACK_QUANT_NF4, TINY};
    ft_init_result res;
    if (ft_init_model(&ic, &res) < 0) fail_msg("%s", ft_errmsg());
    ft_model *m;
    if (ft_pack_model_load(&m, dir) < 0) fail_msg("%s", ft_errmsg());
    assert_true(m->cfg.attention_bias && m->layers[0].proj[FT_Q].b == NULL);

    const int64_t S = 16, V = m->cfg.vocab_size;
    ft_batch bt = {1, S, S};
    bt.ids = calloc((size_t)S, 4);
    bt.targets = calloc((size_t)S, 4);
    bt.pos = calloc((size_t)S, 4);
    bt.seq_start = calloc((size_t)S, 4);
    for (int64_t t = 0; t < S; t++) {
        bt.ids[t] = (int32_t)((t * 7919 + 11) % V);
        bt.pos[t] = (int32_t)t;
    }
    for (int64_t t = 0; t < S; t++) {
        bt.targets[t] = t + 1 < S ? bt.ids[t + 1] : -100;
        bt.n_targets += bt.targets[t] >= 0;
    }
    ft_backend *dev;
    assert_int_equal(ft_backend_cpu_device_init(&dev, 2), 0);
    snprintf(pp, sizeof pp, "%s/%s", dir, FT_PACK_LOCAL_NF4);
    ft_pack_file *p;
    assert_int_equal(ft_pack_open(&p, pp, 1), 0);
    ft_exec ex;
    assert_int_equal(ft_exec_init_ex(&ex, dev, m, NULL, S, 1, S, 0), 0);
    if (ft_exec_use_pack_tiers(&ex, p, NULL, 2, 1) < 0) fail_msg("%s", ft_errmsg());
    double loss;
    int64_t nt;
    if (ft_exec_eval(&ex, &bt, &loss, &nt) < 0) fail_msg("%s", ft_errmsg());
    assert_true(isfinite(loss) && nt == bt.n_targets);
    int found = 0;
    for (int64_t i = 0; i < ex.pack_dir_n[0]; i++)
        if (ex.pack_dir[0][i].role == FT_PACK_ROLE_B0 + FT_Q) {
            ex.pack_dir[0][i].role = FT_PACK_ROLE_K_NORM;
            found = 1;
        }
    assert_true(found);
    int rc = ft_exec_eval(&ex, &bt, &loss, &nt);
    fprintf(stderr, "  layer 0 without its q bias: %s\n", ft_errmsg());
    assert_int_equal(rc, FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), "lacks a norm, projection or bias"));
    assert_non_null(strstr(ft_errmsg(), pp));
    ft_exec_free(&ex);
    ft_pack_close(p);
    ft_backend_free(dev);
    free(bt.ids); free(bt.targets); free(bt.pos); free(bt.seq_start);
    ft_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_globals_and_exec),
        cmocka_unit_test(test_bf16_and_preference),
        cmocka_unit_test(test_bad_packs),
        cmocka_unit_test(test_bias_from_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
