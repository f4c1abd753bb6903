/* backend.cu - the CUDA backend: context, memory, GEMMs (cuBLAS) and the elementwise and
 * row-wise ops of the op table (kernels/kernels.h). Attention lives in attn.cu, the LM head
 * in lmhead.cu.
 *
 * Numerics: buffers are fp32 as the op table says. GEMMs run on the tensor cores with bf16
 * inputs and fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS rounds each fp32
 * operand to bf16 inside the kernel), or in full fp32 (CUBLAS_COMPUTE_32F) when the context
 * is set precise (tests, ft_backend_cuda_set_precise). Reductions (RMSNorm rows, the gradient
 * norm) run in a fixed order, so results do not depend on scheduling: the same inputs give
 * the same bits on the same GPU.
 * Every op is enqueued on the context's stream; copies to or from host memory synchronize.
 */
#define FT_HD __host__ __device__
#include "kernels/cpu/cpu_common.h"
#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define WORK_BYTES ((size_t)64 << 20)     /* ctx->work: attention row sums, partial sums */
#define BLAS_WORK_BYTES ((size_t)32 << 20) /* cuBLAS workspace, given to the handle once */

extern "C" int ft_cuda_status(cudaError_t st, const char *what, const char *file, int line)
{
    int code = st == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
    return ft_err(code, "cuda: %s: %s (%s:%d)", what, cudaGetErrorString(st), file, line);
}

extern "C" int ft_cuda_blas_status(const ft_cublas *bl, cublasStatus_t st, const char *what,
                                   const char *file, int line)
{
    int code = st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
    const char *msg = bl && bl->GetStatusString ? bl->GetStatusString(st) : "cuBLAS error";
    return ft_err(code, "cublas: %s: %s (status %d) (%s:%d)", what, msg, (int)st, file, line);
}

/* Loads cuBLAS and resolves the entry points ftune uses (their _v2 names where cublas_v2.h
 * macros rename them). Returns 0 or FT_E_UNSUPPORTED naming the library or symbol. */
static int blas_dl(ft_cublas *bl)
{
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !bl->lib; i++)
        bl->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!bl->lib)
        return ft_err(FT_E_UNSUPPORTED, "cuda: cannot load cuBLAS (libcublas.so.13): %s", dlerror());
#define SYM(field, name) \
    if (!(*(void **)&bl->field = dlsym(bl->lib, name))) \
        return ft_err(FT_E_UNSUPPORTED, "cuda: cuBLAS lacks %s", name)
    SYM(Create, "cublasCreate_v2");
    SYM(Destroy, "cublasDestroy_v2");
    SYM(SetStream, "cublasSetStream_v2");
    SYM(SetMathMode, "cublasSetMathMode");
    SYM(SetWorkspace, "cublasSetWorkspace_v2");
    SYM(GetStatusString, "cublasGetStatusString");
    SYM(GemmEx, "cublasGemmEx");
    SYM(GemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
#undef SYM
    return 0;
}

#define CHECK_N(op, n) \
    do { if ((n) < 0) return ft_err(FT_E_INVALID, "cuda %s: %s = %lld, expected >= 0", op, #n, (long long)(n)); } while (0)

/* ---- memory ----------------------------------------------------------------------------- */

static void *cu_alloc(ft_backend *be, size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error state of a failed allocation */
        return NULL;
    }
    return p;
}

static void cu_free(ft_backend *be, void *p)
{
    if (p) cudaFree(p);
}

static int cu_copy(ft_backend *be, void *dst, const void *src, size_t bytes)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (!bytes) return 0;
    FT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cx->stream));
    FT_CUDA_TRY(cudaStreamSynchronize(cx->stream));
    return 0;
}

static int cu_zero(ft_backend *be, void *p, size_t bytes)
{
    if (!bytes) return 0;
    FT_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, FT_CUDA_CTX(be)->stream));
    return 0;
}

/* ---- transfers: pinned host memory, copy lanes, events ----------------------------------- */

static void *cu_host_alloc(ft_backend *be, size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(ft_backend *be, void *p)
{
    if (p) cudaFreeHost(p);
}

static int cu_host_register(ft_backend *be, void *p, size_t bytes)
{
    if (!bytes) return 0;
    cudaError_t st = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (st != cudaSuccess) {
        cudaGetLastError(); /* not sticky: keep it from the next launch check */
        return ft_cuda_status(st, "cudaHostRegister", __FILE__, __LINE__);
    }
    return 0;
}

static void cu_host_unregister(ft_backend *be, void *p)
{
    if (p && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

static int cu_device_pci_id(ft_backend *be, char *buf, size_t n)
{
    char id[64] = "";
    FT_CUDA_TRY(cudaDeviceGetPCIBusId(id, (int)sizeof id, FT_CUDA_CTX(be)->device));
    size_t i = 0;
    for (; id[i] && i + 1 < n; i++) buf[i] = (char)(id[i] >= 'A' && id[i] <= 'Z' ? id[i] - 'A' + 'a' : id[i]);
    if (n) buf[i] = 0;
    return 0;
}

static int lane_ok(int lane)
{
    return lane >= 0 && lane < FT_N_LANES;
}

static int cu_copy_async(ft_backend *be, int lane, void *dst, const void *src, size_t bytes)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (!lane_ok(lane)) return ft_err(FT_E_INVALID, "cuda copy_async: lane %d", lane);
    if (!bytes) return 0;
    FT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cx->lane[lane]));
    return 0;
}

