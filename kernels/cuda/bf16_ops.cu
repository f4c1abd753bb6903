/* bf16_ops.cu - the fused bf16 activation ops of the op table (kernels.h: add_rmsnorm_bf16_fwd/bwd,
 * rope_qk_bf16, swiglu_bf16_fwd/bwd): bf16 in and out, fp32 arithmetic.
 *
 * Formulas and their sources are the CPU twins' (kernels/cpu/bf16_ops.c), written here operation
 * for operation with explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn:
 * no FMA contraction), so:
 *   - the residual add + RMSNorm (one warp per row; lane l takes the 8-element groups l, l + 32,
 *     ... with one 16-byte load each, in order; the 32 partial sums meet in an xor butterfly) is
 *     the twin's bit for bit;
 *   - RoPE (one thread per token and frequency, over the q heads then the k heads; cos/sin in
 *     double as rope_fwd) and SwiGLU (expf) are the twin's up to the device's sin/cos/expf,
 *     which need not round as glibc's: one bf16 rounding apart, more near zero where the
 *     expression cancels (tests/gpu/test_cuda_fused.c's tolerances).
 * tests/emu/emu_bf16_ops.cc runs these kernels on the CPU (cuda_emu.h), where they call glibc's
 * functions: there every op equals its twin bit for bit. Throughput is not measured yet (no GPU
 * in the session that wrote them; docs/gpu.md).
 */
#include "kernels/cuda/cuda_common.h"

#include <math.h>
#include <string.h>

#define BF16_GROUP 8  /* bf16 per 16-byte load (kernels/cpu/bf16_ops.h FT_BF16_ROW_GROUP) */
#define BF16_WARPS 4  /* rows (warps) per block of the row kernels */

static __device__ __forceinline__ float bf16_f(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet (src/numeric/quant.c bf16_rne). */
static __device__ __forceinline__ uint16_t f_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* 8 bf16 of a 16-byte word, widened. */
static __device__ __forceinline__ void bf16x8_load(float *f, const uint16_t *p)
{
    const uint4 w = *(const uint4 *)p;
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    for (int e = 0; e < 4; e++) {
        f[2 * e] = bf16_f((uint16_t)(u[e] & 0xffffu));
        f[2 * e + 1] = bf16_f((uint16_t)(u[e] >> 16));
    }
}

static __device__ __forceinline__ void bf16x8_store(uint16_t *p, const float *f)
{
    uint32_t u[4];
    for (int e = 0; e < 4; e++) u[e] = (uint32_t)f_bf16(f[2 * e]) | (uint32_t)f_bf16(f[2 * e + 1]) << 16;
    *(uint4 *)p = make_uint4(u[0], u[1], u[2], u[3]);
}

/* The butterfly over the warp (every lane gets the same sum: a + b == b + a). */
static __device__ __forceinline__ float warp_sum_bfly(float v)
{
    for (int m = 16; m >= 1; m /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* One warp per row t: h = bf16(x + res), rstd, y = bf16(h rstd w). */
__global__ void __launch_bounds__(32 * BF16_WARPS)
k_add_rmsnorm_bf16_fwd(uint16_t *h_out, uint16_t *y, float *rstd, const uint16_t *x, const uint16_t *res,
                       const float *w, int64_t T, int64_t C, float eps)
{
    const int64_t t = (int64_t)blockIdx.x * BF16_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (t >= T) return; /* the whole warp */
    const int64_t ng = C / BF16_GROUP, row = t * C;
    float acc = 0.0f;
    for (int64_t g = lane; g < ng; g += 32) {
        float hv[BF16_GROUP];
        bf16x8_load(hv, x + row + g * BF16_GROUP);
        if (res) {
            float rv[BF16_GROUP];
            bf16x8_load(rv, res + row + g * BF16_GROUP);
            for (int e = 0; e < BF16_GROUP; e++) hv[e] = bf16_f(f_bf16(__fadd_rn(hv[e], rv[e])));
        }
        for (int e = 0; e < BF16_GROUP; e++) acc = __fadd_rn(acc, __fmul_rn(hv[e], hv[e]));
        bf16x8_store(h_out + row + g * BF16_GROUP, hv);
    }
    const float s = warp_sum_bfly(acc);
    const float mean = C ? __fdiv_rn(s, (float)C) : 0.0f;
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    if (lane == 0) rstd[t] = r;
    for (int64_t g = lane; g < ng; g += 32) {
        float hv[BF16_GROUP];
        bf16x8_load(hv, h_out + row + g * BF16_GROUP); /* this lane's own stores */
        for (int e = 0; e < BF16_GROUP; e++) hv[e] = __fmul_rn(__fmul_rn(hv[e], r), w[g * BF16_GROUP + e]);
        bf16x8_store(y + row + g * BF16_GROUP, hv);
    }
}

/* One warp per row t: dres_out = bf16(dres + r (dy w) - h coef), coef = mean(dy w h) r^3. */
__global__ void __launch_bounds__(32 * BF16_WARPS)
k_add_rmsnorm_bf16_bwd(uint16_t *dres_out, const uint16_t *dy, const uint16_t *dres, const uint16_t *h,
                       const float *w, const float *rstd, int64_t T, int64_t C)
{
    const int64_t t = (int64_t)blockIdx.x * BF16_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (t >= T) return;
    const int64_t ng = C / BF16_GROUP, row = t * C;
    float acc = 0.0f;
    for (int64_t g = lane; g < ng; g += 32) {
        float dv[BF16_GROUP], hv[BF16_GROUP];
        bf16x8_load(dv, dy + row + g * BF16_GROUP);
        bf16x8_load(hv, h + row + g * BF16_GROUP);
        for (int e = 0; e < BF16_GROUP; e++)
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(dv[e], w[g * BF16_GROUP + e]), hv[e]));
    }
    const float s = warp_sum_bfly(acc), r = rstd[t];
    const float coef = C ? __fmul_rn(__fmul_rn(__fmul_rn(__fdiv_rn(s, (float)C), r), r), r) : 0.0f;
    for (int64_t g = lane; g < ng; g += 32) {
        float dv[BF16_GROUP], hv[BF16_GROUP], o[BF16_GROUP];
        bf16x8_load(dv, dy + row + g * BF16_GROUP);
        bf16x8_load(hv, h + row + g * BF16_GROUP);
        if (dres) bf16x8_load(o, dres + row + g * BF16_GROUP);
        for (int e = 0; e < BF16_GROUP; e++) {
            const float gr = __fadd_rn(__fmul_rn(r, __fmul_rn(dv[e], w[g * BF16_GROUP + e])), -__fmul_rn(hv[e], coef));
            o[e] = dres ? __fadd_rn(o[e], gr) : gr;
        }
        bf16x8_store(dres_out + row + g * BF16_GROUP, o);
    }
}

/* Heads hx of x (T, Hx, D) at token t, frequency i, rotated by (cs, sn). */
static __device__ __forceinline__ void rope_heads(uint16_t *x, int64_t t, int64_t Hx, int64_t D, int64_t i,
                                                  float cs, float sn)
{
    const int64_t half = D / 2;
    for (int64_t hh = 0; hh < Hx; hh++) {
        uint16_t *lo = x + (t * Hx + hh) * D;
        const float x0 = bf16_f(lo[i]), x1 = bf16_f(lo[i + half]);
        lo[i] = f_bf16(__fadd_rn(__fmul_rn(x0, cs), -__fmul_rn(x1, sn)));
        lo[i + half] = f_bf16(__fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn)));
    }
}

