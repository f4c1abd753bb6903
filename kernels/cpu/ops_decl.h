/* ops_decl.h - declaration template of the CPU ops for one element type.
 *
 * Not a normal header: it has no include guard and is included once per instantiation by
 * cpu_f32.h (FT_CPU_REAL float, FT_CPU_SUFFIX f32) and cpu_f64.h (double, f64), which
 * define the two macros around the #include. The bodies live in ops_impl.h and
 * attn_impl.h, compiled once per type by ops_f32.c and ops_f64.c (STYLE: "dtype is a
 * parameter or a template instance, never a copied file").
 *
 * Every function has the semantics of the op-table entry of the same name in
 * kernels/kernels.h (shapes, layouts, "accumulates into" rules) without the ft_backend
 * argument, with REAL in place of float. All of them return 0 or FT_E_INVALID (with an
 * ft_err() line naming the op, the argument, what was expected and what was found). The
 * f32 instance is what the CPU backend's op table calls; the f64 instance (gemm through
 * cblas_dgemm) exists for the finite-difference and reference tests.
 *
 * Extra argument rules shared by both instances:
 *   - pointers may be NULL only when the element count they cover is 0;
 *   - attention: H % Hkv == 0, 1 <= D <= FT_CPU_MAX_HEAD_DIM, seq_start must describe
 *     contiguous sequences: seq_start[0] == 0 and for t > 0 either seq_start[t] == t (a
 *     new sequence starts) or seq_start[t] == seq_start[t-1];
 *   - rope: D even, D <= FT_CPU_MAX_HEAD_DIM;
 *   - gemm: every size and stride fits a 32-bit BLAS int, strides >= the row length;
 *   - dropout: 0 <= p < 1;  adamw: step >= 1;  lm_head_ce: chunk >= 1;
 *   - outputs do not overlap inputs, except in place on the same elements where an op is
 *     elementwise (axpy, scale, swiglu_fwd/bwd, dropout) or in place by definition (rope).
 *
 * Threading: loops run on the calling thread's OpenMP team; gemm splits C over the team
 * and attention calls BLAS on tiles from inside its parallel loops, both assuming the
 * single-threaded OpenBLAS that ft_backend_cpu_init sets (with a multi-threaded one they
 * are still correct, only slower, and gemm is then one BLAS call). Under that setting the
 * results are bit-identical for any OpenMP thread count (tested).
 * No op allocates: scratch is on the stack (at most ~40 KB per thread in the fp64
 * instance: attention tiles, RoPE cos/sin tables) or passed in (lm_head_ce).
 */
#if !defined(FT_CPU_REAL) || !defined(FT_CPU_SUFFIX)
#error "define FT_CPU_REAL and FT_CPU_SUFFIX before including ops_decl.h"
#endif

#include <stddef.h>
#include <stdint.h>

#ifndef FT_CPU_MAX_HEAD_DIM
#define FT_CPU_MAX_HEAD_DIM 1024 /* bound on head_dim D (RoPE cos/sin tables on the stack) */
#endif

#define FT_CPU_CAT2_(a, b) a##_##b
#define FT_CPU_CAT2(a, b) FT_CPU_CAT2_(a, b)
#define FT_CPU_FN(name) FT_CPU_CAT2(ft_cpu_##name, FT_CPU_SUFFIX)

int FT_CPU_FN(gemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                    FT_CPU_REAL alpha, const FT_CPU_REAL *a, int64_t lda,
                    const FT_CPU_REAL *b, int64_t ldb, FT_CPU_REAL beta, FT_CPU_REAL *c,
                    int64_t ldc);
int FT_CPU_FN(axpy)(FT_CPU_REAL alpha, const FT_CPU_REAL *x, FT_CPU_REAL *y, int64_t n);
int FT_CPU_FN(scale)(FT_CPU_REAL *x, FT_CPU_REAL alpha, int64_t n);
/* Deterministic: the summation order depends on n only, not on the thread count. */
int FT_CPU_FN(sumsq)(double *out, const FT_CPU_REAL *x, int64_t n);
int FT_CPU_FN(bias_add)(FT_CPU_REAL *y, const FT_CPU_REAL *bias, int64_t T, int64_t O);

