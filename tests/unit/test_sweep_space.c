/* test_sweep_space.c - search spaces (src/train/sweep_space.h): --grid flags and --config
 * files with every error naming the flag or the file and JSON path, the expansion's order and
 * counts, the random draws (reproducible, within bounds, uniform in log space for
 * log_uniform), the grid crossed with the draws, the --max-trials limit and the trial names. */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/model/lora.h"
#include "src/train/schedule.h"
#include "src/train/sweep_space.h"

/* A space from --grid flags (NULL-terminated) and an optional config text. */
static void space_of(ft_sweep_space *s, const char *const *grids, const char *config)
{
    ft_sweep_space_init(s);
    for (int i = 0; grids && grids[i]; i++)
        if (ft_sweep_space_add_grid(s, grids[i])) fail_msg("--grid %s: %s", grids[i], ft_errmsg());
    if (config && ft_sweep_space_parse(s, config, strlen(config), "sweep.json"))
        fail_msg("config: %s", ft_errmsg());
}

static void expand_ok(const ft_sweep_space *s, int64_t max, ft_sweep_trials *t)
{
    if (ft_sweep_space_expand(s, max, t)) fail_msg("expand: %s", ft_errmsg());
}

static void grid_fails(const char *const *ok_first, const char *arg, const char *want)
{
    ft_sweep_space s;
    space_of(&s, ok_first, NULL);
    int n0 = s.n_dims;
    ft_err_clear();
    int rc = ft_sweep_space_add_grid(&s, arg);
    if (rc != FT_E_INVALID || strcmp(ft_errmsg(), want))
        fail_msg("--grid %s: rc %d, message\n  \"%s\", expected\n  \"%s\"", arg, rc, ft_errmsg(), want);
    assert_int_equal(s.n_dims, n0); /* nothing added */
    ft_sweep_space_free(&s);
}

static void config_fails(const char *const *grids, const char *json, const char *want)
{
    ft_sweep_space s;
    space_of(&s, grids, NULL);
    int n0 = s.n_dims;
    ft_err_clear();
    int rc = ft_sweep_space_parse(&s, json, strlen(json), "sweep.json");
    if (rc != FT_E_INVALID || strcmp(ft_errmsg(), want))
        fail_msg("%s: rc %d, message\n  \"%s\", expected\n  \"%s\"", json, rc, ft_errmsg(), want);
    assert_int_equal(s.n_dims, n0); /* the file's dimensions are dropped */
    assert_int_equal(s.n_draws, 0);
    ft_sweep_space_free(&s);
}

static void test_grid_flags(void **state)
{
    ft_sweep_space s;
    space_of(&s, (const char *[]){"lr=1e-4,2e-4,5e-4", "lora-r=8,16", "lora_target=q_proj+v_proj,all-linear",
                                  NULL}, NULL);
    assert_int_equal(s.n_dims, 3);
    assert_string_equal(s.dims[0].key->name, "lr");
    assert_int_equal(s.dims[0].n_vals, 3);
    assert_true(s.dims[0].vals[2].d == 5e-4);
    assert_string_equal(s.dims[1].key->name, "lora_r");
    assert_int_equal(s.dims[1].vals[1].i, 16);
    assert_int_equal(s.dims[2].vals[0].u, (1u << FT_Q) | (1u << FT_V));
    assert_int_equal(s.dims[2].vals[1].u, FT_LORA_ALL_TARGETS);
    assert_string_equal(s.dims[1].from, "--grid lora-r");
    ft_sweep_space_free(&s);

    grid_fails(NULL, "lr", "--grid lr: expected KEY=V1,V2,... (a training option and its values)");
    grid_fails(NULL, "=1e-4", "--grid =1e-4: expected KEY=V1,V2,... (a training option and its values)");
    grid_fails(NULL, "lr=", "--grid lr: no values (expected lr=V1,V2,...)");
    grid_fails(NULL, "lr=1e-4,,2e-4", "--grid lr: value 2 is empty");
    grid_fails(NULL, "lr=1e-4,", "--grid lr: value 2 is empty");
    grid_fails(NULL, "lr=1e-4,abc", "--grid lr: expected a number, got 'abc'");
    grid_fails(NULL, "lr=0,1e-4", "--grid lr: 0 is outside the option's domain (> 0)");
    grid_fails(NULL, "lr=1e-4,0.0001", "--grid lr: value 0.0001 is given twice (values 1 and 2)");
    grid_fails(NULL, "lora_r=8,16.5", "--grid lora_r: expected an integer, got '16.5'");
    grid_fails(NULL, "lora_dropout=0.1,1", "--grid lora_dropout: 1 is outside the option's domain (in [0, 1))");
    grid_fails(NULL, "schedule=cosine,warm", "--grid schedule: expected one of cosine, linear, constant, got 'warm'");
    grid_fails(NULL, "lora_target=q_proj,x", "--grid lora_target: unknown LoRA target module 'x' (expected q_proj, "
               "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or all-linear)");
    grid_fails(NULL, "learning_rate=1e-4,2e-4",
               "--grid learning_rate: not a training option a trial can set; did you mean lr?");
    grid_fails(NULL, "lora_rr=8", "--grid lora_rr: not a training option a trial can set; did you mean lora_r?");
    grid_fails((const char *[]){"lr=1e-4", NULL}, "lr=2e-4", "--grid lr: lr is given twice (also by --grid lr)");
    grid_fails((const char *[]){"lora-r=8", NULL}, "lora_r=16",
               "--grid lora_r: lora_r is given twice (also by --grid lora-r)");
    /* a pass-wide option: not one a trial can set, with the list */
    ft_sweep_space_init(&s);
    assert_int_equal(ft_sweep_space_add_grid(&s, "seq_len=128,256"), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "--grid seq_len: not a training option a trial can set (those are: "));
    ft_sweep_space_free(&s);
}

