/* fuzz_gguf.c - libFuzzer target: GGUF files (src/formats/gguf.c, quant.c, and the GGUF paths
 * of loader.c: metadata -> config, tensors -> fp32 weights, tokenizer.ggml.* -> tokenizer).
 *
 * Input: the bytes of one .gguf file.
 * Per input: ft_gguf_open; every key/value through the typed getters and the array
 * converters; every tensor of at most FUZZ_MAX_ELEMS elements dequantized; then
 * ft_gguf_load_tokenizer (encode/decode a fixed text when it loads) and ft_model_load, the
 * path `ftune train --model FILE.gguf` takes. Seeds: tests/fuzz/corpus/gguf/ (the small
 * fixtures of tests/fixtures/gguf and a tiny llama with tokenizer metadata). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/tokenizer/tokenizer.h"
#include "src/formats/gguf.h"
#include "src/model/model.h"
#include "tests/fuzz/fuzz_util.h"

static void walk(const ft_gguf *g)
{
    volatile double sink = 0;
    (void)ft_gguf_version(g);
    (void)ft_gguf_alignment(g);
    (void)ft_gguf_data_offset(g);
    (void)ft_gguf_path(g);
    int64_t nkv = ft_gguf_n_kv(g);
    int rc;
    for (int64_t i = 0; i < nkv; i++) {
        const ft_gguf_kv *kv = ft_gguf_kv_at(g, i);
        if (!kv || ft_gguf_find_kv(g, kv->key) != kv) abort(); /* keys are unique */
        (void)ft_gguf_vtype_name(kv->type);
        int64_t iv;
        double fv;
        int bv;
        const char *sv;
        FUZZ_CALL(rc, ft_gguf_get_int(g, kv->key, &iv));
        FUZZ_CALL(rc, ft_gguf_get_float(g, kv->key, &fv));
        FUZZ_CALL(rc, ft_gguf_get_bool(g, kv->key, &bv));
        FUZZ_CALL(rc, ft_gguf_get_str(g, kv->key, &sv));
        if (rc == 0) sink += (double)strlen(sv);
        if (kv->type == FT_GGUF_ARRAY) {
            (void)ft_gguf_vtype_name(kv->arr_type);
            if (kv->arr_n < 0) abort();
            if (kv->arr_str)
                for (int64_t k = 0; k < kv->arr_n; k++) sink += (double)strlen(kv->arr_str[k]);
            if (kv->arr_n <= FUZZ_MAX_ELEMS) {
                size_t n = (size_t)(kv->arr_n ? kv->arr_n : 1);
                float *f = malloc(n * sizeof *f);
                int32_t *d = malloc(n * sizeof *d);
                if (f && d) {
                    FUZZ_CALL(rc, ft_gguf_arr_f32(kv, f));
                    FUZZ_CALL(rc, ft_gguf_arr_i32(kv, d));
                }
                free(f);
                free(d);
            }
        }
    }
    (void)ft_gguf_kv_at(g, nkv);
    (void)ft_gguf_find_kv(g, "no.such.key");
    int64_t nt = ft_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const ft_gguf_tensor *t = ft_gguf_tensor_at(g, i);
        if (!t || ft_gguf_find_tensor(g, t->name) != t) abort();
        if (t->n_elems < 0 || t->n_elems > FUZZ_MAX_ELEMS) continue;
        float *out = malloc((size_t)(t->n_elems ? t->n_elems : 1) * sizeof *out);
        if (!out) continue;
        FUZZ_CALL(rc, ft_gguf_tensor_f32(g, t, out));
        if (rc == 0)
            for (int64_t k = 0; k < t->n_elems; k++) sink += out[k];
        free(out);
    }
    (void)ft_gguf_tensor_at(g, nt);
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write("model.gguf", data, size);
    char path[512];
    fuzz_path(path, sizeof path, "model.gguf");
    int rc;

    ft_gguf *g = NULL;
    FUZZ_CALL(rc, ft_gguf_open(&g, path));
    if (rc < 0) return 0; /* the other readers open the same bytes first: same error */
    walk(g);
    ft_gguf_close(g);

    ft_tokenizer *t = NULL;
    FUZZ_CALL(rc, ft_gguf_load_tokenizer(path, &t));
    if (rc == 0) {
        static const char text[] = "Hello world, <s> 123 naïve 🦙 \xff";
        int32_t *ids = NULL;
        int64_t n = 0;
        FUZZ_CALL(rc, ft_tok_encode(t, text, sizeof text - 1, 1, &ids, &n));
        if (rc == 0) {
            for (int64_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= ft_tok_vocab_size(t)) abort();
            char *s = NULL;
            FUZZ_CALL(rc, ft_tok_decode(t, ids, n, 0, &s));
            free(s);
        }
        free(ids);
        ft_tok_free(t);
    }

    ft_model *m = NULL;
    FUZZ_CALL(rc, ft_model_load(&m, path));
    if (rc == 0) ft_model_free(m);
    return 0;
}
