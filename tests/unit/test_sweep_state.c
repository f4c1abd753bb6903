/* test_sweep_state.c - sweep.json (src/train/sweep_state.h): written atomically, read back
 * to the same state and the same text, the best trial, every kind of bad content refused
 * with the file and key named and nothing changed, and a sweep resumed from its sweep.json
 * deciding as the uninterrupted one.
 *
 * `test_sweep_state --write-examples DIR` writes the example files of this test into DIR
 * instead of running the tests (tests/ref/test_sweep_json.py validates them against
 * tests/ref/sweep_schema.json). */
#include "tests/unit/harness.h"

#include <dirent.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/rng.h"
#include "src/train/sweep_state.h"

/* A sweep's whole state. */
typedef struct sweep {
    ft_sweep_space space;
    ft_sweep_trials t;
    ft_sweep_sched s;
    ft_sweep_result *r;
} sweep;

static void sweep_free(sweep *w)
{
    ft_sweep_trials_free(&w->t);
    ft_sweep_sched_free(&w->s);
    ft_sweep_space_free(&w->space);
    free(w->r);
}

/* A fresh sweep (every trial pending) of the grid flags / config and scheduler settings. */
static void sweep_new(sweep *w, const char *const *grids, const char *config, int mode, int64_t eta, int64_t slots,
                      const int64_t *rungs, int64_t n_rungs)
{
    memset(w, 0, sizeof *w);
    ft_sweep_space_init(&w->space);
    for (int i = 0; grids && grids[i]; i++) assert_int_equal(ft_sweep_space_add_grid(&w->space, grids[i]), 0);
    if (config) assert_int_equal(ft_sweep_space_parse(&w->space, config, strlen(config), "space.json"), 0);
    assert_int_equal(ft_sweep_space_expand(&w->space, FT_SWEEP_MAX_TRIALS, &w->t), 0);
    assert_int_equal(ft_sweep_sched_init(&w->s, w->t.n, rungs, n_rungs, mode, eta, slots), 0);
    w->r = malloc((size_t)w->t.n * sizeof *w->r);
    assert_non_null(w->r);
    ft_sweep_results_init(w->r, w->t.n);
}

/* --- example A: a halving sweep, as an executor would drive it ---------------------------
 * 6 trials (lr 1e-4, 2e-4, 5e-4 x lora_r 8, 16), 2 adapters per pass, eta 2, rungs at steps
 * 10 and 20, 40 steps a trial, 2048 tokens a step. The decisions, worked out by hand:
 *   t0, t1 start; rung 0: t0 1.9, t1 1.7: record of 2, 1 continues: t1; t0 pruned.
 *   t2 starts; fails at step 5 (non-finite losses).        t3 starts.
 *   t1 rung 1 1.5: record of 1 (< eta): on.  t3 rung 0 1.6: record 1.9 1.7 1.6, 1
 *   continues: t3 (the best).  t1 completes, best eval 1.4 at step 40.  t4 starts.
 *   ---- A_SPLIT: the in-progress snapshot (t3, t4 running, t5 pending, best t1)
 *   t4 rung 0 2.1: record of 4, 2 continue: 1.6 (t3) and 1.7 (t1): t4 pruned.  t5 starts.
 *   t3 rung 1 1.3: record 1.5 1.3, 1 continues: t3.
 *   t5 rung 0 1.65: record of 5, 2 continue: t3 1.6, t5 1.65: on.
 *   t3 completes, best eval 1.25.  t5 rung 1 1.45: record 1.5 1.3 1.45, 1 continues: t3's
 *   1.3: t5 pruned.
 *   Final: t1, t3 completed (best: t3 lr2e-4_r16), t0, t4, t5 pruned, t2 failed. */
enum { EV_START, EV_REPORT, EV_END };
/* group: 1 when the next event is a report of the same group (one pass's eval) */
typedef struct event { int kind; int64_t trial, rung; double loss; int want, group; } event;

