/* cmd_sweep.c - `ftune sweep`: a hyperparameter sweep of LoRA trainings in shared passes over
 * the base (src/train/sweep_run.h).
 *
 *   ftune sweep --model M --data D --out DIR --grid lr=1e-4,2e-4 --grid lora_r=8,16
 *               [--config sweep.json] [--max-trials N] [--prune none|halving] [--prune-eta N]
 *               [--adapters-per-pass K] [--resume] [--plan] [any ftune train flag]
 *
 * The sweep's own flags are taken out of argv first; what is left is parsed by `ftune train`'s
 * table (cmd_train.c ft_cmd_train_with) as the sweep's fixed part, so --config here is the
 * search space (sweep_space.h), not train's options file.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/dist_env.h"
#include "cli/progress.h"
#include "cli/session.h"
#include "src/core/err.h"
#include "src/train/sweep_prune.h"
#include "src/train/sweep_run.h"
#include "src/train/sweep_space.h"

typedef struct sweep_args {
    ft_sweep_space space;
    int64_t max_trials, eta, k;
    int prune, resume, plan, help, n_grid;
    const char *config;
} sweep_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ftune sweep --model M --data FILE --out DIR (--grid KEY=V1,V2,... | --config FILE) [options] [train options]\n"
            "  trains every trial of the search space as its own LoRA adapter, K adapters per pass over the\n"
            "  base (the model loaded, the data tokenized and the base placed once); DIR/trials/<name>/ each a\n"
            "  run folder as ftune train --out writes it, DIR/sweep.json, DIR/best/, DIR/report.html\n"
            "  %-28s %s\n  %-28s %s\n  %-28s %s\n  %-28s %s\n  %-28s %s\n  %-28s %s\n  %-28s %s\n  %-28s %s\n"
            "the train options below are the fixed part of every trial (their --config is not taken here):\n",
            "--grid KEY=V1,V2,...", "a grid dimension (repeatable): a training option (lr, lora_r, lora_alpha, lora_dropout, lora_target q+v, schedule, warmup_ratio, weight_decay, epochs, max_steps, ...) and its values",
            "--config FILE", "the search space as JSON: {\"grid\": {KEY: [V, ...]}, \"random\": {KEY: {\"log_uniform\" | \"uniform\": [lo, hi]} | {\"choice\": [...]}}, \"trials\": N, \"seed\": S}",
            "--max-trials N", "refuse a space of more trials (default 256)",
            "--prune none|halving", "halving: successive halving (ASHA) at the rungs --eval-every x eta^k; the worst stop, status pruned (default none)",
            "--prune-eta N", "halving's reduction factor (default 2)",
            "--adapters-per-pass K", "trials trained at once in one pass (default: the most the budgets fit, printed; --plan shows it)",
            "--resume", "continue the sweep of DIR/sweep.json: each trial ends as in an uninterrupted sweep",
            "--plan", "print the plan (adapters per pass) and exit");
}

/* The value of flag `name` at argv[*i] ("--name V" or "--name=V"), advancing *i past it; NULL
 * when argv[*i] is not that flag; *missing = 1 when it has no value. */
static const char *flag_val(int argc, char **argv, int *i, const char *name, int *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, "--", 2) || strncmp(a + 2, name, n)) return NULL;
    if (a[2 + n] == '=') return a + 3 + n;
    if (a[2 + n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

/* A positive integer flag value, or -1 after printing the error. */
static int64_t pos_int(const char *flag, const char *v, int64_t lo)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || x < lo) {
        fprintf(stderr, "ftune: --%s: expected an integer >= %lld, got '%s'\n", flag, (long long)lo, v);
        return -1;
    }
    return x;
}

