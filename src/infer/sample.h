/* sample.h - next-token choice for generation: greedy, or sampling with temperature,
 * top-k, top-p (nucleus) and min-p from a seeded PRNG, after an optional repetition penalty;
 * and the set of tokens that end a reply.
 *
 * Order and semantics follow transformers' generate(): its LogitsProcessorList puts the
 * RepetitionPenaltyLogitsProcessor first (for greedy decoding too), then, only when it
 * samples (do_sample=True), the warpers TemperatureLogitsWarper, TopKLogitsWarper,
 * TopPLogitsWarper and MinPLogitsWarper in that order (GenerationMixin._get_logits_processor,
 * transformers/generation/utils.py; logits_process.py for each):
 *   0. repetition penalty (CTRL, Keskar et al. 2019): every token id the sequence holds so far
 *      (prompt and reply: for a decoder-only model transformers passes the whole input_ids),
 *      each once however often it occurs, gets x < 0 ? x * penalty : x / penalty (float);
 *   1. z = logits / temperature;
 *   2. top-k: keep the k largest z (ties broken by the lower token id);
 *   3. top-p (Holtzman et al. 2020): on softmax(z) over the survivors, sorted by
 *      probability, keep the shortest head whose mass reaches top_p (the token that
 *      crosses top_p is kept; at least one token always is);
 *   4. min-p (Nguyen et al. 2024): of the survivors, keep those whose probability is at
 *      least min_p times the largest one (the most likely token always stays): here
 *      exp(z - max z) >= min_p in double, where transformers compares float32 softmax
 *      values, so a token within rounding of the cut may go either way;
 *   5. draw from softmax(z) renormalised over what is left.
 * temperature == 0 means greedy: the argmax of the (penalised) logits (lowest id on ties),
 * no draw; top-k, top-p and min-p have no effect then, as transformers ignores its warpers
 * without do_sample.
 * (llama.cpp's default sampler chain (common_params_sampling.samplers) runs penalties,
 * top-k, top-p and min-p before the temperature, its repeat penalty over the last 64 tokens
 * only; its CLI samples at temperature 0.8 by default. ftune generate defaults to greedy.)
 * The draws are reproducible: the same seed, logits and settings give the same tokens on
 * every machine (xoshiro256**, src/core/rng.h; probabilities in double).
 */
#ifndef FT_SAMPLE_H
#define FT_SAMPLE_H

#include <stdint.h>

#include "src/core/rng.h"
#include "src/tokenizer/tokenizer.h"
#include "src/formats/config.h"

typedef struct ft_sample_cfg {
    float temperature;   /* >= 0; 0: greedy */
    int64_t top_k;       /* >= 0; 0: no top-k */
    float top_p;         /* (0, 1]; 1: no top-p */
    uint64_t seed;       /* PRNG seed of the draws */
    float repetition_penalty; /* > 0, finite; 1: off (0, a zeroed field: off as well) */
    float min_p;         /* [0, 1]; 0: no min-p */
} ft_sample_cfg;

/* The token ids a sequence holds so far (prompt and reply), for the repetition penalty: one
 * bit per vocabulary id, so each id counts once however often it occurs. Owned by the caller
 * (one per sequence decoded), reset per prompt; adding an id and reading one allocate
 * nothing. */
typedef struct ft_sample_seen {
    uint64_t *bits;      /* ceil(V / 64) words, host */
    int64_t V;
} ft_sample_seen;

/* A sampler's settings and PRNG state are plain values: one sampler may serve several
 * sequences decoded together, each with its own settings and draws, by swapping cfg (one that
 * ft_sample_cfg_check accepts; nothing is derived from it at init: the scratch is sized by V
 * alone) and rng before each call (generate --prompts does, per record). */
typedef struct ft_sampler {
    ft_sample_cfg cfg;
    ft_rng rng;
    int64_t V;           /* logits per call */
    /* The distribution of the last ft_sample_next/ft_sample_dist call: n_cand tokens,
     * cand_id and cand_p their ids and probabilities (sum 1), in the order that
     * ft_sample_dist describes. Host memory, V entries each. */
    int64_t n_cand;
    int32_t *cand_id;
    double *cand_p;
    void *pairs;         /* V (scaled logit, id) pairs: scratch */
} ft_sampler;