__global__ void k_rope_qk_bf16(uint16_t *q, uint16_t *k, const int32_t *pos, const float *inv_freq, int64_t T,
                               int64_t H, int64_t Hkv, int64_t D, double sign)
{
    const int64_t half = D / 2;
    for (int64_t gi = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; gi < T * half;
         gi += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = gi / half, i = gi % half;
        double sd, cd;
        sincos((double)pos[t] * (double)inv_freq[i], &sd, &cd);
        const float cs = (float)cd, sn = (float)(sign * sd);
        if (H) rope_heads(q, t, H, D, i, cs, sn);
        if (Hkv) rope_heads(k, t, Hkv, D, i, cs, sn);
    }
}

__global__ void k_swiglu_bf16_fwd(uint16_t *h, const uint16_t *gate, const uint16_t *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = bf16_f(gate[i]), u = bf16_f(up[i]);
        const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
        h[i] = f_bf16(__fmul_rn(__fmul_rn(g, s), u));
    }
}

__global__ void k_swiglu_bf16_bwd(uint16_t *dgate, uint16_t *dup, const uint16_t *dh, const uint16_t *gate,
                                  const uint16_t *up, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = bf16_f(gate[i]), u = bf16_f(up[i]), d = bf16_f(dh[i]);
        const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
        const float k = __fadd_rn(1.0f, __fmul_rn(g, __fadd_rn(1.0f, -s)));
        dgate[i] = f_bf16(__fmul_rn(__fmul_rn(__fmul_rn(d, u), s), k));
        dup[i] = f_bf16(__fmul_rn(__fmul_rn(d, g), s));
    }
}

/* ---- argument checks (kernels.h's rules, the twins' messages with "cuda") ----------------- */

static int bf16_row_check(const char *op, int64_t T, int64_t C, const void *const *p, int np)
{
    if (T < 0 || C < 0 || C % BF16_GROUP || T > (int64_t)BF16_WARPS * 0x7fffffff)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, C = %lld, expected >= 0 and C a multiple of %d", op,
                      (long long)T, (long long)C, BF16_GROUP);
    if (!T || !C) return 0;
    for (int i = 0; i < np; i++)
        if (!p[i]) return ft_err(FT_E_INVALID, "cuda %s: a NULL buffer", op);
    const int bad = ft_cuda_misaligned16(p, np);
    if (bad >= 0) return ft_err(FT_E_INVALID, "cuda %s: buffer %d is not 16-byte aligned", op, bad);
    return 0;
}

#ifndef FT_MMA_EMU
static unsigned bf16_row_blocks(int64_t T) { return (unsigned)((T + BF16_WARPS - 1) / BF16_WARPS); }

