/* attn_bench.cu - causal GQA attention on the GPU, forward and backward: the FlashAttention-2
 * tensor-core kernels (kernels/cuda/attn_mma.cu, `mma`) against the bf16 batched-GEMM path
 * (kernels/cuda/attn_gemm.cu, `gemm`: the op table with FTUNE_ATTN=gemm) and the fp32
 * FlashAttention kernels (kernels/cuda/attn.cu, `fp32`). Not a test.
 *
 * Shapes (default): Llama-3-8B attention, H = 32, Hkv = 8, D = 128, T = 2048 as one sequence and
 * as 4 sequences of 512; SmolLM2-135M, H = 9, Hkv = 3, D = 64, T = 2048 one sequence. Inputs are
 * random (never zeros). Each path is timed with CUDA events on the backend's compute lane, 2
 * warm-ups and 10 repetitions, median reported, in ms and TFLOP/s counting causal FLOPs:
 * forward 4 D H sum_seq len^2 / 2 (two GEMMs, half the square), backward 2.5 times that (the
 * usual FlashAttention convention; attn_mma.cu's backward really does 3.5 times: it recomputes
 * S and dP in the dq kernel instead of using atomics). "x32" is one training step of a
 * 32-layer model. Then the mma outputs are compared with the fp32 kernels' (relative 2-norm,
 * bound 1e-2) and a second mma run must give the same bits; exit status 1 otherwise.
 *
 * Build (after `make`; the libraries are the Makefile's LIBS):
 *   nvcc -O3 -std=c++20 -arch=sm_90 -I. bench/attn_bench.cu build/libftune.a \
 *        $(pkg-config --libs openblas libpcre2-8 libcjson liburing) -lnuma -lgomp -ldl -lrt \
 *        -o build/bench/attn_bench
 * For the lent GPU machine (no OpenBLAS there), after scripts/gpu_bundle.sh, into its bundle:
 *   A=/usr/lib/x86_64-linux-gnu; nvcc -O3 -std=c++20 -arch=sm_90 -I. bench/attn_bench.cu \
 *     build-gpu/libftune.a $A/openblas-pthread/libopenblas.a -lgfortran $A/libpcre2-8.a -lcjson \
 *     $A/liburing.a $(gcc -print-file-name=libnuma.a) -lgomp -ldl -lrt -lpthread -o .gpu/bin/attn_bench
 *   tar cf - -C .gpu bin lib | xz -T2 -6 > .gpu/bundle.tar.xz
 * Usage: attn_bench [T H Hkv D n_seq]...
 *
 * CPU emulation (no GPU): tests/emu/emu_attn_mma.cc runs attn_mma.cu's kernels as written on the
 * CPU (tests/emu/cuda_emu.h) against the CPU backend; the Makefile builds it with the tests
 * (CUDA=1) and tests/run_tests.sh runs it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "kernels/kernels.h"
#include "src/core/err.h"

#include "kernels/cuda/cuda_entry.h" /* attn.cu and attn_mma.cu */

