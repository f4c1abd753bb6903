/* gemm_rate.cu - cuBLAS GEMM rates on the shapes of one Llama-3-8B training step (seq 2048),
 * for each way ftune can feed the tensor cores. The physical bound for MFU and the reason
 * for the CUDA backend's storage choices. Not a test.
 *
 *   fp32 in, COMPUTE_32F_FAST_16BF  (what the fp32 op table uses today)
 *   fp32 in, COMPUTE_32F_FAST_TF32
 *   bf16 in, fp32 out, COMPUTE_32F
 *   bf16 in, bf16 out, COMPUTE_32F  (the usual bf16 training GEMM)
 *
 * Inputs are random (never zeros, METHOD.md), timed with events over 20 repetitions after
 * 3 warm-ups, median reported. Build: nvcc -O3 -arch=sm_90 bench/gemm_rate.cu -lcublas.
 * Usage: gemm_rate [T]   (tokens per micro-batch, default 2048)
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("%s: %d\n", #x, (int)s_); exit(1); } } while (0)

__global__ void fill_f32(float *x, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        x[i] = (float)(h & 0xffff) / 65536.0f - 0.5f;
    }
}

__global__ void to_bf16(__nv_bfloat16 *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(x[i]);
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 2048;
    /* (name, m, n, k): y (T, out) = x (T, in) W^T and the input gradient dx (T, in) = dy W */
    struct { const char *name; int m, n, k; } shapes[] = {
        {"q/o proj fwd   T x 4096 x 4096", T, 4096, 4096},
        {"k/v proj fwd   T x 1024 x 4096", T, 1024, 4096},
        {"gate/up fwd    T x 14336 x 4096", T, 14336, 4096},
        {"down fwd       T x 4096 x 14336", T, 4096, 14336},
        {"lm head chunk  1024 x 128256 x 4096", 1024, 128256, 4096},
        {"square 8192^3", 8192, 8192, 8192},
    };
    size_t maxe = (size_t)128256 * 4096 + 64; /* the LM head W, the largest operand */
    float *A, *B, *C;
    __nv_bfloat16 *Ah, *Bh, *Ch;
    CK(cudaMalloc(&A, maxe * 4)); CK(cudaMalloc(&B, maxe * 4)); CK(cudaMalloc(&C, maxe * 4));
    CK(cudaMalloc(&Ah, maxe * 2)); CK(cudaMalloc(&Bh, maxe * 2)); CK(cudaMalloc(&Ch, maxe * 2));
    fill_f32<<<4096, 256>>>(A, maxe, 1); fill_f32<<<4096, 256>>>(B, maxe, 2);
    to_bf16<<<4096, 256>>>(Ah, A, maxe); to_bf16<<<4096, 256>>>(Bh, B, maxe);
    CK(cudaDeviceSynchronize());
    cublasHandle_t h;
    CB(cublasCreate(&h));
    void *ws;
    CK(cudaMalloc(&ws, 32 << 20));
    CB(cublasSetWorkspace(h, ws, 32 << 20));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    const char *modes[] = {"f32 in FAST_16BF", "f32 in FAST_TF32", "bf16 in f32 out", "bf16 in bf16 out"};
    printf("%-38s %18s %18s %18s %18s   (TFLOP/s, median of 20)\n", "shape (m x n x k)", modes[0], modes[1], modes[2], modes[3]);
    for (auto &s : shapes) {
        printf("%-38s", s.name);
        double flop = 2.0 * s.m * s.n * s.k;
        for (int mode = 0; mode < 4; mode++) {
            float one = 1, zero = 0;
            std::vector<float> ms;
            for (int it = 0; it < 23; it++) {
                cudaEventRecord(e0);
                /* row-major y (m, n) = x (m, k) W^T with W (n, k): column-major W^T... as ftune */
                if (mode < 2)
                    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &one, B, CUDA_R_32F, s.k, A,
                                    CUDA_R_32F, s.k, &zero, C, CUDA_R_32F, s.n,
                                    mode == 0 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_TF32,
                                    CUBLAS_GEMM_DEFAULT));
                else
                    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &one, Bh, CUDA_R_16BF, s.k, Ah,
                                    CUDA_R_16BF, s.k, &zero, mode == 2 ? (void *)C : (void *)Ch,
                                    mode == 2 ? CUDA_R_32F : CUDA_R_16BF, s.n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float t;
                cudaEventElapsedTime(&t, e0, e1);
                if (it >= 3) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            printf(" %12.1f (%4.2fms)", flop / (ms[ms.size() / 2] * 1e-3) / 1e12, ms[ms.size() / 2]);
        }
        printf("\n");
    }
    /* device-to-device copy bandwidth (bytes read + written) */
    std::vector<float> ms;
    size_t bytes = (size_t)1 << 30;
    for (int it = 0; it < 13; it++) {
        cudaEventRecord(e0);
        CK(cudaMemcpyAsync(C, A, bytes, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (it >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("device copy 1 GiB: %.0f GB/s (read + write)\n", 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9);
    return 0;
}