extern "C" int ft_cuda_add_rmsnorm_bf16_fwd(ft_backend *be, uint16_t *h_out, uint16_t *y, float *rstd,
                                            const uint16_t *x, const uint16_t *res, const float *w, int64_t T,
                                            int64_t C, float eps)
{
    const char *op = "add_rmsnorm_bf16_fwd";
    const void *p[] = {h_out, y, x, res ? (const void *)res : (const void *)x}; /* the 16-byte loads */
    FT_TRY(bf16_row_check(op, T, C, p, 4));
    if (T && C && !w) return ft_err(FT_E_INVALID, "cuda %s: w is NULL", op);
    if (!(eps >= 0)) return ft_err(FT_E_INVALID, "cuda %s: eps = %g, expected >= 0", op, (double)eps);
    if (T && !rstd) return ft_err(FT_E_INVALID, "cuda %s: rstd is NULL", op);
    if (!T) return 0;
    k_add_rmsnorm_bf16_fwd<<<bf16_row_blocks(T), 32 * BF16_WARPS, 0, FT_CUDA_CTX(be)->stream>>>(h_out, y, rstd, x,
                                                                                               res, w, T, C, eps);
    FT_CUDA_LAUNCH(op);
    return 0;
}

extern "C" int ft_cuda_add_rmsnorm_bf16_bwd(ft_backend *be, uint16_t *dres_out, const uint16_t *dy,
                                            const uint16_t *dres, const uint16_t *h, const float *w,
                                            const float *rstd, int64_t T, int64_t C)
{
    const char *op = "add_rmsnorm_bf16_bwd";
    const void *p[] = {dres_out, dy, h, dres ? (const void *)dres : (const void *)dy};
    FT_TRY(bf16_row_check(op, T, C, p, 4));
    if (T && C && !w) return ft_err(FT_E_INVALID, "cuda %s: w is NULL", op);
    if (T && !rstd) return ft_err(FT_E_INVALID, "cuda %s: rstd is NULL", op);
    if (!T) return 0;
    k_add_rmsnorm_bf16_bwd<<<bf16_row_blocks(T), 32 * BF16_WARPS, 0, FT_CUDA_CTX(be)->stream>>>(dres_out, dy, dres,
                                                                                               h, w, rstd, T, C);
    FT_CUDA_LAUNCH(op);
    return 0;
}

extern "C" int ft_cuda_rope_qk_bf16(ft_backend *be, uint16_t *q, uint16_t *k, const int32_t *pos,
                                    const float *inv_freq, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                    int inverse)
{
    const char *op = "rope_qk_bf16";
    if (T < 0 || H < 0 || Hkv < 0 || D < 0 || D % 2 || D > 1024)
        return ft_err(FT_E_INVALID, "cuda %s: T = %lld, H = %lld, Hkv = %lld, D = %lld (expected >= 0, D even "
                      "and <= 1024)", op, (long long)T, (long long)H, (long long)Hkv, (long long)D);
    if (!T || !D || (!H && !Hkv)) return 0;
    if (!pos || !inv_freq || (H && !q) || (Hkv && !k)) return ft_err(FT_E_INVALID, "cuda %s: a NULL buffer", op);
    k_rope_qk_bf16<<<ft_cuda_blocks(T * (D / 2), 128), 128, 0, FT_CUDA_CTX(be)->stream>>>(
        q, k, pos, inv_freq, T, H, Hkv, D, inverse ? -1.0 : 1.0);
    FT_CUDA_LAUNCH(op);
    return 0;
}

extern "C" int ft_cuda_swiglu_bf16_fwd(ft_backend *be, uint16_t *h, const uint16_t *gate, const uint16_t *up,
                                       int64_t n)
{
    if (n < 0) return ft_err(FT_E_INVALID, "cuda swiglu_bf16_fwd: n = %lld, expected >= 0", (long long)n);
    if (!n) return 0;
    if (!h || !gate || !up) return ft_err(FT_E_INVALID, "cuda swiglu_bf16_fwd: a NULL buffer");
    k_swiglu_bf16_fwd<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(h, gate, up, n);
    FT_CUDA_LAUNCH("swiglu_bf16_fwd");
    return 0;
}

extern "C" int ft_cuda_swiglu_bf16_bwd(ft_backend *be, uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                                       const uint16_t *gate, const uint16_t *up, int64_t n)
{
    if (n < 0) return ft_err(FT_E_INVALID, "cuda swiglu_bf16_bwd: n = %lld, expected >= 0", (long long)n);
    if (!n) return 0;
    if (!dgate || !dup || !dh || !gate || !up) return ft_err(FT_E_INVALID, "cuda swiglu_bf16_bwd: a NULL buffer");
    k_swiglu_bf16_bwd<<<ft_cuda_blocks(n, 256), 256, 0, FT_CUDA_CTX(be)->stream>>>(dgate, dup, dh, gate, up, n);
    FT_CUDA_LAUNCH("swiglu_bf16_bwd");
    return 0;
}
#endif
