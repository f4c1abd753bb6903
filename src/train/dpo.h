/* dpo.h - the DPO objective of one preference pair and its gradient (Rafailov et al. 2023,
 * "Direct Preference Optimization", arXiv 2305.18290), with the loss types of TRL 1.16's
 * DPOTrainer (trainer/dpo_trainer.py, _compute_loss; f_divergence_type "reverse_kl"):
 *
 *   logratio_c = logp(chosen) - ref_logp(chosen), logratio_r likewise, delta = lc - lr
 *   sigmoid (DPO):   -log sigmoid(beta * delta)
 *   hinge (SLiC):    relu(1 - beta * delta)
 *   ipo (Azar et al. 2023, arXiv 2310.12036): (d - 1 / (2 beta))^2 with d the difference of
 *                    the log-ratios averaged per completion token (TRL's normalization)
 *   robust (Chowdhury et al. 2024, arXiv 2403.00409, label_smoothing e):
 *                    (-(1-e) log sigmoid(beta delta) + e log sigmoid(-beta delta)) / (1 - 2e)
 *
 * and two reference-free losses of the same pairs, as LLaMA-Factory's DPO stage offers them
 * (pref_loss orpo / simpo, src/llamafactory/train/dpo/trainer.py), on the log-probabilities
 * averaged per completion token, a = logp(chosen) / n_c and b = logp(rejected) / n_r:
 *   orpo (Hong et al. 2024, arXiv 2403.07691): -a - beta * log sigmoid(log_odds),
 *                    log_odds = (a - b) - (log(1 - e^a) - log(1 - e^b)): the chosen answer's
 *                    NLL plus beta times the odds-ratio loss (TRL's ORPOTrainer averages the
 *                    NLL over the batch's chosen tokens instead of per pair)
 *   simpo (Meng et al. 2024, arXiv 2405.14734): -log sigmoid(beta (a - b) - gamma)
 * Their rewards are beta * a and beta * b (LLaMA-Factory's, TRL's ORPO); they need no
 * reference model (the ref_nll arguments are ignored).
 *
 * logp(x) is the sum of the log-probabilities of x's completion tokens (the trained tokens
 * of its example). The rewards TRL logs are beta * logratio (no per-token averaging, for
 * every loss type); a pair counts as accurate when reward_c > reward_r.
 * The trainer takes the mean over all the pairs of an optimizer step (every micro-batch of its
 * gradient accumulation). TRL takes the mean per micro-batch, then divides by the
 * accumulation steps; the two differ when micro-batches hold different numbers of pairs,
 * which packing by tokens makes the usual case (each pair weighs the same here).
 */
#ifndef FT_DPO_H
#define FT_DPO_H

#include <stdint.h>

enum ft_dpo_loss { FT_DPO_SIGMOID = 0, FT_DPO_HINGE, FT_DPO_IPO, FT_DPO_ROBUST, FT_DPO_ORPO,
                   FT_DPO_SIMPO };

/* 1 for the losses that use no reference model (orpo, simpo). */
static inline int ft_dpo_reference_free(int loss_type)
{
    return loss_type == FT_DPO_ORPO || loss_type == FT_DPO_SIMPO;
}

typedef struct ft_dpo_cfg {
    int loss_type;              /* enum ft_dpo_loss */
    double beta;                /* > 0; TRL's default 0.1 */
    double label_smoothing;     /* robust only: 0 <= e < 0.5 */
    double simpo_gamma;         /* simpo only: the target reward margin (LLaMA-Factory's
                                 * default 0.5) */
} ft_dpo_cfg;

typedef struct ft_dpo_pair {
    double loss;                /* the pair's loss */
    double d_nll_chosen;        /* d loss / d nll(chosen), nll = -logp (nats) */
    double d_nll_rejected;      /* d loss / d nll(rejected) */
    double reward_chosen;       /* beta * (logp(chosen) - ref_logp(chosen)); orpo, simpo:
                                 * beta * logp(chosen) / n_chosen */
    double reward_rejected;
} ft_dpo_pair;

/* Checks a configuration: a known loss type, a finite beta > 0, a label smoothing in
 * [0, 0.5) and only with robust, a finite simpo gamma. Returns 0 or FT_E_INVALID with a
 * message naming the flag (--dpo-beta, --dpo-label-smoothing, --simpo-gamma, --dpo-loss). */
int ft_dpo_cfg_check(const ft_dpo_cfg *c);

/* The loss of one pair and its derivatives. nll_* / ref_nll_*: summed negative
 * log-likelihoods (nats) of the completion under the policy and the reference; n_*: their
 * token counts (>= 1; used by ipo, orpo, simpo). Computed in double with a stable log-sigmoid
 * (and log(1 - e^x) for orpo, NaN when a completion's mean log-probability is not below 0).
 * Returns 0, or FT_E_INVALID for a configuration ft_dpo_cfg_check refuses or a token
 * count < 1. */
int ft_dpo_pair_loss(const ft_dpo_cfg *c, double nll_chosen, int64_t n_chosen,
                     double nll_rejected, int64_t n_rejected, double ref_nll_chosen,
                     double ref_nll_rejected, ft_dpo_pair *out);

/* Sums over pairs of what TRL logs (divide by pairs for its means): the loss, the rewards
 * of both sides, the accurate pairs (reward_chosen > reward_rejected), the margins
 * (reward_chosen - reward_rejected) and the summed log-probabilities of both completions;
 * tokens counts the completion tokens of both sides. */
typedef struct ft_dpo_stats {
    int64_t pairs, tokens;
    double loss, reward_chosen, reward_rejected, accurate, margin, logp_chosen, logp_rejected;
} ft_dpo_stats;

/* Adds pair p (with its policy nlls and token counts) to s. */
void ft_dpo_stats_add(ft_dpo_stats *s, const ft_dpo_pair *p, double nll_chosen, int64_t n_chosen,
                      double nll_rejected, int64_t n_rejected);

/* "sigmoid" | "hinge" | "ipo" | "robust" | "orpo" | "simpo" -> enum, or -1; and back. */
int ft_dpo_loss_parse(const char *s);
const char *ft_dpo_loss_name(int t);

#endif