int FT_CPU_FN(embedding_fwd)(FT_CPU_REAL *out, const int32_t *ids, const FT_CPU_REAL *table,
                             int64_t T, int64_t C, int64_t V);

int FT_CPU_FN(rmsnorm_fwd)(FT_CPU_REAL *y, FT_CPU_REAL *rstd, const FT_CPU_REAL *x,
                           const FT_CPU_REAL *w, int64_t T, int64_t C, FT_CPU_REAL eps);
int FT_CPU_FN(rmsnorm_bwd)(FT_CPU_REAL *dx, const FT_CPU_REAL *dy, const FT_CPU_REAL *x,
                           const FT_CPU_REAL *w, const FT_CPU_REAL *rstd, int64_t T,
                           int64_t C);

int FT_CPU_FN(rope_fwd)(FT_CPU_REAL *x, const int32_t *pos, const FT_CPU_REAL *inv_freq,
                        int64_t T, int64_t H, int64_t D);
int FT_CPU_FN(rope_bwd)(FT_CPU_REAL *dx, const int32_t *pos, const FT_CPU_REAL *inv_freq,
                        int64_t T, int64_t H, int64_t D);

int FT_CPU_FN(attention_fwd)(FT_CPU_REAL *out, FT_CPU_REAL *lse, const FT_CPU_REAL *q,
                             const FT_CPU_REAL *k, const FT_CPU_REAL *v,
                             const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, FT_CPU_REAL scale);
int FT_CPU_FN(attention_bwd)(FT_CPU_REAL *dq, FT_CPU_REAL *dk, FT_CPU_REAL *dv,
                             const FT_CPU_REAL *dout, const FT_CPU_REAL *q,
                             const FT_CPU_REAL *k, const FT_CPU_REAL *v,
                             const FT_CPU_REAL *out, const FT_CPU_REAL *lse,
                             const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, FT_CPU_REAL scale);

int FT_CPU_FN(swiglu_fwd)(FT_CPU_REAL *h, const FT_CPU_REAL *gate, const FT_CPU_REAL *up,
                          int64_t n);
int FT_CPU_FN(swiglu_bwd)(FT_CPU_REAL *dgate, FT_CPU_REAL *dup, const FT_CPU_REAL *dh,
                          const FT_CPU_REAL *gate, const FT_CPU_REAL *up, int64_t n);

/* The keep mask depends on (seed, i, p) only, identically in both instances. */
int FT_CPU_FN(dropout)(FT_CPU_REAL *y, const FT_CPU_REAL *x, int64_t n, FT_CPU_REAL p,
                       uint64_t seed);

int FT_CPU_FN(lm_head_ce)(double *loss_sum, int64_t *n_valid, FT_CPU_REAL *dx,
                          const FT_CPU_REAL *x, const FT_CPU_REAL *W, const int32_t *targets,
                          int64_t T, int64_t C, int64_t V, FT_CPU_REAL grad_scale,
                          FT_CPU_REAL *scratch, int64_t chunk);
int FT_CPU_FN(lm_head_logits)(FT_CPU_REAL *logits, const FT_CPU_REAL *x, const FT_CPU_REAL *W,
                              int64_t T, int64_t C, int64_t V);

int FT_CPU_FN(adamw)(FT_CPU_REAL *p, const FT_CPU_REAL *g, FT_CPU_REAL *m, FT_CPU_REAL *v,
                     int64_t n, FT_CPU_REAL lr, FT_CPU_REAL beta1, FT_CPU_REAL beta2,
                     FT_CPU_REAL eps, FT_CPU_REAL weight_decay, int64_t step);

#undef FT_CPU_FN
#undef FT_CPU_CAT2
#undef FT_CPU_CAT2_
