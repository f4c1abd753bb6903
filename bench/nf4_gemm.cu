/* nf4_gemm.cu - the fused NF4 GEMMs (kernels/cuda/nf4_gemm.cu, included) against what they
 * replace: the plain dequantization into a bf16 staging buffer (kernels/cuda/nf4.cu, included)
 * followed by the cuBLAS bf16 GEMM that linear_fwd / linear_bwd_x run (cublasGemmEx, bf16 in,
 * fp32 out, CUBLAS_COMPUTE_32F, as kernels/cuda/backend.cu). Not a test.
 *
 * For each Llama projection shape W (N = out, K = in), 8B and 70B (q and o share a shape, and
 * k and v; gate and up), and T in {16, 128, 512, 2048, 4096} tokens:
 *   fwd  y (T, N) = x (T, K) W^T     dgrad  dx (T, K) = dy (T, N) W
 * times (CUDA events, 2 warm-ups, median of REPS, the L2 flushed before each repetition by a
 * 256 MB memset outside the timed region, so weights come from HBM as in a layer loop):
 *   fused    - ft_cuda_nf4_linear's launcher (tile height and split-K chosen by T);
 *   staging  - dequant_nf4 into a bf16 buffer + cublasGemmEx;
 *   cublas   - the cublasGemmEx alone on the bf16 weight (the bound staging approaches);
 * and prints TFLOP/s (2 T N K / time) and speedup = staging time / fused time (> 1: the fused
 * kernel wins). Then per model and T, one layer (q, k, v, o, gate, up, down; forward and
 * input gradient) summed: fused vs staging, ms. Each fused output is checked against the
 * staging one: max |diff| <= 1e-3 max |staging| (same bf16 operands; only the fp32 summation
 * order differs), else MISMATCH and exit status 1.
 * Weights: random code bytes and quantized absmax (absmax in [0.01, 0.03]) with bitsandbytes'
 * dynamic map and the NF4 code, blocksize 64, nested 256: the timing does not depend on the
 * values. Activations: random bf16 in [-1, 1]. Split-K partials use a 64 MB workspace, the
 * backend's cx->work size.
 *
 * Build (after `make`, which builds build/src/numeric/nf4.o and build/src/core/err.o):
 *   mkdir -p build/bench && nvcc -O3 -std=c++20 -arch=sm_90 -I. -Xcompiler -fopenmp bench/nf4_gemm.cu \
 *        build/src/numeric/nf4.o build/src/core/err.o -lcublas -o build/bench/nf4_gemm
 * Usage: build/bench/nf4_gemm [--8b] [--70b] [--T t1,t2,..] [--bm 16|32|64|128] [--splits S]
 *        [--reps R] [--no-flush]      (default: both models, T 16,128,512,2048,4096, 10 reps)
 */
#define FT_NF4_KERNELS_ONLY
#include "kernels/cuda/nf4.cu"
#define FT_NF4_GEMM_KERNELS_ONLY
#include "kernels/cuda/nf4_gemm.cu"

extern "C" {
#include "src/numeric/nf4.h"
}

#include <cublas_v2.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

#define WORK_BYTES ((size_t)64 << 20)   /* = kernels/cuda/backend.cu WORK_BYTES */
#define FLUSH_BYTES ((size_t)256 << 20) /* > the H100 / H200 L2 (50 / 60 MB) */

struct shape { const char *name; int64_t N, K; int count; /* projections of this shape per layer */ };
struct model { const char *name; std::vector<shape> s; };

static uint64_t mix(uint64_t h)
{
    h ^= h >> 31; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 27; h *= 0x94d049bb133111ebull; h ^= h >> 31;
    return h;
}

static void fill_bytes(uint8_t *p, int64_t n, uint64_t seed, int lo, int hi)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)(lo + mix((uint64_t)i * 0x9e3779b97f4a7c15ull ^ seed) % (hi - lo + 1));
}

__global__ void k_fill_bf16(__nv_bfloat16 *x, int64_t n, uint64_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ seed;
        h ^= h >> 31; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 27;
        x[i] = __float2bfloat16_rn((float)((h >> 40) & 0xffffff) * (2.0f / 16777216.0f) - 1.0f);
    }
}

/* max |a - b| and max |b| over n floats (device), on the host */
static void compare(const float *da, const float *db, int64_t n, double *diff, double *mag)
{
    std::vector<float> a(n), b(n);
    CK(cudaMemcpy(a.data(), da, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), db, n * 4, cudaMemcpyDeviceToHost));
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e; /* NaN propagates */
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    *diff = d;
    *mag = m;
}