static int cu_event_record(ft_backend *be, int ev, int lane)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (ev < 0 || ev >= FT_MAX_EVENTS || !lane_ok(lane))
        return ft_err(FT_E_INVALID, "cuda event_record: event %d lane %d", ev, lane);
    if (!cx->ev[ev]) FT_CUDA_TRY(cudaEventCreate(&cx->ev[ev]));
    FT_CUDA_TRY(cudaEventRecord(cx->ev[ev], cx->lane[lane]));
    return 0;
}

static int cu_event_wait(ft_backend *be, int lane, int ev)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (ev < 0 || ev >= FT_MAX_EVENTS || !lane_ok(lane))
        return ft_err(FT_E_INVALID, "cuda event_wait: event %d lane %d", ev, lane);
    if (!cx->ev[ev]) return 0; /* never recorded: nothing to wait for */
    FT_CUDA_TRY(cudaStreamWaitEvent(cx->lane[lane], cx->ev[ev], 0));
    return 0;
}

static int cu_event_sync(ft_backend *be, int ev)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (ev < 0 || ev >= FT_MAX_EVENTS) return ft_err(FT_E_INVALID, "cuda event_sync: event %d", ev);
    if (!cx->ev[ev]) return 0;
    FT_CUDA_TRY(cudaEventSynchronize(cx->ev[ev]));
    return 0;
}

static int cu_event_elapsed(ft_backend *be, int ev0, int ev1, float *ms)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    *ms = 0;
    if (ev0 < 0 || ev0 >= FT_MAX_EVENTS || ev1 < 0 || ev1 >= FT_MAX_EVENTS || !cx->ev[ev0] || !cx->ev[ev1])
        return ft_err(FT_E_INVALID, "cuda event_elapsed: events %d, %d not recorded", ev0, ev1);
    FT_CUDA_TRY(cudaEventElapsedTime(ms, cx->ev[ev0], cx->ev[ev1]));
    return 0;
}

/* ---- GEMM ------------------------------------------------------------------------------- */

/* Row-major C (m, n) = alpha op(A) op(B) + beta C is column-major C^T = op(B)^T op(A)^T:
 * cuBLAS gets B first, with the same transpose flags, and the dimensions n, m, k. */
static int cu_gemm(ft_backend *be, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                   float beta, float *c, int64_t ldc)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    CHECK_N("gemm", m);
    CHECK_N("gemm", n);
    CHECK_N("gemm", k);
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda gemm: a dimension or stride exceeds %d", INT32_MAX);
    if (m == 0 || n == 0) return 0;
    if (ldc < n || lda < (trans_a ? m : k) || ldb < (trans_b ? k : n))
        return ft_err(FT_E_INVALID, "cuda gemm: leading dimensions lda %lld ldb %lld ldc %lld too "
                      "small for m %lld n %lld k %lld", (long long)lda, (long long)ldb,
                      (long long)ldc, (long long)m, (long long)n, (long long)k);
    cublasComputeType_t ct = cx->gemm_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
    FT_BLAS_TRY(cx->bl.GemmEx(cx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                             b, CUDA_R_32F, (int)ldb, a, CUDA_R_32F, (int)lda, &beta, c,
                             CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---- frozen-weight products with bf16 weights --------------------------------------------- */

/* y (n) = bf16(x (n)), round to nearest even; 4 elements per thread where aligned. */
__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, int64_t n)
{
    int64_t n4 = n / 4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = reinterpret_cast<const float4 *>(x)[i];
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        reinterpret_cast<__nv_bfloat162 *>(y)[2 * i] = a;
        reinterpret_cast<__nv_bfloat162 *>(y)[2 * i + 1] = b;
    }
    for (int64_t i = 4 * n4 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(x[i]);
}

static int to_bf16(ft_cuda_ctx *cx, void *dst, const float *x, int64_t n)
{
    if (((uintptr_t)x & 15) || ((uintptr_t)dst & 7))
        return ft_err(FT_E_INVALID, "cuda linear: unaligned activation or scratch buffer");
    k_to_bf16<<<ft_cuda_blocks(n / 4 + 1, 256), 256, 0, cx->stream>>>((__nv_bfloat16 *)dst, x, n);
    FT_CUDA_LAUNCH("to_bf16");
    return 0;
}

static int linear_check(const char *op, int wtype, int64_t T, int64_t out, int64_t in)
{
    if (T < 0 || out < 0 || in < 0 || T > INT32_MAX || out > INT32_MAX || in > INT32_MAX)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, out = %lld, in = %lld", op, (long long)T,
                      (long long)out, (long long)in);
    if (wtype != FT_WTYPE_F32 && wtype != FT_WTYPE_BF16 && wtype != FT_WTYPE_NF4)
        return ft_err(FT_E_UNSUPPORTED, "cuda %s: weight type %d", op, wtype);
    return 0;
}

