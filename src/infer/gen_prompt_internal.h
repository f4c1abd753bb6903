/* gen_prompt_internal.h - what gen_prompt.c (prompts-file records) and gen_batch_req.c (record
 * keys, OpenAI batch request lines) share; not part of the public interface (generate.h). */
#ifndef FT_GEN_PROMPT_INTERNAL_H
#define FT_GEN_PROMPT_INTERNAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "src/infer/generate.h"

/* ---- gen_prompt.c ---- */

/* A malloc'ed, NUL-terminated copy of s[0..n); NULL when out of memory. */
char *gp_dup_str(const char *s, size_t n);
/* Appends to q a message (FT_ROLE_*) with copies of s[0..n) and in[0..in_n) (in: NULL ok). */
int gp_req_add(ft_gen_req *q, int role, const char *s, size_t n, const char *in, size_t in_n);
/* Conversational record rec into q's messages and reference, as training converts it. */
int gp_req_conversation(ft_gen_req *q, const cJSON *rec, const char *system);
/* The generation settings of object rec into *p; body = FT_GEN_API_CHAT / _COMPLETIONS: a
 * batch request's body for that endpoint (its names), FT_GEN_API_NONE: a plain record. */
int gp_req_params(ft_gen_params *p, const cJSON *rec, int body);
/* FT_E_INVALID naming (with prefix "" or "body.") a key object o holds twice, with nested
 * also in any object below o; 0 when none. */
int gp_dup_keys(const cJSON *o, const char *prefix, int nested);

/* ---- gen_batch_req.c ---- */

/* The unknown keys of plain object record rec (with did-you-mean hints) into q->unknown. */
int gp_plain_unknown(ft_gen_req *q, const cJSON *rec);
/* OpenAI batch request line rec ({"custom_id", "method", "url", "body"}) into q. */
int gp_req_batch(ft_gen_req *q, const cJSON *rec, const char *system, int raw);

#endif
