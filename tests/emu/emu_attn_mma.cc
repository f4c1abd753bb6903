/* emu_attn_mma.cc - kernels/cuda/attn_mma.cu's FlashAttention-2 kernels (forward, dq, dk/dv,
 * the bf16 pre-passes and the GQA group sum) run as written on the CPU through the CUDA
 * emulation of tests/emu/cuda_emu.h, against the CPU backend's attention_fwd / attention_bwd:
 * head dims 64 and 128, MHA and GQA, one sequence and packed ones (ragged 1..70, every token
 * alone, runs of 1..16), T from 1 to 513 (ragged last tiles). Relative 2-norm error <= 1e-2
 * per output (out, lse, dq, dk, dv; 1e-6 rms where the reference is zero up to rounding);
 * cp.async lands early in even cases and late in odd ones (cuda_emu.h). Exit status 1 when a
 * check fails; the emulation aborts on a shared-memory, divergence or deadlock error.
 * Usage: emu_attn_mma [n_cases]   (default: all 12, about 3 s in all)
 * Built by the Makefile (CUDA=1: the cuda headers give the types) with a host C++ compiler:
 *   g++ -std=c++20 -O2 -fno-strict-aliasing -DFT_MMA_EMU -I. -I$CUDA_HOME/include \
 *       tests/emu/emu_attn_mma.cc libftune.a $(LIBS) */
#ifndef FT_MMA_EMU
#define FT_MMA_EMU 1 /* the kernel file leaves out its PTX and launches */
#endif
#include "tests/emu/cuda_emu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "kernels/kernels.h"
#include "src/core/err.h"

/* attn_mma.cu's primitives (its inline PTX is left out under FT_MMA_EMU) */
static inline uint32_t smem_u32(const void *p) { return emu_smem_u32(p); }
static inline void ldsm4(uint32_t (&r)[4], uint32_t addr) { emu_ldsm(r, addr, false); }
static inline void ldsm4t(uint32_t (&r)[4], uint32_t addr) { emu_ldsm(r, addr, true); }
static inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    emu_mma16816(c, a, b0, b1);
}
static inline void cp16(uint32_t dst, const void *src, bool ok) { emu_cp_async(dst, src, 16, ok ? 16 : 0); }
static inline void cp_commit() { emu_cp_commit(); }
template <int N> static inline void cp_wait() { emu_cp_wait(N); }

#include "kernels/cuda/attn_mma.cu"

/* The kernels' extern __shared__ array. */
alignas(128) uint4 mma_smem[(EMU_SMEM_BYTES + EMU_GUARD) / 16];

/* ft_cuda_mma_attention_fwd / _bwd's launches, on host memory. */
static void emu_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                    const int32_t *ss, int T, int H, int Hkv, int D, float scale)
{
    std::vector<bf16> qb((size_t)T * H * D), kb((size_t)T * Hkv * D), vb((size_t)T * Hkv * D);
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(qb.data(), q, (int64_t)T * H * D / 4); });
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(kb.data(), k, (int64_t)T * Hkv * D / 4); });
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(vb.data(), v, (int64_t)T * Hkv * D / 4); });
    emu_global_clear();
    emu_global_add(qb.data(), qb.size() * 2);
    emu_global_add(kb.data(), kb.size() * 2);
    emu_global_add(vb.data(), vb.size() * 2);
    const unsigned nq = (unsigned)((T + FWD_WARPS * 16 - 1) / (FWD_WARPS * 16));
    const float sl2 = scale * MMA_LOG2E;
    if (D == 64)
        emu_launch(H, nq, 1, FWD_WARPS * 32, smem_fwd(64),
                   [&] { k_mma_fwd<64>(out, lse, qb.data(), kb.data(), vb.data(), ss, T, H, Hkv, sl2); });
    else
        emu_launch(H, nq, 1, FWD_WARPS * 32, smem_fwd(128),
                   [&] { k_mma_fwd<128>(out, lse, qb.data(), kb.data(), vb.data(), ss, T, H, Hkv, sl2); });
}

