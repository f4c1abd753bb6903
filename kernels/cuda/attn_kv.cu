/* attn_kv.cu - attention against a KV cache for generation (kernels.h attention_kv_fwd):
 * one warp per (query row, head), an online softmax over the cached keys (the forward of
 * FlashAttention, Dao 2022, one key at a time), D <= 256 held in registers (8 per lane).
 * Generation is one or a few query rows per call, so a warp per row is enough. */
#include "kernels/cuda/cuda_common.h"
#include <math.h>

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define MAXD 256
#define PER (MAXD / 32)

__global__ void k_kv(float *out, const float *q, const float *k, const float *v, int64_t p,
                     int64_t n_q, int64_t H, int64_t Hkv, int64_t D, float scale)
{
    int lane = threadIdx.x & 31;
    int64_t t = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    int64_t h = blockIdx.y;
    if (t >= n_q) return;
    int64_t g = h / (H / Hkv);
    float qr[PER], acc[PER];
    for (int c = 0; c < PER; c++) {
        int64_t d = lane + 32 * c;
        qr[c] = d < D ? q[(t * H + h) * D + d] : 0.f;
        acc[c] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t j = 0; j <= p + t; j++) {
        const float *kj = k + (j * Hkv + g) * D, *vj = v + (j * Hkv + g) * D;
        float s = 0.f;
        for (int c = 0; c < PER; c++) {
            int64_t d = lane + 32 * c;
            if (d < D) s += qr[c] * kj[d];
        }
        s = warp_sum(s) * scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), pe = expf(s - mn);
        l = l * corr + pe;
        for (int c = 0; c < PER; c++) {
            int64_t d = lane + 32 * c;
            acc[c] = acc[c] * corr + (d < D ? pe * vj[d] : 0.f);
        }
        m = mn;
    }
    for (int c = 0; c < PER; c++) {
        int64_t d = lane + 32 * c;
        if (d < D) out[(t * H + h) * D + d] = acc[c] / l;
    }
}

extern "C" int ft_cuda_attention_kv_fwd(ft_backend *be, float *out, const float *q, const float *k,
                                        const float *v, int64_t p, int64_t n_q, int64_t H,
                                        int64_t Hkv, int64_t D, float scale)
{
    if (p < 0 || n_q < 0 || H < 0 || Hkv < 1 || H % Hkv || D < 1 || D > MAXD)
        return ft_err(FT_E_INVALID, "cuda attention_kv_fwd: bad shape");
    if (!n_q || !H) return 0;
    dim3 grid((unsigned)((n_q + 3) / 4), (unsigned)H);
    k_kv<<<grid, 128, 0, FT_CUDA_CTX(be)->stream>>>(out, q, k, v, p, n_q, H, Hkv, D, scale);
    FT_CUDA_LAUNCH("attention_kv_fwd");
    return 0;
}