/* y (T, out) = x W^T + beta y. bf16 W: x is rounded to bf16 in scratch, then one bf16 GEMM
 * with fp32 accumulation and fp32 output (cuBLAS, CUBLAS_COMPUTE_32F). NF4 W (an
 * ft_nf4_tensor): x rounded to bf16 the same way, then the dequant-fused GEMM (nf4_gemm.cu). */
static int cu_linear_fwd(ft_backend *be, float *y, const float *x, const void *W, int wtype,
                         int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(linear_check("linear_fwd", wtype, T, out, in));
    if (wtype == FT_WTYPE_F32)
        return cu_gemm(be, 0, 1, T, out, in, 1.0f, x, in, (const float *)W, in, beta, y, out);
    if (!T || !out) return 0;
    float one = 1.0f;
    FT_TRY(to_bf16(cx, scratch, x, T * in));
    if (wtype == FT_WTYPE_NF4)
        return ft_cuda_nf4_linear_fwd(be, y, (const uint16_t *)scratch, (const ft_nf4_tensor *)W, T,
                                      out, in, beta);
    FT_BLAS_TRY(cx->bl.GemmEx(cx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)T, (int)in, &one, W,
                             CUDA_R_16BF, (int)in, scratch, CUDA_R_16BF, (int)in, &beta, y,
                             CUDA_R_32F, (int)out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* dx (T, in) = dy W + beta dx, as linear_fwd with dy rounded to bf16. */
static int cu_linear_bwd_x(ft_backend *be, float *dx, const float *dy, const void *W, int wtype,
                           int64_t T, int64_t out, int64_t in, float beta, float *scratch)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    FT_TRY(linear_check("linear_bwd_x", wtype, T, out, in));
    if (wtype == FT_WTYPE_F32)
        return cu_gemm(be, 0, 0, T, in, out, 1.0f, dy, out, (const float *)W, in, beta, dx, in);
    if (!T || !in) return 0;
    float one = 1.0f;
    FT_TRY(to_bf16(cx, scratch, dy, T * out));
    if (wtype == FT_WTYPE_NF4)
        return ft_cuda_nf4_linear_bwd_x(be, dx, (const uint16_t *)scratch, (const ft_nf4_tensor *)W,
                                        T, out, in, beta);
    FT_BLAS_TRY(cx->bl.GemmEx(cx->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)in, (int)T, (int)out, &one, W,
                             CUDA_R_16BF, (int)in, scratch, CUDA_R_16BF, (int)out, &beta, dx,
                             CUDA_R_32F, (int)in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---- elementwise -------------------------------------------------------------------------- */

__global__ void k_axpy(float alpha, const float *x, float *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

__global__ void k_scale(float *x, float alpha, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= alpha;
}

static int cu_axpy(ft_backend *be, float alpha, const float *x, float *y, int64_t n)
{
    CHECK_N("axpy", n);
    if (!n) return 0;
    k_axpy<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(alpha, x, y, n);
    FT_CUDA_LAUNCH("axpy");
    return 0;
}

static int cu_scale(ft_backend *be, float *x, float alpha, int64_t n)
{
    CHECK_N("scale", n);
    if (!n) return 0;
    k_scale<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(x, alpha, n);
    FT_CUDA_LAUNCH("scale");
    return 0;
}

/* Sum of squares in two deterministic passes: SUMSQ_BLOCKS blocks each reduce a fixed
 * strided share of x into part[b] (double), then one block sums the parts in order. */
#define SUMSQ_BLOCKS 1024
#define RED_THREADS 256

static __device__ __forceinline__ double block_sum_d(double v, double *sh)
{
    return ft_block_reduce(v, sh, ft_op_add());
}

__global__ void k_sumsq_part(double *part, const float *x, int64_t n)
{
    __shared__ double sh[RED_THREADS];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)RED_THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * RED_THREADS)
        s += (double)x[i] * (double)x[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_parts(double *out, const double *part, int n_part)
{
    __shared__ double sh[RED_THREADS];
    double s = 0;
    for (int i = threadIdx.x; i < n_part; i += RED_THREADS) s += part[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}

static int cu_sumsq(ft_backend *be, double *out, const float *x, int64_t n)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    CHECK_N("sumsq", n);
    double *part = (double *)cx->work;
    k_sumsq_part<<<SUMSQ_BLOCKS, RED_THREADS, 0, cx->stream>>>(part, x, n);
    FT_CUDA_LAUNCH("sumsq");
    k_sum_parts<<<1, RED_THREADS, 0, cx->stream>>>(cx->d_sum, part, SUMSQ_BLOCKS);
    FT_CUDA_LAUNCH("sumsq");
    return cu_copy(be, out, cx->d_sum, sizeof(double));
}

__global__ void k_bias_add(float *y, const float *bias, int64_t T, int64_t O)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * O;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % O];
}

static int cu_bias_add(ft_backend *be, float *y, const float *bias, int64_t T, int64_t O)
{
    CHECK_N("bias_add", T);
    CHECK_N("bias_add", O);
    if (!T || !O) return 0;
    k_bias_add<<<ft_cuda_blocks(T * O, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(y, bias, T, O);
    FT_CUDA_LAUNCH("bias_add");
    return 0;
}

/* ---- embedding ---------------------------------------------------------------------------- */

/* One block per token; an id outside [0, V) records the first such token in *bad. */
__global__ void k_embedding(float *out, const int32_t *ids, const float *table, int64_t C,
                            int64_t V, int64_t *bad)
{
    int64_t t = blockIdx.x;
    int32_t id = ids[t];
    if (id < 0 || id >= V) {
        if (threadIdx.x == 0) atomicMin((unsigned long long *)bad, (unsigned long long)t);
        return;
    }
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) out[t * C + i] = table[(int64_t)id * C + i];
}

static int cu_embedding_fwd(ft_backend *be, float *out, const int32_t *ids, const float *table,
                            int64_t T, int64_t C, int64_t V)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    CHECK_N("embedding_fwd", T);
    CHECK_N("embedding_fwd", C);
    CHECK_N("embedding_fwd", V);
    if (!T) return 0;
    if (T > INT32_MAX) return ft_err(FT_E_INVALID, "cuda embedding_fwd: T = %lld too large", (long long)T);
    int64_t none = INT64_MAX, bad;
    FT_TRY(cu_copy(be, cx->d_count, &none, sizeof none));
    k_embedding<<<(unsigned)T, 128, 0, cx->stream>>>(out, ids, table, C, V, cx->d_count);
    FT_CUDA_LAUNCH("embedding_fwd");
    FT_TRY(cu_copy(be, &bad, cx->d_count, sizeof bad));
    if (bad != INT64_MAX) {
        int32_t id;
        FT_TRY(cu_copy(be, &id, ids + bad, sizeof id));
        return ft_err(FT_E_INVALID, "cuda embedding_fwd: ids[%lld] = %d, expected 0..%lld",
                      (long long)bad, id, (long long)V - 1);
    }
    return 0;
}

/* ---- RMSNorm: one block per row, fixed-order reductions in double ------------------------- */

__global__ void k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t C,
                              float eps)
{
    __shared__ double sh[RED_THREADS];
    const float *xr = x + blockIdx.x * C;
    float *yr = y + blockIdx.x * C;
    double ss = 0;
    for (int64_t i = threadIdx.x; i < C; i += RED_THREADS) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, sh);
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int64_t i = threadIdx.x; i < C; i += RED_THREADS) yr[i] = w[i] * (xr[i] * r);
}

