/* validate.c - ft_train_cfg_validate (see validate.h). */
#include "src/train/validate.h"

#include <math.h>

#include "adapters/qcorr.h"
#include "offload/pack.h"
#include "src/core/err.h"
#include "src/train/schedule.h"

/* x finite and lo <= x <= hi (lo_open / hi_open: the bound itself excluded). */
static int in_range(double x, double lo, int lo_open, double hi, int hi_open)
{
    return isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

/* The optimizer, schedule and LoRA settings. */
static int check_numbers(const ft_train_cfg *c)
{
    const ft_lora_cfg *l = &c->lora;
    if (!in_range(c->adam_eps, 0, 1, INFINITY, 1))
        return ft_err(FT_E_INVALID, "--adam-eps must be a finite number > 0 (AdamW divides by "
                      "sqrt(v) + eps, and v is 0 wherever a gradient is 0)");
    if (!in_range(c->adam_beta1, 0, 0, 1, 1) || !in_range(c->adam_beta2, 0, 0, 1, 1))
        return ft_err(FT_E_INVALID, "--adam-beta1 and --adam-beta2 must be numbers 0 <= X < 1 "
                      "(as torch's AdamW; this run: %g, %g)", c->adam_beta1, c->adam_beta2);
    if (!in_range(c->weight_decay, 0, 0, INFINITY, 1))
        return ft_err(FT_E_INVALID, "--weight-decay must be a finite number >= 0 (as torch's "
                      "AdamW; this run: %g)", c->weight_decay);
    if (!in_range(c->max_grad_norm, 0, 0, INFINITY, 1))
        return ft_err(FT_E_INVALID, "--max-grad-norm must be a finite number >= 0 (0: no "
                      "clipping; this run: %g)", c->max_grad_norm);
    if (!in_range(c->min_lr_ratio, 0, 0, 1, 0))
        return ft_err(FT_E_INVALID, "--min-lr-ratio must be a number 0..1 (this run: %g)",
                      c->min_lr_ratio);
    if (!in_range(c->warmup_ratio, 0, 0, 1, 0))
        return ft_err(FT_E_INVALID, "--warmup-ratio must be a number 0..1 (this run: %g)",
                      c->warmup_ratio);
    if (c->warmup_steps < 0) return ft_err(FT_E_INVALID, "--warmup-steps must be >= 0");
    if (c->schedule < FT_SCHED_COSINE || c->schedule > FT_SCHED_CONSTANT)
        return ft_err(FT_E_INVALID, "unknown schedule %d", c->schedule);
    if (c->max_steps == 0 && !in_range(c->epochs, 0, 1, 1e6, 0))
        return ft_err(FT_E_INVALID, "--epochs must be a number > 0 and <= 1e6 (this run: %g)",
                      c->epochs);
    if (!in_range(l->alpha, 0, 1, INFINITY, 1))
        return ft_err(FT_E_INVALID, "--lora-alpha must be a finite number > 0 (the adapter is "
                      "scaled by alpha / r; this run: %g)", (double)l->alpha);
    if (!in_range(l->dropout, 0, 0, 1, 1))
        return ft_err(FT_E_INVALID, "--lora-dropout must be a probability 0 <= p < 1 (this run: "
                      "%g)", (double)l->dropout);
    if (l->r < 1 || l->r > 4096)
        return ft_err(FT_E_INVALID, "lora rank r=%lld out of range (1..4096)", (long long)l->r);
    if (!in_range(c->data_cfg.eval_fraction, 0, 0, 0.5, 0))
        return ft_err(FT_E_INVALID, "eval fraction %g outside [0, 0.5]", c->data_cfg.eval_fraction);
    if (c->data_cfg.eval_max < 0) return ft_err(FT_E_INVALID, "--eval-max must be >= 0 (0: no cap)");
    if (c->eval_every < 0) return ft_err(FT_E_INVALID, "--eval-every must be >= 0");
    if (c->eval_max_batches < 0) return ft_err(FT_E_INVALID, "eval_max_batches must be >= 0");
    if (c->threads < 0) return ft_err(FT_E_INVALID, "--threads must be >= 1 (0: all cores)");
    if (c->gpu_mem < 0 || c->host_mem < 0)
        return ft_err(FT_E_INVALID, "--gpu-mem and --host-mem must be sizes >= 0 (0: the default)");
    if (c->quant != FT_TRAIN_QUANT_AUTO && c->quant != FT_PACK_QUANT_NF4 &&
        c->quant != FT_PACK_QUANT_BF16)
        return ft_err(FT_E_INVALID, "unknown base quantization %d", c->quant);
    if (c->quant_correction < FT_QCORR_NONE || c->quant_correction > FT_QCORR_WEIGHT)
        return ft_err(FT_E_INVALID, "unknown quantization correction %d", c->quant_correction);
    if (c->quant_correction != FT_QCORR_NONE && c->quant_correction_tokens < 1)
        return ft_err(FT_E_INVALID, "--quant-correction-tokens must be >= 1");
    return 0;
}

int ft_train_cfg_validate(const ft_train_cfg *c)
{
    if (c->batch_size < 1) return ft_err(FT_E_INVALID, "--batch-size must be >= 1");
    if (c->grad_accum < 0) return ft_err(FT_E_INVALID, "--grad-accum must be >= 1 (or auto)");
    if (!(c->lr > 0) || !isfinite(c->lr)) return ft_err(FT_E_INVALID, "--lr must be > 0");
    if (!(c->loraplus_lr_ratio >= 0) || !isfinite(c->loraplus_lr_ratio))
        return ft_err(FT_E_INVALID, "--loraplus-lr-ratio must be > 0 (or left out: off)");
    if (!(c->neftune_noise_alpha >= 0) || !isfinite(c->neftune_noise_alpha))
        return ft_err(FT_E_INVALID, "--neftune-noise-alpha must be >= 0 and finite (0 or left out: off)");
    if (c->method != FT_TRAIN_METHOD_SFT && c->method != FT_TRAIN_METHOD_DPO)
        return ft_err(FT_E_INVALID, "unknown training method %d", c->method);
    if (c->method == FT_TRAIN_METHOD_DPO) {
        FT_TRY(ft_dpo_cfg_check(&c->dpo));
        if (c->data_cfg.train_on_prompt)
            return ft_err(FT_E_INVALID, "--train-on-prompt does not apply to DPO: the pair's log-probabilities are those of its completions");
    }
    if (c->max_steps < 0) return ft_err(FT_E_INVALID, "--max-steps must be >= 0");
    if (c->max_steps == 0 && !(c->epochs > 0)) return ft_err(FT_E_INVALID, "--epochs must be > 0");
    if (c->seq_len < 0 || c->seq_len == 1) return ft_err(FT_E_INVALID, "--seq-len must be >= 2");
    if (c->save_every < 0) return ft_err(FT_E_INVALID, "--save-every must be >= 0");
    if (c->keep < 0) return ft_err(FT_E_INVALID, "--keep must be >= 0");
    if (c->max_bad_steps < 1) return ft_err(FT_E_INVALID, "--max-bad-steps must be >= 1");
    if (c->early_stopping_patience < 0)
        return ft_err(FT_E_INVALID, "--early-stopping-patience must be >= 0 (0: off)");
    if (!(c->early_stopping_threshold >= 0) || !isfinite(c->early_stopping_threshold))
        return ft_err(FT_E_INVALID, "--early-stopping-threshold must be a number >= 0");
    /* both judge the mid-run evals: without them the only candidate is the final adapter */
    if (c->early_stopping_patience > 0 && c->eval_every < 1)
        return ft_err(FT_E_INVALID, "--early-stopping-patience needs --eval-every N: it counts the evaluations made every N steps");
    if (c->save_best && c->eval_every < 1)
        return ft_err(FT_E_INVALID, "--save-best needs --eval-every N: it keeps the adapter of the best evaluation made every N steps (without them the only candidate is the final adapter, written to --out anyway)");
    return check_numbers(c);
}
