/* kernels.h - the op table: every numeric operation of a Llama block, forward and backward.
 *
 * One table, two backends (STYLE C7): kernels/cpu is the fp32 reference (OpenBLAS GEMMs),
 * kernels/cuda implements the same entries. Code in src/ and offload/ calls
 * numeric work only through be->ops, so where a buffer lives never leaks into the math.
 *
 * Conventions for every op:
 *   - Buffers are fp32, row-major, dimensions written outer -> inner: x (T, C) means T rows
 *     of C contiguous floats. T is the number of tokens in a micro-batch (rows * seq_len,
 *     flattened), C = hidden_size, H = num_attention_heads, Hkv = num_key_value_heads,
 *     D = head_dim, F = intermediate_size, V = vocab rows of the LM head.
 *   - Pointers are in the backend's memory (host memory for the CPU backend).
 *   - Counts are int64_t (STYLE C5).
 *   - "accumulates into" means +=; otherwise outputs are overwritten.
 *   - Every op returns 0 or a negative status (err.h); the CPU backend only fails on
 *     invalid arguments (FT_E_INVALID).
 *   - Packed sequences: seq_start (T) int32 gives, for each token t, the flat index of the
 *     first token of the sequence that holds t. Token t attends to keys j with
 *     seq_start[t] <= j <= t, so sequences packed into one row never see each other.
 *     Sequences are contiguous: seq_start[0] == 0 and seq_start[t] is t or seq_start[t-1]
 *     (anything else -> FT_E_INVALID).
 */
#ifndef FT_KERNELS_H
#define FT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ft_backend ft_backend;

/* Storage of a frozen weight matrix W (out_n, in_n), row-major. */
enum ft_wtype {
    FT_WTYPE_F32 = 0,  /* float */
    FT_WTYPE_BF16 = 1, /* bfloat16 as uint16_t (the upper half of the fp32 bits, rounded to nearest even) */
    /* NF4 (bitsandbytes, optionally double-quantized): W points to a host ft_nf4_tensor whose
     * arrays are in backend memory, n = out * in. The product is the one of W dequantized and
     * rounded to bf16 (dequant_nf4's values) with the activation rounded to bf16 and fp32
     * sums, without a bf16 copy of W in memory (the dequantization is fused into the GEMM).
     * Device backends take it when out and in are multiples of FT_NF4_FUSED_ALIGN and the
     * blocksize is a power of two 32..4096 (ft_nf4_fusable). The CPU backend's linear_fwd
     * (not linear_bwd_x, so not in its weight_types) takes it too, for generation's decode:
     * there the product is in fp32, W at its dequantized fp32 values and x unrounded
     * (kernels/cpu/nf4_gemv.h). */
    FT_WTYPE_NF4 = 2,
};
#define FT_WTYPE_BIT(t) (1u << (t))
#define FT_NF4_FUSED_ALIGN 64
/* Most rows for which lm_head_logits_bf16 equals lm_head_logits bit for bit (a decode step's
 * head: one row per sequence decoded). */
#define FT_LM_HEAD_BF16_ROWS 16

/* An NF4 tensor with double quantization in backend memory: bitsandbytes' layout and
 * arithmetic (src/numeric/nf4.h, formats.md 5): codes (n + 1) / 2 bytes, first element in the
 * high nibble; block b of blocksize elements has absmax = nested_map[qabsmax[b]] *
 * nested_absmax[b / nested_blocksize] + offset (two fp32 roundings), or absmax[b] (fp32)
 * when nested_blocksize is 0; element = code[q] * absmax (fp32). */
typedef struct ft_nf4_tensor {
    int64_t n, blocksize, nested_blocksize;
    const uint8_t *codes;
    const uint8_t *qabsmax;       /* nested */
    const float *absmax;          /* not nested */
    const float *nested_absmax;   /* nested */
    const float *nested_map;      /* nested: 256 entries */
    const float *code;            /* 16 entries */
    float offset;                 /* nested */
} ft_nf4_tensor;

