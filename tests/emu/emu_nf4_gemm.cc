/* emu_nf4_gemm.cc - kernels/cuda/nf4_gemm.cu's fused NF4 GEMMs run as written on the CPU: its
 * launcher nf4g_launch (tile height, split-K, partials, the reduce kernel) and kernels k_nf4_gemm
 * and k_nf4g_reduce, through the CUDA emulation of tests/emu/cuda_emu.h (cp.async, ldmatrix,
 * ldmatrix.trans, mma.sync m16n8k16, barriers; shared memory poisoned with NaN), against a CPU
 * reference:
 *   - forward y = x W^T and input gradient dx = dy W, W (N, K) quantized by src/numeric/nf4.c and
 *     dequantized by ft_nf4_dequant, rounded to bf16 like the kernel's operand; x / dy random
 *     bf16; sums in double. N, K in {64, 128, 192} (whole and half 128-column tiles, 1 to 3
 *     reduction steps), T in {1, 7, 33, 130}, every tile height (16, 32, 64, 128) and the one
 *     the launcher picks, split-K off and forced to every split count the reduction allows,
 *     beta 0 (output prefilled with NaN: must not be read) and 1; plain absmax (blocksize 32,
 *     64, 128) and double-quantized (64 / 256). Tolerance as tests/gpu/test_cuda_nf4_gemm.c:
 *     |got - ref| <= 1e-6 + 3e-5 sum_k |a_k b_k|; nothing written past the output or partials;
 *   - the dequantized values bit for bit: an identity activation (x = I, T = K; dy = I, T = N)
 *     makes the output W itself, one product by 1.0 per value.
 * cp.async lands early in even cases and late in odd ones (cuda_emu.h). Exit status 1 when a
 * check fails; the emulation aborts on a shared-memory, divergence or deadlock error.
 * Usage: emu_nf4_gemm [-v]   (-v: a line per case; else failures and the summary)
 * Built by the Makefile (CUDA=1: the cuda headers give the types) with a host C++ compiler:
 *   g++ -std=c++20 -O2 -fno-strict-aliasing -DFT_MMA_EMU -I. -I$CUDA_HOME/include \
 *       tests/emu/emu_nf4_gemm.cc libftune.a $(LIBS)   (724 GEMMs, about 10 s) */
#define FT_NF4_GEMM_KERNELS_ONLY 1 /* no backend entry points: libftune.a has them */
#ifndef FT_MMA_EMU
#define FT_MMA_EMU 1 /* the kernel file leaves out its PTX and launches */
#endif
#include "tests/emu/cuda_emu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "src/numeric/nf4.h"
}

/* nf4_gemm.cu's primitives (its inline PTX is left out under FT_MMA_EMU) */
static inline uint32_t nf4g_smem(const void *p) { return emu_smem_u32(p); }
static inline void nf4g_cp16(uint32_t dst, const void *src) { emu_cp_async(dst, src, 16, 16); }
static inline void nf4g_cp4(uint32_t dst, const void *src) { emu_cp_async(dst, src, 4, 4); }
static inline void nf4g_commit() { emu_cp_commit(); }
template <int N> static inline void nf4g_wait() { emu_cp_wait(N); }
static inline void nf4g_ldsm4(uint32_t r[4], uint32_t addr) { emu_ldsm(r, addr, false); }
static inline void nf4g_ldsm4_t(uint32_t r[4], uint32_t addr) { emu_ldsm(r, addr, true); }
static inline void nf4g_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) { emu_mma16816(d, a, b[0], b[1]); }

#include "kernels/cuda/nf4_gemm.cu"

/* The kernels' extern __shared__ array. */
alignas(128) uint8_t sm[EMU_SMEM_BYTES + EMU_GUARD];

#define TOL_GEMM_REL 3e-5
#define TOL_GEMM_ABS 1e-6
#define N_SM 132   /* the SM count the launcher is told (H100 SXM) */

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return lo + (hi - lo) * (float)((rs >> 40) / 16777216.0);
}

