/* tok_template.h - test helper (header-only): a tokenizer folder with a chat_template of the
 * test's choice, for the tests of the Jinja chat-template path (test_dataset, test_generate).
 * Needs harness.h (t_tmpdir) and the tokenizer/fsutil headers included before it. */
#ifndef FT_TEST_TOK_TEMPLATE_H
#define FT_TEST_TOK_TEMPLATE_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The tokenizer of folder tok_dir (relative to the repository root, the tests' working
 * directory) with the chat_template read from file tmpl_path, in a tokenizer_config.json of
 * its own (a temp folder; tokenizer.json linked). Fails the test on error. */
static ft_tokenizer *t_tok_with_template(const char *tok_dir, const char *tmpl_path)
{
    char *src, *dir = t_tmpdir(), path[512], target[512], cwd[400];
    size_t n;
    assert_non_null(dir);
    assert_int_equal(ft_read_file(tmpl_path, &src, &n), 0);
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(target, sizeof target, "%s/%s/tokenizer.json", cwd, tok_dir);
    assert_int_equal(symlink(target, path), 0);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", src);
    char *js = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(js, f);
    fclose(f);
    ft_tokenizer *t = NULL;
    if (ft_tok_load_dir(&t, dir)) fail_msg("%s", ft_errmsg());
    free(js);
    cJSON_Delete(cfg);
    free(src);
    free(dir);
    return t;
}

#endif