/* 1 when linear_fwd/linear_bwd_x may take W (out, in) as FT_WTYPE_NF4 with these block sizes
 * (the fused kernels' tile rules: out, in multiples of FT_NF4_FUSED_ALIGN; blocksize a power
 * of two 32..4096; nested: (out * in / blocksize) a multiple of 4 and nested_blocksize a power
 * of two), 0 otherwise (the caller dequantizes to bf16 instead). */
static inline int ft_nf4_fusable(int64_t out, int64_t in, int64_t blocksize, int64_t nested_blocksize)
{
    int64_t n = out * in;
    if (out <= 0 || in <= 0 || out % FT_NF4_FUSED_ALIGN || in % FT_NF4_FUSED_ALIGN) return 0;
    if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1))) return 0;
    if (nested_blocksize < 0 || (nested_blocksize & (nested_blocksize - 1))) return 0;
    return !nested_blocksize || (n / blocksize) % 4 == 0;
}

/* One tensor of a multi-tensor AdamW step (adamw_multi): params p, gradients g, first and second
 * moments m, v (n fp32 each, backend memory) updated at learning rate lr. */
typedef struct ft_adamw_seg {
    float *p;
    const float *g;
    float *m, *v;
    int64_t n;
    float lr;
} ft_adamw_seg;

/* Lanes of work (CUDA streams): compute, host->device copies, device->host copies. */
enum ft_stream { FT_STREAM_COMPUTE = 0, FT_STREAM_H2D = 1, FT_STREAM_D2H = 2, FT_N_LANES = 3 };
#define FT_MAX_EVENTS 1024

