/* nf4.cu - NF4 (bitsandbytes, double quantization) to bf16 on the GPU (kernels.h
 * dequant_nf4), written for memory bandwidth.
 *
 * Arithmetic per element, exactly the CPU's ft_nf4_dequant (src/numeric/nf4.c, compiled without
 * contraction) followed by bf16 round-to-nearest-even: the block's absmax is rebuilt with
 * bitsandbytes' two fp32 roundings (map value times nested absmax, then plus the offset:
 * __fmul_rn / __fadd_rn, so nvcc cannot contract them into one FMA), the element is
 * code[q] * absmax in fp32 (__fmul_rn), then rounded to bf16 (__floats2bfloat162_rn, nearest
 * even). Bit-identical to the CPU (tests/gpu/test_cuda_ops.c test_nf4; bench/nf4_dequant.cu).
 *
 * Layout of the work (a warp tile = 1024 elements = 512 code bytes = 2 KiB of bf16 out):
 *   - lane L reads four 4-byte code words at byte offsets 128 j + 4 L (j = 0..3): each load
 *     instruction of the warp is one fully used 128-byte line;
 *   - lane L writes the 8 outputs of word j as one 16-byte store at element 256 j + 8 L: each
 *     store instruction of the warp writes 512 contiguous bytes (whole lines, no partial
 *     sectors);
 *   - the absmax of each block is computed once per tile: for blocksize >= 32 the tile holds
 *     at most 32 blocks, lane k rebuilds block k's absmax (one coalesced qabsmax load for the
 *     warp) and lanes fetch theirs with a shuffle; blocksize 16 (not a bnb size) rebuilds it
 *     per word;
 *   - the 16-entry code sits in shared memory (16 distinct banks: a lookup never conflicts);
 *     block indices are shifts (power-of-two block sizes), no division anywhere.
 * Bytes moved per element: 0.5 (codes) + 1/blocksize (qabsmax) + 2 (bf16 out), ~2.52 at
 * blocksize 64; the kernel is bound by DRAM writes. The last n % 1024 elements (and any
 * tensor whose codes are not 4-byte or whose output is not 16-byte aligned) go through the
 * element-wise path in the same launch.
 *
 * The QLoRA path dequantizes one layer's projections per layer visit into a bf16 staging
 * buffer that the bf16 GEMMs read (kernels.h linear_fwd); what a GEMM with the dequantization
 * fused into its operand load must beat is worked out in bench/results/qlora.md.
 *
 * bench/nf4_dequant.cu includes this file with FT_NF4_KERNELS_ONLY defined (kernels and the
 * launcher only, no op-table entry) to time it against the previous kernel. */
#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>

#include "kernels/cuda/nf4_word.cuh"

#define FT_NF4_TILE 1024        /* elements per warp tile */
#define FT_NF4_THREADS 256      /* threads per CTA */

/* The fp32 absmax of block b: map[qabsmax[b]] * nested_absmax[b >> sh_nested] + offset (two
 * roundings, as the CPU) when nested, else the stored fp32 absmax. */
template <bool NESTED>
__device__ __forceinline__ float nf4_block_absmax(const ft_nf4_tensor &t, int64_t b, int sh_nested)
{
    if (NESTED)
        return __fadd_rn(__fmul_rn(__ldg(t.nested_map + __ldg(t.qabsmax + b)),
                                   __ldg(t.nested_absmax + (b >> sh_nested))),
                         t.offset);
    return __ldg(t.absmax + b);
}

/* dst[0, n) from t; tiles [0, n_tiles) by warps (grid-stride), then elements
 * [n_tiles * 1024, n) one per thread. sh_block/sh_nested: log2 of the block sizes. */
