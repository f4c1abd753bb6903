/* nf4_dequant.cu - NF4 -> bf16 dequantization rate on the GPU: the previous kernel (`old`,
 * copied below as it was in 6fd832d) against kernels/cuda/nf4.cu (`new`, included), on random
 * weights quantized on the host by the CPU quantizer (src/numeric/nf4.c, bnb NF4, blocksize 64,
 * double quantization with nested blocks of 256). Not a test.
 *
 * For each shape (4096 x 14336 and 8192 x 28672 by default): both kernels' outputs are checked
 * bit for bit against the CPU's ft_nf4_dequant rounded to bf16 (nearest even); then each is
 * timed with CUDA events, 3 warm-ups and 20 repetitions, median reported, in ms and GB/s of
 * bytes moved (codes + qabsmax + nested absmax read, bf16 written). `memset` writes the same
 * output bytes with cudaMemsetAsync: the write-only bound the kernel can approach. `new/p` is
 * the new kernel with a persistent grid (8 CTAs per SM looping over the tiles) instead of one
 * tile per warp. Last, one Llama-3-8B layer's seven projections back to back into one staging
 * buffer (as offload/ does per layer visit), and that times 64 (32 layers, forward and
 * backward visit): the dequantization cost of one training step.
 *
 * Build (after `make`, which builds build/src/numeric/nf4.o and build/src/core/err.o):
 *   nvcc -O3 -std=c++20 -arch=sm_90 -I. -Xcompiler -fopenmp bench/nf4_dequant.cu \
 *        build/src/numeric/nf4.o build/src/core/err.o -o build/bench/nf4_dequant
 * Usage: build/bench/nf4_dequant [rows cols]...   (default: 4096 14336 8192 28672)
 * Exit status 1 when the new kernel's output differs from the CPU's in any bit.
 */
#define FT_NF4_KERNELS_ONLY
#include "kernels/cuda/nf4.cu"

extern "C" {
#include "src/numeric/nf4.h"
}

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

/* ---- the previous kernel, verbatim (kernels/cuda/nf4.cu at 6fd832d) ---------------------- */
__device__ __forceinline__ float old_nf4_absmax(const ft_nf4_tensor &t, int64_t b, int sh_nested)
{
    return t.nested_blocksize
               ? __fadd_rn(__fmul_rn(t.nested_map[t.qabsmax[b]], t.nested_absmax[b >> sh_nested]),
                           t.offset)
               : t.absmax[b];
}

__global__ void k_nf4_bf16_old(__nv_bfloat16 *dst, ft_nf4_tensor t, int sh_block, int sh_nested)
{
    __shared__ float code[16];
    if (threadIdx.x < 16) code[threadIdx.x] = t.code[threadIdx.x];
    __syncthreads();
    int64_t n16 = t.n / 16;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = 16 * i;
        float am = old_nf4_absmax(t, e >> sh_block, sh_nested);
        uint2 c8 = *reinterpret_cast<const uint2 *>(t.codes + 8 * i);
        uint32_t w[2] = {c8.x, c8.y};
        __nv_bfloat162 out[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t byte = (w[k >> 2] >> (8 * (k & 3))) & 0xff;
            out[k] = __floats2bfloat162_rn(__fmul_rn(code[byte >> 4], am), __fmul_rn(code[byte & 15], am));
        }
        uint4 *d = reinterpret_cast<uint4 *>(dst + e);
        d[0] = *reinterpret_cast<uint4 *>(&out[0]);
        d[1] = *reinterpret_cast<uint4 *>(&out[4]);
    }
    for (int64_t e = 16 * n16 + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < t.n;
         e += (int64_t)gridDim.x * blockDim.x) {
        uint8_t c = t.codes[e >> 1];
        float am = old_nf4_absmax(t, e >> sh_block, sh_nested);
        dst[e] = __float2bfloat16_rn(__fmul_rn(code[(e & 1) ? (c & 15) : (c >> 4)], am));
    }
}
/* ------------------------------------------------------------------------------------------- */

enum { K_OLD, K_NEW, K_NEW_PERSISTENT, K_MEMSET, K_N };
static const char *k_name[K_N] = {"old", "new", "new/p", "memset"};
static int g_sm = 0;

static void launch(int k, __nv_bfloat16 *dst, const ft_nf4_tensor *t, int sb, int sn)
{
    switch (k) {
    case K_OLD:
        k_nf4_bf16_old<<<ft_cuda_blocks(t->n / 16 + 1, 256), 256>>>(dst, *t, sb, sn);
        CK(cudaGetLastError());
        break;
    case K_NEW: CK(nf4_bf16_launch(dst, t, sb, sn, 0, 0)); break;
    case K_NEW_PERSISTENT: CK(nf4_bf16_launch(dst, t, sb, sn, (int64_t)g_sm * 8, 0)); break;
    default: CK(cudaMemsetAsync(dst, 0x3f, (size_t)t->n * 2, 0)); break;
    }
}

