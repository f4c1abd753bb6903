/* test_sweep_prune.c - the sweep's scheduler (src/train/sweep_prune.h): slots and their
 * refill, ASHA's stopping rule on hand-made loss tables (the expected decisions worked out in
 * the comments), ties and non-finite losses, --prune none, misuse refused without a change,
 * and the rule against an independent model of it (sorting each rung's record) on random
 * tables and random groupings. */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/core/rng.h"
#include "src/train/sweep_prune.h"

static void init_ok(ft_sweep_sched *s, int64_t n, const int64_t *rungs, int64_t n_rungs, int mode, int64_t eta,
                    int64_t slots)
{
    if (ft_sweep_sched_init(s, n, rungs, n_rungs, mode, eta, slots)) fail_msg("init: %s", ft_errmsg());
}

static void report_ok(ft_sweep_sched *s, int64_t rung, int64_t n, const int64_t *t, const double *l, int *keep)
{
    if (ft_sweep_sched_report(s, rung, n, t, l, keep)) fail_msg("report: %s", ft_errmsg());
}

static void test_names(void **state)
{
    for (int i = 0; i < FT_TRIAL_N_STATUS; i++) assert_int_equal(ft_trial_status_parse(ft_trial_status_name(i)), i);
    assert_string_equal(ft_trial_status_name(FT_TRIAL_PRUNED), "pruned");
    assert_int_equal(ft_trial_status_parse("done"), -1);
    assert_int_equal(ft_prune_mode_parse("halving"), FT_PRUNE_HALVING);
    assert_int_equal(ft_prune_mode_parse("none"), FT_PRUNE_NONE);
    assert_int_equal(ft_prune_mode_parse("asha"), -1);
    assert_string_equal(ft_prune_mode_name(FT_PRUNE_HALVING), "halving");
}

static void test_rung_steps(void **state)
{
    int64_t r[16];
    assert_int_equal(ft_sweep_rung_steps(10, 2, 100, r, 16), 4);
    assert_int_equal(r[0], 10);
    assert_int_equal(r[1], 20);
    assert_int_equal(r[2], 40);
    assert_int_equal(r[3], 80);
    assert_int_equal(ft_sweep_rung_steps(10, 2, 80, r, 16), 3); /* 80 is the end, no rung */
    assert_int_equal(ft_sweep_rung_steps(5, 3, 100, r, 16), 3);  /* 5, 15, 45 */
    assert_int_equal(r[2], 45);
    assert_int_equal(ft_sweep_rung_steps(10, 2, 100, r, 2), 2);
    assert_int_equal(ft_sweep_rung_steps(100, 2, 100, r, 16), 0);
    assert_int_equal(ft_sweep_rung_steps(0, 2, 100, r, 16), 0);
    assert_int_equal(ft_sweep_rung_steps(INT64_MAX / 2, 4, INT64_MAX, r, 16), 1); /* no overflow */
}

