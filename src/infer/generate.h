/* generate.h - inference with a KV cache: batched prefill of a prompt, then one token per
 * forward, through the op table (backend-neutral). The prompts (chat template, prompts-file
 * records) are gen_prompt.h's; the streamed text stop_text.h's.
 *
 * The forward of each block is the op sequence of ft_block_fwd (src/model/llama.c) with
 * train = 0: RMSNorm, q/k/v projections (+ bias, + LoRA as x A^T B^T * scale, unmerged, + the
 * frozen correction of a QLoRA base when the adapter carries one),
 * the per-head q/k RMSNorm of qk_norm models (Qwen3), RoPE at the absolute positions,
 * attention, o projection + residual, RMSNorm, SwiGLU MLP + residual. The new tokens' k (after RoPE) and v are written straight into the cache,
 * per layer K and V (ctx_max, Hkv, D) fp32 in backend memory. Attention of a forward that
 * starts an empty cache is attention_fwd over the chunk (so a prompt prefilled in one
 * forward gives bit for bit the logits of ft_exec_logits, tested); later forwards use
 * attention_kv_fwd against the cache. RoPE inverse frequencies are computed once with
 * seq_len = ctx_max (only FT_ROPE_DYNAMIC depends on it).
 */
#ifndef FT_GENERATE_H
#define FT_GENERATE_H

#include <stddef.h>
#include <stdint.h>


#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "src/model/model.h"
#include "offload/weight_source.h"

/* Tokens per forward when a prompt is longer than this (prefill in chunks). */
#define FT_GEN_CHUNK_DEFAULT 1024
/* Most sequences one ft_gen decodes together (ft_gen_init_seqs). */
#define FT_GEN_MAX_SEQS 256

typedef struct ft_gen {
    ft_backend *be;
    const ft_model *m;
    const ft_lora *lora;        /* NULL: the base model */
    int64_t ctx_max;            /* KV cache capacity in tokens */
    int64_t chunk_max;          /* most tokens per ft_gen_forward */
    int64_t logit_rows_max;     /* most logits rows per ft_gen_forward */
    int64_t n_seqs;            /* sequences with a cache each (ft_gen_init_seqs; else 1) */
    int64_t *past;              /* (n_seqs) host: tokens in each sequence's cache */
    int64_t n_past;             /* past[0]: tokens in sequence 0's cache (the next position) */
    void *arena;                /* the one backend allocation */
    size_t arena_bytes;
    float *kc, *vc;             /* (n_seqs, L, ctx_max, Hkv, D) each */
    float *kt;                  /* a batched decode's or prefill's new k, v rows
                                 * (2, chunk_max, Hkv, D); NULL with one sequence */
    float *x, *y, *xn, *rstd, *q, *att, *lse, *h, *gate, *up, *act, *u;
                                /* chunk_max * {C, C, C, 1, H*D, H*D, H, C, F, F, F, r} */
    float *logits;              /* (logit_rows_max, V) */
    float *inv_freq;            /* (n_seqs, D/2 + 1 rounded up to 16) floats: each sequence's
                                 * RoPE inverse frequencies (D/2 of them) */
    int32_t *ids, *pos, *seq_start; /* (chunk_max) each */
    /* The weights as the backend reads them: the model's host arrays on a host-memory backend
     * (CPU); with a source (ft_gen_init_source, needed on a device backend) the layers come
     * from it per visit instead (layers NULL), and xd is linear_fwd's scratch,
     * chunk_max * max(C, H*D, F) floats. lm_head is NULL when the source computes the head
     * (ft_gen_source.head). */
    const ft_layer_weights *layers;
    const float *embed, *final_norm, *lm_head;
    const struct ft_gen_source *src;
    float *xd;
} ft_gen;