static const event A_EVENTS[] = {
    {EV_START, 0}, {EV_START, 1},
    {EV_REPORT, 0, 0, 1.9, 0, 1}, {EV_REPORT, 1, 0, 1.7, 1},
    {EV_START, 2}, {EV_END, 2, 0, 0, FT_TRIAL_FAILED}, {EV_START, 3},
    {EV_REPORT, 1, 1, 1.5, 1}, {EV_REPORT, 3, 0, 1.6, 1}, {EV_END, 1, 0, 1.4, FT_TRIAL_COMPLETED}, {EV_START, 4},
    {EV_REPORT, 4, 0, 2.1, 0}, {EV_START, 5}, {EV_REPORT, 3, 1, 1.3, 1}, {EV_REPORT, 5, 0, 1.65, 1},
    {EV_END, 3, 0, 1.25, FT_TRIAL_COMPLETED}, {EV_REPORT, 5, 1, 1.45, 0},
};
#define A_N ((int)(sizeof A_EVENTS / sizeof A_EVENTS[0]))
#define A_SPLIT 11 /* events before the snapshot */

static const int64_t A_RUNGS[2] = {10, 20};

/* Applies events [from, to) to w: starts (the trial the scheduler picks must be ev.trial),
 * reports of a group (ev.want: continues or not; the results follow the eval: steps at the
 * rung, the best loss so far), ends (completed at 40 steps with ev.loss as the final best
 * eval, or failed at step 5). */
static void run_events(sweep *w, const event *ev, int from, int to)
{
    for (int i = from; i < to; i++) {
        const event *e = &ev[i];
        ft_sweep_result *r = &w->r[e->trial];
        int64_t t;
        if (e->kind == EV_START) {
            assert_int_equal(ft_sweep_sched_start(&w->s, &t), 1);
            assert_int_equal(t, e->trial);
        } else if (e->kind == EV_REPORT) {
            int64_t trials[8];
            double losses[8];
            int keep[8], n = 0;
            do {
                trials[n] = ev[i + n].trial;
                losses[n] = ev[i + n].loss;
            } while (ev[i + n++].group);
            assert_int_equal(ft_sweep_sched_report(&w->s, e->rung, n, trials, losses, keep), 0);
            for (int j = 0; j < n; j++) {
                const event *g = &ev[i + j];
                r = &w->r[g->trial];
                if (keep[j] != g->want) fail_msg("event %d: trial %lld at rung %lld: kept %d", i + j,
                                                 (long long)g->trial, (long long)g->rung, keep[j]);
                r->steps = w->s.rung_step[g->rung];
                r->tokens = r->steps * 2048;
                if (!(r->best_eval_loss <= g->loss)) {
                    r->best_eval_loss = g->loss;
                    r->best_eval_step = r->steps;
                }
            }
            i += n - 1;
        } else {
            assert_int_equal(ft_sweep_sched_end(&w->s, e->trial, e->want), 0);
            if (e->want == FT_TRIAL_FAILED) {
                r->steps = 5;
                r->tokens = 5 * 2048;
                snprintf(r->error, sizeof r->error, "trial %s: 5 steps in a row with a non-finite loss or gradient "
                         "norm (--max-bad-steps 5)", w->t.t[e->trial].name);
            } else {
                r->steps = 40;
                r->tokens = 40 * 2048;
                r->best_eval_loss = e->loss;
                r->best_eval_step = 40;
            }
        }
    }
}

static void example_a(sweep *w, int events)
{
    sweep_new(w, (const char *[]){"lr=1e-4,2e-4,5e-4", "lora_r=8,16", NULL}, NULL, FT_PRUNE_HALVING, 2, 2, A_RUNGS,
              2);
    run_events(w, A_EVENTS, 0, events);
}

/* --- example B: no pruning, options of every type ---------------------------------------- */
static void example_b_fresh(sweep *w)
{
    sweep_new(w, NULL,
              "{\"grid\": {\"lora_target\": [\"q_proj,v_proj\", \"all-linear\"], \"use_rslora\": [false, true]},"
              " \"random\": {\"seed\": {\"choice\": [1, \"18446744073709551615\"]}, \"schedule\": {\"choice\": "
              "[\"cosine\", \"linear\"]}, \"lora_dropout\": {\"uniform\": [0, 0.1]}}, \"trials\": 2, \"seed\": 4}",
              FT_PRUNE_NONE, 2, 8, NULL, 0);
}

