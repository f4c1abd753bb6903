/* llama.h - one Llama decoder block, forward and backward, through the op table.
 *
 *   h   = x + o_proj(attn(rope(q_proj(rms1(x))), rope(k_proj(rms1(x))), v_proj(rms1(x))))
 *   out = h + down_proj(silu(gate_proj(rms2(h))) * up_proj(rms2(h)))
 * (formats.md 2.3; HF LlamaDecoderLayer), each projection optionally carrying LoRA. With
 * cfg->qk_norm (Qwen3) q and k pass a per-head RMSNorm before RoPE:
 *   q = rope(rms_qn(q_proj(rms1(x)))), k = rope(rms_kn(k_proj(rms1(x)))) (HF Qwen3Attention).
 * Frozen base weights get no gradient; LoRA A/B gradients accumulate into the adapter.
 * All buffers are backend memory, fp32, shapes (T, ...) with T tokens of one micro-batch.
 */
#ifndef FT_LLAMA_H
#define FT_LLAMA_H

#include <stdint.h>

#include "src/model/lora.h"
#include "kernels/kernels.h"
#include "src/model/model.h"

/* Shape constants of a block for a micro-batch of T tokens. */
typedef struct ft_block_dims {
    int64_t T, C, H, Hkv, D, F, r;
} ft_block_dims;

/* Intermediates of one block's forward kept for its backward (one layer at a time: the
 * executor recomputes them from the layer's input checkpoint). Sizes in floats:
 * xn1, xn2, h: T*C; q, att: T*H*D; k, v: T*Hkv*D; lse: T*H; rstd1, rstd2: T;
 * gate, up, act: T*F; u[p]: T*r per LoRA projection; rstd_q: T*H, rstd_k: T*Hkv.
 * q and k hold the rotated q/k that attention reads, except with cfg->qk_norm (Qwen3):
 * then they hold the projections before the per-head RMSNorm (what its backward needs),
 * rstd_q/rstd_k that norm's 1/rms per (token, head), and the normalized, rotated q/k
 * attention reads live in the scratch (d2 and xd) for the forward and are recomputed
 * there (same ops, same bits) by the backward. rstd_q/rstd_k are always carved (a
 * fraction of a percent of the block) so the callers' sizing does not depend on the
 * model type. */
typedef struct ft_block_acts {
    float *xn1, *rstd1, *q, *k, *v, *att, *lse, *h, *xn2, *rstd2, *gate, *up, *act;
    float *u[FT_N_PROJ];
    float *rstd_q, *rstd_k;
} ft_block_acts;

/* Scratch for backward and LoRA dropout, sizes in floats: d1, d2: T*max(C, H*D, F)
 * each; dq: T*H*D; dk, dv: T*Hkv*D; dgate, dup: T*F; du: T*r; xd: T*max(C, F, H*D). */
typedef struct ft_block_scratch {
    float *d1, *d2, *dq, *dk, *dv, *dgate, *dup, *du, *xd;
} ft_block_scratch;

/* Per micro-batch inputs shared by every block. */
typedef struct ft_block_io {
    const int32_t *pos;        /* (T) */
    const int32_t *seq_start;  /* (T); with segments (ft_block_fwd_segs) each segment's
                                * entries count from the segment's first row, as in a
                                * micro-batch of its own */
    const float *inv_freq;     /* (D/2) RoPE */
    uint64_t dropout_seed;     /* mixes step, layer, micro-batch; 0 when dropout is off
                                * (ft_block_fwd/_bwd; the segments carry their own) */
    /* Segments only: 0 (default) multiplies the frozen projections once per segment, on its
     * rows, with the ops and shapes ft_block_fwd/_bwd give a micro-batch of that segment
     * alone, so each segment gets those bits on any backend; 1 once over all T rows (one GEMM
     * over the concatenated segments; a backend whose GEMM rounds a row by the row count and
     * the tile it falls in, as OpenBLAS does, then differs from each segment alone by
     * rounding: offload/exec.h ft_exec.concat_gemms). */
    int concat_gemms;
} ft_block_io;

