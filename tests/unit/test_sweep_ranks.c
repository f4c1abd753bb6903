/* test_sweep_ranks.c - a sweep's split over ranks without a communicator (src/train/sweep_ranks.h):
 * trial t is rank t % size's, the others set aside and written pending with no rung; a resume
 * state with another rank's trial started is refused naming the file, trial and rank; one
 * process changes nothing; the exchange and the gather of one process are the identity. (The
 * collectives over 2 ranks: tests/ref/test_sweep_mpi.py.) */
#include "tests/unit/harness.h"

#include "src/core/err.h"
#include "src/train/sweep_ranks.h"

typedef struct world {
    ft_sweep_space space;
    ft_sweep_trials t;
    ft_sweep_sched s;
} world;

static void make(world *w, int64_t n_rungs)
{
    static const int64_t rungs[] = {2, 4};
    ft_sweep_space_init(&w->space);
    assert_int_equal(ft_sweep_space_add_grid(&w->space, "lr=1e-3,2e-3,3e-3,4e-3,5e-3"), 0);
    assert_int_equal(ft_sweep_space_expand(&w->space, FT_SWEEP_MAX_TRIALS, &w->t), 0);
    assert_int_equal(ft_sweep_sched_init(&w->s, w->t.n, rungs, n_rungs, FT_PRUNE_HALVING, 2, 2), 0);
}

static void drop(world *w)
{
    ft_sweep_sched_free(&w->s);
    ft_sweep_trials_free(&w->t);
    ft_sweep_space_free(&w->space);
}

static void test_set_aside_and_view(void **state)
{
    world w;
    make(&w, 2);
    assert_int_equal(w.t.n, 5);
    assert_int_equal(ft_sweep_ranks_set_aside(&w.s, &w.t, 1, 2, "f.json"), 0);
    for (int64_t t = 0; t < 5; t++)
        assert_int_equal(w.s.status[t], t % 2 == 1 ? FT_TRIAL_PENDING : FT_SWEEP_ELSEWHERE);
    /* rank 1 starts only its own trials: 1, then 3 (2 slots) */
    int64_t a, b, c;
    assert_true(ft_sweep_sched_start(&w.s, &a) && ft_sweep_sched_start(&w.s, &b));
    assert_int_equal(a, 1);
    assert_int_equal(b, 3);
    assert_int_equal(ft_sweep_sched_end(&w.s, 1, FT_TRIAL_COMPLETED), 0);
    assert_false(ft_sweep_sched_start(&w.s, &c)); /* trial 0, 2, 4 are rank 0's */
    /* a rung reported for trial 0 (as rank 0's exchange does) is hidden in the view */
    w.s.n_reported[0] = 1;
    ft_sweep_sched v;
    assert_int_equal(ft_sweep_ranks_view(&w.s, &v), 0);
    assert_int_equal(v.status[0], FT_TRIAL_PENDING);
    assert_int_equal(v.n_reported[0], 0);
    assert_int_equal(v.status[1], FT_TRIAL_COMPLETED);
    assert_int_equal(v.status[3], FT_TRIAL_RUNNING);
    free(v.status);
    free(v.n_reported);
    drop(&w);
}

static void test_other_ranks_state_refused(void **state)
{
    world w;
    make(&w, 2);
    w.s.status[2] = FT_TRIAL_COMPLETED; /* a single process's state, resumed by rank 1 of 2 */
    assert_int_equal(ft_sweep_ranks_set_aside(&w.s, &w.t, 1, 2, "DIR/sweep.resume.1.json"), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "DIR/sweep.resume.1.json: trials[2] (lr3e-3) is completed, and under 2 ranks it is rank 0's"));
    ft_err_clear();
    /* one process: every trial its own */
    assert_int_equal(ft_sweep_ranks_set_aside(&w.s, &w.t, 0, 1, "f"), 0);
    assert_int_equal(w.s.status[2], FT_TRIAL_COMPLETED);
    assert_int_equal(w.s.status[0], FT_TRIAL_PENDING);
    drop(&w);
}

static void test_single_process_collectives(void **state)
{
    world w;
    make(&w, 2);
    ft_sweep_result res[5];
    ft_sweep_results_init(res, 5);
    res[3].steps = 7;
    w.s.status[3] = FT_TRIAL_COMPLETED;
    assert_int_equal(ft_sweep_ranks_gather(NULL, &w.s, res), 0);
    assert_int_equal(res[3].steps, 7);
    assert_int_equal(w.s.status[3], FT_TRIAL_COMPLETED);
    ft_sweep_pass_rec me = {1, 0, 0, {{3, 0, 1.5}}}, all[1];
    volatile sig_atomic_t sig = SIGTERM, pass_stop = 0;
    assert_int_equal(ft_sweep_ranks_exchange(NULL, &me, all, &sig, &pass_stop), 0);
    assert_int_equal(all[0].n, 1);
    assert_int_equal(all[0].rep[0].trial, 3);
    assert_int_equal(all[0].stop, SIGTERM);
    assert_int_equal(pass_stop, SIGTERM); /* the signal becomes the passes' stop */
    pass_stop = 0;
    sig = 0;
    assert_int_equal(ft_sweep_ranks_idle(NULL, &sig, &pass_stop), 0); /* alone: done at once */
    assert_int_equal(pass_stop, 0);
    drop(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_aside_and_view),
        cmocka_unit_test(test_other_ranks_state_refused),
        cmocka_unit_test(test_single_process_collectives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
