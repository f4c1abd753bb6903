/* fuzz_safetensors.c - libFuzzer target: the safetensors reader (src/formats/safetensors.c)
 * and the folder loader behind it (src/model/loader.c load_hf).
 *
 * Input: the bytes of one .safetensors file (u64 header length, JSON header, data).
 * Per input: ft_st_open + every accessor and ft_st_to_f32 on each tensor it accepts; then
 * the same bytes as DIR/model.safetensors next to a fixed tiny config.json through
 * ft_model_load(DIR), whose name/shape/dtype checks run before anything is allocated.
 * Seeds: tests/fuzz/corpus/safetensors/ (tests/fuzz/make_corpus.py). */
#include <stdint.h>
#include <stdlib.h>

#include "src/model/model.h"
#include "src/formats/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

/* The model whose tensors the corpus's model seeds hold (make_corpus.py TINY_CFG). */
static const char k_config[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":8,"
    "\"intermediate_size\":16,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
    "\"num_key_value_heads\":1,\"vocab_size\":32,\"max_position_embeddings\":64,"
    "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":true,"
    "\"bos_token_id\":1,\"eos_token_id\":2}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        fuzz_write("config.json", k_config, sizeof k_config - 1);
        init = 1;
    }
    fuzz_write("model.safetensors", data, size);
    char path[512];
    fuzz_path(path, sizeof path, "model.safetensors");

    ft_st_file *f = NULL;
    int rc;
    FUZZ_CALL(rc, ft_st_open(&f, path));
    if (rc == 0) {
        volatile double sink = 0;
        int64_t n = ft_st_count(f);
        for (int64_t i = 0; i < n; i++) {
            const ft_st_tensor *t = ft_st_at(f, i);
            if (!t || ft_st_find(f, t->name) == NULL) abort(); /* every listed name is found */
            int64_t numel = 1;
            for (int d = 0; d < t->n_dims; d++) numel *= t->shape[d];
            if ((size_t)numel * ft_st_dtype_size(t->dtype) != t->nbytes &&
                ft_st_dtype_size(t->dtype) != 0)
                abort(); /* the reader promised nbytes == prod(shape) * size */
            if (numel > FUZZ_MAX_ELEMS) continue;
            float *buf = malloc((size_t)(numel ? numel : 1) * sizeof *buf);
            if (!buf) continue;
            FUZZ_CALL(rc, ft_st_to_f32(t, buf, numel));
            if (rc == 0)
                for (int64_t k = 0; k < numel; k++) sink += buf[k];
            free(buf);
        }
        (void)ft_st_at(f, n); /* out of range: NULL */
        (void)ft_st_find(f, "no.such.tensor");
        const char *fmt = ft_st_meta(f, "format");
        if (fmt) sink += (double)fmt[0];
        (void)sink;
        ft_st_close(f);
    }

    ft_model *m = NULL;
    FUZZ_CALL(rc, ft_model_load(&m, fuzz_dir()));
    if (rc == 0) {
        if (ft_model_n_params(m) <= 0) abort();
        ft_model_free(m);
    }
    return 0;
}