__global__ void k_rmsnorm_bwd(float *dx, const float *dy, const float *x, const float *w,
                              const float *rstd, int64_t C)
{
    __shared__ double sh[RED_THREADS];
    const float *xr = x + blockIdx.x * C, *dyr = dy + blockIdx.x * C;
    float *dxr = dx + blockIdx.x * C;
    float r = rstd[blockIdx.x];
    double s = 0;
    for (int64_t i = threadIdx.x; i < C; i += RED_THREADS) s += (double)dyr[i] * (double)w[i] * (double)xr[i];
    s = block_sum_d(s, sh);
    float c = (float)(s * (double)r * (double)r / (double)C);
    for (int64_t i = threadIdx.x; i < C; i += RED_THREADS) dxr[i] += r * (dyr[i] * w[i] - xr[i] * c);
}

/* Rows of at most WARP_ROW_MAX_C values (the per-head q/k norms of Qwen3: head_dim 64..256
 * values per row, T*H rows): one warp per row, ROW_WARPS rows per block, the sums in double
 * over lanes and shuffles, so no block-wide barrier per row and no idle threads. A warp's
 * lanes share the row, so the early return keeps every shuffle's warp whole. */
#define WARP_ROW_MAX_C 1024
#define ROW_WARPS 8

__global__ void k_rmsnorm_fwd_warp(float *y, float *rstd, const float *x, const float *w,
                                   int64_t T, int64_t C, float eps)
{
    int64_t row = (int64_t)blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= T) return;
    const float *xr = x + row * C;
    float *yr = y + row * C;
    double ss = 0;
    for (int64_t i = lane; i < C; i += 32) ss += (double)xr[i] * (double)xr[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    if (lane == 0) rstd[row] = r;
    for (int64_t i = lane; i < C; i += 32) yr[i] = w[i] * (xr[i] * r);
}

