/* emu_bf16_ops.cc - kernels/cuda/bf16_ops.cu's fused bf16 kernels run as written on the CPU
 * (tests/emu/cuda_emu.h: one warp per row, the shuffle butterfly) against their CPU twins
 * (kernels/cpu/bf16_ops.c), bit for bit (tolerance 0: on the host both call glibc's sin, cos and
 * expf), and the twins against the formulas:
 *   - residual add + RMSNorm forward (with and without the residual, in place on it) and
 *     backward (with and without the residual gradient, in place): T 1, 3, 5, 9 (partial blocks
 *     of 4 rows), C 8, 64, 256, 264, 576, 2056 (1 .. 9 groups per lane); against fp64 RMSNorm of
 *     the same bf16 inputs: |y - ref| <= 2^-8 |ref| + 1e-6 (bf16 rounding of the output, fp32
 *     sums), rstd within 1e-5 relative, dres within 2^-8 |ref| + 1e-5 sum |terms|;
 *   - RoPE on q and k (H 4, Hkv 2 and 1, D 8, 64, 128; positions up to 8191; forward and
 *     inverse): the twin equals the fp32 rope_fwd/rope_bwd of the widened values rounded to bf16,
 *     bit for bit; inverse after forward returns the input within 2 bf16 ulp;
 *   - SwiGLU forward/backward (gate from -30 to 30: exp overflow): the twin equals the fp32
 *     swiglu_fwd/bwd of the widened values rounded to bf16, within 1 bf16 ulp (exact counted).
 * Exit status 1 when a check fails. make BUILD=build build/tests/emu_bf16_ops */
#ifndef FT_MMA_EMU
#define FT_MMA_EMU 1
#endif
#pragma GCC diagnostic ignored "-Wunused-function" /* cuda_emu.h's tensor-core primitives */
#include "tests/emu/cuda_emu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/bf16_ops.cu"

extern "C" {
#include "kernels/cpu/bf16_ops.h"
#include "kernels/cpu/cpu_f32.h"
#include "src/numeric/quant.h"
}

alignas(128) uint8_t sm[EMU_SMEM_BYTES + EMU_GUARD];
typedef std::vector<uint16_t> bvec;

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float urand(float lo, float hi)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return lo + (hi - lo) * (float)((rs >> 40) / 16777216.0);
}
static bvec brand(int64_t n, float lo, float hi)
{
    bvec v(n);
    for (auto &x : v) x = ft_quant_f32_to_bf16(urand(lo, hi));
    return v;
}
static float bf(uint16_t b) { return ft_quant_bf16_to_f32(b); }
static long differ(const bvec &a, const bvec &b) /* bit mismatches */
{
    long n = 0;
    for (size_t i = 0; i < a.size(); i++) n += a[i] != b[i];
    return n;
}
/* distance in bf16 ulps (same-sign ordering of the bits) */
static long ulps(uint16_t a, uint16_t b)
{
    const long ia = a & 0x8000 ? -(long)(a & 0x7fff) : (long)a, ib = b & 0x8000 ? -(long)(b & 0x7fff) : (long)b;
    return labs(ia - ib);
}

static int fails, cases;
static void verdict(bool ok, const char *what)
{
    cases++;
    fails += !ok;
    if (!ok) printf("emu bf16_ops: %s FAIL\n", what);
}

