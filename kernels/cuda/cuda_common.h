/* cuda_common.h - the CUDA backend's private context and helpers (kernels/cuda only).
 *
 * Everything a CUDA op needs (stream, cuBLAS handle, a preallocated workspace) lives in one
 * ft_cuda_ctx passed explicitly (be->ctx); there are no globals. Ops enqueue work on
 * cx->stream and return without synchronizing; copies to host memory synchronize.
 * Launch errors are checked after every launch (FT_CUDA_LAUNCH) and reported through ft_err.
 */
#ifndef FT_CUDA_COMMON_H
#define FT_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_entry.h" /* the kernels outside the op table */
#include "kernels/kernels.h"
#include "src/core/err.h"

/* cuBLAS entry points, resolved with dlopen/dlsym when a CUDA backend is created (blas_dl in
 * backend.cu), so a CPU-only run never loads the library (hundreds of MB of mappings) and a
 * machine without it still runs ftune on the CPU. */
typedef struct ft_cublas {
    void *lib;
    cublasStatus_t (*Create)(cublasHandle_t *);
    cublasStatus_t (*Destroy)(cublasHandle_t);
    cublasStatus_t (*SetStream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*SetMathMode)(cublasHandle_t, cublasMath_t);
    cublasStatus_t (*SetWorkspace)(cublasHandle_t, void *, size_t);
    const char *(*GetStatusString)(cublasStatus_t);
    cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                             const void *, const void *, cudaDataType, int, const void *,
                             cudaDataType, int, const void *, void *, cudaDataType, int,
                             cublasComputeType_t, cublasGemmAlgo_t);
    cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                           int, int, int, const void *, const void *,
                                           cudaDataType, int, long long int, const void *,
                                           cudaDataType, int, long long int, const void *, void *,
                                           cudaDataType, int, long long int, int,
                                           cublasComputeType_t, cublasGemmAlgo_t);
} ft_cublas;

typedef struct ft_cuda_ctx {
    ft_cublas bl;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    /* Workspace for ops that need temporaries (attention backward's row sums, reductions):
     * allocated once at init, never in the step loop. */
    void *work;
    size_t work_bytes;
    double *d_sum;          /* one double in device memory (sumsq, lm_head_ce loss) */
    int64_t *d_count;       /* one int64 in device memory (lm_head_ce valid rows) */
    int n_sm;               /* multiprocessor count */
    int gemm_bf16;          /* 1: fp32 GEMMs use bf16 tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF) */
    void *prof;             /* per-op timing state (profile.cu), NULL when never enabled */
    void *attn;             /* attention workspace (attn_gemm.cu), sized by prepare */
    size_t attn_bytes;
    int32_t *ss_host;       /* host copy of seq_start (attention tile plan) */
    int64_t ss_cap;
    /* Copy lanes (kernels.h enum ft_stream): lane[FT_STREAM_COMPUTE] is `stream`; H2D and D2H
     * copies run on their own streams so they overlap compute. Events are created on first
     * record (timing enabled: event_elapsed). */
    cudaStream_t lane[FT_N_LANES];
    cudaEvent_t ev[FT_MAX_EVENTS];
    unsigned fused;         /* FT_CUDA_FUSED_* bits (ft_backend_cuda_set_fused): 0 by default */
} ft_cuda_ctx;

#define FT_CUDA_CTX(be) ((ft_cuda_ctx *)(be)->ctx)