typedef struct ft_backend_ops {
    const char *name; /* "cpu", "cuda" */
    /* 1 when backend pointers are host pointers (the CPU backend): host data such as the
     * model's weights can be used in place; 0 (CUDA) means they must be copied in. */
    int host_memory;
    /* FT_WTYPE_BIT of each weight storage linear_fwd/linear_bwd_x accept. */
    unsigned weight_types;
    /* Releases the backend's context (called by ft_backend_free). */
    void (*destroy)(ft_backend *be);
    /* Called once at setup with the largest attention shape the ops will see (T tokens): the
     * backend allocates what its ops need (CUDA: the attention workspace), so the step loop
     * allocates nothing. NULL: nothing to prepare. Returns 0 or -ENOMEM. */
    int (*prepare)(ft_backend *be, int64_t T_max, int64_t H, int64_t Hkv, int64_t D);

    /* ---- memory ------------------------------------------------------------------- */
    /* One allocation of `bytes` bytes, 64-byte aligned, in backend memory; NULL on
     * failure. Called only while setting up, never inside the step loop (STYLE C6). */
    void *(*alloc)(ft_backend *be, size_t bytes);
    void (*free)(ft_backend *be, void *p); /* NULL-safe */
    /* Copies bytes between host and backend memory (either direction). */
    int (*copy)(ft_backend *be, void *dst, const void *src, size_t bytes);
    int (*zero)(ft_backend *be, void *p, size_t bytes);

    /* ---- transfers (the offload executor's tiers; offload/exec.h) -------------------- */
    /* Host memory the device copies at full bus speed: CUDA page-locks it (cudaHostAlloc,
     * portable); a host-memory backend returns plain 4096-aligned memory. NULL on failure.
     * Setup only, like alloc. */
    void *(*host_alloc)(ft_backend *be, size_t bytes);
    void (*host_free)(ft_backend *be, void *p); /* NULL-safe */
    /* Queues a copy of bytes on lane FT_STREAM_H2D (host -> backend memory) or FT_STREAM_D2H
     * (backend -> host), after the work already queued on that lane, and returns at once
     * (host memory must be host_alloc'd for the copy to be asynchronous). A host-memory
     * backend copies right away. Returns 0 or -EIO. */
    int (*copy_async)(ft_backend *be, int lane, void *dst, const void *src, size_t bytes);
    /* Events (ids 0 .. FT_MAX_EVENTS - 1, owned by the backend): record marks the point
     * reached by the work queued so far on a lane; wait makes later work on `lane` wait for
     * it (no host block); sync blocks the host until it has passed; elapsed gives the
     * milliseconds between two recorded events (CUDA events; FT_E_UNSUPPORTED where the
     * backend keeps no times). A host-memory backend runs everything in order at once:
     * record/wait/sync return 0. Return 0 or -EIO. */
    int (*event_record)(ft_backend *be, int ev, int lane);
    int (*event_wait)(ft_backend *be, int lane, int ev);
    int (*event_sync)(ft_backend *be, int ev);
    int (*event_elapsed)(ft_backend *be, int ev0, int ev1, float *ms);

    /* ---- linear algebra ------------------------------------------------------------ */
    /* c (m, n) = alpha * op(a) (m, k) @ op(b) (k, n) + beta * c, row-major; op(x) = x^T
     * when trans_x. lda/ldb/ldc are row strides in elements, as cblas_sgemm(RowMajor). */
    int (*gemm)(ft_backend *be, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                float beta, float *c, int64_t ldc);
    /* Frozen-weight products, W (out, in) stored as wtype (a type in weight_types):
     *   linear_fwd:   y (T, out) = x (T, in) W^T + beta * y
     *   linear_bwd_x: dx (T, in) = dy (T, out) W + beta * dx   (no gradient for W)
     * x, dy, y, dx are fp32. scratch holds at least T * max(in, out) floats; a backend may use
     * it to hold a lower-precision copy of the activation (CUDA: bf16 for the tensor cores).
     * An unsupported wtype -> FT_E_UNSUPPORTED. */
    int (*linear_fwd)(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                      int64_t T, int64_t out, int64_t in, float beta, float *scratch);
    int (*linear_bwd_x)(ft_backend *be, float *dx, const float *dy, const void *W, int wtype,
                        int64_t T, int64_t out, int64_t in, float beta, float *scratch);
    /* dst (n) = t dequantized with bitsandbytes' fp32 arithmetic, then rounded to bf16 (to
     * nearest even), for linear_fwd/linear_bwd_x with FT_WTYPE_BF16. NULL on backends that take
     * fp32 weights only (the CPU dequantizes NF4 to fp32 when it reads a pack). */
    int (*dequant_nf4)(ft_backend *be, uint16_t *dst, const ft_nf4_tensor *t);
    /* y (n) += alpha * x (n). */
    int (*axpy)(ft_backend *be, float alpha, const float *x, float *y, int64_t n);
    /* x (n) *= alpha. */
    int (*scale)(ft_backend *be, float *x, float alpha, int64_t n);
    /* *out = sum of x[i]^2 over n floats, accumulated in double (gradient norm). */
    int (*sumsq)(ft_backend *be, double *out, const float *x, int64_t n);
    /* y (T, O) += bias (O), broadcast over rows (Qwen2 q/k/v bias). */
    int (*bias_add)(ft_backend *be, float *y, const float *bias, int64_t T, int64_t O);

    /* ---- embedding ----------------------------------------------------------------- */
    /* out (T, C) = table (V, C) rows ids (T); ids outside [0, V) -> FT_E_INVALID. */
    int (*embedding_fwd)(ft_backend *be, float *out, const int32_t *ids, const float *table,
                         int64_t T, int64_t C, int64_t V);

    /* ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm) --------------------------- */
    /* y = x * rstd * w with rstd (T) = 1/sqrt(mean(x^2) + eps), per row of x (T, C). */
    int (*rmsnorm_fwd)(ft_backend *be, float *y, float *rstd, const float *x, const float *w,
                       int64_t T, int64_t C, float eps);
    /* Accumulates dL/dx into dx (T, C) given dy (T, C), x, w (frozen: no dw), rstd. */
    int (*rmsnorm_bwd)(ft_backend *be, float *dx, const float *dy, const float *x,
                       const float *w, const float *rstd, int64_t T, int64_t C);

    /* ---- RoPE, HF rotate-half layout (formats.md 2.2) ------------------------------ */
    /* In place on x (T, H, D): for i < D/2, angle = pos[t] * inv_freq[i],
     * (x_i, x_{i+D/2}) <- (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin).
     * rope_bwd applies the inverse rotation (angle -> -angle) to a gradient in place. */
    int (*rope_fwd)(ft_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                    int64_t T, int64_t H, int64_t D);
    int (*rope_bwd)(ft_backend *be, float *dx, const int32_t *pos, const float *inv_freq,
                    int64_t T, int64_t H, int64_t D);

    /* ---- causal GQA attention over packed sequences -------------------------------- */
    /* out (T, H, D) = softmax(scale * q k^T + causal/sequence mask) v, query head h uses
     * key/value head h / (H / Hkv). q (T, H, D), k and v (T, Hkv, D). lse (T, H) receives
     * the log-sum-exp of each softmax row (scaled scores), kept for the backward. */
    int (*attention_fwd)(ft_backend *be, float *out, float *lse, const float *q,
                         const float *k, const float *v, const int32_t *seq_start,
                         int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale);
    /* dq (T, H, D), dk and dv (T, Hkv, D) are overwritten with the gradients given dout
     * (T, H, D) and the forward's q, k, v, out and lse. */
    int (*attention_bwd)(ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v, const float *out,
                         const float *lse, const int32_t *seq_start, int64_t T, int64_t H,
                         int64_t Hkv, int64_t D, float scale);

    /* ---- SwiGLU (Shazeer 2020): h = silu(gate) * up, elementwise over n ------------- */
    int (*swiglu_fwd)(ft_backend *be, float *h, const float *gate, const float *up, int64_t n);
    /* dgate, dup (n) overwritten from dh (n) and the forward inputs. */
    int (*swiglu_bwd)(ft_backend *be, float *dgate, float *dup, const float *dh,
                      const float *gate, const float *up, int64_t n);

    /* ---- dropout (LoRA input dropout) --------------------------------------------- */
    /* y (n) = x * keep / (1 - p), keep[i] = hash(seed, i) >= p: a counter-based mask, so
     * the backward is the same call on the gradient with the same seed. p = 0 copies.
     * hash: kernels/cpu/cpu_common.h (splitmix64 of splitmix64(seed) ^ i). */
    int (*dropout)(ft_backend *be, float *y, const float *x, int64_t n, float p, uint64_t seed);

    /* ---- NEFTune noise (Jain et al. 2023, "NEFTune: Noisy Embeddings Improve Instruction
     * Finetuning", arXiv 2310.05914; transformers' neftune_post_forward_hook) ------------ */
    /* x (n) += mag * u_i in place, u_i uniform in [-1, 1) from a counter-based hash of
     * (seed, i): key = splitmix64_mix(seed), u_i = (splitmix64_mix(key ^ i) >> 40) * 2^-23 - 1
     * (kernels/cpu/cpu_common.h ft_noise_uniform: the dropout hash family, 24 random bits,
     * u_i exact in fp32), then two fp32 roundings: d = mag * u_i, x[i] = x[i] + d (no fused
     * multiply-add), so every backend gives the same bits. mag (units of x) >= 0 and finite,
     * else FT_E_INVALID; mag = 0 or n = 0 leaves x unchanged. The executor adds it to the
     * embeddings of a training micro-batch with mag = alpha / sqrt(seq_len * hidden_size). */
    int (*noise_uniform_add)(ft_backend *be, float *x, int64_t n, float mag, uint64_t seed);

    /* ---- LM head + cross-entropy, chunked (never the full (T, V) logits) ------------ */
    /* For rows t with targets[t] >= 0 (ignore index -100 otherwise), logits = x[t] W^T,
     * W (V, C). *loss_sum receives sum over those rows of logsumexp(logits) -
     * logits[target] (double), *n_valid their count. If dx (T, C) is non-NULL it is
     * overwritten with grad_scale * (softmax(logits) - onehot(target)) W for valid rows
     * and 0 elsewhere. scratch holds chunk * V floats; rows are processed chunk at a
     * time. A target >= V -> FT_E_INVALID. */
    int (*lm_head_ce)(ft_backend *be, double *loss_sum, int64_t *n_valid, float *dx,
                      const float *x, const float *W, const int32_t *targets, int64_t T,
                      int64_t C, int64_t V, float grad_scale, float *scratch, int64_t chunk);
    /* logits (T, V) = x (T, C) W^T, for eval/generation/tests on small T. */
    int (*lm_head_logits)(ft_backend *be, float *logits, const float *x, const float *W,
                          int64_t T, int64_t C, int64_t V);
    /* lm_head_logits with W (V, C) stored as bf16 (FT_WTYPE_BF16's uint16_t, widened to fp32
     * exactly), as a pack keeps the LM head (offload/pack.h): half the bytes a decoded token
     * reads. For T <= FT_LM_HEAD_BF16_ROWS the logits are bit for bit lm_head_logits' on the
     * widened W (the CPU: both run kernels/cpu/rows_f32.h's few-rows kernel, the same sums);
     * for more rows each row is still that kernel's (a row's logits do not depend on T), where
     * lm_head_logits switches to a GEMM, so callers wanting lm_head_logits' bits keep to
     * FT_LM_HEAD_BF16_ROWS. NULL on backends without it (CUDA, the cpu-device mode): callers
     * check, and read an fp32 W through lm_head_logits instead. */
    int (*lm_head_logits_bf16)(ft_backend *be, float *logits, const float *x, const uint16_t *W,
                               int64_t T, int64_t C, int64_t V);

    /* ---- optimizer ---------------------------------------------------------------- */
    /* AdamW (Loshchilov & Hutter 2019, decoupled weight decay, as torch.optim.AdamW):
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * wd * p;
     * p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps). step >= 1. */
    int (*adamw)(ft_backend *be, float *p, const float *g, float *m, float *v, int64_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);

    /* ---- attention against a KV cache (generation, forward only) ------------------- */
    /* n_q new query tokens of one sequence at absolute positions [p, p + n_q), against
     * the keys/values of positions [0, p + n_q) held in a cache whose rows p .. p+n_q-1
     * already hold the new tokens' own (RoPE-rotated) k and v. Query row i attends to
     * key rows j <= p + i (causal). out (n_q, H, D) = softmax(scale * q k^T) v with
     * q (n_q, H, D), k and v (p + n_q, Hkv, D) (rows contiguous); query head h uses kv
     * head h / (H / Hkv). With p = 0 the result is attention_fwd's on one sequence of n_q
     * tokens (up to rounding: the summation order differs). No lse, no backward.
     * p < 0, n_q < 0, H % Hkv != 0, D outside 1..1024 -> FT_E_INVALID. */
    int (*attention_kv_fwd)(ft_backend *be, float *out, const float *q, const float *k,
                            const float *v, int64_t p, int64_t n_q, int64_t H, int64_t Hkv,
                            int64_t D, float scale);

    /* ---- host memory placement (offload/pinned.h; with the transfers above) ------------ */
    /* Page-locks host memory allocated elsewhere (page-aligned, e.g. mmap'd on a chosen NUMA
     * node: offload/pinned.h) so the device copies it at full bus speed, as host_alloc's
     * (CUDA: cudaHostRegister, portable); host_unregister undoes it before the memory is
     * unmapped. A host-memory backend does nothing (returns 0). Setup only. Returns 0,
     * -ENOMEM or -EIO. */
    int (*host_register)(ft_backend *be, void *p, size_t bytes);
    void (*host_unregister)(ft_backend *be, void *p); /* NULL-safe */
    /* The device's PCI address as /sys/bus/pci/devices names it ("0000:3b:00.0", lower case)
     * into buf (n >= 16), for its NUMA node. Returns 0, or FT_E_UNSUPPORTED where there is no
     * device (a host-memory backend) or -EIO. */
    int (*device_pci_id)(ft_backend *be, char *buf, size_t n);

    /* ---- fused ops (issue 34; docs/gpu.md "Fused kernels") ----------------------------- */
    /* AdamW (the adamw entry's formula, step and betas shared) over n_seg tensors seg[0..n_seg),
     * each at its own lr. The CPU: adamw on each segment in turn. CUDA without
     * FT_CUDA_FUSED_ADAMW (the default): the same loop over its adamw; with it, one launch per
     * FT_ADAMW_MULTI_LAUNCH segments (kernels/cuda/adamw_multi.cu), bit-identical to the CPU's
     * adamw (no FMA contraction; the CUDA adamw's own kernel may differ in the last bit). seg
     * is host memory, its pointers backend memory; segments must not overlap. n_seg < 0, a segment with n < 0, or a NULL pointer with n > 0 ->
     * FT_E_INVALID. NULL on backends without it (callers loop over adamw). */
    int (*adamw_multi)(ft_backend *be, const ft_adamw_seg *seg, int64_t n_seg, float beta1,
                       float beta2, float eps, float weight_decay, int64_t step);
    /* The bf16 activation ops below take and give bf16 (uint16_t, FT_WTYPE_BF16's rounding) with
     * fp32 arithmetic; C % 8 == 0 (and 16-byte aligned rows on CUDA) for the row ops, else
     * FT_E_INVALID. CPU: kernels/cpu/bf16_ops.c (the twins); CUDA: kernels/cuda/bf16_ops.cu.
     * No caller yet (the bf16 executor is issue 34 item 1); NULL where absent.
     *
     * Residual add + RMSNorm, forward: h = bf16(x + res) (res NULL: h = x), stored in h_out
     * (the new residual stream, may equal res or x); rstd (T) = 1 / sqrt(mean(h^2) + eps) over
     * the bf16 h, fp32; y = bf16(h * rstd * w) with w (C) fp32. The row sum of squares is a
     * fixed order (32 partial sums, lane l taking 8-element groups l, l + 32, ..., then a
     * butterfly), the same on the CPU twin and CUDA: bit-identical results. */
    int (*add_rmsnorm_bf16_fwd)(ft_backend *be, uint16_t *h_out, uint16_t *y, float *rstd,
                                const uint16_t *x, const uint16_t *res, const float *w,
                                int64_t T, int64_t C, float eps);
    /* Backward of add_rmsnorm_bf16_fwd: dres_out = bf16(dres + rstd w dy - h rstd^3 mean(dy w h))
     * (the gradient of both x and res; dres NULL: no residual gradient from above); may equal
     * dres. h is the forward's h_out. Same fixed-order row sums: bit-identical on both. */
    int (*add_rmsnorm_bf16_bwd)(ft_backend *be, uint16_t *dres_out, const uint16_t *dy,
                                const uint16_t *dres, const uint16_t *h, const float *w,
                                const float *rstd, int64_t T, int64_t C);
    /* RoPE (rope_fwd's rotate-half formula, cos/sin of pos * inv_freq in double) on q (T, H, D)
     * and k (T, Hkv, D) in place in one pass; inverse = 1 rotates by -angle (the backward on
     * dq, dk). Each output is bf16 of an fp32 expression of bf16 inputs: equal on both up to
     * the device's double sin/cos (one bf16 rounding, plus cancellation near zero:
     * tests/gpu/test_cuda_fused.c TOL_*). */
    int (*rope_qk_bf16)(ft_backend *be, uint16_t *q, uint16_t *k, const int32_t *pos,
                        const float *inv_freq, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        int inverse);
    /* SwiGLU (swiglu_fwd's formula) on bf16: h = bf16(silu(g) u), silu(g) = g / (1 + exp(-g));
     * backward dgate = bf16(dh u s (1 + g (1 - s))), dup = bf16(dh g s), s = 1 / (1 + exp(-g)).
     * Equal on both up to the device's expf (as rope_qk_bf16). Outputs may equal inputs. */
    int (*swiglu_bf16_fwd)(ft_backend *be, uint16_t *h, const uint16_t *gate, const uint16_t *up,
                           int64_t n);
    int (*swiglu_bf16_bwd)(ft_backend *be, uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                           const uint16_t *gate, const uint16_t *up, int64_t n);
    /* Device services behind the backend-neutral functions below (kernels/backend.c
     * dispatches on these entries, never on the name); NULL: what a host-memory backend does.
     * mem_info: the device memory free and total in bytes (ft_backend_mem_free; NULL: the
     * machine's physical memory). sync: waits for all queued work (ft_backend_sync; NULL:
     * nothing is queued). profile / profile_report: per-op timing (ft_backend_profile,
     * ft_backend_profile_report; NULL: FT_E_UNSUPPORTED). */
    int (*mem_info)(ft_backend *be, size_t *free_bytes, size_t *total_bytes);
    int (*sync)(ft_backend *be);
    int (*profile)(ft_backend *be, int on);
    int (*profile_report)(ft_backend *be, char *buf, size_t n, int reset);
} ft_backend_ops;

