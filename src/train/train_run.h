/* train_run.h - the state of one training run, shared by its set-up and end (trainer.c) and its
 * step loop (loop.c): the shared part (the runtime session: model, backend, placement and
 * executor; the data; the pass position over it; the timeline and the profile) and the
 * adapters trained over it (adapter.h): one for ft_train_run, several for a sweep (multi). */
#ifndef FT_TRAIN_RUN_H
#define FT_TRAIN_RUN_H

#include <stdint.h>

#include "offload/session.h"
#include "offload/timeline.h"
#include "src/train/adapter.h"
#include "src/train/events.h"
#include "src/train/train_data.h"
#include "src/train/trainer.h"

/* The adapters a run holds side by side: ft_train_run trains one, a sweep (sweep_run.h) up to
 * this many in one pass over the base. */
#define FT_TRAIN_MAX_ADAPTERS 64

struct ft_train_job;
/* Called after each pass of a multi-adapter job (the sweep's rungs, pruning, trial ends and
 * refills); a non-zero return stops the loop with that error. */
typedef int (*ft_train_pass_fn)(void *user, struct ft_train_job *r);

typedef struct ft_train_job {
    ft_train_cfg cfg;           /* the run's settings (grad_accum as the placement chose it) */
    ft_train_sink sink;
    ft_session s;
    ft_train_data d;
    ft_train_adapter ad[FT_TRAIN_MAX_ADAPTERS];
    int n_ad;                   /* slots in ad (a multi-adapter job: a free slot has cfg NULL) */
    /* multi = 1: the executor trains several adapters per pass (ft_exec_train_step_multi);
     * each adapter has its own step, data position and packing of its epoch (adapter.h
     * own_b), so adapters may start and end at different passes; after_pass runs after each
     * pass. multi = 0 (ft_train_run): one data position for all, ad[0]'s. */
    int multi;
    ft_train_pass_fn after_pass;
    void *after_user;
    int64_t n_pass;             /* passes done in this session (multi) */
    char base_name[4200];       /* adapter_config.json's base_model_name_or_path: --model, or
                                 * the id of a Hugging Face cache snapshot (hub_cache.h) */
    int64_t T;                  /* tokens per micro-batch */
    int64_t total;              /* the schedule's length (optimizer steps) */
    double t0;                  /* the run's start this session (ft_train_now_s) */
    double loop_t0;             /* its first step's start */
    int stopped;                /* 1: cfg.stop ended the loop before the schedule */
    ft_timeline tl;             /* --timeline: the recorded step */
    double prof_t0;             /* --profile: when the timed steps began */
    int64_t prof_step0;         /* the step after which they began (-1: not profiling) */
} ft_train_job;

/* The step loop (loop.c): from the adapters' current step to the end of the schedule, early
 * stopping, or a stop request (r->stopped); its profile table reported after it. Returns 0 or
 * the first error. */
int ft_train_loop(ft_train_job *r);

/* 1 while adapter a (a used slot) has steps to take. */
int ft_train_adapter_active(const ft_train_adapter *a);

/* The end of adapter a's run after its last step (trainer.c): its result, the last checkpoint,
 * unless stopped (r->stopped) the final evaluation (none after an early stop or pruning: that
 * step's eval is the last), the adapter in its OUT, summary.json, the report. Returns 0 or
 * the first error. */
int ft_train_finish(ft_train_job *r, ft_train_adapter *a);

#endif
