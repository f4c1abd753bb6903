/* init_model.h - a Llama-family model with random weights, for benchmarks and tests
 * (`ftune init-model`): large real architectures (Llama-3-8B, -70B) cannot be downloaded
 * here, so ftune makes their shapes itself.
 *
 * Weights follow transformers' LlamaPreTrainedModel._init_weights: every linear and the
 * embeddings ~ N(0, initializer_range) (config.json, default 0.02), RMSNorm weights 1,
 * biases 0; values are rounded to bf16. Each value is a pure function of (seed, tensor
 * name, element index) (counter-based: splitmix64 keys, a 32-bit integer hash, Box-Muller
 * with polynomial ln/sin/cos in fp32; init_model.c gives the exact recipe), so the bf16
 * safetensors and a pack written directly hold the same weights whatever the thread count,
 * the SIMD width (SSE, AVX2, AVX-512 kernels give the same bits) or the order tensors are
 * produced in.
 * Output folder: config.json (the input text, verbatim), bf16 safetensors (model.safetensors,
 * or model-0000i-of-0000N.safetensors shards + model.safetensors.index.json, formats.md
 * 1.2) written tensor by tensor in chunks (bounded memory), tokenizer files when a tokenizer
 * folder is given, and optionally a pack (offload/pack.h) built straight from the random
 * values (no bf16 detour: a 70B NF4 pack needs no 140 GB of safetensors), generated and
 * quantized on every OpenMP thread while a writer thread hashes and writes the previous
 * layer (ft_pack_build_ex with concurrent_src; buffered writes, or O_DIRECT when the
 * environment has FTUNE_PACK_DIRECT=1). A folder with only config.json + the pack
 * (+ tokenizer) loads with ft_model_load as a pack-only model (model.h).
 */
#ifndef FT_INIT_MODEL_H
#define FT_INIT_MODEL_H

#include <stdint.h>

#include "offload/pack.h"

typedef struct ft_init_cfg {
    const char *config_path;   /* config.json of the architecture */
    const char *out_dir;       /* created if missing */
    uint64_t seed;
    int64_t shard_bytes;       /* max bytes of one safetensors shard (0: 5,000,000,000) */
    int write_safetensors;     /* 1: write the bf16 safetensors */
    int pack_quant;            /* 0: no pack; FT_PACK_QUANT_NF4 / _BF16: write OUT/model-<q>.ftpack */
    const char *tokenizer_dir; /* copy tokenizer.json (+ tokenizer_config.json) from here, or NULL */
    int pack_direct;           /* 1: the pack written with O_DIRECT (benchmarks of the disk path;
                                * the program's FTUNE_PACK_DIRECT=1) */
} ft_init_cfg;

typedef struct ft_init_result {
    int64_t n_params;
    double init_std;           /* the std used (config initializer_range or 0.02) */
    int n_shards;
    uint64_t st_bytes;         /* safetensors bytes written */
    double st_seconds;
    char pack_path[4200];      /* "" if no pack */
    ft_pack_stats pack;
    int tokenizer_files;       /* files copied (0: none) */
} ft_init_result;

/* Writes the model. Returns 0 or an error naming the file: -errno (disk full: nothing is
 * left under a final name), FT_E_INVALID / FT_E_UNSUPPORTED (config.json). */
int ft_init_model(const ft_init_cfg *c, ft_init_result *res);

/* Element i of the tensor whose name hashes to tid: N(0, std) rounded to bf16, as fp32
 * (std 0 gives 0). Exposed for tests. */
float ft_init_normal(uint64_t seed, uint64_t tid, int64_t i, float std);

/* Picks the generator's SIMD kernel: 0 = the best the CPU has, 1 = SSE (x86-64-v2; generic
 * C vectors elsewhere), 2 = AVX2, 3 = AVX-512F. All give the same bits (exposed so tests can
 * check that). Returns the level in effect, FT_E_UNSUPPORTED when the CPU lacks it, or
 * FT_E_INVALID. The default (never called) is 0. */
int ft_init_set_simd(int level);

/* The tensor id of a HF tensor name (xxh64 of the name). */
uint64_t ft_init_tensor_id(const char *name);

#endif
