/* test_pack.c - the pack file (offload/pack*.c), the executor's packed base
 * (ft_exec_use_pack) and init-model (src/tools/init_model.c):
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
 *   byte-identical to the pack built from those safetensors;
 *   the builder's output does not depend on the thread count, the chunk size, a concurrent
 *   or serial source, nor (init-model) the generator's SIMD kernel; the parallel exact sum
 *   equals ft_nf4_fsum;
 *   ft_pack_read_global / ft_pack_global_info: row ranges of the embeddings, final norm and
 *   LM head equal the bf16 safetensors values widened, tied head and bad ranges refused;
 *   GGUF models: a pack streamed from the file (ft_gguf_hf_rows) is byte-identical to the
 *   one built from the loaded model, whose weights the row reads give bit for bit; a
 *   deferred load (ft_model_load_deferred) has the shapes and no weights until
 *   ft_model_load_weights, and ft_pack_model_use turns a model into a pack-only one;
 *   a pack not built yet (`ftune plan`): ft_pack_layout's sizes are the built pack's (llama,
 *   biases, qwen2, qwen3, NF4/bf16, pre-quantized sources), partial packs hold the whole
 *   pack's first blocks, and ft_pack_preview_make leaves nothing in the cache folder. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <float.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "src/model/lora.h"
#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "kernels/kernels.h"
#include "offload/pack.h"
#include "offload/pack_model.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/formats/gguf.h"
#include "src/tools/init_model.h"
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
        assert_true(ft_xxh64(v[i].s, strlen(v[i].s), 0) == v[i].h);
    uint8_t buf[1000];
    ft_rng r;
    ft_rng_seed(&r, 1);
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)ft_rng_next(&r);
    uint64_t one = ft_xxh64(buf, sizeof buf, 7);
    for (int t = 0; t < 50; t++) {
        ft_xxh64_state h;
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
    assert_int_equal(t_rmtree(dir), 0);
}

/* The verification stamp: none for a pack changed within the settle time; then a full
 * verification writes one, the next start trusts it (no checksum pass), and a changed byte
 * (also with its mtime put back: the ctime still moves) is verified, detected and rebuilt. */
static void test_verify_stamp(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    ft_pack_settings s;
    ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info a, b;
    char stamp[4300];
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &a), 0);
    snprintf(stamp, sizeof stamp, "%s.verified", a.path);
    assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
    assert_int_equal(b.action, FT_PACK_REUSED);
    assert_int_equal(b.verified, 1);
    assert_int_not_equal(access(stamp, F_OK), 0); /* written < 2 s ago: racy, no stamp */
    ft_pack_file *p;
    assert_int_equal(ft_pack_open(&p, a.path, 1), 0);
    int64_t l1 = (int64_t)ft_pack_header(p)->header_bytes + (int64_t)ft_pack_block_bytes(p, 0);
    ft_pack_close(p);
    for (int restore_mtime = 0; restore_mtime < 2; restore_mtime++) {
        sleep(3);
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
        assert_int_equal(b.action, FT_PACK_REUSED);
        assert_int_equal(b.verified, 1);
        assert_int_equal(access(stamp, F_OK), 0);
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
        assert_int_equal(b.action, FT_PACK_REUSED);
        assert_int_equal(b.verified, 0); /* trusted: no checksum pass */
        struct stat st;
        assert_int_equal(stat(a.path, &st), 0);
        flip_byte(a.path, l1 + 3000);
        if (restore_mtime) {
            struct timespec t[2] = {st.st_atim, st.st_mtim};
            assert_int_equal(utimensat(AT_FDCWD, a.path, t, 0), 0);
        }
        assert_int_equal(ft_pack_ensure(TINY, dir, &s, 0, &b), 0);
        assert_int_equal(b.action, FT_PACK_REBUILT);
        assert_non_null(strstr(b.reason, "checksum"));
        assert_int_not_equal(access(stamp, F_OK), 0); /* removed with the rebuild */
    }
    assert_int_equal(t_rmtree(dir), 0);
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
        if (quant == FT_PACK_QUANT_NF4) {
            /* the in-place binding (generation's decode on the CPU): projections of a fusable
             * shape stay NF4, pointing into the block, and dequantize to the fp32 values; the
             * others (tiny-llama's 32 x 64 k/v) and the norms come as fp32 */
            const int64_t L = c->num_hidden_layers;
            assert_int_equal(ft_pack_read_block(p, L - 1, buf, n, 1), 0);
            ft_layer_weights w, wf;
            ft_nf4_tensor t[FT_N_PROJ];
            float *f32 = aligned_alloc(64, (size_t)ft_pack_layer_floats(c) * 4);
            assert_int_equal(ft_pack_layer_weights(p, L - 1, buf, f32, &wf), 0);
            assert_int_equal(ft_pack_layer_weights_nf4(p, L - 1, buf, w32, &w, t), 0);
            assert_memory_equal(w.attn_norm, wf.attn_norm, (size_t)c->hidden_size * 4);
            int n_nf4 = 0;
            for (int q = 0; q < FT_N_PROJ; q++) {
                const ft_linear *a = &w.proj[q];
                int64_t e = a->out_n * a->in_n;
                int fus = ft_nf4_fusable(a->out_n, a->in_n, 64, 256);
                assert_int_equal(a->wtype, fus ? FT_WTYPE_NF4 : FT_WTYPE_F32);
                if (!fus) {
                    assert_memory_equal(a->w, wf.proj[q].w, (size_t)e * 4);
                    continue;
                }
                n_nf4++;
                assert_ptr_equal(a->nf4, &t[q]);
                assert_null(a->w);
                assert_true(t[q].codes > (const uint8_t *)buf && t[q].codes < (const uint8_t *)buf + n);
                ft_nf4_view v = {{0}, t[q].codes, t[q].qabsmax, t[q].absmax, t[q].nested_absmax,
                                 t[q].nested_map, t[q].code, t[q].offset};
                assert_int_equal(ft_nf4_layout_init(&v.lay, t[q].n, t[q].blocksize, t[q].nested_blocksize), 0);
                float *dq = malloc((size_t)e * 4);
                assert_int_equal(ft_nf4_dequant(&v, dq), 0);
                assert_memory_equal(dq, wf.proj[q].w, (size_t)e * 4);
                free(dq);
            }
            assert_int_equal(n_nf4, 5); /* q, o, gate, up, down */
            /* a record whose float arrays are misaligned is refused (check_record's 4-byte
             * rule: they are read in place through float pointers) */
            const ft_pack_tensor *dir;
            int64_t nd;
            assert_int_equal(ft_pack_block_dir(p, L - 1, buf, &dir, &nd), 0);
            for (int64_t i = 0; i < nd; i++)
                if (dir[i].dtype == FT_PACK_DT_NF4) {
                    ((ft_pack_tensor *)buf)[i].code_off += 2;
                    break;
                }
            assert_int_equal(ft_pack_layer_weights_nf4(p, L - 1, buf, w32, &w, t), FT_E_CORRUPT);
            assert_int_equal(ft_pack_layer_weights(p, L - 1, buf, w32, &w), FT_E_CORRUPT);
            free(f32);
        }
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
    assert_int_equal(t_rmtree(dir), 0);
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
    assert_int_equal(t_rmtree(dir), 0);
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
    assert_int_equal(t_rmtree(dir), 0);
}