/* every trial completed, trial 2 without an eval loss */
static void example_b(sweep *w)
{
    example_b_fresh(w);
    int64_t t;
    while (ft_sweep_sched_start(&w->s, &t)) {}
    for (int64_t i = 0; i < w->t.n; i++) {
        assert_int_equal(ft_sweep_sched_end(&w->s, i, FT_TRIAL_COMPLETED), 0);
        w->r[i].steps = 12;
        w->r[i].tokens = 12 * 512;
        w->r[i].best_eval_loss = i == 2 ? NAN : 2.0 + 0.1 * (double)i; /* 2.3000000000000003, ... */
        w->r[i].best_eval_step = i == 2 ? 0 : 12;
    }
}

static void write_examples(const char *dir)
{
    sweep w;
    char path[4200];
    if (ft_mkdir_p(dir)) {
        fprintf(stderr, "%s\n", ft_errmsg());
        exit(1);
    }
    struct { const char *file; int which; } ex[] = {
        {"sweep_halving_running.json", A_SPLIT}, {"sweep_halving_done.json", A_N}, {"sweep_none.json", -1},
        {"sweep_pending.json", 0},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        if (ex[i].which < 0) example_b(&w);
        else example_a(&w, ex[i].which);
        snprintf(path, sizeof path, "%s/%s", dir, ex[i].file);
        if (ft_sweep_json_write(path, &w.t, &w.s, w.r)) {
            fprintf(stderr, "%s\n", ft_errmsg());
            exit(1);
        }
        sweep_free(&w);
    }
}

/* --- tests -------------------------------------------------------------------------------- */

static void test_example_a_decisions(void **state)
{
    sweep w;
    example_a(&w, A_N);
    assert_true(ft_sweep_sched_done(&w.s));
    const int final[6] = {FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED, FT_TRIAL_FAILED, FT_TRIAL_COMPLETED, FT_TRIAL_PRUNED,
                          FT_TRIAL_PRUNED};
    assert_memory_equal(w.s.status, final, sizeof final);
    assert_int_equal(ft_sweep_best(&w.s, w.r), 3);
    assert_string_equal(w.t.t[3].name, "lr2e-4_r16");
    sweep_free(&w);
    example_a(&w, A_SPLIT);
    assert_int_equal(ft_sweep_best(&w.s, w.r), 1);
    assert_int_equal(ft_sweep_sched_count(&w.s, FT_TRIAL_RUNNING), 2);
    assert_int_equal(ft_sweep_sched_count(&w.s, FT_TRIAL_PENDING), 1);
    sweep_free(&w);
}

static void test_best(void **state)
{
    ft_sweep_sched s;
    assert_int_equal(ft_sweep_sched_init(&s, 4, NULL, 0, FT_PRUNE_HALVING, 2, 4), 0);
    ft_sweep_result r[4];
    ft_sweep_results_init(r, 4);
    assert_true(isnan(r[0].best_eval_loss) && r[0].steps == 0 && !r[0].error[0]);
    assert_int_equal(ft_sweep_best(&s, r), -1); /* nothing completed */
    int st[4] = {FT_TRIAL_PRUNED, FT_TRIAL_COMPLETED, FT_TRIAL_COMPLETED, FT_TRIAL_COMPLETED};
    memcpy(s.status, st, sizeof st);
    assert_int_equal(ft_sweep_best(&s, r), -1); /* completed, without an eval loss */
    r[0].best_eval_loss = 0.5; /* pruned: no candidate */
    r[1].best_eval_loss = 1.0;
    r[2].best_eval_loss = 0.9;
    r[3].best_eval_loss = 0.9;
    assert_int_equal(ft_sweep_best(&s, r), 2); /* tie with 3: the lower index */
    r[2].best_eval_loss = NAN;
    assert_int_equal(ft_sweep_best(&s, r), 3);
    ft_sweep_sched_free(&s);
}