template <int D>
static void emu_bwd_d(float *dq, float *dk, float *dv, const float *lse, const bf16 *qb, const bf16 *kb,
                      const bf16 *vb, const bf16 *dob, const float *delta, float *pk, float *pv,
                      const int32_t *ss, int T, int H, int Hkv, float scale)
{
    const float sl2 = scale * MMA_LOG2E;
    const unsigned nb = (unsigned)((T + BWD_WARPS * 16 - 1) / (BWD_WARPS * 16));
    float *ok = H == Hkv ? dk : pk, *ov = H == Hkv ? dv : pv;
    emu_launch(H, nb, 1, BWD_WARPS * 32, smem_dkv(D),
               [&] { k_mma_dkv<D>(ok, ov, qb, kb, vb, dob, lse, delta, ss, T, H, Hkv, sl2, scale); });
    emu_launch(H, nb, 1, BWD_WARPS * 32, smem_dq(D),
               [&] { k_mma_dq<D>(dq, qb, kb, vb, dob, lse, delta, ss, T, H, Hkv, sl2, scale); });
    if (H != Hkv) emu_launch(1, 1, 1, 256, 0, [&] { k_mma_group_sum(dk, dv, pk, pv, T, H, Hkv, D); });
}

static void emu_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, const float *out, const float *lse, const int32_t *ss, int T, int H,
                    int Hkv, int D, float scale)
{
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * Hkv * D;
    std::vector<bf16> qb(nq), kb(nk), vb(nk), dob(nq);
    std::vector<float> delta((size_t)T * H), pk(H != Hkv ? nq : 1), pv(H != Hkv ? nq : 1);
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(qb.data(), q, (int64_t)nq / 4); });
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(kb.data(), k, (int64_t)nk / 4); });
    emu_launch(1, 1, 1, 256, 0, [&] { k_mma_to_bf16(vb.data(), v, (int64_t)nk / 4); });
    emu_launch(2, 1, 1, 256, 0, [&] { k_mma_dout(dob.data(), delta.data(), dout, out, (int64_t)T * H, D); });
    emu_global_clear();
    emu_global_add(qb.data(), nq * 2);
    emu_global_add(kb.data(), nk * 2);
    emu_global_add(vb.data(), nk * 2);
    emu_global_add(dob.data(), nq * 2);
    if (D == 64)
        emu_bwd_d<64>(dq, dk, dv, lse, qb.data(), kb.data(), vb.data(), dob.data(), delta.data(), pk.data(),
                      pv.data(), ss, T, H, Hkv, scale);
    else
        emu_bwd_d<128>(dq, dk, dv, lse, qb.data(), kb.data(), vb.data(), dob.data(), delta.data(), pk.data(),
                       pv.data(), ss, T, H, Hkv, scale);
}

static uint64_t emu_rs = 0x2545f4914f6cdd1dull;
static float emu_uniform(float lo, float hi)
{
    emu_rs ^= emu_rs << 13, emu_rs ^= emu_rs >> 7, emu_rs ^= emu_rs << 17;
    float u = lo + (hi - lo) * (float)((emu_rs >> 40) / 16777216.0);
    return u != 0.f ? u : 0.5f * hi;
}

static double emu_err(const std::vector<float> &a, const std::vector<float> &b, int *zero)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    *zero = sqrt(den / (double)a.size()) < 1e-4; /* reference zero up to rounding: rms diff */
    return *zero ? sqrt(num / (double)a.size()) : sqrt(num / den);
}