/* Writes a config.json text under dir; returns its path in out. */
static void write_cfg(char *out, size_t n, const char *dir, const char *name, const char *js)
{
    snprintf(out, n, "%s/%s", dir, name);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fputs(js, f);
    fclose(f);
}

static const char *k_untied_js =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"vocab_size\": 500, \"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-5}";
static const char *k_tied_js =
    "{\"model_type\": \"llama\", \"hidden_size\": 48, \"intermediate_size\": 80, "
    "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
    "\"vocab_size\": 333, \"tie_word_embeddings\": true, \"rms_norm_eps\": 1e-5}";

static void test_read_global(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), cfgp[600], out[600];
    for (int tied = 0; tied < 2; tied++)
        for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
            write_cfg(cfgp, sizeof cfgp, dir, "arch.json", tied ? k_tied_js : k_untied_js);
            snprintf(out, sizeof out, "%s/m%d%d", dir, tied, quant);
            ft_init_cfg c = {cfgp, out, 5, 0, 1, quant, NULL};
            ft_init_result res;
            assert_int_equal(ft_init_model(&c, &res), 0);
            ft_model *m; /* the reference: the bf16 safetensors through the loader */
            assert_int_equal(ft_model_load(&m, out), 0);
            assert_int_equal(m->pack_only[0], 0);
            const int64_t V = m->cfg.vocab_size, C = m->cfg.hidden_size;
            ft_pack_file *p;
            assert_int_equal(ft_pack_open(&p, res.pack_path, 1), 0);
            int64_t rows, cols;
            int present;
            assert_int_equal(ft_pack_global_info(p, FT_PACK_ROLE_EMBED, &rows, &cols, &present), 0);
            assert_true(rows == V && cols == C && present == 1);
            assert_int_equal(ft_pack_global_info(p, FT_PACK_ROLE_FINAL_NORM, &rows, &cols, &present), 0);
            assert_true(rows == C && cols == 1 && present == 1);
            assert_int_equal(ft_pack_global_info(p, FT_PACK_ROLE_LM_HEAD, &rows, &cols, &present), 0);
            assert_true(rows == V && cols == C && present == !tied);
            assert_int_equal(ft_pack_global_info(p, FT_PACK_ROLE_W0, &rows, &cols, &present), FT_E_INVALID);
            float *buf = malloc((size_t)(V * C) * sizeof *buf);
            /* row ranges: all, the first, the last, one in the middle, empty */
            const int64_t rng[][2] = {{0, V}, {0, 1}, {V - 1, 1}, {V / 3, V / 4}, {7, 0}};
            for (int head = 0; head < 2; head++) {
                int role = head ? FT_PACK_ROLE_LM_HEAD : FT_PACK_ROLE_EMBED;
                const float *ref = head ? m->lm_head : m->embed;
                if (head && tied) {
                    assert_int_equal(ft_pack_read_global(p, role, 0, 1, buf), FT_E_INVALID);
                    assert_non_null(strstr(ft_errmsg(), "tied: use EMBED"));
                    int32_t one = 0;
                    assert_int_equal(ft_pack_gather_global(p, role, &one, 1, buf), FT_E_INVALID);
                    continue;
                }
                for (size_t k = 0; k < sizeof rng / sizeof rng[0]; k++) {
                    memset(buf, 0x7f, (size_t)(V * C) * sizeof *buf);
                    assert_int_equal(ft_pack_read_global(p, role, rng[k][0], rng[k][1], buf), 0);
                    assert_memory_equal(buf, ref + rng[k][0] * C, (size_t)(rng[k][1] * C) * sizeof *buf);
                    if (rng[k][1] * C < V * C) { /* nothing written past the range */
                        uint32_t u;
                        memcpy(&u, &buf[rng[k][1] * C], 4);
                        assert_true(u == 0x7f7f7f7fu);
                    }
                }
                /* a gather of token rows (repeats, any order; > 64 rows: the parallel path) */
                int32_t ids[100];
                for (int i = 0; i < 100; i++) ids[i] = (int32_t)((i * 7919 + head) % V);
                assert_int_equal(ft_pack_gather_global(p, role, ids, 100, buf), 0);
                for (int i = 0; i < 100; i++)
                    assert_memory_equal(buf + i * C, ref + ids[i] * C, (size_t)C * sizeof *buf);
                ids[50] = (int32_t)V;
                assert_int_equal(ft_pack_gather_global(p, role, ids, 100, buf), FT_E_RANGE);
                assert_non_null(strstr(ft_errmsg(), "index 50"));
                assert_int_equal(ft_pack_read_global(p, role, V, 1, buf), FT_E_RANGE);
                assert_non_null(strstr(ft_errmsg(), res.pack_path));
                assert_int_equal(ft_pack_read_global(p, role, -1, 2, buf), FT_E_RANGE);
                assert_int_equal(ft_pack_read_global(p, role, 3, V, buf), FT_E_RANGE);
            }
            assert_int_equal(ft_pack_read_global(p, FT_PACK_ROLE_FINAL_NORM, 0, C, buf), 0);
            assert_memory_equal(buf, m->final_norm, (size_t)C * sizeof *buf);
            assert_int_equal(ft_pack_read_global(p, FT_PACK_ROLE_FINAL_NORM, C - 2, 3, buf), FT_E_RANGE);
            ft_pack_close(p);
            /* a corrupt global directory is refused: the final norm's record (the second)
             * made a consistent BF16 record of 2C bytes, which fits its block but is not the
             * format's F32; then the embedding record's row count */
            {
                ft_pack_file *q;
                assert_int_equal(ft_pack_open(&q, res.pack_path, 0), 0);
                int64_t off = (int64_t)(ft_pack_header(q)->header_bytes);
                for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) off += (int64_t)ft_pack_block_bytes(q, l);
                ft_pack_close(q);
                const int64_t norm = off + (int64_t)sizeof(ft_pack_tensor);
                ft_pack_tensor r0, r1;
                int fd = open(res.pack_path, O_RDONLY);
                assert_true(fd >= 0 && pread(fd, &r0, sizeof r0, norm) == (ssize_t)sizeof r0);
                close(fd);
                assert_int_equal(r0.role, FT_PACK_ROLE_FINAL_NORM);
                r1 = r0;
                r1.dtype = FT_PACK_DT_BF16;
                r1.data_bytes = 2 * C;
                poke(res.pack_path, norm, &r1, sizeof r1);
                assert_int_equal(ft_pack_open(&q, res.pack_path, 0), 0); /* checksums not read */
                assert_int_equal(ft_pack_read_global(q, FT_PACK_ROLE_FINAL_NORM, 0, C, buf), FT_E_CORRUPT);
                assert_non_null(strstr(ft_errmsg(), "where the format stores F32"));
                ft_pack_close(q);
                poke(res.pack_path, norm, &r0, sizeof r0);
                assert_int_equal(ft_pack_open(&q, res.pack_path, 1), 0); /* whole again */
                ft_pack_close(q);
                int64_t bad = V + 1;
                poke(res.pack_path, off + (int64_t)offsetof(ft_pack_tensor, rows), &bad, sizeof bad);
            }
            assert_int_equal(ft_pack_open(&p, res.pack_path, 0), 0); /* checksums not read */
            assert_int_equal(ft_pack_read_global(p, FT_PACK_ROLE_EMBED, 0, 1, buf), FT_E_CORRUPT);
            assert_non_null(strstr(ft_errmsg(), res.pack_path));
            ft_pack_close(p);
            free(buf);
            ft_model_free(m);
        }
    assert_int_equal(t_rmtree(dir), 0);
}