/* 0 when cfg is within the ranges below (ft_sampler_init's checks); else FT_E_INVALID, the
 * message naming the setting. */
int ft_sample_cfg_check(const ft_sample_cfg *cfg);

/* Checks cfg and allocates the scratch for V logits. Returns 0, -ENOMEM, FT_E_INVALID
 * (temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], repetition_penalty < 0
 * or not finite, min_p outside [0, 1], V < 1). */
int ft_sampler_init(ft_sampler *s, const ft_sample_cfg *cfg, int64_t V);
void ft_sampler_free(ft_sampler *s); /* NULL-safe; leaves s zeroed */

/* Restarts the draws as ft_sampler_init with cfg.seed = seed would (the PRNG and cfg.seed;
 * the other settings and the scratch stay), for one sampler serving several prompts. */
void ft_sampler_reseed(ft_sampler *s, uint64_t seed);

/* The distribution that the next draw would use, from logits (V) in host memory, into
 * s->n_cand / cand_id / cand_p (greedy: the argmax alone, p = 1). With a top-k or top-p
 * filter the candidates are sorted as described above; with neither, the tokens that min-p
 * keeps (all V without it) are candidates, in id order (no sort needed for the draw).
 * Returns 0 or FT_E_NUMERIC (a NaN logit, or +inf: no distribution). No repetition
 * penalty: ft_sample_dist_seen with seen = NULL. */
int ft_sample_dist(ft_sampler *s, const float *logits);

/* As ft_sample_dist, with the repetition penalty of s->cfg applied to the logits of the ids
 * in seen (NULL: none) first; logits are not modified. FT_E_INVALID for a set of another
 * vocabulary size than s->V. */
int ft_sample_dist_seen(ft_sampler *s, const float *logits, const ft_sample_seen *seen);

/* Chooses the next token from logits (V) in host memory: greedy or one draw (which
 * advances the PRNG). Returns 0 or FT_E_NUMERIC as ft_sample_dist. No repetition penalty:
 * ft_sample_next_seen with seen = NULL. */
int ft_sample_next(ft_sampler *s, const float *logits, int32_t *token);

/* As ft_sample_next, the repetition penalty applied to the ids in seen (NULL: none). The
 * caller adds the chosen token to seen (ft_sample_seen_add) when the sequence goes on. */
int ft_sample_next_seen(ft_sampler *s, const float *logits, const ft_sample_seen *seen,
                        int32_t *token);

/* An empty set for a vocabulary of V ids. Returns 0, -ENOMEM, FT_E_INVALID (V < 1). */
int ft_sample_seen_init(ft_sample_seen *h, int64_t V);
void ft_sample_seen_free(ft_sample_seen *h); /* NULL-safe; leaves h zeroed */
/* Empties the set (for the next prompt). */
void ft_sample_seen_clear(ft_sample_seen *h);
/* Adds ids[0..n); ids outside [0, V) are ignored (they have no logit to penalise). */
void ft_sample_seen_add(ft_sample_seen *h, const int32_t *ids, int64_t n);
/* 1 when id is in the set. */
int ft_sample_seen_has(const ft_sample_seen *h, int64_t id);

/* The argmax of x (n), the lowest index on ties; -1 if n < 1 or every value is NaN. */
int32_t ft_sample_argmax(const float *x, int64_t n);

/* The token ids that end a reply: the model config's eos_token_id list, the tokenizer's
 * EOS, and the end-of-turn token `eot` (a token string such as "<|im_end|>", NULL for
 * none) when the tokenizer has it; duplicates dropped. Writes at most cap ids to ids;
 * returns their count. */
int ft_sample_stop_ids(const ft_model_config *cfg, const ft_tokenizer *tok, const char *eot,
                       int32_t *ids, int cap);

#endif
