/* dataset.h - instruction data to token rows: schemas, chat templates, loss masks,
 * packing, eval split and shuffling (formats.md 7 and 8; TRL SFTTrainer semantics).
 *
 * Records: alpaca (instruction/input/output), messages (OpenAI/TRL), sharegpt
 * (conversations/from/value), prompt/completion, text; a JSON array or JSONL; the schema is
 * auto-detected from each file's first record's keys unless forced. Training data may be
 * several files (axolotl's `datasets:` list, LLaMA-Factory's `dataset: a,b`), mixed schemas
 * allowed: their examples are concatenated in the order given. Each record becomes one example:
 * token ids plus labels, label = -100 where no loss is taken (prompt, system and user turns;
 * only completion/assistant tokens and their end-of-turn token are trained by default).
 * Eval examples are either split off the training file (ft_dataset_load, eval_fraction) or
 * read from a file of their own (ft_dataset_load_eval: TRL's eval_dataset, axolotl's
 * test_datasets).
 */
#ifndef FT_DATASET_H
#define FT_DATASET_H

#include <stdint.h>

#include "src/template/chat.h"
#include "src/tokenizer/tokenizer.h"

#define FT_IGNORE_INDEX (-100)

enum ft_data_format {
    FT_DATA_AUTO = 0, FT_DATA_ALPACA, FT_DATA_MESSAGES, FT_DATA_SHAREGPT,
    FT_DATA_PROMPT_COMPLETION, FT_DATA_TEXT,
};

typedef struct ft_data_cfg {
    int format;              /* enum ft_data_format */
    int chat_template;       /* enum ft_chat_template */
    int train_on_prompt;     /* 1: labels on every token (default 0: completion only) */
    int skip_bad_records;    /* 1: skip and count bad records instead of failing */
    int64_t seq_len;         /* row length in tokens; longer examples are truncated */
    double eval_fraction;    /* fraction of examples held out for eval (0..0.5) */
    int64_t eval_max;        /* cap on held-out examples (0: no cap); ft_dataset_load_eval:
                              * the first eval_max usable examples of the eval file */
    uint64_t seed;           /* shuffle seed */
    int no_shuffle;          /* 1: keep file order (ftune tokenize), no eval split */
    int preference;          /* 1: preference pairs (DPO, pref.h): each record gives two
                              * examples, prompt + chosen at [2i] and prompt + rejected at
                              * [2i+1] of train/eval, labels on their completions only; the
                              * shuffle, the eval split and the eval cap move whole pairs; a
                              * pair is dropped (n_dropped) when either side has no trained
                              * token left after truncation to seq_len. The schema is read
                              * from each record (TRL prompt/chosen/rejected or chosen/
                              * rejected, LLaMA-Factory pairwise alpaca or sharegpt): format
                              * must be FT_DATA_AUTO and train_on_prompt 0 (FT_E_INVALID).
                              * Counts in this mode: n_records and n_skipped count records,
                              * n_truncated pairs with either side cut, n_dropped pairs;
                              * n_examples, n_over_cap/eval_capped, n_train and n_eval count
                              * examples (2 per pair); eval_fraction and eval_max count
                              * pairs; format is the SFT schema the (first) pair's sides were
                              * encoded as (pref.h) */
} ft_data_cfg;

typedef struct ft_example {
    int32_t *ids;            /* n */
    int32_t *labels;         /* n: the token itself where trained, -100 elsewhere (unshifted) */
    int64_t n;
    /* Where it came from (ft_dataset_load*, kept through the shuffle and split; 0 for an
     * example encoded alone): its file's index in the paths given and its record's 0-based
     * index in that file, counting every record read, the bad ones skipped with
     * skip_bad_records too (a JSON array's index; in JSONL the line number minus one when
     * the file has no blank line, blank lines being no records); the two examples of a
     * preference record share both. line: its 1-based line in a JSONL file (0 in a JSON
     * array). */
    int64_t record;
    int64_t line;
    int32_t file;
    int32_t truncated;       /* 1: cut to seq_len (ft_data_cfg.seq_len) */
} ft_example;

/* What one data file gave (ft_dataset.files). */
typedef struct ft_data_file {
    int64_t n_records;       /* records read */
    int64_t n_skipped;       /* bad records skipped (skip_bad_records) */
    int64_t n_truncated;     /* examples cut to seq_len */
    int64_t n_dropped;       /* examples left with no trained token after the cut */
    int64_t n_examples;      /* usable examples kept, before the shuffle and split */
    int64_t n_over_cap;      /* ft_dataset_load_eval: usable examples after the first
                              * eval_max (read and checked, not kept) */
    int format;              /* its detected/forced schema */
} ft_data_file;

