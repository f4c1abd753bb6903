/* attn_impl.h - causal GQA attention over packed sequences, forward and backward, written
 * once for an element type REAL. Template: no include guard; included by ops_f32.c and
 * ops_f64.c after ops_impl.h, with the same macros (FT_CPU_REAL, FT_CPU_SUFFIX,
 * FT_CPU_EXP). Semantics: kernels/kernels.h; argument rules: ops_decl.h.
 *
 * Formulas: standard softmax attention (Vaswani et al. 2017) with the log-sum-exp of each
 * softmax row kept for the backward, as in FlashAttention-2 (Dao 2023, Alg. 1 and 2):
 *   forward   S_ij = scale q_i.k_j for seq_start[i] <= j <= i;  lse_i = log sum_j exp(S_ij);
 *             P_ij = exp(S_ij - lse_i);  o_i = sum_j P_ij v_j
 *   backward  dP_ij = do_i.v_j;  Delta_i = do_i.o_i (= sum_j P_ij dP_ij);
 *             dS_ij = P_ij (dP_ij - Delta_i);
 *             dq_i = scale sum_j dS_ij k_j;  dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij do_i
 *
 * Tiling (FlashAttention-2 on a CPU): a task owns one query head and ATT_BQ query rows
 * (forward, dq) or one kv head and ATT_BK key rows (dk, dv). It walks the other side in
 * tiles of ATT_BK keys / ATT_BQ queries; each tile's S = Q K^T, P V, dP = dO V^T, dS K,
 * P^T dO and dS^T Q is one single-threaded BLAS call (OpenBLAS runs one thread per OpenMP
 * thread, see backend.c). The forward keeps the online softmax (running max m and sum l
 * per row, earlier output rescaled by exp(m_old - m_new)), accumulating straight into out;
 * the backward recomputes P from q, k and lse. Each thread holds at most one tile of
 * ATT_BQ x ATT_BK scores (two in the backward: P and dP), whatever T is, never a (T, T)
 * matrix. Every output row is written by exactly one task in a fixed order, so results do
 * not depend on scheduling or the thread count.
 * Tiles cover only keys seq_start[i0] .. i1-1 of their query rows, so packed short
 * sequences cost in proportion to sum(len^2), not T^2; entries outside a row's own
 * sequence or above the diagonal are masked to P = 0.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"
#include "src/core/err.h"

#define REAL FT_CPU_REAL
#define FN(name) FT_CPU_CAT(ft_cpu_##name, FT_CPU_SUFFIX)
#define R_EXP FT_CPU_EXP

/* Shape and seq_start checks shared by forward and backward. */
static int attn_check(const char *op, const int32_t *seq_start, int64_t T, int64_t H,
                      int64_t Hkv, int64_t D)
{
    FT_CPU_CHECK_NONNEG(op, T);
    FT_CPU_CHECK_NONNEG(op, H);
    FT_CPU_CHECK_NONNEG(op, Hkv);
    if (H > 0 && (Hkv < 1 || H % Hkv != 0))
        return ft_err(FT_E_INVALID, "cpu %s: H = %lld, expected a multiple of Hkv = %lld", op,
                      (long long)H, (long long)Hkv);
    if (D < 1 || D > FT_CPU_MAX_HEAD_DIM)
        return ft_err(FT_E_INVALID, "cpu %s: head dim D = %lld, expected 1..%d", op,
                      (long long)D, FT_CPU_MAX_HEAD_DIM);
    if (T > INT32_MAX)
        return ft_err(FT_E_INVALID, "cpu %s: T = %lld, expected <= %d (int32 seq_start)", op,
                      (long long)T, INT32_MAX);
    FT_CPU_CHECK_PRODUCT(op, T, H * D);
    FT_CPU_CHECK_PTR(op, seq_start, T);
    for (int64_t t = 0; t < T; t++) {
        int32_t s = seq_start[t];
        int ok = t == 0 ? s == 0 : ((int64_t)s == t || s == seq_start[t - 1]);
        if (!ok)
            return ft_err(FT_E_INVALID,
                          "cpu %s: seq_start[%lld] = %d, expected %lld (a new sequence) or "
                          "seq_start[%lld] = %d (contiguous packed sequences)",
                          op, (long long)t, s, (long long)t, (long long)(t > 0 ? t - 1 : 0),
                          t > 0 ? seq_start[t - 1] : 0);
    }
    return 0;
}