/* Segments adamw_multi's CUDA kernel takes in one launch (its table is a kernel parameter). */
#define FT_ADAMW_MULTI_LAUNCH 512

/* ft_backend_tune.attn: the CUDA attention kernels (kernels/cuda/attn_gemm.cu attn_route):
 * AUTO the tensor-core ones of attn_mma.cu where they take the shape, else attn_gemm.cu's;
 * GEMM attn_gemm.cu's always; FLASH attn.cu's fp32 kernels (head dim <= 256). */
enum ft_attn_kernels { FT_ATTN_AUTO = 0, FT_ATTN_GEMM = 1, FT_ATTN_FLASH = 2 };
/* ft_backend_tune.nf4_gemm: how a device backend's executor multiplies by NF4 projections:
 * dequantized into a bf16 staging copy at each layer visit, then the bf16 GEMM; or the
 * backend's dequant-fused GEMM (FT_WTYPE_NF4), no bf16 copy; or auto: the placer's probe times
 * one layer both ways and keeps the faster, when their outputs agree (offload/place.h). */
enum ft_nf4_gemm { FT_NF4_GEMM_DEQUANT = 0, FT_NF4_GEMM_FUSED = 1, FT_NF4_GEMM_AUTO = 2 };
/* ft_backend_tune.ckpt_host: where the offload placer (offload/place.c) puts layer-input
 * checkpoints: LAST_RESORT in host memory only when the run does not fit otherwise; ALWAYS in
 * host memory (tests); AUTO where the predicted step is faster. */