typedef struct ft_dataset {
    ft_example *train; int64_t n_train;
    ft_example *eval;  int64_t n_eval;
    int64_t n_records;       /* records read */
    int64_t n_skipped;       /* bad records skipped (skip_bad_records) */
    int64_t n_truncated;     /* examples cut to seq_len */
    int64_t n_dropped;       /* examples left with no trained token after the cut */
    int format;              /* detected/forced schema; FT_DATA_AUTO when the files' differ */
    int chat_template;       /* resolved template */
    int64_t eval_capped;     /* ft_dataset_load_eval: usable examples of the file after the
                              * first eval_max (read and checked, then freed; 0: none) */
    ft_data_file *files;     /* (n_files) per file, in the order given; the counts above are
                              * their sums */
    int64_t n_files;
} ft_dataset;

/* Reads, renders, tokenizes, masks, shuffles (deterministically by cfg->seed) and splits.
 * Records are encoded in chunks by every OpenMP thread (omp_get_max_threads; each with a
 * tokenizer word cache), with the result of reading them one at a time: the same examples,
 * counts and first error whatever the thread count.
 * Errors name the file and line (JSONL) or record index (JSON array): an empty file, an
 * unknown schema, a malformed line or a record missing its fields -> FT_E_INVALID
 * (unless skip_bad_records); -errno for a missing file. */
int ft_dataset_load(ft_dataset *ds, const char *path, const ft_data_cfg *cfg,
                    const ft_tokenizer *tok);

/* ft_dataset_load over several files paths[0..n_paths) (n_paths >= 1): each file is read as
 * ft_dataset_load reads one (its own schema detection unless cfg->format forces one; the
 * same chat template, masks, truncation and skip_bad_records for all), their examples are
 * concatenated in the order given, and the shuffle and eval split run over that union as
 * for one file, so that one path gives exactly ft_dataset_load's examples. ds->files[i]
 * holds file i's counts and schema. Errors as ft_dataset_load's, naming the file; a file
 * with no usable record is an error (FT_E_INVALID), as it is alone. */
int ft_dataset_load_files(ft_dataset *ds, const char *const *paths, int64_t n_paths,
                          const ft_data_cfg *cfg, const ft_tokenizer *tok);

/* Reads an eval-only file (a held-out set of its own, e.g. --eval-data): the same schema
 * detection (from its own first record unless cfg->format forces one), chat template, masks,
 * truncation to cfg->seq_len and skip_bad_records as ft_dataset_load, but no shuffle and no
 * split: ds->eval gets the usable examples in file order, at most cfg->eval_max of them
 * (0: all), and ds->train is empty (n_train 0). The whole file is read and checked even when
 * the cap is reached: a bad record after the first eval_max is an error (or skipped and
 * counted), the usable examples after them are encoded, counted in ds->eval_capped and freed
 * at once (memory holds at most eval_max examples). The counts (n_records, n_skipped,
 * n_truncated, n_dropped) are those of the whole file. cfg's eval_fraction, seed and
 * no_shuffle are ignored. Errors as ft_dataset_load's, naming this file and the line (JSONL)
 * or record (JSON array). */
int ft_dataset_load_eval(ft_dataset *ds, const char *path, const ft_data_cfg *cfg,
                         const ft_tokenizer *tok);
void ft_dataset_free(ft_dataset *ds);

/* Renders one example's text pieces and tokenizes it (used by ft_dataset_load and by
 * `ftune tokenize`). `record_json` is one JSON record as text. */
int ft_dataset_encode_record(ft_example *ex, const char *record_json, int format,
                             int chat_template, int train_on_prompt, const ft_tokenizer *tok);

/* One preference record (JSON text, a schema of pref.h) as its two examples: ex[0] prompt +
 * chosen, ex[1] prompt + rejected, each the SFT encoding of its side's record (labels on the
 * completion only), not truncated. Returns 0, -ENOMEM, FT_E_INVALID (malformed JSON, no
 * preference schema, or a side that does not encode: the message names it, "chosen: ...");
 * ex[] is zeroed on error; the caller frees each ids/labels. */
int ft_dataset_encode_pair(ft_example ex[2], const char *record_json, int chat_template,
                           const ft_tokenizer *tok);

