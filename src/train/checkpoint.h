/* checkpoint.h - training checkpoints: atomic save, verified load, rotation.
 *
 * A checkpoint is the folder OUT/checkpoint-<step>/ holding everything needed to continue a
 * run bit for bit:
 *   adapter_model.safetensors, adapter_config.json   the PEFT adapter (ft_peft_save), so a
 *                                                    checkpoint is also a usable adapter
 *   optimizer.safetensors                            AdamW moments: "exp_avg" (m) and
 *                                                    "exp_avg_sq" (v), F32 [n_params], the
 *                                                    flat order of ft_lora.params
 *   trainer_state.json                               step, AdamW update count, schedule
 *                                                    (total, warmup), data cursor (epoch,
 *                                                    next micro-batch), counters, the run
 *                                                    config, the size and hash of each
 *                                                    file above (written last), and last
 *                                                    "state_fnv1a64": the hash of this file
 *                                                    itself with those 16 digits read as
 *                                                    '0' (version 2), so that every byte
 *                                                    of a checkpoint is covered
 * Dropout masks need no saved RNG state: they are a pure function of (seed, step) (see
 * trainer.c), and packing is a pure function of (seed, epoch).
 *
 * Save protocol: the files are written into OUT/.checkpoint-<step>.tmp/, each fsynced, the
 * folder fsynced, then renamed to OUT/checkpoint-<step> and OUT fsynced. A crash or a
 * failed write (full disk, I/O error) at any point leaves earlier checkpoints untouched; a
 * leftover temporary folder is removed by the next save. The folder name therefore means
 * "complete"; the load checks sizes and hashes anyway (copies, bit rot).
 */
#ifndef FT_CHECKPOINT_H
#define FT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/hash.h"
#include "src/model/lora.h"
#include "src/model/model.h"

struct cJSON;

#define FT_CKPT_PREFIX "checkpoint-"
#define FT_CKPT_STATE_FILE "trainer_state.json"
#define FT_CKPT_OPTIM_FILE "optimizer.safetensors"
#define FT_CKPT_FORMAT "ftune-checkpoint"
#define FT_CKPT_VERSION 2 /* 2: trainer_state.json holds its own hash; 1 is still read */

typedef struct ft_ckpt_state {
    int64_t step;               /* optimizer steps done (including skipped bad steps) */
    int64_t adam_step;          /* AdamW updates applied (bias-correction count) */
    int64_t total_steps;        /* schedule length */
    int64_t warmup_steps;       /* schedule warmup */
    int64_t epoch;              /* data epoch of the packing in use (seed + epoch) */
    int64_t cursor;             /* index of the next micro-batch in that packing */
    int64_t tokens;             /* cumulative trained target tokens */
    int64_t positions;          /* cumulative token positions processed */
    int64_t bad_steps;          /* steps skipped for a non-finite loss / gradient norm */
    int64_t bad_run;            /* of which consecutive at the end */
    double initial_eval_loss;   /* NAN if not measured */
    double last_eval_loss;      /* NAN if not measured */
    double last_loss;           /* last finite training loss, NAN if none */
    double elapsed_s;           /* wall time of the run so far (all sessions) */
    char run_id[24];            /* hex id of the run (fresh start); kept across resumes */
    /* best adapter by eval loss and early stopping (trainer.h); absent from checkpoints
     * written before they existed: read as none / 0 (tracking restarts at the resume) */
    double best_eval_loss;      /* lowest eval loss of a mid-run or final eval, NAN if none */
    int64_t best_eval_step;     /* its step (0: none; the step-0 eval is no candidate) */
    int64_t best_saved_step;    /* step of the adapter this run wrote to OUT/best (0: none) */
    int64_t n_evals;            /* evaluations counted (mid-run and final, not step 0) */
    int64_t evals_no_improve;   /* consecutive ones without an improvement above the
                                 * early-stopping threshold (transformers'
                                 * early_stopping_patience_counter) */
    char eval_set[20];          /* fingerprint (16 hex digits) of the held-out batches the eval
                                 * losses above were measured on; "" when unknown (checkpoints
                                 * written before it existed) */
} ft_ckpt_state;

/* Writes OUT/checkpoint-<st->step>/ by the protocol above. config_json is a JSON object
 * (the run config, stored verbatim under "config"). Uses l->host as staging for the
 * moments (its content afterwards is unspecified). If the final folder already exists
 * (a resume from an older checkpoint), it is replaced atomically enough: it is renamed
 * aside, the new one renamed in, the old one removed. On success the final path goes to
 * path_out (if non-NULL). Returns 0, -errno (message names the file, offset and the
 * system error; the temporary folder is removed, other checkpoints untouched),
 * FT_E_RANGE (path too long), -ENOMEM. */
int ft_ckpt_save(const char *out_dir, const ft_ckpt_state *st, const char *config_json,
                 ft_lora *l, const ft_model *m, const char *base_name, char *path_out,
                 size_t path_n);

#define FT_CKPT_BEST_DIR "best"

/* Writes an adapter folder OUT/<name>/ (adapter_config.json + adapter_model.safetensors, by
 * ft_peft_save_values: the bytes of a checkpoint's or the final adapter of the same
 * values) all or nothing: into OUT/.<name>.tmp/, fsynced, then exchanged with OUT/<name>
 * (renameat2 RENAME_EXCHANGE; where the filesystem lacks it, the old folder is renamed to
 * OUT/.<name>.old first), the old content removed, OUT fsynced. values: l->n_params host
 * floats in l's layout, or NULL for l's current parameters (pulled into l->host). A failure
 * leaves OUT/<name> as it was. step > 0 also writes OUT/<name>/ftune_step.json,
 * {"step": step, "eval_loss": eval_loss}, so that the folder says which step it holds
 * (ft_ckpt_adapter_step). Returns 0, -errno (message names the path), FT_E_RANGE. */