#define CK(x) do { int rc_ = (x); if (rc_ < 0) { \
    fprintf(stderr, "%s:%d: %s: %d: %s\n", __FILE__, __LINE__, #x, rc_, ft_errmsg()); exit(2); } } while (0)

enum { P_MMA, P_GEMM, P_FP32, N_PATH };
static const char *path_name[N_PATH] = {"mma", "gemm", "fp32"};

struct bufs {
    float *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
    int32_t *ss;
};

static int run(ft_backend *be, int path, const bufs &b, int64_t T, int64_t H, int64_t Hkv, int64_t D,
               float sc, int bwd)
{
    if (path == P_MMA)
        return bwd ? ft_cuda_mma_attention_bwd(be, b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.o, b.lse, b.ss,
                                               T, H, Hkv, D, sc)
                   : ft_cuda_mma_attention_fwd(be, b.o, b.lse, b.q, b.k, b.v, b.ss, T, H, Hkv, D, sc);
    if (path == P_FP32)
        return bwd ? ft_cuda_flash_attention_bwd(be, b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.o, b.lse,
                                                 b.ss, T, H, Hkv, D, sc)
                   : ft_cuda_flash_attention_fwd(be, b.o, b.lse, b.q, b.k, b.v, b.ss, T, H, Hkv, D, sc);
    /* the op table with FTUNE_ATTN=gemm (be->tune.attn): attn_gemm.cu's bf16 batched GEMMs */
    const int attn0 = be->tune.attn;
    be->tune.attn = FT_ATTN_GEMM;
    int rc = bwd ? be->ops->attention_bwd(be, b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.o, b.lse, b.ss, T,
                                          H, Hkv, D, sc)
                 : be->ops->attention_fwd(be, b.o, b.lse, b.q, b.k, b.v, b.ss, T, H, Hkv, D, sc);
    be->tune.attn = attn0;
    return rc;
}

static std::vector<float> down(ft_backend *be, const float *d, int64_t n)
{
    std::vector<float> h((size_t)n);
    CK(be->ops->copy(be, h.data(), d, (size_t)n * 4));
    return h;
}

static double rel(const std::vector<float> &a, const std::vector<float> &b)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv)
{
    std::vector<std::vector<int64_t>> shapes = {{2048, 32, 8, 128, 1}, {2048, 32, 8, 128, 4}, {2048, 9, 3, 64, 1}};
    if (argc > 1) {
        shapes.clear();
        for (int i = 1; i + 4 < argc; i += 5)
            shapes.push_back({atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), atoll(argv[i + 3]),
                              atoll(argv[i + 4])});
    }
    ft_backend *be;
    CK(ft_backend_cuda_init(&be, 0));
    CK(ft_backend_cuda_set_precise(be, 0));
    int bad = 0;
    printf("%-28s %-5s %9s %9s %8s %8s %10s\n", "shape", "path", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s",
           "x32 ms");
    for (auto &sh : shapes) {
        const int64_t T = sh[0], H = sh[1], Hkv = sh[2], D = sh[3], nseq = sh[4] > 0 ? sh[4] : 1;
        const int64_t nq = T * H * D, nk = T * Hkv * D;
        const float sc = 1.0f / sqrtf((float)D);
        std::vector<int32_t> ss((size_t)T);
        double pairs = 0; /* sum over sequences of len^2 / 2 */
        for (int64_t s = 0; s < nseq; s++) {
            const int64_t a = T * s / nseq, e = T * (s + 1) / nseq;
            for (int64_t t = a; t < e; t++) ss[(size_t)t] = (int32_t)a;
            pairs += 0.5 * (double)(e - a) * (double)(e - a);
        }
        const double f_fwd = 4.0 * (double)D * (double)H * pairs, f_bwd = 2.5 * f_fwd;
        uint64_t x = 88172645463325252ull;
        auto fill = [&](int64_t n, float lo, float hi) {
            std::vector<float> h((size_t)n);
            for (auto &y : h) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                y = lo + (hi - lo) * (float)((x >> 40) / 16777216.0);
                if (y == 0.f) y = hi * 0.5f;
            }
            float *d = (float *)be->ops->alloc(be, (size_t)n * 4);
            if (!d) exit(2);
            CK(be->ops->copy(be, d, h.data(), (size_t)n * 4));
            return d;
        };
        bufs b;
        b.q = fill(nq, -2, 2), b.k = fill(nk, -2, 2), b.v = fill(nk, -1, 1), b.dout = fill(nq, -1, 1);
        b.o = fill(nq, 0, 1), b.lse = fill(T * H, 0, 1), b.dq = fill(nq, 0, 1), b.dk = fill(nk, 0, 1);
        b.dv = fill(nk, 0, 1);
        b.ss = (int32_t *)be->ops->alloc(be, (size_t)T * 4);
        CK(be->ops->copy(be, b.ss, ss.data(), (size_t)T * 4));
        CK(be->ops->prepare(be, T, H, Hkv, D));
        char name[64];
        snprintf(name, sizeof name, "T=%lld H=%lld/%lld D=%lld %lldx%lld", (long long)T, (long long)H,
                 (long long)Hkv, (long long)D, (long long)nseq, (long long)(T / nseq));
        std::vector<float> ref[2][5]; /* [mma, fp32] out, lse, dq, dk, dv */
        for (int p = 0; p < N_PATH; p++) {
            if (p == P_MMA && D != 64 && D != 128) continue;
            std::vector<float> tf, tb;
            for (int rep = 0; rep < 12; rep++) {
                CK(be->ops->event_record(be, 0, FT_STREAM_COMPUTE));
                CK(run(be, p, b, T, H, Hkv, D, sc, 0));
                CK(be->ops->event_record(be, 1, FT_STREAM_COMPUTE));
                CK(run(be, p, b, T, H, Hkv, D, sc, 1));
                CK(be->ops->event_record(be, 2, FT_STREAM_COMPUTE));
                CK(be->ops->event_sync(be, 2));
                float a, c;
                CK(be->ops->event_elapsed(be, 0, 1, &a));
                CK(be->ops->event_elapsed(be, 1, 2, &c));
                if (rep >= 2) tf.push_back(a), tb.push_back(c);
            }
            std::sort(tf.begin(), tf.end());
            std::sort(tb.begin(), tb.end());
            const double mf = tf[tf.size() / 2], mb = tb[tb.size() / 2];
            printf("%-28s %-5s %9.3f %9.3f %8.1f %8.1f %10.2f\n", name, path_name[p], mf, mb, f_fwd / mf * 1e-9,
                   f_bwd / mb * 1e-9, 32 * (mf + mb));
            if (p == P_MMA || p == P_FP32) {
                const float *dp[5] = {b.o, b.lse, b.dq, b.dk, b.dv};
                const int64_t nn[5] = {nq, T * H, nq, nk, nk};
                for (int i = 0; i < 5; i++) ref[p == P_MMA ? 0 : 1][i] = down(be, dp[i], nn[i]);
            }
            fflush(stdout);
        }
        if (!ref[0][0].empty()) {
            /* mma against fp32, then a second mma run: the same bits */
            const char *nm[5] = {"out", "lse", "dq", "dk", "dv"};
            printf("  mma vs fp32:");
            for (int i = 0; i < 5; i++) {
                const double e = rel(ref[0][i], ref[1][i]);
                bad += !(e <= 1e-2);
                printf(" %s %.2e", nm[i], e);
            }
            CK(run(be, P_MMA, b, T, H, Hkv, D, sc, 0));
            CK(run(be, P_MMA, b, T, H, Hkv, D, sc, 1));
            const float *dp[5] = {b.o, b.lse, b.dq, b.dk, b.dv};
            const int64_t nn[5] = {nq, T * H, nq, nk, nk};
            int same = 1;
            for (int i = 0; i < 5; i++) same &= down(be, dp[i], nn[i]) == ref[0][i];
            bad += !same;
            printf("; repeat %s\n", same ? "bit-identical" : "DIFFERS");
        }
        void *all[] = {b.q, b.k, b.v, b.dout, b.o, b.lse, b.dq, b.dk, b.dv, b.ss};
        for (void *p : all) be->ops->free(be, p);
    }
    ft_backend_free(be);
    if (bad) printf("FAILED: %d mismatches\n", bad);
    return bad != 0;
}