static void test_init_errors(void **state)
{
    ft_sweep_sched s;
    const int64_t rungs[2] = {10, 20}, bad[2] = {20, 20};
    assert_int_equal(ft_sweep_sched_init(&s, 4, rungs, 2, 7, 2, 1), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: unknown pruning mode 7 (none, halving)");
    assert_int_equal(ft_sweep_sched_init(&s, 4, rungs, 2, FT_PRUNE_HALVING, 1, 1), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: the reduction factor eta must be >= 2, got 1");
    assert_int_equal(ft_sweep_sched_init(&s, 4, rungs, 2, FT_PRUNE_HALVING, 2, 0), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: adapters per pass must be >= 1, got 0");
    assert_int_equal(ft_sweep_sched_init(&s, 4, bad, 2, FT_PRUNE_HALVING, 2, 1), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: rung 1 at step 20: the rungs' steps must increase from 1");
    assert_int_equal(ft_sweep_sched_init(&s, -1, rungs, 2, FT_PRUNE_HALVING, 2, 1), FT_E_INVALID);
    init_ok(&s, 0, NULL, 0, FT_PRUNE_NONE, 2, 1); /* an empty sweep is done at once */
    assert_true(ft_sweep_sched_done(&s));
    int64_t t;
    assert_int_equal(ft_sweep_sched_start(&s, &t), 0);
    ft_sweep_sched_free(&s);
}

/* Slots: the pending trial of lowest index takes a free slot, and a pruned, completed or
 * failed trial frees its own. */
static void test_slots(void **state)
{
    ft_sweep_sched s;
    const int64_t rungs[1] = {5};
    init_ok(&s, 5, rungs, 1, FT_PRUNE_HALVING, 2, 2);
    int64_t t;
    assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    assert_int_equal(t, 0);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    assert_int_equal(t, 1);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 0); /* both slots taken */
    assert_int_equal(ft_sweep_sched_count(&s, FT_TRIAL_RUNNING), 2);
    assert_int_equal(ft_sweep_sched_count(&s, FT_TRIAL_PENDING), 3);
    assert_int_equal(ft_sweep_sched_end(&s, 1, FT_TRIAL_FAILED), 0);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    assert_int_equal(t, 2);
    assert_int_equal(ft_sweep_sched_end(&s, 0, FT_TRIAL_COMPLETED), 0);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    assert_int_equal(t, 3);
    /* t0 and t1 ended before the rung: its record is t3 .6 and t2 .3, 2 >= eta, floor(2 / 2)
     * = 1 continues: t2; t3 is pruned and frees its slot */
    int keep[2];
    report_ok(&s, 0, 2, (int64_t[]){3, 2}, (double[]){0.6, 0.3}, keep);
    assert_int_equal(keep[0], 0);
    assert_int_equal(keep[1], 1);
    assert_int_equal(s.status[3], FT_TRIAL_PRUNED);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    assert_int_equal(t, 4);
    assert_int_equal(ft_sweep_sched_start(&s, &t), 0); /* none pending */
    assert_false(ft_sweep_sched_done(&s));
    assert_int_equal(ft_sweep_sched_end(&s, 2, FT_TRIAL_COMPLETED), 0);
    assert_int_equal(ft_sweep_sched_end(&s, 4, FT_TRIAL_COMPLETED), 0);
    assert_true(ft_sweep_sched_done(&s));
    assert_int_equal(ft_sweep_sched_count(&s, FT_TRIAL_COMPLETED), 3);
    ft_sweep_sched_free(&s);
}

/* Every trial in one pass: synchronous successive halving.
 * 8 trials, eta 2, rungs at steps 1 and 2.
 * rung 0: losses t0 .9, t1 .5, t2 .7, t3 .3, t4 .8, t5 .6, t6 .4, t7 .2; 8 reached, floor(8/2)
 *         = 4 continue: t7 .2, t3 .3, t6 .4, t1 .5; t0, t2, t4, t5 pruned.
 * rung 1: t1 .45, t3 .25, t6 .35, t7 .30; 4 reached, 2 continue: t3 .25, t7 .30; t1, t6
 *         pruned. t3 and t7 complete. */
static void test_synchronous_halving(void **state)
{
    ft_sweep_sched s;
    const int64_t rungs[2] = {1, 2};
    init_ok(&s, 8, rungs, 2, FT_PRUNE_HALVING, 2, 8);
    int64_t t, all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < 8; i++) assert_int_equal(ft_sweep_sched_start(&s, &t), 1);
    int keep[8];
    report_ok(&s, 0, 8, all, (double[]){.9, .5, .7, .3, .8, .6, .4, .2}, keep);
    const int want0[8] = {0, 1, 0, 1, 0, 0, 1, 1};
    assert_memory_equal(keep, want0, sizeof want0);
    report_ok(&s, 1, 4, (int64_t[]){1, 3, 6, 7}, (double[]){.45, .25, .35, .30}, keep);
    const int want1[4] = {0, 1, 0, 1};
    assert_memory_equal(keep, want1, sizeof want1);
    assert_int_equal(ft_sweep_sched_end(&s, 3, FT_TRIAL_COMPLETED), 0);
    assert_int_equal(ft_sweep_sched_end(&s, 7, FT_TRIAL_COMPLETED), 0);
    assert_true(ft_sweep_sched_done(&s));
    const int final[8] = {FT_TRIAL_PRUNED, FT_TRIAL_PRUNED, FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED,
                          FT_TRIAL_PRUNED, FT_TRIAL_PRUNED, FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED};
    assert_memory_equal(s.status, final, sizeof final);
    assert_int_equal(s.n_reported[0], 1);
    assert_int_equal(s.n_reported[3], 2);
    assert_true(s.loss[3 * 2 + 1] == .25);
    assert_true(isnan(s.loss[0 * 2 + 1])); /* never reached */
    ft_sweep_sched_free(&s);
}

/* Runs a whole sweep as the executor would: the slots are filled before step 1; at each
 * global step every running trial does one step; a trial whose own step count reaches
 * rung_step[k] reports rung k with loss[t * n_rungs + k] (those reaching one rung at one
 * global step form one group, lower rungs first); a trial at `total` steps completes; then
 * free slots are refilled (a trial started after global step g does its first step at
 * g + 1). started[t]: the global step after which t started. */
static void simulate(ft_sweep_sched *s, int64_t total, const double *loss, int64_t *started)
{
    int64_t n = s->n_trials, done_steps[64] = {0}, t;
    assert_true(n <= 64);
    while (ft_sweep_sched_start(s, &t)) started[t] = 0;
    for (int64_t g = 1; !ft_sweep_sched_done(s); g++) {
        assert_true(g < 10000);
        for (int64_t i = 0; i < n; i++) done_steps[i] += s->status[i] == FT_TRIAL_RUNNING;
        for (int64_t k = 0; k < s->n_rungs; k++) {
            int64_t group[64], m = 0;
            double l[64];
            for (int64_t i = 0; i < n; i++)
                if (s->status[i] == FT_TRIAL_RUNNING && done_steps[i] == s->rung_step[k] && s->n_reported[i] == k) {
                    group[m] = i;
                    l[m++] = loss[i * s->n_rungs + k];
                }
            if (m) report_ok(s, k, m, group, l, NULL);
        }
        for (int64_t i = 0; i < n; i++)
            if (s->status[i] == FT_TRIAL_RUNNING && done_steps[i] == total)
                assert_int_equal(ft_sweep_sched_end(s, i, FT_TRIAL_COMPLETED), 0);
        while (ft_sweep_sched_start(s, &t)) started[t] = g;
    }
}

/* Asynchronous: 5 trials, 2 slots, eta 2, rungs at steps 1 and 2, 3 steps each.
 *        rung 0  rung 1
 *   t0   .50     .40
 *   t1   .60     .45
 *   t2   .55     .35
 *   t3   .40     .30
 *   t4   .70     .20
 * after step 1: t0, t1 reach rung 0 (record .50 .60: 2 >= eta, 1 continues): t0 on, t1
 *   pruned; t2 starts.
 * step 2: t2 reaches rung 0 (record .50 .60 .55: 1 continues, t0's .50 is before t2's .55):
 *   t2 pruned; t0 reaches rung 1 (record .40 alone, fewer than eta): on. t3 starts.
 * step 3: t0 completes; t3 reaches rung 0 with .40 (record of 4, 2 continue, .40 the best):
 *   on. t4 starts.
 * step 4: t3 reaches rung 1 with .30 (record .40 .30, 1 continues: t3): on; t4 reaches rung
 *   0 with .70 (record of 5, 2 continue, .70 the worst): pruned, though its rung-1 loss .20
 *   would have been the best (ASHA's bet on early losses).
 * step 5: t3 completes. Completed t0, t3; pruned t1, t2, t4. */
static void test_asynchronous_refill(void **state)
{
    ft_sweep_sched s;
    const int64_t rungs[2] = {1, 2};
    const double loss[5 * 2] = {.50, .40, .60, .45, .55, .35, .40, .30, .70, .20};
    init_ok(&s, 5, rungs, 2, FT_PRUNE_HALVING, 2, 2);
    int64_t started[5];
    simulate(&s, 3, loss, started);
    const int final[5] = {FT_TRIAL_COMPLETED, FT_TRIAL_PRUNED, FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED,
                          FT_TRIAL_PRUNED};
    assert_memory_equal(s.status, final, sizeof final);
    const int64_t want_start[5] = {0, 0, 1, 2, 3};
    assert_memory_equal(started, want_start, sizeof want_start);
    const int64_t reported[5] = {2, 1, 1, 2, 1};
    assert_memory_equal(s.n_reported, reported, sizeof reported);
    ft_sweep_sched_free(&s);
    /* --prune none: every trial runs to its end, two at a time, the losses recorded */
    init_ok(&s, 5, rungs, 2, FT_PRUNE_NONE, 2, 2);
    simulate(&s, 3, loss, started);
    assert_int_equal(ft_sweep_sched_count(&s, FT_TRIAL_COMPLETED), 5);
    const int64_t none_start[5] = {0, 0, 3, 3, 6};
    assert_memory_equal(started, none_start, sizeof none_start);
    for (int i = 0; i < 5; i++) assert_int_equal(s.n_reported[i], 2);
    assert_true(s.loss[4 * 2 + 1] == .20);
    ft_sweep_sched_free(&s);
}

/* Ties go to the lower index; a non-finite loss ranks last and never continues; a rung of
 * fewer than eta trials lets every finite one continue. */
static void test_ties_and_nonfinite(void **state)
{
    ft_sweep_sched s;
    const int64_t rungs[1] = {1};
    int64_t t, all[4] = {0, 1, 2, 3};
    int keep[4];
    /* eta 2, 4 trials: .5 .5 .5 .7: floor(4/2) = 2 continue: t0, t1 (t2 ties them, later index) */
    init_ok(&s, 4, rungs, 1, FT_PRUNE_HALVING, 2, 4);
    for (int i = 0; i < 4; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 4, all, (double[]){.5, .5, .5, .7}, keep);
    assert_memory_equal(keep, ((int[]){1, 1, 0, 0}), sizeof keep);
    ft_sweep_sched_free(&s);
    /* reported in another order, the same decisions (the group's order does not matter) */
    init_ok(&s, 4, rungs, 1, FT_PRUNE_HALVING, 2, 4);
    for (int i = 0; i < 4; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 4, (int64_t[]){3, 2, 1, 0}, (double[]){.7, .5, .5, .5}, keep);
    assert_memory_equal(keep, ((int[]){0, 0, 1, 1}), sizeof keep);
    ft_sweep_sched_free(&s);
    /* NaN and inf: t1 NaN, t3 inf rank after t0 .9 and t2 .8; 2 continue: t2, t0 */
    init_ok(&s, 4, rungs, 1, FT_PRUNE_HALVING, 2, 4);
    for (int i = 0; i < 4; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 4, all, (double[]){.9, NAN, .8, INFINITY}, keep);
    assert_memory_equal(keep, ((int[]){1, 0, 1, 0}), sizeof keep);
    ft_sweep_sched_free(&s);
    /* all NaN: none continues, though floor(4/2) = 2 places are free */
    init_ok(&s, 4, rungs, 1, FT_PRUNE_HALVING, 2, 4);
    for (int i = 0; i < 4; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 4, all, (double[]){NAN, NAN, NAN, NAN}, keep);
    assert_memory_equal(keep, ((int[]){0, 0, 0, 0}), sizeof keep);
    assert_int_equal(ft_sweep_sched_count(&s, FT_TRIAL_PRUNED), 4);
    ft_sweep_sched_free(&s);
    /* eta 3, a group of 2: fewer than eta in the rung, both continue (the worse one too);
     * a NaN does not */
    init_ok(&s, 4, rungs, 1, FT_PRUNE_HALVING, 3, 4);
    for (int i = 0; i < 4; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 2, all, (double[]){.9, .1}, keep);
    assert_memory_equal(keep, ((int[]){1, 1}), 2 * sizeof(int));
    /* then t2 .5 and t3 NaN: 4 reached, floor(4/3) = 1 continues: t1 .1 holds it, both pruned */
    report_ok(&s, 0, 2, (int64_t[]){2, 3}, (double[]){.5, NAN}, keep);
    assert_memory_equal(keep, ((int[]){0, 0}), 2 * sizeof(int));
    ft_sweep_sched_free(&s);
    /* --prune none keeps a NaN trial running (its own max_bad_steps stops it) */
    init_ok(&s, 2, rungs, 1, FT_PRUNE_NONE, 2, 2);
    for (int i = 0; i < 2; i++) ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 2, all, (double[]){NAN, .3}, keep);
    assert_memory_equal(keep, ((int[]){1, 1}), 2 * sizeof(int));
    ft_sweep_sched_free(&s);
}

static void test_misuse(void **state)
{
    ft_sweep_sched s, before;
    const int64_t rungs[2] = {1, 2};
    int64_t t;
    init_ok(&s, 3, rungs, 2, FT_PRUNE_HALVING, 2, 2);
    ft_sweep_sched_start(&s, &t);
    ft_sweep_sched_start(&s, &t);
    before = s;
    int st[3];
    memcpy(st, s.status, sizeof st);
    struct { int64_t rung, n, trials[2]; const char *msg; } bad[] = {
        {2, 1, {0}, "sweep: rung 2 reported, the sweep has 2"},
        {-1, 1, {0}, "sweep: rung -1 reported, the sweep has 2"},
        {0, 1, {2}, "sweep: trial 2 reported at rung 0, and it is pending"},
        {0, 1, {3}, "sweep: trial 3 reported, the sweep has 3"},
        {1, 1, {0}, "sweep: trial 0 reported at rung 1 after 0 rungs"},
        {0, 2, {1, 1}, "sweep: trial 1 reported twice at rung 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ft_sweep_sched_report(&s, bad[i].rung, bad[i].n, bad[i].trials, (double[]){.1, .2}, NULL),
                         FT_E_INVALID);
        assert_string_equal(ft_errmsg(), bad[i].msg);
        assert_memory_equal(s.status, st, sizeof st);
        assert_int_equal(s.n_reported[0] + s.n_reported[1] + s.n_reported[2], 0);
    }
    assert_int_equal(before.n_trials, s.n_trials);
    assert_int_equal(ft_sweep_sched_end(&s, 2, FT_TRIAL_COMPLETED), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: trial 2 ends, and it is pending");
    assert_int_equal(ft_sweep_sched_end(&s, 0, FT_TRIAL_PRUNED), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: trial 0 cannot end as pruned");
    assert_int_equal(ft_sweep_sched_end(&s, 0, FT_TRIAL_COMPLETED), 0);
    assert_int_equal(ft_sweep_sched_end(&s, 0, FT_TRIAL_COMPLETED), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: trial 0 ends, and it is completed");
    /* a pruned trial reports no more */
    report_ok(&s, 0, 1, (int64_t[]){1}, (double[]){.5}, NULL); /* alone, < eta: on */
    ft_sweep_sched_start(&s, &t);
    report_ok(&s, 0, 1, (int64_t[]){2}, (double[]){.9}, NULL); /* record .5 .9: pruned */
    assert_int_equal(s.status[2], FT_TRIAL_PRUNED);
    assert_int_equal(ft_sweep_sched_report(&s, 1, 1, (int64_t[]){2}, (double[]){.1}, NULL), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep: trial 2 reported at rung 1, and it is pruned");
    ft_sweep_sched_free(&s);
}

/* The model: each rung's record as a list sorted by (finite first, loss, index); a group
 * member continues if its loss is finite and (the record holds fewer than eta) or it is
 * among the first floor(n / eta) of the sorted list. */
typedef struct rec { double loss; int64_t i; } rec;

static int cmp_rec(const void *a, const void *b)
{
    const rec *x = a, *y = b;
    int fx = isfinite(x->loss), fy = isfinite(y->loss);
    if (fx != fy) return fy - fx;
    if (fx && x->loss != y->loss) return x->loss < y->loss ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static void test_against_model(void **state)
{
    ft_rng r;
    ft_rng_seed(&r, 2026);
    int64_t checked = 0, pruned = 0, kept_over = 0; /* decisions compared; of them stops, and
                                                     * continues past the rung's top (n < eta) */
    for (int round = 0; round < 300; round++) {
        int64_t n = 1 + (int64_t)(ft_rng_next(&r) % 40), n_rungs = 1 + (int64_t)(ft_rng_next(&r) % 4);
        int64_t eta = 2 + (int64_t)(ft_rng_next(&r) % 3), slots = 1 + (int64_t)(ft_rng_next(&r) % (uint64_t)n);
        int64_t rungs[4] = {1, 2, 4, 8};
        ft_sweep_sched s;
        init_ok(&s, n, rungs, n_rungs, FT_PRUNE_HALVING, eta, slots);
        rec record[4][64];
        int64_t rec_n[4] = {0};
        int64_t t;
        /* random events: start, report a random group of the running at one rung, or end */
        for (int step = 0; step < 2000 && !ft_sweep_sched_done(&s); step++) {
            uint64_t what = ft_rng_next(&r) % 4;
            if (what == 0) {
                ft_sweep_sched_start(&s, &t);
                continue;
            }
            int64_t k = (int64_t)(ft_rng_next(&r) % (uint64_t)n_rungs), group[64], m = 0;
            double l[64];
            for (int64_t i = 0; i < n; i++)
                if (s.status[i] == FT_TRIAL_RUNNING && s.n_reported[i] == k && ft_rng_next(&r) % 2) {
                    group[m] = i;
                    /* few distinct values, for ties; now and then NaN */
                    uint64_t v = ft_rng_next(&r) % 12;
                    l[m++] = v == 11 ? NAN : 0.1 * (double)(v % 6);
                }
            if (what == 3 || !m) { /* end a running trial that passed all its rungs or not */
                for (int64_t i = 0; i < n; i++)
                    if (s.status[i] == FT_TRIAL_RUNNING && ft_rng_next(&r) % 3 == 0) {
                        ft_sweep_sched_end(&s, i, ft_rng_next(&r) % 5 ? FT_TRIAL_COMPLETED : FT_TRIAL_FAILED);
                        break;
                    }
                continue;
            }
            int keep[64];
            report_ok(&s, k, m, group, l, keep);
            for (int64_t j = 0; j < m; j++) record[k][rec_n[k]++] = (rec){l[j], group[j]};
            rec sorted[64];
            memcpy(sorted, record[k], (size_t)rec_n[k] * sizeof *sorted);
            qsort(sorted, (size_t)rec_n[k], sizeof *sorted, cmp_rec);
            int64_t q = rec_n[k] / eta;
            for (int64_t j = 0; j < m; j++) {
                int in_top = 0;
                for (int64_t p = 0; p < q; p++) in_top |= sorted[p].i == group[j];
                int want = isfinite(l[j]) && (rec_n[k] < eta || in_top);
                if (keep[j] != want)
                    fail_msg("round %d: trial %lld at rung %lld (loss %g, record of %lld, eta %lld): kept %d, "
                             "model %d", round, (long long)group[j], (long long)k, l[j], (long long)rec_n[k],
                             (long long)eta, keep[j], want);
                assert_int_equal(s.status[group[j]], want ? FT_TRIAL_RUNNING : FT_TRIAL_PRUNED);
                checked++;
                pruned += !want;
                kept_over += want && !in_top;
            }
        }
        ft_sweep_sched_free(&s);
    }
    printf("model: %lld decisions compared, %lld stops, %lld continues in rungs of fewer than eta\n",
           (long long)checked, (long long)pruned, (long long)kept_over);
    assert_true(checked > 2000 && pruned > 500 && kept_over > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_rung_steps),
        cmocka_unit_test(test_init_errors),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_synchronous_halving),
        cmocka_unit_test(test_asynchronous_refill),
        cmocka_unit_test(test_ties_and_nonfinite),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