/* Several adapters in one micro-batch: its T rows are the concatenation of n segments, each
 * one adapter's micro-batch of whole sequences (no sequence crosses a segment boundary).
 * Norms, RoPE, SwiGLU and the residual adds run over all rows, the frozen projections per
 * segment or over all rows (ft_block_io.concat_gemms); attention runs once per segment, on
 * its own rows (it has no weights to share, and the CPU's tiles count from a call's first
 * row, so a call over all rows would tile each segment otherwise than its own run does);
 * each segment's LoRA path (its rank, scale, dropout, targets, frozen correction A0/B0)
 * applies to its rows only, and its gradients go to its own adapter. Segments tile [0, T) in
 * order. */
typedef struct ft_block_seg {
    const ft_lora *lora;       /* NULL: the base alone on these rows */
    int64_t row0, T;           /* rows [row0, row0 + T) of the micro-batch */
    uint64_t dropout_seed;     /* as ft_block_io.dropout_seed, for these rows */
} ft_block_seg;

/* Floats needed by ft_block_acts / ft_block_scratch for dims d (carving order is the
 * struct order; each region padded to 16 floats, so a 64-byte aligned base gives 64-byte
 * aligned regions, which the CUDA linear ops require of activations and scratch). */
int64_t ft_block_acts_floats(const ft_block_dims *d);
int64_t ft_block_scratch_floats(const ft_block_dims *d);
void ft_block_acts_carve(ft_block_acts *a, float *base, const ft_block_dims *d, unsigned lora_targets);
void ft_block_scratch_carve(ft_block_scratch *s, float *base, const ft_block_dims *d);

/* Forward: out (T, C) from x (T, C). out may not alias x. lora may be NULL (eval without
 * adapter) or carry the layer's adapters. With cfg->qk_norm, q and k are RMS-normalized
 * per head (D values, weights w->q_norm / w->k_norm, eps cfg->rms_norm_eps, as
 * transformers' Qwen3Attention) before RoPE. Returns 0, FT_E_INVALID (qk_norm without the
 * norm weights) or a kernel error. */
int ft_block_fwd(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                 const ft_lora *lora, int64_t layer, const ft_block_dims *d,
                 const ft_block_io *io, const float *x, float *out, ft_block_acts *a,
                 ft_block_scratch *s, int train);

/* Backward: given dout (T, C) and the acts of ft_block_fwd on x, overwrites dx (T, C)
 * (dx may alias dout) and accumulates LoRA gradients into lora->grads. The q/k norm
 * weights are frozen (no gradient). */
int ft_block_bwd(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                 const ft_lora *lora, int64_t layer, const ft_block_dims *d,
                 const ft_block_io *io, const float *x, const float *dout, float *dx,
                 const ft_block_acts *a, ft_block_scratch *s);

/* ft_block_fwd / ft_block_bwd over n >= 1 segments (ft_block_seg) of the d->T rows: d->r is
 * the largest rank among them (it sizes a->u and s->du; segment k's u[p] starts at row0 *
 * d->r), io->dropout_seed is not read (each segment's is), io->pos / io->seq_start cover all
 * rows. One segment with lora L over all rows is ft_block_fwd / _bwd with L: the same ops in
 * the same order, the same bits. Gradients accumulate into each segment's adapter. Returns
 * 0, FT_E_INVALID (segments that do not tile [0, T) in order, a rank above d->r, an adapter
 * in two segments), or what ft_block_fwd / _bwd return. */
int ft_block_fwd_segs(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                      int64_t layer, const ft_block_dims *d, const ft_block_io *io,
                      const ft_block_seg *segs, int64_t n, const float *x, float *out,
                      ft_block_acts *a, ft_block_scratch *s, int train);
int ft_block_bwd_segs(ft_backend *be, const ft_model_config *cfg, const ft_layer_weights *w,
                      int64_t layer, const ft_block_dims *d, const ft_block_io *io,
                      const ft_block_seg *segs, int64_t n, const float *x, const float *dout,
                      float *dx, const ft_block_acts *a, ft_block_scratch *s);

#endif