template <bool NESTED>
__global__ void __launch_bounds__(FT_NF4_THREADS)
k_nf4_bf16(__nv_bfloat16 *__restrict__ dst, ft_nf4_tensor t, int sh_block, int sh_nested, int64_t n_tiles)
{
    __shared__ float code[16];
    if (threadIdx.x < 16) code[threadIdx.x] = t.code[threadIdx.x];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (FT_NF4_THREADS / 32);
    /* blocks per tile: 1024 >> sh_block (<= 32 for sh_block >= 5), 1 when blocks span tiles */
    const int tile_blocks = sh_block >= 10 ? 1 : FT_NF4_TILE >> sh_block;
    for (int64_t tile = blockIdx.x * (int64_t)(FT_NF4_THREADS / 32) + (threadIdx.x >> 5); tile < n_tiles;
         tile += warps) {
        const int64_t e0 = tile * FT_NF4_TILE;
        const uint32_t *src = reinterpret_cast<const uint32_t *>(t.codes + e0 / 2) + lane;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) w[j] = __ldg(src + 32 * j);
        float am_lane = 0.0f;
        if (sh_block >= 5) /* e0 is a multiple of the block size (or of 1024 within one block) */
            am_lane = nf4_block_absmax<NESTED>(t, (e0 >> sh_block) + (lane < tile_blocks ? lane : 0),
                                               sh_nested);
        uint4 *d = reinterpret_cast<uint4 *>(dst + e0) + lane;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = 256 * j + 8 * lane; /* element within the tile */
            float am = sh_block >= 5 ? __shfl_sync(0xffffffffu, am_lane, r >> sh_block)
                                     : nf4_block_absmax<NESTED>(t, (e0 + r) >> sh_block, sh_nested);
            d[32 * j] = nf4_word_bf16(w[j], code, am);
        }
    }
    const int64_t stride = (int64_t)gridDim.x * FT_NF4_THREADS;
    for (int64_t e = n_tiles * FT_NF4_TILE + blockIdx.x * (int64_t)FT_NF4_THREADS + threadIdx.x; e < t.n;
         e += stride) {
        uint8_t c = t.codes[e >> 1];
        float am = nf4_block_absmax<NESTED>(t, e >> sh_block, sh_nested);
        dst[e] = __float2bfloat16_rn(__fmul_rn(code[(e & 1) ? (c & 15) : (c >> 4)], am));
    }
}

/* Launches the dequantization of t into dst on stream s. Block sizes powers of two: sh_block
 * >= 4, sh_nested >= 0 (ignored when not nested). max_ctas: 0 = one tile per warp (a grid of
 * n / 8192 CTAs), else at most that many CTAs looping over the tiles (the bench compares). */
static cudaError_t nf4_bf16_launch(__nv_bfloat16 *dst, const ft_nf4_tensor *t, int sh_block, int sh_nested,
                                   int64_t max_ctas, cudaStream_t s)
{
    int aligned = !((uintptr_t)t->codes & 3) && !((uintptr_t)dst & 15);
    int64_t n_tiles = aligned ? t->n / FT_NF4_TILE : 0;
    int64_t ctas = (n_tiles + FT_NF4_THREADS / 32 - 1) / (FT_NF4_THREADS / 32);
    int64_t rest = t->n - n_tiles * FT_NF4_TILE; /* element-wise, one per thread */
    int64_t rest_ctas = (rest + FT_NF4_THREADS - 1) / FT_NF4_THREADS;
    if (ctas < rest_ctas) ctas = rest_ctas;
    if (max_ctas > 0 && ctas > max_ctas) ctas = max_ctas;
    if (ctas > 0x7fffffff) ctas = 0x7fffffff;
    if (ctas < 1) ctas = 1;
    if (t->nested_blocksize)
        k_nf4_bf16<true><<<(unsigned)ctas, FT_NF4_THREADS, 0, s>>>(dst, *t, sh_block, sh_nested, n_tiles);
    else
        k_nf4_bf16<false><<<(unsigned)ctas, FT_NF4_THREADS, 0, s>>>(dst, *t, sh_block, 0, n_tiles);
    return cudaGetLastError();
}

static int log2_exact(int64_t v)
{
    int s = 0;
    while (s < 62 && ((int64_t)1 << s) < v) s++;
    return ((int64_t)1 << s) == v ? s : -1;
}

#ifndef FT_NF4_KERNELS_ONLY
extern "C" int ft_cuda_dequant_nf4(ft_backend *be, uint16_t *dst, const ft_nf4_tensor *t)
{
    if (!t || t->n < 0 || t->blocksize < 2 || (t->blocksize & 1) || t->nested_blocksize < 0 ||
        !t->codes || !t->code || (t->nested_blocksize ? !t->qabsmax || !t->nested_absmax || !t->nested_map
                                                      : !t->absmax))
        return ft_err(FT_E_INVALID, "cuda dequant_nf4: bad tensor description (n %lld, blocksize %lld)",
                      t ? (long long)t->n : -1LL, t ? (long long)t->blocksize : -1LL);
    int sb = log2_exact(t->blocksize), sn = t->nested_blocksize ? log2_exact(t->nested_blocksize) : 0;
    if (sb < 4 || sn < 0 || ((uintptr_t)dst & 1))
        return ft_err(FT_E_INVALID, "cuda dequant_nf4: block sizes %lld / %lld must be powers of two "
                      "(>= 16) and the output 2-byte aligned", (long long)t->blocksize,
                      (long long)t->nested_blocksize);
    if (!t->n) return 0;
    FT_CUDA_TRY(nf4_bf16_launch((__nv_bfloat16 *)dst, t, sb, sn, 0, FT_CUDA_CTX(be)->stream));
    return 0;
}
#endif