__global__ void k_rmsnorm_bwd_warp(float *dx, const float *dy, const float *x, const float *w,
                                   const float *rstd, int64_t T, int64_t C)
{
    int64_t row = (int64_t)blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= T) return;
    const float *xr = x + row * C, *dyr = dy + row * C;
    float *dxr = dx + row * C;
    float r = rstd[row];
    double s = 0;
    for (int64_t i = lane; i < C; i += 32) s += (double)dyr[i] * (double)w[i] * (double)xr[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float c = (float)(s * (double)r * (double)r / (double)C);
    for (int64_t i = lane; i < C; i += 32) dxr[i] += r * (dyr[i] * w[i] - xr[i] * c);
}

static int cu_rmsnorm_fwd(ft_backend *be, float *y, float *rstd, const float *x, const float *w,
                          int64_t T, int64_t C, float eps)
{
    CHECK_N("rmsnorm_fwd", T);
    CHECK_N("rmsnorm_fwd", C);
    if (!(eps >= 0)) return ft_err(FT_E_INVALID, "cuda rmsnorm_fwd: eps = %g, expected >= 0", (double)eps);
    if (!T) return 0;
    if (!C) return cu_zero(be, rstd, (size_t)T * sizeof(float));
    if (T > INT32_MAX) return ft_err(FT_E_INVALID, "cuda rmsnorm_fwd: T = %lld too large", (long long)T);
    if (C <= WARP_ROW_MAX_C)
        k_rmsnorm_fwd_warp<<<(unsigned)((T + ROW_WARPS - 1) / ROW_WARPS), 32 * ROW_WARPS, 0,
                             FT_CUDA_CTX(be)->stream>>>(y, rstd, x, w, T, C, eps);
    else
        k_rmsnorm_fwd<<<(unsigned)T, RED_THREADS, 0, FT_CUDA_CTX(be)->stream>>>(y, rstd, x, w, C, eps);
    FT_CUDA_LAUNCH("rmsnorm_fwd");
    return 0;
}

static int cu_rmsnorm_bwd(ft_backend *be, float *dx, const float *dy, const float *x,
                          const float *w, const float *rstd, int64_t T, int64_t C)
{
    CHECK_N("rmsnorm_bwd", T);
    CHECK_N("rmsnorm_bwd", C);
    if (!T || !C) return 0;
    if (T > INT32_MAX) return ft_err(FT_E_INVALID, "cuda rmsnorm_bwd: T = %lld too large", (long long)T);
    if (C <= WARP_ROW_MAX_C)
        k_rmsnorm_bwd_warp<<<(unsigned)((T + ROW_WARPS - 1) / ROW_WARPS), 32 * ROW_WARPS, 0,
                             FT_CUDA_CTX(be)->stream>>>(dx, dy, x, w, rstd, T, C);
    else
        k_rmsnorm_bwd<<<(unsigned)T, RED_THREADS, 0, FT_CUDA_CTX(be)->stream>>>(dx, dy, x, w, rstd, C);
    FT_CUDA_LAUNCH("rmsnorm_bwd");
    return 0;
}

/* ---- RoPE (rotate-half, HF): one thread per (token, frequency), looping over heads;
 * the angle and its cos/sin in double, as the CPU twin. ------------------------------------ */

__global__ void k_rope(float *x, const int32_t *pos, const float *inv_freq, int64_t T,
                       int64_t H, int64_t D, double sign)
{
    int64_t half = D / 2;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < T * half;
         g += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = g / half, i = g % half;
        double a = (double)pos[t] * (double)inv_freq[i], sd, cd;
        sincos(a, &sd, &cd);
        float cs = (float)cd, sn = (float)(sign * sd);
        for (int64_t h = 0; h < H; h++) {
            float *lo = x + (t * H + h) * D;
            float x0 = lo[i], x1 = lo[i + half];
            lo[i] = x0 * cs - x1 * sn;
            lo[i + half] = x1 * cs + x0 * sn;
        }
    }
}

