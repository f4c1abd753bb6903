/* test_cuda_nf4.c - the CUDA dequant_nf4 op (kernels/cuda/nf4.cu) bit for bit against the
 * CPU's ft_nf4_dequant rounded to bf16 (nearest even), over every path of the kernel:
 *   - block sizes 16 (absmax per word), 32..512 (one absmax per block, shuffled across the
 *     warp), 1024 and 4096 (one block covers whole tiles), nested (double quantization, nested
 *     blocks of 256 and of 2) and plain fp32 absmax;
 *   - sizes below one 1024-element tile, whole tiles, tiles plus an odd tail;
 *   - codes 4-byte aligned or not, output 16-byte aligned or not (the element-wise path), an
 *     output that starts mid-buffer (neighbours must stay untouched);
 *   - bad descriptions refused with FT_E_INVALID.
 * test_cuda_ops.c test_nf4 covers the default layout at a few sizes; this file the rest.
 * Skips when no GPU is visible (or ftune was built without CUDA). */
#include "tests/unit/harness.h"
#include "tests/gpu/gpu_fixture.h"

#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/numeric/nf4.h"
#include "src/numeric/quant.h"

static int setup(void **state) { return gpu_fixture_setup(state, 4321, 0); }
static int teardown(void **state) { return gpu_fixture_teardown(state); }

/* A layout for any power-of-two blocksize (ft_nf4_layout_init accepts bnb's 32..4096; the
 * kernel also takes 16). */
static void layout(ft_nf4_layout *l, int64_t n, int64_t bs, int64_t nbs)
{
    memset(l, 0, sizeof *l);
    l->n = n;
    l->blocksize = bs;
    l->nested_blocksize = nbs;
    l->code_bytes = (n + 1) / 2;
    l->n_blocks = (n + bs - 1) / bs;
    l->n_nested = nbs ? (l->n_blocks + nbs - 1) / nbs : 0;
}

/* Device buffer of `bytes` + `pad` on each side, filled with 0xff; returns the inner start. */
static uint8_t *dev_buf(fix *f, const void *h, size_t bytes, size_t pad, size_t shift)
{
    size_t total = bytes + 2 * pad + shift;
    uint8_t *tmp = malloc(total);
    memset(tmp, 0xff, total);
    if (h) memcpy(tmp + pad + shift, h, bytes);
    uint8_t *d = f->gpu->ops->alloc(f->gpu, total);
    assert_non_null(d);
    assert_int_equal(f->gpu->ops->copy(f->gpu, d, tmp, total), 0);
    free(tmp);
    return d + pad + shift;
}

/* One case: n values of blocksize bs (nested blocks of nbs, 0 = plain), codes placed at
 * byte offset cshift from a 256-aligned address, output at element offset oshift. */