static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static float bf16_float(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* W (N, K) quantized (blocksize bs, nested block size nbs or 0), its kernel description and
 * the bf16-rounded dequantization. Buffers are 16-byte aligned (the kernel's requirement). */
struct qw {
    int64_t N, K;
    ft_nf4_tensor t;
    std::vector<float> wq;
    std::vector<uint4> codes, qam, am, nam, map; /* uint4: 16-byte aligned storage */
};

template <typename T> static T *vbuf(std::vector<uint4> &v, size_t bytes)
{
    v.assign(bytes / 16 + 1, uint4{0, 0, 0, 0});
    return (T *)v.data();
}

static void qw_make(qw &q, int64_t N, int64_t K, int64_t bs, int64_t nbs)
{
    const int64_t n = N * K;
    ft_nf4_layout l;
    if (ft_nf4_layout_init(&l, n, bs, nbs)) {
        fprintf(stderr, "layout: %s\n", ft_errmsg());
        exit(2);
    }
    std::vector<float> x(n), amt(l.n_blocks);
    for (int64_t i = 0; i < n; i++) x[i] = uniform(-1, 1) * (float)(1 + (i / bs) % 5) * 0.05f;
    float *map = vbuf<float>(q.map, 256 * 4), off = 0;
    ft_nf4_dynamic_map(map);
    uint8_t *codes = vbuf<uint8_t>(q.codes, l.code_bytes), *qam = vbuf<uint8_t>(q.qam, l.n_blocks);
    float *am = vbuf<float>(q.am, l.n_blocks * 4), *nam = vbuf<float>(q.nam, (l.n_nested + 1) * 4);
    if (ft_nf4_quantize(x.data(), &l, map, codes, nbs ? qam : NULL, nam, &off, amt.data())) {
        fprintf(stderr, "quantize: %s\n", ft_errmsg());
        exit(2);
    }
    memcpy(am, amt.data(), l.n_blocks * 4);
    ft_nf4_view v = {l, codes, nbs ? qam : NULL, nbs ? NULL : am, nbs ? nam : NULL, nbs ? map : NULL, ft_nf4_code, off};
    if (ft_nf4_dequant(&v, x.data())) exit(2);
    q.wq.resize(n);
    for (int64_t i = 0; i < n; i++) q.wq[i] = bf16_float(bf16_bits(x[i]));
    q.N = N;
    q.K = K;
    q.t = ft_nf4_tensor{n, bs, nbs, codes, nbs ? qam : NULL, nbs ? NULL : am, nbs ? nam : NULL, nbs ? map : NULL,
                        ft_nf4_code, off};
    emu_global_clear(); /* what cp.async may read: the weight's arrays (and the activation) */
    emu_global_add(codes, l.code_bytes);
    if (nbs) {
        emu_global_add(qam, l.n_blocks);
        emu_global_add(nam, l.n_nested * 4);
    } else {
        emu_global_add(am, l.n_blocks * 4);
    }
}

/* One GEMM through nf4g_launch; a (T, kred) holds bf16 values. Returns the worst error ratio
 * (> 1: out of tolerance; 1e30 for a NaN or a write past the end) or exact-check mismatches. */
static double one(const qw &q, int dgrad, int64_t T, const std::vector<float> &a, float beta, int bm,
                  int splits, const std::vector<double> *exact)
{
    const int64_t kred = dgrad ? q.N : q.K, ncols = dgrad ? q.K : q.N, n_out = T * ncols;
    std::vector<uint16_t> ab(T * kred + 8);
    for (int64_t i = 0; i < T * kred; i++) ab[i] = bf16_bits(a[i]);
    emu_global_add(ab.data(), (size_t)T * kred * 2);
    const int64_t guard = 128 * ncols; /* floats past the output and the partials that must stay
                                          untouched: a tile's rows past T would land here */
    std::vector<float> prev(n_out + guard), c(n_out + guard);
    for (int64_t i = 0; i < n_out; i++) prev[i] = beta != 0 ? uniform(-1, 1) : NAN;
    for (int i = 0; i < guard; i++) prev[n_out + i] = 12345.0f;
    c = prev;
    const int max_splits = (int)(kred / NF4G_BK);
    const size_t work_bytes = (size_t)(splits > 1 ? splits : max_splits) * n_out * 4;
    std::vector<float> work(work_bytes / 4 + guard, NAN);
    for (int i = 0; i < guard; i++) work[work_bytes / 4 + i] = 12345.0f;
    int sb = 0, sn = 0;
    if (nf4g_check(dgrad ? "bwd_x" : "fwd", c.data(), ab.data(), &q.t, T, q.N, q.K, &sb, &sn) ||
        nf4g_launch(dgrad, c.data(), (const __nv_bfloat16 *)ab.data(), &q.t, T, q.N, q.K, beta, sb, sn, bm, splits,
                    N_SM, work.data(), work_bytes, nullptr) != cudaSuccess) {
        fprintf(stderr, "launch refused: %s\n", ft_errmsg());
        return 1e30;
    }
    emu_global_clear();
    for (int i = 0; i < guard; i++)
        if (c[n_out + i] != 12345.0f || work[work_bytes / 4 + i] != 12345.0f) return 1e30;
    double w = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < ncols; o++) {
            double r = 0, m = 0;
            if (exact) {
                r = (*exact)[t * ncols + o];
            } else {
                for (int64_t k = 0; k < kred; k++) {
                    const double p = (double)a[t * kred + k] * (dgrad ? q.wq[k * q.K + o] : q.wq[o * q.K + k]);
                    r += p;
                    m += fabs(p);
                }
                if (beta != 0) {
                    r += (double)beta * prev[t * ncols + o];
                    m += fabs((double)beta * prev[t * ncols + o]);
                }
            }
            const float g = c[t * ncols + o];
            if (!isfinite(g)) return 1e30;
            const double e = exact ? (g != (float)r) : fabs(g - r) / (TOL_GEMM_ABS + TOL_GEMM_REL * m);
            if (exact && e > 0) w += 1; /* count mismatches */
            else if (!exact && e > w) w = e;
        }
    return w;
}

int main(int argc, char **argv)
{
    emu_set_smem(sm);
    static const int64_t dims[] = {64, 128, 192};
    static const int64_t Ts[] = {1, 7, 33, 130};
    static const int bms[] = {16, 32, 64, 128, 0};
    static const int64_t plain_bs[] = {32, 64, 128};
    const bool verbose = argc > 1 && !strcmp(argv[1], "-v");
    int fails = 0, cases = 0;
    double w_max = 0;
    /* every op, W shape, T and tile height (0: the launcher's choice), each with split-K off
     * (the launcher's choice for tile height 0) and forced to every count from 2 to the number
     * of reduction steps; beta, plain / double-quantized absmax, blocksize and cp.async landing
     * rotate over the cases */
    for (int dgrad = 0; dgrad <= 1; dgrad++)
        for (int ni = 0; ni < 3; ni++)
            for (int ki = 0; ki < 3; ki++)
                for (int ti = 0; ti < 4; ti++)
                    for (int bi = 0; bi < 5; bi++) {
                        const int64_t N = dims[ni], K = dims[ki], T = Ts[ti], kred = dgrad ? N : K;
                        for (int sp = 1; sp <= (int)(kred / 64); sp++, cases++) {
                            const int splits = sp == 1 && !bms[bi] ? 0 : sp;
                            const float beta = (float)((cases / 2) % 2);
                            const int nested = (cases / 4) % 2;
                            qw q;
                            qw_make(q, N, K, nested ? 64 : plain_bs[cases % 3], nested ? 256 : 0);
                            std::vector<float> a(T * kred);
                            for (auto &x : a) x = bf16_float(bf16_bits(uniform(-1, 1)));
                            emu_cp_mode(cases % 2 ? EMU_CP_LATE : EMU_CP_EARLY);
                            const double w = one(q, dgrad, T, a, beta, bms[bi], splits, nullptr);
                            const bool ok = w <= 1;
                            fails += !ok;
                            if (w > w_max) w_max = w;
                            if (verbose || !ok)
                                printf("emu %s W %lldx%lld T %lld bm %d splits %d beta %g bs %lld%s cp.async %s: "
                                       "worst %.3g of tolerance%s\n", dgrad ? "bwd_x" : "fwd", (long long)N,
                                       (long long)K, (long long)T, bms[bi], splits, beta, (long long)q.t.blocksize,
                                       nested ? "/256" : "", cases % 2 ? "late" : "early", w, ok ? "" : " FAIL");
                        }
                    }
    /* identity activations: the output is W (fwd: y[t][n] = W[n][t]; bwd_x: dx[t][k] = W[t][k]) */
    for (int dgrad = 0; dgrad <= 1; dgrad++)
        for (int nested = 0; nested <= 1; nested++, cases++) {
            const int64_t N = dgrad ? 128 : 192, K = dgrad ? 192 : 128, kred = dgrad ? N : K, ncols = dgrad ? K : N;
            qw q;
            qw_make(q, N, K, 64, nested ? 256 : 0);
            std::vector<float> a(kred * kred, 0.0f);
            for (int64_t i = 0; i < kred; i++) a[i * kred + i] = 1.0f;
            std::vector<double> exact(kred * ncols);
            for (int64_t t = 0; t < kred; t++)
                for (int64_t o = 0; o < ncols; o++) exact[t * ncols + o] = dgrad ? q.wq[t * K + o] : q.wq[o * K + t];
            emu_cp_mode(cases % 2 ? EMU_CP_LATE : EMU_CP_EARLY);
            const double bad = one(q, dgrad, kred, a, 0.0f, 0, nested ? 2 : 1, &exact);
            fails += bad != 0;
            printf("emu %s identity W %lldx%lld %s: %.0f values differ from bf16(ft_nf4_dequant)%s\n",
                   dgrad ? "bwd_x" : "fwd", (long long)N, (long long)K, nested ? "nested" : "plain", bad,
                   bad ? " FAIL" : "");
        }
    printf("%s: %d cases, %d failed, worst %.3g of tolerance (identity: exact)\n", fails ? "FAILED" : "ok", cases,
           fails, w_max);
    return fails != 0;
}