/* A pure source for the builder: value of (layer, role, element) from a hash, with a few
 * zero rows (all-zero NF4 blocks) and a wide spread of magnitudes. */
typedef struct hsrc { const ft_model_config *c; } hsrc;

static int hsrc_read(void *user, int64_t l, int role, int64_t row0, int64_t n_rows, int64_t cols,
                     float *dst)
{
    (void)user;
    for (int64_t i = 0; i < n_rows * cols; i++) {
        int64_t e = row0 * cols + i;
        uint64_t x = (uint64_t)(l + 2) * 0x9E3779B97F4A7C15ull ^ (uint64_t)role << 40 ^ (uint64_t)e;
        uint64_t h = ft_splitmix64(&x);
        float v = ((float)(h >> 40) / 16777216.0f - 0.5f) * ldexpf(1.0f, (int)(h & 15) - 8);
        dst[i] = (e / cols) % 17 == 5 ? 0.0f : v;
    }
    return 0;
}

/* What ft_pack_build takes for the architecture k_untied_js (written as dir/arch.json): its
 * config, its JSON text (free js) and the source hsrc_read. */
typedef struct arch_build {
    ft_model_config cfg;
    char *js;
    size_t len;
    hsrc h;
    ft_pack_src src;
} arch_build;

static void arch_build_init(arch_build *a, const char *dir)
{
    char cfgp[600];
    write_cfg(cfgp, sizeof cfgp, dir, "arch.json", k_untied_js);
    assert_int_equal(ft_config_load(&a->cfg, cfgp), 0);
    assert_int_equal(ft_read_file(cfgp, &a->js, &a->len), 0);
    a->h = (hsrc){&a->cfg};
    a->src = (ft_pack_src){&a->h, hsrc_read, NULL, NULL};
}

static void test_build_invariance(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), path[700], ref[700];
    arch_build a;
    arch_build_init(&a, dir);
    int saved = omp_get_max_threads();
    for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
        ft_pack_settings s;
        ft_pack_settings_default(&s, quant);
        snprintf(ref, sizeof ref, "%s/ref%d.ftpack", dir, quant);
        ft_pack_stats st;
        omp_set_num_threads(1);
        assert_int_equal(ft_pack_build(ref, &a.cfg, a.js, a.len, 1, &s, &a.src, &st), 0);
        /* serial/concurrent source x 1/2/3 threads x chunk sizes (64 = one NF4 block; 1000
         * rows of 64 floats: not a multiple of any row count) x the global block written in
         * one piece or in 4096/12288-byte pieces (its rows straddle them) x buffered or
         * O_DIRECT writes */
        const struct { int conc, threads; int64_t chunk, stream; int direct; } v[] = {
            {0, 2, 0, 0, 0}, {1, 1, 0, 0, 0}, {1, 2, 0, 0, 0}, {1, 2, 64, 0, 0}, {1, 3, 1000, 0, 0},
            {1, 2, 96 * 64 + 64, 0, 0}, {0, 2, 0, 4096, 0}, {1, 2, 0, 4096, 1}, {1, 3, 1000, 12000, 1},
            {0, 1, 0, 0, 1}};
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
            omp_set_num_threads(v[k].threads);
            ft_pack_build_opts o = {v[k].conc, v[k].chunk, v[k].stream, v[k].direct};
            snprintf(path, sizeof path, "%s/v%zu.ftpack", dir, k);
            assert_int_equal(ft_pack_build_ex(path, &a.cfg, a.js, a.len, 1, &s, &a.src, &o, &st), 0);
            if (!files_equal(ref, path))
                fail_msg("quant %d: variant %zu (concurrent %d, %d threads, chunk %lld, stream %lld, "
                         "direct %d) differs", quant, k, v[k].conc, v[k].threads,
                         (long long)v[k].chunk, (long long)v[k].stream, v[k].direct);
            ft_pack_file *p;
            assert_int_equal(ft_pack_open(&p, path, 1), 0);
            ft_pack_close(p);
        }
    }
    omp_set_num_threads(saved);
    free(a.js);
    assert_int_equal(t_rmtree(dir), 0);
}


/* GGUF models (llama with the q/k permutation, qwen2 with biases, llama3 rope): the streamed
 * pack equals the loaded model's pack byte for byte; ft_gguf_hf_rows gives the loaded
 * weights' rows bit for bit (permuted rows included); deferred loading and use_pack. */
