/* sweep_keys.h - the training options a sweep trial may set: one table of ft_train_cfg fields
 * (name, type, domain, offset), the parsers of their values (text of a --grid flag, JSON of a
 * --config file), their formatting (trial names, sweep.json) and their application to an
 * ft_train_cfg.
 *
 * The names are those of `ftune train`'s flags (cli/cmd_train.c) without the dashes, with
 * '-' or '_' accepted alike ("lora_r" = "lora-r"), and the domains are the ones that command
 * and ft_train_run accept, so that a trial is exactly `ftune train` with its overrides. The
 * table holds the options that can differ between the adapters of one pass over the base
 * (the optimizer, schedule, LoRA shape and the seed); the options of the pass itself (model,
 * data, sequence length, batch, gradient accumulation, quantization, eval and checkpoint
 * cadence) are the sweep's fixed part and are not here. It is meant to be the one list of
 * these options: cli/cmd_train.c's ft_opt entries for them can be generated from it
 * (dst = (char *)cfg + off, the type and domain checks from here), leaving it only the help
 * texts.
 */
#ifndef FT_SWEEP_KEYS_H
#define FT_SWEEP_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "src/train/trainer.h"

/* How a value is held (ft_sweep_val member) and written into ft_train_cfg. */
enum ft_sweep_type {
    FT_SWEEP_INT = 0, /* int64_t field; val.i */
    FT_SWEEP_U64,     /* uint64_t field (the seed); val.u */
    FT_SWEEP_DBL,     /* double field; val.d */
    FT_SWEEP_FLOAT,   /* float field; val.d, written as (float) */
    FT_SWEEP_BOOL,    /* int field, 0 or 1; val.i */
    FT_SWEEP_ENUM,    /* int field, an enum with a name parser; val.i */
    FT_SWEEP_TARGETS, /* unsigned field, the LoRA target-module mask (1 << enum ft_proj); val.u */
};

/* Domain flags of a numeric key: which of lo and hi bound it, and whether strictly. */
#define FT_SWEEP_LO      1u /* value >= lo */
#define FT_SWEEP_LO_OPEN 2u /* value > lo (with FT_SWEEP_LO) */
#define FT_SWEEP_HI      4u /* value <= hi */
#define FT_SWEEP_HI_OPEN 8u /* value < hi (with FT_SWEEP_HI) */

typedef union ft_sweep_val {
    int64_t i;
    uint64_t u;
    double d;
} ft_sweep_val;

typedef struct ft_sweep_key {
    const char *name;     /* the train flag without "--", '_' form: "lora_r" */
    const char *tag;      /* its mark in trial names: "r" for lora_r16 -> "r16"; "" for enums
                           * (the value names itself: "cosine") */
    const char *also[3];  /* other tools' names for it (transformers, PEFT, axolotl), used only
                           * to suggest this name for them; NULL-terminated */
    int type;             /* enum ft_sweep_type */
    size_t off;           /* offsetof(ft_train_cfg, field) */
    unsigned dom;         /* FT_SWEEP_LO... (numeric types) */
    double lo, hi;
    const char *dom_text; /* the domain in words for messages: "> 0", "in [0, 1)" */
    int (*parse)(const char *s);     /* FT_SWEEP_ENUM: name -> value, or -1 */
    const char *(*enum_name)(int v); /* FT_SWEEP_ENUM: value -> name */
    const char *choices;  /* FT_SWEEP_ENUM: the names for messages: "cosine, linear, constant" */
} ft_sweep_key;

/* The table, ordered as `ftune train --help` lists the options; n = ft_sweep_keys_n. */
extern const ft_sweep_key ft_sweep_keys[];
extern const int ft_sweep_keys_n;

/* The key named `name` ('-' and '_' alike, exact otherwise), or NULL. */
const ft_sweep_key *ft_sweep_key_find(const char *name);

/* The key whose name (or one of its `also` names) is nearest to `name` by edit distance
 * (Levenshtein over the '_' forms, case-insensitive), when near enough to be a likely typo
 * (distance <= max(2, length / 3)) or an `also` name; else NULL. */
const ft_sweep_key *ft_sweep_key_nearest(const char *name);