static void assert_same_state(const sweep *a, const sweep *b)
{
    assert_int_equal(a->s.n_trials, b->s.n_trials);
    for (int64_t i = 0; i < a->s.n_trials; i++) {
        assert_int_equal(a->s.status[i], b->s.status[i]);
        assert_int_equal(a->s.n_reported[i], b->s.n_reported[i]);
        for (int64_t k = 0; k < a->s.n_reported[i]; k++) {
            double x = a->s.loss[i * a->s.n_rungs + k], y = b->s.loss[i * a->s.n_rungs + k];
            assert_true(x == y || (isnan(x) && isnan(y)));
        }
        const ft_sweep_result *p = &a->r[i], *q = &b->r[i];
        assert_true(p->best_eval_loss == q->best_eval_loss || (isnan(p->best_eval_loss) && isnan(q->best_eval_loss)));
        assert_int_equal(p->best_eval_step, q->best_eval_step);
        assert_int_equal(p->steps, q->steps);
        assert_int_equal(p->tokens, q->tokens);
        assert_string_equal(p->error, q->error);
    }
}

/* Written, read into a fresh sweep of the same settings: the same state, and the same text. */
static void round_trip(sweep *w, void (*fresh)(sweep *))
{
    char *dir = t_tmpdir(), path[4200];
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/sweep.json", dir);
    assert_int_equal(ft_sweep_json_write(path, &w->t, &w->s, w->r), 0);
    sweep b;
    fresh(&b);
    if (ft_sweep_json_read(path, &b.t, &b.s, b.r)) fail_msg("read: %s", ft_errmsg());
    assert_same_state(w, &b);
    char *t1, *t2, *file;
    assert_int_equal(ft_sweep_json_format(&w->t, &w->s, w->r, &t1), 0);
    assert_int_equal(ft_sweep_json_format(&b.t, &b.s, b.r, &t2), 0);
    assert_string_equal(t1, t2);
    assert_int_equal(ft_read_file(path, &file, NULL), 0);
    assert_string_equal(file, t1);
    /* rewritten in place: one file, no temporary left */
    assert_int_equal(ft_sweep_json_write(path, &b.t, &b.s, b.r), 0);
    DIR *dh = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(dh));) entries += e->d_name[0] != '.';
    closedir(dh);
    assert_int_equal(entries, 1);
    free(t1);
    free(t2);
    free(file);
    sweep_free(&b);
    free(dir);
}

static void fresh_a(sweep *w) { example_a(w, 0); }

static void test_round_trip(void **state)
{
    for (int split = 0; split <= A_N; split++) { /* every intermediate state */
        sweep w;
        example_a(&w, split);
        round_trip(&w, fresh_a);
        sweep_free(&w);
    }
    sweep w;
    example_b(&w);
    round_trip(&w, example_b_fresh);
    sweep_free(&w);
}

/* What the text says (the layout of sweep_state.h). */
static void test_text(void **state)
{
    sweep w;
    example_a(&w, A_N);
    char *txt;
    assert_int_equal(ft_sweep_json_format(&w.t, &w.s, w.r, &txt), 0);
    const char *has[] = {
        "\"version\":\t1", "\"method\":\t\"halving\"", "\"eta\":\t2", "\"adapters_per_pass\":\t2",
        "\"rung_steps\":\t[10, 20]", "\"name\":\t\"lr1e-4_r8\"", "\"lr\":\t1e-4", "\"lora_r\":\t16",
        "\"status\":\t\"failed\"", "\"error\":\t\"trial lr2e-4_r8: 5 steps in a row", "\"rung_losses\":\t[1.6, 1.3]",
        "\"best_eval_loss\":\t1.25", "\"tokens\":\t81920", "\"best\":\t\"lr2e-4_r16\"", "\"status\":\t\"pruned\"",
    };
    for (size_t i = 0; i < sizeof has / sizeof has[0]; i++)
        if (!strstr(txt, has[i])) fail_msg("no '%s' in\n%s", has[i], txt);
    assert_int_equal(txt[strlen(txt) - 1], '\n');
    free(txt);
    sweep_free(&w);
    example_b(&w);
    assert_int_equal(ft_sweep_json_format(&w.t, &w.s, w.r, &txt), 0);
    const char *b_has[] = {"\"method\":\t\"none\"", "\"rung_steps\":\t[]", "\"seed\":\t\"18446744073709551615\"",
                           "\"seed\":\t1,", "\"lora_target\":\t\"q_proj,v_proj\"", "\"use_rslora\":\ttrue",
                           "\"schedule\":\t\"linear\"", "\"best_eval_loss\":\tnull", "\"best\":\t\"tgtq-v_norslora"};
    for (size_t i = 0; i < sizeof b_has / sizeof b_has[0]; i++)
        if (!strstr(txt, b_has[i])) fail_msg("no '%s' in\n%s", b_has[i], txt);
    assert_null(strstr(txt, "\"error\""));
    free(txt);
    sweep_free(&w);
}