static void test_gguf_stream(void **state)
{
    (void)state;
    static const char *const models[] = {"tests/fixtures/gguf/tiny-llama.gguf",
                                         "tests/fixtures/gguf/qwen2-tiny.gguf",
                                         "tests/fixtures/gguf/rope-llama3.gguf"};
    char *dir = t_tmpdir(), da[700], db[700];
    assert_non_null(dir);
    uint64_t x = 7;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        ft_model *m = NULL, *d = NULL;
        assert_int_equal(ft_model_load(&m, models[mi]), 0);
        const ft_model_config *c = &m->cfg;
        /* rows of every tensor of layer 0 (and the globals) against the loaded weights */
        ft_gguf *g;
        assert_int_equal(ft_gguf_open(&g, models[mi]), 0);
        char name[256];
        int n_perm = 0;
        for (int p = 0; p < FT_N_PROJ + 3; p++) {
            const float *want;
            int64_t rows, cols;
            if (p < FT_N_PROJ) {
                const ft_linear *li = &m->layers[0].proj[p];
                snprintf(name, sizeof name, "model.layers.0.%s.%s.weight", ft_proj_parent[p], ft_proj_name[p]);
                want = li->w, rows = li->out_n, cols = li->in_n;
            } else if (p == FT_N_PROJ) {
                snprintf(name, sizeof name, "model.embed_tokens.weight");
                want = m->embed, rows = c->vocab_size, cols = c->hidden_size;
            } else if (p == FT_N_PROJ + 1) {
                snprintf(name, sizeof name, "model.layers.0.input_layernorm.weight");
                want = m->layers[0].attn_norm, rows = c->hidden_size, cols = 1;
            } else {
                if (!m->layers[0].proj[FT_Q].b) continue;
                snprintf(name, sizeof name, "model.layers.0.self_attn.q_proj.bias");
                want = m->layers[0].proj[FT_Q].b, rows = m->layers[0].proj[FT_Q].out_n, cols = 1;
            }
            int perm;
            assert_non_null(ft_gguf_hf_tensor(g, name, &perm));
            n_perm += perm;
            for (int k = 0; k < 4; k++) { /* whole, then random row ranges */
                int64_t r0 = k ? (int64_t)(ft_splitmix64(&x) % (uint64_t)rows) : 0;
                int64_t n = k ? 1 + (int64_t)(ft_splitmix64(&x) % (uint64_t)(rows - r0)) : rows;
                float *got = malloc((size_t)(n * cols) * sizeof *got);
                assert_non_null(got);
                assert_int_equal(ft_gguf_hf_rows(g, c, name, r0, n, cols, got), 0);
                if (memcmp(got, want + r0 * cols, (size_t)(n * cols) * sizeof *got))
                    fail_msg("%s: %s rows [%lld, %lld) differ from the loaded model's", models[mi],
                             name, (long long)r0, (long long)(r0 + n));
                free(got);
            }
            float one;
            assert_int_equal(ft_gguf_hf_rows(g, c, name, rows, 1, cols, &one), FT_E_INVALID);
        }
        print_message("%s: layer 0 and globals read by rows as loaded (%d permuted tensors)\n",
                      models[mi], n_perm);
        float v1;
        assert_int_equal(ft_gguf_hf_rows(g, c, "model.layers.0.mlp.nope.weight", 0, 1, 1, &v1), FT_E_INVALID);
        ft_gguf_close(g);
        /* the streamed pack == the loaded model's pack, both quantizations */
        for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
            ft_pack_settings s;
            ft_pack_settings_default(&s, quant);
            ft_pack_ensure_info ia, ib;
            snprintf(da, sizeof da, "%s/a%zu", dir, mi);
            snprintf(db, sizeof db, "%s/b%zu", dir, mi);
            assert_int_equal(ft_pack_ensure_loaded(models[mi], m, da, &s, 1, &ia, NULL, NULL), 0);
            assert_int_equal(ft_pack_ensure_loaded(models[mi], NULL, db, &s, 1, &ib, NULL, NULL), 0);
            if (!files_equal(ia.path, ib.path))
                fail_msg("%s quant %d: the streamed pack differs from the loaded model's", models[mi], quant);
        }
        /* deferred: shapes, no weights, the same parameter count; then the weights as loaded */
        assert_int_equal(ft_model_load_deferred(&d, models[mi]), 0);
        assert_true(ft_model_deferred(d) && !d->embed && !d->layers[0].proj[FT_Q].w && !d->layers[0].attn_norm);
        assert_int_equal(d->layers[0].proj[FT_DOWN].in_n, c->intermediate_size);
        assert_int_equal(ft_model_n_params(d), ft_model_n_params(m));
        assert_int_equal(ft_model_load_weights(d), 0);
        assert_false(ft_model_deferred(d));
        const ft_linear *a = &m->layers[0].proj[FT_K], *b = &d->layers[0].proj[FT_K];
        assert_memory_equal(a->w, b->w, (size_t)(a->out_n * a->in_n) * sizeof(float));
        assert_memory_equal(m->embed, d->embed, (size_t)(c->vocab_size * c->hidden_size) * sizeof(float));
        /* handed to the pack: pack-only, no host weights */
        ft_pack_ensure_info ib;
        ft_pack_settings s;
        ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
        assert_int_equal(ft_pack_ensure_loaded(models[mi], NULL, db, &s, 0, &ib, NULL, NULL), 0);
        assert_int_equal(ib.action, FT_PACK_REUSED);
        assert_int_equal(ft_pack_model_use(d, ib.path), 0);
        assert_true(d->pack_only[0] && !d->embed && !d->layers[0].proj[FT_K].w);
        assert_int_equal(ft_model_n_params(d), ft_model_n_params(m));
        ft_model_free(d);
        ft_model_free(m);
    }
    /* a safetensors folder deferred: the same */
    ft_model *m = NULL, *d = NULL;
    assert_int_equal(ft_model_load(&m, TINY), 0);
    assert_int_equal(ft_model_load_deferred(&d, TINY), 0);
    assert_true(ft_model_deferred(d) && !d->embed && !d->final_norm && !d->layers[1].proj[FT_UP].w);
    assert_int_equal(ft_model_n_params(d), ft_model_n_params(m));
    assert_int_equal(ft_model_load_weights(d), 0);
    const ft_linear *a = &m->layers[1].proj[FT_UP], *b = &d->layers[1].proj[FT_UP];
    assert_memory_equal(a->w, b->w, (size_t)(a->out_n * a->in_n) * sizeof(float));
    ft_model_free(d);
    ft_model_free(m);
    assert_int_equal(t_rmtree(dir), 0);
}

/* A write failing in the writer thread (file size limit: EFBIG, as a full disk would give
 * ENOSPC) comes back as the build's error with the offset; nothing is left behind. */
