/* qcorr.c - the low-rank correction of a quantized base (see qcorr.h). */
#include "adapters/qcorr.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adapters/peft.h"
#include "kernels/kernels.h"
#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/model/llama.h"

/* LAPACK (inside OpenBLAS), Fortran calling convention, column-major. */
extern void dpotrf_(const char *uplo, const int *n, double *a, const int *lda, int *info);
extern void dgeqrf_(const int *m, const int *n, double *a, const int *lda, double *tau,
                    double *work, const int *lwork, int *info);
extern void dorgqr_(const int *m, const int *n, const int *k, double *a, const int *lda,
                    const double *tau, double *work, const int *lwork, int *info);
extern void dgesdd_(const char *jobz, const int *m, const int *n, double *a, const int *lda,
                    double *s, double *u, const int *ldu, double *vt, const int *ldvt,
                    double *work, const int *lwork, int *iwork, int *info);

static const char *const k_names[] = {"none", "calibrated", "weight"};

int ft_qcorr_parse(const char *s, int *mode)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, k_names[i])) {
            *mode = i;
            return 0;
        }
    return ft_err(FT_E_INVALID, "unknown quantization correction '%s' (none, calibrated, weight)", s);
}

const char *ft_qcorr_name(int mode)
{
    return mode >= 0 && mode < 3 ? k_names[mode] : "?";
}

/* Orthonormalises the columns of a (m, n) col-major, m >= n, in place (QR, Q kept). */
static int orth(double *a, int m, int n)
{
    int info = 0, lwork = -1;
    double q, *tau = malloc((size_t)n * sizeof *tau);
    if (!tau) return -ENOMEM;
    dgeqrf_(&m, &n, a, &m, tau, &q, &lwork, &info);
    double q2;
    dorgqr_(&m, &n, &n, a, &m, tau, &q2, &lwork, &info);
    lwork = (int)(q > q2 ? q : q2) + 1;
    double *work = malloc((size_t)lwork * sizeof *work);
    if (!work) {
        free(tau);
        return -ENOMEM;
    }
    dgeqrf_(&m, &n, a, &m, tau, work, &lwork, &info);
    if (!info) dorgqr_(&m, &n, &n, a, &m, tau, work, &lwork, &info);
    free(work);
    free(tau);
    return info ? ft_err(FT_E_NUMERIC, "LAPACK dgeqrf/dorgqr failed (info %d)", info) : 0;
}

/* Top-k singular triplets of Z (out, in), given as Zt = Z^T col-major (in, out), by the
 * randomized range finder with power iterations. Writes U (out, k) and V (in, k) col-major
 * and S (k), descending. */