/* A conversational record as chat messages, by the conversion training uses (formats.md
 * 8.1): alpaca (instruction, input?, system?, history?, output), messages, sharegpt
 * (conversations, system?) and conversational prompt/completion; format FT_DATA_AUTO detects
 * the schema from the record's keys as --data-format auto does. With prompt_only = 1 (a
 * prompt to answer: ftune generate) an alpaca record needs no "output" (then no final
 * assistant turn) and {"instruction"} alone is detected as alpaca. LLaMA-Factory's
 * "function_call" turns (the call as JSON text) become assistant messages whose json is an
 * OpenAI-form object {"role", "content": "", "tool_calls"} (FT_E_INVALID naming the turn when
 * the text does not parse). out->m[0..n) borrow strings and message objects from rec and
 * from out's own storage (joined content parts, converted messages): rec must outlive
 * them. Returns 0, -ENOMEM, FT_E_INVALID (the message names the field and the message
 * index, without a file location; also a record of no conversational schema). Free with
 * ft_data_msgs_free, also after an error. */
struct cJSON;
struct ft_chat_msg;
typedef struct ft_data_msgs {
    struct ft_chat_msg *m;
    int64_t n, cap;
    void *arena;             /* joined content parts, converted message objects */
    int format;              /* the schema used (enum ft_data_format) */
} ft_data_msgs;
int ft_data_record_messages(const struct cJSON *rec, int format, int prompt_only,
                            ft_data_msgs *out);
void ft_data_msgs_free(ft_data_msgs *v); /* NULL-safe; leaves v zeroed */

/* A record's "tools" (function schemas) as training reads them, into *tools: NULL when
 * absent, null, or LLaMA-Factory's "" / "[]" text; else a new list (caller deletes with
 * cJSON_Delete): the record's own list of objects copied, or LLaMA-Factory's form (JSON text
 * of a list) parsed, its bare schemas wrapped as {"type": "function", "function": schema}.
 * Returns 0, -ENOMEM, FT_E_INVALID (naming 'tools': not a list of objects, text that does not
 * parse). */
int ft_data_record_tools(const struct cJSON *rec, struct cJSON **tools);

/* The template that renders the conversation m[0..n) with ctx (its tools), by the rule
 * training applies to each record: tmpl (FT_CHAT_AUTO: detected from tok), but the model's
 * own template (FT_CHAT_JINJA) for a conversation with tools or tool calls
 * (ft_chat_uses_tools), which no built-in writes, and for tool results under a detected
 * ChatML template (Qwen2.5 writes them as <tool_response> user turns). *out receives it.
 * Returns 0 or FT_E_INVALID for tools or tool calls that no template at hand writes: tok
 * has no chat_template, or tmpl is a forced built-in (Alpaca included) of another format
 * than the model's (the message says which, and the way out). */
struct ft_chat_ctx;
int ft_chat_template_for(const ft_tokenizer *tok, int tmpl, const struct ft_chat_msg *m,
                         int64_t n, const struct ft_chat_ctx *ctx, int *out);

/* Resolves FT_CHAT_AUTO from the tokenizer's chat_template by substring (formats.md 7.2,
 * ft_chat_detect_str); a template detected as ChatML is checked by rendering a two-turn probe
 * with the built-in renderer and with the template itself (the Jinja engine): when they
 * differ, FT_CHAT_JINJA (the template itself). Worked out once by the tokenizer's loader
 * (chat.h ft_chat_template_resolve, ft_tok_set_chat_kind), else here;
 * this reads the result. */
int ft_chat_template_detect(const ft_tokenizer *tok);
/* Names: "llama3", "chatml", "llama2", "alpaca", "qwen3", "llama3.1", "zephyr" ("mistral" parses as llama2,
 * its variant chosen by the template source); parse returns -1 if unknown. */
const char *ft_chat_template_name(int t);
int ft_chat_template_parse(const char *name);
const char *ft_data_format_name(int f);
int ft_data_format_parse(const char *name);

/* ---- packing (batch.c) ----------------------------------------------------------- */
/* A micro-batch: whole examples concatenated without padding (padding-free packing, as
 * FlashAttention varlen / TRL padding_free), at most rows * seq_len tokens. */