int ft_ckpt_save_adapter(const char *out_dir, const char *name, ft_lora *l, const float *values,
                         const char *base_name, int64_t step, double eval_loss);

/* The step recorded in OUT/<name>/ftune_step.json by ft_ckpt_save_adapter, or -1 when the
 * folder or the file is missing or unreadable. */
int64_t ft_ckpt_adapter_step(const char *out_dir, const char *name);

/* Cleans up after a crash inside ft_ckpt_save_adapter: removes OUT/.<name>.tmp, and
 * renames OUT/.<name>.old back to OUT/<name> if that is missing (else removes it). With
 * remove = 1, OUT/<name> itself is removed too (a fresh run's stale folder). Best effort. */
void ft_ckpt_adapter_cleanup(const char *out_dir, const char *name, int remove);

/* Reads DIR/trainer_state.json into st and (if config_json != NULL) a malloc'ed copy of
 * its "config" object, checking the file's own hash (version 2), the format, version and field types (numbers finite or
 * null, elapsed_s >= 0, no key twice in an object, nothing after the object); with l == NULL
 * nothing else is read. With l: every listed file must exist with its recorded size and
 * hash, the adapter config must match l->cfg (r, targets, rsLoRA, alpha) and the moment
 * tensors l->n_params; then params, m and v are loaded into l (m finite, v finite and
 * >= 0, else FT_E_CORRUPT with the offset). Returns 0, -errno,
 * FT_E_INVALID (malformed state), FT_E_CORRUPT (size or hash mismatch, truncated file),
 * FT_E_UNSUPPORTED (other format/version), each naming the file and key. */
int ft_ckpt_load(const char *dir, ft_ckpt_state *st, char **config_json, ft_lora *l);

/* Checks the checkpoint DIR without loading it: trainer_state.json as ft_ckpt_load reads it
 * (its own hash included) into st (if non-NULL), then the recorded size and hash of every
 * file it lists. Returns 0 (intact), or ft_ckpt_load's errors naming the file. */
int ft_ckpt_verify(const char *dir, ft_ckpt_state *st);

/* Sets, in the state text txt (len bytes, as written: the key "state_fnv1a64" last, with 16
 * hex digits), those digits to the FNV-1a hash (ft_ckpt_hash) of the text with the digits
 * read as '0'. Exposed for tests and the fuzz target (which mutate a state and re-seal it).
 * Returns 0, or FT_E_INVALID when the key is missing. */
int ft_ckpt_state_seal(char *txt, size_t len);

/* The step N of a folder named checkpoint-N (digits only), else -1. */
int64_t ft_ckpt_parse_name(const char *name);

/* The intact checkpoint with the highest step under out_dir (ft_ckpt_verify passes and its
 * state names the same step) into path (size path_n), its step into *step.
 * Returns 1 if found, 0 if none, -errno if out_dir cannot be read. */
int ft_ckpt_find_latest(const char *out_dir, char *path, size_t path_n, int64_t *step);

/* After saving step `step` of run `run_id`: removes hidden leftovers of crashed saves
 * (.checkpoint-N.tmp/.old/.del), every checkpoint of out_dir whose
 * step is above `step` (left by an earlier run or a resume from an older checkpoint), or
 * whose trainer_state.json names another run or does not parse, then keeps only the
 * `keep` checkpoints with the highest steps (keep <= 0: keep all). Folders are renamed to
 * a hidden name before their files are removed. Returns the number removed (>= 0) or
 * -errno if out_dir cannot be read; a folder that cannot be removed is left in place. */
int ft_ckpt_prune(const char *out_dir, int64_t step, const char *run_id, int64_t keep);

/* Counts the checkpoint folders under out_dir (any run); *latest gets the highest step
 * (-1 if none). Returns the count or -errno. */
int ft_ckpt_count(const char *out_dir, int64_t *latest);

/* Compares two run-config JSON objects (the checkpoint's and the current run's): every
 * key except "info" must be present in both with an equal value (numbers compared
 * exactly). Returns 0 if they match, else FT_E_INVALID with a message listing up to 8
 * differences as "key: <checkpoint> -> <now>"; -ENOMEM. */
int ft_ckpt_config_diff(const char *saved_json, const char *now_json);

/* Prints a cJSON tree (declared as struct cJSON so that this header needs no cJSON
 * include) with every finite number written with the fewest digits (15..17) that read back
 * exactly, which cJSON_Print does not guarantee. Converts the numbers of the tree to raw
 * items in place. Returns malloc'ed text or NULL (out of memory). */
char *ft_ckpt_json_print(struct cJSON *o, int formatted);

/* 64-bit FNV-1a over 8-byte little-endian words (and the tail bytes one at a time),
 * continuing from h (start with FT_CKPT_HASH_INIT). Used for file integrity and the data
 * fingerprint; not cryptographic. */
#define FT_CKPT_HASH_INIT FT_FNV64_OFFSET
uint64_t ft_ckpt_hash(uint64_t h, const void *data, size_t n);

/* Test hook (fault injection, STYLE C12): after `bytes` more bytes written by the
 * checkpoint writer of this process (optimizer.safetensors, trainer_state.json), every
 * write fails with -ENOSPC as a full disk would. bytes < 0 disables (the default). */
void ft_ckpt_fail_writes_after(int64_t bytes);

#endif