static int rsvd(const double *Zt, int out, int in, int k, uint64_t seed, double *U, double *S,
                double *V)
{
    int rc = 0, info = 0;
    double *Y = malloc((size_t)out * k * sizeof *Y), *Wt = malloc((size_t)in * k * sizeof *Wt);
    double *vt = malloc((size_t)k * k * sizeof *vt);
    int *iwork = malloc((size_t)8 * k * sizeof *iwork);
    if (!Y || !Wt || !vt || !iwork) {
        rc = -ENOMEM;
        goto done;
    }
    ft_rng g;
    ft_rng_seed(&g, seed ^ 0x51636f7272ull);
    for (int64_t i = 0; i < (int64_t)in * k; i++)
        Wt[i] = 2.0 * ft_rng_uniform(&g) - 1.0;
    /* Y = Z Omega; then (Y = Z Z^T Y) three times, re-orthonormalised each half step */
    cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, out, k, in, 1.0, Zt, in, Wt, in, 0.0, Y, out);
    for (int it = 0; it < 3 && !rc; it++) {
        rc = orth(Y, out, k);
        if (rc) break;
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, in, k, out, 1.0, Zt, in, Y, out, 0.0, Wt, in);
        rc = orth(Wt, in, k);
        if (rc) break;
        cblas_dgemm(CblasColMajor, CblasTrans, CblasNoTrans, out, k, in, 1.0, Zt, in, Wt, in, 0.0, Y, out);
    }
    if (!rc) rc = orth(Y, out, k);
    if (rc) goto done;
    /* Bt = Z^T Q (in, k) = Ub S Vb^T, so Z ~ Q B = (Q Vb) S Ub^T: U = Q Vb, V = Ub */
    cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, in, k, out, 1.0, Zt, in, Y, out, 0.0, Wt, in);
    int lwork = -1;
    double q;
    dgesdd_("S", &in, &k, Wt, &in, S, V, &in, vt, &k, &q, &lwork, iwork, &info);
    lwork = (int)q + 1;
    double *work = malloc((size_t)lwork * sizeof *work);
    if (!work) {
        rc = -ENOMEM;
        goto done;
    }
    dgesdd_("S", &in, &k, Wt, &in, S, V, &in, vt, &k, work, &lwork, iwork, &info);
    free(work);
    if (info) {
        rc = ft_err(FT_E_NUMERIC, "LAPACK dgesdd failed (info %d)", info);
        goto done;
    }
    cblas_dgemm(CblasColMajor, CblasNoTrans, CblasTrans, out, k, k, 1.0, Y, out, vt, k, 0.0, U, out);
done:
    free(Y);
    free(Wt);
    free(vt);
    free(iwork);
    return rc == -ENOMEM ? ft_err(-ENOMEM, "out of memory (randomized SVD of %d x %d)", out, in) : rc;
}

int ft_qcorr_linear(const double *R, int64_t out_n, int64_t in_n, const double *H, double damp,
                    int64_t r, float scale, uint64_t seed, float *A0, float *B0, double err[2])
{
    int64_t mn = out_n < in_n ? out_n : in_n;
    if (r < 1 || r > mn || !(scale > 0))
        return ft_err(FT_E_INVALID, "correction rank %lld of a %lld x %lld weight (scale %g)",
                      (long long)r, (long long)out_n, (long long)in_n, scale);
    int out = (int)out_n, in = (int)in_n, k = (int)(r + 16 < mn ? r + 16 : mn);
    int rc = 0;
    /* Zt = Z^T (in, out) col-major: the same bytes as R row-major, times L on the right */
    double *Zt = malloc((size_t)in * out * sizeof *Zt), *L = NULL;
    double *U = malloc((size_t)out * k * sizeof *U), *V = malloc((size_t)in * k * sizeof *V);
    double *S = malloc((size_t)k * sizeof *S);
    if (!Zt || !U || !V || !S) {
        rc = ft_err(-ENOMEM, "out of memory (correction of a %d x %d weight)", out, in);
        goto done;
    }
    memcpy(Zt, R, (size_t)in * out * sizeof *Zt);
    if (H) {
        L = malloc((size_t)in * in * sizeof *L);
        if (!L) {
            rc = ft_err(-ENOMEM, "out of memory (Cholesky of %d x %d)", in, in);
            goto done;
        }
        double tr = 0;
        for (int i = 0; i < in; i++)
            tr += H[(size_t)i * in + i];
        double lam = damp * tr / in;
        if (!(lam > 0)) lam = 1e-12;
        int info = 1;
        for (int tries = 0; tries < 6 && info; tries++, lam *= 10) {
            memcpy(L, H, (size_t)in * in * sizeof *L);
            for (int i = 0; i < in; i++)
                L[(size_t)i * in + i] += lam;
            dpotrf_("L", &in, L, &in, &info);
        }
        if (info) {
            rc = ft_err(FT_E_NUMERIC, "LAPACK dpotrf failed (info %d) on a %d x %d Gram matrix", info, in, in);
            goto done;
        }
        /* Zt := L^T Zt, i.e. Z = R L (L lower, col-major) */
        cblas_dtrmm(CblasColMajor, CblasLeft, CblasLower, CblasTrans, CblasNonUnit, in, out, 1.0,
                    L, in, Zt, in);
    }
    double total = 0;
    for (int64_t i = 0; i < (int64_t)in * out; i++)
        total += Zt[i] * Zt[i];
    rc = rsvd(Zt, out, in, k, seed, U, S, V);
    if (rc) goto done;
    /* A0^T (in, r) = L^-T V S^1/2, stored col-major = A0 row-major (r, in) */
    for (int j = 0; j < r; j++) {
        double h = sqrt(S[j]);
        for (int i = 0; i < in; i++)
            V[(size_t)j * in + i] *= h;
    }
    if (L)
        cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasTrans, CblasNonUnit, in, (int)r,
                    1.0, L, in, V, in);
    double kept = 0;
    for (int j = 0; j < r; j++)
        kept += S[j] * S[j];
    for (int64_t i = 0; i < r * (int64_t)in; i++)
        A0[i] = (float)V[i];
    for (int o = 0; o < out; o++)
        for (int j = 0; j < r; j++)
            B0[(size_t)o * r + j] = (float)(U[(size_t)j * out + o] * sqrt(S[j]) / scale);
    if (err) {
        err[0] = total;
        err[1] = total - kept > 0 ? total - kept : 0;
    }