/* A sweep stopped after A_SPLIT events and resumed from its sweep.json decides the rest as
 * the uninterrupted one did (run_events checks each decision against the hand-worked one). */
static void test_resume_decides_the_same(void **state)
{
    char *dir = t_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/sweep.json", dir);
    for (int split = 0; split <= A_N; split++) {
        if (split && A_EVENTS[split - 1].group) continue; /* not inside one pass's eval */
        sweep a, b;
        example_a(&a, split);
        assert_int_equal(ft_sweep_json_write(path, &a.t, &a.s, a.r), 0);
        sweep_free(&a);
        example_a(&b, 0);
        assert_int_equal(ft_sweep_json_read(path, &b.t, &b.s, b.r), 0);
        run_events(&b, A_EVENTS, split, A_N);
        sweep whole;
        example_a(&whole, A_N);
        assert_same_state(&whole, &b);
        sweep_free(&whole);
        sweep_free(&b);
    }
    free(dir);
}

/* --- bad content --------------------------------------------------------------------------- */

/* The finished example A as a cJSON tree to damage. */
static cJSON *good_doc(void)
{
    sweep w;
    example_a(&w, A_N);
    char *txt;
    assert_int_equal(ft_sweep_json_format(&w.t, &w.s, w.r, &txt), 0);
    cJSON *o = cJSON_Parse(txt);
    assert_non_null(o);
    free(txt);
    sweep_free(&w);
    return o;
}

static cJSON *trial(cJSON *doc, int i)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "trials"), i);
}

static void set(cJSON *o, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItem(o, key)) cJSON_ReplaceItemInObject(o, key, v);
    else cJSON_AddItemToObject(o, key, v);
}

/* Expects text to be refused with exactly msg (after "sweep.json: ") and the state of a
 * fresh example A sweep unchanged. */
static void refused_text(const char *text, int code, const char *msg)
{
    sweep w, ref;
    example_a(&w, 0);
    example_a(&ref, 0);
    w.r[0].steps = ref.r[0].steps = 99; /* something to keep */
    ft_err_clear();
    int rc = ft_sweep_json_parse(text, strlen(text), "sweep.json", &w.t, &w.s, w.r);
    char want[2048];
    snprintf(want, sizeof want, "sweep.json: %s", msg);
    if (rc != code || strcmp(ft_errmsg(), want))
        fail_msg("rc %d, message\n  \"%s\", expected\n  \"%s\"", rc, ft_errmsg(), want);
    assert_same_state(&ref, &w);
    sweep_free(&w);
    sweep_free(&ref);
}

static void refused(cJSON *doc, const char *msg)
{
    char *txt = cJSON_Print(doc);
    refused_text(txt, FT_E_INVALID, msg);
    free(txt);
    cJSON_Delete(doc);
}