static int rope_apply(ft_backend *be, const char *op, float *x, const int32_t *pos,
                      const float *inv_freq, int64_t T, int64_t H, int64_t D, double sign)
{
    CHECK_N(op, T);
    CHECK_N(op, H);
    if (D < 0 || D % 2 || D > 1024)
        return ft_err(FT_E_INVALID, "cuda %s: head dim D = %lld, expected even and <= 1024", op, (long long)D);
    if (!T || !H || !D) return 0;
    k_rope<<<ft_cuda_blocks(T * (D / 2), 128), 128, 0, FT_CUDA_CTX(be)->stream>>>(x, pos, inv_freq, T, H, D, sign);
    FT_CUDA_LAUNCH(op);
    return 0;
}

static int cu_rope_fwd(ft_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                       int64_t T, int64_t H, int64_t D)
{
    return rope_apply(be, "rope_fwd", x, pos, inv_freq, T, H, D, 1.0);
}

static int cu_rope_bwd(ft_backend *be, float *dx, const int32_t *pos, const float *inv_freq,
                       int64_t T, int64_t H, int64_t D)
{
    return rope_apply(be, "rope_bwd", dx, pos, inv_freq, T, H, D, -1.0);
}

/* ---- SwiGLU (h = silu(g) u), dropout ---------------------------------------------------- */

__global__ void k_swiglu_fwd(float *h, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        float s = 1.0f / (1.0f + expf(-g));
        h[i] = g * s * up[i];
    }
}

__global__ void k_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate,
                             const float *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i], d = dh[i];
        float s = 1.0f / (1.0f + expf(-g));
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
        dup[i] = d * g * s;
    }
}

static int cu_swiglu_fwd(ft_backend *be, float *h, const float *gate, const float *up, int64_t n)
{
    CHECK_N("swiglu_fwd", n);
    if (!n) return 0;
    k_swiglu_fwd<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(h, gate, up, n);
    FT_CUDA_LAUNCH("swiglu_fwd");
    return 0;
}

static int cu_swiglu_bwd(ft_backend *be, float *dgate, float *dup, const float *dh,
                         const float *gate, const float *up, int64_t n)
{
    CHECK_N("swiglu_bwd", n);
    if (!n) return 0;
    k_swiglu_bwd<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(dgate, dup, dh, gate, up, n);
    FT_CUDA_LAUNCH("swiglu_bwd");
    return 0;
}

/* The mask is cpu_common.h's counter-based hash, so CPU and CUDA drop the same elements. */
__global__ void k_dropout(float *y, const float *x, int64_t n, uint64_t key, uint32_t thr, float sc)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = ft_dropout_keep(key, (uint64_t)i, thr) ? x[i] * sc : 0.0f;
}

static int cu_dropout(ft_backend *be, float *y, const float *x, int64_t n, float p, uint64_t seed)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    CHECK_N("dropout", n);
    if (!(p >= 0 && p < 1))
        return ft_err(FT_E_INVALID, "cuda dropout: p = %g, expected 0 <= p < 1", (double)p);
    if (!n) return 0;
    if (p == 0) {
        if (y != x) FT_CUDA_TRY(cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, cx->stream));
        return 0;
    }
    k_dropout<<<ft_cuda_blocks(n, 256), 256, 0, cx->stream>>>(
        y, x, n, ft_dropout_mix64(seed), ft_dropout_threshold((double)p), 1.0f / (1.0f - p));
    FT_CUDA_LAUNCH("dropout");
    return 0;
}

/* ---- NEFTune noise (kernels.h noise_uniform_add) ----------------------------------------- */

/* x[i] += mag * u_i with cpu_common.h's draw; the product and the sum are rounded one at a
 * time (__fmul_rn, __fadd_rn: nvcc may not fuse them), as the CPU op does, so the bits match. */
static __global__ void k_noise_uniform_add(float *x, int64_t n, uint64_t key, float mag)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fadd_rn(x[i], __fmul_rn(mag, ft_noise_uniform(key, (uint64_t)i)));
}

static int cu_noise_uniform_add(ft_backend *be, float *x, int64_t n, float mag, uint64_t seed)
{
    CHECK_N("noise_uniform_add", n);
    if (!(mag >= 0) || !isfinite(mag))
        return ft_err(FT_E_INVALID, "cuda noise_uniform_add: mag = %g, expected finite and >= 0",
                      (double)mag);
    if (mag == 0 || !n) return 0;
    k_noise_uniform_add<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(
        x, n, ft_dropout_mix64(seed), mag);
    FT_CUDA_LAUNCH("noise_uniform_add");
    return 0;
}

/* ---- AdamW (torch.optim.AdamW; bias corrections in double on the host, as the CPU twin) ---- */

__global__ void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr_decay,
                        float step_size, float bc2_sqrt, float b1, float b2, float eps)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = p[i] * lr_decay - step_size * (mi / denom);
    }
}

