/* decode.c - CPU ops for generation: attention of new query tokens against a KV cache
 * (kernels.h attention_kv_fwd; declaration in decode.h).
 *
 * Formula: softmax attention (Vaswani et al. 2017), o_i = sum_j softmax_j(scale q_i.k_j) v_j
 * over keys j <= p + i, computed with the online softmax of FlashAttention (Dao 2023,
 * Alg. 1; Milakov & Gimelshein 2018): keys are walked in tiles of KV_TILE, keeping the
 * running max m and sum l of each query row; the output accumulated so far is rescaled by
 * exp(m_old - m_new) whenever the max grows, and divided by l at the end. So no (n_q, p)
 * score matrix is ever held: a task keeps KV_TILE scores on the stack.
 *
 * Shapes are those of decoding: n_q is 1 (one new token) or a prompt chunk, p is the
 * cache length. A task is one (query row, query head) pair: its dot products and the
 * weighted sum of value rows are vectorised over D (omp simd). Tasks write disjoint
 * output rows and each walks its keys in a fixed order, so results do not depend on the
 * thread count or schedule.
 */

/* As in ops_f32.c: no FP traps anywhere in ftune, so GCC may vectorise the exp loop. */
#pragma GCC optimize("no-trapping-math")

#include "kernels/cpu/decode.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"
#include "src/core/err.h"

#define KV_TILE 128          /* keys per online-softmax step */
#define KV_MAX_HEAD_DIM 1024 /* as FT_CPU_MAX_HEAD_DIM in ops_decl.h */

static inline float kv_dot(const float *restrict a, const float *restrict b, int64_t D)
{
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* One (query row, head): o (D) = softmax(scale q . k_j) v_j over key rows j < nk, key and
 * value rows `ks` floats apart. */
static void kv_row(float *restrict o, const float *restrict q, const float *k, const float *v,
                   int64_t nk, int64_t ks, int64_t D, float scale)
{
    float s[KV_TILE];
    float m = -INFINITY, l = 0;
    memset(o, 0, (size_t)D * sizeof(float));
    for (int64_t j0 = 0; j0 < nk; j0 += KV_TILE) {
        const int64_t nt = FT_CPU_MIN((int64_t)KV_TILE, nk - j0);
        float bm = -INFINITY;
        for (int64_t c = 0; c < nt; c++) {
            s[c] = scale * kv_dot(q, k + (j0 + c) * ks, D);
            bm = s[c] > bm ? s[c] : bm;
        }
        const float mn = m > bm ? m : bm;
        const float corr = ft_cpu_expf(m - mn); /* 0 on the first tile (m = -inf) */
        float rs = 0;
#pragma omp simd reduction(+ : rs)
        for (int64_t c = 0; c < nt; c++) {
            s[c] = ft_cpu_expf(s[c] - mn);
            rs += s[c];
        }
        l = l * corr + rs;
        m = mn;
        if (corr != 1) {
#pragma omp simd
            for (int64_t d = 0; d < D; d++) o[d] *= corr;
        }
        for (int64_t c = 0; c < nt; c++) {
            const float pc = s[c];
            const float *restrict vr = v + (j0 + c) * ks;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) o[d] += pc * vr[d];
        }
    }
    const float inv = 1 / l;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) o[d] *= inv;
}

int ft_cpu_attention_kv_fwd_f32(float *out, const float *q, const float *k, const float *v,
                                int64_t p, int64_t n_q, int64_t H, int64_t Hkv, int64_t D,
                                float scale)
{
    const char *op = "attention_kv_fwd";
    FT_CPU_CHECK_NONNEG(op, p);
    FT_CPU_CHECK_NONNEG(op, n_q);
    FT_CPU_CHECK_NONNEG(op, H);
    FT_CPU_CHECK_NONNEG(op, Hkv);
    if (n_q == 0 || H == 0) return 0;
    if (Hkv < 1 || H % Hkv != 0)
        return ft_err(FT_E_INVALID, "cpu %s: H = %lld, expected a multiple of Hkv = %lld", op,
                      (long long)H, (long long)Hkv);
    if (D < 1 || D > KV_MAX_HEAD_DIM)
        return ft_err(FT_E_INVALID, "cpu %s: head dim D = %lld, expected 1..%d", op,
                      (long long)D, KV_MAX_HEAD_DIM);
    if (p > INT64_MAX / 2 - n_q)
        return ft_err(FT_E_INVALID, "cpu %s: p + n_q = %lld + %lld overflows", op,
                      (long long)p, (long long)n_q);
    const int64_t nk_all = p + n_q;
    FT_CPU_CHECK_PRODUCT(op, n_q, H * D);
    FT_CPU_CHECK_PRODUCT(op, nk_all, Hkv * D);
    FT_CPU_CHECK_PTR(op, out, n_q * H * D);
    FT_CPU_CHECK_PTR(op, q, n_q * H * D);
    FT_CPU_CHECK_PTR(op, k, nk_all * Hkv * D);
    FT_CPU_CHECK_PTR(op, v, nk_all * Hkv * D);
    const int64_t G = H / Hkv, qs = H * D, ks = Hkv * D, tasks = n_q * H;
    /* multiply-adds of the whole call: about 2 * D per (task, key) */
    const double work = (double)tasks * (double)(p + (n_q + 1) / 2) * (double)D;
#pragma omp parallel for schedule(dynamic, 1) if (work > 4.0 * FT_CPU_PAR_MIN && tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t i = t / H, h = t % H, g = h / G;
        kv_row(out + i * qs + h * D, q + i * qs + h * D, k + g * D, v + g * D, p + i + 1, ks,
               D, scale);
    }
    return 0;
}
