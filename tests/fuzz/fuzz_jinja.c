/* fuzz_jinja.c - libFuzzer target: the Jinja engine (src/template/jinja*.c) and the chat-template
 * bridge that derives loss masks from it (src/template/chat_jinja.c).
 *
 * Input: a template source, optionally followed by FUZZ_SEP and a JSON object of variables.
 * Per input: ft_jinja_parse; on success ft_jinja_render with those variables (or a fixed
 * two-turn conversation) under small limits (1 MiB of output, 10^5 steps, 64 MiB of values,
 * depth 20), so a hostile template ends with FT_E_RANGE instead of hanging. A render's text
 * must be NUL-terminated at n and its {% generation %} spans inside it and in order. Then the
 * bridge renders a three-turn conversation with the same source (trained spans, generation
 * prompt, end-of-turn probe): the segments must cover the text contiguously. Every failure
 * must follow err.h's contract (negative rc with a message).
 * Seeds: tests/fuzz/corpus/jinja/ (the templates of tests/fixtures/jinja/templates). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "src/template/chat.h"
#include "src/template/jinja.h"
#include "tests/fuzz/fuzz_util.h"

static const char CONV[] = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, "
                           "{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                           "\"content\": \"yo\"}], \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
                           "\"add_generation_prompt\": true, \"tools\": null}";

static void check_out(const ft_jinja_out *o)
{
    if (!o->text || o->text[o->n] != 0) abort();
    size_t at = 0;
    for (int64_t i = 0; i < o->n_gen; i++) {
        if (o->gen[i].off < at || o->gen[i].off + o->gen[i].n > o->n) abort();
        at = o->gen[i].off;
    }
}

static void check_text(const ft_chat_text *t)
{
    size_t at = 0;
    for (int64_t i = 0; i < t->n_seg; i++) {
        if (t->seg[i].off != at) abort();
        at += t->seg[i].n;
    }
    if (at != t->n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *src, *vj;
    size_t sn, vn;
    fuzz_split(data, size, &src, &sn, &vj, &vn);
    ft_jinja *t = NULL;
    int rc;
    FUZZ_CALL(rc, ft_jinja_parse(&t, (const char *)src, sn, "fuzz"));
    if (rc) return 0;
    char *vs = vj ? strndup((const char *)vj, vn) : NULL;
    cJSON *vars = cJSON_Parse(vs ? vs : CONV);
    free(vs);
    ft_jinja_opts o = {.max_output_bytes = 1 << 20, .max_steps = 100000,
                       .max_mem_bytes = 64 << 20, .max_depth = 20};
    ft_jinja_out out = {0};
    FUZZ_CALL(rc, ft_jinja_render(t, vars, &o, &out));
    if (!rc) check_out(&out);
    ft_jinja_out_free(&out);
    cJSON_Delete(vars);
    ft_jinja_free(t);

    /* the bridge (default limits: keep the templates the fuzzer grows small) */
    if (sn > 4096) return 0;
    char *s = strndup((const char *)src, sn);
    if (!s) return 0;
    const ft_chat_msg m[3] = {{FT_ROLE_USER, "hi", 2, NULL, 0, 0},
                              {FT_ROLE_ASSISTANT, "yo", 2, NULL, 0, 1},
                              {FT_ROLE_USER, "again", 5, NULL, 0, 0}};
    ft_chat_ctx ctx = {"<s>", "</s>", s, 0};
    for (int gp = 0; gp < 2; gp++) {
        ft_chat_text ct = {0};
        FUZZ_CALL(rc, ft_chat_render_jinja(&ct, m, gp ? 3 : 2, &ctx, gp));
        if (!rc) check_text(&ct);
        ft_chat_text_free(&ct);
    }
    char eot[64];
    FUZZ_CALL(rc, ft_chat_jinja_end_of_turn(&ctx, eot, sizeof eot));
    free(s);
    return 0;
}