static uint16_t bf16_bits(float f) /* nearest even, as tests/gpu/test_cuda_ops.c */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* deterministic normal(0, 0.02) weights rounded to bf16 (as a bf16 checkpoint holds them) */
static void fill_weights(float *x, int64_t n, uint64_t seed)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t h = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ seed;
        h ^= h >> 31; h *= 0xbf58476d1ce4e5b9ull; h ^= h >> 27; h *= 0x94d049bb133111ebull; h ^= h >> 31;
        double u1 = ((h >> 11) + 1.0) / 9007199254740993.0;
        uint64_t g = h * 0x9e3779b97f4a7c15ull; g ^= g >> 29; g *= 0xbf58476d1ce4e5b9ull; g ^= g >> 32;
        double u2 = (g >> 11) / 9007199254740992.0, r = sqrt(-2.0 * log(u1)) * 0.02;
        float a = (float)(r * cos(6.283185307179586 * u2)), b = (float)(r * sin(6.283185307179586 * u2));
        uint32_t ua = (uint32_t)bf16_bits(a) << 16, ub = (uint32_t)bf16_bits(b) << 16;
        memcpy(&x[i], &ua, 4);
        if (i + 1 < n) memcpy(&x[i + 1], &ub, 4);
    }
}

struct dev_nf4 {
    ft_nf4_layout l;
    ft_nf4_tensor t; /* device pointers */
    std::vector<uint16_t> ref; /* CPU dequant, bf16 bits */
};

static void make_tensor(dev_nf4 *d, int64_t n, uint64_t seed, const float *map, float *dmap, float *dcode)
{
    ft_nf4_layout &l = d->l;
    if (ft_nf4_layout_init(&l, n, FT_NF4_BLOCK, FT_NF4_NESTED_BLOCK)) { fprintf(stderr, "layout\n"); exit(1); }
    std::vector<float> x(n), am(l.n_blocks), nam(l.n_nested), ref(n);
    std::vector<uint8_t> codes(l.code_bytes), qam(l.n_blocks);
    float off = 0;
    double t0 = omp_get_wtime();
    fill_weights(x.data(), n, seed);
    if (ft_nf4_quantize(x.data(), &l, map, codes.data(), qam.data(), nam.data(), &off, am.data())) {
        fprintf(stderr, "quantize failed\n");
        exit(1);
    }
    ft_nf4_view v = {l, codes.data(), qam.data(), NULL, nam.data(), map, ft_nf4_code, off};
    if (ft_nf4_dequant(&v, ref.data())) { fprintf(stderr, "dequant failed\n"); exit(1); }
    d->ref.resize(n);
    for (int64_t i = 0; i < n; i++) d->ref[i] = bf16_bits(ref[i]);
    uint8_t *dc, *dq;
    float *dn;
    CK(cudaMalloc(&dc, l.code_bytes));
    CK(cudaMalloc(&dq, l.n_blocks));
    CK(cudaMalloc(&dn, l.n_nested * 4));
    CK(cudaMemcpy(dc, codes.data(), l.code_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, qam.data(), l.n_blocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dn, nam.data(), l.n_nested * 4, cudaMemcpyHostToDevice));
    d->t = ft_nf4_tensor{n, FT_NF4_BLOCK, FT_NF4_NESTED_BLOCK, dc, dq, NULL, dn, dmap, dcode, off};
    printf("  host: %lld values generated, quantized and dequantized in %.1f s (%d threads)\n",
           (long long)n, omp_get_wtime() - t0, omp_get_max_threads());
}

static double median_ms(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/* times f() (enqueues work on stream 0): 3 warm-ups, reps timed one by one; median ms */
template <typename F> static double time_ms(F f, int reps = 20)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) f();
    std::vector<float> ms;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, 0));
        f();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float m;
        CK(cudaEventElapsedTime(&m, a, b));
        ms.push_back(m);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median_ms(ms);
}

static double bytes_moved(const ft_nf4_layout &l) /* read + written */
{
    return (double)l.code_bytes + (double)l.n_blocks + 4.0 * l.n_nested + 2.0 * l.n;
}

