/* emu_adamw_multi.cc - kernels/cuda/adamw_multi.cu's multi-tensor AdamW run as written on the CPU
 * (tests/emu/cuda_emu.h) against its twin, the CPU adamw on each segment (kernels/cpu/ops_impl.h
 * through ft_cpu_adamw_multi): bit for bit (tolerance 0) on params and both moments, over
 *   - tables of 1, 3, 40 and 1,300 segments (the last: three launches of at most
 *     FT_ADAMW_MULTI_LAUNCH), sizes 0 (skipped), 1, 2 .. 300, each with its own lr;
 *   - grids of 1 block of 32 threads (every thread walks many segments), 3 blocks of 64, and one
 *     thread per element;
 *   - steps 1, 2, 7 and 1000 (bias corrections), weight decay 0 and 0.1, gradients with zeros,
 *     tiny and large values.
 * A formula check besides: the twin against a double-precision AdamW within 1e-5 relative (so
 * both cannot be wrong the same way). Exit status 1 when a check fails.
 * Built by the Makefile (CUDA=1) with the host C++ compiler: make BUILD=build build/tests/emu_adamw_multi */
#ifndef FT_MMA_EMU
#define FT_MMA_EMU 1 /* the kernel file leaves out its launches */
#endif
#pragma GCC diagnostic ignored "-Wunused-function" /* cuda_emu.h's tensor-core primitives */
#include "tests/emu/cuda_emu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "kernels/cuda/adamw_multi.cu"

extern "C" {
#include "kernels/cpu/bf16_ops.h"
}

alignas(128) uint8_t sm[EMU_SMEM_BYTES + EMU_GUARD];

static uint64_t rs = 0x2545f4914f6cdd1dull;
static double urand()
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

struct tensors {
    std::vector<float> p, g, m, v;
};

/* One case: n_seg segments, `nth` threads per block and `nblk` blocks (0: one thread per
 * element). Returns the number of mismatching floats (kernel vs twin) plus formula failures. */