done:
    free(Zt);
    free(L);
    free(U);
    free(V);
    free(S);
    return rc;
}

/* ---- calibration ------------------------------------------------------------------------ */

enum { IN_ATTN, IN_O, IN_MLP, IN_DOWN, N_IN };
static const int k_input_of[FT_N_PROJ] = {IN_ATTN, IN_ATTN, IN_ATTN, IN_O, IN_MLP, IN_MLP, IN_DOWN};

/* H (n, n) += x^T x for x (T, n) fp32, via a fp32 SYRK of this batch into tmp. */
static void gram_add(double *H, float *tmp, const float *x, int64_t T, int64_t n)
{
    cblas_ssyrk(CblasRowMajor, CblasLower, CblasTrans, (int)n, (int)T, 1.0f, x, (int)n, 0.0f, tmp, (int)n);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j <= i; j++) {
            H[i * n + j] += tmp[i * n + j];
            if (j < i) H[j * n + i] += tmp[i * n + j];
        }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct calib {
    ft_backend *be;
    int64_t n_b, T_max, C, F, HD;
    const ft_batch *b;
    float **x, **y;        /* per batch (T, C): this layer's input / output */
    float *acts, *scr, *inv, *tmp;
    double *H[N_IN];
    int64_t dims[N_IN];
} calib;

static void calib_free(calib *k)
{
    for (int64_t i = 0; i < k->n_b; i++) {
        if (k->x) free(k->x[i]);
        if (k->y) free(k->y[i]);
    }
    free(k->x);
    free(k->y);
    free(k->acts);
    free(k->scr);
    free(k->inv);
    free(k->tmp);
    for (int i = 0; i < N_IN; i++)
        free(k->H[i]);
    ft_backend_free(k->be);
}

