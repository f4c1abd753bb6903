/* bf16_ops.c - the CPU twins of the fused bf16 ops and of adamw_multi (bf16_ops.h).
 *
 * Sources of the formulas: RMSNorm, Zhang & Sennrich 2019 (HF LlamaRMSNorm: statistics in fp32);
 * its gradient dh_i = r w_i dy_i - h_i r^3 (1/C) sum_j dy_j w_j h_j with r = rstd; RoPE rotate-half
 * (formats.md 2.2, HF apply_rotary_pos_emb); SwiGLU, Shazeer 2020 "GLU Variants Improve
 * Transformer"; AdamW, kernels/cpu/ops_impl.h adamw. ISO C (-ffp-contract off): every product and
 * sum below is rounded on its own, as the CUDA kernels' __fmul_rn/__fadd_rn. */

#include "kernels/cpu/bf16_ops.h"

#include <math.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_f32.h"
#include "src/core/err.h"
#include "src/numeric/quant.h"

#define BF ft_quant_bf16_to_f32
#define TO_BF ft_quant_f32_to_bf16
#define LANES FT_BF16_ROW_LANES
#define GROUP FT_BF16_ROW_GROUP

int ft_cpu_adamw_multi(const ft_adamw_seg *seg, int64_t n_seg, float beta1, float beta2, float eps,
                       float weight_decay, int64_t step)
{
    if (n_seg < 0 || (n_seg && !seg))
        return ft_err(FT_E_INVALID, "cpu adamw_multi: %lld segments at %p", (long long)n_seg, (const void *)seg);
    for (int64_t k = 0; k < n_seg; k++)
        if (seg[k].n < 0 || (seg[k].n && (!seg[k].p || !seg[k].g || !seg[k].m || !seg[k].v)))
            return ft_err(FT_E_INVALID, "cpu adamw_multi: segment %lld: n = %lld with a NULL array", (long long)k,
                          (long long)seg[k].n);
    for (int64_t k = 0; k < n_seg; k++)
        FT_TRY(ft_cpu_adamw_f32(seg[k].p, seg[k].g, seg[k].m, seg[k].v, seg[k].n, seg[k].lr, beta1, beta2, eps,
                                weight_decay, step));
    return 0;
}

/* The shape rules of the row ops. */
static int row_check(const char *op, int64_t T, int64_t C, const void *a, const void *b, const void *c,
                     const void *d)
{
    if (T < 0 || C < 0 || C % GROUP)
        return ft_err(FT_E_INVALID, "cpu %s: T = %lld, C = %lld, expected >= 0 and C a multiple of %d", op,
                      (long long)T, (long long)C, GROUP);
    if (T && C && (!a || !b || !c || !d)) return ft_err(FT_E_INVALID, "cpu %s: a NULL buffer", op);
    return 0;
}

/* The CUDA warp's butterfly over the lanes' partial sums: every lane ends with the same value
 * (a + b == b + a in IEEE arithmetic), which is returned. */
static float lane_sum(float *acc)
{
    for (int m = LANES / 2; m >= 1; m /= 2) {
        float nx[LANES];
        for (int l = 0; l < LANES; l++) nx[l] = acc[l] + acc[l ^ m];
        for (int l = 0; l < LANES; l++) acc[l] = nx[l];
    }
    return acc[0];
}

int ft_cpu_add_rmsnorm_bf16_fwd(uint16_t *h_out, uint16_t *y, float *rstd, const uint16_t *x,
                                const uint16_t *res, const float *w, int64_t T, int64_t C, float eps)
{
    const char *op = "add_rmsnorm_bf16_fwd";
    FT_TRY(row_check(op, T, C, h_out, y, x, w));
    if (T && !rstd) return ft_err(FT_E_INVALID, "cpu %s: rstd is NULL", op);
    if (!(eps >= 0)) return ft_err(FT_E_INVALID, "cpu %s: eps = %g, expected >= 0", op, (double)eps);
#pragma omp parallel for schedule(static) if (T * C > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xr = x + t * C, *rr = res ? res + t * C : NULL;
        uint16_t *hr = h_out + t * C, *yr = y + t * C;
        float acc[LANES] = {0};
        for (int64_t c = 0; c < C; c++) {
            const float hv = rr ? BF(TO_BF(BF(xr[c]) + BF(rr[c]))) : BF(xr[c]);
            hr[c] = TO_BF(hv);
            acc[(c / GROUP) % LANES] += hv * hv;
        }
        const float mean = C ? lane_sum(acc) / (float)C : 0.0f;
        const float r = 1.0f / sqrtf(mean + eps);
        rstd[t] = r;
        for (int64_t c = 0; c < C; c++) yr[c] = TO_BF(BF(hr[c]) * r * w[c]);
    }
    return 0;
}