static int cu_adamw(ft_backend *be, float *p, const float *g, float *m, float *v, int64_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step)
{
    CHECK_N("adamw", n);
    if (step < 1) return ft_err(FT_E_INVALID, "cuda adamw: step = %lld, expected >= 1", (long long)step);
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
        return ft_err(FT_E_INVALID, "cuda adamw: beta1 = %g, beta2 = %g, expected in [0, 1)",
                      (double)beta1, (double)beta2);
    if (!n) return 0;
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    k_adamw<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(
        p, g, m, v, n, (float)(1.0 - (double)lr * (double)weight_decay), (float)((double)lr / bc1),
        (float)sqrt(bc2), beta1, beta2, eps);
    FT_CUDA_LAUNCH("adamw");
    return 0;
}

/* ---- the table, init, free ---------------------------------------------------------------- */

extern "C" int ft_cuda_lm_head_ce(ft_backend *be, double *loss_sum, int64_t *n_valid, float *dx,
                                  const float *x, const float *W, const int32_t *targets,
                                  int64_t T, int64_t C, int64_t V, float grad_scale,
                                  float *scratch, int64_t chunk);
extern "C" int ft_cuda_dequant_nf4(ft_backend *be, uint16_t *dst, const ft_nf4_tensor *t);
extern "C" int ft_cuda_lm_head_logits(ft_backend *be, float *logits, const float *x,
                                      const float *W, int64_t T, int64_t C, int64_t V);

static void cu_destroy(ft_backend *be)
{
    ft_cuda_ctx *cx = FT_CUDA_CTX(be);
    if (!cx) return;
    cudaStreamSynchronize(cx->stream);
    ft_cuda_profile_free(cx);
    if (cx->blas) cx->bl.Destroy(cx->blas);
    if (cx->bl.lib) dlclose(cx->bl.lib);
    for (int l = 1; l < FT_N_LANES; l++)
        if (cx->lane[l]) {
            cudaStreamSynchronize(cx->lane[l]);
            cudaStreamDestroy(cx->lane[l]);
        }
    for (int i = 0; i < FT_MAX_EVENTS; i++)
        if (cx->ev[i]) cudaEventDestroy(cx->ev[i]);
    if (cx->stream) cudaStreamDestroy(cx->stream);
    cudaFree(cx->work);
    cudaFree(cx->attn);
    free(cx->ss_host);
    cudaFree(cx->d_sum);
    cudaFree(cx->d_count);
    free(cx);
    be->ctx = NULL;
}

/* The device services of the table (kernels.h; sync and mem below, profile.cu) */
extern "C" int ft_backend_cuda_sync(ft_backend *be);
extern "C" int ft_backend_cuda_mem(ft_backend *be, size_t *free_bytes, size_t *total_bytes);
extern "C" int ft_backend_cuda_profile(ft_backend *be, int on);
extern "C" int ft_backend_cuda_profile_report(ft_backend *be, char *buf, size_t n, int reset);

static const ft_backend_ops cuda_ops = {
    .name = "cuda",
    .host_memory = 0,
    .weight_types = FT_WTYPE_BIT(FT_WTYPE_F32) | FT_WTYPE_BIT(FT_WTYPE_BF16) | FT_WTYPE_BIT(FT_WTYPE_NF4),
    .destroy = cu_destroy,
    .prepare = ft_cuda_attn_prepare,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .zero = cu_zero,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy_async = cu_copy_async,
    .event_record = cu_event_record,
    .event_wait = cu_event_wait,
    .event_sync = cu_event_sync,
    .event_elapsed = cu_event_elapsed,
    .gemm = cu_gemm,
    .linear_fwd = cu_linear_fwd,
    .linear_bwd_x = cu_linear_bwd_x,
    .dequant_nf4 = ft_cuda_dequant_nf4,
    .axpy = cu_axpy,
    .scale = cu_scale,
    .sumsq = cu_sumsq,
    .bias_add = cu_bias_add,
    .embedding_fwd = cu_embedding_fwd,
    .rmsnorm_fwd = cu_rmsnorm_fwd,
    .rmsnorm_bwd = cu_rmsnorm_bwd,
    .rope_fwd = cu_rope_fwd,
    .rope_bwd = cu_rope_bwd,
    .attention_fwd = ft_cuda_attention_fwd,
    .attention_bwd = ft_cuda_attention_bwd,
    .swiglu_fwd = cu_swiglu_fwd,
    .swiglu_bwd = cu_swiglu_bwd,
    .dropout = cu_dropout,
    .noise_uniform_add = cu_noise_uniform_add,
    .lm_head_ce = ft_cuda_lm_head_ce,
    .lm_head_logits = ft_cuda_lm_head_logits,
    .adamw = cu_adamw,
    .attention_kv_fwd = ft_cuda_flash_attention_kv_fwd,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .device_pci_id = cu_device_pci_id,
    .adamw_multi = ft_cuda_adamw_multi,
    .add_rmsnorm_bf16_fwd = ft_cuda_add_rmsnorm_bf16_fwd,
    .add_rmsnorm_bf16_bwd = ft_cuda_add_rmsnorm_bf16_bwd,
    .rope_qk_bf16 = ft_cuda_rope_qk_bf16,
    .swiglu_bf16_fwd = ft_cuda_swiglu_bf16_fwd,
    .swiglu_bf16_bwd = ft_cuda_swiglu_bf16_bwd,
    .mem_info = ft_backend_cuda_mem,
    .sync = ft_backend_cuda_sync,
    .profile = ft_backend_cuda_profile,
    .profile_report = ft_backend_cuda_profile_report,
};

