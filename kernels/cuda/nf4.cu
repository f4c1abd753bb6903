/* nf4.cu - NF4 (bitsandbytes, double quantization) to bf16 on the GPU (kernels.h
 * dequant_nf4). One thread per code byte (two elements): the block's absmax is rebuilt with
 * bitsandbytes' two fp32 roundings (map value times nested absmax, then plus the offset:
 * __fmul_rn / __fadd_rn, so nvcc cannot contract them into one FMA), the element is code[q]
 * times absmax in fp32, then rounded to bf16 (nearest even). The fp32 values are bit-identical
 * to the CPU's ft_nf4_dequant (src/model/nf4.c, compiled without contraction).
 * The QLoRA path dequantizes one layer's projections per layer visit into a bf16 staging
 * buffer that the bf16 GEMMs read (kernels.h linear_fwd); fusing the dequantization into the
 * GEMM's operand load is the next step. Arithmetic per element is exactly the scalar one. */
#include "kernels/cuda/cuda_common.h"

#include <cuda_bf16.h>

/* One thread per 16 elements (8 code bytes, one 8-byte load, two 16-byte stores); block sizes
 * are powers of two >= 16 (bnb's valid sizes; checked by the caller), so the block index is a
 * shift. The tail (n not a multiple of 16) is done element by element. */
__device__ __forceinline__ float nf4_absmax(const ft_nf4_tensor &t, int64_t b, int sh_nested)
{
    return t.nested_blocksize
               ? __fadd_rn(__fmul_rn(t.nested_map[t.qabsmax[b]], t.nested_absmax[b >> sh_nested]),
                           t.offset)
               : t.absmax[b];
}

__global__ void k_nf4_bf16(__nv_bfloat16 *dst, ft_nf4_tensor t, int sh_block, int sh_nested)
{
    __shared__ float code[16];
    if (threadIdx.x < 16) code[threadIdx.x] = t.code[threadIdx.x];
    __syncthreads();
    int64_t n16 = t.n / 16;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = 16 * i;
        float am = nf4_absmax(t, e >> sh_block, sh_nested);
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
        float am = nf4_absmax(t, e >> sh_block, sh_nested);
        dst[e] = __float2bfloat16_rn(__fmul_rn(code[(e & 1) ? (c & 15) : (c >> 4)], am));
    }
}

static int log2_exact(int64_t v)
{
    int s = 0;
    while (((int64_t)1 << s) < v) s++;
    return ((int64_t)1 << s) == v ? s : -1;
}

extern "C" int ft_cuda_dequant_nf4(ft_backend *be, uint16_t *dst, const ft_nf4_tensor *t)
{
    if (!t || t->n < 0 || t->blocksize < 2 || (t->blocksize & 1) || t->nested_blocksize < 0 ||
        !t->codes || !t->code || (t->nested_blocksize ? !t->qabsmax || !t->nested_absmax || !t->nested_map
                                                      : !t->absmax))
        return ft_err(FT_E_INVALID, "cuda dequant_nf4: bad tensor description (n %lld, blocksize %lld)",
                      t ? (long long)t->n : -1LL, t ? (long long)t->blocksize : -1LL);
    int sb = log2_exact(t->blocksize), sn = t->nested_blocksize ? log2_exact(t->nested_blocksize) : 0;
    if (sb < 4 || sn < 0 || ((uintptr_t)t->codes & 7) || ((uintptr_t)dst & 15))
        return ft_err(FT_E_INVALID, "cuda dequant_nf4: block sizes %lld / %lld must be powers of two "
                      "(>= 16) and the buffers 8/16-byte aligned", (long long)t->blocksize,
                      (long long)t->nested_blocksize);
    if (!t->n) return 0;
    k_nf4_bf16<<<ft_cuda_blocks(t->n / 16 + 1, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(
        (__nv_bfloat16 *)dst, *t, sb, sn);
    FT_CUDA_LAUNCH("dequant_nf4");
    return 0;
}
