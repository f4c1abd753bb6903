/* jinja.h - a Jinja2 subset interpreter for Hugging Face chat templates.
 *
 * Renders a tokenizer's chat_template the way transformers' apply_chat_template does
 * (transformers utils/chat_template_utils.py, _compile_jinja_template; formats.md 7.1, 7.3):
 * jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * extensions=[AssistantTracker ({% generation %}), loopcontrols]), keep_trailing_newline off
 * (one trailing "\n" of the source is dropped), "\r\n" and "\r" read as "\n", a `tojson`
 * filter equal to json.dumps(x, ensure_ascii=False, indent, separators, sort_keys), and the
 * globals raise_exception(msg), strftime_now(fmt), namespace(), dict(), range().
 * Undefined names behave as jinja2's default Undefined: they print "", are false and iterate
 * empty; an attribute, item, call or arithmetic on one is an error.
 *
 * Values print as Python prints them (True, None, 1.0, ['a', 'b'], {'a': 1}). Strings are
 * UTF-8; length, indexing and slicing count code points as Python does. Numbers from cJSON
 * are ints when integral (|x| < 2^53), else floats: cJSON does not keep "1.0" apart from "1".
 * The sandbox's refusals are kept: list.append, dict.update and the other mutating methods
 * fail ("access to attribute 'append' of 'list' object is unsafe.") as in transformers.
 *
 * Not supported (a template using them fails to parse or render with FT_E_INVALID, never
 * renders something else): extends/block/include/import, recursive for loops, the `%`
 * string-format operator, the filters batch/slice/groupby/truncate/wordwrap/urlize/
 * striptags/xmlattr/filesizeformat/pprint/random/format, Markup auto-escaping of `e` results.
 */
#ifndef FT_JINJA_H
#define FT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A parsed template (immutable after ft_jinja_parse; may be rendered from several threads
 * at once, each render owning its own state). */
typedef struct ft_jinja ft_jinja;

/* Render options. Zero fields take the defaults given. */
typedef struct ft_jinja_opts {
    int64_t now;              /* unix time (seconds, UTC) that strftime_now formats, so that
                               * renders are reproducible; 0: 1721952000 (26 Jul 2024) */
    int64_t max_output_bytes; /* any output or captured block longer fails with FT_E_RANGE;
                               * 0: 64 MiB */
    int64_t max_steps;        /* loop iterations + macro calls + range() items; 0: 10^7 */
    int64_t max_mem_bytes;    /* all values made while rendering; 0: 512 MiB */
    int max_depth;            /* nested macro calls; 0: 100 */
} ft_jinja_opts;

/* A byte range of the rendered text. */
typedef struct ft_jinja_span { size_t off, n; } ft_jinja_span;

/* A rendered text. text is malloc'ed and NUL-terminated (n bytes before the NUL). gen lists,
 * in output order, the byte ranges written inside {% generation %}...{% endgeneration %}
 * (transformers' return_assistant_tokens_mask source; transformers counts characters, these
 * are UTF-8 bytes). A generation block inside a captured block ({% set %}, macro, caller)
 * records its length at the main output's current end, as transformers does. */
typedef struct ft_jinja_out {
    char *text; size_t n;
    ft_jinja_span *gen; int64_t n_gen;
} ft_jinja_out;

/* Parses n bytes of template source. name is used in error messages (copied).
 * Returns 0 and *out (free with ft_jinja_free), FT_E_INVALID with the message
 * "NAME:LINE:COL: what" (unknown tag, unclosed block, bad expression, bad string escape),
 * or -ENOMEM. On error *out is NULL. */
int ft_jinja_parse(ft_jinja **out, const char *src, size_t n, const char *name);

/* Renders t with the variables of the cJSON object vars (messages, tools, bos_token,
 * eos_token, add_generation_prompt, enable_thinking, ...; NULL: none). o may be NULL.
 * Returns 0 and *out (free with ft_jinja_out_free); FT_E_INVALID with
 * "NAME:LINE: template error: MSG" for raise_exception(MSG) and "NAME:LINE: MSG" for other
 * runtime errors (undefined attribute, type errors, sandbox refusals); FT_E_RANGE when a
 * limit of o is passed; -ENOMEM. On error *out is zeroed. */
int ft_jinja_render(const ft_jinja *t, const cJSON *vars, const ft_jinja_opts *o,
                    ft_jinja_out *out);

/* Frees a rendered text (NULL-safe; leaves *o zeroed). */
void ft_jinja_out_free(ft_jinja_out *o);

/* Frees a template (NULL-safe). */
void ft_jinja_free(ft_jinja *t);

#ifdef __cplusplus
}
#endif

#endif