#ifdef __cplusplus
extern "C" {
#endif
/* Turns a CUDA runtime status into -EIO (or -ENOMEM for cudaErrorMemoryAllocation) with one ft_err line naming `what`. */
int ft_cuda_status(cudaError_t st, const char *what, const char *file, int line);
int ft_cuda_blas_status(const ft_cublas *bl, cublasStatus_t st, const char *what, const char *file,
                        int line);

void ft_cuda_profile_free(ft_cuda_ctx *cx);
/* Sizes the attention workspace for up to T tokens (the op table's prepare). */
int ft_cuda_attn_prepare(ft_backend *be, int64_t T, int64_t H, int64_t Hkv, int64_t D);

/* Attention (kernels/cuda/attn.cu): the op-table entries of kernels.h, same contracts. */
int ft_cuda_attention_fwd(ft_backend *be, float *out, float *lse, const float *q, const float *k,
                          const float *v, const int32_t *seq_start, int64_t T, int64_t H,
                          int64_t Hkv, int64_t D, float scale);
int ft_cuda_attention_bwd(ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, const float *k, const float *v, const float *out,
                          const float *lse, const int32_t *seq_start, int64_t T, int64_t H,
                          int64_t Hkv, int64_t D, float scale);
/* The fused ops (kernels.h, same contracts): adamw_multi.cu, bf16_ops.cu. */
int ft_cuda_adamw_multi(ft_backend *be, const ft_adamw_seg *seg, int64_t n_seg, float beta1,
                        float beta2, float eps, float weight_decay, int64_t step);
int ft_cuda_add_rmsnorm_bf16_fwd(ft_backend *be, uint16_t *h_out, uint16_t *y, float *rstd,
                                 const uint16_t *x, const uint16_t *res, const float *w, int64_t T,
                                 int64_t C, float eps);
int ft_cuda_add_rmsnorm_bf16_bwd(ft_backend *be, uint16_t *dres_out, const uint16_t *dy,
                                 const uint16_t *dres, const uint16_t *h, const float *w,
                                 const float *rstd, int64_t T, int64_t C);
int ft_cuda_rope_qk_bf16(ft_backend *be, uint16_t *q, uint16_t *k, const int32_t *pos,
                         const float *inv_freq, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                         int inverse);
int ft_cuda_swiglu_bf16_fwd(ft_backend *be, uint16_t *h, const uint16_t *gate, const uint16_t *up,
                            int64_t n);
int ft_cuda_swiglu_bf16_bwd(ft_backend *be, uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                            const uint16_t *gate, const uint16_t *up, int64_t n);
#ifdef __cplusplus
}
#endif

#define FT_CUDA_TRY(call) do { cudaError_t st_ = (call); \
    if (st_ != cudaSuccess) return ft_cuda_status(st_, #call, __FILE__, __LINE__); } while (0)
/* cx->bl.NAME(...) with the status checked; needs a ft_cuda_ctx *cx in scope. */
#define FT_BLAS_TRY(call) do { cublasStatus_t st_ = (call); \
    if (st_ != CUBLAS_STATUS_SUCCESS) return ft_cuda_blas_status(&cx->bl, st_, #call, __FILE__, __LINE__); } while (0)
/* After a <<<>>> launch: a bad configuration or an earlier asynchronous fault. */
#define FT_CUDA_LAUNCH(name) FT_CUDA_TRY(cudaGetLastError())

#ifdef __CUDACC__
/* Block-wide reductions in a fixed tree order over sh (blockDim.x entries, a power of two);
 * every thread gets the result. Used by row-wise kernels (RMSNorm, cross-entropy, sums). */
template <typename V, typename Op>
__device__ __forceinline__ V ft_block_reduce(V v, V *sh, Op op)
{
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = op(sh[t], sh[t + s]);
        __syncthreads();
    }
    V r = sh[0];
    __syncthreads();
    return r;
}
struct ft_op_add { template <typename V> __device__ V operator()(V a, V b) const { return a + b; } };
struct ft_op_max { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
#endif

/* The tensor-core attention (attn_mma.cu): its grid's y dimension counts 64-row query tiles,
 * so T is at most this; the op table (attn_gemm.cu) routes longer calls elsewhere. */
#define FT_CUDA_MMA_T_MAX ((int64_t)65535 * 64)

/* The index of the first of p[0..n) that is not 16-byte aligned (float4 access), or -1. */
static inline int ft_cuda_misaligned16(const void *const *p, int n)
{
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] & 15) return i;
    return -1;
}

static inline unsigned ft_cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

#endif
