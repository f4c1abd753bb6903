/* hf_tok.h - a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) rebuilt from
 * the tokenizer.ggml.* metadata of a GGUF file, for merges of GGUF models into HF folders
 * (the inverse of ft_export_tokenizer_kv in export_gguf.h). See hf_tok.c for the mapping.
 */
#ifndef FT_HF_TOK_H
#define FT_HF_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "src/formats/gguf.h"

/* Writes DIR/tokenizer.json and DIR/tokenizer_config.json for the tokenizer stored in the
 * open GGUF file g: tokenizer.ggml.model "gpt2" (byte-level BPE, pre smollm / llama-bpe /
 * llama3 / qwen2 / gpt2 / default) or "llama" (SentencePiece-style: a BPE model with
 * byte_fallback whose merges are derived from the piece scores). model_max_length (the
 * GGUF context length; <= 0 if unknown) goes into tokenizer_config.json.
 *
 * Before anything is written under its final name, the files are written to a temporary
 * folder inside DIR, loaded back with ft_tok_load_dir, and must give the same vocabulary,
 * BOS/EOS, chat template, encodings (with and without special tokens) and decodings of a
 * probe text set as ft_gguf_load_tokenizer on the same file; then they are renamed into
 * DIR (each written to a temporary name and fsynced first).
 *
 * Returns 0 when both files were written; 1 when the tokenizer cannot be rebuilt exactly
 * (no tokenizer in the file, a model or pre-tokenizer that is not handled, a vocabulary
 * that JSON or the BPE model cannot express, or a failed self-check): nothing is written
 * and `why` (why_n bytes, NUL-terminated) says why; or a negative error (-errno, -ENOMEM)
 * naming the file. */
int ft_hf_tok_from_gguf(const char *dir, const ft_gguf *g, int64_t model_max_length,
                        char *why, size_t why_n);

#endif