enum ft_ckpt_host { FT_CKPT_HOST_LAST_RESORT = 0, FT_CKPT_HOST_ALWAYS = 1, FT_CKPT_HOST_AUTO = 2 };

/* Choices of kernels and placement that the program may set for a backend (cli/env.c reads
 * them from FTUNE_ATTN, FTUNE_NF4_GEMM, FTUNE_GEN_HEAD and FTUNE_CKPT_HOST; the library reads
 * no environment). All zero (a new backend's): the defaults. */
typedef struct ft_backend_tune {
    int attn;         /* enum ft_attn_kernels */
    int nf4_gemm;     /* enum ft_nf4_gemm, as asked (offload/exec.h ft_exec_nf4_gemm_mode) */
    int gen_head_f32; /* 1: a pack-only model's embeddings and LM head in fp32 on a host-memory
                       * backend, not in bf16 (offload/tiers.c ft_exec_globals_from_pack) */
    int ckpt_host;    /* enum ft_ckpt_host */
} ft_backend_tune;

struct ft_backend {
    const ft_backend_ops *ops;
    void *ctx;     /* backend-private state (thread count, handles, streams) */
    ft_backend_tune tune; /* zero at init; set by the session (offload/session.h) or the caller */
};

/* CPU backend: n_threads <= 0 means "all cores". n_threads sizes the OpenMP team;
 * OpenBLAS is set to one thread and the gemm op splits its output over the team (so results
 * are bit-identical for any thread count).
 * Returns 0 or -ENOMEM. */
