/* eval_samples.h - sample replies during training (--eval-prompts FILE): at every evaluation
 * (the step-0 one, each --eval-every, the final one) the adapter being trained answers each
 * prompt of FILE greedily, and the replies go to OUT/samples.jsonl, one line
 * {"step", "prompt", "reply"} per prompt, and, with --tensorboard, to TensorBoard's text
 * plugin (tag "samples": one table per step, a row per prompt, columns prompt and reply;
 * tfevents.h ft_tfevents_text). The run report (report.h) shows them grouped by step.
 *
 * FILE is read as `ftune generate --prompts` reads it (src/infer/generate.h ft_gen_req_parse:
 * a string, {"prompt"[, "system"]}, or any conversational record training reads; a final
 * assistant turn is the reference, left out), at most FT_EVAL_SAMPLES_MAX records; the
 * records' own generation settings are ignored (every reply is greedy, of at most
 * --eval-max-new-tokens tokens, ending at the EOS or the template's end of turn, as `ftune
 * generate` stops). Prompts are rendered with the run's --chat-template and its generation
 * prompt, encoded with the model's tokenizer.
 *
 * Generation runs on the training session's placed base (no second load): on a host backend
 * with the model's weights in memory they are read in place (the weights `ftune generate`
 * reads), otherwise through the training executor (offload/exec.h ft_exec_gen_source), with
 * the adapter's current LoRA weights, unmerged, in eval mode (no dropout, no NEFTune). It
 * draws nothing from any RNG and writes nothing that training reads, so the trained adapter
 * is bit for bit the one of a run without --eval-prompts. The KV cache and buffers (one
 * sequence of the longest prompt + the new tokens) are allocated at the first evaluation and
 * kept; on a device their bytes are reserved before the base is placed
 * (ft_session.gpu_reserve).
 *
 * Each evaluation's lines are written with one write(2) and flushed before training goes on;
 * a resumed run keeps the lines of the steps before its checkpoint (and of the checkpoint's
 * own step when its mid-run evaluation preceded it, as metrics.jsonl does), rewritten
 * atomically, and drops the rest (a torn last line included).
 */
#ifndef FT_TRAIN_EVAL_SAMPLES_H
#define FT_TRAIN_EVAL_SAMPLES_H

#include <stddef.h>
#include <stdint.h>

#include "offload/session.h"
#include "src/formats/tfevents.h"
#include "src/infer/gen_prompt.h"
#include "src/infer/generate.h"
#include "src/infer/sample.h"
#include "src/model/lora.h"

#define FT_EVAL_SAMPLES_MAX 64   /* most prompts of an --eval-prompts file */
#define FT_EVAL_SAMPLES_FILE "samples.jsonl"
#define FT_EVAL_SAMPLES_TAG "samples" /* the TensorBoard text plugin's tag */
#define FT_EVAL_SAMPLES_MAX_STOP 16

typedef struct ft_eval_samples {
    int on;                     /* 1: an --eval-prompts file was loaded */
    char *path;                 /* the prompts file, as given */
    int64_t n;                  /* prompts */
    char **prompt;              /* (n) the text reported as each prompt (ft_gen_req.user) */
    int32_t **ids;              /* (n) each prompt's token ids */
    int64_t *n_ids;             /* (n) */
    int64_t max_prompt, max_new;
    int32_t stop[FT_EVAL_SAMPLES_MAX_STOP];
    int n_stop;
    const ft_tokenizer *tok;    /* the session's */
    /* made at the first evaluation */
    int g_ok;
    ft_gen g;
    ft_gen_source src;
    ft_sampler smp;             /* greedy (temperature 0): no draw */
    float *logits;              /* (V) */
    int32_t *out;               /* (max_new) */
    /* OUT/samples.jsonl, opened for appending */
    int fd;
    char out_path[4200];
} ft_eval_samples;

/* Reads and encodes the prompts of file (NULL: es stays off, 0 returned) with s's tokenizer and
 * chat template tmpl (enum ft_chat_template), for replies of up to max_new tokens of adapter
 * lora (its shapes: the weights may come later), and adds the generation's device bytes to
 * s->gpu_reserve (call before ft_session_place). Returns 0,
 * -ENOMEM, -errno or FT_E_INVALID naming the file (and the line or record): missing or
 * unreadable, no records, more than FT_EVAL_SAMPLES_MAX, a malformed line, a record that is
 * no prompt, a prompt that encodes to no tokens; max_new outside 1..FT_GEN_MAX_NEW_TOKENS. */
int ft_eval_samples_load(ft_eval_samples *es, const char *file, ft_session *s,
                         const ft_lora *lora, int tmpl, int64_t max_new);

/* Opens out_dir/samples.jsonl for the run: created empty on a fresh start; on a resume from
 * step `step`, the lines of earlier steps kept (and those of `step` itself with
 * keep_at_step), rewritten atomically, and, when tb is non-NULL, replayed into it as text
 * events. has_eval: whether the run evaluates at all (FT_E_INVALID otherwise: the samples are
 * made at its evaluations). Nothing to do when es is off. Returns 0 or an error naming the
 * file. */
int ft_eval_samples_open(ft_eval_samples *es, const char *out_dir, int resume, int64_t step,
                         int keep_at_step, int has_eval, ft_tfevents *tb);

/* The replies of lora (the adapter being trained) on session s's placed base to every prompt
 * after optimizer step `step`: appended to samples.jsonl (one write, flushed) and, when tb is
 * non-NULL, written as one text event at `step`; *seconds (may be NULL) the wall time of the
 * generation (monotonic clock). Nothing to do when es is off (*seconds 0). Returns 0 or an
 * error (generation's, the file's). */
int ft_eval_samples_run(ft_eval_samples *es, ft_session *s, const ft_lora *lora, int64_t step,
                        ft_tfevents *tb, double *seconds);

void ft_eval_samples_free(ft_eval_samples *es); /* NULL-safe; zeroes *es (fd -1 closed) */

#endif
