/* qcorr.h - a low-rank correction of the quantized base's error (QLoRA), frozen during
 * training, trained LoRA on top.
 *
 * For each adapted linear of layer l with unquantized weight W (out, in) and quantized base Q
 * (what training reads, e.g. NF4 dequantized), find A0 (r, in), B0 (out, r) minimising
 *
 *   calibrated:  || X (W - Q - s B0 A0)^T ||_F    X (tokens, in): the linear's input on
 *                                                 calibration tokens (CLoQ: Deng et al. 2025,
 *                                                 arXiv:2501.18475, closed form of its step 1)
 *   weight:      || W - Q - s B0 A0 ||_F          (LoftQ's step with Q fixed: Li et al. 2023,
 *                                                 arXiv:2310.08659; PEFT's replace_lora_weights_loftq)
 *
 * with s the adapter's scale (alpha / r). Closed form: H = X^T X + damp * mean(diag) * I =
 * L L^T (Cholesky), Z = (W - Q) L, [Z]_r = U S V^T its best rank-r part (randomized SVD,
 * Halko, Martinsson, Tropp 2011, Alg. 4.4: r + 16 columns, 3 power iterations), then
 * B0 = U S^1/2 / s, A0 = S^1/2 V^T L^-1 (the weight mode is L = I).
 *
 * The activations X come from the unquantized model (fp32 host weights) run layer after layer
 * over calibration micro-batches on a CPU backend; their Gram matrices are accumulated in
 * fp64, one layer at a time (the four distinct inputs: q/k/v, o, gate/up, down).
 *
 * Training then keeps B0 A0 frozen in the base (ft_lora.fixed, src/model/llama.c adds
 * s x A0^T B0^T without dropout) and trains a plain PEFT-initialised adapter on top, so the
 * adapter it writes is the change to the unquantized model: it loads on the original bf16
 * weights as any LoRA adapter does (the correction is only needed with the quantized base).
 */
#ifndef FT_QCORR_H
#define FT_QCORR_H

#include <stdint.h>

#include "src/model/lora.h"
#include "src/data/dataset.h"
#include "src/model/model.h"

enum ft_qcorr_mode { FT_QCORR_NONE = 0, FT_QCORR_CALIBRATED, FT_QCORR_WEIGHT };

/* The folder of a run (OUT/quant_correction) that keeps its correction in PEFT format: A0/B0
 * at the adapter's rank and alpha (src/train/correction.h writes it). */
#define FT_QCORR_DIR "quant_correction"

/* Reads run_dir/quant_correction back (ft_peft_load_values' checks: same rank, targets and
 * shapes) and installs it in l (ft_lora_set_fixed); l's own parameters are left as they are.
 * Training calls it on --resume, eval and generation for an adapter trained with the
 * correction. Returns 0, -ENOMEM, or an error naming the folder. */
int ft_qcorr_load(ft_lora *l, const char *run_dir);

/* "none" / "calibrated" / "weight" -> *mode; FT_E_INVALID listing the choices otherwise. */
int ft_qcorr_parse(const char *s, int *mode);
const char *ft_qcorr_name(int mode);

/* Gives layer `layer`'s quantized base as training sees it, fp32, in w (pointers valid until
 * the next call). Returns 0 or an error (passed through). */
typedef int (*ft_qcorr_base_fn)(void *ctx, int64_t layer, ft_layer_weights *w);

typedef struct ft_qcorr_cfg {
    int mode;              /* FT_QCORR_CALIBRATED or FT_QCORR_WEIGHT */
    int64_t max_tokens;    /* calibration tokens (whole micro-batches, at least one) */
    double damp;           /* H += damp * mean(diag H) * I (0.01) */
    int threads;           /* CPU threads of the calibration forward */
    uint64_t seed;         /* randomized SVD test matrices */
} ft_qcorr_cfg;

typedef struct ft_qcorr_stats {
    double err_before;     /* sum over linears of the objective with B0 A0 = 0 */
    double err_after;      /* ... with the correction */
    int64_t tokens;        /* calibration tokens used (0 in the weight mode) */
    double seconds;
} ft_qcorr_stats;

/* Computes the correction of every linear adapted by l (its targets, rank r and scale) into
 * out (l->n_params floats, host, in the layout of l->params: A0 where A is, B0 where B is).
 * m must have host weights (not a pack-only model); base gives Q per layer; b/n_b are the
 * calibration micro-batches (ignored in the weight mode), used in order until max_tokens.
 * Returns 0, FT_E_INVALID (mode, no calibration batch, shapes of base differing from m),
 * FT_E_UNSUPPORTED (pack-only model), -ENOMEM, or the errors of base and the forward. */
int ft_qcorr_compute(const ft_model *m, const ft_lora *l, ft_qcorr_base_fn base, void *base_ctx,
                     const ft_batch *b, int64_t n_b, const ft_qcorr_cfg *c, float *out,
                     ft_qcorr_stats *st);

/* The best rank-r correction of one linear (the math above, exposed for tests): R = W - Q
 * (out, in) row-major fp64, H (in, in) the Gram matrix of its input (NULL: weight mode).
 * Writes A0 (r, in) and B0 (out, r) row-major fp32 and the objective before/after into
 * err[0], err[1] (may be NULL). R is not modified. Returns 0, FT_E_INVALID (r < 1,
 * r > min(out, in)), -ENOMEM, FT_E_NUMERIC (LAPACK failure, naming the routine). */
int ft_qcorr_linear(const double *R, int64_t out_n, int64_t in_n, const double *H, double damp,
                    int64_t r, float scale, uint64_t seed, float *A0, float *B0, double err[2]);

#endif