int ft_backend_cpu_init(ft_backend **out, int n_threads);
/* The CPU backend in device mode ("cpu-device", kernels/cpu/cpu_device.c): host_memory = 0, so
 * the offload executor runs its device path on it (base weights copied in, packed bases by
 * tier through slots and the disk read-ahead, host checkpoints over copy_async and events),
 * with bf16 weights in linear_fwd/linear_bwd_x (the activation rounded to bf16 as the CUDA
 * backend does, fp32 sums) and dequant_nf4 to bf16 (src/numeric/nf4.c's arithmetic). Copies run
 * at once; events are host times. For tests of the device executor without a GPU. Returns 0
 * or -ENOMEM. */
int ft_backend_cpu_device_init(ft_backend **out, int n_threads);
/* A cpu-device backend's "device memory" (what ft_backend_mem_free reports for it): total =
 * the machine's physical memory, free = total less the bytes the backend's alloc holds. So a
 * --gpu-mem budget sees what the run placed, as on a GPU. Returns 0, FT_E_INVALID (not a
 * cpu-device backend), -EIO. */
int ft_backend_cpu_device_mem(ft_backend *be, size_t *free_bytes, size_t *total_bytes);
/* Makes a cpu-device backend's H2D and D2H lanes asynchronous: one worker thread each runs
 * its copies (and event marks and waits) in order, each lag_us microseconds late, beside the
 * compute on the calling thread, so a transfer the executor does not order by events shows in
 * the results. Once, before any use. Returns 0, FT_E_INVALID (not cpu-device, or already set)
 * or -ENOMEM. */
