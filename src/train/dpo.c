/* dpo.c - the DPO objective of one preference pair (see dpo.h). */
#include "src/train/dpo.h"

#include <math.h>
#include <string.h>

#include "src/core/err.h"

/* log sigmoid(x) = -softplus(-x), without overflow for large |x|. */
static double log_sigmoid(double x)
{
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

/* log(1 - e^x) for x < 0 (Maechler 2012: log(-expm1(x)) near 0, log1p(-exp(x)) below -ln 2). */
static double log1mexp(double x)
{
    return x > -M_LN2 ? log(-expm1(x)) : log1p(-exp(x));
}

static double sigmoid(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

int ft_dpo_cfg_check(const ft_dpo_cfg *c)
{
    if (c->loss_type < FT_DPO_SIGMOID || c->loss_type > FT_DPO_SIMPO)
        return ft_err(FT_E_INVALID, "--dpo-loss: unknown loss type %d", c->loss_type);
    if (!(c->beta > 0) || !isfinite(c->beta))
        return ft_err(FT_E_INVALID, "--dpo-beta must be a number > 0 (TRL's default 0.1)");
    if (!(c->label_smoothing >= 0 && c->label_smoothing < 0.5))
        return ft_err(FT_E_INVALID, "--dpo-label-smoothing must be in [0, 0.5)");
    if (c->label_smoothing > 0 && c->loss_type != FT_DPO_ROBUST)
        return ft_err(FT_E_INVALID, "--dpo-label-smoothing %g is used by --dpo-loss robust only (this run's loss: %s)",
                      c->label_smoothing, ft_dpo_loss_name(c->loss_type));
    if (!isfinite(c->simpo_gamma))
        return ft_err(FT_E_INVALID, "--simpo-gamma must be a finite number");
    return 0;
}

int ft_dpo_pair_loss(const ft_dpo_cfg *c, double nll_chosen, int64_t n_chosen,
                     double nll_rejected, int64_t n_rejected, double ref_nll_chosen,
                     double ref_nll_rejected, ft_dpo_pair *out)
{
    FT_TRY(ft_dpo_cfg_check(c));
    if (n_chosen < 1 || n_rejected < 1)
        return ft_err(FT_E_INVALID, "DPO: a completion without a trained token (%lld chosen, %lld rejected)",
                      (long long)n_chosen, (long long)n_rejected);
    double b = c->beta;
    /* logp = -nll: logratio = ref_nll - nll */
    double lc = ref_nll_chosen - nll_chosen, lr = ref_nll_rejected - nll_rejected;
    double delta = lc - lr;
    double dd; /* d loss / d delta (sigmoid, hinge, robust) */
    out->reward_chosen = b * lc;
    out->reward_rejected = b * lr;
    switch (c->loss_type) {
    case FT_DPO_SIGMOID:
        out->loss = -log_sigmoid(b * delta);
        dd = -b * sigmoid(-b * delta);
        break;
    case FT_DPO_HINGE:
        out->loss = 1.0 - b * delta > 0 ? 1.0 - b * delta : 0.0;
        dd = 1.0 - b * delta > 0 ? -b : 0.0;
        break;
    case FT_DPO_ROBUST: {
        double e = c->label_smoothing;
        out->loss = (-(1 - e) * log_sigmoid(b * delta) + e * log_sigmoid(-b * delta)) / (1 - 2 * e);
        dd = -b * ((1 - e) * sigmoid(-b * delta) + e * sigmoid(b * delta)) / (1 - 2 * e);
        break;
    }
    case FT_DPO_ORPO: {
        double a = -nll_chosen / (double)n_chosen, bb = -nll_rejected / (double)n_rejected;
        double lo = (a - bb) - (log1mexp(a) - log1mexp(bb));
        out->loss = -a - b * log_sigmoid(lo);
        out->reward_chosen = b * a;
        out->reward_rejected = b * bb;
        /* d lo / d a = 1 / (1 - e^a), d lo / d b = -1 / (1 - e^b); d a / d nll_c = -1 / n_c */
        double dlo = -b * sigmoid(-lo);
        double da = -1.0 + dlo / -expm1(a), db = -dlo / -expm1(bb);
        out->d_nll_chosen = -da / (double)n_chosen;
        out->d_nll_rejected = -db / (double)n_rejected;
        return 0;
    }
    case FT_DPO_SIMPO: {
        double a = -nll_chosen / (double)n_chosen, bb = -nll_rejected / (double)n_rejected;
        double z = b * (a - bb) - c->simpo_gamma;
        out->loss = -log_sigmoid(z);
        out->reward_chosen = b * a;
        out->reward_rejected = b * bb;
        double dz = -sigmoid(-z); /* d loss / d z; d z / d a = beta = -d z / d b */
        out->d_nll_chosen = -b * dz / (double)n_chosen;
        out->d_nll_rejected = b * dz / (double)n_rejected;
        return 0;
    }
    case FT_DPO_IPO: {
        double d = lc / (double)n_chosen - lr / (double)n_rejected;
        double g = d - 1.0 / (2.0 * b);
        out->loss = g * g;
        /* d d / d nll_c = -1 / n_c, d d / d nll_r = +1 / n_r */
        out->d_nll_chosen = -2.0 * g / (double)n_chosen;
        out->d_nll_rejected = 2.0 * g / (double)n_rejected;
        return 0;
    }
    default: /* ft_dpo_cfg_check refused it */
        return ft_err(FT_E_INVALID, "DPO: unknown loss type %d", c->loss_type);
    }
    /* d delta / d nll_c = -1, d delta / d nll_r = +1 */
    out->d_nll_chosen = -dd;
    out->d_nll_rejected = dd;
    return 0;
}

void ft_dpo_stats_add(ft_dpo_stats *s, const ft_dpo_pair *p, double nll_chosen, int64_t n_chosen,
                      double nll_rejected, int64_t n_rejected)
{
    s->pairs++;
    s->tokens += n_chosen + n_rejected;
    s->loss += p->loss;
    s->reward_chosen += p->reward_chosen;
    s->reward_rejected += p->reward_rejected;
    s->accurate += p->reward_chosen > p->reward_rejected;
    s->margin += p->reward_chosen - p->reward_rejected;
    s->logp_chosen -= nll_chosen;
    s->logp_rejected -= nll_rejected;
}

static const char *const names[] = {"sigmoid", "hinge", "ipo", "robust", "orpo", "simpo"};

int ft_dpo_loss_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

const char *ft_dpo_loss_name(int t)
{
    return t >= 0 && t < (int)(sizeof names / sizeof *names) ? names[t] : "?";
}