/* Writes "not a training option a trial can set; did you mean X?" (or, with no near name,
 * the list of the options a trial can set) into msg[n], for the callers' error messages
 * (which name the key). */
void ft_sweep_key_unknown_msg(const char *name, char *msg, size_t n);

/* Parses the text of one value (a --grid value) into *v and checks its domain:
 * INT: a decimal integer; U64: decimal digits; DBL/FLOAT: a finite number (strtod); BOOL:
 * true, false, 1, 0; ENUM: a name; TARGETS: module names joined by '+' ("q_proj+v_proj",
 * short forms "q+v" too, as --lora-target), or all / all-linear (',' separates the grid's
 * values, so it cannot separate modules there). Returns 0 or FT_E_INVALID with a message
 * "expected ..., got 'TEXT'" or "X is outside the option's domain (> 0)"; like every
 * message of this file it names neither the key nor the flag or file: callers prefix them. */
int ft_sweep_key_parse(const ft_sweep_key *k, const char *s, ft_sweep_val *v);

/* Reads one JSON value into *v and checks its domain: INT: an integral number of magnitude
 * <= 2^53; U64: such a number >= 0 or a string of decimal digits; DBL/FLOAT: a number;
 * BOOL: true or false; ENUM: a name string; TARGETS: a string as --lora-target takes
 * ("q_proj,v_proj", "all-linear") or a list of module names. Returns 0 or FT_E_INVALID with
 * a message "expected ..., found ..." (callers prefix the file and JSON path). */
int ft_sweep_key_from_json(const ft_sweep_key *k, const cJSON *j, ft_sweep_val *v);

/* The same check on a number already held in a double (a random draw's bounds): 0, or
 * FT_E_INVALID "X is outside the option's domain (DOMAIN)". For INT/U64 keys x must also be
 * integral (and of magnitude <= 2^53); a BOOL, ENUM or TARGETS key takes no number. */
int ft_sweep_key_check_num(const ft_sweep_key *k, double x);

/* Checks v against the key's domain: 0 or FT_E_INVALID as ft_sweep_key_check_num. */
int ft_sweep_key_check(const ft_sweep_key *k, ft_sweep_val v);

/* 1 if a and b are the same value of key k (doubles compared exactly), else 0. */
int ft_sweep_val_equal(const ft_sweep_key *k, ft_sweep_val a, ft_sweep_val b);

/* The value as a JSON item: a number (a raw item holding the shortest text that reads back
 * to the same double, as ft_sweep_num_text), true/false, the enum's name, the targets as a
 * string "q_proj,v_proj" or "all-linear", a seed above 2^53 as a string of digits. NULL when
 * out of memory. Printed and parsed again, ft_sweep_key_from_json reads the same value. */
cJSON *ft_sweep_key_to_json(const ft_sweep_key *k, ft_sweep_val v);

/* The value in the short form of trial names into buf[n]: numbers in the shortest text that
 * reads back to the same double, as fixed or exponent form whichever is shorter ("2e-4",
 * "0.05", "16"); BOOL: the tag or "no" + tag; ENUM: its name; TARGETS: module short names
 * joined by '-' ("q-v"), or "all". Returns the length (truncated to n - 1 if longer). */
int ft_sweep_key_format(const ft_sweep_key *k, ft_sweep_val v, char *buf, size_t n);

/* The value in the text `ftune train` takes for the flag (what a user types to repeat a
 * trial alone): "0.0002", "q_proj,v_proj", "true". Returns the length as snprintf. */
int ft_sweep_key_text(const ft_sweep_key *k, ft_sweep_val v, char *buf, size_t n);

/* x as JSON number text that reads back to the same double (shortest digits, "2e-4",
 * "0.30000000000000004"; cJSON's own printing keeps 15 digits where they are within a few
 * ulps); "null" for NaN and infinities. Returns the length as snprintf. */
int ft_sweep_num_text(double x, char *buf, size_t n);

/* Writes v into the field of c. */
void ft_sweep_key_apply(const ft_sweep_key *k, ft_sweep_val v, ft_train_cfg *c);

/* Reads the field of c into *v (the default of a trial that does not set the key). */
void ft_sweep_key_get(const ft_sweep_key *k, const ft_train_cfg *c, ft_sweep_val *v);

#endif