static inline REAL attn_dot(const REAL *restrict a, const REAL *restrict b, int64_t D)
{
    REAL s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

#define ATT_BQ 32 /* query rows per tile */
#define ATT_BK 64 /* key rows per tile */

/* Valid key columns [*a, *e) of query row i in the key tile [j0, j0 + nk); may be empty. */
static inline void attn_cols(const int32_t *seq_start, int64_t i, int64_t j0, int64_t nk,
                             int64_t *a, int64_t *e)
{
    *a = FT_CPU_MAX((int64_t)0, (int64_t)seq_start[i] - j0);
    *e = FT_CPU_MIN(nk, i - j0 + 1);
}

/* Parallelize only when there is enough work to wake the team for. */
static inline int attn_par(int64_t T, int64_t H, int64_t D)
{
    return (double)T * (double)T * (double)H * (double)D > 4.0 * FT_CPU_PAR_MIN;
}

int FN(attention_fwd)(REAL *out, REAL *lse, const REAL *q, const REAL *k, const REAL *v,
                      const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      REAL scale)
{
    const char *op = "attention_fwd";
    if (T == 0 || H == 0) return 0;
    FT_TRY(attn_check(op, seq_start, T, H, Hkv, D));
    FT_CPU_CHECK_PTR(op, out, T * H * D);
    FT_CPU_CHECK_PTR(op, lse, T * H);
    FT_CPU_CHECK_PTR(op, q, T * H * D);
    FT_CPU_CHECK_PTR(op, k, T * Hkv * D);
    FT_CPU_CHECK_PTR(op, v, T * Hkv * D);
    const int64_t G = H / Hkv, qs = H * D, ks = Hkv * D;
    const int64_t nqb = (T + ATT_BQ - 1) / ATT_BQ;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (attn_par(T, H, D))
    for (int64_t bb = 0; bb < nqb; bb++) {
        for (int64_t h = 0; h < H; h++) {
            const int64_t b = nqb - 1 - bb; /* longest key ranges first */
            const int64_t i0 = b * ATT_BQ, i1 = FT_CPU_MIN(T, i0 + ATT_BQ), nq = i1 - i0;
            const int64_t g = h / G;
            const REAL *qb = q + i0 * qs + h * D;
            REAL *ob = out + i0 * qs + h * D;
            REAL S[ATT_BQ * ATT_BK], m[ATT_BQ], l[ATT_BQ];
            for (int64_t r = 0; r < nq; r++) {
                m[r] = -INFINITY;
                l[r] = 0;
                memset(ob + r * qs, 0, (size_t)D * sizeof(REAL));
            }
            for (int64_t j0 = seq_start[i0]; j0 < i1; j0 += ATT_BK) {
                const int64_t nk = FT_CPU_MIN((int64_t)ATT_BK, i1 - j0);
                gemm_blas(0, 1, nq, nk, D, scale, qb, qs, k + j0 * ks + g * D, ks, 0, S, ATT_BK);
                for (int64_t r = 0; r < nq; r++) {
                    REAL *restrict sr = S + r * ATT_BK;
                    int64_t a, e;
                    attn_cols(seq_start, i0 + r, j0, nk, &a, &e);
                    if (a >= e) { /* no key of this row in the tile: P row = 0 */
                        memset(sr, 0, (size_t)nk * sizeof(REAL));
                        continue;
                    }
                    REAL bm = -INFINITY;
#pragma omp simd reduction(max : bm)
                    for (int64_t c = a; c < e; c++) bm = sr[c] > bm ? sr[c] : bm;
                    const REAL mn = m[r] > bm ? m[r] : bm;
                    const REAL corr = R_EXP(m[r] - mn); /* 0 on the first tile */
                    REAL rs = 0;
#pragma omp simd reduction(+ : rs)
                    for (int64_t c = 0; c < nk; c++) {
                        REAL p = R_EXP(sr[c] - mn);
                        p = (c >= a && c < e) ? p : 0;
                        sr[c] = p;
                        rs += p;
                    }
                    l[r] = l[r] * corr + rs;
                    m[r] = mn;
                    if (corr != 1) {
                        REAL *restrict orow = ob + r * qs;
#pragma omp simd
                        for (int64_t d = 0; d < D; d++) orow[d] *= corr;
                    }
                }
                gemm_blas(0, 0, nq, D, nk, 1, S, ATT_BK, v + j0 * ks + g * D, ks, 1, ob, qs);
            }
            for (int64_t r = 0; r < nq; r++) {
                const REAL inv = 1 / l[r];
                REAL *restrict orow = ob + r * qs;
#pragma omp simd
                for (int64_t d = 0; d < D; d++) orow[d] *= inv;
                lse[(i0 + r) * H + h] = (REAL)((double)m[r] + log((double)l[r]));
            }
        }
    }
    return 0;
}

int FN(attention_bwd)(REAL *dq, REAL *dk, REAL *dv, const REAL *dout, const REAL *q,
                      const REAL *k, const REAL *v, const REAL *out, const REAL *lse,
                      const int32_t *seq_start, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                      REAL scale)
{
    const char *op = "attention_bwd";
    if (T == 0 || H == 0) return 0;
    FT_TRY(attn_check(op, seq_start, T, H, Hkv, D));
    const int64_t nq_all = T * H * D, nk_all = T * Hkv * D;
    FT_CPU_CHECK_PTR(op, dq, nq_all);
    FT_CPU_CHECK_PTR(op, dk, nk_all);
    FT_CPU_CHECK_PTR(op, dv, nk_all);
    FT_CPU_CHECK_PTR(op, dout, nq_all);
    FT_CPU_CHECK_PTR(op, q, nq_all);
    FT_CPU_CHECK_PTR(op, k, nk_all);
    FT_CPU_CHECK_PTR(op, v, nk_all);
    FT_CPU_CHECK_PTR(op, out, nq_all);
    FT_CPU_CHECK_PTR(op, lse, T * H);
    const int64_t G = H / Hkv, qs = H * D, ks = Hkv * D;
    const int par = attn_par(T, H, D);

    /* Pass 1: dq; a task = (query head, ATT_BQ query rows), walking key tiles. */
    const int64_t nqb = (T + ATT_BQ - 1) / ATT_BQ;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par)
    for (int64_t bb = 0; bb < nqb; bb++) {
        for (int64_t h = 0; h < H; h++) {
            const int64_t b = nqb - 1 - bb;
            const int64_t i0 = b * ATT_BQ, i1 = FT_CPU_MIN(T, i0 + ATT_BQ), nq = i1 - i0;
            const int64_t g = h / G;
            const REAL *qb = q + i0 * qs + h * D, *dob = dout + i0 * qs + h * D;
            REAL *dqb = dq + i0 * qs + h * D;
            REAL S[ATT_BQ * ATT_BK], dP[ATT_BQ * ATT_BK], delta[ATT_BQ];
            for (int64_t r = 0; r < nq; r++) {
                delta[r] = attn_dot(dob + r * qs, out + (i0 + r) * qs + h * D, D);
                memset(dqb + r * qs, 0, (size_t)D * sizeof(REAL));
            }
            for (int64_t j0 = seq_start[i0]; j0 < i1; j0 += ATT_BK) {
                const int64_t nk = FT_CPU_MIN((int64_t)ATT_BK, i1 - j0);
                const REAL *kt = k + j0 * ks + g * D, *vt = v + j0 * ks + g * D;
                gemm_blas(0, 1, nq, nk, D, scale, qb, qs, kt, ks, 0, S, ATT_BK);
                gemm_blas(0, 1, nq, nk, D, 1, dob, qs, vt, ks, 0, dP, ATT_BK);
                for (int64_t r = 0; r < nq; r++) {
                    REAL *restrict sr = S + r * ATT_BK;
                    const REAL *restrict dpr = dP + r * ATT_BK;
                    const REAL li = lse[(i0 + r) * H + h], dl = delta[r];
                    int64_t a, e;
                    attn_cols(seq_start, i0 + r, j0, nk, &a, &e);
#pragma omp simd
                    for (int64_t c = 0; c < nk; c++) {
                        REAL ds = R_EXP(sr[c] - li) * (dpr[c] - dl);
                        sr[c] = (c >= a && c < e) ? ds : 0; /* dS */
                    }
                }
                gemm_blas(0, 0, nq, D, nk, scale, S, ATT_BK, kt, ks, 1, dqb, qs);
            }
        }
    }

    /* Pass 2: dk, dv; a task = (kv head, ATT_BK key rows), walking tiles of the queries
     * that see them: i in [j0, end of the sequence holding key j1 - 1). */
    const int64_t nkb = (T + ATT_BK - 1) / ATT_BK;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (par)
    for (int64_t kb = 0; kb < nkb; kb++) {
        for (int64_t g = 0; g < Hkv; g++) {
            const int64_t j0 = kb * ATT_BK, j1 = FT_CPU_MIN(T, j0 + ATT_BK), nk = j1 - j0;
            const REAL *kt = k + j0 * ks + g * D, *vt = v + j0 * ks + g * D;
            REAL *dkb = dk + j0 * ks + g * D, *dvb = dv + j0 * ks + g * D;
            REAL S[ATT_BQ * ATT_BK], dP[ATT_BQ * ATT_BK];
            for (int64_t c = 0; c < nk; c++) {
                memset(dkb + c * ks, 0, (size_t)D * sizeof(REAL));
                memset(dvb + c * ks, 0, (size_t)D * sizeof(REAL));
            }
            int64_t iend = j1;
            while (iend < T && seq_start[iend] < j1) iend++;
            for (int64_t h = g * G; h < (g + 1) * G; h++) {
                for (int64_t i0 = j0; i0 < iend; i0 += ATT_BQ) {
                    const int64_t nq = FT_CPU_MIN((int64_t)ATT_BQ, iend - i0);
                    const REAL *qb = q + i0 * qs + h * D, *dob = dout + i0 * qs + h * D;
                    gemm_blas(0, 1, nq, nk, D, scale, qb, qs, kt, ks, 0, S, ATT_BK);
                    gemm_blas(0, 1, nq, nk, D, 1, dob, qs, vt, ks, 0, dP, ATT_BK);
                    for (int64_t r = 0; r < nq; r++) {
                        const int64_t i = i0 + r;
                        REAL *restrict sr = S + r * ATT_BK, *restrict dpr = dP + r * ATT_BK;
                        const REAL li = lse[i * H + h];
                        const REAL dl = attn_dot(dob + r * qs, out + i * qs + h * D, D);
                        int64_t a, e;
                        attn_cols(seq_start, i, j0, nk, &a, &e);
#pragma omp simd
                        for (int64_t c = 0; c < nk; c++) {
                            REAL p = R_EXP(sr[c] - li);
                            p = (c >= a && c < e) ? p : 0;
                            sr[c] = p;                  /* P  */
                            dpr[c] = p * (dpr[c] - dl); /* dS */
                        }
                    }
                    /* dv (nk, D) += P^T dO;  dk (nk, D) += scale dS^T Q */
                    gemm_blas(1, 0, nk, D, nq, 1, S, ATT_BK, dob, qs, 1, dvb, ks);
                    gemm_blas(1, 0, nk, D, nq, scale, dP, ATT_BK, qb, qs, 1, dkb, ks);
                }
            }
        }
    }
    return 0;
}

#undef ATT_BQ
#undef ATT_BK
#undef REAL
#undef FN
#undef R_EXP