static void one(fix *f, int64_t n, int64_t bs, int64_t nbs, size_t cshift, size_t oshift)
{
    float map[256];
    ft_nf4_dynamic_map(map);
    ft_nf4_layout l;
    layout(&l, n, bs, nbs);
    float *x = malloc(n * 4), *am = malloc(l.n_blocks * 4), *ref = malloc(n * 4), off = 0;
    for (int64_t i = 0; i < n; i++) /* a scale that varies per block, some all-zero blocks */
        x[i] = ((i / bs) % 7 == 3) ? 0.0f : (2 * ft_rng_uniform(&f->rng) - 1) * (float)(1 + (i / bs) % 5);
    uint8_t *codes = malloc(l.code_bytes), *qam = malloc(l.n_blocks);
    float *nam = malloc((l.n_nested + 1) * 4);
    assert_int_equal(ft_nf4_quantize(x, &l, map, codes, nbs ? qam : NULL, nam, &off, am), 0);
    ft_nf4_view v = {l, codes, nbs ? qam : NULL, nbs ? NULL : am, nbs ? nam : NULL, nbs ? map : NULL,
                     ft_nf4_code, off};
    assert_int_equal(ft_nf4_dequant(&v, ref), 0);
    const size_t pad = 256;
    uint8_t *dc = dev_buf(f, codes, l.code_bytes, pad, cshift);
    uint8_t *dq = dev_buf(f, qam, l.n_blocks, pad, 0);
    uint8_t *da = dev_buf(f, am, l.n_blocks * 4, pad, 0);
    uint8_t *dn = dev_buf(f, nam, l.n_nested * 4 + 4, pad, 0);
    uint8_t *dm = dev_buf(f, map, sizeof map, pad, 0);
    uint8_t *dk = dev_buf(f, ft_nf4_code, 16 * 4, pad, 0);
    uint8_t *dout = dev_buf(f, NULL, n * 2, pad, oshift * 2);
    ft_nf4_tensor t = {n, bs, nbs, dc, nbs ? dq : NULL, nbs ? NULL : (const float *)da,
                       nbs ? (const float *)dn : NULL, nbs ? (const float *)dm : NULL,
                       (const float *)dk, off};
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, (uint16_t *)dout, &t), 0);
    size_t span = n * 2 + 2 * pad;
    uint8_t *got = malloc(span);
    assert_int_equal(f->gpu->ops->copy(f->gpu, got, dout - pad, span), 0);
    int64_t bad = 0, first = -1, clobbered = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t g;
        memcpy(&g, got + pad + 2 * i, 2);
        if (g != ft_quant_f32_to_bf16(ref[i])) { bad++; if (first < 0) first = i; }
    }
    for (size_t i = 0; i < pad; i++) clobbered += (got[i] != 0xff) + (got[pad + n * 2 + i] != 0xff);
    if (bad || clobbered)
        printf("  n=%lld blocksize %lld nested %lld codes+%zu out+%zu: %lld of %lld differ (first %lld), "
               "%lld guard bytes written\n", (long long)n, (long long)bs, (long long)nbs, cshift, oshift,
               (long long)bad, (long long)n, (long long)first, (long long)clobbered);
    assert_int_equal(bad, 0);
    assert_int_equal(clobbered, 0);
    uint8_t *bufs[] = {dc - pad - cshift, dq - pad, da - pad, dn - pad, dm - pad, dk - pad,
                       dout - pad - oshift * 2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) f->gpu->ops->free(f->gpu, bufs[i]);
    free(x); free(am); free(ref); free(codes); free(qam); free(nam); free(got);
}

static void test_nf4_paths(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    const int64_t bss[] = {16, 32, 64, 128, 512, 1024, 4096};
    const int64_t ns[] = {1, 63, 1000, 1024, 3 * 1024, 8192 + 7, 5 * 4096 + 1023, 1 << 20};
    int cases = 0;
    for (size_t b = 0; b < sizeof bss / sizeof bss[0]; b++)
        for (int nested = 0; nested <= 2; nested++)
            for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
                int64_t nbs = nested == 0 ? 0 : nested == 1 ? 256 : 2;
                one(f, ns[s], bss[b], nbs, 0, 0);
                cases++;
            }
    /* misaligned codes / output: the element-wise path; 16-byte aligned output mid-buffer */
    const size_t shifts[][2] = {{1, 0}, {2, 0}, {4, 0}, {0, 1}, {0, 8}, {3, 5}};
    for (size_t k = 0; k < sizeof shifts / sizeof shifts[0]; k++)
        for (int nested = 0; nested <= 1; nested++) {
            one(f, 4 * 1024 + 77, 64, nested ? 256 : 0, shifts[k][0], shifts[k][1]);
            cases++;
        }
    printf("  dequant_nf4: %d cases bit-identical to the CPU, no write outside the output\n", cases);
}

static void test_nf4_refused(void **state)
{
    fix *f = *state;
    NEED_GPU(f);
    float code[16] = {0};
    uint8_t c[8] = {0};
    float am[1] = {1};
    uint16_t out[16];
    ft_nf4_tensor t = {16, 48, 0, c, NULL, am, NULL, NULL, code, 0};
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, out, &t), FT_E_INVALID); /* not a power of 2 */
    t.blocksize = 8;
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, out, &t), FT_E_INVALID); /* below 16 */
    t.blocksize = 64;
    t.nested_blocksize = 256; /* nested without qabsmax */
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, out, &t), FT_E_INVALID);
    t.nested_blocksize = 0;
    t.code = NULL;
    assert_int_equal(f->gpu->ops->dequant_nf4(f->gpu, out, &t), FT_E_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nf4_paths),
        cmocka_unit_test(test_nf4_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
