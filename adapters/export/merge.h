/* merge.h - a LoRA adapter merged into its base model, streamed with bounded memory.
 *
 * For every targeted projection W (out, in): W' = W + scale * (B A), scale = alpha / r
 * (alpha / sqrt(r) with rsLoRA; formats.md 3.4), computed as
 *     delta = fp32(B A)   (the r-term dot products accumulated in fp64, rounded once to fp32)
 *     W'32  = fp32(W) + fp32(scale) * delta      (IEEE fp32 multiply and add)
 * and W'32 rounded once to the output type (round to nearest even for BF16/F16; Q8_0 as ggml).
 * Other tensors are copied: bytes unchanged when the type and row order do not change.
 *
 * Nothing is loaded whole: tensors are read one at a time, in blocks of rows, from the
 * mmap'ed safetensors/GGUF source (pages dropped after use), converted and written
 * straight to the output, so peak memory is a few row blocks plus one projection's A and B,
 * far below one layer (the tokenizer files, built after the weights, hold the vocabulary
 * and merges in memory: ~130 MiB peak for Llama-3's). Every output file is written to a
 * temporary name, fsynced and renamed.
 *
 * Inputs: an HF folder (config.json, *.safetensors or a sharded index; F32/F16/BF16) or a
 * GGUF file (llama/qwen2/qwen3; the types of src/numeric/quant.h); a PEFT adapter folder checked
 * against the base (ft_peft_open, ft_peft_check_base). Outputs:
 *  - safetensors: DIR/model.safetensors, or DIR/model-0000i-of-0000n.safetensors +
 *    model.safetensors.index.json when the tensors exceed shard_bytes (transformers'
 *    save_pretrained layout, formats.md 1.2), config.json (torch_dtype updated),
 *    tokenizer and generation files copied. From a GGUF file, config.json,
 *    generation_config.json, tokenizer.json and tokenizer_config.json are written from its
 *    metadata (hf_tok.h: "gpt2" byte-level and "llama" SentencePiece tokenizers, checked to
 *    encode like ftune's tokenizer on the GGUF; when that cannot be done there are no
 *    tokenizer files and the report's note says why); the llama.cpp q/k row order is undone
 *    (formats.md 2.4).
 *  - gguf: one file with the llama.cpp metadata (copied from a GGUF source, or built from
 *    config.json and tokenizer.json), 2-D weights in F16/BF16/Q8_0 (Q8_0 falls back to F16
 *    when ne[0] is not a multiple of 32, as gguf-py does), 1-D tensors F32, q/k rows in
 *    llama.cpp's order for arch llama, rope_freqs for llama3 rope scaling.
 */
#ifndef FT_MERGE_H
#define FT_MERGE_H

#include <stdint.h>

enum { FT_MERGE_SAFETENSORS = 0, FT_MERGE_GGUF = 1 };

#define FT_MERGE_DEFAULT_SHARD_BYTES 5000000000LL /* transformers' "5GB" */

typedef struct ft_merge_opts {
    int format;            /* FT_MERGE_SAFETENSORS or FT_MERGE_GGUF */
    int dtype;             /* ggml type: BF16 (default), F16, F32 (safetensors), Q8_0 (gguf) */
    int64_t shard_bytes;   /* safetensors shard size; 0 = FT_MERGE_DEFAULT_SHARD_BYTES */
} ft_merge_opts;

typedef struct ft_merge_report {
    char arch[32];
    char out_path[4200];   /* the folder, or the .gguf file */
    int64_t n_tensors;     /* written */
    int64_t n_merged;      /* of which W + scale*B*A */
    int64_t n_skipped;     /* source tensors with no place in the output (inv_freq) */
    int64_t n_files;       /* weight files written */
    int64_t bytes_out;     /* weight bytes written (headers included) */
    int64_t src_bytes;     /* tensor bytes of the source model */
    float scale;
    char note[512];        /* e.g. why tokenizer.json was not produced; "" if nothing */
} ft_merge_report;

/* Merges adapter_dir into model and writes out (a folder for safetensors; for gguf a file
 * path ending in .gguf, or a folder that receives model.gguf). Returns 0 or an error naming
 * the file and tensor: -errno, FT_E_INVALID (adapter/base mismatch, bad options),
 * FT_E_UNSUPPORTED (dtype, architecture, quantization type, rope scaling that the target
 * format cannot express). */
int ft_merge(const char *model, const char *adapter_dir, const char *out,
             const ft_merge_opts *opts, ft_merge_report *rep);

/* 1 if ft_merge writes out as one file (format FT_MERGE_GGUF and out ends in ".gguf"), 0 if
 * out is a folder it creates and fills. */
int ft_merge_out_is_file(int format, const char *out);

#endif