static int calib_init(calib *k, const ft_model *m, const ft_batch *b, int64_t n_b, int threads)
{
    const ft_model_config *c = &m->cfg;
    memset(k, 0, sizeof *k);
    k->b = b;
    k->n_b = n_b;
    k->C = c->hidden_size;
    k->F = c->intermediate_size;
    k->HD = c->num_attention_heads * c->head_dim;
    for (int64_t i = 0; i < n_b; i++)
        if (b[i].T > k->T_max) k->T_max = b[i].T;
    k->dims[IN_ATTN] = k->dims[IN_MLP] = k->C;
    k->dims[IN_O] = k->HD;
    k->dims[IN_DOWN] = k->F;
    FT_TRY(ft_backend_init(&k->be, "cpu", threads));
    if (k->be->ops->prepare)
        FT_TRY(k->be->ops->prepare(k->be, k->T_max, c->num_attention_heads, c->num_key_value_heads, c->head_dim));
    ft_block_dims d = {k->T_max, k->C, c->num_attention_heads, c->num_key_value_heads, c->head_dim, k->F, 1};
    int64_t big = k->F > k->C ? k->F : k->C;
    if (k->HD > big) big = k->HD;
    k->x = calloc((size_t)n_b, sizeof *k->x);
    k->y = calloc((size_t)n_b, sizeof *k->y);
    k->acts = malloc((size_t)ft_block_acts_floats(&d) * sizeof(float));
    k->scr = malloc((size_t)ft_block_scratch_floats(&d) * sizeof(float));
    k->inv = malloc((size_t)(c->head_dim / 2 + 1) * sizeof(float));
    k->tmp = malloc((size_t)big * big * sizeof(float));
    int bad = !k->x || !k->y || !k->acts || !k->scr || !k->inv || !k->tmp;
    for (int i = 0; i < N_IN && !bad; i++)
        bad = !(k->H[i] = malloc((size_t)k->dims[i] * k->dims[i] * sizeof(double)));
    for (int64_t i = 0; i < n_b && !bad; i++) {
        k->x[i] = malloc((size_t)b[i].T * k->C * sizeof(float));
        k->y[i] = malloc((size_t)b[i].T * k->C * sizeof(float));
        bad = !k->x[i] || !k->y[i];
        for (int64_t t = 0; t < b[i].T && !bad; t++) {
            int32_t id = b[i].ids[t];
            if (id < 0 || id >= c->vocab_size) return ft_err(FT_E_INVALID, "token id %d outside the vocabulary", id);
            memcpy(k->x[i] + t * k->C, m->embed + (int64_t)id * k->C, (size_t)k->C * sizeof(float));
        }
    }
    if (bad) return ft_err(-ENOMEM, "out of memory for the calibration forward (%lld micro-batches)", (long long)n_b);
    return 0;
}

/* Runs layer l over every calibration batch (x -> y, then swapped), accumulating H. */
static int calib_layer(calib *k, const ft_model *m, int64_t l)
{
    const ft_model_config *c = &m->cfg;
    for (int i = 0; i < N_IN; i++)
        memset(k->H[i], 0, (size_t)k->dims[i] * k->dims[i] * sizeof(double));
    for (int64_t i = 0; i < k->n_b; i++) {
        const ft_batch *b = &k->b[i];
        ft_block_dims d = {b->T, k->C, c->num_attention_heads, c->num_key_value_heads, c->head_dim, k->F, 1};
        ft_block_acts a;
        ft_block_scratch s;
        ft_block_acts_carve(&a, k->acts, &d, 0);
        ft_block_scratch_carve(&s, k->scr, &d);
        ft_rope_inv_freq(c, b->seq_len, k->inv);
        ft_block_io io = {b->pos, b->seq_start, k->inv, 0};
        FT_TRY(ft_block_fwd(k->be, c, &m->layers[l], NULL, l, &d, &io, k->x[i], k->y[i], &a, &s, 0));
        gram_add(k->H[IN_ATTN], k->tmp, a.xn1, b->T, k->C);
        gram_add(k->H[IN_O], k->tmp, a.att, b->T, k->HD);
        gram_add(k->H[IN_MLP], k->tmp, a.xn2, b->T, k->C);
        gram_add(k->H[IN_DOWN], k->tmp, a.act, b->T, k->F);
        float *t = k->x[i];
        k->x[i] = k->y[i];
        k->y[i] = t;
    }
    return 0;
}