static double median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct ctx {
    cudaStream_t s;
    cublasHandle_t h;
    void *flush;
    bool do_flush;
    int reps;
};

/* f() enqueues on c.s; 2 warm-ups, then reps, each after an L2 flush; median ms */
template <typename F> static double time_ms(ctx &c, F f)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) f();
    std::vector<float> ms;
    for (int i = 0; i < c.reps; i++) {
        if (c.do_flush) CK(cudaMemsetAsync(c.flush, i & 0xff, FLUSH_BYTES, c.s));
        CK(cudaEventRecord(a, c.s));
        f();
        CK(cudaEventRecord(b, c.s));
        CK(cudaEventSynchronize(b));
        float m;
        CK(cudaEventElapsedTime(&m, a, b));
        ms.push_back(m);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(ms);
}

int main(int argc, char **argv)
{
    bool want8 = false, want70 = false;
    std::vector<int64_t> Ts;
    int force_bm = 0, force_splits = 0;
    ctx c = {};
    c.do_flush = true;
    c.reps = 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--8b")) want8 = true;
        else if (!strcmp(argv[i], "--70b")) want70 = true;
        else if (!strcmp(argv[i], "--no-flush")) c.do_flush = false;
        else if (!strcmp(argv[i], "--T") && i + 1 < argc) {
            for (char *p = argv[++i]; *p;) {
                Ts.push_back(strtoll(p, &p, 10));
                if (*p == ',') p++;
            }
        } else if (!strcmp(argv[i], "--bm") && i + 1 < argc) force_bm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) force_splits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) c.reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--8b] [--70b] [--T t1,t2,..] [--bm B] [--splits S] [--reps R] [--no-flush]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!want8 && !want70) want8 = want70 = true;
    if (Ts.empty()) Ts = {16, 128, 512, 2048, 4096};
    if (c.reps < 1) c.reps = 1;
    std::vector<model> models;
    if (want8)
        models.push_back({"Llama-3-8B", {{"q,o", 4096, 4096, 2}, {"k,v", 1024, 4096, 2},
                                         {"gate,up", 14336, 4096, 2}, {"down", 4096, 14336, 1}}});
    if (want70)
        models.push_back({"Llama-3-70B", {{"q,o", 8192, 8192, 2}, {"k,v", 1024, 8192, 2},
                                          {"gate,up", 28672, 8192, 2}, {"down", 8192, 28672, 1}}});

    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int n_sm = prop.multiProcessorCount;
    CK(cudaStreamCreate(&c.s));
    CB(cublasCreate(&c.h));
    CB(cublasSetStream(c.h, c.s));
    CK(cudaMalloc(&c.flush, FLUSH_BYTES));
    float *work;
    CK(cudaMalloc(&work, WORK_BYTES));
    float map[256];
    ft_nf4_dynamic_map(map);
    float *dmap, *dcode;
    CK(cudaMalloc(&dmap, sizeof map));
    CK(cudaMalloc(&dcode, 16 * 4));
    CK(cudaMemcpy(dmap, map, sizeof map, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcode, ft_nf4_code, 16 * 4, cudaMemcpyHostToDevice));
    printf("nf4_gemm: %s, %d SMs; NF4 blocksize 64, nested 256; median of %d%s; tile height %s, split-K %s\n",
           prop.name, n_sm, c.reps, c.do_flush ? " (L2 flushed before each)" : "",
           force_bm ? "forced" : "by T", force_splits ? "forced" : "by shape");
    printf("%-11s %-8s %6s %5s | %9s %7s | %9s %7s | %7s | %7s\n", "model", "proj", "T", "op", "fused ms",
           "TFLOP/s", "stage ms", "TFLOP/s", "cuBLAS", "speedup");
    int bad = 0;
    for (const model &m : models) {
        std::vector<double> layer_f(Ts.size(), 0), layer_s(Ts.size(), 0);
        for (const shape &sh : m.s) {
            const int64_t N = sh.N, K = sh.K, n = N * K, nb = n / 64, nn = (nb + 255) / 256;
            const int64_t Tmax = *std::max_element(Ts.begin(), Ts.end()), wide = std::max(N, K);
            std::vector<uint8_t> codes(n / 2), qam(nb);
            std::vector<float> nam(nn, 0.01f);
            fill_bytes(codes.data(), n / 2, 0x1234 + N, 0, 255);
            fill_bytes(qam.data(), nb, 0x5678 + K, 0, 255); /* map in [-1, 1]: absmax in [0.01, 0.03] */
            uint8_t *dc, *dq;
            float *dn;
            CK(cudaMalloc(&dc, n / 2));
            CK(cudaMalloc(&dq, nb));
            CK(cudaMalloc(&dn, nn * 4));
            CK(cudaMemcpy(dc, codes.data(), n / 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dq, qam.data(), nb, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dn, nam.data(), nn * 4, cudaMemcpyHostToDevice));
            const ft_nf4_tensor t = {n, 64, 256, dc, dq, NULL, dn, dmap, dcode, 0.02f};
            __nv_bfloat16 *stage, *a;
            float *y1, *y2;
            CK(cudaMalloc(&stage, n * 2));
            CK(cudaMalloc(&a, Tmax * wide * 2));
            CK(cudaMalloc(&y1, Tmax * wide * 4));
            CK(cudaMalloc(&y2, Tmax * wide * 4));
            k_fill_bf16<<<1024, 256, 0, c.s>>>(a, Tmax * wide, 0x9abc + N);
            CK(cudaGetLastError());
            const float one = 1.0f, zero = 0.0f;
            for (size_t ti = 0; ti < Ts.size(); ti++) {
                const int64_t T = Ts[ti];
                for (int dgrad = 0; dgrad <= 1; dgrad++) {
                    const int64_t ncols = dgrad ? K : N, kred = dgrad ? N : K;
                    auto fused = [&] {
                        CK(nf4g_launch(dgrad, y1, a, &t, T, N, K, 0.0f, 6, 8, force_bm, force_splits, n_sm, work,
                                       WORK_BYTES, c.s));
                    };
                    auto gemm = [&] {
                        if (!dgrad) /* as cu_linear_fwd: C^T (N, T) = W (N, K) . x^T */
                            CB(cublasGemmEx(c.h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)T, (int)K, &one, stage,
                                            CUDA_R_16BF, (int)K, a, CUDA_R_16BF, (int)K, &zero, y2, CUDA_R_32F,
                                            (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                        else /* as cu_linear_bwd_x */
                            CB(cublasGemmEx(c.h, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)T, (int)N, &one, stage,
                                            CUDA_R_16BF, (int)K, a, CUDA_R_16BF, (int)N, &zero, y2, CUDA_R_32F,
                                            (int)K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                    };
                    auto staging = [&] {
                        CK(nf4_bf16_launch(stage, &t, 6, 8, 0, c.s));
                        gemm();
                    };
                    const double tf = time_ms(c, fused), ts = time_ms(c, staging), tc = time_ms(c, gemm);
                    CK(cudaStreamSynchronize(c.s));
                    double diff, mag;
                    compare(y1, y2, T * ncols, &diff, &mag);
                    const bool ok = diff <= 1e-3 * mag;
                    bad += !ok;
                    const double fl = 2.0 * T * N * K;
                    printf("%-11s %-8s %6lld %5s | %9.4f %7.1f | %9.4f %7.1f | %7.1f | %6.2fx%s\n", m.name, sh.name,
                           (long long)T, dgrad ? "dgrad" : "fwd", tf, fl / tf * 1e-9, ts, fl / ts * 1e-9,
                           fl / tc * 1e-9, ts / tf, ok ? "" : "  MISMATCH");
                    if (!ok)
                        printf("    max |fused - staging| %.3g, max |staging| %.3g (Kred %lld)\n", diff, mag,
                               (long long)kred);
                    layer_f[ti] += sh.count * tf;
                    layer_s[ti] += sh.count * ts;
                }
            }
            CK(cudaFree(dc));
            CK(cudaFree(dq));
            CK(cudaFree(dn));
            CK(cudaFree(stage));
            CK(cudaFree(a));
            CK(cudaFree(y1));
            CK(cudaFree(y2));
        }
        for (size_t ti = 0; ti < Ts.size(); ti++)
            printf("%s layer (7 projections, fwd + dgrad), T %lld: fused %.3f ms, staging %.3f ms, speedup %.2fx\n",
                   m.name, (long long)Ts[ti], layer_f[ti], layer_s[ti], layer_s[ti] / layer_f[ti]);
    }
    CK(cudaFree(work));
    CK(cudaFree(c.flush));
    CK(cudaFree(dmap));
    CK(cudaFree(dcode));
    CB(cublasDestroy(c.h));
    CK(cudaStreamDestroy(c.s));
    if (bad) printf("%d MISMATCH(es): the fused output differs from dequant + cuBLAS\n", bad);
    return bad != 0;
}