int ft_backend_cpu_device_set_lag(ft_backend *be, long lag_us);

/* CUDA backend (kernels/cuda) on GPU `device`: one stream, one cuBLAS handle and a 96 MiB
 * workspace, all created here (the ops never allocate). GEMMs use bf16 tensor cores with
 * fp32 accumulation unless set precise. Returns 0, FT_E_UNSUPPORTED (no GPU visible, or
 * ftune built without nvcc), FT_E_INVALID (no such device), -ENOMEM, -EIO (CUDA errors). */
int ft_backend_cuda_init(ft_backend **out, int device);
/* precise = 1: fp32 GEMMs in full fp32 (CUBLAS_COMPUTE_32F) instead of bf16 tensor cores. */
int ft_backend_cuda_set_precise(ft_backend *be, int precise);
/* The fused kernels the CUDA backend uses where an op has both (off by default: they are
 * verified on the CPU emulation, not yet measured on a GPU; docs/gpu.md). mask: FT_CUDA_FUSED_*
 * bits. Returns 0, FT_E_INVALID (not a CUDA backend, unknown bit), FT_E_UNSUPPORTED (built
 * without CUDA). */
#define FT_CUDA_FUSED_ADAMW 1u /* adamw_multi: one launch (else the loop over adamw) */
#define FT_CUDA_FUSED_ALL FT_CUDA_FUSED_ADAMW
int ft_backend_cuda_set_fused(ft_backend *be, unsigned mask);
/* Bytes of backend memory free now (CUDA: cudaMemGetInfo; CPU: available physical memory
 * from sysconf). Returns 0 or -EIO. */