/* Plans and allocates (one backend allocation) a cache of ctx_max tokens and buffers for
 * forwards of up to chunk_max tokens returning up to logit_rows_max rows of logits, the
 * weights read in place from m's host arrays (a host-memory backend). lora may be NULL.
 * Returns 0, -ENOMEM (the message gives the bytes), FT_E_INVALID (unless 1 <= logit_rows_max
 * <= chunk_max <= ctx_max; an adapter of another depth), FT_E_UNSUPPORTED (head_dim > 2048;
 * a model without host weights; a device backend: see ft_gen_init_source), FT_E_RANGE (a
 * cache too large to address). */
int ft_gen_init(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                int64_t ctx_max, int64_t chunk_max, int64_t logit_rows_max);
/* ft_gen_init with the weights read from src (kept by pointer: it must outlive g) instead
 * of m's arrays; m gives the shapes. Same sizes and errors, plus FT_E_INVALID for a source
 * without layer() or without both embed and embed_rows. */
int ft_gen_init_source(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                       const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                       int64_t logit_rows_max);
void ft_gen_free(ft_gen *g); /* NULL-safe; leaves g zeroed */

/* ft_gen_init_source for n_seqs sequences decoded together (src NULL: ft_gen_init's
 * in-place host weights): each sequence has its own KV cache of ctx_max tokens and RoPE table;
 * ft_gen_forward_seq prefills one, ft_gen_prefill several in one forward, ft_gen_decode
 * advances several by one token in one forward, so each layer's weights are read (or
 * streamed) once for all of them. Same sizes and errors as ft_gen_init_source, except that
 * chunk_max may reach n_seqs * ctx_max (the prompts of several sequences in one forward), plus
 * FT_E_INVALID unless 1 <= n_seqs <= FT_GEN_MAX_SEQS; a decode or a prefill of n sequences
 * needs n <= logit_rows_max <= chunk_max. */
int ft_gen_init_seqs(ft_gen *g, ft_backend *be, const ft_model *m, const ft_lora *lora,
                      const ft_gen_source *src, int64_t ctx_max, int64_t chunk_max,
                      int64_t logit_rows_max, int64_t n_seqs);

/* The backend bytes ft_gen_init_seqs allocates for these sizes with a source (one arena:
 * the fp32 KV caches of n_seqs x ctx_max tokens and the buffers of chunk_max-token
 * forwards), so that a caller placing the weights on a device first can leave room for it;
 * 0 for sizes it would refuse. */
size_t ft_gen_source_bytes(const ft_model *m, const ft_lora *lora, int64_t ctx_max,
                           int64_t chunk_max, int64_t logit_rows_max, int64_t n_seqs);

/* Empties sequence 0's cache (the next forward starts at position 0); ft_gen_reset_seq any
 * sequence's (out-of-range sequences are ignored). */
void ft_gen_reset(ft_gen *g);
void ft_gen_reset_seq(ft_gen *g, int64_t seq);

/* Cuts sequence `seq`'s cache back to its first n_keep tokens (positions 0..n_keep-1 kept; the
 * next forward starts at position n_keep, and the rows beyond are overwritten by it): a
 * conversation whose next prompt shares those tokens with what the cache holds prefills only
 * the rest (llama.cpp's common-prefix reuse, llama_memory_seq_rm from n_keep on). n_keep = 0
 * is ft_gen_reset_seq. The cached k rows carry the RoPE table they were computed with: the
 * caller keeps it (ft_gen_set_rope_len_seq) or cuts to 0. Returns 0, FT_E_RANGE (a sequence
 * outside 0..n_seqs-1, or n_keep outside 0..the tokens it holds; nothing changes),
 * FT_E_INVALID (g not initialised). */
int ft_gen_truncate_seq(ft_gen *g, int64_t seq, int64_t n_keep);

/* Recomputes sequence 0's (ft_gen_set_rope_len_seq: any sequence's) RoPE inverse frequencies for a
 * sequence of seq_len tokens (ft_gen_init uses ctx_max). Only FT_ROPE_DYNAMIC depends on
 * it: a cache sized for several prompts then rotates each one as a cache sized for that
 * prompt alone would. Returns 0, FT_E_INVALID (no such sequence) or a backend copy error. */