static void test_build_write_error(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), path[700];
    arch_build a;
    arch_build_init(&a, dir);
    ft_pack_settings s;
    ft_pack_settings_default(&s, FT_PACK_QUANT_BF16);
    snprintf(path, sizeof path, "%s/p.ftpack", dir);
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit was, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    /* limits inside the first layer block, the second, and the global block */
    const rlim_t at[] = {10000, 100000, 200000};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++)
        for (int conc = 0; conc < 2; conc++) { /* concurrent source with O_DIRECT writes */
            lim = was;
            lim.rlim_cur = at[k];
            assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
            ft_pack_build_opts o = {conc, 0, 4096, conc};
            ft_pack_stats st;
            int rc = ft_pack_build_ex(path, &a.cfg, a.js, a.len, 1, &s, &a.src, &o, &st);
            assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
            fprintf(stderr, "limit %llu: %s\n", (unsigned long long)at[k], ft_errmsg());
            assert_int_equal(rc, -EFBIG);
            assert_non_null(strstr(ft_errmsg(), "write failed at offset"));
            assert_int_not_equal(access(path, F_OK), 0);
        }
    signal(SIGXFSZ, old);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp", dir);
    assert_int_not_equal(system(cmd), 0); /* no temporary file left (grep finds none: 1) */
    free(a.js);
    assert_int_equal(t_rmtree(dir), 0);
}

static void test_init_invariance(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), cfgp[600], out[700], ref[4200], path[4200];
    write_cfg(cfgp, sizeof cfgp, dir, "arch.json", k_untied_js);
    int saved = omp_get_max_threads();
    int best = ft_init_set_simd(0);
    assert_true(best >= 1 && best <= 3);
    fprintf(stderr, "init-model: best SIMD level %d\n", best);
    for (int k = 0; k < 2 + best; k++) {
        /* k 0, 1: 1 and 2 threads at the best level; then each level on 2 threads */
        int threads = k == 0 ? 1 : 2, level = k < 2 ? best : k - 1;
        omp_set_num_threads(threads);
        assert_int_equal(ft_init_set_simd(level), level);
        snprintf(out, sizeof out, "%s/m%d", dir, k);
        ft_init_cfg c = {cfgp, out, 11, 0, 0, FT_PACK_QUANT_NF4, NULL};
        ft_init_result res;
        assert_int_equal(ft_init_model(&c, &res), 0);
        snprintf(path, sizeof path, "%s", res.pack_path);
        if (k == 0) snprintf(ref, sizeof ref, "%s", path);
        else if (!files_equal(ref, path))
            fail_msg("init-model pack with %d threads at SIMD level %d differs from 1 thread at %d",
                     threads, level, best);
        /* the generator's values: each level gives the same bits, element by element */
        uint64_t tid = ft_init_tensor_id("model.layers.1.mlp.up_proj.weight");
        static float first[70];
        for (int64_t i = 0; i < 70; i++) {
            float x = ft_init_normal(11, tid, i * 37 + 5, 0.02f);
            if (k == 0) first[i] = x;
            else assert_true(memcmp(&x, &first[i], 4) == 0);
        }
    }
    assert_int_equal(ft_init_set_simd(9), FT_E_INVALID);
    ft_init_set_simd(0);
    omp_set_num_threads(saved);
    /* the generator's distribution over 2^20 values: mean 0, std 1, kurtosis 3, tails */
    const int64_t n = (int64_t)1 << 20;
    double s1 = 0, s2 = 0, s4 = 0;
    int64_t beyond3 = 0;
    uint64_t tid = ft_init_tensor_id("x");
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i += 4096)
        for (int64_t j = 0; j < 4096; j++) v[i + j] = ft_init_normal(3, tid, i + j, 1.0f);
    for (int64_t i = 0; i < n; i++) {
        double x = v[i];
        s1 += x;
        s2 += x * x;
        s4 += x * x * x * x;
        beyond3 += fabs(x) > 3;
    }
    double mean = s1 / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
    fprintf(stderr, "init-model: N(0,1) sample: mean %.5f var %.5f kurtosis %.4f P(|x|>3) %.5f\n",
            mean, var, kurt, (double)beyond3 / n);
    /* 5+ standard errors: mean 1/sqrt(n) ~ 0.001, var sqrt(2/n) ~ 0.0014 (bf16 rounding adds
     * var ~ 1e-5), kurtosis sqrt(96/n) ~ 0.01; a bf16 value is > 3 when the normal value is
     * above the midpoint 3 + 2^-7 to the next one (3 + 2^-6): P = erfc((3 + 2^-7) / sqrt 2)
     * = 0.00263 +- 0.00005 */
    double p3 = erfc((3.0 + 0x1p-7) / sqrt(2.0));
    assert_true(fabs(mean) < 0.005 && fabs(var - 1) < 0.007 && fabs(kurt - 3) < 0.05);
    assert_true(fabs((double)beyond3 / n - p3) < 0.0003);
    free(v);
    assert_int_equal(t_rmtree(dir), 0);
}

static void test_sum_nonneg(void **state)
{
    (void)state;
    ft_rng r;
    ft_rng_seed(&r, 21);
    const int64_t nmax = 300000;
    float *x = malloc((size_t)nmax * sizeof *x);
    for (int t = 0; t < 40; t++) {
        int64_t n = t < 20 ? 1 + (int64_t)(ft_rng_next(&r) % 2000) : 65537 + (int64_t)(ft_rng_next(&r) % 200000);
        for (int64_t i = 0; i < n; i++) {
            uint64_t h = ft_rng_next(&r);
            switch (t % 5) {
            case 0: x[i] = ft_rng_uniform(&r); break;                        /* absmax-like */
            case 1: x[i] = ldexpf(ft_rng_uniform(&r), (int)(h % 250) - 149); break; /* all exponents */
            case 2: x[i] = (h & 1) ? FLT_MAX : FLT_TRUE_MIN; break;
            case 3: x[i] = (h % 3) ? 0.0f : ldexpf(1.0f, (int)(h % 40)); break;
            default: x[i] = (float)(h % 7) * 0x1p-126f + ((h >> 8) & 1 ? 0x1p-149f : 0.0f); break;
            }
        }
        double a = ft_pack_sum_nonneg(x, n), b = ft_nf4_fsum(x, n);
        if (memcmp(&a, &b, sizeof a)) fail_msg("case %d (n %lld): %a vs fsum %a", t, (long long)n, a, b);
    }
    /* ties: 2^53 + 1 rounds to even (down), 2^53 + 3 up, 2^53 + 1 + 2^-20 up */
    float t1[] = {0x1p53f, 1.0f}, t2[] = {0x1p53f, 3.0f}, t3[] = {0x1p53f, 1.0f, 0x1p-20f};
    assert_true(ft_pack_sum_nonneg(t1, 2) == 0x1p53 && ft_nf4_fsum(t1, 2) == 0x1p53);
    assert_true(ft_pack_sum_nonneg(t2, 2) == 0x1p53 + 4 && ft_nf4_fsum(t2, 2) == 0x1p53 + 4);
    assert_true(ft_pack_sum_nonneg(t3, 3) == 0x1p53 + 2 && ft_nf4_fsum(t3, 3) == 0x1p53 + 2);
    /* a negative value: the fallback gives fsum's answer */
    float neg[] = {1.0f, -0.25f, 3.5f};
    assert_true(ft_pack_sum_nonneg(neg, 3) == 4.25);
    assert_true(ft_pack_sum_nonneg(x, 0) == 0.0);
    free(x);
}