static const char *EXAMPLE =
    "{\"grid\": {\"lr\": [1e-4, 2e-4], \"lora_r\": [8, 16]},\n"
    " \"random\": {\"lora_dropout\": {\"uniform\": [0, 0.1]}, \"lora_alpha\": {\"log_uniform\": [4, 64]},\n"
    "            \"lora_target\": {\"choice\": [\"q_proj,v_proj\", [\"q_proj\", \"k_proj\"], \"all-linear\"]}},\n"
    " \"trials\": 3, \"seed\": 7}";

static void test_config(void **state)
{
    ft_sweep_space s;
    space_of(&s, NULL, EXAMPLE);
    assert_int_equal(s.n_dims, 5);
    assert_int_equal(s.n_draws, 3);
    assert_int_equal(s.seed, 7);
    assert_int_equal(s.dims[0].dist, FT_DIST_GRID);
    assert_int_equal(s.dims[2].dist, FT_DIST_UNIFORM);
    assert_true(s.dims[2].lo == 0 && s.dims[2].hi == 0.1);
    assert_int_equal(s.dims[3].dist, FT_DIST_LOG_UNIFORM);
    assert_int_equal(s.dims[4].dist, FT_DIST_CHOICE);
    assert_int_equal(s.dims[4].n_vals, 3);
    assert_int_equal(s.dims[4].vals[1].u, (1u << FT_Q) | (1u << FT_K));
    assert_string_equal(s.dims[3].from, "sweep.json: random.lora_alpha");
    ft_sweep_trials t;
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 12); /* 2 x 2 grid points x 3 draws */
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* --grid flags beside a file */
    space_of(&s, (const char *[]){"seed=1,2", NULL}, "{\"grid\": {\"lr\": [1e-4, 2e-4, 3e-4]}, \"seed\": \"5\"}");
    assert_int_equal(s.n_dims, 2);
    assert_int_equal(s.seed, 5);
    ft_sweep_space_free(&s);
    /* from a file */
    char *p = t_write_tmp("sweep.json", EXAMPLE, strlen(EXAMPLE));
    assert_non_null(p);
    ft_sweep_space_init(&s);
    assert_int_equal(ft_sweep_space_load(&s, p), 0);
    assert_int_equal(s.n_dims, 5);
    ft_sweep_space_free(&s);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s.missing", p);
    ft_sweep_space_init(&s);
    assert_int_equal(ft_sweep_space_load(&s, missing), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), missing));
    ft_sweep_space_free(&s);
    free(p);
}