int main(int argc, char **argv)
{
    std::vector<int64_t> shapes;
    for (int i = 1; i + 1 < argc; i += 2) { shapes.push_back(atoll(argv[i])); shapes.push_back(atoll(argv[i + 1])); }
    if (shapes.empty()) shapes = {4096, 14336, 8192, 28672};
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    g_sm = p.multiProcessorCount;
    printf("nf4_dequant: %s, %d SMs; NF4 blocksize %d, nested %d; median of 20 (3 warm-ups)\n", p.name,
           g_sm, FT_NF4_BLOCK, FT_NF4_NESTED_BLOCK);
    float map[256];
    ft_nf4_dynamic_map(map);
    float *dmap, *dcode;
    CK(cudaMalloc(&dmap, sizeof map));
    CK(cudaMalloc(&dcode, 16 * 4));
    CK(cudaMemcpy(dmap, map, sizeof map, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcode, ft_nf4_code, 16 * 4, cudaMemcpyHostToDevice));
    int bad_new = 0;
    dev_nf4 big = {};
    for (size_t s = 0; s < shapes.size(); s += 2) {
        int64_t n = shapes[s] * shapes[s + 1];
        printf("\n%lld x %lld (%lld values):\n", (long long)shapes[s], (long long)shapes[s + 1], (long long)n);
        dev_nf4 d = {};
        make_tensor(&d, n, 0x5eed0000ull + s, map, dmap, dcode);
        __nv_bfloat16 *out;
        CK(cudaMalloc(&out, (size_t)n * 2));
        std::vector<uint16_t> got(n);
        printf("  %-7s %9s %9s  %s\n", "kernel", "ms", "GB/s", "bits vs CPU");
        for (int k = 0; k < K_N; k++) {
            char check[64] = "-";
            if (k != K_MEMSET) {
                CK(cudaMemset(out, 0xff, (size_t)n * 2)); /* NaN poison */
                launch(k, out, &d.t, 6, 8);
                CK(cudaMemcpy(got.data(), out, (size_t)n * 2, cudaMemcpyDeviceToHost));
                int64_t diff = 0, first = -1;
                for (int64_t i = 0; i < n; i++)
                    if (got[i] != d.ref[i]) { diff++; if (first < 0) first = i; }
                if (diff) snprintf(check, sizeof check, "%lld differ (first at %lld)", (long long)diff, (long long)first);
                else snprintf(check, sizeof check, "identical");
                if (diff && k != K_OLD) bad_new = 1;
            }
            double ms = time_ms([&] { launch(k, out, &d.t, 6, 8); });
            double bytes = k == K_MEMSET ? 2.0 * n : bytes_moved(d.l);
            printf("  %-7s %9.3f %9.1f  %s\n", k_name[k], ms, bytes / ms * 1e-6, check);
        }
        CK(cudaFree(out));
        if (big.l.n < n) { /* keep the largest for the layer timing */
            if (big.l.n) { CK(cudaFree((void *)big.t.codes)); CK(cudaFree((void *)big.t.qabsmax)); CK(cudaFree((void *)big.t.nested_absmax)); }
            big = d;
        } else {
            CK(cudaFree((void *)d.t.codes)); CK(cudaFree((void *)d.t.qabsmax)); CK(cudaFree((void *)d.t.nested_absmax));
        }
    }

    /* one Llama-3-8B layer: q, k, v, o, gate, up, down (out x in), prefixes of the largest
     * tensor's quantized arrays (a prefix of whole nested blocks is a valid tensor), into one
     * staging buffer at 64-byte aligned offsets as offload/ lays them out */
    const int64_t proj[7][2] = {{4096, 4096}, {1024, 4096}, {1024, 4096}, {4096, 4096},
                                {14336, 4096}, {14336, 4096}, {4096, 14336}};
    int64_t stage_n = 0, layer_n = 0;
    for (auto &pr : proj) { layer_n += pr[0] * pr[1]; stage_n += pr[0] * pr[1] + 32; }
    if (big.l.n >= 14336 * 4096) {
        __nv_bfloat16 *stage;
        CK(cudaMalloc(&stage, (size_t)stage_n * 2));
        double layer_bytes = 0;
        for (auto &pr : proj) {
            ft_nf4_layout l;
            ft_nf4_layout_init(&l, pr[0] * pr[1], FT_NF4_BLOCK, FT_NF4_NESTED_BLOCK);
            layer_bytes += bytes_moved(l);
        }
        printf("\nLlama-3-8B layer (7 projections, %.1fM values, %.0f MB moved), per step = 64 layer visits:\n",
               layer_n / 1e6, layer_bytes / 1e6);
        for (int k = 0; k < K_N; k++) {
            double ms = time_ms([&] {
                __nv_bfloat16 *dst = stage;
                for (auto &pr : proj) {
                    ft_nf4_tensor t = big.t;
                    t.n = pr[0] * pr[1];
                    launch(k, dst, &t, 6, 8);
                    dst += t.n + 32;
                }
            });
            double bytes = k == K_MEMSET ? 2.0 * layer_n : layer_bytes;
            printf("  %-7s %7.3f ms/layer %8.1f GB/s  -> %6.1f ms/step\n", k_name[k], ms, bytes / ms * 1e-6, 64 * ms);
        }
        CK(cudaFree(stage));
    }
    printf("\n%s\n", bad_new ? "FAIL: the new kernel's output differs from the CPU's" : "new kernel bit-identical to the CPU");
    return bad_new;
}