/* ---- a pack not built yet: its layout, partial packs, the preview (`ftune plan`) --------- */

/* hsrc with the gate projection of every layer pre-quantized (as a bitsandbytes checkpoint's):
 * NF4 in blocks of 128 without double quantization, so the builder keeps its own block sizes
 * (ft_pack_plan_block) and the block sizes differ from the settings'. */
typedef struct presrc {
    hsrc h;
    float *x, *absmax;
    uint8_t *codes;
    int64_t cap;
} presrc;

static int presrc_nf4(void *user, int64_t l, int role, ft_nf4_view *v)
{
    presrc *ps = user;
    if (role != FT_PACK_ROLE_W0 + FT_GATE) return 0;
    const ft_model_config *c = ps->h.c;
    int64_t n = c->intermediate_size * c->hidden_size;
    assert_true(n <= ps->cap);
    memset(v, 0, sizeof *v);
    FT_TRY(ft_nf4_layout_init(&v->lay, n, 128, 0));
    FT_TRY(hsrc_read(&ps->h, l, role, 0, c->intermediate_size, c->hidden_size, ps->x));
    FT_TRY(ft_nf4_quantize(ps->x, &v->lay, NULL, ps->codes, NULL, NULL, NULL, ps->absmax));
    v->codes = ps->codes;
    v->absmax = ps->absmax;
    v->code = ft_nf4_code;
    return 1;
}

static int presrc_f32(void *user, int64_t l, int role, int64_t row0, int64_t n_rows, int64_t cols,
                      float *dst)
{
    return hsrc_read(&((presrc *)user)->h, l, role, row0, n_rows, cols, dst);
}

/* The whole pack p and the partial pack q (its first n layer blocks): the same bytes. */
static void same_blocks(ft_pack_file *p, ft_pack_file *q, int64_t n)
{
    size_t nb = ft_pack_max_layer_bytes(p);
    void *a = aligned_alloc(4096, nb), *b = aligned_alloc(4096, nb);
    for (int64_t l = 0; l < n; l++) {
        assert_int_equal(ft_pack_block_bytes(q, l), ft_pack_block_bytes(p, l));
        assert_int_equal(ft_pack_read_block(p, l, a, nb, 1), 0);
        assert_int_equal(ft_pack_read_block(q, l, b, nb, 1), 0);
        assert_memory_equal(a, b, ft_pack_block_bytes(p, l));
        const ft_pack_tensor *d;
        int64_t nd;
        assert_int_equal(ft_pack_block_dir(q, l, b, &d, &nd), 0);
    }
    free(a);
    free(b);
}

/* ft_pack_layout gives every block's size and the file's as the builder makes them (llama
 * tied/untied, attention biases (llama: q/k/v/o; qwen2: q/k/v), qwen3's q/k norms; NF4 and
 * bf16; a source with pre-quantized weights of other block sizes); a partial pack
 * (layer_limit 1 and all layers) holds the whole pack's first blocks byte for byte, is
 * refused by ft_pack_open and read by ft_pack_open_partial, which refuses a whole pack. */
