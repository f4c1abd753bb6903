/* json.h - small helpers over cJSON (the project's JSON parser) shared by every reader of
 * JSON input: config.json, data records, generation requests, checkpoints. */
#ifndef FT_JSON_H
#define FT_JSON_H

#include <cjson/cJSON.h>

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

#endif