int ft_gen_set_rope_len(ft_gen *g, int64_t seq_len);
int ft_gen_set_rope_len_seq(ft_gen *g, int64_t seq, int64_t seq_len);

/* Runs the n tokens ids (host memory) at positions [n_past, n_past + n), appends their
 * k/v to the cache and advances n_past. logits (host memory) receives the logits of the
 * last `rows` tokens, (rows, V) fp32: rows = 1 for generation, rows = n for all of them.
 * Returns 0, FT_E_RANGE (n > chunk_max, rows outside 1..min(n, logit_rows_max), the
 * cache would exceed ctx_max; nothing changes), FT_E_INVALID (an id outside the
 * vocabulary), or a kernel error (the cache is then reset). */
int ft_gen_forward(ft_gen *g, const int32_t *ids, int64_t n, float *logits, int64_t rows);
/* ft_gen_forward on sequence `seq`'s cache (its own positions and RoPE table); FT_E_RANGE for
 * a sequence outside 0..n_seqs-1. */
int ft_gen_forward_seq(ft_gen *g, int64_t seq, const int32_t *ids, int64_t n, float *logits,
                        int64_t rows);

/* One decode step of n sequences in one forward: token ids[i] (host) is appended to sequence
 * seqs[i] (distinct, each holding at least its prompt) at its next position; logits (host)
 * receives (n, V) fp32, row i for seqs[i]. Each row's attention is the one-sequence decode's
 * (attention_kv_fwd over its own cache); the projections run on n rows at once, so a row's
 * values may differ from a one-sequence decode in the last bits (the GEMM's summation
 * order). Returns 0, FT_E_RANGE (n outside 1..min(n_seqs, logit_rows_max), a sequence out of
 * range or with a full cache), FT_E_INVALID (a repeated or empty sequence, an id outside the
 * vocabulary; nothing changes) or a kernel error (the n sequences are then reset). */
int ft_gen_decode(ft_gen *g, const int64_t *seqs, const int32_t *ids, int64_t n, float *logits);

/* The prompts of n_seq sequences prefilled in one forward, so that each layer's weights are
 * read (or streamed) once for all of them (vLLM and llama.cpp batch the prompts of the
 * requests that start together the same way): prompt i, lens[i] >= 1 tokens, is
 * ids[sum(lens[0..i)) ..] (host, concatenated) and goes into the empty cache of sequence seqs[i]
 * (distinct) at positions 0..lens[i]-1, rotated with that sequence's RoPE table (dynamic NTK:
 * ft_gen_set_rope_len_seq first). logits (host) receives (n_seq, V) fp32: row i the logits
 * of prompt i's last token. Each prompt's rows are those of ft_gen_forward_seq(seqs[i],
 * its ids, lens[i], ., 1) on that empty sequence: the same attention call on its own rows (causal,
 * attention_fwd), the projections over all the rows at once (as ft_gen_decode, a GEMM over
 * more rows may round differently in the last bits: bit for bit on the tiny test model
 * (tested), while OpenBLAS blocks the example model's GEMMs otherwise for other row counts,
 * <= 8.8e-7 of the largest logit measured), the LM head over the n_seq last rows.
 * The caller splits prompts whose total exceeds chunk_max (a longer prompt alone:
 * ft_gen_forward_seq in chunks). Returns 0, FT_E_RANGE (n_seq outside 1..min(n_seqs,
 * logit_rows_max), a sequence out of range, a length outside 1..ctx_max, more than chunk_max
 * tokens in all; nothing changes), FT_E_INVALID (NULL pointers, a repeated sequence, a sequence whose
 * cache is not empty, an id outside the vocabulary, named with its prompt and sequence; nothing
 * changes) or a kernel error (the n_seq caches are then left empty). */
int ft_gen_prefill(ft_gen *g, int64_t n_seq, const int64_t *seqs, const int32_t *ids,
                   const int64_t *lens, float *logits);

#endif
