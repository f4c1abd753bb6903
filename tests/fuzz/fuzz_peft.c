/* fuzz_peft.c - libFuzzer target: PEFT adapter folders (adapters/peft.c: adapter_config.json
 * and adapter_model.safetensors), as `--init-adapter` and `ftune eval --adapter` read them.
 *
 * Input: adapter_config.json, FUZZ_SEP, adapter_model.safetensors (without a separator the
 * whole input is the config and no weights file exists).
 * Per input: ft_peft_read_config; when it succeeds, ft_lora_init on a fixed 2-layer model
 * shape (hidden 8, intermediate 16, 2 heads, 1 KV head of dim 4; make_corpus.py PEFT_MODEL)
 * and ft_peft_load_weights, which must either load every A/B or fail with a message.
 * Seeds: tests/fuzz/corpus/peft/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/lora.h"
#include "adapters/peft.h"
#include "kernels/kernels.h"
#include "src/model/model.h"
#include "tests/fuzz/fuzz_util.h"

#define PM_LAYERS 2
#define PM_C 8
#define PM_F 16
#define PM_KV 4 /* 1 KV head x head_dim 4 */

static ft_backend *g_be;
static ft_model g_model;
static ft_layer_weights g_layers[PM_LAYERS];

static void fuzz_peft_free(void) { ft_backend_free(g_be); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (ft_backend_cpu_init(&g_be, 1) < 0) {
        fprintf(stderr, "fuzz_peft: cpu backend: %s\n", ft_errmsg());
        exit(2);
    }
    atexit(fuzz_peft_free);
    g_model.cfg.num_hidden_layers = PM_LAYERS;
    g_model.cfg.hidden_size = PM_C;
    g_model.cfg.intermediate_size = PM_F;
    g_model.cfg.num_attention_heads = 2;
    g_model.cfg.num_key_value_heads = 1;
    g_model.cfg.head_dim = 4;
    g_model.layers = g_layers;
    /* (out, in) of q, k, v, o, gate, up, down */
    static const int64_t dims[FT_N_PROJ][2] = {{PM_C, PM_C}, {PM_KV, PM_C}, {PM_KV, PM_C},
                                               {PM_C, PM_C}, {PM_F, PM_C},  {PM_F, PM_C},
                                               {PM_C, PM_F}};
    for (int l = 0; l < PM_LAYERS; l++)
        for (int p = 0; p < FT_N_PROJ; p++) {
            g_layers[l].proj[p].out_n = dims[p][0];
            g_layers[l].proj[p].in_n = dims[p][1];
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cj, *st;
    size_t cjn, stn;
    int has_st = fuzz_split(data, size, &cj, &cjn, &st, &stn);
    fuzz_write("adapter_config.json", cj, cjn);
    if (has_st) fuzz_write("adapter_model.safetensors", st, stn);
    else fuzz_unlink("adapter_model.safetensors");

    ft_lora_cfg cfg;
    int rc;
    FUZZ_CALL(rc, ft_peft_read_config(fuzz_dir(), &cfg));
    if (rc < 0) return 0;
    if (cfg.r < 1 || !(cfg.targets & FT_LORA_ALL_TARGETS)) {
        fprintf(stderr, "fuzz_peft: config accepted with r=%lld targets=%#x\n", (long long)cfg.r,
                cfg.targets);
        abort();
    }
    cfg.seed = 1;
    ft_lora l;
    FUZZ_CALL(rc, ft_lora_init(&l, &g_model, &cfg, g_be));
    if (rc < 0) return 0;
    FUZZ_CALL(rc, ft_peft_load_weights(fuzz_dir(), &l));
    if (rc == 0) {
        volatile float sink = 0;
        for (int64_t i = 0; i < l.n_params; i++) sink += l.host[i];
        (void)sink;
    }
    ft_lora_free(&l);
    return 0;
}
