/* sweep_state.h - DIR/sweep.json: a sweep's trials, their status and results, and the
 * pruning state, rewritten atomically as trials progress and read back by --resume.
 *
 *   {"version": 1,
 *    "prune": {"method": "halving" | "none", "eta": 2, "adapters_per_pass": K,
 *              "rung_steps": [10, 20, ...]},
 *    "trials": [{"name": "lr2e-4_r16", "params": {"lr": 2e-4, "lora_r": 16},
 *                "status": "pending" | "running" | "pruned" | "completed" | "failed",
 *                "best_eval_loss": 1.23 | null, "best_eval_step": 40, "steps": 40,
 *                "tokens": 81920, "rung_losses": [1.5, 1.3 | null, ...],
 *                "error": "..." (failed trials)}, ...],
 *    "best": "lr2e-4_r16" | null}
 *
 * trials are in trial order (sweep_space.h), params hold every dimension's key ('_' form)
 * with the value as ft_sweep_key_to_json writes it, rung_losses the eval loss of each rung
 * reported (null for a non-finite one), best the completed trial of the lowest
 * best_eval_loss (ft_sweep_best). Numbers are written in the shortest text that reads back
 * to the same double, so a resumed sweep ranks the same losses. The JSON schema is
 * tests/ref/sweep_schema.json.
 */
#ifndef FT_SWEEP_STATE_H
#define FT_SWEEP_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "src/train/sweep_prune.h"
#include "src/train/sweep_space.h"

#define FT_SWEEP_JSON_VERSION 1

/* One trial's results so far (what its summary.json says at its end). */
typedef struct ft_sweep_result {
    double best_eval_loss;    /* nats per token; NAN while none */
    int64_t best_eval_step;   /* 0 while none */
    int64_t steps;            /* optimizer steps done */
    int64_t tokens;           /* token positions trained */
    char error[512];          /* a failed trial's message, "" otherwise */
} ft_sweep_result;

/* Sets r[0..n) to "nothing yet" (NAN loss, zeros, no error). */
void ft_sweep_results_init(ft_sweep_result *r, int64_t n);

/* The completed trial of the lowest finite best_eval_loss (ties: the lower index), or -1
 * when none has one (pruned trials are no candidates: they stopped before the full run). */
int64_t ft_sweep_best(const ft_sweep_sched *s, const ft_sweep_result *r);

/* The sweep.json text of trials t (names, params), scheduler s (statuses, rung losses, the
 * prune settings) and results r (t->n each, t->n == s->n_trials) into *text (malloc'ed, NUL
 * terminated, caller frees). Returns 0, -ENOMEM or FT_E_INVALID (t and s disagree). */
int ft_sweep_json_format(const ft_sweep_trials *t, const ft_sweep_sched *s, const ft_sweep_result *r, char **text);

/* Writes that text to path atomically (ft_write_file_atomic: the old file or the new one,
 * never a part). Returns 0 or an error naming the path. */
int ft_sweep_json_write(const char *path, const ft_sweep_trials *t, const ft_sweep_sched *s,
                        const ft_sweep_result *r);

/* Reads a sweep.json written for this sweep back into s and r (--resume): s initialised by
 * ft_sweep_sched_init with this sweep's settings and t->n trials, r of t->n results. The file
 * must describe the same sweep: the same prune settings, the same trials in the same order
 * (names and params; else the search space changed) and a consistent state (rung losses no
 * more than the rungs, none for a pending trial, no pruned trial without pruning, no more
 * running trials than adapters per pass, best as ft_sweep_best). Returns 0; -errno (cannot
 * read); FT_E_INVALID with one line naming the file and the key: "FILE: trials[2].status:
 * expected one of pending, running, pruned, completed, failed, found \"done\"", "FILE:
 * trials[1].params.lr: 5e-4, and this sweep's trial 1 (lr2e-4_r16) has 2e-4: ..."; on
 * error s and r are unchanged. */
int ft_sweep_json_read(const char *path, const ft_sweep_trials *t, ft_sweep_sched *s, ft_sweep_result *r);

/* ft_sweep_json_read of text[len]; name is the file name for messages. */
int ft_sweep_json_parse(const char *text, size_t len, const char *name, const ft_sweep_trials *t,
                        ft_sweep_sched *s, ft_sweep_result *r);

#endif