static int cuda_setup(ft_cuda_ctx *cx, int device)
{
    FT_CUDA_TRY(cudaSetDevice(device));
    FT_CUDA_TRY(cudaDeviceGetAttribute(&cx->n_sm, cudaDevAttrMultiProcessorCount, device));
    FT_CUDA_TRY(cudaStreamCreateWithFlags(&cx->stream, cudaStreamNonBlocking));
    cx->lane[FT_STREAM_COMPUTE] = cx->stream;
    for (int l = 1; l < FT_N_LANES; l++)
        FT_CUDA_TRY(cudaStreamCreateWithFlags(&cx->lane[l], cudaStreamNonBlocking));
    FT_TRY(blas_dl(&cx->bl));
    FT_BLAS_TRY(cx->bl.Create(&cx->blas));
    FT_BLAS_TRY(cx->bl.SetStream(cx->blas, cx->stream));
    FT_BLAS_TRY(cx->bl.SetMathMode(cx->blas, CUBLAS_DEFAULT_MATH));
    /* The context's memory, all of it now: the ops never allocate. */
    FT_CUDA_TRY(cudaMalloc(&cx->work, WORK_BYTES + BLAS_WORK_BYTES));
    cx->work_bytes = WORK_BYTES;
    FT_BLAS_TRY(cx->bl.SetWorkspace(cx->blas, (char *)cx->work + WORK_BYTES, BLAS_WORK_BYTES));
    FT_CUDA_TRY(cudaMalloc((void **)&cx->d_sum, sizeof(double)));
    FT_CUDA_TRY(cudaMalloc((void **)&cx->d_count, sizeof(int64_t)));
    cx->device = device;
    cx->gemm_bf16 = 1;
    return 0;
}

extern "C" int ft_backend_cuda_init(ft_backend **out, int device)
{
    if (!out) return ft_err(FT_E_INVALID, "ft_backend_cuda_init: out is NULL");
    *out = NULL;
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess || n == 0) {
        cudaGetLastError();
        return ft_err(FT_E_UNSUPPORTED, "cuda: no CUDA device is visible (%s)",
                      st != cudaSuccess ? cudaGetErrorString(st) : "0 devices");
    }
    if (device < 0 || device >= n)
        return ft_err(FT_E_INVALID, "cuda: device %d, expected 0..%d", device, n - 1);
    ft_backend *be = (ft_backend *)calloc(1, sizeof *be);
    ft_cuda_ctx *cx = (ft_cuda_ctx *)calloc(1, sizeof *cx);
    if (!be || !cx) {
        free(be);
        free(cx);
        return ft_err(-ENOMEM, "ft_backend_cuda_init: out of memory");
    }
    be->ops = &cuda_ops;
    be->ctx = cx;
    int rc = cuda_setup(cx, device);
    if (rc) {
        cu_destroy(be);
        free(be);
        return rc;
    }
    *out = be;
    return 0;
}

extern "C" int ft_backend_cuda_set_precise(ft_backend *be, int precise)
{
    if (!be || strcmp(be->ops->name, "cuda"))
        return ft_err(FT_E_INVALID, "ft_backend_cuda_set_precise: not a CUDA backend");
    FT_CUDA_CTX(be)->gemm_bf16 = !precise;
    return 0;
}

extern "C" int ft_backend_cuda_set_fused(ft_backend *be, unsigned mask)
{
    if (!be || strcmp(be->ops->name, "cuda"))
        return ft_err(FT_E_INVALID, "ft_backend_cuda_set_fused: not a CUDA backend");
    if (mask & ~FT_CUDA_FUSED_ALL)
        return ft_err(FT_E_INVALID, "ft_backend_cuda_set_fused: unknown bits 0x%x", mask & ~FT_CUDA_FUSED_ALL);
    FT_CUDA_CTX(be)->fused = mask;
    return 0;
}

extern "C" int ft_backend_cuda_sync(ft_backend *be)
{
    FT_CUDA_TRY(cudaStreamSynchronize(FT_CUDA_CTX(be)->stream));
    return 0;
}

extern "C" int ft_backend_cuda_mem(ft_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    FT_CUDA_TRY(cudaSetDevice(FT_CUDA_CTX(be)->device));
    FT_CUDA_TRY(cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}