static void test_config_errors(void **state)
{
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4,]}}", "sweep.json: offset 22: not valid JSON");
    config_fails(NULL, "[1]", "sweep.json: expected a JSON object {\"grid\": {...}, \"random\": {...}, ...}, found a list");
    config_fails(NULL, "{}", "sweep.json: no search space: neither \"grid\" nor \"random\"");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4]}, \"trails\": 3}",
                 "sweep.json: unknown key \"trails\" (expected grid, random, trials, seed)");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4], \"lr\": [2e-4]}}",
                 "sweep.json: key \"lr\" appears twice in one object");
    config_fails(NULL, "{\"grid\": [\"lr\"]}",
                 "sweep.json: grid: expected an object {\"KEY\": [V1, V2, ...]}, found a list");
    config_fails(NULL, "{\"grid\": {}}", "sweep.json: grid: the object is empty");
    config_fails(NULL, "{\"grid\": {\"lr\": 1e-4}}", "sweep.json: grid.lr: expected a list of values, found a number");
    config_fails(NULL, "{\"grid\": {\"lr\": []}}", "sweep.json: grid.lr: the list is empty");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4, \"2e-4\"]}}",
                 "sweep.json: grid.lr[1]: expected a number, found a string");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4, -1]}}",
                 "sweep.json: grid.lr[1]: -1 is outside the option's domain (> 0)");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4, 0.0001]}}",
                 "sweep.json: grid.lr[1]: the value of sweep.json: grid.lr[0] again");
    config_fails(NULL, "{\"grid\": {\"lora_r\": [8, 16.5]}}", "sweep.json: grid.lora_r[1]: 16.5 is not an integer");
    config_fails(NULL, "{\"grid\": {\"learning_rate\": [1e-4]}}",
                 "sweep.json: grid.learning_rate: not a training option a trial can set; did you mean lr?");
    config_fails(NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}}",
                 "sweep.json: random: needs \"trials\": N, the number of draws");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4]}, \"trials\": 4}",
                 "sweep.json: trials: counts the draws of \"random\", and there is none");
    config_fails(NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}, \"trials\": 0}",
                 "sweep.json: trials: expected an integer >= 1, found another number");
    config_fails(NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}, \"trials\": \"4\"}",
                 "sweep.json: trials: expected an integer >= 1, found a string");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4]}, \"seed\": -1}",
                 "sweep.json: seed: expected an integer >= 0, found another number");
    config_fails(NULL, "{\"random\": {}, \"trials\": 2}", "sweep.json: random: the object is empty");
    config_fails(NULL, "{\"random\": {\"lr\": [1e-5, 1e-3]}, \"trials\": 2}",
                 "sweep.json: random.lr: expected one of {\"uniform\": [lo, hi]}, {\"log_uniform\": [lo, hi]}, "
                 "{\"choice\": [V, ...]}, found a list");
    config_fails(NULL, "{\"random\": {\"lr\": {\"loguniform\": [1e-5, 1e-3]}}, \"trials\": 2}",
                 "sweep.json: random.lr: expected one of {\"uniform\": [lo, hi]}, {\"log_uniform\": [lo, hi]}, "
                 "{\"choice\": [V, ...]}, found another key");
    config_fails(NULL, "{\"random\": {\"lr\": {\"uniform\": [0, 1], \"choice\": [1]}}, \"trials\": 2}",
                 "sweep.json: random.lr: expected one of {\"uniform\": [lo, hi]}, {\"log_uniform\": [lo, hi]}, "
                 "{\"choice\": [V, ...]}, found an object of several keys");
    config_fails(NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-3, 1e-5]}}, \"trials\": 2}",
                 "sweep.json: random.lr.log_uniform: expected lo < hi, got [1e-3, 1e-5]");
    config_fails(NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-3]}}, \"trials\": 2}",
                 "sweep.json: random.lr.log_uniform: expected [lo, hi] (two numbers), found another list");
    config_fails(NULL, "{\"random\": {\"lr\": {\"uniform\": \"1e-3\"}}, \"trials\": 2}",
                 "sweep.json: random.lr.uniform: expected [lo, hi] (two numbers), found a string");
    config_fails(NULL, "{\"random\": {\"lr\": {\"uniform\": [0, 1e-3]}}, \"trials\": 2}",
                 "sweep.json: random.lr.uniform[0]: 0 is outside the option's domain (> 0)");
    config_fails(NULL, "{\"random\": {\"lora_dropout\": {\"uniform\": [0, 1]}}, \"trials\": 2}",
                 "sweep.json: random.lora_dropout.uniform[1]: 1 is outside the option's domain (in [0, 1))");
    config_fails(NULL, "{\"random\": {\"weight_decay\": {\"log_uniform\": [0, 0.1]}}, \"trials\": 2}",
                 "sweep.json: random.weight_decay.log_uniform: the bounds of a log-uniform draw must be > 0, "
                 "got [0, 0.1]");
    config_fails(NULL, "{\"random\": {\"lora_r\": {\"uniform\": [4.5, 64]}}, \"trials\": 2}",
                 "sweep.json: random.lora_r.uniform[0]: 4.5 is not an integer");
    config_fails(NULL, "{\"random\": {\"use_rslora\": {\"uniform\": [0, 1]}}, \"trials\": 2}",
                 "sweep.json: random.use_rslora.uniform: use_rslora takes true or false, which have no bounds: "
                 "give {\"choice\": [...]}");
    config_fails(NULL, "{\"random\": {\"schedule\": {\"choice\": [\"cosine\", \"step\"]}}, \"trials\": 2}",
                 "sweep.json: random.schedule.choice[1]: expected one of cosine, linear, constant, got 'step'");
    config_fails(NULL, "{\"random\": {\"lr\": {\"choice\": []}}, \"trials\": 2}",
                 "sweep.json: random.lr.choice: the list is empty");
    config_fails(NULL, "{\"grid\": {\"lr\": [1e-4]}, \"random\": {\"lr\": {\"choice\": [2e-4]}}, \"trials\": 2}",
                 "sweep.json: random.lr: lr is given twice (also by sweep.json: grid.lr)");
    config_fails((const char *[]){"lora_r=8,16", NULL}, "{\"grid\": {\"lr\": [1e-4], \"lora-r\": [4]}}",
                 "sweep.json: grid.lora-r: lora_r is given twice (also by --grid lora_r)");
}