int ft_cpu_add_rmsnorm_bf16_bwd(uint16_t *dres_out, const uint16_t *dy, const uint16_t *dres,
                                const uint16_t *h, const float *w, const float *rstd, int64_t T,
                                int64_t C)
{
    const char *op = "add_rmsnorm_bf16_bwd";
    FT_TRY(row_check(op, T, C, dres_out, dy, h, w));
    if (T && !rstd) return ft_err(FT_E_INVALID, "cpu %s: rstd is NULL", op);
#pragma omp parallel for schedule(static) if (T * C > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *dyr = dy + t * C, *hr = h + t * C, *dr = dres ? dres + t * C : NULL;
        uint16_t *outr = dres_out + t * C;
        float acc[LANES] = {0};
        for (int64_t c = 0; c < C; c++) acc[(c / GROUP) % LANES] += BF(dyr[c]) * w[c] * BF(hr[c]);
        const float r = rstd[t];
        const float coef = C ? lane_sum(acc) / (float)C * r * r * r : 0.0f;
        for (int64_t c = 0; c < C; c++) {
            const float g = r * (BF(dyr[c]) * w[c]) - BF(hr[c]) * coef;
            outr[c] = TO_BF(dr ? BF(dr[c]) + g : g);
        }
    }
    return 0;
}

/* x (T, Hx, D) rotated in place by the angles of token t, cos/sin given per frequency. */
static void rope_rows(uint16_t *x, int64_t t, int64_t Hx, int64_t D, const float *cs, const float *sn)
{
    const int64_t half = D / 2;
    for (int64_t hh = 0; hh < Hx; hh++) {
        uint16_t *lo = x + (t * Hx + hh) * D;
        for (int64_t i = 0; i < half; i++) {
            const float x0 = BF(lo[i]), x1 = BF(lo[i + half]);
            lo[i] = TO_BF(x0 * cs[i] - x1 * sn[i]);
            lo[i + half] = TO_BF(x1 * cs[i] + x0 * sn[i]);
        }
    }
}

int ft_cpu_rope_qk_bf16(uint16_t *q, uint16_t *k, const int32_t *pos, const float *inv_freq,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, int inverse)
{
    const char *op = "rope_qk_bf16";
    if (T < 0 || H < 0 || Hkv < 0 || D < 0 || D % 2 || D > FT_CPU_MAX_HEAD_DIM)
        return ft_err(FT_E_INVALID, "cpu %s: T = %lld, H = %lld, Hkv = %lld, D = %lld (expected >= 0, D even "
                      "and <= %d)", op, (long long)T, (long long)H, (long long)Hkv, (long long)D,
                      FT_CPU_MAX_HEAD_DIM);
    if (T && D && (!pos || !inv_freq || (H && !q) || (Hkv && !k)))
        return ft_err(FT_E_INVALID, "cpu %s: a NULL buffer", op);
    const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for schedule(static) if (T * (H + Hkv) * D > FT_CPU_PAR_MIN)
    for (int64_t t = 0; t < T; t++) {
        float cs[FT_CPU_MAX_HEAD_DIM / 2], sn[FT_CPU_MAX_HEAD_DIM / 2];
        for (int64_t i = 0; i < D / 2; i++) {
            const double a = (double)pos[t] * (double)inv_freq[i];
            cs[i] = (float)cos(a);
            sn[i] = (float)(sign * sin(a));
        }
        if (H) rope_rows(q, t, H, D, cs, sn);
        if (Hkv) rope_rows(k, t, Hkv, D, cs, sn);
    }
    return 0;
}

static int elt_check(const char *op, int64_t n, const void *a, const void *b, const void *c)
{
    if (n < 0) return ft_err(FT_E_INVALID, "cpu %s: n = %lld, expected >= 0", op, (long long)n);
    if (n && (!a || !b || !c)) return ft_err(FT_E_INVALID, "cpu %s: a NULL buffer", op);
    return 0;
}

int ft_cpu_swiglu_bf16_fwd(uint16_t *h, const uint16_t *gate, const uint16_t *up, int64_t n)
{
    FT_TRY(elt_check("swiglu_bf16_fwd", n, h, gate, up));
#pragma omp parallel for schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = BF(gate[i]), u = BF(up[i]);
        const float s = 1.0f / (1.0f + expf(-g));
        h[i] = TO_BF(g * s * u);
    }
    return 0;
}

int ft_cpu_swiglu_bf16_bwd(uint16_t *dgate, uint16_t *dup, const uint16_t *dh, const uint16_t *gate,
                           const uint16_t *up, int64_t n)
{
    FT_TRY(elt_check("swiglu_bf16_bwd", n, dgate, dup, dh));
    FT_TRY(elt_check("swiglu_bf16_bwd", n, gate, up, up));
#pragma omp parallel for schedule(static) if (n > FT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = BF(gate[i]), u = BF(up[i]), d = BF(dh[i]);
        const float s = 1.0f / (1.0f + expf(-g));
        dgate[i] = TO_BF(d * u * s * (1.0f + g * (1.0f - s)));
        dup[i] = TO_BF(d * g * s);
    }
    return 0;
}