/* One sweep flag at argv[*i] into a: 1 if it was one, 0 if not, -1 after printing an error. */
static int sweep_flag(sweep_args *a, int argc, char **argv, int *i)
{
    int miss = 0;
    const char *v;
    if (!strcmp(argv[*i], "--resume")) return a->resume = 1;
    if (!strcmp(argv[*i], "--plan")) return a->plan = 1;
    if ((v = flag_val(argc, argv, i, "grid", &miss))) {
        a->n_grid++;
        if (ft_sweep_space_add_grid(&a->space, v) < 0) {
            fprintf(stderr, "ftune: %s\n", ft_errmsg());
            return -1;
        }
        return 1;
    }
    if ((v = flag_val(argc, argv, i, "config", &miss))) return a->config = v, 1;
    if ((v = flag_val(argc, argv, i, "max-trials", &miss)))
        return (a->max_trials = pos_int("max-trials", v, 1)) < 0 ? -1 : 1;
    if ((v = flag_val(argc, argv, i, "prune-eta", &miss)))
        return (a->eta = pos_int("prune-eta", v, 2)) < 0 ? -1 : 1;
    if ((v = flag_val(argc, argv, i, "adapters-per-pass", &miss)))
        return (a->k = pos_int("adapters-per-pass", v, 1)) < 0 ? -1 : 1;
    if ((v = flag_val(argc, argv, i, "prune", &miss))) {
        a->prune = ft_prune_mode_parse(v);
        if (a->prune >= 0) return 1;
        fprintf(stderr, "ftune: --prune: expected none or halving, got '%s'\n", v);
        return -1;
    }
    if (miss) {
        fprintf(stderr, "ftune: %s needs a value\n", argv[*i]);
        return -1;
    }
    return 0;
}

typedef struct sweep_job {
    sweep_args *a;
    ft_sweep_trials trials;
} sweep_job;

/* Runs the sweep with the parsed train options as its fixed part; prints its end. */
static int run_sweep(ft_train_cfg *c, ft_progress *prog, void *user)
{
    sweep_job *j = user;
    ft_sweep_cfg sc = {*c, &j->trials, j->a->prune, j->a->eta, j->a->k, j->a->resume};
    sc.base.plan_only = j->a->plan;
    ft_sweep_outcome o;
    sc.base.stop = ft_session_signals_install();
    int rc = ft_sweep_run(&sc, ft_progress_cb, prog, &o);
    int sig = *sc.base.stop;
    ft_session_signals_restore();
    ft_progress_flush(prog);
    if (rc < 0) {
        ft_cli_comm_fail(c->comm, ft_errmsg()); /* several ranks: all end here */
        return 1;
    }
    if (o.stopped) {
        fprintf(stderr, "ftune: sweep stopped by %s; its state is in %s/sweep.json: run the same command with --resume to continue\n",
                sig == SIGTERM ? "SIGTERM" : "SIGINT", c->out);
        return 128 + (sig ? sig : SIGINT);
    }
    if (j->a->plan) return 0;
    if (!prog->quiet)
        fprintf(stderr, "ftune: sweep done: %lld trials (%lld completed, %lld pruned, %lld failed), %lld adapters per pass, %.1f s, %.0f tok/s; best: %s\n",
                (long long)j->trials.n, (long long)o.n_completed, (long long)o.n_pruned,
                (long long)o.n_failed, (long long)o.adapters_per_pass, o.time_s, o.tokens_per_s,
                o.best >= 0 ? j->trials.t[o.best].name : "none");
    return o.n_failed == j->trials.n ? 1 : 0;
}

int ft_cmd_sweep(int argc, char **argv)
{
    sweep_args a = {.max_trials = FT_SWEEP_MAX_TRIALS, .eta = FT_PRUNE_ETA, .prune = FT_PRUNE_NONE};
    ft_sweep_space_init(&a.space);
    char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
    int n_rest = 0, rc = 2;
    sweep_job j = {&a, {0}};
    if (!rest) {
        fprintf(stderr, "ftune: out of memory\n");
        goto out;
    }
    rest[n_rest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        int got = sweep_flag(&a, argc, argv, &i);
        if (got < 0) goto out;
        if (!got) {
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) a.help = 1;
            rest[n_rest++] = argv[i];
        }
    }
    rest[n_rest] = NULL;
    if (a.help) {
        usage(stdout);
        rc = ft_cmd_train_with(n_rest, rest, 0, NULL);
        goto out;
    }
    if (a.config && ft_sweep_space_load(&a.space, a.config) < 0) {
        fprintf(stderr, "ftune: --config %s\n", ft_errmsg());
        rc = 1;
        goto out;
    }
    if (ft_sweep_space_expand(&a.space, a.max_trials, &j.trials) < 0) {
        fprintf(stderr, "ftune: %s\n", ft_errmsg());
        goto out;
    }
    ft_train_runner run = {"sweep", run_sweep, &j, a.plan};
    rc = ft_cmd_train_with(n_rest, rest, 0, &run);
out:
    ft_sweep_trials_free(&j.trials);
    ft_sweep_space_free(&a.space);
    free(rest);
    return rc;
}