static void test_layout_partial(void **state)
{
    (void)state;
    static const char *const js[] = {
        NULL, /* k_untied_js */
        NULL, /* k_tied_js */
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 160, "
        "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"vocab_size\": 300, \"tie_word_embeddings\": false, \"attention_bias\": true, "
        "\"rms_norm_eps\": 1e-5}",
        "{\"model_type\": \"qwen2\", \"hidden_size\": 96, \"intermediate_size\": 128, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, "
        "\"vocab_size\": 310, \"tie_word_embeddings\": true, \"rms_norm_eps\": 1e-6}",
        "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 128, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"head_dim\": 32, \"vocab_size\": 320, \"tie_word_embeddings\": true, "
        "\"rms_norm_eps\": 1e-6}",
    };
    char *dir = t_tmpdir(), cfgp[600], path[700], part[700];
    int cases = 0;
    for (size_t k = 0; k < sizeof js / sizeof js[0]; k++)
        for (int pre = 0; pre < 2; pre++)
            for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
                write_cfg(cfgp, sizeof cfgp, dir, "arch.json", k == 0 ? k_untied_js : k == 1 ? k_tied_js : js[k]);
                ft_model_config cfg;
                assert_int_equal(ft_config_load(&cfg, cfgp), 0);
                char *text;
                size_t len;
                assert_int_equal(ft_read_file(cfgp, &text, &len), 0);
                const int64_t L = cfg.num_hidden_layers;
                presrc ps = {{&cfg}, NULL, NULL, NULL, cfg.intermediate_size * cfg.hidden_size};
                ps.x = malloc((size_t)ps.cap * 4);
                ps.absmax = malloc((size_t)ps.cap * 4);
                ps.codes = malloc((size_t)ps.cap);
                ft_pack_src src = {&ps, presrc_f32, pre ? presrc_nf4 : NULL, NULL};
                ft_pack_settings s;
                ft_pack_settings_default(&s, quant);
                uint64_t *bb = calloc((size_t)(L + 1), sizeof *bb), fb = 0;
                assert_int_equal(ft_pack_layout(&cfg, len, &s, &src, bb, &fb), 0);
                snprintf(path, sizeof path, "%s/whole.ftpack", dir);
                ft_pack_stats st;
                assert_int_equal(ft_pack_build(path, &cfg, text, len, 7, &s, &src, &st), 0);
                ft_pack_file *p;
                assert_int_equal(ft_pack_open(&p, path, 1), 0);
                struct stat fst;
                assert_int_equal(stat(path, &fst), 0);
                fprintf(stderr, "%s%s %s: %lld layers, layer block %llu, global %llu, file %llu bytes\n",
                        cfg.model_type, cfg.qk_norm ? " (q/k norms)" : cfg.attention_bias ? " (biases)" : "",
                        ft_pack_quant_name(quant), (long long)L, (unsigned long long)bb[0],
                        (unsigned long long)bb[L], (unsigned long long)fb);
                assert_int_equal(fb, (uint64_t)fst.st_size);
                assert_int_equal(fb, ft_pack_header(p)->file_bytes);
                for (int64_t l = 0; l < L; l++) assert_int_equal(bb[l], ft_pack_block_bytes(p, l));
                assert_int_equal(bb[L], ft_pack_block_bytes(p, -1));
                /* partial packs of 1 and of all layers */
                for (int64_t lim = 1; lim <= L; lim += L > 1 ? L - 1 : 1) {
                    snprintf(part, sizeof part, "%s/part%lld.ftpack", dir, (long long)lim);
                    ft_pack_build_opts o = {0};
                    o.layer_limit = lim;
                    assert_int_equal(ft_pack_build_ex(part, &cfg, text, len, 7, &s, &src, &o, &st), 0);
                    assert_true(st.layer_seconds > 0 && st.layer_seconds <= st.seconds);
                    ft_pack_file *q;
                    assert_int_equal(ft_pack_open(&q, part, 0), FT_E_CORRUPT);
                    assert_non_null(strstr(ft_errmsg(), "partial pack"));
                    assert_int_equal(ft_pack_open_partial(&q, part), 0);
                    assert_int_equal(ft_pack_header(q)->n_blocks, (uint32_t)lim);
                    assert_int_equal(ft_pack_header(q)->n_layers, (uint32_t)L);
                    same_blocks(p, q, lim);
                    assert_int_equal(ft_pack_block_bytes(q, -1), 0);
                    if (lim < L) assert_int_equal(ft_pack_block_bytes(q, lim), 0);
                    size_t mx = 0;
                    for (int64_t l = 0; l < lim; l++)
                        mx = ft_pack_block_bytes(p, l) > mx ? ft_pack_block_bytes(p, l) : mx;
                    assert_int_equal(ft_pack_max_layer_bytes(q), mx);
                    float row[512];
                    assert_int_equal(ft_pack_read_global(q, FT_PACK_ROLE_EMBED, 0, 1, row), FT_E_UNSUPPORTED);
                    assert_int_equal(stat(part, &fst), 0);
                    uint64_t want = ft_pack_header(q)->header_bytes;
                    for (int64_t l = 0; l < lim; l++) want += bb[l];
                    assert_int_equal((uint64_t)fst.st_size, want);
                    ft_pack_close(q);
                    unlink(part);
                }
                ft_pack_file *q;
                assert_int_equal(ft_pack_open_partial(&q, path), FT_E_INVALID);
                ft_pack_build_opts o = {0};
                o.layer_limit = L + 1;
                assert_int_equal(ft_pack_build_ex(part, &cfg, text, len, 7, &s, &src, &o, &st), FT_E_INVALID);
                ft_pack_close(p);
                unlink(path);
                free(bb);
                free(ps.x);
                free(ps.absmax);
                free(ps.codes);
                free(text);
                cases++;
            }
    assert_int_equal(cases, 20);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -v arch.json | grep -q .", dir);
    assert_int_not_equal(system(cmd), 0); /* nothing left behind */
    assert_int_equal(t_rmtree(dir), 0);
}

/* ft_pack_preview_make on real models (a HF folder, qwen3 with q/k norms, the qwen2 GGUF with
 * biases): the sizes are those of the pack ft_pack_ensure then builds, the probe pack holds
 * its layer 0 block byte for byte, and the cache folder (created by the preview) has nothing
 * in it afterwards; ft_pack_locate finds nothing before the build and the pack after it. */
static void test_preview(void **state)
{
    (void)state;
    char *q3 = t_tiny_model("--qwen3");
    assert_non_null(q3);
    const char *models[] = {TINY, q3, "tests/fixtures/gguf/qwen2-tiny.gguf"};
    char *dir = t_tmpdir(), cache[700];
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++)
        for (int quant = FT_PACK_QUANT_BF16; quant <= FT_PACK_QUANT_NF4; quant++) {
            snprintf(cache, sizeof cache, "%s/c%zu%d/sub", dir, k, quant); /* not there yet */
            ft_pack_settings s;
            ft_pack_settings_default(&s, quant);
            ft_pack_ensure_info li, bi;
            assert_int_equal(ft_pack_locate(models[k], cache, &s, &li), 0);
            assert_int_equal(li.action, FT_PACK_BUILT);
            assert_int_not_equal(access(cache, F_OK), 0); /* locating writes nothing */
            ft_pack_preview pv;
            assert_int_equal(ft_pack_preview_make(models[k], NULL, li.path, &s, 1, &pv), 0);
            assert_non_null(pv.probe);
            assert_true(pv.probe_seconds > 0 && pv.build_estimate_s > pv.probe_seconds);
            assert_true(pv.disk_file_bytes > 0 && pv.disk_same_device == 1);
            char cmd[800];
            snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", cache);
            assert_int_equal(system(cmd), 0); /* the folder exists, empty */
            assert_int_equal(ft_pack_ensure(models[k], cache, &s, 0, &bi), 0);
            assert_int_equal(bi.action, FT_PACK_BUILT);
            assert_string_equal(bi.path, li.path);
            assert_string_equal(pv.path, li.path);
            ft_pack_file *p;
            assert_int_equal(ft_pack_open(&p, bi.path, 1), 0);
            const int64_t L = pv.n_layers;
            assert_int_equal(L, ft_pack_header(p)->n_layers);
            fprintf(stderr, "%s %s: predicted %llu bytes (layer block %llu, global %llu), built "
                    "%llu in %.3f s, estimated %.3f s (layer 0: %.3f s)\n", models[k],
                    ft_pack_quant_name(quant), (unsigned long long)pv.file_bytes,
                    (unsigned long long)pv.block_bytes[0], (unsigned long long)pv.block_bytes[L],
                    (unsigned long long)ft_pack_header(p)->file_bytes, bi.stats.seconds,
                    pv.build_estimate_s, pv.probe_seconds);
            assert_int_equal(pv.file_bytes, ft_pack_header(p)->file_bytes);
            for (int64_t l = 0; l < L; l++) assert_int_equal(pv.block_bytes[l], ft_pack_block_bytes(p, l));
            assert_int_equal(pv.block_bytes[L], ft_pack_block_bytes(p, -1));
            assert_int_equal(pv.max_layer_bytes, ft_pack_max_layer_bytes(p));
            same_blocks(p, pv.probe, 1);
            ft_pack_close(p);
            ft_pack_preview_free(&pv);
            assert_null(pv.probe);
            assert_int_equal(ft_pack_locate(models[k], cache, &s, &li), 0);
            assert_int_equal(li.action, FT_PACK_REUSED);
        }
    /* a pack the preview cannot probe: the error names the model, nothing is left */
    snprintf(cache, sizeof cache, "%s/ro", dir);
    assert_int_equal(mkdir(cache, 0555), 0);
    ft_pack_settings s;
    ft_pack_settings_default(&s, FT_PACK_QUANT_NF4);
    char path[800];
    snprintf(path, sizeof path, "%s/x.ftpack", cache);
    ft_pack_preview pv;
    if (geteuid() != 0) { /* root writes anywhere */
        assert_true(ft_pack_preview_make(TINY, NULL, path, &s, 1, &pv) < 0);
        assert_non_null(strstr(ft_errmsg(), "probe pack"));
        assert_null(pv.probe);
    }
    assert_int_equal(ft_pack_preview_make(TINY, NULL, path, &s, 0, &pv), 0); /* sizes only */
    assert_null(pv.probe);
    assert_true(pv.file_bytes > 0 && pv.build_estimate_s == 0);
    ft_pack_preview_free(&pv);
    assert_int_equal(t_rmtree(q3), 0);
    assert_int_equal(t_rmtree(dir), 0);
}

