/* pref.h - preference records (DPO) normalized to a prompt and two completions, each side
 * written as the SFT record that encodes it (dataset.c), so that masks, chat templates, tools
 * and truncation stay the SFT rules. Internal to src/data (used by dataset.c and its tests).
 *
 * Schemas (each record on its own; a file may mix them):
 *   TRL explicit   {"prompt", "chosen", "rejected", "tools"?}: all three strings (standard) or
 *                  all three lists of messages (conversational; chosen/rejected are the
 *                  completion messages, usually one assistant turn). Each side is the SFT
 *                  prompt-completion record {"prompt": P, "completion": C, "tools"}: strings get
 *                  C + EOS trained (dataset.c put_with_eos), lists are rendered by the chat
 *                  template with the completion's assistant turns trained.
 *   TRL implicit   {"chosen", "rejected"} (strings or message lists), or with a "prompt" whose
 *                  kind (string vs list) differs from chosen's (TRL maybe_extract_prompt, e.g.
 *                  UltraFeedback-binarized's string prompt beside full conversations): the
 *                  prompt is the longest common prefix of chosen and rejected (TRL
 *                  data_utils.extract_prompt; see ft_pref_common_prefix), the completions are
 *                  the rest; then as TRL explicit.
 *   LLaMA-Factory pairwise alpaca   {"instruction", "input"?, "system"?, "history"?, "tools"?,
 *                  "chosen": str, "rejected": str}: each side is the alpaca record with
 *                  "output" = chosen / rejected (its data/README.md "Preference Dataset").
 *   LLaMA-Factory pairwise sharegpt {"conversations", "system"?, "tools"?, "chosen": {"from":
 *                  "gpt", "value"}, "rejected": {...}}: each side is the sharegpt record whose
 *                  conversation is the prompt turns followed by the chosen / rejected turn.
 *   For both LLaMA-Factory schemas only the final turn is trained (last_only): the history's
 *   answers are prompt, as LLaMA-Factory's pairwise processor labels only the response.
 */
#ifndef FT_PREF_H
#define FT_PREF_H

#include <stddef.h>

#include <cjson/cJSON.h>

enum ft_pref_schema {
    FT_PREF_TRL = 1,       /* prompt, chosen, rejected of one kind */
    FT_PREF_TRL_IMPLICIT,  /* the prompt extracted from chosen and rejected */
    FT_PREF_LF_ALPACA,     /* LLaMA-Factory pairwise alpaca */
    FT_PREF_LF_SHAREGPT,   /* LLaMA-Factory pairwise sharegpt */
};

typedef struct ft_pref_rec {
    int schema;              /* enum ft_pref_schema */
    int conversational;      /* 1: rendered by the chat template (message lists, and both
                              * LLaMA-Factory schemas); 0: TRL standard strings */
    int format;              /* the SFT schema each side is encoded as (enum ft_data_format:
                              * prompt-completion, alpaca or sharegpt) */
    int last_only;           /* 1: only the final message of a side is trained (LLaMA-Factory) */
    cJSON *side[2];          /* owned: the SFT records of prompt + chosen [0] and prompt +
                              * rejected [1]; they borrow items of the input record, which
                              * must outlive them */
    const cJSON *prompt;     /* borrowed, the split: TRL: the prompt (string or message list);
                              * LF sharegpt: the "conversations" list; LF alpaca: NULL (the
                              * prompt is instruction/input/system/history) */
    const cJSON *chosen;     /* TRL: the chosen completion (string or messages); LF: the
                              * chosen string (alpaca) or turn object (sharegpt) */
    const cJSON *rejected;   /* the same for rejected */
} ft_pref_rec;

/* Normalizes one preference record (see the schemas above) into *out. Returns 0, -ENOMEM or
 * FT_E_INVALID, the message saying what is missing or of the wrong kind (without a file
 * location: the caller prefixes it): not an object, no 'chosen'/'rejected', chosen and
 * rejected of different kinds, a value that is neither a string nor a list of messages, an
 * LLaMA-Factory turn that is not an assistant turn. Checks the shape only: the sides'
 * messages are checked when they are encoded. *out is zeroed on error; free it with
 * ft_pref_rec_free (NULL-safe, also after an error). */
int ft_pref_split(const cJSON *rec, ft_pref_rec *out);
void ft_pref_rec_free(ft_pref_rec *p);

/* The prompt length TRL's extract_prompt gives two strings, in bytes of a (UTF-8): their
 * longest common prefix compared by code point (a divergence inside a multibyte character
 * steps back to its first byte), then one step back when the prefix ends with a space, so
 * that the completions start with it (" blue" rather than "blue"). When neither differs
 * within the shorter one (one a prefix of the other, or equal) the prefix stops before the
 * shorter's last character, as TRL's loop leaves its index there, and no space step applies.
 * TRL indexes [-1] when they differ at the first character; here the prompt is then empty. */
size_t ft_pref_common_prefix(const char *a, size_t an, const char *b, size_t bn);

#endif