int ft_backend_mem_free(ft_backend *be, size_t *free_bytes, size_t *total_bytes);

/* The backend memory a run may still take, from ft_backend_mem_free: *budget = gpu_mem bytes
 * (> 0: --gpu-mem) or the device's total, less reserve (bytes the caller allocates later);
 * *used = what is in use now; *avail = *budget - *used, never more than is free less
 * reserve, 0 when nothing is left; *total = the device's total. Returns 0 or -EIO. */
typedef struct ft_mem_budget { size_t used, budget, avail, total; } ft_mem_budget;
int ft_backend_mem_budget(ft_backend *be, int64_t gpu_mem, size_t reserve, ft_mem_budget *b);
/* Per-op GPU timing (CUDA only): on = 1 routes every op through event-timed wrappers (no
 * synchronization per op), on = 0 restores the plain table. The report is a text table of
 * GPU milliseconds per op, largest first, written into buf; reset = 1 zeroes the sums.
 * FT_E_UNSUPPORTED on the CPU backend. */
int ft_backend_profile(ft_backend *be, int on);
int ft_backend_profile_report(ft_backend *be, char *buf, size_t n, int reset);
/* Waits for the backend's queued work (no-op on the CPU). Returns 0 or -EIO. */
int ft_backend_sync(ft_backend *be);

/* The backend named by `device`: "cpu", "cuda" (GPU 0), "cuda:N", "cpu-device" (the CPU backend
 * in device mode, ft_backend_cpu_device_init: tests of the GPU paths), or "auto"/NULL (CUDA
 * when a GPU is visible, else CPU). n_threads is the CPU thread count (cpu_init's rule).
 * Returns 0 or the chosen backend's init error (FT_E_INVALID for an unknown name). */
int ft_backend_init(ft_backend **out, const char *device, int n_threads);
void ft_backend_free(ft_backend *be); /* NULL-safe */

#ifdef __cplusplus
}
#endif

#endif