static void rmsnorm_case(int64_t T, int64_t C, bool with_res, bool inplace)
{
    char what[160];
    snprintf(what, sizeof what, "add_rmsnorm T %lld C %lld%s%s", (long long)T, (long long)C,
             with_res ? " +res" : "", inplace ? " in place" : "");
    const float eps = 1e-5f;
    bvec x = brand(T * C, -2, 2), res = brand(T * C, -3, 3), dy = brand(T * C, -1, 1), dres = brand(T * C, -1, 1);
    std::vector<float> w(C);
    for (auto &v : w) v = urand(0.5f, 1.5f);
    /* kernel (emu) */
    bvec hk(T * C), yk(T * C), rk = res;
    std::vector<float> rsk(T);
    uint16_t *hk_p = inplace && with_res ? rk.data() : hk.data();
    emu_kernel(k_add_rmsnorm_bf16_fwd, dim3((unsigned)((T + BF16_WARPS - 1) / BF16_WARPS)), dim3(32 * BF16_WARPS), 0,
               hk_p, yk.data(), rsk.data(), (const uint16_t *)x.data(), with_res ? (const uint16_t *)rk.data() : nullptr,
               (const float *)w.data(), T, C, eps);
    /* twin */
    bvec ht(T * C), yt(T * C), rt = res;
    std::vector<float> rst(T);
    uint16_t *ht_p = inplace && with_res ? rt.data() : ht.data();
    const int rc = ft_cpu_add_rmsnorm_bf16_fwd(ht_p, yt.data(), rst.data(), x.data(), with_res ? rt.data() : NULL,
                                               w.data(), T, C, eps);
    bvec hkv(hk_p, hk_p + T * C), htv(ht_p, ht_p + T * C);
    bool ok = rc == 0 && !differ(hkv, htv) && !differ(yk, yt) && !memcmp(rsk.data(), rst.data(), T * 4);
    /* formula, fp64 */
    for (int64_t t = 0; ok && t < T; t++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++) {
            const double h = with_res ? (double)bf(ft_quant_f32_to_bf16(bf(x[t * C + c]) + bf(res[t * C + c])))
                                      : (double)bf(x[t * C + c]);
            ok &= bf(htv[t * C + c]) == (float)h;
            ss += h * h;
        }
        const double r = 1 / sqrt(ss / C + eps);
        ok &= fabs(rst[t] - r) <= 1e-5 * r;
        for (int64_t c = 0; c < C; c++) {
            const double ref = (double)bf(htv[t * C + c]) * r * w[c];
            ok &= fabs(bf(yt[t * C + c]) - ref) <= ldexp(fabs(ref), -8) + 1e-6;
        }
    }
    verdict(ok, what);
    /* backward, on the forward's h */
    for (int with_d = 0; with_d <= 1; with_d++) {
        snprintf(what, sizeof what, "add_rmsnorm_bwd T %lld C %lld%s%s", (long long)T, (long long)C,
                 with_d ? " +dres" : "", inplace ? " in place" : "");
        bvec ok_k(T * C), ok_t(T * C), dk = dres, dt = dres;
        uint16_t *ok_p = inplace && with_d ? dk.data() : ok_k.data(), *ot_p = inplace && with_d ? dt.data() : ok_t.data();
        emu_kernel(k_add_rmsnorm_bf16_bwd, dim3((unsigned)((T + BF16_WARPS - 1) / BF16_WARPS)), dim3(32 * BF16_WARPS),
                   0, ok_p, (const uint16_t *)dy.data(), with_d ? (const uint16_t *)dk.data() : nullptr,
                   (const uint16_t *)htv.data(), (const float *)w.data(), (const float *)rst.data(), T, C);
        const int rc2 = ft_cpu_add_rmsnorm_bf16_bwd(ot_p, dy.data(), with_d ? dt.data() : NULL, htv.data(), w.data(),
                                                    rst.data(), T, C);
        bvec okv(ok_p, ok_p + T * C), otv(ot_p, ot_p + T * C);
        bool ok2 = rc2 == 0 && !differ(okv, otv);
        for (int64_t t = 0; ok2 && t < T; t++) {
            double dot = 0, mag = 0;
            const double r = rst[t];
            for (int64_t c = 0; c < C; c++) {
                dot += (double)bf(dy[t * C + c]) * w[c] * bf(htv[t * C + c]);
                mag += fabs((double)bf(dy[t * C + c]) * w[c] * bf(htv[t * C + c]));
            }
            for (int64_t c = 0; c < C; c++) {
                const double h = bf(htv[t * C + c]), g = r * bf(dy[t * C + c]) * w[c] - h * r * r * r * dot / C;
                const double ref = (with_d ? (double)bf(dres[t * C + c]) : 0.0) + g;
                const double tol = ldexp(fabs(ref), -8) + 1e-5 * (fabs(h) * r * r * r * mag / C + r * fabs(bf(dy[t * C + c]) * w[c]) + 1e-3);
                ok2 &= fabs(bf(otv[t * C + c]) - ref) <= tol;
            }
        }
        verdict(ok2, what);
    }
}

static void rope_case(int64_t T, int64_t H, int64_t Hkv, int64_t D)
{
    char what[160];
    snprintf(what, sizeof what, "rope_qk T %lld H %lld Hkv %lld D %lld", (long long)T, (long long)H, (long long)Hkv,
             (long long)D);
    std::vector<int32_t> pos(T);
    for (int64_t t = 0; t < T; t++) pos[t] = t % 3 == 2 ? (int32_t)(8191 - t) : (int32_t)t;
    std::vector<float> inv(D / 2);
    for (int64_t i = 0; i < D / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / D);
    const bvec q0 = brand(T * H * D, -3, 3), k0 = brand(T * Hkv * D, -3, 3);
    bool ok = true;
    for (int inverse = 0; inverse <= 1; inverse++) {
        bvec qk = q0, kk = k0, qt = q0, kt = k0;
        emu_kernel(k_rope_qk_bf16, dim3(3), dim3(64), 0, qk.data(), kk.data(), (const int32_t *)pos.data(),
                   (const float *)inv.data(), T, H, Hkv, D, inverse ? -1.0 : 1.0);
        ok &= ft_cpu_rope_qk_bf16(qt.data(), kt.data(), pos.data(), inv.data(), T, H, Hkv, D, inverse) == 0;
        ok &= !differ(qk, qt) && !differ(kk, kt);
        /* the twin = the fp32 op on the widened values, rounded */
        std::vector<float> qf(T * H * D), kf(T * Hkv * D);
        for (size_t i = 0; i < qf.size(); i++) qf[i] = bf(q0[i]);
        for (size_t i = 0; i < kf.size(); i++) kf[i] = bf(k0[i]);
        if (inverse) {
            ok &= ft_cpu_rope_bwd_f32(qf.data(), pos.data(), inv.data(), T, H, D) == 0;
            ok &= ft_cpu_rope_bwd_f32(kf.data(), pos.data(), inv.data(), T, Hkv, D) == 0;
        } else {
            ok &= ft_cpu_rope_fwd_f32(qf.data(), pos.data(), inv.data(), T, H, D) == 0;
            ok &= ft_cpu_rope_fwd_f32(kf.data(), pos.data(), inv.data(), T, Hkv, D) == 0;
        }
        for (size_t i = 0; i < qf.size(); i++) ok &= qt[i] == ft_quant_f32_to_bf16(qf[i]);
        for (size_t i = 0; i < kf.size(); i++) ok &= kt[i] == ft_quant_f32_to_bf16(kf[i]);
        if (!inverse) { /* inverse of forward: back to the input within 2 bf16 ulp (two roundings) */
            bvec qb = qt, kb = kt;
            ok &= ft_cpu_rope_qk_bf16(qb.data(), kb.data(), pos.data(), inv.data(), T, H, Hkv, D, 1) == 0;
            for (size_t i = 0; i < qb.size(); i++) ok &= fabsf(bf(qb[i]) - bf(q0[i])) <= ldexpf(fabsf(bf(q0[i])), -6) + 0.05f;
        }
    }
    verdict(ok, what);
}