static void test_bad_content(void **state)
{
    cJSON *d;
    refused_text("{\"version\": 1,", FT_E_INVALID, "offset 13: not valid JSON"); /* cJSON: the last byte */
    refused_text("[]", FT_E_INVALID, "expected a JSON object {\"trials\": [...], ...}, found a list");
    refused_text("{\"version\": 1, \"version\": 1}", FT_E_INVALID, "key \"version\" appears twice in one object");
    d = good_doc(); set(d, "comment", cJSON_CreateString("x"));
    refused(d, "unknown key \"comment\"");
    d = good_doc(); cJSON_DeleteItemFromObject(d, "version");
    refused(d, "no \"version\"");
    d = good_doc(); set(d, "version", cJSON_CreateNumber(2));
    { char *t = cJSON_Print(d); refused_text(t, FT_E_UNSUPPORTED, "version: 2, this ftune reads version 1"); free(t); cJSON_Delete(d); }
    d = good_doc(); cJSON_DeleteItemFromObject(d, "prune");
    refused(d, "no \"prune\"");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "method", cJSON_CreateString("asha"));
    refused(d, "prune.method: expected \"none\" or \"halving\", found asha");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "method", cJSON_CreateString("none"));
    refused(d, "prune.method: none in the file, this sweep prunes halving (--prune none continues it)");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "eta", cJSON_CreateNumber(3));
    refused(d, "prune.eta: 3 in the file, this sweep has 2");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "eta", cJSON_CreateString("2"));
    refused(d, "prune.eta: expected an integer >= 2, found a string");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "adapters_per_pass", cJSON_CreateNumber(4));
    refused(d, "prune.adapters_per_pass: 4 in the file, this sweep has 2 (which trials run together decides which "
               "are pruned: --adapters-per-pass 4 continues it)");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "rung_steps", cJSON_CreateIntArray((int[]){10, 30}, 2));
    refused(d, "prune.rung_steps: other rungs than this sweep's [10, 20] (the steps, --eval-every or the pruning "
               "changed)");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "rung_steps", cJSON_CreateIntArray((int[]){10}, 1));
    refused(d, "prune.rung_steps: other rungs than this sweep's [10, 20] (the steps, --eval-every or the pruning "
               "changed)");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "rung_steps", cJSON_CreateIntArray((int[]){10, 0}, 2));
    refused(d, "prune.rung_steps[1]: expected an integer >= 1, found another number");
    d = good_doc(); set(cJSON_GetObjectItem(d, "prune"), "extra", cJSON_CreateTrue());
    refused(d, "prune: unknown key \"extra\"");
    d = good_doc(); set(d, "trials", cJSON_CreateObject());
    refused(d, "trials: expected a list, found an object");
    d = good_doc(); cJSON_DeleteItemFromArray(cJSON_GetObjectItem(d, "trials"), 5);
    refused(d, "trials: 5 trials, and this sweep has 6 (the search space changed: give the same --grid/--config, or "
               "another --out)");
    d = good_doc(); cJSON_ReplaceItemInArray(cJSON_GetObjectItem(d, "trials"), 1, cJSON_CreateString("t1"));
    refused(d, "trials[1]: expected an object, found a string");
    d = good_doc(); set(trial(d, 1), "notes", cJSON_CreateString("x"));
    refused(d, "trials[1]: unknown key \"notes\"");
    d = good_doc(); cJSON_DeleteItemFromObject(trial(d, 1), "name");
    refused(d, "trials[1]: no \"name\"");
    d = good_doc(); set(trial(d, 1), "name", cJSON_CreateString("lr1e-4_r32"));
    refused(d, "trials[1].name: \"lr1e-4_r32\", and this sweep's trial 1 is \"lr1e-4_r16\" (the search space "
               "changed: give the same --grid/--config, or another --out)");
    d = good_doc(); set(trial(d, 1), "name", cJSON_CreateNumber(1));
    refused(d, "trials[1].name: expected a string, found a number");
    d = good_doc(); set(cJSON_GetObjectItem(trial(d, 2), "params"), "lr", cJSON_CreateNumber(5e-4));
    refused(d, "trials[2].params.lr: 5e-4, and this sweep's trial 2 (lr2e-4_r8) has 2e-4 (the search space changed: "
               "give the same --grid/--config, or another --out)");
    d = good_doc(); set(cJSON_GetObjectItem(trial(d, 2), "params"), "lr", cJSON_CreateString("2e-4"));
    refused(d, "trials[2].params.lr: expected a number, found a string");
    d = good_doc(); set(cJSON_GetObjectItem(trial(d, 2), "params"), "lora_r", cJSON_CreateNumber(0));
    refused(d, "trials[2].params.lora_r: 0 is outside the option's domain (>= 1)");
    d = good_doc(); cJSON_DeleteItemFromObject(cJSON_GetObjectItem(trial(d, 2), "params"), "lora_r");
    refused(d, "trials[2].params: no \"lora_r\" (the search space changed: give the same --grid/--config, or another "
               "--out)");
    d = good_doc(); set(cJSON_GetObjectItem(trial(d, 2), "params"), "seed", cJSON_CreateNumber(1));
    refused(d, "trials[2].params: \"seed\" is not an option of this sweep (the search space changed: give the same "
               "--grid/--config, or another --out)");
    d = good_doc(); set(trial(d, 2), "params", cJSON_CreateArray());
    refused(d, "trials[2].params: expected an object, found a list");
    d = good_doc(); set(trial(d, 3), "status", cJSON_CreateString("done"));
    refused(d, "trials[3].status: expected one of pending, running, pruned, completed, failed, found \"done\"");
    d = good_doc(); set(trial(d, 3), "status", cJSON_CreateNumber(3));
    refused(d, "trials[3].status: expected one of pending, running, pruned, completed, failed, found a number");
    d = good_doc(); set(trial(d, 3), "best_eval_loss", cJSON_CreateString("1.25"));
    refused(d, "trials[3].best_eval_loss: expected a number or null, found a string");
    d = good_doc(); set(trial(d, 3), "best_eval_step", cJSON_CreateNumber(-1));
    refused(d, "trials[3].best_eval_step: expected an integer >= 0, found another number");
    d = good_doc(); set(trial(d, 3), "steps", cJSON_CreateNumber(1.5));
    refused(d, "trials[3].steps: expected an integer >= 0, found another number");
    d = good_doc(); cJSON_DeleteItemFromObject(trial(d, 3), "tokens");
    refused(d, "trials[3]: no \"tokens\"");
    d = good_doc(); set(trial(d, 3), "rung_losses", cJSON_CreateNumber(1));
    refused(d, "trials[3].rung_losses: expected a list, found a number");
    d = good_doc(); cJSON_AddItemToArray(cJSON_GetObjectItem(trial(d, 3), "rung_losses"), cJSON_CreateNumber(1.2));
    refused(d, "trials[3].rung_losses: 3 losses, and the sweep has 2 rungs");
    d = good_doc(); cJSON_ReplaceItemInArray(cJSON_GetObjectItem(trial(d, 3), "rung_losses"), 1, cJSON_CreateFalse());
    refused(d, "trials[3].rung_losses[1]: expected a number or null, found a boolean");
    d = good_doc(); set(trial(d, 0), "rung_losses", cJSON_CreateArray());
    refused(d, "trials[0].rung_losses: a pruned trial without the rung loss it was pruned at");
    d = good_doc(); set(trial(d, 0), "status", cJSON_CreateString("pending"));
    refused(d, "trials[0].rung_losses: a pending trial with rung losses (1)");
    d = good_doc(); set(trial(d, 2), "error", cJSON_CreateNumber(5));
    refused(d, "trials[2].error: expected a string, found a number");
    d = good_doc();
    for (int i = 3; i < 6; i++) set(trial(d, i), "status", cJSON_CreateString("running"));
    set(d, "best", cJSON_CreateString("lr1e-4_r16"));
    refused(d, "trials: 3 running, more than the 2 adapters per pass");
    d = good_doc(); set(d, "best", cJSON_CreateString("lr1e-4_r16"));
    refused(d, "best: \"lr1e-4_r16\", and the completed trial of the lowest best_eval_loss is \"lr2e-4_r16\"");
    d = good_doc(); set(d, "best", cJSON_CreateNull());
    refused(d, "best: null, and the completed trial of the lowest best_eval_loss is \"lr2e-4_r16\"");
    d = good_doc(); set(d, "best", cJSON_CreateNumber(3));
    refused(d, "best: expected a trial's name or null, found a number");
    d = good_doc(); cJSON_DeleteItemFromObject(d, "best");
    refused(d, "no \"best\"");
    /* a pruned trial in a sweep without pruning */
    sweep w;
    example_b(&w);
    w.s.status[1] = FT_TRIAL_PRUNED; /* (a scheduler in mode none never does this) */
    w.s.n_reported[1] = 0;
    char *txt;
    assert_int_equal(ft_sweep_json_format(&w.t, &w.s, w.r, &txt), 0);
    sweep_free(&w);
    example_b(&w);
    assert_int_equal(ft_sweep_json_parse(txt, strlen(txt), "sweep.json", &w.t, &w.s, w.r), FT_E_INVALID);
    assert_string_equal(ft_errmsg(), "sweep.json: trials[1].status: pruned, in a sweep that prunes none");
    free(txt);
    sweep_free(&w);
    /* a file that is not there, one that is a folder */
    example_a(&w, 0);
    assert_int_equal(ft_sweep_json_read("/nonexistent/sweep.json", &w.t, &w.s, w.r), -ENOENT);
    assert_non_null(strstr(ft_errmsg(), "/nonexistent/sweep.json"));
    char *dir = t_tmpdir();
    assert_int_equal(ft_sweep_json_read(dir, &w.t, &w.s, w.r), -EISDIR);
    /* and a write that cannot be made names the path */
    char path[4200];
    snprintf(path, sizeof path, "%s/missing/sweep.json", dir);
    assert_true(ft_sweep_json_write(path, &w.t, &w.s, w.r) < 0);
    assert_non_null(strstr(ft_errmsg(), path));
    free(dir);
    sweep_free(&w);
}