int ft_qcorr_compute(const ft_model *m, const ft_lora *l, ft_qcorr_base_fn base, void *base_ctx,
                     const ft_batch *b, int64_t n_b, const ft_qcorr_cfg *c, float *out,
                     ft_qcorr_stats *st)
{
    double t0 = now_s();
    memset(st, 0, sizeof *st);
    if (c->mode != FT_QCORR_CALIBRATED && c->mode != FT_QCORR_WEIGHT)
        return ft_err(FT_E_INVALID, "quantization correction mode %d", c->mode);
    if (m->pack_only[0] || !m->layers[0].proj[FT_Q].w)
        return ft_err(FT_E_UNSUPPORTED, "%s: the quantization correction needs the unquantized weights "
                      "(this model folder holds only a pack)", m->path);
    calib k;
    memset(&k, 0, sizeof k);
    int rc = 0;
    double *R = NULL;
    if (c->mode == FT_QCORR_CALIBRATED) {
        int64_t use = 0, tok = 0;
        while (use < n_b && (use == 0 || tok < c->max_tokens))
            tok += b[use++].T;
        if (!use) return ft_err(FT_E_INVALID, "the calibrated correction needs calibration micro-batches");
        st->tokens = tok;
        rc = calib_init(&k, m, b, use, c->threads);
        if (rc) goto done;
    }
    int64_t maxw = 0;
    for (int p = 0; p < FT_N_PROJ; p++) {
        int64_t n = m->layers[0].proj[p].out_n * m->layers[0].proj[p].in_n;
        if (n > maxw) maxw = n;
    }
    R = malloc((size_t)maxw * sizeof *R);
    if (!R) {
        rc = ft_err(-ENOMEM, "out of memory (correction buffers)");
        goto done;
    }
    for (int64_t layer = 0; layer < l->n_layers && !rc; layer++) {
        if (k.be) rc = calib_layer(&k, m, layer);
        ft_layer_weights q;
        if (!rc) rc = base(base_ctx, layer, &q);
        for (int p = 0; p < FT_N_PROJ && !rc; p++) {
            const ft_lora_linear *ll = &l->lin[layer][p];
            if (!ll->A) continue;
            const ft_linear *w = &m->layers[layer].proj[p];
            if (q.proj[p].out_n != w->out_n || q.proj[p].in_n != w->in_n || !q.proj[p].w) {
                rc = ft_err(FT_E_INVALID, "layer %lld %s: quantized base %lld x %lld, model %lld x %lld",
                            (long long)layer, ft_proj_name[p], (long long)q.proj[p].out_n,
                            (long long)q.proj[p].in_n, (long long)w->out_n, (long long)w->in_n);
                break;
            }
            int64_t n = w->out_n * w->in_n;
            for (int64_t i = 0; i < n; i++)
                R[i] = (double)w->w[i] - (double)q.proj[p].w[i];
            double err[2];
            const double *H = k.be ? k.H[k_input_of[p]] : NULL;
            rc = ft_qcorr_linear(R, w->out_n, w->in_n, H, c->damp, l->cfg.r, l->scale,
                                 c->seed + (uint64_t)(layer * FT_N_PROJ + p),
                                 out + (ll->A - l->params), out + (ll->B - l->params), err);
            st->err_before += err[0];
            st->err_after += err[1];
        }
    }
done:
    free(R);
    if (k.be || k.x) calib_free(&k);
    st->seconds = now_s() - t0;
    return rc;
}

int ft_qcorr_load(ft_lora *l, const char *run_dir)
{
    char dir[4200];
    FT_TRY(ft_path_join(dir, sizeof dir, run_dir, FT_QCORR_DIR));
    float *vals = malloc((size_t)l->n_params * sizeof *vals);
    if (!vals) return ft_err(-ENOMEM, "out of memory reading %s", dir);
    int rc = ft_peft_load_values(dir, l, vals);
    if (rc < 0)
        ft_err_prefix(rc, "the run's quantization correction (written at its start) in %s", dir);
    else
        rc = ft_lora_set_fixed(l, vals);
    free(vals);
    return rc;
}