static void swiglu_case(int64_t n)
{
    char what[96];
    snprintf(what, sizeof what, "swiglu n %lld", (long long)n);
    const bvec g = brand(n, -30, 30), u = brand(n, -4, 4), dh = brand(n, -2, 2);
    bvec hk(n), ht(n), dgk(n), duk(n), dgt(n), dut(n);
    emu_kernel(k_swiglu_bf16_fwd, dim3(2), dim3(96), 0, hk.data(), (const uint16_t *)g.data(), (const uint16_t *)u.data(), n);
    emu_kernel(k_swiglu_bf16_bwd, dim3(2), dim3(96), 0, dgk.data(), duk.data(), (const uint16_t *)dh.data(),
               (const uint16_t *)g.data(), (const uint16_t *)u.data(), n);
    bool ok = ft_cpu_swiglu_bf16_fwd(ht.data(), g.data(), u.data(), n) == 0 &&
              ft_cpu_swiglu_bf16_bwd(dgt.data(), dut.data(), dh.data(), g.data(), u.data(), n) == 0;
    ok &= !differ(hk, ht) && !differ(dgk, dgt) && !differ(duk, dut);
    std::vector<float> gf(n), uf(n), df(n), hf(n), dgf(n), duf(n);
    for (int64_t i = 0; i < n; i++) gf[i] = bf(g[i]), uf[i] = bf(u[i]), df[i] = bf(dh[i]);
    ok &= ft_cpu_swiglu_fwd_f32(hf.data(), gf.data(), uf.data(), n) == 0;
    ok &= ft_cpu_swiglu_bwd_f32(dgf.data(), duf.data(), df.data(), gf.data(), uf.data(), n) == 0;
    long worst = 0, exact = 0;
    for (int64_t i = 0; i < n; i++) {
        const long e = std::max(ulps(ht[i], ft_quant_f32_to_bf16(hf[i])),
                                std::max(ulps(dgt[i], ft_quant_f32_to_bf16(dgf[i])), ulps(dut[i], ft_quant_f32_to_bf16(duf[i]))));
        worst = std::max(worst, e);
        exact += e == 0;
    }
    ok &= worst <= 1;
    printf("emu bf16_ops: swiglu n %lld: twin vs fp32 op rounded: %ld of %lld exact, worst %ld bf16 ulp\n", (long long)n,
           exact, (long long)n, worst);
    verdict(ok, what);
}

int main()
{
    emu_set_smem(sm);
    static const int64_t Ts[] = {1, 3, 5, 9}, Cs[] = {8, 64, 256, 264, 576, 2056};
    for (int ti = 0; ti < 4; ti++)
        for (int ci = 0; ci < 6; ci++)
            for (int mode = 0; mode < 3; mode++) rmsnorm_case(Ts[ti], Cs[ci], mode > 0, mode == 2);
    static const int64_t Ds[] = {8, 64, 128};
    for (int di = 0; di < 3; di++) {
        rope_case(7, 4, 2, Ds[di]);
        rope_case(33, 4, 1, Ds[di]);
    }
    swiglu_case(1);
    swiglu_case(4099);
    /* refusals shared by both sides: C not a multiple of 8 */
    {
        uint16_t b[16] = {0};
        float w[12] = {0}, r[1];
        const void *p[] = {b, b, b, w, b};
        verdict(ft_cpu_add_rmsnorm_bf16_fwd(b, b, r, b, NULL, w, 1, 12, 1e-5f) != 0 && bf16_row_check("t", 1, 12, p, 5) != 0,
                "C = 12 refused by the twin and the kernel's check");
    }
    printf("%s: %d cases, %d failed (kernels vs CPU twins bit for bit; twins vs the formulas)\n",
           fails ? "FAILED" : "ok", cases, fails);
    return fails != 0;
}