/* The grid's cartesian product, the last dimension fastest. */
static void test_grid_order(void **state)
{
    ft_sweep_space s;
    space_of(&s, (const char *[]){"lr=1e-4,2e-4", "lora_r=8,16", NULL}, NULL);
    ft_sweep_trials t;
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 4);
    assert_int_equal(t.n_keys, 2);
    const double lr[4] = {1e-4, 1e-4, 2e-4, 2e-4};
    const int64_t r[4] = {8, 16, 8, 16};
    const char *names[4] = {"lr1e-4_r8", "lr1e-4_r16", "lr2e-4_r8", "lr2e-4_r16"};
    for (int i = 0; i < 4; i++) {
        assert_true(t.t[i].vals[0].d == lr[i]);
        assert_int_equal(t.t[i].vals[1].i, r[i]);
        assert_string_equal(t.t[i].name, names[i]);
    }
    /* the trial's training options, and the flags that repeat it alone */
    ft_train_cfg c;
    ft_train_defaults(&c);
    ft_sweep_trial_apply(&t, 3, &c);
    assert_true(c.lr == 2e-4);
    assert_int_equal(c.lora.r, 16);
    char flags[256];
    ft_sweep_trial_flags(&t, 3, flags, sizeof flags);
    assert_string_equal(flags, "--lr 2e-4 --lora-r 16");
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* 3 x 2 x 2 = 12, in mixed radix order */
    space_of(&s, (const char *[]){"schedule=cosine,linear,constant", "use_rslora=false,true",
                                  "lora_target=q+v,all", NULL}, NULL);
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 12);
    for (int64_t i = 0; i < 12; i++) {
        assert_int_equal(t.t[i].vals[0].i, i / 4);
        assert_int_equal(t.t[i].vals[1].i, (i / 2) % 2);
        assert_int_equal(t.t[i].vals[2].u, i % 2 ? FT_LORA_ALL_TARGETS : (1u << FT_Q) | (1u << FT_V));
    }
    assert_string_equal(t.t[0].name, "cosine_norslora_tgtq-v");
    assert_string_equal(t.t[11].name, "constant_rslora_tgtall");
    ft_sweep_trial_flags(&t, 2, flags, sizeof flags);
    assert_string_equal(flags, "--schedule cosine --use-rslora --lora-target q_proj,v_proj");
    ft_sweep_trial_flags(&t, 0, flags, sizeof flags);
    assert_string_equal(flags, "--schedule cosine --use-rslora=false --lora-target q_proj,v_proj");
    ft_train_defaults(&c);
    ft_sweep_trial_apply(&t, 11, &c);
    assert_int_equal(c.schedule, FT_SCHED_CONSTANT);
    assert_int_equal(c.lora.use_rslora, 1);
    assert_int_equal(c.lora.targets, FT_LORA_ALL_TARGETS);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