int main(int argc, char **argv)
{
    ft_backend *cpu;
    if (ft_backend_cpu_init(&cpu, 0) < 0) return 2;
    emu_set_smem(mma_smem);
    /* T, H, Hkv, D, packing (0 one sequence, 1 ragged 1..70, 2 every token alone, 3 runs of 1..16) */
    static const int cases[][5] = {
        {1, 2, 2, 64, 0},   {17, 4, 4, 64, 0},  {17, 4, 2, 128, 1}, {130, 3, 3, 64, 0},
        {130, 6, 2, 64, 1}, {100, 3, 3, 128, 2}, {150, 9, 3, 64, 3}, {200, 2, 1, 128, 0},
        {300, 4, 2, 128, 1}, {257, 2, 2, 64, 3}, {513, 1, 1, 128, 0}, {450, 2, 1, 64, 1},
    };
    int n = sizeof cases / sizeof cases[0], fails = 0;
    if (argc > 1) n = atoi(argv[1]) < n ? atoi(argv[1]) : n;
    for (int c = 0; c < n; c++) {
        const int T = cases[c][0], H = cases[c][1], Hkv = cases[c][2], D = cases[c][3], pk = cases[c][4];
        const size_t nq = (size_t)T * H * D, nk = (size_t)T * Hkv * D;
        const float sc = 1.0f / sqrtf((float)D);
        emu_cp_mode(c % 2 ? EMU_CP_LATE : EMU_CP_EARLY);
        std::vector<int32_t> ss(T);
        int start = 0, len = 1;
        for (int t = 0; t < T; t++) {
            if (t == 0 || t - start >= len) {
                start = t;
                len = pk == 0 ? T : pk == 1 ? 1 + (int)emu_uniform(0, 70) : pk == 2 ? 1 : 1 + (int)emu_uniform(0, 16);
            }
            ss[t] = start;
        }
        std::vector<float> q(nq), k(nk), v(nk), dout(nq);
        for (auto &x : q) x = emu_uniform(-2, 2);
        for (auto &x : k) x = emu_uniform(-2, 2);
        for (auto &x : v) x = emu_uniform(-1, 1);
        for (auto &x : dout) x = emu_uniform(-1, 1);
        std::vector<float> o(nq), lse((size_t)T * H), dq(nq), dk(nk), dv(nk);
        if (cpu->ops->attention_fwd(cpu, o.data(), lse.data(), q.data(), k.data(), v.data(), ss.data(), T, H,
                                    Hkv, D, sc) ||
            cpu->ops->attention_bwd(cpu, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                    v.data(), o.data(), lse.data(), ss.data(), T, H, Hkv, D, sc)) {
            fprintf(stderr, "cpu: %s\n", ft_errmsg());
            return 2;
        }
        std::vector<float> go(nq, NAN), gl((size_t)T * H, NAN), gdq(nq, NAN), gdk(nk, NAN), gdv(nk, NAN);
        emu_fwd(go.data(), gl.data(), q.data(), k.data(), v.data(), ss.data(), T, H, Hkv, D, sc);
        emu_bwd(gdq.data(), gdk.data(), gdv.data(), dout.data(), q.data(), k.data(), v.data(), go.data(),
                gl.data(), ss.data(), T, H, Hkv, D, sc);
        const char *nm[5] = {"out", "lse", "dq", "dk", "dv"};
        const std::vector<float> *g[5] = {&go, &gl, &gdq, &gdk, &gdv}, *r[5] = {&o, &lse, &dq, &dk, &dv};
        printf("emu T=%d H=%d/%d D=%d pack %d cp.async %s:", T, H, Hkv, D, pk, c % 2 ? "late" : "early");
        for (int i = 0; i < 5; i++) {
            int zero = 0;
            const double e = emu_err(*g[i], *r[i], &zero);
            const bool ok = e <= (zero ? 1e-6 : 1e-2);
            fails += !ok;
            printf(" %s %.1e%s%s", nm[i], e, zero ? "(rms)" : "", ok ? "" : " FAIL");
        }
        printf("\n");
        fflush(stdout);
    }
    ft_backend_free(cpu);
    printf("%s: %d cases, %d failed checks\n", fails ? "FAILED" : "ok", n, fails);
    return fails != 0;
}