/* ---- the build lock: concurrent runs sharing a cache build a pack once ---------------------- */

typedef struct lock_run {
    const char *cache;
    ft_pack_settings s;
    ft_pack_ensure_info info;
    int rc;
    atomic_int told;           /* the wait callback ran */
    long pid;                  /* the pid it was told */
} lock_run;

static void lock_told(const char *path, long pid, void *user)
{
    lock_run *r = user;
    r->pid = pid;
    atomic_store(&r->told, 1);
}

static void *lock_thread(void *arg)
{
    lock_run *r = arg;
    r->rc = ft_pack_ensure_loaded(TINY, NULL, r->cache, &r->s, 0, &r->info, lock_told, r);
    return NULL;
}

/* Holds the lock of the pack's path as "another process" would (its own open file
 * description: flock excludes it from this process's others too), with pid 4242 written. */
static int hold_lock(const char *pack)
{
    char lp[4400];
    snprintf(lp, sizeof lp, "%s.lock", pack);
    int fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX), 0);
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(pwrite(fd, "4242\n", 5, 0), 5);
    return fd;
}

static void wait_told(lock_run *r)
{
    for (int i = 0; i < 2000 && !atomic_load(&r->told); i++) usleep(10000);
    assert_true(atomic_load(&r->told));
    usleep(50000); /* into flock(LOCK_EX) (a later arrival only waits less) */
}

static void test_build_lock(void **state)
{
    (void)state;
    char *dir = t_tmpdir(), cache[600], other[600];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    lock_run r = {.cache = cache};
    ft_pack_settings_default(&r.s, FT_PACK_QUANT_NF4);
    ft_pack_ensure_info loc, built;
    assert_int_equal(ft_pack_locate(TINY, cache, &r.s, &loc), 0);
    assert_int_equal(loc.action, FT_PACK_BUILT);
    assert_int_equal(ft_mkdir_p(cache), 0);
    assert_int_equal(ft_pack_ensure(TINY, other, &r.s, 0, &built), 0); /* what the holder writes */

    /* 1. the holder builds meanwhile: the waiter is told its pid, then reuses its pack */
    int fd = hold_lock(loc.path);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lock_thread, &r), 0);
    wait_told(&r);
    assert_int_equal(r.pid, 4242);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", loc.path);
    char *bytes = NULL;
    size_t nb = 0;
    assert_int_equal(ft_read_file(built.path, &bytes, &nb), 0);
    FILE *f = fopen(tmp, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, nb, f), nb);
    assert_int_equal(fclose(f), 0);
    free(bytes);
    assert_int_equal(rename(tmp, loc.path), 0);
    close(fd);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.info.action, FT_PACK_REUSED);
    assert_true(r.info.waited_s > 0.04);
    fprintf(stderr, "waited %.3f s for the holder's build, then reused it\n", r.info.waited_s);

    /* 2. the holder ends without a pack: the waiter builds it; the lock file is gone after */
    assert_int_equal(unlink(loc.path), 0);
    atomic_store(&r.told, 0);
    fd = hold_lock(loc.path);
    assert_int_equal(pthread_create(&th, NULL, lock_thread, &r), 0);
    wait_told(&r);
    close(fd);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.info.action, FT_PACK_BUILT);
    assert_true(r.info.waited_s > 0);
    char lp[4400];
    snprintf(lp, sizeof lp, "%s.lock", loc.path);
    assert_int_equal(access(lp, F_OK), -1);
    assert_true(files_equal(loc.path, built.path));

    /* 2b. the holder removes its lock file before it lets go (as build_unlock does): the
     * waiter, which got the lock on the removed file, locks the path afresh and goes on */
    assert_int_equal(unlink(loc.path), 0);
    atomic_store(&r.told, 0);
    fd = hold_lock(loc.path);
    assert_int_equal(pthread_create(&th, NULL, lock_thread, &r), 0);
    wait_told(&r);
    assert_int_equal(unlink(lp), 0);
    close(fd);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.info.action, FT_PACK_BUILT);
    assert_int_equal(access(lp, F_OK), -1);

    /* 3. nobody holds it: no wait, no callback */
    atomic_store(&r.told, 0);
    assert_int_equal(ft_pack_ensure_loaded(TINY, NULL, cache, &r.s, 1, &r.info, lock_told, &r), 0);
    assert_int_equal(r.info.action, FT_PACK_REBUILT);
    assert_true(r.info.waited_s == 0 && !atomic_load(&r.told));
    assert_int_equal(access(lp, F_OK), -1); /* nothing but the pack is left in the folder */
    assert_int_equal(t_rmtree(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh64),
        cmocka_unit_test(test_cache_and_corruption),
        cmocka_unit_test(test_verify_stamp),
        cmocka_unit_test(test_layer_weights),
        cmocka_unit_test(test_exec_with_pack),
        cmocka_unit_test(test_init_model),
        cmocka_unit_test(test_read_global),
        cmocka_unit_test(test_build_invariance),
        cmocka_unit_test(test_gguf_stream),
        cmocka_unit_test(test_build_write_error),
        cmocka_unit_test(test_init_invariance),
        cmocka_unit_test(test_sum_nonneg),
        cmocka_unit_test(test_layout_partial),
        cmocka_unit_test(test_preview),
        cmocka_unit_test(test_build_lock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