static long one_case(int n_seg, int max_n, int nth, int nblk, int64_t step, float wd, bool verbose)
{
    std::vector<int64_t> sizes(n_seg);
    std::vector<float> lrs(n_seg);
    int64_t total = 0;
    for (int k = 0; k < n_seg; k++) {
        sizes[k] = k % 17 == 5 ? 0 : 1 + (int64_t)(urand() * max_n);
        lrs[k] = (float)(1e-4 * (1 + k % 3) * (k % 2 ? 16 : 1));
        total += sizes[k];
    }
    tensors a, b;
    a.p.resize(total), a.g.resize(total), a.m.resize(total), a.v.resize(total);
    for (int64_t i = 0; i < total; i++) {
        const int kind = (int)(urand() * 8);
        a.p[i] = (float)(urand() * 2 - 1);
        a.g[i] = kind == 0 ? 0.0f : kind == 1 ? (float)(urand() * 1e-6) : kind == 2 ? (float)(urand() * 30 - 15)
                                                                                  : (float)(urand() * 2e-2 - 1e-2);
        a.m[i] = step > 1 ? (float)(urand() * 2e-3 - 1e-3) : 0.0f;
        a.v[i] = step > 1 ? (float)(urand() * 1e-5) : 0.0f;
    }
    b = a;
    const tensors orig = a;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    std::vector<ft_adamw_seg> sa(n_seg), sb(n_seg);
    for (int k = 0, off = 0; k < n_seg; off += (int)sizes[k], k++) {
        sa[k] = {a.p.data() + off, a.g.data() + off, a.m.data() + off, a.v.data() + off, sizes[k], lrs[k]};
        sb[k] = {b.p.data() + off, b.g.data() + off, b.m.data() + off, b.v.data() + off, sizes[k], lrs[k]};
    }
    if (adamw_mt_check(sa.data(), n_seg, b1, b2, step)) return 1;
    int launches = 0;
    for (int64_t next = 0; next < n_seg;) {
        adamw_mt_table tb;
        const int64_t tot = adamw_mt_fill(&tb, sa.data(), n_seg, &next, b1, b2, eps, wd, step);
        if (!tot) continue;
        const unsigned blocks = nblk ? (unsigned)nblk : (unsigned)((tot + nth - 1) / nth);
        emu_kernel(k_adamw_multi, dim3(blocks), dim3(nth), 0, tb);
        launches++;
    }
    if (ft_cpu_adamw_multi(sb.data(), n_seg, b1, b2, eps, wd, step)) return 1;
    long bad = 0;
    bad += memcmp(a.p.data(), b.p.data(), total * 4) != 0;
    for (int64_t i = 0; i < total; i++)
        bad += memcmp(&a.p[i], &b.p[i], 4) != 0 || memcmp(&a.m[i], &b.m[i], 4) != 0 || memcmp(&a.v[i], &b.v[i], 4) != 0;
    /* the formula in double (torch.optim.AdamW) against the twin */
    long formula = 0;
    const double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
    for (int k = 0, off = 0; k < n_seg; off += (int)sizes[k], k++)
        for (int64_t j = 0; j < sizes[k]; j++) {
            const int64_t i = off + j;
            const double g = orig.g[i], m = b1 * (double)orig.m[i] + (1 - (double)b1) * g;
            const double v = b2 * (double)orig.v[i] + (1 - (double)b2) * g * g;
            const double p = orig.p[i] * (1 - (double)lrs[k] * wd) - (double)lrs[k] / bc1 * m / (sqrt(v / bc2) + eps);
            if (fabs(p - b.p[i]) > 1e-5 * (fabs(p) + (double)lrs[k])) formula++;
        }
    if (verbose || bad || formula)
        printf("emu adamw_multi: %d segments (%lld floats, %d launches), grid %u x %d, step %lld, wd %g: %ld "
               "differ from the twin, %ld off the formula%s\n", n_seg, (long long)total, launches, nblk ? nblk : 0u,
               nth, (long long)step, (double)wd, bad, formula, bad || formula ? " FAIL" : "");
    return bad + formula;
}

int main(int argc, char **argv)
{
    emu_set_smem(sm);
    const bool verbose = argc > 1 && !strcmp(argv[1], "-v");
    static const int nsegs[] = {1, 3, 40, 1300};
    static const int maxn[] = {300, 300, 200, 5};
    static const int64_t steps[] = {1, 2, 7, 1000};
    int cases = 0, fails = 0;
    for (int si = 0; si < 4; si++)
        for (int gi = 0; gi < 3; gi++) {
            const int nth = gi == 0 ? 32 : gi == 1 ? 64 : 128, nblk = gi == 0 ? 1 : gi == 1 ? 3 : 0;
            const int64_t step = steps[(si + gi) % 4];
            const float wd = (si + gi) % 2 ? 0.1f : 0.0f;
            fails += one_case(nsegs[si], maxn[si], nth, nblk, step, wd, verbose) != 0;
            cases++;
        }
    /* the host-side refusals */
    ft_adamw_seg bad_seg = {NULL, NULL, NULL, NULL, 4, 1e-3f};
    const int refused = adamw_mt_check(&bad_seg, 1, 0.9f, 0.999f, 1) != 0 && adamw_mt_check(NULL, -1, 0.9f, 0.999f, 1) != 0 &&
                        adamw_mt_check(NULL, 0, 0.9f, 0.999f, 0) != 0 && adamw_mt_check(NULL, 0, 1.0f, 0.999f, 1) != 0;
    if (!refused) printf("emu adamw_multi: a bad argument was accepted FAIL\n");
    fails += !refused;
    printf("%s: %d cases, %d failed (kernel vs CPU twin: bit for bit)\n", fails ? "FAILED" : "ok", cases + 1, fails);
    return fails != 0;
}
