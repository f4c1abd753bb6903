/* sweep_space.h - a sweep's search space and its trials.
 *
 * A space is a list of dimensions, each one training option of sweep_keys.h: grid ones
 * (`--grid lr=1e-4,2e-4` or "grid": {"lr": [1e-4, 2e-4]} in a --config file) take each of
 * their values; random ones ("random": {"lr": {"log_uniform": [1e-5, 1e-3]}}) are drawn
 * "trials" times from a seeded RNG. Expansion gives the trials, each a value for every
 * dimension (the overrides of the sweep's fixed training options):
 *
 *   - grid: the cartesian product, the last dimension varying fastest (itertools.product's
 *     order): lr=[a, b] x lora_r=[8, 16] -> (a, 8), (a, 16), (b, 8), (b, 16);
 *   - random: draw d = 0..trials-1, each drawing its dimensions in their order from one
 *     xoshiro256** stream seeded with "seed" (src/core/rng.h);
 *   - both: the grid crossed with the draws, grid point outer: trial g * trials + d is grid
 *     point g with draw d (every grid point meets the same draws).
 *
 * Random reals are rounded to FT_SWEEP_DRAW_DIGITS significant digits, so that a trial's name
 * states its value exactly and `ftune train --lr 3.27e-4` repeats it; a rounding that would
 * leave [lo, hi] is made toward the inside instead. Draws (53-bit uniforms u in [0, 1)):
 *   uniform [lo, hi]:      lo + (hi - lo) u
 *   log_uniform [lo, hi]:  exp(log lo + (log hi - log lo) u), lo > 0 (uniform in log space)
 *   integer options:       uniform: lo + floor((hi - lo + 1) u), each of lo..hi alike;
 *                          log_uniform: floor(exp(log lo + (log(hi + 1) - log lo) u)), so
 *                          k has probability log((k + 1) / k) / log((hi + 1) / lo)
 *   choice [v, ...]:       v[floor(n u)] (repeats in the list weigh a value more)
 *
 * Trial names (the folders DIR/trials/<name>) are the dimensions' tags and values in
 * dimension order, joined by '_': lr2e-4_r16, lr1e-4_r8_cosine, tgtq-v_drop0.05. Only
 * [A-Za-z0-9._+-] occur; a name is cut to FT_SWEEP_NAME_CUT bytes; where two trials get the
 * same name the later ones get "_2", "_3", ... in trial order (no generated name has a
 * component of digits alone, so these cannot meet another name). Names depend on the space
 * and the seed only, so they are the same in every run of the same sweep.
 */
#ifndef FT_SWEEP_SPACE_H
#define FT_SWEEP_SPACE_H

#include <stddef.h>
#include <stdint.h>

#include "src/train/sweep_keys.h"
#include "src/train/trainer.h"

#define FT_SWEEP_MAX_TRIALS 256 /* default --max-trials */
#define FT_SWEEP_DRAW_DIGITS 3  /* significant digits of a random real */
#define FT_SWEEP_NAME_CUT 100   /* a trial name's bytes before a "_N" suffix */
#define FT_SWEEP_NAME_MAX 128   /* bytes of ft_sweep_trial.name, with the NUL */

enum ft_sweep_dist { FT_DIST_GRID = 0, FT_DIST_UNIFORM, FT_DIST_LOG_UNIFORM, FT_DIST_CHOICE };

typedef struct ft_sweep_dim {
    const ft_sweep_key *key;
    int dist;                 /* enum ft_sweep_dist */
    ft_sweep_val *vals;       /* (n_vals): GRID's values, CHOICE's list */
    int64_t n_vals;
    double lo, hi;            /* UNIFORM, LOG_UNIFORM bounds, within the key's domain */
    char from[192];           /* where it was given, for messages: "--grid lr", "FILE: grid.lr" */
} ft_sweep_dim;

typedef struct ft_sweep_space {
    ft_sweep_dim *dims;       /* (n_dims) in the order given */
    int n_dims, cap;
    int64_t n_draws;          /* "trials": random draws (0: no random dimension) */
    uint64_t seed;            /* the draws' seed (0 unless the config gives "seed") */
} ft_sweep_space;

/* An empty space. */
void ft_sweep_space_init(ft_sweep_space *s);
void ft_sweep_space_free(ft_sweep_space *s);

/* Adds one --grid flag's dimension: "KEY=V1,V2,..." (KEY as sweep_keys.h, values as
 * ft_sweep_key_parse; target modules in one value joined by '+'). Returns 0, -ENOMEM or
 * FT_E_INVALID with one line naming the flag and key: "--grid KEY: ..." (an unknown key with
 * the nearest name, a key given twice, no values, an empty value, a value of the wrong type
 * or outside the option's domain, a value given twice). */
int ft_sweep_space_add_grid(ft_sweep_space *s, const char *arg);

/* Adds the dimensions of a --config file: a JSON object {"grid": {KEY: [V, ...], ...},
 * "random": {KEY: {"uniform" | "log_uniform": [lo, hi]} | {"choice": [V, ...]}, ...},
 * "trials": N (with "random"), "seed": S}. Returns 0, -errno / -ENOMEM, or FT_E_INVALID with
 * one line naming the file and the JSON path: "FILE: grid.lr[1]: expected a number, found a
 * string" (bad JSON with its byte offset, an unknown or repeated key, a key given twice,
 * empty grid lists or objects, bounds outside the option's domain or not lo < hi, trials
 * without random or the reverse). */
int ft_sweep_space_load(ft_sweep_space *s, const char *path);

/* ft_sweep_space_load of text[len] already read; name is the file name for messages. */
int ft_sweep_space_parse(ft_sweep_space *s, const char *text, size_t len, const char *name);

typedef struct ft_sweep_trial {
    char name[FT_SWEEP_NAME_MAX];
    ft_sweep_val *vals;       /* (n_keys): this trial's value of each key, in key order */
} ft_sweep_trial;

typedef struct ft_sweep_trials {
    int64_t n;                /* trials */
    int n_keys;
    const ft_sweep_key **keys;/* (n_keys) the space's dimensions' keys, in order */
    ft_sweep_trial *t;        /* (n) in trial order */
    ft_sweep_val *vals;       /* (n, n_keys): the storage of every trial's vals */
} ft_sweep_trials;

/* Expands s into its trials (order and names above). Returns 0, -ENOMEM, or FT_E_INVALID:
 * an empty space ("give --grid KEY=V1,V2,... or --config FILE"), or more than max_trials
 * trials (the count and its factors named, with --max-trials). Deterministic: the same s
 * (seed included) gives the same trials, names and values. Free with ft_sweep_trials_free. */
int ft_sweep_space_expand(const ft_sweep_space *s, int64_t max_trials, ft_sweep_trials *out);
void ft_sweep_trials_free(ft_sweep_trials *t);

/* Writes trial i's values into c (ft_sweep_key_apply), over the sweep's fixed options. */
void ft_sweep_trial_apply(const ft_sweep_trials *t, int64_t i, ft_train_cfg *c);

/* Trial i as `ftune train` flags into buf[n]: "--lr 2e-4 --lora-r 16" (what repeats the trial
 * alone, beside the sweep's fixed flags). Returns the length as snprintf. */
int ft_sweep_trial_flags(const ft_sweep_trials *t, int64_t i, char *buf, size_t n);

#endif
