/* json.h - small helpers over cJSON (the project's JSON parser) shared by every reader of
 * JSON input: config.json, data records, generation requests, checkpoints. */
#ifndef FT_JSON_H
#define FT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Out-of-memory detection for cJSON, whose parsers return NULL both for invalid text and
 * for a failed allocation. ft_json_init installs cJSON allocation hooks (malloc/free) that
 * count failed allocations per thread; call it once before any thread parses (the program
 * does, first thing; it is idempotent). ft_json_oom_mark returns the count so far,
 * ft_json_oom_since(mark) is 1 when an allocation failed after that mark (so a NULL parse
 * was out of memory, not invalid JSON). Without ft_json_init the count stays 0. */
void ft_json_init(void);
unsigned long ft_json_oom_mark(void);
int ft_json_oom_since(unsigned long mark);

/* What v is, for messages ("... must be a string, found a list"): "nothing" (NULL), "null",
 * "a boolean", "a number", "a string", "a list", "an object". Static strings. */
const char *ft_json_type(const cJSON *v);

/* A key that object o holds twice, or NULL (also for a non-object o). With recursive, every
 * object below o (in objects and lists) is searched too, depth first, and the first repeated
 * key found is returned. cJSON keeps both items and its look-ups see the first, while
 * Python's json (and so Hugging Face datasets, OpenAI's and vLLM's servers) keeps the last:
 * readers refuse such input rather than read it otherwise than those tools. The key points
 * into o. *oom is set to 1 when out of memory (then NULL). Sorting per object: n keys cost
 * n log n. */
const char *ft_json_dup_key(const cJSON *o, int recursive, int *oom);

/* Where a JSON text would carry a NUL into a string: cJSON's strings are C strings, so a
 * string holding U+0000 (the escape \u0000, valid JSON) ends there and its rest is lost, and
 * a raw 0 byte (which JSON does not allow anywhere) is read as blank or cut a string too.
 * Readers refuse such text by its offset rather than use a cut string (FT_JSON_NUL_WHY says
 * why, for their messages).
 *
 * ft_json_next_nul scans s[0..n) from st->off (st zeroed to start; s a JSON text, or its
 * text up to a point between two values) for the next such place: returns 1 with st->off
 * at it (the raw byte, or the backslash of \u0000) and st->elem the 0-based index of the
 * element of the top-level array that holds it (-1 outside one, e.g. in a JSONL line); the
 * next call goes on after it. Returns 0 at the end. */
typedef struct ft_json_nul_scan {
    size_t off;      /* where to go on from; after a hit: the hit */
    int in_str;      /* inside a string */
    int depth;       /* [ and { open (outside strings) */
    int64_t elem;    /* top-level array element of the hit (-1: none) */
    int64_t cur;     /* top-level array element being scanned */
    int started;     /* off is past a hit: step over it first */
} ft_json_nul_scan;
int ft_json_next_nul(ft_json_nul_scan *st, const char *s, size_t n);

/* The offset of the first such place in s[0..n), or n when there is none. */
size_t ft_json_find_nul(const char *s, size_t n);

#define FT_JSON_NUL_WHY "a string holds U+0000 (\\u0000 or a raw NUL byte), where " \
    "ftune's strings end: its rest would be lost"

#endif