typedef struct ft_batch {
    int64_t rows, seq_len;   /* the budget: T <= rows * seq_len */
    int64_t T;               /* tokens in this micro-batch */
    int32_t *ids;        /* (T) input token ids */
    int32_t *targets;    /* (T) next-token target for each position, -100 where no loss:
                          * targets[t] = labels[t+1] inside an example; -100 at the last
                          * token of each example (no prediction across examples) */
    int32_t *pos;        /* (T) position within its example, restarting at 0 */
    int32_t *seq_start;  /* (T) flat index of the first token of t's example (kernels.h) */
    int64_t n_targets;   /* count of targets >= 0 */
    int64_t n_pairs;     /* preference micro-batches (ft_pack_pairs): pairs in it; else 0 */
    int64_t *pairs;      /* (n_pairs, FT_PAIR_FIELDS) per pair: its index p (the pair of
                          * examples 2p, 2p+1 given to ft_pack_pairs), then the chosen
                          * example's first token (flat offset in this micro-batch) and
                          * length, then the rejected example's; the rejected example
                          * follows the chosen one directly. NULL when n_pairs is 0 */
    int64_t n_ex;        /* examples in it (ft_pack, ft_pack_pairs; 0 in a batch made by hand) */
    int64_t *ex_index;   /* (n_ex) the index (into the ex given to the packer) of each example
                          * in placement order: example k spans the ex[ex_index[k]].n tokens
                          * after those of examples 0..k-1 (flat offsets; pos restarts at 0
                          * at each). NULL when n_ex is 0 */
} ft_batch;

enum { FT_PAIR_INDEX = 0, FT_PAIR_CHOSEN_START, FT_PAIR_CHOSEN_LEN, FT_PAIR_REJECTED_START,
       FT_PAIR_REJECTED_LEN, FT_PAIR_FIELDS };

/* Packs examples (each 1..seq_len tokens) first-fit-decreasing by length into micro-batches
 * of at most rows * seq_len tokens (an example is never split), then shuffles the order of
 * the micro-batches by `seed`. Each batch's ex_index lists its examples in placement order
 * (every example in exactly one batch). *batches is malloc'ed; each batch owns its arrays.
 * Returns 0, -ENOMEM, FT_E_INVALID (seq_len < 2, rows < 1), FT_E_RANGE (an example longer
 * than seq_len or empty). */
int ft_batch_pack(ft_batch **batches, int64_t *n_batches, const ft_example *ex, int64_t n_ex,
            int64_t seq_len, int64_t rows, uint64_t seed);

/* Packs preference pairs (DPO): ex holds 2 * n_pairs examples, pair p = (ex[2p] chosen,
 * ex[2p+1] rejected), each example 1..seq_len tokens. A pair is never split: its two
 * examples are placed next to each other (chosen first) in one micro-batch. Pairs go
 * first-fit-decreasing by their total length into micro-batches of at most
 * 2 * rows * seq_len tokens (rows = pairs per micro-batch at full length, as TRL's
 * per_device_train_batch_size counts pairs), then the micro-batches are shuffled by seed.
 * Each batch's pairs[] lists its pairs in placement order (longest pair first), and its
 * ids/targets/pos/seq_start are ft_pack's for the same examples in that order; its rows is
 * 2 * rows, so that T <= rows * seq_len holds of the batch as of ft_pack's. Returns as
 * ft_pack (FT_E_RANGE names the example index, 2p or 2p + 1). */
int ft_batch_pack_pairs(ft_batch **batches, int64_t *n_batches, const ft_example *ex,
                  int64_t n_pairs, int64_t seq_len, int64_t rows, uint64_t seed);
void ft_batches_free(ft_batch *b, int64_t n);

/* Steps per window of ft_batch_group_by_cost. */
#define FT_BATCH_GROUP_STEPS 16

/* The cost of micro-batch b for ft_batch_group_by_cost, in token units: b->T + target_weight *
 * b->n_targets (target_weight: one loss-target token's LM head and cross-entropy relative to
 * one token's pass through the blocks; ft_train_data_target_weight gives it from the model's
 * shape). A proxy of the compute, not a timing. */
double ft_batch_cost(const ft_batch *b, double target_weight);

/* Reorders b[0..n) (an epoch's micro-batches, as packed) so that each run of `group`
 * consecutive micro-batches from the start (one optimizer step's over all data-parallel
 * ranks: grad_accum x ranks) holds micro-batches of similar cost, and data-parallel ranks
 * reach the all-reduce together: windows of FT_BATCH_GROUP_STEPS * group micro-batches, each
 * sorted by ft_batch_cost (descending, ties by position), cut into steps of `group`, the
 * steps' order within the window shuffled by seed (Hugging Face's LengthGroupedSampler with
 * the micro-batch as the item). When group does not divide n, the epoch's short last step
 * holds the last window's cheapest micro-batches and stays last. Depends on the input order,
 * group, target_weight and seed alone. Returns 0, FT_E_INVALID (group < 1, target_weight
 * negative or NaN), FT_E_RANGE, -ENOMEM (b unchanged). */
int ft_batch_group_by_cost(ft_batch *b, int64_t n, int64_t group, double target_weight,
                           uint64_t seed);

#endif