/* Significant digits of a decimal text such as "3.27e-4" or "0.0123". */
static int sig_digits(const char *s)
{
    int n = 0, lead = 1;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9') continue;
        if (lead && *s == '0') continue;
        lead = 0;
        n++;
    }
    return n;
}

static void test_random_draws(void **state)
{
    const char *cfg = "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}, \"lora_dropout\": {\"uniform\": "
                      "[0, 0.1]}, \"lora_r\": {\"choice\": [8, 16, 32]}, \"warmup_steps\": {\"uniform\": [2, 5]},"
                      " \"max_steps\": {\"log_uniform\": [1, 8]}}, \"trials\": 4000, \"seed\": 11}";
    ft_sweep_space s;
    space_of(&s, NULL, cfg);
    ft_sweep_trials t, again;
    expand_ok(&s, 4000, &t);
    assert_int_equal(t.n, 4000);
    int low_half = 0, r_count[3] = {0}, wu_count[4] = {0}, steps_count[8] = {0};
    double drop_sum = 0;
    for (int64_t i = 0; i < t.n; i++) {
        double lr = t.t[i].vals[0].d, drop = t.t[i].vals[1].d;
        int64_t r = t.t[i].vals[2].i, wu = t.t[i].vals[3].i, steps = t.t[i].vals[4].i;
        assert_true(lr >= 1e-5 && lr <= 1e-3);
        assert_true(drop >= 0 && drop <= 0.1);
        low_half += lr < 1e-4; /* the middle of [1e-5, 1e-3] in log space */
        drop_sum += drop;
        assert_true(r == 8 || r == 16 || r == 32);
        r_count[r == 8 ? 0 : r == 16 ? 1 : 2]++;
        assert_true(wu >= 2 && wu <= 5);
        wu_count[wu - 2]++;
        assert_true(steps >= 1 && steps <= 8);
        steps_count[steps - 1]++;
        /* rounded to 3 significant digits: the name states the value */
        char txt[64];
        ft_sweep_key_format(t.keys[0], t.t[i].vals[0], txt, sizeof txt);
        assert_true(sig_digits(txt) <= FT_SWEEP_DRAW_DIGITS);
        assert_true(strtod(txt, NULL) == lr);
        assert_non_null(strstr(t.t[i].name, txt));
    }
    /* 4000 draws: a fraction's standard deviation is <= 0.008; these bounds are 5 of them */
    assert_true(fabs(low_half / 4000.0 - 0.5) < 0.04);
    assert_true(fabs(drop_sum / 4000.0 - 0.05) < 0.0025); /* sd of the mean: 0.1 / sqrt(12 * 4000) */
    for (int i = 0; i < 3; i++) assert_true(fabs(r_count[i] / 4000.0 - 1 / 3.0) < 0.04);
    for (int i = 0; i < 4; i++) assert_true(fabs(wu_count[i] / 4000.0 - 0.25) < 0.04);
    /* integer log-uniform on [1, 8]: P(k) = log((k + 1) / k) / log(9) */
    for (int k = 1; k <= 8; k++)
        if (fabs(steps_count[k - 1] / 4000.0 - log((k + 1.0) / k) / log(9.0)) >= 0.04)
            fail_msg("max_steps %d drawn %d times of 4000", k, steps_count[k - 1]);
    /* the same seed, the same trials; names unique */
    expand_ok(&s, 4000, &again);
    for (int64_t i = 0; i < t.n; i++) {
        assert_memory_equal(t.t[i].vals, again.t[i].vals, sizeof(ft_sweep_val) * (size_t)t.n_keys);
        assert_string_equal(t.t[i].name, again.t[i].name);
    }
    ft_sweep_trials_free(&again);
    /* another seed, other draws */
    s.seed = 12;
    expand_ok(&s, 4000, &again);
    int same = 0;
    for (int64_t i = 0; i < 100; i++) same += t.t[i].vals[0].d == again.t[i].vals[0].d;
    assert_true(same < 10);
    ft_sweep_trials_free(&again);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

/* Rounding to 3 digits stays within the bounds: toward the inside where the nearest 3-digit
 * value is outside, the draw itself where no 3-digit value lies inside. */
static void test_random_rounding_bounds(void **state)
{
    ft_sweep_space s;
    ft_sweep_trials t;
    /* [1.2201e-3, 1.2351e-3] holds one 3-digit value, 1.23e-3: every draw is it (those below
     * 1.225e-3 would round to 1.22e-3 and those from 1.235e-3 to 1.24e-3, both outside) */
    space_of(&s, NULL, "{\"random\": {\"lr\": {\"uniform\": [1.2201e-3, 1.2351e-3]}}, \"trials\": 200}");
    expand_ok(&s, 200, &t);
    for (int64_t i = 0; i < t.n; i++) assert_true(t.t[i].vals[0].d == 1.23e-3);
    assert_string_equal(t.t[0].name, "lr0.00123"); /* as long as 1.23e-3: fixed */
    assert_string_equal(t.t[1].name, "lr0.00123_2");
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* [1.2301e-3, 1.2349e-3] holds none: the draws as drawn, all within the bounds */
    space_of(&s, NULL, "{\"random\": {\"lr\": {\"uniform\": [1.2301e-3, 1.2349e-3]}}, \"trials\": 200}");
    expand_ok(&s, 200, &t);
    int distinct = 0;
    for (int64_t i = 0; i < t.n; i++) {
        double x = t.t[i].vals[0].d;
        assert_true(x >= 1.2301e-3 && x <= 1.2349e-3);
        distinct += i && x != t.t[i - 1].vals[0].d;
    }
    assert_true(distinct > 190);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

/* Seed 7's first draws, recomputed here from the formulas of sweep_space.h, and their names
 * as first produced: a change of the RNG, of the draw order or of the rounding changes every
 * random sweep's trials (and the resume of one), so it must be seen. */
static void test_random_fixed_values(void **state)
{
    ft_sweep_space s;
    space_of(&s, NULL, "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}, \"lora_r\": {\"choice\": "
                       "[8, 16]}}, \"trials\": 4, \"seed\": 7}");
    ft_sweep_trials t;
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 4);
    /* computed by hand from rng.h: u = (next >> 11) * 2^-53 of the xoshiro256** stream seeded
     * with 7 by splitmix64; lr = 1e-5 * 100^u rounded to 3 digits, r = [8, 16][floor(2u)] */
    ft_rng r;
    ft_rng_seed(&r, 7);
    for (int i = 0; i < 4; i++) {
        double u1 = (double)(ft_rng_next(&r) >> 11) * 0x1p-53, u2 = (double)(ft_rng_next(&r) >> 11) * 0x1p-53;
        char buf[32];
        snprintf(buf, sizeof buf, "%.2e", exp(log(1e-5) + (log(1e-3) - log(1e-5)) * u1));
        assert_true(t.t[i].vals[0].d == strtod(buf, NULL));
        assert_int_equal(t.t[i].vals[1].i, u2 < 0.5 ? 8 : 16);
    }
    /* and the names this gave when the draws were written (a change here changes the trials
     * of every random sweep, and a resumed one would refuse its sweep.json) */
    const char *names[4] = {"lr2.52e-4_r8", "lr4.78e-4_r16", "lr9.59e-4_r16", "lr1.32e-5_r8"};
    for (int i = 0; i < 4; i++) assert_string_equal(t.t[i].name, names[i]);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

/* Grid x random: trial g * trials + d is grid point g with draw d. */
static void test_grid_crossed_with_draws(void **state)
{
    ft_sweep_space s;
    space_of(&s, (const char *[]){"lora_r=8,16,32", NULL},
             "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}, \"trials\": 5, \"seed\": 3}");
    ft_sweep_trials t;
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 15);
    for (int64_t g = 0; g < 3; g++)
        for (int64_t d = 0; d < 5; d++) {
            const ft_sweep_trial *x = &t.t[g * 5 + d];
            assert_int_equal(x->vals[0].i, 8 << g);
            assert_true(x->vals[1].d == t.t[d].vals[1].d); /* the same draw d for every grid point */
        }
    /* the draws differ from one another */
    for (int d = 1; d < 5; d++) assert_true(t.t[d].vals[1].d != t.t[0].vals[1].d);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

static void test_limits(void **state)
{
    ft_sweep_space s;
    ft_sweep_trials t;
    ft_sweep_space_init(&s);
    assert_int_equal(ft_sweep_space_expand(&s, FT_SWEEP_MAX_TRIALS, &t), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "empty search space: give --grid KEY=V1,V2,... or --config FILE (with "
                                     "\"grid\" or \"random\")");
    ft_sweep_space_free(&s);
    /* 5 x 6 x 10 = 300 > 256 */
    space_of(&s, (const char *[]){"lr=1e-4,2e-4,3e-4,4e-4,5e-4", "lora_r=1,2,3,4,5,6", "seed=0,1,2,3,4,5,6,7,8,9", NULL},
             NULL);
    assert_int_equal(ft_sweep_space_expand(&s, FT_SWEEP_MAX_TRIALS, &t), FT_E_RANGE);
    assert_string_equal(ft_errmsg(), "the search space has 300 trials (lr 5 x lora_r 6 x seed 10), more than "
                                     "--max-trials 256: give fewer values, or a larger --max-trials");
    expand_ok(&s, 300, &t); /* at the limit */
    assert_int_equal(t.n, 300);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* grid x draws */
    space_of(&s, (const char *[]){"lora_r=8,16", NULL},
             "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}, \"trials\": 200}");
    assert_int_equal(ft_sweep_space_expand(&s, FT_SWEEP_MAX_TRIALS, &t), FT_E_RANGE);
    assert_string_equal(ft_errmsg(), "the search space has 400 trials (lora_r 2 x 200 random draws), more than "
                                     "--max-trials 256: give fewer values, or a larger --max-trials");
    ft_sweep_space_free(&s);
    /* a product past int64: 2^53 draws x 1024 grid values */
    char grid[8192];
    int o = snprintf(grid, sizeof grid, "lora_r=");
    for (int i = 1; i <= 1024; i++) o += snprintf(grid + o, sizeof grid - (size_t)o, "%s%d", i > 1 ? "," : "", i);
    space_of(&s, (const char *[]){grid, NULL},
             "{\"random\": {\"lr\": {\"log_uniform\": [1e-5, 1e-3]}}, \"trials\": 9007199254740992}");
    assert_int_equal(ft_sweep_space_expand(&s, FT_SWEEP_MAX_TRIALS, &t), FT_E_RANGE);
    assert_string_equal(ft_errmsg(), "the search space has more than 2^63 trials (lora_r 1024 x 9007199254740992 "
                                     "random draws), more than --max-trials 256: give fewer values, or a larger "
                                     "--max-trials");
    ft_sweep_space_free(&s);
}

static void test_names(void **state)
{
    ft_sweep_space s;
    ft_sweep_trials t;
    /* repeated choices: equal names get _2, _3 in trial order, the first keeps the base */
    space_of(&s, NULL, "{\"random\": {\"lora_r\": {\"choice\": [8, 16]}}, \"trials\": 40, \"seed\": 1}");
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    int seen8 = 0, seen16 = 0;
    for (int64_t i = 0; i < t.n; i++) {
        char want[32];
        int *seen = t.t[i].vals[0].i == 8 ? &seen8 : &seen16;
        ++*seen;
        if (*seen == 1) snprintf(want, sizeof want, "r%lld", (long long)t.t[i].vals[0].i);
        else snprintf(want, sizeof want, "r%lld_%d", (long long)t.t[i].vals[0].i, *seen);
        assert_string_equal(t.t[i].name, want);
    }
    assert_int_equal(seen8 + seen16, 40);
    assert_true(seen8 > 1 && seen16 > 1);
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* many keys: cut at FT_SWEEP_NAME_CUT, still unique, only safe characters */
    space_of(&s, (const char *[]){"lr=1.23456789e-4,1.23456788e-4", "lora_alpha=16.000001,16.000002",
                                  "weight_decay=0.0123456789", "warmup_ratio=0.0312345", "min_lr_ratio=0.0111111111",
                                  "adam_beta1=0.8999999", "adam_beta2=0.99899999", "adam_eps=1.234567e-8",
                                  "max_grad_norm=0.987654321", "neftune_noise_alpha=5.5555555",
                                  "lora_dropout=0.0512345,0.0512346", NULL}, NULL);
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_int_equal(t.n, 8);
    for (int64_t i = 0; i < t.n; i++) {
        size_t len = strlen(t.t[i].name);
        assert_true(len <= FT_SWEEP_NAME_CUT + 3);
        assert_true(len < FT_SWEEP_NAME_MAX);
        for (const char *c = t.t[i].name; *c; c++) assert_non_null(strchr(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-", *c));
        assert_true(t.t[i].name[len - 1] != '_');
        for (int64_t j = 0; j < i; j++) assert_string_not_equal(t.t[i].name, t.t[j].name);
    }
    /* the cut leaves the lora_dropout values out: trials 1..7 differ there only, so the names
     * that meet get suffixes */
    assert_non_null(strstr(t.t[1].name, "_2"));
    const char *head = "lr1.23456789e-4_alpha16.000001_wd0.0123456789_wu0.0312345_minlr0.0111111111_b1";
    assert_memory_equal(t.t[0].name, head, strlen(head));
    assert_int_equal(strlen(t.t[0].name), FT_SWEEP_NAME_CUT);
    assert_string_equal(t.t[1].name + FT_SWEEP_NAME_CUT, "_2");
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
    /* names with the tags of every type */
    space_of(&s, (const char *[]){"lr=5e-4", "lora_dropout=0.05", "lora_target=q+k+v+o", "epochs=2",
                                  "simpo_gamma=-0.5", "seed=18446744073709551615", NULL}, NULL);
    expand_ok(&s, FT_SWEEP_MAX_TRIALS, &t);
    assert_string_equal(t.t[0].name, "lr5e-4_drop0.05_tgtq-k-v-o_ep2_gamma-0.5_seed18446744073709551615");
    ft_sweep_trials_free(&t);
    ft_sweep_space_free(&s);
}

/* Damaged copies of a good --config file and of --grid flags are parsed without a crash
 * (the sanitizer build checks the memory): accepted, or refused with one line naming the
 * file or the flag, the space as before. */
static void test_damaged_input(void **state)
{
    static const char SET[] = " \"{}[],:0123456789.-eEnulltruefasx_", GRID_SET[] = "=,+_-.0123456789eqkvoallinear";
    size_t n = strlen(EXAMPLE);
    char buf[1024];
    ft_rng r;
    ft_rng_seed(&r, 9);
    int refused = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(buf, EXAMPLE, n + 1);
        size_t len = n;
        for (int m = 0; m < 1 + (int)(ft_rng_next(&r) % 3) && len; m++) {
            size_t at = (size_t)(ft_rng_next(&r) % len);
            if (ft_rng_next(&r) % 2) buf[at] = SET[ft_rng_next(&r) % (sizeof SET - 1)];
            else memmove(buf + at, buf + at + 1, len-- - at);
        }
        ft_sweep_space s;
        ft_sweep_space_init(&s);
        ft_err_clear();
        int rc = ft_sweep_space_parse(&s, buf, len, "sweep.json");
        if (rc) {
            refused++;
            assert_int_equal(rc, FT_E_INVALID);
            assert_memory_equal(ft_errmsg(), "sweep.json: ", 12);
            assert_int_equal(s.n_dims, 0);
        } else {
            ft_sweep_trials t;
            rc = ft_sweep_space_expand(&s, 1000, &t);
            if (!rc) ft_sweep_trials_free(&t);
        }
        ft_sweep_space_free(&s);
    }
    assert_true(refused > 1500);
    const char *grid = "lora_target=q_proj+v_proj,all-linear";
    for (int i = 0; i < 2000; i++) {
        snprintf(buf, sizeof buf, "%s", grid);
        size_t len = strlen(buf), at = (size_t)(ft_rng_next(&r) % len);
        buf[at] = GRID_SET[ft_rng_next(&r) % (sizeof GRID_SET - 1)];
        ft_sweep_space s;
        ft_sweep_space_init(&s);
        ft_err_clear();
        if (ft_sweep_space_add_grid(&s, buf)) {
            assert_memory_equal(ft_errmsg(), "--grid ", 7);
            assert_int_equal(s.n_dims, 0);
        }
        ft_sweep_space_free(&s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_flags),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_grid_order),
        cmocka_unit_test(test_random_draws),
        cmocka_unit_test(test_random_rounding_bounds),
        cmocka_unit_test(test_random_fixed_values),
        cmocka_unit_test(test_grid_crossed_with_draws),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_damaged_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