/* Damaged copies of a good file (bytes replaced, removed or repeated) are read without a
 * crash (the sanitizer build checks the memory), each either accepted or refused with one
 * line naming the file. */
static void test_damaged_bytes(void **state)
{
    sweep w;
    example_a(&w, A_SPLIT);
    char *good;
    assert_int_equal(ft_sweep_json_format(&w.t, &w.s, w.r, &good), 0);
    size_t n = strlen(good);
    char *buf = malloc(2 * n + 1);
    assert_non_null(buf);
    static const char SET[] = " \"{}[],:0123456789.-eEnulltruefasx\\";
    ft_rng r;
    ft_rng_seed(&r, 32);
    int refused = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(buf, good, n + 1);
        size_t len = n;
        for (int m = 0; m < 1 + (int)(ft_rng_next(&r) % 3); m++) {
            size_t at = (size_t)(ft_rng_next(&r) % len), k = 1 + (size_t)(ft_rng_next(&r) % 8);
            if (at + k > len) k = len - at;
            switch (ft_rng_next(&r) % 3) {
            case 0: buf[at] = SET[ft_rng_next(&r) % (sizeof SET - 1)]; break;
            case 1: memmove(buf + at, buf + at + k, len - at - k + 1); len -= k; break;
            default:
                if (len + k <= 2 * n) {
                    memmove(buf + at + k, buf + at, len - at + 1);
                    len += k;
                }
            }
            if (!len) break;
        }
        ft_err_clear();
        int rc = ft_sweep_json_parse(buf, len, "sweep.json", &w.t, &w.s, w.r);
        if (rc) {
            refused++;
            assert_true(rc == FT_E_INVALID || rc == FT_E_UNSUPPORTED);
            assert_memory_equal(ft_errmsg(), "sweep.json: ", 12);
            assert_null(strchr(ft_errmsg(), '\n'));
        }
    }
    assert_true(refused > 2000);
    free(buf);
    free(good);
    sweep_free(&w);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write-examples")) {
        write_examples(argv[2]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_a_decisions),
        cmocka_unit_test(test_best),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_resume_decides_the_same),
        cmocka_unit_test(test_bad_content),
        cmocka_unit_test(test_damaged_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
